/* tools/cmd_logits.c — `epyq logits`: conformance output for given token ids.
 *
 * Writes little-endian float32 logits [rows × vocab]: one row per prompt position, then one per
 * greedy decode step (row n-1+i chose decode token i, the layout of the fixtures'
 * logits_decode.f32 from row n-1 on), then with --mtp the draft rows (the fixtures'
 * mtp_logits.f32). A one-line JSON summary (argmax ids, drafts) goes to stdout. Runs the
 * optimised runtime model, or with --ref the double-precision reference (src/ref). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/util.h"
#include "model/model.h"
#include "model/sample.h"
#include "ref/ref_forward.h"
#include "tools/cmd.h"
#include "tools/ep_mpi.h"
#include "tools/tool_model.h"

#include "vision/prompt.h"

#define MAX_IDS 65536

static void usage(FILE *f) {
    fprintf(f,
            "usage: epyq logits -m DIR --ids 1,2,3 [--decode N] [--mtp] [-o FILE] [--ref]\n"
            "                   [--path a16|a8|a8all] [--isa LEVEL] [-t N] [--kv-type bf16|fp8]\n"
            "                   [--numa MODE] [--numa-split N] [--nodes LIST] [--cpu-range LIST]\n"
            "                   [--requant SPEC]\n"
            "\n"
            "Write float32 little-endian logits [rows x vocab] for every prompt position, then\n"
            "for N greedy decode steps (each feeds the previous argmax), then with --mtp the\n"
            "MTP draft rows. Prints a JSON line with the argmax of every row.\n"
            "\n"
            "  -m, --model DIR    checkpoint folder\n"
            "  --ids LIST         prompt token ids, comma-separated (no BOS is added)\n"
            "  -n, --decode N     greedy decode steps after the prompt (default 0)\n"
            "  --mtp              also run the MTP head: first pass over every prompt row, then\n"
            "                     --mtp-drafts chained drafts (default 2)\n"
            "  --mtp-drafts K     number of draft rows with --mtp\n"
            "  -o, --output FILE  where to write the logits (default: only the JSON summary)\n"
            "  --ref              use the plain-C double-precision reference (small models only)\n"
            "  --path P           int4 kernels' numeric path: a8 (default), a16 or a8all\n"
            "  --isa LEVEL        cap the kernels: ref|avx2|avx512|avx512_vnni|avx512_bf16|\n"
            "                     avx512_amx\n"
            "                     (same as EPYQ_MAX_ISA)\n"
            "  -t, --threads N    threads (default: one per allowed CPU)\n"
            "  --kv-type T        KV cache storage: bf16 (default) or fp8 (e4m3)\n"
            "  --requant SPEC     lm_head=int8|int4, dense=int8|int4: 16-bit linears\n"
            "                     requantised at load (default: exact)\n"
            "  --numa MODE        auto|off|distribute|isolate|numactl|replicate-dense; without\n"
            "                     a --numa flag: one pool, no binding (numa/README.md)\n"
            "  --numa-split N     run the routed experts on N logical nodes of this machine\n"
            "  --nodes LIST, --cpu-range LIST, --numa-fallback   as in epyq inspect --numa\n"
            "  -h, --help         this text\n");
    fputs("  --ep               under mpirun/srun: one model over the ranks, each holding 1/N of\n"
          "                     the routed experts (rank 0 writes the output; exchange and\n"
          "                     decode timings as a JSON line on stderr)\n",
          f);
    fprintf(
        f,
        "\nImages:\n"
        "  --image FILE       a PNG or JPEG for the prompt's k-th image (repeatable, in order);\n"
        "                     the ids carry one <|image_pad|> per image (expanded to its token\n"
        "                     count) or the full runs; positions are the 3-D M-RoPE ones\n");
}

typedef struct {
    const char *dir, *out;
    int ids[MAX_IDS], n_ids, n_decode, n_drafts, threads;
    bool mtp, ref;
    epyq_numpath path;
    epyq_tool_rt rt; /* --kv-type, --numa..., --requant (tools/tool_model.h) */
    const char *images[16];
    int n_images;
    epyq_vision_prompt vp; /* with --image: the expanded ids, image rows and positions */
    bool ep; /* --ep */
    const epyq_ep *epc;
} opts;

/* rows of the output: prompt + decode, then drafts */
typedef struct {
    float *rows;   /* [n_rows][V] */
    int32_t V, n_rows, n_trunk;
    int drafts[16];
    double decode_s; /* wall time of the decode steps */
} result;

