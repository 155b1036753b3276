/* src/model/spec.c — MTP speculative decoding of one sequence (spec.h).
 *
 * The step, with P the position of `next` (the last picked token, not yet fed):
 *   drafts  d1 comes from the previous step's MTP pass (row: hidden at P - 1, token next);
 *           d_i (i >= 2) from one MTP row (the previous row's output hidden, d_{i-1}, P + i - 2);
 *   verify  the trunk runs [next, d1 .. dk] at P .. P + k with state snapshots;
 *   accept  out[i] = pick(logits of position P + i) while it reproduces d_{i+1};
 *   rollback  DeltaNet states back to after the last kept token (keep = tokens emitted);
 *   MTP pass  rows (trunk hidden at P + r, out[r], P + r) for r < keep refill the MTP cache
 *           with the kept positions and give d1 of the next step.
 * Drafts are the MTP logits' argmax (as vLLM drafts); only the picks decide the output. */
#include "model/spec.h"

#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/model_impl.h"
#include "model/sample.h"

struct epyq_spec {
    epyq_model *m;
    epyq_seq *s;
    epyq_spec_opts o;
    int32_t V, H;
    int32_t Vd;                   /* drafts pick among ids [0, Vd) (epyq_model_draft_vocab) */
    int32_t next;                 /* picked, not yet fed: the token at position s->pos */
    int32_t d[EPYQ_SPEC_MAX];     /* d[0] = d1, ready from the last MTP pass */
    float *logits;                /* [k + 1][V] verification logits */
    float *hid;                   /* [max(k + 1, prompt)][H] trunk hiddens */
    int32_t hid_rows;
    float *dlog;                  /* [V] draft logits */
    float *dh;                    /* [H] MTP output hidden of the last draft row */
    epyq_spec_stats st;
    /* adaptive (spec.h): the mode, its window, and the plain stretch's MTP rows to catch up */
    bool plain;
    int32_t left;                 /* steps (spec probe) or tokens (plain stretch) left in the window */
    int32_t hold;                 /* length of the next plain stretch */
    double w_time;                /* seconds and tokens of the current window */
    int64_t w_tok;
    double cost_spec, cost_plain; /* seconds per emitted token last measured; 0 = not yet */
    float *ph;                    /* [pcap][H] plain stretch: trunk hiddens ... */
    int32_t *ptok, pn, pcap, ppos0; /* ... the tokens after them, count, capacity, first position */
    /* the step between epyq_spec_rows and epyq_spec_take */
    int32_t n_rows; /* 0: none pending; 1: a plain step; k + 1: a verification */
    int32_t P;      /* its first position */
    double t_rule0; /* the adaptive rule's clock at its start */
};

enum { PROBE_STEPS = 8, EARLY = 2, HOLD_MIN = 64, HOLD_MAX = 4096 };

epyq_status epyq_spec_create(epyq_spec **out, epyq_model *m, epyq_seq *s, const epyq_spec_opts *o,
                             epyq_err *err) {
    *out = NULL;
    if (!epyq_model_has_mtp(m))
        return epyq_err_set(err, EPYQ_E_ARG, "--spec mtp: the model was loaded without its MTP head (mtp.*)");
    if (o->k < 1 || o->k >= EPYQ_SPEC_MAX)
        return epyq_err_set(err, EPYQ_E_ARG, "--draft %d: expected 1 .. %d drafts per step", o->k, EPYQ_SPEC_MAX - 1);
    epyq_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return epyq_err_set(err, EPYQ_E_NOMEM, "speculative decoding: out of memory");
    sp->m = m, sp->s = s, sp->o = *o;
    sp->left = PROBE_STEPS, sp->hold = HOLD_MIN;
    sp->V = m->d.V, sp->H = m->d.H, sp->Vd = epyq_model_draft_vocab(m);
    sp->logits = malloc((size_t)(o->k + 1) * sp->V * sizeof(float));
    sp->dlog = malloc((size_t)sp->V * sizeof(float));
    sp->dh = malloc((size_t)sp->H * sizeof(float));
    if (!sp->logits || !sp->dlog || !sp->dh) {
        epyq_spec_free(sp);
        return epyq_err_set(err, EPYQ_E_NOMEM, "speculative decoding: out of memory");
    }
    *out = sp;
    return EPYQ_OK;
}

void epyq_spec_free(epyq_spec *sp) {
    if (!sp) return;
    free(sp->logits), free(sp->hid), free(sp->dlog), free(sp->dh), free(sp->ph), free(sp->ptok);
    free(sp);
}

const epyq_spec_stats *epyq_spec_get_stats(const epyq_spec *sp) { return &sp->st; }

