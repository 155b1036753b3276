/* src/chat/jinja_methods.c — Python methods of str/dict/list values, loop.cycle, and the
 * template globals transformers provides (raise_exception, namespace, range, dict,
 * strftime_now). Methods that would modify a value are refused like jinja2's
 * ImmutableSandboxedEnvironment refuses them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat/jinja_int.h"

typedef enum {
    /* str */
    M_STARTSWITH, M_ENDSWITH, M_SPLIT, M_RSPLIT, M_STRIP, M_LSTRIP, M_RSTRIP, M_REPLACE,
    M_UPPER, M_LOWER, M_TITLE, M_CAPITALIZE, M_FIND, M_RFIND, M_STR_COUNT, M_JOIN,
    M_SPLITLINES, M_ISDIGIT, M_ISALPHA, M_ISSPACE, M_ISALNUM, M_ISUPPER, M_ISLOWER,
    M_REMOVEPREFIX, M_REMOVESUFFIX, M_STR_UNSUPPORTED,
    /* dict */
    M_ITEMS, M_KEYS, M_VALUES, M_GET, M_COPY,
    /* list */
    M_LIST_INDEX, M_LIST_COUNT,
    /* any container: would modify it */
    M_UNSAFE,
    /* loop */
    M_CYCLE,
    /* globals */
    G_RAISE, G_NAMESPACE, G_RANGE, G_DICT, G_STRFTIME,
} method_id;

typedef struct {
    const char *name;
    method_id id;
} method_entry;

static const method_entry STR_METHODS[] = {
    {"startswith", M_STARTSWITH}, {"endswith", M_ENDSWITH}, {"split", M_SPLIT}, {"rsplit", M_RSPLIT},
    {"strip", M_STRIP}, {"lstrip", M_LSTRIP}, {"rstrip", M_RSTRIP}, {"replace", M_REPLACE},
    {"upper", M_UPPER}, {"lower", M_LOWER}, {"title", M_TITLE}, {"capitalize", M_CAPITALIZE},
    {"find", M_FIND}, {"rfind", M_RFIND}, {"count", M_STR_COUNT}, {"join", M_JOIN},
    {"splitlines", M_SPLITLINES}, {"isdigit", M_ISDIGIT}, {"isalpha", M_ISALPHA},
    {"isspace", M_ISSPACE}, {"isalnum", M_ISALNUM}, {"isupper", M_ISUPPER}, {"islower", M_ISLOWER},
    {"removeprefix", M_REMOVEPREFIX}, {"removesuffix", M_REMOVESUFFIX},
    {"format", M_STR_UNSUPPORTED}, {"zfill", M_STR_UNSUPPORTED}, {"center", M_STR_UNSUPPORTED},
    {"ljust", M_STR_UNSUPPORTED}, {"rjust", M_STR_UNSUPPORTED}, {"partition", M_STR_UNSUPPORTED},
    {"rpartition", M_STR_UNSUPPORTED}, {"index", M_STR_UNSUPPORTED}, {"rindex", M_STR_UNSUPPORTED},
    {"encode", M_STR_UNSUPPORTED}, {"casefold", M_STR_UNSUPPORTED}, {"swapcase", M_STR_UNSUPPORTED},
    {"expandtabs", M_STR_UNSUPPORTED}, {"translate", M_STR_UNSUPPORTED},
};

static const method_entry DICT_METHODS[] = {
    {"items", M_ITEMS}, {"keys", M_KEYS}, {"values", M_VALUES}, {"get", M_GET}, {"copy", M_COPY},
    {"pop", M_UNSAFE}, {"popitem", M_UNSAFE}, {"setdefault", M_UNSAFE}, {"update", M_UNSAFE},
    {"clear", M_UNSAFE}, {"fromkeys", M_UNSAFE},
};

static const method_entry LIST_METHODS[] = {
    {"index", M_LIST_INDEX}, {"count", M_LIST_COUNT}, {"copy", M_COPY}, {"append", M_UNSAFE},
    {"extend", M_UNSAFE}, {"insert", M_UNSAFE}, {"pop", M_UNSAFE}, {"remove", M_UNSAFE},
    {"reverse", M_UNSAFE}, {"sort", M_UNSAFE}, {"clear", M_UNSAFE},
};

static const method_entry GLOBALS[] = {
    {"raise_exception", G_RAISE}, {"namespace", G_NAMESPACE}, {"range", G_RANGE}, {"dict", G_DICT},
    {"strftime_now", G_STRFTIME},
};

