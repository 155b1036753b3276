/* src/chat/jinja_parse_expr.c — tokens -> AST for expressions, with jinja2's grammar and
 * operator precedence.
 *
 * Precedence, loosest first (as jinja2's parser): `x if c else y`, or, and, not, comparisons
 * (== != < <= > >= in, not in; chained), + -, ~, * / // %, ** (left-associative, as in
 * jinja2), unary - +, then primaries with .attr, [subscript/slice], (call), |filter, is test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_parse_int.h"

static jnode *node2(parser *P, jn_kind kind, const jtok *at, jnode *a, jnode *b) {
    jnode *n = epyq_jp_new_node(P, kind, at);
    if (!n) return NULL;
    nvec v = {0};
    return epyq_jp_nv_push(P, &v, a, NULL) && epyq_jp_nv_push(P, &v, b, NULL)
               ? epyq_jp_nv_to_kids(&v, n)
               : NULL;
}

static jnode *parse_unary(parser *P, bool with_filter);
static jnode *parse_primary(parser *P);
static jnode *parse_postfix(parser *P, jnode *node);

/* `(` args `)` after a callee/filter/test: positional and name=value arguments. */
static bool parse_call_args(parser *P, nvec *v) {
    if (!epyq_jp_expect_op(P, "(")) return false;
    bool first = true;
    while (!is_op(cur(P), ")")) {
        if (!first && !epyq_jp_expect_op(P, ",")) return false;
        if (is_op(cur(P), ")")) break; /* trailing comma */
        first = false;
        if (is_op(cur(P), "*") || is_op(cur(P), "**")) {
            epyq_jp_fail(P, cur(P), "*args / **kwargs in calls are not supported");
            return false;
        }
        const char *kw = NULL;
        if (cur(P)->kind == JT_NAME && is_op(peek_at(P, 1), "=")) {
            kw = cur(P)->p;
            skip(P);
            skip(P);
        }
        jnode *a = epyq_jp_expression(P, true);
        if (!a || !epyq_jp_nv_push(P, v, a, kw)) return false;
    }
    return epyq_jp_expect_op(P, ")");
}

static jnode *parse_filter(parser *P, jnode *subject) {
    const jtok *at = cur(P); /* the '|' */
    skip(P);
    if (cur(P)->kind != JT_NAME) return epyq_jp_fail(P, cur(P), "expected a filter name after '|'");
    const jtok *nt = cur(P);
    int fid = epyq_jj_filter_id(nt->p);
    if (fid < 0) return epyq_jp_fail(P, nt, "unsupported filter '%s'", nt->p);
    skip(P);
    jnode *n = epyq_jp_new_node(P, JN_FILTER, at);
    if (!n) return NULL;
    n->name = nt->p;
    n->fid = fid;
    nvec v = {0};
    if (!epyq_jp_nv_push(P, &v, subject, NULL)) return NULL;
    if (is_op(cur(P), "(") && !parse_call_args(P, &v)) {
        return NULL;
    }
    return epyq_jp_nv_to_kids(&v, n);
}

