/* tests/unit/test_tok_local.c — the tokenizer on a tiny tokenizer.json written by this test
 * (no ../shared needed): 256 byte tokens, nine merges, four added tokens with different flags.
 * Every expected id list below was worked out by hand from those merges, the Qwen3.5 split
 * pattern and the added-token rules; the UTF-8 repair cases follow the Unicode "maximal
 * subpart" examples. Also: the scan and heap BPE loops agree, bad files are refused. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/log.h"
#include "core/util.h"
#include "synth/synth.h"
#include "synth/synth_int.h"
#include "tests/check_main.h"
#include "tests/testutil.h"
#include "tests/unit/tok_tiny.h"
#include "tok/json_text.h"
#include "tok/sbuf.h"
#include "tok/tok_internal.h"
#include "tok/tokenizer.h"

static epyq_tok *g_tiny;
static char *g_tiny_dir;

static void setup(void) {
    epyq_log_set_level(EPYQ_LOG_ERROR); /* the deliberate id mismatch of <think> warns */
    g_tiny_dir = tok_tiny_default();
    ck_assert_ptr_nonnull(g_tiny_dir);
    epyq_err err;
    ck_assert_msg(epyq_tok_load(&g_tiny, g_tiny_dir, &err) == EPYQ_OK, "%s", err.msg);
}

static void teardown(void) { epyq_tok_free(g_tiny); }