static epyq_status hid_reserve(epyq_spec *sp, int32_t rows, epyq_err *err) {
    if (rows <= sp->hid_rows) return EPYQ_OK;
    float *h = realloc(sp->hid, (size_t)rows * sp->H * sizeof(float));
    if (!h) return epyq_err_set(err, EPYQ_E_NOMEM, "speculative decoding: hidden states of %d rows", rows);
    sp->hid = h, sp->hid_rows = rows;
    return EPYQ_OK;
}

/* MTP rows r < n: (h[r], tok[r], pos0 + r); with `draft`, d1 and its output hidden from the
 * last row (without, the rows only fill the MTP cache: no head is read). */
static epyq_status mtp_pass(epyq_spec *sp, const float *h, const int32_t *tok, int32_t n,
                            int32_t pos0, bool draft, epyq_err *err) {
    if (n < 1) return EPYQ_OK;
    int32_t *pos = calloc((size_t)n, sizeof *pos); /* calloc: gcc 12 cannot see the loop fill it */
    float *ho = draft ? malloc((size_t)n * sp->H * sizeof(float)) : NULL;
    if (!pos || (draft && !ho)) {
        free(pos), free(ho);
        return epyq_err_set(err, EPYQ_E_NOMEM, "MTP pass of %d rows: out of memory", n);
    }
    for (int32_t r = 0; r < n; r++) pos[r] = pos0 + r;
    epyq_status st =
        epyq_mtp_run(sp->m, sp->s, n, h, tok, pos, draft ? 1 : 0, sp->dlog, ho, true, err);
    if (st == EPYQ_OK && draft) {
        sp->d[0] = epyq_argmax(sp->dlog, sp->Vd);
        memcpy(sp->dh, ho + (size_t)(n - 1) * sp->H, (size_t)sp->H * sizeof(float));
    }
    free(pos), free(ho);
    return st;
}

epyq_status epyq_spec_prefill(epyq_spec *sp, const int32_t *prompt, int32_t n, epyq_spec_pick_fn pick,
                              void *ctx, int32_t *first, epyq_err *err) {
    if (n < 1) return epyq_err_set(err, EPYQ_E_ARG, "speculative decoding: empty prompt");
    epyq_status st = hid_reserve(sp, n > sp->o.k + 1 ? n : sp->o.k + 1, err);
    epyq_seq **seqs = malloc((size_t)n * sizeof *seqs);
    uint8_t *want = calloc((size_t)n, 1);
    int32_t *tok = malloc((size_t)n * sizeof *tok);
    if (st == EPYQ_OK && (!seqs || !want || !tok))
        st = epyq_err_set(err, EPYQ_E_NOMEM, "prompt of %d tokens: out of memory", n);
    if (st == EPYQ_OK) {
        for (int32_t i = 0; i < n; i++) seqs[i] = sp->s;
        want[n - 1] = 1;
        int32_t pos0 = epyq_seq_pos(sp->s);
        double t0 = epyq_now();
        /* in chunks, as a plain prefill would run (activations stay bounded); every row's
         * hidden is kept for the MTP pass */
        enum { CHUNK = 256 };
        for (int32_t i = 0; st == EPYQ_OK && i < n; i += CHUNK) {
            int32_t c = n - i < CHUNK ? n - i : CHUNK;
            epyq_batch b = {c, seqs, prompt + i, want + i};
            st = epyq_model_forward(sp->m, &b, sp->logits, sp->hid + (size_t)i * sp->H, err);
        }
        sp->st.t_verify += epyq_now() - t0;
        if (st == EPYQ_OK) {
            *first = pick(ctx, sp->logits);
            /* MTP row r: (hidden at r, token at r + 1, position r) */
            memcpy(tok, prompt + 1, (size_t)(n - 1) * sizeof *tok);
            tok[n - 1] = *first;
            st = epyq_spec_prompt(sp, sp->hid, tok, n, pos0, true, err);
        }
    }
    free(seqs), free(want), free(tok);
    return st;
}

/* Back to drafting: the MTP cache catches up on the plain stretch (rows in chunks). */
static epyq_status catch_up(epyq_spec *sp, epyq_err *err) {
    enum { ROWS = 256 };
    epyq_status st = EPYQ_OK;
    double t0 = epyq_now();
    for (int32_t i = 0; st == EPYQ_OK && i < sp->pn; i += ROWS) {
        int32_t c = sp->pn - i < ROWS ? sp->pn - i : ROWS;
        st = mtp_pass(sp, sp->ph + (size_t)i * sp->H, sp->ptok + i, c, sp->ppos0 + i, true, err);
    }
    sp->st.t_draft += epyq_now() - t0;
    sp->pn = 0;
    return st;
}

