/* The monitor's snapshot, issue 15 item 14 (each case failed before its fix):
 *  - a stage's BUSY + WAIT-IN + WAIT-CR + WAIT-GPU add up to at most 100 % (phases ending
 *    in the window that began before it gave 130 %; %.0f rounding gave 101 %);
 *  - --gpu-turns: the wait for the GPU's turn has its own column (WAIT-GPU), so a row's
 *    four shares add up to 100 % (without it a stage waiting 40 % for turns showed 60 %),
 *    and the rows stay 80 columns wide before the diagnosis;
 *  - a 1+1 run resumed in the dir of a 2+2 run counts and shows its 4 stages, not the 6
 *    names metrics.jsonl ever saw (nor blames the old run's target1 as silent);
 *  - no ETA on a stopped run or one at max_steps: "finished";
 *  - a CPU run (run.json device "cpu") has no GPU tier column and no GPU section;
 *  - on a terminal of 80 columns no line is wider and no diagnosis is cut;
 *  - no `--targets N+1` advice when the machine has no core for another process;
 *  - steps named from 0 as the console names them: "step 9 done (10 of 100)". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/monitor/diag.h"
#include "common/monitor/prom.h"
#include "common/monitor/report.h"
#include "common/monitor/run.h"

static char tmpdir[256];

static int setup_tmp(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dl-test-monrep-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmp(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_in(const char *name, const char *txt) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(txt, f);
    fclose(f);
}

/* The row of `stage` in a snapshot (copied into row); row[0] = 0 when there is none. */
static void stage_row(const char *text, const char *stage, char *row, size_t cap) {
    size_t L = strlen(stage);
    row[0] = 0;
    for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
        if (!strncmp(l, stage, L) && l[L] == ' ') {
            const char *e = strchr(l, '\n');
            snprintf(row, cap, "%.*s", (int)(e ? e - l : (long)strlen(l)), l);
            return;
        }
}

/* A snapshot of tmpdir's files at wall time `now` (run.json read as the monitor does). */
static char *snapshot(double now, int cols) {
    mon_run_t *run = mon_run_open(tmpdir);
    assert_non_null(run);
    assert_true(mon_run_poll(run) > 0);
    mon_report_opts_t ro = {0};
    ro.wall = ro.now = now;
    ro.cols = cols;
    mon_diag_opts_default(&ro.diag);
    mon_topo_read(tmpdir, &ro.topo);
    char *text = NULL;
    assert_int_equal(mon_report(run, &ro, &text), 0);
    mon_run_destroy(&run);
    return text;
}

/* BUSY, WAIT-IN, WAIT-CR and WAIT-GPU of a row (percent) into p[4]; fails unless the
 * row has the four, each "N%". */
static void row_shares(const char *row, int p[4]) {
    char name[32], role[16], st[16], tps[16], sh[4][8];
    unsigned inc;
    if (sscanf(row, "%31s %15s %u %15s %15s %7s %7s %7s %7s", name, role, &inc, st, tps, sh[0], sh[1], sh[2],
               sh[3]) != 9)
        fail_msg("not a stage row: '%s'", row);
    for (int k = 0; k < 4; k++) {
        size_t L = strlen(sh[k]);
        if (L < 2 || sh[k][L - 1] != '%') fail_msg("share %d is '%s' in '%s'", k, sh[k], row);
        p[k] = atoi(sh[k]);
    }
}

/* The four shares of a row, added up (percent). */
static int row_share_sum(const char *row) {
    int p[4];
    row_shares(row, p);
    return p[0] + p[1] + p[2] + p[3];
}

