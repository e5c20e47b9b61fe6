/* The monitor's text snapshot of a run: the lines `draftline monitor --once` prints
 * and the TUI draws (header, training progress and ETA, per-position accuracy, the
 * bottleneck line, one row per stage with its throughput, phase shares and stall
 * diagnosis, the drafters' inbox fill per tier, GPUs). */
#ifndef DL_MONITOR_REPORT_H
#define DL_MONITOR_REPORT_H

#include "common/monitor/diag.h"
#include "common/monitor/nvml.h"
#include "common/monitor/run.h"

typedef struct {
    double now;                 /* wall seconds the run is seen at (see mon_report_now) */
    double wall;                /* the real wall clock, for the "last metrics ... ago" line */
    mon_diag_opts_t diag;
    mon_topo_t topo;            /* max_steps (0 unknown) and the GPU lists for suggestions */
    const mon_gpu_t *gpus;      /* NULL: NVML absent ("n/a") */
    int n_gpus;
    const char *nvml_why;       /* why there are no GPU figures, if gpus is NULL */
    int cols;                   /* a terminal's width: no line wider (a stage row's diagnosis
                                 * on its own line, long lines wrapped, nothing cut);
                                 * 0: a file or pipe, lines as long as they are */
} mon_report_opts_t;

/* The time to judge a run at: the wall clock while the run is live (metrics newer than
 * live_s), else the newest metrics' ts (a finished or dead run is shown as it was at
 * its end, not as 'everything silent'). */
double mon_report_now(const mon_run_t *run, double wall, double live_s);

/* Renders the snapshot into a malloc'd string of '\n'-terminated lines (*text; the
 * caller frees). Rows: the stages of o->topo (run.json), not names only an earlier run
 * of the same dir left in metrics.jsonl. The BUSY, WAIT-IN, WAIT-CR and WAIT-GPU
 * (--gpu-turns: waiting for the GPU's turn) percents of a row are mon_diag_t's four
 * shares, rounded to add up to at most 100 (to 100 when the shares fill the window). A
 * CPU run (o->topo.cpu_run) has no GPU tier column and no GPU section. Returns 0 or
 * DL_ENOMEM. */
int mon_report(const mon_run_t *run, const mon_report_opts_t *o, char **text);

#endif
