/* src/model/model.h — the runtime model: load a checkpoint into kernel-ready form, hold
 * sequences, and run batched forward passes and the MTP head.
 *
 * Promise: epyq_model_load() binds the checkpoint (src/load/weights.h), packs every int4 linear
 * for the kernels (epyq_w4_pack) and keeps every 16-bit linear as bf16 [n][k], all 64-byte
 * aligned; after it returns the checkpoint mapping is no longer needed for linears. One
 * epyq_model_forward() call takes a batch of tokens from any number of sequences at any
 * positions (prefill chunks and decode steps mixed), keeps the residual stream in fp32, groups
 * the batch's tokens per expert before the expert kernels, and parallelises through the
 * model's thread pool. Work is split by output rows only and each token's expert outputs are
 * summed in its own top-k order, so results do not depend on the thread count, and a token's
 * result does not depend on which other tokens share its batch, because no kernel's per-row sum
 * depends on how many rows share a call (tests/kern/test_w4.c, tests/unit/test_model_batch.c).
 *
 * A model is driven by one thread at a time; sequences belong to one model. */
#ifndef EPYQ_MODEL_H
#define EPYQ_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels-x86/kern.h"
#include "load/model_config.h"
#include "load/weights.h"
#include "model/prof.h"
#include "numa/plan.h"

typedef enum { EPYQ_KV_BF16 = 0, EPYQ_KV_FP8 } epyq_kv_type;

/* Cheaper copies of 16-bit linears made at load (src/model/requant.c; never written to disk):
 * INT8 = round-to-nearest int8 per group, symmetric; INT4 = round-to-nearest int4 per group,
 * asymmetric. The group size is the checkpoint's int4 one (else 128/64/32). */
typedef enum { EPYQ_REQUANT_NONE = 0, EPYQ_REQUANT_INT8, EPYQ_REQUANT_INT4 } epyq_requant;
const char *epyq_requant_name(epyq_requant r); /* "bf16" (none), "int8", "int4" */
/* Parse "lm_head=int8", "dense=int4", "lm_head=int4,dense=int8" (or "none") into *lm_head /
 * *dense (each left unchanged when the spec does not name it). */
epyq_status epyq_requant_parse(const char *spec, epyq_requant *lm_head, epyq_requant *dense,
                               epyq_err *err);
/* One kind: "int8", "int4", "bf16" or "none" (the last two = NONE). */
epyq_status epyq_requant_parse_kind(const char *v, epyq_requant *out, epyq_err *err);
/* The group size requantised linears use: the checkpoint's int4 group size, else the largest
 * of 128/64/32 dividing every input width; 0 when none does. */
int32_t epyq_requant_group(const epyq_weights *w);
/* Bytes a [n][k] linear requantised to `kind` with group gs streams per pass (0: cannot). */
uint64_t epyq_requant_bytes(int64_t n, int64_t k, int32_t gs, epyq_requant kind);

/* Expert parallelism over copies of the model in several processes (tools/ep_mpi.c runs it on
 * MPI): every copy runs the same forward calls in lockstep with the whole dense part, and holds
 * and runs only the routed experts e with e % size == rank (expert 0 is loaded everywhere, as
 * the layout's reference, and run by its owner only); the shared expert runs on rank 0. After
 * the experts, each MoE layer exchanges rows (src/model/moe_ep.c): the batch's tokens are cut
 * into one contiguous block per rank, every (token, top-k slot) output row goes to the rank of
 * its token's block (alltoallv), that rank adds the token's rows in its top-k order as one
 * process does, and the summed rows of every block go to every rank (allgatherv). So the
 * result is one process's bits, and each row crosses the network once.
 *
 * Both hooks are collective (every rank calls them in the same order) and count and place
 * rows of `width` floats: alltoallv sends rows [sdispl[r], sdispl[r] + scount[r]) of send to
 * rank r and puts rank r's rows at recv + rdispl[r] * width (rcount[r] of them); allgatherv
 * gives every rank every rank r's rows [displ[r], displ[r] + count[r]) of buf, in place. */
