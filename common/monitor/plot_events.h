/* The events `draftline plot` marks on its curves, read from a run's metrics.jsonl and
 * steps: eval results (τ), stage restarts, resumes, rebalances, the end of the lr
 * warm-up and checkpoints. */
#ifndef DL_MONITOR_PLOT_EVENTS_H
#define DL_MONITOR_PLOT_EVENTS_H

#include "common/monitor/run.h"

#define MON_PLOT_MAX_MARKS 48

typedef enum { MON_MARK_TAU, MON_MARK_LR, MON_MARK_RESTART, MON_MARK_RESUME, MON_MARK_REBALANCE,
               MON_MARK_CKPT } mon_mark_kind_t;

typedef struct {
    double step;                /* x: the step (as steps.jsonl numbers them) */
    mon_mark_kind_t kind;
    char label[48];             /* "τ 2.31", "lr peak 3e-03", "restart drafter0", ... */
} mon_plot_mark_t;

/* Fills marks[MON_PLOT_MAX_MARKS] for run (its dir's metrics.jsonl, and run->steps for
 * the lr peak); returns how many (0 when the file is missing). Reading it:
 *  - eval line {"stage":"eval","step":S,"tau":x}: τ of checkpoint step_S, at step S - 1
 *    (the last step it holds);
 *  - a stage's incarnation going up: "restart <stage>"; going down (a new supervisor
 *    on the same dir: run --resume): one "resume" mark;
 *  - a stage name first seen after the first step, not after a resume: "rebalance";
 *  - lr rising over the first steps to a peak before the last step: "lr peak" there
 *    (the end of the warm-up);
 *  - steps.jsonl's checkpoint fields ("ckpt_step":S, ckpt_waited_s, ckpt_snapshot_s,
 *    ckpt_write_s): "ckpt S held X s" at step S - 1, X the time no step was applied
 *    (waited + snapshot: the dip in tokens/s there), the write ran beside the steps.
 * Each at the last optimizer step seen before the line; marks of one kind at one step
 * are merged, and past MON_PLOT_MAX_MARKS the rest are left out. */
int mon_plot_events(const mon_run_t *run, mon_plot_mark_t *marks);

#endif
