/* common/pipe/gputurn: GPU turns between processes (an exclusive flock on
 * "<dir>/gpu<N>.turn"), no CUDA involved:
 *
 *  - two forked processes taking turns on one file: each logs "enter <pid>", sleeps 20 ms,
 *    logs "leave <pid>" while it holds the turn; no two enters interleave;
 *  - a holder that never gives back (another gpu_turn_t of this process: flock locks belong
 *    to the open file description, so two opens conflict): a taker with wait_max_s 0.2
 *    goes on without the turn after >= 0.2 s, counted in skipped, warned once;
 *  - the stopping flag, set before or during the wait: the taker goes on promptly;
 *  - a child killed with SIGKILL while holding the turn: the kernel released it, the
 *    parent takes it at once;
 *  - fairness: a holder that gives the turn back and wants it again at once (20 ms holds)
 *    lets a waiter go first: the waiter gets it within 10 holds, five times in a row;
 *  - turns off (gpu_turn_init): take returns 0, give and close do nothing;
 *  - gpu_turn_open in a missing dir: DL_EIO naming the path;
 *  - gpu_turn_ready (GPU work on an event loop): the take on the thread pool, the callback
 *    on the loop with the turn, or after the limit with passed;
 *  - a holder that hangs: after one wait to the limit, takes try once without waiting
 *    until one gets the turn;
 *  - gpu_turn_setup: on for every GPU target / drafter / optimizer, with
 *    gpu_turns 1 and no CUDA MPS server.
 * Every multi-process case runs under proc_watchdog and reaps its children.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/pipe/gputurn.h"
#include "common/pipe/stage.h"
#include "tests/support/proc.h"

#define WATCHDOG_S 60          /* per test: a hang is a failure, not a stuck CI */
#define ROUNDS 8               /* turns each process takes in test_two_processes */
#define HOLD_US 20000          /* a turn held for 20 ms */

static char g_dir[64];
static char g_mps[512];        /* the caller's CUDA_MPS_PIPE_DIRECTORY, put back by teardown */
static int g_mps_had;

static void tmp_make(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dlturn-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
}

static void tmp_remove(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    assert_int_equal(system(cmd), 0);
}

static int setup(void **state) {
    (void)state;
    proc_watchdog(WATCHDOG_S);
    const char *mps = getenv("CUDA_MPS_PIPE_DIRECTORY");
    g_mps_had = mps != NULL;
    snprintf(g_mps, sizeof g_mps, "%s", mps ? mps : "");
    tmp_make();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    proc_kill_all();
    proc_watchdog(0);
    if (g_mps_had) setenv("CUDA_MPS_PIPE_DIRECTORY", g_mps, 1);
    else unsetenv("CUDA_MPS_PIPE_DIRECTORY");
    tmp_remove();
    return 0;
}

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* ------------------------------------------------------------ two processes */

typedef struct {
    int go_r, go_w;            /* barrier: the children start when the parent closes go_w */
    char log[128];             /* the shared O_APPEND log */
} turns_arg_t;

typedef struct {
    uint64_t taken, skipped;
    double waited_s;
} turns_report_t;

static int say(int fd, const char *what) {
    char line[64];
    int n = snprintf(line, sizeof line, "%s %d\n", what, (int)getpid());
    return write(fd, line, (size_t)n) == n ? 0 : -1;   /* one write: O_APPEND keeps lines whole */
}

/* The child: ROUNDS turns, each logged enter / 20 ms / leave while held. Never asserts
 * (proc.h): exit codes say what failed. */
