/* tools/chat_state.c — what `epyq chat` keeps between turns and runs (issue 15).
 *
 * The Qwen template renders earlier answers without their reasoning, and an answer given with
 * thinking off without the empty think block its prompt had, so a new turn's prompt parts from
 * what the sequence was fed where the last answer began. The DeltaNet state cannot be rewound
 * there; a copy of it can be restored. So each prompt's prefill copies its state (into the
 * engine's prefix cache, src/engine/prefix.c) at every cache_every positions and at three
 * marks: the end of the system prompt (a conversation after /clear starts there), the end of
 * the history before the generation prompt (where the next turn parts), and the last prompt
 * token but one (/regen restores it and computes one token). A new prompt starts from the
 * longer of what the live sequence holds (when it is a prefix) and the longest cached copy. */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/session.h"
#include "tools/chat_repl.h"

epyq_status chat_render(const repl *r, const cJSON *msgs, bool gen_prompt, char **prompt,
                        int32_t **ids, size_t *n_ids, epyq_err *err) {
    cJSON *kw = cJSON_CreateObject();
    if (!kw) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    cJSON_AddBoolToObject(kw, "add_generation_prompt", gen_prompt);
    cJSON_AddBoolToObject(kw, "enable_thinking", r->think);
    char *text = NULL;
    size_t len;
    epyq_status st = epyq_chat_render(r->tmpl, msgs, kw, &text, &len, err);
    cJSON_Delete(kw);
    if (st == EPYQ_OK) st = epyq_tok_encode(r->tok, text, len, ids, n_ids, err);
    if (prompt && st == EPYQ_OK) *prompt = text;
    else
        free(text);
    return st;
}

static size_t common(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t k = 0;
    while (k < na && k < nb && a[k] == b[k]) k++;
    return k;
}

/* Token count of msgs' rendering without the generation prompt when it is a prefix of
 * ids[0, n) (it is for Qwen's template; a template where it is not gets no mark), else 0. */
static int32_t prefix_mark(const repl *r, const cJSON *msgs, const int32_t *ids, size_t n) {
    int32_t *p = NULL;
    size_t np = 0;
    epyq_err err;
    int32_t mark = 0;
    if (chat_render(r, msgs, false, NULL, &p, &np, &err) == EPYQ_OK && np > 0 && np < n &&
        common(p, np, ids, n) == np)
        mark = (int32_t)np;
    free(p);
    return mark;
}

/* The sequence at the longest reusable prefix of ids[0, n) of at most max_len tokens; held
 * records what it then holds. */
static size_t reach(repl *r, const int32_t *ids, size_t n, size_t max_len) {
    epyq_gen *g = &r->gen;
    size_t live = 0, from;
    if (r->n_held > 0 && !g->spec_k && (size_t)r->n_held <= max_len &&
        epyq_seq_pos(g->seq) == r->n_held &&
        common(r->held, (size_t)r->n_held, ids, n) == (size_t)r->n_held)
        live = (size_t)r->n_held;
    from = live;
    /* a copy from the cache stops before the first image: its keys are ids, and pads are the
     * same ids for different images (tools/chat_image.c) */
    if (r->n_imgs > 0 && r->vision)
        for (size_t k = 0; k < max_len; k++)
            if (ids[k] == epyq_vision_cfg(r->vision)->image_token_id) max_len = k;
    double t0 = epyq_now();
    if (r->cache && !g->spec_k &&
        (size_t)epyq_prefix_longest(r->cache, ids, n, (int32_t)max_len) > live) {
        int32_t got = epyq_prefix_restore(r->cache, ids, n, (int32_t)max_len, g->seq);
        if (got > 0) from = (size_t)got; /* a failed restore left the live sequence alone */
    }
    r->last_restore_s = epyq_now() - t0;
    if (from == 0) epyq_seq_reset(g->seq);
    if (from != live) memcpy(r->held, ids, from * sizeof *ids);
    r->n_held = (int32_t)from;
    return from;
}

