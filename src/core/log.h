/* src/core/log.h — diagnostics on stderr.
 * Tools set the level once (-v / -q / EPYQ_LOG_LEVEL); library code logs, it never prints
 * to stdout (stdout belongs to the tool's result). */
#ifndef EPYQ_LOG_H
#define EPYQ_LOG_H

typedef enum { EPYQ_LOG_ERROR = 0, EPYQ_LOG_WARN, EPYQ_LOG_INFO, EPYQ_LOG_DEBUG } epyq_log_level;

void epyq_log_set_level(epyq_log_level lvl);
epyq_log_level epyq_log_get_level(void);
void epyq_log(epyq_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define epyq_log_error(...) epyq_log(EPYQ_LOG_ERROR, __VA_ARGS__)
#define epyq_log_warn(...) epyq_log(EPYQ_LOG_WARN, __VA_ARGS__)
#define epyq_log_info(...) epyq_log(EPYQ_LOG_INFO, __VA_ARGS__)
#define epyq_log_debug(...) epyq_log(EPYQ_LOG_DEBUG, __VA_ARGS__)

#endif
