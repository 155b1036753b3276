/* src/chat/jinja_lex.c — template source -> tokens, with jinja2's whitespace control.
 *
 * transformers compiles chat templates with trim_blocks=True and lstrip_blocks=True, so:
 * a block or comment tag that ends with "%}"/"#}" eats one newline right after it; spaces
 * and tabs between the start of a line and a "{%"/"{#" are dropped when nothing else is on
 * that line before the tag; "-" next to a delimiter strips all whitespace on that side and
 * "+" turns the two block options off for that side. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_int.h"

typedef struct {
    jj_arena *ar;
    const char *src;
    size_t len;
    size_t pos;
    int line, col; /* of pos */
    const char *name;
    epyq_err *err;
    jtok *toks; /* [cap] growing output (malloc'd, copied to the arena at the end) */
    size_t n, cap;
} lexer;

/* Moves pos forward to target, keeping line/col. */
static void advance_to(lexer *L, size_t target) {
    for (; L->pos < target; L->pos++) {
        if (L->src[L->pos] == '\n') {
            L->line++;
            L->col = 1;
        } else if (((unsigned char)L->src[L->pos] & 0xC0) != 0x80) {
            L->col++; /* columns count characters, not bytes */
        }
    }
}

static epyq_status lex_error(lexer *L, const char *what) {
    return epyq_err_set(L->err, EPYQ_E_TEMPLATE, "%s:%d:%d: %s", L->name, L->line, L->col, what);
}

static jtok *push(lexer *L, jt_kind kind) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jtok *t = realloc(L->toks, cap * sizeof *t);
        if (!t) return NULL;
        L->toks = t;
        L->cap = cap;
    }
    jtok *t = &L->toks[L->n++];
    memset(t, 0, sizeof *t);
    t->kind = (uint8_t)kind;
    t->line = L->line;
    t->col = L->col;
    return t;
}

/* Whitespace as Python's str.isspace() sees it; returns its byte length at s[i] or 0. */
static size_t space_at(const char *s, size_t n, size_t i) {
    size_t j = i;
    uint32_t c = epyq_jj_utf8_next(s, n, &j);
    return epyq_jj_py_isspace(c) ? j - i : 0;
}

/* Byte length of the whitespace run ending at s[end) going backwards from end, not crossing
 * newlines when stop_at_nl. */
static size_t rstrip_len(const char *s, size_t start, size_t end, bool stop_at_nl) {
    size_t e = end;
    while (e > start) {
        size_t b = e - 1;
        while (b > start && ((unsigned char)s[b] & 0xC0) == 0x80) b--; /* back to a lead byte */
        size_t k = space_at(s, e, b);
        if (!k || b + k != e || (stop_at_nl && s[b] == '\n')) break;
        e = b;
    }
    return end - e;
}

static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void put_utf8(epyq_sbuf *b, uint32_t c, bool *ok) {
    char u[4];
    size_t k;
    if (c < 0x80) {
        u[0] = (char)c;
        k = 1;
    } else if (c < 0x800) {
        u[0] = (char)(0xC0 | (c >> 6));
        u[1] = (char)(0x80 | (c & 0x3F));
        k = 2;
    } else if (c < 0x10000) {
        u[0] = (char)(0xE0 | (c >> 12));
        u[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        u[2] = (char)(0x80 | (c & 0x3F));
        k = 3;
    } else {
        u[0] = (char)(0xF0 | (c >> 18));
        u[1] = (char)(0x80 | ((c >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((c >> 6) & 0x3F));
        u[3] = (char)(0x80 | (c & 0x3F));
        k = 4;
    }
    if (!epyq_sbuf_add(b, u, k)) *ok = false;
}

/* A quoted string literal at pos: jinja2 decodes the body with Python's "unicode-escape". */
static epyq_status lex_string(lexer *L, jtok *t) {
    char q = L->src[L->pos];
    size_t i = L->pos + 1;
    epyq_sbuf b = {0};
    bool ok = true;
    const char *bad = NULL;
    while (i < L->len && L->src[i] != q) {
        char c = L->src[i];
        if (c != '\\') {
            ok = ok && epyq_sbuf_addc(&b, c);
            i++;
            continue;
        }
        if (i + 1 >= L->len) break;
        char e = L->src[i + 1];
        i += 2;
        int nhex = 0;
        switch (e) {
        case '\n': break; /* line continuation */
        case '\\': ok = ok && epyq_sbuf_addc(&b, '\\'); break;
        case '\'': ok = ok && epyq_sbuf_addc(&b, '\''); break;
        case '"': ok = ok && epyq_sbuf_addc(&b, '"'); break;
        case 'a': ok = ok && epyq_sbuf_addc(&b, '\a'); break;
        case 'b': ok = ok && epyq_sbuf_addc(&b, '\b'); break;
        case 'f': ok = ok && epyq_sbuf_addc(&b, '\f'); break;
        case 'n': ok = ok && epyq_sbuf_addc(&b, '\n'); break;
        case 'r': ok = ok && epyq_sbuf_addc(&b, '\r'); break;
        case 't': ok = ok && epyq_sbuf_addc(&b, '\t'); break;
        case 'v': ok = ok && epyq_sbuf_addc(&b, '\v'); break;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        case 'N': bad = "\\N{...} escapes are not supported"; break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < L->len && L->src[i] >= '0' && L->src[i] <= '7'; k++)
                    v = v * 8 + (uint32_t)(L->src[i++] - '0');
                put_utf8(&b, v, &ok);
            } else {
                /* Python keeps unknown escapes as written. */
                ok = ok && epyq_sbuf_addc(&b, '\\') && epyq_sbuf_addc(&b, e);
            }
        }
        if (nhex) {
            uint32_t v = 0;
            for (int k = 0; k < nhex; k++) {
                int h = i < L->len ? hexval(L->src[i]) : -1;
                if (h < 0) {
                    bad = "truncated \\x/\\u/\\U escape in string";
                    break;
                }
                v = v * 16 + (uint32_t)h;
                i++;
            }
            if (!bad && (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)))
                bad = "escape is not a valid Unicode scalar value";
            if (!bad) put_utf8(&b, v, &ok);
        }
        if (bad) break;
    }
    if (!bad && i >= L->len) bad = "unterminated string literal";
    if (!bad && !ok) bad = "string literal too long";
    if (bad) {
        epyq_sbuf_free(&b);
        return lex_error(L, bad);
    }
    t->p = epyq_jj_strdup(L->ar, b.p ? b.p : "", b.len);
    t->n = b.len;
    epyq_sbuf_free(&b);
    if (!t->p) return lex_error(L, "out of memory");
    advance_to(L, i + 1);
    return EPYQ_OK;
}

