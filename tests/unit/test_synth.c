/* tests/unit/test_synth.c — the synthetic-checkpoint writer on its own: packers against the
 * hand-derived words of docs/quant-formats.md §3, each tool's quantizer against a direct
 * transcription of its rule (§2), the planned 35b-a3b layout against each format's tensor
 * shapes (docs/quant-formats.md §4-§7) and docs/architecture.md §3, determinism (same seed = same
 * bytes, whatever the thread count), the generated tokenizer's merges, and the CLI's exit codes.
 * Round trips through the loader are in test_synth_roundtrip.c. */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/util.h"
#include "kernels-x86/kern.h"
#include "synth/synth_int.h"
#include "tests/check_main.h"
#include "tests/testutil.h"
#include "tests/unit/test_synth_ref.h"

static void rm_dir(char *dir) { ck_assert_int_eq(epyq_test_rm_dir(dir), 0); }

/* ---- §3 worked example: codes U[n][k] = (n + k) mod 16, signed S = U - 8 ---- */

START_TEST(test_pack_words) {
    uint8_t q[8 * 8], z[8];
    for (int n = 0; n < 8; n++) {
        z[n] = 8;
        for (int k = 0; k < 8; k++) q[n * 8 + k] = (uint8_t)((n + k) % 16);
    }
    static const uint32_t seq[8] = {0x76543210, 0x87654321, 0x98765432, 0xA9876543,
                                    0xBA987654, 0xCBA98765, 0xDCBA9876, 0xEDCBA987};
    static const uint32_t awq[8] = {0x75316420, 0x86427531, 0x97538642, 0xA8649753,
                                    0xB975A864, 0xCA86B975, 0xDB97CA86, 0xECA8DB97};
    static const uint32_t quark[8] = {0xFDB9ECA8, 0x0ECAFDB9, 0x1FDB0ECA, 0x20EC1FDB,
                                      0x31FD20EC, 0x420E31FD, 0x531F420E, 0x6420531F};
    uint32_t w[8];
    epyq_synth_pack_gptq_qweight(q, 8, 8, 0, w); /* qweight row 0: columns n = 0..7 */
    for (int n = 0; n < 8; n++) ck_assert_uint_eq(w[n], seq[n]);
    for (int n = 0; n < 8; n++) { /* compressed-tensors weight_packed[n][0]: same words */
        epyq_synth_pack_ct(q, 8, n, w);
        ck_assert_uint_eq(w[0], seq[n]);
    }
    for (int k = 0; k < 8; k++) { /* AWQ qweight[k][0] and Quark int4 reorder weight[k][0] */
        epyq_synth_pack_along_n(q, 8, 8, k, false, true, w);
        ck_assert_uint_eq(w[0], awq[k]);
        epyq_synth_pack_along_n(q, 8, 8, k, true, true, w);
        ck_assert_uint_eq(w[0], quark[k]);
    }
    epyq_synth_pack_along_n(q, 8, 8, 0, true, false, w); /* Quark int4, pack_method "order" */
    ck_assert_uint_eq(w[0], 0xFEDCBA98u);
    epyq_synth_pack_gptq_qzeros(z, 8, 1, 0, w); /* v1: zero 8 stored as 7 */
    ck_assert_uint_eq(w[0], 0x77777777u);
    epyq_synth_pack_along_n(z, 8, 1, 0, true, true, w); /* Quark int4 zero point */
    ck_assert_uint_eq(w[0], 0u);
    /* Quark pads a partial last word with 0: N = 4 outputs (in_proj_a of the tiny shape) */
    epyq_synth_pack_along_n(q, 4, 8, 1, true, true, w);
    for (int i = 0; i < 8; i++) {
        int slot = (int[]){0, 4, 1, 5, 2, 6, 3, 7}[i];
        uint32_t nib = (w[0] >> (4 * slot)) & 0xF;
        ck_assert_uint_eq(nib, i < 4 ? (uint32_t)(q[i * 8 + 1] ^ 8) : 0u);
    }
}
END_TEST

/* ---- §2 quantizer rules: tests/unit/test_synth_ref.h ---- */

