/* tools/serve_http.c — see serve_http.h. */
#include "tools/serve_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "core/util.h"
#include "tools/media.h"
#include "tools/serve_out.h"
#include "tools/serve_req.h"

/* How often a waiting connection looks at its socket for a client that went away. */
#define POLL_MS 100

enum { EP_CHAT, EP_CMPL, EP_MODELS, EP_HEALTH, EP_METRICS, EP_OTHER, EP_N };
static const char *const ep_names[EP_N] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "other"};
static const int status_codes[] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
#define N_STATUS (sizeof status_codes / sizeof *status_codes)

struct epyq_server {
    epyq_serve_cfg cfg;
    epyq_runner *runner;
    const epyq_tok *tok;
    const epyq_chat *chat;
    const epyq_config *mcfg;
    pthread_mutex_t chat_mu; /* template rendering is not promised to be thread-safe */
    /* one tower, one connection thread at a time: images are encoded at admission, on the
     * request's own thread (the tower has its own pool, beside the engine's) */
    pthread_mutex_t vision_mu;
    struct MHD_Daemon *d;
    int port;
    int stopping;
    double t_start;
    uint64_t req_count[EP_N][N_STATUS];
    uint64_t cancelled, streams_open;
    int64_t inflight; /* generation requests from submit until libmicrohttpd is done with them */
};

/* One HTTP request. Shared by the connection thread, the engine thread (until on_done) and
 * the stream reader (until libmicrohttpd frees it): reference counted. */
typedef struct {
    epyq_server *s;
    int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* handed over by the engine thread, under mu */
    epyq_sbuf text;
    epyq_engine_logprob *lps;
    bool *lp_prompt;
    size_t n_lps, cap_lps;
    bool done, oom;
    epyq_engine_finish finish;
    epyq_engine_usage usage;
    char errmsg[EPYQ_ERR_MSG_MAX];
    /* the connection thread's */
    int ep, status;
    double t0;
    int fd;
    epyq_sbuf body;
    bool too_big, submitted;
    uint64_t ticket;
    epyq_serve_req req;
    epyq_media media;      /* image parts (tools/media.h) */
    epyq_vision_prompt vp; /* their rows and positions until submitted */
    epyq_engine_img vimg;  /* borrows vp */
    char *prompt_text;
    bool have_out;
    epyq_serve_out out;
    epyq_sbuf sse;
    size_t sse_pos;
    bool stream_ended;
    bool gone_counted; /* epyq_requests_cancelled_total already has this request */
} sreq;

static void count(epyq_server *s, int ep, int status) {
    for (size_t i = 0; i < N_STATUS; i++)
        if (status_codes[i] == status) __atomic_add_fetch(&s->req_count[ep][i], 1, __ATOMIC_RELAXED);
}

