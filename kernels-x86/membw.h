/* kernels-x86/membw.h — "how fast can this machine stream memory right now".
 *
 * Promise: STREAM-style bandwidth over a buffer the caller sizes far beyond the last-level
 * cache, on `threads` plain pthreads pinned one per allowed CPU (in sched_getaffinity
 * order), each first-touching its own slice so pages sit on its NUMA node. Every kernel
 * figure in benchmarks/ and `epyq bench` is quoted as a fraction of the read figure.
 *   READ : sum of every float with the dispatch table's stream_read (AVX-512 loads on the
 *          avx512 tables, 8 interleaved sequential streams per thread: the most a thread
 *          can read, which is what a weight-streaming GEMV should reach); bytes = buffer.
 *   COPY : b[i] = a[i];           bytes = 2 x array (STREAM convention: write-allocate
 *   TRIAD: a[i] = b[i] + s c[i];  bytes = 3 x array   traffic is not counted)
 * The buffer is split into equal arrays (1 for READ, 2 for COPY, 3 for TRIAD). */
#ifndef EPYQ_MEMBW_H
#define EPYQ_MEMBW_H

#include <stddef.h>

#include "core/status.h"

typedef enum { EPYQ_MEMBW_READ = 0, EPYQ_MEMBW_COPY, EPYQ_MEMBW_TRIAD } epyq_membw_op;

typedef struct {
    double median_gbps, min_gbps, max_gbps; /* over the timed repetitions, 1 GB = 1e9 B */
    int reps;
    size_t bytes;                           /* bytes moved per repetition (see above) */
} epyq_membw_result;

/* One operation: an untimed warm-up pass, then `reps` timed passes (reps >= 1).
 * bytes: total buffer size (>= 1 MiB; rounded down to whole cache lines per thread). */
epyq_status epyq_membw_measure(epyq_membw_op op, size_t bytes, int threads, int reps,
                               epyq_membw_result *out, epyq_err *err);

/* Median read bandwidth in GB/s (5 repetitions), or a negative value when the buffer cannot
 * be allocated or the threads cannot start. For benchmarks: one call, one number. */
double epyq_membw_read_gbps(size_t bytes, int threads);

const char *epyq_membw_op_name(epyq_membw_op op);

#endif
