/* Stall diagnosis and bottleneck analysis (see diag.h). */
#include "common/monitor/diag.h"
#include "common/rundir/rundir.h"
#include "common/base/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const DIAG_NAMES[MON_DIAG_COUNT_] = {
    "unknown", "ok", "starved", "back-pressured", "stuck", "silent", "starting", "stopped"};

const char *mon_diag_name(mon_diag_kind_t k) {
    return (unsigned)k < MON_DIAG_COUNT_ ? DIAG_NAMES[k] : "unknown";
}

void mon_diag_opts_default(mon_diag_opts_t *o) {
    o->stall_s = 60;
    o->wait_share = 0.5;
    o->window_s = 10;
    o->silent_s = MON_SILENT_S_DEFAULT;
}

/* snprintf that may truncate on purpose (messages for humans). */
static void fmt(char *out, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void fmt(char *out, size_t cap, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    vsnprintf(out, cap, f, ap);
    va_end(ap);
}

static double clamp01(double x) { return x < 0 ? 0 : x > 1 ? 1 : x; }
static double nz(double x) { return isfinite(x) ? x : 0; }
static double pos0(double x) { return isfinite(x) && x > 0 ? x : 0; }

void mon_stage_view(const mon_stage_t *s, double now, double window_s, mon_stage_view_t *v) {
    memset(v, 0, sizeof *v);
    v->name = s->name;
    v->role = s->role;
    v->since_progress_s = v->tokens_per_s = v->queued = NAN;
    v->inbox_used = v->inbox_cap = NAN;
    v->inbox_gpu_used = v->inbox_gpu_cap = v->inbox_host_used = v->inbox_host_cap = NAN;
    const mon_sample_t *x = mon_stage_sample(s, 0);
    if (!x) return;
    snprintf(v->state, sizeof v->state, "%s", x->state);
    v->staleness_s = now > x->ts ? now - x->ts : 0;
    double sp = mon_stage_get(s, 0, "since_progress_s");
    v->since_progress_s = isfinite(sp) ? sp + v->staleness_s : NAN;
    v->tokens_per_s = mon_stage_get(s, 0, "tokens_per_s");
    v->queued = mon_stage_get(s, 0, "queued");
    v->inbox_gpu_used = mon_stage_get(s, 0, "inbox_gpu_bytes");
    v->inbox_gpu_cap = mon_stage_get(s, 0, "inbox_gpu_cap");
    v->inbox_host_used = mon_stage_get(s, 0, "inbox_host_bytes");
    v->inbox_host_cap = mon_stage_get(s, 0, "inbox_host_cap");
    if (isfinite(v->inbox_gpu_used) || isfinite(v->inbox_host_used)) {
        v->inbox_used = nz(v->inbox_gpu_used) + nz(v->inbox_host_used);
        v->inbox_cap = nz(v->inbox_gpu_cap) + nz(v->inbox_host_cap);
    }
    /* oldest sample inside the window (at least the previous one) */
    int back = 0;
    for (int b = 1; b < s->count; b++) {
        const mon_sample_t *y = mon_stage_sample(s, b);
        if (b > 1 && y->ts < x->ts - window_s) break;
        back = b;
    }
    if (back == 0) return;
    const mon_sample_t *y = mon_stage_sample(s, back);
    v->dt = x->ts - y->ts;
    if (!(v->dt > 0)) { v->dt = 0; return; }
    static const char *const busy[] = {"copy_s", "forward_s", "backward_s", "step_s"};
    v->d_wait_input = nz(mon_stage_get(s, 0, "wait_input_s") - mon_stage_get(s, back, "wait_input_s"));
    v->d_wait_credit = nz(mon_stage_get(s, 0, "wait_credit_s") - mon_stage_get(s, back, "wait_credit_s"));
    v->d_wait_gpu = nz(mon_stage_get(s, 0, "wait_gpu_s") - mon_stage_get(s, back, "wait_gpu_s"));
    for (int i = 0; i < 4; i++)
        v->d_busy += nz(mon_stage_get(s, 0, busy[i]) - mon_stage_get(s, back, busy[i]));
}

/* What the current state says the stage is doing now. */
typedef enum { NOW_UNKNOWN, NOW_INPUT, NOW_CREDIT, NOW_BUSY } now_t;

static now_t now_of(const mon_stage_view_t *v) {
    if (!strcmp(v->state, "idle")) return v->role == MON_ROLE_LOADER ? NOW_CREDIT : NOW_INPUT;
    if (!strcmp(v->state, "blocked")) return NOW_CREDIT;
    if (!strcmp(v->state, "running") || !strcmp(v->state, "draining")) return NOW_BUSY;
    return NOW_UNKNOWN;
}

void mon_diagnose(const mon_stage_view_t *v, const mon_diag_opts_t *o, mon_diag_t *out) {
    memset(out, 0, sizeof *out);
    now_t now = now_of(v);
    if (v->dt > 0) {
        double in = pos0(v->d_wait_input / v->dt), cr = pos0(v->d_wait_credit / v->dt);
        double bu = pos0(v->d_busy / v->dt), gp = pos0(v->d_wait_gpu / v->dt), sum = in + cr + bu + gp;
        if (sum > 1) {
            /* a phase that began before the window and ended inside it adds all of its
             * time: the window holds no open phase, and the shares are scaled together
             * (one clamp for all four, so they add up to 100 %) */
            in /= sum;
            cr /= sum;
            bu /= sum;
            gp /= sum;
        } else if (now == NOW_INPUT) {
            in += 1 - sum;                          /* the phase the stage is in now, once */
        } else if (now == NOW_CREDIT) {
            cr += 1 - sum;
        } else if (now == NOW_BUSY) {
            bu += 1 - sum;
        }
        out->share_in = clamp01(in);
        out->share_credit = clamp01(cr);
        out->share_busy = clamp01(bu);
        out->share_gpu = clamp01(gp);
    }
    /* metrics come every second from a loop that long work never blocks: a few seconds
     * of silence is a frozen or hung process, whatever --stall-s says; a stage loading
     * (a new incarnation) may send nothing for longer */
    int loading = !strcmp(v->state, "starting");
    double silent = loading && o->stall_s > o->silent_s ? o->stall_s : o->silent_s;
    if (!v->state[0]) {
        out->kind = MON_DIAG_UNKNOWN;
        fmt(out->why, sizeof out->why, "no metrics yet");
        return;
    }
    if (!strcmp(v->state, "stopping") || !strcmp(v->state, "exited") || !strcmp(v->state, "retired")) {
        /* exited / retired: set by the report from run.json (the process is gone) */
        out->kind = MON_DIAG_STOPPED;
        fmt(out->why, sizeof out->why, "%s", !strcmp(v->state, "retired") ? "retired by a rebalance"
                                             : !strcmp(v->state, "exited") ? "exited" : "stopping");
        return;
    }
    if (v->staleness_s >= silent) {
        out->kind = MON_DIAG_SILENT;
        fmt(out->why, sizeof out->why, "silent %.0f s: no metrics (frozen? hung or gone)", v->staleness_s);
        return;
    }
    if (!strcmp(v->state, "starting")) {
        out->kind = MON_DIAG_STARTING;
        fmt(out->why, sizeof out->why, "starting (loading) for %.0f s", nz(v->since_progress_s));
        return;
    }
    int stalled = isfinite(v->since_progress_s) && v->since_progress_s >= o->stall_s;
    out->stalled = stalled;
    int have = v->dt > 0;
    int waits_in = now == NOW_INPUT || (have && out->share_in >= o->wait_share);
    int waits_cr = now == NOW_CREDIT || (have && out->share_credit >= o->wait_share);
    if (stalled) {
        if (waits_in && (now == NOW_INPUT || out->share_in >= out->share_credit)) {
            out->kind = MON_DIAG_STARVED;
            fmt(out->why, sizeof out->why, "no progress for %.0f s, waiting for input (%s)",
                     v->since_progress_s, v->state);
        } else if (waits_cr) {
            out->kind = MON_DIAG_BACKPRESSURED;
            fmt(out->why, sizeof out->why, "no progress for %.0f s, waiting for credit (%s)",
                     v->since_progress_s, v->state);
        } else {
            out->kind = MON_DIAG_STUCK;
            fmt(out->why, sizeof out->why, "no progress for %.0f s and not waiting (%s)",
                     v->since_progress_s, v->state);
        }
        return;
    }
    if (!have) {
        out->kind = MON_DIAG_UNKNOWN;
        fmt(out->why, sizeof out->why, "one sample so far");
        return;
    }
    if (out->share_in >= o->wait_share && out->share_in >= out->share_credit) {
        out->kind = MON_DIAG_STARVED;
        fmt(out->why, sizeof out->why, "waits for input %.0f%% of the time", 100 * out->share_in);
    } else if (out->share_credit >= o->wait_share) {
        out->kind = MON_DIAG_BACKPRESSURED;
        fmt(out->why, sizeof out->why, "waits for credit %.0f%% of the time", 100 * out->share_credit);
    } else {
        out->kind = MON_DIAG_OK;
        if (out->share_gpu >= 0.05)
            fmt(out->why, sizeof out->why, "busy %.0f%%, waits for its GPU's turn %.0f%%", 100 * out->share_busy,
                100 * out->share_gpu);
        else
            fmt(out->why, sizeof out->why, "busy %.0f%%", 100 * out->share_busy);
    }
}

/* Fallback for max_steps: the optimizer's first log line says "step S of M". */
static void max_steps_from_log(const char *dir, mon_topo_t *t) {
    char p[4200], line[1024];
    snprintf(p, sizeof p, "%s/logs/optimizer.log", dir);
    FILE *f = fopen(p, "r");
    if (!f) return;
    for (int i = 0; i < 200 && fgets(line, sizeof line, f); i++) {
        const char *q = strstr(line, " step ");
        unsigned long long s, m;
        if (q && sscanf(q, " step %llu of %llu", &s, &m) == 2 && m > 0) { t->max_steps = m; break; }
    }
    fclose(f);
}

/* The run.json fields the suggestion needs; absent ones leave *t as it is. */
static void topo_from_runjson(const rundir_run_t *r, mon_topo_t *t) {
    if (r->device[0]) {
        t->gpu_mode = strcmp(r->device, "cpu") != 0;
        t->cpu_run = !t->gpu_mode;
    }
    if (r->n_nodes > 0) {           /* multi-node: the nodes' cores, not the monitor's host */
        t->cores = 0;
        for (int k = 0; k < r->n_nodes; k++) t->cores += r->nodes[k].cores > 0 ? r->nodes[k].cores : 0;
    }
    if (r->targets >= 0) t->n_targets = r->targets;
    if (r->drafters >= 0) t->n_drafters = r->drafters;
    if (r->max_steps > 0) t->max_steps = (uint64_t)r->max_steps;
    if (r->n_target_gpus) {
        memcpy(t->target_gpus, r->target_gpus, sizeof(int) * (size_t)r->n_target_gpus);
        t->n_target_gpus = r->n_target_gpus;
        t->gpu_mode = 1;
    }
    if (r->n_drafter_gpus) {
        memcpy(t->drafter_gpus, r->drafter_gpus, sizeof(int) * (size_t)r->n_drafter_gpus);
        t->n_drafter_gpus = r->n_drafter_gpus;
        t->gpu_mode = 1;
    }
    if (r->state[0]) snprintf(t->run_state, sizeof t->run_state, "%s", r->state);
    if (r->ckpt_failed_step >= 0) {
        t->ckpt_failed_step = r->ckpt_failed_step;
        snprintf(t->ckpt_error, sizeof t->ckpt_error, "%s", r->ckpt_error[0] ? r->ckpt_error : "see logs/optimizer.log");
    }
    if (r->n_stages) t->n_stages = 0;
    for (int i = 0; i < r->n_stages && t->n_stages < MON_MAX_STAGES; i++) {
        const rundir_stage_t *e = &r->stages[i];
        if (!e->name[0]) continue;
        mon_topo_stage_t *x = &t->stages[t->n_stages++];
        memset(x, 0, sizeof *x);
        snprintf(x->name, sizeof x->name, "%s", e->name);
        x->stage_id = e->stage_id;
        x->incarnation = e->incarnation > 0 ? (uint64_t)e->incarnation : 0;
        snprintf(x->process, sizeof x->process, "%s", e->process);
        snprintf(x->node, sizeof x->node, "%s", e->node);
    }
}

/* A single-host run's cores are this machine's (the monitor runs where the run does). */
static void cores_here(mon_topo_t *t) {
    if (t->cores > 0) return;
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    t->cores = nc > 0 && nc < 1 << 20 ? (int)nc : 0;
}

int mon_topo_read(const char *dir, mon_topo_t *t) {
    rundir_run_t *r = malloc(sizeof *r);
    if (!r) return dl_seterr(DL_ENOMEM, "monitor: out of memory");
    int rc = rundir_run_read(dir, r);
    if (rc == 0) topo_from_runjson(r, t);
    if (rc == 0 && r->n_nodes <= 0) cores_here(t);
    free(r);
    if (rc == DL_ENOENT || rc == DL_EIO || rc == 0) {   /* unreadable: as if absent */
        if (!t->max_steps) max_steps_from_log(dir, t);
        return rc ? DL_ENOENT : 0;
    }
    return DL_EFORMAT;      /* detail: rundir_run_read's (file and key) */
}

int mon_topo_parse(const char *dir, const char *json, size_t len, mon_topo_t *t) {
    rundir_run_t *r = malloc(sizeof *r);
    if (!r) return dl_seterr(DL_ENOMEM, "monitor: out of memory");
    int rc = rundir_run_parse(json, len, "status reply", r);
    if (rc == 0) topo_from_runjson(r, t);
    if (rc == 0 && r->n_nodes <= 0) cores_here(t);
    free(r);
    if (rc < 0) return rc == DL_ENOMEM ? rc : DL_EFORMAT;
    if (!t->max_steps) max_steps_from_log(dir, t);
    return 0;
}

const mon_topo_stage_t *mon_topo_stage(const mon_topo_t *t, const char *name) {
    for (int i = 0; t && i < t->n_stages; i++)
        if (!strcmp(t->stages[i].name, name)) return &t->stages[i];
    return NULL;
}

int mon_topo_has(const mon_topo_t *t, const char *name) {
    return !t || !t->n_stages || mon_topo_stage(t, name) != NULL;
}

void mon_topo_from_run(const mon_run_t *run, mon_topo_t *t) {
    int nt = 0, nd = 0;
    for (int i = 0; i < run->n_stages; i++) {
        const mon_stage_t *s = run->stages[i];
        const mon_topo_stage_t *ts = mon_topo_stage(t, s->name);
        if (!mon_topo_has(t, s->name) || (ts && !strcmp(ts->process, "retired"))) continue;
        nt += s->role == MON_ROLE_TARGET;
        nd += s->role == MON_ROLE_DRAFTER;
    }
    if (!t->n_targets) t->n_targets = nt;
    if (!t->n_drafters) t->n_drafters = nd;
}

static int counts(mon_diag_kind_t k) {
    return k == MON_DIAG_OK || k == MON_DIAG_STARVED || k == MON_DIAG_BACKPRESSURED ||
           k == MON_DIAG_STUCK;
}

static void gpu_list(char *out, size_t cap, const int *g, int n) {
    size_t w = 0;
    out[0] = 0;
    for (int i = 0; i < n && w < cap; i++) w += (size_t)snprintf(out + w, cap - w, i ? ",%d" : "%d", g[i]);
}

/* 1 when GPU g is in the list (n entries). */
static int has_gpu(const int *list, int n, int g) {
    for (int i = 0; i < n; i++) if (list[i] == g) return 1;
    return 0;
}

/* GPU mode with every GPU shared by targets and drafters (each GPU of either list is in
 * the other; a GPU may be listed more than once) that take turns on them: the stages'
 * busy time per distinct GPU, (targets' + drafters' + optimizer's) / GPUs, from the mean
 * shares and counts of mon_bottleneck; the distinct GPUs into gpus ("0" or "0,1"). Else -1. */
static double shared_gpu_busy(const mon_topo_t *t, const mon_bottleneck_t *b, const int *cnt, char *gpus,
                              size_t cap) {
    const int T = MON_ROLE_TARGET, D = MON_ROLE_DRAFTER, O = MON_ROLE_OPTIMIZER;
    int nt = t->n_target_gpus, nd = t->n_drafter_gpus, g[64], n = 0;
    if (!t->gpu_mode || nt < 1 || nd < 1) return -1;
    for (int i = 0; i < nt; i++) if (!has_gpu(t->drafter_gpus, nd, t->target_gpus[i])) return -1;
    for (int i = 0; i < nd; i++) if (!has_gpu(t->target_gpus, nt, t->drafter_gpus[i])) return -1;
    for (int i = 0; i < nt && n < 64; i++) if (!has_gpu(g, n, t->target_gpus[i])) g[n++] = t->target_gpus[i];
    if (b->wait_gpu[T] < 0.05 && b->wait_gpu[D] < 0.05) return -1;   /* no turns taken */
    gpu_list(gpus, cap, g, n);
    return (b->busy[T] * cnt[T] + b->busy[D] * cnt[D] + b->busy[O] * cnt[O]) / n;
}

/* "move one GPU (or process) from `from` to `to`" with the rebalance command. */
static void suggest_move(const mon_topo_t *t, const char *run_dir, int to_targets, char *out, size_t cap) {
    const char *who = to_targets ? "targets" : "drafters";
    const char *from = to_targets ? "drafters" : "targets";
    int n_from = to_targets ? t->n_drafters : t->n_targets;
    const char *dir = run_dir && *run_dir ? run_dir : "DIR";
    if (t->gpu_mode) {
        int nfg = to_targets ? t->n_drafter_gpus : t->n_target_gpus;
        if (nfg > 1) {
            int tg[65], dg[65], ntg = t->n_target_gpus, ndg = t->n_drafter_gpus;
            memcpy(tg, t->target_gpus, sizeof(int) * (size_t)ntg);
            memcpy(dg, t->drafter_gpus, sizeof(int) * (size_t)ndg);
            if (to_targets) tg[ntg++] = dg[--ndg];
            else dg[ndg++] = tg[--ntg];
            char a[256], b[256];
            gpu_list(a, sizeof a, tg, ntg);
            gpu_list(b, sizeof b, dg, ndg);
            fmt(out, cap, "%s are the bottleneck: move one GPU from %s to %s "
                     "(draftline rebalance --run %s --target-gpus %s --drafter-gpus %s)",
                     who, from, who, dir, a, b);
        } else if (nfg == 1 || n_from <= 1) {
            fmt(out, cap, "%s are the bottleneck: give %s another GPU (%s have only one)", who, who, from);
        } else {
            fmt(out, cap, "%s are the bottleneck: move one GPU from %s to %s", who, from, who);
        }
        return;
    }
    int nt = t->n_targets, nd = t->n_drafters;
    if (n_from > 1) {
        if (to_targets) { nt++; nd--; } else { nt--; nd++; }
        fmt(out, cap, "%s are the bottleneck: move one process from %s to %s "
                 "(draftline rebalance --run %s --targets %d --drafters %d)", who, from, who, dir, nt, nd);
        return;
    }
    int procs = nt + nd, thr = t->threads;
    if (thr <= 0) thr = t->cores > 0 && t->cores / (procs > 0 ? procs : 1) > 1 ? t->cores / (procs > 0 ? procs : 1) : 1;
    if (to_targets) nt++; else nd++;
    if (t->cores <= 0)
        fmt(out, cap, "%s are the bottleneck: add one (--targets %d --drafters %d, if cores allow)", who, nt, nd);
    else if ((procs + 1) * thr <= t->cores)
        fmt(out, cap, "%s are the bottleneck: add one, a core is free (--targets %d --drafters %d; "
                 "%d cores, %d compute processes x %d threads)", who, nt, nd, t->cores, procs, thr);
    else
        fmt(out, cap, "%s are the bottleneck and the machine is the limit: no core is free for another "
                 "process (%d cores, %d compute processes x %d threads) and %s have only one to move",
                 who, t->cores, procs, thr, from);
}

void mon_bottleneck(const mon_stage_view_t *views, const mon_diag_t *diags, int n,
                    const mon_topo_t *topo, const char *run_dir, mon_bottleneck_t *out) {
    memset(out, 0, sizeof *out);
    int cnt[MON_ROLE_COUNT_] = {0};
    double used = 0, cap = 0;
    for (int i = 0; i < n; i++) {
        mon_role_t r = views[i].role;
        if ((unsigned)r >= MON_ROLE_COUNT_ || !counts(diags[i].kind)) continue;
        cnt[r]++;
        out->busy[r] += diags[i].share_busy;
        out->wait_in[r] += diags[i].share_in;
        out->wait_credit[r] += diags[i].share_credit;
        out->wait_gpu[r] += diags[i].share_gpu;
        if (r == MON_ROLE_DRAFTER && isfinite(views[i].inbox_used) && views[i].inbox_cap > 0) {
            used += views[i].inbox_used;
            cap += views[i].inbox_cap;
        }
    }
    for (int r = 0; r < MON_ROLE_COUNT_; r++)
        if (cnt[r]) {
            out->busy[r] /= cnt[r];
            out->wait_in[r] /= cnt[r];
            out->wait_credit[r] /= cnt[r];
            out->wait_gpu[r] /= cnt[r];
        }
    out->inbox_fill = cap > 0 ? used / cap : NAN;
    const int T = MON_ROLE_TARGET, D = MON_ROLE_DRAFTER, O = MON_ROLE_OPTIMIZER;
    /* a stuck or silent stage holds everyone up: name it before any rebalance */
    for (int i = 0; i < n; i++) {
        if (diags[i].kind != MON_DIAG_STUCK && diags[i].kind != MON_DIAG_SILENT) continue;
        out->kind = views[i].role;
        fmt(out->text, sizeof out->text, "%s is %s (%s): the pipeline waits on it; see %s/logs/%s.log",
            views[i].name ? views[i].name : "a stage", mon_diag_name(diags[i].kind), diags[i].why,
            run_dir && *run_dir ? run_dir : "DIR", views[i].name ? views[i].name : "STAGE");
        return;
    }
    int live = 0, waiting = 0;
    for (int i = 0; i < n; i++) {
        if (!counts(diags[i].kind)) continue;
        live++;
        waiting += diags[i].stalled &&
                   (diags[i].kind == MON_DIAG_STARVED || diags[i].kind == MON_DIAG_BACKPRESSURED);
    }
    if (live >= 2 && waiting == live) {
        out->kind = MON_ROLE_UNKNOWN;
        fmt(out->text, sizeof out->text,
            "the pipeline is stalled: every stage has waited for input or credit without progress; "
            "work or a credit was lost (after a restart?): see %s/logs/",
            run_dir && *run_dir ? run_dir : "DIR");
        return;
    }
    if (!cnt[T] || !cnt[D]) {
        out->kind = MON_ROLE_UNKNOWN;
        fmt(out->text, sizeof out->text, "not enough data yet (targets and drafters need two samples each)");
        return;
    }
    mon_topo_t t = *topo;
    if (!t.n_targets) t.n_targets = cnt[T];
    if (!t.n_drafters) t.n_drafters = cnt[D];
    int d_starved = out->wait_in[D] >= 0.3 || (isfinite(out->inbox_fill) && out->inbox_fill < 0.25 &&
                                                 out->wait_in[D] >= 0.1);
    int t_pressed = out->wait_credit[T] >= 0.3 || (isfinite(out->inbox_fill) && out->inbox_fill >= 0.75);
    char gpus[256];
    double gpu_busy = shared_gpu_busy(&t, out, cnt, gpus, sizeof gpus);
    if (cnt[O] && out->busy[O] >= 0.5) {
        out->kind = MON_ROLE_OPTIMIZER;
        fmt(out->text, sizeof out->text,
                 "the optimizer is the bottleneck (busy %.0f%%): raise --micro-batches-per-step so a "
                 "step carries more tokens, or give it its own GPU", 100 * out->busy[O]);
    } else if (gpu_busy >= 0.9) {
        out->kind = MON_ROLE_UNKNOWN;
        fmt(out->text, sizeof out->text,
            "the GPU is the bottleneck: targets and drafters take turns on GPU %s and keep it busy %.0f%% "
            "of the time (targets %.0f%%, drafters %.0f%%, optimizer %.0f%%); moving work between them "
            "would not help: another GPU would, or --target-precision fp8",
            gpus, 100 * (gpu_busy > 1 ? 1 : gpu_busy), 100 * out->busy[T], 100 * out->busy[D],
            100 * out->busy[O]);
    } else if (d_starved && out->busy[T] >= 0.5 && out->wait_in[T] < 0.5) {
        out->kind = MON_ROLE_TARGET;
        suggest_move(&t, run_dir, 1, out->text, sizeof out->text);
    } else if (t_pressed && out->busy[D] >= 0.5) {
        out->kind = MON_ROLE_DRAFTER;
        suggest_move(&t, run_dir, 0, out->text, sizeof out->text);
    } else if (out->wait_in[T] >= 0.5 && out->wait_in[D] >= 0.5) {
        out->kind = MON_ROLE_LOADER;
        fmt(out->text, sizeof out->text,
                 "the loader is the bottleneck (targets and drafters wait for input): prepare the data "
                 "first (draftline prepare) or raise --prefetch");
    } else {
        int best = 0;
        for (int r = 1; r < MON_ROLE_COUNT_; r++) if (cnt[r] && out->busy[r] > out->busy[best]) best = r;
        if (best && out->busy[best] >= 0.75 && (best == T || best == D)) {
            out->kind = (mon_role_t)best;
            suggest_move(&t, run_dir, best == T, out->text, sizeof out->text);
        } else {
            out->kind = MON_ROLE_UNKNOWN;
            fmt(out->text, sizeof out->text,
                     "no clear bottleneck (busy: targets %.0f%%, drafters %.0f%%, optimizer %.0f%%)",
                     100 * out->busy[T], 100 * out->busy[D], 100 * out->busy[O]);
        }
    }
}

/* Pace over the last (up to) 20 steps: seconds per step and tokens per second. */
static int pace(const mon_run_t *run, double *s_per_step, double *tok_per_s) {
    *s_per_step = *tok_per_s = NAN;
    const mon_step_t *last = mon_run_last_step(run);
    if (!last) return 0;
    const mon_step_t *first = NULL;
    int seen = 0;
    for (uint64_t i = last->step; i-- > 0 && seen < 20;) {
        const mon_step_t *s = &run->steps[i];
        if (!s->have) continue;
        /* same clock needed: an optimizer restart resets t */
        if (isfinite(s->t) && isfinite(last->t) && s->t > last->t) break;
        first = s;
        seen++;
    }
    if (!first) return 0;
    double dt = isfinite(first->t) && isfinite(last->t) ? last->t - first->t : last->ts - first->ts;
    if (!(dt > 0)) return 0;
    *s_per_step = dt / (double)(last->step - first->step);
    if (isfinite(last->tokens) && isfinite(first->tokens)) *tok_per_s = (last->tokens - first->tokens) / dt;
    return 1;
}

double mon_eta_s(const mon_run_t *run, uint64_t max_steps) {
    const mon_step_t *last = mon_run_last_step(run);
    double sps, tps;
    if (!max_steps || !last || !pace(run, &sps, &tps)) return NAN;
    if (last->step + 1 >= max_steps) return 0;
    return sps * (double)(max_steps - last->step - 1);
}

double mon_tokens_per_s(const mon_run_t *run) {
    double sps, tps;
    pace(run, &sps, &tps);
    return tps;
}
