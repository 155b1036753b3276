/* tests/fuzz/fuzz_batch_req.c — libFuzzer: arbitrary bytes as one line of an `epyq batch`
 * input file (tools/batch_req.c), then, for a valid chat request, its messages and kwargs
 * rendered by the Qwen3.6 chat template as `epyq batch` does. The input is cut at its first
 * NUL or newline, as epyq batch's line splitter hands lines over.
 * Checks (the promises of batch_req.h): a custom_id always comes back; an invalid line has a
 * code and a one-line message; a valid one has what its kind needs (chat: a non-empty
 * messages array and a kwargs object with add_generation_prompt; completions: a prompt) and
 * its numbers inside the documented ranges; parsing twice gives the same result; a render
 * either succeeds, NUL-terminated at its length, or fails with a one-line message. Image parts
 * go through epyq_media_collect as `epyq batch` reads them (no --allowed-media-dir): it
 * succeeds with the template's copy exactly when there are images, or fails with one line
 * and the part's field; the render then takes that copy. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "chat/chat.h"
#include "tools/batch_req.h"
#include "tools/media.h"

extern const char epyq_synth_chat_template[];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static epyq_chat *g_chat;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (epyq_chat_from_template(&g_chat, epyq_synth_chat_template, strlen(epyq_synth_chat_template),
                                NULL) != EPYQ_OK)
        abort();
    return 0;
}

static bool one_line(const char *s) { return s[0] && !strchr(s, '\n'); }

/* -1 (the model's default) or inside [lo, hi]. */
static bool opt_in(double v, double lo, double hi) { return v == -1 || (isfinite(v) && v >= lo && v <= hi); }

static void check(const epyq_batch_req *r) {
    if (!r->custom_id || !r->custom_id[0]) abort();
    if (r->err_code[0]) {
        if (!one_line(r->err_msg)) abort();
        return;
    }
    if (r->err_msg[0]) abort();
    if (r->chat) {
        if (!cJSON_IsArray(r->messages) || !r->messages->child || !cJSON_IsObject(r->kwargs) ||
            !cJSON_GetObjectItemCaseSensitive(r->kwargs, "add_generation_prompt"))
            abort();
    } else if (!r->prompt) {
        abort();
    }
    if (r->max_tokens < 1 || r->max_tokens > (1 << 20) || r->top_k < -1) abort();
    if (!opt_in(r->temperature, 0, 100) || !opt_in(r->top_p, 0, 1) || !opt_in(r->min_p, 0, 1) ||
        !opt_in(r->presence_penalty, -2, 2) || !opt_in(r->repetition_penalty, 0.01, 100))
        abort();
}

/* Two JSON values print the same (cJSON_Compare is not reflexive on objects with duplicate
 * names, so it cannot say "same parse"). */
static bool same_json(const cJSON *a, const cJSON *b) {
    if (!a || !b) return a == b;
    char *pa = cJSON_PrintUnformatted(a), *pb = cJSON_PrintUnformatted(b);
    if (!pa || !pb) abort();
    bool eq = !strcmp(pa, pb);
    free(pa);
    free(pb);
    return eq;
}

static bool same(const epyq_batch_req *a, const epyq_batch_req *b) {
    if (strcmp(a->custom_id, b->custom_id) || strcmp(a->err_code, b->err_code) || strcmp(a->err_msg, b->err_msg) ||
        a->chat != b->chat || a->max_tokens != b->max_tokens || a->top_k != b->top_k || a->seed != b->seed)
        return false;
    if ((a->prompt == NULL) != (b->prompt == NULL) || (a->prompt && strcmp(a->prompt, b->prompt))) return false;
    return same_json(a->messages, b->messages) && same_json(a->kwargs, b->kwargs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t n = 0;
    while (n < size && data[n] != '\0' && data[n] != '\n') n++;
    char *line = malloc(n + 1);
    if (!line) return 0;
    memcpy(line, data, n);
    line[n] = '\0';
    epyq_batch_req a, b;
    epyq_batch_req_parse(&a, line, 7);
    epyq_batch_req_parse(&b, line, 7);
    check(&a);
    if (!same(&a, &b)) abort();
    epyq_media md = {0};
    epyq_err merr = {0};
    if (!a.err_code[0] && a.chat && epyq_media_collect(&md, a.messages, NULL, &merr) != EPYQ_OK) {
        if (!one_line(merr.msg) || (merr.code != EPYQ_E_NOMEM && !md.param[0]) || md.n_img ||
            md.messages)
            abort();
    } else if (!a.err_code[0] && a.chat) {
        if ((md.n_img > 0) != (md.messages != NULL) || md.n_img > EPYQ_MEDIA_MAX_IMAGES) abort();
        char *out = NULL;
        size_t len = 0;
        epyq_err err = {0};
        if (epyq_chat_render(g_chat, md.messages ? md.messages : a.messages, a.kwargs, &out, &len,
                             &err) == EPYQ_OK) {
            if (!out || out[len] != '\0') abort();
        } else if (err.code == EPYQ_OK || !one_line(err.msg)) {
            abort();
        }
        free(out);
    }
    epyq_media_free(&md);
    epyq_batch_req_free(&a);
    epyq_batch_req_free(&b);
    free(line);
    return 0;
}
