/* tests/unit/test_load_config.c — config.json / generation_config.json / quantization_config
 * variants: what is read, what is derived, and that every unsupported scheme is refused by
 * name (EPYQ_E_QUANT) instead of being loaded "best effort". */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "load/model_config.h"
#include "tests/check_main.h"
#include "tests/files/tiny_ckpt.h"

/* The tiny model's config.json for fmt with the first `from` replaced by `to` (NULL: none). */
static char *variant(epyq_qformat fmt, const char *from, const char *to) {
    tc_opts o = tc_defaults(fmt);
    char *s = tc_config(&o);
    if (!from) return s;
    char *at = strstr(s, from);
    ck_assert_msg(at != NULL, "test bug: '%s' not in config", from);
    size_t n = strlen(s) + strlen(to) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - s), s, to, at + strlen(from));
    free(s);
    return out;
}

static void parse_ok(epyq_config *c, const char *json, const char *gen, const char *extra) {
    epyq_err err = {0};
    ck_assert_msg(epyq_config_parse(c, json, gen, extra, "config.json", &err) == EPYQ_OK, "%s", err.msg);
}

static void refuse(epyq_qformat fmt, const char *from, const char *to, epyq_status want, const char *needle) {
    char *s = variant(fmt, from, to);
    epyq_config c;
    epyq_err err = {0};
    epyq_status st = epyq_config_parse(&c, s, NULL, NULL, "config.json", &err);
    ck_assert_msg(st == want, "'%s' -> '%s': got %s (%s)", from, to, epyq_status_name(st), err.msg);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "'%s' not in: %s", needle, err.msg);
    ck_assert_msg(strstr(err.msg, "config.json") != NULL, "file not named: %s", err.msg);
    free(s);
}

START_TEST(text_config_values) {
    char *s = variant(EPYQ_QF_NONE, NULL, NULL);
    epyq_config c;
    parse_ok(&c, s, NULL, NULL);
    ck_assert_int_eq(c.qformat, EPYQ_QF_NONE);
    ck_assert_ptr_null(c.qc);
    ck_assert_int_eq(c.hidden_size, TC_H);
    ck_assert_int_eq(c.num_hidden_layers, 2);
    ck_assert(!c.full_attn[0] && c.full_attn[1]);
    ck_assert_int_eq(c.rotary_dim, 16);
    ck_assert_int_eq(c.mrope_section[0], 3);
    ck_assert(c.rope_theta == 1e7);
    ck_assert(c.rms_norm_eps == 1e-6);
    ck_assert(c.attn_output_gate);
    ck_assert_int_eq(c.n_eos, 1);
    ck_assert_int_eq(c.eos_ids[0], 30);
    ck_assert_int_eq(c.bos_token_id, -1);
    ck_assert_int_eq(c.mtp_num_hidden_layers, 0);
    ck_assert_str_eq(c.prefix, "model.language_model.");
    /* generation defaults when generation_config.json is absent */
    ck_assert(!c.do_sample);
    ck_assert(c.temperature == 1.0f);
    epyq_qscheme q = epyq_qconfig_for(&c, "model.language_model.layers.0.mlp.experts.0.gate_proj");
    ck_assert(!q.quantized);
    epyq_config_free(&c);
    free(s);
}
END_TEST

