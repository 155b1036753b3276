/* tests/unit/test_model_numa.c — the forward pass on a NUMA plan (src/model/numa_moe.h).
 *
 * On a synthetic int4 model whose experts have 4 slices of 128 intermediate rows, the logits
 * of a prompt and of decode steps must be bit-identical for --numa-split 1, 2 and 4, through
 * the API and through `epyq logits`; with one slice per expert they must equal --numa off's
 * bits, also through a speculative rollback, fp8 caches and a restored snapshot; every logical
 * node must run experts; move_pages must find every expert page on its node, and every
 * sequence buffer (DeltaNet states, KV planes, conv histories, speculative snapshots) bound to
 * its head's owner and on its node; every pool's reads must be local; a request for a node
 * that does not exist must fail with a message naming it. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/util.h"
#include "model/model.h"
#include "model/numa_moe.h"
#include "synth/synth.h"
#include "tests/check_main.h"
#include "tests/testutil.h"
#include "tests/unit/model_greedy.h"

#define N_PROMPT 6
#define N_DECODE 3
#define INTER 512 /* routed experts' intermediate size: 4 slices of 128 */

static char *model_dir; /* the synthetic checkpoint, written once */
static int32_t chunk_min = -1; /* gdn_chunk_min of the runs: -1 = the recurrent delta rule only */

/* A tiny ct checkpoint with wider experts, so the NUMA units really slice them. */
static void write_model(void) {
    if (model_dir) return;
    model_dir = epyq_test_tmpdir();
    ck_assert_ptr_nonnull(model_dir);
    epyq_err err = {0};
    epyq_synth_opts o = {0};
    o.out_dir = model_dir;
    o.format = (epyq_synth_format)epyq_synth_format_parse("ct");
    o.seed = 11;
    epyq_synth_stats st;
    ck_assert_msg(epyq_synth_dims_init(&o.dims, "tiny", 0, 0, 0, &err) == EPYQ_OK, "%s", err.msg);
    o.dims.moe_inter = INTER;
    ck_assert_msg(epyq_synth_write(&o, &st, &err) == EPYQ_OK, "%s", err.msg);
}

static const char *const kind_name[EPYQ_SEQ_NUMA_KINDS] = {"DeltaNet state", "KV cache",
                                                           "conv history", "speculative"};

/* After a forward: every per-head buffer kind (the speculative snapshots when spec) was bound
 * to its owner's node and move_pages finds its touched pages there and nowhere else; every
 * node's pool read sequence buffers, all local. */
static void check_seq_placed(const epyq_model *m, const epyq_seq *s, bool spec) {
    epyq_err err = {0};
    epyq_seq_numa_pages k[EPYQ_SEQ_NUMA_KINDS];
    ck_assert_msg(epyq_seq_numa_verify_kinds(s, k, &err) == EPYQ_OK, "%s", err.msg);
    for (int32_t i = 0; i < EPYQ_SEQ_NUMA_KINDS; i++) {
        if (i == EPYQ_SEQ_NUMA_SPEC && !spec) {
            ck_assert_uint_eq(k[i].pages, 0); /* none allocated */
            continue;
        }
        ck_assert_msg(k[i].bound && k[i].on_node > 0 && k[i].elsewhere == 0,
                      "%s: bound %d, %zu pages on their node, %zu elsewhere (of %zu)", kind_name[i],
                      (int)k[i].bound, k[i].on_node, k[i].elsewhere, k[i].pages);
    }
    for (int32_t g = 0; g < epyq_model_numa_groups(m); g++) {
        uint64_t local = 0, remote = 0;
        ck_assert_msg(epyq_model_numa_seq_reads(m, g, &local, &remote, &err) == EPYQ_OK, "%s",
                      err.msg);
        ck_assert_msg(local > 0 && remote == 0,
                      "node %d read %llu local, %llu remote sequence bytes", (int)g,
                      (unsigned long long)local, (unsigned long long)remote);
    }
}

