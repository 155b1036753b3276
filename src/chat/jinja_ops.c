/* src/chat/jinja_ops.c — what the evaluator does to values: slicing, jinja2's getattr/getitem
 * rules (loop.*, attributes that fall back to items and methods), Python's arithmetic and
 * comparison operators with their TypeErrors, `in`. jinja_eval.c walks the AST and calls these. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_int.h"

bool epyq_jj_undefined_error(jrender *r, jv u) {
    return epyq_jj_fail(r, "'%.*s' is undefined", (int)u.u.s.n, u.u.s.p ? u.u.s.p : "value");
}

/* Python's slice index normalisation (PySlice_AdjustIndices). */
static bool slice_indices(jrender *r, jv start, jv stop, jv step, int64_t len, int64_t *s0,
                          int64_t *s1, int64_t *st, int64_t *count) {
    int64_t stp = 1;
    if (step.t != JV_NONE && step.t != JV_UNDEF) {
        if (!jv_is_intlike(step)) return epyq_jj_fail(r, "slice indices must be integers or None");
        stp = jv_as_int(step);
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
        if (!jv_is_intlike(e)) return epyq_jj_fail(r, "slice indices must be integers or None");
        int64_t x = jv_as_int(e);
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

bool epyq_jj_slice(jrender *r, jv obj, jv a, jv b, jv c, jv *out) {
    if (obj.t == JV_UNDEF) return epyq_jj_undefined_error(r, obj);
    if (obj.t == JV_LIST) {
        int64_t s0, s1, st, cnt;
        if (!slice_indices(r, a, b, c, (int64_t)obj.u.l->n, &s0, &s1, &st, &cnt)) return false;
        jlist *l = epyq_jj_list_new(&r->ar, (size_t)cnt);
        if (!l) return epyq_jj_nomem(r);
        for (int64_t i = 0, k = s0; i < cnt; i++, k += st) l->v[l->n++] = obj.u.l->v[k];
        *out = jv_list(l, obj.tuple);
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
    else if (!strcmp(name, "index0"))
        *out = jv_int((int64_t)i);
    else if (!strcmp(name, "revindex"))
        *out = jv_int((int64_t)(n - i));
    else if (!strcmp(name, "revindex0"))
        *out = jv_int((int64_t)(n - i - 1));
    else if (!strcmp(name, "first"))
        *out = jv_bool(i == 0);
    else if (!strcmp(name, "last"))
        *out = jv_bool(i + 1 == n);
    else if (!strcmp(name, "length"))
        *out = jv_int((int64_t)n);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? lp->items->v[i - 1] : jv_undef("there is no previous item");
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < n ? lp->items->v[i + 1] : jv_undef("there is no next item");
    else if (!strcmp(name, "depth") || !strcmp(name, "depth0")) {
        int64_t d = 1;
        for (jloop *o = lp->outer; o; o = o->outer) d++;
        *out = jv_int(name[5] ? d - 1 : d);
    } else if (!strcmp(name, "cycle")) {
        jv self = {.t = JV_LOOP, .u.loop = lp};
        return epyq_jj_method(r, self, name, out);
    } else
        *out = jv_undef(name);
    return true;
}

bool epyq_jj_getattr(jrender *r, jv obj, const char *name, jv *out) {
    size_t nl = strlen(name);
    switch (obj.t) {
    case JV_UNDEF: return epyq_jj_undefined_error(r, obj);
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
    case JV_UNDEF: return epyq_jj_undefined_error(r, obj);
    case JV_DICT: {
        jv *v = epyq_jj_dict_get(obj.u.d, key);
        if (v) {
            *out = *v;
            return true;
        }
        break;
    }
    case JV_LIST:
        if (jv_is_intlike(key)) {
            int64_t i = jv_as_int(key), n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            *out = i >= 0 && i < n ? obj.u.l->v[i] : jv_undef("list index out of range");
            return true;
        }
        break;
    case JV_STR:
        if (jv_is_intlike(key)) {
            const char *s = obj.u.s.p;
            size_t n = obj.u.s.n;
            int64_t i = jv_as_int(key), len = (int64_t)epyq_jj_utf8_len(s, n);
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
    *out = jv_list(l, seq.tuple);
    return true;
}

static bool int_pow(jrender *r, int64_t b, int64_t e, jv *out) {
    int64_t acc = 1;
    while (e > 0) {
        if ((e & 1) && __builtin_mul_overflow(acc, b, &acc))
            return epyq_jj_fail(r, "integer overflow in **");
        e >>= 1;
        if (e && __builtin_mul_overflow(b, b, &b)) return epyq_jj_fail(r, "integer overflow in **");
    }
    *out = jv_int(acc);
    return true;
}

static const char *OPNAMES[] = {"+", "-", "*", "/", "//", "%", "**", "~"};

bool epyq_jj_binary(jrender *r, jop op, jv a, jv b, jv *out) {
    if (op == JOP_CONCAT) {
        epyq_sbuf buf = {.max = r->max_output};
        if (!epyq_jj_to_str(&buf, a) || !epyq_jj_to_str(&buf, b)) {
            epyq_sbuf_free(&buf);
            return epyq_jj_nomem(r);
        }
        return epyq_jj_str_from_buf(r, &buf, out);
    }
    if (a.t == JV_UNDEF) return epyq_jj_undefined_error(r, a);
    if (b.t == JV_UNDEF) return epyq_jj_undefined_error(r, b);
    if (jv_is_num(a) && jv_is_num(b)) {
        bool ints = jv_is_intlike(a) && jv_is_intlike(b);
        int64_t x = ints ? jv_as_int(a) : 0, y = ints ? jv_as_int(b) : 0, z;
        double fx = jv_as_f(a), fy = jv_as_f(b);
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
            if (fx == 0 && fy < 0)
                return epyq_jj_fail(r, "0.0 cannot be raised to a negative power");
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
        *out = jv_list(l, a.tuple);
        return true;
    }
    if (op == JOP_MUL && (a.t == JV_STR || a.t == JV_LIST) && jv_is_intlike(b))
        return repeat(r, a, jv_as_int(b), out);
    if (op == JOP_MUL && (b.t == JV_STR || b.t == JV_LIST) && jv_is_intlike(a))
        return repeat(r, b, jv_as_int(a), out);
    if (op == JOP_MOD && a.t == JV_STR)
        return epyq_jj_fail(r, "printf-style '%%' string formatting is not supported");
    return epyq_jj_fail(r, "unsupported operand type(s) for %s: '%s' and '%s'", OPNAMES[op],
                        epyq_jj_type_name(a), epyq_jj_type_name(b));
}

static bool contains(jrender *r, jv needle, jv hay, bool *out) {
    switch (hay.t) {
    case JV_UNDEF: *out = false; return true; /* Undefined iterates as empty */
    case JV_STR:
        if (needle.t != JV_STR)
            return epyq_jj_fail(r, "'in <string>' requires string as left operand, not %s",
                                epyq_jj_type_name(needle));
        *out =
            needle.u.s.n == 0 || memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
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
    default:
        return epyq_jj_fail(r, "argument of type '%s' is not iterable", epyq_jj_type_name(hay));
    }
}

bool epyq_jj_compare_op(jrender *r, jop op, jv a, jv b, bool *out) {
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