START_TEST(text_only_and_derivations) {
    tc_opts o = tc_defaults(EPYQ_QF_NONE);
    o.text_only = true;
    char *s = tc_config(&o);
    epyq_config c;
    parse_ok(&c, s, NULL, NULL);
    ck_assert_str_eq(c.prefix, "model.");
    epyq_config_free(&c);
    free(s);
    /* no layer_types: full attention every full_attention_interval (default 4 -> layer 3 only;
     * interval 2 here -> layer 1) */
    s = variant(EPYQ_QF_NONE, "\"layer_types\": [\"linear_attention\", \"full_attention\"],", "\"full_attention_interval\": 2,");
    parse_ok(&c, s, NULL, NULL);
    ck_assert(!c.full_attn[0] && c.full_attn[1]);
    epyq_config_free(&c);
    free(s);
    /* rope under rope_scaling, theta at the top level, mrope_section absent */
    s = variant(EPYQ_QF_NONE, "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25, \"mrope_section\": [3, 3, 2]}",
                "\"rope_theta\": 5000, \"partial_rotary_factor\": 0.5, \"rope_scaling\": {\"type\": \"mrope\"}");
    parse_ok(&c, s, NULL, NULL);
    ck_assert(c.rope_theta == 5000);
    ck_assert_int_eq(c.rotary_dim, 32);
    ck_assert_int_eq(c.mrope_section[0] + c.mrope_section[1] + c.mrope_section[2], 16);
    epyq_config_free(&c);
    free(s);
}
END_TEST

START_TEST(text_config_refusals) {
    refuse(EPYQ_QF_NONE, "\"hidden_size\": 128, ", "", EPYQ_E_FORMAT, "missing required key hidden_size");
    refuse(EPYQ_QF_NONE, "\"hidden_size\": 128", "\"hidden_size\": \"128\"", EPYQ_E_FORMAT, "hidden_size: expected an integer");
    refuse(EPYQ_QF_NONE, "\"hidden_size\": 128", "\"hidden_size\": -5", EPYQ_E_FORMAT, "hidden_size");
    refuse(EPYQ_QF_NONE, "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9", EPYQ_E_FORMAT, "num_experts_per_tok 9");
    refuse(EPYQ_QF_NONE, "\"num_key_value_heads\": 1", "\"num_key_value_heads\": 3", EPYQ_E_FORMAT, "not a multiple");
    refuse(EPYQ_QF_NONE, "[\"linear_attention\", \"full_attention\"]", "[\"linear_attention\"]", EPYQ_E_FORMAT,
           "layer_types has 1 entries, num_hidden_layers is 2");
    refuse(EPYQ_QF_NONE, "\"full_attention\"]", "\"sliding_attention\"]", EPYQ_E_FORMAT, "layer_types[1]");
    refuse(EPYQ_QF_NONE, "\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"", EPYQ_E_FORMAT, "yarn needs a factor");
    refuse(EPYQ_QF_NONE, "\"rope_type\": \"default\"", "\"rope_type\": \"longrope\"", EPYQ_E_FORMAT,
           "rope_type \"longrope\" is not supported (default, yarn)");
    refuse(EPYQ_QF_NONE, "[3, 3, 2]", "[3, 3, 3]", EPYQ_E_FORMAT, "mrope_section");
    refuse(EPYQ_QF_NONE, "\"eos_token_id\": 30", "\"eos_token_id\": 32", EPYQ_E_FORMAT, "eos_token_id");
    refuse(EPYQ_QF_NONE, "\"model_type\": \"qwen3_5_moe\"", "\"model_type\": \"llama\"", EPYQ_E_FORMAT, "model_type \"llama\"");
    refuse(EPYQ_QF_NONE, "\"text_config\": {", "\"text_config\": 7, \"x\": {", EPYQ_E_FORMAT, "text_config");
    refuse(EPYQ_QF_NONE, "\"mtp_num_hidden_layers\": 0", "\"mtp_num_hidden_layers\": 3", EPYQ_E_FORMAT, "mtp_num_hidden_layers");
    refuse(EPYQ_QF_NONE, "\"vocab_size\": 32, ", "\"vocab_size\": 32, \"vocab_size\": 33, ", EPYQ_E_FORMAT, "duplicate key");
}
END_TEST

START_TEST(generation_config) {
    char *s = variant(EPYQ_QF_NONE, NULL, NULL);
    epyq_config c;
    parse_ok(&c, s, "{\"eos_token_id\": [2, 30], \"pad_token_id\": 0, \"do_sample\": true, \"temperature\": 0.6,"
                    " \"top_k\": 20, \"top_p\": 0.95, \"min_p\": 0.0, \"repetition_penalty\": 1.1}", NULL);
    ck_assert_int_eq(c.n_eos, 2);
    ck_assert_int_eq(c.eos_ids[0], 2);
    ck_assert_int_eq(c.eos_ids[1], 30);
    ck_assert_int_eq(c.pad_token_id, 0);
    ck_assert(c.do_sample);
    ck_assert_float_eq_tol(c.temperature, 0.6f, 1e-7f);
    ck_assert_int_eq(c.top_k, 20);
    ck_assert_float_eq_tol(c.top_p, 0.95f, 1e-7f);
    ck_assert_float_eq_tol(c.repetition_penalty, 1.1f, 1e-7f);
    epyq_config_free(&c);
    epyq_err err;
    ck_assert_int_eq(epyq_config_parse(&c, s, "{\"top_p\": 2.0}", NULL, "config.json", &err), EPYQ_E_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "top_p"));
    ck_assert_int_eq(epyq_config_parse(&c, s, "{\"eos_token_id\": [1,2,3,4,5,6,7,8,9]}", NULL, "config.json", &err),
                     EPYQ_E_FORMAT);
    ck_assert_int_eq(epyq_config_parse(&c, s, "[1]", NULL, "config.json", &err), EPYQ_E_FORMAT);
    free(s);
}
END_TEST

