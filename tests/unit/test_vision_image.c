/* tests/unit/test_vision_image.c — image input without the fixtures: PNG variants decode to the
 * pixels that were encoded (grey, palette-free RGB, RGBA with alpha dropped, 16-bit, Adam7), a
 * JPEG decodes close to its source, smart_resize against hand-worked cases of the HF rule, the
 * patch order of docs/vision.md §2 on a hand-made image, and every bad-image case refused with
 * one E_FORMAT line naming the file (printed as a table). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check_main.h"
#include "tests/files/img_enc.h"
#include "vision/image.h"
#include "vision/preproc.h"
#include "vision/vision.h"

START_TEST(png_variants) {
    const int w = 37, h = 21;
    for (int ch = 1; ch <= 4; ch++)
        for (int depth = 8; depth <= 16; depth += 8)
            for (int il = 0; il < 2; il++) {
                uint8_t *px = img_pattern(w, h, ch);
                size_t n;
                uint8_t *png = img_png(px, w, h, ch, depth, il, &n);
                epyq_image im;
                epyq_err err = {0};
                ck_assert_msg(epyq_image_decode(&im, png, n, "t.png", 0, &err) == EPYQ_OK, "%s",
                              err.msg);
                ck_assert(im.w == w && im.h == h);
                for (int i = 0; i < w * h; i++)
                    for (int c = 0; c < 3; c++) {
                        /* grey is replicated; alpha (the last of 2 or 4 channels) is dropped */
                        int src = ch <= 2 ? px[i * ch] : px[i * ch + c];
                        ck_assert_msg(im.rgb[i * 3 + c] == src, "ch %d depth %d il %d pixel %d", ch,
                                      depth, il, i);
                    }
                epyq_image_free(&im);
                free(png), free(px);
            }
}
END_TEST

START_TEST(jpeg_decodes) {
    const int w = 48, h = 40;
    for (int prog = 0; prog < 2; prog++)
        for (int ch = 1; ch <= 3; ch += 2) {
            uint8_t *px = malloc((size_t)w * h * ch); /* smooth: JPEG's error stays small */
            for (int i = 0; i < w * h * ch; i++)
                px[i] = (uint8_t)((i / ch % w) * 2 + (i / ch / w) * 3 + (i % ch) * 20);
            size_t n;
            uint8_t *j = img_jpeg(px, w, h, ch, 98, prog, &n);
            epyq_image im;
            epyq_err err = {0};
            ck_assert_msg(epyq_image_decode(&im, j, n, "t.jpg", 0, &err) == EPYQ_OK, "%s", err.msg);
            ck_assert(im.w == w && im.h == h);
            double sad = 0;
            for (int i = 0; i < w * h; i++)
                for (int c = 0; c < 3; c++)
                    sad += abs(im.rgb[i * 3 + c] - px[i * ch + (ch == 3 ? c : 0)]);
            ck_assert_msg(sad / (w * h * 3) < 2.0, "mean abs error %g", sad / (w * h * 3));
            epyq_image_free(&im);
            free(j), free(px);
        }
}
END_TEST

/* Values worked from the rule by hand (checked with a Python transcription of it) (factor 32,
 * Python round half-to-even). */
