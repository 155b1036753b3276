/* src/chat/jinja_tests.c — jinja2's built-in tests (`x is defined`, `is divisibleby(3)`, …), the
 * ones chat templates use. Names are resolved when the template is parsed (epyq_jj_test_id), so
 * an unknown test is a parse error with its position, as in jinja2. */
#include <stdio.h>
#include <string.h>

#include "chat/jinja_int.h"

typedef enum {
    T_DEFINED,
    T_UNDEFINED,
    T_NONE,
    T_BOOLEAN,
    T_TRUE,
    T_FALSE,
    T_INTEGER,
    T_FLOAT,
    T_NUMBER,
    T_STRING,
    T_MAPPING,
    T_SEQUENCE,
    T_ITERABLE,
    T_CALLABLE,
    T_SAMEAS,
    T_ESCAPED,
    T_ODD,
    T_EVEN,
    T_DIVISIBLEBY,
    T_IN,
    T_EQ,
    T_NE,
    T_LT,
    T_LE,
    T_GT,
    T_GE,
    T_LOWER,
    T_UPPER,
    T_FILTER,
    T_TEST,
} test_id;

static const struct {
    const char *name;
    test_id id;
} TESTS[] = {
    {"defined", T_DEFINED},
    {"undefined", T_UNDEFINED},
    {"none", T_NONE},
    {"boolean", T_BOOLEAN},
    {"true", T_TRUE},
    {"false", T_FALSE},
    {"integer", T_INTEGER},
    {"float", T_FLOAT},
    {"number", T_NUMBER},
    {"string", T_STRING},
    {"mapping", T_MAPPING},
    {"sequence", T_SEQUENCE},
    {"iterable", T_ITERABLE},
    {"callable", T_CALLABLE},
    {"sameas", T_SAMEAS},
    {"escaped", T_ESCAPED},
    {"odd", T_ODD},
    {"even", T_EVEN},
    {"divisibleby", T_DIVISIBLEBY},
    {"in", T_IN},
    {"eq", T_EQ},
    {"equalto", T_EQ},
    {"==", T_EQ},
    {"ne", T_NE},
    {"!=", T_NE},
    {"lt", T_LT},
    {"lessthan", T_LT},
    {"<", T_LT},
    {"le", T_LE},
    {"<=", T_LE},
    {"gt", T_GT},
    {"greaterthan", T_GT},
    {">", T_GT},
    {"ge", T_GE},
    {">=", T_GE},
    {"lower", T_LOWER},
    {"upper", T_UPPER},
    {"filter", T_FILTER},
    {"test", T_TEST},
};

int epyq_jj_test_id(const char *name) {
    for (size_t i = 0; i < sizeof TESTS / sizeof TESTS[0]; i++)
        if (!strcmp(TESTS[i].name, name)) return (int)TESTS[i].id;
    return -1;
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
    case T_SEQUENCE:
        *out = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
        return true;
    case T_ITERABLE:
        *out = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
        return true;
    case T_CALLABLE: *out = v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_UNDEF; return true;
    case T_ESCAPED: *out = false; return true;
    case T_SAMEAS:
        /* Python identity: small ints, None and bools are singletons; containers by pointer. */
        if (v.t != a.t) *out = false;
        else if (v.t == JV_STR)
            *out = v.u.s.p == a.u.s.p && v.u.s.n == a.u.s.n;
        else
            *out = epyq_jj_equal(v, a);
        return true;
    case T_ODD:
    case T_EVEN:
    case T_DIVISIBLEBY: {
        if (v.t != JV_INT && v.t != JV_BOOL)
            return epyq_jj_fail(r, "test expects an integer, got %s", epyq_jj_type_name(v));
        int64_t x = v.t == JV_INT ? v.u.i : v.u.b;
        if (tid == T_DIVISIBLEBY) {
            if (a.t != JV_INT || a.u.i == 0)
                return epyq_jj_fail(r, "divisibleby expects a non-zero integer");
            *out = a.u.i == -1 || x % a.u.i == 0;
        } else {
            *out = (x % 2 != 0) == (tid == T_ODD);
        }
        return true;
    }
    case T_IN: {
        /* Same rules as the `in` operator (jinja_eval.c). */
        if (a.t == JV_STR) {
            if (v.t != JV_STR)
                return epyq_jj_fail(r, "'in <string>' requires string as left operand");
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
        if (!epyq_jj_stringify(r, v, &s) ||
            !epyq_jj_map_case(r, s, tid == T_LOWER ? JJ_CASE_LOWER : JJ_CASE_UPPER, &m))
            return false;
        /* islower(): has a cased character and equals its lower-cased form (ASCII-level check). */
        bool cased = false;
        for (size_t i = 0; i < s.u.s.n; i++) {
            char ch = s.u.s.p[i];
            cased |=
                (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (unsigned char)ch >= 0x80;
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
