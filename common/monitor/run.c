/* The monitor's run picture (see run.h). */
#include "common/monitor/run.h"
#include "common/base/err.h"
#include "common/monitor/tail.h"
#include "common/rundir/rundir.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const ROLE_NAMES[MON_ROLE_COUNT_] = {"unknown", "loader", "target", "drafter",
                                                        "optimizer"};

const char *mon_role_name(mon_role_t r) {
    return (unsigned)r < MON_ROLE_COUNT_ ? ROLE_NAMES[r] : "unknown";
}

mon_role_t mon_role_of(uint32_t id, const char *name) {
    if (id == 1) return MON_ROLE_LOADER;
    if (id == 2) return MON_ROLE_OPTIMIZER;
    if (id >= 200 && id < 300) return MON_ROLE_TARGET;
    if (id >= 100 && id < 200) return MON_ROLE_DRAFTER;
    if (!name) return MON_ROLE_UNKNOWN;
    for (int r = 1; r < MON_ROLE_COUNT_; r++)
        if (!strncmp(name, ROLE_NAMES[r], strlen(ROLE_NAMES[r]))) return (mon_role_t)r;
    return MON_ROLE_UNKNOWN;
}

mon_run_t *mon_run_new(void) { return calloc(1, sizeof(mon_run_t)); }

mon_run_t *mon_run_open(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        dl_seterr(DL_ENOENT, "run dir %s: not a directory", dir);
        return NULL;
    }
    if (strlen(dir) + 20 > sizeof ((mon_run_t *)0)->dir) {
        dl_seterr(DL_ERANGE, "run dir %s: path too long", dir);
        return NULL;
    }
    mon_run_t *run = mon_run_new();
    if (!run) { dl_seterr(DL_ENOMEM, "monitor: out of memory"); return NULL; }
    snprintf(run->dir, sizeof run->dir, "%s", dir);
    char p[4200];
    rundir_path(p, sizeof p, dir, RUNDIR_METRICS);    /* fits: dir checked above */
    run->tail_metrics = mon_tail_new(p);
    rundir_path(p, sizeof p, dir, RUNDIR_STEPS);
    run->tail_steps = mon_tail_new(p);
    if (!run->tail_metrics || !run->tail_steps) {
        mon_run_destroy(&run);
        dl_seterr(DL_ENOMEM, "monitor: out of memory");
        return NULL;
    }
    return run;
}

void mon_run_destroy(mon_run_t **run_p) {
    if (!run_p || !*run_p) return;
    mon_run_t *run = *run_p;
    for (int i = 0; i < run->n_stages; i++) free(run->stages[i]);
    free(run->steps);
    mon_tail_destroy(&run->tail_metrics);
    mon_tail_destroy(&run->tail_steps);
    free(run);
    *run_p = NULL;
}

static void on_metrics_line(const char *line, size_t len, void *arg) {
    mon_run_ingest_metrics_line(arg, line, len);
}
static void on_steps_line(const char *line, size_t len, void *arg) {
    mon_run_ingest_steps_line(arg, line, len);
}

int mon_run_poll(mon_run_t *run) {
    int n = 0, r;
    if (run->tail_metrics) {
        if ((r = mon_tail_poll(run->tail_metrics, on_metrics_line, run)) < 0) return r;
        n += r;
    }
    if (run->tail_steps) {
        if ((r = mon_tail_poll(run->tail_steps, on_steps_line, run)) < 0) return r;
        n += r;
    }
    return n;
}

mon_stage_t *mon_run_stage(const mon_run_t *run, const char *name) {
    for (int i = 0; i < run->n_stages; i++)
        if (!strcmp(run->stages[i]->name, name)) return run->stages[i];
    return NULL;
}

const mon_sample_t *mon_stage_sample(const mon_stage_t *s, int back) {
    if (back < 0 || back >= s->count) return NULL;
    return &s->hist[(s->head - back + MON_HIST) % MON_HIST];
}

int mon_stage_index(const mon_stage_t *s, const char *name) {
    for (int i = 0; i < s->n_names; i++)
        if (!strcmp(s->names[i], name)) return i;
    return -1;
}

