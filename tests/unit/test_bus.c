/* common/bus in one process: run dir checks, endpoint names, ROUTER/DEALER round trip, the
 * bounded outgoing queue (DL_EAGAIN and bus_writable_cb), errors, PUB/SUB topics, heartbeats and
 * timers. Multi-process behaviour is in tests/integration/test_bus_{load,heartbeat,signal}.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/bus/bus.h"

/* ---- helpers ----------------------------------------------------------------------------- */

typedef struct {
    char dir[64];
} tmpdir_t;

static void tmp_make(tmpdir_t *t) {
    snprintf(t->dir, sizeof t->dir, "/tmp/dlbus-XXXXXX");
    assert_non_null(mkdtemp(t->dir));
}

static void tmp_remove(tmpdir_t *t) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->dir);
    assert_int_equal(system(cmd), 0);
}

/* Runs the loop until uv_stop or the deadline; returns 1 if the deadline hit. */
typedef struct { uv_timer_t t; int fired; } guard_t;
static void on_guard(uv_timer_t *t) {
    ((guard_t *)t->data)->fired = 1;
    uv_stop(t->loop);
}
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

/* Destroys the buses, lets their close callbacks run and checks nothing is left on the loop. */
static void finish_loop(uv_loop_t *loop, bus_t **a, bus_t **b) {
    bus_destroy(a);
    bus_destroy(b);
    assert_null(a ? *a : NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(loop), 0);
}

/* ---- run dir and endpoints --------------------------------------------------------------- */

static void test_run_dir(void **state) {
    (void)state;
    tmpdir_t t;
    tmp_make(&t);
    char p[256];
    struct stat st;

    snprintf(p, sizeof p, "%s/a/b/run", t.dir);
    assert_int_equal(bus_run_dir_create(p), 0);
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0700);
    assert_int_equal(st.st_uid, geteuid());
    assert_int_equal(bus_run_dir_create(p), 0);     /* existing, ours, 0700: fine */

    /* Looser modes are refused and the message names the mode. */
    assert_int_equal(chmod(p, 0755), 0);
    assert_int_equal(bus_run_dir_create(p), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "0755"));
    assert_int_equal(chmod(p, 0710), 0);
    assert_int_equal(bus_run_dir_create(p), DL_EINVAL);
    assert_int_equal(chmod(p, 0700), 0);

    /* A strict umask cannot leave the dir unusable: it ends up 0700. */
    mode_t old = umask(0277);
    char q[256];
    snprintf(q, sizeof q, "%s/umask", t.dir);
    int rc = bus_run_dir_create(q);
    umask(old);
    assert_int_equal(rc, 0);
    assert_int_equal(stat(q, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0700);

    /* Owned by someone else: refused even at 0700. */
    snprintf(q, sizeof q, "%s/other", t.dir);
    if (geteuid() == 0) {
        assert_int_equal(mkdir(q, 0700), 0);
        assert_int_equal(chown(q, 65534, 65534), 0);
        assert_int_equal(bus_run_dir_create(q), DL_EINVAL);
        assert_non_null(strstr(dl_errmsg(), "owned by uid 65534"));
    } else {
        assert_int_equal(bus_run_dir_create("/"), DL_EINVAL);
        assert_non_null(strstr(dl_errmsg(), "owned by uid 0"));
    }

    /* A file, and a symlink to a good dir. */
    snprintf(q, sizeof q, "%s/file", t.dir);
    int fd = open(q, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(bus_run_dir_create(q), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "not a directory"));
    snprintf(q, sizeof q, "%s/link", t.dir);
    assert_int_equal(symlink(p, q), 0);
    assert_int_equal(bus_run_dir_create(q), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "symlink"));

    assert_int_equal(bus_run_dir_create(""), DL_EINVAL);
    tmp_remove(&t);
}

