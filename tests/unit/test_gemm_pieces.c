/* tests/unit/test_gemm_pieces.c — how a GEMM run is split into pool tasks
 * (epyq_rlin_pieces, src/model/linear.c), on the model's real shapes and random ones:
 *   - every output's rows exactly once, in order, outputs in order; whole 16-row tiles except
 *     each output's last task; never more tasks than allowed (down to one per output; fewer
 *     allowed than outputs is refused);
 *   - one task per output on one thread, and for outputs too small to hand off;
 *   - the point of the split: the lm_head (248320 x 2048 bf16, 1 GB) on 2 threads starts
 *     with tasks of ~1/4 of it and ends with one of at most 256 KiB + a tile, and within an
 *     output tasks never grow. */
#include <check.h>
#include <stdlib.h>

#include "model/model_impl.h"
#include "tests/check_main.h"
#include "tests/testutil.h"

static epyq_rlin bf16_lin(int32_t n, int32_t k) {
    epyq_rlin l = {.n = n, .k = k};
    return l;
}

/* int4: the packed byte count is what the split weighs (about half a byte per weight). */
static epyq_rlin q4_lin(int32_t n, int32_t k) {
    epyq_rlin l = {.n = n, .k = k, .q4 = true};
    l.w4.n = n, l.w4.k = k, l.w4.gs = 128;
    l.w4.bytes = (size_t)n * (size_t)k / 2 + (size_t)n * (size_t)(k / 128) * 4;
    return l;
}

static int64_t piece_bytes(const epyq_rlin_out *o, const epyq_gemm_piece *p) {
    const epyq_rlin *l = o[p->out].l;
    return (int64_t)epyq_rlin_bytes(l) / l->n * (p->n1 - p->n0);
}

/* The promises every split keeps; returns the task count. */
static int32_t check_split(int32_t threads, const epyq_rlin_out *o, int32_t n, int32_t rows,
                           int32_t max, epyq_gemm_piece *pc) {
    int32_t np = epyq_rlin_pieces(threads, o, n, rows, pc, max);
    ck_assert_msg(np >= n && np <= max, "%d tasks for %d outputs, at most %d allowed", np, n, max);
    int32_t t = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t r = 0, prev = -1;
        while (t < np && pc[t].out == i) {
            ck_assert_msg(pc[t].n0 == r && pc[t].n1 > r,
                          "output %d: task %d covers rows [%d, %d), expected to start at %d", i, t,
                          pc[t].n0, pc[t].n1, r);
            const int32_t len = pc[t].n1 - pc[t].n0;
            const int last = pc[t].n1 == o[i].l->n;
            ck_assert_msg(last || len % 16 == 0, "output %d: task %d has %d rows (not whole tiles)",
                          i, t, len);
            ck_assert_msg(last || prev < 0 || len <= prev,
                          "output %d: task %d has %d rows after one of %d (tasks must not grow)", i,
                          t, len, prev);
            prev = len;
            r = pc[t].n1;
            t++;
        }
        ck_assert_msg(r == o[i].l->n, "output %d: tasks cover rows [0, %d) of %d", i, r, o[i].l->n);
        const int small = (int64_t)o[i].l->n * o[i].l->k * rows < (1 << 17);
        if (threads <= 1 || small)
            ck_assert_msg(prev == o[i].l->n, "output %d (%d x %d, %d threads): split although %s", i,
                          o[i].l->n, o[i].l->k, threads, small ? "too small" : "one thread");
    }
    ck_assert_msg(t == np, "%d tasks, %d of them accounted for", np, t);
    return np;
}

START_TEST(test_lm_head_tail) {
    epyq_rlin lm = bf16_lin(248320, 2048);
    epyq_rlin_out o = {&lm, NULL, 0};
    epyq_gemm_piece pc[256];
    const int32_t np = check_split(2, &o, 1, 1, 256, pc);
    const int64_t total = (int64_t)epyq_rlin_bytes(&lm);
    ck_assert_msg(piece_bytes(&o, &pc[0]) >= total / 4 - 16 * 4096,
                  "first task %lld bytes of %lld (want ~1/4)", (long long)piece_bytes(&o, &pc[0]),
                  (long long)total);
    ck_assert_msg(piece_bytes(&o, &pc[np - 1]) <= (256 << 10) + 16 * 4096,
                  "last task %lld bytes: a thread may idle through it", (long long)piece_bytes(&o, &pc[np - 1]));
    ck_assert_msg(np < 64, "%d tasks for one matrix on 2 threads", np);
}
END_TEST

START_TEST(test_model_runs) {
    /* DeltaNet qkv/z/b/a, attention q/k/v, MoE router + shared gate, one token and 512 */
    epyq_rlin qkv = q4_lin(8192, 2048), z = q4_lin(4096, 2048), b = bf16_lin(32, 2048),
             a = bf16_lin(32, 2048), q = q4_lin(8192, 2048), k = q4_lin(512, 2048),
             v = q4_lin(512, 2048), router = bf16_lin(256, 2048), sg = bf16_lin(1, 2048);
    const epyq_rlin_out gdn[] = {{&qkv, NULL, 0}, {&z, NULL, 0}, {&b, NULL, 0}, {&a, NULL, 0}};
    const epyq_rlin_out att[] = {{&q, NULL, 0}, {&k, NULL, 0}, {&v, NULL, 0}};
    const epyq_rlin_out moe[] = {{&router, NULL, 0}, {&sg, NULL, 0}};
    epyq_gemm_piece pc[256];
    for (int32_t threads = 1; threads <= 64; threads *= 2)
        for (int32_t rows = 1; rows <= 512; rows *= 512) {
            check_split(threads, gdn, 4, rows, 256, pc);
            check_split(threads, att, 3, rows, 256, pc);
            check_split(threads, moe, 2, rows, 256, pc);
        }
}
END_TEST

START_TEST(test_random_shapes) {
    uint64_t s = 0x9e3779b97f4a7c15ull;
    epyq_rlin l[8];
    epyq_rlin_out o[8];
    epyq_gemm_piece pc[256];
    for (int c = 0; c < 400; c++) {
        const int32_t n = 1 + (int32_t)(epyq_test_xorshift(&s) % 8);
        for (int32_t i = 0; i < n; i++) {
            const int32_t rows = 1 + (int32_t)(epyq_test_xorshift(&s) % 300000);
            const int32_t k = 128 * (1 + (int32_t)(epyq_test_xorshift(&s) % 32));
            l[i] = epyq_test_xorshift(&s) % 2 ? q4_lin(rows, k) : bf16_lin(rows, k);
            o[i] = (epyq_rlin_out){&l[i], NULL, 0};
        }
        const int32_t threads = 1 + (int32_t)(epyq_test_xorshift(&s) % 128);
        const int32_t m = 1 + (int32_t)(epyq_test_xorshift(&s) % 64);
        const int32_t max = n + (int32_t)(epyq_test_xorshift(&s) % 249);
        check_split(threads, o, n, m, max, pc);
        ck_assert_msg(epyq_rlin_pieces(threads, o, n, m, pc, n - 1) == -1,
                      "%d outputs in at most %d tasks: expected a refusal", n, n - 1);
    }
}
END_TEST

int main(void) {
    Suite *su = suite_create("gemm_pieces");
    TCase *tc = epyq_test_case(su, "split", 0);
    EPYQ_TESTS_ADD(tc, test_lm_head_tail, test_model_runs, test_random_shapes);
    return epyq_test_run(su);
}