static epyq_status run_ref(const opts *o, result *r, epyq_err *err) {
    epyq_weights *w = NULL;
    epyq_bind_opts bo = {.skip_mtp = !o->mtp};
    TRY(epyq_weights_bind(&w, o->dir, &bo, err));
    int32_t V = w->cfg.vocab_size, H = w->cfg.hidden_size, n = o->n_ids;
    epyq_ref *ref = NULL;
    double *lg = malloc((size_t)V * sizeof(double));
    double *hid = malloc((size_t)n * H * sizeof(double)), *ho = malloc((size_t)H * sizeof(double));
    epyq_status st = EPYQ_OK;
    if (!lg || !hid || !ho) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
        goto done;
    }
    if ((st = epyq_ref_create(&ref, w, n + o->n_decode + o->n_drafts + 1, err)) != EPYQ_OK)
        goto done;
    for (int t = 0; t < n + o->n_decode; t++) {
        /* prompt tokens, then each decode step feeds the previous row's argmax */
        int tok = t < n ? o->ids[t] : epyq_argmax(r->rows + (size_t)(t - 1) * V, V);
        if ((st = epyq_ref_forward(ref, tok, lg, t < n ? hid + (size_t)t * H : NULL, err)) !=
            EPYQ_OK)
            goto done;
        for (int32_t i = 0; i < V; i++) r->rows[(size_t)t * V + i] = (float)lg[i];
    }
    if (!o->mtp) goto done;
    int target = epyq_argmax(r->rows + (size_t)(n - 1) * V, V);
    for (int t = 0; t < n; t++)
        if ((st = epyq_ref_mtp(ref, hid + (size_t)t * H, t + 1 < n ? o->ids[t + 1] : target, t, lg,
                               ho, err)) != EPYQ_OK)
            goto done;
    for (int d = 0; d < o->n_drafts; d++) {
        float *row = r->rows + (size_t)(r->n_trunk + d) * V;
        for (int32_t i = 0; i < V; i++) row[i] = (float)lg[i];
        r->drafts[d] = epyq_argmax(row, V);
        if (d + 1 < o->n_drafts &&
            (st = epyq_ref_mtp(ref, ho, r->drafts[d], n + d, lg, ho, err)) != EPYQ_OK)
            goto done;
    }
done:
    epyq_ref_free(ref);
    free(lg), free(hid), free(ho);
    epyq_weights_free(w);
    return st;
}

static epyq_status run_model(const opts *o, result *r, epyq_err *err) {
    epyq_model *m = NULL;
    epyq_model_opts mo = {.path = o->path,
                          .n_threads = o->threads,
                          .skip_mtp = !o->mtp,
                          .numa = o->rt.use_numa ? &o->rt.numa : NULL,
                          .requant_lm_head = o->rt.rq_lm_head,
                          .requant_dense = o->rt.rq_dense};
    mo.ep = o->epc;
    TRY(epyq_model_load(&m, o->dir, &mo, err));
    int32_t V = r->V, H = epyq_model_config(m)->hidden_size, n = o->n_ids;
    epyq_seq *s = NULL;
    epyq_seq **seqs = malloc((size_t)n * sizeof *seqs);
    float *hid = malloc((size_t)n * H * sizeof(float)), *ho = NULL;
    int *tok = NULL, *pos = NULL;
    epyq_status st = EPYQ_OK;
    if (o->mtp && !epyq_model_has_mtp(m))
        st = epyq_err_set(err, EPYQ_E_ARG, "%s has no MTP head", o->dir);
    if (!seqs || !hid) st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    if (st != EPYQ_OK) goto done;
    if ((st = epyq_seq_create(&s, m, n + o->n_decode + o->n_drafts + 1, o->rt.kv, err)) != EPYQ_OK)
        goto done;
    for (int i = 0; i < n; i++) seqs[i] = s;
    epyq_batch b = {n, seqs, o->ids, NULL};
    if ((st = epyq_model_forward_img(m, &b, o->n_images ? &o->vp.img : NULL, r->rows, hid, err)) !=
        EPYQ_OK)
        goto done;
    double t0 = epyq_now();
    for (int t = n; t < n + o->n_decode; t++) {
        int next = epyq_argmax(r->rows + (size_t)(t - 1) * V, V);
        epyq_batch b1 = {1, seqs, &next, NULL};
        if ((st = epyq_model_forward(m, &b1, r->rows + (size_t)t * V, NULL, err)) != EPYQ_OK)
            goto done;
    }
    r->decode_s = epyq_now() - t0;
    if (!o->mtp) goto done;
    tok = malloc((size_t)n * sizeof(int)), pos = malloc((size_t)n * sizeof(int));
    ho = malloc((size_t)n * H * sizeof(float));
    if (!tok || !pos || !ho) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
        goto done;
    }
    for (int t = 0; t < n; t++) {
        tok[t] = t + 1 < n ? o->ids[t + 1] : epyq_argmax(r->rows + (size_t)(n - 1) * V, V);
        pos[t] = t;
    }
    float *row = r->rows + (size_t)r->n_trunk * V;
    if ((st = epyq_model_mtp(m, s, n, hid, tok, pos, 1, row, ho, err)) != EPYQ_OK) goto done;
    const float *h = ho + (size_t)(n - 1) * H;
    for (int d = 0; d < o->n_drafts; d++) {
        r->drafts[d] = epyq_argmax(row, V);
        if (d + 1 == o->n_drafts) break;
        int p = n + d;
        row += V;
        if ((st = epyq_model_mtp(m, s, 1, h, &r->drafts[d], &p, 1, row, ho, err)) != EPYQ_OK)
            goto done;
        h = ho;
    }
