/* src/load/json.h — strict JSON for checkpoint metadata (safetensors headers, the shard index,
 * config.json and friends).
 *
 * Promise: epyq_json_parse() accepts only well-formed UTF-8 JSON whose root is an object, with
 * no raw control characters, no duplicate keys in any object at any depth, and nothing but
 * whitespace after the value. cJSON alone keeps duplicate keys silently and does not check
 * UTF-8, so every loader parser goes through here. The typed getters refuse wrong JSON types
 * and out-of-range or non-integral numbers with one line naming the file and key. */
#ifndef EPYQ_LOAD_JSON_H
#define EPYQ_LOAD_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/status.h"

/* Largest integer a JSON number may carry here: beyond 2^53 a double no longer counts by one. */
#define EPYQ_JSON_INT_MAX ((int64_t)1 << 53)

/* True when s[0, n) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF); else *bad_at is
 * the offset of the first bad byte. */
bool epyq_utf8_valid(const uint8_t *s, size_t n, size_t *bad_at);

/* Parse text[0, len) (need not be NUL-terminated). label names the file in messages. */
epyq_status epyq_json_parse(cJSON **out, const char *text, size_t len, const char *label, epyq_err *err);

/* An integral number in [lo, hi]; false otherwise (no message: callers know the context). */
bool epyq_json_as_int(const cJSON *it, int64_t lo, int64_t hi, int64_t *out);

/* Getters for an optional key of obj. A missing key (or JSON null when null_ok) leaves *out at
 * its default and returns EPYQ_OK with *found = false (found may be NULL). A present key of the
 * wrong type or range fails with EPYQ_E_FORMAT "label: key: expected ..., found ...". */
epyq_status epyq_json_get_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                              bool *found, const char *label, epyq_err *err);
epyq_status epyq_json_get_num(const cJSON *obj, const char *key, double lo, double hi, double *out,
                              bool *found, const char *label, epyq_err *err);
epyq_status epyq_json_get_bool(const cJSON *obj, const char *key, bool *out, bool *found,
                               const char *label, epyq_err *err);
/* *out points into the cJSON tree (valid while it lives). */
epyq_status epyq_json_get_str(const cJSON *obj, const char *key, const char **out, bool *found,
                              const char *label, epyq_err *err);

/* A short description of a JSON value's type for messages ("string", "number", ...). */
const char *epyq_json_type_name(const cJSON *it);

#endif
