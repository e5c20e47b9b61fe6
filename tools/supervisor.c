/* Supervisor (see supervisor.h). */
#include "tools/supervisor.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/bus/bus.h"
#include "common/mem/slab.h"
#include "common/monitor/prom.h"
#include "common/monitor/run.h"
#include "common/pipe/ckpt.h"
#include "common/pipe/rbplan.h"
#include "common/pipe/stage.h"
#include "proto/codec.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#define SUP_LOSS_HIST 100000

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
    int moving;                 /* GPU rebalance: SIGTERM sent, restarts at once with a new --gpu */
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
} sstage_t;

typedef struct {
    const sup_opts_t *o;
    sup_summary_t *sum;
    uv_loop_t loop;
    bus_t *bus;
    uv_signal_t sig_int, sig_term, sig_chld;
    uv_timer_t tick;
    sstage_t st[SUP_MAX_STAGES];
    int n;
    int stopping, failed, done;
    double t_stop;
    FILE *metrics;
    double t0, t_first_step;
    double *losses;
    uint64_t n_losses;
    uint64_t last_step_seen;
    int64_t last_applied;       /* last step the optimizer reported applied; -1 none */
    int have_step;
    double last_loss, last_acc_mean, acc[16];
    int n_acc;
    double tokens, elapsed, tok_rate, tokens_first, elapsed_first;
    double last_tokens, last_tokens_t;
    double last_progress_print;
    double t_last_step, last_stall_warn;   /* stall warning: last step seen, last warning */
    /* live topology (rebalance) */
    int nt, nd;
    int gpu_mode;               /* the stage specs carry --gpu N (GPU run) */
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
    char resume_ckpt[4200];     /* the optimizer restarts from here ("" = its first args) */
    int opt_recoveries;
    double t_opt_died, last_recovery_s;
    /* metrics relay */
    bus_t *pub;
    mon_run_t *mon;
    prom_server_t *prom;
    int prom_port;
    /* training-time eval child (see sup_opts_t.eval_data) */
    struct {
        pid_t pid;              /* running `draftline eval`; 0: none */
        uint64_t step;          /* the step it evaluates */
        uint64_t last_ckpt;     /* last step_<S> seen in checkpoints/latest */
        double t0;
        char json[4300];        /* <out>/eval/step_<S>.json */
    } ev;
} sup_t;

static int is_target(const sstage_t *x) { return x->spec->stage_id >= PIPE_ID_TARGET0; }
static int is_drafter(const sstage_t *x) {
    return x->spec->stage_id >= PIPE_ID_DRAFTER0 && x->spec->stage_id < PIPE_ID_TARGET0;
}
static int route_of(const sup_t *S, uint32_t target_id) {
    return (int)((target_id - PIPE_ID_TARGET0) % (uint32_t)S->nd);
}

/* The GPU ordinal a stage spec starts on (the value of its --gpu flag), or -1 (CPU
 * stage, or a stage without one: loader; the optimizer's GPU, when it has one, is
 * not moved by a rebalance). */
static int spec_gpu(const sup_stage_spec_t *sp) {
    for (int a = 0; a + 1 < sp->argc; a++)
        if (!strcmp(sp->argv[a], "--gpu")) return atoi(sp->argv[a + 1]);
    return -1;
}

/* <out>/run.json: the run's topology for `draftline status/stop` and the monitor
 * (device, targets, drafters, max_steps, the supervisor's pid, every stage with
 * pid, incarnation, restarts and state, the routing table). Replaced atomically. */
static void write_run_json(sup_t *S) {
    const sup_opts_t *o = S->o;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "run_id", o->run_id);
    cJSON_AddStringToObject(j, "device", S->gpu_mode ? "cuda" : "cpu");
    cJSON_AddNumberToObject(j, "targets", S->nt);
    cJSON_AddNumberToObject(j, "drafters", S->nd);
    /* GPU runs: the GPU of target (drafter) i of the live topology, i < targets (drafters) */
    cJSON *tgl = cJSON_AddArrayToObject(j, "target_gpus"), *dgl = cJSON_AddArrayToObject(j, "drafter_gpus");
    for (int r = 0; r < 2 && S->gpu_mode; r++)
        for (int i = 0; i < (r ? S->nd : S->nt); i++)
            for (int k = 0; k < S->n; k++)
                if (S->st[k].spec->stage_id == (r ? PIPE_ID_DRAFTER0 : PIPE_ID_TARGET0) + (uint32_t)i)
                    cJSON_AddItemToArray(r ? dgl : tgl, cJSON_CreateNumber(spec_gpu(S->st[k].spec)));
    cJSON_AddNumberToObject(j, "max_steps", (double)o->max_steps);
    cJSON_AddNumberToObject(j, "start_step", (double)o->start_step);
    cJSON_AddNumberToObject(j, "micro_batches_per_step", (double)o->mbs_per_step);
    cJSON_AddNumberToObject(j, "supervisor_pid", (double)getpid());
    cJSON_AddStringToObject(j, "sock_dir", o->sock_dir);
    cJSON_AddStringToObject(j, "state", S->done ? "stopped" : S->stopping ? "stopping" : S->rb.running ? "rebalancing" : "running");
    cJSON_AddNumberToObject(j, "metrics_port", S->prom ? S->prom_port : -1);
    {
        char ep[BUS_ENDPOINT_MAX] = "";
        if (S->pub) bus_endpoint(o->sock_dir, "metrics", ep, sizeof ep);
        cJSON_AddStringToObject(j, "metrics_endpoint", ep);
    }
    cJSON_AddNumberToObject(j, "optimizer_recoveries", S->opt_recoveries);
    /* for `draftline run --resume DIR`'s defaults (cmd_run.c, resume_defaults) */
    if (o->target_model) cJSON_AddStringToObject(j, "target_model", o->target_model);
    if (o->data) cJSON_AddStringToObject(j, "data", o->data);
    cJSON_AddNumberToObject(j, "save_every", (double)o->save_every);
    cJSON_AddNumberToObject(j, "keep_checkpoints", (double)o->keep_checkpoints);
    cJSON_AddBoolToObject(j, "deterministic", o->deterministic);
    if (S->rb.id[0]) {
        cJSON *r = cJSON_AddObjectToObject(j, "rebalance");
        cJSON_AddStringToObject(r, "id", S->rb.id);
        cJSON_AddStringToObject(r, "status", S->rb.status);
        cJSON_AddStringToObject(r, "message", S->rb.message);
        cJSON_AddNumberToObject(r, "seconds", S->rb.seconds);
    }
    cJSON *st = cJSON_AddArrayToObject(j, "stages");
    for (int i = 0; i < S->n; i++) {
        const sstage_t *x = &S->st[i];
        if (!x->active && x->exited && x->incarnation == 0) continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", x->spec->name);
        cJSON_AddNumberToObject(e, "stage_id", x->spec->stage_id);
        cJSON_AddNumberToObject(e, "pid", x->exited ? 0 : x->pid);
        cJSON_AddNumberToObject(e, "incarnation", (double)x->incarnation);
        cJSON_AddNumberToObject(e, "restarts", x->restarts);
        cJSON_AddNumberToObject(e, "gpu", spec_gpu(x->spec));
        if (x->last_recovery_s > 0) {
            cJSON_AddNumberToObject(e, "last_restart_up_s", x->last_up_s);
            cJSON_AddNumberToObject(e, "last_recovery_s", x->last_recovery_s);
        }
        cJSON_AddStringToObject(e, "process", !x->active && x->exited ? "retired" : x->retiring ? "draining"
                                : x->moving ? "moving" : !x->exited ? "running" : x->restart_at > 0 ? "restarting" : "exited");
        cJSON_AddItemToArray(st, e);
    }
    cJSON *rt = cJSON_AddArrayToObject(j, "routes");
    for (int i = 0; i < S->n; i++) {
        const sstage_t *x = &S->st[i];
        if (!is_target(x) || !x->active || x->retiring) continue;
        cJSON *pr = cJSON_CreateArray();
        cJSON_AddItemToArray(pr, cJSON_CreateNumber(x->spec->stage_id));
        cJSON_AddItemToArray(pr, cJSON_CreateNumber(PIPE_ID_DRAFTER0 + route_of(S, x->spec->stage_id)));
        cJSON_AddItemToArray(rt, pr);
    }
    char *txt = cJSON_Print(j);
    cJSON_Delete(j);
    if (!txt) return;
    char p[4200], tmp[4300];
    snprintf(p, sizeof p, "%s/run.json", o->out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fputs(txt, f);
        fputc('\n', f);
        if (fclose(f) == 0) rename(tmp, p);
    }
    free(txt);
}

