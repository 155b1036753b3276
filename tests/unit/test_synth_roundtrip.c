/* tests/unit/test_synth_roundtrip.c — `epyq synth` output read back by the loader
 * (src/load/weights.h), for every format: each linear's unpacked codes, scales and zeros equal the
 * tool's rule (tests/unit/test_synth_ref.h) applied to what synth drew (epyq_synth_draw, from the
 * seed), dequantized values equal (q - z) * s, 16-bit tensors equal the draws exactly, and the set
 * of int4 linears is the one the real writer quantizes. With ../shared present, the tiny layouts
 * must equal the fixture folders' (names, dtypes, shapes) and the config files byte for byte. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "load/weights.h"
#include "synth/synth.h"
#include "tests/check_main.h"
#include "tests/testutil.h"
#include "tests/unit/test_synth_ref.h"

#define SEED 42

static void rm_dir(char *dir) { ck_assert_int_eq(epyq_test_rm_dir(dir), 0); }

static char *synth(epyq_synth_format f, bool fused, epyq_synth_dims *d) {
    char *dir = epyq_test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    epyq_err err = {0};
    epyq_synth_opts o = {.out_dir = dir, .format = f, .seed = SEED, .fused_experts = fused};
    ck_assert_int_eq(epyq_synth_dims_init(&o.dims, "tiny", 0, 0, 0, &err), EPYQ_OK);
    ck_assert_msg(epyq_synth_write(&o, NULL, &err) == EPYQ_OK, "%s", err.msg);
    *d = o.dims;
    return dir;
}

/* Which linears each real writer stores as int4 (docs/quant-formats.md §4.5, §5.3, §6.3; AWQ: all
 * but the narrow in_proj_a/b, routers, gates, lm_head; MTP never). */
static bool expect_q4(epyq_synth_format f, epyq_module_kind k, const char *module, bool mtp) {
    if (f == EPYQ_SYNTH_BF16 || mtp) return false;
    bool ab = strstr(module, "in_proj_a") || strstr(module, "in_proj_b");
    switch (k) {
    case EPYQ_MK_EXPERT: return true;
    case EPYQ_MK_SHARED: return f == EPYQ_SYNTH_CT || f == EPYQ_SYNTH_AWQ;
    case EPYQ_MK_ATTN: return f != EPYQ_SYNTH_GPTQ;
    case EPYQ_MK_GDN: return ab ? f == EPYQ_SYNTH_CT || f == EPYQ_SYNTH_QUARK : f != EPYQ_SYNTH_GPTQ;
    default: return false;
    }
}

typedef struct {
    const epyq_synth_dims *d;
    epyq_synth_format f;
    const epyq_config *cfg;
    size_t nq, ndense;
} rt_ctx;

