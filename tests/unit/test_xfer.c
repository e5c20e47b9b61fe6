/* common/pipe/xfer: slab bytes as slab_data chunks, then the announcement, over two buses
 * (ipc://, one loop):
 *  - a DEALER sends two ranges (10 MiB in 3 chunks, then 5 bytes) each followed by its
 *    announcement; the ROUTER receives exact bytes, every chunk before its announcement;
 *    and back from the ROUTER to the DEALER's peer id;
 *  - the DL_EAGAIN path: nobody bound yet, sndhwm 1, outq_max_bytes 5 MiB: the job stays
 *    pending until the peer binds and bus_on_writable resumes it; FIFO with a second job;
 *  - refusals: wrong owner, incarnation, slab id, range outside the slab or the window,
 *    unknown destination; each named, counted, nothing copied.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/bus/bus.h"
#include "common/pipe/xfer.h"
#include "proto/codec.h"

#define BIG (10u << 20)

typedef struct {
    uv_loop_t loop;
    bus_t *router, *dealer;
    xfer_t *tx;                /* on the sending bus */
    xfer_rx_t rx;
    uint8_t *src, *dst;        /* BIG bytes each */
    xfer_dest_t dest;
    int anns, bad, done_ok, done_calls;
    uint64_t bytes_at_ann[4];  /* rx.bytes_in when each announcement arrived */
    uint64_t bytes_out;
    int stop_after;
} cx_t;

static char g_dir[64];

static void on_guard(uv_timer_t *t) { uv_stop(t->loop); }

static void run_until(cx_t *c, uint64_t ms) {
    uv_timer_t g;
    uv_timer_init(&c->loop, &g);
    uv_timer_start(&g, on_guard, ms, 0);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&g, NULL);
    uv_run(&c->loop, UV_RUN_NOWAIT);
}

static void on_recv(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    cx_t *c = arg;
    proto_msg_t m;
    if (proto_decode(data, len, &m) < 0) { c->bad++; return; }
    if (m.type == PROTO_SLAB_DATA) {
        if (xfer_recv(&c->rx, "test", peer, &m.slab_data, &c->dest) < 0) c->bad++;
    } else if (m.type == PROTO_WEIGHTS_VERSION) {
        if (c->anns < 4) c->bytes_at_ann[c->anns] = c->rx.bytes_in;
        c->anns++;
        if (c->anns == c->stop_after) uv_stop(bus_loop(bus));
    } else {
        c->bad++;
    }
    proto_msg_free(&m);
}

static void on_done(xfer_t *x, int status, void *arg) {
    cx_t *c = arg;
    (void)x;
    c->done_calls++;
    c->done_ok += status == 0;
}

static void on_writable(bus_t *bus, void *arg) {
    (void)bus;
    xfer_resume(((cx_t *)arg)->tx);
}

static void announce(proto_msg_t *m, uint64_t version) {
    proto_msg_init(m, PROTO_WEIGHTS_VERSION);
    m->weights_version.version = version;
    m->weights_version.slab_id = 1;
    m->weights_version.bytes = 4;
    m->weights_version.n_params = 1;
    m->weights_version.dtype = PROTO_DTYPE_F32;
}

/* router + dealer on g_dir/x.sock; dealer_opts may set the queue limits. The dealer
 * connects first; the router binds when bind_now. */
static void cx_open(cx_t *c, const bus_opts_t *dealer_opts, int bind_now, char *ep, size_t cap) {
    memset(c, 0, sizeof *c);
    snprintf(g_dir, sizeof g_dir, "/tmp/dlxfer-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    assert_int_equal(bus_endpoint(g_dir, "x", ep, cap), 0);
    uv_loop_init(&c->loop);
    bus_opts_t d = dealer_opts ? *dealer_opts : (bus_opts_t){0};
    d.kind = BUS_DEALER;
    d.identity = "drafter1";
    c->dealer = bus_new(&c->loop, &d);
    c->router = bus_new(&c->loop, &(bus_opts_t){.kind = BUS_ROUTER});
    assert_non_null(c->dealer);
    assert_non_null(c->router);
    assert_int_equal(bus_connect(c->dealer, ep), 0);
    if (bind_now) assert_int_equal(bus_bind(c->router, ep), 0);
    c->src = malloc(BIG);
    c->dst = calloc(1, BIG);
    assert_non_null(c->src);
    assert_non_null(c->dst);
    for (size_t i = 0; i < BIG; i++) c->src[i] = (uint8_t)(i * 2654435761u >> 13);
    c->dest = (xfer_dest_t){.owner_id = 101, .owner_inc = 3, .slab_id = 7, .base = c->dst, .bytes = BIG};
}

static void cx_close(cx_t *c) {
    xfer_destroy(&c->tx);
    assert_null(c->tx);
    bus_destroy(&c->router);
    bus_destroy(&c->dealer);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&c->loop), 0);
    free(c->src);
    free(c->dst);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    assert_int_equal(system(cmd), 0);
}

