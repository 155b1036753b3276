/* tools/ep_mpi.c — `--ep` over MPI (tools/ep_mpi.h).
 *
 * Every rank holds the whole dense part and so every token's hidden state already: no input
 * needs to travel, only the experts' output rows come back. The exchange is therefore one
 * in-place MPI_Allreduce (sum) of the layer's [tokens][top-k + 1][hidden] rows, in which every
 * element is nonzero on at most one rank, so the sum is exact whatever order MPI adds in. A
 * barrier before it separates the time spent waiting for the slowest rank (load imbalance:
 * the router does not split a token's experts evenly) from the transfer itself. */
#include "tools/ep_mpi.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "config.h"

#ifdef EPYQ_HAVE_MPI

#include <limits.h>
#include <mpi.h>

typedef struct {
    epyq_ep ep;
    bool inited;
    uint64_t calls, floats;
    double t_wait, t_sum;
} ep_mpi;

static epyq_status sum_rows(void *ctx, float *rows, size_t n, epyq_err *err) {
    ep_mpi *e = ctx;
    double t0 = MPI_Wtime();
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    double t1 = MPI_Wtime();
    for (size_t off = 0; rc == MPI_SUCCESS && off < n; off += INT_MAX / 2) {
        size_t k = n - off < INT_MAX / 2 ? n - off : INT_MAX / 2;
        rc = MPI_Allreduce(MPI_IN_PLACE, rows + off, (int)k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    double t2 = MPI_Wtime();
    if (rc != MPI_SUCCESS)
        return epyq_err_set(err, EPYQ_E_IO,
                            "--ep: MPI_Allreduce of %zu floats failed (MPI error %d)", n, rc);
    e->calls++, e->floats += n;
    e->t_wait += t1 - t0, e->t_sum += t2 - t1;
    return EPYQ_OK;
}

epyq_status epyq_tool_ep_open(epyq_ep **out, int *argc, char ***argv, epyq_err *err) {
    *out = NULL;
    ep_mpi *e = calloc(1, sizeof *e);
    if (!e) return epyq_err_set(err, EPYQ_E_NOMEM, "--ep: out of memory");
    e->ep = (epyq_ep){0, 1, sum_rows, e};
    /* outside a launcher: one rank, no MPI (a singleton MPI_Init would start helper daemons) */
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK") ||
        getenv("PMI_SIZE")) {
        int provided = 0;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            free(e);
            return epyq_err_set(err, EPYQ_E_IO, "--ep: MPI_Init_thread failed");
        }
        e->inited = true;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        int r = 0, s = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        MPI_Comm_size(MPI_COMM_WORLD, &s);
        e->ep.rank = r, e->ep.size = s;
    }
    *out = &e->ep;
    return EPYQ_OK;
}

void epyq_tool_ep_report(const epyq_ep *ep, int n_decode, double decode_s) {
    const ep_mpi *e = ep->ctx;
    if (ep->rank != 0) return;
    double c = e->calls ? (double)e->calls : 1.0;
    fprintf(
        stderr,
        "{\"event\":\"ep\",\"ranks\":%d,\"exchanges\":%llu,\"exchange_ms\":%.4f,\"wait_ms\":%.4f,"
        "\"bytes_per_exchange\":%.0f,\"decode_tokens\":%d,\"decode_s\":%.3f,\"decode_tps\":%.3f}\n",
        ep->size, (unsigned long long)e->calls, 1e3 * e->t_sum / c, 1e3 * e->t_wait / c,
        4.0 * (double)e->floats / c, n_decode, decode_s, decode_s > 0 ? n_decode / decode_s : 0.0);
}

bool epyq_tool_ep_agree(const epyq_ep *ep, bool ok) {
    const ep_mpi *e = ep->ctx;
    if (!e->inited) return ok;
    int v = ok ? 1 : 0;
    if (MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
        return false;
    return v == 1;
}

void epyq_tool_ep_abort(const epyq_ep *ep, int code) {
    const ep_mpi *e = ep->ctx;
    if (e->inited && ep->size > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

void epyq_tool_ep_close(epyq_ep *ep) {
    if (!ep) return;
    ep_mpi *e = ep->ctx;
    if (e->inited) MPI_Finalize();
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
void epyq_tool_ep_report(const epyq_ep *ep, int n_decode, double decode_s) {
    (void)ep, (void)n_decode, (void)decode_s;
}
bool epyq_tool_ep_agree(const epyq_ep *ep, bool ok) { return (void)ep, ok; }
void epyq_tool_ep_abort(const epyq_ep *ep, int code) { (void)ep, (void)code; }
void epyq_tool_ep_close(epyq_ep *ep) { (void)ep; }

#endif
