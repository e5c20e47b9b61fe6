/* common/bus: CURVE socket options and the per-context ZAP handler. See zap_int.h. */
#include "common/bus/zap_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/base/err.h"
#include "common/base/log.h"

#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93      /* draft option of libzmq 4.3; refused (EINVAL) without it */
#endif

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"   /* fixed by RFC 27 */
#define ZAP_FRAMES_MAX 12              /* id, delimiter, 6 request frames, credentials; more: malformed */
#define ZAP_DRAIN_BUDGET 256           /* requests per wake-up before yielding to the loop */
#define ZAP_ADDR_MAX 64

struct bus_zap {
    void *ctx;                         /* the context it serves (not owned) */
    uv_loop_t *loop;
    void *sock;                        /* ROUTER bound on ZAP_ENDPOINT */
    int fd;
    uv_poll_t poll;
    uv_idle_t idle;                    /* continues a drain that ran out of budget */
    int idle_on, closing, pending;
    int refs;                          /* CURVE server buses using it */
    unsigned char key[32];             /* the run's client public key, binary */
    char logged[BUS_ZAP_LOGGED_MAX][ZAP_ADDR_MAX];
    int nlogged;
    unsigned long long accepted, refused;
    bus_zap_t *next;
};

/* The handlers of this process, one per context. libzmq's ZAP endpoint is itself per-context
 * state shared by every socket of the context, so its owner has to be found from the context;
 * the mutex covers buses of different threads (each on its own loop and context). */
static pthread_mutex_t zap_mu = PTHREAD_MUTEX_INITIALIZER;
static bus_zap_t *zap_list;

/* ---- one request ------------------------------------------------------------------------- */

static int frame_is(zmq_msg_t *m, const char *s) {
    size_t n = strlen(s);
    return zmq_msg_size(m) == n && memcmp(zmq_msg_data(m), s, n) == 0;
}

static void log_refusal(bus_zap_t *z, zmq_msg_t *addr, const char *why) {
    char a[ZAP_ADDR_MAX];
    size_t n = zmq_msg_size(addr) < sizeof a - 1 ? zmq_msg_size(addr) : sizeof a - 1;
    memcpy(a, zmq_msg_data(addr), n);
    a[n] = 0;
    for (int i = 0; i < z->nlogged; i++)
        if (strcmp(z->logged[i], a) == 0) return;
    if (z->nlogged == BUS_ZAP_LOGGED_MAX) return;     /* bounded: a scan cannot grow it */
    memcpy(z->logged[z->nlogged++], a, n + 1);
    log_warn("bus: refused a connection from %s: %s%s", a, why,
             z->nlogged == BUS_ZAP_LOGGED_MAX ? " (further addresses not logged)" : "");
}

/* Sends the reply [id][""]["1.0"][request id][code][text][""][""]. */
static void reply(bus_zap_t *z, zmq_msg_t *id, zmq_msg_t *req_id, const char *code, const char *text) {
    const void *data[8] = {zmq_msg_data(id), "", "1.0", zmq_msg_data(req_id), code, text, "", ""};
    size_t len[8] = {zmq_msg_size(id), 0, 3, zmq_msg_size(req_id), 3, strlen(text), 0, 0};
    for (int i = 0; i < 8; i++) {
        int rc;
        do rc = zmq_send(z->sock, data[i], len[i], ZMQ_DONTWAIT | (i < 7 ? ZMQ_SNDMORE : 0));
        while (rc < 0 && errno == EINTR);
        if (rc < 0) {   /* the asking session is gone (its pipe closed): nothing to answer */
            log_debug("bus: ZAP reply: %s", zmq_strerror(errno));
            return;
        }
    }
}

/* Frames: [0] routing id, [1] "", [2] version, [3] request id, [4] domain, [5] address,
 * [6] identity, [7] mechanism, [8..] credentials (CURVE: the client's 32-byte public key). */
static void answer(bus_zap_t *z, zmq_msg_t *f, int n) {
    if (n < 8 || zmq_msg_size(&f[1]) != 0) {
        log_debug("bus: malformed ZAP request (%d frames) ignored", n);
        return;
    }
    if (!frame_is(&f[2], "1.0")) { reply(z, &f[0], &f[3], "400", "bad ZAP version"); return; }
    if (!frame_is(&f[4], BUS_ZAP_DOMAIN)) {
        /* Not a socket that asked for authentication (no or another ZAP domain): libzmq would
         * have let it in without a handler, so the handler must not change that. */
        reply(z, &f[0], &f[3], "200", "OK");
        return;
    }
    const char *why = NULL;
    if (!frame_is(&f[7], "CURVE")) why = "not a CURVE handshake";
    else if (n != 9 || zmq_msg_size(&f[8]) != sizeof z->key ||
             memcmp(zmq_msg_data(&f[8]), z->key, sizeof z->key) != 0)
        why = "not the run's key";
    if (why) {
        z->refused++;
        log_refusal(z, &f[5], why);
        reply(z, &f[0], &f[3], "400", why);
    } else {
        z->accepted++;
        reply(z, &f[0], &f[3], "200", "OK");
    }
}

