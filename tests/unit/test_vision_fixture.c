/* tests/unit/test_vision_fixture.c — image input against ../shared/fixtures/models/tiny-vision
 * (its expected/README.md gives the bounds): the PNGs decode to the stored RGB bytes, the patch
 * matrices equal pixel_values*.f32 (max |d| <= 1e-6), and the resize golden (Pillow 9.4 BICUBIC
 * of input.png to smart_resize's 224 x 320) is matched within 1 level on >= 99% of values.
 * Exits 77 (skip) when ../shared is absent. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "tests/e2e/conform.h"
#include "tests/testutil.h"
#include "vision/image.h"
#include "vision/preproc.h"

static char g_dir[4096], g_exp[4200];

static uint8_t *read_bytes(const char *dir, const char *name, size_t want) {
    char path[4400], *buf = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    epyq_err err = {0};
    ck_assert_msg(epyq_file_read(path, 64u << 20, &buf, &len, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_msg(len == want, "%s: %zu bytes, expected %zu", path, len, want);
    return (uint8_t *)buf;
}

static void check_image(const char *png, const char *u8, const char *pv, int h, int w) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", g_exp, png);
    epyq_image im;
    epyq_err err = {0};
    ck_assert_msg(epyq_image_load(&im, path, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert(im.w == w && im.h == h);
    uint8_t *raw = read_bytes(g_exp, u8, (size_t)h * w * 3);
    ck_assert_msg(!memcmp(raw, im.rgb, (size_t)h * w * 3), "%s decodes to other bytes than %s", png,
                  u8);
    epyq_vision_pp pp;
    ck_assert_msg(epyq_vision_pp_load(&pp, g_dir, &err) == EPYQ_OK, "%s", err.msg);
    epyq_vision_input in;
    ck_assert_msg(epyq_vision_prepare(&pp, &im, path, &in, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert(in.gh == h / 16 && in.gw == w / 16 && in.cols == 1536);
    float *e = conform_read_f32(g_dir, pv, (size_t)in.n * in.cols);
    ck_assert(e);
    double md = 0;
    for (size_t i = 0; i < (size_t)in.n * in.cols; i++)
        md = fmax(md, fabs((double)e[i] - in.pix[i]));
    printf("%s: grid %dx%d, pixel_values max |d| %.3g (bound 1e-6)\n", png, in.gh, in.gw, md);
    ck_assert_msg(md <= 1e-6, "%s: pixel_values max |d| %g", pv, md);
    free(e), free(raw);
    epyq_vision_input_free(&in);
    epyq_image_free(&im);
}

START_TEST(pixel_values) {
    check_image("image.png", "image.u8", "pixel_values.f32", 64, 96);
    check_image("image2.png", "image2.u8", "pixel_values2.f32", 160, 96);
}
END_TEST

START_TEST(resize_golden) {
    char rdir[4400], path[4500];
    snprintf(rdir, sizeof rdir, "%s/resize", g_exp);
    snprintf(path, sizeof path, "%s/input.png", rdir);
    epyq_image im;
    epyq_err err = {0};
    ck_assert_msg(epyq_image_load(&im, path, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert(im.h == 100 && im.w == 150);
    int32_t oh, ow; /* the real release's processor settings (resize.json) */
    ck_assert(epyq_vision_smart_resize(im.h, im.w, 32, 65536, 16777216, &oh, &ow, &err) == EPYQ_OK);
    ck_assert(oh == 224 && ow == 320);
    size_t n = (size_t)oh * ow * 3;
    uint8_t *got = malloc(n), *want = read_bytes(rdir, "resized.u8", n);
    ck_assert(epyq_vision_resize_bicubic(im.rgb, im.w, im.h, got, ow, oh, &err) == EPYQ_OK);
    size_t exact = 0, within1 = 0;
    int maxd = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)got[i] - want[i]);
        exact += d == 0, within1 += d <= 1;
        maxd = d > maxd ? d : maxd;
    }
    printf(
        "resize golden 150x100 -> 320x224: %.3f%% exact, %.3f%% within 1 level, max |d| %d (bound: >= 99%% within 1)\n",
        100.0 * exact / n, 100.0 * within1 / n, maxd);
    ck_assert_msg(within1 * 100 >= n * 99, "only %zu of %zu values within 1 level", within1, n);
    free(got), free(want);
    epyq_image_free(&im);
}
END_TEST

int main(void) {
    const char *p = epyq_test_shared("fixtures/models/tiny-vision");
    if (!p) {
        printf("skip: ../shared/fixtures/models/tiny-vision not present\n");
        return 77;
    }
    snprintf(g_dir, sizeof g_dir, "%s", p);
    snprintf(g_exp, sizeof g_exp, "%s/expected", g_dir);
    Suite *s = suite_create("vision_fixture");
    TCase *tc = tcase_create("all");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, pixel_values);
    tcase_add_test(tc, resize_golden);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
