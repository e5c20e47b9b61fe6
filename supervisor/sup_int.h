/* Internal to supervisor/: the state of one `draftline run` supervisor (sup_t, one per
 * process, owned by supervisor_run in run.c) and the calls its files make into each
 * other (module__name: not part of the public API in supervisor.h).
 *
 *   proc.c       process table: spawn, reap, restarts with backoff, routes, control,
 *                each stage's RUN_CONFIG
 *   rebalance.c  live rebalance (checks, placement plan, drain and retire)
 *   balance.c    --balance auto: the split from measured rates, applied by a rebalance
 *   eval.c       the training-time eval child
 *   relay.c      hellos (and config requests), metrics relay (metrics.jsonl, PUB, Prometheus),
 *                loss history, stall check
 *   progress.c   the console's progress line
 *   runjson.c    <out>/run.json (through common/rundir)
 *   ctl.c        the control socket: status, stop, rebalance, subscribe
 *   run.c        supervisor_run: the loop, signals, stop, summary
 *
 * Single-threaded: everything runs on the supervisor's libuv loop.
 */
#ifndef DL_SUPERVISOR_SUP_INT_H
#define DL_SUPERVISOR_SUP_INT_H

#include "supervisor/supervisor.h"
#include "common/bus/bus.h"
#include "common/monitor/prom.h"
#include "common/monitor/run.h"
#include "common/pipe/runcfg.h"
#include "common/pipe/stage.h"
#include "common/rundir/rundir.h"
#include "proto/codec.h"

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <uv.h>

#define SUP_LOSS_HIST 100000
#define SUP_CTL_MAX_CLIENTS 64      /* subscribers, and clients waiting for a stop, at once */

/* A client of the control socket waiting for a later reply (or a subscriber). */
typedef struct {
    char peer[BUS_ID_MAX + 1];
    uint64_t id;                /* its request's id */
} sup_ctl_client_t;

/* --balance auto, CPU runs: a live target's (target 1) or drafter's CPU seconds and tokens
 * at the last check (balance.c bal_cpu_cap) */
typedef struct {
    pid_t pid;
    int target;
    double cpu_s, tokens;
} sup_bal_cpu_t;

typedef struct {
    const sup_stage_spec_t *spec;
    pid_t pid;
    uint64_t incarnation;
    int restarts;
    int exited;                 /* not running now */
    int status;
    double restart_at;          /* monotonic s; 0 = none scheduled */
    int helloed;
    char peer[BUS_ID_MAX + 1];
    double metrics[8];          /* a few metrics kept for the progress line */
    int active;                 /* part of the current topology (started, not retired) */
    int retiring;               /* rebalance: draining, then stopped; never restarted */
    int moving;                 /* GPU rebalance: SIGTERM sent, restarts at once on its new GPU */
    int node_was;               /* rebalance across nodes: 1 + the node the running incarnation is on
                                 * while spec->node already names the next one (0: spec->node) */
    int planned;                /* killed by the supervisor to re-sync: restart at once */
    int fails;                  /* consecutive short-lived incarnations (backoff exponent) */
    double t_spawn, retire_t0;
    double term_at;             /* retiring: when SIGTERM was sent (SIGKILL 20 s later) */
    int64_t retire_after;       /* a drafter retires once a step > this was applied */
    double inbox_bytes;         /* drafter: latest inbox_gpu_bytes + inbox_host_bytes */
    double since_progress_s;    /* latest since_progress_s metric (-1: none yet) */
    /* recovery from a death (restart with backoff; not the optimizer, which has its
     * own figure): monotonic s of the death and of its successor's hello (0: none
     * pending); the last figures, death -> successor up and death -> first step
     * applied after that hello (0: none yet) */
    double t_died, t_back, last_up_s, last_recovery_s;
    /* set by sup__spawn for this incarnation's RUN_CONFIG: the loader's start step (-1:
     * the run's), the optimizer resuming from S->resume_ckpt */
    int64_t start_step;
    int from_ckpt;
} sstage_t;

