/* Supervisor, the head's side of node agents (see nodes.h). */
#include "supervisor/nodes.h"
#include "supervisor/node_agent.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

void sup__nodes_init(sup_t *S) {
    const sup_opts_t *o = S->o;
    S->ntab.n = o->n_nodes > 0 ? (o->n_nodes < RUNCFG_NODES_MAX ? o->n_nodes : RUNCFG_NODES_MAX) : 1;
    for (int k = 0; k < S->ntab.n; k++) snprintf(S->nodes[k].name, sizeof S->nodes[k].name, "%s", o->node_names[k]);
    if (!S->nodes[0].name[0]) snprintf(S->nodes[0].name, sizeof S->nodes[0].name, "head");
    if (gethostname(S->nodes[0].hostname, sizeof S->nodes[0].hostname - 1) != 0) S->nodes[0].hostname[0] = 0;
    S->nodes[0].up = S->nodes[0].joined = 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);   /* as an agent reports its own */
    S->nodes[0].cores = cores > 0 ? (uint32_t)cores : 0;
    S->ntab.on = o->listen_port > 0 && !S->fake_nodes && (o->nodes_wait > 0 || S->ntab.n > 1);
    S->ntab.t0 = clock_mono_s();
}

int sup__stage_node(const sup_t *S, const sstage_t *x) {
    int k = x->node_was > 0 ? x->node_was - 1 : x->spec->node;
    return S->ntab.on && k > 0 && k < S->ntab.n ? k : 0;
}

const char *sup__stage_node_name(const sup_t *S, const sstage_t *x) {
    return S->ntab.on ? S->nodes[sup__stage_node(S, x)].name : "";
}

int sup__node_can_spawn(const sup_t *S, sstage_t *x) {
    x->node_was = 0;   /* the incarnation that ran on the old node is gone */
    return !S->ntab.on || S->nodes[sup__stage_node(S, x)].up;
}

/* Names of the wanted nodes that are (joined = 1) / are not (0) alive into buf. */
static void list_nodes(const sup_t *S, int up, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int k = 1; k < S->ntab.n && n < cap; k++)
        if (S->nodes[k].up == up)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", S->nodes[k].name);
    if (!buf[0]) snprintf(buf, cap, "none");
}

static int n_up(const sup_t *S) {
    int a = 0;
    for (int k = 1; k < S->ntab.n; k++) a += S->nodes[k].up;
    return a;
}

/* Every named node alive and at least --nodes agents. */
static int all_joined(const sup_t *S) {
    for (int k = 1; k < S->o->n_nodes && k < S->ntab.n; k++) if (!S->nodes[k].up) return 0;
    return n_up(S) >= S->o->nodes_wait;
}

int sup__nodes_defer_start(sup_t *S) {
    if (!S->ntab.on) return 0;
    for (int i = 0; i < S->n; i++) S->st[i].exited = 1;   /* not started yet (none runs) */
    char miss[400];
    list_nodes(S, 0, miss, sizeof miss);
    int named = S->o->n_nodes > 1 ? S->o->n_nodes - 1 : 0, more = S->o->nodes_wait - named;
    printf("waiting for %d named node(s) to join (%s)", named, miss);
    if (more > 0) printf(" and %d more agent(s) (--nodes %d)", more, S->o->nodes_wait);
    printf(": `draftline node --join HOST:PORT --key FILE --name NAME` on each\n");
    fflush(stdout);
    return 1;
}

static void wait_line(sup_t *S, double now, int more);

void sup__nodes_tick(sup_t *S, double now) {
    if (!S->ntab.on || S->ntab.ready || S->stopping) return;
    char have[400], miss[400];
    list_nodes(S, 1, have, sizeof have);
    list_nodes(S, 0, miss, sizeof miss);
    if (all_joined(S)) {
        S->ntab.ready = 1;
        S->ntab.t_ready = now;
        printf("[%5.0fs] every node joined (%s): starting the stages\n", now - S->t0, have);
        fflush(stdout);
        for (int i = 0; i < S->n; i++) sup__spawn(S, &S->st[i]);
        return;
    }
    int more = S->o->nodes_wait - n_up(S);
    if (now - S->ntab.t0 >= S->o->join_timeout_s) {
        snprintf(S->ntab.failed, sizeof S->ntab.failed, "--join-timeout %.0f s passed: node(s) missing: %.200s; %d more "
                 "agent(s) wanted by --nodes %d (joined: %.200s)", S->o->join_timeout_s, miss, more > 0 ? more : 0,
                 S->o->nodes_wait, have);
        S->failed = 1;
        sup__begin_stop(S, "the nodes did not join");
        return;
    }
    wait_line(S, now, more);
}

