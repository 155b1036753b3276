/* tests/unit/test_model_variants.c — checkpoint variants of issue 13 through the runtime.
 *
 * Act-order int4: GPTQ desc_act with a
 * non-trivial g_idx and compressed-tensors actorder "group" with weight_g_idx, written by
 * `epyq synth --act-order` (each module's columns quantized in a random order of its own,
 * stored in the original order). The runtime packs each linear's columns in g_idx group
 * order and reads the activation in that order; the float64 reference dequantizes through
 * g_idx directly. Runtime vs reference: prefill + teacher-forced decode on both numeric
 * paths within the bounds test_model_synth uses (KL mean < 1e-3, max < 1e-2 nats, argmax
 * agreement above the paths' margins), and the NUMA expert path (split 2, whole experts)
 * bit-identical to the single pool.
 *
 * YaRN rope scaling (rope_type "yarn" in rope_parameters): a tiny checkpoint with factor 4
 * over an original context of 1024, runtime vs reference within the same bounds, and its
 * logits measurably different from the same weights without scaling (the scaling is applied,
 * not parsed and ignored). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "load/weights.h"
#include "model/model.h"
#include "model/sample.h"
#include "ref/ref_forward.h"
#include "synth/synth.h"
#include "tests/check_main.h"
#include "tests/e2e/conform.h"
#include "tests/testutil.h"

#define NP 16
#define ND 6

static const char *const formats[] = {"gptq", "ct"};

static char *write_actorder(const char *format, uint64_t seed) {
    char *dir = epyq_test_tmpdir();
    epyq_err err = {0};
    epyq_synth_opts o = {.out_dir = dir, .format = (epyq_synth_format)epyq_synth_format_parse(format), .seed = seed};
    ck_assert_msg(epyq_synth_dims_init(&o.dims, "tiny", 0, 0, 0, &err) == EPYQ_OK, "%s", err.msg);
    o.dims.act_order = true;
    /* two groups per expert input (the tiny shape's 128 is one group, where any order is
     * trivial), so the down projections' orders are exercised too */
    o.dims.moe_inter = o.dims.shared_inter = 256;
    epyq_synth_stats st;
    ck_assert_msg(epyq_synth_write(&o, &st, &err) == EPYQ_OK, "%s", err.msg);
    return dir;
}

/* Every int4 linear of the checkpoint has a non-trivial g_idx: the test is about act-order. */
typedef struct {
    const epyq_config *cfg;
    int n_q4, n_perm;
} perm_count;

static void count_perm(const epyq_linear *l, epyq_module_kind kind, int32_t layer, int32_t expert, bool mtp, void *ctx) {
    (void)kind, (void)layer, (void)expert, (void)mtp;
    perm_count *c = ctx;
    if (l->kind != EPYQ_LIN_Q4) return;
    size_t nk = (size_t)(l->n_out * l->n_in), ng = nk / (size_t)l->scheme.group_size;
    uint8_t *q = malloc(nk), *z = malloc(ng);
    float *s = malloc(ng * sizeof *s);
    int32_t *perm = malloc((size_t)l->n_in * sizeof *perm);
    bool hp = false;
    epyq_err err = {0};
    ck_assert_msg(epyq_linear_unpack_q4(l, c->cfg, q, s, z, perm, &hp, &err) == EPYQ_OK, "%s", err.msg);
    c->n_q4++, c->n_perm += hp;
    free(q), free(z), free(s), free(perm);
}

