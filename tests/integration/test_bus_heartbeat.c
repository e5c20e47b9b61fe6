/* common/bus peer-death detection across processes: a server (this test process, ROUTER) and two
 * client processes (DEALER) that ping it every PING_MS. Once both are served, the server kills
 * client-a with SIGKILL and measures how long the bus takes to report it dead: the report must
 * come exactly once, after >= HB_TIMEOUT_MS of silence and within HB_TIMEOUT_MS + HB_IVL_MS of the
 * kill. client-b must never be reported dead and must keep getting correct replies afterwards
 * (it checks every reply and exits 0 only if all matched). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/bus/bus.h"
#include "tests/support/proc.h"

#define HB_IVL_MS 100
#define HB_TIMEOUT_MS 500
/* Scheduler allowance: on a loaded 2-core machine the server's timer can fire late.
 * The bus checks deadlines every interval, so an idle machine detects within
 * timeout + interval (measured 501-517 ms); the slack only absorbs load. */
#define SCHED_SLACK_MS 300
#define PING_MS 20
#define SERVED_BEFORE_KILL 5       /* pings served per client before the kill */
#define SERVED_AFTER_DEATH 10      /* client-b pings served after the death report */
#define QUIET_AFTER_DEATH_MS (2 * HB_TIMEOUT_MS)   /* watch for a second report this long */
#define GUARD_MS 20000

typedef struct { char kind; uint32_t seq; } msg_t;   /* 'p' ping, 'r' reply, 's' stop */

/* ---- client ------------------------------------------------------------------------------ */

typedef struct {
    bus_t *bus;
    uint32_t next_ping, next_reply;
    int bad, stopped, server_dead;
} client_t;

static void client_tick(bus_t *bus, void *arg) {
    client_t *c = arg;
    msg_t m = {'p', c->next_ping};
    if (bus_send(bus, NULL, &m, sizeof m) == 0) c->next_ping++;
}

static void client_recv(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    client_t *c = arg;
    msg_t m;
    if (len != sizeof m) { c->bad++; return; }
    memcpy(&m, data, sizeof m);
    if (m.kind == 's') { c->stopped = 1; bus_close(bus, NULL, NULL); return; }
    if (m.kind != 'r' || m.seq != c->next_reply) c->bad++;
    c->next_reply++;
}

static void client_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg) {
    client_t *c = arg;
    c->server_dead = 1;
    bus_close(bus, NULL, NULL);
}

static int client_main(void *arg, int report_fd) {
    const char **a = arg;    /* {endpoint, identity} */
    client_t c;
    memset(&c, 0, sizeof c);
    uv_loop_t loop;
    uv_loop_init(&loop);
    c.bus = bus_new(&loop, &(bus_opts_t){.kind = BUS_DEALER, .identity = a[1],
                                         .heartbeat_interval_ms = HB_IVL_MS,
                                         .heartbeat_timeout_ms = HB_TIMEOUT_MS});
    if (!c.bus || bus_connect(c.bus, a[0]) != 0) {
        fprintf(stderr, "client %s: %s\n", a[1], dl_errmsg());
        return 2;
    }
    bus_on_message(c.bus, client_recv, &c);
    bus_on_peer_dead(c.bus, client_dead, &c);
    bus_timer_t *t;
    if (bus_timer_start(c.bus, PING_MS, PING_MS, client_tick, &c, &t) != 0) return 2;
    uv_run(&loop, UV_RUN_DEFAULT);
    bus_destroy(&c.bus);
    uv_run(&loop, UV_RUN_DEFAULT);
    int leftover = uv_loop_close(&loop) != 0;
    if (c.bad || c.server_dead || !c.stopped || c.next_reply == 0 || leftover) {
        fprintf(stderr, "client %s: bad %d, server dead %d, stopped %d, replies %u, leftover %d\n",
                a[1], c.bad, c.server_dead, c.stopped, c.next_reply, leftover);
        return 1;
    }
    return 0;
}

/* ---- server (the test process) ----------------------------------------------------------- */

typedef struct {
    bus_t *bus;
    proc_t *a;
    uint32_t served_a, served_b, served_b_after;
    int bad, killed, dead_count, dead_b, stopping, guard_fired;
    char dead_who[BUS_ID_MAX + 1];
    uint64_t t_kill, t_dead, silent_ms;
    bus_timer_t *guard;
} server_t;

static void server_guard(bus_t *bus, void *arg) {
    server_t *s = arg;
    s->guard_fired = 1;
    bus_close(bus, NULL, NULL);
}