static void test_shares_add_up(void **state) {
    (void)state;
    /* the pure rule: 6 s of input wait and 7 s of forward ended inside a 10 s window */
    mon_stage_view_t v = {.name = "target0", .role = MON_ROLE_TARGET, .state = "running", .dt = 10,
                          .d_wait_input = 6, .d_busy = 7, .since_progress_s = 0.5};
    mon_diag_opts_t o;
    mon_diag_opts_default(&o);
    mon_diag_t d;
    mon_diagnose(&v, &o, &d);
    assert_true(d.share_in + d.share_credit + d.share_busy <= 1 + 1e-9);
    assert_true(fabs(d.share_busy - 7.0 / 13) < 1e-9);
    /* under 1: the open phase (running: busy) gets the rest, once */
    v.d_wait_input = 2;
    v.d_busy = 3;
    mon_diagnose(&v, &o, &d);
    assert_true(fabs(d.share_in - 0.2) < 1e-9 && fabs(d.share_busy - 0.8) < 1e-9 && d.share_credit == 0);
    /* through the snapshot: the same overlap, and shares of 33.5 / 33.5 / 33 % */
    write_in("metrics.jsonl",
        "{\"ts\":100,\"stage\":\"target0\",\"stage_id\":200,\"incarnation\":1,\"state\":\"running\","
        "\"wait_input_s\":0,\"wait_credit_s\":0,\"forward_s\":0,\"since_progress_s\":0}\n"
        "{\"ts\":100,\"stage\":\"target1\",\"stage_id\":201,\"incarnation\":1,\"state\":\"running\","
        "\"wait_input_s\":0,\"wait_credit_s\":0,\"forward_s\":0,\"since_progress_s\":0}\n"
        "{\"ts\":110,\"stage\":\"target0\",\"stage_id\":200,\"incarnation\":1,\"state\":\"running\","
        "\"wait_input_s\":6,\"wait_credit_s\":0,\"forward_s\":7,\"since_progress_s\":0}\n"
        "{\"ts\":110,\"stage\":\"target1\",\"stage_id\":201,\"incarnation\":1,\"state\":\"running\","
        "\"wait_input_s\":3.35,\"wait_credit_s\":3.3,\"forward_s\":3.35,\"since_progress_s\":0}\n");
    char *text = snapshot(110, 0), row[256];
    stage_row(text, "target0", row, sizeof row);
    if (row_share_sum(row) > 100) fail_msg("shares above 100 %%: '%s'", row);
    stage_row(text, "target1", row, sizeof row);
    if (row_share_sum(row) > 100) fail_msg("rounded shares above 100 %%: '%s'", row);
    free(text);
}

/* A 2+2 run's metrics, then the 1+1 run resumed in the same dir (run.json: its 4). */
static void write_resumed(const char *state) {
    char m[4096];
    size_t w = 0;
    const char *const old[] = {"loader:1", "optimizer:2", "target0:200", "target1:201", "drafter0:100", "drafter1:101"};
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 6; i++) {
            if (t == 1 && (!strncmp(old[i], "target1", 7) || !strncmp(old[i], "drafter1", 8)))
                continue;       /* the resumed run has no target1 / drafter1 */
            char name[32];
            snprintf(name, sizeof name, "%.*s", (int)(strchr(old[i], ':') - old[i]), old[i]);
            int id = atoi(strchr(old[i], ':') + 1);
            for (int k = 0; k < 2; k++)
                w += (size_t)snprintf(m + w, sizeof m - w,
                    "{\"ts\":%d,\"stage\":\"%s\",\"stage_id\":%d,\"incarnation\":1,\"state\":\"running\","
                    "\"forward_s\":%d,\"since_progress_s\":0}\n", (t ? 500 : 100) + k, name, id, k);
        }
    write_in("metrics.jsonl", m);
    char rj[2048];
    snprintf(rj, sizeof rj,
        "{\"device\":\"cpu\",\"max_steps\":100,\"state\":\"%s\",\"stages\":["
        "{\"name\":\"loader\",\"stage_id\":1,\"incarnation\":1,\"process\":\"running\"},"
        "{\"name\":\"optimizer\",\"stage_id\":2,\"incarnation\":1,\"process\":\"running\"},"
        "{\"name\":\"drafter0\",\"stage_id\":100,\"incarnation\":1,\"process\":\"running\"},"
        "{\"name\":\"target0\",\"stage_id\":200,\"incarnation\":1,\"process\":\"running\"}]}\n", state);
    write_in("run.json", rj);
}

