/* src/chat/jinja_filters.c — jinja2's built-in filters (the ones chat templates use), with
 * transformers' tojson; the tests are in jinja_tests.c. Names are resolved when the template is
 * parsed, so an unknown filter is a parse error with its position, as in jinja2. Each filter is
 * one function; FILTERS at the end maps names (aliases included) to them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "chat/jinja_int.h"

/* One filter call: args[0] is the subject, then the template's arguments (names[i] non-NULL for
 * name=value ones); mode tells apart the filters that share a function (see FILTERS). */
typedef struct {
    jrender *r;
    jscope *sc;
    int mode;
    const jv *args;
    const char *const *names;
    size_t nargs;
} fcall;

enum { SEL_KEEP = 1, SEL_ATTR = 2 };                           /* f_select's mode bits */
enum { AGG_SORT, AGG_UNIQUE, AGG_MIN, AGG_MAX, AGG_DICTSORT }; /* f_aggregate's modes */

/* Argument `pos` (0 = first after the subject) or keyword `kw`; dflt when absent. */
static jv arg(const fcall *fc, size_t pos, const char *kw, jv dflt) {
    const char *const *names = fc->names;
    size_t p = 0;
    for (size_t i = 1; i < fc->nargs; i++) {
        if (names && names[i]) {
            if (kw && !strcmp(names[i], kw)) return fc->args[i];
        } else if (p++ == pos) {
            return fc->args[i];
        }
    }
    return dflt;
}

/* Case mapping one code point at a time with utf8proc (Python also does multi-char maps). */
bool epyq_jj_map_case(jrender *r, jv s, int mode, jv *out) {
    epyq_sbuf b = {.max = r->max_output};
    size_t i = 0, n = s.u.s.n;
    bool word_start = true, first = true;
    while (i < n) {
        size_t a = i;
        uint32_t c = epyq_jj_utf8_next(s.u.s.p, n, &i);
        bool valid = i - a > 1 || c < 0x80;
        int32_t m = (int32_t)c;
        if (valid) {
            bool up = mode == JJ_CASE_UPPER || (mode == JJ_CASE_CAPITALIZE && first) ||
                      (mode == JJ_CASE_TITLE && word_start);
            m = up ? utf8proc_toupper((int32_t)c) : utf8proc_tolower((int32_t)c);
        }
        if (mode == JJ_CASE_TITLE) /* jinja2 splits words at whitespace and -([{< */
            word_start = epyq_jj_py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        first = false;
        bool ok;
        if (!valid) {
            ok = epyq_sbuf_add(&b, s.u.s.p + a, i - a);
        } else {
            utf8proc_uint8_t u[4];
            utf8proc_ssize_t k = utf8proc_encode_char(m, u);
            ok = epyq_sbuf_add(&b, u, (size_t)k);
        }
        if (!ok) {
            epyq_sbuf_free(&b);
            return epyq_jj_nomem(r);
        }
    }
    return epyq_jj_str_from_buf(r, &b, out);
}

static bool length_of(jrender *r, jv v, int64_t *n) {
    switch (v.t) {
    case JV_UNDEF: *n = 0; return true;
    case JV_STR: *n = (int64_t)epyq_jj_utf8_len(v.u.s.p, v.u.s.n); return true;
    case JV_LIST: *n = (int64_t)v.u.l->n; return true;
    case JV_DICT: *n = (int64_t)v.u.d->n; return true;
    default: return epyq_jj_fail(r, "object of type '%s' has no len()", epyq_jj_type_name(v));
    }
}

/* attribute="a.b.0" lookups, as jinja2's make_attrgetter. */
static bool get_path(jrender *r, jv obj, jv path, jv *out) {
    if (path.t == JV_INT) return epyq_jj_getitem(r, obj, path, out);
    if (path.t != JV_STR) return epyq_jj_fail(r, "attribute must be a string");
    const char *p = path.u.s.p, *end = p + path.u.s.n;
    *out = obj;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t n = dot ? (size_t)(dot - p) : (size_t)(end - p);
        jv key = jv_str(p, n);
        bool digits = n > 0;
        int64_t idx = 0;
        for (size_t i = 0; i < n; i++) {
            if (p[i] < '0' || p[i] > '9' || idx > INT64_MAX / 10 - 10) {
                digits = false;
                break;
            }
            idx = idx * 10 + (p[i] - '0');
        }
        if (digits) key = jv_int(idx);
        if (!epyq_jj_getitem(r, *out, key, out)) return false;
        if (!dot) break;
        p = dot + 1;
    }
    return true;
}