static void sreq_unref(sreq *q) {
    pthread_mutex_lock(&q->mu);
    int left = --q->refs;
    pthread_mutex_unlock(&q->mu);
    if (left) return;
    epyq_sbuf_free(&q->text);
    free(q->lps), free(q->lp_prompt);
    epyq_sbuf_free(&q->body);
    epyq_serve_req_free(&q->req);
    epyq_media_free(&q->media);
    epyq_vision_prompt_free(&q->vp);
    free(q->prompt_text);
    if (q->have_out) epyq_serve_out_free(&q->out);
    epyq_sbuf_free(&q->sse);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

/* ---- engine-thread callbacks ------------------------------------------------------------ */

static void on_event(void *ctx, const epyq_engine_event *ev) {
    sreq *q = ctx;
    pthread_mutex_lock(&q->mu);
    if (ev->len && !epyq_sbuf_add(&q->text, ev->text, ev->len)) q->oom = true;
    if (ev->lp) {
        if (q->n_lps == q->cap_lps) {
            size_t nc = q->cap_lps ? 2 * q->cap_lps : 16;
            epyq_engine_logprob *nl = realloc(q->lps, nc * sizeof *nl);
            if (nl) q->lps = nl;
            bool *np = realloc(q->lp_prompt, nc * sizeof *np);
            if (np) q->lp_prompt = np;
            if (nl && np) q->cap_lps = nc;
        }
        if (q->n_lps < q->cap_lps) q->lps[q->n_lps] = *ev->lp, q->lp_prompt[q->n_lps++] = ev->prompt;
        else q->oom = true;
    }
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static void on_done(void *ctx, epyq_engine_finish f, const epyq_engine_usage *u, const epyq_err *err) {
    sreq *q = ctx;
    pthread_mutex_lock(&q->mu);
    q->done = true, q->finish = f, q->usage = *u;
    if (err) snprintf(q->errmsg, sizeof q->errmsg, "%s", err->msg);
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    sreq_unref(q); /* the engine's reference */
}

/* ---- responses -------------------------------------------------------------------------- */

static enum MHD_Result send_text(struct MHD_Connection *c, sreq *q, int status, const char *ctype, const char *body,
                                 const char *retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count(q->s, q->ep, status);
    q->status = status;
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, sreq *q, int status, const char *body) {
    return send_text(c, q, status, "application/json", body, NULL);
}

static enum MHD_Result send_error(struct MHD_Connection *c, sreq *q, const epyq_serve_error *e) {
    char *j = epyq_serve_error_json(e);
    enum MHD_Result r = send_text(c, q, e->http, "application/json", j ? j : "{}", e->http == 429 ? "1" : NULL);
    free(j);
    return r;
}

static enum MHD_Result fail(struct MHD_Connection *c, sreq *q, int http, const char *type, const char *param,
                            const char *code, const char *msg) {
    epyq_serve_error e;
    epyq_serve_error_set(&e, http, type, param, code, "%s", msg);
    return send_error(c, q, &e);
}

/* True when the peer closed its end (or the socket broke): nothing we send will arrive. */
static bool client_gone(const sreq *q) {
    if (q->fd < 0) return false;
    struct pollfd p = {.fd = q->fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* The client went away before its answer was finished: count it and cancel it here, before the
 * engine's CANCELLED finish marks the request done (completed() would then see nothing unfinished).
 */
static void cancel_gone(sreq *q) {
    if (!__atomic_exchange_n(&q->gone_counted, true, __ATOMIC_RELAXED))
        __atomic_add_fetch(&q->s->cancelled, 1, __ATOMIC_RELAXED);
    epyq_runner_cancel(q->s->runner, q->ticket);
}

/* Wait for news from the engine (or POLL_MS); under q->mu. */
static void wait_news(sreq *q) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += POLL_MS * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&q->cv, &q->mu, &dl);
}

/* Move what the engine handed over into the output formatter. Returns false on failure. */
static bool drain_news(sreq *q, bool *done, epyq_sbuf *sse, epyq_err *err) {
    pthread_mutex_lock(&q->mu);
    epyq_sbuf text = q->text;
    epyq_engine_logprob *lps = q->lps;
    bool *lpp = q->lp_prompt, oom = q->oom;
    size_t n = q->n_lps;
    *done = q->done;
    memset(&q->text, 0, sizeof q->text);
    q->lps = NULL, q->lp_prompt = NULL, q->n_lps = q->cap_lps = 0;
    pthread_mutex_unlock(&q->mu);
    epyq_status st = oom ? epyq_err_set(err, EPYQ_E_NOMEM, "out of memory") : EPYQ_OK;
    if (st == EPYQ_OK && (text.len || n)) st = epyq_serve_out_push(&q->out, text.p, text.len, lps, lpp, n, sse, err);
    epyq_sbuf_free(&text);
    free(lps), free(lpp);
    return st == EPYQ_OK;
}

static void sse_error(epyq_sbuf *sse, int http, const char *type, const char *msg) {
    epyq_serve_error e;
    epyq_serve_error_set(&e, http, type, NULL, NULL, "%s", msg);
    char *j = epyq_serve_error_json(&e);
    epyq_sbuf_printf(sse, "data: %s\n\ndata: [DONE]\n\n", j ? j : "{}");
    free(j);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    sreq *q = cls;
    (void)pos;
    for (;;) {
        if (q->sse_pos < q->sse.len) {
            size_t n = q->sse.len - q->sse_pos < max ? q->sse.len - q->sse_pos : max;
            memcpy(buf, q->sse.p + q->sse_pos, n);
            q->sse_pos += n;
            if (q->sse_pos == q->sse.len) q->sse.len = q->sse_pos = 0;
            return (ssize_t)n;
        }
        if (q->stream_ended) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&q->mu);
        if (!q->done && !q->text.len && !q->n_lps) wait_news(q);
        bool idle = !q->done && !q->text.len && !q->n_lps;
        pthread_mutex_unlock(&q->mu);
        if (idle) {
            if (client_gone(q)) {
                cancel_gone(q);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            continue;
        }
        bool done = false;
        epyq_err err = {0};
        if (!drain_news(q, &done, &q->sse, &err)) {
            epyq_runner_cancel(q->s->runner, q->ticket);
            sse_error(&q->sse, 500, "server_error", err.msg);
            q->stream_ended = true;
            continue;
        }
        if (!done) continue;
        q->stream_ended = true;
        if (q->finish == EPYQ_ENGINE_ERROR) sse_error(&q->sse, 500, "server_error", q->errmsg);
        else if (q->finish == EPYQ_ENGINE_CANCELLED) sse_error(&q->sse, 503, "server_error", "the request was cancelled: the server is shutting down");
        else if (epyq_serve_out_finish(&q->out, q->finish, &q->usage, q->req.include_usage, &q->sse, NULL, &err) != EPYQ_OK)
            sse_error(&q->sse, 500, "server_error", err.msg);
    }
}

static void stream_free(void *cls) {
    sreq *q = cls;
    __atomic_sub_fetch(&q->s->streams_open, 1, __ATOMIC_RELAXED);
    sreq_unref(q);
}

/* ---- generation requests ---------------------------------------------------------------- */

static enum MHD_Result generate(struct MHD_Connection *c, sreq *q) {
    epyq_server *s = q->s;
    epyq_serve_error e;
    bool chat = q->ep == EP_CHAT;
    if (!epyq_serve_req_parse(&q->req, chat, q->body.p ? q->body.p : "", q->body.len, s->cfg.model_name, &e))
        return send_error(c, q, &e);
    epyq_err err = {0};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    epyq_status st = EPYQ_OK;
    if (chat) {
        if (!s->chat) return fail(c, q, 400, "invalid_request_error", "messages", "no_chat_template",
                                  "this checkpoint has no chat template: use /v1/completions");
        if (epyq_media_collect(&q->media, q->req.messages, s->cfg.media_dir, &err) != EPYQ_OK)
            return fail(c, q, err.code == EPYQ_E_NOMEM ? 500 : 400, "invalid_request_error",
                        q->media.param[0] ? q->media.param : "messages", "invalid_image", err.msg);
        if (q->media.n_img && !s->cfg.vision) {
            return fail(c, q, 400, "invalid_request_error", q->media.first, "no_vision",
                        s->cfg.no_vision ? s->cfg.no_vision : "no vision tower");
        }
        size_t len;
        pthread_mutex_lock(&s->chat_mu);
        st = epyq_chat_render(s->chat, q->media.messages ? q->media.messages : q->req.messages,
                              q->req.kwargs, &q->prompt_text, &len, &err);
        pthread_mutex_unlock(&s->chat_mu);
        if (st != EPYQ_OK) return fail(c, q, 400, "invalid_request_error", "messages", "template_error", err.msg);
    } else if (q->req.prompt) {
        q->prompt_text = strdup(q->req.prompt);
    } else {
        for (size_t i = 0; i < q->req.n_prompt_ids; i++)
            if (q->req.prompt_ids[i] >= s->mcfg->vocab_size) {
                char m[160];
                snprintf(m, sizeof m, "'prompt' token id %d is not below the vocabulary size %d", q->req.prompt_ids[i], s->mcfg->vocab_size);
                return fail(c, q, 400, "invalid_request_error", "prompt", "invalid_value", m);
            }
        size_t len;
        st = epyq_tok_decode(s->tok, q->req.prompt_ids, q->req.n_prompt_ids, false, &q->prompt_text, &len, &err);
    }
    if (st == EPYQ_OK && !q->prompt_text) st = epyq_err_set(&err, EPYQ_E_NOMEM, "out of memory");
    if (st == EPYQ_OK && q->req.prompt_ids) {
        n_ids = q->req.n_prompt_ids;
        ids = malloc(n_ids * sizeof *ids);
        if (ids) memcpy(ids, q->req.prompt_ids, n_ids * sizeof *ids);
        else st = epyq_err_set(&err, EPYQ_E_NOMEM, "out of memory");
    } else if (st == EPYQ_OK) {
        st = epyq_tok_encode(s->tok, q->prompt_text, strlen(q->prompt_text), &ids, &n_ids, &err);
    }
    if (st != EPYQ_OK) {
        free(ids);
        return fail(c, q, 500, "server_error", NULL, NULL, err.msg);
    }
    if (q->media.n_img) { /* the tower over the images; the pads expanded */
        pthread_mutex_lock(&s->vision_mu);
        st = epyq_media_prompt(s->cfg.vision, &q->media, &ids, &n_ids, &q->vp, &q->vimg, &err);
        pthread_mutex_unlock(&s->vision_mu);
        if (st != EPYQ_OK) {
            free(ids);
            return fail(c, q, st == EPYQ_E_NOMEM ? 500 : 400, "invalid_request_error", "messages",
                        "invalid_image", err.msg);
        }
    }
    const char *pname = chat ? "messages" : "prompt";
    char m[256];
    int32_t ctx = s->cfg.ctx_limit;
    if (n_ids == 0) {
        free(ids);
        return fail(c, q, 400, "invalid_request_error", pname, "invalid_value", "the prompt is empty");
    }
    if (n_ids >= (size_t)ctx) {
        free(ids);
        snprintf(m, sizeof m, "the prompt has %zu tokens; this server's context is %d tokens (-c), leaving no room to generate", n_ids, ctx);
        return fail(c, q, 400, "invalid_request_error", pname, "context_length_exceeded", m);
    }
    if (q->req.max_tokens > 0 && (int64_t)n_ids + q->req.max_tokens > ctx) {
        free(ids);
        snprintf(m, sizeof m, "the prompt has %zu tokens and %lld more were asked for; this server's context is %d tokens (-c)",
                 n_ids, (long long)q->req.max_tokens, ctx);
        return fail(c, q, 400, "invalid_request_error", chat ? "max_tokens" : "max_tokens", "context_length_exceeded", m);
    }
    epyq_engine_params p = {0};
    p.max_tokens = q->req.max_tokens > 0 ? (int32_t)q->req.max_tokens : ctx - (int32_t)n_ids;
    epyq_sample_overrides_apply(&q->req.so, s->mcfg, &p.sp);
    p.sp.frequency_penalty = (float)q->req.frequency_penalty;
    for (int32_t i = 0; i < q->req.n_stop; i++) p.stop[i] = q->req.stop[i];
    p.n_stop = q->req.n_stop;
    p.logprobs = q->req.logprobs;
    p.prompt_logprobs = !chat && q->req.echo && q->req.logprobs >= 0;
    p.ignore_eos = q->req.ignore_eos;
    st = epyq_serve_out_init(&q->out, chat, q->req.stream, s->cfg.model_name, s->tok, q->req.tools, q->req.logprobs,
                             chat && epyq_chat_prompt_opens_think(q->prompt_text, strlen(q->prompt_text)), &err);
    q->have_out = true;
    q->out.echo = q->req.echo;
    q->out.prompt_text = q->prompt_text;
    q->out.first_prompt_id = ids[0];
    if (st != EPYQ_OK) {
        free(ids);
        return fail(c, q, 500, "server_error", NULL, NULL, err.msg);
    }
    if (__atomic_load_n(&s->stopping, __ATOMIC_RELAXED)) {
        free(ids);
        return fail(c, q, 503, "server_error", NULL, "shutting_down", "the server is shutting down and takes no new requests");
    }
    const epyq_engine_cb cb = {on_event, on_done, q};
    epyq_runner_verdict v;
    pthread_mutex_lock(&q->mu);
    q->refs++; /* the engine's, released by on_done */
    pthread_mutex_unlock(&q->mu);
    st = epyq_runner_submit_img(s->runner, ids, n_ids, q->media.n_img ? &q->vimg : NULL, &p, &cb,
                                &q->ticket, &v, &err);
    free(ids);
    epyq_vision_prompt_free(&q->vp); /* the runner has its copy */
    epyq_media_free(&q->media);
    if (st != EPYQ_OK || v != EPYQ_RUNNER_ACCEPTED) {
        sreq_unref(q); /* the engine never saw it */
        if (st != EPYQ_OK) return fail(c, q, 500, "server_error", NULL, NULL, err.msg);
        if (v == EPYQ_RUNNER_QUEUE_FULL)
            return fail(c, q, 429, "rate_limit_error", NULL, "queue_full", "the request queue is full (--max-queue); retry later");
        return fail(c, q, 503, "server_error", NULL, "shutting_down", "the server is shutting down and takes no new requests");
    }
    q->submitted = true;
    __atomic_add_fetch(&s->inflight, 1, __ATOMIC_RELAXED);
    if (q->req.stream) {
        epyq_serve_out_start(&q->out, &q->sse, &err);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, q, stream_free);
        if (!r) {
            epyq_runner_cancel(s->runner, q->ticket);
            return MHD_NO;
        }
        pthread_mutex_lock(&q->mu);
        q->refs++; /* the reader's, released by stream_free */
        pthread_mutex_unlock(&q->mu);
        __atomic_add_fetch(&s->streams_open, 1, __ATOMIC_RELAXED);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        count(s, q->ep, 200);
        q->status = 200;
        return ret;
    }
    /* Non-streaming: this connection's thread waits, watching its socket. */
    bool done = false;
    while (!done) {
        pthread_mutex_lock(&q->mu);
        if (!q->done) wait_news(q);
        pthread_mutex_unlock(&q->mu);
        if (!drain_news(q, &done, NULL, &err)) {
            epyq_runner_cancel(s->runner, q->ticket);
            return fail(c, q, 500, "server_error", NULL, NULL, err.msg);
        }
        if (!done && client_gone(q)) {
            cancel_gone(q);
            return MHD_NO; /* nobody to answer */
        }
    }
    if (q->finish == EPYQ_ENGINE_ERROR) return fail(c, q, 500, "server_error", NULL, NULL, q->errmsg);
    if (q->finish == EPYQ_ENGINE_CANCELLED)
        return fail(c, q, 503, "server_error", NULL, "shutting_down", "the request was cancelled: the server is shutting down");
    char *body = NULL;
    if (epyq_serve_out_finish(&q->out, q->finish, &q->usage, false, NULL, &body, &err) != EPYQ_OK)
        return fail(c, q, 500, "server_error", NULL, NULL, err.msg);
    enum MHD_Result r = send_json(c, q, 200, body);
    free(body);
    return r;
}

/* ---- the other endpoints ---------------------------------------------------------------- */

/* GET /v1/models (the list) or /v1/models/{id} (one model object). */
static enum MHD_Result models(struct MHD_Connection *c, sreq *q, const char *url) {
    char *b = NULL;
    const char *id = url[strlen("/v1/models")] == '/' ? url + strlen("/v1/models/") : NULL;
    if (id && strcmp(id, q->s->cfg.model_name) != 0) {
        char m[400];
        snprintf(m, sizeof m, "the model '%.200s' does not exist; this server serves '%.127s'", id, q->s->cfg.model_name);
        return fail(c, q, 404, "invalid_request_error", "model", "model_not_found", m);
    }
    cJSON *m = cJSON_CreateObject(), *r = m;
    cJSON_AddStringToObject(m, "id", q->s->cfg.model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)(long long)q->s->t_start);
    cJSON_AddStringToObject(m, "owned_by", "epyq");
    cJSON_AddNumberToObject(m, "max_model_len", q->s->cfg.ctx_limit);
    if (!id) {
        r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "object", "list");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "data"), m);
    }
    b = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    enum MHD_Result ret = send_json(c, q, 200, b ? b : "{}");
    free(b);
    return ret;
}

