/* scripts/bundle.sh refuses a program older than a library it links (not rebuilt), on a
 * fake tree (copies of /bin/true as programs, empty .a files, mtimes set by touch):
 *  - every stale program is named, exit 1, and the previous bundle is left as it was
 *    (before: it was removed first, and the refusal left an empty or half-copied bundle);
 *  - bin/draftline older than build/libsupervisor.a is refused too (the Makefile links it
 *    there; before, only libdraftline.a was compared);
 *  - an up-to-date tree bundles (exit 0). */
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

static char root[] = "/tmp/dl_bundleXXXXXX";

static int sh(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* bundle.sh on the fake tree into root/bundle, output into root/out.txt; its exit status */
static int bundle(void) {
    return sh("BUILD='%s/build' BIN='%s/bin' BUNDLE='%s/bundle' timeout 60 bash scripts/bundle.sh "
              "> '%s/out.txt' 2>&1", root, root, root, root);
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

/* libraries at 2020-01-02, every program after them */
static void fresh_tree(void) {
    assert_int_equal(sh("cd '%s' && touch -d 2020-01-02 build/libdraftline.a build/libsupervisor.a && "
                        "touch -d 2020-01-03 bin/draftline bin/loader build/tests/test_x", root), 0);
}

static void test_stale_refused(void **state) {
    (void)state;
    assert_int_equal(sh("cd '%s' && mkdir -p build/tests bin && touch build/libdraftline.a "
                        "build/libsupervisor.a && for p in bin/draftline bin/loader build/tests/test_x; "
                        "do cp /bin/true $p; done", root), 0);
    fresh_tree();
    assert_int_equal(bundle(), 0);
    assert_true(exists("bundle/bin/draftline"));
    assert_true(exists("bundle/tests/test_x"));

    /* two programs older than libdraftline.a: both named, the bundle untouched */
    assert_int_equal(sh("touch '%s/bundle/marker' && touch -d 2020-01-01 '%s/bin/loader' "
                        "'%s/build/tests/test_x'", root, root, root), 0);
    assert_int_equal(bundle(), 1);
    const char *t = slurp_out();
    printf("%s", t);
    assert_non_null(strstr(t, "bin/loader is older than"));
    assert_non_null(strstr(t, "build/tests/test_x is older than"));
    assert_true(exists("bundle/marker"));
    assert_true(exists("bundle/bin/draftline"));

    /* bin/draftline older than libsupervisor.a alone */
    fresh_tree();
    assert_int_equal(sh("touch -d 2020-01-04 '%s/build/libsupervisor.a'", root), 0);
    assert_int_equal(bundle(), 1);
    t = slurp_out();
    printf("%s", t);
    assert_non_null(strstr(t, "bin/draftline is older than"));
    assert_non_null(strstr(t, "libsupervisor.a"));
    assert_null(strstr(t, "bin/loader is older"));
    assert_true(exists("bundle/marker"));
}

int main(void) {
    proc_watchdog(120);
    if (!mkdtemp(root)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stale_refused),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (sh("rm -rf '%s'", root) != 0) rc = rc ? rc : 1;
    return rc;
}