START_TEST(smart_resize_cases) {
    static const struct {
        int64_t h, w, mn, mx;
        int32_t eh, ew;
    } cs[] = {
        {100, 150, 65536, 16777216, 224, 320}, /* upscale: beta = sqrt(65536/15000) */
        {64, 96, 4096, 16777216, 64, 96},      /* multiples of 32, inside the range: kept */
        {48, 80, 1024, 16777216, 64, 64},      /* 1.5 -> 2 (even), 2.5 -> 2 (even) */
        {1000, 1000, 65536, 262144, 512, 512}, /* shrink: beta = sqrt(1e6/262144) */
        {10, 1990, 1024, 16777216, 32, 480},   /* ratio 199: round(10/32) = 0 -> grow */
        {3000, 40, 65536, 65536, 2208, 32},    /* shrink keeps the short side >= 32 */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        int32_t oh = 0, ow = 0;
        epyq_err err = {0};
        ck_assert_msg(epyq_vision_smart_resize(cs[i].h, cs[i].w, 32, cs[i].mn, cs[i].mx, &oh, &ow,
                                               &err) == EPYQ_OK,
                      "%s", err.msg);
        ck_assert_msg(oh == cs[i].eh && ow == cs[i].ew, "case %zu: %dx%d, expected %dx%d", i, oh,
                      ow, cs[i].eh, cs[i].ew);
    }
    int32_t oh, ow;
    epyq_err err = {0};
    ck_assert(epyq_vision_smart_resize(10, 2100, 32, 1024, 1 << 24, &oh, &ow, &err) == EPYQ_E_ARG);
    ck_assert(strstr(err.msg, "aspect ratio"));
}
END_TEST

/* An image whose every sample encodes its own (row, col, channel) checks the patch layout. */
START_TEST(patch_order) {
    epyq_vision_pp pp = {
        .patch = 2, .temporal = 2, .merge = 2, .do_rescale = false, .do_normalize = false};
    const int w = 8, h = 4; /* grid 2 x 4 of 2x2 patches, merged 1 x 2 */
    uint8_t rgb[4 * 8 * 3];
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) rgb[(y * w + x) * 3 + c] = (uint8_t)(y * 32 + x * 3 + c);
    epyq_vision_input in;
    epyq_err err = {0};
    ck_assert(epyq_vision_patchify(&pp, rgb, h, w, &in, &err) == EPYQ_OK);
    ck_assert(in.gh == 2 && in.gw == 4 && in.n == 8 && in.cols == 24);
    for (int row = 0; row < 8; row++) {
        int iw = row % 2, ih = (row / 2) % 2, bw = (row / 4) % 2, bh = 0; /* gw/2 = 2 blocks */
        int r = bh * 2 + ih, cc = bw * 2 + iw;
        for (int c = 0; c < 3; c++)
            for (int t = 0; t < 2; t++)
                for (int py = 0; py < 2; py++)
                    for (int px = 0; px < 2; px++) {
                        float want = (float)((r * 2 + py) * 32 + (cc * 2 + px) * 3 + c);
                        ck_assert(in.pix[row * 24 + c * 8 + t * 4 + py * 2 + px] == want);
                    }
    }
    epyq_vision_input_free(&in);
}
END_TEST

typedef struct {
    const char *name;
    uint8_t *data;
    size_t len;
    const char *needle;
} bad_case;

static void add(bad_case *b, int *n, const char *name, const uint8_t *d, size_t len,
                const char *needle) {
    b[*n].name = name;
    b[*n].data = malloc(len ? len : 1);
    if (len) memcpy(b[*n].data, d, len);
    b[*n].len = len;
    b[*n].needle = needle;
    (*n)++;
}

