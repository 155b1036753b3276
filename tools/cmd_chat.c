/* tools/cmd_chat.c — `epyq chat`: an interactive REPL over the checkpoint's chat template.
 *
 * Each turn renders the whole message history with the template. The sequence keeps what it
 * was fed (prompt + generated tokens minus the last sampled one); when the new prompt's ids
 * extend those, only the suffix is fed. The Qwen template drops earlier turns' reasoning, so
 * the new prompt usually parts from the old sequence where the last answer began: it then
 * starts from the longest copy of the state taken at a checkpoint of an earlier prompt
 * (tools/chat_state.c; --cache-mb, --cache-every as in batch and serve). --session FILE and
 * /save, /load carry the conversation and its state across runs (src/engine/session.h).
 *
 * Ctrl-C during an answer stops it at the next token; the partial answer is KEPT in the
 * history as the assistant's message (what the user saw is what the model will see next).
 * Ctrl-C while idle, or a second one while an answer is being cancelled, exits with 130.
 * With stdin not a TTY: no banner, no prompt, one input line = one user turn, reasoning
 * between [Start thinking] / [End thinking] markers. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <editline/readline.h>

#include "chat/chat.h"
#include "chat/reasoning.h"
#include "core/util.h"
#include "engine/session.h"
#include "tools/chat_repl.h"
#include "tools/cmd.h"
#include "tools/tool_model.h"

#define DIM_ON "\033[2;3m"
#define DIM_OFF "\033[0m"

static volatile sig_atomic_t g_cancel;     /* set by the first Ctrl-C of an answer */
static volatile sig_atomic_t g_generating; /* an answer is being produced */

/* Async-signal-safe: only flags, write() and _exit(). */
static void on_signal(int sig) {
    if (sig == SIGINT && g_generating && !g_cancel) {
        g_cancel = 1;
        return;
    }
    static const char reset[] = DIM_OFF "\n";
    if (isatty(STDOUT_FILENO)) (void)!write(STDOUT_FILENO, reset, sizeof reset - 1);
    _exit(sig == SIGTERM ? 143 : 130);
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: epyq chat (-m DIR | --synthetic SHAPE[:FORMAT]) [options]\n"
        "\n"
        "  -m, --model DIR        checkpoint folder (with its tokenizer files)\n"
        "  --synthetic SPEC       generated model, e.g. tiny:ct or 35b-a3b:ct\n"
        "  -sys, --system TEXT    system prompt\n"
        "  -n, --n-predict N      most tokens per answer (default 1024)\n"
        "  --no-think             start with thinking off (/think on|off toggles)\n"
        "  -c, --ctx-size N       context (default 8192 capped at the model's; a -c above\n"
        "                         max_position_embeddings is refused)\n"
        "  -t, --threads N        threads (default: all allowed CPUs)\n"
        "  -s, --seed N           sampling seed (default 0)\n"
        "  --temp X, --top-k N, --top-p X, --min-p X, --repeat-penalty X, --presence-penalty X\n"
        "                         sampling (defaults from generation_config.json; --temp 0 = greedy)\n"
        "  --cache-mb N           prompt state copies kept across turns, MB (default 1024, 0 = off)\n"
        "  --cache-every N        copy the prompt state every N tokens (default 256), at the end\n"
        "                         of the system prompt and of the history before each answer\n"
        "  --session FILE         continue the session in FILE when it exists (conversation and\n"
        "                         state, no prompt recomputed); save it there after each answer\n"
        "%s%s"
        "  -h, --help             this text\n"
        "\n"
        "Commands in the REPL: /help. Ctrl-C stops an answer (the partial answer stays in the\n"
        "history); Ctrl-C while idle exits (status 130). Piped stdin: one line = one user turn.\n",
        epyq_tool_spec_help, epyq_tool_rt_help);
}

