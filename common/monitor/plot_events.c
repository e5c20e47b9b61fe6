/* Events for `draftline plot` (see plot_events.h). */
#include "common/monitor/plot_events.h"
#include "common/rundir/rundir.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EV_MAX_STAGES 160

typedef struct {
    mon_plot_mark_t *m;
    int n;
    char names[EV_MAX_STAGES][32];
    uint64_t inc[EV_MAX_STAGES];
    double up[EV_MAX_STAGES];   /* its last uptime_s (a new process of one incarnation: it goes down) */
    int n_st;
    double step;                /* the last optimizer step seen (-1: none yet) */
    int resumed_at;             /* a resume mark at this step: new stages there are its, not a rebalance */
} ev_t;

static void add(ev_t *e, double step, mon_mark_kind_t kind, const char *label) {
    for (int i = 0; i < e->n; i++)
        if (e->m[i].kind == kind && e->m[i].step == step) {
            size_t l = strlen(e->m[i].label);
            if (kind != MON_MARK_RESUME && l + 3 < sizeof e->m[i].label && !strstr(e->m[i].label, "+"))
                snprintf(e->m[i].label + l, sizeof e->m[i].label - l, " +");   /* several at one step */
            return;
        }
    if (e->n >= MON_PLOT_MAX_MARKS) return;
    e->m[e->n].step = step < 0 ? 0 : step;
    e->m[e->n].kind = kind;
    snprintf(e->m[e->n].label, sizeof e->m[e->n].label, "%s", label);
    e->n++;
}

static void on_line(ev_t *e, const rundir_metrics_rec_t *r) {
    char lab[48];
    if (!strcmp(r->stage, "eval")) {
        double s = rundir_metrics_get(r, "step"), tau = rundir_metrics_get(r, "tau");
        if (isfinite(s) && s >= 1 && isfinite(tau)) {
            snprintf(lab, sizeof lab, "\xcf\x84 %.2f", tau);
            add(e, s - 1, MON_MARK_TAU, lab);
        }
        return;
    }
    double before = e->step;   /* a stage first seen with its own first step line is no newcomer */
    if (!strcmp(r->stage, "optimizer") && !strcmp(r->state, "step")) {
        double s = rundir_metrics_get(r, "step");
        if (isfinite(s) && s >= 0) e->step = s;
    }
    int k = 0;
    while (k < e->n_st && strcmp(e->names[k], r->stage)) k++;
    if (k == e->n_st) {
        if (k == EV_MAX_STAGES) return;
        snprintf(e->names[k], sizeof e->names[k], "%s", r->stage);
        e->inc[k] = r->incarnation;
        e->up[k] = rundir_metrics_get(r, "uptime_s");
        e->n_st++;
        if (before >= 0 && e->resumed_at != (int)before) add(e, before, MON_MARK_REBALANCE, "rebalance");
        return;
    }
    double up = rundir_metrics_get(r, "uptime_s");
    if (r->incarnation > e->inc[k]) {
        snprintf(lab, sizeof lab, "restart %.30s", r->stage);
        add(e, e->step, MON_MARK_RESTART, lab);
    } else if (r->incarnation < e->inc[k] || (isfinite(up) && isfinite(e->up[k]) && up < e->up[k] - 1)) {
        add(e, e->step, MON_MARK_RESUME, "resume");   /* a new supervisor: incarnations start again */
        e->resumed_at = (int)e->step;
    }
    e->inc[k] = r->incarnation;
    if (isfinite(up)) e->up[k] = up;
}

/* The end of the lr warm-up: lr rises from the first step to a peak before the last. */
static void lr_peak(const mon_run_t *run, ev_t *e) {
    double best = -1, first = NAN;
    uint64_t at = 0, last = 0;
    for (uint64_t i = 0; i < run->n_steps; i++) {
        const mon_step_t *s = &run->steps[i];
        if (!s->have || !isfinite(s->lr)) continue;
        if (isnan(first)) first = s->lr;
        if (s->lr > best) best = s->lr, at = s->step;
        last = s->step;
    }
    if (best > first && at < last) {
        char lab[48];
        snprintf(lab, sizeof lab, "lr peak %.1e", best);
        add(e, (double)at, MON_MARK_LR, lab);
    }
}

/* The checkpoints of steps.jsonl: how long each held the steps (the tokens/s dip). */
static void ckpt_marks(const mon_run_t *run, ev_t *e) {
    char p[4200];
    snprintf(p, sizeof p, "%s/steps.jsonl", run->dir);
    FILE *f = run->dir[0] ? fopen(p, "r") : NULL;
    char *line = NULL;
    size_t cap = 0;
    while (f && getline(&line, &cap, f) > 0) {
        if (!strstr(line, "\"ckpt_step\"")) continue;
        cJSON *j = cJSON_Parse(line);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "ckpt_step");
        if (cJSON_IsNumber(s) && s->valuedouble >= 1) {
            const cJSON *w = cJSON_GetObjectItemCaseSensitive(j, "ckpt_waited_s");
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "ckpt_snapshot_s");
            double held = (cJSON_IsNumber(w) ? w->valuedouble : 0) + (cJSON_IsNumber(n) ? n->valuedouble : 0);
            char lab[48];
            snprintf(lab, sizeof lab, "ckpt %.0f held %.1f s", s->valuedouble, held);
            add(e, s->valuedouble - 1, MON_MARK_CKPT, lab);
        }
        cJSON_Delete(j);
    }
    free(line);
    if (f) fclose(f);
}

int mon_plot_events(const mon_run_t *run, mon_plot_mark_t *marks) {
    ev_t e;
    memset(&e, 0, sizeof e);
    e.m = marks;
    e.step = -1;
    e.resumed_at = -1;
    char p[4200];
    snprintf(p, sizeof p, "%s/metrics.jsonl", run->dir);
    FILE *f = run->dir[0] ? fopen(p, "r") : NULL;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while (f && (len = getline(&line, &cap, f)) > 0) {
        rundir_metrics_rec_t r;
        if (rundir_metrics_parse_line(line, (size_t)len, &r) == 0) on_line(&e, &r);
        rundir_metrics_rec_free(&r);
    }
    free(line);
    if (f) fclose(f);
    lr_peak(run, &e);
    ckpt_marks(run, &e);   /* last: past MON_PLOT_MAX_MARKS these are the ones left out */
    return e.n;
}
