/* tools/cmd_serve.c — `epyq serve`: an OpenAI-compatible HTTP server on the same
 * continuous-batching engine as `epyq batch`.
 *
 * One engine thread (src/engine/runner.h) owns the model and decodes up to --parallel
 * sequences per forward call; HTTP connections (tools/serve_http.c) hand requests over through
 * a bounded queue (--max-queue, then 429). SIGTERM/SIGINT: stop admitting (503), let in-flight
 * requests finish for --grace seconds, cancel what is left, close every connection, exit 0.
 * Signals are blocked in every thread and taken by sigwait() in the main one, so no handler
 * runs inside libmicrohttpd or the model. */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat.h"
#include "core/util.h"
#include "engine/engine.h"
#include "engine/runner.h"
#include "model/model.h"
#include "numa/plan.h"
#include "tok/tokenizer.h"
#include "tools/cmd.h"
#include "tools/media.h"
#include "tools/serve_http.h"
#include "tools/tool_model.h"

typedef struct {
    const char *dir, *synthetic, *host, *api_key, *name, *media_dir;
    int port, ctx, threads, parallel, max_queue, chunk, max_conn;
    int cache_mb, cache_every; /* prefix reuse (engine.h: cache_bytes) */
    long max_body;
    double grace;
    bool quiet;
    bool ctx_set; /* -c given: above the model's context it is refused, not capped */
    epyq_numpath path;
    epyq_tool_rt rt; /* --kv-type, --numa..., --requant, EPYQ_NUMA* (shared with run/chat/batch) */
    epyq_tool_spec spec; /* --spec, --draft, --draft-head */
} opts;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: epyq serve (-m DIR | --synthetic SPEC) [options]\n"
        "\n"
        "OpenAI-compatible server: POST /v1/chat/completions, POST /v1/completions (both with\n"
        "\"stream\": true as server-sent events), GET /v1/models, GET /health, GET /metrics\n"
        "(Prometheus). Requests are decoded together on one continuous-batching engine.\n"
        "\n"
        "  -m, --model DIR          checkpoint folder (with tokenizer files)\n"
        "  --synthetic SPEC         generated model, e.g. tiny:ct\n"
        "  --host ADDR              address to bind (default 127.0.0.1)\n"
        "  --port N                 port (default 8080; 0 = any free port, printed at start)\n"
        "  -c, --ctx-size N         per-request context, prompt + completion (default 4096)\n"
        "  -t, --threads N          model threads (default: all allowed CPUs)\n"
        "  --parallel N             sequences decoded together (default 4)\n"
        "  --max-queue N            requests waiting for a sequence before 429 (default 64)\n"
        "  --chunk N                prompt tokens per forward call (default 512)\n"
        "  --cache-mb N             prompt prefix cache: state copies kept, MB (default 1024, 0 = off)\n"
        "  --cache-every N          copy the prompt state every N tokens and at its end (default 256)\n"
        "  --api-key KEY            require Authorization: Bearer KEY on /v1/*\n"
        "  --served-model-name NAME the model's name in the API (default: the folder name)\n"
        "  --path a16|a8|a8all      int4 kernels' numeric path: a8 (default) int8 activations in\n"
        "                           the routed experts, a16 none, a8all in every int4 linear\n"
        "                           (faster prompts, looser numerics: README)\n"
        "%s%s"
        "                           (per request: k + 1 rows of the shared forward call)\n"
        "  --max-body BYTES         request body limit (default 8388608), else 413\n"
        "  --max-conn N             simultaneous connections (default 256)\n"
        "  --grace SECONDS          on SIGTERM, time in-flight requests get to finish (default 30)\n"
        "  --no-log-requests        no JSON line on stderr per generation request\n"
        "  --allowed-media-dir DIR  image_url parts may name local files under DIR (realpath)\n"
        "  -h, --help               this text\n"
        "\n"
        "Exit status: 0 after SIGTERM/SIGINT (in-flight requests finished or cancelled), 1 fatal\n"
        "error, 2 usage error.\n",
        epyq_tool_rt_help, epyq_tool_spec_help);
}