static void expect_ids(const epyq_tok *t, const char *text, size_t len, unsigned flags, const int32_t *want, size_t nw) {
    int32_t *ids;
    size_t n;
    epyq_err err;
    ck_assert_msg(epyq_tok_encode_ex(t, text, len, flags, &ids, &n, &err) == EPYQ_OK, "%s", err.msg);
    char got[512] = "";
    for (size_t i = 0; i < n; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%d ", ids[i]);
    ck_assert_msg(n == nw, "\"%s\": %zu ids (%s), want %zu", text, n, got, nw);
    for (size_t i = 0; i < n; i++) ck_assert_msg(ids[i] == want[i], "\"%s\": id %zu is %d, want %d (%s)", text, i, ids[i], want[i], got);
    free(ids);
}

#define EXPECT(text, ...)                                                                                               \
    do {                                                                                                                \
        static const int32_t w_[] = {__VA_ARGS__};                                                                     \
        expect_ids(g_tiny, text, sizeof(text) - 1, 0, w_, sizeof w_ / sizeof w_[0]);                                   \
    } while (0)

START_TEST(merge_order) {
    /* h-e (rank 1) beats l-l (rank 3), so "hell"/"hello" can never form from "hello". */
    EXPECT("hello", 257, 259, 'o');
    /* the same pair three times: leftmost first, so aa aa a. */
    EXPECT("aaaaa", 263, 263, 'a');
    /* Ġ t -> Ġt, h e -> he, Ġt he -> Ġthe */
    EXPECT(" the", 258);
    EXPECT("the the", 't', 257, 258);
    /* the split keeps the letter before "the" in the same piece: no Ġ, no Ġthe */
    EXPECT("athe", 'a', 't', 257);
    /* a digit is its own piece; the contraction is its own piece, case-insensitively */
    EXPECT("1the", '1', 't', 257);
    EXPECT("he's", 257, 264);
    EXPECT("he'S", 257, '\'', 'S');
}
END_TEST

START_TEST(empty_text) {
    int32_t *ids;
    size_t n;
    epyq_err err;
    ck_assert(epyq_tok_encode(g_tiny, "", 0, &ids, &n, &err) == EPYQ_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_ptr_nonnull(ids);
    free(ids);
}
END_TEST

START_TEST(added_tokens) {
    /* <think> is listed with id 300 but, as in the reference, gets the next free id. */
    ck_assert_int_eq(epyq_tok_id(g_tiny, "<think>"), 266);
    ck_assert_int_eq(epyq_tok_vocab_size(g_tiny), 269);
    EXPECT("a<|end|>b", 'a', 265, 'b');
    EXPECT("<think>the", 266, 't', 257);
    /* lstrip/rstrip swallow the spaces around <mask> */
    EXPECT("x <mask>  y", 'x', 267, 'y');
    /* single_word: only where no word character touches it */
    EXPECT("a zz b", 'a', ' ', 268, ' ', 'b');
    EXPECT("azz", 'a', 'z', 'z');
    EXPECT("zz_", 'z', 'z', '_');
    /* leftmost-longest: "<|end|>" inside other text, twice in a row */
    EXPECT("<|end|><|end|>", 265, 265);
    /* split-special spells special tokens out (split by the regex), <think> still matches */
    static const int32_t w[] = {'<', '|', 'e', 'n', 'd', '|', '>', 266};
    expect_ids(g_tiny, "<|end|><think>", 14, EPYQ_TOK_ENC_SPLIT_SPECIAL, w, 8);
    ck_assert(epyq_tok_is_special(g_tiny, 265));
    ck_assert(!epyq_tok_is_special(g_tiny, 266));
    ck_assert_int_eq(epyq_tok_eos_id(g_tiny), 265);
    ck_assert_int_eq(epyq_tok_pad_id(g_tiny), 265);
    ck_assert_str_eq(epyq_tok_chat_template(g_tiny), "{{ x }}");
    ck_assert_int_eq(epyq_tok_id(g_tiny, "<|cfg|>"), -1);
}
END_TEST

START_TEST(config_tokens_option) {
    epyq_tok_opts o = epyq_tok_opts_default();
    o.config_added_tokens = true;
    epyq_tok *t;
    epyq_err err;
    ck_assert_msg(epyq_tok_load_opts(&t, g_tiny_dir, &o, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(epyq_tok_id(t, "<|cfg|>"), 269);
    static const int32_t w[] = {'a', 269};
    expect_ids(t, "a<|cfg|>", 8, 0, w, 2);
    epyq_tok_free(t);
}
END_TEST

START_TEST(nfc_and_invalid_utf8) {
    /* e + COMBINING ACUTE composes to U+00E9 = C3 A9 */
    EXPECT("e\xCC\x81", 0xC3, 0xA9);
    /* an invalid byte becomes U+FFFD = EF BF BD, like a lossy Rust String */
    EXPECT("\xFF", 0xEF, 0xBF, 0xBD);
    /* truncated 3-byte sequence then ASCII: one U+FFFD, then the letter in the same word */
    EXPECT("\xE2\x82" "a", 0xEF, 0xBF, 0xBD, 'a');
    /* a surrogate encoded in UTF-8 is three maximal subparts: three U+FFFD */
    EXPECT("\xED\xA0\x80", 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD);
    /* Unicode 9.0 normalization, as the reference: U+1AC1 (Unicode 14, ccc 230) is a plain
     * starter, so c U+1AC1 U+0327 is neither reordered nor composed to U+00E7 ... */
    EXPECT("c\xE1\xAB\x81\xCC\xA7", 'c', 0xE1, 0xAB, 0x81, 0xCC, 0xA7);
    /* ... and U+11935 U+11930 is not composed to U+11938 (Unicode 13), nor U+11938 touched */
    EXPECT("\xF0\x91\xA4\xB5\xF0\x91\xA4\xB0", 0xF0, 0x91, 0xA4, 0xB5, 0xF0, 0x91, 0xA4, 0xB0);
    EXPECT("\xF0\x91\xA4\xB8", 0xF0, 0x91, 0xA4, 0xB8);
    /* while older marks still compose around it: a U+0301 -> U+00E1, then U+1AC1 as is */
    EXPECT("a\xCC\x81\xE1\xAB\x81", 0xC3, 0xA1, 0xE1, 0xAB, 0x81);
    /* NUL is ordinary text */
    EXPECT("a\0b", 'a', 0, 'b');
}
END_TEST

START_TEST(merge_spellings_and_no_normalizer) {
    char *dir = tok_tiny_write(true, "null", NULL);
    epyq_tok *t;
    epyq_err err;
    ck_assert_msg(epyq_tok_load(&t, dir, &err) == EPYQ_OK, "%s", err.msg);
    static const int32_t w1[] = {257, 259, 'o', 258};
    expect_ids(t, "hello the", 9, 0, w1, 4);
    /* without NFC the combining accent stays a separate code point (CC 81) */
    static const int32_t w2[] = {'e', 0xCC, 0x81};
    expect_ids(t, "e\xCC\x81", 3, 0, w2, 3);
    epyq_tok_free(t);
    free(dir);
}
END_TEST

START_TEST(bad_files_refused) {
    epyq_tok *t;
    epyq_err err;
    char *dir = tok_tiny_write(false, "{\"type\":\"NFKC\"}", NULL);
    ck_assert_int_eq(epyq_tok_load(&t, dir, &err), EPYQ_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "NFKC") != NULL, "%s", err.msg);
    free(dir);
    dir = tok_tiny_write(false, "null", "[\"q\",\"\\u0120nope\"],");
    ck_assert_int_eq(epyq_tok_load(&t, dir, &err), EPYQ_E_FORMAT);
    ck_assert_msg(strstr(err.msg, "merges[9]") != NULL, "%s", err.msg);
    free(dir);
    ck_assert_int_eq(epyq_tok_load(&t, "/nonexistent-epyq-dir", &err), EPYQ_E_IO);
    ck_assert_msg(strstr(err.msg, "tokenizer.json") != NULL, "%s", err.msg);
}
END_TEST

static char *decode(const int32_t *ids, size_t n, bool skip) {
    char *s;
    size_t len;
    epyq_err err;
    ck_assert(epyq_tok_decode(g_tiny, ids, n, skip, &s, &len, &err) == EPYQ_OK);
    return s;
}

START_TEST(decode_rules) {
    static const int32_t ids[] = {258, 265, 266, 9999, -5, 0xC3};
    char *s = decode(ids, 6, false);
    ck_assert_str_eq(s, " the<|end|><think>\xEF\xBF\xBD"); /* unknown ids vanish, lone C3 -> U+FFFD */
    free(s);
    s = decode(ids, 6, true);
    ck_assert_str_eq(s, " the<think>\xEF\xBF\xBD");
    free(s);
    /* the special token between the two halves is dropped, so the bytes join up */
    static const int32_t split[] = {0xC3, 265, 0xA9};
    s = decode(split, 3, true);
    ck_assert_str_eq(s, "\xC3\xA9");
    free(s);
    s = decode(split, 3, false);
    ck_assert_str_eq(s, "\xEF\xBF\xBD<|end|>\xEF\xBF\xBD");
    free(s);
}
END_TEST

START_TEST(stream_holds_partial_utf8) {
    epyq_tok_stream *st = epyq_tok_stream_new(g_tiny, false);
    char *out;
    epyq_err err;
    /* F0 9F 98 8A = U+1F60A, one byte per token */
    static const int32_t ids[] = {'a', 0xF0, 0x9F, 0x98, 0x8A, 0xF0, 0x9F};
    const char *want[] = {"a", "", "", "", "\xF0\x9F\x98\x8A", "", ""};
    for (size_t i = 0; i < 7; i++) {
        ck_assert(epyq_tok_stream_push(st, ids[i], &out, &err) == EPYQ_OK);
        ck_assert_str_eq(out, want[i]);
        free(out);
    }
    ck_assert(epyq_tok_stream_finish(st, &out, &err) == EPYQ_OK);
    ck_assert_str_eq(out, "\xEF\xBF\xBD"); /* the cut-off emoji */
    free(out);
    epyq_tok_stream_free(st);
    /* an impossible continuation is flushed at once instead of waiting */
    st = epyq_tok_stream_new(g_tiny, false);
    ck_assert(epyq_tok_stream_push(st, 0xE2, &out, &err) == EPYQ_OK);
    ck_assert_str_eq(out, "");
    free(out);
    ck_assert(epyq_tok_stream_push(st, 'x', &out, &err) == EPYQ_OK);
    ck_assert_str_eq(out, "\xEF\xBF\xBDx");
    free(out);
    epyq_tok_stream_free(st);
}
END_TEST

/* Unicode 15 section 3.9 "U+FFFD substitution of maximal subparts", and holding back. */
START_TEST(utf8_lossy_rules) {
    static const struct {
        const char *in;
        size_t n;
        const char *out;
    } c[] = {
        {"\xF0\x9F\x98", 3, "\xEF\xBF\xBD"},
        {"\xC0\x80", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xE2\x82\x41", 3, "\xEF\xBF\xBD" "A"},
        {"\xF4\x90\x80\x80", 4, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xF0\x90\x80\x80", 4, "\xF0\x90\x80\x80"},
        {"\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64", 13,
         "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "b\xEF\xBF\xBD" "c\xEF\xBF\xBD\xEF\xBF\xBD" "d"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        epyq_sbuf b = {0};
        ck_assert_uint_eq(epyq_tok_utf8_lossy((const uint8_t *)c[i].in, c[i].n, true, &b), c[i].n);
        ck_assert_msg(b.p && !strcmp(b.p, c[i].out), "case %zu", i);
        epyq_sbuf_free(&b);
    }
    epyq_sbuf b = {0};
    ck_assert_uint_eq(epyq_tok_utf8_lossy((const uint8_t *)"ab\xF0\x9F\x98", 5, false, &b), 2);
    ck_assert_str_eq(b.p, "ab");
    epyq_sbuf_free(&b);
}
END_TEST

/* The linear scan (short words) and the heap (long words) must pick the same merges. */
START_TEST(scan_and_heap_agree) {
    uint64_t x = 88172645463325252ull;
    static const char alphabet[] = "aheltot 's";
    for (int iter = 0; iter < 2000; iter++) {
        int32_t a[200], b[200];
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t n = 1 + x % 199;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char ch = alphabet[x % (sizeof alphabet - 1)];
            a[i] = b[i] = g_tiny->byte_id[(uint8_t)ch];
        }
        size_t na = epyq_tok_bpe_merge(&g_tiny->merges, a, n, 1), nb = epyq_tok_bpe_merge(&g_tiny->merges, b, n, 2);
        ck_assert_uint_eq(na, nb);
        ck_assert(!memcmp(a, b, na * sizeof *a));
    }
}
END_TEST

/* Segment-wise NFC (src/tok/nfc.c) equals utf8proc's NFC of the whole text, on random mixes
 * of starters, marks, precomposed and excluded characters, singletons and Hangul jamo. */
START_TEST(nfc_segments_match_whole_text) {
    static const uint32_t pool[] = {'a', 'e', 'A', ' ', '>', 0xE9, 0xC5, 0x301, 0x327, 0x308, 0x344, 0x340, 0x212B, 0x2126,
                                    0x958, 0x93C, 0x915, 0x1100, 0x1161, 0x11A8, 0xAC00, 0x4E2D, 0x3099, 0x304B, 0x0F73,
                                    0x0F71, 0x11935, 0x1E0A, 0x323, 0x1F600, 0x0B47, 0x0B3E};
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (int iter = 0; iter < 3000; iter++) {
        epyq_sbuf in = {0}, out = {0};
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t len = x % 12;
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            uint8_t u[4];
            utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)pool[x % (sizeof pool / sizeof pool[0])], u);
            epyq_sbuf_add(&in, u, (size_t)k);
        }
        bool changed;
        epyq_err err;
        ck_assert(epyq_tok_nfc((const uint8_t *)in.p, in.len, &out, &changed, &err) == EPYQ_OK);
        utf8proc_uint8_t *whole = NULL;
        utf8proc_ssize_t r = in.len ? utf8proc_map((const utf8proc_uint8_t *)in.p, (utf8proc_ssize_t)in.len, &whole,
                                                   UTF8PROC_STABLE | UTF8PROC_COMPOSE)
                                    : 0;
        const char *got = changed ? out.p : in.p;
        size_t gl = changed ? out.len : in.len;
        ck_assert_msg((size_t)r == gl && (gl == 0 || !memcmp(whole, got, gl)), "iteration %d differs", iter);
        free(whole);
        epyq_sbuf_free(&in);
        epyq_sbuf_free(&out);
    }
}
END_TEST

/* Pieces of the split regex, as Oniguruma cuts them (src/tok/README.md, "Unicode-version
 * differences" item 2): \s is exactly White_Space, so U+180E (a format character since Unicode 6.3;
 * PCRE2's own \s still takes it) and U+001C..U+001F are symbols here, not spaces. */
static void expect_pieces(const char *text, const char *const *want, size_t nw) {
    tok_split_state st = {0};
    const uint8_t *s = (const uint8_t *)text;
    size_t n = strlen(text), pos = 0, k = 0;
    epyq_err err;
    while (pos < n) {
        size_t ms, me;
        bool found;
        ck_assert(epyq_tok_split_find(g_tiny, &st, s, n, pos, &ms, &me, &found, &err) == EPYQ_OK);
        ck_assert(found && ms == pos);
        ck_assert_msg(k < nw && me - ms == strlen(want[k]) && !memcmp(s + ms, want[k], me - ms), "\"%s\": piece %zu is \"%.*s\"",
                      text, k, (int)(me - ms), text + ms);
        k++;
        pos = me;
    }
    ck_assert_uint_eq(k, nw);
    epyq_tok_split_state_free(&st);
}

START_TEST(split_pieces) {
    static const char *const p1[] = {"\xE1\xA0\x8E!"}; /* U+180E then '!': one symbol run */
    expect_pieces("\xE1\xA0\x8E!", p1, 1);
    static const char *const p2[] = {"\x1C!"};
    expect_pieces("\x1C!", p2, 1);
    static const char *const p3[] = {"a", "\xC2\xA0", ("\xE3\x80\x80" "b")}; /* NBSP, then ideographic space before a letter */
    expect_pieces("a\xC2\xA0\xE3\x80\x80" "b", p3, 3);
    static const char *const p4[] = {"Hello", ",", " world", "!\n\n", "  ", " x", "'LL", "1", "2"};
    expect_pieces("Hello, world!\n\n   x'LL12", p4, 9);
    static const char *const p5[] = {"\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\xA8\xE0\xA5\x8D\xE0\xA4\xA6\xE0\xA5\x80"}; /* हिन्दी: marks stay in the word */
    expect_pieces("\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\xA8\xE0\xA5\x8D\xE0\xA4\xA6\xE0\xA5\x80", p5, 1);
}
END_TEST

/* The tokenizer `epyq synth` generates (src/synth/tokgen.c: the Qwen3.6 pipeline around a
 * BPE learnt from a built-in sample): control tokens at the ids synth put them, config-only
 * tokens only with config_added_tokens, decode(encode(x)) == NFC(x), scan == heap. */
START_TEST(synth_tokenizer) {
    epyq_synth_dims d;
    epyq_err err;
    ck_assert_msg(epyq_synth_dims_init(&d, "tiny", 0, 0, 0, &err) == EPYQ_OK, "%s", err.msg);
    char *dir = epyq_test_tmpdir();
    ck_assert_msg(epyq_synth_write_tokenizer(dir, &d, NULL, &err) == EPYQ_OK, "%s", err.msg);
    epyq_tok *t, *tc;
    ck_assert_msg(epyq_tok_load(&t, dir, &err) == EPYQ_OK, "%s", err.msg);
    epyq_tok_opts o = epyq_tok_opts_default();
    o.config_added_tokens = true;
    ck_assert_msg(epyq_tok_load_opts(&tc, dir, &o, &err) == EPYQ_OK, "%s", err.msg);
    /* synth keeps the added tokens inside the embedding rows: small vocabularies get the
     * first vocab - special_base of the 26 (and no config-only ones). */
    int32_t n_json = d.vocab - d.special_base < 26 ? d.vocab - d.special_base : 26;
    ck_assert_int_eq(epyq_tok_vocab_size(t), d.special_base + n_json);
    ck_assert_int_eq(epyq_tok_id(t, "<|endoftext|>"), d.special_base);
    ck_assert_int_eq(epyq_tok_id(t, "<|im_end|>"), d.special_base + 2);
    ck_assert_int_eq(epyq_tok_id(t, "<tool_call>"), d.special_base + 14);
    ck_assert_int_eq(epyq_tok_id(t, "<|audio_pad|>"), -1);
    ck_assert_int_eq(epyq_tok_vocab_size(tc), epyq_tok_vocab_size(t) + (n_json == 26 ? 7 : 0));
    ck_assert(epyq_tok_is_special(t, d.special_base + 2));
    ck_assert(!epyq_tok_is_special(t, d.special_base + 14));
    static const char *const texts[] = {
        "<|im_start|>user\nWrite a function that returns the sum of a list.<|im_end|>\n<|im_start|>assistant\n<tool_call>\n",
        "def add(a, b):\n    return a + b  # caf\xC3\xA9 cafe\xCC\x81 \xE4\xB8\xAD\xE6\x96\x87 123456 \xF0\x9F\x98\x8A\n\n\n",
        "   leading spaces,\ttabs and    runs\r\n", "",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids;
        size_t n, dl;
        ck_assert(epyq_tok_encode(t, texts[i], strlen(texts[i]), &ids, &n, &err) == EPYQ_OK);
        for (size_t k = 0; k < n; k++) ck_assert(ids[k] >= 0 && ids[k] < epyq_tok_vocab_size(t));
        char *dec;
        ck_assert(epyq_tok_decode(t, ids, n, false, &dec, &dl, &err) == EPYQ_OK);
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t r = *texts[i] ? utf8proc_map((const utf8proc_uint8_t *)texts[i], (utf8proc_ssize_t)strlen(texts[i]), &nfc,
                                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE)
                                       : 0;
        ck_assert_msg((size_t)r == dl && (dl == 0 || !memcmp(nfc, dec, dl)), "text %zu: \"%s\"", i, dec);
        /* the generated merges are real: ordinary text takes fewer tokens than bytes */
        if (i == 0) ck_assert_uint_lt(n, strlen(texts[i]) / 2);
        free(nfc);
        free(dec);
        free(ids);
    }
    uint64_t x = 0x853C49E6748FEA9Bull;
    static const char alphabet[] = "the quick brown fox (x) = 42;\n";
    for (int iter = 0; iter < 500; iter++) {
        int32_t a[160], b[160];
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t n = 1 + x % 159;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            a[i] = b[i] = t->byte_id[(uint8_t)alphabet[x % (sizeof alphabet - 1)]];
        }
        size_t na = epyq_tok_bpe_merge(&t->merges, a, n, 1), nb = epyq_tok_bpe_merge(&t->merges, b, n, 2);
        ck_assert(na == nb && !memcmp(a, b, na * sizeof *a));
    }
    epyq_tok_free(t);
    epyq_tok_free(tc);
    free(dir);
}
END_TEST

/* The NUL-safe JSON field reader used by --jsonl and the golden tests. */
START_TEST(json_text_field) {
    char *s;
    size_t n;
    bool found;
    epyq_err err;
    const char *ok = "{\"a\":[1,{\"text\":\"no\"}],\"text\":\"x\\u0000y\\n\\ud83d\\ude0a\\\"\" } ";
    ck_assert(epyq_json_text_field(ok, strlen(ok), "text", &s, &n, &found, &err) == EPYQ_OK);
    ck_assert(found);
    ck_assert_uint_eq(n, 9);
    ck_assert(!memcmp(s, "x\0y\n\xF0\x9F\x98\x8A\"", 9));
    free(s);
    static const char *bad[] = {"{\"text\":\"a\",}", "{\"text\":\"\\ud800\"}", "{\"text\":1}", "[\"text\"]",
                                "{\"text\":\"a\"} x", "{\"text\":\"\xFF\"}", "{\"text\":\"a\nb\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(epyq_json_text_field(bad[i], strlen(bad[i]), "text", &s, &n, &found, &err) == EPYQ_E_FORMAT, "%s", bad[i]);
    ck_assert(epyq_json_text_field("{\"t\":1}", 7, "text", &s, &n, &found, &err) == EPYQ_OK);
    ck_assert(!found);
}
END_TEST

int main(void) {
    Suite *s = suite_create("tok_local");
    TCase *tc = epyq_test_case(s, "tiny", 0);
    tcase_add_unchecked_fixture(tc, setup, teardown);
    EPYQ_TESTS_ADD(tc, merge_order, empty_text, added_tokens, config_tokens_option,
                   nfc_and_invalid_utf8, merge_spellings_and_no_normalizer, bad_files_refused,
                   decode_rules, stream_holds_partial_utf8, utf8_lossy_rules, scan_and_heap_agree,
                   json_text_field, nfc_segments_match_whole_text, synth_tokenizer, split_pieces);
    return epyq_test_run(s);
}
