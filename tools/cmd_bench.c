/* tools/cmd_bench.c — `epyq bench`: llama-bench style throughput table.
 *
 * Tests (each repeated -r times after one untimed warm-up; t/s reported as mean ± sd):
 *   ppN     one sequence, N prompt tokens in one forward call (prefill);
 *   tgN     one sequence, N single-token decode steps from an empty context;
 *   tgN bB  B sequences decoding together, N steps of B tokens (batch decode throughput).
 * Every timed repetition is followed by a one-pass read-bandwidth probe with the same thread
 * count, and every row says how many GB/s of weights it streamed and what fraction of the
 * probes' mean read it reached (the figure measured once at start stands in where a probe
 * cannot allocate):
 *   every test: the weight bytes its forward calls streamed (epyq_model_last_bytes: every
 *   projection, router and shared expert, each routed expert a step's tokens chose once, the
 *   lm_head) over the run's time. tg (B = 1) reads the top-k experts of each token; tg bB the
 *   distinct experts of each step's B tokens (up to B x top-k); a 512-token prefill touches
 *   essentially every expert once.
 * Token ids are synthetic and deterministic; tokenisation and sampling are excluded
 * (greedy argmax feeds the next decode step, as a real generation would). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "kernels-x86/membw.h"
#include "model/model.h"
#include "model/sample.h"
#include "model/spec.h"
#include "tools/bench_progress.h"
#include "tools/cmd.h"
#include "tools/ep_mpi.h"
#include "tools/tool_model.h"

#define MAX_LIST 16

typedef enum { OUT_MD, OUT_CSV, OUT_JSON, OUT_JSONL } out_fmt;

typedef struct {
    const char *dir, *synthetic;
    int pp[MAX_LIST], n_pp, tg[MAX_LIST], n_tg, thr[MAX_LIST], n_thr, bat[MAX_LIST], n_bat;
    int reps;
    int ubatch; /* -u: prompt tokens per forward call in ppN tests (0: the whole prompt in one) */
    int depth;  /* -d: context tokens each sequence holds before a test's timed tokens */
    bool warmup;
    out_fmt out;
    epyq_numpath paths[3]; /* [n_paths] numeric paths, switched on the loaded model */
    int n_paths;
    epyq_tool_rt rt; /* --kv-type, --numa, --numa-split, --requant (tools/tool_model.h) */
    struct { int k; bool forced, fixed; } spec[MAX_LIST]; /* --spec: k = 0 none, else mtp:k[:forced|:fixed] */
    int n_spec;
    double accept[EPYQ_SPEC_MAX];  /* --accept: per-position acceptance for projections */
    int n_accept;
    epyq_requant draft_head;       /* --draft-head */
    int32_t draft_vocab;           /* --draft-vocab (0: the whole vocabulary) */
    size_t membw_bytes;
    bool profile;       /* --profile: the timed runs' forward time by block, on stderr */
    bool ep;            /* --ep */
    const epyq_ep *epc; /* its ranks; NULL without --ep */
} opts;

typedef struct {
    char model[128], format[64], test[48], isa[24], numa[24], path[8], spec[32];
    double size_gib, params_b;
    int threads, batch, n_prompt, n_gen, n_ubatch, n_depth;
    double ts_mean, ts_sd, gbps, pct, bw_read;
    double accept_len; /* tokens per forward of the sequence: 1 without speculation */
} row;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: epyq bench (-m DIR | --synthetic SHAPE[:FORMAT]) [options]\n"
        "\n"
        "llama-bench style throughput: prompt processing (ppN), generation (tgN) and batched\n"
        "decoding (tgN bB), with weight GB/s and the fraction of the read bandwidth measured\n"
        "by a probe with the same threads right after each repetition.\n"
        "\n"
        "  -m, --model DIR          checkpoint folder\n"
        "  --synthetic SPEC         35b-a3b[:ct|gptq|quark|awq|bf16] or tiny[:FORMAT]: generated\n"
        "                           once into $XDG_CACHE_HOME/epyq (default format ct)\n"
        "  -p, --n-prompt LIST      prompt lengths (default 512; 0 = none)\n"
        "  -n, --n-gen LIST         generation lengths (default 128; 0 = none)\n"
        "  -t, --threads LIST       thread counts (default: all allowed CPUs)\n"
        "  -b, --batch LIST         concurrent sequences for the tg tests (default 1)\n"
        "  -u, --ubatch N           ppN feeds the prompt N tokens per forward call, as `run` and\n"
        "                           `serve` feed theirs in chunks and llama-bench in ubatches\n"
        "                           (default 512, its -ub; 0 = the whole prompt in one call)\n"
        "  -d, --depth N            each test starts with N tokens of context already in every\n"
        "                           sequence (prefilled untimed in ubatches; llama-bench's -d):\n"
        "                           ppN @ dN and tgN @ dN time attention over a long cache\n"
        "                           (default 0; not with --spec)\n"
        "  -r, --repetitions N      timed repetitions per test (default 5)\n"
        "  -o, --output FMT         md (default), csv, json or jsonl\n"
        "  --path LIST              int4 kernels' numeric paths: a16, a8, a8all or a list (a16,a8)\n"
        "                           (default a8; switched without reloading the model)\n"
        "  --kv-type bf16|fp8       KV cache storage (default bf16)\n"
        "  --spec LIST              none, mtp:K (MTP drafts, K per step, adaptive as in run),\n"
        "                           mtp:K:fixed (drafting every step) or mtp:K:forced (every\n"
        "                           draft accepted: the cost side, benchmark only); batch-1 tg\n"
        "  --accept LIST            with mtp:K:forced: t/s projected at these per-position\n"
        "                           acceptance rates (e.g. 0.93,0.85)\n"
        "  --draft-head KIND        int4 (default), int8 or bf16: the lm_head copy MTP drafts read\n"
        "  --draft-vocab N          drafts pick among token ids below N (the draft head holds\n"
        "                           those rows only; default: the whole vocabulary)\n"
        "  --requant SPEC           lm_head=int8|int4, dense=int8|int4 (comma-separated):\n"
        "                           16-bit linears requantised at load (default: exact)\n"
        "  --membw-mb N             buffer for the read-bandwidth probe (default 1024)\n"
        "  --no-warmup              skip the untimed warm-up run\n"
        "  --profile                after each test, where its forward calls spent their time\n"
        "                           (ms per call by block, the pool's driver waits) on stderr\n"
        "  --numa MODE              auto|off|distribute|...: routed experts on the NUMA plan's\n"
        "                           node pools (numa/README.md); default: one pool\n"
        "  --numa-split N           the same on N logical nodes of this machine\n"
        "  --ep                     under mpirun/srun: one model over the ranks, each holding\n"
        "                           1/N of the routed experts; rank 0 prints, and a JSON line\n"
        "                           per test with its exchange times (README: --ep)\n"
        "  -h, --help               this text\n"
        "\n"
        "GB/s: the weight bytes the test's forward calls streamed over its time: every\n"
        "projection, router and shared expert, the routed experts each step's tokens chose\n"
        "(counted once per step: up to B x top-k for tg bB), the lm_head.\n");
}

