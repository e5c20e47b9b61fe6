/* What a user sees of `draftline run` and its companions (issue 15, items 12 and 15), on
 * the tiny random target of tests/support/pipeline_fixture and 60 GSM8K samples:
 *
 *  - the console counts steps as steps.jsonl does (from 0: "step 5 done (6 of 6)"), prints
 *    the last step's line, shows lr and grad norm, and while no step comes (checkpoint
 *    writes slowed by the test hook optimizer.ckpt_delay_ms) says "waiting for step N"
 *    instead of repeating one line; no two progress lines say the same;
 *  - `t` in steps.jsonl goes on across a `run --resume` (never goes back);
 *  - an optimizer killed with SIGKILL: the console says it restarted and from which step,
 *    and steps.jsonl's t does not go back;
 *  - every applied step's scalars are in <out>/tb/ (TensorBoard event files: the run's
 *    and its resume's, 9 "loss" values);
 *  - `inspect RUN_DIR` shows the run's latest checkpoint (as `eval --drafter RUN_DIR`);
 *  - a missing --data does not create --out;
 *  - more drafters than targets: `run` names the idle drafters ("drafter1", not
 *    "drafter1..1"), `rebalance` warns too;
 *  - a corrupt safetensors header's error message carries no raw control bytes;
 *  - `draftline prepare` says how far it is (test hook prepare.progress_ms: every chunk). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/format/safetensors.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlcon", 60) < 0) return -1;
    proc_watchdog(400);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* Runs `draftline args...` (NULL-terminated) with its output into log; its exit code. */
static int tool(const char *log, int timeout_s, const char *const *args) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    int n = 0;
    a.argv[n++] = fx.exe;
    for (int i = 0; args[i]; i++) a.argv[n++] = (char *)args[i];
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    return pf_run_draftline(&a, NULL, timeout_s, NULL);
}

/* `draftline run` on the tiny fixture with extra args (at most 16). */
static int run_tiny(const char *log, const char *const *extra, int timeout_s) {
    const char *args[64] = {"run", "--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                            "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                            "--drafter-layers", "1", "--lr", "3e-3", "--seed", "5", "--progress-every", "1",
                            "--threads", "1"};
    int n = 0;
    while (args[n]) n++;
    for (int i = 0; extra[i] && i < 16; i++) args[n++] = extra[i];
    args[n] = NULL;
    return tool(log, timeout_s, args);
}

/* The "t" of every line of steps.jsonl at path into t[cap]; how many. */
static int steps_t(const char *path, double *t, int cap) {
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0;
    while (f && n < cap && fgets(line, sizeof line, f)) {
        const char *k = strstr(line, "\"t\":");
        t[n++] = k ? atof(k + 4) : NAN;
    }
    if (f) fclose(f);
    return n;
}

/* How many Summary values tagged "loss" the event files in dir/tb hold. */
static int tb_losses(const char *dir) {
    char tb[600];
    snprintf(tb, sizeof tb, "%s/tb", dir);
    DIR *d = opendir(tb);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (strncmp(de->d_name, "events.out.tfevents.", 20)) continue;
        char p[1000];
        snprintf(p, sizeof p, "%s/%s", tb, de->d_name);
        size_t len = 0;
        char *b = pf_slurp(p, &len);
        for (size_t i = 0; b && i + 7 <= len; i++) n += !memcmp(b + i, "\x0a\x04loss\x15", 7);
        free(b);
    }
    if (d) closedir(d);
    return n;
}

