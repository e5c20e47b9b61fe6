/* O_DIRECT file writes through bounce buffers (see dio.h). */
#include "common/base/dio.h"

#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/testhook.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { DIO_AUTO = 0, DIO_BUFFERED = 1, DIO_BOUNCE_BUFFERED = 2, DIO_FAIL_FIRST = 3 };

struct dio_file {
    char *path;
    int fd;                      /* buffered: head, tail, fallback */
    int dfd;                     /* O_DIRECT (or, dio.mode=2, a plain second fd); -1: none */
    atomic_int direct;           /* 1 while dfd takes the aligned blocks */
    atomic_int fail_first;       /* dio.mode=3: the next direct pwrite fails with EINVAL */
    atomic_uint_fast64_t n_direct, n_buffered;
};

/* Process-wide, set once (pthread_once): the hooks and the alignment; then read-only. */
static struct {
    pthread_once_t once;
    int mode;
    size_t align, bounce;
    atomic_int fallback_logged;
} dio_cfg = {.once = PTHREAD_ONCE_INIT};

static void dio__config(void) {
    int64_t v;
    long page = sysconf(_SC_PAGESIZE);
    dio_cfg.align = page > (long)DIO_ALIGN ? (size_t)page : DIO_ALIGN;
    dio_cfg.mode = testhook_i64("dio.mode", &v) && v >= 0 && v <= 3 ? (int)v : DIO_AUTO;
    dio_cfg.bounce = DIO_BOUNCE_BYTES;
    if (testhook_i64("dio.bounce_kib", &v) && v > 0 && v < (1 << 20)) dio_cfg.bounce = (size_t)v << 10;
    dio_cfg.bounce = (dio_cfg.bounce + dio_cfg.align - 1) / dio_cfg.align * dio_cfg.align;
}

static int dio__err(const dio_file_t *f, int e) {
    dl_seterr(DL_EIO, "write %s: %s", f->path, strerror(e));
    errno = e;
    return DL_EIO;
}

/* The direct path is off for f from now on; said once per process. */
static void dio__fallback(dio_file_t *f, const char *why) {
    atomic_store(&f->direct, 0);
    if (!atomic_exchange(&dio_cfg.fallback_logged, 1))
        log_debug("%s: O_DIRECT not taken (%s): checkpoint files written buffered", f->path, why);
}

int dio_open(const char *path, uint64_t size, dio_file_t **out) {
    *out = NULL;
    pthread_once(&dio_cfg.once, dio__config);
    dio_file_t *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return dl_seterr(DL_ENOMEM, "%s: out of memory", path);
    }
    f->dfd = -1;
    f->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        int e = errno;
        dl_seterr(DL_EIO, "open %s: %s", path, strerror(e));
        free(f->path);
        free(f);
        errno = e;
        return DL_EIO;
    }
    if (dio_cfg.mode != DIO_BUFFERED) {
        int fl = O_WRONLY | O_CLOEXEC | (dio_cfg.mode == DIO_BOUNCE_BUFFERED ? 0 : O_DIRECT);
        f->dfd = open(path, fl);
        if (f->dfd < 0) dio__fallback(f, strerror(errno));
        else {
            atomic_store(&f->direct, 1);
            atomic_store(&f->fail_first, dio_cfg.mode == DIO_FAIL_FIRST);
            dio_reserve(f, size);
        }
    }
    *out = f;
    return 0;
}

void dio_reserve(dio_file_t *f, uint64_t size) {
    if (size && f->dfd >= 0) (void)fallocate(f->dfd, 0, 0, (off_t)size);   /* a hint: the writes say what fails */
}

/* All n bytes of p at off through fd; 0 or the errno (EIO for a write of 0 bytes). */
static int dio__write_all(int fd, const uint8_t *p, size_t n, uint64_t off) {
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : EIO;
        p += w, n -= (size_t)w, off += (uint64_t)w;
    }
    return 0;
}

static int dio__buffered(dio_file_t *f, const uint8_t *p, size_t n, uint64_t off) {
    int e = dio__write_all(f->fd, p, n, off);
    if (e) return dio__err(f, e);
    atomic_fetch_add(&f->n_buffered, n);
    return 0;
}