static void spawn(sup_t *S, sstage_t *x) {
    const sup_opts_t *o = S->o;
    char log_path[4200];
    snprintf(log_path, sizeof log_path, "%s/logs/%s.log", o->out_dir, x->spec->name);
    char exe[4200];
    snprintf(exe, sizeof exe, "%s/%s", o->bin_dir, x->spec->exe);
    x->incarnation++;
    x->since_progress_s = -1;
    char inc[32];
    snprintf(inc, sizeof inc, "%llu", (unsigned long long)x->incarnation);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        log_error("fork %s: %s", x->spec->name, strerror(errno));
        x->exited = 1;
        return;
    }
    if (pid == 0) {
        /* a stage never outlives its supervisor (even one killed with SIGKILL): SIGUSR1,
         * which the stage runtime turns into one SIGTERM (common/pipe/stage.c) */
        prctl(PR_SET_PDEATHSIG, SIGUSR1);
        if (getppid() != parent) _exit(1);
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); if (fd > 2) close(fd); }
        int nfd = open("/dev/null", O_RDONLY);
        if (nfd >= 0) { dup2(nfd, 0); if (nfd > 0) close(nfd); }
        /* default signal dispositions and mask for the stage */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL); signal(SIGTERM, SIG_DFL); signal(SIGCHLD, SIG_DFL); signal(SIGPIPE, SIG_IGN);
        char thr[16];
        snprintf(thr, sizeof thr, "%d", o->threads_per_stage > 0 ? o->threads_per_stage : 1);
        setenv("OMP_NUM_THREADS", thr, 1);
        setenv("OPENBLAS_NUM_THREADS", thr, 1);
        char *argv[SUP_MAX_ARGS + 6];
        int a = 0;
        argv[a++] = exe;
        /* test hook: DL_TEST_STRIP_GPU=1 drops every "--gpu N" at exec, so the GPU-run
         * logic of this supervisor (placement, GPU rebalance, moves) is tested with CPU
         * stages on a machine without GPUs (test_pipeline_ops, CUDA builds) */
        const char *strip = getenv("DL_TEST_STRIP_GPU");
        for (int i = 0; i < x->spec->argc; i++) {
            if (strip && !strcmp(strip, "1") && !strcmp(x->spec->argv[i], "--gpu") && i + 1 < x->spec->argc) { i++; continue; }
            argv[a++] = x->spec->argv[i];
        }
        argv[a++] = "--incarnation";
        argv[a++] = inc;
        /* a restarted loader resumes after the last applied step (later flags win) */
        char start[32];
        if (x->spec->stage_id == PIPE_ID_LOADER && x->incarnation > 1 && S->last_applied >= 0) {
            snprintf(start, sizeof start, "%lld", (long long)S->last_applied + 1);
            argv[a++] = "--start-step";
            argv[a++] = start;
        }
        /* a restarted optimizer resumes from the run's last checkpoint */
        if (x->spec->stage_id == PIPE_ID_OPTIMIZER && x->incarnation > 1 && S->resume_ckpt[0]) {
            argv[a++] = "--resume";
            argv[a++] = S->resume_ckpt;
        }
        argv[a] = NULL;
        execv(exe, argv);
        fprintf(stderr, "exec %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    x->pid = pid;
    x->exited = 0;
    x->helloed = 0;
    x->restart_at = 0;
    x->active = 1;
    x->t_spawn = clock_mono_s();
    log_info("started %s (pid %d, incarnation %llu), log %s", x->spec->name, (int)pid,
             (unsigned long long)x->incarnation, log_path);
    write_run_json(S);
}

static sstage_t *by_id(sup_t *S, uint32_t id) {
    for (int i = 0; i < S->n; i++) if (S->st[i].spec->stage_id == id) return &S->st[i];
    return NULL;
}

static void send_ctl(sup_t *S, sstage_t *x, proto_ctl_op_t op, const int64_t *ints, uint32_t n) {
    if (!x->helloed || x->exited) return;
    proto_msg_t m;
    proto_msg_init(&m, PROTO_CONTROL);
    m.control.op = op;
    m.control.ints = ints;
    m.control.n_ints = n;
    stage_send(S->bus, x->peer, &m);
}

static void push_route(sup_t *S, sstage_t *x) {
    int64_t pair[2];
    uint32_t t = x->spec->stage_id - PIPE_ID_TARGET0;
    pair[0] = x->spec->stage_id;
    (void)t;
    pair[1] = PIPE_ID_DRAFTER0 + (uint32_t)route_of(S, x->spec->stage_id);
    send_ctl(S, x, PROTO_CTL_ROUTE, pair, 2);
}

/* ---- training-time eval (see sup_opts_t.eval_data) ---- */

/* The step of <out>/checkpoints/latest ("step_<S>"), or 0 when there is none. */
static uint64_t ev_latest_step(const sup_t *S) {
    char p[4200], name[128] = "";
    snprintf(p, sizeof p, "%s/checkpoints/latest", S->o->out_dir);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    unsigned long long st = 0;
    if (!fgets(name, sizeof name, f) || sscanf(name, "step_%llu", &st) != 1) st = 0;
    fclose(f);
    return (uint64_t)st;
}

static void ev_spawn(sup_t *S, uint64_t step) {
    const sup_opts_t *o = S->o;
    char exe[4200], ckpt[4200], dir[4200], log_path[4200];
    char np[16], mnt[16], thr[16];
    snprintf(exe, sizeof exe, "%s/draftline", o->bin_dir);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step_%llu", o->out_dir, (unsigned long long)step);
    snprintf(dir, sizeof dir, "%s/eval", o->out_dir);
    snprintf(S->ev.json, sizeof S->ev.json, "%s/step_%llu.json", dir, (unsigned long long)step);
    snprintf(log_path, sizeof log_path, "%s/logs/eval.log", o->out_dir);
    snprintf(np, sizeof np, "%d", o->eval_prompts);
    snprintf(mnt, sizeof mnt, "%d", o->eval_max_new_tokens);
    snprintf(thr, sizeof thr, "%d", o->threads_per_stage > 0 ? o->threads_per_stage : 1);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) { log_warn("eval: mkdir %s: %s", dir, strerror(errno)); return; }
    unlink(S->ev.json);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) { log_warn("eval: fork: %s", strerror(errno)); return; }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1);
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); if (fd > 2) close(fd); }
        int nfd = open("/dev/null", O_RDONLY);
        if (nfd >= 0) { dup2(nfd, 0); if (nfd > 0) close(nfd); }
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL); signal(SIGTERM, SIG_DFL); signal(SIGCHLD, SIG_DFL); signal(SIGPIPE, SIG_IGN);
        setenv("OMP_NUM_THREADS", thr, 1);
        setenv("OPENBLAS_NUM_THREADS", thr, 1);
        char *argv[] = {exe, "eval", "--target-model", (char *)o->target_model, "--drafter", ckpt,
                        "--data", (char *)o->eval_data, "--num-prompts", np, "--max-new-tokens", mnt,
                        "--no-baseline", "--json", S->ev.json, "--device", "cpu", "--threads", thr, NULL};
        execv(exe, argv);
        fprintf(stderr, "exec %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    S->ev.pid = pid;
    S->ev.step = step;
    S->ev.t0 = clock_mono_s();
    log_info("eval of step %llu started (pid %d), log %s", (unsigned long long)step, (int)pid, log_path);
}

/* Polled every tick while the run is not stopping: when checkpoints/latest moved
 * from step A to B, the newest checkpoint step_<S> with A < S <= B and S a multiple
 * of eval_every (B itself, or one written between two ticks) starts an eval, unless
 * one is running (then it is skipped). */
static void ev_poll(sup_t *S) {
    if (!S->o->eval_data || S->o->eval_every < 1) return;
    uint64_t latest = ev_latest_step(S), prev = S->ev.last_ckpt;
    if (latest == 0 || latest <= prev) return;
    S->ev.last_ckpt = latest;
    uint64_t step = latest - latest % (uint64_t)S->o->eval_every;
    if (step == 0 || step <= prev) return;
    char dir[4200];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s/checkpoints/step_%llu", S->o->out_dir, (unsigned long long)step);
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return;
    if (S->ev.pid > 0) {
        log_warn("eval: skipping the checkpoint of step %llu: the eval of step %llu is still running",
                 (unsigned long long)step, (unsigned long long)S->ev.step);
        return;
    }
    ev_spawn(S, step);
}

