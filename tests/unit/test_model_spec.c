/* tests/unit/test_model_spec.c — MTP speculative decoding (src/model/spec.c):
 *  - rollback: feeding [a, b, c] as a verification, keeping 1, 2 or 3 of them and feeding x
 *    gives bit for bit the logits of a sequence that was fed prefix + kept + x directly (so the
 *    DeltaNet state and conv snapshots are the states after each token);
 *  - greedy identity: generation with --spec mtp (k = 1, 2, 3; exact or int4 draft head) emits
 *    exactly the tokens of plain greedy decoding, on synthetic checkpoints of three formats and
 *    on every ../shared fixture that has an MTP head;
 *    — with the MTP's own drafts (which random weights almost never accept) and with drafts
 *    taken from the plain output but wrong at every fifth position, so every acceptance length
 *    and the bonus token occur;
 *  - seeded sampling emits the plain seeded run's tokens draw for draw;
 *  - forced acceptance keeps its promise (k + 1 tokens a step, every draft counted accepted);
 *  - a draft head cut to the first ids (--draft-vocab) drafts only those ids, same output. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/sample.h"
#include "model/spec.h"
#include "tests/check_main.h"
#include "tests/e2e/synth_model.h"

static epyq_model *load(const char *dir, epyq_requant draft, bool mtp) {
    epyq_model *m = NULL;
    epyq_err err = {0};
    epyq_model_opts o = {.n_threads = 2, .skip_mtp = !mtp, .draft_head = draft};
    ck_assert_msg(epyq_model_load(&m, dir, &o, &err) == EPYQ_OK, "%s: %s", dir, err.msg);
    return m;
}

static void feed(epyq_model *m, epyq_seq *s, const int32_t *tok, int32_t n, float *logits) {
    epyq_seq *seqs[16];
    ck_assert(n <= 16);
    for (int32_t i = 0; i < n; i++) seqs[i] = s;
    epyq_batch b = {n, seqs, tok, NULL};
    epyq_err err = {0};
    ck_assert_msg(epyq_model_forward(m, &b, logits, NULL, &err) == EPYQ_OK, "%s", err.msg);
}

START_TEST(test_rollback_exact) {
    char *dir = synth_model("ct", 21);
    ck_assert(dir);
    epyq_model *m = load(dir, EPYQ_REQUANT_NONE, false);
    int32_t V = epyq_model_config(m)->vocab_size;
    float *la = malloc((size_t)16 * V * sizeof(float)), *lb = malloc((size_t)16 * V * sizeof(float));
    const int32_t prefix[] = {7, 99, 300, 12}, ver[] = {41, 512, 6}, x = 77;
    epyq_err err = {0};
    for (int32_t keep = 1; keep <= 3; keep++) {
        epyq_seq *s = NULL, *r = NULL;
        ck_assert(epyq_seq_create(&s, m, 32, EPYQ_KV_BF16, &err) == EPYQ_OK);
        ck_assert(epyq_seq_create(&r, m, 32, EPYQ_KV_BF16, &err) == EPYQ_OK);
        feed(m, s, prefix, 4, la);
        ck_assert(epyq_seq_spec_begin(s, 3, &err) == EPYQ_OK);
        feed(m, s, ver, 3, la);
        ck_assert(epyq_seq_rollback(s, keep, &err) == EPYQ_OK);
        ck_assert_int_eq(epyq_seq_pos(s), 4 + keep);
        feed(m, s, &x, 1, la);
        int32_t direct[8];
        memcpy(direct, prefix, sizeof prefix);
        memcpy(direct + 4, ver, (size_t)keep * sizeof(int32_t));
        direct[4 + keep] = x;
        feed(m, r, direct, 5 + keep, lb);
        ck_assert_msg(!memcmp(la, lb + (size_t)(4 + keep) * V, (size_t)V * sizeof(float)),
                      "keep %d: logits after the rollback differ from the direct sequence", keep);
        /* a rollback without a verification, or past it, is refused */
        ck_assert(epyq_seq_rollback(s, 1, &err) == EPYQ_E_ARG);
        epyq_seq_free(s), epyq_seq_free(r);
    }
    free(la), free(lb);
    epyq_model_free(m);
    free(dir);
}
END_TEST

