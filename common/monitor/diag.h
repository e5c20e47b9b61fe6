/* Stall diagnosis and bottleneck analysis: pure functions of a stage's recent
 * metrics (no clocks, no files), so they are tested on synthetic streams.
 *
 * Per stage, over a window of its samples (default the last 10 s):
 *   share_in     = d(wait_input_s) / dt      time waiting for input
 *   share_credit = d(wait_credit_s) / dt     time waiting for credit (slot grants,
 *                                            work requests downstream)
 *   share_busy   = d(copy_s + forward_s + backward_s + step_s) / dt
 *   share_gpu    = d(wait_gpu_s) / dt        time waiting for its GPU's turn (--gpu-turns)
 * Stages add a phase's time when the phase ends, so the part of the window not yet
 * accounted (1 - the four shares) is the phase the stage is in now, which its
 * state says: idle -> waiting for input (the loader: for work requests, i.e.
 * credit), blocked -> waiting for credit, running -> busy (a wait for the GPU's turn
 * in progress is counted busy until it ends). When the four add up to more than 1 (a
 * phase that began before the window ended inside it), they are scaled down together:
 * the shares always add up to at most 1. The diagnosis's "why" of an OK stage names a
 * share_gpu of 5 % or more.
 *
 * Diagnosis (DESIGN.md section 6):
 *   stopping/exited/retired/starting    -> STOPPED / STARTING
 *   no sample for silent_s (5 s; starting: max(silent_s, stall_s)) -> SILENT (frozen, hung or gone)
 *   no progress for stall_s:
 *     waiting for input now or share_in >= wait_share          -> STARVED
 *     waiting for credit now or share_credit >= wait_share     -> BACKPRESSURED
 *     neither                                                  -> STUCK
 *   progressing: share_in >= wait_share -> STARVED, share_credit >= wait_share ->
 *     BACKPRESSURED, else OK.
 */
#ifndef DL_MONITOR_DIAG_H
#define DL_MONITOR_DIAG_H

#include "common/monitor/run.h"

typedef enum {
    MON_DIAG_UNKNOWN = 0,       /* fewer than 2 samples */
    MON_DIAG_OK,
    MON_DIAG_STARVED,
    MON_DIAG_BACKPRESSURED,
    MON_DIAG_STUCK,
    MON_DIAG_SILENT,
    MON_DIAG_STARTING,
    MON_DIAG_STOPPED,
    MON_DIAG_COUNT_
} mon_diag_kind_t;

/* "unknown", "ok", "starved", "back-pressured", "stuck", "silent", "starting", "stopped". */
const char *mon_diag_name(mon_diag_kind_t k);

/* Stages send metrics every second (common/pipe/stage.c): 5 s without one is a frozen stage. */
#define MON_SILENT_S_DEFAULT 5.0

typedef struct {
    double stall_s;             /* no progress for this long = stalled (default 60) */
    double wait_share;          /* a wait share at least this is "waiting" (default 0.5) */
    double window_s;            /* history window for the shares (default 10) */
    double silent_s;            /* no metrics for this long = silent (default MON_SILENT_S_DEFAULT;
                                 * a starting stage: max(silent_s, stall_s)) */
} mon_diag_opts_t;

void mon_diag_opts_default(mon_diag_opts_t *o);

/* What the diagnosis reads of one stage (built by mon_stage_view, or by hand in tests). */
typedef struct {
    const char *name;
    mon_role_t role;
    char state[MON_STATE_MAX];  /* latest state */
    double dt;                  /* window length, s (0: fewer than 2 samples) */
    double d_wait_input, d_wait_credit, d_busy;     /* seconds inside the window */
    double d_wait_gpu;                              /* the same, waiting for the GPU's turn */
    double since_progress_s;    /* at `now` (latest since_progress_s + now - its ts); NaN unknown */
    double staleness_s;         /* now - latest sample ts */
    double tokens_per_s;        /* latest; NaN unknown */
    double inbox_used, inbox_cap;          /* drafters: GPU + host tier bytes; NaN unknown */
    double inbox_gpu_used, inbox_gpu_cap, inbox_host_used, inbox_host_cap;
    double queued;              /* targets: work items queued; NaN unknown */
} mon_stage_view_t;

typedef struct {
    mon_diag_kind_t kind;
    double share_in, share_credit, share_busy;     /* after attributing the open phase */
    double share_gpu;                              /* waiting for the GPU's turn (not busy) */
    int stalled;                /* no progress for stall_s (any kind) */
    char why[160];              /* one line, e.g. "no progress for 75 s while running" */
} mon_diag_t;

/* Fills *v from a stage's history as seen at wall time `now` (s). window_s: the
 * oldest sample used is the oldest one with ts >= newest ts - window_s (at least the
 * previous sample). */
void mon_stage_view(const mon_stage_t *s, double now, double window_s, mon_stage_view_t *v);

/* The diagnosis of one stage (rules above). Pure. */
void mon_diagnose(const mon_stage_view_t *v, const mon_diag_opts_t *o, mon_diag_t *out);

/* One stage of run.json's "stages" list (common/rundir/rundir.h). */
typedef struct {
    char name[MON_STAGE_NAME_MAX];
    uint32_t stage_id;
    uint64_t incarnation;
    char process[MON_STATE_MAX];    /* running|restarting|draining|moving|exited|retired */
    char node[64];                  /* the node it runs on (multi-node runs), else "" */
} mon_topo_stage_t;

/* Topology the suggestion is phrased in. From <run>/run.json when the supervisor
 * writes one (keys: device "cpu"|"cuda", targets, drafters, target_gpus [..],
 * drafter_gpus [..], max_steps, state, stages [..]), else counted from the stages
 * seen (CPU phrasing). */
