/* src/model/spec.h — MTP speculative decoding of one sequence.
 *
 * Promise: a step drafts k tokens with the MTP head (greedy argmax of its logits, through the
 * draft head when one is loaded), verifies the last accepted token and the k drafts in one
 * trunk forward, and emits the tokens the caller's pick function chooses position by position
 * up to the first draft it does not reproduce (1 .. k + 1 tokens a step). DeltaNet states roll
 * back to the last kept token (epyq_seq_rollback), the MTP cache is refilled from the kept
 * positions. So with a greedy pick the output is token for token the non-speculative greedy
 * output; with a sampling pick (draw x ~ P, accept the draft d when x == d, else emit x) a
 * draft is accepted with probability P(d) and a rejection emits a draw from P with d removed
 * and renormalised: the standard rule for a one-hot draft, so the output distribution is the
 * model's (tests/unit/test_model_spec.c).
 *
 * `forced` (benchmarks only) accepts every draft: the cost of a fully accepted step, with
 * outputs that are not the model's. */
#ifndef EPYQ_SPEC_H
#define EPYQ_SPEC_H

#include "model/model.h"

/* Next token from one row of logits [vocab]; called in output order, once per emitted token. */
typedef int32_t (*epyq_spec_pick_fn)(void *ctx, const float *logits);

typedef struct {
    int32_t k;    /* drafts per step, 1 .. EPYQ_SPEC_MAX - 1 */
    bool forced;  /* benchmark only: every draft accepted */
    /* Tests: replace the MTP's draft `d` for the token at position `pos` (NULL = keep it), so a
     * test can make drafts right or wrong at will and reach every acceptance length. */
    int32_t (*draft_override)(void *ctx, int32_t pos, int32_t d);
    void *override_ctx;
    /* Adaptive: measure the time per emitted token of speculative steps against plain
     * one-token steps and run whichever is faster; when plain wins, it runs for a stretch that
     * doubles each time speculation loses again (64 .. 4096 tokens), then speculation is
     * probed anew (the MTP cache first catches up on the plain stretch in one pass). A probe
     * is 8 speculative steps, cut to 2 when neither kept a draft (such a window cannot win).
     * So at near-zero acceptance the cost converges on plain decoding's. Ignored when forced. */
    bool adaptive;
    /* Tests: the adaptive rule's clock in seconds (NULL = the wall clock), so a test can give
     * drafting and plain steps known costs instead of this machine's timings. */
    double (*clock)(void *ctx);
    void *clock_ctx;
} epyq_spec_opts;

typedef struct {
    int64_t steps;                       /* verification forwards */
    int64_t emitted;                     /* tokens emitted by steps */
    int64_t accepted[EPYQ_SPEC_MAX];     /* [i] steps whose draft i + 1 was accepted */
    int64_t plain;                       /* adaptive: tokens decoded without drafts */
    int64_t switches;                    /* adaptive: changes between the two modes */
    double t_draft, t_verify, t_rollback; /* seconds in each phase */
} epyq_spec_stats;

typedef struct epyq_spec epyq_spec;

/* The model must have its MTP head loaded; s is an empty sequence of m. */
epyq_status epyq_spec_create(epyq_spec **out, epyq_model *m, epyq_seq *s, const epyq_spec_opts *o,
                             epyq_err *err);
void epyq_spec_free(epyq_spec *sp);
/* Feed the prompt (n >= 1 tokens), pick the first generated token into *first (not yet fed)
 * and prime the MTP cache. */
epyq_status epyq_spec_prefill(epyq_spec *sp, const int32_t *prompt, int32_t n, epyq_spec_pick_fn pick,
                              void *ctx, int32_t *first, epyq_err *err);
/* One step: out [k + 1] receives *n_out tokens (1 .. k + 1; 1 in an adaptive plain stretch), in
 * order; the last one is not yet fed (the next step feeds it). Refused with EPYQ_E_CTX_FULL when k + 1 more positions do not
 * fit (the caller then finishes without speculation or stops). */
epyq_status epyq_spec_step(epyq_spec *sp, epyq_spec_pick_fn pick, void *ctx, int32_t *out,
                           int32_t *n_out, epyq_err *err);
const epyq_spec_stats *epyq_spec_get_stats(const epyq_spec *sp);

/* The same step in two halves, for a caller that runs the trunk forward itself (the engine puts
 * many sequences' rows into one call; epyq_spec_step is rows + forward + take):
 *  - epyq_spec_rows: the tokens rows [*n_rows] (1: a plain step; k + 1: the last picked token
 *    and its drafts, with the sequence's snapshots begun) to feed this sequence next, at
 *    positions epyq_seq_pos .. + *n_rows - 1;
 *  - the caller's forward feeds exactly them, asking for every row's logits and hidden;
 *  - epyq_spec_take: those rows' logits [n_rows][V] and hiddens [n_rows][H]; picks, rolls back
 *    and emits as epyq_spec_step does. If the forward failed, epyq_spec_abandon instead. */
epyq_status epyq_spec_rows(epyq_spec *sp, int32_t *rows, int32_t *n_rows, epyq_err *err);
epyq_status epyq_spec_take(epyq_spec *sp, const float *logits, const float *hid,
                           epyq_spec_pick_fn pick, void *ctx, int32_t *out, int32_t *n_out,
                           epyq_err *err);
void epyq_spec_abandon(epyq_spec *sp);
/* A prompt fed by the caller's own forward calls: after each chunk, its rows' hiddens hid [n][H]
 * with tok [n] the token after each row (the next prompt token; for the prompt's last row the
 * first generated token, picked by the caller) at positions pos0 .. pos0 + n - 1. Chunks in
 * order; `last` marks the one that ends the prompt (it drafts d1 and makes tok[n - 1] the
 * token the first step feeds). Replaces epyq_spec_prefill. */
epyq_status epyq_spec_prompt(epyq_spec *sp, const float *hid, const int32_t *tok, int32_t n,
                             int32_t pos0, bool last, epyq_err *err);

#endif
