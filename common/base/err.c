#include "common/base/err.h"

#include <stdio.h>
#include <string.h>

#define DL_ERRMSG_MAX 1024

static _Thread_local char errmsg[DL_ERRMSG_MAX];

static const char *const names[DL_ERR_COUNT_] = {
    [0] = "ok",
    [1] = "invalid argument",
    [2] = "out of memory",
    [3] = "i/o error",
    [4] = "protocol error",
    [5] = "timed out",
    [6] = "not supported",
    [7] = "cuda error",
    [8] = "out of range",
    [9] = "bad format",
    [10] = "not found",
    [11] = "try again",
    [12] = "closed",
    [13] = "bad state",
    [14] = "nan or inf",
};

const char *dl_strerror(int code) {
    int i = -code;
    if (i < 0 || i >= DL_ERR_COUNT_) return "unknown error";
    return names[i];
}

int dl_vseterr(int code, const char *fmt, va_list ap) {
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    return code;
}

int dl_seterr(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dl_vseterr(code, fmt, ap);
    va_end(ap);
    return code;
}

int dl_wraperr(int code, const char *fmt, ...) {
    char prefix[512], old[DL_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, errmsg, sizeof old);
    size_t pl = strlen(prefix);
    /* the detail already names this context ("x.dlc: bad magic" wrapped with "x.dlc"):
     * once is enough */
    if (pl && !strncmp(old, prefix, pl) && (old[pl] == 0 || (old[pl] == ':' && old[pl + 1] == ' ')))
        return code;
    if (old[0]) snprintf(errmsg, sizeof errmsg, "%.500s: %.500s", prefix, old);
    else snprintf(errmsg, sizeof errmsg, "%s", prefix);
    return code;
}

const char *dl_errmsg(void) { return errmsg; }
void dl_clearerr(void) { errmsg[0] = 0; }