static jnode *parse_test(parser *P, jnode *subject) {
    const jtok *at = cur(P); /* 'is' */
    skip(P);
    bool negated = false;
    if (is_name(cur(P), "not")) {
        negated = true;
        skip(P);
    }
    if (cur(P)->kind != JT_NAME) return epyq_jp_fail(P, cur(P), "expected a test name after 'is'");
    const jtok *nt = cur(P);
    int tid = epyq_jj_test_id(nt->p);
    if (tid < 0) return epyq_jp_fail(P, nt, "unsupported test '%s'", nt->p);
    skip(P);
    jnode *n = epyq_jp_new_node(P, JN_TEST, at);
    if (!n) return NULL;
    n->name = nt->p;
    n->fid = tid;
    n->op = negated;
    nvec v = {0};
    if (!epyq_jp_nv_push(P, &v, subject, NULL)) return NULL;
    const jtok *c = cur(P);
    if (is_op(c, "(")) {
        if (!parse_call_args(P, &v)) {
            return NULL;
        }
    } else if ((c->kind == JT_NAME || c->kind == JT_STRING || c->kind == JT_INT ||
                c->kind == JT_FLOAT || is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        /* jinja2 lets a test take one argument without parentheses: `x is divisibleby 3`. */
        if (is_name(c, "is")) return epyq_jp_fail(P, c, "tests cannot be chained with 'is'");
        jnode *a = parse_primary(P);
        if (a) a = parse_postfix(P, a);
        if (!a || !epyq_jp_nv_push(P, &v, a, NULL)) return NULL;
    }
    return epyq_jp_nv_to_kids(&v, n);
}

static jnode *parse_subscript(parser *P, jnode *obj, const jtok *at) {
    /* obj[expr] or obj[start:stop:step] with any part optional. */
    jnode *parts[3] = {NULL, NULL, NULL};
    bool is_slice = false;
    if (!is_op(cur(P), ":")) {
        parts[0] = epyq_jp_expression(P, true);
        if (!parts[0]) return NULL;
    }
    if (is_op(cur(P), ":")) {
        is_slice = true;
        skip(P);
        if (!is_op(cur(P), "]") && !is_op(cur(P), ":")) {
            parts[1] = epyq_jp_expression(P, true);
            if (!parts[1]) return NULL;
        }
        if (is_op(cur(P), ":")) {
            skip(P);
            if (!is_op(cur(P), "]")) {
                parts[2] = epyq_jp_expression(P, true);
                if (!parts[2]) return NULL;
            }
        }
    }
    if (is_op(cur(P), ",")) return epyq_jp_fail(P, cur(P), "tuple subscripts are not supported");
    if (!epyq_jp_expect_op(P, "]")) return NULL;
    if (!is_slice) return node2(P, JN_ITEM, at, obj, parts[0]);
    jnode *n = epyq_jp_new_node(P, JN_SLICE, at);
    if (!n) return NULL;
    n->kids = epyq_jj_alloc_array(P->ar, 4, sizeof *n->kids);
    if (!n->kids) return epyq_jp_fail(P, at, "out of memory");
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
                node = epyq_jp_node1(P, JN_ATTR, t, node);
                if (node) node->name = a->p;
                skip(P);
            } else if (a->kind == JT_INT) {
                /* `foo.0` is jinja2's spelling of foo[0]. */
                jnode *k = epyq_jp_new_node(P, JN_LIT, a);
                if (!k) return NULL;
                k->lit = jv_int(a->i);
                skip(P);
                node = node2(P, JN_ITEM, t, node, k);
            } else {
                char b[64];
                return epyq_jp_fail(P, a, "expected an attribute name after '.', found %s",
                                    epyq_jp_tok_desc(a, b, sizeof b));
            }
        } else if (is_op(t, "[")) {
            skip(P);
            if (!epyq_jp_enter(P)) return NULL;
            node = parse_subscript(P, node, t);
            P->depth--;
        } else if (is_op(t, "(")) {
            jnode *n = epyq_jp_new_node(P, JN_CALL, t);
            if (!n) return NULL;
            nvec v = {0};
            if (!epyq_jp_nv_push(P, &v, node, NULL)) return NULL;
            if (!parse_call_args(P, &v)) {
                return NULL;
            }
            node = epyq_jp_nv_to_kids(&v, n);
        } else {
            break;
        }
    }
    return node;
}

static jnode *parse_filter_expr(parser *P, jnode *node) {
    while (node) {
        const jtok *t = cur(P);
        if (is_op(t, "|")) node = parse_filter(P, node);
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
    jnode *n = epyq_jp_new_node(P, dict ? JN_DICT : JN_LIST, at);
    if (!n) return NULL;
    const char *close = dict ? "}" : "]";
    nvec v = {0};
    bool first = true;
    while (!is_op(cur(P), close)) {
        if (!first && !epyq_jp_expect_op(P, ",")) goto bad;
        if (is_op(cur(P), close)) break;
        first = false;
        jnode *x = epyq_jp_expression(P, true);
        if (!x || !epyq_jp_nv_push(P, &v, x, NULL)) goto bad;
        if (dict) {
            if (!epyq_jp_expect_op(P, ":")) goto bad;
            jnode *y = epyq_jp_expression(P, true);
            if (!y || !epyq_jp_nv_push(P, &v, y, NULL)) goto bad;
        }
    }
    skip(P);
    return epyq_jp_nv_to_kids(&v, n);
bad:
    return NULL;
}

static jnode *parse_primary(parser *P) {
    if (!epyq_jp_enter(P)) return NULL;
    const jtok *t = cur(P);
    jnode *n = NULL;
    if (t->kind == JT_NAME) {
        n = epyq_jp_new_node(P, JN_LIT, t);
        if (!n) goto out;
        if (!strcmp(t->p, "true") || !strcmp(t->p, "True")) n->lit = jv_bool(true);
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
        n = epyq_jp_new_node(P, JN_LIT, t);
        char *s = ok && n ? epyq_jj_strdup(P->ar, b.p ? b.p : "", b.len) : NULL;
        if (n && s) n->lit = jv_str(s, b.len);
        else
            n = epyq_jp_fail(P, t, "out of memory");
        epyq_sbuf_free(&b);
    } else if (t->kind == JT_INT || t->kind == JT_FLOAT) {
        n = epyq_jp_new_node(P, JN_LIT, t);
        if (n) n->lit = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->f);
        skip(P);
    } else if (is_op(t, "(")) {
        skip(P);
        n = epyq_jp_tuple(P, true, true);
        if (n && !epyq_jp_expect_op(P, ")")) n = NULL;
    } else if (is_op(t, "[")) {
        n = parse_list_or_dict(P, false);
    } else if (is_op(t, "{")) {
        n = parse_list_or_dict(P, true);
    } else {
        char b[64];
        n = epyq_jp_fail(P, t, "expected an expression, found %s",
                         epyq_jp_tok_desc(t, b, sizeof b));
    }
out:
    P->depth--;
    return n;
}

