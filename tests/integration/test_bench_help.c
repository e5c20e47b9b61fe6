/* bench/vs_pytorch.sh --help prints its header and exits 0 without touching anything; an
 * argument it does not know is refused with exit 2. Before, any argument was ignored and
 * `--help` ran the whole comparison (on CPU: a 16 GB Qwen3-8B-shaped mkmodel into /tmp/vs,
 * minutes). DL=/bin/false and PY=true keep a regression fast: it then fails on the work
 * dir it creates, not after minutes of work. */
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
#include <sys/wait.h>
#include <unistd.h>

static char root[] = "/tmp/dl_bench_helpXXXXXX";

/* Runs the script with ARG, output into root/out.txt; its exit status. */
static int run_script(const char *arg) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "W='%s/w' OUT='%s/o' DL=/bin/false PY=true timeout 30 bash bench/vs_pytorch.sh %s > '%s/out.txt' 2>&1",
             root, root, arg, root);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* root/out.txt's text (pf_slurp), valid until the next call */
static char *slurp_out(void) {
    static char *buf;
    char p[600];
    free(buf);
    snprintf(p, sizeof p, "%s/out.txt", root);
    buf = pf_slurp(p, NULL);
    assert_non_null(buf);
    return buf;
}

static int exists(const char *rel) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    return access(p, F_OK) == 0;
}

static void test_help(void **state) {
    (void)state;
    assert_int_equal(run_script("--help"), 0);
    const char *t = slurp_out();
    assert_non_null(strstr(t, "usage (repo root on the GPU machine"));
    assert_non_null(strstr(t, "draftline's window ends one step earlier"));
    assert_null(strstr(t, "#"));   /* the header without its comment marks */
    assert_false(exists("w"));
    assert_false(exists("o"));
    assert_int_equal(run_script("-h"), 0);
    assert_false(exists("w"));
}

static void test_unknown_argument(void **state) {
    (void)state;
    assert_int_equal(run_script("--steps 3"), 2);
    assert_non_null(strstr(slurp_out(), "no arguments (settings are environment variables"));
    assert_false(exists("w"));
}

int main(void) {
    proc_watchdog(90);
    if (!mkdtemp(root)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_unknown_argument),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) rc = rc ? rc : 1;
    return rc;
}
