/* Supervisor, the console's progress (see sup_int.h, sup_progress_t).
 *
 * Steps are named as steps.jsonl names them (from 0): "step 59 done (60 of 60)". A line
 * is printed when a step was applied since the last one (at most every --progress-every
 * s), at once for the run's last step, and while no step comes "waiting for step N
 * (12 s)" once, then at most every SUP_PROGRESS_WAIT_S. The rate and the ETA come from
 * exponential averages of the step intervals (bias-corrected as Adam's moments, Kingma &
 * Ba 2015 section 3), so they do not jump with one slow or fast step; an optimizer
 * restart (the step goes back) is said and no interval spans it. On a terminal the line
 * is rewritten in place (\r, erase to the end of line) and ended before any other output
 * (sup__progress_break, the log hook); in a file or pipe every line is a plain line.
 * Each step's scalars also go to <out>/tb/ as TensorBoard event files (common/monitor/tb.h). */
#include "supervisor/sup_int.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/monitor/tb.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define SUP_PROGRESS_WAIT_S 30.0    /* "waiting for step N" repeated at most this often */
#define SUP_PROGRESS_EMA 0.8        /* memory of the rate averages: about 5 steps */

static void log_break(void *arg) { sup__progress_break(arg); }

void sup__progress_init(sup_t *S) {
    sup_progress_t *p = &S->prog;
    memset(p, 0, sizeof *p);
    p->t_print = S->t0;          /* the first line after --progress-every s */
    p->tty = isatty(STDOUT_FILENO) == 1;
    if (p->tty) log_set_before(log_break, S);
}

void sup__progress_fini(sup_t *S) {
    sup__progress_break(S);
    mon_tb_close(&S->prog.tb);
    if (S->prog.tty) log_set_before(NULL, NULL);
}

void sup__progress_break(sup_t *S) {
    if (!S->prog.partial) return;
    S->prog.partial = 0;
    fputs("\n", stdout);
    fflush(stdout);
}

/* Prints text as a progress line: rewritten in place on a terminal, a plain line else;
 * is_step: a step's line (kept on the terminal when a "waiting" line follows). */
static void emit(sup_t *S, const char *text, int is_step) {
    S->prog.partial_step = is_step;
    if (S->prog.tty) {
        printf("\r%s\033[K", text);
        S->prog.partial = 1;
    } else {
        printf("%s\n", text);
    }
    fflush(stdout);
    S->prog.t_print = clock_mono_s();
}

static void fmt_dur(double s, char *out, size_t cap) {
    if (!isfinite(s) || s < 0) { snprintf(out, cap, "?"); return; }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(out, cap, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, cap, "%lds", t);
}

/* The line of the last step seen (p->step). */
static void print_step(sup_t *S) {
    sup_progress_t *p = &S->prog;
    double now = clock_mono_s();
    uint64_t done = p->step + 1, max = S->o->max_steps;
    uint64_t left = max > done ? max - done : 0;
    double w = 1 - p->ema_pow;     /* bias correction of both averages */
    int any = p->ema_pow > 0 && p->ema_pow < 1;   /* an interval was seen */
    double step_s = any ? p->ema_dt / w : NAN;
    double rate = any && p->ema_dt > 0 ? p->ema_dtok / p->ema_dt : NAN;
    char eta[32], accs[96] = "", text[512];
    if (left == 0) snprintf(eta, sizeof eta, "done");
    else { snprintf(eta, sizeof eta, "ETA "); fmt_dur(step_s * (double)left, eta + 4, sizeof eta - 4); }
    int n = 0;
    for (int k = 0; k < S->n_acc && k < 4; k++)
        n += snprintf(accs + n, sizeof accs - (size_t)n, "%s%.2f", k ? " " : "", S->acc[k]);
    char rs[32];
    if (isfinite(rate)) snprintf(rs, sizeof rs, "%.0f tok/s", rate);
    else snprintf(rs, sizeof rs, "? tok/s");
    snprintf(text, sizeof text, "[%5.0fs] step %llu done (%llu of %llu)  loss %.4f  lr %.2e  |g| %.3g  "
             "acc %.3f [pos 1-4: %s]  %s  %s", now - S->t0, (unsigned long long)p->step,
             (unsigned long long)done, (unsigned long long)max, p->loss, p->lr, p->gnorm, p->acc_mean,
             accs, rs, eta);
    emit(S, text, 1);
    p->printed = p->step + 1;
    p->t_wait_print = 0;
}

