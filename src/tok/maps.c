/* src/tok/maps.c — the two hash maps the tokenizer needs: token string -> id and
 * (id, id) -> merge. Open addressing with linear probing, capacity a power of two kept at most
 * half full, so lookups stay one or two probes; no deletion is ever needed. */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "tok/tok_internal.h"

uint64_t epyq_tok_hash_bytes(const void *p, size_t n) {
    /* 8 bytes at a time with a multiply-xorshift mix: token strings are short, and this is
     * several times faster than byte-wise FNV on the word-cache keys. */
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    return h;
}

static size_t cap_for(size_t expect) {
    size_t cap = 16;
    while (cap < expect * 2 + 2) cap *= 2;
    return cap;
}

epyq_status epyq_tok_strmap_init(tok_strmap *m, size_t expect, epyq_err *err) {
    memset(m, 0, sizeof *m);
    if (expect > ((size_t)1 << 30)) return epyq_err_set(err, EPYQ_E_FORMAT, "map of %zu entries is too large", expect);
    m->cap = cap_for(expect);
    m->slots = malloc(m->cap * sizeof *m->slots);
    if (!m->slots) return epyq_err_set(err, EPYQ_E_NOMEM, "cannot allocate a map of %zu entries", expect);
    for (size_t i = 0; i < m->cap; i++) m->slots[i].off = UINT32_MAX;
    return EPYQ_OK;
}

void epyq_tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* Slot index from the tag alone, so growing never needs the key bytes. */
static inline size_t home(uint32_t tag, size_t mask) { return ((size_t)tag * 0x9E3779B1u) & mask; }

static epyq_status strmap_grow(tok_strmap *m, epyq_err *err) {
    tok_strmap bigger;
    epyq_status st = epyq_tok_strmap_init(&bigger, m->cap, err);
    if (st) return st;
    size_t mask = bigger.cap - 1;
    for (size_t i = 0; i < m->cap; i++) {
        const tok_strslot *e = &m->slots[i];
        if (e->off == UINT32_MAX) continue;
        size_t j = home(e->tag, mask);
        while (bigger.slots[j].off != UINT32_MAX) j = (j + 1) & mask;
        bigger.slots[j] = *e;
    }
    bigger.n = m->n;
    epyq_tok_strmap_free(m);
    *m = bigger;
    return EPYQ_OK;
}

epyq_status epyq_tok_strmap_put(tok_strmap *m, const char *pool, uint32_t off, uint32_t len, int32_t val,
                           epyq_err *err) {
    if ((m->n + 1) * 2 > m->cap) {
        epyq_status st = strmap_grow(m, err);
        if (st) return st;
    }
    uint32_t tag = (uint32_t)(epyq_tok_hash_bytes(pool + off, len) >> 32);
    size_t mask = m->cap - 1;
    for (size_t i = home(tag, mask);; i = (i + 1) & mask) {
        tok_strslot *e = &m->slots[i];
        if (e->off == UINT32_MAX) {
            *e = (tok_strslot){.off = off, .len = len, .tag = tag, .val = val};
            m->n++;
            return EPYQ_OK;
        }
        if (e->tag == tag && e->len == len && !memcmp(pool + e->off, pool + off, len)) {
            e->val = val;
            return EPYQ_OK;
        }
    }
}

int32_t epyq_tok_strmap_get(const tok_strmap *m, const char *pool, const char *s, size_t n) {
    if (!m->cap) return -1;
    uint32_t tag = (uint32_t)(epyq_tok_hash_bytes(s, n) >> 32);
    size_t mask = m->cap - 1;
    for (size_t i = home(tag, mask);; i = (i + 1) & mask) {
        const tok_strslot *e = &m->slots[i];
        if (e->off == UINT32_MAX) return -1;
        if (e->tag == tag && e->len == n && !memcmp(pool + e->off, s, n)) return e->val;
    }
}

epyq_status epyq_tok_pairmap_init(tok_pairmap *m, size_t expect, epyq_err *err) {
    memset(m, 0, sizeof *m);
    if (expect > ((size_t)1 << 30)) return epyq_err_set(err, EPYQ_E_FORMAT, "%zu merges is too many", expect);
    m->cap = cap_for(expect);
    m->keys = malloc(m->cap * sizeof *m->keys);
    m->vals = malloc(m->cap * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        epyq_tok_pairmap_free(m);
        return epyq_err_set(err, EPYQ_E_NOMEM, "cannot allocate a merge table of %zu entries", expect);
    }
    memset(m->keys, 0xff, m->cap * sizeof *m->keys);
    return EPYQ_OK;
}

void epyq_tok_pairmap_free(tok_pairmap *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* The caller sized the map for all its merges at init, so it never grows. */
void epyq_tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)(h >> 32) & mask;; i = (i + 1) & mask) {
        if (m->keys[i] == UINT64_MAX) {
            m->keys[i] = key;
            m->n++;
        } else if (m->keys[i] != key) {
            continue;
        }
        /* A repeated pair keeps its last rank, as the reference's HashMap collect does. */
        m->vals[i] = (uint64_t)rank << 32 | (uint32_t)merged;
        return;
    }
}