static bool cmp_for_sort(jrender *r, jv a, jv b, bool case_sensitive, int *c) {
    if (!case_sensitive && a.t == JV_STR && b.t == JV_STR) {
        jv la, lb;
        if (!epyq_jj_map_case(r, a, JJ_CASE_LOWER, &la) ||
            !epyq_jj_map_case(r, b, JJ_CASE_LOWER, &lb))
            return false;
        return epyq_jj_compare(r, la, lb, c);
    }
    return epyq_jj_compare(r, a, b, c);
}

/* Stable insertion sort of items by keys (small lists; every comparison counts a step). */
static bool sort_by(jrender *r, jv *items, jv *keys, size_t n, bool case_sensitive, bool reverse) {
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            int c;
            if (!epyq_jj_count_step(r) || !cmp_for_sort(r, keys[j - 1], keys[j], case_sensitive, &c)) return false;
            if (reverse ? c >= 0 : c <= 0) break;
            jv t = items[j];
            items[j] = items[j - 1];
            items[j - 1] = t;
            t = keys[j];
            keys[j] = keys[j - 1];
            keys[j - 1] = t;
        }
    return true;
}

static bool copy_list(jrender *r, jv v, jlist **out) {
    jlist *src;
    if (!epyq_jj_iter_list(r, v, &src)) return false;
    *out = epyq_jj_list_new(&r->ar, src->n);
    if (!*out) return epyq_jj_nomem(r);
    if (src->n) memcpy((*out)->v, src->v, src->n * sizeof *src->v);
    (*out)->n = src->n;
    return true;
}

/* select, reject, selectattr, rejectattr (fc->mode: SEL_* bits): keep the items whose test
 * (default: truthiness) is SEL_KEEP, testing the item itself or, with SEL_ATTR, its attribute. */
static bool f_select(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    const jv *args = fc->args;
    size_t nargs = fc->nargs;
    bool by_attr = fc->mode & SEL_ATTR, keep = fc->mode & SEL_KEEP;
    jlist *src;
    if (!epyq_jj_truthy(args[0])) { /* jinja2: `if value:` before iterating, so 0/None give [] */
        *out = jv_list(epyq_jj_list_new(&r->ar, 0), false);
        return out->u.l ? true : epyq_jj_nomem(r);
    }
    if (!epyq_jj_iter_list(r, args[0], &src)) return false;
    size_t first_test_arg = by_attr ? 2 : 1;
    int tid = -1;
    if (nargs > first_test_arg) {
        jv tn = args[first_test_arg];
        if (tn.t != JV_STR) return epyq_jj_fail(r, "test name must be a string");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)tn.u.s.n, tn.u.s.p);
        tid = epyq_jj_test_id(name);
        if (tid < 0) return epyq_jj_fail(r, "no test named '%s'", name);
    }
    jlist *l = epyq_jj_list_new(&r->ar, 0);
    if (!l) return epyq_jj_nomem(r);
    size_t ntargs = nargs > first_test_arg ? nargs - first_test_arg : 1;
    jv *targs = epyq_jj_alloc_array(&r->ar, ntargs, sizeof *targs);
    if (!targs) return epyq_jj_nomem(r);
    for (size_t i = 0; i < src->n; i++) {
        if (!epyq_jj_count_step(r)) return false;
        jv subject = src->v[i];
        if (by_attr && !get_path(r, subject, nargs > 1 ? args[1] : jv_undef("attribute"), &subject)) return false;
        bool b;
        if (tid < 0) {
            b = epyq_jj_truthy(subject);
        } else {
            targs[0] = subject;
            for (size_t k = 1; k < ntargs; k++) targs[k] = args[first_test_arg + k];
            if (!epyq_jj_apply_test(r, tid, targs, ntargs, &b)) return false;
        }
        if (b == keep && !epyq_jj_list_push(&r->ar, l, src->v[i])) return epyq_jj_nomem(r);
    }
    *out = jv_list(l, false);
    return true;
}