/* The eval child exited (status from waitpid): its report goes to metrics.jsonl. */
static void ev_done(sup_t *S, int status) {
    double secs = clock_mono_s() - S->ev.t0;
    uint64_t step = S->ev.step;
    S->ev.pid = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (S->stopping && WIFSIGNALED(status)) log_info("eval of step %llu stopped with the run", (unsigned long long)step);
        else log_warn("eval of step %llu failed (%s %d); see %s/logs/eval.log", (unsigned long long)step,
                      WIFEXITED(status) ? "status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                      S->o->out_dir);
        return;
    }
    char buf[16384];
    FILE *f = fopen(S->ev.json, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    cJSON *r = cJSON_Parse(buf);
    const cJSON *tau = r ? cJSON_GetObjectItemCaseSensitive(r, "tau") : NULL;
    if (!cJSON_IsNumber(tau)) {
        log_warn("eval of step %llu: no tau in %s", (unsigned long long)step, S->ev.json);
        cJSON_Delete(r);
        return;
    }
    cJSON *line = cJSON_CreateObject();
    cJSON_AddNumberToObject(line, "ts", clock_wall_s());
    cJSON_AddStringToObject(line, "stage", "eval");
    cJSON_AddStringToObject(line, "state", "done");   /* read by `draftline monitor` like a stage's line */
    cJSON_AddNumberToObject(line, "step", (double)step);
    cJSON_AddNumberToObject(line, "seconds", secs);
    for (const cJSON *c = r->child; c; c = c->next)   /* the report's scalars */
        if (cJSON_IsNumber(c) && c->string) cJSON_AddNumberToObject(line, c->string, c->valuedouble);
    char *txt = cJSON_PrintUnformatted(line);
    if (txt && S->metrics) {
        fprintf(S->metrics, "%s\n", txt);
        fflush(S->metrics);
    }
    free(txt);
    cJSON_Delete(line);
    printf("eval step %llu: tau %.3f (%d prompts, %.1f s)\n", (unsigned long long)step, tau->valuedouble,
           S->o->eval_prompts, secs);
    fflush(stdout);
    cJSON_Delete(r);
}

static void begin_stop(sup_t *S, const char *why) {
    if (S->stopping) return;
    S->stopping = 1;
    S->t_stop = clock_mono_s();
    log_info("stopping the pipeline: %s", why);
    if (S->rb.running) {
        S->rb.running = 0;
        snprintf(S->rb.status, sizeof S->rb.status, "rejected");
        snprintf(S->rb.message, sizeof S->rb.message, "the run stopped during the rebalance");
    }
    prom_server_destroy(&S->prom);
    write_run_json(S);
    for (int i = 0; i < S->n; i++) {
        sstage_t *x = &S->st[i];
        x->restart_at = 0;
        if (!x->exited && x->pid > 0) kill(x->pid, SIGTERM);
    }
    if (S->ev.pid > 0) kill(S->ev.pid, SIGTERM);   /* the eval child stops with the run */
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s < 0x20) continue;
        fputc(*s, f);
    }
    fputc('"', f);
}

static void on_metrics(sup_t *S, const char *peer, const proto_metrics_t *m) {
    if (S->mon) mon_run_ingest_proto(S->mon, peer, m);
    for (int i = 0; i < S->n; i++)
        if (S->st[i].spec->stage_id == m->stage_id)
            for (uint32_t k = 0; k < m->n_metrics; k++)
                if (!strcmp(m->metrics[k].name, "since_progress_s")) S->st[i].since_progress_s = m->metrics[k].value;
    if (m->role == PROTO_ROLE_DRAFTER) {
        sstage_t *x = NULL;
        for (int i = 0; i < S->n; i++) if (S->st[i].spec->stage_id == m->stage_id) x = &S->st[i];
        double b = 0;
        for (uint32_t i = 0; i < m->n_metrics; i++)
            if (!strcmp(m->metrics[i].name, "inbox_gpu_bytes") || !strcmp(m->metrics[i].name, "inbox_host_bytes"))
                b += m->metrics[i].value;
        if (x) x->inbox_bytes = b;
    }
    if (S->metrics) {
        fprintf(S->metrics, "{\"ts\":%.3f,\"stage\":", (double)m->ts_ns / 1e9);
        json_str(S->metrics, peer);
        fprintf(S->metrics, ",\"stage_id\":%u,\"incarnation\":%llu,\"state\":", m->stage_id,
                (unsigned long long)m->incarnation);
        json_str(S->metrics, m->state);
        for (uint32_t i = 0; i < m->n_metrics; i++) {
            fputc(',', S->metrics);
            json_str(S->metrics, m->metrics[i].name);
            double v = m->metrics[i].value;
            if (isfinite(v)) fprintf(S->metrics, ":%.9g", v);
            else fprintf(S->metrics, ":null");
        }
        fprintf(S->metrics, "}\n");
        fflush(S->metrics);
    }
    if (m->role != PROTO_ROLE_OPTIMIZER || strcmp(m->state, "step") != 0) return;
    double step = -1, loss = NAN, acc_mean = 0, tokens = 0, elapsed = 0;
    S->n_acc = 0;
    for (uint32_t i = 0; i < m->n_metrics; i++) {
        const char *n = m->metrics[i].name;
        double v = m->metrics[i].value;
        if (!strcmp(n, "step")) step = v;
        else if (!strcmp(n, "loss")) loss = v;
        else if (!strcmp(n, "acc_mean")) acc_mean = v;
        else if (!strcmp(n, "tokens")) tokens = v;
        else if (!strcmp(n, "elapsed_s")) elapsed = v;
        else if (!strncmp(n, "acc_", 4) && S->n_acc < 16) S->acc[S->n_acc++] = v;
    }
    if (step < 0) return;
    for (int i = 0; i < S->n; i++) {
        /* the first step applied after a restarted stage's successor said hello */
        sstage_t *x = &S->st[i];
        if (x->t_died <= 0 || x->t_back <= 0) continue;
        double now = clock_mono_s();
        x->last_up_s = x->t_back - x->t_died;
        x->last_recovery_s = now - x->t_died;
        x->t_died = x->t_back = 0;
        log_info("%s recovery: its successor was up %.2f s after its death, step %.0f applied %.2f s after it",
                 x->spec->name, x->last_up_s, step, x->last_recovery_s);
        write_run_json(S);
    }
    if (S->t_opt_died > 0) {
        /* first step of a restarted optimizer: the recovery is over */
        S->last_recovery_s = clock_mono_s() - S->t_opt_died;
        S->t_opt_died = 0;
        log_info("optimizer recovery: first step %.0f applied %.2f s after its death", step, S->last_recovery_s);
    }
    if (!S->have_step) {
        S->t_first_step = clock_mono_s();
        S->tokens_first = tokens;
        S->elapsed_first = elapsed;
    }
    S->have_step = 1;
    if (!S->t_last_step || (uint64_t)step != S->last_step_seen) S->t_last_step = clock_mono_s();
    S->last_step_seen = (uint64_t)step;
    S->last_loss = loss;
    S->last_acc_mean = acc_mean;
    S->tokens = tokens;
    S->elapsed = elapsed;
    if (S->n_losses < SUP_LOSS_HIST) S->losses[S->n_losses++] = loss;
}

