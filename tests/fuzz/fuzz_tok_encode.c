/* tests/fuzz/fuzz_tok_encode.c — libFuzzer: arbitrary bytes through epyq_tok_encode.
 * Beyond "no crash, no sanitizer report": every id is a real token, and on the fixture
 * tokenizer (whose added tokens strip nothing and start with '<' and end with '>') decoding
 * gives back exactly the UTF-8-repaired, NFC-normalized input: the pipeline neither loses nor
 * invents a byte. One exception, by design: added tokens are cut out of the raw text before
 * NFC runs on the gaps between them, and '>' is the one boundary character NFC can compose
 * with the text beside it ('>' U+0338 -> U+226F). So when the input holds U+0338, the
 * decoded text may keep "<think>" U+0338 where whole-text NFC would give "<think" U+226F;
 * it must still normalize to the same text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tok_fuzz_common.h"
#include "tok/sbuf.h"
#include "tok/tok_internal.h"

static epyq_tok *g_tok;
static bool g_fixture;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same_bytes(const char *a, size_t al, const char *b, size_t bl) {
    return al == bl && (al == 0 || memcmp(a, b, al) == 0);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    g_tok = fuzz_tok_load(&g_fixture);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    /* First byte picks the mode, the rest is the text. */
    unsigned flags = data[0] & 1 ? EPYQ_TOK_ENC_SPLIT_SPECIAL : 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids;
    size_t n;
    epyq_err err;
    if (epyq_tok_encode_ex(g_tok, text, len, flags, &ids, &n, &err) != EPYQ_OK) abort();
    int32_t vocab = epyq_tok_vocab_size(g_tok);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) abort();
    char *dec;
    size_t dl;
    if (epyq_tok_decode(g_tok, ids, n, false, &dec, &dl, &err) != EPYQ_OK) abort();
    if (!epyq_tok_utf8_valid((const uint8_t *)dec, dl)) abort();
    if (g_fixture) {
        epyq_sbuf fixed = {0};
        if (epyq_tok_utf8_lossy((const uint8_t *)text, len, true, &fixed) == SIZE_MAX) abort();
        /* NFC as the tokenizer defines it (Unicode 9.0 behaviour; epyq_tok_nfc itself is checked
         * against utf8proc in test_tok_local). */
        epyq_sbuf nfc = {0};
        bool changed;
        if (epyq_tok_nfc((const uint8_t *)fixed.p, fixed.len, &nfc, &changed, &err) != EPYQ_OK) abort();
        const char *want = changed ? nfc.p : fixed.p;
        size_t wl = changed ? nfc.len : fixed.len;
        if (!same_bytes(want, wl, dec, dl)) {
            if (!memmem(fixed.p, fixed.len, "\xcc\xb8", 2)) abort(); /* no U+0338: must match */
            epyq_sbuf dec_nfc = {0};
            bool dec_changed;
            if (epyq_tok_nfc((const uint8_t *)dec, dl, &dec_nfc, &dec_changed, &err) != EPYQ_OK)
                abort();
            if (!dec_changed || !same_bytes(want, wl, dec_nfc.p, dec_nfc.len)) abort();
            epyq_sbuf_free(&dec_nfc);
        }
        epyq_sbuf_free(&nfc);
        epyq_sbuf_free(&fixed);
    }
    free(dec);
    free(ids);
    return 0;
}
