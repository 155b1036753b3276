/* src/ref/ref_forward.h — the plain-C reference forward pass: the project's own oracle.
 *
 * Promise: a literal, readable transcription of docs/architecture.md §4 and §5 (trunk and
 * MTP head), one token at a time, with every weight decoded exactly to fp32
 * (epyq_linear_dequant) and every activation, norm, softmax, state and accumulation in double.
 * It shares no code with the optimised runtime in src/model/ beyond the loader, so the two can
 * be tested against each other. Memory is ~4 bytes per parameter: meant for small models
 * (fixtures, `epyq synth --shape tiny`), not for the full 35B checkpoint. */
#ifndef EPYQ_REF_FORWARD_H
#define EPYQ_REF_FORWARD_H

#include <stdint.h>

#include "load/weights.h"

typedef struct epyq_ref epyq_ref;

/* Decode every weight of `w` (kept referenced, not copied: w must outlive the result) and
 * allocate caches for n_ctx positions of one sequence. */
epyq_status epyq_ref_create(epyq_ref **out, const epyq_weights *w, int32_t n_ctx, epyq_err *err);
void epyq_ref_free(epyq_ref *r);

/* Forget the sequence (caches, DeltaNet states, MTP cache): the next token is position 0. */
void epyq_ref_reset(epyq_ref *r);
/* Number of tokens the trunk has consumed (= position of the next token). */
int32_t epyq_ref_pos(const epyq_ref *r);

/* Feed one token at position epyq_ref_pos(). logits [V] and hidden [H] (the post-final-norm
 * hidden, the MTP head's input) may each be NULL. Fails with EPYQ_E_CTX_FULL past n_ctx and
 * EPYQ_E_ARG for a token outside the vocabulary. */
epyq_status epyq_ref_forward(epyq_ref *r, int32_t token, double *logits, double *hidden,
                             epyq_err *err);

/* One MTP row (docs/architecture.md §5): hidden h [H], token x, RoPE position pos; appends to the
 * MTP layer's own KV cache. logits [V] and h_out [H] (after mtp.norm) may be NULL. Fails with
 * EPYQ_E_ARG when the checkpoint has no MTP head. */
epyq_status epyq_ref_mtp(epyq_ref *r, const double *h, int32_t token, int32_t pos, double *logits,
                         double *h_out, epyq_err *err);

#endif
