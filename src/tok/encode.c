/* src/tok/encode.c — the encode pipeline of tokenizers, stage by stage:
 *
 *   raw text --(repair to valid UTF-8)--> added tokens with normalized=false are cut out
 *   --> each gap is normalized (NFC) --> added tokens with normalized=true are cut out
 *   --> each gap is split by the pre-tokenizer regex --> each piece goes through BPE.
 *
 * The added-token scan is the reference's Aho-Corasick "leftmost-longest" search: the
 * earliest position where any token matches, the longest token there, then the search resumes
 * after it; single_word/lstrip/rstrip are applied to each match afterwards, as the reference
 * does (a rejected single_word match is skipped, not retried at a later offset). */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_internal.h"

typedef struct {
    const epyq_tok *t;
    unsigned flags;
    tok_cache *cache;
    tok_split_state split;
    tok_ids out;
    epyq_err *err;
} enc;

/* Regex split (Isolated: matches and the gaps between them are pieces), then BPE. */
static epyq_status encode_normalized(enc *E, const uint8_t *s, size_t n) {
    const epyq_tok *t = E->t;
    if (!t->split_re) return epyq_tok_bpe_piece(t, E->cache, s, n, &E->out, E->err);
    size_t pos = 0, prev = 0;
    while (pos < n) {
        size_t ms, me;
        bool found;
        epyq_status st = epyq_tok_split_find(t, &E->split, s, n, pos, &ms, &me, &found, E->err);
        if (st) return st;
        if (!found) break;
        if (me == ms) { /* an empty match makes no piece: step over one character */
            size_t cl;
            epyq_tok_utf8_get(s + ms, n - ms, &cl);
            pos = ms + cl;
            continue;
        }
        if (prev < ms && (st = epyq_tok_bpe_piece(t, E->cache, s + prev, ms - prev, &E->out, E->err))) return st;
        if ((st = epyq_tok_bpe_piece(t, E->cache, s + ms, me - ms, &E->out, E->err))) return st;
        prev = pos = me;
    }
    return prev < n ? epyq_tok_bpe_piece(t, E->cache, s + prev, n - prev, &E->out, E->err) : EPYQ_OK;
}

/* Index of the longest added token of the given kind starting at s[pos], or -1. */
static long longest_added_at(const epyq_tok *t, bool normalized, unsigned flags, const uint8_t *s, size_t n, size_t pos) {
    long best = -1;
    uint32_t best_len = 0;
    for (size_t i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        if (((a->flags & TOK_ADDED_NORMALIZED) != 0) != normalized || a->len <= best_len || a->len > n - pos) continue;
        if ((flags & EPYQ_TOK_ENC_SPLIT_SPECIAL) && (a->flags & TOK_ADDED_SPECIAL)) continue;
        if (!memcmp(s + pos, t->pool + a->off, a->len)) {
            best = (long)i;
            best_len = a->len;
        }
    }
    return best;
}

typedef epyq_status (*gap_fn)(enc *E, const uint8_t *s, size_t n);

/* Cut the added tokens of one kind out of s; gaps go to next(). */
static epyq_status split_added(enc *E, bool normalized, const uint8_t *s, size_t n, gap_fn next) {
    const epyq_tok *t = E->t;
    size_t start_offset = 0, pos = 0;
    epyq_status st;
    while (pos < n) {
        if (!t->added_first[normalized][s[pos]]) {
            pos++;
            continue;
        }
        long k = longest_added_at(t, normalized, E->flags, s, n, pos);
        if (k < 0) {
            pos++;
            continue;
        }
        const tok_added *a = &t->added[k];
        size_t start = pos, stop = pos + a->len, cl;
        pos = stop;
        if (a->flags & TOK_ADDED_SINGLE_WORD) {
            bool word_before = start > 0 && epyq_tok_is_word_char(epyq_tok_utf8_get_prev(s, start, &cl));
            bool word_after = stop < n && epyq_tok_is_word_char(epyq_tok_utf8_get(s + stop, n - stop, &cl));
            if (word_before || word_after) continue;
        }
        if (a->flags & TOK_ADDED_LSTRIP) /* swallow the spaces before it, not past the last cut */
            while (start > start_offset && epyq_tok_is_white_space(epyq_tok_utf8_get_prev(s, start, &cl))) start -= cl;
        if (a->flags & TOK_ADDED_RSTRIP)
            while (stop < n && epyq_tok_is_white_space(epyq_tok_utf8_get(s + stop, n - stop, &cl))) stop += cl;
        if (start_offset < start && (st = next(E, s + start_offset, start - start_offset))) return st;
        if ((st = epyq_tok_ids_push(&E->out, a->id, E->err))) return st;
        start_offset = pos = stop;
    }
    return start_offset < n ? next(E, s + start_offset, n - start_offset) : EPYQ_OK;
}

static epyq_status after_normalize(enc *E, const uint8_t *s, size_t n) {
    if (E->t->has_normalized_added) return split_added(E, true, s, n, encode_normalized);
    return encode_normalized(E, s, n);
}

/* NFC of one gap (epyq_tok_nfc leaves text that is already NFC uncopied). */
static epyq_status normalize_gap(enc *E, const uint8_t *s, size_t n) {
    if (!E->t->nfc) return after_normalize(E, s, n);
    epyq_sbuf norm = {0};
    bool changed;
    epyq_status st = epyq_tok_nfc(s, n, &norm, &changed, E->err);
    if (!st) st = changed ? after_normalize(E, (const uint8_t *)norm.p, norm.len) : after_normalize(E, s, n);
    epyq_sbuf_free(&norm);
    return st;
}

epyq_status epyq_tok_encode_ex(const epyq_tok *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                               size_t *n_ids, epyq_err *err) {
    *ids = NULL;
    *n_ids = 0;
    enc E = {.t = t, .flags = flags, .err = err};
    const uint8_t *s = (const uint8_t *)text;
    epyq_sbuf fixed = {0};
    /* The reference only ever sees valid strings: repair like String::from_utf8_lossy. */
    if (!epyq_tok_utf8_valid(s, len)) {
        if (epyq_tok_utf8_lossy(s, len, true, &fixed) == SIZE_MAX) {
            epyq_sbuf_free(&fixed);
            return epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: out of memory repairing a %zu-byte text", len);
        }
        s = (const uint8_t *)fixed.p;
        len = fixed.len;
    }
    E.cache = epyq_tok_cache_acquire(t);
    epyq_status st = split_added(&E, false, s, len, normalize_gap);
    epyq_tok_cache_release(E.cache);
    epyq_tok_split_state_free(&E.split);
    epyq_sbuf_free(&fixed);
    if (!st && !E.out.v && !(E.out.v = malloc(sizeof *E.out.v)))
        st = epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: out of memory");
    if (st) {
        free(E.out.v);
        return st;
    }
    *ids = E.out.v;
    *n_ids = E.out.n;
    return EPYQ_OK;
}

epyq_status epyq_tok_encode(const epyq_tok *t, const char *text, size_t len, int32_t **ids, size_t *n_ids,
                            epyq_err *err) {
    return epyq_tok_encode_ex(t, text, len, 0, ids, n_ids, err);
}
