/* Checkpoints (see ckpt.h). */
#include "common/pipe/ckpt.h"
#include "common/rundir/rundir.h"
#include "common/base/dio.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/paths.h"
#include "common/model/dflash_ckpt.h"
#include "common/data/batcher.h"
#include "common/format/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <zlib.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int write_file(const char *path, const void *a, size_t na) {
    FILE *f = fopen(path, "wb");
    if (!f) return dl_seterr(DL_EIO, "open %s: %s", path, strerror(errno));
    int ok = !na || fwrite(a, 1, na, f) == na;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0) ok = 0;
    if (!ok) return dl_seterr(DL_EIO, "write %s: %s", path, strerror(errno));
    return 0;
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) { fsync(fd); close(fd); }
}

/* model.safetensors and config.json are written by dflash_ckpt_save into this subdir of
 * step_<N>.tmp (its own atomic dir: <sub>.tmp renamed to <sub>) while state.bin is
 * written beside it, then moved up: the finished checkpoint holds only its four files. */
#define CKPT_MODEL_SUBDIR "model.d"

static void rm_files(const char *dir) {
    static const char *const files[] = {"model.safetensors", "model.safetensors.tmp", "config.json",
                                        "config.json.tmp", "state.bin", "cursor.bin"};
    char p[4600];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

static void rm_tree(const char *dir) {
    char p[4400];
    snprintf(p, sizeof p, "%s/" CKPT_MODEL_SUBDIR ".tmp", dir);
    rm_files(p);
    snprintf(p, sizeof p, "%s/" CKPT_MODEL_SUBDIR, dir);
    rm_files(p);
    rm_files(dir);
}

/* ---- the write (ckpt_write): model and state.bin at once, state.bin in spans ---- */

#define CKPT_SPANS_PER_ARRAY 2              /* m, v: 4 writer threads; 2 more CRC the master */
#define CKPT_WRITE_CHUNK (64u << 20)        /* bytes per pwrite */

/* One span of an array: its bytes, written at file offset off (off < 0: only CRC'd)
 * through f (O_DIRECT where taken, common/base/dio.h), their CRC-32 (combined in order). */
typedef struct {
    dio_file_t *f;
    const uint8_t *p;
    size_t n;
    off_t off;
    uLong crc;
    int err;                                /* errno of a failed write, EIO for a short one */
} span_t;

static void *span_write(void *arg) {
    span_t *s = arg;
    s->crc = crc32_z(crc32_z(0, Z_NULL, 0), s->p, s->n);
    dio_bounce_t b = {0};
    for (size_t done = 0; s->off >= 0 && done < s->n;) {
        size_t want = s->n - done < CKPT_WRITE_CHUNK ? s->n - done : CKPT_WRITE_CHUNK;
        if (dio_pwrite(s->f, &b, s->p + done, want, (uint64_t)s->off + done) < 0) { s->err = errno; break; }
        done += want;
    }
    dio_bounce_free(&b);
    return NULL;
}

/* state.bin (version 2) at path: header h (crc32 and master_crc32 filled here) + m, v (pb
 * bytes each), each by CKPT_SPANS_PER_ARRAY threads at their offsets (dio_pwrite:
 * O_DIRECT where the file system takes it), the CRC-32 of each span combined in file
 * order (crc32_combine); CKPT_SPANS_PER_ARRAY more threads take the CRC-32 of master
 * (model.safetensors holds it, not this file); the header last, one fsync per fd. The
 * bytes are those of one sequential write of header, m, v. */
static int write_state(const char *path, ckpt_state_hdr_t *h, const float *const arr[3], size_t pb) {
    dio_file_t *f;
    int rc = dio_open(path, sizeof *h + 2 * (uint64_t)pb, &f);
    if (rc == DL_EIO) return dl_seterr(DL_EIO, "open %s: %s", path, strerror(errno));
    if (rc < 0) return rc;
    enum { NS = 3 * CKPT_SPANS_PER_ARRAY };
    span_t s[NS];
    pthread_t th[NS];
    int started[NS] = {0};
    size_t per = (pb / CKPT_SPANS_PER_ARRAY + 4095) & ~(size_t)4095;
    for (int i = 0; i < NS; i++) {
        int a = i / CKPT_SPANS_PER_ARRAY, k = i % CKPT_SPANS_PER_ARRAY;   /* a: master, m, v */
        size_t lo = (size_t)k * per < pb ? (size_t)k * per : pb;
        size_t hi = lo + per < pb && k < CKPT_SPANS_PER_ARRAY - 1 ? lo + per : pb;
        off_t off = a == 0 ? -1 : (off_t)(sizeof *h + (size_t)(a - 1) * pb + lo);
        s[i] = (span_t){f, (const uint8_t *)arr[a] + lo, hi - lo, off, 0, 0};
        started[i] = pthread_create(&th[i], NULL, span_write, &s[i]) == 0;
        if (!started[i]) span_write(&s[i]);   /* no thread: this one does it */
    }
    uLong mcrc = crc32_z(0, Z_NULL, 0);
    int err = 0;
    for (int i = 0; i < NS; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        if (s[i].err && !err) err = s[i].err;
        if (s[i].off < 0) mcrc = crc32_combine(mcrc, s[i].crc, (z_off_t)s[i].n);
    }
    h->master_crc32 = (uint32_t)mcrc;   /* before the header's CRC, which covers it (crc32 is 0) */
    uLong crc = crc32_z(crc32_z(0, Z_NULL, 0), (const Bytef *)h, sizeof *h);
    for (int i = 0; i < NS; i++)
        if (s[i].off >= 0) crc = crc32_combine(crc, s[i].crc, (z_off_t)s[i].n);
    h->crc32 = (uint32_t)crc;
    dio_bounce_t b = {0};
    if (!err && dio_pwrite(f, &b, h, sizeof *h, 0) < 0) err = errno;   /* a partial block: buffered */
    dio_bounce_free(&b);
    if (!err && dio_fsync(f) < 0) err = errno;
    if (dio_close(&f) < 0 && !err) err = errno;
    return err ? dl_seterr(DL_EIO, "write %s: %s", path, strerror(err)) : 0;
}

/* The public part on its own thread: config.json + model.safetensors (dflash_ckpt_save_host)
 * into <tmp>/CKPT_MODEL_SUBDIR; the error message (thread-local) comes back in msg. */
typedef struct {
    drafter_t *d;
    const float *master;
    char sub[4300];
    int rc;
    char msg[512];
} model_job_t;

static void *model_write(void *arg) {
    model_job_t *j = arg;
    j->rc = dflash_ckpt_save_host(j->d, j->master, j->sub, "F32", NULL);
    if (j->rc < 0) snprintf(j->msg, sizeof j->msg, "%s", dl_errmsg());
    return NULL;
}

/* Moves config.json and model.safetensors from tmp's model subdir into tmp. */
static int model_up(const char *tmp) {
    static const char *const names[] = {"config.json", "model.safetensors"};
    char a[4400], b[4400];
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/" CKPT_MODEL_SUBDIR "/%s", tmp, names[i]);
        snprintf(b, sizeof b, "%s/%s", tmp, names[i]);
        if (rename(a, b) != 0) return dl_seterr(DL_EIO, "rename %s: %s", a, strerror(errno));
    }
    snprintf(a, sizeof a, "%s/" CKPT_MODEL_SUBDIR, tmp);
    if (rmdir(a) != 0) return dl_seterr(DL_EIO, "rmdir %s: %s", a, strerror(errno));
    return 0;
}