enum { MAX_RANGE = 100000 }; /* jinja2's sandbox refuses larger ranges */

static bool bind(jrender *r, int id, jv self, const char *name, jv *out) {
    jfunc *f = epyq_jj_alloc(&r->ar, sizeof *f + strlen(name) + 1);
    if (!f) return epyq_jj_nomem(r);
    f->id = id;
    f->self = self;
    *out = (jv){.t = JV_FUNC, .u.fn = f};
    /* The method name rides after the struct for error messages. */
    strcpy((char *)(f + 1), name);
    return true;
}

static const char *func_name(const jfunc *f) { return (const char *)(f + 1); }

static int find_method(const method_entry *tab, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(tab[i].name, name)) return (int)tab[i].id;
    return -1;
}

bool epyq_jj_method(jrender *r, jv self, const char *name, jv *out) {
    int id = -1;
    if (self.t == JV_STR) id = find_method(STR_METHODS, sizeof STR_METHODS / sizeof STR_METHODS[0], name);
    else if (self.t == JV_DICT) id = find_method(DICT_METHODS, sizeof DICT_METHODS / sizeof DICT_METHODS[0], name);
    else if (self.t == JV_LIST) id = find_method(LIST_METHODS, sizeof LIST_METHODS / sizeof LIST_METHODS[0], name);
    else if (self.t == JV_LOOP && !strcmp(name, "cycle")) id = M_CYCLE;
    if (id < 0) return false;
    return bind(r, id, self, name, out);
}

void epyq_jj_install_globals(jrender *r, jscope *sc) {
    size_t n = sizeof GLOBALS / sizeof GLOBALS[0];
    sc->names = epyq_jj_alloc_array(&r->ar, n, sizeof *sc->names);
    sc->vals = epyq_jj_alloc_array(&r->ar, n, sizeof *sc->vals);
    if (!sc->names || !sc->vals) {
        epyq_jj_nomem(r);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (!bind(r, GLOBALS[i].id, jv_none(), GLOBALS[i].name, &sc->vals[i])) return;
        sc->names[i] = GLOBALS[i].name;
    }
    sc->n = sc->cap = n;
}

/* ---- argument helpers ------------------------------------------------------------------- */

typedef struct {
    const jv *args;
    const char *const *names;
    size_t n;
} argv_t;

static jv get_arg(const argv_t *a, size_t pos, const char *kw, jv dflt) {
    size_t p = 0;
    for (size_t i = 0; i < a->n; i++) {
        if (a->names && a->names[i]) {
            if (kw && !strcmp(a->names[i], kw)) return a->args[i];
        } else if (p++ == pos) {
            return a->args[i];
        }
    }
    return dflt;
}

static bool push_str(jrender *r, jlist *l, const char *p, size_t n) {
    if (!epyq_jj_list_push(&r->ar, l, jv_str(p, n))) return epyq_jj_nomem(r);
    return true;
}

static bool str_arg(jrender *r, jv v, const char *what) {
    if (v.t == JV_STR) return true;
    return epyq_jj_fail(r, "%s argument must be str, not %s", what, epyq_jj_type_name(v));
}

