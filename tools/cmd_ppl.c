/* tools/cmd_ppl.c — `epyq ppl`: perplexity over a text file, and KL divergence between two
 * checkpoints' per-token distributions (the way int4 quality is reported).
 *
 * Sliding window (the usual strided evaluation): windows of c tokens start every c/2 tokens;
 * each window starts from an empty sequence, and only tokens not scored by an earlier window
 * are scored (all of the first window, the last c/2 of every later one), so every token after
 * the first is scored once with at least c/2 tokens of context (except at the very start).
 * PPL = exp(mean NLL), reported ± exp(mean)·SE(mean NLL) (delta method).
 *
 * --kld-base FILE: when FILE does not exist, the scored tokens' full log-distributions are saved
 * to it (float16, one row per scored token, after a header); when it exists, the same text must
 * be given and each row is compared with this model's: KL(P_base || P_this) mean and max, and
 * top-1 agreement. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "model/model.h"
#include "model/sample.h"
#include "tok/tokenizer.h"
#include "tools/cmd.h"
#include "tools/tool_model.h"

#define KLD_MAGIC "EPYQKLD1"
#define LOGIT_ROWS 64 /* tokens per forward call: bounds the [rows][vocab] logits buffer */

typedef struct {
    const char *dir, *synthetic, *file, *kld;
    int ctx, threads;
    epyq_numpath path;
} opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: epyq ppl (-m DIR | --synthetic SPEC) -f text.txt [-c 512] [--kld-base FILE]\n"
            "\n"
            "  -m, --model DIR     checkpoint folder (with tokenizer files)\n"
            "  --synthetic SPEC    generated model, e.g. tiny:ct\n"
            "  -f, --file FILE     text to score (UTF-8)\n"
            "  -c, --ctx-size N    window in tokens (default 512; stride N/2)\n"
            "  --kld-base FILE     save (FILE absent) or compare against (FILE present) per-token\n"
            "                      distributions: KL mean/max and top-1 agreement vs the base\n"
            "  -t, --threads N     threads (default: all allowed CPUs)\n"
            "  --path a16|a8|a8all int4 kernels' numeric path: a8 (default) int8 activations in\n"
            "                      the routed experts, a16 none, a8all in every int4 linear\n"
            "  -h, --help          this text\n");
}

static int parse(int argc, char **argv, opts *o) {
    enum { OPT_SYN = 256, OPT_KLD, OPT_NPATH };
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'}, {"synthetic", required_argument, 0, OPT_SYN},
        {"file", required_argument, 0, 'f'},  {"ctx-size", required_argument, 0, 'c'},
        {"kld-base", required_argument, 0, OPT_KLD}, {"threads", required_argument, 0, 't'},
        {"path", required_argument, 0, OPT_NPATH}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    o->ctx = 512;
    o->path = EPYQ_PATH_A8; /* the runtime default: see epyq_model_opts.path */
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:f:c:t:h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': o->dir = optarg; break;
        case OPT_SYN: o->synthetic = optarg; break;
        case 'f': o->file = optarg; break;
        case OPT_KLD: o->kld = optarg; break;
        case 'c': case 't': {
            long v;
            if (epyq_tool_opt_long("epyq ppl", optarg, c == 'c' ? 4 : 0, 1 << 20, &v)) return 2;
            *(c == 'c' ? &o->ctx : &o->threads) = (int)v;
            break;
        }
        case OPT_NPATH:
            if (epyq_tool_opt_path("epyq ppl", optarg, &o->path)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: fprintf(stderr, "epyq ppl: bad option (try --help)\n"); return 2;
        }
    }
    if (optind < argc) return fprintf(stderr, "epyq ppl: unexpected argument '%s'\n", argv[optind]), 2;
    if (!o->dir == !o->synthetic) return fprintf(stderr, "epyq ppl: give exactly one of -m DIR or --synthetic SPEC\n"), 2;
    if (!o->file) return fprintf(stderr, "epyq ppl: -f FILE is required\n"), 2;
    return -1;
}

/* log-softmax of one row into lp; returns nothing, lp[V]. */
static void log_softmax(const float *x, int32_t V, double *lp) {
    double mx = x[0];
    for (int32_t i = 1; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int32_t i = 0; i < V; i++) s += exp((double)x[i] - mx);
    double lse = mx + log(s);
    for (int32_t i = 0; i < V; i++) lp[i] = (double)x[i] - lse;
}

