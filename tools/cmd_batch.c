/* tools/cmd_batch.c — `epyq batch`: an OpenAI-style JSONL batch job with continuous batching.
 *
 * Up to --max-batch requests run together on the shared continuous-batching engine
 * (src/engine/engine.h): every forward call carries the next prompt chunk of the requests still
 * prefilling and one decode token of every other running request, so new requests are
 * admitted as soon as others finish. Results are written in input order as soon as
 * a contiguous prefix is done, one complete line per write, then fsync'd — a killed job loses no
 * finished result that was written. --resume reads the output, drops a partial last line, skips
 * every custom_id already there and appends; since a request's tokens depend only on its own
 * prompt, parameters and seed (the runtime's per-token results do not depend on the batch), the
 * resumed file equals the uninterrupted one. Records carry no timing fields for that reason.
 * A malformed or invalid line gets an error record (custom_id, or line:N) and the job goes on.
 * Exit status: 0 all succeeded, 2 some line failed, 130 SIGINT, 143 SIGTERM, 1 fatal. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "chat/chat.h"
#include "chat/reasoning.h"
#include "core/util.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/sample.h"
#include "tok/sbuf.h"
#include "tok/tokenizer.h"
#include "tools/batch_mpi.h"
#include "tools/batch_req.h"
#include "tools/cmd.h"
#include "tools/ep_mpi.h"
#include "tools/gen.h"
#include "tools/media.h"
#include "tools/tool_model.h"

static volatile sig_atomic_t g_stop; /* signal number that asked us to stop */
static void on_signal(int sig) { g_stop = sig; }

typedef struct {
    const char *dir, *synthetic, *in, *out, *media_dir;
    int max_batch, ctx, threads, chunk;
    int cache_mb, cache_every; /* prefix reuse (engine.h: cache_bytes) */
    bool resume, ctx_set, ep;
    epyq_numpath path;
    epyq_tool_rt rt; /* --kv-type, --numa... (tools/tool_model.h) */
    epyq_tool_spec spec; /* --spec, --draft, --draft-head */
} opts;

/* JOB_REMOTE: another MPI rank runs it (tools/batch_mpi.h); the lead waits for its record */
typedef enum { JOB_PENDING = 0, JOB_RUNNING, JOB_DONE, JOB_SKIPPED, JOB_REMOTE } job_state;

typedef struct batch batch;

typedef struct {
    batch *b;
    epyq_batch_req req;
    int64_t line_no;
    uint64_t weight; /* MPI share: estimated rows of forward calls (prompt + generated) */
    int owner;       /* MPI rank that runs it */
    job_state state;
    bool failed;
    char *record;           /* finished output line without '\n' */
    char *prompt_text;      /* what the model saw (chat: rendered template) */
    size_t n_ids;           /* prompt tokens */
    int32_t n_gen, n_cached;
    const char *finish;
    epyq_sbuf text;         /* generated text */
} job;

struct batch {
    const opts *o;
    epyq_model *m;
    epyq_engine *eng;
    epyq_tok *tok;
    epyq_chat *chat;        /* NULL if the checkpoint has no template */
    const char *dir;        /* the checkpoint folder */
    epyq_vision *vision;    /* loaded at the first image request (tools/media.h); NULL: none */
    bool vision_tried;
    char no_vision[EPYQ_ERR_MSG_MAX + 64]; /* why image parts are refused */
    epyq_batch_mpi *mp;                    /* NULL: one process */
    epyq_ep *ep;                           /* --ep: one model over the ranks; NULL: none */
    const epyq_config *cfg;
    char model_name[128];
    char lead_model[128]; /* MPI worker: the lead's model_name ("" with --synthetic) */
    int32_t ctx_limit;
    job *jobs;
    size_t n_jobs, next_admit, next_write;
    int out_fd;
    size_t n_failed, n_done, n_todo;
    bool oom;               /* a record could not be built: fatal after the step */
    double t0, last_progress;
};

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: epyq batch (-m DIR | --synthetic SPEC) -i in.jsonl -o out.jsonl [options]\n"
        "\n"
        "Input lines: {\"custom_id\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\" |\n"
        "\"/v1/completions\", \"body\": {messages | prompt, max_tokens, temperature, top_p, top_k,\n"
        "min_p, presence_penalty, repetition_penalty, seed, chat_template_kwargs}} or {\"prompt\": ...}.\n"
        "Output lines (input order): {\"id\", \"custom_id\", \"response\": {\"status_code\", \"request_id\",\n"
        "\"body\"}, \"error\"}. Bad lines get an error record and the job goes on.\n"
        "\n"
        "  -m, --model DIR       checkpoint folder (with tokenizer files)\n"
        "  --synthetic SPEC      generated model, e.g. tiny:ct\n"
        "  -i, --input FILE      requests, one JSON object per line\n"
        "  -o, --output FILE     results (appended with --resume)\n"
        "  --max-batch N         requests decoded together (default 8)\n"
        "  -c, --ctx-size N      per-request context limit (default 4096, at most the model's)\n"
        "  --chunk N             prompt tokens per forward call over all requests (default 512)\n"
        "  --cache-mb N          prompt prefix cache: state copies kept, MB (default 1024, 0 = off)\n"
        "  --cache-every N       copy the prompt state every N tokens and at its end (default 256)\n"
        "  --resume              skip custom_ids already in the output, append the rest\n"
        "  --allowed-media-dir DIR  image_url parts may name local files under DIR (realpath)\n"
        "  -t, --threads N       threads (default: all allowed CPUs)\n"
        "  --path a16|a8|a8all   int4 kernels' numeric path: a8 (default) int8 activations in\n"
        "                        the routed experts, a16 none, a8all in every int4 linear\n"
        "                        (faster prompts, looser numerics: README)\n"
        "%s%s"
        "                        (each request on its own: k + 1 rows of the shared forward call)\n"
        "  -h, --help            this text\n"
        "\n"
        "Exit status: 0 all requests succeeded, 2 some failed, 130/143 interrupted (finished\n"
        "results are on disk; rerun with --resume), 1 fatal error.\n"
        "\n"
        "Under mpirun or srun (an epyq built with MPI) the job runs over the ranks, each with its\n"
        "own model copy; rank 0 reads the input and writes the output (README: batch over MPI).\n"
        "With --ep the ranks run the whole job as one model instead, each holding 1/N of the\n"
        "routed experts (README: --ep).\n",
        epyq_tool_rt_help, epyq_tool_spec_help);
}

