/* The node agent (see node_agent.h): set-up, the join, and the stages it runs for the
 * head. Single-threaded: everything runs on the agent's libuv loop. */
#include "supervisor/node_agent.h"
#include "supervisor/launch.h"
#include "supervisor/nodes.h"
#include "supervisor/sup_int.h"
#include "common/base/cli.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/paths.h"
#include "common/bus/bus.h"
#include "common/monitor/nvml.h"
#include "common/pipe/stage.h"
#include "proto/codec.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NODE_MAX_CHILDREN SUP_MAX_STAGES
#define NODE_MAX_GPUS 64             /* = DL_PROTO_MAX_NODES: node_hello.gpu_free_mib's limit */

typedef struct {
    uint32_t stage_id;
    uint64_t incarnation;
    pid_t pid;                  /* 0: free slot */
    double kill_at;             /* SIGTERM sent: SIGKILL at this monotonic s (0: none) */
} nchild_t;

typedef struct {
    const node_agent_opts_t *o;
    uv_loop_t loop;
    bus_t *bus;
    bus_curve_keys_t keys;
    uv_signal_t sig_int, sig_term, sig_chld;
    uv_timer_t tick;
    char name[DL_PROTO_NODE_NAME_MAX + 1], host[DL_PROTO_HOST_MAX + 1], addr[DL_PROTO_HOST_MAX + 1];
    char run_dir[PATH_MAX], key_abs[PATH_MAX], bin_dir[4096], head[BUS_ENDPOINT_MAX];
    char run_id[DL_PROTO_RUN_ID_MAX + 1];
    uint64_t incarnation;       /* this agent start's */
    int joined, index, ever_joined;
    double last_hello, t_stop;
    double t_attempt, next_noanswer;    /* this (re)join's first node_hello (0: none yet); the next "no answer" line */
    int stopping, exit_code;
    char gpu_uuids[NODE_MAX_GPUS * 48];
    int64_t gpu_free_mib[NODE_MAX_GPUS];
    int n_gpus;
    nchild_t ch[NODE_MAX_CHILDREN];
} agent_t;

int node_name_ok(const char *name) {
    size_t n = strlen(name);
    if (n < 1 || n > NODE_NAME_CHARS) return 0;
    for (const char *p = name; *p; p++)
        if (*p < 0x21 || *p > 0x7e || *p == ':' || *p == ',') return 0;
    return 1;
}

/* "HOST:PORT" -> host, port (1..65535). 0 or DL_EINVAL. */
static int split_hostport(const char *s, char *host, size_t cap, int *port) {
    const char *c = strrchr(s, ':');
    if (!c || c == s || (size_t)(c - s) >= cap) return dl_seterr(DL_EINVAL, "--join %s: expected HOST:PORT", s);
    char *end;
    long p = strtol(c + 1, &end, 10);
    if (*end || end == c + 1 || p < 1 || p > 65535) return dl_seterr(DL_EINVAL, "--join %s: bad port", s);
    memcpy(host, s, (size_t)(c - s));
    host[c - s] = 0;
    *port = (int)p;
    return 0;
}

/* The local address of the route to host:port (a UDP socket connected there: nothing is
 * sent) into out. 0 or DL_EIO naming host. */
static int route_addr(const char *host, int port, char *out, size_t cap) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_DGRAM;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g != 0) return dl_seterr(DL_EIO, "--join %s: %s", host, gai_strerror(g));
    int rc = DL_EIO;
    for (struct addrinfo *a = ai; a && rc < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_DGRAM, 0);
        if (fd < 0) continue;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 && getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
            const void *ip = ss.ss_family == AF_INET ? (const void *)&((struct sockaddr_in *)&ss)->sin_addr
                                                     : (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
            if (inet_ntop(ss.ss_family, ip, out, (socklen_t)cap)) rc = 0;
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return rc == 0 ? 0 : dl_seterr(DL_EIO, "no route to the head %s (pass --advertise ADDR)", host);
}