START_TEST(test_quantize_rules) {
    enum { N = 24, K = 512, GN = K / 128 };
    static float w[N * K];
    uint64_t st = 12345;
    for (int i = 0; i < N * K; i++) { /* bf16 values incl. all-positive and all-zero groups */
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)(st >> 40) / 16777216.0f - 0.5f;
        int row = i / K, g = (i % K) / 128;
        w[i] = bf16r(row == 3 && g == 1 ? fabsf(u) : row == 5 && g == 2 ? 0.0f : u * (1 + row));
    }
    static const epyq_synth_format fs[] = {EPYQ_SYNTH_GPTQ, EPYQ_SYNTH_CT, EPYQ_SYNTH_QUARK, EPYQ_SYNTH_AWQ};
    static uint8_t q[N * K], qr[N * K];
    for (size_t fi = 0; fi < 4; fi++) {
        float s[N * GN];
        uint8_t z[N * GN];
        epyq_synth_quantize(fs[fi], w, N, K, q, s, z);
        for (int r = 0; r < N; r++)
            for (int g = 0; g < GN; g++) {
                uint8_t zr;
                if (r == 5 && g == 2 && fs[fi] != EPYQ_SYNTH_GPTQ && fs[fi] != EPYQ_SYNTH_AWQ) {
                    /* all-zero group: CT/Quark floor the scale at float32 eps; every code is 0 */
                    for (int i = 0; i < 128; i++) ck_assert_uint_eq(q[r * K + g * 128 + i], 8);
                    continue;
                }
                float sr = ref_group(fs[fi], w + r * K + g * 128, 128, qr + r * K + g * 128, &zr);
                ck_assert_msg(s[r * GN + g] == sr, "%s row %d group %d: scale %g, rule gives %g",
                              epyq_synth_format_name(fs[fi]), r, g, s[r * GN + g], sr);
                ck_assert_uint_eq(z[r * GN + g], zr);
                ck_assert_msg(!memcmp(q + r * K + g * 128, qr + r * K + g * 128, 128), "%s row %d group %d codes",
                              epyq_synth_format_name(fs[fi]), r, g);
            }
    }
    /* GPTQ quirk (§2): a group without negatives keeps xmin = 0, so s = max/15 and codes clip at 15 */
    epyq_synth_quantize(EPYQ_SYNTH_GPTQ, w, N, K, q, (float[N * GN]){0}, (uint8_t[N * GN]){0});
    int clipped = 0;
    for (int i = 0; i < 128; i++) clipped += q[3 * K + 128 + i] == 15;
    ck_assert_int_gt(clipped, 32);
}
END_TEST

/* ---- the generator's kernels: the AVX2 table's entries give the ref twins' bits on the
 * generator's own streams and groups (every table on random data: tests/kern/test_fill_quant.c) ---- */