static void test_progress_and_resume(void **state) {
    (void)state;
    char out[400], log[500], steps[600];
    snprintf(out, sizeof out, "%s/prog", fx.root);
    snprintf(log, sizeof log, "%s/prog.out", fx.root);
    snprintf(steps, sizeof steps, "%s/steps.jsonl", out);
    /* each checkpoint write 3 s slower: seconds with no step */
    setenv("DL_TEST_HOOKS", "optimizer.ckpt_delay_ms=3000", 1);
    const char *extra[] = {"--out", out, "--max-steps", "6", "--save-every", "2", NULL};
    int code = run_tiny(log, extra, 180);
    unsetenv("DL_TEST_HOOKS");
    assert_int_equal(code, 0);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    fprintf(stderr, "%s", txt);   /* the console as a user sees it */
    assert_non_null(strstr(txt, "] step 5 done (6 of 6)"));   /* the last step's line */
    assert_null(strstr(txt, "step 6 "));
    assert_non_null(strstr(txt, "  lr "));
    assert_non_null(strstr(txt, "  |g| "));
    assert_non_null(strstr(txt, "] waiting for step "));
    /* no progress line says what the one before it said (the time stamp aside) */
    char prev[1024] = "";
    int progress = 0;
    for (char *l = txt; l && *l;) {
        char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        if (l[0] == '[' && len < sizeof prev) {
            const char *b = memchr(l, ']', len);
            if (b) {
                char cur[1024];
                snprintf(cur, sizeof cur, "%.*s", (int)(len - (size_t)(b - l)), b);
                if (!strcmp(cur, prev)) fprintf(stderr, "repeated progress line: %s\n", cur);
                assert_string_not_equal(cur, prev);
                snprintf(prev, sizeof prev, "%s", cur);
                progress++;
            }
        }
        l = nl ? nl + 1 : NULL;
    }
    /* the intermediate writes no longer hold the steps (they go on during a write): only a
     * checkpoint waiting for the previous write and the final one leave seconds without one */
    fprintf(stderr, "%d progress lines\n", progress);
    assert_true(progress >= 5);
    free(txt);
    /* inspect RUN_DIR: its latest checkpoint */
    char ilog[500];
    snprintf(ilog, sizeof ilog, "%s/inspect.out", fx.root);
    const char *ins[] = {"inspect", out, NULL};
    assert_int_equal(tool(ilog, 30, ins), 0);
    txt = pf_slurp(ilog, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "step_6"));
    assert_non_null(strstr(txt, "DFlash drafter checkpoint"));
    free(txt);
    /* t goes on across a resume */
    double t[64];
    assert_int_equal(steps_t(steps, t, 64), 6);
    const char *res[] = {"--resume", out, "--max-steps", "9", NULL};
    char rlog[500];
    snprintf(rlog, sizeof rlog, "%s/prog-resume.out", fx.root);
    assert_int_equal(run_tiny(rlog, res, 180), 0);
    assert_int_equal(steps_t(steps, t, 64), 9);
    for (int i = 1; i < 9; i++) {
        if (!(t[i] >= t[i - 1])) fprintf(stderr, "steps.jsonl t of step %d: %.3f after %.3f\n", i, t[i], t[i - 1]);
        assert_true(t[i] >= t[i - 1]);
    }
    txt = pf_slurp(rlog, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "] step 8 done (9 of 9)"));
    free(txt);
    assert_int_equal(tb_losses(out), 9);
}

/* A --data that does not exist: refused before --out is created. */
static void test_missing_data_no_out(void **state) {
    (void)state;
    char out[400], log[500], data[400];
    snprintf(out, sizeof out, "%s/nodata", fx.root);
    snprintf(log, sizeof log, "%s/nodata.out", fx.root);
    snprintf(data, sizeof data, "%s/no-such.jsonl", fx.root);
    const char *args[] = {"run", "--target-model", fx.model_dir, "--data", data, "--device", "cpu", "--out", out, NULL};
    assert_int_equal(tool(log, 30, args), 2);
    struct stat sb;
    assert_int_not_equal(stat(out, &sb), 0);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "no-such.jsonl"));
    free(txt);
}

/* More drafters than targets: both commands name the idle ones. */
static void test_idle_drafters_said(void **state) {
    (void)state;
    char out[400], log[500];
    snprintf(out, sizeof out, "%s/idle", fx.root);
    snprintf(log, sizeof log, "%s/idle.out", fx.root);
    /* --inbox-gb 0 is refused after the warning, before anything is written */
    const char *extra[] = {"--out", out, "--targets", "1", "--drafters", "2", "--inbox-gb", "0", NULL};
    assert_int_equal(run_tiny(log, extra, 30), 2);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "so drafter1 gets no input and sits idle"));
    assert_null(strstr(txt, ".."));
    free(txt);
    const char *rb[] = {"rebalance", "--run", out, "--targets", "1", "--drafters", "3", "--wait", "0", NULL};
    assert_int_equal(tool(log, 30, rb), 1);   /* no run there */
    txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "drafters 1 to 2 get no input and sit idle"));
    free(txt);
}

