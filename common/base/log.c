#include "common/base/log.h"
#include "common/base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Process-wide logging configuration: set once in main before threads start. */
static char log_stage[32] = "draftline";
static log_level_t log_level = LOG_INFO;

static void (*log_before)(void *);   /* log_set_before */
static void *log_before_arg;

void log_set_before(void (*fn)(void *), void *arg) { log_before = fn, log_before_arg = arg; }

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

int log_parse_level(const char *s, log_level_t *out) {
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (s && strcasecmp(s, names[i]) == 0) { *out = (log_level_t)i; return 0; }
    return dl_seterr(DL_EINVAL, "log level '%s': expected error|warn|info|debug", s ? s : "");
}

void log_init(const char *stage, log_level_t level) {
    snprintf(log_stage, sizeof log_stage, "%s", stage ? stage : "draftline");
    log_level = level;
    log_level_t env;
    const char *e = getenv("DL_LOG_LEVEL");
    if (e && log_parse_level(e, &env) == 0) log_level = env;
}

void log_set_level(log_level_t level) { log_level = level; }
log_level_t log_get_level(void) { return log_level; }

void log_msg(log_level_t level, const char *file, int line, const char *fmt, ...) {
    if (level > log_level) return;
    char msg[2048], ts[40];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log_before) log_before(log_before_arg);
    if (level == LOG_DEBUG)
        fprintf(stderr, "%s.%03dZ %s %s[%d] %s (%s:%d)\n", ts, (int)(tv.tv_usec / 1000),
                level_names[level], log_stage, (int)getpid(), msg, file, line);
    else
        fprintf(stderr, "%s.%03dZ %s %s[%d] %s\n", ts, (int)(tv.tv_usec / 1000),
                level_names[level], log_stage, (int)getpid(), msg);
}

int log_rc(int rc, const char *what) {
    const char *d = dl_errmsg();
    if (d[0]) log_error("%s: %s: %s", what, dl_strerror(rc), d);
    else log_error("%s: %s", what, dl_strerror(rc));
    return rc;
}