/* Ids every prompt that continues `base` starts with: base rendered up to where a next user
 * message's text would begin (two renderings that differ only in that text agree up to there;
 * Qwen's template refuses a history without a user message, so base alone will not do). */
static epyq_status stable_ids(const repl *r, const cJSON *base, int32_t **ids, size_t *n,
                              epyq_err *err) {
    int32_t *b = NULL;
    size_t nb = 0;
    epyq_status st = EPYQ_OK;
    *ids = NULL, *n = 0;
    for (int k = 0; k < 2 && st == EPYQ_OK; k++) {
        cJSON *msgs = cJSON_Duplicate(base, 1), *u = cJSON_CreateObject();
        if (!msgs || !u) st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
        if (st == EPYQ_OK) {
            cJSON_AddStringToObject(u, "role", "user");
            cJSON_AddStringToObject(u, "content", k ? "b" : "a");
            cJSON_AddItemToArray(msgs, u), u = NULL;
            st = chat_render(r, msgs, false, NULL, k ? &b : ids, k ? &nb : n, err);
        }
        cJSON_Delete(msgs), cJSON_Delete(u);
    }
    if (st == EPYQ_OK) *n = common(*ids, *n, b, nb);
    free(b);
    return st;
}

size_t chat_prepare(repl *r, const int32_t *ids, size_t n_ids) {
    epyq_gen *g = &r->gen;
    size_t from = reach(r, ids, n_ids, n_ids - 1); /* the last token's logits are needed */
    g->n_marks = 0;
    if (!r->cache || g->spec_k) return from;
    int n = cJSON_GetArraySize(r->msgs);
    const cJSON *m0 = cJSON_GetArrayItem(r->msgs, 0), *ro = cJSON_GetObjectItem(m0, "role");
    if (n > 1 && cJSON_IsString(ro) && !strcmp(ro->valuestring, "system")) {
        cJSON *sys = cJSON_CreateArray();
        int32_t *p = NULL;
        size_t np = 0;
        epyq_err err;
        if (sys) cJSON_AddItemToArray(sys, cJSON_Duplicate(m0, 1));
        if (sys && stable_ids(r, sys, &p, &np, &err) == EPYQ_OK && np > 0 && np < n_ids &&
            common(p, np, ids, n_ids) == np)
            g->marks[g->n_marks++] = (int32_t)np;
        cJSON_Delete(sys);
        free(p);
    }
    int32_t mk = prefix_mark(r, r->msgs, ids, n_ids);
    if (mk) g->marks[g->n_marks++] = mk;
    if (n_ids > 1) g->marks[g->n_marks++] = (int32_t)n_ids - 1;
    return from;
}

char *chat_conv_json(const repl *r) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddItemToObject(o, "messages", cJSON_Duplicate(r->msgs, 1));
    cJSON_AddBoolToObject(o, "enable_thinking", r->think);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

/* {"messages": [{role, content}, …]} (or the bare array). */
epyq_status chat_conv_parse(const char *what, const char *text, size_t len, cJSON **out,
                            bool *think, epyq_err *err) {
    cJSON *o = cJSON_ParseWithLength(text, len);
    cJSON *msgs = cJSON_IsArray(o) ? o : cJSON_GetObjectItemCaseSensitive(o, "messages");
    const cJSON *m;
    bool ok = cJSON_IsArray(msgs);
    cJSON *each = ok ? msgs : NULL;
    cJSON_ArrayForEach(m, each) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role")) ||
            !cJSON_IsString(c))
            ok = false;
    }
    if (!ok) {
        cJSON_Delete(o);
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: expected {\"messages\": [{\"role\": …, \"content\": \"…\"}, …]}",
                            what);
    }
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(o, "enable_thinking");
    if (cJSON_IsBool(th)) *think = cJSON_IsTrue(th);
    *out = cJSON_Duplicate(msgs, 1);
    cJSON_Delete(o);
    return *out ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
}

