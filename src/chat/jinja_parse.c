/* src/chat/jinja_parse.c — tokens -> AST: the statements ({% if %}, for, set, macro, …), the
 * parser's primitives, and the entry point. Expressions are parsed in jinja_parse_expr.c.
 * Every construct outside the supported subset is refused here with its line and column, so
 * a template that parses can only fail at render time for data reasons. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_parse_int.h"

void *epyq_jp_fail(parser *P, const jtok *t, const char *fmt, ...) {
    if (P->failed) return NULL;
    P->failed = true;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    epyq_err_set(P->err, EPYQ_E_TEMPLATE, "%s:%d:%d: %s", P->name, t->line, t->col, msg);
    return NULL;
}

const char *epyq_jp_tok_desc(const jtok *t, char *buf, size_t size) {
    switch (t->kind) {
    case JT_EOF: return "end of template";
    case JT_TEXT: return "template text";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "'%}'";
    case JT_STRING: return "a string";
    case JT_INT:
    case JT_FLOAT: return "a number";
    default: snprintf(buf, size, "'%.40s'", t->p); return buf;
    }
}

bool epyq_jp_expect_op(parser *P, const char *op) {
    if (is_op(cur(P), op)) {
        skip(P);
        return true;
    }
    char b[64];
    epyq_jp_fail(P, cur(P), "expected '%s', found %s", op, epyq_jp_tok_desc(cur(P), b, sizeof b));
    return false;
}

jnode *epyq_jp_new_node(parser *P, jn_kind kind, const jtok *at) {
    jnode *n = epyq_jj_alloc(P->ar, sizeof *n);
    if (!n) return epyq_jp_fail(P, at, "out of memory");
    n->kind = (uint8_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

bool epyq_jp_nv_push(parser *P, nvec *v, jnode *x, const char *name) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        jnode **nv = epyq_jj_alloc_array(P->ar, cap, sizeof *nv);
        const char **nn = nv ? epyq_jj_alloc_array(P->ar, cap, sizeof *nn) : NULL;
        if (!nn) {
            epyq_jp_fail(P, cur(P), "out of memory");
            return false;
        }
        if (v->n) {
            memcpy(nv, v->v, v->n * sizeof *nv);
            memcpy(nn, v->names, v->n * sizeof *nn);
        }
        v->v = nv;
        v->names = nn;
        v->cap = cap;
    }
    v->v[v->n] = x;
    v->names[v->n] = name;
    v->n++;
    return true;
}

/* Hands v's arrays (already in the arena) to n as its kids and keyword names. */
jnode *epyq_jp_nv_to_kids(nvec *v, jnode *n) {
    if (v->n) {
        bool any_name = false;
        for (size_t i = 0; i < v->n; i++) any_name |= v->names[i] != NULL;
        n->kids = v->v;
        n->argnames = any_name ? v->names : NULL;
        n->nkids = v->n;
    }
    memset(v, 0, sizeof *v);
    return n;
}

jnode *epyq_jp_node1(parser *P, jn_kind kind, const jtok *at, jnode *a) {
    jnode *n = epyq_jp_new_node(P, kind, at);
    if (!n) return NULL;
    nvec v = {0};
    return epyq_jp_nv_push(P, &v, a, NULL) ? epyq_jp_nv_to_kids(&v, n) : NULL;
}

bool epyq_jp_enter(parser *P) {
    if (++P->depth > MAX_PARSE_DEPTH) {
        epyq_jp_fail(P, cur(P), "nesting deeper than %d levels", MAX_PARSE_DEPTH);
        return false;
    }
    return true;
}

static bool expect_kind(parser *P, jt_kind k, const char *what) {
    if (cur(P)->kind == k) {
        skip(P);
        return true;
    }
    char b[64];
    epyq_jp_fail(P, cur(P), "expected %s, found %s", what, epyq_jp_tok_desc(cur(P), b, sizeof b));
    return false;
}

static jnode **nv_to_body(nvec *v, size_t *count) {
    jnode **out = v->n ? v->v : NULL;
    *count = v->n;
    memset(v, 0, sizeof *v);
    return out;
}

/* ---- statements ------------------------------------------------------------------------- */

static bool parse_body(parser *P, const char *const *ends, nvec *out, const char **which);

