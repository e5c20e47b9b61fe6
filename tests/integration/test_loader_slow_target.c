/* A target slower than the loader's stall floor does not livelock the loader (issue 15
 * item 16), on the tiny target of test_pipeline and 60 GSM8K samples, every forward made
 * 2.5 s longer by the test hook target.forward_delay_ms (the loader's watchdog floor is 2 s):
 *
 *  - 1 target + 1 drafter, --micro-batches-per-step 2, 3 steps: the run ends (exit 0, 3
 *    steps), and no micro-batch is re-issued more than once (the old loader re-issued a
 *    step's first micro-batch every 2 s, before new work, and never sent the second);
 *  - a 2+2 run of 2 steps resumed as 1+1 with the slow target up to step 4: the same.
 * Every child has a hard timeout and is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SLOW_HOOK "target.forward_delay_ms=2500"

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlst", 60) < 0) return -1;
    proc_watchdog(560);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* `draftline run` + the tiny settings + extra (NULL-terminated) into out, to the end (at
 * most timeout_s), with DL_TEST_HOOKS=hooks when hooks is not NULL. Returns the exit code. */
static int run(const char *out, const char *log, const char *hooks, const char *const *extra, int timeout_s) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    int n = 0;
    a.argv[n++] = fx.exe;
    a.argv[n++] = "run";
    const char *fixed[] = {"--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                           "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                           "--drafter-layers", "1", "--threads", "1", "--micro-batches-per-step", "2",
                           "--out", out, NULL};
    for (int i = 0; fixed[i]; i++) a.argv[n++] = (char *)fixed[i];
    for (int i = 0; extra[i]; i++) a.argv[n++] = (char *)extra[i];
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    if (hooks) setenv("DL_TEST_HOOKS", hooks, 1);
    int code = pf_run_draftline(&a, out, timeout_s, NULL);
    unsetenv("DL_TEST_HOOKS");
    if (code != 0) {
        char *t = pf_slurp(log, NULL);
        fprintf(stderr, "exit %d\n%s\n", code, t ? t : "");
        free(t);
    }
    return code;
}

/* The most times one micro-batch was re-issued, from out/logs/loader.log ("re-issued
 * micro-batch N to ..."); *total gets the number of re-issues. */
static int max_reissues_of_one(const char *out, int *total) {
    char p[600];
    snprintf(p, sizeof p, "%s/logs/loader.log", out);
    char *txt = pf_slurp(p, NULL);
    assert_non_null(txt);
    int count[4096] = {0}, most = 0;
    *total = 0;
    for (const char *s = strstr(txt, "re-issued micro-batch "); s; s = strstr(s + 1, "re-issued micro-batch ")) {
        long mb = strtol(s + strlen("re-issued micro-batch "), NULL, 10);
        (*total)++;
        if (mb >= 0 && mb < 4096 && ++count[mb] > most) most = count[mb];
    }
    free(txt);
    return most;
}

static void expect_steps(const char *out, int want) {
    char p[600];
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    assert_int_equal(pf_count_lines(p), want);
}

/* 1 slow target, 2 micro-batches per step: steps advance, no repeated re-issue. */
static void test_slow_target_no_livelock(void **state) {
    (void)state;
    char out[400], log[500];
    snprintf(out, sizeof out, "%s/slow", fx.root);
    snprintf(log, sizeof log, "%s/slow.console", fx.root);
    const char *extra[] = {"--targets", "1", "--drafters", "1", "--max-steps", "3", NULL};
    assert_int_equal(run(out, log, SLOW_HOOK, extra, 200), 0);
    expect_steps(out, 3);
    int total, most = max_reissues_of_one(out, &total);
    printf("re-issues: %d (at most %d of one micro-batch)\n", total, most);
    assert_true(most <= 1);
}

/* A 2+2 run's checkpoint at step 2 resumed as 1+1 with the slow target, to step 4. */
static void test_resume_2x2_as_1x1_slow(void **state) {
    (void)state;
    char out[400], log[500];
    snprintf(out, sizeof out, "%s/resume", fx.root);
    snprintf(log, sizeof log, "%s/resume2x2.console", fx.root);
    const char *first[] = {"--targets", "2", "--drafters", "2", "--max-steps", "2", NULL};
    assert_int_equal(run(out, log, NULL, first, 120), 0);
    snprintf(log, sizeof log, "%s/resume1x1.console", fx.root);
    const char *second[] = {"--targets", "1", "--drafters", "1", "--max-steps", "4", "--resume", out, NULL};
    assert_int_equal(run(out, log, SLOW_HOOK, second, 200), 0);
    expect_steps(out, 4);
    int total, most = max_reissues_of_one(out, &total);
    printf("re-issues: %d (at most %d of one micro-batch)\n", total, most);
    assert_true(most <= 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slow_target_no_livelock),
        cmocka_unit_test(test_resume_2x2_as_1x1_slow),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
