/* tests/unit/test_engine_vision.c — images through the continuous-batching engine on a
 * synthetic tiny checkpoint with its BF16 tower (no ../shared needed; the tiny-vision fixture has
 * no tokenizer, which the engine needs):
 *   - an image request's greedy tokens equal epyq_model_forward_img driven directly (the whole
 *     prompt in one call, then plain decode steps that carry the rope delta);
 *   - the same request with a 5-token prompt chunk (the chunks cut the image's run) and batched
 *     with two text-only requests gives the same tokens, and the text requests their own;
 *   - with the prefix cache on, image requests restore nothing (pads are the same ids for
 *     different images) and an MTP-speculating engine runs them plainly with the same tokens;
 *   - mismatched pads / rows / hidden size are refused with EPYQ_E_ARG; a checkpoint without a
 *     tower cannot load one (epyq_vision_load refuses), so the tools never build image rows. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "synth/synth.h"
#include "tests/check_main.h"
#include "tests/e2e/synth_model.h"
#include "vision/prompt.h"

#define NGEN 8

static char *g_dir;
static epyq_model *g_m;
static epyq_tok *g_tok;
static epyq_vision *g_v;
static epyq_vision_prompt g_vp; /* the image prompt: ids with pads expanded, rows, positions */
static int32_t g_ref[NGEN];     /* greedy ids of forward_img driven directly */

typedef struct {
    int32_t toks[64];
    int32_t n_tok, n_done;
    epyq_engine_usage usage;
} rec;

static void on_event(void *ctx, const epyq_engine_event *ev) {
    rec *r = ctx;
    if (!ev->prompt && ev->tok >= 0 && r->n_tok < 64) r->toks[r->n_tok++] = ev->tok;
}

static void on_done(void *ctx, epyq_engine_finish f, const epyq_engine_usage *u,
                    const epyq_err *err) {
    rec *r = ctx;
    (void)f, (void)err;
    r->usage = *u, r->n_done++;
}

