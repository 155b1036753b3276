/* tests/unit/test_model_requant.c — --requant (src/model/requant.c) on synthetic checkpoints:
 *  - the requantised lm_head's logits equal a double product of the post-norm hidden state
 *    with the lm_head dequantised by this test's own transcription of the RTN rules (int8
 *    symmetric amax/127, int4 asymmetric range/15 with 0 in range), so the kernels, the nibble
 *    planes and the group walk are checked against an independent formula;
 *  - the requantised model stays close to the exact one (KL bounds per kind), streams fewer
 *    bytes per token, and gives the same bits on 1 and 2 threads;
 *  - dense= reaches the 16-bit projections of a GPTQ-style checkpoint (BF16 attention,
 *    DeltaNet and shared experts) and changes nothing on compressed-tensors, whose dense
 *    linears are int4 already;
 *  - the spec parser refuses what it does not know;
 *  - epyq_model_last_bytes (what bench divides by time): a batch-1 step reads exactly the
 *    per-token bytes, and a step of B sequences between that and B times the routed part. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "load/tensor_f32.h"
#include "load/weights.h"
#include "model/model.h"
#include "tests/check_main.h"
#include "tests/e2e/synth_model.h"

static const int32_t IDS[] = {3, 17, 200, 45, 999, 8, 61, 512, 77, 5};
enum { NT = sizeof IDS / sizeof IDS[0] };

typedef struct {
    int32_t V, H;
    float *logits; /* [NT][V] */
    float *hidden; /* [NT][H] post-final-norm */
    uint64_t bytes;
} run_out;

static void run(const char *dir, epyq_requant lm, epyq_requant dense, int threads, run_out *r) {
    epyq_model *m = NULL;
    epyq_err err = {0};
    epyq_model_opts o = {.n_threads = threads, .skip_mtp = true, .path = EPYQ_PATH_A16,
                         .requant_lm_head = lm, .requant_dense = dense};
    ck_assert_msg(epyq_model_load(&m, dir, &o, &err) == EPYQ_OK, "%s", err.msg);
    epyq_requant got_lm, got_dense;
    epyq_model_requant(m, &got_lm, &got_dense);
    ck_assert_int_eq(got_lm, lm);
    ck_assert_int_eq(got_dense, dense);
    r->V = epyq_model_config(m)->vocab_size, r->H = epyq_model_config(m)->hidden_size;
    r->bytes = epyq_model_active_bytes(m);
    epyq_seq *s = NULL;
    ck_assert(epyq_seq_create(&s, m, 64, EPYQ_KV_BF16, &err) == EPYQ_OK);
    epyq_seq *seqs[NT];
    for (int i = 0; i < NT; i++) seqs[i] = s;
    r->logits = malloc((size_t)NT * r->V * sizeof(float));
    r->hidden = malloc((size_t)NT * r->H * sizeof(float));
    epyq_batch b = {NT, seqs, IDS, NULL};
    ck_assert_msg(epyq_model_forward(m, &b, r->logits, r->hidden, &err) == EPYQ_OK, "%s", err.msg);
    epyq_seq_free(s);
    epyq_model_free(m);
}

static void run_free(run_out *r) { free(r->logits), free(r->hidden); }

/* KL(p_a || p_b) of one row, in nats. */
static double kl_row(const float *a, const float *b, int32_t V) {
    double ma = a[0], mb = b[0], za = 0, zb = 0, kl = 0;
    for (int32_t i = 1; i < V; i++) ma = fmax(ma, a[i]), mb = fmax(mb, b[i]);
    for (int32_t i = 0; i < V; i++) za += exp(a[i] - ma), zb += exp(b[i] - mb);
    for (int32_t i = 0; i < V; i++) {
        double la = a[i] - ma - log(za), lb = b[i] - mb - log(zb);
        kl += exp(la) * (la - lb);
    }
    return kl;
}

static double kl_mean(const run_out *a, const run_out *b) {
    double s = 0;
    for (int t = 0; t < NT; t++) s += kl_row(a->logits + (size_t)t * a->V, b->logits + (size_t)t * b->V, a->V);
    return s / NT;
}