static void test_endpoint(void **state) {
    (void)state;
    char buf[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint("/run/dl", "supervisor", buf, sizeof buf), 0);
    assert_string_equal(buf, "ipc:///run/dl/supervisor.sock");
    assert_int_equal(bus_endpoint("/run/dl//", "target-0.metrics_x", buf, sizeof buf), 0);
    assert_string_equal(buf, "ipc:///run/dl/target-0.metrics_x.sock");
    assert_int_equal(bus_endpoint("rel", "a", buf, sizeof buf), 0);
    assert_string_equal(buf, "ipc://rel/a.sock");

    assert_int_equal(bus_endpoint("/run/dl", "", buf, sizeof buf), DL_EINVAL);
    assert_int_equal(bus_endpoint("/run/dl", "a/b", buf, sizeof buf), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "'/'"));
    assert_int_equal(bus_endpoint("/run/dl", ".hidden", buf, sizeof buf), DL_EINVAL);
    assert_int_equal(bus_endpoint("/run/dl", "a b", buf, sizeof buf), DL_EINVAL);
    assert_int_equal(bus_endpoint("", "a", buf, sizeof buf), DL_EINVAL);
    char name[80];
    memset(name, 'n', sizeof name);
    name[BUS_NAME_MAX + 1] = 0;                        /* 65 chars */
    assert_int_equal(bus_endpoint("/r", name, buf, sizeof buf), DL_EINVAL);
    name[BUS_NAME_MAX] = 0;                            /* 64 chars: fine */
    assert_int_equal(bus_endpoint("/r", name, buf, sizeof buf), 0);

    /* sun_path holds 107 chars + NUL: "<dir>/" + name + ".sock" of exactly 107 passes, 108 fails. */
    char dir[128];
    memset(dir, 'd', sizeof dir);
    dir[0] = '/';
    dir[107 - 1 - 1 - 5] = 0;                          /* 100-char dir, "/", "x", ".sock" = 107 */
    assert_int_equal(bus_endpoint(dir, "x", buf, sizeof buf), 0);
    assert_int_equal(strlen(buf), 6 + 107);
    assert_int_equal(bus_endpoint(dir, "xy", buf, sizeof buf), DL_ERANGE);
    assert_non_null(strstr(dl_errmsg(), "unix socket path limit"));
    assert_int_equal(bus_endpoint("/run/dl", "supervisor", buf, 20), DL_ERANGE);
}

/* ---- round trip -------------------------------------------------------------------------- */

static const size_t rt_sizes[] = {0, 1, 5000, 300000, 17};
#define RT_N (sizeof rt_sizes / sizeof rt_sizes[0])

typedef struct {
    bus_t *router, *dealer;
    int server_got, client_got, bad;
    int new_peers;
    char new_peer[BUS_ID_MAX + 1];
} rt_t;

static unsigned char rt_byte(size_t msg, size_t i) { return (unsigned char)(msg * 31 + i * 7 + 1); }

static void rt_server(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    rt_t *c = arg;
    size_t k = (size_t)c->server_got++;
    const unsigned char *d = data;
    if (strcmp(peer, "cli") != 0 || k >= RT_N || len != rt_sizes[k]) { c->bad++; return; }
    for (size_t i = 0; i < len; i++)
        if (d[i] != rt_byte(k, i)) { c->bad++; return; }
    /* Reply: the same bytes, reversed. */
    unsigned char *r = malloc(len + 1);
    for (size_t i = 0; i < len; i++) r[i] = d[len - 1 - i];
    if (bus_send(bus, peer, r, len) != 0) c->bad++;
    free(r);
}

static void rt_client(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    rt_t *c = arg;
    size_t k = (size_t)c->client_got++;
    const unsigned char *d = data;
    if (peer[0] != 0 || k >= RT_N || len != rt_sizes[k]) { c->bad++; return; }
    for (size_t i = 0; i < len; i++)
        if (d[i] != rt_byte(k, len - 1 - i)) { c->bad++; return; }
    if (c->client_got == (int)RT_N) uv_stop(bus_loop(bus));
}

static void rt_new(bus_t *bus, const char *peer, void *arg) {
    rt_t *c = arg;
    c->new_peers++;
    snprintf(c->new_peer, sizeof c->new_peer, "%s", peer);
}

