/* optimizer: the checkpoint writer (opt_int.h). A snapshot of the step's state on a
 * libuv worker thread, then the files from the snapshot on a worker thread while the
 * loop goes on applying steps; the loop thread only queues work and logs.
 *
 * States: idle -> (queued behind a write) -> snapshot -> write -> idle. At most one
 * checkpoint is queued: it holds the steps (its state must stay the step's), so no
 * other can be asked for before it starts. */
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/mem/dev.h"
#include "optimizer/opt_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define OCKW_COPY_CHUNK (16u << 20)   /* bytes per parallel memcpy chunk (CPU snapshot) */
#define OCKW_PIN_CHUNK (64u << 20)    /* bytes per cudaHostRegister call: the driver is held that long */

typedef struct {
    int on;
    ckpt_state_hdr_t h;
    uint8_t cur[40];
    int have_cur;
    const float *src[3];       /* master, m, v on the backend */
    int then;
    double t_asked;
} ockw_job_t;

struct ockw {
    uv_loop_t *loop;
    ockw_cfg_t cfg;
    ockw_cb_t cb;
    uv_work_t snap_req, write_req;
    int snapping, writing;
    ockw_job_t cur, next;      /* the one in snapshot or write; the one queued behind it */
    /* the snapshot: master, m, v (P f32 each; GPU: given or allocated on alloc_th, pinned
     * unless pinning failed; CPU: malloc'd at the first use) */
    float *snap[3];
    int pinned[3];
    pthread_t alloc_th;
    int alloc_on;              /* alloc_th runs or has not been joined */
    atomic_int pin_hold;       /* ockw_pin_hold: alloc_th waits between pieces while set */
    void *stream;              /* GPU: the copy stream */
    const float *wsrc[3];      /* what the write reads: snap, or the state itself (final, CPU) */
    int snap_rc, write_rc, pruned;
    char err[512], prune_err[512];
    double t_snap0, snap_s, write_s, waited_s;
    char dir[4200];
    ockw_times_t last;
    int have_last;
};

static void start_snapshot(ockw_t *w);

/* The alignment of snapshot buffers and of their pinned pieces: the page size, at least
 * 4096 (two pieces must never share a page: 64 KiB pages on some ARM hosts). */
static size_t pin_page(void) {
    long ps = sysconf(_SC_PAGESIZE);
    return ps > 4096 ? (size_t)ps : 4096;
}

float *ockw_host_buffer(size_t bytes, const char *what) {
    void *p = NULL;
    if (posix_memalign(&p, pin_page(), bytes ? bytes : 1) != 0) {
        log_error("%s: out of memory for %.2f GiB of host memory", what, bytes / 1073741824.0);
        return NULL;
    }
    return p;
}

void ockw_host_unpin(float *p, size_t bytes) {
    if (!p) return;
    if ((uintptr_t)p % pin_page()) { dev_host_unregister(p); return; }   /* pinned in one piece */
    for (size_t off = 0; off < bytes; off += OCKW_PIN_CHUNK) dev_host_unregister((uint8_t *)p + off);
}

int ockw_host_pin(float *p, size_t bytes, int gpu, const char *what, const atomic_int *hold) {
    if (gpu < 0 || !p) return 0;
    double t0 = clock_mono_s();
    size_t piece = (uintptr_t)p % pin_page() ? bytes : OCKW_PIN_CHUNK, off = 0;   /* unaligned: one call */
    int rc = dev_set(gpu), stopped = 0;
    while (rc == 0 && off < bytes) {
        while (hold && atomic_load(hold) == OCKW_PIN_HOLD) usleep(1000);   /* a step is being applied */
        if (hold && atomic_load(hold) == OCKW_PIN_STOP) { stopped = 1; break; }
        size_t n = bytes - off < piece ? bytes - off : piece;
        rc = dev_host_register((uint8_t *)p + off, n);
        if (rc == 0) off += n;
    }
    if (stopped) {   /* the writer is being destroyed: pageable, nothing to say */
        if (off) ockw_host_unpin(p, off);
        return 0;
    }
    if (rc == 0) {
        log_debug("%s: %.2f GiB pinned in %.2f s", what, bytes / 1073741824.0, clock_mono_s() - t0);
        return 1;
    }
    if (off) ockw_host_unpin(p, off);   /* the pieces registered (none: no call) */
    log_warn("%s: no pinned host memory for %.2f GiB (%s): pageable memory instead, so each checkpoint's "
             "snapshot will hold the steps longer (device-to-host copies staged by the driver)", what,
             bytes / 1073741824.0, dl_errmsg());
    return 0;
}