START_TEST(test_simd_matches_scalar) {
    const epyq_kern_table *ref = epyq_kern_for_isa(EPYQ_ISA_REF), *simd = epyq_kern_for_isa(EPYQ_ISA_AVX2);
    if (!simd) {
        printf("test_simd_matches_scalar: host has no AVX2, nothing to compare\n");
        return;
    }
    ck_assert_ptr_nonnull(ref);
    ck_assert(simd->fill_normal != ref->fill_normal && simd->quant_codes != ref->quant_codes);
    enum { N = 4096 };
    static float a[N], b[N];
    static const uint64_t starts[] = {0, 1, 7, 12345, 0xFFFFFFF0ull, 0x1000000003ull};
    for (size_t t = 0; t < sizeof starts / sizeof starts[0]; t++) {
        uint64_t key = epyq_synth_key(t, "model.language_model.layers.0.mlp.experts.0.up_proj.weight");
        for (int i = 0; i < N; i++) a[i] = b[i] = NAN;
        simd->fill_normal(key, 0.5f, 0.37f, starts[t], N - 3, a);
        ref->fill_normal(key, 0.5f, 0.37f, starts[t], N - 3, b);
        ck_assert_msg(!memcmp(a, b, (N - 3) * sizeof *a), "fill at %llu", (unsigned long long)starts[t]);
        ck_assert(isnan(a[N - 3])); /* nothing past n written */
    }
    /* the quantisation groups below are drawn from every element: fill the NaN guard tail, since
     * a NaN group is not something the synth produces (and its int conversion is undefined) */
    for (int i = N - 3; i < N; i++) b[i] = 0.25f * (float)i / N;
    /* groups as quant.c forms them: each tool's rounding rule with a factor from the group */
    static const epyq_q4_round rules[] = {EPYQ_Q4_ROUND_DIV, EPYQ_Q4_ROUND_DIV_BF16, EPYQ_Q4_ROUND_MUL_SYM,
                                          EPYQ_Q4_ROUND_DIV};
    uint8_t q1[SYNTH_GS], q2[SYNTH_GS];
    int mismatch = 0;
    for (int g = 0; g < N / SYNTH_GS; g++) {
        float *x = a + g * SYNTH_GS, mn1, mx1, mn2, mx2;
        for (int i = 0; i < SYNTH_GS; i++) x[i] = bf16r((b[g * SYNTH_GS + i] - 0.5f) * (float)(g + 1) * (g % 3 ? 1 : 0.01f));
        simd->minmax(x, SYNTH_GS, &mn1, &mx1);
        ref->minmax(x, SYNTH_GS, &mn2, &mx2);
        mismatch += mn1 != mn2 || mx1 != mx2;
        for (int f = 0; f < 4; f++) {
            float s = (mx2 - mn2) / 15, zz = f == 3 ? fminf(fmaxf(-rintf(mn2 / s), 0), 15) : 8;
            memset(q1, 0xEE, sizeof q1), memset(q2, 0xDD, sizeof q2);
            simd->quant_codes(x, SYNTH_GS, rules[f] == EPYQ_Q4_ROUND_MUL_SYM ? 1 / s : s, zz, rules[f], q1);
            ref->quant_codes(x, SYNTH_GS, rules[f] == EPYQ_Q4_ROUND_MUL_SYM ? 1 / s : s, zz, rules[f], q2);
            mismatch += memcmp(q1, q2, SYNTH_GS) != 0;
        }
    }
    ck_assert_int_eq(mismatch, 0);
}
END_TEST

/* ---- planned 35b-a3b layouts (no data written) ---- */

static const synth_tensor *find(const synth_plan *p, const char *name) {
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(p->t[i].name, name)) return &p->t[i];
    return NULL;
}

static void expect(const synth_plan *p, const char *name, const char *dtype, int nd, int64_t a, int64_t b,
                   int64_t c) {
    const synth_tensor *t = find(p, name);
    ck_assert_msg(t != NULL, "missing %s", name);
    ck_assert_str_eq(epyq_synth_dtype_name(t->dtype), dtype);
    ck_assert_int_eq(t->ndim, nd);
    int64_t sh[3] = {a, b, c};
    for (int i = 0; i < nd; i++) ck_assert_msg(t->shape[i] == sh[i], "%s dim %d: %lld", name, i, (long long)t->shape[i]);
}

#define L3 "model.language_model.layers.3."
#define L0 "model.language_model.layers.0."