/* The GPUs this agent's stages will see (uuid, free MiB), in their CUDA order: NVML's list
 * narrowed and ordered by $CUDA_VISIBLE_DEVICES, which the stages inherit (the head places
 * stages by position in this list); none without NVML (CPU hosts). Never CUDA. */
static void list_gpus(agent_t *A) {
    mon_nvml_t *nv = mon_nvml_open(NULL);
    if (!nv) return;
    int n = mon_nvml_count(nv);
    mon_gpu_t *g = calloc(n > 0 ? (size_t)n : 1, sizeof *g);
    const char **uuids = calloc(n > 0 ? (size_t)n : 1, sizeof *uuids);
    int order[NODE_MAX_GPUS];
    if (!g || !uuids) n = 0;
    for (int i = 0; i < n; i++)
        if (mon_nvml_query(nv, i, &g[i]) == 0) uuids[i] = g[i].uuid;   /* else NULL: not listed */
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    int k = mon_nvml_visible(vis, uuids, n, order, NODE_MAX_GPUS);
    if (vis) log_info("CUDA_VISIBLE_DEVICES=%s: %d of the %d GPU(s) NVML lists", vis, k, n);
    size_t used = 0;
    for (int j = 0; j < k; j++) {
        const mon_gpu_t *x = &g[order[j]];
        if (!uuids[order[j]]) break;   /* unreadable: the ones after it would take its CUDA index */
        int w = snprintf(A->gpu_uuids + used, sizeof A->gpu_uuids - used, "%s%s", used ? "\n" : "", x->uuid);
        if (w < 0 || (size_t)w >= sizeof A->gpu_uuids - used) break;
        used += (size_t)w;
        A->gpu_free_mib[A->n_gpus++] = (int64_t)((x->mem_total - x->mem_used) >> 20);
    }
    free(g);
    free(uuids);
    mon_nvml_close(&nv);
}

static void send_hello(agent_t *A) {
    proto_msg_t m;
    proto_msg_init(&m, PROTO_NODE_HELLO);
    proto_node_hello_t *h = &m.node_hello;
    snprintf(h->name, sizeof h->name, "%s", A->name);
    snprintf(h->hostname, sizeof h->hostname, "%s", A->host);
    snprintf(h->addr, sizeof h->addr, "%s", A->addr);
    h->run_dir = A->run_dir;
    h->n_run_dir = (uint32_t)strlen(A->run_dir);
    h->pid = (uint32_t)getpid();
    h->incarnation = A->incarnation;
    h->proto_version = DL_PROTO_VERSION;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    h->cores = cores > 0 ? (uint32_t)cores : 1;
    h->gpu_uuids = A->gpu_uuids;
    h->n_gpu_uuids = (uint32_t)strlen(A->gpu_uuids);
    h->gpu_free_mib = A->gpu_free_mib;
    h->n_gpu_free_mib = (uint32_t)A->n_gpus;
    A->last_hello = clock_mono_s();
    if (!A->bus) return;
    if (A->t_attempt <= 0) {
        A->t_attempt = A->last_hello;
        A->next_noanswer = A->t_attempt + NODE_NO_ANSWER_S;
    }
    stage_send(A->bus, NULL, &m);
}

static void send_stage(agent_t *A, uint32_t id, uint64_t inc, proto_node_ev_t ev, pid_t pid, int ws) {
    proto_msg_t m;
    proto_msg_init(&m, PROTO_NODE_STAGE);
    m.node_stage.stage_id = id;
    m.node_stage.incarnation = inc;
    m.node_stage.event = ev;
    m.node_stage.pid = (uint32_t)pid;
    m.node_stage.wait_status = ws;
    if (A->bus) stage_send(A->bus, NULL, &m);
}

static int n_running(const agent_t *A) {
    int n = 0;
    for (int i = 0; i < NODE_MAX_CHILDREN; i++) n += A->ch[i].pid > 0;
    return n;
}

