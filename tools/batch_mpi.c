/* tools/batch_mpi.c — `epyq batch` over MPI ranks: launcher detection, the lead/worker messages
 * and the longest-first assignment (see tools/batch_mpi.h for the protocol). Only the main
 * thread calls MPI (MPI_THREAD_FUNNELED); the engine's pinned pools never do. */
#include "tools/batch_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "core/util.h"

/* ---- assignment (no MPI needed: unit-testable in every build) ------------------------------- */

typedef struct {
    uint64_t load;
    int rank;
} slot;

static bool slot_less(const slot *a, const slot *b) {
    return a->load < b->load || (a->load == b->load && a->rank < b->rank);
}

static void heap_down(slot *h, size_t n, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && slot_less(&h[l], &h[m])) m = l;
        if (r < n && slot_less(&h[r], &h[m])) m = r;
        if (m == i) return;
        slot t = h[i];
        h[i] = h[m], h[m] = t, i = m;
    }
}

static const uint64_t *g_sort_w; /* qsort has no context argument; only the main thread sorts */
static int by_weight_desc(const void *pa, const void *pb) {
    size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
    if (g_sort_w[a] != g_sort_w[b]) return g_sort_w[a] > g_sort_w[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

epyq_status epyq_batch_mpi_assign(const uint64_t *weight, size_t n, int n_ranks, int *owner,
                                  epyq_err *err) {
    if (n_ranks < 1)
        return epyq_err_set(err, EPYQ_E_ARG, "batch: expected at least one rank, got %d", n_ranks);
    size_t *ord = malloc((n ? n : 1) * sizeof *ord);
    slot *h = malloc((size_t)n_ranks * sizeof *h);
    if (!ord || !h) {
        free(ord), free(h);
        return epyq_err_set(err, EPYQ_E_NOMEM, "batch: out of memory assigning %zu requests", n);
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        owner[i] = -1;
        if (weight[i]) ord[m++] = i;
    }
    g_sort_w = weight;
    qsort(ord, m, sizeof *ord, by_weight_desc);
    for (int r = 0; r < n_ranks; r++) h[r] = (slot){0, r}; /* already a heap: all loads 0 */
    for (size_t k = 0; k < m; k++) {
        owner[ord[k]] = h[0].rank;
        h[0].load += weight[ord[k]];
        heap_down(h, (size_t)n_ranks, 0);
    }
    free(ord), free(h);
    return EPYQ_OK;
}

#ifdef EPYQ_HAVE_MPI

#include <mpi.h>

enum { TAG_REC = 1, TAG_PROG, TAG_FIN, TAG_STOP };

typedef struct {
    uint64_t job;
    uint32_t failed, pad;
} rec_head;

typedef struct {
    int32_t status, pad;
    epyq_batch_mpi_stats s;
    char msg[EPYQ_ERR_MSG_MAX + MPI_MAX_PROCESSOR_NAME + 8];
} fin_msg;

typedef struct {
    MPI_Request rq;
    void *buf;
} pending;

struct epyq_batch_mpi {
    int rank, size;
    bool started, lead_ok; /* lead_ok: the lead's status in the last share */
    char host[MPI_MAX_PROCESSOR_NAME];
    /* worker */
    pending *pend;
    size_t n_pend, cap_pend;
    bool stop_seen;
    double last_prog;
    epyq_batch_mpi_stats prog;
    /* lead: per rank */
    int *fin; /* -1 running, else its exit status */
    char **fin_why;
    epyq_batch_mpi_stats *stats;
    int running;
    bool stop_sent;
};

static bool launched(void) {
    /* mpirun (Open MPI), and srun with --mpi=pmix or pmi2 */
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK") ||
           getenv("PMI_SIZE");
}

static epyq_status mpi_fail(epyq_err *err, int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", rc);
    return epyq_err_set(err, EPYQ_E_IO, "batch: %s failed: %s", what, s);
}

epyq_status epyq_batch_mpi_open(epyq_batch_mpi **mpp, int *argc, char ***argv, epyq_err *err) {
    *mpp = NULL;
    if (!launched()) {
        /* srun without an MPI plugin starts N singletons, each of which would run the whole
         * job into the same output file: refuse rather than do the work N times */
        const char *nt = getenv("SLURM_STEP_NUM_TASKS");
        if (nt && atoi(nt) > 1)
            return epyq_err_set(
                err, EPYQ_E_ARG,
                "batch: srun started %s tasks but no MPI launcher environment was found: expected "
                "srun --mpi=pmix (or pmi2), got none",
                nt);
        return EPYQ_OK;
    }
    int provided = 0, rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Init_thread");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    epyq_batch_mpi *mp = calloc(1, sizeof *mp);
    if (!mp) return epyq_err_set(err, EPYQ_E_NOMEM, "batch: out of memory");
    MPI_Comm_rank(MPI_COMM_WORLD, &mp->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mp->size);
    int hl = 0;
    MPI_Get_processor_name(mp->host, &hl);
    if (mp->size == 1) { /* nothing to talk about: the plain single-process job */
        free(mp);
        MPI_Finalize();
        return EPYQ_OK;
    }
    *mpp = mp;
    if (mp->rank == 0) {
        mp->fin = malloc((size_t)mp->size * sizeof *mp->fin);
        mp->fin_why = calloc((size_t)mp->size, sizeof *mp->fin_why);
        mp->stats = calloc((size_t)mp->size, sizeof *mp->stats);
        if (!mp->fin || !mp->fin_why || !mp->stats)
            return epyq_err_set(err, EPYQ_E_NOMEM, "batch: out of memory");
        for (int r = 0; r < mp->size; r++) mp->fin[r] = r ? -1 : 0;
        mp->running = mp->size - 1;
    }
    return EPYQ_OK;
}

void epyq_batch_mpi_close(epyq_batch_mpi *mp) {
    if (!mp) return;
    for (size_t i = 0; i < mp->n_pend; i++) free(mp->pend[i].buf);
    free(mp->pend);
    if (mp->fin_why)
        for (int r = 0; r < mp->size; r++) free(mp->fin_why[r]);
    free(mp->fin), free(mp->fin_why), free(mp->stats);
    free(mp);
    MPI_Finalize();
}

int epyq_batch_mpi_rank(const epyq_batch_mpi *mp) { return mp ? mp->rank : 0; }
int epyq_batch_mpi_size(const epyq_batch_mpi *mp) { return mp ? mp->size : 1; }
void epyq_batch_mpi_start(epyq_batch_mpi *mp) {
    if (mp) mp->started = mp->lead_ok;
}
bool epyq_batch_mpi_started(const epyq_batch_mpi *mp) { return mp && mp->started; }

/* Broadcast in pieces: an MPI count is an int, a job file can pass 2 GiB. */
static int bcast_bytes(char *p, size_t len) {
    const size_t piece = (size_t)1 << 30;
    for (size_t off = 0; off < len; off += piece) {
        size_t n = len - off < piece ? len - off : piece;
        int rc = MPI_Bcast(p + off, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
}

epyq_status epyq_batch_mpi_share(epyq_batch_mpi *mp, epyq_status st, char **data, size_t *len,
                                 epyq_err *err) {
    if (!mp) return st;
    /* status, then the message or the length, then the bytes */
    uint64_t head[2] = {(uint64_t)st, st == EPYQ_OK ? (uint64_t)*len : 0};
    int rc = MPI_Bcast(head, 2, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Bcast");
    mp->lead_ok = head[0] == EPYQ_OK;
    if (head[0] != EPYQ_OK) {
        char msg[EPYQ_ERR_MSG_MAX];
        if (mp->rank == 0) snprintf(msg, sizeof msg, "%s", err ? err->msg : "");
        rc = MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, 0, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Bcast");
        if (mp->rank != 0) epyq_err_set(err, (epyq_status)head[0], "%s", msg);
        return (epyq_status)head[0];
    }
    if (mp->rank != 0) {
        *len = (size_t)head[1];
        *data = malloc(*len + 1);
        if (!*data) {
            /* still take part, or the lead's broadcast would wait for this rank */
            char sink[4096];
            for (size_t off = 0; off < *len; off += sizeof sink) {
                size_t n = *len - off < sizeof sink ? *len - off : sizeof sink;
                MPI_Bcast(sink, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
            }
            return epyq_err_set(err, EPYQ_E_NOMEM,
                                "batch: out of memory receiving %zu bytes of the job", *len);
        }
        (*data)[*len] = '\0';
    }
    rc = bcast_bytes(*data, *len);
    return rc == MPI_SUCCESS ? EPYQ_OK : mpi_fail(err, rc, "MPI_Bcast");
}

/* ---- worker -------------------------------------------------------------------------------- */

/* Drop the sends that have completed. */
static void reap(epyq_batch_mpi *mp) {
    size_t k = 0;
    for (size_t i = 0; i < mp->n_pend; i++) {
        int done = 0;
        MPI_Test(&mp->pend[i].rq, &done, MPI_STATUS_IGNORE);
        if (done) free(mp->pend[i].buf);
        else
            mp->pend[k++] = mp->pend[i];
    }
    mp->n_pend = k;
}

static epyq_status send_owned(epyq_batch_mpi *mp, void *buf, size_t len, int tag, epyq_err *err) {
    if (len > (size_t)0x7fffffff) {
        free(buf);
        return epyq_err_set(err, EPYQ_E_ARG, "batch: expected a record under 2 GiB, got %zu bytes",
                            len);
    }
    reap(mp);
    if (mp->n_pend == mp->cap_pend) {
        size_t cap = mp->cap_pend ? 2 * mp->cap_pend : 16;
        pending *np = realloc(mp->pend, cap * sizeof *np);
        if (!np) {
            free(buf);
            return epyq_err_set(err, EPYQ_E_NOMEM, "batch: out of memory");
        }
        mp->pend = np, mp->cap_pend = cap;
    }
    pending *p = &mp->pend[mp->n_pend];
    int rc = MPI_Isend(buf, (int)len, MPI_BYTE, 0, tag, MPI_COMM_WORLD, &p->rq);
    if (rc != MPI_SUCCESS) {
        free(buf);
        return mpi_fail(err, rc, "MPI_Isend");
    }
    p->buf = buf;
    mp->n_pend++;
    return EPYQ_OK;
}

epyq_status epyq_batch_mpi_send_record(epyq_batch_mpi *mp, size_t job, bool failed, const char *rec,
                                       size_t len, epyq_err *err) {
    char *buf = malloc(sizeof(rec_head) + len);
    if (!buf) return epyq_err_set(err, EPYQ_E_NOMEM, "batch: out of memory");
    const rec_head h = {job, failed, 0};
    memcpy(buf, &h, sizeof h);
    memcpy(buf + sizeof h, rec, len);
    return send_owned(mp, buf, sizeof h + len, TAG_REC, err);
}

void epyq_batch_mpi_send_progress(epyq_batch_mpi *mp, const epyq_batch_mpi_stats *s) {
    double now = epyq_now();
    if (!mp || now - mp->last_prog < 1.0) return;
    mp->last_prog = now;
    epyq_batch_mpi_stats *buf = malloc(sizeof *buf);
    if (!buf) return; /* progress is best effort; the FIN carries the totals */
    *buf = *s;
    send_owned(mp, buf, sizeof *buf, TAG_PROG, NULL);
}

bool epyq_batch_mpi_stop_asked(epyq_batch_mpi *mp) {
    if (!mp || mp->rank == 0) return false;
    if (!mp->stop_seen) {
        int flag = 0;
        MPI_Status s;
        MPI_Iprobe(0, TAG_STOP, MPI_COMM_WORLD, &flag, &s);
        if (flag) {
            MPI_Recv(NULL, 0, MPI_BYTE, 0, TAG_STOP, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            mp->stop_seen = true;
        }
    }
    return mp->stop_seen;
}

epyq_status epyq_batch_mpi_finish(epyq_batch_mpi *mp, int status, const epyq_err *why,
                                  const epyq_batch_mpi_stats *s, epyq_err *err) {
    if (!mp || mp->rank == 0 || !mp->started) return EPYQ_OK;
    fin_msg *f = calloc(1, sizeof *f);
    if (!f) return epyq_err_set(err, EPYQ_E_NOMEM, "batch: out of memory");
    f->status = status;
    if (s) f->s = *s;
    if (status == 1 && why) snprintf(f->msg, sizeof f->msg, "on %s: %s", mp->host, why->msg);
    epyq_status st = send_owned(mp, f, sizeof *f, TAG_FIN, err);
    for (size_t i = 0; i < mp->n_pend; i++) {
        MPI_Wait(&mp->pend[i].rq, MPI_STATUS_IGNORE);
        free(mp->pend[i].buf);
    }
    mp->n_pend = 0;
    return st;
}

/* ---- lead ---------------------------------------------------------------------------------- */

static epyq_status handle(epyq_batch_mpi *mp, const MPI_Status *ps, epyq_batch_mpi_record_fn fn,
                          void *ctx, epyq_err *err) {
    int n = 0, src = ps->MPI_SOURCE, tag = ps->MPI_TAG;
    MPI_Get_count(ps, MPI_BYTE, &n);
    char *buf = malloc((size_t)n + 2); /* + NUL + the spare byte flush_prefix writes '\n' into */
    if (!buf)
        return epyq_err_set(err, EPYQ_E_NOMEM,
                            "batch: out of memory receiving %d bytes from rank %d", n, src);
    int rc = MPI_Recv(buf, n, MPI_BYTE, src, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        free(buf);
        return mpi_fail(err, rc, "MPI_Recv");
    }
    if (tag == TAG_REC && (size_t)n >= sizeof(rec_head)) {
        rec_head h;
        memcpy(&h, buf, sizeof h);
        size_t len = (size_t)n - sizeof h;
        memmove(buf, buf + sizeof h, len);
        buf[len] = '\0';
        if (!fn(ctx, (size_t)h.job, h.failed != 0, buf)) {
            free(buf);
            return epyq_err_set(err, EPYQ_E_INTERNAL,
                                "batch: rank %d sent a record for job %llu, which is not its own",
                                src, (unsigned long long)h.job);
        }
        return EPYQ_OK;
    }
    if (tag == TAG_PROG && (size_t)n == sizeof(epyq_batch_mpi_stats)) {
        memcpy(&mp->stats[src], buf, sizeof mp->stats[src]);
    } else if (tag == TAG_FIN && (size_t)n == sizeof(fin_msg) && mp->fin[src] < 0) {
        fin_msg *f = (fin_msg *)buf;
        f->msg[sizeof f->msg - 1] = '\0';
        mp->stats[src] = f->s;
        mp->fin[src] = f->status;
        if (f->msg[0]) {
            size_t m = strlen(f->msg) + 64;
            mp->fin_why[src] = malloc(m);
            if (mp->fin_why[src]) snprintf(mp->fin_why[src], m, "%s", f->msg);
        }
        mp->running--;
    } else {
        free(buf);
        return epyq_err_set(err, EPYQ_E_INTERNAL,
                            "batch: unexpected message from rank %d (tag %d, %d bytes)", src, tag,
                            n);
    }
    free(buf);
    return EPYQ_OK;
}

epyq_status epyq_batch_mpi_poll(epyq_batch_mpi *mp, double wait_s, epyq_batch_mpi_record_fn fn,
                                void *ctx, epyq_err *err) {
    if (!mp || mp->rank != 0) return EPYQ_OK;
    double until = epyq_now() + wait_s;
    bool got = false;
    for (;;) {
        int flag = 0;
        MPI_Status s;
        int rc = MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &s);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Iprobe");
        if (flag) {
            TRY(handle(mp, &s, fn, ctx, err));
            got = true;
            continue;
        }
        if (got || wait_s <= 0 || epyq_now() >= until) return EPYQ_OK;
        /* a short sleep, not a blocking MPI_Probe: a signal to the lead must be seen promptly */
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
}

int epyq_batch_mpi_running(const epyq_batch_mpi *mp) {
    return mp && mp->rank == 0 ? mp->running : 0;
}

void epyq_batch_mpi_stop_all(epyq_batch_mpi *mp) {
    if (!mp || mp->rank != 0 || mp->stop_sent) return;
    mp->stop_sent = true;
    for (int r = 1; r < mp->size; r++)
        if (mp->fin[r] < 0) {
            /* zero bytes: buffered at once, the worker reads it at its next step */
            MPI_Request rq;
            MPI_Isend(NULL, 0, MPI_BYTE, r, TAG_STOP, MPI_COMM_WORLD, &rq);
            MPI_Request_free(&rq);
        }
}

void epyq_batch_mpi_remote_stats(const epyq_batch_mpi *mp, epyq_batch_mpi_stats *sum) {
    *sum = (epyq_batch_mpi_stats){0};
    if (!mp || mp->rank != 0) return;
    for (int r = 1; r < mp->size; r++) {
        sum->gen_tokens += mp->stats[r].gen_tokens;
        sum->prompt_tokens += mp->stats[r].prompt_tokens;
        sum->cached_tokens += mp->stats[r].cached_tokens;
    }
}

int epyq_batch_mpi_worker_status(const epyq_batch_mpi *mp, int rank, const char **msg) {
    *msg = "";
    if (!mp || mp->rank != 0 || rank <= 0 || rank >= mp->size) return 0;
    if (mp->fin_why[rank]) *msg = mp->fin_why[rank];
    return mp->fin[rank];
}

#else /* !EPYQ_HAVE_MPI: one process, always */

epyq_status epyq_batch_mpi_open(epyq_batch_mpi **mp, int *argc, char ***argv, epyq_err *err) {
    (void)argc, (void)argv;
    *mp = NULL;
    const char *nt = getenv("SLURM_STEP_NUM_TASKS");
    if ((nt && atoi(nt) > 1) ||
        (getenv("OMPI_COMM_WORLD_SIZE") && atoi(getenv("OMPI_COMM_WORLD_SIZE")) > 1))
        return epyq_err_set(
            err, EPYQ_E_ARG,
            "batch: started as one of several ranks, but this epyq was built without MPI: expected "
            "a build configured --with-mpi, got none");
    return EPYQ_OK;
}
void epyq_batch_mpi_close(epyq_batch_mpi *mp) { (void)mp; }
int epyq_batch_mpi_rank(const epyq_batch_mpi *mp) { return (void)mp, 0; }
int epyq_batch_mpi_size(const epyq_batch_mpi *mp) { return (void)mp, 1; }
epyq_status epyq_batch_mpi_share(epyq_batch_mpi *mp, epyq_status st, char **data, size_t *len,
                                 epyq_err *err) {
    (void)mp, (void)data, (void)len, (void)err;
    return st;
}
void epyq_batch_mpi_start(epyq_batch_mpi *mp) { (void)mp; }
bool epyq_batch_mpi_started(const epyq_batch_mpi *mp) { return (void)mp, false; }
epyq_status epyq_batch_mpi_send_record(epyq_batch_mpi *mp, size_t job, bool failed, const char *rec,
                                       size_t len, epyq_err *err) {
    (void)mp, (void)job, (void)failed, (void)rec, (void)len;
    return epyq_err_set(err, EPYQ_E_INTERNAL, "batch: a record sent without MPI");
}
void epyq_batch_mpi_send_progress(epyq_batch_mpi *mp, const epyq_batch_mpi_stats *s) {
    (void)mp, (void)s;
}
bool epyq_batch_mpi_stop_asked(epyq_batch_mpi *mp) { return (void)mp, false; }
epyq_status epyq_batch_mpi_finish(epyq_batch_mpi *mp, int status, const epyq_err *why,
                                  const epyq_batch_mpi_stats *s, epyq_err *err) {
    (void)mp, (void)status, (void)why, (void)s, (void)err;
    return EPYQ_OK;
}
epyq_status epyq_batch_mpi_poll(epyq_batch_mpi *mp, double wait_s, epyq_batch_mpi_record_fn fn,
                                void *ctx, epyq_err *err) {
    (void)mp, (void)wait_s, (void)fn, (void)ctx, (void)err;
    return EPYQ_OK;
}
int epyq_batch_mpi_running(const epyq_batch_mpi *mp) { return (void)mp, 0; }
void epyq_batch_mpi_stop_all(epyq_batch_mpi *mp) { (void)mp; }
void epyq_batch_mpi_remote_stats(const epyq_batch_mpi *mp, epyq_batch_mpi_stats *sum) {
    (void)mp;
    *sum = (epyq_batch_mpi_stats){0};
}
int epyq_batch_mpi_worker_status(const epyq_batch_mpi *mp, int rank, const char **msg) {
    (void)mp, (void)rank;
    *msg = "";
    return 0;
}

#endif
