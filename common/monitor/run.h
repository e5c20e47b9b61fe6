/* The monitor's picture of a run, built from what the supervisor writes into the
 * run dir: <run>/metrics.jsonl (one JSON object per stage per second, plus one
 * "state":"step" object from the optimizer per applied step) and
 * <run>/steps.jsonl (one object per applied step). `draftline monitor`, `draftline
 * plot` and the Prometheus renderer all read a mon_run_t.
 *
 * metrics.jsonl line (common/rundir/rundir.h, written by the supervisor):
 *   {"ts": wall s, "stage": "drafter0", "stage_id": 100, "incarnation": 1,
 *    "state": "idle|running|blocked|starting|draining|stopping|step",
 *    "<metric>": number | null, ...}
 * Phase timings (wait_input_s, wait_credit_s, copy_s, forward_s, backward_s,
 * step_s) are cumulative seconds since the stage's incarnation started
 * (common/pipe/stage.h); since_progress_s is seconds since the stage last made
 * progress, at ts.
 * steps.jsonl line (common/rundir/rundir.h, written by the optimizer):
 *   {"step":k,"loss":x,"grad_norm":x,"lr":x,"tokens":cumulative,"skipped":0|1,
 *    "acc_mean":x,"t":seconds since the optimizer's first step}
 *
 * A mon_run_t is single-threaded; feed it lines (mon_run_ingest_*), or use
 * mon_run_poll which tails both files of a run dir (common/monitor/tail.h).
 */
#ifndef DL_MONITOR_RUN_H
#define DL_MONITOR_RUN_H

#include "proto/msg.h"

#include <stddef.h>
#include <stdint.h>

#define MON_MAX_STAGES 160      /* 1 loader + 1 optimizer + 64 drafters + 64 targets + slack */
#define MON_HIST 120            /* samples kept per stage (2 min at 1 sample/s) */
#define MON_MAX_METRICS 64      /* distinct metric names per stage (DL_PROTO_MAX_METRICS) */
#define MON_NAME_MAX 48         /* metric name bytes incl. NUL */
#define MON_STAGE_NAME_MAX 32
#define MON_STATE_MAX 16
#define MON_MAX_ACC 16          /* per-position accuracies kept (acc_1..acc_15) */
#define MON_MAX_STEPS (1u << 22)

typedef enum {
    MON_ROLE_UNKNOWN = 0, MON_ROLE_LOADER, MON_ROLE_TARGET, MON_ROLE_DRAFTER, MON_ROLE_OPTIMIZER,
    MON_ROLE_COUNT_
} mon_role_t;

/* "loader", "target", "drafter", "optimizer", "unknown". */
const char *mon_role_name(mon_role_t r);
/* Role from the pipeline's stage ids (common/pipe/stage.h: loader 1, optimizer 2,
 * drafter 100+i, target 200+i), falling back to the name's prefix. */
mon_role_t mon_role_of(uint32_t stage_id, const char *name);

typedef struct {
    double ts;                      /* wall seconds, the stage's clock */
    char state[MON_STATE_MAX];
    double v[MON_MAX_METRICS];      /* by the stage's name index; NaN = absent / null */
} mon_sample_t;

typedef struct {
    char name[MON_STAGE_NAME_MAX];
    uint32_t stage_id;
    mon_role_t role;
    uint64_t incarnation;
    int incarnations_seen;          /* 1 + restarts observed in the stream */
    int n_names;
    char names[MON_MAX_METRICS][MON_NAME_MAX];
    mon_sample_t hist[MON_HIST];    /* ring; history is cleared on a new incarnation */
    int head, count;                /* hist[head] is the newest */
} mon_stage_t;