typedef struct {
    int gpu_mode;
    int cpu_run;                /* run.json says device "cpu": no GPU figures, no NVML call */
    int cores;                  /* cores the compute stages share (multi-node: run.json's nodes
                                 * added up; else this machine's, _SC_NPROCESSORS_ONLN); 0 unknown */
    int threads;                /* threads per compute stage; 0 unknown: the run's default
                                 * (cores / (targets + drafters), at least 1) */
    int n_targets, n_drafters;
    int target_gpus[64], n_target_gpus;
    int drafter_gpus[64], n_drafter_gpus;
    uint64_t max_steps;         /* 0 = unknown */
    char run_state[MON_STATE_MAX];      /* running|rebalancing|stopping|stopped; "" unknown */
    int64_t ckpt_failed_step;           /* run.json: the last checkpoint not written (0 with no
                                         * ckpt_error: none), and why */
    char ckpt_error[512];
    mon_topo_stage_t stages[MON_MAX_STAGES];    /* the supervisor's stages (live topology, */
    int n_stages;                               /* plus exited and retired ones); 0 unknown */
} mon_topo_t;

/* The run.json entry of stage `name`, or NULL (no run.json stages, or not listed). */
const mon_topo_stage_t *mon_topo_stage(const mon_topo_t *t, const char *name);
/* 1 when stage `name` belongs to the run's topology: run.json lists it (retired ones
 * included), or run.json lists no stages. A name seen only in metrics.jsonl (an earlier
 * run of the same dir, before a --resume with fewer stages) gives 0. */
int mon_topo_has(const mon_topo_t *t, const char *name);

/* Reads <dir>/run.json (rundir_run_read) into *t (fields it lacks are left as they
 * are; cores: the nodes' from run.json, else this machine's); when that gives no max_steps, takes it from the optimizer's "step S of M" line
 * in <dir>/logs/optimizer.log. Returns 0, DL_ENOENT (no run.json), DL_EFORMAT
 * (malformed: the detail names the file and key) or DL_ENOMEM. */
int mon_topo_read(const char *dir, mon_topo_t *t);
/* The same from run.json's text in hand (a live run's status reply, common/monitor/
 * live.h; dir: the run dir, for the max_steps fallback only). Returns 0, DL_EFORMAT
 * (malformed: the detail names the key) or DL_ENOMEM. */
int mon_topo_parse(const char *dir, const char *json, size_t len, mon_topo_t *t);
/* Counts targets/drafters from the stages of a run that belong to the topology
 * (mon_topo_has; retired ones not counted), when run.json gave no counts. */
void mon_topo_from_run(const mon_run_t *run, mon_topo_t *t);

typedef struct {
    mon_role_t kind;            /* MON_ROLE_UNKNOWN: no clear bottleneck / not enough data */
    double busy[MON_ROLE_COUNT_], wait_in[MON_ROLE_COUNT_], wait_credit[MON_ROLE_COUNT_];
    double wait_gpu[MON_ROLE_COUNT_];   /* mean shares waiting for the GPU's turn */
    double inbox_fill;          /* drafters' (used / capacity), NaN unknown */
    char text[256];             /* "targets are the bottleneck: move one GPU from drafters to targets (...)" */
} mon_bottleneck_t;

/* Which stage kind limits throughput. A STUCK or SILENT stage comes first (the text
 * names it and its log); then a pipeline where every live stage has been waiting
 * (starved or back-pressured) for stall_s: nobody works, so work or a credit was lost
 * (kind UNKNOWN, text "the pipeline is stalled ..."). Else from the mean shares per role and the drafters' inbox
 * fill:
 *   targets   drafters starved (share_in >= 0.3 or inbox fill < 0.25) while targets
 *             are busy (>= 0.5) and not themselves starved;
 *   drafters  targets back-pressured (share_credit >= 0.3) or inbox fill >= 0.75, while
 *             drafters are busy (>= 0.5);
 *   optimizer optimizer busy >= 0.5 (synchronous step: everyone waits for it);
 *   the GPUs  every GPU runs targets and drafters (GPU mode, the same GPU lists) that take
 *             turns on it (share_gpu of targets or drafters >= 0.05), and the stages keep
 *             them busy: (targets' + drafters' + optimizer's busy time) / GPUs >= 0.9.
 *             Kind UNKNOWN; the text says that moving work between targets and drafters
 *             would not help, another GPU or a cheaper target forward would;
 *   loader    targets and drafters both starved (share_in >= 0.5);
 *   otherwise the busiest role if its busy share >= 0.75, else none.
 * The suggestion moves one process (CPU: --targets/--drafters) or one GPU (GPU mode,
 * with the explicit lists when the topology has them). On CPU, where nothing can move
 * (the other role has one process), it adds one only when topo->cores has room for one
 * more compute process of topo->threads threads ((targets + drafters + 1) x threads <=
 * cores); with no core free it says the machine is the limit (cores 0: unknown, the
 * add is phrased "if cores allow"). Stages in STOPPED, STARTING,
 * UNKNOWN or SILENT are left out of the means. Pure. */
void mon_bottleneck(const mon_stage_view_t *views, const mon_diag_t *diags, int n,
                    const mon_topo_t *topo, const char *run_dir, mon_bottleneck_t *out);

/* Seconds left to max_steps from the pace of the last (up to) 20 steps (by their t,
 * else ts). NaN when unknown (max_steps 0, fewer than 2 steps). */
double mon_eta_s(const mon_run_t *run, uint64_t max_steps);
/* Target tokens/s over the last (up to) 20 steps; NaN when unknown. */
double mon_tokens_per_s(const mon_run_t *run);

#endif