static void on_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)bus;
    sup_t *S = arg;
    proto_msg_t m;
    if (stage_decode("supervisor", peer, data, len, &m) < 0) return;
    switch (m.type) {
    case PROTO_HELLO: {
        sstage_t *x = by_id(S, m.hello.stage_id);
        if (!x) { log_warn("hello from unknown stage %u (%s)", m.hello.stage_id, peer); break; }
        x->helloed = 1;
        snprintf(x->peer, sizeof x->peer, "%s", peer);
        if (x->t_died > 0 && x->t_back == 0) x->t_back = clock_mono_s();
        log_info("%s is up (pid %u, incarnation %llu)", peer, m.hello.pid,
                 (unsigned long long)m.hello.incarnation);
        if (m.hello.stage_id >= PIPE_ID_TARGET0) push_route(S, x);
        /* a drafter started by a rebalance: the targets routed to it may move now */
        if (is_drafter(x) && m.hello.incarnation == 1)
            for (int i = 0; i < S->n; i++)
                if (is_target(&S->st[i]) && S->st[i].active && !S->st[i].retiring &&
                    route_of(S, S->st[i].spec->stage_id) == (int)(x->spec->stage_id - PIPE_ID_DRAFTER0))
                    push_route(S, &S->st[i]);
        /* a restarted drafter or loader must hear from the targets again: re-push their
         * routes (a target re-introduces itself to its drafter and the loader) */
        if (((m.hello.stage_id >= PIPE_ID_DRAFTER0 && m.hello.stage_id < PIPE_ID_TARGET0) ||
             m.hello.stage_id == PIPE_ID_LOADER) && m.hello.incarnation > 1)
            for (int i = 0; i < S->n; i++)
                if (S->st[i].spec->stage_id >= PIPE_ID_TARGET0) push_route(S, &S->st[i]);
        /* a restarted drafter: whatever targets wrote into its predecessor's slots
         * since the death was reported is lost too: the loader re-issues every
         * unapplied micro-batch once more (the ledger drops duplicates) */
        if (is_drafter(x) && m.hello.incarnation > 1) {
            int64_t id = x->spec->stage_id;
            sstage_t *L = by_id(S, PIPE_ID_LOADER);
            if (L) send_ctl(S, L, PROTO_CTL_MEMBERSHIP, &id, 1);
        }
        if (S->stopping && x->pid > 0) kill(x->pid, SIGTERM);
        break;
    }
    case PROTO_METRICS:
        on_metrics(S, peer, &m.metrics);
        if (S->pub) bus_send(S->pub, peer, data, len); /* the relay: one PUB, topic = stage */
        break;
    case PROTO_APPLIED: {
        /* news from an optimizer already reaped (queued before its death) would undo
         * the rewind to its checkpoint: only the live incarnation counts */
        sstage_t *O = by_id(S, PIPE_ID_OPTIMIZER);
        if (O && (O->exited || !O->helloed)) break;
        if ((int64_t)m.applied.step > S->last_applied) S->last_applied = (int64_t)m.applied.step;
        if (m.applied.step + 1 >= S->o->max_steps) begin_stop(S, "reached --max-steps");
        break;
    }
    default:
        break;
    }
    proto_msg_free(&m);
}

static double mean_range(const double *v, uint64_t a, uint64_t b) {
    double s = 0;
    uint64_t n = 0;
    for (uint64_t i = a; i < b; i++) if (isfinite(v[i])) { s += v[i]; n++; }
    return n ? s / (double)n : NAN;
}

static void fmt_dur(double s, char *out, size_t cap) {
    if (!isfinite(s) || s < 0) { snprintf(out, cap, "?"); return; }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(out, cap, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, cap, "%lds", t);
}

static void print_progress(sup_t *S) {
    double now = clock_mono_s();
    if (!S->have_step) {
        int up = 0;
        for (int i = 0; i < S->n; i++) up += S->st[i].helloed && !S->st[i].exited;
        printf("[%5.0fs] starting: %d/%d stages up, waiting for the first step\n", now - S->t0, up, S->n);
        fflush(stdout);
        return;
    }
    uint64_t done = S->last_step_seen + 1 - S->o->start_step;
    uint64_t left = S->o->max_steps > S->last_step_seen + 1 ? S->o->max_steps - S->last_step_seen - 1 : 0;
    double dt = now - S->t_first_step;
    double per_step = done > 1 ? dt / (double)(done - 1) : NAN;
    if (S->last_tokens_t > 0 && now > S->last_tokens_t) {
        double r = (S->tokens - S->last_tokens) / (now - S->last_tokens_t);
        if (r > 0 || S->tok_rate == 0) S->tok_rate = r;
    }
    S->last_tokens = S->tokens;
    S->last_tokens_t = now;
    char eta[32], accs[128] = "";
    fmt_dur(per_step * (double)left, eta, sizeof eta);
    int n = 0;
    for (int k = 0; k < S->n_acc && k < 4; k++)
        n += snprintf(accs + n, sizeof accs - (size_t)n, "%s%.2f", k ? " " : "", S->acc[k]);
    double avg_rate = S->elapsed > S->elapsed_first ? (S->tokens - S->tokens_first) / (S->elapsed - S->elapsed_first) : 0;
    printf("[%5.0fs] step %llu/%llu  loss %.4f  acc %.3f [pos 1-4: %s]  %.0f tok/s  ETA %s\n", now - S->t0,
           (unsigned long long)(S->last_step_seen + 1), (unsigned long long)S->o->max_steps, S->last_loss,
           S->last_acc_mean, accs, avg_rate, eta);
    fflush(stdout);
}

/* The run's latest checkpoint (ckpt_resolve of the out dir) into dir[cap] and the step
 * its state.bin header records into *step. 0, or -1 when there is none or it does not
 * read as a checkpoint state. */
static int latest_ckpt_step(const sup_t *S, char *dir, size_t cap, uint64_t *step) {
    if (ckpt_resolve(S->o->out_dir, dir, cap) < 0) return -1;
    char sp[4300];
    snprintf(sp, sizeof sp, "%s/state.bin", dir);
    FILE *f = fopen(sp, "rb");
    ckpt_state_hdr_t h;
    int ok = f && fread(&h, sizeof h, 1, f) == 1 && !memcmp(h.magic, CKPT_MAGIC, 8);
    if (f) fclose(f);
    if (!ok) return -1;
    *step = h.step;
    return 0;
}