static int parse_list(const char *what, const char *s, int *out, int *n, int lo) {
    *n = epyq_parse_int_list(s, out, MAX_LIST);
    for (int i = 0; i < *n; i++)
        if (out[i] < lo) *n = -1;
    if (*n < 1) {
        fprintf(stderr, "epyq bench: %s: expected a comma-separated list of integers >= %d, got '%s'\n", what, lo, s);
        return 2;
    }
    return -1;
}

static int parse(int argc, char **argv, opts *o) {
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"synthetic", required_argument, 0, 'S'},
                                       {"n-prompt", required_argument, 0, 'p'},
                                       {"n-gen", required_argument, 0, 'n'},
                                       {"threads", required_argument, 0, 't'},
                                       {"batch", required_argument, 0, 'b'},
                                       {"repetitions", required_argument, 0, 'r'},
                                       {"ubatch", required_argument, 0, 'u'},
                                       {"depth", required_argument, 0, 'd'},
                                       {"output", required_argument, 0, 'o'},
                                       {"path", required_argument, 0, 'P'},
                                       {"kv-type", required_argument, 0, EPYQ_TOOL_O_KV},
                                       {"membw-mb", required_argument, 0, 'W'},
                                       {"no-warmup", no_argument, 0, 'N'},
                                       {"profile", no_argument, 0, 'F'},
                                       {"help", no_argument, 0, 'h'},
                                       {"numa", required_argument, 0, EPYQ_TOOL_O_NUMA},
                                       {"numa-split", required_argument, 0, EPYQ_TOOL_O_SPLIT},
                                       {"requant", required_argument, 0, EPYQ_TOOL_O_REQUANT},
                                       {"spec", required_argument, 0, 'X'},
                                       {"accept", required_argument, 0, 'A'},
                                       {"draft-head", required_argument, 0, 'D'},
                                       {"draft-vocab", required_argument, 0, 'V'},
                                       {"ep", no_argument, 0, 'e'},
                                       {0, 0, 0, 0}};
    o->pp[0] = 512, o->n_pp = 1;
    o->tg[0] = 128, o->n_tg = 1;
    o->bat[0] = 1, o->n_bat = 1;
    o->thr[0] = (int)sysconf(_SC_NPROCESSORS_ONLN), o->n_thr = 1;
    o->reps = 5;
    o->ubatch = 512;
    o->paths[0] = EPYQ_PATH_A8, o->n_paths = 1;
    o->warmup = true;
    o->n_spec = 1;
    o->draft_head = EPYQ_REQUANT_INT4;
    o->membw_bytes = (size_t)1024 << 20;
    epyq_tool_rt_defaults(&o->rt);
    int c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:t:b:r:u:d:o:h", lo, NULL)) != -1) {
        int rt = epyq_tool_rt_opt(&o->rt, "epyq bench", c, optarg);
        if (rt != 1) {
            if (rt) return rt;
            continue;
        }
        switch (c) {
        case 'm': o->dir = optarg; break;
        case 'S': o->synthetic = optarg; break;
        case 'p': if ((rc = parse_list("-p", optarg, o->pp, &o->n_pp, 0)) >= 0) return rc; break;
        case 'n': if ((rc = parse_list("-n", optarg, o->tg, &o->n_tg, 0)) >= 0) return rc; break;
        case 't': if ((rc = parse_list("-t", optarg, o->thr, &o->n_thr, 1)) >= 0) return rc; break;
        case 'b': if ((rc = parse_list("-b", optarg, o->bat, &o->n_bat, 1)) >= 0) return rc; break;
        case 'u': {
            long v;
            if (epyq_tool_opt_long("epyq bench", optarg, 0, 1000000, &v)) return 2;
            o->ubatch = (int)v;
            break;
        }
        case 'd': {
            long v;
            if (epyq_tool_opt_long("epyq bench", optarg, 0, 1000000, &v)) return 2;
            o->depth = (int)v;
            break;
        }
        case 'r':
        case 'W': {
            long v;
            if (epyq_tool_opt_long("epyq bench", optarg, 1, 1000000, &v)) return 2;
            if (c == 'r') o->reps = (int)v;
            else o->membw_bytes = (size_t)v << 20;
            break;
        }
        case 'o':
            if (!strcmp(optarg, "md")) o->out = OUT_MD;
            else if (!strcmp(optarg, "csv")) o->out = OUT_CSV;
            else if (!strcmp(optarg, "json")) o->out = OUT_JSON;
            else if (!strcmp(optarg, "jsonl")) o->out = OUT_JSONL;
            else return fprintf(stderr, "epyq bench: -o: expected md|csv|json|jsonl, got '%s'\n", optarg), 2;
            break;
        case 'P':
            o->n_paths = 0;
            for (const char *p = optarg; *p;) {
                size_t l = strcspn(p, ",");
                char name[8] = {0};
                if (o->n_paths == 3)
                    return fprintf(stderr, "epyq bench: --path: at most three paths\n"), 2;
                int pv = l < sizeof name ? (memcpy(name, p, l), epyq_model_path_parse(name)) : -1;
                if (pv < 0)
                    return fprintf(
                               stderr,
                               "epyq bench: --path: expected a list of a16, a8, a8all, got '%s'\n",
                               optarg),
                           2;
                o->paths[o->n_paths++] = (epyq_numpath)pv;
                p += l + (p[l] == ',');
            }
            if (o->n_paths == 0) return fprintf(stderr, "epyq bench: --path: empty list\n"), 2;
            break;
        case 'N': o->warmup = false; break;
        case 'e': o->ep = true; break;
        case 'X':
            o->n_spec = 0;
            for (const char *p = optarg; *p;) {
                size_t l = strcspn(p, ",");
                int k = 0, used = 0;
                char tail[16] = "";
                if (o->n_spec == MAX_LIST) return fprintf(stderr, "epyq bench: --spec: at most %d entries\n", MAX_LIST), 2;
                if (l == 4 && !strncmp(p, "none", 4)) k = 0;
                else if (sscanf(p, "mtp:%d%n", &k, &used) == 1 && k >= 1 && k < EPYQ_SPEC_MAX &&
                         ((size_t)used == l || (l - (size_t)used == 7 && !strncmp(p + used, ":forced", 7)) ||
                          (l - (size_t)used == 6 && !strncmp(p + used, ":fixed", 6))))
                    snprintf(tail, sizeof tail, "%s", (size_t)used == l ? "" : p[used + 2] == 'o' ? "forced" : "fixed");
                else
                    return fprintf(stderr, "epyq bench: --spec: expected none, mtp:K, mtp:K:fixed or mtp:K:forced with K in 1..%d, "
                                   "got '%.*s'\n", EPYQ_SPEC_MAX - 1, (int)l, p), 2;
                o->spec[o->n_spec].k = k, o->spec[o->n_spec].forced = !strcmp(tail, "forced");
                o->spec[o->n_spec].fixed = !strcmp(tail, "fixed");
                o->n_spec++;
                p += l + (p[l] == ',');
            }
            if (!o->n_spec) return fprintf(stderr, "epyq bench: --spec: empty list\n"), 2;
            break;
        case 'A':
            o->n_accept = 0;
            for (const char *p = optarg; *p;) {
                char *end;
                double v = strtod(p, &end);
                if (end == p || v < 0 || v > 1 || (*end && *end != ',') || o->n_accept == EPYQ_SPEC_MAX - 1)
                    return fprintf(stderr, "epyq bench: --accept: expected up to %d rates in [0, 1], got '%s'\n",
                                   EPYQ_SPEC_MAX - 1, optarg), 2;
                o->accept[o->n_accept++] = v;
                p = *end ? end + 1 : end;
            }
            break;
        case 'D': {
            epyq_err e = {0};
            if (epyq_requant_parse_kind(optarg, &o->draft_head, &e) != EPYQ_OK)
                return fprintf(stderr, "epyq bench: --draft-head: %s\n", e.msg), 2;
            break;
        }
        case 'V': {
            long v;
            if (epyq_tool_opt_long("epyq bench", optarg, 1, INT32_MAX, &v)) return 2;
            o->draft_vocab = (int32_t)v;
            break;
        }
        case 'F': o->profile = true; break;
        case 'h': usage(stdout); return 0;
        default: fprintf(stderr, "epyq bench: bad option (try --help)\n"); return 2;
        }
    }
    if (optind < argc) return fprintf(stderr, "epyq bench: unexpected argument '%s'\n", argv[optind]), 2;
    if (!o->dir == !o->synthetic)
        return fprintf(stderr, "epyq bench: give exactly one of -m DIR or --synthetic SHAPE[:FORMAT]\n"), 2;
    if (o->ep && o->rt.use_numa)
        return fprintf(stderr, "epyq bench: --ep runs without NUMA placement: drop --numa*\n"), 2;
    for (int i = 0; o->depth > 0 && i < o->n_spec; i++)
        if (o->spec[i].k > 0)
            return fprintf(
                       stderr,
                       "epyq bench: --depth: applies to pp and plain tg tests; drop --spec mtp:K\n"),
                   2;
    return -1;
}

