/* src/synth/write.c — epyq_synth_write: configs, tokenizer, shards (precomputed header, then
 * tensor data streamed through two buffers: the caller fills one while a writer thread writes
 * the other) and, last, model.safetensors.index.json — so a folder with an index is complete.
 * Shards are written under a temporary name and renamed when done. Written pages are handed to
 * the kernel for write-back and dropped from the page cache as we go, so an 18 GB checkpoint
 * does not push everything else out of memory. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "numa/pool.h"
#include "synth/synth_int.h"

#define SINK_BUF (16u << 20)
#define SINK_MAX_GET (4u << 20)

struct synth_sink {
    uint8_t *buf[2];     /* [SINK_BUF] each: buf[cur] is being filled */
    int cur;
    size_t used;         /* bytes of buf[cur] */
    uint64_t data_done, data_total; /* tensor bytes, for progress */
    void (*progress)(void *, uint64_t, uint64_t);
    void *progress_ctx;
    /* writer thread: writes `pend` (pend_len bytes) to fd at file offset pend_off */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const uint8_t *pend;
    size_t pend_len;
    uint64_t pend_off, file_off; /* file_off: offset of the next handed-off byte */
    int fd;
    const char *path;
    bool quit, failed;
    epyq_err werr;       /* the writer thread's error */
};

static bool write_range(synth_sink *s, const uint8_t *b, size_t n) {
    while (n) {
        ssize_t w = write(s->fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            epyq_err_set(&s->werr, EPYQ_E_IO, "%s: write failed: %s", s->path, w < 0 ? strerror(errno) : "no space");
            return false;
        }
        b += w, n -= (size_t)w;
    }
    return true;
}

