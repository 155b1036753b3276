/* src/core/log.c — stderr logging with a process-wide level. */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int g_level = -1; /* -1: not yet read from EPYQ_LOG_LEVEL */

static epyq_log_level level_now(void) {
    if (g_level < 0) {
        const char *e = getenv("EPYQ_LOG_LEVEL");
        g_level = (e && *e >= '0' && *e <= '3') ? *e - '0' : EPYQ_LOG_WARN;
    }
    return (epyq_log_level)g_level;
}

void epyq_log_set_level(epyq_log_level lvl) { g_level = (int)lvl; }
epyq_log_level epyq_log_get_level(void) { return level_now(); }

void epyq_log(epyq_log_level lvl, const char *fmt, ...) {
    if (lvl > level_now()) return;
    static const char *const tag[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "epyq: %s: ", tag[lvl]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