/* Digits with optional single underscores between them; returns the end. */
static size_t scan_digits(const char *s, size_t n, size_t i) {
    while (i < n && (is_digit(s[i]) || (s[i] == '_' && i + 1 < n && is_digit(s[i + 1]) && i > 0 && is_digit(s[i - 1]))))
        i++;
    return i;
}

static epyq_status lex_number(lexer *L, jtok *t) {
    const char *s = L->src;
    size_t i = scan_digits(s, L->len, L->pos);
    bool is_float = false;
    bool after_dot = L->pos > 0 && s[L->pos - 1] == '.'; /* `a.0.1` is attribute access, not 0.1 */
    if (!after_dot && i + 1 < L->len && s[i] == '.' && is_digit(s[i + 1])) {
        i = scan_digits(s, L->len, i + 1);
        is_float = true;
    }
    if (!after_dot && i < L->len && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < L->len && (s[j] == '+' || s[j] == '-')) j++;
        if (j < L->len && is_digit(s[j])) {
            i = scan_digits(s, L->len, j);
            is_float = true;
        }
    }
    char tmp[128];
    size_t k = 0;
    for (size_t j = L->pos; j < i && k + 1 < sizeof tmp; j++)
        if (s[j] != '_') tmp[k++] = s[j];
    tmp[k] = '\0';
    if (i - L->pos >= sizeof tmp) return lex_error(L, "number literal too long");
    if (is_float) {
        t->kind = JT_FLOAT;
        t->f = strtod(tmp, NULL);
    } else {
        t->kind = JT_INT;
        int64_t v = 0;
        for (size_t j = 0; tmp[j]; j++)
            if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, tmp[j] - '0', &v))
                return lex_error(L, "integer literal does not fit in 64 bits");
        t->i = v;
    }
    advance_to(L, i);
    return EPYQ_OK;
}

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%",
                                  "~", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "=",
                                  "<", ">", ";", "!"};

/* Tokens inside {{ }} or {% %} up to and including the end delimiter. Sets *strip_after
 * ('-' or '+' or 0) and *tag_end_nl when the end delimiter was followed by a trimmed '\n'. */
static epyq_status lex_inside(lexer *L, bool block, int *strip_after) {
    int depth = 0;
    const char *s = L->src;
    for (;;) {
        size_t k;
        while (L->pos < L->len && (k = space_at(s, L->len, L->pos)) > 0) advance_to(L, L->pos + k);
        if (L->pos >= L->len) return lex_error(L, block ? "missing '%}'" : "missing '}}'");
        size_t p = L->pos;
        char c = s[p];
        if (depth == 0) {
            char close = block ? '%' : '}';
            size_t q = p;
            int mod = 0;
            if ((c == '-' || (block && c == '+')) && q + 2 < L->len + 0 && s[q + 1] == close && s[q + 2] == '}') {
                mod = c;
                q++;
            }
            if (q + 1 < L->len && s[q] == close && s[q + 1] == '}') {
                jtok *t = push(L, block ? JT_BLOCK_END : JT_VAR_END);
                if (!t) return lex_error(L, "out of memory");
                advance_to(L, q + 2);
                *strip_after = mod;
                return EPYQ_OK;
            }
        }
        jtok *t = push(L, JT_OP);
        if (!t) return lex_error(L, "out of memory");
        if (is_name_start(c)) {
            size_t e = p;
            while (e < L->len && is_name_char(s[e])) e++;
            t->kind = JT_NAME;
            t->p = epyq_jj_strdup(L->ar, s + p, e - p);
            t->n = e - p;
            if (!t->p) return lex_error(L, "out of memory");
            advance_to(L, e);
        } else if (is_digit(c)) {
            epyq_status st = lex_number(L, t);
            if (st) return st;
        } else if (c == '\'' || c == '"') {
            t->kind = JT_STRING;
            epyq_status st = lex_string(L, t);
            if (st) return st;
        } else {
            const char *op = NULL;
            for (size_t j = 0; j < sizeof OPS / sizeof OPS[0]; j++) {
                size_t n = strlen(OPS[j]);
                if (p + n <= L->len && !memcmp(s + p, OPS[j], n)) {
                    op = OPS[j];
                    break;
                }
            }
            if (!op) {
                char what[64];
                snprintf(what, sizeof what, "unexpected character '%c'", c >= 0x20 && c < 0x7f ? c : '?');
                return lex_error(L, what);
            }
            t->p = op;
            t->n = strlen(op);
            if (strchr("([{", op[0])) depth++;
            if (strchr(")]}", op[0]) && depth > 0) depth--;
            advance_to(L, p + t->n);
        }
    }
}

