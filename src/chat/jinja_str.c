/* src/chat/jinja_str.c — UTF-8 helpers with Python's view of strings (code point indexing,
 * str.isspace, strip). Bytes that are not valid UTF-8 count as one character each, so a
 * hostile string can never make an index run past its end. */
#include <string.h>

#include "chat/jinja_int.h"

uint32_t epyq_jj_utf8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    size_t p = *i;
    unsigned char c = u[p];
    int k = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    if (k <= 0 || p + (size_t)k >= n) { /* ASCII, or a stray/truncated byte: one character */
        *i = p + 1;
        return c;
    }
    uint32_t v = c & (0x3F >> k);
    for (int j = 1; j <= k; j++) {
        if ((u[p + (size_t)j] & 0xC0) != 0x80) {
            *i = p + 1;
            return c;
        }
        v = (v << 6) | (u[p + (size_t)j] & 0x3F);
    }
    *i = p + (size_t)k + 1;
    return v;
}

size_t epyq_jj_utf8_len(const char *s, size_t n) {
    size_t i = 0, count = 0;
    while (i < n) {
        epyq_jj_utf8_next(s, n, &i);
        count++;
    }
    return count;
}

size_t epyq_jj_utf8_offset(const char *s, size_t n, size_t cp) {
    size_t i = 0;
    while (cp-- > 0 && i < n) epyq_jj_utf8_next(s, n, &i);
    return i;
}

bool epyq_jj_py_isspace(uint32_t c) {
    /* CPython's _PyUnicode_IsWhitespace: bidirectional class WS/B/S or category Zs. */
    switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D:
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x20:
    case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
        return true;
    default:
        return c >= 0x2000 && c <= 0x200A;
    }
}

/* Is code point c in the (UTF-8) set chars? */
static bool in_set(uint32_t c, const char *chars, size_t nchars) {
    if (!chars) return epyq_jj_py_isspace(c);
    size_t i = 0;
    while (i < nchars)
        if (epyq_jj_utf8_next(chars, nchars, &i) == c) return true;
    return false;
}

jv epyq_jj_str_strip(jv s, const char *chars, size_t nchars, int which) {
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n;
    if (which & 1)
        while (a < b) {
            size_t j = a;
            uint32_t c = epyq_jj_utf8_next(p, b, &j);
            if (!in_set(c, chars, nchars)) break;
            a = j;
        }
    if (which & 2) {
        /* Walk forward (backwards decoding of broken UTF-8 could split characters
         * differently) and keep the end of the last character outside the set. */
        size_t i = a, keep = a;
        while (i < b) {
            uint32_t c = epyq_jj_utf8_next(p, b, &i);
            if (!in_set(c, chars, nchars)) keep = i;
        }
        b = keep;
    }
    return jv_str(p + a, b - a);
}
