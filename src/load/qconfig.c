/* src/load/qconfig.c — quantization_config: detection, refusal by name, per-module rules
 * (see qconfig.h and docs/quant-formats.md §4.1, §5.1, §6.1, §7). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "load/qconfig.h"

#include <fnmatch.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "load/json.h"

/* How a name pattern from the config is compared with a module name. */
typedef enum {
    M_EXACT,  /* equal strings (CT ignore/targets, Quark exclude) */
    M_REGEX,  /* Python re.match: anchored at the start only */
    M_GLOB,   /* Quark's fnmatch-style '*' entries */
    M_SUBSTR, /* AutoAWQ modules_to_not_convert: `key in name` */
    M_LINEAR, /* compressed-tensors class target "Linear": every linear module */
} match_kind;

typedef struct {
    match_kind kind;
    char *pat;
    pcre2_code *re;
} matcher;

typedef struct {
    bool negative;     /* GPTQ "-:" rule: matching modules are not quantized */
    matcher m;
    epyq_qscheme sch;  /* positive rule: scheme for matching modules */
} rule;

struct epyq_qconfig {
    epyq_qscheme base;
    rule *rules;       /* [nrules] GPTQ dynamic (file order) or CT config groups' targets */
    size_t nrules;
    matcher *excl;     /* [nexcl] ignore / exclude / modules_to_not_convert */
    size_t nexcl;
    bool lm_head;      /* GPTQ: lm_head quantized */
    pcre2_match_context *mctx;
};

static const int32_t supported_gs[] = {32, 64, 128};

static void matcher_free(matcher *m) {
    free(m->pat);
    if (m->re) pcre2_code_free(m->re);
}

void epyq_qconfig_free(epyq_qconfig *qc) {
    if (!qc) return;
    for (size_t i = 0; i < qc->nrules; i++) matcher_free(&qc->rules[i].m);
    for (size_t i = 0; i < qc->nexcl; i++) matcher_free(&qc->excl[i]);
    free(qc->rules);
    free(qc->excl);
    if (qc->mctx) pcre2_match_context_free(qc->mctx);
    free(qc);
}

epyq_qscheme epyq_qconfig_base(const epyq_qconfig *qc) {
    epyq_qscheme none = {0};
    return qc ? qc->base : none;
}

static epyq_status matcher_init(matcher *m, match_kind kind, const char *pat, const char *label, epyq_err *err) {
    m->kind = kind;
    m->re = NULL;
    m->pat = strdup(pat);
    if (!m->pat) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
    if (kind != M_REGEX) return EPYQ_OK;
    int ec;
    PCRE2_SIZE off;
    m->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED | PCRE2_UTF, &ec, &off, NULL);
    if (!m->re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: module pattern \"%.80s\" is not a valid regex (%s at %zu)", label, pat,
                            (const char *)msg, (size_t)off);
    }
    return EPYQ_OK;
}

static bool matcher_hit(const epyq_qconfig *qc, const matcher *m, const char *name) {
    switch (m->kind) {
    case M_EXACT: return !strcmp(m->pat, name);
    case M_SUBSTR: return strstr(name, m->pat) != NULL;
    case M_GLOB: return fnmatch(m->pat, name, 0) == 0;
    case M_LINEAR: return true;
    case M_REGEX: {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(m->re, NULL);
        if (!md) return false;
        int rc = pcre2_match(m->re, (PCRE2_SPTR)name, PCRE2_ZERO_TERMINATED, 0, 0, md, qc->mctx);
        pcre2_match_data_free(md);
        return rc >= 0;
    }
    }
    return false;
}

