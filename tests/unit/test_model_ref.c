/* tests/unit/test_model_ref.c — the reference forward pass (src/ref) against every fixture
 * folder of ../shared/fixtures/models: prefill logits, teacher-forced decode logits, greedy
 * ids and the MTP drafts, all within the fp32 tolerance (1e-3·max|logit|). The reference is
 * the oracle for the runtime model, so it must pass tightly. */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "load/weights.h"
#include "ref/ref_forward.h"
#include "tests/check_main.h"
#include "tests/e2e/conform.h"
#include "tests/testutil.h"

static void check_folder(const char *name) {
    char dir[4096];
    if (!conform_fixture_dir(name, dir, sizeof dir)) return;

    epyq_err err = {0};
    epyq_weights *w = NULL;
    epyq_bind_opts bo = {0};
    ck_assert_msg(epyq_weights_bind(&w, dir, &bo, &err) == EPYQ_OK, "%s: %s", name, err.msg);
    const int V = w->cfg.vocab_size, H = w->cfg.hidden_size;
    conform_expect ex;
    ck_assert_msg(conform_expect_read(dir, V, &ex), "%s: expected/ files missing or short", name);
    const int n = ex.n, ng = ex.ng, nd = ex.nd, *prompt = ex.prompt, *greedy = ex.greedy,
              *drafts = ex.drafts;
    float *e_pre = ex.pre, *e_dec = ex.dec, *e_mtp = ex.mtp;

    epyq_ref *r = NULL;
    ck_assert_msg(epyq_ref_create(&r, w, n + ng, &err) == EPYQ_OK, "%s: %s", name, err.msg);
    double *lg = malloc((size_t)V * sizeof(double));
    double *hid = malloc((size_t)(n + 1) * H * sizeof(double));
    float *got = malloc((size_t)(n + ng) * V * sizeof(float));

    /* prefill, one token at a time (the reference has no batched path) */
    for (int t = 0; t < n; t++) {
        ck_assert_msg(epyq_ref_forward(r, prompt[t], lg, hid + (size_t)t * H, &err) == EPYQ_OK, "%s",
                      err.msg);
        for (int i = 0; i < V; i++) got[(size_t)t * V + i] = (float)lg[i];
    }
    conform_stats s;
    conform_init(&s);
    conform_add(&s, e_pre, got, n, V);
    conform_print(name, &s);
    ck_assert_msg(s.max_abs < 1e-3 * s.max_logit, "%s prefill: max|d| %g", name, s.max_abs);

    /* decode with teacher forcing: row 0 is the last prefill row, row i feeds greedy[i-1] */
    memcpy(got, got + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
    for (int i = 1; i < ng; i++) {
        ck_assert(epyq_ref_forward(r, greedy[i - 1], lg, NULL, &err) == EPYQ_OK);
        for (int j = 0; j < V; j++) got[(size_t)i * V + j] = (float)lg[j];
    }
    conform_init(&s);
    conform_add(&s, e_dec, got, ng, V);
    conform_print("  decode", &s);
    ck_assert_msg(s.max_abs < 1e-3 * s.max_logit, "%s decode: max|d| %g", name, s.max_abs);
    for (int i = 0; i < ng; i++)
        ck_assert_msg(conform_argmax_f(got + (size_t)i * V, V) == greedy[i], "%s greedy step %d", name, i);

    /* MTP: first pass over every prompt row (hidden h_r, token r+1, position r), then draft 2 */
    double *ho = malloc((size_t)H * sizeof(double));
    for (int t = 0; t < n; t++) {
        int tok = t + 1 < n ? prompt[t + 1] : greedy[0];
        ck_assert_msg(epyq_ref_mtp(r, hid + (size_t)t * H, tok, t, lg, ho, &err) == EPYQ_OK, "%s", err.msg);
    }
    for (int j = 0; j < V; j++) got[j] = (float)lg[j];
    int d1 = conform_argmax_f(got, V);
    ck_assert_int_eq(d1, drafts[0]);
    ck_assert(epyq_ref_mtp(r, ho, d1, n, lg, ho, &err) == EPYQ_OK);
    for (int j = 0; j < V; j++) got[V + j] = (float)lg[j];
    ck_assert_int_eq(conform_argmax_f(got + V, V), drafts[1]);
    conform_init(&s);
    conform_add(&s, e_mtp, got, nd, V);
    conform_print("  mtp", &s);
    ck_assert_msg(s.max_abs < 1e-3 * s.max_logit, "%s mtp: max|d| %g", name, s.max_abs);

    /* reset really starts a fresh sequence: position 0 gives the first prefill row again */
    epyq_ref_reset(r);
    ck_assert(epyq_ref_forward(r, prompt[0], lg, NULL, &err) == EPYQ_OK);
    for (int j = 0; j < V; j++) ck_assert(fabs(lg[j] - e_pre[j]) < 1e-3 * s.max_logit);

    free(ho), free(lg), free(hid), free(got), free(e_pre), free(e_dec), free(e_mtp);
    epyq_ref_free(r);
    epyq_weights_free(w);
}

START_TEST(test_ref_fixture) { check_folder(epyq_test_model_name(_i)); }
END_TEST

START_TEST(test_ref_errors) {
    const char *p = epyq_test_shared("fixtures/models/tiny-bf16");
    if (!p) return;
    epyq_err err = {0};
    epyq_weights *w = NULL;
    epyq_bind_opts bo = {0};
    ck_assert(epyq_weights_bind(&w, p, &bo, &err) == EPYQ_OK);
    epyq_ref *r = NULL;
    ck_assert(epyq_ref_create(&r, w, 0, &err) == EPYQ_E_ARG);
    ck_assert(epyq_ref_create(&r, w, 2, &err) == EPYQ_OK);
    ck_assert(epyq_ref_forward(r, w->cfg.vocab_size, NULL, NULL, &err) == EPYQ_E_ARG);
    ck_assert(epyq_ref_forward(r, -1, NULL, NULL, &err) == EPYQ_E_ARG);
    ck_assert(epyq_ref_forward(r, 1, NULL, NULL, &err) == EPYQ_OK);
    ck_assert(epyq_ref_forward(r, 2, NULL, NULL, &err) == EPYQ_OK);
    ck_assert(epyq_ref_forward(r, 3, NULL, NULL, &err) == EPYQ_E_CTX_FULL);
    ck_assert_int_eq(epyq_ref_pos(r), 2);
    epyq_ref_free(r);
    epyq_weights_free(w);
}
END_TEST

int main(void) {
    int f0, f1;
    if (epyq_test_model_range(&f0, &f1)) return 77;
    Suite *s = suite_create("model_ref");
    TCase *tc = epyq_test_case(s, "fixtures", 0);
    tcase_add_loop_test(tc, test_ref_fixture, f0, f1);
    tcase_add_test(tc, test_ref_errors);
    return epyq_test_run(s);
}