/* While the head waits for its nodes: "waiting for nodes: b, c (1/3 joined, 12 s)",
 * naming the named nodes not up and the agents --nodes still wants (more), at most
 * every SUP_NODES_PROGRESS_S; the same who-is-missing again only after
 * SUP_NODES_REMIND_S. */
static void wait_line(sup_t *S, double now, int more) {
    if (S->ntab.last_line <= 0) S->ntab.last_line = S->ntab.t0;   /* the start said it first */
    if (now - S->ntab.last_line < SUP_NODES_PROGRESS_S) return;
    char who[512];
    size_t n = 0;
    int named = 0, missing_named = 0;
    who[0] = 0;
    for (int k = 1; k < S->o->n_nodes && k < S->ntab.n; k++) {
        named++;
        if (S->nodes[k].up) continue;
        missing_named++;
        if (n < sizeof who) n += (size_t)snprintf(who + n, sizeof who - n, "%s%s", n ? ", " : "", S->nodes[k].name);
    }
    int extra = more - missing_named;
    if (extra > 0 && n < sizeof who)
        n += (size_t)snprintf(who + n, sizeof who - n, "%s%d more agent(s) for --nodes %d", n ? " and " : "", extra,
                              S->o->nodes_wait);
    int up = n_up(S), want = named > S->o->nodes_wait ? named : S->o->nodes_wait;
    if (want < up) want = up;
    if (!strcmp(who, S->ntab.said) && now - S->ntab.last_line < SUP_NODES_REMIND_S) return;
    snprintf(S->ntab.said, sizeof S->ntab.said, "%s", who);
    S->ntab.last_line = now;
    printf("[%5.0fs] waiting for nodes: %s (%d/%d joined, %.0f s)\n", now - S->t0, who[0] ? who : "none", up, want,
           now - S->ntab.t0);
    fflush(stdout);
}

static int node_by_name(const sup_t *S, const char *name) {
    for (int k = 1; k < S->ntab.n; k++) if (!strcmp(S->nodes[k].name, name)) return k;
    return -1;
}

static int node_by_peer(const sup_t *S, const char *peer) {
    for (int k = 1; k < S->ntab.n; k++) if (S->nodes[k].peer[0] && !strcmp(S->nodes[k].peer, peer)) return k;
    return -1;
}

static void refuse(sup_t *S, const char *peer, const char *why) {
    proto_msg_t m;
    proto_msg_init(&m, PROTO_ERROR);
    m.error.code = DL_EINVAL;
    m.error.ref_type = PROTO_NODE_HELLO;
    snprintf(m.error.message, sizeof m.error.message, "%s", why);
    log_warn("node hello from %s refused: %s", peer, m.error.message);
    stage_send(S->bus, peer, &m);
}

static void welcome(sup_t *S, const char *peer, int k) {
    proto_msg_t m;
    proto_msg_init(&m, PROTO_NODE_WELCOME);
    snprintf(m.node_welcome.run_id, sizeof m.node_welcome.run_id, "%s", S->o->run_id);
    m.node_welcome.node_index = (uint32_t)k;
    m.node_welcome.node_incarnation = S->nodes[k].incarnation;
    stage_send(S->bus, peer, &m);
}

/* Every stage on node k (lost): told to stop (CONTROL STOP, in case it still runs under a
 * stalled agent), then dead, as after a death; they wait for the node. */
