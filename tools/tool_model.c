/* tools/tool_model.c — see tool_model.h. */
#include "tools/tool_model.h"

#include "model/spec.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "synth/synth.h"

char *epyq_tool_cache_root(void) {
    const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    char buf[4096];
    if (x && *x) snprintf(buf, sizeof buf, "%s/epyq", x);
    else snprintf(buf, sizeof buf, "%s/.cache/epyq", h && *h ? h : "/tmp");
    return strdup(buf);
}

typedef struct {
    double t0, last;
} progress;

static void on_progress(void *ctx, uint64_t done, uint64_t total) {
    progress *p = ctx;
    double now = epyq_now();
    if (now - p->last < 0.2 && done < total) return;
    p->last = now;
    double dt = now - p->t0 > 1e-6 ? now - p->t0 : 1e-6;
    fprintf(stderr, "\rgenerating synthetic model: %6.2f / %.2f GB  %5.0f MB/s  %3.0f%%", done / 1e9,
            total / 1e9, done / dt / 1e6, total ? 100.0 * (double)done / (double)total : 100.0);
    if (done >= total) fputc('\n', stderr);
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* A failed generation leaves a flat folder of shards: remove it so no 18 GB orphan stays. */
static void remove_flat_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *f = epyq_path_join(path, e->d_name);
        if (f) unlink(f);
        free(f);
    }
    closedir(d);
    rmdir(path);
}

static epyq_status synth_into_cache(const char *spec, char **out, epyq_err *err) {
    char shape[64], fmt[32] = "ct";
    const char *colon = strchr(spec, ':');
    size_t sl = colon ? (size_t)(colon - spec) : strlen(spec);
    if (sl == 0 || sl >= sizeof shape)
        return epyq_err_set(err, EPYQ_E_ARG, "--synthetic '%s': expected SHAPE[:FORMAT], e.g. 35b-a3b:ct", spec);
    memcpy(shape, spec, sl);
    shape[sl] = '\0';
    if (colon) snprintf(fmt, sizeof fmt, "%s", colon + 1);
    int f = epyq_synth_format_parse(fmt);
    if (f < 0)
        return epyq_err_set(err, EPYQ_E_ARG, "--synthetic '%s': format '%s' is not bf16|gptq|ct|quark|awq", spec, fmt);
    epyq_synth_opts o = {.format = (epyq_synth_format)f, .seed = 1};
    epyq_status st = epyq_synth_dims_init(&o.dims, shape, 0, 0, 0, err);
    if (st != EPYQ_OK) return epyq_err_prefix(err, "--synthetic '%s': ", spec);

    char *root = epyq_tool_cache_root();
    char final[4096], tmp[4200];
    /* The generator revision is part of the name: a cache made by an older synth is not reused. */
    snprintf(final, sizeof final, "%s/%s-%s-r%d", root ? root : "/tmp", shape, fmt, EPYQ_SYNTH_REVISION);
    snprintf(tmp, sizeof tmp, "%s.partial-%d", final, (int)getpid());
    if (is_dir(final)) {
        free(root);
        *out = strdup(final);
        return *out ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    }
    st = root ? epyq_mkdir_p(root, err) : epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    free(root);
    if (st != EPYQ_OK) return st;
    progress p = {epyq_now(), 0};
    o.out_dir = tmp;
    if (isatty(2)) {
        o.progress = on_progress;
        o.progress_ctx = &p;
    }
    fprintf(stderr, "epyq: generating synthetic %s (%s) into %s (once)\n", shape, fmt, final);
    epyq_synth_stats ss;
    st = epyq_synth_write(&o, &ss, err);
    if (st == EPYQ_OK && rename(tmp, final) != 0 && !is_dir(final))
        st = epyq_err_set(err, EPYQ_E_IO, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
    if (st != EPYQ_OK) {
        remove_flat_dir(tmp);
        return st;
    }
    *out = strdup(final);
    return *out ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
}

epyq_status epyq_tool_model_dir(const char *dir, const char *synthetic, char **out, epyq_err *err) {
    *out = NULL;
    if (!!dir == !!synthetic)
        return epyq_err_set(err, EPYQ_E_ARG, "give exactly one of -m DIR or --synthetic SHAPE[:FORMAT]");
    if (synthetic) return synth_into_cache(synthetic, out, err);
    *out = strdup(dir);
    return *out ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
}

/* Bytes of the checkpoint's *.safetensors files (what loading reads and packs). */
static uint64_t checkpoint_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t total = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
        char *f = epyq_path_join(dir, e->d_name);
        struct stat sb;
        if (f && stat(f, &sb) == 0) total += (uint64_t)sb.st_size;
        free(f);
    }
    closedir(d);
    return total;
}