static int parse(int argc, char **argv, opts *o) {
    enum {
        O_SYN = 256,
        O_HOST,
        O_PORT,
        O_PAR,
        O_QUEUE,
        O_CHUNK,
        O_KEY,
        O_NAME,
        O_PATH,
        O_BODY,
        O_CONN,
        O_GRACE,
        O_QUIET,
        O_CACHE_MB,
        O_CACHE_EVERY,
        O_MEDIA
    };
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"synthetic", required_argument, 0, O_SYN},
                                       {"host", required_argument, 0, O_HOST},
                                       {"port", required_argument, 0, O_PORT},
                                       {"ctx-size", required_argument, 0, 'c'},
                                       {"threads", required_argument, 0, 't'},
                                       {"parallel", required_argument, 0, O_PAR},
                                       {"max-queue", required_argument, 0, O_QUEUE},
                                       {"chunk", required_argument, 0, O_CHUNK},
                                       {"api-key", required_argument, 0, O_KEY},
                                       {"served-model-name", required_argument, 0, O_NAME},
                                       {"path", required_argument, 0, O_PATH},
                                       {"max-body", required_argument, 0, O_BODY},
                                       {"max-conn", required_argument, 0, O_CONN},
                                       {"grace", required_argument, 0, O_GRACE},
                                       {"no-log-requests", no_argument, 0, O_QUIET},
                                       {"cache-mb", required_argument, 0, O_CACHE_MB},
                                       {"cache-every", required_argument, 0, O_CACHE_EVERY},
                                       {"allowed-media-dir", required_argument, 0, O_MEDIA},
                                       {"help", no_argument, 0, 'h'},
                                       EPYQ_TOOL_RT_LONGOPTS,
                                       EPYQ_TOOL_SPEC_LONGOPTS,
                                       {0, 0, 0, 0}};
    o->host = "127.0.0.1", o->port = 8080, o->ctx = 4096, o->parallel = 4, o->max_queue = 64, o->chunk = 512;
    o->max_body = 8 << 20, o->max_conn = 256, o->grace = 30, o->path = EPYQ_PATH_A8;
    o->cache_mb = 1024, o->cache_every = 256;
    if (epyq_tool_rt_init(&o->rt, "epyq serve")) return 2;
    epyq_tool_spec_init(&o->spec);
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:c:t:h", lo, NULL)) != -1) {
        long v;
        switch (c) {
        case 'm': o->dir = optarg; break;
        case O_SYN: o->synthetic = optarg; break;
        case O_HOST: o->host = optarg; break;
        case O_KEY: o->api_key = optarg; break;
        case O_QUIET: o->quiet = true; break;
        case O_NAME: o->name = optarg; break;
        case O_PORT:
            if (epyq_tool_opt_long("epyq serve", optarg, 0, 65535, &v)) return 2;
            o->port = (int)v;
            break;
        case 'c': case 't': case O_PAR: case O_QUEUE: case O_CHUNK: case O_CONN:
            if (epyq_tool_opt_long("epyq serve", optarg, c == 't' || c == O_QUEUE ? 0 : 1, 1 << 24, &v)) return 2;
            *(c == 'c' ? &o->ctx : c == 't' ? &o->threads : c == O_PAR ? &o->parallel : c == O_QUEUE ? &o->max_queue
              : c == O_CHUNK ? &o->chunk : &o->max_conn) = (int)v;
            if (c == 'c') o->ctx_set = true;
            break;
        case O_CACHE_MB:
        case O_CACHE_EVERY:
            if (epyq_tool_opt_long("epyq serve", optarg, c == O_CACHE_MB ? 0 : 1, 1 << 24, &v))
                return 2;
            *(c == O_CACHE_MB ? &o->cache_mb : &o->cache_every) = (int)v;
            break;
        case O_BODY:
            if (epyq_tool_opt_long("epyq serve", optarg, 64, 1L << 30, &v)) return 2;
            o->max_body = v;
            break;
        case O_GRACE:
            if (epyq_tool_opt_long("epyq serve", optarg, 0, 86400, &v)) return 2;
            o->grace = (double)v;
            break;
        case O_PATH:
            if (epyq_tool_opt_path("epyq serve", optarg, &o->path)) return 2;
            break;
        case O_MEDIA: o->media_dir = optarg; break;
        case 'h': usage(stdout); return 0;
        default: {
            int r = epyq_tool_rt_opt(&o->rt, "epyq serve", c, optarg);
            if (r == 1) r = epyq_tool_spec_opt(&o->spec, "epyq serve", c, optarg);
            if (r == 0) break;
            if (r == 2) return 2;
            fprintf(stderr, "epyq serve: bad option (try --help)\n");
            return 2;
        }
        }
    }
    if (optind < argc) return fprintf(stderr, "epyq serve: unexpected argument '%s'\n", argv[optind]), 2;
    if (!o->dir == !o->synthetic) return fprintf(stderr, "epyq serve: give exactly one of -m DIR or --synthetic SPEC\n"), 2;
    if (o->ctx < 2) return fprintf(stderr, "epyq serve: -c: expected at least 2, got %d\n", o->ctx), 2;
    return -1;
}

