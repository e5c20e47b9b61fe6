/* common/bus over tcp:// with CURVE (curve.h, zap_int.h): the key file's checks, ROUTER/DEALER
 * with the run's keys, refusal of a client with another keypair or none (the ZAP handler), raw
 * TCP garbage, an oversized frame, tcp:// without keys, and the handler's reference count on a
 * shared context. Everything runs on 127.0.0.1 with bounded waits (uv_run NOWAIT + deadline). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/bus/bus.h"
#include "common/bus/zap_int.h"

/* ---- helpers ----------------------------------------------------------------------------- */

static char g_dir[64];

static void dir_make(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dlcurve-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
}

static void dir_remove(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    assert_int_equal(system(cmd), 0);
}

static void keys_make(const char *name, bus_curve_keys_t *k) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    assert_int_equal(bus_curve_keys_create(p, k), 0);
}

/* A TCP port free on 127.0.0.1 right now (bound to 0, read back, closed). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t n = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &n), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* Per-bus record of what arrived. */
typedef struct {
    int n;
    char last[64];
    char peer[BUS_ID_MAX + 1];
    int evil;                       /* messages whose payload starts with "evil" */
    int echo;                       /* ROUTER: answer every message with "re:<payload>" */
} rx_t;

static void on_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    rx_t *r = arg;
    r->n++;
    size_t c = len < sizeof r->last - 1 ? len : sizeof r->last - 1;
    memcpy(r->last, data, c);
    r->last[c] = 0;
    snprintf(r->peer, sizeof r->peer, "%s", peer);
    if (len >= 4 && memcmp(data, "evil", 4) == 0) r->evil++;
    if (r->echo && len < 60) {
        char buf[64];
        int n = snprintf(buf, sizeof buf, "re:%s", r->last);
        assert_int_equal(bus_send(bus, peer, buf, (size_t)n), 0);
    }
}

/* Runs the loop until *flag >= want or ms pass; returns 1 if reached. */
static int run_until(uv_loop_t *loop, const int *flag, int want, int ms) {
    uint64_t end = clock_mono_ns() + (uint64_t)ms * 1000000ull;
    while (clock_mono_ns() < end) {
        uv_run(loop, UV_RUN_NOWAIT);
        if (flag && *flag >= want) return 1;
        usleep(1000);
    }
    return flag && *flag >= want;
}

static bus_t *mk_bus(uv_loop_t *loop, bus_kind_t kind, const char *name, const bus_curve_keys_t *k,
                     void *ctx, size_t max_msg, rx_t *rx) {
    bus_opts_t o = {.kind = kind, .name = name, .curve = k, .zmq_ctx = ctx, .max_msg_bytes = max_msg};
    bus_t *b = bus_new(loop, &o);
    assert_non_null(b);
    if (rx) bus_on_message(b, on_msg, rx);
    return b;
}

/* Sends text from a DEALER and waits for the echo; returns 1 on "re:<text>" within ms. */
static int ping(uv_loop_t *loop, bus_t *dealer, rx_t *drx, const char *text, int ms) {
    int want = drx->n + 1;
    assert_int_equal(bus_send(dealer, NULL, text, strlen(text)), 0);
    if (!run_until(loop, &drx->n, want, ms)) return 0;
    char exp[64];
    snprintf(exp, sizeof exp, "re:%s", text);
    return strcmp(drx->last, exp) == 0;
}

static void close_all(uv_loop_t *loop, bus_t **bs, int n) {
    for (int i = 0; i < n; i++) bus_destroy(&bs[i]);
    run_until(loop, NULL, 0, 50);
    uv_run(loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(loop), 0);
}

/* ---- (a) the key file -------------------------------------------------------------------- */

static void write_file(const char *path, int mode, const char *text) {
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, mode);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(chmod(path, mode), 0);
}

