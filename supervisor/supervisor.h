/* The supervisor behind `draftline run`: starts every pipeline stage as its own
 * process (fork + exec of the stage executables; CUDA is never initialised here,
 * so nothing CUDA crosses a fork), writes each stage's stdout/stderr to
 * <out>/logs/<stage>.log, owns the routing table (target i -> drafter i mod M)
 * and pushes it to targets, collects hellos and metrics (appended to
 * <out>/metrics.jsonl), prints a progress line every few seconds, restarts a
 * crashed stage with exponential backoff (the loader re-issues its work), stops
 * everything at --max-steps or on SIGINT/SIGTERM (stages checkpoint on the way
 * out), removes leftover shared-memory objects of the run, and prints a summary.
 */
#ifndef DL_SUPERVISOR_SUPERVISOR_H
#define DL_SUPERVISOR_SUPERVISOR_H

#include <stdint.h>

#include "common/bus/curve.h"

#define SUP_MAX_STAGES 136

struct run_config;

/* A stage the supervisor starts: `<bin_dir>/<exe> [--index I] --run-dir <sock_dir>
 * --incarnation N`; its settings travel in the RUN_CONFIG answer to its config request
 * (the run's sup_opts_t.cfg plus this stage's placement and route). */
typedef struct {
    char name[32];              /* loader, optimizer, drafter0, target0 ... (log name) */
    char exe[64];               /* executable name in the bin dir */
    uint32_t stage_id;
    int gpu;                    /* CUDA ordinal it starts on; -1 = CPU (the loader, CPU runs) */
    int node;                   /* index in sup_opts_t.node_names: 0 = the head */
} sup_stage_spec_t;

typedef struct {
    const char *bin_dir;        /* where the stage executables are */
    const char *out_dir;        /* run output: logs/, metrics.jsonl, checkpoints/ */
    const char *sock_dir;       /* sockets (short path, 0700) */
    const char *run_id;
    uint64_t max_steps, start_step, mbs_per_step;
    int n_targets, n_drafters;
    int threads_per_stage;      /* OMP/OpenBLAS threads given to each compute stage */
    int max_restarts;           /* per stage, then the run fails */
    double progress_every_s;
    int metrics_port;           /* Prometheus text format on 0.0.0.0:port (0: ephemeral; -1: off) */
    int inbox_slots;            /* full micro-batch slots per drafter inbox (rebalance check) */
    int lookahead;              /* the loader's --lookahead-mbs (rebalance check) */
    /* training-time eval (off when eval_data is NULL): when <out>/checkpoints/latest
     * names a new step_<S> with S a multiple of eval_every, `<bin_dir>/draftline eval`
     * runs on it as a child process (CPU, threads_per_stage threads; at most one at a
     * time: a checkpoint that comes while one runs is skipped), writing
     * <out>/eval/step_<S>.json; when it exits, one line {"ts", "stage":"eval",
     * "state":"done", "step", "seconds", "tau", ...} is appended to metrics.jsonl and
     * "eval step S: tau X" printed. Killed and reaped when the run stops. */
    const char *eval_data;      /* prompt set (any format `draftline eval --data` reads) */
    const char *target_model;   /* the target the drafter is evaluated against; in run.json */
    /* recorded in run.json ("target_model", "data", "save_every", "deterministic"; may be
     * NULL / 0) for `draftline run --resume DIR`'s defaults */
    const char *data;           /* the data cache (.dlc) the run trains on */
    int64_t save_every;
    int64_t keep_checkpoints;   /* --keep-checkpoints (0: keep all); in run.json */
    int deterministic;
    int mps;                    /* --mps (SUP_MPS_*, supervisor/mps.h): in run.json as "mps" */
    int gpu_turns;              /* --gpu-turns 1 on / 0 off: in run.json as "gpu_turns" */
    /* --balance auto: the supervisor picks the target/drafter split from measured rates
     * (supervisor/balance.c), first after balance_every_s and 2 applied steps, then every
     * balance_every_s (s) */
    int balance_auto;
    double balance_every_s;
    int eval_every, eval_prompts, eval_max_new_tokens;
    /* the run's one configuration (validated); each stage's RUN_CONFIG is built from it */
    const struct run_config *cfg;
    /* multi-node head (docs/MULTINODE.md; listen_port 0: one host, nothing below used):
     * the supervisor's ROUTER is tcp://listen_host:listen_port with CURVE keys, stages get
     * `--sup tcp://listen_host:listen_port --key key_path`; node_names[k] is node k of the
     * placement (0: the head, "head"), n_nodes of them; agents join under those names */
    const char *listen_host;
    int listen_port;
    const char *key_path;
    const bus_curve_keys_t *keys;
    int n_nodes;
    char node_names[16][64];
    int nodes_wait;             /* --nodes: agents to wait for before any stage starts */
    double join_timeout_s;
    sup_stage_spec_t stages[SUP_MAX_STAGES];
    int n_stages;
    double t_launch;            /* clock_mono_s() when `draftline run` started (0: the
                                   supervisor's own start): the wall clock's origin */
} sup_opts_t;

typedef struct {
    uint64_t steps;             /* last applied step + 1 */
    double loss_first10, loss_last10;
    int n_first, n_last;
    double tokens_per_s, seconds;   /* from the first applied step to the last (before the
                                       steady and wall figures; kept for callers) */
    uint64_t tokens;
    /* throughput (sup__rates): steady over steps steady_from..steady_to (steady 0: too
     * few steps; steady_note says why a window is not the usual one, "" when it is);
     * wall: every target token trained in this run over wall_s, from `draftline run`'s
     * start to the summary; startup_s: from that start to the first step applied;
     * final_ckpt_s: the final checkpoint (snapshot + files; 0 unknown); with
     * final_ckpt_with_stop, a stopped run's time from the stop to the optimizer's exit,
     * which holds its final checkpoint */
    double steady_tokens_per_s, wall_tokens_per_s, wall_s, startup_s, final_ckpt_s;
    int final_ckpt_with_stop;
    uint64_t steady_from, steady_to;
    char steady_note[96];
    int restarts;
    int interrupted;            /* stopped by a signal before max_steps */
    int signal;                 /* the first stopping signal (SIGINT, SIGTERM), 0 if none */
    int failed;
    char checkpoint[4200];
    char checkpoint_node[64];   /* the node whose filesystem holds it ("" = this host) */
} sup_summary_t;

/* Whether the run in dir is live: its control socket (run.json's "control", else
 * <dir>/ctl.sock) answers a status request within RUNDIR_CTL_ANSWER_MS. Returns 1
 * (live; *pid = run.json's supervisor_pid, informative), 0 (not live: no socket, or
 * no answer), DL_ENOENT when dir has no run.json (then *pid = 0). No /proc: the
 * answer is the supervisor's own. */
int sup_run_live(const char *dir, int *pid);

/* Runs the pipeline to the end. The caller holds <out>/run.lock (one run per run dir:
 * tools/cmd_run.c, through sup_launch, takes it before it touches the dir). Returns 0 (finished or cleanly
 * interrupted) or a negative dl_err (a stage failed beyond max_restarts, sockets). */
int supervisor_run(const sup_opts_t *o, sup_summary_t *sum);

#endif