typedef struct {
    double t0, last;
    uint64_t bytes; /* checkpoint size */
} load_progress;

static void on_load(void *ctx, int32_t done, int32_t total) {
    load_progress *p = ctx;
    double now = epyq_now();
    if (now - p->last < 0.2 && done < total) return;
    p->last = now;
    /* layers are near-equal in size, so the step fraction stands for the bytes read */
    double gb = (double)p->bytes * done / (total > 0 ? total : 1) / 1e9, dt = now - p->t0 > 1e-6 ? now - p->t0 : 1e-6;
    fprintf(stderr, "\rloading model: %6.2f / %.2f GB  %5.2f GB/s  layer %d/%d ", gb, p->bytes / 1e9, gb / dt,
            done < total ? done : total - 1, total - 1);
}

epyq_status epyq_tool_model_load(epyq_model **out, const char *dir, const epyq_model_opts *opts,
                                 epyq_err *err) {
    bool tty = isatty(STDERR_FILENO);
    load_progress p = {.t0 = epyq_now(), .bytes = checkpoint_bytes(dir)};
    epyq_model_opts o = *opts;
    o.progress = tty ? on_load : NULL;
    o.progress_ctx = &p;
    epyq_status st = epyq_model_load(out, dir, &o, err);
    if (tty) fputs("\r\033[K", stderr); /* the progress line gives way to the summary or error */
    if (st != EPYQ_OK) return st;
    double dt = epyq_now() - p.t0;
    const epyq_kern_table *kt = opts->kernels ? opts->kernels : epyq_kern();
    int32_t threads = epyq_model_threads(*out);
    uint64_t active = epyq_model_active_bytes(*out);
    epyq_requant rq_lm, rq_dense;
    epyq_model_requant(*out, &rq_lm, &rq_dense);
    char rq[96] = "";
    if (rq_lm || rq_dense)
        snprintf(rq, sizeof rq, ", requantised at load: lm_head %s, dense %s", epyq_requant_name(rq_lm),
                 epyq_requant_name(rq_dense));
    /* the MTP drafts' head: its kind, and the ids it drafts among when cut (--draft-vocab) */
    const epyq_requant dh = epyq_model_draft_head(*out);
    const int32_t dv = epyq_model_draft_vocab(*out), V = epyq_model_config(*out)->vocab_size;
    const char *embed = epyq_model_embed_resident(*out) ? "in memory" : "mapped";
    char dr[96] = "";
    if (dh)
        snprintf(dr, sizeof dr, ", draft head %s over ids [0, %d)", epyq_requant_name(dh), (int)dv);
    if (tty)
        fprintf(
            stderr,
            "loaded %s: %.2f GB in %.1f s (%.2f GB/s), %d threads, %s kernels, %.1f MB streamed per token, "
            "embeddings %s%s%s\n",
            dir, p.bytes / 1e9, dt, dt > 0 ? p.bytes / 1e9 / dt : 0.0, threads, kt->name,
            active / 1e6, embed, rq, dr);
    else
        fprintf(
            stderr,
            "{\"event\":\"model_loaded\",\"bytes\":%llu,\"seconds\":%.3f,\"gb_per_s\":%.3f,\"threads\":%d,"
            "\"kernels\":\"%s\",\"active_bytes_per_token\":%llu,\"requant_lm_head\":\"%s\","
            "\"requant_dense\":\"%s\",\"draft_head\":\"%s\",\"draft_vocab\":%d,\"embeddings\":\"%s\"}\n",
            (unsigned long long)p.bytes, dt, dt > 0 ? p.bytes / 1e9 / dt : 0.0, threads, kt->name,
            (unsigned long long)active, epyq_requant_name(rq_lm), epyq_requant_name(rq_dense),
            dh ? epyq_requant_name(dh) : "none", (int)(dh ? dv : V), embed);
    return EPYQ_OK;
}

int epyq_tool_opt_long(const char *cmd, const char *arg, long lo, long hi, long *v) {
    char *end;
    *v = strtol(arg, &end, 10);
    if (end == arg || *end || *v < lo || *v > hi) {
        fprintf(stderr, "%s: bad number '%s'\n", cmd, arg);
        return 2;
    }
    return 0;
}