static void test_key_file(void **state) {
    (void)state;
    dir_make();
    char p[128], q[128], text[512];
    bus_curve_keys_t k, l, other;
    snprintf(p, sizeof p, "%s/node.key", g_dir);
    assert_int_equal(bus_curve_keys_create(p, &k), 0);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(bus_curve_keys_load(p, &l), 0);
    assert_memory_equal(&k, &l, sizeof k);
    assert_int_equal(strlen(k.client_public), BUS_CURVE_KEY_CHARS);
    assert_string_not_equal(k.server_public, k.client_public);

    assert_int_equal(bus_curve_keys_create(p, &l), DL_EIO);            /* never overwritten */
    assert_int_equal(bus_curve_keys_load(p, &l), 0);
    assert_memory_equal(&k, &l, sizeof k);

    assert_int_equal(chmod(p, 0644), 0);
    assert_int_equal(bus_curve_keys_load(p, &l), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "0600"));
    assert_int_equal(chmod(p, 0600), 0);

    snprintf(q, sizeof q, "%s/missing.key", g_dir);
    assert_int_equal(bus_curve_keys_load(q, &l), DL_ENOENT);

    snprintf(q, sizeof q, "%s/link.key", g_dir);
    assert_int_equal(symlink(p, q), 0);
    assert_int_equal(bus_curve_keys_load(q, &l), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "symlink"));

    snprintf(q, sizeof q, "%s/bad.key", g_dir);
    snprintf(text, sizeof text, "server_public %s\nserver_secret %s\nclient_public %s\n",
             k.server_public, k.server_secret, k.client_public);
    write_file(q, 0600, text);                                          /* a key missing */
    assert_int_equal(bus_curve_keys_load(q, &l), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "client_secret"));

    char bad[BUS_CURVE_KEY_CHARS + 1];
    memcpy(bad, k.client_secret, sizeof bad);
    bad[7] = '~';                                                       /* not a Z85 char */
    snprintf(text, sizeof text, "server_public %s\nserver_secret %s\nclient_public %s\n"
             "client_secret %s\n", k.server_public, k.server_secret, k.client_public, bad);
    write_file(q, 0600, text);
    assert_int_equal(bus_curve_keys_load(q, &l), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "Z85"));
    snprintf(text, sizeof text, "server_public %s\nserver_secret %s\nclient_public %s\n"
             "client_secret %.39s\n", k.server_public, k.server_secret, k.client_public,
             k.client_secret);                                          /* 39 chars */
    write_file(q, 0600, text);
    assert_int_equal(bus_curve_keys_load(q, &l), DL_EINVAL);

    keys_make("other.key", &other);
    snprintf(text, sizeof text, "server_public %s\nserver_secret %s\nclient_public %s\n"
             "client_secret %s\n", k.server_public, k.server_secret, other.client_public,
             k.client_secret);                                          /* not its secret's */
    write_file(q, 0600, text);
    assert_int_equal(bus_curve_keys_load(q, &l), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "public key"));
    dir_remove();
}

/* ---- (b) round trip, (e) no keys --------------------------------------------------------- */

static void test_roundtrip(void **state) {
    (void)state;
    dir_make();
    bus_curve_keys_t k;
    keys_make("node.key", &k);
    uv_loop_t loop;
    uv_loop_init(&loop);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", free_port());
    rx_t srx = {.echo = 1}, crx = {0};
    bus_t *bs[2];
    bs[0] = mk_bus(&loop, BUS_ROUTER, "server", &k, NULL, 0, &srx);
    bs[1] = mk_bus(&loop, BUS_DEALER, "client", &k, NULL, 0, &crx);
    assert_int_equal(bus_bind(bs[0], ep), 0);
    assert_int_equal(bus_connect(bs[1], ep), 0);
    for (int i = 0; i < 20; i++) {
        char t[16];
        snprintf(t, sizeof t, "hello %d", i);
        assert_true(ping(&loop, bs[1], &crx, t, 3000));
    }
    assert_int_equal(srx.n, 20);
    assert_string_equal(srx.peer, bus_identity(bs[1]));
    close_all(&loop, bs, 2);

    /* PUB/SUB: the PUB is the CURVE server (behind the ZAP handler), the SUB the client. */
    uv_loop_init(&loop);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", free_port());
    rx_t subrx = {0};
    bs[0] = mk_bus(&loop, BUS_PUB, "pub", &k, NULL, 0, NULL);
    bs[1] = mk_bus(&loop, BUS_SUB, "sub", &k, NULL, 0, &subrx);
    assert_int_equal(bus_bind(bs[0], ep), 0);
    assert_int_equal(bus_connect(bs[1], ep), 0);
    assert_int_equal(bus_subscribe(bs[1], "metrics"), 0);
    for (int i = 0; i < 300 && subrx.n == 0; i++) {     /* a SUB joins late: publish until seen */
        assert_int_equal(bus_send(bs[0], "metrics", "m1", 2), 0);
        run_until(&loop, &subrx.n, 1, 10);
    }
    assert_true(subrx.n >= 1);
    assert_string_equal(subrx.peer, "metrics");
    assert_string_equal(subrx.last, "m1");
    close_all(&loop, bs, 2);
    dir_remove();
}