static bool f_map(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    const jv *args = fc->args;
    const char *const *names = fc->names;
    size_t nargs = fc->nargs;
    jlist *src;
    if (!epyq_jj_truthy(args[0])) { /* as select: a falsy value maps to nothing */
        *out = jv_list(epyq_jj_list_new(&r->ar, 0), false);
        return out->u.l ? true : epyq_jj_nomem(r);
    }
    if (!epyq_jj_iter_list(r, args[0], &src)) return false;
    jv attr = arg(fc, 99, "attribute", jv_undef(NULL));
    jv dflt = arg(fc, 99, "default", jv_undef(NULL));
    int fid = -1;
    if (attr.t == JV_UNDEF) {
        jv fname = arg(fc, 0, NULL, jv_undef(NULL));
        if (fname.t != JV_STR) return epyq_jj_fail(r, "map needs a filter name or attribute=");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)fname.u.s.n, fname.u.s.p);
        fid = epyq_jj_filter_id(name);
        if (fid < 0) return epyq_jj_fail(r, "no filter named '%s'", name);
    }
    jlist *l = epyq_jj_list_new(&r->ar, src->n);
    if (!l) return epyq_jj_nomem(r);
    /* Arguments for the mapped filter: the item, then map's positional args after the name. */
    jv *fargs = epyq_jj_alloc_array(&r->ar, nargs + 1, sizeof *fargs);
    const char **fnames = epyq_jj_alloc_array(&r->ar, nargs + 1, sizeof *fnames);
    if (!fargs || !fnames) return epyq_jj_nomem(r);
    size_t nf = 1;
    for (size_t i = 2; i < nargs; i++) {
        fargs[nf] = args[i];
        fnames[nf++] = names ? names[i] : NULL;
    }
    for (size_t i = 0; i < src->n; i++) {
        if (!epyq_jj_count_step(r)) return false;
        jv v;
        if (fid >= 0) {
            fargs[0] = src->v[i];
            if (!epyq_jj_apply_filter(r, fc->sc, fid, fargs, fnames, nf, &v)) return false;
        } else {
            if (!get_path(r, src->v[i], attr, &v)) return false;
            if (v.t == JV_UNDEF && dflt.t != JV_UNDEF) v = dflt;
        }
        l->v[l->n++] = v;
    }
    *out = jv_list(l, false);
    return true;
}

static bool do_indent(jrender *r, jv s, jv width, bool first, bool blank, jv *out) {
    epyq_sbuf ind = {0};
    bool ok = true;
    if (width.t == JV_STR) ok = epyq_sbuf_add(&ind, width.u.s.p, width.u.s.n);
    else
        for (int64_t i = 0; ok && i < (width.t == JV_INT ? width.u.i : 4) && i < 4096; i++) ok = epyq_sbuf_addc(&ind, ' ');
    /* jinja2: lines = (s + "\n").splitlines(); the first line is kept as is, the others get
     * the indent (empty ones only when blank), joined by "\n". Line breaks: \n, \r\n, \r. */
    epyq_sbuf b = {.max = r->max_output};
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    if (first && ok) ok = epyq_sbuf_add(&b, ind.p, ind.len);
    for (bool first_line = true; ok; first_line = false) {
        const char *nl = p;
        while (nl < end && *nl != '\n' && *nl != '\r') nl++;
        size_t n = (size_t)(nl - p);
        if (!first_line) {
            ok = epyq_sbuf_addc(&b, '\n');
            if (ok && (n || blank)) ok = epyq_sbuf_add(&b, ind.p, ind.len);
        }
        ok = ok && epyq_sbuf_add(&b, p, n);
        if (nl >= end) break; /* the appended "\n" ends this last line */
        p = nl + (nl + 1 < end && nl[0] == '\r' && nl[1] == '\n' ? 2 : 1);
    }
    epyq_sbuf_free(&ind);
    if (!ok) {
        epyq_sbuf_free(&b);
        return epyq_jj_nomem(r);
    }
    return epyq_jj_str_from_buf(r, &b, out);
}