int ckpt_write(const char *out_dir, drafter_t *d, const ckpt_state_hdr_t *hdr,
               const float *master, const float *m, const float *v, const uint8_t *cursor,
               char *dir_out, size_t cap) {
    char root[4096], tmp[4200], fin[4200], p[4300];
    snprintf(root, sizeof root, "%s/checkpoints", out_dir);
    DL_TRY(paths_mkdir_p(root, 0755));
    snprintf(tmp, sizeof tmp, "%s/step_%llu.tmp", root, (unsigned long long)hdr->step);
    snprintf(fin, sizeof fin, "%s/step_%llu", root, (unsigned long long)hdr->step);
    rm_tree(tmp);
    if (mkdir(tmp, 0755) != 0) return dl_seterr(DL_EIO, "mkdir %s: %s", tmp, strerror(errno));
    /* the public part (config.json + model.safetensors) on a thread of its own while
     * state.bin is written here: the disk sees both at once */
    model_job_t job = {.d = d, .master = master};
    snprintf(job.sub, sizeof job.sub, "%s/" CKPT_MODEL_SUBDIR, tmp);
    pthread_t mt;
    int threaded = pthread_create(&mt, NULL, model_write, &job) == 0;
    if (!threaded) model_write(&job);
    size_t pb = hdr->n_params * sizeof(float);
    ckpt_state_hdr_t h = *hdr;
    h.version = CKPT_VERSION;
    h.crc_kind = CKPT_CRC32;
    h.crc32 = h.master_crc32 = 0;
    memset(h.reserved, 0, sizeof h.reserved);
    snprintf(p, sizeof p, "%s/state.bin", tmp);
    const float *const arr[3] = {master, m, v};
    int rc = write_state(p, &h, arr, pb);
    char state_msg[512] = "";
    if (rc < 0) snprintf(state_msg, sizeof state_msg, "%s", dl_errmsg());
    if (threaded) pthread_join(mt, NULL);
    if (job.rc < 0) {
        dl_seterr(job.rc, "%s", job.msg);
        rc = dl_wraperr(job.rc, "checkpoint %s", tmp);
        goto fail;
    }
    if (rc < 0) { rc = dl_seterr(rc, "%s", state_msg); goto fail; }
    if ((rc = model_up(tmp)) < 0) goto fail;
    if (cursor) {
        snprintf(p, sizeof p, "%s/cursor.bin", tmp);
        if ((rc = write_file(p, cursor, 40)) < 0) goto fail;
    }
    fsync_dir(tmp);
    rm_tree(fin);
    if (rename(tmp, fin) != 0) { rc = dl_seterr(DL_EIO, "rename %s: %s", tmp, strerror(errno)); goto fail; }
    fsync_dir(root);
    DL_TRY(rundir_latest_write(root, hdr->step));
    if (dir_out) snprintf(dir_out, cap, "%s", fin);
    return 0;
fail:
    /* a failed write (disk full) leaves no partial step_N.tmp taking the space of the next one */
    rm_tree(tmp);
    return rc;
}

