/* src/chat/jinja_filters.c — jinja2's built-in filters and tests (the ones chat templates use),
 * with transformers' tojson. Names are resolved when the template is parsed, so an unknown
 * filter or test is a parse error with its position, as in jinja2. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "chat/jinja_int.h"

typedef enum {
    F_ABS, F_CAPITALIZE, F_COUNT, F_DEFAULT, F_DICTSORT, F_ESCAPE, F_FIRST, F_FLOAT, F_INDENT,
    F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT,
    F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT,
    F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT,
} filter_id;

static const struct {
    const char *name;
    filter_id id;
} FILTERS[] = {
    {"abs", F_ABS}, {"capitalize", F_CAPITALIZE}, {"count", F_COUNT}, {"d", F_DEFAULT},
    {"default", F_DEFAULT}, {"dictsort", F_DICTSORT}, {"e", F_ESCAPE}, {"escape", F_ESCAPE},
    {"first", F_FIRST}, {"float", F_FLOAT}, {"indent", F_INDENT}, {"int", F_INT},
    {"items", F_ITEMS}, {"join", F_JOIN}, {"last", F_LAST}, {"length", F_LENGTH},
    {"list", F_LIST}, {"lower", F_LOWER}, {"map", F_MAP}, {"max", F_MAX}, {"min", F_MIN},
    {"reject", F_REJECT}, {"rejectattr", F_REJECTATTR}, {"replace", F_REPLACE},
    {"reverse", F_REVERSE}, {"round", F_ROUND}, {"safe", F_SAFE}, {"select", F_SELECT},
    {"selectattr", F_SELECTATTR}, {"sort", F_SORT}, {"string", F_STRING}, {"sum", F_SUM},
    {"title", F_TITLE}, {"tojson", F_TOJSON}, {"trim", F_TRIM}, {"unique", F_UNIQUE},
    {"upper", F_UPPER}, {"wordcount", F_WORDCOUNT},
};

typedef enum {
    T_DEFINED, T_UNDEFINED, T_NONE, T_BOOLEAN, T_TRUE, T_FALSE, T_INTEGER, T_FLOAT, T_NUMBER,
    T_STRING, T_MAPPING, T_SEQUENCE, T_ITERABLE, T_CALLABLE, T_SAMEAS, T_ESCAPED, T_ODD, T_EVEN,
    T_DIVISIBLEBY, T_IN, T_EQ, T_NE, T_LT, T_LE, T_GT, T_GE, T_LOWER, T_UPPER, T_FILTER, T_TEST,
} test_id;

static const struct {
    const char *name;
    test_id id;
} TESTS[] = {
    {"defined", T_DEFINED}, {"undefined", T_UNDEFINED}, {"none", T_NONE}, {"boolean", T_BOOLEAN},
    {"true", T_TRUE}, {"false", T_FALSE}, {"integer", T_INTEGER}, {"float", T_FLOAT},
    {"number", T_NUMBER}, {"string", T_STRING}, {"mapping", T_MAPPING}, {"sequence", T_SEQUENCE},
    {"iterable", T_ITERABLE}, {"callable", T_CALLABLE}, {"sameas", T_SAMEAS}, {"escaped", T_ESCAPED},
    {"odd", T_ODD}, {"even", T_EVEN}, {"divisibleby", T_DIVISIBLEBY}, {"in", T_IN},
    {"eq", T_EQ}, {"equalto", T_EQ}, {"==", T_EQ}, {"ne", T_NE}, {"!=", T_NE}, {"lt", T_LT},
    {"lessthan", T_LT}, {"<", T_LT}, {"le", T_LE}, {"<=", T_LE}, {"gt", T_GT},
    {"greaterthan", T_GT}, {">", T_GT}, {"ge", T_GE}, {">=", T_GE}, {"lower", T_LOWER},
    {"upper", T_UPPER}, {"filter", T_FILTER}, {"test", T_TEST},
};

int epyq_jj_filter_id(const char *name) {
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
        if (!strcmp(FILTERS[i].name, name)) return (int)FILTERS[i].id;
    return -1;
}

int epyq_jj_test_id(const char *name) {
    for (size_t i = 0; i < sizeof TESTS / sizeof TESTS[0]; i++)
        if (!strcmp(TESTS[i].name, name)) return (int)TESTS[i].id;
    return -1;
}

static const char *filter_name(int id) {
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
        if ((int)FILTERS[i].id == id) return FILTERS[i].name;
    return "?";
}

/* Argument `pos` (0 = first after the subject) or keyword `kw`; *out = dflt when absent. */
static jv arg(const jv *args, const char *const *names, size_t nargs, size_t pos, const char *kw, jv dflt) {
    size_t p = 0;
    for (size_t i = 1; i < nargs; i++) {
        if (names && names[i]) {
            if (kw && !strcmp(names[i], kw)) return args[i];
        } else if (p++ == pos) {
            return args[i];
        }
    }
    return dflt;
}