static bool parse_int_str(jv s, int64_t *out) {
    /* Python int(str): optional whitespace and sign, digits with single underscores. */
    jv t = epyq_jj_str_strip(s, NULL, 0, 3);
    const char *p = t.u.s.p;
    size_t n = t.u.s.n, i = 0;
    bool neg = false;
    if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
    if (i == n) return false;
    int64_t v = 0;
    for (; i < n; i++) {
        if (p[i] == '_' && i + 1 < n && p[i + 1] != '_' && i > 0 && p[i - 1] >= '0' && p[i - 1] <= '9') continue;
        if (p[i] < '0' || p[i] > '9') return false;
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, p[i] - '0', &v)) return false;
    }
    *out = neg ? -v : v;
    return true;
}

static bool parse_float_str(jv s, double *out) {
    jv t = epyq_jj_str_strip(s, NULL, 0, 3);
    char buf[128];
    if (!t.u.s.n || t.u.s.n >= sizeof buf) return false;
    memcpy(buf, t.u.s.p, t.u.s.n);
    buf[t.u.s.n] = '\0';
    char *end;
    *out = strtod(buf, &end);
    return *end == '\0';
}

/* length, count */
static bool f_length(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    int64_t n = 0;
    if (!length_of(r, v, &n)) return false;
    *out = jv_int(n);
    return true;
}

/* default */
static bool f_default(const fcall *fc, jv *out) {
    jv v = fc->args[0];
    jv d = arg(fc, 0, "default_value", jv_str("", 0));
    bool boolean = epyq_jj_truthy(arg(fc, 1, "boolean", jv_bool(false)));
    *out = v.t == JV_UNDEF || (boolean && !epyq_jj_truthy(v)) ? d : v;
    return true;
}

/* trim */
static bool f_trim(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    jv chars = arg(fc, 0, "chars", jv_none());
    jv s;
    if (!epyq_jj_stringify(r, v, &s)) return false;
    if (chars.t == JV_STR) *out = epyq_jj_str_strip(s, chars.u.s.p, chars.u.s.n, 3);
    else
        *out = epyq_jj_str_strip(s, NULL, 0, 3);
    return true;
}

/* tojson */
static bool f_tojson(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    jv ind = arg(fc, 0, "indent", jv_none());
    if (epyq_jj_truthy(arg(fc, 99, "ensure_ascii", jv_bool(false))))
        return epyq_jj_fail(r, "tojson(ensure_ascii=true) is not supported");
    if (arg(fc, 99, "separators", jv_none()).t != JV_NONE)
        return epyq_jj_fail(r, "tojson(separators=...) is not supported");
    bool sort_keys = epyq_jj_truthy(arg(fc, 99, "sort_keys", jv_bool(false)));
    if (ind.t != JV_NONE && ind.t != JV_INT)
        return epyq_jj_fail(r, "tojson indent must be an integer");
    int indent = ind.t == JV_INT ? (ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : (int)ind.u.i) : -1;
    epyq_sbuf b = {.max = r->max_output};
    if (!epyq_jj_tojson(r, &b, v, indent, sort_keys)) {
        epyq_sbuf_free(&b);
        return false;
    }
    return epyq_jj_str_from_buf(r, &b, out);
}

/* items */
static bool f_items(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    if (v.t == JV_UNDEF) {
        jlist *l = epyq_jj_list_new(&r->ar, 0);
        if (!l) return epyq_jj_nomem(r);
        *out = jv_list(l, false);
        return true;
    }
    if (v.t != JV_DICT && v.t != JV_NS)
        return epyq_jj_fail(r, "Can only get item pairs from a mapping.");
    jlist *l = epyq_jj_list_new(&r->ar, v.u.d->n);
    if (!l) return epyq_jj_nomem(r);
    for (size_t i = 0; i < v.u.d->n; i++) {
        jlist *pair = epyq_jj_list_new(&r->ar, 2);
        if (!pair) return epyq_jj_nomem(r);
        pair->v[0] = v.u.d->k[i];
        pair->v[1] = v.u.d->v[i];
        pair->n = 2;
        l->v[l->n++] = (jv){.t = JV_LIST, .tuple = 1, .u.l = pair};
    }
    *out = jv_list(l, false);
    return true;
}

