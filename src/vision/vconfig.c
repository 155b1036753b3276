/* src/vision/vconfig.c — vision_config and the tower's tensors (vision.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "load/json.h"
#include "vision/vision.h"

static epyq_status need_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int32_t *dst,
                            const char *label, epyq_err *err) {
    int64_t v;
    bool found;
    TRY(epyq_json_get_int(o, key, lo, hi, &v, &found, label, err));
    if (!found)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: vision_config.%s: missing", label, key);
    *dst = (int32_t)v;
    return EPYQ_OK;
}

/* The text rotary block sits in rope_parameters, rope_scaling or at the top of text_config
 * (as src/load/config.c looks for it). */
static const cJSON *rope_block(const cJSON *root) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!cJSON_IsObject(tc)) tc = root;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(tc, "rope_parameters");
    if (!cJSON_IsObject(r)) r = cJSON_GetObjectItemCaseSensitive(tc, "rope_scaling");
    return cJSON_IsObject(r) ? r : tc;
}

static epyq_status fill(epyq_vision_config *vc, const cJSON *root, const char *label,
                        epyq_err *err) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
    TRY(need_int(o, "depth", 1, 256, &vc->depth, label, err));
    TRY(need_int(o, "hidden_size", 1, 65536, &vc->hidden, label, err));
    TRY(need_int(o, "intermediate_size", 1, 1 << 20, &vc->inter, label, err));
    TRY(need_int(o, "num_heads", 1, 1024, &vc->heads, label, err));
    TRY(need_int(o, "patch_size", 1, 64, &vc->patch, label, err));
    TRY(need_int(o, "temporal_patch_size", 1, 8, &vc->temporal, label, err));
    TRY(need_int(o, "spatial_merge_size", 1, 8, &vc->merge, label, err));
    TRY(need_int(o, "out_hidden_size", 1, 65536, &vc->out_hidden, label, err));
    TRY(need_int(o, "num_position_embeddings", 1, 1 << 20, &vc->n_pos, label, err));
    vc->in_ch = 3;
    int64_t v = 3;
    TRY(epyq_json_get_int(o, "in_channels", 3, 3, &v, NULL, label, err));
    if (vc->hidden % vc->heads || (vc->hidden / vc->heads) % 4)
        return epyq_err_set(
            err, EPYQ_E_FORMAT,
            "%s: vision hidden_size %d over %d heads: expected a head width divisible by 4", label,
            vc->hidden, vc->heads);
    vc->head_dim = vc->hidden / vc->heads;
    vc->pos_side = (int32_t)lrint(sqrt((double)vc->n_pos));
    if ((int64_t)vc->pos_side * vc->pos_side != vc->n_pos)
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: num_position_embeddings %d: expected a square grid", label,
                            vc->n_pos);
    const char *act = "gelu_pytorch_tanh";
    TRY(epyq_json_get_str(o, "hidden_act", &act, NULL, label, err));
    if (strcmp(act, "gelu_pytorch_tanh"))
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: vision hidden_act '%s': only gelu_pytorch_tanh is implemented",
                            label, act);
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(o, "deepstack_visual_indexes");
    if (ds && !(cJSON_IsArray(ds) && cJSON_GetArraySize(ds) == 0))
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: deepstack_visual_indexes: expected [] (no deepstack), found %s",
                            label, epyq_json_type_name(ds));
    vc->rope_theta = 10000.0; /* hard-coded in the HF vision rotary; newer configs may carry it */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    if (cJSON_IsObject(rp))
        TRY(epyq_json_get_num(rp, "rope_theta", 1.0, 1e12, &vc->rope_theta, NULL, label, err));
    vc->eps = 1e-6;
    const struct {
        const char *key;
        int32_t *dst;
    } ids[] = {{"image_token_id", &vc->image_token_id},
               {"vision_start_token_id", &vc->vision_start_id},
               {"vision_end_token_id", &vc->vision_end_id}};
    for (size_t i = 0; i < 3; i++) {
        bool found;
        TRY(epyq_json_get_int(root, ids[i].key, 0, INT32_MAX, &v, &found, label, err));
        if (!found)
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: %s: missing (needed for image input)",
                                label, ids[i].key);
        *ids[i].dst = (int32_t)v;
    }
    /* the tower's rows replace token embeddings: they must have the text model's width */
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    int64_t th = 0;
    TRY(epyq_json_get_int(cJSON_IsObject(tc) ? tc : root, "hidden_size", 1, 1 << 20, &th, NULL,
                          label, err));
    if (th != vc->out_hidden)
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: vision out_hidden_size %d: expected the text hidden_size %lld",
                            label, vc->out_hidden, (long long)th);
    const cJSON *rb = rope_block(root), *ms = cJSON_GetObjectItemCaseSensitive(rb, "mrope_section");
    if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) != 3)
        return epyq_err_set(err, EPYQ_E_FORMAT,
                            "%s: mrope_section: expected 3 integers (t, h, w) for image positions",
                            label);
    for (int i = 0; i < 3; i++)
        if (!epyq_json_as_int(cJSON_GetArrayItem(ms, i), 0, 1024, &v))
            return epyq_err_set(err, EPYQ_E_FORMAT,
                                "%s: mrope_section[%d]: expected an integer in [0, 1024]", label,
                                i);
        else
            vc->mrope_section[i] = (int32_t)v;
    vc->mrope_interleaved = false;
    TRY(epyq_json_get_bool(rb, "mrope_interleaved", &vc->mrope_interleaved, NULL, label, err));
    /* the attention layers (src/model/attn.c) assign frequencies to axes interleaved, as every
     * Qwen3.5/3.6 config says; the chunked Qwen2-VL layout would silently rotate wrongly */
    if (!vc->mrope_interleaved)
        return epyq_err_set(
            err, EPYQ_E_FORMAT,
            "%s: mrope_interleaved: expected true (only interleaved M-RoPE is implemented)", label);
    return EPYQ_OK;
}