/* ---- quantisation ---- */

#define EXP "model.language_model.layers.0.mlp.experts.0.gate_proj"
#define QKV "model.language_model.layers.0.linear_attn.in_proj_qkv"
#define ROUTER "model.language_model.layers.0.mlp.gate"
#define SHG "model.language_model.layers.0.mlp.shared_expert_gate"
#define SHUP "model.language_model.layers.0.mlp.shared_expert.up_proj"

START_TEST(gptq_variants) {
    char *s = variant(EPYQ_QF_GPTQ, NULL, NULL);
    epyq_config c;
    parse_ok(&c, s, NULL, NULL);
    ck_assert_int_eq(c.qformat, EPYQ_QF_GPTQ);
    ck_assert_int_eq(c.gptq_version, 1);
    epyq_qscheme q = epyq_qconfig_for(&c, EXP);
    ck_assert(q.quantized && q.bits == 4 && q.group_size == 128 && q.sym && !q.desc_act);
    /* "-:.*attn.*" matches linear_attn (re.match: anchored at the start, not the end) */
    ck_assert(!epyq_qconfig_for(&c, QKV).quantized);
    ck_assert(!epyq_qconfig_for(&c, SHUP).quantized);
    ck_assert(!epyq_qconfig_for(&c, "lm_head").quantized); /* lm_head: false by default */
    epyq_config_free(&c);
    free(s);
    s = variant(EPYQ_QF_GPTQ, "\"checkpoint_format\": \"gptq\"", "\"checkpoint_format\": \"gptq_v2\"");
    parse_ok(&c, s, NULL, NULL);
    ck_assert_int_eq(c.gptq_version, 2);
    epyq_config_free(&c);
    free(s);
    /* positive dynamic rule overriding the group size for the experts of layer 1 */
    s = variant(EPYQ_QF_GPTQ, "\"dynamic\": {", "\"dynamic\": {\"+:.*layers\\\\.1\\\\.mlp\\\\.experts.*\": {\"group_size\": 64, \"sym\": false}, ");
    parse_ok(&c, s, NULL, NULL);
    q = epyq_qconfig_for(&c, "model.language_model.layers.1.mlp.experts.3.down_proj");
    ck_assert(q.quantized && q.group_size == 64 && !q.sym);
    ck_assert_int_eq(epyq_qconfig_for(&c, EXP).group_size, 128);
    epyq_config_free(&c);
    free(s);
    /* quantize_config.json fallback when config.json has no block */
    tc_opts o = tc_defaults(EPYQ_QF_NONE);
    s = tc_config(&o);
    parse_ok(&c, s, NULL, "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 32, \"desc_act\": true}");
    ck_assert_int_eq(c.qformat, EPYQ_QF_GPTQ);
    q = epyq_qconfig_for(&c, EXP);
    ck_assert(q.desc_act && q.group_size == 32);
    epyq_config_free(&c);
    free(s);
}
END_TEST