/* SIGTERM to every stage of this node (SIGKILL NODE_STOP_KILL_S later, from the tick). */
static void stop_children(agent_t *A, const char *why) {
    int n = 0;
    for (int i = 0; i < NODE_MAX_CHILDREN; i++) {
        nchild_t *c = &A->ch[i];
        if (c->pid <= 0 || c->kill_at > 0) continue;
        kill(c->pid, SIGTERM);
        c->kill_at = clock_mono_s() + NODE_STOP_KILL_S;
        n++;
    }
    if (n) log_info("%s: SIGTERM to %d stage(s)", why, n);
}

/* Starts stage sp (fork + exec, as the supervisor starts its own: sup__child_setup). */
static void spawn(agent_t *A, const proto_node_spawn_t *sp) {
    nchild_t *c = NULL;
    for (int i = 0; i < NODE_MAX_CHILDREN && !c; i++) if (A->ch[i].pid <= 0) c = &A->ch[i];
    if (A->stopping || !A->joined || !c || strchr(sp->exe, '/')) {
        send_stage(A, sp->stage_id, sp->incarnation, PROTO_NODE_EV_FAILED, 0, c ? EPERM : EAGAIN);
        return;
    }
    char name[32], log_path[PATH_MAX + 64], exe[4200], inc[32], idx[16], thr[16];
    pipe_stage_name(sp->stage_id, name, sizeof name);
    snprintf(log_path, sizeof log_path, "%s/logs/%s.log", A->run_dir, name);
    snprintf(exe, sizeof exe, "%s/%s", A->bin_dir, sp->exe);
    snprintf(inc, sizeof inc, "%llu", (unsigned long long)sp->incarnation);
    snprintf(idx, sizeof idx, "%d", sp->index);
    snprintf(thr, sizeof thr, "%u", sp->threads);
    if (access(exe, X_OK) != 0) {
        int e = errno;
        log_error("%s: %s", exe, strerror(e));
        send_stage(A, sp->stage_id, sp->incarnation, PROTO_NODE_EV_FAILED, 0, e);
        return;
    }
    char cred_hex[CRED_HEX_LEN + 1] = "";
    if (sp->cred_len == CRED_BYTES) cred_to_hex(sp->cred, cred_hex);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        log_error("fork %s: %s", name, strerror(e));
        send_stage(A, sp->stage_id, sp->incarnation, PROTO_NODE_EV_FAILED, 0, e);
        return;
    }
    if (pid == 0) {
        /* dies with the agent: SIGUSR1, which the stage runtime turns into one SIGTERM */
        sup__child_setup(parent, SIGUSR1, log_path, (int)sp->threads);
        if (cred_hex[0]) setenv(CRED_ENV, cred_hex, 1);   /* membership credential: never in argv */
        else unsetenv(CRED_ENV);
        char *argv[16];
        int a = 0;
        argv[a++] = exe;
        if (sp->index >= 0) { argv[a++] = "--index"; argv[a++] = idx; }
        argv[a++] = "--run-dir"; argv[a++] = A->run_dir;
        argv[a++] = "--incarnation"; argv[a++] = inc;
        argv[a++] = "--sup"; argv[a++] = (char *)sp->sup_endpoint;
        argv[a++] = "--key"; argv[a++] = A->key_abs;
        if (sp->log_level[0]) { argv[a++] = "--log-level"; argv[a++] = (char *)sp->log_level; }
        else if (A->o->log_level) { argv[a++] = "--log-level"; argv[a++] = (char *)A->o->log_level; }
        argv[a] = NULL;
        execv(exe, argv);
        fprintf(stderr, "exec %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    c->stage_id = sp->stage_id;
    c->incarnation = sp->incarnation;
    c->pid = pid;
    c->kill_at = 0;
    log_info("started %s (pid %d, incarnation %llu), log %s", name, (int)pid,
             (unsigned long long)sp->incarnation, log_path);
    send_stage(A, sp->stage_id, sp->incarnation, PROTO_NODE_EV_STARTED, pid, 0);
}

static void reap(agent_t *A) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < NODE_MAX_CHILDREN; i++) {
            nchild_t *c = &A->ch[i];
            if (c->pid != pid) continue;
            char name[32];
            pipe_stage_name(c->stage_id, name, sizeof name);
            log_info("%s exited (%s %d)", name, WIFEXITED(status) ? "status" : "signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            send_stage(A, c->stage_id, c->incarnation, PROTO_NODE_EV_EXITED, pid, status);
            memset(c, 0, sizeof *c);
            break;
        }
    }
}

