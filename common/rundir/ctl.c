/* The control socket's client (see ctl.h). */
#include "common/rundir/ctl.h"
#include "common/rundir/rundir.h"
#include "common/base/err.h"
#include "common/bus/bus.h"
#include "proto/codec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

typedef struct qmsg {
    struct qmsg *next;
    size_t len;
    unsigned char data[];
} qmsg_t;

struct rundir_ctl {
    uv_loop_t loop;
    uv_timer_t timer;
    bus_t *bus;
    qmsg_t *head, *tail;        /* received, not yet returned */
    int dead;                   /* the supervisor went silent */
    int oom;
};

int rundir_ctl_endpoint(const char *dir, char *ep, size_t cap) {
    rundir_run_t *r = malloc(sizeof *r);
    if (!r) return dl_seterr(DL_ENOMEM, "run.json: out of memory");
    int rc = rundir_run_read(dir, r);
    /* a relative ipc path is relative to the supervisor's working directory, not ours:
     * it is always <out>/ctl.sock (the /tmp socket dir is absolute), so dir names it */
    if (rc == 0 && r->control[0] && !(!strncmp(r->control, "ipc://", 6) && r->control[6] != '/')) {
        int n = snprintf(ep, cap, "%s", r->control);
        free(r);
        return n < 0 || (size_t)n >= cap ? dl_seterr(DL_ERANGE, "control endpoint too long") : 0;
    }
    free(r);
    if (rc < 0 && rc != DL_ENOENT) return rc;
    return bus_endpoint(dir, RUNDIR_CTL_NAME, ep, cap);
}

static void on_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)bus, (void)peer;
    rundir_ctl_t *c = arg;
    qmsg_t *q = malloc(sizeof *q + len);
    if (!q) { c->oom = 1; uv_stop(&c->loop); return; }
    q->next = NULL;
    q->len = len;
    if (len) memcpy(q->data, data, len);
    if (c->tail) c->tail->next = q;
    else c->head = q;
    c->tail = q;
    uv_stop(&c->loop);
}

static void on_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg) {
    (void)bus, (void)peer, (void)silent_ms;
    rundir_ctl_t *c = arg;
    c->dead = 1;
    uv_stop(&c->loop);
}

/* A socket file nobody listens on (left by a supervisor killed with SIGKILL) refuses a
 * plain connect at once, where ZeroMQ would retry quietly until the timeout. */
static int ipc_probe(const char *path) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) return dl_seterr(DL_ERANGE, "%s: path too long for a socket", path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return dl_seterr(DL_EIO, "socket: %s", strerror(errno));
    int rc = connect(fd, (struct sockaddr *)&a, sizeof a), e = errno;
    close(fd);
    if (rc == 0) return 0;
    if (e == ENOENT) return dl_seterr(DL_ENOENT, "%s: %s", path, strerror(e));
    return dl_seterr(DL_ECLOSED, "%s: %s", path, strerror(e));
}

int rundir_ctl_connect(const char *endpoint, rundir_ctl_t **out) {
    *out = NULL;
    if (!strncmp(endpoint, "ipc://", 6)) DL_TRY(ipc_probe(endpoint + 6));
    rundir_ctl_t *c = calloc(1, sizeof *c);
    if (!c) return dl_seterr(DL_ENOMEM, "control client: out of memory");
    if (uv_loop_init(&c->loop) != 0) { free(c); return dl_seterr(DL_EIO, "control client: uv_loop_init"); }
    uv_timer_init(&c->loop, &c->timer);
    bus_opts_t bo = {0};
    bo.kind = BUS_DEALER;
    bo.name = "ctl-client";
    bo.heartbeat_interval_ms = RUNDIR_CTL_HEARTBEAT_MS;
    bo.heartbeat_timeout_ms = RUNDIR_CTL_DEAD_MS;
    c->bus = bus_new(&c->loop, &bo);
    int rc = c->bus ? bus_connect(c->bus, endpoint) : DL_EIO;
    if (rc < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", dl_errmsg());
        rundir_ctl_destroy(&c);
        return dl_seterr(rc, "control %s: %s", endpoint, why);
    }
    bus_on_message(c->bus, on_msg, c);
    bus_on_peer_dead(c->bus, on_dead, c);
    *out = c;
    return 0;
}