START_TEST(test_plan_35b) {
    epyq_synth_dims d;
    epyq_err err = {0};
    ck_assert_int_eq(epyq_synth_dims_init(&d, "35b-a3b", 0, 0, 0, &err), EPYQ_OK);
    ck_assert_int_eq(d.special_base, 248044);
    synth_plan p;
    /* compressed-tensors (§5.4) */
    ck_assert_int_eq(epyq_synth_plan_build(&p, &d, EPYQ_SYNTH_CT, false, &err), EPYQ_OK);
    expect(&p, L0 "mlp.experts.255.gate_proj.weight_packed", "I32", 2, 512, 256, 0);
    expect(&p, L0 "mlp.experts.255.gate_proj.weight_scale", "BF16", 2, 512, 16, 0);
    expect(&p, L0 "mlp.experts.7.down_proj.weight_packed", "I32", 2, 2048, 64, 0);
    expect(&p, L0 "mlp.shared_expert.down_proj.weight_scale", "BF16", 2, 2048, 4, 0);
    expect(&p, L0 "linear_attn.in_proj_qkv.weight_packed", "I32", 2, 8192, 256, 0);
    expect(&p, L0 "linear_attn.in_proj_z.weight_scale", "BF16", 2, 4096, 16, 0);
    expect(&p, L0 "linear_attn.in_proj_a.weight_packed", "I32", 2, 32, 256, 0);
    expect(&p, L0 "linear_attn.out_proj.weight_packed", "I32", 2, 2048, 512, 0);
    expect(&p, L0 "linear_attn.out_proj.weight_shape", "I64", 1, 2, 0, 0);
    expect(&p, L0 "linear_attn.conv1d.weight", "BF16", 3, 8192, 1, 4);
    expect(&p, L0 "linear_attn.A_log", "BF16", 1, 32, 0, 0);
    expect(&p, L3 "self_attn.q_proj.weight_packed", "I32", 2, 8192, 256, 0);
    expect(&p, L3 "self_attn.k_proj.weight_scale", "BF16", 2, 512, 16, 0);
    expect(&p, L3 "self_attn.o_proj.weight_scale", "BF16", 2, 2048, 32, 0);
    expect(&p, L3 "self_attn.q_norm.weight", "BF16", 1, 256, 0, 0);
    expect(&p, L0 "mlp.gate.weight", "BF16", 2, 256, 2048, 0);
    expect(&p, L0 "mlp.shared_expert_gate.weight", "BF16", 2, 1, 2048, 0);
    expect(&p, "lm_head.weight", "BF16", 2, 248320, 2048, 0);
    expect(&p, "model.language_model.embed_tokens.weight", "BF16", 2, 248320, 2048, 0);
    expect(&p, "mtp.layers.0.mlp.experts.gate_up_proj", "BF16", 3, 256, 1024, 2048); /* copied fused */
    expect(&p, "mtp.fc.weight", "BF16", 2, 2048, 4096, 0);
    ck_assert_ptr_null(find(&p, "model.language_model.layers.39.linear_attn.A_log")); /* full attention */
    ck_assert_ptr_nonnull(find(&p, "model.language_model.layers.39.self_attn.v_proj.weight_packed"));
    expect(&p, "model.visual.pos_embed.weight", "BF16", 2, 2304, 1152,
           0); /* the tower is BF16 in every release */
    expect(&p, "model.visual.blocks.26.attn.qkv.weight", "BF16", 2, 3456, 1152, 0);
    expect(&p, "model.visual.merger.linear_fc2.weight", "BF16", 2, 2048, 4608, 0);
    /* int4 modules: 40 x 256 x 3 experts + 40 x 3 shared + 30 x 5 GDN + 10 x 4 attention */
    ck_assert_int_eq(p.n_modules, 40 * 256 * 3 + 40 * 3 + 30 * 5 + 10 * 4);
    ck_assert_int_ge(p.n_shards, 4);
    uint64_t sum = 0;
    for (int32_t s = 0; s < p.n_shards; s++) {
        ck_assert_uint_le(p.shard_bytes[s], 5000000000ull);
        sum += p.shard_bytes[s];
    }
    ck_assert_uint_eq(sum, p.total);
    /* ~19.4 GB of text model (4.125-bit linears, BF16 embeddings/lm_head: docs/architecture.md
     * §7.2) plus the 1.69 GB BF16 MTP layer the compressed-tensors release copies over, plus
     * the 0.89 GB BF16 vision tower (446 571 248 params) */
    ck_assert_uint_gt(p.total, 20500000000ull + 893142496ull);
    ck_assert_uint_lt(p.total, 21500000000ull + 893142496ull);
    epyq_synth_plan_free(&p);

    /* GPTQ (§4.8): only routed experts */
    ck_assert_int_eq(epyq_synth_plan_build(&p, &d, EPYQ_SYNTH_GPTQ, false, &err), EPYQ_OK);
    expect(&p, L0 "mlp.experts.0.gate_proj.qweight", "I32", 2, 256, 512, 0);
    expect(&p, L0 "mlp.experts.0.gate_proj.qzeros", "I32", 2, 16, 64, 0);
    expect(&p, L0 "mlp.experts.0.gate_proj.scales", "F16", 2, 16, 512, 0);
    expect(&p, L0 "mlp.experts.0.gate_proj.g_idx", "I32", 1, 2048, 0, 0);
    expect(&p, L0 "mlp.experts.0.down_proj.qweight", "I32", 2, 64, 2048, 0);
    expect(&p, L0 "mlp.experts.0.down_proj.qzeros", "I32", 2, 4, 256, 0);
    expect(&p, L0 "linear_attn.in_proj_qkv.weight", "BF16", 2, 8192, 2048, 0);
    expect(&p, "mtp.layers.0.mlp.experts.255.down_proj.weight", "BF16", 2, 2048, 512, 0);
    ck_assert_int_eq(p.n_modules, 40 * 256 * 3);
    epyq_synth_plan_free(&p);

    /* Quark (§6.4) */
    ck_assert_int_eq(epyq_synth_plan_build(&p, &d, EPYQ_SYNTH_QUARK, false, &err), EPYQ_OK);
    expect(&p, L0 "mlp.experts.0.gate_proj.weight", "I32", 2, 2048, 64, 0);
    expect(&p, L0 "mlp.experts.0.down_proj.weight_scale", "BF16", 2, 4, 2048, 0);
    expect(&p, L0 "mlp.experts.0.down_proj.weight_zero_point", "I32", 2, 4, 256, 0);
    expect(&p, L0 "linear_attn.in_proj_a.weight", "I32", 2, 2048, 4, 0);
    expect(&p, L0 "linear_attn.in_proj_a.weight_scale", "BF16", 2, 16, 32, 0);
    expect(&p, L3 "self_attn.o_proj.weight", "I32", 2, 4096, 256, 0);
    expect(&p, L0 "mlp.shared_expert.up_proj.weight", "BF16", 2, 512, 2048, 0);
    epyq_synth_plan_free(&p);

    /* AWQ (§7): [K][N/8] along N, F16 scales [Gn][N] */
    ck_assert_int_eq(epyq_synth_plan_build(&p, &d, EPYQ_SYNTH_AWQ, false, &err), EPYQ_OK);
    expect(&p, L0 "mlp.experts.0.up_proj.qweight", "I32", 2, 2048, 64, 0);
    expect(&p, L0 "mlp.experts.0.up_proj.qzeros", "I32", 2, 16, 64, 0);
    expect(&p, L0 "mlp.experts.0.up_proj.scales", "F16", 2, 16, 512, 0);
    expect(&p, L0 "linear_attn.in_proj_b.weight", "BF16", 2, 32, 2048, 0);
    epyq_synth_plan_free(&p);

    /* BF16 release, fused (docs/architecture.md §3.2) and per-expert with F32 A_log/norm */
    ck_assert_int_eq(epyq_synth_plan_build(&p, &d, EPYQ_SYNTH_BF16, true, &err), EPYQ_OK);
    expect(&p, L0 "mlp.experts.gate_up_proj", "BF16", 3, 256, 1024, 2048);
    expect(&p, L0 "mlp.experts.down_proj", "BF16", 3, 256, 2048, 512);
    expect(&p, L0 "linear_attn.norm.weight", "BF16", 1, 128, 0, 0);
    /* 35 951 822 704 params (docs/architecture.md §7.1), the vision tower's 446 571 248 included */
    ck_assert_uint_eq(p.total, 2ull * 35951822704ull);
    epyq_synth_plan_free(&p);
    ck_assert_int_eq(epyq_synth_plan_build(&p, &d, EPYQ_SYNTH_BF16, false, &err), EPYQ_OK);
    expect(&p, L0 "linear_attn.A_log", "F32", 1, 32, 0, 0);
    expect(&p, L0 "linear_attn.norm.weight", "F32", 1, 128, 0, 0);
    epyq_synth_plan_free(&p);

    /* overrides keep every 4th layer full attention */
    ck_assert_int_eq(epyq_synth_dims_init(&d, "35b-a3b", 6, 32, 0, &err), EPYQ_OK);
    ck_assert_int_eq(epyq_synth_plan_build(&p, &d, EPYQ_SYNTH_CT, false, &err), EPYQ_OK);
    ck_assert_int_eq(p.n_modules, 6 * 32 * 3 + 6 * 3 + 5 * 5 + 1 * 4);
    ck_assert_ptr_nonnull(find(&p, "model.language_model.layers.3.self_attn.q_proj.weight_packed"));
    ck_assert_ptr_nonnull(find(&p, "model.language_model.layers.5.linear_attn.A_log"));
    epyq_synth_plan_free(&p);
    ck_assert_int_ne(epyq_synth_dims_init(&d, "huge", 0, 0, 0, &err), EPYQ_OK);
    ck_assert_int_ne(epyq_synth_dims_init(&d, "tiny", 0, 4, 0, &err), EPYQ_OK); /* fewer than top-k */
}
END_TEST

