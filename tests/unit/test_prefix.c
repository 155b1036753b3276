/* tests/unit/test_prefix.c — prefix reuse in the engine (src/engine/prefix.c and the hooks in
 * engine.c) on a synthetic tiny compressed-tensors checkpoint:
 *   - 16 requests sharing a 300-token prefix, admitted together 8 at a time: every request's
 *     tokens equal those of the same job with the cache off (greedy and seeded sampling); the
 *     prompt tokens computed stay within prefix + suffixes + n x granularity (here exactly
 *     prefix + suffixes: the shared part gets a copy where it ends); each request after the
 *     first reports the cached prefix in usage;
 *   - a prompt that extends an earlier one starts from that one's end-of-prompt copy;
 *   - a budget of about two copies: the cache never holds more than its budget (checked after
 *     every step), evicts, and the outputs are still those of the cache off. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "tests/check_main.h"
#include "tests/e2e/synth_model.h"

#define NREQ 16
#define PREFIX 300
#define EVERY 32
#define GEN 6

static char *g_dir;
static epyq_model *g_m;
static epyq_tok *g_tok;

typedef struct {
    int32_t toks[GEN];
    int32_t n_tok, n_done;
    epyq_engine_usage usage;
} rec;

static void on_event(void *ctx, const epyq_engine_event *ev) {
    rec *r = ctx;
    if (!ev->prompt && ev->tok >= 0 && r->n_tok < GEN) r->toks[r->n_tok++] = ev->tok;
}

static void on_done(void *ctx, epyq_engine_finish f, const epyq_engine_usage *u,
                    const epyq_err *err) {
    rec *r = ctx;
    (void)f, (void)err;
    r->usage = *u, r->n_done++;
}

typedef struct {
    int32_t ids[PREFIX + 64];
    int32_t n;
} prompt;

/* Prompt i: the shared prefix of group g, then a suffix of its own of 1..40 tokens. */
static void mk_prompt(prompt *p, int i, int g, int prefix) {
    p->n = 0;
    for (int k = 0; k < prefix; k++)
        p->ids[p->n++] = (int32_t)((k * 131u + (unsigned)g * 7919u + 3u) % 1000u);
    int suf = 1 + (i * 13) % 40;
    for (int k = 0; k < suf; k++)
        p->ids[p->n++] = (int32_t)((k * 37u + (unsigned)i * 977u + 11u) % 1000u);
}

typedef struct {
    epyq_engine_stats st;
    uint64_t max_cache_bytes;
} run_stats;

/* Run n requests, admitting into free slots in order, as epyq batch does. */
static void run_job(const prompt *ps, int n, uint64_t cache_bytes, rec *out, run_stats *rs) {
    epyq_engine *e = NULL;
    epyq_err err = {0};
    const epyq_engine_opts o = {.max_seqs = 8,
                                .chunk = 96,
                                .ctx_limit = 512,
                                .kv = EPYQ_KV_BF16,
                                .cache_bytes = cache_bytes,
                                .cache_every = EVERY};
    ck_assert_msg(epyq_engine_create(&e, g_m, g_tok, &o, &err) == EPYQ_OK, "%s", err.msg);
    memset(out, 0, (size_t)n * sizeof *out);
    memset(rs, 0, sizeof *rs);
    int next = 0;
    for (int guard = 0; next < n || epyq_engine_active(e) > 0; guard++) {
        ck_assert_int_lt(guard, 100000);
        while (next < n && epyq_engine_free_slots(e) > 0) {
            epyq_engine_params p = {.max_tokens = GEN, .logprobs = -1, .ignore_eos = true};
            /* odd requests sample (own seed), even ones are greedy */
            p.sp = (epyq_sample_params){.temperature = next % 2 ? 0.8f : 0.0f,
                                        .top_p = 1.0f,
                                        .repetition_penalty = 1.0f,
                                        .seed = (uint64_t)next + 1};
            const epyq_engine_cb cb = {on_event, on_done, &out[next]};
            ck_assert_msg(epyq_engine_add(e, ps[next].ids, (size_t)ps[next].n, &p, &cb, NULL,
                                          &err) == EPYQ_OK,
                          "%s", err.msg);
            next++;
        }
        ck_assert_msg(epyq_engine_step(e, &err) == EPYQ_OK, "%s", err.msg);
        epyq_engine_get_stats(e, &rs->st);
        if (rs->st.cache_bytes > rs->max_cache_bytes) rs->max_cache_bytes = rs->st.cache_bytes;
        ck_assert_uint_le(rs->st.cache_bytes, cache_bytes);
    }
    epyq_engine_free(e);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(out[i].n_done, 1);
        ck_assert_int_eq(out[i].n_tok, GEN);
    }
}