static void test_resume_counts_live_topology(void **state) {
    (void)state;
    write_resumed("running");
    char *text = snapshot(501.5, 0), row[256];
    if (!strstr(text, ": 4 stages,")) fail_msg("a 1+1 run counted as:\n%s", text);
    stage_row(text, "target1", row, sizeof row);
    assert_string_equal(row, "");
    stage_row(text, "drafter1", row, sizeof row);
    assert_string_equal(row, "");
    assert_null(strstr(text, "silent"));            /* the old run's stages are not blamed */
    free(text);
    /* the counts behind the advice and the Prometheus text see the same 4 */
    mon_run_t *run = mon_run_open(tmpdir);
    assert_non_null(run);
    mon_run_poll(run);
    mon_topo_t t = {0};
    assert_int_equal(mon_topo_read(tmpdir, &t), 0);
    mon_topo_from_run(run, &t);
    assert_int_equal(t.n_targets, 1);
    assert_int_equal(t.n_drafters, 1);
    char *prom = NULL;
    size_t len = 0;
    assert_int_equal(mon_prom_render(run, 501.5, NULL, &t, &prom, &len), 0);
    assert_non_null(strstr(prom, "draftline_stage_up{stage=\"target1\",role=\"target\"} 0"));
    assert_non_null(strstr(prom, "draftline_stage_up{stage=\"target0\",role=\"target\"} 1"));
    free(prom);
    mon_run_destroy(&run);
}

/* The stall fixture (steps 0..9 at 1 s each, max_steps 100) as seen with run.json's
 * state and max_steps replaced. */
static char *fixture_snapshot(const char *run_state, uint64_t max_steps, int cols) {
    mon_run_t *run = mon_run_open("tests/fixtures/monitor/stall");
    assert_non_null(run);
    assert_true(mon_run_poll(run) > 0);
    mon_report_opts_t ro = {0};
    ro.wall = ro.now = run->last_ts;
    ro.cols = cols;
    mon_diag_opts_default(&ro.diag);
    ro.diag.stall_s = 20;
    assert_int_equal(mon_topo_read("tests/fixtures/monitor/stall", &ro.topo), 0);
    snprintf(ro.topo.run_state, sizeof ro.topo.run_state, "%s", run_state);
    if (max_steps) ro.topo.max_steps = max_steps;
    char *text = NULL;
    assert_int_equal(mon_report(run, &ro, &text), 0);
    mon_run_destroy(&run);
    return text;
}

static void test_no_eta_when_finished(void **state) {
    (void)state;
    char *text = fixture_snapshot("running", 0, 0);
    assert_non_null(strstr(text, "training: step 9 done (10 of 100)"));
    assert_non_null(strstr(text, "ETA 1m30s"));
    free(text);
    text = fixture_snapshot("stopped", 0, 0);       /* stopped early (Ctrl-C) */
    if (strstr(text, "ETA") || !strstr(text, "finished")) fail_msg("a stopped run:\n%s", text);
    free(text);
    text = fixture_snapshot("running", 10, 0);      /* step 9 was the last of 10 */
    assert_non_null(strstr(text, "step 9 done (10 of 10)"));
    if (strstr(text, "ETA") || !strstr(text, "finished")) fail_msg("max_steps reached:\n%s", text);
    free(text);
}

static void test_cpu_run_has_no_gpu_columns(void **state) {
    (void)state;
    char *text = fixture_snapshot("running", 0, 0);     /* run.json: device "cpu" */
    assert_null(strstr(text, "GPU TIER"));
    assert_null(strstr(text, "\nGPU "));
    assert_non_null(strstr(text, "\nINBOX "));
    assert_non_null(strstr(text, "90.0%"));             /* the inbox's fill is still there */
    /* its bytes: the tiers summed (a CPU run's inbox is host memory in either tier), not
     * the empty host tier alone ("0 B / 0 B" beside 90% full) */
    assert_null(strstr(text, "0 B / 0 B"));
    assert_non_null(strstr(text, "USED / CAP"));
    free(text);
}

