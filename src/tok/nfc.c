/* src/tok/nfc.c — NFC with utf8proc, applied only where it can change something.
 *
 * Almost all text is already NFC, and utf8proc_map costs ~100x a plain scan, so the text is
 * cut into normalization segments and only segments that may change go through utf8proc. A
 * segment starts before every "inert" code point: ccc 0, no canonical decomposition, never the
 * second half of a canonical composition (utf8proc marks those with comb_index >= 0x8000;
 * Hangul V and T jamo compose algorithmically). Such a code point is an NFC_Quick_Check=Yes
 * starter, and NFC never acts across the boundary before one (UAX #15, "stable code points"),
 * so normalizing segment by segment equals normalizing the whole text. A segment of one inert
 * code point is left as it is; any other segment is normalized by utf8proc_map.
 *
 * Unicode versions: HF tokenizers 0.22 normalizes with the Unicode 9.0 tables of
 * unicode-normalization-alignments, utf8proc with its own newer ones (15.0 on Debian 12). The
 * normalization data of a character never changes once assigned, so the only differences are
 * characters assigned after 9.0 that have a nonzero combining class, a canonical decomposition
 * or take part in a canonical composition: the reference sees them as unassigned (a starter
 * that neither decomposes nor composes). Those code points are listed below — derived from
 * UCD 15.0 DerivedAge.txt + UnicodeData.txt + CompositionExclusions.txt (age > 9.0 and
 * ccc != 0, or canonical decomposition, or second part of a primary composite) — and kept out
 * of utf8proc's hands: each is a segment of its own, copied as it is. So e.g. U+11935 U+11930
 * is not composed to U+11938 and U+1AC1 is not reordered, exactly like the reference. A
 * utf8proc newer than Unicode 15.0 would know characters of 15.1+ this list does not name. */
#include <stdlib.h>
#include <utf8proc.h>

#include "tok/tok_internal.h"

/* Post-Unicode-9.0 code points with normalization data in Unicode 15.0 (110 in 38 ranges). */
static const uint32_t newer_than_reference[][2] = {
    {0x07FD, 0x07FD},   {0x0898, 0x089F},   {0x08CA, 0x08D3},   {0x09FE, 0x09FE},   {0x0C3C, 0x0C3C},
    {0x0D3B, 0x0D3C},   {0x0EBA, 0x0EBA},   {0x1715, 0x1715},   {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},
    {0xA82C, 0xA82C},   {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50},
    {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
    {0x11930, 0x11930}, {0x11938, 0x11938}, {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0},
    {0x11A34, 0x11A34}, {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45},
    {0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136},
    {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF},
};

static bool newer(uint32_t cp) {
    size_t lo = 0, hi = sizeof newer_than_reference / sizeof newer_than_reference[0];
    if (cp < newer_than_reference[0][0]) return false;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < newer_than_reference[mid][0])
            hi = mid;
        else if (cp > newer_than_reference[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

static bool inert(uint32_t cp) {
    if (cp < 0x80) return true;
    if ((cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2)) return false; /* Hangul V, T */
    const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
    if (p->combining_class != 0) return false;
    if (p->decomp_type == 0 && p->decomp_seqindex != UINT16_MAX) return false; /* canonical decomposition */
    return p->comb_index == UINT16_MAX || p->comb_index < 0x8000;
}

static epyq_status append_nfc(const uint8_t *s, size_t n, epyq_sbuf *out, epyq_err *err) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map(s, (utf8proc_ssize_t)n, &dst, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) {
        free(dst);
        return epyq_err_set(err, r == UTF8PROC_ERROR_NOMEM ? EPYQ_E_NOMEM : EPYQ_E_INTERNAL,
                            "tokenizer: NFC of a %zu-byte segment failed: %s", n, utf8proc_errmsg(r));
    }
    bool ok = epyq_sbuf_add(out, dst, (size_t)r);
    free(dst);
    return ok ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: out of memory normalizing text");
}

epyq_status epyq_tok_nfc(const uint8_t *s, size_t n, epyq_sbuf *out, bool *changed, epyq_err *err) {
    *changed = false;
    size_t copied = 0, seg = 0;
    bool dirty = false;
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) { /* ASCII: inert; the common case stays a byte loop */
            if (dirty) goto boundary;
            seg = i++;
            continue;
        }
        size_t cl;
        uint32_t cp = epyq_tok_utf8_get(s + i, n - i, &cl);
        if (newer(cp)) { /* unassigned for the reference: a segment of its own, kept as it is */
            if (dirty) goto boundary;
            i += cl;
            seg = i;
            continue;
        }
        if (!inert(cp)) {
            dirty = true;
            i += cl;
            continue;
        }
        if (dirty) goto boundary;
        seg = i;
        i += cl;
        continue;
    boundary: /* s[seg, i) needs NFC; s[i] starts a new segment */
        if (!epyq_sbuf_add(out, s + copied, seg - copied)) return epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: out of memory normalizing text");
        epyq_status st = append_nfc(s + seg, i - seg, out, err);
        if (st) return st;
        copied = seg = i;
        dirty = false;
        *changed = true;
    }
    if (!*changed && !dirty) return EPYQ_OK; /* already NFC: the caller keeps its own bytes */
    if (!epyq_sbuf_add(out, s + copied, seg - copied)) return epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: out of memory normalizing text");
    if (dirty) {
        epyq_status st = append_nfc(s + seg, n - seg, out, err);
        if (st) return st;
    } else if (!epyq_sbuf_add(out, s + seg, n - seg)) {
        return epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: out of memory normalizing text");
    }
    *changed = true;
    return EPYQ_OK;
}