/* This test's own RTN dequantisation of one group (see requant.c's header for the rules). */
static void dequant_group(const float *x, int32_t gs, epyq_requant kind, double *out) {
    if (kind == EPYQ_REQUANT_INT8) {
        float amax = 0;
        for (int32_t i = 0; i < gs; i++) amax = fmaxf(amax, fabsf(x[i]));
        float s = amax > 0 ? amax / 127.0f : 1.0f;
        for (int32_t i = 0; i < gs; i++) {
            float c = fminf(127.0f, fmaxf(-127.0f, rintf(x[i] / s)));
            out[i] = (double)c * s;
        }
        return;
    }
    float mn = 0, mx = 0;
    for (int32_t i = 0; i < gs; i++) mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]);
    float s = mx - mn > 0 ? (mx - mn) / 15.0f : 1.0f;
    float z = fminf(15.0f, fmaxf(0.0f, rintf(-mn / s)));
    for (int32_t i = 0; i < gs; i++) {
        float q = fminf(15.0f, fmaxf(0.0f, rintf(x[i] / s) + z));
        out[i] = ((double)q - z) * s;
    }
}

/* logits of a requantised lm_head against hidden x the RTN-dequantised head in double */
static void check_head(const char *dir, epyq_requant kind) {
    run_out r;
    run(dir, kind, EPYQ_REQUANT_NONE, 2, &r);
    epyq_weights *w = NULL;
    epyq_err err = {0};
    epyq_bind_opts bo = {.skip_mtp = true};
    ck_assert(epyq_weights_bind(&w, dir, &bo, &err) == EPYQ_OK);
    int32_t V = r.V, H = r.H, gs = 128;
    float *W = malloc((size_t)V * H * sizeof(float));
    double *dq = malloc((size_t)H * sizeof(double));
    ck_assert_msg(epyq_linear_dequant(&w->lm_head, &w->cfg, W, &err) == EPYQ_OK, "%s", err.msg);
    double worst = 0;
    for (int32_t j = 0; j < V; j++) {
        for (int32_t g = 0; g < H / gs; g++) dequant_group(W + (size_t)j * H + g * gs, gs, kind, dq + g * gs);
        for (int t = 0; t < NT; t++) {
            const float *h = r.hidden + (size_t)t * H;
            double y = 0, mag = 0;
            for (int32_t i = 0; i < H; i++) y += dq[i] * h[i], mag += fabs(dq[i] * h[i]);
            /* the only rounding beyond RTN: int16 activations (step amax/32767 per group) and
             * fp32 accumulation; bound relative to sum |w x| */
            double e = fabs(y - r.logits[(size_t)t * V + j]) / (mag + 1e-30);
            worst = fmax(worst, e);
        }
    }
    ck_assert_msg(worst < 2e-4, "%s %s lm_head: worst relative error %.3g against the dequantised head",
                  dir, epyq_requant_name(kind), worst);
    free(W), free(dq);
    epyq_weights_free(w);
    run_free(&r);
}

START_TEST(test_head_matches_rtn) {
    static const char *fmts[] = {"ct", "bf16"};
    char *dir = synth_model(fmts[_i], 5);
    ck_assert(dir);
    check_head(dir, EPYQ_REQUANT_INT8);
    check_head(dir, EPYQ_REQUANT_INT4);
    free(dir);
}
END_TEST

START_TEST(test_close_smaller_deterministic) {
    char *dir = synth_model("gptq", 9);
    ck_assert(dir);
    run_out exact, h8, h4, d8, d8_1;
    run(dir, EPYQ_REQUANT_NONE, EPYQ_REQUANT_NONE, 2, &exact);
    run(dir, EPYQ_REQUANT_INT8, EPYQ_REQUANT_NONE, 2, &h8);
    run(dir, EPYQ_REQUANT_INT4, EPYQ_REQUANT_NONE, 2, &h4);
    run(dir, EPYQ_REQUANT_INT8, EPYQ_REQUANT_INT8, 2, &d8);
    run(dir, EPYQ_REQUANT_INT8, EPYQ_REQUANT_INT8, 1, &d8_1);
    double k8 = kl_mean(&exact, &h8), k4 = kl_mean(&exact, &h4), kd = kl_mean(&exact, &d8);
    fprintf(stderr, "requant KL vs exact (tiny gptq): lm_head int8 %.2e, int4 %.2e, lm_head+dense int8 %.2e\n",
            k8, k4, kd);
    /* int8 RTN: ~0.6% relative weight error on the head; int4: ~10% */
    ck_assert_msg(k8 < 1e-3, "lm_head int8 KL %.3g", k8);
    ck_assert_msg(kd < 1e-2, "lm_head+dense int8 KL %.3g", kd);
    ck_assert_msg(k4 > k8, "int4 (%.3g) should be coarser than int8 (%.3g)", k4, k8);
    ck_assert(h8.bytes < exact.bytes && h4.bytes < h8.bytes && d8.bytes < h8.bytes);
    /* the same bits whatever the thread count (rows are split, never reduced across threads) */
    ck_assert(!memcmp(d8.logits, d8_1.logits, (size_t)NT * d8.V * sizeof(float)));
    run_free(&exact), run_free(&h8), run_free(&h4), run_free(&d8), run_free(&d8_1);
    free(dir);
}
END_TEST

