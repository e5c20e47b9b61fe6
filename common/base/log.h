/* Leveled logging to stderr: "2026-11-30T21:40:01.123Z INFO loader[1234] message".
 *
 * The stage name and pid are set once by log_init in main. The level comes from
 * log_init, overridden by $DL_LOG_LEVEL (error|warn|info|debug). Thread-safe
 * (one fprintf per line).
 */
#ifndef DL_BASE_LOG_H
#define DL_BASE_LOG_H

typedef enum { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 } log_level_t;

/* stage: short name copied (at most 31 chars); level: default level. */
void log_init(const char *stage, log_level_t level);
void log_set_level(log_level_t level);
log_level_t log_get_level(void);
/* Parses "error|warn|info|debug"; returns 0 or DL_EINVAL. */
int log_parse_level(const char *s, log_level_t *out);

void log_msg(log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define log_error(...) log_msg(LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)

/* fn(arg) runs before each log line is written (NULL: none); the `run` supervisor ends a
 * half-written progress line on the terminal with it. Not thread-safe: set it while
 * only one thread logs. */
void log_set_before(void (*fn)(void *), void *arg);

/* Logs "what: <dl_strerror(rc)>: <dl_errmsg()>" at error level; returns rc. */
int log_rc(int rc, const char *what);

#endif
