/* common/bus: ZeroMQ socket on a libuv loop. See bus.h for the contract. */
#include "common/bus/bus.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/paths.h"
#include "common/bus/zap_int.h"

#define BUS_ENV_MAGIC 0xDB
#define BUS_ENV_BYTES 4
#define BUS_PEERS_MAX 1024      /* ROUTER peers tracked; more are dropped (flood guard) */
#define BUS_RETRY_MS 5          /* queue flush retry while a queue is non-empty */
#define BUS_BINDS_MAX 8         /* ipc endpoints per bus whose socket files we remove at close */

typedef struct qmsg {
    struct qmsg *next;
    size_t len;
    unsigned char data[];       /* payload copy, len bytes */
} qmsg_t;

typedef struct {
    char id[BUS_ID_MAX + 1];
    size_t id_len;
    uint64_t last_seen_ns;      /* CLOCK_MONOTONIC of the last message from it */
    int alive;
    int heard;                  /* a message came from it since it entered the table */
    int quiet;                  /* bus_peer_quiet: its silence is expected, not a death */
    int waited;                 /* DEALER: "waiting for" already logged for its upstream */
    qmsg_t *qhead, *qtail;      /* outgoing FIFO, used once ZeroMQ said EAGAIN */
    size_t qmsgs;
} peer_t;

struct bus_timer {
    uv_timer_t h;
    bus_t *bus;
    bus_timer_cb cb;
    void *arg;
    bus_timer_t *prev, *next;
};

struct bus {
    uv_loop_t *loop;
    bus_kind_t kind;
    char name[32];
    char identity[BUS_ID_MAX + 1];
    void *ctx;
    int own_ctx;
    void *sock;
    int fd;

    uv_poll_t poll;
    uv_idle_t idle;             /* deferred drain: after sends, or when the budget ran out */
    uv_timer_t hb_timer, check_timer, retry_timer;
    uv_signal_t sigint, sigterm;
    int has_signals;            /* bit 0: sigint initialised, bit 1: sigterm */
    bus_timer_t *timers;

    int hb_interval_ms, hb_timeout_ms, linger_ms;
    int peer_dead_debug;
    int goodbye;                /* opts.goodbye: say goodbye at close */
    int has_curve;              /* opts.curve given: tcp:// allowed, CURVE options set */
    bus_zap_t *zap;             /* server: the context's ZAP handler, one reference */
    size_t outq_max_msgs, outq_max_bytes, max_msg_bytes;

    peer_t **peers;             /* ROUTER: known peers; DEALER: peers[0] is the upstream */
    size_t npeers, cap_peers;
    int connected;              /* DEALER: bus_connect done */

    /* ipc socket files we bound: ZeroMQ 4.3 leaves them behind, so bus_finish unlinks each one
     * if it is still the same inode (not a file another process has bound since). */
    struct { char path[sizeof(((struct sockaddr_un *)0)->sun_path)]; dev_t dev; ino_t ino; }
        binds[BUS_BINDS_MAX];
    int nbinds;

    int closing, closed, free_on_close, in_finish, pending;
    int in_pump;
    int idle_on, retry_on, want_writable;

    bus_msg_cb msg_cb; void *msg_arg;
    bus_peer_dead_cb dead_cb; void *dead_arg;
    bus_peer_new_cb new_cb; void *new_arg;
    bus_writable_cb writable_cb; void *writable_arg;
    bus_signal_cb signal_cb; void *signal_arg;
    bus_close_cb close_cb; void *close_arg;

    bus_stats_t st;
};

static const char *kind_name(bus_kind_t k) {
    switch (k) {
    case BUS_ROUTER: return "router";
    case BUS_DEALER: return "dealer";
    case BUS_PUB: return "pub";
    case BUS_SUB: return "sub";
    }
    return "?";
}

/* 1 if s[0..n) is a valid bus id: 1..BUS_ID_MAX printable, non-space ASCII. */
static int id_valid(const void *s, size_t n) {
    if (n < 1 || n > BUS_ID_MAX) return 0;
    const unsigned char *p = s;
    for (size_t i = 0; i < n; i++)
        if (p[i] < 0x21 || p[i] > 0x7e) return 0;
    return 1;
}

/* ---- peers ------------------------------------------------------------------------------- */

static peer_t *peer_find(bus_t *b, const char *id, size_t n) {
    for (size_t i = 0; i < b->npeers; i++) {
        peer_t *p = b->peers[i];
        if (p->id_len == n && memcmp(p->id, id, n) == 0) return p;
    }
    return NULL;
}

static peer_t *peer_add(bus_t *b, const char *id, size_t n) {
    if (b->npeers >= BUS_PEERS_MAX) return NULL;
    if (b->npeers == b->cap_peers) {
        size_t cap = b->cap_peers ? 2 * b->cap_peers : 8;
        peer_t **np = realloc(b->peers, cap * sizeof *np);
        if (!np) return NULL;
        b->peers = np;
        b->cap_peers = cap;
    }
    peer_t *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    memcpy(p->id, id, n);
    p->id[n] = 0;
    p->id_len = n;
    b->peers[b->npeers++] = p;
    return p;
}

static void peer_drop_queue(bus_t *b, peer_t *p, const char *why) {
    size_t n = 0;
    while (p->qhead) {
        qmsg_t *q = p->qhead;
        p->qhead = q->next;
        b->st.queued_bytes -= q->len;
        b->st.queued_msgs--;
        n++;
        free(q);
    }
    p->qtail = NULL;
    p->qmsgs = 0;
    if (n) {
        if (!b->closing) b->st.dropped_dead += n;
        log_msg(b->closing ? LOG_DEBUG : LOG_WARN, __FILE__, __LINE__,
                "bus %s: dropped %zu queued message(s) for peer '%s' (%s)", b->name, n, p->id, why);
    }
}

static void peer_remove(bus_t *b, size_t i, const char *why) {
    peer_t *p = b->peers[i];
    peer_drop_queue(b, p, why);
    if (p->alive) b->st.peers_alive--;
    b->peers[i] = b->peers[--b->npeers];
    free(p);
}

