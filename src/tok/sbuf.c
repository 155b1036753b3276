/* src/tok/sbuf.c — see sbuf.h. */
#include "tok/sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool sbuf_reserve(epyq_sbuf *b, size_t extra) {
    size_t need;
    if (__builtin_add_overflow(b->len, extra, &need)) return false;
    if (b->max && need > b->max) return false;
    if (need + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need + 1) {
        if (cap > (size_t)-1 / 2) return false;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool epyq_sbuf_add(epyq_sbuf *b, const void *s, size_t n) {
    if (!sbuf_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

bool epyq_sbuf_addc(epyq_sbuf *b, char c) { return epyq_sbuf_add(b, &c, 1); }

bool epyq_sbuf_adds(epyq_sbuf *b, const char *s) { return epyq_sbuf_add(b, s, strlen(s)); }

bool epyq_sbuf_printf(epyq_sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return false;
    if ((size_t)n < sizeof tmp) return epyq_sbuf_add(b, tmp, (size_t)n);
    /* Rare long output: format straight into the reserved space. */
    if (!sbuf_reserve(b, (size_t)n)) return false;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

char *epyq_sbuf_take(epyq_sbuf *b, size_t *len) {
    char *p = b->p ? b->p : calloc(1, 1);
    if (len) *len = b->p ? b->len : 0;
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

void epyq_sbuf_free(epyq_sbuf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}
