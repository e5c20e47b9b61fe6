/* `draftline plot`: loss, per-position accuracy and target tokens/s over steps of a
 * run, drawn with cairo into one PNG of three stacked panels (axes, ticks, labels,
 * legend). */
#ifndef DL_MONITOR_PLOT_H
#define DL_MONITOR_PLOT_H

#include "common/monitor/run.h"

typedef struct {
    int width, height;          /* pixels (default 1200 x 1350) */
    const char *title;          /* NULL: "draftline run <dir>" */
    double ema;                 /* smoothing of the bold lines, 0..1 (default: 1 - 5/steps,
                                   clamped to [0.5, 0.95]) */
} mon_plot_opts_t;

/* Series drawn (from run->steps, which merges steps.jsonl and the optimizer's step
 * lines of metrics.jsonl):
 *   loss: raw per step and its EMA (log scale when max/min > 20);
 *   accuracy: mean over block positions and positions 1, 2, 3 and the last one
 *     present (acc_k from the metrics step lines);
 *   tokens/s: d(tokens)/d(t) between consecutive steps and its EMA (t: seconds since
 *     the optimizer's first step; pairs across an optimizer restart are skipped).
 * Writes <path>.tmp then renames it to path. o may be NULL (defaults). Returns 0,
 * DL_ENOENT (no step in the run), DL_EIO (cairo failed: the detail has cairo's
 * status string), DL_EINVAL (size). */
int mon_plot_png(const mon_run_t *run, const char *path, const mon_plot_opts_t *o);

#endif