static int parse(int argc, char **argv, opts *o) {
    enum {
        OPT_SYN = 256,
        OPT_MAXB,
        OPT_RESUME,
        OPT_PATH,
        OPT_CHUNK,
        OPT_CACHE_MB,
        OPT_CACHE_EVERY,
        OPT_MEDIA,
        OPT_EP
    };
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"allowed-media-dir", required_argument, 0, OPT_MEDIA},
                                       {"synthetic", required_argument, 0, OPT_SYN},
                                       {"input", required_argument, 0, 'i'},
                                       {"output", required_argument, 0, 'o'},
                                       {"max-batch", required_argument, 0, OPT_MAXB},
                                       {"ctx-size", required_argument, 0, 'c'},
                                       {"chunk", required_argument, 0, OPT_CHUNK},
                                       {"resume", no_argument, 0, OPT_RESUME},
                                       {"threads", required_argument, 0, 't'},
                                       {"path", required_argument, 0, OPT_PATH},
                                       {"cache-mb", required_argument, 0, OPT_CACHE_MB},
                                       {"cache-every", required_argument, 0, OPT_CACHE_EVERY},
                                       {"help", no_argument, 0, 'h'},
                                       {"ep", no_argument, 0, OPT_EP},
                                       EPYQ_TOOL_RT_LONGOPTS,
                                       EPYQ_TOOL_SPEC_LONGOPTS,
                                       {0, 0, 0, 0}};
    o->max_batch = 8;
    o->path = EPYQ_PATH_A8; /* the runtime default: see epyq_model_opts.path */
    o->ctx = 4096;
    o->chunk = 512;
    o->cache_mb = 1024, o->cache_every = 256;
    int c;
    optind = 1;
    if (epyq_tool_rt_init(&o->rt, "epyq batch")) return 2;
    epyq_tool_spec_init(&o->spec);
    while ((c = getopt_long(argc, argv, "m:i:o:c:t:h", lo, NULL)) != -1) {
        int rt = epyq_tool_rt_opt(&o->rt, "epyq batch", c, optarg);
        if (rt == 1) rt = epyq_tool_spec_opt(&o->spec, "epyq batch", c, optarg);
        if (rt != 1) {
            if (rt) return rt;
            continue;
        }
        o->ctx_set |= c == 'c';
        switch (c) {
        case 'm': o->dir = optarg; break;
        case OPT_SYN: o->synthetic = optarg; break;
        case 'i': o->in = optarg; break;
        case 'o': o->out = optarg; break;
        case OPT_RESUME: o->resume = true; break;
        case OPT_EP: o->ep = true; break;
        case OPT_MEDIA: o->media_dir = optarg; break;
        case OPT_MAXB: case 'c': case 't': case OPT_CHUNK: {
            long v;
            if (epyq_tool_opt_long("epyq batch", optarg, c == 't' ? 0 : 1, 1 << 24, &v)) return 2;
            *(c == OPT_MAXB ? &o->max_batch : c == 'c' ? &o->ctx : c == 't' ? &o->threads : &o->chunk) = (int)v;
            break;
        }
        case OPT_CACHE_MB:
        case OPT_CACHE_EVERY: {
            long v;
            if (epyq_tool_opt_long("epyq batch", optarg, c == OPT_CACHE_MB ? 0 : 1, 1 << 24, &v))
                return 2;
            *(c == OPT_CACHE_MB ? &o->cache_mb : &o->cache_every) = (int)v;
            break;
        }
        case OPT_PATH:
            if (epyq_tool_opt_path("epyq batch", optarg, &o->path)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: fprintf(stderr, "epyq batch: bad option (try --help)\n"); return 2;
        }
    }
    if (optind < argc) return fprintf(stderr, "epyq batch: unexpected argument '%s'\n", argv[optind]), 2;
    if (!o->dir == !o->synthetic) return fprintf(stderr, "epyq batch: give exactly one of -m DIR or --synthetic SPEC\n"), 2;
    if (!o->in || !o->out) return fprintf(stderr, "epyq batch: -i FILE and -o FILE are required\n"), 2;
    if (o->ep && o->rt.use_numa)
        return fprintf(
                   stderr,
                   "epyq batch: --ep runs without NUMA placement: drop --numa* (and EPYQ_NUMA*)\n"),
               2;
    return -1;
}

