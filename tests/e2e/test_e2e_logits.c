/* tests/e2e/test_e2e_logits.c — the `epyq logits` conformance CLI end to end: exit codes,
 * the output file's layout (prompt rows, greedy decode rows, MTP draft rows), the runtime and
 * --ref engines against the tiny-ct fixture (distribution criteria / fp32 tier), and --ref vs
 * the runtime on a synthetic model when ../shared is absent. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/check_main.h"
#include "tests/e2e/conform.h"
#include "tests/e2e/synth_model.h"
#include "tests/testutil.h"

/* run `epyq logits ARGS` with stdout/stderr to files; returns the exit status */
static int run(const char *args, char *out, size_t outsz) {
    char cmd[8192], path[4096];
    char *tmp = epyq_test_tmpdir();
    out[0] = '\0';
    if (snprintf(path, sizeof path, "%s/stdout", tmp) >= (int)sizeof path ||
        snprintf(cmd, sizeof cmd, "'%s' logits %s > '%s' 2>&1", epyq_test_bin(), args, path) >= (int)sizeof cmd) {
        free(tmp);
        return -1;
    }
    int rc = system(cmd);
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(out, 1, outsz - 1, f);
        out[n] = '\0';
        fclose(f);
    }
    free(tmp);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

START_TEST(test_exit_codes) {
    char out[4096];
    ck_assert_int_eq(run("--help", out, sizeof out), 0);
    ck_assert(strstr(out, "usage: epyq logits"));
    ck_assert_int_eq(run("", out, sizeof out), 2);
    ck_assert_int_eq(run("-m /nonexistent --ids 1,x", out, sizeof out), 2);
    ck_assert_int_eq(run("-m /nonexistent --ids 1 --path a4", out, sizeof out), 2);
    ck_assert_int_eq(run("-m /nonexistent --ids 1", out, sizeof out), 1);
    ck_assert_msg(strncmp(out, "epyq: ", 6) == 0, "runtime failure message: %s", out);
}
END_TEST

START_TEST(test_fixture_ct) {
    const char *p = epyq_test_shared("fixtures/models/tiny-ct");
    if (!p) {
        printf("skip: ../shared not present\n");
        return;
    }
    char dir[4096], args[8192], out[8192], ids[1024] = "", file[4200];
    if (snprintf(dir, sizeof dir, "%s", p) >= (int)sizeof dir) return;
    int prompt[64], greedy[64];
    int n = conform_read_ids(dir, "prompt.json", "ids", prompt, 64);
    int ng = conform_read_ids(dir, "greedy.json", "ids", greedy, 64);
    ck_assert(n == 24 && ng == 16);
    for (int i = 0; i < n; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", prompt[i]);
    const int V = 1024, rows = n + ng - 1 + 2;
    float *e_pre = conform_read_f32(dir, "logits_prefill.f32", (size_t)n * V);
    float *e_dec = conform_read_f32(dir, "logits_decode.f32", (size_t)ng * V);
    float *e_mtp = conform_read_f32(dir, "mtp_logits.f32", (size_t)2 * V);
    char *tmp = epyq_test_tmpdir();
    for (int ref = 0; ref < 2; ref++) {
        snprintf(file, sizeof file, "%s/logits%d.f32", tmp, ref);
        ck_assert(snprintf(args, sizeof args, "-m '%s' --ids %s -n %d --mtp -t 2 -o '%s'%s", dir, ids, ng - 1,
                           file, ref ? " --ref" : "") < (int)sizeof args);
        ck_assert_msg(run(args, out, sizeof out) == 0, "%s", out);
        ck_assert(strstr(out, "\"drafts\": [53, 153]"));
        float *got = conform_read_f32_file(file, (size_t)rows * V);
        ck_assert_msg(got != NULL, "%s: expected %d rows of %d floats", file, rows, V);
        conform_stats a, b, c;
        conform_init(&a), conform_init(&b), conform_init(&c);
        conform_add(&a, e_pre, got, n, V);
        conform_add(&b, e_dec, got + (size_t)(n - 1) * V, ng, V);
        conform_add(&c, e_mtp, got + (size_t)(n + ng - 1) * V, 2, V);
        conform_print(ref ? "cli --ref prefill" : "cli prefill", &a);
        for (int i = 0; i < ng; i++)
            ck_assert_int_eq(conform_argmax_f(got + (size_t)(n - 1 + i) * V, V), greedy[i]);
        const conform_stats *all[3] = {&a, &b, &c};
        for (int k = 0; k < 3; k++) {
            if (ref) ck_assert(all[k]->max_abs < 1e-3 * all[k]->max_logit);
            else ck_assert(all[k]->kl_mean < 1e-3 && all[k]->kl_max < 1e-2 && all[k]->top1_ok == all[k]->top1_n);
        }
        free(got);
    }
    free(tmp), free(e_pre), free(e_dec), free(e_mtp);
}
END_TEST

START_TEST(test_synth_ref_vs_runtime) {
    char *dir = synth_model("ct", 11), *tmp = epyq_test_tmpdir();
    ck_assert(dir != NULL && tmp != NULL);
    char args[8192], out[8192], f_run[4200], f_ref[4200];
    snprintf(f_run, sizeof f_run, "%s/run.f32", tmp);
    snprintf(f_ref, sizeof f_ref, "%s/ref.f32", tmp);
    snprintf(args, sizeof args, "-m '%s' --ids 5,17,300,2,999,41,7,8 --mtp -t 2 -o '%s'", dir, f_run);
    ck_assert_msg(run(args, out, sizeof out) == 0, "%s", out);
    snprintf(args, sizeof args, "-m '%s' --ids 5,17,300,2,999,41,7,8 --mtp --ref -o '%s'", dir, f_ref);
    ck_assert_msg(run(args, out, sizeof out) == 0, "%s", out);
    /* 8 prompt rows + 2 MTP draft rows; vocab of the tiny synthetic shape */
    float *a = conform_read_f32_file(f_ref, (size_t)10 * 1024),
          *b = conform_read_f32_file(f_run, (size_t)10 * 1024);
    ck_assert(a && b);
    conform_stats st;
    conform_init(&st);
    conform_add(&st, a, b, 10, 1024);
    conform_print("cli synth runtime vs --ref", &st);
    ck_assert(st.kl_mean < 1e-3 && st.kl_max < 1e-2 && st.top1_ok == st.top1_n);
    free(a), free(b), free(dir), free(tmp);
}
END_TEST

int main(void) {
    Suite *s = suite_create("e2e_logits");
    TCase *tc = epyq_test_case(s, "cli", 0);
    EPYQ_TESTS_ADD(tc, test_exit_codes, test_fixture_ct, test_synth_ref_vs_runtime);
    return epyq_test_run(s);
}
