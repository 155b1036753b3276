/* benchmarks/e2e.c — end-to-end forward-pass throughput of the runtime model:
 *   decode tokens/s at batch 1, prefill tokens/s for a P-token prompt, and decode throughput
 *   with S concurrent sequences (one token each per batch), plus at batch 1 the packed weight
 *   bytes each token streams ÷ time per token against this machine's read bandwidth.
 *
 *   benchmarks/e2e -m DIR [-t N] [--prompt 512] [--seqs 8,32] [--steps 16] [--path a16|a8|a8all]
 *
 * Use a synthetic checkpoint (`epyq synth --shape 35b-a3b --format ct --layers 4 --vocab 32768`
 * for a quick run; the full 40-layer model for the real figure). Bytes/token counts every
 * mixer projection, router, shared expert, the top-k routed experts and lm_head once (batch 1
 * touches each exactly once); KV and DeltaNet state traffic come on top. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels-x86/membw.h"
#include "model/model.h"

#define MAX_SEQ_COUNTS 8

static void usage(FILE *f) {
    fprintf(
        f, "usage: e2e -m DIR [-t N] [--prompt P] [--seqs LIST] [--steps N] [--path a16|a8|a8all]\n"
           "  -m DIR         checkpoint folder\n"
           "  -t N           threads (default: one per allowed CPU)\n"
           "  --prompt P     prefill length (default 512)\n"
           "  --seqs LIST    concurrent sequence counts for batched decode (default 8,32)\n"
           "  --steps N      decode steps per measurement (default 16)\n"
           "  --path P       int4 numeric path: a8 (default), a16 or a8all (epyq run --help)\n");
}

static int fail(const epyq_err *e) {
    fprintf(stderr, "e2e: %s\n", e->msg);
    return 1;
}

/* S sequences, each prefilled with 16 tokens, then `steps` batches of one token per sequence;
 * returns tokens/s of the decode batches. */
