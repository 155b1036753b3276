/* src/synth/write.c — epyq_synth_write: configs, tokenizer, shards (precomputed header, then
 * tensor data streamed through one buffer) and, last, model.safetensors.index.json — so a folder
 * with an index is complete. Shards are written under a temporary name and renamed when done.
 * Written pages are handed to the kernel for write-back and dropped from the page cache as we
 * go, so an 18 GB checkpoint does not push everything else out of memory. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "synth/synth_int.h"

#define SINK_BUF (16u << 20)
#define SINK_MAX_GET (4u << 20)

struct synth_sink {
    int fd;
    const char *path;
    uint8_t *buf;        /* [SINK_BUF] */
    size_t used;
    uint64_t flushed;    /* file offset of buf[0] */
    uint64_t data_done, data_total; /* for progress, over the whole checkpoint */
    uint64_t data_start; /* file offset where tensor data begins */
    epyq_err *err;
    bool failed;
    void (*progress)(void *, uint64_t, uint64_t);
    void *progress_ctx;
};

static bool write_all(synth_sink *s, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(s->fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            epyq_err_set(s->err, EPYQ_E_IO, "%s: write failed: %s", s->path, w < 0 ? strerror(errno) : "no space");
            s->failed = true;
            return false;
        }
        b += w, n -= (size_t)w;
    }
    return true;
}

static bool sink_flush(synth_sink *s) {
    if (s->failed) return false;
    if (!s->used) return true;
    if (!write_all(s, s->buf, s->used)) return false;
    uint64_t off = s->flushed, len = s->used;
    /* start write-back of this piece; wait for the previous one and drop it from the cache */
    sync_file_range(s->fd, (off64_t)off, (off64_t)len, SYNC_FILE_RANGE_WRITE);
    if (off >= SINK_BUF) {
        off64_t prev = (off64_t)(off - SINK_BUF);
        sync_file_range(s->fd, prev, SINK_BUF,
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
        posix_fadvise(s->fd, prev, SINK_BUF, POSIX_FADV_DONTNEED);
    }
    s->flushed += len;
    s->used = 0;
    if (s->progress) s->progress(s->progress_ctx, s->data_done, s->data_total);
    return true;
}

void *synth_sink_get(synth_sink *s, size_t n) {
    if (s->failed || n > SINK_MAX_GET) return NULL;
    if (s->used + n > SINK_BUF && !sink_flush(s)) return NULL;
    void *p = s->buf + s->used;
    s->used += n;
    s->data_done += n;
    return p;
}

static char *shard_name(int32_t i, int32_t n) {
    char *s = malloc(64);
    if (s) snprintf(s, 64, "model-%05d-of-%05d.safetensors", i + 1, n);
    return s;
}

static void header_json(synth_buf *h, const synth_plan *p, size_t first, size_t end) {
    sb_puts(h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = first; i < end; i++) {
        const synth_tensor *t = &p->t[i];
        sb_puts(h, ",");
        sb_json_str(h, t->name);
        sb_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", synth_dtype_name(t->dtype));
        for (int32_t d = 0; d < t->ndim; d++) sb_printf(h, d ? ",%lld" : "%lld", (long long)t->shape[d]);
        sb_printf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->offset,
                  (unsigned long long)(t->offset + t->nbytes));
    }
    sb_puts(h, "}");
    while ((h->len + 8) % 8) sb_put(h, " ", 1); /* safetensors pads the header with spaces */
}

