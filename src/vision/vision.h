/* src/vision/vision.h — the vision tower of Qwen3_5MoeForConditionalGeneration (docs/vision.md
 * §3): configuration, the bound `model.visual.*` tensors, and the runtime tower.
 *
 * Promise: epyq_vision_config_load() reads config.json's vision_config and the image token ids
 * and refuses what would change the math (another activation, deepstack layers, a hidden size
 * that is not heads x head_dim, ...). epyq_vision_bind() finds every tower tensor under
 * `model.visual.` (or `visual.`) with the shape the config implies and a 16/32-bit dtype,
 * touching no data. The runtime tower (epyq_vision_load / epyq_vision_encode) runs every Linear
 * as a bf16 GEMM through the kernel table (activations rounded to bf16, fp32 sums, what HF's bf16
 * model computes; `exact` keeps fp32 activations), LayerNorm, GELU, rotary and softmax in fp32,
 * attention non-causal within each image, on its own thread pool. GEMMs of 64 rows or more go
 * through oneDNN when the build has it (same contract, its own summation order); with no_dnnl
 * results do not depend on the thread count or on which images share a call. */
#ifndef EPYQ_VISION_H
#define EPYQ_VISION_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "load/safetensors.h"
#include "vision/preproc.h"

typedef struct {
    int32_t depth, hidden, inter, heads, head_dim; /* 27, 1152, 4304, 16, 72 */
    int32_t patch, temporal, merge, in_ch;         /* 16, 2, 2, 3 */
    int32_t out_hidden;                            /* 2048 (= the text hidden size) */
    int32_t n_pos, pos_side;                       /* num_position_embeddings 2304 = 48 x 48 */
    double rope_theta;                             /* vision rotary base, 10000 unless given */
    double eps;                                    /* LayerNorm eps, 1e-6 */
    int32_t image_token_id, vision_start_id, vision_end_id; /* 248056, 248053, 248054 */
    int32_t mrope_section[3]; /* text rotary frequencies per axis t, h, w */
    bool mrope_interleaved;
} epyq_vision_config;

/* *present = false (and EPYQ_OK) when config.json has no vision_config. */
epyq_status epyq_vision_config_load(epyq_vision_config *vc, const char *dir, bool *present,
                                    epyq_err *err);
epyq_status epyq_vision_config_parse(epyq_vision_config *vc, const char *json, size_t len,
                                     const char *label, bool *present, epyq_err *err);

/* One ViT block's tensors (D = hidden, I = inter). */
typedef struct {
    const epyq_tensor *norm1_w, *norm1_b, *norm2_w, *norm2_b; /* [D] */
    const epyq_tensor *qkv_w, *qkv_b;                         /* [3D][D], [3D]: rows q | k | v */
    const epyq_tensor *proj_w, *proj_b;                       /* [D][D], [D] */
    const epyq_tensor *fc1_w, *fc1_b;                         /* [I][D], [I] */
    const epyq_tensor *fc2_w, *fc2_b;                         /* [D][I], [D] */
} epyq_vision_block_w;

typedef struct {
    epyq_vision_config cfg;
    const epyq_tensor *patch_w, *patch_b; /* [D][3][T][p][p] (= [D][3*T*p*p]), [D] */
    const epyq_tensor *pos;               /* [n_pos][D] a pos_side x pos_side grid */
    epyq_vision_block_w *blocks;          /* [depth] */
    const epyq_tensor *mnorm_w, *mnorm_b; /* [D] merger LayerNorm */
    const epyq_tensor *mfc1_w, *mfc1_b;   /* [4D][4D], [4D] */
    const epyq_tensor *mfc2_w, *mfc2_b;   /* [out_hidden][4D], [out_hidden] */
} epyq_vision_w;

/* Bind the tower of an open checkpoint (kept referenced: ck must outlive w). */
epyq_status epyq_vision_bind(epyq_vision_w *w, const epyq_ckpt *ck, const epyq_vision_config *vc,
                             epyq_err *err);
void epyq_vision_w_free(epyq_vision_w *w);

/* Tokens the language model gets for an image of grid gh x gw: (gh/merge) * (gw/merge). */
int32_t epyq_vision_tokens(const epyq_vision_config *vc, int32_t gh, int32_t gw);

/* ---- runtime tower */
typedef struct {
    int32_t n_threads; /* pool size including the caller; 0 = one per allowed CPU */
    bool exact;        /* fp32 activations into the bf16 weights (bf16_gemm_f32), attention in
                          plain fp32 loops: the fp32 tier, much slower on large images */
    bool no_dnnl;      /* never oneDNN: every GEMM on the kernel table, whose per-row sums do not
                          depend on how many rows share a call (bit-exact batching tests) */
} epyq_vision_opts;

typedef struct epyq_vision epyq_vision;

/* Open dir's checkpoint and preprocessor_config.json, bind and copy the tower (bf16 weights
 * 64-byte aligned, norms and biases fp32). EPYQ_E_ARG when the checkpoint has no tower. */
epyq_status epyq_vision_load(epyq_vision **out, const char *dir, const epyq_vision_opts *opts,
                             epyq_err *err);
void epyq_vision_free(epyq_vision *v);
const epyq_vision_config *epyq_vision_cfg(const epyq_vision *v);
const epyq_vision_pp *epyq_vision_preproc(const epyq_vision *v);
/* Encode n images in one call: out [sum of tokens][out_hidden], images in order, each in the
 * raster order of its merged grid. */
epyq_status epyq_vision_encode(epyq_vision *v, const epyq_vision_input *in, int32_t n, float *out,
                               epyq_err *err);
/* Multiply-adds of encoding one image of n patches (for GFLOP/s figures). */
double epyq_vision_flops(const epyq_vision_config *vc, int32_t n_patches);

#endif
