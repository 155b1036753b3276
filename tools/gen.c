/* tools/gen.c — see gen.h. */
#include "tools/gen.h"

#include "model/spec.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "engine/prefix.h"

const char *epyq_finish_name(epyq_finish f) {
    switch (f) {
    case EPYQ_FINISH_STOP: return "stop";
    case EPYQ_FINISH_LENGTH: return "length";
    case EPYQ_FINISH_CTX: return "context";
    case EPYQ_FINISH_CANCEL: return "cancelled";
    }
    return "?";
}

void epyq_sample_overrides_apply(const epyq_sample_overrides *o, const epyq_config *cfg,
                                 epyq_sample_params *sp) {
    epyq_sample_defaults(sp, cfg);
    if (o->temperature >= 0) sp->temperature = (float)o->temperature;
    if (o->top_k >= 0) sp->top_k = (int32_t)o->top_k;
    if (o->top_p >= 0) sp->top_p = (float)o->top_p;
    if (o->min_p >= 0) sp->min_p = (float)o->min_p;
    if (o->repetition_penalty >= 0) sp->repetition_penalty = (float)o->repetition_penalty;
    if (o->presence_penalty >= 0) sp->presence_penalty = (float)o->presence_penalty;
    sp->seed = o->seed;
}

epyq_status epyq_gen_init(epyq_gen *g, epyq_model *m, const epyq_tok *t, int32_t n_ctx, epyq_kv_type kv,
                          const epyq_sample_params *sp, epyq_err *err) {
    memset(g, 0, sizeof *g);
    g->model = m;
    g->tok = t;
    g->sp = *sp;
    g->chunk = 256;
    return epyq_seq_create(&g->seq, m, n_ctx, kv, err);
}

void epyq_gen_free(epyq_gen *g) {
    epyq_seq_free(g->seq);
    g->seq = NULL;
}

/* Forward n tokens of the sequence; logits of the last one into `logits`. img: the tokens are
 * prompt tokens [img_off, img_off + n), which g->img (when set) describes. */
static epyq_status feed(epyq_gen *g, const int32_t *ids, int32_t n, size_t img_off, bool img,
                        float *logits, epyq_err *err) {
    epyq_seq **seqs = malloc((size_t)n * sizeof *seqs);
    uint8_t *want = calloc((size_t)n, 1);
    if (!seqs || !want) {
        free(seqs), free(want);
        return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i < n; i++) seqs[i] = g->seq;
    want[n - 1] = 1;
    epyq_batch b = {n, seqs, ids, want};
    epyq_batch_img bi = {0};
    if (img && g->img)
        bi = (epyq_batch_img){g->img->embd ? g->img->embd + img_off : NULL,
                              g->img->mrope ? g->img->mrope + 3 * img_off : NULL};
    epyq_status st =
        epyq_model_forward_img(g->model, &b, img && g->img ? &bi : NULL, logits, NULL, err);
    free(seqs), free(want);
    return st;
}

typedef struct {
    epyq_sampler *smp;
} spec_pick_ctx;

/* The sampler picks every emitted token in order (spec.h: a sampled pick that reproduces the
 * draft accepts it, so sampling stays exact) and records it for the penalties. */
static int32_t spec_pick(void *ctx, const float *logits) {
    spec_pick_ctx *c = ctx;
    int32_t t = epyq_sampler_sample(c->smp, logits);
    epyq_sampler_accept(c->smp, t, true);
    return t;
}

/* Emit one generated token: ids, stats, eos and streamed text. false = stop here. */
static bool emit(epyq_gen *g, epyq_tok_stream *ts, int32_t tok, int32_t k, int32_t *gen_ids, epyq_gen_stats *stats,
                 void (*on_text)(void *ctx, const char *text, size_t len), void *ctx, epyq_status *st, epyq_err *err) {
    if (gen_ids) gen_ids[k] = tok;
    stats->n_gen++;
    if (epyq_is_eos(epyq_model_config(g->model), tok)) {
        stats->finish = EPYQ_FINISH_STOP;
        return false;
    }
    char *piece = NULL;
    *st = epyq_tok_stream_push(ts, tok, &piece, err);
    if (*st == EPYQ_OK && piece && *piece && on_text) on_text(ctx, piece, strlen(piece));
    free(piece);
    return *st == EPYQ_OK;
}

