/* src/synth/draw.c — model shapes and the values synth draws for every logical tensor.
 *
 * Scales follow the tiny fixture's recipe (../shared/fixtures/models/README.md "What the weights
 * were scaled for"): linears N(0, c/sqrt(fan_in)) with c = 1 except lm_head 3 (logits std ~3),
 * o_proj 2, out_proj 0.9, router 1.5, in_proj_a 0.6; embeddings 1.5; zero-centred norms 0.1;
 * gated norm 1 + 0.1 N; A_log = log U(1, 8); dt_bias = softplus^-1 of dt log-uniform in
 * [0.01, 0.1] — which gives residual RMS ~2, GDN decay ~0.8 and spread router/gate sigmoids. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/util.h"
#include "kernels-x86/kern.h"
#include "synth/synth_int.h"

static const char *const format_names[EPYQ_SYNTH_NFORMATS] = {"bf16", "gptq", "ct", "quark", "awq"};

const char *epyq_synth_format_name(epyq_synth_format f) {
    return (unsigned)f < EPYQ_SYNTH_NFORMATS ? format_names[f] : "?";
}

int epyq_synth_format_parse(const char *s) {
    for (int i = 0; i < EPYQ_SYNTH_NFORMATS; i++)
        if (!strcmp(s, format_names[i])) return i;
    if (!strcmp(s, "compressed-tensors")) return EPYQ_SYNTH_CT;
    return -1;
}

size_t epyq_synth_dtype_size(synth_dtype t) {
    static const size_t sz[] = {8, 4, 4, 2, 2};
    return sz[t];
}

const char *epyq_synth_dtype_name(synth_dtype t) {
    static const char *const nm[] = {"I64", "I32", "F32", "BF16", "F16"};
    return nm[t];
}

epyq_status epyq_synth_dims_init(epyq_synth_dims *d, const char *shape, int32_t layers,
                                 int32_t experts, int32_t vocab, epyq_err *err) {
    memset(d, 0, sizeof *d);
    if (!strcmp(shape, "tiny")) {
        /* = ../shared/fixtures/models/tiny-* text_config */
        *d = (epyq_synth_dims){.hidden = 256, .vocab = 1024, .layers = 4, .n_q_heads = 4,
                               .n_kv_heads = 2, .head_dim = 64, .lin_k_heads = 2, .lin_v_heads = 4,
                               .lin_k_dim = 64, .lin_v_dim = 64, .conv_kernel = 4, .experts = 16,
                               .top_k = 8, .moe_inter = 128, .shared_inter = 128, .mtp_layers = 1,
                               .max_pos = 4096, .mrope = {3, 3, 2}, .tiny = true,
                               .vis_depth = 2, .vis_hidden = 32, .vis_inter = 64, .vis_heads = 2,
                               .vis_pos = 16};
    } else if (!strcmp(shape, "35b-a3b")) {
        /* = docs/architecture.md §2.1 */
        *d = (epyq_synth_dims){.hidden = 2048,
                               .vocab = 248320,
                               .layers = 40,
                               .n_q_heads = 16,
                               .n_kv_heads = 2,
                               .head_dim = 256,
                               .lin_k_heads = 16,
                               .lin_v_heads = 32,
                               .lin_k_dim = 128,
                               .lin_v_dim = 128,
                               .conv_kernel = 4,
                               .experts = 256,
                               .top_k = 8,
                               .moe_inter = 512,
                               .shared_inter = 512,
                               .mtp_layers = 1,
                               .max_pos = 262144,
                               .mrope = {11, 11, 10},
                               .vis_cfg_depth = 27,
                               .vis_cfg_hidden = 1152,
                               .vis_cfg_inter = 4304,
                               .vis_cfg_heads = 16,
                               .vis_cfg_pos = 2304};
    } else {
        return epyq_err_set(err, EPYQ_E_ARG, "unknown shape '%s' (expected tiny or 35b-a3b)", shape);
    }
    if (d->tiny) {
        d->vis_cfg_depth = d->vis_depth, d->vis_cfg_hidden = d->vis_hidden;
        d->vis_cfg_inter = d->vis_inter, d->vis_cfg_heads = d->vis_heads, d->vis_cfg_pos = d->vis_pos;
    } else {
        /* 35b-a3b: the tower's tensors in BF16, as every release keeps them (docs/vision.md §5) */
        d->vis_depth = d->vis_cfg_depth, d->vis_hidden = d->vis_cfg_hidden,
        d->vis_inter = d->vis_cfg_inter;
        d->vis_heads = d->vis_cfg_heads, d->vis_pos = d->vis_cfg_pos;
    }
    if (layers > 0) {
        if (layers > 512) return epyq_err_set(err, EPYQ_E_ARG, "--layers %d: at most 512", layers);
        d->layers = layers;
    }
    if (experts > 0) {
        if (experts < d->top_k || experts > 4096)
            return epyq_err_set(err, EPYQ_E_ARG, "--experts %d: need %d..4096 (top-k is %d)", experts,
                                d->top_k, d->top_k);
        d->experts = experts;
    }
    if (vocab > 0) {
        /* room for the 256 byte tokens, some merges and the 24 special ids the model uses */
        if (vocab < 512 || vocab > 1 << 20)
            return epyq_err_set(err, EPYQ_E_ARG, "--vocab %d: need 512..1048576", vocab);
        d->vocab = vocab;
    }
    /* The real ids (248044..) when they fit, else the fixtures' convention: same offsets from
     * vocab - 24 (tiny: 1000), so <|im_end|> etc. are rows of the embedding. */
    d->special_base = d->vocab >= 248070 ? 248044 : d->vocab - 24;
    return EPYQ_OK;
}

