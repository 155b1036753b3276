/* src/model/seq.c — sequences: KV caches (bf16, or fp8 e4m3 to halve them) and DeltaNet
 * states, allocated for the context asked for, in per-head blocks of whole pages (one plane
 * per (layer, kv head), one conv block per (layer, key head), one state per (layer, value
 * head)) so that NUMA mode can keep each head's blocks on its own node (numa_state.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/util.h"
#include "model/model_impl.h"

/* OCP fp8 E4M3 ("e4m3fn": bias 7, no infinities, max 448): round to nearest even, saturate. */
static uint8_t f32_to_e4m3(float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (isnan(x)) return 0x7f;
    if (a < 0x1p-6f) return sign | (uint8_t)nearbyintf(a * 512.0f); /* subnormal; 8 = min normal */
    int ex;
    frexpf(a, &ex);
    int e = ex - 1;                                        /* a in [2^e, 2^(e+1)) */
    int mant = (int)nearbyintf((ldexpf(a, -e) - 1.0f) * 8.0f);
    if (mant == 8) e++, mant = 0;
    int code = ((e + 7) << 3) | mant;
    return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

static float e4m3_to_f32(uint8_t c) {
    int e = (c >> 3) & 15, mt = c & 7;
    float v = e ? ldexpf(1.0f + mt / 8.0f, e - 7) : ldexpf((float)mt, -9);
    return c & 0x80 ? -v : v;
}

/* Blocks are cut in pages of this size (x86-64's): a fixed figure, so that the layout does not
 * depend on the machine; with larger pages the blocks are simply not bound. */
#define SEQ_PAGE ((size_t)4096)

static size_t page_round(size_t b) { return (b + SEQ_PAGE - 1) / SEQ_PAGE * SEQ_PAGE; }

#define SEQ_HUGE ((size_t)2 << 20)

/* Zeroed, page-aligned memory that nothing has touched yet, so that binding it to a node
 * (numa_state.c) decides where every page lands; NULL on failure or for 0 bytes.
 * A map of 2 MiB or more starts on a 2 MiB boundary and is advised for huge pages: a decoded
 * token reads and writes every DeltaNet state (63 MB on the real shape, 126 MB with the KV
 * rows' share), and on 4 KiB pages the state step took 11.8% of a 40-layer decode profile
 * (Zen 5 VM) for ~5% of its bytes. Blocks bound to different nodes split the mapping into
 * smaller ranges, which simply keep 4 KiB pages. */
static void *seq_map(size_t bytes) {
    if (!bytes) return NULL;
    const size_t len = page_round(bytes);
    if (len < SEQ_HUGE) {
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    uint8_t *map =
        mmap(NULL, len + SEQ_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)map + SEQ_HUGE - 1) & ~(uintptr_t)(SEQ_HUGE - 1));
    /* trim to [p, p + len) so that seq_unmap's munmap(p, len) returns all of it */
    if (p > map) munmap(map, (size_t)(p - map));
    if (map + len + SEQ_HUGE > p + len) munmap(p + len, (size_t)(map + len + SEQ_HUGE - (p + len)));
    (void)madvise(p, len, MADV_HUGEPAGE); /* a hint: without it only TLB misses are lost */
    return p;
}

static void seq_unmap(void *p, size_t bytes) {
    if (p) munmap(p, page_round(bytes));
}

int32_t epyq_seq_conv_taps(const epyq_model *m) { return m->d.Kc - 1 > 0 ? m->d.Kc - 1 : 1; }

int32_t epyq_seq_conv_ch(const epyq_model *m) {
    return m->d.Hk > 0 ? 2 * m->d.Dk + m->d.Hv / m->d.Hk * m->d.Dv : 0;
}

size_t epyq_seq_conv_blk(const epyq_model *m) {
    return page_round((size_t)epyq_seq_conv_taps(m) * (size_t)epyq_seq_conv_ch(m) * sizeof(float)) /
           sizeof(float);
}

