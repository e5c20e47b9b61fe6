/* GPU turns: stages (separate processes) that share one GPU without CUDA MPS take
 * turns on it instead of leaving it to the driver's time-slicing.
 *
 * Why: under time-slicing the GPU switches between the processes' contexts every few
 * milliseconds while both have work, and each switch costs (the context switch, the L2
 * the other left). On one H200 a target (8B forward, ~0.8 s) and a drafter (step,
 * ~1.1 s) time-sliced took 0.1-0.2 s a step more than the two alone (bench/NOTES.md).
 * With turns, a stage holds the GPU for one unit of work (the target's forward of a
 * micro-batch, the drafter's forward + backward of one) and gives it back when that
 * work is done on the GPU (after its stream sync), so each unit runs alone.
 *
 * How: an exclusive flock(2) on one file per GPU and host (<run dir>/gpu<N>.turn).
 * The kernel drops it when its holder exits or is killed, so a crashed stage never
 * blocks the others. A stage waiting for the turn holds <run dir>/gpu<N>.want shared;
 * a stage that finds someone waiting there lets them go first (GPU_TURN_YIELD_US), so
 * a stage that gives the turn back and wants it again at once does not take it again
 * and again while the other waits. Turns are a scheduling aid, never a dependency of
 * correctness: a stage that waits longer than its limit (a holder that hangs), or is
 * stopping, goes on without the turn (the limit warned once), as it would without turns.
 *
 * Only a stage's worker thread takes a turn (never the event loop: heartbeats go on
 * while it waits). Not thread-safe: one taker per gpu_turn_t.
 */
#ifndef DL_PIPE_GPUTURN_H
#define DL_PIPE_GPUTURN_H

#include "common/pipe/runcfg.h"

#include <stddef.h>
#include <stdint.h>

#define GPU_TURN_WAIT_MAX_S 60.0   /* longer than any one unit of work: a holder hangs */
#define GPU_TURN_NAP_MIN_US 50     /* a waiter polls the turn after 50 us, then 100, ... */
#define GPU_TURN_NAP_MAX_US 1000   /* ... at most every 1 ms: a hand-over costs at most that */
#define GPU_TURN_YIELD_US 2000     /* > NAP_MAX: a waiter polls before the yielding stage */
#define GPU_TURN_OPT_WAIT_S 1.5    /* the optimizer's limit (gpu_turn_setup) */

typedef struct gpu_turn {
    int fd;                /* the open turn file; -1 = turns off (take / give do nothing) */
    int want_fd;           /* the open waiters' file (-1 when off) */
    int held;              /* 1 between a take that got the turn and its give */
    int warned;            /* the go-on-without warning was logged */
    int quiet_limit;       /* 1: going on at wait_max_s is expected (the optimizer): not warned */
    double wait_max_s;     /* GPU_TURN_WAIT_MAX_S unless a test sets it */
    uint64_t taken;        /* turns taken */
    uint64_t skipped;      /* takes that went on without the turn (limit or stop) */
    char path[4200];
} gpu_turn_t;

/* Turns off: take and give do nothing (t->fd = -1). */
void gpu_turn_init(gpu_turn_t *t);

/* Opens (creating, 0600) the files of GPU `gpu` in dir: "<dir>/gpu<gpu>.turn" and
 * "<dir>/gpu<gpu>.want" (t is initialised here: it must not be open already). Returns 0, or
 * DL_ERANGE (the paths do not fit t->path) / DL_EIO (open failed; errno's text and
 * the path in the message) with t off. */
int gpu_turn_open(gpu_turn_t *t, const char *dir, int gpu);

/* Waits for the GPU's turn: polls flock LOCK_EX|LOCK_NB, first after
 * GPU_TURN_NAP_MIN_US, backing off to GPU_TURN_NAP_MAX_US, and first yields
 * GPU_TURN_YIELD_US when another stage is waiting (gputurn.h: fairness). Returns the
 * seconds waited (>= 0). Goes on without the turn (t->skipped counts it; t->held stays
 * 0) when *stopping is non-zero at a poll (read atomically; stopping may be NULL), after
 * t->wait_max_s (logged once per gpu_turn_t at WARN, naming the path), or when flock
 * fails otherwise (logged once). Off (fd -1) or already held: returns 0 at once. */
double gpu_turn_take(gpu_turn_t *t, const int *stopping);

/* Gives the turn back (flock LOCK_UN) if this taker holds it; call after the unit's
 * GPU work is done (its stream synchronised). */
void gpu_turn_give(gpu_turn_t *t);

/* The turns of stage stage_id (a target, a drafter or the optimizer) under its run
 * configuration c: opens "<run_dir>/gpu<N>.turn" (run_dir: the stage's run dir on this
 * host) when c->gpu_turns is 1, the stage is on GPU N, the GPU is shared (a target or
 * drafter: another target or drafter of c runs on GPU N of its node, runcfg_gpu_sharers;
 * the optimizer: two or more of them do, so they take turns) and no CUDA MPS server is
 * set for it (CUDA_MPS_PIPE_DIRECTORY: there the stages run side by side). The
 * optimizer's step is short and ends a step: it waits at most GPU_TURN_OPT_WAIT_S for
 * the turn (on its event loop: well under PIPE_DEAD_MS), then goes on without it,
 * quietly (quiet_limit). Logs the choice at INFO when the GPU is shared. Returns 0 (t on or off), or the open's error with t
 * off (logged by the caller: the stage then time-slices, as with --gpu-turns off). */
int gpu_turn_setup(gpu_turn_t *t, const run_config_t *c, uint32_t stage_id, const char *run_dir);

/* Gives back and closes; t is off after it. */
void gpu_turn_close(gpu_turn_t *t);

#endif
