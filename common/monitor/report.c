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

static void fmt_pct(double x, char *out, size_t cap) {
    if (!isfinite(x)) snprintf(out, cap, "-");
    else snprintf(out, cap, "%.0f%%", 100 * x);
}

double mon_report_now(const mon_run_t *run, double wall, double live_s) {
    if (run->last_ts <= 0) return wall;
    return wall - run->last_ts <= live_s ? wall : run->last_ts;
}

/* The STAGE table: one row per stage (the first n have metrics, the rest only a run.json
 * entry), a NODE column on multi-node runs. */
static void report_stages(sbuf_t *bp, const mon_run_t *run, const mon_topo_t *rt, const mon_stage_view_t *views,
                          const mon_diag_t *diags, int n, int n_all, const char **shown) {
    char d1[32], d2[32], d3[32], d4[32];
    int any_node = 0;   /* multi-node runs: a NODE column (run.json's node of each stage) */
    for (int k = 0; k < rt->n_stages; k++) any_node |= rt->stages[k].node[0] != 0;
    sbuf_printf(bp, "\n%-12s %-9s ", "STAGE", "ROLE");
    if (any_node) sbuf_printf(bp, "%-10s ", "NODE");
    sbuf_printf(bp, "%3s %-9s %9s %5s %7s %7s %9s  %s\n", "INC", "STATE", "TOK/S",
        "BUSY", "WAIT-IN", "WAIT-CR", "NO-PROGR", "DIAGNOSIS");
    for (int i = 0; i < n_all; i++) {
        const mon_stage_t *s = i < n ? run->stages[i] : NULL;
        const mon_stage_view_t *v = &views[i];
        const mon_diag_t *d = &diags[i];
        int have = v->dt > 0;
        fmt_pct(have ? d->share_busy : NAN, d1, sizeof d1);
        fmt_pct(have ? d->share_in : NAN, d2, sizeof d2);
        fmt_pct(have ? d->share_credit : NAN, d3, sizeof d3);
        fmt_dur(v->since_progress_s, d4, sizeof d4);
        char tps[32];
        if (isfinite(v->tokens_per_s)) snprintf(tps, sizeof tps, "%.1f", v->tokens_per_s);
        else snprintf(tps, sizeof tps, "-");
        const mon_topo_stage_t *ts = s ? NULL : mon_topo_stage(rt, v->name);
        const mon_topo_stage_t *tn = mon_topo_stage(rt, v->name);
        sbuf_printf(bp, "%-12s %-9s ", v->name, mon_role_name(v->role));
        if (any_node) sbuf_printf(bp, "%-10s ", tn && tn->node[0] ? tn->node : "-");
        sbuf_printf(bp, "%3llu %-9s %9s %5s %7s %7s %9s  %s: %s\n",
            (unsigned long long)(s ? s->incarnation : ts ? ts->incarnation : 0), shown[i], tps, d1, d2, d3, d4,
            mon_diag_name(d->kind), d->why);
    }
}

