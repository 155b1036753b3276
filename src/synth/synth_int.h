/* src/synth/synth_int.h — pieces of the synthetic-checkpoint writer shared between its files
 * (and its unit tests): counter-based random numbers, the per-tensor init rules, the int4
 * quantizers and packers of each tool, the tensor plan, and Python-style JSON output.
 * Nothing here is used outside src/synth and tests/unit/test_synth*.c. */
#ifndef EPYQ_SYNTH_INT_H
#define EPYQ_SYNTH_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "chat/pyjson.h"
#include "core/status.h"
#include "core/util.h"
#include "kernels-x86/counter_rng.h"
#include "synth/synth.h"
#include "tok/sbuf.h"

/* ---- dtypes synth writes (own table: the generator must not depend on the loader) ---- */
typedef enum { SD_I64 = 0, SD_I32, SD_F32, SD_BF16, SD_F16 } synth_dtype;
size_t epyq_synth_dtype_size(synth_dtype t);
const char *epyq_synth_dtype_name(synth_dtype t);

/* ---- random numbers: value i of a tensor is a pure function of (key, i) ---- */
uint64_t epyq_synth_key(uint64_t seed, const char *name);
/* 64 random bits from 64 (splitmix64's finaliser): keys and other scalar uses */
static inline uint64_t synth_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* Random bits for element i of stream `key` are epyq_rng_bits(key, i) (kernels-x86/counter_rng.h),
 * the stream the kernel table's fill_normal draws normals from; this maps them to [0, 1). */
static inline float synth_uniform(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }
/* bf16 rounding (nearest even) of a finite float, kept as float */
static inline float synth_round_bf16(float x) { return epyq_bf16_to_f32(epyq_f32_to_bf16(x)); }

/* How a logical tensor's values are drawn (chosen from its name, see draw.c). */
typedef enum { RULE_NORMAL, RULE_ONE_PLUS_NORMAL, RULE_A_LOG, RULE_DT_BIAS } synth_rule_kind;
typedef struct {
    synth_rule_kind kind;
    float sigma;
    uint64_t key;
} synth_rule;

epyq_status epyq_synth_rule_for(const epyq_synth_dims *d, uint64_t seed, const char *name,
                                synth_rule *r, epyq_err *err);
/* Elements [first, first + n) of a logical tensor, rounded to bf16: as float, or as bf16 bits. */
void epyq_synth_fill(const synth_rule *r, uint64_t first, size_t n, float *out);
void epyq_synth_fill_bf16(const synth_rule *r, uint64_t first, size_t n, uint16_t *out);

/* ---- int4: canonical codes w = (q - z) * s, q in 0..15, per group of SYNTH_GS along k ---- */
#define SYNTH_GS 128 /* group size of every int4 format synth writes */
/* Quantize W [n][k] by the rule of the tool that writes `f` (docs/quant-formats.md §2): q [n][k],
 * s [n][k/128] (the value as stored: f16 for GPTQ/AWQ, bf16 for CT/Quark), z [n][k/128]. */
/* The act-order column order of an int4 module (epyq_synth_dims.act_order): perm[j] = the
 * input column quantized j-th, a permutation of [0, k) drawn from (seed, logical name). The
 * stored g_idx is then g_idx[perm[j]] = j / 128. */
void epyq_synth_act_perm(uint64_t seed, const char *logical, int32_t k, int32_t *perm);
void epyq_synth_quantize(epyq_synth_format f, const float *w, int32_t n, int32_t k, uint8_t *q, float *s,
                    uint8_t *z);

/* One row of each packed tensor, from canonical codes (row index = the tensor's dim 0). */
void epyq_synth_pack_gptq_qweight(const uint8_t *q, int32_t n, int32_t k, int32_t row, uint32_t *out /*[n]*/);
void epyq_synth_pack_gptq_qzeros(const uint8_t *z, int32_t n, int32_t gn, int32_t g, uint32_t *out /*[n/8]*/);
void epyq_synth_pack_ct(const uint8_t *q, int32_t k, int32_t row, uint32_t *out /*[ceil(k/8)]*/);
/* Quark (int4 two's complement nibbles, AWQ order when reorder) and AWQ (raw nibbles, AWQ order):
 * row `kk` of the [k][ceil(n/8)] tensor packed along n; pass stride = k for codes [n][k]. */
void epyq_synth_pack_along_n(const uint8_t *q, int32_t n, int32_t stride, int32_t kk,
                             bool twos_compl, bool awq_order, uint32_t *out /*[ceil(n/8)]*/);

/* ---- tensor plan ---- */
typedef enum {
    SRC_DENSE,         /* logical tensor `logical`, stored as dtype */
    SRC_FUSED_GATE_UP, /* [E][2I][H]: per expert gate rows then up rows; logical = "<layer>.mlp" */
    SRC_FUSED_DOWN,    /* [E][H][I] */
    SRC_Q_PACKED,      /* int4 module `logical` [n][k]: qweight | weight_packed | weight (Quark) */
    SRC_Q_SCALES,
    SRC_Q_ZEROS,
    SRC_Q_GIDX,
    SRC_Q_SHAPE,
} synth_src;

