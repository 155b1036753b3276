/* tools/bench_progress.h — the progress line of `epyq bench` on a terminal.
 *
 * Promise: given the whole plan of timed runs (every warm-up and repetition of every test at
 * every thread count) up front, epyq_bench_progress_step() redraws one stderr line — the test,
 * repetition, runs done of total, time elapsed and an estimate of the time left — and does
 * nothing when stderr is not a terminal (CI logs and pipes stay clean). The estimate prices
 * each remaining run from the rate measured by the most similar run done so far: the same test
 * kind and batch (any thread count), else the batch-1 decode rate scaled by sqrt(batch) for
 * batched decode and 4x it for prefill; model loads are not in it (they have their own line). */
#ifndef EPYQ_BENCH_PROGRESS_H
#define EPYQ_BENCH_PROGRESS_H

#include <stdbool.h>

typedef struct {
    bool pp;      /* prefill of n tokens, else n decode steps of b sequences */
    int n, b, threads;
    bool warmup;  /* a warm-up run (n shortened to 8 steps for tg) */
} epyq_bench_run;

typedef struct {
    bool tty;
    double t0, t_start;   /* bench start, start of the current run */
    epyq_bench_run *runs; /* [n_runs] the plan, in order */
    double *secs;         /* [n_runs] measured seconds, < 0 while not run */
    int n_runs, done;
} epyq_bench_progress;

/* Plan: tests of every thread count in the order cmd_bench runs them (batch-1 tg once per
 * --spec entry). Returns false on OOM
 * (the bench then simply runs without a progress line). */
bool epyq_bench_progress_init(epyq_bench_progress *p, const int *pp, int n_pp, const int *tg, int n_tg,
                              const int *bat, int n_bat, const int *thr, int n_thr, int n_paths, int n_spec,
                              int reps, bool warmup);
/* Run `done` (index into the plan) is about to start: redraw the line. */
void epyq_bench_progress_start(epyq_bench_progress *p, int rep, int reps);
/* The run that just started took secs seconds. */
void epyq_bench_progress_done(epyq_bench_progress *p, double secs);
/* Clear the line (before printing a table row or an error). */
void epyq_bench_progress_clear(const epyq_bench_progress *p);
void epyq_bench_progress_free(epyq_bench_progress *p);

#endif
