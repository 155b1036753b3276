/* src/load/stats.c — sizes of a bound checkpoint for summaries (see weights.h
 * epyq_weights_stats and docs/architecture.md §6, §7). */
#include <string.h>

#include "load/weights.h"

static uint64_t tbytes(const epyq_tensor *t) { return t ? t->nbytes : 0; }

/* Bytes the runtime holds for one linear (int4 repacked by the kernels, 16-bit as stored). */
static uint64_t resident(const epyq_linear *l) {
    if (l->kind == EPYQ_LIN_DENSE) return epyq_linear_bytes(l);
    return epyq_w4_pack_bytes((int32_t)l->n_out, (int32_t)l->n_in, l->scheme.group_size, !l->scheme.sym);
}

typedef struct {
    epyq_weights_stats *s;
    const epyq_weights *w;
    double expert_share; /* experts read per token / experts per layer */
} acc;

static void add_linear(const epyq_linear *l, epyq_module_kind kind, int32_t layer, int32_t expert, bool mtp, void *ctx) {
    (void)layer, (void)expert;
    acc *a = ctx;
    epyq_prec_row *r = mtp ? &a->s->mtp : &a->s->kind[kind];
    uint64_t b = epyq_linear_bytes(l), p = (uint64_t)(l->n_out * l->n_in);
    if (l->kind == EPYQ_LIN_Q4) r->q4_count++, r->q4_bytes += b;
    else r->dense_count++, r->dense_bytes += b;
    r->params += p;
    /* a tied lm_head is the embedding: resident once (counted with the other tensors) */
    if (!(kind == EPYQ_MK_LM_HEAD && l->w && l->w == a->w->embed)) a->s->resident_bytes += resident(l);
    if (mtp) return;
    if (kind == EPYQ_MK_EXPERT) {
        /* every expert is equally likely: the average expert times top-k */
        a->s->token_bytes += (uint64_t)((double)b * a->expert_share + 0.5);
        a->s->token_params += (uint64_t)((double)p * a->expert_share + 0.5);
    } else {
        a->s->token_bytes += b;
        a->s->token_params += p;
    }
}

static uint64_t elems(const epyq_tensor *t) {
    size_t es = t ? epyq_dtype_size(t->dtype) : 0;
    return es ? t->nbytes / es : 0;
}

static void layer_small(const epyq_layer_w *L, uint64_t *bytes, uint64_t *params) {
    const epyq_tensor *t[] = {L->input_norm, L->post_norm, L->attn.q_norm, L->attn.k_norm, L->gdn.conv1d,
                              L->gdn.dt_bias, L->gdn.A_log, L->gdn.norm};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (t[i] && (L->full_attn ? i < 4 : (i < 2 || i >= 4))) *bytes += tbytes(t[i]), *params += elems(t[i]);
}

void epyq_weights_stats_get(const epyq_weights *w, epyq_weights_stats *s) {
    memset(s, 0, sizeof *s);
    const epyq_config *c = &w->cfg;
    acc a = {s, w, (double)c->num_experts_per_tok / (double)c->num_experts};
    epyq_weights_foreach_linear(w, add_linear, &a);
    uint64_t small_b = 0, small_p = 0;
    for (int32_t i = 0; i < c->num_hidden_layers; i++) layer_small(&w->layers[i], &small_b, &small_p);
    small_b += tbytes(w->final_norm);
    small_p += elems(w->final_norm);
    s->other_bytes = small_b + tbytes(w->embed);
    s->resident_bytes += s->other_bytes;
    /* one embedding row per token */
    uint64_t row = w->embed ? tbytes(w->embed) / (uint64_t)c->vocab_size : 0;
    s->token_bytes += small_b + row;
    s->token_params += small_p + (uint64_t)c->hidden_size;
    if (w->has_mtp) {
        uint64_t mb = 0, mp = 0;
        layer_small(&w->mtp.layer, &mb, &mp);
        mb += tbytes(w->mtp.pre_fc_norm_embedding) + tbytes(w->mtp.pre_fc_norm_hidden) + tbytes(w->mtp.norm);
        s->mtp_other_bytes = mb;
        s->resident_bytes += mb;
    }
    int32_t n_full = 0;
    for (int32_t i = 0; i < c->num_hidden_layers; i++) n_full += c->full_attn[i];
    s->kv_bytes_per_token = (uint64_t)n_full * 2u * (uint64_t)c->num_key_value_heads * (uint64_t)c->head_dim * 2u;
    uint64_t n_gdn = (uint64_t)(c->num_hidden_layers - n_full);
    uint64_t conv_dim = 2u * (uint64_t)c->lin_num_key_heads * (uint64_t)c->lin_key_head_dim +
                        (uint64_t)c->lin_num_value_heads * (uint64_t)c->lin_value_head_dim;
    s->gdn_state_bytes = n_gdn * ((uint64_t)c->lin_num_value_heads * (uint64_t)c->lin_key_head_dim *
                                      (uint64_t)c->lin_value_head_dim * 4u +
                                  (uint64_t)(c->conv_kernel - 1) * conv_dim * 2u);
}
