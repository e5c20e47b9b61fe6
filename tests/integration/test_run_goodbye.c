/* Live processes are not declared dead (issue 15 item 7), on the tiny target of
 * test_pipeline and 60 GSM8K samples:
 *
 *  - `draftline stop` of a 2+2 CPU run: the stages and the supervisor close in order (bus
 *    goodbyes), so neither the console nor any out/logs/<stage>.log has a "dead" line, and
 *    the time from `draftline stop` to the supervisor's exit is printed;
 *  - a run whose every checkpoint write takes 4 s more (test hook optimizer.ckpt_delay_ms,
 *    longer than the 3 s heartbeat timeout; checkpoints every 2 steps and the final one):
 *    the optimizer's loop keeps heartbeating during the writes, so "peer 'optimizer' dead"
 *    appears nowhere, and the run ends with its final checkpoint (exit 0).
 * Every child has a hard timeout and is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/clock.h"
#include "common/pipe/ckpt.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlgb", 60) < 0) return -1;
    proc_watchdog(600);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* Prints and counts the lines of the file at path that contain needle. */
static int grep_file(const char *path, const char *needle) {
    size_t len;
    char *txt = pf_slurp(path, &len);
    if (!txt) return 0;
    int n = 0;
    for (char *l = txt, *e; l && *l; l = e ? e + 1 : NULL) {
        e = strchr(l, '\n');
        if (e) *e = 0;
        if (strstr(l, needle)) {
            printf("%s: %s\n", path, l);
            n++;
        }
    }
    free(txt);
    return n;
}

/* Lines with needle in the console log and in every out/logs/ file. */
static int grep_run(const char *console, const char *out, const char *needle) {
    int n = grep_file(console, needle);
    char d[600], p[1200];
    snprintf(d, sizeof d, "%s/logs", out);
    DIR *dir = opendir(d);
    assert_non_null(dir);
    for (struct dirent *e; (e = readdir(dir));) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", d, e->d_name);
        n += grep_file(p, needle);
    }
    closedir(dir);
    return n;
}

static void spawn_run(proc_t *p, pf_run_args_t *a, const char *out, const char *log, const char *max_steps,
                      const char *save_every) {
    memset(a, 0, sizeof *a);
    char *argv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--token-budget", "256",
                    "--block-size", "4", "--num-anchors", "8", "--targets", "2", "--drafters", "2",
                    "--max-steps", (char *)max_steps, "--save-every", (char *)save_every, "--out", (char *)out,
                    NULL};
    for (int i = 0; argv[i]; i++) a->argv[i] = argv[i];
    snprintf(a->log, sizeof a->log, "%s", log);
    assert_int_equal(proc_spawn(p, "draftline run", pf_run_child, a), 0);
}

/* `draftline stop` of a 2+2 CPU run: no "dead" line anywhere. */
static void test_stop_says_no_dead(void **state) {
    (void)state;
    static pf_run_args_t a;
    char out[400], log[600], p[600];
    snprintf(out, sizeof out, "%s/stop", fx.root);
    snprintf(log, sizeof log, "%s/stop.console", fx.root);
    proc_t run;
    spawn_run(&run, &a, out, log, "400", "0");
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    for (int i = 0; i < 6000 && pf_count_lines(p) < 5; i++) usleep(10000);
    assert_true(pf_count_lines(p) >= 5);
    static pf_run_args_t s;
    memset(&s, 0, sizeof s);
    char *sargv[] = {fx.exe, "stop", "--run", out, NULL};
    for (int i = 0; sargv[i]; i++) s.argv[i] = sargv[i];
    snprintf(s.log, sizeof s.log, "%s/stop.out", fx.root);
    double t0 = clock_mono_s();
    proc_t stop;
    assert_int_equal(proc_spawn(&stop, "draftline stop", pf_run_child, &s), 0);
    int code = -1;
    assert_int_equal(proc_wait(&stop, 60000, &code), 0);
    proc_kill(&stop);
    assert_int_equal(code, 0);
    code = pf_run_finish(&run, log, out, 60, NULL);
    double dt = clock_mono_s() - t0;
    printf("draftline stop -> supervisor exit: %.2f s\n", dt);
    assert_int_equal(code, 143);   /* stopped by SIGTERM (`draftline stop`) */
    char dir[4200];
    assert_int_equal(ckpt_resolve(out, dir, sizeof dir), 0);   /* the stop's checkpoint */
    assert_int_equal(grep_run(log, out, "dead"), 0);
}

/* Checkpoint writes 4 s slower than the heartbeat timeout: nobody calls the optimizer dead. */
static void test_slow_checkpoint_not_dead(void **state) {
    (void)state;
    static pf_run_args_t a;
    char out[400], log[600], p[700];
    snprintf(out, sizeof out, "%s/slow", fx.root);
    snprintf(log, sizeof log, "%s/slow.console", fx.root);
    setenv("DL_TEST_HOOKS", "optimizer.ckpt_delay_ms=4000", 1);
    proc_t run;
    spawn_run(&run, &a, out, log, "4", "2");
    unsetenv("DL_TEST_HOOKS");
    int code = pf_run_finish(&run, log, out, 240, NULL);
    assert_int_equal(code, 0);
    snprintf(p, sizeof p, "%s/checkpoints/step_4/state.bin", out);
    assert_int_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/checkpoints/step_2/state.bin", out);
    assert_int_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    assert_int_equal(pf_count_lines(p), 4);
    assert_true(grep_run(log, out, "checkpoint step") >= 2);   /* the hook was on: slow writes */
    assert_int_equal(grep_run(log, out, "peer 'optimizer' dead"), 0);
    assert_int_equal(grep_run(log, out, "optimizer silent"), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_says_no_dead),
        cmocka_unit_test(test_slow_checkpoint_not_dead),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
