/* src/chat/jinja_eval.c — walks the AST: expressions with Python semantics, statements with
 * jinja2's scoping (a for-loop iteration and a macro call open a scope, `if` does not; set
 * writes the innermost scope, so only namespace() objects carry values out of a loop). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_int.h"

enum { MAX_CALL_DEPTH = 16 }; /* macro calls (recursion) and nested filter evaluations */

enum { EX_OK = 0, EX_ERR = -1, EX_BREAK = 1, EX_CONTINUE = 2 };

/* ---- scopes ----------------------------------------------------------------------------- */

static jscope *scope_new(jrender *r, jscope *parent) {
    jscope *s = epyq_jj_alloc(&r->ar, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

static jv *scope_find(jscope *sc, const char *name) {
    for (; sc; sc = sc->parent)
        for (size_t i = 0; i < sc->n; i++)
            if (!strcmp(sc->names[i], name)) return &sc->vals[i];
    return NULL;
}

static bool scope_set(jrender *r, jscope *sc, const char *name, jv v) {
    for (size_t i = 0; i < sc->n; i++)
        if (!strcmp(sc->names[i], name)) {
            sc->vals[i] = v;
            return true;
        }
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? sc->cap * 2 : 8;
        const char **nn = epyq_jj_alloc_array(&r->ar, cap, sizeof *nn);
        jv *nv = epyq_jj_alloc_array(&r->ar, cap, sizeof *nv);
        if (!nn || !nv) return epyq_jj_nomem(r);
        if (sc->n) {
            memcpy(nn, sc->names, sc->n * sizeof *nn);
            memcpy(nv, sc->vals, sc->n * sizeof *nv);
        }
        sc->names = nn;
        sc->vals = nv;
        sc->cap = cap;
    }
    sc->names[sc->n] = name;
    sc->vals[sc->n] = v;
    sc->n++;
    return true;
}

/* ---- helpers ---------------------------------------------------------------------------- */

static bool fail_node(jrender *r, const jnode *n, const char *msg, const char *arg) {
    r->at = n;
    return epyq_jj_fail(r, msg, arg);
}


/* ---- expressions ------------------------------------------------------------------------ */

static bool eval_args(jrender *r, jscope *sc, const jnode *n, size_t from, jv *args) {
    for (size_t i = from; i < n->nkids; i++)
        if (!epyq_jj_eval(r, sc, n->kids[i], &args[i - from])) return false;
    return true;
}

static const char *const *arg_names(const jnode *n, size_t from) { return n->argnames ? n->argnames + from : NULL; }

bool epyq_jj_eval(jrender *r, jscope *sc, const jnode *n, jv *out) {
    if (!epyq_jj_count_step(r)) return false;
    r->at = n;
    switch ((jn_kind)n->kind) {
    case JN_LIT: *out = n->lit; return true;
    case JN_NAME: {
        jv *v = scope_find(sc, n->name);
        *out = v ? *v : jv_undef(n->name);
        return true;
    }
    case JN_LIST:
    case JN_TUPLE: {
        jlist *l = epyq_jj_list_new(&r->ar, n->nkids);
        if (!l) return epyq_jj_nomem(r);
        if (!eval_args(r, sc, n, 0, l->v)) return false;
        l->n = n->nkids;
        *out = jv_list(l, n->kind == JN_TUPLE);
        return true;
    }
    case JN_DICT: {
        jdict *d = epyq_jj_dict_new(&r->ar, n->nkids / 2);
        if (!d) return epyq_jj_nomem(r);
        for (size_t i = 0; i + 1 < n->nkids; i += 2) {
            jv k, v;
            if (!epyq_jj_eval(r, sc, n->kids[i], &k) || !epyq_jj_eval(r, sc, n->kids[i + 1], &v)) return false;
            if (k.t == JV_LIST && !k.tuple) return fail_node(r, n, "unhashable type: '%s'", "list");
            if (k.t == JV_DICT) return fail_node(r, n, "unhashable type: '%s'", "dict");
            if (!epyq_jj_dict_set(&r->ar, d, k, v)) return epyq_jj_nomem(r);
        }
        *out = (jv){.t = JV_DICT, .u.d = d};
        return true;
    }
    case JN_ATTR: {
        jv obj;
        if (!epyq_jj_eval(r, sc, n->kids[0], &obj)) return false;
        r->at = n;
        return epyq_jj_getattr(r, obj, n->name, out);
    }
    case JN_ITEM: {
        jv obj, key;
        if (!epyq_jj_eval(r, sc, n->kids[0], &obj) || !epyq_jj_eval(r, sc, n->kids[1], &key)) return false;
        r->at = n;
        return epyq_jj_getitem(r, obj, key, out);
    }
    case JN_SLICE: {
        jv v[4] = {jv_none(), jv_none(), jv_none(), jv_none()};
        for (int k = 0; k < 4; k++)
            if (n->kids[k] && !epyq_jj_eval(r, sc, n->kids[k], &v[k])) return false;
        r->at = n;
        return epyq_jj_slice(r, v[0], v[1], v[2], v[3], out);
    }
    case JN_CALL: {
        jv fn;
        if (!epyq_jj_eval(r, sc, n->kids[0], &fn)) return false;
        size_t na = n->nkids - 1;
        jv *args = na ? epyq_jj_alloc_array(&r->ar, na, sizeof *args) : NULL;
        if (na && !args) return epyq_jj_nomem(r);
        if (!eval_args(r, sc, n, 1, args)) return false;
        r->at = n;
        return epyq_jj_call_value(r, fn, args, arg_names(n, 1), na, out);
    }
    case JN_FILTER: {
        jv *args = epyq_jj_alloc_array(&r->ar, n->nkids, sizeof *args);
        if (!args) return epyq_jj_nomem(r);
        if (!eval_args(r, sc, n, 0, args)) return false;
        r->at = n;
        if (++r->depth > MAX_CALL_DEPTH) return epyq_jj_fail(r, "calls nested deeper than %d", MAX_CALL_DEPTH);
        bool ok = epyq_jj_apply_filter(r, sc, n->fid, args, arg_names(n, 0), n->nkids, out);
        r->depth--;
        return ok;
    }
    case JN_TEST: {
        jv *args = epyq_jj_alloc_array(&r->ar, n->nkids, sizeof *args);
        if (!args) return epyq_jj_nomem(r);
        if (!eval_args(r, sc, n, 0, args)) return false;
        r->at = n;
        bool b;
        if (!epyq_jj_apply_test(r, n->fid, args, n->nkids, &b)) return false;
        *out = jv_bool(n->op ? !b : b);
        return true;
    }
    case JN_NOT: {
        jv v;
        if (!epyq_jj_eval(r, sc, n->kids[0], &v)) return false;
        *out = jv_bool(!epyq_jj_truthy(v));
        return true;
    }
    case JN_NEG:
    case JN_POS: {
        jv v;
        if (!epyq_jj_eval(r, sc, n->kids[0], &v)) return false;
        r->at = n;
        if (v.t == JV_UNDEF) return epyq_jj_undefined_error(r, v);
        if (!jv_is_num(v))
            return epyq_jj_fail(r, "bad operand type for unary %s: '%s'",
                                n->kind == JN_NEG ? "-" : "+", epyq_jj_type_name(v));
        if (n->kind == JN_POS) *out = v.t == JV_BOOL ? jv_int(v.u.b) : v;
        else if (v.t == JV_FLOAT) *out = jv_float(-v.u.f);
        else if (jv_as_int(v) == INT64_MIN)
            return epyq_jj_fail(r, "integer overflow in unary -");
        else
            *out = jv_int(-jv_as_int(v));
        return true;
    }
    case JN_BIN: {
        jv a, b;
        if (!epyq_jj_eval(r, sc, n->kids[0], &a) || !epyq_jj_eval(r, sc, n->kids[1], &b)) return false;
        r->at = n;
        return epyq_jj_binary(r, (jop)n->op, a, b, out);
    }
    case JN_AND:
    case JN_OR: {
        /* Python returns the deciding operand itself, not a bool. */
        if (!epyq_jj_eval(r, sc, n->kids[0], out)) return false;
        if (epyq_jj_truthy(*out) == (n->kind == JN_OR)) return true;
        return epyq_jj_eval(r, sc, n->kids[1], out);
    }
    case JN_COND: {
        jv c;
        if (!epyq_jj_eval(r, sc, n->kids[1], &c)) return false;
        if (epyq_jj_truthy(c)) return epyq_jj_eval(r, sc, n->kids[0], out);
        if (n->kids[2]) return epyq_jj_eval(r, sc, n->kids[2], out);
        *out = jv_undef("the inline if-expression on line has no else");
        return true;
    }
    case JN_CMP: {
        jv a;
        if (!epyq_jj_eval(r, sc, n->kids[0], &a)) return false;
        for (size_t i = 1; i < n->nkids; i++) {
            jv b;
            bool ok;
            if (!epyq_jj_eval(r, sc, n->kids[i], &b)) return false;
            r->at = n;
            if (!epyq_jj_compare_op(r, (jop)n->ops[i - 1], a, b, &ok)) return false;
            if (!ok) {
                *out = jv_bool(false);
                return true;
            }
            a = b;
        }
        *out = jv_bool(true);
        return true;
    }
    default: return fail_node(r, n, "%s", "statement used as an expression");
    }
}

/* ---- statements ------------------------------------------------------------------------- */

static int exec_body(jrender *r, jscope *sc, jnode *const *body, size_t n, epyq_sbuf *out);

static bool emit(jrender *r, epyq_sbuf *out, jv v) {
    if (!epyq_jj_to_str(out, v)) return epyq_jj_fail(r, "rendered text exceeds %zu bytes", r->max_output);
    return true;
}

/* Binds the target names of a for/set to one value (unpacking when there are several). */
static bool assign_targets(jrender *r, jscope *sc, const jnode *n, jv v) {
    if (n->nnames == 1) return scope_set(r, sc, n->argnames[0], v);
    jlist *items;
    if (!epyq_jj_iter_list(r, v, &items)) return false;
    if (items->n != n->nnames)
        return epyq_jj_fail(r, "cannot unpack %zu values into %zu names", items->n, n->nnames);
    for (size_t i = 0; i < n->nnames; i++)
        if (!scope_set(r, sc, n->argnames[i], items->v[i])) return false;
    return true;
}

static int exec_for(jrender *r, jscope *sc, const jnode *n, epyq_sbuf *out) {
    jv seq;
    if (!epyq_jj_eval(r, sc, n->kids[0], &seq)) return EX_ERR;
    r->at = n;
    jlist *all;
    if (!epyq_jj_iter_list(r, seq, &all)) return EX_ERR;
    jlist *items = all;
    if (n->kids[1]) {
        /* The loop filter runs first: loop.length/last/index count only kept items. */
        items = epyq_jj_list_new(&r->ar, 0);
        if (!items) return epyq_jj_nomem(r), EX_ERR;
        jscope *fs = scope_new(r, sc);
        if (!fs) return epyq_jj_nomem(r), EX_ERR;
        for (size_t i = 0; i < all->n; i++) {
            jv keep;
            fs->n = 0;
            if (!assign_targets(r, fs, n, all->v[i]) || !epyq_jj_eval(r, fs, n->kids[1], &keep)) return EX_ERR;
            if (epyq_jj_truthy(keep) && !epyq_jj_list_push(&r->ar, items, all->v[i])) return epyq_jj_nomem(r), EX_ERR;
        }
    }
    if (items->n == 0) return exec_body(r, sc, n->orelse, n->norelse, out);
    jv *outer = scope_find(sc, "loop");
    jloop *lp = epyq_jj_alloc(&r->ar, sizeof *lp);
    if (!lp) return epyq_jj_nomem(r), EX_ERR;
    lp->items = items;
    lp->outer = outer && outer->t == JV_LOOP ? outer->u.loop : NULL;
    /* One scope serves every iteration, emptied each time: names set by the previous
     * iteration must not be visible, and a fresh scope per iteration would cost memory. */
    jscope *it = scope_new(r, sc);
    if (!it) return epyq_jj_nomem(r), EX_ERR;
    for (size_t i = 0; i < items->n; i++) {
        if (!epyq_jj_count_step(r)) return EX_ERR;
        lp->idx = i;
        it->n = 0;
        r->at = n;
        if (!assign_targets(r, it, n, items->v[i]) || !scope_set(r, it, "loop", (jv){.t = JV_LOOP, .u.loop = lp}))
            return EX_ERR;
        int st = exec_body(r, it, n->body, n->nbody, out);
        if (st == EX_ERR) return EX_ERR;
        if (st == EX_BREAK) break;
    }
    return EX_OK;
}

static int exec_set(jrender *r, jscope *sc, const jnode *n) {
    jv v;
    if (!epyq_jj_eval(r, sc, n->kids[0], &v)) return EX_ERR;
    r->at = n;
    if (n->attr) {
        jv *ns = scope_find(sc, n->name);
        if (!ns || ns->t != JV_NS) return epyq_jj_fail(r, "cannot assign attribute on non-namespace object"), EX_ERR;
        if (!epyq_jj_dict_set(&r->ar, ns->u.d, jv_str(n->attr, strlen(n->attr)), v)) return epyq_jj_nomem(r), EX_ERR;
        return EX_OK;
    }
    return assign_targets(r, sc, n, v) ? EX_OK : EX_ERR;
}

static int exec_stmt(jrender *r, jscope *sc, const jnode *n, epyq_sbuf *out) {
    if (!epyq_jj_count_step(r)) return EX_ERR;
    r->at = n;
    switch ((jn_kind)n->kind) {
    case JN_TEXT:
        if (!epyq_sbuf_add(out, n->lit.u.s.p, n->lit.u.s.n))
            return epyq_jj_fail(r, "rendered text exceeds %zu bytes", r->max_output), EX_ERR;
        return EX_OK;
    case JN_OUTPUT: {
        jv v;
        if (!epyq_jj_eval(r, sc, n->kids[0], &v)) return EX_ERR;
        return emit(r, out, v) ? EX_OK : EX_ERR;
    }
    case JN_IF: {
        jv c;
        if (!epyq_jj_eval(r, sc, n->kids[0], &c)) return EX_ERR;
        return epyq_jj_truthy(c) ? exec_body(r, sc, n->body, n->nbody, out) : exec_body(r, sc, n->orelse, n->norelse, out);
    }
    case JN_FOR: return exec_for(r, sc, n, out);
    case JN_SET: return exec_set(r, sc, n);
    case JN_SETBLOCK: {
        epyq_sbuf b = {.max = r->max_output};
        int st = exec_body(r, sc, n->body, n->nbody, &b);
        jv v;
        if (st != EX_OK || !epyq_jj_str_from_buf(r, &b, &v)) {
            epyq_sbuf_free(&b);
            return EX_ERR;
        }
        return scope_set(r, sc, n->name, v) ? EX_OK : EX_ERR;
    }
    case JN_MACRO: {
        jmacro *m = epyq_jj_alloc(&r->ar, sizeof *m);
        if (!m) return epyq_jj_nomem(r), EX_ERR;
        m->def = n;
        m->closure = sc;
        return scope_set(r, sc, n->name, (jv){.t = JV_MACRO, .u.m = m}) ? EX_OK : EX_ERR;
    }
    case JN_BREAK: return EX_BREAK;
    case JN_CONTINUE: return EX_CONTINUE;
    case JN_BLOCK: return exec_body(r, sc, n->body, n->nbody, out);
    default: return fail_node(r, n, "%s", "expression used as a statement"), EX_ERR;
    }
}

static int exec_body(jrender *r, jscope *sc, jnode *const *body, size_t n, epyq_sbuf *out) {
    for (size_t i = 0; i < n; i++) {
        int st = exec_stmt(r, sc, body[i], out);
        if (st != EX_OK) return st;
    }
    return EX_OK;
}

static bool call_macro(jrender *r, const jmacro *m, const jv *args, const char *const *names, size_t nargs,
                       jv *out) {
    const jnode *def = m->def;
    if (r->depth >= MAX_CALL_DEPTH) return epyq_jj_fail(r, "macro calls nested deeper than %d", MAX_CALL_DEPTH);
    jscope *sc = scope_new(r, m->closure);
    if (!sc) return epyq_jj_nomem(r);
    size_t np = def->nkids;
    bool *bound = np ? epyq_jj_alloc_array(&r->ar, np, sizeof *bound) : NULL;
    if (np && !bound) return epyq_jj_nomem(r);
    size_t pos = 0;
    for (size_t i = 0; i < nargs; i++) {
        size_t k = np;
        if (names && names[i]) {
            for (k = 0; k < np && strcmp(def->argnames[k], names[i]); k++) {}
            if (k == np) return epyq_jj_fail(r, "macro '%s' has no parameter named '%s'", def->name, names[i]);
        } else {
            k = pos++;
            if (k >= np) return epyq_jj_fail(r, "macro '%s' takes not more than %zu argument(s)", def->name, np);
        }
        if (!scope_set(r, sc, def->argnames[k], args[i])) return false;
        bound[k] = true;
    }
    for (size_t k = 0; k < np; k++) {
        if (bound[k]) continue;
        jv v = jv_undef(def->argnames[k]);
        if (def->kids[k] && !epyq_jj_eval(r, sc, def->kids[k], &v)) return false;
        if (!scope_set(r, sc, def->argnames[k], v)) return false;
    }
    epyq_sbuf b = {.max = r->max_output};
    r->depth++;
    int st = exec_body(r, sc, def->body, def->nbody, &b);
    r->depth--;
    if (st != EX_OK) {
        epyq_sbuf_free(&b);
        return false;
    }
    return epyq_jj_str_from_buf(r, &b, out);
}

bool epyq_jj_call_value(jrender *r, jv fn, const jv *args, const char *const *names, size_t nargs, jv *out) {
    switch (fn.t) {
    case JV_MACRO: return call_macro(r, fn.u.m, args, names, nargs, out);
    case JV_FUNC: return epyq_jj_call_builtin(r, fn.u.fn, args, names, nargs, out);
    case JV_UNDEF: return epyq_jj_undefined_error(r, fn);
    default: return epyq_jj_fail(r, "'%s' object is not callable", epyq_jj_type_name(fn));
    }
}

bool epyq_jj_iter_list(jrender *r, jv v, jlist **out) {
    switch (v.t) {
    case JV_UNDEF:
        *out = epyq_jj_list_new(&r->ar, 0);
        break;
    case JV_LIST: *out = v.u.l; return true;
    case JV_DICT:
        *out = epyq_jj_list_new(&r->ar, v.u.d->n);
        if (*out) {
            memcpy((*out)->v, v.u.d->k, v.u.d->n * sizeof *(*out)->v);
            (*out)->n = v.u.d->n;
        }
        break;
    case JV_STR: {
        const char *s = v.u.s.p;
        size_t n = v.u.s.n, i = 0;
        *out = epyq_jj_list_new(&r->ar, epyq_jj_utf8_len(s, n));
        while (*out && i < n) {
            size_t a = i;
            epyq_jj_utf8_next(s, n, &i);
            (*out)->v[(*out)->n++] = jv_str(s + a, i - a);
        }
        break;
    }
    default: return epyq_jj_fail(r, "'%s' object is not iterable", epyq_jj_type_name(v));
    }
    return *out ? true : epyq_jj_nomem(r);
}

epyq_jinja_limits epyq_jinja_default_limits(void) {
    return (epyq_jinja_limits){.max_output = (size_t)64 << 20, .max_memory = (size_t)512 << 20, .max_steps = 50000000};
}

epyq_status epyq_jinja_render(const epyq_jinja *t, const cJSON *vars, const epyq_jinja_limits *limits,
                              char **out, size_t *out_len, epyq_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    epyq_err local;
    if (!err) err = &local;
    epyq_err_clear(err);
    epyq_jinja_limits lim = limits ? *limits : epyq_jinja_default_limits();
    jrender r = {.err = err, .tpl = t, .max_steps = lim.max_steps, .max_output = lim.max_output};
    r.ar.max = lim.max_memory;
    epyq_sbuf b = {.max = lim.max_output};
    jscope *builtins = scope_new(&r, NULL);
    jscope *globals = builtins ? scope_new(&r, builtins) : NULL;
    jscope *top = globals ? scope_new(&r, globals) : NULL;
    bool ok = top != NULL;
    if (!ok) epyq_jj_nomem(&r);
    if (ok) epyq_jj_install_globals(&r, builtins);
    ok = ok && err->code == EPYQ_OK;
    if (ok && vars && cJSON_IsObject(vars))
        for (const cJSON *c = vars->child; ok && c; c = c->next) {
            jv v = epyq_jj_from_cjson(&r, c, 0, &ok);
            if (ok && c->string) ok = scope_set(&r, globals, c->string, v);
        }
    if (ok) ok = exec_body(&r, top, t->body, t->nbody, &b) == EX_OK;
    epyq_jj_arena_free(&r.ar);
    if (!ok) {
        epyq_sbuf_free(&b);
        if (err->code == EPYQ_OK) epyq_err_set(err, EPYQ_E_INTERNAL, "%s: render failed without a message", t->name);
        return err->code;
    }
    *out = epyq_sbuf_take(&b, out_len);
    if (!*out) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", t->name);
    return EPYQ_OK;
}