/* Frees a snapshot buffer (unpinned first when pinned). */
static void snap_free(float *p, int pinned, size_t bytes) {
    if (pinned) ockw_host_unpin(p, bytes);
    free(p);
}

/* Thread started by ockw_new (GPU): the snapshot buffers not given, and every one not
 * pinned yet pinned (in pieces, so the loop's CUDA calls wait for one piece at most). */
static void *alloc_main(void *arg) {
    ockw_t *w = arg;
    static const char *const what[3] = {"checkpoint snapshot (master)", "checkpoint snapshot (Adam m)",
                                        "checkpoint snapshot (Adam v)"};
    size_t bytes = w->cfg.P * sizeof(float);
    for (int i = 0; i < 3; i++) {
        if (!w->snap[i]) w->snap[i] = ockw_host_buffer(bytes, what[i]);
        if (w->snap[i] && !w->pinned[i])
            w->pinned[i] = ockw_host_pin(w->snap[i], bytes, w->cfg.gpu, what[i], &w->pin_hold);
    }
    return NULL;
}

void ockw_pin_hold(ockw_t *w, int on) {
    if (!w) return;
    int cur = atomic_load(&w->pin_hold), want = on ? OCKW_PIN_HOLD : OCKW_PIN_RUN;
    while (cur != OCKW_PIN_STOP && !atomic_compare_exchange_weak(&w->pin_hold, &cur, want)) {}
}

/* The allocation thread's end: for a snapshot (stop 0: the pinning finishes, how long it
 * was waited for is said when it was not done already) or destroy (stop 1: the pinning stops
 * after the piece in progress, those buffers stay pageable). */
static void alloc_join(ockw_t *w, int stop) {
    if (!w->alloc_on) return;
    atomic_store(&w->pin_hold, stop ? OCKW_PIN_STOP : OCKW_PIN_RUN);   /* no hold while we wait */
    double t0 = clock_mono_s();
    pthread_join(w->alloc_th, NULL);
    w->alloc_on = 0;
    double dt = clock_mono_s() - t0;
    if (dt > 0.1) log_info("checkpoint snapshot waited %.2f s for its host buffers to be allocated", dt);
}

/* Worker thread: the copy stream (first time), the device -> host copies into the
 * buffers (joined first), waited for here. */
static int snap_gpu(ockw_t *w, size_t bytes) {
    alloc_join(w, 0);
    for (int i = 0; i < 3; i++)
        if (!w->snap[i]) return dl_seterr(DL_ENOMEM, "out of host memory for %zu bytes", bytes);
    DL_TRY(dev_set(w->cfg.gpu));
    if (!w->stream) DL_TRY(dev_stream_new(w->cfg.gpu, &w->stream));
    /* piece by piece where pinned so (a copy never spans two registrations) */
    for (int i = 0; i < 3; i++) {
        size_t piece = w->pinned[i] && (uintptr_t)w->snap[i] % pin_page() == 0 ? OCKW_PIN_CHUNK : bytes;
        for (size_t off = 0; off < bytes; off += piece)
            DL_TRY(dev_copy_async((uint8_t *)w->snap[i] + off, (const uint8_t *)w->cur.src[i] + off,
                                  bytes - off < piece ? bytes - off : piece, w->stream));
    }
    return dev_stream_sync(w->stream);
}

/* Worker thread: the host state into the snapshot, in parallel chunks. */
static int snap_cpu(ockw_t *w, size_t bytes) {
    for (int i = 0; i < 3; i++)
        if (!w->snap[i] && !(w->snap[i] = malloc(bytes)))
            return dl_seterr(DL_ENOMEM, "checkpoint snapshot: out of memory for %zu bytes", 3 * bytes);
    size_t nchunk = (bytes + OCKW_COPY_CHUNK - 1) / OCKW_COPY_CHUNK;
    for (int i = 0; i < 3; i++) {
        uint8_t *dst = (uint8_t *)w->snap[i];
        const uint8_t *src = (const uint8_t *)w->cur.src[i];
#pragma omp parallel for schedule(static)
        for (size_t c = 0; c < nchunk; c++) {
            size_t lo = c * OCKW_COPY_CHUNK, n = bytes - lo < OCKW_COPY_CHUNK ? bytes - lo : OCKW_COPY_CHUNK;
            memcpy(dst + lo, src + lo, n);
        }
    }
    return 0;
}

