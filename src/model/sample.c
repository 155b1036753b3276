/* src/model/sample.c — see sample.h. */
#include "model/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float v;
    int32_t id;
} cand;

struct epyq_sampler {
    epyq_sample_params p;
    int32_t V;
    uint64_t rng;
    uint8_t *seen;  /* [V] bit 0: in the sequence, bit 1: generated */
    uint32_t *freq; /* [V] times generated; only with a frequency penalty (1 MB at V = 248k) */
    float *work;    /* [V] penalised, tempered logits */
    int32_t *idx;   /* [V] candidate ids */
    cand *c;        /* [V] candidates being sorted */
};

void epyq_sample_defaults(epyq_sample_params *p, const epyq_config *c) {
    memset(p, 0, sizeof *p);
    p->temperature = c->do_sample ? c->temperature : 0.0f;
    p->top_k = c->top_k;
    p->top_p = c->top_p > 0.0f ? c->top_p : 1.0f;
    p->min_p = c->min_p;
    p->presence_penalty = c->presence_penalty;
    p->repetition_penalty = c->repetition_penalty > 0.0f ? c->repetition_penalty : 1.0f;
}

epyq_status epyq_sampler_create(epyq_sampler **out, const epyq_sample_params *p, int32_t vocab,
                                epyq_err *err) {
    *out = NULL;
    if (vocab < 1) return epyq_err_set(err, EPYQ_E_ARG, "sampler: vocabulary of %d", vocab);
    if (p->top_k < 0 || p->top_p <= 0.0f || p->min_p < 0.0f || p->min_p > 1.0f ||
        p->repetition_penalty <= 0.0f || isnan(p->temperature))
        return epyq_err_set(err, EPYQ_E_ARG,
                            "sampler: top_k %d (>= 0), top_p %g (> 0), min_p %g ([0, 1]), repetition"
                            " penalty %g (> 0) out of range", p->top_k, p->top_p, p->min_p,
                            p->repetition_penalty);
    epyq_sampler *s = calloc(1, sizeof *s);
    if (!s) return epyq_err_set(err, EPYQ_E_NOMEM, "sampler: out of memory");
    s->p = *p, s->V = vocab;
    s->rng = p->seed ^ 0x9e3779b97f4a7c15ull;
    s->seen = calloc((size_t)vocab, 1);
    s->work = malloc((size_t)vocab * sizeof(float));
    s->idx = malloc((size_t)vocab * sizeof(int32_t));
    s->c = malloc((size_t)vocab * sizeof(cand));
    if (p->frequency_penalty != 0.0f) s->freq = calloc((size_t)vocab, sizeof *s->freq);
    if (!s->seen || !s->work || !s->idx || !s->c || (p->frequency_penalty != 0.0f && !s->freq)) {
        epyq_sampler_free(s);
        return epyq_err_set(err, EPYQ_E_NOMEM, "sampler: out of memory");
    }
    *out = s;
    return EPYQ_OK;
}

void epyq_sampler_free(epyq_sampler *s) {
    if (!s) return;
    free(s->seen), free(s->work), free(s->idx), free(s->c), free(s->freq);
    free(s);
}

void epyq_sampler_accept(epyq_sampler *s, int32_t tok, bool generated) {
    if (tok < 0 || tok >= s->V) return;
    s->seen[tok] |= (uint8_t)(1u | (generated ? 2u : 0u));
    if (generated && s->freq) s->freq[tok]++;
}

/* Two passes: the largest value over four independent chains, then its first position. The
 * one-pass form (compare with v[b]) waits for a load of v[b] at every element: 1.2 ms per
 * 248k-entry row against 0.2 ms (this VM), ~1% of a 35b decode step in which the pool's
 * other thread idles. */
