/* tests/e2e/conform.h — conformance metrics against the ../shared/fixtures/models expected files
 * (header-only, shared by the forward-pass tests).
 *
 * Metrics follow the fixture README's tolerance guidance: max |Δlogit| against
 * 1e-3·max|expected logit| for fp32-or-wider math; per-row KL(P_expected ‖ P_got) (mean < 1e-3,
 * max < 1e-2 nats) and top-1 agreement on rows whose expected top1-top2 margin is > 0.05 for
 * bf16 / int8 activations. */
#ifndef EPYQ_TEST_CONFORM_H
#define EPYQ_TEST_CONFORM_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "tests/testutil.h"

typedef struct {
    double max_abs;     /* max |expected - got| over all logits */
    double max_logit;   /* max |expected| */
    double kl_mean, kl_max;
    int top1_ok, top1_n; /* rows with margin > 0.05: how many agree on the argmax */
    double flip_margin;  /* largest expected margin among rows whose argmax differs */
    int rows;
} conform_stats;

/* A float32 LE file of exactly n floats, or NULL. */
static inline float *conform_read_f32_file(const char *path, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    float *v = malloc(n * sizeof(float));
    size_t got = v ? fread(v, sizeof(float), n, f) : 0;
    int extra = fgetc(f);
    fclose(f);
    if (got != n || extra != EOF) {
        free(v);
        return NULL;
    }
    return v;
}

/* The same for expected/<name> of a fixture folder. */
static inline float *conform_read_f32(const char *dir, const char *name, size_t n) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/expected/%s", dir, name) >= (int)sizeof path) return NULL;
    return conform_read_f32_file(path, n);
}

/* The int array `key` of expected/<name> (e.g. prompt.json "ids"); returns count or -1. */
static inline int conform_read_ids(const char *dir, const char *name, const char *key, int *out,
                                   int max) {
    char path[4096], *text = NULL;
    size_t len;
    if (snprintf(path, sizeof path, "%s/expected/%s", dir, name) >= (int)sizeof path) return -1;
    if (epyq_file_read(path, 1u << 24, &text, &len, NULL) != EPYQ_OK) return -1;
    cJSON *j = cJSON_Parse(text);
    free(text);
    cJSON *a = j ? cJSON_GetObjectItemCaseSensitive(j, key) : NULL;
    int n = -1;
    if (cJSON_IsArray(a)) {
        n = 0;
        cJSON *it;
        cJSON_ArrayForEach(it, a) {
            if (n < max && cJSON_IsNumber(it)) out[n++] = it->valueint;
        }
    }
    cJSON_Delete(j);
    return n;
}

/* mtp.json draft ids (steps[i].draft_id); returns count or -1. */
static inline int conform_read_drafts(const char *dir, int *out, int max) {
    char path[4096], *text = NULL;
    size_t len;
    if (snprintf(path, sizeof path, "%s/expected/mtp.json", dir) >= (int)sizeof path) return -1;
    if (epyq_file_read(path, 1u << 24, &text, &len, NULL) != EPYQ_OK) return -1;
    cJSON *j = cJSON_Parse(text);
    free(text);
    cJSON *a = j ? cJSON_GetObjectItemCaseSensitive(j, "steps") : NULL;
    int n = -1;
    if (cJSON_IsArray(a)) {
        n = 0;
        cJSON *it;
        cJSON_ArrayForEach(it, a) {
            cJSON *d = cJSON_GetObjectItemCaseSensitive(it, "draft_id");
            if (n < max && cJSON_IsNumber(d)) out[n++] = d->valueint;
        }
    }
    cJSON_Delete(j);
    return n;
}

static inline int conform_argmax_f(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* top1 - top2 of one row */
static inline double conform_margin(const float *v, int n) {
    int b = conform_argmax_f(v, n);
    double second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && v[i] > second) second = v[i];
    return v[b] - second;
}