/* Names of assignment targets: `a`, `a, b` or `(a, b)`. */
static bool parse_targets(parser *P, jnode *n) {
    bool paren = is_op(cur(P), "(");
    if (paren) skip(P);
    const char *names[16];
    size_t k = 0;
    for (;;) {
        if (cur(P)->kind != JT_NAME) {
            char b[64];
            epyq_jp_fail(P, cur(P), "expected a variable name, found %s",
                         epyq_jp_tok_desc(cur(P), b, sizeof b));
            return false;
        }
        if (k == 16) {
            epyq_jp_fail(P, cur(P), "too many assignment targets");
            return false;
        }
        names[k++] = cur(P)->p;
        skip(P);
        if (!is_op(cur(P), ",")) break;
        skip(P);
    }
    if (paren && !epyq_jp_expect_op(P, ")")) return false;
    n->argnames = epyq_jj_alloc_array(P->ar, k, sizeof *n->argnames);
    if (!n->argnames) {
        epyq_jp_fail(P, cur(P), "out of memory");
        return false;
    }
    memcpy(n->argnames, names, k * sizeof *names);
    n->nnames = k;
    n->name = names[0];
    return true;
}

static jnode *parse_if(parser *P, const jtok *at) {
    jnode *n = epyq_jp_new_node(P, JN_IF, at);
    if (!n) return NULL;
    jnode *c = epyq_jp_tuple(P, true, false);
    if (!c || !expect_kind(P, JT_BLOCK_END, "'%}'")) return NULL;
    n->kids = epyq_jj_alloc_array(P->ar, 1, sizeof *n->kids);
    if (!n->kids) return epyq_jp_fail(P, at, "out of memory");
    n->kids[0] = c;
    n->nkids = 1;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    nvec body = {0};
    const char *which = NULL;
    P->opener = at;
    if (!parse_body(P, ends, &body, &which)) return NULL;
    n->body = nv_to_body(&body, &n->nbody);
    const jtok *wt = cur(P);
    skip(P); /* the end tag's name */
    if (!strcmp(which, "elif")) {
        jnode *e = parse_if(P, wt);
        if (!e) return NULL;
        n->orelse = epyq_jj_alloc_array(P->ar, 1, sizeof *n->orelse);
        if (!n->orelse) return epyq_jp_fail(P, at, "out of memory");
        n->orelse[0] = e;
        n->norelse = 1;
        return n;
    }
    if (!strcmp(which, "else")) {
        static const char *const ends2[] = {"endif", NULL};
        if (!expect_kind(P, JT_BLOCK_END, "'%}'")) return NULL;
        nvec eb = {0};
        P->opener = at;
        if (!parse_body(P, ends2, &eb, &which)) return NULL;
        n->orelse = nv_to_body(&eb, &n->norelse);
        skip(P);
    }
    return expect_kind(P, JT_BLOCK_END, "'%}'") ? n : NULL;
}

static jnode *parse_for(parser *P, const jtok *at) {
    jnode *n = epyq_jp_new_node(P, JN_FOR, at);
    if (!n || !parse_targets(P, n)) return NULL;
    if (!is_name(cur(P), "in")) return epyq_jp_fail(P, cur(P), "expected 'in' in for loop");
    skip(P);
    jnode *iter = epyq_jp_tuple(P, false, false);
    if (!iter) return NULL;
    jnode *filter = NULL;
    if (is_name(cur(P), "if")) {
        skip(P);
        filter = epyq_jp_expression(P, true);
        if (!filter) return NULL;
        n->op = 1;
    }
    if (is_name(cur(P), "recursive"))
        return epyq_jp_fail(P, cur(P), "recursive for loops are not supported");
    if (!expect_kind(P, JT_BLOCK_END, "'%}'")) return NULL;
    n->kids = epyq_jj_alloc_array(P->ar, 2, sizeof *n->kids);
    if (!n->kids) return epyq_jp_fail(P, at, "out of memory");
    n->kids[0] = iter;
    n->kids[1] = filter;
    n->nkids = 2;
    static const char *const ends[] = {"endfor", "else", NULL};
    nvec body = {0};
    const char *which = NULL;
    P->loops++;
    P->opener = at;
    bool ok = parse_body(P, ends, &body, &which);
    P->loops--;
    if (!ok) return NULL;
    n->body = nv_to_body(&body, &n->nbody);
    skip(P);
    if (!strcmp(which, "else")) {
        static const char *const ends2[] = {"endfor", NULL};
        if (!expect_kind(P, JT_BLOCK_END, "'%}'")) return NULL;
        nvec eb = {0};
        P->opener = at;
        if (!parse_body(P, ends2, &eb, &which)) return NULL;
        n->orelse = nv_to_body(&eb, &n->norelse);
        skip(P);
    }
    return expect_kind(P, JT_BLOCK_END, "'%}'") ? n : NULL;
}