static const char help_text[] =
    "  /help            this list\n"
    "  /clear           forget the conversation (keeps the system prompt)\n"
    "  /regen           drop the last answer and generate it again\n"
    "  /system TEXT     set the system prompt (empty TEXT removes it)\n"
    "  /think on|off    let the model reason before answering\n"
    "  /read FILE       put FILE's text before your next message\n"
    "  /image FILE      attach a PNG or JPEG to your next message (repeatable)\n"
    "  /save FILE       write the conversation and its state (FILE.json: the conversation\n"
    "                   only, as JSON)\n"
    "  /load FILE       replace the conversation (and state) with a saved one\n"
    "  /stats           context use, cached/computed prompt tokens, first-token time, memory\n"
    "  /exit            quit (also Ctrl-D)\n";

typedef struct {
    const char *dir, *synthetic, *system, *session;
    int n_predict, ctx, threads;
    int cache_mb, cache_every; /* prefix reuse across turns (tools/chat_state.c) */
    bool no_think;
    double temp, top_p, min_p, rep, pres; /* < 0 = keep generation_config's */
    long top_k;
    unsigned long long seed;
    bool ctx_set;    /* -c given */
    epyq_tool_rt rt; /* --kv-type, --numa... */
    epyq_tool_spec spec; /* --spec, --draft, --draft-head */
} opts;

static int parse(int argc, char **argv, opts *o) {
    enum {
        O_NOTHINK = 256,
        O_TEMP,
        O_TOPK,
        O_TOPP,
        O_MINP,
        O_REP,
        O_PRES,
        O_SYN,
        O_SYS,
        O_CACHE_MB,
        O_CACHE_EVERY,
        O_SESSION
    };
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"synthetic", required_argument, 0, O_SYN},
                                       {"system", required_argument, 0, O_SYS},
                                       {"sys", required_argument, 0, O_SYS},
                                       {"n-predict", required_argument, 0, 'n'},
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
                                       {"cache-mb", required_argument, 0, O_CACHE_MB},
                                       {"cache-every", required_argument, 0, O_CACHE_EVERY},
                                       {"session", required_argument, 0, O_SESSION},
                                       {"help", no_argument, 0, 'h'},
                                       EPYQ_TOOL_SPEC_LONGOPTS,
                                       EPYQ_TOOL_RT_LONGOPTS,
                                       {0, 0, 0, 0}};
    epyq_tool_spec_init(&o->spec);
    o->n_predict = 1024;
    o->ctx = 8192;
    o->temp = o->top_p = o->min_p = o->rep = o->pres = -1;
    o->top_k = -1;
    o->cache_mb = 1024, o->cache_every = 256;
    int c;
    char *end;
    optind = 1;
    /* getopt_long_only would also take llama.cpp's single-dash "-sys"; plain getopt_long
     * would read it as -s ys, so map it by hand first. */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-sys")) argv[i] = "--system";
    if (epyq_tool_rt_init(&o->rt, "epyq chat")) return 2;
    while ((c = getopt_long(argc, argv, "m:n:c:t:s:h", lo, NULL)) != -1) {
        int rt = epyq_tool_rt_opt(&o->rt, "epyq chat", c, optarg);
        if (rt == 1) rt = epyq_tool_spec_opt(&o->spec, "epyq chat", c, optarg);
        if (rt != 1) {
            if (rt) return rt;
            continue;
        }
        switch (c) {
        case 'm': o->dir = optarg; break;
        case O_SYN: o->synthetic = optarg; break;
        case O_SYS: o->system = optarg; break;
        case O_NOTHINK: o->no_think = true; break;
        case O_SESSION: o->session = optarg; break;
        case O_CACHE_MB:
        case O_CACHE_EVERY: {
            long v;
            if (epyq_tool_opt_long("epyq chat", optarg, c == O_CACHE_MB ? 0 : 1, 1 << 24, &v))
                return 2;
            *(c == O_CACHE_MB ? &o->cache_mb : &o->cache_every) = (int)v;
            break;
        }
        case 'n': case 'c': case 't': case O_TOPK: {
            long v;
            if (epyq_tool_opt_long("epyq chat", optarg, 0, 1 << 28, &v)) return 2;
            if (c == 'n') o->n_predict = (int)v;
            else if (c == 'c') o->ctx = (int)v, o->ctx_set = true;
            else if (c == 't') o->threads = (int)v;
            else o->top_k = v;
            break;
        }
        case 's':
            o->seed = strtoull(optarg, &end, 10);
            if (*end) return fprintf(stderr, "epyq chat: bad seed '%s'\n", optarg), 2;
            break;
        case O_TEMP: case O_TOPP: case O_MINP: case O_REP: case O_PRES: {
            double v = strtod(optarg, &end);
            if (*end || v < 0) return fprintf(stderr, "epyq chat: bad value '%s'\n", optarg), 2;
            *(c == O_TEMP ? &o->temp : c == O_TOPP ? &o->top_p : c == O_MINP ? &o->min_p : c == O_REP ? &o->rep : &o->pres) = v;
            break;
        }
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "epyq chat: bad option or missing value: '%s' (try --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) return fprintf(stderr, "epyq chat: unexpected argument '%s'\n", argv[optind]), 2;
    if (!o->dir == !o->synthetic) return fprintf(stderr, "epyq chat: give exactly one of -m DIR or --synthetic SPEC\n"), 2;
    if (o->n_predict < 1 || o->ctx < 16) return fprintf(stderr, "epyq chat: -n must be >= 1 and -c >= 16\n"), 2;
    return -1;
}

/* Model text to the terminal: C0/C1 control characters other than newline and tab are shown
 * as '?', so generated escape sequences cannot retitle, recolour or confuse the terminal
 * (random synthetic weights emit plenty of them). Pipes get the bytes unchanged. */
static void put_text(const repl *r, const char *s, size_t n) {
    if (!r->tty_out) {
        fwrite(s, 1, n, stdout);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) c = '?';
        else if (c == 0xc2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 && (unsigned char)s[i + 1] < 0xa0) {
            i++; /* U+0080..U+009F */
            c = '?';
        }
        putchar(c);
    }
}