/* Receives and answers one request. Returns 1 if one was taken, 0 on EAGAIN. */
static int zap_one(bus_zap_t *z) {
    zmq_msg_t f[ZAP_FRAMES_MAX];
    int n = 0, rc, more = 1, extra = 0;
    while (more) {
        zmq_msg_t tmp, *m = n < ZAP_FRAMES_MAX ? &f[n] : &tmp;
        zmq_msg_init(m);
        do rc = zmq_msg_recv(m, z->sock, n == 0 ? ZMQ_DONTWAIT : 0);
        while (rc < 0 && errno == EINTR);
        if (rc < 0) {
            int e = errno;
            zmq_msg_close(m);
            if (n == 0) {
                if (e != EAGAIN) log_warn("bus: ZAP handler recv: %s", zmq_strerror(e));
                return 0;
            }
            break;
        }
        more = zmq_msg_more(m);
        if (m == &tmp) { zmq_msg_close(&tmp); extra = 1; }
        else n++;
    }
    if (extra) log_debug("bus: ZAP request with over %d frames ignored", ZAP_FRAMES_MAX);
    else answer(z, f, n);
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
    return 1;
}

/* ---- the loop side ----------------------------------------------------------------------- */

static void zap_pump(bus_zap_t *z);
static void on_zap_idle(uv_idle_t *h) { zap_pump(h->data); }
static void on_zap_poll(uv_poll_t *h, int status, int events) {
    (void)events;
    if (status < 0) log_warn("bus: ZAP handler poll: %s", uv_strerror(status));
    zap_pump(h->data);
}

/* Edge-triggered ZMQ_FD, as in bus_pump: receive until EAGAIN, then ZMQ_EVENTS (which re-arms
 * the fd; the replies we sent may have consumed the edge) until it has no POLLIN. */
static void zap_pump(bus_zap_t *z) {
    if (z->closing) return;
    int budget = ZAP_DRAIN_BUDGET;
    for (;;) {
        while (budget > 0 && zap_one(z)) budget--;
        if (budget == 0) break;
        uint32_t ev = 0;
        size_t sz = sizeof ev;
        if (zmq_getsockopt(z->sock, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN)) break;
    }
    if (budget == 0 && !z->idle_on) { uv_idle_start(&z->idle, on_zap_idle); z->idle_on = 1; }
    else if (budget > 0 && z->idle_on) { uv_idle_stop(&z->idle); z->idle_on = 0; }
}

static void on_zap_closed(uv_handle_t *h) {
    bus_zap_t *z = h->data;
    if (--z->pending == 0) free(z);
}