/* Not joined any more (why is printed): the stages stop; the tick sends node_hello again
 * once they are gone. */
static int open_bus(agent_t *A);

static void drop_and_rejoin(agent_t *A, const char *why) {
    A->joined = 0;
    A->t_attempt = 0;
    printf("%s\n", why);
    fflush(stdout);
    stop_children(A, "rejoin");
    /* a new connection: the old one may be dead on the head's side (a same-named peer took
     * its route there: ZMQ_ROUTER_HANDOVER) while it looks alive here */
    bus_destroy(&A->bus);
    if (open_bus(A) < 0) {
        fprintf(stderr, "draftline node: %s: %s\n", A->head, dl_errmsg());
        A->exit_code = 1;
        A->stopping = 1;
        A->t_stop = clock_mono_s();
    }
}

static void on_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)bus; (void)peer;
    agent_t *A = arg;
    proto_msg_t m;
    if (stage_decode("node", "the head", data, len, &m) < 0) return;
    switch (m.type) {
    case PROTO_NODE_WELCOME:
        if (!A->joined) {
            A->joined = 1;
            A->index = (int)m.node_welcome.node_index;
            snprintf(A->run_id, sizeof A->run_id, "%s", m.node_welcome.run_id);
            printf("%sjoined %s as node %s (index %d)\n", A->ever_joined ? "re" : "", A->run_id, A->name, A->index);
            fflush(stdout);
            A->ever_joined = 1;
            A->t_attempt = 0;
        }
        break;
    case PROTO_ERROR:
        if (!A->joined) {
            fprintf(stderr, "draftline node: the head refused node %s: %s\n", A->name, m.error.message);
            A->exit_code = 2;
            A->stopping = 1;
            A->t_stop = clock_mono_s();
            stop_children(A, "refused");
        } else {
            log_warn("the head: %s", m.error.message);
        }
        break;
    case PROTO_NODE_SPAWN:
        spawn(A, &m.node_spawn);
        break;
    case PROTO_CONTROL:
        if (m.control.op == PROTO_CTL_STOP && !strcmp(m.control.arg, NODE_STOP_REJOIN)) {
            if (A->joined && !A->stopping) drop_and_rejoin(A, "the head dropped this node (silent too long): stopping "
                                                              "its stages and joining again");
            break;
        }
        /* the head's run is over (sup__nodes_run_over): stop what is left here and exit 0 */
        if (m.control.op == PROTO_CTL_STOP && !A->stopping) {
            printf("the run %s is over (%s): this node stops\n", A->run_id, m.control.arg[0] ? m.control.arg : "done");
            fflush(stdout);
            A->exit_code = 0;
            A->stopping = 1;
            A->t_stop = clock_mono_s();
            stop_children(A, "run over");
        }
        break;
    case PROTO_NODE_SIGNAL: {
        const proto_node_signal_t *s = &m.node_signal;
        for (int i = 0; i < NODE_MAX_CHILDREN; i++) {
            nchild_t *c = &A->ch[i];
            if (c->pid > 0 && c->stage_id == s->stage_id && c->incarnation == s->incarnation) kill(c->pid, s->signum);
        }
        break;
    }
    default:
        log_warn("the head sent an unexpected %s message", proto_type_name(m.type));
        break;
    }
    proto_msg_free(&m);
}

static void on_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg) {
    (void)bus; (void)peer;
    agent_t *A = arg;
    if (!A->joined) return;
    char why[160];
    snprintf(why, sizeof why, "lost the head (silent %.1f s): stopping this node's stages; joining again every %d s",
             (double)silent_ms / 1000.0, NODE_REJOIN_MS / 1000);
    drop_and_rejoin(A, why);
}

static void on_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg);
static void on_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg);