/* join */
static bool f_join(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    jv sep = arg(fc, 0, "d", jv_str("", 0));
    jv attr = arg(fc, 1, "attribute", jv_undef(NULL));
    jlist *l;
    if (!epyq_jj_iter_list(r, v, &l)) return false;
    epyq_sbuf b = {.max = r->max_output};
    for (size_t i = 0; i < l->n; i++) {
        jv item = l->v[i];
        if (attr.t != JV_UNDEF && !get_path(r, item, attr, &item)) {
            epyq_sbuf_free(&b);
            return false;
        }
        if ((i && !epyq_jj_to_str(&b, sep)) || !epyq_jj_to_str(&b, item)) {
            epyq_sbuf_free(&b);
            return epyq_jj_nomem(r);
        }
    }
    return epyq_jj_str_from_buf(r, &b, out);
}

/* upper, lower, capitalize, title (fc->mode: JJ_CASE_*) */
static bool f_case(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    jv s;
    if (!epyq_jj_stringify(r, v, &s)) return false;
    return epyq_jj_map_case(r, s, fc->mode, out);
}

/* replace */
static bool f_replace(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    jv s, old = arg(fc, 0, "old", jv_undef("old")), new = arg(fc, 1, "new", jv_undef("new"));
    jv cnt = arg(fc, 2, "count", jv_none());
    if (!epyq_jj_stringify(r, v, &s) || !epyq_jj_stringify(r, old, &old) ||
        !epyq_jj_stringify(r, new, &new))
        return false;
    jv fn;
    if (!epyq_jj_method(r, s, "replace", &fn)) return epyq_jj_fail(r, "replace is unavailable");
    jv margs[3] = {old, new, cnt.t == JV_INT ? cnt : jv_int(-1)};
    return epyq_jj_call_builtin(r, fn.u.fn, margs, NULL, 3, out);
}

/* first, last (fc->mode: 0 first, 1 last) */
static bool f_first_last(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    jlist *l;
    if (!epyq_jj_iter_list(r, v, &l)) return false;
    if (!l->n)
        *out = jv_undef(fc->mode == 0 ? "No first item, sequence was empty."
                                      : "No last item, sequence was empty.");
    else
        *out = l->v[fc->mode == 0 ? 0 : l->n - 1];
    return true;
}

/* list */
static bool f_list(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    jlist *l;
    if (!copy_list(r, v, &l)) return false;
    *out = jv_list(l, false);
    return true;
}

/* reverse */
static bool f_reverse(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    if (v.t == JV_STR) {
        jlist *chars;
        if (!epyq_jj_iter_list(r, v, &chars)) return false;
        epyq_sbuf b = {.max = r->max_output};
        for (size_t i = chars->n; i-- > 0;)
            if (!epyq_sbuf_add(&b, chars->v[i].u.s.p, chars->v[i].u.s.n)) {
                epyq_sbuf_free(&b);
                return epyq_jj_nomem(r);
            }
        return epyq_jj_str_from_buf(r, &b, out);
    }
    jlist *l;
    if (!copy_list(r, v, &l)) return false;
    for (size_t i = 0; i < l->n / 2; i++) {
        jv t = l->v[i];
        l->v[i] = l->v[l->n - 1 - i];
        l->v[l->n - 1 - i] = t;
    }
    *out = jv_list(l, false);
    return true;
}

/* abs */
static bool f_abs(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    if (v.t == JV_INT) {
        if (v.u.i == INT64_MIN) return epyq_jj_fail(r, "integer overflow in abs");
        *out = jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
    } else if (v.t == JV_FLOAT)
        *out = jv_float(fabs(v.u.f));
    else if (v.t == JV_BOOL)
        *out = jv_int(v.u.b);
    else
        return epyq_jj_fail(r, "bad operand type for abs(): '%s'", epyq_jj_type_name(v));
    return true;
}

