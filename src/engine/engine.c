/* src/engine/engine.c — see engine.h. */
#include "engine/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chat/reasoning.h"
#include "core/util.h"
#include "engine/prefix.h"
#include "model/spec.h"
#include "tok/sbuf.h"

/* A request that wants prompt logprobs has the logits of every prompt token returned; this
 * caps its prompt tokens per step so the logits buffer stays small (64 rows of a 248k vocab
 * are 63 MB). */
#define PROMPT_LP_CHUNK 64

typedef struct {
    uint64_t id;
    int32_t *ids;
    size_t n_ids, fed;
    int32_t max_new, n_gen, last_tok;
    int32_t logprobs;
    bool prompt_lp, ignore_eos, done;
    bool looked;      /* the prefix cache was consulted (or does not apply) */
    bool in_step;     /* this step carries prompt tokens of it */
    int32_t n_cached; /* prompt tokens restored from the cache */
    size_t extra_cp;  /* one more checkpoint a waiting request asked for (0: none) */
    epyq_seq *seq;
    epyq_spec *spec; /* NULL: plain decoding */
    size_t row0;     /* this step: its first row in the batch */
    int32_t nrows;   /* this step: rows of its decode step (1, or k + 1 when verifying) */
    epyq_sampler *smp;
    epyq_tok_stream *ts;
    epyq_engine_cb cb;
    char *stop[EPYQ_ENGINE_MAX_STOP];
    int32_t n_stop;
    epyq_sbuf held; /* decoded text not yet released: it may be the start of a stop string */
    /* images (engine.h: epyq_engine_add_img); all NULL for a text request */
    float *img_rows;        /* [pads][hidden] copied */
    const float **img_embd; /* [n_ids] the row of each pad, NULL elsewhere */
    int32_t *img_pos;       /* [n_ids][3] M-RoPE positions of the prompt */
} req;

struct epyq_engine {
    epyq_model *m;
    const epyq_tok *tok;
    const epyq_config *cfg;
    epyq_engine_opts o;
    req **run;      /* [o.max_seqs] running requests in admission order */
    int32_t n_run;
    uint64_t next_id;
    epyq_engine_stats st;
    epyq_prefix *cache; /* NULL: prefix reuse off */
};

const char *epyq_engine_finish_name(epyq_engine_finish f) {
    switch (f) {
    case EPYQ_ENGINE_STOP: return "stop";
    case EPYQ_ENGINE_LENGTH: return "length";
    case EPYQ_ENGINE_CANCELLED: return "cancelled";
    case EPYQ_ENGINE_ERROR: return "error";
    }
    return "?";
}

epyq_status epyq_engine_create(epyq_engine **out, epyq_model *m, const epyq_tok *tok,
                               const epyq_engine_opts *opts, epyq_err *err) {
    *out = NULL;
    if (opts->max_seqs < 1 || opts->chunk < 1 || opts->ctx_limit < 2)
        return epyq_err_set(err, EPYQ_E_ARG, "engine: max_seqs %d, chunk %d (>= 1) and ctx_limit %d (>= 2) out of range",
                            opts->max_seqs, opts->chunk, opts->ctx_limit);
    if (opts->spec_k < 0 || opts->spec_k >= EPYQ_SPEC_MAX)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "engine: spec_k %d: expected 0 (off) .. %d drafts per step",
                            opts->spec_k, EPYQ_SPEC_MAX - 1);
    if (opts->spec_k && !epyq_model_has_mtp(m))
        return epyq_err_set(err, EPYQ_E_ARG,
                            "--spec mtp: the model was loaded without its MTP head (mtp.*)");
    epyq_engine *e = calloc(1, sizeof *e);
    if (!e) return epyq_err_set(err, EPYQ_E_NOMEM, "engine: out of memory");
    e->run = calloc((size_t)opts->max_seqs, sizeof *e->run);
    if (!e->run) {
        free(e);
        return epyq_err_set(err, EPYQ_E_NOMEM, "engine: out of memory");
    }
    e->m = m, e->tok = tok, e->cfg = epyq_model_config(m), e->o = *opts;
    e->next_id = 1;
    if (opts->cache_bytes > 0) {
        if (e->o.cache_every <= 0) e->o.cache_every = 256;
        epyq_status st = epyq_prefix_create(&e->cache, opts->cache_bytes, err);
        if (st != EPYQ_OK) {
            free(e->run), free(e);
            return st;
        }
    }
    *out = e;
    return EPYQ_OK;
}