static void out_reasoning(repl *r, const char *s, size_t n) {
    if (!n) return;
    if (!r->in_think_shown) {
        fputs(r->tty_out ? DIM_ON : "[Start thinking]\n", stdout);
        r->in_think_shown = true;
    }
    put_text(r, s, n);
}

static void out_content(repl *r, const char *s, size_t n) {
    if (!n) return;
    if (r->in_think_shown) {
        fputs(r->tty_out ? DIM_OFF : "\n[End thinking]\n", stdout);
        r->in_think_shown = false;
    }
    put_text(r, s, n);
}

/* Streaming text → reasoning parser → styled output; both parts are kept for the history. */
static void on_text(void *ctx, const char *text, size_t len) {
    repl *r = ctx;
    size_t r0 = r->reasoning.len, c0 = r->content.len;
    epyq_err e;
    if (epyq_reasoning_push(r->rp, text, len, &r->reasoning, &r->content, &e) != EPYQ_OK) return;
    /* a buffer that has not grown yet is NULL: only offset into it when it holds new text */
    if (r->reasoning.len > r0) out_reasoning(r, r->reasoning.p + r0, r->reasoning.len - r0);
    if (r->content.len > c0) out_content(r, r->content.p + c0, r->content.len - c0);
    fflush(stdout);
}

static bool is_role(const cJSON *m, const char *role) {
    const cJSON *ro = cJSON_GetObjectItemCaseSensitive(m, "role");
    return cJSON_IsString(ro) && !strcmp(ro->valuestring, role);
}

static void add_msg(cJSON *msgs, const char *role, const char *content, const char *reasoning) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    if (reasoning && *reasoning) cJSON_AddStringToObject(m, "reasoning_content", reasoning);
    cJSON_AddItemToArray(msgs, m);
}

