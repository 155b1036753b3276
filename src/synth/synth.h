/* src/synth/synth.h — synthetic Qwen3.6-35B-A3B checkpoints (`epyq synth`).
 *
 * Promise: epyq_synth_write() writes a complete Hugging Face checkpoint folder — config.json,
 * generation_config.json, sharded safetensors + model.safetensors.index.json, tokenizer.json and
 * tokenizer_config.json (+ quantize_config.json for GPTQ) — laid out the way each real writer lays
 * it out (docs/quant-formats.md, docs/architecture.md §3): the same tensor names, dtypes, packing
 * and config blocks; shards hold tensors in (dtype size, name) order with space-padded headers.
 * Every value is a pure function of (seed, tensor name, element index), so any tensor can be
 * regenerated on its own (epyq_synth_draw) and two runs with the same options give identical
 * bytes. Writing streams: memory stays at a few tensors whatever the model size. */
#ifndef EPYQ_SYNTH_H
#define EPYQ_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Revision of what the generator writes: bump it whenever the bytes for a given (shape, format,
 * seed) change, so caches keyed on it (tools/tool_model.c, --synthetic) regenerate. */
#define EPYQ_SYNTH_REVISION 1

typedef enum {
    EPYQ_SYNTH_BF16 = 0, /* original release: BF16 (per-expert, or fused 3-D with fused_experts) */
    EPYQ_SYNTH_GPTQ,     /* GPTQModel 6.0.3: routed experts int4 sym g128, checkpoint_format gptq */
    EPYQ_SYNTH_CT,       /* compressed-tensors pack-quantized int4 sym g128 (LLM Compressor) */
    EPYQ_SYNTH_QUARK,    /* AMD Quark int4 per_group g128, pack_method reorder */
    EPYQ_SYNTH_AWQ,      /* AutoAWQ GEMM uint4 asym g128 */
    EPYQ_SYNTH_NFORMATS
} epyq_synth_format;

/* "bf16" "gptq" "ct" "quark" "awq"; parse returns -1 for anything else. */
const char *epyq_synth_format_name(epyq_synth_format f);
int epyq_synth_format_parse(const char *s);

/* Every dimension the generator needs (docs/architecture.md §1 symbols in comments). */
typedef struct {
    int32_t hidden;              /* H */
    int32_t vocab;               /* V (padded embedding rows) */
    int32_t layers;              /* L; layer i is full attention iff i % 4 == 3 */
    int32_t n_q_heads, n_kv_heads, head_dim;     /* nq, nkv, hd */
    int32_t lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim; /* Hk, Hv, Dk, Dv */
    int32_t conv_kernel;         /* Kc */
    int32_t experts, top_k;      /* E, k */
    int32_t moe_inter, shared_inter; /* I, Is */
    int32_t mtp_layers;          /* 0 or 1 */
    int32_t max_pos;             /* max_position_embeddings */
    int32_t mrope[3];            /* mrope_section */
    int32_t special_base;        /* id of <|endoftext|>: 248044, or vocab - 24 for small vocabs */
    /* vision tower actually stored (0 depth = none; config still carries vision_cfg_*) */
    int32_t vis_depth, vis_hidden, vis_inter, vis_heads, vis_pos, vis_cfg_depth, vis_cfg_hidden,
        vis_cfg_inter, vis_cfg_heads, vis_cfg_pos;
    bool tiny;                   /* small test shape (fixture-like vision_config, max_pos 4096) */
    /* Act-order int4 (GPTQ desc_act true / compressed-tensors actorder "group", with g_idx /
     * weight_g_idx): each int4 module's columns are quantized in a random order of its own
     * (epyq_synth_act_perm) and stored in the original order, as GPTQModel and LLM Compressor do.
     * A layout choice rather than a shape, but it has to reach the plan, the emitter and the
     * config writer, which all take the dims. gptq and ct only. */
    bool act_order;
} epyq_synth_dims;

/* shape "tiny" | "35b-a3b"; layers/experts/vocab override when > 0. */
epyq_status epyq_synth_dims_init(epyq_synth_dims *d, const char *shape, int32_t layers,
                                 int32_t experts, int32_t vocab, epyq_err *err);

typedef struct {
    const char *out_dir;
    epyq_synth_format format;
    epyq_synth_dims dims;
    uint64_t seed;
    bool fused_experts;          /* BF16 only: fused 3-D experts + BF16 A_log/norm (Qwen3.6 release) */
    int32_t threads;             /* generator threads; 0 = one per allowed CPU (files are identical) */
    const char *tokenizer;       /* NULL: generate; else a tokenizer.json to copy (its folder's
                                    tokenizer_config.json too, when present) */
    /* Called after every chunk written (done/total in bytes of tensor data). May be NULL. */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
} epyq_synth_opts;

typedef struct {
    uint64_t data_bytes;   /* sum of tensor bytes (index total_size) */
    uint64_t file_bytes;   /* sum of shard file sizes */
    size_t n_tensors, n_shards, n_q4_modules;
    double seconds;
} epyq_synth_stats;

epyq_status epyq_synth_write(const epyq_synth_opts *o, epyq_synth_stats *stats, epyq_err *err);

/* The master float values synth drew for logical tensor `name` (already rounded to bf16, as stored
 * in a BF16 checkpoint): elements [first, first + n) of its row-major flattening. Linears are named
 * per module with ".weight" (experts always per expert, e.g.
 * "model.language_model.layers.0.mlp.experts.3.gate_proj.weight", whatever the on-disk layout).
 * Quantized checkpoints store these values quantized by the tool's rule (epyq_synth_quantize). */
epyq_status epyq_synth_draw(const epyq_synth_dims *d, uint64_t seed, const char *name,
                            uint64_t first, size_t n, float *out, epyq_err *err);

#endif
