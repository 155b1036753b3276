/* src/load/model_config.c — config.json (top level + text_config) and generation_config.json
 * (see model_config.h). The quantisation block is handed to qconfig.c. */
#include "load/model_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "load/json.h"
#include "load/qconfig.h"

#define CONFIG_FILE_MAX (16u << 20) /* config files are a few KB; refuse absurd ones */

const char *epyq_qformat_name(epyq_qformat f) {
    switch (f) {
    case EPYQ_QF_NONE: return "bf16";
    case EPYQ_QF_GPTQ: return "gptq";
    case EPYQ_QF_CT: return "ct";
    case EPYQ_QF_QUARK: return "quark";
    case EPYQ_QF_AWQ: return "awq";
    }
    return "?";
}

/* One required (or defaulted) positive integer of text_config, range-checked. */
static epyq_status req_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, bool required, int32_t *out,
                           const char *label, epyq_err *err) {
    int64_t v = *out;
    bool found;
    epyq_status st = epyq_json_get_int(o, key, lo, hi, &v, &found, label, err);
    if (st) return st;
    if (!found && required) return epyq_err_set(err, EPYQ_E_FORMAT, "%s: text_config: missing required key %s", label, key);
    *out = (int32_t)v;
    return EPYQ_OK;
}

/* eos_token_id: an integer or a list of integers. */
static epyq_status parse_eos(const cJSON *it, int32_t vocab, epyq_config *cfg, const char *label, epyq_err *err) {
    int64_t v;
    cfg->n_eos = 0;
    if (cJSON_IsArray(it)) {
        int n = cJSON_GetArraySize(it);
        if (n > EPYQ_MAX_EOS)
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: eos_token_id: %d ids, at most %d supported", label, n, EPYQ_MAX_EOS);
        for (const cJSON *c = it->child; c; c = c->next) {
            if (!epyq_json_as_int(c, 0, vocab - 1, &v))
                return epyq_err_set(err, EPYQ_E_FORMAT, "%s: eos_token_id: expected token ids below vocab_size %d", label,
                                    vocab);
            cfg->eos_ids[cfg->n_eos++] = (int32_t)v;
        }
        return EPYQ_OK;
    }
    if (!epyq_json_as_int(it, 0, vocab - 1, &v))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: eos_token_id: expected a token id below vocab_size %d, found %s",
                            label, vocab, epyq_json_type_name(it));
    cfg->eos_ids[cfg->n_eos++] = (int32_t)v;
    return EPYQ_OK;
}

/* YaRN's keys (transformers _compute_yarn_parameters): factor required; beta_fast 32,
 * beta_slow 1, truncate true by default; attention_factor, else 0.1 ln(factor) + 1 (or the
 * mscale / mscale_all_dim ratio of it when both are given). With
 * original_max_position_embeddings, transformers takes the factor as max_position_embeddings
 * / original when that is above 1 (DeepSeek-V3's convention); Qwen's instruction leaves
 * max_position_embeddings at 262,144 = original and states the factor, which is then used
 * as given (as vLLM does) rather than collapsing to 1. */
