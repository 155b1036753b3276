/* tests/unit/test_vision_lm.c — images in the language model, against
 * ../shared/fixtures/models/tiny-vision (expected/README.md): the M-RoPE positions and rope delta
 * of mrope.json exactly; prefill and teacher-forced decode logits of the prompt with an image on
 * both int4 numeric paths (A16, A8) within the bf16 tier (per-row KL mean < 1e-3, max < 1e-2
 * nats, top-1 on every row of margin > 0.05) and the greedy ids; positions of a two-image prompt
 * worked by hand; two images in one prompt fed in one batch or in chunks, and an image request
 * batched with a text-only one, give the bits of each run alone. Exits 77 without ../shared. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "load/json.h"
#include "model/model.h"
#include "tests/check_main.h"
#include "tests/e2e/conform.h"
#include "tests/testutil.h"
#include "vision/image.h"
#include "vision/mrope.h"
#include "vision/vision.h"

static char g_dir[4096];

/* The int array at `key` (or key[row] for a 2-D array) of expected/mrope.json; count. */
static int json_ints(const char *key, int row, int *out, int max) {
    char path[4200], *buf = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/expected/mrope.json", g_dir);
    epyq_err err = {0};
    ck_assert(epyq_file_read(path, 1 << 20, &buf, &len, &err) == EPYQ_OK);
    cJSON *o = cJSON_Parse(buf), *a = cJSON_GetObjectItem(o, key);
    if (row >= 0) a = cJSON_GetArrayItem(a, row);
    int n = cJSON_GetArraySize(a);
    ck_assert(n <= max);
    for (int i = 0; i < n; i++) out[i] = cJSON_GetArrayItem(a, i)->valueint;
    cJSON_Delete(o);
    free(buf);
    return n;
}

/* Encoded fixture image k (1 or 2), decoded from its PNG: rows [tokens][H] (malloc'd). */
static float *encode(epyq_vision *v, int k, int32_t grid[2], int32_t *tokens) {
    char path[4200];
    snprintf(path, sizeof path, "%s/expected/%s", g_dir, k == 1 ? "image.png" : "image2.png");
    epyq_image im;
    epyq_vision_input in;
    epyq_err err = {0};
    ck_assert_msg(epyq_image_load(&im, path, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_msg(epyq_vision_prepare(epyq_vision_preproc(v), &im, path, &in, &err) == EPYQ_OK,
                  "%s", err.msg);
    const epyq_vision_config *vc = epyq_vision_cfg(v);
    *tokens = epyq_vision_tokens(vc, in.gh, in.gw);
    grid[0] = in.gh, grid[1] = in.gw;
    float *rows = malloc((size_t)*tokens * vc->out_hidden * sizeof(float));
    ck_assert_msg(epyq_vision_encode(v, &in, 1, rows, &err) == EPYQ_OK, "%s", err.msg);
    epyq_vision_input_free(&in);
    epyq_image_free(&im);
    return rows;
}

/* embd[i]: the next image row for every pad, in order (rows of all images concatenated). */
static const float **pad_rows(const epyq_vision_config *vc, const int *ids, int n,
                              const float *rows) {
    const float **e = calloc((size_t)n, sizeof *e);
    int r = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] == vc->image_token_id) e[i] = rows + (size_t)r++ * vc->out_hidden;
    return e;
}

START_TEST(positions_fixture) {
    epyq_vision_config vc;
    bool present;
    epyq_err err = {0};
    ck_assert(epyq_vision_config_load(&vc, g_dir, &present, &err) == EPYQ_OK && present);
    int ids[64], want[3][64], delta = 0, n = json_ints("input_ids", -1, ids, 64);
    for (int a = 0; a < 3; a++) ck_assert(json_ints("position_ids", a, want[a], 64) == n);
    const int32_t grid[1][2] = {{4, 6}};
    int32_t pos[64 * 3];
    ck_assert_msg(epyq_vision_positions(&vc, ids, n, grid, 1, pos, &delta, &err) == EPYQ_OK, "%s",
                  err.msg);
    for (int i = 0; i < n; i++)
        for (int a = 0; a < 3; a++)
            ck_assert_msg(pos[3 * i + a] == want[a][i], "token %d axis %d", i, a);
    ck_assert_int_eq(delta, -3); /* mrope.json rope_delta */
    /* the template's single pad expands to the image's 6 tokens */
    int one[] = {569, 1009, 1012, 1010, 17}, *ex = NULL, nex = 0;
    int32_t tok = 6;
    ck_assert(epyq_vision_expand_pads(&vc, one, 5, &tok, 1, &ex, &nex, &err) == EPYQ_OK);
    ck_assert(nex == 10 && ex[1] == 1009 && ex[2] == 1012 && ex[7] == 1012 && ex[8] == 1010);
    free(ex);
    /* refusals: a pad run of the wrong length, more images than pads */
    ck_assert(epyq_vision_positions(&vc, ex = one, 5, grid, 1, pos, &delta, &err) == EPYQ_E_ARG);
    ck_assert(strstr(err.msg, "needs 6 pads"));
    const int32_t g2[2][2] = {{4, 6}, {4, 6}};
    ck_assert(epyq_vision_expand_pads(&vc, one, 5, (const int32_t[]){6, 6}, 2, &ex, &nex, &err) ==
              EPYQ_E_ARG);
    (void)g2;
}
END_TEST

