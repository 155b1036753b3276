/* tests/unit/omp_probe.c — helper for test_omp_runtime (built by make check, not a test
 * itself): runs one oneDNN bf16 matmul through epyq_dnnl_gemm_bf16 on 2 threads, checks
 * its result, then reports the process's threads and how much CPU the non-main threads
 * burn in the 300 ms after the call. The test runs it under LD_DEBUG=bindings to see
 * which OpenMP runtime serves oneDNN, and normally to read these figures:
 *   result_ok=1 tasks_before=N tasks_after=N idle_ticks=N runtimes=libomp,libgomp */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels-x86/dnnl_gemm.h"
#include "core/util.h"

/* utime + stime (clock ticks) of every task but the main one, and the task count. */
static long other_tasks_ticks(int *ntasks) {
    DIR *d = opendir("/proc/self/task");
    long sum = 0;
    *ntasks = 0;
    if (!d) return -1;
    const long self = (long)getpid();
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        (*ntasks)++;
        if (atol(e->d_name) == self) continue;
        char path[64], buf[1024];
        snprintf(path, sizeof path, "/proc/self/task/%.20s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* the task just exited */
        const size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *p = strrchr(buf, ')'); /* comm may contain spaces */
        long ut = 0, st = 0;
        if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &st) == 2)
            sum += ut + st;
    }
    closedir(d);
    return sum;
}

/* Which OpenMP runtimes are mapped into the process. */
static void print_runtimes(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int omp = 0, gomp = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (strstr(line, "/libomp.so")) omp = 1;
        if (strstr(line, "/libgomp.so")) gomp = 1;
    }
    if (f) fclose(f);
    printf(" runtimes=%s%s%s", omp ? "libomp" : "", omp && gomp ? "," : "", gomp ? "libgomp" : "");
}

int main(void) {
    enum { M = 48, N = 96, K = 160 };
    static float x[M * K], y[M * N];
    static uint16_t w[N * K];
    for (int i = 0; i < M * K; i++) x[i] = (float)((i * 37) % 17 - 8) / 8.0f;
    for (int i = 0; i < N * K; i++) w[i] = epyq_f32_to_bf16((float)((i * 11) % 13 - 6) / 4.0f);
    int before = 0, after = 0;
    other_tasks_ticks(&before);
    epyq_err err;
    if (epyq_dnnl_gemm_bf16(x, M, K, w, N, y, N, 2, &err) != EPYQ_OK) {
        fprintf(stderr, "omp_probe: %s\n", err.msg);
        return 1;
    }
    /* x and w are small multiples of 1/8 and 1/4: every product and sum is exact. */
    int ok = 1;
    for (int t = 0; t < M; t++)
        for (int j = 0; j < N; j++) {
            double ref = 0.0;
            for (int i = 0; i < K; i++) ref += (double)x[t * K + i] * epyq_bf16_to_f32(w[j * K + i]);
            if (fabs(ref - y[t * N + j]) > 0.0) ok = 0;
        }
    const struct timespec settle = {0, 50 * 1000 * 1000}, window = {0, 300 * 1000 * 1000};
    nanosleep(&settle, NULL); /* let the team reach its wait after the region */
    const long t0 = other_tasks_ticks(&after);
    nanosleep(&window, NULL);
    int again = 0;
    const long t1 = other_tasks_ticks(&again);
    printf("result_ok=%d tasks_before=%d tasks_after=%d idle_ticks=%ld", ok, before, after, t1 - t0);
    print_runtimes();
    printf("\n");
    epyq_dnnl_release();
    return 0;
}