static epyq_status parse_yarn(epyq_config *cfg, const cJSON *rp, const char *label, epyq_err *err) {
    epyq_status st;
    bool found = false;
    double factor = 0, af = 0, ms = 0, msa = 0, orig = 0;
    bool have_af = false, have_ms = false, have_msa = false, have_orig = false;
    if ((st = epyq_json_get_num(rp, "factor", 1.0, 1024.0, &factor, &found, label, err))) return st;
    if (!found) return epyq_err_set(err, EPYQ_E_FORMAT, "%s: rope_type yarn needs a factor (>= 1), none given", label);
    cfg->yarn_beta_fast = 32, cfg->yarn_beta_slow = 1, cfg->yarn_truncate = true;
    if ((st = epyq_json_get_num(rp, "beta_fast", 1e-3, 1e6, &cfg->yarn_beta_fast, NULL, label, err))) return st;
    if ((st = epyq_json_get_num(rp, "beta_slow", 1e-3, 1e6, &cfg->yarn_beta_slow, NULL, label, err))) return st;
    if ((st = epyq_json_get_bool(rp, "truncate", &cfg->yarn_truncate, NULL, label, err))) return st;
    if ((st = epyq_json_get_num(rp, "attention_factor", 1e-3, 1e3, &af, &have_af, label, err))) return st;
    if ((st = epyq_json_get_num(rp, "mscale", 0, 1e3, &ms, &have_ms, label, err))) return st;
    if ((st = epyq_json_get_num(rp, "mscale_all_dim", 0, 1e3, &msa, &have_msa, label, err))) return st;
    if ((st = epyq_json_get_num(rp, "original_max_position_embeddings", 1, (double)(1 << 30), &orig, &have_orig, label,
                                err)))
        return st;
    if (have_orig && orig != (double)(int64_t)orig)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: original_max_position_embeddings %g: expected an integer", label, orig);
    cfg->yarn_orig_ctx = have_orig ? (int64_t)orig : cfg->max_position_embeddings;
    if (have_orig && cfg->max_position_embeddings > cfg->yarn_orig_ctx)
        factor = (double)cfg->max_position_embeddings / (double)cfg->yarn_orig_ctx;
    cfg->yarn_factor = factor;
    /* get_mscale(scale, m) = 0.1 m ln(scale) + 1 for scale > 1, else 1 */
    double g1 = factor > 1 ? 0.1 * log(factor) + 1 : 1;
    if (have_af) cfg->yarn_attn_factor = af;
    else if (have_ms && have_msa && ms != 0 && msa != 0)
        cfg->yarn_attn_factor = factor > 1 ? (0.1 * ms * log(factor) + 1) / (0.1 * msa * log(factor) + 1) : 1;
    else cfg->yarn_attn_factor = g1;
    int64_t ext = (int64_t)((double)cfg->yarn_orig_ctx * factor);
    cfg->max_ctx = ext > cfg->max_position_embeddings ? ext : cfg->max_position_embeddings;
    if (cfg->max_ctx > (int64_t)1 << 30) cfg->max_ctx = (int64_t)1 << 30;
    return EPYQ_OK;
}