/* ---- low-level send ---------------------------------------------------------------------- */

/* Sends one message without blocking. Returns 0 or an errno value (EAGAIN: high-water mark,
 * EHOSTUNREACH: ROUTER peer not connected). Every frame uses ZMQ_DONTWAIT: a ROUTER checks the
 * pipe on the id frame only, and a DEALER rolls a partly written message back on EAGAIN (HWM
 * counts whole messages), so EAGAIN always means "nothing was sent". */
static int zsend(bus_t *b, const char *id, size_t id_len, int type, const void *data, size_t len) {
    unsigned char env[BUS_ENV_BYTES] = {BUS_ENV_MAGIC, BUS_WIRE_VERSION, (unsigned char)type, 0};
    int has_payload = type == BUS_T_DATA;
    int rc;
    if (b->kind != BUS_DEALER) {
        do rc = zmq_send(b->sock, id, id_len, ZMQ_DONTWAIT | ZMQ_SNDMORE);
        while (rc < 0 && errno == EINTR);
        if (rc < 0) return errno;
    }
    do rc = zmq_send(b->sock, env, sizeof env, ZMQ_DONTWAIT | (has_payload ? ZMQ_SNDMORE : 0));
    while (rc < 0 && errno == EINTR);
    if (rc < 0) return errno;
    if (has_payload) {
        do rc = zmq_send(b->sock, data, len, ZMQ_DONTWAIT);
        while (rc < 0 && errno == EINTR);
        if (rc < 0) return errno;
    }
    return 0;
}

static void idle_start(bus_t *b);
static void on_retry(uv_timer_t *h);

static int queue_below_half(const bus_t *b) {
    return b->st.queued_msgs <= b->outq_max_msgs / 2 && b->st.queued_bytes <= b->outq_max_bytes / 2;
}

/* Fires bus_writable_cb once after a DL_EAGAIN, when the queues have room again. */
static void maybe_writable(bus_t *b) {
    if (b->want_writable && queue_below_half(b) && !b->closing) {
        b->want_writable = 0;
        if (b->writable_cb) b->writable_cb(b, b->writable_arg);
    }
}

/* Sends queued messages in FIFO order per peer until each queue is empty or ZeroMQ says EAGAIN.
 * Returns the number of messages sent. */
static size_t flush_queues(bus_t *b) {
    size_t sent = 0;
    for (size_t i = 0; i < b->npeers && !b->closing;) {
        peer_t *p = b->peers[i];
        int drop = 0;
        while (p->qhead) {
            qmsg_t *q = p->qhead;
            int e = zsend(b, p->id, p->id_len, BUS_T_DATA, q->data, q->len);
            if (e == EAGAIN) break;
            if (e == EHOSTUNREACH) { drop = 1; break; }
            if (e) {
                log_warn("bus %s: send to '%s' failed: %s; dropping its queue", b->name, p->id,
                         zmq_strerror(e));
                drop = 1;
                break;
            }
            p->qhead = q->next;
            if (!p->qhead) p->qtail = NULL;
            p->qmsgs--;
            b->st.queued_msgs--;
            b->st.queued_bytes -= q->len;
            b->st.msgs_out++;
            b->st.bytes_out += q->len;
            free(q);
            sent++;
        }
        /* The peer's pipe is gone (disconnected): what is queued cannot reach it. */
        if (drop) peer_drop_queue(b, p, "peer disconnected");
        i++;
    }
    if (b->st.queued_msgs == 0 && b->retry_on) {
        uv_timer_stop(&b->retry_timer);
        b->retry_on = 0;
    }
    maybe_writable(b);
    return sent;
}

static int enqueue(bus_t *b, peer_t *p, const void *data, size_t len) {
    if (b->st.queued_msgs + 1 > b->outq_max_msgs || b->st.queued_bytes + len > b->outq_max_bytes) {
        b->st.send_eagain++;
        b->want_writable = 1;
        return dl_seterr(DL_EAGAIN,
                         "bus %s: outgoing queue full (%zu msgs, %zu bytes queued; limits %zu msgs, "
                         "%zu bytes)", b->name, b->st.queued_msgs, b->st.queued_bytes,
                         b->outq_max_msgs, b->outq_max_bytes);
    }
    qmsg_t *q = malloc(sizeof *q + len);
    if (!q) return dl_seterr(DL_ENOMEM, "bus %s: queueing %zu bytes", b->name, len);
    q->next = NULL;
    q->len = len;
    if (len) memcpy(q->data, data, len);
    if (p->qtail) p->qtail->next = q;
    else p->qhead = q;
    p->qtail = q;
    p->qmsgs++;
    b->st.queued_msgs++;
    b->st.queued_bytes += len;
    b->st.queued_total++;
    if (b->st.queued_msgs > b->st.queued_msgs_max) b->st.queued_msgs_max = b->st.queued_msgs;
    if (!b->retry_on) {
        uv_timer_start(&b->retry_timer, on_retry, BUS_RETRY_MS, BUS_RETRY_MS);
        b->retry_on = 1;
    }
    return 0;
}