done:
    free(tok), free(pos), free(ho);
    epyq_seq_free(s);
    free(seqs), free(hid);
    epyq_model_free(m);
    return st;
}

static int parse(int argc, char **argv, opts *o) {
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"ids", required_argument, 0, 'i'},
                                       {"decode", required_argument, 0, 'n'},
                                       {"mtp", no_argument, 0, 'M'},
                                       {"mtp-drafts", required_argument, 0, 'D'},
                                       {"output", required_argument, 0, 'o'},
                                       {"ref", no_argument, 0, 'R'},
                                       {"path", required_argument, 0, 'P'},
                                       {"isa", required_argument, 0, 'I'},
                                       {"threads", required_argument, 0, 't'},
                                       {"help", no_argument, 0, 'h'},
                                       EPYQ_TOOL_RT_LONGOPTS,
                                       {"image", required_argument, 0, 'G'},
                                       {"ep", no_argument, 0, 'E'},
                                       {0, 0, 0, 0}};
    o->n_drafts = 2;
    o->path = EPYQ_PATH_A8; /* the runtime default: see epyq_model_opts.path */
    o->n_ids = -1;
    epyq_tool_rt_defaults(&o->rt);
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:o:t:h", lo, NULL)) != -1) {
        int rt = epyq_tool_rt_opt(&o->rt, "epyq logits", c, optarg);
        if (rt != 1) {
            if (rt) return rt;
            continue;
        }
        switch (c) {
        case 'm': o->dir = optarg; break;
        case 'i':
            o->n_ids = epyq_parse_int_list(optarg, o->ids, MAX_IDS);
            if (o->n_ids < 1) return fprintf(stderr, "epyq logits: --ids: expected a list like 1,2,3\n"), 2;
            break;
        case 'n':
        case 'D':
        case 't': {
            long v;
            if (epyq_tool_opt_long("epyq logits", optarg, c == 'D' ? 1 : 0, c == 'D' ? 16 : MAX_IDS, &v)) return 2;
            *(c == 'n' ? &o->n_decode : c == 'D' ? &o->n_drafts : &o->threads) = (int)v;
            break;
        }
        case 'M': o->mtp = true; break;
        case 'o': o->out = optarg; break;
        case 'G':
            if (o->n_images == 16)
                return fprintf(stderr, "epyq logits: --image: at most 16 images\n"), 2;
            o->images[o->n_images++] = optarg;
            break;
        case 'R': o->ref = true; break;
        case 'E': o->ep = true; break;
        case 'P':
            if (epyq_tool_opt_path("epyq logits", optarg, &o->path)) return 2;
            break;
        case 'I':
            if (epyq_isa_parse(optarg) < 0)
                return fprintf(stderr, "epyq logits: --isa: expected ref|avx2|avx512|avx512_vnni|"
                                       "avx512_bf16|avx512_amx\n"),
                       2;
            setenv("EPYQ_MAX_ISA", optarg, 1);
            break;
        case 'h': usage(stdout); return 0;
        default: fprintf(stderr, "epyq logits: bad option (try --help)\n"); return 2;
        }
    }
    if (optind < argc) return fprintf(stderr, "epyq logits: unexpected argument '%s'\n", argv[optind]), 2;
    if (!o->dir || o->n_ids < 1) return fprintf(stderr, "epyq logits: -m DIR and --ids are required\n"), 2;
    if (o->ep && (o->ref || o->rt.use_numa))
        return fprintf(
                   stderr,
                   "epyq logits: --ep runs the runtime model without --numa: drop --ref / --numa*\n"),
               2;
    o->rt.numa.n_threads = o->threads;
    if (o->n_ids + o->n_decode + 1 > MAX_IDS) return fprintf(stderr, "epyq logits: too many positions\n"), 2;
    if (o->n_images && (o->ref || o->mtp))
        return fprintf(stderr,
                       "epyq logits: --image runs the runtime trunk only (not --ref or --mtp)\n"),
               2;
    return -1;
}