void epyq_config_rope_freq(const epyq_config *c, double *inv_freq, double *attn_factor) {
    const int32_t rd = c->rotary_dim, half = rd / 2;
    if (attn_factor) *attn_factor = c->yarn ? c->yarn_attn_factor : 1.0;
    for (int32_t i = 0; i < half; i++) inv_freq[i] = pow(c->rope_theta, -2.0 * i / rd);
    if (!c->yarn) return;
    /* the dimension at which a frequency makes n full turns over the original context */
    const double base = c->rope_theta, L = (double)c->yarn_orig_ctx;
    double lo = rd * log(L / (c->yarn_beta_fast * 2 * M_PI)) / (2 * log(base));
    double hi = rd * log(L / (c->yarn_beta_slow * 2 * M_PI)) / (2 * log(base));
    if (c->yarn_truncate) lo = floor(lo), hi = ceil(hi);
    if (lo < 0) lo = 0;
    if (hi > rd - 1) hi = rd - 1;
    if (lo == hi) hi += 0.001;
    for (int32_t i = 0; i < half; i++) {
        /* ramp 0 below lo (extrapolate: keep the frequency), 1 above hi (interpolate: / factor) */
        double ramp = ((double)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extra = 1.0 - ramp;
        double pos_freq = 1.0 / inv_freq[i];
        inv_freq[i] = 1.0 / (c->yarn_factor * pos_freq) * (1.0 - extra) + inv_freq[i] * extra;
    }
}

/* rope_parameters, then rope_scaling, then the text_config top level
 * (docs/architecture.md §2.1). */
static epyq_status parse_rope(epyq_config *cfg, const cJSON *text, const char *label, epyq_err *err) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(text, "rope_parameters");
    if (!cJSON_IsObject(rp)) rp = cJSON_GetObjectItemCaseSensitive(text, "rope_scaling");
    if (rp && !cJSON_IsObject(rp) && !cJSON_IsNull(rp))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: rope_parameters: expected an object, found %s", label,
                            epyq_json_type_name(rp));
    if (!cJSON_IsObject(rp)) rp = NULL;
    epyq_status st;
    cfg->rope_theta = 1e7;
    cfg->partial_rotary_factor = 0.25;
    if ((st = epyq_json_get_num(text, "rope_theta", 1.0, 1e12, &cfg->rope_theta, NULL, label, err))) return st;
    if ((st = epyq_json_get_num(text, "partial_rotary_factor", 1e-6, 1.0, &cfg->partial_rotary_factor, NULL, label, err)))
        return st;
    int32_t sec[3] = {0, 0, 0};
    bool have_sec = false;
    if (rp) {
        const char *type = NULL;
        if ((st = epyq_json_get_str(rp, "rope_type", &type, NULL, label, err))) return st;
        if (!type && (st = epyq_json_get_str(rp, "type", &type, NULL, label, err))) return st;
        cfg->yarn = type && !strcmp(type, "yarn");
        if (type && strcmp(type, "default") != 0 && strcmp(type, "mrope") != 0 && !cfg->yarn)
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: rope_type \"%.32s\" is not supported (default, yarn)", label, type);
        if (cfg->yarn && (st = parse_yarn(cfg, rp, label, err))) return st;
        if ((st = epyq_json_get_num(rp, "rope_theta", 1.0, 1e12, &cfg->rope_theta, NULL, label, err))) return st;
        if ((st = epyq_json_get_num(rp, "partial_rotary_factor", 1e-6, 1.0, &cfg->partial_rotary_factor, NULL, label, err)))
            return st;
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(rp, "mrope_section");
        if (ms && !cJSON_IsNull(ms)) {
            if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) != 3)
                return epyq_err_set(err, EPYQ_E_FORMAT, "%s: mrope_section: expected 3 integers", label);
            int i = 0;
            for (const cJSON *c = ms->child; c; c = c->next, i++) {
                int64_t v;
                if (!epyq_json_as_int(c, 0, 4096, &v))
                    return epyq_err_set(err, EPYQ_E_FORMAT, "%s: mrope_section[%d]: expected an integer in [0, 4096]", label, i);
                sec[i] = (int32_t)v;
            }
            have_sec = true;
        }
    }
    cfg->rotary_dim = (int32_t)(cfg->head_dim * cfg->partial_rotary_factor);
    if (cfg->rotary_dim < 2 || cfg->rotary_dim % 2)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: head_dim %d × partial_rotary_factor %g gives %d rotary dims, need an even number >= 2",
                            label, cfg->head_dim, cfg->partial_rotary_factor, cfg->rotary_dim);
    int32_t half = cfg->rotary_dim / 2;
    if (!have_sec) { /* text positions are equal on all three axes, so only the sum matters */
        sec[1] = sec[2] = half / 3;
        sec[0] = half - 2 * sec[1];
    }
    if (sec[0] + sec[1] + sec[2] != half)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: mrope_section [%d, %d, %d] sums to %d, rotary dims/2 is %d", label,
                            sec[0], sec[1], sec[2], sec[0] + sec[1] + sec[2], half);
    memcpy(cfg->mrope_section, sec, sizeof sec);
    return EPYQ_OK;
}

static epyq_status parse_layer_types(epyq_config *cfg, const cJSON *text, const char *label, epyq_err *err) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(text, "layer_types");
    int32_t interval = 4;
    epyq_status st = req_int(text, "full_attention_interval", 1, EPYQ_MAX_LAYERS, false, &interval, label, err);
    if (st) return st;
    if (!lt || cJSON_IsNull(lt)) {
        for (int32_t i = 0; i < cfg->num_hidden_layers; i++) cfg->full_attn[i] = (i + 1) % interval == 0;
        return EPYQ_OK;
    }
    if (!cJSON_IsArray(lt))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: layer_types: expected an array, found %s", label, epyq_json_type_name(lt));
    int n = cJSON_GetArraySize(lt);
    if (n != cfg->num_hidden_layers)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: layer_types has %d entries, num_hidden_layers is %d", label, n,
                            cfg->num_hidden_layers);
    int i = 0;
    for (const cJSON *c = lt->child; c; c = c->next, i++) {
        if (cJSON_IsString(c) && !strcmp(c->valuestring, "full_attention")) cfg->full_attn[i] = true;
        else if (cJSON_IsString(c) && !strcmp(c->valuestring, "linear_attention")) cfg->full_attn[i] = false;
        else
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: layer_types[%d]: expected \"full_attention\" or \"linear_attention\", found %s%.40s%s",
                                label, i, cJSON_IsString(c) ? "\"" : "", cJSON_IsString(c) ? c->valuestring : epyq_json_type_name(c),
                                cJSON_IsString(c) ? "\"" : "");
    }
    return EPYQ_OK;
}

