/* src/chat/chat.c — see chat.h. */
#include "chat/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

enum { MAX_CONFIG_BYTES = 64 << 20 };

static const char *const SPECIAL_KEYS[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
enum { N_SPECIAL = sizeof SPECIAL_KEYS / sizeof SPECIAL_KEYS[0] };

struct epyq_chat {
    epyq_jinja *tpl;
    char *special[N_SPECIAL]; /* token strings from tokenizer_config.json, NULL when unset */
};

epyq_status epyq_chat_from_template(epyq_chat **out, const char *src, size_t len, epyq_err *err) {
    *out = NULL;
    epyq_chat *c = calloc(1, sizeof *c);
    if (!c) return epyq_err_set(err, EPYQ_E_NOMEM, "chat template: out of memory");
    epyq_status st = epyq_jinja_parse(src, len, "chat_template", &c->tpl, err);
    if (st) {
        free(c);
        return st;
    }
    *out = c;
    return EPYQ_OK;
}

/* A special token in tokenizer_config.json is a string or an AddedToken object {"content": …}. */
static char *token_string(const cJSON *v) {
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? strdup(v->valuestring) : NULL;
}

epyq_status epyq_chat_load(epyq_chat **out, const char *dir, epyq_err *err) {
    *out = NULL;
    char *cfg_path = epyq_path_join(dir, "tokenizer_config.json");
    char *jinja_path = epyq_path_join(dir, "chat_template.jinja");
    char *cfg_text = NULL, *tpl_text = NULL;
    size_t tpl_len = 0;
    cJSON *cfg = NULL;
    epyq_status st = EPYQ_OK;
    if (!cfg_path || !jinja_path) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    if (epyq_file_read(cfg_path, MAX_CONFIG_BYTES, &cfg_text, NULL, NULL) == EPYQ_OK) {
        cfg = cJSON_Parse(cfg_text);
        if (!cfg) {
            st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: not valid JSON", cfg_path);
            goto done;
        }
    }
    if (epyq_file_read(jinja_path, MAX_CONFIG_BYTES, &tpl_text, &tpl_len, NULL) != EPYQ_OK) {
        const cJSON *t = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
        if (cJSON_IsArray(t)) { /* named templates: use "default" */
            const cJSON *pick = NULL, *e;
            cJSON_ArrayForEach(e, t) {
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
                if (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default"))
                    pick = cJSON_GetObjectItemCaseSensitive(e, "template");
            }
            t = pick;
        }
        if (!cJSON_IsString(t)) {
            st = epyq_err_set(err, EPYQ_E_FORMAT,
                              "%s: no chat template (expected chat_template.jinja or a \"chat_template\" string in tokenizer_config.json)",
                              dir);
            goto done;
        }
        tpl_text = strdup(t->valuestring);
        tpl_len = tpl_text ? strlen(tpl_text) : 0;
        if (!tpl_text) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", dir);
            goto done;
        }
    }
    epyq_chat *c = NULL;
    st = epyq_chat_from_template(&c, tpl_text, tpl_len, err);
    if (st) goto done;
    for (int i = 0; cfg && i < N_SPECIAL; i++)
        c->special[i] = token_string(cJSON_GetObjectItemCaseSensitive(cfg, SPECIAL_KEYS[i]));
    *out = c;
done:
    cJSON_Delete(cfg);
    free(cfg_text);
    free(tpl_text);
    free(cfg_path);
    free(jinja_path);
    return st;
}

void epyq_chat_free(epyq_chat *c) {
    if (!c) return;
    epyq_jinja_free(c->tpl);
    for (int i = 0; i < N_SPECIAL; i++) free(c->special[i]);
    free(c);
}

/* OpenAI clients send tool-call arguments as a JSON string; the template iterates them with
 * |items, so (like vLLM) give it the parsed object when the string holds one. */
static void parse_string_arguments(cJSON *messages) {
    cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        cJSON *tc;
        if (!cJSON_IsArray(calls)) continue;
        cJSON_ArrayForEach(tc, calls) {
            cJSON *holder = cJSON_GetObjectItemCaseSensitive(tc, "function");
            if (!cJSON_IsObject(holder)) holder = tc;
            cJSON *args = cJSON_GetObjectItemCaseSensitive(holder, "arguments");
            if (!cJSON_IsString(args)) continue;
            cJSON *parsed = cJSON_ParseWithOpts(args->valuestring, NULL, true);
            if (cJSON_IsObject(parsed))
                cJSON_ReplaceItemInObjectCaseSensitive(holder, "arguments", parsed);
            else
                cJSON_Delete(parsed);
        }
    }
}

