/* tests/unit/test_load_quant.c — int4 decoding against the hand-derived words of
 * docs/quant-formats.md §3 (worked example: U[n][k] = (n + k) mod 16, scale 1,
 * G = 8, every decoder must give W[n][k] = U[n][k] - 8), plus g_idx gathers and Quark's
 * N < 8 padding. No fixtures needed: the tensors are built in memory. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "load/weights.h"
#include "tests/check_main.h"

static uint16_t bf16_one = 0x3F80; /* 1.0 */

typedef struct {
    epyq_tensor qw, sc, zp, gi;
    uint32_t qwd[64], zpd[8];
    uint16_t scd[64];
    int32_t gid[64];
    epyq_linear l;
    epyq_config cfg;
} case8;

static void tensor2(epyq_tensor *t, const char *name, epyq_dtype dt, int64_t a, int64_t b, const void *data) {
    memset(t, 0, sizeof *t);
    t->name = name;
    t->dtype = dt;
    t->ndim = 2;
    t->shape[0] = a;
    t->shape[1] = b;
    t->data = data;
    t->nbytes = (size_t)(a * b) * epyq_dtype_size(dt);
}

/* An 8x8 linear with group size 8 (one group), unit scales. */
static void setup(case8 *c, epyq_qformat f, bool sym) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < 64; i++) c->scd[i] = bf16_one;
    c->cfg.qformat = f;
    c->cfg.gptq_version = 1;
    c->cfg.quark_reorder = true;
    c->cfg.quark_signed = true;
    c->l.kind = EPYQ_LIN_Q4;
    c->l.n_out = 8;
    c->l.n_in = 8;
    snprintf(c->l.module, sizeof c->l.module, "test");
    c->l.scheme = (epyq_qscheme){.quantized = true, .bits = 4, .group_size = 8, .sym = sym};
    c->l.qweight = &c->qw;
    c->l.scales = &c->sc;
    tensor2(&c->sc, "test.scales", EPYQ_DT_BF16, 1, 8, c->scd); /* [Gn][N] (CT: [N][Gn], same bytes) */
}

static void check_example(case8 *c) {
    float w[64];
    epyq_err err;
    ck_assert_int_eq(epyq_linear_dequant(&c->l, &c->cfg, w, &err), EPYQ_OK);
    for (int n = 0; n < 8; n++)
        for (int k = 0; k < 8; k++) ck_assert_float_eq(w[n * 8 + k], (float)((n + k) % 16 - 8));
    uint8_t q[64], z[8];
    float s[8];
    bool hp;
    ck_assert_int_eq(epyq_linear_unpack_q4(&c->l, &c->cfg, q, s, z, NULL, &hp, &err), EPYQ_OK);
    ck_assert(!hp);
    for (int n = 0; n < 8; n++) {
        ck_assert_float_eq(s[n], 1.0f);
        for (int k = 0; k < 8; k++) ck_assert_int_eq((int)q[n * 8 + k] - (int)z[n], (n + k) % 16 - 8);
    }
}

/* GPTQ qweight row 0 (k = 0..7 in one word per output n), §3. */
static const uint32_t gptq_row0[8] = {0x76543210, 0x87654321, 0x98765432, 0xA9876543,
                                      0xBA987654, 0xCBA98765, 0xDCBA9876, 0xEDCBA987};
static const uint32_t awq_words[8] = {0x75316420, 0x86427531, 0x97538642, 0xA8649753,
                                      0xB975A864, 0xCA86B975, 0xDB97CA86, 0xECA8DB97};
static const uint32_t quark_int4_words[8] = {0xFDB9ECA8, 0x0ECAFDB9, 0x1FDB0ECA, 0x20EC1FDB,
                                             0x31FD20EC, 0x420E31FD, 0x531F420E, 0x6420531F};

START_TEST(gptq_v1_v2) {
    for (int v = 1; v <= 2; v++)
        for (int sym = 0; sym <= 1; sym++) {
            case8 c;
            setup(&c, EPYQ_QF_GPTQ, sym);
            c.cfg.gptq_version = v;
            memcpy(c.qwd, gptq_row0, sizeof gptq_row0);
            tensor2(&c.qw, "test.qweight", EPYQ_DT_I32, 1, 8, c.qwd);
            /* v1 stores zero - 1 = 7 (int32 2004318071), v2 stores 8 */
            c.zpd[0] = v == 1 ? 0x77777777u : 0x88888888u;
            tensor2(&c.zp, "test.qzeros", EPYQ_DT_I32, 1, 1, c.zpd);
            c.l.qzeros = &c.zp;
            check_example(&c);
        }
}
END_TEST

