/* src/tok/tokenizer.c — loading tokenizer.json (+ tokenizer_config.json) into an epyq_tok.
 *
 * Everything model-specific comes from the files: vocabulary, merges, added tokens and their
 * flags, normalizer, split regex. Components other than the ones the Qwen family uses
 * (NFC, Split + ByteLevel, BPE, ByteLevel decoder) are refused with a message naming them,
 * rather than silently encoding differently. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/util.h"
#include "tok/json_text.h"
#include "tok/tok_internal.h"

#define TOKENIZER_JSON_MAX ((size_t)1 << 30)
#define CONFIG_JSON_MAX ((size_t)64 << 20)
#define ID_MAX ((int64_t)1 << 30) /* far above any vocabulary; keeps per-id arrays sane */
#define DEFAULT_CACHE_ENTRIES 65536

epyq_tok_opts epyq_tok_opts_default(void) {
    return (epyq_tok_opts){.config_added_tokens = false, .word_cache_entries = DEFAULT_CACHE_ENTRIES};
}

/* ---- small JSON helpers ---------------------------------------------------------------- */

static const char *jtype(const cJSON *it) {
    if (!it) return "nothing";
    if (cJSON_IsString(it)) return "a string";
    if (cJSON_IsNumber(it)) return "a number";
    if (cJSON_IsBool(it)) return "a boolean";
    if (cJSON_IsNull(it)) return "null";
    if (cJSON_IsArray(it)) return "an array";
    return "an object";
}

static bool jbool(const cJSON *obj, const char *key, bool dflt) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsBool(it) ? cJSON_IsTrue(it) : dflt;
}

/* A string field or NULL (missing / null / wrong type). */
static const char *jstr(const cJSON *obj, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

static bool jint(const cJSON *it, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(it)) return false;
    double d = it->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || d != (double)(int64_t)d) return false;
    *out = (int64_t)d;
    return true;
}

/* Parse a JSON file; a syntax error names the line. */
static epyq_status parse_json_file(const char *path, size_t max, cJSON **out, epyq_err *err) {
    char *text;
    size_t len;
    epyq_status st = epyq_file_read(path, max, &text, &len, err);
    if (st) return st;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root || !cJSON_IsObject(root)) {
        size_t at = end ? (size_t)(end - text) : 0, line = 1;
        for (size_t i = 0; i < at && i < len; i++) line += text[i] == '\n';
        free(text);
        cJSON_Delete(root);
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s:%zu: not a valid JSON object (error near byte %zu)", path, line, at);
    }
    free(text);
    *out = root;
    return EPYQ_OK;
}

/* ---- building ------------------------------------------------------------------------- */

/* Append bytes to the string pool; *off gets their offset. */
static epyq_status pool_add(epyq_sbuf *pool, const char *s, size_t n, uint32_t *off, epyq_err *err) {
    if (pool->len + n >= UINT32_MAX) return epyq_err_set(err, EPYQ_E_FORMAT, "tokenizer: token strings exceed 4 GiB");
    *off = (uint32_t)pool->len;
    if (!epyq_sbuf_add(pool, s, n)) return epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: out of memory for token strings");
    return EPYQ_OK;
}

typedef struct {
    epyq_tok *t;
    epyq_sbuf pool;
    /* tokenizer.json's text and the spans of model.vocab / model.merges in it: those two hold
     * nearly all of the file and are read straight from the text (a cJSON tree of them costs
     * more than everything else in loading); the tree holds the rest. */
    const char *text;
    size_t vocab_at, vocab_end, merges_at, merges_end;
    bool has_vocab, has_merges;
    int32_t max_id;
    size_t added_cap;
} loader;

/* tokenizer.json: locate model.vocab and model.merges in the text (validating the document on
 * the way), then let cJSON build a tree of everything else, with those two spans emptied. */