static epyq_status parse_text(epyq_config *cfg, const cJSON *root, const cJSON *text, const char *label, epyq_err *err) {
    epyq_status st;
    const char *mt = NULL;
    if ((st = epyq_json_get_str(root, "model_type", &mt, NULL, label, err))) return st;
    if (mt && strcmp(mt, "qwen3_5_moe") && strcmp(mt, "qwen3_5_moe_text"))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: model_type \"%.40s\" is not supported (expected qwen3_5_moe)", label, mt);
    if (text != root) {
        mt = NULL;
        if ((st = epyq_json_get_str(text, "model_type", &mt, NULL, label, err))) return st;
        if (mt && strcmp(mt, "qwen3_5_moe_text") && strcmp(mt, "qwen3_5_moe"))
            return epyq_err_set(err, EPYQ_E_FORMAT, "%s: text_config.model_type \"%.40s\" is not supported (expected qwen3_5_moe_text)",
                                label, mt);
    }
    const struct {
        const char *key;
        int32_t *dst;
        int64_t lo, hi;
        bool required;
    } ints[] = {
        {"vocab_size", &cfg->vocab_size, 1, 1 << 24, true},
        {"hidden_size", &cfg->hidden_size, 1, 1 << 16, true},
        {"num_hidden_layers", &cfg->num_hidden_layers, 1, EPYQ_MAX_LAYERS, true},
        {"num_attention_heads", &cfg->num_attention_heads, 1, 1024, true},
        {"num_key_value_heads", &cfg->num_key_value_heads, 1, 1024, true},
        {"head_dim", &cfg->head_dim, 2, 4096, true},
        {"linear_conv_kernel_dim", &cfg->conv_kernel, 1, 64, false},
        {"linear_key_head_dim", &cfg->lin_key_head_dim, 1, 4096, true},
        {"linear_value_head_dim", &cfg->lin_value_head_dim, 1, 4096, true},
        {"linear_num_key_heads", &cfg->lin_num_key_heads, 1, 1024, true},
        {"linear_num_value_heads", &cfg->lin_num_value_heads, 1, 1024, true},
        {"num_experts", &cfg->num_experts, 1, 4096, true},
        {"num_experts_per_tok", &cfg->num_experts_per_tok, 1, 4096, true},
        {"moe_intermediate_size", &cfg->moe_intermediate_size, 1, 1 << 16, true},
        {"shared_expert_intermediate_size", &cfg->shared_expert_intermediate_size, 1, 1 << 16, true},
        {"mtp_num_hidden_layers", &cfg->mtp_num_hidden_layers, 0, 1, false},
    };
    cfg->conv_kernel = 4;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if ((st = req_int(text, ints[i].key, ints[i].lo, ints[i].hi, ints[i].required, ints[i].dst, label, err))) return st;
    if (cfg->num_experts_per_tok > cfg->num_experts)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: num_experts_per_tok %d > num_experts %d", label,
                            cfg->num_experts_per_tok, cfg->num_experts);
    if (cfg->num_attention_heads % cfg->num_key_value_heads)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                            label, cfg->num_attention_heads, cfg->num_key_value_heads);
    if (cfg->lin_num_value_heads % cfg->lin_num_key_heads)
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d",
                            label, cfg->lin_num_value_heads, cfg->lin_num_key_heads);
    int64_t mpe = 262144;
    if ((st = epyq_json_get_int(text, "max_position_embeddings", 1, (int64_t)1 << 30, &mpe, NULL, label, err))) return st;
    cfg->max_position_embeddings = mpe;
    cfg->max_ctx = mpe; /* parse_rope raises it under YaRN */
    cfg->rms_norm_eps = 1e-6;
    if ((st = epyq_json_get_num(text, "rms_norm_eps", 1e-30, 1.0, &cfg->rms_norm_eps, NULL, label, err))) return st;
    cfg->attn_output_gate = true;
    if ((st = epyq_json_get_bool(text, "attn_output_gate", &cfg->attn_output_gate, NULL, label, err))) return st;
    bool ab = false;
    if ((st = epyq_json_get_bool(text, "attention_bias", &ab, NULL, label, err))) return st;
    if (ab) return epyq_err_set(err, EPYQ_E_FORMAT, "%s: attention_bias true is not supported", label);
    const char *act = NULL;
    if ((st = epyq_json_get_str(text, "hidden_act", &act, NULL, label, err))) return st;
    if (act && strcmp(act, "silu"))
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: hidden_act \"%.32s\" is not supported (only silu)", label, act);
    bool tie = false, found;
    if ((st = epyq_json_get_bool(root, "tie_word_embeddings", &tie, NULL, label, err))) return st;
    if ((st = epyq_json_get_bool(text, "tie_word_embeddings", &tie, NULL, label, err))) return st;
    cfg->tie_word_embeddings = tie;
    int64_t bos = -1;
    if ((st = epyq_json_get_int(root, "bos_token_id", 0, cfg->vocab_size - 1, &bos, NULL, label, err))) return st;
    if ((st = epyq_json_get_int(text, "bos_token_id", 0, cfg->vocab_size - 1, &bos, NULL, label, err))) return st;
    cfg->bos_token_id = (int32_t)bos;
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(text, "eos_token_id");
    if (!eos || cJSON_IsNull(eos)) eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (eos && !cJSON_IsNull(eos) && (st = parse_eos(eos, cfg->vocab_size, cfg, label, err))) return st;
    int64_t pad = -1;
    if ((st = epyq_json_get_int(text, "pad_token_id", 0, cfg->vocab_size - 1, &pad, &found, label, err))) return st;
    cfg->pad_token_id = (int32_t)pad;
    if ((st = parse_layer_types(cfg, text, label, err))) return st;
    snprintf(cfg->prefix, sizeof cfg->prefix, "%s", text != root ? "model.language_model." : "model.");
    return parse_rope(cfg, text, label, err);
}