epyq_status epyq_jj_lex(jj_arena *a, const char *src, size_t len, const char *name, jtok **toks,
                   size_t *ntoks, epyq_err *err) {
    lexer L = {.ar = a, .src = src, .len = len, .line = 1, .col = 1, .name = name, .err = err};
    bool line_starting = true; /* the last delimiter ended with '\n' (or this is the start) */
    epyq_status st = EPYQ_OK;
    while (L.pos < len) {
        /* Find the next tag opener. */
        size_t tag = L.pos;
        const char *hit = NULL;
        while ((hit = memchr(src + tag, '{', len - tag)) != NULL) {
            tag = (size_t)(hit - src);
            if (tag + 1 < len && (src[tag + 1] == '{' || src[tag + 1] == '%' || src[tag + 1] == '#')) break;
            tag++;
        }
        if (!hit) tag = len;
        size_t ts = L.pos, te = tag; /* the text before it */
        char kind = tag < len ? src[tag + 1] : 0;
        char mod = tag + 2 < len ? src[tag + 2] : 0;
        if (kind && mod == '-') {
            te -= rstrip_len(src, ts, te, false);
        } else if ((kind == '%' || kind == '#') && mod != '+') {
            /* lstrip_blocks: only when the tag is the first thing on its line. */
            size_t l = te;
            while (l > ts && src[l - 1] != '\n') l--;
            bool at_line_start = l > ts || line_starting;
            if (at_line_start && rstrip_len(src, l, te, true) == te - l) te = l;
        }
        if (te > ts) {
            advance_to(&L, ts);
            jtok *t = push(&L, JT_TEXT);
            if (!t) {
                st = lex_error(&L, "out of memory");
                goto out;
            }
            t->p = epyq_jj_strdup(a, src + ts, te - ts);
            t->n = te - ts;
            if (!t->p) {
                st = lex_error(&L, "out of memory");
                goto out;
            }
        }
        advance_to(&L, tag);
        if (tag >= len) break;
        size_t body = tag + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
        int strip_after = 0;
        if (kind == '#') {
            const char *end = NULL;
            for (size_t i = body; i + 1 < len; i++)
                if (src[i] == '#' && src[i + 1] == '}') {
                    end = src + i;
                    break;
                }
            if (!end) {
                st = lex_error(&L, "unterminated comment (missing '#}')");
                goto out;
            }
            size_t e = (size_t)(end - src);
            if (e > body && (src[e - 1] == '-' || src[e - 1] == '+')) strip_after = src[e - 1];
            advance_to(&L, e + 2);
        } else {
            jtok *t = push(&L, kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN);
            if (!t) {
                st = lex_error(&L, "out of memory");
                goto out;
            }
            advance_to(&L, body);
            st = lex_inside(&L, kind == '%', &strip_after);
            if (st) goto out;
        }
        line_starting = false;
        if (strip_after == '-') {
            /* "-%}" eats all following whitespace; a line starts if that ended with '\n'. */
            size_t e = L.pos;
            while (e < len) {
                size_t k = space_at(src, len, e);
                if (!k) break;
                e += k;
            }
            line_starting = e > L.pos && src[e - 1] == '\n';
            advance_to(&L, e);
        } else if (kind != '{' && strip_after != '+' && L.pos < len && src[L.pos] == '\n') {
            advance_to(&L, L.pos + 1); /* trim_blocks */
            line_starting = true;
        }
    }
    if (!push(&L, JT_EOF)) st = lex_error(&L, "out of memory");
out:
    if (st) {
        free(L.toks);
        return st;
    }
    *toks = epyq_jj_alloc_array(a, L.n, sizeof **toks);
    if (!*toks) {
        free(L.toks);
        return epyq_err_set(err, EPYQ_E_NOMEM, "%s: template too large", name);
    }
    memcpy(*toks, L.toks, L.n * sizeof **toks);
    *ntoks = L.n;
    free(L.toks);
    return EPYQ_OK;
}
