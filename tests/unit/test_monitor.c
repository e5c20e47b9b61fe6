/* common/monitor: tail -F semantics, metrics/steps parsing (a real run's files), the
 * stall diagnosis and bottleneck on synthetic metric streams, ETA, Prometheus text
 * (every line checked against the exposition grammar), the PNG plot, NVML absence.
 * Fixtures: tests/fixtures/monitor/make_fixtures.py (run_cpu/ is cut from a real CPU
 * run of the pipeline, stall/ is synthetic in the supervisor's line format).
 * Run from the repo root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/monitor/diag.h"
#include "common/monitor/nvml.h"
#include "common/monitor/plot.h"
#include "common/monitor/prom.h"
#include "common/monitor/report.h"
#include "common/monitor/run.h"
#include "common/monitor/tail.h"
#include "tests/unit/test_monitor_expo.h"

/* ------------------------------------------------------------------ helpers */

static char tmpdir[256];

static int setup_tmp(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dl-test-monitor-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmp(void **state) {
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const char *mode, const char *text) {
    FILE *f = fopen(path, mode);
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

typedef struct {
    char lines[16][128];
    int n;
} got_t;

static void on_line(const char *line, size_t len, void *arg) {
    got_t *g = arg;
    assert_int_equal(strlen(line), len);
    if (g->n < 16) snprintf(g->lines[g->n++], 128, "%s", line);
}

/* A synthetic stage stream. Phase counters cumulative like common/pipe/stage.c. */
typedef struct {
    double t, wait_in, wait_cr, busy, last_prog;
    double inbox, inbox_cap;
    const char *state;
} synth_t;

static void feed(mon_run_t *run, const char *name, uint32_t id, uint64_t inc, const synth_t *s) {
    const char *names[] = {"wait_input_s", "wait_credit_s", "copy_s", "forward_s", "backward_s", "step_s",
                           "uptime_s", "since_progress_s", "tokens_per_s", "inbox_gpu_bytes", "inbox_gpu_cap",
                           "inbox_host_bytes", "inbox_host_cap"};
    double v[] = {s->wait_in, s->wait_cr, 0, s->busy, 0, 0, s->t, s->t - s->last_prog, 100,
                  s->inbox, s->inbox_cap, 0, 0};
    int n = id >= 100 && id < 200 ? 13 : 9;
    assert_int_equal(mon_run_ingest_metrics(run, 1e9 + s->t, name, id, inc, s->state, names, v, n), 0);
}

static mon_diag_t diag_of(mon_run_t *run, const char *name, double now, const mon_diag_opts_t *o) {
    mon_stage_view_t v;
    mon_diag_t d;
    mon_stage_view(mon_run_stage(run, name), now, o->window_s, &v);
    mon_diagnose(&v, o, &d);
    return d;
}

static mon_diag_opts_t opts(double stall_s) {
    mon_diag_opts_t o;
    mon_diag_opts_default(&o);
    o.stall_s = stall_s;
    return o;
}

/* -------------------------------------------------------------------- tail */

static void test_tail_partial_truncate_rotate(void **state) {
    (void)state;
    char p[400], p2[400];
    snprintf(p, sizeof p, "%s/m.jsonl", tmpdir);
    snprintf(p2, sizeof p2, "%s/m.jsonl.1", tmpdir);
    mon_tail_t *t = mon_tail_new(p);
    got_t g = {0};
    assert_int_equal(mon_tail_poll(t, on_line, &g), 0);        /* missing file: nothing */
    write_file(p, "w", "a1\nb2\r\npart");
    assert_int_equal(mon_tail_poll(t, on_line, &g), 2);
    assert_string_equal(g.lines[0], "a1");
    assert_string_equal(g.lines[1], "b2");                     /* CRLF stripped */
    assert_int_equal(mon_tail_poll(t, on_line, &g), 0);        /* partial line held */
    write_file(p, "a", "ial\n");
    assert_int_equal(mon_tail_poll(t, on_line, &g), 1);
    assert_string_equal(g.lines[2], "partial");
    /* truncation: starts over */
    write_file(p, "w", "c\n");
    assert_int_equal(mon_tail_poll(t, on_line, &g), 1);
    assert_string_equal(g.lines[3], "c");
    assert_int_equal(mon_tail_resets(t), 1);
    /* rotation: old file read to its end, then the new one from its start */
    write_file(p, "a", "d\n");
    assert_int_equal(rename(p, p2), 0);
    write_file(p, "w", "e\n");
    assert_int_equal(mon_tail_poll(t, on_line, &g), 2);
    assert_string_equal(g.lines[4], "d");
    assert_string_equal(g.lines[5], "e");
    assert_int_equal(mon_tail_resets(t), 2);
    /* an over-long line is skipped, the next one delivered */
    FILE *f = fopen(p, "a");
    for (size_t i = 0; i < MON_TAIL_LINE_MAX + 10; i++) fputc('x', f);
    fputs("\nf\n", f);
    fclose(f);
    assert_int_equal(mon_tail_poll(t, on_line, &g), 1);
    assert_string_equal(g.lines[6], "f");
    assert_int_equal(mon_tail_skipped(t), 1);
    mon_tail_destroy(&t);
    assert_null(t);
}

/* ----------------------------------------------------------------- parsing */

static void test_parse_real_run(void **state) {
    (void)state;
    mon_run_t *run = mon_run_open("tests/fixtures/monitor/run_cpu");
    assert_non_null(run);
    int n = mon_run_poll(run);
    assert_true(n > 0);
    assert_int_equal(run->bad_lines, 0);                       /* every line parses */
    /* stages of the run: loader, optimizer, 2 targets, 1 drafter */
    assert_int_equal(run->n_stages, 5);
    assert_int_equal(mon_run_stage(run, "drafter0")->role, MON_ROLE_DRAFTER);
    assert_int_equal(mon_run_stage(run, "target1")->role, MON_ROLE_TARGET);
    assert_int_equal(mon_run_stage(run, "loader")->role, MON_ROLE_LOADER);
    /* the step table equals steps.jsonl read back with sscanf */
    FILE *f = fopen("tests/fixtures/monitor/run_cpu/steps.jsonl", "r");
    assert_non_null(f);
    char line[1024];
    int steps = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long k, tok;
        double loss;
        assert_int_equal(sscanf(line, "{\"step\":%llu,\"loss\":%lf,", &k, &loss), 2);
        assert_non_null(strstr(line, "\"tokens\":"));
        assert_int_equal(sscanf(strstr(line, "\"tokens\":"), "\"tokens\":%llu", &tok), 1);
        assert_true(k < run->n_steps);
        assert_true(run->steps[k].have & 1);
        assert_true(run->steps[k].have & 2);                  /* also in metrics.jsonl */
        assert_true(fabs(run->steps[k].loss - loss) <= 1e-12 * fabs(loss));
        assert_true(run->steps[k].tokens == (double)tok);
        assert_true(run->steps[k].n_acc >= 2);
        steps++;
    }
    fclose(f);
    assert_int_equal(steps, 7);
    /* the drafter's newest sample: the file's last drafter0 line */
    const mon_stage_t *d = mon_run_stage(run, "drafter0");
    assert_true(mon_stage_get(d, 0, "inbox_gpu_cap") == 268435456.0);
    assert_true(isnan(mon_stage_get(d, 0, "no_such_metric")));
    /* a malformed line is counted, the picture unchanged */
    int ns = run->n_stages;
    assert_int_equal(mon_run_ingest_metrics_line(run, "{\"ts\":1,", 8), DL_EFORMAT);
    assert_int_equal(mon_run_ingest_metrics_line(run, "{\"ts\":1,\"stage\":3}", 19), DL_EFORMAT);
    assert_int_equal(mon_run_ingest_steps_line(run, "{\"step\":-1}", 11), DL_EFORMAT);
    assert_int_equal(run->bad_lines, 3);
    assert_int_equal(run->n_stages, ns);
    /* max_steps comes from the optimizer's log line ("step 0 of 12") */
    mon_topo_t topo = {0};
    assert_int_equal(mon_topo_read("tests/fixtures/monitor/run_cpu", &topo), DL_ENOENT);
    assert_int_equal(topo.max_steps, 12);
    mon_run_destroy(&run);
    assert_null(run);
}

static void test_incarnation_resets_history(void **state) {
    (void)state;
    mon_run_t *run = mon_run_new();
    synth_t s = {.state = "running"};
    for (int t = 1; t <= 5; t++) { s.t = t; s.busy += 0.9; s.wait_in += 0.1; s.last_prog = t; feed(run, "target0", 200, 1, &s); }
    /* restarted: counters from zero again; no negative shares, history restarts */
    synth_t r = {.state = "running", .t = 6};
    feed(run, "target0", 200, 2, &r);
    const mon_stage_t *st = mon_run_stage(run, "target0");
    assert_int_equal(st->count, 1);
    assert_int_equal(st->incarnations_seen, 2);
    r.t = 7; r.busy = 0.8; r.wait_in = 0.2; r.last_prog = 7;
    feed(run, "target0", 200, 2, &r);
    mon_diag_opts_t o = opts(60);
    mon_diag_t d = diag_of(run, "target0", 1e9 + 7, &o);
    assert_int_equal(d.kind, MON_DIAG_OK);
    assert_true(fabs(d.share_busy - 0.8) < 1e-9);
    assert_true(fabs(d.share_in - 0.2) < 1e-9);
    mon_run_destroy(&run);
}

/* --------------------------------------------------------------- diagnosis */

/* A stage that computes (busy 90%) until t0 and then stays "running" without progress
 * is reported stuck exactly once stall_s has passed, never before; before that it is
 * ok. */
static void test_stuck_within_stall_s(void **state) {
    (void)state;
    for (int trial = 0; trial < 3; trial++) {
        double stall = (double[]){5, 12, 30}[trial];
        mon_diag_opts_t o = opts(stall);
        mon_run_t *run = mon_run_new();
        synth_t s = {.state = "running"};
        const int t0 = 20;
        int first_stuck = -1;
        for (int t = 1; t <= 80; t++) {
            s.t = t;
            if (t <= t0) { s.busy += 0.9; s.wait_in += 0.1; s.last_prog = t; }
            feed(run, "drafter0", 100, 1, &s);
            mon_diag_t d = diag_of(run, "drafter0", 1e9 + t, &o);
            if (t >= 2 && first_stuck < 0) {
                if (d.kind == MON_DIAG_STUCK) first_stuck = t;
                else assert_int_equal(d.kind, MON_DIAG_OK);
            }
        }
        assert_int_equal(first_stuck, t0 + (int)stall);
        mon_run_destroy(&run);
    }
}

/* Between samples: since_progress grows with the wall clock (now - ts), so a stage
 * whose metrics stopped at t is stuck at t + (stall - its since_progress), and once
 * silent_s passes without metrics it is silent. */
static void test_stuck_between_samples_and_silent(void **state) {
    (void)state;
    mon_diag_opts_t o = opts(10);
    o.silent_s = 15;
    mon_run_t *run = mon_run_new();
    synth_t s = {.state = "running"};
    for (int t = 1; t <= 6; t++) { s.t = t; s.busy += 1; s.last_prog = t <= 3 ? t : 3; feed(run, "target0", 200, 1, &s); }
    assert_int_equal(diag_of(run, "target0", 1e9 + 6, &o).kind, MON_DIAG_OK);
    assert_int_equal(diag_of(run, "target0", 1e9 + 12.9, &o).kind, MON_DIAG_OK);     /* 9.9 s */
    assert_int_equal(diag_of(run, "target0", 1e9 + 13.0, &o).kind, MON_DIAG_STUCK);  /* 10 s */
    assert_int_equal(diag_of(run, "target0", 1e9 + 21.0, &o).kind, MON_DIAG_SILENT); /* 15 s quiet */
    mon_run_destroy(&run);
}

/* A drafter whose inbox is empty and that waits on input: starved, not stuck, however
 * long it waits (its wait is still open, so its counters do not move). */
static void test_starved_not_stuck(void **state) {
    (void)state;
    mon_diag_opts_t o = opts(10);
    mon_run_t *run = mon_run_new();
    synth_t s = {.state = "running", .inbox_cap = 1 << 28};
    for (int t = 1; t <= 60; t++) {
        s.t = t;
        if (t <= 5) { s.busy += 0.7; s.wait_in += 0.3; s.last_prog = t; s.inbox = 1 << 20; s.state = "running"; }
        else { s.state = "idle"; s.inbox = 0; }
        feed(run, "drafter0", 100, 1, &s);
        if (t < 2) continue;
        mon_diag_t d = diag_of(run, "drafter0", 1e9 + t, &o);
        assert_int_not_equal(d.kind, MON_DIAG_STUCK);
        if (t >= 8) assert_int_equal(d.kind, MON_DIAG_STARVED);
        if (t >= 10) assert_true(d.share_in > 0.6);
        if (t >= 16) assert_non_null(strstr(d.why, "waiting for input"));
    }
    mon_run_destroy(&run);
}

static void test_backpressured_and_shares(void **state) {
    (void)state;
    mon_diag_opts_t o = opts(10);
    mon_run_t *run = mon_run_new();
    /* a target without a slot grant: blocked, its wait for credit counted at each grant */
    synth_t a = {.state = "blocked"}, b = {.state = "running"}, c = {.state = "running"};
    for (int t = 1; t <= 30; t++) {
        a.t = b.t = c.t = t;
        a.wait_cr += 0.7; a.busy += 0.3; a.last_prog = t;          /* progressing, mostly waiting */
        b.wait_in += 0.3; b.busy += 0.7; b.last_prog = t;          /* 30% waiting: fine */
        c.wait_in += 0.75; c.busy += 0.25; c.last_prog = t;        /* 75% waiting for input */
        feed(run, "target0", 200, 1, &a);
        feed(run, "target1", 201, 1, &b);
        feed(run, "target2", 202, 1, &c);
    }
    mon_diag_t d = diag_of(run, "target0", 1e9 + 30, &o);
    assert_int_equal(d.kind, MON_DIAG_BACKPRESSURED);
    assert_true(fabs(d.share_credit - 0.7) < 1e-9);
    d = diag_of(run, "target1", 1e9 + 30, &o);
    assert_int_equal(d.kind, MON_DIAG_OK);
    assert_true(fabs(d.share_busy - 0.7) < 1e-9);
    d = diag_of(run, "target2", 1e9 + 30, &o);
    assert_int_equal(d.kind, MON_DIAG_STARVED);
    /* stalled while blocked: back-pressured, not stuck */
    synth_t e = {.state = "blocked"};
    for (int t = 1; t <= 30; t++) { e.t = t; feed(run, "target3", 203, 1, &e); }
    d = diag_of(run, "target3", 1e9 + 30, &o);
    assert_int_equal(d.kind, MON_DIAG_BACKPRESSURED);
    assert_non_null(strstr(d.why, "waiting for credit"));
    /* the loader's idle is waiting for work requests: credit */
    mon_stage_view_t v = {.name = "loader", .role = MON_ROLE_LOADER, .state = "idle", .dt = 10,
                          .since_progress_s = 100};
    mon_diagnose(&v, &o, &d);
    assert_int_equal(d.kind, MON_DIAG_BACKPRESSURED);
    /* stopping / starting */
    mon_stage_view_t w = {.name = "x", .role = MON_ROLE_DRAFTER, .state = "stopping", .since_progress_s = 500};
    mon_diagnose(&w, &o, &d);
    assert_int_equal(d.kind, MON_DIAG_STOPPED);
    snprintf(w.state, sizeof w.state, "starting");
    mon_diagnose(&w, &o, &d);
    assert_int_equal(d.kind, MON_DIAG_STARTING);
    mon_run_destroy(&run);
}

/* -------------------------------------------------------------- bottleneck */

typedef struct {
    mon_stage_view_t v[8];
    mon_diag_t d[8];
    int n;
} fleet_t;

static void add(fleet_t *f, const char *name, mon_role_t role, const char *state, double in, double cr,
                double busy, double inbox_fill) {
    mon_diag_opts_t o = opts(60);
    mon_stage_view_t *v = &f->v[f->n];
    memset(v, 0, sizeof *v);
    v->name = name;
    v->role = role;
    snprintf(v->state, sizeof v->state, "%s", state);
    v->dt = 10;
    v->d_wait_input = 10 * in;
    v->d_wait_credit = 10 * cr;
    v->d_busy = 10 * busy;
    v->since_progress_s = 0.5;
    v->inbox_used = isnan(inbox_fill) ? NAN : inbox_fill * 1e9;
    v->inbox_cap = isnan(inbox_fill) ? NAN : 1e9;
    mon_diagnose(v, &o, &f->d[f->n]);
    f->n++;
}

/* --gpu-turns: a stage's waits for its GPU's turn (wait_gpu_s) are not busy time: over a
 * 10 s window a target that forwarded 4.5 s and waited 5 s for the turn, running now, is
 * 50 % busy (4.5 s + the 0.5 s open phase) and 50 % waiting for the turn, and its
 * diagnosis says so; all four shares scaled together when they overrun the window; below
 * 5 % the "why" stays "busy N%". */
static void test_gpu_turn_share(void **state) {
    (void)state;
    mon_diag_opts_t o = opts(60);
    mon_diag_t d;
    mon_stage_view_t v = {.name = "target0", .role = MON_ROLE_TARGET, .state = "running", .dt = 10,
                          .d_busy = 4.5, .d_wait_gpu = 5, .since_progress_s = 0.5};
    mon_diagnose(&v, &o, &d);
    assert_int_equal(d.kind, MON_DIAG_OK);
    assert_true(fabs(d.share_busy - 0.5) < 1e-9);
    assert_true(fabs(d.share_gpu - 0.5) < 1e-9);
    assert_string_equal(d.why, "busy 50%, waits for its GPU's turn 50%");
    v.d_busy = 8; v.d_wait_gpu = 8;                  /* 16 s in a 10 s window: scaled */
    mon_diagnose(&v, &o, &d);
    assert_true(fabs(d.share_busy - 0.5) < 1e-9 && fabs(d.share_gpu - 0.5) < 1e-9);
    v.d_busy = 9; v.d_wait_gpu = 0.2;
    mon_diagnose(&v, &o, &d);
    assert_true(fabs(d.share_gpu - 0.02) < 1e-9);
    assert_string_equal(d.why, "busy 98%");
    /* from a metrics stream: wait_gpu_s read like the other phases */
    mon_run_t *run = mon_run_new();
    assert_non_null(run);
    const char *names[] = {"wait_input_s", "wait_gpu_s", "forward_s", "since_progress_s"};
    for (int t = 0; t <= 10; t++) {
        double vals[] = {0, 0.6 * t, 0.4 * t, 0.1};
        assert_int_equal(mon_run_ingest_metrics(run, 1e9 + t, "target0", 200, 1, "running", names, vals, 4), 0);
    }
    d = diag_of(run, "target0", 1e9 + 10, &o);
    assert_true(fabs(d.share_gpu - 0.6) < 1e-9);
    assert_true(fabs(d.share_busy - 0.4) < 1e-9);
    mon_run_destroy(&run);
}

static void test_bottleneck(void **state) {
    (void)state;
    mon_topo_t cpu = {.n_targets = 2, .n_drafters = 2};
    mon_topo_t gpu = {.gpu_mode = 1, .n_targets = 2, .n_drafters = 2, .target_gpus = {0, 1},
                      .n_target_gpus = 2, .drafter_gpus = {2, 3}, .n_drafter_gpus = 2};
    mon_bottleneck_t b;
    /* targets busy, drafters starved with empty inboxes */
    fleet_t f = {0};
    add(&f, "target0", MON_ROLE_TARGET, "running", 0.05, 0, 0.95, NAN);
    add(&f, "target1", MON_ROLE_TARGET, "running", 0.05, 0, 0.95, NAN);
    add(&f, "drafter0", MON_ROLE_DRAFTER, "idle", 0.6, 0, 0.4, 0.02);
    add(&f, "drafter1", MON_ROLE_DRAFTER, "idle", 0.6, 0, 0.4, 0.0);
    add(&f, "optimizer", MON_ROLE_OPTIMIZER, "idle", 0.95, 0, 0.05, NAN);
    mon_bottleneck(f.v, f.d, f.n, &cpu, "R", &b);
    assert_int_equal(b.kind, MON_ROLE_TARGET);
    assert_non_null(strstr(b.text, "targets are the bottleneck"));
    assert_non_null(strstr(b.text, "--targets 3 --drafters 1"));
    mon_bottleneck(f.v, f.d, f.n, &gpu, "R", &b);
    assert_non_null(strstr(b.text, "move one GPU from drafters to targets"));
    assert_non_null(strstr(b.text, "--target-gpus 0,1,3 --drafter-gpus 2"));
    assert_true(fabs(b.inbox_fill - 0.01) < 1e-9);
    /* drafters busy, targets blocked on credit, inboxes full */
    fleet_t g = {0};
    add(&g, "target0", MON_ROLE_TARGET, "blocked", 0, 0.6, 0.4, NAN);
    add(&g, "target1", MON_ROLE_TARGET, "blocked", 0, 0.5, 0.5, NAN);
    add(&g, "drafter0", MON_ROLE_DRAFTER, "running", 0.02, 0, 0.98, 0.9);
    add(&g, "drafter1", MON_ROLE_DRAFTER, "running", 0.02, 0, 0.98, 0.95);
    mon_bottleneck(g.v, g.d, g.n, &cpu, "R", &b);
    assert_int_equal(b.kind, MON_ROLE_DRAFTER);
    assert_non_null(strstr(b.text, "--targets 1 --drafters 3"));
    mon_bottleneck(g.v, g.d, g.n, &gpu, "R", &b);
    assert_non_null(strstr(b.text, "--target-gpus 0 --drafter-gpus 2,3,1"));
    /* one GPU each: no GPU to move */
    mon_topo_t gpu1 = {.gpu_mode = 1, .n_targets = 1, .n_drafters = 1, .target_gpus = {0},
                       .n_target_gpus = 1, .drafter_gpus = {1}, .n_drafter_gpus = 1};
    mon_bottleneck(g.v, g.d, g.n, &gpu1, "R", &b);
    assert_non_null(strstr(b.text, "another GPU"));
    /* the optimizer's synchronous step dominates */
    fleet_t h = {0};
    add(&h, "target0", MON_ROLE_TARGET, "blocked", 0, 0.5, 0.5, NAN);
    add(&h, "drafter0", MON_ROLE_DRAFTER, "idle", 0.6, 0, 0.4, 0.1);
    add(&h, "optimizer", MON_ROLE_OPTIMIZER, "idle", 0.2, 0, 0.8, NAN);
    mon_bottleneck(h.v, h.d, h.n, &cpu, "R", &b);
    assert_int_equal(b.kind, MON_ROLE_OPTIMIZER);
    /* everyone starved: the loader */
    fleet_t l = {0};
    add(&l, "target0", MON_ROLE_TARGET, "idle", 0.8, 0, 0.2, NAN);
    add(&l, "drafter0", MON_ROLE_DRAFTER, "idle", 0.8, 0, 0.2, 0.0);
    mon_bottleneck(l.v, l.d, l.n, &cpu, "R", &b);
    assert_int_equal(b.kind, MON_ROLE_LOADER);
    /* balanced, moderately busy: no clear bottleneck */
    fleet_t m = {0};
    add(&m, "target0", MON_ROLE_TARGET, "running", 0.35, 0, 0.65, NAN);
    add(&m, "drafter0", MON_ROLE_DRAFTER, "running", 0.25, 0.1, 0.65, 0.4);
    mon_bottleneck(m.v, m.d, m.n, &cpu, "R", &b);
    assert_int_equal(b.kind, MON_ROLE_UNKNOWN);
    assert_non_null(strstr(b.text, "no clear bottleneck"));
    /* everyone waiting without progress: a stalled pipeline, not a bottleneck */
    fleet_t z = {0};
    add(&z, "loader", MON_ROLE_LOADER, "blocked", 0, 1, 0, NAN);
    add(&z, "target0", MON_ROLE_TARGET, "idle", 1, 0, 0, NAN);
    add(&z, "drafter0", MON_ROLE_DRAFTER, "idle", 1, 0, 0, 0.0);
    add(&z, "optimizer", MON_ROLE_OPTIMIZER, "idle", 1, 0, 0, NAN);
    mon_bottleneck(z.v, z.d, z.n, &cpu, "R", &b);
    assert_int_equal(b.kind, MON_ROLE_LOADER);          /* still progressing: the loader */
    for (int i = 0; i < z.n; i++) {
        mon_diag_opts_t o60 = opts(60);
        z.v[i].since_progress_s = 61;
        mon_diagnose(&z.v[i], &o60, &z.d[i]);
        assert_true(z.d[i].stalled);
    }
    mon_bottleneck(z.v, z.d, z.n, &cpu, "R", &b);
    assert_int_equal(b.kind, MON_ROLE_UNKNOWN);
    assert_non_null(strstr(b.text, "the pipeline is stalled"));
    /* a stuck stage is named first */
    fleet_t s = g;
    s.v[2].since_progress_s = 100;
    mon_diag_opts_t o = opts(60);
    mon_diagnose(&s.v[2], &o, &s.d[2]);
    assert_int_equal(s.d[2].kind, MON_DIAG_STUCK);
    mon_bottleneck(s.v, s.d, s.n, &cpu, "R", &b);
    assert_int_equal(b.kind, MON_ROLE_DRAFTER);
    assert_non_null(strstr(b.text, "drafter0 is stuck"));
    assert_non_null(strstr(b.text, "R/logs/drafter0.log"));
}

/* The synthetic stall fixture end to end through the snapshot text. */
static void test_report_stall_fixture(void **state) {
    (void)state;
    mon_run_t *run = mon_run_open("tests/fixtures/monitor/stall");
    assert_non_null(run);
    assert_true(mon_run_poll(run) > 0);
    assert_int_equal(run->bad_lines, 0);
    mon_report_opts_t ro = {0};
    ro.wall = run->last_ts + 3600;                  /* a finished run: judged at its end */
    ro.now = mon_report_now(run, ro.wall, 10);
    assert_true(ro.now == run->last_ts);
    mon_diag_opts_default(&ro.diag);
    ro.diag.stall_s = 20;
    assert_int_equal(mon_topo_read("tests/fixtures/monitor/stall", &ro.topo), 0);
    assert_int_equal(ro.topo.max_steps, 100);
    char *text = NULL;
    assert_int_equal(mon_report(run, &ro, &text), 0);
    const struct { const char *stage, *diag; } want[] = {
        {"drafter0", "stuck:"}, {"drafter1", "starved:"}, {"target0", "back-pressured:"},
        {"target1", "starved:"}, {"optimizer", "starved:"}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const char *l = strstr(text, want[i].stage);
        while (l && l[-1] != '\n') l = strstr(l + 1, want[i].stage);   /* the stage row */
        assert_non_null(l);
        const char *e = strchr(l, '\n');
        char row[256];
        snprintf(row, sizeof row, "%.*s", (int)(e - l), l);
        if (!strstr(row, want[i].diag)) fail_msg("%s: expected %s in '%s'", want[i].stage, want[i].diag, row);
    }
    assert_non_null(strstr(text, "bottleneck: drafter0 is stuck"));
    assert_non_null(strstr(text, "step 9 done (10 of 100)"));   /* named from 0, as the console does */
    assert_non_null(strstr(text, "ETA 1m30s"));              /* 90 steps left at 1 s/step */
    assert_non_null(strstr(text, "90.0%"));                  /* drafter0's inbox fill */
    assert_null(strstr(text, "\nGPU "));                     /* run.json: device cpu, no GPU section */
    assert_null(strstr(text, "GPU TIER"));
    free(text);
    /* with a longer stall-s nothing is stuck yet: drafter0 is busy */
    ro.diag.stall_s = 60;
    assert_int_equal(mon_report(run, &ro, &text), 0);
    assert_null(strstr(text, "stuck:"));
    free(text);
    /* ETA / tokens/s: 512 tokens per 1 s step */
    assert_true(fabs(mon_tokens_per_s(run) - 512) < 1e-6);
    assert_true(fabs(mon_eta_s(run, 100) - 90) < 1e-6);
    assert_true(isnan(mon_eta_s(run, 0)));
    mon_run_destroy(&run);
}

/* The row of `stage` in a snapshot (copied into row), or fails. */
static void stage_row(const char *text, const char *stage, char *row, size_t cap) {
    const char *l = strstr(text, stage);
    while (l && (l[-1] != '\n' || l[strlen(stage)] != ' ')) l = strstr(l + 1, stage);
    if (!l) fail_msg("no row for %s in:\n%s", stage, text);
    const char *e = strchr(l, '\n');
    snprintf(row, cap, "%.*s", (int)(e - l), l);
}

static void write_in(const char *dir, const char *name, const char *txt) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    write_file(p, "w", txt);
}

