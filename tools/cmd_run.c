/* tools/cmd_run.c — `epyq run`: one-shot generation to stdout.
 * The prompt is used as raw text (no BOS: Qwen adds none) or, with --chat, rendered through the
 * checkpoint's chat template as one user turn with the generation prompt. Generated text streams
 * to stdout; a one-line summary goes to stderr. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "chat/chat.h"
#include "core/util.h"
#include "model/spec.h"
#include "tools/cmd.h"
#include "tools/ep_mpi.h"
#include "tools/gen.h"
#include "tools/tool_model.h"

#include "vision/prompt.h"

static volatile sig_atomic_t g_cancel;
static void on_sigint(int sig) {
    (void)sig;
    g_cancel = 1;
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: epyq run (-m DIR | --synthetic SHAPE[:FORMAT]) (-p TEXT | -f FILE) [options]\n"
        "\n"
        "  -m, --model DIR        checkpoint folder (with its tokenizer files)\n"
        "  --synthetic SPEC       generated model, e.g. tiny:ct or 35b-a3b:ct\n"
        "  -p, --prompt TEXT      prompt text\n"
        "  -f, --file FILE        read the prompt from FILE\n"
        "  -n, --n-predict N      tokens to generate (default 128)\n"
        "  --chat                 render the prompt as a user turn with the chat template\n"
        "  --no-think             with --chat: enable_thinking = false\n"
        "  --image FILE           a PNG or JPEG (repeatable): with --chat the user turn starts with\n"
        "                         the images; without it the prompt carries one\n"
        "                         <|vision_start|><|image_pad|><|vision_end|> per image\n"
        "  -c, --ctx-size N       context (default: prompt + n + 16, at most the model's; a -c\n"
        "                         above max_position_embeddings is refused)\n"
        "  -t, --threads N        threads (default: all allowed CPUs)\n"
        "  -s, --seed N           sampling seed (default 0)\n"
        "  --temp X, --top-k N, --top-p X, --min-p X, --repeat-penalty X, --presence-penalty X\n"
        "                         sampling (defaults from generation_config.json; --temp 0 = greedy)\n"
        "  --path a16|a8|a8all    int4 kernels' numeric path: a8 (default) int8 activations in\n"
        "                         the routed experts, a16 none, a8all in every int4 linear\n"
        "                         (faster prompts, looser numerics: README)\n"
        "  --ep                   under mpirun/srun: one model over the ranks, each holding 1/N\n"
        "                         of the routed experts (rank 0 prints; README: --ep)\n"
        "%s%s"
        "  -h, --help             this text\n",
        epyq_tool_spec_help, epyq_tool_rt_help);
}

static void print_text(void *ctx, const char *text, size_t len) {
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

typedef struct {
    const char *dir, *synthetic, *prompt, *file;
    int n_predict, ctx, threads;
    bool chat, no_think;
    const char *images[16];
    int n_images;
    epyq_numpath path;
    int spec_k;             /* --spec mtp: drafts per step; 0 = off */
    epyq_tool_spec spec;    /* --spec, --draft, --draft-head */
    /* sampling overrides: NAN / -1 = keep generation_config's */
    double temp, top_p, min_p, rep, pres;
    long top_k;
    unsigned long long seed;
    epyq_tool_rt rt; /* --kv-type, --numa... */
    bool ep;         /* --ep */
} opts;

