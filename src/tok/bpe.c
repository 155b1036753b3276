/* src/tok/bpe.c — byte-level BPE on one pre-tokenized piece, and the per-word cache.
 *
 * The reference merges with a binary heap ordered by (rank, position): the lowest-ranked
 * adjacent pair first, the leftmost one when the same pair occurs twice. Since every pair has
 * one rank, "pop the heap" and "scan for the leftmost minimum" pick the same pair every step,
 * so short words use a cache-friendly scan over a compact array and long ones the heap; the
 * unit tests run both on the same words. */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_internal.h"

#define SCAN_MAX 64          /* words up to this many symbols use the linear scan */
#define CACHE_KEY_MAX 64     /* longer pieces are not cached (rare, and they would evict) */
#define NO_RANK UINT32_MAX

epyq_status epyq_tok_ids_push(tok_ids *a, int32_t id, epyq_err *err) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = cap <= SIZE_MAX / sizeof *v ? realloc(a->v, cap * sizeof *v) : NULL;
        if (!v) return epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: cannot grow the id list to %zu ids", cap);
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return EPYQ_OK;
}

static uint32_t pair_rank(const tok_pairmap *m, int32_t a, int32_t b, int32_t *merged) {
    uint32_t rank;
    return tok_pairmap_get(m, a, b, &rank, merged) ? rank : NO_RANK;
}

/* rank[i] / mid[i] describe the pair (sym[i], sym[i+1]); merging at i removes entry i+1. */
static size_t merge_scan(const tok_pairmap *m, int32_t *sym, size_t n, uint32_t *rank, int32_t *mid) {
    for (size_t i = 0; i + 1 < n; i++) rank[i] = pair_rank(m, sym[i], sym[i + 1], &mid[i]);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == NO_RANK) break;
        sym[best] = mid[best];
        size_t tail = n - best - 2; /* entries after the removed one */
        memmove(sym + best + 1, sym + best + 2, tail * sizeof *sym);
        memmove(rank + best + 1, rank + best + 2, (tail ? tail - 1 : 0) * sizeof *rank);
        memmove(mid + best + 1, mid + best + 2, (tail ? tail - 1 : 0) * sizeof *mid);
        n--;
        if (best > 0) rank[best - 1] = pair_rank(m, sym[best - 1], sym[best], &mid[best - 1]);
        if (best + 1 < n) rank[best] = pair_rank(m, sym[best], sym[best + 1], &mid[best]);
    }
    return n;
}

/* Min-heap of (rank << 32 | position): equal ranks pop leftmost first, as in the reference. */
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= last) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static size_t merge_heap(const tok_pairmap *m, int32_t *sym, size_t n) {
    /* Each merge pushes at most two pairs, so the heap never holds more than 3n entries. */
    int32_t *prev = malloc(n * sizeof *prev), *next = malloc(n * sizeof *next);
    uint64_t *heap = n <= SIZE_MAX / 3 / sizeof *heap ? malloc(3 * n * sizeof *heap) : NULL;
    if (!prev || !next || !heap) {
        free(prev);
        free(next);
        free(heap);
        return SIZE_MAX;
    }
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        int32_t mid;
        uint32_t r = i + 1 < n ? pair_rank(m, sym[i], sym[i + 1], &mid) : NO_RANK;
        if (r != NO_RANK) heap_push(heap, &hn, (uint64_t)r << 32 | i);
    }
    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        uint32_t r = (uint32_t)(top >> 32);
        size_t pos = (uint32_t)top;
        /* Stale entries: the symbol was merged away (sym < 0) or its pair changed since. */
        if (sym[pos] < 0 || next[pos] < 0) continue;
        size_t nx = (size_t)next[pos];
        int32_t mid;
        if (pair_rank(m, sym[pos], sym[nx], &mid) != r) continue;
        sym[pos] = mid;
        sym[nx] = -1;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = (int32_t)pos;
        if (prev[pos] >= 0) {
            size_t pv = (size_t)prev[pos];
            uint32_t pr = pair_rank(m, sym[pv], sym[pos], &mid);
            if (pr != NO_RANK) heap_push(heap, &hn, (uint64_t)pr << 32 | pv);
        }
        if (next[pos] >= 0) {
            uint32_t nr = pair_rank(m, sym[pos], sym[next[pos]], &mid);
            if (nr != NO_RANK) heap_push(heap, &hn, (uint64_t)nr << 32 | pos);
        }
    }
    size_t out = 0;
    for (size_t i = 0; i < n; i++)
        if (sym[i] >= 0) sym[out++] = sym[i];
    free(prev);
    free(next);
    free(heap);
    return out;
}

size_t epyq_tok_bpe_merge(const tok_pairmap *merges, int32_t *sym, size_t n, int mode) {
    if (n < 2 || merges->n == 0) return n;
    if (mode == 2 || (mode == 0 && n > SCAN_MAX)) return merge_heap(merges, sym, n);
    if (n <= SCAN_MAX) {
        uint32_t rank[SCAN_MAX];
        int32_t mid[SCAN_MAX];
        return merge_scan(merges, sym, n, rank, mid);
    }
    uint32_t *rank = malloc(n * sizeof *rank);
    int32_t *mid = malloc(n * sizeof *mid);
    size_t out = rank && mid ? merge_scan(merges, sym, n, rank, mid) : SIZE_MAX;
    free(rank);
    free(mid);
    return out;
}

/* ---- word cache ------------------------------------------------------------------------ */