static int child_turns(void *arg, int report_fd) {
    turns_arg_t *a = arg;
    close(a->go_w);
    int log = open(a->log, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (log < 0) return 2;
    gpu_turn_t t;
    if (gpu_turn_open(&t, g_dir, 0) < 0) return 3;   /* its own open file description */
    char c;
    if (read(a->go_r, &c, 1) != 0) return 4;         /* EOF: go */
    turns_report_t r = {0};
    for (int i = 0; i < ROUNDS; i++) {
        r.waited_s += gpu_turn_take(&t, NULL);
        if (!t.held) return 5;
        if (say(log, "enter") < 0) return 6;
        usleep(HOLD_US);
        if (say(log, "leave") < 0) return 6;
        gpu_turn_give(&t);
        if (t.held) return 7;
        usleep(2000);                                /* the unit's host work between turns */
    }
    r.taken = t.taken;
    r.skipped = t.skipped;
    gpu_turn_close(&t);
    close(log);
    return proc_report(report_fd, &r, sizeof r) < 0 ? 8 : 0;
}

static void test_two_processes(void **state) {
    (void)state;
    turns_arg_t a;
    snprintf(a.log, sizeof a.log, "%s/turns.log", g_dir);
    int fd = open(a.log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    close(fd);
    int go[2];
    assert_int_equal(pipe(go), 0);
    a.go_r = go[0]; a.go_w = go[1];
    proc_t p[2];
    assert_int_equal(proc_spawn(&p[0], "turns0", child_turns, &a), 0);
    assert_int_equal(proc_spawn(&p[1], "turns1", child_turns, &a), 0);
    close(go[0]);
    close(go[1]);                                    /* go */
    turns_report_t r[2];
    double waited = 0;
    for (int k = 0; k < 2; k++) {
        int rc = proc_read(&p[k], &r[k], sizeof r[k], 30000);
        int code = -1;
        assert_int_equal(proc_wait(&p[k], 10000, &code), 0);
        if (rc < 0) fail_msg("child %d: no report (%s), exit code %d", k, dl_errmsg(), code);
        assert_int_equal(code, 0);
        assert_int_equal(r[k].taken, ROUNDS);
        assert_int_equal(r[k].skipped, 0);
        waited += r[k].waited_s;
        proc_kill(&p[k]);
    }
    /* the log: ROUNDS enter/leave pairs per child, never two enters in a row */
    FILE *f = fopen(a.log, "r");
    assert_non_null(f);
    char line[64];
    int n = 0, enters[2] = {0, 0}, switches = 0, in = 0, last = -1;
    while (fgets(line, sizeof line, f)) {
        int pid = 0;
        if (n % 2 == 0) {
            if (sscanf(line, "enter %d", &pid) != 1) fail_msg("line %d: '%s', expected an enter", n + 1, line);
            in = pid;
            for (int k = 0; k < 2; k++) if (pid == (int)p[k].pid) enters[k]++;
            if (last >= 0 && last != pid) switches++;
            last = pid;
        } else {
            /* another process's enter here is two processes on the GPU at once */
            if (sscanf(line, "leave %d", &pid) != 1 || pid != in)
                fail_msg("line %d: '%s' while pid %d holds the turn", n + 1, line, in);
        }
        n++;
    }
    fclose(f);
    assert_int_equal(n, 2 * 2 * ROUNDS);
    assert_int_equal(enters[0], ROUNDS);
    assert_int_equal(enters[1], ROUNDS);
    printf("two processes: %d turns each, %d hand-overs between them, %.3f s waited in all\n", ROUNDS,
           switches, waited);
    assert_true(waited > 0.010);   /* they did contend: the test saw exclusion, not luck */
}

/* ------------------------------------------------------------ a holder that hangs */

static void test_holder_never_gives(void **state) {
    (void)state;
    gpu_turn_t h, w;
    assert_int_equal(gpu_turn_open(&h, g_dir, 3), 0);
    assert_int_equal(gpu_turn_open(&w, g_dir, 3), 0);
    assert_true(h.fd >= 0 && w.fd >= 0);
    assert_int_equal(w.wait_max_s, GPU_TURN_WAIT_MAX_S);
    double s = gpu_turn_take(&h, NULL);
    assert_true(s >= 0 && s < 0.5);
    assert_int_equal(h.held, 1);
    assert_int_equal(h.taken, 1);
    /* a second open of the file in this process is another taker: it waits its limit */
    w.wait_max_s = 0.2;
    double t0 = clock_mono_s();
    s = gpu_turn_take(&w, NULL);
    double el = clock_mono_s() - t0;
    printf("holder never gives: the taker went on after %.3f s (took %.3f s)\n", s, el);
    assert_true(s >= 0.2);
    assert_true(el >= 0.2 && el < 3.0);
    assert_int_equal(w.held, 0);
    assert_int_equal(w.taken, 0);
    assert_int_equal(w.skipped, 1);
    assert_int_equal(w.warned, 1);
    assert_int_equal(w.hung, 1);
    /* the holder hangs: the next takes try once, without waiting; still one warning */
    s = gpu_turn_take(&w, NULL);
    assert_true(s < 0.1);
    assert_int_equal(w.held, 0);
    assert_int_equal(w.skipped, 2);
    assert_int_equal(w.warned, 1);
    gpu_turn_give(&w);                               /* not held: nothing to give */
    assert_int_equal(h.held, 1);
    /* the holder gives back: the taker gets it at once */
    gpu_turn_give(&h);
    assert_int_equal(h.held, 0);
    s = gpu_turn_take(&w, NULL);
    assert_true(s < 0.5);
    assert_int_equal(w.held, 1);
    assert_int_equal(w.taken, 1);
    assert_int_equal(w.hung, 0);                     /* back to waiting takes */
    assert_int_equal(w.warned, 0);                   /* a later hang is said again */
    /* a take while held does not take twice */
    assert_true(gpu_turn_take(&w, NULL) == 0);
    assert_int_equal(w.taken, 1);
    /* closing while held gives back */
    gpu_turn_close(&w);
    assert_int_equal(w.fd, -1);
    assert_int_equal(w.held, 0);
    h.wait_max_s = 0.2;
    s = gpu_turn_take(&h, NULL);
    assert_true(s < 0.15);
    assert_int_equal(h.held, 1);
    assert_int_equal(h.skipped, 0);
    gpu_turn_close(&h);
    gpu_turn_close(&h);                              /* harmless twice */
}

/* ------------------------------------------------------------ on an event loop */

typedef struct { gpu_turn_t *t; int calls; int ready; } loop_user_t;

static void on_ready(void *arg) {
    loop_user_t *u = arg;
    u->calls++;
    u->ready = gpu_turn_ready(u->t, NULL, NULL, NULL, NULL);   /* held or passed: 1, no loop needed */
}

/* gpu_turn_ready: the take runs on the loop's thread pool (the loop thread never waits),
 * the callback comes on the loop thread with the turn, the work is done and given back;
 * a holder that keeps it past the limit: the callback comes with passed, ready says go. */
static void test_ready_on_loop(void **state) {
    (void)state;
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    gpu_turn_t h, w;
    assert_int_equal(gpu_turn_open(&h, g_dir, 4), 0);
    assert_int_equal(gpu_turn_open(&w, g_dir, 4), 0);
    loop_user_t u = {&w, 0, 0};
    /* free: queued, then the callback with the turn held */
    assert_int_equal(gpu_turn_ready(&w, &loop, NULL, on_ready, &u), 0);
    assert_int_equal(w.pending, 1);
    assert_int_equal(gpu_turn_ready(&w, &loop, NULL, on_ready, &u), 0);   /* in flight: not queued again */
    assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(u.calls, 1);
    assert_int_equal(u.ready, 1);
    assert_int_equal(w.held, 1);
    assert_int_equal(w.pending, 0);
    gpu_turn_give(&w);
    /* another holds it: the loop thread runs a timer meanwhile; the callback after the limit */
    assert_true(gpu_turn_take(&h, NULL) < 0.5);
    w.wait_max_s = 0.2;
    u.calls = 0;
    double t0 = clock_mono_s();
    assert_int_equal(gpu_turn_ready(&w, &loop, NULL, on_ready, &u), 0);
    assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
    double el = clock_mono_s() - t0;
    assert_int_equal(u.calls, 1);
    assert_int_equal(u.ready, 1);                    /* passed: go on without it */
    assert_int_equal(w.held, 0);
    assert_int_equal(w.passed, 1);
    assert_true(w.last_wait_s >= 0.2 && el >= 0.2 && el < 3.0);
    gpu_turn_give(&w);                               /* ends passed */
    assert_int_equal(w.passed, 0);
    gpu_turn_close(&h);
    /* off: ready at once, nothing queued */
    gpu_turn_t off;
    gpu_turn_init(&off);
    assert_int_equal(gpu_turn_ready(&off, &loop, NULL, on_ready, &u), 1);
    assert_int_equal(off.pending, 0);
    gpu_turn_close(&w);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* ------------------------------------------------------------ stopping */

typedef struct { int *flag; useconds_t after_us; } stopper_t;

static void *stop_later(void *arg) {
    stopper_t *s = arg;
    usleep(s->after_us);
    __atomic_store_n(s->flag, 1, __ATOMIC_RELAXED);
    return NULL;
}

static void test_stopping(void **state) {
    (void)state;
    gpu_turn_t h, w;
    assert_int_equal(gpu_turn_open(&h, g_dir, 0), 0);
    assert_int_equal(gpu_turn_open(&w, g_dir, 0), 0);
    assert_true(gpu_turn_take(&h, NULL) < 0.5);
    assert_int_equal(h.held, 1);
    /* stopping already set: back at once, without the turn and without the warning */
    int stopping = 1;
    double t0 = clock_mono_s();
    double s = gpu_turn_take(&w, &stopping);
    assert_true(clock_mono_s() - t0 < 0.5);
    assert_true(s < 0.5);
    assert_int_equal(w.held, 0);
    assert_int_equal(w.taken, 0);
    assert_int_equal(w.skipped, 1);
    assert_int_equal(w.warned, 0);
    /* stopping set during the wait (the loop thread): back within a few polls */
    stopping = 0;
    stopper_t st = {.flag = &stopping, .after_us = 100000};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, stop_later, &st), 0);
    t0 = clock_mono_s();
    s = gpu_turn_take(&w, &stopping);
    double el = clock_mono_s() - t0;
    assert_int_equal(pthread_join(th, NULL), 0);
    printf("stopping: set after 0.1 s of waiting, the taker went on after %.3f s\n", el);
    assert_true(el >= 0.09 && el < 2.0);
    assert_int_equal(w.held, 0);
    assert_int_equal(w.skipped, 2);
    assert_int_equal(w.warned, 0);
    /* a free turn is taken even while stopping (the flock is tried first) */
    gpu_turn_give(&h);
    s = gpu_turn_take(&w, &stopping);
    assert_true(s < 0.5);
    assert_int_equal(w.held, 1);
    assert_int_equal(w.taken, 1);
    gpu_turn_close(&w);
    gpu_turn_close(&h);
}

/* ------------------------------------------------------------ a holder killed */

/* The child: takes the turn, says so, then holds it until killed. */
static int child_hold(void *arg, int report_fd) {
    (void)arg;
    gpu_turn_t t;
    if (gpu_turn_open(&t, g_dir, 1) < 0) return 2;
    gpu_turn_take(&t, NULL);
    if (!t.held) return 3;
    char c = 'H';
    if (proc_report(report_fd, &c, 1) < 0) return 4;
    for (;;) pause();
}

/* Starts child fn (reporting 'H' once it holds the turn) as *p and waits for that. */
static void spawn_holding(proc_t *p, const char *name, int (*fn)(void *, int)) {
    assert_int_equal(proc_spawn(p, name, fn, NULL), 0);
    char c = 0;
    if (proc_read(p, &c, 1, 10000) < 0) fail_msg("%s did not take the turn: %s", name, dl_errmsg());
    assert_int_equal(c, 'H');
}

static void test_holder_killed(void **state) {
    (void)state;
    proc_t p;
    spawn_holding(&p, "holder", child_hold);
    gpu_turn_t w;                                    /* opened after the fork: not the child's */
    assert_int_equal(gpu_turn_open(&w, g_dir, 1), 0);
    w.wait_max_s = 0.1;
    double s = gpu_turn_take(&w, NULL);              /* the child really holds it */
    assert_true(s >= 0.1);
    assert_int_equal(w.held, 0);
    assert_int_equal(w.skipped, 1);
    assert_int_equal(proc_signal(&p, SIGKILL), 0);
    int code = -1;
    assert_int_equal(proc_wait(&p, 10000, &code), 0);
    assert_int_equal(code, 128 + SIGKILL);
    proc_kill(&p);
    /* the kernel dropped the dead holder's lock: the turn is free at once */
    w.wait_max_s = 5.0;
    s = gpu_turn_take(&w, NULL);
    printf("holder killed: the turn taken %.6f s after the reap\n", s);
    assert_true(s < 0.5);
    assert_int_equal(w.held, 1);
    assert_int_equal(w.taken, 1);
    assert_int_equal(w.skipped, 1);
    gpu_turn_close(&w);
}

/* Child: takes the turn, holds it HOLD_US, gives it back and wants it again at once,
 * for ever (reports 'H' after the first take). */
static int child_greedy(void *arg, int report_fd) {
    (void)arg;
    gpu_turn_t t;
    if (gpu_turn_open(&t, g_dir, 2) < 0) return 2;
    for (int i = 0;; i++) {
        gpu_turn_take(&t, NULL);
        if (!t.held) return 3;
        if (i == 0) {
            char c = 'H';
            if (proc_report(report_fd, &c, 1) < 0) return 4;
        }
        usleep(HOLD_US);
        gpu_turn_give(&t);
    }
}

/* Fairness: a holder that gives the turn back and takes it again at once does not keep
 * it from a waiter (it finds the waiter in gpu<N>.want and yields): the waiter gets the
 * turn within about one hold, not after its wait limit. */
static void test_fair(void **state) {
    (void)state;
    proc_t p;
    spawn_holding(&p, "greedy", child_greedy);
    gpu_turn_t w;
    assert_int_equal(gpu_turn_open(&w, g_dir, 2), 0);
    w.wait_max_s = 3.0;
    for (int round = 0; round < 5; round++) {
        double s = gpu_turn_take(&w, NULL);
        printf("fair: round %d, the turn after %.4f s (holds of %.3f s)\n", round, s, HOLD_US / 1e6);
        assert_int_equal(w.held, 1);                  /* not the limit: the child yielded */
        assert_true(s < 10 * HOLD_US / 1e6);
        usleep(HOLD_US);
        gpu_turn_give(&w);
        usleep(5 * HOLD_US);                          /* the child has it again meanwhile */
    }
    assert_int_equal(w.skipped, 0);
    assert_int_equal(proc_signal(&p, SIGKILL), 0);
    int code = -1;
    assert_int_equal(proc_wait(&p, 10000, &code), 0);
    proc_kill(&p);
    gpu_turn_close(&w);
}

/* ------------------------------------------------------------ off, open errors */

static void test_off(void **state) {
    (void)state;
    gpu_turn_t t;
    memset(&t, 0x5a, sizeof t);
    gpu_turn_init(&t);
    assert_int_equal(t.fd, -1);
    assert_int_equal(t.held, 0);
    assert_int_equal(t.taken, 0);
    assert_int_equal(t.skipped, 0);
    assert_true(t.wait_max_s == GPU_TURN_WAIT_MAX_S);
    int stopping = 1;
    assert_true(gpu_turn_take(&t, NULL) == 0);
    assert_true(gpu_turn_take(&t, &stopping) == 0);
    assert_int_equal(t.held, 0);
    assert_int_equal(t.taken, 0);
    assert_int_equal(t.skipped, 0);
    gpu_turn_give(&t);
    gpu_turn_close(&t);
    gpu_turn_close(&t);
    assert_int_equal(t.fd, -1);
}

static void test_open_errors(void **state) {
    (void)state;
    char dir[128], want[160];
    snprintf(dir, sizeof dir, "%s/no/such/dir", g_dir);
    snprintf(want, sizeof want, "%s/gpu2.turn", dir);
    gpu_turn_t t;
    assert_int_equal(gpu_turn_open(&t, dir, 2), DL_EIO);
    if (!strstr(dl_errmsg(), want)) fail_msg("error '%s' does not name '%s'", dl_errmsg(), want);
    assert_non_null(strstr(dl_errmsg(), "No such file or directory"));
    assert_int_equal(t.fd, -1);
    assert_true(gpu_turn_take(&t, NULL) == 0);       /* off */
    gpu_turn_close(&t);
    /* the file is created 0600 (no group / other bits whatever the umask) */
    assert_int_equal(gpu_turn_open(&t, g_dir, 7), 0);
    snprintf(want, sizeof want, "%s/gpu7.turn", g_dir);
    assert_string_equal(t.path, want);
    struct stat sb;
    assert_int_equal(stat(want, &sb), 0);
    assert_int_equal(sb.st_mode & 077, 0);
    gpu_turn_close(&t);
}

/* ------------------------------------------------------------ setup */

/* One target and one drafter on one host. */
static void pair(run_config_t *c, int target_gpu, int drafter_gpu) {
    runcfg_init(c);
    c->n_targets = 1; c->n_drafters = 1;
    c->target_gpu[0] = target_gpu; c->drafter_gpu[0] = drafter_gpu;
}

static void expect_setup(const run_config_t *c, uint32_t id, int on) {
    char path[128];
    snprintf(path, sizeof path, "%s/gpu%d.turn", g_dir, runcfg_stage_gpu(c, id));
    unlink(path);
    gpu_turn_t t;
    memset(&t, 0x5a, sizeof t);
    assert_int_equal(gpu_turn_setup(&t, c, id, g_dir), 0);
    if (on) {
        assert_true(t.fd >= 0);
        assert_string_equal(t.path, path);
        assert_true(file_exists(path));
        assert_int_equal(t.held, 0);
        assert_true(gpu_turn_take(&t, NULL) < 0.5);  /* a working turn */
        assert_int_equal(t.held, 1);
    } else {
        assert_int_equal(t.fd, -1);
        assert_false(file_exists(path));
        assert_true(gpu_turn_take(&t, NULL) == 0);
        assert_int_equal(t.taken, 0);
    }
    gpu_turn_close(&t);
}

static void test_setup(void **state) {
    (void)state;
    static run_config_t c;
    unsetenv("CUDA_MPS_PIPE_DIRECTORY");             /* the caller's, put back by teardown */

    /* target 0 and drafter 0 on GPU 0: both take turns, on <dir>/gpu0.turn */
    pair(&c, 0, 0);
    assert_int_equal(c.gpu_turns, 1);
    expect_setup(&c, PIPE_ID_TARGET0, 1);
    expect_setup(&c, PIPE_ID_DRAFTER0, 1);
    /* both at once: the target's and the drafter's turns exclude each other */
    gpu_turn_t tt, dt;
    assert_int_equal(gpu_turn_setup(&tt, &c, PIPE_ID_TARGET0, g_dir), 0);
    assert_int_equal(gpu_turn_setup(&dt, &c, PIPE_ID_DRAFTER0, g_dir), 0);
    assert_true(gpu_turn_take(&tt, NULL) < 0.5);
    dt.wait_max_s = 0.05;
    assert_true(gpu_turn_take(&dt, NULL) >= 0.05);
    assert_int_equal(dt.held, 0);
    gpu_turn_close(&tt);
    gpu_turn_close(&dt);
    /* on a GPU other than 0: the file is named by it */
    pair(&c, 5, 5);
    expect_setup(&c, PIPE_ID_DRAFTER0, 1);
    /* --gpu-turns off */
    pair(&c, 0, 0);
    c.gpu_turns = 0;
    expect_setup(&c, PIPE_ID_TARGET0, 0);
    expect_setup(&c, PIPE_ID_DRAFTER0, 0);
    /* a CUDA MPS server: side by side, no turns */
    pair(&c, 0, 0);
    assert_int_equal(setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps", 1), 0);
    expect_setup(&c, PIPE_ID_TARGET0, 0);
    expect_setup(&c, PIPE_ID_DRAFTER0, 0);
    assert_int_equal(setenv("CUDA_MPS_PIPE_DIRECTORY", "", 1), 0);   /* set but empty: no server */
    expect_setup(&c, PIPE_ID_TARGET0, 1);
    unsetenv("CUDA_MPS_PIPE_DIRECTORY");
    /* each on its own GPU: turns too (uncontended), so a live rebalance that brings
     * stages together finds them taking turns */
    pair(&c, 0, 1);
    expect_setup(&c, PIPE_ID_TARGET0, 1);
    expect_setup(&c, PIPE_ID_DRAFTER0, 1);
    /* CPU stages */
    pair(&c, -1, -1);
    assert_int_equal(gpu_turn_setup(&tt, &c, PIPE_ID_TARGET0, g_dir), 0);
    assert_int_equal(tt.fd, -1);
    /* the optimizer on a GPU: turns as the others (gpu_turn_ready on its loop), off with
     * --gpu-turns off, under MPS, or on the CPU */
    pair(&c, 1, 0);
    c.optimizer_gpu = 0;
    expect_setup(&c, PIPE_ID_OPTIMIZER, 1);
    c.gpu_turns = 0;
    expect_setup(&c, PIPE_ID_OPTIMIZER, 0);
    c.gpu_turns = 1;
    assert_int_equal(setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps", 1), 0);
    expect_setup(&c, PIPE_ID_OPTIMIZER, 0);
    unsetenv("CUDA_MPS_PIPE_DIRECTORY");
    c.optimizer_gpu = -1;
    assert_int_equal(gpu_turn_setup(&tt, &c, PIPE_ID_OPTIMIZER, g_dir), 0);
    assert_int_equal(tt.fd, -1);
    /* GPU 0 of two nodes is two GPUs */
    pair(&c, 0, 0);
    c.net_port = 29500;
    c.n_nodes = 2;
    snprintf(c.node_addr[0], sizeof c.node_addr[0], "10.0.0.1");
    snprintf(c.node_addr[1], sizeof c.node_addr[1], "10.0.0.2");
    c.target_node[0] = 0; c.drafter_node[0] = 1;
    assert_int_equal(runcfg_gpu_sharers(&c, PIPE_ID_TARGET0), 0);   /* each alone on its node's GPU 0 */
    expect_setup(&c, PIPE_ID_TARGET0, 1);
    c.drafter_node[0] = 0;                           /* now on one node */
    assert_int_equal(runcfg_gpu_sharers(&c, PIPE_ID_TARGET0), 1);
    /* a shared GPU and a run dir that cannot hold the file: the open's error, t off */
    pair(&c, 0, 0);
    char bad[128];
    snprintf(bad, sizeof bad, "%s/missing", g_dir);
    assert_int_equal(gpu_turn_setup(&tt, &c, PIPE_ID_TARGET0, bad), DL_EIO);
    assert_non_null(strstr(dl_errmsg(), "/missing/gpu0.turn"));
    assert_int_equal(tt.fd, -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_two_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_holder_never_gives, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stopping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_holder_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fair, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ready_on_loop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_off, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_setup, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
