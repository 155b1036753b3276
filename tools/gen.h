/* tools/gen.h — one sequence's generation loop, shared by `epyq run` and `epyq chat`.
 *
 * Promise: epyq_gen_generate() prefills the prompt ids (in chunks of at most `chunk` tokens),
 * then samples up to max_new tokens with the session's sampler, stopping at an eos id, at the
 * context end, or when *cancel becomes non-zero (checked before every token: Ctrl-C stops at
 * the next token boundary). Every generated token's text goes to on_text as soon as it forms
 * complete UTF-8 (streaming decoder; special tokens are not printed). Afterwards the sequence
 * holds the prompt and every generated token except the last one sampled (which was never fed
 * back), so a caller that continues the conversation feeds that token first. */
#ifndef EPYQ_TOOLS_GEN_H
#define EPYQ_TOOLS_GEN_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "model/sample.h"
#include "tok/tokenizer.h"

/* Sampling values a user or a request set on top of generation_config.json; a negative value
 * keeps the checkpoint's default (seed always applies). Shared by run, chat and batch. */
typedef struct {
    double temperature, top_p, min_p, repetition_penalty, presence_penalty;
    int64_t top_k;
    uint64_t seed;
} epyq_sample_overrides;

/* generation_config defaults (epyq_sample_defaults) with the overrides applied. */
void epyq_sample_overrides_apply(const epyq_sample_overrides *o, const epyq_config *cfg,
                                 epyq_sample_params *out);

typedef struct {
    epyq_model *model;       /* not owned */
    const epyq_tok *tok;     /* not owned */
    epyq_seq *seq;           /* owned */
    epyq_sample_params sp;
    int32_t chunk;           /* prefill chunk (tokens per forward call) */
    int32_t spec_k;          /* > 0: MTP speculative decoding with spec_k drafts a step (one-shot
                                generations only: the sequence then also holds verified tokens
                                past a stop, so it is not continued) */
    /* Prompt checkpoints (issue 15, `epyq chat`): with cache set, the prefill of
     * epyq_gen_generate_from cuts its chunks at every multiple of cache_every positions and at
     * each of marks[0, n_marks), and keeps a copy of the state there in the cache (the
     * engine's src/engine/prefix.c), keyed by the prompt ids before it. Unused by speculation. */
    struct epyq_prefix *cache;
    int32_t cache_every;
    int32_t marks[4], n_marks;
    /* Image rows and M-RoPE positions for the ids of the next epyq_gen_generate (index i of
     * embd / mrope belongs to prompt token i); NULL = a text prompt. Not with spec_k. */
    const epyq_batch_img *img;
    /* With spec_k: the speculation rule's clock (epyq_spec_opts.clock); NULL = the wall clock.
     * --ep gives every rank rank 0's, so all ranks take the same decisions. */
    double (*clock)(void *ctx);
    void *clock_ctx;
} epyq_gen;

typedef enum { EPYQ_FINISH_STOP = 0, EPYQ_FINISH_LENGTH, EPYQ_FINISH_CTX, EPYQ_FINISH_CANCEL } epyq_finish;
const char *epyq_finish_name(epyq_finish f); /* "stop", "length", "context", "cancelled" */

typedef struct {
    int32_t n_prompt, n_gen; /* n_prompt: prompt tokens computed (fed) */
    int32_t n_cached;        /* prompt tokens already in the sequence (the `from` of _from) */
    double t_prompt, t_gen;  /* seconds */
    double t_first;          /* seconds from the call to the first sampled token */
    epyq_finish finish;
    int64_t spec_steps, spec_emitted;      /* speculative: verify steps, tokens they emitted */
    int64_t spec_accepted[8];              /* [i] steps whose draft i + 1 was accepted */
} epyq_gen_stats;

epyq_status epyq_gen_init(epyq_gen *g, epyq_model *m, const epyq_tok *t, int32_t n_ctx, epyq_kv_type kv,
                          const epyq_sample_params *sp, epyq_err *err);
void epyq_gen_free(epyq_gen *g);

/* on_text(ctx, text, len) gets every printable piece; gen_ids (may be NULL) receives the generated
 * ids (room for max_new). */
epyq_status epyq_gen_generate(epyq_gen *g, const int32_t *ids, size_t n_ids, int32_t max_new,
                              volatile sig_atomic_t *cancel,
                              void (*on_text)(void *ctx, const char *text, size_t len), void *ctx,
                              int32_t *gen_ids, epyq_gen_stats *st, epyq_err *err);
/* The same for a sequence that already holds ids[0, from) (restored or kept from an earlier
 * turn): only ids[from, n_ids) are fed, but the sampler's penalties see the whole prompt, so
 * the answer is the one a fresh sequence fed all n_ids would give. */
epyq_status epyq_gen_generate_from(epyq_gen *g, const int32_t *ids, size_t n_ids, size_t from,
                                   int32_t max_new, volatile sig_atomic_t *cancel,
                                   void (*on_text)(void *ctx, const char *text, size_t len),
                                   void *ctx, int32_t *gen_ids, epyq_gen_stats *st, epyq_err *err);

#endif
