/* src/model/seq_state.c — copies of a sequence's state at its current position (prefix
 * reuse, src/engine/prefix.c): the DeltaNet recurrent and conv states cannot be rewound the
 * way a KV cache can, so a prompt prefix is only reusable from a copy taken when the sequence
 * stood exactly at its end.
 *
 * Layout of a snapshot (native; chat sessions write it to disk, tools/chat_state.c):
 *   header | K rows [n_kv_layers][pos][nkv*hd] | V rows (same) | conv [n_gdn][Kc-1][conv_dim]
 *   | S [n_gdn][Hv][Dk][Dv]
 * This is the layout the sequence had before its caches and conv histories were cut into
 * per-head blocks (seq.c); the copies convert, so that saved sessions stay readable and the
 * format does not depend on how a sequence is laid out in memory.
 * Only KV rows [0, pos) are kept: rows past the position are never read before they are
 * written again. The MTP layer's rows (when the model has one) are copied like the trunk's,
 * so a restored sequence can draft from the same MTP cache it would have had. */
#include <string.h>

#include "model/model_impl.h"

#define SNAP_MAGIC 0x70616e73u /* "snap" */

typedef struct {
    uint32_t magic;
    int32_t pos, n_kv_layers, kv;
    uint64_t kv_row, conv_f, state_f, total; /* bytes per KV row, floats of conv and S */
    const void *model;                       /* the model it was taken from */
} snap_hdr;

/* Header rounded up so the arrays after it stay 8-byte aligned. */
#define HDR_BYTES ((sizeof(snap_hdr) + 63) & ~(size_t)63)

static uint64_t conv_floats(const epyq_model *m) {
    return (uint64_t)m->n_gdn * (uint64_t)(m->d.Kc - 1 > 0 ? m->d.Kc - 1 : 1) *
           (uint64_t)m->d.conv_dim;
}
static uint64_t state_floats(const epyq_model *m) {
    return (uint64_t)m->n_gdn * (uint64_t)m->d.Hv * (uint64_t)m->d.Dk * (uint64_t)m->d.Dv;
}
static uint64_t kv_row_bytes(const epyq_seq *s) {
    return (uint64_t)s->m->d.nkv * (uint64_t)s->m->d.hd * s->kv_elem;
}

/* Rows [0, pos) of every KV layer between the cache planes (one per kv head) and the
 * snapshot's rows [n_kv_layers][pos][nkv*hd] at p; returns p past them. */
static uint8_t *kv_rows(const epyq_seq *s, uint8_t *cache, uint8_t *p, int32_t pos, bool to_snap) {
    const size_t head = (size_t)s->m->d.hd * s->kv_elem;
    for (int32_t l = 0; l < s->n_kv_layers; l++)
        for (int32_t r = 0; r < pos; r++)
            for (int32_t kvh = 0; kvh < s->m->d.nkv; kvh++, p += head) {
                uint8_t *c = cache + ((size_t)l * s->m->d.nkv + (size_t)kvh) * s->kv_plane +
                             (size_t)r * head;
                if (to_snap) memcpy(p, c, head);
                else
                    memcpy(c, p, head);
            }
    return p;
}

uint64_t epyq_seq_snapshot_size(const epyq_seq *s, int32_t pos) {
    const epyq_model *m = s->m;
    if (pos < 0) pos = 0;
    return HDR_BYTES + 2ull * (uint64_t)s->n_kv_layers * (uint64_t)pos * kv_row_bytes(s) +
           (conv_floats(m) + state_floats(m)) * sizeof(float);
}

uint64_t epyq_seq_snapshot(const epyq_seq *s, void *buf) {
    const epyq_model *m = s->m;
    snap_hdr h = {SNAP_MAGIC,
                  s->pos,
                  s->n_kv_layers,
                  (int32_t)s->kv,
                  kv_row_bytes(s),
                  conv_floats(m),
                  state_floats(m),
                  epyq_seq_snapshot_size(s, s->pos),
                  m};
    uint8_t *p = buf;
    memset(p, 0, HDR_BYTES);
    memcpy(p, &h, sizeof h);
    p += HDR_BYTES;
    for (int pass = 0; pass < 2; pass++) p = kv_rows(s, pass ? s->v : s->k, p, s->pos, true);
    if (h.conv_f) epyq_seq_conv_canon(m, s->conv, p, true), p += h.conv_f * sizeof(float);
    if (h.state_f) memcpy(p, s->S, h.state_f * sizeof(float));
    return h.total;
}

int32_t epyq_seq_snapshot_pos(const void *buf) {
    snap_hdr h;
    memcpy(&h, buf, sizeof h);
    return h.magic == SNAP_MAGIC ? h.pos : -1;
}