/* Creates the handler of ctx on loop (caller holds zap_mu). */
static int zap_create(void *ctx, uv_loop_t *loop, const unsigned char key[32], const char *name,
                      bus_zap_t **out) {
    bus_zap_t *z = calloc(1, sizeof *z);
    if (!z) return dl_seterr(DL_ENOMEM, "bus %s: ZAP handler", name);
    z->ctx = ctx;
    z->loop = loop;
    memcpy(z->key, key, sizeof z->key);
    int linger = 0;
    size_t sz = sizeof z->fd;
    z->sock = zmq_socket(ctx, ZMQ_ROUTER);
    if (!z->sock || zmq_setsockopt(z->sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_bind(z->sock, ZAP_ENDPOINT) != 0 || zmq_getsockopt(z->sock, ZMQ_FD, &z->fd, &sz) != 0) {
        int e = errno;
        if (z->sock) zmq_close(z->sock);
        free(z);
        return dl_seterr(DL_EIO, "bus %s: ZAP handler on %s: %s%s", name, ZAP_ENDPOINT, zmq_strerror(e),
                         e == EADDRINUSE ? " (the context has a ZAP handler not made by the bus)" : "");
    }
    int rc = uv_poll_init(loop, &z->poll, z->fd);
    if (rc < 0) {
        zmq_close(z->sock);
        free(z);
        return dl_seterr(DL_EIO, "bus %s: ZAP handler: uv_poll_init: %s", name, uv_strerror(rc));
    }
    z->poll.data = z;
    uv_idle_init(loop, &z->idle);
    z->idle.data = z;
    uv_poll_start(&z->poll, UV_READABLE, on_zap_poll);
    /* The fd may already be signalled (consumed by the setup calls): look once. */
    uv_idle_start(&z->idle, on_zap_idle);
    z->idle_on = 1;
    *out = z;
    return 0;
}

static int zap_acquire(void *ctx, uv_loop_t *loop, const char *client_public, const char *name,
                       bus_zap_t **out) {
    unsigned char key[32];
    if (!zmq_z85_decode(key, client_public))
        return dl_seterr(DL_EINVAL, "bus %s: the client public key is not Z85", name);
    pthread_mutex_lock(&zap_mu);
    int rc = 0;
    bus_zap_t *z = zap_list;
    while (z && z->ctx != ctx) z = z->next;
    if (z && z->loop != loop)
        rc = dl_seterr(DL_ESTATE, "bus %s: its ZeroMQ context's ZAP handler runs on another loop", name);
    else if (z && memcmp(z->key, key, sizeof key) != 0)
        rc = dl_seterr(DL_ESTATE, "bus %s: its ZeroMQ context already serves another run's key", name);
    else if (!z && (rc = zap_create(ctx, loop, key, name, &z)) == 0) {
        z->next = zap_list;
        zap_list = z;
    }
    if (rc == 0) { z->refs++; *out = z; }
    pthread_mutex_unlock(&zap_mu);
    return rc;
}

void bus__zap_release(bus_zap_t **zap_p) {
    if (!zap_p || !*zap_p) return;
    bus_zap_t *z = *zap_p;
    *zap_p = NULL;
    pthread_mutex_lock(&zap_mu);
    int last = --z->refs == 0;
    if (last) {
        bus_zap_t **pp = &zap_list;
        while (*pp != z) pp = &(*pp)->next;
        *pp = z->next;
    }
    pthread_mutex_unlock(&zap_mu);
    if (!last) return;
    if (z->refused)
        log_info("bus: ZAP handler closed: %llu connection(s) accepted, %llu refused", z->accepted,
                 z->refused);
    z->closing = 1;
    z->pending = 2;
    uv_close((uv_handle_t *)&z->poll, on_zap_closed);   /* stops watching the fd first */
    uv_close((uv_handle_t *)&z->idle, on_zap_closed);
    zmq_close(z->sock);
    z->sock = NULL;
}

void bus__zap_counts(void *ctx, unsigned long long *accepted, unsigned long long *refused) {
    *accepted = *refused = 0;
    pthread_mutex_lock(&zap_mu);
    for (bus_zap_t *z = zap_list; z; z = z->next)
        if (z->ctx == ctx) { *accepted = z->accepted; *refused = z->refused; }
    pthread_mutex_unlock(&zap_mu);
}

/* ---- socket options ---------------------------------------------------------------------- */

static int setopt(void *sock, int opt, const void *v, size_t n, const char *what, const char *name) {
    if (zmq_setsockopt(sock, opt, v, n) != 0)
        return dl_seterr(DL_EIO, "bus %s: %s: %s", name, what, zmq_strerror(errno));
    return 0;
}

int bus__curve_setup(void *sock, int server, const bus_curve_keys_t *k, void *ctx, uv_loop_t *loop,
                     const char *name, bus_zap_t **zap_out) {
    *zap_out = NULL;
    if (!bus_curve_available())
        return dl_seterr(DL_ENOTSUP, "bus %s: this libzmq has no CURVE support (tcp:// needs it)", name);
    int one = 1, ivl = BUS_HANDSHAKE_IVL_MS;
    DL_TRY(setopt(sock, ZMQ_HANDSHAKE_IVL, &ivl, sizeof ivl, "ZMQ_HANDSHAKE_IVL", name));
    if (!server) {
        DL_TRY(setopt(sock, ZMQ_CURVE_SERVERKEY, k->server_public, BUS_CURVE_KEY_CHARS + 1,
                      "ZMQ_CURVE_SERVERKEY", name));
        DL_TRY(setopt(sock, ZMQ_CURVE_PUBLICKEY, k->client_public, BUS_CURVE_KEY_CHARS + 1,
                      "ZMQ_CURVE_PUBLICKEY", name));
        return setopt(sock, ZMQ_CURVE_SECRETKEY, k->client_secret, BUS_CURVE_KEY_CHARS + 1,
                      "ZMQ_CURVE_SECRETKEY", name);
    }
    DL_TRY(setopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one, "ZMQ_CURVE_SERVER", name));
    DL_TRY(setopt(sock, ZMQ_CURVE_SECRETKEY, k->server_secret, BUS_CURVE_KEY_CHARS + 1,
                  "ZMQ_CURVE_SECRETKEY", name));
    DL_TRY(setopt(sock, ZMQ_ZAP_DOMAIN, BUS_ZAP_DOMAIN, strlen(BUS_ZAP_DOMAIN), "ZMQ_ZAP_DOMAIN", name));
    /* With it a missing handler refuses instead of accepting; libzmq without draft options
     * says EINVAL, and then the handler acquired below is the only guard. */
    if (zmq_setsockopt(sock, ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof one) != 0 && errno != EINVAL)
        return dl_seterr(DL_EIO, "bus %s: ZMQ_ZAP_ENFORCE_DOMAIN: %s", name, zmq_strerror(errno));
    return zap_acquire(ctx, loop, k->client_public, name, zap_out);
}
