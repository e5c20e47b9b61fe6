/* tail -F for one file (see tail.h). */
#include "common/monitor/tail.h"
#include "common/base/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct mon_tail {
    char *path;
    int fd;
    dev_t dev;
    ino_t ino;
    off_t off;                  /* bytes consumed from fd */
    char *buf;                  /* partial line */
    size_t len, cap;
    int skipping;               /* inside an over-long line: drop until '\n' */
    uint64_t resets, skipped;
};

mon_tail_t *mon_tail_new(const char *path) {
    mon_tail_t *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->path = strdup(path);
    if (!t->path) { free(t); return NULL; }
    t->fd = -1;
    return t;
}

void mon_tail_destroy(mon_tail_t **t_p) {
    if (!t_p || !*t_p) return;
    mon_tail_t *t = *t_p;
    if (t->fd >= 0) close(t->fd);
    free(t->path);
    free(t->buf);
    free(t);
    *t_p = NULL;
}

uint64_t mon_tail_resets(const mon_tail_t *t) { return t->resets; }
uint64_t mon_tail_skipped(const mon_tail_t *t) { return t->skipped; }

static void restart(mon_tail_t *t) {
    t->off = 0;
    t->len = 0;
    t->skipping = 0;
}

static int push(mon_tail_t *t, const char *p, size_t n) {
    if (t->skipping) return 0;
    if (t->len + n + 1 > MON_TAIL_LINE_MAX) {
        t->skipping = 1;
        t->len = 0;
        t->skipped++;
        return 0;
    }
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < t->len + n + 1) cap *= 2;
        char *b = realloc(t->buf, cap);
        if (!b) return dl_seterr(DL_ENOMEM, "tail %s: out of memory", t->path);
        t->buf = b;
        t->cap = cap;
    }
    memcpy(t->buf + t->len, p, n);
    t->len += n;
    return 0;
}

/* Reads fd to its current end, delivering lines. */
static int drain(mon_tail_t *t, mon_tail_line_cb cb, void *arg) {
    char chunk[65536];
    int lines = 0;
    for (;;) {
        ssize_t r = pread(t->fd, chunk, sizeof chunk, t->off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return dl_seterr(DL_EIO, "read %s: %s", t->path, strerror(errno));
        }
        if (r == 0) break;
        t->off += r;
        size_t i = 0;
        while (i < (size_t)r) {
            char *nl = memchr(chunk + i, '\n', (size_t)r - i);
            size_t n = nl ? (size_t)(nl - (chunk + i)) : (size_t)r - i;
            DL_TRY(push(t, chunk + i, n));
            i += n;
            if (!nl) break;
            i++;                                    /* the '\n' */
            if (t->skipping) { t->skipping = 0; continue; }
            t->buf[t->len] = '\0';
            size_t L = t->len;
            if (L && t->buf[L - 1] == '\r') t->buf[--L] = '\0';
            t->len = 0;
            cb(t->buf, L, arg);
            lines++;
        }
    }
    return lines;
}

int mon_tail_poll(mon_tail_t *t, mon_tail_line_cb cb, void *arg) {
    int lines = 0;
    struct stat ps;
    int path_ok = stat(t->path, &ps) == 0;
    if (t->fd >= 0) {
        struct stat fs;
        if (fstat(t->fd, &fs) == 0 && fs.st_size < t->off) {     /* truncated in place */
            t->resets++;
            restart(t);
        }
        if (path_ok && (ps.st_ino != t->ino || ps.st_dev != t->dev)) {
            /* rotated: finish the old file, then follow the new one from its start */
            int r = drain(t, cb, arg);
            if (r < 0) return r;
            lines += r;
            close(t->fd);
            t->fd = -1;
            t->resets++;
        } else {
            int r = drain(t, cb, arg);
            return r < 0 ? r : lines + r;
        }
    }
    if (!path_ok) return lines;                     /* not there (yet) */
    t->fd = open(t->path, O_RDONLY | O_CLOEXEC);
    if (t->fd < 0) {
        if (errno == ENOENT) return lines;
        return dl_seterr(DL_EIO, "open %s: %s", t->path, strerror(errno));
    }
    struct stat fs;
    if (fstat(t->fd, &fs) != 0) return dl_seterr(DL_EIO, "stat %s: %s", t->path, strerror(errno));
    t->dev = fs.st_dev;
    t->ino = fs.st_ino;
    restart(t);
    int r = drain(t, cb, arg);
    return r < 0 ? r : lines + r;
}
