/* The run directory's files, one owner: everything that writes or parses
 *   <run>/run.json          the supervisor's picture of the run (topology, stages,
 *                           routes, the settings `draftline run --resume` defaults to)
 *   <run>/metrics.jsonl     one line per stage METRICS message (+ eval lines)
 *   <run>/steps.jsonl       one line per applied optimizer step
 *   <run>/checkpoints/latest  "step_<N>": the newest complete checkpoint
 * goes through this module (docs/ARCHITECTURE.md, "common/rundir").
 *
 * run.json (cJSON formatted print, tabs, one '\n' at the end; key order fixed):
 *   {"run_id", "device": "cpu"|"cuda", "targets", "drafters", "target_gpus": [..],
 *    "drafter_gpus": [..], "max_steps", "start_step", "micro_batches_per_step",
 *    "supervisor_pid", "sock_dir", "state": running|rebalancing|stopping|stopped,
 *    "metrics_port" (-1 off), "metrics_endpoint" ("" none), ["control"] (the
 *    supervisor's control socket, e.g. "ipc://<run>/ctl.sock"), "optimizer_recoveries",
 *    ["target_model"], ["data"], "save_every", "keep_checkpoints", "deterministic",
 *    ["target_precision": "bf16"|"fp8"], ["mps": "off"|"auto"|"on"],
 *    ["gpu_turns": "on"|"off"],
 *    ["rebalance": {"id", "status", "message", "seconds"}],
 *    "stages": [{"name", "stage_id", "pid" (0: exited), "incarnation", "restarts",
 *                "gpu" (-1 none), ["last_restart_up_s", "last_recovery_s"],
 *                "process": running|draining|moving|restarting|exited|retired}],
 *    "routes": [[target stage_id, drafter stage_id], ..]}
 *   [..] = written only when set (see rundir_run_t).
 *
 * metrics.jsonl line (rundir_metrics_append):
 *   {"ts":%.3f wall s,"stage":"<peer>","stage_id":N,"incarnation":N,"state":"<state>",
 *    "<metric>":%.9g|null,...}
 *   eval line (rundir_metrics_append_eval): {"ts","stage":"eval","state":"done",
 *    "step","seconds",<the eval report's numbers>} (cJSON unformatted print).
 *
 * steps.jsonl line (rundir_steps_append):
 *   {"step":N,"loss":%.9g|null,"grad_norm":%.9g|null,"lr":%.9g,"tokens":N,
 *    "skipped":0|1,"acc_mean":%.6f,"t":%.3f seconds of training of the run so far: a resumed
 *    or restarted optimizer's t goes on from the last line it keeps (the time between
 *    processes is not counted)}
 *
 * Errors: DL_ENOENT (file missing), DL_EINVAL (malformed: the detail names the file
 * and, where there is one, the key), DL_EIO (write failed; errno in the detail),
 * DL_ENOMEM. No function keeps global state; writers are handles owned by the caller.
 */
#ifndef DL_RUNDIR_RUNDIR_H
#define DL_RUNDIR_RUNDIR_H

#include <stddef.h>
#include <stdint.h>

#define RUNDIR_RUN_JSON "run.json"
#define RUNDIR_METRICS "metrics.jsonl"
#define RUNDIR_STEPS "steps.jsonl"
#define RUNDIR_LATEST "checkpoints/latest"

#define RUNDIR_PATH_MAX 4096        /* bytes incl. NUL of a path field / a file's path */
#define RUNDIR_MAX_STAGES 160       /* >= SUP_MAX_STAGES (136), = MON_MAX_STAGES */
#define RUNDIR_MAX_GPUS 64          /* entries of target_gpus / drafter_gpus (RBPLAN_MAX) */
#define RUNDIR_MAX_ORDINAL 1023     /* highest CUDA ordinal in them (RBPLAN_MAX_GPU) */
#define RUNDIR_NAME_MAX 32          /* stage names, incl. NUL (MON_STAGE_NAME_MAX) */
#define RUNDIR_STATE_MAX 16         /* state / process strings, incl. NUL */
#define RUNDIR_MAX_METRICS 64       /* metrics kept per line (MON_MAX_METRICS) */
#define RUNDIR_MAX_ACC 16           /* acc_1..acc_15 of a steps line */
#define RUNDIR_MAX_NODES 16         /* entries of "nodes" (= RUNCFG_NODES_MAX) */
#define RUNDIR_NODE_NAME_MAX 64     /* node names, incl. NUL (DL_PROTO_NODE_NAME_MAX + 1) */

/* <dir>/<file> into out (cap bytes). Returns 0, or DL_ERANGE when it does not fit. */
int rundir_path(char *out, size_t cap, const char *dir, const char *file);

/* ---- run.json ---------------------------------------------------------------- */

