/* tools/ep_mpi.h — `--ep`: one model over several MPI ranks (expert parallelism, epyq_ep in
 * src/model/model.h) for run, batch, bench and logits. Every rank runs the same command on the
 * same input in lockstep; the routed experts are split over the ranks, and after each MoE
 * layer's experts the output rows travel to the rank that sums their token (MPI_Alltoallv)
 * and the sums to every rank (MPI_Allgatherv), src/model/moe_ep.c. Rank 0 prints and writes.
 *
 * Lockstep is the contract: every rank must make the same forward calls, so anything that
 * steers them (sampling, stopping, the MTP speculation rule) must come out the same on every
 * rank. Sampling does, from the same logits and seed; the speculation rule reads a clock, so
 * under --ep it reads rank 0's (epyq_tool_ep_clock); a signal reaches the ranks at different
 * steps, so batch agrees on it every step (epyq_tool_ep_max). A rank that fails calls MPI_Abort
 * (epyq_tool_ep_abort): the others would wait in the next exchange forever. */
#ifndef EPYQ_TOOLS_EP_MPI_H
#define EPYQ_TOOLS_EP_MPI_H

#include <stdbool.h>
#include <stddef.h>

#include "model/model.h"

/* *ep: the rank's place (size 1 outside a launcher: the plain one-process path). Fails when
 * the build has no MPI. EPYQ_EP_BARRIER=1 puts a barrier before every exchange, so the report
 * tells the wait for the slowest rank apart from the transfer (it costs one more round trip). */
epyq_status epyq_tool_ep_open(epyq_ep **ep, int *argc, char ***argv, epyq_err *err);
/* Collective: every rank must run rank 0's kernels (epyq_kern) and int4 path: a dense part
 * computed by other kernels gives other bits, the ranks' logits and so their sampled tokens
 * would part, and the job would hang or mix. */
epyq_status epyq_tool_ep_check(const epyq_ep *ep, epyq_numpath path, epyq_err *err);
/* Collective; one JSON line on stderr (rank 0) about the exchanges since the last report (then
 * reset): ranks, label, exchanges (one per MoE layer per forward call), mean milliseconds of an
 * exchange (alltoallv + allgatherv) and of each part, the wait for the slowest rank (with
 * EPYQ_EP_BARRIER=1, else 0), bytes all ranks sent per exchange, and decode t/s when
 * n_decode > 0. */
void epyq_tool_ep_report(const epyq_ep *ep, const char *what, int n_decode, double decode_s);
/* Forget the exchanges so far (a warm-up's), on this rank. */
void epyq_tool_ep_reset(const epyq_ep *ep);
/* Collective: all ranks agree on a status (the worst); false when some rank failed. */
bool epyq_tool_ep_agree(const epyq_ep *ep, bool ok);
/* Collective: the largest v over the ranks. */
int epyq_tool_ep_max(const epyq_ep *ep, int v);
/* Collective: rank 0 passes its status (err filled when it failed) and its bytes; every rank
 * returns rank 0's status, with its message in err, and the others get a malloc'd,
 * NUL-terminated copy of the bytes in *data, *len. */
epyq_status epyq_tool_ep_share(const epyq_ep *ep, epyq_status st, char **data, size_t *len,
                               epyq_err *err);
/* Collective: epyq_tool_model_dir on rank 0 first, then on the others, so a --synthetic model
 * is generated once and not by every rank at once into the same cache folder. */
epyq_status epyq_tool_ep_model_dir(const epyq_ep *ep, const char *dir, const char *synthetic,
                                   char **out, epyq_err *err);
/* Collective: rank 0's wall clock in seconds (epyq_spec_opts.clock; ctx is the epyq_ep). */
double epyq_tool_ep_clock(void *ctx);
/* After a failure mid-run: end the whole job instead of leaving the other ranks waiting. */
void epyq_tool_ep_abort(const epyq_ep *ep, int code);
/* MPI_Finalize. */
void epyq_tool_ep_close(epyq_ep *ep);

#endif
