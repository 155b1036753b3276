/* tools/batch_req.c — see batch_req.h. */
#include "tools/batch_req.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"

static void fail(epyq_batch_req *r, const char *code, const char *msg) {
    snprintf(r->err_code, sizeof r->err_code, "%s", code);
    snprintf(r->err_msg, sizeof r->err_msg, "%s", msg);
}

/* A number field in [lo, hi]; absent leaves *out. False (and the error) when present but bad. */
static bool num_field(epyq_batch_req *r, const cJSON *body, const char *name, double lo, double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
        char m[160];
        snprintf(m, sizeof m, "body.%s must be a number in [%g, %g]", name, lo, hi);
        fail(r, "invalid_value", m);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first name that appears twice in one object anywhere inside v, or NULL. JSON leaves
 * duplicate names undefined: cJSON's lookups see the first, Python's json (the OpenAI server,
 * transformers) keeps the last, so such a request would render another prompt here than there:
 * it is refused instead. Big objects are checked by sorting their names (a line may hold an
 * object of a million names); small ones, or when the sort array cannot be allocated, pairwise. */
static const char *dup_name(const cJSON *v) {
    if (cJSON_IsObject(v)) {
        size_t n = 0;
        for (const cJSON *c = v->child; c; c = c->next) n++;
        const char **names = n > 16 ? malloc(n * sizeof *names) : NULL;
        const char *dup = NULL;
        if (names) {
            size_t i = 0;
            for (const cJSON *c = v->child; c; c = c->next) names[i++] = c->string;
            qsort(names, n, sizeof *names, cmp_name);
            for (i = 1; i < n && !dup; i++)
                if (!strcmp(names[i - 1], names[i])) dup = names[i];
            free(names);
        } else {
            for (const cJSON *c = v->child; c && !dup; c = c->next)
                for (const cJSON *d = v->child; d != c && !dup; d = d->next)
                    if (!strcmp(d->string, c->string)) dup = c->string;
        }
        if (dup) return dup;
    }
    for (const cJSON *c = v ? v->child : NULL; c; c = c->next) {
        const char *in = dup_name(c);
        if (in) return in;
    }
    return NULL;
}

/* obj[name] = a deep copy of v; false when out of memory (nothing is left half-added). */
static bool add_copy(cJSON *obj, const char *name, const cJSON *v) {
    cJSON *c = cJSON_Duplicate(v, 1);
    if (c && cJSON_AddItemToObject(obj, name, c)) return true;
    cJSON_Delete(c);
    return false;
}

static void parse_body(epyq_batch_req *r, const cJSON *body) {
    double d;
    if (r->chat) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(body, "messages");
        if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0)
            return fail(r, "invalid_request", "body.messages must be a non-empty array");
        for (const cJSON *e = m->child; e; e = e->next) {
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
            if (!cJSON_IsObject(e) || !cJSON_IsString(role))
                return fail(r, "invalid_request", "every message must be an object with a string role");
        }
        const cJSON *kw = cJSON_GetObjectItemCaseSensitive(body, "chat_template_kwargs");
        if (kw && !cJSON_IsObject(kw)) return fail(r, "invalid_request", "body.chat_template_kwargs must be an object");
        /* Every copy is checked: a kwarg silently missing would change the rendered prompt. */
        bool ok = (r->messages = cJSON_Duplicate(m, 1)) && (r->kwargs = cJSON_CreateObject());
        for (const cJSON *e = kw ? kw->child : NULL; ok && e; e = e->next)
            ok = add_copy(r->kwargs, e->string, e);
        if (ok && !cJSON_GetObjectItemCaseSensitive(r->kwargs, "add_generation_prompt"))
            ok = cJSON_AddBoolToObject(r->kwargs, "add_generation_prompt", 1) != NULL;
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
        if (ok && cJSON_IsArray(tools)) ok = add_copy(r->kwargs, "tools", tools);
        if (!ok) return fail(r, "server_error", "out of memory copying the request");
    } else {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
        if (!cJSON_IsString(p)) return fail(r, "invalid_request", "prompt must be a string");
        if (!(r->prompt = strdup(p->valuestring))) return fail(r, "server_error", "out of memory copying the prompt");
    }
    d = r->max_tokens;
    if (!num_field(r, body, "max_tokens", 1, 1 << 20, &d)) return;
    if (!num_field(r, body, "max_completion_tokens", 1, 1 << 20, &d)) return;
    r->max_tokens = (int32_t)d;
    if (!num_field(r, body, "temperature", 0, 100, &r->temperature)) return;
    if (!num_field(r, body, "top_p", 0, 1, &r->top_p)) return;
    if (!num_field(r, body, "min_p", 0, 1, &r->min_p)) return;
    if (!num_field(r, body, "presence_penalty", -2, 2, &r->presence_penalty)) return;
    if (!num_field(r, body, "repetition_penalty", 0.01, 100, &r->repetition_penalty)) return;
    d = -1;
    if (!num_field(r, body, "top_k", -1, 1 << 30, &d)) return;
    r->top_k = (int32_t)d;
    d = 0;
    if (!num_field(r, body, "seed", 0, 9007199254740992.0, &d)) return;
    r->seed = (uint64_t)d;
}