/* "[a, b]" of a shape into buf */
static const char *shape_str(int n_dims, const int64_t *shape, char *buf, size_t cap) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int k = 0; k < n_dims && o < cap; k++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", k ? ", " : "", (long long)shape[k]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

/* The master of a version-2 checkpoint: every tensor of d's table from
 * dir/model.safetensors (F32, d's shape) into master at its offset, then, when h records
 * one, its CRC-32 against h->master_crc32. DL_EFORMAT naming the file (and the tensor). */
static int read_master(const char *dir, const drafter_t *d, const ckpt_state_hdr_t *h, float *master) {
    char p[4200], a[96], b[96];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    safetensors_t *st;
    DL_TRY(safetensors_open(p, &st));
    int rc = 0;
    for (int i = 0; rc == 0 && i < drafter_n_tensors(d); i++) {
        const drafter_tensor_t *t = drafter_tensor(d, i);
        const st_tensor_t *s = safetensors_find(st, t->name);
        int same = s && s->n_dims == t->n_dims;
        for (int k = 0; same && k < t->n_dims; k++) same = s->shape[k] == t->shape[k];
        if (!s)
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s' missing (the drafter's master weights are read from it)",
                           p, t->name);
        else if (s->dtype != ST_F32)
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s' is %s, a training checkpoint's master weights are F32", p,
                           t->name, s->dtype_name);
        else if (!same)
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s' has shape %s, the drafter's is %s", p, t->name,
                           shape_str(s->n_dims, s->shape, a, sizeof a), shape_str(t->n_dims, t->shape, b, sizeof b));
        else
            memcpy(master + t->offset, s->data, t->numel * sizeof(float));
    }
    safetensors_close(&st);
    if (rc == 0 && h->crc_kind == CKPT_CRC32) {
        uLong crc = crc32_z(crc32_z(0, Z_NULL, 0), (const Bytef *)master, (size_t)h->n_params * sizeof(float));
        if ((uint32_t)crc != h->master_crc32)
            rc = dl_seterr(DL_EFORMAT, "%s: master weights checksum mismatch (CRC-32 %08x, state.bin records %08x): "
                           "the file is corrupt or not this checkpoint's", p, (unsigned)crc, (unsigned)h->master_crc32);
    }
    return rc;
}

/* state.bin of dir into hdr and its arrays (version 1: master, m, v; 2: m, v), the
 * header checked, the CRC-32 when recorded. */
static int read_state(const char *dir, uint64_t expected, ckpt_state_hdr_t *hdr, float *master, float *m,
                      float *v) {
    char p[4200];
    snprintf(p, sizeof p, "%s/state.bin", dir);
    FILE *f = fopen(p, "rb");
    if (!f) return dl_seterr(DL_ENOENT, "open %s: %s", p, strerror(errno));
    int rc = 0;
    if (fread(hdr, sizeof *hdr, 1, f) != 1 || memcmp(hdr->magic, CKPT_MAGIC, 8) != 0 ||
        hdr->header_bytes != sizeof *hdr)
        rc = dl_seterr(DL_EFORMAT, "%s: not a draftline training state", p);
    else if ((rc = ckpt_hdr_validate(hdr, p)) < 0)
        ;
    else if (hdr->n_params != expected)
        rc = dl_seterr(DL_EFORMAT, "%s: %llu parameters, this drafter has %llu", p,
                       (unsigned long long)hdr->n_params, (unsigned long long)expected);
    size_t n = (size_t)expected;
    float *arr[3];
    int na = 0;
    if (rc == 0 && hdr->version == CKPT_VERSION_MASTER) arr[na++] = master;
    arr[na++] = m;
    arr[na++] = v;
    for (int i = 0; rc == 0 && i < na; i++)
        if (fread(arr[i], 4, n, f) != n) rc = dl_seterr(DL_EFORMAT, "%s: truncated", p);
    if (rc == 0 && fgetc(f) != EOF) rc = dl_seterr(DL_EFORMAT, "%s: longer than its header says", p);
    fclose(f);
    if (rc == 0 && hdr->crc_kind == CKPT_CRC32) {
        ckpt_state_hdr_t h = *hdr;
        h.crc32 = 0;
        uLong crc = crc32_z(0, Z_NULL, 0);
        crc = crc32_z(crc, (const Bytef *)&h, sizeof h);
        for (int i = 0; i < na; i++) crc = crc32_z(crc, (const Bytef *)arr[i], n * 4);
        if ((uint32_t)crc != hdr->crc32)
            rc = dl_seterr(DL_EFORMAT, "%s: checksum mismatch (CRC-32 %08x, recorded %08x): the file is corrupt", p,
                           (unsigned)crc, (unsigned)hdr->crc32);
    }
    return rc;
}