static jnode *parse_unary(parser *P, bool with_filter) {
    if (!epyq_jp_enter(P)) return NULL;
    const jtok *t = cur(P);
    jnode *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        skip(P);
        jnode *x = parse_unary(P, false);
        n = x ? epyq_jp_node1(P, is_op(t, "-") ? JN_NEG : JN_POS, t, x) : NULL;
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
        else if (is_op(t, "/"))
            op = JOP_DIV;
        else if (is_op(t, "//"))
            op = JOP_FLOORDIV;
        else if (is_op(t, "%"))
            op = JOP_MOD;
        else
            break;
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
        else if (is_op(t, "!="))
            op = JOP_NE;
        else if (is_op(t, "<"))
            op = JOP_LT;
        else if (is_op(t, "<="))
            op = JOP_LE;
        else if (is_op(t, ">"))
            op = JOP_GT;
        else if (is_op(t, ">="))
            op = JOP_GE;
        else if (is_name(t, "in"))
            op = JOP_IN;
        else if (is_name(t, "not") && is_name(peek_at(P, 1), "in")) {
            op = JOP_NOTIN;
            skip(P);
        } else
            break;
        skip(P);
        if (nops == sizeof ops) return epyq_jp_fail(P, t, "too many chained comparisons");
        if (!v.n && !epyq_jp_nv_push(P, &v, first, NULL)) return NULL;
        jnode *r = parse_math1(P);
        if (!r || !epyq_jp_nv_push(P, &v, r, NULL)) {
            return NULL;
        }
        ops[nops++] = (uint8_t)op;
    }
    if (!nops) return first;
    jnode *n = epyq_jp_new_node(P, JN_CMP, at);
    if (!n) return NULL;
    n->ops = epyq_jj_alloc(P->ar, nops);
    if (!n->ops) return epyq_jp_fail(P, at, "out of memory");
    memcpy(n->ops, ops, nops);
    return epyq_jp_nv_to_kids(&v, n);
}

static jnode *parse_not(parser *P) {
    if (is_name(cur(P), "not")) {
        const jtok *t = cur(P);
        skip(P);
        if (!epyq_jp_enter(P)) return NULL;
        jnode *x = parse_not(P);
        P->depth--;
        return x ? epyq_jp_node1(P, JN_NOT, t, x) : NULL;
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
            if (!epyq_jp_enter(P)) return NULL;
            y = parse_condexpr(P);
            P->depth--;
            if (!y) return NULL;
        }
        jnode *n = epyq_jp_new_node(P, JN_COND, t);
        if (!n) return NULL;
        n->kids = epyq_jj_alloc_array(P->ar, 3, sizeof *n->kids);
        if (!n->kids) return epyq_jp_fail(P, t, "out of memory");
        n->kids[0] = x; /* value when true */
        n->kids[1] = c; /* condition */
        n->kids[2] = y; /* value when false; NULL = undefined */
        n->nkids = 3;
        x = n;
    }
    return x;
}

jnode *epyq_jp_expression(parser *P, bool with_condexpr) {
    if (!epyq_jp_enter(P)) return NULL;
    jnode *n = with_condexpr ? parse_condexpr(P) : parse_or(P);
    P->depth--;
    return n;
}

static bool tuple_end(parser *P) {
    const jtok *t = cur(P);
    return t->kind == JT_BLOCK_END || t->kind == JT_VAR_END || t->kind == JT_EOF || is_op(t, ")");
}

jnode *epyq_jp_tuple(parser *P, bool with_condexpr, bool explicit_parens) {
    const jtok *at = cur(P);
    nvec v = {0};
    bool is_tuple = false;
    for (;;) {
        if (v.n && !epyq_jp_expect_op(P, ",")) goto bad;
        if (tuple_end(P)) break;
        jnode *x = epyq_jp_expression(P, with_condexpr);
        if (!x || !epyq_jp_nv_push(P, &v, x, NULL)) goto bad;
        if (is_op(cur(P), ",")) is_tuple = true;
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
            return epyq_jp_fail(P, cur(P), "expected an expression, found %s",
                                epyq_jp_tok_desc(cur(P), b, sizeof b));
        }
    }
    jnode *n = epyq_jp_new_node(P, JN_TUPLE, at);
    if (!n) goto bad;
    return epyq_jp_nv_to_kids(&v, n);
bad:
    return NULL;
}
