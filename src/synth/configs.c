/* src/synth/configs.c — config.json, generation_config.json and quantize_config.json as the real
 * files are written: Python json.dumps(indent=2) text, config.json with sorted keys (as
 * transformers saves it), every key of the released config (docs/architecture.md §2.1) and the
 * exact quantization block of each writer (docs/quant-formats.md §4.1, §5.1, §6.1, §7). */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth/synth_int.h"

/* ---- Python-style pretty printer over a cJSON tree ---- */

static int cmp_key(const void *a, const void *b) {
    return strcmp((*(cJSON *const *)a)->string, (*(cJSON *const *)b)->string);
}

static void indent(synth_buf *b, int n) {
    static const char sp[] = "                                ";
    while (n > 0) {
        int m = n < 32 ? n : 32;
        sb_put(b, sp, (size_t)m);
        n -= m;
    }
}

static void pyjson(synth_buf *b, const cJSON *x, int ind, bool sort) {
    if (cJSON_IsObject(x) || cJSON_IsArray(x)) {
        bool obj = cJSON_IsObject(x);
        int n = cJSON_GetArraySize(x);
        if (!n) {
            sb_puts(b, obj ? "{}" : "[]");
            return;
        }
        cJSON **kids = malloc((size_t)n * sizeof *kids);
        if (!kids) {
            b->oom = true;
            return;
        }
        int i = 0;
        for (cJSON *c = x->child; c; c = c->next) kids[i++] = c;
        if (obj && sort) qsort(kids, (size_t)n, sizeof *kids, cmp_key);
        sb_puts(b, obj ? "{\n" : "[\n");
        for (i = 0; i < n; i++) {
            indent(b, ind + 2);
            if (obj) {
                sb_json_str(b, kids[i]->string);
                sb_puts(b, ": ");
            }
            pyjson(b, kids[i], ind + 2, sort);
            sb_puts(b, i + 1 < n ? ",\n" : "\n");
        }
        indent(b, ind);
        sb_puts(b, obj ? "}" : "]");
        free(kids);
    } else if (cJSON_IsString(x)) {
        sb_json_str(b, x->valuestring);
    } else if (cJSON_IsRaw(x)) {
        sb_puts(b, x->valuestring);
    } else if (cJSON_IsNumber(x)) {
        sb_printf(b, "%lld", (long long)x->valuedouble);
    } else if (cJSON_IsBool(x)) {
        sb_puts(b, cJSON_IsTrue(x) ? "true" : "false");
    } else {
        sb_puts(b, "null");
    }
}

static epyq_status dump(const char *dir, const char *name, const cJSON *root, bool sort, epyq_err *err) {
    synth_buf b = {0};
    if (!root) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", name);
    pyjson(&b, root, 0, sort);
    sb_puts(&b, "\n");
    epyq_status st = epyq_synth_write_file(dir, name, &b, err);
    sb_free(&b);
    return st;
}

/* small builders; cJSON tolerates NULL items by failing the add, and the caller checks oom at print.
 * Floats go in as raw text so they print as Python writes them (0.0, 1e-06, 10000000.0), which
 * cJSON's own number printer would not. */
static void num(cJSON *o, const char *k, long long v) { cJSON_AddNumberToObject(o, k, (double)v); }
static void raw(cJSON *o, const char *k, const char *v) { cJSON_AddRawToObject(o, k, v); }
static void str(cJSON *o, const char *k, const char *v) { cJSON_AddStringToObject(o, k, v); }
static void boolean(cJSON *o, const char *k, bool v) { cJSON_AddBoolToObject(o, k, v); }
static cJSON *int_array(const int32_t *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}
static cJSON *str_array(char **v, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateString(v[i]));
    return a;
}

/* ---- name lists ---- */

typedef struct {
    char **v;
    size_t n, cap;
    bool oom;
} strlist;

static void sl_add(strlist *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sl_add(strlist *l, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 64;
        char **p = realloc(l->v, nc * sizeof *p);
        if (!p) {
            l->oom = true;
            return;
        }
        l->v = p, l->cap = nc;
    }
    if (!(l->v[l->n] = strdup(tmp))) l->oom = true;
    else l->n++;
}

