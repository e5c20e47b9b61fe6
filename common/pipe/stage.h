/* Stage runtime shared by the four pipeline stages (loader, target_worker,
 * drafter_worker, optimizer): one libuv loop, one ZeroMQ context, a DEALER to the
 * supervisor (hello, heartbeats through the bus, control messages, metrics once a
 * second), proto encode/decode helpers and phase-time accounting.
 *
 * Run layout (made by the supervisor, `draftline run`): <run_dir>/sup.sock (the
 * supervisor's ROUTER), <run_dir>/loader.sock, <run_dir>/optimizer.sock,
 * <run_dir>/drafter<i>.sock (ROUTERs of the stages that serve others). Stage ids:
 * loader 1, optimizer 2, drafter i = 100 + i, target i = 200 + i (PIPE_ID_*).
 */
#ifndef DL_PIPE_STAGE_H
#define DL_PIPE_STAGE_H

#include "common/bus/bus.h"
#include "common/mem/slab.h"
#include "common/pipe/cred.h"
#include "common/pipe/peers.h"
#include "proto/msg.h"

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <uv.h>

#define PIPE_ID_LOADER 1u
#define PIPE_ID_OPTIMIZER 2u
#define PIPE_ID_DRAFTER0 100u
#define PIPE_ID_TARGET0 200u
#define PIPE_MAX_DRAFTERS 64
#define PIPE_MAX_TARGETS 64

/* Heartbeats between stages: a peer silent this long is dead. Compute runs on a
 * worker thread, so the loop answers within milliseconds even mid micro-batch. */
#define PIPE_HEARTBEAT_MS 200
#define PIPE_DEAD_MS 3000

/* Phases whose time is published (seconds, cumulative): the monitor's stall
 * diagnosis reads wait_input (starved) against wait_credit (back-pressured);
 * wait_gpu is the wait for the GPU's turn (common/pipe/gputurn.h) of a stage that
 * shares its GPU. */
typedef enum {
    PHASE_WAIT_INPUT = 0, PHASE_WAIT_CREDIT, PHASE_COPY, PHASE_FORWARD, PHASE_BACKWARD,
    PHASE_STEP, PHASE_WAIT_GPU, PHASE_N
} pipe_phase_t;

/* Exit status of a stage whose start-up can never succeed as it is (a bad run
 * configuration, an unreadable or corrupt model or checkpoint file, out of memory at
 * set-up, a GPU the build cannot use): the supervisor does not restart it; it prints
 * the stage's last ERROR log line on the console and stops the run (exit 1). Any other
 * non-zero status is a crash, restarted with backoff up to --max-restarts. */
#define PIPE_EXIT_PERMANENT 3

/* A stage waits this long for its run configuration (stage_config). */
#define STAGE_CONFIG_TIMEOUT_MS 30000

typedef struct stage stage_t;
struct run_config;
typedef void (*stage_metrics_cb)(stage_t *st, proto_metrics_t *m, void *arg);
typedef void (*stage_control_cb)(stage_t *st, const proto_control_t *c, void *arg);
typedef void (*stage_stop_cb)(stage_t *st, void *arg);

