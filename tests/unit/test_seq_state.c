/* tests/unit/test_seq_state.c — sequence state snapshots (src/model/seq_state.c), the base of
 * prefix reuse, on tiny synthetic checkpoints (ct and bf16; no ../shared needed):
 *   - snapshot a sequence after a prefix, keep feeding it, restore the copy into a second
 *     sequence that had been used for something else, feed the rest: the logits of every rest
 *     token equal, bit for bit, those of a fresh sequence fed prefix + rest (bf16 and fp8 KV);
 *   - the MTP layer's KV rows travel too: an MTP row after the restore gives the same logits;
 *   - a restore ends a speculative verification in progress;
 *   - refusals: a context shorter than the snapshot, another KV type, a wrong length. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "tests/check_main.h"
#include "tests/e2e/synth_model.h"

#define P 37 /* prefix */
#define R 11 /* rest */

static epyq_model *load(const char *dir) {
    epyq_model *m = NULL;
    epyq_err err = {0};
    epyq_model_opts o = {.n_threads = 2};
    ck_assert_msg(epyq_model_load(&m, dir, &o, &err) == EPYQ_OK, "%s: %s", dir, err.msg);
    return m;
}

/* Feed n tokens of one sequence in chunks of at most `chunk`; logits [n][V] and hidden
 * [n][H] of every token when non-NULL. */
static void feed(epyq_model *m, epyq_seq *s, const int32_t *tok, int32_t n, int32_t chunk,
                 float *logits, float *hidden) {
    const epyq_config *c = epyq_model_config(m);
    epyq_seq *seqs[64];
    ck_assert(chunk <= 64);
    for (int32_t i = 0; i < chunk; i++) seqs[i] = s;
    for (int32_t at = 0; at < n; at += chunk) {
        int32_t k = n - at < chunk ? n - at : chunk;
        epyq_batch b = {k, seqs, tok + at, NULL};
        epyq_err err = {0};
        ck_assert_msg(epyq_model_forward(m, &b, logits ? logits + (size_t)at * c->vocab_size : NULL,
                                         hidden ? hidden + (size_t)at * c->hidden_size : NULL,
                                         &err) == EPYQ_OK,
                      "%s", err.msg);
    }
}

static void tokens(int32_t *t, int32_t n, uint32_t salt, int32_t V) {
    for (int32_t i = 0; i < n; i++)
        t[i] = (int32_t)((i * 2654435761u + salt * 40503u) % (uint32_t)V);
}

