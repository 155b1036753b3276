/* src/model/model_impl.h — the runtime model's private types, shared by the files of
 * src/model/ (model.c load, seq.c states, forward.c trunk, attn.c, deltanet.c, moe.c, mtp.c).
 * Nothing outside src/model/ includes it. */
#ifndef EPYQ_MODEL_IMPL_H
#define EPYQ_MODEL_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "numa/pool.h"

/* A Linear in runtime form. */
typedef struct {
    int32_t n, k;       /* W [n out][k in] */
    bool q4;
    epyq_w4 w4;         /* q4: packed for the kernels (w4.mem owned) */
    uint16_t *bf16;     /* !q4: [n][k] bf16, 64-byte aligned, owned */
    bool exact;         /* bf16 only: fp32 activations (bf16_gemm_f32) — routers, gates, lm_head */
    epyq_requant requant; /* made at load from a 16-bit linear (requant.c): INT4 = w4 alone;
                             INT8 = w4 (high nibble plane) + w4lo (low plane), y = W4 x + W4lo x */
    epyq_w4 w4lo;       /* INT8 requant only: the low nibble plane (w4lo.mem owned) */

    int32_t *perm;      /* act-order int4: [k] input channel of packed column j (the columns are
                         * stored so each g_idx group is contiguous), NULL = identity; owned */
    /* NUMA mode (numa_dense.c): the matrix lives as row slices on the plan's nodes and runs on
     * their pools; the fields above keep the shape, the memory pointers are NULL. */
    const struct epyq_rlin_split *split;
} epyq_rlin;

/* A dense linear split by output rows over the plan groups (numa_dense.c): group g computes
 * rows [row0[g], row0[g + 1]) from part[g], a linear of those rows alone whose memory (not
 * owned) is on g's node: its own slice (split) or a view of g's full copy (replicate-dense).
 * Boundaries are whole 16-row tiles, so each part's rows are the whole matrix's bits. */
typedef struct epyq_rlin_split {
    int32_t n_groups;
    const int32_t *row0;   /* [n_groups + 1] */
    const epyq_rlin *part; /* [n_groups]; n = 0 for a group without rows */
} epyq_rlin_split;

typedef struct {
    epyq_rlin qkv, z, b, a, out;
    float *conv;        /* [Kc][conv_dim] depthwise kernel, tap-major (the checkpoint's
                           [conv_dim][Kc] transposed at load); tap Kc-1 = current token */
    float *neg_exp_A;   /* [Hv] -exp(A_log) */
    float *dt_bias;     /* [Hv] */
    float *norm;        /* [Dv] plain gated-norm weight */
} epyq_gdn_rw;

typedef struct {
    epyq_rlin q, k, v, o;
    float *q_norm, *k_norm; /* [hd] zero-centred */
} epyq_attn_rw;

typedef struct {
    epyq_rlin router;                  /* [E][H], exact */
    epyq_rlin *gate, *up, *down;       /* [E] */
    epyq_rlin sh_gate, sh_up, sh_down; /* shared expert */
    epyq_rlin sh_expert_gate;          /* [1][H], exact */
} epyq_moe_rw;

typedef struct {
    bool full;
    int32_t slot;               /* index among attention layers (KV) or DeltaNet layers (state) */
    float *in_norm, *post_norm; /* [H] zero-centred */
    epyq_gdn_rw g;
    epyq_attn_rw at;
    epyq_moe_rw m;
} epyq_layer_rw;

/* ---- wmem.c: the weight arena. Packed linears are carved from 2 MiB aligned chunks advised
 * MADV_HUGEPAGE (64-byte aligned, zeroed, thread-safe) and all freed together with the arena;
 * epyq_wmem_release frees heap memory and leaves arena memory to the arena. A NULL arena
 * means the heap: epyq_wmem_alloc is then epyq_model_alloc. */
typedef struct epyq_wmem epyq_wmem;
epyq_status epyq_wmem_create(epyq_wmem **out, epyq_err *err); /* *out NULL in sanitizer builds */
void *epyq_wmem_alloc(epyq_wmem *w, size_t n, size_t size);
bool epyq_wmem_owns(const epyq_wmem *w, const void *p);
void epyq_wmem_release(epyq_wmem *w, void *p);
uint64_t epyq_wmem_bytes(const epyq_wmem *w);
void epyq_wmem_free(epyq_wmem *w);