/* ---- determinism ---- */

static char *synth_dir(const char *fmt, uint64_t seed, int32_t threads) {
    char *dir = epyq_test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    epyq_synth_opts o = {.out_dir = dir, .format = (epyq_synth_format)epyq_synth_format_parse(fmt),
                         .seed = seed, .threads = threads};
    epyq_err err = {0};
    ck_assert_int_eq(epyq_synth_dims_init(&o.dims, "tiny", 0, 0, 0, &err), EPYQ_OK);
    ck_assert_msg(epyq_synth_write(&o, NULL, &err) == EPYQ_OK, "%s", err.msg);
    return dir;
}

static bool same_file(const char *a, const char *b, const char *name) {
    char *pa = epyq_path_join(a, name), *pb = epyq_path_join(b, name), *da, *db;
    size_t la, lb;
    ck_assert_int_eq(epyq_file_read(pa, 1u << 30, &da, &la, NULL), EPYQ_OK);
    ck_assert_int_eq(epyq_file_read(pb, 1u << 30, &db, &lb, NULL), EPYQ_OK);
    bool same = la == lb && !memcmp(da, db, la);
    free(pa), free(pb), free(da), free(db);
    return same;
}

START_TEST(test_determinism) {
    static const char *const files[] = {"config.json", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json", "model.safetensors.index.json",
                                        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    char *a = synth_dir("quark", 7, 0), *b = synth_dir("quark", 7, 1), *c = synth_dir("quark", 8, 2);
    for (int i = 0; i < 7; i++) ck_assert_msg(same_file(a, b, files[i]), "%s differs for the same seed", files[i]);
    for (int i = 0; i < 5; i++) ck_assert_msg(same_file(a, c, files[i]), "%s depends on the seed", files[i]);
    ck_assert(!same_file(a, c, files[5]) && !same_file(a, c, files[6]));
    /* epyq_synth_draw is the generator's own stream: two seeds draw different values */
    epyq_synth_dims d;
    ck_assert_int_eq(epyq_synth_dims_init(&d, "tiny", 0, 0, 0, NULL), EPYQ_OK);
    float x[64], y[64], z[32];
    const char *nm = "model.language_model.layers.0.mlp.experts.3.gate_proj.weight";
    ck_assert_int_eq(epyq_synth_draw(&d, 7, nm, 0, 64, x, NULL), EPYQ_OK);
    ck_assert_int_eq(epyq_synth_draw(&d, 8, nm, 0, 64, y, NULL), EPYQ_OK);
    ck_assert(memcmp(x, y, sizeof x) != 0);
    ck_assert_int_eq(epyq_synth_draw(&d, 7, nm, 31, 32, z, NULL), EPYQ_OK); /* random access */
    ck_assert(!memcmp(z, x + 31, sizeof z));
    ck_assert_int_ne(epyq_synth_draw(&d, 7, "model.language_model.layers.0.bogus", 0, 1, z, NULL), EPYQ_OK);
    rm_dir(a), rm_dir(b), rm_dir(c);
}
END_TEST

/* ---- tokenizer: merges are valid, common text merges, specials at the model's ids ---- */

typedef struct {
    const char *s;
    int id;
} vocab_entry;

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const vocab_entry *)a)->s, ((const vocab_entry *)b)->s);
}

