/* The optimizer's host state memory (optimizer/ckpt_write.c, ockw_host_alloc): on a GPU
 * it is pinned, and when pinning fails (here: a build or machine without a usable GPU)
 * it is pageable memory with a warning line saying the checkpoints will stall, never
 * a failure; CPU (gpu -1): plain memory, no warning. The writer is compiled into this
 * test (the optimizer's objects are not in the library). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "optimizer/ckpt_write.c"

/* Runs ockw_host_alloc(bytes, gpu) in a child with stderr into a file; *pinned, the
 * log text in buf. */
static void alloc_logged(int gpu, int *pinned, char *buf, size_t cap) {
    char path[] = "/tmp/dl-opt-host-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        log_init("optimizer", LOG_INFO);
        int pin = -1;
        size_t bytes = 3u << 20;
        float *p = ockw_host_alloc(bytes, gpu, &pin, "optimizer start-up (master)");
        if (p) memset(p, 0, bytes);
        if (p && pin) dev_host_free(p);
        else free(p);
        int r = p ? pin : -1;
        ssize_t w = write(pfd[1], &r, sizeof r);
        _exit(w == sizeof r ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(read(pfd[0], pinned, sizeof *pinned), (ssize_t)sizeof *pinned);
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ssize_t n = pread(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    close(fd);
    close(pfd[0]);
    close(pfd[1]);
    unlink(path);
}

static void test_host_alloc(void **state) {
    (void)state;
    char log[4096];
    int pinned = -1;
    alloc_logged(-1, &pinned, log, sizeof log);
    assert_int_equal(pinned, 0);
    assert_null(strstr(log, "pageable"));
    alloc_logged(0, &pinned, log, sizeof log);
    assert_true(pinned == 0 || pinned == 1);
    if (pinned) {
        assert_null(strstr(log, "pageable"));   /* a GPU (or a CPU build's malloc) */
    } else {
        assert_non_null(strstr(log, "optimizer start-up (master): no pinned host memory"));
        assert_non_null(strstr(log, "pageable memory instead, so each checkpoint's snapshot will hold the steps"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_alloc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
