/* src/chat/jinja_value.c — template values with Python's semantics: containers, conversion
 * from cJSON, truth, equality, ordering, str()/repr() and transformers' tojson. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_int.h"
#include "chat/pyjson.h"

bool epyq_jj_fail(jrender *r, const char *fmt, ...) {
    if (r->err && r->err->code != EPYQ_OK) return false; /* keep the first (innermost) error */
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = r->at ? r->at->line : 0, col = r->at ? r->at->col : 0;
    epyq_err_set(r->err, EPYQ_E_TEMPLATE, "%s:%d:%d: %s", r->tpl->name, line, col, msg);
    return false;
}

bool epyq_jj_nomem(jrender *r) { return epyq_jj_fail(r, "template render exceeded its memory limit"); }

bool epyq_jj_count_step(jrender *r) {
    if (++r->steps > r->max_steps)
        return epyq_jj_fail(r, "template render exceeded %llu evaluation steps", (unsigned long long)r->max_steps);
    return true;
}

jlist *epyq_jj_list_new(jj_arena *a, size_t cap) {
    jlist *l = epyq_jj_alloc(a, sizeof *l);
    if (!l) return NULL;
    if (cap) {
        l->v = epyq_jj_alloc_array(a, cap, sizeof *l->v);
        if (!l->v) return NULL;
        l->cap = cap;
    }
    return l;
}

bool epyq_jj_list_push(jj_arena *a, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *nv = epyq_jj_alloc_array(a, cap, sizeof *nv);
        if (!nv) return false;
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return true;
}

jdict *epyq_jj_dict_new(jj_arena *a, size_t cap) {
    jdict *d = epyq_jj_alloc(a, sizeof *d);
    if (!d) return NULL;
    if (cap) {
        d->k = epyq_jj_alloc_array(a, cap, sizeof *d->k);
        d->v = epyq_jj_alloc_array(a, cap, sizeof *d->v);
        if (!d->k || !d->v) return NULL;
        d->cap = cap;
    }
    return d;
}

jv *epyq_jj_dict_get(const jdict *d, jv k) {
    for (size_t i = 0; i < d->n; i++)
        if (epyq_jj_equal(d->k[i], k)) return &d->v[i];
    return NULL;
}

jv *epyq_jj_dict_get_str(const jdict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, k, n)) return &d->v[i];
    return NULL;
}

bool epyq_jj_dict_set(jj_arena *a, jdict *d, jv k, jv v) {
    jv *old = epyq_jj_dict_get(d, k);
    if (old) {
        *old = v;
        return true;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jv *nk = epyq_jj_alloc_array(a, cap, sizeof *nk), *nv = epyq_jj_alloc_array(a, cap, sizeof *nv);
        if (!nk || !nv) return false;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return true;
}

jv epyq_jj_from_cjson(jrender *r, const cJSON *x, int depth, bool *ok) {
    if (!x || cJSON_IsNull(x)) return jv_none();
    if (depth > 200) {
        *ok = epyq_jj_fail(r, "JSON input nested deeper than 200 levels");
        return jv_none();
    }
    if (cJSON_IsTrue(x)) return jv_bool(true);
    if (cJSON_IsFalse(x)) return jv_bool(false);
    if (cJSON_IsNumber(x)) {
        /* cJSON keeps only a double: integral values become ints, as JSON ints would. */
        double d = x->valuedouble;
        if (d == floor(d) && fabs(d) < 9.2233720368547758e18) return jv_int((int64_t)d);
        return jv_float(d);
    }
    if (cJSON_IsString(x) || cJSON_IsRaw(x)) {
        const char *s = x->valuestring ? x->valuestring : "";
        return jv_str(s, strlen(s)); /* borrowed: the cJSON tree outlives the render */
    }
    if (cJSON_IsArray(x)) {
        jlist *l = epyq_jj_list_new(&r->ar, (size_t)cJSON_GetArraySize(x));
        if (!l) {
            *ok = epyq_jj_nomem(r);
            return jv_none();
        }
        for (const cJSON *c = x->child; c && *ok; c = c->next)
            if (!epyq_jj_list_push(&r->ar, l, epyq_jj_from_cjson(r, c, depth + 1, ok))) *ok = epyq_jj_nomem(r);
        return (jv){.t = JV_LIST, .u.l = l};
    }
    if (cJSON_IsObject(x)) {
        jdict *d = epyq_jj_dict_new(&r->ar, (size_t)cJSON_GetArraySize(x));
        if (!d) {
            *ok = epyq_jj_nomem(r);
            return jv_none();
        }
        for (const cJSON *c = x->child; c && *ok; c = c->next) {
            const char *k = c->string ? c->string : "";
            /* A repeated key keeps its first position and its last value, as json.loads does. */
            if (!epyq_jj_dict_set(&r->ar, d, jv_str(k, strlen(k)), epyq_jj_from_cjson(r, c, depth + 1, ok)))
                *ok = epyq_jj_nomem(r);
        }
        return (jv){.t = JV_DICT, .u.d = d};
    }
    return jv_none();
}

bool epyq_jj_truthy(jv v) {
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s.n > 0;
    case JV_LIST: return v.u.l->n > 0;
    case JV_DICT: return v.u.d->n > 0;
    default: return true;
    }
}