/* ---- output records -------------------------------------------------------------------- */

static char *record_ok(const batch *b, const job *j) {
    cJSON *r = cJSON_CreateObject(), *resp = cJSON_CreateObject(), *body = cJSON_CreateObject();
    cJSON *choices = cJSON_CreateArray(), *ch = cJSON_CreateObject(), *usage = cJSON_CreateObject();
    char buf[64];
    snprintf(buf, sizeof buf, "batch_req_%lld", (long long)j->line_no);
    cJSON_AddStringToObject(r, "id", buf);
    cJSON_AddStringToObject(r, "custom_id", j->req.custom_id);
    cJSON_AddNumberToObject(resp, "status_code", 200);
    snprintf(buf, sizeof buf, "req_%lld", (long long)j->line_no);
    cJSON_AddStringToObject(resp, "request_id", buf);
    snprintf(buf, sizeof buf, "%s-%lld", j->req.chat ? "chatcmpl" : "cmpl", (long long)j->line_no);
    cJSON_AddStringToObject(body, "id", buf);
    cJSON_AddStringToObject(body, "object", j->req.chat ? "chat.completion" : "text_completion");
    cJSON_AddStringToObject(body, "model", b->model_name);
    cJSON_AddNumberToObject(ch, "index", 0);
    const char *text = j->text.p ? j->text.p : "";
    if (j->req.chat) {
        /* split reasoning from the answer as vLLM's qwen3 parser does */
        epyq_reasoning *rp = epyq_reasoning_new(epyq_chat_prompt_opens_think(j->prompt_text, strlen(j->prompt_text)));
        epyq_sbuf rs = {0}, cs = {0};
        epyq_err err;
        cJSON *msg = cJSON_CreateObject();
        cJSON_AddStringToObject(msg, "role", "assistant");
        if (rp && epyq_reasoning_push(rp, text, strlen(text), &rs, &cs, &err) == EPYQ_OK &&
            epyq_reasoning_finish(rp, &rs, &cs, &err) == EPYQ_OK) {
            cJSON_AddStringToObject(msg, "content", cs.p ? cs.p : "");
            if (rs.len) cJSON_AddStringToObject(msg, "reasoning_content", rs.p);
        } else {
            cJSON_AddStringToObject(msg, "content", text);
        }
        epyq_sbuf_free(&rs), epyq_sbuf_free(&cs);
        epyq_reasoning_free(rp);
        cJSON_AddItemToObject(ch, "message", msg);
    } else {
        cJSON_AddStringToObject(ch, "text", text);
    }
    cJSON_AddStringToObject(ch, "finish_reason", j->finish);
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddItemToObject(body, "choices", choices);
    cJSON_AddNumberToObject(usage, "prompt_tokens", (double)j->n_ids);
    cJSON_AddNumberToObject(usage, "completion_tokens", j->n_gen);
    cJSON_AddNumberToObject(usage, "total_tokens", (double)j->n_ids + j->n_gen);
    cJSON *ptd = cJSON_CreateObject();
    cJSON_AddNumberToObject(ptd, "cached_tokens", j->n_cached);
    cJSON_AddItemToObject(usage, "prompt_tokens_details", ptd);
    cJSON_AddItemToObject(body, "usage", usage);
    cJSON_AddItemToObject(resp, "body", body);
    cJSON_AddItemToObject(r, "response", resp);
    cJSON_AddNullToObject(r, "error");
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}

/* Write every finished record of the contiguous prefix, then fsync once. An MPI worker sends
 * its own records to the lead instead, in the same order. */
static epyq_status flush_prefix(batch *b, epyq_err *err) {
    bool wrote = false, worker = epyq_batch_mpi_rank(b->mp) != 0;
    const bool follower = b->ep && b->ep->rank != 0; /* --ep: rank 0 has the same records */
    while (b->next_write < b->n_jobs) {
        job *j = &b->jobs[b->next_write];
        if (follower && j->state == JOB_DONE) {
            free(j->record);
            j->record = NULL;
            b->next_write++;
            continue;
        }
        if (j->state == JOB_SKIPPED || (worker && j->state == JOB_REMOTE)) {
            b->next_write++;
            continue;
        }
        if (j->state != JOB_DONE) break;
        if (!j->record) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory building a record");
        size_t n = strlen(j->record);
        if (worker) {
            TRY(epyq_batch_mpi_send_record(b->mp, b->next_write, j->failed, j->record, n, err));
            free(j->record);
            j->record = NULL;
            b->next_write++;
            continue;
        }
        j->record[n] = '\n'; /* cJSON allocated n + 1 bytes: reuse the terminator slot */
        const char *p = j->record;
        size_t left = n + 1;
        while (left) {
            ssize_t w = write(b->out_fd, p, left);
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) return epyq_err_set(err, EPYQ_E_IO, "%s: write failed: %s", b->o->out, strerror(errno));
            p += w, left -= (size_t)w;
        }
        free(j->record);
        j->record = NULL;
        b->next_write++;
        wrote = true;
    }
    if (wrote && fsync(b->out_fd) != 0)
        return epyq_err_set(err, EPYQ_E_IO, "%s: fsync failed: %s", b->o->out, strerror(errno));
    return EPYQ_OK;
}

