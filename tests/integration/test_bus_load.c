/* common/bus under load, two processes: a sender (DEALER) streams 1,000,000 small messages
 * (16 B..4 KiB) and 10,000 large ones (4 KiB+1..1 MiB), interleaved, to a receiver (ROUTER); one
 * direction plus acks. Each process runs one libuv loop with heartbeats on (a death reported under
 * load fails the test).
 *
 * Message i: [seq u64][size u32][crc32 u32][body], size and the large/small choice a pure function
 * of (seed, i) (rng_mix), body word k = splitmix64(rng_mix(seed, i, 2) + k * golden). The receiver
 * recomputes the schedule on its own and checks every message: the sender's id, seq == expected
 * (exactly once, in order), size against the schedule and the frame length, crc32 (zlib) over the
 * whole message, and the first, last and one random body word against the generator. It acks
 * every ACK_EVERY messages and at the end; the sender checks the acks and its own counts.
 * Figures: messages/s and MB/s (10^6 bytes of payload), from the receiver's first to last message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/bus/bus.h"
#include "tests/support/proc.h"

#define N_SMALL 1000000u
#define N_LARGE 10000u
#define N_TOTAL (N_SMALL + N_LARGE)
#define BLOCK (N_TOTAL / N_LARGE)       /* 101: one large message at a random slot per block */
#define SMALL_MIN 16u
#define SMALL_MAX 4096u
#define LARGE_MIN (SMALL_MAX + 1u)
#define LARGE_MAX (1u << 20)
#define HDR 16u
#define ACK_EVERY 4096u
#define SEED 0x5eedb05ull
#define HB_IVL_MS 100
#define HB_TIMEOUT_MS 5000
#define HARD_TIMEOUT_S 110
#define BATCH 256                       /* sends per loop iteration */

/* ---- schedule and content (both sides compute them independently) ---------------------- */

static uint32_t sched_size(uint64_t i, int *large) {
    uint64_t blk = i / BLOCK;
    *large = (i % BLOCK) == rng_mix(SEED, blk, 7) % BLOCK;
    uint64_t h = rng_mix(SEED, i, 1);
    if (*large) return LARGE_MIN + (uint32_t)(h % (LARGE_MAX - LARGE_MIN + 1));
    return SMALL_MIN + (uint32_t)(h % (SMALL_MAX - SMALL_MIN + 1));
}