typedef struct epyq_ep {
    int32_t rank, size;
    epyq_status (*alltoallv)(void *ctx, const float *send, const int32_t *scount,
                             const int32_t *sdispl, float *recv, const int32_t *rcount,
                             const int32_t *rdispl, int32_t width, epyq_err *err);
    epyq_status (*allgatherv)(void *ctx, float *buf, const int32_t *count, const int32_t *displ,
                              int32_t width, epyq_err *err);
    void *ctx;
} epyq_ep;

/* A model-level value of epyq_model_opts.path beside the kernels' A16 and A8 (the model hands
 * the kernels A8 for it; they never see this value). */
#define EPYQ_PATH_A8_ALL ((epyq_numpath)2)

/* Tokens of one sequence in one batch from which the DeltaNet runs chunked (see
 * epyq_model_opts.gdn_chunk_min); -1 = never. The recurrent form measured faster than the
 * chunked one at every length: Zen 5 VM, 1 thread, one 128 x 128 head over 512 tokens,
 * 542-586 us as one gdn_step per token against 814-1039 us chunked (its f32_gemm products
 * alone ~490 us at 180 GFLOP/s); since then a run of tokens goes through gdn_seq (one pass
 * over an L1-resident strip of the state per token), ~320 us for the same head. */
#define EPYQ_GDN_CHUNK_DEFAULT (-1)
/* "a16" | "a8" | "a8all" -> the path value, -1 for anything else; and back. */
int epyq_model_path_parse(const char *s);
const char *epyq_model_path_name(epyq_numpath path);

typedef struct {
    /* Numeric path of the int4 routed-expert kernels: EPYQ_PATH_A16 (the zero value; int16
     * per-group activations, VPDPWSSD) or EPYQ_PATH_A8 (int8 per-group activations, VPDPBUSD).
     * The tools default to A8: it is the faster path (benchmarks/kernels, this project's VM,
     * 1 thread: one MoE layer's 8 experts at M = 1 stream at 79% vs 74% of the read
     * bandwidth, at M = 32 compute 1.6x faster) and stays inside the fixtures' conformance
     * bounds (tests/unit/test_model_fixture.c). Every other int4 linear (attention and DeltaNet
     * projections, shared expert) takes A16; 16-bit linears (router, lm_head) bf16. Measured on
     * the tiny-ct fixture (KL mean vs the float64 expected logits): A16 1.1e-6 nats (max
     * |dlogit| inside the fp32 tier); int8 in the routed experts 1.7e-4; int8 in every int4
     * linear 2.0e-3 (twice the conformance bound, so never by default).
     * EPYQ_PATH_A8_ALL (opt-in, `--path a8all`) is that: int8 activations in every int4 linear
     * (attention, DeltaNet and MTP projections, shared expert, a requantised head), the numerics
     * of llama.cpp's q8 activations, 2x the int4 GEMM throughput where A16 is compute-bound
     * (prefill, many sequences). Its own tier in tests/unit/test_model_fixture.c. */
    epyq_numpath path;
    int32_t n_threads;      /* pool size including the caller; 0 = one per allowed CPU */
    bool skip_mtp;          /* do not load mtp.* even when present */
    bool f32_act;           /* 16-bit linears take fp32 activations (bf16_gemm_f32) instead of
                               bf16-rounded ones: on a BF16 checkpoint the whole forward pass is
                               then fp32 math (the fixtures' tightest tolerance tier); int4 linears
                               still follow `path`. Same bytes streamed, more arithmetic. */
    const epyq_kern_table *kernels; /* kernel table; NULL = epyq_kern() (tests pin a level) */
    /* A sequence with at least this many tokens in one batch runs the chunked DeltaNet (chunk
     * 64, its products in the f32_gemm kernel) instead of the recurrent gdn_seq / gdn_step;
     * < 0 = never; 0 = EPYQ_GDN_CHUNK_DEFAULT, or the environment's EPYQ_GDN_CHUNK (tokens,
     * <= 0 = never) when set. Both forms compute the same thing within fp32 rounding
     * (tests/unit/test_model_gdn.c); the default is where the chunked one measured faster (never,
     * so far). */
    int32_t gdn_chunk_min;
    /* Load progress for displays (tools/tool_model.c): called after each decoder layer is
     * packed and once after the head, with steps done of total (num_hidden_layers + 1) —
     * layers are near-equal in bytes, so steps track bytes. NULL = silent. */
    void (*progress)(void *ctx, int32_t done, int32_t total);
    void *progress_ctx;
    /* NUMA placement (src/model/numa_moe.h): NULL or mode off = one pool, no binding. Else the
     * plan's per-node pools run the routed experts, packed on their nodes. Kept by pointer. */
    const epyq_numa_opts *numa;
    /* NUMA MoE: intermediate rows per dispatch unit (a multiple of the int4 group size), part
     * of the numerics; 0 = 128. moe_intermediate_size gives --numa off's bits exactly. */
    int32_t moe_slice;
    /* --requant: the lm_head, and the dense 16-bit linears (attention and DeltaNet projections
     * except the fp32 b/a gates, shared experts; never the router) requantised at load. */
    epyq_requant requant_lm_head, requant_dense;
    /* With the MTP head loaded: a requantised copy of the lm_head that MTP drafts read
     * (src/model/spec.c); verification always reads the lm_head itself. NONE = drafts read it. */
    epyq_requant draft_head;
    /* With a draft head: drafts pick among token ids [0, draft_vocab) only, and the draft head
     * holds just those rows (0 = the whole vocabulary). BPE ids are in merge order, roughly by
     * frequency, so the low ids carry most of the text; a token outside them is never drafted,
     * costs acceptance, never correctness (verification reads the whole exact head). */
    int32_t draft_vocab;
    /* Expert parallelism (above); NULL or size 1 = every expert here. Kept by pointer. */
    const epyq_ep *ep;
} epyq_model_opts;

