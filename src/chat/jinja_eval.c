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

static bool undefined_error(jrender *r, jv u) {
    return epyq_jj_fail(r, "'%.*s' is undefined", (int)u.u.s.n, u.u.s.p ? u.u.s.p : "value");
}

static jv make_list(jlist *l, bool tuple) {
    jv v = {.t = JV_LIST, .tuple = tuple};
    v.u.l = l;
    return v;
}

static bool is_intlike(jv v) { return v.t == JV_INT || v.t == JV_BOOL; }
static int64_t as_int(jv v) { return v.t == JV_INT ? v.u.i : v.u.b; }
static bool is_numv(jv v) { return is_intlike(v) || v.t == JV_FLOAT; }
static double as_f(jv v) { return v.t == JV_FLOAT ? v.u.f : (double)as_int(v); }

/* Python's slice index normalisation (PySlice_AdjustIndices). */
static bool slice_indices(jrender *r, jv start, jv stop, jv step, int64_t len, int64_t *s0, int64_t *s1,
                          int64_t *st, int64_t *count) {
    int64_t stp = 1;
    if (step.t != JV_NONE && step.t != JV_UNDEF) {
        if (!is_intlike(step)) return epyq_jj_fail(r, "slice indices must be integers or None");
        stp = as_int(step);
        if (stp == 0) return epyq_jj_fail(r, "slice step cannot be zero");
        if (stp == INT64_MIN) stp = -INT64_MAX;
    }
    int64_t lo, hi;
    jv ends[2] = {start, stop};
    int64_t out[2];
    for (int k = 0; k < 2; k++) {
        jv e = ends[k];
        if (e.t == JV_NONE || e.t == JV_UNDEF) {
            out[k] = stp > 0 ? (k ? len : 0) : (k ? -1 : len - 1);
            continue;
        }
        if (!is_intlike(e)) return epyq_jj_fail(r, "slice indices must be integers or None");
        int64_t x = as_int(e);
        if (x < 0) {
            x = x < -len ? (stp < 0 ? -1 : 0) : x + len;
        } else if (x >= len) {
            x = stp < 0 ? len - 1 : len;
        }
        out[k] = x;
    }
    lo = out[0];
    hi = out[1];
    int64_t n = 0;
    if (stp > 0 && lo < hi) n = (hi - lo - 1) / stp + 1;
    if (stp < 0 && hi < lo) n = (lo - hi - 1) / (-stp) + 1;
    *s0 = lo;
    *s1 = hi;
    *st = stp;
    *count = n;
    return true;
}

static bool do_slice(jrender *r, jv obj, jv a, jv b, jv c, jv *out) {
    if (obj.t == JV_UNDEF) return undefined_error(r, obj);
    if (obj.t == JV_LIST) {
        int64_t s0, s1, st, cnt;
        if (!slice_indices(r, a, b, c, (int64_t)obj.u.l->n, &s0, &s1, &st, &cnt)) return false;
        jlist *l = epyq_jj_list_new(&r->ar, (size_t)cnt);
        if (!l) return epyq_jj_nomem(r);
        for (int64_t i = 0, k = s0; i < cnt; i++, k += st) l->v[l->n++] = obj.u.l->v[k];
        *out = make_list(l, obj.tuple);
        return true;
    }
    if (obj.t == JV_STR) {
        /* Index by code point: find the byte offset of every character first. */
        const char *s = obj.u.s.p;
        size_t n = obj.u.s.n, len = epyq_jj_utf8_len(s, n);
        size_t *offs = epyq_jj_alloc_array(&r->ar, len + 1, sizeof *offs);
        if (!offs) return epyq_jj_nomem(r);
        size_t i = 0, k = 0;
        while (i < n) {
            offs[k++] = i;
            epyq_jj_utf8_next(s, n, &i);
        }
        offs[len] = n;
        int64_t s0, s1, st, cnt;
        if (!slice_indices(r, a, b, c, (int64_t)len, &s0, &s1, &st, &cnt)) return false;
        if (st == 1) {
            *out = jv_str(s + offs[s0], cnt ? offs[s0 + cnt] - offs[s0] : 0);
            return true;
        }
        epyq_sbuf buf = {.max = r->max_output};
        for (int64_t j = 0, p = s0; j < cnt; j++, p += st)
            if (!epyq_sbuf_add(&buf, s + offs[p], offs[p + 1] - offs[p])) {
                epyq_sbuf_free(&buf);
                return epyq_jj_nomem(r);
            }
        return epyq_jj_str_from_buf(r, &buf, out);
    }
    /* jinja2 compiles a slice to plain Python subscripting: no Undefined fallback here. */
    if (obj.t == JV_DICT) return epyq_jj_fail(r, "unhashable type: 'slice'");
    return epyq_jj_fail(r, "'%s' object is not subscriptable", epyq_jj_type_name(obj));
}

