/* tests/unit/test_engine.c — the continuous-batching engine and its runner (src/engine) on a
 * synthetic tiny compressed-tensors checkpoint (no ../shared needed):
 *   - a request alone vs the same request admitted mid-way among three others, with a prompt
 *     chunk smaller than its prompt: the same tokens and text (its own sampler and seed);
 *   - the streamed text equals the decode of the tokens; usage counts them;
 *   - cancel at any point: on_done once with "cancelled", its sequence freed at once, the
 *     others go on; slots and the context limit are refused with the reason;
 *   - stop strings: the text ends before the first occurrence, finish "stop";
 *   - logprobs: greedy picks the top entry, entries are log-probabilities in descending order,
 *     prompt logprobs cover every prompt token after the first;
 *   - the runner: a bounded queue refuses at max_queue, a cancelled queued request ends without
 *     running, drain finishes what was admitted;
 *   - MTP speculative decoding per request (k = 1..3): the plain engine's tokens and text. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/runner.h"
#include "tests/check_main.h"
#include "tests/e2e/synth_model.h"
#include "tok/sbuf.h"

static char *g_dir;
static epyq_model *g_m;
static epyq_tok *g_tok;

typedef struct {
    int32_t toks[256];
    int32_t n_tok, n_done, n_prompt_lp, n_lp;
    epyq_sbuf text;
    epyq_engine_finish finish;
    epyq_engine_usage usage;
    bool lp_ok;
    double lp_sum; /* of every generated token's logprob */
} rec;

static void on_event(void *ctx, const epyq_engine_event *ev) {
    rec *r = ctx;
    if (ev->prompt) {
        r->n_prompt_lp++;
        return;
    }
    if (ev->tok >= 0 && r->n_tok < 256) r->toks[r->n_tok++] = ev->tok;
    if (ev->len) epyq_sbuf_add(&r->text, ev->text, ev->len);
    if (ev->lp) {
        r->n_lp++;
        const epyq_engine_logprob *l = ev->lp;
        r->lp_sum += l->logprob;
        if (l->logprob > 0 || l->tok != ev->tok) r->lp_ok = false;
        for (int32_t k = 1; k < l->n_top; k++)
            if (l->top_lp[k] > l->top_lp[k - 1] || l->top_lp[k] > 0) r->lp_ok = false;
    }
}

static void on_done(void *ctx, epyq_engine_finish f, const epyq_engine_usage *u, const epyq_err *err) {
    rec *r = ctx;
    (void)err;
    r->finish = f, r->usage = *u, r->n_done++;
}

static void prompt(int32_t *ids, int n, int salt) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 131u + (unsigned)salt * 977u + 7u) % 997u);
}

static epyq_engine *mk(int32_t seqs, int32_t chunk) {
    epyq_engine *e = NULL;
    epyq_err err = {0};
    const epyq_engine_opts o = {.max_seqs = seqs, .chunk = chunk, .ctx_limit = 256, .kv = EPYQ_KV_BF16};
    ck_assert_msg(epyq_engine_create(&e, g_m, g_tok, &o, &err) == EPYQ_OK, "%s", err.msg);
    return e;
}

static epyq_engine_params params(int32_t max_tokens, float temp, uint64_t seed) {
    epyq_engine_params p = {.max_tokens = max_tokens, .logprobs = -1, .ignore_eos = true};
    p.sp = (epyq_sample_params){.temperature = temp, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = seed};
    return p;
}

static void add(epyq_engine *e, const int32_t *ids, size_t n, const epyq_engine_params *p, rec *r, uint64_t *id) {
    epyq_err err = {0};
    const epyq_engine_cb cb = {on_event, on_done, r};
    ck_assert_msg(epyq_engine_add(e, ids, n, p, &cb, id, &err) == EPYQ_OK, "%s", err.msg);
}

static void run_all(epyq_engine *e) {
    epyq_err err = {0};
    for (int guard = 0; epyq_engine_active(e) > 0; guard++) {
        ck_assert_int_lt(guard, 10000);
        ck_assert_msg(epyq_engine_step(e, &err) == EPYQ_OK, "%s", err.msg);
    }
}

