/* Slabs over POSIX shared memory (host) or CUDA IPC (device). See slab.h. */
#include "common/mem/slab.h"
#include "common/base/err.h"
#ifdef DL_CUDA
#include "common/mem/cuda/mem_cuda.h"
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct slab {
    slab_handle_t h;
    void *ptr;
    size_t map_bytes;
    int owner;
};

int slab_name_ok(const char *s) {
    if (!s || !*s || strlen(s) > 16) return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '.'))
            return 0;
    return 1;
}

static int host_map(slab_t *s, int fd, int writable) {
    void *p = mmap(NULL, s->h.bytes, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return dl_seterr(DL_EIO, "mmap %s (%llu bytes): %s", s->h.name,
                                          (unsigned long long)s->h.bytes, strerror(errno));
    s->ptr = p;
    s->map_bytes = s->h.bytes;
    return 0;
}

int slab_create(slab_t **out, slab_kind_t kind, const char *run_id, const char *stage,
                uint32_t owner_id, uint64_t incarnation, uint32_t slab_id, const char *tag,
                size_t bytes, int device, int pin) {
    *out = NULL;
    if (!slab_name_ok(run_id) || !slab_name_ok(stage) || !slab_name_ok(tag))
        return dl_seterr(DL_EINVAL, "slab name parts must be [A-Za-z0-9_.]{1,16}: '%s' '%s' '%s'",
                         run_id ? run_id : "", stage ? stage : "", tag ? tag : "");
    if (bytes == 0) return dl_seterr(DL_EINVAL, "slab %s/%s: size 0", stage, tag);
    slab_t *s = calloc(1, sizeof *s);
    if (!s) return dl_seterr(DL_ENOMEM, "slab_create: out of host memory");
    s->owner = 1;
    s->h.kind = kind;
    s->h.owner_id = owner_id;
    s->h.incarnation = incarnation;
    s->h.slab_id = slab_id;
    s->h.bytes = bytes;
    int nl = snprintf(s->h.name, sizeof s->h.name, "/dl-%s-%s-%llu-%s", run_id, stage,
                      (unsigned long long)incarnation, tag);
    if (nl < 0 || (size_t)nl >= sizeof s->h.name) {
        free(s);
        return dl_seterr(DL_EINVAL, "slab name for %s/%s longer than %d chars", stage, tag,
                         SLAB_NAME_MAX - 1);
    }
    if (kind == SLAB_HOST) {
        s->h.gpu_uuid[0] = 0;
        int fd = shm_open(s->h.name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0) {
            int rc = dl_seterr(DL_EIO, "shm_open %s: %s", s->h.name, strerror(errno));
            free(s);
            return rc;
        }
        if (ftruncate(fd, (off_t)bytes) != 0) {
            int rc = dl_seterr(DL_EIO, "ftruncate %s to %zu bytes: %s", s->h.name, bytes,
                               strerror(errno));
            close(fd);
            shm_unlink(s->h.name);
            free(s);
            return rc;
        }
        int rc = host_map(s, fd, 1);
        close(fd);
        if (rc < 0) { shm_unlink(s->h.name); free(s); return rc; }
        if (pin) {
#ifdef DL_CUDA
            rc = mem_cuda_host_register(s->ptr, bytes);
            if (rc < 0) { munmap(s->ptr, bytes); shm_unlink(s->h.name); free(s); return rc; }
            s->h.pinned = 1;
#endif
        }
        *out = s;
        return 0;
    }
#ifdef DL_CUDA
    int rc = mem_cuda_alloc_export(device, bytes, &s->ptr, s->h.ipc, s->h.gpu_uuid,
                                   sizeof s->h.gpu_uuid);
    if (rc < 0) { mem_cuda_free(s->ptr); free(s); return rc; }
    s->map_bytes = bytes;
    *out = s;
    return 0;
#else
    (void)device;
    free(s);
    return dl_seterr(DL_ENOTSUP, "slab %s/%s: CUDA slab in a CPU-only build", stage, tag);
#endif
}

int slab_open(slab_t **out, const slab_handle_t *h, int device) {
    *out = NULL;
    if (h->kind > SLAB_CUDA || memchr(h->name, 0, sizeof h->name) == NULL ||
        strncmp(h->name, "/dl-", 4) != 0 || strchr(h->name + 1, '/') != NULL || h->bytes == 0 ||
        memchr(h->gpu_uuid, 0, sizeof h->gpu_uuid) == NULL)
        return dl_seterr(DL_EPROTO, "slab handle malformed (kind %u, %llu bytes)", h->kind,
                         (unsigned long long)h->bytes);
    slab_t *s = calloc(1, sizeof *s);
    if (!s) return dl_seterr(DL_ENOMEM, "slab_open: out of host memory");
    s->h = *h;
    if (h->kind == SLAB_HOST) {
        int fd = shm_open(h->name, h->readonly ? O_RDONLY : O_RDWR, 0);
        if (fd < 0) {
            int rc = dl_seterr(errno == ENOENT ? DL_ENOENT : DL_EIO, "shm_open %s: %s", h->name,
                               strerror(errno));
            free(s);
            return rc;
        }
        struct stat st;
        if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < h->bytes) {
            close(fd);
            free(s);
            return dl_seterr(DL_EPROTO, "slab %s: object smaller than the handle's %llu bytes",
                             h->name, (unsigned long long)h->bytes);
        }
        int rc = host_map(s, fd, !h->readonly);
        close(fd);
        if (rc < 0) { free(s); return rc; }
        *out = s;
        return 0;
    }
#ifdef DL_CUDA
    int rc = mem_cuda_open(device, h->ipc, &s->ptr);
    if (rc < 0) { free(s); return dl_wraperr(rc, "open slab %s", h->name); }
    s->map_bytes = h->bytes;
    *out = s;
    return 0;
#else
    (void)device;
    free(s);
    return dl_seterr(DL_ENOTSUP, "slab %s: CUDA slab in a CPU-only build", h->name);
#endif
}