static void node_lost(sup_t *S, int k, const char *why) {
    sup_node_t *nd = &S->nodes[k];
    nd->up = 0;
    char who[600] = "";
    size_t n = 0;
    for (int i = 0; i < S->n; i++) {
        sstage_t *x = &S->st[i];
        if (sup__stage_node(S, x) != k || x->exited) continue;
        n += (size_t)snprintf(who + n, n < sizeof who ? sizeof who - n : 0, "%s%s", n ? ", " : "", x->spec->name);
        if (n >= sizeof who) n = sizeof who - 1;
        /* a stalled agent's stages may still run, connected to us: told to stop now, so
         * none of them (an optimizer above all) goes on working with the stages started
         * in their place; a node that is really gone does not hear it */
        sup__send_ctl(S, x, PROTO_CTL_STOP, NULL, 0);
        sup__on_exit(S, x, SIGKILL);   /* a wait status: killed by SIGKILL */
    }
    sup__progress_break(S);
    printf("node %s lost (%s): %s stopped; %s\n", nd->name, why, who[0] ? who : "no stage",
           S->stopping ? "the run is stopping" : "waiting for it to rejoin");
    fflush(stdout);
    sup__write_run_json(S);
}

/* The node-level checks of hello h from peer (node k by name, -1: unknown): refuses it
 * (PROTO_ERROR naming why) and returns 1, or 0. */
static int hello_refused(sup_t *S, const char *peer, const proto_node_hello_t *h, int k) {
    char why[DL_PROTO_ERRMSG_MAX + 1];
    const sup_node_t *nd = k > 0 ? &S->nodes[k] : NULL;
    if (!strcmp(h->name, S->nodes[0].name) || !strcmp(h->name, "head")) {
        snprintf(why, sizeof why, "node name %.64s is the head's: pass another --name", h->name);
    } else if (k < 0 && S->o->n_nodes > 1) {
        char names[400];
        size_t n = 0;
        names[0] = 0;
        for (int j = 1; j < S->o->n_nodes && n < sizeof names; j++)
            n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", j > 1 ? ", " : "", S->o->node_names[j]);
        snprintf(why, sizeof why, "node %.64s is not in this run's placement (%.300s)", h->name, names);
    } else if (nd && nd->up && nd->incarnation != h->incarnation) {
        snprintf(why, sizeof why, "node %.64s is up (pid %u on %.64s, run dir %.200s): a second agent with that name "
                 "is refused; an agent that was restarted is taken once the head has declared the old one lost "
                 "(%.0f s of silence)", nd->name, nd->pid, nd->hostname, nd->run_dir, PIPE_DEAD_MS / 1000.0);
    } else if (nd && nd->joined && !nd->up && ((size_t)h->n_run_dir != strlen(nd->run_dir) ||
                                               memcmp(h->run_dir, nd->run_dir, h->n_run_dir) != 0)) {
        snprintf(why, sizeof why, "node %.64s joined with run dir %.160s: rejoin with --run-dir %.160s: its "
                 "checkpoints and logs are there", nd->name, nd->run_dir, nd->run_dir);
    } else {
        return 0;
    }
    refuse(S, peer, why);
    return 1;
}