/* Deterministic token ids away from the special-token region at the top of the vocabulary. */
static int32_t synth_token(uint32_t i, int32_t vocab) {
    uint32_t span = vocab > 2048 ? (uint32_t)vocab - 2048 : (uint32_t)vocab / 2;
    return (int32_t)(((i + 1) * 2654435761u >> 7) % span);
}

typedef struct {
    epyq_model *m;
    const opts *o;
    int32_t V;
    epyq_seq **seqs;     /* [max batch] */
    int32_t *tok;        /* [max(pp, batch)] */
    epyq_seq **bseq;     /* [max(pp, batch)] */
    float *logits;       /* [max batch][V] */
    epyq_bench_progress *pg; /* the terminal's progress line */
    double bytes;        /* weight bytes the last run's forward calls streamed */
} bench_ctx;

/* -d: sequence s gets c->o->depth tokens of context (untimed, -u tokens per call, no logits);
 * the distinct ids keep its tokens apart from the timed ones. */
static epyq_status fill_depth(bench_ctx *c, epyq_seq *s, epyq_err *err) {
    const int d = c->o->depth, ub = c->o->ubatch > 0 && c->o->ubatch < d ? c->o->ubatch : d;
    epyq_status st = EPYQ_OK;
    epyq_model_prof_pause(c->m, true); /* --profile covers the timed tokens only */
    for (int i = 0; st == EPYQ_OK && i < d; i += ub) {
        const int len = d - i < ub ? d - i : ub;
        int32_t *tok = malloc((size_t)len * sizeof *tok);
        epyq_seq **seq = malloc((size_t)len * sizeof *seq);
        if (!tok || !seq) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
        } else {
            for (int k = 0; k < len; k++)
                tok[k] = synth_token((uint32_t)(500000 + i + k), c->V), seq[k] = s;
            epyq_batch b = {len, seq, tok, NULL};
            st = epyq_model_forward(c->m, &b, NULL, NULL, err);
        }
        free(tok), free(seq);
    }
    epyq_model_prof_pause(c->m, false);
    return st;
}