struct stage {
    char name[32];              /* "loader", "target0", ... (also the DEALER identity) */
    proto_role_t role;
    uint32_t stage_id;
    uint64_t incarnation;
    char run_dir[200];
    char run_id[17];
    /* where the supervisor is (ipc://<run_dir>/sup.sock, or --sup's tcp:// endpoint) and,
     * on a multi-node run, the run's keys and configuration (endpoints of the other
     * stages: runcfg_endpoint; the config must outlive the stage) */
    char sup_ep[320];
    int has_keys;
    bus_curve_keys_t keys;
    const struct run_config *cfg;
    uint8_t cred[CRED_BYTES];   /* membership credential (stage_args_t.cred), in every hello */
    int has_cred;
    uint8_t peer_key[CRED_BYTES];   /* the run's peer key (stage_args_t.peer_key): hello tokens */
    int has_peer_key;
    uint64_t refused;           /* peer messages refused (stage_refuse), for the log's count */
    double refuse_logged_s;     /* monotonic s of the last refusal line (one a second) */
    char gpu_uuid[64];          /* "" on CPU */
    int gpu_index;              /* CUDA device ordinal of the stage; -1 on CPU (published as gpu_index) */
    uv_loop_t loop;
    void *zctx;
    bus_t *sup;                 /* DEALER to <run_dir>/sup.sock */
    bus_timer_t *metrics_timer;
    proto_state_t state;
    double t_start, last_progress;  /* monotonic seconds */
    double phase_s[PHASE_N];
    int stopping;               /* set by SIGTERM/SIGINT or CONTROL STOP */
    stage_metrics_cb metrics_cb; void *metrics_arg;
    stage_control_cb control_cb; void *control_arg;
    stage_stop_cb stop_cb; void *stop_arg;
    /* slab bytes moved across nodes (common/pipe/xfer.h), published as xfer_bytes_out /
     * xfer_bytes_in by every stage (0 on one host) */
    uint64_t xfer_bytes_out, xfer_bytes_in;
    int xfer_shown;             /* bit 0: out, bit 1: in published once they left 0 */
};

/* A stage's command line. `draftline run` starts every stage as
 *   <exe> [--index I] --run-dir DIR --incarnation N [--log-level L]
 * (DIR: the sockets dir holding sup.sock; every other setting comes from the run
 * configuration, stage_config). On a multi-node run (docs/MULTINODE.md) the head and
 * the node agents add `--sup tcp://HOST:PORT --key FILE`: the supervisor's endpoint
 * and the run's key file (loaded here; a bad one is exit 2 naming it). The stage's
 * membership credential comes in the environment (DL_STAGE_CRED, 64 hex digits: read
 * into a->cred and unset; a malformed one is exit 2). */
typedef struct {
    const char *run_dir;        /* borrowed from argv */
    uint64_t incarnation;       /* >= 1; default 1 */
    int index;                  /* target/drafter index; 0 when not given (loader, optimizer) */
    const char *sup;            /* --sup (NULL: ipc://<run_dir>/sup.sock) */
    int has_keys;               /* --key given and loaded into keys */
    bus_curve_keys_t keys;
    /* membership credential (common/pipe/cred.h) from the environment variable
     * DL_STAGE_CRED, which stage_args unsets at once (it never reaches a child, a
     * command line or a log); has_cred 0 when absent: the supervisor refuses the hellos */
    uint8_t cred[CRED_BYTES];
    int has_cred;
    /* the run's peer key (cred_peer_key), set by stage_config from the supervisor's
     * CONTROL PEERS; has_peer_key 0 when the supervisor sent none (a test playing the
     * supervisor): the stage then checks no peer token (stage_admit) */
    uint8_t peer_key[CRED_BYTES];
    int has_peer_key;
    int exit_code;              /* when stage_args returns -1: main's exit status */
} stage_args_t;

/* Parses argv (getopt_long; --log-level is applied at once). max_index > 0: --index
 * in [0, max_index] is required; 0: optional, 0 only. -h/--help prints usage(stdout).
 * Returns 0, or -1 with a->exit_code set: 0 after --help, 2 for a bad or missing flag
 * (usage or a cli_error line on stderr, naming prog). */
int stage_args(int argc, char **argv, const char *prog, int max_index, void (*usage)(FILE *), stage_args_t *a);

/* The stage's run configuration, asked for first thing (before any model load or
 * CUDA set-up): a HELLO with PROTO_CAP_WANT_CONFIG (gpu_uuid "") on a DEALER of its
 * own to the supervisor (a->sup with a's keys, or <a->run_dir>/sup.sock) with identity
 * name, incarnation a->incarnation, then up to timeout_ms
 * (STAGE_CONFIG_TIMEOUT_MS in the stages) for the supervisor's RUN_CONFIG of this
 * stage_id and incarnation, decoded into *cfg (runcfg_from_msg; caller-owned) and
 * checked (runcfg_validate). The supervisor's CONTROL PEERS before it (the run's peer
 * key) goes into a->peer_key. The DEALER is closed before returning; stage_init opens
 * the stage's own afterwards (its HELLO means "up"). Returns 0; DL_ETIMEDOUT (no
 * answer: the message names the supervisor endpoint), the validation's
 * DL_EINVAL / DL_ERANGE, or the bus's error; dl_errmsg says which. */