double mon_stage_get(const mon_stage_t *s, int back, const char *name) {
    const mon_sample_t *x = mon_stage_sample(s, back);
    int i = mon_stage_index(s, name);
    return x && i >= 0 ? x->v[i] : NAN;
}

const mon_step_t *mon_run_last_step(const mon_run_t *run) {
    for (uint64_t i = run->n_steps; i > 0; i--)
        if (run->steps[i - 1].have) return &run->steps[i - 1];
    return NULL;
}

static int bad(mon_run_t *run, const char *why) {
    run->bad_lines++;
    snprintf(run->last_error, sizeof run->last_error, "%s", why);
    return dl_seterr(DL_EFORMAT, "monitor: %s", why);
}

/* The step table entry for step k, grown as needed (NULL: out of range / memory). */
static mon_step_t *step_slot(mon_run_t *run, double kd) {
    if (!(kd >= 0) || kd >= MON_MAX_STEPS || kd != floor(kd)) return NULL;
    uint64_t k = (uint64_t)kd;
    if (k >= run->cap_steps) {
        uint64_t cap = run->cap_steps ? run->cap_steps : 256;
        while (cap <= k) cap *= 2;
        mon_step_t *s = realloc(run->steps, cap * sizeof *s);
        if (!s) return NULL;
        memset(s + run->cap_steps, 0, (cap - run->cap_steps) * sizeof *s);
        run->steps = s;
        run->cap_steps = cap;
    }
    mon_step_t *s = &run->steps[k];
    if (!s->have) {
        s->step = k;
        s->loss = s->grad_norm = s->lr = s->tokens = s->t = s->ts = s->acc_mean = NAN;
        for (int i = 0; i < MON_MAX_ACC; i++) s->acc[i] = NAN;
    }
    if (k + 1 > run->n_steps) run->n_steps = k + 1;
    return s;
}

static void stage_reset(mon_stage_t *s, uint64_t inc) {
    s->incarnation = inc;
    s->count = 0;
    s->head = 0;
}

int mon_run_ingest_metrics(mon_run_t *run, double ts, const char *stage, uint32_t stage_id,
                           uint64_t incarnation, const char *state, const char *const *names,
                           const double *values, int n) {
    if (!stage || !*stage || strlen(stage) >= MON_STAGE_NAME_MAX || !state || !isfinite(ts))
        return dl_seterr(DL_EINVAL, "monitor: metrics with a bad stage name, state or ts");
    mon_role_t role = mon_role_of(stage_id, stage);
    if (role == MON_ROLE_OPTIMIZER && !strcmp(state, "step")) {
        double kd = NAN;
        for (int i = 0; i < n; i++) if (!strcmp(names[i], "step")) kd = values[i];
        mon_step_t *s = step_slot(run, kd);
        if (!s) return dl_seterr(DL_ERANGE, "monitor: step line with step %g", kd);
        s->have |= 2;
        s->ts = ts;
        for (int i = 0; i < n; i++) {
            const char *k = names[i];
            double v = values[i];
            if (!strcmp(k, "loss")) s->loss = v;
            else if (!strcmp(k, "grad_norm")) s->grad_norm = v;
            else if (!strcmp(k, "lr")) s->lr = v;
            else if (!strcmp(k, "tokens")) s->tokens = v;
            else if (!strcmp(k, "elapsed_s")) s->t = v;
            else if (!strcmp(k, "acc_mean")) s->acc_mean = v;
            else if (!strcmp(k, "skipped")) s->skipped = v != 0;
            else if (!strncmp(k, "acc_", 4) && k[4] >= '0' && k[4] <= '9') {
                int pos = atoi(k + 4);
                if (pos > 0 && pos < MON_MAX_ACC) {
                    s->acc[pos] = v;
                    if (pos + 1 > s->n_acc) s->n_acc = pos + 1;
                }
            }
        }
        if (ts > run->last_ts) run->last_ts = ts;
        return 0;
    }
    mon_stage_t *s = mon_run_stage(run, stage);
    if (!s) {
        if (run->n_stages >= MON_MAX_STAGES)
            return dl_seterr(DL_ERANGE, "monitor: more than %d stages", MON_MAX_STAGES);
        s = calloc(1, sizeof *s);
        if (!s) return dl_seterr(DL_ENOMEM, "monitor: out of memory");
        snprintf(s->name, sizeof s->name, "%s", stage);
        s->stage_id = stage_id;
        s->role = role;
        s->incarnation = incarnation;
        s->incarnations_seen = 1;
        run->stages[run->n_stages++] = s;
    }
    if (incarnation != s->incarnation) {
        /* a restarted stage: its cumulative counters start again */
        stage_reset(s, incarnation);
        s->incarnations_seen++;
    } else if (s->count && ts < mon_stage_sample(s, 0)->ts) {
        return 0;       /* out of order (a replayed line): the newest picture wins */
    }
    s->head = (s->head + 1) % MON_HIST;
    if (s->count < MON_HIST) s->count++;
    mon_sample_t *x = &s->hist[s->head];
    x->ts = ts;
    snprintf(x->state, sizeof x->state, "%s", state);
    for (int i = 0; i < MON_MAX_METRICS; i++) x->v[i] = NAN;
    for (int i = 0; i < n; i++) {
        int j = mon_stage_index(s, names[i]);
        if (j < 0) {
            if (s->n_names >= MON_MAX_METRICS || strlen(names[i]) >= MON_NAME_MAX) continue;
            j = s->n_names++;
            snprintf(s->names[j], MON_NAME_MAX, "%s", names[i]);
        }
        x->v[j] = values[i];
    }
    if (ts > run->last_ts) run->last_ts = ts;
    return 0;
}