/* The console's progress (progress.c). Steps as steps.jsonl numbers them (from 0). */
typedef struct {
    int tty;                    /* stdout is a terminal: the line is rewritten in place */
    int partial, partial_step;  /* a progress line without its newline is on the terminal (a step's) */
    int have;                   /* a step was seen */
    uint64_t step;              /* the last step seen */
    uint64_t printed;           /* steps whose line was printed: the last printed is step printed - 1 */
    double t_step, tokens;      /* monotonic s when it came, the run's tokens then */
    double loss, lr, gnorm, acc_mean;   /* its figures (per position: S->acc) */
    double ema_dt, ema_dtok;    /* exponential averages of s and tokens per step (not debiased) */
    double ema_pow;             /* SUP_PROGRESS_EMA^k after k intervals (0: none yet) */
    double t_print, t_wait_print;   /* the last line printed, the last "waiting" line (0: none) */
    int up_printed;             /* stages up in the last "starting" line */
    struct mon_tb *tb;          /* <out>/tb/ event file (common/monitor/tb.h; NULL: not yet open) */
    int tb_failed;              /* it could not be opened or written: said once, not retried */
} sup_progress_t;

/* A node of a multi-node run (index = its place in sup_opts_t.node_names; 0 = the head,
 * always up). Agents fill the rest when they join (nodes.c). */
typedef struct {
    char addr[RUNCFG_ADDR_MAX + 1];     /* where its stages bind and peers reach them */
    char run_dir[4096];                 /* the agent's run dir (the out dir of its stages) */
    char peer[BUS_ID_MAX + 1];          /* the agent's bus id ("" for the head) */
    int up;                             /* joined and alive (the head: 1) */
    /* from its node_hello (nodes.c) */
    char name[DL_PROTO_NODE_NAME_MAX + 1];
    char hostname[DL_PROTO_HOST_MAX + 1];
    uint32_t cores, n_gpus;
    int joined;                         /* joined at least once */
    uint64_t incarnation;               /* the agent start's */
    uint32_t pid;
    double rejoin_sent;                 /* CONTROL STOP "rejoin" last sent (lost node heard again) */
} sup_node_t;