int ckpt_read(const char *dir, const drafter_t *d, ckpt_state_hdr_t *hdr, float *master, float *m, float *v,
              uint8_t *cursor) {
    DL_TRY(read_state(dir, drafter_n_params(d), hdr, master, m, v));
    if (hdr->version != CKPT_VERSION_MASTER) DL_TRY(read_master(dir, d, hdr, master));
    if (!cursor) return 0;
    char p[4200];
    snprintf(p, sizeof p, "%s/cursor.bin", dir);
    FILE *f = fopen(p, "rb");
    if (!f) return dl_seterr(DL_ENOENT, "open %s: %s", p, strerror(errno));
    int rc = fread(cursor, 1, 40, f) != 40 ? dl_seterr(DL_EFORMAT, "%s: truncated", p) : 0;
    fclose(f);
    return rc;
}

int ckpt_resolve(const char *path, char *out, size_t cap) {
    char p[4200];
    struct stat s;
    snprintf(p, sizeof p, "%s/state.bin", path);
    if (stat(p, &s) == 0) { snprintf(out, cap, "%s", path); return 0; }
    snprintf(p, sizeof p, "%s/" RUNDIR_LATEST, path);
    char name[128] = {0};
    int lr = rundir_latest_read(path, name, sizeof name, NULL);
    if (lr == DL_ENOENT && access(p, F_OK) != 0)
        return dl_seterr(DL_ENOENT, "--resume %s: no state.bin and no checkpoints/latest", path);
    if (lr < 0 || !name[0] || strchr(name, '/')) return dl_seterr(DL_EFORMAT, "%s: malformed", p);
    int n = snprintf(out, cap, "%s/checkpoints/%s", path, name);
    if (n < 0 || (size_t)n >= cap) return dl_seterr(DL_ERANGE, "path too long");
    snprintf(p, sizeof p, "%s/state.bin", out);
    if (stat(p, &s) != 0) return dl_seterr(DL_ENOENT, "--resume: %s missing", p);
    return 0;
}

int ckpt_read_hdr(const char *dir, ckpt_state_hdr_t *hdr) {
    char p[4200];
    snprintf(p, sizeof p, "%s/state.bin", dir);
    FILE *f = fopen(p, "rb");
    if (!f) return dl_seterr(DL_ENOENT, "open %s: %s", p, strerror(errno));
    int ok = fread(hdr, sizeof *hdr, 1, f) == 1 && memcmp(hdr->magic, CKPT_MAGIC, 8) == 0 &&
             hdr->header_bytes == sizeof *hdr;
    fclose(f);
    return ok ? 0 : dl_seterr(DL_EFORMAT, "%s: not a draftline training state", p);
}

/* ---- validation (ckpt_hdr_validate, ckpt_verify) ---- */

/* The limits of `draftline run`'s flags (tools/cmd_run.c), for the header's copies
 * (max_steps: up to 2^53, as the optimizer records the run's length when not given). */
typedef struct { const char *name; size_t off; int is_f64; double lo, hi; int whole; int settings; } hfield_t;
#define HF(f, nm, is_f64, lo, hi, whole, st) { nm, offsetof(ckpt_state_hdr_t, f), is_f64, lo, hi, whole, st }
static const hfield_t HDR_FIELDS[] = {
    HF(mbs_per_step, "mbs_per_step (--micro-batches-per-step)", 0, 1, 4096, 1, 0),
    HF(lr, "lr (--lr)", 1, 0, 10, 0, 0),
    HF(warmup_steps, "warmup_steps (--warmup-steps)", 1, 0, INT32_MAX, 1, 0),
    HF(max_steps, "max_steps (--max-steps)", 1, 0, 9007199254740992.0, 1, 0),   /* the run's steps when not given */
    HF(wd, "wd (--weight decay)", 1, 0, 10, 0, 0),
    HF(clip, "clip (--clip)", 1, 0, 1e9, 0, 0),
    HF(token_budget, "token_budget (--token-budget)", 0, 16, 1 << 21, 1, 1),
    HF(max_len, "max_len (--max-len)", 0, 2, 1 << 21, 1, 1),
    HF(num_anchors, "num_anchors (--num-anchors)", 0, 1, 1 << 20, 1, 1),
    HF(epochs, "epochs (--epochs)", 0, 1, 1 << 20, 1, 1),
    HF(block_size, "block_size (--block-size)", 0, 2, 64, 1, 1),
    HF(drafter_layers, "drafter_layers (--drafter-layers)", 0, 1, 64, 1, 1),
};
#undef HF