/* One answer to the history as it stands (its last message is the user's). On success the
 * answer is appended as an assistant message. */
static epyq_status answer(repl *r, epyq_err *err) {
    char *prompt = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    double t0 = epyq_now();
    epyq_status st = chat_render(r, r->msgs, true, &prompt, &ids, &n_ids, err);
    if (st == EPYQ_OK) st = chat_image_prompt(r, &ids, &n_ids, err); /* pads expanded, gen.img */
    int32_t ctx = epyq_seq_ctx(r->gen.seq);
    if (st == EPYQ_OK && (int64_t)n_ids >= ctx)
        st = epyq_err_set(err, EPYQ_E_CTX_FULL,
                          "the conversation needs %zu tokens, the context holds %d: /clear or -c", n_ids, ctx);
    if (st != EPYQ_OK) {
        free(prompt), free(ids);
        return st;
    }
    /* Reuse what the sequence holds or a cached copy (not after speculative decoding: its
     * sequence also holds verified tokens past where the answer stopped). */
    size_t from = chat_prepare(r, ids, n_ids);
    int32_t room = ctx - (int32_t)n_ids;
    int32_t max_new = r->n_predict < room ? r->n_predict : room;

    r->rp = epyq_reasoning_new(epyq_chat_prompt_opens_think(prompt, strlen(prompt)));
    memset(&r->reasoning, 0, sizeof r->reasoning);
    memset(&r->content, 0, sizeof r->content);
    r->in_think_shown = false;
    if (!r->rp) st = epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    /* Each answer draws from its own seed (base + answer count): /regen gives a new sample,
     * and a session replayed with the same inputs and -s gives the same answers. */
    r->gen.sp.seed = r->seed + r->n_answers++;
    g_cancel = 0;
    g_generating = 1;
    int32_t pos0 = (int32_t)from;
    double t_prep = epyq_now() - t0; /* render, tokenize, restore */
    if (st == EPYQ_OK)
        st = epyq_gen_generate_from(&r->gen, ids, n_ids, from, max_new, &g_cancel, on_text, r,
                                    r->gen_ids, &r->last, err);
    r->last_cached = (int32_t)from;
    r->last_ttft = t_prep + r->last.t_first;
    if (st == EPYQ_OK) r->total_cached += from, r->total_computed += n_ids - from;
    g_generating = 0;
    if (st == EPYQ_OK) {
        epyq_reasoning_finish(r->rp, &r->reasoning, &r->content, err);
        out_content(r, "", 0);
        if (r->in_think_shown) fputs(r->tty_out ? DIM_OFF : "\n[End thinking]\n", stdout);
        fputc('\n', stdout);
        fflush(stdout);
    }
    /* Record exactly what the sequence now holds: prompt then generated ids, up to its position
     * (the last sampled token was never fed; a cancelled prefill stops part way). */
    int32_t pos = epyq_seq_pos(r->gen.seq);
    for (int32_t p = pos0; p < pos; p++) {
        size_t i = (size_t)p;
        r->held[p] = i < n_ids ? ids[i] : r->gen_ids[i - n_ids];
    }
    r->n_held = pos;
    if (st == EPYQ_OK)
        add_msg(r->msgs, "assistant", r->content.p ? r->content.p : "", r->reasoning.p);
    epyq_reasoning_free(r->rp);
    r->rp = NULL;
    epyq_sbuf_free(&r->reasoning);
    epyq_sbuf_free(&r->content);
    if (st == EPYQ_OK) {
        const epyq_gen_stats *s = &r->last;
        if (s->finish == EPYQ_FINISH_CANCEL) fprintf(stderr, "[ stopped; the partial answer is kept ]\n");
        fprintf(
            stderr,
            "[ prompt %d computed + %d cached, first token %.2f s, %.2f t/s | generation %.2f t/s ]\n",
            s->n_prompt, r->last_cached, r->last_ttft,
            s->t_prompt > 0 ? s->n_prompt / s->t_prompt : 0.0,
            s->t_gen > 0 ? s->n_gen / s->t_gen : 0.0);
        /* Warn once an eighth of the context is left: room for about one more exchange. */
        if (pos >= ctx - ctx / 8)
            fprintf(stderr, "[ context %d of %d used: it is nearly full, /clear to start over ]\n", pos, ctx);
        /* the answer stands whatever the save does: a failed save is only reported */
        epyq_err e2 = {0};
        if (r->session && chat_session_save(r, r->session, &e2) != EPYQ_OK)
            fprintf(stderr, "epyq: %s\n", e2.msg);
    }
    free(prompt), free(ids);
    return st;
}