typedef struct {
    const sup_opts_t *o;
    sup_summary_t *sum;
    uv_loop_t loop;
    bus_t *bus;
    uv_signal_t sig_int, sig_term, sig_chld;
    uv_timer_t tick;
    sstage_t st[SUP_MAX_STAGES];
    int n;
    /* multi-node (docs/MULTINODE.md): the node table; fake_nodes (test hook fake_nodes=1,
     * read once, with --listen): every target and drafter is told it runs on a node of
     * its own (all at the head's address, spawned by the head) so the cross-node data
     * plane runs without agents */
    sup_node_t nodes[RUNCFG_NODES_MAX];
    int fake_nodes;
    int ckpt_failures_seen;     /* the optimizer's ckpt_failures metric as last said on the console */
    int64_t ckpt_failed_step;   /* the last checkpoint that could not be written (-1 none) */
    char ckpt_error[512];       /* its reason (the optimizer log's last ERROR line, when readable) */
    int64_t opt_ckpt_step;      /* the optimizer's last checkpoint as it reported it (metric
                                 * ckpt_step; -1: none yet): how the head knows the
                                 * checkpoints of an optimizer on another node */
    uint8_t secret[CRED_BYTES]; /* the run secret (random at start): stage credentials (common/pipe/cred.h) */
    int strip_gpu;              /* test hook strip_gpu=1 (read once): every GPU of the RUN_CONFIGs sent cleared */
    int stopping, failed, done;
    const char *stop_by;        /* who asked the stop when not a signal (logged), or NULL */
    double t_stop;
    rundir_metrics_t *metrics;  /* <out>/metrics.jsonl */
    int metrics_warned;
    rundir_run_t run;           /* what run.json holds (sup__fill_run) */
    double t0, t_first_step;
    double *losses;             /* (SUP_LOSS_HIST) per applied step of this run, n_losses of them; */
    double *step_t, *step_tok;  /* with the time each was heard (clock_mono_s) and its tokens */
    double final_ckpt_s;        /* the final checkpoint's duration (metric ckpt_s), 0 unknown */
    int final_ckpt_with_stop;   /* final_ckpt_s is the time from the stop to the optimizer's exit
                                   (a stopped run whose optimizer, closed by SIGTERM, could not
                                   send the checkpoint's own time) */
    double last_tokens_step;    /* the cumulative tokens of the last step message */
    uint64_t n_losses;
    uint64_t last_step_seen;
    int64_t last_applied;       /* last step the optimizer reported applied; -1 none */
    int have_step;
    double last_loss, last_acc_mean, acc[16];
    int n_acc;
    double tokens, elapsed, tok_rate, tokens_first, elapsed_first;
    double last_tokens, last_tokens_t;
    sup_progress_t prog;        /* the console's progress (progress.c) */
    double t_last_step, last_stall_warn;   /* stall warning: last step seen, last warning */
    double stall_warn_floor_s;  /* its floor: 60 s, or the test hook stall_warn_s (read at the first check) */
    /* live topology (rebalance) */
    int nt, nd;
    int gpu_mode;               /* the stage specs carry a GPU (GPU run) */
    sup_stage_spec_t xspec[SUP_MAX_STAGES];   /* specs of stages added by a rebalance */
    int nx;
    struct {
        char id[64];
        int running;
        double t0, seconds;
        int from_t, from_d, to_t, to_d;
        char to_gpus[160];      /* GPU runs: " (targets on GPUs L, drafters on GPUs L)" */
        char status[16], message[256];
    } rb;
    /* --balance auto (balance.c): next check (monotonic s; 0: not scheduled yet), the step
     * of the last move (the next check waits for 2 more), checks and moves made, off (a
     * move could not be made: said once), the last verdict and split said on the console,
     * CPU runs' CPU time per stage */
    struct {
        double next_check; int64_t change_step; int checks, moves, off; char last_said[64];
        /* CPU runs: each live target's / drafter's CPU seconds and tokens at the last check
         * (the cores' cap: balance.c bal_cpu_cap) */
        sup_bal_cpu_t cpu[RUNDIR_MAX_STAGES];
        int n_cpu;
    } bal;
    char resume_ckpt[4200];     /* the optimizer restarts from here ("" = its first args) */
    int opt_recoveries;
    double t_opt_died, last_recovery_s;
    /* metrics relay */
    bus_t *pub;
    mon_run_t *mon;
    prom_server_t *prom;
    int prom_port;
    /* the control socket (ctl.c) */
    struct {
        bus_t *bus;
        char endpoint[BUS_ENDPOINT_MAX];            /* "" when it could not be bound */
        sup_ctl_client_t subs[SUP_CTL_MAX_CLIENTS]; /* subscribe: relayed METRICS go here */
        int n_subs;
        sup_ctl_client_t waiters[SUP_CTL_MAX_CLIENTS];  /* stop with WAIT: "stopped" at the end */
        int n_waiters;
        sup_ctl_client_t rb;                        /* who asked for the current rebalance ("" none) */
        /* each stage's latest non-step METRICS (status), in order of first appearance, and
         * when it arrived (clock_mono_s: its age in status shows a frozen stage) */
        struct { char peer[BUS_ID_MAX + 1]; proto_metrics_t m; double t_recv; } last[RUNDIR_MAX_STAGES];
        int n_last;
    } ctl;
    /* training-time eval child (see sup_opts_t.eval_data) */
    struct {
        pid_t pid;              /* running `draftline eval`; 0: none */
        uint64_t step;          /* the step it evaluates */
        uint64_t last_ckpt;     /* last step_<S> seen in checkpoints/latest */
        double t0;
        char json[4300];        /* <out>/eval/step_<S>.json */
    } ev;
    /* node agents (nodes.c): on = this run takes agents (--nodes, or a placement naming
     * nodes); n nodes known (the head, the named ones, others that joined); ready: every
     * wanted node joined and the stages were started; failed: why the join failed; said:
     * the last "waiting for nodes" line's who-is-missing part (said again only on a change,
     * or after SUP_NODES_REMIND_S) */
    struct { int on, n, ready; double t0, t_ready, last_line; char failed[600]; char said[512]; } ntab;
} sup_t;

static inline int is_target(const sstage_t *x) { return x->spec->stage_id >= PIPE_ID_TARGET0; }
static inline int is_drafter(const sstage_t *x) {
    return x->spec->stage_id >= PIPE_ID_DRAFTER0 && x->spec->stage_id < PIPE_ID_TARGET0;
}
static inline int route_of(const sup_t *S, uint32_t target_id) {
    return (int)((target_id - PIPE_ID_TARGET0) % (uint32_t)S->nd);
}

/* proc.c */
/* The set-up of a child the supervisor forked (a stage or the eval child), before its
 * exec: pdeathsig, log_path for stdout/stderr, stdin /dev/null, default signals, the
 * thread-count variables (threads <= 0: 1). _exit(1) if `parent` is already gone. */