/* Bytes of one (layer, kv head) plane of n_ctx rows, 0 on overflow. */
static size_t kv_plane(const epyq_model *m, int32_t n_ctx, size_t elem) {
    size_t b;
    if (!epyq_mul_size((size_t)n_ctx * (size_t)m->d.hd, elem, &b) || b > SIZE_MAX - SEQ_PAGE)
        return 0;
    return page_round(b);
}

static size_t state_floats(const epyq_model *m) {
    return (size_t)m->n_gdn * m->d.Hv * m->d.Dk * m->d.Dv;
}
static size_t conv_floats(const epyq_model *m) {
    return (size_t)m->n_gdn * (size_t)m->d.Hk * epyq_seq_conv_blk(m);
}
static size_t kv_map_bytes(const epyq_seq *s) {
    return 2 * (size_t)s->n_kv_layers * (size_t)s->m->d.nkv * s->kv_plane;
}

epyq_status epyq_seq_create(epyq_seq **out, epyq_model *m, int32_t n_ctx, epyq_kv_type kv,
                            epyq_err *err) {
    *out = NULL;
    if (n_ctx < 1 || n_ctx > m->c->max_ctx)
        return epyq_err_set(err, EPYQ_E_ARG, "context %d outside [1, %lld] (%s)", n_ctx, (long long)m->c->max_ctx,
                            m->c->yarn ? "YaRN: original_max_position_embeddings x factor" : "max_position_embeddings");
    epyq_seq *s = calloc(1, sizeof *s);
    if (!s) return epyq_err_set(err, EPYQ_E_NOMEM, "sequence: out of memory");
    s->m = m, s->n_ctx = n_ctx, s->kv = kv;
    s->n_kv_layers = m->n_attn + (m->has_mtp ? 1 : 0);
    s->kv_elem = kv == EPYQ_KV_FP8 ? 1 : 2;
    s->kv_plane = kv_plane(m, n_ctx, s->kv_elem);
    size_t kv_bytes = 0;
    bool ok = s->kv_plane &&
              epyq_mul_size((size_t)s->n_kv_layers * (size_t)m->d.nkv * 2, s->kv_plane, &kv_bytes);
    if (ok && kv_bytes) {
        s->k = seq_map(kv_bytes);
        s->v = s->k ? s->k + kv_bytes / 2 : NULL;
        ok = s->k != NULL;
    }
    if (ok && m->n_gdn) {
        s->conv = seq_map(conv_floats(m) * sizeof(float));
        s->S = seq_map(state_floats(m) * sizeof(float));
        ok = s->conv && s->S;
    }
    if (!ok) {
        epyq_seq_free(s);
        return epyq_err_set(err, EPYQ_E_NOMEM,
                            "sequence of %d positions: out of memory (KV %zu bytes)", n_ctx,
                            kv_bytes);
    }
    /* NUMA mode: each head's blocks on the node whose pool works on that head (numa_state.c),
     * bound before anything touches them */
    epyq_status st = epyq_numa_seq_place(m, s, err);
    if (st != EPYQ_OK) {
        epyq_seq_free(s);
        return st;
    }
    *out = s;
    return EPYQ_OK;
}

void epyq_seq_free(epyq_seq *s) {
    if (!s) return;
    const epyq_model *m = s->m;
    seq_unmap(s->k, kv_map_bytes(s));
    seq_unmap(s->conv, conv_floats(m) * sizeof(float));
    seq_unmap(s->S, state_floats(m) * sizeof(float));
    seq_unmap(s->spec_S, (size_t)s->spec_cap * state_floats(m) * sizeof(float));
    seq_unmap(s->spec_conv, (size_t)s->spec_cap * conv_floats(m) * sizeof(float));
    free(s);
}

void epyq_seq_reset(epyq_seq *s) {
    const epyq_model *m = s->m;
    /* KV rows past pos are never read, so only the recurrent states need clearing */
    if (m->n_gdn) {
        memset(s->conv, 0, conv_floats(m) * sizeof(float));
        memset(s->S, 0, state_floats(m) * sizeof(float));
    }
    s->pos = 0;
    s->rope_delta = 0;
    s->broken[0] = '\0';
    s->spec_n = 0;
}