typedef struct {
    int have;                       /* bit 0: steps.jsonl seen, bit 1: metrics step line seen */
    uint64_t step;
    double loss, grad_norm, lr;
    double tokens;                  /* cumulative target tokens of applied steps */
    double t;                       /* seconds since the optimizer's first step (NaN unknown) */
    double ts;                      /* wall seconds, when known (metrics step line), else NaN */
    double acc_mean;
    double acc[MON_MAX_ACC];        /* acc[k] = top-1 accuracy at block position k (1..15); NaN */
    int n_acc;                      /* highest k + 1 present */
    int skipped;
} mon_step_t;

typedef struct mon_run mon_run_t;

struct mon_run {
    mon_stage_t *stages[MON_MAX_STAGES];   /* owned; in order of first appearance */
    int n_stages;
    mon_step_t *steps;              /* indexed by step number; steps[i].have == 0: not seen */
    uint64_t n_steps;               /* highest step seen + 1 */
    uint64_t cap_steps;
    double last_ts;                 /* newest metrics ts of any stage */
    uint64_t lines, bad_lines;      /* lines ingested / rejected (malformed, unknown shape) */
    char last_error[160];           /* why the last bad line was rejected */
    /* tails of <run>/metrics.jsonl and <run>/steps.jsonl (mon_run_open); NULL otherwise */
    struct mon_tail *tail_metrics, *tail_steps;
    char dir[4096];
};

/* An empty run picture (no files). NULL on out of memory. Destroy with mon_run_destroy. */
mon_run_t *mon_run_new(void);
/* A run picture that follows <dir>/metrics.jsonl and <dir>/steps.jsonl (they may not
 * exist yet). Call mon_run_poll to read what was appended. NULL + dl_errmsg if dir is
 * not a directory or on out of memory. */
mon_run_t *mon_run_open(const char *dir);
void mon_run_destroy(mon_run_t **run_p);
/* Reads whatever was appended to both files since the last call (handles a partial last
 * line, truncation and rotation; see tail.h). Returns the number of lines ingested
 * (>= 0) or DL_EIO. */
int mon_run_poll(mon_run_t *run);

/* One metrics.jsonl line (len bytes, no newline needed). A malformed line is counted in
 * bad_lines and returns DL_EFORMAT (the run picture is unchanged); a "state":"step"
 * line of the optimizer updates the step table, not the stage's history. */
int mon_run_ingest_metrics_line(mon_run_t *run, const char *line, size_t len);
/* One steps.jsonl line. DL_EFORMAT as above. */
int mon_run_ingest_steps_line(mon_run_t *run, const char *line, size_t len);
/* The same as a metrics line, from values in hand (the supervisor's proto_metrics_t):
 * names[i] / values[i], i < n (NaN for null). state "step" from the optimizer goes to
 * the step table. Returns 0, DL_ERANGE (too many stages or names), DL_EINVAL. */
int mon_run_ingest_metrics(mon_run_t *run, double ts, const char *stage, uint32_t stage_id,
                           uint64_t incarnation, const char *state, const char *const *names,
                           const double *values, int n);

/* The supervisor's path: one decoded METRICS message from stage `peer` (its bus
 * identity, e.g. "drafter0"), exactly as on_metrics writes it to metrics.jsonl
 * (ts = ts_ns / 1e9). Returns mon_run_ingest_metrics's code. */
int mon_run_ingest_proto(mon_run_t *run, const char *peer, const proto_metrics_t *m);

/* Stage lookup; NULL if never seen. */
mon_stage_t *mon_run_stage(const mon_run_t *run, const char *name);
/* i-th newest sample of a stage (0 = newest); NULL past the history. */
const mon_sample_t *mon_stage_sample(const mon_stage_t *s, int back);
/* Index of a metric name in the stage's table, or -1. */
int mon_stage_index(const mon_stage_t *s, const char *name);
/* Value of a metric in the i-th newest sample; NaN if absent. */
double mon_stage_get(const mon_stage_t *s, int back, const char *name);
/* Latest step seen (have != 0), or NULL. */
const mon_step_t *mon_run_last_step(const mon_run_t *run);

#endif
