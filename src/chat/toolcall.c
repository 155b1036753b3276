/* src/chat/toolcall.c — the incremental <tool_call> parser (see toolcall.h).
 * Before the first tag, `buf` holds only a possible partial tag; after it, `buf` holds the
 * raw text from the first tag on (kept whole until a call succeeds, for the fallback). */
#include "chat/toolcall.h"

#include <stdlib.h>
#include <string.h>

#include "chat/reasoning.h"

static const char TOOL_CALL[] = "<tool_call>";
static const char TOOL_CALL_END[] = "</tool_call>";
static const char FUNCTION[] = "<function=";
static const char FUNCTION_END[] = "</function>";
static const char PARAMETER[] = "<parameter=";
static const char PARAMETER_END[] = "</parameter>";
#define LEN(s) (sizeof(s) - 1)

struct epyq_toolcall_parser {
    const cJSON *tools; /* borrowed */
    bool in_calls;      /* the first <tool_call> / <function= has been seen */
    epyq_sbuf buf;
    size_t pos;         /* in_calls: parsed up to here */
    size_t ncalls;
};

epyq_toolcall_parser *epyq_toolcall_new(const cJSON *tools) {
    epyq_toolcall_parser *p = calloc(1, sizeof *p);
    if (p) p->tools = tools;
    return p;
}

void epyq_toolcall_free(epyq_toolcall_parser *p) {
    if (!p) return;
    epyq_sbuf_free(&p->buf);
    free(p);
}

static const char *find(const char *s, size_t n, const char *tag, size_t tn) {
    return n >= tn ? memmem(s, n, tag, tn) : NULL;
}

/* The "properties" of the named function's parameters (vLLM: or the parameters object itself
 * when it has no "properties"), or NULL. */
static const cJSON *param_config(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(fn)) {
            if (type) continue;
            fn = t; /* bare {"name", "parameters"} */
        } else if (!cJSON_IsString(type) || strcmp(type->valuestring, "function")) {
            continue;
        }
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(nm) || strcmp(nm->valuestring, name)) continue;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!cJSON_IsObject(params)) return NULL;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
        return props ? props : params;
    }
    return NULL;
}

/* One function block: name = text up to the first '>', then the parameters. */
static cJSON *parse_function(const epyq_toolcall_parser *p, const char *s, size_t n) {
    const char *gt = memchr(s, '>', n);
    if (!gt) return NULL;
    char *name = strndup(s, (size_t)(gt - s));
    cJSON *call = cJSON_CreateObject();
    cJSON *args = cJSON_CreateObject();
    if (!name || !call || !args) goto fail;
    const cJSON *config = p->tools ? param_config(p->tools, name) : NULL;
    const char *q = gt + 1, *end = s + n;
    for (;;) {
        const char *ps = find(q, (size_t)(end - q), PARAMETER, LEN(PARAMETER));
        if (!ps) break;
        const char *body = ps + LEN(PARAMETER);
        /* The value ends at </parameter>, the next <parameter=, or the end of the function
         * (before a final '\n' there, as Python's `$` matches). */
        const char *close = find(body, (size_t)(end - body), PARAMETER_END, LEN(PARAMETER_END));
        const char *next = find(body, (size_t)(end - body), PARAMETER, LEN(PARAMETER));
        const char *stop = end;
        if (stop > body && stop[-1] == '\n') stop--;
        if (next && next < stop) stop = next;
        if (close && close < stop) stop = close;
        q = stop == close ? close + LEN(PARAMETER_END) : stop;
        if (stop == end - 1 && !next && !close) q = end;
        const char *pgt = memchr(body, '>', (size_t)(stop - body));
        if (!pgt) continue; /* a parameter without a name: skipped */
        const char *v = pgt + 1;
        size_t vn = (size_t)(stop - v);
        if (vn && v[0] == '\n') v++, vn--;
        if (vn && v[vn - 1] == '\n') vn--;
        char *pname = strndup(body, (size_t)(pgt - body));
        if (!pname) goto fail;
        const cJSON *schema = config ? cJSON_GetObjectItemCaseSensitive(config, pname) : NULL;
        cJSON *val = epyq_toolcall_convert(v, vn, schema);
        bool ok = val != NULL;
        if (ok && cJSON_GetObjectItemCaseSensitive(args, pname))
            ok = cJSON_ReplaceItemInObjectCaseSensitive(args, pname, val); /* last value, first place */
        else if (ok)
            ok = cJSON_AddItemToObject(args, pname, val);
        free(pname);
        if (!ok) {
            cJSON_Delete(val);
            goto fail;
        }
    }
    if (!cJSON_AddStringToObject(call, "name", name) || !cJSON_AddItemToObject(call, "arguments", args)) goto fail;
    free(name);
    return call;
fail:
    free(name);
    cJSON_Delete(call);
    cJSON_Delete(args);
    return NULL;
}