epyq_status epyq_vision_config_parse(epyq_vision_config *vc, const char *json, size_t len,
                                     const char *label, bool *present, epyq_err *err) {
    memset(vc, 0, sizeof *vc);
    *present = false;
    cJSON *root = NULL;
    TRY(epyq_json_parse(&root, json, len, label, err));
    epyq_status st = EPYQ_OK;
    if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "vision_config"))) {
        *present = true;
        st = fill(vc, root, label, err);
    }
    cJSON_Delete(root);
    return st;
}

epyq_status epyq_vision_config_load(epyq_vision_config *vc, const char *dir, bool *present,
                                    epyq_err *err) {
    char *path = epyq_path_join(dir, "config.json"), *buf = NULL;
    size_t len = 0;
    if (!path) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    epyq_status st = epyq_file_read(path, 16u << 20, &buf, &len, err);
    if (st == EPYQ_OK) st = epyq_vision_config_parse(vc, buf, len, path, present, err);
    free(buf), free(path);
    return st;
}

int32_t epyq_vision_tokens(const epyq_vision_config *vc, int32_t gh, int32_t gw) {
    return (gh / vc->merge) * (gw / vc->merge);
}

typedef struct {
    const epyq_ckpt *ck;
    const char *prefix;
    epyq_err *err;
} binder;

/* The tensor prefix+name with exactly the given shape (dims[0..nd)) and a 16/32-bit float dtype. */
static epyq_status get(binder *b, const epyq_tensor **out, const char *name, int nd,
                       const int64_t *dims) {
    char full[256];
    snprintf(full, sizeof full, "%s%s", b->prefix, name);
    const epyq_tensor *t = epyq_ckpt_find(b->ck, full);
    if (!t)
        return epyq_err_set(b->err, EPYQ_E_SHAPE, "%s: vision tensor %s is missing",
                            epyq_ckpt_dir(b->ck), full);
    if (t->dtype != EPYQ_DT_BF16 && t->dtype != EPYQ_DT_F16 && t->dtype != EPYQ_DT_F32)
        return epyq_err_set(b->err, EPYQ_E_SHAPE, "%s: dtype %s: expected BF16, F16 or F32", full,
                            epyq_dtype_name(t->dtype));
    /* a multi-dimensional tensor matches when its leading dim and the product of the rest do
     * (the Conv3d patch kernel [D][3][T][p][p] is used as [D][3*T*p*p]) */
    int64_t want_rest = 1, got_rest = 1;
    for (int i = 1; i < nd; i++) want_rest *= dims[i];
    for (int i = 1; i < t->ndim; i++) got_rest *= t->shape[i];
    if ((t->ndim == 1) != (nd == 1) || t->shape[0] != dims[0] || want_rest != got_rest)
        return epyq_err_set(b->err, EPYQ_E_SHAPE,
                            "%s: shape [%lld, %lld elements per row]: expected [%lld, %lld]", full,
                            (long long)t->shape[0], (long long)got_rest, (long long)dims[0],
                            (long long)want_rest);
    *out = t;
    return EPYQ_OK;
}

