/* tests/unit/test_load_fixtures.c — binding every folder of ../shared/fixtures/models and
 * decoding every linear. All five folders hold the same master bf16 weights, stored five ways,
 * so each int4 linear must dequantize to its tiny-bf16 twin within int4 rounding (half a
 * quantisation step, plus the scale's own 16-bit rounding), and 16-bit linears must match
 * exactly. Skips (exit 77) when ../shared is absent. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "load/weights.h"
#include "tests/check_main.h"
#include "tests/testutil.h"

/* Check's ck_assert records a checkpoint on every call (a syscall in fork mode); inside
 * per-element loops only the failure path may call into Check. */
#define EXPECT(cond, ...) \
    do { \
        if (!(cond)) ck_abort_msg(__VA_ARGS__); \
    } while (0)

typedef struct {
    const epyq_linear *l[4096];
    int kind[4096];
    size_t n;
} lin_list;

static void collect(const epyq_linear *l, epyq_module_kind kind, int32_t layer, int32_t expert, bool mtp, void *ctx) {
    (void)layer, (void)expert, (void)mtp;
    lin_list *ll = ctx;
    ck_assert_uint_lt(ll->n, 4096);
    ll->kind[ll->n] = kind;
    ll->l[ll->n++] = l;
}

static epyq_weights *bind(const char *folder) {
    char sub[256];
    snprintf(sub, sizeof sub, "fixtures/models/%s", folder);
    const char *dir = epyq_test_shared(sub);
    ck_assert_ptr_nonnull(dir);
    epyq_weights *w;
    epyq_err err = {0};
    epyq_bind_opts o = {0};
    epyq_status st = epyq_weights_bind(&w, dir, &o, &err);
    ck_assert_msg(st == EPYQ_OK, "%s: %s", folder, err.msg);
    return w;
}

/* Compare every linear of `folder` with tiny-bf16; returns the number of int4 linears. */
static size_t compare_with_bf16(const char *folder, epyq_qformat fmt) {
    epyq_weights *ref = bind("tiny-bf16"), *w = bind(folder);
    ck_assert_int_eq(w->cfg.qformat, fmt);
    ck_assert_uint_eq(w->n_unexpected, 0);
    ck_assert(w->has_mtp);
    ck_assert_uint_gt(w->n_vision, 0);
    static lin_list a, b;
    a.n = b.n = 0;
    epyq_weights_foreach_linear(ref, collect, &a);
    epyq_weights_foreach_linear(w, collect, &b);
    ck_assert_uint_eq(a.n, b.n);
    size_t nq = 0;
    double worst = 0;
    for (size_t i = 0; i < a.n; i++) {
        const epyq_linear *x = a.l[i], *y = b.l[i];
        EXPECT(!strcmp(x->module, y->module), "%s vs %s", x->module, y->module);
        ck_assert_int_eq(x->n_out, y->n_out);
        ck_assert_int_eq(x->n_in, y->n_in);
        size_t n = (size_t)(x->n_out * x->n_in);
        float *wx = malloc(n * sizeof *wx), *wy = malloc(n * sizeof *wy);
        epyq_err err;
        ck_assert_msg(epyq_linear_dequant(x, &ref->cfg, wx, &err) == EPYQ_OK, "%s", err.msg);
        ck_assert_msg(epyq_linear_dequant(y, &w->cfg, wy, &err) == EPYQ_OK, "%s", err.msg);
        if (y->kind == EPYQ_LIN_DENSE) {
            ck_assert_msg(!memcmp(wx, wy, n * sizeof *wx), "%s: %s differs from tiny-bf16", folder, y->module);
        } else {
            nq++;
            int64_t gs = y->scheme.group_size, K = y->n_in, Gn = K / gs;
            uint8_t *q = malloc(n), *z = malloc((size_t)(y->n_out * Gn));
            float *s = malloc((size_t)(y->n_out * Gn) * sizeof *s);
            bool hp;
            ck_assert_msg(epyq_linear_unpack_q4(y, &w->cfg, q, s, z, NULL, &hp, &err) == EPYQ_OK, "%s", err.msg);
            double sum = 0;
            for (size_t j = 0; j < n; j++) {
                size_t r = j / (size_t)K, g = (j % (size_t)K) / (size_t)gs;
                double step = s[r * (size_t)Gn + g];
                /* canonical form must reproduce the dequantized value exactly */
                EXPECT(wy[j] == (float)((int)q[j] - (int)z[r * (size_t)Gn + g]) * s[r * (size_t)Gn + g],
                       "%s: canonical form disagrees with dequant at %zu", y->module, j);
                double d = fabs((double)wx[j] - wy[j]) / step;
                sum += d;
                if (d > worst) worst = d;
                /* RTN error is <= step/2; the stored 16-bit scale moves a code of magnitude <= 8
                 * by at most 8 * 2^-8 steps. */
                EXPECT(d <= 0.5 + 8.0 / 256, "%s: %s[%zu]: bf16 %g vs int4 %g (step %g)", folder, y->module, j,
                              (double)wx[j], (double)wy[j], step);
            }
            /* a decoder that returned the master weights themselves would give 0 here */
            ck_assert_msg(sum / (double)n > 0.05, "%s: %s: mean error %g steps is implausibly small", folder, y->module,
                          sum / (double)n);
            free(q);
            free(z);
            free(s);
        }
        free(wx);
        free(wy);
    }
    fprintf(stderr, "%s: %zu linears, %zu int4, worst error %.3f steps\n", folder, b.n, nq, worst);
    epyq_weights_free(ref);
    epyq_weights_free(w);
    return nq;
}

