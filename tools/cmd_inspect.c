/* tools/cmd_inspect.c — `epyq inspect -m DIR [--json]`: validate a checkpoint folder and
 * summarise it (architecture, format, per-module precision, bytes per decoded token, memory).
 * A damaged folder gives exit 1 and one line naming the file, tensor and rule.
 * Sections are printed by separate functions so later ones (e.g. a NUMA placement report,
 * `--numa`) can be added beside the existing ones without touching them. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/util.h"
#include "load/weights.h"
#include "model/model.h"
#include "numa/plan.h"
#include "tools/cmd.h"

typedef struct {
    const char *dir;
    bool json, check_tensors, list_unexpected;
    bool numa;                /* --numa: print the placement plan (numa/plan.h) */
    const char *topology;     /* --topology: synthetic string or XML instead of this machine */
    epyq_numa_opts numa_opts; /* --numa=MODE, --numa-split, -t, --nodes, -C, --numa-fallback */
} opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: epyq inspect -m DIR [--json] [--check-tensors] [--list-unexpected]\n"
            "\n"
            "Validate a Qwen3.6-35B-A3B checkpoint folder (BF16, GPTQ, compressed-tensors, Quark, AWQ)\n"
            "and summarise it.\n"
            "\n"
            "  -m, --model DIR       checkpoint folder (config.json + safetensors shards)\n"
            "      --json            machine-readable output\n"
            "      --check-tensors   also decode every linear (finite weights) after the default checks\n"
            "      --list-unexpected print every tensor outside the architecture (default: first 10)\n"
            "      --numa[=MODE]     also print the NUMA placement plan (without -m: for the full 35b-a3b int4)\n"
            "      --topology SPEC   plan for a hwloc synthetic string or XML file instead of this machine\n"
            "      --numa-split N, -t N, --nodes LIST, -C LIST, --numa-fallback   as for running (see below)\n"
            "  -h, --help            this help\n"
            "\n"
            "Every int4 linear's scales, zero points and g_idx are checked by default (positive finite\n"
            "scales, symmetric zero points at 8, g_idx groups of group_size columns); the first failure is\n"
            "named by tensor, output row and group.\n"
            "\n"
            "Exit status: 0 valid, 1 invalid or unreadable folder (one line on stderr), 2 usage error.\n");
}

static const char *human(uint64_t b, char *buf, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) v /= 1024, i++;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", v, u[i]);
    return buf;
}

/* ---- default: scales / zero points / g_idx of every int4 linear; --check-tensors: decode ---- */

typedef struct {
    const epyq_config *cfg;
    epyq_status st;
    epyq_err *err;
    bool decode;
} check_ctx;

static void check_linear(const epyq_linear *l, epyq_module_kind kind, int32_t layer, int32_t expert, bool mtp, void *ctx) {
    (void)kind, (void)layer, (void)expert, (void)mtp;
    check_ctx *c = ctx;
    if (c->st) return;
    if ((c->st = epyq_linear_check_q4(l, c->cfg, c->err)) != EPYQ_OK || !c->decode) return;
    size_t n = (size_t)(l->n_out * l->n_in);
    float *w = malloc(n * sizeof *w);
    if (!w) {
        c->st = epyq_err_set(c->err, EPYQ_E_NOMEM, "%s: out of memory checking", l->module);
        return;
    }
    c->st = epyq_linear_dequant(l, c->cfg, w, c->err);
    for (size_t i = 0; !c->st && i < n; i++)
        if (!isfinite(w[i]))
            c->st = epyq_err_set(c->err, EPYQ_E_FORMAT, "%s: non-finite weight at [%zu, %zu]", l->module,
                                 i / (size_t)l->n_in, i % (size_t)l->n_in);
    free(w);
}

/* ---- text report ---- */