static void test_tcp_needs_keys(void **state) {
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_t *bs[2];
    bs[0] = mk_bus(&loop, BUS_ROUTER, "server", NULL, NULL, 0, NULL);
    bs[1] = mk_bus(&loop, BUS_DEALER, "client", NULL, NULL, 0, NULL);
    assert_int_equal(bus_bind(bs[0], "tcp://127.0.0.1:*"), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "CURVE"));
    assert_int_equal(bus_connect(bs[1], "tcp://127.0.0.1:5555"), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "CURVE"));
    assert_int_equal(bus_bind(bs[0], "udp://127.0.0.1:5555"), DL_EIO);    /* not a bus transport */
    assert_non_null(strstr(dl_errmsg(), "udp://"));
    close_all(&loop, bs, 2);
}

/* ---- (c) wrong key, no CURVE ------------------------------------------------------------- */

/* A plain (NULL mechanism) DEALER made with raw ZeroMQ that sends one bus-framed message. */
static void *raw_dealer(void *ctx, const char *ep) {
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, "plain", 5);
    assert_int_equal(zmq_connect(s, ep), 0);
    unsigned char env[4] = {0xDB, BUS_WIRE_VERSION, BUS_T_DATA, 0};
    assert_true(zmq_send(s, env, 4, ZMQ_SNDMORE | ZMQ_DONTWAIT) == 4);
    assert_true(zmq_send(s, "evil plain", 10, ZMQ_DONTWAIT) == 10);
    return s;
}

static void test_refuses_strangers(void **state) {
    (void)state;
    dir_make();
    bus_curve_keys_t k, k2;
    keys_make("node.key", &k);
    keys_make("other.key", &k2);
    bus_curve_keys_t rogue = k;          /* the real server public key, its own client pair */
    memcpy(rogue.client_public, k2.client_public, sizeof rogue.client_public);
    memcpy(rogue.client_secret, k2.client_secret, sizeof rogue.client_secret);
    rogue.server_secret[0] = 0;          /* a client never has it */
    void *ctx = zmq_ctx_new(), *rctx = zmq_ctx_new();
    uv_loop_t loop;
    uv_loop_init(&loop);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", free_port());
    rx_t srx = {.echo = 1}, crx = {0}, rrx = {0};
    bus_t *bs[3];
    bs[0] = mk_bus(&loop, BUS_ROUTER, "server", &k, ctx, 0, &srx);
    bs[1] = mk_bus(&loop, BUS_DEALER, "client", &k, NULL, 0, &crx);
    bs[2] = mk_bus(&loop, BUS_DEALER, "rogue", &rogue, NULL, 0, &rrx);
    assert_int_equal(bus_bind(bs[0], ep), 0);
    assert_int_equal(bus_connect(bs[1], ep), 0);
    assert_true(ping(&loop, bs[1], &crx, "before", 3000));

    int before = srx.n;
    assert_int_equal(bus_connect(bs[2], ep), 0);
    assert_int_equal(bus_send(bs[2], NULL, "evil curve", 10), 0);
    void *plain = raw_dealer(rctx, ep);
    run_until(&loop, NULL, 0, 1000);
    assert_int_equal(srx.n, before);     /* the server's callback never fired */
    assert_int_equal(rrx.n, 0);
    unsigned long long acc, ref;
    bus__zap_counts(ctx, &acc, &ref);
    assert_true(ref >= 1);               /* the handler said no, not a lost packet */
    assert_true(acc >= 1);
    assert_true(ping(&loop, bs[1], &crx, "after", 3000));
    assert_int_equal(srx.evil, 0);

    zmq_close(plain);
    close_all(&loop, bs, 3);
    assert_int_equal(zmq_ctx_term(ctx), 0);
    assert_int_equal(zmq_ctx_term(rctx), 0);
    dir_remove();
}

/* ---- (d) raw TCP garbage ----------------------------------------------------------------- */

static int tcp_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* 1 if the server closed fd within ms (EOF or reset), running the loop meanwhile. */
static int tcp_closed_by_peer(uv_loop_t *loop, int fd, int ms) {
    uint64_t end = clock_mono_ns() + (uint64_t)ms * 1000000ull;
    char buf[512];
    while (clock_mono_ns() < end) {
        uv_run(loop, UV_RUN_NOWAIT);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 1) == 1) {
            ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return 1;
        }
    }
    return 0;
}

/* ZMTP 3.0 greeting (signature, version, mechanism CURVE, as-server 0, filler). */
static void greeting(unsigned char g[64]) {
    memset(g, 0, 64);
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    memcpy(g + 12, "CURVE", 5);
}

