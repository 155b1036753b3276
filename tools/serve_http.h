/* tools/serve_http.h — the HTTP side of `epyq serve` (libmicrohttpd): routes, request bodies,
 * authentication, responses and SSE streams, metrics.
 *
 * Promise: every connection has its own thread (libmicrohttpd's thread-per-connection mode),
 * so a connection waiting for tokens blocks only itself; the model runs on the runner's one
 * engine thread (src/engine/runner.h) and hands tokens over under a per-request lock. Every
 * request gets an answer: 200, or an OpenAI-style error object with 400 (bad JSON, wrong
 * types, fields we cannot honour, prompts past the context), 401 (API key), 404, 405, 413
 * (body over max_body), 429 + Retry-After (queue full), 500 (the forward call failed) or 503
 * (shutting down). A client that goes away — detected by polling its socket while it waits, and
 * by libmicrohttpd's completion callback — has its request cancelled and its sequence freed. */
#ifndef EPYQ_TOOLS_SERVE_HTTP_H
#define EPYQ_TOOLS_SERVE_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat/chat.h"
#include "core/status.h"
#include "engine/runner.h"
#include "load/model_config.h"
#include "tok/tokenizer.h"
#include "vision/vision.h"

typedef struct {
    const char *host;          /* address to bind (default 127.0.0.1) */
    int port;                  /* 0 = any free port (see epyq_server_port) */
    const char *api_key;       /* NULL = no authentication */
    const char *model_name;    /* what /v1/models lists and requests must name (if they name one) */
    size_t max_body;           /* request body limit in bytes */
    int32_t ctx_limit;         /* prompt + completion tokens per request */
    int32_t max_conn;          /* simultaneous connections */
    bool log_requests;         /* one JSON line on stderr per generation request */
    epyq_vision *vision;       /* the tower for image_url parts; NULL: they get a 400 */
    const char *no_vision;     /* with vision NULL: why (the 400's message) */
    const char *media_dir;     /* --allowed-media-dir: local image paths under it; NULL = none */
} epyq_serve_cfg;

typedef struct epyq_server epyq_server;

/* Starts listening. All pointers are borrowed and must outlive the server; chat may be NULL
 * (chat completions are then refused). */
epyq_status epyq_server_start(epyq_server **out, const epyq_serve_cfg *cfg, epyq_runner *runner,
                              const epyq_tok *tok, const epyq_chat *chat, const epyq_config *mcfg,
                              epyq_err *err);
int epyq_server_port(const epyq_server *s);
/* New generation requests get 503 from now on (SIGTERM); in-flight ones go on. */
void epyq_server_stop_admitting(epyq_server *s);
/* After the runner drained: wait up to `seconds` until every answer has been sent (the last
 * chunks of a stream leave after its request finished in the engine). False on timeout. */
bool epyq_server_wait_sent(epyq_server *s, double seconds);
/* Stops the daemon (every connection thread ends) and frees. Drain the runner first. */
void epyq_server_free(epyq_server *s);

#endif