int bus_send(bus_t *b, const char *peer, const void *buf, size_t len) {
    if (!b) return dl_seterr(DL_EINVAL, "bus_send: bus is NULL");
    if (b->closing) return dl_seterr(DL_ECLOSED, "bus %s: send after close", b->name);
    if (b->kind == BUS_SUB) return dl_seterr(DL_ENOTSUP, "bus %s: a SUB socket cannot send", b->name);
    if (len && !buf) return dl_seterr(DL_EINVAL, "bus %s: send of %zu bytes from NULL", b->name, len);
    if (len > b->max_msg_bytes)
        return dl_seterr(DL_ERANGE, "bus %s: message of %zu bytes over the %zu-byte limit", b->name,
                         len, b->max_msg_bytes);
    const char *id = "";
    size_t id_len = 0;
    peer_t *p = NULL;
    if (b->kind == BUS_DEALER) {
        p = b->peers[0];
    } else {
        if (!peer) return dl_seterr(DL_EINVAL, "bus %s: send needs a peer id / topic", b->name);
        id = peer;
        id_len = strlen(peer);
        if (!id_valid(id, id_len))
            return dl_seterr(DL_EINVAL, "bus %s: bad peer id / topic '%.80s' (1..%d printable chars)",
                             b->name, peer, BUS_ID_MAX);
        if (b->kind == BUS_ROUTER) p = peer_find(b, id, id_len);
    }
    int rc = 0;
    if (p && p->qhead) {
        rc = enqueue(b, p, buf, len);     /* keep order behind what is already queued */
    } else {
        int e = zsend(b, id, id_len, BUS_T_DATA, buf, len);
        if (e == 0) {
            b->st.msgs_out++;
            b->st.bytes_out += len;
        } else if (e == EAGAIN && b->kind != BUS_PUB) {
            if (!p) {
                p = peer_add(b, id, id_len);
                if (!p) return dl_seterr(DL_ENOMEM, "bus %s: peer table full or no memory", b->name);
                p->alive = 1;
                p->last_seen_ns = clock_mono_ns();
                b->st.peers_alive++;
            }
            rc = enqueue(b, p, buf, len);
        } else if (e == EHOSTUNREACH) {
            return dl_seterr(DL_ENOENT, "bus %s: peer '%s' is not connected", b->name, id);
        } else if (e == EAGAIN) {
            return dl_seterr(DL_EAGAIN, "bus %s: PUB send would block", b->name);
        } else {
            return dl_seterr(DL_EIO, "bus %s: zmq_send to '%s': %s", b->name, id, zmq_strerror(e));
        }
    }
    /* A send may have consumed the ZMQ_FD edge: look again on the next loop iteration. */
    if (!b->in_pump) idle_start(b);
    return rc;
}

/* ---- receive ----------------------------------------------------------------------------- */

static void drop_bad(bus_t *b, const char *why) {
    b->st.dropped_bad++;
    if ((b->st.dropped_bad & (b->st.dropped_bad - 1)) == 0)   /* 1st, 2nd, 4th, ... */
        log_warn("bus %s: dropped malformed message (%s); %llu so far", b->name, why,
                 (unsigned long long)b->st.dropped_bad);
}

/* Marks a sign of life from peer id (ROUTER) or the upstream (DEALER). Returns the peer (NULL:
 * no room, message dropped). May call bus_peer_new_cb. */
static peer_t *touch_peer(bus_t *b, const char *id, size_t n) {
    peer_t *p = b->kind == BUS_DEALER ? b->peers[0] : peer_find(b, id, n);
    if (!p) {
        p = peer_add(b, id, n);
        if (!p) {
            drop_bad(b, "peer table full");
            return NULL;
        }
    }
    p->last_seen_ns = clock_mono_ns();
    p->quiet = 0;   /* talking again: watched as any peer */
    int fresh = !p->alive || !p->heard;
    if (!p->alive) {
        p->alive = 1;
        b->st.peers_alive++;
    }
    p->heard = 1;
    if (fresh && b->new_cb) b->new_cb(b, b->kind == BUS_DEALER ? "" : p->id, b->new_arg);
    return p;
}

/* A goodbye from peer id (ROUTER) or the upstream (DEALER): forgotten as a dead peer, without
 * a death's log line; bus_peer_dead_cb gets BUS_PEER_LEFT. Unknown or already dead: ignored. */
static void peer_left(bus_t *b, const char *id, size_t n) {
    size_t i = 0;
    if (b->kind == BUS_ROUTER)
        while (i < b->npeers && !(b->peers[i]->id_len == n && memcmp(b->peers[i]->id, id, n) == 0)) i++;
    if (i >= b->npeers || !b->peers[i]->alive) return;
    peer_t *p = b->peers[i];
    char pid[BUS_ID_MAX + 1];
    memcpy(pid, p->id, p->id_len + 1);
    p->alive = 0;
    b->st.peers_alive--;
    b->st.peers_left++;
    log_debug("bus %s: peer '%s' left (goodbye)", b->name, pid);
    if (b->kind == BUS_ROUTER) peer_remove(b, i, "peer left");
    else peer_drop_queue(b, p, "peer left");
    if (b->dead_cb) b->dead_cb(b, pid, BUS_PEER_LEFT, b->dead_arg);
    if (!b->closing) maybe_writable(b);    /* dropping its queue may have made room */
}

/* Receives and handles one message. Returns 1 if one was taken (delivered or dropped), 0 when
 * nothing is waiting (EAGAIN). Frames of one message arrive together, so only the first receive
 * can say EAGAIN. */