/* One probe touches one 24-byte slot: hash, and where the key and its ids live. */
typedef struct {
    uint64_t hash;     /* 0 = empty */
    uint32_t key_off;  /* key bytes at keys[key_off, key_off + key_len) */
    uint32_t ids_off;  /* ids at ids[ids_off, ids_off + n_ids) */
    uint8_t key_len, n_ids;
} cache_slot_t;

struct tok_cache {
    pthread_mutex_t mu;
    size_t cap;            /* slots, a power of two */
    size_t max_entries;    /* cleared wholesale when reached: simple, and a working set of
                            * ordinary text fits many times over */
    size_t n;
    cache_slot_t *slots;   /* [cap] */
    uint8_t *keys;         /* [max_entries * 16] key bytes */
    size_t keys_len;
    int32_t *ids;          /* [max_entries * 8] cached id runs */
    size_t ids_len;
};

tok_cache *epyq_tok_cache_new(size_t entries) {
    if (entries == 0 || entries > ((size_t)1 << 24)) return NULL;
    tok_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->max_entries = entries;
    c->cap = 16;
    while (c->cap < entries * 2) c->cap *= 2;
    c->slots = calloc(c->cap, sizeof *c->slots);
    /* Average pieces are ~5 bytes; budget 16 bytes and 8 ids per entry, reset when full. */
    c->keys = malloc(entries * 16);
    c->ids = malloc(entries * 8 * sizeof *c->ids);
    if (!c->slots || !c->keys || !c->ids || pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c->slots);
        free(c->keys);
        free(c->ids);
        free(c);
        return NULL;
    }
    return c;
}

void epyq_tok_cache_free(tok_cache *c) {
    if (!c) return;
    pthread_mutex_destroy(&c->mu);
    free(c->slots);
    free(c->keys);
    free(c->ids);
    free(c);
}

tok_cache *epyq_tok_cache_acquire(const epyq_tok *t) {
    if (!t->cache || pthread_mutex_trylock(&t->cache->mu) != 0) return NULL;
    return t->cache;
}

void epyq_tok_cache_release(tok_cache *c) {
    if (c) pthread_mutex_unlock(&c->mu);
}

static void cache_clear(tok_cache *c) {
    memset(c->slots, 0, c->cap * sizeof *c->slots);
    c->n = c->keys_len = c->ids_len = 0;
}

/* Slot holding key s[0, n) (hash h), or the empty slot where it would go. */
static cache_slot_t *cache_slot(const tok_cache *c, uint64_t h, const uint8_t *s, size_t n) {
    size_t mask = c->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        cache_slot_t *e = &c->slots[i];
        if (e->hash == 0) return e;
        if (e->hash == h && e->key_len == n && !memcmp(c->keys + e->key_off, s, n)) return e;
    }
}

static void cache_put(tok_cache *c, uint64_t h, const uint8_t *s, size_t n, const int32_t *ids, size_t k) {
    if (c->n + 1 > c->max_entries || c->keys_len + n > c->max_entries * 16 ||
        c->ids_len + k > c->max_entries * 8)
        cache_clear(c);
    cache_slot_t *e = cache_slot(c, h, s, n);
    if (e->hash) return;
    *e = (cache_slot_t){.hash = h, .key_off = (uint32_t)c->keys_len, .ids_off = (uint32_t)c->ids_len,
                        .key_len = (uint8_t)n, .n_ids = (uint8_t)k};
    memcpy(c->keys + c->keys_len, s, n);
    c->keys_len += n;
    memcpy(c->ids + c->ids_len, ids, k * sizeof *ids);
    c->ids_len += k;
    c->n++;
}

/* ---- one piece ------------------------------------------------------------------------ */

epyq_status epyq_tok_bpe_piece(const epyq_tok *t, tok_cache *cache, const uint8_t *s, size_t n, tok_ids *out,
                          epyq_err *err) {
    if (n == 0) return EPYQ_OK;
    uint64_t h = 0;
    if (cache && n <= CACHE_KEY_MAX) {
        h = epyq_tok_hash_bytes(s, n) | 1; /* never 0, the empty mark */
        const cache_slot_t *e = cache_slot(cache, h, s, n);
        if (e->hash) {
            for (size_t k = 0; k < e->n_ids; k++) {
                epyq_status st = epyq_tok_ids_push(out, cache->ids[e->ids_off + k], err);
                if (st) return st;
            }
            return EPYQ_OK;
        }
    }
    int32_t small[SCAN_MAX];
    int32_t *sym = n <= SCAN_MAX ? small : malloc(n * sizeof *sym);
    if (!sym) return epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: cannot allocate a %zu-byte word", n);
    /* Every byte starts as its own symbol; a byte whose character is missing from the
     * vocabulary becomes unk_token, or is dropped when there is none (as in the reference). */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id < 0) {
            if (t->unk_id < 0) continue;
            if (t->fuse_unk && k > 0 && sym[k - 1] == t->unk_id) continue;
            id = t->unk_id;
        }
        sym[k++] = id;
    }
    k = epyq_tok_bpe_merge(&t->merges, sym, k, 0);
    epyq_status st = EPYQ_OK;
    if (k == SIZE_MAX) st = epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: out of memory merging a %zu-byte word", n);
    for (size_t i = 0; !st && i < k; i++) st = epyq_tok_ids_push(out, sym[i], err);
    if (!st && cache && n <= CACHE_KEY_MAX) cache_put(cache, h, s, n, sym, k);
    if (sym != small) free(sym);
    return st;
}