static void print_arch(const epyq_weights *w) {
    const epyq_config *c = &w->cfg;
    int n_full = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) n_full += c->full_attn[i];
    printf("architecture : qwen3_5_moe, %d layers (%d Gated DeltaNet + %d full attention), hidden %d, vocab %d\n",
           c->num_hidden_layers, c->num_hidden_layers - n_full, n_full, c->hidden_size, c->vocab_size);
    printf("attention    : %d query / %d kv heads x %d, rotary %d dims (theta %g)%s\n", c->num_attention_heads,
           c->num_key_value_heads, c->head_dim, c->rotary_dim, c->rope_theta, c->attn_output_gate ? ", output gate" : "");
    printf("deltanet     : %d key heads x %d, %d value heads x %d, conv kernel %d\n", c->lin_num_key_heads,
           c->lin_key_head_dim, c->lin_num_value_heads, c->lin_value_head_dim, c->conv_kernel);
    printf("moe          : %d experts, top-%d, intermediate %d, shared expert %d; experts stored %s\n", c->num_experts,
           c->num_experts_per_tok, c->moe_intermediate_size, c->shared_expert_intermediate_size,
           w->layers[0].moe.fused ? "fused 3-D" : "per expert");
    printf("mtp          : %s\n", w->has_mtp ? (w->mtp.layer.moe.fused ? "1 layer (experts fused 3-D)" : "1 layer (experts per expert)")
                                             : "none");
    printf("lm_head      : %s\n", w->lm_head.w && w->lm_head.w == w->embed ? "tied to embed_tokens" : "separate");
}

static void print_format(const epyq_weights *w) {
    const epyq_config *c = &w->cfg;
    if (c->qformat == EPYQ_QF_NONE) {
        printf("format       : bf16 (no quantization_config)\n");
        return;
    }
    epyq_qscheme b = {0};
    /* describe the scheme of the first int4 linear found (the global one) */
    for (int32_t i = 0; i < c->num_hidden_layers && !b.quantized; i++)
        if (w->layers[i].moe.gate[0].kind == EPYQ_LIN_Q4) b = w->layers[i].moe.gate[0].scheme;
    printf("format       : %s, int4 group %d, %s", epyq_qformat_name(c->qformat), b.group_size,
           b.sym ? "symmetric" : "asymmetric");
    if (c->qformat == EPYQ_QF_GPTQ) printf(", checkpoint_format %s", c->gptq_version == 2 ? "gptq_v2" : "gptq (v1 zeros)");
    if (c->qformat == EPYQ_QF_QUARK)
        printf(", %s, pack_method %s", c->quark_signed ? "int4" : "uint4", c->quark_reorder ? "reorder" : "order");
    if (b.desc_act) printf(", act-order");
    printf("\n");
}

static void print_precision(const epyq_weights_stats *s) {
    char b1[32], b2[32];
    printf("\nprecision by module kind   int4  int4 bytes   16-bit  16-bit bytes\n");
    epyq_prec_row tot = {0};
    for (int k = 0; k <= EPYQ_MK_COUNT; k++) {
        const epyq_prec_row *r = k < EPYQ_MK_COUNT ? &s->kind[k] : &s->mtp;
        if (!r->q4_count && !r->dense_count) continue;
        printf("  %-22s %6llu %11s %8llu %13s\n", k < EPYQ_MK_COUNT ? epyq_module_kind_name((epyq_module_kind)k) : "mtp (all)",
               (unsigned long long)r->q4_count, human(r->q4_bytes, b1, sizeof b1), (unsigned long long)r->dense_count,
               human(r->dense_bytes, b2, sizeof b2));
        tot.q4_count += r->q4_count, tot.q4_bytes += r->q4_bytes;
        tot.dense_count += r->dense_count, tot.dense_bytes += r->dense_bytes;
    }
    printf("  %-22s %6llu %11s %8llu %13s\n", "total", (unsigned long long)tot.q4_count, human(tot.q4_bytes, b1, sizeof b1),
           (unsigned long long)tot.dense_count, human(tot.dense_bytes, b2, sizeof b2));
}

