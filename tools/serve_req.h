/* tools/serve_req.h — one `epyq serve` request body (OpenAI /v1/chat/completions or
 * /v1/completions), parsed and validated.
 *
 * Promise: epyq_serve_req_parse() either fills the request or fills an OpenAI-style error
 * (HTTP status, type, the offending field as `param`, code, and a message saying what was
 * expected and what was found); it never accepts a field it cannot honour (n > 1,
 * response_format json_object/json_schema, logit_bias, best_of > 1, suffix, tool_choice
 * "required" or a named function, content parts other than text and image_url) and ignores fields
 * it does not know. Types are checked strictly: a string where a number belongs is an error, not a
 * coercion. */
#ifndef EPYQ_TOOLS_SERVE_REQ_H
#define EPYQ_TOOLS_SERVE_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "engine/engine.h"
#include "tools/gen.h"

typedef struct {
    int http;            /* 400, 404, ... */
    char type[32];       /* "invalid_request_error", ... */
    char param[96];      /* the field, e.g. "messages[1].content[0].type"; "" = none */
    char code[48];       /* "" = null */
    char msg[512];
} epyq_serve_error;

typedef struct {
    bool chat;               /* /v1/chat/completions */
    bool stream, include_usage;
    cJSON *messages;         /* chat: owned copy */
    cJSON *kwargs;           /* chat: template variables (add_generation_prompt, tools, chat_template_kwargs) */
    const cJSON *tools;      /* chat: kwargs' tools when calls are to be parsed (tool_choice not "none") */
    char *prompt;            /* completions: text, or NULL when given as ids */
    int32_t *prompt_ids;     /* completions: token ids */
    size_t n_prompt_ids;
    bool echo;               /* completions: prepend the prompt */
    bool ignore_eos;         /* vLLM's extension: generate max_tokens whatever the model says */
    int64_t max_tokens;      /* -1: up to the context limit */
    epyq_sample_overrides so;
    double frequency_penalty;
    char *stop[EPYQ_ENGINE_MAX_STOP];
    int32_t n_stop;
    int32_t logprobs;        /* -1: none; chat: top_logprobs; completions: the logprobs number */
} epyq_serve_req;

/* served_model: the name /v1/models lists; a request naming another model is refused (404). */
bool epyq_serve_req_parse(epyq_serve_req *r, bool chat, const char *body, size_t len,
                          const char *served_model, epyq_serve_error *e);
void epyq_serve_req_free(epyq_serve_req *r);

/* Fill e; returns false (so parsers can `return fail(...)`). */
bool epyq_serve_error_set(epyq_serve_error *e, int http, const char *type, const char *param,
                          const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error": {"message", "type", "param", "code"}} (malloc'd). */
char *epyq_serve_error_json(const epyq_serve_error *e);

#endif