static enum MHD_Result metrics(struct MHD_Connection *c, sreq *q) {
    epyq_server *s = q->s;
    epyq_runner_stats rs;
    epyq_runner_get_stats(s->runner, &rs);
    epyq_sbuf b = {0};
    epyq_sbuf_printf(&b, "# HELP epyq_requests_total HTTP requests answered, by endpoint and status.\n# TYPE epyq_requests_total counter\n");
    for (int e = 0; e < EP_N; e++)
        for (size_t i = 0; i < N_STATUS; i++) {
            uint64_t v = __atomic_load_n(&s->req_count[e][i], __ATOMIC_RELAXED);
            if (v) epyq_sbuf_printf(&b, "epyq_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", ep_names[e], status_codes[i], (unsigned long long)v);
        }
    epyq_sbuf_printf(
        &b,
        "# HELP epyq_requests_cancelled_total Requests cancelled because the client went away.\n"
        "# TYPE epyq_requests_cancelled_total counter\nepyq_requests_cancelled_total %llu\n"
        "# HELP epyq_prompt_tokens_total Prompt tokens run through the model.\n"
        "# TYPE epyq_prompt_tokens_total counter\nepyq_prompt_tokens_total %llu\n"
        "# HELP epyq_generation_tokens_total Tokens sampled.\n"
        "# TYPE epyq_generation_tokens_total counter\nepyq_generation_tokens_total %llu\n"
        "# HELP epyq_queue_depth Requests waiting for a sequence slot.\n"
        "# TYPE epyq_queue_depth gauge\nepyq_queue_depth %d\n"
        "# HELP epyq_requests_running Requests holding a sequence (prefilling or decoding).\n"
        "# TYPE epyq_requests_running gauge\nepyq_requests_running %d\n"
        "# HELP epyq_streams_open SSE responses being sent.\n"
        "# TYPE epyq_streams_open gauge\nepyq_streams_open %llu\n"
        "# HELP epyq_prompt_tokens_per_second Prompt tokens per second of forward time.\n"
        "# TYPE epyq_prompt_tokens_per_second gauge\nepyq_prompt_tokens_per_second %.3f\n"
        "# HELP epyq_decode_tokens_per_second Generated tokens per second of forward time.\n"
        "# TYPE epyq_decode_tokens_per_second gauge\nepyq_decode_tokens_per_second %.3f\n"
        "# HELP epyq_kv_bytes_in_use Bytes of KV cache and recurrent state the running sequences hold.\n"
        "# TYPE epyq_kv_bytes_in_use gauge\nepyq_kv_bytes_in_use %llu\n"
        "# HELP epyq_forward_steps_total Batched forward calls.\n"
        "# TYPE epyq_forward_steps_total counter\nepyq_forward_steps_total %llu\n"
        "# HELP epyq_forward_seconds_total Seconds inside the batched forward calls.\n"
        "# TYPE epyq_forward_seconds_total counter\nepyq_forward_seconds_total %.6f\n"
        "# HELP epyq_engine_busy_seconds_total Engine-thread seconds admitting, cancelling, stepping (forward included).\n"
        "# TYPE epyq_engine_busy_seconds_total counter\nepyq_engine_busy_seconds_total %.6f\n"
        "# HELP epyq_prompt_cached_tokens_total Prompt tokens restored from the prefix cache instead of computed.\n"
        "# TYPE epyq_prompt_cached_tokens_total counter\nepyq_prompt_cached_tokens_total %llu\n"
        "# HELP epyq_prefix_cache_bytes Bytes the prefix cache holds (its budget is --cache-mb).\n"
        "# TYPE epyq_prefix_cache_bytes gauge\nepyq_prefix_cache_bytes %llu\n"
        "# HELP epyq_prefix_cache_entries Prompt-state copies the prefix cache holds.\n"
        "# TYPE epyq_prefix_cache_entries gauge\nepyq_prefix_cache_entries %llu\n"
        "# HELP epyq_prefix_cache_evictions_total Copies dropped to stay within --cache-mb.\n"
        "# TYPE epyq_prefix_cache_evictions_total counter\nepyq_prefix_cache_evictions_total %llu\n",
        (unsigned long long)__atomic_load_n(&s->cancelled, __ATOMIC_RELAXED),
        (unsigned long long)rs.eng.prompt_tokens, (unsigned long long)rs.eng.gen_tokens, rs.queued,
        rs.running, (unsigned long long)__atomic_load_n(&s->streams_open, __ATOMIC_RELAXED),
        rs.eng.prompt_s > 0 ? (double)rs.eng.prompt_tokens / rs.eng.prompt_s : 0.0,
        rs.eng.decode_s > 0 ? (double)rs.eng.gen_tokens / rs.eng.decode_s : 0.0,
        (unsigned long long)rs.eng.kv_bytes, (unsigned long long)rs.eng.steps,
        rs.eng.prompt_s + rs.eng.decode_s, rs.busy_s, (unsigned long long)rs.eng.cached_tokens,
        (unsigned long long)rs.eng.cache_bytes, (unsigned long long)rs.eng.cache_entries,
        (unsigned long long)rs.eng.cache_evicted);
    epyq_sbuf_printf(
        &b,
        "# HELP epyq_spec_steps_total Speculative verify steps of finished requests (--spec mtp).\n"
        "# TYPE epyq_spec_steps_total counter\nepyq_spec_steps_total %llu\n"
        "# HELP epyq_spec_tokens_total Tokens those steps emitted (accepted drafts + 1 each).\n"
        "# TYPE epyq_spec_tokens_total counter\nepyq_spec_tokens_total %llu\n",
        (unsigned long long)rs.eng.spec_steps, (unsigned long long)rs.eng.spec_emitted);
    enum MHD_Result r = b.p ? send_text(c, q, 200, "text/plain; version=0.0.4", b.p, NULL) : MHD_NO;
    epyq_sbuf_free(&b);
    return r;
}