typedef struct epyq_model epyq_model;
typedef struct epyq_seq epyq_seq;

epyq_status epyq_model_load(epyq_model **out, const char *dir, const epyq_model_opts *opts,
                            epyq_err *err);
void epyq_model_free(epyq_model *m);
const epyq_config *epyq_model_config(const epyq_model *m);
bool epyq_model_has_mtp(const epyq_model *m);
/* Whether the embedding table was copied into memory at load (the default when it fits with
 * EPYQ_EMBED_HEADROOM to spare; EPYQ_EMBED=resident|mapped decides instead) or its rows are
 * read from the checkpoint's mapping. */
bool epyq_model_embed_resident(const epyq_model *m);
int32_t epyq_model_threads(const epyq_model *m); /* pool size, caller included */
/* Change the numeric path / chunk threshold of a loaded model (tests, --path). */
void epyq_model_set_path(epyq_model *m, epyq_numpath path);
void epyq_model_set_gdn_chunk_min(epyq_model *m, int32_t min_tokens);
/* Small batches run each int4 expert in pieces spread over the pool (the default) or whole, one
 * expert per task; the logits are the same bits either way (tests, benchmarks). */
void epyq_model_set_moe_split(epyq_model *m, bool on);
/* Block timing of every forward call (prof.h): on resets the counters (false: out of memory),
 * off frees them; read gives the counts since the last reset (false while off). */
bool epyq_model_prof_enable(epyq_model *m, bool on);
bool epyq_model_prof_read(const epyq_model *m, epyq_prof *out);
/* Hold the counters (forward calls, block times, pool runs and waits) while paused, e.g. over a
 * benchmark's untimed context fill; a no-op while profiling is off. */
void epyq_model_prof_pause(epyq_model *m, bool pause);
/* Bytes of packed weights one token at batch 1 streams (for bandwidth figures): every
 * attention/DeltaNet projection, router, shared expert, top-k routed experts, lm_head. */
