/* tests/unit/test_session.c — chat session files (src/engine/session.c) and detached state
 * copies (src/model/seq_state.c) on tiny synthetic checkpoints (no ../shared needed):
 *   - a state copied after a prefix, written to a session file, read back and restored into a
 *     sequence that had been used for something else gives, for the rest of the prompt, the
 *     logits of a fresh sequence fed everything, bit for bit; the ids and conversation come
 *     back as written;
 *   - refusals name the file and the field: every truncation length tried, one flipped byte in
 *     each part of the file (header fields, ids, conversation, state), another model identity,
 *     KV type or context; nothing is returned then;
 *   - two checkpoints of one shape but other seeds have different identities (shapes alone
 *     would not tell them apart), one checkpoint loaded twice the same;
 *   - a detached copy is refused by epyq_seq_restore and an attached one by
 *     epyq_seq_restore_detached;
 *   - the write leaves no temporary file next to the session. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/session.h"
#include "model/model.h"
#include "tests/check_main.h"
#include "tests/e2e/synth_model.h"

#define P 41 /* prefix */
#define R 9  /* rest */
#define CTX 128

static char *g_dir, *g_dir2;
static char g_path[4200];

static epyq_model *load(const char *dir) {
    epyq_model *m = NULL;
    epyq_err err = {0};
    epyq_model_opts o = {.n_threads = 2};
    ck_assert_msg(epyq_model_load(&m, dir, &o, &err) == EPYQ_OK, "%s: %s", dir, err.msg);
    return m;
}

static void feed(epyq_model *m, epyq_seq *s, const int32_t *tok, int32_t n, float *logits) {
    epyq_seq *seqs[64];
    ck_assert(n <= 64);
    for (int32_t i = 0; i < n; i++) seqs[i] = s;
    epyq_batch b = {n, seqs, tok, NULL};
    epyq_err err = {0};
    ck_assert_msg(epyq_model_forward(m, &b, logits, NULL, &err) == EPYQ_OK, "%s", err.msg);
}

static void tokens(int32_t *t, int32_t n, uint32_t salt, int32_t V) {
    for (int32_t i = 0; i < n; i++)
        t[i] = (int32_t)((i * 2654435761u + salt * 40503u) % (uint32_t)V);
}