START_TEST(gptq_refusals) {
    refuse(EPYQ_QF_GPTQ, "\"bits\": 4", "\"bits\": 8", EPYQ_E_QUANT, "gptq bits 8");
    refuse(EPYQ_QF_GPTQ, "\"bits\": 4", "\"bits\": 3", EPYQ_E_QUANT, "bits 3");
    refuse(EPYQ_QF_GPTQ, "\"group_size\": 128", "\"group_size\": 256", EPYQ_E_QUANT, "group_size 256");
    refuse(EPYQ_QF_GPTQ, "\"group_size\": 128", "\"group_size\": -1", EPYQ_E_QUANT, "group_size -1");
    refuse(EPYQ_QF_GPTQ, "\"checkpoint_format\": \"gptq\"", "\"checkpoint_format\": \"marlin\"", EPYQ_E_QUANT,
           "checkpoint_format \"marlin\"");
    refuse(EPYQ_QF_GPTQ, "\"pack_dtype\": \"int32\"", "\"pack_dtype\": \"int16\"", EPYQ_E_QUANT, "pack_dtype \"int16\"");
    refuse(EPYQ_QF_GPTQ, "\"dynamic\": {", "\"dynamic\": {\"+:.*experts.*\": {\"bits\": 8}, ", EPYQ_E_QUANT, "bits 8");
    refuse(EPYQ_QF_GPTQ, "\"-:.*attn.*\"", "\"-:.*attn[\"", EPYQ_E_QUANT, "not a valid regex");
    refuse(EPYQ_QF_GPTQ, "\"bits\": 4, ", "", EPYQ_E_QUANT, "lacks bits");
    refuse(EPYQ_QF_GPTQ, "\"sym\": true", "\"sym\": \"yes\"", EPYQ_E_QUANT, "sym");
}
END_TEST

START_TEST(ct_variants) {
    char *s = variant(EPYQ_QF_CT, NULL, NULL);
    epyq_config c;
    parse_ok(&c, s, NULL, NULL);
    ck_assert_int_eq(c.qformat, EPYQ_QF_CT);
    ck_assert(epyq_qconfig_for(&c, EXP).quantized);
    ck_assert(epyq_qconfig_for(&c, QKV).quantized);
    ck_assert(!epyq_qconfig_for(&c, ROUTER).quantized);   /* re:.*mlp\.gate$ */
    ck_assert(!epyq_qconfig_for(&c, SHG).quantized);      /* re:.*shared_expert_gate$ */
    ck_assert(!epyq_qconfig_for(&c, "lm_head").quantized); /* exact */
    ck_assert(epyq_qconfig_for(&c, "model.language_model.layers.0.mlp.gate_x").quantized); /* $ anchors */
    epyq_config_free(&c);
    free(s);
    s = variant(EPYQ_QF_CT, "\"actorder\": \"static\"", "\"actorder\": \"group\"");
    parse_ok(&c, s, NULL, NULL);
    ck_assert(epyq_qconfig_for(&c, EXP).desc_act);
    epyq_config_free(&c);
    free(s);
    s = variant(EPYQ_QF_CT, "\"symmetric\": true", "\"symmetric\": false");
    parse_ok(&c, s, NULL, NULL);
    ck_assert(!epyq_qconfig_for(&c, EXP).sym);
    epyq_config_free(&c);
    free(s);
    /* targets by regex: only the experts */
    s = variant(EPYQ_QF_CT, "\"targets\": [\"Linear\"]", "\"targets\": [\"re:.*experts.*\"]");
    parse_ok(&c, s, NULL, NULL);
    ck_assert(epyq_qconfig_for(&c, EXP).quantized);
    ck_assert(!epyq_qconfig_for(&c, QKV).quantized);
    epyq_config_free(&c);
    free(s);
}
END_TEST