static jnode *parse_set(parser *P, const jtok *at) {
    jnode *n = epyq_jp_new_node(P, JN_SET, at);
    if (!n) return NULL;
    if (cur(P)->kind == JT_NAME && is_op(peek_at(P, 1), ".")) {
        /* namespace attribute: {% set ns.attr = value %} */
        n->name = cur(P)->p;
        skip(P);
        skip(P);
        if (cur(P)->kind != JT_NAME) return epyq_jp_fail(P, cur(P), "expected an attribute name");
        n->attr = cur(P)->p;
        skip(P);
    } else if (!parse_targets(P, n)) {
        return NULL;
    }
    if (is_op(cur(P), "=")) {
        skip(P);
        jnode *v = epyq_jp_tuple(P, true, false);
        if (!v) return NULL;
        n->kids = epyq_jj_alloc_array(P->ar, 1, sizeof *n->kids);
        if (!n->kids) return epyq_jp_fail(P, at, "out of memory");
        n->kids[0] = v;
        n->nkids = 1;
        return expect_kind(P, JT_BLOCK_END, "'%}'") ? n : NULL;
    }
    if (n->attr || n->nnames != 1) return epyq_jp_fail(P, cur(P), "expected '=' in set");
    if (is_op(cur(P), "|")) return epyq_jp_fail(P, cur(P), "filtered block set is not supported");
    if (!expect_kind(P, JT_BLOCK_END, "'%}'")) return NULL;
    n->kind = JN_SETBLOCK;
    static const char *const ends[] = {"endset", NULL};
    nvec body = {0};
    const char *which = NULL;
    P->opener = at;
    if (!parse_body(P, ends, &body, &which)) return NULL;
    n->body = nv_to_body(&body, &n->nbody);
    skip(P);
    return expect_kind(P, JT_BLOCK_END, "'%}'") ? n : NULL;
}

static jnode *parse_macro(parser *P, const jtok *at) {
    jnode *n = epyq_jp_new_node(P, JN_MACRO, at);
    if (!n) return NULL;
    if (cur(P)->kind != JT_NAME) return epyq_jp_fail(P, cur(P), "expected a macro name");
    n->name = cur(P)->p;
    skip(P);
    if (!epyq_jp_expect_op(P, "(")) return NULL;
    nvec v = {0};
    while (!is_op(cur(P), ")")) {
        if (v.n && !epyq_jp_expect_op(P, ",")) goto bad;
        if (cur(P)->kind != JT_NAME) {
            epyq_jp_fail(P, cur(P), "expected a parameter name");
            goto bad;
        }
        const char *pname = cur(P)->p;
        skip(P);
        jnode *def = NULL;
        if (is_op(cur(P), "=")) {
            skip(P);
            def = epyq_jp_expression(P, true);
            if (!def) goto bad;
        }
        if (!epyq_jp_nv_push(P, &v, def, pname)) goto bad;
    }
    skip(P);
    n->argnames = v.n ? v.names : NULL; /* every parameter has a name */
    n->kids = v.n ? v.v : NULL;
    n->nkids = v.n;
    if (!expect_kind(P, JT_BLOCK_END, "'%}'")) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    nvec body = {0};
    const char *which = NULL;
    int loops = P->loops;
    P->loops = 0; /* break/continue cannot cross a macro */
    P->opener = at;
    bool ok = parse_body(P, ends, &body, &which);
    P->loops = loops;
    if (!ok) return NULL;
    n->body = nv_to_body(&body, &n->nbody);
    skip(P);
    return expect_kind(P, JT_BLOCK_END, "'%}'") ? n : NULL;
bad:
    return NULL;
}

static jnode *parse_statement(parser *P) {
    skip(P); /* '{%' */
    const jtok *t = cur(P);
    if (t->kind != JT_NAME) return epyq_jp_fail(P, t, "expected a tag name after '{%%'");
    skip(P);
    const char *w = t->p;
    if (!strcmp(w, "if")) return parse_if(P, t);
    if (!strcmp(w, "for")) return parse_for(P, t);
    if (!strcmp(w, "set")) return parse_set(P, t);
    if (!strcmp(w, "macro")) return parse_macro(P, t);
    if (!strcmp(w, "break") || !strcmp(w, "continue")) {
        if (!P->loops) return epyq_jp_fail(P, t, "'%s' outside a for loop", w);
        jnode *n = epyq_jp_new_node(P, w[0] == 'b' ? JN_BREAK : JN_CONTINUE, t);
        return n && expect_kind(P, JT_BLOCK_END, "'%}'") ? n : NULL;
    }
    if (!strcmp(w, "generation")) {
        /* transformers' assistant-mask marker: renders its body unchanged. */
        jnode *n = epyq_jp_new_node(P, JN_BLOCK, t);
        if (!n || !expect_kind(P, JT_BLOCK_END, "'%}'")) return NULL;
        static const char *const ends[] = {"endgeneration", NULL};
        nvec body = {0};
        const char *which = NULL;
        P->opener = t;
        if (!parse_body(P, ends, &body, &which)) return NULL;
        n->body = nv_to_body(&body, &n->nbody);
        skip(P);
        return expect_kind(P, JT_BLOCK_END, "'%}'") ? n : NULL;
    }
    if (!strncmp(w, "end", 3) || !strcmp(w, "elif") || !strcmp(w, "else"))
        return epyq_jp_fail(P, t, "unexpected '%s' (no open block it could close)", w);
    return epyq_jp_fail(P, t, "unsupported tag '%s'", w);
}