static void test_terminal_width_never_cuts(void **state) {
    (void)state;
    char *wide = fixture_snapshot("running", 0, 0), *narrow = fixture_snapshot("running", 0, 80);
    for (const char *l = narrow; *l;) {
        const char *e = strchr(l, '\n');
        if (e - l > 80) fail_msg("a line of %d columns: '%.*s'", (int)(e - l), (int)(e - l), l);
        l = e + 1;
    }
    /* every row's diagnosis, whole, on a line of its own */
    const char *const stages[] = {"drafter0", "drafter1", "target0", "target1", "optimizer", "loader"};
    for (int i = 0; i < 6; i++) {
        char row[256];
        stage_row(wide, stages[i], row, sizeof row);
        const char *diag = strstr(row, "  ") ? strrchr(row, ':') : NULL;
        assert_non_null(diag);
        while (diag > row && diag[-1] != ' ') diag--;   /* "stuck: no progress ..." */
        char want[300];
        snprintf(want, sizeof want, "\n    %s\n", diag);
        if (!strstr(narrow, want)) fail_msg("%s's diagnosis '%s' not whole in:\n%s", stages[i], diag, narrow);
    }
    /* a file or a pipe (cols 0): rows as long as they are */
    char row[256];
    stage_row(wide, "drafter0", row, sizeof row);
    assert_true(strlen(row) > 80);
    assert_non_null(strstr(row, "stuck: no progress for 30 s and not waiting"));
    free(wide);
    free(narrow);
}

/* --gpu-turns: over a 10 s window (ts 100 -> 110) each stage's phase counters grow by
 * known seconds; its row shows BUSY, WAIT-IN, WAIT-CR and WAIT-GPU as those seconds'
 * shares of the window, adding up to 100:
 *   target0   busy 3 (forward), input 1, credit 2, GPU turn 4 s: 30 / 10 / 20 / 40;
 *   target1   busy 2.505, input 2.505, credit 2.495, GPU 2.495: 25 each (floors 98,
 *             the two points to the largest remainders);
 *   drafter0  idle: busy 2 (copy 0.5 + backward 1.5), GPU 5, the open 3 s are input:
 *             20 / 30 / 0 / 50;
 *   optimizer step 4, GPU 8 s (12 s in the 10 s window: phases begun before it), scaled
 *             together: 4 / 12 and 8 / 12, 33 / 0 / 0 / 67.
 * The Prometheus text carries the wait as a counter, draftline_wait_gpu_seconds_total. */