static bool authorised(const epyq_server *s, struct MHD_Connection *c) {
    if (!s->cfg.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    return h && !strncmp(h, "Bearer ", 7) && !strcmp(h + 7, s->cfg.api_key);
}

static int endpoint_of(const char *url) {
    for (int e = 0; e < EP_OTHER; e++)
        if (!strcmp(url, ep_names[e])) return e;
    if (!strcmp(url, "/v1/health")) return EP_HEALTH;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) return EP_MODELS;
    return EP_OTHER;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    epyq_server *s = cls;
    sreq *q = *con_cls;
    (void)version;
    if (!q) { /* headers are in: set up, refuse early what needs no body */
        q = calloc(1, sizeof *q);
        if (!q) return MHD_NO;
        q->s = s, q->refs = 1, q->fd = -1;
        q->t0 = epyq_now();
        pthread_mutex_init(&q->mu, NULL);
        pthread_cond_init(&q->cv, NULL);
        q->ep = endpoint_of(url);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) q->fd = ci->connect_fd;
        *con_cls = q;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body) q->too_big = true;
        if (!q->too_big) return MHD_YES;
    }
    if (*upload_size) {
        if (!q->too_big && q->body.len + *upload_size > s->cfg.max_body) q->too_big = true;
        if (!q->too_big && !epyq_sbuf_add(&q->body, upload, *upload_size)) return MHD_NO;
        *upload_size = 0;
        if (!q->too_big) return MHD_YES;
    }
    if (q->too_big) {
        char m[128];
        snprintf(m, sizeof m, "the request body is larger than this server's limit of %zu bytes (--max-body)", s->cfg.max_body);
        return fail(c, q, 413, "invalid_request_error", NULL, "request_too_large", m);
    }
    bool post = !strcmp(method, "POST"), get = !strcmp(method, "GET");
    if (q->ep == EP_OTHER)
        return fail(c, q, 404, "invalid_request_error", NULL, "not_found", "no such endpoint");
    if ((q->ep <= EP_CMPL && !post) || (q->ep > EP_CMPL && !get)) {
        char m[96];
        snprintf(m, sizeof m, "%s takes %s", ep_names[q->ep], q->ep <= EP_CMPL ? "POST" : "GET");
        return fail(c, q, 405, "invalid_request_error", NULL, "method_not_allowed", m);
    }
    if (q->ep == EP_HEALTH) {
        bool stop = __atomic_load_n(&s->stopping, __ATOMIC_RELAXED);
        return send_json(c, q, stop ? 503 : 200, stop ? "{\"status\":\"shutting_down\"}" : "{\"status\":\"ok\"}");
    }
    if (q->ep == EP_METRICS) return metrics(c, q);
    if (!authorised(s, c))
        return fail(c, q, 401, "authentication_error", NULL, "invalid_api_key", "a valid API key is required: Authorization: Bearer <key>");
    if (q->ep == EP_MODELS) return models(c, q, url);
    return generate(c, q);
}