epyq_qscheme epyq_qconfig_for(const epyq_config *cfg, const char *module) {
    epyq_qscheme none = {0};
    const epyq_qconfig *qc = cfg->qc;
    if (!qc || cfg->qformat == EPYQ_QF_NONE) return none;
    for (size_t i = 0; i < qc->nexcl; i++)
        if (matcher_hit(qc, &qc->excl[i], module)) return none;
    if (cfg->qformat == EPYQ_QF_GPTQ) {
        const char *dot = strrchr(module, '.');
        if (!qc->lm_head && !strcmp(dot ? dot + 1 : module, "lm_head")) return none;
        for (size_t i = 0; i < qc->nrules; i++)
            if (matcher_hit(qc, &qc->rules[i].m, module)) return qc->rules[i].negative ? none : qc->rules[i].sch;
        return qc->base;
    }
    if (cfg->qformat == EPYQ_QF_CT) {
        for (size_t i = 0; i < qc->nrules; i++)
            if (matcher_hit(qc, &qc->rules[i].m, module)) return qc->rules[i].sch;
        return none;
    }
    if (cfg->qformat == EPYQ_QF_QUARK) /* layer_quant_config, then layer_type_quant_config */
        for (size_t i = 0; i < qc->nrules; i++)
            if (matcher_hit(qc, &qc->rules[i].m, module)) return qc->rules[i].negative ? none : qc->rules[i].sch;
    return qc->base;
}

/* ---- shared field checks ---- */

static epyq_status check_bits_gs(int64_t bits, int64_t gs, const char *what, const char *label, epyq_err *err) {
    if (bits != 4)
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: %s bits %lld is not supported (only 4-bit weights)", label, what,
                            (long long)bits);
    for (size_t i = 0; i < sizeof supported_gs / sizeof supported_gs[0]; i++)
        if (gs == supported_gs[i]) return EPYQ_OK;
    return epyq_err_set(err, EPYQ_E_QUANT, "%s: %s group_size %lld is not supported (supported: 32, 64, 128)", label, what,
                        (long long)gs);
}

/* A key whose only accepted values are null / absent / {} / [] / false. */
static epyq_status must_be_empty(const cJSON *obj, const char *key, const char *why, const char *label, epyq_err *err) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it || cJSON_IsNull(it) || cJSON_IsFalse(it)) return EPYQ_OK;
    if ((cJSON_IsObject(it) || cJSON_IsArray(it)) && !it->child) return EPYQ_OK;
    return epyq_err_set(err, EPYQ_E_QUANT, "%s: quantization_config.%s is set: %s is not supported", label, key, why);
}

static epyq_status str_list(epyq_qconfig *qc, const cJSON *arr, const char *key, bool quark_glob, bool substr,
                            const char *label, epyq_err *err) {
    if (!arr || cJSON_IsNull(arr)) return EPYQ_OK;
    if (!cJSON_IsArray(arr))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: quantization_config.%s: expected a list of names, found %s", label, key,
                            epyq_json_type_name(arr));
    size_t n = (size_t)cJSON_GetArraySize(arr);
    matcher *m = realloc(qc->excl, (qc->nexcl + n) * sizeof *m);
    if (n && !m) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
    qc->excl = m;
    for (const cJSON *c = arr->child; c; c = c->next) {
        if (!cJSON_IsString(c))
            return epyq_err_set(err, EPYQ_E_QUANT, "%s: quantization_config.%s: expected strings, found %s", label, key,
                                epyq_json_type_name(c));
        const char *s = c->valuestring;
        match_kind k = substr ? M_SUBSTR : M_EXACT;
        if (!strncmp(s, "re:", 3)) k = M_REGEX, s += 3;
        else if (quark_glob && strpbrk(s, "*?[")) k = M_GLOB;
        epyq_status st = matcher_init(&qc->excl[qc->nexcl], k, s, label, err);
        qc->nexcl += st == EPYQ_OK || qc->excl[qc->nexcl].pat; /* keep it for freeing */
        if (st) return st;
    }
    return EPYQ_OK;
}

/* ---- GPTQ (docs/quant-formats.md §4) ---- */