/* One timed prefill of n tokens, -u tokens per forward call (logits of the last token only);
 * returns seconds or < 0 with err set. */
static double run_pp(bench_ctx *c, int n, epyq_err *err) {
    epyq_seq *s = c->seqs[0];
    epyq_seq_reset(s);
    if (fill_depth(c, s, err) != EPYQ_OK) return -1;
    for (int i = 0; i < n; i++) c->tok[i] = synth_token((uint32_t)i, c->V), c->bseq[i] = s;
    uint8_t *want = calloc((size_t)n, 1);
    if (!want) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory"), -1;
    want[n - 1] = 1;
    const int ub = c->o->ubatch > 0 && c->o->ubatch < n ? c->o->ubatch : n;
    epyq_status st = EPYQ_OK;
    c->bytes = 0;
    double t0 = epyq_now();
    for (int i = 0; st == EPYQ_OK && i < n; i += ub) {
        int len = n - i < ub ? n - i : ub;
        epyq_batch b = {len, c->bseq + i, c->tok + i, want + i};
        st = epyq_model_forward(c->m, &b, c->logits, NULL, err);
        c->bytes += (double)epyq_model_last_bytes(c->m);
    }
    double dt = epyq_now() - t0;
    free(want);
    return st == EPYQ_OK ? dt : -1;
}

/* One timed run of n decode steps over B sequences (each starts from one prompt token). */
static double run_tg(bench_ctx *c, int n, int B, epyq_err *err) {
    for (int j = 0; j < B; j++) {
        epyq_seq_reset(c->seqs[j]);
        if (fill_depth(c, c->seqs[j], err) != EPYQ_OK) return -1;
        c->bseq[j] = c->seqs[j];
        c->tok[j] = synth_token((uint32_t)(1000 + j), c->V);
    }
    epyq_batch b = {B, c->bseq, c->tok, NULL};
    double t0 = epyq_now();
    c->bytes = 0;
    for (int step = 0; step < n; step++) {
        if (epyq_model_forward(c->m, &b, c->logits, NULL, err) != EPYQ_OK) return -1;
        c->bytes += (double)epyq_model_last_bytes(c->m);
        for (int j = 0; j < B; j++) c->tok[j] = epyq_argmax(c->logits + (size_t)j * c->V, c->V);
    }
    return epyq_now() - t0;
}

static int32_t pick_argmax(void *ctx, const float *logits) { return epyq_argmax(logits, ((bench_ctx *)ctx)->V); }

/* One timed speculative generation of at least n tokens from one prompt token (the last step
 * may emit up to k more; *stv counts them all). */
static double run_tg_spec(bench_ctx *c, int n, int k, bool forced, bool fixed, epyq_spec_stats *stv,
                          epyq_err *err) {
    epyq_seq *s = c->seqs[0];
    epyq_seq_reset(s);
    epyq_spec *sp = NULL;
    epyq_spec_opts so = {.k = k, .forced = forced, .adaptive = !fixed};
    if (c->o->epc) so.clock = epyq_tool_ep_clock, so.clock_ctx = (void *)c->o->epc;
    if (epyq_spec_create(&sp, c->m, s, &so, err) != EPYQ_OK) return -1;
    int32_t prompt = synth_token(1000, c->V), first, out[EPYQ_SPEC_MAX];
    double t0 = epyq_now();
    epyq_status st = epyq_spec_prefill(sp, &prompt, 1, pick_argmax, c, &first, err);
    for (int64_t emitted = 1; st == EPYQ_OK && emitted < n;) {
        int32_t got;
        st = epyq_spec_step(sp, pick_argmax, c, out, &got, err);
        emitted += got;
    }
    double dt = epyq_now() - t0;
    *stv = *epyq_spec_get_stats(sp);
    epyq_spec_free(sp);
    c->bytes = 0; /* not counted: drafts, verification and the MTP pass read different weights */
    return st == EPYQ_OK ? dt : -1;
}

