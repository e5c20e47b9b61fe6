/* common/bus clean shutdown: a process with a bound ROUTER (handling SIGINT/SIGTERM), a DEALER
 * whose upstream never existed with messages stuck in its queues (the case where a default
 * ZMQ_LINGER would make zmq_ctx_term hang forever), heartbeats and a repeating timer, gets SIGTERM
 * (then, in a second case, SIGINT) and must exit with code 0 within 1 s: the signal callback ran,
 * every handle was closed (uv_loop_close == 0) and the ipc socket file was removed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/bus/bus.h"
#include "tests/support/proc.h"

#define EXIT_LIMIT_MS 1000

typedef struct {
    const char *ep_server, *ep_nowhere;
    int expect_sig;
} child_arg_t;

typedef struct {
    bus_t *server, *client;
    int got_sig, ticks;
} child_t;

static void on_sig(bus_t *bus, int signum, void *arg) {
    child_t *c = arg;
    c->got_sig = signum;
    bus_close(c->client, NULL, NULL);    /* the server bus closes itself right after */
}

static void on_tick(bus_t *bus, void *arg) { ((child_t *)arg)->ticks++; }

static int child_main(void *varg, int report_fd) {
    const child_arg_t *a = varg;
    child_t c;
    memset(&c, 0, sizeof c);
    uv_loop_t loop;
    uv_loop_init(&loop);
    c.server = bus_new(&loop, &(bus_opts_t){.kind = BUS_ROUTER, .name = "sig-server",
                                            .handle_signals = 1, .heartbeat_interval_ms = 50,
                                            .heartbeat_timeout_ms = 200});
    c.client = bus_new(&loop, &(bus_opts_t){.kind = BUS_DEALER, .name = "sig-client",
                                            .sndhwm = 4, .heartbeat_interval_ms = 50,
                                            .heartbeat_timeout_ms = 10000});
    if (!c.server || !c.client || bus_bind(c.server, a->ep_server) != 0 ||
        bus_connect(c.client, a->ep_nowhere) != 0) {
        fprintf(stderr, "signal child: %s\n", dl_errmsg());
        return 2;
    }
    /* Fill ZeroMQ's pipe to the absent peer and the bus queue behind it. */
    char junk[1000] = {0};
    int queued = 0;
    for (int i = 0; i < 50; i++)
        if (bus_send(c.client, NULL, junk, sizeof junk) == 0) queued++;
    bus_stats_t st;
    bus_stats(c.client, &st);
    if (queued != 50 || st.queued_msgs == 0) {
        fprintf(stderr, "signal child: expected queued messages (%d sent, %zu queued)\n", queued,
                st.queued_msgs);
        return 3;
    }
    bus_on_signal(c.server, on_sig, &c);
    bus_timer_t *t;
    if (bus_timer_start(c.server, 5, 5, on_tick, &c, &t) != 0) return 2;
    char ready = 'r';
    proc_report(report_fd, &ready, 1);
    uv_run(&loop, UV_RUN_DEFAULT);    /* returns once the signal closed both buses */
    bus_destroy(&c.server);
    bus_destroy(&c.client);
    uv_run(&loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&loop);
    if (rc != 0 || c.got_sig != a->expect_sig) {
        fprintf(stderr, "signal child: uv_loop_close %d, signal %d (expected %d)\n", rc, c.got_sig,
                a->expect_sig);
        return 1;
    }
    return 0;
}

static void run_case(int sig) {
    char dir[] = "/tmp/dlbussig-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char ep_s[BUS_ENDPOINT_MAX], ep_n[BUS_ENDPOINT_MAX], path[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(dir, "server", ep_s, sizeof ep_s), 0);
    assert_int_equal(bus_endpoint(dir, "nowhere", ep_n, sizeof ep_n), 0);
    snprintf(path, sizeof path, "%s", ep_s + strlen("ipc://"));
    child_arg_t a = {ep_s, ep_n, sig};
    proc_watchdog(30);
    proc_t p;
    assert_int_equal(proc_spawn(&p, "signal-child", child_main, &a), 0);
    char ready = 0;
    int rc = proc_read(&p, &ready, 1, 10000);
    if (rc != 0) printf("%s\n", dl_errmsg());
    assert_int_equal(rc, 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    /* Let heartbeats, the timer and the queue retry run for a moment first. */
    struct timespec ts = {0, 100 * 1000000};
    nanosleep(&ts, NULL);

    uint64_t t0 = clock_mono_ns();
    assert_int_equal(proc_signal(&p, sig), 0);
    int code = -1;
    rc = proc_wait(&p, EXIT_LIMIT_MS, &code);
    double ms = (double)(clock_mono_ns() - t0) * 1e-6;
    proc_kill(&p);
    proc_watchdog(0);
    printf("%s: exit code %d after %.1f ms\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", code, ms);
    assert_int_equal(rc, 0);
    assert_int_equal(code, 0);
    assert_true(ms < EXIT_LIMIT_MS);
    assert_int_equal(stat(path, &st), -1);    /* ZeroMQ removed its ipc socket file */
    assert_int_equal(errno, ENOENT);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_sigterm(void **state) { (void)state; run_case(SIGTERM); }
static void test_sigint(void **state) { (void)state; run_case(SIGINT); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigterm),
        cmocka_unit_test(test_sigint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