static void req_free(req *r) {
    if (!r) return;
    epyq_spec_free(r->spec);
    epyq_seq_free(r->seq);
    epyq_sampler_free(r->smp);
    epyq_tok_stream_free(r->ts);
    free(r->ids);
    free(r->img_rows), free(r->img_embd), free(r->img_pos);
    for (int32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    epyq_sbuf_free(&r->held);
    free(r);
}

void epyq_engine_free(epyq_engine *e) {
    if (!e) return;
    for (int32_t i = 0; i < e->n_run; i++) req_free(e->run[i]);
    epyq_prefix_free(e->cache);
    free(e->run);
    free(e);
}

int32_t epyq_engine_active(const epyq_engine *e) { return e->n_run; }
int32_t epyq_engine_free_slots(const epyq_engine *e) { return e->o.max_seqs - e->n_run; }

void epyq_engine_get_stats(const epyq_engine *e, epyq_engine_stats *st) {
    *st = e->st;
    st->kv_bytes = 0;
    for (int32_t i = 0; i < e->n_run; i++)
        if (e->run[i]->seq) st->kv_bytes += epyq_seq_bytes(e->run[i]->seq);
    if (e->cache) {
        epyq_prefix_stats ps;
        epyq_prefix_get_stats(e->cache, &ps);
        st->cache_bytes = ps.bytes, st->cache_budget = ps.budget;
        st->cache_entries = ps.entries, st->cache_evicted = ps.evicted;
    }
}

/* Copy a request's images, checking that its pads and rows agree. */
static epyq_status img_copy(const epyq_engine *e, req *r, const epyq_engine_img *img,
                            epyq_err *err) {
    const int32_t H = e->cfg->hidden_size;
    if (img->hidden != H)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "image rows have %d values; the model's hidden size is %d", img->hidden,
                            H);
    if (!img->rows || !img->pos || img->n_rows < 1)
        return epyq_err_set(err, EPYQ_E_ARG, "image input: expected rows and positions, found %s",
                            img->rows ? "no positions" : "no rows");
    int32_t pads = 0;
    for (size_t i = 0; i < r->n_ids; i++) pads += r->ids[i] == img->image_token_id;
    if (pads != img->n_rows)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "the prompt has %d image pads (id %d) for %d image rows", pads,
                            img->image_token_id, img->n_rows);
    r->img_rows = malloc((size_t)pads * (size_t)H * sizeof *r->img_rows);
    r->img_embd = calloc(r->n_ids, sizeof *r->img_embd);
    r->img_pos = malloc(r->n_ids * 3 * sizeof *r->img_pos);
    if (!r->img_rows || !r->img_embd || !r->img_pos)
        return epyq_err_set(err, EPYQ_E_NOMEM, "engine: image rows [%d][%d]: out of memory", pads,
                            H);
    memcpy(r->img_rows, img->rows, (size_t)pads * (size_t)H * sizeof *r->img_rows);
    memcpy(r->img_pos, img->pos, r->n_ids * 3 * sizeof *r->img_pos);
    for (size_t i = 0, k = 0; i < r->n_ids; i++)
        if (r->ids[i] == img->image_token_id) r->img_embd[i] = r->img_rows + (k++) * (size_t)H;
    return EPYQ_OK;
}

epyq_status epyq_engine_add(epyq_engine *e, const int32_t *ids, size_t n_ids,
                            const epyq_engine_params *p, const epyq_engine_cb *cb, uint64_t *id,
                            epyq_err *err) {
    return epyq_engine_add_img(e, ids, n_ids, NULL, p, cb, id, err);
}

