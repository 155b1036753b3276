/* tests/e2e/synth_model.h — a small synthetic checkpoint for the forward-pass tests, written
 * with src/synth (the same generator as `epyq synth --shape tiny`), so they run without
 * ../shared. Header-only; the folder is removed when the test process exits (EPYQ_KEEP_TMP=1
 * keeps it for inspection, tests/testutil.h). */
#ifndef EPYQ_TEST_SYNTH_MODEL_H
#define EPYQ_TEST_SYNTH_MODEL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "synth/synth.h"
#include "tests/testutil.h"
#include "tok/tokenizer.h"

/* Write a tiny checkpoint of `format` ("ct", "bf16", ...) with `seed`; returns its folder
 * (heap string), or NULL after printing why. Usable outside a running test (no ck_assert). */
static inline char *synth_model(const char *format, uint64_t seed) {
    char *dir = epyq_test_tmpdir();
    epyq_err err = {0};
    epyq_synth_opts o = {0};
    int f = epyq_synth_format_parse(format);
    if (!dir || f < 0) {
        fprintf(stderr, "synth_model: no temporary folder or unknown format %s\n", format);
        free(dir);
        return NULL;
    }
    o.out_dir = dir;
    o.format = (epyq_synth_format)f;
    o.seed = seed;
    epyq_synth_stats st;
    if (epyq_synth_dims_init(&o.dims, "tiny", 0, 0, 0, &err) != EPYQ_OK ||
        epyq_synth_write(&o, &st, &err) != EPYQ_OK) {
        fprintf(stderr, "synth_model: %s\n", err.msg);
        free(dir);
        return NULL;
    }
    return dir;
}

/* The engine-level suites' setup: a tiny ct checkpoint (seed 1) written, its model loaded on
 * one thread with the A8 path, and its tokenizer. 0 when done; else prints why. */
static inline int synth_model_load_tiny(char **dir, epyq_model **m, epyq_tok **tok) {
    if (!(*dir = synth_model("ct", 1))) return 1;
    epyq_err err = {0};
    epyq_model_opts mo = {.path = EPYQ_PATH_A8, .n_threads = 1};
    if (epyq_kern_init(&err) != EPYQ_OK || epyq_model_load(m, *dir, &mo, &err) != EPYQ_OK ||
        epyq_tok_load(tok, *dir, &err) != EPYQ_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    return 0;
}

#endif