/* One chunk (k bytes at aligned off, already in b) through dfd. *taken: bytes the direct
 * fd wrote; the caller writes the rest buffered (a refusal, a short write). 0 or errno. */
static int dio__direct_chunk(dio_file_t *f, const uint8_t *b, size_t k, uint64_t off, size_t *taken) {
    *taken = 0;
    while (*taken < k) {
        ssize_t w;
        if (atomic_exchange(&f->fail_first, 0)) w = -1, errno = EINVAL;
        else w = pwrite(f->dfd, b + *taken, k - *taken, (off_t)(off + *taken));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EINVAL || errno == EOPNOTSUPP)) {
            dio__fallback(f, strerror(errno));
            return 0;
        }
        if (w <= 0) return w < 0 ? errno : EIO;
        *taken += (size_t)w;
        if (*taken % dio_cfg.align) return 0;   /* a short write off the block grid: rest buffered */
    }
    return 0;
}

static int dio__bounce(dio_bounce_t *b) {
    if (b->p && b->n == dio_cfg.bounce) return 1;
    dio_bounce_free(b);
    void *p = NULL;
    if (posix_memalign(&p, dio_cfg.align, dio_cfg.bounce) != 0) return 0;
    b->p = p, b->n = dio_cfg.bounce;
    return 1;
}

int dio_pwrite(dio_file_t *f, dio_bounce_t *b, const void *src, size_t n, uint64_t off) {
    const uint8_t *p = src;
    uint64_t a = (off + dio_cfg.align - 1) / dio_cfg.align * dio_cfg.align;   /* first whole block */
    uint64_t z = (off + n) / dio_cfg.align * dio_cfg.align;                    /* end of the last */
    if (f->dfd < 0 || !atomic_load(&f->direct) || a >= z || !dio__bounce(b)) return dio__buffered(f, p, n, off);
    DL_TRY(dio__buffered(f, p, (size_t)(a - off), off));
    for (uint64_t x = a; x < z;) {
        if (!atomic_load(&f->direct)) { DL_TRY(dio__buffered(f, p + (x - off), (size_t)(z - x), x)); break; }
        size_t k = z - x < b->n ? (size_t)(z - x) : b->n, taken;
        memcpy(b->p, p + (x - off), k);
        int e = dio__direct_chunk(f, b->p, k, x, &taken);
        if (e) return dio__err(f, e);
        atomic_fetch_add(&f->n_direct, taken);
        if (taken < k) DL_TRY(dio__buffered(f, b->p + taken, k - taken, x + taken));
        x += k;
    }
    return dio__buffered(f, p + (z - off), (size_t)(off + n - z), z);
}

int dio_fsync(dio_file_t *f) {
    if (fsync(f->fd) != 0 || (f->dfd >= 0 && fsync(f->dfd) != 0)) return dio__err(f, errno);
    return 0;
}

int dio_close(dio_file_t **fp) {
    if (!fp || !*fp) return 0;
    dio_file_t *f = *fp;
    int e = 0;
    if (f->dfd >= 0 && close(f->dfd) != 0) e = errno;
    if (close(f->fd) != 0 && !e) e = errno;
    log_debug("%s: written %s (%llu bytes direct, %llu buffered)", f->path,
              f->dfd < 0 ? "buffered" : dio_cfg.mode == DIO_BOUNCE_BUFFERED ? "through bounce buffers, no O_DIRECT"
              : "with O_DIRECT", (unsigned long long)atomic_load(&f->n_direct),
              (unsigned long long)atomic_load(&f->n_buffered));
    int rc = e ? dio__err(f, e) : 0;
    free(f->path);
    free(f);
    *fp = NULL;
    if (e) errno = e;
    return rc;
}

uint64_t dio_direct_bytes(const dio_file_t *f) {
    return atomic_load(&f->n_direct);
}

void dio_bounce_free(dio_bounce_t *b) {
    free(b->p);
    b->p = NULL;
    b->n = 0;
}
