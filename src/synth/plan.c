/* src/synth/plan.c — which tensors a checkpoint of each format holds, with names, dtypes and
 * shapes as each real writer stores them (docs/architecture.md §3, docs/quant-formats.md §4-§8, and
 * the fixture folders), and how they are laid out: names sorted and cut into shards of about equal
 * size (at least 2, at most ~5 GB each like save_pretrained), inside a shard (dtype size desc,
 * name). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "synth/synth_int.h"

#define SHARD_MAX 5000000000ull /* transformers' default max_shard_size "5GB" */

typedef struct {
    synth_plan *p;
    const epyq_synth_dims *d;
    epyq_synth_format f;
    bool fused_bf16;
    epyq_err *err;
    epyq_status st;
} builder;

static synth_tensor *push(builder *b, const char *name, const char *logical, synth_src src,
                          synth_dtype dt, int32_t ndim, const int64_t *shape) {
    synth_plan *p = b->p;
    if (b->st) return NULL;
    if (p->n == p->cap) {
        size_t nc = p->cap ? 2 * p->cap : 1024;
        synth_tensor *t = realloc(p->t, nc * sizeof *t);
        if (!t) {
            b->st = epyq_err_set(b->err, EPYQ_E_NOMEM, "synth: out of memory for the tensor plan");
            return NULL;
        }
        p->t = t, p->cap = nc;
    }
    synth_tensor *t = &p->t[p->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->logical = strdup(logical);
    if (!t->name || !t->logical) {
        free(t->name), free(t->logical);
        b->st = epyq_err_set(b->err, EPYQ_E_NOMEM, "synth: out of memory for the tensor plan");
        return NULL;
    }
    p->n++;
    t->src = src, t->dtype = dt, t->ndim = ndim, t->module = -1;
    uint64_t nb = epyq_synth_dtype_size(dt);
    for (int32_t i = 0; i < ndim; i++) t->shape[i] = shape[i], nb *= (uint64_t)shape[i];
    t->nbytes = nb;
    return t;
}

static void dense(builder *b, const char *name, synth_dtype dt, int32_t ndim, int64_t s0, int64_t s1,
                  int64_t s2) {
    int64_t sh[3] = {s0, s1, s2};
    push(b, name, name, SRC_DENSE, dt, ndim, sh);
}

/* A linear [n][k]: plain BF16 ".weight", or the int4 tensors of format f. */
static void linear(builder *b, const char *mod, int32_t n, int32_t k, bool q4) {
    char name[256], logical[256];
    snprintf(logical, sizeof logical, "%s.weight", mod);
    if (!q4) {
        dense(b, logical, SD_BF16, 2, n, k, 0);
        return;
    }
    const int64_t gs = 128, gn = k / gs, n8 = (n + 7) / 8;
    struct part {
        const char *suffix;
        synth_src src;
        synth_dtype dt;
        int32_t ndim;
        int64_t s0, s1;
    } parts[4];
    int np = 0;
    switch (b->f) {
    case EPYQ_SYNTH_GPTQ:
        parts[np++] = (struct part){"g_idx", SRC_Q_GIDX, SD_I32, 1, k, 0};
        parts[np++] = (struct part){"qweight", SRC_Q_PACKED, SD_I32, 2, k / 8, n};
        parts[np++] = (struct part){"qzeros", SRC_Q_ZEROS, SD_I32, 2, gn, n / 8};
        parts[np++] = (struct part){"scales", SRC_Q_SCALES, SD_F16, 2, gn, n};
        break;
    case EPYQ_SYNTH_CT:
        parts[np++] = (struct part){"weight_packed", SRC_Q_PACKED, SD_I32, 2, n, (k + 7) / 8};
        parts[np++] = (struct part){"weight_scale", SRC_Q_SCALES, SD_BF16, 2, n, gn};
        parts[np++] = (struct part){"weight_shape", SRC_Q_SHAPE, SD_I64, 1, 2, 0};
        if (b->d->act_order) parts[np++] = (struct part){"weight_g_idx", SRC_Q_GIDX, SD_I32, 1, k, 0};
        break;
    case EPYQ_SYNTH_QUARK:
        parts[np++] = (struct part){"weight", SRC_Q_PACKED, SD_I32, 2, k, n8};
        parts[np++] = (struct part){"weight_scale", SRC_Q_SCALES, SD_BF16, 2, gn, n};
        parts[np++] = (struct part){"weight_zero_point", SRC_Q_ZEROS, SD_I32, 2, gn, n8};
        break;
    case EPYQ_SYNTH_AWQ:
        parts[np++] = (struct part){"qweight", SRC_Q_PACKED, SD_I32, 2, k, n / 8};
        parts[np++] = (struct part){"qzeros", SRC_Q_ZEROS, SD_I32, 2, gn, n / 8};
        parts[np++] = (struct part){"scales", SRC_Q_SCALES, SD_F16, 2, gn, n};
        break;
    default:
        break;
    }
    int32_t id = b->p->n_modules++;
    for (int i = 0; i < np; i++) {
        snprintf(name, sizeof name, "%s.%s", mod, parts[i].suffix);
        int64_t sh[2] = {parts[i].s0, parts[i].s1};
        synth_tensor *t = push(b, name, mod, parts[i].src, parts[i].dt, parts[i].ndim, sh);
        if (!t) return;
        t->n = n, t->k = k, t->module = id;
    }
}

/* routed experts of one MoE block: fused 3-D BF16, or per expert (BF16 or int4) */
static void experts(builder *b, const char *pre, bool fused, bool q4) {
    const epyq_synth_dims *d = b->d;
    char name[256], mod[256];
    if (fused) {
        snprintf(mod, sizeof mod, "%s.mlp", pre);
        int64_t gu[3] = {d->experts, 2 * d->moe_inter, d->hidden}, dn[3] = {d->experts, d->hidden, d->moe_inter};
        snprintf(name, sizeof name, "%s.mlp.experts.gate_up_proj", pre);
        synth_tensor *t = push(b, name, mod, SRC_FUSED_GATE_UP, SD_BF16, 3, gu);
        if (t) t->n = d->moe_inter, t->k = d->hidden;
        snprintf(name, sizeof name, "%s.mlp.experts.down_proj", pre);
        t = push(b, name, mod, SRC_FUSED_DOWN, SD_BF16, 3, dn);
        if (t) t->n = d->hidden, t->k = d->moe_inter;
        return;
    }
    for (int32_t e = 0; e < d->experts; e++) {
        snprintf(mod, sizeof mod, "%s.mlp.experts.%d.gate_proj", pre, e);
        linear(b, mod, d->moe_inter, d->hidden, q4);
        snprintf(mod, sizeof mod, "%s.mlp.experts.%d.up_proj", pre, e);
        linear(b, mod, d->moe_inter, d->hidden, q4);
        snprintf(mod, sizeof mod, "%s.mlp.experts.%d.down_proj", pre, e);
        linear(b, mod, d->hidden, d->moe_inter, q4);
    }
}

static void moe(builder *b, const char *pre, bool fused, bool q4_experts, bool q4_shared) {
    const epyq_synth_dims *d = b->d;
    char mod[256];
    snprintf(mod, sizeof mod, "%s.mlp.gate", pre);
    linear(b, mod, d->experts, d->hidden, false);
    experts(b, pre, fused, q4_experts);
    snprintf(mod, sizeof mod, "%s.mlp.shared_expert.gate_proj", pre);
    linear(b, mod, d->shared_inter, d->hidden, q4_shared);
    snprintf(mod, sizeof mod, "%s.mlp.shared_expert.up_proj", pre);
    linear(b, mod, d->shared_inter, d->hidden, q4_shared);
    snprintf(mod, sizeof mod, "%s.mlp.shared_expert.down_proj", pre);
    linear(b, mod, d->hidden, d->shared_inter, q4_shared);
    snprintf(mod, sizeof mod, "%s.mlp.shared_expert_gate", pre);
    linear(b, mod, 1, d->hidden, false);
}

static void attention(builder *b, const char *pre, bool q4) {
    const epyq_synth_dims *d = b->d;
    char mod[256];
    int32_t qd = d->n_q_heads * d->head_dim, kvd = d->n_kv_heads * d->head_dim;
    snprintf(mod, sizeof mod, "%s.self_attn.q_proj", pre);
    linear(b, mod, 2 * qd, d->hidden, q4); /* query and output gate, interleaved per head */
    snprintf(mod, sizeof mod, "%s.self_attn.k_proj", pre);
    linear(b, mod, kvd, d->hidden, q4);
    snprintf(mod, sizeof mod, "%s.self_attn.v_proj", pre);
    linear(b, mod, kvd, d->hidden, q4);
    snprintf(mod, sizeof mod, "%s.self_attn.o_proj", pre);
    linear(b, mod, d->hidden, qd, q4);
    snprintf(mod, sizeof mod, "%s.self_attn.q_norm.weight", pre);
    dense(b, mod, SD_BF16, 1, d->head_dim, 0, 0);
    snprintf(mod, sizeof mod, "%s.self_attn.k_norm.weight", pre);
    dense(b, mod, SD_BF16, 1, d->head_dim, 0, 0);
}

static void gdn(builder *b, const char *pre, bool q4, bool q4_ab, synth_dtype small_dt) {
    const epyq_synth_dims *d = b->d;
    char mod[256];
    int32_t kd = d->lin_k_heads * d->lin_k_dim, vd = d->lin_v_heads * d->lin_v_dim;
    int32_t conv = 2 * kd + vd;
    snprintf(mod, sizeof mod, "%s.linear_attn.in_proj_qkv", pre);
    linear(b, mod, conv, d->hidden, q4);
    snprintf(mod, sizeof mod, "%s.linear_attn.in_proj_z", pre);
    linear(b, mod, vd, d->hidden, q4);
    snprintf(mod, sizeof mod, "%s.linear_attn.in_proj_b", pre);
    linear(b, mod, d->lin_v_heads, d->hidden, q4_ab);
    snprintf(mod, sizeof mod, "%s.linear_attn.in_proj_a", pre);
    linear(b, mod, d->lin_v_heads, d->hidden, q4_ab);
    snprintf(mod, sizeof mod, "%s.linear_attn.out_proj", pre);
    linear(b, mod, d->hidden, vd, q4);
    snprintf(mod, sizeof mod, "%s.linear_attn.conv1d.weight", pre);
    dense(b, mod, SD_BF16, 3, conv, 1, d->conv_kernel);
    snprintf(mod, sizeof mod, "%s.linear_attn.dt_bias", pre);
    dense(b, mod, SD_BF16, 1, d->lin_v_heads, 0, 0);
    snprintf(mod, sizeof mod, "%s.linear_attn.A_log", pre);
    dense(b, mod, small_dt, 1, d->lin_v_heads, 0, 0);
    snprintf(mod, sizeof mod, "%s.linear_attn.norm.weight", pre);
    dense(b, mod, small_dt, 1, d->lin_v_dim, 0, 0);
}

static void vision(builder *b) {
    const epyq_synth_dims *d = b->d;
    const int64_t h = d->vis_hidden, m = 4 * h; /* merger input: 2x2 merged patches */
    char n[256];
    const int64_t patch[5] = {h, 3, 2, 16, 16}; /* Conv3d, kernel = stride = 2x16x16 */
    push(b, "model.visual.patch_embed.proj.weight", "model.visual.patch_embed.proj.weight", SRC_DENSE,
         SD_BF16, 5, patch);
    dense(b, "model.visual.patch_embed.proj.bias", SD_BF16, 1, h, 0, 0);
    dense(b, "model.visual.pos_embed.weight", SD_BF16, 2, d->vis_pos, h, 0);
    for (int32_t i = 0; i < d->vis_depth; i++) {
        static const char *const ln[] = {"norm1", "norm2"};
        for (int j = 0; j < 2; j++) {
            snprintf(n, sizeof n, "model.visual.blocks.%d.%s.weight", i, ln[j]);
            dense(b, n, SD_BF16, 1, h, 0, 0);
            snprintf(n, sizeof n, "model.visual.blocks.%d.%s.bias", i, ln[j]);
            dense(b, n, SD_BF16, 1, h, 0, 0);
        }
        struct { const char *m; int64_t o, in; } lin[] = {{"attn.qkv", 3 * h, h}, {"attn.proj", h, h},
                                                          {"mlp.linear_fc1", d->vis_inter, h},
                                                          {"mlp.linear_fc2", h, d->vis_inter}};
        for (int j = 0; j < 4; j++) {
            snprintf(n, sizeof n, "model.visual.blocks.%d.%s.weight", i, lin[j].m);
            dense(b, n, SD_BF16, 2, lin[j].o, lin[j].in, 0);
            snprintf(n, sizeof n, "model.visual.blocks.%d.%s.bias", i, lin[j].m);
            dense(b, n, SD_BF16, 1, lin[j].o, 0, 0);
        }
    }
    dense(b, "model.visual.merger.norm.weight", SD_BF16, 1, h, 0, 0);
    dense(b, "model.visual.merger.norm.bias", SD_BF16, 1, h, 0, 0);
    dense(b, "model.visual.merger.linear_fc1.weight", SD_BF16, 2, m, m, 0);
    dense(b, "model.visual.merger.linear_fc1.bias", SD_BF16, 1, m, 0, 0);
    dense(b, "model.visual.merger.linear_fc2.weight", SD_BF16, 2, d->hidden, m, 0);
    dense(b, "model.visual.merger.linear_fc2.bias", SD_BF16, 1, d->hidden, 0, 0);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const synth_tensor *)a)->name, ((const synth_tensor *)b)->name);
}