uint64_t epyq_synth_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the name, then mixed with the seed */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return synth_mix64(h ^ synth_mix64(seed + 0x9E3779B97F4A7C15ull));
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !memcmp(s + a - b, suf, b);
}

/* fan-in of a linear named `mod` (module name without ".weight"); 0 if not a known linear */
static int32_t linear_fan_in(const epyq_synth_dims *d, const char *mod) {
    if (ends_with(mod, "self_attn.o_proj")) return d->n_q_heads * d->head_dim;
    if (ends_with(mod, "linear_attn.out_proj")) return d->lin_v_heads * d->lin_v_dim;
    if (ends_with(mod, "shared_expert.down_proj")) return d->shared_inter;
    if (ends_with(mod, "down_proj")) return d->moe_inter;
    if (!strcmp(mod, "mtp.fc")) return 2 * d->hidden;
    static const char *const from_h[] = {"q_proj", "k_proj", "v_proj", "in_proj_qkv", "in_proj_z",
                                         "in_proj_a", "in_proj_b", "gate_proj", "up_proj",
                                         "mlp.gate", "shared_expert_gate", "lm_head"};
    for (size_t i = 0; i < sizeof from_h / sizeof from_h[0]; i++)
        if (ends_with(mod, from_h[i])) return d->hidden;
    return 0;
}

