/* src/engine/engine.h — the continuous-batching scheduler shared by `epyq batch` and
 * `epyq serve`: requests are admitted while there are free slots, their prompts are fed in
 * chunks and every running request's decode step goes into the same forward call.
 *
 * Promise: every epyq_engine_step() makes one epyq_model_forward() call carrying, in admission
 * order, the next prompt chunk of the requests still prefilling (at most opts.chunk prompt
 * tokens over all of them) and one decode token of every other request. Each request has its
 * own sampler, its own stop rules (eos ids, stop strings, max_tokens, the context limit) and
 * its own streaming detokenizer; its tokens depend only on its prompt and parameters, never on
 * which requests share its steps (the model's batch-independence, src/model/model.h), nor on
 * whether its prompt prefix was restored from the prefix cache (opts.cache_bytes; a request may
 * then wait a few steps for an earlier one's copy, or start past the copied prefix). A
 * request's events arrive through its callbacks, on the thread that calls step: text that
 * became final (stop strings are held back until they can no longer start), the token and,
 * when asked for, its log-probabilities; then exactly one on_done. epyq_engine_cancel() ends a
 * request at any point and frees its sequence at once.
 *
 * One engine is driven by one thread at a time (the model's rule), and not from inside its own
 * callbacks (they run in the middle of a step); src/engine/runner.h puts one behind a thread
 * and a queue. */
#ifndef EPYQ_ENGINE_H
#define EPYQ_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/model.h"
#include "model/sample.h"
#include "tok/tokenizer.h"

#define EPYQ_ENGINE_MAX_TOP 20   /* top_logprobs at most (OpenAI's limit) */
#define EPYQ_ENGINE_MAX_STOP 8   /* stop strings per request */

typedef struct {
    int32_t max_seqs;  /* requests decoded together (slots) */
    int32_t chunk;     /* prompt tokens per forward call over all requests */
    int32_t ctx_limit; /* per request: prompt + generated tokens */
    epyq_kv_type kv;
    /* Prefix reuse (src/engine/prefix.h): 0 = off. Otherwise the prompt state is copied at
     * every multiple of cache_every tokens (prompt chunks are cut there) and at the end of each
     * prompt, kept under cache_bytes (LRU); a request starts from the longest cached prefix of
     * its prompt (at most all but its last token, whose logits it needs) and feeds the rest.
     * A request whose prompt shares at least cache_every tokens with one admitted before it and
     * still prefilling waits for that one's copy instead of computing the same prefix beside it
     * (that one also copies its state where their shared part ends, off the cache_every grid).
     * Requests with prompt_logprobs neither use nor fill the cache (they need every row's
     * logits). Outputs are the same bits with the cache on or off (tests/unit/test_prefix.c). */
    uint64_t cache_bytes;
    int32_t cache_every; /* <= 0 with cache_bytes > 0: 256 */
    /* MTP speculative decoding (src/model/spec.h), per request: 0 = off, else drafts per step
     * (the model must have its MTP head). A decoding request then puts its last token and its
     * spec_k drafts into the step's forward call (k + 1 rows instead of 1) and emits 1 .. k + 1
     * tokens; prompt chunks also fill its MTP cache. Outputs are the same as without: greedy
     * token for token, sampling draw for draw (each emitted token is one draw of its sampler).
     * spec_adaptive: each request runs plain steps while drafting does not pay it (spec.h's
     * rule, timed over whole engine steps). Requests with prompt_logprobs decode plainly. */
    int32_t spec_k;
    bool spec_adaptive;
    /* The adaptive rule's clock (spec.h: clock); NULL = the wall clock. `batch --ep` passes rank
     * 0's, so every rank of one model takes the same decisions (tools/ep_mpi.h). */
    double (*spec_clock)(void *ctx);
    void *spec_clock_ctx;
    /* Tests: every speculating request's drafts pass through this (spec.h: draft_override). */
    int32_t (*spec_draft_override)(void *ctx, int32_t pos, int32_t d);
    void *spec_override_ctx;
} epyq_engine_opts;

typedef enum {
    EPYQ_ENGINE_STOP = 0,  /* an eos id or a stop string */
    EPYQ_ENGINE_LENGTH,    /* max_tokens, or the context limit */
    EPYQ_ENGINE_CANCELLED, /* epyq_engine_cancel */
    EPYQ_ENGINE_ERROR,     /* the forward call failed (the message is in on_done's err) */
} epyq_engine_finish;

/* "stop", "length", "cancelled", "error". */
const char *epyq_engine_finish_name(epyq_engine_finish f);

typedef struct {
    int32_t tok;                         /* the token this entry is about */
    float logprob;                       /* log-softmax of the model's raw logits */
    int32_t n_top;                       /* entries in top_* */
    int32_t top_ids[EPYQ_ENGINE_MAX_TOP];
    float top_lp[EPYQ_ENGINE_MAX_TOP];   /* descending, ties to the lower id */
} epyq_engine_logprob;

typedef struct {
    /* A generated token (prompt = false): tok, text that became final with it (may be empty).
     * With prompt_logprobs, every prompt token from the second one on first arrives with
     * prompt = true and no text. The final flush at the end of a request (text the
     * detokenizer or a stop-string prefix held back) comes with tok = -1. */
    bool prompt;
    int32_t tok;
    const char *text;
    size_t len;
    const epyq_engine_logprob *lp;       /* NULL unless the request asked for logprobs */
} epyq_engine_event;