void slab_destroy(slab_t **sp) {
    if (!sp || !*sp) return;
    slab_t *s = *sp;
    if (s->h.kind == SLAB_HOST) {
#ifdef DL_CUDA
        if (s->owner && s->h.pinned) mem_cuda_host_unregister(s->ptr);
#endif
        if (s->ptr) munmap(s->ptr, s->map_bytes);
        if (s->owner) shm_unlink(s->h.name);
    } else {
#ifdef DL_CUDA
        if (s->owner) mem_cuda_free(s->ptr);
        else mem_cuda_close(s->ptr);
#endif
    }
    free(s);
    *sp = NULL;
}

void *slab_ptr(const slab_t *s) { return s->ptr; }
size_t slab_bytes(const slab_t *s) { return s->h.bytes; }
const slab_handle_t *slab_handle(const slab_t *s) { return &s->h; }
int slab_is_owner(const slab_t *s) { return s->owner; }

int slab_check_gpu(const slab_handle_t *h, const char *my_uuid) {
    if (h->kind != SLAB_CUDA) return 0;
    if (!my_uuid || strncmp(h->gpu_uuid, my_uuid, sizeof h->gpu_uuid) != 0)
        return dl_seterr(DL_EINVAL, "slab %s lives on GPU %s, not on this drafter's GPU %s",
                         h->name, h->gpu_uuid, my_uuid ? my_uuid : "(none)");
    return 0;
}

/* /dev/shm is where glibc's shm_open keeps objects on Linux. */
static int sweep_or_count(const char *run_id, int do_unlink) {
    if (!slab_name_ok(run_id)) return dl_seterr(DL_EINVAL, "run id '%s' malformed", run_id);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "dl-%s-", run_id);
    DIR *d = opendir("/dev/shm");
    if (!d) return dl_seterr(DL_EIO, "opendir /dev/shm: %s", strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        if (do_unlink) {
            char name[300];
            snprintf(name, sizeof name, "/%s", e->d_name);
            if (shm_unlink(name) == 0) n++;
        } else {
            n++;
        }
    }
    closedir(d);
    return n;
}

int slab_sweep(const char *run_id) { return sweep_or_count(run_id, 1); }
int slab_count(const char *run_id) { return sweep_or_count(run_id, 0); }