static int parse(int argc, char **argv, opts *o) {
    enum {
        O_CHAT = 256,
        O_NOTHINK,
        O_TEMP,
        O_TOPK,
        O_TOPP,
        O_MINP,
        O_REP,
        O_PRES,
        O_PATH,
        O_SYN,
        O_IMAGE,
        O_EP
    };
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"synthetic", required_argument, 0, O_SYN},
                                       {"prompt", required_argument, 0, 'p'},
                                       {"file", required_argument, 0, 'f'},
                                       {"n-predict", required_argument, 0, 'n'},
                                       {"chat", no_argument, 0, O_CHAT},
                                       {"no-think", no_argument, 0, O_NOTHINK},
                                       {"ctx-size", required_argument, 0, 'c'},
                                       {"threads", required_argument, 0, 't'},
                                       {"seed", required_argument, 0, 's'},
                                       {"temp", required_argument, 0, O_TEMP},
                                       {"top-k", required_argument, 0, O_TOPK},
                                       {"top-p", required_argument, 0, O_TOPP},
                                       {"min-p", required_argument, 0, O_MINP},
                                       {"repeat-penalty", required_argument, 0, O_REP},
                                       {"presence-penalty", required_argument, 0, O_PRES},
                                       {"path", required_argument, 0, O_PATH},
                                       {"image", required_argument, 0, O_IMAGE},
                                       {"ep", no_argument, 0, O_EP},
                                       {"help", no_argument, 0, 'h'},
                                       EPYQ_TOOL_SPEC_LONGOPTS,
                                       EPYQ_TOOL_RT_LONGOPTS,
                                       {0, 0, 0, 0}};
    epyq_tool_spec_init(&o->spec);
    o->n_predict = 128;
    o->path = EPYQ_PATH_A8; /* the runtime default: see epyq_model_opts.path */
    o->temp = o->top_p = o->min_p = o->rep = o->pres = -1;
    o->top_k = -1;
    int c;
    char *end;
    if (epyq_tool_rt_init(&o->rt, "epyq run")) return 2;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:f:n:c:t:s:h", lo, NULL)) != -1) {
        int rt = epyq_tool_rt_opt(&o->rt, "epyq run", c, optarg);
        if (rt == 1) rt = epyq_tool_spec_opt(&o->spec, "epyq run", c, optarg);
        if (rt != 1) {
            if (rt) return rt;
            continue;
        }
        switch (c) {
        case 'm': o->dir = optarg; break;
        case O_SYN: o->synthetic = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'f': o->file = optarg; break;
        case O_CHAT: o->chat = true; break;
        case O_NOTHINK: o->no_think = true; break;
        case O_EP: o->ep = true; break;
        case O_IMAGE:
            if (o->n_images == 16)
                return fprintf(stderr, "epyq run: --image: at most 16 images\n"), 2;
            o->images[o->n_images++] = optarg;
            break;
        case 'n': case 'c': case 't': case O_TOPK: {
            long v;
            if (epyq_tool_opt_long("epyq run", optarg, 0, 1 << 28, &v)) return 2;
            if (c == 'n') o->n_predict = (int)v;
            else if (c == 'c') o->ctx = (int)v;
            else if (c == 't') o->threads = (int)v;
            else o->top_k = v;
            break;
        }
        case 's': o->seed = strtoull(optarg, &end, 10); if (*end) return fprintf(stderr, "epyq run: bad seed '%s'\n", optarg), 2; break;
        case O_TEMP: case O_TOPP: case O_MINP: case O_REP: case O_PRES: {
            double v = strtod(optarg, &end);
            if (*end || v < 0) return fprintf(stderr, "epyq run: bad value '%s'\n", optarg), 2;
            *(c == O_TEMP ? &o->temp : c == O_TOPP ? &o->top_p : c == O_MINP ? &o->min_p : c == O_REP ? &o->rep : &o->pres) = v;
            break;
        }
        case O_PATH:
            if (epyq_tool_opt_path("epyq run", optarg, &o->path)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: fprintf(stderr, "epyq run: bad option (try --help)\n"); return 2;
        }
    }
    if (optind < argc) return fprintf(stderr, "epyq run: unexpected argument '%s'\n", argv[optind]), 2;
    o->spec_k = o->spec.on ? o->spec.draft : 0;
    if (!o->dir == !o->synthetic) return fprintf(stderr, "epyq run: give exactly one of -m DIR or --synthetic SPEC\n"), 2;
    if (!o->prompt == !o->file) return fprintf(stderr, "epyq run: give exactly one of -p TEXT or -f FILE\n"), 2;
    if (o->ep && o->rt.use_numa)
        return fprintf(
                   stderr,
                   "epyq run: --ep runs without NUMA placement: drop --numa* (and EPYQ_NUMA*)\n"),
               2;
    return -1;
}