/* Prompt logits, then greedy decode steps: [N_PROMPT + N_DECODE][vocab]. numa NULL = off.
 * rq: --requant for the lm_head and the dense 16-bit linears (NONE: exact). */
static float *run_rq(const epyq_numa_opts *numa, int32_t slice, epyq_requant rq, int32_t *vocab,
                     int32_t *groups) {
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_model_opts mo = {.n_threads = 2,
                          .skip_mtp = true,
                          .numa = numa,
                          .moe_slice = slice,
                          .requant_lm_head = rq,
                          .requant_dense = rq,
                          .gdn_chunk_min = chunk_min};
    ck_assert_msg(epyq_model_load(&m, model_dir, &mo, &err) == EPYQ_OK, "%s", err.msg);
    int32_t V = epyq_model_config(m)->vocab_size;
    *vocab = V;
    float *lg = malloc((size_t)(N_PROMPT + N_DECODE) * V * sizeof(float));
    ck_assert_ptr_nonnull(lg);
    epyq_seq *s = NULL;
    ck_assert_msg(epyq_seq_create(&s, m, 32, EPYQ_KV_BF16, &err) == EPYQ_OK, "%s", err.msg);
    size_t pages = 0, elsewhere = 0;
    if (numa) { /* every head's blocks bound to its owner's node, and not yet touched */
        ck_assert_msg(epyq_seq_numa_verify(s, &pages, &elsewhere, &err) == EPYQ_OK, "%s", err.msg);
        ck_assert_msg(pages > 0 && elsewhere == 0, "%zu state pages, %zu elsewhere", pages,
                      elsewhere);
        epyq_seq_numa_pages k[EPYQ_SEQ_NUMA_KINDS];
        ck_assert_msg(epyq_seq_numa_verify_kinds(s, k, &err) == EPYQ_OK, "%s", err.msg);
        ck_assert_msg(k[EPYQ_SEQ_NUMA_KV].bound && k[EPYQ_SEQ_NUMA_KV].pages > 0 &&
                          k[EPYQ_SEQ_NUMA_KV].absent == k[EPYQ_SEQ_NUMA_KV].pages,
                      "KV cache: bound %d, %zu of %zu pages touched before the first forward",
                      (int)k[EPYQ_SEQ_NUMA_KV].bound,
                      k[EPYQ_SEQ_NUMA_KV].pages - k[EPYQ_SEQ_NUMA_KV].absent,
                      k[EPYQ_SEQ_NUMA_KV].pages);
    }
    int32_t tok[N_PROMPT] = {5, 77, 300, 12, 900, 41};
    epyq_test_greedy(m, s, tok, N_PROMPT, N_DECODE, V, lg);
    *groups = epyq_model_numa_groups(m);
    if (numa) check_seq_placed(m, s, false);
    /* the last decode step's routed work reached every logical node (16 experts, top-8) */
    for (int32_t g = 0; numa && g < *groups; g++)
        ck_assert_msg(epyq_model_numa_units(m, g) > 0, "node %d of %d ran no expert", (int)g, (int)*groups);
    /* every node's pool read weights, all from its own node (this machine: every logical node
     * is OS node 0, where move_pages found every page); nothing ran on the unpinned pool */
    for (int32_t g = 0; numa && g < *groups; g++) {
        uint64_t local = 0, remote = 0;
        ck_assert_msg(epyq_model_numa_reads(m, g, &local, &remote, &err) == EPYQ_OK, "%s", err.msg);
        ck_assert_msg(local > 0 && remote == 0, "node %d read %llu local, %llu remote bytes",
                      (int)g, (unsigned long long)local, (unsigned long long)remote);
    }
    if (numa) {
        uint64_t local = 0, remote = 0;
        ck_assert_int_eq(epyq_model_numa_reads(m, -1, &local, &remote, &err), EPYQ_OK);
        ck_assert_msg(remote == 0, "the unpinned pool read %llu weight bytes",
                      (unsigned long long)remote);
        ck_assert_int_eq(epyq_model_numa_reads(m, *groups, &local, &remote, &err), EPYQ_E_ARG);
    }
    epyq_seq_free(s);
    epyq_model_free(m);
    return lg;
}