START_TEST(bad_images) {
    bad_case b[32];
    int n = 0;
    const int w = 64, h = 48;
    uint8_t *px = img_pattern(w, h, 3);
    size_t pl, jl, cl;
    uint8_t *png = img_png(px, w, h, 3, 8, 0, &pl), *jpg = img_jpeg(px, w, h, 3, 90, 0, &jl);
    uint8_t *cmykpx = img_pattern(16, 16, 4), *cmyk = img_jpeg(cmykpx, 16, 16, 4, 90, 0, &cl);
    add(b, &n, "empty file", NULL, 0, "empty");
    add(b, &n, "text", (const uint8_t *)"hello, world", 12, "unsupported format");
    add(b, &n, "GIF", (const uint8_t *)"GIF89a\x01\x00\x01\x00\x00\x00\x00;", 14, "GIF");
    add(b, &n, "PNG signature only", png, 8, "corrupt PNG");
    add(b, &n, "PNG cut in IHDR", png, 20, "corrupt PNG");
    add(b, &n, "PNG cut in IDAT", png, pl / 2, "corrupt PNG");
    add(b, &n, "PNG without IEND", png, pl - 12, "corrupt PNG");
    add(b, &n, "PNG IDAT byte flipped", png, pl, "corrupt PNG");
    b[n - 1].data[pl / 2] ^= 0x55;
    add(b, &n, "PNG 60000x60000 (bomb)", png, pl, "at most");
    img_png_set_size(b[n - 1].data, 60000, 60000);
    add(b, &n, "PNG IHDR width 0", png, pl, "corrupt PNG");
    img_png_set_size(b[n - 1].data, 0, 48);
    add(b, &n, "JPEG SOI only", jpg, 3, "JPEG");
    add(b, &n, "JPEG cut in half", jpg, jl / 2, "JPEG");
    add(b, &n, "JPEG without EOI", jpg, jl - 2, "JPEG");
    add(b, &n, "JPEG 65000x65000 (bomb)", jpg, jl, "at most");
    ck_assert(img_jpeg_set_size(b[n - 1].data, jl, 65000, 65000));
    add(b, &n, "JPEG scan garbage", jpg, jl, "JPEG");
    for (size_t i = jl / 2; i < jl / 2 + 64; i++) b[n - 1].data[i] = 0xff;
    add(b, &n, "JPEG CMYK", cmyk, cl, "CMYK");
    printf("| case | bytes | result |\n|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        epyq_image im;
        epyq_err err = {0};
        epyq_status st = epyq_image_decode(&im, b[i].data, b[i].len, "bad.img", 0, &err);
        printf("| %s | %zu | %s: %s |\n", b[i].name, b[i].len, epyq_status_name(st), err.msg);
        ck_assert_msg(st == EPYQ_E_FORMAT, "%s: accepted (%s)", b[i].name, epyq_status_name(st));
        ck_assert_msg(!strncmp(err.msg, "bad.img: ", 9) && strstr(err.msg, b[i].needle) &&
                          !strchr(err.msg, '\n'),
                      "%s: message '%s' (expected the file name and '%s')", b[i].name, err.msg,
                      b[i].needle);
        free(b[i].data);
    }
    /* a file that does not exist names itself too */
    epyq_image im;
    epyq_err err = {0};
    ck_assert(epyq_image_load(&im, "/nonexistent/x.png", &err) != EPYQ_OK);
    ck_assert(strstr(err.msg, "/nonexistent/x.png"));
    /* the cap applies before decoding: a smaller cap refuses the intact file */
    ck_assert(epyq_image_decode(&im, png, pl, "cap.png", 1000, &err) == EPYQ_E_FORMAT);
    ck_assert(strstr(err.msg, "at most 1000 pixels"));
    free(png), free(jpg), free(px), free(cmyk), free(cmykpx);
}
END_TEST

START_TEST(pp_config) {
    epyq_vision_pp pp;
    epyq_err err = {0};
    const char *good =
        "{\"patch_size\":16,\"temporal_patch_size\":2,\"merge_size\":2,\"size\":{\"shortest_edge\":65536,"
        "\"longest_edge\":16777216},\"image_mean\":[0.5,0.5,0.5],\"image_std\":[0.5,0.5,0.5],\"resample\":3}";
    ck_assert_msg(epyq_vision_pp_parse(&pp, good, strlen(good), "p.json", &err) == EPYQ_OK, "%s",
                  err.msg);
    ck_assert(pp.patch == 16 && pp.min_pixels == 65536 && pp.max_pixels == 16777216 &&
              pp.std[2] == 0.5);
    const char *nosize =
        "{\"patch_size\":16,\"temporal_patch_size\":2,\"merge_size\":2,\"image_mean\":[0.5,0.5,0.5],"
        "\"image_std\":[0.5,0.5,0.5]}";
    ck_assert(epyq_vision_pp_parse(&pp, nosize, strlen(nosize), "p.json", &err) == EPYQ_E_FORMAT);
    ck_assert(strstr(err.msg, "p.json") && strstr(err.msg, "shortest_edge"));
}
END_TEST

