/* src/load/weights.h — binding a checkpoint to the architecture (docs/architecture.md §3).
 *
 * Promise: epyq_weights_bind() enumerates every tensor the text model (and the MTP head, when
 * present) needs, finds each under any accepted layout (per-expert or fused 3-D experts; prefix
 * model.language_model. or model.), decides per linear whether it is int4 (tensors present +
 * config) or 16/32-bit, and checks every shape and dtype before anything is copied. Missing
 * tensors give EPYQ_E_SHAPE naming the tensor and the expected shape; unexpected tensors outside
 * model.visual.* and mtp.* are listed in `unexpected` (inspect reports them; load refuses them
 * unless told otherwise). No weight data is touched: everything points into the mapping.
 *
 * Linear sources are format-neutral: model code turns each into its runtime form with
 * epyq_linear_dequant() (reference path: fp32) or epyq_linear_unpack_q4() (canonical int4 for
 * the packer in kernels-x86/kern.h). */
#ifndef EPYQ_WEIGHTS_H
#define EPYQ_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels-x86/kern.h"
#include "load/model_config.h"
#include "load/safetensors.h"

typedef enum { EPYQ_LIN_DENSE = 0, EPYQ_LIN_Q4 } epyq_lin_kind;

/* One logical Linear y = W·x with W [n_out][n_in], wherever and however it is stored. */
typedef struct {
    char module[160];            /* e.g. model.language_model.layers.0.mlp.experts.3.gate_proj */
    int64_t n_out, n_in;
    epyq_lin_kind kind;
    /* DENSE: w is BF16/F16/F32; the matrix is rows [row0, row0 + n_out) of slice `slice`
     * of w (slice = expert index for fused 3-D [E][rows][n_in] tensors, else 0). */
    const epyq_tensor *w;
    int64_t slice, row0;
    /* Q4 (layout per cfg->qformat, see docs/quant-formats.md): */
    epyq_qscheme scheme;
    const epyq_tensor *qweight;  /* GPTQ qweight | CT weight_packed | Quark weight | AWQ qweight */
    const epyq_tensor *scales;   /* scales | weight_scale */
    const epyq_tensor *qzeros;   /* qzeros | weight_zero_point | NULL when symmetric */
    const epyq_tensor *g_idx;    /* GPTQ g_idx | CT weight_g_idx [n_in]; NULL if absent. Whether
                                  * it is trivial (k / gs) is decided when decoding, so binding
                                  * never reads weight data. */
} epyq_linear;

/* Decode to fp32 W [n_out][n_in] (exact: (q - z) * s for int4; widening for 16-bit). */
epyq_status epyq_linear_dequant(const epyq_linear *l, const epyq_config *cfg, float *w, epyq_err *err);
/* Decode an int4 linear to canonical form (kernels-x86/kern.h epyq_q4_canon): q [n_out][n_in]
 * codes 0..15, s [n_out][n_in/gs], z [n_out][n_in/gs] with W = (q - z) * s. z may be NULL when
 * the scheme is symmetric (every zero is then 8; a stored zero other than 8 fails with E_ARG).
 * A non-trivial g_idx (act-order) is returned as perm[n_in] (input i of the canonical matrix
 * reads x[perm[i]]) with *has_perm = true; perm may be NULL only for linears without g_idx
 * or with a trivial one. Scales are checked finite (E_FORMAT naming the tensor otherwise). */
epyq_status epyq_linear_unpack_q4(const epyq_linear *l, const epyq_config *cfg, uint8_t *q,
                                  float *s, uint8_t *z, int32_t *perm, bool *has_perm, epyq_err *err);
/* Check an int4 linear's scales, zero points and g_idx without decoding its codes (inspect's
 * default scan, about 1/4 of the bytes a full decode reads): every scale positive and finite;
 * a symmetric scheme's stored zero points equal to the bias (GPTQ sym: 8, stored 7 in v1);
 * g_idx values in range and, for act-order, group_size columns per group. The first failure
 * is E_FORMAT (E_QUANT for a group of the wrong size) naming the tensor, output row and group.
 * 16-bit linears pass. */
epyq_status epyq_linear_check_q4(const epyq_linear *l, const epyq_config *cfg, epyq_err *err);
/* Bytes one full GEMV over this linear reads from the checkpoint's representation. */
uint64_t epyq_linear_bytes(const epyq_linear *l);

typedef struct {
    epyq_linear in_proj_qkv;     /* [conv_dim = 2*Hk*Dk + Hv*Dv][H] */
    epyq_linear in_proj_z;       /* [Hv*Dv][H] */
    epyq_linear in_proj_b;       /* [Hv][H] */
    epyq_linear in_proj_a;       /* [Hv][H] */
    epyq_linear out_proj;        /* [H][Hv*Dv] */
    const epyq_tensor *conv1d;   /* [conv_dim][1][Kc] */
    const epyq_tensor *dt_bias;  /* [Hv] */
    const epyq_tensor *A_log;    /* [Hv] (F32 or BF16) */
    const epyq_tensor *norm;     /* [Dv] plain gated-RMSNorm weight */
} epyq_gdn_w;

typedef struct {
    epyq_linear q_proj;          /* [nq * hd * 2][H] per-head interleaved q | gate */
    epyq_linear k_proj;          /* [nkv * hd][H] */
    epyq_linear v_proj;          /* [nkv * hd][H] */
    epyq_linear o_proj;          /* [H][nq * hd] */
    const epyq_tensor *q_norm;   /* [hd] zero-centred */
    const epyq_tensor *k_norm;   /* [hd] zero-centred */
} epyq_attn_w;

