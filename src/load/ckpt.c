/* src/load/ckpt.c — a checkpoint folder: index, memory-mapped shards, cross-shard checks
 * (see safetensors.h for the promise). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "load/safetensors.h"

typedef struct {
    char *path;
    void *map;       /* [size] read-only mapping, NULL for an empty file */
    uint64_t size;
    epyq_st_header hdr;
} shard;

struct epyq_ckpt {
    char *dir;
    shard *shards;   /* [nshards] */
    size_t nshards;
    epyq_tensor *t;  /* [n] sorted by name; names point into the shards' headers */
    size_t n;
    uint64_t total;
};

static void shard_close(shard *s) {
    epyq_st_header_free(&s->hdr);
    if (s->map) munmap(s->map, (size_t)s->size);
    free(s->path);
}

void epyq_ckpt_free(epyq_ckpt *c) {
    if (!c) return;
    for (size_t i = 0; i < c->nshards; i++) shard_close(&c->shards[i]);
    free(c->shards);
    free(c->t);
    free(c->dir);
    free(c);
}

static epyq_status shard_open(shard *s, const char *path, const char *label, epyq_err *err) {
    memset(s, 0, sizeof *s);
    s->path = strdup(path);
    if (!s->path) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return epyq_err_set(err, EPYQ_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return epyq_err_set(err, EPYQ_E_IO, "%s: not a regular file", path);
    }
    s->size = (uint64_t)sb.st_size;
    if (s->size > 0) {
        if (s->size > (uint64_t)SIZE_MAX) {
            close(fd);
            return epyq_err_set(err, EPYQ_E_IO, "%s: file too large to map", path);
        }
        s->map = mmap(NULL, (size_t)s->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (s->map == MAP_FAILED) {
            s->map = NULL;
            close(fd);
            return epyq_err_set(err, EPYQ_E_IO, "%s: mmap of %llu bytes failed: %s", path,
                                (unsigned long long)s->size, strerror(errno));
        }
    }
    close(fd);
    static const uint8_t empty[1];
    return epyq_st_parse(&s->hdr, s->map ? s->map : empty, (size_t)s->size, s->size, label, err);
}

static int cmp_tensor_name(const void *a, const void *b) {
    const epyq_tensor *x = a, *y = b;
    int r = strcmp(x->name, y->name);
    /* equal names (a duplicate, refused below) order by shard so the message is stable */
    return r ? r : (x->shard > y->shard) - (x->shard < y->shard);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The index's shard files, deduplicated and sorted (pointers into ix). */
static epyq_status index_shards(const epyq_st_index *ix, const char ***out, size_t *nout, const char *label,
                                epyq_err *err) {
    const char **f = malloc(ix->n * sizeof *f);
    if (!f) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
    memcpy(f, ix->files, ix->n * sizeof *f);
    qsort(f, ix->n, sizeof *f, cmp_str);
    size_t m = 0;
    for (size_t i = 0; i < ix->n; i++)
        if (m == 0 || strcmp(f[m - 1], f[i])) f[m++] = f[i];
    if (m > EPYQ_ST_MAX_SHARDS) {
        free(f);
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: %zu shard files, at most %u supported", label, m, EPYQ_ST_MAX_SHARDS);
    }
    *out = f;
    *nout = m;
    return EPYQ_OK;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* Every shard tensor must be listed in the index under its own shard, and every listed
 * name must exist: a stale index would otherwise silently drop or misplace weights. */
static epyq_status check_index(const epyq_ckpt *c, const epyq_st_index *ix, const char *label, epyq_err *err) {
    for (size_t i = 0; i < c->n; i++) {
        const epyq_tensor *t = &c->t[i];
        const char *file = base_name(c->shards[t->shard].path);
        char **hit = bsearch(&t->name, ix->names, ix->n, sizeof *ix->names, cmp_str);
        if (!hit)
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: shard %s holds tensor %s, which the index does not list",
                                label, file, t->name);
        const char *want = ix->files[hit - ix->names];
        if (strcmp(want, file))
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: index puts tensor %s in %s, but it is in %s", label, t->name,
                                want, file);
    }
    if (c->n != ix->n) {
        for (size_t i = 0; i < ix->n; i++)
            if (!epyq_ckpt_find(c, ix->names[i]))
                return epyq_err_set(err, EPYQ_E_FORMAT, "%s: index lists tensor %s in %s, which does not contain it",
                                    label, ix->names[i], ix->files[i]);
    }
    return EPYQ_OK;
}

epyq_status epyq_ckpt_open(epyq_ckpt **out, const char *dir, epyq_err *err) {
    *out = NULL;
    epyq_ckpt *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", dir);
    }
    epyq_status st = EPYQ_OK;
    epyq_st_index ix = {0};
    bool have_ix = false;
    const char **files = NULL;
    size_t nfiles = 0;
    char *ixpath = epyq_path_join(dir, "model.safetensors.index.json");
    char *single = epyq_path_join(dir, "model.safetensors");
    if (!ixpath || !single) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    struct stat sb;
    if (stat(ixpath, &sb) == 0) {
        char *text;
        size_t len;
        if ((st = epyq_file_read(ixpath, EPYQ_ST_INDEX_MAX, &text, &len, err))) goto done;
        st = epyq_st_index_parse(&ix, text, len, ixpath, err);
        free(text);
        if (st) goto done;
        have_ix = true;
        if ((st = index_shards(&ix, &files, &nfiles, ixpath, err))) goto done;
    } else if (stat(single, &sb) == 0) {
        static const char *one[] = {"model.safetensors"};
        files = malloc(sizeof *files);
        if (!files) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", dir);
            goto done;
        }
        files[0] = one[0];
        nfiles = 1;
    } else {
        st = epyq_err_set(err, EPYQ_E_IO, "%s: no model.safetensors.index.json or model.safetensors in this folder", dir);
        goto done;
    }

    c->shards = calloc(nfiles, sizeof *c->shards);
    if (!c->shards) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    size_t total_t = 0;
    for (size_t i = 0; i < nfiles; i++) {
        char *p = epyq_path_join(dir, files[i]);
        if (!p) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", dir);
            goto done;
        }
        c->nshards = i + 1;
        st = shard_open(&c->shards[i], p, p, err);
        free(p);
        if (st) goto done;
        c->total += c->shards[i].size;
        total_t += c->shards[i].hdr.n;
        if (total_t > EPYQ_ST_MAX_TENSORS) {
            st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: more than %u tensors in all shards", dir, EPYQ_ST_MAX_TENSORS);
            goto done;
        }
    }
    c->t = total_t ? malloc(total_t * sizeof *c->t) : NULL;
    if (total_t && !c->t) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory for %zu tensors", dir, total_t);
        goto done;
    }
    for (size_t i = 0; i < c->nshards; i++)
        for (size_t j = 0; j < c->shards[i].hdr.n; j++) {
            c->t[c->n] = c->shards[i].hdr.t[j];
            c->t[c->n++].shard = (int32_t)i;
        }
    if (c->n) qsort(c->t, c->n, sizeof *c->t, cmp_tensor_name);
    for (size_t i = 1; i < c->n; i++)
        if (!strcmp(c->t[i - 1].name, c->t[i].name)) {
            st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: tensor %s appears in both %s and %s", dir, c->t[i].name,
                              base_name(c->shards[c->t[i - 1].shard].path), base_name(c->shards[c->t[i].shard].path));
            goto done;
        }
    if (have_ix) st = check_index(c, &ix, ixpath, err);
done:
    free(files);
    epyq_st_index_free(&ix);
    free(ixpath);
    free(single);
    if (st) {
        epyq_ckpt_free(c);
        return st;
    }
    *out = c;
    return EPYQ_OK;
}

size_t epyq_ckpt_count(const epyq_ckpt *c) { return c->n; }
const epyq_tensor *epyq_ckpt_at(const epyq_ckpt *c, size_t i) { return i < c->n ? &c->t[i] : NULL; }
size_t epyq_ckpt_nshards(const epyq_ckpt *c) { return c->nshards; }
const char *epyq_ckpt_shard_path(const epyq_ckpt *c, size_t i) { return i < c->nshards ? c->shards[i].path : NULL; }
uint64_t epyq_ckpt_total_bytes(const epyq_ckpt *c) { return c->total; }
const char *epyq_ckpt_dir(const epyq_ckpt *c) { return c->dir; }

const epyq_tensor *epyq_ckpt_find(const epyq_ckpt *c, const char *name) {
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int r = strcmp(c->t[mid].name, name);
        if (r == 0) return &c->t[mid];
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}
