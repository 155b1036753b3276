/* tests/e2e/synth_model.h — a small synthetic checkpoint for the forward-pass tests, written
 * with src/synth (the same generator as `epyq synth --shape tiny`), so they run without
 * ../shared. Header-only; the folder is left in $TMPDIR for inspection. */
#ifndef EPYQ_TEST_SYNTH_MODEL_H
#define EPYQ_TEST_SYNTH_MODEL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth/synth.h"
#include "tests/testutil.h"

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

#endif
