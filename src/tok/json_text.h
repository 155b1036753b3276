/* src/tok/json_text.h — reading JSON text without a tree: one string field of a JSON line
 * (NUL bytes included), and a cursor for the loader's big objects.
 *
 * Promise: cJSON stores strings NUL-terminated, so a "\u0000" escape silently cuts the text;
 * tokenizer inputs may contain NUL (the golden corpus does). This reader validates that the
 * whole input is one well-formed JSON object (RFC 8259: no trailing commas, no raw control
 * characters, valid UTF-8, no lone surrogate escapes) and decodes the string value of one
 * top-level key into exact bytes. */
#ifndef EPYQ_TOK_JSON_TEXT_H
#define EPYQ_TOK_JSON_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tok/sbuf.h"

#include "core/status.h"

/* *found = false (and *out = NULL) when the object has no such key; a key whose value is not
 * a string is an error. On error err says "byte N: expected ..., found ...". *out is
 * malloc'd and NUL-terminated (the length counts any inner NULs). */
epyq_status epyq_json_text_field(const char *text, size_t len, const char *key, char **out, size_t *out_len,
                                 bool *found, epyq_err *err);

/* A cursor over JSON text for the loader's big arrays and objects (tokenizer.json's vocab and
 * merges), read without building a tree. Every call skips leading whitespace; errors name the
 * byte offset. */
typedef struct {
    const uint8_t *s; /* [n] the text */
    size_t n, i;      /* i = current offset */
    epyq_err *err;
} epyq_json_reader;

/* Consume c if it is the next character. */
bool epyq_json_read_char(epyq_json_reader *r, char c);
/* A string value, decoded into out (replacing its content). */
epyq_status epyq_json_read_string(epyq_json_reader *r, epyq_sbuf *out);
/* An integer in [lo, hi]. */
epyq_status epyq_json_read_int(epyq_json_reader *r, int64_t lo, int64_t hi, int64_t *out);
/* Byte span [*start, *end) of the value at the key path (path[0] in the root object, path[1]
 * inside that, ...); *found = false when a key is missing. Values skipped on the way are
 * validated; the rest of the text is not looked at. */
epyq_status epyq_json_find(const char *text, size_t len, const char *const *path, size_t depth, size_t *start,
                           size_t *end, bool *found, epyq_err *err);

#endif
