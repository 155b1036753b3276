/* tools/ep_mpi.h — `--ep`: one model over several MPI ranks (expert parallelism, epyq_ep in
 * src/model/model.h). Every rank runs the same command on the same input in lockstep; the
 * routed experts are split over the ranks and each MoE layer's output rows are summed over
 * them with MPI_Allreduce. A rank that fails calls MPI_Abort (epyq_tool_ep_abort): the others
 * would wait in the next exchange forever. */
#ifndef EPYQ_TOOLS_EP_MPI_H
#define EPYQ_TOOLS_EP_MPI_H

#include <stdbool.h>

#include "model/model.h"

/* *ep: the rank's place (size 1 outside a launcher). Fails when the build has no MPI. */
epyq_status epyq_tool_ep_open(epyq_ep **ep, int *argc, char ***argv, epyq_err *err);
/* One JSON line on stderr (rank 0): ranks, exchanges, mean exchange and wait times per
 * exchange (one exchange per MoE layer per forward call), and decode t/s when n_decode > 0. */
void epyq_tool_ep_report(const epyq_ep *ep, int n_decode, double decode_s);
/* All ranks agree on a status (the worst); false when some rank failed. */
bool epyq_tool_ep_agree(const epyq_ep *ep, bool ok);
/* After a failure mid-run: end the whole job instead of leaving the other ranks waiting. */
void epyq_tool_ep_abort(const epyq_ep *ep, int code);
/* MPI_Finalize. */
void epyq_tool_ep_close(epyq_ep *ep);

#endif
