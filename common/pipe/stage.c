/* Stage runtime (see stage.h). */
#include "common/pipe/stage.h"
#include "common/base/testhook.h"
#include "common/pipe/runcfg.h"
#include "common/mem/slab.h"
#include "common/base/cli.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "proto/codec.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

void pipe_stage_name(uint32_t id, char *out, size_t cap) {
    if (id == PIPE_ID_LOADER) snprintf(out, cap, "loader");
    else if (id == PIPE_ID_OPTIMIZER) snprintf(out, cap, "optimizer");
    else if (id >= PIPE_ID_TARGET0) snprintf(out, cap, "target%u", id - PIPE_ID_TARGET0);
    else if (id >= PIPE_ID_DRAFTER0) snprintf(out, cap, "drafter%u", id - PIPE_ID_DRAFTER0);
    else snprintf(out, cap, "stage%u", id);
}

void pipe_drafter_endpoint(int i, char *out, size_t cap) { snprintf(out, cap, "drafter%d", i); }

static void on_sup_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)bus;
    stage_t *st = arg;
    proto_msg_t m;
    if (stage_decode(st->name, "supervisor", data, len, &m) < 0) return;
    (void)peer;
    if (m.type == PROTO_CONTROL) {
        if (m.control.op == PROTO_CTL_STOP) {
            log_info("stop requested by the supervisor");
            if (!st->stopping) {
                st->stopping = 1;
                if (st->stop_cb) st->stop_cb(st, st->stop_arg);
            }
        } else if (m.control.op == PROTO_CTL_PLACEMENT) {
            /* a rebalance across nodes: the new node table first (the stage's main owns
             * *st->cfg), then the stage's own reaction (a target reconnects its drafter) */
            int rc = st->cfg ? runcfg_apply_placement((run_config_t *)st->cfg, m.control.ints, m.control.n_ints)
                             : 0;
            if (rc < 0) log_warn("placement from the supervisor ignored: %s", dl_errmsg());
            else if (rc > 0) log_info("new placement: %lld target(s), %lld drafter(s)", (long long)m.control.ints[0],
                                      (long long)m.control.ints[1]);
            if (rc >= 0 && st->control_cb) st->control_cb(st, &m.control, st->control_arg);
        } else if (st->control_cb) {
            st->control_cb(st, &m.control, st->control_arg);
        }
    } else {
        log_warn("supervisor sent an unexpected %s message", proto_type_name(m.type));
    }
    proto_msg_free(&m);
}

/* The stage's own shm prefix, for the exit handler (one stage per process: this is the
 * stage main context's state). */
static struct { char run_id[17]; char name[32]; uint64_t inc; int armed; } g_exit_sweep;

/* At exit (normal return, exit(1) on a fatal peer error, or after SIGTERM from the
 * parent-death signal when the supervisor was killed), unlink this incarnation's shm
 * objects: slab_destroy does it on the clean path, this covers every other one. */
static void stage_exit_sweep(void) {
    if (g_exit_sweep.armed)
        slab_sweep_stage(g_exit_sweep.run_id, g_exit_sweep.name, g_exit_sweep.inc);
}

/* The supervisor starts every stage with PR_SET_PDEATHSIG(SIGUSR1). The kernel sends
 * that signal each time the parent *thread* exits, so a killed multi-threaded supervisor
 * sends it several times; as SIGTERM, the 2nd one hit a stage whose loop had already
 * closed its signal watcher (default action: killed before its exit path unlinked its
 * shared memory). Here only the first one counts: it becomes one SIGTERM, which stops
 * the stage the normal way (its exit path and stage_exit_sweep unlink its objects). */
static volatile sig_atomic_t g_parent_gone;
static void on_parent_death(int signum) {
    (void)signum;
    if (g_parent_gone) return;
    g_parent_gone = 1;
    kill(getpid(), SIGTERM);
}

static void on_signal(bus_t *bus, int signum, void *arg) {
    (void)bus;
    stage_t *st = arg;
    log_info("signal %d: stopping", signum);
    if (!st->stopping) {
        st->stopping = 1;
        if (st->stop_cb) st->stop_cb(st, st->stop_arg);
    }
}

