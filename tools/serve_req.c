/* tools/serve_req.c — see serve_req.h. */
#include "tools/serve_req.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD "invalid_request_error"

bool epyq_serve_error_set(epyq_serve_error *e, int http, const char *type, const char *param,
                          const char *code, const char *fmt, ...) {
    e->http = http;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    /* messages quote what the client sent (a model name, a value): keep them one line for the
     * request log and clients that print them (fuzz_serve_req found a newline quoted back) */
    for (char *c = e->msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    return false;
}

char *epyq_serve_error_json(const epyq_serve_error *e) {
    cJSON *r = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(r, "error");
    cJSON_AddStringToObject(o, "message", e->msg);
    cJSON_AddStringToObject(o, "type", e->type);
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code[0]) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}

static const char *type_name(const cJSON *v) {
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "an invalid value";
}

static const cJSON *get(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL; /* null means "not given", as the OpenAI API reads it */
}

/* A number in [lo, hi] (integer when whole); absent leaves *out. */
static bool num(const cJSON *body, const char *name, double lo, double hi, bool whole, double *out,
                epyq_serve_error *e) {
    const cJSON *v = get(body, name);
    if (!v) return true;
    if (!cJSON_IsNumber(v))
        return epyq_serve_error_set(e, 400, BAD, name, "invalid_type", "'%s' must be %s, found %s", name,
                                    whole ? "an integer" : "a number", type_name(v));
    double d = v->valuedouble;
    if (!isfinite(d) || d < lo || d > hi || (whole && d != floor(d)))
        return epyq_serve_error_set(e, 400, BAD, name, "invalid_value", "'%s' must be %s in [%g, %g], found %g", name,
                                    whole ? "an integer" : "a number", lo, hi, d);
    *out = d;
    return true;
}

static bool boolean(const cJSON *body, const char *name, bool *out, epyq_serve_error *e) {
    const cJSON *v = get(body, name);
    if (!v) return true;
    if (!cJSON_IsBool(v))
        return epyq_serve_error_set(e, 400, BAD, name, "invalid_type", "'%s' must be a boolean, found %s", name, type_name(v));
    *out = cJSON_IsTrue(v);
    return true;
}

/* messages: roles and content parts we can render (text, and image_url shaped {url: STRING}). */
static bool check_messages(const cJSON *m, epyq_serve_error *e) {
    if (!cJSON_IsArray(m))
        return epyq_serve_error_set(e, 400, BAD, "messages", m ? "invalid_type" : "missing_required_parameter",
                                    "'messages' must be a non-empty array, found %s", m ? type_name(m) : "nothing");
    if (cJSON_GetArraySize(m) == 0)
        return epyq_serve_error_set(e, 400, BAD, "messages", "invalid_value", "'messages' must be a non-empty array, found []");
    int i = 0;
    char param[96];
    for (const cJSON *msg = m->child; msg; msg = msg->next, i++) {
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(msg))
            return epyq_serve_error_set(e, 400, BAD, param, "invalid_type", "'%s' must be an object, found %s", param, type_name(msg));
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        static const char *roles[] = {"system", "developer", "user", "assistant", "tool"};
        bool known = false;
        for (size_t k = 0; cJSON_IsString(role) && k < sizeof roles / sizeof *roles; k++) known |= !strcmp(role->valuestring, roles[k]);
        if (!known)
            return epyq_serve_error_set(e, 400, BAD, param, "invalid_value",
                                        "'%s' must be one of system, developer, user, assistant, tool; found %s%s%s", param,
                                        cJSON_IsString(role) ? "'" : "", cJSON_IsString(role) ? role->valuestring : type_name(role),
                                        cJSON_IsString(role) ? "'" : "");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
        snprintf(param, sizeof param, "messages[%d].content", i);
        if (!c || cJSON_IsNull(c)) {
            if (!strcmp(role->valuestring, "assistant")) continue; /* a tool-call turn */
            return epyq_serve_error_set(e, 400, BAD, param, "missing_required_parameter", "'%s' is required for role '%s'",
                                        param, role->valuestring);
        }
        if (cJSON_IsString(c)) continue;
        if (!cJSON_IsArray(c))
            return epyq_serve_error_set(e, 400, BAD, param, "invalid_type", "'%s' must be a string or an array of content parts, found %s",
                                        param, type_name(c));
        int k = 0;
        for (const cJSON *part = c->child; part; part = part->next, k++) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type"), *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
            snprintf(param, sizeof param, "messages[%d].content[%d].type", i, k);
            if (!cJSON_IsObject(part) || !cJSON_IsString(ty))
                return epyq_serve_error_set(e, 400, BAD, param, "invalid_type", "'%s' must be a string (content parts are objects with a type)", param);
            if (!strcmp(ty->valuestring,
                        "image_url")) { /* decoded by tools/media.c after parsing */
                const cJSON *iu = cJSON_GetObjectItemCaseSensitive(part, "image_url");
                const cJSON *u =
                    cJSON_IsObject(iu) ? cJSON_GetObjectItemCaseSensitive(iu, "url") : iu;
                snprintf(param, sizeof param, "messages[%d].content[%d].image_url", i, k);
                if (!cJSON_IsString(u))
                    return epyq_serve_error_set(e, 400, BAD, param, "invalid_type",
                                                "'%s' must be {\"url\": STRING}, found %s", param,
                                                iu ? type_name(u ? u : iu) : "nothing");
                continue;
            }
            if (strcmp(ty->valuestring, "text") != 0)
                return epyq_serve_error_set(
                    e, 400, BAD, param, "unsupported_content",
                    "content part type '%s' is not supported: this server takes text and image_url parts",
                    ty->valuestring);
            if (!cJSON_IsString(tx)) {
                snprintf(param, sizeof param, "messages[%d].content[%d].text", i, k);
                return epyq_serve_error_set(e, 400, BAD, param, "invalid_type", "'%s' must be a string, found %s", param,
                                            tx ? type_name(tx) : "nothing");
            }
        }
    }
    return true;
}

