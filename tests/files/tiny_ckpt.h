/* tests/files/tiny_ckpt.h — test-only writer of small, complete checkpoint folders in every
 * supported on-disk format, so loader tests run without ../shared and can corrupt any part.
 *
 * The packing here is written directly from docs/quant-formats.md (independently of
 * src/load/q4_decode.c), and every int4 linear stores codes, zeros and scales drawn from
 * closed-form patterns (tc_code/tc_zero/tc_scale), so a test can compute the expected
 * dequantized weight without calling the code under test. Header-only, static functions. */
#ifndef EPYQ_TESTS_TINY_CKPT_H
#define EPYQ_TESTS_TINY_CKPT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "load/model_config.h"
#include "load/safetensors.h"
#include "tests/testutil.h"

/* Model dimensions: 2 layers (DeltaNet, full attention), every in_features = 128. */
enum {
    TC_H = 128, TC_V = 32, TC_HD = 64, TC_NQ = 2, TC_NKV = 1, TC_HK = 1, TC_HV = 2, TC_DK = 64, TC_DV = 64,
    TC_E = 4, TC_TOPK = 2, TC_I = 128, TC_IS = 128, TC_LAYERS = 2, TC_CONV = 2 * TC_HK * TC_DK + TC_HV * TC_DV
};

typedef struct {
    char name[192];
    epyq_dtype dt;
    int nd;
    int64_t shape[4];
    uint8_t *data;
    size_t nbytes;
} tc_tensor;

typedef struct {
    tc_tensor *t;
    size_t n, cap;
} tc_list;

typedef struct {
    epyq_qformat fmt;
    bool sym;            /* false: asymmetric zeros (GPTQ, CT, Quark uint4; AWQ is always asym) */
    int gptq_version;    /* 1 or 2 */
    bool quark_reorder;  /* pack_method reorder (AWQ order) vs order */
    int gs;              /* group size (default 128) */
    bool act_order;      /* GPTQ g_idx / CT weight_g_idx = k % Gn (needs gs < 128) */
    bool fused_experts;  /* BF16 only: 3-D experts.gate_up_proj / down_proj */
    bool text_only;      /* prefix "model." and no text_config */
    bool tie;            /* no lm_head.weight, tie_word_embeddings true */
    int nshards;         /* 1: model.safetensors; >= 2: shards + index */
} tc_opts;

/* Closed-form content of int4 linears: unsigned code, unsigned zero, scale. */
static inline int tc_code(int64_t n, int64_t k) { return (int)((n * 7 + k * 3 + 1) % 16); }
static inline int tc_zero(const tc_opts *o, int64_t n, int64_t g) { return o->sym ? 8 : (int)((n * 5 + g * 3 + 2) % 16); }
static inline float tc_scale(int64_t n, int64_t g) { return (float)(1 + (n + g) % 4) / 8.0f; }
static inline int64_t tc_group(const tc_opts *o, int64_t k) {
    int64_t gn = 128 / o->gs;
    return o->act_order ? k % gn : k / o->gs;
}
/* Dense weights: small exact bf16 values. */
static inline float tc_dense(int64_t i) { return (float)((int)(i % 13) - 6) / 16.0f; }

static inline tc_tensor *tc_add(tc_list *l, const char *name, epyq_dtype dt, int nd, int64_t d0, int64_t d1, int64_t d2) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->t = realloc(l->t, l->cap * sizeof *l->t);
    }
    tc_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dt = dt;
    t->nd = nd;
    int64_t d[3] = {d0, d1, d2}, cnt = 1;
    for (int i = 0; i < nd; i++) t->shape[i] = d[i], cnt *= d[i];
    t->nbytes = (size_t)cnt * epyq_dtype_size(dt);
    t->data = calloc(1, t->nbytes ? t->nbytes : 1);
    return t;
}

static inline void tc_free(tc_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->t[i].data);
    free(l->t);
    memset(l, 0, sizeof *l);
}

static inline tc_tensor *tc_find(tc_list *l, const char *name) {
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].name, name)) return &l->t[i];
    return NULL;
}

static inline void tc_remove(tc_list *l, const char *name) {
    tc_tensor *t = tc_find(l, name);
    if (!t) return;
    free(t->data);
    *t = l->t[--l->n];
}

