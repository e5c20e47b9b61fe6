/* `draftline run --keep-checkpoints N` (checkpoint retention, like HF Trainer's
 * save_total_limit) on the tiny random Llama-shaped target of test_pipeline and 60 GSM8K
 * samples, CPU:
 *
 *  - --save-every 1 --max-steps 5 --keep-checkpoints 2 ends with exactly step_4 and step_5
 *    under checkpoints/ (besides `latest`, which names step_5); run.json records
 *    "keep_checkpoints": 2; things in checkpoints/ that are not this run's checkpoints (a
 *    dir step_1x, a dir step_8 with a foreign file, a link step_9) are not touched;
 *  - `run --resume OUT --max-steps 7` without the flag takes --keep-checkpoints 2 from
 *    run.json (listed in the "taken" line) and ends with exactly step_6 and step_7, latest
 *    step_7, steps.jsonl 0..6;
 *  - `run --resume OUT/checkpoints/step_6 --max-steps 7 --keep-checkpoints 1` names the newer
 *    step_7 on the console (a stray dir is not counted) and ends with its own step_7 only;
 *  - --keep-checkpoints -1 / abc, and the YAML key keep_checkpoints: abc, are refused
 *    (exit 2) naming --keep-checkpoints.
 * Every child has a hard timeout and is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlkc", 60) < 0) return -1;
    proc_watchdog(120);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* `draftline run` + args (NULL-terminated); with_fixed: the tiny target, data and settings
 * first (a --resume takes them from the run instead) */
static void run_argv(pf_run_args_t *a, const char *log, int with_fixed, const char *const *extra) {
    memset(a, 0, sizeof *a);
    int n = 0;
    a->argv[n++] = fx.exe;
    a->argv[n++] = "run";
    const char *fixed[] = {"--target-model", fx.model_dir, "--data", fx.cache, "--token-budget", "256",
                           "--block-size", "4", "--num-anchors", "8", "--drafter-layers", "1",
                           "--lr", "3e-3", "--seed", "5", NULL};
    const char *always[] = {"--device", "cpu", "--progress-every", "1", "--threads", "1", NULL};
    for (int i = 0; with_fixed && fixed[i]; i++) a->argv[n++] = (char *)fixed[i];
    for (int i = 0; always[i]; i++) a->argv[n++] = (char *)always[i];
    for (int i = 0; extra[i]; i++) a->argv[n++] = (char *)extra[i];
    a->argv[n] = NULL;
    snprintf(a->log, sizeof a->log, "%s", log);
}

/* The entries of dir, sorted, joined by ' ' into out (cap bytes). */
static void list_dir(const char *dir, char *out, size_t cap) {
    char names[64][256];
    int n = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        strncat(out, i ? " " : "", cap - strlen(out) - 1);
        strncat(out, names[i], cap - strlen(out) - 1);
    }
}

static void expect_latest(const char *out, const char *want) {
    char p[600];
    snprintf(p, sizeof p, "%s/checkpoints/latest", out);
    char *txt = pf_slurp(p, NULL);
    assert_non_null(txt);
    txt[strcspn(txt, "\n")] = 0;
    assert_string_equal(txt, want);
    free(txt);
}

