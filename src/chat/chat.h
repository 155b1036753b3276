/* src/chat/chat.h — render a conversation into the model's prompt with the checkpoint's own
 * chat template, the way transformers' apply_chat_template does.
 *
 * Promise: the variables the template sees are those of apply_chat_template(messages,
 * tools=…, add_generation_prompt=…, **kwargs): `messages`, every member of kwargs
 * (add_generation_prompt, enable_thinking, preserve_thinking, tools, add_vision_id, …), and the
 * special tokens named in tokenizer_config.json (bos_token, eos_token, pad_token, unk_token)
 * unless kwargs sets them. One adjustment is made to the messages, as vLLM's OpenAI server
 * does: a tool call whose `arguments` is a JSON string holding an object is given that object,
 * so OpenAI-style requests render like the template expects. */
#ifndef EPYQ_CHAT_H
#define EPYQ_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "chat/jinja.h"
#include "core/status.h"

typedef struct epyq_chat epyq_chat;

/* Loads the template of checkpoint folder dir: chat_template.jinja if present (transformers
 * prefers it), else tokenizer_config.json's "chat_template" (a string, or a list of
 * {name, template} from which "default" is taken); plus the special-token strings. */
epyq_status epyq_chat_load(epyq_chat **out, const char *dir, epyq_err *err);
/* A chat from template text (special tokens: none). */
epyq_status epyq_chat_from_template(epyq_chat **out, const char *src, size_t len, epyq_err *err);
void epyq_chat_free(epyq_chat *c);

/* messages: JSON array of {role, content, …}; kwargs: JSON object or NULL. *out is malloc'd.
 * A template raise_exception fails with EPYQ_E_TEMPLATE and the template's message. */
epyq_status epyq_chat_render(const epyq_chat *c, const cJSON *messages, const cJSON *kwargs,
                             char **out, size_t *out_len, epyq_err *err);
/* request: {"messages": […], "kwargs": {…}} (the chat_cases.jsonl shape); other top-level
 * members (besides name/note/rendered…) are ignored. */
epyq_status epyq_chat_render_request(const epyq_chat *c, const cJSON *request, char **out,
                                     size_t *out_len, epyq_err *err);

/* True when the prompt leaves a <think> block open (generation starts inside reasoning):
 * the last "<think>" comes after the last "</think>". */
bool epyq_chat_prompt_opens_think(const char *prompt, size_t len);

#endif