void sup__child_setup(pid_t parent, int pdeathsig, const char *log_path, int threads);
/* The GPU ordinal a stage spec starts on (sp->gpu), or -1 (CPU stage, loader). */
int sup__spec_gpu(const sup_stage_spec_t *sp);
/* Answers x's config request (a HELLO with PROTO_CAP_WANT_CONFIG from peer, incarnation
 * inc) with RUN_CONFIG only: the run's configuration (S->o->cfg) with the live placement
 * and routes, this incarnation's loader start step or optimizer resume dir, and every
 * GPU cleared under the strip_gpu test hook. Nothing else changes (x is not "up"). */
void sup__send_config(sup_t *S, sstage_t *x, const char *peer, uint64_t inc);
/* The membership credential of incarnation inc of stage stage_id (cred_stage with the run
 * secret and run id); out: CRED_BYTES. */
void sup__cred(const sup_t *S, uint32_t stage_id, uint64_t inc, uint8_t out[CRED_BYTES]);

/* Starts incarnation x->incarnation + 1 of x (fork + exec, log to <out>/logs/<name>.log);
 * a fork failure is logged and leaves x exited. Rewrites run.json. */
void sup__spawn(sup_t *S, sstage_t *x);
/* The stage slot of stage_id id, or NULL. */
sstage_t *sup__by_id(sup_t *S, uint32_t id);
/* Sends a CONTROL op with ints[n] (borrowed) to x, when x is up (helloed, not exited). */
void sup__send_ctl(sup_t *S, sstage_t *x, proto_ctl_op_t op, const int64_t *ints, uint32_t n);
/* Sends target x its route (target i -> drafter i mod nd). */
void sup__push_route(sup_t *S, sstage_t *x);
/* Stage x exited with waitpid status `status` (reaped here, or reported by its node's
 * agent): restart with backoff, retire, move, optimizer recovery, or the stop. */
void sup__on_exit(sup_t *S, sstage_t *x, int status);
/* waitpid(WNOHANG) of every exited child: stages (restart with backoff, retire, move,
 * optimizer recovery) and the eval child (sup__ev_done). */
void sup__reap(sup_t *S);

/* netcfg.c */
/* The multi-node part of x's RUN_CONFIG c (nothing on a one-host run): net_port, the
 * node addresses, every stage's node (the specs', or one node per target and drafter
 * under fake_nodes; the optimizer on drafter 0's node), and c->out_dir = the agent's run
 * dir for a stage on another node. */
void sup__net_config(const sup_t *S, const sstage_t *x, run_config_t *c);
/* The optimizer runs on another node than the head (its checkpoints are there). */
int sup__opt_remote(const sup_t *S);
/* The last line of the log at path holding " ERROR ", its message only, into buf[cap]; 0,
 * or -1 when the file cannot be read or has none. */
int sup__last_error_line(const char *path, char *buf, size_t cap);
/* The run's latest checkpoint: dir[cap] and its step. On the head: checkpoints/latest of
 * the out dir and the step its state.bin records; an optimizer on another node: the
 * step it last reported (ckpt_step) under that node's run dir. 0, or -1 when there is
 * none (or it does not read as a checkpoint). */
int sup__latest_ckpt(const sup_t *S, char *dir, size_t cap, uint64_t *step);
/* The supervisor's ROUTER endpoint into buf: tcp://listen_host:listen_port on a
 * multi-node head, else ipc://<sock_dir>/sup.sock. */
int sup__sup_endpoint(const sup_opts_t *o, char *buf, size_t cap);

/* run.c */
/* Starts the stop (idempotent): SIGTERM to every stage and the eval child; why is logged. */
void sup__begin_stop(sup_t *S, const char *why);
/* SIGINT/SIGTERM (or `draftline stop`, as SIGTERM): the first stops the run
 * (interrupted), a later one kills every stage (see run.c). */
void sup__on_stop_signal(sup_t *S, int signum);

/* runjson.c */
/* Fills S->run with the live picture (what run.json holds). */
void sup__fill_run(sup_t *S);
/* Replaces <out>/run.json atomically with S->run after sup__fill_run (errors logged). */
void sup__write_run_json(sup_t *S);

