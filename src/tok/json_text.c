/* src/tok/json_text.c — see json_text.h. A recursive-descent JSON validator whose string
 * scanner can also decode, used to pull one string out of a JSON object byte-exactly. */
#include "tok/json_text.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tok/sbuf.h"
#include "tok/tok_internal.h"

#define MAX_DEPTH 512

typedef epyq_json_reader jp;

static epyq_status fail(jp *p, const char *expected) {
    if (p->i >= p->n) return epyq_err_set(p->err, EPYQ_E_FORMAT, "byte %zu: expected %s, found the end of the line", p->i, expected);
    uint8_t c = p->s[p->i];
    if (c >= 0x20 && c < 0x7F)
        return epyq_err_set(p->err, EPYQ_E_FORMAT, "byte %zu: expected %s, found '%c'", p->i, expected, c);
    return epyq_err_set(p->err, EPYQ_E_FORMAT, "byte %zu: expected %s, found byte 0x%02X", p->i, expected, c);
}

static void ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

static int hex4(const uint8_t *h) {
    int v = 0;
    for (int k = 0; k < 4; k++) {
        int c = h[k], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static bool put_cp(epyq_sbuf *b, uint32_t cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | cp >> 6);
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | cp >> 12);
        u[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | cp >> 18);
        u[1] = (char)(0x80 | (cp >> 12 & 0x3F));
        u[2] = (char)(0x80 | (cp >> 6 & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return epyq_sbuf_add(b, u, n);
}

/* A string at p->i (the opening quote); decoded into out when out is not NULL. */
static epyq_status string(jp *p, epyq_sbuf *out) {
    if (p->i >= p->n || p->s[p->i] != '"') return fail(p, "a string");
    p->i++;
    for (;;) {
        size_t run = p->i;
        while (p->i < p->n && p->s[p->i] != '"' && p->s[p->i] != '\\' && p->s[p->i] >= 0x20) p->i++;
        if (!epyq_tok_utf8_valid(p->s + run, p->i - run)) {
            p->i = run;
            return fail(p, "valid UTF-8 in a string");
        }
        if (out && !epyq_sbuf_add(out, p->s + run, p->i - run)) return epyq_err_set(p->err, EPYQ_E_NOMEM, "out of memory");
        if (p->i >= p->n) return fail(p, "the end of the string");
        uint8_t c = p->s[p->i];
        if (c == '"') {
            p->i++;
            return EPYQ_OK;
        }
        if (c < 0x20) return fail(p, "no raw control character in a string");
        p->i++; /* backslash */
        if (p->i >= p->n) return fail(p, "an escape");
        const char *simple = strchr("\"\\/bfnrt", p->s[p->i]);
        if (simple && p->s[p->i]) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            char d = map[simple - "\"\\/bfnrt"];
            p->i++;
            if (out && !epyq_sbuf_add(out, &d, 1)) return epyq_err_set(p->err, EPYQ_E_NOMEM, "out of memory");
            continue;
        }
        if (p->s[p->i] != 'u') return fail(p, "a valid escape");
        int hi = p->i + 5 <= p->n ? hex4(p->s + p->i + 1) : -1;
        if (hi < 0) return fail(p, "\\u and four hex digits");
        p->i += 5;
        uint32_t cp = (uint32_t)hi;
        if (hi >= 0xDC00 && hi <= 0xDFFF) return fail(p, "a high surrogate before a low one");
        if (hi >= 0xD800 && hi <= 0xDBFF) {
            int lo = p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u' ? hex4(p->s + p->i + 2) : -1;
            if (lo < 0xDC00 || lo > 0xDFFF) return fail(p, "a low surrogate escape after a high one");
            p->i += 6;
            cp = 0x10000 + ((uint32_t)(hi - 0xD800) << 10) + (uint32_t)(lo - 0xDC00);
        }
        if (out && !put_cp(out, cp)) return epyq_err_set(p->err, EPYQ_E_NOMEM, "out of memory");
    }
}

static epyq_status number(jp *p) {
    size_t start = p->i;
    if (p->i < p->n && p->s[p->i] == '-') p->i++;
    if (p->i < p->n && p->s[p->i] == '0')
        p->i++;
    else if (p->i < p->n && p->s[p->i] >= '1' && p->s[p->i] <= '9')
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    else
        return p->i = start, fail(p, "a JSON value");
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return fail(p, "a digit");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return fail(p, "a digit");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    return EPYQ_OK;
}

static epyq_status value(jp *p, int depth);

/* An object; at depth 0, the string value of key goes to out. */
static epyq_status object(jp *p, int depth, const char *key, epyq_sbuf *out, bool *found) {
    p->i++; /* { */
    ws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
        p->i++;
        return EPYQ_OK;
    }
    size_t klen = key ? strlen(key) : 0;
    for (;;) {
        ws(p);
        size_t kstart = p->i;
        epyq_status st = string(p, NULL);
        if (st) return st;
        bool want = key && p->i - kstart == klen + 2 && !memcmp(p->s + kstart + 1, key, klen);
        ws(p);
        if (p->i >= p->n || p->s[p->i] != ':') return fail(p, "':'");
        p->i++;
        ws(p);
        if (want) {
            if (p->i >= p->n || p->s[p->i] != '"') return fail(p, "a string value");
            out->len = 0; /* a repeated key: the last one wins, as in most parsers */
            if ((st = string(p, out))) return st;
            *found = true;
        } else if ((st = value(p, depth + 1))) {
            return st;
        }
        ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == '}') {
            p->i++;
            return EPYQ_OK;
        }
        return fail(p, "',' or '}'");
    }
}

