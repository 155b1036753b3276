/* tests/check_main.h — what every Check suite's main() does: make its test cases, add its tests,
 * run it and count failures. One copy here instead of the same dozen lines in each of the ~40
 * test programs, so a main() reads as the list of its tests. */
#ifndef EPYQ_CHECK_MAIN_H
#define EPYQ_CHECK_MAIN_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>

/* A new test case of suite s named name; timeout_s > 0 replaces Check's default timeout. */
static inline TCase *epyq_test_case(Suite *s, const char *name, double timeout_s) {
    TCase *tc = tcase_create(name);
    if (timeout_s > 0) tcase_set_timeout(tc, timeout_s);
    suite_add_tcase(s, tc);
    return tc;
}

/* Adds tests[0..n) to tc in that order. */
static inline void epyq_test_add(TCase *tc, const TTest *const *tests, size_t n) {
    for (size_t i = 0; i < n; i++) tcase_add_test(tc, tests[i]);
}

/* EPYQ_TESTS_ADD(tc, test_a, test_b, ...): the tests named by START_TEST, in that order. */
#define EPYQ_TESTS_ADD(tc, ...)                                                                    \
    epyq_test_add((tc), (const TTest *const[]){__VA_ARGS__},                                       \
                  sizeof((const TTest *const[]){__VA_ARGS__}) / sizeof(const TTest *))

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