static int decode_rate(epyq_model *m, int S, int steps, double *tps, epyq_err *err) {
    const int V = epyq_model_config(m)->vocab_size;
    epyq_seq **seq = calloc((size_t)S, sizeof *seq);
    int *tok = malloc((size_t)S * sizeof(int));
    float *logits = malloc((size_t)S * V * sizeof(float));
    epyq_status st = seq && tok && logits ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    for (int s = 0; st == EPYQ_OK && s < S; s++) {
        st = epyq_seq_create(&seq[s], m, 16 + steps + 1, EPYQ_KV_BF16, err);
        int ids[16];
        epyq_seq *ss[16];
        for (int i = 0; i < 16; i++) ids[i] = (s * 31 + i * 17 + 1) % (V > 1000 ? 1000 : V), ss[i] = seq[s];
        epyq_batch b = {16, ss, ids, NULL};
        if (st == EPYQ_OK) st = epyq_model_forward(m, &b, NULL, NULL, err);
    }
    double t0 = epyq_now();
    for (int k = 0; st == EPYQ_OK && k < steps; k++) {
        for (int s = 0; s < S; s++) tok[s] = (k * 7 + s) % (V > 1000 ? 1000 : V);
        epyq_batch b = {S, seq, tok, NULL};
        st = epyq_model_forward(m, &b, logits, NULL, err);
    }
    *tps = (double)S * steps / (epyq_now() - t0);
    for (int s = 0; seq && s < S; s++) epyq_seq_free(seq[s]);
    free(seq), free(tok), free(logits);
    return st == EPYQ_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    static const struct option lo[] = {{"prompt", required_argument, 0, 'p'}, {"seqs", required_argument, 0, 's'},
                                       {"steps", required_argument, 0, 'n'},  {"path", required_argument, 0, 'P'},
                                       {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    const char *dir = NULL;
    int threads = 0, prompt = 512, steps = 16, seqs[MAX_SEQ_COUNTS] = {8, 32}, n_seqs = 2, c;
    epyq_numpath path = EPYQ_PATH_A8;
    while ((c = getopt_long(argc, argv, "m:t:h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 't': threads = atoi(optarg); break;
        case 'p': prompt = atoi(optarg); break;
        case 'n': steps = atoi(optarg); break;
        case 's': n_seqs = epyq_parse_int_list(optarg, seqs, MAX_SEQ_COUNTS); break;
        case 'P': {
            const int p = epyq_model_path_parse(optarg);
            if (p < 0) return fprintf(stderr, "e2e: --path: expected a16, a8 or a8all\n"), 2;
            path = (epyq_numpath)p;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!dir || prompt < 1 || steps < 1 || n_seqs < 0) {
        usage(stderr);
        return 2;
    }
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_model_opts mo = {.path = path, .n_threads = threads, .skip_mtp = true};
    double t0 = epyq_now();
    if (epyq_model_load(&m, dir, &mo, &err) != EPYQ_OK) return fail(&err);
    const epyq_config *cfg = epyq_model_config(m);
    printf(
        "model %s: %d layers, hidden %d, %d experts, vocab %d, %s, path %s, kernels %s, %d threads,"
        " load %.1f s\n",
        dir, cfg->num_hidden_layers, cfg->hidden_size, cfg->num_experts, cfg->vocab_size,
        epyq_qformat_name(cfg->qformat), epyq_model_path_name(path), epyq_kern()->name,
        epyq_model_threads(m), epyq_now() - t0);

    /* prefill: one batch of `prompt` tokens */
    epyq_seq *s = NULL;
    if (epyq_seq_create(&s, m, prompt + 1, EPYQ_KV_BF16, &err) != EPYQ_OK) return fail(&err);
    int *ids = malloc((size_t)prompt * sizeof(int));
    epyq_seq **ss = malloc((size_t)prompt * sizeof *ss);
    uint8_t *want = calloc((size_t)prompt, 1);
    float *logits = malloc((size_t)cfg->vocab_size * sizeof(float));
    if (!ids || !ss || !want || !logits) return fprintf(stderr, "e2e: out of memory\n"), 1;
    for (int i = 0; i < prompt; i++) ids[i] = (i * 7919 + 3) % (cfg->vocab_size > 1000 ? 1000 : cfg->vocab_size), ss[i] = s;
    want[prompt - 1] = 1;
    epyq_batch b = {prompt, ss, ids, want};
    t0 = epyq_now();
    if (epyq_model_forward(m, &b, logits, NULL, &err) != EPYQ_OK) return fail(&err);
    double t_pre = epyq_now() - t0;
    printf("%-34s %10.1f tokens/s  (%d tokens in %.2f s)\n", "prefill", prompt / t_pre, prompt, t_pre);
    epyq_seq_free(s);

    double tps1;
    if (decode_rate(m, 1, steps, &tps1, &err)) return fail(&err);
    uint64_t bytes = epyq_model_active_bytes(m);
    double gbps = (double)bytes * tps1 / 1e9;
    double bw = epyq_membw_read_gbps((size_t)1 << 30, epyq_model_threads(m));
    printf("%-34s %10.2f tokens/s  (%.1f ms/token)\n", "decode, batch 1", tps1, 1e3 / tps1);
    printf("%-34s %10.3f GB/token -> %.1f GB/s = %.0f%% of read bandwidth %.1f GB/s\n",
           "weight bytes / time (batch 1)", (double)bytes / 1e9, gbps, bw > 0 ? 100.0 * gbps / bw : 0.0, bw);
    for (int i = 0; i < n_seqs; i++) {
        double tps;
        if (decode_rate(m, seqs[i], steps, &tps, &err)) return fail(&err);
        char label[64];
        snprintf(label, sizeof label, "decode, %d sequences", seqs[i]);
        printf("%-34s %10.2f tokens/s  (%.2fx batch 1)\n", label, tps, tps / tps1);
    }
    free(ids), free(ss), free(want), free(logits);
    epyq_model_free(m);
    return 0;
}