static epyq_status value(jp *p, int depth) {
    if (depth > MAX_DEPTH) return fail(p, "less nesting");
    ws(p);
    if (p->i >= p->n) return fail(p, "a JSON value");
    uint8_t c = p->s[p->i];
    if (c == '{') return object(p, depth, NULL, NULL, NULL);
    if (c == '"') return string(p, NULL);
    if (c == '[') {
        p->i++;
        ws(p);
        if (p->i < p->n && p->s[p->i] == ']') {
            p->i++;
            return EPYQ_OK;
        }
        for (;;) {
            epyq_status st = value(p, depth + 1);
            if (st) return st;
            ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == ']') {
                p->i++;
                return EPYQ_OK;
            }
            return fail(p, "',' or ']'");
        }
    }
    static const char *const lits[] = {"true", "false", "null"};
    for (size_t k = 0; k < 3; k++) {
        size_t l = strlen(lits[k]);
        if (p->n - p->i >= l && !memcmp(p->s + p->i, lits[k], l)) {
            p->i += l;
            return EPYQ_OK;
        }
    }
    return number(p);
}

epyq_status epyq_json_text_field(const char *text, size_t len, const char *key, char **out, size_t *out_len,
                                 bool *found, epyq_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    *found = false;
    jp p = {.s = (const uint8_t *)text, .n = len, .err = err};
    epyq_sbuf buf = {0};
    ws(&p);
    epyq_status st = p.i < p.n && p.s[p.i] == '{' ? object(&p, 0, key, &buf, found) : fail(&p, "a JSON object");
    if (!st) {
        ws(&p);
        if (p.i != p.n) st = fail(&p, "the end of the line after the object");
    }
    if (st || !*found) {
        epyq_sbuf_free(&buf);
        *found = st ? false : *found;
        return st;
    }
    *out = epyq_sbuf_take(&buf, out_len);
    return *out ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
}

/* ---- streaming reader ------------------------------------------------------------------ */

bool epyq_json_read_char(epyq_json_reader *r, char c) {
    ws(r);
    if (r->i < r->n && r->s[r->i] == (uint8_t)c) {
        r->i++;
        return true;
    }
    return false;
}

epyq_status epyq_json_read_string(epyq_json_reader *r, epyq_sbuf *out) {
    ws(r);
    out->len = 0;
    epyq_status st = string(r, out);
    if (!st && !out->p && !epyq_sbuf_add(out, "", 0)) return epyq_err_set(r->err, EPYQ_E_NOMEM, "out of memory");
    return st;
}

epyq_status epyq_json_read_int(epyq_json_reader *r, int64_t lo, int64_t hi, int64_t *out) {
    ws(r);
    size_t start = r->i;
    bool neg = r->i < r->n && r->s[r->i] == '-';
    if (neg) r->i++;
    int64_t v = 0;
    size_t digits = 0;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9' && digits < 18) {
        v = v * 10 + (r->s[r->i++] - '0');
        digits++;
    }
    if (neg) v = -v;
    bool more = r->i < r->n && (r->s[r->i] == '.' || r->s[r->i] == 'e' || r->s[r->i] == 'E' || (r->s[r->i] >= '0' && r->s[r->i] <= '9'));
    if (!digits || more || v < lo || v > hi) {
        r->i = start;
        char what[64];
        snprintf(what, sizeof what, "an integer in %lld..%lld", (long long)lo, (long long)hi);
        return fail(r, what);
    }
    *out = v;
    return EPYQ_OK;
}

/* Walk the object keys along path from the root object. */
static epyq_status find_in(jp *p, const char *const *path, size_t depth, size_t *start, size_t *end, bool *found) {
    if (!epyq_json_read_char(p, '{')) return fail(p, "a JSON object");
    if (epyq_json_read_char(p, '}')) return EPYQ_OK;
    size_t klen = strlen(path[0]);
    for (;;) {
        ws(p);
        size_t kstart = p->i;
        epyq_status st = string(p, NULL);
        if (st) return st;
        bool want = p->i - kstart == klen + 2 && !memcmp(p->s + kstart + 1, path[0], klen);
        if (!epyq_json_read_char(p, ':')) return fail(p, "':'");
        ws(p);
        if (want && depth == 1) {
            *start = p->i;
            if ((st = value(p, 1))) return st;
            *end = p->i;
            *found = true;
        } else if (want && p->i < p->n && p->s[p->i] == '{') {
            if ((st = find_in(p, path + 1, depth - 1, start, end, found))) return st;
        } else if ((st = value(p, 1))) {
            return st;
        }
        if (epyq_json_read_char(p, ',')) continue;
        if (epyq_json_read_char(p, '}')) return EPYQ_OK;
        return fail(p, "',' or '}'");
    }
}

epyq_status epyq_json_find(const char *text, size_t len, const char *const *path, size_t depth, size_t *start,
                           size_t *end, bool *found, epyq_err *err) {
    jp p = {.s = (const uint8_t *)text, .n = len, .err = err};
    *found = false;
    return depth ? find_in(&p, path, depth, start, end, found) : EPYQ_OK;
}