uint64_t epyq_model_active_bytes(const epyq_model *m);
/* Weight bytes the last epyq_model_forward() streamed: every projection, router and shared
 * expert, each routed expert its tokens chose once (a batch's distinct experts), and the
 * lm_head when logits were asked for. Batch 1 decode: close to epyq_model_active_bytes(). */
uint64_t epyq_model_last_bytes(const epyq_model *m);
/* The draft head's kind (NONE: drafts read the lm_head). */
epyq_requant epyq_model_draft_head(const epyq_model *m);
/* The token ids drafts pick among: [0, epyq_model_draft_vocab(m)) (the vocabulary size unless
 * opts.draft_vocab cut the draft head). */
int32_t epyq_model_draft_vocab(const epyq_model *m);
/* What --requant did: *lm_head / *dense as loaded (NONE where the linears are exact). */
void epyq_model_requant(const epyq_model *m, epyq_requant *lm_head, epyq_requant *dense);

/* A sequence: KV caches for n_ctx positions (trunk attention layers, plus the MTP layer when
 * the model has one), DeltaNet conv and fp32 recurrent states. n_ctx must be in
 * [1, max_position_embeddings]; memory is allocated for n_ctx, not for the maximum. */
epyq_status epyq_seq_create(epyq_seq **out, epyq_model *m, int32_t n_ctx, epyq_kv_type kv,
                            epyq_err *err);
void epyq_seq_free(epyq_seq *s);
/* Start over at position 0 (states zeroed; clears the mark a failed forward leaves). */
void epyq_seq_reset(epyq_seq *s);
int32_t epyq_seq_pos(const epyq_seq *s);
/* The offset between rotary and cache positions left by image tokens (0 for text; reset and a
 * restored snapshot set it to 0). */
int32_t epyq_seq_rope_delta(const epyq_seq *s);
int32_t epyq_seq_ctx(const epyq_seq *s);
/* Speculative verification: the next epyq_model_forward() feeds this sequence n tokens (1 ..
 * EPYQ_SPEC_MAX, the last accepted token and the drafts) and keeps a copy of the DeltaNet
 * states after each of them but the last (after that one the state itself is the copy):
 * n - 1 x the recurrent state, 63 MB each on the real model, allocated once. Then
 * epyq_seq_rollback(s, keep) keeps the first `keep` of those tokens: states as after token keep,
 * position = start + keep (attention KV past it is simply rewritten later). The rollback must
 * follow that forward; it ends the speculation either way. */
#define EPYQ_SPEC_MAX 8
epyq_status epyq_seq_spec_begin(epyq_seq *s, int32_t n, epyq_err *err);
epyq_status epyq_seq_rollback(epyq_seq *s, int32_t keep, epyq_err *err);
/* Bytes this sequence holds (KV + states). */
uint64_t epyq_seq_bytes(const epyq_seq *s);
/* Bytes a sequence of n_ctx positions would hold (KV + states), before creating it; *kv_bytes
 * (may be NULL) gets the KV cache's share. */
uint64_t epyq_model_seq_bytes(const epyq_model *m, int32_t n_ctx, epyq_kv_type kv, uint64_t *kv_bytes);

/* Prefix reuse (src/model/seq_state.c): a copy of a sequence at its current position —
 * position, KV rows [0, pos) of every attention layer (the MTP layer's too), DeltaNet conv and
 * fp32 recurrent states — in one in-memory buffer of epyq_seq_snapshot_size(s, pos) bytes.
 * Restoring it into any sequence of the same model and KV type with n_ctx >= pos puts that
 * sequence exactly where the copied one stood: feeding both the same tokens gives the same
 * logits bit for bit (tests/unit/test_seq_state.c). Real model shape: 62.9 MB of recurrent
 * state + 2.9 MB of conv state + 22.5 KB of bf16 KV per position (10 attention layers + MTP). */
uint64_t epyq_seq_snapshot_size(const epyq_seq *s, int32_t pos);
/* Writes epyq_seq_snapshot_size(s, epyq_seq_pos(s)) bytes to buf and returns that count. */
uint64_t epyq_seq_snapshot(const epyq_seq *s, void *buf);
/* The position a snapshot was taken at (-1: not a snapshot). */
int32_t epyq_seq_snapshot_pos(const void *buf);
/* Refused (nothing changed) for another model or KV type, pos > n_ctx or a wrong length. Any
 * speculative verification in progress ends (spec_n = 0). */