/* ctl.c */
/* Binds the control socket (ipc://<out>/ctl.sock, or <sock_dir>/ctl.sock when that
 * path is too long) on S->loop; S->ctl.endpoint stays "" (and a warning is logged)
 * when it cannot be bound: the run goes on without one. */
void sup__ctl_start(sup_t *S);
/* A relayed METRICS message (payload data/len, decoded m) from peer: kept as the
 * stage's latest for status, forwarded to every subscriber. */
void sup__ctl_on_metrics(sup_t *S, const char *peer, const proto_metrics_t *m, const void *data, size_t len);
/* The current rebalance's status changed (S->rb; json: the result document): a
 * reply (state = S->rb.status) to the client that asked. */
void sup__ctl_rb_update(sup_t *S, const char *json);
/* The run is over: "stopped" to every client that asked to wait, then the socket closes. */
void sup__ctl_close(sup_t *S);

/* relay.c */
/* The bus callback of the supervisor's ROUTER (hello, metrics, applied). */
void sup__on_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg);
/* Mean of the finite v[a..b), NAN when there is none. */
double sup__mean_range(const double *v, uint64_t a, uint64_t b);
/* The no-step-applied warning (see relay.c); now: monotonic s. */
void sup__stall_check(sup_t *S, double now);

/* progress.c */
/* Throughput of the run so far (progress.c): steady over the steps of this run minus
 * the first two and the last (fewer than 4 steps: all but the first, said in note),
 * timed from the end of the step before the window, on the supervisor's clock; wall:
 * every token trained in this run over now - the run's start (sup_opts_t.t_launch). */
typedef struct {
    double steady, wall, wall_s, startup_s, final_ckpt_s, tokens;   /* tokens/s; s; tokens */
    uint64_t from, to;          /* the steady window: steps from..to (0, 0: none) */
    const char *note;           /* "" or why the window is not the usual one (static) */
} sup_rates_t;
void sup__rates(const sup_t *S, double now, sup_rates_t *r);

/* Before the first tick, after S->t0 is set: whether stdout is a terminal; on one, the
 * log hook that ends a half-written progress line before a log line. */
void sup__progress_init(sup_t *S);
/* A step message m of the live optimizer incarnation: figures, rate averages, an
 * optimizer restart said (the step went back); the run's last step printed at once. */
void sup__progress_step(sup_t *S, const proto_metrics_t *m);
/* Every tick (now: monotonic s): the step line, "starting", or "waiting for step N". */
void sup__progress_tick(sup_t *S, double now);
/* Ends a half-written progress line on the terminal (call before printing anything else). */
void sup__progress_break(sup_t *S);
/* Once every stage is gone: the last step's line if it was not printed, the line ended,
 * the log hook removed, the event file closed. */
void sup__progress_final(sup_t *S);

/* eval.c */
/* The step of <out>/checkpoints/latest ("step_<S>"), or 0 when there is none. */
uint64_t sup__ev_latest_step(const sup_t *S);
/* Starts an eval of a new checkpoint when one is due (see eval.c). */
void sup__ev_poll(sup_t *S);
/* The eval child exited with waitpid status: its report goes to metrics.jsonl. */
void sup__ev_done(sup_t *S, int status);

/* rebalance.c */
/* A rebalance request (`draftline rebalance` through the control socket; id names it
 * in logs and run.json): N targets and M drafters (CPU runs), or the whole new
 * placement tg[ntg] / dg[ndg] (GPU runs; ntg + ndg > 0); tplace / dplace: the
 * placement as written when it names nodes ("" or NULL: every entry on the head;
 * multi-node runs only, docs/MULTINODE.md section 6). Rejects it, answers it
 * ("done": nothing to change) or starts it; every status change goes through
 * sup__ctl_rb_update. */
void sup__rb_request(sup_t *S, const char *id, int N, int M, const int *tg, int ntg, const int *dg, int ndg,
                     const char *tplace, const char *dplace);
/* Advances a running rebalance (drain, SIGTERM/SIGKILL of retiring stages, done). */
void sup__rb_tick(sup_t *S);
/* balance.c */
/* --balance auto: every balance_every_s after 2 applied steps, the split with the best
 * predicted throughput from the stages' measured rates (common/pipe/balance.h), moved to
 * by a live rebalance when it beats the live split by 15 %; each decision logged and
 * printed. Called from the supervisor's tick; does nothing without --balance auto. */
void sup__balance_tick(sup_t *S, double now);

#endif
