/* tests/failnth/test_failnth.c — fail the Nth allocation, for every N (SQLite's habit).
 *
 * Each path is first run with the hook counting only (it must succeed: that gives its
 * allocation count C and the reference result); then for every N in 1..C it runs with the Nth
 * allocation failing, once in "fail once" mode and once in "fail from N on" mode. Every run
 * must end in one of two ways: a clean failure (a status, a non-empty one-line message) or a
 * success whose result equals the reference (a failure the code legitimately worked around).
 * Never a crash; and in the ASan build of .ci/run, LeakSanitizer is asked after every run
 * whether anything leaked. Paths: template parse + render (the Qwen3.6 template), tokenizer
 * load + one encode, model load (a tiny ct checkpoint with MTP), and one batched forward of
 * two sequences on a loaded model, where a failure must leave the sequences refusing further
 * steps until they are reset (model.h), after which they give the reference logits again.
 *
 * The hook (tests/failnth/alloc_fail.c) only sees allocations made by code linked statically;
 * the model runs on one thread so the Nth allocation is the same one on every run.
 * EPYQ_FAILNTH_STRIDE=K tests every Kth N only, EPYQ_FAILNTH_FROM=N starts at N (local runs;
 * with EPYQ_FAILNTH_BACKTRACE=1 the hook prints where each injected failure happens); under
 * EPYQ_FAST the two long paths take a stride (stride_for). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "chat/jinja.h"
#include "model/model.h"
#include "synth/synth.h"
#include "tests/check_main.h"
#include "tests/failnth/alloc_fail.h"
#include "tests/testutil.h"
#include "tok/tokenizer.h"

extern const char epyq_synth_chat_template[];

/* Present only in sanitizer builds; weak so the gcc build links without it. */
int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

static char *g_dir; /* the tiny checkpoint, written once per process */
/* Set by an attempt that saw a broken promise while the hook was armed (no ck_assert there:
 * Check allocates to record an assertion); checked once the hook is disarmed. */
static const char *g_violation;

/* LeakSanitizer after the attempt of n (sanitizer builds only). One check scans the whole
 * heap (tens of ms under ASan), so loops of more than 500 N check every LEAK_EVERY
 * attempts and at the end of each mode: a report names the range of N to rerun with
 * EPYQ_FAILNTH_FROM / EPYQ_FAILNTH_STRIDE. *since: the first N not yet checked. */
enum { LEAK_EVERY = 16 };
static void leak_check(const char *what, long *since, long n, long step, bool persist, long count) {
    if (!__lsan_do_recoverable_leak_check) return;
    bool last = n + step > count, every = count / step <= 500;
    if (!every && !last && n - *since < (LEAK_EVERY - 1) * step) return;
    ck_assert_msg(__lsan_do_recoverable_leak_check() == 0, "%s, N in [%ld, %ld]%s: memory leaked (report above)",
                  what, *since, n, persist ? " (fail from N on)" : "");
    *since = n + step;
}

/* One attempt of a path: does the whole operation, frees what it made (on success and on
 * failure) and returns its status. On success it also copies a result to compare into
 * out[RESULT_MAX] (a fixed buffer: the test itself allocates nothing while the hook is armed). */
enum { RESULT_MAX = 1 << 16 };
typedef epyq_status (*attempt_fn)(void *ctx, epyq_err *err, char *out, size_t *len);

typedef struct {
    long count, clean_failures, workarounds, unusable;
} loop_stats;

static long env_long(const char *name, long dflt) {
    const char *s = getenv(name);
    long k = s ? strtol(s, NULL, 10) : dflt;
    return k > 0 ? k : dflt;
}

/* Every N by default (the gcc stage of .ci/run: ~2.5 min, mostly the model load's 23 k
 * loads). Under EPYQ_FAST (the ASan stage, where one forward or load is ~10x slower) the two
 * long paths take every fast-th N: the model load every 11th, the forward every 3rd. */
