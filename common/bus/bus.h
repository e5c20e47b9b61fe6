/* common/bus: ZeroMQ sockets driven by one libuv loop per process.
 *
 * A bus_t is one ZeroMQ socket watched by a uv_poll_t on its ZMQ_FD, plus the
 * timers that heartbeat it. Several buses may share one loop (a stage has one
 * DEALER to the supervisor, a ROUTER for its own clients, a PUB for metrics).
 *
 *   BUS_ROUTER  server side; peers are the identities of connected DEALERs.
 *   BUS_DEALER  client side; exactly one upstream peer, named "" in callbacks.
 *   BUS_PUB     metrics publisher; "peer" is the topic, sends never block (drop at HWM).
 *   BUS_SUB     metrics subscriber; bus_subscribe() picks topic prefixes.
 *
 * Wire format (multipart, one message = one logical payload):
 *   ROUTER/DEALER: [routing id (ROUTER side only)] [envelope, 4 B] [payload]
 *   PUB/SUB:       [topic] [envelope, 4 B] [payload]
 * The envelope is {0xDB, BUS_WIRE_VERSION, type, 0}; type is BUS_T_DATA (payload delivered to
 * bus_msg_cb), BUS_T_HEARTBEAT or BUS_T_GOODBYE (no payload, consumed by the bus; see Goodbye
 * below). Payload bytes are opaque: the
 * bus never looks inside them (proto/ defines their encoding). Messages with a bad envelope, an
 * unknown type, a routing id that is not a bus id, or extra frames are dropped and counted
 * (bus_stats_t.dropped_bad).
 *
 * Peer ids (ROUTER routing ids, PUB/SUB topics) are strings of 1..BUS_ID_MAX printable ASCII
 * characters (0x21..0x7e). A DEALER bus always sets one (opts.identity or a generated
 * "dl-<pid>-<hex>"), so a ROUTER sees stable names across reconnects (ZMQ_ROUTER_HANDOVER lets a
 * restarted peer with the same id take over, unless opts.no_handover).
 *
 * ZMQ_FD is edge-triggered: it signals a change of state, not "data available". After every
 * wake-up the bus receives until EAGAIN and then re-reads ZMQ_EVENTS until it has no POLLIN. A
 * zmq_send can consume the edge too, so every send made outside the bus's own drain schedules
 * another drain on the next loop iteration (uv_idle_t). Each drain handles at most
 * BUS_DRAIN_BUDGET messages, then yields to the loop, so timers and other sockets keep running
 * under load.
 *
 * Sends never block the loop. A send that hits ZeroMQ's high-water mark (opts.sndhwm) is copied
 * into a per-peer FIFO (order per peer is kept: later sends to that peer queue behind it) that is
 * flushed as the socket becomes writable. All queues together hold at most opts.outq_max_msgs
 * messages and opts.outq_max_bytes payload bytes; past that bus_send returns DL_EAGAIN, nothing is
 * queued, and bus_on_writable's callback fires once the queues are below half of both limits.
 *
 * Heartbeats (ROUTER and DEALER, when opts.heartbeat_interval_ms > 0): every interval the bus
 * sends a heartbeat to each live peer whose queue is empty; any message from a peer counts as a
 * sign of life. Every max(1, min(interval, timeout) / 4) ms the bus drains its input, then reports
 * each peer silent for >= heartbeat_timeout_ms through bus_peer_dead_cb, exactly once; so a death
 * is reported between timeout and timeout + interval/4 (+ loop latency) after the peer's last
 * message. A dead ROUTER peer is forgotten (its queued messages are dropped and counted); if it
 * comes back it is a new peer (bus_peer_new_cb). A DEALER keeps heartbeating its dead upstream so a
 * restarted server sees it again. A DEALER's upstream that was never heard is not up yet (still
 * loading, its socket not bound): it is never reported dead, only logged once ("waiting for the
 * peer") after the timeout; its death is reported only after a first sign of life.
 *
 * Goodbye (ROUTER and DEALER, opts.goodbye): an orderly close is not a death. bus_close hands
 * every live peer a BUS_T_GOODBYE envelope after anything still queued for it (so it arrives
 * last), best effort: a peer whose pipe is full or gone gets none and is found dead by its
 * heartbeats as before. The socket then lingers max(opts.linger_ms, BUS_GOODBYE_LINGER_MS) so
 * the goodbyes get out. A receiver (every ROUTER/DEALER bus, opts.goodbye or not) forgets that
 * peer at once, as a dead one (queue dropped, ROUTER: removed; a DEALER's upstream is marked
 * down and heartbeated on), logs it at DEBUG only, counts it in peers_left (not peers_dead) and
 * calls bus_peer_dead_cb with silent_ms = BUS_PEER_LEFT (0, which a death never has), so the
 * caller's clean-up still runs and it can tell a leave from a death. BUS_T_GOODBYE came with
 * wire version 1 unchanged: a bus built before it drops the envelope as an unknown type (a
 * warning, dropped_bad) and finds the peer dead by the timeout, as it always did.
 *
 * Shutdown: with opts.handle_signals the bus watches SIGINT and SIGTERM (uv_signal_t); on either it
 * calls bus_on_signal's callback, then bus_close(); from then on the process ignores SIGINT
 * and SIGTERM (a second one would otherwise kill it by the default action while it stops in
 * order; SIGKILL remains). bus_close stops and closes every handle the bus owns; when their close callbacks have run it closes the socket (ZMQ_LINGER is 0 unless
 * opts.linger_ms says otherwise, so unsent messages are discarded and zmq_ctx_term cannot hang, or
 * waits at most linger_ms) and terminates the bus's own context. It then removes the ipc socket
 * files it bound (ZeroMQ 4.3 leaves them), each only if it is still the same inode. The
 * loop then has nothing left of the bus and uv_run returns once the caller's own handles are gone.
 *
 * Threading: a bus and its callbacks belong to the loop's thread; nothing here is thread-safe.
 * After fork() a child must create its own loop and buses: never use the parent's.
 */
