/* tests/fuzz/fuzz_session.c — libFuzzer: chat session files (src/engine/session.c) and the
 * detached sequence state inside them (epyq_seq_restore_detached), the one place a file from
 * outside becomes model state. A session's checksums make random bytes fail early, so the
 * input picks one of two ways in (first byte, low bit):
 *   0  the bytes are the file itself: epyq_session_read must refuse it in one line or return
 *      sizes that lie inside it;
 *   1  the bytes are the parts of a file with valid checksums (what a crafted file can be):
 *      n_ids (next byte, 0..15) token ids, then the snapshot: the rest of the input padded
 *      with zeros to a length the next 3 bytes choose (so a snapshot header can match the
 *      tiny model's sizes); written with epyq_session_write and read back.
 * Either way a state the reader returns is restored into a sequence of a tiny synthetic model;
 * a restore must refuse in one line or leave a sequence that one more token can be fed to. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/session.h"
#include "model/model.h"
#include "tests/e2e/synth_model.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { CTX = 64, MAX_SNAP = 1 << 20 };

static char *g_dir, *g_path;
static epyq_model *g_m;
static epyq_session_id g_want;

static void cleanup(void) {
    unlink(g_path);
    epyq_model_free(g_m);
    epyq_test_rm_dir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("EPYQ_LOG_LEVEL", "0", 0);
    epyq_err err = {0};
    epyq_model_opts mo = {.path = EPYQ_PATH_A8, .n_threads = 1, .skip_mtp = true};
    if (!(g_dir = synth_model("ct", 7)) || epyq_kern_init(&err) != EPYQ_OK ||
        epyq_model_load(&g_m, g_dir, &mo, &err) != EPYQ_OK) {
        fprintf(stderr, "fuzz_session: %s\n", err.msg);
        abort();
    }
    size_t n = strlen(g_dir) + 16;
    if (!(g_path = malloc(n))) abort();
    snprintf(g_path, n, "%s/s.bin", g_dir);
    g_want = (epyq_session_id){epyq_model_identity(g_m), EPYQ_KV_BF16, CTX};
    atexit(cleanup);
    return 0;
}

/* A refusal is one non-empty line. */
static void check_msg(const epyq_err *err) {
    if (!err->msg[0] || strchr(err->msg, '\n')) abort();
}

static void restore(const epyq_session *s) {
    epyq_seq *q = NULL;
    epyq_err err = {0};
    if (epyq_seq_create(&q, g_m, CTX, EPYQ_KV_BF16, &err) != EPYQ_OK) abort();
    if (epyq_seq_restore_detached(q, s->snap, s->snap_len, &err) != EPYQ_OK) {
        check_msg(&err);
    } else if (epyq_seq_pos(q) < 0 || epyq_seq_pos(q) > CTX) {
        abort();
    } else if (epyq_seq_pos(q) < CTX) { /* a restored state must take the next token */
        const int32_t tok = 1;
        uint8_t want = 1;
        epyq_batch b = {1, &q, &tok, &want};
        float *logits = malloc((size_t)epyq_model_config(g_m)->vocab_size * sizeof(float));
        if (!logits || epyq_model_forward(g_m, &b, logits, NULL, &err) != EPYQ_OK) abort();
        free(logits);
    }
    epyq_seq_free(q);
}

static void read_back(void) {
    epyq_session s;
    void *blob = NULL;
    epyq_err err = {0};
    if (epyq_session_read(g_path, &g_want, &s, &blob, &err) != EPYQ_OK) {
        check_msg(&err);
        return;
    }
    if (s.n_ids < 0 || (s.n_ids && !s.ids) || (s.snap_len && !s.snap)) abort();
    volatile uint8_t sink = 0; /* every byte the reader says it returned is inside the file */
    for (int32_t i = 0; i < s.n_ids; i++) sink ^= (uint8_t)s.ids[i];
    for (uint64_t i = 0; i < s.conv_len; i++) sink ^= (uint8_t)s.conv[i];
    (void)sink;
    restore(&s);
    free(blob);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (!(data[0] & 1)) { /* the file itself */
        FILE *f = fopen(g_path, "wb");
        if (!f) abort();
        if (size > 1 && fwrite(data + 1, 1, size - 1, f) != size - 1) abort();
        fclose(f);
        read_back();
        return 0;
    }
    if (size < 5) return 0;
    int32_t n_ids = data[1] & 15;
    size_t snap_len = ((size_t)data[2] | (size_t)data[3] << 8 | (size_t)data[4] << 16) % MAX_SNAP;
    const uint8_t *p = data + 5;
    size_t left = size - 5;
    int32_t ids[16];
    for (int32_t i = 0; i < n_ids; i++) {
        ids[i] = 0;
        if (left >= 2) ids[i] = (int32_t)(p[0] | p[1] << 8), p += 2, left -= 2;
    }
    uint8_t *snap = calloc(snap_len ? snap_len : 1, 1);
    if (!snap) abort();
    memcpy(snap, p, left < snap_len ? left : snap_len);
    static const char conv[] = "{\"messages\":[]}";
    const epyq_session s = {g_want, ids, n_ids, conv, sizeof conv - 1, snap, snap_len};
    epyq_err err = {0};
    if (epyq_session_write(g_path, &s, &err) != EPYQ_OK) abort(); /* a writable scratch folder */
    read_back();
    free(snap);
    return 0;
}
