/* src/engine/runner.h — one engine behind its own thread and a bounded queue, for callers on
 * other threads (the HTTP server; later the chat REPL).
 *
 * Promise: the runner's thread owns the engine (and so the model): it admits queued requests
 * into free slots in arrival order, runs epyq_engine_step() while any request runs, and sleeps
 * on a condition variable otherwise. Submitting never blocks on the model: a full queue or a
 * draining runner refuses at once. A request's callbacks (epyq_engine_cb) are called on the
 * runner's thread without the runner's lock held, exactly as the engine calls them, including
 * the one on_done for requests cancelled while still queued. epyq_runner_cancel() may be
 * called from any thread at any time, also after the request finished (a no-op then); the
 * request ends before the next step that would have carried it. */
#ifndef EPYQ_RUNNER_H
#define EPYQ_RUNNER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

typedef struct epyq_runner epyq_runner;

typedef enum {
    EPYQ_RUNNER_ACCEPTED = 0,
    EPYQ_RUNNER_QUEUE_FULL,  /* max_queue requests already wait */
    EPYQ_RUNNER_DRAINING,    /* epyq_runner_drain started: no new requests */
} epyq_runner_verdict;

/* The engine is borrowed and driven only by the runner's thread until epyq_runner_free().
 * max_queue: requests waiting for a slot (running ones not counted), >= 0. */
epyq_status epyq_runner_create(epyq_runner **out, epyq_engine *eng, int32_t max_queue, epyq_err *err);
/* Stops the thread (cancelling whatever is left, with its on_done calls) and frees. */
void epyq_runner_free(epyq_runner *r);

/* Queue a request (ids, the stop strings and the callbacks are copied). *verdict says whether it
 * was taken; EPYQ_E_NOMEM is the only error. *ticket names it for epyq_runner_cancel. */
epyq_status epyq_runner_submit(epyq_runner *r, const int32_t *ids, size_t n_ids,
                               const epyq_engine_params *p, const epyq_engine_cb *cb,
                               uint64_t *ticket, epyq_runner_verdict *verdict, epyq_err *err);
/* The same with images (engine.h: epyq_engine_add_img; rows and positions copied; NULL = none). */
epyq_status epyq_runner_submit_img(epyq_runner *r, const int32_t *ids, size_t n_ids,
                                   const epyq_engine_img *img, const epyq_engine_params *p,
                                   const epyq_engine_cb *cb, uint64_t *ticket,
                                   epyq_runner_verdict *verdict, epyq_err *err);
void epyq_runner_cancel(epyq_runner *r, uint64_t ticket);

/* Stop admitting; wait up to grace_s seconds for queued and running requests to finish, then
 * cancel what is left. Returns the number of requests that had to be cancelled. */
int32_t epyq_runner_drain(epyq_runner *r, double grace_s);

typedef struct {
    int32_t queued;           /* now */
    int32_t running;          /* as of the last step, like eng */
    double busy_s;            /* engine thread: seconds spent admitting, cancelling and stepping */
    epyq_engine_stats eng;    /* as of the last step */
} epyq_runner_stats;
void epyq_runner_get_stats(epyq_runner *r, epyq_runner_stats *st);

#endif