/* A run with the progress line around it (rep 0 = the warm-up). */
static double timed_pp(bench_ctx *c, int n, int rep, epyq_err *err) {
    epyq_bench_progress_start(c->pg, rep, c->o->reps);
    double dt = run_pp(c, n, err);
    epyq_bench_progress_done(c->pg, dt);
    return dt;
}

static double timed_tg(bench_ctx *c, int n, int B, int rep, epyq_err *err) {
    epyq_bench_progress_start(c->pg, rep, c->o->reps);
    double dt = run_tg(c, n, B, err);
    epyq_bench_progress_done(c->pg, dt);
    return dt;
}

/* --profile: start counting before a test's timed runs ... */
static void profile_begin(const bench_ctx *c) {
    if (c->o->profile && !epyq_model_prof_enable(c->m, true))
        fprintf(stderr, "epyq bench: --profile: out of memory; no profile for this test\n");
}

/* ... and print them after: ms per forward call by block over `secs` of timed runs. */
static void profile_end(const bench_ctx *c, const char *test, double secs) {
    epyq_prof pf;
    if (!c->o->profile || !epyq_model_prof_read(c->m, &pf)) return;
    epyq_model_prof_enable(c->m, false);
    double n = pf.forwards ? (double)pf.forwards : 1.0, sum = 0;
    for (int ph = 0; ph < EPYQ_PROF_N; ph++) sum += (double)pf.ns[ph];
    fprintf(stderr,
            "profile %s: %.0f forward calls, %.3f ms each (%.1f%% of it in the blocks below)\n",
            test, n, 1e3 * secs / n, secs > 0 ? 100.0 * sum / 1e9 / secs : 0.0);
    for (int ph = 0; ph < EPYQ_PROF_N; ph++)
        if (pf.ns[ph])
            fprintf(stderr, "  %-14s %9.3f ms %5.1f%%\n", epyq_prof_phase_name((epyq_prof_phase)ph),
                    (double)pf.ns[ph] / 1e6 / n, sum > 0 ? 100.0 * (double)pf.ns[ph] / sum : 0.0);
    fprintf(
        stderr,
        "  pool: %.1f runs per call; the driver waited %.3f ms per call for the other workers\n",
        (double)pf.pool_runs / n, (double)pf.pool_wait_ns / 1e6 / n);
}

static void stats(const double *v, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) q += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

/* llama-bench's test name at a depth, "pp512 @ d4096", and the n_depth column */
static void depth_suffix(row *r, int depth) {
    r->n_depth = depth;
    const size_t l = strlen(r->test);
    if (depth > 0 && l < sizeof r->test) snprintf(r->test + l, sizeof r->test - l, " @ d%d", depth);
}

/* --ep: ranks other than 0 compute along and print nothing */
static bool g_quiet;

static void print_header(out_fmt f) {
    if (g_quiet) return;
    if (f == OUT_MD) {
        printf("| model | format | size | params | isa | path | threads | numa | test | spec | accept | t/s | GB/s | %% read bw |\n");
        printf("| --- | --- | ---: | ---: | --- | --- | ---: | --- | --- | --- | ---: | ---: | ---: | ---: |\n");
    } else if (f == OUT_CSV) {
        printf(
            "model,format,size_gib,params_b,isa,path,threads,numa,test,spec,accept_len,n_prompt,n_ubatch,n_gen,n_batch,n_depth,avg_ts,"
            "stddev_ts,gbps,read_gbps,pct_read_bw\n");
    } else if (f == OUT_JSON) {
        printf("[\n");
    }
}

static void print_row(out_fmt f, const row *r, bool first) {
    if (g_quiet) return;
    if (f == OUT_MD) {
        char size[32], params[32];
        if (r->size_gib >= 1.0) snprintf(size, sizeof size, "%.2f GiB", r->size_gib);
        else snprintf(size, sizeof size, "%.2f MiB", r->size_gib * 1024.0);
        if (r->params_b >= 1.0) snprintf(params, sizeof params, "%.2f B", r->params_b);
        else snprintf(params, sizeof params, "%.2f M", r->params_b * 1000.0);
        printf("| %s | %s | %s | %s | %s | %s | %d | %s | %s | %s | %.2f | %.2f ± %.2f | %.2f | %.1f%% |\n", r->model,
               r->format, size, params, r->isa, r->path, r->threads, r->numa, r->test, r->spec, r->accept_len, r->ts_mean,
               r->ts_sd, r->gbps, r->pct);
    } else if (f == OUT_CSV) {
        printf("%s,%s,%.3f,%.3f,%s,%s,%d,%s,%s,%s,%.3f,%d,%d,%d,%d,%d,%.4f,%.4f,%.3f,%.3f,%.2f\n",
               r->model, r->format, r->size_gib, r->params_b, r->isa, r->path, r->threads, r->numa,
               r->test, r->spec, r->accept_len, r->n_prompt, r->n_ubatch, r->n_gen, r->batch,
               r->n_depth, r->ts_mean, r->ts_sd, r->gbps, r->bw_read, r->pct);
    } else {
        printf(
            "%s{\"model\": \"%s\", \"format\": \"%s\", \"size_gib\": %.3f, \"params_b\": %.3f, \"isa\": \"%s\", \"path\": \"%s\", "
            "\"threads\": %d, \"numa\": \"%s\", \"test\": \"%s\", \"spec\": \"%s\", \"accept_len\": %.3f, "
            "\"n_prompt\": %d, \"n_ubatch\": %d, \"n_gen\": %d, "
            "\"n_batch\": %d, \"n_depth\": %d, \"avg_ts\": %.4f, \"stddev_ts\": %.4f, \"gbps\": %.3f, \"read_gbps\": %.3f, "
            "\"pct_read_bw\": %.2f}%s",
            f == OUT_JSON && !first ? ",\n" : "", r->model, r->format, r->size_gib, r->params_b,
            r->isa, r->path, r->threads, r->numa, r->test, r->spec, r->accept_len, r->n_prompt,
            r->n_ubatch, r->n_gen, r->batch, r->n_depth, r->ts_mean, r->ts_sd, r->gbps, r->bw_read,
            r->pct, f == OUT_JSONL ? "\n" : "");
    }
    fflush(stdout);
}