START_TEST(ct_refusals) {
    refuse(EPYQ_QF_CT, "\"format\": \"pack-quantized\"", "\"format\": \"float-quantized\"", EPYQ_E_QUANT,
           "format \"float-quantized\"");
    refuse(EPYQ_QF_CT, "\"format\": \"pack-quantized\"", "\"format\": \"nvfp4-pack-quantized\"", EPYQ_E_QUANT,
           "nvfp4-pack-quantized");
    refuse(EPYQ_QF_CT, "\"input_activations\": null", "\"input_activations\": {\"num_bits\": 8}", EPYQ_E_QUANT,
           "activation quantization");
    refuse(EPYQ_QF_CT, "\"num_bits\": 4", "\"num_bits\": 8", EPYQ_E_QUANT, "bits 8");
    refuse(EPYQ_QF_CT, "\"group_size\": 128", "\"group_size\": 100", EPYQ_E_QUANT, "group_size 100");
    refuse(EPYQ_QF_CT, "\"strategy\": \"group\"", "\"strategy\": \"channel\"", EPYQ_E_QUANT, "strategy \"channel\"");
    refuse(EPYQ_QF_CT, "\"type\": \"int\"", "\"type\": \"float\"", EPYQ_E_QUANT, "type \"float\"");
    refuse(EPYQ_QF_CT, "\"quantization_status\": \"compressed\"", "\"quantization_status\": \"frozen\"", EPYQ_E_QUANT,
           "quantization_status \"frozen\"");
    refuse(EPYQ_QF_CT, "\"actorder\": \"static\"", "\"actorder\": \"sideways\"", EPYQ_E_QUANT, "actorder \"sideways\"");
    refuse(EPYQ_QF_CT, "\"dynamic\": false", "\"dynamic\": true", EPYQ_E_QUANT, "dynamic=true");
    refuse(EPYQ_QF_CT, "\"ignore\": [", "\"kv_cache_scheme\": {\"num_bits\": 8}, \"ignore\": [", EPYQ_E_QUANT,
           "kv_cache_scheme");
    refuse(EPYQ_QF_CT, "\"ignore\": [", "\"ignore\": [\"re:(\", ", EPYQ_E_QUANT, "not a valid regex");
}
END_TEST

/* Issue 13: YaRN as Qwen documents it for contexts past 262,144 (factor 4 over an original
 * context equal to max_position_embeddings) and DeepSeek-V3's spelling (max_position_embeddings
 * raised, factor from the ratio). The frequencies are checked against transformers'
 * _compute_yarn_parameters, transcribed here independently in double. */
static double yarn_ref(double base, int rd, double factor, double L, int i) {
    double lo = floor(rd * log(L / (32 * 2 * M_PI)) / (2 * log(base)));
    double hi = ceil(rd * log(L / (1 * 2 * M_PI)) / (2 * log(base)));
    lo = fmax(lo, 0), hi = fmin(hi, rd - 1);
    double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1), pf = pow(base, 2.0 * i / rd);
    return (1.0 / (factor * pf)) * ramp + (1.0 / pf) * (1 - ramp);
}