epyq_status chat_session_save(repl *r, const char *path, epyq_err *err) {
    epyq_gen *g = &r->gen;
    if (r->n_imgs > 0) /* the file would need the images and the sequence's rope delta */
        return epyq_err_set(err, EPYQ_E_ARG, "%s: sessions do not keep images yet: not saved",
                            path);
    int32_t *ids = NULL;
    size_t n = 0;
    epyq_status st = stable_ids(r, r->msgs, &ids, &n, err);
    /* speculation leaves verified tokens past the answer in the sequence: no state then */
    if (st == EPYQ_OK && (g->spec_k || (int64_t)n >= epyq_seq_ctx(g->seq))) n = 0;
    if (st == EPYQ_OK) {
        size_t from = reach(r, ids, n, n);
        if (from < n) {
            epyq_gen_stats gs;
            g->marks[0] = (int32_t)n, g->n_marks = 1;
            st = epyq_gen_generate_from(g, ids, n, from, 0, NULL, NULL, NULL, NULL, &gs, err);
            if (st == EPYQ_OK) memcpy(r->held, ids, n * sizeof *ids), r->n_held = (int32_t)n;
            else
                epyq_seq_reset(g->seq), r->n_held = 0;
        }
    }
    uint64_t len = st == EPYQ_OK ? epyq_seq_snapshot_size(g->seq, r->n_held) : 0;
    void *snap = st == EPYQ_OK ? malloc(len) : NULL;
    char *conv = st == EPYQ_OK ? chat_conv_json(r) : NULL;
    if (st == EPYQ_OK && (!snap || !conv))
        st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", path);
    if (st == EPYQ_OK) {
        epyq_seq_snapshot(g->seq, snap);
        epyq_seq_snapshot_detach(snap);
        epyq_session s = {{r->model_id, (int32_t)r->kv, epyq_seq_ctx(g->seq)},
                          r->held,
                          r->n_held,
                          conv,
                          strlen(conv),
                          snap,
                          len};
        st = epyq_session_write(path, &s, err);
    }
    free(snap), free(conv), free(ids);
    return st;
}

epyq_status chat_session_load(repl *r, const char *path, epyq_err *err) {
    epyq_seq *seq = r->gen.seq;
    epyq_session_id want = {r->model_id, (int32_t)r->kv, epyq_seq_ctx(seq)};
    epyq_session s;
    void *blob = NULL;
    cJSON *msgs = NULL;
    bool think = r->think;
    epyq_status st = epyq_session_read(path, &want, &s, &blob, err);
    if (st == EPYQ_OK) st = chat_conv_parse(path, s.conv, (size_t)s.conv_len, &msgs, &think, err);
    int32_t V = epyq_model_config(r->gen.model)->vocab_size;
    for (int32_t i = 0; st == EPYQ_OK && i < s.n_ids; i++)
        if (s.ids[i] < 0 || s.ids[i] >= V)
            st = epyq_err_set(err, EPYQ_E_FORMAT,
                              "%s: tokens: expected ids below %d, found %d at position %d", path, V,
                              s.ids[i], i);
    if (st == EPYQ_OK &&
        (s.n_ids >= want.n_ctx || s.snap_len != epyq_seq_snapshot_size(seq, s.n_ids) ||
         epyq_seq_snapshot_pos(s.snap) != s.n_ids))
        st = epyq_err_set(err, EPYQ_E_FORMAT,
                          "%s: state: expected a %llu-byte copy at position %d, found %llu bytes",
                          path, (unsigned long long)epyq_seq_snapshot_size(seq, s.n_ids), s.n_ids,
                          (unsigned long long)s.snap_len);
    epyq_err e2 = {0};
    if (st == EPYQ_OK && epyq_seq_restore_detached(seq, s.snap, s.snap_len, &e2) != EPYQ_OK)
        st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: %s", path, e2.msg);
    if (st == EPYQ_OK) {
        memcpy(r->held, s.ids, (size_t)s.n_ids * sizeof *s.ids);
        r->n_held = s.n_ids;
        cJSON_Delete(r->msgs);
        r->msgs = msgs, msgs = NULL;
        r->think = think;
    }
    cJSON_Delete(msgs);
    free(blob);
    return st;
}
