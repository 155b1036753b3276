/* src/engine/runner.c — see runner.h. */
#include "engine/runner.h"

#include "core/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct rjob {
    struct rjob *next;   /* queue or running list */
    struct rjob *anext;  /* this round's admissions, in arrival order */
    epyq_runner *r;
    uint64_t ticket, eng_id;
    int32_t *ids;
    size_t n_ids;
    epyq_engine_params p;
    char *stops[EPYQ_ENGINE_MAX_STOP];
    epyq_engine_cb cb;
    bool cancel, cancel_sent;
    bool has_img;
    epyq_engine_img img; /* rows [n_rows][hidden] and pos [n_ids][3] owned by the job */
} rjob;

struct epyq_runner {
    epyq_engine *eng;
    int32_t max_queue, slots;
    pthread_t th;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t wake;  /* the runner thread: work arrived */
    pthread_cond_t idle;  /* drain: a request finished */
    rjob *queue, **queue_tail, *running;
    int32_t n_queued, n_running;
    uint64_t next_ticket;
    bool draining, quit;
    epyq_runner_stats st;
};

static void job_free(rjob *j) {
    if (!j) return;
    for (int32_t i = 0; i < EPYQ_ENGINE_MAX_STOP; i++) free(j->stops[i]);
    free(j->ids);
    free((void *)j->img.rows), free((void *)j->img.pos);
    free(j);
}

static void unlink_running(epyq_runner *r, rjob *j) {
    for (rjob **pp = &r->running; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            r->n_running--;
            return;
        }
}

static void w_event(void *ctx, const epyq_engine_event *ev) {
    rjob *j = ctx;
    if (j->cb.on_event) j->cb.on_event(j->cb.ctx, ev);
}

static void w_done(void *ctx, epyq_engine_finish f, const epyq_engine_usage *u, const epyq_err *err) {
    rjob *j = ctx;
    epyq_runner *r = j->r;
    if (j->cb.on_done) j->cb.on_done(j->cb.ctx, f, u, err);
    pthread_mutex_lock(&r->mu);
    unlink_running(r, j);
    pthread_cond_broadcast(&r->idle);
    pthread_mutex_unlock(&r->mu);
    job_free(j);
}