static void reap(sup_t *S) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (S->ev.pid > 0 && pid == S->ev.pid) { ev_done(S, status); continue; }
        for (int i = 0; i < S->n; i++) {
            sstage_t *x = &S->st[i];
            if (x->pid != pid) continue;
            x->exited = 1;
            x->status = status;
            x->pid = -1;
            write_run_json(S);
            int clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (S->stopping) {
                log_info("%s exited (%s %d)", x->spec->name, WIFEXITED(status) ? "status" : "signal",
                         WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
                if (x->spec->stage_id == PIPE_ID_OPTIMIZER && !clean && !S->sum->interrupted) {
                    /* The optimizer writes the final checkpoint before it announces the last
                     * step (which starts this stop), so a death now normally lost nothing.
                     * Only a missing final checkpoint fails the run, with how to finish. */
                    char dir[4200];
                    uint64_t ck;
                    if (latest_ckpt_step(S, dir, sizeof dir, &ck) == 0 && ck >= S->o->max_steps) {
                        log_info("the optimizer died while stopping, after its final checkpoint (%s)", dir);
                    } else {
                        log_error("the optimizer died while the run was stopping: its final checkpoint is "
                                  "missing; `draftline run --resume %s` finishes the remaining steps",
                                  S->o->out_dir);
                        S->failed = 1;
                    }
                }
                break;
            }
            (void)clean;
            if (x->retiring || !x->active) {
                /* rebalance: a retired stage is gone for good; its work goes again */
                log_info("%s retired (%s %d)", x->spec->name, WIFEXITED(status) ? "status" : "signal",
                         WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
                x->retiring = 0;
                x->active = 0;
                x->term_at = 0;
                int64_t id = x->spec->stage_id;
                sstage_t *L = by_id(S, PIPE_ID_LOADER);
                if (L) send_ctl(S, L, PROTO_CTL_MEMBERSHIP, &id, 1);
                sstage_t *O = by_id(S, PIPE_ID_OPTIMIZER);
                if (O && is_drafter(x)) send_ctl(S, O, PROTO_CTL_MEMBERSHIP, &id, 1);
                write_run_json(S);
                break;
            }
            if (x->moving) {
                /* GPU rebalance: stopped to start again on its new GPU, at once (not a
                 * failure); its work goes again, as after a death: a target's held
                 * micro-batches, or every unapplied one for a drafter (the ledger drops
                 * duplicates); its successor's hello re-introduces it to its peers */
                log_info("%s stopped (%s %d): starting it on GPU %d", x->spec->name,
                         WIFEXITED(status) ? "status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                         spec_gpu(x->spec));
                x->moving = 0;
                x->planned = 0;
                x->term_at = 0;
                int64_t id = x->spec->stage_id;
                sstage_t *L = by_id(S, PIPE_ID_LOADER);
                if (L) send_ctl(S, L, PROTO_CTL_MEMBERSHIP, &id, 1);
                x->restart_at = clock_mono_s();
                write_run_json(S);
                break;
            }
            if (x->planned) {
                /* killed by the supervisor to re-sync with a restarted optimizer */
                x->planned = 0;
                x->restart_at = clock_mono_s();
                write_run_json(S);
                break;
            }
            log_warn("%s died (%s %d)", x->spec->name, WIFEXITED(status) ? "status" : "signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            if (clock_mono_s() - x->t_spawn > 10) x->fails = 0;  /* it had been healthy */
            if (x->spec->stage_id != PIPE_ID_OPTIMIZER && (x->t_died <= 0 || x->t_back > 0)) {
                x->t_died = clock_mono_s();   /* a death while restarting keeps the first one */
                x->t_back = 0;
            }
            if (x->restarts < S->o->max_restarts && x->spec->stage_id == PIPE_ID_OPTIMIZER) {
                /* The optimizer's state since its last checkpoint is gone: it restarts
                 * from that checkpoint, and the loader and drafters (whose steps ran
                 * ahead of it) are restarted with it: the loader from the checkpoint's
                 * step, the drafters with its weights. Work after the checkpoint is
                 * recomputed (bitwise the same); targets keep running. */
                char dir[4200];
                uint64_t ck = S->o->start_step, h_step;
                S->resume_ckpt[0] = 0;
                if (latest_ckpt_step(S, dir, sizeof dir, &h_step) == 0 && h_step >= S->o->start_step) {
                    ck = h_step;
                    snprintf(S->resume_ckpt, sizeof S->resume_ckpt, "%s", dir);
                }
                S->last_applied = (int64_t)ck - 1;
                uint64_t keep = ck - S->o->start_step;
                if (S->n_losses > keep) S->n_losses = keep;
                S->opt_recoveries++;
                S->t_opt_died = clock_mono_s();
                log_warn("the optimizer died: restarting it from %s (step %llu); the loader and the "
                         "drafters restart with it", S->resume_ckpt[0] ? S->resume_ckpt : "its initial state",
                         (unsigned long long)ck);
                for (int k = 0; k < S->n; k++) {
                    sstage_t *y = &S->st[k];
                    if (y == x || !y->active || y->retiring) continue;
                    if (y->spec->stage_id != PIPE_ID_LOADER && !is_drafter(y)) continue;
                    if (!y->exited && y->pid > 0) { y->planned = 1; kill(y->pid, SIGKILL); }
                    else if (y->restart_at > 0) y->restart_at = clock_mono_s();
                }
            }
            if (x->restarts >= S->o->max_restarts) {
                log_error("%s failed %d times: giving up (see %s/logs/%s.log)", x->spec->name,
                          x->restarts + 1, S->o->out_dir, x->spec->name);
                S->failed = 1;
                begin_stop(S, "a stage keeps failing");
                break;
            }
            double backoff = 0.5 * (double)(1 << (x->fails < 5 ? x->fails : 5));
            x->fails++;
            x->restarts++;
            S->sum->restarts++;
            x->restart_at = clock_mono_s() + backoff;
            /* the loader re-issues the work of a dead target right away; a dead
             * drafter loses what its inbox held, so all unapplied work goes again
             * (the ledger drops the duplicates) */
            if (x->spec->stage_id >= PIPE_ID_DRAFTER0) {
                int64_t id = x->spec->stage_id;
                sstage_t *L = by_id(S, PIPE_ID_LOADER);
                if (L) send_ctl(S, L, PROTO_CTL_MEMBERSHIP, &id, 1);
            }
            log_info("restarting %s in %.1f s", x->spec->name, backoff);
            write_run_json(S);
            break;
        }
    }
}

/* ---- live rebalance (see supervisor.h and docs/ARCHITECTURE.md) ---- */

static void rb_write_result(sup_t *S) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", S->rb.id);
    cJSON_AddStringToObject(j, "status", S->rb.status);
    cJSON_AddStringToObject(j, "message", S->rb.message);
    cJSON_AddNumberToObject(j, "seconds", S->rb.seconds);
    cJSON_AddNumberToObject(j, "targets", S->nt);
    cJSON_AddNumberToObject(j, "drafters", S->nd);
    if (S->gpu_mode) {
        /* the live placement (run.json has the same lists) */
        char b[2][RBPLAN_MAX * 6];
        int g[2][RBPLAN_MAX], n[2] = {0, 0};
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < (r ? S->nd : S->nt) && i < RBPLAN_MAX; i++) {
                sstage_t *x = by_id(S, (r ? PIPE_ID_DRAFTER0 : PIPE_ID_TARGET0) + (uint32_t)i);
                if (x) g[r][n[r]++] = spec_gpu(x->spec);
            }
        cJSON_AddStringToObject(j, "target_gpus", rbplan_format_gpus(g[0], n[0], b[0], sizeof b[0]));
        cJSON_AddStringToObject(j, "drafter_gpus", rbplan_format_gpus(g[1], n[1], b[1], sizeof b[1]));
    }
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!txt) return;
    char p[4200], tmp[4300];
    snprintf(p, sizeof p, "%s/" SUP_REBALANCE_RESULT, S->o->out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%s\n", txt);
        if (fclose(f) == 0) rename(tmp, p);
    }
    free(txt);
    write_run_json(S);
}

/* A spec of x the rebalance may change: x's own copy in S->xspec (made on first use
 * from the run's spec, which stays untouched). NULL when S->xspec is full. */
static sup_stage_spec_t *spec_own(sup_t *S, sstage_t *x) {
    if (x->spec >= S->xspec && x->spec < S->xspec + SUP_MAX_STAGES) return (sup_stage_spec_t *)x->spec;
    if (S->nx >= SUP_MAX_STAGES) return NULL;
    sup_stage_spec_t *sp = &S->xspec[S->nx++];
    *sp = *x->spec;
    x->spec = sp;
    return sp;
}

/* Sets the value of --gpu in x's spec (the next start of x uses it). Returns 0, or -1
 * (no room for a spec copy, no --gpu flag, out of memory). */
static int spec_set_gpu(sup_t *S, sstage_t *x, int gpu) {
    if (spec_gpu(x->spec) == gpu) return 0;
    sup_stage_spec_t *sp = spec_own(S, x);
    if (!sp) return -1;
    for (int a = 0; a + 1 < sp->argc; a++)
        if (!strcmp(sp->argv[a], "--gpu")) {
            char v[16];
            snprintf(v, sizeof v, "%d", gpu);
            char *d = strdup(v);   /* lives as long as the run (a few bytes per change) */
            if (!d) return -1;
            sp->argv[a + 1] = d;
            return 0;
        }
    return -1;
}

/* The stage slot of target/drafter idx: an existing one, or a new one whose spec is
 * target0's/drafter0's with --index (and a target's --drafter) replaced. */
static sstage_t *rb_slot(sup_t *S, int target, int idx) {
    uint32_t id = (target ? PIPE_ID_TARGET0 : PIPE_ID_DRAFTER0) + (uint32_t)idx;
    sstage_t *x = by_id(S, id);
    if (x) return x;
    sstage_t *tpl = by_id(S, target ? PIPE_ID_TARGET0 : PIPE_ID_DRAFTER0);
    if (!tpl || S->n >= SUP_MAX_STAGES || S->nx >= SUP_MAX_STAGES) return NULL;
    sup_stage_spec_t *sp = &S->xspec[S->nx++];
    *sp = *tpl->spec;
    snprintf(sp->name, sizeof sp->name, "%s%d", target ? "target" : "drafter", idx);
    sp->stage_id = id;
    for (int a = 0; a + 1 < sp->argc; a++) {
        char v[16];
        if (!strcmp(sp->argv[a], "--index")) snprintf(v, sizeof v, "%d", idx);
        else if (!strcmp(sp->argv[a], "--drafter")) snprintf(v, sizeof v, "%d", route_of(S, id));
        else continue;
        char *d = strdup(v);   /* lives as long as the run (a few bytes per added stage) */
        if (d) sp->argv[a + 1] = d;
    }
    x = &S->st[S->n++];
    memset(x, 0, sizeof *x);
    x->spec = sp;
    x->exited = 1;
    x->pid = -1;
    return x;
}

static void rb_reject(sup_t *S, const char *id, const char *msg) {
    snprintf(S->rb.id, sizeof S->rb.id, "%s", id);
    snprintf(S->rb.status, sizeof S->rb.status, "rejected");
    snprintf(S->rb.message, sizeof S->rb.message, "%s", msg);
    S->rb.seconds = 0;
    log_warn("rebalance %s rejected: %s", id, msg);
    rb_write_result(S);
}