/* ---- the job table --------------------------------------------------------------------- */

static void job_finish_error(batch *b, job *j, const char *code, const char *msg) {
    j->record = epyq_batch_record_error(j->line_no, j->req.custom_id, code, msg);
    j->state = JOB_DONE;
    j->failed = true;
    b->n_failed++;
    b->n_done++;
}

static void on_event(void *ctx, const epyq_engine_event *ev) {
    job *j = ctx;
    if (ev->len && !epyq_sbuf_add(&j->text, ev->text, ev->len)) j->b->oom = true;
}

static void on_done(void *ctx, epyq_engine_finish f, const epyq_engine_usage *u, const epyq_err *err) {
    job *j = ctx;
    batch *b = j->b;
    (void)err; /* a failed step is fatal to the job: epyq_engine_step returns the error */
    j->n_gen = u->n_gen, j->n_cached = u->n_cached;
    j->finish = epyq_engine_finish_name(f);
    j->record = record_ok(b, j);
    j->state = JOB_DONE;
    b->n_done++;
    epyq_sbuf_free(&j->text);
}

/* Render, tokenise, size the context and hand the request to the engine; an invalid request
 * finishes here with its error record. Returns a fatal status only for out-of-memory. */
static epyq_status job_admit(batch *b, job *j, epyq_err *err) {
    j->b = b;
    if (j->req.err_code[0]) {
        job_finish_error(b, j, j->req.err_code, j->req.err_msg);
        return EPYQ_OK;
    }
    epyq_err e = {0};
    epyq_status st;
    size_t len;
    epyq_media md = {0};
    if (j->req.chat) {
        if (!b->chat) {
            job_finish_error(b, j, "invalid_request", "this checkpoint has no chat template: use /v1/completions");
            return EPYQ_OK;
        }
        if ((st = epyq_media_collect(&md, j->req.messages, b->o->media_dir, &e)) == EPYQ_OK &&
            md.n_img && !b->vision_tried) { /* the tower, once, when the first image arrives */
            b->vision_tried = true;
            st = epyq_media_tower(b->dir, b->o->threads, &b->vision, b->no_vision,
                                  sizeof b->no_vision, err);
            if (st != EPYQ_OK) return epyq_media_free(&md), st;
        }
        if (st == EPYQ_OK && md.n_img && !b->vision)
            st = epyq_err_set(&e, EPYQ_E_ARG, "'%s': %s", md.first, b->no_vision);
        bool bad_img = st != EPYQ_OK;
        if (st == EPYQ_E_NOMEM) {
            epyq_media_free(&md);
            return epyq_err_set(err, st, "%s", e.msg);
        }
        if (st == EPYQ_OK)
            st = epyq_chat_render(b->chat, md.messages ? md.messages : j->req.messages,
                                  j->req.kwargs, &j->prompt_text, &len, &e);
        if (st != EPYQ_OK) {
            job_finish_error(b, j, bad_img ? "invalid_image" : "invalid_request", e.msg);
            epyq_media_free(&md);
            return EPYQ_OK;
        }
    } else {
        j->prompt_text = strdup(j->req.prompt);
        if (!j->prompt_text) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    }
    int32_t *ids = NULL;
    epyq_vision_prompt vp = {0};
    epyq_engine_img ei = {0};
    st = epyq_tok_encode(b->tok, j->prompt_text, strlen(j->prompt_text), &ids, &j->n_ids, &e);
    if (st == EPYQ_OK && md.n_img)
        st = epyq_media_prompt(b->vision, &md, &ids, &j->n_ids, &vp, &ei, &e);
    epyq_media_free(&md);
    if (st != EPYQ_OK || j->n_ids == 0) {
        free(ids);
        job_finish_error(b, j, "invalid_request", st != EPYQ_OK ? e.msg : "the prompt is empty");
        return EPYQ_OK;
    }
    if (j->n_ids >= (size_t)b->ctx_limit) {
        char m[160];
        snprintf(m, sizeof m, "the prompt has %zu tokens; the context limit is %d (-c), leaving no room to generate",
                 j->n_ids, b->ctx_limit);
        free(ids), epyq_vision_prompt_free(&vp);
        job_finish_error(b, j, "context_length_exceeded", m);
        return EPYQ_OK;
    }
    epyq_engine_params p = {.max_tokens = j->req.max_tokens, .logprobs = -1};
    const epyq_sample_overrides so = {j->req.temperature, j->req.top_p, j->req.min_p, j->req.repetition_penalty,
                                      j->req.presence_penalty, j->req.top_k, j->req.seed};
    epyq_sample_overrides_apply(&so, b->cfg, &p.sp);
    const epyq_engine_cb cb = {on_event, on_done, j};
    j->state = JOB_RUNNING;
    st = epyq_engine_add_img(b->eng, ids, j->n_ids, vp.n ? &ei : NULL, &p, &cb, NULL, err);
    free(ids), epyq_vision_prompt_free(&vp); /* the engine has its copy */
    return st;
}