/* A->bus: a DEALER "node-<name>.<incarnation, 8 hex>" connected to the head over
 * tcp+CURVE: a second agent under the same name has another routing id, so it cannot
 * take over this one's connection (ZMQ_ROUTER_HANDOVER) before the head refuses it.
 * 0 or an error. */
static int open_bus(agent_t *A) {
    char ident[BUS_ID_MAX + 1];
    snprintf(ident, sizeof ident, "node-%.*s.%08x", NODE_NAME_CHARS, A->name, (unsigned)(A->incarnation & 0xffffffffu));
    bus_opts_t bo = {0};
    bo.kind = BUS_DEALER;
    bo.name = "head";
    bo.identity = ident;
    bo.heartbeat_interval_ms = PIPE_HEARTBEAT_MS;
    bo.heartbeat_timeout_ms = PIPE_DEAD_MS;
    bo.curve = &A->keys;
    A->bus = bus_new(&A->loop, &bo);
    if (!A->bus || bus_connect(A->bus, A->head) < 0) return DL_EIO;
    bus_on_message(A->bus, on_msg, A);
    bus_on_peer_dead(A->bus, on_dead, A);
    return 0;
}

static void close_all(agent_t *A) {
    uv_timer_stop(&A->tick);
    uv_close((uv_handle_t *)&A->tick, NULL);
    uv_close((uv_handle_t *)&A->sig_int, NULL);
    uv_close((uv_handle_t *)&A->sig_term, NULL);
    uv_close((uv_handle_t *)&A->sig_chld, NULL);
    if (A->bus) bus_close(A->bus, NULL, NULL);
}

static void on_tick(uv_timer_t *t) {
    agent_t *A = t->data;
    double now = clock_mono_s();
    reap(A);
    for (int i = 0; i < NODE_MAX_CHILDREN; i++) {
        nchild_t *c = &A->ch[i];
        if (c->pid > 0 && c->kill_at > 0 && now >= c->kill_at) {
            log_warn("stage pid %d did not stop in %.0f s: SIGKILL", (int)c->pid, NODE_STOP_KILL_S);
            kill(c->pid, SIGKILL);
            c->kill_at = now + 3600;
        }
    }
    if (A->stopping) {
        if (!n_running(A) || now - A->t_stop > NODE_STOP_KILL_S + 5) close_all(A);
        return;
    }
    if (A->joined) return;
    /* the old stages are gone before the node joins again (the head restarts them) */
    if (!n_running(A) && now - A->last_hello >= NODE_REJOIN_MS / 1000.0) send_hello(A);
    if (A->t_attempt > 0 && now >= A->next_noanswer) {
        printf("no answer from the head at %s after %.0f s: is it running, and is --key the key file of that run? "
               "(a wrong key is refused without a reply)\n", A->o->join, now - A->t_attempt);
        fflush(stdout);
        A->next_noanswer = now + NODE_NO_ANSWER_REPEAT_S;
    }
}

static void on_signal(uv_signal_t *h, int signum) {
    agent_t *A = h->data;
    if (signum == SIGCHLD) { reap(A); return; }
    if (A->stopping) {
        for (int i = 0; i < NODE_MAX_CHILDREN; i++) if (A->ch[i].pid > 0) kill(A->ch[i].pid, SIGKILL);
        return;
    }
    A->stopping = 1;
    A->t_stop = clock_mono_s();
    log_info("signal %d: stopping", signum);
    stop_children(A, "stopping");
}