epyq_status epyq_engine_add_img(epyq_engine *e, const int32_t *ids, size_t n_ids,
                                const epyq_engine_img *img, const epyq_engine_params *p,
                                const epyq_engine_cb *cb, uint64_t *id, epyq_err *err) {
    if (e->n_run >= e->o.max_seqs)
        return epyq_err_set(err, EPYQ_E_ARG, "engine: all %d slots are busy", e->o.max_seqs);
    if (n_ids == 0) return epyq_err_set(err, EPYQ_E_ARG, "the prompt is empty");
    if (n_ids >= (size_t)e->o.ctx_limit)
        return epyq_err_set(err, EPYQ_E_CTX_FULL, "the prompt has %zu tokens; the context limit is %d, leaving no room to generate",
                            n_ids, e->o.ctx_limit);
    if (p->max_tokens < 1 || p->n_stop < 0 || p->n_stop > EPYQ_ENGINE_MAX_STOP || p->logprobs > EPYQ_ENGINE_MAX_TOP)
        return epyq_err_set(err, EPYQ_E_ARG, "engine: max_tokens %d (>= 1), %d stop strings (<= %d), logprobs %d (<= %d)",
                            p->max_tokens, p->n_stop, EPYQ_ENGINE_MAX_STOP, p->logprobs, EPYQ_ENGINE_MAX_TOP);
    req *r = calloc(1, sizeof *r);
    epyq_status st = EPYQ_OK;
    if (!r || !(r->ids = malloc(n_ids * sizeof *r->ids))) {
        free(r);
        return epyq_err_set(err, EPYQ_E_NOMEM, "engine: out of memory");
    }
    memcpy(r->ids, ids, n_ids * sizeof *ids);
    r->n_ids = n_ids;
    r->cb = *cb;
    r->logprobs = p->logprobs;
    r->prompt_lp = p->prompt_logprobs;
    r->ignore_eos = p->ignore_eos;
    r->max_new = p->max_tokens;
    if ((int64_t)n_ids + r->max_new > e->o.ctx_limit) r->max_new = e->o.ctx_limit - (int32_t)n_ids;
    for (int32_t i = 0; i < p->n_stop; i++) {
        if (!p->stop[i] || !*p->stop[i]) continue; /* an empty stop string would match at once */
        if (!(r->stop[r->n_stop] = strdup(p->stop[i]))) st = epyq_err_set(err, EPYQ_E_NOMEM, "engine: out of memory");
        else r->n_stop++;
    }
    if (st == EPYQ_OK && img) st = img_copy(e, r, img, err);
    if (st == EPYQ_OK) st = epyq_seq_create(&r->seq, e->m, (int32_t)n_ids + r->max_new, e->o.kv, err);
    if (st == EPYQ_OK && e->o.spec_k && !r->prompt_lp && !img) {
        const epyq_spec_opts so = {.k = e->o.spec_k,
                                   .adaptive = e->o.spec_adaptive,
                                   .clock = e->o.spec_clock,
                                   .clock_ctx = e->o.spec_clock_ctx,
                                   .draft_override = e->o.spec_draft_override,
                                   .override_ctx = e->o.spec_override_ctx};
        st = epyq_spec_create(&r->spec, e->m, r->seq, &so, err);
    }
    if (st == EPYQ_OK) st = epyq_sampler_create(&r->smp, &p->sp, e->cfg->vocab_size, err);
    if (st == EPYQ_OK && !(r->ts = epyq_tok_stream_new(e->tok, true)))
        st = epyq_err_set(err, EPYQ_E_NOMEM, "engine: out of memory");
    if (st != EPYQ_OK) {
        req_free(r);
        return st;
    }
    for (size_t i = 0; i < n_ids; i++) epyq_sampler_accept(r->smp, ids[i], false);
    r->id = e->next_id++;
    e->run[e->n_run++] = r;
    if (id) *id = r->id;
    return EPYQ_OK;
}