static epyq_status parse_tokenizer_json(const char *path, loader *L, char **text_out, cJSON **root, epyq_err *err) {
    char *text;
    size_t len;
    *root = NULL;
    epyq_status st = epyq_file_read(path, TOKENIZER_JSON_MAX, &text, &len, err);
    if (st) return st;
    static const char *const vpath[] = {"model", "vocab"}, *const mpath[] = {"model", "merges"};
    if ((st = epyq_json_find(text, len, vpath, 2, &L->vocab_at, &L->vocab_end, &L->has_vocab, err)) ||
        (st = epyq_json_find(text, len, mpath, 2, &L->merges_at, &L->merges_end, &L->has_merges, err))) {
        free(text);
        return epyq_err_prefix(err, "%s: not valid JSON: ", path);
    }
    /* The rest, with the two spans replaced by empty containers. */
    epyq_sbuf rest = {0};
    size_t spans[2][2] = {{L->has_vocab ? L->vocab_at : len, L->has_vocab ? L->vocab_end : len},
                          {L->has_merges ? L->merges_at : len, L->has_merges ? L->merges_end : len}};
    int lo = spans[0][0] <= spans[1][0] ? 0 : 1;
    bool ok = epyq_sbuf_add(&rest, text, spans[lo][0]) && epyq_sbuf_adds(&rest, spans[lo][0] < len ? (lo ? "[]" : "{}") : "") &&
              epyq_sbuf_add(&rest, text + spans[lo][1], spans[!lo][0] - spans[lo][1]) &&
              epyq_sbuf_adds(&rest, spans[!lo][0] < len ? (lo ? "{}" : "[]") : "") &&
              epyq_sbuf_add(&rest, text + spans[!lo][1], len - spans[!lo][1]);
    if (!ok) {
        free(text);
        epyq_sbuf_free(&rest);
        return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", path);
    }
    const char *end = NULL;
    *root = cJSON_ParseWithLengthOpts(rest.p, rest.len, &end, false);
    epyq_sbuf_free(&rest);
    if (!*root || !cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
        free(text);
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: not a valid JSON object", path);
    }
    L->text = text;
    *text_out = text;
    return EPYQ_OK;
}

static epyq_status load_merges(loader *L, const char *label, epyq_err *err);

static epyq_status load_model(loader *L, const cJSON *model, const char *label, epyq_err *err) {
    epyq_tok *t = L->t;
    if (!cJSON_IsObject(model)) return epyq_err_set(err, EPYQ_E_FORMAT, "%s: model: expected an object, found %s", label, jtype(model));
    const char *type = jstr(model, "type");
    if (type && strcmp(type, "BPE") != 0)
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: model.type: only BPE is supported, found \"%s\"", label, type);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble != 0.0)
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: model.dropout: BPE dropout is random and not supported (found %g)",
                            label, dropout->valuedouble);
    if (jbool(model, "byte_fallback", false))
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: model.byte_fallback=true is not supported", label);
    if (jbool(model, "ignore_merges", false))
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: model.ignore_merges=true is not supported", label);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        const char *a = jstr(model, affixes[i]);
        if (a && *a)
            return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: model.%s \"%s\" is not supported (expected empty)", label,
                                affixes[i], a);
    }
    t->fuse_unk = jbool(model, "fuse_unk", false);

    if (!L->has_vocab) return epyq_err_set(err, EPYQ_E_FORMAT, "%s: model.vocab: missing", label);
    epyq_json_reader r = {.s = (const uint8_t *)L->text, .n = L->vocab_end, .i = L->vocab_at, .err = err};
    epyq_sbuf key = {0};
    epyq_status st = epyq_tok_strmap_init(&t->vocab, (L->vocab_end - L->vocab_at) / 16, err);
    L->max_id = -1;
    if (!st && !epyq_json_read_char(&r, '{')) st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: model.vocab: expected an object", label);
    bool first = true;
    while (!st && !epyq_json_read_char(&r, '}')) {
        int64_t id;
        if (!first && !epyq_json_read_char(&r, ','))
            st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: model.vocab: byte %zu: expected ',' or '}'", label, r.i);
        else if (!(st = epyq_json_read_string(&r, &key)) && !epyq_json_read_char(&r, ':'))
            st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: model.vocab: byte %zu: expected ':'", label, r.i);
        else if (!st && (st = epyq_json_read_int(&r, 0, ID_MAX, &id)) == EPYQ_OK) {
            uint32_t off = 0;
            if (!(st = pool_add(&L->pool, key.p, key.len, &off, err)))
                st = epyq_tok_strmap_put(&t->vocab, L->pool.p, off, (uint32_t)key.len, (int32_t)id, err);
            if (id > L->max_id) L->max_id = (int32_t)id;
        }
        first = false;
    }
    epyq_sbuf_free(&key);
    if (st) return epyq_err_prefix(err, "%s: model.vocab: ", label);
    t->model_size = (int32_t)t->vocab.n;

    const char *unk = jstr(model, "unk_token");
    t->unk_id = unk ? epyq_tok_strmap_get(&t->vocab, L->pool.p, unk, strlen(unk)) : -1;
    if (unk && t->unk_id < 0)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: model.unk_token \"%.60s\" is not in the vocabulary", label, unk);

    for (int b = 0; b < 256; b++) {
        uint32_t cp = epyq_tok_bytelevel_char((uint8_t)b);
        char u[2] = {(char)cp, 0};
        if (cp >= 0x80) { /* every byte-level character is below U+0800: two bytes */
            u[0] = (char)(0xC0 | cp >> 6);
            u[1] = (char)(0x80 | (cp & 0x3F));
        }
        t->byte_id[b] = epyq_tok_strmap_get(&t->vocab, L->pool.p, u, cp < 0x80 ? 1 : 2);
    }

    return load_merges(L, label, err);
}

