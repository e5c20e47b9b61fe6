/* `--balance auto` (issue 14 item 5): after warm-up, and again every balance_every_s,
 * the supervisor measures each target's and drafter's rate from its metrics (target
 * tokens per busy second over the last window, S->mon), asks the planner
 * (common/pipe/balance.h) for the split with the best predicted throughput and, when it
 * beats the live one by 15 %, moves there with the live rebalance (rebalance.c), as
 * `draftline rebalance` would. Every decision is logged and printed with its numbers.
 *
 * CPU runs cap every prediction by what the host's cores allow (bal_cpu_cap: CPU seconds
 * per target token of each role from /proc, over the time between checks).
 *
 * What it moves: CPU runs share the run's compute processes (N + M stays); GPU runs
 * share their GPUs when each GPU runs one stage (the optimizer sits with drafter 0,
 * which never moves): a GPU goes from the last drafter to a new target or back. A GPU
 * run whose stages share GPUs, and a multi-node run, are refused at start (launch.c). */
#define _GNU_SOURCE 1   /* sched_getaffinity, CPU_COUNT */
#include "supervisor/sup_int.h"

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/pipe/balance.h"
#include "common/pipe/rbplan.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define BALANCE_MIN_GAIN 0.15
#define BALANCE_BUSY_FLOOR 0.5
#define BALANCE_MIN_STEPS 2       /* steps applied since the start or the last move */

/* Rate (target tokens per busy second) and busy share of stage x over the last window_s
 * seconds of its metrics; 0 when known (at least 2 samples of this incarnation spanning
 * half the window, some busy time), -1 otherwise. */
static int bal_stage_rate(const sup_t *S, const sstage_t *x, double window_s, double *rate, double *busy) {
    mon_stage_t *s = S->mon && x->peer[0] ? mon_run_stage(S->mon, x->peer) : NULL;
    if (!s || s->count < 2 || s->incarnation != x->incarnation) return -1;
    const mon_sample_t *n0 = mon_stage_sample(s, 0);
    int back = 0;
    for (int b = 1; b < s->count; b++) {
        const mon_sample_t *o = mon_stage_sample(s, b);
        if (!o || o->ts < n0->ts - window_s) break;
        back = b;
    }
    if (back == 0) return -1;
    double dt = n0->ts - mon_stage_sample(s, back)->ts;
    static const char *const phases[] = {"copy_s", "forward_s", "backward_s", "step_s"};
    double db = 0;
    for (int i = 0; i < 4; i++) {
        double d = mon_stage_get(s, 0, phases[i]) - mon_stage_get(s, back, phases[i]);
        if (isfinite(d)) db += d;
    }
    double dtok = mon_stage_get(s, 0, "tokens") - mon_stage_get(s, back, "tokens");
    if (!(dt >= window_s / 2) || !(db > 0.2) || !(dtok > 0)) return -1;
    *rate = dtok / db;
    *busy = db / dt > 1 ? 1 : db / dt;
    return 0;
}

/* Mean rate and busy share over the live stages of a role (targets: r = 1) whose rate is
 * known (a stage restarting, too new, or a drafter no target feeds has none); the count
 * of live stages in *n. 0, or -1 when no stage of the role has a known rate. */
static int bal_role_rate(const sup_t *S, int r, double window_s, int *n, double *rate, double *busy) {
    double sr = 0, sb = 0;
    int known = 0;
    *n = 0;
    for (int i = 0; i < S->n; i++) {
        const sstage_t *x = &S->st[i];
        if ((r ? !is_target(x) : !is_drafter(x)) || !x->active || x->retiring) continue;
        (*n)++;
        double a, b;
        if (x->exited || !x->helloed || bal_stage_rate(S, x, window_s, &a, &b) < 0) continue;
        sr += a, sb += b, known++;
    }
    if (known == 0) { *rate = NAN, *busy = NAN; return -1; }
    *rate = sr / known, *busy = sb / known;
    return 0;
}