/* Called when libmicrohttpd is done with a request, however it ended. */
static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    epyq_server *s = cls;
    sreq *q = *con_cls;
    (void)c;
    if (!q) return;
    *con_cls = NULL;
    if (q->ep <= EP_CMPL && s->cfg.log_requests) { /* one access-log line per generation request */
        pthread_mutex_lock(&q->mu);
        bool fin = q->done;
        epyq_engine_usage u = q->usage;
        const char *fr = fin ? epyq_engine_finish_name(q->finish) : q->submitted ? "client_gone" : "none";
        pthread_mutex_unlock(&q->mu);
        fprintf(
            stderr,
            "{\"event\":\"request\",\"endpoint\":\"%s\",\"status\":%d,\"stream\":%s,\"prompt_tokens\":%d,"
            "\"cached_tokens\":%d,\"completion_tokens\":%d,\"finish\":\"%s\",\"completed\":%s,\"ms\":%.1f}\n",
            ep_names[q->ep], q->status, q->req.stream ? "true" : "false", u.n_prompt, u.n_cached,
            u.n_gen, fr, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "true" : "false",
            1e3 * (epyq_now() - q->t0));
    }
    if (q->submitted) {
        pthread_mutex_lock(&q->mu);
        bool unfinished = !q->done;
        pthread_mutex_unlock(&q->mu);
        if (unfinished) cancel_gone(q);
        else if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
            epyq_runner_cancel(s->runner, q->ticket);
        __atomic_sub_fetch(&s->inflight, 1, __ATOMIC_RELAXED);
    }
    sreq_unref(q);
}