/* Name, host, key, run dir, address, bin dir: everything before the loop. 0 or the exit status. */
static int agent_setup(agent_t *A) {
    const node_agent_opts_t *o = A->o;
    if (gethostname(A->host, sizeof A->host - 1) != 0) snprintf(A->host, sizeof A->host, "localhost");
    const char *nm = o->name ? o->name : A->host;
    if (!node_name_ok(nm)) {
        fprintf(stderr, "draftline node: node name '%s': 1..%d characters, no space, ':' or ',' (pass --name)\n",
                nm, NODE_NAME_CHARS);
        return 2;
    }
    snprintf(A->name, sizeof A->name, "%.*s", (int)DL_PROTO_NODE_NAME_MAX - 5, nm);
    char host[DL_PROTO_HOST_MAX + 1];
    int port = 0;
    if (split_hostport(o->join, host, sizeof host, &port) < 0) { cli_error("draftline node", dl_errmsg()); return 2; }
    if (bus_curve_keys_load(o->key_path, &A->keys) < 0) {
        fprintf(stderr, "draftline node: --key: %s\n", dl_errmsg());
        return 2;
    }
    if (!realpath(o->key_path, A->key_abs)) snprintf(A->key_abs, sizeof A->key_abs, "%s", o->key_path);
    char rd[PATH_MAX];
    if (o->run_dir) snprintf(rd, sizeof rd, "%s", o->run_dir);
    else snprintf(rd, sizeof rd, "draftline-node-%s", A->name);
    char logs[PATH_MAX + 8];
    if (bus_run_dir_create(rd) < 0) { fprintf(stderr, "draftline node: --run-dir %s: %s\n", rd, dl_errmsg()); return 1; }
    if (!realpath(rd, A->run_dir)) { fprintf(stderr, "draftline node: %s: %s\n", rd, strerror(errno)); return 1; }
    snprintf(logs, sizeof logs, "%s/logs", A->run_dir);
    if (paths_mkdir_p(logs, 0700) < 0) { fprintf(stderr, "draftline node: %s\n", dl_errmsg()); return 1; }
    if (o->advertise) snprintf(A->addr, sizeof A->addr, "%s", o->advertise);
    else if (route_addr(host, port, A->addr, sizeof A->addr) < 0) { fprintf(stderr, "draftline node: %s\n", dl_errmsg()); return 1; }
    if (sup_bin_dir(A->bin_dir, sizeof A->bin_dir) < 0) { fprintf(stderr, "draftline node: %s\n", dl_errmsg()); return 1; }
    if (snprintf(A->head, sizeof A->head, "tcp://%s:%d", host, port) >= (int)sizeof A->head) {
        cli_error("draftline node", "--join: host name too long");
        return 2;
    }
    A->incarnation = (clock_mono_ns() ^ ((uint64_t)time(NULL) << 20) ^ ((uint64_t)getpid() << 40)) | 1;
    list_gpus(A);
    return 0;
}

int node_agent_run(const node_agent_opts_t *o) {
    static agent_t A;
    memset(&A, 0, sizeof A);
    A.o = o;
    A.index = -1;
    int rc = agent_setup(&A);
    if (rc) return rc;
    uv_loop_init(&A.loop);
    if (open_bus(&A) < 0) {
        fprintf(stderr, "draftline node: %s: %s\n", A.head, dl_errmsg());
        if (A.bus) { bus_destroy(&A.bus); uv_run(&A.loop, UV_RUN_DEFAULT); }
        uv_loop_close(&A.loop);
        return 1;
    }
    uv_signal_init(&A.loop, &A.sig_int); A.sig_int.data = &A;
    uv_signal_init(&A.loop, &A.sig_term); A.sig_term.data = &A;
    uv_signal_init(&A.loop, &A.sig_chld); A.sig_chld.data = &A;
    uv_signal_start(&A.sig_int, on_signal, SIGINT);
    uv_signal_start(&A.sig_term, on_signal, SIGTERM);
    uv_signal_start(&A.sig_chld, on_signal, SIGCHLD);
    uv_timer_init(&A.loop, &A.tick);
    A.tick.data = &A;
    printf("node %s (%s, address %s, %d GPU(s)): joining %s; run dir %s\n", A.name, A.host, A.addr, A.n_gpus,
           A.head, A.run_dir);
    fflush(stdout);
    send_hello(&A);
    uv_timer_start(&A.tick, on_tick, 200, 200);
    uv_run(&A.loop, UV_RUN_DEFAULT);
    bus_destroy(&A.bus);
    uv_run(&A.loop, UV_RUN_DEFAULT);
    uv_loop_close(&A.loop);
    return A.exit_code;
}
