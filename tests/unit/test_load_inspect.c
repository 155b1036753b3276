/* tests/unit/test_load_inspect.c — the built `epyq inspect` program: exit codes, the one-line
 * error contract, --json contents (bytes per decoded token by the docs/architecture.md §7.2 rule,
 * computed here from the dimensions), and every folder of ../shared/fixtures/models when
 * present. */
#include <check.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/util.h"
#include "tests/check_main.h"
#include "tests/files/tiny_ckpt.h"
#include "tests/testutil.h"

typedef struct {
    int rc;
    char *out, *err;
} result;

/* Run `epyq inspect <args...>` capturing stdout and stderr. */
static result run(const char *a1, const char *a2, const char *a3, const char *a4) {
    char *tmp = epyq_test_tmpdir(), po[4200], pe[4200];
    snprintf(po, sizeof po, "%s/out", tmp);
    snprintf(pe, sizeof pe, "%s/err", tmp);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fo = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(pe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        const char *bin = epyq_test_bin();
        execl(bin, bin, "inspect", a1, a2, a3, a4, (char *)NULL);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    result r = {WIFEXITED(status) ? WEXITSTATUS(status) : -1, NULL, NULL};
    epyq_err err;
    ck_assert_int_eq(epyq_file_read(po, 1 << 24, &r.out, NULL, &err), EPYQ_OK);
    ck_assert_int_eq(epyq_file_read(pe, 1 << 24, &r.err, NULL, &err), EPYQ_OK);
    unlink(po);
    unlink(pe);
    rmdir(tmp);
    free(tmp);
    return r;
}

static void result_free(result *r) {
    free(r->out);
    free(r->err);
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static char *tiny(epyq_qformat fmt) {
    tc_opts o = tc_defaults(fmt);
    char *dir = tc_write_tmp(&o, NULL, NULL);
    ck_assert_ptr_nonnull(dir);
    return dir;
}

static void rm_dir(char *dir) { ck_assert_int_eq(epyq_test_rm_dir(dir), 0); }

static double jnum(const cJSON *o, const char *path1, const char *path2) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, path1);
    if (path2) it = cJSON_GetObjectItemCaseSensitive(it, path2);
    ck_assert_msg(cJSON_IsNumber(it), "no number at %s.%s", path1, path2 ? path2 : "");
    return it->valuedouble;
}

/* Parameters one decoded token reads in the tiny model (docs/architecture.md §7.2 rule), by
 * hand. */
static double tiny_token_params(void) {
    double H = TC_H;
    double gdn = TC_CONV * H + TC_HV * TC_DV * H + 2.0 * TC_HV * H + H * TC_HV * TC_DV + TC_CONV * 4.0 + 2.0 * TC_HV + TC_DV;
    double attn = 2.0 * TC_NQ * TC_HD * H + 2.0 * TC_NKV * TC_HD * H + H * TC_NQ * TC_HD + 2.0 * TC_HD;
    double moe = TC_E * H + TC_TOPK * 3.0 * TC_I * H + 3.0 * TC_IS * H + H;
    double norms = TC_LAYERS * 2.0 * H + H + H; /* layer norms, final norm, one embedding row */
    return gdn + attn + TC_LAYERS * moe + norms + TC_V * H;
}

START_TEST(good_folder) {
    char *dir = tiny(EPYQ_QF_CT);
    result r = run("-m", dir, NULL, NULL);
    ck_assert_msg(r.rc == 0, "rc %d: %s", r.rc, r.err);
    ck_assert_str_eq(r.err, "");
    ck_assert_ptr_nonnull(strstr(r.out, "validation   : OK"));
    ck_assert_ptr_nonnull(strstr(r.out, "format       : ct, int4 group 128, symmetric"));
    result_free(&r);
    r = run("-m", dir, "--json", "--check-tensors");
    ck_assert_msg(r.rc == 0, "rc %d: %s", r.rc, r.err);
    cJSON *j = cJSON_Parse(r.out);
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(j, "format")->valuestring, "ct");
    ck_assert_int_eq((int)jnum(cJSON_GetObjectItemCaseSensitive(j, "precision"), "experts", "int4_count"), 2 * TC_E * 3);
    ck_assert_int_eq((int)jnum(cJSON_GetObjectItemCaseSensitive(j, "precision"), "router", "dense_count"), 2);
    ck_assert(jnum(j, "params_per_token", NULL) == tiny_token_params());
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "validation"), "tensors_decoded")));
    cJSON_Delete(j);
    result_free(&r);
    rm_dir(dir);
    /* BF16: every parameter read is 2 bytes */
    dir = tiny(EPYQ_QF_NONE);
    r = run("-m", dir, "--json", NULL);
    ck_assert_int_eq(r.rc, 0);
    j = cJSON_Parse(r.out);
    ck_assert(jnum(j, "bytes_per_token", NULL) == 2 * tiny_token_params());
    cJSON_Delete(j);
    result_free(&r);
    rm_dir(dir);
}
END_TEST

