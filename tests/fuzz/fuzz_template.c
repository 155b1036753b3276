/* tests/fuzz/fuzz_template.c — libFuzzer: arbitrary bytes as a chat template, parsed and
 * rendered against a fixed conversation (system/user/assistant with reasoning and tool
 * calls/tool, tools list, the usual kwargs) under small limits. Checks: parsing and rendering
 * either succeed or fail with a one-line message (never a crash, hang or leak), a successful
 * render is NUL-terminated at its reported length, and rendering twice gives the same bytes
 * (no hidden state). Seeds: the Qwen3.6 template (from epyq synth) and tests/fuzz/template.dict. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "chat/jinja.h"

extern const char epyq_synth_chat_template[];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static cJSON *g_vars;

static const char VARS[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"Be brief.\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi \\u00e9\"}, {\"type\": \"image\"}]},"
    "{\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nok\", \"tool_calls\": ["
    "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [true, null, 2.5], \"c\": \"s\"}}}]},"
    "{\"role\": \"tool\", \"content\": \"{\\\"r\\\": 1}\"},"
    "{\"role\": \"user\", \"content\": \"again\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    "\"add_generation_prompt\": true, \"enable_thinking\": false, \"preserve_thinking\": true,"
    "\"add_vision_id\": true, \"eos_token\": \"<|im_end|>\"}";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    g_vars = cJSON_Parse(VARS);
    if (!g_vars) abort();
    /* The real template must render: a sanity check of the harness itself. */
    epyq_jinja *t = NULL;
    char *out = NULL;
    if (epyq_jinja_parse(epyq_synth_chat_template, strlen(epyq_synth_chat_template), NULL, &t, NULL) != EPYQ_OK ||
        epyq_jinja_render(t, g_vars, NULL, &out, NULL, NULL) != EPYQ_OK)
        abort();
    free(out);
    epyq_jinja_free(t);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    epyq_err err = {0};
    epyq_jinja *t = NULL;
    if (epyq_jinja_parse((const char *)data, size, "fuzz", &t, &err) != EPYQ_OK) {
        if (err.code == EPYQ_OK || !err.msg[0] || strchr(err.msg, '\n')) abort();
        return 0;
    }
    epyq_jinja_limits lim = {.max_output = 1 << 20, .max_memory = 32 << 20, .max_steps = 200000};
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    epyq_status s1 = epyq_jinja_render(t, g_vars, &lim, &a, &na, &err);
    if (s1 != EPYQ_OK && (err.code == EPYQ_OK || strchr(err.msg, '\n'))) abort();
    epyq_status s2 = epyq_jinja_render(t, g_vars, &lim, &b, &nb, &err);
    if (s1 != s2) abort();
    if (s1 == EPYQ_OK && (a[na] != '\0' || na != nb || memcmp(a, b, na) != 0)) abort();
    free(a);
    free(b);
    epyq_jinja_free(t);
    return 0;
}
