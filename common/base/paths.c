#include "common/base/paths.h"
#include "common/base/err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int put(char *out, size_t cap, const char *a, const char *b) {
    int n = snprintf(out, cap, "%s%s", a, b);
    if (n < 0 || (size_t)n >= cap) return dl_seterr(DL_ERANGE, "path too long: %s%s", a, b);
    return 0;
}

int paths_cache_dir(char *out, size_t cap) {
    const char *d = getenv("DRAFTLINE_CACHE");
    if (d && *d) return put(out, cap, d, "");
    const char *x = getenv("XDG_CACHE_HOME");
    if (x && *x) return put(out, cap, x, "/draftline");
    const char *h = getenv("HOME");
    return put(out, cap, h && *h ? h : "/tmp", "/.cache/draftline");
}

int paths_default_model(char *out, size_t cap) {
    char dir[4096];
    DL_TRY(paths_cache_dir(dir, sizeof dir));
    return put(out, cap, dir, "/" DL_DEFAULT_MODEL_FILE);
}

int paths_shared_data(char *out, size_t cap) {
    const char *d = getenv("DL_SHARED_DATA");
    return put(out, cap, d && *d ? d : "../shared/data", "");
}

int paths_mkdir_p(const char *path, unsigned mode) {
    char buf[4096];
    if (strlen(path) >= sizeof buf) return dl_seterr(DL_ERANGE, "path too long: %s", path);
    strcpy(buf, path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return dl_seterr(DL_EIO, "mkdir %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, mode) != 0 && errno != EEXIST)
        return dl_seterr(DL_EIO, "mkdir %s: %s", buf, strerror(errno));
    return 0;
}