/* ---- getattr / getitem ------------------------------------------------------------------ */

static bool loop_attr(jrender *r, jloop *lp, const char *name, jv *out) {
    size_t n = lp->items->n, i = lp->idx;
    if (!strcmp(name, "index")) *out = jv_int((int64_t)i + 1);
    else if (!strcmp(name, "index0")) *out = jv_int((int64_t)i);
    else if (!strcmp(name, "revindex")) *out = jv_int((int64_t)(n - i));
    else if (!strcmp(name, "revindex0")) *out = jv_int((int64_t)(n - i - 1));
    else if (!strcmp(name, "first")) *out = jv_bool(i == 0);
    else if (!strcmp(name, "last")) *out = jv_bool(i + 1 == n);
    else if (!strcmp(name, "length")) *out = jv_int((int64_t)n);
    else if (!strcmp(name, "previtem")) *out = i > 0 ? lp->items->v[i - 1] : jv_undef("there is no previous item");
    else if (!strcmp(name, "nextitem")) *out = i + 1 < n ? lp->items->v[i + 1] : jv_undef("there is no next item");
    else if (!strcmp(name, "depth") || !strcmp(name, "depth0")) {
        int64_t d = 1;
        for (jloop *o = lp->outer; o; o = o->outer) d++;
        *out = jv_int(name[5] ? d - 1 : d);
    } else if (!strcmp(name, "cycle")) {
        jv self = {.t = JV_LOOP, .u.loop = lp};
        return epyq_jj_method(r, self, name, out);
    } else *out = jv_undef(name);
    return true;
}

bool epyq_jj_getattr(jrender *r, jv obj, const char *name, jv *out) {
    size_t nl = strlen(name);
    switch (obj.t) {
    case JV_UNDEF: return undefined_error(r, obj);
    case JV_DICT: {
        /* Python attributes (the dict methods) win over keys, as in jinja2's getattr. */
        if (epyq_jj_method(r, obj, name, out)) return true;
        if (r->err && r->err->code) return false;
        jv *v = epyq_jj_dict_get_str(obj.u.d, name, nl);
        *out = v ? *v : jv_undef(name);
        return true;
    }
    case JV_NS: {
        jv *v = epyq_jj_dict_get_str(obj.u.d, name, nl);
        *out = v ? *v : jv_undef(name);
        return true;
    }
    case JV_LOOP: return loop_attr(r, obj.u.loop, name, out);
    case JV_STR:
    case JV_LIST:
        if (epyq_jj_method(r, obj, name, out)) return true;
        if (r->err && r->err->code) return false;
        *out = jv_undef(name);
        return true;
    default: *out = jv_undef(name); return true;
    }
}

bool epyq_jj_getitem(jrender *r, jv obj, jv key, jv *out) {
    switch (obj.t) {
    case JV_UNDEF: return undefined_error(r, obj);
    case JV_DICT: {
        jv *v = epyq_jj_dict_get(obj.u.d, key);
        if (v) {
            *out = *v;
            return true;
        }
        break;
    }
    case JV_LIST:
        if (is_intlike(key)) {
            int64_t i = as_int(key), n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            *out = i >= 0 && i < n ? obj.u.l->v[i] : jv_undef("list index out of range");
            return true;
        }
        break;
    case JV_STR:
        if (is_intlike(key)) {
            const char *s = obj.u.s.p;
            size_t n = obj.u.s.n;
            int64_t i = as_int(key), len = (int64_t)epyq_jj_utf8_len(s, n);
            if (i < 0) i += len;
            if (i < 0 || i >= len) {
                *out = jv_undef("string index out of range");
                return true;
            }
            size_t a = epyq_jj_utf8_offset(s, n, (size_t)i), b = a;
            epyq_jj_utf8_next(s, n, &b);
            *out = jv_str(s + a, b - a);
            return true;
        }
        break;
    default: break;
    }
    /* jinja2 falls back to the attribute of that name for string keys; anything else that
     * cannot be subscripted (numbers, None, bools) is Undefined, not an error. */
    if (key.t == JV_STR) {
        char *name = epyq_jj_strdup(&r->ar, key.u.s.p, key.u.s.n);
        if (!name) return epyq_jj_nomem(r);
        if (obj.t == JV_DICT) { /* keys were tried already: only methods remain */
            if (epyq_jj_method(r, obj, name, out)) return true;
            if (r->err && r->err->code) return false;
            *out = jv_undef(name);
            return true;
        }
        return epyq_jj_getattr(r, obj, name, out);
    }
    *out = jv_undef("no such item");
    return true;
}