static void *thread_main(void *arg) {
    epyq_runner *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        rjob *dropped = NULL, *admit = NULL, **admit_tail = &admit;
        uint64_t cancel_ids[64];
        int32_t n_cancel = 0;
        /* queued requests that were cancelled leave without ever reaching the engine */
        for (rjob **pp = &r->queue; *pp;) {
            rjob *j = *pp;
            if (j->cancel || r->quit) {
                *pp = j->next;
                j->next = dropped, dropped = j;
                r->n_queued--;
            } else {
                pp = &j->next;
            }
        }
        r->queue_tail = &r->queue;
        while (*r->queue_tail) r->queue_tail = &(*r->queue_tail)->next;
        for (rjob *j = r->running; j && n_cancel < 64; j = j->next)
            if ((j->cancel || r->quit) && !j->cancel_sent && j->eng_id) {
                j->cancel_sent = true;
                cancel_ids[n_cancel++] = j->eng_id;
            }
        int32_t slots = epyq_engine_free_slots(r->eng);
        while (slots > 0 && r->queue) {
            rjob *j = r->queue;
            r->queue = j->next;
            if (!r->queue) r->queue_tail = &r->queue;
            r->n_queued--;
            j->anext = NULL;
            *admit_tail = j, admit_tail = &j->anext;
            slots--;
        }
        bool busy = dropped || admit || n_cancel || epyq_engine_active(r->eng) > 0;
        if (!busy) {
            r->st.queued = r->n_queued, r->st.running = r->n_running;
            if (r->quit && !r->running) break;
            pthread_cond_broadcast(&r->idle);
            pthread_cond_wait(&r->wake, &r->mu);
            continue;
        }
        double t_busy = epyq_now();
        /* admitted requests join the running list before the lock is dropped, so a cancel
         * always finds a request in one of the two lists */
        for (rjob *j = admit; j; j = j->anext) j->next = r->running, r->running = j, r->n_running++;
        pthread_mutex_unlock(&r->mu);

        while (dropped) {
            rjob *j = dropped;
            dropped = j->next;
            epyq_engine_usage u = {(int32_t)j->n_ids, 0, 0};
            if (j->cb.on_done) j->cb.on_done(j->cb.ctx, EPYQ_ENGINE_CANCELLED, &u, NULL);
            job_free(j);
        }
        pthread_mutex_lock(&r->mu);
        pthread_cond_broadcast(&r->idle);
        pthread_mutex_unlock(&r->mu);
        for (int32_t i = 0; i < n_cancel; i++) epyq_engine_cancel(r->eng, cancel_ids[i]);
        for (rjob *j = admit, *nx; j; j = nx) {
            nx = j->anext; /* w_done frees j */
            const epyq_engine_cb cb = {w_event, w_done, j};
            epyq_engine_usage u = {(int32_t)j->n_ids, 0, 0};
            epyq_err err = {0};
            uint64_t id = 0;
            pthread_mutex_lock(&r->mu);
            bool cancelled = j->cancel || r->quit;
            pthread_mutex_unlock(&r->mu);
            if (cancelled) w_done(j, EPYQ_ENGINE_CANCELLED, &u, NULL);
            else if (epyq_engine_add_img(r->eng, j->ids, j->n_ids, j->has_img ? &j->img : NULL,
                                         &j->p, &cb, &id, &err) != EPYQ_OK)
                w_done(j, EPYQ_ENGINE_ERROR, &u, &err);
            else {
                pthread_mutex_lock(&r->mu);
                j->eng_id = id;
                pthread_mutex_unlock(&r->mu);
            }
        }
        epyq_err err = {0};
        epyq_engine_step(r->eng, &err); /* a failure ends the requests it carried (on_done) */
        pthread_mutex_lock(&r->mu);
        r->st.busy_s += epyq_now() - t_busy;
        epyq_engine_get_stats(r->eng, &r->st.eng);
        r->st.queued = r->n_queued, r->st.running = r->n_running;
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

epyq_status epyq_runner_create(epyq_runner **out, epyq_engine *eng, int32_t max_queue, epyq_err *err) {
    *out = NULL;
    if (max_queue < 0) return epyq_err_set(err, EPYQ_E_ARG, "runner: max_queue %d, expected >= 0", max_queue);
    epyq_runner *r = calloc(1, sizeof *r);
    if (!r) return epyq_err_set(err, EPYQ_E_NOMEM, "runner: out of memory");
    r->eng = eng, r->max_queue = max_queue, r->next_ticket = 1;
    r->slots = epyq_engine_free_slots(eng);
    r->queue_tail = &r->queue;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->wake, NULL);
    pthread_cond_init(&r->idle, NULL);
    if (pthread_create(&r->th, NULL, thread_main, r) != 0) {
        epyq_runner_free(r);
        return epyq_err_set(err, EPYQ_E_NOMEM, "runner: cannot start the engine thread");
    }
    pthread_setname_np(r->th, "epyq_engine"); /* top -H, /proc/PID/task/TID/comm */
    r->started = true;
    *out = r;
    return EPYQ_OK;
}

void epyq_runner_free(epyq_runner *r) {
    if (!r) return;
    if (r->started) {
        pthread_mutex_lock(&r->mu);
        r->quit = true;
        pthread_cond_signal(&r->wake);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->th, NULL);
    }
    pthread_cond_destroy(&r->wake);
    pthread_cond_destroy(&r->idle);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

epyq_status epyq_runner_submit(epyq_runner *r, const int32_t *ids, size_t n_ids,
                               const epyq_engine_params *p, const epyq_engine_cb *cb,
                               uint64_t *ticket, epyq_runner_verdict *verdict, epyq_err *err) {
    return epyq_runner_submit_img(r, ids, n_ids, NULL, p, cb, ticket, verdict, err);
}