static epyq_status vec(binder *b, const epyq_tensor **o, const char *n, int64_t d) {
    return get(b, o, n, 1, &d);
}
static epyq_status mat(binder *b, const epyq_tensor **o, const char *n, int64_t r, int64_t c) {
    int64_t d[2] = {r, c};
    return get(b, o, n, 2, d);
}

epyq_status epyq_vision_bind(epyq_vision_w *w, const epyq_ckpt *ck, const epyq_vision_config *vc,
                             epyq_err *err) {
    memset(w, 0, sizeof *w);
    w->cfg = *vc;
    binder b = {ck, "model.visual.", err};
    if (!epyq_ckpt_find(ck, "model.visual.pos_embed.weight") &&
        epyq_ckpt_find(ck, "visual.pos_embed.weight"))
        b.prefix = "visual.";
    int64_t D = vc->hidden, I = vc->inter,
            K = (int64_t)vc->in_ch * vc->temporal * vc->patch * vc->patch;
    int64_t M = D * vc->merge * vc->merge;
    TRY(mat(&b, &w->patch_w, "patch_embed.proj.weight", D, K));
    TRY(vec(&b, &w->patch_b, "patch_embed.proj.bias", D));
    TRY(mat(&b, &w->pos, "pos_embed.weight", vc->n_pos, D));
    w->blocks = calloc((size_t)vc->depth, sizeof *w->blocks);
    if (!w->blocks) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    for (int32_t i = 0; i < vc->depth; i++) {
        epyq_vision_block_w *k = &w->blocks[i];
        /* name, destination, rows, columns (0: a vector of `rows`) */
        const struct {
            const char *name;
            const epyq_tensor **dst;
            int64_t r, c;
        } ts[] = {
            {"norm1.weight", &k->norm1_w, D, 0},        {"norm1.bias", &k->norm1_b, D, 0},
            {"norm2.weight", &k->norm2_w, D, 0},        {"norm2.bias", &k->norm2_b, D, 0},
            {"attn.qkv.weight", &k->qkv_w, 3 * D, D},   {"attn.qkv.bias", &k->qkv_b, 3 * D, 0},
            {"attn.proj.weight", &k->proj_w, D, D},     {"attn.proj.bias", &k->proj_b, D, 0},
            {"mlp.linear_fc1.weight", &k->fc1_w, I, D}, {"mlp.linear_fc1.bias", &k->fc1_b, I, 0},
            {"mlp.linear_fc2.weight", &k->fc2_w, D, I}, {"mlp.linear_fc2.bias", &k->fc2_b, D, 0}};
        for (size_t j = 0; j < sizeof ts / sizeof ts[0]; j++) {
            char n[128];
            snprintf(n, sizeof n, "blocks.%d.%s", i, ts[j].name);
            TRY(ts[j].c ? mat(&b, ts[j].dst, n, ts[j].r, ts[j].c) : vec(&b, ts[j].dst, n, ts[j].r));
        }
    }
    TRY(vec(&b, &w->mnorm_w, "merger.norm.weight", D));
    TRY(vec(&b, &w->mnorm_b, "merger.norm.bias", D));
    TRY(mat(&b, &w->mfc1_w, "merger.linear_fc1.weight", M, M));
    TRY(vec(&b, &w->mfc1_b, "merger.linear_fc1.bias", M));
    TRY(mat(&b, &w->mfc2_w, "merger.linear_fc2.weight", vc->out_hidden, M));
    TRY(vec(&b, &w->mfc2_b, "merger.linear_fc2.bias", vc->out_hidden));
    return EPYQ_OK;
}

void epyq_vision_w_free(epyq_vision_w *w) {
    if (!w) return;
    free(w->blocks);
    w->blocks = NULL;
}

double epyq_vision_flops(const epyq_vision_config *vc, int32_t n) {
    double D = vc->hidden, I = vc->inter,
           K = (double)vc->in_ch * vc->temporal * vc->patch * vc->patch;
    double M = D * vc->merge * vc->merge, N = n,
           per_block = N * (3 * D * D + D * D + 2 * D * I) + 2.0 * N * N * D;
    return 2.0 * (N * K * D + vc->depth * per_block +
                  N / (vc->merge * vc->merge) * (M * M + M * vc->out_hidden));
}
