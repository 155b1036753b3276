/* src/load/json.c — strict JSON parsing on top of cJSON (see json.h). */
#include "load/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

bool epyq_utf8_valid(const uint8_t *s, size_t n, size_t *bad_at) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1Fu, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0Fu, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07u, min = 0x10000;
        else goto bad;
        if (n - i < len) goto bad;
        for (size_t j = 1; j < len; j++) {
            if ((s[i + j] & 0xC0) != 0x80) goto bad;
            cp = (cp << 6) | (s[i + j] & 0x3Fu);
        }
        /* Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8. */
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto bad;
        i += len;
    }
    return true;
bad:
    if (bad_at) *bad_at = i;
    return false;
}

static int cmp_cstr_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Walk the tree and find the first object with a repeated key. Depth is bounded by cJSON's
 * nesting limit, so the recursion is too. */
static const char *find_duplicate(const cJSON *it) {
    if (!cJSON_IsObject(it) && !cJSON_IsArray(it)) return NULL;
    size_t n = 0;
    for (const cJSON *c = it->child; c; c = c->next) {
        const char *d = find_duplicate(c);
        if (d) return d;
        n++;
    }
    if (!cJSON_IsObject(it) || n < 2) return NULL;
    if (n <= 16) { /* small objects (configs): a quadratic scan beats sorting */
        for (const cJSON *a = it->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (!strcmp(a->string, b->string)) return a->string;
        return NULL;
    }
    const char **keys = malloc(n * sizeof *keys);
    if (!keys) return ""; /* reported as an allocation failure by the caller */
    size_t k = 0;
    for (const cJSON *c = it->child; c; c = c->next) keys[k++] = c->string;
    qsort(keys, n, sizeof *keys, cmp_cstr_ptr);
    const char *dup = NULL;
    for (size_t i = 1; i < n && !dup; i++)
        if (!strcmp(keys[i - 1], keys[i])) dup = keys[i];
    free(keys);
    return dup;
}

epyq_status epyq_json_parse(cJSON **out, const char *text, size_t len, const char *label, epyq_err *err) {
    *out = NULL;
    size_t bad;
    if (!epyq_utf8_valid((const uint8_t *)text, len, &bad))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: JSON is not valid UTF-8 (bad byte at offset %zu)", label, bad);
    /* JSON forbids raw control characters; refusing them up front also keeps NUL bytes from
     * silently cutting a key short inside cJSON. */
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r')
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: control character 0x%02x at offset %zu in JSON", label, c, i);
    }
    size_t lead = 0;
    while (lead < len && (text[lead] == ' ' || text[lead] == '\t' || text[lead] == '\n' || text[lead] == '\r')) lead++;
    if (lead == len || text[lead] != '{')
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: expected a JSON object, found %s", label,
                            lead == len ? "nothing" : "another value");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        const char *ep = cJSON_GetErrorPtr();
        if (ep && ep >= text && ep <= text + len) at = (size_t)(ep - text);
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: malformed JSON near offset %zu", label, at);
    }
    for (const char *p = end; p < text + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: unexpected data after the JSON object at offset %zu",
                                label, (size_t)(p - text));
        }
    }
    const char *dup = find_duplicate(root);
    if (dup) {
        epyq_status st = *dup ? epyq_err_set(err, EPYQ_E_FORMAT, "%s: duplicate key \"%.200s\"", label, dup)
                              : epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory checking keys", label);
        cJSON_Delete(root);
        return st;
    }
    *out = root;
    return EPYQ_OK;
}

const char *epyq_json_type_name(const cJSON *it) {
    if (!it) return "nothing";
    if (cJSON_IsNull(it)) return "null";
    if (cJSON_IsBool(it)) return "a boolean";
    if (cJSON_IsNumber(it)) return "a number";
    if (cJSON_IsString(it)) return "a string";
    if (cJSON_IsArray(it)) return "an array";
    if (cJSON_IsObject(it)) return "an object";
    return "an invalid value";
}

bool epyq_json_as_int(const cJSON *it, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(it)) return false;
    double v = it->valuedouble;
    if (!isfinite(v) || v != floor(v) || v > (double)EPYQ_JSON_INT_MAX || v < -(double)EPYQ_JSON_INT_MAX)
        return false;
    int64_t i = (int64_t)v;
    if (i < lo || i > hi) return false;
    *out = i;
    return true;
}

static const cJSON *lookup(const cJSON *obj, const char *key, bool *found) {
    const cJSON *it = cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (it && cJSON_IsNull(it)) it = NULL;
    if (found) *found = it != NULL;
    return it;
}

epyq_status epyq_json_get_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                              bool *found, const char *label, epyq_err *err) {
    const cJSON *it = lookup(obj, key, found);
    if (!it) return EPYQ_OK;
    if (!epyq_json_as_int(it, lo, hi, out)) {
        if (cJSON_IsNumber(it))
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: %s: expected an integer in [%lld, %lld], found %.17g",
                                label, key, (long long)lo, (long long)hi, it->valuedouble);
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: %s: expected an integer, found %s", label, key,
                            epyq_json_type_name(it));
    }
    return EPYQ_OK;
}

epyq_status epyq_json_get_num(const cJSON *obj, const char *key, double lo, double hi, double *out,
                              bool *found, const char *label, epyq_err *err) {
    const cJSON *it = lookup(obj, key, found);
    if (!it) return EPYQ_OK;
    if (!cJSON_IsNumber(it))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: %s: expected a number, found %s", label, key,
                            epyq_json_type_name(it));
    double v = it->valuedouble;
    if (!isfinite(v) || v < lo || v > hi)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: %s: expected a number in [%g, %g], found %g", label, key,
                            lo, hi, v);
    *out = v;
    return EPYQ_OK;
}

epyq_status epyq_json_get_bool(const cJSON *obj, const char *key, bool *out, bool *found, const char *label,
                               epyq_err *err) {
    const cJSON *it = lookup(obj, key, found);
    if (!it) return EPYQ_OK;
    if (!cJSON_IsBool(it))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: %s: expected true or false, found %s", label, key,
                            epyq_json_type_name(it));
    *out = cJSON_IsTrue(it);
    return EPYQ_OK;
}

epyq_status epyq_json_get_str(const cJSON *obj, const char *key, const char **out, bool *found,
                              const char *label, epyq_err *err) {
    const cJSON *it = lookup(obj, key, found);
    if (!it) return EPYQ_OK;
    if (!cJSON_IsString(it))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: %s: expected a string, found %s", label, key,
                            epyq_json_type_name(it));
    *out = it->valuestring;
    return EPYQ_OK;
}