void stage_metric(proto_metrics_t *m, const char *name, double value) {
    if (m->n_metrics >= DL_PROTO_MAX_METRICS) return;
    proto_metric_t *e = &m->metrics[m->n_metrics++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->value = value;
}

void stage_metric_add(proto_metrics_t *m, const char *name, double dv) {
    for (uint32_t i = 0; i < m->n_metrics; i++)
        if (!strcmp(m->metrics[i].name, name)) { m->metrics[i].value += dv; return; }
}

void stage_publish_metrics(stage_t *st) {
    if (!st->sup || bus_is_closing(st->sup)) return;
    proto_msg_t m;
    proto_msg_init(&m, PROTO_METRICS);
    m.metrics.stage_id = st->stage_id;
    m.metrics.role = st->role;
    m.metrics.incarnation = st->incarnation;
    m.metrics.ts_ns = (uint64_t)(clock_wall_s() * 1e9);
    snprintf(m.metrics.state, sizeof m.metrics.state, "%s", proto_state_name(st->state));
    static const char *const phase_names[PHASE_N] = {"wait_input_s", "wait_credit_s", "copy_s",
                                                     "forward_s", "backward_s", "step_s", "wait_gpu_s"};
    for (int p = 0; p < PHASE_N; p++) stage_metric(&m.metrics, phase_names[p], st->phase_s[p]);
    double now = clock_mono_s();
    stage_metric(&m.metrics, "uptime_s", now - st->t_start);
    stage_metric(&m.metrics, "since_progress_s", now - st->last_progress);
    stage_metric(&m.metrics, "gpu_index", st->gpu_index);
    stage_metric(&m.metrics, "xfer_bytes_out", (double)st->xfer_bytes_out);
    stage_metric(&m.metrics, "xfer_bytes_in", (double)st->xfer_bytes_in);
    if (st->metrics_cb) st->metrics_cb(st, &m.metrics, st->metrics_arg);
    stage_send(st->sup, NULL, &m);
}

static void on_metrics_timer(bus_t *bus, void *arg) {
    (void)bus;
    stage_publish_metrics(arg);
}

bus_t *stage_bus(stage_t *st, bus_kind_t kind, const char *endpoint) {
    char ep[320];
    int net = st->cfg && st->cfg->net_port;
    if ((net ? runcfg_endpoint(st->cfg, st->run_dir, endpoint, ep, sizeof ep)
             : bus_endpoint(st->run_dir, endpoint, ep, sizeof ep)) < 0)
        return NULL;
    if (net && !st->has_keys) {
        dl_seterr(DL_EINVAL, "%s: a multi-node run needs the run's key file (--key)", endpoint);
        return NULL;
    }
    char id[BUS_ID_MAX + 1];   /* the incarnation in the routing id: membership (stage.h) */
    snprintf(id, sizeof id, "%s.%llu", st->name, (unsigned long long)st->incarnation);
    bus_opts_t o = {0};
    o.curve = net ? &st->keys : NULL;
    o.kind = kind;
    o.name = endpoint;
    o.identity = kind == BUS_DEALER ? id : NULL;
    o.no_handover = 1;
    o.zmq_ctx = st->zctx;
    o.heartbeat_interval_ms = PIPE_HEARTBEAT_MS;
    o.heartbeat_timeout_ms = PIPE_DEAD_MS;
    o.goodbye = 1;    /* an orderly close is not a death (bus.h, Goodbye) */
    bus_t *b = bus_new(&st->loop, &o);
    if (!b) return NULL;
    int rc = kind == BUS_ROUTER ? bus_bind(b, ep) : bus_connect(b, ep);
    if (rc < 0) {
        bus_destroy(&b);
        return NULL;
    }
    return b;
}

/* The membership credential into a hello to the supervisor (none: cred_len 0). */
static void hello_cred(proto_hello_t *h, int has, const uint8_t cred[CRED_BYTES]) {
    if (!has) return;
    memcpy(h->cred, cred, CRED_BYTES);
    h->cred_len = CRED_BYTES;
}

/* The supervisor's endpoint for a stage started with a (--sup, or sup.sock in --run-dir). */
static int sup_endpoint(const stage_args_t *a, char *buf, size_t cap) {
    if (!a->sup) return bus_endpoint(a->run_dir, "sup", buf, cap);
    if (strlen(a->sup) >= cap) return dl_seterr(DL_ERANGE, "--sup %s: too long", a->sup);
    snprintf(buf, cap, "%s", a->sup);
    return 0;
}

int stage_init(stage_t *st, proto_role_t role, uint32_t stage_id, const char *name, const stage_args_t *a,
               const run_config_t *cfg) {
    const char *run_dir = a->run_dir, *run_id = cfg->run_id;
    memset(st, 0, sizeof *st);
    snprintf(st->name, sizeof st->name, "%s", name);
    st->role = role;
    st->stage_id = stage_id;
    st->incarnation = a->incarnation ? a->incarnation : 1;
    st->cfg = cfg;
    st->has_keys = a->has_keys;
    if (a->has_keys) st->keys = a->keys;
    st->has_cred = a->has_cred;
    memcpy(st->cred, a->cred, sizeof st->cred);
    st->has_peer_key = a->has_peer_key;
    memcpy(st->peer_key, a->peer_key, sizeof st->peer_key);
    st->gpu_index = -1;
    if (strlen(run_dir) >= sizeof st->run_dir)
        return dl_seterr(DL_ERANGE, "--run-dir too long (%zu chars, max %zu)", strlen(run_dir),
                         sizeof st->run_dir - 1);
    snprintf(st->run_dir, sizeof st->run_dir, "%s", run_dir);
    snprintf(st->run_id, sizeof st->run_id, "%s", run_id);
    if (!g_exit_sweep.armed && slab_name_ok(run_id) && slab_name_ok(name)) {
        snprintf(g_exit_sweep.run_id, sizeof g_exit_sweep.run_id, "%s", run_id);
        snprintf(g_exit_sweep.name, sizeof g_exit_sweep.name, "%s", name);
        g_exit_sweep.inc = st->incarnation;
        g_exit_sweep.armed = 1;
        atexit(stage_exit_sweep);
        /* a predecessor killed without its exit path (kill -9) left its slabs: this
         * incarnation replaces it, so they go now rather than at the end of the run */
        int swept = st->incarnation > 1 ? slab_sweep_older(run_id, name, st->incarnation) : 0;
        if (swept > 0) log_info("removed %d shared-memory object(s) of earlier incarnations", swept);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_parent_death;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGUSR1, &sa, NULL);
    }
    st->state = PROTO_STATE_STARTING;
    st->t_start = st->last_progress = clock_mono_s();
    if (uv_loop_init(&st->loop) != 0) return dl_seterr(DL_EIO, "uv_loop_init failed");
    st->zctx = zmq_ctx_new();
    if (!st->zctx) return dl_seterr(DL_EIO, "zmq_ctx_new: %s", zmq_strerror(errno));
    DL_TRY(sup_endpoint(a, st->sup_ep, sizeof st->sup_ep));
    const char *ep = st->sup_ep;
    bus_opts_t o = {0};
    o.kind = BUS_DEALER;
    o.name = "supervisor";
    o.curve = a->has_keys ? &st->keys : NULL;
    o.identity = st->name;
    o.zmq_ctx = st->zctx;
    o.heartbeat_interval_ms = PIPE_HEARTBEAT_MS;
    o.heartbeat_timeout_ms = PIPE_DEAD_MS;
    o.handle_signals = 1;
    o.goodbye = 1;
    st->sup = bus_new(&st->loop, &o);
    if (!st->sup) return DL_EIO;
    DL_TRY(bus_connect(st->sup, ep));
    bus_on_message(st->sup, on_sup_msg, st);
    bus_on_signal(st->sup, on_signal, st);
    proto_msg_t h;
    proto_msg_init(&h, PROTO_HELLO);
    h.hello.role = role;
    h.hello.stage_id = stage_id;
    h.hello.incarnation = st->incarnation;
    h.hello.pid = (uint32_t)getpid();
    h.hello.proto_version = DL_PROTO_VERSION;
    h.hello.capabilities = PROTO_CAP_SHM | PROTO_CAP_HOST_TIER;
    hello_cred(&h.hello, st->has_cred, st->cred);
    DL_TRY(stage_send(st->sup, NULL, &h));
    DL_TRY(bus_timer_start(st->sup, 1000, 1000, on_metrics_timer, st, &st->metrics_timer));
    return 0;
}