static inline void tc_put16(tc_tensor *t, size_t i, float v) {
    uint16_t h = t->dt == EPYQ_DT_F16 ? epyq_f32_to_f16(v) : epyq_f32_to_bf16(v);
    memcpy(t->data + 2 * i, &h, 2);
}

static inline void tc_or_nibble(tc_tensor *t, size_t word, int slot, int nib) {
    uint32_t w;
    memcpy(&w, t->data + 4 * word, 4);
    w |= (uint32_t)(nib & 15) << (4 * slot);
    memcpy(t->data + 4 * word, &w, 4);
}

static inline void tc_dense_linear(tc_list *l, const char *mod, int64_t N, int64_t K) {
    char nm[192];
    snprintf(nm, sizeof nm, "%s.weight", mod);
    tc_tensor *t = tc_add(l, nm, EPYQ_DT_BF16, 2, N, K, 0);
    for (int64_t i = 0; i < N * K; i++) tc_put16(t, (size_t)i, tc_dense(i));
}

static const int tc_awq_slot[8] = {0, 4, 1, 5, 2, 6, 3, 7}; /* slot of element j */

static inline void tc_q4_linear(tc_list *l, const tc_opts *o, const char *mod, int64_t N, int64_t K) {
    char nm[192];
    int64_t gs = o->gs, Gn = K / gs;
    if (o->fmt == EPYQ_QF_GPTQ || o->fmt == EPYQ_QF_AWQ) {
        bool awq = o->fmt == EPYQ_QF_AWQ;
        snprintf(nm, sizeof nm, "%s.qweight", mod);
        tc_tensor *q = awq ? tc_add(l, nm, EPYQ_DT_I32, 2, K, N / 8, 0) : tc_add(l, nm, EPYQ_DT_I32, 2, K / 8, N, 0);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                if (awq) tc_or_nibble(q, (size_t)(k * (N / 8) + n / 8), tc_awq_slot[n % 8], tc_code(n, k));
                else tc_or_nibble(q, (size_t)((k / 8) * N + n), (int)(k % 8), tc_code(n, k));
            }
        snprintf(nm, sizeof nm, "%s.qzeros", mod);
        tc_tensor *z = tc_add(l, nm, EPYQ_DT_I32, 2, Gn, N / 8, 0);
        for (int64_t g = 0; g < Gn; g++)
            for (int64_t n = 0; n < N; n++)
                tc_or_nibble(z, (size_t)(g * (N / 8) + n / 8), awq ? tc_awq_slot[n % 8] : (int)(n % 8), tc_zero(o, n, g));
        if (!awq && o->gptq_version == 1) /* v1 = GPTQModel's whole-word subtraction of 0x11111111 */
            for (int64_t i = 0; i < Gn * (N / 8); i++) {
                uint32_t w;
                memcpy(&w, z->data + 4 * i, 4);
                w -= 0x11111111u;
                memcpy(z->data + 4 * i, &w, 4);
            }
        snprintf(nm, sizeof nm, "%s.scales", mod);
        tc_tensor *s = tc_add(l, nm, EPYQ_DT_F16, 2, Gn, N, 0);
        for (int64_t g = 0; g < Gn; g++)
            for (int64_t n = 0; n < N; n++) tc_put16(s, (size_t)(g * N + n), tc_scale(n, g));
        if (!awq) {
            snprintf(nm, sizeof nm, "%s.g_idx", mod);
            tc_tensor *gi = tc_add(l, nm, EPYQ_DT_I32, 1, K, 0, 0);
            for (int64_t k = 0; k < K; k++) {
                int32_t v = (int32_t)tc_group(o, k);
                memcpy(gi->data + 4 * k, &v, 4);
            }
        }
    } else if (o->fmt == EPYQ_QF_CT) {
        snprintf(nm, sizeof nm, "%s.weight_packed", mod);
        tc_tensor *q = tc_add(l, nm, EPYQ_DT_I32, 2, N, K / 8, 0);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) tc_or_nibble(q, (size_t)(n * (K / 8) + k / 8), (int)(k % 8), tc_code(n, k));
        snprintf(nm, sizeof nm, "%s.weight_scale", mod);
        tc_tensor *s = tc_add(l, nm, EPYQ_DT_BF16, 2, N, Gn, 0);
        for (int64_t n = 0; n < N; n++)
            for (int64_t g = 0; g < Gn; g++) tc_put16(s, (size_t)(n * Gn + g), tc_scale(n, g));
        snprintf(nm, sizeof nm, "%s.weight_shape", mod);
        tc_tensor *ws = tc_add(l, nm, EPYQ_DT_I64, 1, 2, 0, 0);
        int64_t shp[2] = {N, K};
        memcpy(ws->data, shp, 16);
        if (!o->sym) {
            snprintf(nm, sizeof nm, "%s.weight_zero_point", mod);
            tc_tensor *z = tc_add(l, nm, EPYQ_DT_I32, 2, (N + 7) / 8, Gn, 0);
            for (int64_t n = 0; n < N; n++)
                for (int64_t g = 0; g < Gn; g++) tc_or_nibble(z, (size_t)((n / 8) * Gn + g), (int)(n % 8), tc_zero(o, n, g));
        }
        if (o->act_order) {
            snprintf(nm, sizeof nm, "%s.weight_g_idx", mod);
            tc_tensor *gi = tc_add(l, nm, EPYQ_DT_I32, 1, K, 0, 0);
            for (int64_t k = 0; k < K; k++) {
                int32_t v = (int32_t)tc_group(o, k);
                memcpy(gi->data + 4 * k, &v, 4);
            }
        }
    } else { /* Quark: int4 two's complement when symmetric, uint4 otherwise */
        bool sgn = o->sym;
        int64_t W = (N + 7) / 8;
        snprintf(nm, sizeof nm, "%s.weight", mod);
        tc_tensor *q = tc_add(l, nm, EPYQ_DT_I32, 2, K, W, 0);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++)
                tc_or_nibble(q, (size_t)(k * W + n / 8), o->quark_reorder ? tc_awq_slot[n % 8] : (int)(n % 8),
                             sgn ? tc_code(n, k) ^ 8 : tc_code(n, k));
        snprintf(nm, sizeof nm, "%s.weight_scale", mod);
        tc_tensor *s = tc_add(l, nm, EPYQ_DT_BF16, 2, Gn, N, 0);
        for (int64_t g = 0; g < Gn; g++)
            for (int64_t n = 0; n < N; n++) tc_put16(s, (size_t)(g * N + n), tc_scale(n, g));
        snprintf(nm, sizeof nm, "%s.weight_zero_point", mod);
        tc_tensor *z = tc_add(l, nm, EPYQ_DT_I32, 2, Gn, W, 0);
        for (int64_t g = 0; g < Gn; g++)
            for (int64_t n = 0; n < N; n++)
                tc_or_nibble(z, (size_t)(g * W + n / 8), o->quark_reorder ? tc_awq_slot[n % 8] : (int)(n % 8),
                             sgn ? tc_zero(o, n, g) ^ 8 : tc_zero(o, n, g));
    }
}

