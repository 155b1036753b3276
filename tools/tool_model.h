/* tools/tool_model.h — what every model-running tool shares: where the checkpoint comes from.
 *
 * Promise: epyq_tool_model_dir() turns `-m DIR` or `--synthetic SHAPE[:FORMAT]` into a checkpoint
 * folder. A synthetic model is generated once by epyq synth into $XDG_CACHE_HOME/epyq
 * (default ~/.cache/epyq) under <shape>-<format>-r<EPYQ_SYNTH_REVISION>; generation writes to a temporary folder and
 * renames it when complete, so an interrupted run never leaves a half model that looks whole.
 * Progress goes to stderr on a TTY only. */
#ifndef EPYQ_TOOL_MODEL_H
#define EPYQ_TOOL_MODEL_H

#include <stdbool.h>

#include "core/status.h"
#include "model/model.h"

/* Exactly one of dir / synthetic must be non-NULL. *out is malloc'd. */
epyq_status epyq_tool_model_dir(const char *dir, const char *synthetic, char **out, epyq_err *err);

/* epyq_model_load() with the tools' load display: on a TTY (stderr) a progress line with GB
 * of checkpoint packed and GB/s, then a one-line summary (GB, seconds, threads, kernels,
 * bytes streamed per token); otherwise one JSON line {"event":"model_loaded",…} on stderr.
 * opts->progress is overridden. */
epyq_status epyq_tool_model_load(epyq_model **out, const char *dir, const epyq_model_opts *opts,
                                 epyq_err *err);

/* The cache root ($XDG_CACHE_HOME/epyq or $HOME/.cache/epyq), malloc'd. */
char *epyq_tool_cache_root(void);

/* A whole decimal number in [lo, hi] from a command-line argument into *v: 0, or 2 (the
 * usage-error exit status) after printing "<cmd>: bad number '<arg>'" to stderr. */
int epyq_tool_opt_long(const char *cmd, const char *arg, long lo, long hi, long *v);

#endif
