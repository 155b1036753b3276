/* src/tok/tok_internal.h — the tokenizer's internal state, shared by its files only.
 *
 * Promise: nothing here is API; tokenizer.h is. The layout keeps every per-id array indexed by
 * id (size n_ids) and every string in one pool, so loading does few allocations and encode
 * works on integer ids only. */
#ifndef EPYQ_TOK_INTERNAL_H
#define EPYQ_TOK_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/status.h"
#include "tok/sbuf.h"
#include "tok/tokenizer.h"

/* ---- hash maps (maps.c) ---------------------------------------------------------------- */

uint64_t epyq_tok_hash_bytes(const void *p, size_t n);

/* Byte string -> int32, keys live in a caller-owned pool (offsets, so the pool may grow).
 * One 16-byte slot per probe, with a hash tag so a miss rarely touches the pool. */
typedef struct {
    uint32_t off;  /* key offset in the pool, UINT32_MAX = empty */
    uint32_t len;  /* key length */
    uint32_t tag;  /* high half of the key's hash */
    int32_t val;
} tok_strslot;

typedef struct {
    tok_strslot *slots; /* [cap] */
    size_t cap, n;      /* cap is a power of two, n <= cap / 2 */
} tok_strmap;

epyq_status epyq_tok_strmap_init(tok_strmap *m, size_t expect, epyq_err *err);
void epyq_tok_strmap_free(tok_strmap *m);
/* Insert or overwrite. key = pool[off, off+len). */
epyq_status epyq_tok_strmap_put(tok_strmap *m, const char *pool, uint32_t off, uint32_t len, int32_t val,
                           epyq_err *err);
/* Value of key s[0, n), or -1. */
int32_t epyq_tok_strmap_get(const tok_strmap *m, const char *pool, const char *s, size_t n);

/* (left id, right id) -> (merge rank, merged id). */
typedef struct {
    uint64_t *keys;   /* [cap] (uint64)left << 32 | right, UINT64_MAX = empty */
    uint64_t *vals;   /* [cap] (uint64)rank << 32 | merged id */
    size_t cap, n;
} tok_pairmap;

epyq_status epyq_tok_pairmap_init(tok_pairmap *m, size_t expect, epyq_err *err);
void epyq_tok_pairmap_free(tok_pairmap *m);
void epyq_tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t merged);
/* true (and the rank and merged id) when the pair merges. */
static inline bool tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, uint32_t *rank,
                                   int32_t *merged) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)(h >> 32) & mask;; i = (i + 1) & mask) {
        if (m->keys[i] == key) {
            *rank = (uint32_t)(m->vals[i] >> 32);
            *merged = (int32_t)(uint32_t)m->vals[i];
            return true;
        }
        if (m->keys[i] == UINT64_MAX) return false;
    }
}

/* ---- byte-level alphabet (bytelevel.c) --------------------------------------------------- */

/* Code point GPT-2's byte-to-unicode table gives byte b. */
uint32_t epyq_tok_bytelevel_char(uint8_t b);
/* Byte of a byte-level code point, or -1 when cp is not in the table. */
int epyq_tok_bytelevel_byte(uint32_t cp);

/* ---- UTF-8 (utf8.c) ---------------------------------------------------------------------- */

/* Append s[0, n) to out as valid UTF-8, each maximal ill-formed subsequence replaced by
 * U+FFFD (Rust's from_utf8_lossy). With final=false an incomplete but so far valid sequence
 * at the very end is held back: the return value is the number of bytes consumed (n when
 * final). Returns SIZE_MAX when out cannot grow. */
size_t epyq_tok_utf8_lossy(const uint8_t *s, size_t n, bool final, epyq_sbuf *out);
bool epyq_tok_utf8_valid(const uint8_t *s, size_t n);
/* Decode the code point at s (valid UTF-8 assumed); *len gets its byte length. */
uint32_t epyq_tok_utf8_get(const uint8_t *s, size_t n, size_t *len);
/* Code point before s[end] (valid UTF-8 assumed); *len gets its byte length. */
uint32_t epyq_tok_utf8_get_prev(const uint8_t *s, size_t end, size_t *len);
/* Unicode White_Space (what Rust's char::is_whitespace and Oniguruma's \s test). */
bool epyq_tok_is_white_space(uint32_t cp);
/* Rust regex's Unicode \w: alphabetic, mark, decimal digit, connector punctuation, joiners. */
bool epyq_tok_is_word_char(uint32_t cp);

/* ---- the tokenizer ----------------------------------------------------------------------- */