static void progress(batch *b, bool final) {
    if (b->ep && b->ep->rank != 0) return; /* --ep: rank 0's line covers the job */
    double now = epyq_now();
    bool tty = isatty(2);
    if (!final && now - b->last_progress < (tty ? 0.5 : 10.0)) return;
    b->last_progress = now;
    epyq_engine_stats es;
    epyq_engine_get_stats(b->eng, &es);
    epyq_batch_mpi_stats ms = {es.gen_tokens, es.prompt_tokens, es.cached_tokens};
    if (epyq_batch_mpi_rank(b->mp)) { /* a worker: the lead prints the whole job's line */
        epyq_batch_mpi_send_progress(b->mp, &ms);
        return;
    }
    epyq_batch_mpi_remote_stats(b->mp, &ms);
    es.gen_tokens += ms.gen_tokens, es.prompt_tokens += ms.prompt_tokens,
        es.cached_tokens += ms.cached_tokens;
    double el = now - b->t0, rate = el > 0 ? (double)es.gen_tokens / el : 0;
    double eta = b->n_done ? el * (double)(b->n_todo - b->n_done) / (double)b->n_done : 0;
    fprintf(stderr, "%sbatch: %zu/%zu done, %zu failed, %.1f tokens/s, elapsed %.0fs, ETA %.0fs%s",
            tty ? "\r" : "", b->n_done, b->n_todo, b->n_failed, rate, el, eta, tty && !final ? "   " : "\n");
    if (final && b->mp)
        fprintf(stderr, "batch: %d ranks (prefix cache and spec figures below are rank 0's)\n",
                epyq_batch_mpi_size(b->mp));
    if (final && b->ep && b->ep->size > 1)
        fprintf(stderr, "batch: --ep, one model over %d ranks\n", b->ep->size);
    if (final)
        fprintf(
            stderr,
            "batch: prompt tokens computed %llu, cached %llu; prefix cache %llu entries, %.1f of %.0f MB, %llu evicted\n",
            (unsigned long long)es.prompt_tokens, (unsigned long long)es.cached_tokens,
            (unsigned long long)es.cache_entries, (double)es.cache_bytes / 1048576.0,
            (double)es.cache_budget / 1048576.0, (unsigned long long)es.cache_evicted);
    if (final && b->o->spec.on) {
        fprintf(
            stderr,
            "batch: spec mtp:%d: %llu verify steps, %.2f tokens/step, %llu plain steps; accepted by position:",
            b->o->spec.draft, (unsigned long long)es.spec_steps,
            es.spec_steps ? (double)es.spec_emitted / (double)es.spec_steps : 0.0,
            (unsigned long long)es.spec_plain);
        for (int i = 0; i < b->o->spec.draft; i++)
            fprintf(stderr, " %.2f",
                    es.spec_steps ? (double)es.spec_accepted[i] / (double)es.spec_steps : 0.0);
        fputc('\n', stderr);
    }
}

/* Rank 0's status and bytes to every rank: the data-parallel ranks' or --ep's. */
static epyq_status share(batch *b, epyq_status st, char **data, size_t *len, epyq_err *err) {
    return b->ep ? epyq_tool_ep_share(b->ep, st, data, len, err)
                 : epyq_batch_mpi_share(b->mp, st, data, len, err);
}
static int rank_of(const batch *b) { return b->ep ? b->ep->rank : epyq_batch_mpi_rank(b->mp); }