static double rule_clock(const epyq_spec *sp) {
    return sp->o.clock ? sp->o.clock(sp->o.clock_ctx) : epyq_now();
}

epyq_status epyq_spec_rows(epyq_spec *sp, int32_t *rows, int32_t *n_rows, epyq_err *err) {
    *n_rows = 0;
    if (sp->n_rows)
        return epyq_err_set(err, EPYQ_E_ARG, "speculative decoding: a step is already pending");
    const int32_t k = sp->o.k, P = epyq_seq_pos(sp->s), ctx = epyq_seq_ctx(sp->s);
    if (P + 1 > ctx)
        return epyq_err_set(err, EPYQ_E_CTX_FULL,
                            "decode step at position %d: the %d-token context is full", P, ctx);
    sp->P = P;
    sp->t_rule0 = rule_clock(sp);
    rows[0] = sp->next;
    /* plain: an adaptive plain stretch, or no room for the drafts (the last tokens plainly) */
    if (sp->plain || P + k + 1 > ctx) {
        if (sp->pn == sp->pcap) {
            int32_t cap = sp->pcap ? 2 * sp->pcap : 64;
            float *h = realloc(sp->ph, (size_t)cap * sp->H * sizeof(float));
            if (h) sp->ph = h;
            int32_t *t = realloc(sp->ptok, (size_t)cap * sizeof(int32_t));
            if (t) sp->ptok = t;
            if (!h || !t) return epyq_err_set(err, EPYQ_E_NOMEM, "decode step: out of memory");
            sp->pcap = cap;
        }
        sp->n_rows = *n_rows = 1;
        return EPYQ_OK;
    }
    /* drafts 2..k: one MTP row each; d_i is the token at position P + i */
    epyq_status st = EPYQ_OK;
    double t0 = epyq_now();
    if (sp->o.draft_override) sp->d[0] = sp->o.draft_override(sp->o.override_ctx, P + 1, sp->d[0]);
    for (int32_t i = 1; st == EPYQ_OK && i < k; i++) {
        int32_t pos = P + i - 1, tok = sp->d[i - 1];
        st = epyq_mtp_run(sp->m, sp->s, 1, sp->dh, &tok, &pos, 1, sp->dlog, sp->dh, true, err);
        if (st == EPYQ_OK) sp->d[i] = epyq_argmax(sp->dlog, sp->Vd);
        if (st == EPYQ_OK && sp->o.draft_override)
            sp->d[i] = sp->o.draft_override(sp->o.override_ctx, P + i + 1, sp->d[i]);
    }
    sp->st.t_draft += epyq_now() - t0;
    if (st == EPYQ_OK) st = epyq_seq_spec_begin(sp->s, k + 1, err);
    if (st != EPYQ_OK) return st;
    for (int32_t i = 0; i < k; i++) rows[i + 1] = sp->d[i];
    sp->n_rows = *n_rows = k + 1;
    return EPYQ_OK;
}

void epyq_spec_abandon(epyq_spec *sp) {
    if (sp->n_rows > 1) epyq_seq_rollback(sp->s, 1, NULL); /* ends the speculation */
    sp->n_rows = 0;
}

/* The adaptive rule after a step that emitted n tokens (spec.h). */
static epyq_status adapt(epyq_spec *sp, int32_t n, epyq_err *err) {
    sp->w_time += rule_clock(sp) - sp->t_rule0, sp->w_tok += n;
    /* a window is PROBE_STEPS speculative steps, or a plain stretch (its first PROBE_STEPS
     * tokens measure plain decoding when there is no figure yet) */
    if (--sp->left > 0) {
        /* A probe ends early once EARLY steps in a row kept no draft: a verify step never costs
         * less than a plain one, so a window that emits one token a step cannot win, and at
         * real near-zero acceptance each probe then costs EARLY steps instead of PROBE_STEPS.
         * (With position-1 acceptance 0.93 this cuts a good probe short 0.5% of the time.) */
        int32_t done = PROBE_STEPS - sp->left;
        if (sp->plain || done < EARLY || sp->w_tok != done) return EPYQ_OK;
        sp->left = 0;
    }
    double cost = sp->w_time / (double)(sp->w_tok ? sp->w_tok : 1);
    sp->w_time = 0, sp->w_tok = 0;
    if (!sp->plain) {
        sp->cost_spec = cost;
        if (sp->cost_plain > 0 && cost <= sp->cost_plain) { /* speculation pays: keep it, halve the hold */
            sp->left = PROBE_STEPS;
            if (sp->hold > HOLD_MIN) sp->hold /= 2;
            return EPYQ_OK;
        }
        sp->plain = true, sp->st.switches++;
        sp->left = sp->cost_plain > 0 ? sp->hold : PROBE_STEPS;
        return EPYQ_OK;
    }
    if (sp->left == 0 && sp->cost_plain == 0) { /* the first plain figure */
        sp->cost_plain = cost;
        if (sp->cost_spec <= cost) { /* speculation was faster after all */
            sp->plain = false, sp->st.switches++, sp->left = PROBE_STEPS;
            return catch_up(sp, err);
        }
        sp->left = sp->hold;
        return EPYQ_OK;
    }
    sp->cost_plain = cost;
    if (sp->hold < HOLD_MAX) sp->hold *= 2; /* speculation lost last time: wait longer next time */
    sp->plain = false, sp->st.switches++, sp->left = PROBE_STEPS;
    return catch_up(sp, err);
}