/* int */
static bool f_int(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    jv d = arg(fc, 0, "default", jv_int(0));
    if (v.t == JV_UNDEF) /* int(Undefined) raises in jinja2 */
        return epyq_jj_fail(r, "'%.*s' is undefined", (int)v.u.s.n, v.u.s.p ? v.u.s.p : "value");
    int64_t i;
    double f;
    if (v.t == JV_INT) *out = v;
    else if (v.t == JV_BOOL)
        *out = jv_int(v.u.b);
    else if (v.t == JV_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18)
        *out = jv_int((int64_t)v.u.f);
    else if (v.t == JV_STR && parse_int_str(v, &i))
        *out = jv_int(i);
    else if (v.t == JV_STR && parse_float_str(v, &f) && isfinite(f) && fabs(f) < 9.2e18)
        *out = jv_int((int64_t)f);
    else
        *out = d;
    return true;
}

/* float */
static bool f_float(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    jv d = arg(fc, 0, "default", jv_float(0.0));
    if (v.t == JV_UNDEF)
        return epyq_jj_fail(r, "'%.*s' is undefined", (int)v.u.s.n, v.u.s.p ? v.u.s.p : "value");
    double f;
    if (v.t == JV_FLOAT) *out = v;
    else if (v.t == JV_INT || v.t == JV_BOOL)
        *out = jv_float(v.t == JV_INT ? (double)v.u.i : v.u.b);
    else if (v.t == JV_STR && parse_float_str(v, &f))
        *out = jv_float(f);
    else
        *out = d;
    return true;
}

/* round */
static bool f_round(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    jv prec = arg(fc, 0, "precision", jv_int(0));
    jv method = arg(fc, 1, "method", jv_str("common", 6));
    if (v.t != JV_INT && v.t != JV_FLOAT && v.t != JV_BOOL)
        return epyq_jj_fail(r, "round expects a number");
    double x = v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : v.u.b;
    int64_t p = prec.t == JV_INT ? prec.u.i : 0;
    if (p < -300 || p > 300) p = p < 0 ? -300 : 300;
    double scale = pow(10.0, (double)p);
    if (method.t == JV_STR && method.u.s.n == 4 && !memcmp(method.u.s.p, "ceil", 4))
        x = ceil(x * scale) / scale;
    else if (method.t == JV_STR && method.u.s.n == 5 && !memcmp(method.u.s.p, "floor", 5))
        x = floor(x * scale) / scale;
    else if (p >= 0 && p <= 17) {
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)p, x); /* round-half-even on the exact value */
        x = strtod(buf, NULL);
    } else
        x = nearbyint(x * scale) / scale;
    *out = jv_float(x);
    return true;
}

/* escape */
static bool f_escape(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    jv s;
    if (!epyq_jj_stringify(r, v, &s)) return false;
    epyq_sbuf b = {.max = r->max_output};
    bool ok = true;
    for (size_t i = 0; ok && i < s.u.s.n; i++) {
        char c = s.u.s.p[i];
        ok = c == '&'    ? epyq_sbuf_adds(&b, "&amp;")
             : c == '<'  ? epyq_sbuf_adds(&b, "&lt;")
             : c == '>'  ? epyq_sbuf_adds(&b, "&gt;")
             : c == '"'  ? epyq_sbuf_adds(&b, "&#34;")
             : c == '\'' ? epyq_sbuf_adds(&b, "&#39;")
                         : epyq_sbuf_addc(&b, c);
    }
    if (!ok) {
        epyq_sbuf_free(&b);
        return epyq_jj_nomem(r);
    }
    return epyq_jj_str_from_buf(r, &b, out);
}

/* wordcount */
static bool f_wordcount(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    jv s;
    if (!epyq_jj_stringify(r, v, &s)) return false;
    int64_t words = 0;
    bool in = false;
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.p[i];
        bool w = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 c == '_' || (unsigned char)c >= 0x80;
        if (w && !in) words++;
        in = w;
    }
    *out = jv_int(words);
    return true;
}

