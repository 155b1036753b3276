/* src/tok/pretok.c — the Split pre-tokenizer: the regex from tokenizer.json compiled with
 * PCRE2 (UTF + UCP, JIT when the platform has it) and iterated in "Isolated" mode.
 *
 * The reference runs the pattern on Oniguruma. The only syntax whose meaning differs between
 * the two engines in the patterns tokenizers ship is \s / \S: Oniguruma's is exactly the
 * Unicode White_Space property, PCRE2's UCP \s also accepts U+180E MONGOLIAN VOWEL SEPARATOR
 * (a Cf character since Unicode 6.3). So \s and \S are rewritten to \p{White_Space} /
 * \P{White_Space} (PCRE2 >= 10.40 knows binary properties) before compiling. Letter, mark and
 * number classes still come from PCRE2's own Unicode tables; see README.md for what that
 * means for code points newer than those tables. */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_internal.h"

/* Copy pattern with \s, \S rewritten. An escaped backslash is copied as a unit so "\\s"
 * (backslash, then the letter s) stays as it is. */
static char *rewrite_space_escapes(const char *pat, size_t len, size_t *out_len) {
    static const char WS[] = "\\p{White_Space}", NWS[] = "\\P{White_Space}";
    size_t cap = len * (sizeof WS) / 2 + 16;
    char *out = malloc(cap);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (pat[i] == '\\' && i + 1 < len && (pat[i + 1] == 's' || pat[i + 1] == 'S')) {
            const char *rep = pat[i + 1] == 's' ? WS : NWS;
            memcpy(out + o, rep, sizeof WS - 1);
            o += sizeof WS - 1;
            i++;
        } else if (pat[i] == '\\' && i + 1 < len) {
            out[o++] = pat[i++];
            out[o++] = pat[i];
        } else {
            out[o++] = pat[i];
        }
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

epyq_status epyq_tok_split_compile(const char *pat, size_t len, bool literal, pcre2_code **out, bool *jit,
                              const char *label, epyq_err *err) {
    *out = NULL;
    *jit = false;
    size_t plen = len;
    char *p = literal ? NULL : rewrite_space_escapes(pat, len, &plen);
    if (!literal && !p) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory compiling the split regex", label);
    int ec;
    PCRE2_SIZE eoff;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(literal ? pat : p), plen, opts, &ec, &eoff, NULL);
    free(p);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: pre_tokenizer Split pattern: %s at offset %zu", label,
                            (const char *)msg, (size_t)eoff);
    }
    /* No JIT (e.g. a hardened kernel refusing executable memory) only costs speed. */
    *jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    *out = re;
    return EPYQ_OK;
}

void epyq_tok_split_state_free(tok_split_state *st) {
    pcre2_match_data_free(st->md);
    pcre2_match_context_free(st->mctx);
    pcre2_jit_stack_free(st->js);
    memset(st, 0, sizeof *st);
}

static int split_match(const epyq_tok *t, tok_split_state *st, const uint8_t *s, size_t n, size_t from) {
    /* The subject was made valid UTF-8 before this point, so PCRE2 need not check it again
     * (its check is O(n) per call and would make the whole split quadratic). */
    if (t->split_jit) return pcre2_jit_match(t->split_re, s, n, from, PCRE2_NO_UTF_CHECK, st->md, st->mctx);
    return pcre2_match(t->split_re, s, n, from, PCRE2_NO_UTF_CHECK, st->md, st->mctx);
}

epyq_status epyq_tok_split_find(const epyq_tok *t, tok_split_state *st, const uint8_t *s, size_t n, size_t from,
                           size_t *mstart, size_t *mend, bool *found, epyq_err *err) {
    if (!st->md && !(st->md = pcre2_match_data_create_from_pattern(t->split_re, NULL)))
        return epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: cannot allocate regex match data");
    int rc = split_match(t, st, s, n, from);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !st->js) {
        /* The default 32 KiB JIT stack is enough for ordinary text; long runs that make the
         * pattern backtrack get a bigger one, made only when needed. */
        st->mctx = pcre2_match_context_create(NULL);
        st->js = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
        if (!st->mctx || !st->js) return epyq_err_set(err, EPYQ_E_NOMEM, "tokenizer: cannot allocate a regex stack");
        pcre2_jit_stack_assign(st->mctx, NULL, st->js);
        rc = split_match(t, st, s, n, from);
    }
    if (rc == PCRE2_ERROR_NOMATCH) {
        *found = false;
        return EPYQ_OK;
    }
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return epyq_err_set(err, EPYQ_E_INTERNAL, "tokenizer: split regex failed at byte %zu of a %zu-byte text: %s",
                            from, n, (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
    *mstart = ov[0];
    *mend = ov[1];
    *found = true;
    return EPYQ_OK;
}
