/* tests/fuzz/fuzz_tok_load.c — libFuzzer: arbitrary bytes as a checkpoint's tokenizer files
 * (tokenizer.json, optionally a NUL byte and tokenizer_config.json), loaded by epyq_tok_load
 * from a scratch folder — the loader reads text from the internet: its own JSON cursor
 * (src/tok/json_text.c) over the vocab and merges, cJSON for the rest, PCRE2 patterns.
 * Checks: a load either fails with one non-empty line or gives a tokenizer that encodes a
 * fixed text (specials split) into ids inside its vocabulary, and decodes them into valid
 * UTF-8. Seeds: the tiny tokenizer of tests/unit/tok_tiny.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/testutil.h"
#include "tok/tok_internal.h"
#include "tok/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *g_dir, *g_tok_path, *g_cfg_path;

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (!p) abort();
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static void cleanup(void) {
    unlink(g_tok_path);
    unlink(g_cfg_path);
    rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    /* the loader warns about odd but accepted tokenizers: thousands of lines a second here */
    setenv("EPYQ_LOG_LEVEL", "0", 0);
    if (!(g_dir = epyq_test_tmpdir())) abort();
    g_tok_path = join(g_dir, "tokenizer.json");
    g_cfg_path = join(g_dir, "tokenizer_config.json");
    atexit(cleanup);
    return 0;
}

static void put(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, '\0', size);
    size_t n_tok = nul ? (size_t)(nul - data) : size;
    put(g_tok_path, data, n_tok);
    if (nul)
        put(g_cfg_path, nul + 1, size - n_tok - 1);
    else
        unlink(g_cfg_path);
    epyq_tok *t = NULL;
    epyq_err err = {0};
    if (epyq_tok_load(&t, g_dir, &err) != EPYQ_OK) {
        if (err.code == EPYQ_OK || !err.msg[0] || strchr(err.msg, '\n')) abort();
        return 0;
    }
    static const char text[] = "<|end|>Hello, the world's 123 caf\xc3\xa9 \xe4\xb8\xad <think>zz\n\n";
    int32_t *ids = NULL;
    size_t n = 0;
    if (epyq_tok_encode_ex(t, text, sizeof text - 1, EPYQ_TOK_ENC_SPLIT_SPECIAL, &ids, &n, &err) != EPYQ_OK) {
        /* a pattern may fail at match time (PCRE2 limits): a clean error is fine */
        if (err.code == EPYQ_OK || !err.msg[0] || strchr(err.msg, '\n')) abort();
    } else {
        int32_t vocab = epyq_tok_vocab_size(t);
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= vocab) abort();
        char *dec = NULL;
        size_t dl = 0;
        if (epyq_tok_decode(t, ids, n, false, &dec, &dl, &err) != EPYQ_OK || !epyq_tok_utf8_valid((const uint8_t *)dec, dl))
            abort();
        free(dec);
    }
    free(ids);
    epyq_tok_free(t);
    return 0;
}