static void emit(req *r, bool prompt, int32_t tok, const char *text, size_t len, const epyq_engine_logprob *lp) {
    epyq_engine_event ev = {prompt, tok, text ? text : "", len, lp};
    if (r->cb.on_event) r->cb.on_event(r->cb.ctx, &ev);
}

/* The request ends: release what is held (unless a stop string cut it), tell the owner, free
 * the model-side state at once; the slot is compacted at the end of the step. */
static void finish(epyq_engine *e, req *r, epyq_engine_finish f, bool flush, const epyq_err *err) {
    if (r->spec) {
        const epyq_spec_stats *ss = epyq_spec_get_stats(r->spec);
        e->st.spec_steps += (uint64_t)ss->steps, e->st.spec_emitted += (uint64_t)ss->emitted;
        e->st.spec_plain += (uint64_t)ss->plain;
        for (int32_t i = 0; i < EPYQ_SPEC_MAX; i++)
            e->st.spec_accepted[i] += (uint64_t)ss->accepted[i];
        epyq_spec_free(r->spec);
        r->spec = NULL;
    }
    if (flush) {
        char *rest = NULL;
        epyq_err e2;
        if (epyq_tok_stream_finish(r->ts, &rest, &e2) == EPYQ_OK && rest) epyq_sbuf_adds(&r->held, rest);
        free(rest);
        if (r->held.len) emit(r, false, -1, r->held.p, r->held.len, NULL);
    }
    epyq_engine_usage u = {(int32_t)r->n_ids, r->n_gen, r->n_cached};
    if (r->cb.on_done) r->cb.on_done(r->cb.ctx, f, &u, err);
    epyq_seq_free(r->seq);
    epyq_sampler_free(r->smp);
    epyq_tok_stream_free(r->ts);
    r->seq = NULL, r->smp = NULL, r->ts = NULL;
    r->done = true;
}

static void compact(epyq_engine *e) {
    int32_t k = 0;
    for (int32_t i = 0; i < e->n_run; i++) {
        if (e->run[i]->done) req_free(e->run[i]);
        else e->run[k++] = e->run[i];
    }
    e->n_run = k;
}

bool epyq_engine_cancel(epyq_engine *e, uint64_t id) {
    for (int32_t i = 0; i < e->n_run; i++)
        if (e->run[i]->id == id && !e->run[i]->done) {
            finish(e, e->run[i], EPYQ_ENGINE_CANCELLED, false, NULL);
            compact(e);
            return true;
        }
    return false;
}