START_TEST(rope_yarn) {
    const char *from = "\"rope_type\": \"default\",";
    char *s = variant(EPYQ_QF_NONE, from,
                      "\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 262144,");
    epyq_config c;
    parse_ok(&c, s, NULL, NULL);
    ck_assert(c.yarn && c.yarn_factor == 4.0 && c.yarn_orig_ctx == 262144);
    ck_assert_int_eq(c.max_position_embeddings, 262144);
    ck_assert_int_eq(c.max_ctx, 4 * 262144);
    double f[64], af;
    int half = c.rotary_dim / 2;
    ck_assert_int_le(half, 64);
    epyq_config_rope_freq(&c, f, &af);
    ck_assert(fabs(af - (0.1 * log(4.0) + 1)) < 1e-15);
    int n_kept = 0, n_scaled = 0;
    for (int i = 0; i < half; i++) {
        double want = yarn_ref(c.rope_theta, c.rotary_dim, 4.0, 262144, i);
        ck_assert_msg(fabs(f[i] - want) <= 1e-15 * want, "inv_freq[%d] %.17g, want %.17g", i, f[i], want);
        double plain = pow(c.rope_theta, -2.0 * i / c.rotary_dim);
        n_kept += f[i] == plain, n_scaled += fabs(f[i] * 4 - plain) < 1e-15 * plain;
    }
    ck_assert_msg(n_kept > 0 && n_scaled > 0, "kept %d scaled %d of %d", n_kept, n_scaled, half);
    epyq_config_free(&c);
    free(s);
    /* DeepSeek-V3's spelling: max_position_embeddings 4x the original, the factor follows it */
    s = variant(EPYQ_QF_NONE, from,
                "\"rope_type\": \"yarn\", \"factor\": 8.0, \"original_max_position_embeddings\": 65536,"
                " \"attention_factor\": 1.25,");
    parse_ok(&c, s, NULL, NULL);
    ck_assert(c.yarn_factor == 262144.0 / 65536 && c.yarn_attn_factor == 1.25);
    ck_assert_int_eq(c.max_ctx, 262144);
    epyq_config_free(&c);
    free(s);
    /* without rope scaling the context is max_position_embeddings and the frequencies plain */
    s = variant(EPYQ_QF_NONE, NULL, NULL);
    parse_ok(&c, s, NULL, NULL);
    ck_assert(!c.yarn && c.max_ctx == c.max_position_embeddings);
    epyq_config_rope_freq(&c, f, &af);
    ck_assert(af == 1.0 && f[1] == pow(c.rope_theta, -2.0 / c.rotary_dim));
    epyq_config_free(&c);
    free(s);
}
END_TEST

START_TEST(quark_variants) {
    char *s = variant(EPYQ_QF_QUARK, NULL, NULL);
    epyq_config c;
    parse_ok(&c, s, NULL, NULL);
    ck_assert_int_eq(c.qformat, EPYQ_QF_QUARK);
    ck_assert(c.quark_reorder && c.quark_signed);
    ck_assert(epyq_qconfig_for(&c, EXP).quantized);
    ck_assert(!epyq_qconfig_for(&c, SHUP).quantized); /* glob *shared_expert* */
    ck_assert(!epyq_qconfig_for(&c, SHG).quantized);
    ck_assert(!epyq_qconfig_for(&c, ROUTER).quantized);
    epyq_config_free(&c);
    free(s);
    s = variant(EPYQ_QF_QUARK, "\"dtype\": \"int4\"", "\"dtype\": \"uint4\"");
    char *t = strstr(s, "\"pack_method\": \"reorder\"");
    memcpy(t, "\"pack_method\": \"order\"  ", strlen("\"pack_method\": \"reorder\""));
    parse_ok(&c, s, NULL, NULL);
    ck_assert(!c.quark_reorder && !c.quark_signed);
    epyq_config_free(&c);
    free(s);
}
END_TEST

/* Issue 13: Quark layer_quant_config (name patterns) and layer_type_quant_config ("Linear")
 * replace the global weight spec for the modules they name; a null weight leaves them 16-bit.
 * Exclude still wins, then per-layer, then per-type, then global. */
