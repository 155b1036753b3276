/* tools/ep_mpi.c — `--ep` over MPI (tools/ep_mpi.h): the epyq_ep hooks of src/model/moe_ep.c
 * as MPI_Alltoallv and in-place MPI_Allgatherv on a contiguous datatype of one row (counts are
 * rows, so no count nears INT_MAX), timed for the report, and the collectives the tools need to
 * stay in lockstep. */
#include "tools/ep_mpi.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "core/util.h"
#include "tools/tool_model.h"

epyq_status epyq_tool_ep_model_dir(const epyq_ep *ep, const char *dir, const char *synthetic,
                                   char **out, epyq_err *err) {
    *out = NULL;
    epyq_status st = ep->rank == 0 ? epyq_tool_model_dir(dir, synthetic, out, err) : EPYQ_OK;
    if (!epyq_tool_ep_agree(ep, st == EPYQ_OK) && st == EPYQ_OK)
        st = epyq_err_set(err, EPYQ_E_IO, "--ep: rank 0 could not find or generate the model");
    if (st == EPYQ_OK && ep->rank != 0) st = epyq_tool_model_dir(dir, synthetic, out, err);
    return st;
}

#ifdef EPYQ_HAVE_MPI

#include <limits.h>
#include <mpi.h>

typedef struct {
    epyq_ep ep;
    bool inited, barrier;
    MPI_Datatype row; /* `width` floats; MPI_DATATYPE_NULL until the first exchange */
    int32_t width;
    int *counts; /* [4 size]: the hooks' int32_t arrays as MPI's ints */
    uint64_t calls, bytes;
    double t_wait, t_a2a, t_ag;
} ep_mpi;

static epyq_status mpi_fail(epyq_err *err, int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", rc);
    return epyq_err_set(err, EPYQ_E_IO, "--ep: %s failed: %s", what, s);
}

static int row_type(ep_mpi *e, int32_t width) {
    if (e->row != MPI_DATATYPE_NULL && e->width == width) return MPI_SUCCESS;
    if (e->row != MPI_DATATYPE_NULL) MPI_Type_free(&e->row);
    int rc = MPI_Type_contiguous(width, MPI_FLOAT, &e->row);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&e->row);
    e->width = rc == MPI_SUCCESS ? width : 0;
    return rc;
}

static void to_int(int *dst, const int32_t *src, int n) {
    for (int i = 0; i < n; i++) dst[i] = src[i];
}

static epyq_status ep_alltoallv(void *ctx, const float *send, const int32_t *scount,
                                const int32_t *sdispl, float *recv, const int32_t *rcount,
                                const int32_t *rdispl, int32_t width, epyq_err *err) {
    ep_mpi *e = ctx;
    const int n = e->ep.size;
    int *c = e->counts;
    to_int(c, scount, n), to_int(c + n, sdispl, n), to_int(c + 2 * n, rcount, n);
    to_int(c + 3 * n, rdispl, n);
    int rc = row_type(e, width);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Type_contiguous");
    double t0 = MPI_Wtime();
    if (e->barrier && (rc = MPI_Barrier(MPI_COMM_WORLD)) != MPI_SUCCESS)
        return mpi_fail(err, rc, "MPI_Barrier");
    double t1 = MPI_Wtime();
    rc = MPI_Alltoallv(send, c, c + n, e->row, recv, c + 2 * n, c + 3 * n, e->row, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Alltoallv");
    e->t_wait += t1 - t0, e->t_a2a += MPI_Wtime() - t1;
    e->calls++;
    for (int r = 0; r < n; r++) e->bytes += (uint64_t)scount[r] * (uint64_t)width * 4u;
    return EPYQ_OK;
}

static epyq_status ep_allgatherv(void *ctx, float *buf, const int32_t *count, const int32_t *displ,
                                 int32_t width, epyq_err *err) {
    ep_mpi *e = ctx;
    const int n = e->ep.size;
    int *c = e->counts;
    to_int(c, count, n), to_int(c + n, displ, n);
    int rc = row_type(e, width);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Type_contiguous");
    double t0 = MPI_Wtime();
    rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c, c + n, e->row, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Allgatherv");
    e->t_ag += MPI_Wtime() - t0;
    /* this rank's block, to each of the others */
    e->bytes += (uint64_t)count[e->ep.rank] * (uint64_t)width * 4u * (uint64_t)(n - 1);
    return EPYQ_OK;
}

epyq_status epyq_tool_ep_open(epyq_ep **out, int *argc, char ***argv, epyq_err *err) {
    *out = NULL;
    ep_mpi *e = calloc(1, sizeof *e);
    if (!e) return epyq_err_set(err, EPYQ_E_NOMEM, "--ep: out of memory");
    e->ep = (epyq_ep){0, 1, ep_alltoallv, ep_allgatherv, e};
    e->row = MPI_DATATYPE_NULL;
    const char *b = getenv("EPYQ_EP_BARRIER");
    e->barrier = b && *b && strcmp(b, "0") != 0;
    /* outside a launcher: one rank, no MPI (a singleton MPI_Init would start helper daemons) */
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK") ||
        getenv("PMI_SIZE")) {
        int provided = 0, rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            free(e);
            return epyq_err_set(err, EPYQ_E_IO, "--ep: MPI_Init_thread failed (MPI error %d)", rc);
        }
        e->inited = true;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        int r = 0, s = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        MPI_Comm_size(MPI_COMM_WORLD, &s);
        e->ep.rank = r, e->ep.size = s;
    }
    e->counts = malloc((size_t)e->ep.size * 4 * sizeof(int));
    if (!e->counts) {
        epyq_tool_ep_close(&e->ep);
        return epyq_err_set(err, EPYQ_E_NOMEM, "--ep: out of memory");
    }
    *out = &e->ep;
    return EPYQ_OK;
}

