/* src/model/sample.h — choosing the next token from logits.
 *
 * Promise: the usual chain, in vLLM/HF order — repetition penalty (over every token seen,
 * prompt included), presence and frequency penalties (over generated tokens), temperature, top-k, top-p,
 * min-p — then one draw from a seeded generator, so a given seed and logits always give the
 * same token. temperature <= 0 means greedy (argmax, ties to the lowest id, after penalties).
 * Defaults come from generation_config.json (do_sample false or absent → greedy). */
#ifndef EPYQ_SAMPLE_H
#define EPYQ_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "load/model_config.h"

typedef struct {
    float temperature;         /* <= 0: greedy */
    int32_t top_k;             /* 0: off */
    float top_p;               /* >= 1: off */
    float min_p;               /* 0: off */
    float presence_penalty;    /* 0: off; subtracted once from every generated token's logit */
    float repetition_penalty;  /* 1: off; seen tokens: positive logits divided, negative multiplied */
    uint64_t seed;
    float frequency_penalty;   /* 0: off; subtracted once per earlier generation of the token */
} epyq_sample_params;

/* generation_config.json values (greedy when do_sample is false), seed 0. */
void epyq_sample_defaults(epyq_sample_params *p, const epyq_config *c);

typedef struct epyq_sampler epyq_sampler;

epyq_status epyq_sampler_create(epyq_sampler **out, const epyq_sample_params *p, int32_t vocab,
                                epyq_err *err);
void epyq_sampler_free(epyq_sampler *s);
/* Record a token of the sequence (prompt: generated = false) for the penalties. */
void epyq_sampler_accept(epyq_sampler *s, int32_t tok, bool generated);
/* Pick the next token; logits [vocab] are not modified. */
int32_t epyq_sampler_sample(epyq_sampler *s, const float *logits);

/* The first index of the largest of v[0, n): ties go to the lower index, NaNs never win
 * (unless v[0] is NaN: then 0); 0 when n <= 0. */
int32_t epyq_argmax(const float *v, int32_t n);
/* True when tok is one of the configured eos ids (generation_config, else config). */
bool epyq_is_eos(const epyq_config *c, int32_t tok);

#endif
