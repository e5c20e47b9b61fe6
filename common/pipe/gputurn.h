/* GPU turns: stages (separate processes) that share one GPU without CUDA MPS take
 * turns on it instead of leaving it to the driver's time-slicing.
 *
 * Why: under time-slicing the GPU switches between the processes' contexts every few
 * milliseconds while both have work, and each switch costs (the context switch, the L2
 * the other left). On one H200 a target (8B forward, ~0.8 s) and a drafter (step,
 * ~1.1 s) time-sliced took 0.1-0.2 s a step more than the two alone (bench/NOTES.md).
 * With turns, a stage holds the GPU for one unit of work (a target's forward of a
 * micro-batch, a drafter's forward + backward of one, the optimizer's step) and gives
 * it back when that work is done on the GPU (after its stream sync), so each unit runs
 * alone. Work outside the units (a drafter's weight copy on its loop, checkpoint
 * snapshots, NCCL sends) is not in a turn and time-slices as before.
 *
 * How: an exclusive flock(2) on one file per GPU and host (<run dir>/gpu<N>.turn).
 * The kernel drops it when its holder exits or is killed, so a crashed stage never
 * blocks the others. A stage waiting for the turn holds <run dir>/gpu<N>.want shared;
 * a stage that finds someone waiting there lets them go first (GPU_TURN_YIELD_US), so
 * a stage that gives the turn back and wants it again at once does not take it again
 * and again while the other waits. Turns are a scheduling aid, never a dependency of
 * correctness: a stage that waits longer than its limit (a holder that hangs: warned
 * once; from then on each take tries once, without waiting, until one gets the turn
 * again), or is stopping, goes on without the turn, as it would without turns.
 *
 * A stage takes turns on its worker thread (gpu_turn_take), or, where its GPU work runs
 * on its event loop (the optimizer), through gpu_turn_ready, which waits on the loop's
 * thread pool: never on the loop thread, so heartbeats go on while it waits. One taker
 * per gpu_turn_t (its take and its give may be on different threads when one hands
 * over to the other through libuv).
 */
#ifndef DL_PIPE_GPUTURN_H
#define DL_PIPE_GPUTURN_H

#include "common/pipe/runcfg.h"

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define GPU_TURN_WAIT_MAX_S 60.0   /* longer than any one unit of work: a holder hangs */
#define GPU_TURN_NAP_MIN_US 50     /* a waiter polls the turn after 50 us, then 100, ... */
#define GPU_TURN_NAP_MAX_US 1000   /* ... at most every 1 ms: a hand-over costs at most that */
#define GPU_TURN_YIELD_US 2000     /* > NAP_MAX: a waiter polls before the yielding stage */

typedef void (*gpu_turn_cb)(void *arg);

typedef struct gpu_turn {
    int fd;                /* the open turn file; -1 = turns off (take / give do nothing) */
    int want_fd;           /* the open waiters' file (-1 when off) */
    int held;              /* 1 between a take that got the turn and its give */
    int passed;            /* gpu_turn_ready: the last take went on without the turn */
    int hung;              /* a take reached wait_max_s: later takes try once, no wait */
    int warned;            /* the go-on-without warning was logged */
    double wait_max_s;     /* GPU_TURN_WAIT_MAX_S unless a test sets it */
    uint64_t taken;        /* turns taken */
    uint64_t skipped;      /* takes that went on without the turn (limit, stop, hung) */
    /* gpu_turn_ready's take on the thread pool */
    uv_work_t req;
    int pending;           /* a take is in flight */
    const int *stopping;
    gpu_turn_cb cb;
    void *cb_arg;
    double last_wait_s;    /* its wait, seconds */
    char path[4200];
} gpu_turn_t;

/* Turns off: take and give do nothing (t->fd = -1). */
void gpu_turn_init(gpu_turn_t *t);

/* Opens (creating, 0600) the files of GPU `gpu` in dir: "<dir>/gpu<gpu>.turn" and
 * "<dir>/gpu<gpu>.want" (t is initialised here: it must not be open already). Returns
 * 0, or DL_ERANGE (the paths do not fit t->path) / DL_EIO (open failed; errno's text
 * and the path in the message) with t off. */
int gpu_turn_open(gpu_turn_t *t, const char *dir, int gpu);

/* Waits for the GPU's turn: polls flock LOCK_EX|LOCK_NB, first after
 * GPU_TURN_NAP_MIN_US, backing off to GPU_TURN_NAP_MAX_US, and first yields
 * GPU_TURN_YIELD_US when another stage is waiting (fairness, above). Returns the
 * seconds waited (>= 0). Goes on without the turn (t->skipped counts it; t->held stays
 * 0) when *stopping is non-zero at a poll (read atomically; stopping may be NULL), after
 * t->wait_max_s (logged at WARN, naming the path; t->hung: the next takes try once
 * without waiting until one gets it, and a later hang is logged again), or when flock
 * fails otherwise (logged once). Off (fd -1) or already held: returns 0 at once. */
double gpu_turn_take(gpu_turn_t *t, const int *stopping);

/* For GPU work on an event loop: 1 when it may run now (turns off, the turn held, or
 * the last take went on without it: t->passed), else 0 after queuing gpu_turn_take on
 * loop's thread pool (once: a take in flight is not queued again); cb(arg) then runs on
 * the loop thread when the take returns (held or passed), t->last_wait_s its wait, and
 * cb calls gpu_turn_ready again. The caller gives the turn with gpu_turn_give after the
 * work, or when it does not run the work after all. uv_queue_work failing: 1 (goes on
 * without). */
int gpu_turn_ready(gpu_turn_t *t, uv_loop_t *loop, const int *stopping, gpu_turn_cb cb, void *arg);

/* Gives the turn back (flock LOCK_UN) if this taker holds it, and ends t->passed; call
 * after the unit's GPU work is done (its stream synchronised). */
void gpu_turn_give(gpu_turn_t *t);

/* For a log line: " (after W s waiting for the GPU's turn)" with W = waited (seconds), written
 * into buf (n bytes; 64 hold it) and returned, when t takes turns; "" (a literal, buf
 * untouched) when turns are off. */
const char *gpu_turn_waited(const gpu_turn_t *t, double waited, char *buf, size_t n);

/* The turns of stage stage_id (a target, a drafter or the optimizer) under its run
 * configuration c: opens "<run_dir>/gpu<N>.turn" (run_dir: the stage's run dir on this
 * host) when c->gpu_turns is 1, the stage is on GPU N and no CUDA MPS server is set for
 * it (CUDA_MPS_PIPE_DIRECTORY: there the stages run side by side). Every GPU stage
 * takes turns then, alone on its GPU or not (an uncontended turn costs microseconds),
 * so a live rebalance that brings stages together finds them taking turns. Logs at INFO
 * when another target or drafter of c shares the GPU on its node (runcfg_gpu_sharers).
 * Returns 0 (t on or off), or the open's error with t off (logged by the caller: the
 * stage then time-slices, as with --gpu-turns off). Test hook gpu_turns.cpu=1: CPU
 * stages take turns as if on GPU 0 (the pipeline's turn-taking tested without a GPU). */
int gpu_turn_setup(gpu_turn_t *t, const run_config_t *c, uint32_t stage_id, const char *run_dir);

/* Gives back and closes; t is off after it. No take may be in flight (gpu_turn_ready:
 * the loop has run it out). */
void gpu_turn_close(gpu_turn_t *t);

#endif
