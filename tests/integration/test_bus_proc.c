/* tests/support/proc (the fork-with-timeout helper every multi-process test uses): exit codes,
 * deaths by signal, report pipe, exec'd children, time-outs that kill the whole process group,
 * and the watchdog that kills children and exits 124. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/base/clock.h"
#include "common/base/err.h"
#include "tests/support/proc.h"

/* 1 if pid is gone or a zombie (killed, waiting for whoever adopted it to reap it). */
static int pid_dead(pid_t pid) {
    for (int i = 0; i < 200; i++) {    /* up to 1 s for the kernel to finish the kill */
        if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
        char path[64], buf[256];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = 0;
            char *p = strrchr(buf, ')');
            if (p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X')) return 1;
        }
        usleep(5000);
    }
    return 0;
}

static int exit7(void *arg, int fd) { return 7; }
static int term_self(void *arg, int fd) { kill(getpid(), SIGTERM); pause(); return 0; }
static int say_hi(void *arg, int fd) { return proc_report(fd, "hi", 2) == 0 ? 0 : 1; }
static int silent(void *arg, int fd) { return 0; }

/* Forks a grandchild that sleeps, reports its pid, then sleeps itself. */
static int sleeper_with_grandchild(void *arg, int fd) {
    pid_t g = fork();
    if (g == 0) { for (;;) pause(); }
    proc_report(fd, &g, sizeof g);
    for (;;) pause();
    return 0;
}

static void test_exit_codes(void **state) {
    (void)state;
    proc_t p;
    int code;
    assert_int_equal(proc_spawn(&p, "exit7", exit7, NULL), 0);
    assert_int_equal(proc_wait(&p, 5000, &code), 0);
    assert_int_equal(code, 7);
    proc_kill(&p);

    assert_int_equal(proc_spawn(&p, "term", term_self, NULL), 0);
    assert_int_equal(proc_wait(&p, 5000, &code), 0);
    assert_int_equal(code, 128 + SIGTERM);
    proc_kill(&p);
}

static void test_report_pipe(void **state) {
    (void)state;
    proc_t p;
    char buf[3] = {0};
    int code;
    assert_int_equal(proc_spawn(&p, "hi", say_hi, NULL), 0);
    assert_int_equal(proc_wait(&p, 5000, &code), 0);    /* the pipe outlives the child */
    assert_int_equal(code, 0);
    assert_int_equal(proc_read(&p, buf, 2, 1000), 0);
    assert_string_equal(buf, "hi");
    proc_kill(&p);

    assert_int_equal(proc_spawn(&p, "silent", silent, NULL), 0);
    assert_int_equal(proc_read(&p, buf, 1, 5000), DL_ECLOSED);
    proc_wait(&p, 5000, &code);
    proc_kill(&p);

    char *argv[] = {"sh", "-c", "printf ok >&$DL_REPORT_FD; exit 3", NULL};
    assert_int_equal(proc_spawn_exec(&p, "sh", "/bin/sh", argv), 0);
    assert_int_equal(proc_read(&p, buf, 2, 5000), 0);
    assert_int_equal(memcmp(buf, "ok", 2), 0);
    assert_int_equal(proc_wait(&p, 5000, &code), 0);
    assert_int_equal(code, 3);
    proc_kill(&p);

    char *bad[] = {"nope", NULL};
    assert_int_equal(proc_spawn_exec(&p, "nope", "/nonexistent/nope", bad), 0);
    assert_int_equal(proc_wait(&p, 5000, &code), 0);
    assert_int_equal(code, 127);
    proc_kill(&p);
}

static void test_timeout_kills_group(void **state) {
    (void)state;
    proc_t p;
    pid_t g = 0;
    int code;
    assert_int_equal(proc_spawn(&p, "sleeper", sleeper_with_grandchild, NULL), 0);
    assert_int_equal(proc_read(&p, &g, sizeof g, 5000), 0);
    assert_true(g > 0);
    pid_t pid = p.pid;
    uint64_t t0 = clock_mono_ns();
    assert_int_equal(proc_wait(&p, 200, &code), DL_ETIMEDOUT);
    double ms = (double)(clock_mono_ns() - t0) * 1e-6;
    assert_true(ms >= 200 && ms < 2000);
    assert_int_equal(code, -1);
    assert_true(p.reaped);
    assert_int_equal(proc_exit_code(p.status), 128 + SIGKILL);
    assert_true(pid_dead(pid));
    assert_true(pid_dead(g));
    proc_kill(&p);
}

/* A "test process" that arms the watchdog and hangs: it must exit 124 and take its child along. */
static int hanging_test(void *arg, int fd) {
    proc_t c;
    if (proc_spawn(&c, "hung-child", sleeper_with_grandchild, NULL) != 0) return 1;
    pid_t g;
    if (proc_read(&c, &g, sizeof g, 5000) != 0) return 1;
    proc_report(fd, &c.pid, sizeof c.pid);
    proc_watchdog(1);
    for (;;) pause();
    return 0;
}

static void test_watchdog(void **state) {
    (void)state;
    proc_t p;
    pid_t child = 0;
    int code;
    assert_int_equal(proc_spawn(&p, "hanging-test", hanging_test, NULL), 0);
    assert_int_equal(proc_read(&p, &child, sizeof child, 5000), 0);
    assert_int_equal(proc_wait(&p, 5000, &code), 0);
    assert_int_equal(code, 124);
    assert_true(pid_dead(child));
    proc_kill(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_codes),
        cmocka_unit_test(test_report_pipe),
        cmocka_unit_test(test_timeout_kills_group),
        cmocka_unit_test(test_watchdog),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
