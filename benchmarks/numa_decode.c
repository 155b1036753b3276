/* benchmarks/numa_decode.c — what the NUMA split costs a decoded token.
 *
 * Loads one checkpoint four times (--numa off, --numa-split 1, --numa-split N with the dense
 * linears split by rows, and --numa-split N --numa replicate-dense) in one process and decodes
 * with each in turn, round after round (odd rounds in reverse order), so load drift on a
 * shared machine hits all alike.
 * Prints per configuration the best and median wall time per token and the median process CPU
 * time per token (all threads, spinning included), each configuration's cost relative to off,
 * and for the NUMA ones the bytes each node's pool read per token from its own node (local)
 * and from elsewhere (remote), as move_pages found the weight pages at load and as the
 * sequence's per-head buffers were bound; then the sequence-buffer part of those (KV rows,
 * conv histories, DeltaNet states) and move_pages' count of the sequence's pages (on the
 * first node's row: all nodes' pages).
 *
 * usage: numa_decode DIR [split N (default 2)] [rounds (default 8)] [tokens per round (16)] */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "model/model.h"
#include "model/numa_moe.h"

#define N_CFG 4

static double now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: numa_decode DIR [split] [rounds] [tokens]\n"), 2;
    int split = argc > 2 ? atoi(argv[2]) : 2, rounds = argc > 3 ? atoi(argv[3]) : 8;
    int toks = argc > 4 ? atoi(argv[4]) : 16;
    if (split < 1 || split > 64 || rounds < 1 || rounds > 1000 || toks < 1 || toks > 4096)
        return fprintf(stderr, "numa_decode: split 1..64, rounds 1..1000, tokens 1..4096\n"), 2;
    epyq_err err = {0};
    if (epyq_kern_init(&err) != EPYQ_OK) return fprintf(stderr, "numa_decode: %s\n", err.msg), 1;
    const char *name[N_CFG] = {"off", "split 1", "split N", "replicate N"};
    char split_name[32], repl_name[48];
    snprintf(split_name, sizeof split_name, "split %d", split);
    snprintf(repl_name, sizeof repl_name, "split %d replicate-dense", split);
    name[2] = split_name, name[3] = repl_name;
    epyq_numa_opts no[N_CFG];
    epyq_model *m[N_CFG] = {0};
    epyq_seq *s[N_CFG] = {0};
    float *logits = NULL;
    double *wall = calloc((size_t)N_CFG * rounds, sizeof(double)), *cpu = calloc((size_t)N_CFG * rounds, sizeof(double));
    int rc = 0;
    /* A NUMA load pins this thread to its node 0's first CPU, and the next load's topology is
     * what this thread may use: give every load the whole inherited set, or a later one would
     * plan all its logical nodes on that one CPU. */
    cpu_set_t all;
    if (sched_getaffinity(0, sizeof all, &all) != 0)
        return fprintf(stderr, "numa_decode: sched_getaffinity failed\n"), 1;
    for (int c = 0; c < N_CFG && !rc; c++) {
        sched_setaffinity(0, sizeof all, &all);
        epyq_numa_opts_init(&no[c]);
        no[c].split = c >= 2 ? split : 1;
        if (c == 3) no[c].mode = EPYQ_NUMA_REPLICATE_DENSE;
        epyq_model_opts mo = {.skip_mtp = true, .numa = c ? &no[c] : NULL};
        if (epyq_model_load(&m[c], argv[1], &mo, &err) != EPYQ_OK ||
            epyq_seq_create(&s[c], m[c], rounds * toks + 2, EPYQ_KV_BF16, &err) != EPYQ_OK)
            rc = fprintf(stderr, "numa_decode: %s: %s\n", name[c], err.msg) > 0;
    }
    if (!rc) logits = malloc((size_t)epyq_model_config(m[0])->vocab_size * sizeof(float));
    if (!rc && (!logits || !wall || !cpu)) rc = fprintf(stderr, "numa_decode: out of memory\n") > 0;
    for (int c = 1; c < N_CFG && !rc; c++) epyq_model_numa_reads_reset(m[c]);
    for (int r = 0; r < rounds && !rc; r++)
        for (int i = 0; i < N_CFG && !rc; i++) {
            /* odd rounds in reverse order, so no configuration always follows the same one */
            const int c = r % 2 ? N_CFG - 1 - i : i;
            double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
            for (int t = 0; t < toks && !rc; t++) {
                int32_t tok = (r * toks + t) * 7 % 1000 + 10; /* same tokens for every configuration */
                epyq_batch b = {1, &s[c], &tok, NULL};
                if (epyq_model_forward(m[c], &b, logits, NULL, &err) != EPYQ_OK)
                    rc = fprintf(stderr, "numa_decode: %s\n", err.msg) > 0;
            }
            wall[c * rounds + r] = (now(CLOCK_MONOTONIC) - w0) / toks * 1e3;
            cpu[c * rounds + r] = (now(CLOCK_PROCESS_CPUTIME_ID) - c0) / toks * 1e3;
        }
    if (!rc) {
        double best[N_CFG], med[N_CFG], cmed[N_CFG];
        printf("| numa | best ms/token | median ms/token | median CPU ms/token | best tokens/s |\n");
        printf("| --- | ---: | ---: | ---: | ---: |\n");
        for (int c = 0; c < N_CFG; c++) {
            double *w = wall + (size_t)c * rounds;
            med[c] = median(w, rounds); /* sorts w: w[0] is the best */
            best[c] = w[0];
            cmed[c] = median(cpu + (size_t)c * rounds, rounds);
            printf("| %s | %.3f | %.3f | %.3f | %.1f |\n", name[c], best[c], med[c], cmed[c], 1e3 / best[c]);
        }
        printf("\nvs off (median):");
        for (int c = 1; c < N_CFG; c++)
            printf(" %s %+.1f%%%s", name[c], 100 * (med[c] / med[0] - 1),
                   c < N_CFG - 1 ? "," : "\n");
        printf("vs off (best):");
        for (int c = 1; c < N_CFG; c++)
            printf(" %s %+.1f%%%s", name[c], 100 * (best[c] / best[0] - 1),
                   c < N_CFG - 1 ? "," : "\n");
        /* where each node's pool read its weights from, per decoded token */
        printf(
            "\n| numa | node | local MiB/token | remote MiB/token | local |\n| --- | ---: | ---: | ---: | ---: |\n");
        const double per = 1.0 / ((double)rounds * toks * 1024.0 * 1024.0);
        for (int c = 1; c < N_CFG && !rc; c++)
            for (int32_t g = -1; g < epyq_model_numa_groups(m[c]); g++) {
                uint64_t lo = 0, re = 0;
                if (epyq_model_numa_reads(m[c], g, &lo, &re, &err) != EPYQ_OK) {
                    rc = fprintf(stderr, "numa_decode: %s\n", err.msg) > 0;
                    break;
                }
                if (g < 0 && !lo && !re) continue; /* nothing ran on the unpinned pool */
                char node[16];
                snprintf(node, sizeof node, g < 0 ? "unpinned" : "%d", (int)g);
                printf("| %s | %s | %.2f | %.2f | %.1f%% |\n", name[c], node, (double)lo * per,
                       (double)re * per, lo + re ? 100.0 * (double)lo / (double)(lo + re) : 0.0);
            }
        /* the part of those that was the sequence's own buffers (KV rows, conv histories,
         * DeltaNet states), and where move_pages finds their pages now */
        printf("\n| numa | node | sequence KiB/token local | remote | pages on their node | "
               "elsewhere |\n| --- | ---: | ---: | ---: | ---: | ---: |\n");
        for (int c = 1; c < N_CFG && !rc; c++) {
            epyq_seq_numa_pages k[EPYQ_SEQ_NUMA_KINDS];
            size_t on = 0, off = 0;
            if (epyq_seq_numa_verify_kinds(s[c], k, &err) != EPYQ_OK)
                rc = fprintf(stderr, "numa_decode: %s\n", err.msg) > 0;
            for (int i = 0; i < EPYQ_SEQ_NUMA_KINDS; i++) on += k[i].on_node, off += k[i].elsewhere;
            for (int32_t g = 0; !rc && g < epyq_model_numa_groups(m[c]); g++) {
                uint64_t lo = 0, re = 0;
                if (epyq_model_numa_seq_reads(m[c], g, &lo, &re, &err) != EPYQ_OK) {
                    rc = fprintf(stderr, "numa_decode: %s\n", err.msg) > 0;
                    break;
                }
                char pg[64] = " | "; /* the pages of all nodes, on the first row */
                if (!g) snprintf(pg, sizeof pg, "%zu | %zu", on, off);
                printf("| %s | %d | %.1f | %.1f | %s |\n", name[c], (int)g,
                       (double)lo * per * 1024.0, (double)re * per * 1024.0, pg);
            }
        }
    }
    for (int c = 0; c < N_CFG; c++) {
        epyq_seq_free(s[c]);
        epyq_model_free(m[c]);
    }
    free(logits), free(wall), free(cpu);
    return rc;
}
