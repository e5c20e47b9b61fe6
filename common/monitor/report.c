/* Text snapshot of a run (see report.h). */
#include "common/monitor/report.h"
#include "common/base/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/sbuf.h"

static void fmt_bytes(double v, char *out, size_t cap) {
    if (!isfinite(v)) { snprintf(out, cap, "n/a"); return; }
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (v >= 1024 && i < 4) { v /= 1024; i++; }
    if (i == 0) snprintf(out, cap, "%.0f B", v);
    else snprintf(out, cap, "%.1f %s", v, u[i]);
}

static void fmt_dur(double s, char *out, size_t cap) {
    if (!isfinite(s) || s < 0) { snprintf(out, cap, "?"); return; }
    long t = (long)(s + 0.5);
    if (t >= 86400) snprintf(out, cap, "%ldd%02ldh", t / 86400, (t / 3600) % 24);
    else if (t >= 3600) snprintf(out, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(out, cap, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, cap, "%lds", t);
}

double mon_report_now(const mon_run_t *run, double wall, double live_s) {
    if (run->last_ts <= 0) return wall;
    return wall - run->last_ts <= live_s ? wall : run->last_ts;
}

/* Integer percents of a row's n shares (s[k] in [0, 1], adding up to at most 1; n <=
 * REPORT_SHARES) that add up to at most 100: each is floored, then the points the rounded
 * total has left go to the largest remainders (plain %.0f rounding shows 34 + 34 + 33
 * for 0.335 + 0.335 + 0.33). Non-finite or negative shares count as 0. */
#define REPORT_SHARES 4     /* BUSY, WAIT-IN, WAIT-CR, WAIT-GPU */
static void pct_shares(const double *s, int n, int *out) {
    double total = 0, rem[REPORT_SHARES];
    int sum = 0;
    for (int k = 0; k < n; k++) {
        double x = isfinite(s[k]) && s[k] > 0 ? 100 * s[k] : 0;
        out[k] = (int)floor(x);
        rem[k] = x - out[k];
        sum += out[k];
        total += x;
    }
    int want = (int)floor(total + 0.5);
    if (want > 100) want = 100;
    while (sum < want) {
        int best = 0;
        for (int k = 1; k < n; k++) if (rem[k] > rem[best]) best = k;
        out[best]++;
        rem[best] = -1;
        sum++;
    }
}

/* The STAGE table: one row per stage (the first n have metrics, ms[i], the rest only a
 * run.json entry), a NODE column on multi-node runs. The four shares (BUSY, WAIT-IN,
 * WAIT-CR, WAIT-GPU) add up to 100 when the diagnosis accounts the whole window. Widths:
 * a single-node run with stage names of up to 9 characters (the optimizer's; up to 99
 * targets and drafters) has rows of 80 columns before the diagnosis (82 while a stage
 * shows "restarting": the STATE column widens so the rows still line up). cols > 0: a row
 * wider than cols has its diagnosis on a line of its own. */
static void report_stages(sbuf_t *bp, const mon_stage_t *const *ms, const mon_topo_t *rt,
                          const mon_stage_view_t *views, const mon_diag_t *diags, int n, int n_all,
                          const char **shown, int cols) {
    char pc[REPORT_SHARES][32], d4[32];
    int any_node = 0;   /* multi-node runs: a NODE column (run.json's node of each stage) */
    for (int k = 0; k < rt->n_stages; k++) any_node |= rt->stages[k].node[0] != 0;
    int wn = 5;         /* STAGE: as wide as the longest name, so every row lines up */
    int ws = 8;         /* STATE: 8, or the longest state shown ("restarting") */
    for (int i = 0; i < n_all; i++) {
        if (views[i].name && (int)strlen(views[i].name) > wn) wn = (int)strlen(views[i].name);
        if ((int)strlen(shown[i]) > ws) ws = (int)strlen(shown[i]);
    }
    sbuf_printf(bp, "\n%-*s %-9s ", wn, "STAGE", "ROLE");
    if (any_node) sbuf_printf(bp, "%-10s ", "NODE");
    sbuf_printf(bp, "%3s %-*s %8s %4s %7s %7s %8s %8s  %s\n", "INC", ws, "STATE", "TOK/S",
        "BUSY", "WAIT-IN", "WAIT-CR", "WAIT-GPU", "NO-PROGR", "DIAGNOSIS");
    for (int i = 0; i < n_all; i++) {
        const mon_stage_t *s = i < n ? ms[i] : NULL;
        const mon_stage_view_t *v = &views[i];
        const mon_diag_t *d = &diags[i];
        double sh[REPORT_SHARES] = {d->share_busy, d->share_in, d->share_credit, d->share_gpu};
        int p[REPORT_SHARES];
        pct_shares(sh, REPORT_SHARES, p);
        for (int k = 0; k < REPORT_SHARES; k++) {
            if (v->dt > 0) snprintf(pc[k], sizeof pc[k], "%d%%", p[k]);
            else snprintf(pc[k], sizeof pc[k], "-");
        }
        fmt_dur(v->since_progress_s, d4, sizeof d4);
        char tps[32], row[320], diag[200];
        if (isfinite(v->tokens_per_s)) snprintf(tps, sizeof tps, "%.1f", v->tokens_per_s);
        else snprintf(tps, sizeof tps, "-");
        const mon_topo_stage_t *tn = mon_topo_stage(rt, v->name);
        int w = snprintf(row, sizeof row, "%-*s %-9s ", wn, v->name, mon_role_name(v->role));
        if (any_node) w += snprintf(row + w, sizeof row - (size_t)w, "%-10s ", tn && tn->node[0] ? tn->node : "-");
        snprintf(row + w, sizeof row - (size_t)w, "%3llu %-*s %8s %4s %7s %7s %8s %8s",
            (unsigned long long)(s ? s->incarnation : tn ? tn->incarnation : 0), ws, shown[i], tps,
            pc[0], pc[1], pc[2], pc[3], d4);
        snprintf(diag, sizeof diag, "%s: %s", mon_diag_name(d->kind), d->why);
        if (cols > 0 && strlen(row) + 2 + strlen(diag) > (size_t)cols)
            sbuf_printf(bp, "%s\n    %s\n", row, diag);
        else
            sbuf_printf(bp, "%s  %s\n", row, diag);
    }
}

/* "run DIR: N stages, last metrics ... ago (live)" and the malformed-lines warning. */
static void report_header(sbuf_t *b, const mon_run_t *run, const mon_report_opts_t *o, int n_shown,
                          int n_retired, int finished) {
    char d1[32];
    if (run->last_ts <= 0) {
        sbuf_printf(b, "run %s: no metrics yet (%llu lines)\n", run->dir[0] ? run->dir : "-",
            (unsigned long long)run->lines);
    } else {
        fmt_dur(o->wall - run->last_ts, d1, sizeof d1);
        char retired[32] = "";
        if (n_retired) snprintf(retired, sizeof retired, " (+%d retired)", n_retired);
        sbuf_printf(b, "run %s: %d stages%s, last metrics %s ago%s\n", run->dir[0] ? run->dir : "-", n_shown,
            retired, d1, finished ? " (finished: shown as of its last metrics)"
                         : o->now < o->wall - 1e-9 ? " (not live: shown as of its last metrics)" : " (live)");
    }
    if (run->bad_lines)
        sbuf_printf(b, "warning: %llu malformed line(s) skipped (last: %s)\n", (unsigned long long)run->bad_lines,
            run->last_error);
}

/* "training: step 9 done (10 of 100) ...": steps named from 0 as steps.jsonl and the
 * run's console name them; no ETA once the run is stopped or max_steps is reached. */
static void report_training(sbuf_t *b, const mon_run_t *run, const mon_topo_t *t) {
    const mon_step_t *st = mon_run_last_step(run);
    if (!st) {
        sbuf_printf(b, "training: no step applied yet\n");
        return;
    }
    double tps = mon_tokens_per_s(run);
    unsigned long long done = (unsigned long long)st->step + 1, max = (unsigned long long)t->max_steps;
    char steps[80], eta[64], d1[32];
    if (max) snprintf(steps, sizeof steps, "%llu done (%llu of %llu)", done - 1, done, max);
    else snprintf(steps, sizeof steps, "%llu done (%llu)", done - 1, done);
    if (!strcmp(t->run_state, "stopped") || (max && done >= max)) {
        snprintf(eta, sizeof eta, "finished");
    } else if (!strcmp(t->run_state, "stopping")) {
        snprintf(eta, sizeof eta, "stopping");
    } else {
        fmt_dur(mon_eta_s(run, t->max_steps), d1, sizeof d1);
        snprintf(eta, sizeof eta, "ETA %s", max ? d1 : "? (max steps unknown)");
    }
    sbuf_printf(b, "training: step %s  loss %.4f  acc %.3f  %.0f tok/s  %s\n", steps, st->loss,
        st->acc_mean, isfinite(tps) ? tps : 0.0, eta);
    if (st->n_acc > 1) {
        sbuf_printf(b, "accuracy by position:");
        for (int k = 1; k < st->n_acc; k++)
            if (isfinite(st->acc[k])) sbuf_printf(b, " %d:%.3f", k, st->acc[k]);
        sbuf_printf(b, "\n");
    }
}

/* The drafters' inbox fill per tier (a CPU run's inbox is host memory whichever tier
 * holds it: one used / cap column, both tiers summed) and the GPUs (none on a CPU run). */
static void report_inbox_gpus(sbuf_t *b, const mon_report_opts_t *o, const mon_stage_view_t *views, int n) {
    char d1[32], d2[32];
    int any = 0, cpu = o->topo.cpu_run;
    for (int i = 0; i < n; i++) {
        const mon_stage_view_t *v = &views[i];
        if (v->role != MON_ROLE_DRAFTER || !isfinite(v->inbox_used)) continue;
        if (!any && cpu) sbuf_printf(b, "\n%-12s %-26s %6s\n", "INBOX", "USED / CAP", "FILL");
        else if (!any) sbuf_printf(b, "\n%-12s %-26s %-26s %6s\n", "INBOX", "GPU TIER (used / cap)", "HOST TIER (used / cap)", "FILL");
        any = 1;
        char g[80], h[80];
        fmt_bytes(v->inbox_gpu_used, d1, sizeof d1);
        fmt_bytes(v->inbox_gpu_cap, d2, sizeof d2);
        snprintf(g, sizeof g, "%s / %s", d1, d2);
        fmt_bytes(v->inbox_host_used, d1, sizeof d1);
        fmt_bytes(v->inbox_host_cap, d2, sizeof d2);
        snprintf(h, sizeof h, "%s / %s", d1, d2);
        char fill[16];
        if (v->inbox_cap > 0) snprintf(fill, sizeof fill, "%.1f%%", 100 * v->inbox_used / v->inbox_cap);
        else snprintf(fill, sizeof fill, "-");
        if (cpu) {
            fmt_bytes(v->inbox_used, d1, sizeof d1);
            fmt_bytes(v->inbox_cap, d2, sizeof d2);
            snprintf(h, sizeof h, "%s / %s", d1, d2);
            sbuf_printf(b, "%-12s %-26s %6s\n", v->name, h, fill);
        }
        else sbuf_printf(b, "%-12s %-26s %-26s %6s\n", v->name, g, h, fill);
    }
    if (!any) sbuf_printf(b, "\nINBOX        n/a (no drafter has published inbox bytes yet)\n");
    if (cpu) return;
    if (!o->gpus) {
        sbuf_printf(b, "\nGPU          n/a%s%s%s\n", o->nvml_why ? " (" : "", o->nvml_why ? o->nvml_why : "",
            o->nvml_why ? ")" : "");
        return;
    }
    sbuf_printf(b, "\n%-4s %-28s %5s %24s\n", "GPU", "NAME", "UTIL", "MEMORY (used / total)");
    for (int g = 0; g < o->n_gpus; g++) {
        const mon_gpu_t *x = &o->gpus[g];
        fmt_bytes((double)x->mem_used, d1, sizeof d1);
        fmt_bytes((double)x->mem_total, d2, sizeof d2);
        char m[80];
        snprintf(m, sizeof m, "%s / %s", d1, d2);
        sbuf_printf(b, "%-4d %-28.28s %4u%% %24s\n", x->index, x->name, x->util_gpu_pct, m);
    }
}

/* text's lines no wider than cols: a longer one goes on at word boundaries, the rest
 * indented by 4 (a word longer than the line is split); nothing is cut. */
static void wrap_lines(sbuf_t *b, const char *text, int cols) {
    const int ind = 4;
    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        size_t width = (size_t)cols, off = 0;
        int first = 1;
        while (len - off > width) {
            size_t cut = off + width;
            while (cut > off && l[cut] != ' ') cut--;
            if (cut == off) cut = off + width;          /* one long word */
            sbuf_printf(b, "%*s%.*s\n", first ? 0 : ind, "", (int)(cut - off), l + off);
            off = cut;
            while (off < len && l[off] == ' ') off++;
            if (first) { first = 0; width = cols > 2 * ind ? (size_t)(cols - ind) : (size_t)cols; }
        }
        sbuf_printf(b, "%*s%.*s\n", first ? 0 : ind, "", (int)(len - off), l + off);
        l = e ? e + 1 : l + len;
    }
}