static bool is_num(jv v) { return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT; }
static double num_f(jv v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : v.u.b; }
static int64_t num_i(jv v) { return v.t == JV_INT ? v.u.i : v.u.b; }

bool epyq_jj_equal(jv a, jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.t == JV_FLOAT || b.t == JV_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case JV_LIST:
        if (a.tuple != b.tuple || a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!epyq_jj_equal(a.u.l->v[i], b.u.l->v[i])) return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv *o = epyq_jj_dict_get(b.u.d, a.u.d->k[i]);
            if (!o || !epyq_jj_equal(a.u.d->v[i], *o)) return false;
        }
        return true;
    case JV_NS: return a.u.d == b.u.d;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_FUNC: return a.u.fn == b.u.fn;
    case JV_LOOP: return a.u.loop == b.u.loop;
    default: return false;
    }
}

const char *epyq_jj_type_name(jv v) {
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "builtin_function_or_method";
    default: return "LoopContext";
    }
}

bool epyq_jj_compare(jrender *r, jv a, jv b, int *cmp) {
    if (is_num(a) && is_num(b)) {
        if (a.t == JV_FLOAT || b.t == JV_FLOAT) {
            double x = num_f(a), y = num_f(b);
            *cmp = x < y ? -1 : x > y ? 1 : 0; /* NaN compares as equal-ish: both false in Python */
        } else {
            int64_t x = num_i(a), y = num_i(b);
            *cmp = x < y ? -1 : x > y ? 1 : 0;
        }
        return true;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        /* UTF-8 byte order is code point order. */
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = n ? memcmp(a.u.s.p, b.u.s.p, n) : 0;
        *cmp = c ? (c < 0 ? -1 : 1) : a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n ? 1 : 0;
        return true;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.tuple == b.tuple) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (epyq_jj_equal(a.u.l->v[i], b.u.l->v[i])) continue;
            return epyq_jj_compare(r, a.u.l->v[i], b.u.l->v[i], cmp);
        }
        *cmp = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n ? 1 : 0;
        return true;
    }
    if (a.t == JV_UNDEF || b.t == JV_UNDEF) {
        jv u = a.t == JV_UNDEF ? a : b;
        return epyq_jj_fail(r, "'%.*s' is undefined", (int)u.u.s.n, u.u.s.p ? u.u.s.p : "");
    }
    return epyq_jj_fail(r, "'<' not supported between instances of '%s' and '%s'", epyq_jj_type_name(a), epyq_jj_type_name(b));
}

/* Python repr() of a str: single quotes unless the text has ' and no ". */
static bool repr_str(epyq_sbuf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    if (!epyq_sbuf_addc(b, q)) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        bool ok;
        if (c == (unsigned char)q || c == '\\') ok = epyq_sbuf_addc(b, '\\') && epyq_sbuf_addc(b, (char)c);
        else if (c == '\n') ok = epyq_sbuf_adds(b, "\\n");
        else if (c == '\r') ok = epyq_sbuf_adds(b, "\\r");
        else if (c == '\t') ok = epyq_sbuf_adds(b, "\\t");
        else if (c < 0x20 || c == 0x7f) ok = epyq_sbuf_printf(b, "\\x%02x", c);
        else ok = epyq_sbuf_addc(b, (char)c);
        if (!ok) return false;
    }
    return epyq_sbuf_addc(b, q);
}

/* The containers being printed, outermost first. A template can put a value inside itself
 * ({% set ns.a = ns %}): like Python's repr, a list or dict met again on its own path prints
 * as [...] or {...}; past REPR_DEPTH levels of (acyclic) nesting the same marker stands in,
 * so printing never recurses without bound. */