/* The speculative loop: prefill + MTP prime, then steps of 1 .. k + 1 tokens. */
static epyq_status gen_spec(epyq_gen *g, const int32_t *ids, size_t n_ids, int32_t max_new,
                            volatile sig_atomic_t *cancel, epyq_sampler *smp, epyq_tok_stream *ts,
                            void (*on_text)(void *ctx, const char *text, size_t len), void *ctx, int32_t *gen_ids,
                            epyq_gen_stats *stats, epyq_err *err) {
    epyq_spec *sp = NULL;
    epyq_spec_opts so = {
        .k = g->spec_k, .adaptive = true, .clock = g->clock, .clock_ctx = g->clock_ctx};
    spec_pick_ctx pc = {smp};
    int32_t first, out[EPYQ_SPEC_MAX];
    epyq_status st = epyq_spec_create(&sp, g->model, g->seq, &so, err);
    double t0 = epyq_now();
    if (st == EPYQ_OK) st = epyq_spec_prefill(sp, ids, (int32_t)n_ids, spec_pick, &pc, &first, err);
    stats->t_prompt = epyq_now() - t0;
    stats->t_first = stats->t_prompt;
    t0 = epyq_now();
    int32_t k = 0;
    bool go = st == EPYQ_OK && max_new > 0 && emit(g, ts, first, k++, gen_ids, stats, on_text, ctx, &st, err);
    while (go && k < max_new) {
        if (cancel && *cancel) {
            stats->finish = EPYQ_FINISH_CANCEL;
            break;
        }
        int32_t got = 0;
        st = epyq_spec_step(sp, spec_pick, &pc, out, &got, err);
        if (st == EPYQ_E_CTX_FULL) { /* no room for k + 1 more positions: the context ends here */
            st = EPYQ_OK;
            stats->finish = EPYQ_FINISH_CTX;
            break;
        }
        for (int32_t i = 0; st == EPYQ_OK && go && i < got && k < max_new; i++)
            go = emit(g, ts, out[i], k++, gen_ids, stats, on_text, ctx, &st, err);
        if (st != EPYQ_OK) go = false;
    }
    stats->t_gen = epyq_now() - t0;
    if (sp) {
        const epyq_spec_stats *ss = epyq_spec_get_stats(sp);
        stats->spec_steps = ss->steps, stats->spec_emitted = ss->emitted;
        for (int i = 0; i < 8 && i < EPYQ_SPEC_MAX; i++) stats->spec_accepted[i] = ss->accepted[i];
    }
    epyq_spec_free(sp);
    return st;
}

epyq_status epyq_gen_generate(epyq_gen *g, const int32_t *ids, size_t n_ids, int32_t max_new,
                              volatile sig_atomic_t *cancel,
                              void (*on_text)(void *ctx, const char *text, size_t len), void *ctx,
                              int32_t *gen_ids, epyq_gen_stats *stats, epyq_err *err) {
    return epyq_gen_generate_from(g, ids, n_ids, 0, max_new, cancel, on_text, ctx, gen_ids, stats,
                                  err);
}

/* Next position at or after which the prefill stops to copy the state: a multiple of
 * cache_every or a mark, whichever comes first after `at` (n when none comes before it). */
static size_t next_checkpoint(const epyq_gen *g, size_t at, size_t n) {
    size_t every = (size_t)g->cache_every, next = (at / every + 1) * every;
    for (int32_t i = 0; i < g->n_marks; i++)
        if ((size_t)g->marks[i] > at && (size_t)g->marks[i] < next) next = (size_t)g->marks[i];
    return next < n ? next : n;
}

static bool is_checkpoint(const epyq_gen *g, size_t p) {
    for (int32_t i = 0; i < g->n_marks; i++)
        if ((size_t)g->marks[i] == p) return true;
    return p % (size_t)g->cache_every == 0;
}