static void server_stop(server_t *s) {
    msg_t m = {'s', 0};
    if (bus_send(s->bus, "client-b", &m, sizeof m) != 0) s->bad++;
    s->stopping = 1;
    bus_close(s->bus, NULL, NULL);    /* linger_ms lets the stop message out */
}

static void server_recv(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    server_t *s = arg;
    msg_t m;
    if (len != sizeof m) { s->bad++; return; }
    memcpy(&m, data, sizeof m);
    if (m.kind != 'p') { s->bad++; return; }
    m.kind = 'r';
    if (bus_send(bus, peer, &m, sizeof m) != 0) { s->bad++; return; }
    if (strcmp(peer, "client-a") == 0) s->served_a++;
    else if (strcmp(peer, "client-b") == 0) {
        s->served_b++;
        if (s->dead_count) s->served_b_after++;
    } else s->bad++;

    if (!s->killed && s->served_a >= SERVED_BEFORE_KILL && s->served_b >= SERVED_BEFORE_KILL) {
        s->killed = 1;
        s->t_kill = clock_mono_ns();
        proc_signal(s->a, SIGKILL);
    }
    if (s->dead_count && !s->stopping && s->served_b_after >= SERVED_AFTER_DEATH &&
        clock_mono_ns() - s->t_dead >= (uint64_t)QUIET_AFTER_DEATH_MS * 1000000ull)
        server_stop(s);
}

static void server_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg) {
    server_t *s = arg;
    if (strcmp(peer, "client-b") == 0) { s->dead_b++; return; }
    if (s->dead_count++ == 0) {
        s->t_dead = clock_mono_ns();
        s->silent_ms = silent_ms;
        snprintf(s->dead_who, sizeof s->dead_who, "%s", peer);
    }
}

static void test_heartbeat_kill9(void **state) {
    (void)state;
    char dir[] = "/tmp/dlbushb-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(dir, "server", ep, sizeof ep), 0);
    proc_watchdog(60);

    /* Clients first: they must not inherit this process's loop or ZeroMQ context. */
    proc_t ca, cb;
    const char *arg_a[2] = {ep, "client-a"}, *arg_b[2] = {ep, "client-b"};
    assert_int_equal(proc_spawn(&ca, "client-a", client_main, arg_a), 0);
    assert_int_equal(proc_spawn(&cb, "client-b", client_main, arg_b), 0);

    uv_loop_t loop;
    uv_loop_init(&loop);
    server_t s;
    memset(&s, 0, sizeof s);
    s.a = &ca;
    s.bus = bus_new(&loop, &(bus_opts_t){.kind = BUS_ROUTER, .name = "hb-server",
                                         .heartbeat_interval_ms = HB_IVL_MS,
                                         .heartbeat_timeout_ms = HB_TIMEOUT_MS, .linger_ms = 1000});
    assert_non_null(s.bus);
    assert_int_equal(bus_bind(s.bus, ep), 0);
    bus_on_message(s.bus, server_recv, &s);
    bus_on_peer_dead(s.bus, server_dead, &s);
    assert_int_equal(bus_timer_start(s.bus, GUARD_MS, 0, server_guard, &s, &s.guard), 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    bus_destroy(&s.bus);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);

    int code_a = -1, code_b = -1;
    proc_wait(&ca, 2000, &code_a);
    proc_wait(&cb, 5000, &code_b);
    proc_kill(&ca);
    proc_kill(&cb);
    proc_watchdog(0);

    double detect_ms = (double)(s.t_dead - s.t_kill) * 1e-6;
    printf("heartbeat: interval %d ms, timeout %d ms; kill -9 client-a -> reported dead after "
           "%.1f ms (silent %llu ms); client-b served %u pings, %u after the death\n",
           HB_IVL_MS, HB_TIMEOUT_MS, detect_ms, (unsigned long long)s.silent_ms, s.served_b,
           s.served_b_after);
    assert_false(s.guard_fired);
    assert_int_equal(s.bad, 0);
    assert_true(s.killed);
    assert_int_equal(s.dead_count, 1);
    assert_string_equal(s.dead_who, "client-a");
    assert_int_equal(s.dead_b, 0);
    assert_true(s.silent_ms >= HB_TIMEOUT_MS);
    assert_true(detect_ms <= HB_TIMEOUT_MS + HB_IVL_MS + SCHED_SLACK_MS);
    assert_true(s.served_b_after >= SERVED_AFTER_DEATH);
    assert_int_equal(code_a, 128 + SIGKILL);
    assert_int_equal(code_b, 0);

    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heartbeat_kill9),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