/* ---- operators -------------------------------------------------------------------------- */

static bool repeat(jrender *r, jv seq, int64_t times, jv *out) {
    if (times < 0) times = 0;
    if (seq.t == JV_STR) {
        epyq_sbuf b = {.max = r->max_output};
        for (int64_t i = 0; i < times; i++)
            if (!epyq_sbuf_add(&b, seq.u.s.p, seq.u.s.n) || !epyq_jj_count_step(r)) {
                epyq_sbuf_free(&b);
                return r->err && r->err->code ? false : epyq_jj_nomem(r);
            }
        return epyq_jj_str_from_buf(r, &b, out);
    }
    jlist *l = epyq_jj_list_new(&r->ar, 0);
    if (!l) return epyq_jj_nomem(r);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.u.l->n; k++) {
            if (!epyq_jj_count_step(r)) return false;
            if (!epyq_jj_list_push(&r->ar, l, seq.u.l->v[k])) return epyq_jj_nomem(r);
        }
    *out = make_list(l, seq.tuple);
    return true;
}

static bool int_pow(jrender *r, int64_t b, int64_t e, jv *out) {
    int64_t acc = 1;
    while (e > 0) {
        if ((e & 1) && __builtin_mul_overflow(acc, b, &acc)) return epyq_jj_fail(r, "integer overflow in **");
        e >>= 1;
        if (e && __builtin_mul_overflow(b, b, &b)) return epyq_jj_fail(r, "integer overflow in **");
    }
    *out = jv_int(acc);
    return true;
}

static const char *OPNAMES[] = {"+", "-", "*", "/", "//", "%", "**", "~"};

static bool binary(jrender *r, jop op, jv a, jv b, jv *out) {
    if (op == JOP_CONCAT) {
        epyq_sbuf buf = {.max = r->max_output};
        if (!epyq_jj_to_str(&buf, a) || !epyq_jj_to_str(&buf, b)) {
            epyq_sbuf_free(&buf);
            return epyq_jj_nomem(r);
        }
        return epyq_jj_str_from_buf(r, &buf, out);
    }
    if (a.t == JV_UNDEF) return undefined_error(r, a);
    if (b.t == JV_UNDEF) return undefined_error(r, b);
    if (is_numv(a) && is_numv(b)) {
        bool ints = is_intlike(a) && is_intlike(b);
        int64_t x = ints ? as_int(a) : 0, y = ints ? as_int(b) : 0, z;
        double fx = as_f(a), fy = as_f(b);
        switch (op) {
        case JOP_ADD:
            if (!ints) break;
            if (__builtin_add_overflow(x, y, &z)) return epyq_jj_fail(r, "integer overflow in +");
            *out = jv_int(z);
            return true;
        case JOP_SUB:
            if (!ints) break;
            if (__builtin_sub_overflow(x, y, &z)) return epyq_jj_fail(r, "integer overflow in -");
            *out = jv_int(z);
            return true;
        case JOP_MUL:
            if (!ints) break;
            if (__builtin_mul_overflow(x, y, &z)) return epyq_jj_fail(r, "integer overflow in *");
            *out = jv_int(z);
            return true;
        case JOP_DIV:
            if (fy == 0) return epyq_jj_fail(r, "division by zero");
            *out = jv_float(fx / fy);
            return true;
        case JOP_FLOORDIV:
        case JOP_MOD:
            if (ints) {
                if (y == 0) return epyq_jj_fail(r, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) return epyq_jj_fail(r, "integer overflow in //");
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                *out = jv_int(op == JOP_MOD ? m : q);
                return true;
            }
            if (fy == 0) return epyq_jj_fail(r, "float division by zero");
            if (op == JOP_MOD) {
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
                *out = jv_float(m);
            } else {
                *out = jv_float(floor(fx / fy));
            }
            return true;
        case JOP_POW:
            if (ints && y >= 0) return int_pow(r, x, y, out);
            if (fx == 0 && fy < 0) return epyq_jj_fail(r, "0.0 cannot be raised to a negative power");
            *out = jv_float(pow(fx, fy));
            return true;
        default: break;
        }
        double f = op == JOP_ADD ? fx + fy : op == JOP_SUB ? fx - fy : fx * fy;
        *out = jv_float(f);
        return true;
    }
    if (op == JOP_ADD && a.t == JV_STR && b.t == JV_STR) {
        epyq_sbuf buf = {.max = r->max_output};
        if (!epyq_sbuf_add(&buf, a.u.s.p, a.u.s.n) || !epyq_sbuf_add(&buf, b.u.s.p, b.u.s.n)) {
            epyq_sbuf_free(&buf);
            return epyq_jj_nomem(r);
        }
        return epyq_jj_str_from_buf(r, &buf, out);
    }
    if (op == JOP_ADD && a.t == JV_LIST && b.t == JV_LIST && a.tuple == b.tuple) {
        size_t n;
        if (__builtin_add_overflow(a.u.l->n, b.u.l->n, &n)) return epyq_jj_nomem(r);
        jlist *l = epyq_jj_list_new(&r->ar, n);
        if (!l) return epyq_jj_nomem(r);
        if (a.u.l->n) memcpy(l->v, a.u.l->v, a.u.l->n * sizeof *l->v);
        if (b.u.l->n) memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof *l->v);
        l->n = n;
        *out = make_list(l, a.tuple);
        return true;
    }
    if (op == JOP_MUL && (a.t == JV_STR || a.t == JV_LIST) && is_intlike(b)) return repeat(r, a, as_int(b), out);
    if (op == JOP_MUL && (b.t == JV_STR || b.t == JV_LIST) && is_intlike(a)) return repeat(r, b, as_int(a), out);
    if (op == JOP_MOD && a.t == JV_STR) return epyq_jj_fail(r, "printf-style '%%' string formatting is not supported");
    return epyq_jj_fail(r, "unsupported operand type(s) for %s: '%s' and '%s'", OPNAMES[op], epyq_jj_type_name(a),
                   epyq_jj_type_name(b));
}