static int recv_one(bus_t *b) {
    enum { NF = 3 };
    zmq_msg_t f[NF];
    int n = 0, extra = 0, rc;
    zmq_msg_init(&f[0]);
    do rc = zmq_msg_recv(&f[0], b->sock, ZMQ_DONTWAIT);
    while (rc < 0 && errno == EINTR);
    if (rc < 0) {
        int e = errno;
        zmq_msg_close(&f[0]);
        if (e != EAGAIN) log_warn("bus %s: zmq_msg_recv: %s", b->name, zmq_strerror(e));
        return 0;
    }
    n = 1;
    int more = zmq_msg_more(&f[0]);
    while (more) {
        zmq_msg_t tmp, *m = n < NF ? &f[n] : &tmp;
        zmq_msg_init(m);
        do rc = zmq_msg_recv(m, b->sock, 0);
        while (rc < 0 && errno == EINTR);
        if (rc < 0) { zmq_msg_close(m); extra = 1; break; }
        more = zmq_msg_more(m);
        if (m == &tmp) { zmq_msg_close(&tmp); extra = 1; }
        else n++;
    }
    int i = 0;
    char id[BUS_ID_MAX + 1] = "";
    size_t id_len = 0;
    const char *why = NULL;
    if (extra) why = "too many frames";
    if (!why && b->kind != BUS_DEALER) {
        id_len = zmq_msg_size(&f[0]);
        if (!id_valid(zmq_msg_data(&f[0]), id_len)) why = "routing id / topic is not a bus id";
        else { memcpy(id, zmq_msg_data(&f[0]), id_len); id[id_len] = 0; }
        i = 1;
    }
    const unsigned char *env = NULL;
    if (!why) {
        if (i >= n || zmq_msg_size(&f[i]) != BUS_ENV_BYTES) why = "no 4-byte envelope";
        else {
            env = zmq_msg_data(&f[i]);
            if (env[0] != BUS_ENV_MAGIC) why = "bad envelope magic";
            else if (env[1] != BUS_WIRE_VERSION) why = "wrong bus wire version";
            else if (env[2] != BUS_T_DATA && env[2] != BUS_T_HEARTBEAT && env[2] != BUS_T_GOODBYE)
                why = "unknown envelope type";
            else if (env[2] != BUS_T_DATA && i + 1 != n) why = "heartbeat or goodbye with payload";
        }
    }
    if (why) {
        drop_bad(b, why);
    } else if (b->kind == BUS_SUB) {
        if (env[2] == BUS_T_DATA) {
            size_t len = i + 1 < n ? zmq_msg_size(&f[i + 1]) : 0;
            b->st.msgs_in++;
            b->st.bytes_in += len;
            if (b->msg_cb) b->msg_cb(b, id, len ? zmq_msg_data(&f[i + 1]) : "", len, b->msg_arg);
        }
    } else if (env[2] == BUS_T_GOODBYE) {
        if (!b->closing) peer_left(b, id, id_len);
    } else if (touch_peer(b, id, id_len) && !b->closing) {
        if (env[2] == BUS_T_HEARTBEAT) {
            b->st.heartbeats_in++;
        } else {
            size_t len = i + 1 < n ? zmq_msg_size(&f[i + 1]) : 0;
            b->st.msgs_in++;
            b->st.bytes_in += len;
            if (b->msg_cb) b->msg_cb(b, id, len ? zmq_msg_data(&f[i + 1]) : "", len, b->msg_arg);
        }
    }
    for (int k = 0; k < n; k++) zmq_msg_close(&f[k]);
    return 1;
}

static uint32_t zevents(bus_t *b) {
    uint32_t ev = 0;
    size_t sz = sizeof ev;
    int rc;
    do rc = zmq_getsockopt(b->sock, ZMQ_EVENTS, &ev, &sz);
    while (rc < 0 && errno == EINTR);
    if (rc < 0) {
        log_warn("bus %s: ZMQ_EVENTS: %s", b->name, zmq_strerror(errno));
        return 0;
    }
    return ev;
}

/* The heart of the edge-triggered handling: receive until EAGAIN, then ask ZMQ_EVENTS (which
 * also re-arms ZMQ_FD) and go again while it says POLLIN; flush queues on POLLOUT. Stops after
 * BUS_DRAIN_BUDGET messages and lets the idle handle continue next iteration. */
static void bus_pump(bus_t *b) {
    if (b->closing) return;
    b->in_pump++;
    int budget = BUS_DRAIN_BUDGET, more = 0;
    for (;;) {
        if (b->kind != BUS_PUB)
            while (budget > 0 && !b->closing && recv_one(b)) budget--;
        if (b->closing) break;
        if (budget == 0) { more = 1; break; }
        uint32_t ev = zevents(b);
        if ((ev & ZMQ_POLLOUT) && b->st.queued_msgs && flush_queues(b)) continue;  /* re-check */
        if (b->closing || !(ev & ZMQ_POLLIN)) break;
    }
    b->in_pump--;
    if (b->closing) return;
    if (more) idle_start(b);
    else if (b->idle_on) { uv_idle_stop(&b->idle); b->idle_on = 0; }
}

static void on_poll(uv_poll_t *h, int status, int events) {
    bus_t *b = h->data;
    if (status < 0) log_warn("bus %s: poll: %s", b->name, uv_strerror(status));
    bus_pump(b);
}

static void on_idle(uv_idle_t *h) { bus_pump(h->data); }

static void idle_start(bus_t *b) {
    if (b->idle_on || b->closing) return;
    uv_idle_start(&b->idle, on_idle);
    b->idle_on = 1;
}

static void on_retry(uv_timer_t *h) {
    bus_t *b = h->data;
    if (b->st.queued_msgs) flush_queues(b);
    idle_start(b);
}

/* ---- heartbeats -------------------------------------------------------------------------- */

static void on_heartbeat(uv_timer_t *h) {
    bus_t *b = h->data;
    for (size_t i = 0; i < b->npeers; i++) {
        peer_t *p = b->peers[i];
        /* A queued peer will get data soon enough; heartbeats must not jump the queue's order of
         * sends, and an EAGAIN here is harmless (the pipe is full of signs of life). */
        if (p->qhead) continue;
        if (b->kind == BUS_ROUTER && !p->alive) continue;
        if (b->kind == BUS_DEALER && !b->connected) continue;
        if (zsend(b, p->id, p->id_len, BUS_T_HEARTBEAT, NULL, 0) == 0) b->st.heartbeats_out++;
    }
    if (!b->in_pump) idle_start(b);
}

