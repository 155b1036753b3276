/* tests/check_main.h — the end of every Check suite's main(): run the suite, count failures.
 * One copy here instead of five lines in each of the ~40 test programs. */
#ifndef EPYQ_CHECK_MAIN_H
#define EPYQ_CHECK_MAIN_H

#include <check.h>
#include <stdbool.h>

/* Runs s with Check's normal output and returns how many of its tests failed. nofork: run the
 * tests in this process, for suites that load a model once and share it across tests;
 * otherwise Check's default (a fork per test unless CK_FORK=no). */
static inline int epyq_test_failures(Suite *s, bool nofork) {
    SRunner *sr = srunner_create(s);
    if (nofork) srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed;
}

/* A suite's exit status: 0 when every test passed, 1 otherwise. */
static inline int epyq_test_run(Suite *s) { return epyq_test_failures(s, false) ? 1 : 0; }

#endif