void rundir_ctl_destroy(rundir_ctl_t **cp) {
    if (!cp || !*cp) return;
    rundir_ctl_t *c = *cp;
    bus_destroy(&c->bus);
    uv_close((uv_handle_t *)&c->timer, NULL);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_loop_close(&c->loop);
    while (c->head) {
        qmsg_t *q = c->head;
        c->head = q->next;
        free(q);
    }
    free(c);
    *cp = NULL;
}

int rundir_ctl_send(rundir_ctl_t *c, const proto_ctl_request_t *req) {
    proto_msg_t m;
    proto_msg_init(&m, PROTO_CTL_REQUEST);
    m.ctl_request = *req;
    unsigned char buf[4096];
    size_t len = 0;
    DL_TRY(proto_encode_to(&m, buf, sizeof buf, &len));
    return bus_send(c->bus, NULL, buf, len);
}

int rundir_ctl_send_raw(rundir_ctl_t *c, const void *buf, size_t len) { return bus_send(c->bus, NULL, buf, len); }

static void on_timeout(uv_timer_t *t) { uv_stop(t->loop); }

int rundir_ctl_recv(rundir_ctl_t *c, proto_msg_t *m, int timeout_ms) {
    if (!c->head && !c->dead && !c->oom) {
        if (timeout_ms >= 0) uv_timer_start(&c->timer, on_timeout, (uint64_t)timeout_ms, 0);
        /* uv_run returns at uv_stop (a message, a death, the timeout) */
        while (!c->head && !c->dead && !c->oom) {
            uv_run(&c->loop, UV_RUN_DEFAULT);
            if (timeout_ms >= 0 && !uv_is_active((uv_handle_t *)&c->timer)) break;
        }
        uv_timer_stop(&c->timer);
    }
    if (c->oom) return dl_seterr(DL_ENOMEM, "control client: out of memory");
    if (!c->head) {
        if (c->dead) return dl_seterr(DL_ECLOSED, "the supervisor went silent (the run ended)");
        return dl_seterr(DL_ETIMEDOUT, "no answer from the supervisor in %d ms", timeout_ms);
    }
    qmsg_t *q = c->head;
    c->head = q->next;
    if (!c->head) c->tail = NULL;
    int rc = proto_decode(q->data, q->len, m);
    free(q);
    return rc;
}

int rundir_ctl_call(const char *dir, const proto_ctl_request_t *req, int timeout_ms, proto_msg_t *reply,
                    rundir_ctl_t **cp) {
    if (cp) *cp = NULL;
    char ep[BUS_ENDPOINT_MAX];
    DL_TRY(rundir_ctl_endpoint(dir, ep, sizeof ep));
    rundir_ctl_t *c;
    DL_TRY(rundir_ctl_connect(ep, &c));
    int rc = rundir_ctl_send(c, req);
    while (rc == 0) {
        rc = rundir_ctl_recv(c, reply, timeout_ms);
        if (rc < 0) break;
        if (reply->type == PROTO_CTL_REPLY && reply->ctl_reply.id == req->id) break;
        if (reply->type == PROTO_ERROR) {
            rc = dl_seterr(reply->error.code, "%s", reply->error.message);
            proto_msg_free(reply);
            break;
        }
        proto_msg_free(reply);   /* not ours (e.g. a metrics message): keep waiting */
    }
    if (rc < 0 || !cp) rundir_ctl_destroy(&c);
    else *cp = c;
    return rc;
}

char *rundir_ctl_text(const proto_ctl_reply_t *r) {
    char *s = malloc((size_t)r->n_text + 1);
    if (!s) return NULL;
    if (r->n_text) memcpy(s, r->text, r->n_text);
    s[r->n_text] = 0;
    return s;
}
