/* common/bus goodbye (issue 15 item 7): an orderly close is not a death.
 *
 *  - a DEALER with opts.goodbye that closes is forgotten by its ROUTER at once (well before
 *    the heartbeat timeout): bus_peer_dead_cb runs once with BUS_PEER_LEFT, the ROUTER counts
 *    it in peers_left, never in peers_dead, and reports nothing later;
 *  - the same DEALER killed with SIGKILL in a child process (no goodbye can leave) is still
 *    reported dead after the timeout, with silent_ms >= the timeout;
 *  - a ROUTER with opts.goodbye that closes: its DEALER's upstream ("") left, not dead;
 *  - a bus without opts.goodbye says nothing at close (the peer is found dead, as before).
 */
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

#define HB_IVL 30
#define HB_TO 400

typedef struct {
    char dir[64];
} tmpdir_t;

static void tmp_make(tmpdir_t *t) {
    snprintf(t->dir, sizeof t->dir, "/tmp/dlbye-XXXXXX");
    assert_non_null(mkdtemp(t->dir));
}

static void tmp_remove(tmpdir_t *t) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->dir);
    assert_int_equal(system(cmd), 0);
}

typedef struct { uv_timer_t t; int fired; } guard_t;
static void on_guard(uv_timer_t *t) {
    ((guard_t *)t->data)->fired = 1;
    uv_stop(t->loop);
}
/* Runs the loop for ms (or until uv_stop); returns 1 if the deadline hit. */
static int run_for(uv_loop_t *loop, uint64_t ms) {
    guard_t g = {.fired = 0};
    uv_timer_init(loop, &g.t);
    g.t.data = &g;
    uv_timer_start(&g.t, on_guard, ms, 0);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&g.t, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return g.fired;
}

typedef struct {
    int dead, left, fresh;
    char who[BUS_ID_MAX + 1];
    uint64_t silent_ms, at_ns;
    int stop_on_report;     /* uv_stop at a report (timing) */
} watch_t;

static void on_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg) {
    watch_t *w = arg;
    if (silent_ms == BUS_PEER_LEFT) w->left++;
    else w->dead++;
    snprintf(w->who, sizeof w->who, "%s", peer);
    w->silent_ms = silent_ms;
    w->at_ns = clock_mono_ns();
    if (w->stop_on_report) uv_stop(bus_loop(bus));
}

static void on_new(bus_t *bus, const char *peer, void *arg) {
    (void)peer;
    watch_t *w = arg;
    w->fresh++;
    if (w->stop_on_report) uv_stop(bus_loop(bus));
}

static bus_opts_t opts(bus_kind_t kind, const char *identity, int goodbye) {
    return (bus_opts_t){.kind = kind, .identity = identity, .heartbeat_interval_ms = HB_IVL,
                        .heartbeat_timeout_ms = HB_TO, .goodbye = goodbye};
}

/* A closing DEALER's goodbye: forgotten at once, no death then or later. */
static void test_dealer_goodbye(void **state) {
    (void)state;
    tmpdir_t t;
    tmp_make(&t);
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(t.dir, "bye", ep, sizeof ep), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_opts_t o = opts(BUS_ROUTER, NULL, 0);
    bus_t *r = bus_new(&loop, &o);
    o = opts(BUS_DEALER, "d1", 1);
    bus_t *d = bus_new(&loop, &o);
    watch_t w = {0};
    bus_on_peer_dead(r, on_dead, &w);
    assert_int_equal(bus_bind(r, ep), 0);
    assert_int_equal(bus_connect(d, ep), 0);
    assert_int_equal(run_for(&loop, 4 * HB_IVL), 1);
    bus_stats_t s;
    bus_stats(r, &s);
    assert_int_equal(s.peers_alive, 1);

    uint64_t t0 = clock_mono_ns();
    bus_close(d, NULL, NULL);
    w.stop_on_report = 1;
    run_for(&loop, 3 * HB_TO);
    assert_int_equal(w.left, 1);
    assert_int_equal(w.dead, 0);
    assert_string_equal(w.who, "d1");
    uint64_t ms = (w.at_ns - t0) / 1000000;
    printf("goodbye: DEALER left, ROUTER told after %llu ms (timeout %d ms)\n", (unsigned long long)ms, HB_TO);
    assert_true(ms < HB_TO / 2);
    bus_stats(r, &s);
    assert_int_equal(s.peers_alive, 0);
    assert_int_equal(s.peers_left, 1);
    assert_int_equal(s.peers_dead, 0);
    /* nothing more, ever: the peer is forgotten, not watched until its timeout */
    w.stop_on_report = 0;
    assert_int_equal(run_for(&loop, 2 * HB_TO), 1);
    assert_int_equal(w.left, 1);
    assert_int_equal(w.dead, 0);
    bus_stats(r, &s);
    assert_int_equal(s.peers_dead, 0);
    bus_destroy(&d);
    bus_destroy(&r);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    tmp_remove(&t);
}