static void drop_last_assistant(repl *r) {
    int n = cJSON_GetArraySize(r->msgs);
    if (n > 0 && is_role(cJSON_GetArrayItem(r->msgs, n - 1), "assistant")) cJSON_DeleteItemFromArray(r->msgs, n - 1);
}

/* Keeps only the system message. */
static void forget_turns(repl *r) {
    int n = cJSON_GetArraySize(r->msgs);
    for (int i = n - 1; i >= 0; i--)
        if (!is_role(cJSON_GetArrayItem(r->msgs, i), "system")) cJSON_DeleteItemFromArray(r->msgs, i);
}

static void set_system(repl *r, const char *text) {
    if (cJSON_GetArraySize(r->msgs) > 0 && is_role(cJSON_GetArrayItem(r->msgs, 0), "system"))
        cJSON_DeleteItemFromArray(r->msgs, 0);
    if (!*text) return;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "system");
    cJSON_AddStringToObject(m, "content", text);
    cJSON_InsertItemInArray(r->msgs, 0, m);
}

/* FILE.json: the conversation only (portable, the state is recomputed); otherwise a session. */
static bool is_json_name(const char *path) {
    size_t n = strlen(path);
    return n >= 5 && !strcmp(path + n - 5, ".json");
}

static epyq_status save_conv(repl *r, const char *path, epyq_err *err) {
    if (!is_json_name(path)) return chat_session_save(r, path, err);
    char *s = chat_conv_json(r);
    if (!s) return epyq_err_set(err, EPYQ_E_NOMEM, "out of memory");
    size_t n = strlen(s);
    s[n] = '\n'; /* cJSON_Print's NUL becomes the last line's end */
    epyq_status st = epyq_file_write_atomic(path, s, n + 1, err);
    free(s);
    return st;
}

/* A session file (by its magic) or a JSON conversation. */
static epyq_status load_conv(repl *r, const char *path, epyq_err *err) {
    chat_image_drop(r, -1); /* saved conversations carry no images */
    if (epyq_session_sniff(path)) return chat_session_load(r, path, err);
    char *text = NULL;
    size_t len = 0;
    epyq_status st = epyq_file_read(path, (size_t)64 << 20, &text, &len, err);
    cJSON *msgs = NULL;
    if (st == EPYQ_OK) st = chat_conv_parse(path, text, len, &msgs, &r->think, err);
    free(text);
    if (st != EPYQ_OK) return st;
    cJSON_Delete(r->msgs);
    r->msgs = msgs;
    return EPYQ_OK;
}