START_TEST(test_alone_vs_together) {
    int32_t a[23], o1[7], o2[40], o3[3];
    prompt(a, 23, 1), prompt(o1, 7, 2), prompt(o2, 40, 3), prompt(o3, 3, 4);
    epyq_engine_params pa = params(20, 0.9f, 11);
    rec alone = {.lp_ok = true}, with = {.lp_ok = true}, r1 = {0}, r2 = {0}, r3 = {0};
    epyq_engine *e = mk(4, 512);
    add(e, a, 23, &pa, &alone, NULL);
    run_all(e);
    epyq_engine_free(e);
    ck_assert_int_eq(alone.n_done, 1);
    ck_assert_int_eq(alone.finish, EPYQ_ENGINE_LENGTH);
    ck_assert_int_eq(alone.usage.n_gen, 20);
    ck_assert_int_eq(alone.usage.n_prompt, 23);
    ck_assert_int_eq(alone.n_tok, 20);
    char *dec = NULL;
    size_t dl;
    ck_assert(epyq_tok_decode(g_tok, alone.toks, (size_t)alone.n_tok, true, &dec, &dl, NULL) == EPYQ_OK);
    ck_assert_str_eq(dec, alone.text.p ? alone.text.p : "");
    free(dec);

    /* chunk 5: A's 23-token prompt takes several steps, shared with the others' */
    e = mk(4, 5);
    epyq_engine_params p1 = params(30, 0.0f, 0), p2 = params(9, 1.0f, 5), p3 = params(50, 0.7f, 2);
    add(e, o1, 7, &p1, &r1, NULL);
    add(e, o2, 40, &p2, &r2, NULL);
    epyq_err err = {0};
    for (int k = 0; k < 4; k++) ck_assert(epyq_engine_step(e, &err) == EPYQ_OK);
    add(e, a, 23, &pa, &with, NULL);
    ck_assert(epyq_engine_step(e, &err) == EPYQ_OK);
    add(e, o3, 3, &p3, &r3, NULL);
    run_all(e);
    epyq_engine_free(e);
    ck_assert_int_eq(with.n_tok, 20);
    ck_assert_mem_eq(with.toks, alone.toks, 20 * sizeof(int32_t));
    ck_assert_str_eq(with.text.p ? with.text.p : "", alone.text.p ? alone.text.p : "");
    ck_assert_int_eq(r1.usage.n_gen, 30);
    ck_assert_int_eq(r2.usage.n_gen, 9);
    ck_assert_int_eq(r3.usage.n_gen, 50);
    epyq_sbuf_free(&alone.text), epyq_sbuf_free(&with.text);
    epyq_sbuf_free(&r1.text), epyq_sbuf_free(&r2.text), epyq_sbuf_free(&r3.text);
}
END_TEST

/* Speculative decoding inside the engine: three greedy requests on one prompt (so one oracle
 * of its plain greedy output makes their drafts right, except at every fifth position: every
 * acceptance length occurs, and several tokens arrive per step) and two sampled ones on other
 * prompts (drafts mostly rejected), admitted together and mid-way, with a small prompt chunk:
 * each request's tokens and text equal the plain engine's, and max_tokens cuts a step's tokens
 * exactly. */
typedef struct {
    const int32_t *want;
    int32_t n, n_prompt;
} spec_oracle;

static int32_t spec_draft(void *ctx, int32_t pos, int32_t d) {
    const spec_oracle *o = ctx;
    int32_t i = pos - o->n_prompt;
    if (i < 0 || i >= o->n) return d;
    return i % 5 == 3 ? (o->want[i] + 1) % 997 : o->want[i];
}