static epyq_status write_shard(const char *dir, const synth_plan *p, int32_t shard, size_t first, size_t end,
                               synth_emitter *em, synth_sink *sk, epyq_synth_stats *stats, epyq_err *err) {
    char *fname = shard_name(shard, p->n_shards);
    char *path = fname ? epyq_path_join(dir, fname) : NULL;
    size_t pl = path ? strlen(path) : 0;
    char *tmp = path ? malloc(pl + 8) : NULL;
    synth_buf h = {0};
    epyq_status st = EPYQ_OK;
    if (!tmp) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "synth: out of memory");
        goto out;
    }
    snprintf(tmp, pl + 8, "%s.part", path);
    header_json(&h, p, first, end);
    if (h.oom) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory building the header", fname);
        goto out;
    }
    sk->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (sk->fd < 0) {
        st = epyq_err_set(err, EPYQ_E_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    sk->path = tmp, sk->used = 0, sk->flushed = 0, sk->failed = false;
    uint64_t hl = h.len;
    memcpy(sk->buf, &hl, 8); /* u64 little-endian header length */
    sk->used = 8;
    const char *hp = h.s;
    size_t left = h.len;
    while (left) { /* header can exceed the buffer for 100k-tensor shards */
        size_t m = left < SINK_MAX_GET ? left : SINK_MAX_GET;
        uint8_t *o = synth_sink_get(sk, m);
        if (!o) break;
        sk->data_done -= m; /* header bytes are not tensor data */
        memcpy(o, hp, m);
        hp += m, left -= m;
    }
    for (size_t i = first; i < end && !sk->failed && !st; i++) st = synth_emit_tensor(em, &p->t[i], sk, err);
    if (!st && !sink_flush(sk)) st = EPYQ_E_IO;
    if (!st && fsync(sk->fd) != 0) st = epyq_err_set(err, EPYQ_E_IO, "%s: fsync: %s", tmp, strerror(errno));
    if (close(sk->fd) != 0 && !st) st = epyq_err_set(err, EPYQ_E_IO, "%s: close: %s", tmp, strerror(errno));
    sk->fd = -1;
    if (!st && rename(tmp, path) != 0)
        st = epyq_err_set(err, EPYQ_E_IO, "%s: rename: %s", path, strerror(errno));
    if (st) unlink(tmp);
    else stats->file_bytes += 8 + h.len + p->shard_bytes[shard];
out:
    sb_free(&h);
    free(tmp), free(path), free(fname);
    return st;
}

static int cmp_str_name(const void *a, const void *b) {
    return strcmp((*(const synth_tensor *const *)a)->name, (*(const synth_tensor *const *)b)->name);
}

static epyq_status write_index(const char *dir, const synth_plan *p, epyq_err *err) {
    const synth_tensor **by = malloc(p->n * sizeof *by);
    char **files = calloc((size_t)p->n_shards, sizeof *files);
    synth_buf b = {0};
    epyq_status st = EPYQ_OK;
    if (!by || !files) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "synth: out of memory");
        goto out;
    }
    for (size_t i = 0; i < p->n; i++) by[i] = &p->t[i];
    qsort(by, p->n, sizeof *by, cmp_str_name);
    for (int32_t i = 0; i < p->n_shards; i++)
        if (!(files[i] = shard_name(i, p->n_shards))) b.oom = true;
    sb_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {\n",
              (unsigned long long)p->total);
    for (size_t i = 0; i < p->n && !b.oom; i++) {
        sb_puts(&b, "    ");
        sb_json_str(&b, by[i]->name);
        sb_puts(&b, ": ");
        sb_json_str(&b, files[by[i]->shard]);
        sb_puts(&b, i + 1 < p->n ? ",\n" : "\n");
    }
    sb_puts(&b, "  }\n}\n");
    st = synth_write_file(dir, "model.safetensors.index.json", &b, err);
out:
    if (files)
        for (int32_t i = 0; i < p->n_shards; i++) free(files[i]);
    free(files), free(by);
    sb_free(&b);
    return st;
}

epyq_status synth_write_file(const char *dir, const char *name, const synth_buf *b, epyq_err *err) {
    if (b->oom) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", name);
    char *path = epyq_path_join(dir, name);
    if (!path) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", name);
    epyq_status st = epyq_file_write_atomic(path, b->s ? b->s : "", b->len, err);
    free(path);
    return st;
}

epyq_status epyq_synth_write(const epyq_synth_opts *o, epyq_synth_stats *stats, epyq_err *err) {
    epyq_synth_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    double t0 = epyq_now();
    if (!o->out_dir || !*o->out_dir) return epyq_err_set(err, EPYQ_E_ARG, "synth: no output directory");
    if ((unsigned)o->format >= EPYQ_SYNTH_NFORMATS) return epyq_err_set(err, EPYQ_E_ARG, "synth: bad format");
    if (o->fused_experts && o->format != EPYQ_SYNTH_BF16)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "synth: fused experts exist only in the BF16 release (int4 writers store experts per expert)");
    epyq_status st = epyq_mkdir_p(o->out_dir, err);
    if (st) return st;
    synth_plan plan;
    if ((st = synth_plan_build(&plan, &o->dims, o->format, o->fused_experts, err))) return st;
    synth_emitter em;
    if ((st = synth_emitter_init(&em, &o->dims, o->seed, o->format, &plan, err))) {
        synth_plan_free(&plan);
        return st;
    }
    synth_sink sk = {.fd = -1, .err = err, .data_total = plan.total, .progress = o->progress,
                     .progress_ctx = o->progress_ctx};
    sk.buf = malloc(SINK_BUF);
    if (!sk.buf) st = epyq_err_set(err, EPYQ_E_NOMEM, "synth: out of memory");
    if (!st) st = synth_write_configs(o->out_dir, &o->dims, o->format, &plan, err);
    if (!st) st = synth_write_tokenizer(o->out_dir, &o->dims, o->tokenizer, err);
    size_t first = 0;
    for (int32_t s = 0; s < plan.n_shards && !st; s++) {
        size_t end = first;
        while (end < plan.n && plan.t[end].shard == s) end++;
        st = write_shard(o->out_dir, &plan, s, first, end, &em, &sk, stats, err);
        first = end;
    }
    if (!st) st = write_index(o->out_dir, &plan, err);
    if (!st) {
        stats->data_bytes = plan.total;
        stats->n_tensors = plan.n;
        stats->n_shards = (size_t)plan.n_shards;
        stats->n_q4_modules = (size_t)plan.n_modules;
        stats->seconds = epyq_now() - t0;
    }
    free(sk.buf);
    synth_emitter_free(&em);
    synth_plan_free(&plan);
    return st;
}