int epyq_cmd_serve(int argc, char **argv) {
    opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    /* Before any thread exists: every thread inherits the mask, sigwait() below takes them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client that vanished is an error return, not a death */

    epyq_err err = {0};
    char *dir = NULL, name[128];
    epyq_tok *tok = NULL;
    epyq_chat *chat = NULL;
    epyq_model *m = NULL;
    epyq_engine *eng = NULL;
    epyq_runner *run = NULL;
    epyq_server *srv = NULL;
    epyq_status st = epyq_kern_init(&err);
    if (st == EPYQ_OK) st = epyq_tool_model_dir(o.dir, o.synthetic, &dir, &err);
    if (st == EPYQ_OK) st = epyq_tok_load(&tok, dir, &err);
    if (st == EPYQ_OK) {
        epyq_err e2;
        if (epyq_chat_load(&chat, dir, &e2) != EPYQ_OK) chat = NULL; /* chat requests will say so */
    }
    /* the context from config.json before the weights load: an explicit -c the model cannot
     * hold is refused with both numbers, the default is capped */
    int32_t ctx = 0;
    if (st == EPYQ_OK) st = epyq_tool_ctx_dir(dir, o.ctx, o.ctx_set, &ctx, &err);
    epyq_model_opts mo = {.path = o.path,
                          .n_threads = o.threads,
                          .skip_mtp = !o.spec.on,
                          .draft_head = o.spec.on ? o.spec.draft_head : EPYQ_REQUANT_NONE,
                          .draft_vocab = o.spec.on ? o.spec.draft_vocab : 0,
                          .numa = epyq_tool_rt_numa(&o.rt, o.threads),
                          .requant_lm_head = o.rt.rq_lm_head,
                          .requant_dense = o.rt.rq_dense};
    if (st == EPYQ_OK) st = epyq_tool_model_load(&m, dir, &mo, &err);
    if (st == EPYQ_OK) {
        epyq_tool_ctx_report(m, ctx, o.parallel, o.rt.kv);
        const epyq_engine_opts eo = {.max_seqs = o.parallel,
                                     .chunk = o.chunk,
                                     .ctx_limit = ctx,
                                     .kv = o.rt.kv,
                                     .cache_bytes = (uint64_t)o.cache_mb << 20,
                                     .cache_every = o.cache_every,
                                     .spec_k = o.spec.on ? o.spec.draft : 0,
                                     .spec_adaptive = true};
        st = epyq_engine_create(&eng, m, tok, &eo, &err);
    }
    if (st == EPYQ_OK) st = epyq_runner_create(&run, eng, o.max_queue, &err);
    epyq_vision *vis = NULL;
    char no_vis[EPYQ_ERR_MSG_MAX + 64] = "";
    if (st == EPYQ_OK) st = epyq_media_tower(dir, o.threads, &vis, no_vis, sizeof no_vis, &err);
    if (st == EPYQ_OK) {
        if (o.name) {
            snprintf(name, sizeof name, "%s", o.name);
        } else { /* the folder's own name, as vLLM names a model by its path */
            size_t n = strlen(dir);
            while (n > 1 && dir[n - 1] == '/') n--;
            size_t b = n;
            while (b > 0 && dir[b - 1] != '/') b--;
            snprintf(name, sizeof name, "%.*s", (int)(n - b), dir + b);
        }
        const epyq_serve_cfg sc = {.host = o.host,
                                   .port = o.port,
                                   .api_key = o.api_key,
                                   .model_name = name,
                                   .max_body = (size_t)o.max_body,
                                   .ctx_limit = ctx,
                                   .max_conn = o.max_conn,
                                   .log_requests = !o.quiet,
                                   .vision = vis,
                                   .no_vision = no_vis,
                                   .media_dir = o.media_dir};
        st = epyq_server_start(&srv, &sc, run, tok, chat, epyq_model_config(m), &err);
    }
    if (st == EPYQ_OK) {
        fprintf(stderr, "{\"event\":\"listening\",\"host\":\"%s\",\"port\":%d,\"model\":\"%s\",\"parallel\":%d,\"ctx\":%d}\n",
                o.host, epyq_server_port(srv), name, o.parallel, ctx);
        int sig = 0;
        sigwait(&sigs, &sig);
        double t0 = epyq_now();
        fprintf(stderr, "{\"event\":\"stopping\",\"signal\":\"%s\",\"grace_s\":%g}\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", o.grace);
        epyq_server_stop_admitting(srv);
        int32_t n_cancel = epyq_runner_drain(run, o.grace);
        epyq_server_wait_sent(srv, 5.0); /* bounded: a client that stopped reading cannot hold us */
        epyq_server_free(srv); /* every connection thread ends; streams have sent their last bytes */
        srv = NULL;
        fprintf(stderr, "{\"event\":\"stopped\",\"cancelled\":%d,\"seconds\":%.3f}\n", n_cancel, epyq_now() - t0);
    }
    epyq_server_free(srv);
    epyq_runner_free(run);
    epyq_vision_free(vis);
    epyq_engine_free(eng);
    epyq_chat_free(chat);
    epyq_tok_free(tok);
    epyq_model_free(m);
    free(dir);
    if (st != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        return 1;
    }
    return 0;
}