static epyq_status parse_generation(epyq_config *cfg, const char *json, const char *label, epyq_err *err) {
    cJSON *g;
    epyq_status st = epyq_json_parse(&g, json, strlen(json), label, err);
    if (st) return st;
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(g, "eos_token_id");
    if (eos && !cJSON_IsNull(eos) && (st = parse_eos(eos, cfg->vocab_size, cfg, label, err))) goto done;
    int64_t v = cfg->pad_token_id, tk = cfg->top_k;
    if ((st = epyq_json_get_int(g, "pad_token_id", 0, cfg->vocab_size - 1, &v, NULL, label, err))) goto done;
    cfg->pad_token_id = (int32_t)v;
    if ((st = epyq_json_get_bool(g, "do_sample", &cfg->do_sample, NULL, label, err))) goto done;
    if ((st = epyq_json_get_int(g, "top_k", 0, 1 << 24, &tk, NULL, label, err))) goto done;
    cfg->top_k = (int32_t)tk;
    const struct {
        const char *key;
        float *dst;
        double lo, hi;
    } nums[] = {
        {"temperature", &cfg->temperature, 0.0, 100.0},          {"top_p", &cfg->top_p, 0.0, 1.0},
        {"min_p", &cfg->min_p, 0.0, 1.0},                        {"repetition_penalty", &cfg->repetition_penalty, 1e-6, 100.0},
        {"presence_penalty", &cfg->presence_penalty, -100.0, 100.0},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        double d = *nums[i].dst;
        if ((st = epyq_json_get_num(g, nums[i].key, nums[i].lo, nums[i].hi, &d, NULL, label, err))) goto done;
        *nums[i].dst = (float)d;
    }
done:
    cJSON_Delete(g);
    return st;
}