int ckpt_hdr_validate(const ckpt_state_hdr_t *h, const char *path) {
#define BADF(name, fmt, ...) dl_seterr(DL_EFORMAT, "%s: field '%s' = " fmt ": out of range (corrupt or not " \
                                       "written by draftline)", path, name, __VA_ARGS__)
    if (h->version != CKPT_VERSION && h->version != CKPT_VERSION_MASTER)
        return BADF("version", "%u (1 or 2)", h->version);
    if (h->n_params == 0 || h->n_params > (1ull << 40)) return BADF("n_params", "%llu", (unsigned long long)h->n_params);
    if (h->skipped_steps > h->step)
        return BADF("skipped_steps", "%llu (more than the %llu steps applied)", (unsigned long long)h->skipped_steps,
                    (unsigned long long)h->step);
    if (h->settings != 0 && h->settings != CKPT_SETTINGS_V1) return BADF("settings", "%#x (0 or 1)", h->settings);
    for (size_t i = 0; i < sizeof HDR_FIELDS / sizeof HDR_FIELDS[0]; i++) {
        const hfield_t *f = &HDR_FIELDS[i];
        if (f->settings && h->settings != CKPT_SETTINGS_V1) continue;
        const char *p = (const char *)h + f->off;
        double v;
        if (f->is_f64) memcpy(&v, p, sizeof v);
        else if (f->off == offsetof(ckpt_state_hdr_t, mbs_per_step)) { uint64_t u; memcpy(&u, p, 8); v = (double)u; }
        else { uint32_t u; memcpy(&u, p, 4); v = u; }
        if (!isfinite(v) || v < f->lo || v > f->hi || (f->whole && v != floor(v)))
            return BADF(f->name, "%.9g (%s%.9g..%.9g)", v, f->whole ? "whole, " : "", f->lo, f->hi);
    }
    if (h->settings == CKPT_SETTINGS_V1 && h->max_len > h->token_budget)
        return BADF("max_len", "%u (more than token_budget %u)", h->max_len, h->token_budget);
    if (h->reserved_u32 != 0) return BADF("reserved_u32", "%u (0)", h->reserved_u32);
    if (h->crc_kind != 0 && h->crc_kind != CKPT_CRC32) return BADF("crc_kind", "%u (0 or 1)", h->crc_kind);
    if (h->crc_kind == 0 && h->crc32 != 0) return BADF("crc32", "%08x (0 without crc_kind)", h->crc32);
    if ((h->crc_kind == 0 || h->version == CKPT_VERSION_MASTER) && h->master_crc32 != 0)
        return BADF("master_crc32", "%08x (0 unless version 2 with crc_kind)", h->master_crc32);
    for (size_t i = 0; i < sizeof h->reserved; i++)
        if (h->reserved[i]) return BADF("reserved", "byte %zu = %u (0)", i, h->reserved[i]);
#undef BADF
    return 0;
}

/* state.bin of dir: header checked (ckpt_hdr_validate), size, CRC-32 when recorded
 * (*checked 1). Streams the file (1 MiB at a time). */
static int verify_state(const char *dir, ckpt_state_hdr_t *h, int *checked) {
    char p[4200];
    snprintf(p, sizeof p, "%s/state.bin", dir);
    *checked = 0;
    DL_TRY(ckpt_read_hdr(dir, h));
    DL_TRY(ckpt_hdr_validate(h, p));
    struct stat st;
    if (stat(p, &st) != 0) return dl_seterr(DL_EIO, "stat %s: %s", p, strerror(errno));
    uint64_t want = sizeof *h + (h->version == CKPT_VERSION_MASTER ? 3 : 2) * h->n_params * 4;
    if ((uint64_t)st.st_size != want)
        return dl_seterr(DL_EFORMAT, "%s: %llu bytes, its header (n_params %llu) says %llu: truncated or corrupt", p,
                         (unsigned long long)st.st_size, (unsigned long long)h->n_params, (unsigned long long)want);
    if (h->crc_kind != CKPT_CRC32) return 0;
    FILE *f = fopen(p, "rb");
    uint8_t *buf = malloc(1u << 20);
    if (!f || !buf) {
        free(buf);
        if (f) fclose(f);
        return dl_seterr(DL_EIO, "open %s: %s", p, strerror(errno));
    }
    ckpt_state_hdr_t z = *h;
    z.crc32 = 0;
    uLong crc = crc32_z(crc32_z(0, Z_NULL, 0), (const Bytef *)&z, sizeof z);
    size_t n;
    int rc = fseeko(f, (off_t)sizeof z, SEEK_SET) == 0 ? 0 : dl_seterr(DL_EIO, "seek %s", p);
    while (rc == 0 && (n = fread(buf, 1, 1u << 20, f)) > 0) crc = crc32_z(crc, buf, n);
    if (rc == 0 && ferror(f)) rc = dl_seterr(DL_EIO, "read %s: %s", p, strerror(errno));
    fclose(f);
    free(buf);
    if (rc == 0 && (uint32_t)crc != h->crc32)
        rc = dl_seterr(DL_EFORMAT, "%s: checksum mismatch (CRC-32 %08x, recorded %08x): the file is corrupt", p,
                       (unsigned)crc, (unsigned)h->crc32);
    *checked = rc == 0;
    return rc;
}

#define CKPT_ST_HEADER_MAX (100u << 20)   /* safetensors header bytes (the safetensors crate's limit) */