static jv make_list(jlist *l) { return (jv){.t = JV_LIST, .u.l = l}; }

/* Case mapping one code point at a time with utf8proc (Python also does multi-char maps). */
static bool map_case(jrender *r, jv s, int mode, jv *out) {
    /* mode: 0 lower, 1 upper, 2 capitalize, 3 title (jinja2's title) */
    epyq_sbuf b = {.max = r->max_output};
    size_t i = 0, n = s.u.s.n;
    bool word_start = true, first = true;
    while (i < n) {
        size_t a = i;
        uint32_t c = epyq_jj_utf8_next(s.u.s.p, n, &i);
        bool valid = i - a > 1 || c < 0x80;
        int32_t m = (int32_t)c;
        if (valid) {
            bool up = mode == 1 || (mode == 2 && first) || (mode == 3 && word_start);
            m = up ? utf8proc_toupper((int32_t)c) : utf8proc_tolower((int32_t)c);
        }
        if (mode == 3) /* jinja2 splits words at whitespace and -([{< */
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
        if (!map_case(r, a, 0, &la) || !map_case(r, b, 0, &lb)) return false;
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

/* select/reject/selectattr/rejectattr: keep items whose test (default: truthiness) == keep. */
static bool filter_items(jrender *r, const jv *args, size_t nargs, bool by_attr, bool keep, jv *out) {
    jlist *src;
    if (!epyq_jj_truthy(args[0])) { /* jinja2: `if value:` before iterating, so 0/None give [] */
        *out = make_list(epyq_jj_list_new(&r->ar, 0));
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
    *out = make_list(l);
    return true;
}

static bool do_map(jrender *r, jscope *sc, const jv *args, const char *const *names, size_t nargs, jv *out) {
    jlist *src;
    if (!epyq_jj_truthy(args[0])) { /* as select: a falsy value maps to nothing */
        *out = make_list(epyq_jj_list_new(&r->ar, 0));
        return out->u.l ? true : epyq_jj_nomem(r);
    }
    if (!epyq_jj_iter_list(r, args[0], &src)) return false;
    jv attr = arg(args, names, nargs, 99, "attribute", jv_undef(NULL));
    jv dflt = arg(args, names, nargs, 99, "default", jv_undef(NULL));
    int fid = -1;
    if (attr.t == JV_UNDEF) {
        jv fname = arg(args, names, nargs, 0, NULL, jv_undef(NULL));
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
            if (!epyq_jj_apply_filter(r, sc, fid, fargs, fnames, nf, &v)) return false;
        } else {
            if (!get_path(r, src->v[i], attr, &v)) return false;
            if (v.t == JV_UNDEF && dflt.t != JV_UNDEF) v = dflt;
        }
        l->v[l->n++] = v;
    }
    *out = make_list(l);
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

bool epyq_jj_apply_filter(jrender *r, jscope *sc, int fid, const jv *args, const char *const *names, size_t nargs,
                     jv *out) {
    jv v = args[0];
    switch ((filter_id)fid) {
    case F_SAFE: return epyq_jj_stringify(r, v, out); /* Markup(str(v)); autoescape is off */
    case F_STRING: return epyq_jj_stringify(r, v, out);
    case F_LENGTH:
    case F_COUNT: {
        int64_t n = 0;
        if (!length_of(r, v, &n)) return false;
        *out = jv_int(n);
        return true;
    }
    case F_DEFAULT: {
        jv d = arg(args, names, nargs, 0, "default_value", jv_str("", 0));
        bool boolean = epyq_jj_truthy(arg(args, names, nargs, 1, "boolean", jv_bool(false)));
        *out = v.t == JV_UNDEF || (boolean && !epyq_jj_truthy(v)) ? d : v;
        return true;
    }
    case F_TRIM: {
        jv chars = arg(args, names, nargs, 0, "chars", jv_none());
        jv s;
        if (!epyq_jj_stringify(r, v, &s)) return false;
        if (chars.t == JV_STR) *out = epyq_jj_str_strip(s, chars.u.s.p, chars.u.s.n, 3);
        else *out = epyq_jj_str_strip(s, NULL, 0, 3);
        return true;
    }
    case F_TOJSON: {
        jv ind = arg(args, names, nargs, 0, "indent", jv_none());
        if (epyq_jj_truthy(arg(args, names, nargs, 99, "ensure_ascii", jv_bool(false))))
            return epyq_jj_fail(r, "tojson(ensure_ascii=true) is not supported");
        if (arg(args, names, nargs, 99, "separators", jv_none()).t != JV_NONE)
            return epyq_jj_fail(r, "tojson(separators=...) is not supported");
        bool sort_keys = epyq_jj_truthy(arg(args, names, nargs, 99, "sort_keys", jv_bool(false)));
        if (ind.t != JV_NONE && ind.t != JV_INT) return epyq_jj_fail(r, "tojson indent must be an integer");
        int indent = ind.t == JV_INT ? (ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : (int)ind.u.i) : -1;
        epyq_sbuf b = {.max = r->max_output};
        if (!epyq_jj_tojson(r, &b, v, indent, sort_keys)) {
            epyq_sbuf_free(&b);
            return false;
        }
        return epyq_jj_str_from_buf(r, &b, out);
    }
    case F_ITEMS: {
        if (v.t == JV_UNDEF) {
            jlist *l = epyq_jj_list_new(&r->ar, 0);
            if (!l) return epyq_jj_nomem(r);
            *out = make_list(l);
            return true;
        }
        if (v.t != JV_DICT && v.t != JV_NS) return epyq_jj_fail(r, "Can only get item pairs from a mapping.");
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
        *out = make_list(l);
        return true;
    }
    case F_JOIN: {
        jv sep = arg(args, names, nargs, 0, "d", jv_str("", 0));
        jv attr = arg(args, names, nargs, 1, "attribute", jv_undef(NULL));
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
    case F_UPPER:
    case F_LOWER:
    case F_CAPITALIZE:
    case F_TITLE: {
        jv s;
        if (!epyq_jj_stringify(r, v, &s)) return false;
        int mode = fid == F_LOWER ? 0 : fid == F_UPPER ? 1 : fid == F_CAPITALIZE ? 2 : 3;
        return map_case(r, s, mode, out);
    }
    case F_REPLACE: {
        jv s, old = arg(args, names, nargs, 0, "old", jv_undef("old")), new = arg(args, names, nargs, 1, "new", jv_undef("new"));
        jv cnt = arg(args, names, nargs, 2, "count", jv_none());
        if (!epyq_jj_stringify(r, v, &s) || !epyq_jj_stringify(r, old, &old) || !epyq_jj_stringify(r, new, &new)) return false;
        jv fn;
        if (!epyq_jj_method(r, s, "replace", &fn)) return epyq_jj_fail(r, "replace is unavailable");
        jv margs[3] = {old, new, cnt.t == JV_INT ? cnt : jv_int(-1)};
        return epyq_jj_call_builtin(r, fn.u.fn, margs, NULL, 3, out);
    }
    case F_FIRST:
    case F_LAST: {
        jlist *l;
        if (!epyq_jj_iter_list(r, v, &l)) return false;
        if (!l->n) *out = jv_undef(fid == F_FIRST ? "No first item, sequence was empty." : "No last item, sequence was empty.");
        else *out = l->v[fid == F_FIRST ? 0 : l->n - 1];
        return true;
    }
    case F_LIST: {
        jlist *l;
        if (!copy_list(r, v, &l)) return false;
        *out = make_list(l);
        return true;
    }
    case F_REVERSE: {
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
        *out = make_list(l);
        return true;
    }
    case F_ABS:
        if (v.t == JV_INT) {
            if (v.u.i == INT64_MIN) return epyq_jj_fail(r, "integer overflow in abs");
            *out = jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        } else if (v.t == JV_FLOAT) *out = jv_float(fabs(v.u.f));
        else if (v.t == JV_BOOL) *out = jv_int(v.u.b);
        else return epyq_jj_fail(r, "bad operand type for abs(): '%s'", epyq_jj_type_name(v));
        return true;
    case F_INT: {
        jv d = arg(args, names, nargs, 0, "default", jv_int(0));
        if (v.t == JV_UNDEF) /* int(Undefined) raises in jinja2 */
            return epyq_jj_fail(r, "'%.*s' is undefined", (int)v.u.s.n, v.u.s.p ? v.u.s.p : "value");
        int64_t i;
        double f;
        if (v.t == JV_INT) *out = v;
        else if (v.t == JV_BOOL) *out = jv_int(v.u.b);
        else if (v.t == JV_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) *out = jv_int((int64_t)v.u.f);
        else if (v.t == JV_STR && parse_int_str(v, &i)) *out = jv_int(i);
        else if (v.t == JV_STR && parse_float_str(v, &f) && isfinite(f) && fabs(f) < 9.2e18) *out = jv_int((int64_t)f);
        else *out = d;
        return true;
    }
    case F_FLOAT: {
        jv d = arg(args, names, nargs, 0, "default", jv_float(0.0));
        if (v.t == JV_UNDEF)
            return epyq_jj_fail(r, "'%.*s' is undefined", (int)v.u.s.n, v.u.s.p ? v.u.s.p : "value");
        double f;
        if (v.t == JV_FLOAT) *out = v;
        else if (v.t == JV_INT || v.t == JV_BOOL) *out = jv_float(v.t == JV_INT ? (double)v.u.i : v.u.b);
        else if (v.t == JV_STR && parse_float_str(v, &f)) *out = jv_float(f);
        else *out = d;
        return true;
    }
    case F_ROUND: {
        jv prec = arg(args, names, nargs, 0, "precision", jv_int(0));
        jv method = arg(args, names, nargs, 1, "method", jv_str("common", 6));
        if (v.t != JV_INT && v.t != JV_FLOAT && v.t != JV_BOOL) return epyq_jj_fail(r, "round expects a number");
        double x = v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : v.u.b;
        int64_t p = prec.t == JV_INT ? prec.u.i : 0;
        if (p < -300 || p > 300) p = p < 0 ? -300 : 300;
        double scale = pow(10.0, (double)p);
        if (method.t == JV_STR && method.u.s.n == 4 && !memcmp(method.u.s.p, "ceil", 4)) x = ceil(x * scale) / scale;
        else if (method.t == JV_STR && method.u.s.n == 5 && !memcmp(method.u.s.p, "floor", 5)) x = floor(x * scale) / scale;
        else if (p >= 0 && p <= 17) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)p, x); /* round-half-even on the exact value */
            x = strtod(buf, NULL);
        } else x = nearbyint(x * scale) / scale;
        *out = jv_float(x);
        return true;
    }
    case F_ESCAPE: {
        jv s;
        if (!epyq_jj_stringify(r, v, &s)) return false;
        epyq_sbuf b = {.max = r->max_output};
        bool ok = true;
        for (size_t i = 0; ok && i < s.u.s.n; i++) {
            char c = s.u.s.p[i];
            ok = c == '&' ? epyq_sbuf_adds(&b, "&amp;") : c == '<' ? epyq_sbuf_adds(&b, "&lt;")
               : c == '>' ? epyq_sbuf_adds(&b, "&gt;") : c == '"' ? epyq_sbuf_adds(&b, "&#34;")
               : c == '\'' ? epyq_sbuf_adds(&b, "&#39;") : epyq_sbuf_addc(&b, c);
        }
        if (!ok) {
            epyq_sbuf_free(&b);
            return epyq_jj_nomem(r);
        }
        return epyq_jj_str_from_buf(r, &b, out);
    }
    case F_WORDCOUNT: {
        jv s;
        if (!epyq_jj_stringify(r, v, &s)) return false;
        int64_t words = 0;
        bool in = false;
        for (size_t i = 0; i < s.u.s.n; i++) {
            char c = s.u.s.p[i];
            bool w = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (unsigned char)c >= 0x80;
            if (w && !in) words++;
            in = w;
        }
        *out = jv_int(words);
        return true;
    }
    case F_SELECT: return filter_items(r, args, nargs, false, true, out);
    case F_REJECT: return filter_items(r, args, nargs, false, false, out);
    case F_SELECTATTR: return filter_items(r, args, nargs, true, true, out);
    case F_REJECTATTR: return filter_items(r, args, nargs, true, false, out);
    case F_MAP: return do_map(r, sc, args, names, nargs, out);
    case F_INDENT: {
        /* jinja2 appends "\n" to the value itself: only strings work. */
        if (v.t != JV_STR)
            return epyq_jj_fail(r, "unsupported operand type(s) for +=: '%s' and 'str'", epyq_jj_type_name(v));
        return do_indent(r, v, arg(args, names, nargs, 0, "width", jv_int(4)),
                         epyq_jj_truthy(arg(args, names, nargs, 1, "first", jv_bool(false))),
                         epyq_jj_truthy(arg(args, names, nargs, 2, "blank", jv_bool(false))), out);
    }
    case F_SORT:
    case F_UNIQUE:
    case F_MIN:
    case F_MAX:
    case F_DICTSORT: {
        bool dictsort = fid == F_DICTSORT;
        bool reverse = fid == F_SORT || dictsort ? epyq_jj_truthy(arg(args, names, nargs, dictsort ? 2 : 0, "reverse", jv_bool(false))) : false;
        bool cs = epyq_jj_truthy(arg(args, names, nargs, fid == F_SORT ? 1 : 0, "case_sensitive", jv_bool(false)));
        jv attr = fid == F_SORT ? arg(args, names, nargs, 2, "attribute", jv_undef(NULL))
                : dictsort ? jv_undef(NULL) : arg(args, names, nargs, 1, "attribute", jv_undef(NULL));
        jlist *l;
        if (dictsort) {
            if (v.t != JV_DICT) return epyq_jj_fail(r, "dictsort expects a mapping");
            jv by = arg(args, names, nargs, 1, "by", jv_str("key", 3));
            if (!epyq_jj_apply_filter(r, sc, F_ITEMS, &v, NULL, 1, out)) return false;
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
        if (fid == F_UNIQUE) {
            jlist *u = epyq_jj_list_new(&r->ar, l->n);
            jv *seen = epyq_jj_alloc_array(&r->ar, l->n ? l->n : 1, sizeof *seen);
            if (!u || !seen) return epyq_jj_nomem(r);
            size_t ns = 0;
            for (size_t i = 0; i < l->n; i++) {
                jv k = keys[i];
                if (!cs && k.t == JV_STR && !map_case(r, k, 0, &k)) return false;
                bool dup = false;
                for (size_t j = 0; j < ns && !dup; j++) dup = epyq_jj_equal(seen[j], k);
                if (!epyq_jj_count_step(r)) return false;
                if (!dup) {
                    seen[ns++] = k;
                    u->v[u->n++] = l->v[i];
                }
            }
            *out = make_list(u);
            return true;
        }
        if (fid == F_MIN || fid == F_MAX) {
            if (!l->n) {
                *out = jv_undef("No aggregated item, sequence was empty.");
                return true;
            }
            size_t best = 0;
            for (size_t i = 1; i < l->n; i++) {
                int c;
                if (!cmp_for_sort(r, keys[i], keys[best], cs, &c)) return false;
                if (fid == F_MIN ? c < 0 : c > 0) best = i;
            }
            *out = l->v[best];
            return true;
        }
        if (!sort_by(r, l->v, keys, l->n, cs, reverse)) return false;
        *out = make_list(l);
        return true;
    }
    case F_SUM: {
        jv attr = arg(args, names, nargs, 0, "attribute", jv_undef(NULL));
        jv acc = arg(args, names, nargs, 1, "start", jv_int(0));
        jlist *l;
        if (!epyq_jj_iter_list(r, v, &l)) return false;
        for (size_t i = 0; i < l->n; i++) {
            jv item = l->v[i];
            if (attr.t != JV_UNDEF && !get_path(r, item, attr, &item)) return false;
            if (acc.t == JV_INT && item.t == JV_INT) {
                if (__builtin_add_overflow(acc.u.i, item.u.i, &acc.u.i)) return epyq_jj_fail(r, "integer overflow in sum");
            } else if ((acc.t == JV_INT || acc.t == JV_FLOAT) && (item.t == JV_INT || item.t == JV_FLOAT)) {
                acc = jv_float((acc.t == JV_INT ? (double)acc.u.i : acc.u.f) + (item.t == JV_INT ? (double)item.u.i : item.u.f));
            } else {
                return epyq_jj_fail(r, "unsupported operand type(s) for +: '%s' and '%s'", epyq_jj_type_name(acc), epyq_jj_type_name(item));
            }
        }
        *out = acc;
        return true;
    }
    }
    return epyq_jj_fail(r, "filter '%s' is not implemented", filter_name(fid));
}

bool epyq_jj_apply_test(jrender *r, int tid, const jv *args, size_t nargs, bool *out) {
    jv v = args[0];
    jv a = nargs > 1 ? args[1] : jv_undef("test argument");
    int c = 0;
    switch ((test_id)tid) {
    case T_DEFINED: *out = v.t != JV_UNDEF; return true;
    case T_UNDEFINED: *out = v.t == JV_UNDEF; return true;
    case T_NONE: *out = v.t == JV_NONE; return true;
    case T_BOOLEAN: *out = v.t == JV_BOOL; return true;
    case T_TRUE: *out = v.t == JV_BOOL && v.u.b; return true;
    case T_FALSE: *out = v.t == JV_BOOL && !v.u.b; return true;
    case T_INTEGER: *out = v.t == JV_INT; return true;
    case T_FLOAT: *out = v.t == JV_FLOAT; return true;
    case T_NUMBER: *out = v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; return true;
    case T_STRING: *out = v.t == JV_STR; return true;
    case T_MAPPING: *out = v.t == JV_DICT; return true;
    /* jinja2's Undefined defines __len__, __iter__ and __getitem__, so it passes these two. */
    case T_SEQUENCE: *out = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF; return true;
    case T_ITERABLE: *out = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF; return true;
    case T_CALLABLE: *out = v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_UNDEF; return true;
    case T_ESCAPED: *out = false; return true;
    case T_SAMEAS:
        /* Python identity: small ints, None and bools are singletons; containers by pointer. */
        if (v.t != a.t) *out = false;
        else if (v.t == JV_STR) *out = v.u.s.p == a.u.s.p && v.u.s.n == a.u.s.n;
        else *out = epyq_jj_equal(v, a);
        return true;
    case T_ODD:
    case T_EVEN:
    case T_DIVISIBLEBY: {
        if (v.t != JV_INT && v.t != JV_BOOL) return epyq_jj_fail(r, "test expects an integer, got %s", epyq_jj_type_name(v));
        int64_t x = v.t == JV_INT ? v.u.i : v.u.b;
        if (tid == T_DIVISIBLEBY) {
            if (a.t != JV_INT || a.u.i == 0) return epyq_jj_fail(r, "divisibleby expects a non-zero integer");
            *out = a.u.i == -1 || x % a.u.i == 0;
        } else {
            *out = (x % 2 != 0) == (tid == T_ODD);
        }
        return true;
    }
    case T_IN: {
        /* Same rules as the `in` operator (jinja_eval.c). */
        if (a.t == JV_STR) {
            if (v.t != JV_STR) return epyq_jj_fail(r, "'in <string>' requires string as left operand");
            *out = !v.u.s.n || memmem(a.u.s.p, a.u.s.n, v.u.s.p, v.u.s.n);
        } else if (a.t == JV_LIST) {
            *out = false;
            for (size_t i = 0; i < a.u.l->n && !*out; i++) *out = epyq_jj_equal(a.u.l->v[i], v);
        } else if (a.t == JV_DICT) {
            *out = epyq_jj_dict_get(a.u.d, v) != NULL;
        } else if (a.t == JV_UNDEF) {
            *out = false;
        } else {
            return epyq_jj_fail(r, "argument of type '%s' is not iterable", epyq_jj_type_name(a));
        }
        return true;
    }
    case T_EQ: *out = epyq_jj_equal(v, a); return true;
    case T_NE: *out = !epyq_jj_equal(v, a); return true;
    case T_LT:
    case T_LE:
    case T_GT:
    case T_GE:
        if (!epyq_jj_compare(r, v, a, &c)) return false;
        *out = tid == T_LT ? c < 0 : tid == T_LE ? c <= 0 : tid == T_GT ? c > 0 : c >= 0;
        return true;
    case T_LOWER:
    case T_UPPER: {
        jv s, m;
        if (!epyq_jj_stringify(r, v, &s) || !map_case(r, s, tid == T_LOWER ? 0 : 1, &m)) return false;
        /* islower(): has a cased character and equals its lower-cased form (ASCII-level check). */
        bool cased = false;
        for (size_t i = 0; i < s.u.s.n; i++) {
            char ch = s.u.s.p[i];
            cased |= (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (unsigned char)ch >= 0x80;
        }
        *out = cased && epyq_jj_equal(s, m);
        return true;
    }
    case T_FILTER:
    case T_TEST: {
        if (v.t != JV_STR) {
            *out = false;
            return true;
        }
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)v.u.s.n, v.u.s.p);
        *out = tid == T_FILTER ? epyq_jj_filter_id(name) >= 0 : epyq_jj_test_id(name) >= 0;
        return true;
    }
    }
    return epyq_jj_fail(r, "unknown test");
}