static void *writer_main(void *arg) {
    synth_sink *s = arg;
    uint64_t prev_off = 0, prev_len = 0; /* the piece before, still being written back */
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->pend && !s->quit) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->pend) break;
        const uint8_t *b = s->pend;
        size_t n = s->pend_len;
        uint64_t off = s->pend_off;
        pthread_mutex_unlock(&s->mu);
        bool ok = s->failed ? false : write_range(s, b, n);
        if (ok) {
            /* start write-back of this piece; wait for the one before and drop it from the cache */
            sync_file_range(s->fd, (off64_t)off, (off64_t)n, SYNC_FILE_RANGE_WRITE);
            if (off > 0 && prev_len) {
                sync_file_range(s->fd, (off64_t)prev_off, (off64_t)prev_len,
                                SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
                posix_fadvise(s->fd, (off_t)prev_off, (off_t)prev_len, POSIX_FADV_DONTNEED);
            }
            prev_off = off, prev_len = n;
        }
        pthread_mutex_lock(&s->mu);
        if (!ok) s->failed = true;
        s->pend = NULL;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Wait until the writer has finished what it was given; false if any write failed. */
static bool sink_wait(synth_sink *s) {
    pthread_mutex_lock(&s->mu);
    while (s->pend) pthread_cond_wait(&s->cv, &s->mu);
    bool ok = !s->failed;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* Hand the filled buffer to the writer and continue in the other one. */
static bool sink_flush(synth_sink *s) {
    if (!sink_wait(s)) return false;
    if (!s->used) return true;
    pthread_mutex_lock(&s->mu);
    s->pend = s->buf[s->cur], s->pend_len = s->used, s->pend_off = s->file_off;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    s->file_off += s->used;
    s->cur ^= 1, s->used = 0;
    if (s->progress) s->progress(s->progress_ctx, s->data_done, s->data_total);
    return true;
}

void *epyq_synth_sink_get(synth_sink *s, size_t n) {
    if (n > SINK_MAX_GET) return NULL;
    if (s->used + n > SINK_BUF && !sink_flush(s)) return NULL;
    void *p = s->buf[s->cur] + s->used;
    s->used += n;
    s->data_done += n;
    return p;
}

static epyq_status sink_init(synth_sink *s, const synth_plan *p, const epyq_synth_opts *o, epyq_err *err) {
    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->data_total = p->total, s->progress = o->progress, s->progress_ctx = o->progress_ctx;
    s->buf[0] = malloc(SINK_BUF);
    s->buf[1] = malloc(SINK_BUF);
    if (!s->buf[0] || !s->buf[1]) {
        free(s->buf[0]), free(s->buf[1]);
        return epyq_err_set(err, EPYQ_E_NOMEM, "synth: out of memory for output buffers");
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
        free(s->buf[0]), free(s->buf[1]);
        return epyq_err_set(err, EPYQ_E_INTERNAL, "synth: cannot start the writer thread");
    }
    return EPYQ_OK;
}

static void sink_free(synth_sink *s) {
    pthread_mutex_lock(&s->mu);
    s->quit = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->buf[0]), free(s->buf[1]);
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
        sb_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", epyq_synth_dtype_name(t->dtype));
        for (int32_t d = 0; d < t->ndim; d++) sb_printf(h, d ? ",%lld" : "%lld", (long long)t->shape[d]);
        sb_printf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->offset,
                  (unsigned long long)(t->offset + t->nbytes));
    }
    sb_puts(h, "}");
    while ((h->b.len + 8) % 8) sb_put(h, " ", 1); /* safetensors pads the header with spaces */
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
    if (!sink_wait(sk)) {
        st = epyq_err_set(err, sk->werr.code, "%s", sk->werr.msg);
        goto out;
    }
    sk->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (sk->fd < 0) {
        st = epyq_err_set(err, EPYQ_E_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    sk->path = tmp, sk->used = 0, sk->file_off = 0;
    uint64_t hl = h.b.len;
    uint8_t *o = epyq_synth_sink_get(sk, 8); /* u64 little-endian header length */
    if (o) memcpy(o, &hl, 8);
    const char *hp = h.b.p;
    size_t left = h.b.len;
    while (left && o) { /* the header can exceed the buffer for 100k-tensor shards */
        size_t m = left < SINK_MAX_GET ? left : SINK_MAX_GET;
        if ((o = epyq_synth_sink_get(sk, m))) memcpy(o, hp, m);
        hp += m, left -= m;
    }
    sk->data_done -= 8 + h.b.len; /* header bytes are not tensor data */
    for (size_t i = first; i < end && !st; i++) st = epyq_synth_emit_tensor(em, &p->t[i], sk, err);
    bool ok = sink_flush(sk) && sink_wait(sk);
    if (!ok && (!st || st == EPYQ_E_IO)) st = epyq_err_set(err, sk->werr.code, "%s", sk->werr.msg);
    if (!st && fsync(sk->fd) != 0) st = epyq_err_set(err, EPYQ_E_IO, "%s: fsync: %s", tmp, strerror(errno));
    if (close(sk->fd) != 0 && !st) st = epyq_err_set(err, EPYQ_E_IO, "%s: close: %s", tmp, strerror(errno));
    sk->fd = -1;
    if (!st && rename(tmp, path) != 0)
        st = epyq_err_set(err, EPYQ_E_IO, "%s: rename: %s", path, strerror(errno));
    if (st) unlink(tmp);
    else stats->file_bytes += 8 + h.b.len + p->shard_bytes[shard];
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
    st = epyq_synth_write_file(dir, "model.safetensors.index.json", &b, err);
out:
    if (files)
        for (int32_t i = 0; i < p->n_shards; i++) free(files[i]);
    free(files), free(by);
    sb_free(&b);
    return st;
}

epyq_status epyq_synth_write_file(const char *dir, const char *name, const synth_buf *b, epyq_err *err) {
    if (b->oom) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", name);
    char *path = epyq_path_join(dir, name);
    if (!path) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", name);
    epyq_status st = epyq_file_write_atomic(path, b->b.p ? b->b.p : "", b->b.len, err);
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
    if ((st = epyq_synth_plan_build(&plan, &o->dims, o->format, o->fused_experts, err))) return st;
    epyq_pool *pool;
    epyq_pool_opts po = {.n_threads = o->threads, .node = -1};
    if ((st = epyq_pool_create(&pool, &po, err))) {
        epyq_synth_plan_free(&plan);
        return st;
    }
    synth_emitter em;
    if ((st = epyq_synth_emitter_init(&em, &o->dims, o->seed, o->format, &plan, pool, err))) {
        epyq_pool_free(pool);
        epyq_synth_plan_free(&plan);
        return st;
    }
    synth_sink sk;
    if ((st = sink_init(&sk, &plan, o, err))) {
        epyq_synth_emitter_free(&em);
        epyq_pool_free(pool);
        epyq_synth_plan_free(&plan);
        return st;
    }
    if (!st) st = epyq_synth_write_configs(o->out_dir, &o->dims, o->format, &plan, err);
    if (!st) st = epyq_synth_write_tokenizer(o->out_dir, &o->dims, o->tokenizer, err);
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
    sink_free(&sk);
    epyq_synth_emitter_free(&em);
    epyq_pool_free(pool);
    epyq_synth_plan_free(&plan);
    return st;
}