/* One merge: ["a", "b"] (tokenizers >= 0.20) or "a b" (older files); a and b go to x and y. */
static epyq_status read_merge(epyq_json_reader *r, epyq_sbuf *x, epyq_sbuf *y) {
    if (epyq_json_read_char(r, '[')) {
        epyq_status st = epyq_json_read_string(r, x);
        if (!st && !epyq_json_read_char(r, ','))
            return epyq_err_set(r->err, EPYQ_E_FORMAT, "byte %zu: expected ',' between the two parts", r->i);
        if (!st) st = epyq_json_read_string(r, y);
        if (!st && !epyq_json_read_char(r, ']'))
            return epyq_err_set(r->err, EPYQ_E_FORMAT, "byte %zu: expected ']' after two parts", r->i);
        return st;
    }
    size_t at = r->i;
    epyq_status st = epyq_json_read_string(r, x);
    if (st) return st;
    char *sp = memchr(x->p, ' ', x->len);
    if (!sp || memchr(sp + 1, ' ', x->len - (size_t)(sp + 1 - x->p)))
        return epyq_err_set(r->err, EPYQ_E_FORMAT, "byte %zu: expected \"a b\" with exactly one space", at);
    y->len = 0;
    if (!epyq_sbuf_add(y, sp + 1, x->len - (size_t)(sp + 1 - x->p))) return epyq_err_set(r->err, EPYQ_E_NOMEM, "out of memory");
    x->len = (size_t)(sp - x->p);
    x->p[x->len] = '\0';
    return EPYQ_OK;
}