/* indent */
static bool f_indent(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    /* jinja2 appends "\n" to the value itself: only strings work. */
    if (v.t != JV_STR)
        return epyq_jj_fail(r, "unsupported operand type(s) for +=: '%s' and 'str'",
                            epyq_jj_type_name(v));
    return do_indent(r, v, arg(fc, 0, "width", jv_int(4)),
                     epyq_jj_truthy(arg(fc, 1, "first", jv_bool(false))),
                     epyq_jj_truthy(arg(fc, 2, "blank", jv_bool(false))), out);
}

/* sort, unique, min, max, dictsort (fc->mode: AGG_*): one body, since all five read the
 * items, pick each one's key (attribute= or the dictsort column) and compare keys the same way. */
static bool f_aggregate(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    int kind = fc->mode;
    bool dictsort = kind == AGG_DICTSORT;
    bool reverse = kind == AGG_SORT || dictsort
                       ? epyq_jj_truthy(arg(fc, dictsort ? 2 : 0, "reverse", jv_bool(false)))
                       : false;
    bool cs = epyq_jj_truthy(arg(fc, kind == AGG_SORT ? 1 : 0, "case_sensitive", jv_bool(false)));
    jv attr = kind == AGG_SORT ? arg(fc, 2, "attribute", jv_undef(NULL))
              : dictsort       ? jv_undef(NULL)
                               : arg(fc, 1, "attribute", jv_undef(NULL));
    jlist *l;
    if (dictsort) {
        if (v.t != JV_DICT) return epyq_jj_fail(r, "dictsort expects a mapping");
        jv by = arg(fc, 1, "by", jv_str("key", 3));
        if (!f_items(&(fcall){.r = r, .args = &v, .nargs = 1}, out)) return false;
        l = out->u.l;
        attr = jv_int(by.t == JV_STR && by.u.s.n == 5 && !memcmp(by.u.s.p, "value", 5) ? 1 : 0);
    } else if (!copy_list(r, v, &l)) {
        return false;
    }
    jv *keys = epyq_jj_alloc_array(&r->ar, l->n ? l->n : 1, sizeof *keys);
    if (!keys) return epyq_jj_nomem(r);
    for (size_t i = 0; i < l->n; i++) {
        keys[i] = l->v[i];
        if (attr.t != JV_UNDEF && !get_path(r, l->v[i], attr, &keys[i])) return false;
    }
    if (kind == AGG_UNIQUE) {
        jlist *u = epyq_jj_list_new(&r->ar, l->n);
        jv *seen = epyq_jj_alloc_array(&r->ar, l->n ? l->n : 1, sizeof *seen);
        if (!u || !seen) return epyq_jj_nomem(r);
        size_t ns = 0;
        for (size_t i = 0; i < l->n; i++) {
            jv k = keys[i];
            if (!cs && k.t == JV_STR && !epyq_jj_map_case(r, k, JJ_CASE_LOWER, &k)) return false;
            bool dup = false;
            for (size_t j = 0; j < ns && !dup; j++) dup = epyq_jj_equal(seen[j], k);
            if (!epyq_jj_count_step(r)) return false;
            if (!dup) {
                seen[ns++] = k;
                u->v[u->n++] = l->v[i];
            }
        }
        *out = jv_list(u, false);
        return true;
    }
    if (kind == AGG_MIN || kind == AGG_MAX) {
        if (!l->n) {
            *out = jv_undef("No aggregated item, sequence was empty.");
            return true;
        }
        size_t best = 0;
        for (size_t i = 1; i < l->n; i++) {
            int c;
            if (!cmp_for_sort(r, keys[i], keys[best], cs, &c)) return false;
            if (kind == AGG_MIN ? c < 0 : c > 0) best = i;
        }
        *out = l->v[best];
        return true;
    }
    if (!sort_by(r, l->v, keys, l->n, cs, reverse)) return false;
    *out = jv_list(l, false);
    return true;
}