struct epyq_model {
    epyq_weights *w;            /* owned; config lives in w->cfg */
    /* The embedding table the forward reads rows of: *w->embed, its data in the checkpoint's
     * mapping or, when embed_mem is set, in that copy (model.c embed_hold). */
    epyq_tensor embed; /* [V][H] */
    void *embed_mem;   /* owned; NULL while the rows are read from the mapping */
    const epyq_config *c;
    const epyq_kern_table *kt;
    epyq_pool *pool;
    int32_t n_threads;
    epyq_numpath path; /* a16, a8 or a8all: the kernels' path via epyq_path_* below */
    int32_t gdn_chunk_min;
    bool moe_split;             /* small batches spread each expert over the pool (moe.c) */
    bool f32_act;               /* every 16-bit linear runs bf16_gemm_f32 */
    int32_t gs;                 /* group size of the int4 linears (0: none) */
    epyq_requant rq_lm_head, rq_dense; /* --requant lm_head=, dense= (requant.c) */
    uint64_t fwd_bytes;         /* routed-expert weight bytes streamed since the last forward began */
    int32_t rq_gs;              /* group size of requantised linears */
    epyq_requant rq_experts;    /* while loading a layer: its 16-bit routed experts requantised
                                   (the MTP layer's, when drafts read a draft copy) */
    epyq_dims d;                /* sizes (load/model_config.h), from epyq_config_dims */
    int32_t n_attn, n_gdn;      /* trunk layers of each kind; a layer's slot counts its kind */
    float eps;
    double *inv_freq;           /* [rd/2] rotary frequencies (double: angles reach 2.6e5 rad) */
    double rope_attn;           /* YaRN's cos/sin scale (epyq_config_rope_freq), 1 without it */
    epyq_layer_rw *layers;           /* [L] */
    float *final_norm;          /* [H] */
    epyq_rlin lm_head;               /* [V][H] */
    epyq_rlin draft_head;            /* [V][H] requantised copy for MTP drafts only; n = 0: none */
    bool has_mtp;
    epyq_rlin mtp_fc;                /* [H][2H] */
    float *mtp_norm_e, *mtp_norm_h, *mtp_norm; /* [H] */
    epyq_layer_rw mtp;               /* slot = n_attn (its KV cache follows the trunk's) */
    /* NUMA mode (numa_moe.c): routed int4 experts live on their plan group's node. While
     * numa_experts is set, model.c packs only expert 0 of each layer; NULL numa = one pool. */
    bool numa_experts;
    struct epyq_model_numa *numa;
    const epyq_ep *ep; /* expert parallelism (model.h); NULL: one process */
    epyq_wmem *wmem;   /* owned: the packed weights' huge-page arena (wmem.c); NULL in NUMA
                          mode (node buffers hold them) and sanitizer builds (the heap) */
    /* Act-order (linear.c): some linear run through epyq_rlin_run_many has a perm (set by
     * loads that may run in parallel, hence atomic); epyq_rlin_act then keeps room for one
     * permuted copy of its input, which run_many fills per distinct perm (main thread only). */
    atomic_bool has_perm;
    void *prof;                 /* prof.c's counters while profiling is on, else NULL */
    void *prof_held;            /* the same while paused (prof NULL then) */
    float *perm_x;              /* [perm_cap_x] x gathered by a perm */
    void *perm_act;             /* [perm_cap_act] its prepared activation */
    size_t perm_cap_x, perm_cap_act;
};

/* ---- prof.c: block timing marks (prof.h); all no-ops while profiling is off */
uint64_t epyq_prof_mark(const epyq_model *m); /* now, or 0 when off */
void epyq_prof_add(epyq_model *m, epyq_prof_phase ph,
                   uint64_t *t0); /* ph += now - *t0; *t0 = now */
void epyq_prof_forward_done(epyq_model *m);