/* The text the model sees: raw, or the chat template over one user message. */
static epyq_status build_prompt(const opts *o, const char *dir, const char *text, char **out, epyq_err *err) {
    if (!o->chat) {
        *out = strdup(text);
        return *out ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    }
    epyq_chat *chat = NULL;
    epyq_status st = epyq_chat_load(&chat, dir, err);
    if (st != EPYQ_OK) return st;
    cJSON *msgs = cJSON_CreateArray(), *m = cJSON_CreateObject(), *kw = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    if (o->n_images) { /* content parts: the images first, then the text (template placeholders) */
        cJSON *parts = cJSON_AddArrayToObject(m, "content"), *t = cJSON_CreateObject();
        for (int i = 0; i < o->n_images; i++) {
            cJSON *im = cJSON_CreateObject();
            cJSON_AddStringToObject(im, "type", "image");
            cJSON_AddItemToArray(parts, im);
        }
        cJSON_AddStringToObject(t, "type", "text");
        cJSON_AddStringToObject(t, "text", text);
        cJSON_AddItemToArray(parts, t);
    } else {
        cJSON_AddStringToObject(m, "content", text);
    }
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddBoolToObject(kw, "add_generation_prompt", 1);
    cJSON_AddBoolToObject(kw, "enable_thinking", !o->no_think);
    size_t len;
    st = epyq_chat_render(chat, msgs, kw, out, &len, err);
    cJSON_Delete(msgs);
    cJSON_Delete(kw);
    epyq_chat_free(chat);
    return st;
}

/* --image: the files through the tower; *ids becomes the prompt with each image's pads. */
static epyq_status image_prompt(const opts *o, const char *dir, int32_t **ids, size_t *n_ids,
                                epyq_vision_prompt *vp, epyq_err *err) {
    epyq_vision *v = NULL;
    epyq_vision_opts vo = {.n_threads = o->threads};
    epyq_image im[16] = {{0}};
    epyq_status st = epyq_vision_load(&v, dir, &vo, err);
    if (st != EPYQ_OK) goto done;
    for (int i = 0; i < o->n_images; i++)
        if ((st = epyq_image_load(&im[i], o->images[i], err)) != EPYQ_OK) goto done;
    st = epyq_vision_prompt_build(vp, v, im, o->images, o->n_images, *ids, (int32_t)*n_ids, err);
    if (st != EPYQ_OK) goto done;
    int32_t *cp = malloc((size_t)vp->n * sizeof *cp);
    if (!cp) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
        goto done;
    }
    memcpy(cp, vp->ids, (size_t)vp->n * sizeof *cp);
    free(*ids);
    *ids = cp, *n_ids = (size_t)vp->n;
    fprintf(stderr, "[ %d images: %d image tokens, encoded in %.2f s ]\n", vp->n_img,
            vp->image_tokens, vp->t_encode);
done:
    for (int i = 0; i < o->n_images; i++) epyq_image_free(&im[i]);
    epyq_vision_free(v);
    return st;
}