static void print_stats(const repl *r) {
    const epyq_gen_stats *s = &r->last;
    int32_t pos = epyq_seq_pos(r->gen.seq), ctx = epyq_seq_ctx(r->gen.seq);
    printf("context     %d of %d tokens (%.1f%%), %d messages, thinking %s\n", pos, ctx, 100.0 * pos / ctx,
           cJSON_GetArraySize(r->msgs), r->think ? "on" : "off");
    printf("last answer prompt %d tokens %.2f t/s, generation %d tokens %.2f t/s (%s)\n", s->n_prompt,
           s->t_prompt > 0 ? s->n_prompt / s->t_prompt : 0.0, s->n_gen, s->t_gen > 0 ? s->n_gen / s->t_gen : 0.0,
           epyq_finish_name(s->finish));
    if (r->gen.spec_k && s->spec_steps) {
        printf("speculation mtp:%d, %lld steps, %.2f tokens/step, accepted by position:",
               r->gen.spec_k, (long long)s->spec_steps,
               (double)s->spec_emitted / (double)s->spec_steps);
        for (int i = 0; i < r->gen.spec_k && i < 8; i++)
            printf(" %.2f", (double)s->spec_accepted[i] / (double)s->spec_steps);
        printf("\n");
    }
    printf("prompt      last %d computed + %d cached tokens (restore %.3f s), first token %.3f s; "
           "all turns %llu computed + %llu cached\n",
           s->n_prompt, r->last_cached, r->last_restore_s, r->last_ttft,
           (unsigned long long)r->total_computed, (unsigned long long)r->total_cached);
    if (r->cache) {
        epyq_prefix_stats ps;
        epyq_prefix_get_stats(r->cache, &ps);
        printf("cache       %llu copies, %.1f of %.0f MiB, %llu restored, %llu evicted\n",
               (unsigned long long)ps.entries, ps.bytes / 1048576.0, ps.budget / 1048576.0,
               (unsigned long long)ps.hits, (unsigned long long)ps.evicted);
    }
    printf("memory      sequence %.1f MiB, weights streamed per token %.1f MiB, %d threads\n",
           epyq_seq_bytes(r->gen.seq) / 1048576.0, epyq_model_active_bytes(r->gen.model) / 1048576.0,
           epyq_model_threads(r->gen.model));
}

/* Runs a slash command; returns false for /exit. */
static bool command(repl *r, char *line) {
    char *arg = line + strcspn(line, " \t");
    if (*arg) *arg++ = '\0';
    arg += strspn(arg, " \t");
    epyq_err err = {0};
    epyq_status st = EPYQ_OK;
    if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) return false;
    if (!strcmp(line, "/help")) fputs(help_text, stdout);
    else if (!strcmp(line, "/clear")) {
        forget_turns(r);
        free(r->pending), r->pending = NULL;
        chat_image_drop(r, -1);
        epyq_seq_reset(r->gen.seq);
        r->n_held = 0;
        printf("[ conversation cleared ]\n");
    } else if (!strcmp(line, "/regen")) {
        int n = cJSON_GetArraySize(r->msgs);
        if (n > 0 && is_role(cJSON_GetArrayItem(r->msgs, n - 1), "assistant")) {
            drop_last_assistant(r);
            st = answer(r, &err);
        } else printf("[ nothing to regenerate ]\n");
    } else if (!strcmp(line, "/system")) {
        set_system(r, arg);
        printf(*arg ? "[ system prompt set ]\n" : "[ system prompt removed ]\n");
    } else if (!strcmp(line, "/think")) {
        if (!strcmp(arg, "on") || !strcmp(arg, "off")) r->think = !strcmp(arg, "on");
        else if (*arg) printf("[ /think on|off ]\n");
        printf("[ thinking %s ]\n", r->think ? "on" : "off");
    } else if (!strcmp(line, "/image") && *arg) {
        st = chat_image_add(r, arg, &err);
    } else if (!strcmp(line, "/read") && *arg) {
        char *text = NULL;
        st = epyq_file_read(arg, (size_t)16 << 20, &text, NULL, &err);
        if (st == EPYQ_OK) {
            const char *base = strrchr(arg, '/') ? strrchr(arg, '/') + 1 : arg;
            size_t need = (r->pending ? strlen(r->pending) : 0) + strlen(base) + strlen(text) + 32;
            char *p = malloc(need);
            if (p) snprintf(p, need, "%s--- File: %s ---\n%s\n", r->pending ? r->pending : "", base, text);
            free(r->pending);
            r->pending = p;
            printf("[ %s will go before your next message ]\n", base);
        }
        free(text);
    } else if (!strcmp(line, "/save") && *arg) {
        st = save_conv(r, arg, &err);
        if (st == EPYQ_OK)
            printf(is_json_name(arg) ? "[ saved %d messages to %s ]\n"
                                     : "[ saved %d messages and the state to %s ]\n",
                   cJSON_GetArraySize(r->msgs), arg);
    } else if (!strcmp(line, "/load") && *arg) {
        st = load_conv(r, arg, &err);
        if (st == EPYQ_OK) printf("[ loaded %d messages ]\n", cJSON_GetArraySize(r->msgs));
    } else if (!strcmp(line, "/stats"))
        print_stats(r);
    else printf("[ unknown command %s (or missing argument); /help lists them ]\n", line);
    if (st != EPYQ_OK) fprintf(stderr, "epyq: %s\n", err.msg);
    fflush(stdout);
    return true;
}