static void test_roundtrip(void **state) {
    (void)state;
    tmpdir_t t;
    tmp_make(&t);
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(t.dir, "rt", ep, sizeof ep), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    rt_t c = {0};
    c.router = bus_new(&loop, &(bus_opts_t){.kind = BUS_ROUTER, .name = "server"});
    c.dealer = bus_new(&loop, &(bus_opts_t){.kind = BUS_DEALER, .identity = "cli"});
    assert_non_null(c.router);
    assert_non_null(c.dealer);
    assert_string_equal(bus_identity(c.dealer), "cli");
    bus_on_message(c.router, rt_server, &c);
    bus_on_message(c.dealer, rt_client, &c);
    bus_on_peer_new(c.router, rt_new, &c);
    /* Connect before bind: ZeroMQ queues and reconnects. */
    assert_int_equal(bus_connect(c.dealer, ep), 0);
    assert_int_equal(bus_connect(c.dealer, ep), DL_ESTATE);
    for (size_t k = 0; k < RT_N; k++) {
        unsigned char *m = malloc(rt_sizes[k] + 1);
        for (size_t i = 0; i < rt_sizes[k]; i++) m[i] = rt_byte(k, i);
        assert_int_equal(bus_send(c.dealer, NULL, m, rt_sizes[k]), 0);
        free(m);
    }
    assert_int_equal(bus_bind(c.router, ep), 0);
    assert_int_equal(run_for(&loop, 5000), 0);
    assert_int_equal(c.bad, 0);
    assert_int_equal(c.server_got, RT_N);
    assert_int_equal(c.client_got, RT_N);
    assert_int_equal(c.new_peers, 1);
    assert_string_equal(c.new_peer, "cli");
    bus_stats_t s;
    bus_stats(c.router, &s);
    assert_int_equal(s.msgs_in, RT_N);
    assert_int_equal(s.msgs_out, RT_N);
    size_t total = 0;
    for (size_t k = 0; k < RT_N; k++) total += rt_sizes[k];
    assert_int_equal(s.bytes_in, total);
    assert_int_equal(s.peers_alive, 1);
    assert_int_equal(s.dropped_bad, 0);
    finish_loop(&loop, &c.router, &c.dealer);
    tmp_remove(&t);
}

/* ---- bounded queue ----------------------------------------------------------------------- */

#define BP_TOTAL 20000
#define BP_QMAX 20

typedef struct {
    bus_t *router, *dealer;
    uint32_t next_send, next_recv;
    int bad, writable, eagain;
} bp_t;

static void bp_pump(bp_t *c) {
    while (c->next_send < BP_TOTAL) {
        uint32_t v[4] = {c->next_send, ~c->next_send, 0, 0};
        int rc = bus_send(c->dealer, NULL, v, sizeof v);
        if (rc == DL_EAGAIN) { c->eagain++; return; }
        if (rc != 0) { c->bad++; return; }
        c->next_send++;
    }
}

static void bp_writable(bus_t *bus, void *arg) {
    bp_t *c = arg;
    c->writable++;
    bp_pump(c);
}

static void bp_recv(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    bp_t *c = arg;
    uint32_t v[4];
    if (len != sizeof v) { c->bad++; return; }
    memcpy(v, data, sizeof v);
    if (v[0] != c->next_recv || v[1] != ~c->next_recv) c->bad++;
    c->next_recv++;
    if (c->next_recv == BP_TOTAL) uv_stop(bus_loop(bus));
}

