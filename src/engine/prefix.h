/* src/engine/prefix.h — the engine's prompt-prefix cache (issue 15): copies of sequence state
 * (epyq_seq_snapshot) keyed by the exact token prefix that produced them, kept least recently
 * used first out under a byte budget — copies no request has restored from yet before those
 * that have served one.
 *
 * A hybrid model's DeltaNet state cannot be rewound, so a cached prefix is only usable where a
 * copy was taken: the engine takes them at every multiple of `every` prompt tokens and at the
 * end of each prompt. A lookup returns the longest cached prefix of a prompt (the tokens of
 * every entry compared; an insert finds its duplicate by hash, then a full compare). Every byte an
 * entry holds (tokens, snapshot, the entry itself) counts against the budget; an entry larger than
 * the whole budget is not kept. */
#ifndef EPYQ_PREFIX_H
#define EPYQ_PREFIX_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/model.h"

typedef struct epyq_prefix epyq_prefix;

typedef struct {
    uint64_t bytes, budget; /* held now / allowed */
    uint64_t entries;       /* held now */
    uint64_t inserted, evicted, hits, misses;
} epyq_prefix_stats;

epyq_status epyq_prefix_create(epyq_prefix **out, uint64_t budget_bytes, epyq_err *err);
void epyq_prefix_free(epyq_prefix *c);
/* Length of the longest cached prefix of ids[0, n) of at most max_len tokens (0: none). */
int32_t epyq_prefix_longest(const epyq_prefix *c, const int32_t *ids, size_t n, int32_t max_len);
/* The same, and s restored to it (its position becomes the returned length); the entry becomes
 * the most recently used. A restore that fails counts as a miss and leaves s unchanged. */
int32_t epyq_prefix_restore(epyq_prefix *c, const int32_t *ids, size_t n, int32_t max_len,
                            epyq_seq *s);
/* True when ids[0, n) is cached. */
bool epyq_prefix_has(const epyq_prefix *c, const int32_t *ids, size_t n);
/* Keep a copy of s (standing at position n after ids[0, n)) unless that prefix is cached
 * already (then it is only marked used). Evicts least recently used entries to make room.
 * EPYQ_E_NOMEM only when memory itself runs out; a snapshot over the budget is skipped. */
epyq_status epyq_prefix_insert(epyq_prefix *c, const int32_t *ids, size_t n, const epyq_seq *s,
                               epyq_err *err);
void epyq_prefix_get_stats(const epyq_prefix *c, epyq_prefix_stats *st);

#endif
