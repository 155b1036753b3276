/* tests/unit/test_vision_fixture.c — image input against ../shared/fixtures/models/tiny-vision
 * (its expected/README.md gives the bounds): the PNGs decode to the stored RGB bytes, the patch
 * matrices equal pixel_values*.f32 (max |d| <= 1e-6), the tower's image embeddings are within
 * the bounds (float64 twin and the exact path: fp32 tier 1e-3 x max|e|; the default bf16 path:
 * 3e-2 x max|e|), two images in one call equal each alone bit for bit, and the resize golden
 * (Pillow 9.4 BICUBIC of input.png to smart_resize's 224 x 320) is matched within 1 level on >= 99%
 * of values. Exits 77 (skip) when ../shared is absent. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "ref/ref_vision.h"
#include "tests/check_main.h"
#include "tests/e2e/conform.h"
#include "tests/testutil.h"
#include "vision/image.h"
#include "vision/preproc.h"
#include "vision/vision.h"

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

/* Patches of a fixture image (stored u8 pixels, no resize: README §1). */
static void load_input(const char *u8, int h, int w, epyq_vision_input *in) {
    uint8_t *raw = read_bytes(g_exp, u8, (size_t)h * w * 3);
    epyq_vision_pp pp;
    epyq_err err = {0};
    ck_assert_msg(epyq_vision_pp_load(&pp, g_dir, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert(epyq_vision_patchify(&pp, raw, h, w, in, &err) == EPYQ_OK);
    free(raw);
}

static double max_abs(const float *e, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(e[i]));
    return m;
}

static const struct {
    const char *u8, *emb;
    int h, w;
} imgs[2] = {{"image.u8", "image_embeds.f32", 64, 96}, {"image2.u8", "image_embeds2.f32", 160, 96}};

START_TEST(embeds_ref) {
    epyq_vision_config vc;
    bool present;
    epyq_err err = {0};
    ck_assert_msg(epyq_vision_config_load(&vc, g_dir, &present, &err) == EPYQ_OK && present, "%s",
                  err.msg);
    epyq_ckpt *ck = NULL;
    ck_assert_msg(epyq_ckpt_open(&ck, g_dir, &err) == EPYQ_OK, "%s", err.msg);
    epyq_vision_w w;
    ck_assert_msg(epyq_vision_bind(&w, ck, &vc, &err) == EPYQ_OK, "%s", err.msg);
    for (int i = 0; i < 2; i++) {
        epyq_vision_input in;
        load_input(imgs[i].u8, imgs[i].h, imgs[i].w, &in);
        int32_t T = epyq_vision_tokens(&vc, in.gh, in.gw);
        size_t n = (size_t)T * vc.out_hidden;
        double *got = malloc(n * sizeof *got), md = 0;
        float *e = conform_read_f32(g_dir, imgs[i].emb, n);
        ck_assert(e);
        ck_assert_msg(epyq_ref_vision_encode(&w, &in, got, &err) == EPYQ_OK, "%s", err.msg);
        for (size_t j = 0; j < n; j++) md = fmax(md, fabs(got[j] - e[j]));
        double bound = 1e-3 * max_abs(e, n);
        printf("ref float64 %s: max |d| %.3g (bound %.3g, fp32 tier)\n", imgs[i].emb, md, bound);
        ck_assert_msg(md <= bound, "%s: %g > %g", imgs[i].emb, md, bound);
        free(got), free(e);
        epyq_vision_input_free(&in);
    }
    epyq_vision_w_free(&w);
    epyq_ckpt_free(ck);
}
END_TEST

static void embeds_runtime(bool exact, bool no_dnnl) {
    epyq_vision *v = NULL;
    epyq_err err = {0};
    epyq_vision_opts o = {.n_threads = 2, .exact = exact, .no_dnnl = no_dnnl};
    ck_assert_msg(epyq_vision_load(&v, g_dir, &o, &err) == EPYQ_OK, "%s", err.msg);
    const epyq_vision_config *vc = epyq_vision_cfg(v);
    epyq_vision_input in[2];
    size_t n[2], tot = 0;
    float *alone[2];
    for (int i = 0; i < 2; i++) {
        load_input(imgs[i].u8, imgs[i].h, imgs[i].w, &in[i]);
        n[i] = (size_t)epyq_vision_tokens(vc, in[i].gh, in[i].gw) * vc->out_hidden;
        alone[i] = malloc(n[i] * sizeof(float));
        ck_assert_msg(epyq_vision_encode(v, &in[i], 1, alone[i], &err) == EPYQ_OK, "%s", err.msg);
        float *e = conform_read_f32(g_dir, imgs[i].emb, n[i]);
        ck_assert(e);
        double md = 0, bound = (exact ? 1e-3 : 3e-2) * max_abs(e, n[i]);
        for (size_t j = 0; j < n[i]; j++) md = fmax(md, fabs((double)alone[i][j] - e[j]));
        printf("tower %s%s %s: max |d| %.3g (bound %.3g, %s tier)\n", exact ? "exact" : "bf16",
               no_dnnl ? " kernels" : "", imgs[i].emb, md, bound, exact ? "fp32" : "bf16");
        ck_assert_msg(md <= bound, "%s: %g > %g", imgs[i].emb, md, bound);
        free(e);
        tot += n[i];
    }
    /* one call on both images: block-diagonal attention gives each image's rows unchanged */
    float *both = malloc(tot * sizeof(float));
    ck_assert_msg(epyq_vision_encode(v, in, 2, both, &err) == EPYQ_OK, "%s", err.msg);
    /* bit for bit on the kernel table; oneDNN (84 rows here, 24 and 60 alone) sums in its own
     * order, so then only within rounding */
    bool bits = exact || no_dnnl;
    double dmax = 0;
    for (size_t j = 0; j < tot; j++)
        dmax = fmax(dmax, fabs((double)both[j] - (j < n[0] ? alone[0][j] : alone[1][j - n[0]])));
    ck_assert_msg(bits ? dmax == 0 : dmax < 1e-2, "two images in one call vs alone: max |d| %g",
                  dmax);
    free(both);
    /* one thread gives the same bits as two */
    epyq_vision *v1 = NULL;
    epyq_vision_opts o1 = {.n_threads = 1, .exact = exact, .no_dnnl = no_dnnl};
    ck_assert_msg(epyq_vision_load(&v1, g_dir, &o1, &err) == EPYQ_OK, "%s", err.msg);
    float *one = malloc(n[1] * sizeof(float));
    ck_assert(epyq_vision_encode(v1, &in[1], 1, one, &err) == EPYQ_OK);
    ck_assert(!memcmp(one, alone[1], n[1] * 4));
    free(one);
    epyq_vision_free(v1);
    for (int i = 0; i < 2; i++) free(alone[i]), epyq_vision_input_free(&in[i]);
    epyq_vision_free(v);
}

START_TEST(embeds_bf16) { embeds_runtime(false, false); }
END_TEST

START_TEST(embeds_bf16_kernels) { embeds_runtime(false, true); }
END_TEST

START_TEST(embeds_exact) { embeds_runtime(true, false); }
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
    TCase *tc = epyq_test_case(s, "all", 120);
    EPYQ_TESTS_ADD(tc, pixel_values, resize_golden, embeds_ref, embeds_bf16, embeds_bf16_kernels,
                   embeds_exact);
    return epyq_test_failures(s, true) ? 1 : 0;
}