/* sum */
static bool f_sum(const fcall *fc, jv *out) {
    jrender *r = fc->r;
    jv v = fc->args[0];
    jv attr = arg(fc, 0, "attribute", jv_undef(NULL));
    jv acc = arg(fc, 1, "start", jv_int(0));
    jlist *l;
    if (!epyq_jj_iter_list(r, v, &l)) return false;
    for (size_t i = 0; i < l->n; i++) {
        jv item = l->v[i];
        if (attr.t != JV_UNDEF && !get_path(r, item, attr, &item)) return false;
        if (acc.t == JV_INT && item.t == JV_INT) {
            if (__builtin_add_overflow(acc.u.i, item.u.i, &acc.u.i))
                return epyq_jj_fail(r, "integer overflow in sum");
        } else if ((acc.t == JV_INT || acc.t == JV_FLOAT) &&
                   (item.t == JV_INT || item.t == JV_FLOAT)) {
            acc = jv_float((acc.t == JV_INT ? (double)acc.u.i : acc.u.f) +
                           (item.t == JV_INT ? (double)item.u.i : item.u.f));
        } else {
            return epyq_jj_fail(r, "unsupported operand type(s) for +: '%s' and '%s'",
                                epyq_jj_type_name(acc), epyq_jj_type_name(item));
        }
    }
    *out = acc;
    return true;
}

/* safe, string: str(v) (safe would be Markup(str(v)); autoescape is off) */
static bool f_string(const fcall *fc, jv *out) {
    return epyq_jj_stringify(fc->r, fc->args[0], out);
}

static const struct {
    const char *name;
    bool (*fn)(const fcall *fc, jv *out);
    int mode;
} FILTERS[] = {
    {"abs", f_abs, 0},
    {"capitalize", f_case, JJ_CASE_CAPITALIZE},
    {"count", f_length, 0},
    {"d", f_default, 0},
    {"default", f_default, 0},
    {"dictsort", f_aggregate, AGG_DICTSORT},
    {"e", f_escape, 0},
    {"escape", f_escape, 0},
    {"first", f_first_last, 0},
    {"float", f_float, 0},
    {"indent", f_indent, 0},
    {"int", f_int, 0},
    {"items", f_items, 0},
    {"join", f_join, 0},
    {"last", f_first_last, 1},
    {"length", f_length, 0},
    {"list", f_list, 0},
    {"lower", f_case, JJ_CASE_LOWER},
    {"map", f_map, 0},
    {"max", f_aggregate, AGG_MAX},
    {"min", f_aggregate, AGG_MIN},
    {"reject", f_select, 0},
    {"rejectattr", f_select, SEL_ATTR},
    {"replace", f_replace, 0},
    {"reverse", f_reverse, 0},
    {"round", f_round, 0},
    {"safe", f_string, 0},
    {"select", f_select, SEL_KEEP},
    {"selectattr", f_select, SEL_ATTR | SEL_KEEP},
    {"sort", f_aggregate, AGG_SORT},
    {"string", f_string, 0},
    {"sum", f_sum, 0},
    {"title", f_case, JJ_CASE_TITLE},
    {"tojson", f_tojson, 0},
    {"trim", f_trim, 0},
    {"unique", f_aggregate, AGG_UNIQUE},
    {"upper", f_case, JJ_CASE_UPPER},
    {"wordcount", f_wordcount, 0},
};

enum { NFILTERS = sizeof FILTERS / sizeof FILTERS[0] };

int epyq_jj_filter_id(const char *name) {
    for (size_t i = 0; i < NFILTERS; i++)
        if (!strcmp(FILTERS[i].name, name)) return (int)i;
    return -1;
}

bool epyq_jj_apply_filter(jrender *r, jscope *sc, int fid, const jv *args, const char *const *names,
                          size_t nargs, jv *out) {
    if (fid < 0 || fid >= NFILTERS) return epyq_jj_fail(r, "no filter with id %d", fid);
    const fcall fc = {
        .r = r, .sc = sc, .mode = FILTERS[fid].mode, .args = args, .names = names, .nargs = nargs};
    return FILTERS[fid].fn(&fc, out);
}