static epyq_status gptq_overrides(epyq_qscheme *s, const cJSON *o, const char *key, const char *label, epyq_err *err) {
    if (!cJSON_IsObject(o))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: dynamic[\"%.80s\"]: expected an object, found %s", label, key,
                            epyq_json_type_name(o));
    int64_t bits = s->bits, gs = s->group_size;
    epyq_status st;
    if ((st = epyq_json_get_int(o, "bits", 0, 64, &bits, NULL, label, err))) return st;
    if ((st = epyq_json_get_int(o, "group_size", -1, 1 << 20, &gs, NULL, label, err))) return st;
    if ((st = epyq_json_get_bool(o, "sym", &s->sym, NULL, label, err))) return st;
    if ((st = epyq_json_get_bool(o, "desc_act", &s->desc_act, NULL, label, err))) return st;
    char what[128];
    snprintf(what, sizeof what, "dynamic[\"%.80s\"]", key);
    if ((st = check_bits_gs(bits, gs, what, label, err))) return st;
    s->bits = (int32_t)bits;
    s->group_size = (int32_t)gs;
    return EPYQ_OK;
}

static epyq_status parse_gptq(epyq_config *cfg, epyq_qconfig *qc, const cJSON *q, const char *label, epyq_err *err) {
    int64_t bits = 0, gs = 0;
    bool fb, fg;
    epyq_status st;
    if ((st = epyq_json_get_int(q, "bits", 0, 64, &bits, &fb, label, err))) return st;
    if ((st = epyq_json_get_int(q, "group_size", -1, 1 << 20, &gs, &fg, label, err))) return st;
    if (!fb || !fg) return epyq_err_set(err, EPYQ_E_QUANT, "%s: gptq quantization_config lacks %s", label, fb ? "group_size" : "bits");
    if ((st = check_bits_gs(bits, gs, "gptq", label, err))) return st;
    qc->base = (epyq_qscheme){.quantized = true, .bits = 4, .group_size = (int32_t)gs, .sym = true};
    if ((st = epyq_json_get_bool(q, "sym", &qc->base.sym, NULL, label, err))) return st;
    if ((st = epyq_json_get_bool(q, "desc_act", &qc->base.desc_act, NULL, label, err))) return st;
    if ((st = epyq_json_get_bool(q, "lm_head", &qc->lm_head, NULL, label, err))) return st;
    const char *fmt = NULL;
    if ((st = epyq_json_get_str(q, "checkpoint_format", &fmt, NULL, label, err))) return st;
    if (!fmt && (st = epyq_json_get_str(q, "format", &fmt, NULL, label, err))) return st;
    if (!fmt || !strcmp(fmt, "gptq")) cfg->gptq_version = 1;
    else if (!strcmp(fmt, "gptq_v2")) cfg->gptq_version = 2;
    else
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: gptq checkpoint_format \"%.40s\" is not supported (gptq, gptq_v2)", label, fmt);
    const char *pd = NULL;
    if ((st = epyq_json_get_str(q, "pack_dtype", &pd, NULL, label, err))) return st;
    if (pd && strcmp(pd, "int32"))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: gptq pack_dtype \"%.20s\" is not supported (only int32)", label, pd);
    const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(q, "dynamic");
    if (!dyn || cJSON_IsNull(dyn)) return EPYQ_OK;
    if (!cJSON_IsObject(dyn))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: gptq dynamic: expected an object, found %s", label, epyq_json_type_name(dyn));
    size_t n = (size_t)cJSON_GetArraySize(dyn);
    qc->rules = calloc(n ? n : 1, sizeof *qc->rules);
    if (!qc->rules) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
    for (const cJSON *c = dyn->child; c; c = c->next) {
        rule *r = &qc->rules[qc->nrules];
        const char *pat = c->string;
        r->negative = !strncmp(pat, "-:", 2);
        if (r->negative || !strncmp(pat, "+:", 2)) pat += 2;
        r->sch = qc->base;
        if (!r->negative && (st = gptq_overrides(&r->sch, c, c->string, label, err))) return st;
        st = matcher_init(&r->m, M_REGEX, pat, label, err);
        qc->nrules += r->m.pat != NULL;
        if (st) return st;
    }
    return EPYQ_OK;
}