/* KL(softmax(e) ‖ softmax(g)) in nats, in double. */
static inline double conform_kl(const float *e, const float *g, int n) {
    double me = -INFINITY, mg = -INFINITY, se = 0, sg = 0;
    for (int i = 0; i < n; i++) {
        me = e[i] > me ? e[i] : me;
        mg = g[i] > mg ? g[i] : mg;
    }
    for (int i = 0; i < n; i++) {
        se += exp(e[i] - me);
        sg += exp(g[i] - mg);
    }
    double lse_e = me + log(se), lse_g = mg + log(sg), kl = 0;
    for (int i = 0; i < n; i++) {
        double lpe = e[i] - lse_e, lpg = g[i] - lse_g;
        kl += exp(lpe) * (lpe - lpg);
    }
    return kl;
}

/* Accumulate rows [rows][n] of expected e vs got g into s (call conform_init first). */
static inline void conform_init(conform_stats *s) {
    memset(s, 0, sizeof *s);
}
static inline void conform_add(conform_stats *s, const float *e, const float *g, int rows, int n) {
    for (int r = 0; r < rows; r++) {
        const float *er = e + (size_t)r * n, *gr = g + (size_t)r * n;
        for (int i = 0; i < n; i++) {
            double d = fabs((double)er[i] - gr[i]);
            s->max_abs = d > s->max_abs ? d : s->max_abs;
            s->max_logit = fabs(er[i]) > s->max_logit ? fabs(er[i]) : s->max_logit;
        }
        double kl = conform_kl(er, gr, n);
        s->kl_mean = (s->kl_mean * s->rows + kl) / (s->rows + 1);
        s->kl_max = kl > s->kl_max ? kl : s->kl_max;
        s->rows++;
        double mg = conform_margin(er, n);
        bool same = conform_argmax_f(er, n) == conform_argmax_f(gr, n);
        if (!same && mg > s->flip_margin) s->flip_margin = mg;
        if (mg > 0.05) {
            s->top1_n++;
            s->top1_ok += same;
        }
    }
}

static inline void conform_print(const char *label, const conform_stats *s) {
    printf("%-28s rows %3d  max|dlogit| %.3e (tol %.3e)  KL mean %.2e max %.2e  top1 %d/%d", label,
           s->rows, s->max_abs, 1e-3 * s->max_logit, s->kl_mean, s->kl_max, s->top1_ok, s->top1_n);
    if (s->flip_margin > 0) printf("  (argmax differs at a margin of %.3f)", s->flip_margin);
    printf("\n");
}

/* The fixture folder ../shared/fixtures/models/<name> copied into dir[size]: false, after a
 * skip line, when it is absent (the caller returns; main() counts the SKIP). */
static inline bool conform_fixture_dir(const char *name, char *dir, size_t size) {
    char sub[256];
    snprintf(sub, sizeof sub, "fixtures/models/%s", name);
    const char *p = epyq_test_shared(sub);
    if (!p) {
        printf("skip %s: ../shared not present\n", name);
        return false;
    }
    return snprintf(dir, size, "%s", p) < (int)size;
}

/* What a fixture folder expects of a model with V logits per row: the prompt, the greedy ids
 * of teacher-forced decoding, the two MTP drafts, and the logits of each (malloc'd). */
typedef struct {
    int prompt[64], greedy[64], drafts[8];
    int n, ng, nd;
    float *pre, *dec, *mtp; /* [n][V], [ng][V], [nd][V] */
} conform_expect;

/* false when a file is missing or of the wrong size (nothing is left allocated then). */
static inline bool conform_expect_read(const char *dir, int V, conform_expect *e) {
    e->n = conform_read_ids(dir, "prompt.json", "ids", e->prompt, 64);
    e->ng = conform_read_ids(dir, "greedy.json", "ids", e->greedy, 64);
    e->nd = conform_read_drafts(dir, e->drafts, 8);
    e->pre = e->dec = e->mtp = NULL;
    if (e->n <= 1 || e->ng <= 1 || e->nd != 2) return false;
    e->pre = conform_read_f32(dir, "logits_prefill.f32", (size_t)e->n * V);
    e->dec = conform_read_f32(dir, "logits_decode.f32", (size_t)e->ng * V);
    e->mtp = conform_read_f32(dir, "mtp_logits.f32", (size_t)e->nd * V);
    if (e->pre && e->dec && e->mtp) return true;
    free(e->pre), free(e->dec), free(e->mtp);
    return false;
}

#endif
