/* benchmarks/membw.c — this machine's memory bandwidth: STREAM-like read (sum reduction
 * with the kernel table's stream_read), copy and triad on 1 and N pinned threads, median
 * and min-max of repeated runs (kernels-x86/membw.h defines the byte counts).
 *
 *   benchmarks/membw [--size MIB] [-t 1,2] [--reps N] [--json]
 *
 * The default buffer (1024 MiB) is ~10x a 105 MiB L3; use --size 2048+ on parts with more
 * cache (a Genoa socket has up to 1152 MiB of L3 with 3D V-Cache). */
#include <getopt.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels-x86/kern.h"
#include "kernels-x86/membw.h"

#define MAX_THREAD_COUNTS 16

static void usage(FILE *f) {
    fprintf(f, "usage: membw [--size MIB] [-t|--threads LIST] [--reps N] [--json]\n"
               "  --size MIB      buffer size in MiB (default 1024; keep it >> the L3)\n"
               "  -t, --threads   comma list of thread counts (default 1,<allowed CPUs>)\n"
               "  --reps N        timed repetitions per row (default 7; plus one warm-up)\n"
               "  --json          one JSON object per row instead of a table\n");
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"size", required_argument, NULL, 's'},
                                         {"threads", required_argument, NULL, 't'},
                                         {"reps", required_argument, NULL, 'r'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    long size_mib = 1024;
    int reps = 7, json = 0, nthr = 0;
    int thr[MAX_THREAD_COUNTS];
    int c;
    while ((c = getopt_long(argc, argv, "t:h", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 's':
            size_mib = strtol(optarg, &end, 10);
            if (!end || *end || size_mib < 1 || size_mib > (1L << 20)) {
                fprintf(stderr, "membw: --size %s: expected MiB in 1..1048576\n", optarg);
                return 2;
            }
            break;
        case 't':
            nthr = epyq_parse_int_list(optarg, thr, MAX_THREAD_COUNTS);
            if (nthr < 1) {
                fprintf(stderr, "membw: -t %s: expected a list like 1,2\n", optarg);
                return 2;
            }
            for (int i = 0; i < nthr; i++)
                if (thr[i] < 1 || thr[i] > 1024) {
                    fprintf(stderr, "membw: -t %s: thread counts are 1..1024\n", optarg);
                    return 2;
                }
            break;
        case 'r':
            reps = (int)strtol(optarg, &end, 10);
            if (!end || *end || reps < 1 || reps > 1000) {
                fprintf(stderr, "membw: --reps %s: expected 1..1000\n", optarg);
                return 2;
            }
            break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "membw: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    epyq_err err;
    if (epyq_kern_init(&err) != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        return 1;
    }
    if (nthr == 0) {
        cpu_set_t set;
        const int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
        thr[nthr++] = 1;
        if (n > 1) thr[nthr++] = n;
    }
    const char *table = epyq_kern()->name;
    const size_t bytes = (size_t)size_mib << 20;
    if (!json)
        printf("membw: kernels %s, buffer %ld MiB, %d reps (+1 warm-up), GB = 1e9 B\n"
               "%-6s %7s %10s %10s %10s\n",
               table, size_mib, reps, "op", "threads", "median", "min", "max");
    for (int i = 0; i < nthr; i++)
        for (int op = EPYQ_MEMBW_READ; op <= EPYQ_MEMBW_TRIAD; op++) {
            epyq_membw_result r;
            if (epyq_membw_measure((epyq_membw_op)op, bytes, thr[i], reps, &r, &err) != EPYQ_OK) {
                fprintf(stderr, "epyq: %s\n", err.msg);
                return 1;
            }
            const char *name = epyq_membw_op_name((epyq_membw_op)op);
            if (json)
                printf("{\"bench\":\"membw\",\"op\":\"%s\",\"threads\":%d,\"buffer_mib\":%ld,"
                       "\"reps\":%d,\"gbps\":%.3f,\"gbps_min\":%.3f,\"gbps_max\":%.3f,"
                       "\"kernels\":\"%s\"}\n",
                       name, thr[i], size_mib, reps, r.median_gbps, r.min_gbps, r.max_gbps, table);
            else
                printf("%-6s %7d %10.2f %10.2f %10.2f\n", name, thr[i], r.median_gbps, r.min_gbps,
                       r.max_gbps);
            fflush(stdout);
        }
    return 0;
}