/* ---- compressed-tensors (docs/quant-formats.md §5) ---- */

static epyq_status ct_group(epyq_qconfig *qc, const cJSON *g, const char *label, epyq_err *err) {
    const char *gname = g->string;
    if (!cJSON_IsObject(g))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: config_groups.%s: expected an object", label, gname);
    epyq_status st;
    const char *fmt = NULL;
    if ((st = epyq_json_get_str(g, "format", &fmt, NULL, label, err))) return st;
    if (fmt && strcmp(fmt, "pack-quantized"))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: config_groups.%s format \"%.40s\" is not supported (only pack-quantized)",
                            label, gname, fmt);
    if ((st = must_be_empty(g, "input_activations", "activation quantization (W4A16 only)", label, err))) return st;
    if ((st = must_be_empty(g, "output_activations", "output activation quantization", label, err))) return st;
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
    if (!cJSON_IsObject(w))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: config_groups.%s.weights: expected an object, found %s", label, gname,
                            epyq_json_type_name(w));
    int64_t bits = 0, gs = 0;
    if ((st = epyq_json_get_int(w, "num_bits", 0, 64, &bits, NULL, label, err))) return st;
    if ((st = epyq_json_get_int(w, "group_size", -1, 1 << 20, &gs, NULL, label, err))) return st;
    const char *type = "int", *strategy = NULL, *actorder = NULL;
    if ((st = epyq_json_get_str(w, "type", &type, NULL, label, err))) return st;
    if (strcmp(type, "int"))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: config_groups.%s weights type \"%.20s\" is not supported (only int)", label,
                            gname, type);
    if ((st = epyq_json_get_str(w, "strategy", &strategy, NULL, label, err))) return st;
    if (!strategy || strcmp(strategy, "group"))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: config_groups.%s weights strategy \"%.20s\" is not supported (only group)",
                            label, gname, strategy ? strategy : "(absent)");
    char what[96];
    snprintf(what, sizeof what, "compressed-tensors %.60s", gname);
    if ((st = check_bits_gs(bits, gs, what, label, err))) return st;
    bool dyn = false;
    if ((st = epyq_json_get_bool(w, "dynamic", &dyn, NULL, label, err))) return st;
    if (dyn) return epyq_err_set(err, EPYQ_E_QUANT, "%s: config_groups.%s weights dynamic=true is not supported", label, gname);
    if ((st = must_be_empty(w, "block_structure", "block quantization", label, err))) return st;
    epyq_qscheme s = {.quantized = true, .bits = 4, .group_size = (int32_t)gs, .sym = true};
    if ((st = epyq_json_get_bool(w, "symmetric", &s.sym, NULL, label, err))) return st;
    const cJSON *ao = cJSON_GetObjectItemCaseSensitive(w, "actorder");
    if (cJSON_IsString(ao)) actorder = ao->valuestring;
    else if (ao && !cJSON_IsNull(ao) && !cJSON_IsBool(ao))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: config_groups.%s actorder: expected a string, found %s", label, gname,
                            epyq_json_type_name(ao));
    /* "static"/"weight" only change calibration; "group"/"dynamic" store weight_g_idx. */
    if (actorder && strcmp(actorder, "static") && strcmp(actorder, "weight") && strcmp(actorder, "group") &&
        strcmp(actorder, "dynamic"))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: config_groups.%s actorder \"%.20s\" is not supported", label, gname, actorder);
    s.desc_act = (actorder && (!strcmp(actorder, "group") || !strcmp(actorder, "dynamic"))) || cJSON_IsTrue(ao);
    const cJSON *tg = cJSON_GetObjectItemCaseSensitive(g, "targets");
    if (!cJSON_IsArray(tg) || !tg->child)
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: config_groups.%s.targets: expected a non-empty list", label, gname);
    size_t n = (size_t)cJSON_GetArraySize(tg);
    rule *r = realloc(qc->rules, (qc->nrules + n) * sizeof *r);
    if (!r) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
    qc->rules = r;
    for (const cJSON *c = tg->child; c; c = c->next) {
        if (!cJSON_IsString(c))
            return epyq_err_set(err, EPYQ_E_QUANT, "%s: config_groups.%s.targets: expected strings", label, gname);
        const char *t = c->valuestring;
        match_kind k = !strcmp(t, "Linear") ? M_LINEAR : !strncmp(t, "re:", 3) ? M_REGEX : M_EXACT;
        rule *x = &qc->rules[qc->nrules];
        x->negative = false;
        x->sch = s;
        st = matcher_init(&x->m, k, k == M_REGEX ? t + 3 : t, label, err);
        qc->nrules += x->m.pat != NULL;
        if (st) return st;
    }
    if (!qc->base.quantized) qc->base = s;
    return EPYQ_OK;
}