epyq_status epyq_tool_ep_check(const epyq_ep *ep, epyq_numpath path, epyq_err *err) {
    const ep_mpi *e = ep->ctx;
    if (!e->inited || ep->size == 1) return EPYQ_OK;
    char mine[64] = {0};
    snprintf(mine, sizeof mine, "%s %s", epyq_kern()->name, epyq_model_path_name(path));
    char *all = calloc((size_t)ep->size, sizeof mine);
    int rc = all ? MPI_Allgather(mine, (int)sizeof mine, MPI_CHAR, all, (int)sizeof mine, MPI_CHAR,
                                 MPI_COMM_WORLD)
                 : MPI_ERR_NO_MEM;
    if (rc != MPI_SUCCESS) {
        free(all);
        return mpi_fail(err, rc, "MPI_Allgather");
    }
    epyq_status st = EPYQ_OK;
    for (int r = 1; r < ep->size && st == EPYQ_OK; r++)
        if (strcmp(all, all + r * sizeof mine) != 0)
            st = epyq_err_set(err, EPYQ_E_ARG,
                              "--ep: every rank must run the same kernels and path (the dense "
                              "part's bits, and so the sampled tokens, would differ): expected "
                              "rank 0's '%s', got '%s' on rank %d",
                              all, all + r * sizeof mine, r);
    free(all);
    return st;
}