/* Views and diagnoses of the rows: the stages with metrics that belong to the topology
 * (ms[0..*n)), then run.json's stages without metrics yet; *n_all rows in all. */
static void report_rows(const mon_run_t *run, const mon_report_opts_t *o, const mon_stage_t **ms, int *n,
                        int n_all, mon_stage_view_t *views, mon_diag_t *diags, const char **shown,
                        int *n_retired) {
    const mon_topo_t *rt = &o->topo;
    int finished = !strcmp(rt->run_state, "stopped");
    *n = *n_retired = 0;
    for (int j = 0; j < run->n_stages; j++) {
        const mon_stage_t *s = run->stages[j];
        if (!mon_topo_has(rt, s->name)) continue;       /* an earlier run's stage */
        int i = (*n)++;
        ms[i] = s;
        mon_stage_view(s, o->now, o->diag.window_s, &views[i]);
        /* the process is gone (run.json of the same incarnation says so, or the run
         * finished): its last metrics said "stopping", its state is final now */
        const mon_topo_stage_t *ts = mon_topo_stage(rt, s->name);
        const char *gone = NULL;
        if (ts && !strcmp(ts->process, "retired")) gone = "retired";
        else if (finished || (ts && !strcmp(ts->process, "exited") && ts->incarnation == s->incarnation))
            gone = "exited";
        if (gone) snprintf(views[i].state, sizeof views[i].state, "%s", gone);
        /* a newer incarnation is loading: the old one's last metrics are not a silence */
        else if (ts && ts->incarnation > s->incarnation)
            snprintf(views[i].state, sizeof views[i].state, "starting");
        *n_retired += gone && !strcmp(gone, "retired");
        mon_diagnose(&views[i], &o->diag, &diags[i]);
        shown[i] = views[i].state;
    }
    for (int k = 0, i = *n; k < rt->n_stages && i < n_all; k++) {
        const mon_topo_stage_t *ts = &rt->stages[k];
        if (mon_run_stage(run, ts->name) || !strcmp(ts->process, "retired")) continue;
        mon_stage_view_t *v = &views[i];
        v->name = ts->name;
        v->role = mon_role_of(ts->stage_id, ts->name);
        v->since_progress_s = v->tokens_per_s = v->queued = NAN;
        v->inbox_used = v->inbox_cap = NAN;
        v->inbox_gpu_used = v->inbox_gpu_cap = v->inbox_host_used = v->inbox_host_cap = NAN;
        mon_diagnose(v, &o->diag, &diags[i]);       /* no state: unknown, "no metrics yet" */
        shown[i++] = finished ? "exited" : ts->process[0] ? ts->process : "-";
    }
}

