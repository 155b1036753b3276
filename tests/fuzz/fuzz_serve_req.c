/* tests/fuzz/fuzz_serve_req.c — libFuzzer: arbitrary bytes as an `epyq serve` request body
 * (tools/serve_req.c). The first byte picks the endpoint (odd: /v1/chat/completions, even:
 * /v1/completions), the rest is the body, handed over with its length and no terminator (as
 * libmicrohttpd's upload buffer is).
 * Checks (the promises of serve_req.h): a refusal has a 4xx status (5xx only for out of
 * memory), an error type and a one-line message, and its JSON error object parses back with the
 * same message; an accepted chat request has a messages array and a kwargs object, an accepted
 * completion a prompt (text or ids); every stop string is non-empty; parsing the same body twice
 * gives the same verdict. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tools/serve_req.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool verdict(bool chat, const char *body, size_t len, epyq_serve_error *e) {
    epyq_serve_req r;
    memset(&r, 0, sizeof r);
    memset(e, 0, sizeof *e);
    bool ok = epyq_serve_req_parse(&r, chat, body, len, "fuzz-model", e);
    if (ok) {
        if (chat && (!cJSON_IsArray(r.messages) || !cJSON_IsObject(r.kwargs))) abort();
        if (!chat && !r.prompt && !r.prompt_ids) abort();
        for (int32_t i = 0; i < r.n_stop; i++)
            if (!r.stop[i] || !r.stop[i][0]) abort();
    } else {
        if (e->http < 400 || e->http > 599 || !e->type[0] || !e->msg[0] || strchr(e->msg, '\n'))
            abort();
        char *js = epyq_serve_error_json(e);
        if (!js) abort();
        cJSON *o = cJSON_Parse(js);
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
        if (!cJSON_IsString(msg) || strcmp(msg->valuestring, e->msg)) abort();
        cJSON_Delete(o);
        free(js);
    }
    epyq_serve_req_free(&r);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool chat = data[0] & 1;
    /* a copy of exactly the body's bytes, so ASan sees any read past its end */
    size_t len = size - 1;
    char *body = malloc(len ? len : 1);
    if (!body) return 0;
    memcpy(body, data + 1, len);
    epyq_serve_error e1, e2;
    bool a = verdict(chat, body, len, &e1), b = verdict(chat, body, len, &e2);
    if (a != b || (!a && (e1.http != e2.http || strcmp(e1.msg, e2.msg)))) abort();
    free(body);
    return 0;
}