static bool contains(jrender *r, jv needle, jv hay, bool *out) {
    switch (hay.t) {
    case JV_UNDEF: *out = false; return true; /* Undefined iterates as empty */
    case JV_STR:
        if (needle.t != JV_STR)
            return epyq_jj_fail(r, "'in <string>' requires string as left operand, not %s", epyq_jj_type_name(needle));
        *out = needle.u.s.n == 0 || memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
        return true;
    case JV_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (epyq_jj_equal(hay.u.l->v[i], needle)) {
                *out = true;
                return true;
            }
        *out = false;
        return true;
    case JV_DICT: *out = epyq_jj_dict_get(hay.u.d, needle) != NULL; return true;
    default: return epyq_jj_fail(r, "argument of type '%s' is not iterable", epyq_jj_type_name(hay));
    }
}

static bool compare_op(jrender *r, jop op, jv a, jv b, bool *out) {
    int c = 0;
    switch (op) {
    case JOP_EQ: *out = epyq_jj_equal(a, b); return true;
    case JOP_NE: *out = !epyq_jj_equal(a, b); return true;
    case JOP_IN: return contains(r, a, b, out);
    case JOP_NOTIN:
        if (!contains(r, a, b, out)) return false;
        *out = !*out;
        return true;
    default: break;
    }
    if (!epyq_jj_compare(r, a, b, &c)) return false;
    /* NaN: every ordering comparison is false in Python. */
    if ((a.t == JV_FLOAT && isnan(a.u.f)) || (b.t == JV_FLOAT && isnan(b.u.f))) {
        *out = false;
        return true;
    }
    *out = op == JOP_LT ? c < 0 : op == JOP_LE ? c <= 0 : op == JOP_GT ? c > 0 : c >= 0;
    return true;
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
        *out = make_list(l, n->kind == JN_TUPLE);
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
        return do_slice(r, v[0], v[1], v[2], v[3], out);
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
        if (v.t == JV_UNDEF) return undefined_error(r, v);
        if (!is_numv(v)) return epyq_jj_fail(r, "bad operand type for unary %s: '%s'", n->kind == JN_NEG ? "-" : "+", epyq_jj_type_name(v));
        if (n->kind == JN_POS) *out = v.t == JV_BOOL ? jv_int(v.u.b) : v;
        else if (v.t == JV_FLOAT) *out = jv_float(-v.u.f);
        else if (as_int(v) == INT64_MIN) return epyq_jj_fail(r, "integer overflow in unary -");
        else *out = jv_int(-as_int(v));
        return true;
    }
    case JN_BIN: {
        jv a, b;
        if (!epyq_jj_eval(r, sc, n->kids[0], &a) || !epyq_jj_eval(r, sc, n->kids[1], &b)) return false;
        r->at = n;
        return binary(r, (jop)n->op, a, b, out);
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
            if (!compare_op(r, (jop)n->ops[i - 1], a, b, &ok)) return false;
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
    case JV_UNDEF: return undefined_error(r, fn);
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
