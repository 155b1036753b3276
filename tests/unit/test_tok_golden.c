/* tests/unit/test_tok_golden.c — the tokenizer against the reference's own outputs in
 * ../shared/fixtures/tokenizer: every golden_encode.jsonl line (ids, both decodes, the
 * config-token variant), every decode_cases.jsonl case, and the streaming decoder against the
 * one-shot decode on all of them. Skips (exit 77) without ../shared. */
#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "tests/check_main.h"
#include "tests/testutil.h"
#include "tok/json_text.h"
#include "tok/sbuf.h"
#include "tok/tokenizer.h"

static char *g_dir;
static epyq_tok *g_tok, *g_tok_cfg;

typedef struct {
    char *line;       /* the raw JSON line */
    size_t len;
    cJSON *j;
} jline;

static jline *g_golden, *g_decode;
static size_t g_n_golden, g_n_decode;

static jline *read_jsonl(const char *name, size_t *n) {
    char *path = epyq_path_join(g_dir, name), *text;
    size_t len;
    epyq_err err;
    ck_assert_msg(epyq_file_read(path, 64u << 20, &text, &len, &err) == EPYQ_OK, "%s", err.msg);
    free(path);
    size_t cap = 16, k = 0;
    jline *v = malloc(cap * sizeof *v);
    for (char *p = text; p < text + len;) {
        char *nl = memchr(p, '\n', (size_t)(text + len - p));
        size_t l = nl ? (size_t)(nl - p) : (size_t)(text + len - p);
        if (l) {
            if (k == cap) v = realloc(v, (cap *= 2) * sizeof *v);
            v[k].line = strndup(p, l);
            v[k].len = l;
            v[k].j = cJSON_ParseWithLength(p, l);
            ck_assert_msg(v[k].j != NULL, "%s line %zu: cJSON cannot parse it", name, k + 1);
            k++;
        }
        p += l + 1;
    }
    free(text);
    *n = k;
    return v;
}

static void setup(void) {
    const char *d = epyq_test_shared("fixtures/tokenizer");
    if (!d) return;
    g_dir = strdup(d);
    epyq_err err;
    double t0 = epyq_now();
    ck_assert_msg(epyq_tok_load(&g_tok, g_dir, &err) == EPYQ_OK, "%s", err.msg);
    printf("tokenizer.json loaded in %.0f ms\n", (epyq_now() - t0) * 1e3);
    epyq_tok_opts o = epyq_tok_opts_default();
    o.config_added_tokens = true;
    ck_assert_msg(epyq_tok_load_opts(&g_tok_cfg, g_dir, &o, &err) == EPYQ_OK, "%s", err.msg);
    g_golden = read_jsonl("golden_encode.jsonl", &g_n_golden);
    g_decode = read_jsonl("decode_cases.jsonl", &g_n_decode);
}

static void teardown(void) {
    epyq_tok_free(g_tok);
    epyq_tok_free(g_tok_cfg);
}