int stage_config(proto_role_t role, uint32_t stage_id, const char *name, stage_args_t *a,
                 int timeout_ms, struct run_config *cfg);

/* Initialises *st (caller-owned storage), the loop, the ZeroMQ context and the
 * supervisor DEALER (as stage_config found it: a and cfg); sends HELLO and starts the
 * 1 s metrics timer. cfg (borrowed, must outlive the stage): the run id
 * ([A-Za-z0-9_.]{1,16}, slab names) and, on a multi-node run, the endpoints of the
 * other stages (stage_bus). A CONTROL PLACEMENT from the supervisor (a rebalance
 * across nodes) rewrites cfg's placement in place (runcfg_apply_placement) before the
 * control callback sees it: cfg must point at writable storage (each stage main's
 * static run_config_t). Errors from the bus (DL_EIO, DL_EINVAL). */
int stage_init(stage_t *st, proto_role_t role, uint32_t stage_id, const char *name, const stage_args_t *a,
               const struct run_config *cfg);
/* Callbacks: metrics fill-in (called once a second before publishing), control
 * messages from the supervisor, and stop (SIGTERM/SIGINT or CONTROL STOP; the stage
 * should finish what it must and call stage_close). */
void stage_on_metrics(stage_t *st, stage_metrics_cb cb, void *arg);
void stage_on_control(stage_t *st, stage_control_cb cb, void *arg);
void stage_on_stop(stage_t *st, stage_stop_cb cb, void *arg);

/* A bus on the stage's loop and context with the pipeline's heartbeat settings.
 * kind BUS_ROUTER binds the server `endpoint` ("loader", "optimizer", "drafter<i>")
 * without ZMQ_ROUTER_HANDOVER (a live peer's routing id cannot be taken over);
 * BUS_DEALER connects to it with identity "<st->name>.<incarnation>" (a new incarnation
 * is a new routing id: it never collides with its predecessor's connection). One host: <run_dir>/<endpoint>.sock;
 * multi-node: runcfg_endpoint's tcp:// with the run's keys. NULL with dl_errmsg on
 * failure. */
bus_t *stage_bus(stage_t *st, bus_kind_t kind, const char *endpoint);

/* 1 when stage peer_id (PIPE_ID_*) runs on another node than this stage (a multi-node
 * run, runcfg_stage_node): the two never map each other's slabs, bytes move as
 * slab_data (common/pipe/xfer.h). 0 on one host and before stage_init. */
int stage_remote(const stage_t *st, uint32_t peer_id);

/* Call after xfer_bytes_out / xfer_bytes_in grew: the first time either leaves 0 the
 * metrics are published at once (not at the next 1 s tick), so even a short run shows
 * that the path across nodes is used. */
void stage_xfer_moved(stage_t *st);

/* Stage-to-stage membership (docs/ARCHITECTURE.md "Membership"). */

/* Puts this stage's token for receiver to_id (PIPE_ID_*) into hello h (cred_peer_token
 * with st's peer key; nothing when the stage has none). */
void stage_peer_token(const stage_t *st, uint32_t to_id, proto_hello_t *h);

/* A server's check of hello h from bus id `peer` on srv: its stage id in [lo, hi) with
 * the matching role, its token that of (stage id, incarnation) towards this stage (when
 * the stage has the peer key), then peers_admit into r. Returns the registry index with
 * *what / *old as peers_admit; or -1 after stage_refuse (nothing in r changed). */
int stage_admit(stage_t *st, peers_t *r, bus_t *srv, const char *peer, const proto_hello_t *h,
                uint32_t lo, uint32_t hi, peers_hello_t *what, uint64_t *old);