int stage_args(int argc, char **argv, const char *prog, int max_index, void (*usage)(FILE *), stage_args_t *a) {
    memset(a, 0, sizeof *a);
    a->incarnation = 1;
    a->index = -1;
    enum { O_RUN = 256, O_INC, O_IDX, O_LL, O_SUP, O_KEY };
    static const struct option opts[] = {
        {"run-dir", 1, 0, O_RUN}, {"incarnation", 1, 0, O_INC}, {"index", 1, 0, O_IDX},
        {"log-level", 1, 0, O_LL}, {"sup", 1, 0, O_SUP}, {"key", 1, 0, O_KEY}, {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    const char *key = NULL;
    int c;
    int64_t v;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case O_RUN: a->run_dir = optarg; break;
        case O_INC: rc = cli_parse_i64("--incarnation", optarg, 1, INT64_MAX, &v); a->incarnation = (uint64_t)v; break;
        case O_IDX: rc = cli_parse_i64("--index", optarg, 0, max_index, &v); a->index = (int)v; break;
        case O_LL: { log_level_t l; rc = log_parse_level(optarg, &l); if (!rc) log_set_level(l); break; }
        case O_SUP: a->sup = optarg; break;
        case O_KEY: key = optarg; break;
        case 'h': usage(stdout); a->exit_code = 0; return -1;
        default: usage(stderr); a->exit_code = 2; return -1;
        }
        if (rc < 0) { cli_error(prog, dl_errmsg()); a->exit_code = 2; return -1; }
    }
    if (optind < argc) {
        cli_error(prog, "unexpected argument (every setting comes from `draftline run`)");
        a->exit_code = 2;
        return -1;
    }
    if (!a->run_dir || (max_index > 0 && a->index < 0)) {
        cli_error(prog, max_index > 0 ? "--run-dir and --index are required" : "--run-dir is required");
        a->exit_code = 2;
        return -1;
    }
    if (!a->sup != !key || (a->sup && strncmp(a->sup, "tcp://", 6) != 0)) {
        cli_error(prog, "--sup tcp://HOST:PORT and --key FILE go together (a multi-node run)");
        a->exit_code = 2;
        return -1;
    }
    if (key && bus_curve_keys_load(key, &a->keys) < 0) {
        cli_error(prog, dl_errmsg());
        a->exit_code = 2;
        return -1;
    }
    a->has_keys = key != NULL;
    if (a->index < 0) a->index = 0;
    /* the credential: read, overwritten where it lies (so /proc/<pid>/environ no longer
     * shows it) and unset at once (children never inherit it); its value is never printed */
    char *cred = getenv(CRED_ENV);
    if (cred) {
        int bad = cred_from_hex(cred, a->cred) < 0;
        memset(cred, '0', strlen(cred));
        unsetenv(CRED_ENV);
        if (bad) {
            cli_error(prog, CRED_ENV ": not 64 hex digits (the supervisor hands it to its stages)");
            a->exit_code = 2;
            return -1;
        }
        a->has_cred = 1;
    }
    return 0;
}

