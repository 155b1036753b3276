/* tests/unit/test_model_fixture.c — the runtime model against every fixture folder of
 * ../shared/fixtures/models on both int4 numeric paths (A16, A8), with the fixture README's
 * criteria for bf16 / int8 activations: per-row KL(expected ‖ got) mean < 1e-3 and max < 1e-2
 * nats, top-1 agreement on every row whose expected margin is > 0.05, greedy ids (teacher-forced
 * decode) and both MTP drafts. Prefill runs as one batch; decode one token per call.
 * (The fixtures' tighter fp32 tier, max |dlogit| < 1e-3 max|logit|, is not a target: the KV
 * cache is bf16 by design. With f32_act on tiny-bf16, 23 of 24 prefill rows are within it,
 * 0.003-0.010; row 11 is off by 0.15 — a router near-tie picking another expert.)
 * The opt-in path a8all (int8 activations in every int4 linear, as llama.cpp's q8 activations)
 * is outside that tier by design — measured KL mean 1.3e-3 to 2.0e-3, max 8.4e-3 on tiny-ct /
 * tiny-quark — and has a tier of its own: KL mean < 5e-3, max < 2e-2, and the argmax may
 * differ only on near-ties, rows whose expected margin is below A8ALL_FLIP_MARGIN (tiny-ct
 * decode flips 2 of 16 at up to 0.11, tiny-quark's second MTP draft at 0.059: so greedy ids and
 * drafts are printed, not asserted); on folders with int4 linears outside the
 * experts its logits must differ from a8's (the dense projections really took int8), elsewhere
 * equal them bit for bit. */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "tests/check_main.h"
#include "tests/e2e/conform.h"
#include "tests/testutil.h"

/* The fixtures whose formats quantise linears outside the routed experts (compressed-tensors
 * and Quark quantise the attention, DeltaNet and shared-expert projections; the GPTQModel
 * release keeps them BF16). */
static bool dense_int4(const char *name) {
    return !strcmp(name, "tiny-ct") || !strcmp(name, "tiny-quark");
}

/* a8all may change the argmax only of rows whose expected top-1 / top-2 margin is below this
 * (nats); the flips measured were at 0.05-0.11 */
#define A8ALL_FLIP_MARGIN 0.25

static epyq_numpath cur_path; /* the path check_folder runs: its tier's KL bounds */

static void expect_dist(const char *what, const conform_stats *s) {
    const double mean = cur_path == EPYQ_PATH_A8_ALL ? 5e-3 : 1e-3,
                 max = cur_path == EPYQ_PATH_A8_ALL ? 2e-2 : 1e-2;
    ck_assert_msg(s->kl_mean < mean && s->kl_max < max, "%s: KL mean %g max %g", what, s->kl_mean,
                  s->kl_max);
    if (cur_path == EPYQ_PATH_A8_ALL) /* int8 everywhere may flip near-ties, nothing else */
        ck_assert_msg(s->flip_margin < A8ALL_FLIP_MARGIN,
                      "%s: top-1 %d/%d, a flip at a margin of %g", what, s->top1_ok, s->top1_n,
                      s->flip_margin);
    else
        ck_assert_msg(s->top1_ok == s->top1_n, "%s: top-1 %d/%d", what, s->top1_ok, s->top1_n);
}