/* One entry of "stages". */
typedef struct {
    char name[RUNDIR_NAME_MAX];         /* "loader", "target0", "drafter1", "optimizer" */
    uint32_t stage_id;                  /* common/pipe/stage.h ids */
    int pid;                            /* 0: exited; -1: absent (read) */
    int64_t incarnation;                /* 1 = first start; -1: absent (read) */
    int restarts;                       /* -1: absent (read) */
    int gpu;                            /* CUDA ordinal of its --gpu, -1 none / absent */
    double last_restart_up_s;           /* written with last_recovery_s when that is > 0 */
    double last_recovery_s;             /* s from the death to the restarted stage's first progress */
    char process[RUNDIR_STATE_MAX];     /* running|draining|moving|restarting|exited|retired; "" absent */
    char node[RUNDIR_NODE_NAME_MAX];    /* the node it runs on (multi-node runs); "" = not written */
} rundir_stage_t;

/* One entry of "nodes" (multi-node runs only; index 0 = the head). */
typedef struct {
    char name[RUNDIR_NODE_NAME_MAX];
    int index;
    char hostname[256], addr[256];      /* "" for a node named by the placement that never joined */
    char run_dir[RUNDIR_PATH_MAX];      /* the agent's run dir (the head: "") */
    int alive;                          /* 0/1 */
    int cores, gpus;                    /* 0 until it joined */
} rundir_node_t;

/* Everything the supervisor records in run.json. Integers read as -1 when their key
 * is absent (files written by hand or by older versions); strings as "". */
typedef struct {
    char run_id[64];
    char device[8];                     /* "cpu" | "cuda"; "" absent */
    int targets, drafters;              /* the live topology */
    int target_gpus[RUNDIR_MAX_GPUS], n_target_gpus;    /* GPU of target i (GPU runs) */
    int drafter_gpus[RUNDIR_MAX_GPUS], n_drafter_gpus;  /* GPU of drafter i (GPU runs) */
    int64_t max_steps, start_step, micro_batches_per_step;
    int supervisor_pid;
    char sock_dir[RUNDIR_PATH_MAX];
    char state[RUNDIR_STATE_MAX];       /* running|rebalancing|stopping|stopped */
    int metrics_port;                   /* Prometheus port, -1 off */
    char metrics_endpoint[128];         /* the metrics PUB ("" none; BUS_ENDPOINT_MAX) */
    char control[128];                  /* the control socket ("" = not written; BUS_ENDPOINT_MAX) */
    int optimizer_recoveries;
    /* the last checkpoint that could not be written (training went on): its step (-1 none /
     * absent) and the optimizer's reason ("" unknown) */
    int64_t ckpt_failed_step;
    char ckpt_error[512];
    char target_model[RUNDIR_PATH_MAX]; /* absolute; "" = not written */
    char data[RUNDIR_PATH_MAX];         /* absolute data cache; "" = not written */
    int64_t save_every, keep_checkpoints;   /* keep_checkpoints 0: keep all */
    int deterministic;                  /* 0/1; -1 absent (read) */
    char target_precision[8];           /* --target-precision, "bf16"|"fp8" as given; "" = not
                                         * written / absent (runs before it was recorded) */
    int has_target_precision;           /* the key is there (read; its value may be "") */
    char mps[8];                        /* --mps, "off"|"auto"|"on" as given; "" = not written /
                                         * absent (runs before it was recorded) */
    char gpu_turns[8];                  /* --gpu-turns, "on"|"off"; "" = not written / absent */
    struct {
        char id[64];                    /* "" = no rebalance yet: the object is not written */
        char status[16];                /* accepted|rejected|done|failed|... */
        char message[256];
        double seconds;
    } rebalance;
    /* the summary's two target tokens/s, so far (supervisor/progress.c sup__rates): written
     * as "throughput" once a step was applied (on 0: not written / absent) */
    struct {
        int on;
        double steady_tokens_per_s;     /* 0: too few steps */
        int64_t steady_from, steady_to; /* its window: steps from..to */
        double wall_tokens_per_s, wall_s, startup_s;
        double final_ckpt_s;            /* 0: not known (yet) */
    } throughput;
    rundir_stage_t stages[RUNDIR_MAX_STAGES];
    int n_stages;
    uint32_t routes[RUNDIR_MAX_STAGES][2];  /* [target stage_id, drafter stage_id] */
    int n_routes;
    rundir_node_t nodes[RUNDIR_MAX_NODES];  /* multi-node runs; n_nodes 0: "nodes" not written */
    int n_nodes;
} rundir_run_t;

/* Every field "absent": integers -1, strings "", lists empty, rebalance.seconds 0. */
void rundir_run_init(rundir_run_t *r);

