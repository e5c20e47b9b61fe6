/* `draftline run --resume` remembers --target-precision (run.json "target_precision"), CPU
 * (the exact fp32 emulation of the FP8 linears), the tiny Llama target of the pipeline
 * fixture, 60 GSM8K samples, 1 target + 1 drafter:
 *
 *  - an fp8 run of 3 steps records "target_precision": "fp8" in run.json;
 *  - `run --resume OUT --max-steps 5` without the flag logs "target precision fp8, as
 *    recorded in OUT/run.json", its target loads fp8 weights again (target0.log: a second
 *    "of fp8 weights" line) and run.json still says fp8;
 *  - `run --resume OUT --max-steps 6 --target-precision bf16` is honoured (a "of bf16
 *    weights" load, run.json bf16) with a warning naming both precisions;
 *  - a run.json whose target_precision is not a string (hand-edited), and the checkpoint
 *    copied out of its run dir: --resume says its run.json settings are not taken / that
 *    the precision is bf16 for want of a run.json (before: not a word, the fp8 run went on
 *    in bf16 and with the default --target-model);
 *  - a run.json whose target_precision is "" (hand-edited): --resume says it is ignored
 *    and bf16 used (before: taken silently as bf16).
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

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlfp8r", 60) < 0) return -1;
    proc_watchdog(240);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* `draftline run` + extra (NULL-terminated), console into log; with_fixed: the tiny
 * target, data and settings first (a --resume takes them from the run instead) */
static int run_draftline(const char *log, int with_fixed, const char *const *extra) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    int n = 0;
    a.argv[n++] = fx.exe;
    a.argv[n++] = "run";
    const char *fixed[] = {"--target-model", fx.model_dir, "--data", fx.cache, "--token-budget", "256",
                           "--block-size", "4", "--num-anchors", "8", "--drafter-layers", "1",
                           "--lr", "1e-2", "--seed", "5", NULL};
    const char *always[] = {"--device", "cpu", "--targets", "1", "--drafters", "1", "--threads", "1",
                            "--progress-every", "1", NULL};
    for (int i = 0; with_fixed && fixed[i]; i++) a.argv[n++] = (char *)fixed[i];
    for (int i = 0; always[i]; i++) a.argv[n++] = (char *)always[i];
    for (int i = 0; extra[i]; i++) a.argv[n++] = (char *)extra[i];
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    return pf_run_draftline(&a, NULL, 100, NULL);
}

static void test_resume_keeps_fp8(void **state) {
    (void)state;
    char out[400], log1[500], log2[500], log3[500], rj[500], tlog[500], steps[500], want[600];
    snprintf(out, sizeof out, "%s/run", fx.root);
    snprintf(log1, sizeof log1, "%s/first.out", fx.root);
    snprintf(log2, sizeof log2, "%s/resume.out", fx.root);
    snprintf(log3, sizeof log3, "%s/bf16.out", fx.root);
    snprintf(rj, sizeof rj, "%s/run.json", out);
    snprintf(tlog, sizeof tlog, "%s/logs/target0.log", out);
    snprintf(steps, sizeof steps, "%s/steps.jsonl", out);

    const char *first[] = {"--target-precision", "fp8", "--max-steps", "3", "--out", out, NULL};
    assert_int_equal(run_draftline(log1, 1, first), 0);
    assert_int_equal(pf_count_in(rj, "\"target_precision\":\t\"fp8\""), 1);
    assert_int_equal(pf_count_in(tlog, "of fp8 weights"), 1);
    assert_int_equal(pf_count_lines(steps), 3);

    /* without the flag: the run's fp8, said on the console */
    const char *resume[] = {"--resume", out, "--max-steps", "5", NULL};
    assert_int_equal(run_draftline(log2, 0, resume), 0);
    snprintf(want, sizeof want, "target precision fp8, as recorded in %s/run.json", out);
    if (pf_count_in(log2, want) != 1) pf_show(log2);
    assert_int_equal(pf_count_in(log2, want), 1);
    assert_int_equal(pf_count_in(tlog, "of fp8 weights"), 2);
    assert_int_equal(pf_count_in(tlog, "of bf16 weights"), 0);
    assert_int_equal(pf_count_in(rj, "\"target_precision\":\t\"fp8\""), 1);
    assert_int_equal(pf_count_lines(steps), 5);

    /* an explicit other precision: used, and warned naming both */
    const char *other[] = {"--resume", out, "--max-steps", "6", "--target-precision", "bf16", NULL};
    assert_int_equal(run_draftline(log3, 0, other), 0);
    if (pf_count_in(log3, "--target-precision bf16 given, but the run trained with target precision fp8") != 1)
        pf_show(log3);
    assert_int_equal(pf_count_in(log3, "--target-precision bf16 given, but the run trained with target precision fp8"), 1);
    assert_int_equal(pf_count_in(log3, "as recorded in"), 0);
    assert_int_equal(pf_count_in(tlog, "of fp8 weights"), 2);
    assert_int_equal(pf_count_in(tlog, "of bf16 weights"), 1);
    assert_int_equal(pf_count_in(rj, "\"target_precision\":\t\"bf16\""), 1);
    assert_int_equal(pf_count_lines(steps), 6);
}

