/* src/chat/toolcall_value.c — converting one tool-call parameter value by its schema type, the
 * way vLLM's qwen3_coder parser does with Python's int(), float(), json.loads and
 * ast.literal_eval (a literal subset: numbers, strings, True/False/None, lists, tuples, dicts). */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chat/pyjson.h"
#include "chat/toolcall.h"

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Copies the number text without underscores, checking Python's rules (digits only between
 * underscores). The result is NUL-terminated in out (size >= n+1). */
static bool strip_underscores(const char *s, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '_') {
            if (i == 0 || i + 1 >= n || !isdigit((unsigned char)s[i - 1]) || !isdigit((unsigned char)s[i + 1])) return false;
            continue;
        }
        out[k++] = s[i];
    }
    out[k] = '\0';
    return true;
}

static void trim(const char **s, size_t *n) {
    while (*n && is_ws(**s)) (*s)++, (*n)--;
    while (*n && is_ws((*s)[*n - 1])) (*n)--;
}

/* Python int(str) for base 10: sign, digits (with single underscores), surrounding space. */
static bool py_int(const char *s, size_t n, double *out) {
    trim(&s, &n);
    char buf[400];
    if (!n || n >= sizeof buf || !strip_underscores(s, n, buf)) return false;
    const char *p = buf;
    if (*p == '+' || *p == '-') p++;
    if (!*p) return false;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return false;
    *out = strtod(buf, NULL);
    return true;
}

/* Python float(str): decimal forms and inf/infinity/nan (any case), no hex. */
static bool py_float(const char *s, size_t n, double *out) {
    trim(&s, &n);
    char buf[400];
    if (!n || n >= sizeof buf || !strip_underscores(s, n, buf)) return false;
    const char *p = buf;
    if (*p == '+' || *p == '-') p++;
    if (!strcasecmp(p, "inf") || !strcasecmp(p, "infinity") || !strcasecmp(p, "nan")) {
        *out = strtod(buf, NULL);
        return true;
    }
    bool digits = false;
    while (isdigit((unsigned char)*p)) p++, digits = true;
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p)) p++, digits = true;
    }
    if (!digits) return false;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!isdigit((unsigned char)*p)) return false;
        while (isdigit((unsigned char)*p)) p++;
    }
    if (*p) return false;
    *out = strtod(buf, NULL);
    return true;
}

/* ---- a small ast.literal_eval ------------------------------------------------------------ */

typedef struct {
    const char *s;
    size_t n, i;
    int depth;
} lit;

static void lit_ws(lit *L) {
    while (L->i < L->n && is_ws(L->s[L->i])) L->i++;
}

static cJSON *lit_value(lit *L);

static cJSON *lit_string(lit *L) {
    epyq_sbuf b = {0};
    bool ok = true;
    /* Adjacent literals concatenate: 'a' "b" == 'ab'. */
    while (ok && L->i < L->n && (L->s[L->i] == '\'' || L->s[L->i] == '"')) {
        char q = L->s[L->i++];
        bool closed = false;
        while (ok && L->i < L->n) {
            char c = L->s[L->i++];
            if (c == q) {
                closed = true;
                break;
            }
            if (c == '\n') break; /* single-quoted literals cannot span lines */
            if (c != '\\' || L->i >= L->n) {
                ok = epyq_sbuf_addc(&b, c);
                continue;
            }
            char e = L->s[L->i++];
            const char *map = strchr("nrtabfv\\'\"", e);
            static const char out[] = "\n\r\t\a\b\f\v\\'\"";
            if (map && e) ok = epyq_sbuf_addc(&b, out[map - "nrtabfv\\'\""]);
            else if (e == '\n') continue;
            else ok = epyq_sbuf_addc(&b, '\\') && epyq_sbuf_addc(&b, e); /* kept, as Python does */
        }
        ok = ok && closed;
        lit_ws(L);
    }
    cJSON *v = ok ? cJSON_CreateString(b.p ? b.p : "") : NULL;
    epyq_sbuf_free(&b);
    return v;
}

static cJSON *lit_number(lit *L) {
    size_t start = L->i;
    if (L->s[L->i] == '+' || L->s[L->i] == '-') L->i++;
    while (L->i < L->n && (isalnum((unsigned char)L->s[L->i]) || L->s[L->i] == '.' || L->s[L->i] == '_' ||
                           ((L->s[L->i] == '+' || L->s[L->i] == '-') && (L->s[L->i - 1] == 'e' || L->s[L->i - 1] == 'E'))))
        L->i++;
    double d;
    const char *t = L->s + start;
    size_t n = L->i - start;
    /* Python literals have no inf/nan: only digits, '.', signs, e/E and '_' may appear. */
    bool plain = true;
    for (size_t i = 0; i < n; i++)
        if (isalpha((unsigned char)t[i]) && t[i] != 'e' && t[i] != 'E') plain = false;
    if (plain && (py_int(t, n, &d) || py_float(t, n, &d)))
        return cJSON_CreateNumber(d);
    return NULL;
}