/* --image: decode the files, run the tower, and replace the ids by the expanded prompt. */
static epyq_status image_prompt(opts *o, epyq_err *err) {
    epyq_vision *v = NULL;
    epyq_vision_opts vo = {.n_threads = o->threads};
    epyq_image im[16] = {{0}};
    epyq_status st = epyq_vision_load(&v, o->dir, &vo, err);
    if (st != EPYQ_OK) goto done;
    for (int i = 0; i < o->n_images; i++)
        if ((st = epyq_image_load(&im[i], o->images[i], err)) != EPYQ_OK) goto done;
    st = epyq_vision_prompt_build(&o->vp, v, im, o->images, o->n_images, o->ids, o->n_ids, err);
    if (st != EPYQ_OK) goto done;
    if (o->vp.n + o->n_decode + 1 > MAX_IDS) {
        st = epyq_err_set(err, EPYQ_E_ARG, "prompt with images: %d tokens, at most %d", o->vp.n,
                          MAX_IDS - o->n_decode - 1);
        goto done;
    }
    memcpy(o->ids, o->vp.ids, (size_t)o->vp.n * sizeof *o->ids);
    o->n_ids = o->vp.n;
    fprintf(stderr, "epyq logits: %d images, %d image tokens, encoded in %.3f s\n", o->n_images,
            o->vp.image_tokens, o->vp.t_encode);
done:
    for (int i = 0; i < o->n_images; i++) epyq_image_free(&im[i]);
    epyq_vision_free(v);
    return st;
}

int epyq_cmd_logits(int argc, char **argv) {
    opts *o = calloc(1, sizeof *o);
    if (!o) return fprintf(stderr, "epyq: out of memory\n"), 1;
    int rc = parse(argc, argv, o);
    if (rc >= 0) {
        free(o);
        return rc;
    }
    epyq_err err = {0};
    epyq_ep *ep = NULL;
    epyq_status st = o->ep ? epyq_tool_ep_open(&ep, &argc, &argv, &err) : EPYQ_OK;
    o->epc = ep;
    const bool lead = !ep || ep->rank == 0; /* --ep: rank 0 writes and prints */
    epyq_config cfg;
    bool have_cfg = false;
    result r = {0};
    if (st != EPYQ_OK) goto done;
    if ((st = epyq_kern_init(&err)) != EPYQ_OK) goto done;
    if (ep && (st = epyq_tool_ep_check(ep, o->path, &err)) != EPYQ_OK) goto done;
    if ((st = epyq_config_load(&cfg, o->dir, &err)) != EPYQ_OK) goto done;
    have_cfg = true;
    if (o->n_images && (st = image_prompt(o, &err)) != EPYQ_OK) goto done;
    r.V = cfg.vocab_size;
    r.n_trunk = o->n_ids + o->n_decode;
    r.n_rows = r.n_trunk + (o->mtp ? o->n_drafts : 0);
    r.rows = calloc((size_t)r.n_rows * r.V, sizeof(float));
    if (!r.rows) {
        st = epyq_err_set(&err, EPYQ_E_NOMEM, "logits [%d][%d]: out of memory", r.n_rows, r.V);
        goto done;
    }
    if ((st = o->ref ? run_ref(o, &r, &err) : run_model(o, &r, &err)) != EPYQ_OK) goto done;
    if (ep) epyq_tool_ep_report(ep, "logits", o->n_decode, r.decode_s);
    if (!lead) goto done;
    if (o->out && (st = epyq_file_write_atomic(
                       o->out, r.rows, (size_t)r.n_rows * r.V * sizeof(float), &err)) != EPYQ_OK)
        goto done;
    printf("{\"rows\": %d, \"vocab\": %d, \"prompt\": %d, \"decode\": %d, \"argmax\": [", r.n_rows,
           r.V, o->n_ids, o->n_decode);
    for (int i = 0; i < r.n_trunk; i++)
        printf("%s%d", i ? ", " : "", epyq_argmax(r.rows + (size_t)i * r.V, r.V));
    printf("], \"drafts\": [");
    for (int d = 0; o->mtp && d < o->n_drafts; d++) printf("%s%d", d ? ", " : "", r.drafts[d]);
    printf("], \"engine\": \"%s\"}\n", o->ref ? "ref" : epyq_kern()->name);
done:
    if (st != EPYQ_OK) {
        fprintf(stderr, "epyq: %s\n", err.msg);
        if (ep) { /* the other ranks wait for this one's next exchange: end them all */
            fflush(stderr);
            epyq_tool_ep_abort(ep, 1);
        }
    }
    epyq_tool_ep_close(ep);
    if (have_cfg) epyq_config_free(&cfg);
    epyq_vision_prompt_free(&o->vp);
    free(r.rows);
    free(o);
    return st == EPYQ_OK ? 0 : 1;
}
