/* src/chat/jinja_parse.c — tokens -> AST, with jinja2's grammar and operator precedence.
 *
 * Precedence, loosest first (as jinja2's parser): `x if c else y`, or, and, not, comparisons
 * (== != < <= > >= in, not in; chained), + -, ~, * / // %, ** (left-associative, as in
 * jinja2), unary - +, then primaries with .attr, [subscript/slice], (call), |filter, is test.
 * Every construct outside the supported subset is refused here with its line and column, so
 * a template that parses can only fail at render time for data reasons. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
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
    int loops;  /* enclosing for loops (break/continue are only valid inside one) */
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

static const jtok *cur(parser *P) { return &P->t[P->i]; }
static const jtok *peek_at(parser *P, size_t k) { return &P->t[P->i + k < P->n ? P->i + k : P->n - 1]; }
static void skip(parser *P) {
    if (P->i + 1 < P->n) P->i++;
}

static void *fail_at(parser *P, const jtok *t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void *fail_at(parser *P, const jtok *t, const char *fmt, ...) {
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

static const char *tok_desc(const jtok *t, char *buf, size_t size) {
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

static bool is_op(const jtok *t, const char *op) { return t->kind == JT_OP && !strcmp(t->p, op); }
static bool is_name(const jtok *t, const char *nm) { return t->kind == JT_NAME && !strcmp(t->p, nm); }

static bool expect_op(parser *P, const char *op) {
    if (is_op(cur(P), op)) {
        skip(P);
        return true;
    }
    char b[64];
    fail_at(P, cur(P), "expected '%s', found %s", op, tok_desc(cur(P), b, sizeof b));
    return false;
}

static bool expect_kind(parser *P, jt_kind k, const char *what) {
    if (cur(P)->kind == k) {
        skip(P);
        return true;
    }
    char b[64];
    fail_at(P, cur(P), "expected %s, found %s", what, tok_desc(cur(P), b, sizeof b));
    return false;
}

static jnode *new_node(parser *P, jn_kind kind, const jtok *at) {
    jnode *n = epyq_jj_alloc(P->ar, sizeof *n);
    if (!n) return fail_at(P, at, "out of memory");
    n->kind = (uint8_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static bool nv_push(parser *P, nvec *v, jnode *x, const char *name) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        jnode **nv = epyq_jj_alloc_array(P->ar, cap, sizeof *nv);
        const char **nn = nv ? epyq_jj_alloc_array(P->ar, cap, sizeof *nn) : NULL;
        if (!nn) {
            fail_at(P, cur(P), "out of memory");
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
static jnode *nv_to_kids(nvec *v, jnode *n) {
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

static jnode **nv_to_body(nvec *v, size_t *count) {
    jnode **out = v->n ? v->v : NULL;
    *count = v->n;
    memset(v, 0, sizeof *v);
    return out;
}

static jnode *node1(parser *P, jn_kind kind, const jtok *at, jnode *a) {
    jnode *n = new_node(P, kind, at);
    if (!n) return NULL;
    nvec v = {0};
    return nv_push(P, &v, a, NULL) ? nv_to_kids(&v, n) : NULL;
}

static jnode *node2(parser *P, jn_kind kind, const jtok *at, jnode *a, jnode *b) {
    jnode *n = new_node(P, kind, at);
    if (!n) return NULL;
    nvec v = {0};
    return nv_push(P, &v, a, NULL) && nv_push(P, &v, b, NULL) ? nv_to_kids(&v, n) : NULL;
}

static jnode *parse_expression(parser *P, bool with_condexpr);
static jnode *parse_tuple(parser *P, bool with_condexpr, bool explicit_parens);
static jnode *parse_unary(parser *P, bool with_filter);
static jnode *parse_primary(parser *P);
static jnode *parse_postfix(parser *P, jnode *node);

static bool enter(parser *P) {
    if (++P->depth > MAX_PARSE_DEPTH) {
        fail_at(P, cur(P), "nesting deeper than %d levels", MAX_PARSE_DEPTH);
        return false;
    }
    return true;
}

/* `(` args `)` after a callee/filter/test: positional and name=value arguments. */
static bool parse_call_args(parser *P, nvec *v) {
    if (!expect_op(P, "(")) return false;
    bool first = true;
    while (!is_op(cur(P), ")")) {
        if (!first && !expect_op(P, ",")) return false;
        if (is_op(cur(P), ")")) break; /* trailing comma */
        first = false;
        if (is_op(cur(P), "*") || is_op(cur(P), "**")) {
            fail_at(P, cur(P), "*args / **kwargs in calls are not supported");
            return false;
        }
        const char *kw = NULL;
        if (cur(P)->kind == JT_NAME && is_op(peek_at(P, 1), "=")) {
            kw = cur(P)->p;
            skip(P);
            skip(P);
        }
        jnode *a = parse_expression(P, true);
        if (!a || !nv_push(P, v, a, kw)) return false;
    }
    return expect_op(P, ")");
}

static jnode *parse_filter(parser *P, jnode *subject) {
    const jtok *at = cur(P); /* the '|' */
    skip(P);
    if (cur(P)->kind != JT_NAME) return fail_at(P, cur(P), "expected a filter name after '|'");
    const jtok *nt = cur(P);
    int fid = epyq_jj_filter_id(nt->p);
    if (fid < 0) return fail_at(P, nt, "unsupported filter '%s'", nt->p);
    skip(P);
    jnode *n = new_node(P, JN_FILTER, at);
    if (!n) return NULL;
    n->name = nt->p;
    n->fid = fid;
    nvec v = {0};
    if (!nv_push(P, &v, subject, NULL)) return NULL;
    if (is_op(cur(P), "(") && !parse_call_args(P, &v)) {
        return NULL;
    }
    return nv_to_kids(&v, n);
}

static jnode *parse_test(parser *P, jnode *subject) {
    const jtok *at = cur(P); /* 'is' */
    skip(P);
    bool negated = false;
    if (is_name(cur(P), "not")) {
        negated = true;
        skip(P);
    }
    if (cur(P)->kind != JT_NAME) return fail_at(P, cur(P), "expected a test name after 'is'");
    const jtok *nt = cur(P);
    int tid = epyq_jj_test_id(nt->p);
    if (tid < 0) return fail_at(P, nt, "unsupported test '%s'", nt->p);
    skip(P);
    jnode *n = new_node(P, JN_TEST, at);
    if (!n) return NULL;
    n->name = nt->p;
    n->fid = tid;
    n->op = negated;
    nvec v = {0};
    if (!nv_push(P, &v, subject, NULL)) return NULL;
    const jtok *c = cur(P);
    if (is_op(c, "(")) {
        if (!parse_call_args(P, &v)) {
            return NULL;
        }
    } else if ((c->kind == JT_NAME || c->kind == JT_STRING || c->kind == JT_INT || c->kind == JT_FLOAT ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        /* jinja2 lets a test take one argument without parentheses: `x is divisibleby 3`. */
        if (is_name(c, "is")) return fail_at(P, c, "tests cannot be chained with 'is'");
        jnode *a = parse_primary(P);
        if (a) a = parse_postfix(P, a);
        if (!a || !nv_push(P, &v, a, NULL)) return NULL;
    }
    return nv_to_kids(&v, n);
}

static jnode *parse_subscript(parser *P, jnode *obj, const jtok *at) {
    /* obj[expr] or obj[start:stop:step] with any part optional. */
    jnode *parts[3] = {NULL, NULL, NULL};
    bool is_slice = false;
    if (!is_op(cur(P), ":")) {
        parts[0] = parse_expression(P, true);
        if (!parts[0]) return NULL;
    }
    if (is_op(cur(P), ":")) {
        is_slice = true;
        skip(P);
        if (!is_op(cur(P), "]") && !is_op(cur(P), ":")) {
            parts[1] = parse_expression(P, true);
            if (!parts[1]) return NULL;
        }
        if (is_op(cur(P), ":")) {
            skip(P);
            if (!is_op(cur(P), "]")) {
                parts[2] = parse_expression(P, true);
                if (!parts[2]) return NULL;
            }
        }
    }
    if (is_op(cur(P), ",")) return fail_at(P, cur(P), "tuple subscripts are not supported");
    if (!expect_op(P, "]")) return NULL;
    if (!is_slice) return node2(P, JN_ITEM, at, obj, parts[0]);
    jnode *n = new_node(P, JN_SLICE, at);
    if (!n) return NULL;
    n->kids = epyq_jj_alloc_array(P->ar, 4, sizeof *n->kids);
    if (!n->kids) return fail_at(P, at, "out of memory");
    n->kids[0] = obj;
    for (int k = 0; k < 3; k++) n->kids[k + 1] = parts[k]; /* NULL = omitted */
    n->nkids = 4;
    return n;
}

static jnode *parse_postfix(parser *P, jnode *node) {
    while (node) {
        const jtok *t = cur(P);
        if (is_op(t, ".")) {
            skip(P);
            const jtok *a = cur(P);
            if (a->kind == JT_NAME) {
                node = node1(P, JN_ATTR, t, node);
                if (node) node->name = a->p;
                skip(P);
            } else if (a->kind == JT_INT) {
                /* `foo.0` is jinja2's spelling of foo[0]. */
                jnode *k = new_node(P, JN_LIT, a);
                if (!k) return NULL;
                k->lit = jv_int(a->i);
                skip(P);
                node = node2(P, JN_ITEM, t, node, k);
            } else {
                char b[64];
                return fail_at(P, a, "expected an attribute name after '.', found %s", tok_desc(a, b, sizeof b));
            }
        } else if (is_op(t, "[")) {
            skip(P);
            if (!enter(P)) return NULL;
            node = parse_subscript(P, node, t);
            P->depth--;
        } else if (is_op(t, "(")) {
            jnode *n = new_node(P, JN_CALL, t);
            if (!n) return NULL;
            nvec v = {0};
            if (!nv_push(P, &v, node, NULL)) return NULL;
            if (!parse_call_args(P, &v)) {
                return NULL;
            }
            node = nv_to_kids(&v, n);
        } else {
            break;
        }
    }
    return node;
}

static jnode *parse_filter_expr(parser *P, jnode *node) {
    while (node) {
        const jtok *t = cur(P);
        if (is_op(t, "|"))
            node = parse_filter(P, node);
        else if (is_name(t, "is"))
            node = parse_test(P, node);
        else if (is_op(t, "("))
            node = parse_postfix(P, node);
        else
            break;
    }
    return node;
}

static jnode *parse_list_or_dict(parser *P, bool dict) {
    const jtok *at = cur(P);
    skip(P);
    jnode *n = new_node(P, dict ? JN_DICT : JN_LIST, at);
    if (!n) return NULL;
    const char *close = dict ? "}" : "]";
    nvec v = {0};
    bool first = true;
    while (!is_op(cur(P), close)) {
        if (!first && !expect_op(P, ",")) goto bad;
        if (is_op(cur(P), close)) break;
        first = false;
        jnode *x = parse_expression(P, true);
        if (!x || !nv_push(P, &v, x, NULL)) goto bad;
        if (dict) {
            if (!expect_op(P, ":")) goto bad;
            jnode *y = parse_expression(P, true);
            if (!y || !nv_push(P, &v, y, NULL)) goto bad;
        }
    }
    skip(P);
    return nv_to_kids(&v, n);
bad:
    return NULL;
}

static jnode *parse_primary(parser *P) {
    if (!enter(P)) return NULL;
    const jtok *t = cur(P);
    jnode *n = NULL;
    if (t->kind == JT_NAME) {
        n = new_node(P, JN_LIT, t);
        if (!n) goto out;
        if (!strcmp(t->p, "true") || !strcmp(t->p, "True"))
            n->lit = jv_bool(true);
        else if (!strcmp(t->p, "false") || !strcmp(t->p, "False"))
            n->lit = jv_bool(false);
        else if (!strcmp(t->p, "none") || !strcmp(t->p, "None"))
            n->lit = jv_none();
        else {
            n->kind = JN_NAME;
            n->name = t->p;
        }
        skip(P);
    } else if (t->kind == JT_STRING) {
        /* Adjacent literals concatenate, as in Python. */
        epyq_sbuf b = {0};
        bool ok = true;
        while (cur(P)->kind == JT_STRING) {
            ok = ok && epyq_sbuf_add(&b, cur(P)->p, cur(P)->n);
            skip(P);
        }
        n = new_node(P, JN_LIT, t);
        char *s = ok && n ? epyq_jj_strdup(P->ar, b.p ? b.p : "", b.len) : NULL;
        if (n && s) n->lit = jv_str(s, b.len);
        else n = fail_at(P, t, "out of memory");
        epyq_sbuf_free(&b);
    } else if (t->kind == JT_INT || t->kind == JT_FLOAT) {
        n = new_node(P, JN_LIT, t);
        if (n) n->lit = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->f);
        skip(P);
    } else if (is_op(t, "(")) {
        skip(P);
        n = parse_tuple(P, true, true);
        if (n && !expect_op(P, ")")) n = NULL;
    } else if (is_op(t, "[")) {
        n = parse_list_or_dict(P, false);
    } else if (is_op(t, "{")) {
        n = parse_list_or_dict(P, true);
    } else {
        char b[64];
        n = fail_at(P, t, "expected an expression, found %s", tok_desc(t, b, sizeof b));
    }
out:
    P->depth--;
    return n;
}

static jnode *parse_unary(parser *P, bool with_filter) {
    if (!enter(P)) return NULL;
    const jtok *t = cur(P);
    jnode *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        skip(P);
        jnode *x = parse_unary(P, false);
        n = x ? node1(P, is_op(t, "-") ? JN_NEG : JN_POS, t, x) : NULL;
    } else {
        n = parse_primary(P);
    }
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static jnode *binop(parser *P, const jtok *at, jop op, jnode *a, jnode *b) {
    jnode *n = a && b ? node2(P, JN_BIN, at, a, b) : NULL;
    if (n) n->op = (uint8_t)op;
    return n;
}

static jnode *parse_pow(parser *P) {
    jnode *l = parse_unary(P, true);
    while (l && is_op(cur(P), "**")) {
        const jtok *t = cur(P);
        skip(P);
        l = binop(P, t, JOP_POW, l, parse_unary(P, true));
    }
    return l;
}

static jnode *parse_math2(parser *P) {
    jnode *l = parse_pow(P);
    for (;;) {
        const jtok *t = cur(P);
        jop op;
        if (is_op(t, "*")) op = JOP_MUL;
        else if (is_op(t, "/")) op = JOP_DIV;
        else if (is_op(t, "//")) op = JOP_FLOORDIV;
        else if (is_op(t, "%")) op = JOP_MOD;
        else break;
        if (!l) break;
        skip(P);
        l = binop(P, t, op, l, parse_pow(P));
    }
    return l;
}

static jnode *parse_concat(parser *P) {
    jnode *l = parse_math2(P);
    while (l && is_op(cur(P), "~")) {
        const jtok *t = cur(P);
        skip(P);
        l = binop(P, t, JOP_CONCAT, l, parse_math2(P));
    }
    return l;
}

static jnode *parse_math1(parser *P) {
    jnode *l = parse_concat(P);
    while (l && (is_op(cur(P), "+") || is_op(cur(P), "-"))) {
        const jtok *t = cur(P);
        skip(P);
        l = binop(P, t, is_op(t, "+") ? JOP_ADD : JOP_SUB, l, parse_concat(P));
    }
    return l;
}

static jnode *parse_compare(parser *P) {
    const jtok *at = cur(P);
    jnode *first = parse_math1(P);
    if (!first) return NULL;
    nvec v = {0};
    uint8_t ops[64];
    size_t nops = 0;
    for (;;) {
        const jtok *t = cur(P);
        jop op;
        if (is_op(t, "==")) op = JOP_EQ;
        else if (is_op(t, "!=")) op = JOP_NE;
        else if (is_op(t, "<")) op = JOP_LT;
        else if (is_op(t, "<=")) op = JOP_LE;
        else if (is_op(t, ">")) op = JOP_GT;
        else if (is_op(t, ">=")) op = JOP_GE;
        else if (is_name(t, "in")) op = JOP_IN;
        else if (is_name(t, "not") && is_name(peek_at(P, 1), "in")) {
            op = JOP_NOTIN;
            skip(P);
        } else break;
        skip(P);
        if (nops == sizeof ops) return fail_at(P, t, "too many chained comparisons");
        if (!v.n && !nv_push(P, &v, first, NULL)) return NULL;
        jnode *r = parse_math1(P);
        if (!r || !nv_push(P, &v, r, NULL)) {
            return NULL;
        }
        ops[nops++] = (uint8_t)op;
    }
    if (!nops) return first;
    jnode *n = new_node(P, JN_CMP, at);
    if (!n) return NULL;
    n->ops = epyq_jj_alloc(P->ar, nops);
    if (!n->ops) return fail_at(P, at, "out of memory");
    memcpy(n->ops, ops, nops);
    return nv_to_kids(&v, n);
}

static jnode *parse_not(parser *P) {
    if (is_name(cur(P), "not")) {
        const jtok *t = cur(P);
        skip(P);
        if (!enter(P)) return NULL;
        jnode *x = parse_not(P);
        P->depth--;
        return x ? node1(P, JN_NOT, t, x) : NULL;
    }
    return parse_compare(P);
}

static jnode *parse_and(parser *P) {
    jnode *l = parse_not(P);
    while (l && is_name(cur(P), "and")) {
        const jtok *t = cur(P);
        skip(P);
        jnode *r = parse_not(P);
        l = r ? node2(P, JN_AND, t, l, r) : NULL;
    }
    return l;
}

static jnode *parse_or(parser *P) {
    jnode *l = parse_and(P);
    while (l && is_name(cur(P), "or")) {
        const jtok *t = cur(P);
        skip(P);
        jnode *r = parse_and(P);
        l = r ? node2(P, JN_OR, t, l, r) : NULL;
    }
    return l;
}

static jnode *parse_condexpr(parser *P) {
    jnode *x = parse_or(P);
    while (x && is_name(cur(P), "if")) {
        const jtok *t = cur(P);
        skip(P);
        jnode *c = parse_or(P);
        if (!c) return NULL;
        jnode *y = NULL;
        if (is_name(cur(P), "else")) {
            skip(P);
            if (!enter(P)) return NULL;
            y = parse_condexpr(P);
            P->depth--;
            if (!y) return NULL;
        }
        jnode *n = new_node(P, JN_COND, t);
        if (!n) return NULL;
        n->kids = epyq_jj_alloc_array(P->ar, 3, sizeof *n->kids);
        if (!n->kids) return fail_at(P, t, "out of memory");
        n->kids[0] = x; /* value when true */
        n->kids[1] = c; /* condition */
        n->kids[2] = y; /* value when false; NULL = undefined */
        n->nkids = 3;
        x = n;
    }
    return x;
}

static jnode *parse_expression(parser *P, bool with_condexpr) {
    if (!enter(P)) return NULL;
    jnode *n = with_condexpr ? parse_condexpr(P) : parse_or(P);
    P->depth--;
    return n;
}

static bool tuple_end(parser *P) {
    const jtok *t = cur(P);
    return t->kind == JT_BLOCK_END || t->kind == JT_VAR_END || t->kind == JT_EOF || is_op(t, ")");
}

static jnode *parse_tuple(parser *P, bool with_condexpr, bool explicit_parens) {
    const jtok *at = cur(P);
    nvec v = {0};
    bool is_tuple = false;
    for (;;) {
        if (v.n && !expect_op(P, ",")) goto bad;
        if (tuple_end(P)) break;
        jnode *x = parse_expression(P, with_condexpr);
        if (!x || !nv_push(P, &v, x, NULL)) goto bad;
        if (is_op(cur(P), ","))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (v.n) {
            jnode *x = v.v[0];
            return x;
        }
        if (!explicit_parens) {
            char b[64];
            return fail_at(P, cur(P), "expected an expression, found %s", tok_desc(cur(P), b, sizeof b));
        }
    }
    jnode *n = new_node(P, JN_TUPLE, at);
    if (!n) goto bad;
    return nv_to_kids(&v, n);
bad:
    return NULL;
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
            fail_at(P, cur(P), "expected a variable name, found %s", tok_desc(cur(P), b, sizeof b));
            return false;
        }
        if (k == 16) {
            fail_at(P, cur(P), "too many assignment targets");
            return false;
        }
        names[k++] = cur(P)->p;
        skip(P);
        if (!is_op(cur(P), ",")) break;
        skip(P);
    }
    if (paren && !expect_op(P, ")")) return false;
    n->argnames = epyq_jj_alloc_array(P->ar, k, sizeof *n->argnames);
    if (!n->argnames) {
        fail_at(P, cur(P), "out of memory");
        return false;
    }
    memcpy(n->argnames, names, k * sizeof *names);
    n->nnames = k;
    n->name = names[0];
    return true;
}

static jnode *parse_if(parser *P, const jtok *at) {
    jnode *n = new_node(P, JN_IF, at);
    if (!n) return NULL;
    jnode *c = parse_tuple(P, true, false);
    if (!c || !expect_kind(P, JT_BLOCK_END, "'%}'")) return NULL;
    n->kids = epyq_jj_alloc_array(P->ar, 1, sizeof *n->kids);
    if (!n->kids) return fail_at(P, at, "out of memory");
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
        if (!n->orelse) return fail_at(P, at, "out of memory");
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
    jnode *n = new_node(P, JN_FOR, at);
    if (!n || !parse_targets(P, n)) return NULL;
    if (!is_name(cur(P), "in")) return fail_at(P, cur(P), "expected 'in' in for loop");
    skip(P);
    jnode *iter = parse_tuple(P, false, false);
    if (!iter) return NULL;
    jnode *filter = NULL;
    if (is_name(cur(P), "if")) {
        skip(P);
        filter = parse_expression(P, true);
        if (!filter) return NULL;
        n->op = 1;
    }
    if (is_name(cur(P), "recursive")) return fail_at(P, cur(P), "recursive for loops are not supported");
    if (!expect_kind(P, JT_BLOCK_END, "'%}'")) return NULL;
    n->kids = epyq_jj_alloc_array(P->ar, 2, sizeof *n->kids);
    if (!n->kids) return fail_at(P, at, "out of memory");
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
    jnode *n = new_node(P, JN_SET, at);
    if (!n) return NULL;
    if (cur(P)->kind == JT_NAME && is_op(peek_at(P, 1), ".")) {
        /* namespace attribute: {% set ns.attr = value %} */
        n->name = cur(P)->p;
        skip(P);
        skip(P);
        if (cur(P)->kind != JT_NAME) return fail_at(P, cur(P), "expected an attribute name");
        n->attr = cur(P)->p;
        skip(P);
    } else if (!parse_targets(P, n)) {
        return NULL;
    }
    if (is_op(cur(P), "=")) {
        skip(P);
        jnode *v = parse_tuple(P, true, false);
        if (!v) return NULL;
        n->kids = epyq_jj_alloc_array(P->ar, 1, sizeof *n->kids);
        if (!n->kids) return fail_at(P, at, "out of memory");
        n->kids[0] = v;
        n->nkids = 1;
        return expect_kind(P, JT_BLOCK_END, "'%}'") ? n : NULL;
    }
    if (n->attr || n->nnames != 1) return fail_at(P, cur(P), "expected '=' in set");
    if (is_op(cur(P), "|")) return fail_at(P, cur(P), "filtered block set is not supported");
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
    jnode *n = new_node(P, JN_MACRO, at);
    if (!n) return NULL;
    if (cur(P)->kind != JT_NAME) return fail_at(P, cur(P), "expected a macro name");
    n->name = cur(P)->p;
    skip(P);
    if (!expect_op(P, "(")) return NULL;
    nvec v = {0};
    while (!is_op(cur(P), ")")) {
        if (v.n && !expect_op(P, ",")) goto bad;
        if (cur(P)->kind != JT_NAME) {
            fail_at(P, cur(P), "expected a parameter name");
            goto bad;
        }
        const char *pname = cur(P)->p;
        skip(P);
        jnode *def = NULL;
        if (is_op(cur(P), "=")) {
            skip(P);
            def = parse_expression(P, true);
            if (!def) goto bad;
        }
        if (!nv_push(P, &v, def, pname)) goto bad;
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
    if (t->kind != JT_NAME) return fail_at(P, t, "expected a tag name after '{%%'");
    skip(P);
    const char *w = t->p;
    if (!strcmp(w, "if")) return parse_if(P, t);
    if (!strcmp(w, "for")) return parse_for(P, t);
    if (!strcmp(w, "set")) return parse_set(P, t);
    if (!strcmp(w, "macro")) return parse_macro(P, t);
    if (!strcmp(w, "break") || !strcmp(w, "continue")) {
        if (!P->loops) return fail_at(P, t, "'%s' outside a for loop", w);
        jnode *n = new_node(P, w[0] == 'b' ? JN_BREAK : JN_CONTINUE, t);
        return n && expect_kind(P, JT_BLOCK_END, "'%}'") ? n : NULL;
    }
    if (!strcmp(w, "generation")) {
        /* transformers' assistant-mask marker: renders its body unchanged. */
        jnode *n = new_node(P, JN_BLOCK, t);
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
        return fail_at(P, t, "unexpected '%s' (no open block it could close)", w);
    return fail_at(P, t, "unsupported tag '%s'", w);
}

/* Statements until EOF (ends == NULL) or a `{% name` with name in ends; leaves the parser on
 * that name token and stores it in *which. */
static bool parse_body(parser *P, const char *const *ends, nvec *out, const char **which) {
    if (!enter(P)) return false;
    const jtok *start = P->opener ? P->opener : cur(P);
    P->opener = NULL;
    for (;;) {
        const jtok *t = cur(P);
        jnode *n = NULL;
        if (t->kind == JT_EOF) {
            if (!ends) break;
            fail_at(P, start, "block is never closed (missing '{%% %s %%}')", ends[0]);
            goto bad;
        }
        if (t->kind == JT_TEXT) {
            n = new_node(P, JN_TEXT, t);
            if (n) n->lit = jv_str(t->p, t->n);
            skip(P);
        } else if (t->kind == JT_VAR_BEGIN) {
            skip(P);
            jnode *x = parse_tuple(P, true, false);
            if (x && expect_kind(P, JT_VAR_END, "'}}'")) n = node1(P, JN_OUTPUT, t, x);
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
            fail_at(P, t, "unexpected %s", tok_desc(t, b, sizeof b));
        }
        if (!n || !nv_push(P, out, n, NULL)) goto bad;
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