/* ---- the run configuration, asked for before anything is loaded ---- */

typedef struct {
    uint32_t stage_id;
    uint64_t inc;
    run_config_t *cfg;
    stage_args_t *a;            /* peer_key from CONTROL PEERS */
    int got, rc;
    bus_timer_t *timer;
    char refused[DL_PROTO_ERRMSG_MAX + 1];   /* the supervisor's error reply ("" none) */
} cfg_wait_t;

static void on_cfg_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)peer;
    cfg_wait_t *w = arg;
    proto_msg_t m;
    if (w->got || stage_decode("stage", "supervisor", data, len, &m) < 0) return;
    if (m.type == PROTO_ERROR && m.error.ref_type == PROTO_HELLO) {
        /* not a member (a missing or wrong credential): waiting longer cannot help */
        w->got = 1;
        w->rc = DL_EPROTO;
        snprintf(w->refused, sizeof w->refused, "%s", m.error.message[0] ? m.error.message : "refused");
        bus_timer_stop(&w->timer);
        bus_close(bus, NULL, NULL);
    } else if (m.type == PROTO_CONTROL && m.control.op == PROTO_CTL_PEERS) {
        /* the run's peer key (membership), on this connection just before RUN_CONFIG */
        if (cred_from_hex(m.control.arg, w->a->peer_key) == 0) w->a->has_peer_key = 1;
        else log_warn("supervisor sent a malformed peer key: dropped");
    } else if (m.type != PROTO_RUN_CONFIG) {
        log_warn("supervisor sent %s before the run configuration: dropped", proto_type_name(m.type));
    } else if (m.run_config.stage_id != w->stage_id || m.run_config.incarnation != w->inc) {
        log_warn("run configuration for stage %u incarnation %llu (this is %u, %llu): dropped",
                 m.run_config.stage_id, (unsigned long long)m.run_config.incarnation, w->stage_id,
                 (unsigned long long)w->inc);
    } else {
        w->got = 1;
        w->rc = runcfg_from_msg(&m.run_config, w->cfg);
        if (w->rc == 0) w->rc = runcfg_validate(w->cfg);
        bus_timer_stop(&w->timer);
        bus_close(bus, NULL, NULL);
    }
    proto_msg_free(&m);
}