START_TEST(quark_layer_overrides) {
    const char *spec = "{\"weight\": {\"dtype\": \"int4\", \"qscheme\": \"per_group\", \"group_size\": 64, "
                       "\"ch_axis\": -1, \"symmetric\": true, \"is_dynamic\": false}, \"input_tensors\": null}";
    char to[1024];
    snprintf(to, sizeof to,
             "\"layer_quant_config\": {\"model.language_model.layers.0.mlp.experts.0.gate_proj\": %s, "
             "\"re:.*experts\\\\.1\\\\..*\": {\"weight\": null}, \"*.layers.1.mlp.experts.*\": %s}",
             spec, spec);
    char *s = variant(EPYQ_QF_QUARK, "\"layer_quant_config\": {}", to);
    epyq_config c;
    parse_ok(&c, s, NULL, NULL);
    epyq_qscheme q = epyq_qconfig_for(&c, EXP); /* exact entry */
    ck_assert(q.quantized && q.group_size == 64 && q.sym);
    ck_assert(!epyq_qconfig_for(&c, "model.language_model.layers.0.mlp.experts.1.up_proj").quantized); /* re:, null */
    q = epyq_qconfig_for(&c, "model.language_model.layers.1.mlp.experts.2.down_proj"); /* glob */
    ck_assert(q.quantized && q.group_size == 64);
    q = epyq_qconfig_for(&c, "model.language_model.layers.0.mlp.experts.2.down_proj"); /* global */
    ck_assert(q.quantized && q.group_size == 128);
    ck_assert(!epyq_qconfig_for(&c, SHUP).quantized); /* exclude wins */
    epyq_config_free(&c);
    free(s);
    /* per type: every linear not named per layer */
    snprintf(to, sizeof to, "\"layer_type_quant_config\": {\"Linear\": %s}", spec);
    s = variant(EPYQ_QF_QUARK, "\"layer_quant_config\": {}", to);
    parse_ok(&c, s, NULL, NULL);
    ck_assert_int_eq(epyq_qconfig_for(&c, EXP).group_size, 64);
    ck_assert(!epyq_qconfig_for(&c, ROUTER).quantized);
    epyq_config_free(&c);
    free(s);
}
END_TEST

START_TEST(quark_refusals) {
    refuse(EPYQ_QF_QUARK, "\"dtype\": \"int4\"", "\"dtype\": \"fp8_e4m3\"", EPYQ_E_QUANT, "dtype \"fp8_e4m3\"");
    refuse(EPYQ_QF_QUARK, "\"weight_format\": \"real_quantized\"", "\"weight_format\": \"fake_quantized\"", EPYQ_E_QUANT,
           "fake_quantized");
    refuse(EPYQ_QF_QUARK, "\"pack_method\": \"reorder\"", "\"pack_method\": \"zigzag\"", EPYQ_E_QUANT, "pack_method \"zigzag\"");
    refuse(EPYQ_QF_QUARK, "\"qscheme\": \"per_group\"", "\"qscheme\": \"per_channel\"", EPYQ_E_QUANT, "per_channel");
    refuse(EPYQ_QF_QUARK, "\"group_size\": 128", "\"group_size\": 16", EPYQ_E_QUANT, "group_size 16");
    refuse(EPYQ_QF_QUARK, "\"input_tensors\": null", "\"input_tensors\": {\"dtype\": \"fp8_e4m3\"}", EPYQ_E_QUANT,
           "activation quantization");
    /* per-layer / per-type entries are supported (quark_layer_overrides); refused inside them:
     * a dtype other than the global one, activation specs, types other than Linear */
    refuse(EPYQ_QF_QUARK, "\"layer_quant_config\": {}",
           "\"layer_quant_config\": {\"*experts.1.*\": {\"weight\": {\"dtype\": \"uint4\", \"qscheme\": \"per_group\","
           " \"group_size\": 128, \"ch_axis\": -1, \"symmetric\": false}}}",
           EPYQ_E_QUANT, "layer_quant_config[\"*experts.1.*\"]: weight dtype uint4 differs from the global int4");
    refuse(EPYQ_QF_QUARK, "\"layer_quant_config\": {}",
           "\"layer_quant_config\": {\"*experts.1.*\": {\"input_tensors\": {\"dtype\": \"fp8_e4m3\"}}}", EPYQ_E_QUANT,
           "layer_quant_config[\"*experts.1.*\"].input_tensors is set");
    refuse(EPYQ_QF_QUARK, "\"layer_quant_config\": {}", "\"layer_type_quant_config\": {\"Embedding\": {}}",
           EPYQ_E_QUANT, "layer_type_quant_config[\"Embedding\"]: only \"Linear\"");
    refuse(EPYQ_QF_QUARK, "\"layer_quant_config\": {}",
           "\"layer_quant_config\": {\"*experts.1.*\": {\"weight\": {\"dtype\": \"int4\", \"qscheme\": \"per_channel\"}}}",
           EPYQ_E_QUANT, "layer_quant_config[\"*experts.1.*\"] qscheme \"per_channel\"");
    refuse(EPYQ_QF_QUARK, "\"ch_axis\": -1", "\"ch_axis\": 0", EPYQ_E_QUANT, "ch_axis 0");
    refuse(EPYQ_QF_QUARK, "\"is_dynamic\": false", "\"is_dynamic\": true", EPYQ_E_QUANT, "is_dynamic");
    refuse(EPYQ_QF_QUARK, "\"export\": {", "\"exporx\": {", EPYQ_E_QUANT, "no export block");
}
END_TEST