static void test_order_and_bytes(void **state) {
    (void)state;
    cx_t c;
    char ep[BUS_ENDPOINT_MAX];
    cx_open(&c, NULL, 1, ep, sizeof ep);
    bus_on_message(c.router, on_recv, &c);
    c.tx = xfer_new(c.dealer, &c.bytes_out);
    assert_non_null(c.tx);
    c.stop_after = 2;
    proto_msg_t m;
    announce(&m, 1);
    xfer_range_t r = {101, 3, 7, 0};
    /* 10 MiB from offset 0 (chunks 4 + 4 + 2 MiB), then 5 bytes at BIG - 5 */
    assert_int_equal(xfer_send(c.tx, NULL, &r, c.src, BIG - 5, &m, on_done, &c), 0);
    r.offset = BIG - 5;
    announce(&m, 2);
    assert_int_equal(xfer_send(c.tx, NULL, &r, c.src + BIG - 5, 5, &m, on_done, &c), 0);
    run_until(&c, 20000);
    assert_int_equal(c.bad, 0);
    assert_int_equal(c.anns, 2);
    assert_int_equal(c.bytes_at_ann[0], BIG - 5);    /* every chunk before its announcement */
    assert_int_equal(c.bytes_at_ann[1], BIG);
    assert_int_equal(c.rx.chunks_in, 4);
    assert_int_equal(c.done_calls, 2);
    assert_int_equal(c.done_ok, 2);
    assert_int_equal(c.bytes_out, BIG);
    assert_int_equal(xfer_pending(c.tx), 0);
    assert_memory_equal(c.dst, c.src, BIG);

    /* back: ROUTER -> the DEALER's peer id */
    xfer_destroy(&c.tx);
    c.tx = xfer_new(c.router, NULL);
    bus_on_message(c.dealer, on_recv, &c);
    memset(c.dst, 0, BIG);
    c.rx = (xfer_rx_t){0};
    c.anns = 0;
    c.stop_after = 1;
    r.offset = 4096;
    announce(&m, 3);
    assert_int_equal(xfer_send(c.tx, "drafter1", &r, c.src + 4096, (5u << 20) + 3, &m, NULL, NULL), 0);
    run_until(&c, 20000);
    assert_int_equal(c.bad, 0);
    assert_int_equal(c.anns, 1);
    assert_int_equal(c.bytes_at_ann[0], (5u << 20) + 3);
    assert_memory_equal(c.dst + 4096, c.src + 4096, (5u << 20) + 3);
    assert_int_equal(c.dst[4095], 0);
    /* a peer that is not connected: the job ends with DL_ENOENT, nothing announced */
    c.done_calls = c.done_ok = 0;
    assert_int_equal(xfer_send(c.tx, "nobody", &r, c.src, 10, &m, on_done, &c), 0);
    assert_int_equal(c.done_calls, 1);
    assert_int_equal(c.done_ok, 0);
    assert_int_equal(xfer_pending(c.tx), 0);
    /* bad arguments */
    assert_int_equal(xfer_send(c.tx, "drafter1", &r, c.src, 0, &m, NULL, NULL), DL_EINVAL);
    cx_close(&c);
}

