/* tests/fuzz/regress_main.c — replays files through a libFuzzer harness without libFuzzer, so
 * every reproducer a fuzzer ever found (tests/fuzz/regress/NAME/) and the seed corpus
 * (tests/fuzz/corpus/NAME/) run under `make check` in every build: the gcc default build just
 * replays them (a harness abort() or a crash fails the test), the ASan+UBSan build of .ci/run
 * also catches memory errors and, through LeakSanitizer after each file, leaks.
 *
 * Linked with one harness (its LLVMFuzzerTestOneInput, and LLVMFuzzerInitialize when it has
 * one) per program, tests/fuzz/regress_NAME, built with -DEPYQ_FUZZ_NAME='"NAME"'.
 * usage: regress_NAME [FILE|DIR]...   (no arguments: $EPYQ_SRCDIR/tests/fuzz/{regress,corpus}/NAME)
 * Without arguments a folder that does not exist counts as empty (a harness with no finding
 * yet has no regress folder); anything named that cannot be read fails the run. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef EPYQ_FUZZ_NAME
#error "build with -DEPYQ_FUZZ_NAME='\"harness name\"'"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Weak: only some harnesses have one. */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
/* Present only in sanitizer builds (LeakSanitizer); weak so the gcc build links without it. */
int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

static int g_inputs;

/* One input, read into a buffer of exactly its size (as libFuzzer hands it over, so ASan sees
 * any read past the end). */
static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) != 0) {
        fprintf(stderr, "regress_%s: %s: cannot open: %s\n", EPYQ_FUZZ_NAME, path, strerror(errno));
        if (f) fclose(f);
        return 1;
    }
    size_t n = (size_t)sb.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    size_t got = buf ? fread(buf, 1, n, f) : 0;
    fclose(f);
    if (!buf || got != n) {
        fprintf(stderr, "regress_%s: %s: expected %zu bytes, read %zu%s\n", EPYQ_FUZZ_NAME, path, n, got,
                buf ? "" : " (out of memory)");
        free(buf);
        return 1;
    }
    fprintf(stderr, "regress_%s: %s (%zu bytes)\n", EPYQ_FUZZ_NAME, path, n);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    g_inputs++;
    /* Name the input that leaked instead of one report at exit for all of them. */
    if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check()) {
        fprintf(stderr, "regress_%s: %s: memory leaked (report above)\n", EPYQ_FUZZ_NAME, path);
        return 1;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every regular file of dir, in name order (stable logs); a missing dir holds nothing. */
static int replay_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        fprintf(stderr, "regress_%s: %s: cannot open the folder: %s\n", EPYQ_FUZZ_NAME, dir, strerror(errno));
        return 1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            char **nn = realloc(names, (cap = cap ? 2 * cap : 32) * sizeof *nn);
            if (!nn) {
                rc = 1;
                break;
            }
            names = nn;
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(len))) {
            rc = 1;
            break;
        }
        snprintf(names[n++], len, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    if (rc) fprintf(stderr, "regress_%s: %s: out of memory listing the folder\n", EPYQ_FUZZ_NAME, dir);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        struct stat sb;
        if (!rc && stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode)) rc = replay_file(names[i]);
        free(names[i]);
    }
    free(names);
    return rc;
}

static int replay(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) ? replay_dir(path) : replay_file(path);
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int rc = 0;
    if (argc > 1) {
        for (int i = 1; i < argc && !rc; i++) rc = replay(argv[i]);
    } else {
        const char *src = getenv("EPYQ_SRCDIR");
        if (!src) src = ".";
        static const char *const kinds[] = {"regress", "corpus"};
        for (int k = 0; k < 2 && !rc; k++) {
            size_t len = strlen(src) + 64 + strlen(EPYQ_FUZZ_NAME);
            char *dir = malloc(len);
            if (!dir) return 1;
            snprintf(dir, len, "%s/tests/fuzz/%s/%s", src, kinds[k], EPYQ_FUZZ_NAME);
            rc = replay_dir(dir);
            free(dir);
        }
    }
    printf("regress_%s: %d inputs replayed, %s\n", EPYQ_FUZZ_NAME, g_inputs, rc ? "FAILED" : "all passed");
    return rc;
}