START_TEST(bad_folder) {
    char *dir = tiny(EPYQ_QF_GPTQ);
    char p[4200];
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    FILE *f = fopen(p, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    ck_assert_int_eq(truncate(p, size - 100), 0);
    result r = run("-m", dir, NULL, NULL);
    ck_assert_int_eq(r.rc, 1);
    ck_assert_str_eq(r.out, "");
    ck_assert_int_eq(count_lines(r.err), 1);
    ck_assert_msg(!strncmp(r.err, "epyq: ", 6), "%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.err, "model-00001-of-00002.safetensors"));
    ck_assert_ptr_nonnull(strstr(r.err, "MetadataIncompleteBuffer"));
    result_free(&r);
    rm_dir(dir);
    r = run("-m", "/nonexistent/epyq-folder", "--json", NULL);
    ck_assert_int_eq(r.rc, 1);
    ck_assert_int_eq(count_lines(r.err), 1);
    ck_assert_ptr_nonnull(strstr(r.err, "/nonexistent/epyq-folder"));
    result_free(&r);
}
END_TEST

/* A folder of format fmt (sym or not) with one 16-bit value or one 32-bit word of `tensor`
 * replaced; NULL tensor: unchanged. */
static char *tiny_poked(epyq_qformat fmt, bool sym, int gptq_version, const char *tensor, size_t index,
                        int width, uint32_t value) {
    tc_opts o = tc_defaults(fmt);
    o.sym = sym;
    if (gptq_version) o.gptq_version = gptq_version;
    char *dir = epyq_test_tmpdir();
    tc_list l = {0};
    tc_model(&l, &o);
    if (tensor) {
        tc_tensor *t = tc_find(&l, tensor);
        ck_assert_msg(t != NULL, "%s", tensor);
        ck_assert_uint_le((index + 1) * (size_t)width, t->nbytes);
        if (width == 2) {
            uint16_t h = (uint16_t)value;
            memcpy(t->data + 2 * index, &h, 2);
        } else {
            memcpy(t->data + 4 * index, &value, 4);
        }
    }
    ck_assert_int_eq(tc_write(dir, &l, &o), 0);
    tc_free(&l);
    return dir;
}

/* `epyq inspect -m dir` fails with one line holding every needle. */
static void expect_refused(char *dir, const char *n1, const char *n2, const char *n3) {
    result r = run("-m", dir, NULL, NULL);
    ck_assert_msg(r.rc == 1, "rc %d, out %s", r.rc, r.out);
    ck_assert_str_eq(r.out, "");
    ck_assert_int_eq(count_lines(r.err), 1);
    const char *n[] = {n1, n2, n3};
    for (int i = 0; i < 3; i++) ck_assert_msg(!n[i] || strstr(r.err, n[i]), "'%s' not in: %s", n[i], r.err);
    result_free(&r);
    rm_dir(dir);
}

#define EXP "model.language_model.layers.1.mlp.experts.2."

START_TEST(scales_checked_by_default) {
    /* CT weight_scale [N][Gn], Gn = 1 here: element 5 is output row 5, group 0. Before issue
     * 13 a NaN here said "validation: OK" unless --check-tensors was given. */
    expect_refused(tiny_poked(EPYQ_QF_CT, true, 0, EXP "up_proj.weight_scale", 5, 2, 0x7FC0),
                   EXP "up_proj.weight_scale", "output row 5, group 0", "found NaN");
    expect_refused(tiny_poked(EPYQ_QF_CT, true, 0, EXP "up_proj.weight_scale", 7, 2, 0xFF80),
                   "output row 7, group 0", "found inf", NULL);
    /* GPTQ scales are F16 [Gn][N]: element 9 is row 9; -1.0 and +0 */
    expect_refused(tiny_poked(EPYQ_QF_GPTQ, true, 2, EXP "down_proj.scales", 9, 2, 0xBC00),
                   EXP "down_proj.scales", "scale -1 for output row 9, group 0", "negative");
    expect_refused(tiny_poked(EPYQ_QF_GPTQ, false, 1, EXP "gate_proj.scales", 3, 2, 0x0000),
                   "output row 3, group 0", "found zero", NULL);
    /* Quark BF16 [Gn][N] */
    expect_refused(tiny_poked(EPYQ_QF_QUARK, true, 0, EXP "gate_proj.weight_scale", 4, 2, 0x8000),
                   EXP "gate_proj.weight_scale", "output row 4", NULL);
    /* --check-tensors keeps the full decode and still names the scale */
    char *dir = tiny_poked(EPYQ_QF_CT, true, 0, EXP "up_proj.weight_scale", 5, 2, 0x7FC0);
    result r = run("-m", dir, "--check-tensors", NULL);
    ck_assert_int_eq(r.rc, 1);
    ck_assert_ptr_nonnull(strstr(r.err, EXP "up_proj.weight_scale"));
    result_free(&r);
    rm_dir(dir);
}
END_TEST

START_TEST(zero_points_checked_by_default) {
    /* GPTQ sym qzeros [Gn][N/8]: word 1 holds outputs 8..15 of group 0. v2 must store 8s,
     * v1 7s; slot 2 set to 5 (v2) is output 10. */
    expect_refused(tiny_poked(EPYQ_QF_GPTQ, true, 2, EXP "gate_proj.qzeros", 1, 4, 0x88888588u),
                   EXP "gate_proj.qzeros", "zero point 5 stored for output row 10, group 0", "expected 8");
    expect_refused(tiny_poked(EPYQ_QF_GPTQ, true, 1, EXP "gate_proj.qzeros", 0, 4, 0x77777777u + 1),
                   "zero point 8 stored for output row 0, group 0", "expected 7", NULL);
    /* Quark int4 (symmetric) stores signed zeros 0: a 3 in the first word's slot 0 is output 0 */
    expect_refused(tiny_poked(EPYQ_QF_QUARK, true, 0, EXP "down_proj.weight_zero_point", 0, 4, 3),
                   EXP "down_proj.weight_zero_point", "zero point 3", "expected 0");
    /* asymmetric zeros are free: the unchanged asym folders pass */
    const epyq_qformat fm[] = {EPYQ_QF_GPTQ, EPYQ_QF_CT, EPYQ_QF_QUARK, EPYQ_QF_AWQ};
    for (int i = 0; i < 4; i++) {
        char *dir = tiny_poked(fm[i], fm[i] == EPYQ_QF_AWQ ? false : i % 2 == 0, 1, NULL, 0, 0, 0);
        result r = run("-m", dir, NULL, NULL);
        ck_assert_msg(r.rc == 0, "format %d: %s", (int)fm[i], r.err);
        ck_assert_ptr_nonnull(strstr(r.out, "int4 scales / zero points / g_idx checked"));
        result_free(&r);
        rm_dir(dir);
    }
}
END_TEST

START_TEST(gidx_checked_by_default) {
    /* in_features 128 at group 128 is one group: g_idx 1 is out of range */
    expect_refused(tiny_poked(EPYQ_QF_GPTQ, true, 2, EXP "up_proj.g_idx", 17, 4, 1), EXP "up_proj.g_idx",
                   "g_idx[17] = 1", "[0, 1)");
}
END_TEST

START_TEST(unexpected_tensors_listed) {
    tc_opts o = tc_defaults(EPYQ_QF_CT);
    char *dir = epyq_test_tmpdir();
    tc_list l = {0};
    tc_model(&l, &o);
    tc_vec(&l, "model.language_model.layers.1.mlp.bias", 1, 4, 0, 0); /* one unexpected tensor */
    ck_assert_int_eq(tc_write(dir, &l, &o), 0);
    tc_free(&l);
    result r = run("-m", dir, NULL, NULL);
    ck_assert_int_eq(r.rc, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "1 unexpected tensors"));
    ck_assert_ptr_nonnull(strstr(r.out, "model.language_model.layers.1.mlp.bias"));
    result_free(&r);
    rm_dir(dir);
}
END_TEST

START_TEST(usage) {
    result r = run("--help", NULL, NULL, NULL);
    ck_assert_int_eq(r.rc, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "usage: epyq inspect -m DIR"));
    result_free(&r);
    r = run(NULL, NULL, NULL, NULL);
    ck_assert_int_eq(r.rc, 2);
    ck_assert_int_eq(count_lines(r.err), 1);
    result_free(&r);
    r = run("-m", "x", "--frobnicate", NULL);
    ck_assert_int_eq(r.rc, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "--frobnicate"));
    result_free(&r);
    r = run("-m", NULL, NULL, NULL);
    ck_assert_int_eq(r.rc, 2);
    result_free(&r);
}
END_TEST