static epyq_engine_params greedy(int32_t n) {
    epyq_engine_params p = {.max_tokens = n, .logprobs = -1, .ignore_eos = true};
    p.sp = (epyq_sample_params){.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
    return p;
}

static epyq_engine_img img_of(const epyq_vision_prompt *vp) {
    const epyq_vision_config *vc = epyq_vision_cfg(g_v);
    return (epyq_engine_img){vc->image_token_id, vp->image_tokens, vc->out_hidden, vp->rows,
                             vp->pos};
}

static int32_t argmax(const float *row, int32_t V) {
    int32_t b = 0;
    for (int32_t i = 1; i < V; i++)
        if (row[i] > row[b]) b = i;
    return b;
}

static epyq_engine *mk(int32_t seqs, int32_t chunk, uint64_t cache, int32_t spec_k) {
    epyq_engine *e = NULL;
    epyq_err err = {0};
    const epyq_engine_opts o = {.max_seqs = seqs,
                                .chunk = chunk,
                                .ctx_limit = 512,
                                .kv = EPYQ_KV_BF16,
                                .cache_bytes = cache,
                                .cache_every = 16,
                                .spec_k = spec_k};
    ck_assert_msg(epyq_engine_create(&e, g_m, g_tok, &o, &err) == EPYQ_OK, "%s", err.msg);
    return e;
}

static void add(epyq_engine *e, const int32_t *ids, size_t n, const epyq_engine_img *img, rec *r) {
    epyq_err err = {0};
    const epyq_engine_params p = greedy(NGEN);
    const epyq_engine_cb cb = {on_event, on_done, r};
    ck_assert_msg(epyq_engine_add_img(e, ids, n, img, &p, &cb, NULL, &err) == EPYQ_OK, "%s",
                  err.msg);
}

static void run_all(epyq_engine *e) {
    epyq_err err = {0};
    for (int guard = 0; epyq_engine_active(e) > 0; guard++) {
        ck_assert_int_lt(guard, 10000);
        ck_assert_msg(epyq_engine_step(e, &err) == EPYQ_OK, "%s", err.msg);
    }
}

/* greedy tokens of a text prompt run alone in an engine */
static void text_alone(const int32_t *ids, size_t n, rec *r) {
    epyq_engine *e = mk(1, 512, 0, 0);
    add(e, ids, n, NULL, r);
    run_all(e);
    epyq_engine_free(e);
}

START_TEST(test_alone_matches_forward) {
    const epyq_engine_img im = img_of(&g_vp);
    rec r = {0};
    epyq_engine *e = mk(1, 512, 0, 0);
    add(e, g_vp.ids, (size_t)g_vp.n, &im, &r);
    run_all(e);
    epyq_engine_free(e);
    ck_assert_int_eq(r.n_done, 1);
    ck_assert_int_eq(r.n_tok, NGEN);
    ck_assert_mem_eq(r.toks, g_ref, sizeof g_ref);
}
END_TEST

START_TEST(test_chunked_and_batched) {
    const epyq_engine_img im = img_of(&g_vp);
    int32_t t1[9], t2[30];
    for (int i = 0; i < 9; i++) t1[i] = 11 + 3 * i;
    for (int i = 0; i < 30; i++) t2[i] = 200 + 7 * i;
    rec a1 = {0}, a2 = {0}, r = {0}, w1 = {0}, w2 = {0};
    text_alone(t1, 9, &a1), text_alone(t2, 30, &a2);
    epyq_engine *e = mk(3, 5, 0, 0); /* 5 rows a step: the image's run is cut several times */
    add(e, t1, 9, NULL, &w1);
    epyq_err err = {0};
    ck_assert(epyq_engine_step(e, &err) == EPYQ_OK);
    add(e, g_vp.ids, (size_t)g_vp.n, &im, &r);
    ck_assert(epyq_engine_step(e, &err) == EPYQ_OK);
    add(e, t2, 30, NULL, &w2);
    run_all(e);
    epyq_engine_free(e);
    ck_assert_int_eq(r.n_tok, NGEN);
    ck_assert_mem_eq(r.toks, g_ref, sizeof g_ref);
    ck_assert_mem_eq(w1.toks, a1.toks, sizeof a1.toks);
    ck_assert_mem_eq(w2.toks, a2.toks, sizeof a2.toks);
}
END_TEST

START_TEST(test_cache_and_spec) {
    const epyq_engine_img im = img_of(&g_vp);
    rec r1 = {0}, r2 = {0}, r3 = {0};
    epyq_engine *e = mk(2, 512, 64u << 20, 0);
    add(e, g_vp.ids, (size_t)g_vp.n, &im, &r1);
    run_all(e);
    add(e, g_vp.ids, (size_t)g_vp.n, &im, &r2);
    run_all(e);
    epyq_engine_stats st;
    epyq_engine_get_stats(e, &st);
    epyq_engine_free(e);
    ck_assert_int_eq(r1.usage.n_cached, 0);
    ck_assert_int_eq(r2.usage.n_cached, 0);
    ck_assert_uint_eq(st.cache_entries, 0);
    ck_assert_mem_eq(r2.toks, g_ref, sizeof g_ref);
    if (epyq_model_has_mtp(g_m)) {
        e = mk(1, 512, 0, 2);
        add(e, g_vp.ids, (size_t)g_vp.n, &im, &r3);
        run_all(e);
        epyq_engine_get_stats(e, &st);
        epyq_engine_free(e);
        ck_assert_mem_eq(r3.toks, g_ref, sizeof g_ref);
        ck_assert_uint_eq(st.spec_steps, 0); /* run plainly */
    }
}
END_TEST

START_TEST(test_refusals) {
    epyq_engine *e = mk(1, 512, 0, 0);
    epyq_err err = {0};
    const epyq_engine_params p = greedy(4);
    rec r = {0};
    const epyq_engine_cb cb = {on_event, on_done, &r};
    epyq_engine_img im = img_of(&g_vp);
    im.n_rows--;
    ck_assert_int_eq(epyq_engine_add_img(e, g_vp.ids, (size_t)g_vp.n, &im, &p, &cb, NULL, &err),
                     EPYQ_E_ARG);
    ck_assert_msg(strstr(err.msg, "image pads") != NULL, "%s", err.msg);
    im = img_of(&g_vp), im.hidden++;
    ck_assert_int_eq(epyq_engine_add_img(e, g_vp.ids, (size_t)g_vp.n, &im, &p, &cb, NULL, &err),
                     EPYQ_E_ARG);
    ck_assert_msg(strstr(err.msg, "hidden size") != NULL, "%s", err.msg);
    im = img_of(&g_vp), im.pos = NULL;
    ck_assert_int_eq(epyq_engine_add_img(e, g_vp.ids, (size_t)g_vp.n, &im, &p, &cb, NULL, &err),
                     EPYQ_E_ARG);
    ck_assert_int_eq(epyq_engine_active(e), 0);
    epyq_engine_free(e);
    /* a checkpoint written without its tower */
    char *dir = epyq_test_tmpdir();
    epyq_synth_opts o = {0};
    o.out_dir = dir, o.format = (epyq_synth_format)epyq_synth_format_parse("ct"), o.seed = 3;
    epyq_synth_stats sst;
    ck_assert(epyq_synth_dims_init(&o.dims, "tiny", 0, 0, 0, &err) == EPYQ_OK);
    o.dims.vis_depth = 0;
    ck_assert_msg(epyq_synth_write(&o, &sst, &err) == EPYQ_OK, "%s", err.msg);
    epyq_vision *v = NULL;
    const epyq_vision_opts vo = {.n_threads = 1};
    ck_assert(epyq_vision_load(&v, dir, &vo, &err) != EPYQ_OK);
    ck_assert_msg(strstr(err.msg, "is missing") != NULL, "%s", err.msg);
    ck_assert_ptr_null(v);
    free(dir);
}
END_TEST

/* The prompt: text, <|vision_start|><|image_pad|><|vision_end|>, text; a 40 x 24 gradient image
 * (77 image tokens after the processor). Reference greedy ids from the model directly. */
static int setup(void) {
    epyq_err err = {0};
    const epyq_vision_opts vo = {.n_threads = 1, .no_dnnl = true};
    if (epyq_vision_load(&g_v, g_dir, &vo, &err) != EPYQ_OK)
        return fprintf(stderr, "%s\n", err.msg), 1;
    const epyq_vision_config *vc = epyq_vision_cfg(g_v);
    epyq_image im = {40, 24, malloc(40 * 24 * 3)};
    for (int i = 0; i < 40 * 24 * 3; i++) im.rgb[i] = (uint8_t)(i * 7 % 251);
    int32_t ids[] = {101, 102, 103, vc->vision_start_id, vc->image_token_id, vc->vision_end_id,
                     104, 105};
    epyq_status st = epyq_vision_prompt_build(&g_vp, g_v, &im, NULL, 1, ids, 8, &err);
    epyq_image_free(&im);
    if (st != EPYQ_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    const int32_t V = epyq_model_config(g_m)->vocab_size, n = g_vp.n;
    epyq_seq *s = NULL;
    epyq_seq **seqs = malloc((size_t)n * sizeof *seqs);
    float *lg = malloc((size_t)V * sizeof *lg);
    uint8_t *want = calloc((size_t)n, 1);
    if (epyq_seq_create(&s, g_m, n + NGEN, EPYQ_KV_BF16, &err) != EPYQ_OK) return 1;
    for (int i = 0; i < n; i++) seqs[i] = s;
    want[n - 1] = 1;
    epyq_batch b = {n, seqs, g_vp.ids, want};
    st = epyq_model_forward_img(g_m, &b, &g_vp.img, lg, NULL, &err);
    for (int k = 0; st == EPYQ_OK && k < NGEN; k++) {
        g_ref[k] = argmax(lg, V);
        epyq_batch d = {1, seqs, &g_ref[k], NULL};
        if (k + 1 < NGEN) st = epyq_model_forward(g_m, &d, lg, NULL, &err);
    }
    epyq_seq_free(s);
    free(seqs), free(lg), free(want);
    if (st != EPYQ_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    return 0;
}

int main(void) {
    if (synth_model_load_tiny(&g_dir, &g_m, &g_tok)) return EXIT_FAILURE;
    if (setup()) return EXIT_FAILURE;
    Suite *s = suite_create("engine_vision");
    TCase *tc = epyq_test_case(s, "engine_vision", 0);
    EPYQ_TESTS_ADD(tc, test_alone_matches_forward, test_chunked_and_batched, test_cache_and_spec,
                   test_refusals);
    int nf = epyq_test_failures(s, true);
    epyq_vision_prompt_free(&g_vp);
    epyq_vision_free(g_v);
    epyq_tok_free(g_tok);
    epyq_model_free(g_m);
    free(g_dir);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