static inline uint64_t body_word(uint64_t base, uint64_t k) {
    uint64_t z = base + k * 0x9E3779B97F4A7C15ull;   /* splitmix64 (Vigna) at counter k */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t msg_crc(const unsigned char *m, size_t size) {
    uLong c = crc32(0L, Z_NULL, 0);
    c = crc32(c, m, 12);
    if (size > HDR) c = crc32_z(c, m + HDR, size - HDR);
    return (uint32_t)c;
}

static void make_msg(unsigned char *m, uint64_t seq, uint32_t size) {
    uint64_t base = rng_mix(SEED, seq, 2);
    size_t nb = size - HDR, nw = nb / 8;
    unsigned char *body = m + HDR;
    for (size_t k = 0; k < nw; k++) {
        uint64_t w = body_word(base, k);
        memcpy(body + 8 * k, &w, 8);
    }
    if (nb % 8) {
        uint64_t w = body_word(base, nw);
        memcpy(body + 8 * nw, &w, nb % 8);
    }
    memcpy(m, &seq, 8);
    memcpy(m + 8, &size, 4);
    uint32_t crc = msg_crc(m, size);
    memcpy(m + 12, &crc, 4);
}

/* ---- results sent to the parent ---------------------------------------------------------- */

typedef struct {
    int ok;
    char err[200];
    uint64_t msgs, bytes, large, small;
    double seconds;
    bus_stats_t st;
} result_t;

static void res_fail(result_t *r, const char *fmt, ...) {
    if (!r->ok) return;    /* keep the first error */
    r->ok = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
}

typedef struct { uint64_t count, bytes; } ack_t;

/* ---- receiver (ROUTER) ------------------------------------------------------------------- */

typedef struct {
    bus_t *bus;
    result_t res;
    uint64_t t_first, t_last;
    rng_t pick;
} recv_ctx_t;

static void recv_done(recv_ctx_t *c) {
    bus_close(c->bus, NULL, NULL);
}

static void on_recv(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    recv_ctx_t *c = arg;
    result_t *r = &c->res;
    if (!r->ok) return;
    uint64_t seq = r->msgs;
    if (r->msgs == 0) c->t_first = clock_mono_ns();
    if (strcmp(peer, "sender") != 0) { res_fail(r, "message from unknown peer '%s'", peer); goto out; }
    if (len < HDR) { res_fail(r, "seq %llu: %zu bytes, shorter than the header", (unsigned long long)seq, len); goto out; }
    const unsigned char *m = data;
    uint64_t got_seq;
    uint32_t size, crc;
    memcpy(&got_seq, m, 8);
    memcpy(&size, m + 8, 4);
    memcpy(&crc, m + 12, 4);
    if (got_seq != seq) {
        res_fail(r, "expected seq %llu, got %llu (lost, duplicated or reordered)",
             (unsigned long long)seq, (unsigned long long)got_seq);
        goto out;
    }
    int large;
    uint32_t want = sched_size(seq, &large);
    if (size != want || len != want) {
        res_fail(r, "seq %llu: size field %u, frame %zu, schedule %u", (unsigned long long)seq, size,
             len, want);
        goto out;
    }
    if (msg_crc(m, len) != crc) { res_fail(r, "seq %llu: crc32 mismatch", (unsigned long long)seq); goto out; }
    size_t nw = (len - HDR) / 8;
    if (nw) {
        uint64_t base = rng_mix(SEED, seq, 2), w;
        size_t ks[3] = {0, nw - 1, rng_below(&c->pick, nw)};
        for (int j = 0; j < 3; j++) {
            memcpy(&w, m + HDR + 8 * ks[j], 8);
            if (w != body_word(base, ks[j])) {
                res_fail(r, "seq %llu: body word %zu differs from the generator", (unsigned long long)seq,
                     ks[j]);
                goto out;
            }
        }
    }
    r->msgs++;
    r->bytes += len;
    if (large) r->large++;
    else r->small++;
    if (r->msgs % ACK_EVERY == 0 || r->msgs == N_TOTAL) {
        ack_t a = {r->msgs, r->bytes};
        int rc = bus_send(bus, peer, &a, sizeof a);
        if (rc != 0) { res_fail(r, "ack send: %s: %s", dl_strerror(rc), dl_errmsg()); goto out; }
    }
    if (r->msgs == N_TOTAL) {
        c->t_last = clock_mono_ns();
        recv_done(c);
    }
    return;
out:
    recv_done(c);
}

static void on_dead_fail(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg) {
    result_t *r = arg;
    res_fail(r, "peer '%s' reported dead after %llu ms silence", peer, (unsigned long long)silent_ms);
    bus_close(bus, NULL, NULL);
}

static int receiver_main(void *arg, int report_fd) {
    const char *ep = arg;
    recv_ctx_t c;
    memset(&c, 0, sizeof c);
    c.res.ok = 1;
    rng_seed(&c.pick, 99);
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_opts_t o = {.kind = BUS_ROUTER, .name = "load-recv", .heartbeat_interval_ms = HB_IVL_MS,
                    .heartbeat_timeout_ms = HB_TIMEOUT_MS, .linger_ms = 2000};
    c.bus = bus_new(&loop, &o);
    if (!c.bus || bus_bind(c.bus, ep) != 0) {
        res_fail(&c.res, "receiver setup: %s", dl_errmsg());
        proc_report(report_fd, &c.res, sizeof c.res);
        return 2;
    }
    bus_on_message(c.bus, on_recv, &c);
    bus_on_peer_dead(c.bus, on_dead_fail, &c.res);
    uv_run(&loop, UV_RUN_DEFAULT);
    bus_stats(c.bus, &c.res.st);
    bus_destroy(&c.bus);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0) res_fail(&c.res, "receiver: handles left on the loop");
    if (c.res.ok && c.res.msgs != N_TOTAL) res_fail(&c.res, "receiver stopped at %llu messages",
                                                (unsigned long long)c.res.msgs);
    c.res.seconds = (double)(c.t_last - c.t_first) * 1e-9;
    proc_report(report_fd, &c.res, sizeof c.res);
    return c.res.ok ? 0 : 1;
}

/* ---- sender (DEALER) --------------------------------------------------------------------- */

typedef struct {
    bus_t *bus;
    uv_idle_t pump;
    int pumping;
    result_t res;
    unsigned char *buf;
    uint64_t next;          /* seq of the message in buf (built, not yet accepted) */
    int built;
    uint64_t acked, t0;
    uint64_t eagain_waits;
} send_ctx_t;

