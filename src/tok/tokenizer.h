/* src/tok/tokenizer.h — Hugging Face tokenizer.json byte-level BPE (Qwen3.6 pipeline).
 *
 * Promise: ids identical to HF `tokenizers` encode(text, add_special_tokens=False) for
 * everything loaded from tokenizer.json (+ tokenizer_config.json): added/special tokens matched
 * first, NFC, the Split pre-tokenizer regex (PCRE2, Unicode properties), ByteLevel, BPE by merge
 * rank. Decoding maps ids -> bytes -> UTF-8 with U+FFFD for invalid sequences exactly as the
 * reference; the streaming decoder never emits half a UTF-8 sequence. */
#ifndef EPYQ_TOKENIZER_H
#define EPYQ_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct epyq_tok epyq_tok;

/* dir holds tokenizer.json (and optionally tokenizer_config.json). */
epyq_status epyq_tok_load(epyq_tok **out, const char *dir, epyq_err *err);
void epyq_tok_free(epyq_tok *t);

int32_t epyq_tok_vocab_size(const epyq_tok *t);           /* 1 + largest id */
/* Encode len bytes of text. *ids is malloc'd (caller frees). */
epyq_status epyq_tok_encode(const epyq_tok *t, const char *text, size_t len, int32_t **ids,
                            size_t *n_ids, epyq_err *err);
/* Decode ids to a malloc'd NUL-terminated UTF-8 string. */
epyq_status epyq_tok_decode(const epyq_tok *t, const int32_t *ids, size_t n, bool skip_special,
                            char **out, size_t *out_len, epyq_err *err);
/* Token id of an exact token string (e.g. "<|im_end|>"), or -1. */
int32_t epyq_tok_id(const epyq_tok *t, const char *token);
bool epyq_tok_is_special(const epyq_tok *t, int32_t id);
/* The chat template string from tokenizer_config.json (or chat_template.jinja), or NULL. */
const char *epyq_tok_chat_template(const epyq_tok *t);

/* Streaming decoder: feed ids one at a time; emits only complete UTF-8. */
typedef struct epyq_tok_stream epyq_tok_stream;
epyq_tok_stream *epyq_tok_stream_new(const epyq_tok *t, bool skip_special);
/* Appends the newly printable text to *out (malloc'd, NUL-terminated; "" when nothing yet). */
epyq_status epyq_tok_stream_push(epyq_tok_stream *s, int32_t id, char **out, epyq_err *err);
/* Flush what is left at the end of the stream (incomplete sequences become U+FFFD). */
epyq_status epyq_tok_stream_finish(epyq_tok_stream *s, char **out, epyq_err *err);
void epyq_tok_stream_free(epyq_tok_stream *s);

#endif