void epyq_tool_ep_report(const epyq_ep *ep, const char *what, int n_decode, double decode_s) {
    ep_mpi *e = ep->ctx;
    uint64_t bytes = e->bytes;
    if (e->inited) /* what the network carries: every rank's sends */
        MPI_Reduce(&e->bytes, &bytes, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    if (ep->rank == 0) {
        double c = e->calls ? (double)e->calls : 1.0;
        fprintf(stderr,
                "{\"event\":\"ep\",\"ranks\":%d,\"exchanges\":%llu,\"what\":\"%s\","
                "\"exchange_ms\":%.4f,\"alltoallv_ms\":%.4f,\"allgatherv_ms\":%.4f,"
                "\"wait_ms\":%.4f,\"bytes_per_exchange\":%.0f,\"decode_tokens\":%d,"
                "\"decode_s\":%.3f,\"decode_tps\":%.3f}\n",
                ep->size, (unsigned long long)e->calls, what ? what : "",
                1e3 * (e->t_a2a + e->t_ag) / c, 1e3 * e->t_a2a / c, 1e3 * e->t_ag / c,
                1e3 * e->t_wait / c, (double)bytes / c, n_decode, decode_s,
                decode_s > 0 ? n_decode / decode_s : 0.0);
        fflush(stderr);
    }
    epyq_tool_ep_reset(ep);
}

void epyq_tool_ep_reset(const epyq_ep *ep) {
    ep_mpi *e = ep->ctx;
    e->calls = e->bytes = 0;
    e->t_wait = e->t_a2a = e->t_ag = 0;
}

bool epyq_tool_ep_agree(const epyq_ep *ep, bool ok) {
    return epyq_tool_ep_max(ep, ok ? 0 : 1) == 0;
}

int epyq_tool_ep_max(const epyq_ep *ep, int v) {
    const ep_mpi *e = ep->ctx;
    if (!e->inited) return v;
    int r = v;
    /* a failed collective cannot be agreed on: treat it as the worst answer */
    if (MPI_Allreduce(&v, &r, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS) return INT_MAX;
    return r;
}

static int bcast_bytes(char *p, size_t n) {
    int rc = MPI_SUCCESS;
    for (size_t off = 0; rc == MPI_SUCCESS && off < n; off += INT_MAX / 2) {
        size_t k = n - off < INT_MAX / 2 ? n - off : INT_MAX / 2;
        rc = MPI_Bcast(p + off, (int)k, MPI_BYTE, 0, MPI_COMM_WORLD);
    }
    return rc;
}

epyq_status epyq_tool_ep_share(const epyq_ep *ep, epyq_status st, char **data, size_t *len,
                               epyq_err *err) {
    const ep_mpi *e = ep->ctx;
    if (!e->inited || ep->size == 1) return st;
    /* status and length, then the message or the bytes */
    uint64_t head[2] = {(uint64_t)st, st == EPYQ_OK && ep->rank == 0 ? (uint64_t)*len : 0};
    int rc = MPI_Bcast(head, 2, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Bcast");
    if (head[0] != EPYQ_OK) {
        char msg[EPYQ_ERR_MSG_MAX];
        if (ep->rank == 0) snprintf(msg, sizeof msg, "%s", err->msg);
        rc = MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, 0, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Bcast");
        if (ep->rank != 0) epyq_err_set(err, (epyq_status)head[0], "%s", msg);
        return (epyq_status)head[0];
    }
    if (ep->rank != 0) {
        *len = (size_t)head[1];
        *data = malloc(*len + 1);
        /* the caller aborts the job: rank 0 would wait in the broadcast for this rank */
        if (!*data)
            return epyq_err_set(err, EPYQ_E_NOMEM, "--ep: out of memory receiving %zu bytes", *len);
        (*data)[*len] = '\0';
    }
    rc = bcast_bytes(*data, *len);
    return rc == MPI_SUCCESS ? EPYQ_OK : mpi_fail(err, rc, "MPI_Bcast");
}

double epyq_tool_ep_clock(void *ctx) {
    const epyq_ep *ep = ctx;
    const ep_mpi *e = ep->ctx;
    double t = epyq_now();
    if (e->inited && ep->size > 1) MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return t;
}

void epyq_tool_ep_abort(const epyq_ep *ep, int code) {
    const ep_mpi *e = ep->ctx;
    fflush(stdout), fflush(stderr);
    if (e->inited && ep->size > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

void epyq_tool_ep_close(epyq_ep *ep) {
    if (!ep) return;
    ep_mpi *e = ep->ctx;
    if (e->row != MPI_DATATYPE_NULL) MPI_Type_free(&e->row);
    if (e->inited) MPI_Finalize();
    free(e->counts);
    free(e);
}

#else /* !EPYQ_HAVE_MPI */

epyq_status epyq_tool_ep_open(epyq_ep **out, int *argc, char ***argv, epyq_err *err) {
    (void)argc, (void)argv;
    *out = NULL;
    return epyq_err_set(
        err, EPYQ_E_ARG,
        "--ep: expected an epyq built with MPI (./configure --with-mpi), got one without");
}
epyq_status epyq_tool_ep_check(const epyq_ep *ep, epyq_numpath path, epyq_err *err) {
    return (void)ep, (void)path, (void)err, EPYQ_OK;
}
void epyq_tool_ep_report(const epyq_ep *ep, const char *what, int n_decode, double decode_s) {
    (void)ep, (void)what, (void)n_decode, (void)decode_s;
}
void epyq_tool_ep_reset(const epyq_ep *ep) { (void)ep; }
bool epyq_tool_ep_agree(const epyq_ep *ep, bool ok) { return (void)ep, ok; }
int epyq_tool_ep_max(const epyq_ep *ep, int v) { return (void)ep, v; }
epyq_status epyq_tool_ep_share(const epyq_ep *ep, epyq_status st, char **data, size_t *len,
                               epyq_err *err) {
    return (void)ep, (void)data, (void)len, (void)err, st;
}
double epyq_tool_ep_clock(void *ctx) { return (void)ctx, epyq_now(); }
void epyq_tool_ep_abort(const epyq_ep *ep, int code) { (void)ep, (void)code; }
void epyq_tool_ep_close(epyq_ep *ep) { (void)ep; }

#endif