static void send_stop(send_ctx_t *c) {
    if (c->pumping) { uv_idle_stop(&c->pump); c->pumping = 0; }
    if (!uv_is_closing((uv_handle_t *)&c->pump)) uv_close((uv_handle_t *)&c->pump, NULL);
    bus_close(c->bus, NULL, NULL);
}

static void on_pump(uv_idle_t *h) {
    send_ctx_t *c = h->data;
    for (int k = 0; k < BATCH && c->next < N_TOTAL; k++) {
        int large;
        uint32_t size = sched_size(c->next, &large);
        if (!c->built) { make_msg(c->buf, c->next, size); c->built = 1; }
        int rc = bus_send(c->bus, NULL, c->buf, size);
        if (rc == DL_EAGAIN) {              /* queues full: wait for bus_writable_cb */
            c->eagain_waits++;
            uv_idle_stop(&c->pump);
            c->pumping = 0;
            return;
        }
        if (rc != 0) {
            res_fail(&c->res, "send seq %llu: %s: %s", (unsigned long long)c->next, dl_strerror(rc),
                 dl_errmsg());
            send_stop(c);
            return;
        }
        c->built = 0;
        c->next++;
        c->res.msgs++;
        c->res.bytes += size;
        if (large) c->res.large++;
        else c->res.small++;
    }
    if (c->next == N_TOTAL) { uv_idle_stop(&c->pump); c->pumping = 0; }
}

static void on_writable(bus_t *bus, void *arg) {
    send_ctx_t *c = arg;
    if (!c->pumping && c->next < N_TOTAL && !bus_is_closing(bus)) {
        uv_idle_start(&c->pump, on_pump);
        c->pumping = 1;
    }
}

static void on_ack(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    send_ctx_t *c = arg;
    ack_t a;
    if (len != sizeof a) { res_fail(&c->res, "ack of %zu bytes", len); send_stop(c); return; }
    memcpy(&a, data, sizeof a);
    if (a.count <= c->acked || a.count > c->next ||
        (a.count % ACK_EVERY != 0 && a.count != N_TOTAL)) {
        res_fail(&c->res, "bad ack count %llu (previous %llu, sent %llu)", (unsigned long long)a.count,
             (unsigned long long)c->acked, (unsigned long long)c->next);
        send_stop(c);
        return;
    }
    c->acked = a.count;
    if (a.count == N_TOTAL) {
        if (a.bytes != c->res.bytes)
            res_fail(&c->res, "receiver counted %llu bytes, sender sent %llu",
                 (unsigned long long)a.bytes, (unsigned long long)c->res.bytes);
        c->res.seconds = (double)(clock_mono_ns() - c->t0) * 1e-9;
        send_stop(c);
    }
}

static int sender_main(void *arg, int report_fd) {
    const char *ep = arg;
    send_ctx_t c;
    memset(&c, 0, sizeof c);
    c.res.ok = 1;
    c.buf = malloc(LARGE_MAX);
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_opts_t o = {.kind = BUS_DEALER, .name = "load-send", .identity = "sender",
                    .heartbeat_interval_ms = HB_IVL_MS, .heartbeat_timeout_ms = HB_TIMEOUT_MS,
                    .outq_max_msgs = 4096, .outq_max_bytes = 16u << 20};
    c.bus = bus_new(&loop, &o);
    if (!c.buf || !c.bus || bus_connect(c.bus, ep) != 0) {
        res_fail(&c.res, "sender setup: %s", dl_errmsg());
        proc_report(report_fd, &c.res, sizeof c.res);
        return 2;
    }
    bus_on_message(c.bus, on_ack, &c);
    bus_on_writable(c.bus, on_writable, &c);
    bus_on_peer_dead(c.bus, on_dead_fail, &c.res);
    uv_idle_init(&loop, &c.pump);
    c.pump.data = &c;
    uv_idle_start(&c.pump, on_pump);
    c.pumping = 1;
    c.t0 = clock_mono_ns();
    uv_run(&loop, UV_RUN_DEFAULT);
    bus_stats(c.bus, &c.res.st);
    bus_destroy(&c.bus);
    if (!uv_is_closing((uv_handle_t *)&c.pump)) uv_close((uv_handle_t *)&c.pump, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0) res_fail(&c.res, "sender: handles left on the loop");
    if (c.res.ok && c.acked != N_TOTAL) res_fail(&c.res, "sender: final ack missing (acked %llu)",
                                             (unsigned long long)c.acked);
    free(c.buf);
    proc_report(report_fd, &c.res, sizeof c.res);
    return c.res.ok ? 0 : 1;
}

