/* tests/fuzz/fuzz_image.c — libFuzzer harness for image input: PNG/JPEG decoding
 * (src/vision/image.c) and, for what decodes, smart_resize + bicubic resize + patches
 * (src/vision/preproc.c). The pixel cap is lowered to 4 Mpixel and the processor's to 64 K so
 * each input costs milliseconds; a refusal is fine, a crash, leak or sanitizer report is not. */
#include <stddef.h>
#include <stdint.h>

#include "vision/image.h"
#include "vision/preproc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    epyq_image im;
    epyq_err err;
    if (epyq_image_decode(&im, data, size, "fuzz.img", 1u << 22, &err) != EPYQ_OK) return 0;
    epyq_vision_pp pp = {.patch = 16,
                         .temporal = 2,
                         .merge = 2,
                         .min_pixels = 1024,
                         .max_pixels = 65536,
                         .do_resize = true,
                         .do_rescale = true,
                         .do_normalize = true,
                         .rescale = 1.0 / 255,
                         .mean = {0.5, 0.5, 0.5},
                         .std = {0.5, 0.5, 0.5}};
    epyq_vision_input in;
    if (epyq_vision_prepare(&pp, &im, "fuzz.img", &in, &err) == EPYQ_OK)
        epyq_vision_input_free(&in);
    epyq_image_free(&im);
    return 0;
}