static void on_check(uv_timer_t *h) {
    bus_t *b = h->data;
    bus_pump(b);    /* count what already arrived before judging anyone silent */
    if (b->closing) return;
    uint64_t timeout_ns = (uint64_t)b->hb_timeout_ms * 1000000ull;
again:
    for (size_t i = 0; i < b->npeers; i++) {
        peer_t *p = b->peers[i];
        if (!p->alive) continue;
        if (b->kind == BUS_DEALER && !b->connected) continue;
        uint64_t now = clock_mono_ns();
        if (now - p->last_seen_ns < timeout_ns) continue;
        if (b->kind == BUS_DEALER && !p->heard) {
            /* Never heard: not up yet (still loading, socket not bound), not dead. Only
             * silence after a first sign of life is a death; a server that never comes up
             * is its owner's to find (process exit, a start-up time limit). */
            if (!p->waited)
                log_msg(b->peer_dead_debug ? LOG_DEBUG : LOG_INFO, __FILE__, __LINE__,
                        "bus %s: waiting for the peer (not heard yet, %llu ms after connect)", b->name,
                        (unsigned long long)((now - p->last_seen_ns) / 1000000ull));
            p->waited = 1;
            continue;
        }
        if (p->quiet && b->kind == BUS_ROUTER) {   /* expected silence: forget it, no report */
            peer_remove(b, i, "quiet peer gone");
            goto again;
        }
        char id[BUS_ID_MAX + 1];
        memcpy(id, p->id, p->id_len + 1);
        uint64_t silent_ms = (now - p->last_seen_ns) / 1000000ull;
        p->alive = 0;
        b->st.peers_alive--;
        b->st.peers_dead++;
        log_msg(b->peer_dead_debug ? LOG_DEBUG : LOG_INFO, __FILE__, __LINE__,
                "bus %s: peer '%s' dead (silent %llu ms, timeout %d ms)", b->name, id,
                (unsigned long long)silent_ms, b->hb_timeout_ms);
        if (b->kind == BUS_ROUTER) peer_remove(b, i, "peer dead");
        else peer_drop_queue(b, p, "peer dead");
        if (b->dead_cb) b->dead_cb(b, id, silent_ms, b->dead_arg);
        if (b->closing) return;
        maybe_writable(b);    /* dropping its queue may have made room */
        if (b->closing) return;
        goto again;    /* the callback may have changed the peer table */
    }
}

/* ---- signals, close ---------------------------------------------------------------------- */

static void on_signal(uv_signal_t *h, int signum) {
    bus_t *b = h->data;
    if (b->closing) return;
    log_info("bus %s: %s received, closing", b->name, signum == SIGINT ? "SIGINT" : "SIGTERM");
    if (b->signal_cb) b->signal_cb(b, signum, b->signal_arg);
    bus_close(b, b->close_cb, b->close_arg);
    /* closing the watchers gave SIGINT/SIGTERM back their default action (libuv restores
     * it): a second one (the supervisor's SIGTERM after a terminal's Ctrl-C reached the
     * whole group) would kill the process while it stops in order (final checkpoint,
     * goodbyes). Once stopping, they are ignored; SIGKILL remains for a stage that hangs. */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
}

/* opts.goodbye: a goodbye to every live peer, after what bus_finish flushed for it (what is
 * still queued is dropped, so the goodbye is the last thing the peer gets from us). Best
 * effort: a full or missing pipe means no goodbye. Returns the number handed to ZeroMQ. */
static int say_goodbye(bus_t *b) {
    if (!b->goodbye || !b->sock || (b->kind != BUS_ROUTER && b->kind != BUS_DEALER)) return 0;
    if (b->kind == BUS_DEALER && !b->connected) return 0;
    int n = 0;
    for (size_t i = 0; i < b->npeers; i++) {
        peer_t *p = b->peers[i];
        if (!p->alive || (b->kind == BUS_ROUTER && !p->heard)) continue;
        if (zsend(b, p->id, p->id_len, BUS_T_GOODBYE, NULL, 0) == 0) n++;
    }
    b->st.goodbyes_out += (uint64_t)n;
    return n;
}

