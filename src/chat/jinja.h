/* src/chat/jinja.h — a small Jinja interpreter for Hugging Face chat templates.
 *
 * Promise: renders the subset of Jinja that chat templates use (the whole of the Qwen3.6
 * template: if/elif/else, for with loop.* and loop filters, set incl. namespace attributes and
 * tuple targets, macros, break/continue, whitespace control, the filters, tests, string/dict
 * methods and globals listed in jinja_filters.c / jinja_methods.c) byte for byte like Python
 * jinja2 in transformers' configuration: ImmutableSandboxedEnvironment with trim_blocks and
 * lstrip_blocks, default Undefined (prints as "", iterates as empty, an error in arithmetic or
 * attribute access), tojson = json.dumps(ensure_ascii=False), raise_exception(msg).
 * Anything else (include, extends, call blocks, unknown filters/tests …) is refused when the
 * template is parsed, with line and column. Rendering is bounded in output size, memory and
 * evaluation steps, and recursion is bounded, so hostile templates fail cleanly.
 *
 * Known differences from CPython jinja2: integers are 64-bit (overflow is an error instead of
 * a big int); str.upper/lower/title map one code point to one (no ß -> SS); JSON numbers come
 * through cJSON, so a float with an integral value (2.0) is seen as the int 2. */
#ifndef EPYQ_JINJA_H
#define EPYQ_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/status.h"

typedef struct epyq_jinja epyq_jinja;

typedef struct {
    size_t max_output;  /* bytes of rendered text */
    size_t max_memory;  /* bytes of values made while rendering */
    uint64_t max_steps; /* evaluated nodes + loop iterations */
} epyq_jinja_limits;

/* Defaults: 64 MiB output, 512 MiB memory, 50 M steps (the Qwen template needs ~10 k). */
epyq_jinja_limits epyq_jinja_default_limits(void);

/* Parses a template. name (may be NULL) appears in error messages as "<name>:line:col: …". */
epyq_status epyq_jinja_parse(const char *src, size_t len, const char *name, epyq_jinja **out,
                             epyq_err *err);

/* Renders with the members of the JSON object vars as the template's variables (NULL = none).
 * *out is malloc'd and NUL-terminated. A raise_exception(msg) fails with EPYQ_E_TEMPLATE and
 * exactly msg as the message; other errors with EPYQ_E_TEMPLATE and "<name>:line:col: …". */
epyq_status epyq_jinja_render(const epyq_jinja *t, const cJSON *vars,
                              const epyq_jinja_limits *limits, char **out, size_t *out_len,
                              epyq_err *err);

void epyq_jinja_free(epyq_jinja *t);

#endif