START_TEST(test_dense_on_int4_checkpoint_is_noop) {
    /* compressed-tensors quantises every projection: dense= finds no 16-bit dense linear */
    char *dir = synth_model("ct", 11);
    ck_assert(dir);
    run_out a, b;
    run(dir, EPYQ_REQUANT_NONE, EPYQ_REQUANT_NONE, 2, &a);
    run(dir, EPYQ_REQUANT_NONE, EPYQ_REQUANT_INT8, 2, &b);
    ck_assert(!memcmp(a.logits, b.logits, (size_t)NT * a.V * sizeof(float)));
    ck_assert_uint_eq(a.bytes, b.bytes);
    run_free(&a), run_free(&b);
    free(dir);
}
END_TEST

START_TEST(test_parse) {
    epyq_requant lm = EPYQ_REQUANT_NONE, d = EPYQ_REQUANT_NONE;
    epyq_err err = {0};
    ck_assert(epyq_requant_parse("lm_head=int8", &lm, &d, &err) == EPYQ_OK);
    ck_assert(lm == EPYQ_REQUANT_INT8 && d == EPYQ_REQUANT_NONE);
    ck_assert(epyq_requant_parse("dense=int4,lm_head=int4", &lm, &d, &err) == EPYQ_OK);
    ck_assert(lm == EPYQ_REQUANT_INT4 && d == EPYQ_REQUANT_INT4);
    ck_assert(epyq_requant_parse("none", &lm, &d, &err) == EPYQ_OK);
    ck_assert(lm == EPYQ_REQUANT_NONE && d == EPYQ_REQUANT_NONE);
    static const char *bad[] = {"lm_head", "lm_head=int3", "router=int8", "lm_head=int8,", "=int8", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(epyq_requant_parse(bad[i], &lm, &d, &err) == EPYQ_E_ARG, "'%s' accepted", bad[i]);
        ck_assert(strstr(err.msg, "--requant"));
    }
}
END_TEST

START_TEST(test_last_bytes) {
    char *dir = synth_model("ct", 13);
    ck_assert(dir);
    epyq_model *m = NULL;
    epyq_err err = {0};
    epyq_model_opts o = {.n_threads = 2, .skip_mtp = true};
    ck_assert(epyq_model_load(&m, dir, &o, &err) == EPYQ_OK);
    int32_t V = epyq_model_config(m)->vocab_size;
    enum { B = 4 };
    epyq_seq *s[B];
    for (int i = 0; i < B; i++) ck_assert(epyq_seq_create(&s[i], m, 16, EPYQ_KV_BF16, &err) == EPYQ_OK);
    float *logits = malloc((size_t)B * V * sizeof(float));
    int32_t tok[B] = {5, 300, 41, 777};
    epyq_batch one = {1, s, tok, NULL};
    ck_assert(epyq_model_forward(m, &one, logits, NULL, &err) == EPYQ_OK);
    uint64_t per_tok = epyq_model_active_bytes(m), b1 = epyq_model_last_bytes(m);
    ck_assert_uint_eq(b1, per_tok);
    /* no logits asked for: the lm_head is not read */
    uint8_t none[B] = {0};
    epyq_batch quiet = {1, s + 1, tok + 1, none};
    ck_assert(epyq_model_forward(m, &quiet, logits, NULL, &err) == EPYQ_OK);
    ck_assert_uint_lt(epyq_model_last_bytes(m), per_tok);
    epyq_batch all = {B, s, tok, NULL};
    ck_assert(epyq_model_forward(m, &all, logits, NULL, &err) == EPYQ_OK);
    uint64_t bb = epyq_model_last_bytes(m);
    ck_assert_uint_gt(bb, per_tok);             /* 4 random tokens choose more than 8 experts */
    ck_assert_uint_le(bb, (uint64_t)B * per_tok); /* and never more than 4 tokens' worth */
    for (int i = 0; i < B; i++) epyq_seq_free(s[i]);
    free(logits);
    epyq_model_free(m);
    free(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("model_requant");
    TCase *tc = epyq_test_case(s, "requant", 300);
    tcase_add_loop_test(tc, test_head_matches_rtn, 0, 2);
    EPYQ_TESTS_ADD(tc, test_close_smaller_deterministic, test_dense_on_int4_checkpoint_is_noop,
                   test_parse, test_last_bytes);
    return epyq_test_run(s);
}