/* tools: [{type: "function", function: {name, parameters?}}]; tool_choice auto | none. */
static bool check_tools(epyq_serve_req *r, const cJSON *body, epyq_serve_error *e) {
    const cJSON *tools = get(body, "tools"), *choice = get(body, "tool_choice");
    bool none = false;
    if (choice) {
        if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) none = true;
        else if (!(cJSON_IsString(choice) && !strcmp(choice->valuestring, "auto")))
            return epyq_serve_error_set(e, 400, BAD, "tool_choice", "unsupported_value",
                                        "'tool_choice' must be \"auto\" or \"none\": \"required\" and a named function need "
                                        "constrained decoding, which this server does not do");
    }
    if (!tools) return true;
    if (!cJSON_IsArray(tools))
        return epyq_serve_error_set(e, 400, BAD, "tools", "invalid_type", "'tools' must be an array, found %s", type_name(tools));
    int i = 0;
    char param[96];
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type"), *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name"), *pars = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        snprintf(param, sizeof param, "tools[%d]", i);
        if (!cJSON_IsObject(t) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function") != 0 || !cJSON_IsObject(fn))
            return epyq_serve_error_set(e, 400, BAD, param, "invalid_value", "'%s' must be {\"type\": \"function\", \"function\": {...}}", param);
        snprintf(param, sizeof param, "tools[%d].function.name", i);
        if (!cJSON_IsString(name) || !*name->valuestring)
            return epyq_serve_error_set(e, 400, BAD, param, "invalid_value", "'%s' must be a non-empty string", param);
        snprintf(param, sizeof param, "tools[%d].function.parameters", i);
        if (pars && !cJSON_IsObject(pars) && !cJSON_IsNull(pars))
            return epyq_serve_error_set(e, 400, BAD, param, "invalid_type", "'%s' must be a JSON schema object, found %s", param, type_name(pars));
    }
    cJSON *copy = cJSON_Duplicate(tools, 1);
    cJSON_AddItemToObject(r->kwargs, "tools", copy);
    if (!none) r->tools = copy;
    return true;
}

/* One stop string: non-empty (an empty one would end every generation at once; a raw NUL in
 * the JSON string makes one too, fuzz_serve_req found), copied. */
static bool add_stop(epyq_serve_req *r, const char *v, epyq_serve_error *e) {
    if (!v[0])
        return epyq_serve_error_set(e, 400, BAD, "stop", "invalid_value",
                                    "'stop' strings must not be empty, found \"\"");
    if (!(r->stop[r->n_stop] = strdup(v)))
        return epyq_serve_error_set(e, 500, "server_error", "stop", NULL,
                                    "out of memory copying 'stop'");
    r->n_stop++;
    return true;
}

static bool check_stop(epyq_serve_req *r, const cJSON *body, epyq_serve_error *e) {
    const cJSON *s = get(body, "stop");
    if (!s) return true;
    if (cJSON_IsString(s)) return add_stop(r, s->valuestring, e);
    if (!cJSON_IsArray(s) || cJSON_GetArraySize(s) > EPYQ_ENGINE_MAX_STOP)
        return epyq_serve_error_set(e, 400, BAD, "stop", "invalid_value", "'stop' must be a string or an array of at most %d strings, found %s",
                                    EPYQ_ENGINE_MAX_STOP, cJSON_IsArray(s) ? "a longer array" : type_name(s));
    for (const cJSON *x = s->child; x; x = x->next) {
        if (!cJSON_IsString(x))
            return epyq_serve_error_set(e, 400, BAD, "stop", "invalid_type", "'stop' entries must be strings, found %s", type_name(x));
        if (!add_stop(r, x->valuestring, e)) return false;
    }
    return true;
}