/* $XDG_STATE_HOME/epyq/history (default ~/.local/state/epyq/history); NULL when unknown. */
static char *history_path(void) {
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    char base[4096];
    if (xdg && *xdg) snprintf(base, sizeof base, "%s/epyq", xdg);
    else if (home && *home) snprintf(base, sizeof base, "%s/.local/state/epyq", home);
    else return NULL;
    epyq_err err;
    if (epyq_mkdir_p(base, &err) != EPYQ_OK) return NULL;
    size_t n = strlen(base) + 16;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/history", base);
    return p;
}

/* Next input line without its newline (malloc'd), NULL at end of input. */
static char *read_line(const repl *r) {
    if (r->tty_in) return readline("> ");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    if (n > 0 && line[n - 1] == '\n') line[n - 1] = '\0';
    return line;
}

static int loop(repl *r, const char *hist) {
    int rc = 0;
    for (;;) {
        char *line = read_line(r);
        if (!line) break;
        char *s = line + strspn(line, " \t");
        if (!*s) {
            free(line);
            continue;
        }
        if (r->tty_in && hist) {
            add_history(s);
            write_history(hist);
        }
        bool go_on = true;
        if (s[0] == '/') go_on = command(r, s);
        else {
            epyq_err err = {0};
            char *msg = s;
            if (r->pending) {
                size_t n = strlen(r->pending) + strlen(s) + 1;
                msg = malloc(n);
                if (msg) snprintf(msg, n, "%s%s", r->pending, s);
            }
            if (msg) {
                add_msg(r->msgs, "user", msg, NULL);
                if (msg != s) free(msg);
                free(r->pending), r->pending = NULL;
                int32_t k = chat_image_attach(
                    r, cJSON_GetArrayItem(r->msgs, cJSON_GetArraySize(r->msgs) - 1));
                epyq_status st = answer(r, &err);
                if (st != EPYQ_OK) {
                    fprintf(stderr, "epyq: %s\n", err.msg);
                    chat_image_drop(r, k); /* its images go with it */
                    /* keep user/assistant alternating: forget the turn that got no answer */
                    cJSON_DeleteItemFromArray(r->msgs, cJSON_GetArraySize(r->msgs) - 1);
                    if (!r->tty_in) rc = 1;
                }
            }
        }
        free(line);
        if (!go_on) break;
    }
    return rc;
}