/* Which linears a format quantizes here (mirrors the fixtures: GPTQ/AWQ experts only; CT all
 * but router, shared_expert_gate and lm_head; Quark experts and mixer projections). */
static inline bool tc_quantized(const tc_opts *o, const char *mod) {
    switch (o->fmt) {
    case EPYQ_QF_NONE: return false;
    case EPYQ_QF_GPTQ:
    case EPYQ_QF_AWQ: return strstr(mod, ".experts.") != NULL;
    case EPYQ_QF_CT:
        return !strstr(mod, "mlp.gate") && !strstr(mod, "shared_expert_gate") && strcmp(mod, "lm_head");
    case EPYQ_QF_QUARK: return strstr(mod, ".experts.") || strstr(mod, "_attn.");
    }
    return false;
}

static inline void tc_linear(tc_list *l, const tc_opts *o, const char *mod, int64_t N, int64_t K) {
    if (tc_quantized(o, mod)) tc_q4_linear(l, o, mod, N, K);
    else tc_dense_linear(l, mod, N, K);
}

static inline void tc_vec(tc_list *l, const char *name, int nd, int64_t d0, int64_t d1, int64_t d2) {
    tc_tensor *t = tc_add(l, name, EPYQ_DT_BF16, nd, d0, d1, d2);
    for (size_t i = 0; i < t->nbytes / 2; i++) tc_put16(t, i, 0.5f);
}

