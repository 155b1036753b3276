/* tools/serve_out.c — see serve_out.h. */
#include "tools/serve_out.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static unsigned long long g_seq; /* ids: unique per process, no randomness needed */

epyq_status epyq_serve_out_init(epyq_serve_out *o, bool chat, bool stream, const char *model,
                                const epyq_tok *tok, const cJSON *tools, int32_t logprobs,
                                bool prompt_opens_think, epyq_err *err) {
    memset(o, 0, sizeof *o);
    o->chat = chat, o->stream = stream, o->model = model, o->tok = tok, o->tools = tools;
    o->logprobs = logprobs;
    o->created = (long long)time(NULL);
    snprintf(o->id, sizeof o->id, "%s-%llx%04llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)o->created,
             __atomic_add_fetch(&g_seq, 1, __ATOMIC_RELAXED));
    o->calls = cJSON_CreateArray();
    if (chat) {
        o->rp = epyq_reasoning_new(prompt_opens_think);
        if (tools) o->tp = epyq_toolcall_new(tools);
        if (logprobs >= 0) o->lp = cJSON_CreateArray();
        if (!o->rp || (tools && !o->tp)) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    } else if (logprobs >= 0) {
        o->lp = cJSON_CreateObject();
        cJSON_AddArrayToObject(o->lp, "tokens");
        cJSON_AddArrayToObject(o->lp, "token_logprobs");
        cJSON_AddArrayToObject(o->lp, "top_logprobs");
        cJSON_AddArrayToObject(o->lp, "text_offset");
    }
    if (!o->calls || (logprobs >= 0 && !o->lp)) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    return EPYQ_OK;
}

void epyq_serve_out_free(epyq_serve_out *o) {
    epyq_reasoning_free(o->rp);
    epyq_toolcall_free(o->tp);
    epyq_sbuf_free(&o->reasoning), epyq_sbuf_free(&o->content), epyq_sbuf_free(&o->text);
    cJSON_Delete(o->calls);
    cJSON_Delete(o->lp);
    memset(o, 0, sizeof *o);
}

static char *tok_text(const epyq_tok *t, int32_t id) {
    char *s = NULL;
    size_t n;
    if (epyq_tok_decode(t, &id, 1, false, &s, &n, NULL) != EPYQ_OK) return strdup("");
    return s;
}