int epyq_cmd_chat(int argc, char **argv) {
    opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    epyq_err err = {0};
    char *dir = NULL, *hist = NULL;
    epyq_tok *tok = NULL;
    epyq_model *m = NULL;
    repl r = {.think = !o.no_think, .tty_in = isatty(STDIN_FILENO), .tty_out = isatty(STDOUT_FILENO),
              .n_predict = o.n_predict, .msgs = cJSON_CreateArray(), .seed = o.seed};
    epyq_status st = epyq_kern_init(&err);
    if (st == EPYQ_OK) st = epyq_tool_model_dir(o.dir, o.synthetic, &dir, &err);
    if (st == EPYQ_OK) st = epyq_tok_load(&tok, dir, &err);
    if (st == EPYQ_OK) st = epyq_chat_load(&r.tmpl, dir, &err);
    int32_t ctx = 0;
    if (st == EPYQ_OK) st = epyq_tool_ctx_dir(dir, o.ctx, o.ctx_set, &ctx, &err);
    epyq_model_opts mo = {.path = EPYQ_PATH_A8,
                          .n_threads = o.threads,
                          .skip_mtp = !o.spec.on,
                          .draft_head = o.spec.on ? o.spec.draft_head : EPYQ_REQUANT_NONE,
                          .draft_vocab = o.spec.on ? o.spec.draft_vocab : 0,
                          .numa = epyq_tool_rt_numa(&o.rt, o.threads),
                          .requant_lm_head = o.rt.rq_lm_head,
                          .requant_dense = o.rt.rq_dense};
    if (st == EPYQ_OK) st = epyq_tool_model_load(&m, dir, &mo, &err);
    if (st == EPYQ_OK) {
        const epyq_config *cfg = epyq_model_config(m);
        epyq_sample_params sp;
        const epyq_sample_overrides so = {o.temp, o.top_p, o.min_p, o.rep, o.pres, o.top_k, o.seed};
        epyq_sample_overrides_apply(&so, cfg, &sp);
        r.tok = tok;
        r.held = malloc((size_t)ctx * sizeof *r.held);
        r.gen_ids = malloc((size_t)o.n_predict * sizeof *r.gen_ids);
        if (!r.held || !r.gen_ids || !r.msgs) st = epyq_err_set(&err, EPYQ_E_NOMEM, "out of memory");
        if (st == EPYQ_OK) st = epyq_gen_init(&r.gen, m, tok, ctx, o.rt.kv, &sp, &err);
        if (st == EPYQ_OK) epyq_tool_ctx_report(m, ctx, 1, o.rt.kv);
        if (st == EPYQ_OK && o.spec.on && !epyq_model_has_mtp(m))
            st = epyq_err_set(&err, EPYQ_E_ARG, "--spec mtp: %s has no MTP head (mtp.* tensors)",
                              dir);
        r.gen.spec_k = o.spec.on ? o.spec.draft : 0;
        r.model_id = epyq_model_identity(m);
        r.dir = dir, r.threads = o.threads;
        r.kv = o.rt.kv;
        r.session = o.session;
        r.gen.cache_every = o.cache_every;
        if (st == EPYQ_OK && o.cache_mb > 0)
            st = epyq_prefix_create(&r.cache, (uint64_t)o.cache_mb << 20, &err);
        r.gen.cache = r.cache;
        if (st == EPYQ_OK && o.session && access(o.session, F_OK) == 0) {
            st = chat_session_load(&r, o.session, &err);
            if (st == EPYQ_OK && r.tty_in)
                fprintf(stderr, "[ session %s: %d messages, %d tokens of state restored ]\n",
                        o.session, cJSON_GetArraySize(r.msgs), r.n_held);
        }
    }
    if (st == EPYQ_OK) {
        if (o.system) set_system(&r, o.system);
        struct sigaction sa = {.sa_handler = on_signal};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        if (r.tty_in) {
            hist = history_path();
            if (hist) read_history(hist);
            fprintf(stderr, "epyq chat — %s, context %d, thinking %s. /help lists commands, Ctrl-C stops an answer.\n",
                    dir, epyq_seq_ctx(r.gen.seq), r.think ? "on" : "off");
        }
        rc = loop(&r, hist);
    } else {
        fprintf(stderr, "epyq: %s\n", err.msg);
        rc = 1;
    }
    chat_image_drop(&r, -1);
    free(r.imgs);
    epyq_vision_free(r.vision);
    epyq_gen_free(&r.gen);
    epyq_prefix_free(r.cache);
    epyq_model_free(m);
    epyq_chat_free(r.tmpl);
    epyq_tok_free(tok);
    cJSON_Delete(r.msgs);
    free(r.held), free(r.gen_ids), free(r.pending), free(hist), free(dir);
    return rc;
}