static void test_eagain_resume(void **state) {
    (void)state;
    cx_t c;
    char ep[BUS_ENDPOINT_MAX];
    bus_opts_t o = {.sndhwm = 1, .outq_max_bytes = 5u << 20};
    cx_open(&c, &o, 0, ep, sizeof ep);
    bus_on_message(c.router, on_recv, &c);
    c.tx = xfer_new(c.dealer, &c.bytes_out);
    bus_on_writable(c.dealer, on_writable, &c);
    c.stop_after = 2;
    proto_msg_t m;
    announce(&m, 1);
    xfer_range_t r = {101, 3, 7, 0};
    assert_int_equal(xfer_send(c.tx, NULL, &r, c.src, BIG, &m, on_done, &c), 0);
    /* nobody bound: ZeroMQ holds one chunk, the bus queue one, the rest waits here */
    assert_int_equal(xfer_pending(c.tx), 1);
    assert_int_equal(c.done_calls, 0);
    assert_true(c.bytes_out < BIG);
    bus_stats_t s;
    bus_stats(c.dealer, &s);
    assert_true(s.send_eagain >= 1);
    /* a second job queues behind the first (FIFO), its bytes after the first's */
    announce(&m, 2);
    r.offset = 100;
    assert_int_equal(xfer_send(c.tx, NULL, &r, c.src, 50, &m, on_done, &c), 0);
    assert_int_equal(xfer_pending(c.tx), 2);
    assert_int_equal(bus_bind(c.router, ep), 0);
    run_until(&c, 30000);
    assert_int_equal(c.bad, 0);
    assert_int_equal(c.anns, 2);
    assert_int_equal(c.bytes_at_ann[0], BIG);
    assert_int_equal(c.bytes_at_ann[1], BIG + 50);
    assert_int_equal(c.done_ok, 2);
    assert_int_equal(xfer_pending(c.tx), 0);
    /* the second job rewrote [100, 150) with src[0, 50) */
    assert_memory_equal(c.dst, c.src, 100);
    assert_memory_equal(c.dst + 100, c.src, 50);
    assert_memory_equal(c.dst + 150, c.src + 150, BIG - 150);
    cx_close(&c);
}

static void test_refusals(void **state) {
    (void)state;
    uint8_t slab[256] = {0}, data[32];
    memset(data, 0xAB, sizeof data);
    xfer_dest_t d = {.owner_id = 101, .owner_inc = 3, .slab_id = 7, .base = slab, .bytes = sizeof slab,
                     .win_off = 64, .win_bytes = 64};
    proto_slab_data_t ok = {.owner_id = 101, .owner_inc = 3, .slab_id = 7, .offset = 64, .data = data, .n_data = 32};
    xfer_rx_t rx = {0};
    assert_int_equal(xfer_recv(&rx, "test", "target0", &ok, &d), 0);
    assert_int_equal(rx.bytes_in, 32);
    assert_int_equal(slab[64], 0xAB);
    assert_int_equal(slab[63], 0);
    static const struct { int field; uint64_t v; const char *says; int rc; } bad[] = {
        {0, 102, "owner 102", DL_EPROTO},
        {1, 2, "incarnation 2", DL_EPROTO},
        {2, 8, "slab id 8", DL_EPROTO},
        {3, 240, "outside the slab", DL_EPROTO},
        {3, 32, "outside the window", DL_EPROTO},
        {3, 112, "outside the window", DL_EPROTO},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        proto_slab_data_t x = ok;
        if (bad[i].field == 0) x.owner_id = (uint32_t)bad[i].v;
        if (bad[i].field == 1) x.owner_inc = bad[i].v;
        if (bad[i].field == 2) x.slab_id = (uint32_t)bad[i].v;
        if (bad[i].field == 3) x.offset = bad[i].v;
        memset(slab, 0, sizeof slab);
        assert_int_equal(xfer_recv(&rx, "test", "target0", &x, &d), bad[i].rc);
        if (!strstr(dl_errmsg(), bad[i].says)) printf("case %zu: '%s'\n", i, dl_errmsg());
        assert_non_null(strstr(dl_errmsg(), bad[i].says));
        for (size_t k = 0; k < sizeof slab; k++) assert_int_equal(slab[k], 0);
    }
    assert_int_equal(rx.refused, sizeof bad / sizeof bad[0]);
    assert_int_equal(rx.bytes_in, 32);
    assert_int_equal(xfer_recv(&rx, "test", "target0", &ok, NULL), DL_ENOENT);
    assert_non_null(strstr(dl_errmsg(), "not known here"));
    /* the whole slab when no window is given */
    d.win_bytes = 0;
    ok.offset = 224;
    assert_int_equal(xfer_check(&ok, &d), 0);
    xfer_refuse(&rx, "test", "target0", &ok, "no slot granted to it");
    assert_int_equal(rx.refused, sizeof bad / sizeof bad[0] + 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_bytes),
        cmocka_unit_test(test_eagain_resume),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