int epyq_tool_opt_path(const char *cmd, const char *arg, epyq_numpath *path) {
    int p = epyq_model_path_parse(arg);
    if (p < 0) {
        fprintf(stderr, "%s: --path: expected a16, a8 or a8all, got '%s'\n", cmd, arg);
        return 2;
    }
    *path = (epyq_numpath)p;
    return 0;
}

/* ---- shared runtime flags ---- */

const char epyq_tool_rt_help[] =
    "  --kv-type bf16|fp8     KV cache storage (default bf16; fp8 e4m3 halves it)\n"
    "  --numa MODE            auto|off|distribute|isolate|numactl|replicate-dense: routed experts\n"
    "                         on the NUMA plan's node pools (EPYQ_NUMA; default: one pool)\n"
    "  --numa-split N         the same on N logical nodes cut from this machine (EPYQ_NUMA_SPLIT)\n"
    "  --nodes LIST, --cpu-range LIST, --numa-fallback   as in epyq inspect --numa\n"
    "                         (EPYQ_NODES, EPYQ_CPU_RANGE)\n"
    "  --requant SPEC         lm_head=int8|int4, dense=int8|int4: 16-bit linears requantised at\n"
    "                         load, fewer bytes per token (default: exact; see README)\n";

void epyq_tool_rt_defaults(epyq_tool_rt *rt) {
    memset(rt, 0, sizeof *rt);
    rt->kv = EPYQ_KV_BF16;
    epyq_numa_opts_init(&rt->numa);
}

int epyq_tool_rt_init(epyq_tool_rt *rt, const char *cmd) {
    epyq_tool_rt_defaults(rt);
    epyq_err e = {0};
    if (epyq_numa_opts_from_env(&rt->numa, &e) != EPYQ_OK) {
        fprintf(stderr, "%s: %s\n", cmd, e.msg);
        return 2;
    }
    /* the variables ask for NUMA placement just as the flags do (EPYQ_THREADS alone does not) */
    const char *vars[] = {"EPYQ_NUMA", "EPYQ_NUMA_SPLIT", "EPYQ_NODES", "EPYQ_CPU_RANGE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) rt->use_numa = true;
    }
    return 0;
}

int epyq_tool_rt_opt(epyq_tool_rt *rt, const char *cmd, int c, const char *arg) {
    const char *flag = c == EPYQ_TOOL_O_NUMA ? "--numa" : c == EPYQ_TOOL_O_SPLIT ? "--numa-split"
                     : c == EPYQ_TOOL_O_NODES ? "--nodes" : c == EPYQ_TOOL_O_CPUS ? "--cpu-range"
                     : c == EPYQ_TOOL_O_FALLBACK ? "--numa-fallback" : NULL;
    if (c == EPYQ_TOOL_O_KV) {
        if (!strcmp(arg, "bf16")) rt->kv = EPYQ_KV_BF16;
        else if (!strcmp(arg, "fp8")) rt->kv = EPYQ_KV_FP8;
        else return fprintf(stderr, "%s: --kv-type: expected bf16 or fp8, got '%s'\n", cmd, arg), 2;
        return 0;
    }
    if (c == EPYQ_TOOL_O_REQUANT) {
        epyq_err e = {0};
        if (epyq_requant_parse(arg, &rt->rq_lm_head, &rt->rq_dense, &e) != EPYQ_OK)
            return fprintf(stderr, "%s: %s\n", cmd, e.msg), 2;
        return 0;
    }
    if (!flag) return 1;
    epyq_err e = {0};
    if (epyq_numa_opts_set(&rt->numa, flag, c == EPYQ_TOOL_O_FALLBACK ? NULL : arg, &e) != EPYQ_OK)
        return fprintf(stderr, "%s: %s\n", cmd, e.msg), 2;
    rt->use_numa = true;
    return 0;
}

const epyq_numa_opts *epyq_tool_rt_numa(epyq_tool_rt *rt, int threads) {
    if (!rt->use_numa) return NULL;
    if (threads > 0) rt->numa.n_threads = threads;
    return &rt->numa;
}

epyq_status epyq_tool_ctx(const epyq_config *cfg, int64_t want, bool explicit_c, int32_t *out, epyq_err *err) {
    const int64_t max = cfg->max_ctx;
    if (explicit_c && (want < 1 || want > max)) {
        if (cfg->yarn)
            return epyq_err_set(err, EPYQ_E_ARG,
                                "-c %lld: the model's context is %lld tokens (YaRN: original_max_position_embeddings "
                                "%lld x factor %g; max_position_embeddings %lld); expected -c in [1, %lld]",
                                (long long)want, (long long)max, (long long)cfg->yarn_orig_ctx, cfg->yarn_factor,
                                (long long)cfg->max_position_embeddings, (long long)max);
        return epyq_err_set(err, EPYQ_E_ARG,
                            "-c %lld: the model's context is %lld tokens (max_position_embeddings, no rope scaling); "
                            "expected -c in [1, %lld]",
                            (long long)want, (long long)max, (long long)max);
    }
    *out = (int32_t)(want < max ? want : max);
    return EPYQ_OK;
}