START_TEST(test_shared_prefix) {
    static prompt ps[NREQ];
    static rec off[NREQ], on[NREQ];
    uint64_t total = 0, suffixes = 0;
    for (int i = 0; i < NREQ; i++) {
        mk_prompt(&ps[i], i, 0, PREFIX);
        total += (uint64_t)ps[i].n, suffixes += (uint64_t)(ps[i].n - PREFIX);
    }
    run_stats a, b;
    run_job(ps, NREQ, 0, off, &a);
    run_job(ps, NREQ, 64u << 20, on, &b);
    ck_assert_uint_eq(a.st.prompt_tokens, total);
    ck_assert_uint_eq(a.st.cached_tokens, 0);
    uint64_t cached = 0;
    for (int i = 0; i < NREQ; i++) {
        ck_assert_mem_eq(on[i].toks, off[i].toks, GEN * sizeof(int32_t));
        ck_assert_int_eq(off[i].usage.n_cached, 0);
        ck_assert_int_eq(on[i].usage.n_prompt, ps[i].n);
        /* the first computes the prefix; the ones admitted with it wait and have it copy its
         * state where the shared part ends (300 is not a multiple of EVERY); later ones find
         * that copy too */
        ck_assert_int_eq(on[i].usage.n_cached, i == 0 ? 0 : PREFIX);
        cached += (uint64_t)on[i].usage.n_cached;
    }
    ck_assert_uint_eq(b.st.cached_tokens, cached);
    ck_assert_uint_eq(b.st.prompt_tokens + b.st.cached_tokens, total);
    ck_assert_uint_le(b.st.prompt_tokens, PREFIX + suffixes + (uint64_t)NREQ * EVERY);
    ck_assert_uint_eq(b.st.prompt_tokens, PREFIX + suffixes);
    fprintf(stderr,
            "shared prefix: %d requests, prompt tokens computed %llu (off: %llu), cached %llu\n",
            NREQ, (unsigned long long)b.st.prompt_tokens, (unsigned long long)a.st.prompt_tokens,
            (unsigned long long)b.st.cached_tokens);
}
END_TEST

START_TEST(test_extends_earlier_prompt) {
    prompt ps[2];
    mk_prompt(&ps[0], 3, 5, 50); /* 50 + 1 + 39 = 90 tokens: not a multiple of EVERY */
    ps[1] = ps[0];
    for (int k = 0; k < 20; k++) ps[1].ids[ps[1].n++] = (int32_t)(500 + k);
    rec off[2], on[2];
    run_stats a, b;
    run_job(ps, 2, 0, off, &a);
    run_job(ps, 2, 64u << 20, on, &b);
    ck_assert_int_eq(on[0].usage.n_cached, 0);
    ck_assert_int_eq(on[1].usage.n_cached, ps[0].n); /* the end-of-prompt copy */
    for (int i = 0; i < 2; i++) ck_assert_mem_eq(on[i].toks, off[i].toks, GEN * sizeof(int32_t));
}
END_TEST

START_TEST(test_lru_budget) {
    /* three groups of prefixes interleaved: the cache cannot keep them all */
    enum { N = 12 };
    static prompt ps[N];
    for (int i = 0; i < N; i++) mk_prompt(&ps[i], i, i % 3, 100);
    epyq_seq *s;
    epyq_err err = {0};
    ck_assert(epyq_seq_create(&s, g_m, 128, EPYQ_KV_BF16, &err) == EPYQ_OK);
    uint64_t one = epyq_seq_snapshot_size(s, 96); /* a copy at the last checkpoint inside 100 */
    epyq_seq_free(s);
    uint64_t budget = one * 5 / 2;
    static rec off[N], on[N];
    run_stats a, b;
    run_job(ps, N, 0, off, &a);
    run_job(ps, N, budget, on, &b); /* run_job checks cache_bytes <= budget after every step */
    for (int i = 0; i < N; i++) ck_assert_mem_eq(on[i].toks, off[i].toks, GEN * sizeof(int32_t));
    ck_assert_uint_gt(b.st.cache_evicted, 0);
    ck_assert_uint_le(b.max_cache_bytes, budget);
    ck_assert_uint_gt(b.st.cached_tokens, 0);
    fprintf(stderr, "lru: budget %llu bytes (2.5 copies), peak %llu, evicted %llu, cached %llu\n",
            (unsigned long long)budget, (unsigned long long)b.max_cache_bytes,
            (unsigned long long)b.st.cache_evicted, (unsigned long long)b.st.cached_tokens);
    /* a budget below one copy keeps nothing and changes nothing */
    run_job(ps, N, one / 2, on, &b);
    ck_assert_uint_eq(b.st.cache_entries, 0);
    ck_assert_uint_eq(b.st.cached_tokens, 0);
    for (int i = 0; i < N; i++) ck_assert_mem_eq(on[i].toks, off[i].toks, GEN * sizeof(int32_t));
}
END_TEST

int main(void) {
    if (synth_model_load_tiny(&g_dir, &g_m, &g_tok)) return EXIT_FAILURE;
    Suite *s = suite_create("prefix");
    TCase *tc = epyq_test_case(s, "prefix", 600);
    EPYQ_TESTS_ADD(tc, test_shared_prefix, test_extends_earlier_prompt, test_lru_budget);
    int nf = epyq_test_failures(s, true); /* the model is loaded once for every test */
    epyq_tok_free(g_tok);
    epyq_model_free(g_m);
    free(g_dir);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
