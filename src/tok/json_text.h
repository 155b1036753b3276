/* src/tok/json_text.h — reading one text field out of a JSON line, NUL bytes included.
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

#include "core/status.h"

/* *found = false (and *out = NULL) when the object has no such key; a key whose value is not
 * a string is an error. On error err says "byte N: expected ..., found ...". *out is
 * malloc'd and NUL-terminated (the length counts any inner NULs). */
epyq_status epyq_json_text_field(const char *text, size_t len, const char *key, char **out, size_t *out_len,
                                 bool *found, epyq_err *err);

#endif
