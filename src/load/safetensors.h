/* src/load/safetensors.h — validated, memory-mapped safetensors checkpoints.
 *
 * Promise: after epyq_ckpt_open() succeeds, every tensor's [data, data + nbytes) lies inside
 * its shard's mapping, nbytes == product(shape) * dtype size (checked arithmetic), tensors of a
 * shard tile its data section exactly (no gap, no overlap), names are unique across shards, and
 * (for sharded folders) model.safetensors.index.json and the shards agree exactly. Every rule of
 * docs/architecture.md §3.1 is enforced; a violation returns EPYQ_E_FORMAT with one
 * line naming the file, the tensor and the rule. Nothing is read past a mapping and no
 * allocation is sized by an unchecked field. */
#ifndef EPYQ_SAFETENSORS_H
#define EPYQ_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define EPYQ_ST_MAX_DIMS 8
#define EPYQ_ST_HEADER_MAX 100000000u /* safetensors' own cap on the JSON header */
#define EPYQ_ST_NAME_MAX 512u          /* longest tensor name accepted (real ones are < 100) */
#define EPYQ_ST_MAX_TENSORS 2000000u   /* per checkpoint; the real per-expert model has ~100k */
#define EPYQ_ST_MAX_SHARDS 4096u
#define EPYQ_ST_INDEX_MAX (256u << 20)  /* model.safetensors.index.json size cap */

typedef enum {
    EPYQ_DT_BOOL, EPYQ_DT_U8, EPYQ_DT_I8, EPYQ_DT_F8_E5M2, EPYQ_DT_F8_E4M3, EPYQ_DT_I16,
    EPYQ_DT_U16, EPYQ_DT_F16, EPYQ_DT_BF16, EPYQ_DT_I32, EPYQ_DT_U32, EPYQ_DT_F32,
    EPYQ_DT_F64, EPYQ_DT_I64, EPYQ_DT_U64, EPYQ_DT_COUNT
} epyq_dtype;

size_t epyq_dtype_size(epyq_dtype dt);
const char *epyq_dtype_name(epyq_dtype dt);          /* "BF16" … */
int epyq_dtype_parse(const char *s);                 /* -1 if unknown */

typedef struct {
    const char *name;                 /* full tensor name */
    epyq_dtype dtype;
    int32_t ndim;
    int64_t shape[EPYQ_ST_MAX_DIMS];  /* [ndim] */
    const void *data;                 /* inside the shard mapping, little-endian, row-major */
    size_t nbytes;
    int32_t shard;                    /* index into the checkpoint's shard list */
} epyq_tensor;

typedef struct epyq_ckpt epyq_ckpt;   /* a folder: one model.safetensors or N shards + index */

/* Open and validate every shard of the checkpoint folder `dir`. */
epyq_status epyq_ckpt_open(epyq_ckpt **out, const char *dir, epyq_err *err);
void epyq_ckpt_free(epyq_ckpt *c);

size_t epyq_ckpt_count(const epyq_ckpt *c);
const epyq_tensor *epyq_ckpt_at(const epyq_ckpt *c, size_t i);       /* sorted by name */
const epyq_tensor *epyq_ckpt_find(const epyq_ckpt *c, const char *name);
size_t epyq_ckpt_nshards(const epyq_ckpt *c);
const char *epyq_ckpt_shard_path(const epyq_ckpt *c, size_t i);
uint64_t epyq_ckpt_total_bytes(const epyq_ckpt *c);                    /* sum of shard file sizes */
const char *epyq_ckpt_dir(const epyq_ckpt *c);

/* Parse one safetensors header held in memory (the fuzz entry point, and used by open).
 * buf/len: the whole file image (or at least its first 8 + N bytes when file_size says more).
 * On success *out holds tensors with data pointers into buf (NULL data if beyond len). */
typedef struct {
    epyq_tensor *t;   /* [n] sorted by data offset */
    size_t n;
    char *names;      /* storage for t[i].name */
    uint64_t header_len, data_start, data_len;
} epyq_st_header;

epyq_status epyq_st_parse(epyq_st_header *out, const uint8_t *buf, size_t len, uint64_t file_size,
                          const char *file_label, epyq_err *err);
void epyq_st_header_free(epyq_st_header *h);

/* Parse model.safetensors.index.json text: fills names[i] -> shard file (for tests/fuzz). */
typedef struct {
    size_t n;
    char **names;   /* [n] tensor names, sorted */
    char **files;   /* [n] shard file of names[i] */
} epyq_st_index;
epyq_status epyq_st_index_parse(epyq_st_index *out, const char *json, size_t len,
                                const char *file_label, epyq_err *err);
void epyq_st_index_free(epyq_st_index *ix);

#endif