/* The tensors of the whole tiny model in the format of o. */
static inline void tc_model(tc_list *l, const tc_opts *o) {
    const char *P = o->text_only ? "model." : "model.language_model.";
    char p[160], m[192];
    snprintf(m, sizeof m, "%sembed_tokens.weight", P);
    tc_vec(l, m, 2, TC_V, TC_H, 0);
    snprintf(m, sizeof m, "%snorm.weight", P);
    tc_vec(l, m, 1, TC_H, 0, 0);
    if (!o->tie) tc_linear(l, o, "lm_head", TC_V, TC_H);
    for (int L = 0; L < TC_LAYERS; L++) {
        snprintf(p, sizeof p, "%slayers.%d.", P, L);
        snprintf(m, sizeof m, "%sinput_layernorm.weight", p);
        tc_vec(l, m, 1, TC_H, 0, 0);
        snprintf(m, sizeof m, "%spost_attention_layernorm.weight", p);
        tc_vec(l, m, 1, TC_H, 0, 0);
        if (L == 1) {
            const char *nm[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
            int64_t N[4] = {TC_NQ * TC_HD * 2, TC_NKV * TC_HD, TC_NKV * TC_HD, TC_H};
            int64_t K[4] = {TC_H, TC_H, TC_H, TC_NQ * TC_HD};
            for (int i = 0; i < 4; i++) {
                snprintf(m, sizeof m, "%sself_attn.%s", p, nm[i]);
                tc_linear(l, o, m, N[i], K[i]);
            }
            snprintf(m, sizeof m, "%sself_attn.q_norm.weight", p);
            tc_vec(l, m, 1, TC_HD, 0, 0);
            snprintf(m, sizeof m, "%sself_attn.k_norm.weight", p);
            tc_vec(l, m, 1, TC_HD, 0, 0);
        } else {
            const char *nm[5] = {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"};
            int64_t N[5] = {TC_CONV, TC_HV * TC_DV, TC_HV, TC_HV, TC_H};
            int64_t K[5] = {TC_H, TC_H, TC_H, TC_H, TC_HV * TC_DV};
            for (int i = 0; i < 5; i++) {
                snprintf(m, sizeof m, "%slinear_attn.%s", p, nm[i]);
                /* GPTQ/AWQ cannot pack N = 2 outputs; they never quantize in_proj_a/b anyway */
                tc_linear(l, o, m, N[i], K[i]);
            }
            snprintf(m, sizeof m, "%slinear_attn.conv1d.weight", p);
            tc_vec(l, m, 3, TC_CONV, 1, 4);
            snprintf(m, sizeof m, "%slinear_attn.dt_bias", p);
            tc_vec(l, m, 1, TC_HV, 0, 0);
            snprintf(m, sizeof m, "%slinear_attn.A_log", p);
            tc_vec(l, m, 1, TC_HV, 0, 0);
            snprintf(m, sizeof m, "%slinear_attn.norm.weight", p);
            tc_vec(l, m, 1, TC_DV, 0, 0);
        }
        snprintf(m, sizeof m, "%smlp.gate", p);
        tc_linear(l, o, m, TC_E, TC_H);
        if (o->fused_experts) {
            snprintf(m, sizeof m, "%smlp.experts.gate_up_proj", p);
            tc_vec(l, m, 3, TC_E, 2 * TC_I, TC_H);
            snprintf(m, sizeof m, "%smlp.experts.down_proj", p);
            tc_vec(l, m, 3, TC_E, TC_H, TC_I);
        } else {
            for (int e = 0; e < TC_E; e++) {
                snprintf(m, sizeof m, "%smlp.experts.%d.gate_proj", p, e);
                tc_linear(l, o, m, TC_I, TC_H);
                snprintf(m, sizeof m, "%smlp.experts.%d.up_proj", p, e);
                tc_linear(l, o, m, TC_I, TC_H);
                snprintf(m, sizeof m, "%smlp.experts.%d.down_proj", p, e);
                tc_linear(l, o, m, TC_H, TC_I);
            }
        }
        snprintf(m, sizeof m, "%smlp.shared_expert.gate_proj", p);
        tc_linear(l, o, m, TC_IS, TC_H);
        snprintf(m, sizeof m, "%smlp.shared_expert.up_proj", p);
        tc_linear(l, o, m, TC_IS, TC_H);
        snprintf(m, sizeof m, "%smlp.shared_expert.down_proj", p);
        tc_linear(l, o, m, TC_H, TC_IS);
        snprintf(m, sizeof m, "%smlp.shared_expert_gate", p);
        tc_linear(l, o, m, 1, TC_H);
    }
}

/* config.json text for o (quantization_config per format). Caller frees. */
static inline char *tc_config(const tc_opts *o) {
    char q[1024] = "";
    switch (o->fmt) {
    case EPYQ_QF_NONE: break;
    case EPYQ_QF_GPTQ:
        snprintf(q, sizeof q,
                 "\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": %d, \"sym\": %s,"
                 " \"desc_act\": %s, \"checkpoint_format\": \"%s\", \"pack_dtype\": \"int32\","
                 " \"dynamic\": {\"-:.*attn.*\": {}, \"-:.*shared_expert.*\": {}}},",
                 o->gs, o->sym ? "true" : "false", o->act_order ? "true" : "false", o->gptq_version == 2 ? "gptq_v2" : "gptq");
        break;
    case EPYQ_QF_CT:
        snprintf(q, sizeof q,
                 "\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\","
                 " \"quantization_status\": \"compressed\", \"config_groups\": {\"group_0\": {\"format\": \"pack-quantized\","
                 " \"targets\": [\"Linear\"], \"input_activations\": null, \"weights\": {\"num_bits\": 4, \"type\": \"int\","
                 " \"strategy\": \"group\", \"group_size\": %d, \"symmetric\": %s, \"actorder\": %s, \"dynamic\": false}}},"
                 " \"ignore\": [\"lm_head\", \"re:.*mlp\\\\.gate$\", \"re:.*shared_expert_gate$\"]},",
                 o->gs, o->sym ? "true" : "false", o->act_order ? "\"group\"" : "\"static\"");
        break;
    case EPYQ_QF_QUARK:
        snprintf(q, sizeof q,
                 "\"quantization_config\": {\"quant_method\": \"quark\", \"export\": {\"weight_format\": \"real_quantized\","
                 " \"pack_method\": \"%s\"}, \"global_quant_config\": {\"weight\": {\"dtype\": \"%s\", \"qscheme\": \"per_group\","
                 " \"ch_axis\": -1, \"group_size\": %d, \"symmetric\": %s, \"is_dynamic\": false}, \"input_tensors\": null},"
                 " \"layer_quant_config\": {}, \"exclude\": [\"lm_head\", \"re:.*mlp\\\\.gate$\", \"*shared_expert*\"]},",
                 o->quark_reorder ? "reorder" : "order", o->sym ? "int4" : "uint4", o->gs, o->sym ? "true" : "false");
        break;
    case EPYQ_QF_AWQ:
        snprintf(q, sizeof q,
                 "\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": %d, \"zero_point\": true,"
                 " \"version\": \"gemm\", \"modules_to_not_convert\": [\"attn\", \"shared_expert\", \"mlp.gate\"]},",
                 o->gs);
        break;
    }
    char text[1024];
    snprintf(text, sizeof text,
             "\"model_type\": \"qwen3_5_moe_text\", \"vocab_size\": %d, \"hidden_size\": %d, \"num_hidden_layers\": %d,"
             " \"layer_types\": [\"linear_attention\", \"full_attention\"], \"num_attention_heads\": %d,"
             " \"num_key_value_heads\": %d, \"head_dim\": %d, \"linear_key_head_dim\": %d, \"linear_value_head_dim\": %d,"
             " \"linear_num_key_heads\": %d, \"linear_num_value_heads\": %d, \"linear_conv_kernel_dim\": 4,"
             " \"num_experts\": %d, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d,"
             " \"shared_expert_intermediate_size\": %d, \"mtp_num_hidden_layers\": 0, \"tie_word_embeddings\": %s,"
             " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25,"
             " \"mrope_section\": [3, 3, 2]}, \"eos_token_id\": 30",
             TC_V, TC_H, TC_LAYERS, TC_NQ, TC_NKV, TC_HD, TC_DK, TC_DV, TC_HK, TC_HV, TC_E, TC_TOPK, TC_I, TC_IS,
             o->tie ? "true" : "false");
    size_t n = strlen(q) + strlen(text) + 256;
    char *s = malloc(n);
    if (o->text_only) snprintf(s, n, "{%s \"architectures\": [\"Qwen3_5MoeForCausalLM\"], %s}", q, text);
    else snprintf(s, n, "{%s \"model_type\": \"qwen3_5_moe\", \"text_config\": {%s}}", q, text);
    return s;
}

/* One safetensors file of tensors t[i] for i % nshards == shard (all when nshards <= 1). */
static inline int tc_write_shard(const char *path, const tc_list *l, int shard, int nshards) {
    size_t cap = 4096 + l->n * 320, hl = 0;
    char *h = malloc(cap);
    uint64_t off = 0;
    hl += (size_t)snprintf(h + hl, cap - hl, "{\"__metadata__\": {\"format\": \"pt\"}");
    for (size_t i = 0; i < l->n; i++) {
        if (nshards > 1 && (int)(i % (size_t)nshards) != shard) continue;
        const tc_tensor *t = &l->t[i];
        hl += (size_t)snprintf(h + hl, cap - hl, ", \"%s\": {\"dtype\": \"%s\", \"shape\": [", t->name, epyq_dtype_name(t->dt));
        for (int d = 0; d < t->nd; d++) hl += (size_t)snprintf(h + hl, cap - hl, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        hl += (size_t)snprintf(h + hl, cap - hl, "], \"data_offsets\": [%llu, %llu]}", (unsigned long long)off,
                               (unsigned long long)(off + t->nbytes));
        off += t->nbytes;
    }
    hl += (size_t)snprintf(h + hl, cap - hl, "}");
    while (hl % 8) h[hl++] = ' '; /* writers pad the header to 8 bytes with spaces */
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(h);
        return -1;
    }
    uint64_t n = hl;
    fwrite(&n, 8, 1, f);
    fwrite(h, 1, hl, f);
    for (size_t i = 0; i < l->n; i++)
        if (nshards <= 1 || (int)(i % (size_t)nshards) == shard) fwrite(l->t[i].data, 1, l->t[i].nbytes, f);
    fclose(f);
    free(h);
    return 0;
}

static inline void tc_shard_name(char *buf, size_t n, int i, int nshards) {
    snprintf(buf, n, "model-%05d-of-%05d.safetensors", i + 1, nshards);
}

/* model.safetensors.index.json text for l split over nshards. Caller frees. */
static inline char *tc_index(const tc_list *l, int nshards) {
    size_t cap = 256 + l->n * 260, o = 0;
    char *s = malloc(cap), sh[64];
    o += (size_t)snprintf(s + o, cap - o, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (size_t i = 0; i < l->n; i++) {
        tc_shard_name(sh, sizeof sh, (int)(i % (size_t)nshards), nshards);
        o += (size_t)snprintf(s + o, cap - o, "%s\"%s\": \"%s\"", i ? ", " : "", l->t[i].name, sh);
    }
    snprintf(s + o, cap - o, "}}");
    return s;
}

static inline int tc_write_text(const char *dir, const char *name, const char *text) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) return -1;
    fputs(text, f);
    fclose(f);
    return 0;
}

/* Write config.json + shards (+ index) of l into dir. */
static inline int tc_write(const char *dir, const tc_list *l, const tc_opts *o) {
    char *cfg = tc_config(o), p[4096], sh[64];
    int rc = tc_write_text(dir, "config.json", cfg);
    free(cfg);
    if (o->nshards <= 1) {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        return rc | tc_write_shard(p, l, 0, 1);
    }
    for (int i = 0; i < o->nshards; i++) {
        tc_shard_name(sh, sizeof sh, i, o->nshards);
        snprintf(p, sizeof p, "%s/%s", dir, sh);
        rc |= tc_write_shard(p, l, i, o->nshards);
    }
    char *ix = tc_index(l, o->nshards);
    rc |= tc_write_text(dir, "model.safetensors.index.json", ix);
    free(ix);
    return rc;
}

/* The model of o, changed by mutate(l, ctx) when mutate is non-NULL, written into a fresh
 * temporary folder (epyq_test_tmpdir): its path (malloc'd), or NULL when it could not be written.
 */
static inline char *tc_write_tmp(const tc_opts *o, void (*mutate)(tc_list *, void *), void *ctx) {
    char *dir = epyq_test_tmpdir();
    if (!dir) return NULL;
    tc_list l = {0};
    tc_model(&l, o);
    if (mutate) mutate(&l, ctx);
    int rc = tc_write(dir, &l, o);
    tc_free(&l);
    if (rc) free(dir);
    return rc ? NULL : dir;
}

static inline tc_opts tc_defaults(epyq_qformat fmt) {
    tc_opts o = {.fmt = fmt, .sym = fmt != EPYQ_QF_AWQ, .gptq_version = 1, .quark_reorder = true, .gs = 128, .nshards = 2};
    return o;
}

#endif