epyq_status epyq_gen_generate_from(epyq_gen *g, const int32_t *all, size_t n_all, size_t from,
                                   int32_t max_new, volatile sig_atomic_t *cancel,
                                   void (*on_text)(void *ctx, const char *text, size_t len),
                                   void *ctx, int32_t *gen_ids, epyq_gen_stats *stats,
                                   epyq_err *err) {
    const epyq_config *cfg = epyq_model_config(g->model);
    int32_t V = cfg->vocab_size;
    double t_call = epyq_now();
    memset(stats, 0, sizeof *stats);
    if (from >= n_all) return epyq_err_set(err, EPYQ_E_ARG, "empty prompt");
    const int32_t *ids = all + from;
    size_t n_ids = n_all - from;
    int32_t pos = epyq_seq_pos(g->seq), ctx_len = epyq_seq_ctx(g->seq);
    if ((int64_t)pos + (int64_t)n_ids > ctx_len)
        return epyq_err_set(err, EPYQ_E_CTX_FULL,
                            "prompt of %zu tokens does not fit: %d of %d context positions are used",
                            n_ids, pos, ctx_len);
    /* copies are keyed by the ids from position 0, so only a sequence standing at `from` */
    bool checkpoints = g->cache && g->cache_every > 0 && !g->spec_k && (size_t)pos == from && !g->img;
    float *logits = malloc((size_t)V * sizeof(float));
    epyq_sampler *smp = NULL;
    epyq_tok_stream *ts = epyq_tok_stream_new(g->tok, true);
    epyq_status st = EPYQ_OK;
    if (!logits || !ts) st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    if (st == EPYQ_OK) st = epyq_sampler_create(&smp, &g->sp, V, err);
    for (size_t i = 0; st == EPYQ_OK && i < n_all; i++) epyq_sampler_accept(smp, all[i], false);
    stats->n_prompt = (int32_t)n_ids;
    stats->n_cached = (int32_t)from;
    stats->finish = EPYQ_FINISH_LENGTH;
    if (st == EPYQ_OK && g->spec_k > 0 && g->img)
        st =
            epyq_err_set(err, EPYQ_E_ARG, "speculative decoding (--spec) does not take images yet");
    if (st == EPYQ_OK && g->spec_k > 0) {
        st = gen_spec(g, ids, n_ids, max_new, cancel, smp, ts, on_text, ctx, gen_ids, stats, err);
        goto finish;
    }

    double t0 = epyq_now();
    /* a long prompt takes minutes on a CPU: on a terminal, a line with tokens done and time left */
    bool show = n_ids > (size_t)g->chunk && isatty(STDERR_FILENO);
    for (size_t i = 0, n; st == EPYQ_OK && i < n_ids; i += n) {
        n = n_ids - i < (size_t)g->chunk ? n_ids - i : (size_t)g->chunk;
        size_t at = from + i;
        if (checkpoints && next_checkpoint(g, at, n_all) - at < n)
            n = next_checkpoint(g, at, n_all) - at;
        st = feed(g, ids + i, (int32_t)n, from + i, true, logits, err);
        /* a copy that cannot be made (no memory) only costs later reuse */
        if (st == EPYQ_OK && checkpoints && is_checkpoint(g, at + n)) {
            epyq_err e2;
            (void)epyq_prefix_insert(g->cache, all, from + i + n, g->seq, &e2);
        }
        if (show) {
            double dt = epyq_now() - t0, done = (double)(i + n), rate = dt > 0 ? done / dt : 0;
            fprintf(stderr, "\r\033[Kprompt: %zu / %zu tokens, %.1f t/s, ~%.0f s left", i + n,
                    n_ids, rate, rate > 0 ? ((double)n_ids - done) / rate : 0.0);
        }
        if (cancel && *cancel) break;
    }
    if (show) fputs("\r\033[K", stderr);
    stats->n_prompt = (int32_t)n_ids;
    stats->t_prompt = epyq_now() - t0;
    stats->finish = EPYQ_FINISH_LENGTH;
    t0 = epyq_now();
    for (int32_t k = 0; st == EPYQ_OK && k < max_new; k++) {
        if (cancel && *cancel) {
            stats->finish = EPYQ_FINISH_CANCEL;
            break;
        }
        int32_t tok = epyq_sampler_sample(smp, logits);
        epyq_sampler_accept(smp, tok, true);
        if (k == 0) stats->t_first = epyq_now() - t_call;
        if (!emit(g, ts, tok, k, gen_ids, stats, on_text, ctx, &st, err)) break;
        if (epyq_seq_pos(g->seq) >= ctx_len) {
            stats->finish = EPYQ_FINISH_CTX;
            break;
        }
        if (k + 1 < max_new) st = feed(g, &tok, 1, 0, false, logits, err);
    }
    stats->t_gen = epyq_now() - t0;
finish:
    if (st == EPYQ_OK) {
        char *rest = NULL;
        st = epyq_tok_stream_finish(ts, &rest, err);
        if (st == EPYQ_OK && rest && *rest && on_text) on_text(ctx, rest, strlen(rest));
        free(rest);
    }
    epyq_tok_stream_free(ts);
    epyq_sampler_free(smp);
    free(logits);
    return st;
}