static epyq_status load_merges(loader *L, const char *label, epyq_err *err) {
    epyq_tok *t = L->t;
    /* Sized from the text (a merge takes at least 6 bytes), so the map never grows. */
    size_t cap_hint = L->has_merges ? (L->merges_end - L->merges_at) / 6 + 1 : 1;
    epyq_status st = epyq_tok_pairmap_init(&t->merges, cap_hint, err);
    if (st || !L->has_merges) return st;
    epyq_json_reader r = {.s = (const uint8_t *)L->text, .n = L->merges_end, .i = L->merges_at, .err = err};
    epyq_sbuf a = {0}, b = {0}, cat = {0};
    if (!epyq_json_read_char(&r, '['))
        st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: model.merges: expected an array", label);
    uint32_t rank = 0;
    for (bool first = true; !st && !epyq_json_read_char(&r, ']'); first = false, rank++) {
        if (!first && !epyq_json_read_char(&r, ',')) {
            st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: model.merges: byte %zu: expected ',' or ']'", label, r.i);
            break;
        }
        if ((st = read_merge(&r, &a, &b))) {
            epyq_err_prefix(err, "%s: model.merges[%u]: ", label, rank);
            break;
        }
        int32_t ia = epyq_tok_strmap_get(&t->vocab, L->pool.p, a.p, a.len), ib = epyq_tok_strmap_get(&t->vocab, L->pool.p, b.p, b.len);
        cat.len = 0;
        if (!epyq_sbuf_add(&cat, a.p, a.len) || !epyq_sbuf_add(&cat, b.p, b.len)) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory reading merges", label);
            break;
        }
        int32_t im = epyq_tok_strmap_get(&t->vocab, L->pool.p, cat.p, cat.len);
        if (ia < 0 || ib < 0 || im < 0) {
            st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: model.merges[%u]: \"%.60s\" + \"%.60s\": %s is not in the vocabulary", label,
                              rank, a.p, b.p, ia < 0 ? "the left part" : ib < 0 ? "the right part" : "the merged token");
            break;
        }
        if (t->merges.n + 1 > t->merges.cap / 2) { /* cannot happen with the size hint; keep the map sparse anyway */
            st = epyq_err_set(err, EPYQ_E_INTERNAL, "%s: model.merges: more merges than the text can hold", label);
            break;
        }
        epyq_tok_pairmap_put(&t->merges, ia, ib, rank, im);
    }
    epyq_sbuf_free(&a);
    epyq_sbuf_free(&b);
    epyq_sbuf_free(&cat);
    return st;
}

/* The reference's AddedVocabulary::add_tokens for one token: an existing token keeps its id,
 * a new one gets the next id after the vocabulary (the "id" written in the file is only
 * checked, not trusted). */
static epyq_status add_token(loader *L, const char *content, unsigned flags, int64_t file_id, const char *label,
                             epyq_err *err) {
    epyq_tok *t = L->t;
    size_t len = strlen(content);
    if (len == 0) return EPYQ_OK;
    int32_t id = epyq_tok_strmap_get(&t->added_map, L->pool.p, content, len);
    if (id < 0) id = epyq_tok_strmap_get(&t->vocab, L->pool.p, content, len);
    if (id < 0) id = L->max_id >= t->model_size || t->model_size == 0 ? L->max_id + 1 : t->model_size;
    if (id > ID_MAX) return epyq_err_set(err, EPYQ_E_FORMAT, "%s: too many added tokens", label);
    if (file_id >= 0 && file_id != id)
        epyq_log_warn("%s: added token \"%s\" is listed with id %lld but gets id %d (as in HF tokenizers)", label, content,
                      (long long)file_id, id);
    for (size_t i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        if (a->len == len && !memcmp(L->pool.p + a->off, content, len)) {
            /* Re-added with other flags: the later declaration wins. */
            a->flags = flags;
            a->id = id;
            return EPYQ_OK;
        }
    }
    if (t->n_added == L->added_cap) {
        size_t cap = L->added_cap ? L->added_cap * 2 : 64;
        tok_added *na = realloc(t->added, cap * sizeof *na);
        if (!na) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory for added tokens", label);
        t->added = na;
        L->added_cap = cap;
    }
    uint32_t off = 0;
    epyq_status st = pool_add(&L->pool, content, len, &off, err);
    if (st || (st = epyq_tok_strmap_put(&t->added_map, L->pool.p, off, (uint32_t)len, id, err))) return st;
    t->added[t->n_added++] = (tok_added){.off = off, .len = (uint32_t)len, .id = id, .flags = flags};
    if (id > L->max_id) L->max_id = id;
    return EPYQ_OK;
}