/* The JSON header of model.safetensors at p, parsed, into *out (the caller deletes it).
 * DL_EIO when unopenable, DL_EFORMAT "header unreadable" otherwise. */
static int model_header(const char *p, cJSON **out) {
    *out = NULL;
    FILE *f = fopen(p, "rb");
    if (!f) return dl_seterr(DL_EIO, "open %s: %s", p, strerror(errno));
    uint64_t hl = 0;
    char *txt = NULL;
    int ok = fread(&hl, 8, 1, f) == 1 && hl <= CKPT_ST_HEADER_MAX && (txt = malloc(hl + 1)) &&
             fread(txt, 1, hl, f) == hl;
    fclose(f);
    *out = ok ? cJSON_ParseWithLength(txt, hl) : NULL;
    free(txt);
    return *out ? 0 : dl_seterr(DL_EFORMAT, "%s: header unreadable", p);
}

/* Version 2: model.safetensors' data CRC-32 (its __metadata__, checked against the data by
 * dflash_ckpt_verify_weights: model_ok) is state.bin's master_crc32, its data being the
 * master byte for byte. Reads the header only. */
static int verify_master(const char *dir, const ckpt_state_hdr_t *h, int model_ok) {
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (!model_ok)
        return dl_seterr(DL_EFORMAT, "%s: records no checksum, but state.bin (version 2) records its master weights' "
                         "CRC-32 %08x: not this checkpoint's model", p, (unsigned)h->master_crc32);
    cJSON *j;
    DL_TRY(model_header(p, &j));
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "__metadata__"),
                                                      DFLASH_CRC_KEY);
    unsigned long rec = cJSON_IsString(c) ? strtoul(c->valuestring, NULL, 16) : 0;
    int have = cJSON_IsString(c);
    cJSON_Delete(j);
    if (!have) return dl_seterr(DL_EFORMAT, "%s: header unreadable", p);
    if ((uint32_t)rec != h->master_crc32)
        return dl_seterr(DL_EFORMAT, "%s: its data (CRC-32 %08lx) is not the master weights state.bin records "
                         "(CRC-32 %08x): the file is corrupt or not this checkpoint's", p, rec,
                         (unsigned)h->master_crc32);
    return 0;
}

/* Entry e (model.safetensors' header) of drafter tensor t: 1 when it is F32 of t's shape at
 * data offsets [4 t->offset, 4 (t->offset + t->numel)), else 0 with why[cap] saying what
 * differs. */
static int entry_is_master(const cJSON *e, const drafter_tensor_t *t, char *why, size_t cap) {
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    char a[96], b[96];
    if (!cJSON_IsString(dt) || strcmp(dt->valuestring, "F32") != 0) {
        snprintf(why, cap, "is %.16s, a training checkpoint's master weights are F32",
                 cJSON_IsString(dt) ? dt->valuestring : "of no dtype");
        return 0;
    }
    int64_t shape[ST_MAX_DIMS] = {0};
    int nd = cJSON_IsArray(sh) ? cJSON_GetArraySize(sh) : -1, same = nd == t->n_dims;
    for (int k = 0; k < nd && k < ST_MAX_DIMS; k++) {
        const cJSON *x = cJSON_GetArrayItem(sh, k);
        shape[k] = cJSON_IsNumber(x) ? (int64_t)x->valuedouble : -1;
        same = same && shape[k] == t->shape[k];
    }
    if (!same) {
        snprintf(why, cap, "has shape %s, the drafter's is %s",
                 shape_str(nd < 0 ? 0 : nd > ST_MAX_DIMS ? ST_MAX_DIMS : nd, shape, a, sizeof a),
                 shape_str(t->n_dims, t->shape, b, sizeof b));
        return 0;
    }
    double lo = (double)t->offset * 4, hi = (double)(t->offset + t->numel) * 4;
    const cJSON *o0 = cJSON_GetArrayItem(of, 0), *o1 = cJSON_GetArrayItem(of, 1);
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2 || !cJSON_IsNumber(o0) || !cJSON_IsNumber(o1) ||
        o0->valuedouble != lo || o1->valuedouble != hi) {
        snprintf(why, cap, "is at data offsets [%.0f, %.0f], its place in the master is [%.0f, %.0f]",
                 cJSON_IsNumber(o0) ? o0->valuedouble : -1.0, cJSON_IsNumber(o1) ? o1->valuedouble : -1.0, lo, hi);
        return 0;
    }
    return 1;
}