static void on_node_hello(sup_t *S, const char *peer, const proto_node_hello_t *h) {
    char want[BUS_ID_MAX + 1], why[256];
    snprintf(want, sizeof want, "node-%.*s.%08x", NODE_NAME_CHARS, h->name, (unsigned)(h->incarnation & 0xffffffffu));
    if (h->proto_version != DL_PROTO_VERSION) {
        snprintf(why, sizeof why, "protocol version %u: this head speaks %u (same draftline version on every node)",
                 h->proto_version, DL_PROTO_VERSION);
        refuse(S, peer, why);
        return;
    }
    if (strcmp(want, peer) != 0) {
        snprintf(why, sizeof why, "bus id %s: a node agent's is node-<name>.<incarnation> (%s)", peer, want);
        refuse(S, peer, why);
        return;
    }
    if (!h->addr[0] || strlen(h->addr) > RUNCFG_ADDR_MAX) {
        snprintf(why, sizeof why, "address '%.100s': 1..%d characters (--advertise)", h->addr, RUNCFG_ADDR_MAX);
        refuse(S, peer, why);
        return;
    }
    int k = node_by_name(S, h->name);
    if (hello_refused(S, peer, h, k)) return;
    if (k < 0) {
        if (S->ntab.n >= RUNCFG_NODES_MAX) {
            snprintf(why, sizeof why, "too many nodes: %d agents at most, and %d are known", RUNCFG_NODES_MAX - 1,
                     S->ntab.n - 1);
            refuse(S, peer, why);
            return;
        }
        k = S->ntab.n++;
        snprintf(S->nodes[k].name, sizeof S->nodes[k].name, "%s", h->name);
    }
    sup_node_t *nd = &S->nodes[k];
    int again = nd->joined && !nd->up;
    int dup = nd->up && nd->incarnation == h->incarnation;   /* a hello sent again while waiting */
    snprintf(nd->hostname, sizeof nd->hostname, "%s", h->hostname);
    snprintf(nd->addr, sizeof nd->addr, "%.*s", RUNCFG_ADDR_MAX, h->addr);
    snprintf(nd->run_dir, sizeof nd->run_dir, "%.*s", (int)h->n_run_dir, h->run_dir);
    snprintf(nd->peer, sizeof nd->peer, "%s", peer);
    nd->cores = h->cores;
    nd->n_gpus = h->n_gpu_free_mib;
    nd->incarnation = h->incarnation;
    nd->pid = h->pid;
    nd->joined = nd->up = 1;
    welcome(S, peer, k);
    if (dup) return;
    sup__progress_break(S);
    printf("node %s %sjoined as node %d: %s (%s), %u core(s), %u GPU(s), run dir %s\n", nd->name, again ? "re" : "",
           k, nd->hostname, nd->addr, nd->cores, nd->n_gpus, nd->run_dir);
    fflush(stdout);
    sup__write_run_json(S);
}

static void on_node_stage(sup_t *S, int k, const proto_node_stage_t *e) {
    sstage_t *x = sup__by_id(S, e->stage_id);
    if (!x || sup__stage_node(S, x) != k || x->incarnation != e->incarnation || x->exited) return;
    if (e->event == PROTO_NODE_EV_STARTED) {
        x->pid = (pid_t)e->pid;
        log_info("%s started on node %s (pid %u, incarnation %llu)", x->spec->name, S->nodes[k].name, e->pid,
                 (unsigned long long)e->incarnation);
        if (S->stopping) sup__kill(S, x, SIGTERM);
        sup__write_run_json(S);
        return;
    }
    if (e->event == PROTO_NODE_EV_FAILED)
        log_error("node %s could not start %s: %s", S->nodes[k].name, x->spec->name, strerror(e->wait_status));
    /* FAILED reads as an exec failure (exit 127), as a local child's would */
    sup__on_exit(S, x, e->event == PROTO_NODE_EV_EXITED ? e->wait_status : 127 << 8);
}

/* Node k was declared lost but is heard again (its agent stalled, it did not notice):
 * CONTROL STOP "rejoin" makes it stop its stages and join again. At most once a second. */
static void send_rejoin(sup_t *S, int k) {
    sup_node_t *nd = &S->nodes[k];
    double now = clock_mono_s();
    if (now - nd->rejoin_sent < 1.0) return;
    nd->rejoin_sent = now;
    proto_msg_t m;
    proto_msg_init(&m, PROTO_CONTROL);
    m.control.op = PROTO_CTL_STOP;
    snprintf(m.control.arg, sizeof m.control.arg, "%s", NODE_STOP_REJOIN);
    log_info("node %s (lost) is heard again: told to stop its stages and join again", nd->name);
    stage_send(S->bus, nd->peer, &m);
}

void sup__nodes_on_new(bus_t *bus, const char *peer, void *arg) {
    (void)bus;
    sup_t *S = arg;
    if (!S->ntab.on) return;
    int k = node_by_peer(S, peer);
    if (k > 0 && S->nodes[k].joined && !S->nodes[k].up) send_rejoin(S, k);
}

int sup__nodes_on_msg(sup_t *S, const char *peer, const proto_msg_t *m) {
    if (m->type < PROTO_NODE_HELLO || m->type > PROTO_NODE_STAGE) return 0;
    if (!S->ntab.on) {
        log_warn("%s from %s: this run takes no node agents (no --nodes): dropped", proto_type_name(m->type), peer);
        return 1;
    }
    if (m->type == PROTO_NODE_HELLO) { on_node_hello(S, peer, &m->node_hello); return 1; }
    int k = node_by_peer(S, peer);
    if (k > 0 && !S->nodes[k].up) { send_rejoin(S, k); return 1; }
    if (k < 0) {
        log_warn("%s from %s, not a live node: dropped", proto_type_name(m->type), peer);
        return 1;
    }
    if (m->type == PROTO_NODE_STAGE) on_node_stage(S, k, &m->node_stage);
    else log_warn("%s from node %s: dropped (head to node only)", proto_type_name(m->type), S->nodes[k].name);
    return 1;
}