static unsigned added_flags(const cJSON *o) {
    return (jbool(o, "single_word", false) ? TOK_ADDED_SINGLE_WORD : 0) | (jbool(o, "lstrip", false) ? TOK_ADDED_LSTRIP : 0) |
           (jbool(o, "rstrip", false) ? TOK_ADDED_RSTRIP : 0) | (jbool(o, "normalized", true) ? TOK_ADDED_NORMALIZED : 0) |
           (jbool(o, "special", false) ? TOK_ADDED_SPECIAL : 0);
}

static epyq_status load_added(loader *L, const cJSON *arr, const char *label, epyq_err *err) {
    if (!arr || cJSON_IsNull(arr)) return EPYQ_OK;
    if (!cJSON_IsArray(arr)) return epyq_err_set(err, EPYQ_E_FORMAT, "%s: added_tokens: expected an array, found %s", label, jtype(arr));
    size_t i = 0;
    for (const cJSON *o = arr->child; o; o = o->next, i++) {
        const char *content = jstr(o, "content");
        int64_t id = -1;
        if (!cJSON_IsObject(o) || !content)
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: added_tokens[%zu]: expected an object with a string \"content\"", label, i);
        jint(cJSON_GetObjectItemCaseSensitive(o, "id"), 0, ID_MAX, &id);
        /* Special tokens default to normalized=false in the reference (AddedToken::from). */
        unsigned flags = added_flags(o);
        if (!cJSON_GetObjectItemCaseSensitive(o, "normalized") && (flags & TOK_ADDED_SPECIAL)) flags &= ~(unsigned)TOK_ADDED_NORMALIZED;
        epyq_status st = add_token(L, content, flags, id, label, err);
        if (st) return st;
    }
    return EPYQ_OK;
}

/* tokenizer_config.json's added_tokens_decoder, in id order: only tokens tokenizer.json lacks. */
static epyq_status load_config_added(loader *L, const cJSON *dec, const char *label, epyq_err *err) {
    if (!cJSON_IsObject(dec)) return EPYQ_OK;
    size_t n = (size_t)cJSON_GetArraySize(dec), k = 0;
    struct ent { int64_t id; const cJSON *o; } *v = calloc(n ? n : 1, sizeof *v);
    if (!v) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
    for (const cJSON *o = dec->child; o; o = o->next) {
        char *end;
        long long id = strtoll(o->string, &end, 10);
        if (*end || id < 0 || id > ID_MAX || !cJSON_IsObject(o) || !jstr(o, "content")) {
            free(v);
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: added_tokens_decoder[\"%.40s\"]: expected an id key and an object with \"content\"",
                                label, o->string);
        }
        v[k++] = (struct ent){id, o};
    }
    for (size_t i = 1; i < k; i++) /* insertion sort: a few dozen entries */
        for (size_t j = i; j > 0 && v[j - 1].id > v[j].id; j--) {
            struct ent tmp = v[j];
            v[j] = v[j - 1];
            v[j - 1] = tmp;
        }
    epyq_status st = EPYQ_OK;
    for (size_t i = 0; i < k && !st; i++) {
        const char *content = jstr(v[i].o, "content");
        if (epyq_tok_strmap_get(&L->t->added_map, L->pool.p, content, strlen(content)) >= 0) continue;
        st = add_token(L, content, added_flags(v[i].o), v[i].id, label, err);
    }
    free(v);
    return st;
}

static bool is_type(const cJSON *o, const char *type) {
    const char *ty = jstr(o, "type");
    return ty && !strcmp(ty, type);
}

static epyq_status load_normalizer(epyq_tok *t, const cJSON *n, const char *label, epyq_err *err) {
    if (!n || cJSON_IsNull(n)) return EPYQ_OK;
    if (is_type(n, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        for (const cJSON *e = cJSON_IsArray(list) ? list->child : NULL; e; e = e->next) {
            epyq_status st = load_normalizer(t, e, label, err);
            if (st) return st;
        }
        return EPYQ_OK;
    }
    if (is_type(n, "NFC")) {
        t->nfc = true;
        return EPYQ_OK;
    }
    return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: normalizer type \"%s\" is not supported (supported: NFC, Sequence of NFC)",
                        label, jstr(n, "type") ? jstr(n, "type") : "?");
}

