/* A peer never heard is not dead (issue 15 item 7): a DEALER connects to an endpoint whose
 * owner (a child process, as a stage still loading its model) binds only 5 s later; the
 * DEALER must not report its upstream dead in those 5 s (the old bus did after one
 * timeout), and must hear it once it is up. Then the child is SIGSTOPped: a peer heard and
 * then silent is still reported dead, once, after the timeout. The child is killed and
 * reaped in every case. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/clock.h"
#include "common/bus/bus.h"

#define HB_IVL 50
#define HB_TO 400
#define BIND_AFTER_MS 5000

typedef struct { uv_timer_t t; } guard_t;
static void on_guard(uv_timer_t *t) { uv_stop(t->loop); }

/* Runs the loop for ms milliseconds. */
static void run_for(uv_loop_t *loop, uint64_t ms) {
    guard_t g;
    uv_timer_init(loop, &g.t);
    uv_timer_start(&g.t, on_guard, ms, 0);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&g.t, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
}

/* The late server: binds after BIND_AFTER_MS, then serves heartbeats until killed. */
static void child_server(const char *ep) {
    usleep(BIND_AFTER_MS * 1000);
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_opts_t o = {.kind = BUS_ROUTER, .heartbeat_interval_ms = HB_IVL, .heartbeat_timeout_ms = HB_TO};
    bus_t *r = bus_new(&loop, &o);
    if (!r || bus_bind(r, ep) < 0) _exit(2);
    uv_run(&loop, UV_RUN_DEFAULT);
    _exit(0);
}

typedef struct { int dead, fresh; uint64_t dead_at_ns; } seen_t;

static void on_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg) {
    seen_t *s = arg;
    s->dead++;
    s->dead_at_ns = clock_mono_ns();
}
static void on_new(bus_t *bus, const char *peer, void *arg) { ((seen_t *)arg)->fresh++; }

static void test_unheard_not_dead(void **state) {
    (void)state;
    char dir[] = "/tmp/dlbusu-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(dir, "late", ep, sizeof ep), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) child_server(ep);
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_opts_t o = {.kind = BUS_DEALER, .identity = "early", .heartbeat_interval_ms = HB_IVL,
                    .heartbeat_timeout_ms = HB_TO};
    bus_t *d = bus_new(&loop, &o);
    assert_non_null(d);
    seen_t s = {0};
    bus_on_peer_dead(d, on_dead, &s);
    bus_on_peer_new(d, on_new, &s);
    assert_int_equal(bus_connect(d, ep), 0);
    /* the server is not there yet: 12 timeouts of silence, no death */
    run_for(&loop, BIND_AFTER_MS - 200);
    int dead_before = s.dead, fresh_before = s.fresh;
    /* up now: heard within a few intervals */
    run_for(&loop, 1200);
    int fresh_after = s.fresh, dead_up = s.dead;
    /* heard, then silent: dead after the timeout */
    kill(pid, SIGSTOP);
    uint64_t t_stop = clock_mono_ns();
    run_for(&loop, 3 * HB_TO);
    kill(pid, SIGKILL);
    kill(pid, SIGCONT);
    int status = 0;
    waitpid(pid, &status, 0);
    bus_destroy(&d);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(dead_before, 0);
    assert_int_equal(fresh_before, 0);
    assert_int_equal(fresh_after, 1);
    assert_int_equal(dead_up, 0);
    assert_int_equal(s.dead, 1);
    uint64_t detect_ms = (s.dead_at_ns - t_stop) / 1000000ull;
    assert_true(detect_ms >= HB_TO - HB_IVL && detect_ms <= 3 * HB_TO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unheard_not_dead),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