START_TEST(gptq_v1_wraps_whole_word) {
    /* asymmetric zero 0 stored in v1 as nibble 0xF: GPTQModel's +0x11111111 word fix wraps
     * it to 0 and carries into the next nibble (docs/quant-formats.md §4.3). */
    case8 c;
    setup(&c, EPYQ_QF_GPTQ, false);
    memcpy(c.qwd, gptq_row0, sizeof gptq_row0);
    tensor2(&c.qw, "test.qweight", EPYQ_DT_I32, 1, 8, c.qwd);
    c.zpd[0] = 0x7777777Fu;
    tensor2(&c.zp, "test.qzeros", EPYQ_DT_I32, 1, 1, c.zpd);
    c.l.qzeros = &c.zp;
    uint8_t q[64], z[8];
    float s[8];
    bool hp;
    epyq_err err;
    ck_assert_int_eq(epyq_linear_unpack_q4(&c.l, &c.cfg, q, s, z, NULL, &hp, &err), EPYQ_OK);
    ck_assert_int_eq(z[0], 0);
    ck_assert_int_eq(z[1], 9);
    ck_assert_int_eq(z[2], 8);
}
END_TEST

START_TEST(ct_sym) {
    case8 c;
    setup(&c, EPYQ_QF_CT, true);
    memcpy(c.qwd, gptq_row0, sizeof gptq_row0); /* weight_packed[n][0]: same words, [N][K/8] */
    tensor2(&c.qw, "test.weight_packed", EPYQ_DT_I32, 8, 1, c.qwd);
    tensor2(&c.sc, "test.weight_scale", EPYQ_DT_BF16, 8, 1, c.scd);
    check_example(&c);
}
END_TEST

START_TEST(ct_asym_zero_along_dim0) {
    /* zero point packed along N: word (r, g) slot j = z[8r + j] + 8. Zero -1 for every row
     * shifts W by +1. */
    case8 c;
    setup(&c, EPYQ_QF_CT, false);
    memcpy(c.qwd, gptq_row0, sizeof gptq_row0);
    tensor2(&c.qw, "test.weight_packed", EPYQ_DT_I32, 8, 1, c.qwd);
    tensor2(&c.sc, "test.weight_scale", EPYQ_DT_BF16, 8, 1, c.scd);
    c.zpd[0] = 0x77777777u;
    tensor2(&c.zp, "test.weight_zero_point", EPYQ_DT_I32, 1, 1, c.zpd);
    c.l.qzeros = &c.zp;
    float w[64];
    epyq_err err;
    ck_assert_int_eq(epyq_linear_dequant(&c.l, &c.cfg, w, &err), EPYQ_OK);
    for (int n = 0; n < 8; n++)
        for (int k = 0; k < 8; k++) ck_assert_float_eq(w[n * 8 + k], (float)((n + k) % 16 - 8 + 1));
}
END_TEST

START_TEST(awq_and_quark_uint4) {
    for (int quark = 0; quark <= 1; quark++) {
        case8 c;
        setup(&c, quark ? EPYQ_QF_QUARK : EPYQ_QF_AWQ, false);
        c.cfg.quark_signed = false;
        memcpy(c.qwd, awq_words, sizeof awq_words); /* qweight[k][0], k = 0..7 */
        tensor2(&c.qw, "test.qweight", EPYQ_DT_I32, 8, 1, c.qwd);
        c.zpd[0] = 0x88888888u; /* raw zero 8 for all outputs (order-independent) */
        tensor2(&c.zp, "test.qzeros", EPYQ_DT_I32, 1, 1, c.zpd);
        c.l.qzeros = &c.zp;
        check_example(&c);
    }
}
END_TEST

START_TEST(quark_int4_reorder) {
    case8 c;
    setup(&c, EPYQ_QF_QUARK, true);
    memcpy(c.qwd, quark_int4_words, sizeof quark_int4_words);
    tensor2(&c.qw, "test.weight", EPYQ_DT_I32, 8, 1, c.qwd);
    c.zpd[0] = 0; /* weight_zero_point of a symmetric int4 export */
    tensor2(&c.zp, "test.weight_zero_point", EPYQ_DT_I32, 1, 1, c.zpd);
    c.l.qzeros = &c.zp;
    check_example(&c);
    /* identity of §6.3: Quark int4 words XOR 0x88888888 are the AWQ words */
    for (int k = 0; k < 8; k++) ck_assert_uint_eq(quark_int4_words[k] ^ 0x88888888u, awq_words[k]);
}
END_TEST

START_TEST(quark_int4_order) {
    case8 c;
    setup(&c, EPYQ_QF_QUARK, true);
    c.cfg.quark_reorder = false;
    for (int k = 0; k < 8; k++) {
        uint32_t w = 0;
        for (int n = 0; n < 8; n++) w |= (uint32_t)(((n + k) % 16) ^ 8) << (4 * n);
        c.qwd[k] = w;
    }
    ck_assert_uint_eq(c.qwd[0], 0xFEDCBA98u); /* the pinned k = 0 word */
    tensor2(&c.qw, "test.weight", EPYQ_DT_I32, 8, 1, c.qwd);
    check_example(&c);
}
END_TEST