static void exact_on(const char *fmt, epyq_kv_type kv) {
    char *dir = synth_model(fmt, 77);
    ck_assert(dir);
    epyq_model *m = load(dir);
    const epyq_config *c = epyq_model_config(m);
    int32_t V = c->vocab_size, H = c->hidden_size;
    int32_t all[P + R], junk[20];
    tokens(all, P + R, 1, V), tokens(junk, 20, 9, V);
    epyq_err err = {0};
    epyq_seq *a, *b, *fresh;
    ck_assert(epyq_seq_create(&a, m, 128, kv, &err) == EPYQ_OK);
    ck_assert(epyq_seq_create(&b, m, 96, kv, &err) == EPYQ_OK);
    ck_assert(epyq_seq_create(&fresh, m, 128, kv, &err) == EPYQ_OK);
    float *hid = malloc((size_t)(P + R) * H * sizeof(float));
    float *lf = malloc((size_t)(P + R) * V * sizeof(float)),
          *lb = malloc((size_t)R * V * sizeof(float));
    ck_assert(hid && lf && lb);

    /* the oracle: one fresh sequence fed everything */
    feed(m, fresh, all, P + R, 16, lf, NULL);

    /* a: the prefix (other chunking), MTP rows over it, then the copy */
    feed(m, a, all, P, 13, NULL, hid);
    int32_t pos[P];
    for (int32_t i = 0; i < P; i++) pos[i] = i;
    bool mtp = epyq_model_has_mtp(m);
    if (mtp)
        ck_assert_msg(epyq_model_mtp(m, a, P, hid, all, pos, 0, NULL, NULL, &err) == EPYQ_OK, "%s",
                      err.msg);
    uint64_t sz = epyq_seq_snapshot_size(a, P);
    void *snap = malloc(sz);
    ck_assert(snap);
    ck_assert_uint_eq(epyq_seq_snapshot(a, snap), sz);
    ck_assert_int_eq(epyq_seq_snapshot_pos(snap), P);
    float *lmtp_a = malloc((size_t)V * sizeof(float)), *lmtp_b = malloc((size_t)V * sizeof(float));
    int32_t pP = P;
    if (mtp)
        ck_assert(epyq_model_mtp(m, a, 1, hid + (size_t)(P - 1) * H, &all[P], &pP, 1, lmtp_a, NULL,
                                 &err) == EPYQ_OK);
    feed(m, a, junk, 20, 7, NULL, NULL); /* a moves on: the copy must not */

    /* b: used for something else first, then restored and fed the rest */
    feed(m, b, junk, 20, 20, NULL, NULL);
    ck_assert(epyq_seq_spec_begin(b, 2, &err) == EPYQ_OK);
    ck_assert_msg(epyq_seq_restore(b, snap, sz, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(epyq_seq_pos(b), P);
    ck_assert(epyq_seq_rollback(b, 1, &err) !=
              EPYQ_OK); /* the speculation ended with the restore */
    if (mtp) {
        ck_assert(epyq_model_mtp(m, b, 1, hid + (size_t)(P - 1) * H, &all[P], &pP, 1, lmtp_b, NULL,
                                 &err) == EPYQ_OK);
        ck_assert_mem_eq(lmtp_a, lmtp_b, (size_t)V * sizeof(float));
    }
    feed(m, b, all + P, R, 4, lb, NULL);
    ck_assert_mem_eq(lb, lf + (size_t)P * V, (size_t)R * V * sizeof(float));

    /* refusals leave the sequence as it was */
    epyq_seq *small, *other;
    ck_assert(epyq_seq_create(&small, m, P - 1, kv, &err) == EPYQ_OK);
    ck_assert_int_eq(epyq_seq_restore(small, snap, sz, &err), EPYQ_E_CTX_FULL);
    ck_assert_int_eq(epyq_seq_pos(small), 0);
    ck_assert(epyq_seq_create(&other, m, 128, kv == EPYQ_KV_BF16 ? EPYQ_KV_FP8 : EPYQ_KV_BF16,
                              &err) == EPYQ_OK);
    ck_assert_int_eq(epyq_seq_restore(other, snap, sz, &err), EPYQ_E_ARG);
    ck_assert_int_eq(epyq_seq_restore(b, snap, sz - 1, &err), EPYQ_E_ARG);
    ck_assert_int_eq(epyq_seq_pos(b), P + R);

    epyq_seq_free(small), epyq_seq_free(other);
    epyq_seq_free(a), epyq_seq_free(b), epyq_seq_free(fresh);
    free(snap), free(hid), free(lf), free(lb), free(lmtp_a), free(lmtp_b);
    epyq_model_free(m);
    free(dir);
}

START_TEST(test_exact_ct) { exact_on("ct", EPYQ_KV_BF16); }
END_TEST
START_TEST(test_exact_ct_fp8) { exact_on("ct", EPYQ_KV_FP8); }
END_TEST
START_TEST(test_exact_bf16) { exact_on("bf16", EPYQ_KV_BF16); }
END_TEST

int main(void) {
    epyq_err err = {0};
    if (epyq_kern_init(&err) != EPYQ_OK) return fprintf(stderr, "%s\n", err.msg), EXIT_FAILURE;
    Suite *s = suite_create("seq_state");
    TCase *tc = epyq_test_case(s, "seq_state", 300);
    EPYQ_TESTS_ADD(tc, test_exact_ct, test_exact_ct_fp8, test_exact_bf16);
    return epyq_test_run(s);
}