int slab_sweep_stage(const char *run_id, const char *stage, uint64_t incarnation) {
    if (!slab_name_ok(run_id) || !slab_name_ok(stage))
        return dl_seterr(DL_EINVAL, "slab_sweep_stage: run id '%s' or stage '%s' malformed", run_id, stage);
    char prefix[96];
    snprintf(prefix, sizeof prefix, "dl-%s-%s-%llu-", run_id, stage, (unsigned long long)incarnation);
    DIR *d = opendir("/dev/shm");
    if (!d) return dl_seterr(DL_EIO, "opendir /dev/shm: %s", strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        if (shm_unlink(name) == 0) n++;
    }
    closedir(d);
    return n;
}

int slab_sweep_older(const char *run_id, const char *stage, uint64_t incarnation) {
    if (!slab_name_ok(run_id) || !slab_name_ok(stage))
        return dl_seterr(DL_EINVAL, "slab_sweep_older: run id '%s' or stage '%s' malformed", run_id, stage);
    char prefix[96];
    int pl = snprintf(prefix, sizeof prefix, "dl-%s-%s-", run_id, stage);
    DIR *d = opendir("/dev/shm");
    if (!d) return dl_seterr(DL_EIO, "opendir /dev/shm: %s", strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, (size_t)pl) != 0) continue;
        const char *p = e->d_name + pl;
        char *end;
        errno = 0;
        unsigned long long inc = strtoull(p, &end, 10);
        if (end == p || *end != '-' || errno || inc >= incarnation) continue;
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        if (shm_unlink(name) == 0) n++;
    }
    closedir(d);
    return n;
}

/* Run ids (the "<run>" of "dl-<run>-...") seen in /dev/shm, with liveness flags. */
typedef struct { char id[17]; int live; } sweep_run_t;
#define SWEEP_MAX_RUNS 256

static int sweep_find(sweep_run_t *r, int n, const char *id) {
    for (int i = 0; i < n; i++)
        if (!strcmp(r[i].id, id)) return i;
    return -1;
}

/* Extracts the run id of a "dl-<run>-..." name into id (cap 17); 0 on success. */
static int sweep_run_of(const char *name, char *id) {
    if (strncmp(name, "dl-", 3) != 0) return -1;
    const char *a = name + 3, *b = strchr(a, '-');
    if (!b || b == a || b - a > 16) return -1;
    memcpy(id, a, (size_t)(b - a));
    id[b - a] = 0;
    return slab_name_ok(id) ? 0 : -1;
}

int slab_sweep_dead(double min_age_s) {
    sweep_run_t runs[SWEEP_MAX_RUNS];
    int nr = 0;
    time_t now = time(NULL);
    DIR *d = opendir("/dev/shm");
    if (!d) return dl_seterr(DL_EIO, "opendir /dev/shm: %s", strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char id[17];
        if (sweep_run_of(e->d_name, id) < 0) continue;
        int k = sweep_find(runs, nr, id);
        if (k < 0) {
            if (nr >= SWEEP_MAX_RUNS) continue;
            k = nr++;
            snprintf(runs[k].id, sizeof runs[k].id, "%s", id);
            runs[k].live = 0;
        }
        char path[300];
        struct stat sb;
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        if (stat(path, &sb) != 0 || difftime(now, sb.st_mtime) < min_age_s)
            runs[k].live = 1;   /* young (or vanished meanwhile): leave it */
    }
    closedir(d);
    if (nr == 0) return 0;
    /* any mapping of /dev/shm/dl-<run>-* by any process marks the run live */
    DIR *pd = opendir("/proc");
    if (!pd) return dl_seterr(DL_EIO, "opendir /proc: %s", strerror(errno));
    while ((e = readdir(pd)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char path[300], line[1024];
        snprintf(path, sizeof path, "/proc/%s/maps", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;   /* gone, or another user's process (cannot map our 0600 objects) */
        while (fgets(line, sizeof line, f)) {
            char *m = strstr(line, "/dev/shm/dl-");
            char id[17];
            if (!m || sweep_run_of(m + 9, id) < 0) continue;
            int k = sweep_find(runs, nr, id);
            if (k >= 0) runs[k].live = 1;
        }
        fclose(f);
    }
    closedir(pd);
    int n = 0;
    for (int i = 0; i < nr; i++) {
        if (runs[i].live) continue;
        int rc = slab_sweep(runs[i].id);
        if (rc > 0) n += rc;
    }
    return n;
}