/* A corrupt header: the message escapes the bytes of names and dtypes. */
static void test_safetensors_error_printable(void **state) {
    (void)state;
    char p[400];
    snprintf(p, sizeof p, "%s/bad.safetensors", fx.root);
    const char h[] = "{\"a\x01\xff\x1b[31mb\":{\"dtype\":\"F\x1b\x07\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    uint64_t hl = sizeof h - 1;
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(&hl, 8, 1, f), 1);
    assert_int_equal(fwrite(h, 1, hl, f), hl);
    assert_int_equal(fwrite("\0\0\0\0", 1, 4, f), 4);
    fclose(f);
    safetensors_t *st = NULL;
    assert_int_equal(safetensors_open(p, &st), DL_EFORMAT);
    const char *m = dl_errmsg();
    for (const unsigned char *c = (const unsigned char *)m; *c; c++) assert_true(*c >= 0x20 && *c < 0x7f);
    assert_non_null(strstr(m, "a\\x01\\xff\\x1b[31mb"));
    assert_non_null(strstr(m, "F\\x1b\\x07"));
}

/* The pid run.json gives stage `stage`, or 0. */
static pid_t stage_pid(const char *out, const char *stage) {
    char p[500];
    snprintf(p, sizeof p, "%s/run.json", out);
    char *txt = pf_slurp(p, NULL);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    pid_t pid = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "stages")) {
        const cJSON *n = cJSON_GetObjectItem(e, "name"), *q = cJSON_GetObjectItem(e, "pid");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, stage) && cJSON_IsNumber(q)) pid = (pid_t)q->valuedouble;
    }
    cJSON_Delete(j);
    return pid;
}

/* kill -9 of the optimizer after 4 steps (no checkpoint yet: it starts again at step 0). */
static void test_optimizer_restart_said(void **state) {
    (void)state;
    char out[300], log[380], steps[600];
    snprintf(out, sizeof out, "%s/optkill", fx.root);
    snprintf(log, sizeof log, "%s/optkill.out", fx.root);
    snprintf(steps, sizeof steps, "%s/steps.jsonl", out);
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    const char *args[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                          "--token-budget", "256", "--block-size", "4", "--num-anchors", "8", "--drafter-layers", "1",
                          "--seed", "5", "--progress-every", "1", "--threads", "1", "--out", out, "--max-steps", "10",
                          NULL};
    for (int i = 0; args[i]; i++) a.argv[i] = (char *)args[i];
    snprintf(a.log, sizeof a.log, "%s", log);
    proc_t run;
    assert_int_equal(proc_spawn(&run, "draftline run", pf_run_child, &a), 0);
    for (int i = 0; i < 9000 && pf_count_lines(steps) < 4; i++) usleep(10000);
    assert_true(pf_count_lines(steps) >= 4);
    pid_t pid = stage_pid(out, "optimizer");
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(pf_run_finish(&run, log, out, 180, NULL), 0);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    fprintf(stderr, "%s", txt);
    assert_non_null(strstr(txt, "] optimizer restarted from step 0 (steps 0 to "));
    assert_non_null(strstr(txt, "] step 9 done (10 of 10)"));
    free(txt);
    double t[64];
    int n = steps_t(steps, t, 64);
    assert_int_equal(n, 10);
    for (int i = 1; i < n; i++) assert_true(t[i] >= t[i - 1]);
}

/* prepare's progress line, in a file: bytes, lines, rate. */
static void test_prepare_progress(void **state) {
    (void)state;
    char data[400], out[400], log[500];
    snprintf(data, sizeof data, "%s/gsm8k60.jsonl", fx.root);
    snprintf(out, sizeof out, "%s/prep.dlc", fx.root);
    snprintf(log, sizeof log, "%s/prep.out", fx.root);
    const char *args[] = {"prepare", "--data", data, "--out", out, "--format", "fields", "--prompt-field",
                          "question", "--response-field", "answer", "--threads", "1", NULL};
    setenv("DL_TEST_HOOKS", "prepare.progress_ms=0", 1);
    int code = tool(log, 60, args);
    unsetenv("DL_TEST_HOOKS");
    assert_int_equal(code, 0);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    fprintf(stderr, "%s", txt);
    assert_non_null(strstr(txt, "prepare: "));
    assert_non_null(strstr(txt, " MB read (100%), 60 lines, "));
    assert_non_null(strstr(txt, " MB/s, "));
    assert_null(strstr(txt, "\r"));   /* not a terminal: plain lines */
    free(txt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_error_printable),
        cmocka_unit_test(test_missing_data_no_out),
        cmocka_unit_test(test_idle_drafters_said),
        cmocka_unit_test(test_prepare_progress),
        cmocka_unit_test(test_optimizer_restart_said),
        cmocka_unit_test(test_progress_and_resume),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
