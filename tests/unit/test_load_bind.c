/* tests/unit/test_load_bind.c — binding small checkpoints written by tests/files/tiny_ckpt.h:
 * every format round-trips (load, decode, compare with the closed-form codes/zeros/scales the
 * writer drew), every expert layout binds, and each architecture-level defect (transposed or
 * missing tensor, unexpected tensor, wrong companion shapes or dtypes) is refused by name. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "load/weights.h"
#include "tests/check_main.h"
#include "tests/files/tiny_ckpt.h"
#include "tests/testutil.h"

/* Check's ck_assert records a checkpoint on every call (a syscall in fork mode); inside
 * per-element loops only the failure path may call into Check. */
#define EXPECT(cond, ...) \
    do { \
        if (!(cond)) ck_abort_msg(__VA_ARGS__); \
    } while (0)

static char *write_model(const tc_opts *o, void (*mutate)(tc_list *, void *), void *ctx) {
    char *dir = tc_write_tmp(o, mutate, ctx);
    ck_assert_ptr_nonnull(dir);
    return dir;
}

static void rm_dir(char *dir) { ck_assert_int_eq(epyq_test_rm_dir(dir), 0); }

typedef struct {
    const tc_opts *o;
    const epyq_config *cfg;
    size_t nq, ndense;
} rt_ctx;

/* Decode one linear and compare with what the writer stored. */
static void check_linear(const epyq_linear *l, epyq_module_kind kind, int32_t layer, int32_t expert, bool mtp, void *vctx) {
    (void)kind, (void)layer, (void)expert, (void)mtp;
    rt_ctx *c = vctx;
    int64_t N = l->n_out, K = l->n_in;
    float *w = malloc((size_t)(N * K) * sizeof *w);
    epyq_err err;
    ck_assert_msg(epyq_linear_dequant(l, c->cfg, w, &err) == EPYQ_OK, "%s", err.msg);
    if (l->kind == EPYQ_LIN_Q4) {
        c->nq++;
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                int64_t g = tc_group(c->o, k);
                float want = (float)(tc_code(n, k) - tc_zero(c->o, n, g)) * tc_scale(n, g);
                EXPECT(w[n * K + k] == want, "%s [%lld, %lld]: %g, expected %g", l->module, (long long)n,
                              (long long)k, (double)w[n * K + k], (double)want);
            }
        /* the canonical form (what the kernels pack) says the same */
        int64_t Gn = K / l->scheme.group_size;
        uint8_t *q = malloc((size_t)(N * K)), *z = malloc((size_t)(N * Gn));
        float *s = malloc((size_t)(N * Gn) * sizeof *s);
        int32_t *perm = malloc((size_t)K * sizeof *perm);
        bool hp;
        ck_assert_msg(epyq_linear_unpack_q4(l, c->cfg, q, s, z, perm, &hp, &err) == EPYQ_OK, "%s", err.msg);
        ck_assert_int_eq(hp, c->o->act_order);
        for (int64_t n = 0; n < N; n++)
            for (int64_t i = 0; i < K; i++) {
                int64_t k = hp ? perm[i] : i, g = i / l->scheme.group_size;
                EXPECT(q[n * K + i] == tc_code(n, k), "%s: code [%lld, %lld]", l->module, (long long)n, (long long)i);
                EXPECT(z[n * Gn + g] == tc_zero(c->o, n, tc_group(c->o, k)), "%s: zero [%lld, %lld]", l->module,
                       (long long)n, (long long)g);
                EXPECT(s[n * Gn + g] == tc_scale(n, tc_group(c->o, k)), "%s: scale [%lld, %lld]", l->module,
                       (long long)n, (long long)g);
            }
        free(q);
        free(z);
        free(s);
        free(perm);
    } else {
        c->ndense++;
        if (l->row0 == 0 && l->slice == 0 && l->w->ndim == 2)
            for (int64_t i = 0; i < N * K; i++) EXPECT(w[i] == tc_dense(i), "%s: weight %lld", l->module, (long long)i);
    }
    free(w);
}