#ifndef DL_BUS_BUS_H
#define DL_BUS_BUS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/bus/curve.h"

#define BUS_WIRE_VERSION 1
#define BUS_ID_MAX 63                 /* chars in a peer id / topic, without the NUL */
#define BUS_ENDPOINT_MAX 128          /* bytes for "ipc://...": sun_path is 108 bytes */
#define BUS_NAME_MAX 64               /* chars in an endpoint name */
#define BUS_DRAIN_BUDGET 1024         /* messages received per wake-up before yielding */

/* Defaults used when the corresponding bus_opts_t field is 0. */
#define BUS_SNDHWM_DEFAULT 1000               /* messages (ZeroMQ's own default) */
#define BUS_RCVHWM_DEFAULT 1000               /* messages */
#define BUS_OUTQ_MAX_MSGS_DEFAULT 65536       /* messages in all outgoing queues */
#define BUS_OUTQ_MAX_BYTES_DEFAULT (64u << 20) /* payload bytes in all outgoing queues */
#define BUS_MAX_MSG_BYTES_DEFAULT (64u << 20) /* payload bytes of one message, both ways */
#define BUS_RECONNECT_IVL_MS_DEFAULT 20       /* DEALER/SUB reconnect interval */

typedef enum { BUS_ROUTER = 1, BUS_DEALER, BUS_PUB, BUS_SUB } bus_kind_t;

/* Envelope types (byte 2 of the envelope frame). */
enum { BUS_T_DATA = 1, BUS_T_HEARTBEAT = 2, BUS_T_GOODBYE = 3 };

#define BUS_PEER_LEFT 0               /* bus_peer_dead_cb's silent_ms for a peer that said goodbye */
#define BUS_GOODBYE_LINGER_MS 100     /* socket linger at close once goodbyes were handed over */

