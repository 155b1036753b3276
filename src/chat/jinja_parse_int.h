/* src/chat/jinja_parse_int.h — the parser's state and primitives, shared by its two halves:
 * jinja_parse_expr.c (expressions) and jinja_parse.c (statements, and the entry point). */
#ifndef EPYQ_JINJA_PARSE_INT_H
#define EPYQ_JINJA_PARSE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "chat/jinja_int.h"

enum { MAX_PARSE_DEPTH = 64 }; /* expression + statement nesting; bounds render recursion too */

typedef struct {
    jj_arena *ar;
    const jtok *t;
    size_t n, i;
    const char *name;
    epyq_err *err;
    int depth;
    int loops;          /* enclosing for loops (break/continue are only valid inside one) */
    const jtok *opener; /* tag that opens the body parse_body reads next (for messages) */
    bool failed;
} parser;

/* A growing array of node pointers, kept in the parser's arena: growing copies it to a new
 * block and abandons the old one (at most as many bytes again as the final array, freed with
 * the template). Nothing to free means no error path can leak it, which the malloc'd version
 * did on several (found by fuzz_template). */
typedef struct {
    jnode **v;
    const char **names;
    size_t n, cap;
} nvec;

static inline const jtok *cur(parser *P) { return &P->t[P->i]; }
static inline const jtok *peek_at(parser *P, size_t k) {
    return &P->t[P->i + k < P->n ? P->i + k : P->n - 1];
}
static inline void skip(parser *P) {
    if (P->i + 1 < P->n) P->i++;
}
static inline bool is_op(const jtok *t, const char *op) {
    return t->kind == JT_OP && !strcmp(t->p, op);
}
static inline bool is_name(const jtok *t, const char *nm) {
    return t->kind == JT_NAME && !strcmp(t->p, nm);
}

/* Records the first error (with t's line and column) and returns NULL; later calls keep it. */
void *epyq_jp_fail(parser *P, const jtok *t, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *epyq_jp_tok_desc(const jtok *t, char *buf, size_t size); /* "'{%'", "a string" … */
bool epyq_jp_expect_op(parser *P, const char *op);
jnode *epyq_jp_new_node(parser *P, jn_kind kind, const jtok *at);
bool epyq_jp_nv_push(parser *P, nvec *v, jnode *x, const char *name);
/* Hands v's arrays (already in the arena) to n as its kids and keyword names. */
jnode *epyq_jp_nv_to_kids(nvec *v, jnode *n);
jnode *epyq_jp_node1(parser *P, jn_kind kind, const jtok *at, jnode *a);
/* One more level of nesting; false (error set) past MAX_PARSE_DEPTH. The caller decrements. */
bool epyq_jp_enter(parser *P);

/* Expressions (jinja_parse_expr.c): one expression, with or without `x if c else y`; a tuple of
 * them (`a, b`), a lone expression when there is no comma. */
jnode *epyq_jp_expression(parser *P, bool with_condexpr);
jnode *epyq_jp_tuple(parser *P, bool with_condexpr, bool explicit_parens);

#endif