static long stride_for(long fast) { return env_long("EPYQ_FAILNTH_STRIDE", getenv("EPYQ_FAST") ? fast : 1); }
static long first_n(void) { return env_long("EPYQ_FAILNTH_FROM", 1); }

static void run_loop(const char *what, attempt_fn fn, void *ctx, long fast_stride, loop_stats *out) {
    epyq_err err = {0};
    static char ref[RESULT_MAX], got[RESULT_MAX];
    size_t ref_len = 0, got_len = 0;
    /* a first run outside the count: one-time initialisation (e.g. kernel tables) is not
     * part of the path's steady allocation sequence */
    epyq_status st = fn(ctx, &err, ref, &ref_len);
    ck_assert_msg(st == EPYQ_OK, "%s without injected failures: %s", what, err.msg);
    epyq_alloc_fail_at(0, false);
    st = fn(ctx, &err, ref, &ref_len);
    long count = epyq_alloc_count();
    ck_assert_msg(st == EPYQ_OK, "%s without injected failures: %s", what, err.msg);
    ck_assert_msg(count > 0, "%s: the hook saw no allocation (is the program linked with --wrap?)", what);
    memset(out, 0, sizeof *out);
    out->count = count;
    long k = stride_for(fast_stride);
    for (int persist = 0; persist < 2; persist++)
        for (long n = first_n(), since = n; n <= count; n += k) {
            epyq_err_clear(&err);
            epyq_alloc_fail_at(n, persist);
            g_violation = NULL;
            st = fn(ctx, &err, got, &got_len);
            long failed = epyq_alloc_failures();
            epyq_alloc_fail_at(0, false);
            ck_assert_msg(!g_violation, "%s, N = %ld%s: %s", what, n, persist ? "+" : "", g_violation);
            ck_assert_msg(failed > 0, "%s, N = %ld: the Nth allocation was not reached (count %ld)", what, n, count);
            if (st == EPYQ_OK) {
                ck_assert_msg(got_len == ref_len && !memcmp(got, ref, ref_len),
                              "%s, N = %ld%s: succeeded with a different result", what, n, persist ? "+" : "");
                out->workarounds++;
            } else {
                ck_assert_msg(err.code == st && err.msg[0] && !strchr(err.msg, '\n'),
                              "%s, N = %ld%s: status %s with message '%s' (want one non-empty line)", what, n,
                              persist ? "+" : "", epyq_status_name(st), err.msg);
                out->clean_failures++;
            }
            leak_check(what, &since, n, k, persist, count);
        }
    printf("failnth: %s: N = 1..%ld (step %ld), fail once and fail from N: %ld clean failures, %ld worked around\n",
           what, count, k, out->clean_failures, out->workarounds);
}

/* ---- template parse + render ---------------------------------------------------------- */

static const char VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    "{\"role\": \"user\", \"content\": \"hi\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nok\", \"tool_calls\": ["
    "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"c\": \"s\"}}}]},"
    "{\"role\": \"tool\", \"content\": \"{\\\"r\\\": 1}\"}, {\"role\": \"user\", \"content\": \"again\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    "\"add_generation_prompt\": true, \"enable_thinking\": true}";

static epyq_status attempt_template(void *ctx, epyq_err *err, char *out, size_t *len) {
    const cJSON *vars = ctx;
    epyq_jinja *t = NULL;
    char *text = NULL;
    epyq_status st = epyq_jinja_parse(epyq_synth_chat_template, strlen(epyq_synth_chat_template),
                                      "qwen", &t, err);
    if (st != EPYQ_OK && t) g_violation = "a failed parse returned a template";
    if (st == EPYQ_OK) {
        st = epyq_jinja_render(t, vars, NULL, &text, len, err);
        if (st != EPYQ_OK && text) g_violation = "a failed render returned text";
    }
    if (st == EPYQ_OK && *len > RESULT_MAX) st = epyq_err_set(err, EPYQ_E_INTERNAL, "test: render too long");
    if (st == EPYQ_OK) memcpy(out, text, *len);
    free(text);
    epyq_jinja_free(t);
    return st;
}

