/* src/load/model_config.h — config.json / generation_config.json / quantization_config.
 *
 * Promise: epyq_config_load() reads the folder's config.json (top level and text_config),
 * generation_config.json (optional) and the quantisation block (quantization_config in
 * config.json, or quantize_config.json / quant_config.json beside it), validates every value
 * the runtime uses (positive, consistent: e.g. hidden = heads*head_dim is NOT required, but
 * layer_types length == num_hidden_layers), and detects the weight format. Any quantisation
 * scheme outside what the kernels implement is refused with EPYQ_E_QUANT naming the method,
 * bits, group size or format — never best effort. */
#ifndef EPYQ_LOAD_MODEL_CONFIG_H
#define EPYQ_LOAD_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

#define EPYQ_MAX_LAYERS 512
#define EPYQ_MAX_EOS 8

/* Shapes past what the config accepts that the model and the reference still refuse (with
 * EPYQ_E_SHAPE / EPYQ_E_UNSUPPORTED), because their per-token scratch is fixed-size. */
#define EPYQ_MAX_EXPERTS 1024 /* routed experts: the router's probabilities and taken-bits */
#define EPYQ_MAX_TOPK 64      /* experts chosen per token: the reference's selection array */
#define EPYQ_MAX_CONV_TAPS 16 /* width of the DeltaNet causal conv the model accepts */

typedef enum {
    EPYQ_QF_NONE = 0, /* BF16/F16/F32 checkpoint */
    EPYQ_QF_GPTQ,     /* GPTQModel / AutoGPTQ: qweight [K/8,N] I32, qzeros, scales, g_idx */
    EPYQ_QF_CT,       /* compressed-tensors pack-quantized: weight_packed [N,K/8] */
    EPYQ_QF_QUARK,    /* AMD Quark int4/uint4 per-group, pack_method reorder|order */
    EPYQ_QF_AWQ,      /* AutoAWQ GEMM: qweight [K,N/8] I32 (AWQ order), qzeros, scales */
} epyq_qformat;

const char *epyq_qformat_name(epyq_qformat f); /* "bf16", "gptq", "ct", "quark", "awq" */

/* One quantisation scheme (a checkpoint may have per-module overrides, see epyq_qconfig_for). */
typedef struct {
    bool quantized;      /* false: this module is stored 16-bit */
    int32_t bits;        /* 4 */
    int32_t group_size;  /* 32 | 64 | 128 */
    bool sym;            /* symmetric (no stored zero points) */
    bool desc_act;       /* GPTQ act-order (g_idx meaningful) / CT actorder "group" */
} epyq_qscheme;

typedef struct epyq_qconfig epyq_qconfig; /* opaque: rules (dynamic, ignore, exclude…) */

typedef struct {
    /* text_config */
    int32_t vocab_size, hidden_size, num_hidden_layers;
    bool full_attn[EPYQ_MAX_LAYERS];          /* [num_hidden_layers] layer_types */
    int32_t num_attention_heads, num_key_value_heads, head_dim;
    bool attn_output_gate;
    double rms_norm_eps;
    int64_t max_position_embeddings;
    double rope_theta, partial_rotary_factor;
    int32_t rotary_dim;                       /* int(head_dim * partial_rotary_factor) */
    int32_t mrope_section[3];
    /* rope_type "yarn" (rope_parameters / rope_scaling; Qwen documents it for contexts past
     * the native 262,144): frequencies per epyq_config_rope_freq, rotary dims of q and k scaled
     * by yarn_attn_factor. max_ctx: the context the runtime allows, max_position_embeddings or
     * original_max_position_embeddings x factor under YaRN, whichever is larger. */
    bool yarn;
    double yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_attn_factor;
    int64_t yarn_orig_ctx;                    /* original_max_position_embeddings */
    bool yarn_truncate;
    int64_t max_ctx;
    int32_t conv_kernel, lin_key_head_dim, lin_value_head_dim, lin_num_key_heads, lin_num_value_heads;
    int32_t num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size;
    int32_t mtp_num_hidden_layers;
    bool tie_word_embeddings;
    int32_t bos_token_id;                     /* -1 if absent */
    char prefix[64];                          /* "model.language_model." or "model." (see binding) */

    /* generation_config.json (defaults when absent: greedy off, temperature 1) */
    int32_t eos_ids[EPYQ_MAX_EOS], n_eos;
    int32_t pad_token_id;
    bool do_sample;
    float temperature, top_p, min_p, repetition_penalty, presence_penalty;
    int32_t top_k;

    /* quantisation */
    epyq_qformat qformat;
    int32_t gptq_version;                     /* 1 or 2 (checkpoint_format gptq / gptq_v2) */
    bool quark_reorder;                       /* Quark pack_method: reorder (true) or order */
    bool quark_signed;                        /* Quark dtype int4 (two's complement nibbles) vs uint4 */
    epyq_qconfig *qc;                         /* owned; NULL for EPYQ_QF_NONE */
} epyq_config;