void sup__nodes_on_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg) {
    (void)bus;
    sup_t *S = arg;
    if (!S->ntab.on) return;
    int k = node_by_peer(S, peer);
    if (k < 0 || !S->nodes[k].up) return;
    char why[64];
    snprintf(why, sizeof why, "no heartbeat for %.1f s", (double)silent_ms / 1000.0);
    node_lost(S, k, why);
}

void sup__spawn_remote(sup_t *S, sstage_t *x) {
    int k = sup__stage_node(S, x);
    sup_node_t *nd = &S->nodes[k];
    proto_msg_t m;
    proto_msg_init(&m, PROTO_NODE_SPAWN);
    proto_node_spawn_t *sp = &m.node_spawn;
    sp->stage_id = x->spec->stage_id;
    sp->incarnation = x->incarnation;
    snprintf(sp->exe, sizeof sp->exe, "%s", x->spec->exe);
    sp->index = is_target(x) ? (int32_t)(x->spec->stage_id - PIPE_ID_TARGET0)
                : is_drafter(x) ? (int32_t)(x->spec->stage_id - PIPE_ID_DRAFTER0) : -1;
    sp->threads = (uint32_t)(S->o->threads_per_stage > 0 ? S->o->threads_per_stage : 1);
    if (sup__sup_endpoint(S->o, sp->sup_endpoint, sizeof sp->sup_endpoint) < 0) sp->sup_endpoint[0] = 0;
    sup__cred(S, sp->stage_id, sp->incarnation, sp->cred);   /* the agent hands it over (DL_STAGE_CRED) */
    sp->cred_len = CRED_BYTES;
    x->exited = 0;
    x->helloed = 0;
    x->restart_at = 0;
    x->active = 1;
    x->pid = -1;                /* the agent's STARTED gives it */
    x->t_spawn = clock_mono_s();
    if (stage_send(S->bus, nd->peer, &m) < 0) {
        log_error("node_spawn of %s to node %s: %s", x->spec->name, nd->name, dl_errmsg());
        sup__on_exit(S, x, 127 << 8);
        return;
    }
    log_info("starting %s on node %s (incarnation %llu), log %s:%s/logs/%s.log", x->spec->name, nd->name,
             (unsigned long long)x->incarnation, nd->hostname, nd->run_dir, x->spec->name);
    sup__write_run_json(S);
}

void sup__kill(sup_t *S, sstage_t *x, int sig) {
    int k = sup__stage_node(S, x);
    if (k == 0) {
        if (x->pid > 0) kill(x->pid, sig);
        return;
    }
    sup_node_t *nd = &S->nodes[k];
    if (!nd->up || x->exited) return;   /* a lost node's stages are stopped by its agent */
    proto_msg_t m;
    proto_msg_init(&m, PROTO_NODE_SIGNAL);
    m.node_signal.stage_id = x->spec->stage_id;
    m.node_signal.incarnation = x->incarnation;
    m.node_signal.signum = sig;
    stage_send(S->bus, nd->peer, &m);
}

int sup__nodes_result(const sup_t *S) {
    if (!S->ntab.failed[0]) return 0;
    return dl_seterr(DL_ETIMEDOUT, "%s", S->ntab.failed);
}

void sup__nodes_run_over(sup_t *S) {
    for (int k = 1; k < RUNCFG_NODES_MAX; k++) {
        sup_node_t *n = &S->nodes[k];
        if (!n->up || !n->peer[0]) continue;
        proto_msg_t m;
        proto_msg_init(&m, PROTO_CONTROL);
        m.control.op = PROTO_CTL_STOP;
        snprintf(m.control.arg, sizeof m.control.arg, "%s", NODE_STOP_RUN_OVER);
        stage_send(S->bus, n->peer, &m);
    }
}
