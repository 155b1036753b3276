/* tests/unit/test_omp_runtime.c — one OpenMP runtime per process (issue 2, item 2).
 *
 * Debian's oneDNN is linked against GNU libgomp; epyq links LLVM libomp ahead of it
 * (EPYQ_LIBS in Makefile.am), so the GOMP_* entry points oneDNN calls resolve to libomp's
 * GOMP compatibility layer and libgomp, though mapped (it is oneDNN's DT_NEEDED), never
 * runs a thread. This test re-executes tests/unit/omp_probe, which runs one bf16 matmul
 * through kernels-x86/dnnl_gemm.c, and checks:
 *   1. under LD_DEBUG=bindings with LD_BIND_NOW=1 (every symbol resolved at start-up, not
 *      only those called): every GOMP_* / omp_* / kmp_* symbol libdnnl.so.2 binds goes to
 *      libomp.so.5, none to libgomp.so.1, and there is at least one GOMP_* binding;
 *   2. run normally: the matmul is exact, it used at most the 2 threads asked for (one
 *      libomp worker besides the caller), and in the 300 ms after the call the other
 *      threads used <= 2 clock ticks of CPU — i.e. nobody spins. That holds because
 *      dnnl_gemm.c sets libomp's block time to 0 (kmp_set_blocktime) before each call;
 *      libomp's default would spin each worker for 200 ms after every GEMM, on cores our
 *      decode pools are pinned to.
 * Built with --without-libomp (EPYQ_TEST_LIBOMP unset) the single runtime is oneDNN's own
 * libgomp: the same checks then require every binding to go to libgomp.so.1 and libomp to
 * be absent. Skips (exit 77) when the build has no oneDNN. */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels-x86/dnnl_gemm.h"
#include "tests/check_main.h"
#include "tests/testutil.h"

static char probe[4096];

#ifdef EPYQ_TEST_LIBOMP
#define RUNTIME "libomp.so"  /* serves every OpenMP call in the process */
#define RUNTIMES_LOADED "libomp,libgomp" /* libgomp is mapped (oneDNN's DT_NEEDED) but idle */
#else
#define RUNTIME "libgomp.so"
#define RUNTIMES_LOADED "libgomp"
#endif

/* Run the probe with extra environment (NAME=VALUE strings), stdout to out_path. */
static int run_probe(const char *const *env, const char *out_path) {
    const pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
        const int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 1) < 0) _exit(126);
        execl(probe, probe, (char *)NULL);
        _exit(127);
    }
    int ws = 0;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "%s failed (status %d)", probe, ws);
    return (int)pid;
}

static const char *base(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

START_TEST(test_dnnl_binds_to_libomp) {
    char *dir = epyq_test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    char out[4200], dbg_env[4200], dbg[4300];
    snprintf(out, sizeof out, "%s/stdout", dir);
    snprintf(dbg_env, sizeof dbg_env, "LD_DEBUG_OUTPUT=%s/ld", dir);
    const char *env[] = {"LD_DEBUG=bindings", "LD_BIND_NOW=1", dbg_env, NULL};
    const int pid = run_probe(env, out);
    snprintf(dbg, sizeof dbg, "%s/ld.%d", dir, pid); /* ld.so appends the pid */
    FILE *f = fopen(dbg, "r");
    ck_assert_msg(f != NULL, "no LD_DEBUG output at %s", dbg);
    /* binding file /usr/lib/.../libdnnl.so.2 [0] to /usr/lib/.../libomp.so.5 [0]:
     *   normal symbol `GOMP_parallel' [GOMP_4.0] */
    char line[8192], from[4096], to[4096], sym[512];
    int n_gomp = 0, n_omp = 0;
    while (fgets(line, sizeof line, f)) {
        const char *b = strstr(line, "binding file ");
        if (!b || sscanf(b, "binding file %4095s [%*d] to %4095s [%*d]: %*s symbol `%511[^']", from,
                         to, sym) != 3)
            continue;
        if (strncmp(base(from), "libdnnl.so", 10) != 0) continue;
        const int is_gomp = strncmp(sym, "GOMP_", 5) == 0;
        if (!is_gomp && strncmp(sym, "omp_", 4) != 0 && strncmp(sym, "kmp_", 4) != 0) continue;
        ck_assert_msg(strncmp(base(to), RUNTIME, strlen(RUNTIME)) == 0, "libdnnl's %s binds to %s",
                      sym, to);
        n_gomp += is_gomp;
        n_omp++;
    }
    fclose(f);
    ck_assert_msg(n_gomp > 0, "no GOMP_* binding from libdnnl seen in %s", dbg);
    printf("libdnnl.so.2: %d OpenMP symbols (%d GOMP_*) all bound to %s\n", n_omp, n_gomp, RUNTIME);
    unlink(dbg);
    unlink(out);
    rmdir(dir);
    free(dir);
}
END_TEST

START_TEST(test_no_spinning_after_gemm) {
    char *dir = epyq_test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    char out[4200], line[512] = "";
    snprintf(out, sizeof out, "%s/stdout", dir);
    run_probe(NULL, out);
    FILE *f = fopen(out, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    fclose(f);
    int ok = 0, before = 0, after = 0;
    long ticks = -1;
    char rt[64] = "";
    ck_assert_msg(sscanf(line, "result_ok=%d tasks_before=%d tasks_after=%d idle_ticks=%ld runtimes=%63s",
                         &ok, &before, &after, &ticks, rt) == 5,
                  "probe said: %s", line);
    printf("probe: %s", line);
    ck_assert_msg(ok == 1, "oneDNN bf16 matmul result differs from the exact reference");
    ck_assert_msg(after <= before + 1, "oneDNN left %d threads for a 2-thread call", after - before);
    ck_assert_msg(ticks >= 0 && ticks <= 2, "OpenMP workers burned %ld ticks while idle", ticks);
    ck_assert_msg(strcmp(rt, RUNTIMES_LOADED) == 0, "OpenMP runtimes mapped: %s, expected %s", rt,
                  RUNTIMES_LOADED);
    unlink(out);
    rmdir(dir);
    free(dir);
}
END_TEST

int main(void) {
    if (!epyq_dnnl_available()) {
        printf("built without oneDNN: nothing to check\n");
        return 77;
    }
    const char *bd = getenv("EPYQ_BUILDDIR");
    snprintf(probe, sizeof probe, "%s/tests/unit/omp_probe", bd && *bd ? bd : ".");
    if (access(probe, X_OK) != 0) {
        fprintf(stderr, "test_omp_runtime: %s not built\n", probe);
        return 1;
    }
    Suite *s = suite_create("omp_runtime");
    TCase *tc = epyq_test_case(s, "dnnl", 0);
    EPYQ_TESTS_ADD(tc, test_dnnl_binds_to_libomp, test_no_spinning_after_gemm);
    return epyq_test_run(s);
}
