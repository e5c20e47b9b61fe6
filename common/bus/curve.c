/* The run's CURVE key file (see curve.h). */
#include "common/bus/curve.h"

#include "common/base/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

int bus_curve_available(void) { return zmq_has("curve") ? 1 : 0; }

int bus_curve_keys_create(const char *path, bus_curve_keys_t *out) {
    if (!bus_curve_available()) return dl_seterr(DL_ENOTSUP, "%s: this libzmq has no CURVE support", path);
    bus_curve_keys_t k;
    memset(&k, 0, sizeof k);
    if (zmq_curve_keypair(k.server_public, k.server_secret) != 0 ||
        zmq_curve_keypair(k.client_public, k.client_secret) != 0)
        return dl_seterr(DL_EIO, "%s: zmq_curve_keypair: %s", path, zmq_strerror(errno));
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return dl_seterr(DL_EIO, "%s: create the key file: %s", path, strerror(errno));
    char buf[512];
    int n = snprintf(buf, sizeof buf,
                     "# draftline run key: every node of the run needs it (keep it 0600)\n"
                     "server_public %s\nserver_secret %s\nclient_public %s\nclient_secret %s\n",
                     k.server_public, k.server_secret, k.client_public, k.client_secret);
    int ok = write(fd, buf, (size_t)n) == n && fsync(fd) == 0;
    int e = errno;
    close(fd);
    if (!ok) { unlink(path); return dl_seterr(DL_EIO, "%s: write the key file: %s", path, strerror(e)); }
    if (out) *out = k;
    return 0;
}

static int z85_ok(const char *s) {
    if (strlen(s) != BUS_CURVE_KEY_CHARS) return 0;
    static const char z85[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
    for (const char *p = s; *p; p++) if (!strchr(z85, *p)) return 0;
    return 1;
}

int bus_curve_keys_load(const char *path, bus_curve_keys_t *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT) return dl_seterr(DL_ENOENT, "%s: no such key file", path);
        if (errno == ELOOP) return dl_seterr(DL_EINVAL, "%s: is a symlink; give the key file itself", path);
        return dl_seterr(DL_EIO, "%s: open the key file: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
        close(fd);
        return dl_seterr(DL_EINVAL, "%s: a key file must be a regular file of this user with mode 0600 "
                         "(chmod 600 %s)", path, path);
    }
    char buf[2048];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0) return dl_seterr(DL_EIO, "%s: read: %s", path, strerror(errno));
    buf[n] = 0;
    bus_curve_keys_t k;
    memset(&k, 0, sizeof k);
    char *keys[4] = {k.server_public, k.server_secret, k.client_public, k.client_secret};
    static const char *const names[4] = {"server_public", "server_secret", "client_public", "client_secret"};
    int lineno = 0;
    for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        char name[32], val[64], extra[2];
        if (line[0] == '#' || line[strspn(line, " \t\r")] == 0) continue;
        if (sscanf(line, "%31s %63s %1s", name, val, extra) != 2)
            return dl_seterr(DL_EINVAL, "%s: line %d: expected 'name key'", path, lineno);
        int i = 0;
        while (i < 4 && strcmp(name, names[i])) i++;
        if (i == 4) return dl_seterr(DL_EINVAL, "%s: line %d: unknown name '%s'", path, lineno, name);
        if (keys[i][0]) return dl_seterr(DL_EINVAL, "%s: line %d: %s given twice", path, lineno, name);
        if (!z85_ok(val))
            return dl_seterr(DL_EINVAL, "%s: line %d: %s is not a 40-character Z85 key", path, lineno, name);
        memcpy(keys[i], val, BUS_CURVE_KEY_CHARS + 1);
    }
    for (int i = 0; i < 4; i++)
        if (!keys[i][0]) return dl_seterr(DL_EINVAL, "%s: %s missing", path, names[i]);
    char pub[BUS_CURVE_KEY_CHARS + 1];
    if (zmq_curve_public(pub, k.server_secret) != 0 || strcmp(pub, k.server_public) ||
        zmq_curve_public(pub, k.client_secret) != 0 || strcmp(pub, k.client_public))
        return dl_seterr(DL_EINVAL, "%s: a public key is not its secret key's", path);
    *out = k;
    return 0;
}
