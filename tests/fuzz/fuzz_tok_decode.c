/* tests/fuzz/fuzz_tok_decode.c — libFuzzer: arbitrary id sequences (4 input bytes per id,
 * folded into a range a little wider than the vocabulary, plus negative ids) through the
 * one-shot and the streaming decoder, both skip_special settings. Checks: the output is valid
 * UTF-8, no streamed chunk ends inside a UTF-8 sequence, and the chunks add up to the one-shot
 * result. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tok_fuzz_common.h"
#include "tok/sbuf.h"
#include "tok/tok_internal.h"

static epyq_tok *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    bool fixture;
    g_tok = fuzz_tok_load(&fixture);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t n = size / 4;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    int64_t span = (int64_t)epyq_tok_vocab_size(g_tok) + 64;
    for (size_t i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, data + 4 * i, 4);
        /* Mostly single bytes (ids < 256 in both tokenizers) so broken UTF-8 is common. */
        ids[i] = v >> 31 ? (int32_t)(v % 256u) : (int32_t)((int64_t)(v & 0x7FFFFFFF) % span) - 8;
    }
    for (int skip = 0; skip < 2; skip++) {
        char *one;
        size_t ol;
        epyq_err err;
        if (epyq_tok_decode(g_tok, ids, n, skip, &one, &ol, &err) != EPYQ_OK) abort();
        if (!epyq_tok_utf8_valid((const uint8_t *)one, ol)) abort();
        epyq_tok_stream *st = epyq_tok_stream_new(g_tok, skip);
        if (!st) abort();
        epyq_sbuf acc = {0};
        for (size_t i = 0; i <= n; i++) {
            char *chunk;
            size_t cl;
            epyq_status s = i < n ? epyq_tok_stream_push_n(st, ids[i], &chunk, &cl, &err)
                                  : epyq_tok_stream_finish_n(st, &chunk, &cl, &err);
            if (s != EPYQ_OK || !epyq_tok_utf8_valid((const uint8_t *)chunk, cl)) abort();
            if (!epyq_sbuf_add(&acc, chunk, cl)) abort();
            free(chunk);
        }
        if (acc.len != ol || (ol && memcmp(acc.p, one, ol) != 0)) abort();
        epyq_sbuf_free(&acc);
        epyq_tok_stream_free(st);
        free(one);
    }
    free(ids);
    return 0;
}