typedef struct {
    epyq_linear router;          /* [E][H] mlp.gate */
    epyq_linear *gate;           /* [E] each [I][H] (fused: rows [0, I) of gate_up_proj[e]) */
    epyq_linear *up;             /* [E] each [I][H] (fused: rows [I, 2I)) */
    epyq_linear *down;           /* [E] each [H][I] */
    bool fused;                  /* experts stored as 3-D gate_up_proj / down_proj */
    epyq_linear sh_gate;         /* [Is][H] */
    epyq_linear sh_up;           /* [Is][H] */
    epyq_linear sh_down;         /* [H][Is] */
    epyq_linear sh_expert_gate;  /* [1][H] */
} epyq_moe_w;

typedef struct {
    bool full_attn;
    const epyq_tensor *input_norm;  /* [H] zero-centred */
    const epyq_tensor *post_norm;   /* [H] zero-centred */
    epyq_gdn_w gdn;                 /* when !full_attn */
    epyq_attn_w attn;               /* when full_attn */
    epyq_moe_w moe;
} epyq_layer_w;

typedef struct {
    epyq_linear fc;                        /* [H][2H] input concat(embedding, hidden) */
    const epyq_tensor *pre_fc_norm_embedding, *pre_fc_norm_hidden, *norm; /* [H] zero-centred */
    epyq_layer_w layer;                    /* a full-attention MoE layer */
} epyq_mtp_w;

typedef struct {
    epyq_config cfg;
    epyq_ckpt *ckpt;                 /* owned */
    const epyq_tensor *embed;        /* [V][H] */
    const epyq_tensor *final_norm;   /* [H] zero-centred */
    epyq_linear lm_head;             /* [V][H] */
    epyq_layer_w *layers;            /* [num_hidden_layers] */
    bool has_mtp;
    epyq_mtp_w mtp;
    size_t n_vision, n_mtp;          /* recognised tensors not used by the text trunk */
    size_t n_unexpected;
    char **unexpected;               /* [n_unexpected] names outside the architecture */
    /* Linears whose stored precision disagrees with the config's ignore/exclude/dynamic rules
     * (the tensors win, docs/quant-formats.md §8 step 4); the first one is described. */
    size_t n_qc_mismatch;
    char qc_mismatch[256];
} epyq_weights;

typedef struct {
    bool allow_unexpected;  /* inspect: list them instead of refusing */
    bool skip_mtp;          /* do not bind mtp.* even if present */
} epyq_bind_opts;

/* What a linear is, for summaries (inspect's precision table, bytes per token). */
typedef enum {
    EPYQ_MK_GDN,          /* linear_attn in_proj_qkv/z/a/b, out_proj */
    EPYQ_MK_ATTN,         /* self_attn q/k/v/o */
    EPYQ_MK_ROUTER,       /* mlp.gate */
    EPYQ_MK_EXPERT,       /* routed experts gate/up/down */
    EPYQ_MK_SHARED,       /* shared_expert gate/up/down */
    EPYQ_MK_SHARED_GATE,  /* shared_expert_gate */
    EPYQ_MK_LM_HEAD,
    EPYQ_MK_MTP_FC,       /* mtp.fc (the MTP layer's own linears use the kinds above) */
    EPYQ_MK_COUNT
} epyq_module_kind;
const char *epyq_module_kind_name(epyq_module_kind k);

/* Call fn for every bound linear: trunk layers in order (layer = index, expert = index or -1),
 * then lm_head (layer -1), then the MTP head (mtp = true, layer 0). */
typedef void (*epyq_linear_fn)(const epyq_linear *l, epyq_module_kind kind, int32_t layer, int32_t expert,
                               bool mtp, void *ctx);
void epyq_weights_foreach_linear(const epyq_weights *w, epyq_linear_fn fn, void *ctx);

/* Sizes for summaries (inspect, bench). Bytes are of the on-disk representation unless said. */
typedef struct {
    uint64_t q4_count, q4_bytes;       /* int4 linears: packed codes + scales (+ zeros if asymmetric) */
    uint64_t dense_count, dense_bytes; /* 16/32-bit linears */
    uint64_t params;                   /* n_out * n_in summed */
} epyq_prec_row;

typedef struct {
    epyq_prec_row kind[EPYQ_MK_COUNT]; /* trunk linears by kind */
    epyq_prec_row mtp;                 /* every linear of the MTP head */
    uint64_t other_bytes;              /* trunk non-linear tensors: embedding, norms, conv1d, A_log, dt_bias */
    uint64_t mtp_other_bytes;          /* MTP norms */
    /* One decoded token at batch 1 without speculation (docs/architecture.md §7.2): every mixer
     * linear, router, num_experts_per_tok average experts, shared expert and its gate, lm_head, the
     * small per-layer tensors and one embedding row. */
    uint64_t token_bytes, token_params;
    /* What the runtime keeps in memory: 16/32-bit tensors as stored, int4 linears in the
     * kernels' packed layout (epyq_w4_pack_bytes); MTP included when bound. */
    uint64_t resident_bytes;
    /* Per sequence: bf16 KV bytes per token of context, fp32 Gated DeltaNet state + conv tail. */
    uint64_t kv_bytes_per_token, gdn_state_bytes;
} epyq_weights_stats;

void epyq_weights_stats_get(const epyq_weights *w, epyq_weights_stats *s);

epyq_status epyq_weights_bind(epyq_weights **out, const char *dir, const epyq_bind_opts *opts,
                              epyq_err *err);
void epyq_weights_free(epyq_weights *w);

#endif