typedef struct {
    bus_kind_t kind;
    const char *name;               /* for logs and errors, e.g. "supervisor"; NULL: kind name */
    const char *identity;           /* DEALER routing id (bus id rules); NULL: generated */
    void *zmq_ctx;                  /* shared ZeroMQ context; NULL: the bus owns one (1 I/O thread) */
    int heartbeat_interval_ms;      /* 0: no heartbeats (PUB/SUB never heartbeat) */
    int heartbeat_timeout_ms;       /* silence after which a peer is dead; > interval */
    int sndhwm, rcvhwm;             /* ZeroMQ high-water marks in messages; 0: defaults */
    size_t outq_max_msgs;           /* 0: BUS_OUTQ_MAX_MSGS_DEFAULT */
    size_t outq_max_bytes;          /* 0: BUS_OUTQ_MAX_BYTES_DEFAULT */
    size_t max_msg_bytes;           /* 0: BUS_MAX_MSG_BYTES_DEFAULT; also ZMQ_MAXMSGSIZE */
    int reconnect_ivl_ms;           /* 0: BUS_RECONNECT_IVL_MS_DEFAULT */
    int handle_signals;             /* nonzero: SIGINT/SIGTERM -> bus_on_signal cb, bus_close */
    int linger_ms;                  /* at close: 0 (default) discards unsent messages at once; > 0
                                     * lets them (and a best-effort flush of the bus queues) out
                                     * for at most this long, which bounds zmq_ctx_term */
    const bus_curve_keys_t *curve;  /* the run's keys (copied at bus_new): required for tcp://
                                     * endpoints (bus_bind/bus_connect refuse tcp:// without
                                     * them, DL_EINVAL); ROUTER/PUB serve with the server key
                                     * and accept only the run's client key (a ZAP handler per
                                     * ZeroMQ context, common/bus/zap_int.h: the CURVE servers
                                     * of one context must share one loop and one key file);
                                     * DEALER/SUB connect with the client key. A tcp peer that
                                     * does not finish its handshake in 5 s is dropped. NULL:
                                     * ipc:// / inproc:// only. */
    int peer_dead_debug;            /* nonzero: a dead peer is logged at DEBUG, not INFO (a server
                                     * of short-lived clients, e.g. the control socket); the
                                     * bus_peer_dead_cb still runs */
    int goodbye;                    /* nonzero (ROUTER/DEALER): bus_close says goodbye to every
                                     * live peer (see Goodbye above) */
    int no_handover;                /* ROUTER: nonzero turns ZMQ_ROUTER_HANDOVER off: a connection
                                     * under the routing id of a live one is ignored, the live one
                                     * keeps its route (the stages' servers: membership) */
} bus_opts_t;

typedef struct bus bus_t;
typedef struct bus_timer bus_timer_t;

typedef struct {
    uint64_t msgs_in, bytes_in;     /* data messages / payload bytes delivered */
    uint64_t msgs_out, bytes_out;   /* data messages / payload bytes handed to ZeroMQ */
    uint64_t heartbeats_in, heartbeats_out;
    uint64_t queued_total;          /* data messages that went through an outgoing queue */
    uint64_t send_eagain;           /* bus_send calls refused with DL_EAGAIN */
    uint64_t dropped_bad;           /* malformed incoming messages dropped */
    uint64_t dropped_dead;          /* queued messages dropped: peer dead or disconnected */
    uint64_t peers_dead;            /* peer deaths reported */
    uint64_t peers_left;            /* peers that said goodbye (reported with BUS_PEER_LEFT) */
    uint64_t goodbyes_out;          /* goodbyes handed to ZeroMQ at close */
    size_t queued_msgs, queued_bytes; /* now in the outgoing queues */
    size_t queued_msgs_max;         /* high-water of queued_msgs since bus_new */
    uint32_t peers_alive;
} bus_stats_t;

/* Incoming data message. peer: sender's id (ROUTER), topic (SUB) or "" (DEALER); data/len: the
 * payload, valid only during the call (len may be 0). The callback may send, start timers and
 * close or destroy the bus (no further messages are delivered after that). */
typedef void (*bus_msg_cb)(bus_t *bus, const char *peer, const void *data, size_t len, void *arg);
/* A peer was silent for silent_ms >= heartbeat_timeout_ms (called once per death), or it
 * closed in order: silent_ms == BUS_PEER_LEFT (0), not a death (see Goodbye above). */
typedef void (*bus_peer_dead_cb)(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg);
/* A peer was heard from for the first time (or again after it was reported dead). */
typedef void (*bus_peer_new_cb)(bus_t *bus, const char *peer, void *arg);
/* The outgoing queues went below half their limits after a bus_send returned DL_EAGAIN. */
typedef void (*bus_writable_cb)(bus_t *bus, void *arg);
/* SIGINT or SIGTERM arrived (opts.handle_signals); bus_close follows right after. */
typedef void (*bus_signal_cb)(bus_t *bus, int signum, void *arg);
typedef void (*bus_close_cb)(bus_t *bus, void *arg);
typedef void (*bus_timer_cb)(bus_t *bus, void *arg);

/* Creates a bus on loop (not owned). Returns NULL with dl_errmsg set on bad options
 * (heartbeat_timeout_ms <= interval, bad identity, ...) or a ZeroMQ/libuv failure. */
bus_t *bus_new(uv_loop_t *loop, const bus_opts_t *opts);

/* Frees the bus and nulls *bus_p (NULL or *bus_p NULL: no-op). If the bus is still open it is
 * closed first and freed from its last close callback, so the loop must run once more (uv_run).
 * Safe to call from the bus's own callbacks. */
void bus_destroy(bus_t **bus_p);