static void roundtrip(tc_opts o, size_t want_q4) {
    char *dir = write_model(&o, NULL, NULL);
    epyq_weights *w;
    epyq_err err = {0};
    ck_assert_msg(epyq_weights_bind(&w, dir, NULL, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(w->cfg.qformat, o.fmt);
    ck_assert_uint_eq(w->n_unexpected, 0);
    ck_assert_uint_eq(w->n_qc_mismatch, 0);
    rt_ctx c = {&o, &w->cfg, 0, 0};
    epyq_weights_foreach_linear(w, check_linear, &c);
    ck_assert_uint_eq(c.nq, want_q4);
    epyq_weights_free(w);
    rm_dir(dir);
}

/* experts: 2 layers x 4 x 3 = 24; mixers: 5 GDN + 4 attention; shared: 2 x 3 */
START_TEST(rt_bf16) { roundtrip(tc_defaults(EPYQ_QF_NONE), 0); }
END_TEST
START_TEST(rt_gptq) {
    for (int v = 1; v <= 2; v++)
        for (int sym = 0; sym <= 1; sym++) {
            tc_opts o = tc_defaults(EPYQ_QF_GPTQ);
            o.gptq_version = v;
            o.sym = sym;
            roundtrip(o, 24);
        }
}
END_TEST
START_TEST(rt_gptq_act_order) {
    tc_opts o = tc_defaults(EPYQ_QF_GPTQ);
    o.gs = 32;
    o.act_order = true;
    roundtrip(o, 24);
}
END_TEST
START_TEST(rt_ct) {
    for (int sym = 0; sym <= 1; sym++) {
        tc_opts o = tc_defaults(EPYQ_QF_CT);
        o.sym = sym;
        roundtrip(o, 24 + 9 + 6);
    }
    tc_opts o = tc_defaults(EPYQ_QF_CT);
    o.gs = 64;
    o.act_order = true;
    roundtrip(o, 24 + 9 + 6);
}
END_TEST
START_TEST(rt_quark) {
    for (int sym = 0; sym <= 1; sym++)
        for (int ro = 0; ro <= 1; ro++) {
            tc_opts o = tc_defaults(EPYQ_QF_QUARK);
            o.sym = sym; /* int4 when symmetric, uint4 otherwise */
            o.quark_reorder = ro;
            roundtrip(o, 24 + 9);
        }
}
END_TEST
START_TEST(rt_awq) {
    tc_opts o = tc_defaults(EPYQ_QF_AWQ);
    o.gs = 64;
    roundtrip(o, 24);
}
END_TEST

START_TEST(layouts) {
    tc_opts o = tc_defaults(EPYQ_QF_NONE);
    o.fused_experts = true;
    o.nshards = 1; /* single model.safetensors, no index */
    roundtrip(o, 0);
    o = tc_defaults(EPYQ_QF_CT);
    o.text_only = true; /* prefix "model." */
    o.tie = true;       /* no lm_head tensor */
    char *dir = write_model(&o, NULL, NULL);
    epyq_weights *w;
    epyq_err err;
    ck_assert_msg(epyq_weights_bind(&w, dir, NULL, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_str_eq(w->cfg.prefix, "model.");
    ck_assert_ptr_eq(w->lm_head.w, w->embed);
    epyq_weights_free(w);
    rm_dir(dir);
}
END_TEST

/* ---- defects ---- */

typedef struct {
    const char *name;     /* tensor to act on */
    const char *rename;   /* new name (NULL: keep) */
    bool drop, transpose, to_f32;
    int64_t dim0;         /* > 0: set shape[0] (data resized) */
} mut;

static void apply(tc_list *l, void *vctx) {
    const mut *m = vctx;
    tc_tensor *t = tc_find(l, m->name);
    ck_assert_msg(t != NULL, "test bug: no tensor %s", m->name);
    if (m->drop) {
        tc_remove(l, m->name);
        return;
    }
    if (m->rename) snprintf(t->name, sizeof t->name, "%s", m->rename);
    if (m->transpose) {
        int64_t a = t->shape[0];
        t->shape[0] = t->shape[1];
        t->shape[1] = a;
    }
    if (m->to_f32) t->dt = EPYQ_DT_F32; /* I32 words reinterpreted: same size, wrong type */
    if (m->dim0 > 0) {
        size_t row = t->nbytes / (size_t)t->shape[0];
        t->shape[0] = m->dim0;
        t->nbytes = row * (size_t)m->dim0;
        t->data = realloc(t->data, t->nbytes);
        memset(t->data, 0, t->nbytes);
    }
}

static void expect_refusal(epyq_qformat fmt, mut m, epyq_status want, const char *needle1, const char *needle2) {
    tc_opts o = tc_defaults(fmt);
    char *dir = write_model(&o, apply, &m);
    epyq_weights *w = NULL;
    epyq_err err = {0};
    epyq_status st = epyq_weights_bind(&w, dir, NULL, &err);
    ck_assert_msg(st == want, "%s: got %s (%s)", m.name, epyq_status_name(st), err.msg);
    ck_assert_ptr_null(w);
    ck_assert_msg(strstr(err.msg, needle1) != NULL, "'%s' not in: %s", needle1, err.msg);
    if (needle2) ck_assert_msg(strstr(err.msg, needle2) != NULL, "'%s' not in: %s", needle2, err.msg);
    ck_assert_ptr_null(strchr(err.msg, '\n'));
    rm_dir(dir);
}

#define L0 "model.language_model.layers.0."
#define L1 "model.language_model.layers.1."

START_TEST(transposed_weight) {
    expect_refusal(EPYQ_QF_NONE, (mut){.name = L0 "linear_attn.in_proj_qkv.weight", .transpose = true}, EPYQ_E_SHAPE,
                   L0 "linear_attn.in_proj_qkv.weight", "transposed");
    mut m = {.name = L1 "self_attn.q_proj.weight", .transpose = true};
    expect_refusal(EPYQ_QF_GPTQ, m, EPYQ_E_SHAPE, "q_proj.weight", "expected BF16/F16/F32 [256, 128], found BF16 [128, 256]");
}
END_TEST

START_TEST(missing_tensor) {
    expect_refusal(EPYQ_QF_NONE, (mut){.name = L1 "mlp.experts.3.down_proj.weight", .drop = true}, EPYQ_E_SHAPE,
                   L1 "mlp.experts.3.down_proj.weight", "missing");
    expect_refusal(EPYQ_QF_NONE, (mut){.name = L0 "linear_attn.A_log", .drop = true}, EPYQ_E_SHAPE, "A_log", "missing");
    expect_refusal(EPYQ_QF_GPTQ, (mut){.name = L0 "mlp.experts.1.up_proj.scales", .drop = true}, EPYQ_E_SHAPE,
                   "experts.1.up_proj.scales", "missing");
    expect_refusal(EPYQ_QF_NONE, (mut){.name = "lm_head.weight", .drop = true}, EPYQ_E_SHAPE, "lm_head.weight", "missing");
}
END_TEST

START_TEST(unexpected_tensor) {
    mut m = {.name = L0 "input_layernorm.weight", .rename = L0 "input_layernorm.bias"};
    /* the renamed tensor is both missing and unexpected: the missing one is reported */
    expect_refusal(EPYQ_QF_NONE, m, EPYQ_E_SHAPE, "input_layernorm.weight", "missing");
    tc_opts o = tc_defaults(EPYQ_QF_NONE);
    char *dir = write_model(&o, NULL, NULL);
    /* add an extra shard-listed tensor by rewriting the model with one more entry */
    tc_list l = {0};
    tc_model(&l, &o);
    tc_vec(&l, "model.language_model.layers.0.extra.weight", 1, 4, 0, 0);
    tc_vec(&l, "model.visual.blocks.0.norm1.weight", 1, 4, 0, 0); /* vision: recognised, not unexpected */
    tc_vec(&l, "mtp.fc.weight", 1, 4, 0, 0);                      /* mtp with mtp_num_hidden_layers 0: skipped */
    ck_assert_int_eq(tc_write(dir, &l, &o), 0);
    tc_free(&l);
    epyq_weights *w;
    epyq_err err;
    ck_assert_int_eq(epyq_weights_bind(&w, dir, NULL, &err), EPYQ_E_SHAPE);
    ck_assert_ptr_nonnull(strstr(err.msg, "unexpected tensor model.language_model.layers.0.extra.weight"));
    epyq_bind_opts bo = {.allow_unexpected = true};
    ck_assert_msg(epyq_weights_bind(&w, dir, &bo, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_uint_eq(w->n_unexpected, 1);
    ck_assert_str_eq(w->unexpected[0], "model.language_model.layers.0.extra.weight");
    ck_assert_uint_eq(w->n_vision, 1);
    ck_assert_uint_eq(w->n_mtp, 1);
    ck_assert(!w->has_mtp);
    epyq_weights_free(w);
    rm_dir(dir);
}
END_TEST

START_TEST(bad_companions) {
    /* GPTQ qweight with the wrong packed row count */
    expect_refusal(EPYQ_QF_GPTQ, (mut){.name = L0 "mlp.experts.0.gate_proj.qweight", .dim0 = 8}, EPYQ_E_SHAPE,
                   "experts.0.gate_proj.qweight", "expected I32 [16, 128]");
    /* packed words stored as F32 */
    expect_refusal(EPYQ_QF_CT, (mut){.name = L1 "self_attn.k_proj.weight_packed", .to_f32 = true}, EPYQ_E_SHAPE,
                   "k_proj.weight_packed", "expected I32");
    /* scales with a different group count (group size disagrees with the config) */
    expect_refusal(EPYQ_QF_QUARK, (mut){.name = L0 "mlp.experts.2.down_proj.weight_scale", .dim0 = 2}, EPYQ_E_SHAPE,
                   "down_proj.weight_scale", "[1, 128]");
    /* AWQ zero points are required */
    expect_refusal(EPYQ_QF_AWQ, (mut){.name = L1 "mlp.experts.0.up_proj.qzeros", .drop = true}, EPYQ_E_SHAPE,
                   "up_proj.qzeros", "missing");
}
END_TEST

static void ct_bad_shape(tc_list *l, void *ctx) {
    (void)ctx;
    tc_tensor *t = tc_find(l, L0 "mlp.experts.0.down_proj.weight_shape");
    int64_t v[2] = {128, 64};
    memcpy(t->data, v, 16);
}

START_TEST(ct_weight_shape_checked) {
    tc_opts o = tc_defaults(EPYQ_QF_CT);
    char *dir = write_model(&o, ct_bad_shape, NULL);
    epyq_weights *w;
    epyq_err err;
    ck_assert_int_eq(epyq_weights_bind(&w, dir, NULL, &err), EPYQ_E_SHAPE);
    ck_assert_ptr_nonnull(strstr(err.msg, "down_proj.weight_shape"));
    rm_dir(dir);
}
END_TEST

START_TEST(config_refusal_reaches_bind) {
    /* bits != 4 in the config of an otherwise valid GPTQ folder */
    tc_opts o = tc_defaults(EPYQ_QF_GPTQ);
    char *dir = write_model(&o, NULL, NULL);
    char *cfg = tc_config(&o);
    char *p = strstr(cfg, "\"bits\": 4");
    p[8] = '8';
    ck_assert_int_eq(tc_write_text(dir, "config.json", cfg), 0);
    free(cfg);
    epyq_weights *w;
    epyq_err err;
    ck_assert_int_eq(epyq_weights_bind(&w, dir, NULL, &err), EPYQ_E_QUANT);
    ck_assert_ptr_nonnull(strstr(err.msg, "bits 8"));
    ck_assert_ptr_nonnull(strstr(err.msg, "config.json"));
    rm_dir(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("load_bind");
    TCase *tc = epyq_test_case(s, "bind", 120);
    EPYQ_TESTS_ADD(tc, rt_bf16, rt_gptq, rt_gptq_act_order, rt_ct, rt_quark, rt_awq, layouts,
                   transposed_weight, missing_tensor, unexpected_tensor, bad_companions,
                   ct_weight_shape_checked, config_refusal_reaches_bind);
    return epyq_test_run(s);
}