/* The model's sizes under the short names the forward-pass code and docs/architecture.md §1
 * use (llama2.c style). epyq_config_dims fills one from the config; the runtime model
 * (src/model) and the reference (src/ref) each keep a copy and read these, never the config's
 * long names. Values for Qwen3.6-35B-A3B in brackets. */
typedef struct {
    int32_t H; /* hidden width: the residual stream, every norm and projection input [2048] */
    int32_t V; /* vocabulary: rows of embed_tokens and lm_head [248320] */
    int32_t L; /* decoder layers of the trunk (the MTP layer is extra) [40] */
    /* full (softmax) attention layers */
    int32_t nq;  /* query heads [16] */
    int32_t nkv; /* key/value heads; nq / nkv query heads share one (GQA) [2] */
    int32_t hd;  /* width of one attention head [256] */
    int32_t rd;  /* rotary dims: the first rd of each head's hd are rotated (partial RoPE) [64] */
    /* Gated DeltaNet (linear attention) layers */
    int32_t Hk;       /* key (and query) heads [16] */
    int32_t Hv;       /* value heads; Hv / Hk per key head [32] */
    int32_t Dk;       /* width of a key head [128] */
    int32_t Dv;       /* width of a value head [128] */
    int32_t Kc;       /* taps of the causal depthwise conv over q, k, v [4] */
    int32_t conv_dim; /* channels that conv runs over: 2*Hk*Dk + Hv*Dv [8192] */
    /* mixture of experts (every layer) */
    int32_t E;    /* routed experts [256] */
    int32_t topk; /* routed experts chosen per token [8] */
    int32_t I;    /* intermediate width of one routed expert [512] */
    int32_t Is;   /* intermediate width of the shared expert [512] */
} epyq_dims;

epyq_dims epyq_config_dims(const epyq_config *cfg);

epyq_status epyq_config_load(epyq_config *cfg, const char *dir, epyq_err *err);
/* Parse from strings (tests, fuzzing). gen_json / qc_json may be NULL. */
epyq_status epyq_config_parse(epyq_config *cfg, const char *config_json, const char *gen_json,
                              const char *extra_qc_json, const char *label, epyq_err *err);
void epyq_config_free(epyq_config *cfg);

/* Rotary inverse frequencies inv_freq[i], i < rotary_dim / 2: theta^(-2i / rd), or YaRN's
 * blend of those and their interpolation by the factor (transformers'
 * _compute_yarn_parameters, see config.c). *attn_factor (may be NULL): the scale YaRN puts on
 * cos/sin, 1 without it. */
void epyq_config_rope_freq(const epyq_config *cfg, double *inv_freq, double *attn_factor);

/* What the config says about one linear module (full module name without ".weight"). */
epyq_qscheme epyq_qconfig_for(const epyq_config *cfg, const char *module);

#endif