/* The live placement of targets (r = 1) or drafters (r = 0) for rbplan_make: the GPU
 * of each index's stage that is part of the topology (running, or restarting after a
 * crash), -1 where there is none (never started, retired, draining). */
static void rb_live_gpus(sup_t *S, int r, int *out) {
    for (int i = 0; i < RBPLAN_MAX; i++) {
        sstage_t *x = by_id(S, (r ? PIPE_ID_TARGET0 : PIPE_ID_DRAFTER0) + (uint32_t)i);
        out[i] = x && x->active && !x->retiring ? spec_gpu(x->spec) : -1;
    }
}

static void rb_poll(sup_t *S) {
    char p[4200];
    snprintf(p, sizeof p, "%s/" SUP_REBALANCE_REQUEST, S->o->out_dir);
    FILE *f = fopen(p, "rb");
    if (!f) return;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    unlink(p);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    const cJSON *jid = j ? cJSON_GetObjectItemCaseSensitive(j, "id") : NULL;
    const cJSON *jt = j ? cJSON_GetObjectItemCaseSensitive(j, "targets") : NULL;
    const cJSON *jd = j ? cJSON_GetObjectItemCaseSensitive(j, "drafters") : NULL;
    const cJSON *jtg = j ? cJSON_GetObjectItemCaseSensitive(j, "target_gpus") : NULL;
    const cJSON *jdg = j ? cJSON_GetObjectItemCaseSensitive(j, "drafter_gpus") : NULL;
    char id[64];
    snprintf(id, sizeof id, "%s", cJSON_IsString(jid) ? jid->valuestring : "?");
    char msg[256];
    int N = cJSON_IsNumber(jt) ? jt->valueint : -1, M = cJSON_IsNumber(jd) ? jd->valueint : -1;
    const char *tgs = cJSON_IsString(jtg) ? jtg->valuestring : "", *dgs = cJSON_IsString(jdg) ? jdg->valuestring : "";
    int gpu_req = tgs[0] || dgs[0];
    /* GPU runs: the plan per stage index (common/pipe/rbplan.h) */
    rbplan_t plan;
    memset(&plan, 0, sizeof plan);
    int plan_rc = 0;
    char cur_tg[RBPLAN_MAX * 6] = "", cur_dg[RBPLAN_MAX * 6] = "";
    if (S->gpu_mode) {
        int cg[RBPLAN_MAX], k = 0;
        rb_live_gpus(S, 1, cg);
        for (int i = 0; i < RBPLAN_MAX && cg[i] >= 0; i++) k = i + 1;
        rbplan_format_gpus(cg, k, cur_tg, sizeof cur_tg);
        rb_live_gpus(S, 0, cg);
        k = 0;
        for (int i = 0; i < RBPLAN_MAX && cg[i] >= 0; i++) k = i + 1;
        rbplan_format_gpus(cg, k, cur_dg, sizeof cur_dg);
    }
    if (j && S->gpu_mode && gpu_req) {
        int tg[RBPLAN_MAX], dg[RBPLAN_MAX], ct[RBPLAN_MAX], cd[RBPLAN_MAX];
        int nt = rbplan_parse_gpus("--target-gpus", tgs, tg, RBPLAN_MAX);
        int nd = nt < 0 ? nt : rbplan_parse_gpus("--drafter-gpus", dgs, dg, RBPLAN_MAX);
        rb_live_gpus(S, 1, ct);
        rb_live_gpus(S, 0, cd);
        plan_rc = nd < 0 ? nd : rbplan_make(ct, cd, tg, nt, dg, nd, &plan);
        if (plan_rc == 0) { N = plan.n_targets; M = plan.n_drafters; }
    }
    if (!j) rb_reject(S, id, "malformed request");
    else if (S->stopping) rb_reject(S, id, "the run is stopping");
    else if (S->rb.running) rb_reject(S, id, "a rebalance is already running");
    else if (gpu_req && !S->gpu_mode)
        rb_reject(S, id, "--target-gpus/--drafter-gpus: this run is in CPU mode (use --targets/--drafters)");
    else if (!gpu_req && S->gpu_mode) {
        snprintf(msg, sizeof msg, "this run is in GPU mode: give the new placement as --target-gpus LIST "
                 "--drafter-gpus LIST (now --target-gpus %s --drafter-gpus %s)", cur_tg, cur_dg);
        rb_reject(S, id, msg);
    } else if (S->gpu_mode && plan_rc < 0)
        rb_reject(S, id, dl_errmsg());
    else if (N < 1 || N > PIPE_MAX_TARGETS || M < 1 || M > PIPE_MAX_DRAFTERS)
        rb_reject(S, id, "targets and drafters must be 1..64");
    else if (S->o->lookahead > 0 && S->o->inbox_slots - (N + M - 1) / M < S->o->lookahead) {
        snprintf(msg, sizeof msg, "%d targets per drafter leave less than the loader's lookahead (%d) of a "
                 "drafter's %d inbox slots: the pipeline could deadlock (start the run with a larger --inbox-gb)",
                 (N + M - 1) / M, S->o->lookahead, S->o->inbox_slots);
        rb_reject(S, id, msg);
    } else if (S->gpu_mode ? plan.n_start + plan.n_move + plan.n_retire == 0 : N == S->nt && M == S->nd) {
        snprintf(S->rb.id, sizeof S->rb.id, "%s", id);
        snprintf(S->rb.status, sizeof S->rb.status, "done");
        if (S->gpu_mode)
            snprintf(S->rb.message, sizeof S->rb.message, "already targets on GPUs %s, drafters on GPUs %s",
                     cur_tg, cur_dg);
        else
            snprintf(S->rb.message, sizeof S->rb.message, "already %d target(s), %d drafter(s)", N, M);
        S->rb.seconds = 0;
        rb_write_result(S);
    } else {
        snprintf(S->rb.id, sizeof S->rb.id, "%s", id);
        S->rb.running = 1;
        S->rb.t0 = clock_mono_s();
        S->rb.from_t = S->nt; S->rb.from_d = S->nd; S->rb.to_t = N; S->rb.to_d = M;
        S->rb.to_gpus[0] = 0;
        if (S->gpu_mode) {
            char a[RBPLAN_MAX * 6], b[RBPLAN_MAX * 6];
            snprintf(S->rb.to_gpus, sizeof S->rb.to_gpus, " (targets on GPUs %s, drafters on GPUs %s; %d kept, "
                     "%d started, %d moved, %d retired)", rbplan_format_gpus(plan.target_gpu, N, a, sizeof a),
                     rbplan_format_gpus(plan.drafter_gpu, M, b, sizeof b), plan.n_keep, plan.n_start,
                     plan.n_move, plan.n_retire);
        }
        snprintf(S->rb.status, sizeof S->rb.status, "running");
        snprintf(S->rb.message, sizeof S->rb.message, "%d+%d -> %d+%d%s", S->nt, S->nd, N, M, S->rb.to_gpus);
        log_info("rebalance %s: %d target(s) + %d drafter(s) -> %d + %d%s", id, S->nt, S->nd, N, M, S->rb.to_gpus);
        S->nt = N;
        S->nd = M;
        int ok = 1;
        for (int i = 0; i < PIPE_MAX_TARGETS && ok; i++) {
            sstage_t *x = by_id(S, PIPE_ID_TARGET0 + (uint32_t)i);
            if (i >= N && x && x->active && !x->retiring) {
                x->retiring = 1;    /* the loader re-issues what it held when it is gone */
                x->term_at = clock_mono_s();
                if (!x->exited && x->pid > 0) kill(x->pid, SIGTERM);
                else x->active = 0, x->retiring = 0, x->restart_at = 0;
            }
        }
        for (int i = 0; i < PIPE_MAX_DRAFTERS; i++) {
            sstage_t *x = by_id(S, PIPE_ID_DRAFTER0 + (uint32_t)i);
            if (i >= M && x && x->active && !x->retiring) {
                x->retiring = 1;    /* drains, then SIGTERM (rb_tick) */
                x->term_at = 0;
                x->retire_t0 = clock_mono_s();
                x->retire_after = S->last_applied;
                if (x->exited) x->active = 0, x->retiring = 0, x->restart_at = 0;
            }
        }
        /* GPU runs: a stage of an index that stays gets its (new) GPU; one running on
         * another GPU is stopped and started at once on the new one (reap) */
        for (int r = 0; r < 2 && S->gpu_mode && ok; r++)
            for (int i = 0; i < (r ? N : M) && ok; i++) {
                sstage_t *x = rb_slot(S, r, i);
                int g = r ? plan.target_gpu[i] : plan.drafter_gpu[i], from = x ? spec_gpu(x->spec) : -1;
                if (!x || spec_set_gpu(S, x, g) < 0) { ok = 0; break; }
                if ((r ? plan.target[i] : plan.drafter[i]) != RBPLAN_MOVE || !x->active) continue;
                if (!x->exited && x->pid > 0) {
                    x->moving = 1;
                    x->term_at = clock_mono_s();
                    kill(x->pid, SIGTERM);
                    log_info("%s: moving from GPU %d to GPU %d (stopped, then started again)", x->spec->name,
                             from, g);
                } else if (x->restart_at > 0) {
                    x->restart_at = clock_mono_s();   /* it was restarting anyway: on its new GPU, now */
                }
            }
        for (int i = 0; i < M && ok; i++) {
            sstage_t *x = rb_slot(S, 0, i);
            if (!x) ok = 0;
            else if (!x->active) spawn(S, x);
        }
        for (int i = 0; i < S->n; i++)   /* re-route the targets that stay */
            if (is_target(&S->st[i]) && S->st[i].active && !S->st[i].retiring) push_route(S, &S->st[i]);
        for (int i = 0; i < N && ok; i++) {
            sstage_t *x = rb_slot(S, 1, i);
            if (!x) ok = 0;
            else if (!x->active) spawn(S, x);
        }
        if (!ok) log_error("rebalance %s: no room for more stages", id);
        rb_write_result(S);
    }
    cJSON_Delete(j);
}

