/* tools/batch_req.h — one line of an `epyq batch` input file, parsed and validated.
 *
 * Promise: epyq_batch_req_parse() accepts the OpenAI batch line format
 *   {"custom_id": ID, "method": "POST", "url": "/v1/chat/completions" | "/v1/completions", "body": {...}}
 * and the plain form {"prompt": TEXT, ...sampling fields...}; it never fails without filling
 * code/message (the error record's `error` object), and keeps the custom_id whenever the line
 * is a JSON object that has one, so the error record can name it. Body fields read:
 * messages | prompt, max_completion_tokens | max_tokens, temperature, top_p, top_k, min_p,
 * presence_penalty, repetition_penalty, seed, chat_template_kwargs (e.g. enable_thinking). */
#ifndef EPYQ_TOOLS_BATCH_REQ_H
#define EPYQ_TOOLS_BATCH_REQ_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/status.h"

typedef struct {
    char *custom_id;       /* as given, or "line:N" */
    bool chat;             /* /v1/chat/completions (messages) vs /v1/completions (prompt) */
    cJSON *messages;       /* chat: owned copy of body.messages */
    cJSON *kwargs;         /* chat: template kwargs (add_generation_prompt + chat_template_kwargs) */
    char *prompt;          /* completions: prompt text */
    int32_t max_tokens;    /* default 256 */
    /* sampling overrides; < 0 = the model's generation_config default */
    double temperature, top_p, min_p, presence_penalty, repetition_penalty;
    int32_t top_k;
    uint64_t seed;
    char err_code[48];     /* empty = valid */
    char err_msg[256];
} epyq_batch_req;

/* line_no is 1-based (names the record when no custom_id can be recovered). */
void epyq_batch_req_parse(epyq_batch_req *r, const char *line, int64_t line_no);
void epyq_batch_req_free(epyq_batch_req *r);

/* The error record of input line line_no (1-based): status 400, body null, error {code,
 * message}; malloc'd, NULL when out of memory. */
char *epyq_batch_record_error(int64_t line_no, const char *custom_id, const char *code,
                              const char *msg);
/* --resume: truncate a partial last line of the output file at path, and return in *ids how
 * many records each custom_id already has there ({} when the file does not exist). */
epyq_status epyq_batch_done_ids(const char *path, cJSON **ids, epyq_err *err);

#endif
