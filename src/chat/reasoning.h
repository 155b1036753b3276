/* src/chat/reasoning.h — split generated text into reasoning (<think>…</think>) and answer,
 * incrementally, as vLLM's `qwen3` reasoning parser does in streaming mode.
 *
 * Promise: text may be pushed in chunks cut anywhere (inside a tag, inside a UTF-8 sequence);
 * the concatenated output is the same as for one chunk. Rules:
 *  - starts_in_reasoning (the prompt left <think> open, see epyq_chat_prompt_opens_think):
 *    everything up to the first "</think>" is reasoning, the rest is answer; a "<think>" at
 *    the very start of the output (the model repeating the tag) is dropped.
 *  - otherwise: if the output starts with "<think>", what follows up to "</think>" is
 *    reasoning; else everything is answer.
 *  - the tags themselves are emitted to neither side; text is not trimmed (the answer usually
 *    begins with the "\n\n" the model writes after </think>, as in vLLM).
 *  - output that ends inside reasoning (no "</think>") stays reasoning, as vLLM streams it. */
#ifndef EPYQ_REASONING_H
#define EPYQ_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"
#include "tok/sbuf.h"

typedef struct epyq_reasoning epyq_reasoning;

epyq_reasoning *epyq_reasoning_new(bool starts_in_reasoning);
/* Appends the newly decided text to *reasoning and *content (either may get nothing). Fails
 * only when a buffer cannot grow (EPYQ_E_NOMEM). */
epyq_status epyq_reasoning_push(epyq_reasoning *p, const char *text, size_t len,
                                epyq_sbuf *reasoning, epyq_sbuf *content, epyq_err *err);
/* End of generation: releases text held back because it might have started a tag. */
epyq_status epyq_reasoning_finish(epyq_reasoning *p, epyq_sbuf *reasoning, epyq_sbuf *content,
                                  epyq_err *err);
/* True while the parser is inside the reasoning block. */
bool epyq_reasoning_active(const epyq_reasoning *p);
void epyq_reasoning_free(epyq_reasoning *p);

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag (text to hold back
 * in case the tag continues in the next chunk). Shared with the tool-call parser. */
size_t epyq_tag_partial_suffix(const char *s, size_t n, const char *tag);

#endif