static float *run(const epyq_numa_opts *numa, int32_t slice, int32_t *vocab, int32_t *groups) {
    return run_rq(numa, slice, EPYQ_REQUANT_NONE, vocab, groups);
}

static epyq_numa_opts split_opts(int32_t split) {
    epyq_numa_opts o;
    epyq_numa_opts_init(&o);
    o.split = split; /* threads: the default, one per core of each logical node (they share cores) */
    return o;
}

/* Dense linears split by rows over the nodes (auto/distribute) or copied to each
 * (replicate-dense): the logits are --numa off's bits for split 1, 2 and 4 with whole experts,
 * with the dense 16-bit linears exact, requantised to int4 (one plane) or int8 (two planes). */
START_TEST(test_dense_modes_bit_identical) {
    write_model();
    const epyq_requant rqs[] = {EPYQ_REQUANT_NONE, EPYQ_REQUANT_INT4, EPYQ_REQUANT_INT8};
    const epyq_numa_mode modes[] = {EPYQ_NUMA_DISTRIBUTE, EPYQ_NUMA_REPLICATE_DENSE};
    const int32_t splits[] = {1, 2, 4};
    for (int r = 0; r < 3; r++) {
        int32_t V, G;
        float *off = run_rq(NULL, 0, rqs[r], &V, &G);
        size_t bytes = (size_t)(N_PROMPT + N_DECODE) * V * sizeof(float);
        for (int mi = 0; mi < 2; mi++)
            for (int i = 0; i < 3; i++) {
                epyq_numa_opts o = split_opts(splits[i]);
                o.mode = modes[mi];
                float *lg = run_rq(&o, INTER, rqs[r], &V, &G);
                ck_assert_int_eq(G, splits[i]);
                ck_assert_msg(!memcmp(lg, off, bytes),
                              "--numa %s --numa-split %d (requant %s) differs from --numa off",
                              epyq_numa_mode_name(modes[mi]), (int)splits[i],
                              epyq_requant_name(rqs[r]));
                free(lg);
            }
        free(off);
    }
    /* the chunked delta rule too: its per-worker workspace is numbered over all node pools */
    chunk_min = 4;
    int32_t V, G;
    float *off = run(NULL, 0, &V, &G);
    size_t bytes = (size_t)(N_PROMPT + N_DECODE) * V * sizeof(float);
    for (int i = 0; i < 3; i++) {
        epyq_numa_opts o = split_opts(splits[i]);
        float *lg = run(&o, INTER, &V, &G);
        ck_assert_msg(!memcmp(lg, off, bytes),
                      "chunked DeltaNet, --numa-split %d differs from --numa off", (int)splits[i]);
        free(lg);
    }
    free(off);
    chunk_min = -1;
}
END_TEST

#define N_SPEC 3 /* tokens of a speculative verification, of which ROLL_KEEP are kept */
#define ROLL_KEEP 2
#define SPEC_ROWS (N_PROMPT + N_SPEC + N_DECODE + 1)

/* The prompt, a speculative verification of N_SPEC tokens in one batch rolled back to
 * ROLL_KEEP, N_DECODE greedy steps, then one more step on a second sequence restored from a
 * snapshot of the first (which must give the first's own next row): [SPEC_ROWS][vocab]. The
 * KV cache of the kind asked for; numa NULL = off. */