static void spec_round(int32_t spec_k, spec_oracle *orc, const int32_t *a, const int32_t *b,
                       const int32_t *c, rec *r) {
    epyq_engine *e = NULL;
    epyq_err err = {0};
    const epyq_engine_opts o = {.max_seqs = 4,
                                .chunk = 6,
                                .ctx_limit = 256,
                                .kv = EPYQ_KV_BF16,
                                .spec_k = spec_k,
                                .spec_draft_override = spec_k ? spec_draft : NULL,
                                .spec_override_ctx = orc};
    ck_assert_msg(epyq_engine_create(&e, g_m, g_tok, &o, &err) == EPYQ_OK, "%s", err.msg);
    epyq_engine_params g1 = params(40, 0.0f, 0), g2 = params(33, 0.0f, 0), g3 = params(7, 0.0f, 0);
    epyq_engine_params s1 = params(25, 0.9f, 3), s2 = params(30, 0.8f, 9);
    s1.sp.repetition_penalty = 1.1f, s1.sp.top_k = 40;
    g2.logprobs = 3, s2.logprobs = 2; /* each emitted token's own row of the verify logits */
    add(e, a, 17, &g1, &r[0], NULL);
    add(e, b, 9, &s1, &r[1], NULL);
    add(e, a, 17, &g2, &r[2], NULL);
    for (int k = 0; k < 5; k++) ck_assert(epyq_engine_step(e, &err) == EPYQ_OK);
    add(e, c, 12, &s2, &r[3], NULL);
    run_all(e);
    add(e, a, 17, &g3, &r[4], NULL);
    run_all(e);
    if (spec_k) {
        epyq_engine_stats st;
        epyq_engine_get_stats(e, &st);
        fprintf(stderr,
                "engine spec k=%d: %llu steps, %llu tokens, accepted by position %llu %llu\n",
                spec_k, (unsigned long long)st.spec_steps, (unsigned long long)st.spec_emitted,
                (unsigned long long)st.spec_accepted[0], (unsigned long long)st.spec_accepted[1]);
        ck_assert_uint_gt(st.spec_accepted[spec_k - 1], 0); /* whole steps were accepted */
        ck_assert_uint_gt(st.spec_emitted, st.spec_steps);
    }
    epyq_engine_free(e);
}

START_TEST(test_spec) {
    int32_t a[17], b[9], c[12];
    prompt(a, 17, 21), prompt(b, 9, 22), prompt(c, 12, 23);
    rec plain[5] = {0}, spec[5] = {0};
    spec_round(0, NULL, a, b, c, plain);
    spec_oracle orc = {plain[0].toks, plain[0].n_tok, 17};
    for (int32_t k = 1; k <= 3; k++) {
        memset(spec, 0, sizeof spec);
        spec_round(k, &orc, a, b, c, spec);
        for (int i = 0; i < 5; i++) {
            ck_assert_int_eq(spec[i].n_done, 1);
            ck_assert_int_eq(spec[i].finish, plain[i].finish);
            ck_assert_int_eq(spec[i].usage.n_gen, plain[i].usage.n_gen);
            ck_assert_int_eq(spec[i].n_tok, plain[i].n_tok);
            ck_assert_mem_eq(spec[i].toks, plain[i].toks, (size_t)plain[i].n_tok * sizeof(int32_t));
            ck_assert_str_eq(spec[i].text.p ? spec[i].text.p : "",
                             plain[i].text.p ? plain[i].text.p : "");
            ck_assert_int_eq(spec[i].n_lp, plain[i].n_lp);
            ck_assert_msg(spec[i].lp_sum == plain[i].lp_sum,
                          "request %d: logprobs sum %.9g, plain %.9g", i, spec[i].lp_sum,
                          plain[i].lp_sum);
            epyq_sbuf_free(&spec[i].text);
        }
    }
    ck_assert_int_eq(plain[4].n_tok, 7);
    ck_assert_int_eq(plain[2].n_lp, 33);
    for (int i = 0; i < 5; i++) epyq_sbuf_free(&plain[i].text);
}
END_TEST

