/* `draftline run --target-precision fp8` on CPU (the exact fp32 emulation of the FP8
 * linears): the tiny Llama target of the pipeline fixture, 60 GSM8K samples, 1 target +
 * 1 drafter, 12 steps. The target logs its fp8 weights, every loss is finite and the loss
 * falls; the run's config reaches the target (the log line names the precision). A bad
 * value is refused with exit 2 before anything starts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_STEPS 12

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlfp8", 60) < 0) return -1;
    proc_watchdog(150);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

static int file_has(const char *dir, const char *needle) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "grep -rqF '%s' '%s'", needle, dir);
    return system(cmd) == 0;
}

static void test_fp8_target_trains(void **state) {
    (void)state;
    char out[400], log[380], sn[8], logs[500];
    snprintf(out, sizeof out, "%s/run", fx.root);
    snprintf(log, sizeof log, "%s/run.out", fx.root);
    snprintf(sn, sizeof sn, "%d", N_STEPS);
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    const char *argv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache,
                          "--device", "cpu", "--targets", "1", "--drafters", "1", "--threads", "1",
                          "--target-precision", "fp8",
                          "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                          "--drafter-layers", "1", "--lr", "1e-2", "--micro-batches-per-step", "2",
                          "--seed", "5", "--max-steps", sn, "--progress-every", "1", "--out", out, NULL};
    pf_set_argv(&a, argv);
    snprintf(a.log, sizeof a.log, "%s", log);
    char id[17];
    assert_int_equal(pf_run_draftline(&a, out, 120, id), 0);
    snprintf(logs, sizeof logs, "%s/logs", out);
    assert_true(file_has(logs, "target: fp8 (E4M3, per-channel scales)"));
    assert_true(file_has(logs, "of fp8 weights"));

    double loss[N_STEPS];
    int n = pf_step_losses(out, loss, N_STEPS);
    assert_int_equal(n, N_STEPS);
    for (int i = 0; i < n; i++) assert_true(isfinite(loss[i]));
    double first = (loss[0] + loss[1] + loss[2]) / 3, last = (loss[n - 1] + loss[n - 2] + loss[n - 3]) / 3;
    printf("  fp8 target: loss %.3f (first 3 steps) -> %.3f (last 3)\n", first, last);
    assert_true(last < first);
}

static void test_bad_precision_refused(void **state) {
    (void)state;
    char out[400], log[380];
    snprintf(out, sizeof out, "%s/bad", fx.root);
    snprintf(log, sizeof log, "%s/bad.out", fx.root);
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    const char *argv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache,
                          "--device", "cpu", "--target-precision", "int4", "--out", out, NULL};
    pf_set_argv(&a, argv);
    snprintf(a.log, sizeof a.log, "%s", log);
    char id[17];
    assert_int_equal(pf_run_draftline(&a, out, 30, id), 2);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "'int4': expected bf16 or fp8"));
    free(txt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_precision_refused),
        cmocka_unit_test(test_fp8_target_trains),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