static void test_backpressure(void **state) {
    (void)state;
    tmpdir_t t;
    tmp_make(&t);
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(t.dir, "bp", ep, sizeof ep), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    bp_t c = {0};
    c.dealer = bus_new(&loop, &(bus_opts_t){.kind = BUS_DEALER, .identity = "bp", .sndhwm = 10,
                                            .outq_max_msgs = BP_QMAX, .max_msg_bytes = 4096});
    assert_non_null(c.dealer);
    assert_int_equal(bus_connect(c.dealer, ep), 0);
    /* Nobody is bound: ZeroMQ takes sndhwm messages, the bus queues BP_QMAX, then DL_EAGAIN. */
    bp_pump(&c);
    assert_int_equal(c.bad, 0);
    assert_int_equal(c.eagain, 1);
    bus_stats_t s;
    bus_stats(c.dealer, &s);
    assert_int_equal(s.queued_msgs, BP_QMAX);
    assert_int_equal(s.send_eagain, 1);
    assert_true(c.next_send >= BP_QMAX + 1 && c.next_send <= BP_QMAX + 10 + 1);
    assert_non_null(strstr(dl_errmsg(), "outgoing queue full"));
    /* Over max_msg_bytes: refused before anything else. */
    static char big[4097];
    assert_int_equal(bus_send(c.dealer, NULL, big, sizeof big), DL_ERANGE);

    c.router = bus_new(&loop, &(bus_opts_t){.kind = BUS_ROUTER, .rcvhwm = 50});
    assert_non_null(c.router);
    bus_on_message(c.router, bp_recv, &c);
    bus_on_writable(c.dealer, bp_writable, &c);
    assert_int_equal(bus_bind(c.router, ep), 0);
    assert_int_equal(run_for(&loop, 20000), 0);
    assert_int_equal(c.bad, 0);
    assert_int_equal(c.next_recv, BP_TOTAL);
    assert_true(c.writable >= 1);
    bus_stats(c.dealer, &s);
    assert_int_equal(s.msgs_out, BP_TOTAL);
    assert_int_equal(s.queued_msgs, 0);
    assert_true(s.queued_total >= BP_QMAX);
    assert_int_equal(s.send_eagain, (uint64_t)c.eagain);
    finish_loop(&loop, &c.router, &c.dealer);
    tmp_remove(&t);
}

/* The same from the ROUTER side: ZMQ_ROUTER_MANDATORY turns a full pipe into EAGAIN, the bus
 * queues per peer and flushes in order as the DEALER reads. */
typedef struct {
    bus_t *router, *dealer;
    uint32_t next_send, next_recv;
    int bad, writable, eagain, started;
} rbp_t;

static void rbp_pump(rbp_t *c) {
    while (c->next_send < BP_TOTAL) {
        uint32_t v[8] = {c->next_send, ~c->next_send};
        int rc = bus_send(c->router, "rd", v, sizeof v);
        if (rc == DL_EAGAIN) { c->eagain++; return; }
        if (rc != 0) { c->bad++; return; }
        c->next_send++;
    }
}

static void rbp_server(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    rbp_t *c = arg;
    if (c->started++ == 0) rbp_pump(c);    /* the dealer said hello: now the router knows it */
}

static void rbp_writable(bus_t *bus, void *arg) {
    rbp_t *c = arg;
    c->writable++;
    rbp_pump(c);
}

static void rbp_client(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    rbp_t *c = arg;
    uint32_t v[8];
    if (len != sizeof v) { c->bad++; return; }
    memcpy(v, data, sizeof v);
    if (v[0] != c->next_recv || v[1] != ~c->next_recv) c->bad++;
    c->next_recv++;
    if (c->next_recv == BP_TOTAL) uv_stop(bus_loop(bus));
}

static void test_router_backpressure(void **state) {
    (void)state;
    tmpdir_t t;
    tmp_make(&t);
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(t.dir, "rbp", ep, sizeof ep), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    rbp_t c = {0};
    c.router = bus_new(&loop, &(bus_opts_t){.kind = BUS_ROUTER, .sndhwm = 8,
                                            .outq_max_msgs = BP_QMAX});
    c.dealer = bus_new(&loop, &(bus_opts_t){.kind = BUS_DEALER, .identity = "rd", .rcvhwm = 8});
    assert_int_equal(bus_bind(c.router, ep), 0);
    assert_int_equal(bus_connect(c.dealer, ep), 0);
    bus_on_message(c.router, rbp_server, &c);
    bus_on_writable(c.router, rbp_writable, &c);
    bus_on_message(c.dealer, rbp_client, &c);
    assert_int_equal(bus_send(c.dealer, NULL, "hello", 5), 0);
    assert_int_equal(run_for(&loop, 20000), 0);
    assert_int_equal(c.bad, 0);
    assert_int_equal(c.next_recv, BP_TOTAL);
    assert_true(c.eagain >= 1);
    assert_int_equal(c.writable, c.eagain);
    bus_stats_t s;
    bus_stats(c.router, &s);
    assert_int_equal(s.msgs_out, BP_TOTAL);
    assert_int_equal(s.queued_msgs, 0);
    assert_true(s.queued_msgs_max == BP_QMAX);
    finish_loop(&loop, &c.router, &c.dealer);
    tmp_remove(&t);
}