struct epyq_seq {
    epyq_model *m;
    int32_t n_ctx, pos;
    int32_t rope_delta; /* rotary position - cache position for tokens without M-RoPE ids */
    epyq_kv_type kv;
    int32_t n_kv_layers;        /* n_attn (+1 with MTP) */
    size_t kv_elem;             /* bytes per cached value: 2 (bf16) or 1 (fp8 e4m3) */
    /* The caches, the conv histories and the states are mmap'd (zero, page-aligned, untouched)
     * and cut into per-head blocks of whole pages, so that in NUMA mode each head's block is
     * bound to the node of the pool that works on that head before anything touches it. */
    size_t kv_plane; /* bytes of one (layer, kv head) plane: [n_ctx][hd] values, page-rounded */
    uint8_t *k, *v;  /* [n_kv_layers][nkv][kv_plane] bytes; one mapping, v after k */
    float *conv;     /* [n_gdn][Hk][conv_blk] per (layer, key head): [Kc-1][2 Dk + r Dv] raw
                      * inputs of its q | k | value heads' v channels, oldest first */
    float *S;                   /* [n_gdn][Hv][Dk][Dv] recurrent states */
    uint32_t numa_bound;        /* NUMA mode: bit k set when kind k's blocks (epyq_seq_numa_kind)
                                 * are bound to their owners' nodes */
    /* Speculative verification (epyq_seq_spec_begin): the next forward snapshots the DeltaNet
     * states after each of this sequence's first spec_n - 1 tokens (after token spec_n - 1
     * the state itself is the copy), so epyq_seq_rollback can return to any of them.
     * spec_cap = slots allocated. */
    int32_t spec_n, spec_cap, spec_pos0;
    float *spec_S;    /* [spec_cap][n_gdn][Hv][Dk][Dv], blocks bound like S's */
    float *spec_conv; /* [spec_cap][n_gdn][Hk][conv_blk], blocks bound like conv's */

    /* Non-empty: a forward failed after some of this sequence's layer states had moved (why
     * it failed); every forward and MTP call refuses it until epyq_seq_reset. */
    char broken[160];
};

/* Per-call plan of a batch: where each token goes. */
typedef struct {
    int32_t T;
    epyq_seq **seq;             /* [T] */
    int32_t *pos;               /* [T] KV slot (= RoPE position for text) */
    int32_t *rpos; /* [T][3] (t, h, w) RoPE positions; NULL = pos on every axis (MTP) */
    /* tokens grouped by sequence, in order (DeltaNet runs per sequence) */
    int32_t n_groups;
    int32_t *grp_off;           /* [n_groups + 1] offsets into grp_tok */
    int32_t *grp_tok;           /* [T] batch indices */
} epyq_batch_plan;

/* The kernels' numeric path for the routed experts, and for every other int4 linear (dense
 * projections, shared expert, requantised heads): A8 in the experts unless the model's path is
 * a16, A8 elsewhere only with a8all (see epyq_model_opts.path). */
static inline epyq_numpath epyq_path_experts(const epyq_model *m) {
    return m->path == EPYQ_PATH_A16 ? EPYQ_PATH_A16 : EPYQ_PATH_A8;
}
static inline epyq_numpath epyq_path_dense(const epyq_model *m) {
    return m->path == EPYQ_PATH_A8_ALL ? EPYQ_PATH_A8 : EPYQ_PATH_A16;
}

/* ---- linear.c: GEMMs through the kernel table, split by output rows over the pool */
/* Prepare x [m][k] for the model's path (gs of the int4 linears reading it). */
epyq_status epyq_rlin_act(const epyq_model *m, const float *x, int32_t rows, int32_t k, epyq_act *a,
                     void **buf, epyq_err *err);
/* The same for a linear of group size gs (a requantised lm_head on a model without int4). */
epyq_status epyq_rlin_act_gs(const epyq_model *m, const float *x, int32_t rows, int32_t k, int32_t gs,
                             epyq_act *a, void **buf, epyq_err *err);
