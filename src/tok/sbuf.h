/* src/tok/sbuf.h — a growable byte string with a hard size cap.
 *
 * Promise: appends either succeed completely or leave the buffer unchanged and return false
 * (allocation failure or the cap reached), so callers can turn hostile output growth into an
 * error instead of an out-of-memory crash. The data is always NUL-terminated when non-NULL. */
#ifndef EPYQ_SBUF_H
#define EPYQ_SBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *p;    /* [cap] bytes, p[len] == '\0' */
    size_t len; /* bytes used, excluding the terminator */
    size_t cap; /* bytes allocated */
    size_t max; /* largest len allowed; 0 = no limit */
} epyq_sbuf;

bool epyq_sbuf_add(epyq_sbuf *b, const void *s, size_t n);
bool epyq_sbuf_addc(epyq_sbuf *b, char c);
bool epyq_sbuf_adds(epyq_sbuf *b, const char *s);
bool epyq_sbuf_printf(epyq_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the bytes to the caller (never NULL unless allocation fails) and resets b. */
char *epyq_sbuf_take(epyq_sbuf *b, size_t *len);
void epyq_sbuf_free(epyq_sbuf *b);

#endif