static epyq_status parse_ct(epyq_qconfig *qc, const cJSON *q, const char *label, epyq_err *err) {
    epyq_status st;
    const char *fmt = NULL, *status = NULL;
    if ((st = epyq_json_get_str(q, "format", &fmt, NULL, label, err))) return st;
    if (fmt && strcmp(fmt, "pack-quantized"))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: compressed-tensors format \"%.40s\" is not supported (only pack-quantized)",
                            label, fmt);
    if ((st = epyq_json_get_str(q, "quantization_status", &status, NULL, label, err))) return st;
    if (status && strcmp(status, "compressed"))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: compressed-tensors quantization_status \"%.40s\" is not supported (weights must be compressed)",
                            label, status);
    if ((st = must_be_empty(q, "kv_cache_scheme", "KV-cache quantization", label, err))) return st;
    if ((st = must_be_empty(q, "sparsity_config", "sparsity compression", label, err))) return st;
    if ((st = must_be_empty(q, "transform_config", "weight transforms", label, err))) return st;
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(q, "config_groups");
    if (!cJSON_IsObject(groups) || !groups->child)
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: compressed-tensors config_groups: expected a non-empty object", label);
    for (const cJSON *g = groups->child; g; g = g->next)
        if ((st = ct_group(qc, g, label, err))) return st;
    return str_list(qc, cJSON_GetObjectItemCaseSensitive(q, "ignore"), "ignore", false, false, label, err);
}

/* ---- Quark (docs/quant-formats.md §6) ---- */

/* One Quark weight spec (the global one or a layer_quant_config / layer_type_quant_config
 * entry's): int4 (signed, symmetric) or uint4 per_group along the inputs, static, integer
 * zero points. */