static int vocab_id(const vocab_entry *v, size_t n, const char *s) {
    vocab_entry key = {.s = s};
    const vocab_entry *e = bsearch(&key, v, n, sizeof *v, cmp_entry);
    return e ? e->id : -1;
}

static void check_tokenizer(const char *dir, int32_t base, int32_t vocab) {
    char *path = epyq_path_join(dir, "tokenizer.json"), *txt;
    size_t len;
    ck_assert_int_eq(epyq_file_read(path, 1u << 30, &txt, &len, NULL), EPYQ_OK);
    cJSON *j = cJSON_ParseWithLength(txt, len);
    ck_assert_ptr_nonnull(j);
    cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    cJSON *v = cJSON_GetObjectItemCaseSensitive(model, "vocab"), *m = cJSON_GetObjectItemCaseSensitive(model, "merges");
    ck_assert_int_eq(cJSON_GetArraySize(v), base);
    ck_assert_int_eq(cJSON_GetArraySize(m), base - 256);
    /* plain checks and one assertion each: Check records every ck_assert call */
    vocab_entry *ve = malloc((size_t)base * sizeof *ve);
    int id = 0, multi_byte_common = 0, bad_id = -1;
    for (cJSON *e = v->child; e; e = e->next, id++) { /* written in id order */
        if ((int)e->valuedouble != id && bad_id < 0) bad_id = id;
        ve[id] = (vocab_entry){e->string, id};
    }
    ck_assert_msg(bad_id < 0, "vocab entry %d is not id %d", bad_id, bad_id);
    qsort(ve, (size_t)base, sizeof *ve, cmp_entry);
    for (int i = 1; i < base && bad_id < 0; i++)
        if (!strcmp(ve[i - 1].s, ve[i].s)) bad_id = ve[i].id;
    ck_assert_msg(bad_id < 0, "token %d appears twice", bad_id);
    int rank = 0, bad_rank = -1;
    for (cJSON *e = m->child; e && bad_rank < 0; e = e->next, rank++) {
        const char *a = cJSON_GetArrayItem(e, 0)->valuestring, *b = cJSON_GetArrayItem(e, 1)->valuestring;
        char cat[2048];
        snprintf(cat, sizeof cat, "%s%s", a, b);
        int ia = vocab_id(ve, (size_t)base, a), ib = vocab_id(ve, (size_t)base, b), ic = vocab_id(ve, (size_t)base, cat);
        /* merge r makes token 256 + r from two tokens that exist before it */
        if (ia < 0 || ib < 0 || ic != 256 + rank || ia >= ic || ib >= ic) bad_rank = rank;
    }
    ck_assert_msg(bad_rank < 0, "merge %d is not (earlier token, earlier token) -> token %d", bad_rank, 256 + bad_rank);
    static const char *const common[] = {"\xC4\xA0" "the", "ing", "\xC4\xA0" "return", "\xC4\xA0" "int",
                                         "\xC4\xA0" "and"};
    for (int i = 0; i < 5; i++) multi_byte_common += vocab_id(ve, (size_t)base, common[i]) >= 256;
    ck_assert_int_ge(multi_byte_common, base > 100000 ? 5 : 3);
    cJSON *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    int nadd = cJSON_GetArraySize(added);
    ck_assert_int_eq(nadd, vocab - base < 26 ? vocab - base : 26);
    cJSON *im_end = cJSON_GetArrayItem(added, 2);
    ck_assert_int_eq((int)cJSON_GetObjectItemCaseSensitive(im_end, "id")->valuedouble, base + 2);
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(im_end, "content")->valuestring, "<|im_end|>");
    cJSON_Delete(j);
    free(ve), free(txt), free(path);
}