/* Writes <dir>/run.json from *r, atomically: <dir>/run.json.tmp, fsync, rename. The
 * text is cJSON_Print of the object above plus '\n' (byte for byte what the
 * supervisor wrote before this module). Returns 0, DL_EINVAL (too many stages /
 * routes / GPUs), DL_ENOMEM, DL_EIO (the old run.json is then left as it was). */
int rundir_run_write(const char *dir, const rundir_run_t *r);
/* The same text into a malloc'd NUL-terminated string (*out, caller frees). */
int rundir_run_format(const rundir_run_t *r, char **out);

/* Reads <dir>/run.json into *r (rundir_run_init first: absent keys stay "absent").
 * Returns 0; DL_ENOENT when the file is missing; DL_EINVAL when it is not a JSON
 * object, a key has the wrong type, a string or list does not fit (detail: "<path>:
 * key 'stages[3].name': ..."); DL_EIO on a read error. *r is unspecified on error. */
int rundir_run_read(const char *dir, rundir_run_t *r);
/* The same from text (len bytes; need not be NUL-terminated); `what` names it in
 * errors (e.g. the path). */
int rundir_run_parse(const char *text, size_t len, const char *what, rundir_run_t *r);

/* supervisor_pid of <dir>/run.json into *pid (0 on error). Returns 0; DL_ENOENT when
 * the file is missing or has no supervisor_pid (detail "<path>: no supervisor_pid");
 * rundir_run_read's errors otherwise. Informative only: whether the run is live is
 * whether its control socket answers (common/rundir/ctl.h). */
int rundir_run_supervisor_pid(const char *dir, int *pid);

/* The run.json stage named `name`, or NULL. */
const rundir_stage_t *rundir_run_stage(const rundir_run_t *r, const char *name);

/* ---- metrics.jsonl ------------------------------------------------------------ */

typedef struct rundir_metrics rundir_metrics_t;

/* Opens <dir>/metrics.jsonl for appending (created if missing). NULL + dl_errmsg
 * (DL_EIO, DL_ENOMEM). Close with rundir_metrics_close. */
rundir_metrics_t *rundir_metrics_open(const char *dir);
/* Closes and NULLs *w; NULL or *w NULL is fine. */
void rundir_metrics_close(rundir_metrics_t **w);

/* Appends one stage line and flushes it. ts_ns: the stage's wall clock, ns. names[i],
 * values[i], i < n (non-finite values are written as null). Strings lose control
 * characters, '"' and '\\' are escaped. Returns 0 or DL_EIO. */
int rundir_metrics_append(rundir_metrics_t *w, uint64_t ts_ns, const char *stage, uint32_t stage_id,
                          uint64_t incarnation, const char *state, const char *const *names,
                          const double *values, int n);
/* The same line (with its '\n') into a malloc'd NUL-terminated string (*out, caller
 * frees; *len its length without the NUL): the supervisor's status document carries
 * each stage's latest line. Returns 0 or DL_ENOMEM. */
int rundir_metrics_format(char **out, size_t *len, uint64_t ts_ns, const char *stage, uint32_t stage_id,
                          uint64_t incarnation, const char *state, const char *const *names,
                          const double *values, int n);
/* Appends one eval line ("stage":"eval","state":"done"): ts wall s, the step the
 * checkpoint holds, seconds the eval took, then names[i]:values[i] (the numbers of
 * the eval report, in its order). Flushes. Returns 0, DL_ENOMEM or DL_EIO. */
int rundir_metrics_append_eval(rundir_metrics_t *w, double ts, uint64_t step, double seconds,
                               const char *const *names, const double *values, int n);

/* One parsed metrics line. names[] and stage/state point into memory the record owns
 * (valid until rundir_metrics_rec_free). Keys ts, stage, stage_id, incarnation, state
 * are not metrics; string/array/object values are skipped; the first
 * RUNDIR_MAX_METRICS numbers/nulls are kept in file order, null as NaN. */
typedef struct {
    double ts;                          /* wall s */
    const char *stage;
    uint32_t stage_id;                  /* 0 when absent or negative */
    uint64_t incarnation;               /* 1 when absent or negative */
    const char *state;
    int n;
    const char *names[RUNDIR_MAX_METRICS];
    double values[RUNDIR_MAX_METRICS];
    void *own_;                         /* the parsed line */
} rundir_metrics_rec_t;

/* Parses one line (len bytes, trailing blanks ignored). Returns 0; DL_EINVAL with the
 * detail "metrics line is not a JSON object" or "metrics line without ts/stage/state"
 * (rec is then empty). Free with rundir_metrics_rec_free even on error. */
int rundir_metrics_parse_line(const char *line, size_t len, rundir_metrics_rec_t *rec);
void rundir_metrics_rec_free(rundir_metrics_rec_t *rec);
/* Value of metric `name` in rec; NaN when absent or null. */
double rundir_metrics_get(const rundir_metrics_rec_t *rec, const char *name);