static void test_gpu_turn_column(void **state) {
    (void)state;
    write_in("metrics.jsonl",
        "{\"ts\":100,\"stage\":\"target0\",\"stage_id\":200,\"incarnation\":1,\"state\":\"running\","
        "\"wait_input_s\":10,\"wait_credit_s\":20,\"forward_s\":30,\"wait_gpu_s\":40,\"since_progress_s\":0}\n"
        "{\"ts\":100,\"stage\":\"target1\",\"stage_id\":201,\"incarnation\":1,\"state\":\"running\","
        "\"wait_input_s\":0,\"wait_credit_s\":0,\"forward_s\":0,\"wait_gpu_s\":0,\"since_progress_s\":0}\n"
        "{\"ts\":100,\"stage\":\"drafter0\",\"stage_id\":100,\"incarnation\":1,\"state\":\"idle\","
        "\"wait_input_s\":0,\"wait_credit_s\":0,\"copy_s\":0,\"backward_s\":0,\"wait_gpu_s\":0,"
        "\"since_progress_s\":0}\n"
        "{\"ts\":100,\"stage\":\"optimizer\",\"stage_id\":2,\"incarnation\":1,\"state\":\"running\","
        "\"wait_input_s\":0,\"step_s\":0,\"wait_gpu_s\":0,\"since_progress_s\":0}\n"
        "{\"ts\":110,\"stage\":\"target0\",\"stage_id\":200,\"incarnation\":1,\"state\":\"running\","
        "\"wait_input_s\":11,\"wait_credit_s\":22,\"forward_s\":33,\"wait_gpu_s\":44,\"since_progress_s\":0}\n"
        "{\"ts\":110,\"stage\":\"target1\",\"stage_id\":201,\"incarnation\":1,\"state\":\"running\","
        "\"wait_input_s\":2.505,\"wait_credit_s\":2.495,\"forward_s\":2.505,\"wait_gpu_s\":2.495,"
        "\"since_progress_s\":0}\n"
        "{\"ts\":110,\"stage\":\"drafter0\",\"stage_id\":100,\"incarnation\":1,\"state\":\"idle\","
        "\"wait_input_s\":0,\"wait_credit_s\":0,\"copy_s\":0.5,\"backward_s\":1.5,\"wait_gpu_s\":5,"
        "\"since_progress_s\":0}\n"
        "{\"ts\":110,\"stage\":\"optimizer\",\"stage_id\":2,\"incarnation\":1,\"state\":\"running\","
        "\"wait_input_s\":0,\"step_s\":4,\"wait_gpu_s\":8,\"since_progress_s\":0}\n");
    write_in("run.json", "{\"device\":\"cuda\",\"max_steps\":100,\"state\":\"running\"}\n");
    char *wide = snapshot(110, 0), *narrow = snapshot(110, 80), row[256];
    if (!strstr(wide, " BUSY WAIT-IN WAIT-CR WAIT-GPU NO-PROGR ")) fail_msg("no WAIT-GPU column:\n%s", wide);
    const struct { const char *stage; int p[4]; } want[] = {
        {"target0", {30, 10, 20, 40}}, {"target1", {25, 25, 25, 25}},
        {"drafter0", {20, 30, 0, 50}}, {"optimizer", {33, 0, 0, 67}}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        int p[4];
        stage_row(wide, want[i].stage, row, sizeof row);
        row_shares(row, p);
        for (int k = 0; k < 4; k++)
            if (p[k] != want[i].p[k])
                fail_msg("%s: share %d is %d%%, expected %d%%: '%s'", want[i].stage, k, p[k], want[i].p[k], row);
        assert_int_equal(p[0] + p[1] + p[2] + p[3], 100);
        /* 80 columns: the row whole on its line (not wrapped), its diagnosis on the next */
        char wrow[256];
        snprintf(wrow, sizeof wrow, "%s", row);
        stage_row(narrow, want[i].stage, row, sizeof row);
        size_t L = strlen(row);
        if (L > 80 || strncmp(wrow, row, L) || strncmp(wrow + L, "  ", 2))
            fail_msg("%s at 80 columns: '%s' (wide: '%s')", want[i].stage, row, wrow);
        char diag[300];
        snprintf(diag, sizeof diag, "%s\n    %s\n", row, wrow + L + 2);
        if (!strstr(narrow, diag)) fail_msg("%s's diagnosis not on its own line:\n%s", want[i].stage, narrow);
    }
    free(wide);
    free(narrow);
    /* the Prometheus text: the wait itself, a counter per stage */
    mon_run_t *run = mon_run_open(tmpdir);
    assert_non_null(run);
    assert_true(mon_run_poll(run) > 0);
    mon_topo_t t = {0};
    assert_int_equal(mon_topo_read(tmpdir, &t), 0);
    char *prom = NULL;
    size_t len = 0;
    assert_int_equal(mon_prom_render(run, 110, NULL, &t, &prom, &len), 0);
    assert_non_null(strstr(prom, "# TYPE draftline_wait_gpu_seconds_total counter\n"));
    assert_non_null(strstr(prom, "draftline_wait_gpu_seconds_total{stage=\"target0\",role=\"target\"} 44\n"));
    assert_non_null(strstr(prom, "draftline_wait_gpu_seconds_total{stage=\"optimizer\",role=\"optimizer\"} 8\n"));
    free(prom);
    mon_run_destroy(&run);
}

