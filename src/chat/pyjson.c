/* src/chat/pyjson.c — see pyjson.h. */
#include "chat/pyjson.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool epyq_pyjson_str(epyq_sbuf *b, const char *s, size_t n) {
    if (!epyq_sbuf_addc(b, '"')) return false;
    size_t run = 0; /* start of the pending run of bytes that need no escape */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", c);
                esc = tmp;
            }
        }
        if (!esc) continue;
        if (!epyq_sbuf_add(b, s + run, i - run) || !epyq_sbuf_adds(b, esc)) return false;
        run = i + 1;
    }
    return epyq_sbuf_add(b, s + run, n - run) && epyq_sbuf_addc(b, '"');
}

void epyq_py_float_repr(char *buf, size_t size, double v) {
    if (isnan(v)) {
        snprintf(buf, size, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, size, v < 0 ? "-inf" : "inf");
        return;
    }
    /* Shortest digit string that reads back as the same double (what repr() picks). */
    char sci[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec - 1, v);
        if (strtod(sci, NULL) == v) break;
    }
    /* sci is [-]d[.ddd]e[+-]XX: collect the digits and the decimal exponent. */
    const char *p = sci;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < 23) digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--; /* trailing zeros are not significant */
    digits[nd] = '\0';
    int exp10 = *p == 'e' ? atoi(p + 1) : 0;
    int decpt = exp10 + 1; /* value = 0.DIGITS * 10^decpt */
    char out[64];
    int o = 0;
    if (neg) out[o++] = '-';
    if (v == 0) {
        snprintf(out + o, sizeof out - (size_t)o, "0.0");
    } else if (decpt > -4 && decpt <= 16) {
        /* Python switches to exponent form below 1e-4 and from 1e16 on. */
        if (decpt <= 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -decpt; i++) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
        } else {
            for (int i = 0; i < decpt; i++) out[o++] = i < nd ? digits[i] : '0';
            out[o++] = '.';
            if (nd > decpt)
                for (int i = decpt; i < nd; i++) out[o++] = digits[i];
            else
                out[o++] = '0';
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    }
    snprintf(buf, size, "%s", out);
}

bool epyq_pyjson_float(epyq_sbuf *b, double v) {
    if (isnan(v)) return epyq_sbuf_adds(b, "NaN");
    if (isinf(v)) return epyq_sbuf_adds(b, v < 0 ? "-Infinity" : "Infinity");
    char tmp[40];
    epyq_py_float_repr(tmp, sizeof tmp, v);
    return epyq_sbuf_adds(b, tmp);
}

static bool dump_number(epyq_sbuf *b, double v) {
    if (v == floor(v) && fabs(v) < 9.2233720368547758e18) return epyq_sbuf_printf(b, "%lld", (long long)v);
    return epyq_pyjson_float(b, v);
}

static bool dump_at(epyq_sbuf *b, const cJSON *x, int depth) {
    if (depth > 512) return false; /* deeper than cJSON itself parses; refuse instead of recursing */
    if (cJSON_IsNull(x) || !x) return epyq_sbuf_adds(b, "null");
    if (cJSON_IsTrue(x)) return epyq_sbuf_adds(b, "true");
    if (cJSON_IsFalse(x)) return epyq_sbuf_adds(b, "false");
    if (cJSON_IsNumber(x)) return dump_number(b, x->valuedouble);
    if (cJSON_IsString(x)) return epyq_pyjson_str(b, x->valuestring, strlen(x->valuestring));
    if (cJSON_IsRaw(x)) return epyq_sbuf_adds(b, x->valuestring);
    bool obj = cJSON_IsObject(x);
    if (!epyq_sbuf_addc(b, obj ? '{' : '[')) return false;
    for (const cJSON *c = x->child; c; c = c->next) {
        if (c != x->child && !epyq_sbuf_add(b, ", ", 2)) return false;
        if (obj) {
            const char *k = c->string ? c->string : "";
            if (!epyq_pyjson_str(b, k, strlen(k)) || !epyq_sbuf_add(b, ": ", 2)) return false;
        }
        if (!dump_at(b, c, depth + 1)) return false;
    }
    return epyq_sbuf_addc(b, obj ? '}' : ']');
}

bool epyq_pyjson_dump(epyq_sbuf *b, const cJSON *x) { return dump_at(b, x, 0); }