static void print_sizes(const epyq_weights *w, const epyq_weights_stats *s) {
    char b1[32], b2[32], b3[32];
    printf("\nper decoded token (batch 1, no speculation; docs/architecture.md §7.2 rule):\n");
    printf("  weights read : %s (%.3f GB), %llu parameters (%.3f GB if all were BF16)\n", human(s->token_bytes, b1, sizeof b1),
           (double)s->token_bytes / 1e9, (unsigned long long)s->token_params, 2.0 * (double)s->token_params / 1e9);
    printf("  docs/architecture.md §7.2, real 35B-A3B: 2 946 431 616 parameters; BF16 5.89 GB, W4A16 g128 2.31 GB\n"
           "                 (lm_head BF16) or 1.56 GB (lm_head int4)\n");
    /* what --requant would make of it (at load, never on disk) */
    int32_t gs = epyq_requant_group(w);
    const epyq_linear *lh = &w->lm_head;
    uint64_t head = s->kind[EPYQ_MK_LM_HEAD].dense_bytes;
    if (gs > 0 && head && lh->kind != EPYQ_LIN_Q4) {
        uint64_t h8 = epyq_requant_bytes(lh->n_out, lh->n_in, gs, EPYQ_REQUANT_INT8);
        uint64_t h4 = epyq_requant_bytes(lh->n_out, lh->n_in, gs, EPYQ_REQUANT_INT4);
        /* dense=: the 16-bit attention, DeltaNet and shared-expert linears, at the int8 planes'
         * bytes per element (the b/a gates stay 16-bit: a few KiB) */
        uint64_t dense = s->kind[EPYQ_MK_GDN].dense_bytes + s->kind[EPYQ_MK_ATTN].dense_bytes +
                         s->kind[EPYQ_MK_SHARED].dense_bytes;
        double per8 = (double)epyq_requant_bytes(16, gs, gs, EPYQ_REQUANT_INT8) / (16.0 * gs * 2.0);
        double base = (double)s->token_bytes;
        printf("  --requant    : lm_head=int8 %.3f GB, lm_head=int4 %.3f GB per token (group %d)",
               (base - head + h8) / 1e9, (base - head + h4) / 1e9, (int)gs);
        if (dense)
            printf("; + dense=int8 %.3f GB",
                   (base - head + h8 - (double)dense * (1.0 - per8)) / 1e9);
        printf("\n");
    }
    printf("\nmemory       : weights %s resident (int4 in the kernels' packed layout), other tensors %s\n",
           human(s->resident_bytes, b1, sizeof b1), human(s->other_bytes, b2, sizeof b2));
    printf("               per sequence: KV %s per token of context (bf16), DeltaNet state %s\n",
           human(s->kv_bytes_per_token, b3, sizeof b3), human(s->gdn_state_bytes, b2, sizeof b2));
    printf("on disk      : %s in %zu shard(s), %zu tensors\n", human(epyq_ckpt_total_bytes(w->ckpt), b1, sizeof b1),
           epyq_ckpt_nshards(w->ckpt), epyq_ckpt_count(w->ckpt));
}

static void print_validation(const epyq_weights *w, const opts *o, double secs, double check_secs, bool checked) {
    printf("\nvalidation   : OK%s%s (open + validate %.3f s, %s %.3f s)\n",
           checked ? ", every linear decoded" : ", int4 scales / zero points / g_idx checked",
           w->n_unexpected ? ", but with unexpected tensors (loading refuses them)" : "", secs,
           checked ? "decode" : "scale check", check_secs);
    printf("               skipped: %zu vision tensors, %zu mtp tensors%s\n", w->n_vision, w->n_mtp,
           w->has_mtp ? " (bound)" : "");
    if (w->n_qc_mismatch)
        printf("               warning: %zu linears disagree with the config's module rules (tensors win), e.g. %s\n",
               w->n_qc_mismatch, w->qc_mismatch);
    if (w->n_unexpected) {
        printf("               %zu unexpected tensors:\n", w->n_unexpected);
        size_t lim = o->list_unexpected ? w->n_unexpected : 10;
        for (size_t i = 0; i < w->n_unexpected && i < lim; i++) printf("                 %s\n", w->unexpected[i]);
        if (w->n_unexpected > lim) printf("                 ... (--list-unexpected for all)\n");
    }
}

/* ---- JSON report ---- */

static cJSON *row_json(const epyq_prec_row *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "int4_count", (double)r->q4_count);
    cJSON_AddNumberToObject(o, "int4_bytes", (double)r->q4_bytes);
    cJSON_AddNumberToObject(o, "dense_count", (double)r->dense_count);
    cJSON_AddNumberToObject(o, "dense_bytes", (double)r->dense_bytes);
    cJSON_AddNumberToObject(o, "params", (double)r->params);
    return o;
}