/* y [m][ldy] (columns [0, l->n)) = l · x for every row of the prepared act. */
void epyq_rlin_run(epyq_model *m, const epyq_rlin *l, const epyq_act *a, float *y, int32_t ldy);
/* Several linears over the same act in one pool run: outs[i].y = outs[i].l · x. */
typedef struct {
    const epyq_rlin *l;
    float *y;
    int32_t ldy;
} epyq_rlin_out;
void epyq_rlin_run_many(epyq_model *m, const epyq_rlin_out *outs, int32_t n, const epyq_act *a);
/* One pool task of such a run: rows [n0, n1) of outs[out]. */
typedef struct {
    int32_t out, n0, n1;
} epyq_gemm_piece;
/* The tasks epyq_rlin_run_many gives n_threads for `rows` activation rows: every output's
 * rows once, in order, outputs in order; whole 16-row tiles except each output's last task;
 * shrinking in bytes towards the end of the run; one task for outputs too small to split
 * (and everything when n_threads <= 1). At most max tasks; -1 when max < n. */
int32_t epyq_rlin_pieces(int32_t n_threads, const epyq_rlin_out *outs, int32_t n, int32_t rows,
                         epyq_gemm_piece *pc, int32_t max);
/* Single-threaded, rows [n0, n1) (inside pool tasks). */
void epyq_rlin_rows(const epyq_model *m, const epyq_rlin *l, int32_t n0, int32_t n1, const epyq_act *a,
               float *y, int32_t ldy);
epyq_status epyq_rlin_load(epyq_model *m, epyq_rlin *dst, const epyq_linear *src, bool exact, epyq_err *err);
/* An expert's (routed or shared) gate/up/down, for the fused expert kernel, which reads one
 * activation for gate and up and forms down's input itself: an act-order down's column order
 * is absorbed by reordering gate's and up's output rows (down->perm stays NULL), and gate and
 * up must share one column order (gate->perm, applied when the rows are gathered). */
epyq_status epyq_rlin_load_expert(epyq_model *m, epyq_rlin *gate, epyq_rlin *up, epyq_rlin *down,
                                  const epyq_linear *gs, const epyq_linear *us, const epyq_linear *ds,
                                  epyq_err *err);
void epyq_rlin_free(const epyq_model *m, epyq_rlin *l);
/* Rows [r0, r0 + rows) of a 16/32-bit linear as fp32 into f [rows][n_in]. */
epyq_status epyq_rlin_read_rows(const epyq_linear *src, int32_t r0, int32_t rows, float *f,
                                epyq_err *err);
/* ---- requant.c: a 16-bit linear requantised at load to `kind` with group size gs */
epyq_status epyq_rlin_requant(epyq_model *m, epyq_rlin *dst, const epyq_linear *src,
                              epyq_requant kind, int32_t gs, epyq_err *err);

uint64_t epyq_rlin_bytes(const epyq_rlin *l);
/* Expert parallelism: the rank that runs expert e (E = the shared expert: rank 0), and does
 * this copy hold and run it? */
static inline int32_t epyq_model_ep_runner(const epyq_model *m, int32_t e) {
    return !m->ep || e == m->d.E ? 0 : e % m->ep->size;
}
static inline bool epyq_model_ep_owns(const epyq_model *m, int32_t e) {
    return !m->ep || epyq_model_ep_runner(m, e) == m->ep->rank;
}
void *epyq_model_alloc(size_t n, size_t size); /* 64-byte aligned, zeroed; NULL on overflow/OOM */
/* The same, not zeroed: for buffers that every reader finds fully written first (projection
 * outputs, per-entry rows). Zeroing them cost ~2% of a 512-token prompt. Sanitizer builds
 * (EPYQ_POISON_SCRATCH) fill them with NaN instead, so a read of a row nobody wrote turns the
 * fixture tests' logits into NaN rather than passing on a lucky zero. */
void *epyq_model_alloc_raw(size_t n, size_t size);

/* ---- the blocks: x [T][H] normed input → out [T][H] */
epyq_status epyq_gdn_block(epyq_model *m, const epyq_layer_rw *ly, const epyq_batch_plan *p, const float *x,
                      float *out, epyq_err *err);
epyq_status epyq_attn_block(epyq_model *m, const epyq_layer_rw *ly, const epyq_batch_plan *p, const float *x,
                       float *out, epyq_err *err);
epyq_status epyq_moe_block(epyq_model *m, const epyq_moe_rw *mw, int32_t T, const float *x, float *out,
                      epyq_err *err);
/* out rows [t0, t1) of [T][H]: each token's S output rows of ys [T][S][H] added in slot order
 * (its top-k order, the shared expert last) — the one order of every MoE sum. */