/* targets busy, drafters starved: the targets need more. */
static void targets_bottleneck(mon_stage_view_t *v, mon_diag_t *d, int *n) {
    mon_diag_opts_t o;
    mon_diag_opts_default(&o);
    const struct { const char *name; mon_role_t role; const char *st; double in, busy; } f[] = {
        {"target0", MON_ROLE_TARGET, "running", 0.05, 0.95}, {"target1", MON_ROLE_TARGET, "running", 0.05, 0.95},
        {"drafter0", MON_ROLE_DRAFTER, "idle", 0.6, 0.4}};
    for (int i = 0; i < 3; i++) {
        memset(&v[i], 0, sizeof v[i]);
        v[i].name = f[i].name;
        v[i].role = f[i].role;
        snprintf(v[i].state, sizeof v[i].state, "%s", f[i].st);
        v[i].dt = 10;
        v[i].d_wait_input = 10 * f[i].in;
        v[i].d_busy = 10 * f[i].busy;
        v[i].since_progress_s = 0.5;
        v[i].inbox_used = v[i].inbox_cap = NAN;
        mon_diagnose(&v[i], &o, &d[i]);
    }
    *n = 3;
}

static void test_no_add_without_a_free_core(void **state) {
    (void)state;
    mon_stage_view_t v[3];
    mon_diag_t d[3];
    int n;
    targets_bottleneck(v, d, &n);
    /* this machine's cores, all taken: targets = cores, one drafter (run.json, no nodes) */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    assert_true(cores > 0);
    char rj[256];
    snprintf(rj, sizeof rj, "{\"device\":\"cpu\",\"targets\":%ld,\"drafters\":1}\n", cores);
    write_in("run.json", rj);
    mon_topo_t t = {0};
    assert_int_equal(mon_topo_read(tmpdir, &t), 0);
    assert_int_equal(t.cores, (int)cores);
    mon_bottleneck_t b;
    mon_bottleneck(v, d, n, &t, "R", &b);
    assert_int_equal(b.kind, MON_ROLE_TARGET);
    char add[64];
    snprintf(add, sizeof add, "--targets %ld", cores + 1);
    if (strstr(b.text, add) || !strstr(b.text, "machine is the limit")) fail_msg("no core free: '%s'", b.text);
    /* 2 cores, 2 targets + 1 drafter of 1 thread (the issue's case) */
    mon_topo_t t2 = {.n_targets = 2, .n_drafters = 1, .cores = 2, .threads = 1};
    mon_bottleneck(v, d, n, &t2, "R", &b);
    if (strstr(b.text, "--targets 3") || !strstr(b.text, "machine is the limit")) fail_msg("2 cores: '%s'", b.text);
    /* 8 cores, 1 thread each: a core is free, add one */
    mon_topo_t t8 = {.n_targets = 2, .n_drafters = 1, .cores = 8, .threads = 1};
    mon_bottleneck(v, d, n, &t8, "R", &b);
    assert_non_null(strstr(b.text, "--targets 3 --drafters 1"));
    /* two drafters: a move, whatever the cores */
    mon_topo_t tm = {.n_targets = 2, .n_drafters = 2, .cores = 2, .threads = 1};
    mon_bottleneck(v, d, n, &tm, "R", &b);
    assert_non_null(strstr(b.text, "rebalance --run R --targets 3 --drafters 1"));
    /* a multi-node run: the nodes' cores, not this machine's */
    write_in("run.json", "{\"device\":\"cpu\",\"targets\":2,\"drafters\":1,\"nodes\":["
                         "{\"name\":\"head\",\"index\":0,\"cores\":2,\"gpus\":0,\"alive\":true},"
                         "{\"name\":\"b\",\"index\":1,\"cores\":64,\"gpus\":0,\"alive\":true}]}\n");
    mon_topo_t tn = {0};
    assert_int_equal(mon_topo_read(tmpdir, &tn), 0);
    assert_int_equal(tn.cores, 66);
}

