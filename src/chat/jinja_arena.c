/* src/chat/jinja_arena.c — bump allocator with a byte cap for templates and renders.
 * Freed all at once: a render makes many small short-lived values and a template's AST
 * lives as long as the template, so per-object frees would only add bookkeeping. */
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_int.h"

struct jj_chunk {
    jj_chunk *next;
    size_t size, used; /* bytes of data[] */
    _Alignas(16) unsigned char data[];
};

enum { CHUNK_MIN = 64 * 1024 };

void *epyq_jj_alloc(jj_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->max && (n > a->max || a->used > a->max - n)) return NULL;
    jj_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > CHUNK_MIN ? n : CHUNK_MIN;
        c = malloc(sizeof *c + size);
        if (!c) return NULL;
        c->next = a->head;
        c->size = size;
        c->used = 0;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void *epyq_jj_alloc_array(jj_arena *a, size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) return NULL;
    return epyq_jj_alloc(a, total);
}

char *epyq_jj_strdup(jj_arena *a, const char *s, size_t n) {
    if (n == (size_t)-1) return NULL;
    char *p = epyq_jj_alloc(a, n + 1);
    if (p && n) memcpy(p, s, n);
    return p;
}

void epyq_jj_arena_free(jj_arena *a) {
    for (jj_chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->used = 0;
}
