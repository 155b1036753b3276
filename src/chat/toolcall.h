/* src/chat/toolcall.h — parse the XML-style tool calls Qwen3.6 writes into JSON, incrementally,
 * following vLLM's `qwen3_coder` tool parser.
 *
 * The format (described to the model by its chat template):
 *   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n…</function>\n</tool_call>
 * Promise (push chunks cut anywhere; the result equals that of one chunk):
 *  - text before the first "<tool_call>" (or a bare "<function=") is answer content;
 *  - from there on, every "<function=NAME>" … "</function>" block becomes one call
 *    {"name": NAME, "arguments": {P: value, …}}, emitted as soon as its block closes
 *    ("</tool_call>" or the end of the output also close it); text between calls is dropped,
 *    as vLLM drops it;
 *  - a parameter value runs to "</parameter>", the next "<parameter=", or the end of the
 *    function; one leading and one trailing "\n" are removed; it is converted by the type
 *    the tool's JSON schema gives that parameter (epyq_toolcall_convert);
 *  - if the output ends without a single complete call (e.g. "<tool_call>" and then prose),
 *    everything held back is returned as content, like vLLM's fallback.
 * Not reproduced from vLLM: when "<tool_call>" tags exist it ignores functions outside them;
 * here every <function=…> after the first tag counts. */
#ifndef EPYQ_TOOLCALL_H
#define EPYQ_TOOLCALL_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "core/status.h"
#include "tok/sbuf.h"

typedef struct epyq_toolcall_parser epyq_toolcall_parser;

/* tools: the request's tool list (OpenAI shape, [{"type":"function","function":{"name",
 * "parameters":{…}}}] or bare {"name","parameters"}); may be NULL. Borrowed: keep it alive. */
epyq_toolcall_parser *epyq_toolcall_new(const cJSON *tools);
/* Appends answer text to *content and each completed call object to the array *calls. */
epyq_status epyq_toolcall_push(epyq_toolcall_parser *p, const char *text, size_t len,
                               epyq_sbuf *content, cJSON *calls, epyq_err *err);
epyq_status epyq_toolcall_finish(epyq_toolcall_parser *p, epyq_sbuf *content, cJSON *calls,
                                 epyq_err *err);
void epyq_toolcall_free(epyq_toolcall_parser *p);

/* One parameter value by its schema type, as vLLM's _convert_param_value: "null" (any case)
 * -> null; no schema for the parameter, or string/str/text/varchar/char/enum -> string;
 * int…/uint…/long…/short…/unsigned… -> Python int() or the string; num…/float… -> Python
 * float(), integral results as int, or the string; boolean/bool/binary -> value == "true"
 * (case-insensitive); object/array/arr/dict…/list… -> JSON, else a Python literal, else the
 * string; any other type -> a Python literal or the string. schema may be NULL. */
cJSON *epyq_toolcall_convert(const char *value, size_t n, const cJSON *schema);

/* json.dumps(arguments, ensure_ascii=False): the "arguments" string of an OpenAI tool call. */
char *epyq_toolcall_arguments_json(const cJSON *call);

#endif