START_TEST(template_parse_render) {
    cJSON *vars = cJSON_Parse(VARS);
    ck_assert(vars);
    loop_stats s;
    run_loop("template parse + render", attempt_template, vars, 1, &s);
    ck_assert_int_gt(s.clean_failures, 0);
    cJSON_Delete(vars);
}
END_TEST

/* ---- tokenizer load + encode ---------------------------------------------------------- */

static epyq_status attempt_tok(void *ctx, epyq_err *err, char *out, size_t *len) {
    (void)ctx;
    epyq_tok *t = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    static const char text[] = "<|im_start|>user\nHello, world! caf\xc3\xa9 123<|im_end|>";
    epyq_status st = epyq_tok_load(&t, g_dir, err);
    if (st != EPYQ_OK && t) g_violation = "a failed load returned a tokenizer";
    if (st == EPYQ_OK) st = epyq_tok_encode_ex(t, text, strlen(text), EPYQ_TOK_ENC_SPLIT_SPECIAL, &ids, &n, err);
    if (st == EPYQ_OK) {
        *len = n * sizeof *ids;
        if (*len > RESULT_MAX) st = epyq_err_set(err, EPYQ_E_INTERNAL, "test: too many ids");
        else memcpy(out, ids, *len);
    }
    free(ids);
    epyq_tok_free(t);
    return st;
}

START_TEST(tokenizer_load) {
    loop_stats s;
    run_loop("tokenizer load + encode", attempt_tok, NULL, 1, &s);
    ck_assert_int_gt(s.clean_failures, 0);
}
END_TEST

/* ---- model load ------------------------------------------------------------------------- */

static epyq_status attempt_model_load(void *ctx, epyq_err *err, char *out, size_t *len) {
    (void)ctx;
    epyq_model *m = NULL;
    epyq_model_opts o = {.n_threads = 1};
    epyq_status st = epyq_model_load(&m, g_dir, &o, err);
    if (st != EPYQ_OK && m) g_violation = "a failed load returned a model";
    if (st == EPYQ_OK) {
        /* what a successful load must agree on */
        uint64_t facts[3] = {epyq_model_active_bytes(m), (uint64_t)epyq_model_has_mtp(m),
                             (uint64_t)epyq_model_config(m)->vocab_size};
        *len = sizeof facts;
        memcpy(out, facts, sizeof facts);
    }
    epyq_model_free(m);
    return st;
}

START_TEST(model_load) {
    loop_stats s;
    run_loop("model load", attempt_model_load, NULL, 11, &s);
    ck_assert_int_gt(s.clean_failures, 0);
}
END_TEST

/* ---- one batched forward ---------------------------------------------------------------- */

typedef struct {
    epyq_model *m;
    epyq_seq *a, *b;
    float *logits; /* [STEP][V], allocated before the hook is armed */
} fwd_ctx;

enum { PRE_A = 5, STEP_A = 3, STEP_B = 2, STEP = STEP_A + STEP_B };

/* Sequence a holds a 5-token prefix; the step is a batch of 3 more tokens of a and the first
 * 2 of b, interleaved, with logits for every token. */
static epyq_status prefill(fwd_ctx *c, epyq_err *err) {
    epyq_seq_reset(c->a);
    epyq_seq_reset(c->b);
    static const int32_t ids[PRE_A] = {11, 222, 33, 404, 5};
    epyq_seq *ss[PRE_A] = {c->a, c->a, c->a, c->a, c->a};
    epyq_batch bt = {PRE_A, ss, ids, NULL};
    return epyq_model_forward(c->m, &bt, NULL, NULL, err);
}

static epyq_status step(fwd_ctx *c, float *logits, epyq_err *err) {
    static const int32_t ids[STEP] = {17, 300, 42, 501, 9};
    epyq_seq *ss[STEP] = {c->a, c->b, c->a, c->b, c->a};
    epyq_batch bt = {STEP, ss, ids, NULL};
    return epyq_model_forward(c->m, &bt, logits, NULL, err);
}

