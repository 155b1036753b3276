/* tests/fuzz/fuzz_st_header.c — libFuzzer harness for the safetensors header parser.
 * The input is a whole file image; on success every tensor's bytes are read so ASan sees any
 * data pointer outside the input. */
#include <stddef.h>
#include <stdint.h>

#include "load/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    epyq_st_header h;
    epyq_err err;
    if (epyq_st_parse(&h, data, size, size, "fuzz.safetensors", &err) != EPYQ_OK) return 0;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < h.n; i++) {
        const uint8_t *p = h.t[i].data;
        if (!p) continue;
        for (size_t j = 0; j < h.t[i].nbytes; j++) sink ^= p[j];
        sink ^= (uint8_t)h.t[i].name[0];
    }
    (void)sink;
    epyq_st_header_free(&h);
    return 0;
}