/* after test_resume_keeps_fp8 (its run dir, 6 steps): the resumes that cannot know the
 * run's precision say so; with the fixed flags given they still train */
static void test_resume_unknown_precision(void **state) {
    (void)state;
    char out[400], rj[500], log4[500], log5[500], lone[500], cmd[1200];
    snprintf(out, sizeof out, "%s/run", fx.root);
    snprintf(rj, sizeof rj, "%s/run.json", out);
    snprintf(log4, sizeof log4, "%s/badjson.out", fx.root);
    snprintf(log5, sizeof log5, "%s/lone.out", fx.root);
    snprintf(lone, sizeof lone, "%s/lone_ckpt", fx.root);
    size_t n;
    char *txt = pf_slurp(rj, &n);
    assert_non_null(txt);
    const char *was = "\"target_precision\":\t\"bf16\"";
    char *at = strstr(txt, was);
    assert_non_null(at);
    FILE *f = fopen(rj, "wb");
    assert_non_null(f);
    fprintf(f, "%.*s\"target_precision\": 8%s", (int)(at - txt), txt, at + strlen(was));
    assert_int_equal(fclose(f), 0);
    free(txt);
    const char *bad[] = {"--resume", out, "--max-steps", "7", NULL};
    assert_int_equal(run_draftline(log4, 1, bad), 0);
    if (pf_count_in(log4, "key 'target_precision': expected a string: the run's --target-model") != 1) pf_show(log4);
    assert_int_equal(pf_count_in(log4, "key 'target_precision': expected a string: the run's --target-model"), 1);

    snprintf(cmd, sizeof cmd, "cp -r '%s/checkpoints/step_7' '%s'", out, lone);
    assert_int_equal(system(cmd), 0);
    char out2[500];
    snprintf(out2, sizeof out2, "%s/run_lone", fx.root);
    const char *alone[] = {"--resume", lone, "--max-steps", "8", "--out", out2, NULL};
    assert_int_equal(run_draftline(log5, 1, alone), 0);
    if (pf_count_in(log5, "not in a run dir (no run.json): target precision bf16") != 1) pf_show(log5);
    assert_int_equal(pf_count_in(log5, "not in a run dir (no run.json): target precision bf16"), 1);
}

/* after test_resume_unknown_precision (the run dir at step 7): "target_precision": "" */
static void test_resume_empty_precision(void **state) {
    (void)state;
    char out[400], rj[500], log6[500];
    snprintf(out, sizeof out, "%s/run", fx.root);
    snprintf(rj, sizeof rj, "%s/run.json", out);
    snprintf(log6, sizeof log6, "%s/empty.out", fx.root);
    char *txt = pf_slurp(rj, NULL);
    assert_non_null(txt);
    const char *key = "\"target_precision\":\t\"";
    char *at = strstr(txt, key);
    assert_non_null(at);
    char *end = strchr(at + strlen(key), '"');
    assert_non_null(end);
    FILE *f = fopen(rj, "wb");
    assert_non_null(f);
    fprintf(f, "%.*s\"target_precision\": \"\"%s", (int)(at - txt), txt, end + 1);
    assert_int_equal(fclose(f), 0);
    free(txt);
    const char *args[] = {"--resume", out, "--max-steps", "8", NULL};
    assert_int_equal(run_draftline(log6, 1, args), 0);
    const char *want = "target_precision '' is neither bf16 nor fp8: ignored (bf16)";
    if (pf_count_in(log6, want) != 1) pf_show(log6);
    assert_int_equal(pf_count_in(log6, want), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_keeps_fp8),
        cmocka_unit_test(test_resume_unknown_precision),
        cmocka_unit_test(test_resume_empty_precision),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