/* Each stage's latest line (by file order) among the last tail_bytes of
 * <dir>/metrics.jsonl (0: the whole file), skipping lines whose state is "step" (the
 * optimizer's per-step line) and lines that do not parse (a torn first line); but when a
 * stage's last "step" line is not older (ts) than its latest periodic line, that record's
 * "step" (a count of applied steps) becomes the step line's step + 1 and its "loss" the step
 * line's (a stopped optimizer's last periodic line lags its last steps). *recs:
 * malloc'd array, one per stage in order of first appearance, *n of them; free with
 * rundir_metrics_latest_free. Returns 0 (a missing file is 0 stages), DL_ENOMEM. */
int rundir_metrics_latest(const char *dir, size_t tail_bytes, rundir_metrics_rec_t **recs, int *n);
void rundir_metrics_latest_free(rundir_metrics_rec_t **recs, int n);
/* The record of stage `name` in recs[0..n), or NULL. */
const rundir_metrics_rec_t *rundir_metrics_find(const rundir_metrics_rec_t *recs, int n, const char *name);

/* ---- steps.jsonl -------------------------------------------------------------- */

/* What the optimizer writes per applied step. */
typedef struct {
    uint64_t step;
    double loss, grad_norm;             /* non-finite: null */
    double lr;
    uint64_t tokens;                    /* cumulative target tokens of applied steps */
    int skipped;                        /* 1: the step's update was skipped (NaN) */
    double acc_mean;                    /* mean top-1 accuracy over block positions 1.. */
    double t;                           /* s since this optimizer's first step (the line gets
                                           the rewind's last kept t added: see the open) */
} rundir_step_t;

/* A checkpoint written since the previous steps line: the line ends with
 * "ckpt_step":N,"ckpt_waited_s":W,"ckpt_snapshot_s":S,"ckpt_write_s":F (flat: readers
 * that count "step": keys see one per line), in s: waited for the
 * previous write, snapshot of the state (no step applied meanwhile), files written (steps
 * went on meanwhile, except after the final one). */
typedef struct {
    uint64_t step;
    double waited_s, snap_s, write_s;
} rundir_step_ckpt_t;

typedef struct rundir_steps rundir_steps_t;

/* Opens <dir>/steps.jsonl for appending. When rewind_from >= 0 (a resumed optimizer
 * undoes every step from there on), first rewrites the file without the lines of
 * steps >= rewind_from and without a torn last line (to .tmp, renamed; lines that do
 * not parse are kept; logs how many were removed); the last kept line's "t" is then
 * added to every appended t, so t continues across a resume. NULL + dl_errmsg (DL_EIO,
 * DL_ENOMEM) when the file cannot be opened. */
rundir_steps_t *rundir_steps_open(const char *dir, int64_t rewind_from);
void rundir_steps_close(rundir_steps_t **w);
/* Appends and flushes one line. Returns 0 or DL_EIO. */
int rundir_steps_append(rundir_steps_t *w, const rundir_step_t *s);
/* The same with a checkpoint's times on the line (ck may be NULL: none). */
int rundir_steps_append_ck(rundir_steps_t *w, const rundir_step_t *s, const rundir_step_ckpt_t *ck);

/* One parsed steps line; NaN for every absent or null field. */
typedef struct {
    double step, loss, grad_norm, lr, tokens, skipped, acc_mean, t;
    double acc[RUNDIR_MAX_ACC];         /* acc[k] = "acc_k", k = 1..15; acc[0] unused */
} rundir_step_rec_t;

/* Parses one line (len bytes, trailing blanks ignored). Returns 0 or DL_EINVAL
 * ("steps line is not a JSON object"). The step's validity is the caller's. */
int rundir_steps_parse_line(const char *line, size_t len, rundir_step_rec_t *rec);

/* ---- checkpoints/latest ------------------------------------------------------- */

/* The name in <dir>/checkpoints/latest (its first line, line end stripped) into name
 * (cap bytes; NULL: not wanted) and, when it reads "step_<N>", N into *step (NULL:
 * not wanted). Returns 1 (a step_<N> name), 0 (a name, not step_<N>: *step = 0),
 * DL_ENOENT (no file, or empty). Written by rundir_latest_write. */
int rundir_latest_read(const char *dir, char *name, size_t cap, uint64_t *step);

/* Points <checkpoints>/latest at step_<step>: writes "step_<step>\n" to latest.tmp, fsyncs,
 * renames over latest and fsyncs the folder (a reader sees the old or the new name, never a
 * torn one). checkpoints: the run's checkpoints folder itself (<run>/checkpoints), where the
 * optimizer's checkpoint writer (common/pipe/ckpt.c) has just renamed step_<step> into place.
 * Returns 0 or DL_EIO / DL_ERANGE (dl_errmsg names the file). */
int rundir_latest_write(const char *checkpoints, uint64_t step);

#endif