/* The read probe each timed repetition is paired with: one pass over the --membw-mb buffer
 * by as many pinned threads, right after the repetition (the shared machine's bandwidth
 * drifts within a minute, so one figure from the start is not what a repetition saw).
 * <= 0 when the buffer cannot be allocated. */
static double probe_gbps(const opts *o, int threads) {
    epyq_membw_result res;
    if (epyq_membw_measure(EPYQ_MEMBW_READ, o->membw_bytes, threads, 1, &res, NULL) != EPYQ_OK) return -1.0;
    return res.median_gbps;
}

/* % read bw of a test: its mean weight GB/s over the mean of the probes paired with its
 * repetitions (the start-of-run figure stands in where a probe failed); read_gbps is that
 * mean, so pct = 100 gbps / read_gbps holds in every output format. */
static void paired_pct(const double *probes, int reps, double bw0, row *r) {
    double pb = 0.0;
    for (int k = 0; k < reps; k++) pb += probes[k] > 0 ? probes[k] : bw0;
    r->bw_read = pb / reps;
    r->pct = 100.0 * r->gbps / r->bw_read;
}

/* Every test for one thread count. */
static epyq_status bench_threads(const opts *o, const char *dir, int threads, const epyq_weights_stats *ws,
                                 uint64_t params, const char *fmt_name, bool *first, epyq_bench_progress *pg,
                                 epyq_err *err) {
    double bw = epyq_membw_read_gbps(o->membw_bytes, threads);
    if (bw <= 0) return epyq_err_set(err, EPYQ_E_NOMEM, "read-bandwidth probe: cannot allocate %zu MiB", o->membw_bytes >> 20);
    epyq_numa_opts numa = o->rt.numa;
    numa.n_threads = threads;
    bool any_spec = false;
    for (int i = 0; i < o->n_spec; i++) any_spec |= o->spec[i].k > 0;
    epyq_model_opts mo = {.path = o->paths[0],
                          .n_threads = threads,
                          .skip_mtp = !any_spec,
                          .draft_head = any_spec ? o->draft_head : EPYQ_REQUANT_NONE,
                          .draft_vocab = any_spec ? o->draft_vocab : 0,
                          .numa = o->rt.use_numa ? &numa : NULL,
                          .requant_lm_head = o->rt.rq_lm_head,
                          .requant_dense = o->rt.rq_dense,
                          .ep = o->epc};
    bench_ctx c = {.o = o, .pg = pg};
    epyq_status st = epyq_tool_model_load(&c.m, dir, &mo, err);
    if (st != EPYQ_OK) return st;
    c.V = epyq_model_config(c.m)->vocab_size;
    int max_pp = 1, max_b = 1, max_tg = 1;
    for (int i = 0; i < o->n_pp; i++) max_pp = o->pp[i] > max_pp ? o->pp[i] : max_pp;
    for (int i = 0; i < o->n_bat; i++) max_b = o->bat[i] > max_b ? o->bat[i] : max_b;
    for (int i = 0; i < o->n_tg; i++) max_tg = o->tg[i] > max_tg ? o->tg[i] : max_tg;
    int ntok = max_pp > max_b ? max_pp : max_b;
    c.seqs = calloc((size_t)max_b, sizeof *c.seqs);
    c.bseq = calloc((size_t)ntok, sizeof *c.bseq);
    c.tok = calloc((size_t)ntok, sizeof *c.tok);
    c.logits = malloc((size_t)max_b * c.V * sizeof(float));
    double *samples = calloc((size_t)o->reps, sizeof(double));
    double *probes = calloc((size_t)o->reps, sizeof(double));
    double *gbs = calloc((size_t)o->reps, sizeof(double)), sd; /* weight GB/s per repetition */
    if (!c.seqs || !c.bseq || !c.tok || !c.logits || !samples || !probes || !gbs)
        st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    int ctx = o->depth + (max_pp > max_tg ? max_pp : max_tg) + 2 +
              EPYQ_SPEC_MAX; /* a last step's drafts */
    for (int j = 0; st == EPYQ_OK && j < max_b; j++)
        st = epyq_seq_create(&c.seqs[j], c.m, ctx, o->rt.kv, err);

    row r = {0};
    const char *base = strrchr(dir, '/');
    snprintf(r.model, sizeof r.model, "%s", base && base[1] ? base + 1 : dir);
    /* the format column names any requantisation: exact and requantised rows never mix up */
    int fl = snprintf(r.format, sizeof r.format, "%s", fmt_name);
    if (o->rt.rq_lm_head && fl > 0 && (size_t)fl < sizeof r.format)
        fl += snprintf(r.format + fl, sizeof r.format - (size_t)fl, "+lm_head=%s",
                       epyq_requant_name(o->rt.rq_lm_head));
    if (o->rt.rq_dense && fl > 0 && (size_t)fl < sizeof r.format)
        snprintf(r.format + fl, sizeof r.format - (size_t)fl, "+dense=%s",
                 epyq_requant_name(o->rt.rq_dense));
    snprintf(r.isa, sizeof r.isa, "%s", epyq_kern()->name);
    r.size_gib = (double)ws->resident_bytes / (1024.0 * 1024 * 1024);
    r.params_b = (double)params / 1e9;
    r.threads = threads;
    r.bw_read = bw;
    /* the numa column: off, the mode, or split N (logical nodes of this machine) */
    if (!o->rt.use_numa || numa.mode == EPYQ_NUMA_OFF) snprintf(r.numa, sizeof r.numa, "off");
    else if (numa.split > 0) snprintf(r.numa, sizeof r.numa, "split %d", (int)numa.split);
    else snprintf(r.numa, sizeof r.numa, "%s", epyq_numa_mode_name(numa.mode));

    for (int pi = 0; st == EPYQ_OK && pi < o->n_paths; pi++) {
    epyq_model_set_path(c.m, o->paths[pi]);
    snprintf(r.path, sizeof r.path, "%s", epyq_model_path_name(o->paths[pi]));
    for (int i = 0; st == EPYQ_OK && i < o->n_pp; i++) {
        int n = o->pp[i];
        if (n == 0) continue;
        if (o->warmup && timed_pp(&c, n, 0, err) < 0) st = err->code;
        if (o->epc) epyq_tool_ep_reset(o->epc); /* the report covers the timed runs */
        double timed = 0;
        profile_begin(&c);
        for (int k = 0; st == EPYQ_OK && k < o->reps; k++) {
            double dt = timed_pp(&c, n, k + 1, err);
            if (dt < 0) st = err->code;
            else
                samples[k] = n / dt, gbs[k] = c.bytes / dt / 1e9, timed += dt;
            probes[k] = probe_gbps(o, threads);
        }
        if (st != EPYQ_OK) break;
        stats(samples, o->reps, &r.ts_mean, &r.ts_sd);
        snprintf(r.test, sizeof r.test, "pp%d", n);
        depth_suffix(&r, o->depth);
        snprintf(r.spec, sizeof r.spec, "none");
        r.accept_len = 1.0;
        r.n_prompt = n, r.n_gen = 0, r.batch = 1;
        r.n_ubatch = o->ubatch > 0 && o->ubatch < n ? o->ubatch : n;
        stats(gbs, o->reps, &r.gbps, &sd);
        paired_pct(probes, o->reps, bw, &r);
        epyq_bench_progress_clear(pg);
        print_row(o->out, &r, *first);
        *first = false;
        profile_end(&c, r.test, timed);
        if (o->epc) epyq_tool_ep_report(o->epc, r.test, 0, 0);
    }
    for (int i = 0; st == EPYQ_OK && i < o->n_tg; i++) {
        for (int bi = 0; st == EPYQ_OK && bi < o->n_bat; bi++) {
          for (int si = 0; st == EPYQ_OK && si < (o->bat[bi] == 1 ? o->n_spec : 1); si++) {
            int n = o->tg[i], B = o->bat[bi], K = o->spec[si].k;
            bool forced = o->spec[si].forced, fixed = o->spec[si].fixed;
            if (n == 0) continue;
            epyq_spec_stats sv = {0};
            double tsteps = 0, acc = 0, split[3] = {0}, plain = 0, switches = 0;
            if (o->warmup) {
                double dt;
                if (K) {
                    epyq_bench_progress_start(pg, 0, o->reps);
                    dt = run_tg_spec(&c, n < 8 ? n : 8, K, forced, fixed, &sv, err);
                    epyq_bench_progress_done(pg, dt);
                } else {
                    dt = timed_tg(&c, n < 8 ? n : 8, B, 0, err);
                }
                if (dt < 0) st = err->code;
            }
            double ep_tok = 0, ep_s = 0; /* --ep: decode tokens and seconds of the timed runs */
            if (o->epc) epyq_tool_ep_reset(o->epc);
            if (!K) profile_begin(&c);
            for (int k = 0; st == EPYQ_OK && k < o->reps; k++) {
                if (K) {
                    epyq_bench_progress_start(pg, k + 1, o->reps);
                    double dt = run_tg_spec(&c, n, K, forced, fixed, &sv, err);
                    epyq_bench_progress_done(pg, dt);
                    if (dt < 0) st = err->code;
                    else {
                        samples[k] = (double)(sv.emitted + sv.plain + 1) / dt, gbs[k] = 0;
                        ep_tok += (double)(sv.emitted + sv.plain + 1), ep_s += dt;
                        plain += (double)sv.plain, switches += (double)sv.switches;
                        double steps = (double)(sv.steps ? sv.steps : 1); /* per verify step */
                        tsteps += dt / steps, acc += (double)sv.emitted / steps;
                        split[0] += sv.t_draft / steps, split[1] += sv.t_verify / steps;
                        split[2] += sv.t_rollback / steps;
                    }
                } else {
                    double dt = timed_tg(&c, n, B, k + 1, err);
                    if (dt < 0) st = err->code;
                    else samples[k] = (double)n * B / dt, gbs[k] = c.bytes / dt / 1e9;
                    if (dt >= 0) ep_tok += (double)n * B, ep_s += dt;
                }
                probes[k] = probe_gbps(o, threads);
            }
            if (st != EPYQ_OK) break;
            stats(samples, o->reps, &r.ts_mean, &r.ts_sd);
            if (B == 1) snprintf(r.test, sizeof r.test, "tg%d", n);
            else snprintf(r.test, sizeof r.test, "tg%d b%d", n, B);
            depth_suffix(&r, K ? 0 : o->depth);
            if (K) snprintf(r.spec, sizeof r.spec, "mtp:%d%s", K, forced ? ":forced" : fixed ? ":fixed" : "");
            else snprintf(r.spec, sizeof r.spec, "none");
            r.accept_len = K ? acc / o->reps : 1.0;
            r.n_prompt = 0, r.n_gen = n, r.batch = B, r.n_ubatch = 0;
            stats(gbs, o->reps, &r.gbps, &sd);
            paired_pct(probes, o->reps, bw, &r);
            epyq_bench_progress_clear(pg);
            print_row(o->out, &r, *first);
            *first = false;
            if (!K) profile_end(&c, r.test, ep_s);
            if (o->epc) {
                char what[96];
                snprintf(what, sizeof what, "%s%s%s", r.test, K ? " " : "", K ? r.spec : "");
                epyq_tool_ep_report(o->epc, what, (int)ep_tok, ep_s);
            }
            if (!g_quiet && K && plain > 0)
                fprintf(stderr, "spec %s: adaptive: %.0f of %d tokens a repetition decoded plainly, %.1f switches\n",
                        r.spec, plain / o->reps, n, switches / o->reps);
            else if (!g_quiet && K)
                fprintf(stderr, "spec %s: per verify step %.1f ms = drafts %.1f + verify %.1f + rollback %.2f ms, "
                        "%.2f tokens/step\n", r.spec, 1e3 * tsteps / o->reps, 1e3 * split[0] / o->reps,
                        1e3 * split[1] / o->reps, 1e3 * split[2] / o->reps, r.accept_len);
            if (K && forced && o->n_accept) {
                /* the measured cost of a step, at the asked acceptance: 1 + sum of the rates of
                 * positions 1..K tokens a step (positions past the list accept nothing) */
                double tok = 1.0;
                for (int a = 0; a < K && a < o->n_accept; a++) tok += o->accept[a];
                row pr = r;
                int l = snprintf(pr.spec, sizeof pr.spec, "mtp:%d@", K);
                for (int a = 0; a < K && a < o->n_accept && l > 0 && (size_t)l < sizeof pr.spec; a++)
                    l += snprintf(pr.spec + l, sizeof pr.spec - (size_t)l, "%s%.2f", a ? "," : "", o->accept[a]);
                pr.ts_mean = tok / (tsteps / o->reps), pr.ts_sd = 0, pr.accept_len = tok;
                snprintf(pr.test, sizeof pr.test, "tg%d projected", n);
                print_row(o->out, &pr, false);
            }
          }
        }
    }
    }
    for (int j = 0; c.seqs && j < max_b; j++) epyq_seq_free(c.seqs[j]);
    free(c.seqs), free(c.bseq), free(c.tok), free(c.logits), free(samples), free(probes), free(gbs);
    epyq_model_free(c.m);
    return st;
}

