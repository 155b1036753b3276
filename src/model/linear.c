/* src/model/linear.c — Linears in runtime form and the GEMMs over them.
 *
 * int4 linears are packed once for the kernels; 16/32-bit ones become bf16 [n][k] (exact for
 * BF16 checkpoints). A GEMM is split into tasks of whole 16-row tiles over the model's pool;
 * each task writes its own output rows, so results do not depend on the thread count. The
 * projections that read one activation (q/k/v, DeltaNet's qkv/z/b/a, router and shared-expert
 * gate) share one pool run: one hand-off instead of several, and no thread idles while
 * another runs a matrix too small to split. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "load/tensor_f32.h"
#include "model/model_impl.h"

/* 64-byte aligned room for n * size bytes, rounded up to whole lines; *bytes gets that size */
static void *model_alloc_lines(size_t n, size_t size, size_t *bytes) {
    if (!epyq_mul_size(n, size, bytes) || !epyq_add_size(*bytes, 63, bytes)) return NULL;
    *bytes &= ~(size_t)63;
    if (!*bytes) *bytes = 64;
    return aligned_alloc(64, *bytes);
}

void *epyq_model_alloc(size_t n, size_t size) {
    size_t bytes;
    void *p = model_alloc_lines(n, size, &bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

void *epyq_model_alloc_raw(size_t n, size_t size) {
    size_t bytes;
    void *p = model_alloc_lines(n, size, &bytes);
#ifdef EPYQ_POISON_SCRATCH
    if (p) memset(p, 0xff, bytes); /* every float a NaN */
#endif
    return p;
}

/* ---- act-order: a linear with a perm reads x[t][perm[j]] as its column j ---- */

/* Distinct column orders prepared for one pool run (more are run in further pool runs): real
 * GPTQ checkpoints give every projection of one input the same order (they share a Hessian),
 * so one slot is the usual need; synth --act-order gives q/k/v and qkv/z orders of their own. */
enum { PERM_SLOTS = 4 };

static size_t perm_act_stride(size_t na) { return (na + 63) & ~(size_t)63; }

/* Room in the model's scratch for PERM_SLOTS permuted copies of a [rows][k] input. */
static epyq_status perm_room(epyq_model *m, int32_t rows, int32_t k, epyq_err *err) {
    if (!atomic_load(&m->has_perm)) return EPYQ_OK;
    size_t nx = (size_t)rows * (size_t)k * PERM_SLOTS,
           na = perm_act_stride(epyq_act_bytes(rows, k, m->gs, EPYQ_PATH_A16)) * PERM_SLOTS;
    if (nx > m->perm_cap_x) {
        free(m->perm_x);
        m->perm_cap_x = 0;
        if (!(m->perm_x = epyq_model_alloc(nx, sizeof(float))))
            return epyq_err_set(err, EPYQ_E_NOMEM, "act-order activations [%d][%d]: out of memory", rows, k);
        m->perm_cap_x = nx;
    }
    if (na > m->perm_cap_act) {
        free(m->perm_act);
        m->perm_cap_act = 0;
        if (!(m->perm_act = epyq_model_alloc(na, 1)))
            return epyq_err_set(err, EPYQ_E_NOMEM, "act-order activations [%d][%d]: out of memory", rows, k);
        m->perm_cap_act = na;
    }
    return EPYQ_OK;
}

static bool same_perm(const epyq_rlin *a, const epyq_rlin *b) {
    if (a->perm == b->perm) return true;
    return a->perm && b->perm && a->k == b->k && !memcmp(a->perm, b->perm, (size_t)a->k * sizeof *a->perm);
}

/* a's input gathered by perm into scratch slot `slot`, prepared for a's path. */
static void perm_act(epyq_model *m, int32_t slot, const int32_t *perm, const epyq_act *a, epyq_act *pa) {
    const int32_t rows = a->m, k = a->k;
    float *xs = m->perm_x + (size_t)slot * (size_t)rows * (size_t)k;
    uint8_t *as = (uint8_t *)m->perm_act + (size_t)slot * perm_act_stride(epyq_act_bytes(rows, k, a->gs, a->path));
    for (int32_t t = 0; t < rows; t++) {
        const float *x = a->f32 + (size_t)t * k;
        float *xp = xs + (size_t)t * k;
        for (int32_t j = 0; j < k; j++) xp[j] = x[perm[j]];
    }
    *pa = (epyq_act){.m = rows, .k = k, .gs = a->gs, .path = a->path, .f32 = xs};
    m->kt->act_prep(pa, xs, rows, k, a->gs, a->path, as);
}

epyq_status epyq_rlin_act_gs(const epyq_model *m, const float *x, int32_t rows, int32_t k,
                             int32_t gs, epyq_act *a, void **buf, epyq_err *err) {
    *buf = NULL;
    /* bf16 GEMMs read only x->f32; the int4 kernels need the path-specific copy. int4
     * linears outside the MoE take A16 unless the path is a8all (see epyq_model_opts.path). */
    memset(a, 0, sizeof *a);
    a->m = rows, a->k = k, a->gs = gs, a->path = epyq_path_dense(m), a->f32 = x;
    if (gs <= 0 || k % gs) return EPYQ_OK;
    *buf = epyq_model_alloc(epyq_act_bytes(rows, k, gs, a->path), 1);
    if (!*buf) return epyq_err_set(err, EPYQ_E_NOMEM, "activations [%d][%d]: out of memory", rows, k);
    m->kt->act_prep(a, x, rows, k, gs, a->path, *buf);
    /* the scratch is the model's, not part of its constness: every caller holds it mutable */
    return perm_room((epyq_model *)m, rows, k, err);
}

epyq_status epyq_rlin_act(const epyq_model *m, const float *x, int32_t rows, int32_t k,
                          epyq_act *a, void **buf, epyq_err *err) {
    return epyq_rlin_act_gs(m, x, rows, k, m->gs, a, buf, err);
}

/* An int8 requantised linear is two int4 planes (requant.c): y = H x + L x, a block of rows
 * at a time so both planes' rows are read in order and L's partial sums fit on the stack.
 * Task boundaries are whole 16-row tiles (epyq_rlin_pieces), so every block starts on one. */
static void rows_two_planes(const epyq_model *m, const epyq_rlin *l, int32_t n0, int32_t n1,
                            const epyq_act *a, float *y, int32_t ldy) {
    enum { TMP = 4096 };
    float tmp[TMP];
    int32_t blk = (TMP / a->m) / 16 * 16;
    float *t = tmp, *heap = NULL;
    if (blk < 16) { /* more rows than a prefill chunk has: scratch from the heap */
        blk = 16;
        t = heap = malloc((size_t)blk * (size_t)a->m * sizeof(float));
    }
    for (int32_t j0 = n0; j0 < n1; j0 += blk) {
        int32_t j1 = j0 + blk < n1 ? j0 + blk : n1;
        epyq_w4 lo;
        m->kt->w4_gemm(&l->w4, j0, j1, a, y, ldy);
        if (!t || !epyq_w4_view(&l->w4lo, j0, j1, &lo)) { /* no scratch / not on a tile */
            for (int32_t r = 0; r < a->m; r++)
                for (int32_t j = j0; j < j1; j++) y[(size_t)r * ldy + j] = NAN;
            continue;
        }
        m->kt->w4_gemm(&lo, 0, j1 - j0, a, t, j1 - j0);
        for (int32_t r = 0; r < a->m; r++)
            for (int32_t j = j0; j < j1; j++) y[(size_t)r * ldy + j] += t[(size_t)r * (j1 - j0) + j - j0];
    }
    free(heap);
}

void epyq_rlin_rows(const epyq_model *m, const epyq_rlin *l, int32_t n0, int32_t n1,
                    const epyq_act *a, float *y, int32_t ldy) {
    if (n1 <= n0) return;
    if (l->q4 && l->requant == EPYQ_REQUANT_INT8) rows_two_planes(m, l, n0, n1, a, y, ldy);
    else if (l->q4) m->kt->w4_gemm(&l->w4, n0, n1, a, y, ldy);
    else if (l->exact || m->f32_act) m->kt->bf16_gemm_f32(l->bf16, l->k, n0, n1, a, y, ldy);
    else m->kt->bf16_gemm(l->bf16, l->k, n0, n1, a, y, ldy);
}

enum { MAX_OUTS = 8, MAX_PIECES = 256, MIN_PIECE_BYTES = 256 << 10 };

/* Guided split: each task takes 1/(2 x threads) of the weight bytes still left (whole
 * 16-row tiles, at least min_bytes), so tasks shrink towards the end of the run. Workers
 * pull tasks in order, and a run ends when its last task does, so the last tasks are what
 * one thread may idle through: 8 equal tasks per matrix left up to a whole task (the 1 GB
 * lm_head: 127 MB) to one thread. Many small tasks cost more than they save (each restarts
 * its weight stream: 256 KiB tasks throughout were 6% slower than 8 per matrix), hence big
 * ones first. In-process A/B, full 35b model, 2 threads, 150 tokens alternating: 2.3%
 * faster than 8 equal tasks per matrix. Returns -1 when the tasks would not fit in max. */
static int32_t guided(int32_t n_threads, const epyq_rlin_out *outs, int32_t n, int32_t rows,
                      int64_t min_bytes, epyq_gemm_piece *pc, int32_t max) {
    int64_t left = 0;
    for (int32_t i = 0; i < n; i++) left += (int64_t)epyq_rlin_bytes(outs[i].l);
    int32_t np = 0;
    for (int32_t i = 0; i < n; i++) {
        const epyq_rlin *l = outs[i].l;
        int64_t row_bytes = (int64_t)epyq_rlin_bytes(l) / l->n;
        if (row_bytes < 1) row_bytes = 1;
        bool whole = (int64_t)l->n * l->k * rows < (1 << 17) || n_threads <= 1;
        for (int32_t r = 0; r < l->n;) {
            int64_t want = left / (2 * n_threads), take = l->n - r;
            if (want < min_bytes) want = min_bytes;
            if (!whole) take = ((want + row_bytes - 1) / row_bytes + 15) / 16 * 16;
            if (take > l->n - r) take = l->n - r;
            if (np == max) return -1;
            pc[np++] = (epyq_gemm_piece){i, r, r + (int32_t)take};
            left -= take * row_bytes;
            r += (int32_t)take;
        }
    }
    return np;
}

int32_t epyq_rlin_pieces(int32_t n_threads, const epyq_rlin_out *outs, int32_t n, int32_t rows,
                         epyq_gemm_piece *pc, int32_t max) {
    if (max < n) return -1;
    int32_t np;
    /* many threads make many tasks (~2 x threads x ln(bytes / task)): grow them until they
     * fit, at the latest when every output is one task */
    for (int64_t min = MIN_PIECE_BYTES; (np = guided(n_threads, outs, n, rows, min, pc, max)) < 0;)
        min *= 2;
    return np;
}

typedef struct {
    const epyq_model *m;
    const epyq_rlin_out *outs;
    const epyq_gemm_piece *pc;
    const epyq_act *const *acts; /* [outputs] the activation each output reads */
} gemm_job;

static void gemm_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const gemm_job *j = ctx;
    const epyq_gemm_piece *q = &j->pc[task];
    const epyq_rlin_out *o = &j->outs[q->out];
    epyq_rlin_rows(j->m, o->l, q->n0, q->n1, j->acts[q->out], o->y, o->ldy);
}

/* One pool run over at most MAX_OUTS outputs, output i reading acts[i]. */
static void run_outs(epyq_model *m, const epyq_rlin_out *outs, int32_t c, const epyq_act *const *acts) {
    for (int32_t i = 0; i < c; i++)
        if (outs[i].l->split) { /* NUMA: the slices run on their nodes' pools (numa_dense.c) */
            epyq_numa_dense_run(m, outs, c, acts);
            return;
        }
    epyq_gemm_piece pc[MAX_PIECES];
    int32_t np = epyq_rlin_pieces(m->pool ? m->n_threads : 1, outs, c, acts[0]->m, pc, MAX_PIECES);
    gemm_job j = {m, outs, pc, acts};
    if (np <= 1 || !m->pool)
        for (int32_t t = 0; t < np; t++) gemm_task(&j, t, 0);
    else
        epyq_pool_run(m->pool, gemm_task, &j, np);
}

static void run_same_act(epyq_model *m, const epyq_rlin_out *outs, int32_t n, const epyq_act *a) {
    const epyq_act *acts[MAX_OUTS];
    for (int32_t i = 0; i < MAX_OUTS; i++) acts[i] = a;
    for (int32_t i0 = 0; i0 < n; i0 += MAX_OUTS) run_outs(m, outs + i0, n - i0 < MAX_OUTS ? n - i0 : MAX_OUTS, acts);
}

void epyq_rlin_run_many(epyq_model *m, const epyq_rlin_out *outs, int32_t n, const epyq_act *a) {
    bool any = false;
    for (int32_t i = 0; i < n && !any; i++) any = outs[i].l->perm != NULL;
    if (!any) {
        run_same_act(m, outs, n, a);
        return;
    }
    /* Each distinct column order gets its activation prepared once, in a scratch slot; the
     * outputs still share one pool run (up to PERM_SLOTS orders and MAX_OUTS outputs a run). */
    epyq_rlin_out sel[MAX_OUTS];
    const epyq_act *acts[MAX_OUTS];
    epyq_act pa[PERM_SLOTS];
    const epyq_rlin *slot_of[PERM_SLOTS];
    int32_t ns = 0, nslots = 0;
    for (int32_t i = 0; i < n; i++) {
        const epyq_rlin *l = outs[i].l;
        int32_t s = -1;
        for (int32_t q = 0; l->perm && q < nslots && s < 0; q++)
            if (same_perm(slot_of[q], l)) s = q;
        if (ns == MAX_OUTS || (l->perm && s < 0 && nslots == PERM_SLOTS)) { /* run what is gathered */
            run_outs(m, sel, ns, acts);
            ns = nslots = 0, s = -1;
        }
        if (l->perm && s < 0) {
            s = nslots++;
            slot_of[s] = l;
            perm_act(m, s, l->perm, a, &pa[s]);
        }
        sel[ns] = outs[i];
        acts[ns++] = l->perm ? &pa[s] : a;
    }
    if (ns) run_outs(m, sel, ns, acts);
}

void epyq_rlin_run(epyq_model *m, const epyq_rlin *l, const epyq_act *a, float *y, int32_t ldy) {
    epyq_rlin_out o = {l, y, ldy};
    epyq_rlin_run_many(m, &o, 1, a);
}

/* Row r of q [n][k], s and z [n][gpr] becomes row row_order[r] of the originals (act-order experts). */
static bool reorder_rows(uint8_t *q, float *s, uint8_t *z, int32_t n, int32_t k, int32_t gpr, const int32_t *order) {
    uint8_t *q2 = malloc((size_t)n * k), *z2 = malloc((size_t)n * gpr);
    float *s2 = malloc((size_t)n * gpr * sizeof *s2);
    bool ok = q2 && z2 && s2;
    for (int32_t r = 0; ok && r < n; r++) {
        int32_t o = order[r];
        memcpy(q2 + (size_t)r * k, q + (size_t)o * k, (size_t)k);
        memcpy(s2 + (size_t)r * gpr, s + (size_t)o * gpr, (size_t)gpr * sizeof *s);
        memcpy(z2 + (size_t)r * gpr, z + (size_t)o * gpr, (size_t)gpr);
    }
    if (ok) {
        memcpy(q, q2, (size_t)n * k);
        memcpy(s, s2, (size_t)n * gpr * sizeof *s);
        memcpy(z, z2, (size_t)n * gpr);
    }
    free(q2), free(z2), free(s2);
    return ok;
}

static epyq_status rlin_load(epyq_model *m, epyq_rlin *dst, const epyq_linear *src, bool exact,
                             const int32_t *row_order, epyq_err *err) {
    const epyq_config *c = m->c;
    if (src->n_out < 1 || src->n_in < 1 || src->n_out > INT32_MAX || src->n_in > INT32_MAX)
        return epyq_err_set(err, EPYQ_E_SHAPE, "%s: shape [%lld][%lld] out of range", src->module,
                            (long long)src->n_out, (long long)src->n_in);
    int32_t n = (int32_t)src->n_out, k = (int32_t)src->n_in;
    dst->n = n, dst->k = k, dst->exact = exact;
    size_t nk = (size_t)n * (size_t)k;
    epyq_status st = EPYQ_OK;
    if (src->kind == EPYQ_LIN_Q4) {
        int32_t gs = src->scheme.group_size;
        if (gs <= 0 || k % gs)
            return epyq_err_set(err, EPYQ_E_QUANT, "%s: group size %d does not divide in_features %d",
                                src->module, gs, k);
        if (m->gs && m->gs != gs)
            return epyq_err_set(err, EPYQ_E_UNSUPPORTED,
                                "%s: group size %d differs from the model's other int4 linears (%d)",
                                src->module, gs, m->gs);
        if (!m->gs) m->gs = gs;
        size_t ng = nk / (size_t)gs;
        uint8_t *q = malloc(nk), *z = malloc(ng);
        float *s = malloc(ng * sizeof(float));
        int32_t *perm = malloc((size_t)k * sizeof(int32_t));
        bool has_perm = false;
        if (!q || !z || !s || !perm) st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", src->module);
        if (st == EPYQ_OK) st = epyq_linear_unpack_q4(src, c, q, s, src->scheme.sym ? NULL : z, perm,
                                                      &has_perm, err);
        /* symmetric: unpack left z alone, every zero is 8 */
        if (st == EPYQ_OK && src->scheme.sym) memset(z, 8, ng);
        if (st == EPYQ_OK && row_order && !reorder_rows(q, s, z, n, k, k / gs, row_order))
            st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", src->module);
        int asym = 0;
        for (size_t i = 0; st == EPYQ_OK && !src->scheme.sym && i < ng; i++) asym |= z[i] != 8;
        void *mem = NULL;
        if (st == EPYQ_OK) {
            mem = epyq_wmem_alloc(m->wmem, epyq_w4_pack_bytes(n, k, gs, asym), 1);
            if (!mem) st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory for packed int4", src->module);
        }
        if (st == EPYQ_OK) {
            epyq_q4_canon cn = {n, k, gs, q, s, asym ? z : NULL};
            st = epyq_w4_pack(&dst->w4, mem, &cn, err);
            if (st != EPYQ_OK) epyq_err_prefix(err, "%s: ", src->module);
        }
        if (st == EPYQ_OK) dst->q4 = true;
        else
            epyq_wmem_release(m->wmem, mem);
        if (st == EPYQ_OK && has_perm) {
            /* act-order: the packed columns are in g_idx group order; keep the order */
            dst->perm = perm, perm = NULL;
            atomic_store(&m->has_perm, true);
        }
        free(q), free(z), free(s), free(perm);
        return st;
    }
    /* 16-bit / 32-bit: converted in blocks of rows so a 248k-row lm_head needs no full fp32
     * copy (exact for BF16) */
    enum { BLOCK_ROWS = 256 };
    float *f = malloc((size_t)BLOCK_ROWS * (size_t)k * sizeof(float));
    dst->bf16 = epyq_wmem_alloc(m->wmem, nk, sizeof(uint16_t));
    if (!f || !dst->bf16) st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", src->module);
    for (int32_t r0 = 0; st == EPYQ_OK && r0 < n; r0 += BLOCK_ROWS) {
        int32_t rows = n - r0 < BLOCK_ROWS ? n - r0 : BLOCK_ROWS;
        size_t cnt = (size_t)rows * (size_t)k;
        st = epyq_rlin_read_rows(src, r0, rows, f, err);
        for (size_t i = 0; st == EPYQ_OK && i < cnt; i++) dst->bf16[(size_t)r0 * k + i] = epyq_f32_to_bf16(f[i]);
    }
    free(f);
    return st;
}

epyq_status epyq_rlin_read_rows(const epyq_linear *src, int32_t r0, int32_t rows, float *f,
                                epyq_err *err) {
    /* the matrix is rows [row0, row0 + n_out) of slice `slice` of the tensor */
    const epyq_tensor *t = src->w;
    if (!t) return epyq_err_set(err, EPYQ_E_INTERNAL, "%s: weight not bound", src->module);
    int64_t rows_per_slice = t->ndim >= 2 ? t->shape[t->ndim - 2] : 1;
    size_t base = (size_t)((src->slice * rows_per_slice + src->row0) * src->n_in);
    epyq_status st = epyq_tensor_read_f32(t, base + (size_t)r0 * (size_t)src->n_in,
                                          (size_t)rows * (size_t)src->n_in, f, err);
    if (st != EPYQ_OK) epyq_err_prefix(err, "%s: ", src->module);
    return st;
}

epyq_status epyq_rlin_load(epyq_model *m, epyq_rlin *dst, const epyq_linear *src, bool exact,
                           epyq_err *err) {
    return rlin_load(m, dst, src, exact, NULL, err);
}

epyq_status epyq_rlin_load_expert(epyq_model *m, epyq_rlin *gate, epyq_rlin *up, epyq_rlin *down,
                                  const epyq_linear *gs, const epyq_linear *us, const epyq_linear *ds,
                                  epyq_err *err) {
    epyq_status st = rlin_load(m, down, ds, false, NULL, err);
    /* h[i] = silu(gate_i x) up_i x is formed inside the kernel; down's packed column j reads
     * h[perm[j]], so gate/up row j is made row perm[j] and down reads h in order */
    const int32_t *order = st == EPYQ_OK ? down->perm : NULL;
    if (order && (gs->n_out != down->k || us->n_out != down->k))
        st = epyq_err_set(err, EPYQ_E_SHAPE, "%s: %lld / %lld gate/up rows for a down projection of %d inputs",
                          ds->module, (long long)gs->n_out, (long long)us->n_out, down->k);
    if (st == EPYQ_OK) st = rlin_load(m, gate, gs, false, order, err);
    if (st == EPYQ_OK) st = rlin_load(m, up, us, false, order, err);
    if (st == EPYQ_OK && !same_perm(gate, up))
        st = epyq_err_set(err, EPYQ_E_UNSUPPORTED,
                          "%s and %s: different act-order column orders (g_idx): the fused expert kernel reads "
                          "one activation for both (GPTQ gives both one order, from their shared input)",
                          gs->module, us->module);
    free(down->perm);
    down->perm = NULL;
    return st;
}

void epyq_rlin_free(const epyq_model *m, epyq_rlin *l) {
    free(l->perm);
    if (l->q4) epyq_wmem_release(m->wmem, l->w4.mem), epyq_wmem_release(m->wmem, l->w4lo.mem);
    epyq_wmem_release(m->wmem, l->bf16);
    memset(l, 0, sizeof *l);
}

uint64_t epyq_rlin_bytes(const epyq_rlin *l) {
    if (l->q4) return l->w4.bytes + (l->requant == EPYQ_REQUANT_INT8 ? l->w4lo.bytes : 0);
    return (uint64_t)l->n * (uint64_t)l->k * 2u;
}