static epyq_status quark_weight(const cJSON *w, const char *where, epyq_qscheme *out, bool *is_signed,
                                const char *label, epyq_err *err) {
    epyq_status st;
    if (!cJSON_IsObject(w))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: quark %s.weight: expected one object, found %s", label, where,
                            epyq_json_type_name(w));
    const char *dt = NULL, *qs = NULL, *zpt = NULL;
    if ((st = epyq_json_get_str(w, "dtype", &dt, NULL, label, err))) return st;
    bool uint4 = dt && !strcmp(dt, "uint4");
    if (!dt || (strcmp(dt, "int4") && !uint4))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: quark %s weight dtype \"%.40s\" is not supported (int4, uint4)", label,
                            where, dt ? dt : "(absent)");
    if ((st = epyq_json_get_str(w, "qscheme", &qs, NULL, label, err))) return st;
    if (!qs || strcmp(qs, "per_group"))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: quark %s qscheme \"%.40s\" is not supported (only per_group)", label,
                            where, qs ? qs : "(absent)");
    int64_t gs = 0, axis = -1;
    if ((st = epyq_json_get_int(w, "group_size", -1, 1 << 20, &gs, NULL, label, err))) return st;
    if ((st = epyq_json_get_int(w, "ch_axis", -8, 8, &axis, NULL, label, err))) return st;
    if (axis != -1 && axis != 1)
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: quark %s ch_axis %lld is not supported (groups must run along inputs: -1)",
                            label, where, (long long)axis);
    if ((st = check_bits_gs(4, gs, "quark", label, err))) return st;
    bool dyn = false;
    if ((st = epyq_json_get_bool(w, "is_dynamic", &dyn, NULL, label, err))) return st;
    if (dyn) return epyq_err_set(err, EPYQ_E_QUANT, "%s: quark %s is_dynamic=true is not supported", label, where);
    if ((st = epyq_json_get_str(w, "zero_point_type", &zpt, NULL, label, err))) return st;
    if (zpt && strcmp(zpt, "int32"))
        return epyq_err_set(err, EPYQ_E_QUANT,
                            "%s: quark %s zero_point_type \"%.20s\" is not supported (integer zero points only)", label,
                            where, zpt);
    if ((st = must_be_empty(w, "mx_element_dtype", "MX formats", label, err))) return st;
    *is_signed = !uint4;
    *out = (epyq_qscheme){.quantized = true, .bits = 4, .group_size = (int32_t)gs, .sym = !uint4};
    return epyq_json_get_bool(w, "symmetric", &out->sym, NULL, label, err);
}

/* layer_quant_config (module-name patterns: exact, fnmatch '*', or "re:") or
 * layer_type_quant_config (class names; every linear here is a "Linear"): each value is a
 * whole Quark config whose weight spec replaces the global one for the modules it names; a
 * null weight leaves them 16-bit. Activation/output/bias specs are refused as globally.
 * The nibble encoding (int4 two's complement vs uint4) is decoded per checkpoint, so an
 * entry must keep the global dtype. */
static epyq_status quark_overrides(epyq_qconfig *qc, const cJSON *q, const char *key, bool sgn, const char *label,
                                   epyq_err *err) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(q, key);
    if (!o || cJSON_IsNull(o)) return EPYQ_OK;
    if (!cJSON_IsObject(o))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: quark %s: expected an object, found %s", label, key,
                            epyq_json_type_name(o));
    bool by_type = !strcmp(key, "layer_type_quant_config");
    epyq_status st;
    for (const cJSON *e = o->child; e; e = e->next) {
        char where[160];
        snprintf(where, sizeof where, "%s[\"%.100s\"]", key, e->string);
        if (!cJSON_IsObject(e))
            return epyq_err_set(err, EPYQ_E_QUANT, "%s: quark %s: expected a quantization config object, found %s", label,
                                where, epyq_json_type_name(e));
        if (by_type && strcmp(e->string, "Linear"))
            return epyq_err_set(err, EPYQ_E_QUANT,
                                "%s: quark %s: only \"Linear\" is supported (the text model's quantizable modules are "
                                "all linears)", label, where);
        static const char *const acts[] = {"input_tensors", "output_tensors", "bias"};
        for (int i = 0; i < 3; i++) {
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, acts[i]);
            if (a && !cJSON_IsNull(a) && !((cJSON_IsObject(a) || cJSON_IsArray(a)) && !a->child))
                return epyq_err_set(err, EPYQ_E_QUANT, "%s: quark %s.%s is set: only weight quantization is supported",
                                    label, where, acts[i]);
        }
        epyq_qscheme sch = {0};
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(e, "weight");
        if (w && !cJSON_IsNull(w)) {
            bool esgn = sgn;
            if ((st = quark_weight(w, where, &sch, &esgn, label, err))) return st;
            if (esgn != sgn)
                return epyq_err_set(err, EPYQ_E_QUANT,
                                    "%s: quark %s: weight dtype %s differs from the global %s; one checkpoint decodes "
                                    "one nibble encoding", label, where, esgn ? "int4" : "uint4", sgn ? "int4" : "uint4");
        }
        rule *r = realloc(qc->rules, (qc->nrules + 1) * sizeof *r);
        if (!r) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
        qc->rules = r;
        const char *pat = e->string;
        match_kind k = by_type ? M_LINEAR : !strncmp(pat, "re:", 3) ? M_REGEX : strpbrk(pat, "*?[") ? M_GLOB : M_EXACT;
        rule *x = &qc->rules[qc->nrules];
        x->negative = !sch.quantized;
        x->sch = sch;
        st = matcher_init(&x->m, k, k == M_REGEX ? pat + 3 : pat, label, err);
        qc->nrules += x->m.pat != NULL;
        if (st) return st;
    }
    return EPYQ_OK;
}