static void snap_work(uv_work_t *req) {
    ockw_t *w = req->data;
    size_t bytes = w->cfg.P * sizeof(float);
    w->t_snap0 = clock_mono_s();
    w->snap_rc = 0;
    if (w->cfg.gpu < 0 && w->cur.then != OCKW_THEN_NONE) {   /* final, CPU: no step follows */
        for (int i = 0; i < 3; i++) w->wsrc[i] = w->cur.src[i];
    } else {
        w->snap_rc = w->cfg.gpu >= 0 ? snap_gpu(w, bytes) : snap_cpu(w, bytes);
        for (int i = 0; i < 3; i++) w->wsrc[i] = w->snap[i];
    }
    if (w->snap_rc < 0) snprintf(w->err, sizeof w->err, "snapshot: %s", dl_errmsg());   /* thread-local */
    w->snap_s = clock_mono_s() - w->t_snap0;
}

/* Worker thread: the files of the checkpoint (and the retention), from the snapshot. */
static void write_work(uv_work_t *req) {
    ockw_t *w = req->data;
    double t0 = clock_mono_s();
    const ckpt_state_hdr_t *h = &w->cur.h;
    int64_t d = w->cfg.delay_ms;
    if (d > 0) nanosleep(&(struct timespec){d / 1000, (long)(d % 1000) * 1000000L}, NULL);
    if (w->cfg.fail_step >= 0 && h->step == (uint64_t)w->cfg.fail_step)   /* as a full disk would */
        w->write_rc = dl_seterr(DL_EIO, "%s/checkpoints/step_%llu.tmp: write: No space left on device (test hook "
                                "optimizer.ckpt_fail_step)", w->cfg.out, (unsigned long long)h->step);
    else
        w->write_rc = ckpt_write(w->cfg.out, w->cfg.layout, h, w->wsrc[0], w->wsrc[1], w->wsrc[2],
                                 w->cur.have_cur ? w->cur.cur : NULL, w->dir, sizeof w->dir);
    w->pruned = 0;
    if (w->write_rc < 0) {
        snprintf(w->err, sizeof w->err, "%s", dl_errmsg());
    } else if (w->cfg.keep > 0) {
        /* retention: failures are warnings, the run goes on */
        const char *rd = w->cfg.resume_dir;
        const char *protect = rd && rd[0] && h->step <= w->cfg.resume_step ? rd : NULL;
        w->pruned = ckpt_prune(w->cfg.out, w->cfg.keep, w->cfg.P, protect);
        if (w->pruned < 0) snprintf(w->prune_err, sizeof w->prune_err, "%s", dl_errmsg());
    }
    w->write_s = clock_mono_s() - t0;
}

/* Loop thread: the checkpoint failed (snapshot or files): said, and training goes on. */
static void report_failure(ockw_t *w, int rc) {
    dl_seterr(rc, "%s", w->err);
    log_rc(rc, "checkpoint");
}

static void write_after(uv_work_t *req, int status) {
    ockw_t *w = req->data;
    (void)status;
    w->writing = 0;
    ockw_job_t job = w->cur;
    w->cur.on = 0;
    if (w->write_rc < 0) {
        report_failure(w, w->write_rc);
    } else {
        log_info("checkpoint step %llu written to %s (%.2f s: snapshot %.2f s, files %.2f s%s)",
                 (unsigned long long)job.h.step, w->dir, w->snap_s + w->write_s, w->snap_s, w->write_s,
                 job.then == OCKW_THEN_NONE ? ", steps went on meanwhile" : "");
        if (w->pruned < 0) log_warn("--keep-checkpoints %lld: %s", (long long)w->cfg.keep, w->prune_err);
        else if (w->pruned > 0)
            log_info("--keep-checkpoints %lld: removed %d older checkpoint(s)", (long long)w->cfg.keep, w->pruned);
        w->last = (ockw_times_t){job.h.step, w->waited_s, w->snap_s, w->write_s};
        w->have_last = 1;
    }
    if (w->next.on) {   /* the queued one (it holds the steps) starts before anyone hears */
        w->cur = w->next;
        w->next.on = 0;
        w->waited_s = clock_mono_s() - w->cur.t_asked;
        log_info("checkpoint step %llu waited %.2f s for the write of step %llu (no step applied meanwhile)",
                 (unsigned long long)w->cur.h.step, w->waited_s, (unsigned long long)job.h.step);
        start_snapshot(w);
    }
    w->cb.done(w->cb.arg, job.h.step, w->write_rc, job.then);
}