static void sl_free(strlist *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void vision_linears(strlist *l, const epyq_synth_dims *d, bool quark_order) {
    /* compressed-tensors lists modules in model order; Quark's list is sorted afterwards anyway */
    static const char *const ct[] = {"attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2"};
    static const char *const qk[] = {"attn.proj", "attn.qkv", "mlp.linear_fc1", "mlp.linear_fc2"};
    for (int32_t b = 0; b < d->vis_cfg_depth; b++)
        for (int j = 0; j < 4; j++) sl_add(l, "model.visual.blocks.%d.%s", b, quark_order ? qk[j] : ct[j]);
    sl_add(l, "model.visual.merger.linear_fc1");
    sl_add(l, "model.visual.merger.linear_fc2");
}

/* ---- quantization blocks ---- */

static cJSON *gptq_block(bool act_order) {
    cJSON *q = cJSON_CreateObject(), *dyn = cJSON_CreateObject(), *meta = cJSON_CreateObject();
    num(q, "bits", 4);
    num(q, "group_size", 128);
    boolean(q, "desc_act", act_order);
    boolean(q, "sym", true);
    boolean(q, "lm_head", false);
    str(q, "quant_method", "gptq");
    str(q, "method", "gptq");
    str(q, "format", "gptq");
    str(q, "checkpoint_format", "gptq");
    str(q, "pack_dtype", "int32");
    /* negative rules: everything but the routed experts stays BF16 (§4.7) */
    static const char *const neg[] = {"-:.*attn.*", "-:.*shared_expert.*", "-:.*mtp.*", "-:.*visual.*"};
    for (int i = 0; i < 4; i++) cJSON_AddItemToObject(dyn, neg[i], cJSON_CreateObject());
    cJSON_AddItemToObject(q, "dynamic", dyn);
    cJSON *quantizer = cJSON_CreateArray();
    cJSON_AddItemToArray(quantizer, cJSON_CreateString("gptqmodel:6.0.3"));
    cJSON_AddItemToObject(meta, "quantizer", quantizer);
    str(meta, "uri", "https://github.com/modelcloud/gptqmodel");
    boolean(meta, "static_groups", false);
    boolean(meta, "true_sequential", true);
    boolean(meta, "act_group_aware", true);
    cJSON_AddNullToObject(meta, "gptaq");
    cJSON_AddItemToObject(q, "meta", meta);
    return q;
}

static cJSON *ct_block(const epyq_synth_dims *d, bool *oom) {
    cJSON *q = cJSON_CreateObject(), *groups = cJSON_CreateObject(), *g0 = cJSON_CreateObject();
    cJSON *w = cJSON_CreateObject(), *targets = cJSON_CreateArray();
    str(g0, "format", "pack-quantized");
    cJSON_AddNullToObject(g0, "input_activations");
    cJSON_AddNullToObject(g0, "output_activations");
    cJSON_AddItemToArray(targets, cJSON_CreateString("Linear"));
    cJSON_AddItemToObject(g0, "targets", targets);
    str(w, "actorder", d->act_order ? "group" : "static");
    cJSON_AddNullToObject(w, "block_structure");
    boolean(w, "dynamic", false);
    num(w, "group_size", 128);
    num(w, "num_bits", 4);
    str(w, "observer", "memoryless_minmax");
    cJSON_AddItemToObject(w, "observer_kwargs", cJSON_CreateObject());
    cJSON_AddNullToObject(w, "scale_dtype");
    str(w, "strategy", "group");
    boolean(w, "symmetric", true);
    str(w, "type", "int");
    cJSON_AddNullToObject(w, "zp_dtype");
    cJSON_AddItemToObject(g0, "weights", w);
    cJSON_AddItemToObject(groups, "group_0", g0);
    cJSON_AddItemToObject(q, "config_groups", groups);
    str(q, "format", "pack-quantized");
    cJSON_AddNullToObject(q, "global_compression_ratio");
    /* every Linear left unquantized, by exact name in model order, + the recipe's MTP regex */
    strlist ig = {0};
    vision_linears(&ig, d, false);
    for (int32_t l = 0; l < d->layers; l++) {
        sl_add(&ig, "model.language_model.layers.%d.mlp.gate", l);
        sl_add(&ig, "model.language_model.layers.%d.mlp.shared_expert_gate", l);
    }
    sl_add(&ig, "lm_head");
    sl_add(&ig, "re:^mtp.*");
    *oom |= ig.oom;
    cJSON_AddItemToObject(q, "ignore", str_array(ig.v, ig.n));
    sl_free(&ig);
    cJSON_AddNullToObject(q, "kv_cache_scheme");
    str(q, "quant_method", "compressed-tensors");
    str(q, "quantization_status", "compressed");
    cJSON_AddItemToObject(q, "sparsity_config", cJSON_CreateObject());
    cJSON_AddItemToObject(q, "transform_config", cJSON_CreateObject());
    str(q, "version", "0.17.1");
    return q;
}

static cJSON *quark_block(const epyq_synth_dims *d, bool *oom) {
    cJSON *q = cJSON_CreateObject(), *ex = cJSON_CreateObject(), *g = cJSON_CreateObject();
    cJSON *w = cJSON_CreateObject();
    cJSON_AddNullToObject(q, "algo_config");
    /* exporters resolve exclude patterns to the sorted list of exact module names (§6.5) */
    strlist l = {0};
    sl_add(&l, "lm_head");
    for (int32_t i = 0; i < d->layers; i++) {
        sl_add(&l, "model.language_model.layers.%d.mlp.gate", i);
        sl_add(&l, "model.language_model.layers.%d.mlp.shared_expert.down_proj", i);
        sl_add(&l, "model.language_model.layers.%d.mlp.shared_expert.gate_proj", i);
        sl_add(&l, "model.language_model.layers.%d.mlp.shared_expert.up_proj", i);
        sl_add(&l, "model.language_model.layers.%d.mlp.shared_expert_gate", i);
    }
    vision_linears(&l, d, true);
    if (d->mtp_layers > 0) {
        sl_add(&l, "mtp.fc");
        for (int32_t e = 0; e < d->experts; e++) {
            sl_add(&l, "mtp.layers.0.mlp.experts.%d.down_proj", e);
            sl_add(&l, "mtp.layers.0.mlp.experts.%d.gate_proj", e);
            sl_add(&l, "mtp.layers.0.mlp.experts.%d.up_proj", e);
        }
        sl_add(&l, "mtp.layers.0.mlp.gate");
        sl_add(&l, "mtp.layers.0.mlp.shared_expert.down_proj");
        sl_add(&l, "mtp.layers.0.mlp.shared_expert.gate_proj");
        sl_add(&l, "mtp.layers.0.mlp.shared_expert.up_proj");
        sl_add(&l, "mtp.layers.0.mlp.shared_expert_gate");
        sl_add(&l, "mtp.layers.0.self_attn.k_proj");
        sl_add(&l, "mtp.layers.0.self_attn.o_proj");
        sl_add(&l, "mtp.layers.0.self_attn.q_proj");
        sl_add(&l, "mtp.layers.0.self_attn.v_proj");
    }
    *oom |= l.oom;
    if (l.n) qsort(l.v, l.n, sizeof *l.v, cmp_str);
    cJSON_AddItemToObject(q, "exclude", str_array(l.v, l.n));
    sl_free(&l);
    cJSON_AddItemToObject(ex, "kv_cache_group", cJSON_CreateArray());
    raw(ex, "min_kv_scale", "0.0");
    str(ex, "pack_method", "reorder");
    str(ex, "weight_format", "real_quantized");
    cJSON_AddNullToObject(ex, "weight_merge_groups");
    cJSON_AddItemToObject(q, "export", ex);
    cJSON_AddNullToObject(g, "bias");
    cJSON_AddNullToObject(g, "input_tensors");
    cJSON_AddNullToObject(g, "output_tensors");
    cJSON_AddNullToObject(g, "target_device");
    num(w, "ch_axis", -1);
    str(w, "dtype", "int4");
    num(w, "group_size", 128);
    boolean(w, "is_dynamic", false);
    boolean(w, "is_scale_quant", false);
    cJSON_AddNullToObject(w, "mx_element_dtype");
    str(w, "observer_cls", "PerGroupMinMaxObserver");
    str(w, "qscheme", "per_group");
    str(w, "round_method", "half_even");
    cJSON_AddNullToObject(w, "scale_calculation_mode");
    cJSON_AddNullToObject(w, "scale_format");
    str(w, "scale_type", "float");
    boolean(w, "symmetric", true);
    cJSON_AddItemToObject(g, "weight", w);
    cJSON_AddItemToObject(q, "global_quant_config", g);
    boolean(q, "kv_cache_post_rope", false);
    cJSON_AddItemToObject(q, "kv_cache_quant_config", cJSON_CreateObject());
    cJSON_AddItemToObject(q, "layer_quant_config", cJSON_CreateObject());
    cJSON_AddItemToObject(q, "layer_type_quant_config", cJSON_CreateObject());
    str(q, "quant_method", "quark");
    str(q, "quant_mode", "eager_mode");
    cJSON_AddNullToObject(q, "softmax_quant_spec");
    str(q, "version", "0.10");
    return q;
}

static cJSON *awq_block(void) {
    /* AutoAWQ matches modules_to_not_convert as substrings of module names */
    cJSON *q = cJSON_CreateObject(), *skip = cJSON_CreateArray();
    static const char *const keep[] = {"visual", "mtp", "lm_head", "mlp.gate", "shared_expert_gate",
                                       "in_proj_a", "in_proj_b"};
    num(q, "bits", 4);
    num(q, "group_size", 128);
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        cJSON_AddItemToArray(skip, cJSON_CreateString(keep[i]));
    cJSON_AddItemToObject(q, "modules_to_not_convert", skip);
    str(q, "quant_method", "awq");
    str(q, "version", "gemm");
    boolean(q, "zero_point", true);
    return q;
}

/* ---- config.json ---- */

/* text_config: the keys of the released file (docs/architecture.md §2.1); the special ids follow
 * special_base so the tiny shape carries the fixtures' 1000.. ids */
static cJSON *text_config(const epyq_synth_dims *d) {
    cJSON *t = cJSON_CreateObject(), *lt = cJSON_CreateArray(), *rope = cJSON_CreateObject();
    const int32_t B = d->special_base;
    boolean(t, "attention_bias", false);
    raw(t, "attention_dropout", "0.0");
    boolean(t, "attn_output_gate", true);
    num(t, "bos_token_id", B);
    str(t, "dtype", "bfloat16");
    num(t, "eos_token_id", B);
    num(t, "full_attention_interval", 4);
    num(t, "head_dim", d->head_dim);
    str(t, "hidden_act", "silu");
    num(t, "hidden_size", d->hidden);
    raw(t, "initializer_range", "0.02");
    for (int32_t i = 0; i < d->layers; i++)
        cJSON_AddItemToArray(lt, cJSON_CreateString(i % 4 == 3 ? "full_attention" : "linear_attention"));
    cJSON_AddItemToObject(t, "layer_types", lt);
    num(t, "linear_conv_kernel_dim", d->conv_kernel);
    num(t, "linear_key_head_dim", d->lin_k_dim);
    num(t, "linear_num_key_heads", d->lin_k_heads);
    num(t, "linear_num_value_heads", d->lin_v_heads);
    num(t, "linear_value_head_dim", d->lin_v_dim);
    str(t, "mamba_ssm_dtype", "float32");
    num(t, "max_position_embeddings", d->max_pos);
    cJSON_AddItemToObject(t, "mlp_only_layers", cJSON_CreateArray());
    str(t, "model_type", "qwen3_5_moe_text");
    num(t, "moe_intermediate_size", d->moe_inter);
    num(t, "mtp_num_hidden_layers", d->mtp_layers);
    boolean(t, "mtp_use_dedicated_embeddings", false);
    num(t, "num_attention_heads", d->n_q_heads);
    num(t, "num_experts", d->experts);
    num(t, "num_experts_per_tok", d->top_k);
    num(t, "num_hidden_layers", d->layers);
    num(t, "num_key_value_heads", d->n_kv_heads);
    boolean(t, "output_router_logits", false);
    cJSON_AddNullToObject(t, "pad_token_id");
    raw(t, "partial_rotary_factor", "0.25");
    raw(t, "rms_norm_eps", "1e-06");
    boolean(rope, "mrope_interleaved", true);
    cJSON_AddItemToObject(rope, "mrope_section", int_array(d->mrope, 3));
    raw(rope, "partial_rotary_factor", "0.25");
    raw(rope, "rope_theta", "10000000.0");
    str(rope, "rope_type", "default");
    cJSON_AddItemToObject(t, "rope_parameters", rope);
    raw(t, "router_aux_loss_coef", "0.001");
    num(t, "shared_expert_intermediate_size", d->shared_inter);
    boolean(t, "tie_word_embeddings", false);
    boolean(t, "use_cache", true);
    num(t, "vocab_size", d->vocab);
    return t;
}

/* vision_config is written even when no vision tensors are (35b-a3b): loaders read the config
 * of the multimodal class, and the tensor-free tower is the text-only view of the checkpoint */
static cJSON *vision_config(const epyq_synth_dims *d) {
    cJSON *v = cJSON_CreateObject();
    cJSON_AddItemToObject(v, "deepstack_visual_indexes", cJSON_CreateArray());
    num(v, "depth", d->vis_cfg_depth);
    str(v, "hidden_act", "gelu_pytorch_tanh");
    num(v, "hidden_size", d->vis_cfg_hidden);
    num(v, "in_channels", 3);
    raw(v, "initializer_range", "0.02");
    num(v, "intermediate_size", d->vis_cfg_inter);
    str(v, "model_type", "qwen3_5_moe");
    num(v, "num_heads", d->vis_cfg_heads);
    num(v, "num_position_embeddings", d->vis_cfg_pos);
    num(v, "out_hidden_size", d->hidden);
    num(v, "patch_size", 16);
    num(v, "spatial_merge_size", 2);
    num(v, "temporal_patch_size", 2);
    return v;
}

/* preprocessor_config.json with the release's values (docs/vision.md §1): image input reads
 * every processor setting from it */
static epyq_status write_preprocessor(const char *dir, epyq_err *err) {
    cJSON *p = cJSON_CreateObject(), *size = cJSON_CreateObject();
    boolean(p, "do_convert_rgb", true);
    boolean(p, "do_normalize", true);
    boolean(p, "do_rescale", true);
    boolean(p, "do_resize", true);
    raw(p, "image_mean", "[0.5, 0.5, 0.5]");
    str(p, "image_processor_type", "Qwen2VLImageProcessorFast");
    raw(p, "image_std", "[0.5, 0.5, 0.5]");
    num(p, "merge_size", 2);
    num(p, "patch_size", 16);
    str(p, "processor_class", "Qwen3VLProcessor");
    num(p, "resample", 3);
    raw(p, "rescale_factor", "0.00392156862745098");
    num(size, "longest_edge", 16777216);
    num(size, "shortest_edge", 65536);
    cJSON_AddItemToObject(p, "size", size);
    num(p, "temporal_patch_size", 2);
    epyq_status st = dump(dir, "preprocessor_config.json", p, false, err);
    cJSON_Delete(p);
    return st;
}

epyq_status epyq_synth_write_configs(const char *dir, const epyq_synth_dims *d, epyq_synth_format f,
                                     const synth_plan *p, epyq_err *err) {
    (void)p;
    const int32_t B = d->special_base;
    bool oom = false;
    cJSON *c = cJSON_CreateObject(), *arch = cJSON_CreateArray();
    cJSON_AddItemToArray(arch, cJSON_CreateString("Qwen3_5MoeForConditionalGeneration"));
    cJSON_AddItemToObject(c, "architectures", arch);
    num(c, "image_token_id", B + 12);
    str(c, "model_type", "qwen3_5_moe");
    cJSON *qc = NULL;
    switch (f) {
    case EPYQ_SYNTH_GPTQ: qc = gptq_block(d->act_order); break;
    case EPYQ_SYNTH_CT: qc = ct_block(d, &oom); break;
    case EPYQ_SYNTH_QUARK: qc = quark_block(d, &oom); break;
    case EPYQ_SYNTH_AWQ: qc = awq_block(); break;
    default: break;
    }
    if (qc) cJSON_AddItemToObject(c, "quantization_config", qc);
    cJSON_AddItemToObject(c, "text_config", text_config(d));
    boolean(c, "tie_word_embeddings", false);
    str(c, "transformers_version", "4.57.1");
    num(c, "video_token_id", B + 13);
    cJSON_AddItemToObject(c, "vision_config", vision_config(d));
    num(c, "vision_end_token_id", B + 10);
    num(c, "vision_start_token_id", B + 9);
    epyq_status st = oom ? epyq_err_set(err, EPYQ_E_NOMEM, "synth: out of memory") : EPYQ_OK;
    if (!st) st = dump(dir, "config.json", c, true, err);
    /* GPTQModel repeats its block, in its own key order, beside the config */
    if (!st && f == EPYQ_SYNTH_GPTQ) st = dump(dir, "quantize_config.json", qc, false, err);
    cJSON_Delete(c);
    if (st) return st;

    cJSON *g = cJSON_CreateObject(), *eos = cJSON_CreateArray();
    num(g, "bos_token_id", B);
    boolean(g, "do_sample", true);
    cJSON_AddItemToArray(eos, cJSON_CreateNumber(B + 2)); /* <|im_end|>, <|endoftext|> */
    cJSON_AddItemToArray(eos, cJSON_CreateNumber(B));
    cJSON_AddItemToObject(g, "eos_token_id", eos);
    num(g, "pad_token_id", B);
    raw(g, "temperature", "1.0");
    num(g, "top_k", 20);
    raw(g, "top_p", "0.95");
    str(g, "transformers_version", "4.57.1");
    st = dump(dir, "generation_config.json", g, true, err);
    cJSON_Delete(g);
    if (st) return st;
    return write_preprocessor(dir, err);
}