epyq_status epyq_tool_ctx_dir(const char *dir, int64_t want, bool explicit_c, int32_t *out, epyq_err *err) {
    epyq_config cfg;
    epyq_status st = epyq_config_load(&cfg, dir, err);
    if (st != EPYQ_OK) return st;
    st = epyq_tool_ctx(&cfg, want, explicit_c, out, err);
    epyq_config_free(&cfg);
    return st;
}

void epyq_tool_ctx_report(const epyq_model *m, int32_t n_ctx, int32_t n_seqs, epyq_kv_type kv) {
    uint64_t kvb, all = epyq_model_seq_bytes(m, n_ctx, kv, &kvb);
    const char *kt = kv == EPYQ_KV_FP8 ? "fp8" : "bf16";
    if (isatty(STDERR_FILENO)) {
        char b1[32], b2[32];
        fprintf(stderr, "context %d tokens x %d sequence%s: KV cache %s (%s), state %s\n", n_ctx, n_seqs,
                n_seqs == 1 ? "" : "s", epyq_numa_size(kvb * (uint64_t)n_seqs, b1, sizeof b1), kt,
                epyq_numa_size((all - kvb) * (uint64_t)n_seqs, b2, sizeof b2));
    } else {
        fprintf(stderr,
                "{\"event\":\"context\",\"n_ctx\":%d,\"sequences\":%d,\"kv_type\":\"%s\",\"kv_bytes\":%llu,"
                "\"state_bytes\":%llu}\n",
                n_ctx, n_seqs, kt, (unsigned long long)(kvb * (uint64_t)n_seqs),
                (unsigned long long)((all - kvb) * (uint64_t)n_seqs));
    }
}

const char epyq_tool_spec_help[] =
    "  --spec mtp|none        MTP speculative decoding (default none): drafts from the MTP head,\n"
    "                         verified in one pass; greedy output is the same tokens, seeded\n"
    "                         sampling the same text; adaptive: plain steps while drafting does\n"
    "                         not pay\n"
    "  --draft N              drafts per step with --spec mtp (default 2, at most 7)\n"
    "  --draft-head KIND      int4 (default), int8 or bf16: the lm_head (and MTP layer) copy\n"
    "                         drafts read; verification always reads the exact head\n"
    "  --draft-vocab N        drafts pick among token ids below N only (rounded up to 16; the\n"
    "                         draft head then holds those rows: 32768 of 248320 reads 1/7 of\n"
    "                         it); other tokens are never drafted, output unchanged (default:\n"
    "                         the whole vocabulary)\n";

void epyq_tool_spec_init(epyq_tool_spec *sp) {
    *sp = (epyq_tool_spec){
        .on = false, .draft = 2, .draft_head = EPYQ_REQUANT_INT4, .draft_vocab = 0};
}

int epyq_tool_spec_opt(epyq_tool_spec *sp, const char *cmd, int c, const char *arg) {
    if (c == EPYQ_TOOL_O_SPEC) {
        if (!strcmp(arg, "mtp")) sp->on = true;
        else if (!strcmp(arg, "none"))
            sp->on = false;
        else
            return fprintf(stderr, "%s: --spec: expected mtp or none, got '%s'\n", cmd, arg), 2;
        return 0;
    }
    if (c == EPYQ_TOOL_O_DRAFT) {
        long v;
        if (epyq_tool_opt_long(cmd, arg, 1, EPYQ_SPEC_MAX - 1, &v)) return 2;
        sp->draft = (int)v;
        return 0;
    }
    if (c == EPYQ_TOOL_O_DVOCAB) {
        long v;
        if (epyq_tool_opt_long(cmd, arg, 1, INT32_MAX, &v)) return 2;
        sp->draft_vocab = (int32_t)v;
        return 0;
    }
    if (c == EPYQ_TOOL_O_DHEAD) {
        epyq_err e = {0};
        if (epyq_requant_parse_kind(arg, &sp->draft_head, &e) != EPYQ_OK)
            return fprintf(stderr, "%s: --draft-head: %s\n", cmd, e.msg), 2;
        return 0;
    }
    return 1;
}
