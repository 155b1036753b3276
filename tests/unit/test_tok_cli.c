/* tests/unit/test_tok_cli.c — `epyq tokenize` / `epyq detokenize` through the built binary:
 * output format, --jsonl (texts with newlines and NULs, a malformed line named in the error),
 * invalid UTF-8 on stdin, round trips, --help and usage errors. On the tiny tokenizer of
 * tok_tiny.h always; with ../shared also the whole golden corpus through --jsonl. */
#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/util.h"
#include "tests/check_main.h"
#include "tests/testutil.h"
#include "tests/unit/tok_tiny.h"
#include "tok/sbuf.h"

static char *g_dir, *g_tmp;

typedef struct {
    int status;
    char *out, *err;
    size_t out_len;
} run_result;

/* Run `epyq <args>` with stdin = input; collect exit status, stdout and stderr. */
static run_result run(const char *args, const char *input, size_t in_len) {
    char *in = epyq_path_join(g_tmp, "in"), *out = epyq_path_join(g_tmp, "out"), *err = epyq_path_join(g_tmp, "err");
    epyq_err e;
    ck_assert(epyq_file_write_atomic(in, input, in_len, &e) == EPYQ_OK);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s < '%s' > '%s' 2> '%s'", epyq_test_bin(), args, in, out, err);
    int st = system(cmd);
    run_result r = {.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1};
    size_t el;
    ck_assert(epyq_file_read(out, 256u << 20, &r.out, &r.out_len, &e) == EPYQ_OK);
    ck_assert(epyq_file_read(err, 1u << 20, &r.err, &el, &e) == EPYQ_OK);
    free(in);
    free(out);
    free(err);
    return r;
}

static void done(run_result *r) {
    free(r->out);
    free(r->err);
}

static void setup(void) {
    g_dir = tok_tiny_default();
    g_tmp = epyq_test_tmpdir();
    ck_assert(g_dir && g_tmp);
}

static char *args_for(const char *cmd, const char *dir, const char *extra) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s -m '%s' %s", cmd, dir, extra);
    return buf;
}

START_TEST(tokenize_all_stdin) {
    run_result r = run(args_for("tokenize", g_dir, ""), "hello the", 9);
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_str_eq(r.out, "[257, 259, 111, 258]\n");
    done(&r);
    /* invalid UTF-8: the 0xFF byte is U+FFFD (EF BF BD) */
    r = run(args_for("tokenize", g_dir, ""), "a\xFF", 2);
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_str_eq(r.out, "[97, 239, 191, 189]\n");
    done(&r);
    r = run(args_for("tokenize", g_dir, ""), "", 0);
    ck_assert_str_eq(r.out, "[]\n");
    done(&r);
}
END_TEST

START_TEST(tokenize_jsonl) {
    static const char in[] = "{\"text\": \"a\\nb\"}\n\n{\"id\": 7, \"text\": \"<|end|>x\\u0000\"}\n";
    run_result r = run(args_for("tokenize", g_dir, "--jsonl"), in, sizeof in - 1);
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_str_eq(r.out, "{\"ids\": [97, 10, 98]}\n{\"ids\": [265, 120, 0]}\n");
    done(&r);
    /* --split-special spells the control token out */
    r = run(args_for("tokenize", g_dir, "--jsonl --split-special"), "{\"text\":\"<|end|>\"}\n", 18);
    ck_assert_str_eq(r.out, "{\"ids\": [60, 124, 101, 110, 100, 124, 62]}\n");
    done(&r);
    /* a malformed second line: exit 1, the message names the line; the first line was printed */
    static const char bad[] = "{\"text\": \"a\"}\n{\"text\": \"b\",}\n{\"text\": \"c\"}\n";
    r = run(args_for("tokenize", g_dir, "--jsonl"), bad, sizeof bad - 1);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "line 2") != NULL, "%s", r.err);
    ck_assert_str_eq(r.out, "{\"ids\": [97]}\n");
    done(&r);
    r = run(args_for("tokenize", g_dir, "--jsonl"), "{\"txt\": \"a\"}\n", 13);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "line 1") && strstr(r.err, "\"text\""), "%s", r.err);
    done(&r);
}
END_TEST