static int print_json(const epyq_weights *w, const epyq_weights_stats *s, double secs, double check_secs,
                      bool checked) {
    const epyq_config *c = &w->cfg;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "path", epyq_ckpt_dir(w->ckpt));
    cJSON_AddStringToObject(r, "format", epyq_qformat_name(c->qformat));
    if (c->qformat == EPYQ_QF_GPTQ) cJSON_AddNumberToObject(r, "gptq_version", c->gptq_version);
    if (c->qformat == EPYQ_QF_QUARK) {
        cJSON_AddStringToObject(r, "quark_dtype", c->quark_signed ? "int4" : "uint4");
        cJSON_AddStringToObject(r, "quark_pack_method", c->quark_reorder ? "reorder" : "order");
    }
    cJSON *a = cJSON_AddObjectToObject(r, "architecture");
    int n_full = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) n_full += c->full_attn[i];
    cJSON_AddNumberToObject(a, "layers", c->num_hidden_layers);
    cJSON_AddNumberToObject(a, "full_attention_layers", n_full);
    cJSON_AddNumberToObject(a, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(a, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(a, "num_experts", c->num_experts);
    cJSON_AddNumberToObject(a, "num_experts_per_tok", c->num_experts_per_tok);
    cJSON_AddBoolToObject(a, "experts_fused", w->layers[0].moe.fused);
    cJSON_AddBoolToObject(a, "mtp", w->has_mtp);
    cJSON_AddStringToObject(a, "prefix", c->prefix);
    cJSON *p = cJSON_AddObjectToObject(r, "precision");
    for (int k = 0; k < EPYQ_MK_COUNT; k++)
        if (s->kind[k].q4_count || s->kind[k].dense_count)
            cJSON_AddItemToObject(p, epyq_module_kind_name((epyq_module_kind)k), row_json(&s->kind[k]));
    if (w->has_mtp) cJSON_AddItemToObject(p, "mtp", row_json(&s->mtp));
    cJSON_AddNumberToObject(r, "bytes_per_token", (double)s->token_bytes);
    cJSON_AddNumberToObject(r, "params_per_token", (double)s->token_params);
    cJSON_AddNumberToObject(r, "resident_bytes", (double)s->resident_bytes);
    cJSON_AddNumberToObject(r, "kv_bytes_per_token", (double)s->kv_bytes_per_token);
    cJSON_AddNumberToObject(r, "gdn_state_bytes", (double)s->gdn_state_bytes);
    cJSON_AddNumberToObject(r, "file_bytes", (double)epyq_ckpt_total_bytes(w->ckpt));
    cJSON_AddNumberToObject(r, "shards", (double)epyq_ckpt_nshards(w->ckpt));
    cJSON_AddNumberToObject(r, "tensors", (double)epyq_ckpt_count(w->ckpt));
    cJSON *v = cJSON_AddObjectToObject(r, "validation");
    cJSON_AddBoolToObject(v, "ok", 1);
    cJSON_AddBoolToObject(v, "tensors_decoded", checked);
    cJSON_AddBoolToObject(v, "scales_checked", 1);
    cJSON_AddNumberToObject(v, "seconds", secs);
    cJSON_AddNumberToObject(v, "check_seconds", check_secs);
    cJSON_AddNumberToObject(v, "vision_tensors", (double)w->n_vision);
    cJSON_AddNumberToObject(v, "mtp_tensors", (double)w->n_mtp);
    cJSON_AddNumberToObject(v, "config_mismatches", (double)w->n_qc_mismatch);
    cJSON *u = cJSON_AddArrayToObject(v, "unexpected");
    for (size_t i = 0; i < w->n_unexpected; i++) cJSON_AddItemToArray(u, cJSON_CreateString(w->unexpected[i]));
    char *txt = cJSON_Print(r);
    cJSON_Delete(r);
    if (!txt) return 1;
    puts(txt);
    free(txt);
    return 0;
}

static int parse_args(opts *o, int argc, char **argv) {
    static const struct option lo[] = {
        {"model", required_argument, NULL, 'm'}, {"json", no_argument, NULL, 'j'},
        {"check-tensors", no_argument, NULL, 'c'}, {"list-unexpected", no_argument, NULL, 'u'},
        {"help", no_argument, NULL, 'h'},        {"numa", optional_argument, NULL, 'N'},
        {"topology", required_argument, NULL, 'T'}, {"numa-split", required_argument, NULL, 'S'},
        {"threads", required_argument, NULL, 't'},  {"nodes", required_argument, NULL, 'n'},
        {"cpu-range", required_argument, NULL, 'C'}, {"numa-fallback", no_argument, NULL, 'F'},
        {NULL, 0, NULL, 0},
    };
    epyq_numa_opts_init(&o->numa_opts);
    epyq_err nerr = {0};
    if (epyq_numa_opts_from_env(&o->numa_opts, &nerr) != EPYQ_OK) {
        fprintf(stderr, "epyq inspect: %s\n", nerr.msg);
        return 2;
    }
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, ":m:ht:C:", lo, NULL)) != -1) {
        const char *numa_flag = ch == 'N' ? "--numa" : ch == 'S' ? "--numa-split" : ch == 't' ? "--threads"
                              : ch == 'n' ? "--nodes" : ch == 'C' ? "--cpu-range" : ch == 'F' ? "--numa-fallback" : NULL;
        if (ch == 'N') o->numa = true;
        if (numa_flag && (ch != 'N' || optarg) && epyq_numa_opts_set(&o->numa_opts, numa_flag, optarg, &nerr)) {
            fprintf(stderr, "epyq inspect: %s\n", nerr.msg);
            return 2;
        }
        if (numa_flag) continue;
        switch (ch) {
        case 'm': o->dir = optarg; break;
        case 'j': o->json = true; break;
        case 'c': o->check_tensors = true; break;
        case 'u': o->list_unexpected = true; break;
        case 'h': usage(stdout); printf("\nNUMA options:\n%s", epyq_numa_opts_help); return 0;
        case 'T': o->topology = optarg; break;
        case ':':
            fprintf(stderr, "epyq inspect: option '%s' needs a value (try epyq inspect --help)\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "epyq inspect: unknown option '%s' (try epyq inspect --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "epyq inspect: unexpected argument '%s' (try epyq inspect --help)\n", argv[optind]);
        return 2;
    }
    if (o->numa && o->json) {
        fprintf(stderr, "epyq inspect: --numa prints a table; it does not combine with --json\n");
        return 2;
    }
    if (!o->dir && !o->numa) {
        fprintf(stderr, "epyq inspect: -m DIR is required (try epyq inspect --help)\n");
        return 2;
    }
    return -1;
}

/* ---- --numa: placement plan for this checkpoint (numa/plan.h) ---- */

static int print_numa(const epyq_weights *w, const epyq_weights_stats *s, const opts *o) {
    epyq_numa_model m;
    epyq_numa_model_35b_a3b(&m, true);
    m.n_slices = 4; /* as the runtime places them: 512 intermediate rows in slices of 128 */
    if (w) {
        /* Experts are the routed-expert linears; everything else resident is "dense". */
        const epyq_config *c = &w->cfg;
        uint64_t experts = s->kind[EPYQ_MK_EXPERT].q4_bytes + s->kind[EPYQ_MK_EXPERT].dense_bytes;
        uint64_t n = (uint64_t)c->num_hidden_layers * (uint64_t)c->num_experts;
        m = (epyq_numa_model){.name = "this checkpoint", .n_layers = c->num_hidden_layers,
                              .n_experts = c->num_experts, .top_k = c->num_experts_per_tok,
                              .expert_bytes = n ? experts / n : 0,
                              .dense_bytes = s->resident_bytes > experts ? s->resident_bytes - experts : 0};
        /* the runtime's default slice of 128 intermediate rows; the plan wants bytes that the
         * slice count divides (it pads each slice to its own slot anyway) */
        int32_t slices = (c->moe_intermediate_size + 127) / 128;
        if (slices > 1 && slices <= 64) {
            m.n_slices = slices;
            m.expert_bytes =
                (m.expert_bytes + (uint64_t)slices - 1) / (uint64_t)slices * (uint64_t)slices;
        }
    }
    epyq_err err = {0};
    if (w) printf("\n");
    if (epyq_numa_plan_inspect(stdout, o->topology, &m, &o->numa_opts, &err) != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        return 1;
    }
    return 0;
}

int epyq_cmd_inspect(int argc, char **argv) {
    opts o = {0};
    int rc = parse_args(&o, argc, argv);
    if (rc >= 0) return rc;
    if (!o.dir) return print_numa(NULL, NULL, &o);
    epyq_err err = {0};
    epyq_weights *w;
    epyq_bind_opts bo = {.allow_unexpected = true};
    double t0 = epyq_now();
    epyq_status st = epyq_weights_bind(&w, o.dir, &bo, &err);
    double secs = epyq_now() - t0;
    if (st) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        return 1;
    }
    /* "validation: OK" has to mean the numbers are usable, not only the structure: the scale /
     * zero point scan always runs; --check-tensors adds the full decode. */
    double t1 = epyq_now();
    check_ctx cc = {&w->cfg, EPYQ_OK, &err, o.check_tensors};
    epyq_weights_foreach_linear(w, check_linear, &cc);
    double check_secs = epyq_now() - t1;
    if (cc.st) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        epyq_weights_free(w);
        return 1;
    }
    epyq_weights_stats s;
    epyq_weights_stats_get(w, &s);
    if (o.json) {
        rc = print_json(w, &s, secs, check_secs, o.check_tensors);
    } else {
        printf("checkpoint   : %s\n", o.dir);
        print_arch(w);
        print_format(w);
        print_precision(&s);
        print_sizes(w, &s);
        print_validation(w, &o, secs, check_secs, o.check_tensors);
        rc = o.numa ? print_numa(w, &s, &o) : 0;
    }
    epyq_weights_free(w);
    return rc;
}