/* libmicrohttpd's own messages (a client that went away mid-body, ...) as JSON lines like ours. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char m[512];
    vsnprintf(m, sizeof m, fmt, ap);
    size_t n = strlen(m);
    while (n && (m[n - 1] == '\n' || m[n - 1] == '\r')) m[--n] = '\0';
    cJSON *j = cJSON_CreateString(m);
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    fprintf(stderr, "{\"event\":\"http\",\"message\":%s}\n", s ? s : "\"\"");
    free(s);
    cJSON_Delete(j);
}

epyq_status epyq_server_start(epyq_server **out, const epyq_serve_cfg *cfg, epyq_runner *runner,
                              const epyq_tok *tok, const epyq_chat *chat, const epyq_config *mcfg,
                              epyq_err *err) {
    *out = NULL;
    struct addrinfo hints = {.ai_flags = AI_NUMERICSERV | AI_PASSIVE, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai != 0) return epyq_err_set(err, EPYQ_E_ARG, "--host %s: not an address this machine can bind: %s", cfg->host, gai_strerror(gai));
    epyq_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(ai);
        return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    }
    s->cfg = *cfg, s->runner = runner, s->tok = tok, s->chat = chat, s->mcfg = mcfg;
    s->t_start = (double)time(NULL);
    pthread_mutex_init(&s->chat_mu, NULL);
    pthread_mutex_init(&s->vision_mu, NULL);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, handler, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_conn, MHD_OPTION_CONNECTION_TIMEOUT, 300u,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        int e = errno;
        pthread_mutex_destroy(&s->chat_mu);
        pthread_mutex_destroy(&s->vision_mu);
        free(s);
        return epyq_err_set(err, EPYQ_E_IO, "cannot listen on %s:%d: %s", cfg->host, cfg->port, strerror(e));
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    *out = s;
    return EPYQ_OK;
}

int epyq_server_port(const epyq_server *s) { return s->port; }

void epyq_server_stop_admitting(epyq_server *s) { __atomic_store_n(&s->stopping, 1, __ATOMIC_RELAXED); }

bool epyq_server_wait_sent(epyq_server *s, double seconds) {
    for (double t = 0; __atomic_load_n(&s->inflight, __ATOMIC_RELAXED) > 0; t += 0.01) {
        if (t >= seconds) return false;
        nanosleep(&(struct timespec){0, 10000000L}, NULL);
    }
    return true;
}

void epyq_server_free(epyq_server *s) {
    if (!s) return;
    MHD_stop_daemon(s->d);
    pthread_mutex_destroy(&s->chat_mu);
    pthread_mutex_destroy(&s->vision_mu);
    free(s);
}
