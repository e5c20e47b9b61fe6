/* `draftline plot`'s data (common/monitor/plot.h, plot_events.h) on synthetic runs:
 *  - the loss EMA starts after the warm-up (the step-0 outlier is not in it) and the
 *    warm-up points are out of the axis range;
 *  - tokens/s only over complete windows of consecutive steps (none across a gap), and
 *    none for the last step (its interval holds the final checkpoint: the end spike);
 *  - events from metrics.jsonl: τ of an eval, a restart, a rebalance, a resume, and the
 *    lr peak of the warm-up from the steps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/monitor/plot.h"
#include "common/monitor/plot_events.h"
#include "common/monitor/run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void step_line(mon_run_t *run, int step, double loss, double lr, double tokens, double t) {
    char l[256];
    snprintf(l, sizeof l, "{\"step\":%d,\"loss\":%.9g,\"grad_norm\":1,\"lr\":%.9g,\"tokens\":%.0f,\"skipped\":0,"
             "\"acc_mean\":0.1,\"t\":%.3f}", step, loss, lr, tokens, t);
    assert_int_equal(mon_run_ingest_steps_line(run, l, strlen(l)), 0);
}

static void test_loss_ema_after_warmup(void **state) {
    (void)state;
    mon_run_t *run = mon_run_new();
    for (int i = 0; i < 100; i++) step_line(run, i, i == 0 ? 100.0 : 5.0, 1e-3, 1000.0 * (i + 1), 2.0 * i);
    mon_plot_cols_t c;
    assert_int_equal(mon_plot_cols(run, 0.9, &c), 0);
    assert_int_equal(c.n, 100);
    assert_int_equal(c.warm, 6);                        /* 100 / 20 + 1 */
    assert_true(c.x[0] == 0 && c.x[99] == 99);          /* steps as steps.jsonl numbers them */
    for (int i = 0; i < c.warm; i++) assert_true(isnan(c.loss_ema[i]));
    for (int i = c.warm; i < 100; i++) assert_true(fabs(c.loss_ema[i] - 5.0) < 1e-9);   /* no trace of 100 */
    /* every rate is a full window: 1000 tokens per 2 s */
    assert_true(isnan(c.tps[0]));
    for (int i = 1; i < 99; i++) assert_true(fabs(c.tps[i] - 500.0) < 1e-6);
    assert_true(isnan(c.tps[99]));                      /* the final checkpoint's interval */
    mon_plot_cols_free(&c);
    mon_run_destroy(&run);
}

static void test_rate_windows_skip_gaps(void **state) {
    (void)state;
    mon_run_t *run = mon_run_new();
    for (int i = 0; i < 10; i++) if (i != 5) step_line(run, i, 3.0, 1e-3, 100.0 * (i + 1), 1.0 * i);
    mon_plot_cols_t c;
    assert_int_equal(mon_plot_cols(run, 0.9, &c), 0);
    assert_int_equal(c.n, 9);
    assert_true(isnan(c.tps[5]));                       /* step 6 after the missing step 5 */
    assert_true(fabs(c.tps[6] - 100.0) < 1e-9);
    assert_true(fabs(c.tps[7] - 100.0) < 1e-9);
    assert_true(isnan(c.tps[8]));                       /* the last: not a rate */
    mon_plot_cols_free(&c);
    mon_run_destroy(&run);
}

