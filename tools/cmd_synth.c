/* tools/cmd_synth.c — `epyq synth`: write a synthetic checkpoint of the real shape and on-disk
 * format (src/synth/synth.h). Progress bar on a TTY; otherwise only the final summary line. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "synth/synth.h"
#include "tools/cmd.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: epyq synth -o DIR [--shape tiny|35b-a3b] [--format bf16|gptq|ct|quark|awq]\n"
        "                  [--layers N] [--experts N] [--vocab N] [-s|--seed S]\n"
        "                  [--tokenizer FILE] [--fused-experts] [--act-order] [-t N]\n"
        "\n"
        "Write a synthetic Qwen3.6-35B-A3B checkpoint folder: the real tensor names, dtypes,\n"
        "packing and config blocks of each format's writer, values drawn from the seed.\n"
        "\n"
        "  -o, --output DIR   folder to create (existing files of the same names are replaced)\n"
        "  --shape S          tiny (fixture-sized, default) or 35b-a3b (the real model)\n"
        "  --format F         bf16 (default), gptq (GPTQModel), ct (compressed-tensors),\n"
        "                     quark (AMD Quark), awq (AutoAWQ GEMM)\n"
        "  --layers N         decoder layers (every 4th is full attention)\n"
        "  --experts N        routed experts per layer\n"
        "  --vocab N          embedding rows (special tokens move to N-24 when N < 248070)\n"
        "  -s, --seed S       random seed (default 0); same options and seed give identical files\n"
        "  --tokenizer FILE   copy this tokenizer.json (and its tokenizer_config.json) instead of\n"
        "                     generating a byte-level BPE tokenizer\n"
        "  --act-order        gptq / ct only: act-order int4 (GPTQ desc_act, compressed-tensors\n"
        "                     actorder group): each linear's columns quantized in a random\n"
        "                     order of its own, stored in the original order with g_idx\n"
        "  --fused-experts    bf16 only: fused 3-D experts and BF16 A_log/norm, like the\n"
        "                     original Qwen3.6 release (default: per-expert, F32 A_log/norm)\n"
        "  --no-vision        write no vision tower tensors (config keeps vision_config)\n"
        "  -t, --threads N    generator threads (default: one per CPU; the files do not change)\n"
        "  -h, --help         this text\n");
}

typedef struct {
    double t0, last;
    bool tty;
} progress_state;

static void progress(void *ctx, uint64_t done, uint64_t total) {
    progress_state *p = ctx;
    if (!p->tty) return;
    double now = epyq_now();
    if (done < total && now - p->last < 0.1) return;
    p->last = now;
    double frac = total ? (double)done / (double)total : 1.0, dt = now - p->t0;
    int w = 30, fill = (int)(frac * w + 0.5);
    char bar[32];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = '\0';
    fprintf(stderr, "\r[%s] %5.1f%%  %.2f / %.2f GB  %6.0f MB/s ", bar, 100 * frac, (double)done / 1e9,
            (double)total / 1e9, dt > 0 ? (double)done / 1e6 / dt : 0.0);
    if (done >= total) fputc('\n', stderr);
    fflush(stderr);
}

static bool parse_int(const char *s, int32_t *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v <= 0 || v > INT32_MAX) return false;
    *out = (int32_t)v;
    return true;
}

int epyq_cmd_synth(int argc, char **argv) {
    enum { O_SHAPE = 256, O_FORMAT, O_LAYERS, O_EXPERTS, O_VOCAB, O_TOK, O_FUSED, O_ACT, O_NOVIS };
    static const struct option longopts[] = {{"output", required_argument, NULL, 'o'},
                                             {"shape", required_argument, NULL, O_SHAPE},
                                             {"format", required_argument, NULL, O_FORMAT},
                                             {"layers", required_argument, NULL, O_LAYERS},
                                             {"experts", required_argument, NULL, O_EXPERTS},
                                             {"vocab", required_argument, NULL, O_VOCAB},
                                             {"seed", required_argument, NULL, 's'},
                                             {"tokenizer", required_argument, NULL, O_TOK},
                                             {"fused-experts", no_argument, NULL, O_FUSED},
                                             {"threads", required_argument, NULL, 't'},
                                             {"help", no_argument, NULL, 'h'},
                                             {"act-order", no_argument, NULL, O_ACT},
                                             {"no-vision", no_argument, NULL, O_NOVIS},
                                             {NULL, 0, NULL, 0}};
    const char *shape = "tiny";
    int32_t layers = 0, experts = 0, vocab = 0;
    epyq_synth_opts o = {.format = EPYQ_SYNTH_BF16};
    bool act_order = false, no_vision = false;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":o:s:t:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'o': o.out_dir = optarg; break;
        case O_SHAPE: shape = optarg; break;
        case O_FORMAT: {
            int f = epyq_synth_format_parse(optarg);
            if (f < 0) {
                fprintf(stderr, "epyq synth: unknown --format '%s' (bf16, gptq, ct, quark, awq)\n", optarg);
                return 2;
            }
            o.format = (epyq_synth_format)f;
            break;
        }
        case O_LAYERS:
        case O_EXPERTS:
        case O_VOCAB:
        case 't':
            if (!parse_int(optarg, c == O_LAYERS ? &layers : c == O_EXPERTS ? &experts : c == 't' ? &o.threads : &vocab)) {
                fprintf(stderr, "epyq synth: --%s needs a positive integer, got '%s'\n",
                        c == O_LAYERS ? "layers" : c == O_EXPERTS ? "experts" : c == 't' ? "threads" : "vocab", optarg);
                return 2;
            }
            break;
        case 's': {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 0);
            if (errno || end == optarg || *end) {
                fprintf(stderr, "epyq synth: --seed needs an unsigned integer, got '%s'\n", optarg);
                return 2;
            }
            o.seed = v;
            break;
        }
        case O_TOK: o.tokenizer = optarg; break;
        case O_FUSED: o.fused_experts = true; break;
        case O_ACT: act_order = true; break;
        case O_NOVIS: no_vision = true; break;
        case 'h': usage(stdout); return 0;
        case ':': fprintf(stderr, "epyq synth: option '%s' needs a value\n", argv[optind - 1]); return 2;
        default: fprintf(stderr, "epyq synth: unknown option '%s' (see epyq synth --help)\n", argv[optind - 1]); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "epyq synth: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!o.out_dir) {
        fprintf(stderr, "epyq synth: -o DIR is required (see epyq synth --help)\n");
        return 2;
    }
    if (o.fused_experts && o.format != EPYQ_SYNTH_BF16) {
        fprintf(stderr, "epyq synth: --fused-experts applies to --format bf16 only\n");
        return 2;
    }
    if (act_order && o.format != EPYQ_SYNTH_GPTQ && o.format != EPYQ_SYNTH_CT) {
        fprintf(stderr, "epyq synth: --act-order applies to --format gptq or ct only\n");
        return 2;
    }
    epyq_err err = {0};
    if (epyq_synth_dims_init(&o.dims, shape, layers, experts, vocab, &err)) {
        fprintf(stderr, "epyq synth: %s\n", err.msg);
        return 2;
    }
    o.dims.act_order = act_order;
    if (no_vision) o.dims.vis_depth = 0; /* tests: a checkpoint whose images must be refused */
    progress_state ps = {.t0 = epyq_now(), .tty = isatty(STDERR_FILENO)};
    o.progress = progress, o.progress_ctx = &ps;
    epyq_synth_stats st;
    if (epyq_synth_write(&o, &st, &err)) {
        if (ps.tty) fputc('\n', stderr);
        fprintf(stderr, "epyq: %s\n", err.msg);
        return 1;
    }
    printf("epyq synth: wrote %s (%s %s, seed %" PRIu64 "): %zu tensors (%zu int4 linears) in %zu shards, "
           "%.3f GB in %.1f s (%.0f MB/s)\n",
           o.out_dir, shape, epyq_synth_format_name(o.format), o.seed, st.n_tensors, st.n_q4_modules,
           st.n_shards, (double)st.file_bytes / 1e9, st.seconds,
           st.seconds > 0 ? (double)st.file_bytes / 1e6 / st.seconds : 0.0);
    return 0;
}