/* Fields we cannot honour: refused by name rather than silently ignored. */
static bool check_refused(const cJSON *body, bool chat, epyq_serve_error *e) {
    double n = 1;
    if (!num(body, "n", 1, 128, true, &n, e)) return false;
    if (n != 1) return epyq_serve_error_set(e, 400, BAD, "n", "unsupported_value", "'n' must be 1: one choice per request is supported, found %g", n);
    const cJSON *rf = get(body, "response_format");
    if (rf) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(ty))
            return epyq_serve_error_set(e, 400, BAD, "response_format", "invalid_type", "'response_format' must be an object with a type");
        if (strcmp(ty->valuestring, "text") != 0)
            return epyq_serve_error_set(e, 400, BAD, "response_format", "unsupported_value",
                                        "'response_format' type '%s' needs constrained decoding, which this server does not do; only \"text\"",
                                        ty->valuestring);
    }
    const cJSON *lb = get(body, "logit_bias");
    if (lb && (!cJSON_IsObject(lb) || lb->child))
        return epyq_serve_error_set(e, 400, BAD, "logit_bias", "unsupported_value", "'logit_bias' is not supported");
    if (!chat) {
        double bo = 1;
        if (!num(body, "best_of", 1, 128, true, &bo, e)) return false;
        if (bo != 1) return epyq_serve_error_set(e, 400, BAD, "best_of", "unsupported_value", "'best_of' must be 1, found %g", bo);
        const cJSON *sx = get(body, "suffix");
        if (sx && !(cJSON_IsString(sx) && !*sx->valuestring))
            return epyq_serve_error_set(e, 400, BAD, "suffix", "unsupported_value", "'suffix' (insertion) is not supported");
    }
    const cJSON *st = get(body, "stream_options");
    if (st && !cJSON_IsObject(st))
        return epyq_serve_error_set(e, 400, BAD, "stream_options", "invalid_type", "'stream_options' must be an object, found %s", type_name(st));
    return true;
}

static bool parse_prompt(epyq_serve_req *r, const cJSON *body, epyq_serve_error *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child)) p = p->child;
    if (cJSON_IsString(p)) {
        r->prompt = strdup(p->valuestring);
        return true;
    }
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && cJSON_IsNumber(p->child)) {
        size_t n = (size_t)cJSON_GetArraySize(p), i = 0;
        r->prompt_ids = malloc(n * sizeof *r->prompt_ids);
        for (const cJSON *x = p->child; x && r->prompt_ids; x = x->next, i++) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1e9 || x->valuedouble != floor(x->valuedouble))
                return epyq_serve_error_set(e, 400, BAD, "prompt", "invalid_value", "'prompt' token ids must be non-negative integers");
            r->prompt_ids[i] = (int32_t)x->valuedouble;
        }
        r->n_prompt_ids = n;
        return true;
    }
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 1)
        return epyq_serve_error_set(e, 400, BAD, "prompt", "unsupported_value", "'prompt' must be one string (or one list of token ids): one prompt per request");
    return epyq_serve_error_set(e, 400, BAD, "prompt", p ? "invalid_type" : "missing_required_parameter",
                                "'prompt' must be a string, found %s", p ? type_name(p) : "nothing");
}

