/* Supervisor, process table: spawn, reap, restarts with backoff, routes (see sup_int.h). */
#include "supervisor/sup_int.h"
#include "supervisor/nodes.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/ompwait.h"
#include "common/pipe/ckpt.h"
#include "common/pipe/runcfg.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* The last ERROR line of the stage log at path (its last 16 KiB; the text after "ERROR ")
 * into out (cap bytes). 1 when found; 0 (out "") when the log is missing (a stage on
 * another node) or holds none. */
static int last_error_line(const char *path, char *out, size_t cap) {
    out[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char buf[16384];
    long at = 0;
    if (fseek(f, 0, SEEK_END) == 0 && (at = ftell(f)) > (long)sizeof buf - 1) at -= (long)sizeof buf - 1;
    else at = 0;
    size_t n = fseek(f, at, SEEK_SET) == 0 ? fread(buf, 1, sizeof buf - 1, f) : 0;
    fclose(f);
    buf[n] = 0;
    for (char *l = buf, *e; l && *l; l = e ? e + 1 : NULL) {
        e = strchr(l, '\n');
        if (e) *e = 0;
        char *k = strstr(l, " ERROR ");
        if (k) snprintf(out, cap, "%s", k + 7);
    }
    return out[0] != 0;
}

/* The GPU ordinal a stage spec starts on, or -1 (CPU stage, or the loader; the
 * optimizer's GPU, when it has one, is not moved by a rebalance). */
int sup__spec_gpu(const sup_stage_spec_t *sp) { return sp->gpu; }

/* The live number of target (drafter: r = 0) slots: the topology's, or more while
 * stages past it are still known (retiring). */
static int live_count(const sup_t *S, int r) {
    int n = r ? S->nt : S->nd;
    for (int i = 0; i < S->n; i++) {
        const sstage_t *x = &S->st[i];
        if (r ? !is_target(x) : !is_drafter(x)) continue;
        int k = (int)(x->spec->stage_id - (r ? PIPE_ID_TARGET0 : PIPE_ID_DRAFTER0)) + 1;
        if (k > n) n = k;
    }
    int cap = r ? PIPE_MAX_TARGETS : PIPE_MAX_DRAFTERS;
    return n < cap ? n : cap;
}

void sup__send_config(sup_t *S, sstage_t *x, const char *peer, uint64_t inc) {
    static run_config_t c;   /* ~25 KB: not on the stack */
    c = *S->o->cfg;
    /* the live placement and routes (a rebalance changes them) */
    c.n_targets = live_count(S, 1);
    c.n_drafters = live_count(S, 0);
    runcfg_clear_gpus(&c);
    for (int i = 0; i < c.n_targets; i++) {
        sstage_t *y = sup__by_id(S, PIPE_ID_TARGET0 + (uint32_t)i);
        c.target_gpu[i] = y ? y->spec->gpu : -1;
        c.target_drafter[i] = route_of(S, PIPE_ID_TARGET0 + (uint32_t)i);
    }
    for (int i = 0; i < c.n_drafters; i++) {
        sstage_t *y = sup__by_id(S, PIPE_ID_DRAFTER0 + (uint32_t)i);
        c.drafter_gpu[i] = y ? y->spec->gpu : -1;
    }
    sstage_t *O = sup__by_id(S, PIPE_ID_OPTIMIZER);
    c.optimizer_gpu = O ? O->spec->gpu : -1;
    /* test hook strip_gpu=1: every stage on CPU, so the GPU-run logic of this supervisor
     * (placement, GPU rebalance, moves) is tested on a machine without GPUs */
    if (S->strip_gpu) runcfg_clear_gpus(&c);
    /* what this incarnation was started for (sup__spawn) */
    if (x->spec->stage_id == PIPE_ID_LOADER && x->start_step >= 0) c.start_step = (uint64_t)x->start_step;
    if (x->spec->stage_id == PIPE_ID_OPTIMIZER && x->from_ckpt)
        snprintf(c.resume_dir, sizeof c.resume_dir, "%.4000s", S->resume_ckpt);
    sup__net_config(S, x, &c);
    proto_msg_t m;
    runcfg_to_msg(&c, x->spec->stage_id, inc, &m);
    if (stage_send(S->bus, peer, &m) == 0)
        log_debug("run configuration sent to %s (incarnation %llu)", peer, (unsigned long long)inc);
}


/* In a child just forked by the supervisor (parent: the supervisor's pid): dies with the
 * supervisor (pdeathsig), stdout/stderr appended to log_path, stdin /dev/null, default
 * signal dispositions and an empty mask, OMP_NUM_THREADS/OPENBLAS_NUM_THREADS = threads
 * (1 when <= 0), OMP_WAIT_POLICY=passive unless set. _exit(1) when the supervisor is already gone. */
void sup__child_setup(pid_t parent, int pdeathsig, const char *log_path, int threads) {
    prctl(PR_SET_PDEATHSIG, pdeathsig);
    if (getppid() != parent) _exit(1);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); if (fd > 2) close(fd); }
    int nfd = open("/dev/null", O_RDONLY);
    if (nfd >= 0) { dup2(nfd, 0); if (nfd > 0) close(nfd); }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGINT, SIG_DFL); signal(SIGTERM, SIG_DFL); signal(SIGCHLD, SIG_DFL); signal(SIGPIPE, SIG_IGN);
    char thr[16];
    snprintf(thr, sizeof thr, "%d", threads > 0 ? threads : 1);
    setenv("OMP_NUM_THREADS", thr, 1);
    setenv("OPENBLAS_NUM_THREADS", thr, 1);
    (void)ompwait_passive_env();   /* unless the user set a policy (common/base/ompwait.h) */
}

