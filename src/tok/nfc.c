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
 * Unicode versions (documented difference from the reference): HF tokenizers 0.22 normalizes
 * with the Unicode 9.0 tables of unicode-normalization-alignments; utf8proc here has its own,
 * newer tables (utf8proc_unicode_version(), 15.0 on Debian 12). Text containing a character
 * assigned after Unicode 9.0 that has a nonzero combining class, a canonical decomposition or
 * a canonical composition can normalize differently: e.g. U+11935 U+11930 composes to U+11938
 * (DIVES AKURU, Unicode 13) here but not in the reference, and marks such as U+1AC1 or U+0898
 * (Unicode 14) are reordered here and left in place there. See src/tok/README.md. */
#include <stdlib.h>
#include <utf8proc.h>

#include "tok/tok_internal.h"

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

epyq_status tok_nfc(const uint8_t *s, size_t n, epyq_sbuf *out, bool *changed, epyq_err *err) {
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
        uint32_t cp = tok_utf8_get(s + i, n - i, &cl);
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