void epyq_moe_sum(const float *ys, int32_t t0, int32_t t1, int32_t S, int32_t H, float *out);
/* ---- moe_ep.c: under expert parallelism, out [T][H] from this rank's rows of ys [T][K + 1][H]
 * (those of its experts; sel [T][K] the routed experts) and the other ranks' (model.h). */
epyq_status epyq_moe_ep_combine(const epyq_model *m, int32_t T, const int32_t *sel, float *ys,
                                float *out, epyq_err *err);
/* One decoder layer over the batch; residual x [T][H] updated in place. */
epyq_status epyq_layer_forward(epyq_model *m, const epyq_layer_rw *ly, const epyq_batch_plan *p, float *x,
                          epyq_err *err);
/* Zero-centred RMSNorm of rows x [T][n] → y (may alias). */
void epyq_rmsnorm_zc_rows(const float *x, const float *w, int32_t T, int32_t n, float eps, float *y);
/* Below this many rows the serial steps (norms, residual adds, MoE sums, routing) stay on the
 * driver: a pool hand-off costs microseconds and a row of 2048 about one. */
#define EPYQ_ROWS_POOL_MIN 16
/* fn(ctx, r0, r1) over row ranges covering [0, n): on the model's pool when n >= min_rows,
 * else (decode steps: a hand-off would cost more than the rows) in one call on this thread.
 * Row-independent work only, so the bits do not depend on the split. */
void epyq_model_rows_run(epyq_model *m, int32_t n, int32_t min_rows,
                         void (*fn)(void *ctx, int32_t r0, int32_t r1), void *ctx);
/* logits [rows][V] = lm_head · x [rows][H] */
epyq_status epyq_lm_head_run(epyq_model *m, const float *x, int32_t rows, float *logits, epyq_err *err);

/* ---- mtp.c: the MTP head; draft = read the draft head (if loaded) instead of the exact one */
epyq_status epyq_mtp_run(epyq_model *m, epyq_seq *s, int32_t n, const float *h, const int32_t *tok,
                         const int32_t *pos, int32_t n_logits, float *logits, float *h_out, bool draft,
                         epyq_err *err);
/* logits [rows][V] = head · x [rows][H] (the lm_head or a draft head) */
epyq_status epyq_head_run(epyq_model *m, const epyq_rlin *head, const float *x, int32_t rows, float *logits,
                          epyq_err *err);

/* ---- seq.c: KV cache rows and the per-head blocks */
/* Store kv head kvh's row at pos: k, v [hd]. */
void epyq_seq_kv_store(epyq_seq *s, int32_t layer_slot, int32_t pos, int32_t kvh, const float *k,
                       const float *v);
/* bf16 view of rows [0, n) of one kv head; fp8 caches are widened into `tmp` [n][hd] x 2. */
void epyq_seq_kv_view(const epyq_seq *s, int32_t layer_slot, int32_t kvh, int32_t n, uint16_t *tmp,
                 const uint16_t **k, const uint16_t **v, int32_t *stride);
/* Floats of one (layer, key head) conv block: [Kc-1][2 Dk + r Dv], rounded up to whole pages. */
size_t epyq_seq_conv_blk(const epyq_model *m);
/* Channels of one key head's conv block (2 Dk + r Dv) and taps kept (Kc - 1, at least 1). */
int32_t epyq_seq_conv_ch(const epyq_model *m);
int32_t epyq_seq_conv_taps(const epyq_model *m);
/* Copy the conv histories between the per-key-head blocks of conv and the layout snapshots
 * keep, canon [n_gdn][taps][conv_dim] floats in projection order (any alignment): to_canon
 * reads conv, else writes it. */
void epyq_seq_conv_canon(const epyq_model *m, float *conv, void *canon, bool to_canon);

/* ---- deltanet.c: the chunked delta rule of one head over n tokens with kernel table kt
 * (exported for the chunked-vs-recurrent test); fails only when its workspace cannot be had. */
epyq_status epyq_gdn_chunk_head(const epyq_kern_table *kt, float *S, const float *q, const float *k,
                                const float *v, const float *g, const float *beta, int32_t n,
                                int32_t ld_qk, int32_t ld_v, int32_t dk, int32_t dv, float *o,
                                int32_t ld_o, epyq_err *err);