/* CPU seconds (user + system) process pid has used (/proc/<pid>/stat); -1 if unreadable. */
static double proc_cpu_s(pid_t pid) {
    char p[64], buf[1024];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *r = strrchr(buf, ')');   /* after the command name, which may hold spaces */
    unsigned long long ut, st;
    if (!r || sscanf(r + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) return -1;
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? (double)(ut + st) / (double)hz : -1;
}

/* CPU runs: the target tokens/s the host's cores allow, from the CPU time each live target
 * and drafter used since the last check per target token it processed (a stage counts
 * when the same process was there then: restarts and moves start afresh):
 *   cap = cores / (CPU s per token of the targets + CPU s per token of the drafters)
 * cores: those this process may run on (sched_getaffinity). 0 when not known (the first
 * check, no tokens, unreadable /proc); the samples are kept for the next check. */
static double bal_cpu_cap(sup_t *S) {
    double cpu[2] = {0, 0}, tok[2] = {0, 0};
    int seen[2] = {0, 0}, n = 0;
    sup_bal_cpu_t cur[RUNDIR_MAX_STAGES];
    for (int i = 0; i < S->n && n < RUNDIR_MAX_STAGES; i++) {
        const sstage_t *x = &S->st[i];
        int r = is_target(x) ? 1 : is_drafter(x) ? 0 : -1;
        if (r < 0 || !x->active || x->retiring || x->exited || x->pid <= 0) continue;
        mon_stage_t *s = S->mon && x->peer[0] ? mon_run_stage(S->mon, x->peer) : NULL;
        double c = proc_cpu_s(x->pid);
        double t = s && s->count > 0 && s->incarnation == x->incarnation ? mon_stage_get(s, 0, "tokens") : NAN;
        if (!(c >= 0) || !isfinite(t)) continue;
        cur[n++] = (sup_bal_cpu_t){x->pid, r, c, t};
        for (int k = 0; k < S->bal.n_cpu; k++)
            if (S->bal.cpu[k].pid == x->pid && S->bal.cpu[k].target == r && c >= S->bal.cpu[k].cpu_s &&
                t >= S->bal.cpu[k].tokens) {
                cpu[r] += c - S->bal.cpu[k].cpu_s;
                tok[r] += t - S->bal.cpu[k].tokens;
                seen[r] = 1;
            }
    }
    memcpy(S->bal.cpu, cur, (size_t)n * sizeof cur[0]);
    S->bal.n_cpu = n;
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (!seen[0] || !seen[1] || !(tok[0] > 0) || !(tok[1] > 0) || cores < 1) return 0;
    double per_token = cpu[1] / tok[1] + cpu[0] / tok[0];
    return per_token > 0 ? cores / per_token : 0;
}

/* GPU runs: the new lists for N targets and M drafters from the live ones (each GPU one
 * stage): GPUs of retired drafters (from the last) become targets, GPUs of retired
 * targets (from the last) become drafters. 0, or -1 when the live placement is not one
 * stage per GPU. */
static int gpu_lists(const sup_t *S, int N, int M, int *tg, int *dg) {
    int ct[RBPLAN_MAX], cd[RBPLAN_MAX], nt = 0, nd = 0;
    for (int i = 0; i < S->n; i++) {
        const sstage_t *x = &S->st[i];
        if (!x->active || x->retiring) continue;
        int g = sup__spec_gpu(x->spec), idx = (int)(x->spec->stage_id - (is_target(x) ? PIPE_ID_TARGET0 : PIPE_ID_DRAFTER0));
        if (g < 0 || idx >= RBPLAN_MAX) return -1;
        if (is_target(x)) { ct[idx] = g; if (idx + 1 > nt) nt = idx + 1; }
        else if (is_drafter(x)) { cd[idx] = g; if (idx + 1 > nd) nd = idx + 1; }
    }
    if (nt != S->nt || nd != S->nd) return -1;
    for (int i = 0; i < nt + nd; i++)
        for (int j = i + 1; j < nt + nd; j++)
            if ((i < nt ? ct[i] : cd[i - nt]) == (j < nt ? ct[j] : cd[j - nt])) return -1;
    memcpy(tg, ct, sizeof ct);
    memcpy(dg, cd, sizeof cd);
    while (nt < N) tg[nt++] = dg[--nd];     /* a drafter's GPU to a new target */
    while (nd < M) dg[nd++] = tg[--nt];     /* a target's GPU to a new drafter */
    return nt == N && nd == M ? 0 : -1;
}

/* "balance: <what> (<why>)" in the log, which the console shows (one line, not two). */
static void say(sup_t *S, const char *what, const char *why) {
    (void)S;
    log_info("balance: %s (%s)", what, why);
}

void sup__balance_tick(sup_t *S, double now) {
    if (!S->o->balance_auto || S->bal.off || S->stopping || S->rb.running) return;
    if (!S->gpu_mode && S->bal.n_cpu == 0) bal_cpu_cap(S);   /* CPU time's first baseline */
    if (S->bal.next_check == 0) S->bal.next_check = now + S->o->balance_every_s;
    if (now < S->bal.next_check || S->last_applied < S->bal.change_step + BALANCE_MIN_STEPS) return;
    S->bal.next_check = now + S->o->balance_every_s;
    double window = S->o->balance_every_s < 100 ? S->o->balance_every_s : 100;
    balance_in_t in = {.min_gain = BALANCE_MIN_GAIN, .busy_floor = BALANCE_BUSY_FLOOR,
                       .cpu_cap = S->gpu_mode ? 0 : bal_cpu_cap(S)};
    int kt = bal_role_rate(S, 1, window, &in.n_targets, &in.target_rate, &in.target_busy);
    int kd = bal_role_rate(S, 0, window, &in.n_drafters, &in.drafter_rate, &in.drafter_busy);
    in.units = in.n_targets + in.n_drafters;
    balance_plan_t p;
    if (kt < 0 || kd < 0) {
        log_debug("balance: no rate measured yet for the %s", kt < 0 ? "targets" : "drafters");
        return;
    }
    if (!S->gpu_mode && !(in.cpu_cap > 0)) {   /* the cores' cap is part of a CPU run's model */
        log_debug("balance: no CPU time per token measured yet");
        return;
    }
    if (balance_plan(&in, &p) < 0) { log_warn("%s", dl_errmsg()); return; }
    S->bal.checks++;
    if (p.verdict != BALANCE_MOVE) {
        /* in the log every time; on the console when the verdict or the split changed */
        char key[64];
        snprintf(key, sizeof key, "%d %d+%d", (int)p.verdict, in.n_targets, in.n_drafters);
        if (strcmp(key, S->bal.last_said) != 0 && p.verdict != BALANCE_UNKNOWN)
            log_info("balance: keeping %d+%d (%s)", in.n_targets, in.n_drafters, p.why);
        else
            log_debug("balance: %s (%s)", balance_verdict_name(p.verdict), p.why);
        snprintf(S->bal.last_said, sizeof S->bal.last_said, "%s", key);
        return;
    }
    char id[64], what[400];
    snprintf(id, sizeof id, "balance-%d", S->bal.moves + 1);
    int tg[RBPLAN_MAX], dg[RBPLAN_MAX];
    if (S->gpu_mode && gpu_lists(S, p.n_targets, p.n_drafters, tg, dg) < 0) {
        snprintf(what, sizeof what, "%d+%d would be better, but the GPUs do not run one stage each: auto "
                 "balance is off for this run", p.n_targets, p.n_drafters);
        say(S, what, p.why);
        S->bal.off = 1;
        return;
    }
    snprintf(what, sizeof what, "moving to %d target(s) + %d drafter(s)", p.n_targets, p.n_drafters);
    say(S, what, p.why);
    if (S->gpu_mode) sup__rb_request(S, id, p.n_targets, p.n_drafters, tg, p.n_targets, dg, p.n_drafters, NULL, NULL);
    else sup__rb_request(S, id, p.n_targets, p.n_drafters, NULL, 0, NULL, 0, NULL, NULL);
    if (!S->rb.running) {
        snprintf(what, sizeof what, "the rebalance to %d+%d did not start (%s): auto balance is off for this run",
                 p.n_targets, p.n_drafters, S->rb.message);
        say(S, what, p.why);
        S->bal.off = 1;
        return;
    }
    S->bal.moves++;
    S->bal.change_step = S->last_applied;
    S->bal.last_said[0] = 0;
}