START_TEST(test_tokenizer_tiny) {
    char *dir = synth_dir("bf16", 1, 0);
    check_tokenizer(dir, 1000, 1024);
    char *path = epyq_path_join(dir, "tokenizer_config.json"), *txt;
    ck_assert_int_eq(epyq_file_read(path, 1u << 20, &txt, NULL, NULL), EPYQ_OK);
    cJSON *c = cJSON_Parse(txt);
    const char *tpl = cJSON_GetObjectItemCaseSensitive(c, "chat_template")->valuestring;
    ck_assert_int_eq(strlen(tpl), 7764); /* the real template, byte count of the release file */
    ck_assert_ptr_nonnull(strstr(tpl, "<|im_start|>"));
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(c, "eos_token")->valuestring, "<|im_end|>");
    const char *shared = epyq_test_shared("fixtures/tokenizer/chat_template.jinja");
    if (shared) {
        char *real;
        ck_assert_int_eq(epyq_file_read(shared, 1u << 20, &real, NULL, NULL), EPYQ_OK);
        ck_assert_str_eq(tpl, real);
        free(real);
    }
    cJSON_Delete(c);
    free(txt), free(path);
    rm_dir(dir);
}
END_TEST

START_TEST(test_tokenizer_35b) {
    /* the full-size vocabulary: 248 044 BPE tokens, specials at the real ids */
    char *dir = epyq_test_tmpdir();
    epyq_synth_dims d;
    ck_assert_int_eq(epyq_synth_dims_init(&d, "35b-a3b", 0, 0, 0, NULL), EPYQ_OK);
    epyq_err err = {0};
    ck_assert_msg(epyq_synth_write_tokenizer(dir, &d, NULL, &err) == EPYQ_OK, "%s", err.msg);
    check_tokenizer(dir, 248044, 248320);
    rm_dir(dir);
}
END_TEST