START_TEST(detokenize_round_trip) {
    run_result r = run(args_for("detokenize", g_dir, ""), "[257, 259, 111, 258, 265, 9999]", 31);
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_str_eq(r.out, "hello the<|end|>");
    done(&r);
    r = run(args_for("detokenize", g_dir, "--skip-special"), " [258, 265, 195]\n", 17);
    ck_assert_str_eq(r.out, " the\xEF\xBF\xBD");
    done(&r);
    r = run(args_for("detokenize", g_dir, ""), "[1, -2]", 7);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "element 1") != NULL, "%s", r.err);
    done(&r);
    r = run(args_for("detokenize", g_dir, ""), "{\"ids\": [1]}", 12);
    ck_assert_int_eq(r.status, 1);
    done(&r);
}
END_TEST

START_TEST(help_and_usage) {
    run_result r = run("tokenize --help", "", 0);
    ck_assert_int_eq(r.status, 0);
    ck_assert(strstr(r.out, "usage: epyq tokenize") != NULL);
    done(&r);
    r = run("detokenize --help", "", 0);
    ck_assert_int_eq(r.status, 0);
    ck_assert(strstr(r.out, "usage: epyq detokenize") != NULL);
    done(&r);
    r = run("tokenize --bogus", "", 0);
    ck_assert_int_eq(r.status, 2);
    done(&r);
    r = run("tokenize", "", 0);
    ck_assert_int_eq(r.status, 2);
    ck_assert(strstr(r.err, "-m") != NULL);
    done(&r);
    r = run("tokenize -m /nonexistent-epyq-dir", "x", 1);
    ck_assert_int_eq(r.status, 1);
    ck_assert(strncmp(r.err, "epyq: ", 6) == 0);
    done(&r);
}
END_TEST

/* The whole golden corpus through `tokenize --jsonl` (its lines carry "text" among other
 * keys), and one golden line back through detokenize. */
START_TEST(golden_through_cli) {
    const char *d = epyq_test_shared("fixtures/tokenizer");
    if (!d) {
        printf("SKIP golden_through_cli: ../shared not found\n");
        return;
    }
    char *dir = strdup(d), *path = epyq_path_join(dir, "golden_encode.jsonl"), *text;
    size_t len;
    epyq_err e;
    ck_assert(epyq_file_read(path, 64u << 20, &text, &len, &e) == EPYQ_OK);
    run_result r = run(args_for("tokenize", dir, "--jsonl"), text, len);
    ck_assert_msg(r.status == 0, "%s", r.err);
    size_t lines = 0, exact = 0;
    char *in = text, *out = r.out;
    while (*in) {
        char *in_nl = strchr(in, '\n'), *out_nl = strchr(out, '\n');
        ck_assert(out_nl != NULL);
        cJSON *want = cJSON_ParseWithLength(in, in_nl ? (size_t)(in_nl - in) : strlen(in));
        cJSON *got = cJSON_ParseWithLength(out, (size_t)(out_nl - out));
        lines++;
        exact += cJSON_Compare(cJSON_GetObjectItem(want, "ids"), cJSON_GetObjectItem(got, "ids"), true);
        cJSON_Delete(want);
        cJSON_Delete(got);
        out = out_nl + 1;
        if (!in_nl) break;
        in = in_nl + 1;
    }
    printf("golden corpus through epyq tokenize --jsonl: %zu / %zu lines exact\n", exact, lines);
    ck_assert_uint_eq(lines, 398);
    ck_assert_uint_eq(exact, lines);
    done(&r);
    /* specials_mixed of decode_cases.jsonl */
    r = run(args_for("detokenize", dir, ""), "[248045, 872, 198, 6023, 248046, 198, 248068, 198]", 50);
    ck_assert_str_eq(r.out, "<|im_start|>user\nhi<|im_end|>\n<think>\n");
    done(&r);
    free(text);
    free(path);
    free(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("tok_cli");
    TCase *tc = epyq_test_case(s, "cli", 120);
    tcase_add_unchecked_fixture(tc, setup, NULL);
    EPYQ_TESTS_ADD(tc, tokenize_all_stdin, tokenize_jsonl, detokenize_round_trip, help_and_usage,
                   golden_through_cli);
    return epyq_test_run(s);
}
