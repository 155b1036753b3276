/* tools/bench_progress.c — see bench_progress.h. */
#include "tools/bench_progress.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/util.h"

bool epyq_bench_progress_init(epyq_bench_progress *p, const int *pp, int n_pp, const int *tg, int n_tg,
                              const int *bat, int n_bat, const int *thr, int n_thr, int n_paths, int n_spec,
                              int reps, bool warmup) {
    *p = (epyq_bench_progress){.tty = isatty(STDERR_FILENO), .t0 = epyq_now()};
    int per = reps + (warmup ? 1 : 0), n = 0;
    for (int i = 0; i < n_pp; i++) n += pp[i] > 0 ? per : 0;
    for (int i = 0; i < n_tg; i++)
        for (int b = 0; tg[i] > 0 && b < n_bat; b++) n += per * (bat[b] == 1 ? n_spec : 1);
    n *= n_thr * n_paths;
    p->runs = calloc((size_t)(n ? n : 1), sizeof *p->runs);
    p->secs = calloc((size_t)(n ? n : 1), sizeof *p->secs);
    if (!p->runs || !p->secs) {
        epyq_bench_progress_free(p);
        return false;
    }
    for (int t = 0; t < n_thr; t++)
        for (int path = 0; path < n_paths; path++) {
            for (int i = 0; i < n_pp; i++)
                for (int r = 0; pp[i] > 0 && r < per; r++)
                    p->runs[p->n_runs++] = (epyq_bench_run){true, pp[i], 1, thr[t], warmup && r == 0};
            for (int i = 0; i < n_tg; i++)
                for (int b = 0; tg[i] > 0 && b < n_bat; b++)
                    for (int r = 0; r < per * (bat[b] == 1 ? n_spec : 1); r++) {
                        bool w = warmup && r % per == 0;
                        p->runs[p->n_runs++] =
                            (epyq_bench_run){false, w && tg[i] > 8 ? 8 : tg[i], bat[b], thr[t], w};
                    }
        }
    for (int i = 0; i < p->n_runs; i++) p->secs[i] = -1.0;
    return true;
}

/* tokens per second of a finished run (prefill tokens, or decode steps x sequences) */
static double rate(const epyq_bench_run *r, double secs) {
    return secs > 0 ? (double)r->n * (r->pp ? 1 : r->b) / secs : 0.0;
}

/* Seconds run i is expected to take, from the most similar finished run; < 0 if none. */
static double estimate(const epyq_bench_progress *p, int i) {
    const epyq_bench_run *r = &p->runs[i];
    double same = 0, tg1 = 0;
    for (int j = 0; j < p->done; j++) {
        const epyq_bench_run *q = &p->runs[j];
        double v = rate(q, p->secs[j]);
        if (v <= 0) continue;
        if (q->pp == r->pp && q->b == r->b && (!same || q->threads == r->threads)) same = v;
        if (!q->pp && q->b == 1) tg1 = v;
    }
    double v = same ? same : tg1 ? tg1 * (r->pp ? 4.0 : sqrt((double)r->b)) : 0.0;
    return v > 0 ? (double)r->n * (r->pp ? 1 : r->b) / v : -1.0;
}

static void clock_str(char *buf, size_t n, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

void epyq_bench_progress_start(epyq_bench_progress *p, int rep, int reps) {
    if (!p->tty || !p->runs || p->done >= p->n_runs) return;
    /* price the previous run by the wall time since it started: the read probe after each
     * repetition, the table rows and the lead-in belong to the time a user waits too */
    double now = epyq_now();
    if (p->done > 0 && p->t_start > 0) p->secs[p->done - 1] = now - p->t_start;
    p->t_start = now;
    const epyq_bench_run *r = &p->runs[p->done];
    double left = 0;
    bool known = true;
    for (int i = p->done; i < p->n_runs && known; i++) {
        double e = estimate(p, i);
        if (e < 0) known = false;
        else left += e;
    }
    char test[48], el[16], eta[24] = "?";
    if (r->pp) snprintf(test, sizeof test, "pp%d", r->n);
    else if (r->b == 1) snprintf(test, sizeof test, "tg%d", r->n);
    else snprintf(test, sizeof test, "tg%d b%d", r->n, r->b);
    clock_str(el, sizeof el, epyq_now() - p->t0);
    if (known) clock_str(eta, sizeof eta, left);
    char what[32];
    if (r->warmup) snprintf(what, sizeof what, "warm-up");
    else snprintf(what, sizeof what, "rep %d/%d", rep, reps);
    fprintf(stderr, "\r\033[Kbench: %d threads, %s %s | run %d/%d | %s elapsed | ~%s left", r->threads, test,
            what, p->done + 1, p->n_runs, el, eta);
    fflush(stderr);
}

void epyq_bench_progress_done(epyq_bench_progress *p, double secs) {
    if (!p->runs || p->done >= p->n_runs) return;
    p->secs[p->done++] = secs;
}

void epyq_bench_progress_clear(const epyq_bench_progress *p) {
    if (p->tty && p->runs) fputs("\r\033[K", stderr), fflush(stderr);
}

void epyq_bench_progress_free(epyq_bench_progress *p) {
    free(p->runs), free(p->secs);
    p->runs = NULL, p->secs = NULL;
}