enum { REPR_DEPTH = 200 };
typedef struct {
    const void *on[REPR_DEPTH];
    int n;
} repr_path;

static bool repr_seen(const repr_path *path, const void *c) {
    if (path->n >= REPR_DEPTH) return true;
    for (int i = 0; i < path->n; i++)
        if (path->on[i] == c) return true;
    return false;
}

static bool str_or_repr_at(epyq_sbuf *b, jv v, bool repr, repr_path *path) {
    char tmp[48];
    switch (v.t) {
    case JV_UNDEF: return repr ? epyq_sbuf_adds(b, "Undefined") : true; /* str() is "" */
    case JV_NONE: return epyq_sbuf_adds(b, "None");
    case JV_BOOL: return epyq_sbuf_adds(b, v.u.b ? "True" : "False");
    case JV_INT: return epyq_sbuf_printf(b, "%lld", (long long)v.u.i);
    case JV_FLOAT:
        epyq_py_float_repr(tmp, sizeof tmp, v.u.f);
        return epyq_sbuf_adds(b, tmp);
    case JV_STR: return repr ? repr_str(b, v.u.s.p, v.u.s.n) : epyq_sbuf_add(b, v.u.s.p, v.u.s.n);
    case JV_LIST: {
        if (repr_seen(path, v.u.l)) return epyq_sbuf_adds(b, v.tuple ? "(...)" : "[...]");
        path->on[path->n++] = v.u.l;
        bool ok = epyq_sbuf_addc(b, v.tuple ? '(' : '[');
        for (size_t i = 0; ok && i < v.u.l->n; i++)
            ok = (!i || epyq_sbuf_add(b, ", ", 2)) && str_or_repr_at(b, v.u.l->v[i], true, path);
        path->n--;
        if (ok && v.tuple && v.u.l->n == 1) ok = epyq_sbuf_addc(b, ',');
        return ok && epyq_sbuf_addc(b, v.tuple ? ')' : ']');
    }
    case JV_DICT:
    case JV_NS: {
        if (v.t == JV_NS && !epyq_sbuf_adds(b, "<Namespace ")) return false;
        bool ok;
        if (repr_seen(path, v.u.d)) {
            ok = epyq_sbuf_adds(b, "{...}");
        } else {
            path->on[path->n++] = v.u.d;
            ok = epyq_sbuf_addc(b, '{');
            for (size_t i = 0; ok && i < v.u.d->n; i++)
                ok = (!i || epyq_sbuf_add(b, ", ", 2)) &&
                     str_or_repr_at(b, v.u.d->k[i], true, path) && epyq_sbuf_add(b, ": ", 2) &&
                     str_or_repr_at(b, v.u.d->v[i], true, path);
            path->n--;
            ok = ok && epyq_sbuf_addc(b, '}');
        }
        return ok && (v.t != JV_NS || epyq_sbuf_addc(b, '>'));
    }
    case JV_MACRO: return epyq_sbuf_printf(b, "<Macro '%s'>", v.u.m->def->name);
    case JV_FUNC: return epyq_sbuf_adds(b, "<built-in method>");
    default: return epyq_sbuf_adds(b, "<LoopContext>");
    }
}

static bool str_or_repr(epyq_sbuf *b, jv v, bool repr) {
    repr_path path = {.n = 0};
    return str_or_repr_at(b, v, repr, &path);
}

bool epyq_jj_to_str(epyq_sbuf *b, jv v) { return str_or_repr(b, v, false); }
bool epyq_jj_repr(epyq_sbuf *b, jv v) { return str_or_repr(b, v, true); }

bool epyq_jj_str_from_buf(jrender *r, epyq_sbuf *b, jv *out) {
    char *s = epyq_jj_strdup(&r->ar, b->p ? b->p : "", b->len);
    size_t n = b->len;
    epyq_sbuf_free(b);
    if (!s) return epyq_jj_nomem(r);
    *out = jv_str(s, n);
    return true;
}

bool epyq_jj_stringify(jrender *r, jv v, jv *out) {
    if (v.t == JV_STR) {
        *out = v;
        return true;
    }
    epyq_sbuf b = {.max = r->max_output};
    if (!epyq_jj_to_str(&b, v)) {
        epyq_sbuf_free(&b);
        return epyq_jj_nomem(r);
    }
    return epyq_jj_str_from_buf(r, &b, out);
}

