/* GPU turns between processes: see gputurn.h. */
#include "common/pipe/gputurn.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/testhook.h"

#include <errno.h>
#include <stdlib.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

void gpu_turn_init(gpu_turn_t *t) {
    memset(t, 0, sizeof *t);
    t->fd = t->want_fd = -1;
    t->wait_max_s = GPU_TURN_WAIT_MAX_S;
}

int gpu_turn_open(gpu_turn_t *t, const char *dir, int gpu) {
    gpu_turn_init(t);
    char want[sizeof t->path];
    int n = snprintf(t->path, sizeof t->path, "%s/gpu%d.turn", dir, gpu);
    int m = snprintf(want, sizeof want, "%s/gpu%d.want", dir, gpu);
    if (n < 0 || (size_t)n >= sizeof t->path || m < 0 || (size_t)m >= sizeof want) {
        t->path[0] = 0;
        return dl_seterr(DL_ERANGE, "GPU turn file: dir '%.200s...' too long", dir);
    }
    int fd = open(t->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return dl_seterr(DL_EIO, "GPU turn file %s: %s", t->path, strerror(errno));
    int wfd = open(want, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (wfd < 0) {
        close(fd);
        return dl_seterr(DL_EIO, "GPU turn file %s: %s", want, strerror(errno));
    }
    t->fd = fd;
    t->want_fd = wfd;
    return 0;
}

static int stop_asked(const int *stopping) { return stopping && __atomic_load_n(stopping, __ATOMIC_RELAXED); }

/* 1 when another stage waits for the turn (holds the waiters' file shared). */
static int others_waiting(const gpu_turn_t *t) {
    if (flock(t->want_fd, LOCK_EX | LOCK_NB) == 0) {
        flock(t->want_fd, LOCK_UN);
        return 0;
    }
    return errno == EWOULDBLOCK;
}

/* One try for the turn, no wait: 1 and held when it was free. */
static int try_take(gpu_turn_t *t) {
    if (flock(t->fd, LOCK_EX | LOCK_NB) != 0) return 0;
    t->held = 1;
    t->taken++;
    return 1;
}

double gpu_turn_take(gpu_turn_t *t, const int *stopping) {
    if (t->fd < 0 || t->held) return 0;
    double t0 = clock_mono_s();
    if (t->hung) {   /* a holder hung before: one try, no wait, until a take gets it again */
        if (try_take(t)) t->hung = t->warned = 0;   /* the turn came back: a later hang is said again */
        else t->skipped++;
        return clock_mono_s() - t0;
    }
    /* fairness: a stage that finds others waiting (often the one that just gave the
     * turn back and wants it again) lets them go first: it joins the waiters and polls
     * only after GPU_TURN_YIELD_US, longer than a waiter's longest nap. Joining never
     * blocks (another's probe holds the file for microseconds: then we do not join) */
    int yield = others_waiting(t);
    int waiting = flock(t->want_fd, LOCK_SH | LOCK_NB) == 0;
    if (yield) usleep(GPU_TURN_YIELD_US);
    useconds_t nap = GPU_TURN_NAP_MIN_US;
    double waited;
    for (;;) {
        if (try_take(t)) break;
        int e = errno;
        waited = clock_mono_s() - t0;
        if (e != EWOULDBLOCK && e != EINTR) {   /* not a busy lock: turns cannot work */
            if (!t->warned) log_warn("GPU turn %s: flock: %s; this stage goes on without turns", t->path, strerror(e));
            t->warned = 1;
            t->skipped++;
            break;
        }
        int stop = stop_asked(stopping);
        if (stop || waited >= t->wait_max_s) {
            if (!stop) {
                if (!t->warned)
                    log_warn("GPU turn %s: held by another stage for %.1f s: going on without it (this unit of "
                             "work time-slices the GPU; until the turn comes back, the next ones try once, "
                             "without waiting; said once)", t->path, waited);
                t->warned = 1;
                t->hung = 1;
            }
            t->skipped++;
            break;
        }
        usleep(nap);
        nap = nap * 2 > GPU_TURN_NAP_MAX_US ? GPU_TURN_NAP_MAX_US : nap * 2;
    }
    if (waiting) flock(t->want_fd, LOCK_UN);
    return clock_mono_s() - t0;
}

static void ready_take(uv_work_t *req) {
    gpu_turn_t *t = req->data;
    t->last_wait_s = gpu_turn_take(t, t->stopping);
    t->passed = !t->held;
}

static void ready_after(uv_work_t *req, int status) {
    gpu_turn_t *t = req->data;
    t->pending = 0;
    if (status == UV_ECANCELED) t->passed = 1;   /* not run (the loop is closing): on without it */
    t->cb(t->cb_arg);
}

int gpu_turn_ready(gpu_turn_t *t, uv_loop_t *loop, const int *stopping, gpu_turn_cb cb, void *arg) {
    if (t->fd < 0) return 1;
    /* pending first: while a take is in flight its thread writes held / passed; the loop
     * reads them only after ready_after (libuv orders the two) */
    if (t->pending) return 0;
    if (t->held || t->passed) return 1;
    t->stopping = stopping;
    t->cb = cb;
    t->cb_arg = arg;
    t->req.data = t;
    if (uv_queue_work(loop, &t->req, ready_take, ready_after) != 0) return 1;
    t->pending = 1;
    return 0;
}

void gpu_turn_give(gpu_turn_t *t) {
    t->passed = 0;
    if (t->fd < 0 || !t->held) return;
    flock(t->fd, LOCK_UN);
    t->held = 0;
}

void gpu_turn_close(gpu_turn_t *t) {
    gpu_turn_give(t);
    if (t->fd >= 0) close(t->fd);
    if (t->want_fd >= 0) close(t->want_fd);
    t->fd = t->want_fd = -1;
}

int gpu_turn_setup(gpu_turn_t *t, const run_config_t *c, uint32_t stage_id, const char *run_dir) {
    gpu_turn_init(t);
    int gpu = runcfg_stage_gpu(c, stage_id);
    int64_t cpu = 0;   /* test hook gpu_turns.cpu=1: CPU stages take turns as if on GPU 0 */
    int all = gpu < 0 && testhook_i64("gpu_turns.cpu", &cpu) && cpu == 1;
    if (all) gpu = 0;
    if (gpu < 0) return 0;
    int n = stage_id == PIPE_ID_OPTIMIZER ? 0 : all ? c->n_targets + c->n_drafters - 1 : runcfg_gpu_sharers(c, stage_id);   /* (for the log) */
    const char *mps = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (mps && *mps) {
        if (n) log_info("GPU %d: shared with %d other target(s) / drafter(s) under CUDA MPS (%s): side by side, no turns", gpu, n, mps);
        return 0;
    }
    if (!c->gpu_turns) {
        if (n) log_info("GPU %d: shared with %d other target(s) / drafter(s), --gpu-turns off: time-sliced by the driver", gpu, n);
        return 0;
    }
    DL_TRY(gpu_turn_open(t, run_dir, gpu));
    if (n) log_info("GPU %d: shared with %d other target(s) / drafter(s): taking turns on it, one unit of work each (%s)", gpu, n,
                    t->path);
    else log_debug("GPU %d: taking turns on it (%s; alone there now)", gpu, t->path);
    return 0;
}

const char *gpu_turn_waited(const gpu_turn_t *t, double waited, char *buf, size_t n) {
    if (t->fd < 0) return "";
    snprintf(buf, n, " (after %.2f s waiting for the GPU's turn)", waited);
    return buf;
}