/* The child: a DEALER with opts.goodbye that heartbeats until it is killed. */
static void child_dealer(const char *ep) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_opts_t o = opts(BUS_DEALER, "k1", 1);
    bus_t *d = bus_new(&loop, &o);
    if (!d || bus_connect(d, ep) < 0) _exit(2);
    uv_run(&loop, UV_RUN_DEFAULT);
    _exit(0);
}

/* Killed (SIGKILL): no goodbye leaves, so the ROUTER reports it dead after the timeout. */
static void test_killed_still_dead(void **state) {
    (void)state;
    tmpdir_t t;
    tmp_make(&t);
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(t.dir, "kill", ep, sizeof ep), 0);
    pid_t pid = fork();    /* before any ZeroMQ context of ours exists */
    assert_true(pid >= 0);
    if (pid == 0) child_dealer(ep);
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_opts_t o = opts(BUS_ROUTER, NULL, 1);
    bus_t *r = bus_new(&loop, &o);
    watch_t w = {.stop_on_report = 1};
    bus_on_peer_dead(r, on_dead, &w);
    bus_on_peer_new(r, on_new, &w);
    assert_int_equal(bus_bind(r, ep), 0);
    run_for(&loop, 5000);
    assert_int_equal(w.fresh, 1);
    assert_int_equal(run_for(&loop, 3 * HB_IVL), 1);   /* a few heartbeats each way */
    uint64_t t0 = clock_mono_ns();
    assert_int_equal(kill(pid, SIGKILL), 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    run_for(&loop, 3 * HB_TO);
    assert_int_equal(w.dead, 1);
    assert_int_equal(w.left, 0);
    assert_string_equal(w.who, "k1");
    assert_true(w.silent_ms >= HB_TO);
    assert_true((w.at_ns - t0) / 1000000 >= HB_TO - HB_IVL);
    bus_stats_t s;
    bus_stats(r, &s);
    assert_int_equal(s.peers_dead, 1);
    assert_int_equal(s.peers_left, 0);
    bus_destroy(&r);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    tmp_remove(&t);
}

/* A closing ROUTER's goodbye reaches its DEALER (upstream ""); a bus without opts.goodbye says
 * nothing, so its peer is found dead by the timeout as before. */
static void test_router_goodbye_and_opt_in(void **state) {
    (void)state;
    tmpdir_t t;
    tmp_make(&t);
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(t.dir, "rbye", ep, sizeof ep), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_opts_t o = opts(BUS_ROUTER, NULL, 1);
    bus_t *r = bus_new(&loop, &o);
    o = opts(BUS_DEALER, "d2", 0);
    bus_t *d = bus_new(&loop, &o);
    watch_t wd = {0}, wr = {0};
    bus_on_peer_dead(d, on_dead, &wd);
    bus_on_peer_dead(r, on_dead, &wr);
    assert_int_equal(bus_bind(r, ep), 0);
    assert_int_equal(bus_connect(d, ep), 0);
    assert_int_equal(run_for(&loop, 4 * HB_IVL), 1);
    bus_close(r, NULL, NULL);
    wd.stop_on_report = 1;
    run_for(&loop, 3 * HB_TO);
    assert_int_equal(wd.left, 1);
    assert_int_equal(wd.dead, 0);
    assert_string_equal(wd.who, "");
    bus_stats_t s;
    bus_stats(d, &s);
    assert_int_equal(s.peers_left, 1);
    assert_int_equal(s.peers_dead, 0);
    bus_destroy(&r);
    uv_run(&loop, UV_RUN_NOWAIT);

    /* no opts.goodbye on the dealer: its router finds it dead after the timeout */
    o = opts(BUS_ROUTER, NULL, 1);
    r = bus_new(&loop, &o);
    bus_on_peer_dead(r, on_dead, &wr);
    assert_int_equal(bus_bind(r, ep), 0);
    bus_destroy(&d);
    o = opts(BUS_DEALER, "d3", 0);
    d = bus_new(&loop, &o);
    assert_int_equal(bus_connect(d, ep), 0);
    assert_int_equal(run_for(&loop, 4 * HB_IVL), 1);
    bus_destroy(&d);
    wr.stop_on_report = 1;
    run_for(&loop, 3 * HB_TO);
    assert_int_equal(wr.dead, 1);
    assert_int_equal(wr.left, 0);
    assert_true(wr.silent_ms >= HB_TO);
    bus_destroy(&r);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    tmp_remove(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dealer_goodbye),
        cmocka_unit_test(test_killed_still_dead),
        cmocka_unit_test(test_router_goodbye_and_opt_in),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