/* ---- CLI ---- */

static int run(const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' synth %s >/dev/null 2>&1", epyq_test_bin(), args);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

START_TEST(test_cli) {
    char *dir = epyq_test_tmpdir(), args[4200];
    ck_assert_int_eq(run("--help"), 0);
    ck_assert_int_eq(run(""), 2);
    snprintf(args, sizeof args, "-o '%s' --format fp8", dir);
    ck_assert_int_eq(run(args), 2);
    snprintf(args, sizeof args, "-o '%s' --format ct --fused-experts", dir);
    ck_assert_int_eq(run(args), 2);
    snprintf(args, sizeof args, "-o '%s' --layers zero", dir);
    ck_assert_int_eq(run(args), 2);
    snprintf(args, sizeof args, "-o '%s' --shape 7b", dir);
    ck_assert_int_eq(run(args), 2);
    ck_assert_int_eq(run("-o /proc/epyq-cannot-write"), 1);
    snprintf(args, sizeof args, "-o '%s/m' --format gptq --layers 2 --experts 8 -s 3 -t 1", dir);
    ck_assert_int_eq(run(args), 0);
    char *p = epyq_path_join(dir, "m/quantize_config.json");
    ck_assert_int_eq(access(p, R_OK), 0);
    free(p);
    /* the files do not depend on the kernel table: the plain-C twins write the same bytes */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "EPYQ_MAX_ISA=ref '%s' synth -o '%s/r' --format gptq --layers 2 --experts 8 -s 3 -t 1 >/dev/null",
             epyq_test_bin(), dir);
    ck_assert_int_eq(system(cmd), 0);
    char *mm = epyq_path_join(dir, "m"), *rr = epyq_path_join(dir, "r");
    ck_assert(same_file(mm, rr, "model-00001-of-00002.safetensors"));
    ck_assert(same_file(mm, rr, "model-00002-of-00002.safetensors"));
    free(mm), free(rr);
    /* --tokenizer copies the file and the tokenizer_config.json beside it */
    snprintf(args, sizeof args, "-o '%s/n' --layers 1 --experts 8 --vocab 2048 --tokenizer '%s/m/tokenizer.json'", dir, dir);
    ck_assert_int_eq(run(args), 0);
    char *m = epyq_path_join(dir, "m"), *n = epyq_path_join(dir, "n");
    ck_assert(same_file(m, n, "tokenizer.json"));
    ck_assert(same_file(m, n, "tokenizer_config.json"));
    snprintf(args, sizeof args, "-o '%s/n' --tokenizer '%s/missing.json'", dir, dir);
    ck_assert_int_eq(run(args), 1);
    free(m), free(n);
    rm_dir(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("synth");
    TCase *tc = epyq_test_case(s, "synth", 120);
    EPYQ_TESTS_ADD(tc, test_pack_words, test_quantize_rules, test_simd_matches_scalar,
                   test_plan_35b, test_determinism, test_tokenizer_tiny, test_tokenizer_35b,
                   test_cli);
    return epyq_test_run(s);
}