START_TEST(test_cancel_and_refusals) {
    int32_t a[12], b[30];
    prompt(a, 12, 5), prompt(b, 30, 6);
    epyq_engine *e = mk(2, 8);
    epyq_engine_params p = params(40, 0.5f, 1);
    rec ra = {0}, rb = {0}, rc = {0};
    uint64_t ida, idb;
    add(e, a, 12, &p, &ra, &ida);
    add(e, b, 30, &p, &rb, &idb);
    epyq_err err = {0};
    const epyq_engine_cb cb = {on_event, on_done, &rc};
    ck_assert_int_eq(epyq_engine_add(e, a, 12, &p, &cb, NULL, &err), EPYQ_E_ARG); /* both slots busy */
    ck_assert_int_eq(rc.n_done, 0);
    ck_assert(epyq_engine_step(e, &err) == EPYQ_OK);
    epyq_engine_stats st0, st1;
    epyq_engine_get_stats(e, &st0);
    /* b is still prefilling (chunk 8 < 30): cancelled mid-prompt */
    ck_assert(epyq_engine_cancel(e, idb));
    ck_assert(!epyq_engine_cancel(e, idb));
    ck_assert_int_eq(rb.n_done, 1);
    ck_assert_int_eq(rb.finish, EPYQ_ENGINE_CANCELLED);
    ck_assert_int_eq(epyq_engine_active(e), 1);
    epyq_engine_get_stats(e, &st1);
    ck_assert(st1.kv_bytes > 0 && st1.kv_bytes < st0.kv_bytes);
    for (int k = 0; k < 5; k++) ck_assert(epyq_engine_step(e, &err) == EPYQ_OK);
    ck_assert(epyq_engine_cancel(e, ida)); /* mid-decode */
    ck_assert_int_eq(ra.n_done, 1);
    ck_assert_int_eq(ra.finish, EPYQ_ENGINE_CANCELLED);
    ck_assert(ra.usage.n_gen > 0 && ra.usage.n_gen < 40);
    epyq_engine_get_stats(e, &st1);
    ck_assert_int_eq(epyq_engine_active(e), 0);
    ck_assert_uint_eq(st1.kv_bytes, 0);
    int32_t big[256];
    prompt(big, 256, 7);
    ck_assert_int_eq(epyq_engine_add(e, big, 256, &p, &cb, NULL, &err), EPYQ_E_CTX_FULL);
    ck_assert(strstr(err.msg, "256") != NULL);
    ck_assert_int_eq(epyq_engine_add(e, big, 0, &p, &cb, NULL, &err), EPYQ_E_ARG);
    /* max_tokens past the context: clamped, finish length at the limit */
    epyq_engine_params pl = params(1000, 0.5f, 1);
    add(e, big, 250, &pl, &rc, NULL);
    run_all(e);
    ck_assert_int_eq(rc.finish, EPYQ_ENGINE_LENGTH);
    ck_assert_int_eq(rc.usage.n_gen, 6);
    epyq_engine_free(e);
    epyq_sbuf_free(&ra.text), epyq_sbuf_free(&rb.text), epyq_sbuf_free(&rc.text);
}
END_TEST

START_TEST(test_stop_strings) {
    int32_t a[10];
    prompt(a, 10, 8);
    epyq_engine_params p = params(60, 0.0f, 0);
    rec full = {0}, cut = {0};
    epyq_engine *e = mk(2, 64);
    add(e, a, 10, &p, &full, NULL);
    run_all(e);
    ck_assert(full.text.len > 12);
    char stop[4] = {0};
    for (size_t i = 8; i + 3 <= full.text.len && !stop[0]; i++) /* three ASCII characters */
        if ((unsigned char)(full.text.p[i] - 0x21) < 0x5e && (unsigned char)(full.text.p[i + 1] - 0x20) < 0x5f &&
            (unsigned char)(full.text.p[i + 2] - 0x20) < 0x5f)
            memcpy(stop, full.text.p + i, 3);
    ck_assert_msg(stop[0], "no ASCII run in the output to stop at");
    const char *first = strstr(full.text.p, stop);
    ck_assert_ptr_nonnull(first);
    p.stop[0] = "never-in-this-output-\x01", p.stop[1] = stop, p.n_stop = 2;
    add(e, a, 10, &p, &cut, NULL);
    run_all(e);
    ck_assert_int_eq(cut.finish, EPYQ_ENGINE_STOP);
    ck_assert_uint_eq(cut.text.len, (size_t)(first - full.text.p));
    ck_assert(cut.text.len == 0 || !memcmp(cut.text.p, full.text.p, cut.text.len));
    ck_assert_int_lt(cut.usage.n_gen, 60);
    epyq_engine_free(e);
    epyq_sbuf_free(&full.text), epyq_sbuf_free(&cut.text);
}
END_TEST