enum { TOK_ADDED_SINGLE_WORD = 1, TOK_ADDED_LSTRIP = 2, TOK_ADDED_RSTRIP = 4, TOK_ADDED_NORMALIZED = 8,
       TOK_ADDED_SPECIAL = 16 };

typedef struct {
    uint32_t off, len; /* content = pool[off, off+len) (raw UTF-8, never empty) */
    int32_t id;
    unsigned flags;    /* TOK_ADDED_* */
} tok_added;

/* Per-word BPE result cache (bpe.c). */
typedef struct tok_cache tok_cache;

struct epyq_tok {
    char *pool;              /* [pool_len] token strings (byte-level) and added contents */
    size_t pool_len;
    int32_t n_ids;           /* 1 + largest id */
    uint32_t *tok_off;       /* [n_ids] token string offset in pool, UINT32_MAX = no token */
    uint32_t *tok_len;       /* [n_ids] token string length */
    uint8_t *dec;            /* [dec_len] decoded bytes of every id, concatenated */
    uint32_t *dec_off;       /* [n_ids + 1] id i decodes to dec[dec_off[i], dec_off[i+1]) */
    uint8_t *is_special;     /* [n_ids] 1 for special added tokens */
    tok_strmap vocab;        /* model vocabulary: byte-level string -> id */
    tok_strmap added_map;    /* added tokens: content -> id */
    int32_t model_size;      /* entries in the model vocabulary */
    tok_added *added;        /* [n_added] in trie order: special ones first, then the rest */
    size_t n_added;
    uint8_t added_first[2][256]; /* [normalized?][byte] 1 if some added token starts with it */
    bool has_normalized_added;

    int32_t byte_id[256];    /* id of each byte's single byte-level char, -1 = none */
    int32_t unk_id;          /* BPE unk_token id, -1 = none (unknown bytes are dropped) */
    bool fuse_unk;
    tok_pairmap merges;      /* (left, right) -> (rank, merged) */

    bool nfc;                /* normalizer is NFC */
    pcre2_code *split_re;    /* pre-tokenizer Split regex (Isolated), NULL = no split */
    bool split_jit;          /* split_re was JIT-compiled */

    tok_cache *cache;        /* NULL when disabled */

    char *chat_template;     /* NULL when absent */
    int32_t eos_id, pad_id;
};

/* A growing id array. */
typedef struct {
    int32_t *v; /* [cap] */
    size_t n, cap;
} tok_ids;

epyq_status epyq_tok_ids_push(tok_ids *a, int32_t id, epyq_err *err);

/* The word cache is taken for a whole encode call with a trylock: a thread that finds it busy
 * encodes without it (same ids, only slower), so callers never wait on each other. */
tok_cache *epyq_tok_cache_acquire(const epyq_tok *t);
void epyq_tok_cache_release(tok_cache *c);
tok_cache *epyq_tok_cache_new(size_t entries);
void epyq_tok_cache_free(tok_cache *c);

/* ---- NFC (nfc.c) ------------------------------------------------------------------------ */

/* NFC of valid UTF-8 s[0, n). When the text is already NFC nothing is written and *changed
 * is false (use s as it is); else the normalized text is appended to out. */
epyq_status epyq_tok_nfc(const uint8_t *s, size_t n, epyq_sbuf *out, bool *changed, epyq_err *err);

/* ---- Split pre-tokenizer (pretok.c) ---------------------------------------------------- */

epyq_status epyq_tok_split_compile(const char *pat, size_t len, bool literal, pcre2_code **out, bool *jit,
                              const char *label, epyq_err *err);

/* Per-encode-call regex scratch (match data, and a JIT stack made only if needed). */
typedef struct {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *js;
} tok_split_state;

void epyq_tok_split_state_free(tok_split_state *st);
/* Next match of the split regex in s[0, n) at or after from. */
epyq_status epyq_tok_split_find(const epyq_tok *t, tok_split_state *st, const uint8_t *s, size_t n, size_t from,
                           size_t *mstart, size_t *mend, bool *found, epyq_err *err);

/* BPE of one pre-tokenized piece (raw bytes) appended to out. cache may be NULL. */
epyq_status epyq_tok_bpe_piece(const epyq_tok *t, tok_cache *cache, const uint8_t *s, size_t n, tok_ids *out,
                          epyq_err *err);
/* The merge loop on symbol ids sym[0, n) in place; returns the new count, or SIZE_MAX when
 * scratch memory cannot be had. mode 0 = automatic (linear scan for short words, heap for
 * long ones), 1 = always the scan, 2 = always the heap: tests check the two agree. */
size_t epyq_tok_bpe_merge(const tok_pairmap *merges, int32_t *sym, size_t n, int mode);

#endif