void epyq_batch_req_parse(epyq_batch_req *r, const char *line, int64_t line_no) {
    memset(r, 0, sizeof *r);
    r->max_tokens = 256;
    r->temperature = r->top_p = r->min_p = r->presence_penalty = r->repetition_penalty = -1;
    r->top_k = -1;
    char id[48];
    snprintf(id, sizeof id, "line:%lld", (long long)line_no);
    cJSON *j = cJSON_ParseWithOpts(line, NULL, 1);
    if (!j || !cJSON_IsObject(j)) {
        r->custom_id = strdup(id);
        fail(r, "invalid_json", j ? "the line is JSON but not an object" : "the line is not valid JSON");
        cJSON_Delete(j);
        return;
    }
    const cJSON *cid = cJSON_GetObjectItemCaseSensitive(j, "custom_id");
    r->custom_id = strdup(cJSON_IsString(cid) && *cid->valuestring ? cid->valuestring : id);
    const char *dup = dup_name(j);
    if (dup) {
        char m[200];
        snprintf(m, sizeof m, "the name \"%.120s\" appears twice in one object (names must be unique)", dup);
        for (char *q = m; *q; q++)
            if (*q == '\n' || *q == '\r') *q = ' '; /* one line, whatever the name holds */
        fail(r, "invalid_json", m);
        cJSON_Delete(j);
        return;
    }
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(j, "url");
    const cJSON *body = cJSON_GetObjectItemCaseSensitive(j, "body");
    if (url || body) {
        const cJSON *method = cJSON_GetObjectItemCaseSensitive(j, "method");
        if (method && (!cJSON_IsString(method) || strcmp(method->valuestring, "POST") != 0))
            fail(r, "invalid_request", "method must be POST");
        else if (!cJSON_IsString(url))
            fail(r, "invalid_request", "url must be /v1/chat/completions or /v1/completions");
        else if (!strcmp(url->valuestring, "/v1/chat/completions"))
            r->chat = true;
        else if (strcmp(url->valuestring, "/v1/completions") != 0)
            fail(r, "invalid_url", "url must be /v1/chat/completions or /v1/completions");
        if (!r->err_code[0] && !cJSON_IsObject(body)) fail(r, "invalid_request", "body must be an object");
        if (!r->err_code[0]) parse_body(r, body);
    } else if (cJSON_GetObjectItemCaseSensitive(j, "prompt")) {
        parse_body(r, j);
    } else if (cJSON_GetObjectItemCaseSensitive(j, "messages")) {
        r->chat = true;
        parse_body(r, j);
    } else {
        fail(r, "invalid_request", "expected {custom_id, method, url, body} or {\"prompt\": ...}");
    }
    cJSON_Delete(j);
}

void epyq_batch_req_free(epyq_batch_req *r) {
    free(r->custom_id);
    free(r->prompt);
    cJSON_Delete(r->messages);
    cJSON_Delete(r->kwargs);
    memset(r, 0, sizeof *r);
}

epyq_status epyq_batch_done_ids(const char *path, cJSON **ids, epyq_err *err) {
    *ids = cJSON_CreateObject();
    char *data = NULL;
    size_t len = 0;
    struct stat sb;
    if (stat(path, &sb) != 0) return EPYQ_OK; /* nothing written yet */
    epyq_status st = epyq_file_read(path, (size_t)1 << 34, &data, &len, err);
    if (st != EPYQ_OK) return st;
    size_t keep = len;
    while (keep > 0 && data[keep - 1] != '\n') keep--;
    if (keep != len && truncate(path, (off_t)keep) != 0) {
        free(data);
        return epyq_err_set(err, EPYQ_E_IO, "%s: cannot drop the partial last line: %s", path,
                            strerror(errno));
    }
    size_t line = 1;
    for (char *p = data, *end; p < data + keep; p = end + 1, line++) {
        end = memchr(p, '\n', (size_t)(data + keep - p));
        *end = '\0';
        cJSON *j = cJSON_Parse(p);
        const cJSON *cid = cJSON_GetObjectItemCaseSensitive(j, "custom_id");
        if (!cJSON_IsString(cid)) {
            cJSON_Delete(j);
            free(data);
            return epyq_err_set(
                err, EPYQ_E_FORMAT,
                "%s:%zu: not an epyq batch record (no custom_id); refusing to resume", path, line);
        }
        cJSON *cnt = cJSON_GetObjectItemCaseSensitive(*ids, cid->valuestring);
        if (cnt) cJSON_SetNumberValue(cnt, cnt->valuedouble + 1);
        else
            cJSON_AddNumberToObject(*ids, cid->valuestring, 1);
        cJSON_Delete(j);
    }
    free(data);
    return EPYQ_OK;
}

char *epyq_batch_record_error(int64_t line_no, const char *custom_id, const char *code,
                              const char *msg) {
    cJSON *r = cJSON_CreateObject(), *resp = cJSON_CreateObject(), *e = cJSON_CreateObject();
    char buf[64];
    snprintf(buf, sizeof buf, "batch_req_%lld", (long long)line_no);
    cJSON_AddStringToObject(r, "id", buf);
    cJSON_AddStringToObject(r, "custom_id", custom_id ? custom_id : "");
    cJSON_AddNumberToObject(resp, "status_code", 400);
    snprintf(buf, sizeof buf, "req_%lld", (long long)line_no);
    cJSON_AddStringToObject(resp, "request_id", buf);
    cJSON_AddNullToObject(resp, "body");
    cJSON_AddItemToObject(r, "response", resp);
    cJSON_AddStringToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddItemToObject(r, "error", e);
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}
