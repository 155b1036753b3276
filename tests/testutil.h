/* tests/testutil.h — shared helpers for the Check suites.
 * Fixture data lives in ../shared (EPYQ_SHARED); tests that need it skip when it is absent,
 * and every area also keeps project-local tests (generated with epyq synth) so a clone
 * without ../shared still tests itself. */
#ifndef EPYQ_TESTUTIL_H
#define EPYQ_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* A fresh temporary directory for this test (mkdtemp under $TMPDIR or /tmp). */
static inline char *epyq_test_tmpdir(void) {
    const char *t = getenv("TMPDIR");
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/epyq-test-XXXXXX", t && *t ? t : "/tmp");
    char *d = mkdtemp(buf);
    return d ? strdup(d) : NULL;
}

/* Path of the built epyq binary (for CLI tests). */
static inline const char *epyq_test_bin(void) {
    static char buf[4096];
    const char *b = getenv("EPYQ_BUILDDIR");
    snprintf(buf, sizeof buf, "%s/epyq", b && *b ? b : ".");
    return buf;
}

#endif
