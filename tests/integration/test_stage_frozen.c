/* A frozen stage is diagnosed within seconds (issue 15 item 20), on the tiny target of
 * test_pipeline and 60 GSM8K samples, a 2+2 CPU run with the default --stall-s 60:
 * drafter0 gets SIGSTOP once steps are applied and its metrics were seen; within 10 s `draftline status` shows its
 * row "silent N s" with "frozen?" (its last metrics' age) and `draftline monitor --once`
 * diagnoses it silent and names it as what the pipeline waits on (not "ok", not the
 * targets as the bottleneck); then SIGCONT, and the run finishes (exit 0, every step).
 * The old code showed it "running" and "ok" until --stall-s. Every child has a hard
 * timeout and is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/clock.h"
#include "common/rundir/rundir.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlfz", 60) < 0) return -1;
    proc_watchdog(400);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* `draftline <cmd> --run out [more]` to its end into log: its exit code. */
static int tool(const char *log, const char *cmd, const char *out, const char *more) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    int n = 0;
    a.argv[n++] = fx.exe;
    a.argv[n++] = (char *)cmd;
    a.argv[n++] = "--run";
    a.argv[n++] = (char *)out;
    if (more) a.argv[n++] = (char *)more;
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    return pf_run_draftline(&a, NULL, 30, NULL);
}

/* The line of txt that starts with prefix (copied into line), or 0 when none. */
static int line_of(const char *txt, const char *prefix, char *line, size_t cap) {
    for (const char *l = txt; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
        if (!strncmp(l, prefix, strlen(prefix))) {
            snprintf(line, cap, "%.*s", (int)n, l);
            return 1;
        }
        l = e ? e + 1 : NULL;
    }
    return 0;
}

static void test_sigstop_drafter_diagnosed(void **state) {
    (void)state;
    static pf_run_args_t a;
    char out[300], log[380], p[600], slog[380], mlog[380], line[1024];
    snprintf(out, sizeof out, "%s/frozen", fx.root);
    snprintf(log, sizeof log, "%s/frozen.console", fx.root);
    snprintf(slog, sizeof slog, "%s/status.out", fx.root);
    snprintf(mlog, sizeof mlog, "%s/monitor.out", fx.root);
    memset(&a, 0, sizeof a);
    char *argv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                    "--token-budget", "256", "--block-size", "4", "--num-anchors", "8", "--drafter-layers", "1",
                    "--threads", "1", "--targets", "2", "--drafters", "2", "--max-steps", "60", "--epochs", "2",
                    "--out", out, NULL};
    for (int i = 0; argv[i]; i++) a.argv[i] = argv[i];
    snprintf(a.log, sizeof a.log, "%s", log);
    proc_t run;
    assert_int_equal(proc_spawn(&run, "draftline run", pf_run_child, &a), 0);
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    for (int i = 0; i < 12000 && pf_count_lines(p) < 2; i++) usleep(10000);
    assert_true(pf_count_lines(p) >= 2);
    char mj[400];
    snprintf(mj, sizeof mj, "%s/metrics.jsonl", out);
    assert_true(pf_wait_for_text(mj, "\"stage\":\"drafter0\"", 60));
    static rundir_run_t rj;
    assert_int_equal(rundir_run_read(out, &rj), 0);
    int pid = 0;
    for (int i = 0; i < rj.n_stages; i++)
        if (!strcmp(rj.stages[i].name, "drafter0")) pid = rj.stages[i].pid;
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    double t0 = clock_mono_s();
    int seen_status = 0, seen_monitor = 0;
    char *st = NULL, *mo = NULL;
    while (clock_mono_s() - t0 < 10 && !(seen_status && seen_monitor)) {
        usleep(500000);
        if (!seen_status && tool(slog, "status", out, NULL) == 0) {
            free(st);
            st = pf_slurp(slog, NULL);
            seen_status = st && line_of(st, "drafter0 ", line, sizeof line) && strstr(line, " silent ") &&
                          strstr(line, "frozen?");
            if (seen_status) printf("status after %.1f s: %s\n", clock_mono_s() - t0, line);
        }
        if (!seen_monitor && tool(mlog, "monitor", out, "--once") == 0) {
            free(mo);
            mo = pf_slurp(mlog, NULL);
            seen_monitor = mo && line_of(mo, "drafter0 ", line, sizeof line) && strstr(line, "silent:");
            if (seen_monitor) printf("monitor after %.1f s: %s\n", clock_mono_s() - t0, line);
        }
    }
    if (!seen_status) printf("last status:\n%s\n", st ? st : "(none)");
    if (!seen_monitor) printf("last monitor --once:\n%s\n", mo ? mo : "(none)");
    int bottleneck_ok = 0;
    if (seen_monitor && line_of(mo, "bottleneck: ", line, sizeof line)) {
        printf("%s\n", line);
        bottleneck_ok = strstr(line, "drafter0 is silent") && !strstr(line, "targets are the bottleneck");
    }
    free(st);
    free(mo);
    assert_int_equal(kill(pid, SIGCONT), 0);
    int code = pf_run_finish(&run, log, out, 240, NULL);
    assert_true(seen_status);
    assert_true(seen_monitor);
    assert_true(bottleneck_ok);
    assert_int_equal(code, 0);
    assert_int_equal(pf_count_lines(p), 60);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigstop_drafter_diagnosed),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