/* Two images (merged grids 2x3 and 5x3), worked by hand from the rule:
 * a vs [6 pads] ve b vs [15 pads] ve c */
START_TEST(positions_two_images) {
    epyq_vision_config vc;
    bool present;
    epyq_err err = {0};
    ck_assert(epyq_vision_config_load(&vc, g_dir, &present, &err) == EPYQ_OK && present);
    int ids[32], n = 0;
    ids[n++] = 5, ids[n++] = 1009;
    for (int i = 0; i < 6; i++) ids[n++] = 1012;
    ids[n++] = 1010, ids[n++] = 6, ids[n++] = 1009;
    for (int i = 0; i < 15; i++) ids[n++] = 1012;
    ids[n++] = 1010, ids[n++] = 7;
    static const int want[3][26] = {
        {0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8},
        {0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7, 8, 8, 8, 9, 9, 9, 10, 10, 10, 11, 11, 11, 12, 12, 12},
        {0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8, 9, 10, 8, 9, 10, 8, 9, 10, 8, 9, 10, 8, 9, 10}};
    /* ... then ve at 8 + max(5, 3) = 13 and c at 14 */
    ck_assert_int_eq(n, 28);
    const int32_t grid[2][2] = {{4, 6}, {10, 6}};
    int32_t pos[28 * 3], delta;
    ck_assert_msg(epyq_vision_positions(&vc, ids, n, grid, 2, pos, &delta, &err) == EPYQ_OK, "%s",
                  err.msg);
    for (int i = 0; i < 26; i++)
        for (int a = 0; a < 3; a++)
            ck_assert_msg(pos[3 * i + a] == want[a][i], "token %d axis %d", i, a);
    for (int a = 0; a < 3; a++) ck_assert(pos[3 * 26 + a] == 13 && pos[3 * 27 + a] == 14);
    ck_assert_int_eq(delta, 15 - 28);
}
END_TEST

static void expect_dist(const char *what, const conform_stats *s) {
    conform_print(what, s);
    ck_assert_msg(s->kl_mean < 1e-3 && s->kl_max < 1e-2, "%s: KL mean %g max %g", what, s->kl_mean,
                  s->kl_max);
    ck_assert_msg(s->top1_ok == s->top1_n, "%s: top-1 %d/%d", what, s->top1_ok, s->top1_n);
}

