/* src/tok/utf8.c — UTF-8 repair and the few Unicode predicates the tokenizer needs.
 *
 * epyq_tok_utf8_lossy follows the Unicode "maximal subpart" rule (Unicode 15, section 3.9,
 * table 3-7), which is what Rust's String::from_utf8_lossy implements: a lead byte followed by
 * fewer continuation bytes than it needs becomes one U+FFFD; a byte that cannot start or
 * continue a sequence becomes one U+FFFD on its own. The reference decoder runs exactly this
 * over the decoded bytes, and the CLI runs it over raw input. */
#include <utf8proc.h>

#include "tok/tok_internal.h"

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Length a lead byte announces (0 = cannot start a sequence) and the allowed range of the
 * second byte, which is narrower than 80..BF after E0, ED, F0 and F4 (overlongs, surrogates,
 * > U+10FFFF). */
static int lead_info(uint8_t b, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (b < 0x80) return 1;
    if (b < 0xC2) return 0;
    if (b < 0xE0) return 2;
    if (b < 0xF0) {
        if (b == 0xE0) *lo = 0xA0;
        if (b == 0xED) *hi = 0x9F;
        return 3;
    }
    if (b < 0xF5) {
        if (b == 0xF0) *lo = 0x90;
        if (b == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

size_t epyq_tok_utf8_lossy(const uint8_t *s, size_t n, bool final, epyq_sbuf *out) {
    if (n == 0) return 0; /* s may be NULL then */
    size_t i = 0, run = 0; /* s[run, i) is valid and not yet copied */
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint8_t lo, hi;
        int need = lead_info(s[i], &lo, &hi);
        size_t got = 1;
        while ((int)got < need && i + got < n) {
            uint8_t c = s[i + got];
            if (got == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
            got++;
        }
        if (need && (int)got == need) {
            i += got;
            continue;
        }
        if (need && i + got == n && !final) break; /* a valid prefix cut by the end: hold it */
        if (!epyq_sbuf_add(out, s + run, i - run) || !epyq_sbuf_add(out, REPLACEMENT, 3)) return SIZE_MAX;
        i += got;
        run = i;
    }
    if (!epyq_sbuf_add(out, s + run, i - run)) return SIZE_MAX;
    return i;
}

bool epyq_tok_utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint8_t lo, hi;
        int need = lead_info(s[i], &lo, &hi);
        if (!need || i + (size_t)need > n || s[i + 1] < lo || s[i + 1] > hi) return false;
        for (int k = 2; k < need; k++)
            if ((s[i + (size_t)k] & 0xC0) != 0x80) return false;
        i += (size_t)need;
    }
    return true;
}

uint32_t epyq_tok_utf8_get(const uint8_t *s, size_t n, size_t *len) {
    uint32_t c = s[0];
    size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (l > n) l = n;
    if (l > 1) c &= 0x3Fu >> (l - 1);
    for (size_t k = 1; k < l; k++) c = c << 6 | (s[k] & 0x3Fu);
    *len = l;
    return c;
}

uint32_t epyq_tok_utf8_get_prev(const uint8_t *s, size_t end, size_t *len) {
    size_t start = end;
    while (start > 0 && end - start < 4) {
        start--;
        if ((s[start] & 0xC0) != 0x80) break;
    }
    return epyq_tok_utf8_get(s + start, end - start, len);
}

bool epyq_tok_is_white_space(uint32_t cp) {
    /* White_Space = Zs + Zl + Zp + TAB..CR + NEL: stable since Unicode 6.3, so the category
     * test is exact for every table version. */
    if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x85 || cp == 0x20) return true;
    if (cp < 0xA0) return false;
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

bool epyq_tok_is_word_char(uint32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D) return true;
    /* Alphabetic is approximated by the letter categories plus Nl; the few Other_Alphabetic
     * symbols (circled letters) are missed. Only single_word added tokens use this. */
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}