/* bind/connect to a ZeroMQ endpoint, normally one made by bus_endpoint. A DEALER may connect to
 * one endpoint only (it has one upstream peer): a second connect gives DL_ESTATE.
 * Errors: DL_EINVAL (NULL/empty endpoint; tcp:// on a bus without opts.curve, message names
 * CURVE), DL_EIO (ZeroMQ, message has zmq_strerror; a transport other than ipc://, inproc://,
 * tcp://), DL_ECLOSED. */
int bus_bind(bus_t *bus, const char *endpoint);
int bus_connect(bus_t *bus, const char *endpoint);
/* SUB only: receive topics starting with prefix ("" = all). */
int bus_subscribe(bus_t *bus, const char *prefix);

/* Sends len bytes (copied; the caller keeps buf) to peer: a ROUTER peer id, a PUB topic, ignored
 * (may be NULL) on a DEALER. Never blocks. Returns 0 when sent or queued;
 * DL_EAGAIN: outgoing queues full (see above), nothing sent, retry after bus_writable_cb;
 * DL_ENOENT: ROUTER peer not connected; DL_ERANGE: len > max_msg_bytes; DL_EINVAL: bad peer id;
 * DL_ECLOSED: bus closing; DL_ENOTSUP: SUB bus; DL_ENOMEM: queue allocation;
 * DL_EIO: other ZeroMQ error. */
int bus_send(bus_t *bus, const char *peer, const void *buf, size_t len);

/* ROUTER only (no-op otherwise, or for an unknown peer): the peer is expected to fall silent
 * (a one-shot client, e.g. a stage's config request that closes its socket once answered).
 * When its silence passes the heartbeat timeout it is forgotten without a log line or
 * bus_peer_dead_cb; anything from it before then (a heartbeat too) makes it an ordinary peer
 * again. Queued
 * messages for it are kept until then. */
void bus_peer_quiet(bus_t *bus, const char *peer);

void bus_on_message(bus_t *bus, bus_msg_cb cb, void *arg);
void bus_on_peer_dead(bus_t *bus, bus_peer_dead_cb cb, void *arg);
void bus_on_peer_new(bus_t *bus, bus_peer_new_cb cb, void *arg);
void bus_on_writable(bus_t *bus, bus_writable_cb cb, void *arg);
void bus_on_signal(bus_t *bus, bus_signal_cb cb, void *arg);

/* Starts closing (idempotent): stops input, closes every handle the bus owns, then the socket
 * (unsent messages are discarded) and its own context; cb (may be NULL) runs after that from the
 * loop. Further bus_send calls give DL_ECLOSED. */
void bus_close(bus_t *bus, bus_close_cb cb, void *arg);
/* 1 once bus_close has started, else 0. */
int bus_is_closing(const bus_t *bus);

/* Timer on the bus's loop, owned by the bus (closed by bus_close). Fires after first_ms, then
 * every repeat_ms (0: once; a fired one-shot timer stays allocated until bus_timer_stop or
 * bus_close). Returns 0 or DL_ECLOSED / DL_ENOMEM. bus_close frees every timer of the bus: a
 * bus_timer_t pointer must not be used after bus_close. */
int bus_timer_start(bus_t *bus, uint64_t first_ms, uint64_t repeat_ms, bus_timer_cb cb, void *arg,
                    bus_timer_t **out);
/* Stops and frees a timer (from its close callback); nulls *timer_p. NULL: no-op. */
void bus_timer_stop(bus_timer_t **timer_p);

uv_loop_t *bus_loop(const bus_t *bus);
const char *bus_name(const bus_t *bus);
/* This bus's routing id (DEALER) or "" (other kinds). */
const char *bus_identity(const bus_t *bus);
void bus_stats(const bus_t *bus, bus_stats_t *out);

/* Creates the run directory path (parents too, like mkdir -p) with mode 0700, or accepts an
 * existing one that is a real directory (not a symlink) owned by the effective uid with no
 * group/other permission bits. Anything else is refused: the sockets inside are the stages'
 * only access control on one host. Errors: DL_EINVAL (exists but refused, message says why),
 * DL_EIO (mkdir/stat failed), DL_ERANGE (path too long). */
int bus_run_dir_create(const char *path);

/* Writes "ipc://<run_dir>/<name>.sock" into buf (cap bytes). name: 1..BUS_NAME_MAX chars of
 * [A-Za-z0-9._-], not starting with '.'. Errors: DL_EINVAL (name or run_dir empty/bad),
 * DL_ERANGE (socket path over 107 bytes, the sun_path limit, or cap too small). */
int bus_endpoint(const char *run_dir, const char *name, char *buf, size_t cap);

#endif