/* The step (under the hook when armed: no ck_assert in here, Check allocates to record a
 * passing assertion too); logits into c->logits. */
static epyq_status attempt_forward(fwd_ctx *c, epyq_err *err) { return step(c, c->logits, err); }

static void check_moved(const fwd_ctx *c, long n) {
    ck_assert_msg(epyq_seq_pos(c->a) == PRE_A + STEP_A && epyq_seq_pos(c->b) == STEP_B,
                  "forward, N = %ld: positions %d and %d after a successful step", n, epyq_seq_pos(c->a),
                  epyq_seq_pos(c->b));
}

/* A step that failed at allocation n: one clean line, positions not moved, and then either
 *  - nothing had changed yet: the same step again gives the reference logits; or
 *  - states had moved: both sequences refuse every further token with a message naming the
 *    way out (reset) until they are reset; after the reset and the same prefix the step gives
 *    the reference logits again.
 * A sequence left half-advanced and still accepted would give other logits on the retry. */
static void check_failed_step(fwd_ctx *c, epyq_status st, const epyq_err *err, long n, bool persist,
                              const float *ref, size_t ref_len, loop_stats *s) {
    ck_assert_msg(err->code == st && err->msg[0] && !strchr(err->msg, '\n'),
                  "forward, N = %ld%s: status %s with message '%s'", n, persist ? "+" : "", epyq_status_name(st),
                  err->msg);
    ck_assert_int_eq(epyq_seq_pos(c->a), PRE_A);
    ck_assert_int_eq(epyq_seq_pos(c->b), 0);
    epyq_err e2 = {0};
    epyq_status again = attempt_forward(c, &e2);
    if (again == EPYQ_OK) {
        check_moved(c, n);
        ck_assert_msg(!memcmp(c->logits, ref, ref_len), "forward, N = %ld%s: the failed step changed a sequence", n,
                      persist ? "+" : "");
        return;
    }
    s->unusable++;
    ck_assert_msg(again == EPYQ_E_ARG && strstr(e2.msg, "reset") && !strchr(e2.msg, '\n'),
                  "forward, N = %ld: retry: %s %s", n, epyq_status_name(again), e2.msg);
    epyq_seq *sb = c->b;
    int32_t id = 7;
    epyq_batch one = {1, &sb, &id, NULL};
    ck_assert_msg(epyq_model_forward(c->m, &one, NULL, NULL, &e2) == EPYQ_E_ARG && strstr(e2.msg, "reset"),
                  "forward, N = %ld: sequence b of the failed step accepted another token", n);
    ck_assert_msg(prefill(c, &e2) == EPYQ_OK, "forward, N = %ld: prefill after reset: %s", n, e2.msg);
    ck_assert_msg(attempt_forward(c, &e2) == EPYQ_OK, "forward, N = %ld: after reset: %s", n, e2.msg);
    check_moved(c, n);
    ck_assert_msg(!memcmp(c->logits, ref, ref_len), "forward, N = %ld: after reset: different logits", n);
}

/* Not run_loop: every attempt needs the prefix laid down again with the hook disarmed, and a
 * failure has more to check. */