epyq_status epyq_seq_spec_begin(epyq_seq *s, int32_t n, epyq_err *err) {
    if (n < 1 || n > EPYQ_SPEC_MAX)
        return epyq_err_set(err, EPYQ_E_ARG, "speculative verification of %d tokens (1..%d)", n, EPYQ_SPEC_MAX);
    const epyq_model *m = s->m;
    /* copies after tokens 0 .. n - 2: after the last one the state itself is that copy */
    if (m->n_gdn && n - 1 > s->spec_cap) {
        seq_unmap(s->spec_S, (size_t)s->spec_cap * state_floats(m) * sizeof(float));
        seq_unmap(s->spec_conv, (size_t)s->spec_cap * conv_floats(m) * sizeof(float));
        s->spec_S = seq_map((size_t)(n - 1) * state_floats(m) * sizeof(float));
        s->spec_conv = seq_map((size_t)(n - 1) * conv_floats(m) * sizeof(float));
        s->spec_cap = n - 1;
        if (!s->spec_S || !s->spec_conv) {
            seq_unmap(s->spec_S, (size_t)s->spec_cap * state_floats(m) * sizeof(float));
            seq_unmap(s->spec_conv, (size_t)s->spec_cap * conv_floats(m) * sizeof(float));
            s->spec_S = s->spec_conv = NULL;
            s->spec_cap = 0;
            return epyq_err_set(err, EPYQ_E_NOMEM,
                                "speculative state snapshots (%d x %zu MB): out of memory", n - 1,
                                state_floats(m) * sizeof(float) >> 20);
        }
        /* NUMA mode: each head's snapshots on the node whose pool writes them */
        epyq_status st = epyq_numa_spec_place(m, s, err);
        if (st != EPYQ_OK) return st;
    }
    s->spec_n = n, s->spec_pos0 = s->pos;
    return EPYQ_OK;
}

epyq_status epyq_seq_rollback(epyq_seq *s, int32_t keep, epyq_err *err) {
    int32_t n = s->spec_n;
    s->spec_n = 0;
    if (n <= 0) return epyq_err_set(err, EPYQ_E_ARG, "rollback without a speculative verification");
    if (keep < 1 || keep > n || s->pos != s->spec_pos0 + n)
        return epyq_err_set(err, EPYQ_E_ARG, "rollback to %d of %d verified tokens (position %d, started at %d)",
                            keep, n, s->pos, s->spec_pos0);
    const epyq_model *m = s->m;
    if (keep < n && m->n_gdn) {
        memcpy(s->S, s->spec_S + (size_t)(keep - 1) * state_floats(m), state_floats(m) * sizeof(float));
        memcpy(s->conv, s->spec_conv + (size_t)(keep - 1) * conv_floats(m), conv_floats(m) * sizeof(float));
    }
    /* attention KV rows past the new position are never read before being written again */
    s->pos = s->spec_pos0 + keep;
    return EPYQ_OK;
}

int32_t epyq_seq_pos(const epyq_seq *s) { return s->pos; }
int32_t epyq_seq_rope_delta(const epyq_seq *s) { return s->rope_delta; }
int32_t epyq_seq_ctx(const epyq_seq *s) { return s->n_ctx; }

uint64_t epyq_seq_bytes(const epyq_seq *s) { return epyq_model_seq_bytes(s->m, s->n_ctx, s->kv, NULL); }

uint64_t epyq_model_seq_bytes(const epyq_model *m, int32_t n_ctx, epyq_kv_type kv, uint64_t *kv_bytes) {
    /* the same sizes epyq_seq_create maps */
    uint64_t layers = (uint64_t)m->n_attn + (m->has_mtp ? 1u : 0u);
    uint64_t k = 2ull * layers * (uint64_t)m->d.nkv * kv_plane(m, n_ctx, kv == EPYQ_KV_FP8 ? 1 : 2);
    uint64_t st = m->n_gdn ? page_round(conv_floats(m) * sizeof(float)) +
                                 page_round(state_floats(m) * sizeof(float))
                           : 0;
    if (kv_bytes) *kv_bytes = k;
    return k + st;
}