static float *run_spec(const epyq_numa_opts *numa, epyq_kv_type kv, int32_t *vocab) {
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_model_opts mo = {.n_threads = 2, .skip_mtp = true, .numa = numa, .moe_slice = INTER};
    ck_assert_msg(epyq_model_load(&m, model_dir, &mo, &err) == EPYQ_OK, "%s", err.msg);
    const int32_t V = epyq_model_config(m)->vocab_size;
    *vocab = V;
    float *lg = malloc((size_t)SPEC_ROWS * V * sizeof(float));
    ck_assert_ptr_nonnull(lg);
    epyq_seq *s = NULL, *s2 = NULL;
    ck_assert_msg(epyq_seq_create(&s, m, 32, kv, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_msg(epyq_seq_create(&s2, m, 32, kv, &err) == EPYQ_OK, "%s", err.msg);
    epyq_seq *seqs[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) seqs[i] = s;
    int32_t tok[N_PROMPT] = {5, 77, 300, 12, 900, 41}, draft[N_SPEC] = {17, 230, 4};
    epyq_batch b = {N_PROMPT, seqs, tok, NULL};
    ck_assert_msg(epyq_model_forward(m, &b, lg, NULL, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_msg(epyq_seq_spec_begin(s, N_SPEC, &err) == EPYQ_OK, "%s", err.msg);
    epyq_batch bs = {N_SPEC, seqs, draft, NULL};
    float *row = lg + (size_t)N_PROMPT * V;
    ck_assert_msg(epyq_model_forward(m, &bs, row, NULL, &err) == EPYQ_OK, "%s", err.msg);
    if (numa) check_seq_placed(m, s, true);
    ck_assert_msg(epyq_seq_rollback(s, ROLL_KEEP, &err) == EPYQ_OK, "%s", err.msg);
    row += (size_t)N_SPEC * V;
    const float *prev = row - (size_t)(N_SPEC - ROLL_KEEP + 1) * V; /* the last kept token's */
    for (int d = 0; d < N_DECODE; d++, prev = row, row += V) {
        int32_t t = 0;
        for (int32_t i = 1; i < V; i++) t = prev[i] > prev[t] ? i : t;
        epyq_batch b1 = {1, seqs, &t, NULL};
        ck_assert_msg(epyq_model_forward(m, &b1, row, NULL, &err) == EPYQ_OK, "%s", err.msg);
    }
    /* the copy goes through the snapshot layout (rows, not per-head planes) and back */
    uint64_t len = epyq_seq_snapshot_size(s, epyq_seq_pos(s));
    void *snap = malloc(len);
    ck_assert_ptr_nonnull(snap);
    ck_assert_uint_eq(epyq_seq_snapshot(s, snap), len);
    ck_assert_msg(epyq_seq_restore(s2, snap, len, &err) == EPYQ_OK, "%s", err.msg);
    float *own = malloc((size_t)V * sizeof(float));
    ck_assert_ptr_nonnull(own);
    int32_t t = 99;
    epyq_batch b2 = {1, &s2, &t, NULL}, b3 = {1, seqs, &t, NULL};
    ck_assert_msg(epyq_model_forward(m, &b2, row, NULL, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_msg(epyq_model_forward(m, &b3, own, NULL, &err) == EPYQ_OK, "%s", err.msg);
    ck_assert_msg(!memcmp(own, row, (size_t)V * sizeof(float)),
                  "a restored copy's next logits differ from the original's");
    if (numa) check_seq_placed(m, s2, false);
    free(own), free(snap);
    epyq_seq_free(s2);
    epyq_seq_free(s);
    epyq_model_free(m);
    return lg;
}

/* The attention tasks per kv head, the conv and DeltaNet tasks per head, on their owners'
 * pools over caches and states bound to the owners' nodes: a prompt, a rolled-back
 * speculative batch, decode and a restored copy give --numa off's bits for split 1, 2 and 4
 * in both modes, with bf16 and fp8 caches. */
START_TEST(test_seq_buffers_bit_identical) {
    write_model();
    const epyq_kv_type kvs[] = {EPYQ_KV_BF16, EPYQ_KV_FP8};
    const epyq_numa_mode modes[] = {EPYQ_NUMA_DISTRIBUTE, EPYQ_NUMA_REPLICATE_DENSE};
    const int32_t splits[] = {1, 2, 4};
    for (int k = 0; k < 2; k++) {
        int32_t V;
        float *off = run_spec(NULL, kvs[k], &V);
        for (int mi = 0; mi < 2; mi++)
            for (int i = 0; i < 3; i++) {
                epyq_numa_opts o = split_opts(splits[i]);
                o.mode = modes[mi];
                float *lg = run_spec(&o, kvs[k], &V);
                ck_assert_msg(!memcmp(lg, off, (size_t)SPEC_ROWS * V * sizeof(float)),
                              "--numa %s --numa-split %d, %s cache: differs from --numa off",
                              epyq_numa_mode_name(modes[mi]), (int)splits[i], k ? "fp8" : "bf16");
                free(lg);
            }
        free(off);
    }
}
END_TEST

START_TEST(test_split_bit_identical) {
    write_model();
    int32_t V, G;
    float *off = run(NULL, 0, &V, &G);
    ck_assert_int_eq(G, 0);
    size_t bytes = (size_t)(N_PROMPT + N_DECODE) * V * sizeof(float);
    float *base = NULL;
    const int32_t splits[] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        epyq_numa_opts o = split_opts(splits[i]);
        float *lg = run(&o, 128, &V, &G);
        ck_assert_int_eq(G, splits[i]);
        if (!base) {
            base = lg;
            /* 4 slices sum the down projection in another order than one pass: close to off,
             * not equal. The next layers quantise their activations per group (int16 steps of
             * amax/32767), so an fp32-order change of one ulp can move a code by a step and
             * the difference is that of a requantisation, not of fp32 rounding alone: bounded
             * by the fixtures' fp32 tier, 1e-3 of the largest |logit| (measured: 1.7e-3 at
             * max|logit| ~12, i.e. 1.4e-4 of it), far below any logit margin of this model. */
            double worst = 0, top = 0;
            for (size_t k = 0; k < bytes / sizeof(float); k++) {
                worst = fmax(worst, fabs(lg[k] - off[k]));
                top = fmax(top, fabs(off[k]));
            }
            ck_assert_msg(worst < 1e-3 * top, "4-slice logits differ from --numa off by %g (max |logit| %g)",
                          worst, top);
            continue;
        }
        ck_assert_msg(!memcmp(lg, base, bytes), "--numa-split %d logits differ from --numa-split 1", (int)splits[i]);
        free(lg);
    }
    /* one slice per expert: the single-pool path's units and sums, so its exact bits */
    for (int i = 0; i < 3; i++) {
        epyq_numa_opts o = split_opts(splits[i]);
        float *lg = run(&o, INTER, &V, &G);
        ck_assert_msg(!memcmp(lg, off, bytes), "--numa-split %d with whole experts differs from --numa off",
                      (int)splits[i]);
        free(lg);
    }
    free(base), free(off);
}
END_TEST

START_TEST(test_placement_verified) {
    write_model();
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_numa_opts o = split_opts(2);
    epyq_model_opts mo = {.n_threads = 2, .skip_mtp = true, .numa = &o};
    ck_assert_msg(epyq_model_load(&m, model_dir, &mo, &err) == EPYQ_OK, "%s", err.msg);
    size_t pages = 0, elsewhere = 0;
    ck_assert_msg(epyq_model_numa_verify(m, &pages, &elsewhere, &err) == EPYQ_OK, "%s", err.msg);
    /* 4 layers x 16 experts x 3 x 512 x 256 nibbles, plus scales: at least 384 KiB */
    ck_assert_msg(pages >= 96, "only %zu pages checked", pages);
    ck_assert_uint_eq(elsewhere, 0);
    epyq_model_free(m);

    /* without a NUMA mode there is nothing to verify, and the call says so */
    ck_assert_int_eq(epyq_model_load(&m, model_dir, &(epyq_model_opts){.n_threads = 1}, &err), EPYQ_OK);
    ck_assert_int_eq(epyq_model_numa_verify(m, &pages, &elsewhere, &err), EPYQ_E_ARG);
    ck_assert_int_eq(epyq_model_numa_groups(m), 0);
    epyq_model_free(m);
}
END_TEST

START_TEST(test_missing_node_error) {
    write_model();
    epyq_err err = {0};
    epyq_model *m = NULL;
    epyq_numa_opts o = split_opts(2);
    o.nodes = "5";
    epyq_model_opts mo = {.n_threads = 2, .skip_mtp = true, .numa = &o};
    ck_assert_int_ne(epyq_model_load(&m, model_dir, &mo, &err), EPYQ_OK);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err.msg, "node 5"), "message does not name the node: %s", err.msg);
    ck_assert_ptr_null(strchr(err.msg, '\n'));
}
END_TEST

/* `epyq logits` with a flag string; returns its exit status, logits in `out`. */
static int cli(const char *flags, const char *out, const char *errfile) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' logits -m '%s' --ids 5,77,300,12 -n 2 -o '%s' %s >/dev/null 2>'%s'",
             epyq_test_bin(), model_dir, out, flags, errfile);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static char *slurp(const char *path, size_t *len) {
    char *buf = NULL;
    epyq_err err = {0};
    ck_assert_msg(epyq_file_read(path, 1 << 24, &buf, len, &err) == EPYQ_OK, "%s", err.msg);
    return buf;
}

START_TEST(test_cli_splits) {
    write_model();
    char out[4096], errf[4096];
    snprintf(errf, sizeof errf, "%s/stderr.txt", model_dir);
    size_t n0 = 0, n = 0;
    char *first = NULL;
    const char *flags[] = {"--numa-split 1", "--numa-split 2", "--numa-split 4 --numa distribute",
                           "--numa-split 2 --numa replicate-dense"};
    for (int i = 0; i < 4; i++) {
        snprintf(out, sizeof out, "%s/logits%d.f32", model_dir, i);
        ck_assert_int_eq(cli(flags[i], out, errf), 0);
        char *b = slurp(out, &n);
        if (!first) {
            first = b, n0 = n;
            ck_assert_uint_eq(n0, (size_t)6 * 1024 * sizeof(float));
            continue;
        }
        ck_assert_msg(n == n0 && !memcmp(b, first, n), "epyq logits %s differs from %s", flags[i], flags[0]);
        free(b);
    }
    /* the placement table went to stderr */
    size_t el = 0;
    char *e = slurp(errf, &el);
    ck_assert_msg(el && strstr(e, "NUMA plan") && strstr(e, "move_pages"), "no placement table on stderr");
    free(e);
    /* a node that is not there: runtime failure, one line */
    snprintf(out, sizeof out, "%s/bad.f32", model_dir);
    ck_assert_int_eq(cli("--numa-split 2 --nodes 3", out, errf), 1);
    e = slurp(errf, &el);
    ck_assert_msg(strstr(e, "epyq: ") && strstr(e, "node 3"), "unclear error: %s", e);
    free(e);
    /* a bad mode is a usage error */
    ck_assert_int_eq(cli("--numa sideways", out, errf), 2);
    free(first);
}
END_TEST

int main(void) {
    Suite *s = suite_create("model_numa");
    TCase *tc = epyq_test_case(s, "numa", 120);
    EPYQ_TESTS_ADD(tc, test_split_bit_identical, test_dense_modes_bit_identical,
                   test_seq_buffers_bit_identical, test_placement_verified, test_missing_node_error,
                   test_cli_splits);
    int failed = epyq_test_failures(s, true);
    free(model_dir);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