int ckpt_verify_layout(const char *dir, const drafter_config_t *dc) {
    ckpt_state_hdr_t h;
    DL_TRY(ckpt_read_hdr(dir, &h));
    if (h.version == CKPT_VERSION_MASTER) return 0;   /* its master is in state.bin */
    ops_ctx_t ops;
    ops_cpu_init(&ops, 1);
    static const float no_embed[1];
    drafter_new_opts_t lo = {.layout_only = 1};
    drafter_t *d;
    DL_TRY(drafter_new_opts(&ops, dc, no_embed, no_embed, 1, 1, 0, &lo, &d));
    char p[4200], why[256];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    cJSON *j;
    int rc = model_header(p, &j);
    for (int i = 0; rc == 0 && i < drafter_n_tensors(d); i++) {
        const drafter_tensor_t *t = drafter_tensor(d, i);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, t->name);
        if (!cJSON_IsObject(e))
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s' missing (the drafter's master weights are read from it)", p,
                           t->name);
        else if (!entry_is_master(e, t, why, sizeof why))
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s' %s: not this drafter's master weights", p, t->name, why);
    }
    cJSON_Delete(j);
    drafter_destroy(&d);
    return rc;
}

int ckpt_verify(const char *dir, unsigned *unverified) {
    unsigned un = 0;
    ckpt_state_hdr_t h;
    int ok;
    DL_TRY(verify_state(dir, &h, &ok));
    if (!ok) un |= CKPT_UNVERIFIED_STATE;
    DL_TRY(dflash_ckpt_verify_weights(dir, &ok));
    if (!ok) un |= CKPT_UNVERIFIED_MODEL;
    if (h.version != CKPT_VERSION_MASTER && h.crc_kind == CKPT_CRC32) DL_TRY(verify_master(dir, &h, ok));
    char p[4200];
    snprintf(p, sizeof p, "%s/cursor.bin", dir);
    FILE *f = fopen(p, "rb");
    if (!f && errno != ENOENT) return dl_seterr(DL_EIO, "open %s: %s", p, strerror(errno));
    if (!f) un |= CKPT_NO_CURSOR;
    else {
        uint8_t b[BATCHER_CURSOR_BYTES + 1];
        size_t got = fread(b, 1, sizeof b, f);
        fclose(f);
        batcher_cursor_t c;
        if (batcher_cursor_decode(b, got, &c) < 0)
            return dl_seterr(DL_EFORMAT, "%s: %s", p, dl_errmsg());
        if (c.seed != h.seed)
            return dl_seterr(DL_EFORMAT, "%s: seed %llu, state.bin's is %llu: they disagree (corrupt)", p,
                             (unsigned long long)c.seed, (unsigned long long)h.seed);
        if (c.next_mb != h.step * h.mbs_per_step)
            return dl_seterr(DL_EFORMAT, "%s: micro-batch %llu, but state.bin's step %llu x %llu micro-batches per "
                             "step is %llu: they disagree (corrupt)", p, (unsigned long long)c.next_mb,
                             (unsigned long long)h.step, (unsigned long long)h.mbs_per_step,
                             (unsigned long long)(h.step * h.mbs_per_step));
    }
    if (unverified) *unverified = un;
    return 0;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 0x100000001b3ull; }
    return h;
}

static int fp_file(const char *path, uint64_t *h) {
    FILE *f = fopen(path, "rb");
    if (!f) return dl_seterr(DL_EIO, "target fingerprint: open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) { fclose(f); return dl_seterr(DL_EIO, "target fingerprint: stat %s", path); }
    uint64_t size = (uint64_t)st.st_size;
    *h = fnv(*h, &size, sizeof size);
    static uint8_t buf[4096];
    for (int i = 0; i < 64; i++) {
        uint64_t off = size > sizeof buf ? (size - sizeof buf) / 63 * (uint64_t)i : 0;
        if (fseeko(f, (off_t)off, SEEK_SET) != 0) break;
        size_t n = fread(buf, 1, sizeof buf, f);
        *h = fnv(*h, buf, n);
        if (size <= sizeof buf) break;
    }
    int bad = ferror(f);
    fclose(f);
    return bad ? dl_seterr(DL_EIO, "target fingerprint: read %s", path) : 0;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int ckpt_target_fingerprint(const char *path, uint64_t *fp) {
    uint64_t h = 0xcbf29ce484222325ull;
    struct stat st;
    if (stat(path, &st) != 0) return dl_seterr(DL_EIO, "target fingerprint: %s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        DL_TRY(fp_file(path, &h));
    } else {
        DIR *d = opendir(path);
        if (!d) return dl_seterr(DL_EIO, "target fingerprint: %s: %s", path, strerror(errno));
        char *names[256];
        int n = 0;
        struct dirent *e;
        while ((e = readdir(d)) && n < 256) {
            if (strcmp(e->d_name, "config.json") != 0 && !has_suffix(e->d_name, ".safetensors") &&
                !has_suffix(e->d_name, ".gguf"))
                continue;
            if (!(names[n] = strdup(e->d_name))) break;
            n++;
        }
        closedir(d);
        qsort(names, (size_t)n, sizeof names[0], name_cmp);
        int rc = 0;
        char p[4400];
        for (int i = 0; i < n; i++) {
            h = fnv(h, names[i], strlen(names[i]) + 1);
            snprintf(p, sizeof p, "%s/%s", path, names[i]);
            if (rc == 0) rc = fp_file(p, &h);
            free(names[i]);
        }
        if (rc < 0) return rc;
    }
    *fp = h ? h : 1;
    return 0;
}

/* ---- retention (ckpt_prune) ---- */

static const char *const ckpt_files[] = {"state.bin", "config.json", "model.safetensors", "cursor.bin"};
#define CKPT_N_FILES (sizeof ckpt_files / sizeof ckpt_files[0])

/* step_<digits>[suffix] -> 1 and *step; anything else (a sign, spaces, an overflow) -> 0 */
static int step_name(const char *name, const char *suffix, uint64_t *step) {
    if (strncmp(name, "step_", 5) != 0) return 0;
    const char *d = name + 5, *e = d;
    while (*e >= '0' && *e <= '9') e++;
    if (e == d || e - d > 19 || strcmp(e, suffix) != 0) return 0;
    uint64_t v = 0;
    for (const char *c = d; c < e; c++) v = v * 10 + (uint64_t)(*c - '0');
    *step = v;
    return 1;
}

/* 1 when dir holds only files of ckpt_files (regular files); *has gets a bit per file */
static int only_ckpt_files(const char *dir, unsigned *has) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int ok = 1;
    *has = 0;
    struct dirent *e;
    char p[4400];
    struct stat st;
    while (ok && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        size_t i = 0;
        while (i < CKPT_N_FILES && strcmp(e->d_name, ckpt_files[i]) != 0) i++;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (i == CKPT_N_FILES || lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) ok = 0;
        else *has |= 1u << i;
    }
    closedir(d);
    return ok;
}

/* deletes dir's checkpoint files and dir; 0, or DL_EIO naming what stayed */
static int rm_ckpt_dir(const char *dir) {
    char p[4400];
    for (size_t i = 0; i < CKPT_N_FILES; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, ckpt_files[i]);
        if (unlink(p) != 0 && errno != ENOENT) return dl_seterr(DL_EIO, "unlink %s: %s", p, strerror(errno));
    }
    if (rmdir(dir) != 0) return dl_seterr(DL_EIO, "rmdir %s: %s", dir, strerror(errno));
    return 0;
}