/* ---- numa_moe.c: routed experts placed on NUMA nodes (numa_moe.h) */
typedef struct epyq_model_numa epyq_model_numa;
/* After model_build: plan, per-node pools, experts packed on their nodes, dispatch. slice:
 * intermediate rows per unit, 0 = 128. */
epyq_status epyq_model_numa_load(epyq_model *m, const epyq_numa_opts *o, int32_t slice, epyq_err *err);
void epyq_model_numa_free(epyq_model *m); /* before the layers are freed */
/* Plan layer of mw when its routed experts are placed (trunk l, MTP = L), else -1. */
int32_t epyq_moe_numa_layer(const epyq_model *m, const epyq_moe_rw *mw);
/* ---- numa_dense.c: the dense linears on the plan's nodes */
/* Split every dense linear over the groups (or copy it to each, replicate-dense) into memory
 * bound to each group's node, written by that group's workers; the heap copies are freed. */
epyq_status epyq_numa_dense_place(epyq_model *m, epyq_err *err);
void epyq_numa_dense_free(epyq_model *m);
/* outs[i].y = outs[i].l . acts[i] over the groups' pools at once, each group its own parts
 * (outputs without a split run on group 0); the driver is pool 0's creator. */
void epyq_numa_dense_run(epyq_model *m, const epyq_rlin_out *outs, int32_t n,
                         const epyq_act *const *acts);
/* An int4 expert whose gate, up and down are split (a shared expert in NUMA mode):
 * y [x->m][ldy] = rw[t] * down(silu(gate x_t) * up x_t), the fused kernel's bits (kern.h
 * w4_expert), in its two phases, each on every group's pool at once from its own rows. x is
 * prepared for path (the expert's activations). */
epyq_status epyq_numa_expert_run(epyq_model *m, const epyq_rlin *gate, const epyq_rlin *up,
                                 const epyq_rlin *down, const epyq_act *x, epyq_numpath path,
                                 const float *rw, float *y, int32_t ldy, epyq_err *err);
/* ---- numa_state.c: the per-head work and a sequence's per-head buffers on the owners' nodes */
/* Which heads a task's second index counts: attention kv heads, DeltaNet key heads (the conv
 * block of a key head's channels) or DeltaNet value heads (the delta rule and its state). */
typedef enum { EPYQ_NUMA_HEAD_KV, EPYQ_NUMA_HEAD_KEY, EPYQ_NUMA_HEAD_VALUE } epyq_numa_head;
/* Bind every per-head block of s (KV planes, conv blocks, states) to its owner's node before
 * their first touch, and set s->numa_bound's bits; a no-op without a NUMA mode or for a plan that
 * binds nothing. */
epyq_status epyq_numa_seq_place(const epyq_model *m, epyq_seq *s, epyq_err *err);
/* The same for the speculative snapshots s->spec_S and s->spec_conv just allocated. */
epyq_status epyq_numa_spec_place(const epyq_model *m, epyq_seq *s, epyq_err *err);
/* What a task reads of a sequence's buffers (for the local/remote counters): the sequence and
 * the bytes. Called by the driver only, before the tasks run. */
typedef uint64_t (*epyq_numa_bytes_fn)(void *ctx, int32_t task, const epyq_seq **seq);
/* Run fn over the n_outer x heads tasks (task q * heads + h), each on the pool of head h's
 * owner, worker numbers unique over all pools (< epyq_numa_workers); bytes (may be NULL)
 * counts what each task reads. false when not in NUMA mode (or out of memory): the caller runs
 * them on its own pool, with the same bits. */
bool epyq_numa_run_heads(epyq_model *m, epyq_numa_head kind, epyq_task_fn fn, void *ctx,
                         int32_t n_outer, epyq_numa_bytes_fn bytes);
/* Workers a task may be numbered by: the model pool's, or all node pools' when more. */
int32_t epyq_numa_workers(const epyq_model *m);
/* y [T][ldy] (columns [0, H)) = the routed experts' sum for each token, in top-k order. */
epyq_status epyq_moe_numa_run(epyq_model *m, int32_t layer, const epyq_moe_rw *mw, int32_t T, const float *x,
                              const int32_t *sel, const float *wt, float *y, int32_t ldy, epyq_err *err);

#endif