static void test_events(void **state) {
    (void)state;
    char dir[] = "/tmp/dlplot-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char p[300];
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    const char *st = "{\"ts\":%d,\"stage\":\"%s\",\"stage_id\":%d,\"incarnation\":%d,\"state\":\"%s\",\"uptime_s\":%d%s}\n";
    fprintf(f, st, 1, "drafter0", 100, 1, "idle", 1, "");
    fprintf(f, st, 2, "optimizer", 2, 1, "step", 2, ",\"step\":0,\"loss\":9,\"lr\":0.0001,\"tokens\":10");
    fprintf(f, st, 3, "drafter0", 100, 2, "idle", 1, "");                  /* restart at step 0 */
    fprintf(f, st, 4, "optimizer", 2, 1, "step", 4, ",\"step\":1,\"loss\":8,\"lr\":0.0002,\"tokens\":20");
    fprintf(f, st, 5, "drafter1", 101, 1, "idle", 1, "");                  /* rebalance at step 1 */
    fprintf(f, "{\"ts\":6,\"stage\":\"eval\",\"state\":\"done\",\"step\":2,\"seconds\":3,\"tau\":2.5}\n");
    fprintf(f, st, 7, "optimizer", 2, 1, "step", 6, ",\"step\":2,\"loss\":7,\"lr\":0.0001,\"tokens\":30");
    fprintf(f, st, 8, "optimizer", 2, 1, "idle", 1, "");                   /* a new supervisor: resume */
    fprintf(f, st, 9, "optimizer", 2, 1, "step", 2, ",\"step\":3,\"loss\":6,\"lr\":0.00005,\"tokens\":40");
    fclose(f);
    mon_run_t *run = mon_run_open(dir);
    assert_non_null(run);
    assert_true(mon_run_poll(run) > 0);
    mon_plot_mark_t m[MON_PLOT_MAX_MARKS];
    int n = mon_plot_events(run, m);
    int seen = 0;
    for (int i = 0; i < n; i++) {
        fprintf(stderr, "  mark at step %.0f: %s\n", m[i].step, m[i].label);
        if (m[i].kind == MON_MARK_RESTART && m[i].step == 0 && !strcmp(m[i].label, "restart drafter0")) seen |= 1;
        if (m[i].kind == MON_MARK_REBALANCE && m[i].step == 1) seen |= 2;
        if (m[i].kind == MON_MARK_TAU && m[i].step == 1 && strstr(m[i].label, "2.50")) seen |= 4;
        if (m[i].kind == MON_MARK_RESUME && m[i].step == 2) seen |= 8;
        if (m[i].kind == MON_MARK_LR && m[i].step == 1) seen |= 16;
    }
    assert_int_equal(n, 5);
    assert_int_equal(seen, 31);
    mon_run_destroy(&run);
    unlink(p);
    rmdir(dir);
}

/* steps.jsonl's checkpoint fields: a mark at the checkpoint's last step saying how long
 * the steps were held (waited + snapshot). */
static void test_ckpt_marks(void **state) {
    (void)state;
    char dir[] = "/tmp/dlplot-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char p[300], q[300];
    snprintf(p, sizeof p, "%s/steps.jsonl", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    const char *ln = "{\"step\":%d,\"loss\":5,\"grad_norm\":1,\"lr\":0.001,\"tokens\":%d,\"skipped\":0,"
                     "\"acc_mean\":0.1,\"t\":%d%s}\n";
    for (int i = 0; i < 25; i++)
        fprintf(f, ln, i, 100 * (i + 1), i,
                i == 11 ? ",\"ckpt_step\":10,\"ckpt_waited_s\":0.000,\"ckpt_snapshot_s\":1.250,\"ckpt_write_s\":3.000"
                : i == 21 ? ",\"ckpt_step\":20,\"ckpt_waited_s\":2.000,\"ckpt_snapshot_s\":0.500,\"ckpt_write_s\":3.000"
                : "");
    fclose(f);
    snprintf(q, sizeof q, "%s/metrics.jsonl", dir);
    f = fopen(q, "w");
    assert_non_null(f);
    fclose(f);
    mon_run_t *run = mon_run_open(dir);
    assert_non_null(run);
    mon_run_poll(run);
    mon_plot_mark_t m[MON_PLOT_MAX_MARKS];
    int n = mon_plot_events(run, m), seen = 0;
    for (int i = 0; i < n; i++) {
        fprintf(stderr, "  mark at step %.0f: %s\n", m[i].step, m[i].label);
        if (m[i].kind == MON_MARK_CKPT && m[i].step == 9 && !strcmp(m[i].label, "ckpt 10 held 1.2 s")) seen |= 1;
        if (m[i].kind == MON_MARK_CKPT && m[i].step == 19 && !strcmp(m[i].label, "ckpt 20 held 2.5 s")) seen |= 2;
    }
    assert_int_equal(seen, 3);
    mon_run_destroy(&run);
    unlink(p);
    unlink(q);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_ema_after_warmup),
        cmocka_unit_test(test_rate_windows_skip_gaps),
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_ckpt_marks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
