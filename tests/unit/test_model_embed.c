/* tests/unit/test_model_embed.c — where the embedding rows come from (model.c embed_hold): a
 * copy in memory when it fits with headroom, the checkpoint's mapping under EPYQ_EMBED=mapped
 * or when memory is short, and the same logits either way (the copy holds the same bytes, so a
 * prompt, decode steps and an MTP draft are bit-identical); a bad EPYQ_EMBED is refused with a
 * message naming it. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "tests/check_main.h"
#include "tests/e2e/synth_model.h"

#define NP 9 /* prompt */
#define ND 3 /* decode steps */

static char *g_dir;

/* Loads g_dir under the given EPYQ_EMBED / EPYQ_MEM_AVAILABLE (NULL = unset), runs the
 * prompt, ND decode steps (fixed ids) and one MTP draft into logits
 * [NP + ND + 1][V]; returns whether the table was in memory. */
static bool run(const char *embed, const char *avail, float *logits, int V, int H) {
    if (embed) setenv("EPYQ_EMBED", embed, 1);
    else
        unsetenv("EPYQ_EMBED");
    if (avail) setenv("EPYQ_MEM_AVAILABLE", avail, 1);
    else
        unsetenv("EPYQ_MEM_AVAILABLE");
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_model_opts mo = {.path = EPYQ_PATH_A8, .n_threads = 2};
    ck_assert_msg(epyq_model_load(&m, g_dir, &mo, &err) == EPYQ_OK, "%s", err.msg);
    const bool resident = epyq_model_embed_resident(m);
    epyq_seq *s = NULL;
    ck_assert(epyq_seq_create(&s, m, NP + ND + 4, EPYQ_KV_BF16, &err) == EPYQ_OK);
    int ids[NP + ND];
    for (int i = 0; i < NP + ND; i++) ids[i] = (i * 389 + 11) % V;
    epyq_seq *ss[NP];
    for (int i = 0; i < NP; i++) ss[i] = s;
    float *hid = malloc((size_t)NP * H * sizeof(float));
    epyq_batch b = {NP, ss, ids, NULL};
    ck_assert(epyq_model_forward(m, &b, logits, hid, &err) == EPYQ_OK);
    for (int t = NP; t < NP + ND; t++) {
        epyq_batch d = {1, ss, &ids[t], NULL};
        ck_assert(epyq_model_forward(m, &d, logits + (size_t)t * V, NULL, &err) == EPYQ_OK);
    }
    if (epyq_model_has_mtp(m)) { /* the MTP head reads an embedding row too */
        int tok = ids[1], pos = 0;
        ck_assert_msg(epyq_model_mtp(m, s, 1, hid, &tok, &pos, 1, logits + (size_t)(NP + ND) * V,
                                     NULL, &err) == EPYQ_OK,
                      "%s", err.msg);
    }
    free(hid);
    epyq_seq_free(s);
    epyq_model_free(m);
    unsetenv("EPYQ_EMBED");
    unsetenv("EPYQ_MEM_AVAILABLE");
    return resident;
}

START_TEST(test_embed_modes) {
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_model_opts mo = {.path = EPYQ_PATH_A8, .n_threads = 2};
    unsetenv("EPYQ_EMBED");
    ck_assert_msg(epyq_model_load(&m, g_dir, &mo, &err) == EPYQ_OK, "%s", err.msg);
    const int V = epyq_model_config(m)->vocab_size, H = epyq_model_config(m)->hidden_size;
    epyq_model_free(m);
    const size_t n = (size_t)(NP + ND + 1) * V;
    float *mapped = calloc(n, sizeof(float)), *res = calloc(n, sizeof(float)),
          *low = calloc(n, sizeof(float)), *plenty = calloc(n, sizeof(float));
    ck_assert(!run("mapped", NULL, mapped, V, H));
    /* 64 MiB free: the tiny model fits, the copy's 2 GiB headroom does not */
    ck_assert(run("resident", "67108864", res, V, H));   /* resident copies whatever the headroom */
    ck_assert(!run(NULL, "67108864", low, V, H));        /* auto: stays mapped */
    ck_assert(run(NULL, "1099511627776", plenty, V, H)); /* auto, 1 TiB free: copied */
    ck_assert_msg(memcmp(mapped, res, n * sizeof(float)) == 0,
                  "resident logits differ from mapped");
    ck_assert(memcmp(mapped, low, n * sizeof(float)) == 0);
    ck_assert(memcmp(mapped, plenty, n * sizeof(float)) == 0);
    free(mapped), free(res), free(low), free(plenty);
}
END_TEST

START_TEST(test_embed_bad_env) {
    setenv("EPYQ_EMBED", "sometimes", 1);
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_model_opts mo = {.path = EPYQ_PATH_A8, .n_threads = 2};
    ck_assert(epyq_model_load(&m, g_dir, &mo, &err) != EPYQ_OK);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err.msg, "EPYQ_EMBED") && strstr(err.msg, "sometimes"), "%s", err.msg);
    unsetenv("EPYQ_EMBED");
}
END_TEST

int main(void) {
    g_dir = synth_model("ct", 21);
    if (!g_dir) return 1;
    Suite *s = suite_create("model_embed");
    TCase *tc = epyq_test_case(s, "embed", 0);
    EPYQ_TESTS_ADD(tc, test_embed_modes, test_embed_bad_env);
    return epyq_test_run(s);
}