/* A string field, NUL bytes kept (cJSON would cut at \u0000). */
static char *field(const jline *l, const char *key, size_t *len) {
    char *s;
    bool found;
    epyq_err err;
    ck_assert_msg(epyq_json_text_field(l->line, l->len, key, &s, len, &found, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_msg(found, "no \"%s\" in %.80s", key, l->line);
    return s;
}

static int32_t *ids_of(const cJSON *j, const char *key, size_t *n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsArray(a)) return NULL;
    *n = (size_t)cJSON_GetArraySize(a);
    int32_t *v = malloc((*n ? *n : 1) * sizeof *v);
    size_t i = 0;
    for (const cJSON *e = a->child; e; e = e->next) v[i++] = (int32_t)e->valuedouble;
    return v;
}

static bool same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

/* Encode every golden line with tok; compare with `key`; returns the number of exact lines. */
static size_t encode_all(const epyq_tok *tok, const char *key, bool only_with_key, size_t *total) {
    size_t exact = 0;
    *total = 0;
    for (size_t i = 0; i < g_n_golden; i++) {
        size_t nw;
        int32_t *want = ids_of(g_golden[i].j, key, &nw);
        if (!want && only_with_key) continue;
        if (!want) want = ids_of(g_golden[i].j, "ids", &nw);
        size_t tl, ng;
        char *text = field(&g_golden[i], "text", &tl);
        int32_t *got;
        epyq_err err;
        ck_assert_msg(epyq_tok_encode(tok, text, tl, &got, &ng, &err) == EPYQ_OK, "%s", err.msg);
        (*total)++;
        if (same_ids(got, ng, want, nw)) {
            exact++;
        } else {
            size_t k = 0;
            while (k < ng && k < nw && got[k] == want[k]) k++;
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(g_golden[i].j, "id");
            printf("MISMATCH %s (%s): at index %zu got %d want %d (%zu vs %zu ids)\n", id ? id->valuestring : "?", key, k,
                   k < ng ? got[k] : -1, k < nw ? want[k] : -1, ng, nw);
        }
        free(got);
        free(want);
        free(text);
    }
    return exact;
}

START_TEST(golden_encode) {
    if (!g_tok) return;
    size_t total, exact = encode_all(g_tok, "ids", false, &total);
    printf("golden_encode.jsonl ids: %zu / %zu lines exact\n", exact, total);
    ck_assert_uint_eq(total, g_n_golden);
    ck_assert_uint_eq(exact, total);
}
END_TEST

/* With the 7 tokenizer_config.json-only tokens registered (transformers' behaviour). */
START_TEST(golden_encode_config_tokens) {
    if (!g_tok_cfg) return;
    size_t total, exact = encode_all(g_tok_cfg, "ids_with_config_added_tokens", true, &total);
    printf("golden_encode.jsonl ids_with_config_added_tokens: %zu / %zu lines exact\n", exact, total);
    ck_assert_uint_gt(total, 0);
    ck_assert_uint_eq(exact, total);
    ck_assert_int_eq(epyq_tok_id(g_tok_cfg, "<|audio_pad|>"), 248076);
    ck_assert_int_eq(epyq_tok_id(g_tok, "<|audio_pad|>"), -1);
    ck_assert_int_eq(epyq_tok_vocab_size(g_tok), 248070);
    ck_assert_int_eq(epyq_tok_vocab_size(g_tok_cfg), 248077);
}
END_TEST

/* Stream the ids one by one: every chunk is whole UTF-8 and the chunks add up to the
 * one-shot decode. */
static void check_stream(const epyq_tok *tok, const int32_t *ids, size_t n, bool skip, const char *want, size_t wl,
                         const char *label) {
    epyq_tok_stream *s = epyq_tok_stream_new(tok, skip);
    ck_assert_ptr_nonnull(s);
    epyq_sbuf acc = {0};
    epyq_err err;
    for (size_t i = 0; i <= n; i++) {
        char *chunk;
        size_t cl;
        epyq_status st = i < n ? epyq_tok_stream_push_n(s, ids[i], &chunk, &cl, &err)
                               : epyq_tok_stream_finish_n(s, &chunk, &cl, &err);
        ck_assert_msg(st == EPYQ_OK, "%s", err.msg);
        if (cl) {
            unsigned char last = (unsigned char)chunk[cl - 1];
            ck_assert_msg(last < 0x80 || (last & 0xC0) == 0x80, "%s: chunk %zu ends inside a UTF-8 sequence", label, i);
        }
        epyq_sbuf_add(&acc, chunk, cl);
        free(chunk);
    }
    epyq_tok_stream_free(s);
    ck_assert_msg(acc.len == wl && (wl == 0 || !memcmp(acc.p, want, wl)), "%s: stream \"%s\" != one-shot \"%s\"", label,
                  acc.p ? acc.p : "", want);
    epyq_sbuf_free(&acc);
}

/* decoded / decoded_skip_special of every golden line, one-shot and streamed. */
START_TEST(golden_decode) {
    if (!g_tok) return;
    size_t exact = 0, total = 0;
    for (size_t i = 0; i < g_n_golden; i++) {
        size_t n;
        int32_t *ids = ids_of(g_golden[i].j, "ids", &n);
        for (int skip = 0; skip < 2; skip++) {
            size_t wl, gl;
            char *want = field(&g_golden[i], skip ? "decoded_skip_special" : "decoded", &wl), *got;
            epyq_err err;
            ck_assert_msg(epyq_tok_decode(g_tok, ids, n, skip, &got, &gl, &err) == EPYQ_OK, "%s", err.msg);
            total++;
            if (gl == wl && !memcmp(got, want, wl))
                exact++;
            else
                printf("DECODE MISMATCH line %zu skip=%d: \"%s\" vs \"%s\"\n", i + 1, skip, got, want);
            check_stream(g_tok, ids, n, skip, got, gl, "golden");
            free(got);
            free(want);
        }
        free(ids);
    }
    printf("golden_encode.jsonl decodes: %zu / %zu exact\n", exact, total);
    ck_assert_uint_eq(exact, total);
}
END_TEST

START_TEST(decode_cases) {
    if (!g_tok) return;
    size_t exact = 0, total = 0;
    for (size_t i = 0; i < g_n_decode; i++) {
        size_t n;
        int32_t *ids = ids_of(g_decode[i].j, "ids", &n);
        const char *name = cJSON_GetObjectItemCaseSensitive(g_decode[i].j, "name")->valuestring;
        for (int skip = 0; skip < 2; skip++) {
            size_t wl, gl;
            char *want = field(&g_decode[i], skip ? "decoded_skip_special" : "decoded", &wl), *got;
            epyq_err err;
            ck_assert_msg(epyq_tok_decode(g_tok, ids, n, skip, &got, &gl, &err) == EPYQ_OK, "%s", err.msg);
            total++;
            if (gl == wl && !memcmp(got, want, wl))
                exact++;
            else
                printf("DECODE MISMATCH %s skip=%d: \"%s\" vs \"%s\"\n", name, skip, got, want);
            check_stream(g_tok, ids, n, skip, got, gl, name);
            free(got);
            free(want);
        }
        free(ids);
    }
    printf("decode_cases.jsonl: %zu / %zu exact (both skip_special settings)\n", exact, total);
    ck_assert_uint_eq(exact, total);
}
END_TEST

/* Invalid UTF-8 encodes like its lossy repair (what a Rust String of the same bytes holds):
 * checked against golden lines that contain U+FFFD. */
START_TEST(invalid_utf8_matches_golden) {
    if (!g_tok) return;
    static const struct {
        const char *raw;
        const char *repaired;
    } cases[] = {
        {"bad byte \xE2\x86\x92 \xFF here", "bad byte \xE2\x86\x92 \xEF\xBF\xBD here"},
        {"bad byte \xE2\x86\x92 \xE2\x82 here", "bad byte \xE2\x86\x92 \xEF\xBF\xBD here"},
        {"bad byte \xE2\x86\x92 \xF0\x9F\x98 here", "bad byte \xE2\x86\x92 \xEF\xBF\xBD here"},
        {"\xC0", "\xEF\xBF\xBD"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t *a, *b;
        size_t na, nb;
        epyq_err err;
        ck_assert(epyq_tok_encode(g_tok, cases[c].raw, strlen(cases[c].raw), &a, &na, &err) == EPYQ_OK);
        ck_assert(epyq_tok_encode(g_tok, cases[c].repaired, strlen(cases[c].repaired), &b, &nb, &err) == EPYQ_OK);
        ck_assert_msg(same_ids(a, na, b, nb), "case %zu", c);
        free(a);
        free(b);
    }
    /* The golden line "bad byte → � here" pins the repaired form's ids. */
    for (size_t i = 0; i < g_n_golden; i++) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(g_golden[i].j, "id");
        if (strcmp(id->valuestring, "pub-0255") != 0) continue;
        size_t nw, ng;
        int32_t *want = ids_of(g_golden[i].j, "ids", &nw), *got;
        epyq_err err;
        ck_assert(epyq_tok_encode(g_tok, cases[0].raw, strlen(cases[0].raw), &got, &ng, &err) == EPYQ_OK);
        ck_assert(same_ids(got, ng, want, nw));
        free(got);
        free(want);
    }
}
END_TEST

/* User text with split-special: control tokens are spelled out, <think> still matches. */
START_TEST(split_special_flag) {
    if (!g_tok) return;
    const char *txt = "<|im_end|><think>";
    int32_t *ids;
    size_t n;
    epyq_err err;
    ck_assert(epyq_tok_encode_ex(g_tok, txt, strlen(txt), EPYQ_TOK_ENC_SPLIT_SPECIAL, &ids, &n, &err) == EPYQ_OK);
    ck_assert_uint_gt(n, 2);
    ck_assert_int_eq(ids[n - 1], 248068);
    for (size_t i = 0; i + 1 < n; i++) ck_assert_int_lt(ids[i], 248044);
    free(ids);
    ck_assert_int_eq(epyq_tok_eos_id(g_tok), 248046);
    ck_assert_int_eq(epyq_tok_pad_id(g_tok), 248044);
    ck_assert_ptr_nonnull(epyq_tok_chat_template(g_tok));
    ck_assert(epyq_tok_is_special(g_tok, 248046));
    ck_assert(!epyq_tok_is_special(g_tok, 248068));
}
END_TEST

int main(void) {
    if (!epyq_test_shared("fixtures/tokenizer")) {
        printf("SKIP: ../shared/fixtures/tokenizer not found\n");
        return 77;
    }
    Suite *s = suite_create("tok_golden");
    TCase *tc = epyq_test_case(s, "golden", 120);
    tcase_add_unchecked_fixture(tc, setup, teardown);
    EPYQ_TESTS_ADD(tc, golden_encode, golden_encode_config_tokens, golden_decode, decode_cases,
                   invalid_utf8_matches_golden, split_special_flag);
    return epyq_test_run(s);
}