/* Statements until EOF (ends == NULL) or a `{% name` with name in ends; leaves the parser on
 * that name token and stores it in *which. */
static bool parse_body(parser *P, const char *const *ends, nvec *out, const char **which) {
    if (!epyq_jp_enter(P)) return false;
    const jtok *start = P->opener ? P->opener : cur(P);
    P->opener = NULL;
    for (;;) {
        const jtok *t = cur(P);
        jnode *n = NULL;
        if (t->kind == JT_EOF) {
            if (!ends) break;
            epyq_jp_fail(P, start, "block is never closed (missing '{%% %s %%}')", ends[0]);
            goto bad;
        }
        if (t->kind == JT_TEXT) {
            n = epyq_jp_new_node(P, JN_TEXT, t);
            if (n) n->lit = jv_str(t->p, t->n);
            skip(P);
        } else if (t->kind == JT_VAR_BEGIN) {
            skip(P);
            jnode *x = epyq_jp_tuple(P, true, false);
            if (x && expect_kind(P, JT_VAR_END, "'}}'")) n = epyq_jp_node1(P, JN_OUTPUT, t, x);
        } else if (t->kind == JT_BLOCK_BEGIN) {
            const jtok *nt = peek_at(P, 1);
            if (ends && nt->kind == JT_NAME)
                for (size_t k = 0; ends[k]; k++)
                    if (!strcmp(nt->p, ends[k])) {
                        skip(P);
                        *which = ends[k];
                        P->depth--;
                        return true;
                    }
            n = parse_statement(P);
        } else {
            char b[64];
            epyq_jp_fail(P, t, "unexpected %s", epyq_jp_tok_desc(t, b, sizeof b));
        }
        if (!n || !epyq_jp_nv_push(P, out, n, NULL)) goto bad;
    }
    P->depth--;
    return true;
bad:
    return false;
}

epyq_status epyq_jinja_parse(const char *src, size_t len, const char *name, epyq_jinja **out,
                             epyq_err *err) {
    *out = NULL;
    epyq_jinja *t = calloc(1, sizeof *t);
    if (!t) return epyq_err_set(err, EPYQ_E_NOMEM, "template: out of memory");
    snprintf(t->name, sizeof t->name, "%s", name ? name : "template");
    t->ar.max = (size_t)1 << 28;
    /* jinja2 normalises newlines (\r\n, \r -> \n) and drops one trailing newline. */
    char *norm = malloc(len + 1);
    if (!norm) {
        epyq_jinja_free(t);
        return epyq_err_set(err, EPYQ_E_NOMEM, "template: out of memory");
    }
    size_t m = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[m++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[m++] = src[i];
        }
    }
    if (m && norm[m - 1] == '\n') m--;
    norm[m] = '\0';
    jtok *toks = NULL;
    size_t ntoks = 0;
    epyq_status st = epyq_jj_lex(&t->ar, norm, m, t->name, &toks, &ntoks, err);
    free(norm);
    if (st) {
        epyq_jinja_free(t);
        return st;
    }
    parser P = {.ar = &t->ar, .t = toks, .n = ntoks, .name = t->name, .err = err};
    nvec body = {0};
    const char *which = NULL;
    if (!parse_body(&P, NULL, &body, &which)) {
        epyq_jinja_free(t);
        return EPYQ_E_TEMPLATE;
    }
    t->body = nv_to_body(&body, &t->nbody);
    if (P.failed) {
        epyq_jinja_free(t);
        return EPYQ_E_TEMPLATE;
    }
    *out = t;
    return EPYQ_OK;
}

void epyq_jinja_free(epyq_jinja *t) {
    if (!t) return;
    epyq_jj_arena_free(&t->ar);
    free(t);
}