static cJSON *lit_seq(lit *L, char close, bool dict) {
    cJSON *v = dict ? cJSON_CreateObject() : cJSON_CreateArray();
    L->i++; /* opener */
    for (;;) {
        lit_ws(L);
        if (L->i < L->n && L->s[L->i] == close) {
            L->i++;
            return v;
        }
        cJSON *k = lit_value(L);
        if (!k) break;
        if (dict) {
            lit_ws(L);
            if (!cJSON_IsString(k) || L->i >= L->n || L->s[L->i] != ':') {
                /* non-string keys would not survive json.dumps the same way; refuse */
                cJSON_Delete(k);
                break;
            }
            L->i++;
            cJSON *val = lit_value(L);
            if (!val) {
                cJSON_Delete(k);
                break;
            }
            if (cJSON_GetObjectItemCaseSensitive(v, k->valuestring))
                cJSON_ReplaceItemInObjectCaseSensitive(v, k->valuestring, val);
            else
                cJSON_AddItemToObject(v, k->valuestring, val);
            cJSON_Delete(k);
        } else {
            cJSON_AddItemToArray(v, k);
        }
        lit_ws(L);
        if (L->i < L->n && L->s[L->i] == ',') {
            L->i++;
            continue;
        }
        if (L->i < L->n && L->s[L->i] == close) {
            L->i++;
            return v;
        }
        break;
    }
    cJSON_Delete(v);
    return NULL;
}

static cJSON *lit_value(lit *L) {
    lit_ws(L);
    if (L->i >= L->n || ++L->depth > 100) return NULL;
    cJSON *v = NULL;
    char c = L->s[L->i];
    if (c == '\'' || c == '"') v = lit_string(L);
    else if (c == '[') v = lit_seq(L, ']', false);
    else if (c == '(') v = lit_seq(L, ')', false);
    else if (c == '{') v = lit_seq(L, '}', true);
    else if (isdigit((unsigned char)c) || c == '-' || c == '+' || c == '.') v = lit_number(L);
    else {
        static const char *const words[] = {"True", "False", "None"};
        for (int k = 0; k < 3 && !v; k++) {
            size_t m = strlen(words[k]);
            if (L->n - L->i >= m && !memcmp(L->s + L->i, words[k], m) &&
                (L->i + m == L->n || !(isalnum((unsigned char)L->s[L->i + m]) || L->s[L->i + m] == '_'))) {
                L->i += m;
                v = k == 2 ? cJSON_CreateNull() : cJSON_CreateBool(k == 0);
            }
        }
    }
    L->depth--;
    return v;
}

static cJSON *literal_eval(const char *s, size_t n) {
    lit L = {.s = s, .n = n};
    while (L.i < n && (s[L.i] == ' ' || s[L.i] == '\t')) L.i++;
    cJSON *v = lit_value(&L);
    lit_ws(&L);
    if (v && L.i != n) {
        cJSON_Delete(v);
        v = NULL;
    }
    return v;
}

/* ---- the conversion ---------------------------------------------------------------------- */

static cJSON *string_value(const char *s, size_t n) {
    char *t = strndup(s, n);
    cJSON *v = t ? cJSON_CreateString(t) : NULL;
    free(t);
    return v;
}

static bool type_is(const char *t, const char *const *names) {
    for (; *names; names++)
        if (!strcmp(t, *names)) return true;
    return false;
}

static bool type_starts(const char *t, const char *const *prefixes) {
    for (; *prefixes; prefixes++)
        if (!strncmp(t, *prefixes, strlen(*prefixes))) return true;
    return false;
}

cJSON *epyq_toolcall_convert(const char *value, size_t n, const cJSON *schema) {
    if (n == 4 && !strncasecmp(value, "null", 4)) return cJSON_CreateNull();
    if (!schema) return string_value(value, n);
    /* The type, as str(type).strip().lower(); a non-string type (a list of types) matches
     * none of the names below. */
    char type[64] = "string";
    const cJSON *t = cJSON_IsObject(schema) ? cJSON_GetObjectItemCaseSensitive(schema, "type") : NULL;
    if (t) {
        if (cJSON_IsString(t)) {
            const char *p = t->valuestring;
            size_t m = strlen(p);
            trim(&p, &m);
            if (m >= sizeof type) m = sizeof type - 1;
            for (size_t i = 0; i < m; i++) type[i] = (char)tolower((unsigned char)p[i]);
            type[m] = '\0';
        } else {
            strcpy(type, "[complex]");
        }
    }
    static const char *const STRINGS[] = {"string", "str", "text", "varchar", "char", "enum", NULL};
    static const char *const INTS[] = {"int", "uint", "long", "short", "unsigned", NULL};
    static const char *const FLOATS[] = {"num", "float", NULL};
    static const char *const BOOLS[] = {"boolean", "bool", "binary", NULL};
    static const char *const JSONS[] = {"object", "array", "arr", NULL};
    static const char *const JSON_PREFIXES[] = {"dict", "list", NULL};
    double d;
    if (type_is(type, STRINGS)) return string_value(value, n);
    if (type_starts(type, INTS)) return py_int(value, n, &d) ? cJSON_CreateNumber(d) : string_value(value, n);
    if (type_starts(type, FLOATS)) {
        /* Non-finite values fail vLLM's int() check and stay strings. */
        if (py_float(value, n, &d) && isfinite(d)) return cJSON_CreateNumber(d);
        return string_value(value, n);
    }
    if (type_is(type, BOOLS)) return cJSON_CreateBool(n == 4 && !strncasecmp(value, "true", 4));
    if (type_is(type, JSONS) || type_starts(type, JSON_PREFIXES)) {
        /* json.loads: the whole text must be one JSON value (cJSON alone would accept
         * trailing garbage, hence the copy with a terminator). */
        char *copy = strndup(value, n);
        cJSON *j = copy ? cJSON_ParseWithOpts(copy, NULL, true) : NULL;
        free(copy);
        if (j) return j;
    }
    cJSON *v = literal_eval(value, n);
    return v ? v : string_value(value, n);
}

char *epyq_toolcall_arguments_json(const cJSON *call) {
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
    epyq_sbuf b = {0};
    if (!epyq_pyjson_dump(&b, args)) {
        epyq_sbuf_free(&b);
        return NULL;
    }
    return epyq_sbuf_take(&b, NULL);
}