/* ---- errors ------------------------------------------------------------------------------ */

static void test_errors(void **state) {
    (void)state;
    tmpdir_t t;
    tmp_make(&t);
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(t.dir, "err", ep, sizeof ep), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);

    assert_null(bus_new(&loop, &(bus_opts_t){.kind = BUS_ROUTER, .heartbeat_interval_ms = 100,
                                            .heartbeat_timeout_ms = 100}));
    assert_non_null(strstr(dl_errmsg(), "heartbeat"));
    assert_null(bus_new(&loop, &(bus_opts_t){.kind = BUS_PUB, .heartbeat_interval_ms = 10,
                                            .heartbeat_timeout_ms = 100}));
    assert_null(bus_new(&loop, &(bus_opts_t){.kind = BUS_ROUTER, .identity = "x"}));
    assert_null(bus_new(&loop, &(bus_opts_t){.kind = BUS_DEALER, .identity = "has space"}));
    assert_null(bus_new(&loop, &(bus_opts_t){.kind = 0}));

    bus_t *r = bus_new(&loop, &(bus_opts_t){.kind = BUS_ROUTER});
    bus_t *sub = bus_new(&loop, &(bus_opts_t){.kind = BUS_SUB});
    assert_non_null(r);
    assert_non_null(sub);
    assert_int_equal(bus_bind(r, ep), 0);
    assert_int_equal(bus_bind(r, "nonsense://x"), DL_EIO);
    assert_non_null(strstr(dl_errmsg(), "nonsense://x"));
    assert_int_equal(bus_send(r, "nobody", "x", 1), DL_ENOENT);
    assert_int_equal(bus_send(r, "bad id", "x", 1), DL_EINVAL);
    assert_int_equal(bus_send(r, NULL, "x", 1), DL_EINVAL);
    assert_int_equal(bus_send(sub, "t", "x", 1), DL_ENOTSUP);
    assert_int_equal(bus_subscribe(r, "t"), DL_ENOTSUP);
    bus_close(r, NULL, NULL);
    assert_true(bus_is_closing(r));
    assert_int_equal(bus_send(r, "nobody", "x", 1), DL_ECLOSED);
    finish_loop(&loop, &r, &sub);
    tmp_remove(&t);
}

/* ---- malformed input --------------------------------------------------------------------- */

typedef struct { int got; size_t len; char peer[BUS_ID_MAX + 1]; } mf_t;

static void mf_recv(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    mf_t *m = arg;
    m->got++;
    m->len = len;
    snprintf(m->peer, sizeof m->peer, "%s", peer);
}

static void raw_send(void *sock, int nframes, const void *const *f, const size_t *n) {
    for (int i = 0; i < nframes; i++)
        assert_true(zmq_send(sock, f[i], n[i], i + 1 < nframes ? ZMQ_SNDMORE : 0) >= 0);
}