static void on_cfg_timeout(bus_t *bus, void *arg) {
    (void)arg;
    bus_close(bus, NULL, NULL);
}

int stage_config(proto_role_t role, uint32_t stage_id, const char *name, stage_args_t *a,
                 int timeout_ms, run_config_t *cfg) {
    uint64_t incarnation = a->incarnation;
    char ep[320];
    DL_TRY(sup_endpoint(a, ep, sizeof ep));
    int64_t hook_ms;   /* test hook: a short wait, so the time-out itself can be tested */
    if (testhook_i64("config_timeout_ms", &hook_ms) && hook_ms > 0 && hook_ms < timeout_ms) timeout_ms = (int)hook_ms;
    uv_loop_t loop;
    if (uv_loop_init(&loop) != 0) return dl_seterr(DL_EIO, "uv_loop_init failed");
    cfg_wait_t w = {.stage_id = stage_id, .inc = incarnation ? incarnation : 1, .cfg = cfg, .a = a};
    /* its own short-lived DEALER (no signal handling: until stage_init a SIGTERM ends
     * the process at once, as before); the supervisor's ROUTER hands the identity over
     * to stage_init's DEALER */
    bus_opts_t o = {0};
    o.kind = BUS_DEALER;
    o.name = "supervisor";
    o.identity = name;      /* no heartbeats: it lives for one request and answer */
    o.curve = a->has_keys ? &a->keys : NULL;
    bus_t *b = bus_new(&loop, &o);
    int rc = b ? bus_connect(b, ep) : DL_EIO;
    if (rc == 0) {
        bus_on_message(b, on_cfg_msg, &w);
        proto_msg_t h;
        proto_msg_init(&h, PROTO_HELLO);
        h.hello.role = role;
        h.hello.stage_id = stage_id;
        h.hello.incarnation = w.inc;
        h.hello.pid = (uint32_t)getpid();
        h.hello.proto_version = DL_PROTO_VERSION;
        h.hello.capabilities = PROTO_CAP_WANT_CONFIG;   /* gpu_uuid "": nothing is set up yet */
        hello_cred(&h.hello, a->has_cred, a->cred);
        rc = stage_send(b, NULL, &h);
    }
    if (rc == 0) rc = bus_timer_start(b, (uint64_t)timeout_ms, 0, on_cfg_timeout, &w, &w.timer);
    if (rc < 0 && b) bus_close(b, NULL, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    bus_destroy(&b);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    if (rc < 0) return dl_seterr(rc, "asking the supervisor (%s) for the run configuration: %s", ep, dl_errmsg());
    if (!w.got)
        return dl_seterr(DL_ETIMEDOUT, "no run configuration from the supervisor (%s) within %g s", ep,
                         timeout_ms / 1000.0);
    if (w.refused[0]) return dl_seterr(DL_EPROTO, "the supervisor (%s) answered: %s", ep, w.refused);
    if (w.rc < 0) return dl_seterr(w.rc, "bad run configuration from the supervisor (%s): %s", ep, dl_errmsg());
    return 0;
}

void stage_on_metrics(stage_t *st, stage_metrics_cb cb, void *arg) { st->metrics_cb = cb; st->metrics_arg = arg; }
void stage_on_control(stage_t *st, stage_control_cb cb, void *arg) { st->control_cb = cb; st->control_arg = arg; }
void stage_on_stop(stage_t *st, stage_stop_cb cb, void *arg) { st->stop_cb = cb; st->stop_arg = arg; }

void stage_xfer_moved(stage_t *st) {
    int now = (st->xfer_bytes_out > 0) | (st->xfer_bytes_in > 0) << 1;
    if ((now & ~st->xfer_shown) == 0) return;
    st->xfer_shown |= now;
    stage_publish_metrics(st);
}

int stage_remote(const stage_t *st, uint32_t peer_id) {
    return st->cfg && st->cfg->net_port && runcfg_stage_node(st->cfg, peer_id) != st->cfg->node;
}

/* ---- stage-to-stage membership (docs/ARCHITECTURE.md "Membership") ---- */

void stage_peer_token(const stage_t *st, uint32_t to_id, proto_hello_t *h) {
    if (!st->has_peer_key) return;
    cred_peer_token(st->peer_key, st->run_id, st->stage_id, st->incarnation, to_id, h->cred);
    h->cred_len = CRED_BYTES;
}

/* The role a stage id is a stage of (PROTO_ROLE_* ; 0 for none). */
static proto_role_t role_of(uint32_t id) {
    if (id == PIPE_ID_LOADER) return PROTO_ROLE_LOADER;
    if (id == PIPE_ID_OPTIMIZER) return PROTO_ROLE_OPTIMIZER;
    if (id >= PIPE_ID_TARGET0 && id < PIPE_ID_TARGET0 + PIPE_MAX_TARGETS) return PROTO_ROLE_TARGET;
    if (id >= PIPE_ID_DRAFTER0 && id < PIPE_ID_DRAFTER0 + PIPE_MAX_DRAFTERS) return PROTO_ROLE_DRAFTER;
    return (proto_role_t)0;
}

void stage_refuse(stage_t *st, bus_t *srv, const char *peer, uint32_t type, const char *why) {
    st->refused++;
    double now = clock_mono_s();
    if (now - st->refuse_logged_s >= 1.0) {   /* one line a second: an intruder cannot flood the log */
        st->refuse_logged_s = now;
        log_warn("%s from %s refused: %s (%llu refused so far)", proto_type_name((proto_type_t)type), peer,
                 why, (unsigned long long)st->refused);
    }
    proto_msg_t e;
    proto_msg_init(&e, PROTO_ERROR);
    e.error.code = DL_EPROTO;
    e.error.ref_type = type;
    snprintf(e.error.message, sizeof e.error.message, "%s refused: %s",
             proto_type_name((proto_type_t)type), why);
    stage_send(srv, peer, &e);
}

int stage_admit(stage_t *st, peers_t *r, bus_t *srv, const char *peer, const proto_hello_t *h,
                uint32_t lo, uint32_t hi, peers_hello_t *what, uint64_t *old) {
    char why[160];
    const char *w = NULL;
    if (h->stage_id < lo || h->stage_id >= hi || h->role != role_of(h->stage_id)) {
        snprintf(why, sizeof why, "%s %u may not say hello to %s", proto_role_name(h->role), h->stage_id, st->name);
        stage_refuse(st, srv, peer, PROTO_HELLO, why);
        return -1;
    }
    if (st->has_peer_key) {
        uint8_t want[CRED_BYTES];
        cred_peer_token(st->peer_key, st->run_id, h->stage_id, h->incarnation, st->stage_id, want);
        int ok = cred_equal(h->cred, h->cred_len, want);
        memset(want, 0, sizeof want);
        if (!ok) {
            char name[32];
            pipe_stage_name(h->stage_id, name, sizeof name);
            snprintf(why, sizeof why, "not a member of run %s in role %s (%s token)", st->run_id, name,
                     h->cred_len ? "wrong" : "no");
            stage_refuse(st, srv, peer, PROTO_HELLO, why);
            return -1;
        }
    }
    int i = peers_admit(r, peer, h->stage_id, h->incarnation, what, old, &w);
    if (i < 0) {
        snprintf(why, sizeof why, "%s incarnation %llu: %s", proto_role_name(h->role),
                 (unsigned long long)h->incarnation, w);
        stage_refuse(st, srv, peer, PROTO_HELLO, why);
    }
    return i;
}

int stage_send(bus_t *bus, const char *peer, const proto_msg_t *m) {
    if (!bus || bus_is_closing(bus)) return DL_ECLOSED;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    int rc = proto_encode(m, &sb);
    if (rc < 0) {
        log_error("encode %s: %s", proto_type_name(m->type), dl_errmsg());
    } else {
        rc = bus_send(bus, peer, sb.data, sb.size);
        if (rc < 0)
            log_warn("send %s to %s on %s: %s", proto_type_name(m->type),
                     peer && *peer ? peer : "upstream", bus_name(bus), dl_strerror(rc));
    }
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

int stage_decode(const char *who, const char *peer, const void *data, size_t len,
                 proto_msg_t *out) {
    int rc = proto_decode(data, len, out);
    if (rc < 0) log_warn("%s: malformed message from %s dropped: %s", who, peer && *peer ? peer : "upstream",
                         dl_errmsg());
    return rc;
}

void stage_phase_add(stage_t *st, pipe_phase_t p, double s) { if (s > 0) st->phase_s[p] += s; }
void stage_progress(stage_t *st) { st->last_progress = clock_mono_s(); }

int stage_run(stage_t *st) {
    uv_run(&st->loop, UV_RUN_DEFAULT);
    return 0;
}

void stage_close(stage_t *st) {
    if (st->sup && bus_is_closing(st->sup)) st->metrics_timer = NULL;   /* bus_close freed it */
    if (st->metrics_timer) bus_timer_stop(&st->metrics_timer);
    if (st->sup && !bus_is_closing(st->sup)) {
        stage_publish_metrics(st);
        bus_close(st->sup, NULL, NULL);
    }
}

void stage_fini(stage_t *st) {
    bus_destroy(&st->sup);
    uv_run(&st->loop, UV_RUN_DEFAULT);
    uv_loop_close(&st->loop);
    if (st->zctx) zmq_ctx_term(st->zctx);
    st->zctx = NULL;
}

double stage_rate(stage_rate_t *r, double now, double counter, double window_s) {
    r->t[r->head] = now;
    r->v[r->head] = counter;
    r->head = (r->head + 1) % STAGE_RATE_SAMPLES;
    if (r->n < STAGE_RATE_SAMPLES) r->n++;
    /* the oldest sample inside the window (the newest one is the one just added) */
    int oldest = -1;
    for (int k = 1; k < r->n; k++) {
        int i = (r->head - 1 - k + 2 * STAGE_RATE_SAMPLES) % STAGE_RATE_SAMPLES;
        if (now - r->t[i] > window_s + 1e-9) break;
        oldest = i;
    }
    if (oldest < 0 || now <= r->t[oldest]) return 0;
    return (counter - r->v[oldest]) / (now - r->t[oldest]);
}

void stage_slab_export_msg(const slab_handle_t *h, uint32_t wire_id, proto_msg_t *m) {
    proto_msg_init(m, PROTO_SLAB_EXPORT);
    proto_slab_export_t *e = &m->slab_export;
    e->owner_id = h->owner_id;
    e->incarnation = h->incarnation;
    e->slab_id = wire_id;
    e->tier = PROTO_TIER_HOST;
    e->bytes = h->bytes;
    snprintf(e->gpu_uuid, sizeof e->gpu_uuid, "%s", h->gpu_uuid);
    if (h->kind == SLAB_CUDA) {
        e->tier = PROTO_TIER_GPU;
        memcpy(e->handle, h->ipc, SLAB_IPC_BYTES);
        e->handle_len = SLAB_IPC_BYTES;
    } else {
        snprintf(e->shm_name, sizeof e->shm_name, "%s", h->name);
    }
}

void stage_slab_from_export(const proto_slab_export_t *e, slab_handle_t *h) {
    memset(h, 0, sizeof *h);
    h->kind = e->handle_len == SLAB_IPC_BYTES ? SLAB_CUDA : SLAB_HOST;
    h->owner_id = e->owner_id;
    h->incarnation = e->incarnation;
    h->slab_id = e->slab_id;
    h->bytes = e->bytes;
    snprintf(h->gpu_uuid, sizeof h->gpu_uuid, "%s", e->gpu_uuid);
    if (h->kind == SLAB_CUDA) {
        memcpy(h->ipc, e->handle, SLAB_IPC_BYTES);
        snprintf(h->name, sizeof h->name, "/dl-ipc-%u-%llu-%u", e->owner_id,
                 (unsigned long long)e->incarnation, e->slab_id);
    } else {
        snprintf(h->name, sizeof h->name, "%s", e->shm_name);
    }
}