typedef struct {
    FILE *f;          /* base file (save or compare) */
    bool save;
    uint32_t V, n;    /* header */
    uint16_t *row;    /* [V] */
    double kl_sum, kl_max;
    uint64_t top1_same, rows;
} kld_state;

static epyq_status kld_row(kld_state *k, const double *lp, int32_t V, const char *path, epyq_err *err) {
    if (k->save) {
        for (int32_t i = 0; i < V; i++) k->row[i] = epyq_f32_to_f16((float)lp[i]);
        if (fwrite(k->row, 2, (size_t)V, k->f) != (size_t)V) return epyq_err_set(err, EPYQ_E_IO, "%s: write failed", path);
        k->rows++;
        return EPYQ_OK;
    }
    if (fread(k->row, 2, (size_t)V, k->f) != (size_t)V)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: ends after %llu rows; the text or -c differs from the base run", path,
                            (unsigned long long)k->rows);
    double kl = 0;
    int32_t a = 0, b = 0;
    for (int32_t i = 0; i < V; i++) {
        double lb = epyq_f16_to_f32(k->row[i]);
        if (lb > -60) kl += exp(lb) * (lb - lp[i]);
        if (lb > epyq_f16_to_f32(k->row[a])) a = i;
        if (lp[i] > lp[b]) b = i;
    }
    k->kl_sum += kl;
    k->kl_max = kl > k->kl_max ? kl : k->kl_max;
    k->top1_same += a == b;
    k->rows++;
    return EPYQ_OK;
}

static epyq_status kld_open(kld_state *k, const char *path, int32_t V, uint32_t n_scored, epyq_err *err) {
    struct stat sb;
    k->save = stat(path, &sb) != 0;
    k->row = malloc((size_t)V * 2);
    k->f = fopen(path, k->save ? "wb" : "rb");
    if (!k->row || !k->f) return epyq_err_set(err, EPYQ_E_IO, "%s: cannot open", path);
    uint32_t hdr[2] = {(uint32_t)V, n_scored};
    if (k->save) {
        if (fwrite(KLD_MAGIC, 1, 8, k->f) != 8 || fwrite(hdr, 4, 2, k->f) != 2)
            return epyq_err_set(err, EPYQ_E_IO, "%s: write failed", path);
        return EPYQ_OK;
    }
    char magic[8];
    uint32_t got[2];
    if (fread(magic, 1, 8, k->f) != 8 || memcmp(magic, KLD_MAGIC, 8) != 0 || fread(got, 4, 2, k->f) != 2)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: not an epyq --kld-base file", path);
    if (got[0] != hdr[0] || got[1] != hdr[1])
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: base has vocab %u and %u scored tokens, this run has %u and %u",
                            path, got[0], got[1], hdr[0], hdr[1]);
    return EPYQ_OK;
}

