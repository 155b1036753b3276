/* src/chat/pyjson.h — Python's spelling of JSON and of numbers.
 *
 * Promise: the bytes Python 3 writes for json.dumps(x, ensure_ascii=False) (string escaping,
 * float spelling, the ", " / ": " separators) and for repr(float), so that the chat template's
 * `tojson`, its printing of floats, and the tool-call parser's `arguments` text match what
 * transformers and vLLM produce. Bytes >= 0x80 are copied as they are (ensure_ascii=False). */
#ifndef EPYQ_PYJSON_H
#define EPYQ_PYJSON_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "tok/sbuf.h"

/* A JSON string literal with its quotes, escaped as json.dumps(ensure_ascii=False). */
bool epyq_pyjson_str(epyq_sbuf *b, const char *s, size_t n);
/* repr(float): shortest round-trip digits, "1.0", "1e-05", "1e+16", "inf", "nan". buf >= 32. */
void epyq_py_float_repr(char *buf, size_t size, double v);
/* A float as json.dumps writes it ("Infinity", "NaN" for the non-finite ones). */
bool epyq_pyjson_float(epyq_sbuf *b, double v);
/* json.dumps(x, ensure_ascii=False) of a cJSON tree (keys in stored order). A cJSON number
 * that holds an integral value below 2^63 in magnitude is written as an int, any other as a
 * float: cJSON does not keep the int/float distinction of the source text. */
bool epyq_pyjson_dump(epyq_sbuf *b, const cJSON *x);

#endif
