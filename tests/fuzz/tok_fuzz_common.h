/* tests/fuzz/tok_fuzz_common.h — the tokenizer the tokenizer fuzzers run on: the fixture's
 * Qwen3.6 stand-in when ../shared is there (EPYQ_SHARED, or ../shared next to the source
 * tree), else the tiny tokenizer of tests/unit/tok_tiny.h. */
#ifndef EPYQ_TOK_FUZZ_COMMON_H
#define EPYQ_TOK_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "tests/unit/tok_tiny.h"
#include "tok/tokenizer.h"

static inline epyq_tok *fuzz_tok_load(bool *is_fixture) {
    const char *dir = epyq_test_shared("fixtures/tokenizer");
    struct stat sb;
    if (!dir && stat(EPYQ_FUZZ_SRCDIR "/../shared/fixtures/tokenizer/tokenizer.json", &sb) == 0)
        dir = EPYQ_FUZZ_SRCDIR "/../shared/fixtures/tokenizer";
    char *tiny = dir ? NULL : tok_tiny_default();
    epyq_tok *t = NULL;
    epyq_err err;
    if (epyq_tok_load(&t, dir ? dir : tiny, &err) != EPYQ_OK) {
        fprintf(stderr, "fuzz: cannot load the tokenizer: %s\n", err.msg);
        abort();
    }
    fprintf(stderr, "fuzz: tokenizer from %s\n", dir ? dir : tiny);
    *is_fixture = dir != NULL;
    free(tiny);
    return t;
}

#endif