static const char conv[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";

/* A session of model m at P tokens in g_path; returns the file's bytes (and *len). */
static uint8_t *write_session(epyq_model *m, epyq_kv_type kv, const int32_t *ids, size_t *len) {
    epyq_err err = {0};
    epyq_seq *a;
    ck_assert(epyq_seq_create(&a, m, CTX, kv, &err) == EPYQ_OK);
    feed(m, a, ids, P, NULL);
    uint64_t sz = epyq_seq_snapshot_size(a, P);
    void *snap = malloc(sz);
    ck_assert(snap);
    epyq_seq_snapshot(a, snap);
    epyq_seq_snapshot_detach(snap);
    epyq_session s = {
        {epyq_model_identity(m), (int32_t)kv, CTX}, ids, P, conv, strlen(conv), snap, sz};
    ck_assert_msg(epyq_session_write(g_path, &s, &err) == EPYQ_OK, "%s", err.msg);
    free(snap);
    epyq_seq_free(a);
    char *bytes = NULL;
    ck_assert(epyq_file_read(g_path, 1 << 26, &bytes, len, &err) == EPYQ_OK);
    return (uint8_t *)bytes;
}

static void put_file(const uint8_t *b, size_t n) {
    FILE *f = fopen(g_path, "wb");
    ck_assert(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* Read g_path expecting a refusal whose message names the file and `field`. */
static void refused(const epyq_session_id *want, const char *field, const char *why) {
    epyq_session s;
    void *blob = (void *)1;
    epyq_err err = {0};
    epyq_status st = epyq_session_read(g_path, want, &s, &blob, &err);
    ck_assert_msg(st != EPYQ_OK, "%s: accepted", why);
    ck_assert_msg(blob == NULL, "%s: a buffer came back with the refusal", why);
    ck_assert_msg(strstr(err.msg, g_path) && strstr(err.msg, field),
                  "%s: message '%s' should name the file and '%s'", why, err.msg, field);
    ck_assert_msg(!strchr(err.msg, '\n'), "%s: message is not one line", why);
}

START_TEST(test_roundtrip_exact) {
    epyq_model *m = load(g_dir);
    const epyq_config *c = epyq_model_config(m);
    int32_t V = c->vocab_size, all[P + R], junk[20];
    tokens(all, P + R, 3, V), tokens(junk, 20, 8, V);
    epyq_err err = {0};
    size_t len;
    free(write_session(m, EPYQ_KV_BF16, all, &len));

    epyq_seq *fresh, *b;
    ck_assert(epyq_seq_create(&fresh, m, CTX, EPYQ_KV_BF16, &err) == EPYQ_OK);
    ck_assert(epyq_seq_create(&b, m, CTX, EPYQ_KV_BF16, &err) == EPYQ_OK);
    float *lf = malloc((size_t)(P + R) * V * sizeof(float)), *lb = malloc((size_t)R * V * 4);
    ck_assert(lf && lb);
    feed(m, fresh, all, P + R, lf);
    feed(m, b, junk, 20, NULL); /* b held something else before */

    epyq_session_id want = {epyq_model_identity(m), EPYQ_KV_BF16, CTX};
    epyq_session s;
    void *blob = NULL;
    ck_assert_msg(epyq_session_read(g_path, &want, &s, &blob, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(s.n_ids, P);
    ck_assert_mem_eq(s.ids, all, P * sizeof *all);
    ck_assert_uint_eq(s.conv_len, strlen(conv));
    ck_assert_mem_eq(s.conv, conv, strlen(conv));
    ck_assert_int_eq(epyq_seq_snapshot_pos(s.snap), P);
    /* an attached restore refuses the detached copy; the detached one takes it */
    ck_assert_int_eq(epyq_seq_restore(b, s.snap, s.snap_len, &err), EPYQ_E_ARG);
    ck_assert_int_eq(epyq_seq_pos(b), 20);
    ck_assert_msg(epyq_seq_restore_detached(b, s.snap, s.snap_len, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_int_eq(epyq_seq_pos(b), P);
    feed(m, b, all + P, R, lb);
    ck_assert_mem_eq(lb, lf + (size_t)P * V, (size_t)R * V * sizeof(float));

    /* and the other way round: an attached copy is not taken as a detached one */
    uint64_t sz = epyq_seq_snapshot_size(fresh, P + R);
    void *att = malloc(sz);
    ck_assert(att);
    epyq_seq_snapshot(fresh, att);
    ck_assert_int_eq(epyq_seq_restore_detached(b, att, sz, &err), EPYQ_E_ARG);
    ck_assert_int_eq(epyq_seq_pos(b), P + R);

    free(att), free(blob), free(lf), free(lb);
    epyq_seq_free(fresh), epyq_seq_free(b);
    epyq_model_free(m);
}
END_TEST

START_TEST(test_refusals) {
    epyq_model *m = load(g_dir);
    int32_t V = epyq_model_config(m)->vocab_size, ids[P];
    tokens(ids, P, 5, V);
    size_t len;
    uint8_t *good = write_session(m, EPYQ_KV_BF16, ids, &len);
    epyq_session_id want = {epyq_model_identity(m), EPYQ_KV_BF16, CTX};
    char why[96];

    /* truncated anywhere: too short for the header, or shorter than the header says */
    size_t cuts[] = {0, 1, 8, 79, 80, 81, 80 + P * 4, 80 + P * 4 + 10, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        put_file(good, cuts[i]);
        snprintf(why, sizeof why, "truncated to %zu of %zu bytes", cuts[i], len);
        refused(&want, "size", why);
    }
    /* one byte longer is refused the same way */
    uint8_t *longer = malloc(len + 1);
    ck_assert(longer);
    memcpy(longer, good, len), longer[len] = 0;
    put_file(longer, len + 1);
    refused(&want, "size", "one byte appended");
    free(longer);

    /* one flipped byte in each part; the field each check names */
    struct {
        size_t at;
        const char *field;
    } flips[] = {{0, "magic"},
                 {9, "version"},
                 {13, "header checksum"},
                 {17, "header checksum"},   /* model identity, caught before it is compared */
                 {25, "header checksum"},   /* KV type */
                 {33, "header checksum"},   /* token count */
                 {41, "header checksum"},   /* conversation bytes */
                 {66, "header checksum"},   /* the checksum itself */
                 {80 + 5, "body checksum"}, /* ids */
                 {80 + P * 4 + 3, "body checksum"}, /* conversation */
                 {len - 7, "body checksum"},        /* recurrent state */
                 {len - 1, "body checksum"}};
    for (size_t i = 0; i < sizeof flips / sizeof *flips; i++) {
        uint8_t *b = malloc(len);
        ck_assert(b);
        memcpy(b, good, len);
        b[flips[i].at] ^= 0x40;
        put_file(b, len);
        snprintf(why, sizeof why, "byte %zu of %zu flipped", flips[i].at, len);
        refused(&want, flips[i].field, why);
        free(b);
    }

    /* an intact file of another model, KV type or context */
    put_file(good, len);
    epyq_session_id other = want;
    other.model_id ^= 1;
    refused(&other, "model identity", "another model");
    other = want, other.kv_type = EPYQ_KV_FP8;
    refused(&other, "KV type", "another KV type");
    other = want, other.n_ctx = CTX * 2;
    refused(&other, "context", "another context");

    /* a missing file */
    char missing[4300];
    snprintf(missing, sizeof missing, "%s.none", g_path);
    epyq_session s;
    void *blob;
    epyq_err err = {0};
    ck_assert_int_eq(epyq_session_read(missing, &want, &s, &blob, &err), EPYQ_E_IO);
    ck_assert(!epyq_session_sniff(missing));
    free(good);
    epyq_model_free(m);
}
END_TEST

START_TEST(test_identity) {
    epyq_model *a = load(g_dir), *a2 = load(g_dir), *b = load(g_dir2);
    const epyq_config *ca = epyq_model_config(a), *cb = epyq_model_config(b);
    /* the same shape, so only the weights tell them apart */
    ck_assert_int_eq(ca->hidden_size, cb->hidden_size);
    ck_assert_int_eq(ca->num_hidden_layers, cb->num_hidden_layers);
    ck_assert_int_eq(ca->vocab_size, cb->vocab_size);
    ck_assert(epyq_model_identity(a) == epyq_model_identity(a2));
    ck_assert(epyq_model_identity(a) != epyq_model_identity(b));
    epyq_model_free(a), epyq_model_free(a2), epyq_model_free(b);
}
END_TEST

START_TEST(test_no_temp_left) {
    epyq_model *m = load(g_dir);
    int32_t V = epyq_model_config(m)->vocab_size, ids[P];
    tokens(ids, P, 6, V);
    size_t len;
    free(write_session(m, EPYQ_KV_BF16, ids, &len));
    ck_assert(epyq_session_sniff(g_path));
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", g_path);
    *strrchr(dir, '/') = '\0';
    DIR *d = opendir(dir);
    ck_assert(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            ck_assert_msg(!strstr(e->d_name, ".tmp"), "temporary file %s left", e->d_name);
            n++;
        }
    closedir(d);
    ck_assert_int_eq(n, 1);
    /* a folder that does not exist: refused, nothing written */
    epyq_err err = {0};
    char bad[4300];
    snprintf(bad, sizeof bad, "%s/no/such/dir/s.bin", dir);
    epyq_session s = {{1, 0, CTX}, ids, 1, conv, 2, conv, 0};
    ck_assert_int_eq(epyq_session_write(bad, &s, &err), EPYQ_E_IO);
    epyq_model_free(m);
}
END_TEST

int main(void) {
    epyq_err err = {0};
    if (epyq_kern_init(&err) != EPYQ_OK) return fprintf(stderr, "%s\n", err.msg), EXIT_FAILURE;
    g_dir = synth_model("ct", 91);
    g_dir2 = synth_model("ct", 92);
    char *t = epyq_test_tmpdir();
    if (!g_dir || !g_dir2 || !t) return 1;
    snprintf(g_path, sizeof g_path, "%s/chat.session", t);
    Suite *s = suite_create("session");
    TCase *tc = epyq_test_case(s, "session", 300);
    EPYQ_TESTS_ADD(tc, test_roundtrip_exact, test_refusals, test_identity, test_no_temp_left);
    int failed = epyq_test_failures(s, false);
    free(t);
    return failed ? 1 : 0;
}