/* One GPU shared by a target and a drafter taking turns (the reference run's shares:
 * target busy 43% and waiting for its turn 52%, drafter busy 55% and waiting for input
 * 43%, optimizer 2%): the GPU is the bottleneck, not targets or drafters; without turns
 * (no GPU waits) the rule does not apply; with a GPU each it does not either. */
static void test_shared_gpu_bottleneck(void **state) {
    (void)state;
    mon_diag_opts_t o;
    mon_diag_opts_default(&o);
    const struct { const char *name; mon_role_t role; double in, busy, gpu; } f[] = {
        {"target0", MON_ROLE_TARGET, 0.05, 0.43, 0.52}, {"drafter0", MON_ROLE_DRAFTER, 0.43, 0.55, 0.02},
        {"optimizer", MON_ROLE_OPTIMIZER, 0.90, 0.02, 0.08}};
    mon_stage_view_t v[3];
    mon_diag_t d[3];
    for (int turns = 1; turns >= 0; turns--) {
        for (int i = 0; i < 3; i++) {
            memset(&v[i], 0, sizeof v[i]);
            v[i].name = f[i].name;
            v[i].role = f[i].role;
            snprintf(v[i].state, sizeof v[i].state, "running");
            v[i].dt = 10;
            v[i].d_wait_input = 10 * (f[i].in + (turns ? 0 : f[i].gpu));
            v[i].d_busy = 10 * f[i].busy;
            v[i].d_wait_gpu = turns ? 10 * f[i].gpu : 0;
            v[i].since_progress_s = 0.5;
            v[i].inbox_used = v[i].inbox_cap = NAN;
            mon_diagnose(&v[i], &o, &d[i]);
        }
        mon_topo_t t = {.gpu_mode = 1, .n_targets = 1, .n_drafters = 1, .target_gpus = {0},
                        .n_target_gpus = 1, .drafter_gpus = {0}, .n_drafter_gpus = 1};
        mon_bottleneck_t b;
        mon_bottleneck(v, d, 3, &t, "R", &b);
        const char *want = "the GPU is the bottleneck: targets and drafters take turns on GPU 0 and keep it busy "
                           "100% of the time (targets 43%, drafters 55%, optimizer 2%)";
        if (turns) {
            if (!strstr(b.text, want)) fail_msg("shared GPU, turns: '%s'", b.text);
            assert_int_equal(b.kind, MON_ROLE_UNKNOWN);
            /* three targets and a drafter on GPU 0, listed as 0,0,0 and 0: one GPU */
            mon_topo_t t3 = t;
            t3.n_targets = 3, t3.n_target_gpus = 3;
            mon_bottleneck(v, d, 3, &t3, "R", &b);
            assert_non_null(strstr(b.text, "take turns on GPU 0 and keep it busy 100%"));
            /* a GPU each: not shared, so not this rule */
            mon_topo_t t2 = t;
            t2.drafter_gpus[0] = 1;
            mon_bottleneck(v, d, 3, &t2, "R", &b);
            if (strstr(b.text, "the GPU is the bottleneck")) fail_msg("two GPUs: '%s'", b.text);
        } else if (strstr(b.text, "the GPU is the bottleneck")) {
            fail_msg("no turns: '%s'", b.text);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_gpu_bottleneck),
        cmocka_unit_test_setup_teardown(test_shares_add_up, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_resume_counts_live_topology, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_gpu_turn_column, setup_tmp, teardown_tmp),
        cmocka_unit_test(test_no_eta_when_finished),
        cmocka_unit_test(test_cpu_run_has_no_gpu_columns),
        cmocka_unit_test(test_terminal_width_never_cuts),
        cmocka_unit_test_setup_teardown(test_no_add_without_a_free_core, setup_tmp, teardown_tmp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
