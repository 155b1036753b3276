/* src/tok/tokenizer.h — Hugging Face tokenizer.json byte-level BPE (Qwen3.6 pipeline).
 *
 * Promise: ids identical to HF `tokenizers` encode(text, add_special_tokens=False) for
 * everything loaded from tokenizer.json (+ tokenizer_config.json): added/special tokens matched
 * first, NFC, the Split pre-tokenizer regex (PCRE2, Unicode properties), ByteLevel, BPE by merge
 * rank. Decoding maps ids -> bytes -> UTF-8 with U+FFFD for invalid sequences exactly as the
 * reference; the streaming decoder never emits half a UTF-8 sequence.
 *
 * Input text that is not valid UTF-8 is first made valid the way Rust's String::from_utf8_lossy
 * does (one U+FFFD per maximal ill-formed subsequence), since the reference only ever sees
 * Rust strings. Known, documented divergences come only from Unicode-version tables:
 * the reference's NFC uses Unicode 9.0 data, utf8proc here newer data; the reference's regex
 * engine (Oniguruma) knows Unicode 16 letters/digits/marks, PCRE2 its own version
 * (see src/tok/README.md).
 *
 * A loaded epyq_tok is immutable except for its word cache, which is guarded internally, so
 * one tokenizer may be used from several threads at once. */
#ifndef EPYQ_TOKENIZER_H
#define EPYQ_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct epyq_tok epyq_tok;

typedef struct {
    /* Also register the added tokens that only tokenizer_config.json declares (its
     * added_tokens_decoder entries missing from tokenizer.json), as `transformers` does.
     * false (the default of epyq_tok_load) = plain `tokenizers` on tokenizer.json. */
    bool config_added_tokens;
    /* Entries of the per-word BPE cache; 0 disables it (benchmarks compare both). */
    size_t word_cache_entries;
} epyq_tok_opts;

/* The options epyq_tok_load uses. */
epyq_tok_opts epyq_tok_opts_default(void);

/* dir holds tokenizer.json (and optionally tokenizer_config.json / chat_template.jinja). */
epyq_status epyq_tok_load(epyq_tok **out, const char *dir, epyq_err *err);
epyq_status epyq_tok_load_opts(epyq_tok **out, const char *dir, const epyq_tok_opts *opts, epyq_err *err);
void epyq_tok_free(epyq_tok *t);

int32_t epyq_tok_vocab_size(const epyq_tok *t);           /* 1 + largest id */

/* Flags for epyq_tok_encode_ex. */
enum {
    /* Treat special added tokens (special=true) as plain text, like HF's
     * split_special_tokens / encode_special_tokens: for user text that must not inject
     * control tokens. Non-special added tokens (<think>, <tool_call>, ...) still match. */
    EPYQ_TOK_ENC_SPLIT_SPECIAL = 1u << 0,
};

/* Encode len bytes of text. *ids is malloc'd (caller frees; non-NULL even when *n_ids == 0). */
epyq_status epyq_tok_encode(const epyq_tok *t, const char *text, size_t len, int32_t **ids,
                            size_t *n_ids, epyq_err *err);
epyq_status epyq_tok_encode_ex(const epyq_tok *t, const char *text, size_t len, unsigned flags,
                               int32_t **ids, size_t *n_ids, epyq_err *err);
/* Decode ids to a malloc'd NUL-terminated UTF-8 string. Ids with no token decode to nothing,
 * as in the reference. */
epyq_status epyq_tok_decode(const epyq_tok *t, const int32_t *ids, size_t n, bool skip_special,
                            char **out, size_t *out_len, epyq_err *err);
/* Token id of an exact token string (e.g. "<|im_end|>", or a vocabulary entry in its byte-level
 * spelling such as "Ġthe"), or -1. */
int32_t epyq_tok_id(const epyq_tok *t, const char *token);
/* true for added tokens flagged special=true (the ones skip_special drops). */
bool epyq_tok_is_special(const epyq_tok *t, int32_t id);
/* The chat template string from tokenizer_config.json (or chat_template.jinja), or NULL. */
const char *epyq_tok_chat_template(const epyq_tok *t);
/* eos_token / pad_token of tokenizer_config.json as ids, or -1 when absent. */
int32_t epyq_tok_eos_id(const epyq_tok *t);
int32_t epyq_tok_pad_id(const epyq_tok *t);

/* Streaming decoder: feed ids one at a time; emits only complete UTF-8. The concatenation of
 * everything push and finish return equals epyq_tok_decode of all the ids. */
typedef struct epyq_tok_stream epyq_tok_stream;
epyq_tok_stream *epyq_tok_stream_new(const epyq_tok *t, bool skip_special);
/* Appends the newly printable text to *out (malloc'd, NUL-terminated; "" when nothing yet). */
epyq_status epyq_tok_stream_push(epyq_tok_stream *s, int32_t id, char **out, epyq_err *err);
/* Flush what is left at the end of the stream (incomplete sequences become U+FFFD). */
epyq_status epyq_tok_stream_finish(epyq_tok_stream *s, char **out, epyq_err *err);
/* The same with the byte length of *out, for text that may contain U+0000. */
epyq_status epyq_tok_stream_push_n(epyq_tok_stream *s, int32_t id, char **out, size_t *out_len, epyq_err *err);
epyq_status epyq_tok_stream_finish_n(epyq_tok_stream *s, char **out, size_t *out_len, epyq_err *err);
void epyq_tok_stream_free(epyq_tok_stream *s);

#endif