/* transformers' writer order: larger dtypes first so every tensor is naturally aligned */
static int cmp_file_order(const void *a, const void *b) {
    const synth_tensor *x = a, *y = b;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    size_t sx = epyq_synth_dtype_size(x->dtype), sy = epyq_synth_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

epyq_status epyq_synth_plan_build(synth_plan *p, const epyq_synth_dims *d, epyq_synth_format f,
                                  bool fused, epyq_err *err) {
    memset(p, 0, sizeof *p);
    builder b = {.p = p, .d = d, .f = f, .fused_bf16 = fused, .err = err};
    const bool bf16 = f == EPYQ_SYNTH_BF16;
    /* What each writer quantizes (docs/quant-formats.md §4.5, §5.3, §6.3; AWQ: Linear layers whose
     * out_features AutoAWQ can pack, i.e. not the [Hv][H] in_proj_a/b). */
    const bool q_exp = !bf16, q_shared = f == EPYQ_SYNTH_CT || f == EPYQ_SYNTH_AWQ;
    const bool q_attn = f == EPYQ_SYNTH_CT || f == EPYQ_SYNTH_QUARK || f == EPYQ_SYNTH_AWQ;
    const bool q_ab = f == EPYQ_SYNTH_CT || f == EPYQ_SYNTH_QUARK;
    /* Qwen3.5-style F32 A_log / gated norm in the per-expert BF16 release, BF16 in 3.6 files */
    const synth_dtype small_dt = bf16 && !fused ? SD_F32 : SD_BF16;
    const bool mtp_fused = bf16 ? fused : f == EPYQ_SYNTH_CT; /* CT copies the release's MTP */
    char pre[128], mod[256];

    dense(&b, "model.language_model.embed_tokens.weight", SD_BF16, 2, d->vocab, d->hidden, 0);
    dense(&b, "model.language_model.norm.weight", SD_BF16, 1, d->hidden, 0, 0);
    linear(&b, "lm_head", d->vocab, d->hidden, false);
    for (int32_t l = 0; l < d->layers && !b.st; l++) {
        snprintf(pre, sizeof pre, "model.language_model.layers.%d", l);
        snprintf(mod, sizeof mod, "%s.input_layernorm.weight", pre);
        dense(&b, mod, SD_BF16, 1, d->hidden, 0, 0);
        snprintf(mod, sizeof mod, "%s.post_attention_layernorm.weight", pre);
        dense(&b, mod, SD_BF16, 1, d->hidden, 0, 0);
        if (l % 4 == 3) attention(&b, pre, q_attn);
        else gdn(&b, pre, q_attn, q_ab, small_dt);
        moe(&b, pre, bf16 && fused, q_exp, q_shared);
    }
    if (d->mtp_layers > 0) {
        linear(&b, "mtp.fc", d->hidden, 2 * d->hidden, false);
        dense(&b, "mtp.pre_fc_norm_embedding.weight", SD_BF16, 1, d->hidden, 0, 0);
        dense(&b, "mtp.pre_fc_norm_hidden.weight", SD_BF16, 1, d->hidden, 0, 0);
        dense(&b, "mtp.norm.weight", SD_BF16, 1, d->hidden, 0, 0);
        dense(&b, "mtp.layers.0.input_layernorm.weight", SD_BF16, 1, d->hidden, 0, 0);
        dense(&b, "mtp.layers.0.post_attention_layernorm.weight", SD_BF16, 1, d->hidden, 0, 0);
        attention(&b, "mtp.layers.0", false);
        moe(&b, "mtp.layers.0", mtp_fused, false, false);
    }
    if (d->vis_depth > 0) vision(&b);
    if (b.st) {
        epyq_synth_plan_free(p);
        return b.st;
    }

    /* shards: consecutive runs of the sorted names, about equal in bytes */
    qsort(p->t, p->n, sizeof *p->t, cmp_name);
    for (size_t i = 0; i < p->n; i++) p->total += p->t[i].nbytes;
    uint64_t ns = (p->total + SHARD_MAX - 1) / SHARD_MAX;
    if (ns < 2) ns = 2;
    uint64_t target = (p->total + ns - 1) / ns, acc = 0;
    int32_t cur = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (acc > 0 && acc + p->t[i].nbytes > target && (uint64_t)cur + 1 < ns) cur++, acc = 0;
        p->t[i].shard = cur;
        acc += p->t[i].nbytes;
    }
    p->n_shards = cur + 1;
    qsort(p->t, p->n, sizeof *p->t, cmp_file_order);
    p->shard_bytes = calloc((size_t)p->n_shards, sizeof *p->shard_bytes);
    p->module_parts = calloc((size_t)p->n_modules + 1, sizeof *p->module_parts);
    if (!p->shard_bytes || !p->module_parts) {
        epyq_synth_plan_free(p);
        return epyq_err_set(err, EPYQ_E_NOMEM, "synth: out of memory for the tensor plan");
    }
    for (size_t i = 0; i < p->n; i++) {
        synth_tensor *t = &p->t[i];
        t->offset = p->shard_bytes[t->shard];
        p->shard_bytes[t->shard] += t->nbytes;
        if (t->src == SRC_Q_SCALES || t->src == SRC_Q_ZEROS) p->module_parts[t->module]++;
    }
    return EPYQ_OK;
}

void epyq_synth_plan_free(synth_plan *p) {
    for (size_t i = 0; i < p->n; i++) free(p->t[i].name), free(p->t[i].logical);
    free(p->t);
    free(p->shard_bytes);
    free(p->module_parts);
    memset(p, 0, sizeof *p);
}