/* The ByteLevel pre-tokenizer's own regex (use_regex=true): the GPT-2 pattern, part of the
 * ByteLevel algorithm in the reference rather than of the file. */
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static epyq_status bytelevel_check(const cJSON *b, const char *what, const char *label, epyq_err *err) {
    if (jbool(b, "add_prefix_space", false))
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: %s ByteLevel add_prefix_space=true is not supported", label, what);
    return EPYQ_OK;
}

static epyq_status load_pretok(epyq_tok *t, const cJSON *p, const char *label, epyq_err *err) {
    const cJSON *one[1] = {p}, *const *list = one;
    size_t n = 1;
    const cJSON *seq[8];
    if (is_type(p, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        n = 0;
        for (const cJSON *e = cJSON_IsArray(arr) ? arr->child : NULL; e && n < 8; e = e->next) seq[n++] = e;
        list = seq;
    }
    /* Supported shapes: [Split (Isolated)] + ByteLevel(use_regex=false), or ByteLevel alone. */
    const cJSON *split = NULL, *bl = NULL;
    for (size_t i = 0; i < n; i++) {
        if (is_type(list[i], "Split") && !split && !bl)
            split = list[i];
        else if (is_type(list[i], "ByteLevel") && !bl)
            bl = list[i];
        else
            return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: pre_tokenizer: \"%s\" at position %zu is not supported "
                                "(supported: Split then ByteLevel)", label, jstr(list[i], "type") ? jstr(list[i], "type") : "?", i);
    }
    if (!bl) return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: pre_tokenizer: a ByteLevel step is required for byte-level BPE", label);
    epyq_status st = bytelevel_check(bl, "pre_tokenizer", label, err);
    if (st) return st;
    bool bl_regex = jbool(bl, "use_regex", true);
    if (split && bl_regex)
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: pre_tokenizer: Split followed by ByteLevel(use_regex=true) is not supported", label);
    if (!split) return bl_regex ? epyq_tok_split_compile(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, false, &t->split_re, &t->split_jit, label, err)
                                : EPYQ_OK;
    const char *beh = jstr(split, "behavior");
    if (!beh || strcmp(beh, "Isolated") != 0 || jbool(split, "invert", false))
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: pre_tokenizer Split: only behavior \"Isolated\" without invert is supported (found \"%s\")",
                            label, beh ? beh : "?");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(split, "pattern");
    const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
    if (!re && !lit) return epyq_err_set(err, EPYQ_E_FORMAT, "%s: pre_tokenizer Split: pattern needs \"Regex\" or \"String\"", label);
    return epyq_tok_split_compile(re ? re : lit, strlen(re ? re : lit), !re, &t->split_re, &t->split_jit, label, err);
}

/* Per id: its token string (added content wins over the model's) and the bytes the ByteLevel
 * decoder makes of it — the raw UTF-8 of the string when any of its characters is outside the
 * byte alphabet, exactly as the reference's decode_chain falls back. */
