/* src/load/tensor_f32.c — see tensor_f32.h. */
#include "load/tensor_f32.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/util.h"

void epyq_tensor_prefetch(const epyq_tensor *t, size_t first, size_t n) {
    size_t numel = epyq_tensor_numel(t), es = epyq_dtype_size(t->dtype);
    long pg = sysconf(_SC_PAGESIZE);
    if (!t->data || es == 0 || pg <= 0 || first > numel || n > numel - first || n == 0) return;
    uintptr_t a = (uintptr_t)t->data + first * es, e = a + n * es;
    a &= ~((uintptr_t)pg - 1);
    (void)madvise((void *)a, e - a, MADV_WILLNEED);
}

size_t epyq_tensor_numel(const epyq_tensor *t) {
    size_t n = 1;
    for (int32_t d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

epyq_status epyq_tensor_read_f32(const epyq_tensor *t, size_t first, size_t n, float *out,
                                 epyq_err *err) {
    size_t numel = epyq_tensor_numel(t);
    if (first > numel || n > numel - first)
        return epyq_err_set(err, EPYQ_E_SHAPE, "%s: elements [%zu, %zu) requested, tensor has %zu",
                            t->name, first, first + n, numel);
    if (!t->data)
        return epyq_err_set(err, EPYQ_E_INTERNAL, "%s: tensor data is not mapped", t->name);
    switch (t->dtype) {
    case EPYQ_DT_F32:
        /* memcpy: safetensors data is only guaranteed byte-aligned */
        memcpy(out, (const char *)t->data + first * 4, n * 4);
        return EPYQ_OK;
    case EPYQ_DT_BF16:
    case EPYQ_DT_F16: {
        const unsigned char *p = (const unsigned char *)t->data + first * 2;
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | (p[2 * i + 1] << 8));
            out[i] = t->dtype == EPYQ_DT_BF16 ? epyq_bf16_to_f32(h) : epyq_f16_to_f32(h);
        }
        return EPYQ_OK;
    }
    default:
        return epyq_err_set(err, EPYQ_E_SHAPE, "%s: dtype %s where BF16, F16 or F32 was expected",
                            t->name, epyq_dtype_name(t->dtype));
    }
}