int mon_report(const mon_run_t *run, const mon_report_opts_t *o, char **text) {
    sbuf_t b = {0};
    /* the rows: the live topology (run.json's stages; a retired one marked, not counted),
     * with or without metrics; a name only metrics.jsonl knows (an earlier run's) has none */
    const mon_topo_t *rt = &o->topo;
    int finished = !strcmp(rt->run_state, "stopped");
    int n_all = 0;
    for (int i = 0; i < run->n_stages; i++) n_all += mon_topo_has(rt, run->stages[i]->name);
    for (int k = 0; k < rt->n_stages; k++)
        n_all += !mon_run_stage(run, rt->stages[k].name) && strcmp(rt->stages[k].process, "retired") != 0;
    mon_stage_view_t *views = calloc((size_t)n_all + 1, sizeof *views);
    mon_diag_t *diags = calloc((size_t)n_all + 1, sizeof *diags);
    const char **shown = calloc((size_t)n_all + 1, sizeof *shown);
    const mon_stage_t **ms = calloc((size_t)n_all + 1, sizeof *ms);
    if (!views || !diags || !shown || !ms) {
        free(views); free(diags); free(shown); free(ms);
        return dl_seterr(DL_ENOMEM, "monitor: out of memory");
    }
    int n, n_retired;
    report_rows(run, o, ms, &n, n_all, views, diags, shown, &n_retired);
    report_header(&b, run, o, n_all - n_retired, n_retired, finished);
    report_training(&b, run, rt);
    mon_topo_t topo = o->topo;
    mon_topo_from_run(run, &topo);
    mon_bottleneck_t bn;
    mon_bottleneck(views, diags, n_all, &topo, run->dir, &bn);
    sbuf_printf(&b, "bottleneck: %s\n", bn.text);
    if (rt->ckpt_error[0])
        sbuf_printf(&b, "checkpoint step_%lld could not be written: %s (training went on)\n",
                    (long long)rt->ckpt_failed_step, rt->ckpt_error);
    report_stages(&b, ms, rt, views, diags, n, n_all, shown, o->cols);
    report_inbox_gpus(&b, o, views, n);
    free(views);
    free(diags);
    free(shown);
    free(ms);
    size_t text_len;
    if (sbuf_take(&b, text, &text_len) < 0) return dl_seterr(DL_ENOMEM, "monitor: out of memory");
    if (o->cols <= 0) return 0;
    sbuf_t w = {0};
    wrap_lines(&w, *text, o->cols);
    free(*text);
    *text = NULL;
    if (sbuf_take(&w, text, &text_len) < 0) return dl_seterr(DL_ENOMEM, "monitor: out of memory");
    return 0;
}