void epyq_engine_logprob_of(const float *logits, int32_t V, int32_t tok, int32_t n_top,
                            epyq_engine_logprob *out) {
    double mx = -INFINITY, sum = 0.0;
    for (int32_t i = 0; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    for (int32_t i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    out->tok = tok;
    out->logprob = (float)((double)logits[tok] - lse);
    if (n_top > EPYQ_ENGINE_MAX_TOP) n_top = EPYQ_ENGINE_MAX_TOP;
    out->n_top = 0;
    /* a small sorted insertion list: one compare per entry once it is full */
    for (int32_t i = 0; i < V && n_top > 0; i++) {
        float v = logits[i];
        int32_t k = out->n_top;
        if (k == n_top && !(v > out->top_lp[k - 1])) continue;
        if (k < n_top) out->n_top++;
        else k--;
        while (k > 0 && v > out->top_lp[k - 1]) {
            out->top_lp[k] = out->top_lp[k - 1], out->top_ids[k] = out->top_ids[k - 1];
            k--;
        }
        out->top_lp[k] = v, out->top_ids[k] = i;
    }
    for (int32_t k = 0; k < out->n_top; k++) out->top_lp[k] = (float)((double)out->top_lp[k] - lse);
}

/* Longest suffix of held text that could still grow into one of the stop strings. */
static size_t stop_partial(const req *r) {
    size_t keep = 0;
    for (int32_t i = 0; i < r->n_stop; i++) {
        size_t k = epyq_tag_partial_suffix(r->held.p, r->held.len, r->stop[i]);
        if (k > keep) keep = k;
    }
    return keep;
}

/* A sampled token: stop rules, text, events. `accepted`: the sampler has it already (a
 * speculative pick). */
static epyq_status take_token(epyq_engine *e, req *r, int32_t tok, const float *row, bool accepted,
                              epyq_err *err) {
    epyq_engine_logprob lp, *lpp = NULL;
    if (r->logprobs >= 0) epyq_engine_logprob_of(row, e->cfg->vocab_size, tok, r->logprobs, lpp = &lp);
    if (!accepted) epyq_sampler_accept(r->smp, tok, true);
    r->n_gen++;
    e->st.gen_tokens++;
    if (!r->ignore_eos && epyq_is_eos(e->cfg, tok)) {
        if (lpp) emit(r, false, tok, "", 0, lpp);
        finish(e, r, EPYQ_ENGINE_STOP, true, NULL);
        return EPYQ_OK;
    }
    char *piece = NULL;
    if (epyq_tok_stream_push(r->ts, tok, &piece, err) != EPYQ_OK) return err->code;
    bool okb = !piece || epyq_sbuf_adds(&r->held, piece);
    free(piece);
    if (!okb) return epyq_err_set(err, EPYQ_E_NOMEM, "engine: out of memory");
    r->last_tok = tok;
    /* The earliest stop string wins; its text and everything after it are dropped. */
    size_t cut = r->held.len;
    for (int32_t i = 0; i < r->n_stop && r->held.len; i++) {
        const char *hit = memmem(r->held.p, r->held.len, r->stop[i], strlen(r->stop[i]));
        if (hit && (size_t)(hit - r->held.p) < cut) cut = (size_t)(hit - r->held.p);
    }
    if (cut < r->held.len) {
        emit(r, false, tok, r->held.p, cut, lpp);
        finish(e, r, EPYQ_ENGINE_STOP, false, NULL);
        return EPYQ_OK;
    }
    size_t keep = stop_partial(r), out = r->held.len - keep;
    emit(r, false, tok, r->held.p, out, lpp);
    memmove(r->held.p, r->held.p + out, keep + 1);
    r->held.len = keep;
    if (r->n_gen >= r->max_new) finish(e, r, EPYQ_ENGINE_LENGTH, true, NULL);
    return EPYQ_OK;
}

/* ---- prefix reuse (engine.h: cache_bytes) */

static bool uses_cache(const epyq_engine *e, const req *r) {
    return e->cache && !r->prompt_lp && !r->img_pos;
}

static size_t common_prefix(const req *a, const req *b) {
    size_t n = a->n_ids < b->n_ids ? a->n_ids : b->n_ids, k = 0;
    while (k < n && a->ids[k] == b->ids[k]) k++;
    return k;
}

/* First step that could carry run[i]'s prompt: restore the longest cached prefix (all but the
 * last prompt token at most) — unless a request admitted before it, still prefilling, is about
 * to produce a longer shared checkpoint; then false: it waits (that one never waits on it, so
 * the oldest prefilling request always moves). Where the shared part ends between two
 * multiples of cache_every (a system prompt, then each request's own text), the earlier
 * request is asked for one extra copy exactly there, so the waiting ones compute only their
 * own text; one such request at a time, and only ahead of where that request stands. */
static bool cache_admit(epyq_engine *e, int32_t i) {
    req *r = e->run[i];
    if (!uses_cache(e, r)) {
        r->looked = true;
        return true;
    }
    int32_t max_len = (int32_t)r->n_ids - 1,
            have = epyq_prefix_longest(e->cache, r->ids, r->n_ids, max_len);
    size_t every = (size_t)e->o.cache_every;
    /* o's sequence position, not o->fed: tokens gathered for this very step are not in its
     * state (nor in a copy) until the forward call ran */
    for (int32_t j = 0; j < i; j++) {
        req *o = e->run[j];
        if (o->done || (size_t)epyq_seq_pos(o->seq) >= o->n_ids || !uses_cache(e, o)) continue;
        size_t l = common_prefix(r, o), target;
        if (l > (size_t)max_len) l = (size_t)max_len;
        /* o's checkpoints inside the shared part: multiples of every, and o's prompt end */
        target = l == o->n_ids ? l : l / every * every;
        size_t at = (size_t)epyq_seq_pos(o->seq);
        if (l > target && l > at && l >= o->fed && l >= every &&
            (o->extra_cp <= at || o->extra_cp == l))
            o->extra_cp = target = l;
        else if (o->extra_cp == l && l > at)
            target = l;
        if (target > (size_t)have && (size_t)epyq_seq_pos(o->seq) < target) return false;
    }
    r->looked = true;
    r->n_cached = epyq_prefix_restore(e->cache, r->ids, r->n_ids, max_len, r->seq);
    r->fed = (size_t)r->n_cached;
    e->st.cached_tokens += (uint64_t)r->n_cached;
    return true;
}

/* After a forward call: copy the state of every request whose prompt now stands at a
 * checkpoint. A copy that cannot be made (no memory) only costs later reuse. */
static void cache_checkpoints(epyq_engine *e) {
    for (int32_t i = 0; i < e->n_run; i++) {
        req *r = e->run[i];
        if (!r->in_step || !uses_cache(e, r)) continue;
        if (r->fed % (size_t)e->o.cache_every && r->fed != r->n_ids && r->fed != r->extra_cp)
            continue;
        epyq_err err;
        (void)epyq_prefix_insert(e->cache, r->ids, r->fed, r->seq, &err);
    }
}

/* A speculative pick: one draw of the request's sampler, which then has the token (spec.h). */
static int32_t spec_pick(void *ctx, const float *logits) {
    req *r = ctx;
    int32_t t = epyq_sampler_sample(r->smp, logits);
    epyq_sampler_accept(r->smp, t, true);
    return t;
}

/* After the forward call: the MTP cache of each speculating request takes the prompt rows of
 * this step whose next token is known (all but a prompt's last row, which waits for the
 * first generated token); before the checkpoints, so copies carry them. A failure ends that
 * request only. */
static void spec_prompt_rows(epyq_engine *e, const float *hid) {
    const int32_t H = e->cfg->hidden_size;
    for (int32_t i = 0; i < e->n_run; i++) {
        req *r = e->run[i];
        if (!r->spec || !r->in_step || r->done) continue;
        size_t start = r->fed - (size_t)r->nrows, n = (size_t)r->nrows - (r->fed == r->n_ids);
        epyq_err err = {0};
        if (epyq_spec_prompt(r->spec, hid + r->row0 * (size_t)H, r->ids + start + 1, (int32_t)n,
                             (int32_t)start, false, &err) != EPYQ_OK)
            finish(e, r, EPYQ_ENGINE_ERROR, false, &err);
    }
}

/* A speculating request's decode rows (row0 .. + nrows): picks, rollback, then each emitted
 * token through the stop rules until one ends it. */
static epyq_status spec_take(epyq_engine *e, req *r, const float *logits, const float *hid,
                             epyq_err *err) {
    const int32_t V = e->cfg->vocab_size, H = e->cfg->hidden_size;
    int32_t out[EPYQ_SPEC_MAX], n = 0;
    epyq_status st =
        epyq_spec_take(r->spec, logits, hid + r->row0 * (size_t)H, spec_pick, r, out, &n, err);
    for (int32_t k = 0; st == EPYQ_OK && k < n && !r->done; k++)
        st = take_token(e, r, out[k], logits + (size_t)k * V, true, err);
    return st;
}

epyq_status epyq_engine_step(epyq_engine *e, epyq_err *err) {
    if (e->n_run == 0) return EPYQ_OK;
    const int32_t rows_per = e->o.spec_k + 1, H = e->cfg->hidden_size;
    size_t cap = (size_t)e->o.chunk + (size_t)e->o.max_seqs * (size_t)rows_per;
    epyq_seq **seqs = malloc(cap * sizeof *seqs);
    int32_t *toks = malloc(cap * sizeof *toks);
    uint8_t *want = calloc(cap, 1);
    req **owner = malloc(cap * sizeof *owner);
    int64_t *pidx = malloc(cap * sizeof *pidx); /* prompt index of the row, -1 for decode */
    /* every row's image row (or NULL) and (t, h, w) rotary positions, passed on only when a
     * request with images is in the step: text rows then get (p + delta) on all three axes,
     * which is what epyq_model_forward gives them without mrope */
    const float **embd = calloc(cap, sizeof *embd);
    int32_t *mrope = malloc(cap * 3 * sizeof *mrope);
    float *logits = NULL, *hid = NULL;
    bool any_spec = false, any_img = false;
    epyq_status st = EPYQ_OK;
    if (!seqs || !toks || !want || !owner || !pidx || !embd || !mrope)
        st = epyq_err_set(err, EPYQ_E_NOMEM, "engine: out of memory");
    size_t n = 0, n_want = 0, n_prompt = 0, budget = (size_t)e->o.chunk;
    for (int32_t i = 0; st == EPYQ_OK && i < e->n_run; i++) {
        req *r = e->run[i];
        r->in_step = false, r->nrows = 0, r->row0 = n;
        if (r->fed < r->n_ids) {
            if (budget == 0) continue; /* its prompt continues next step */
            if (!r->looked && !cache_admit(e, i)) continue; /* waits for an earlier one's copy */
            if (r->fed >= r->n_ids) continue;
            size_t take = r->n_ids - r->fed < budget ? r->n_ids - r->fed : budget;
            if (r->prompt_lp && take > PROMPT_LP_CHUNK) take = PROMPT_LP_CHUNK;
            if (uses_cache(e, r)) { /* end the chunk at the next checkpoint */
                size_t every = (size_t)e->o.cache_every, next = (r->fed / every + 1) * every;
                if (r->extra_cp > r->fed && r->extra_cp < next) next = r->extra_cp;
                if (r->fed + take > next) take = next - r->fed;
            }
            r->in_step = true, r->nrows = (int32_t)take;
            any_spec |= r->spec != NULL;
            any_img |= r->img_pos != NULL;
            int32_t at = epyq_seq_pos(r->seq), delta = epyq_seq_rope_delta(r->seq);
            for (size_t k = 0; k < take; k++) {
                size_t pi = r->fed + k;
                seqs[n] = r->seq, toks[n] = r->ids[pi], owner[n] = r, pidx[n] = (int64_t)pi;
                if (r->img_pos) { /* the chunk's slice of the image rows and positions */
                    embd[n] = r->img_embd[pi];
                    memcpy(mrope + 3 * n, r->img_pos + 3 * pi, 3 * sizeof *mrope);
                } else {
                    embd[n] = NULL;
                    for (int a = 0; a < 3; a++) mrope[3 * n + a] = at + (int32_t)k + delta;
                }
                want[n] = r->prompt_lp, n_want += r->prompt_lp, n++;
            }
            r->fed += take;
            budget -= take;
            n_prompt += take;
            if (r->fed == r->n_ids && !want[n - 1]) want[n - 1] = 1, n_want++;
        } else if (r->spec) {
            int32_t rows[EPYQ_SPEC_MAX], nr = 0;
            epyq_err e2 = {0};
            if (epyq_spec_rows(r->spec, rows, &nr, &e2) !=
                EPYQ_OK) { /* this request cannot go on */
                finish(e, r, EPYQ_ENGINE_ERROR, false, &e2);
                continue;
            }
            r->nrows = nr, any_spec = true;
            int32_t at = epyq_seq_pos(r->seq) + epyq_seq_rope_delta(r->seq);
            for (int32_t k = 0; k < nr; k++) {
                embd[n] = NULL;
                for (int a = 0; a < 3; a++) mrope[3 * n + a] = at + k;
                seqs[n] = r->seq, toks[n] = rows[k], owner[n] = r, pidx[n] = -1, want[n] = 1, n++,
                n_want++;
            }
        } else {
            /* after an image the sequence's rope delta carries its text positions on */
            embd[n] = NULL;
            for (int a = 0; a < 3; a++)
                mrope[3 * n + a] = epyq_seq_pos(r->seq) + epyq_seq_rope_delta(r->seq);
            any_img |= r->img_pos != NULL;
            seqs[n] = r->seq, toks[n] = r->last_tok, owner[n] = r, pidx[n] = -1, want[n] = 1, n++, n_want++;
            r->nrows = 1;
        }
    }
    int32_t V = e->cfg->vocab_size;
    if (st == EPYQ_OK && n > 0) {
        logits = malloc(n_want * (size_t)V * sizeof(float));
        if (!logits) st = epyq_err_set(err, EPYQ_E_NOMEM, "logits [%zu][%d]: out of memory", n_want, V);
        if (st == EPYQ_OK && any_spec && !(hid = malloc(n * (size_t)H * sizeof(float))))
            st = epyq_err_set(err, EPYQ_E_NOMEM, "hidden states [%zu][%d]: out of memory", n, H);
    }
    if (st == EPYQ_OK && n > 0) {
        epyq_batch bt = {(int32_t)n, seqs, toks, want};
        double t0 = epyq_now();
        const epyq_batch_img bi = {embd, mrope};
        st = epyq_model_forward_img(e->m, &bt, any_img ? &bi : NULL, logits, hid, err);
        double dt = epyq_now() - t0;
        e->st.prompt_s += dt * (double)n_prompt / (double)n;
        e->st.decode_s += dt * (double)(n - n_prompt) / (double)n;
        e->st.prompt_tokens += n_prompt;
        e->st.steps++;
        if (st == EPYQ_OK && any_spec) spec_prompt_rows(e, hid);
        if (st == EPYQ_OK) cache_checkpoints(e);
    }
    if (st != EPYQ_OK) {
        /* the forward call changed nothing; every request it carried cannot go on */
        for (int32_t i = 0; i < e->n_run; i++)
            if (!e->run[i]->done) finish(e, e->run[i], EPYQ_ENGINE_ERROR, false, err);
    }
    for (size_t i = 0, w = 0; st == EPYQ_OK && i < n; i++) {
        if (!want[i]) continue;
        req *r = owner[i];
        const float *row = logits + (w++) * (size_t)V;
        if (r->done) continue;
        if (pidx[i] >= 0 && (size_t)pidx[i] + 1 < r->n_ids) { /* this row predicts the next prompt token */
            epyq_engine_logprob lp;
            int32_t next = r->ids[pidx[i] + 1];
            epyq_engine_logprob_of(row, V, next, r->logprobs > 0 ? r->logprobs : 0, &lp);
            emit(r, true, next, "", 0, &lp);
            continue;
        }
        if (r->spec && pidx[i] < 0) { /* its decode rows are this one and the next nrows - 1 */
            epyq_err e2 = {0};
            if (i == r->row0 && spec_take(e, r, row, hid, &e2) != EPYQ_OK && !r->done)
                finish(e, r, EPYQ_ENGINE_ERROR, false, &e2); /* that request only */
            continue;
        }
        int32_t tok = epyq_sampler_sample(r->smp, row);
        st = take_token(e, r, tok, row, false, err);
        if (st == EPYQ_OK && r->spec &&
            !r->done) { /* the prompt's last row: the first token seeds the drafts */
            epyq_err e2 = {0};
            if (epyq_spec_prompt(r->spec, hid + (size_t)i * H, &tok, 1, (int32_t)pidx[i], true,
                                 &e2) != EPYQ_OK)
                finish(e, r, EPYQ_ENGINE_ERROR, false, &e2);
            continue;
        }
        if (st != EPYQ_OK) finish(e, r, EPYQ_ENGINE_ERROR, false, err);
    }
    compact(e);
    free(seqs), free(toks), free(want), free(owner), free(pidx), free(logits), free(hid);
    free(embd), free(mrope);
    return st;
}