/* ---- the test ---------------------------------------------------------------------------- */

static void test_bus_load(void **state) {
    (void)state;
    /* The schedule itself: exactly N_LARGE large messages, sizes in range. */
    uint64_t nl = 0;
    for (uint64_t i = 0; i < N_TOTAL; i++) {
        int large;
        uint32_t s = sched_size(i, &large);
        nl += (uint64_t)large;
        assert_true(large ? (s >= LARGE_MIN && s <= LARGE_MAX) : (s >= SMALL_MIN && s <= SMALL_MAX));
    }
    assert_int_equal(nl, N_LARGE);

    char dir[] = "/tmp/dlbusload-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char run[64], ep[BUS_ENDPOINT_MAX];
    snprintf(run, sizeof run, "%s/run", dir);
    assert_int_equal(bus_run_dir_create(run), 0);
    assert_int_equal(bus_endpoint(run, "load", ep, sizeof ep), 0);

    proc_watchdog(HARD_TIMEOUT_S);
    proc_t recv, send;
    uint64_t t0 = clock_mono_ns();
    assert_int_equal(proc_spawn(&recv, "receiver", receiver_main, ep), 0);
    assert_int_equal(proc_spawn(&send, "sender", sender_main, ep), 0);
    result_t rr, sr;
    memset(&rr, 0, sizeof rr);
    memset(&sr, 0, sizeof sr);
    int rc_r = proc_read(&recv, &rr, sizeof rr, (HARD_TIMEOUT_S - 10) * 1000);
    if (rc_r != 0) printf("receiver: %s\n", dl_errmsg());
    int rc_s = proc_read(&send, &sr, sizeof sr, 10000);
    if (rc_s != 0) printf("sender: %s\n", dl_errmsg());
    int code_r = -1, code_s = -1;
    proc_wait(&recv, 5000, &code_r);
    proc_wait(&send, 5000, &code_s);
    proc_kill(&recv);
    proc_kill(&send);
    proc_watchdog(0);
    double wall = (double)(clock_mono_ns() - t0) * 1e-9;
    if (!rr.ok) printf("receiver error: %s\n", rr.err);
    if (!sr.ok) printf("sender error: %s\n", sr.err);

    printf("bus load: %llu messages (%llu small, %llu large), %.1f MB, receiver %.2f s: "
           "%.0f messages/s, %.1f MB/s; sender until final ack %.2f s; wall %.2f s\n",
           (unsigned long long)rr.msgs, (unsigned long long)rr.small, (unsigned long long)rr.large,
           (double)rr.bytes / 1e6, rr.seconds, (double)rr.msgs / rr.seconds,
           (double)rr.bytes / 1e6 / rr.seconds, sr.seconds, wall);
    printf("bus load: sender queued %llu messages (max %zu at once), %llu DL_EAGAIN waits; "
           "heartbeats out %llu/%llu in %llu/%llu (send/recv)\n",
           (unsigned long long)sr.st.queued_total, sr.st.queued_msgs_max,
           (unsigned long long)sr.st.send_eagain, (unsigned long long)sr.st.heartbeats_out,
           (unsigned long long)rr.st.heartbeats_out, (unsigned long long)sr.st.heartbeats_in,
           (unsigned long long)rr.st.heartbeats_in);

    assert_int_equal(rc_r, 0);
    assert_int_equal(rc_s, 0);
    assert_true(rr.ok);
    assert_true(sr.ok);
    assert_int_equal(code_r, 0);
    assert_int_equal(code_s, 0);
    assert_int_equal(rr.msgs, N_TOTAL);
    assert_int_equal(rr.small, N_SMALL);
    assert_int_equal(rr.large, N_LARGE);
    assert_int_equal(sr.msgs, N_TOTAL);
    assert_int_equal(rr.bytes, sr.bytes);
    assert_int_equal(rr.st.msgs_in, N_TOTAL);
    assert_int_equal(rr.st.dropped_bad, 0);
    assert_int_equal(sr.st.msgs_out, N_TOTAL);
    assert_int_equal(sr.st.peers_dead, 0);
    assert_int_equal(rr.st.peers_dead, 0);
    assert_true(rr.st.heartbeats_in > 0 && sr.st.heartbeats_in > 0);

    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bus_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