/* str.split / str.rsplit (sep None = runs of whitespace). */
static bool split(jrender *r, jv s, jv sep, int64_t maxsplit, bool from_right, jv *out) {
    jlist *l = epyq_jj_list_new(&r->ar, 0);
    if (!l) return epyq_jj_nomem(r);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (sep.t == JV_STR) {
        if (!sep.u.s.n) return epyq_jj_fail(r, "empty separator");
        const char *q = sep.u.s.p;
        size_t m = sep.u.s.n;
        if (!from_right) {
            size_t start = 0;
            while (maxsplit != 0) {
                const char *hit = memmem(p + start, n - start, q, m);
                if (!hit) break;
                size_t at = (size_t)(hit - p);
                if (!push_str(r, l, p + start, at - start)) return false;
                start = at + m;
                maxsplit--;
            }
            if (!push_str(r, l, p + start, n - start)) return false;
        } else {
            /* Collect from the right, then reverse. */
            size_t end = n;
            while (maxsplit != 0 && end >= m) {
                size_t at = end - m + 1, found = (size_t)-1;
                while (at-- > 0)
                    if (!memcmp(p + at, q, m)) {
                        found = at;
                        break;
                    }
                if (found == (size_t)-1) break;
                if (!push_str(r, l, p + found + m, end - found - m)) return false;
                end = found;
                maxsplit--;
            }
            if (!push_str(r, l, p, end)) return false;
            for (size_t i = 0; i < l->n / 2; i++) {
                jv t = l->v[i];
                l->v[i] = l->v[l->n - 1 - i];
                l->v[l->n - 1 - i] = t;
            }
        }
    } else {
        /* Whitespace: work on character boundaries. */
        size_t i = 0;
        if (from_right) {
            /* Rare in templates: split fully from the left, then re-join the leftmost extras. */
            jv all;
            if (!split(r, s, jv_none(), -1, false, &all)) return false;
            size_t cnt = all.u.l->n;
            if (maxsplit < 0 || (size_t)maxsplit + 1 >= cnt) {
                *out = all;
                return true;
            }
            size_t keep = cnt - (size_t)maxsplit; /* the first `keep` words become one piece */
            const char *first = all.u.l->v[0].u.s.p;
            const char *last_end = all.u.l->v[keep - 1].u.s.p + all.u.l->v[keep - 1].u.s.n;
            if (!push_str(r, l, first, (size_t)(last_end - first))) return false;
            for (size_t k = keep; k < cnt; k++)
                if (!epyq_jj_list_push(&r->ar, l, all.u.l->v[k])) return epyq_jj_nomem(r);
            *out = jv_list(l, false);
            return true;
        }
        for (;;) {
            while (i < n) { /* skip whitespace */
                size_t j = i;
                if (!epyq_jj_py_isspace(epyq_jj_utf8_next(p, n, &j))) break;
                i = j;
            }
            if (i >= n) break;
            if (maxsplit == 0) {
                /* The rest, trailing whitespace included, is the last piece. */
                if (!push_str(r, l, p + i, n - i)) return false;
                break;
            }
            size_t start = i;
            while (i < n) {
                size_t j = i;
                if (epyq_jj_py_isspace(epyq_jj_utf8_next(p, n, &j))) break;
                i = j;
            }
            if (!push_str(r, l, p + start, i - start)) return false;
            if (maxsplit > 0) maxsplit--;
        }
    }
    *out = jv_list(l, false);
    return true;
}

static bool str_replace(jrender *r, jv s, jv old, jv new, int64_t count, jv *out) {
    epyq_sbuf b = {.max = r->max_output};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    bool ok = true;
    if (!old.u.s.n) {
        /* Python inserts `new` before every character and at the end. */
        while (ok && i <= n) {
            if (count == 0) {
                ok = epyq_sbuf_add(&b, p + i, n - i);
                break;
            }
            ok = epyq_sbuf_add(&b, new.u.s.p, new.u.s.n);
            if (count > 0) count--;
            if (i == n) break;
            size_t j = i;
            epyq_jj_utf8_next(p, n, &j);
            ok = ok && epyq_sbuf_add(&b, p + i, j - i);
            i = j;
        }
    } else {
        while (ok) {
            const char *hit = count != 0 ? memmem(p + i, n - i, old.u.s.p, old.u.s.n) : NULL;
            if (!hit) {
                ok = epyq_sbuf_add(&b, p + i, n - i);
                break;
            }
            size_t at = (size_t)(hit - p);
            ok = epyq_sbuf_add(&b, p + i, at - i) && epyq_sbuf_add(&b, new.u.s.p, new.u.s.n);
            i = at + old.u.s.n;
            if (count > 0) count--;
            ok = ok && epyq_jj_count_step(r);
        }
    }
    if (!ok) {
        epyq_sbuf_free(&b);
        return r->err && r->err->code ? false : epyq_jj_nomem(r);
    }
    return epyq_jj_str_from_buf(r, &b, out);
}

/* prefix may be a str or a tuple of str (Python startswith/endswith). */
static bool affix_match(jrender *r, jv s, jv affix, bool end, bool *out) {
    if (affix.t == JV_LIST && affix.tuple) {
        *out = false;
        for (size_t i = 0; i < affix.u.l->n && !*out; i++)
            if (!affix_match(r, s, affix.u.l->v[i], end, out)) return false;
        return true;
    }
    if (affix.t != JV_STR)
        return epyq_jj_fail(r, "%s first arg must be str or a tuple of str, not %s", end ? "endswith" : "startswith",
                       epyq_jj_type_name(affix));
    size_t m = affix.u.s.n;
    *out = m <= s.u.s.n && !memcmp(s.u.s.p + (end ? s.u.s.n - m : 0), affix.u.s.p, m);
    return true;
}