/* vision_config: what changes the math is refused, naming the key */
static epyq_status vcfg(const char *vis, const char *text, epyq_vision_config *vc, epyq_err *err) {
    char buf[2048];
    bool present;
    snprintf(
        buf, sizeof buf,
        "{\"image_token_id\":1012,\"vision_start_token_id\":1009,\"vision_end_token_id\":1010,"
        "\"text_config\":{\"hidden_size\":256%s,\"rope_parameters\":{\"mrope_section\":[3,3,2],"
        "\"mrope_interleaved\":true}},\"vision_config\":{\"depth\":2,\"hidden_size\":64,"
        "\"intermediate_size\":128,\"num_heads\":2,\"patch_size\":16,\"temporal_patch_size\":2,"
        "\"spatial_merge_size\":2,\"out_hidden_size\":256,\"num_position_embeddings\":16%s}}",
        text, vis);
    return epyq_vision_config_parse(vc, buf, strlen(buf), "c.json", &present, err);
}

START_TEST(vision_config_rules) {
    epyq_vision_config vc;
    epyq_err err = {0};
    ck_assert_msg(vcfg("", "", &vc, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert(vc.head_dim == 32 && vc.pos_side == 4 && vc.rope_theta == 10000.0 &&
              vc.mrope_section[2] == 2);
    ck_assert(vcfg(",\"rope_parameters\":{\"rope_theta\":500.0}", "", &vc, &err) == EPYQ_OK &&
              vc.rope_theta == 500.0);
    static const struct {
        const char *vis, *text, *needle;
    } bad[] = {{",\"deepstack_visual_indexes\":[8]", "", "deepstack"},
               {",\"hidden_act\":\"silu\"", "", "hidden_act"},
               {"", ",\"hidden_size_x\":1", NULL}, /* control: still fine */
               {",\"in_channels\":4", "", "in_channels"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        epyq_status st = vcfg(bad[i].vis, bad[i].text, &vc, &err);
        if (!bad[i].needle) {
            ck_assert_msg(st == EPYQ_OK, "%s", err.msg);
            continue;
        }
        ck_assert_msg(st == EPYQ_E_FORMAT && strstr(err.msg, "c.json") &&
                          strstr(err.msg, bad[i].needle),
                      "case %zu: %s", i, err.msg);
    }
    /* out_hidden_size must be the text width: the rows replace token embeddings */
    char buf[512];
    bool present;
    snprintf(
        buf, sizeof buf,
        "{\"image_token_id\":1,\"vision_start_token_id\":2,\"vision_end_token_id\":3,\"text_config\":"
        "{\"hidden_size\":512,\"rope_parameters\":{\"mrope_section\":[3,3,2],\"mrope_interleaved\":true}},"
        "\"vision_config\":{\"depth\":1,\"hidden_size\":64,\"intermediate_size\":8,\"num_heads\":2,"
        "\"patch_size\":16,\"temporal_patch_size\":2,\"spatial_merge_size\":2,\"out_hidden_size\":256,"
        "\"num_position_embeddings\":16}}");
    ck_assert(epyq_vision_config_parse(&vc, buf, strlen(buf), "c.json", &present, &err) ==
              EPYQ_E_FORMAT);
    ck_assert(strstr(err.msg, "out_hidden_size 256") && strstr(err.msg, "512"));
    /* no vision_config: nothing to read, not an error */
    ck_assert(epyq_vision_config_parse(&vc, "{}", 2, "c.json", &present, &err) == EPYQ_OK &&
              !present);
}
END_TEST

int main(void) {
    Suite *s = suite_create("vision_image");
    TCase *tc = epyq_test_case(s, "all", 0);
    EPYQ_TESTS_ADD(tc, png_variants, jpeg_decodes, smart_resize_cases, patch_order, bad_images,
                   pp_config, vision_config_rules);
    return epyq_test_failures(s, true) ? 1 : 0;
}
