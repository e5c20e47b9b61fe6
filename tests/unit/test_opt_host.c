/* The optimizer's host state memory (optimizer/ckpt_write.c, ockw_host_buffer and
 * ockw_host_pin): page-aligned memory; on a GPU it is pinned in 64 MiB pieces, and when
 * pinning fails (here: a build or machine without a usable GPU) it stays pageable with a
 * warning line saying the checkpoints will stall, never a failure; CPU (gpu -1): plain
 * memory, no warning. The writer is compiled into this
 * test (the optimizer's objects are not in the library). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "optimizer/ckpt_write.c"

/* Runs ockw_host_buffer + ockw_host_pin(bytes, gpu) in a child with stderr into a file;
 * *pinned, the log text in buf. */
static void alloc_logged(int gpu, size_t bytes, int *pinned, char *buf, size_t cap) {
    char path[] = "/tmp/dl-opt-host-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        log_init("optimizer", LOG_INFO);
        float *p = ockw_host_buffer(bytes, "optimizer start-up (master)");
        int pin = p && (uintptr_t)p % 4096 == 0 ? ockw_host_pin(p, bytes, gpu, "optimizer start-up (master)", NULL) : -1;
        if (p && bytes <= (8u << 20)) memset(p, 0, bytes);
        if (pin == 1) ockw_host_unpin(p, bytes);
        free(p);
        int r = pin;
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
    alloc_logged(-1, 3u << 20, &pinned, log, sizeof log);
    assert_int_equal(pinned, 0);
    assert_null(strstr(log, "pageable"));
    /* one piece, then several (the last one short): pinned or said to be pageable */
    const size_t sizes[2] = {3u << 20, OCKW_PIN_CHUNK * 2 + 3 * 4096 + 100};
    for (int k = 0; k < 2; k++) {
        alloc_logged(0, sizes[k], &pinned, log, sizeof log);
        assert_true(pinned == 0 || pinned == 1);
        if (pinned) {
            assert_null(strstr(log, "pageable"));   /* a GPU (or a CPU build's no-op) */
        } else {
            assert_non_null(strstr(log, "optimizer start-up (master): no pinned host memory"));
            assert_non_null(strstr(log, "pageable memory instead, so each checkpoint's snapshot will hold the steps"));
        }
    }
}

/* ockw_host_pin waits between pieces while its hold is set (the optimizer holds it while
 * applying a step). Where pinning cannot even start (a CUDA build without a GPU: dev_set
 * fails) it returns at once, pageable: then only that is checked. */
typedef struct {
    float *p;
    size_t bytes;
    atomic_int hold, done;
    int rc;
} pin_arg_t;

static void *pin_thread(void *arg) {
    pin_arg_t *a = arg;
    a->rc = ockw_host_pin(a->p, a->bytes, 0, "checkpoint snapshot (master)", &a->hold);
    atomic_store(&a->done, 1);
    return NULL;
}

static void test_pin_hold(void **state) {
    (void)state;
    pin_arg_t a = {.bytes = 3 * (size_t)OCKW_PIN_CHUNK};
    a.p = ockw_host_buffer(a.bytes, "checkpoint snapshot (master)");
    assert_non_null(a.p);
    atomic_store(&a.hold, 1);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, pin_thread, &a), 0);
    usleep(100 * 1000);
    int can_pin = dev_set(0) == 0;
    if (can_pin) assert_int_equal(atomic_load(&a.done), 0);   /* held before its first piece */
    atomic_store(&a.hold, 0);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&a.done), 1);
    if (can_pin) assert_int_equal(a.rc, 1);
    if (a.rc == 1) ockw_host_unpin(a.p, a.bytes);
    free(a.p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_alloc),
        cmocka_unit_test(test_pin_hold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