int mon_report(const mon_run_t *run, const mon_report_opts_t *o, char **text) {
    sbuf_t b = {0};
    int n = run->n_stages;
    /* run.json's stages (the live topology) that sent no metrics yet get a row too (a
     * target added by a rebalance, still loading); a retired one does not */
    const mon_topo_t *rt = &o->topo;
    int finished = !strcmp(rt->run_state, "stopped");
    int n_all = n;
    for (int k = 0; k < rt->n_stages; k++)
        n_all += !mon_run_stage(run, rt->stages[k].name) && strcmp(rt->stages[k].process, "retired") != 0;
    mon_stage_view_t *views = calloc((size_t)n_all + 1, sizeof *views);
    mon_diag_t *diags = calloc((size_t)n_all + 1, sizeof *diags);
    const char **shown = calloc((size_t)n_all + 1, sizeof *shown);
    if (!views || !diags || !shown) {
        free(views); free(diags); free(shown);
        return dl_seterr(DL_ENOMEM, "monitor: out of memory");
    }
    int n_retired = 0;
    for (int i = 0; i < n; i++) {
        mon_stage_view(run->stages[i], o->now, o->diag.window_s, &views[i]);
        /* the process is gone (run.json of the same incarnation says so, or the run
         * finished): its last metrics said "stopping", its state is final now */
        const mon_topo_stage_t *ts = mon_topo_stage(rt, run->stages[i]->name);
        const char *gone = NULL;
        if (ts && !strcmp(ts->process, "retired")) gone = "retired";
        else if (finished || (ts && !strcmp(ts->process, "exited") && ts->incarnation == run->stages[i]->incarnation))
            gone = "exited";
        if (gone) snprintf(views[i].state, sizeof views[i].state, "%s", gone);
        /* a newer incarnation is loading: the old one's last metrics are not a silence */
        else if (ts && ts->incarnation > run->stages[i]->incarnation)
            snprintf(views[i].state, sizeof views[i].state, "starting");
        n_retired += gone && !strcmp(gone, "retired");
        mon_diagnose(&views[i], &o->diag, &diags[i]);
        shown[i] = views[i].state;
    }
    for (int k = 0, i = n; k < rt->n_stages && i < n_all; k++) {
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
    char d1[32], d2[32];
    /* header */
    if (run->last_ts <= 0) {
        sbuf_printf(&b, "run %s: no metrics yet (%llu lines)\n", run->dir[0] ? run->dir : "-",
            (unsigned long long)run->lines);
    } else {
        double ago = o->wall - run->last_ts;
        fmt_dur(ago, d1, sizeof d1);
        char retired[32] = "";
        if (n_retired) snprintf(retired, sizeof retired, " (+%d retired)", n_retired);
        sbuf_printf(&b, "run %s: %d stages%s, last metrics %s ago%s\n", run->dir[0] ? run->dir : "-", n_all - n_retired,
            retired, d1, finished ? " (finished: shown as of its last metrics)"
                         : o->now < o->wall - 1e-9 ? " (not live: shown as of its last metrics)" : " (live)");
    }
    if (run->bad_lines)
        sbuf_printf(&b, "warning: %llu malformed line(s) skipped (last: %s)\n", (unsigned long long)run->bad_lines,
            run->last_error);
    /* training */
    const mon_step_t *st = mon_run_last_step(run);
    if (st) {
        double eta = mon_eta_s(run, o->topo.max_steps);
        double tps = mon_tokens_per_s(run);
        fmt_dur(eta, d1, sizeof d1);
        char steps[64];
        if (o->topo.max_steps) snprintf(steps, sizeof steps, "%llu/%llu", (unsigned long long)(st->step + 1),
                                        (unsigned long long)o->topo.max_steps);
        else snprintf(steps, sizeof steps, "%llu", (unsigned long long)(st->step + 1));
        sbuf_printf(&b, "training: step %s  loss %.4f  acc %.3f  %.0f tok/s  ETA %s\n", steps, st->loss,
            st->acc_mean, isfinite(tps) ? tps : 0.0, o->topo.max_steps ? d1 : "? (max steps unknown)");
        if (st->n_acc > 1) {
            sbuf_printf(&b, "accuracy by position:");
            for (int k = 1; k < st->n_acc; k++)
                if (isfinite(st->acc[k])) sbuf_printf(&b, " %d:%.3f", k, st->acc[k]);
            sbuf_printf(&b, "\n");
        }
    } else {
        sbuf_printf(&b, "training: no step applied yet\n");
    }
    mon_topo_t topo = o->topo;
    mon_topo_from_run(run, &topo);
    mon_bottleneck_t bn;
    mon_bottleneck(views, diags, n_all, &topo, run->dir, &bn);
    sbuf_printf(&b, "bottleneck: %s\n", bn.text);
    if (rt->ckpt_error[0])
        sbuf_printf(&b, "checkpoint step_%lld could not be written: %s (training went on)\n",
                    (long long)rt->ckpt_failed_step, rt->ckpt_error);
    report_stages(&b, run, rt, views, diags, n, n_all, shown);
    /* inboxes */
    int any = 0;
    for (int i = 0; i < n; i++) {
        const mon_stage_view_t *v = &views[i];
        if (v->role != MON_ROLE_DRAFTER || !isfinite(v->inbox_used)) continue;
        if (!any) sbuf_printf(&b, "\n%-12s %-26s %-26s %6s\n", "INBOX", "GPU TIER (used / cap)", "HOST TIER (used / cap)", "FILL");
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
        sbuf_printf(&b, "%-12s %-26s %-26s %6s\n", v->name, g, h, fill);
    }
    if (!any) sbuf_printf(&b, "\nINBOX        n/a (no drafter has published inbox bytes yet)\n");
    /* GPUs */
    if (!o->gpus) {
        sbuf_printf(&b, "\nGPU          n/a%s%s%s\n", o->nvml_why ? " (" : "", o->nvml_why ? o->nvml_why : "",
            o->nvml_why ? ")" : "");
    } else {
        sbuf_printf(&b, "\n%-4s %-28s %5s %24s\n", "GPU", "NAME", "UTIL", "MEMORY (used / total)");
        for (int g = 0; g < o->n_gpus; g++) {
            const mon_gpu_t *x = &o->gpus[g];
            fmt_bytes((double)x->mem_used, d1, sizeof d1);
            fmt_bytes((double)x->mem_total, d2, sizeof d2);
            char m[80];
            snprintf(m, sizeof m, "%s / %s", d1, d2);
            sbuf_printf(&b, "%-4d %-28.28s %4u%% %24s\n", x->index, x->name, x->util_gpu_pct, m);
        }
    }
    free(views);
    free(diags);
    free(shown);
    size_t text_len;
    if (sbuf_take(&b, text, &text_len) < 0) return dl_seterr(DL_ENOMEM, "monitor: out of memory");
    return 0;
}