static void test_keep_two_and_resume(void **state) {
    (void)state;
    char out[400], log[500], p[600], ls[1024];
    snprintf(out, sizeof out, "%s/keep", fx.root);
    snprintf(log, sizeof log, "%s/keep.out", fx.root);
    /* someone else's things in checkpoints/, never counted nor removed: a dir that is not
     * step_<digits>, a step_8 dir with a foreign file, a link step_9 to it */
    assert_int_equal(mkdir(out, 0700), 0);
    snprintf(p, sizeof p, "%s/checkpoints/step_1x", out);
    assert_int_equal(paths_mkdir_p(p, 0755), 0);
    snprintf(p, sizeof p, "%s/checkpoints/step_8", out);
    assert_int_equal(paths_mkdir_p(p, 0755), 0);
    snprintf(p, sizeof p, "%s/checkpoints/step_8/notes.txt", out);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("not a checkpoint\n", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/checkpoints/step_9", out);
    assert_int_equal(symlink("step_8", p), 0);
    static pf_run_args_t a;
    {
        const char *extra[] = {"--out", out, "--max-steps", "5", "--save-every", "1", "--keep-checkpoints", "2", NULL};
        run_argv(&a, log, 1, extra);
        int code = pf_run_draftline(&a, NULL, 60, NULL);
        char *txt = pf_slurp(log, NULL);
        if (code != 0) fprintf(stderr, "%s\n", txt);
        free(txt);
        assert_int_equal(code, 0);
    }
    snprintf(p, sizeof p, "%s/checkpoints", out);
    list_dir(p, ls, sizeof ls);
    assert_string_equal(ls, "latest step_1x step_4 step_5 step_8 step_9");
    expect_latest(out, "step_5");
    snprintf(p, sizeof p, "%s/run.json", out);
    char *rj = pf_slurp(p, NULL);
    assert_non_null(rj);
    assert_non_null(strstr(rj, "\"keep_checkpoints\":\t2"));
    free(rj);
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    assert_int_equal(pf_count_lines(p), 5);
    {   /* resume without the flag: the run's --keep-checkpoints 2 (run.json) */
        const char *extra[] = {"--resume", out, "--max-steps", "7", NULL};
        run_argv(&a, log, 0, extra);
        int code = pf_run_draftline(&a, NULL, 60, NULL);
        char *txt = pf_slurp(log, NULL);
        if (code != 0) fprintf(stderr, "%s\n", txt);
        assert_int_equal(code, 0);
        assert_non_null(strstr(txt, " --keep-checkpoints 2"));
        free(txt);
    }
    snprintf(p, sizeof p, "%s/checkpoints", out);
    list_dir(p, ls, sizeof ls);
    assert_string_equal(ls, "latest step_1x step_6 step_7 step_8 step_9");
    expect_latest(out, "step_7");
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    assert_int_equal(pf_count_lines(p), 7);
    {   /* resumed from the older step_6: the console names the newer step_7 (the stray
         * step_8 / step_9 are not checkpoints); the run's own step_7 replaces it */
        char ck[500];
        snprintf(ck, sizeof ck, "%s/checkpoints/step_6", out);
        const char *extra[] = {"--resume", ck, "--max-steps", "7", "--keep-checkpoints", "1", NULL};
        run_argv(&a, log, 0, extra);
        int code = pf_run_draftline(&a, NULL, 60, NULL);
        char *txt = pf_slurp(log, NULL);
        if (code != 0) fprintf(stderr, "%s\n", txt);
        assert_int_equal(code, 0);
        assert_non_null(strstr(txt, "step 6 is behind 1 newer checkpoint(s)"));
        assert_non_null(strstr(txt, "(up to step_7)"));
        free(txt);
    }
    snprintf(p, sizeof p, "%s/checkpoints", out);
    list_dir(p, ls, sizeof ls);
    assert_string_equal(ls, "latest step_1x step_7 step_8 step_9");
    expect_latest(out, "step_7");
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    assert_int_equal(pf_count_lines(p), 7);
}

static void test_refused(void **state) {
    (void)state;
    char out[400], log[500], cfg[500];
    snprintf(out, sizeof out, "%s/refused", fx.root);
    snprintf(log, sizeof log, "%s/refused.out", fx.root);
    snprintf(cfg, sizeof cfg, "%s/keep.yaml", fx.root);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fputs("max-steps: 2\nkeep_checkpoints: abc\n", f);
    fclose(f);
    static pf_run_args_t a;
    const char *bad[][2] = {{"--keep-checkpoints", "-1"}, {"--keep-checkpoints", "abc"}, {"--config", cfg}};
    for (int i = 0; i < 3; i++) {
        const char *extra[] = {"--out", out, "--max-steps", "2", bad[i][0], bad[i][1], NULL};
        run_argv(&a, log, 1, extra);
        assert_int_equal(pf_run_draftline(&a, NULL, 30, NULL), 2);
        char *txt = pf_slurp(log, NULL);
        if (!strstr(txt, "--keep-checkpoints")) fprintf(stderr, "%s\n", txt);
        assert_non_null(strstr(txt, "--keep-checkpoints"));
        free(txt);
        char p[600];
        snprintf(p, sizeof p, "%s/steps.jsonl", out);
        assert_int_equal(pf_count_lines(p), 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keep_two_and_resume),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