epyq_status epyq_chat_render(const epyq_chat *c, const cJSON *messages, const cJSON *kwargs,
                             char **out, size_t *out_len, epyq_err *err) {
    *out = NULL;
    cJSON *vars = cJSON_CreateObject();
    cJSON *msgs = messages ? cJSON_Duplicate(messages, 1) : cJSON_CreateArray();
    if (!vars || !msgs) {
        cJSON_Delete(vars);
        cJSON_Delete(msgs);
        return epyq_err_set(err, EPYQ_E_NOMEM, "chat: out of memory");
    }
    parse_string_arguments(msgs);
    bool ok = true;
    for (int i = 0; i < N_SPECIAL; i++)
        if (c->special[i] && !(kwargs && cJSON_HasObjectItem(kwargs, SPECIAL_KEYS[i])))
            ok = ok && cJSON_AddStringToObject(vars, SPECIAL_KEYS[i], c->special[i]) != NULL;
    ok = ok && cJSON_AddItemToObject(vars, "messages", msgs);
    if (!ok) cJSON_Delete(msgs);
    const cJSON *kw;
    if (ok && cJSON_IsObject(kwargs))
        cJSON_ArrayForEach(kw, kwargs) {
            if (!strcmp(kw->string, "messages")) continue;
            cJSON *dup = cJSON_Duplicate(kw, 1);
            if (!dup || !cJSON_AddItemToObject(vars, kw->string, dup)) {
                cJSON_Delete(dup);
                ok = false;
                break;
            }
        }
    epyq_status st = ok ? epyq_jinja_render(c->tpl, vars, NULL, out, out_len, err)
                        : epyq_err_set(err, EPYQ_E_NOMEM, "chat: out of memory");
    cJSON_Delete(vars);
    return st;
}

epyq_status epyq_chat_render_request(const epyq_chat *c, const cJSON *request, char **out,
                                     size_t *out_len, epyq_err *err) {
    if (!cJSON_IsObject(request))
        return epyq_err_set(err, EPYQ_E_ARG, "chat request: expected a JSON object");
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(request, "messages");
    const cJSON *kwargs = cJSON_GetObjectItemCaseSensitive(request, "kwargs");
    if (!cJSON_IsArray(messages))
        return epyq_err_set(err, EPYQ_E_ARG, "chat request: \"messages\" must be an array");
    if (kwargs && !cJSON_IsObject(kwargs) && !cJSON_IsNull(kwargs))
        return epyq_err_set(err, EPYQ_E_ARG, "chat request: \"kwargs\" must be an object");
    return epyq_chat_render(c, messages, cJSON_IsObject(kwargs) ? kwargs : NULL, out, out_len, err);
}

bool epyq_chat_prompt_opens_think(const char *prompt, size_t len) {
    const char *open = NULL, *close = NULL;
    for (const char *p = prompt; (p = memmem(p, len - (size_t)(p - prompt), "<think>", 7)) != NULL; p += 7) open = p;
    for (const char *p = prompt; (p = memmem(p, len - (size_t)(p - prompt), "</think>", 8)) != NULL; p += 8) close = p;
    return open && (!close || open > close);
}