int epyq_cmd_bench(int argc, char **argv) {
    opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    epyq_err err = {0};
    char *dir = NULL;
    epyq_weights *w = NULL;
    epyq_bind_opts bo = {.skip_mtp = true};
    epyq_ep *ep = NULL;
    epyq_status st = o.ep ? epyq_tool_ep_open(&ep, &argc, &argv, &err) : EPYQ_OK;
    o.epc = ep;
    g_quiet = ep && ep->rank != 0;
    if (st != EPYQ_OK) goto done;
    if ((st = epyq_kern_init(&err)) != EPYQ_OK) goto done;
    if (ep && (st = epyq_tool_ep_check(ep, o.paths[0], &err)) != EPYQ_OK) goto done;
    st = ep ? epyq_tool_ep_model_dir(ep, o.dir, o.synthetic, &dir, &err)
            : epyq_tool_model_dir(o.dir, o.synthetic, &dir, &err);
    if (st != EPYQ_OK) goto done;
    if ((st = epyq_weights_bind(&w, dir, &bo, &err)) != EPYQ_OK) goto done;
    epyq_weights_stats ws;
    epyq_weights_stats_get(w, &ws);
    uint64_t params = 0;
    for (int k = 0; k < EPYQ_MK_COUNT; k++) params += ws.kind[k].params;
    params += (uint64_t)w->cfg.vocab_size * (uint64_t)w->cfg.hidden_size; /* embedding */
    const char *fmt = epyq_qformat_name(w->cfg.qformat);
    epyq_weights_free(w);
    w = NULL;
    bool first = true;
    epyq_bench_progress pg;
    epyq_bench_progress_init(&pg, o.pp, o.n_pp, o.tg, o.n_tg, o.bat, o.n_bat, o.thr, o.n_thr,
                             o.n_paths, o.n_spec, o.reps, o.warmup);
    pg.tty = pg.tty && !g_quiet;
    print_header(o.out);
    for (int i = 0; st == EPYQ_OK && i < o.n_thr; i++)
        st = bench_threads(&o, dir, o.thr[i], &ws, params, fmt, &first, &pg, &err);
    epyq_bench_progress_clear(&pg);
    epyq_bench_progress_free(&pg);
    if (o.out == OUT_JSON && !g_quiet) printf("\n]\n");
done:
    epyq_weights_free(w);
    free(dir);
    if (st != EPYQ_OK) {
        if (ep && ep->size > 1) fprintf(stderr, "epyq: rank %d: %s\n", ep->rank, err.msg);
        else
            fprintf(stderr, "epyq: %s\n", err.msg);
        if (ep) epyq_tool_ep_abort(ep, 1); /* the other ranks would wait in an exchange */
    }
    epyq_tool_ep_close(ep);
    return st == EPYQ_OK ? 0 : 1;
}
