/* tests/testutil.h — shared helpers for the Check suites.
 * Fixture data lives in ../shared (EPYQ_SHARED); tests that need it skip when it is absent,
 * and every area also keeps project-local tests (generated with epyq synth) so a clone
 * without ../shared still tests itself. */
#ifndef EPYQ_TESTUTIL_H
#define EPYQ_TESTUTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* "$EPYQ_SHARED/<sub>" if that path exists, else NULL. Result is a static buffer per call site's
 * use: copy it if you need two at once. */
static inline const char *epyq_test_shared(const char *sub) {
    static char buf[4096];
    const char *root = getenv("EPYQ_SHARED");
    if (!root || !*root) return NULL;
    snprintf(buf, sizeof buf, "%s/%s", root, sub);
    struct stat sb;
    return stat(buf, &sb) == 0 ? buf : NULL;
}

/* Temporary directories are removed when the process that made them exits, so a test that
 * returns early, or never calls epyq_test_rm_dir, leaves nothing in /tmp (a make check used to
 * leave ~56 folders, 28 MB each for the synthetic checkpoints). A directory made in a Check
 * fixture before the fork belongs to the parent: each entry keeps its maker's pid, and the exit
 * handler of a forked test child leaves the parent's entries alone. EPYQ_KEEP_TMP=1 keeps them
 * all for a post-mortem. */
enum { EPYQ_TEST_MAX_TMPDIRS = 64 };
typedef struct {
    char *path[EPYQ_TEST_MAX_TMPDIRS]; /* [n] strdup'd paths */
    pid_t pid[EPYQ_TEST_MAX_TMPDIRS];  /* [n] the process that made each */
    int n;
} epyq_test_tmpdirs;

static inline epyq_test_tmpdirs *epyq_test_tmpdir_list(void) {
    static epyq_test_tmpdirs list;
    return &list;
}

/* rm -rf dir: system()'s status, 0 when done. */
static inline int epyq_test_rm_tree(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd);
}

static inline void epyq_test_tmpdir_atexit(void) {
    const char *keep = getenv("EPYQ_KEEP_TMP");
    if (keep && *keep && strcmp(keep, "0") != 0) return;
    epyq_test_tmpdirs *l = epyq_test_tmpdir_list();
    for (int i = 0; i < l->n; i++) {
        if (l->pid[i] != getpid()) continue;
        struct stat sb;
        if (stat(l->path[i], &sb) == 0 && epyq_test_rm_tree(l->path[i]) != 0)
            fprintf(stderr, "warning: could not remove %s\n", l->path[i]);
    }
}

/* A fresh temporary directory for this test (mkdtemp under $TMPDIR or /tmp), removed at exit. */
static inline char *epyq_test_tmpdir(void) {
    const char *t = getenv("TMPDIR");
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/epyq-test-XXXXXX", t && *t ? t : "/tmp");
    char *d = mkdtemp(buf);
    if (!d) return NULL;
    epyq_test_tmpdirs *l = epyq_test_tmpdir_list();
    if (l->n == 0) atexit(epyq_test_tmpdir_atexit);
    if (l->n < EPYQ_TEST_MAX_TMPDIRS) {
        l->path[l->n] = strdup(d);
        l->pid[l->n] = getpid();
        l->n++;
    }
    return strdup(d);
}

/* Removes dir and everything in it (rm -rf) now, then frees dir: system()'s status, 0 when done. */
static inline int epyq_test_rm_dir(char *dir) {
    const int rc = epyq_test_rm_tree(dir);
    free(dir);
    return rc;
}

/* Path of the built epyq binary (for CLI tests). */
static inline const char *epyq_test_bin(void) {
    static char buf[4096];
    const char *b = getenv("EPYQ_BUILDDIR");
    snprintf(buf, sizeof buf, "%s/epyq", b && *b ? b : ".");
    return buf;
}

/* Threads of this process whose name (comm) starts with prefix. */
static inline int epyq_test_threads_named(const char *prefix) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[300], comm[32] = {0};
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(comm, sizeof comm, f) && strncmp(comm, prefix, strlen(prefix)) == 0) n++;
        fclose(f);
    }
    closedir(d);
    return n;
}

/* The same count, polled for up to two seconds until it equals want. pthread_join returns when the
 * kernel clears the thread's tid, which comes before the task is released, so a joined thread's
 * /proc/self/task entry can outlive the join for a moment (seen under ASan in CI). */
static inline int epyq_test_threads_named_settled(const char *prefix, int want) {
    int n = epyq_test_threads_named(prefix);
    for (int i = 0; i < 200 && n != want; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        n = epyq_test_threads_named(prefix);
    }
    return n;
}

/* The kernel tests' deterministic generator: one xorshift64 step of *s, returning the new
 * state (callers take the bits they want; each test keeps its own seeds). */
static inline uint64_t epyq_test_xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The fixture checkpoints (../shared/fixtures/models/<name>) the model tests run on. */
enum { EPYQ_TEST_N_MODELS = 5 };
static inline const char *epyq_test_model_name(int i) {
    static const char *const names[EPYQ_TEST_N_MODELS] = {"tiny-bf16", "tiny-bf16-fused",
                                                          "tiny-gptq", "tiny-ct", "tiny-quark"};
    return names[i];
}

/* The ones this run covers, [*f0, *f1): all, or under EPYQ_FAST (the sanitizer runs) tiny-ct
 * alone, the folder with int4 in every block. 0 when at least one of them is present; 77 after
 * printing a skip line when none is: every case would then read a missing folder, and automake
 * must count a SKIP (exit 77), not a PASS, for a run that tested nothing. */
static inline int epyq_test_model_range(int *f0, int *f1) {
    *f0 = getenv("EPYQ_FAST") ? 3 : 0;
    *f1 = getenv("EPYQ_FAST") ? 4 : EPYQ_TEST_N_MODELS;
    char sub[256];
    for (int i = *f0; i < *f1; i++) {
        snprintf(sub, sizeof sub, "fixtures/models/%s", epyq_test_model_name(i));
        if (epyq_test_shared(sub)) return 0;
    }
    printf("skip: ../shared/fixtures/models not found\n");
    return 77;
}

#endif