/* Step s's scalars (message m) into <out>/tb/ (opened at the first step; a failure is said
 * once and the run goes on without it). tokens_per_s: the smoothed rate of the line. */
static void tb_step(sup_t *S, const proto_metrics_t *m, uint64_t s) {
    sup_progress_t *p = &S->prog;
    double now = clock_wall_s();
    if (!p->tb && !p->tb_failed && !(p->tb = mon_tb_open(S->o->out_dir, now))) {
        p->tb_failed = 1;
        log_warn("no TensorBoard event file for this run: %s", dl_errmsg());
    }
    if (!p->tb) return;
    int rc = 0;
    for (uint32_t i = 0; i < m->n_metrics && rc == 0; i++) {
        const char *k = m->metrics[i].name;
        char tag[32];
        if (!strcmp(k, "loss") || !strcmp(k, "lr") || !strcmp(k, "grad_norm")) snprintf(tag, sizeof tag, "%s", k);
        else if (!strcmp(k, "acc_mean")) snprintf(tag, sizeof tag, "accuracy/mean");
        else if (!strncmp(k, "acc_", 4)) snprintf(tag, sizeof tag, "accuracy/position_%.8s", k + 4);
        else continue;
        rc = mon_tb_scalar(p->tb, now, (int64_t)s, tag, m->metrics[i].value);
    }
    if (rc == 0 && p->ema_pow > 0 && p->ema_dt > 0)
        rc = mon_tb_scalar(p->tb, now, (int64_t)s, "tokens_per_s", p->ema_dtok / p->ema_dt);
    if (rc == 0) rc = mon_tb_flush(p->tb);
    if (rc < 0) {
        log_warn("TensorBoard event file: %s (no more scalars written)", dl_errmsg());
        mon_tb_close(&p->tb);
        p->tb_failed = 1;
    }
}

void sup__progress_step(sup_t *S, const proto_metrics_t *m) {
    sup_progress_t *p = &S->prog;
    double step = -1, tokens = NAN, loss = NAN, lr = NAN, gnorm = NAN, accm = NAN;
    for (uint32_t i = 0; i < m->n_metrics; i++) {
        const char *k = m->metrics[i].name;
        double v = m->metrics[i].value;
        if (!strcmp(k, "step")) step = v;
        else if (!strcmp(k, "tokens")) tokens = v;
        else if (!strcmp(k, "loss")) loss = v;
        else if (!strcmp(k, "lr")) lr = v;
        else if (!strcmp(k, "grad_norm")) gnorm = v;
        else if (!strcmp(k, "acc_mean")) accm = v;
    }
    if (!(step >= 0 && step < 9e18)) return;
    uint64_t s = (uint64_t)step;
    double now = clock_mono_s();
    if (p->have && s <= p->step) {
        /* a restarted optimizer applies again from its checkpoint: no rate across it */
        char text[256];
        sup__progress_break(S);
        snprintf(text, sizeof text, "[%5.0fs] optimizer restarted from step %llu (steps %llu to %llu are applied "
                 "again)", now - S->t0, (unsigned long long)s, (unsigned long long)s, (unsigned long long)p->step);
        printf("%s\n", text);
        fflush(stdout);
        p->printed = s;
    } else if (p->have && isfinite(tokens) && tokens >= p->tokens && now > p->t_step) {
        double k = (double)(s - p->step);   /* steps since the last one seen (1 unless a message was lost) */
        p->ema_dt = SUP_PROGRESS_EMA * p->ema_dt + (1 - SUP_PROGRESS_EMA) * (now - p->t_step) / k;
        p->ema_dtok = SUP_PROGRESS_EMA * p->ema_dtok + (1 - SUP_PROGRESS_EMA) * (tokens - p->tokens) / k;
        p->ema_pow = (p->ema_pow > 0 ? p->ema_pow : 1) * SUP_PROGRESS_EMA;
    }
    p->have = 1;
    p->step = s;
    p->t_step = now;
    p->tokens = tokens;
    p->loss = loss, p->lr = lr, p->gnorm = gnorm, p->acc_mean = accm;
    tb_step(S, m, s);
    if (s + 1 >= S->o->max_steps) print_step(S);   /* the last step: at once, before the stop */
}