/* Prefill NP ids then ND teacher-forced steps: logits [NP + ND][V]. */
static void run_model(const char *dir, epyq_numpath path, const epyq_numa_opts *numa, int32_t slice, const int *ids,
                      int V, float *got) {
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_model_opts mo = {.path = path, .n_threads = 2, .skip_mtp = true, .numa = numa, .moe_slice = slice};
    ck_assert_msg(epyq_model_load(&m, dir, &mo, &err) == EPYQ_OK, "%s", err.msg);
    epyq_seq *s = NULL;
    ck_assert(epyq_seq_create(&s, m, NP + ND + 2, EPYQ_KV_BF16, &err) == EPYQ_OK);
    epyq_seq *ss[NP];
    for (int i = 0; i < NP; i++) ss[i] = s;
    int32_t pid[NP];
    for (int i = 0; i < NP; i++) pid[i] = ids[i];
    /* want every prompt row */
    epyq_batch b = {NP, ss, pid, NULL};
    ck_assert_msg(epyq_model_forward(m, &b, got, NULL, &err) == EPYQ_OK, "%s", err.msg);
    for (int t = NP; t < NP + ND; t++) {
        int32_t id = ids[t];
        epyq_batch d = {1, ss, &id, NULL};
        ck_assert_msg(epyq_model_forward(m, &d, got + (size_t)t * V, NULL, &err) == EPYQ_OK, "%s", err.msg);
    }
    epyq_seq_free(s);
    epyq_model_free(m);
}

START_TEST(test_actorder_vs_ref) {
    char *dir = write_actorder(formats[_i], 11 + (uint64_t)_i);
    epyq_err err = {0};
    epyq_weights *w = NULL;
    epyq_bind_opts bo = {0};
    ck_assert_msg(epyq_weights_bind(&w, dir, &bo, &err) == EPYQ_OK, "%s", err.msg);
    perm_count pc = {&w->cfg, 0, 0};
    epyq_weights_foreach_linear(w, count_perm, &pc);
    ck_assert_int_gt(pc.n_q4, 0);
    ck_assert_msg(pc.n_perm == pc.n_q4, "%d of %d int4 linears have a non-trivial g_idx", pc.n_perm, pc.n_q4);
    const int V = w->cfg.vocab_size, R = NP + ND;
    int32_t I = w->cfg.moe_intermediate_size;
    int ids[NP + ND];
    for (int i = 0; i < NP; i++) ids[i] = (i * 389 + 17 * _i + 3) % 997;

    float *ref = malloc((size_t)R * V * sizeof(float));
    double *lg = malloc((size_t)V * sizeof(double));
    epyq_ref *r = NULL;
    ck_assert(epyq_ref_create(&r, w, R + 2, &err) == EPYQ_OK);
    for (int t = 0; t < R; t++) {
        if (t >= NP) ids[t] = epyq_argmax(ref + (size_t)(t - 1) * V, V);
        ck_assert(epyq_ref_forward(r, ids[t], lg, NULL, &err) == EPYQ_OK);
        for (int i = 0; i < V; i++) ref[(size_t)t * V + i] = (float)lg[i];
    }
    epyq_ref_free(r);
    epyq_weights_free(w);

    float *got = malloc((size_t)R * V * sizeof(float)), *one = malloc((size_t)R * V * sizeof(float));
    for (int path = 0; path < 2; path++) {
        run_model(dir, (epyq_numpath)path, NULL, 0, ids, V, got);
        conform_stats st;
        conform_init(&st);
        conform_add(&st, ref, got, R, V);
        char label[64];
        snprintf(label, sizeof label, "act-order %s %s", formats[_i], path ? "a8" : "a16");
        conform_print(label, &st);
        ck_assert_msg(st.kl_mean < 1e-3 && st.kl_max < 1e-2, "%s: KL %g / %g", label, st.kl_mean, st.kl_max);
        double thresh = path ? 0.1 : 0.05;
        ck_assert_msg(st.flip_margin <= thresh, "%s: argmax differs at a margin of %g", label, st.flip_margin);
        if (path == 1) memcpy(one, got, (size_t)R * V * sizeof(float));
    }
    /* the NUMA expert path gathers its rows itself: with whole experts it gives the bits of
     * the single pool */
    epyq_numa_opts no;
    epyq_numa_opts_init(&no);
    no.split = 2;
    run_model(dir, EPYQ_PATH_A8, &no, I, ids, V, got);
    ck_assert_msg(!memcmp(got, one, (size_t)R * V * sizeof(float)), "act-order %s: --numa-split 2 logits differ",
                  formats[_i]);
    free(ref), free(lg), free(got), free(one), free(dir);
}
END_TEST