static bool newline_indent(epyq_sbuf *b, int indent, int level) {
    if (!epyq_sbuf_addc(b, '\n')) return false;
    for (int i = 0; i < indent * level; i++)
        if (!epyq_sbuf_addc(b, ' ')) return false;
    return true;
}

static bool tojson_at(jrender *r, epyq_sbuf *b, jv v, int indent, bool sort_keys, int level) {
    if (level > 200) return epyq_jj_fail(r, "tojson: value nested deeper than 200 levels");
    bool ok = true;
    switch (v.t) {
    case JV_NONE: ok = epyq_sbuf_adds(b, "null"); break;
    case JV_BOOL: ok = epyq_sbuf_adds(b, v.u.b ? "true" : "false"); break;
    case JV_INT: ok = epyq_sbuf_printf(b, "%lld", (long long)v.u.i); break;
    case JV_FLOAT: ok = epyq_pyjson_float(b, v.u.f); break;
    case JV_STR: ok = epyq_pyjson_str(b, v.u.s.p, v.u.s.n); break;
    case JV_LIST: {
        if (!v.u.l->n) {
            ok = epyq_sbuf_adds(b, "[]");
            break;
        }
        ok = epyq_sbuf_addc(b, '[');
        for (size_t i = 0; ok && i < v.u.l->n; i++) {
            if (i) ok = indent >= 0 ? epyq_sbuf_addc(b, ',') : epyq_sbuf_add(b, ", ", 2);
            if (ok && indent >= 0) ok = newline_indent(b, indent, level + 1);
            if (ok && !tojson_at(r, b, v.u.l->v[i], indent, sort_keys, level + 1)) return false;
        }
        if (ok && indent >= 0) ok = newline_indent(b, indent, level);
        ok = ok && epyq_sbuf_addc(b, ']');
        break;
    }
    case JV_DICT: {
        jdict *d = v.u.d;
        if (!d->n) {
            ok = epyq_sbuf_adds(b, "{}");
            break;
        }
        size_t *order = epyq_jj_alloc_array(&r->ar, d->n, sizeof *order);
        if (!order) return epyq_jj_nomem(r);
        for (size_t i = 0; i < d->n; i++) {
            if (d->k[i].t != JV_STR && d->k[i].t != JV_INT && d->k[i].t != JV_FLOAT && d->k[i].t != JV_BOOL &&
                d->k[i].t != JV_NONE)
                return epyq_jj_fail(r, "tojson: keys must be str, int, float, bool or None, not %s", epyq_jj_type_name(d->k[i]));
            order[i] = i;
        }
        if (sort_keys) /* insertion sort: dicts in templates are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0; j--) {
                    int c = 0;
                    if (!epyq_jj_compare(r, d->k[order[j - 1]], d->k[order[j]], &c)) return false;
                    if (c <= 0) break;
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        ok = epyq_sbuf_addc(b, '{');
        for (size_t i = 0; ok && i < d->n; i++) {
            jv k = d->k[order[i]];
            if (i) ok = indent >= 0 ? epyq_sbuf_addc(b, ',') : epyq_sbuf_add(b, ", ", 2);
            if (ok && indent >= 0) ok = newline_indent(b, indent, level + 1);
            if (!ok) break;
            if (k.t == JV_STR) {
                ok = epyq_pyjson_str(b, k.u.s.p, k.u.s.n);
            } else {
                /* json.dumps turns non-string keys into their JSON spelling, quoted. */
                epyq_sbuf kb = {0};
                ok = tojson_at(r, &kb, k, -1, false, level + 1) && epyq_pyjson_str(b, kb.p, kb.len);
                epyq_sbuf_free(&kb);
            }
            ok = ok && epyq_sbuf_add(b, ": ", 2);
            if (ok && !tojson_at(r, b, d->v[order[i]], indent, sort_keys, level + 1)) return false;
        }
        if (ok && indent >= 0) ok = newline_indent(b, indent, level);
        ok = ok && epyq_sbuf_addc(b, '}');
        break;
    }
    case JV_UNDEF:
        /* json.dumps cannot serialise jinja2's Undefined. */
        return epyq_jj_fail(r, "Object of type Undefined is not JSON serializable");
    default: return epyq_jj_fail(r, "Object of type %s is not JSON serializable", epyq_jj_type_name(v));
    }
    return ok ? true : epyq_jj_nomem(r);
}

bool epyq_jj_tojson(jrender *r, epyq_sbuf *b, jv v, int indent, bool sort_keys) {
    return tojson_at(r, b, v, indent, sort_keys, 0);
}