static void snap_after(uv_work_t *req, int status) {
    ockw_t *w = req->data;
    (void)status;
    w->snapping = 0;
    if (w->snap_rc < 0) {   /* no files: as a failed write */
        ockw_job_t job = w->cur;
        w->cur.on = 0;
        report_failure(w, w->snap_rc);
        w->cb.done(w->cb.arg, job.h.step, w->snap_rc, job.then);
        return;
    }
    w->writing = 1;
    w->write_req.data = w;
    uv_queue_work(w->loop, &w->write_req, write_work, write_after);
    w->cb.snapped(w->cb.arg);
}

static void start_snapshot(ockw_t *w) {
    w->snapping = 1;
    w->snap_req.data = w;
    uv_queue_work(w->loop, &w->snap_req, snap_work, snap_after);
}

int ockw_new(ockw_t **out, uv_loop_t *loop, const ockw_cfg_t *cfg, const ockw_cb_t *cb) {
    ockw_t *w = calloc(1, sizeof *w);
    *out = w;
    for (int i = 0; i < 3; i++) {
        if (w) w->snap[i] = cfg->snap[i], w->pinned[i] = cfg->pinned[i];
        else snap_free(cfg->snap[i], cfg->pinned[i], cfg->P * sizeof(float));
    }
    if (!w) return dl_seterr(DL_ENOMEM, "checkpoint writer: out of memory");
    w->loop = loop;
    w->cfg = *cfg;
    w->cb = *cb;
    int todo = 0;
    for (int i = 0; i < 3; i++) todo |= !w->snap[i] || !w->pinned[i];
    if (cfg->gpu >= 0 && todo) {
        w->alloc_on = pthread_create(&w->alloc_th, NULL, alloc_main, w) == 0;
        if (!w->alloc_on) alloc_main(w);   /* no thread: here, before the first step */
    }
    return 0;
}

void ockw_destroy(ockw_t **wp) {
    if (!wp || !*wp) return;
    ockw_t *w = *wp;
    double t0 = clock_mono_s();
    alloc_join(w, 1);   /* an early stop does not wait for the whole pinning */
    double t1 = clock_mono_s();
    for (int i = 0; i < 3; i++)
        if (w->pinned[i]) ockw_host_unpin(w->snap[i], w->cfg.P * sizeof(float));
    double t2 = clock_mono_s();
    for (int i = 0; i < 3; i++) free(w->snap[i]);
    dev_stream_destroy(w->stream);
    /* part of the shutdown that `draftline run`'s wall counts (unpinning GBs takes time) */
    log_info("checkpoint writer: pinning thread joined in %.2f s, snapshot buffers unpinned in %.2f s, freed in "
             "%.2f s", t1 - t0, t2 - t1, clock_mono_s() - t2);
    free(w);
    *wp = NULL;
}

void ockw_start(ockw_t *w, const ckpt_state_hdr_t *h, const uint8_t *cursor, const float *master,
                const float *m, const float *v, int then) {
    ockw_job_t j = {1, *h, {0}, cursor != NULL, {master, m, v}, then, clock_mono_s()};
    if (cursor) memcpy(j.cur, cursor, sizeof j.cur);
    if (w->snapping || w->next.on) {   /* cannot happen: such a checkpoint holds the steps */
        log_error("checkpoint step %llu asked for while another one holds the steps: skipped",
                  (unsigned long long)h->step);
        return;
    }
    if (w->writing) {
        w->next = j;
        log_info("checkpoint step %llu waits for the write of step %llu to finish", (unsigned long long)h->step,
                 (unsigned long long)w->cur.h.step);
        return;
    }
    w->cur = j;
    w->waited_s = 0;
    start_snapshot(w);
}

int ockw_holds_steps(const ockw_t *w) { return w && (w->snapping || w->next.on); }
int ockw_busy(const ockw_t *w) { return w && (w->snapping || w->writing || w->next.on); }
const char *ockw_last_dir(const ockw_t *w) { return w ? w->dir : ""; }

int ockw_times(const ockw_t *w, ockw_times_t *t) {
    if (!w || !w->have_last) return 0;
    *t = w->last;
    return 1;
}