static epyq_status parse_quark(epyq_config *cfg, epyq_qconfig *qc, const cJSON *q, const char *label, epyq_err *err) {
    epyq_status st;
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(q, "export");
    if (!cJSON_IsObject(ex)) return epyq_err_set(err, EPYQ_E_QUANT, "%s: quark config has no export block", label);
    const char *wf = NULL, *pm = NULL;
    if ((st = epyq_json_get_str(ex, "weight_format", &wf, NULL, label, err))) return st;
    if (!wf || strcmp(wf, "real_quantized"))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: quark weight_format \"%.40s\" is not supported (only real_quantized)", label,
                            wf ? wf : "(absent)");
    if ((st = epyq_json_get_str(ex, "pack_method", &pm, NULL, label, err))) return st;
    if (!pm || !strcmp(pm, "reorder")) cfg->quark_reorder = true;
    else if (!strcmp(pm, "order")) cfg->quark_reorder = false;
    else return epyq_err_set(err, EPYQ_E_QUANT, "%s: quark pack_method \"%.40s\" is not supported (reorder, order)", label, pm);
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(q, "global_quant_config");
    if (!cJSON_IsObject(g)) return epyq_err_set(err, EPYQ_E_QUANT, "%s: quark global_quant_config: expected an object", label);
    if ((st = must_be_empty(g, "input_tensors", "activation quantization (W4A16 only)", label, err))) return st;
    if ((st = must_be_empty(g, "output_tensors", "output quantization", label, err))) return st;
    if ((st = must_be_empty(g, "bias", "bias quantization", label, err))) return st;
    if ((st = must_be_empty(q, "kv_cache_quant_config", "KV-cache quantization", label, err))) return st;
    if ((st = must_be_empty(q, "softmax_quant_spec", "softmax quantization", label, err))) return st;
    bool sgn = false;
    if ((st = quark_weight(cJSON_GetObjectItemCaseSensitive(g, "weight"), "global_quant_config", &qc->base, &sgn, label,
                           err)))
        return st;
    cfg->quark_signed = sgn;
    /* per-layer entries first (Quark looks a module up by name before its type), then per type */
    if ((st = quark_overrides(qc, q, "layer_quant_config", sgn, label, err))) return st;
    if ((st = quark_overrides(qc, q, "layer_type_quant_config", sgn, label, err))) return st;
    return str_list(qc, cJSON_GetObjectItemCaseSensitive(q, "exclude"), "exclude", true, false, label, err);
}

/* ---- AutoAWQ GEMM (docs/quant-formats.md §7) ---- */

