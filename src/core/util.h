/* src/core/util.h — small helpers shared by every module: time, files, checked sizes. */
#ifndef EPYQ_UTIL_H
#define EPYQ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Monotonic clock in seconds, and in nanoseconds (for short intervals summed exactly). */
double epyq_now(void);
int64_t epyq_now_ns(void);

/* Read a whole (small) file into a NUL-terminated heap buffer; refuses files over max_bytes. */
epyq_status epyq_file_read(const char *path, size_t max_bytes, char **out, size_t *len, epyq_err *err);

/* Write a whole file atomically (temp file + fsync + rename). */
epyq_status epyq_file_write_atomic(const char *path, const void *data, size_t len, epyq_err *err);

/* Join dir and name into a heap string ("dir/name"). NULL on allocation failure. */
char *epyq_path_join(const char *dir, const char *name);

/* Create a directory and its parents (mkdir -p). */
epyq_status epyq_mkdir_p(const char *path, epyq_err *err);

/* Checked size arithmetic: false on overflow. */
static inline bool epyq_mul_size(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool epyq_add_size(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }

/* bf16/f16 <-> f32 conversions (exact widening; narrowing rounds to nearest even). */
static inline float epyq_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}
static inline uint16_t epyq_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* quiet NaN */
    uint32_t lsb = (v.u >> 16) & 1u;
    return (uint16_t)((v.u + 0x7fffu + lsb) >> 16);
}
float epyq_f16_to_f32(uint16_t h);
uint16_t epyq_f32_to_f16(float f);

/* Parse "1,2,8" into ints; returns count or -1 on a bad list. */
/* Memory a new allocation can take now: EPYQ_MEM_AVAILABLE (bytes; tests, containers that
 * misreport) if set, else MemAvailable of /proc/meminfo, lowered to what a cgroup v2
 * memory.max leaves. source names where the figure came from. false when nothing is known. */
bool epyq_mem_available(uint64_t *bytes, char *source, size_t n);

int epyq_parse_int_list(const char *s, int *out, int max);

#endif