static void test_tcp_garbage(void **state) {
    (void)state;
    dir_make();
    bus_curve_keys_t k;
    keys_make("node.key", &k);
    uv_loop_t loop;
    uv_loop_init(&loop);
    int port = free_port();
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    rx_t srx = {.echo = 1}, crx = {0};
    bus_t *bs[2];
    bs[0] = mk_bus(&loop, BUS_ROUTER, "server", &k, NULL, 0, &srx);
    bs[1] = mk_bus(&loop, BUS_DEALER, "client", &k, NULL, 0, &crx);
    assert_int_equal(bus_bind(bs[0], ep), 0);
    assert_int_equal(bus_connect(bs[1], ep), 0);
    assert_true(ping(&loop, bs[1], &crx, "first", 3000));

    unsigned char junk[4096];
    srand(1234);
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)rand();
    junk[0] = 0x01;                               /* not a ZMTP signature */
    int fd1 = tcp_connect(port);
    assert_int_equal(send(fd1, junk, sizeof junk, MSG_NOSIGNAL), (ssize_t)sizeof junk);
    assert_true(tcp_closed_by_peer(&loop, fd1, 2000));
    close(fd1);

    /* A valid greeting, then a command frame claiming 2^63 bytes. */
    unsigned char g[64 + 9];
    greeting(g);
    g[64] = 0x06;                                 /* command | long size */
    memset(g + 65, 0, 8);
    g[65] = 0x7F;
    memset(g + 66, 0xFF, 7);
    int fd2 = tcp_connect(port);
    assert_int_equal(send(fd2, g, sizeof g, MSG_NOSIGNAL), (ssize_t)sizeof g);
    assert_true(tcp_closed_by_peer(&loop, fd2, 2000));
    close(fd2);

    /* A garbage HELLO in a well-formed frame (the CURVE server must reject it). */
    unsigned char h[64 + 2 + 200];
    greeting(h);
    h[64] = 0x04;                                 /* command, short size */
    h[65] = 200;
    h[66] = 5;
    memcpy(h + 67, "HELLO", 5);
    memcpy(h + 72, junk, sizeof h - 72);
    int fd3 = tcp_connect(port);
    assert_int_equal(send(fd3, h, sizeof h, MSG_NOSIGNAL), (ssize_t)sizeof h);
    assert_true(tcp_closed_by_peer(&loop, fd3, 2000));
    close(fd3);

    /* Half-open: the greeting's first 10 bytes, then silence (dropped after the handshake
     * interval, 5 s: not waited for here); the server keeps serving meanwhile. */
    int fd4 = tcp_connect(port);
    assert_int_equal(send(fd4, g, 10, MSG_NOSIGNAL), 10);
    int fd5 = tcp_connect(port);                  /* connects and says nothing */
    for (int i = 0; i < 5; i++) {
        char t[16];
        snprintf(t, sizeof t, "still %d", i);
        assert_true(ping(&loop, bs[1], &crx, t, 3000));
    }
    close(fd4);
    close(fd5);
    assert_true(ping(&loop, bs[1], &crx, "last", 3000));
    close_all(&loop, bs, 2);
    dir_remove();
}

/* ---- (f) a frame over max_msg_bytes from an authenticated peer --------------------------- */

static void test_oversized_frame(void **state) {
    (void)state;
    dir_make();
    bus_curve_keys_t k;
    keys_make("node.key", &k);
    uv_loop_t loop;
    uv_loop_init(&loop);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", free_port());
    rx_t srx = {.echo = 1}, arx = {0}, brx = {0};
    bus_t *bs[3];
    bs[0] = mk_bus(&loop, BUS_ROUTER, "server", &k, NULL, 1024, &srx);
    bs[1] = mk_bus(&loop, BUS_DEALER, "big", &k, NULL, 1 << 20, &arx);
    bs[2] = mk_bus(&loop, BUS_DEALER, "other", &k, NULL, 0, &brx);
    assert_int_equal(bus_bind(bs[0], ep), 0);
    assert_int_equal(bus_connect(bs[1], ep), 0);
    assert_int_equal(bus_connect(bs[2], ep), 0);
    assert_true(ping(&loop, bs[1], &arx, "a", 3000));
    assert_true(ping(&loop, bs[2], &brx, "b", 3000));
    int before = srx.n;

    static char big[64 * 1024];
    memset(big, 'x', sizeof big);
    assert_int_equal(bus_send(bs[1], NULL, big, sizeof big), 0);
    run_until(&loop, NULL, 0, 300);
    assert_int_equal(srx.n, before);              /* never delivered */
    assert_true(ping(&loop, bs[2], &brx, "b2", 3000));
    /* The sender's connection was dropped, not the sender: it reconnects and is served. */
    assert_true(ping(&loop, bs[1], &arx, "a2", 5000));
    close_all(&loop, bs, 3);
    dir_remove();
}

