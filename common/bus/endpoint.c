/* common/bus: the run directory and ipc endpoint names (bus_run_dir_create, bus_endpoint).
 * See bus.h for the contract. */
#include "common/bus/bus.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/paths.h"

/* ---- run directory and endpoints --------------------------------------------------------- */

static int run_dir_check(const char *path, const struct stat *st) {
    if (S_ISLNK(st->st_mode))
        return dl_seterr(DL_EINVAL, "run dir %s: is a symlink; refusing it", path);
    if (!S_ISDIR(st->st_mode))
        return dl_seterr(DL_EINVAL, "run dir %s: exists and is not a directory", path);
    if (st->st_uid != geteuid())
        return dl_seterr(DL_EINVAL, "run dir %s: owned by uid %u, not by us (uid %u); refusing it",
                         path, (unsigned)st->st_uid, (unsigned)geteuid());
    if (st->st_mode & 077)
        return dl_seterr(DL_EINVAL, "run dir %s: mode %04o lets group/other in; expected 0700 "
                         "(chmod 700 it or pick another dir)", path, (unsigned)(st->st_mode & 07777));
    if ((st->st_mode & 0700) != 0700 && chmod(path, 0700) != 0)
        return dl_seterr(DL_EIO, "run dir %s: chmod 0700: %s", path, strerror(errno));
    return 0;
}

int bus_run_dir_create(const char *path) {
    if (!path || !*path) return dl_seterr(DL_EINVAL, "run dir: empty path");
    if (strlen(path) >= PATH_MAX) return dl_seterr(DL_ERANGE, "run dir: path too long");
    struct stat st;
    if (lstat(path, &st) == 0) return run_dir_check(path, &st);
    if (errno != ENOENT) return dl_seterr(DL_EIO, "run dir %s: lstat: %s", path, strerror(errno));
    DL_TRY(paths_mkdir_p(path, 0700));
    /* Checked again: someone may have made it between lstat and mkdir; umask may have cut 0700. */
    if (lstat(path, &st) != 0)
        return dl_seterr(DL_EIO, "run dir %s: lstat: %s", path, strerror(errno));
    return run_dir_check(path, &st);
}

int bus_endpoint(const char *run_dir, const char *name, char *buf, size_t cap) {
    if (!run_dir || !*run_dir) return dl_seterr(DL_EINVAL, "bus endpoint: empty run dir");
    if (!name || !*name) return dl_seterr(DL_EINVAL, "bus endpoint: empty name");
    size_t nl = strlen(name);
    if (nl > BUS_NAME_MAX || name[0] == '.')
        return dl_seterr(DL_EINVAL, "bus endpoint name '%.80s': 1..%d chars, not starting with '.'",
                         name, BUS_NAME_MAX);
    for (size_t i = 0; i < nl; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return dl_seterr(DL_EINVAL, "bus endpoint name '%.80s': bad char '%c' (allowed: "
                             "A-Z a-z 0-9 . _ -)", name, c);
    }
    size_t dl = strlen(run_dir);
    while (dl > 1 && run_dir[dl - 1] == '/') dl--;
    const char *sep = run_dir[dl - 1] == '/' ? "" : "/";
    size_t path_len = dl + strlen(sep) + nl + 5;   /* ".sock" */
    struct sockaddr_un sa;
    if (path_len >= sizeof sa.sun_path)
        return dl_seterr(DL_ERANGE, "bus endpoint %.*s%s%s.sock: %zu bytes, over the %zu-byte "
                         "unix socket path limit", (int)dl, run_dir, sep, name, path_len,
                         sizeof sa.sun_path - 1);
    int n = snprintf(buf, cap, "ipc://%.*s%s%s.sock", (int)dl, run_dir, sep, name);
    if (n < 0 || (size_t)n >= cap)
        return dl_seterr(DL_ERANGE, "bus endpoint: buffer of %zu bytes too small", cap);
    return 0;
}