/* Refuses message type `type` from peer on srv: an `error` reply (code DL_EPROTO,
 * ref_type type, message "<type> refused: <why>", proto/PROTOCOL.md) and a WARN line,
 * at most one a second with the running count (st->refused). Changes nothing else. */
void stage_refuse(stage_t *st, bus_t *srv, const char *peer, uint32_t type, const char *why);

/* Encodes and sends m to peer on bus (peer ignored on a DEALER). Returns bus_send's
 * code; an encode error is logged and returned (DL_EPROTO). */
int stage_send(bus_t *bus, const char *peer, const proto_msg_t *m);
/* slab_export for handle h (m initialised here), sent as slab id wire_id. The wire
 * form is a handle or a name, not both: a CUDA slab travels as its 64-byte IPC handle
 * (tier GPU, shm_name "") with its GPU UUID, a host slab as its shm name (tier
 * host_tier: PROTO_TIER_HOST for inboxes, ignored by gradient/weight readers). */
void stage_slab_export_msg(const slab_handle_t *h, uint32_t wire_id, proto_msg_t *m);
/* The handle a peer maps (through its hcache) from a slab_export message: kind from
 * the handle's presence; a CUDA slab gets the cache-key name "/dl-ipc-<owner>-<inc>-<id>". */
void stage_slab_from_export(const proto_slab_export_t *e, slab_handle_t *h);

/* Decodes a payload; a malformed one is logged (with the peer) and DL_EPROTO is
 * returned (never fatal: a stage does not crash on a peer's bad message). */
int stage_decode(const char *who, const char *peer, const void *data, size_t len,
                 proto_msg_t *out);

/* Appends (name, value) to m (ignored past DL_PROTO_MAX_METRICS). */
void stage_metric(proto_metrics_t *m, const char *name, double value);
/* Adds dv to the value of metric `name` already in m (no-op when absent). A metrics
 * callback uses it to publish a phase counter that includes the wait in progress
 * (e.g. "wait_input_s" + seconds idle so far), so a stage stuck waiting shows it
 * before the wait ends. The stage's own counter (phase_s) is not changed. */
void stage_metric_add(proto_metrics_t *m, const char *name, double dv);
void stage_phase_add(stage_t *st, pipe_phase_t p, double seconds);
void stage_progress(stage_t *st);                 /* "made progress now" */
/* Sends a metrics message now (also done by the 1 s timer). */
void stage_publish_metrics(stage_t *st);

/* Runs the loop until every handle is closed. Returns 0. */
int stage_run(stage_t *st);
/* Closes the supervisor bus (the stage closes its own buses); the loop ends when all
 * handles are closed. */
void stage_close(stage_t *st);
/* Frees the loop and the ZeroMQ context after stage_run returned. */
void stage_fini(stage_t *st);

/* Windowed rate of a cumulative counter, for metrics such as tokens_per_s: the change of
 * the counter over the last `window_s` seconds (5 s in the stages) divided by the time it
 * spans, so a stage that produces in bursts (one micro-batch every few seconds) does not
 * publish 0 between bursts. Samples come from the 1 s metrics callback; up to
 * STAGE_RATE_SAMPLES are kept (older ones drop off). Zero-initialise the struct. */
#define STAGE_RATE_SAMPLES 32
typedef struct {
    double t[STAGE_RATE_SAMPLES], v[STAGE_RATE_SAMPLES];   /* monotonic s, counter value */
    int n, head;
} stage_rate_t;

/* Adds the sample (now, counter) and returns the rate (counter units per second) over
 * the samples of the last window_s seconds; 0 until two samples span > 0 s. */
double stage_rate(stage_rate_t *r, double now, double counter, double window_s);

/* Stage id <-> name helpers. */
void pipe_stage_name(uint32_t stage_id, char *out, size_t cap);
/* Endpoint name of drafter i: "drafter<i>". */
void pipe_drafter_endpoint(int i, char *out, size_t cap);

#endif