static void bus_finish(bus_t *b) {
    if (b->linger_ms > 0) {
        /* Best effort: hand what is queued to ZeroMQ, which gets linger_ms to send it. */
        for (size_t i = 0; i < b->npeers; i++) {
            peer_t *p = b->peers[i];
            while (p->qhead && zsend(b, p->id, p->id_len, BUS_T_DATA, p->qhead->data,
                                     p->qhead->len) == 0) {
                qmsg_t *q = p->qhead;
                p->qhead = q->next;
                p->qmsgs--;
                b->st.queued_msgs--;
                b->st.queued_bytes -= q->len;
                b->st.msgs_out++;
                b->st.bytes_out += q->len;
                free(q);
            }
            if (!p->qhead) p->qtail = NULL;
        }
    }
    int said = say_goodbye(b);
    while (b->npeers) peer_remove(b, b->npeers - 1, "bus closed");
    free(b->peers);
    b->peers = NULL;
    if (b->sock) {
        int linger = said && b->linger_ms < BUS_GOODBYE_LINGER_MS ? BUS_GOODBYE_LINGER_MS : b->linger_ms;
        zmq_setsockopt(b->sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(b->sock);
        b->sock = NULL;
    }
    bus__zap_release(&b->zap);   /* before zmq_ctx_term: the handler is a socket of the context */
    if (b->own_ctx && b->ctx) {
        int rc;
        do rc = zmq_ctx_term(b->ctx);
        while (rc < 0 && errno == EINTR);
        b->ctx = NULL;
    }
    for (int i = 0; i < b->nbinds; i++) {
        struct stat st;
        if (lstat(b->binds[i].path, &st) == 0 && S_ISSOCK(st.st_mode) &&
            st.st_dev == b->binds[i].dev && st.st_ino == b->binds[i].ino)
            unlink(b->binds[i].path);
    }
    b->nbinds = 0;
    b->closed = 1;
    b->in_finish = 1;
    if (b->close_cb) b->close_cb(b, b->close_arg);
    b->in_finish = 0;
    if (b->free_on_close) free(b);
}

static void on_handle_closed(uv_handle_t *h) {
    bus_t *b = h->data;
    if (--b->pending == 0) bus_finish(b);
}

static void on_bus_timer_closed(uv_handle_t *h) {
    bus_timer_t *t = h->data;
    bus_t *b = t->bus;
    free(t);
    if (--b->pending == 0) bus_finish(b);
}

static void close_handle(bus_t *b, uv_handle_t *h) {
    b->pending++;
    uv_close(h, on_handle_closed);
}

void bus_close(bus_t *b, bus_close_cb cb, void *arg) {
    if (!b || b->closing) return;
    b->closing = 1;
    if (cb) { b->close_cb = cb; b->close_arg = arg; }
    b->pending = 1;    /* held until every close is issued */
    close_handle(b, (uv_handle_t *)&b->poll);
    close_handle(b, (uv_handle_t *)&b->idle);
    close_handle(b, (uv_handle_t *)&b->hb_timer);
    close_handle(b, (uv_handle_t *)&b->check_timer);
    close_handle(b, (uv_handle_t *)&b->retry_timer);
    if (b->has_signals & 1) close_handle(b, (uv_handle_t *)&b->sigint);
    if (b->has_signals & 2) close_handle(b, (uv_handle_t *)&b->sigterm);
    while (b->timers) {
        bus_timer_t *t = b->timers;
        b->timers = t->next;
        b->pending++;
        uv_close((uv_handle_t *)&t->h, on_bus_timer_closed);
    }
    b->pending--;    /* >= 1 here: the close callbacks come from the loop */
}

int bus_is_closing(const bus_t *b) { return b && b->closing; }

void bus_destroy(bus_t **bus_p) {
    if (!bus_p || !*bus_p) return;
    bus_t *b = *bus_p;
    *bus_p = NULL;
    if (b->closed && !b->in_finish) { free(b); return; }
    b->free_on_close = 1;
    bus_close(b, NULL, NULL);
}

/* ---- timers ------------------------------------------------------------------------------ */

static void on_bus_timer(uv_timer_t *h) {
    bus_timer_t *t = h->data;
    if (t->cb) t->cb(t->bus, t->arg);
}

static void on_timer_freed(uv_handle_t *h) { free(h->data); }

int bus_timer_start(bus_t *b, uint64_t first_ms, uint64_t repeat_ms, bus_timer_cb cb, void *arg,
                    bus_timer_t **out) {
    if (!b || !cb || !out) return dl_seterr(DL_EINVAL, "bus_timer_start: NULL argument");
    *out = NULL;
    if (b->closing) return dl_seterr(DL_ECLOSED, "bus %s: timer after close", b->name);
    bus_timer_t *t = calloc(1, sizeof *t);
    if (!t) return dl_seterr(DL_ENOMEM, "bus %s: timer", b->name);
    uv_timer_init(b->loop, &t->h);
    t->h.data = t;
    t->bus = b;
    t->cb = cb;
    t->arg = arg;
    t->next = b->timers;
    if (b->timers) b->timers->prev = t;
    b->timers = t;
    uv_timer_start(&t->h, on_bus_timer, first_ms, repeat_ms);
    *out = t;
    return 0;
}

void bus_timer_stop(bus_timer_t **timer_p) {
    if (!timer_p || !*timer_p) return;
    bus_timer_t *t = *timer_p;
    *timer_p = NULL;
    bus_t *b = t->bus;
    if (t->prev) t->prev->next = t->next;
    else b->timers = t->next;
    if (t->next) t->next->prev = t->prev;
    uv_close((uv_handle_t *)&t->h, on_timer_freed);
}

/* ---- construction ------------------------------------------------------------------------ */

static int setopt_int(bus_t *b, int opt, int v, const char *what) {
    if (zmq_setsockopt(b->sock, opt, &v, sizeof v) != 0)
        return dl_seterr(DL_EIO, "bus %s: zmq_setsockopt %s=%d: %s", b->name, what, v,
                         zmq_strerror(errno));
    return 0;
}

/* CURVE on every endpoint of this socket (zap.c): a server (ROUTER/PUB) with the run's server
 * key behind the context's ZAP handler, a client (DEALER/SUB) with the run's client key. The
 * options apply to the binds/connects made after them (all of this bus's). */
static int bus_setup_curve(bus_t *b, const bus_curve_keys_t *k) {
    int server = b->kind == BUS_ROUTER || b->kind == BUS_PUB;
    DL_TRY(bus__curve_setup(b->sock, server, k, b->ctx, b->loop, b->name, &b->zap));
    b->has_curve = 1;
    return 0;
}

/* tcp:// (and every other transport that leaves the host) only with CURVE keys. */
static int check_transport(const bus_t *b, const char *endpoint, const char *what) {
    if (strncmp(endpoint, "ipc://", 6) == 0 || strncmp(endpoint, "inproc://", 9) == 0) return 0;
    if (strncmp(endpoint, "tcp://", 6) != 0)     /* DL_EIO, as when ZeroMQ itself refused it */
        return dl_seterr(DL_EIO, "bus %s: %s %s: only ipc://, inproc:// and tcp:// endpoints", b->name,
                         what, endpoint);
    if (!b->has_curve)
        return dl_seterr(DL_EINVAL, "bus %s: %s %s: tcp:// needs the run's CURVE keys (nothing "
                         "unauthenticated on the network)", b->name, what, endpoint);
    return 0;
}

static int bus_setup_socket(bus_t *b, const bus_opts_t *o) {
    static const int ztype[] = {[BUS_ROUTER] = ZMQ_ROUTER, [BUS_DEALER] = ZMQ_DEALER,
                                [BUS_PUB] = ZMQ_PUB, [BUS_SUB] = ZMQ_SUB};
    if (o->zmq_ctx) b->ctx = o->zmq_ctx;
    else {
        b->ctx = zmq_ctx_new();
        if (!b->ctx) return dl_seterr(DL_EIO, "bus %s: zmq_ctx_new: %s", b->name, zmq_strerror(errno));
        b->own_ctx = 1;
    }
    b->sock = zmq_socket(b->ctx, ztype[b->kind]);
    if (!b->sock) return dl_seterr(DL_EIO, "bus %s: zmq_socket: %s", b->name, zmq_strerror(errno));
    DL_TRY(setopt_int(b, ZMQ_LINGER, 0, "ZMQ_LINGER"));
    DL_TRY(setopt_int(b, ZMQ_SNDHWM, o->sndhwm ? o->sndhwm : BUS_SNDHWM_DEFAULT, "ZMQ_SNDHWM"));
    DL_TRY(setopt_int(b, ZMQ_RCVHWM, o->rcvhwm ? o->rcvhwm : BUS_RCVHWM_DEFAULT, "ZMQ_RCVHWM"));
    int64_t maxsz = (int64_t)b->max_msg_bytes;
    if (zmq_setsockopt(b->sock, ZMQ_MAXMSGSIZE, &maxsz, sizeof maxsz) != 0)
        return dl_seterr(DL_EIO, "bus %s: ZMQ_MAXMSGSIZE: %s", b->name, zmq_strerror(errno));
    int ivl = o->reconnect_ivl_ms ? o->reconnect_ivl_ms : BUS_RECONNECT_IVL_MS_DEFAULT;
    DL_TRY(setopt_int(b, ZMQ_RECONNECT_IVL, ivl, "ZMQ_RECONNECT_IVL"));
    if (b->kind == BUS_ROUTER) {
        /* MANDATORY: unknown peer -> EHOSTUNREACH and full pipe -> EAGAIN instead of silent drops. */
        DL_TRY(setopt_int(b, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY"));
        DL_TRY(setopt_int(b, ZMQ_ROUTER_HANDOVER, !o->no_handover, "ZMQ_ROUTER_HANDOVER"));
    }
    if (b->kind == BUS_DEALER &&
        zmq_setsockopt(b->sock, ZMQ_ROUTING_ID, b->identity, strlen(b->identity)) != 0)
        return dl_seterr(DL_EIO, "bus %s: ZMQ_ROUTING_ID: %s", b->name, zmq_strerror(errno));
    if (o->curve) DL_TRY(bus_setup_curve(b, o->curve));
    size_t sz = sizeof b->fd;
    if (zmq_getsockopt(b->sock, ZMQ_FD, &b->fd, &sz) != 0)
        return dl_seterr(DL_EIO, "bus %s: ZMQ_FD: %s", b->name, zmq_strerror(errno));
    return 0;
}

static void bus_free_early(bus_t *b) {
    if (b->sock) zmq_close(b->sock);
    bus__zap_release(&b->zap);
    if (b->own_ctx && b->ctx) zmq_ctx_term(b->ctx);
    free(b->peers);
    free(b);
}

bus_t *bus_new(uv_loop_t *loop, const bus_opts_t *o) {
    if (!loop || !o) { dl_seterr(DL_EINVAL, "bus_new: NULL loop or opts"); return NULL; }
    if (o->kind < BUS_ROUTER || o->kind > BUS_SUB) {
        dl_seterr(DL_EINVAL, "bus_new: unknown kind %d", (int)o->kind);
        return NULL;
    }
    const char *name = o->name ? o->name : kind_name(o->kind);
    if (o->heartbeat_interval_ms < 0 || o->heartbeat_timeout_ms < 0 ||
        (o->heartbeat_interval_ms > 0 && o->heartbeat_timeout_ms <= o->heartbeat_interval_ms)) {
        dl_seterr(DL_EINVAL, "bus %s: heartbeat interval %d ms / timeout %d ms: need 0 <= interval "
                  "< timeout", name, o->heartbeat_interval_ms, o->heartbeat_timeout_ms);
        return NULL;
    }
    if (o->heartbeat_interval_ms > 0 && (o->kind == BUS_PUB || o->kind == BUS_SUB)) {
        dl_seterr(DL_EINVAL, "bus %s: heartbeats need a ROUTER or DEALER bus", name);
        return NULL;
    }
    if (o->sndhwm < 0 || o->rcvhwm < 0 || o->reconnect_ivl_ms < 0 || o->linger_ms < 0) {
        dl_seterr(DL_EINVAL, "bus %s: negative hwm, reconnect interval or linger", name);
        return NULL;
    }
    if (o->identity && (o->kind != BUS_DEALER || !id_valid(o->identity, strlen(o->identity)))) {
        dl_seterr(DL_EINVAL, "bus %s: identity '%.80s': only for DEALER, 1..%d printable chars",
                  name, o->identity, BUS_ID_MAX);
        return NULL;
    }
    bus_t *b = calloc(1, sizeof *b);
    if (!b) { dl_seterr(DL_ENOMEM, "bus_new"); return NULL; }
    b->loop = loop;
    b->kind = o->kind;
    snprintf(b->name, sizeof b->name, "%s", name);
    b->hb_interval_ms = o->heartbeat_interval_ms;
    b->hb_timeout_ms = o->heartbeat_timeout_ms;
    b->peer_dead_debug = o->peer_dead_debug;
    b->goodbye = o->goodbye;
    b->linger_ms = o->linger_ms;
    b->outq_max_msgs = o->outq_max_msgs ? o->outq_max_msgs : BUS_OUTQ_MAX_MSGS_DEFAULT;
    b->outq_max_bytes = o->outq_max_bytes ? o->outq_max_bytes : BUS_OUTQ_MAX_BYTES_DEFAULT;
    b->max_msg_bytes = o->max_msg_bytes ? o->max_msg_bytes : BUS_MAX_MSG_BYTES_DEFAULT;
    if (b->kind == BUS_DEALER) {
        if (o->identity) snprintf(b->identity, sizeof b->identity, "%s", o->identity);
        else snprintf(b->identity, sizeof b->identity, "dl-%ld-%llx", (long)getpid(),
                      (unsigned long long)(clock_mono_ns() & 0xffffffffffull));
        if (!peer_add(b, "", 0)) { dl_seterr(DL_ENOMEM, "bus_new"); free(b); return NULL; }
    }
    if (bus_setup_socket(b, o) < 0) { bus_free_early(b); return NULL; }
    int rc = uv_poll_init(loop, &b->poll, b->fd);
    if (rc < 0) {
        dl_seterr(DL_EIO, "bus %s: uv_poll_init(ZMQ_FD %d): %s", b->name, b->fd, uv_strerror(rc));
        bus_free_early(b);
        return NULL;
    }
    b->poll.data = b;
    uv_idle_init(loop, &b->idle);
    b->idle.data = b;
    uv_timer_init(loop, &b->hb_timer);
    b->hb_timer.data = b;
    uv_timer_init(loop, &b->check_timer);
    b->check_timer.data = b;
    uv_timer_init(loop, &b->retry_timer);
    b->retry_timer.data = b;
    uv_poll_start(&b->poll, UV_READABLE, on_poll);
    if (o->handle_signals) {
        int rc1 = uv_signal_init(loop, &b->sigint);
        if (rc1 == 0) { b->has_signals |= 1; b->sigint.data = b; }
        int rc2 = rc1 < 0 ? rc1 : uv_signal_init(loop, &b->sigterm);
        if (rc2 == 0) { b->has_signals |= 2; b->sigterm.data = b; }
        if (rc1 == 0) rc1 = uv_signal_start(&b->sigint, on_signal, SIGINT);
        if (rc2 == 0) rc2 = uv_signal_start(&b->sigterm, on_signal, SIGTERM);
        if (rc1 < 0 || rc2 < 0) {
            dl_seterr(DL_EIO, "bus %s: SIGINT/SIGTERM watch: %s", b->name,
                      uv_strerror(rc1 < 0 ? rc1 : rc2));
            b->free_on_close = 1;
            bus_close(b, NULL, NULL);    /* freed once the loop runs the close callbacks */
            return NULL;
        }
    }
    if (b->hb_interval_ms > 0) {
        uint64_t ivl = (uint64_t)b->hb_interval_ms;
        uint64_t chk = (uint64_t)(b->hb_interval_ms < b->hb_timeout_ms ? b->hb_interval_ms
                                                                       : b->hb_timeout_ms) / 4;
        if (chk < 1) chk = 1;
        uv_timer_start(&b->hb_timer, on_heartbeat, ivl, ivl);
        uv_timer_start(&b->check_timer, on_check, chk, chk);
    }
    /* ZMQ_FD may already be "consumed" by the setup calls: drain once on the first iteration. */
    idle_start(b);
    return b;
}

int bus_bind(bus_t *b, const char *endpoint) {
    if (!b || !endpoint || !*endpoint) return dl_seterr(DL_EINVAL, "bus_bind: NULL bus or endpoint");
    if (b->closing) return dl_seterr(DL_ECLOSED, "bus %s: bind after close", b->name);
    DL_TRY(check_transport(b, endpoint, "bind"));
    if (zmq_bind(b->sock, endpoint) != 0)
        return dl_seterr(DL_EIO, "bus %s: bind %s: %s", b->name, endpoint, zmq_strerror(errno));
    const char *path = strncmp(endpoint, "ipc://", 6) == 0 ? endpoint + 6 : NULL;
    struct stat st;
    if (path && strcmp(path, "*") != 0 && b->nbinds < BUS_BINDS_MAX &&
        strlen(path) < sizeof b->binds[0].path && lstat(path, &st) == 0) {
        snprintf(b->binds[b->nbinds].path, sizeof b->binds[0].path, "%s", path);
        b->binds[b->nbinds].dev = st.st_dev;
        b->binds[b->nbinds].ino = st.st_ino;
        b->nbinds++;
    }
    idle_start(b);
    return 0;
}

int bus_connect(bus_t *b, const char *endpoint) {
    if (!b || !endpoint || !*endpoint)
        return dl_seterr(DL_EINVAL, "bus_connect: NULL bus or endpoint");
    if (b->closing) return dl_seterr(DL_ECLOSED, "bus %s: connect after close", b->name);
    if (b->kind == BUS_DEALER && b->connected)
        return dl_seterr(DL_ESTATE, "bus %s: a DEALER bus connects to one endpoint only", b->name);
    DL_TRY(check_transport(b, endpoint, "connect"));
    if (zmq_connect(b->sock, endpoint) != 0)
        return dl_seterr(DL_EIO, "bus %s: connect %s: %s", b->name, endpoint, zmq_strerror(errno));
    if (b->kind == BUS_DEALER) {
        b->connected = 1;
        peer_t *p = b->peers[0];
        p->alive = 1;
        p->last_seen_ns = clock_mono_ns();
        b->st.peers_alive++;
        /* Introduce ourselves at once so the server knows us before the first interval. */
        if (b->hb_interval_ms > 0 && zsend(b, "", 0, BUS_T_HEARTBEAT, NULL, 0) == 0)
            b->st.heartbeats_out++;
    }
    idle_start(b);
    return 0;
}

int bus_subscribe(bus_t *b, const char *prefix) {
    if (!b || !prefix) return dl_seterr(DL_EINVAL, "bus_subscribe: NULL argument");
    if (b->kind != BUS_SUB) return dl_seterr(DL_ENOTSUP, "bus %s: subscribe on a non-SUB bus", b->name);
    if (zmq_setsockopt(b->sock, ZMQ_SUBSCRIBE, prefix, strlen(prefix)) != 0)
        return dl_seterr(DL_EIO, "bus %s: subscribe '%s': %s", b->name, prefix, zmq_strerror(errno));
    return 0;
}

void bus_on_message(bus_t *b, bus_msg_cb cb, void *arg) { b->msg_cb = cb; b->msg_arg = arg; }
void bus_peer_quiet(bus_t *b, const char *peer) {
    if (b->kind != BUS_ROUTER || !peer) return;
    peer_t *p = peer_find(b, peer, strlen(peer));
    if (p) p->quiet = 1;
}

void bus_on_peer_dead(bus_t *b, bus_peer_dead_cb cb, void *arg) { b->dead_cb = cb; b->dead_arg = arg; }
void bus_on_peer_new(bus_t *b, bus_peer_new_cb cb, void *arg) { b->new_cb = cb; b->new_arg = arg; }
void bus_on_writable(bus_t *b, bus_writable_cb cb, void *arg) {
    b->writable_cb = cb;
    b->writable_arg = arg;
}
void bus_on_signal(bus_t *b, bus_signal_cb cb, void *arg) { b->signal_cb = cb; b->signal_arg = arg; }

uv_loop_t *bus_loop(const bus_t *b) { return b->loop; }
const char *bus_name(const bus_t *b) { return b->name; }
const char *bus_identity(const bus_t *b) { return b->identity; }
void bus_stats(const bus_t *b, bus_stats_t *out) { *out = b->st; }
