/* src/engine/prefix.c — see prefix.h. A handful to a few hundred entries of tens of MB each:
 * a linear scan per lookup costs nothing next to one forward pass, so the entries sit in one
 * array ordered by last use (index 0 = least recent). */
#include "engine/prefix.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t hash, bytes; /* bytes: everything this entry holds */
    int32_t n;            /* prefix length = snapshot position */
    bool hit;             /* restored from at least once */
    int32_t *ids;
    void *snap;
    uint64_t snap_len;
} entry;

struct epyq_prefix {
    entry *e;
    size_t n, cap;
    epyq_prefix_stats st;
};

/* FNV-1a over the token ids: equal prefixes hash equal; the compare after it makes it exact. */
static uint64_t hash_ids(const int32_t *ids, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        for (int b = 0; b < 4; b++) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
    }
    return h;
}

epyq_status epyq_prefix_create(epyq_prefix **out, uint64_t budget_bytes, epyq_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return epyq_err_set(err, EPYQ_E_NOMEM, "prefix cache: out of memory");
    (*out)->st.budget = budget_bytes;
    return EPYQ_OK;
}

static void entry_free(entry *x) { free(x->ids), free(x->snap); }

void epyq_prefix_free(epyq_prefix *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) entry_free(&c->e[i]);
    free(c->e);
    free(c);
}

/* Index of the entry holding exactly ids[0, n), or -1. */
static ptrdiff_t find(const epyq_prefix *c, const int32_t *ids, size_t n, uint64_t h) {
    for (size_t i = c->n; i-- > 0;)
        if (c->e[i].hash == h && (size_t)c->e[i].n == n &&
            !memcmp(c->e[i].ids, ids, n * sizeof *ids))
            return (ptrdiff_t)i;
    return -1;
}

/* Move entry i to the most recently used end. */
static void touch(epyq_prefix *c, size_t i) {
    entry x = c->e[i];
    memmove(&c->e[i], &c->e[i + 1], (c->n - i - 1) * sizeof x);
    c->e[c->n - 1] = x;
}

bool epyq_prefix_has(const epyq_prefix *c, const int32_t *ids, size_t n) {
    return find(c, ids, n, hash_ids(ids, n)) >= 0;
}

/* Index of the longest entry that is a prefix of ids[0, n) and at most max_len long, or -1. */
static ptrdiff_t longest(const epyq_prefix *c, const int32_t *ids, size_t n, int32_t max_len) {
    ptrdiff_t best = -1;
    for (size_t i = 0; i < c->n; i++) {
        const entry *x = &c->e[i];
        if (x->n > max_len || (size_t)x->n > n || (best >= 0 && x->n <= c->e[best].n)) continue;
        if (!memcmp(x->ids, ids, (size_t)x->n * sizeof *ids)) best = (ptrdiff_t)i;
    }
    return best;
}

int32_t epyq_prefix_longest(const epyq_prefix *c, const int32_t *ids, size_t n, int32_t max_len) {
    ptrdiff_t b = longest(c, ids, n, max_len);
    return b < 0 ? 0 : c->e[b].n;
}

int32_t epyq_prefix_restore(epyq_prefix *c, const int32_t *ids, size_t n, int32_t max_len,
                            epyq_seq *s) {
    ptrdiff_t best = longest(c, ids, n, max_len);
    if (best < 0) {
        c->st.misses++;
        return 0;
    }
    int32_t len = c->e[best].n;
    epyq_err err;
    if (epyq_seq_restore(s, c->e[best].snap, c->e[best].snap_len, &err) != EPYQ_OK) {
        c->st.misses++;
        return 0;
    }
    c->e[best].hit = true;
    touch(c, (size_t)best);
    c->st.hits++;
    return len;
}

epyq_status epyq_prefix_insert(epyq_prefix *c, const int32_t *ids, size_t n, const epyq_seq *s,
                               epyq_err *err) {
    uint64_t h = hash_ids(ids, n);
    ptrdiff_t at = find(c, ids, n, h);
    if (at >= 0) {
        touch(c, (size_t)at);
        return EPYQ_OK;
    }
    uint64_t snap_len = epyq_seq_snapshot_size(s, (int32_t)n);
    uint64_t bytes = snap_len + n * sizeof *ids + sizeof(entry);
    if (n == 0 || bytes > c->st.budget || (int64_t)n != epyq_seq_pos(s))
        return EPYQ_OK; /* cannot be kept */
    /* Copies nothing has restored from yet go first, least recently used first; then the
     * others, the same way. Without that, a batch's stream of end-of-prompt copies (each of a
     * prompt of its own, never reused) would push out the one shared prefix every request
     * restores, once the budget holds fewer copies than requests run together. */
    while (c->st.bytes + bytes > c->st.budget && c->n) {
        size_t v = 0;
        while (v < c->n && c->e[v].hit) v++;
        if (v == c->n) v = 0;
        c->st.bytes -= c->e[v].bytes;
        entry_free(&c->e[v]);
        memmove(&c->e[v], &c->e[v + 1], (c->n - v - 1) * sizeof *c->e);
        c->n--;
        c->st.evicted++;
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        entry *ne = realloc(c->e, cap * sizeof *ne);
        if (!ne) return epyq_err_set(err, EPYQ_E_NOMEM, "prefix cache: out of memory");
        c->e = ne, c->cap = cap;
    }
    entry x = {h, bytes, (int32_t)n, false, malloc(n * sizeof *ids), malloc(snap_len), snap_len};
    if (!x.ids || !x.snap) {
        entry_free(&x);
        return epyq_err_set(err, EPYQ_E_NOMEM,
                            "prefix cache: a %llu-byte state snapshot: out of memory",
                            (unsigned long long)snap_len);
    }
    memcpy(x.ids, ids, n * sizeof *ids);
    epyq_seq_snapshot(s, x.snap);
    c->e[c->n++] = x;
    c->st.bytes += bytes;
    c->st.entries = c->n;
    c->st.inserted++;
    return EPYQ_OK;
}

void epyq_prefix_get_stats(const epyq_prefix *c, epyq_prefix_stats *st) {
    *st = c->st;
    st->entries = c->n;
}