/* owner: the model pointer the header must carry (NULL for a detached copy from a file). */
static epyq_status restore(epyq_seq *s, const void *buf, uint64_t len, const void *owner,
                           epyq_err *err) {
    const epyq_model *m = s->m;
    snap_hdr h;
    if (len < HDR_BYTES)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "state snapshot of %llu bytes: expected at least a %zu-byte header",
                            (unsigned long long)len, (size_t)HDR_BYTES);
    memcpy(&h, buf, sizeof h);
    if (h.magic != SNAP_MAGIC)
        return epyq_err_set(err, EPYQ_E_ARG, "state snapshot: bad magic 0x%08x", h.magic);
    if (h.model != owner || h.n_kv_layers != s->n_kv_layers || h.kv != (int32_t)s->kv ||
        h.kv_row != kv_row_bytes(s) || h.conv_f != conv_floats(m) || h.state_f != state_floats(m))
        return epyq_err_set(
            err, EPYQ_E_ARG,
            "state snapshot: taken from another model or KV type (%d KV layers, kv %d; "
            "this sequence has %d, kv %d)",
            h.n_kv_layers, h.kv, s->n_kv_layers, (int)s->kv);
    if (h.pos < 0 || h.pos > s->n_ctx)
        return epyq_err_set(err, EPYQ_E_CTX_FULL,
                            "state snapshot at position %d: the sequence holds %d positions", h.pos,
                            s->n_ctx);
    if (len != h.total || h.total != epyq_seq_snapshot_size(s, h.pos))
        return epyq_err_set(
            err, EPYQ_E_ARG, "state snapshot at position %d: %llu bytes, expected %llu", h.pos,
            (unsigned long long)len, (unsigned long long)epyq_seq_snapshot_size(s, h.pos));
    const uint8_t *p = (const uint8_t *)buf + HDR_BYTES;
    for (int pass = 0; pass < 2; pass++)
        p = kv_rows(s, pass ? s->v : s->k, (uint8_t *)p, h.pos, false);
    if (h.conv_f) epyq_seq_conv_canon(m, s->conv, (void *)p, false), p += h.conv_f * sizeof(float);
    if (h.state_f) memcpy(s->S, p, h.state_f * sizeof(float));
    s->pos = h.pos;
    /* snapshots are of text prefixes (prompts with images are never cached) */
    s->rope_delta = 0;
    s->spec_n = 0; /* a speculation in progress belonged to the state just replaced */
    return EPYQ_OK;
}

epyq_status epyq_seq_restore(epyq_seq *s, const void *buf, uint64_t len, epyq_err *err) {
    return restore(s, buf, len, s->m, err);
}

void epyq_seq_snapshot_detach(void *buf) {
    snap_hdr h;
    memcpy(&h, buf, sizeof h);
    h.model = NULL;
    memcpy(buf, &h, sizeof h);
}

epyq_status epyq_seq_restore_detached(epyq_seq *s, const void *buf, uint64_t len, epyq_err *err) {
    return restore(s, buf, len, NULL, err);
}

/* FNV-1a, 64-bit, continued from h. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

typedef struct {
    uint64_t h;
} id_ctx;

/* Every linear's name, shape and storage, and the first bytes of its packed or dense data:
 * shapes alone would take two synthetic checkpoints of one shape (other seeds) for the same
 * model, whose states mean nothing to each other. 64 bytes of each of the ~30k linears of the
 * real model touch one page each: milliseconds, once per save or load. */
static void id_linear(const epyq_linear *l, epyq_module_kind kind, int32_t layer, int32_t expert,
                      bool mtp, void *ctx) {
    id_ctx *c = ctx;
    int32_t v[4] = {(int32_t)kind, layer, expert, mtp};
    c->h = fnv(c->h, l->module, strlen(l->module));
    c->h = fnv(c->h, v, sizeof v);
    c->h = fnv(c->h, &l->n_out, sizeof l->n_out), c->h = fnv(c->h, &l->n_in, sizeof l->n_in);
    c->h = fnv(c->h, &l->kind, sizeof l->kind);
    const epyq_tensor *t = l->kind == EPYQ_LIN_Q4 ? l->qweight : l->w;
    if (t) {
        c->h = fnv(c->h, &t->dtype, sizeof t->dtype);
        c->h = fnv(c->h, t->shape, (size_t)t->ndim * sizeof t->shape[0]);
        if (t->data) c->h = fnv(c->h, t->data, t->nbytes < 64 ? t->nbytes : 64);
    }
}

uint64_t epyq_model_identity(const epyq_model *m) {
    const epyq_config *c = m->c;
    id_ctx x = {1469598103934665603ull};
    int32_t dims[] = {c->vocab_size,
                      c->hidden_size,
                      c->num_hidden_layers,
                      c->num_attention_heads,
                      c->num_key_value_heads,
                      c->head_dim,
                      c->rotary_dim,
                      c->conv_kernel,
                      c->lin_key_head_dim,
                      c->lin_value_head_dim,
                      c->lin_num_key_heads,
                      c->lin_num_value_heads,
                      c->num_experts,
                      c->num_experts_per_tok,
                      c->moe_intermediate_size,
                      c->shared_expert_intermediate_size,
                      c->mtp_num_hidden_layers,
                      (int32_t)c->qformat,
                      (int32_t)m->rq_lm_head,
                      (int32_t)m->rq_dense};
    x.h = fnv(x.h, dims, sizeof dims);
    x.h = fnv(x.h, c->full_attn, (size_t)c->num_hidden_layers * sizeof c->full_attn[0]);
    double f[] = {c->rms_norm_eps, c->rope_theta, c->partial_rotary_factor};
    x.h = fnv(x.h, f, sizeof f);
    epyq_weights_foreach_linear(m->w, id_linear, &x);
    return x.h;
}