static void test_malformed(void **state) {
    (void)state;
    tmpdir_t t;
    tmp_make(&t);
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(t.dir, "mf", ep, sizeof ep), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_t *r = bus_new(&loop, &(bus_opts_t){.kind = BUS_ROUTER});
    assert_int_equal(bus_bind(r, ep), 0);
    mf_t m = {0};
    bus_on_message(r, mf_recv, &m);

    /* Raw ZeroMQ peers that do not speak the bus envelope. */
    void *ctx = zmq_ctx_new();
    void *raw = zmq_socket(ctx, ZMQ_DEALER), *anon = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(raw, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(anon, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(raw, ZMQ_ROUTING_ID, "raw", 3);
    assert_int_equal(zmq_connect(raw, ep), 0);
    assert_int_equal(zmq_connect(anon, ep), 0);
    const unsigned char ok_env[4] = {0xDB, BUS_WIRE_VERSION, BUS_T_DATA, 0};
    const unsigned char bad_ver[4] = {0xDB, 9, BUS_T_DATA, 0};
    const unsigned char bad_type[4] = {0xDB, BUS_WIRE_VERSION, 7, 0};
    const unsigned char hb_env[4] = {0xDB, BUS_WIRE_VERSION, BUS_T_HEARTBEAT, 0};
    raw_send(raw, 1, (const void *[]){"junk"}, (size_t[]){4});                 /* bad magic */
    raw_send(raw, 1, (const void *[]){"xy"}, (size_t[]){2});                   /* short env */
    raw_send(raw, 2, (const void *[]){bad_ver, "p"}, (size_t[]){4, 1});
    raw_send(raw, 2, (const void *[]){bad_type, "p"}, (size_t[]){4, 1});
    raw_send(raw, 2, (const void *[]){hb_env, "p"}, (size_t[]){4, 1});         /* hb + payload */
    raw_send(raw, 4, (const void *[]){ok_env, "p", "q", "r"}, (size_t[]){4, 1, 1, 1});
    raw_send(anon, 2, (const void *[]){ok_env, "anon"}, (size_t[]){4, 4});      /* binary id */
    raw_send(raw, 2, (const void *[]){ok_env, "good"}, (size_t[]){4, 4});
    assert_int_equal(run_for(&loop, 300), 1);
    bus_stats_t s;
    bus_stats(r, &s);
    assert_int_equal(s.dropped_bad, 7);
    assert_int_equal(m.got, 1);
    assert_int_equal(m.len, 4);
    assert_string_equal(m.peer, "raw");
    assert_int_equal(s.msgs_in, 1);
    zmq_close(raw);
    zmq_close(anon);
    zmq_ctx_term(ctx);
    finish_loop(&loop, &r, NULL);
    tmp_remove(&t);
}

/* ---- PUB/SUB ----------------------------------------------------------------------------- */

typedef struct {
    bus_t *pub, *sub;
    int got_metrics, got_other, bad;
} ps_t;

static void ps_tick(bus_t *bus, void *arg) {
    ps_t *c = arg;
    if (bus_send(c->pub, "metrics.loader", "m", 1) != 0) c->bad++;
    if (bus_send(c->pub, "other", "o", 1) != 0) c->bad++;
}

static void ps_recv(bus_t *bus, const char *topic, const void *data, size_t len, void *arg) {
    ps_t *c = arg;
    if (strcmp(topic, "metrics.loader") == 0 && len == 1 && *(const char *)data == 'm') {
        if (++c->got_metrics == 3) uv_stop(bus_loop(bus));
    } else {
        c->got_other++;
    }
}

static void test_pubsub(void **state) {
    (void)state;
    tmpdir_t t;
    tmp_make(&t);
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(t.dir, "metrics", ep, sizeof ep), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    ps_t c = {0};
    c.pub = bus_new(&loop, &(bus_opts_t){.kind = BUS_PUB});
    c.sub = bus_new(&loop, &(bus_opts_t){.kind = BUS_SUB});
    assert_int_equal(bus_bind(c.pub, ep), 0);
    assert_int_equal(bus_subscribe(c.sub, "metrics."), 0);
    assert_int_equal(bus_connect(c.sub, ep), 0);
    bus_on_message(c.sub, ps_recv, &c);
    bus_timer_t *tick;
    assert_int_equal(bus_timer_start(c.pub, 5, 5, ps_tick, &c, &tick), 0);
    assert_int_equal(run_for(&loop, 5000), 0);
    assert_int_equal(c.bad, 0);
    assert_int_equal(c.got_metrics, 3);
    assert_int_equal(c.got_other, 0);
    bus_timer_stop(&tick);
    assert_null(tick);
    finish_loop(&loop, &c.pub, &c.sub);
    tmp_remove(&t);
}

/* ---- heartbeats in one process ----------------------------------------------------------- */

#define HB_IVL 30
#define HB_TO 300

typedef struct {
    int dead;
    char who[BUS_ID_MAX + 1];
    uint64_t silent_ms;
    uint64_t at_ns;
} hb_t;

static void hb_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg) {
    hb_t *h = arg;
    h->dead++;
    snprintf(h->who, sizeof h->who, "%s", peer);
    h->silent_ms = silent_ms;
    h->at_ns = clock_mono_ns();
}

static void test_heartbeat_local(void **state) {
    (void)state;
    tmpdir_t t;
    tmp_make(&t);
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(t.dir, "hb", ep, sizeof ep), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_opts_t o = {.kind = BUS_ROUTER, .heartbeat_interval_ms = HB_IVL,
                    .heartbeat_timeout_ms = HB_TO};
    bus_t *r = bus_new(&loop, &o);
    o.kind = BUS_DEALER;
    o.identity = "d1";
    bus_t *d = bus_new(&loop, &o);
    hb_t hr = {0}, hd = {0};
    bus_on_peer_dead(r, hb_dead, &hr);
    bus_on_peer_dead(d, hb_dead, &hd);
    assert_int_equal(bus_bind(r, ep), 0);
    assert_int_equal(bus_connect(d, ep), 0);

    /* Silent apart from heartbeats for 3 timeouts: nobody is reported dead. */
    assert_int_equal(run_for(&loop, 3 * HB_TO), 1);
    assert_int_equal(hr.dead, 0);
    assert_int_equal(hd.dead, 0);
    bus_stats_t s;
    bus_stats(r, &s);
    assert_int_equal(s.peers_alive, 1);
    assert_true(s.heartbeats_in >= 3 * HB_TO / HB_IVL / 2);
    bus_stats(d, &s);
    assert_true(s.heartbeats_in >= 3 * HB_TO / HB_IVL / 2);

    /* The dealer goes away: reported once, between timeout and timeout + interval after. */
    uint64_t t0 = clock_mono_ns();
    bus_destroy(&d);
    assert_int_equal(run_for(&loop, 3 * HB_TO), 1);
    assert_int_equal(hr.dead, 1);
    assert_string_equal(hr.who, "d1");
    assert_true(hr.silent_ms >= HB_TO);
    uint64_t detect_ms = (hr.at_ns - t0) / 1000000;
    /* The strict bound (timeout + interval) is held by test_bus_heartbeat across processes;
     * here both ends share one loop, so allow for a busy machine. */
    assert_true(detect_ms <= HB_TO + 2 * HB_IVL + 20);
    bus_stats(r, &s);
    assert_int_equal(s.peers_alive, 0);
    assert_int_equal(s.peers_dead, 1);

    /* The other way round: the dealer reports its upstream ("") dead when the router goes. */
    d = bus_new(&loop, &o);
    bus_on_peer_dead(d, hb_dead, &hd);
    assert_int_equal(bus_connect(d, ep), 0);
    assert_int_equal(run_for(&loop, 2 * HB_IVL), 1);
    /* a never-heard upstream is not dead (only "not up yet"): hear it first, as any
     * busy machine may take longer than 2 intervals */
    for (int i = 0; i < 100 && (bus_stats(d, &s), s.heartbeats_in == 0); i++) run_for(&loop, HB_IVL);
    bus_destroy(&r);
    assert_int_equal(run_for(&loop, 2 * HB_TO), 1);
    assert_int_equal(hd.dead, 1);
    assert_string_equal(hd.who, "");
    assert_int_equal(hr.dead, 1);
    finish_loop(&loop, &r, &d);
    tmp_remove(&t);
}

/* bus_peer_quiet: a one-shot client that goes away after being marked quiet is forgotten
 * without a dead report; one that keeps talking (heartbeats) is an ordinary peer again and is
 * reported when it dies. */
static void test_peer_quiet(void **state) {
    (void)state;
    tmpdir_t t;
    tmp_make(&t);
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(t.dir, "quiet", ep, sizeof ep), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_opts_t o = {.kind = BUS_ROUTER, .heartbeat_interval_ms = HB_IVL, .heartbeat_timeout_ms = HB_TO};
    bus_t *r = bus_new(&loop, &o);
    /* the one-shot client sends one message and no heartbeats (as a stage's config request),
     * so nothing of it can arrive after it is marked quiet */
    bus_opts_t once = {.kind = BUS_DEALER, .identity = "once"};
    bus_t *d = bus_new(&loop, &once);
    hb_t hr = {0};
    bus_on_peer_dead(r, hb_dead, &hr);
    assert_int_equal(bus_bind(r, ep), 0);
    assert_int_equal(bus_connect(d, ep), 0);
    assert_int_equal(bus_send(d, NULL, "x", 1), 0);
    assert_int_equal(run_for(&loop, 4 * HB_IVL), 1);
    bus_stats_t s;
    bus_stats(r, &s);
    assert_int_equal(s.peers_alive, 1);
    bus_peer_quiet(r, "once");
    bus_peer_quiet(r, "nobody");        /* unknown: no-op */
    bus_destroy(&d);
    assert_int_equal(run_for(&loop, 3 * HB_TO), 1);
    assert_int_equal(hr.dead, 0);
    bus_stats(r, &s);
    assert_int_equal(s.peers_alive, 0);
    assert_int_equal(s.peers_dead, 0);

    /* marked quiet but still talking: watched again, and its death is reported */
    o.kind = BUS_DEALER;
    o.identity = "talker";
    d = bus_new(&loop, &o);
    assert_int_equal(bus_connect(d, ep), 0);
    assert_int_equal(run_for(&loop, 4 * HB_IVL), 1);
    bus_peer_quiet(r, "talker");
    assert_int_equal(run_for(&loop, 2 * HB_TO), 1);
    assert_int_equal(hr.dead, 0);
    bus_destroy(&d);
    assert_int_equal(run_for(&loop, 3 * HB_TO), 1);
    assert_int_equal(hr.dead, 1);
    assert_string_equal(hr.who, "talker");
    finish_loop(&loop, &r, &d);
    tmp_remove(&t);
}

/* ---- timers ------------------------------------------------------------------------------ */

typedef struct {
    bus_timer_t *rep;
    int ticks, after_stop;
    int stopped;
} tm_t;

static void tm_tick(bus_t *bus, void *arg) {
    tm_t *c = arg;
    if (c->stopped) { c->after_stop++; return; }
    if (++c->ticks == 5) { bus_timer_stop(&c->rep); c->stopped = 1; }
}

static void tm_end(bus_t *bus, void *arg) { bus_close(bus, NULL, NULL); }

static void test_timers(void **state) {
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_t *b = bus_new(&loop, &(bus_opts_t){.kind = BUS_DEALER});
    assert_non_null(b);
    assert_int_equal(strncmp(bus_identity(b), "dl-", 3), 0);
    tm_t c = {0};
    bus_timer_t *once;
    assert_int_equal(bus_timer_start(b, 2, 2, tm_tick, &c, &c.rep), 0);
    assert_int_equal(bus_timer_start(b, 60, 0, tm_end, &c, &once), 0);
    uint64_t t0 = clock_mono_ns();
    uv_run(&loop, UV_RUN_DEFAULT);     /* returns once tm_end closed the bus */
    double ms = (double)(clock_mono_ns() - t0) * 1e-6;
    assert_true(ms >= 55 && ms < 2000);
    assert_int_equal(c.ticks, 5);
    assert_int_equal(c.after_stop, 0);
    assert_null(c.rep);
    assert_int_equal(bus_timer_start(b, 1, 0, tm_end, &c, &once), DL_ECLOSED);
    finish_loop(&loop, &b, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_dir),
        cmocka_unit_test(test_endpoint),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_backpressure),
        cmocka_unit_test(test_router_backpressure),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_pubsub),
        cmocka_unit_test(test_heartbeat_local),
        cmocka_unit_test(test_peer_quiet),
        cmocka_unit_test(test_timers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
