/* tools/serve_out.h — what `epyq serve` sends back for one request: the OpenAI
 * chat.completion / text_completion body, or its stream of SSE chunks.
 *
 * Promise: generated text goes through the same parsers as everywhere else — the reasoning
 * split (chat/reasoning.h, into `reasoning_content`) and, when the request gave tools and did
 * not say tool_choice "none", the tool-call parser (chat/toolcall.h, into `tool_calls`, each
 * call sent as one delta as soon as its block closes). The streamed deltas concatenate to the
 * non-streamed message (same parsers, chunks cut anywhere). finish_reason is "tool_calls" when
 * a call was parsed and generation stopped on its own. Logprobs are the model's raw
 * distribution (before penalties and temperature), tokens spelled by decoding each id alone. */
#ifndef EPYQ_TOOLS_SERVE_OUT_H
#define EPYQ_TOOLS_SERVE_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "chat/reasoning.h"
#include "chat/toolcall.h"
#include "engine/engine.h"
#include "tok/sbuf.h"
#include "tok/tokenizer.h"

typedef struct {
    bool chat, stream, echo;
    const char *model;       /* borrowed */
    const epyq_tok *tok;     /* borrowed */
    const cJSON *tools;      /* borrowed; NULL: no tool-call parsing */
    int32_t logprobs;        /* -1: none */
    char id[64];
    long long created;
    const char *prompt_text; /* borrowed; completions echo */
    int32_t first_prompt_id; /* completions echo: the first prompt token (no logprob) */
    epyq_reasoning *rp;
    epyq_toolcall_parser *tp;
    epyq_sbuf reasoning, content, text;  /* accumulated (non-stream) */
    cJSON *calls;            /* every parsed call */
    int32_t calls_sent;      /* streaming: calls already sent as deltas */
    cJSON *lp;               /* chat: [entries]; completions: {tokens, token_logprobs, ...} */
    bool started;            /* streaming: the role / echo chunk went out */
    int32_t text_offset;
} epyq_serve_out;

/* prompt_opens_think: the rendered prompt leaves <think> open (epyq_chat_prompt_opens_think). */
epyq_status epyq_serve_out_init(epyq_serve_out *o, bool chat, bool stream, const char *model,
                                const epyq_tok *tok, const cJSON *tools, int32_t logprobs,
                                bool prompt_opens_think, epyq_err *err);
void epyq_serve_out_free(epyq_serve_out *o);

/* New text and the logprob entries that came with it (prompt ones first when echoing).
 * Streaming: appends the SSE bytes of one chunk to *sse when there is anything to say. */
epyq_status epyq_serve_out_push(epyq_serve_out *o, const char *text, size_t len,
                                const epyq_engine_logprob *lps, const bool *lp_prompt,
                                size_t n_lps, epyq_sbuf *sse, epyq_err *err);
/* The end. Streaming: the last deltas, the finish chunk, the usage chunk when asked, then
 * "data: [DONE]". Non-streaming: *body gets the whole response object (malloc'd). */
epyq_status epyq_serve_out_finish(epyq_serve_out *o, epyq_engine_finish finish,
                                  const epyq_engine_usage *u, bool include_usage, epyq_sbuf *sse,
                                  char **body, epyq_err *err);
/* Streaming: the first chunk (chat: the assistant role; completions echo: the prompt text). */
epyq_status epyq_serve_out_start(epyq_serve_out *o, epyq_sbuf *sse, epyq_err *err);

#endif