epyq_status epyq_spec_take(epyq_spec *sp, const float *logits, const float *hid,
                           epyq_spec_pick_fn pick, void *ctx, int32_t *out, int32_t *n_out,
                           epyq_err *err) {
    *n_out = 0;
    const int32_t k = sp->o.k, P = sp->P, V = sp->V, H = sp->H, rows = sp->n_rows;
    if (!rows) return epyq_err_set(err, EPYQ_E_ARG, "speculative decoding: no step is pending");
    sp->n_rows = 0;
    bool adaptive = sp->o.adaptive && !sp->o.forced;
    if (rows == 1) { /* plain: keep the MTP row for the catch-up */
        if (!sp->pn) sp->ppos0 = P;
        memcpy(sp->ph + (size_t)sp->pn * H, hid, (size_t)H * sizeof(float));
        out[0] = sp->next = pick(ctx, logits);
        sp->ptok[sp->pn++] = out[0];
        sp->st.plain++;
        *n_out = 1;
        /* the last tokens before the context end are plain without being a stretch */
        return adaptive && sp->plain ? adapt(sp, 1, err) : EPYQ_OK;
    }
    /* accept: each pick is the token after the position it reads */
    int32_t n = 0;
    for (int32_t i = 0; i <= k; i++) {
        int32_t x = sp->o.forced && i < k ? sp->d[i] : pick(ctx, logits + (size_t)i * V);
        out[n++] = x;
        if (i == k || x != sp->d[i]) break;
    }
    double t0 = epyq_now();
    epyq_status st = epyq_seq_rollback(sp->s, n, err);
    sp->st.t_rollback += epyq_now() - t0;
    sp->st.steps++, sp->st.emitted += n;
    for (int32_t i = 0; i < n - 1; i++) sp->st.accepted[i]++;
    if (st != EPYQ_OK) return st;
    sp->next = out[n - 1];
    *n_out = n;
    /* refill the MTP cache with the kept positions; d1 of the next step */
    t0 = epyq_now();
    st = mtp_pass(sp, hid, out, n, P, true, err);
    sp->st.t_draft += epyq_now() - t0;
    return st == EPYQ_OK && adaptive ? adapt(sp, n, err) : st;
}

epyq_status epyq_spec_prompt(epyq_spec *sp, const float *hid, const int32_t *tok, int32_t n,
                             int32_t pos0, bool last, epyq_err *err) {
    if (n < 1) return EPYQ_OK;
    double t0 = epyq_now();
    epyq_status st = mtp_pass(sp, hid, tok, n, pos0, last, err);
    sp->st.t_draft += epyq_now() - t0;
    if (st == EPYQ_OK && last) sp->next = tok[n - 1];
    return st;
}

epyq_status epyq_spec_step(epyq_spec *sp, epyq_spec_pick_fn pick, void *ctx, int32_t *out,
                           int32_t *n_out, epyq_err *err) {
    *n_out = 0;
    int32_t rows[EPYQ_SPEC_MAX], n = 0;
    epyq_status st = hid_reserve(sp, sp->o.k + 1, err);
    if (st == EPYQ_OK) st = epyq_spec_rows(sp, rows, &n, err);
    if (st != EPYQ_OK) return st;
    epyq_seq *seqs[EPYQ_SPEC_MAX];
    for (int32_t i = 0; i < n; i++) seqs[i] = sp->s;
    epyq_batch b = {n, seqs, rows, NULL};
    double t0 = epyq_now();
    st = epyq_model_forward(sp->m, &b, sp->logits, sp->hid, err);
    sp->st.t_verify += epyq_now() - t0;
    if (st != EPYQ_OK) {
        epyq_spec_abandon(sp); /* nothing was fed on a refusal */
        return st;
    }
    return epyq_spec_take(sp, sp->logits, sp->hid, pick, ctx, out, n_out, err);
}
