/* src/core/status.h — how every fallible epyq function reports failure.
 *
 * Promise: library code never calls exit()/abort() on bad input. A fallible function
 * returns an epyq_status and, when it fails, fills the caller's epyq_err with one line
 * that names the file/tensor/line and says what was expected and what was found.
 * The err argument may be NULL (the message is then dropped). */
#ifndef EPYQ_STATUS_H
#define EPYQ_STATUS_H

#include <stddef.h>

typedef enum {
    EPYQ_OK = 0,
    EPYQ_E_IO,          /* open/read/mmap/write failed */
    EPYQ_E_FORMAT,      /* a file breaks its format's rules (safetensors, JSON, JSONL) */
    EPYQ_E_SHAPE,       /* a tensor's shape/dtype does not fit the architecture */
    EPYQ_E_QUANT,       /* unknown or unsupported quantisation scheme */
    EPYQ_E_NOMEM,       /* allocation failed (host or NUMA node) */
    EPYQ_E_NUMA,        /* impossible topology/placement request */
    EPYQ_E_CTX_FULL,    /* prompt or generation past the context */
    EPYQ_E_CANCELED,    /* stopped by the user (SIGINT) */
    EPYQ_E_UNSUPPORTED, /* a kernel declines a shape/ISA; callers fall back */
    EPYQ_E_ARG,         /* bad argument / option value */
    EPYQ_E_TEMPLATE,    /* chat-template parse/render error, raise_exception */
    EPYQ_E_INTERNAL,    /* broken invariant: a bug in epyq */
} epyq_status;

#define EPYQ_ERR_MSG_MAX 1024

typedef struct {
    epyq_status code;
    char msg[EPYQ_ERR_MSG_MAX]; /* one line, no trailing newline */
} epyq_err;

/* Fill err (if not NULL) and return code, so callers can write `return epyq_err_set(...)`. */
epyq_status epyq_err_set(epyq_err *err, epyq_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix an existing message with context ("shard X: " + old message); returns err->code. */
epyq_status epyq_err_prefix(epyq_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clear err to EPYQ_OK with an empty message. */
void epyq_err_clear(epyq_err *err);

/* Stable upper-case name, e.g. "E_FORMAT". */
const char *epyq_status_name(epyq_status st);

/* The one error idiom. A function that owns nothing to release returns early through TRY. One
 * that owns buffers keeps a single cleanup label:
 *     epyq_status st = step_a(..., err);
 *     if (st != EPYQ_OK) goto done;
 *     if ((st = step_b(..., err)) != EPYQ_OK) goto done;
 *     ...
 * done:
 *     free(...);
 *     return st;
 * so each step's failure is checked where it happens and every exit frees the same things. */

/* Inside a function returning epyq_status: evaluate x (an epyq_status) and return it when it is
 * not EPYQ_OK. The callee has already filled the caller's epyq_err, so nothing is added. The
 * replacement list is token for token the one src/model/model.c still defines locally, which C
 * allows as a redefinition without a diagnostic. */
#define TRY(x)                                                                                     \
    do {                                                                                           \
        epyq_status st_ = (x);                                                                     \
        if (st_ != EPYQ_OK) return st_;                                                            \
    } while (0)

#endif
