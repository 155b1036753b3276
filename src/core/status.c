/* src/core/status.c — error buffer helpers (see status.h). */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

epyq_status epyq_err_set(epyq_err *err, epyq_status code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    /* Messages are one line: a stray newline in a file name or value must not split them. */
    for (char *p = err->msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return code;
}

epyq_status epyq_err_prefix(epyq_err *err, const char *fmt, ...) {
    if (!err) return EPYQ_E_INTERNAL;
    char head[EPYQ_ERR_MSG_MAX], old[EPYQ_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* head + old can exceed the buffer; the line is then cut to fit (using the result is what
     * tells gcc the truncation is expected). */
    if (snprintf(err->msg, sizeof err->msg, "%s%s", head, old) < 0) err->msg[0] = '\0';
    return err->code;
}

void epyq_err_clear(epyq_err *err) {
    if (!err) return;
    err->code = EPYQ_OK;
    err->msg[0] = '\0';
}

const char *epyq_status_name(epyq_status st) {
    switch (st) {
    case EPYQ_OK: return "OK";
    case EPYQ_E_IO: return "E_IO";
    case EPYQ_E_FORMAT: return "E_FORMAT";
    case EPYQ_E_SHAPE: return "E_SHAPE";
    case EPYQ_E_QUANT: return "E_QUANT";
    case EPYQ_E_NOMEM: return "E_NOMEM";
    case EPYQ_E_NUMA: return "E_NUMA";
    case EPYQ_E_CTX_FULL: return "E_CTX_FULL";
    case EPYQ_E_CANCELED: return "E_CANCELED";
    case EPYQ_E_UNSUPPORTED: return "E_UNSUPPORTED";
    case EPYQ_E_ARG: return "E_ARG";
    case EPYQ_E_TEMPLATE: return "E_TEMPLATE";
    case EPYQ_E_INTERNAL: return "E_INTERNAL";
    }
    return "E_UNKNOWN";
}