START_TEST(awq_and_unknown) {
    char *s = variant(EPYQ_QF_AWQ, NULL, NULL);
    epyq_config c;
    parse_ok(&c, s, NULL, NULL);
    ck_assert_int_eq(c.qformat, EPYQ_QF_AWQ);
    epyq_qscheme q = epyq_qconfig_for(&c, EXP);
    ck_assert(q.quantized && !q.sym);
    ck_assert(!epyq_qconfig_for(&c, QKV).quantized);   /* substring "attn" */
    ck_assert(!epyq_qconfig_for(&c, ROUTER).quantized); /* substring "mlp.gate" */
    epyq_config_free(&c);
    free(s);
    s = variant(EPYQ_QF_AWQ, "\"bits\": 4, \"group_size\": 128", "\"w_bit\": 4, \"q_group_size\": 64");
    parse_ok(&c, s, NULL, NULL);
    ck_assert_int_eq(epyq_qconfig_for(&c, EXP).group_size, 64);
    epyq_config_free(&c);
    free(s);
    refuse(EPYQ_QF_AWQ, "\"version\": \"gemm\"", "\"version\": \"gemv_fast\"", EPYQ_E_QUANT, "version \"gemv_fast\"");
    refuse(EPYQ_QF_AWQ, "\"zero_point\": true", "\"zero_point\": false", EPYQ_E_QUANT, "zero_point=false");
    refuse(EPYQ_QF_AWQ, "\"bits\": 4", "\"bits\": 2", EPYQ_E_QUANT, "awq bits 2");
    refuse(EPYQ_QF_AWQ, "\"quant_method\": \"awq\"", "\"quant_method\": \"fp8\"", EPYQ_E_QUANT, "quant_method \"fp8\"");
    refuse(EPYQ_QF_AWQ, "\"quant_method\": \"awq\"", "\"quant_method\": \"bitsandbytes\"", EPYQ_E_QUANT, "bitsandbytes");
    refuse(EPYQ_QF_AWQ, "\"quant_method\": \"awq\", ", "", EPYQ_E_QUANT, "no quant_method");
    refuse(EPYQ_QF_AWQ, "\"quant_method\": \"awq\"", "\"quant_method\": 4", EPYQ_E_QUANT, "quant_method");
    refuse(EPYQ_QF_AWQ, "\"quantization_config\": {", "\"quantization_config\": [{", EPYQ_E_FORMAT, "config.json");
}
END_TEST

int main(void) {
    Suite *s = suite_create("load_config");
    TCase *tc = epyq_test_case(s, "config", 0);
    EPYQ_TESTS_ADD(tc, text_config_values, text_only_and_derivations, text_config_refusals,
                   generation_config, gptq_variants, gptq_refusals, ct_variants, ct_refusals,
                   quark_variants, quark_refusals, quark_layer_overrides, rope_yarn,
                   awq_and_unknown);
    return epyq_test_run(s);
}