static void rb_tick(sup_t *S) {
    if (!S->rb.running) return;
    double now = clock_mono_s();
    int pending = 0;
    for (int i = 0; i < S->n; i++) {
        sstage_t *x = &S->st[i];
        if (x->retiring) {
            pending++;
            /* a retiring drafter is fed no more (targets re-routed); it stops once a
             * step was applied after the re-route and its inbox is empty, or after 15 s
             * (what it still held is re-issued by the loader) */
            if (is_drafter(x) && x->retire_t0 > 0 && !x->exited && x->pid > 0 &&
                ((S->last_applied > x->retire_after && x->inbox_bytes == 0) || now - x->retire_t0 > 15)) {
                log_info("%s drained: stopping it", x->spec->name);
                kill(x->pid, SIGTERM);
                x->retire_t0 = -1;
                x->term_at = now;
            }
            if (x->term_at > 0 && now - x->term_at > 20 && !x->exited && x->pid > 0) {
                log_warn("%s did not stop in 20 s after SIGTERM: SIGKILL", x->spec->name);
                kill(x->pid, SIGKILL);
                x->term_at = now;
            }
        } else if (x->moving) {
            /* GPU rebalance: stopped to start on another GPU (reap starts it again) */
            pending++;
            if (x->term_at > 0 && now - x->term_at > 20 && !x->exited && x->pid > 0) {
                log_warn("%s did not stop in 20 s after SIGTERM: SIGKILL", x->spec->name);
                kill(x->pid, SIGKILL);
                x->term_at = now;
            }
        } else if (x->active && (x->exited || !x->helloed)) {
            pending++;
        }
    }
    if (!pending) {
        S->rb.running = 0;
        S->rb.seconds = now - S->rb.t0;
        snprintf(S->rb.status, sizeof S->rb.status, "done");
        snprintf(S->rb.message, sizeof S->rb.message, "%d+%d -> %d+%d in %.2f s%s", S->rb.from_t, S->rb.from_d,
                 S->rb.to_t, S->rb.to_d, S->rb.seconds, S->rb.to_gpus);
        log_info("rebalance %s done: %s", S->rb.id, S->rb.message);
        rb_write_result(S);
    }
}

static void on_signal(uv_signal_t *h, int signum) {
    sup_t *S = h->data;
    if (signum == SIGCHLD) { reap(S); return; }
    /* the same Ctrl-C can arrive twice (e.g. through timeout(1)): only a later one kills */
    if (S->stopping && clock_mono_s() - S->t_stop < 2.0) return;
    if (S->stopping && !S->sum->signal) {
        /* already stopping on its own (reached --max-steps: `draftline stop` raced the
         * end): the final checkpoint is being written, so this first signal neither
         * kills the stages nor makes the finished run an interrupted one */
        S->sum->signal = signum;
        S->t_stop = clock_mono_s();
        log_info("signal %d: the run is already stopping; a second signal kills every stage", signum);
        return;
    }
    if (S->stopping) {
        log_warn("second signal: killing every stage");
        for (int i = 0; i < S->n; i++) if (S->st[i].pid > 0) kill(S->st[i].pid, SIGKILL);
        if (S->ev.pid > 0) kill(S->ev.pid, SIGKILL);
        return;
    }
    S->sum->interrupted = 1;
    if (!S->sum->signal) S->sum->signal = signum;
    begin_stop(S, signum == SIGINT ? "interrupted (Ctrl-C); stages write a final checkpoint" : "SIGTERM");
}

/* A run with no applied step for max(60 s, 10 x the mean step time) says so in its own
 * output once, and again every minute while it lasts: the stages whose own progress
 * counter (since_progress_s) is as old, and where to look (`draftline monitor`). */
static void stall_check(sup_t *S, double now) {
    double since = now - (S->have_step ? S->t_last_step : S->t0);
    uint64_t done = S->have_step ? S->last_step_seen + 1 - S->o->start_step : 0;
    double mean = done > 1 ? (S->t_last_step - S->t_first_step) / (double)(done - 1) : 0;
    const char *env = getenv("DL_STALL_WARN_S");   /* tests: a shorter floor than 60 s */
    double floor_s = env && atof(env) > 0 ? atof(env) : 60;
    double limit = 10 * mean > floor_s ? 10 * mean : floor_s;
    if (since < limit || now - S->last_stall_warn < (floor_s < 60 ? floor_s : 60)) return;
    S->last_stall_warn = now;
    char who[512] = "";
    size_t n = 0;
    for (int i = 0; i < S->n; i++) {
        sstage_t *x = &S->st[i];
        if (!x->active || x->exited || !x->helloed) continue;
        if (x->since_progress_s >= 0 && x->since_progress_s < limit) continue;
        n += (size_t)snprintf(who + n, n < sizeof who ? sizeof who - n : 0, "%s%s", n ? ", " : "", x->spec->name);
        if (n >= sizeof who) break;
    }
    printf("[%5.0fs] WARNING: no step applied for %.0f s%s; stages with no progress: %s. See `draftline "
           "monitor --run %s` (and %s/logs)\n", now - S->t0, since, S->have_step ? "" : " (none yet)",
           who[0] ? who : "(every stage reports progress: waiting on each other?)", S->o->out_dir, S->o->out_dir);
    fflush(stdout);
}

static void on_tick(uv_timer_t *t) {
    sup_t *S = t->data;
    double now = clock_mono_s();
    reap(S);
    for (int i = 0; i < S->n; i++) {
        sstage_t *x = &S->st[i];
        if (x->exited && x->restart_at > 0 && now >= x->restart_at && !S->stopping && x->active) spawn(S, x);
    }
    if (S->stopping) {
        int alive = 0;
        for (int i = 0; i < S->n; i++) alive += !S->st[i].exited;
        alive += S->ev.pid > 0;
        if (!alive) {
            uv_timer_stop(&S->tick);
            uv_close((uv_handle_t *)&S->tick, NULL);
            uv_close((uv_handle_t *)&S->sig_int, NULL);
            uv_close((uv_handle_t *)&S->sig_term, NULL);
            uv_close((uv_handle_t *)&S->sig_chld, NULL);
            bus_close(S->bus, NULL, NULL);
            if (S->pub) bus_close(S->pub, NULL, NULL);
            return;
        }
        if (now - S->t_stop > 60) {
            for (int i = 0; i < S->n; i++)
                if (S->st[i].pid > 0) { log_warn("%s did not stop in 60 s: SIGKILL", S->st[i].spec->name); kill(S->st[i].pid, SIGKILL); }
            if (S->ev.pid > 0) kill(S->ev.pid, SIGKILL);
        }
        return;
    }
    rb_poll(S);
    rb_tick(S);
    ev_poll(S);
    if (now - S->last_progress_print >= S->o->progress_every_s) {
        S->last_progress_print = now;
        print_progress(S);
    }
    stall_check(S, now);
}

