/* tools/batch_mpi.h — `epyq batch` over MPI ranks (Open MPI; mpirun or srun).
 *
 * Data parallel: every rank loads its own copy of the model and runs the requests assigned to
 * it on its own engine; rank 0 (the lead) is the only rank that touches the job's files. It
 * reads the input (and, with --resume, the output written so far) and hands the bytes to every
 * rank, so all ranks parse the same job table and compute the same assignment without a shared
 * file system; the other ranks (workers) send each finished record back as a message and the
 * lead writes the file in input order exactly as a single process does. Each worker ends with a
 * FIN message (its status, its error line, its token counts), so a worker that fails is
 * reported by the lead and its unfinished requests are left for --resume instead of the job
 * waiting on it forever. A rank that dies outright is mpirun's to handle: it terminates the
 * other ranks with SIGTERM, which the lead answers like a single process (finished prefix on
 * disk, exit 143).
 *
 * Without MPI in the build (or outside a launcher) epyq_batch_mpi_open() gives NULL, every
 * function below takes NULL as "one process" and the job runs exactly as before. */
#ifndef EPYQ_TOOLS_BATCH_MPI_H
#define EPYQ_TOOLS_BATCH_MPI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct epyq_batch_mpi epyq_batch_mpi;

/* What a rank has computed so far; the lead's progress and summary add these up. */
typedef struct {
    uint64_t gen_tokens, prompt_tokens, cached_tokens;
} epyq_batch_mpi_stats;

/* The lead's handler of a worker's finished record: job is the index in the job table (the
 * same on every rank), record is malloc'd with one spare byte after its NUL and now the
 * handler's. Returns false for a job index that is not a remote job (a protocol error). */
typedef bool (*epyq_batch_mpi_record_fn)(void *ctx, size_t job, bool failed, char *record);

/* Join the MPI job when the process was started by a launcher (mpirun, srun): *mp stays NULL
 * otherwise, and also for a one-rank job, which needs no messages. */
epyq_status epyq_batch_mpi_open(epyq_batch_mpi **mp, int *argc, char ***argv, epyq_err *err);
/* MPI_Finalize (waits for every rank to get here). */
void epyq_batch_mpi_close(epyq_batch_mpi *mp);
int epyq_batch_mpi_rank(const epyq_batch_mpi *mp);
int epyq_batch_mpi_size(const epyq_batch_mpi *mp);

/* Collective: the lead passes its status (err filled when it failed) and its bytes; every rank
 * returns the lead's status, and the workers get a malloc'd copy of the bytes (NUL-terminated).
 * A worker's err then holds the lead's message, which only the lead prints. */
epyq_status epyq_batch_mpi_share(epyq_batch_mpi *mp, epyq_status st, char **data, size_t *len,
                                 epyq_err *err);

/* Longest-processing-time-first: jobs by weight, heaviest first, each to the rank with the least
 * weight so far (ties: the lower rank, then the earlier job), so every rank computes the same
 * owner[] from the same weights. Weights of 0 are jobs to leave out (owner -1). */
epyq_status epyq_batch_mpi_assign(const uint64_t *weight, size_t n, int n_ranks, int *owner,
                                  epyq_err *err);

/* Called by every rank after the last share: from here on every worker owes the lead a FIN
 * (epyq_batch_mpi_finish), even when its own part of that share failed; before it, a failure is
 * shared (epyq_batch_mpi_share) and nobody waits. Nothing starts when the lead's status in the
 * last share was a failure. */
void epyq_batch_mpi_start(epyq_batch_mpi *mp);
bool epyq_batch_mpi_started(const epyq_batch_mpi *mp);

/* Worker: send one finished record (len bytes, no newline); the send completes in the
 * background, the bytes are copied. */
epyq_status epyq_batch_mpi_send_record(epyq_batch_mpi *mp, size_t job, bool failed, const char *rec,
                                       size_t len, epyq_err *err);
/* Worker: tell the lead the tokens computed so far (at most once a second). */
void epyq_batch_mpi_send_progress(epyq_batch_mpi *mp, const epyq_batch_mpi_stats *s);
/* Worker: has the lead asked every rank to stop (a signal, or its own fatal error)? */
bool epyq_batch_mpi_stop_asked(epyq_batch_mpi *mp);
/* Worker: the FIN message: exit status (0, 1 fatal, 130/143 signal), err's line when it is 1,
 * final token counts; then waits until every message it sent has left. */
epyq_status epyq_batch_mpi_finish(epyq_batch_mpi *mp, int status, const epyq_err *why,
                                  const epyq_batch_mpi_stats *s, epyq_err *err);

/* Lead: handle the messages that have arrived, waiting up to wait_s seconds for the first one
 * when none has (0: do not wait). */
epyq_status epyq_batch_mpi_poll(epyq_batch_mpi *mp, double wait_s, epyq_batch_mpi_record_fn fn,
                                void *ctx, epyq_err *err);
/* Lead: workers that have not sent their FIN yet. */
int epyq_batch_mpi_running(const epyq_batch_mpi *mp);
/* Lead: ask every running worker to stop after its current step (once). */
void epyq_batch_mpi_stop_all(epyq_batch_mpi *mp);
/* Lead: the workers' token counts added up (their FIN's when they have finished). */
void epyq_batch_mpi_remote_stats(const epyq_batch_mpi *mp, epyq_batch_mpi_stats *sum);
/* Lead: worker rank's exit status from its FIN (-1 while it runs) and its error line ("" when
 * none), prefixed with the host it ran on. */
int epyq_batch_mpi_worker_status(const epyq_batch_mpi *mp, int rank, const char **msg);

#endif
