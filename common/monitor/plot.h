/* `draftline plot`: loss, per-position accuracy and target tokens/s over steps of a
 * run, drawn with cairo into one PNG of three stacked panels (axes, ticks, labels,
 * legend). */
#ifndef DL_MONITOR_PLOT_H
#define DL_MONITOR_PLOT_H

#include "common/monitor/run.h"

typedef enum { MON_PLOT_LOSS_AUTO = 0, MON_PLOT_LOSS_LOG, MON_PLOT_LOSS_LINEAR } mon_plot_loss_scale_t;

typedef struct {
    int width, height;          /* pixels (default 1200 x 1350) */
    const char *title;          /* NULL: "draftline run <dir>" */
    double ema;                 /* smoothing of the bold lines, 0..1 (default: 1 - 5/steps,
                                   clamped to [0.5, 0.95]) */
    mon_plot_loss_scale_t loss_scale;   /* auto: log when the loss after the warm-up spans
                                           more than a factor 2 */
} mon_plot_opts_t;

/* The plotted columns, n points each (the applied steps, in step order); owned, freed
 * by mon_plot_cols_free. */
typedef struct {
    int n;
    int warm;                   /* warm-up points: no loss EMA there, and left out of the
                                   loss axis's range (they may lie above it) */
    double *x;                  /* the step, as steps.jsonl numbers it (from 0) */
    double *loss, *loss_ema;    /* loss_ema: NaN over the warm-up, then a debiased EMA */
    double *tps, *tps_ema;      /* target tokens/s over the last w steps (w = n / 60, at least 1),
                                   NaN where those w steps are not all there (a restart, a gap)
                                   and at the last step (its interval holds the final checkpoint) */
    double *accm, *acc[4];      /* mean, positions 1, 2, 3 and the last one present */
    int last_pos;
    double *buf_;
} mon_plot_cols_t;

/* Fills c from run->steps (which merges steps.jsonl and the optimizer's step lines of
 * metrics.jsonl); ema in (0, 1). The warm-up is min(n / 20 + 1, 50) points, so the
 * outliers of the first steps neither start the EMA nor set the axis. Returns 0,
 * DL_ENOENT (no step), DL_ENOMEM. */
int mon_plot_cols(const mon_run_t *run, double ema, mon_plot_cols_t *c);
void mon_plot_cols_free(mon_plot_cols_t *c);

/* Draws the three panels (from mon_plot_cols):
 *   loss: raw per step and its EMA, on a log axis (see loss_scale) over the range after
 *     the warm-up;
 *   accuracy: mean over block positions and positions 1, 2, 3 and the last one present;
 *   tokens/s: over windows of steps (complete windows only) and its EMA;
 * with the events of plot_events.h (τ, lr peak, restarts, resumes, rebalances) as
 * vertical marks on every panel, labelled on the top one.
 * Writes <path>.tmp then renames it to path. o may be NULL (defaults). Returns 0,
 * DL_ENOENT (no step in the run), DL_EIO (cairo failed: the detail has cairo's
 * status string), DL_EINVAL (size). */
int mon_plot_png(const mon_run_t *run, const char *path, const mon_plot_opts_t *o);

#endif
