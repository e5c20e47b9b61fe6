/* GPU turns between processes: see gputurn.h. */
#include "common/pipe/gputurn.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"

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

double gpu_turn_take(gpu_turn_t *t, const int *stopping) {
    if (t->fd < 0 || t->held) return 0;
    double t0 = clock_mono_s();
    /* fairness: a stage that finds others waiting (often the one that just gave the
     * turn back and wants it again) lets them go first: it joins the waiters and polls
     * only after GPU_TURN_YIELD_US, longer than a waiter's longest nap */
    int yield = others_waiting(t);
    int waiting = flock(t->want_fd, LOCK_SH) == 0;   /* said to the others while we wait */
    if (yield) usleep(GPU_TURN_YIELD_US);
    useconds_t nap = GPU_TURN_NAP_MIN_US;
    double waited;
    for (;;) {
        if (flock(t->fd, LOCK_EX | LOCK_NB) == 0) {
            t->held = 1;
            t->taken++;
            break;
        }
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
            if (!stop && !t->warned && !t->quiet_limit) {
                log_warn("GPU turn %s: held by another stage for %.1f s: going on without it (this unit of work "
                         "time-slices the GPU; said once)", t->path, waited);
                t->warned = 1;
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

void gpu_turn_give(gpu_turn_t *t) {
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
    int gpu = runcfg_stage_gpu(c, stage_id), n = runcfg_gpu_sharers(c, stage_id);
    int opt = stage_id == PIPE_ID_OPTIMIZER;
    if (opt && gpu >= 0) {   /* the targets and drafters on its GPU, on its node */
        n = 0;
        for (int i = 0; i < c->n_targets + c->n_drafters; i++) {
            uint32_t id = i < c->n_targets ? PIPE_ID_TARGET0 + (uint32_t)i : PIPE_ID_DRAFTER0 + (uint32_t)(i - c->n_targets);
            n += runcfg_stage_gpu(c, id) == gpu && runcfg_stage_node(c, id) == c->optimizer_node;
        }
        if (n < 2) n = 0;   /* one stage there does not take turns: nor does the optimizer */
    }
    if (gpu < 0 || n == 0) return 0;
    const char *mps = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (mps && *mps) {
        log_info("GPU %d: shared with %d other stage(s) under CUDA MPS (%s): side by side, no turns", gpu, n, mps);
        return 0;
    }
    if (!c->gpu_turns) {
        log_info("GPU %d: shared with %d other stage(s), --gpu-turns off: time-sliced by the driver", gpu, n);
        return 0;
    }
    DL_TRY(gpu_turn_open(t, run_dir, gpu));
    if (opt) {
        t->wait_max_s = GPU_TURN_OPT_WAIT_S;
        t->quiet_limit = 1;
        log_info("GPU %d: shared with %d stage(s) taking turns: each step applied in a turn (waited for at most "
                 "%.1f s, then without it) (%s)", gpu, n, t->wait_max_s, t->path);
    } else
        log_info("GPU %d: shared with %d other stage(s): taking turns on it, one unit of work each (%s)", gpu, n,
                 t->path);
    return 0;
}