static epyq_status parse_awq(epyq_qconfig *qc, const cJSON *q, const char *label, epyq_err *err) {
    int64_t bits = 0, gs = 0;
    bool f1, f2;
    epyq_status st;
    if ((st = epyq_json_get_int(q, "bits", 0, 64, &bits, &f1, label, err))) return st;
    if (!f1 && (st = epyq_json_get_int(q, "w_bit", 0, 64, &bits, &f1, label, err))) return st;
    if ((st = epyq_json_get_int(q, "group_size", -1, 1 << 20, &gs, &f2, label, err))) return st;
    if (!f2 && (st = epyq_json_get_int(q, "q_group_size", -1, 1 << 20, &gs, &f2, label, err))) return st;
    if (!f1 || !f2) return epyq_err_set(err, EPYQ_E_QUANT, "%s: awq quantization_config lacks %s", label, f1 ? "group_size" : "bits");
    if ((st = check_bits_gs(bits, gs, "awq", label, err))) return st;
    /* zero_point false (symmetric, scale absmax / 7) cannot come out of AutoAWQ's GEMM
     * writer: WQLinear_GEMM.from_linear asserts that zeros exist, and the quantizer passes
     * none when zero_point is false; AutoAWQ uses that setting for its Marlin export, which
     * is refused by version below. So no GEMM release carries it, and what a file claiming it
     * stores in qzeros is no tool's documented layout: refused rather than guessed. */
    bool zp = true;
    if ((st = epyq_json_get_bool(q, "zero_point", &zp, NULL, label, err))) return st;
    if (!zp)
        return epyq_err_set(err, EPYQ_E_QUANT,
                            "%s: awq zero_point=false is not supported: AutoAWQ writes it only for its Marlin "
                            "version (its GEMM writer requires zero points), and only GEMM is decoded", label);
    const char *ver = NULL;
    if ((st = epyq_json_get_str(q, "version", &ver, NULL, label, err))) return st;
    if (ver && strcasecmp(ver, "gemm"))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: awq version \"%.20s\" is not supported (only gemm)", label, ver);
    qc->base = (epyq_qscheme){.quantized = true, .bits = 4, .group_size = (int32_t)gs, .sym = false};
    return str_list(qc, cJSON_GetObjectItemCaseSensitive(q, "modules_to_not_convert"), "modules_to_not_convert", false, true,
                    label, err);
}

epyq_status epyq_qconfig_parse(epyq_config *cfg, const cJSON *q, const char *label, epyq_err *err) {
    if (!cJSON_IsObject(q))
        return epyq_err_set(err, EPYQ_E_QUANT, "%s: quantization_config: expected an object, found %s", label,
                            epyq_json_type_name(q));
    const char *method = NULL;
    epyq_status st = epyq_json_get_str(q, "quant_method", &method, NULL, label, err);
    if (st) {
        if (err) err->code = EPYQ_E_QUANT;
        return EPYQ_E_QUANT;
    }
    if (!method) return epyq_err_set(err, EPYQ_E_QUANT, "%s: quantization_config has no quant_method", label);
    epyq_qconfig *qc = calloc(1, sizeof *qc);
    if (!qc || !(qc->mctx = pcre2_match_context_create(NULL))) {
        free(qc);
        return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", label);
    }
    /* Patterns come from files: bound backtracking so a hostile regex cannot hang the loader. */
    pcre2_set_match_limit(qc->mctx, 100000);
    if (!strcmp(method, "gptq")) cfg->qformat = EPYQ_QF_GPTQ, st = parse_gptq(cfg, qc, q, label, err);
    else if (!strcmp(method, "compressed-tensors")) cfg->qformat = EPYQ_QF_CT, st = parse_ct(qc, q, label, err);
    else if (!strcmp(method, "quark")) cfg->qformat = EPYQ_QF_QUARK, st = parse_quark(cfg, qc, q, label, err);
    else if (!strcmp(method, "awq")) cfg->qformat = EPYQ_QF_AWQ, st = parse_awq(qc, q, label, err);
    else
        st = epyq_err_set(err, EPYQ_E_QUANT,
                          "%s: quant_method \"%.40s\" is not supported (supported: gptq, compressed-tensors, quark, awq)",
                          label, method);
    /* A malformed value inside a quantisation block is a quantisation refusal too. */
    if (st == EPYQ_E_FORMAT && err) err->code = st = EPYQ_E_QUANT;
    if (st) {
        epyq_qconfig_free(qc);
        cfg->qformat = EPYQ_QF_NONE;
        return st;
    }
    cfg->qc = qc;
    return EPYQ_OK;
}