START_TEST(quark_padding_n_below_8) {
    /* N = 3 outputs: one word per input holds 3 codes, the 5 padding slots are 0, and N comes
     * from weight_scale [Gn][3]. */
    case8 c;
    setup(&c, EPYQ_QF_QUARK, true);
    c.l.n_out = 3;
    for (int k = 0; k < 8; k++) {
        uint32_t w = 0;
        for (int n = 0; n < 3; n++) w |= (uint32_t)(((n + k) % 16) ^ 8) << (4 * (n == 0 ? 0 : n == 1 ? 4 : 1));
        c.qwd[k] = w;
    }
    tensor2(&c.qw, "test.weight", EPYQ_DT_I32, 8, 1, c.qwd);
    tensor2(&c.sc, "test.weight_scale", EPYQ_DT_BF16, 1, 3, c.scd);
    float w[24];
    epyq_err err;
    ck_assert_int_eq(epyq_linear_dequant(&c.l, &c.cfg, w, &err), EPYQ_OK);
    for (int n = 0; n < 3; n++)
        for (int k = 0; k < 8; k++) ck_assert_float_eq(w[n * 8 + k], (float)((n + k) % 16 - 8));
}
END_TEST

START_TEST(gidx_gather) {
    /* K = 16, group size 8, g_idx alternating 0,1,0,1,...: column k uses scale of group k % 2.
     * Scales 1 (group 0) and 2 (group 1); codes all 9 (value +1 at z = 8). */
    case8 c;
    setup(&c, EPYQ_QF_GPTQ, true);
    c.l.n_in = 16;
    for (int i = 0; i < 2 * 8; i++) c.qwd[i] = 0x99999999u; /* qweight [2][8] */
    tensor2(&c.qw, "test.qweight", EPYQ_DT_I32, 2, 8, c.qwd);
    for (int n = 0; n < 8; n++) c.scd[n] = 0x3F80, c.scd[8 + n] = 0x4000; /* scales [2][8] */
    tensor2(&c.sc, "test.scales", EPYQ_DT_BF16, 2, 8, c.scd);
    for (int k = 0; k < 16; k++) c.gid[k] = k % 2;
    memset(&c.gi, 0, sizeof c.gi);
    c.gi.name = "test.g_idx";
    c.gi.dtype = EPYQ_DT_I32;
    c.gi.ndim = 1;
    c.gi.shape[0] = 16;
    c.gi.data = c.gid;
    c.l.g_idx = &c.gi;
    float w[128];
    epyq_err err;
    ck_assert_int_eq(epyq_linear_dequant(&c.l, &c.cfg, w, &err), EPYQ_OK);
    for (int n = 0; n < 8; n++)
        for (int k = 0; k < 16; k++) ck_assert_float_eq(w[n * 16 + k], k % 2 ? 2.0f : 1.0f);
    uint8_t q[128], z[16];
    float s[16];
    int32_t perm[16];
    bool hp;
    ck_assert_int_eq(epyq_linear_unpack_q4(&c.l, &c.cfg, q, s, z, perm, &hp, &err), EPYQ_OK);
    ck_assert(hp);
    for (int i = 0; i < 16; i++) ck_assert_int_eq(perm[i], i < 8 ? 2 * i : 2 * (i - 8) + 1);
    /* without a perm buffer the act-order matrix is refused, not silently mis-decoded */
    ck_assert_int_eq(epyq_linear_unpack_q4(&c.l, &c.cfg, q, s, z, NULL, &hp, &err), EPYQ_E_ARG);
    /* an out-of-range group index is a format error naming the tensor */
    c.gid[3] = 2;
    ck_assert_int_eq(epyq_linear_dequant(&c.l, &c.cfg, w, &err), EPYQ_E_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "test.g_idx"));
    /* uneven groups cannot be made contiguous */
    c.gid[3] = 0;
    ck_assert_int_eq(epyq_linear_unpack_q4(&c.l, &c.cfg, q, s, z, perm, &hp, &err), EPYQ_E_QUANT);
}
END_TEST

START_TEST(nonfinite_scale) {
    case8 c;
    setup(&c, EPYQ_QF_CT, true);
    memcpy(c.qwd, gptq_row0, sizeof gptq_row0);
    tensor2(&c.qw, "test.weight_packed", EPYQ_DT_I32, 8, 1, c.qwd);
    c.scd[5] = 0x7FC0; /* NaN */
    tensor2(&c.sc, "test.weight_scale", EPYQ_DT_BF16, 8, 1, c.scd);
    float w[64];
    epyq_err err;
    ck_assert_int_eq(epyq_linear_dequant(&c.l, &c.cfg, w, &err), EPYQ_E_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "test.weight_scale"));
}
END_TEST

int main(void) {
    Suite *s = suite_create("load_quant");
    TCase *tc = epyq_test_case(s, "decode", 0);
    EPYQ_TESTS_ADD(tc, gptq_v1_v2, gptq_v1_wraps_whole_word, ct_sym, ct_asym_zero_along_dim0,
                   awq_and_quark_uint4, quark_int4_reorder, quark_int4_order,
                   quark_padding_n_below_8, gidx_gather, nonfinite_scale);
    return epyq_test_run(s);
}