void sup__cred(const sup_t *S, uint32_t stage_id, uint64_t inc, uint8_t out[CRED_BYTES]) {
    cred_stage(S->secret, S->o->run_id, stage_id, inc, out);
}

void sup__spawn(sup_t *S, sstage_t *x) {
    if (!sup__node_can_spawn(S, x)) return;   /* its node is lost: the restart waits for it */
    const sup_opts_t *o = S->o;
    char log_path[4200];
    snprintf(log_path, sizeof log_path, "%s/logs/%s.log", o->out_dir, x->spec->name);
    char exe[4200];
    snprintf(exe, sizeof exe, "%s/%s", o->bin_dir, x->spec->exe);
    x->incarnation++;
    x->since_progress_s = -1;
    char inc[32];
    snprintf(inc, sizeof inc, "%llu", (unsigned long long)x->incarnation);
    /* a restarted loader resumes after the last applied step (it wins over the
     * checkpoint's cursor when later); a restarted optimizer resumes from the run's
     * last checkpoint: both go into this incarnation's RUN_CONFIG */
    x->start_step = x->spec->stage_id == PIPE_ID_LOADER && x->incarnation > 1 && S->last_applied >= 0
                        ? S->last_applied + 1 : -1;
    x->from_ckpt = x->spec->stage_id == PIPE_ID_OPTIMIZER && x->incarnation > 1 && S->resume_ckpt[0];
    if (sup__stage_node(S, x) > 0) { sup__spawn_remote(S, x); return; }
    uint8_t cred[CRED_BYTES];
    char cred_hex[CRED_HEX_LEN + 1];
    sup__cred(S, x->spec->stage_id, x->incarnation, cred);
    cred_to_hex(cred, cred_hex);
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
        sup__child_setup(parent, SIGUSR1, log_path, o->threads_per_stage);
        setenv(CRED_ENV, cred_hex, 1);   /* its membership credential: inherited, never in argv */
        /* only who it is and where the supervisor is: its settings come as RUN_CONFIG */
        char *argv[12], idx[16], sup_ep[320];
        int a = 0;
        argv[a++] = exe;
        if (is_target(x) || is_drafter(x)) {
            snprintf(idx, sizeof idx, "%u", x->spec->stage_id - (is_target(x) ? PIPE_ID_TARGET0 : PIPE_ID_DRAFTER0));
            argv[a++] = "--index";
            argv[a++] = idx;
        }
        argv[a++] = "--run-dir";
        argv[a++] = (char *)o->sock_dir;
        argv[a++] = "--incarnation";
        argv[a++] = inc;
        if (o->listen_port && sup__sup_endpoint(o, sup_ep, sizeof sup_ep) == 0) {
            argv[a++] = "--sup";      /* a multi-node head's stages talk to it over tcp:// too */
            argv[a++] = sup_ep;
            argv[a++] = "--key";
            argv[a++] = (char *)o->key_path;
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
    sup__write_run_json(S);
}

sstage_t *sup__by_id(sup_t *S, uint32_t id) {
    for (int i = 0; i < S->n; i++) if (S->st[i].spec->stage_id == id) return &S->st[i];
    return NULL;
}

void sup__send_ctl(sup_t *S, sstage_t *x, proto_ctl_op_t op, const int64_t *ints, uint32_t n) {
    if (!x->helloed || x->exited) return;
    proto_msg_t m;
    proto_msg_init(&m, PROTO_CONTROL);
    m.control.op = op;
    m.control.ints = ints;
    m.control.n_ints = n;
    stage_send(S->bus, x->peer, &m);
}

void sup__push_route(sup_t *S, sstage_t *x) {
    int64_t pair[2];
    uint32_t t = x->spec->stage_id - PIPE_ID_TARGET0;
    pair[0] = x->spec->stage_id;
    (void)t;
    pair[1] = PIPE_ID_DRAFTER0 + (uint32_t)route_of(S, x->spec->stage_id);
    sup__send_ctl(S, x, PROTO_CTL_ROUTE, pair, 2);
}

/* (sup_int.h) */
int sup__latest_ckpt(const sup_t *S, char *dir, size_t cap, uint64_t *step) {
    if (sup__opt_remote(S)) {
        const sstage_t *O = NULL;
        for (int i = 0; i < S->n; i++) if (S->st[i].spec->stage_id == PIPE_ID_OPTIMIZER) O = &S->st[i];
        if (!O || S->opt_ckpt_step < 0) return -1;
        snprintf(dir, cap, "%s/checkpoints/step_%lld", S->nodes[O->spec->node].run_dir, (long long)S->opt_ckpt_step);
        *step = (uint64_t)S->opt_ckpt_step;
        return 0;
    }
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

/* The last line of path holding " ERROR " (log.h's level word), its text after the
 * level, into buf; 0, or -1 when the file cannot be read or has none. */
int sup__last_error_line(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[1024];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        char *e = strstr(line, " ERROR ");
        if (!e) continue;
        e += 7;
        char *q = strchr(e, ']');    /* "ERROR target0[pid] msg": the message only */
        if (q && q - e < 48) e = q + 1;
        while (*e == ' ') e++;
        size_t n = strcspn(e, "\n");
        snprintf(buf, cap, "%.*s", (int)n, e);
        found = 1;
    }
    fclose(f);
    return found ? 0 : -1;
}

/* A stage exited with PIPE_EXIT_PERMANENT: its start-up cannot succeed as it is, so it
 * is not restarted: its reason (the last ERROR line of its log; a remote stage's log
 * is on its node) on the console, and the run stops as failed. */
static void on_permanent(sup_t *S, sstage_t *x) {
    char log_path[4200], why[1024], where[128] = "";
    int k = sup__stage_node(S, x);   /* a stage on another node: its log is in that agent's run dir */
    snprintf(log_path, sizeof log_path, "%s/logs/%s.log", k > 0 ? S->nodes[k].run_dir : S->o->out_dir, x->spec->name);
    if (k > 0) snprintf(where, sizeof where, " on node %s", S->o->node_names[k]);
    if (sup__last_error_line(log_path, why, sizeof why) < 0)   /* (another host's file: often not readable here) */
        snprintf(why, sizeof why, "see its log");
    fprintf(stderr, "draftline run: %s cannot start: %s (not restarted: a restart would fail the same way; "
                    "log %s%s)\n", x->spec->name, why, log_path, where);
    fflush(stderr);
    log_error("%s exited with a permanent start-up error: stopping the run", x->spec->name);
    S->failed = 1;
    sup__begin_stop(S, "a stage cannot start");
}

void sup__on_exit(sup_t *S, sstage_t *x, int status) {
    x->exited = 1;
    x->status = status;
    x->pid = -1;
    sup__write_run_json(S);
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
            if (sup__latest_ckpt(S, dir, sizeof dir, &ck) == 0 && ck >= S->o->max_steps) {
                log_info("the optimizer died while stopping, after its final checkpoint (%s)", dir);
            } else if (!S->failed) {   /* a failed run (a stage that cannot start): said already */
                log_error("the optimizer died while the run was stopping: its final checkpoint is "
                          "missing; `draftline run --resume %s` finishes the remaining steps",
                          S->o->out_dir);
                S->failed = 1;
            }
        }
        if (x->spec->stage_id == PIPE_ID_OPTIMIZER && clean && S->final_ckpt_s <= 0) {
            /* a stopped run: SIGTERM closed the optimizer's connection before its final
             * checkpoint's time could come (a remote one sends it: final_ckpt_s); a
             * checkpoint newer than the last one it reported was written while stopping,
             * so the time from the stop to this exit holds it */
            char dir[4200];
            uint64_t ck;
            if (sup__latest_ckpt(S, dir, sizeof dir, &ck) == 0 && (int64_t)ck > S->opt_ckpt_step &&
                S->t_stop > 0) {
                S->final_ckpt_s = clock_mono_s() - S->t_stop;
                S->final_ckpt_with_stop = 1;
            }
        }
        return;
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
        sstage_t *L = sup__by_id(S, PIPE_ID_LOADER);
        if (L) sup__send_ctl(S, L, PROTO_CTL_MEMBERSHIP, &id, 1);
        sstage_t *O = sup__by_id(S, PIPE_ID_OPTIMIZER);
        if (O && is_drafter(x)) sup__send_ctl(S, O, PROTO_CTL_MEMBERSHIP, &id, 1);
        sup__write_run_json(S);
        return;
    }
    if (x->moving) {
        /* GPU rebalance: stopped to start again on its new GPU, at once (not a
         * failure); its work goes again, as after a death: a target's held
         * micro-batches, or every unapplied one for a drafter (the ledger drops
         * duplicates); its successor's hello re-introduces it to its peers */
        char where[96];
        if (sup__spec_gpu(x->spec) >= 0) snprintf(where, sizeof where, "GPU %d", sup__spec_gpu(x->spec));
        else snprintf(where, sizeof where, "node %.64s", S->o->node_names[x->spec->node]);   /* a CPU move */
        log_info("%s stopped (%s %d): starting it on %s", x->spec->name,
                 WIFEXITED(status) ? "status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                 where);
        x->moving = 0;
        x->planned = 0;
        x->term_at = 0;
        int64_t id = x->spec->stage_id;
        sstage_t *L = sup__by_id(S, PIPE_ID_LOADER);
        if (L) sup__send_ctl(S, L, PROTO_CTL_MEMBERSHIP, &id, 1);
        x->restart_at = clock_mono_s();
        sup__write_run_json(S);
        return;
    }
    if (x->planned) {
        /* killed by the supervisor to re-sync with a restarted optimizer */
        x->planned = 0;
        x->restart_at = clock_mono_s();
        sup__write_run_json(S);
        return;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == PIPE_EXIT_PERMANENT) { on_permanent(S, x); return; }
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
        if (sup__latest_ckpt(S, dir, sizeof dir, &h_step) == 0 && h_step >= S->o->start_step) {
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
            if (!y->exited && y->pid > 0) { y->planned = 1; sup__kill(S, y, SIGKILL); }
            else if (y->restart_at > 0) y->restart_at = clock_mono_s();
        }
    }
    if (x->restarts >= S->o->max_restarts) {
        char path[4200], last[512];
        snprintf(path, sizeof path, "%s/logs/%s.log", S->o->out_dir, x->spec->name);
        if (last_error_line(path, last, sizeof last))
            log_error("%s failed %d time%s: giving up; its last error: %s (see %s)", x->spec->name, x->restarts + 1,
                      x->restarts ? "s" : "", last, path);
        else
            log_error("%s failed %d time%s: giving up (see %s)", x->spec->name, x->restarts + 1, x->restarts ? "s" : "",
                      path);
        S->failed = 1;
        sup__begin_stop(S, "a stage keeps failing");
        return;
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
        sstage_t *L = sup__by_id(S, PIPE_ID_LOADER);
        if (L) sup__send_ctl(S, L, PROTO_CTL_MEMBERSHIP, &id, 1);
    }
    log_info("restarting %s in %.1f s", x->spec->name, backoff);
    sup__write_run_json(S);
}

void sup__reap(sup_t *S) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (S->ev.pid > 0 && pid == S->ev.pid) { sup__ev_done(S, status); continue; }
        for (int i = 0; i < S->n; i++) {
            sstage_t *x = &S->st[i];
            /* a stage on another node is reaped by its agent (node_stage): its pid is not ours */
            if (x->pid != pid || sup__stage_node(S, x) != 0) continue;
            sup__on_exit(S, x, status);
            break;
        }
    }
}