START_TEST(test_logprobs) {
    int32_t a[9];
    prompt(a, 9, 9);
    epyq_engine_params p = params(6, 0.0f, 0);
    p.logprobs = 5, p.prompt_logprobs = true;
    rec r = {.lp_ok = true};
    epyq_engine *e = mk(1, 4);
    add(e, a, 9, &p, &r, NULL);
    run_all(e);
    ck_assert(r.lp_ok);
    ck_assert_int_eq(r.n_lp, 6);
    ck_assert_int_eq(r.n_prompt_lp, 8);
    epyq_engine_free(e);
    epyq_sbuf_free(&r.text);
    /* greedy = the top entry of the raw distribution (no penalties here) */
    float lg[5] = {0.5f, 2.0f, -1.0f, 2.0f, 0.0f};
    epyq_engine_logprob l;
    epyq_engine_logprob_of(lg, 5, 1, 3, &l);
    ck_assert_int_eq(l.n_top, 3);
    ck_assert_int_eq(l.top_ids[0], 1);
    ck_assert_int_eq(l.top_ids[1], 3);
    ck_assert_int_eq(l.top_ids[2], 0);
    double z = exp(0.5) + 2 * exp(2.0) + exp(-1.0) + 1.0;
    ck_assert(fabs(l.logprob - (2.0 - log(z))) < 1e-5);
}
END_TEST

/* the runner's callbacks run on its thread; the test reads the records after free (joined) */
static struct {
    rec r[6];
} g_sr;

static void r_event(void *ctx, const epyq_engine_event *ev) { (void)ctx, (void)ev; }
static void r_done(void *ctx, epyq_engine_finish f, const epyq_engine_usage *u, const epyq_err *err) { on_done(ctx, f, u, err); }

START_TEST(test_runner_queue) {
    epyq_engine *e = mk(1, 64);
    epyq_runner *run = NULL;
    epyq_err err = {0};
    ck_assert(epyq_runner_create(&run, e, 2, &err) == EPYQ_OK);
    int32_t a[5];
    prompt(a, 5, 10);
    epyq_engine_params p = params(200, 0.5f, 1);
    uint64_t t[6];
    epyq_runner_verdict v[6];
    for (int i = 0; i < 6; i++) {
        const epyq_engine_cb cb = {r_event, r_done, &g_sr.r[i]};
        ck_assert(epyq_runner_submit(run, a, 5, &p, &cb, &t[i], &v[i], &err) == EPYQ_OK);
    }
    /* one slot + two waiting; the first may already have been admitted, freeing nothing */
    int accepted = 0;
    for (int i = 0; i < 6; i++) accepted += v[i] == EPYQ_RUNNER_ACCEPTED;
    ck_assert_int_ge(accepted, 3);
    ck_assert_int_le(accepted, 4);
    ck_assert_int_eq(v[5], EPYQ_RUNNER_QUEUE_FULL);
    epyq_runner_cancel(run, t[2]); /* queued behind the first: never runs */
    ck_assert_int_eq(epyq_runner_drain(run, 60.0), 0);
    const epyq_engine_cb cb = {r_event, r_done, &g_sr.r[5]};
    epyq_runner_submit(run, a, 5, &p, &cb, NULL, &v[5], &err);
    ck_assert_int_eq(v[5], EPYQ_RUNNER_DRAINING);
    epyq_runner_free(run);
    epyq_engine_free(e);
    for (int i = 0; i < 6; i++) {
        if (v[i] != EPYQ_RUNNER_ACCEPTED) continue;
        ck_assert_int_eq(g_sr.r[i].n_done, 1);
        ck_assert_int_eq(g_sr.r[i].finish, i == 2 ? EPYQ_ENGINE_CANCELLED : EPYQ_ENGINE_LENGTH);
    }
    ck_assert_int_eq(g_sr.r[2].usage.n_gen, 0);
}
END_TEST

int main(void) {
    if (synth_model_load_tiny(&g_dir, &g_m, &g_tok)) return EXIT_FAILURE;
    Suite *s = suite_create("engine");
    TCase *tc = epyq_test_case(s, "engine", 0);
    EPYQ_TESTS_ADD(tc, test_alone_vs_together, test_cancel_and_refusals, test_stop_strings,
                   test_logprobs, test_runner_queue, test_spec);
    int nf = epyq_test_failures(s, true); /* the model is loaded once for every test */
    epyq_tok_free(g_tok);
    epyq_model_free(g_m);
    free(g_dir);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