static void check_folder(const char *name, epyq_numpath path) {
    char dir[4096], label[128];
    if (!conform_fixture_dir(name, dir, sizeof dir)) return;
    cur_path = path;
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_model_opts mo = {.path = path, .n_threads = 2};
    ck_assert_msg(epyq_model_load(&m, dir, &mo, &err) == EPYQ_OK, "%s: %s", name, err.msg);
    const epyq_config *c = epyq_model_config(m);
    const int V = c->vocab_size, H = c->hidden_size;
    conform_expect ex;
    ck_assert_msg(conform_expect_read(dir, V, &ex), "%s: expected/ files missing or short", name);
    const int n = ex.n, ng = ex.ng, nd = ex.nd, *prompt = ex.prompt, *greedy = ex.greedy,
              *drafts = ex.drafts;
    float *e_pre = ex.pre, *e_dec = ex.dec, *e_mtp = ex.mtp;

    epyq_seq *s = NULL;
    ck_assert(epyq_seq_create(&s, m, n + ng, EPYQ_KV_BF16, &err) == EPYQ_OK);
    float *got = malloc((size_t)(n + ng) * V * sizeof(float));
    float *hid = malloc((size_t)(n + 1) * H * sizeof(float));
    epyq_seq *seqs[64];
    for (int i = 0; i < n; i++) seqs[i] = s;
    epyq_batch b = {n, seqs, prompt, NULL};
    ck_assert_msg(epyq_model_forward(m, &b, got, hid, &err) == EPYQ_OK, "%s", err.msg);
    const char *pn = epyq_model_path_name(path);
    conform_stats st;
    conform_init(&st);
    conform_add(&st, e_pre, got, n, V);
    snprintf(label, sizeof label, "%s %s prefill", name, pn);
    conform_print(label, &st);
    expect_dist(label, &st);

    /* teacher-forced decode: row 0 = last prefill row, row i feeds greedy[i-1] */
    memcpy(got, got + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
    for (int i = 1; i < ng; i++) {
        epyq_batch d = {1, seqs, &greedy[i - 1], NULL};
        ck_assert_msg(epyq_model_forward(m, &d, got + (size_t)i * V, NULL, &err) == EPYQ_OK, "%s", err.msg);
    }
    conform_init(&st);
    conform_add(&st, e_dec, got, ng, V);
    snprintf(label, sizeof label, "%s %s decode", name, pn);
    conform_print(label, &st);
    expect_dist(label, &st);
    /* every fixture step has margin > 0.05, so every greedy id must match */
    for (int i = 0; i < ng; i++)
        if (path != EPYQ_PATH_A8_ALL) /* its top-1 tier above covers these rows */
            ck_assert_msg(conform_argmax_f(got + (size_t)i * V, V) == greedy[i], "%s step %d",
                          label, i);

    /* MTP: all prompt rows in one call (hidden h_r, token r+1, position r), then draft 2 */
    int mtok[64], mpos[64];
    for (int t = 0; t < n; t++) mtok[t] = t + 1 < n ? prompt[t + 1] : greedy[0], mpos[t] = t;
    float *ho = malloc((size_t)n * H * sizeof(float));
    ck_assert_msg(epyq_model_mtp(m, s, n, hid, mtok, mpos, 1, got, ho, &err) == EPYQ_OK, "%s", err.msg);
    int d1 = conform_argmax_f(got, V), p2 = n;
    const int d0 = d1;
    ck_assert(epyq_model_mtp(m, s, 1, ho + (size_t)(n - 1) * H, &d1, &p2, 1, got + V, NULL, &err) == EPYQ_OK);
    const int d2 = conform_argmax_f(got + V, V);
    if (path != EPYQ_PATH_A8_ALL) {
        ck_assert_int_eq(d0, drafts[0]);
        ck_assert_int_eq(d2, drafts[1]);
    } else {
        printf("%s a8all MTP drafts %d %d (expected %d %d)\n", name, d0, d2, drafts[0], drafts[1]);
    }
    conform_init(&st);
    conform_add(&st, e_mtp, got, nd, V);
    snprintf(label, sizeof label, "%s %s mtp", name, pn);
    conform_print(label, &st);
    expect_dist(label, &st);

    if (path == EPYQ_PATH_A8_ALL) { /* the same prefill on a8: differs iff int4 outside experts */
        epyq_seq *s8 = NULL;
        float *got8 = malloc((size_t)n * V * sizeof(float));
        ck_assert(got8 && epyq_seq_create(&s8, m, n, EPYQ_KV_BF16, &err) == EPYQ_OK);
        for (int i = 0; i < n; i++) seqs[i] = s8;
        epyq_model_set_path(m, EPYQ_PATH_A8);
        ck_assert_msg(epyq_model_forward(m, &b, got8, NULL, &err) == EPYQ_OK, "%s", err.msg);
        epyq_seq_reset(s);
        for (int i = 0; i < n; i++) seqs[i] = s;
        epyq_model_set_path(m, EPYQ_PATH_A8_ALL);
        ck_assert_msg(epyq_model_forward(m, &b, got, NULL, &err) == EPYQ_OK, "%s", err.msg);
        const bool same = memcmp(got, got8, (size_t)n * V * sizeof(float)) == 0;
        ck_assert_msg(same == !dense_int4(name), "%s: a8all logits %s a8's", name,
                      same ? "equal" : "differ from");
        printf("%s: a8all vs a8 prefill logits %s\n", name,
               same ? "bit-identical (no int4 outside the experts)" : "differ");
        free(got8);
        epyq_seq_free(s8);
    }
    free(ho), free(got), free(hid), free(e_pre), free(e_dec), free(e_mtp);
    epyq_seq_free(s);
    epyq_model_free(m);
}

START_TEST(test_fixture_a16) { check_folder(epyq_test_model_name(_i), EPYQ_PATH_A16); }
END_TEST
START_TEST(test_fixture_a8) { check_folder(epyq_test_model_name(_i), EPYQ_PATH_A8); }
END_TEST
START_TEST(test_fixture_a8all) { check_folder(epyq_test_model_name(_i), EPYQ_PATH_A8_ALL); }
END_TEST

int main(void) {
    int f0, f1;
    if (epyq_test_model_range(&f0, &f1)) return 77;
    Suite *s = suite_create("model_fixture");
    TCase *tc = epyq_test_case(s, "fixtures", 0);
    tcase_add_loop_test(tc, test_fixture_a16, f0, f1);
    tcase_add_loop_test(tc, test_fixture_a8, f0, f1);
    tcase_add_loop_test(tc, test_fixture_a8all, f0, f1);
    return epyq_test_run(s);
}
