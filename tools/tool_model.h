/* tools/tool_model.h — what every model-running tool shares: where the checkpoint comes from.
 *
 * Promise: epyq_tool_model_dir() turns `-m DIR` or `--synthetic SHAPE[:FORMAT]` into a checkpoint
 * folder. A synthetic model is generated once by epyq synth into $XDG_CACHE_HOME/epyq
 * (default ~/.cache/epyq) under <shape>-<format>-r<EPYQ_SYNTH_REVISION>; generation writes to a temporary folder and
 * renames it when complete, so an interrupted run never leaves a half model that looks whole.
 * Progress goes to stderr on a TTY only. */
#ifndef EPYQ_TOOL_MODEL_H
#define EPYQ_TOOL_MODEL_H

#include <getopt.h>
#include <stdbool.h>

#include "core/status.h"
#include "model/model.h"
#include "numa/plan.h"

/* Exactly one of dir / synthetic must be non-NULL. *out is malloc'd. */
epyq_status epyq_tool_model_dir(const char *dir, const char *synthetic, char **out, epyq_err *err);

/* epyq_model_load() with the tools' load display: on a TTY (stderr) a progress line with GB
 * of checkpoint packed and GB/s, then a one-line summary (GB, seconds, threads, kernels,
 * bytes streamed per token); otherwise one JSON line {"event":"model_loaded",…} on stderr, with
 * the same load throughput (gb_per_s: checkpoint GB read and packed per second).
 * opts->progress is overridden. */
epyq_status epyq_tool_model_load(epyq_model **out, const char *dir, const epyq_model_opts *opts,
                                 epyq_err *err);

/* The cache root ($XDG_CACHE_HOME/epyq or $HOME/.cache/epyq), malloc'd. */
char *epyq_tool_cache_root(void);

/* A whole decimal number in [lo, hi] from a command-line argument into *v: 0, or 2 (the
 * usage-error exit status) after printing "<cmd>: bad number '<arg>'" to stderr. */
int epyq_tool_opt_long(const char *cmd, const char *arg, long lo, long hi, long *v);
/* --path a16|a8|a8all into *path: 0, or 2 after printing "<cmd>: --path: expected a16, a8 or
 * a8all, got …". */
int epyq_tool_opt_path(const char *cmd, const char *arg, epyq_numpath *path);

/* ---- what run, chat and batch share beyond -m: KV cache type, NUMA placement, requantised
 * linears, context ---- */

/* getopt_long codes of the shared flags (above any tool's own) and their table entries:
 * put EPYQ_TOOL_RT_LONGOPTS in the tool's struct option array. */
enum {
    EPYQ_TOOL_O_KV = 0x4000,
    EPYQ_TOOL_O_NUMA,
    EPYQ_TOOL_O_SPLIT,
    EPYQ_TOOL_O_NODES,
    EPYQ_TOOL_O_CPUS,
    EPYQ_TOOL_O_FALLBACK,
    EPYQ_TOOL_O_REQUANT
};
#define EPYQ_TOOL_RT_LONGOPTS                                                                      \
    {"kv-type", required_argument, 0, EPYQ_TOOL_O_KV},                                             \
        {"numa", required_argument, 0, EPYQ_TOOL_O_NUMA},                                          \
        {"numa-split", required_argument, 0, EPYQ_TOOL_O_SPLIT},                                   \
        {"nodes", required_argument, 0, EPYQ_TOOL_O_NODES},                                        \
        {"cpu-range", required_argument, 0, EPYQ_TOOL_O_CPUS},                                     \
        {"numa-fallback", no_argument, 0, EPYQ_TOOL_O_FALLBACK}, {                                 \
        "requant", required_argument, 0, EPYQ_TOOL_O_REQUANT                                       \
    }

typedef struct {
    epyq_kv_type kv;       /* --kv-type bf16|fp8 */
    epyq_numa_opts numa;   /* --numa MODE ... and EPYQ_NUMA, EPYQ_NUMA_SPLIT, EPYQ_NODES, EPYQ_CPU_RANGE */
    bool use_numa;         /* a NUMA flag or variable was given: the model gets the plan's pools */
    epyq_requant rq_lm_head, rq_dense; /* --requant lm_head=..., dense=... (exact by default) */
} epyq_tool_rt;

/* Help lines of the shared flags, for the tools' usage texts. */
extern const char epyq_tool_rt_help[];

/* Defaults, then the EPYQ_NUMA* variables: 0, or 2 after printing "<cmd>: <what>" to stderr. */
int epyq_tool_rt_init(epyq_tool_rt *rt, const char *cmd);
/* The defaults alone, for the measuring tools (logits, bench), which only the flags steer. */
void epyq_tool_rt_defaults(epyq_tool_rt *rt);
/* Take getopt code c: 0 taken, 1 not one of the shared flags, 2 bad value (printed). */
int epyq_tool_rt_opt(epyq_tool_rt *rt, const char *cmd, int c, const char *arg);
/* epyq_model_opts.numa for these flags: NULL when none was given (one pool, as before), else
 * the options with -t (when non-zero) as the total thread count. */
const epyq_numa_opts *epyq_tool_rt_numa(epyq_tool_rt *rt, int threads);

/* ---- MTP speculative decoding flags of run and chat: --spec mtp|none, --draft N, --draft-head
 * ---- */
enum { EPYQ_TOOL_O_SPEC = 0x4100, EPYQ_TOOL_O_DRAFT, EPYQ_TOOL_O_DHEAD, EPYQ_TOOL_O_DVOCAB };
#define EPYQ_TOOL_SPEC_LONGOPTS                                                                    \
    {"spec", required_argument, 0, EPYQ_TOOL_O_SPEC},                                              \
        {"draft", required_argument, 0, EPYQ_TOOL_O_DRAFT},                                        \
        {"draft-head", required_argument, 0, EPYQ_TOOL_O_DHEAD}, {                                 \
        "draft-vocab", required_argument, 0, EPYQ_TOOL_O_DVOCAB                                    \
    }
typedef struct {
    bool on;                 /* --spec mtp */
    int draft;               /* --draft N (default 2) */
    epyq_requant draft_head; /* --draft-head (default int4) */
    int32_t draft_vocab;     /* --draft-vocab N (default 0: the whole vocabulary) */
} epyq_tool_spec;
extern const char epyq_tool_spec_help[];
void epyq_tool_spec_init(epyq_tool_spec *sp);
/* Take getopt code c: 0 taken, 1 not one of these flags, 2 bad value (printed). */
int epyq_tool_spec_opt(epyq_tool_spec *sp, const char *cmd, int c, const char *arg);

/* The context a tool runs with. explicit_c: -c was given as want, which must lie in
 * [1, the model's context] (max_position_embeddings, or what rope scaling extends it to):
 * above it is E_ARG naming both numbers. A tool default (explicit_c false) is capped at the
 * model's context instead. */
epyq_status epyq_tool_ctx(const epyq_config *cfg, int64_t want, bool explicit_c, int32_t *out, epyq_err *err);
/* The same from dir's config.json alone, so a bad -c is refused before the weights load. */
epyq_status epyq_tool_ctx_dir(const char *dir, int64_t want, bool explicit_c, int32_t *out, epyq_err *err);

/* One line on stderr with the KV memory of n_seqs sequences of n_ctx positions: on a TTY
 * "context N tokens x S: KV cache X (bf16), state Y", else {"event":"context",...}. */
void epyq_tool_ctx_report(const epyq_model *m, int32_t n_ctx, int32_t n_seqs, epyq_kv_type kv);

#endif