epyq_dims epyq_config_dims(const epyq_config *c) {
    epyq_dims d = {
        .H = c->hidden_size,
        .V = c->vocab_size,
        .L = c->num_hidden_layers,
        .nq = c->num_attention_heads,
        .nkv = c->num_key_value_heads,
        .hd = c->head_dim,
        .rd = c->rotary_dim,
        .Hk = c->lin_num_key_heads,
        .Hv = c->lin_num_value_heads,
        .Dk = c->lin_key_head_dim,
        .Dv = c->lin_value_head_dim,
        .Kc = c->conv_kernel,
        .E = c->num_experts,
        .topk = c->num_experts_per_tok,
        .I = c->moe_intermediate_size,
        .Is = c->shared_expert_intermediate_size,
    };
    d.conv_dim = 2 * d.Hk * d.Dk + d.Hv * d.Dv;
    return d;
}

void epyq_config_free(epyq_config *cfg) {
    if (!cfg) return;
    epyq_qconfig_free(cfg->qc);
    cfg->qc = NULL;
}

epyq_status epyq_config_parse(epyq_config *cfg, const char *config_json, const char *gen_json, const char *extra_qc_json,
                              const char *label, epyq_err *err) {
    memset(cfg, 0, sizeof *cfg);
    /* HF GenerationConfig defaults, used when generation_config.json is absent */
    cfg->temperature = 1.0f;
    cfg->top_p = 1.0f;
    cfg->top_k = 50;
    cfg->repetition_penalty = 1.0f;
    cfg->gptq_version = 1;
    cfg->quark_reorder = true;
    cJSON *root = NULL, *extra = NULL;
    epyq_status st = epyq_json_parse(&root, config_json, strlen(config_json), label, err);
    if (st) return st;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (text && !cJSON_IsObject(text)) {
        st = epyq_err_set(err, EPYQ_E_FORMAT, "%s: text_config: expected an object, found %s", label, epyq_json_type_name(text));
        goto done;
    }
    if (!text) text = root;
    if ((st = parse_text(cfg, root, text, label, err))) goto done;
    if (gen_json && (st = parse_generation(cfg, gen_json, label, err))) goto done;
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (!qc || cJSON_IsNull(qc)) qc = cJSON_GetObjectItemCaseSensitive(text, "quantization_config");
    if ((!qc || cJSON_IsNull(qc)) && extra_qc_json) {
        if ((st = epyq_json_parse(&extra, extra_qc_json, strlen(extra_qc_json), label, err))) goto done;
        qc = extra;
    }
    if (qc && !cJSON_IsNull(qc)) st = epyq_qconfig_parse(cfg, qc, label, err);
done:
    cJSON_Delete(root);
    cJSON_Delete(extra);
    if (st) epyq_config_free(cfg);
    return st;
}

/* Read dir/name if it exists; *out = NULL (and OK) when it does not. */
static epyq_status read_optional(const char *dir, const char *name, char **out, char **path, epyq_err *err) {
    *out = NULL;
    *path = epyq_path_join(dir, name);
    if (!*path) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    FILE *f = fopen(*path, "rb");
    if (!f) return EPYQ_OK;
    fclose(f);
    return epyq_file_read(*path, CONFIG_FILE_MAX, out, NULL, err);
}

epyq_status epyq_config_load(epyq_config *cfg, const char *dir, epyq_err *err) {
    memset(cfg, 0, sizeof *cfg);
    char *cj = NULL, *gj = NULL, *qj = NULL, *cp = NULL, *gp = NULL, *qp = NULL;
    epyq_status st = read_optional(dir, "config.json", &cj, &cp, err);
    if (!st && !cj) st = epyq_err_set(err, EPYQ_E_IO, "%s: no config.json in this folder", dir);
    if (!st) st = read_optional(dir, "generation_config.json", &gj, &gp, err);
    if (!st) st = read_optional(dir, "quantize_config.json", &qj, &qp, err);
    if (!st && !qj) {
        free(qp);
        st = read_optional(dir, "quant_config.json", &qj, &qp, err);
    }
    if (!st) {
        /* The generation file gets its own label so its errors name it. */
        st = epyq_config_parse(cfg, cj, NULL, qj, cp, err);
        if (!st && gj) {
            st = parse_generation(cfg, gj, gp, err);
            if (st) epyq_config_free(cfg);
        }
    }
    free(cj);
    free(gj);
    free(qj);
    free(cp);
    free(gp);
    free(qp);
    return st;
}