static bool char_class(jv s, int id) {
    /* ASCII classification (non-ASCII letters count as alpha); empty strings are false. */
    if (!s.u.s.n) return false;
    bool cased = false, all_upper = true, all_lower = true;
    for (size_t i = 0; i < s.u.s.n; i++) {
        unsigned char c = (unsigned char)s.u.s.p[i];
        bool digit = c >= '0' && c <= '9', up = c >= 'A' && c <= 'Z', lo = c >= 'a' && c <= 'z';
        bool alpha = up || lo || c >= 0x80;
        if (up) all_lower = false;
        if (lo) all_upper = false;
        cased |= up || lo;
        switch (id) {
        case M_ISDIGIT: if (!digit) return false; break;
        case M_ISALPHA: if (!alpha) return false; break;
        case M_ISALNUM: if (!alpha && !digit) return false; break;
        case M_ISSPACE: if (!(c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f))) return false; break;
        default: break;
        }
    }
    if (id == M_ISUPPER) return cased && all_upper;
    if (id == M_ISLOWER) return cased && all_lower;
    return true;
}

static bool splitlines(jrender *r, jv s, bool keepends, jv *out) {
    jlist *l = epyq_jj_list_new(&r->ar, 0);
    if (!l) return epyq_jj_nomem(r);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0, start = 0;
    while (i < n) {
        size_t j = i;
        uint32_t c = epyq_jj_utf8_next(p, n, &j);
        bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
                   c == 0x85 || c == 0x2028 || c == 0x2029;
        if (!brk) {
            i = j;
            continue;
        }
        if (c == '\r' && j < n && p[j] == '\n') j++;
        if (!push_str(r, l, p + start, (keepends ? j : i) - start)) return false;
        start = i = j;
    }
    if (start < n && !push_str(r, l, p + start, n - start)) return false;
    *out = jv_list(l, false);
    return true;
}

static bool dict_view(jrender *r, jv self, int id, jv *out) {
    jdict *d = self.u.d;
    jlist *l = epyq_jj_list_new(&r->ar, d->n);
    if (!l) return epyq_jj_nomem(r);
    for (size_t i = 0; i < d->n; i++) {
        if (id == M_ITEMS) {
            jlist *pair = epyq_jj_list_new(&r->ar, 2);
            if (!pair) return epyq_jj_nomem(r);
            pair->v[0] = d->k[i];
            pair->v[1] = d->v[i];
            pair->n = 2;
            l->v[i] = (jv){.t = JV_LIST, .tuple = 1, .u.l = pair};
        } else {
            l->v[i] = id == M_KEYS ? d->k[i] : d->v[i];
        }
    }
    l->n = d->n;
    *out = jv_list(l, false);
    return true;
}

static bool kwargs_dict(jrender *r, const argv_t *a, bool ns, jv *out) {
    jdict *d = epyq_jj_dict_new(&r->ar, a->n);
    if (!d) return epyq_jj_nomem(r);
    for (size_t i = 0; i < a->n; i++) {
        if (a->names && a->names[i]) {
            if (!epyq_jj_dict_set(&r->ar, d, jv_str(a->names[i], strlen(a->names[i])), a->args[i])) return epyq_jj_nomem(r);
        } else if (a->args[i].t == JV_DICT) { /* namespace({...}) / dict({...}) */
            for (size_t k = 0; k < a->args[i].u.d->n; k++)
                if (!epyq_jj_dict_set(&r->ar, d, a->args[i].u.d->k[k], a->args[i].u.d->v[k])) return epyq_jj_nomem(r);
        } else {
            return epyq_jj_fail(r, "%s() takes keyword arguments or one mapping", ns ? "namespace" : "dict");
        }
    }
    *out = (jv){.t = ns ? JV_NS : JV_DICT, .u.d = d};
    return true;
}