int epyq_cmd_ppl(int argc, char **argv) {
    opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    epyq_err err = {0};
    char *dir = NULL, *text = NULL;
    size_t text_len = 0, n_ids = 0;
    int32_t *ids = NULL;
    epyq_tok *tok = NULL;
    epyq_model *m = NULL;
    epyq_seq *seq = NULL;
    kld_state k = {0};
    float *logits = NULL;
    double *lp = NULL;
    epyq_model_opts mo = {.path = o.path, .n_threads = o.threads, .skip_mtp = true};
    int32_t V = 0, c = o.ctx, stride = o.ctx / 2;
    epyq_status st = epyq_kern_init(&err);
    if (st != EPYQ_OK) goto done;
    if ((st = epyq_tool_model_dir(o.dir, o.synthetic, &dir, &err)) != EPYQ_OK) goto done;
    if ((st = epyq_file_read(o.file, (size_t)1 << 31, &text, &text_len, &err)) != EPYQ_OK)
        goto done;
    if ((st = epyq_tok_load(&tok, dir, &err)) != EPYQ_OK) goto done;
    if ((st = epyq_tok_encode(tok, text, text_len, &ids, &n_ids, &err)) != EPYQ_OK) goto done;
    if (n_ids < 2) {
        st = epyq_err_set(&err, EPYQ_E_ARG, "%s: %zu tokens; need at least 2 to score", o.file,
                          n_ids);
        goto done;
    }
    if ((st = epyq_tool_model_load(&m, dir, &mo, &err)) != EPYQ_OK) goto done;
    V = epyq_model_config(m)->vocab_size;
    if (c > (int64_t)n_ids) c = (int32_t)n_ids;
    logits = malloc((size_t)LOGIT_ROWS * V * sizeof(float));
    lp = malloc((size_t)V * sizeof(double));
    if (!logits || !lp) {
        st = epyq_err_set(&err, EPYQ_E_NOMEM, "out of memory");
        goto done;
    }
    if ((st = epyq_seq_create(&seq, m, c, EPYQ_KV_BF16, &err)) != EPYQ_OK) goto done;
    if (o.kld && (st = kld_open(&k, o.kld, V, (uint32_t)(n_ids - 1), &err)) != EPYQ_OK) goto done;

    double nll_sum = 0, nll_sq = 0;
    uint64_t scored = 0;
    double t0 = epyq_now();
    uint64_t evaluated = 0;
    /* windows [w, w + c); score positions p (predicting ids[p+1]) with p >= first_unscored */
    size_t next_score = 0; /* the next position whose prediction is not yet scored */
    for (size_t w = 0; st == EPYQ_OK && next_score + 1 < n_ids; w += (size_t)stride) {
        size_t end = w + (size_t)c < n_ids ? w + (size_t)c : n_ids;
        epyq_seq_reset(seq);
        for (size_t p0 = w; st == EPYQ_OK && p0 < end; p0 += LOGIT_ROWS) {
            int32_t n = (int32_t)(end - p0 < LOGIT_ROWS ? end - p0 : LOGIT_ROWS);
            epyq_seq *seqs[LOGIT_ROWS];
            for (int32_t i = 0; i < n; i++) seqs[i] = seq;
            epyq_batch b = {n, seqs, ids + p0, NULL};
            st = epyq_model_forward(m, &b, logits, NULL, &err);
            evaluated += (uint64_t)n;
            for (int32_t i = 0; st == EPYQ_OK && i < n; i++) {
                size_t p = p0 + (size_t)i;
                if (p < next_score || p + 1 >= n_ids) continue;
                log_softmax(logits + (size_t)i * V, V, lp);
                double nll = -lp[ids[p + 1]];
                nll_sum += nll, nll_sq += nll * nll, scored++;
                if (o.kld) st = kld_row(&k, lp, V, o.kld, &err);
            }
        }
        if (st == EPYQ_OK) next_score = end - 1;
        if (end == n_ids) break;
        if (isatty(2)) fprintf(stderr, "\rppl: %zu/%zu tokens scored", next_score, n_ids - 1);
    }
    double dt = epyq_now() - t0;
    if (isatty(2)) fputc('\n', stderr);
    if (st != EPYQ_OK) goto done;
    double mean = nll_sum / (double)scored;
    double var = scored > 1 ? (nll_sq - nll_sum * mean) / (double)(scored - 1) : 0;
    double se = sqrt(var > 0 ? var / (double)scored : 0);
    printf("tokens scored: %llu (window %d, stride %d), evaluated %llu in %.2f s (%.1f tokens/s)\n",
           (unsigned long long)scored, c, stride, (unsigned long long)evaluated, dt,
           evaluated / dt);
    printf("PPL = %.4f +/- %.4f   (mean NLL %.5f +/- %.5f nats)\n", exp(mean), exp(mean) * se, mean,
           se);
    if (o.kld && k.save)
        printf("saved %llu distributions to %s\n", (unsigned long long)k.rows, o.kld);
    else if (o.kld)
        printf(
            "KL divergence vs %s: mean %.6f, max %.6f nats; top-1 agreement %.2f%% (%llu/%llu)\n",
            o.kld, k.kl_sum / (double)k.rows, k.kl_max,
            100.0 * (double)k.top1_same / (double)k.rows, (unsigned long long)k.top1_same,
            (unsigned long long)k.rows);
done:
    if (k.f && fclose(k.f) != 0 && st == EPYQ_OK) st = epyq_err_set(&err, EPYQ_E_IO, "%s: write failed", o.kld);
    free(k.row);
    free(logits), free(lp), free(ids), free(text), free(dir);
    epyq_seq_free(seq);
    epyq_model_free(m);
    epyq_tok_free(tok);
    if (st != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        return 1;
    }
    return 0;
}