int epyq_cmd_run(int argc, char **argv) {
    opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    epyq_err err = {0};
    char *dir = NULL, *file_text = NULL, *prompt = NULL;
    epyq_tok *tok = NULL;
    epyq_model *m = NULL;
    epyq_gen g = {0};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    epyq_vision_prompt vp = {0};
    epyq_gen_stats gs = {0};
    epyq_ep *ep = NULL;
    epyq_status st = o.ep ? epyq_tool_ep_open(&ep, &argc, &argv, &err) : EPYQ_OK;
    const bool lead = !ep || ep->rank == 0; /* --ep: rank 0 prints, the others compute along */
    if (st != EPYQ_OK) goto done;
    if ((st = epyq_kern_init(&err)) != EPYQ_OK) goto done;
    if (ep && (st = epyq_tool_ep_check(ep, o.path, &err)) != EPYQ_OK) goto done;
    st = ep ? epyq_tool_ep_model_dir(ep, o.dir, o.synthetic, &dir, &err)
            : epyq_tool_model_dir(o.dir, o.synthetic, &dir, &err);
    if (st != EPYQ_OK) goto done;
    if (o.file && (st = epyq_file_read(o.file, (size_t)1 << 30, &file_text, NULL, &err)) != EPYQ_OK)
        goto done;
    if ((st = epyq_tok_load(&tok, dir, &err)) != EPYQ_OK) goto done;
    if ((st = build_prompt(&o, dir, o.file ? file_text : o.prompt, &prompt, &err)) != EPYQ_OK)
        goto done;
    if ((st = epyq_tok_encode(tok, prompt, strlen(prompt), &ids, &n_ids, &err)) != EPYQ_OK)
        goto done;
    if (o.n_images && (st = image_prompt(&o, dir, &ids, &n_ids, &vp, &err)) != EPYQ_OK) goto done;
    /* The context is settled from config.json before the weights are read: a -c the model
     * cannot hold or a prompt longer than the context is refused without a long load. A last
     * speculative step may verify up to --draft positions past the answer. */
    int32_t ctx = 0;
    int64_t want = (int64_t)n_ids + o.n_predict + 16 + (o.spec_k ? o.spec_k + 1 : 0);
    if ((st = epyq_tool_ctx_dir(dir, o.ctx ? o.ctx : want, o.ctx > 0, &ctx, &err)) != EPYQ_OK)
        goto done;
    if ((int64_t)n_ids > ctx) {
        st = epyq_err_set(&err, EPYQ_E_CTX_FULL,
                          "prompt has %zu tokens, context is %d (%s): %zu too many", n_ids, ctx,
                          o.ctx ? "-c" : "the model's maximum", n_ids - (size_t)ctx);
        goto done;
    }
    epyq_model_opts mo = {.path = o.path,
                          .n_threads = o.threads,
                          .skip_mtp = o.spec_k == 0,
                          .draft_head = o.spec_k ? o.spec.draft_head : EPYQ_REQUANT_NONE,
                          .draft_vocab = o.spec_k ? o.spec.draft_vocab : 0,
                          .numa = epyq_tool_rt_numa(&o.rt, o.threads),
                          .requant_lm_head = o.rt.rq_lm_head,
                          .requant_dense = o.rt.rq_dense,
                          .ep = ep};
    if ((st = epyq_tool_model_load(&m, dir, &mo, &err)) != EPYQ_OK) goto done;
    const epyq_config *cfg = epyq_model_config(m);
    epyq_sample_params sp;
    const epyq_sample_overrides so = {o.temp, o.top_p, o.min_p, o.rep, o.pres, o.top_k, o.seed};
    epyq_sample_overrides_apply(&so, cfg, &sp);
    if (o.spec_k && !epyq_model_has_mtp(m)) {
        st = epyq_err_set(&err, EPYQ_E_ARG, "--spec mtp: %s has no MTP head (mtp.* tensors)", dir);
        goto done;
    }
    if ((st = epyq_gen_init(&g, m, tok, ctx, o.rt.kv, &sp, &err)) != EPYQ_OK) goto done;
    if (lead) epyq_tool_ctx_report(m, ctx, 1, o.rt.kv);
    g.spec_k = o.spec_k;
    g.img = o.n_images ? &vp.img : NULL;
    if (ep) g.clock = epyq_tool_ep_clock, g.clock_ctx = ep;
    /* --ep: no Ctrl-C handler; the ranks would see the signal at different tokens and part,
     * so a signal ends the job (mpirun stops every rank) */
    if (!ep) signal(SIGINT, on_sigint);
    st = epyq_gen_generate(&g, ids, n_ids, o.n_predict, &g_cancel, lead ? print_text : NULL, NULL,
                           NULL, &gs, &err);
    signal(SIGINT, SIG_DFL);
    if (st == EPYQ_OK && ep) epyq_tool_ep_report(ep, "run", gs.n_gen, gs.t_gen);
    if (!lead) goto done;
    fputc('\n', stdout);
    fprintf(stderr,
            "[ prompt %d tokens, %.2f t/s | generation %d tokens, %.2f t/s | finish: %s ]\n",
            gs.n_prompt, gs.t_prompt > 0 ? gs.n_prompt / gs.t_prompt : 0.0, gs.n_gen,
            gs.t_gen > 0 ? gs.n_gen / gs.t_gen : 0.0, epyq_finish_name(gs.finish));
    if (o.spec_k && gs.spec_steps) {
        fprintf(stderr,
                "[ spec mtp:%d: %lld steps, %.2f tokens/step, accepted by position:", o.spec_k,
                (long long)gs.spec_steps, (double)gs.spec_emitted / (double)gs.spec_steps);
        for (int i = 0; i < o.spec_k && i < 8; i++)
            fprintf(stderr, " %.2f", (double)gs.spec_accepted[i] / (double)gs.spec_steps);
        fprintf(stderr, " ]\n");
    }
done:
    if (st != EPYQ_OK) {
        if (ep && ep->size > 1) fprintf(stderr, "epyq: rank %d: %s\n", ep->rank, err.msg);
        else
            fprintf(stderr, "epyq: %s\n", err.msg);
        if (ep) epyq_tool_ep_abort(ep, 1); /* the other ranks would wait in an exchange */
    }
    epyq_gen_free(&g);
    epyq_model_free(m);
    epyq_tok_free(tok);
    epyq_vision_prompt_free(&vp);
    free(ids), free(prompt), free(file_text), free(dir);
    epyq_tool_ep_close(ep);
    if (st != EPYQ_OK) return 1;
    return gs.finish == EPYQ_FINISH_CANCEL ? 130 : 0;
}
