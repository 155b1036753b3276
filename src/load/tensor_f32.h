/* src/load/tensor_f32.h — widening small 16/32-bit tensors (norm weights, gates, conv
 * kernels, embedding rows) to fp32.
 *
 * Promise: reads elements [first, first + n) of a BF16, F16 or F32 tensor exactly (widening
 * is lossless) and refuses any other dtype or a range past the tensor with one line naming it. */
#ifndef EPYQ_TENSOR_F32_H
#define EPYQ_TENSOR_F32_H

#include <stddef.h>

#include "load/safetensors.h"

epyq_status epyq_tensor_read_f32(const epyq_tensor *t, size_t first, size_t n, float *out,
                                 epyq_err *err);

/* Number of elements of t (product of its shape). */
size_t epyq_tensor_numel(const epyq_tensor *t);

#endif