epyq_status epyq_synth_rule_for(const epyq_synth_dims *d, uint64_t seed, const char *name,
                                synth_rule *r, epyq_err *err) {
    r->key = epyq_synth_key(seed, name);
    r->kind = RULE_NORMAL;
    if (!strncmp(name, "model.visual.", 13)) {
        /* vision tower: never used by the text model; ViT-style 0.02 init, LayerNorm ~1 */
        bool ln_w = ends_with(name, ".weight") && (strstr(name, ".norm1.") || strstr(name, ".norm2.") ||
                                                   strstr(name, "merger.norm."));
        r->kind = ln_w ? RULE_ONE_PLUS_NORMAL : RULE_NORMAL;
        r->sigma = 0.02f;
        return EPYQ_OK;
    }
    if (ends_with(name, "embed_tokens.weight")) return r->sigma = 1.5f, EPYQ_OK;
    if (ends_with(name, ".A_log")) return r->kind = RULE_A_LOG, r->sigma = 0, EPYQ_OK;
    if (ends_with(name, ".dt_bias")) return r->kind = RULE_DT_BIAS, r->sigma = 0, EPYQ_OK;
    if (ends_with(name, "conv1d.weight")) return r->sigma = 1.0f / sqrtf((float)d->conv_kernel), EPYQ_OK;
    if (ends_with(name, "linear_attn.norm.weight")) return r->kind = RULE_ONE_PLUS_NORMAL, r->sigma = 0.1f, EPYQ_OK;
    if (ends_with(name, "norm.weight") || ends_with(name, "layernorm.weight") ||
        ends_with(name, "pre_fc_norm_embedding.weight") || ends_with(name, "pre_fc_norm_hidden.weight"))
        return r->sigma = 0.1f, EPYQ_OK; /* zero-centred RMSNorm: scale is 1 + w */
    if (!ends_with(name, ".weight"))
        return epyq_err_set(err, EPYQ_E_ARG, "synth: no init rule for tensor '%s'", name);
    char mod[256];
    size_t ml = strlen(name) - 7;
    if (ml >= sizeof mod) return epyq_err_set(err, EPYQ_E_ARG, "synth: tensor name too long '%s'", name);
    memcpy(mod, name, ml);
    mod[ml] = '\0';
    int32_t fan = linear_fan_in(d, mod);
    if (!fan) return epyq_err_set(err, EPYQ_E_ARG, "synth: no init rule for tensor '%s'", name);
    float c = 1.0f;
    if (ends_with(mod, "lm_head")) c = 3.0f;
    else if (ends_with(mod, "self_attn.o_proj")) c = 2.0f;
    else if (ends_with(mod, "linear_attn.out_proj")) c = 0.9f;
    else if (ends_with(mod, "mlp.gate")) c = 1.5f;
    else if (ends_with(mod, "in_proj_a")) c = 0.6f;
    r->sigma = c / sqrtf((float)fan);
    return EPYQ_OK;
}

void epyq_synth_fill(const synth_rule *r, uint64_t first, size_t n, float *out) {
    const uint64_t key = r->key;
    switch (r->kind) { /* normals: the table's fill_normal, whose every table gives the same bits */
    case RULE_NORMAL: epyq_kern()->fill_normal(key, 0.0f, r->sigma, first, n, out); break;
    case RULE_ONE_PLUS_NORMAL: epyq_kern()->fill_normal(key, 1.0f, r->sigma, first, n, out); break;
    case RULE_A_LOG: /* A = -exp(A_log) in the recurrence; A in [1, 8) */
        for (size_t i = 0; i < n; i++)
            out[i] = synth_round_bf16(logf(1.0f + 7.0f * synth_uniform(epyq_rng_bits(key, first + i))));
        break;
    case RULE_DT_BIAS: /* inverse softplus of dt, dt log-uniform in [0.01, 0.1] (Mamba-style init) */
        for (size_t i = 0; i < n; i++) {
            double u = synth_uniform(epyq_rng_bits(key, first + i));
            double dt = exp(log(0.01) + u * (log(0.1) - log(0.01)));
            out[i] = synth_round_bf16((float)(dt + log(-expm1(-dt))));
        }
        break;
    }
}

void epyq_synth_fill_bf16(const synth_rule *r, uint64_t first, size_t n, uint16_t *out) {
    float tmp[1024];
    while (n) {
        size_t m = n < 1024 ? n : 1024;
        epyq_synth_fill(r, first, m, tmp);
        for (size_t i = 0; i < m; i++) { /* already rounded: the upper half is the bf16 */
            union { float f; uint32_t u; } v = {.f = tmp[i]};
            out[i] = (uint16_t)(v.u >> 16);
        }
        first += m, out += m, n -= m;
    }
}

epyq_status epyq_synth_draw(const epyq_synth_dims *d, uint64_t seed, const char *name,
                            uint64_t first, size_t n, float *out, epyq_err *err) {
    synth_rule r;
    epyq_status st = epyq_synth_rule_for(d, seed, name, &r, err);
    if (st) return st;
    epyq_synth_fill(&r, first, n, out);
    return EPYQ_OK;
}