static int u64_cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int ckpt_prune(const char *out_dir, int64_t keep, uint64_t expected_params, const char *protect) {
    if (keep <= 0) return 0;
    char root[4096], p[4400];
    snprintf(root, sizeof root, "%s/checkpoints", out_dir);
    /* the checkpoint `latest` names (never removed); unreadable: remove nothing */
    snprintf(p, sizeof p, "%s/latest", root);
    char name[128] = {0};
    if (rundir_latest_read(out_dir, name, sizeof name, NULL) == DL_ENOENT && access(p, F_OK) != 0)
        return dl_seterr(DL_ENOENT, "checkpoint retention: open %s: %s", p, strerror(ENOENT));
    uint64_t latest;
    if (!step_name(name, "", &latest))
        return dl_seterr(DL_EFORMAT, "checkpoint retention: %s names '%s', not step_<N>", p, name);
    char protect_real[PATH_MAX] = "";
    if (protect && !realpath(protect, protect_real)) protect_real[0] = 0;
    DIR *d = opendir(root);
    if (!d) return dl_seterr(DL_EIO, "checkpoint retention: opendir %s: %s", root, strerror(errno));
    uint64_t *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t s;
        unsigned has;
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", root, e->d_name);
        if (step_name(e->d_name, ".deleting", &s)) {   /* an earlier failed removal */
            if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode) && only_ckpt_files(p, &has)) rm_ckpt_dir(p);
            continue;
        }
        if (!step_name(e->d_name, "", &s) || lstat(p, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        /* complete: state.bin, config.json, model.safetensors (bits 0..2), nothing foreign */
        if (!only_ckpt_files(p, &has) || (has & 7u) != 7u) continue;
        ckpt_state_hdr_t h;
        if (ckpt_read_hdr(p, &h) < 0 || h.step != s || h.n_params != expected_params) continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            uint64_t *t = realloc(steps, nc * sizeof *t);
            if (!t) break;
            steps = t;
            cap = nc;
        }
        steps[n++] = s;
    }
    closedir(d);
    if (n) qsort(steps, n, sizeof *steps, u64_cmp);
    int removed = 0;
    size_t left = n;
    for (size_t i = 0; i < n && left > (uint64_t)keep; i++) {
        /* a step past latest is a run's own future before it was resumed from an older
         * checkpoint: not older, so kept (a checkpoint written at its step replaces it) */
        if (steps[i] >= latest) continue;
        char dir[4200], del[4300], real[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/step_%llu", root, (unsigned long long)steps[i]);
        if (protect_real[0] && realpath(dir, real) && !strcmp(real, protect_real)) continue;
        snprintf(del, sizeof del, "%s.deleting", dir);
        if (rename(dir, del) != 0) {
            log_warn("checkpoint retention: could not remove %s (rename: %s); kept", dir, strerror(errno));
            continue;
        }
        left--;
        if (rm_ckpt_dir(del) < 0) {
            log_warn("checkpoint retention: %s (retried at the next checkpoint)", dl_errmsg());
            continue;
        }
        removed++;
    }
    free(steps);
    fsync_dir(root);
    return removed;
}