/* Emits every function block that is complete (all of them when final). */
static bool parse_calls(epyq_toolcall_parser *p, cJSON *calls, bool final) {
    for (;;) {
        const char *s = p->buf.p + p->pos;
        size_t n = p->buf.len - p->pos;
        const char *f = find(s, n, FUNCTION, LEN(FUNCTION));
        if (!f) break;
        const char *body = f + LEN(FUNCTION);
        size_t bn = (size_t)(s + n - body);
        const char *fe = find(body, bn, FUNCTION_END, LEN(FUNCTION_END));
        const char *te = find(body, bn, TOOL_CALL_END, LEN(TOOL_CALL_END));
        const char *end = fe && (!te || fe < te) ? fe : te;
        if (!end) {
            if (!final) break; /* wait for the block to close */
            end = body + bn;
        }
        cJSON *call = parse_function(p, body, (size_t)(end - body));
        if (call) {
            if (!cJSON_AddItemToArray(calls, call)) {
                cJSON_Delete(call);
                return false;
            }
            p->ncalls++;
        }
        p->pos = (size_t)(end - p->buf.p) + (end == fe ? LEN(FUNCTION_END) : 0);
        if (end == body + bn) p->pos = p->buf.len;
    }
    if (p->ncalls && p->pos) { /* no fallback any more: forget what was parsed */
        memmove(p->buf.p, p->buf.p + p->pos, p->buf.len - p->pos);
        p->buf.len -= p->pos;
        p->buf.p[p->buf.len] = '\0';
        p->pos = 0;
    }
    return true;
}

static epyq_status nomem(epyq_err *err) { return epyq_err_set(err, EPYQ_E_NOMEM, "tool-call parser: out of memory"); }

epyq_status epyq_toolcall_push(epyq_toolcall_parser *p, const char *text, size_t len, epyq_sbuf *content,
                               cJSON *calls, epyq_err *err) {
    if (!epyq_sbuf_add(&p->buf, text, len)) return nomem(err);
    if (!p->in_calls) {
        const char *s = p->buf.p;
        size_t n = p->buf.len;
        const char *a = find(s, n, TOOL_CALL, LEN(TOOL_CALL)), *b = find(s, n, FUNCTION, LEN(FUNCTION));
        const char *tag = a && (!b || a < b) ? a : b;
        size_t emit;
        if (tag) {
            emit = (size_t)(tag - s);
        } else {
            size_t k1 = epyq_tag_partial_suffix(s, n, TOOL_CALL), k2 = epyq_tag_partial_suffix(s, n, FUNCTION);
            emit = n - (k1 > k2 ? k1 : k2);
        }
        if (!epyq_sbuf_add(content, s, emit)) return nomem(err);
        memmove(p->buf.p, p->buf.p + emit, n - emit);
        p->buf.len = n - emit;
        p->buf.p[p->buf.len] = '\0';
        if (!tag) return EPYQ_OK;
        p->in_calls = true;
        p->pos = 0;
    }
    return parse_calls(p, calls, false) ? EPYQ_OK : nomem(err);
}

epyq_status epyq_toolcall_finish(epyq_toolcall_parser *p, epyq_sbuf *content, cJSON *calls, epyq_err *err) {
    if (!p->in_calls) {
        bool ok = epyq_sbuf_add(content, p->buf.p ? p->buf.p : "", p->buf.len);
        p->buf.len = 0;
        return ok ? EPYQ_OK : nomem(err);
    }
    if (!parse_calls(p, calls, true)) return nomem(err);
    if (p->ncalls == 0) { /* nothing parsed: the text was not a tool call after all */
        if (!epyq_sbuf_add(content, p->buf.p, p->buf.len)) return nomem(err);
    }
    p->buf.len = p->pos = 0;
    return EPYQ_OK;
}