START_TEST(batched_forward) {
    epyq_err err = {0};
    fwd_ctx c = {0};
    /* chunked DeltaNet from 3 tokens: the prefix takes the chunked path, the step both */
    epyq_model_opts o = {.n_threads = 1, .gdn_chunk_min = 3};
    ck_assert_msg(epyq_model_load(&c.m, g_dir, &o, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert(epyq_seq_create(&c.a, c.m, 32, EPYQ_KV_BF16, &err) == EPYQ_OK);
    ck_assert(epyq_seq_create(&c.b, c.m, 32, EPYQ_KV_BF16, &err) == EPYQ_OK);
    size_t ref_len = STEP * (size_t)epyq_model_config(c.m)->vocab_size * sizeof(float);
    c.logits = malloc(ref_len);
    float *ref = malloc(ref_len);
    ck_assert(c.logits && ref);
    /* a first step outside the count (one-time initialisation is not part of a step) */
    ck_assert_msg(prefill(&c, &err) == EPYQ_OK && attempt_forward(&c, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_msg(prefill(&c, &err) == EPYQ_OK, "%s", err.msg);
    epyq_alloc_fail_at(0, false);
    epyq_status st0 = attempt_forward(&c, &err);
    long count = epyq_alloc_count(); /* read before any ck_assert: Check allocates too */
    ck_assert_msg(st0 == EPYQ_OK, "%s", err.msg);
    check_moved(&c, 0);
    ck_assert_int_gt(count, 0);
    memcpy(ref, c.logits, ref_len);
    loop_stats s = {.count = count};
    long k = stride_for(3);
    for (int persist = 0; persist < 2; persist++)
        for (long n = first_n(), since = n; n <= count; n += k) {
            epyq_err_clear(&err);
            ck_assert_msg(prefill(&c, &err) == EPYQ_OK, "prefill: %s", err.msg);
            epyq_alloc_fail_at(n, persist);
            epyq_status st = attempt_forward(&c, &err);
            long failed = epyq_alloc_failures();
            epyq_alloc_fail_at(0, false);
            ck_assert_msg(failed > 0, "forward, N = %ld: not reached (count %ld)", n, count);
            if (st == EPYQ_OK) {
                check_moved(&c, n);
                ck_assert_msg(!memcmp(c.logits, ref, ref_len), "forward, N = %ld: succeeded with different logits", n);
                s.workarounds++;
            } else {
                check_failed_step(&c, st, &err, n, persist, ref, ref_len, &s);
                s.clean_failures++;
            }
            leak_check("forward", &since, n, k, persist, count);
        }
    printf("failnth: batched forward (2 sequences, %d tokens): N = 1..%ld (step %ld), fail once and fail from N: "
           "%ld clean failures (%ld left the sequences refusing until reset), %ld worked around\n", STEP, count, k,
           s.clean_failures, s.unusable, s.workarounds);
    ck_assert_int_gt(s.unusable, 0);
    free(ref);
    free(c.logits);
    epyq_seq_free(c.a);
    epyq_seq_free(c.b);
    epyq_model_free(c.m);
}
END_TEST

static char *write_model(void) {
    char *dir = epyq_test_tmpdir();
    epyq_err err = {0};
    epyq_synth_opts o = {0};
    epyq_synth_stats st;
    if (!dir) return NULL;
    o.out_dir = dir;
    o.format = (epyq_synth_format)epyq_synth_format_parse("ct");
    o.seed = 18;
    /* the smallest checkpoint with every block kind: 3 DeltaNet + 1 attention layer, 8
     * experts (= top-k), MTP; the fewer tensors, the fewer N to try */
    if (epyq_synth_dims_init(&o.dims, "tiny", 4, 8, 512, &err) != EPYQ_OK || epyq_synth_write(&o, &st, &err) != EPYQ_OK) {
        fprintf(stderr, "test_failnth: cannot write the checkpoint: %s\n", err.msg);
        free(dir);
        return NULL;
    }
    return dir;
}

static void add_case(Suite *s, const char *name, const TTest *test) {
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, 3600);
    tcase_add_test(tc, test);
    suite_add_tcase(s, tc);
}

int main(void) {
    epyq_alloc_fail_hook_cjson();
    g_dir = write_model();
    if (!g_dir) return 1;
    epyq_err err = {0};
    if (epyq_kern_init(&err) != EPYQ_OK) {
        fprintf(stderr, "test_failnth: %s\n", err.msg);
        return 1;
    }
    Suite *s = suite_create("failnth");
    /* one case per path, so CK_RUN_CASE=forward runs one of them */
    add_case(s, "template", template_parse_render);
    add_case(s, "tokenizer", tokenizer_load);
    add_case(s, "model_load", model_load);
    add_case(s, "forward", batched_forward);
    int failed = epyq_test_failures(s, false);
    free(g_dir);
    return failed ? 1 : 0;
}