void sup__progress_tick(sup_t *S, double now) {
    sup_progress_t *p = &S->prog;
    char text[256];
    if (now - p->t_print < S->o->progress_every_s) return;
    if (!p->have) {
        if (S->ntab.on && !S->ntab.ready) return;   /* the join wait says what is missing (nodes.c) */
        int up = 0;
        for (int i = 0; i < S->n; i++) up += S->st[i].helloed && !S->st[i].exited;
        /* the same count again only every SUP_PROGRESS_WAIT_S */
        if (up == p->up_printed && now - p->t_print < SUP_PROGRESS_WAIT_S) return;
        p->up_printed = up;
        snprintf(text, sizeof text, "[%5.0fs] starting: %d/%d stages up, waiting for step %llu", now - S->t0, up,
                 S->n, (unsigned long long)S->o->start_step);
        emit(S, text, 0);
        return;
    }
    if (p->printed < p->step + 1) { print_step(S); return; }
    double since = now - p->t_step;
    if (since < S->o->progress_every_s || p->step + 1 >= S->o->max_steps) return;
    if (p->t_wait_print > 0 && now - p->t_wait_print < SUP_PROGRESS_WAIT_S) return;
    if (p->partial_step) sup__progress_break(S);   /* the last step's line stays on the terminal */
    snprintf(text, sizeof text, "[%5.0fs] waiting for step %llu (%.0f s since step %llu)", now - S->t0,
             (unsigned long long)(p->step + 1), since, (unsigned long long)p->step);
    emit(S, text, 0);
    p->t_wait_print = now;
}

void sup__progress_final(sup_t *S) {
    if (S->prog.have && S->prog.printed < S->prog.step + 1) print_step(S);
    sup__progress_fini(S);
}

void sup__rates(const sup_t *S, double now, sup_rates_t *r) {
    uint64_t n = S->n_losses, s0 = S->o->start_step;
    memset(r, 0, sizeof *r);
    r->note = "";
    for (uint64_t i = 0; i < n; i++) r->tokens += S->step_tok[i];
    double t_start = S->o->t_launch > 0 ? S->o->t_launch : S->t0;
    r->wall_s = now - t_start;
    r->wall = r->wall_s > 0 ? r->tokens / r->wall_s : 0;
    /* the first step ever heard (not step_t[0]: an optimizer restart cuts the history back
     * and a re-applied step 0 would count the death and the restart as start-up) */
    r->startup_s = S->have_step ? S->t_first_step - t_start : 0;
    r->final_ckpt_s = S->final_ckpt_s;
    uint64_t a, z;   /* the window: steps a..z of this run, timed from the end of step a - 1 */
    if (n >= 4) {
        a = 2, z = n - 2;
    } else if (n >= 2) {
        a = 1, z = n - 1;
        r->note = "too few steps to leave out the first two and the last";
    } else {
        r->note = n ? "one step" : "no step";
        return;
    }
    double tok = 0;
    for (uint64_t i = a; i <= z; i++) tok += S->step_tok[i];
    double dt = S->step_t[z] - S->step_t[a - 1];
    r->steady = dt > 0 ? tok / dt : 0;
    r->from = s0 + a;
    r->to = s0 + z;
}