int mon_run_ingest_proto(mon_run_t *run, const char *peer, const proto_metrics_t *m) {
    const char *names[DL_PROTO_MAX_METRICS];
    double values[DL_PROTO_MAX_METRICS];
    int n = 0;
    for (uint32_t i = 0; i < m->n_metrics && i < DL_PROTO_MAX_METRICS; i++, n++) {
        names[n] = m->metrics[i].name;
        values[n] = m->metrics[i].value;
    }
    return mon_run_ingest_metrics(run, (double)m->ts_ns / 1e9, peer, m->stage_id, m->incarnation,
                                  m->state, names, values, n);
}

int mon_run_ingest_metrics_line(mon_run_t *run, const char *line, size_t len) {
    run->lines++;
    while (len && (line[len - 1] == ' ' || line[len - 1] == '\t')) len--;
    if (!len) { run->lines--; return 0; }          /* blank line */
    rundir_metrics_rec_t x;
    char why[sizeof run->last_error];
    if (rundir_metrics_parse_line(line, len, &x) < 0) {
        snprintf(why, sizeof why, "%s", dl_errmsg());
        rundir_metrics_rec_free(&x);
        return bad(run, why);
    }
    int rc = mon_run_ingest_metrics(run, x.ts, x.stage, x.stage_id, x.incarnation, x.state, x.names,
                                    x.values, x.n);
    rundir_metrics_rec_free(&x);
    if (rc < 0) return bad(run, dl_errmsg());
    return 0;
}

int mon_run_ingest_steps_line(mon_run_t *run, const char *line, size_t len) {
    run->lines++;
    while (len && (line[len - 1] == ' ' || line[len - 1] == '\t')) len--;
    if (!len) { run->lines--; return 0; }
    rundir_step_rec_t x;
    if (rundir_steps_parse_line(line, len, &x) < 0) return bad(run, "steps line is not a JSON object");
    mon_step_t *s = step_slot(run, x.step);
    if (!s) return bad(run, "steps line without a valid step");
    s->have |= 1;
    if (!isnan(x.loss)) s->loss = x.loss;
    if (!isnan(x.grad_norm)) s->grad_norm = x.grad_norm;
    if (!isnan(x.lr)) s->lr = x.lr;
    if (!isnan(x.tokens)) s->tokens = x.tokens;
    if (!isnan(x.acc_mean)) s->acc_mean = x.acc_mean;
    if (!isnan(x.t)) s->t = x.t;
    if (!isnan(x.skipped)) s->skipped = x.skipped != 0;
    for (int pos = 1; pos < MON_MAX_ACC && pos < RUNDIR_MAX_ACC; pos++)   /* per-position accuracies if present */
        if (!isnan(x.acc[pos])) { s->acc[pos] = x.acc[pos]; if (pos + 1 > s->n_acc) s->n_acc = pos + 1; }
    return 0;
}