/* ---- shared context: one handler, reference counted, ipc untouched ----------------------- */

static void test_shared_context(void **state) {
    (void)state;
    dir_make();
    bus_curve_keys_t k, k2;
    keys_make("node.key", &k);
    keys_make("other.key", &k2);
    bus_curve_keys_t rogue = k;
    memcpy(rogue.client_public, k2.client_public, sizeof rogue.client_public);
    memcpy(rogue.client_secret, k2.client_secret, sizeof rogue.client_secret);
    void *ctx = zmq_ctx_new();
    uv_loop_t loop;
    uv_loop_init(&loop);
    char ep1[64], ep2[64], ipc[128];
    snprintf(ep1, sizeof ep1, "tcp://127.0.0.1:%d", free_port());
    snprintf(ep2, sizeof ep2, "tcp://127.0.0.1:%d", free_port());
    assert_int_equal(bus_endpoint(g_dir, "local", ipc, sizeof ipc), 0);
    rx_t s1 = {.echo = 1}, s2 = {.echo = 1}, s3 = {.echo = 1}, c2 = {0}, c3 = {0}, r = {0};
    bus_t *bs[6];
    bs[0] = mk_bus(&loop, BUS_ROUTER, "s1", &k, ctx, 0, &s1);
    bs[1] = mk_bus(&loop, BUS_ROUTER, "s2", &k, ctx, 0, &s2);
    bs[2] = mk_bus(&loop, BUS_ROUTER, "s3", NULL, ctx, 0, &s3);      /* ipc, same context */
    bs[3] = mk_bus(&loop, BUS_DEALER, "c2", &k, ctx, 0, &c2);
    bs[4] = mk_bus(&loop, BUS_DEALER, "c3", NULL, ctx, 0, &c3);
    bs[5] = mk_bus(&loop, BUS_DEALER, "rogue", &rogue, NULL, 0, &r);
    bus_opts_t o = {.kind = BUS_ROUTER, .name = "s4", .curve = &k2, .zmq_ctx = ctx};
    assert_null(bus_new(&loop, &o));              /* another run's key on the same context */
    assert_non_null(strstr(dl_errmsg(), "another run's key"));
    assert_int_equal(bus_bind(bs[0], ep1), 0);
    assert_int_equal(bus_bind(bs[1], ep2), 0);
    assert_int_equal(bus_bind(bs[2], ipc), 0);
    bus_destroy(&bs[0]);                          /* one reference less: the handler stays */
    run_until(&loop, NULL, 0, 20);
    assert_int_equal(bus_connect(bs[3], ep2), 0);
    assert_int_equal(bus_connect(bs[4], ipc), 0);
    assert_int_equal(bus_connect(bs[5], ep2), 0);
    assert_int_equal(bus_send(bs[5], NULL, "evil", 4), 0);
    assert_true(ping(&loop, bs[3], &c2, "tcp", 3000));
    assert_true(ping(&loop, bs[4], &c3, "ipc", 3000));
    run_until(&loop, NULL, 0, 300);
    assert_int_equal(s2.evil, 0);
    unsigned long long acc, ref;
    bus__zap_counts(ctx, &acc, &ref);
    assert_true(ref >= 1);
    bus_destroy(&bs[1]);                          /* the last CURVE server: handler gone */
    run_until(&loop, NULL, 0, 20);
    bus__zap_counts(ctx, &acc, &ref);
    assert_true(acc == 0 && ref == 0);
    assert_true(ping(&loop, bs[4], &c3, "ipc again", 3000));
    close_all(&loop, bs, 6);
    assert_int_equal(zmq_ctx_term(ctx), 0);       /* returns: nothing of the handler is left */
    dir_remove();
}

int main(void) {
    alarm(60);      /* a hang is a failure, not a stuck run */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_file),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_tcp_needs_keys),
        cmocka_unit_test(test_refuses_strangers),
        cmocka_unit_test(test_tcp_garbage),
        cmocka_unit_test(test_oversized_frame),
        cmocka_unit_test(test_shared_context),
    };
    if (!bus_curve_available()) {
        printf("SKIP: this libzmq has no CURVE\n");
        return 77;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