static cJSON *bytes_of(const char *s) {
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

/* Chat: {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}. */
static cJSON *chat_lp_entry(const epyq_serve_out *o, const epyq_engine_logprob *lp) {
    cJSON *e = cJSON_CreateObject(), *top = cJSON_CreateArray();
    char *s = tok_text(o->tok, lp->tok);
    cJSON_AddStringToObject(e, "token", s ? s : "");
    cJSON_AddNumberToObject(e, "logprob", lp->logprob);
    cJSON_AddItemToObject(e, "bytes", bytes_of(s ? s : ""));
    free(s);
    for (int32_t k = 0; k < lp->n_top && k < o->logprobs; k++) {
        cJSON *t = cJSON_CreateObject();
        char *ts = tok_text(o->tok, lp->top_ids[k]);
        cJSON_AddStringToObject(t, "token", ts ? ts : "");
        cJSON_AddNumberToObject(t, "logprob", lp->top_lp[k]);
        cJSON_AddItemToObject(t, "bytes", bytes_of(ts ? ts : ""));
        free(ts);
        cJSON_AddItemToArray(top, t);
    }
    cJSON_AddItemToObject(e, "top_logprobs", top);
    return e;
}

/* Completions: one token appended to {tokens, token_logprobs, top_logprobs, text_offset};
 * lp NULL = the first prompt token (null logprob, as OpenAI's echo gives it). */
static void cmpl_lp_add(epyq_serve_out *o, cJSON *dst, int32_t tok, const epyq_engine_logprob *lp) {
    char *s = tok_text(o->tok, lp ? lp->tok : tok);
    cJSON_AddItemToArray(cJSON_GetObjectItem(dst, "tokens"), cJSON_CreateString(s ? s : ""));
    cJSON_AddItemToArray(cJSON_GetObjectItem(dst, "token_logprobs"), lp ? cJSON_CreateNumber(lp->logprob) : cJSON_CreateNull());
    cJSON *top = lp ? cJSON_CreateObject() : cJSON_CreateNull();
    for (int32_t k = 0; lp && k < lp->n_top && k < o->logprobs; k++) {
        char *ts = tok_text(o->tok, lp->top_ids[k]);
        if (!cJSON_GetObjectItemCaseSensitive(top, ts ? ts : "")) cJSON_AddNumberToObject(top, ts ? ts : "", lp->top_lp[k]);
        free(ts);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(dst, "top_logprobs"), top);
    cJSON_AddItemToArray(cJSON_GetObjectItem(dst, "text_offset"), cJSON_CreateNumber(o->text_offset));
    o->text_offset += s ? (int32_t)strlen(s) : 0;
    free(s);
}

static cJSON *chunk_new(const epyq_serve_out *o) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", o->id);
    cJSON_AddStringToObject(c, "object", o->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(c, "created", (double)o->created);
    cJSON_AddStringToObject(c, "model", o->model);
    return c;
}

static bool sse_add(epyq_sbuf *sse, cJSON *c) {
    char *s = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    bool ok = s && epyq_sbuf_adds(sse, "data: ") && epyq_sbuf_adds(sse, s) && epyq_sbuf_adds(sse, "\n\n");
    free(s);
    return ok;
}

static cJSON *tool_call_json(const cJSON *call, int32_t index, bool with_index) {
    cJSON *t = cJSON_CreateObject(), *f = cJSON_CreateObject();
    char id[48];
    snprintf(id, sizeof id, "call_%08x%04x", (unsigned)__atomic_add_fetch(&g_seq, 1, __ATOMIC_RELAXED) * 2654435761u, (unsigned)index);
    if (with_index) cJSON_AddNumberToObject(t, "index", index);
    cJSON_AddStringToObject(t, "id", id);
    cJSON_AddStringToObject(t, "type", "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(call, "name");
    cJSON_AddStringToObject(f, "name", cJSON_IsString(name) ? name->valuestring : "");
    char *args = epyq_toolcall_arguments_json(call);
    cJSON_AddStringToObject(f, "arguments", args ? args : "{}");
    free(args);
    cJSON_AddItemToObject(t, "function", f);
    return t;
}

epyq_status epyq_serve_out_start(epyq_serve_out *o, epyq_sbuf *sse, epyq_err *err) {
    if (o->started) return EPYQ_OK;
    o->started = true;
    cJSON *c = chunk_new(o), *chs = cJSON_AddArrayToObject(c, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", 0);
    if (o->chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
        cJSON_AddNullToObject(ch, "logprobs");
    } else {
        if (!o->echo) {
            cJSON_Delete(ch), cJSON_Delete(c);
            return EPYQ_OK; /* completions chunks carry only text */
        }
        cJSON_AddStringToObject(ch, "text", o->prompt_text ? o->prompt_text : "");
        cJSON_AddNullToObject(ch, "logprobs");
    }
    cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(chs, ch);
    if (!sse_add(sse, c)) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    return EPYQ_OK;
}

/* text → reasoning / content → content / tool calls; the deltas of this push into rs, cs. */
static epyq_status split(epyq_serve_out *o, const char *text, size_t len, bool final, epyq_sbuf *rs, epyq_sbuf *cs,
                         epyq_err *err) {
    epyq_sbuf c0 = {0};
    epyq_status st = final ? epyq_reasoning_finish(o->rp, rs, &c0, err) : epyq_reasoning_push(o->rp, text, len, rs, &c0, err);
    if (st == EPYQ_OK && o->tp) {
        if (c0.len) st = epyq_toolcall_push(o->tp, c0.p, c0.len, cs, o->calls, err);
        if (st == EPYQ_OK && final) st = epyq_toolcall_finish(o->tp, cs, o->calls, err);
    } else if (st == EPYQ_OK && c0.len && !epyq_sbuf_add(cs, c0.p, c0.len)) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    }
    epyq_sbuf_free(&c0);
    return st;
}

/* One streamed chat chunk with whatever rs / cs / new calls / logprobs hold. */
static bool chat_delta(epyq_serve_out *o, const epyq_sbuf *rs, const epyq_sbuf *cs, cJSON *lps, epyq_sbuf *sse) {
    int32_t n_calls = cJSON_GetArraySize(o->calls);
    if (!rs->len && !cs->len && n_calls == o->calls_sent && !lps) return true;
    cJSON *c = chunk_new(o), *chs = cJSON_AddArrayToObject(c, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", 0);
    cJSON *d = cJSON_AddObjectToObject(ch, "delta");
    if (rs->len) cJSON_AddStringToObject(d, "reasoning_content", rs->p);
    if (cs->len) cJSON_AddStringToObject(d, "content", cs->p);
    if (n_calls > o->calls_sent) {
        cJSON *tc = cJSON_AddArrayToObject(d, "tool_calls");
        for (int32_t k = o->calls_sent; k < n_calls; k++)
            cJSON_AddItemToArray(tc, tool_call_json(cJSON_GetArrayItem(o->calls, k), k, true));
        o->calls_sent = n_calls;
    }
    if (lps) {
        cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
        cJSON_AddItemToObject(l, "content", lps);
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(chs, ch);
    return sse_add(sse, c);
}

epyq_status epyq_serve_out_push(epyq_serve_out *o, const char *text, size_t len,
                                const epyq_engine_logprob *lps, const bool *lp_prompt,
                                size_t n_lps, epyq_sbuf *sse, epyq_err *err) {
    epyq_status st = EPYQ_OK;
    if (o->chat) {
        epyq_sbuf rs = {0}, cs = {0};
        cJSON *lpa = NULL;
        if (len) st = split(o, text, len, false, &rs, &cs, err);
        for (size_t i = 0; st == EPYQ_OK && o->lp && i < n_lps; i++) {
            if (lp_prompt[i]) continue;
            cJSON *e = chat_lp_entry(o, &lps[i]);
            if (o->stream) {
                if (!lpa) lpa = cJSON_CreateArray();
                cJSON_AddItemToArray(lpa, e);
            } else {
                cJSON_AddItemToArray(o->lp, e);
            }
        }
        if (st == EPYQ_OK && !o->stream) {
            if (!epyq_sbuf_add(&o->reasoning, rs.p ? rs.p : "", rs.len) || !epyq_sbuf_add(&o->content, cs.p ? cs.p : "", cs.len))
                st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
        } else if (st == EPYQ_OK && !chat_delta(o, &rs, &cs, lpa, sse)) {
            lpa = NULL;
            st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
        } else {
            lpa = NULL; /* owned by the chunk */
        }
        cJSON_Delete(lpa);
        epyq_sbuf_free(&rs), epyq_sbuf_free(&cs);
        return st;
    }
    cJSON *lpo = NULL;
    if (o->lp) {
        lpo = o->stream ? cJSON_CreateObject() : o->lp;
        if (o->stream) {
            cJSON_AddArrayToObject(lpo, "tokens"), cJSON_AddArrayToObject(lpo, "token_logprobs");
            cJSON_AddArrayToObject(lpo, "top_logprobs"), cJSON_AddArrayToObject(lpo, "text_offset");
        }
        for (size_t i = 0; i < n_lps; i++) {
            if (lp_prompt[i] && !o->echo) continue;
            if (o->echo && o->first_prompt_id >= 0) { /* the prompt's first token has no logprob */
                cmpl_lp_add(o, lpo, o->first_prompt_id, NULL);
                o->first_prompt_id = -1;
            }
            cmpl_lp_add(o, lpo, lps[i].tok, &lps[i]);
        }
    }
    if (!o->stream) {
        if (len && !epyq_sbuf_add(&o->text, text, len)) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
        return EPYQ_OK;
    }
    if (!len && (!lpo || !cJSON_GetArraySize(cJSON_GetObjectItem(lpo, "tokens")))) {
        cJSON_Delete(lpo);
        return EPYQ_OK;
    }
    cJSON *c = chunk_new(o), *chs = cJSON_AddArrayToObject(c, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", 0);
    char *t = strndup(text ? text : "", len);
    cJSON_AddStringToObject(ch, "text", t ? t : "");
    free(t);
    if (lpo) cJSON_AddItemToObject(ch, "logprobs", lpo);
    else cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(chs, ch);
    if (!sse_add(sse, c)) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    return EPYQ_OK;
}

static cJSON *usage_json(const epyq_engine_usage *u) {
    cJSON *us = cJSON_CreateObject();
    cJSON_AddNumberToObject(us, "prompt_tokens", u->n_prompt);
    cJSON_AddNumberToObject(us, "completion_tokens", u->n_gen);
    cJSON_AddNumberToObject(us, "total_tokens", u->n_prompt + u->n_gen);
    cJSON *ptd = cJSON_CreateObject();
    cJSON_AddNumberToObject(ptd, "cached_tokens", u->n_cached);
    cJSON_AddItemToObject(us, "prompt_tokens_details", ptd);
    return us;
}

epyq_status epyq_serve_out_finish(epyq_serve_out *o, epyq_engine_finish finish,
                                  const epyq_engine_usage *u, bool include_usage, epyq_sbuf *sse,
                                  char **body, epyq_err *err) {
    epyq_status st = EPYQ_OK;
    epyq_sbuf rs = {0}, cs = {0};
    if (o->chat) st = split(o, NULL, 0, true, &rs, &cs, err);
    const char *fr = finish == EPYQ_ENGINE_LENGTH ? "length" : "stop";
    if (o->chat && cJSON_GetArraySize(o->calls) > 0 && finish == EPYQ_ENGINE_STOP) fr = "tool_calls";
    if (st == EPYQ_OK && o->stream) {
        bool ok = !o->chat || chat_delta(o, &rs, &cs, NULL, sse);
        cJSON *c = chunk_new(o), *chs = cJSON_AddArrayToObject(c, "choices"), *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", 0);
        if (o->chat) cJSON_AddObjectToObject(ch, "delta");
        else cJSON_AddStringToObject(ch, "text", "");
        cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddStringToObject(ch, "finish_reason", fr);
        cJSON_AddItemToArray(chs, ch);
        ok = ok && sse_add(sse, c);
        if (include_usage) {
            c = chunk_new(o);
            cJSON_AddArrayToObject(c, "choices");
            cJSON_AddItemToObject(c, "usage", usage_json(u));
            ok = ok && sse_add(sse, c);
        }
        ok = ok && epyq_sbuf_adds(sse, "data: [DONE]\n\n");
        if (!ok) st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    } else if (st == EPYQ_OK) {
        if (o->chat && (!epyq_sbuf_add(&o->reasoning, rs.p ? rs.p : "", rs.len) || !epyq_sbuf_add(&o->content, cs.p ? cs.p : "", cs.len)))
            st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
        cJSON *r = cJSON_CreateObject(), *chs, *ch = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "id", o->id);
        cJSON_AddStringToObject(r, "object", o->chat ? "chat.completion" : "text_completion");
        cJSON_AddNumberToObject(r, "created", (double)o->created);
        cJSON_AddStringToObject(r, "model", o->model);
        chs = cJSON_AddArrayToObject(r, "choices");
        cJSON_AddNumberToObject(ch, "index", 0);
        if (o->chat) {
            cJSON *m = cJSON_AddObjectToObject(ch, "message");
            int32_t n_calls = cJSON_GetArraySize(o->calls);
            cJSON_AddStringToObject(m, "role", "assistant");
            if (n_calls && !o->content.len) cJSON_AddNullToObject(m, "content");
            else cJSON_AddStringToObject(m, "content", o->content.p ? o->content.p : "");
            if (o->reasoning.len) cJSON_AddStringToObject(m, "reasoning_content", o->reasoning.p);
            if (n_calls) {
                cJSON *tc = cJSON_AddArrayToObject(m, "tool_calls");
                for (int32_t k = 0; k < n_calls; k++) cJSON_AddItemToArray(tc, tool_call_json(cJSON_GetArrayItem(o->calls, k), k, false));
            }
            if (o->lp) {
                cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
                cJSON_AddItemToObject(l, "content", o->lp);
                o->lp = NULL;
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
        } else {
            epyq_sbuf t = {0};
            if (o->echo && o->prompt_text) epyq_sbuf_adds(&t, o->prompt_text);
            epyq_sbuf_add(&t, o->text.p ? o->text.p : "", o->text.len);
            cJSON_AddStringToObject(ch, "text", t.p ? t.p : "");
            epyq_sbuf_free(&t);
            if (o->lp) cJSON_AddItemToObject(ch, "logprobs", o->lp), o->lp = NULL;
            else cJSON_AddNullToObject(ch, "logprobs");
        }
        cJSON_AddStringToObject(ch, "finish_reason", fr);
        cJSON_AddItemToArray(chs, ch);
        cJSON_AddItemToObject(r, "usage", usage_json(u));
        *body = cJSON_PrintUnformatted(r);
        cJSON_Delete(r);
        if (!*body) st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    }
    epyq_sbuf_free(&rs), epyq_sbuf_free(&cs);
    return st;
}