epyq_status epyq_runner_submit_img(epyq_runner *r, const int32_t *ids, size_t n_ids,
                                   const epyq_engine_img *img, const epyq_engine_params *p,
                                   const epyq_engine_cb *cb, uint64_t *ticket,
                                   epyq_runner_verdict *verdict, epyq_err *err) {
    rjob *j = calloc(1, sizeof *j);
    if (!j || !(j->ids = malloc((n_ids ? n_ids : 1) * sizeof *ids))) {
        free(j);
        return epyq_err_set(err, EPYQ_E_NOMEM, "runner: out of memory");
    }
    if (img && img->rows && img->pos) { /* the engine checks them at admission */
        size_t nr = (size_t)(img->n_rows > 0 ? img->n_rows : 0) *
                    (size_t)(img->hidden > 0 ? img->hidden : 0);
        float *rows = malloc((nr ? nr : 1) * sizeof *rows);
        int32_t *pos = malloc((n_ids ? n_ids : 1) * 3 * sizeof *pos);
        j->img = *img, j->img.rows = rows, j->img.pos = pos, j->has_img = true;
        if (!rows || !pos) {
            job_free(j);
            return epyq_err_set(err, EPYQ_E_NOMEM, "runner: image rows: out of memory");
        }
        memcpy(rows, img->rows, nr * sizeof *rows);
        memcpy(pos, img->pos, n_ids * 3 * sizeof *pos);
    }
    memcpy(j->ids, ids, n_ids * sizeof *ids);
    j->n_ids = n_ids, j->p = *p, j->cb = *cb, j->r = r;
    for (int32_t i = 0; i < p->n_stop && i < EPYQ_ENGINE_MAX_STOP; i++) {
        if (!(j->stops[i] = strdup(p->stop[i] ? p->stop[i] : ""))) {
            job_free(j);
            return epyq_err_set(err, EPYQ_E_NOMEM, "runner: out of memory");
        }
        j->p.stop[i] = j->stops[i];
    }
    pthread_mutex_lock(&r->mu);
    if (r->draining || r->quit) *verdict = EPYQ_RUNNER_DRAINING;
    /* a request waits only when every slot is taken: until the thread admits it, one that
     * will get a free slot at once is not counted against the queue */
    else if (r->n_queued >= r->max_queue + (r->slots - r->n_running)) *verdict = EPYQ_RUNNER_QUEUE_FULL;
    else *verdict = EPYQ_RUNNER_ACCEPTED;
    if (*verdict == EPYQ_RUNNER_ACCEPTED) {
        j->ticket = r->next_ticket++;
        *r->queue_tail = j, r->queue_tail = &j->next;
        r->n_queued++;
        r->st.queued = r->n_queued;
        if (ticket) *ticket = j->ticket;
        pthread_cond_signal(&r->wake);
    }
    pthread_mutex_unlock(&r->mu);
    if (*verdict != EPYQ_RUNNER_ACCEPTED) job_free(j);
    return EPYQ_OK;
}

void epyq_runner_cancel(epyq_runner *r, uint64_t ticket) {
    pthread_mutex_lock(&r->mu);
    for (rjob *j = r->queue; j; j = j->next)
        if (j->ticket == ticket) j->cancel = true;
    for (rjob *j = r->running; j; j = j->next)
        if (j->ticket == ticket) j->cancel = true;
    pthread_cond_signal(&r->wake);
    pthread_mutex_unlock(&r->mu);
}

static void deadline_in(struct timespec *ts, double s) {
    clock_gettime(CLOCK_REALTIME, ts);
    long ns = ts->tv_nsec + (long)((s - (double)(long)s) * 1e9);
    ts->tv_sec += (time_t)s + ns / 1000000000L;
    ts->tv_nsec = ns % 1000000000L;
}

int32_t epyq_runner_drain(epyq_runner *r, double grace_s) {
    struct timespec dl;
    deadline_in(&dl, grace_s);
    pthread_mutex_lock(&r->mu);
    r->draining = true;
    while (r->queue || r->running)
        if (pthread_cond_timedwait(&r->idle, &r->mu, &dl) == ETIMEDOUT) break;
    int32_t n = 0;
    for (rjob *j = r->queue; j; j = j->next) j->cancel = true, n++;
    for (rjob *j = r->running; j; j = j->next) j->cancel = true, n++;
    pthread_cond_signal(&r->wake);
    while (r->queue || r->running) pthread_cond_wait(&r->idle, &r->mu);
    pthread_mutex_unlock(&r->mu);
    return n;
}

void epyq_runner_get_stats(epyq_runner *r, epyq_runner_stats *st) {
    pthread_mutex_lock(&r->mu);
    /* running and the engine's figures (kv_bytes above all) come from the same moment, after
     * the engine thread's last step: a cancelled request leaves running at once but its
     * sequence is freed inside the engine, so a live count beside the step's kv_bytes could
     * show no request running and its KV still held */
    *st = r->st;
    st->queued = r->n_queued;
    pthread_mutex_unlock(&r->mu);
}