typedef struct {
    int32_t n_prompt, n_gen;
    int32_t n_cached; /* prompt tokens restored from the prefix cache, not computed */
} epyq_engine_usage;

typedef struct {
    void (*on_event)(void *ctx, const epyq_engine_event *ev);
    /* Last call for the request; err is non-NULL only for EPYQ_ENGINE_ERROR. */
    void (*on_done)(void *ctx, epyq_engine_finish finish, const epyq_engine_usage *u,
                    const epyq_err *err);
    void *ctx;
} epyq_engine_cb;

typedef struct {
    int32_t max_tokens;                  /* clamped to the context limit (finish "length") */
    epyq_sample_params sp;
    const char *stop[EPYQ_ENGINE_MAX_STOP]; /* copied at add */
    int32_t n_stop;
    int32_t logprobs;                    /* < 0: none; else this many alternatives (<= 20) */
    bool prompt_logprobs;                /* logprobs of the prompt tokens too (echo) */
    bool ignore_eos;                     /* go on past eos ids (benchmarks: fixed lengths) */
} epyq_engine_params;

typedef struct epyq_engine epyq_engine;

/* A request's images (docs/vision.md §4): the tower's rows of its <|image_pad|> tokens, in prompt
 * order, and the (t, h, w) M-RoPE positions of every prompt token (src/vision/prompt.h builds
 * both). Borrowed by epyq_engine_add_img, which copies them. */
typedef struct {
    int32_t image_token_id; /* the pad id whose embedding the rows replace */
    int32_t n_rows, hidden; /* rows = pads in the prompt; hidden = the text hidden size */
    const float *rows;      /* [n_rows][hidden] */
    const int32_t *pos;     /* [n_ids][3] */
} epyq_engine_img;

/* model and tok are borrowed and must outlive the engine. */
epyq_status epyq_engine_create(epyq_engine **out, epyq_model *m, const epyq_tok *tok,
                               const epyq_engine_opts *opts, epyq_err *err);
/* Frees every request still in it without calling its callbacks. */
void epyq_engine_free(epyq_engine *e);

/* Admit a request (ids copied). EPYQ_E_ARG: no free slot, an empty prompt or bad parameters;
 * EPYQ_E_CTX_FULL: the prompt leaves no room to generate. *id names it for cancel. */
epyq_status epyq_engine_add(epyq_engine *e, const int32_t *ids, size_t n_ids,
                            const epyq_engine_params *p, const epyq_engine_cb *cb, uint64_t *id,
                            epyq_err *err);
/* The same with images (img may be NULL: epyq_engine_add). An image request never uses or fills
 * the prefix cache (pads are the same ids for different images) and decodes without
 * speculation even when opts.spec_k is set (drafts would need its rope delta in the MTP head);
 * its prompt rows go through epyq_model_forward_img with their image rows and positions, also
 * when a chunk cuts an image, and its decode tokens rotate by the sequence's rope delta.
 * EPYQ_E_ARG when the pads, the rows, the hidden size or the positions do not agree. */
epyq_status epyq_engine_add_img(epyq_engine *e, const int32_t *ids, size_t n_ids,
                                const epyq_engine_img *img, const epyq_engine_params *p,
                                const epyq_engine_cb *cb, uint64_t *id, epyq_err *err);
/* One forward call over every running request, then their samples and events. A failed
 * forward call ends every request it carried with EPYQ_ENGINE_ERROR and returns the error;
 * the engine stays usable. No-op without running requests. */
epyq_status epyq_engine_step(epyq_engine *e, epyq_err *err);
/* End a request now (on_done with EPYQ_ENGINE_CANCELLED); false when it is not running. */
bool epyq_engine_cancel(epyq_engine *e, uint64_t id);

int32_t epyq_engine_active(const epyq_engine *e);  /* running requests */
int32_t epyq_engine_free_slots(const epyq_engine *e);

typedef struct {
    uint64_t prompt_tokens, gen_tokens;  /* totals fed / sampled */
    uint64_t cached_tokens;              /* prompt tokens restored from the prefix cache */
    /* the prefix cache now (all 0 when off): bytes held and allowed, entries, and totals of
     * entries evicted to stay in the budget */
    uint64_t cache_bytes, cache_budget, cache_entries, cache_evicted;
    /* forward seconds, each step's split over its prompt and decode tokens by their counts */
    double prompt_s, decode_s;
    uint64_t kv_bytes;                   /* held by the running requests' sequences now */
    uint64_t steps;
    /* speculative decoding (opts.spec_k), summed over finished requests: verify steps, tokens
     * they emitted, steps whose draft i + 1 was accepted, plain steps of adaptive stretches */
    uint64_t spec_steps, spec_emitted, spec_accepted[EPYQ_SPEC_MAX], spec_plain;
} epyq_engine_stats;
void epyq_engine_get_stats(const epyq_engine *e, epyq_engine_stats *st);

/* Log-softmax entry of one logits row (what the logprobs events carry). */
void epyq_engine_logprob_of(const float *logits, int32_t vocab, int32_t tok, int32_t n_top,
                            epyq_engine_logprob *out);

#endif