static void logits_path(epyq_numpath path) {
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_model_opts mo = {.path = path, .n_threads = 2};
    ck_assert_msg(epyq_model_load(&m, g_dir, &mo, &err) == EPYQ_OK, "%s", err.msg);
    epyq_vision *v = NULL;
    epyq_vision_opts vo = {.n_threads = 2};
    ck_assert_msg(epyq_vision_load(&v, g_dir, &vo, &err) == EPYQ_OK, "%s", err.msg);
    const epyq_vision_config *vc = epyq_vision_cfg(v);
    const int V = epyq_model_config(m)->vocab_size;
    int ids[64], greedy[16], n = json_ints("input_ids", -1, ids, 64);
    int ng = conform_read_ids(g_dir, "greedy.json", "ids", greedy, 16);
    ck_assert(ng == 8);
    int32_t grid[1][2], tokens, pos[64 * 3], delta;
    float *rows = encode(v, 1, grid[0], &tokens);
    ck_assert(epyq_vision_positions(vc, ids, n, (const int32_t(*)[2])grid, 1, pos, &delta, &err) ==
              EPYQ_OK);
    const float **embd = pad_rows(vc, ids, n, rows);
    epyq_seq *s = NULL, *seqs[64];
    ck_assert(epyq_seq_create(&s, m, n + ng, EPYQ_KV_BF16, &err) == EPYQ_OK);
    for (int i = 0; i < n; i++) seqs[i] = s;
    float *got = malloc((size_t)(n + ng) * V * sizeof(float));
    epyq_batch b = {n, seqs, ids, NULL};
    epyq_batch_img bi = {embd, pos};
    ck_assert_msg(epyq_model_forward_img(m, &b, &bi, got, NULL, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(epyq_seq_rope_delta(s), -3);
    float *e_pre = conform_read_f32(g_dir, "logits_prefill.f32", (size_t)n * V);
    float *e_dec = conform_read_f32(g_dir, "logits_decode.f32", (size_t)ng * V);
    ck_assert(e_pre && e_dec);
    const char *pn = epyq_model_path_name(path);
    char label[64];
    conform_stats st;
    conform_init(&st);
    conform_add(&st, e_pre, got, n, V);
    snprintf(label, sizeof label, "tiny-vision %s prefill", pn);
    expect_dist(label, &st);
    /* teacher-forced decode at positions n + delta (the sequence carries the delta) */
    memcpy(got, got + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
    for (int i = 1; i < ng; i++) {
        epyq_batch d = {1, seqs, &greedy[i - 1], NULL};
        ck_assert_msg(epyq_model_forward(m, &d, got + (size_t)i * V, NULL, &err) == EPYQ_OK, "%s",
                      err.msg);
    }
    conform_init(&st);
    conform_add(&st, e_dec, got, ng, V);
    snprintf(label, sizeof label, "tiny-vision %s decode", pn);
    expect_dist(label, &st);
    for (int i = 0; i < ng; i++)
        ck_assert_int_eq(conform_argmax_f(got + (size_t)i * V, V), greedy[i]);
    free(got), free(e_pre), free(e_dec), free(rows), free(embd);
    epyq_seq_free(s);
    epyq_vision_free(v);
    epyq_model_free(m);
}

START_TEST(logits_a16) { logits_path(EPYQ_PATH_A16); }
END_TEST

START_TEST(logits_a8) { logits_path(EPYQ_PATH_A8); }
END_TEST

/* Two images in one prompt: one batch, the same prompt in 3 chunks, and the prompt batched with a
 * text-only sequence all give the same logits bit for bit; decoding continues at n + delta. */
START_TEST(two_images_batching) {
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_model_opts mo = {.n_threads = 2};
    ck_assert_msg(epyq_model_load(&m, g_dir, &mo, &err) == EPYQ_OK, "%s", err.msg);
    epyq_vision *v = NULL;
    epyq_vision_opts vo = {.n_threads = 2};
    ck_assert_msg(epyq_vision_load(&v, g_dir, &vo, &err) == EPYQ_OK, "%s", err.msg);
    const epyq_vision_config *vc = epyq_vision_cfg(v);
    const int V = epyq_model_config(m)->vocab_size, H = vc->out_hidden;
    int32_t grid[2][2], tok[2];
    float *r1 = encode(v, 1, grid[0], &tok[0]), *r2 = encode(v, 2, grid[1], &tok[1]);
    float *rows = malloc((size_t)(tok[0] + tok[1]) * H * sizeof(float));
    memcpy(rows, r1, (size_t)tok[0] * H * 4),
        memcpy(rows + (size_t)tok[0] * H, r2, (size_t)tok[1] * H * 4);
    int tmpl[] = {569, 560, 1009, 1012, 1010, 17, 1009, 1012, 1010, 766, 269}, *ids = NULL, n = 0;
    ck_assert(epyq_vision_expand_pads(vc, tmpl, 11, tok, 2, &ids, &n, &err) == EPYQ_OK);
    int32_t *pos = malloc((size_t)n * 3 * sizeof *pos), delta;
    ck_assert(epyq_vision_positions(vc, ids, n, (const int32_t(*)[2])grid, 2, pos, &delta, &err) ==
              EPYQ_OK);
    const float **embd = pad_rows(vc, ids, n, rows);
    /* alone, one batch */
    epyq_seq *a = NULL, *b = NULL, *c = NULL;
    ck_assert(epyq_seq_create(&a, m, n + 4, EPYQ_KV_BF16, &err) == EPYQ_OK);
    ck_assert(epyq_seq_create(&b, m, n + 4, EPYQ_KV_BF16, &err) == EPYQ_OK);
    ck_assert(epyq_seq_create(&c, m, n + 4, EPYQ_KV_BF16, &err) == EPYQ_OK);
    epyq_seq **seqs = malloc((size_t)(n + 8) * sizeof *seqs);
    float *la = malloc((size_t)(n + 1) * V * 4), *lb = malloc((size_t)(n + 1) * V * 4),
          *lc = malloc((size_t)(n + 8) * V * 4);
    for (int i = 0; i < n; i++) seqs[i] = a;
    epyq_batch ba = {n, seqs, ids, NULL};
    epyq_batch_img ia = {embd, pos};
    ck_assert(epyq_model_forward_img(m, &ba, &ia, la, NULL, &err) == EPYQ_OK);
    ck_assert_int_eq(epyq_seq_rope_delta(a), delta);
    /* in chunks of 4, 13, rest (the first image's run is split) */
    for (int i = 0; i < n; i++) seqs[i] = b;
    int cuts[] = {0, 4, 17, n};
    for (int k = 0; k < 3; k++) {
        epyq_batch bb = {cuts[k + 1] - cuts[k], seqs, ids + cuts[k], NULL};
        epyq_batch_img ib = {embd + cuts[k], pos + 3 * cuts[k]};
        ck_assert(epyq_model_forward_img(m, &bb, &ib, lb + (size_t)cuts[k] * V, NULL, &err) ==
                  EPYQ_OK);
    }
    ck_assert(!memcmp(la, lb, (size_t)n * V * 4));
    ck_assert_int_eq(epyq_seq_rope_delta(b), delta);
    /* batched with 8 text tokens of another sequence (positions p on every axis) */
    int text[8] = {5, 6, 7, 8, 9, 10, 11, 12}, *all = malloc((size_t)(n + 8) * sizeof *all);
    int32_t *pall = malloc((size_t)(n + 8) * 3 * sizeof *pall);
    const float **eall = calloc((size_t)n + 8, sizeof *eall);
    for (int i = 0; i < 8; i++)
        seqs[i] = c, all[i] = text[i], pall[3 * i] = pall[3 * i + 1] = pall[3 * i + 2] = i;
    for (int i = 0; i < n; i++) {
        seqs[8 + i] = a, all[8 + i] = ids[i], eall[8 + i] = embd[i];
        memcpy(pall + 3 * (8 + i), pos + 3 * i, 12);
    }
    epyq_seq_reset(a);
    epyq_batch bc = {n + 8, seqs, all, NULL};
    epyq_batch_img ic = {eall, pall};
    ck_assert(epyq_model_forward_img(m, &bc, &ic, lc, NULL, &err) == EPYQ_OK);
    ck_assert(!memcmp(lc + (size_t)8 * V, la, (size_t)n * V * 4));
    ck_assert_int_eq(epyq_seq_rope_delta(c), 0);
    /* the text sequence alone, plain forward, gives its bits too */
    epyq_seq *d = NULL;
    ck_assert(epyq_seq_create(&d, m, 16, EPYQ_KV_BF16, &err) == EPYQ_OK);
    for (int i = 0; i < 8; i++) seqs[i] = d;
    epyq_batch bd = {8, seqs, text, NULL};
    ck_assert(epyq_model_forward(m, &bd, lb, NULL, &err) == EPYQ_OK);
    ck_assert(!memcmp(lb, lc, (size_t)8 * V * 4));
    /* a decode token after the two images: position n + delta, same in a and b */
    int next = 42;
    epyq_batch da = {1, (epyq_seq *[]){a}, &next, NULL}, db = {1, (epyq_seq *[]){b}, &next, NULL};
    ck_assert(epyq_model_forward(m, &da, la, NULL, &err) == EPYQ_OK);
    ck_assert(epyq_model_forward(m, &db, lb, NULL, &err) == EPYQ_OK);
    ck_assert(!memcmp(la, lb, (size_t)V * 4));
    epyq_seq_free(a), epyq_seq_free(b), epyq_seq_free(c), epyq_seq_free(d);
    free(seqs), free(la), free(lb), free(lc), free(all), free(pall), free(eall), free(embd),
        free(pos), free(ids);
    free(rows), free(r1), free(r2);
    epyq_vision_free(v);
    epyq_model_free(m);
}
END_TEST

int main(void) {
    const char *p = epyq_test_shared("fixtures/models/tiny-vision");
    if (!p) {
        printf("skip: ../shared/fixtures/models/tiny-vision not present\n");
        return 77;
    }
    snprintf(g_dir, sizeof g_dir, "%s", p);
    Suite *s = suite_create("vision_lm");
    TCase *tc = epyq_test_case(s, "all", 300);
    EPYQ_TESTS_ADD(tc, positions_fixture, positions_two_images, logits_a16, logits_a8,
                   two_images_batching);
    return epyq_test_failures(s, true) ? 1 : 0;
}