static epyq_status build_id_tables(loader *L, const char *label, epyq_err *err) {
    epyq_tok *t = L->t;
    t->n_ids = L->max_id + 1;
    size_t n = (size_t)t->n_ids;
    t->tok_off = malloc((n ? n : 1) * sizeof *t->tok_off);
    t->tok_len = calloc(n ? n : 1, sizeof *t->tok_len);
    t->is_special = calloc(n ? n : 1, 1);
    t->dec_off = malloc((n + 1) * sizeof *t->dec_off);
    if (!t->tok_off || !t->tok_len || !t->is_special || !t->dec_off) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
    memset(t->tok_off, 0xff, n * sizeof *t->tok_off);
    const tok_strmap *v = &t->vocab;
    for (size_t i = 0; i < v->cap; i++) {
        const tok_strslot *e = &v->slots[i];
        if (e->off == UINT32_MAX) continue;
        t->tok_off[e->val] = e->off;
        t->tok_len[e->val] = e->len;
    }
    for (size_t i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        t->tok_off[a->id] = a->off;
        t->tok_len[a->id] = a->len;
        t->is_special[a->id] = (a->flags & TOK_ADDED_SPECIAL) != 0;
    }
    epyq_sbuf dec = {0};
    for (size_t id = 0; id < n; id++) {
        t->dec_off[id] = (uint32_t)dec.len;
        if (t->tok_off[id] == UINT32_MAX) continue;
        const uint8_t *s = (const uint8_t *)L->pool.p + t->tok_off[id];
        size_t len = t->tok_len[id], start = dec.len;
        bool fallback = false;
        for (size_t i = 0; i < len;) {
            size_t cl;
            int b = epyq_tok_bytelevel_byte(epyq_tok_utf8_get(s + i, len - i, &cl));
            if (b < 0) {
                fallback = true;
                break;
            }
            char c = (char)b;
            if (!epyq_sbuf_add(&dec, &c, 1)) goto nomem;
            i += cl;
        }
        if (fallback) {
            dec.len = start;
            if (!epyq_sbuf_add(&dec, s, len)) goto nomem;
        }
        if (dec.len >= UINT32_MAX) goto nomem;
    }
    t->dec_off[n] = (uint32_t)dec.len;
    t->dec = (uint8_t *)epyq_sbuf_take(&dec, NULL);
    return t->dec ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
nomem:
    epyq_sbuf_free(&dec);
    return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory building the decode table", label);
}

/* eos_token / pad_token are a string or an AddedToken-like object. */
static int32_t config_token_id(const epyq_tok *t, const cJSON *cfg, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(cfg, key);
    const char *s = cJSON_IsString(it) ? it->valuestring : jstr(it, "content");
    return s ? epyq_tok_id(t, s) : -1;
}