START_TEST(bf16_fused_equals_per_expert) {
    ck_assert_uint_eq(compare_with_bf16("tiny-bf16-fused", EPYQ_QF_NONE), 0);
    epyq_weights *w = bind("tiny-bf16-fused");
    ck_assert(w->layers[0].moe.fused);
    ck_assert(w->mtp.layer.moe.fused);
    epyq_weights_free(w);
}
END_TEST

/* int4 module counts from ../shared/fixtures/models/README.md */
START_TEST(gptq_matches_bf16) { ck_assert_uint_eq(compare_with_bf16("tiny-gptq", EPYQ_QF_GPTQ), 192); }
END_TEST
START_TEST(ct_matches_bf16) {
    ck_assert_uint_eq(compare_with_bf16("tiny-ct", EPYQ_QF_CT), 223);
    epyq_weights *w = bind("tiny-ct");
    ck_assert(!w->layers[0].moe.fused); /* trunk per-expert int4 ... */
    ck_assert(w->mtp.layer.moe.fused);  /* ... MTP fused bf16 in the same checkpoint */
    epyq_weights_free(w);
}
END_TEST
START_TEST(quark_matches_bf16) {
    ck_assert_uint_eq(compare_with_bf16("tiny-quark", EPYQ_QF_QUARK), 211);
    epyq_weights *w = bind("tiny-quark");
    ck_assert(w->cfg.quark_reorder);
    ck_assert_int_eq(w->layers[0].gdn.in_proj_a.kind, EPYQ_LIN_Q4); /* N = 4 < 8: padded words */
    ck_assert_uint_eq(w->n_qc_mismatch, 0);
    epyq_weights_free(w);
}
END_TEST

START_TEST(config_values) {
    epyq_weights *w = bind("tiny-gptq");
    const epyq_config *c = &w->cfg;
    ck_assert_int_eq(c->hidden_size, 256);
    ck_assert_int_eq(c->vocab_size, 1024);
    ck_assert_int_eq(c->num_hidden_layers, 4);
    ck_assert(!c->full_attn[0] && !c->full_attn[2] && c->full_attn[3]);
    ck_assert_int_eq(c->rotary_dim, 16);
    ck_assert_int_eq(c->mrope_section[0] + c->mrope_section[1] + c->mrope_section[2], 8);
    ck_assert_int_eq(c->num_experts, 16);
    ck_assert_int_eq(c->n_eos, 2);
    ck_assert_int_eq(c->eos_ids[0], 1002);
    ck_assert_int_eq(c->eos_ids[1], 1000);
    ck_assert_int_eq(c->top_k, 20);
    ck_assert_int_eq(c->gptq_version, 1);
    ck_assert_str_eq(c->prefix, "model.language_model.");
    epyq_weights_free(w);
}
END_TEST

int main(void) {
    if (!epyq_test_shared("fixtures/models/tiny-bf16")) {
        printf("skip: ../shared fixtures not found\n");
        return 77;
    }
    Suite *s = suite_create("load_fixtures");
    TCase *tc = epyq_test_case(s, "fixtures", 120);
    EPYQ_TESTS_ADD(tc, bf16_fused_equals_per_expert, gptq_matches_bf16, ct_matches_bf16,
                   quark_matches_bf16, config_values);
    return epyq_test_run(s);
}