void epyq_seq_kv_store(epyq_seq *s, int32_t layer_slot, int32_t pos, int32_t kvh, const float *k,
                       const float *v) {
    const epyq_model *m = s->m;
    size_t hd = (size_t)m->d.hd;
    size_t off =
        ((size_t)layer_slot * m->d.nkv + (size_t)kvh) * s->kv_plane + (size_t)pos * hd * s->kv_elem;
    if (s->kv == EPYQ_KV_FP8) {
        for (size_t i = 0; i < hd; i++) {
            s->k[off + i] = f32_to_e4m3(k[i]);
            s->v[off + i] = f32_to_e4m3(v[i]);
        }
        return;
    }
    uint16_t *kb = (uint16_t *)(s->k + off), *vb = (uint16_t *)(s->v + off);
    for (size_t i = 0; i < hd; i++) {
        kb[i] = epyq_f32_to_bf16(k[i]);
        vb[i] = epyq_f32_to_bf16(v[i]);
    }
}

void epyq_seq_kv_view(const epyq_seq *s, int32_t layer_slot, int32_t kvh, int32_t n, uint16_t *tmp,
                      const uint16_t **k, const uint16_t **v, int32_t *stride) {
    const epyq_model *m = s->m;
    size_t off = ((size_t)layer_slot * m->d.nkv + (size_t)kvh) * s->kv_plane;
    *stride = m->d.hd; /* a head's rows are contiguous in its plane */
    if (s->kv == EPYQ_KV_BF16) {
        *k = (const uint16_t *)(s->k + off);
        *v = (const uint16_t *)(s->v + off);
        return;
    }
    /* e4m3 values are exactly representable in bf16: widening loses nothing */
    uint16_t *tk = tmp, *tv = tmp + (size_t)n * m->d.hd;
    for (size_t i = 0; i < (size_t)n * m->d.hd; i++) {
        tk[i] = epyq_f32_to_bf16(e4m3_to_f32(s->k[off + i]));
        tv[i] = epyq_f32_to_bf16(e4m3_to_f32(s->v[off + i]));
    }
    *k = tk, *v = tv;
}

void epyq_seq_conv_canon(const epyq_model *m, float *conv, void *canon, bool to_canon) {
    const int32_t taps = epyq_seq_conv_taps(m), ch = epyq_seq_conv_ch(m), cd = m->d.conv_dim;
    const int32_t Dk = m->d.Dk, vw = ch - 2 * Dk, key_dim = m->d.Hk * Dk;
    const size_t blk = epyq_seq_conv_blk(m);
    for (int32_t l = 0; l < m->n_gdn; l++)
        for (int32_t kh = 0; kh < m->d.Hk; kh++)
            for (int32_t r = 0; r < taps; r++) {
                float *b = conv + ((size_t)l * m->d.Hk + (size_t)kh) * blk + (size_t)r * ch;
                uint8_t *c = (uint8_t *)canon + ((size_t)l * taps + (size_t)r) * cd * sizeof(float);
                /* the key head's q, k and value channels, at their places in the projection */
                const int32_t at[3] = {kh * Dk, key_dim + kh * Dk, 2 * key_dim + kh * vw};
                const int32_t loc[3] = {0, Dk, 2 * Dk}, len[3] = {Dk, Dk, vw};
                for (int32_t i = 0; i < 3; i++) {
                    uint8_t *ci = c + (size_t)at[i] * sizeof(float);
                    if (to_canon) memcpy(ci, b + loc[i], (size_t)len[i] * sizeof(float));
                    else
                        memcpy(b + loc[i], ci, (size_t)len[i] * sizeof(float));
                }
            }
}