/* Read and parse every input line; mark duplicates and already-finished ones. */
static epyq_status load_jobs(batch *b, cJSON *done_ids, epyq_err *err) {
    char *data = NULL;
    size_t len = 0;
    /* MPI: the lead reads the file, every rank parses the same bytes */
    epyq_status st =
        rank_of(b) ? EPYQ_OK : epyq_file_read(b->o->in, (size_t)1 << 34, &data, &len, err);
    st = share(b, st, &data, &len, err);
    epyq_batch_mpi_start(b->mp); /* the last shared step: from here a worker's failure is its own */
    if (st != EPYQ_OK) return st;
    size_t cap = 64;
    b->jobs = calloc(cap, sizeof *b->jobs);
    cJSON *seen = cJSON_CreateObject();
    int64_t line = 0;
    for (char *p = data; st == EPYQ_OK && p < data + len;) {
        char *end = memchr(p, '\n', (size_t)(data + len - p));
        if (!end) end = data + len;
        *end = '\0';
        line++;
        char *q = p;
        p = end + 1;
        while (*q == ' ' || *q == '\t' || *q == '\r') q++;
        if (!*q) continue; /* blank lines are not requests */
        if (b->n_jobs == cap) {
            job *nj = realloc(b->jobs, 2 * cap * sizeof *nj);
            if (!nj) { st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory"); break; }
            memset(nj + cap, 0, cap * sizeof *nj);
            b->jobs = nj, cap *= 2;
        }
        job *j = &b->jobs[b->n_jobs++];
        j->line_no = line;
        epyq_batch_req_parse(&j->req, q, line);
        if (!j->req.custom_id) { st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory"); break; }
        /* about 4 bytes a token, then one row per generated token */
        j->weight =
            j->req.err_code[0] ? 1 : (uint64_t)(end - q) / 4 + 1 + (uint64_t)j->req.max_tokens;
        if (cJSON_GetObjectItemCaseSensitive(seen, j->req.custom_id)) {
            if (!j->req.err_code[0]) {
                snprintf(j->req.err_code, sizeof j->req.err_code, "duplicate_custom_id");
                snprintf(j->req.err_msg, sizeof j->req.err_msg, "custom_id '%.180s' appears earlier in the input", j->req.custom_id);
            }
        } else {
            cJSON_AddTrueToObject(seen, j->req.custom_id);
        }
        /* Records are skipped by occurrence: a duplicated custom_id was written once per line. */
        cJSON *d = cJSON_GetObjectItemCaseSensitive(done_ids, j->req.custom_id);
        if (d && d->valuedouble >= 1) {
            j->state = JOB_SKIPPED;
            cJSON_SetNumberValue(d, d->valuedouble - 1);
        }
    }
    cJSON_Delete(seen);
    free(data);
    return st;
}

/* ---- MPI ranks (tools/batch_mpi.h) -------------------------------------------------------- */

/* The records' "model": the checkpoint folder's name. */
static void model_name_of(const char *dir, char *out, size_t n) {
    const char *base = strrchr(dir, '/');
    snprintf(out, n, "%s", base && base[1] ? base + 1 : dir);
}

/* The lead's --resume findings, as JSON, and its model folder's name (ranks on other hosts may
 * load the model from folders of other names; the records name the lead's) to every rank. */
static epyq_status share_done_ids(batch *b, epyq_status st, cJSON **done_ids, epyq_err *err) {
    const bool lead = rank_of(b) == 0;
    char *s = NULL;
    size_t n = 0;
    if (lead && b->o->dir) model_name_of(b->o->dir, b->model_name, sizeof b->model_name);
    if (lead) s = b->model_name, n = strlen(s);
    st = share(b, st, &s, &n, err);
    if (st == EPYQ_OK && !lead) {
        snprintf(b->lead_model, sizeof b->lead_model, "%s", s);
        free(s);
    }
    s = NULL, n = 0;
    if (lead && st == EPYQ_OK) {
        s = cJSON_PrintUnformatted(*done_ids);
        if (!s) st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
        else
            n = strlen(s);
    }
    st = share(b, st, &s, &n, err);
    if (st == EPYQ_OK && !lead) {
        cJSON_Delete(*done_ids);
        *done_ids = cJSON_Parse(s);
        if (!*done_ids)
            st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory parsing the lead's --resume list");
    }
    free(s);
    return st;
}

/* Every rank computes the same owners from the same job table; another rank's jobs are
 * JOB_REMOTE here. Prompt length and max_tokens are known before tokenizing, so no rank renders
 * a template that is not its own. */
static epyq_status assign_jobs(batch *b, epyq_err *err) {
    uint64_t *w = malloc((b->n_jobs ? b->n_jobs : 1) * sizeof *w);
    int *own = malloc((b->n_jobs ? b->n_jobs : 1) * sizeof *own);
    epyq_status st = w && own ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    for (size_t i = 0; st == EPYQ_OK && i < b->n_jobs; i++)
        w[i] = b->jobs[i].state == JOB_PENDING ? b->jobs[i].weight : 0;
    if (st == EPYQ_OK)
        st = epyq_batch_mpi_assign(w, b->n_jobs, epyq_batch_mpi_size(b->mp), own, err);
    for (size_t i = 0; st == EPYQ_OK && i < b->n_jobs; i++) {
        b->jobs[i].owner = own[i];
        if (b->jobs[i].state == JOB_PENDING && own[i] != epyq_batch_mpi_rank(b->mp))
            b->jobs[i].state = JOB_REMOTE;
    }
    free(w), free(own);
    return st;
}

static bool on_remote_record(void *ctx, size_t idx, bool failed, char *record) {
    batch *b = ctx;
    if (idx >= b->n_jobs || b->jobs[idx].state != JOB_REMOTE) return false;
    job *j = &b->jobs[idx];
    j->record = record, j->state = JOB_DONE, j->failed = failed;
    b->n_done++, b->n_failed += failed;
    return true;
}

/* The lead, its own work done (or stopped): take the workers' records until each has sent its
 * FIN, writing the prefix as it grows. A signal or the lead's own failure stops them first. */
static epyq_status wait_workers(batch *b, epyq_status st, epyq_err *err) {
    if (!epyq_batch_mpi_started(b->mp)) return st;
    epyq_err e2 = {0};
    while (epyq_batch_mpi_running(b->mp) > 0) {
        if (st != EPYQ_OK || g_stop) epyq_batch_mpi_stop_all(b->mp);
        epyq_status ps =
            epyq_batch_mpi_poll(b->mp, 0.2, on_remote_record, b, st == EPYQ_OK ? err : &e2);
        if (ps != EPYQ_OK) return st == EPYQ_OK ? ps : st;
        if (st == EPYQ_OK && b->out_fd >= 0) st = flush_prefix(b, err);
        if (b->eng) progress(b, false);
    }
    return st;
}

/* The lead names every worker that failed and how many of its requests are left; returns the
 * number of such workers. */
static int report_workers(const batch *b) {
    int n = 0;
    for (int r = 1; r < epyq_batch_mpi_size(b->mp); r++) {
        const char *why;
        int s = epyq_batch_mpi_worker_status(b->mp, r, &why);
        if (s != 1 && s != -1) continue;
        size_t left = 0;
        for (size_t i = 0; i < b->n_jobs; i++)
            left += b->jobs[i].state == JOB_REMOTE && b->jobs[i].owner == r;
        fprintf(stderr,
                "batch: rank %d %s%s%s; its %zu unfinished requests are left for --resume\n", r,
                s < 0 ? "did not finish" : "failed", *why ? ": " : "", why, left);
        n++;
    }
    return n;
}

/* --ep: the ranks see a signal at different steps; stop at the first step any rank saw one. */
static bool ep_stop(batch *b) {
    if (b->ep) g_stop = epyq_tool_ep_max(b->ep, g_stop);
    return g_stop != 0;
}

/* --ep: a rank that fails mid-job ends the job: the others would wait in its next exchange.
 * Rank 0 has written the finished prefix; --resume continues it. */
static void ep_fail(batch *b, const epyq_err *err) {
    fprintf(stderr, "epyq: rank %d: %s\n", b->ep->rank, err->msg);
    if (b->out_fd >= 0) fsync(b->out_fd);
    epyq_tool_ep_abort(b->ep, 1);
}

int epyq_cmd_batch(int argc, char **argv) {
    opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    epyq_err err = {0};
    batch b = {.o = &o, .out_fd = -1};
    char *dir = NULL;
    cJSON *done_ids = NULL;
    /* --ep: every rank runs the whole job as one model; else a launcher's ranks share it out */
    epyq_status st = o.ep ? epyq_tool_ep_open(&b.ep, &argc, &argv, &err)
                          : epyq_batch_mpi_open(&b.mp, &argc, &argv, &err);
    if (st != EPYQ_OK) return fprintf(stderr, "epyq: %s\n", err.msg), 1;
    const bool lead = rank_of(&b) == 0;
    st = epyq_kern_init(&err);
    /* a worker's own failure before the shared steps: they still run (the lead waits in them),
     * the FIN reports it */
    epyq_status st_own = lead ? EPYQ_OK : st;
    epyq_err err_own = err;
    if (!lead) st = EPYQ_OK;
    if (!lead) { /* only the lead touches the output; it shares what --resume found */
    } else if (st == EPYQ_OK && !o.resume) {
        struct stat sb;
        if (stat(o.out, &sb) == 0 && sb.st_size > 0)
            st = epyq_err_set(&err, EPYQ_E_ARG, "%s exists and is not empty: use --resume to continue it, or remove it", o.out);
    }
    if (st == EPYQ_OK && lead)
        st = o.resume ? epyq_batch_done_ids(o.out, &done_ids, &err) : EPYQ_OK;
    if (st == EPYQ_OK && !done_ids) done_ids = cJSON_CreateObject();
    /* --ep: rank 0 finds (or generates) the model before the others look for it */
    if (st == EPYQ_OK && b.ep && lead) st = epyq_tool_model_dir(o.dir, o.synthetic, &dir, &err);
    if (b.mp || b.ep) st = share_done_ids(&b, st, &done_ids, &err);
    const bool lead_failed = st != EPYQ_OK; /* rank 0's error, which only rank 0 prints */
    if (st == EPYQ_OK) st = load_jobs(&b, done_ids, &err);
    if (st == EPYQ_OK && b.mp) st = assign_jobs(&b, &err);
    if (st == EPYQ_OK && st_own != EPYQ_OK) st = st_own, err = err_own;
    if (st == EPYQ_OK && !dir) st = epyq_tool_model_dir(o.dir, o.synthetic, &dir, &err);
    if (st == EPYQ_OK) st = epyq_tok_load(&b.tok, dir, &err);
    b.dir = dir;
    if (st == EPYQ_OK) {
        epyq_err e2;
        if (epyq_chat_load(&b.chat, dir, &e2) != EPYQ_OK) b.chat = NULL; /* chat lines will say so */
    }
    if (st == EPYQ_OK) st = epyq_tool_ctx_dir(dir, o.ctx, o.ctx_set, &b.ctx_limit, &err);
    epyq_model_opts mo = {.path = o.path,
                          .n_threads = o.threads,
                          .skip_mtp = !o.spec.on,
                          .draft_head = o.spec.on ? o.spec.draft_head : EPYQ_REQUANT_NONE,
                          .draft_vocab = o.spec.on ? o.spec.draft_vocab : 0,
                          .numa = epyq_tool_rt_numa(&o.rt, o.threads),
                          .requant_lm_head = o.rt.rq_lm_head,
                          .requant_dense = o.rt.rq_dense,
                          .ep = b.ep};
    if (st == EPYQ_OK) st = epyq_tool_model_load(&b.m, dir, &mo, &err);
    if (st == EPYQ_OK) {
        b.cfg = epyq_model_config(b.m);
        model_name_of(b.lead_model[0] ? b.lead_model : dir, b.model_name, sizeof b.model_name);
        if (lead)
            epyq_tool_ctx_report(b.m, b.ctx_limit, o.max_batch, o.rt.kv); /* the most it holds */
        const epyq_engine_opts eo = {.max_seqs = o.max_batch,
                                     .chunk = o.chunk,
                                     .ctx_limit = b.ctx_limit,
                                     .kv = o.rt.kv,
                                     .cache_bytes = (uint64_t)o.cache_mb << 20,
                                     .cache_every = o.cache_every,
                                     .spec_k = o.spec.on ? o.spec.draft : 0,
                                     .spec_adaptive = true,
                                     .spec_clock = b.ep ? epyq_tool_ep_clock : NULL,
                                     .spec_clock_ctx = b.ep};
        st = epyq_engine_create(&b.eng, b.m, b.tok, &eo, &err);
    }
    if (st == EPYQ_OK && lead) {
        b.out_fd = open(o.out, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (b.out_fd < 0) st = epyq_err_set(&err, EPYQ_E_IO, "%s: cannot open for writing: %s", o.out, strerror(errno));
    }
    /* --ep: start together or not at all; from here a failing rank ends the job (ep_fail) */
    if (b.ep && !epyq_tool_ep_agree(b.ep, st == EPYQ_OK) && st == EPYQ_OK)
        st = epyq_err_set(&err, EPYQ_E_IO,
                          "--ep: another rank failed to start (its error is above)");
    if (b.ep && st == EPYQ_OK) st = epyq_tool_ep_check(b.ep, o.path, &err);
    if (st == EPYQ_OK) {
        for (size_t i = 0; i < b.n_jobs; i++) b.n_todo += b.jobs[i].state != JOB_SKIPPED;
        struct sigaction sa = {0};
        sa.sa_handler = on_signal;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        b.t0 = epyq_now();
        while (st == EPYQ_OK && !ep_stop(&b) && !epyq_batch_mpi_stop_asked(b.mp)) {
            while (st == EPYQ_OK && epyq_engine_free_slots(b.eng) > 0 && b.next_admit < b.n_jobs) {
                job *j = &b.jobs[b.next_admit++];
                if (j->state == JOB_PENDING) st = job_admit(&b, j, &err);
            }
            if (st == EPYQ_OK) st = epyq_engine_step(b.eng, &err);
            if (st == EPYQ_OK && b.oom) st = epyq_err_set(&err, EPYQ_E_NOMEM, "out of memory");
            if (st == EPYQ_OK) st = epyq_batch_mpi_poll(b.mp, 0, on_remote_record, &b, &err);
            if (st == EPYQ_OK) st = flush_prefix(&b, &err);
            progress(&b, false);
            if (st != EPYQ_OK && b.ep && b.ep->size > 1) ep_fail(&b, &err);
            if (!epyq_engine_active(b.eng) && b.next_admit >= b.n_jobs) break;
        }
    }
    if (b.ep && st == EPYQ_OK) { /* collective, and before the last write, which may fail alone */
        epyq_engine_stats es;
        epyq_engine_get_stats(b.eng, &es);
        epyq_tool_ep_report(b.ep, "batch", (int)es.gen_tokens, es.decode_s);
    }
    if (b.mp && lead) st = wait_workers(&b, st, &err);
    if (b.eng) {
        if (st == EPYQ_OK) st = flush_prefix(&b, &err); /* interrupted: the finished prefix only */
        progress(&b, true);
    }
    if (!lead && b.ep) { /* --ep: rank 0's status; only its own failures are this rank's to say */
        rc = st != EPYQ_OK ? 1 : g_stop == SIGTERM ? 143 : g_stop ? 130 : b.n_failed ? 2 : 0;
        if (st != EPYQ_OK && !lead_failed)
            fprintf(stderr, "epyq: rank %d: %s\n", b.ep->rank, err.msg);
    } else if (!lead) { /* a worker's status and error line go to the lead, which reports them */
        epyq_engine_stats es = {0};
        if (b.eng) epyq_engine_get_stats(b.eng, &es);
        const epyq_batch_mpi_stats ms = {es.gen_tokens, es.prompt_tokens, es.cached_tokens};
        rc = st != EPYQ_OK ? 1 : g_stop == SIGTERM ? 143 : g_stop ? 130 : 0;
        epyq_err fe = {0};
        if (epyq_batch_mpi_started(b.mp) &&
            epyq_batch_mpi_finish(b.mp, rc, &err, &ms, &fe) != EPYQ_OK)
            fprintf(stderr, "epyq: rank %d: %s\n", epyq_batch_mpi_rank(b.mp), fe.msg);
    }
    int n_lost = lead ? report_workers(&b) : 0;
    if (b.out_fd >= 0) close(b.out_fd);
    epyq_engine_free(b.eng);
    for (size_t i = 0; i < b.n_jobs; i++) {
        epyq_batch_req_free(&b.jobs[i].req);
        free(b.jobs[i].record), free(b.jobs[i].prompt_text);
        epyq_sbuf_free(&b.jobs[i].text);
    }
    free(b.jobs);
    cJSON_Delete(done_ids);
    epyq_chat_free(b.chat);
    epyq_vision_free(b.vision);
    epyq_tok_free(b.tok);
    epyq_model_free(b.m);
    free(dir);
    if (lead && st != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        rc = 1;
    } else if (lead && (n_lost || g_stop)) {
        fprintf(stderr, "batch: %s%zu results are on disk, rerun with --resume to finish\n",
                g_stop ? "interrupted; " : "", b.next_write);
        rc = n_lost ? 1 : g_stop == SIGTERM ? 143 : 130;
    } else if (lead) {
        rc = b.n_failed ? 2 : 0;
    }
    /* last: MPI_Finalize waits for every rank, and mpirun may kill a rank that waits there
     * after a signal, so everything is said and written before it */
    epyq_batch_mpi_close(b.mp);
    epyq_tool_ep_close(b.ep);
    return rc;
}