bool epyq_serve_req_parse(epyq_serve_req *r, bool chat, const char *body, size_t len,
                          const char *served_model, epyq_serve_error *e) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->max_tokens = -1;
    r->logprobs = -1;
    r->so = (epyq_sample_overrides){-1, -1, -1, -1, -1, -1, 0};
    cJSON *j = cJSON_ParseWithLength(body, len);
    if (!j) return epyq_serve_error_set(e, 400, BAD, NULL, "invalid_json", "the request body is not valid JSON (%zu bytes)", len);
    bool ok = false;
    double d;
    if (!cJSON_IsObject(j)) {
        epyq_serve_error_set(e, 400, BAD, NULL, "invalid_json", "the request body must be a JSON object, found %s", type_name(j));
        goto out;
    }
    const cJSON *model = get(j, "model");
    if (model && !cJSON_IsString(model)) {
        epyq_serve_error_set(e, 400, BAD, "model", "invalid_type", "'model' must be a string, found %s", type_name(model));
        goto out;
    }
    if (model && strcmp(model->valuestring, served_model) != 0) {
        epyq_serve_error_set(e, 404, BAD, "model", "model_not_found", "the model '%.200s' does not exist; this server serves '%.200s'",
                             model->valuestring, served_model);
        goto out;
    }
    if (!check_refused(j, chat, e)) goto out;
    if (!boolean(j, "stream", &r->stream, e)) goto out;
    if (!boolean(j, "ignore_eos", &r->ignore_eos, e)) goto out;
    const cJSON *so = get(j, "stream_options");
    if (so && !boolean(so, "include_usage", &r->include_usage, e)) {
        snprintf(e->param, sizeof e->param, "stream_options.include_usage");
        goto out;
    }
    if (chat) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "messages");
        if (!check_messages(m, e)) goto out;
        r->messages = cJSON_Duplicate(m, 1);
        r->kwargs = cJSON_CreateObject();
        const cJSON *kw = get(j, "chat_template_kwargs");
        if (kw && !cJSON_IsObject(kw)) {
            epyq_serve_error_set(e, 400, BAD, "chat_template_kwargs", "invalid_type", "'chat_template_kwargs' must be an object, found %s", type_name(kw));
            goto out;
        }
        for (const cJSON *x = kw ? kw->child : NULL; x; x = x->next)
            cJSON_AddItemToObject(r->kwargs, x->string, cJSON_Duplicate(x, 1));
        const cJSON *et = cJSON_GetObjectItemCaseSensitive(r->kwargs, "enable_thinking");
        if (et && !cJSON_IsBool(et)) {
            epyq_serve_error_set(e, 400, BAD, "chat_template_kwargs.enable_thinking", "invalid_type",
                                 "'chat_template_kwargs.enable_thinking' must be a boolean, found %s", type_name(et));
            goto out;
        }
        if (!cJSON_GetObjectItemCaseSensitive(r->kwargs, "add_generation_prompt")) cJSON_AddBoolToObject(r->kwargs, "add_generation_prompt", 1);
        if (!check_tools(r, j, e)) goto out;
        bool lp = false;
        if (!boolean(j, "logprobs", &lp, e)) goto out;
        d = 0;
        if (!num(j, "top_logprobs", 0, EPYQ_ENGINE_MAX_TOP, true, &d, e)) goto out;
        if (get(j, "top_logprobs") && !lp) {
            epyq_serve_error_set(e, 400, BAD, "top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs': true");
            goto out;
        }
        if (lp) r->logprobs = (int32_t)d;
    } else {
        if (!parse_prompt(r, j, e)) goto out;
        if (!boolean(j, "echo", &r->echo, e)) goto out;
        d = -1;
        if (!num(j, "logprobs", 0, EPYQ_ENGINE_MAX_TOP, true, &d, e)) goto out;
        r->logprobs = (int32_t)d;
    }
    d = -1;
    if (!num(j, "max_tokens", 1, 1 << 24, true, &d, e)) goto out;
    if (!num(j, "max_completion_tokens", 1, 1 << 24, true, &d, e)) goto out;
    r->max_tokens = (int64_t)d;
    if (!num(j, "temperature", 0, 2, false, &r->so.temperature, e)) goto out;
    if (!num(j, "top_p", 1e-9, 1, false, &r->so.top_p, e)) goto out;
    if (!num(j, "min_p", 0, 1, false, &r->so.min_p, e)) goto out;
    if (!num(j, "presence_penalty", -2, 2, false, &r->so.presence_penalty, e)) goto out;
    if (!num(j, "frequency_penalty", -2, 2, false, &r->frequency_penalty, e)) goto out;
    if (!num(j, "repetition_penalty", 0.01, 100, false, &r->so.repetition_penalty, e)) goto out;
    d = -1;
    if (!num(j, "top_k", -1, 1 << 30, true, &d, e)) goto out;
    r->so.top_k = d < 0 ? -1 : (int64_t)d; /* -1 (vLLM's "off") and 0 both mean no top-k */
    if (d == -1 && get(j, "top_k")) r->so.top_k = 0;
    d = 0;
    if (!num(j, "seed", -9007199254740992.0, 9007199254740992.0, true, &d, e)) goto out;
    r->so.seed = (uint64_t)(int64_t)d;
    if (!check_stop(r, j, e)) goto out;
    ok = true;
out:
    cJSON_Delete(j);
    return ok;
}

void epyq_serve_req_free(epyq_serve_req *r) {
    cJSON_Delete(r->messages);
    cJSON_Delete(r->kwargs);
    free(r->prompt);
    free(r->prompt_ids);
    for (int32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}
