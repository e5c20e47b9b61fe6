/* common/base/ompwait (issue 15 item 8): the passive OpenMP wait policy is set
 * unless the user set one, a re-exec carries it into the new image, a failed exec
 * leaves the environment as it was; `draftline eval` on CPU runs its work with it
 * (libgomp's OMP_DISPLAY_ENV=verbose shows GOMP_SPINCOUNT '0' only when passive:
 * before, eval kept the default spin count 300000), and so do a run's stages
 * (before: the default). No timing is asserted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/ompwait.h"
#include "common/base/paths.h"

static void test_passive_env(void **state) {
    (void)state;
    unsetenv("OMP_WAIT_POLICY");
    assert_int_equal(ompwait_passive_env(), 1);
    assert_string_equal(getenv("OMP_WAIT_POLICY"), "passive");
    assert_int_equal(ompwait_passive_env(), 0);
    setenv("OMP_WAIT_POLICY", "active", 1); /* the user's choice wins */
    assert_int_equal(ompwait_passive_env(), 0);
    assert_string_equal(getenv("OMP_WAIT_POLICY"), "active");
    unsetenv("OMP_WAIT_POLICY");
}

/* Runs ompwait_reexec_passive(exe, sh -c 'printf %s "$OMP_WAIT_POLICY" > out') in a
 * child with the variable set to `have` (NULL: unset); returns what the child's
 * image wrote, or "returned:<rc>" when the call returned. */
static void reexec_in_child(const char *exe, const char *have, char *got, size_t cap) {
    char out[] = "/tmp/dl_ompwait_XXXXXX";
    int fd = mkstemp(out);
    assert_true(fd >= 0);
    close(fd);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (have) setenv("OMP_WAIT_POLICY", have, 1);
        else unsetenv("OMP_WAIT_POLICY");
        char script[256];
        snprintf(script, sizeof script, "printf %%s \"$OMP_WAIT_POLICY\" > %s", out);
        char *const argv[] = {"sh", "-c", script, NULL};
        int rc = ompwait_reexec_passive(exe, argv);
        FILE *f = fopen(out, "w");
        if (f) fprintf(f, "returned:%d:%s", rc, getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "unset");
        if (f) fclose(f);
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    FILE *f = fopen(out, "r");
    assert_non_null(f);
    size_t n = fread(got, 1, cap - 1, f);
    got[n] = 0;
    fclose(f);
    unlink(out);
}

static void test_reexec(void **state) {
    (void)state;
    char got[256];
    reexec_in_child("/bin/sh", NULL, got, sizeof got);
    assert_string_equal(got, "passive");               /* the new image has it */
    reexec_in_child("/bin/sh", "active", got, sizeof got);
    assert_string_equal(got, "returned:0:active");     /* set: no exec, untouched */
    reexec_in_child("/nonexistent/exe", NULL, got, sizeof got);
    char want[64];
    snprintf(want, sizeof want, "returned:%d:unset", DL_EIO); /* failed exec: as before */
    assert_string_equal(got, want);
}

/* `draftline eval --device cpu` started without OMP_WAIT_POLICY runs passive. */
static void test_eval_runs_passive(void **state) {
    (void)state;
    const char *bin = getenv("DL_BIN_DIR");
    char model[4096], data[4200], cmd[12000];
    if (!bin) { fprintf(stderr, "skip: DL_BIN_DIR not set (make test sets it)\n"); skip(); }
    if (paths_default_model(model, sizeof model) < 0 || access(model, R_OK) != 0) {
        fprintf(stderr, "skip: %s absent (run `make model`)\n", model);
        skip();
    }
    if (paths_shared_data(data, sizeof data) < 0) skip();
    strncat(data, "/gsm8k/train.jsonl", sizeof data - strlen(data) - 1);
    if (access(data, R_OK) != 0) { fprintf(stderr, "skip: %s absent\n", data); skip(); }
    char err[] = "/tmp/dl_ompwait_eval_XXXXXX";
    int fd = mkstemp(err);
    assert_true(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof cmd,
             "env -u OMP_WAIT_POLICY OMP_DISPLAY_ENV=verbose %s/draftline eval --drafter random --data %s "
             "--num-prompts 1 --max-new-tokens 2 --no-baseline --threads 1 >/dev/null 2>%s", bin, data, err);
    assert_int_equal(WEXITSTATUS(system(cmd)), 0);
    char buf[65536];
    FILE *f = fopen(err, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    unlink(err);
    /* libgomp prints its settings at load: the default first, then the re-executed image's */
    if (!strstr(buf, "GOMP_SPINCOUNT = '0'")) fail_msg("eval did not run passive:\n%s", buf);
}

/* Every child the supervisor starts (stages, eval child: sup__child_setup) runs
 * passive: the stage logs hold libgomp's settings (OMP_DISPLAY_ENV is inherited). */
static void test_run_stages_passive(void **state) {
    (void)state;
    const char *bin = getenv("DL_BIN_DIR");
    char model[4096], data[4200], cmd[12000], path[256];
    if (!bin) { fprintf(stderr, "skip: DL_BIN_DIR not set (make test sets it)\n"); skip(); }
    if (paths_default_model(model, sizeof model) < 0 || access(model, R_OK) != 0) {
        fprintf(stderr, "skip: %s absent (run `make model`)\n", model);
        skip();
    }
    if (paths_shared_data(data, sizeof data) < 0) skip();
    strncat(data, "/gsm8k/train.jsonl", sizeof data - strlen(data) - 1);
    if (access(data, R_OK) != 0) { fprintf(stderr, "skip: %s absent\n", data); skip(); }
    char dir[] = "/tmp/dl_ompwait_run_XXXXXX";
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd,
             "env -u OMP_WAIT_POLICY OMP_DISPLAY_ENV=verbose %s/draftline run --device cpu --targets 1 --drafters 1 "
             "--token-budget 512 --num-anchors 8 --data %s --prompt-field question --response-field answer "
             "--drafter-layers 1 --block-size 8 --max-steps 1 --seed 0 --out %s/run >%s/console 2>&1",
             bin, data, dir, dir);
    assert_int_equal(WEXITSTATUS(system(cmd)), 0);
    static const char *const logs[] = {"target0", "drafter0", "optimizer"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/run/logs/%s.log", dir, logs[i]);
        FILE *f = fopen(path, "r");
        if (!f) fail_msg("no %s", path);
        static char buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        if (!strstr(buf, "GOMP_SPINCOUNT = '0'")) fail_msg("%s did not run passive:\n%.2000s", logs[i], buf);
        assert_null(strstr(buf, "GOMP_SPINCOUNT = '300000'"));
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_passive_env),
        cmocka_unit_test(test_reexec),
        cmocka_unit_test(test_eval_runs_passive),
        cmocka_unit_test(test_run_stages_passive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