static epyq_status load_config(loader *L, const char *dir, const epyq_tok_opts *opts, epyq_err *err) {
    epyq_tok *t = L->t;
    char *path = epyq_path_join(dir, "tokenizer_config.json");
    if (!path) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    FILE *probe = fopen(path, "rb");
    cJSON *cfg = NULL;
    epyq_status st = EPYQ_OK;
    if (probe) {
        fclose(probe);
        st = parse_json_file(path, CONFIG_JSON_MAX, &cfg, err);
    }
    if (!st && cfg && opts->config_added_tokens)
        st = load_config_added(L, cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder"), path, err);
    if (!st && cfg) {
        /* A plain string, or (older configs) a list of {"name", "template"}: take "default". */
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
        for (const cJSON *e = cJSON_IsArray(ct) ? ct->child : NULL; e && !tmpl; e = e->next)
            if (jstr(e, "name") && !strcmp(jstr(e, "name"), "default")) tmpl = jstr(e, "template");
        if (tmpl && !(t->chat_template = strdup(tmpl))) st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    }
    free(path);
    /* transformers lets a separate chat_template.jinja override the config's template. */
    if (!st && (path = epyq_path_join(dir, "chat_template.jinja")) != NULL) {
        char *text;
        if ((probe = fopen(path, "rb")) != NULL) {
            fclose(probe);
            st = epyq_file_read(path, CONFIG_JSON_MAX, &text, NULL, err);
            if (!st) {
                free(t->chat_template);
                t->chat_template = text;
            }
        }
        free(path);
    }
    t->pool = L->pool.p;
    if (!st && (st = build_id_tables(L, "tokenizer", err)) == EPYQ_OK) {
        t->eos_id = cfg ? config_token_id(t, cfg, "eos_token") : -1;
        t->pad_id = cfg ? config_token_id(t, cfg, "pad_token") : -1;
    }
    cJSON_Delete(cfg);
    return st;
}

static void index_added(epyq_tok *t) {
    memset(t->added_first, 0, sizeof t->added_first);
    t->has_normalized_added = false;
    for (size_t i = 0; i < t->n_added; i++) {
        bool norm = (t->added[i].flags & TOK_ADDED_NORMALIZED) != 0;
        t->added_first[norm][(uint8_t)t->pool[t->added[i].off]] = 1;
        t->has_normalized_added |= norm;
    }
}

epyq_status epyq_tok_load_opts(epyq_tok **out, const char *dir, const epyq_tok_opts *opts, epyq_err *err) {
    *out = NULL;
    epyq_tok_opts dflt = epyq_tok_opts_default();
    if (!opts) opts = &dflt;
    char *path = epyq_path_join(dir, "tokenizer.json");
    epyq_tok *t = calloc(1, sizeof *t);
    if (!path || !t) {
        free(path);
        free(t);
        return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    }
    t->unk_id = t->eos_id = t->pad_id = -1;
    loader L = {.t = t};
    cJSON *root = NULL;
    char *text = NULL;
    epyq_status st = parse_tokenizer_json(path, &L, &text, &root, err);
    if (!st) st = epyq_tok_strmap_init(&t->added_map, 64, err);
    if (!st) st = load_model(&L, cJSON_GetObjectItemCaseSensitive(root, "model"), path, err);
    if (!st) st = load_added(&L, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), path, err);
    if (!st) st = load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), path, err);
    if (!st) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
        if (!p || cJSON_IsNull(p))
            st = epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: pre_tokenizer: a ByteLevel step is required for byte-level BPE", path);
        else
            st = load_pretok(t, p, path, err);
    }
    if (!st) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "decoder");
        if (!is_type(d, "ByteLevel"))
            st = epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: decoder: only ByteLevel is supported, found %s", path,
                              jstr(d, "type") ? jstr(d, "type") : jtype(d));
    }
    cJSON_Delete(root);
    free(text);
    L.text = NULL;
    if (!st) st = load_config(&L, dir, opts, err);
    free(path);
    t->pool = L.pool.p;
    t->pool_len = L.pool.len;
    if (!st) {
        index_added(t);
        if (opts->word_cache_entries && !(t->cache = epyq_tok_cache_new(opts->word_cache_entries)))
            st = epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: cannot allocate a word cache of %zu entries", opts->word_cache_entries);
    }
    if (st) {
        epyq_tok_free(t);
        return st;
    }
    *out = t;
    return EPYQ_OK;
}

epyq_status epyq_tok_load(epyq_tok **out, const char *dir, epyq_err *err) {
    epyq_tok_opts o = epyq_tok_opts_default();
    return epyq_tok_load_opts(out, dir, &o, err);
}

void epyq_tok_free(epyq_tok *t) {
    if (!t) return;
    free(t->pool);
    free(t->tok_off);
    free(t->tok_len);
    free(t->dec);
    free(t->dec_off);
    free(t->is_special);
    epyq_tok_strmap_free(&t->vocab);
    epyq_tok_strmap_free(&t->added_map);
    free(t->added);
    epyq_tok_pairmap_free(&t->merges);
    pcre2_code_free(t->split_re);
    epyq_tok_cache_free(t->cache);
    free(t->chat_template);
    free(t);
}

int32_t epyq_tok_vocab_size(const epyq_tok *t) { return t->n_ids; }

int32_t epyq_tok_id(const epyq_tok *t, const char *token) {
    size_t n = strlen(token);
    int32_t id = epyq_tok_strmap_get(&t->added_map, t->pool, token, n);
    return id >= 0 ? id : epyq_tok_strmap_get(&t->vocab, t->pool, token, n);
}

bool epyq_tok_is_special(const epyq_tok *t, int32_t id) { return id >= 0 && id < t->n_ids && t->is_special[id]; }

const char *epyq_tok_chat_template(const epyq_tok *t) { return t->chat_template; }
int32_t epyq_tok_eos_id(const epyq_tok *t) { return t->eos_id; }
int32_t epyq_tok_pad_id(const epyq_tok *t) { return t->pad_id; }