/* One supervisor per run dir: the caller (cmd_run) holds the exclusive flock on
 * <out>/run.lock for the whole run (taken there, before the dir is touched: a second
 * flock here, on another fd of the same process, would conflict with it). */
int supervisor_run(const sup_opts_t *o, sup_summary_t *sum) {
    static sup_t S;
    memset(&S, 0, sizeof S);
    memset(sum, 0, sizeof *sum);
    S.o = o;
    S.sum = sum;
    S.losses = calloc(SUP_LOSS_HIST, sizeof(double));
    S.last_applied = (int64_t)o->start_step - 1;
    if (!S.losses) return dl_seterr(DL_ENOMEM, "supervisor: out of memory");
    uv_loop_init(&S.loop);
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", o->out_dir);
    S.metrics = fopen(path, "a");
    char ep[BUS_ENDPOINT_MAX];
    DL_TRY(bus_endpoint(o->sock_dir, "sup", ep, sizeof ep));
    bus_opts_t bo = {0};
    bo.kind = BUS_ROUTER;
    bo.name = "supervisor";
    bo.heartbeat_interval_ms = PIPE_HEARTBEAT_MS;
    bo.heartbeat_timeout_ms = PIPE_DEAD_MS;
    S.bus = bus_new(&S.loop, &bo);
    if (!S.bus) return DL_EIO;
    DL_TRY(bus_bind(S.bus, ep));
    bus_on_message(S.bus, on_msg, &S);
    S.nt = o->n_targets;
    S.nd = o->n_drafters;
    S.mon = mon_run_new();
    /* the metrics relay: every stage's METRICS payload on one PUB (topic = stage name) */
    if (bus_endpoint(o->sock_dir, "metrics", ep, sizeof ep) == 0) {
        bus_opts_t po = {0};
        po.kind = BUS_PUB;
        po.name = "metrics";
        S.pub = bus_new(&S.loop, &po);
        if (S.pub && bus_bind(S.pub, ep) < 0) { log_warn("metrics relay %s: %s", ep, dl_errmsg()); bus_destroy(&S.pub); }
    }
    if (o->metrics_port >= 0 && S.mon) {
        S.prom = prom_server_new(&S.loop, o->metrics_port, mon_prom_render_run, S.mon);
        if (!S.prom) log_warn("--metrics-port %d: %s (no Prometheus endpoint)", o->metrics_port, dl_errmsg());
        else {
            S.prom_port = prom_server_port(S.prom);
            log_info("Prometheus metrics on http://0.0.0.0:%d/metrics", S.prom_port);
        }
    }
    /* SIGCHLD, SIGINT, SIGTERM through the loop */
    uv_signal_init(&S.loop, &S.sig_int); S.sig_int.data = &S;
    uv_signal_init(&S.loop, &S.sig_term); S.sig_term.data = &S;
    uv_signal_init(&S.loop, &S.sig_chld); S.sig_chld.data = &S;
    uv_signal_start(&S.sig_int, on_signal, SIGINT);
    uv_signal_start(&S.sig_term, on_signal, SIGTERM);
    uv_signal_start(&S.sig_chld, on_signal, SIGCHLD);
    uv_timer_init(&S.loop, &S.tick);
    S.tick.data = &S;
    S.t0 = clock_mono_s();
    S.last_progress_print = S.t0;
    S.ev.last_ckpt = ev_latest_step(&S);   /* a resumed run's checkpoint is not evaluated again */
    {
        /* a request left by an earlier `draftline rebalance` that timed out (its run was
         * not there to answer) is never applied to this run */
        char rq[4200];
        snprintf(rq, sizeof rq, "%s/" SUP_REBALANCE_REQUEST, o->out_dir);
        if (unlink(rq) == 0) log_warn("removed a stale %s (left by an earlier `draftline rebalance`); not applied", rq);
    }
    S.n = o->n_stages;
    for (int i = 0; i < S.n; i++) S.st[i].spec = &o->stages[i];
    for (int i = 0; i < S.n; i++) S.gpu_mode |= is_target(&S.st[i]) && spec_gpu(S.st[i].spec) >= 0;
    for (int i = 0; i < S.n; i++) spawn(&S, &S.st[i]);
    uv_timer_start(&S.tick, on_tick, 200, 200);
    uv_run(&S.loop, UV_RUN_DEFAULT);
    bus_destroy(&S.bus);
    bus_destroy(&S.pub);
    prom_server_destroy(&S.prom);
    uv_run(&S.loop, UV_RUN_DEFAULT);
    mon_run_destroy(&S.mon);
    S.done = 1;
    write_run_json(&S);
    uv_loop_close(&S.loop);
    if (S.metrics) fclose(S.metrics);
    int swept = slab_sweep(o->run_id);
    if (swept > 0) log_warn("removed %d leftover shared-memory object(s) of run %s", swept, o->run_id);
    sum->steps = S.have_step ? S.last_step_seen + 1 : o->start_step;
    /* a signal that arrived as the last step was applied (`draftline stop` racing
     * --max-steps) did not cut the run short: it finished its steps */
    if (sum->interrupted && sum->steps >= o->max_steps) sum->interrupted = 0, sum->signal = 0;
    uint64_t n = S.n_losses;
    uint64_t k = n < 10 ? n : 10;
    sum->loss_first10 = mean_range(S.losses, 0, k);
    sum->loss_last10 = mean_range(S.losses, n - k, n);
    sum->n_first = sum->n_last = (int)k;
    sum->tokens = (uint64_t)S.tokens;
    /* steady state: from the first applied step to the last (model loading excluded) */
    sum->seconds = S.elapsed - S.elapsed_first;
    sum->tokens_per_s = sum->seconds > 0 ? (S.tokens - S.tokens_first) / sum->seconds : 0;
    sum->failed = S.failed;
    snprintf(path, sizeof path, "%s/checkpoints/latest", o->out_dir);
    FILE *f = fopen(path, "r");
    unsigned long long latest_step = 0;
    int have_latest = 0;
    if (f) {
        char name[128] = {0};
        if (fgets(name, sizeof name, f)) {
            name[strcspn(name, "\r\n")] = 0;
            snprintf(sum->checkpoint, sizeof sum->checkpoint, "%s/checkpoints/%s", o->out_dir, name);
            have_latest = sscanf(name, "step_%llu", &latest_step) == 1;
        }
        fclose(f);
    }
    free(S.losses);
    /* The optimizer logs a failed checkpoint write (disk full) and goes on; a run whose
     * last applied step has no checkpoint must not end as a success. */
    if (!S.failed && sum->steps > o->start_step && (!have_latest || latest_step < sum->steps)) {
        sum->failed = 1;
        return dl_seterr(DL_EIO, "the final checkpoint (step_%llu) was not written (disk full? see %s/logs/optimizer.log); "
                         "the last saved one is %s", (unsigned long long)sum->steps, o->out_dir,
                         sum->checkpoint[0] ? sum->checkpoint : "(none)");
    }
    return S.failed ? dl_seterr(DL_ESTATE, "the run failed (a stage died beyond its restarts, or the optimizer died; see above and %s/logs)", o->out_dir) : 0;
}

int sup_pid_is_supervisor(int pid) {
    if (pid <= 0) return 0;
    char p[64], buf[4096];
    snprintf(p, sizeof p, "/proc/%d/cmdline", pid);
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *a1 = buf + strlen(buf) + 1;   /* argv is NUL-separated */
    return n > 0 && strstr(buf, "draftline") && a1 < buf + n && !strcmp(a1, "run");
}

int sup_run_live(const char *dir, int *pid) {
    *pid = 0;
    char p[4200];
    snprintf(p, sizeof p, "%s/run.json", dir);
    FILE *f = fopen(p, "rb");
    if (!f) return dl_seterr(DL_ENOENT, "%s: %s", p, strerror(errno));
    static char txt[1 << 16];
    size_t n = fread(txt, 1, sizeof txt - 1, f);
    fclose(f);
    txt[n] = 0;
    cJSON *j = cJSON_Parse(txt);
    const cJSON *pj = j ? cJSON_GetObjectItemCaseSensitive(j, "supervisor_pid") : NULL;
    if (!cJSON_IsNumber(pj)) { cJSON_Delete(j); return dl_seterr(DL_ENOENT, "%s: no supervisor_pid", p); }
    *pid = pj->valueint;
    cJSON_Delete(j);
    return sup_pid_is_supervisor(*pid);
}