int32_t epyq_argmax(const float *v, int32_t n) {
    if (n <= 0 || isnan(v[0])) return 0; /* nothing compares greater than a NaN at 0 */
    float m[4] = {v[0], v[0], v[0], v[0]};
    int32_t i = 1;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            if (v[i + j] > m[j]) m[j] = v[i + j];
    for (; i < n; i++)
        if (v[i] > m[0]) m[0] = v[i];
    float best = m[0];
    for (int j = 1; j < 4; j++)
        if (m[j] > best) best = m[j];
    for (i = 0; i < n; i++)
        if (v[i] == best) return i; /* +0 == -0: the first zero, as the one-pass form keeps */
    return 0;
}

bool epyq_is_eos(const epyq_config *c, int32_t tok) {
    for (int32_t i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == tok) return true;
    return false;
}

/* splitmix64: tiny, full-period, and the same stream on every platform */
static double uniform(uint64_t *st) {
    uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1p-53;
}

/* larger value first, then lower id (deterministic order for ties) */
static int cmp_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Move the k largest of idx[0, n) to the front (quickselect on values), unordered. */
static void select_top(int32_t *idx, int32_t n, int32_t k, const float *v) {
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = v[idx[lo + (hi - lo) / 2]];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (v[idx[i]] > pivot) i++;
            while (v[idx[j]] < pivot) j--;
            if (i <= j) {
                int32_t t = idx[i];
                idx[i++] = idx[j];
                idx[j--] = t;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

int32_t epyq_sampler_sample(epyq_sampler *s, const float *logits) {
    const epyq_sample_params *p = &s->p;
    float *w = s->work;
    for (int32_t i = 0; i < s->V; i++) {
        float l = logits[i];
        if (s->seen[i] & 1u && p->repetition_penalty != 1.0f)
            l = l > 0.0f ? l / p->repetition_penalty : l * p->repetition_penalty;
        if (s->seen[i] & 2u) l -= p->presence_penalty;
        if (s->freq) l -= p->frequency_penalty * (float)s->freq[i];
        w[i] = l;
    }
    if (p->temperature <= 0.0f) return epyq_argmax(w, s->V);

    int32_t n = s->V;
    for (int32_t i = 0; i < n; i++) s->idx[i] = i;
    if (p->top_k > 0 && p->top_k < n) {
        select_top(s->idx, n, p->top_k, w);
        n = p->top_k;
    }
    for (int32_t i = 0; i < n; i++) s->c[i] = (cand){w[s->idx[i]], s->idx[i]};
    qsort(s->c, (size_t)n, sizeof(cand), cmp_desc);
    for (int32_t i = 0; i < n; i++) s->idx[i] = s->c[i].id;
    /* probabilities of the candidates (sorted, so the first is the largest) */
    double mx = w[s->idx[0]], sum = 0.0;
    double *pr = malloc((size_t)n * sizeof(double));
    if (!pr) return s->idx[0]; /* no memory for the draw: the most likely token */
    for (int32_t i = 0; i < n; i++) sum += (pr[i] = exp((w[s->idx[i]] - mx) / p->temperature));
    for (int32_t i = 0; i < n; i++) pr[i] /= sum;
    int32_t keep = n;
    if (p->top_p < 1.0f) {
        double c = 0.0;
        for (keep = 0; keep < n;) /* smallest prefix whose mass reaches top_p */
            if ((c += pr[keep++]) >= p->top_p) break;
    }
    if (p->min_p > 0.0f) {
        int32_t k2 = 0;
        while (k2 < keep && pr[k2] >= p->min_p * pr[0]) k2++;
        keep = k2 > 0 ? k2 : 1;
    }
    double mass = 0.0;
    for (int32_t i = 0; i < keep; i++) mass += pr[i];
    double u = uniform(&s->rng) * mass, c = 0.0;
    int32_t pick = s->idx[keep - 1];
    for (int32_t i = 0; i < keep; i++)
        if ((c += pr[i]) > u) {
            pick = s->idx[i];
            break;
        }
    free(pr);
    return pick;
}