/* run.json (the supervisor's) decides which stages have a row: after a live rebalance
 * 1+1 -> 2+1 the new target1, which sent no metrics yet, has one (it had none: "4
 * stages"), a retired drafter1 is marked retired, not counted; once the run is
 * stopped, every stage shows "exited", not its last metrics' "stopping". */
static void test_report_topology_rows(void **state) {
    (void)state;
    static const char *const stage_lines =
        "{\"ts\":100.0,\"stage\":\"loader\",\"stage_id\":1,\"incarnation\":1,\"state\":\"blocked\",\"since_progress_s\":0}\n"
        "{\"ts\":100.0,\"stage\":\"optimizer\",\"stage_id\":2,\"incarnation\":1,\"state\":\"idle\",\"since_progress_s\":0}\n"
        "{\"ts\":100.0,\"stage\":\"target0\",\"stage_id\":200,\"incarnation\":1,\"state\":\"idle\",\"since_progress_s\":0}\n"
        "{\"ts\":100.0,\"stage\":\"drafter0\",\"stage_id\":100,\"incarnation\":1,\"state\":\"running\",\"since_progress_s\":0}\n"
        "{\"ts\":100.0,\"stage\":\"drafter1\",\"stage_id\":101,\"incarnation\":1,\"state\":\"stopping\",\"since_progress_s\":0}\n";
    write_in(tmpdir, "metrics.jsonl", stage_lines);
    write_in(tmpdir, "run.json",
               "{\"device\":\"cpu\",\"targets\":2,\"drafters\":1,\"max_steps\":100,\"state\":\"running\",\"stages\":["
               "{\"name\":\"loader\",\"stage_id\":1,\"incarnation\":1,\"process\":\"running\"},"
               "{\"name\":\"optimizer\",\"stage_id\":2,\"incarnation\":1,\"process\":\"running\"},"
               "{\"name\":\"drafter0\",\"stage_id\":100,\"incarnation\":1,\"process\":\"running\"},"
               "{\"name\":\"drafter1\",\"stage_id\":101,\"incarnation\":1,\"process\":\"retired\"},"
               "{\"name\":\"target0\",\"stage_id\":200,\"incarnation\":1,\"process\":\"running\"},"
               "{\"name\":\"target1\",\"stage_id\":201,\"incarnation\":1,\"process\":\"restarting\"}]}\n");
    mon_run_t *run = mon_run_open(tmpdir);
    assert_non_null(run);
    assert_int_equal(mon_run_poll(run), 5);
    mon_report_opts_t ro = {0};
    ro.wall = ro.now = 101;
    mon_diag_opts_default(&ro.diag);
    assert_int_equal(mon_topo_read(tmpdir, &ro.topo), 0);
    assert_int_equal(ro.topo.n_stages, 6);
    assert_string_equal(ro.topo.run_state, "running");
    char *text = NULL, row[256];
    assert_int_equal(mon_report(run, &ro, &text), 0);
    assert_non_null(strstr(text, ": 5 stages (+1 retired),"));
    stage_row(text, "target1", row, sizeof row);
    assert_non_null(strstr(row, " target "));
    assert_non_null(strstr(row, " restarting "));
    assert_non_null(strstr(row, "unknown: no metrics yet"));
    /* "restarting" is wider than the STATE column's 8: the column widens, the rows line up
     * with the header (each row's diagnosis starts under DIAGNOSIS) */
    const char *hdr = strstr(text, "\nSTAGE");
    assert_non_null(hdr);
    long want = (long)(strstr(hdr, "DIAGNOSIS") - (hdr + 1));
    assert_int_equal((long)(strstr(row, "unknown: no metrics yet") - row), want);
    char row0[256];
    stage_row(text, "loader", row0, sizeof row0);
    assert_true(strlen(row0) > (size_t)want);
    assert_true(row0[want - 1] == ' ' && row0[want - 2] == ' ' && row0[want] != ' ');
    stage_row(text, "drafter1", row, sizeof row);
    assert_non_null(strstr(row, "stopped: retired by a rebalance"));
    stage_row(text, "drafter0", row, sizeof row);
    assert_non_null(strstr(row, " running "));
    free(text);
    /* the run finished: run.json state stopped, every process exited */
    write_in(tmpdir, "run.json",
               "{\"device\":\"cpu\",\"targets\":1,\"drafters\":1,\"max_steps\":100,\"state\":\"stopped\",\"stages\":["
               "{\"name\":\"loader\",\"stage_id\":1,\"incarnation\":1,\"process\":\"exited\"},"
               "{\"name\":\"optimizer\",\"stage_id\":2,\"incarnation\":1,\"process\":\"exited\"},"
               "{\"name\":\"drafter0\",\"stage_id\":100,\"incarnation\":1,\"process\":\"exited\"},"
               "{\"name\":\"target0\",\"stage_id\":200,\"incarnation\":1,\"process\":\"exited\"}]}\n");
    write_in(tmpdir, "metrics.jsonl", "");
    mon_run_destroy(&run);
    run = mon_run_open(tmpdir);
    assert_non_null(run);
    char p[400];
    snprintf(p, sizeof p, "%s/metrics.jsonl", tmpdir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    for (const char *st = "loader\0optimizer\0target0\0drafter0\0"; *st; st += strlen(st) + 1)
        fprintf(f, "{\"ts\":100.0,\"stage\":\"%s\",\"incarnation\":1,\"state\":\"stopping\"}\n", st);
    fclose(f);
    assert_int_equal(mon_run_poll(run), 4);
    memset(&ro.topo, 0, sizeof ro.topo);
    assert_int_equal(mon_topo_read(tmpdir, &ro.topo), 0);
    ro.wall = 200;
    ro.now = mon_report_now(run, ro.wall, 10);
    assert_int_equal(mon_report(run, &ro, &text), 0);
    assert_null(strstr(text, "stopping"));
    assert_non_null(strstr(text, ": 4 stages,"));
    assert_non_null(strstr(text, "(finished"));
    const char *const names[] = {"loader", "optimizer", "target0", "drafter0"};
    for (int i = 0; i < 4; i++) {
        stage_row(text, names[i], row, sizeof row);
        if (!strstr(row, " exited ") || !strstr(row, "stopped: exited")) fail_msg("%s: '%s'", names[i], row);
    }
    free(text);
    mon_run_destroy(&run);
}

/* -------------------------------------------------------------- Prometheus */

static void test_prom_render(void **state) {
    (void)state;
    mon_run_t *run = mon_run_open("tests/fixtures/monitor/stall");
    assert_non_null(run);
    mon_run_poll(run);
    mon_diag_opts_t o = opts(20);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(mon_prom_render(run, run->last_ts, &o, NULL, &text, &len), 0);
    assert_int_equal(strlen(text), len);
    int samples = check_exposition(text);
    assert_true(samples > 60);
    /* values as in the file: drafter1 waited 10 x 0.3 s for input before t = 10 s */
    assert_true(fabs(sample_value(text, "draftline_wait_input_seconds_total{stage=\"drafter1\",role=\"drafter\"} ") - 3.0) < 1e-9);
    assert_true(sample_value(text, "draftline_inbox_gpu_cap{stage=\"drafter0\",role=\"drafter\"} ") == 268435456.0);
    assert_true(sample_value(text, "draftline_stage_diagnosis{stage=\"drafter0\",role=\"drafter\",diagnosis=\"stuck\"} ") == 1);
    assert_true(sample_value(text, "draftline_stage_diagnosis{stage=\"drafter1\",role=\"drafter\",diagnosis=\"starved\"} ") == 1);
    assert_true(sample_value(text, "draftline_train_step ") == 9);
    assert_true(sample_value(text, "draftline_train_tokens_total ") == 5120);
    assert_non_null(strstr(text, "# TYPE draftline_wait_input_seconds_total counter"));
    assert_non_null(strstr(text, "# TYPE draftline_since_progress_seconds gauge"));
    assert_non_null(strstr(text, "draftline_train_accuracy{position=\"7\"} "));
    assert_non_null(strstr(text, "draftline_bottleneck{role=\"drafter\"} 1"));
    free(text);
    /* names sanitised, label values escaped, non-finite values spelled as the format */
    mon_run_t *r2 = mon_run_new();
    const char *names[] = {"tok/s", "9lives", "inf"};
    double vals[] = {NAN, 1, INFINITY};
    assert_int_equal(mon_run_ingest_metrics(r2, 5, "we\"ird\\x", 100, 1, "running", names, vals, 3), 0);
    assert_int_equal(mon_prom_render(r2, 5, NULL, NULL, &text, &len), 0);
    check_exposition(text);
    assert_non_null(strstr(text, "draftline_tok_s{stage=\"we\\\"ird\\\\x\",role=\"drafter\"} NaN"));
    assert_non_null(strstr(text, "draftline_9lives{"));
    assert_non_null(strstr(text, "draftline_inf{stage=\"we\\\"ird\\\\x\",role=\"drafter\"} +Inf"));
    free(text);
    char out[64];
    mon_prom_sanitize("", "9a-b.c", out, sizeof out);
    assert_string_equal(out, "_9a_b_c");
    mon_run_destroy(&r2);
    mon_run_destroy(&run);
}

/* The supervisor's path (a decoded METRICS message) gives the same picture as the line
 * on_metrics writes for it. */
static void test_ingest_proto_equals_line(void **state) {
    (void)state;
    proto_metrics_t m;
    memset(&m, 0, sizeof m);
    m.stage_id = 101;
    m.role = PROTO_ROLE_DRAFTER;
    m.incarnation = 3;
    m.ts_ns = 1796075638500000000ull;      /* exact in a double, so ts_ns / 1e9 == the line's ts */
    snprintf(m.state, sizeof m.state, "running");
    const char *names[] = {"wait_input_s", "backward_s", "since_progress_s", "inbox_gpu_bytes", "loss"};
    double vals[] = {2.00463011, 11.3907473, 0.04022066, 1184256, NAN};
    for (int i = 0; i < 5; i++) {
        snprintf(m.metrics[i].name, sizeof m.metrics[i].name, "%s", names[i]);
        m.metrics[i].value = vals[i];
    }
    m.n_metrics = 5;
    mon_run_t *a = mon_run_new(), *b = mon_run_new();
    assert_int_equal(mon_run_ingest_proto(a, "drafter1", &m), 0);
    const char *line = "{\"ts\":1796075638.500,\"stage\":\"drafter1\",\"stage_id\":101,\"incarnation\":3,"
                       "\"state\":\"running\",\"wait_input_s\":2.00463011,\"backward_s\":11.3907473,"
                       "\"since_progress_s\":0.04022066,\"inbox_gpu_bytes\":1184256,\"loss\":null}";
    assert_int_equal(mon_run_ingest_metrics_line(b, line, strlen(line)), 0);
    char *ta = NULL, *tb = NULL;
    size_t la, lb;
    double now = 1796075639.0;
    assert_int_equal(mon_prom_render(a, now, NULL, NULL, &ta, &la), 0);
    assert_int_equal(mon_prom_render(b, now, NULL, NULL, &tb, &lb), 0);
    assert_string_equal(ta, tb);
    assert_true(sample_value(ta, "draftline_stage_incarnation{stage=\"drafter1\",role=\"drafter\"} ") == 3);
    free(ta);
    free(tb);
    /* the ready-made render callback */
    assert_int_equal(mon_prom_render_run(a, &ta, &la), 0);
    assert_true(check_exposition(ta) > 5);
    free(ta);
    mon_run_destroy(&a);
    mon_run_destroy(&b);
}

/* -------------------------------------------------------------- plot, NVML */

static void test_plot_png(void **state) {
    (void)state;
    mon_run_t *run = mon_run_open("tests/fixtures/monitor/run_cpu");
    assert_non_null(run);
    mon_run_poll(run);
    char p[400];
    snprintf(p, sizeof p, "%s/plot.png", tmpdir);
    mon_plot_opts_t po = {.width = 900, .height = 1000};
    assert_int_equal(mon_plot_png(run, p, &po), 0);        /* cairo reported success */
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    unsigned char h[24];
    assert_int_equal(fread(h, 1, 24, f), 24);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    assert_memory_equal(h, sig, 8);
    assert_memory_equal(h + 12, "IHDR", 4);
    unsigned w = (unsigned)h[16] << 24 | h[17] << 16 | h[18] << 8 | h[19];
    unsigned hh = (unsigned)h[20] << 24 | h[21] << 16 | h[22] << 8 | h[23];
    assert_int_equal(w, 900);
    assert_int_equal(hh, 1000);
    assert_true(size > 20000);                  /* drawn, not blank (a blank PNG is ~3 KB) */
    char tmp[420];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    assert_int_not_equal(access(tmp, F_OK), 0);
    /* no steps: a clear error; an unwritable path: cairo's error */
    mon_run_t *empty = mon_run_new();
    assert_int_equal(mon_plot_png(empty, p, NULL), DL_ENOENT);
    assert_int_equal(mon_plot_png(run, "/nonexistent-dir/x.png", NULL), DL_EIO);
    assert_non_null(strstr(dl_errmsg(), "cairo"));
    mon_run_destroy(&empty);
    mon_run_destroy(&run);
}

static void test_nvml_absent(void **state) {
    (void)state;
    mon_nvml_t *n = mon_nvml_open("/nonexistent/libnvidia-ml.so.1");
    assert_null(n);
    assert_non_null(strstr(dl_errmsg(), "not loadable"));
    assert_int_equal(mon_nvml_count(NULL), 0);
    mon_gpu_t g;
    assert_int_equal(mon_nvml_query(NULL, 0, &g), DL_ERANGE);
    mon_nvml_close(&n);
    /* the real library when present (GPU machines): counts and figures are sane */
    n = mon_nvml_open(NULL);
    if (n) {
        for (int i = 0; i < mon_nvml_count(n); i++) {
            assert_int_equal(mon_nvml_query(n, i, &g), 0);
            assert_true(g.mem_total > 0 && g.mem_used <= g.mem_total && g.util_gpu_pct <= 100);
        }
        mon_nvml_close(&n);
    }
}

/* `draftline monitor --once`: a dir that is no run exits 1 with the reason;
 * --prometheus-port with --once prints the exposition once and exits 0. */
static void test_cli_once(void **state) {
    (void)state;
    const char *bin = getenv("DL_BIN_DIR");
    if (!bin) { fprintf(stderr, "skip: DL_BIN_DIR not set (make test sets it)\n"); skip(); }
    char cmd[4200], buf[4096];
    snprintf(cmd, sizeof cmd, "%s/draftline monitor --run /tmp --once --no-nvml 2>&1", bin);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    assert_int_equal(WEXITSTATUS(pclose(f)), 1);
    assert_non_null(strstr(buf, "not a draftline run dir"));
    snprintf(cmd, sizeof cmd,
             "timeout 20 %s/draftline monitor --run tests/fixtures/monitor/run_cpu --once --prometheus-port 0 --no-nvml",
             bin);
    f = popen(cmd, "r");
    assert_non_null(f);
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    while (fread(cmd, 1, sizeof cmd, f) > 0) {}
    assert_int_equal(WEXITSTATUS(pclose(f)), 0); /* 124 if it served instead */
    assert_non_null(strstr(buf, "# TYPE draftline_"));
}

/* mon_nvml_visible: CUDA_VISIBLE_DEVICES as NVML indices in CUDA's order. */
static void test_nvml_visible(void **state) {
    (void)state;
    const char *u[4] = {"GPU-aaaa-0000", "GPU-abcd-1111", "GPU-b000-2222", "GPU-c000-3333"};
    int o[8];
    assert_int_equal(mon_nvml_visible(NULL, u, 4, o, 8), 4);
    assert_int_equal(o[0], 0);
    assert_int_equal(o[3], 3);
    assert_int_equal(mon_nvml_visible("2,0", u, 4, o, 8), 2);   /* CUDA 0 is NVML 2 */
    assert_int_equal(o[0], 2);
    assert_int_equal(o[1], 0);
    assert_int_equal(mon_nvml_visible(" 3 , GPU-b0", u, 4, o, 8), 2);   /* spaces, a UUID prefix */
    assert_int_equal(o[0], 3);
    assert_int_equal(o[1], 2);
    assert_int_equal(mon_nvml_visible("1,7,2", u, 4, o, 8), 1);   /* ends at a GPU that is not there */
    assert_int_equal(o[0], 1);
    assert_int_equal(mon_nvml_visible("GPU-a,1", u, 4, o, 8), 0);   /* a prefix naming two GPUs */
    assert_int_equal(mon_nvml_visible("1,1", u, 4, o, 8), 1);       /* a repeat ends it */
    assert_int_equal(mon_nvml_visible("", u, 4, o, 8), 0);
    assert_int_equal(mon_nvml_visible("-1", u, 4, o, 8), 0);
    assert_int_equal(mon_nvml_visible("0,1,2,3", u, 4, o, 2), 2);   /* cap */
    assert_int_equal(mon_nvml_visible("99999999999999999999", u, 4, o, 8), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_once),
        cmocka_unit_test_setup_teardown(test_tail_partial_truncate_rotate, setup_tmp, teardown_tmp),
        cmocka_unit_test(test_parse_real_run),
        cmocka_unit_test(test_incarnation_resets_history),
        cmocka_unit_test(test_stuck_within_stall_s),
        cmocka_unit_test(test_stuck_between_samples_and_silent),
        cmocka_unit_test(test_starved_not_stuck),
        cmocka_unit_test(test_backpressured_and_shares),
        cmocka_unit_test(test_gpu_turn_share),
        cmocka_unit_test(test_bottleneck),
        cmocka_unit_test(test_report_stall_fixture),
        cmocka_unit_test_setup_teardown(test_report_topology_rows, setup_tmp, teardown_tmp),
        cmocka_unit_test(test_prom_render),
        cmocka_unit_test(test_ingest_proto_equals_line),
        cmocka_unit_test_setup_teardown(test_plot_png, setup_tmp, teardown_tmp),
        cmocka_unit_test(test_nvml_absent),
        cmocka_unit_test(test_nvml_visible),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