static int32_t pick_greedy(void *ctx, const float *logits) { return epyq_argmax(logits, *(int32_t *)ctx); }

enum { PROMPT = 6, GEN = 24, GEN_LONG = 200 };

/* Plain greedy: GEN tokens after the prompt. */
static void greedy_plain_n(epyq_model *m, const int32_t *prompt, int32_t *outv, int gen);
static void greedy_plain(epyq_model *m, const int32_t *prompt, int32_t *outv) { greedy_plain_n(m, prompt, outv, GEN); }
static void greedy_plain_n(epyq_model *m, const int32_t *prompt, int32_t *outv, int gen) {
    int32_t V = epyq_model_config(m)->vocab_size;
    float *lg = malloc((size_t)PROMPT * V * sizeof(float));
    epyq_seq *s = NULL;
    epyq_err err = {0};
    ck_assert(epyq_seq_create(&s, m, 256, EPYQ_KV_BF16, &err) == EPYQ_OK);
    feed(m, s, prompt, PROMPT, lg);
    outv[0] = epyq_argmax(lg + (size_t)(PROMPT - 1) * V, V);
    for (int i = 1; i < gen; i++) {
        feed(m, s, &outv[i - 1], 1, lg);
        outv[i] = epyq_argmax(lg, V);
    }
    epyq_seq_free(s);
    free(lg);
}

/* Drafts from the plain greedy output, wrong on every fifth position: every acceptance
 * length from 0 to k drafts (and the bonus token) occurs. */
typedef struct {
    const int32_t *want;
    int32_t V, n;
    bool wrong; /* every draft wrong, not only every fifth */
} oracle;

static int32_t oracle_draft(void *ctx, int32_t pos, int32_t d) {
    const oracle *o = ctx;
    int32_t i = pos - PROMPT;
    if (i < 0 || i >= o->n) return d;
    return o->wrong || i % 5 == 3 ? (o->want[i] + 1) % o->V : o->want[i];
}

static int64_t greedy_spec_n(epyq_model *m, const int32_t *prompt, int32_t k, bool forced, const oracle *orc,
                             bool adaptive, int gen, int32_t *outv, epyq_spec_stats *stats);
static int64_t greedy_spec_o(epyq_model *m, const int32_t *prompt, int32_t k, bool forced, const oracle *orc,
                             int32_t *outv, epyq_spec_stats *stats) {
    return greedy_spec_n(m, prompt, k, forced, orc, false, GEN, outv, stats);
}

static int64_t greedy_spec(epyq_model *m, const int32_t *prompt, int32_t k, bool forced, int32_t *outv,
                           epyq_spec_stats *stats) {
    return greedy_spec_o(m, prompt, k, forced, NULL, outv, stats);
}

static int64_t greedy_spec_n(epyq_model *m, const int32_t *prompt, int32_t k, bool forced, const oracle *orc,
                             bool adaptive, int gen, int32_t *outv, epyq_spec_stats *stats) {
    int32_t V = epyq_model_config(m)->vocab_size;
    epyq_seq *s = NULL;
    epyq_spec *sp = NULL;
    epyq_err err = {0};
    ck_assert(epyq_seq_create(&s, m, 256, EPYQ_KV_BF16, &err) == EPYQ_OK);
    epyq_spec_opts o = {.k = k, .forced = forced, .draft_override = orc ? oracle_draft : NULL,
                        .override_ctx = (void *)orc, .adaptive = adaptive};
    ck_assert_msg(epyq_spec_create(&sp, m, s, &o, &err) == EPYQ_OK, "%s", err.msg);
    int32_t n = 0, step[EPYQ_SPEC_MAX];
    ck_assert_msg(epyq_spec_prefill(sp, prompt, PROMPT, pick_greedy, &V, &outv[n++], &err) == EPYQ_OK, "%s", err.msg);
    while (n < gen) {
        int32_t got;
        ck_assert_msg(epyq_spec_step(sp, pick_greedy, &V, step, &got, &err) == EPYQ_OK, "%s", err.msg);
        ck_assert(got >= 1 && got <= k + 1);
        for (int32_t i = 0; i < got && n < gen; i++) outv[n++] = step[i];
    }
    *stats = *epyq_spec_get_stats(sp);
    epyq_spec_free(sp);
    epyq_seq_free(s);
    return n;
}