/* config.json with its "rope_type": "default" replaced by `with` (the synth writes it once). */
static void edit_config(const char *dir, const char *with) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *txt = NULL;
    epyq_err err = {0};
    ck_assert(epyq_file_read(path, 1 << 20, &txt, NULL, &err) == EPYQ_OK);
    const char *key = "\"rope_type\": \"default\"";
    char *at = strstr(txt, key);
    ck_assert_ptr_nonnull(at);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%.*s%s%s", (int)(at - txt), txt, with, at + strlen(key));
    fclose(f);
    free(txt);
}

START_TEST(test_yarn_vs_ref) {
    char *dir = epyq_test_tmpdir();
    epyq_err err = {0};
    epyq_synth_opts o = {.out_dir = dir, .format = EPYQ_SYNTH_CT, .seed = 5};
    ck_assert(epyq_synth_dims_init(&o.dims, "tiny", 0, 0, 0, &err) == EPYQ_OK);
    epyq_synth_stats sst;
    ck_assert_msg(epyq_synth_write(&o, &sst, &err) == EPYQ_OK, "%s", err.msg);
    int ids[NP + ND];
    for (int i = 0; i < NP + ND; i++) ids[i] = (i * 211 + 7) % 997;
    epyq_weights *w = NULL;
    epyq_bind_opts bo = {0};
    ck_assert(epyq_weights_bind(&w, dir, &bo, &err) == EPYQ_OK);
    const int V = w->cfg.vocab_size, R = NP + ND;
    epyq_weights_free(w);
    float *plain = malloc((size_t)R * V * sizeof(float)), *got = malloc((size_t)R * V * sizeof(float));
    float *ref = malloc((size_t)R * V * sizeof(float));
    double *lg = malloc((size_t)V * sizeof(double));
    run_model(dir, EPYQ_PATH_A16, NULL, 0, ids, V, plain);
    edit_config(dir, "\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 1024");
    ck_assert(epyq_weights_bind(&w, dir, &bo, &err) == EPYQ_OK);
    ck_assert(w->cfg.yarn && w->cfg.max_ctx == 4096);
    epyq_ref *r = NULL;
    ck_assert(epyq_ref_create(&r, w, R + 2, &err) == EPYQ_OK);
    for (int t = 0; t < R; t++) {
        ck_assert(epyq_ref_forward(r, ids[t], lg, NULL, &err) == EPYQ_OK);
        for (int i = 0; i < V; i++) ref[(size_t)t * V + i] = (float)lg[i];
    }
    epyq_ref_free(r);
    epyq_weights_free(w);
    run_model(dir, EPYQ_PATH_A16, NULL, 0, ids, V, got);
    conform_stats st;
    conform_init(&st);
    conform_add(&st, ref, got, R, V);
    conform_print("yarn ct a16", &st);
    ck_assert_msg(st.kl_mean < 1e-3 && st.kl_max < 1e-2, "yarn: KL %g / %g", st.kl_mean, st.kl_max);
    ck_assert_msg(st.flip_margin <= 0.05, "yarn: argmax differs at a margin of %g", st.flip_margin);
    /* the scaling changes the answer: row 0 (position 0, no rotation) does not move, later
     * rows do, by far more than the runtime's error against the reference */
    double d0 = 0, dmax = 0;
    for (int i = 0; i < V; i++) d0 = fmax(d0, fabs(plain[i] - got[i]));
    for (size_t i = (size_t)V; i < (size_t)R * V; i++) dmax = fmax(dmax, fabs(plain[i] - got[i]));
    printf("yarn vs plain rope: max|dlogit| %.3g at position 0, %.3g after (runtime vs ref %.3g)\n", d0, dmax,
           st.max_abs);
    ck_assert_msg(d0 == 0 && dmax > 10 * st.max_abs, "yarn: %g / %g", d0, dmax);
    free(plain), free(got), free(ref), free(lg), free(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("model_variants");
    TCase *tc = epyq_test_case(s, "variants", 300);
    tcase_add_loop_test(tc, test_actorder_vs_ref, 0, (int)(sizeof formats / sizeof formats[0]));
    tcase_add_test(tc, test_yarn_vs_ref);
    return epyq_test_run(s);
}