typedef struct {
    char *name;         /* on-disk tensor name */
    char *logical;      /* see synth_src */
    synth_src src;
    synth_dtype dtype;
    int32_t ndim;
    int64_t shape[5];
    int32_t n, k;       /* linear [n out][k in] (Q_*), per-expert [I][H] (FUSED) */
    int32_t module;     /* Q_*: index into the plan's int4 modules */
    uint64_t nbytes;
    uint64_t offset;    /* within the shard's data section */
    int32_t shard;
} synth_tensor;

typedef struct {
    synth_tensor *t;    /* [n] in file order: shard, then (dtype size desc, name) */
    size_t n, cap;
    int32_t n_modules;  /* int4 modules */
    int32_t *module_parts; /* [n_modules] tensors of the module that need its scales/zeros */
    int32_t n_shards;
    uint64_t *shard_bytes; /* [n_shards] data bytes */
    uint64_t total;     /* sum of tensor bytes */
} synth_plan;

epyq_status epyq_synth_plan_build(synth_plan *p, const epyq_synth_dims *d, epyq_synth_format f,
                                  bool fused, epyq_err *err);
void epyq_synth_plan_free(synth_plan *p);

/* ---- streaming tensor data ---- */
typedef struct synth_sink synth_sink;
/* n bytes of output space (n <= 4 MiB), flushed to the shard file as it fills; NULL after an
 * I/O error (the sink keeps the message). */
void *epyq_synth_sink_get(synth_sink *s, size_t n);

/* Generates the bytes of planned tensors in any order; int4 modules are quantized once, their
 * scales/zeros kept until the module's last part that needs them is written. */
struct epyq_pool;
typedef struct {
    const epyq_synth_dims *d;
    uint64_t seed;
    epyq_synth_format f;
    const synth_plan *p;
    struct epyq_pool *pool; /* generator threads (not owned); values never depend on the split */
    int32_t nw;           /* pool workers */
    int32_t cur;          /* int4 module whose codes are in q, or -1 */
    uint8_t *q;           /* [n][k] codes of module cur */
    float *rows;          /* [nw][row_cap] one row of master weights per worker */
    size_t q_cap, row_cap;
    float **ms;           /* [n_modules] scales [n][k/128] while parts are pending */
    uint8_t **mz;         /* [n_modules] zeros [n][k/128] */
    int32_t *left;        /* [n_modules] pending scale/zero parts */
} synth_emitter;

epyq_status epyq_synth_emitter_init(synth_emitter *e, const epyq_synth_dims *d, uint64_t seed,
                                    epyq_synth_format f, const synth_plan *p,
                                    struct epyq_pool *pool, epyq_err *err);
epyq_status epyq_synth_emit_tensor(synth_emitter *e, const synth_tensor *t, synth_sink *s, epyq_err *err);
void epyq_synth_emitter_free(synth_emitter *e);

/* ---- growable string and Python-json-style output ----
 * The tok layer's string (epyq_sbuf) and json.dumps string escaper (epyq_pyjson_str) with one
 * sticky failure flag: the writers append unchecked and test `oom` once before writing the
 * file (epyq_synth_write_file refuses a buffer with oom set). */
typedef struct {
    epyq_sbuf b;
    bool oom;
} synth_buf;
static inline void sb_put(synth_buf *b, const char *s, size_t n) {
    if (!b->oom && !epyq_sbuf_add(&b->b, s, n)) b->oom = true;
}
static inline void sb_puts(synth_buf *b, const char *s) { sb_put(b, s, strlen(s)); }
static inline void sb_printf(synth_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void sb_printf(synth_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) b->oom = true; /* only short fragments are formatted */
    else sb_put(b, tmp, (size_t)n);
}
/* quoted, JSON-escaped; non-ASCII kept as UTF-8 */
static inline void sb_json_str(synth_buf *b, const char *s) {
    if (!b->oom && !epyq_pyjson_str(&b->b, s, strlen(s))) b->oom = true;
}
static inline void sb_free(synth_buf *b) {
    epyq_sbuf_free(&b->b);
    b->oom = false;
}

/* config.json, generation_config.json (+ quantize_config.json) into dir. */
epyq_status epyq_synth_write_configs(const char *dir, const epyq_synth_dims *d, epyq_synth_format f,
                                     const synth_plan *p, epyq_err *err);
/* tokenizer.json + tokenizer_config.json into dir (generated BPE, or copied from `from`). */
epyq_status epyq_synth_write_tokenizer(const char *dir, const epyq_synth_dims *d, const char *from,
                                       epyq_err *err);
epyq_status epyq_synth_write_file(const char *dir, const char *name, const synth_buf *b, epyq_err *err);

extern const char epyq_synth_chat_template[]; /* Qwen3.6-35B-A3B chat template (Apache-2.0) */
extern const char epyq_synth_corpus[];        /* English/code sample the BPE merges are learnt from */

#endif