static bool do_range(jrender *r, const argv_t *a, jv *out) {
    int64_t v[3] = {0, 0, 1};
    size_t np = 0;
    for (size_t i = 0; i < a->n; i++) {
        if (a->names && a->names[i]) return epyq_jj_fail(r, "range() takes no keyword arguments");
        if (a->args[i].t != JV_INT && a->args[i].t != JV_BOOL)
            return epyq_jj_fail(r, "range() arguments must be integers, not %s", epyq_jj_type_name(a->args[i]));
        if (np == 3) return epyq_jj_fail(r, "range expected at most 3 arguments");
        v[np++] = a->args[i].t == JV_INT ? a->args[i].u.i : a->args[i].u.b;
    }
    if (np == 0) return epyq_jj_fail(r, "range expected at least 1 argument");
    int64_t start = np == 1 ? 0 : v[0], stop = np == 1 ? v[0] : v[1], step = np == 3 ? v[2] : 1;
    if (step == 0) return epyq_jj_fail(r, "range() arg 3 must not be zero");
    double count = step > 0 ? ((double)stop - (double)start) / (double)step : ((double)start - (double)stop) / (double)-step;
    if (count > MAX_RANGE) return epyq_jj_fail(r, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
    jlist *l = epyq_jj_list_new(&r->ar, count > 0 ? (size_t)count + 1 : 0);
    if (!l) return epyq_jj_nomem(r);
    for (int64_t x = start; step > 0 ? x < stop : x > stop; x += step) {
        l->v[l->n++] = jv_int(x);
        if (l->n >= l->cap) break;
    }
    *out = jv_list(l, false);
    return true;
}

bool epyq_jj_call_builtin(jrender *r, const jfunc *f, const jv *args, const char *const *names, size_t nargs, jv *out) {
    argv_t a = {args, names, nargs};
    jv self = f->self;
    jv a0 = get_arg(&a, 0, NULL, jv_undef(NULL));
    switch ((method_id)f->id) {
    case M_STARTSWITH:
    case M_ENDSWITH: {
        bool b;
        if (!affix_match(r, self, a0, f->id == M_ENDSWITH, &b)) return false;
        *out = jv_bool(b);
        return true;
    }
    case M_SPLIT:
    case M_RSPLIT: {
        jv sep = get_arg(&a, 0, "sep", jv_none());
        jv mx = get_arg(&a, 1, "maxsplit", jv_int(-1));
        if (sep.t != JV_NONE && !str_arg(r, sep, "split separator")) return false;
        if (mx.t != JV_INT) return epyq_jj_fail(r, "maxsplit must be an integer");
        return split(r, self, sep, mx.u.i, f->id == M_RSPLIT, out);
    }
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP: {
        jv chars = get_arg(&a, 0, "chars", jv_none());
        int which = f->id == M_STRIP ? 3 : f->id == M_LSTRIP ? 1 : 2;
        if (chars.t == JV_NONE) *out = epyq_jj_str_strip(self, NULL, 0, which);
        else if (str_arg(r, chars, "strip")) *out = epyq_jj_str_strip(self, chars.u.s.p, chars.u.s.n, which);
        else return false;
        return true;
    }
    case M_REPLACE: {
        jv old = get_arg(&a, 0, "old", jv_undef("old")), new = get_arg(&a, 1, "new", jv_undef("new"));
        jv cnt = get_arg(&a, 2, "count", jv_int(-1));
        if (!str_arg(r, old, "replace") || !str_arg(r, new, "replace")) return false;
        if (cnt.t != JV_INT) return epyq_jj_fail(r, "replace count must be an integer");
        return str_replace(r, self, old, new, cnt.u.i, out);
    }
    case M_UPPER:
    case M_LOWER:
    case M_TITLE:
    case M_CAPITALIZE: {
        /* Same mapping as the filters of the same names. */
        static const char *const fnames[] = {"upper", "lower", "title", "capitalize"};
        int fid = epyq_jj_filter_id(fnames[f->id - M_UPPER]);
        return epyq_jj_apply_filter(r, NULL, fid, &self, NULL, 1, out);
    }
    case M_FIND:
    case M_RFIND:
    case M_STR_COUNT: {
        if (!str_arg(r, a0, f->id == M_STR_COUNT ? "count" : "find")) return false;
        const char *p = self.u.s.p, *q = a0.u.s.p;
        size_t n = self.u.s.n, m = a0.u.s.n;
        if (f->id == M_STR_COUNT) {
            int64_t c = 0;
            if (!m) c = (int64_t)epyq_jj_utf8_len(p, n) + 1;
            else
                for (const char *h = p; (h = memmem(h, n - (size_t)(h - p), q, m)) != NULL; h += m) c++;
            *out = jv_int(c);
            return true;
        }
        int64_t pos = -1;
        if (f->id == M_FIND) {
            const char *h = m ? memmem(p, n, q, m) : p;
            if (h) pos = (int64_t)epyq_jj_utf8_len(p, (size_t)(h - p));
        } else if (m <= n) {
            for (size_t at = n - m + 1; at-- > 0;)
                if (!memcmp(p + at, q, m)) {
                    pos = (int64_t)epyq_jj_utf8_len(p, at);
                    break;
                }
        }
        *out = jv_int(pos);
        return true;
    }
    case M_JOIN: {
        jlist *l;
        if (!epyq_jj_iter_list(r, a0, &l)) return false;
        epyq_sbuf b = {.max = r->max_output};
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].t != JV_STR) {
                epyq_sbuf_free(&b);
                return epyq_jj_fail(r, "sequence item %zu: expected str instance, %s found", i, epyq_jj_type_name(l->v[i]));
            }
            if ((i && !epyq_sbuf_add(&b, self.u.s.p, self.u.s.n)) || !epyq_sbuf_add(&b, l->v[i].u.s.p, l->v[i].u.s.n)) {
                epyq_sbuf_free(&b);
                return epyq_jj_nomem(r);
            }
        }
        return epyq_jj_str_from_buf(r, &b, out);
    }
    case M_SPLITLINES: return splitlines(r, self, epyq_jj_truthy(get_arg(&a, 0, "keepends", jv_bool(false))), out);
    case M_ISDIGIT:
    case M_ISALPHA:
    case M_ISSPACE:
    case M_ISALNUM:
    case M_ISUPPER:
    case M_ISLOWER: *out = jv_bool(char_class(self, f->id)); return true;
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX: {
        if (!str_arg(r, a0, func_name(f))) return false;
        bool b;
        if (!affix_match(r, self, a0, f->id == M_REMOVESUFFIX, &b)) return false;
        *out = self;
        if (b) {
            out->u.s.n -= a0.u.s.n;
            if (f->id == M_REMOVEPREFIX) out->u.s.p += a0.u.s.n;
        }
        return true;
    }
    case M_STR_UNSUPPORTED: return epyq_jj_fail(r, "str.%s() is not supported by this template engine", func_name(f));
    case M_ITEMS:
    case M_KEYS:
    case M_VALUES: return dict_view(r, self, f->id, out);
    case M_GET: {
        jv *v = epyq_jj_dict_get(self.u.d, a0);
        *out = v ? *v : get_arg(&a, 1, "default", jv_none());
        return true;
    }
    case M_COPY: *out = self; return true; /* values are immutable to templates */
    case M_LIST_INDEX:
    case M_LIST_COUNT: {
        int64_t c = 0;
        for (size_t i = 0; i < self.u.l->n; i++)
            if (epyq_jj_equal(self.u.l->v[i], a0)) {
                if (f->id == M_LIST_INDEX) {
                    *out = jv_int((int64_t)i);
                    return true;
                }
                c++;
            }
        if (f->id == M_LIST_INDEX) return epyq_jj_fail(r, "value is not in list");
        *out = jv_int(c);
        return true;
    }
    case M_UNSAFE:
        return epyq_jj_fail(r, "access to attribute '%s' of '%s' object is unsafe.", func_name(f), epyq_jj_type_name(self));
    case M_CYCLE:
        if (!nargs) return epyq_jj_fail(r, "no items for cycling given");
        *out = args[self.u.loop->idx % nargs];
        return true;
    case G_RAISE: {
        /* The template's own message, verbatim: callers show it to the user. */
        epyq_sbuf b = {.max = 4096};
        epyq_jj_to_str(&b, a0);
        if (r->err && r->err->code == EPYQ_OK)
            epyq_err_set(r->err, EPYQ_E_TEMPLATE, "%s", b.p ? b.p : "");
        epyq_sbuf_free(&b);
        return false;
    }
    case G_NAMESPACE:
    case G_DICT: return kwargs_dict(r, &a, f->id == G_NAMESPACE, out);
    case G_RANGE: return do_range(r, &a, out);
    case G_STRFTIME: {
        if (!str_arg(r, a0, "strftime_now")) return false;
        char fmt[256], buf[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)a0.u.s.n, a0.u.s.p);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        char *s = epyq_jj_strdup(&r->ar, buf, n);
        if (!s) return epyq_jj_nomem(r);
        *out = jv_str(s, n);
        return true;
    }
    }
    return epyq_jj_fail(r, "unknown built-in");
}
