/* tests/fuzz/fuzz_outparse.c — libFuzzer: arbitrary model output through the reasoning
 * splitter and then the tool-call parser, once in one chunk and once cut into pieces whose
 * sizes come from the input. Checks: both give the same reasoning, answer and calls (the
 * streaming promise of reasoning.h / toolcall.h), and reasoning + answer never hold more bytes
 * than the input. First input byte: bit 0 = the prompt left <think> open, the rest seeds the
 * cut sizes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "chat/reasoning.h"
#include "chat/toolcall.h"
#include "tok/sbuf.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static cJSON *g_tools;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    g_tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":{"
                          "\"i\":{\"type\":\"integer\"},\"n\":{\"type\":\"number\"},\"b\":{\"type\":\"boolean\"},"
                          "\"o\":{\"type\":\"object\"},\"s\":{\"type\":\"string\"},\"x\":{\"type\":\"tuple\"}}}}}]");
    if (!g_tools) abort();
    return 0;
}

typedef struct {
    epyq_sbuf reasoning, content;
    char *calls;
} result;

static void run(const char *text, size_t len, bool in_think, uint32_t seed, result *out) {
    epyq_reasoning *rp = epyq_reasoning_new(in_think);
    epyq_toolcall_parser *tp = epyq_toolcall_new(g_tools);
    cJSON *calls = cJSON_CreateArray();
    epyq_sbuf answer = {0};
    memset(out, 0, sizeof *out);
    if (!rp || !tp || !calls) abort();
    size_t pos = 0;
    while (pos < len) {
        size_t n = len - pos;
        if (seed) { /* xorshift: pieces of 1..16 bytes */
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            size_t k = 1 + seed % 16;
            if (k < n) n = k;
        }
        size_t before = answer.len;
        if (epyq_reasoning_push(rp, text + pos, n, &out->reasoning, &answer, NULL) != EPYQ_OK) abort();
        if (epyq_toolcall_push(tp, answer.p ? answer.p + before : "", answer.len - before, &out->content, calls, NULL) != EPYQ_OK)
            abort();
        pos += n;
    }
    size_t before = answer.len;
    if (epyq_reasoning_finish(rp, &out->reasoning, &answer, NULL) != EPYQ_OK) abort();
    if (epyq_toolcall_push(tp, answer.p ? answer.p + before : "", answer.len - before, &out->content, calls, NULL) != EPYQ_OK ||
        epyq_toolcall_finish(tp, &out->content, calls, NULL) != EPYQ_OK)
        abort();
    if (out->reasoning.len + answer.len > len) abort();
    out->calls = cJSON_PrintUnformatted(calls);
    for (cJSON *c = calls->child; c; c = c->next) free(epyq_toolcall_arguments_json(c));
    cJSON_Delete(calls);
    epyq_sbuf_free(&answer);
    epyq_toolcall_free(tp);
    epyq_reasoning_free(rp);
}

static bool same(const epyq_sbuf *a, const epyq_sbuf *b) {
    return a->len == b->len && (!a->len || !memcmp(a->p, b->p, a->len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool in_think = data[0] & 1;
    uint32_t seed = 0x9E3779B9u ^ (uint32_t)data[0] << 8 ^ (uint32_t)size;
    result one, many;
    run((const char *)data + 1, size - 1, in_think, 0, &one);
    run((const char *)data + 1, size - 1, in_think, seed, &many);
    if (!same(&one.reasoning, &many.reasoning) || !same(&one.content, &many.content) || !one.calls || !many.calls ||
        strcmp(one.calls, many.calls) != 0)
        abort();
    epyq_sbuf_free(&one.reasoning);
    epyq_sbuf_free(&one.content);
    epyq_sbuf_free(&many.reasoning);
    epyq_sbuf_free(&many.content);
    free(one.calls);
    free(many.calls);
    return 0;
}