START_TEST(fixture_folders) {
    static const struct {
        const char *name, *format;
        int int4;
    } f[] = {{"tiny-bf16", "bf16", 0}, {"tiny-bf16-fused", "bf16", 0}, {"tiny-gptq", "gptq", 192},
             {"tiny-ct", "ct", 223},   {"tiny-quark", "quark", 211}};
    if (!epyq_test_shared("fixtures/models")) {
        printf("skip: ../shared fixtures not found\n");
        return;
    }
    for (size_t i = 0; i < 5; i++) {
        char sub[128], dir[4096];
        snprintf(sub, sizeof sub, "fixtures/models/%s", f[i].name);
        snprintf(dir, sizeof dir, "%s", epyq_test_shared(sub));
        result r = run("-m", dir, "--json", NULL);
        ck_assert_msg(r.rc == 0, "%s: %s", f[i].name, r.err);
        cJSON *j = cJSON_Parse(r.out);
        ck_assert_ptr_nonnull(j);
        ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(j, "format")->valuestring, f[i].format);
        int n4 = 0;
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "precision");
        for (const cJSON *c = p->child; c; c = c->next) n4 += (int)jnum(c, "int4_count", NULL);
        ck_assert_int_eq(n4, f[i].int4);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "validation");
        ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(v, "unexpected")), 0);
        cJSON_Delete(j);
        result_free(&r);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("load_inspect");
    TCase *tc = epyq_test_case(s, "inspect", 120);
    EPYQ_TESTS_ADD(tc, good_folder, bad_folder, scales_checked_by_default,
                   zero_points_checked_by_default, gidx_checked_by_default,
                   unexpected_tensors_listed, usage, fixture_folders);
    return epyq_test_run(s);
}