epyq_status epyq_seq_restore(epyq_seq *s, const void *buf, uint64_t len, epyq_err *err);
/* A copy that leaves the process (a chat session file, src/engine/session.c) carries no
 * pointer to the model it came from: detach clears it, and restore_detached accepts only such
 * a copy, with every size check of epyq_seq_restore. Whether it belongs to this model is the
 * file's business: epyq_model_identity is a hash of the configuration, every linear's name,
 * shape and storage, the first bytes of its data, and the requantisation settings. */
void epyq_seq_snapshot_detach(void *buf);
epyq_status epyq_seq_restore_detached(epyq_seq *s, const void *buf, uint64_t len, epyq_err *err);
uint64_t epyq_model_identity(const epyq_model *m);

/* A batch: token i belongs to seq[i] and sits at that sequence's next position; tokens of one
 * sequence appear in order (others may be interleaved between them). */
typedef struct {
    int32_t n;                  /* tokens */
    epyq_seq *const *seq;       /* [n] */
    const int32_t *tok;         /* [n] */
    const uint8_t *want;        /* [n] 1 = return this token's logits; NULL = all */
} epyq_batch;

/* Image input for a batch (docs/vision.md §4), both optional: embd[i] non-NULL replaces token
 * i's embedding row by that [hidden] row (an <|image_pad|>'s image features); mrope [n][3] gives
 * each token's (t, h, w) rotary positions for the attention layers. Without mrope a token at
 * position p rotates by p + its sequence's rope delta on all three axes; with it, the sequence's
 * delta becomes (largest position given + 1) - (its position after the batch), which is how
 * decoding continues after an image. The KV slot is always the position. */
typedef struct {
    const float *const *embd; /* [n] or NULL */
    const int32_t *mrope;     /* [n][3] or NULL */
} epyq_batch_img;

/* Run the batch. logits: [number of wanted tokens][vocab] in batch order (may be NULL);
 * hidden: [n][hidden] post-final-norm hidden of every token (the MTP input; may be NULL).
 * Nothing is changed when the batch is refused (EPYQ_E_CTX_FULL names the sequence's
 * position, tokens and context; EPYQ_E_ARG a bad token id, a foreign sequence or one marked
 * below). A failure after the layers started (EPYQ_E_NOMEM in a block or the lm_head) leaves
 * no position advanced but may leave some layers' states advanced: every sequence of that
 * batch is then marked, and every later forward or MTP call with it fails with EPYQ_E_ARG
 * naming the original error, until epyq_seq_reset(); the other sequences are untouched
 * (tests/failnth/test_failnth.c). */
epyq_status epyq_model_forward(epyq_model *m, const epyq_batch *b, float *logits, float *hidden,
                               epyq_err *err);
/* The same with image rows and M-RoPE positions (img may be NULL: epyq_model_forward). */
epyq_status epyq_model_forward_img(epyq_model *m, const epyq_batch *b, const epyq_batch_img *img,
                                   float *logits, float *hidden, epyq_err *err);

/* The MTP head (docs/architecture.md §5) over n rows of one sequence: row i = (hidden h [i][H],
 * token tok[i], RoPE position pos[i]); each row's K/V is stored in the sequence's MTP cache at
 * slot pos[i]; a row attends to slots [0, pos[i]], which earlier rows or calls filled.
 * logits: [n_logits][vocab] for the LAST n_logits rows (may be NULL / 0); h_out [n][H] the
 * post-mtp.norm hiddens (may be NULL). */
epyq_status epyq_model_mtp(epyq_model *m, epyq_seq *s, int32_t n, const float *h,
                           const int32_t *tok, const int32_t *pos, int32_t n_logits,
                           float *logits, float *h_out, epyq_err *err);

#endif
