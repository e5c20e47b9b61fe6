/* Checkpoints without stalls (issue 14 item 2, issue 15 item 7), on the tiny random target of
 * tests/support/pipeline_fixture and 60 GSM8K samples, 1 target + 1 drafter on CPU:
 *
 *  - every checkpoint write 4 s slower (longer than the loader's 2 s stall window) (test hook optimizer.ckpt_delay_ms): steps are
 *    applied WHILE an intermediate checkpoint is written (optimizer.log: "step 2 applied"
 *    before "checkpoint step 2 written"), the next checkpoint says it waited for the write,
 *    and steps.jsonl carries the checkpoints' times ("ckpt_step", "ckpt_write_s", ...);
 *  - the final checkpoint is complete (ckpt_verify) and bitwise equal to the one of the
 *    same --deterministic run without the delay;
 *  - no log line (console, any stage's log) says a live process is dead or silent, and
 *    the final step's micro-batch (7) is not re-issued while the final checkpoint is
 *    written (the loader's stall watchdog saw "nothing applied" there and sent it again);
 *  - the summary says steady and wall target tokens/s, the steady window and the final
 *    checkpoint's time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/pipe/ckpt.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlcko", 60) < 0) return -1;
    proc_watchdog(300);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* A --deterministic run of 8 steps, a checkpoint every 2, into fx.root/<name>. */
static void run8(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", fx.root, name);
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    const char *argv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                          "--threads", "1", "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                          "--drafter-layers", "1", "--lr", "3e-3", "--seed", "5", "--max-steps", "8",
                          "--save-every", "2", "--deterministic", "--progress-every", "1", "--out", out, NULL};
    pf_set_argv(&a, argv);
    snprintf(a.log, sizeof a.log, "%s/%s.out", fx.root, name);
    proc_t p;
    assert_int_equal(proc_spawn(&p, "draftline run", pf_run_child, &a), 0);
    char id[17];
    assert_int_equal(pf_run_finish(&p, a.log, out, 200, id), 0);
}

/* 1 when file path holds a line that says a peer is dead or silent (printed). */
static int says_dead(const char *path) {
    char *t = pf_slurp(path, NULL);
    int bad = 0;
    for (char *l = t; l && *l;) {
        char *nl = strchr(l, '\n');
        if (nl) *nl = 0;
        if (strstr(l, " dead") || strstr(l, "silent for")) {
            fprintf(stderr, "%s: %s\n", path, l);
            bad = 1;
        }
        l = nl ? nl + 1 : NULL;
    }
    free(t);
    return bad;
}

static void test_steps_go_on_while_writing(void **state) {
    (void)state;
    char slow[400], fast[400], p[700], q[1000];
    setenv("DL_TEST_HOOKS", "optimizer.ckpt_delay_ms=4000", 1);
    run8("slow", slow, sizeof slow);
    unsetenv("DL_TEST_HOOKS");
    run8("fast", fast, sizeof fast);

    /* steps applied while the checkpoint of step 2 was being written */
    snprintf(p, sizeof p, "%s/logs/optimizer.log", slow);
    char *olog = pf_slurp(p, NULL);
    assert_non_null(olog);
    char *w2 = strstr(olog, "checkpoint step 2 written");
    char *a2 = strstr(olog, "step 2 applied");
    assert_non_null(w2);
    assert_non_null(a2);
    assert_true(a2 < w2);
    assert_non_null(strstr(olog, "checkpoint step 4 waited "));
    free(olog);
    snprintf(p, sizeof p, "%s/steps.jsonl", slow);
    char *steps = pf_slurp(p, NULL);
    assert_non_null(steps);
    assert_non_null(strstr(steps, "\"ckpt_step\":2,"));
    assert_non_null(strstr(steps, "\"ckpt_step\":8,"));   /* the final one, on step 7's line */
    free(steps);

    /* the final checkpoint: complete, and the same bytes as without the delay */
    snprintf(p, sizeof p, "%s/checkpoints/step_8", slow);
    unsigned un = 99;
    assert_int_equal(ckpt_verify(p, &un), 0);
    assert_int_equal(un, 0);
    const char *files[] = {"state.bin", "model.safetensors", "cursor.bin", "config.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/checkpoints/step_8/%s", slow, files[i]);
        snprintf(q, sizeof q, "%s/checkpoints/step_8/%s", fast, files[i]);
        if (!pf_same_file(p, q)) fprintf(stderr, "%s differs from %s\n", p, q);
        assert_true(pf_same_file(p, q));
    }
    snprintf(p, sizeof p, "%s/checkpoints/step_8/model.d", slow);
    DIR *d = opendir(p);
    assert_null(d);   /* the model's subdir was moved up and removed */

    /* no live process declared dead, anywhere */
    int bad = 0;
    snprintf(p, sizeof p, "%s/slow.out", fx.root);
    bad |= says_dead(p);
    snprintf(p, sizeof p, "%s/logs", slow);
    d = opendir(p);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".log")) continue;
        snprintf(q, sizeof q, "%s/%s", p, e->d_name);
        bad |= says_dead(q);
    }
    closedir(d);
    assert_false(bad);
    snprintf(p, sizeof p, "%s/logs/loader.log", slow);
    char *llog = pf_slurp(p, NULL);
    assert_non_null(llog);
    if (strstr(llog, "re-issued micro-batch 7 ")) fprintf(stderr, "%s", llog);
    assert_null(strstr(llog, "re-issued micro-batch 7 "));
    free(llog);

    /* the summary: steady over steps 2..6, wall over the whole run, the final checkpoint */
    snprintf(p, sizeof p, "%s/slow.out", fx.root);
    char *con = pf_slurp(p, NULL);
    assert_non_null(con);
    char *s = strstr(con, "summary: 8 steps");
    assert_non_null(s);
    fprintf(stderr, "%.*s\n", (int)strcspn(s, "\n"), s);
    double steady = 0, wall = 0, secs = 0, up = 0, ck = 0;
    char *x = strstr(s, "steady ");
    assert_non_null(x);
    assert_int_equal(sscanf(x, "steady %lf target tokens/s (steps 2..6)", &steady), 1);
    assert_non_null(strstr(x, "(steps 2..6)"));
    x = strstr(s, "wall ");
    assert_non_null(x);
    assert_int_equal(sscanf(x, "wall %lf target tokens/s over %lf s (start-up %lf s to step 0, final checkpoint %lf s)",
                            &wall, &secs, &up, &ck), 4);
    free(con);
    assert_true(steady > 0 && wall > 0 && steady > wall);
    assert_true(up > 0 && up < secs);
    assert_true(ck >= 4.0 && ck < secs);   /* the final write, with its 4 s delay */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steps_go_on_while_writing),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