static void check_linear(const epyq_linear *l, epyq_module_kind kind, int32_t layer, int32_t expert, bool mtp,
                         void *vctx) {
    (void)layer, (void)expert;
    rt_ctx *c = vctx;
    const size_t n = (size_t)l->n_out, k = (size_t)l->n_in, gn = k / 128;
    char name[200];
    snprintf(name, sizeof name, "%s.weight", l->module);
    float *w = malloc(n * k * sizeof *w), *dq = malloc(n * k * sizeof *dq);
    ck_assert(w && dq);
    epyq_err err = {0};
    ck_assert_msg(epyq_synth_draw(c->d, SEED, name, 0, n * k, w, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_msg((l->kind == EPYQ_LIN_Q4) == expect_q4(c->f, kind, l->module, mtp), "%s: int4 is %d",
                  l->module, l->kind == EPYQ_LIN_Q4);
    ck_assert_msg(epyq_linear_dequant(l, c->cfg, dq, &err) == EPYQ_OK, "%s", err.msg);
    if (l->kind == EPYQ_LIN_DENSE) {
        ck_assert_msg(!memcmp(w, dq, n * k * sizeof *w), "%s: stored values differ from the draws", l->module);
        c->ndense++;
    } else {
        uint8_t *q = malloc(n * k), *qr = malloc(n * k), *z = malloc(n * gn), zr;
        float *s = malloc(n * gn * sizeof *s);
        int32_t *perm = malloc(k * sizeof *perm);
        bool has_perm = true;
        ck_assert(q && qr && z && s && perm);
        ck_assert_msg(epyq_linear_unpack_q4(l, c->cfg, q, s, z, perm, &has_perm, &err) == EPYQ_OK, "%s", err.msg);
        ck_assert(!has_perm);
        /* plain comparisons, one assertion per linear: Check records every ck_assert call */
        char bad[256] = "";
        for (size_t r = 0; r < n && !bad[0]; r++)
            for (size_t g = 0; g < gn && !bad[0]; g++) {
                float sr = ref_group(c->f, w + r * k + g * 128, 128, qr + r * k + g * 128, &zr);
                if (s[r * gn + g] != sr || z[r * gn + g] != zr)
                    snprintf(bad, sizeof bad, "row %zu group %zu: scale %g zero %d, rule %g %d", r, g, s[r * gn + g],
                             z[r * gn + g], sr, zr);
                for (size_t i = g * 128; i < (g + 1) * 128 && !bad[0]; i++)
                    if (q[r * k + i] != qr[r * k + i] || dq[r * k + i] != ((float)q[r * k + i] - (float)zr) * sr)
                        snprintf(bad, sizeof bad, "[%zu][%zu]: code %d (dequant %g), rule %d", r, i, q[r * k + i],
                                 dq[r * k + i], qr[r * k + i]);
            }
        ck_assert_msg(!bad[0], "%s %s", l->module, bad);
        free(q), free(qr), free(z), free(s), free(perm);
        c->nq++;
    }
    free(w), free(dq);
}

/* A non-linear tensor equals its draws (BF16 or F32 storage). */
static void check_plain(const epyq_synth_dims *d, const epyq_tensor *t) {
    ck_assert_ptr_nonnull(t);
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    float *w = malloc(n * sizeof *w);
    epyq_err err = {0};
    ck_assert_msg(epyq_synth_draw(d, SEED, t->name, 0, n, w, &err) == EPYQ_OK, "%s", err.msg);
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++) {
        float v = t->dtype == EPYQ_DT_F32 ? ((const float *)t->data)[i] : epyq_bf16_to_f32(((const uint16_t *)t->data)[i]);
        if (v != w[i]) bad = i;
    }
    ck_assert_msg(bad == n, "%s[%zu] differs from the draw %g", t->name, bad, bad < n ? w[bad] : 0.0);
    free(w);
}

static void roundtrip(epyq_synth_format f, bool fused, epyq_qformat qf, size_t nq_expected) {
    epyq_synth_dims d;
    char *dir = synth(f, fused, &d);
    epyq_weights *w = NULL;
    epyq_err err = {0};
    epyq_bind_opts bo = {0};
    ck_assert_msg(epyq_weights_bind(&w, dir, &bo, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(w->cfg.qformat, qf);
    ck_assert(w->has_mtp);
    ck_assert_int_eq(w->n_unexpected, 0);
    rt_ctx c = {.d = &d, .f = f, .cfg = &w->cfg};
    epyq_weights_foreach_linear(w, check_linear, &c);
    ck_assert_uint_eq(c.nq, nq_expected);
    check_plain(&d, w->embed);
    check_plain(&d, w->final_norm);
    for (int32_t i = 0; i < d.layers; i++) {
        const epyq_layer_w *L = &w->layers[i];
        ck_assert_int_eq(L->full_attn, i % 4 == 3);
        check_plain(&d, L->input_norm);
        check_plain(&d, L->post_norm);
        if (L->full_attn) {
            check_plain(&d, L->attn.q_norm);
            check_plain(&d, L->attn.k_norm);
        } else {
            check_plain(&d, L->gdn.conv1d);
            check_plain(&d, L->gdn.dt_bias);
            check_plain(&d, L->gdn.A_log);
            check_plain(&d, L->gdn.norm);
            ck_assert_int_eq(L->gdn.A_log->dtype, f == EPYQ_SYNTH_BF16 && !fused ? EPYQ_DT_F32 : EPYQ_DT_BF16);
        }
    }
    check_plain(&d, w->mtp.pre_fc_norm_embedding);
    check_plain(&d, w->mtp.norm);
    /* sane values: A_log of A in [1, 8), dt_bias = softplus^-1 of dt in [0.01, 0.1] */
    const epyq_tensor *al = w->layers[0].gdn.A_log, *db = w->layers[0].gdn.dt_bias;
    for (int64_t h = 0; h < al->shape[0]; h++) {
        float a = al->dtype == EPYQ_DT_F32 ? ((const float *)al->data)[h] : epyq_bf16_to_f32(((const uint16_t *)al->data)[h]);
        float b = epyq_bf16_to_f32(((const uint16_t *)db->data)[h]);
        ck_assert(a >= 0 && a < 2.08f);
        ck_assert(b > -4.7f && b < -2.2f);
    }
    epyq_weights_free(w);
    rm_dir(dir);
}

/* tiny: 4 layers (3 GDN + 1 attention), 16 experts */
START_TEST(test_roundtrip_bf16) { roundtrip(EPYQ_SYNTH_BF16, false, EPYQ_QF_NONE, 0); }
END_TEST
START_TEST(test_roundtrip_bf16_fused) { roundtrip(EPYQ_SYNTH_BF16, true, EPYQ_QF_NONE, 0); }
END_TEST
START_TEST(test_roundtrip_gptq) { roundtrip(EPYQ_SYNTH_GPTQ, false, EPYQ_QF_GPTQ, 4 * 16 * 3); }
END_TEST
START_TEST(test_roundtrip_ct) { roundtrip(EPYQ_SYNTH_CT, false, EPYQ_QF_CT, 4 * 16 * 3 + 4 * 3 + 3 * 5 + 4); }
END_TEST
START_TEST(test_roundtrip_quark) { roundtrip(EPYQ_SYNTH_QUARK, false, EPYQ_QF_QUARK, 4 * 16 * 3 + 3 * 5 + 4); }
END_TEST
START_TEST(test_roundtrip_awq) { roundtrip(EPYQ_SYNTH_AWQ, false, EPYQ_QF_AWQ, 4 * 16 * 3 + 4 * 3 + 3 * 3 + 4); }
END_TEST

/* ---- the tiny layouts against ../shared/fixtures/models ---- */

static bool same_text(const char *a_dir, const char *b_dir, const char *name) {
    char *pa = epyq_path_join(a_dir, name), *pb = epyq_path_join(b_dir, name), *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    bool ok = epyq_file_read(pa, 1u << 24, &a, &la, NULL) == EPYQ_OK &&
              epyq_file_read(pb, 1u << 24, &b, &lb, NULL) == EPYQ_OK && la == lb && !memcmp(a, b, la);
    free(pa), free(pb), free(a), free(b);
    return ok;
}

static const struct {
    const char *folder;
    epyq_synth_format f;
    bool fused;
} fixtures[] = {{"tiny-bf16", EPYQ_SYNTH_BF16, false}, {"tiny-bf16-fused", EPYQ_SYNTH_BF16, true},
                {"tiny-gptq", EPYQ_SYNTH_GPTQ, false}, {"tiny-ct", EPYQ_SYNTH_CT, false},
                {"tiny-quark", EPYQ_SYNTH_QUARK, false}};

START_TEST(test_fixture_layout) {
    char sub[64];
    snprintf(sub, sizeof sub, "fixtures/models/%s", fixtures[_i].folder);
    const char *fx = epyq_test_shared(sub);
    if (!fx) {
        printf("test_fixture_layout: ../shared absent, skipped\n");
        return;
    }
    char *fxdir = strdup(fx);
    epyq_synth_dims d;
    char *dir = synth(fixtures[_i].f, fixtures[_i].fused, &d);
    epyq_ckpt *a = NULL, *b = NULL;
    epyq_err err = {0};
    ck_assert_msg(epyq_ckpt_open(&a, dir, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_msg(epyq_ckpt_open(&b, fxdir, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_uint_eq(epyq_ckpt_count(a), epyq_ckpt_count(b));
    ck_assert_uint_eq(epyq_ckpt_nshards(a), epyq_ckpt_nshards(b));
    const char *bad = NULL;
    for (size_t i = 0; i < epyq_ckpt_count(a) && !bad; i++) {
        const epyq_tensor *x = epyq_ckpt_at(a, i), *y = epyq_ckpt_at(b, i);
        bool same = !strcmp(x->name, y->name) && x->dtype == y->dtype && x->ndim == y->ndim;
        for (int j = 0; same && j < x->ndim; j++) same = x->shape[j] == y->shape[j];
        if (!same) bad = x->name;
    }
    ck_assert_msg(!bad, "%s: %s differs from the fixture (name, dtype or shape)", fixtures[_i].folder, bad);
    ck_assert_msg(same_text(dir, fxdir, "config.json"), "%s config.json", fixtures[_i].folder);
    ck_assert(same_text(dir, fxdir, "generation_config.json"));
    if (fixtures[_i].f == EPYQ_SYNTH_GPTQ) ck_assert(same_text(dir, fxdir, "quantize_config.json"));
    epyq_ckpt_free(a), epyq_ckpt_free(b);
    free(fxdir);
    rm_dir(dir);
}
END_TEST

/* Shards: (dtype size, name) order inside each, consecutive name ranges across them, and the
 * index the loader validated names every tensor. */
START_TEST(test_shard_order) {
    epyq_synth_dims d;
    char *dir = synth(EPYQ_SYNTH_GPTQ, false, &d);
    epyq_ckpt *c = NULL;
    epyq_err err = {0};
    ck_assert_msg(epyq_ckpt_open(&c, dir, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_uint_ge(epyq_ckpt_nshards(c), 2);
    size_t n = epyq_ckpt_count(c);
    const epyq_tensor **by = malloc(n * sizeof *by);
    for (size_t i = 0; i < n; i++) by[i] = epyq_ckpt_at(c, i); /* sorted by name */
    const char *bad = NULL;
    for (size_t i = 1; i < n && !bad; i++)
        if (by[i - 1]->shard > by[i]->shard) bad = by[i]->name;
    ck_assert_msg(!bad, "%s: shards do not hold consecutive name ranges", bad);
    for (size_t i = 0; i < n && !bad; i++)
        for (size_t j = 0; j < n && !bad; j++) {
            if (by[i]->shard != by[j]->shard || by[i]->data >= by[j]->data) continue;
            size_t si = epyq_dtype_size(by[i]->dtype), sj = epyq_dtype_size(by[j]->dtype);
            if (si < sj || (si == sj && strcmp(by[i]->name, by[j]->name) > 0)) bad = by[i]->name;
        }
    ck_assert_msg(!bad, "%s is stored out of (dtype size, name) order", bad);
    free(by);
    epyq_ckpt_free(c);
    rm_dir(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("synth_roundtrip");
    TCase *tc = epyq_test_case(s, "roundtrip", 120);
    EPYQ_TESTS_ADD(tc, test_roundtrip_bf16, test_roundtrip_bf16_fused, test_roundtrip_gptq,
                   test_roundtrip_ct, test_roundtrip_quark, test_roundtrip_awq);
    tcase_add_loop_test(tc, test_fixture_layout, 0, (int)(sizeof fixtures / sizeof fixtures[0]));
    tcase_add_test(tc, test_shard_order);
    return epyq_test_run(s);
}