/* --draft-vocab: a draft head cut to ids [0, Vd) (here a quarter of the vocabulary, not a
 * multiple of 16, so the cut rounds up) drafts only ids below Vd, observed as the MTP proposes
 * them, and greedy output stays the plain output token for token. */
typedef struct {
    int32_t max_id;
    int64_t n;
} draft_seen;

static int32_t observe_draft(void *ctx, int32_t pos, int32_t d) {
    (void)pos;
    draft_seen *o = ctx;
    o->max_id = d > o->max_id ? d : o->max_id;
    o->n++;
    return d;
}

START_TEST(test_draft_vocab) {
    char *dir = synth_model("ct", 23);
    ck_assert(dir);
    static const int32_t prompt[PROMPT] = {11, 250, 3, 871, 64, 5};
    epyq_model *plain = load(dir, EPYQ_REQUANT_NONE, false);
    int32_t V = epyq_model_config(plain)->vocab_size, want[GEN], got[GEN];
    greedy_plain(plain, prompt, want);
    epyq_model_free(plain);
    const int32_t cut = V / 4 + 3, Vd = (cut + 15) / 16 * 16;
    epyq_model *m = NULL;
    epyq_err err = {0};
    epyq_model_opts o = {.n_threads = 2, .draft_head = EPYQ_REQUANT_INT4, .draft_vocab = cut};
    ck_assert_msg(epyq_model_load(&m, dir, &o, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(epyq_model_draft_vocab(m), Vd);
    for (int32_t k = 1; k <= 3; k++) {
        epyq_seq *s = NULL;
        epyq_spec *sp = NULL;
        ck_assert(epyq_seq_create(&s, m, 256, EPYQ_KV_BF16, &err) == EPYQ_OK);
        draft_seen seen = {-1, 0};
        epyq_spec_opts so = {.k = k, .draft_override = observe_draft, .override_ctx = &seen};
        ck_assert_msg(epyq_spec_create(&sp, m, s, &so, &err) == EPYQ_OK, "%s", err.msg);
        int32_t n = 0, step[EPYQ_SPEC_MAX];
        ck_assert(epyq_spec_prefill(sp, prompt, PROMPT, pick_greedy, &V, &got[n++], &err) ==
                  EPYQ_OK);
        while (n < GEN) {
            int32_t c;
            ck_assert_msg(epyq_spec_step(sp, pick_greedy, &V, step, &c, &err) == EPYQ_OK, "%s",
                          err.msg);
            for (int32_t i = 0; i < c && n < GEN; i++) got[n++] = step[i];
        }
        for (int i = 0; i < GEN; i++)
            ck_assert_msg(got[i] == want[i], "k=%d draft vocab %d: token %d is %d, plain greedy %d",
                          k, Vd, i, got[i], want[i]);
        ck_assert_msg(seen.n > 0 && seen.max_id >= 0 && seen.max_id < Vd,
                      "k=%d: %lld drafts, largest id %d, expected ids below %d", k,
                      (long long)seen.n, seen.max_id, Vd);
        epyq_spec_free(sp);
        epyq_seq_free(s);
    }
    epyq_model_free(m);
    /* more ids than the vocabulary: refused at load, naming both */
    o.draft_vocab = V + 1;
    ck_assert(epyq_model_load(&m, dir, &o, &err) == EPYQ_E_ARG);
    ck_assert_msg(strstr(err.msg, "draft vocabulary"), "%s", err.msg);
    free(dir);
}
END_TEST

static void identity_on(const char *dir) {
    static const int32_t prompt[PROMPT] = {11, 250, 3, 871, 64, 5};
    epyq_model *plain = load(dir, EPYQ_REQUANT_NONE, false);
    int32_t want[GEN], got[GEN];
    greedy_plain(plain, prompt, want);
    epyq_model_free(plain);
    for (int d = 0; d < 2; d++) {
        epyq_model *m = load(dir, d ? EPYQ_REQUANT_INT4 : EPYQ_REQUANT_NONE, true);
        for (int32_t k = 1; k <= 3; k++) {
            epyq_spec_stats st;
            greedy_spec(m, prompt, k, false, got, &st);
            for (int i = 0; i < GEN; i++)
                ck_assert_msg(got[i] == want[i], "%s k=%d draft head %s: token %d is %d, plain greedy %d", dir, k,
                              d ? "int4" : "exact", i, got[i], want[i]);
            ck_assert(st.steps > 0 && st.emitted >= st.steps);
            /* the same with drafts that are mostly right: partial and full acceptance */
            oracle orc = {want, epyq_model_config(m)->vocab_size, GEN, false};
            epyq_spec_stats so;
            greedy_spec_o(m, prompt, k, false, &orc, got, &so);
            for (int i = 0; i < GEN; i++)
                ck_assert_msg(got[i] == want[i], "%s k=%d oracle drafts: token %d is %d, plain greedy %d", dir, k, i,
                              got[i], want[i]);
            ck_assert(so.accepted[k - 1] > 0); /* some steps took every draft and the bonus */
            ck_assert(so.emitted > so.steps);
            if (d == 0)
                fprintf(stderr, "%s k=%d: MTP drafts %.2f tokens/step; oracle drafts %.2f tokens/step\n", dir, k,
                        (double)st.emitted / st.steps, (double)so.emitted / so.steps);
        }
        epyq_model_free(m);
    }
}

START_TEST(test_greedy_identity_synth) {
    static const char *fmts[] = {"ct", "gptq", "bf16"};
    char *dir = synth_model(fmts[_i], 31 + (uint64_t)_i);
    ck_assert(dir);
    identity_on(dir);
    free(dir);
}
END_TEST

START_TEST(test_greedy_identity_fixtures) {
    const char *root = epyq_test_shared("fixtures/models");
    if (!root) return; /* counted by main: the suite exits 77 when nothing ran */
    char base[4096];
    snprintf(base, sizeof base, "%s", root);
    static const char *names[] = {"tiny-bf16", "tiny-gptq", "tiny-ct", "tiny-quark"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/%s", base, names[i]);
        identity_on(dir);
    }
}
END_TEST

/* Adaptive, on a virtual clock so the decisions do not depend on this machine's load: every
 * step costs 1 and every draft 0.5 more, so with k = 2 a speculative step costs 2 against 1
 * for a plain one. With the MTP's own drafts (nearly never accepted on random weights) the
 * rule must settle on plain steps and come back to drafting after each stretch (the MTP cache
 * then catches up); with good drafts (~2.6 tokens a step) it keeps drafting. The tokens stay
 * plain greedy's either way. */
typedef struct {
    oracle orc; /* orc.want NULL: keep the MTP's drafts */
    double t;   /* virtual seconds */
} vclock;

static int32_t vclock_draft(void *ctx, int32_t pos, int32_t d) {
    vclock *v = ctx;
    v->t += 0.5;
    return v->orc.want ? oracle_draft(&v->orc, pos, d) : d;
}

static double vclock_now(void *ctx) {
    vclock *v = ctx;
    v->t += 1.0; /* the adaptive rule reads the clock before and after a step: +1 per step */
    return v->t;
}

static void adaptive_run(epyq_model *m, const int32_t *prompt, vclock *vc, int32_t *got,
                         epyq_spec_stats *st) {
    int32_t V = epyq_model_config(m)->vocab_size;
    epyq_seq *s = NULL;
    epyq_spec *sp = NULL;
    epyq_err err = {0};
    ck_assert(epyq_seq_create(&s, m, 256, EPYQ_KV_BF16, &err) == EPYQ_OK);
    epyq_spec_opts o = {.k = 2,
                        .adaptive = true,
                        .draft_override = vclock_draft,
                        .override_ctx = vc,
                        .clock = vclock_now,
                        .clock_ctx = vc};
    ck_assert(epyq_spec_create(&sp, m, s, &o, &err) == EPYQ_OK);
    int32_t n = 0, step[EPYQ_SPEC_MAX], k;
    ck_assert(epyq_spec_prefill(sp, prompt, PROMPT, pick_greedy, &V, &got[n++], &err) == EPYQ_OK);
    while (n < GEN_LONG) {
        ck_assert_msg(epyq_spec_step(sp, pick_greedy, &V, step, &k, &err) == EPYQ_OK, "%s",
                      err.msg);
        for (int32_t i = 0; i < k && n < GEN_LONG; i++) got[n++] = step[i];
    }
    *st = *epyq_spec_get_stats(sp);
    epyq_spec_free(sp);
    epyq_seq_free(s);
}

START_TEST(test_adaptive) {
    char *dir = synth_model("ct", 51);
    ck_assert(dir);
    static const int32_t prompt[PROMPT] = {9, 18, 27, 36, 45, 54};
    int32_t want[GEN_LONG], got[GEN_LONG];
    epyq_model *m = load(dir, EPYQ_REQUANT_INT4, true);
    greedy_plain_n(m, prompt, want, GEN_LONG);
    epyq_spec_stats st;
    vclock bad = {{NULL, 0, 0, false}, 0};
    adaptive_run(m, prompt, &bad, got, &st);
    ck_assert(!memcmp(got, want, sizeof want));
    fprintf(stderr, "adaptive, MTP drafts: %lld steps, %lld plain tokens, %lld switches\n", (long long)st.steps,
            (long long)st.plain, (long long)st.switches);
    /* 2 drafting steps (no draft kept: the probe is cut), 8 plain (measured), 64 plain, 2
     * drafting (after the catch-up), plain */
    ck_assert_int_ge(st.switches, 3);
    ck_assert_int_gt(st.plain, GEN_LONG / 2);
    /* drafts that are always wrong: every probe is cut after its 2 steps */
    vclock wrong = {{want, epyq_model_config(m)->vocab_size, GEN_LONG, true}, 0};
    adaptive_run(m, prompt, &wrong, got, &st);
    ck_assert(!memcmp(got, want, sizeof want));
    fprintf(stderr, "adaptive, wrong drafts: %lld steps, %lld plain tokens, %lld switches\n",
            (long long)st.steps, (long long)st.plain, (long long)st.switches);
    ck_assert_int_ge(st.switches, 3);
    ck_assert_int_eq(st.steps, 2 * (st.switches / 2 + 1));
    vclock good = {{want, epyq_model_config(m)->vocab_size, GEN_LONG, false}, 0};
    adaptive_run(m, prompt, &good, got, &st);
    ck_assert(!memcmp(got, want, sizeof want));
    fprintf(stderr, "adaptive, good drafts: %lld steps, %lld plain tokens, %lld switches\n", (long long)st.steps,
            (long long)st.plain, (long long)st.switches);
    /* only the one plain window that measures plain decoding */
    ck_assert_int_le(st.plain, 8);
    ck_assert_int_gt(st.steps, st.plain);
    epyq_model_free(m);
    free(dir);
}
END_TEST

/* Sampling: each emitted token is one draw of the sampler from that position's logits, in
 * order, and a draft is kept only when the draw reproduces it, so a seeded run emits the plain
 * seeded run's tokens exactly (which is the distribution claim, draw for draw). Drafts from the
 * plain sampled output (mostly right, wrong at every fifth position) reach acceptance. */
typedef struct {
    epyq_sampler *smp;
} samp_ctx;

static int32_t pick_sample(void *ctx, const float *logits) {
    samp_ctx *c = ctx;
    int32_t t = epyq_sampler_sample(c->smp, logits);
    epyq_sampler_accept(c->smp, t, true);
    return t;
}

static epyq_sampler *mk_sampler(int32_t V) {
    epyq_sample_params p = {
        .temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .repetition_penalty = 1.1f, .seed = 5};
    epyq_sampler *s = NULL;
    epyq_err err = {0};
    ck_assert(epyq_sampler_create(&s, &p, V, &err) == EPYQ_OK);
    return s;
}

START_TEST(test_sampled_identity) {
    char *dir = synth_model("ct", 61);
    ck_assert(dir);
    epyq_model *m = load(dir, EPYQ_REQUANT_INT4, true);
    int32_t V = epyq_model_config(m)->vocab_size;
    static const int32_t prompt[PROMPT] = {100, 200, 300, 400, 500, 600};
    /* plain sampled run */
    int32_t want[GEN], got[GEN];
    float *lg = malloc((size_t)PROMPT * V * sizeof(float));
    epyq_seq *s = NULL;
    epyq_err err = {0};
    ck_assert(epyq_seq_create(&s, m, 256, EPYQ_KV_BF16, &err) == EPYQ_OK);
    samp_ctx sc = {mk_sampler(V)};
    for (int i = 0; i < PROMPT; i++) epyq_sampler_accept(sc.smp, prompt[i], false);
    feed(m, s, prompt, PROMPT, lg);
    want[0] = pick_sample(&sc, lg + (size_t)(PROMPT - 1) * V);
    for (int i = 1; i < GEN; i++) {
        feed(m, s, &want[i - 1], 1, lg);
        want[i] = pick_sample(&sc, lg);
    }
    epyq_sampler_free(sc.smp);
    epyq_seq_free(s);
    free(lg);
    for (int pass = 0; pass < 2; pass++) {
        oracle orc = {want, V, GEN, false};
        epyq_seq *q = NULL;
        epyq_spec *sp = NULL;
        ck_assert(epyq_seq_create(&q, m, 256, EPYQ_KV_BF16, &err) == EPYQ_OK);
        epyq_spec_opts o = {
            .k = 3, .draft_override = pass ? oracle_draft : NULL, .override_ctx = &orc};
        ck_assert(epyq_spec_create(&sp, m, q, &o, &err) == EPYQ_OK);
        samp_ctx c2 = {mk_sampler(V)};
        for (int i = 0; i < PROMPT; i++) epyq_sampler_accept(c2.smp, prompt[i], false);
        int32_t n = 0, step[EPYQ_SPEC_MAX], got_n;
        ck_assert(epyq_spec_prefill(sp, prompt, PROMPT, pick_sample, &c2, &got[n++], &err) ==
                  EPYQ_OK);
        while (n < GEN) {
            ck_assert(epyq_spec_step(sp, pick_sample, &c2, step, &got_n, &err) == EPYQ_OK);
            for (int32_t i = 0; i < got_n && n < GEN; i++) got[n++] = step[i];
        }
        for (int i = 0; i < GEN; i++)
            ck_assert_msg(got[i] == want[i], "sampled, %s drafts: token %d is %d, plain %d",
                          pass ? "oracle" : "MTP", i, got[i], want[i]);
        if (pass) ck_assert(epyq_spec_get_stats(sp)->accepted[0] > 0);
        epyq_sampler_free(c2.smp);
        epyq_spec_free(sp);
        epyq_seq_free(q);
    }
    epyq_model_free(m);
    free(dir);
}
END_TEST

START_TEST(test_forced) {
    char *dir = synth_model("ct", 41);
    ck_assert(dir);
    epyq_model *m = load(dir, EPYQ_REQUANT_INT4, true);
    static const int32_t prompt[PROMPT] = {2, 4, 8, 16, 32, 64};
    int32_t got[GEN];
    epyq_spec_stats st;
    greedy_spec(m, prompt, 3, true, got, &st);
    ck_assert_int_eq(st.emitted, 4 * st.steps);
    for (int i = 0; i < 3; i++) ck_assert_int_eq(st.accepted[i], st.steps);
    epyq_model_free(m);
    free(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("model_spec");
    TCase *tc = epyq_test_case(s, "spec", 600);
    tcase_add_test(tc, test_rollback_exact);
    tcase_add_loop_test(tc, test_greedy_identity_synth, 0, getenv("EPYQ_FAST") ? 1 : 3);
    EPYQ_TESTS_ADD(tc, test_forced, test_adaptive, test_sampled_identity, test_draft_vocab);
    TCase *fx = epyq_test_case(s, "fixtures", 600);
    if (epyq_test_shared("fixtures/models")) tcase_add_test(fx, test_greedy_identity_fixtures);
    int failed = epyq_test_failures(s, false);
    if (!epyq_test_shared("fixtures/models")) fprintf(stderr, "fixtures: ../shared absent, fixture identity not run\n");
    return failed ? 1 : 0;
}
