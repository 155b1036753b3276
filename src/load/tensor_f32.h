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

/* Asks the kernel to start reading elements [first, first + n) of t from its shard now
 * (MADV_WILLNEED on the pages they lie in); a hint that never fails. Why: an embedding row
 * whose page the VM has reclaimed costs a disk read of ~0.4-0.7 ms, and a batch of 32 tokens
 * touching 32 such rows one after another waited for 32 reads in turn. */
void epyq_tensor_prefetch(const epyq_tensor *t, size_t first, size_t n);

/* Number of elements of t (product of its shape). */
size_t epyq_tensor_numel(const epyq_tensor *t);

#endif
