/* tests/fuzz/fuzz_st_index.c — libFuzzer harness for model.safetensors.index.json parsing. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "load/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    epyq_st_index ix;
    epyq_err err;
    if (epyq_st_index_parse(&ix, (const char *)data, size, "fuzz.index.json", &err) != EPYQ_OK) return 0;
    /* the result must be sorted, unique and made of plain shard names */
    for (size_t i = 0; i < ix.n; i++) {
        if (i && strcmp(ix.names[i - 1], ix.names[i]) >= 0) __builtin_trap();
        if (strchr(ix.files[i], '/')) __builtin_trap();
    }
    epyq_st_index_free(&ix);
    return 0;
}
