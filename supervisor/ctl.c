/* Supervisor, the control socket: a ZeroMQ ROUTER on the supervisor's loop where
 * `draftline status|stop|rebalance|monitor` (common/rundir/ctl.h) ask and the
 * supervisor answers (CTL_REQUEST / CTL_REPLY, proto/msg.h). A command table maps
 * each op to its handler; a request that does not decode, or is not a CTL_REQUEST,
 * is answered with an ERROR and changes nothing. Many clients at once: each is a
 * ROUTER peer; subscribers and clients waiting for the end are kept by peer id and
 * forgotten when they go silent (bus heartbeats). */
#include "supervisor/sup_int.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/rundir/ctl.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CTL_LINGER_MS 500           /* the last replies ("stopped") leave before the socket closes */
#define CTL_HISTORY_BYTES (768u << 10)  /* a subscribe reply's history, at most (< DL_PROTO_CTL_TEXT_MAX) */
#define CTL_HISTORY_STEPS 64        /* step lines in it (the monitor's pace needs the last 20) */

static void reply(sup_t *S, const char *peer, uint64_t id, int code, const char *state, const char *text,
                  size_t n) {
    proto_msg_t m;
    proto_msg_init(&m, PROTO_CTL_REPLY);
    m.ctl_reply.id = id;
    m.ctl_reply.code = code;
    snprintf(m.ctl_reply.state, sizeof m.ctl_reply.state, "%s", state);
    m.ctl_reply.text = (const uint8_t *)text;
    m.ctl_reply.n_text = (uint32_t)(n < DL_PROTO_CTL_TEXT_MAX ? n : DL_PROTO_CTL_TEXT_MAX);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (proto_encode(&m, &sb) == 0) {
        int rc = bus_send(S->ctl.bus, peer, sb.data, sb.size);
        if (rc < 0 && rc != DL_ENOENT) log_warn("control reply to %s: %s", peer, dl_errmsg());
    }
    msgpack_sbuffer_destroy(&sb);
}

static void reply_str(sup_t *S, const char *peer, uint64_t id, int code, const char *state, const char *text) {
    reply(S, peer, id, code, state, text, strlen(text));
}

static void send_error(sup_t *S, const char *peer, int code, const char *msg) {
    proto_msg_t m;
    proto_msg_init(&m, PROTO_ERROR);
    m.error.code = code < 0 && code >= -1000 ? code : DL_EPROTO;
    m.error.ref_type = PROTO_CTL_REQUEST;
    snprintf(m.error.message, sizeof m.error.message, "%s", msg);
    unsigned char buf[1024];
    size_t len;
    if (proto_encode_to(&m, buf, sizeof buf, &len) == 0) bus_send(S->ctl.bus, peer, buf, len);
}

static int add_client(sup_ctl_client_t *list, int *n, const char *peer, uint64_t id) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(list[i].peer, peer)) { list[i].id = id; return 0; }
    if (*n >= SUP_CTL_MAX_CLIENTS) return dl_seterr(DL_EAGAIN, "more than %d control clients", SUP_CTL_MAX_CLIENTS);
    snprintf(list[*n].peer, sizeof list[*n].peer, "%s", peer);
    list[(*n)++].id = id;
    return 0;
}

static void drop_client(sup_ctl_client_t *list, int *n, const char *peer_) {
    char peer[sizeof list->peer];   /* a copy: peer_ may point into list (moved over below) */
    snprintf(peer, sizeof peer, "%s", peer_);
    for (int i = 0; i < *n; i++)
        if (!strcmp(list[i].peer, peer)) { list[i] = list[--*n]; i--; }
}

/* ---- status: run.json's picture, each stage's latest metrics line, the last step ---- */

static int append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = (*cap ? *cap * 2 : 65536);
        while (c < *len + n + 1) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return DL_ENOMEM;
        *buf = b, *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

/* {"run": <run.json>, "metrics": [<metrics.jsonl line of each stage's latest>],
 *  "step": last applied step seen (-1 none), "loss": its loss (null none)}; each metrics
 * line gets "metrics_age_s": seconds since the supervisor received it (its own clock,
 * so a stage on another node with a skewed clock is measured right). */
static int status_doc(sup_t *S, char **out, size_t *out_len) {
    char *doc = NULL, *run = NULL, tail[96];
    size_t len = 0, cap = 0;
    sup__fill_run(S);
    int rc = rundir_run_format(&S->run, &run);
    if (rc == 0) rc = append(&doc, &len, &cap, "{\"run\":", 7);
    if (rc == 0) rc = append(&doc, &len, &cap, run, strlen(run));
    if (rc == 0) rc = append(&doc, &len, &cap, ",\"metrics\":[", 12);
    double now = clock_mono_s();
    for (int i = 0; i < S->ctl.n_last && rc == 0; i++) {
        const proto_metrics_t *m = &S->ctl.last[i].m;
        const char *names[DL_PROTO_MAX_METRICS + 1];
        double values[DL_PROTO_MAX_METRICS + 1];
        uint32_t nm = 0;
        for (; nm < m->n_metrics; nm++) names[nm] = m->metrics[nm].name, values[nm] = m->metrics[nm].value;
        names[nm] = "metrics_age_s", values[nm++] = now - S->ctl.last[i].t_recv;
        char *line;
        size_t n;
        rc = rundir_metrics_format(&line, &n, m->ts_ns, S->ctl.last[i].peer, m->stage_id, m->incarnation, m->state,
                                   names, values, (int)nm);
        if (rc == 0 && i) rc = append(&doc, &len, &cap, ",", 1);
        if (rc == 0) rc = append(&doc, &len, &cap, line, n > 0 ? n - 1 : 0);   /* without its '\n' */
        free(line);
    }
    if (S->have_step && isfinite(S->last_loss))
        snprintf(tail, sizeof tail, "],\"step\":%llu,\"loss\":%.9g}", (unsigned long long)S->last_step_seen, S->last_loss);
    else if (S->have_step)
        snprintf(tail, sizeof tail, "],\"step\":%llu,\"loss\":null}", (unsigned long long)S->last_step_seen);
    else
        snprintf(tail, sizeof tail, "],\"step\":-1,\"loss\":null}");
    if (rc == 0) rc = append(&doc, &len, &cap, tail, strlen(tail));
    free(run);
    if (rc == 0 && len > DL_PROTO_CTL_TEXT_MAX) rc = dl_seterr(DL_ERANGE, "status document of %zu bytes", len);
    if (rc < 0) { free(doc); return rc; }
    *out = doc;
    *out_len = len;
    return 0;
}

static void op_status(sup_t *S, const char *peer, const proto_ctl_request_t *q) {
    char *doc;
    size_t n;
    int rc = status_doc(S, &doc, &n);
    if (rc < 0) { reply_str(S, peer, q->id, rc, "rejected", dl_errmsg()); return; }
    reply(S, peer, q->id, 0, "ok", doc, n);
    free(doc);
}

/* ---- stop: the path of SIGTERM ---- */

static void op_stop(sup_t *S, const char *peer, const proto_ctl_request_t *q) {
    char txt[64];
    snprintf(txt, sizeof txt, "%d", (int)getpid());   /* the pid, for the client's message */
    if ((q->flags & PROTO_CTLREQ_WAIT) && add_client(S->ctl.waiters, &S->ctl.n_waiters, peer, q->id) < 0) {
        reply_str(S, peer, q->id, DL_EAGAIN, "rejected", dl_errmsg());
        return;
    }
    reply_str(S, peer, q->id, 0, "stopping", txt);
    /* idempotent: asking again never escalates (only a second signal kills every stage, so a
     * slow final checkpoint is not lost to a repeated `draftline stop`) */
    if (S->stopping) {
        log_info("control: stop asked by %s: already stopping", peer);
        return;
    }
    log_info("control: stop asked by %s", peer);
    S->stop_by = "`draftline stop` (control socket)";
    sup__on_stop_signal(S, SIGTERM);
}

/* ---- rebalance ---- */

static void op_rebalance(sup_t *S, const char *peer, const proto_ctl_request_t *q) {
    int tg[DL_PROTO_CTL_GPUS_MAX], dg[DL_PROTO_CTL_GPUS_MAX];
    for (uint32_t i = 0; i < q->n_target_gpus; i++) tg[i] = (int)q->target_gpus[i];
    for (uint32_t i = 0; i < q->n_drafter_gpus; i++) dg[i] = (int)q->drafter_gpus[i];
    /* "rb-<unix s>-<client pid>": the client packs them as (s << 22) | pid */
    char id[64];
    snprintf(id, sizeof id, "rb-%llu-%llu", (unsigned long long)(q->id >> 22),
             (unsigned long long)(q->id & ((1u << 22) - 1)));
    sup_ctl_client_t prev = S->ctl.rb;
    int was_running = S->rb.running;
    snprintf(S->ctl.rb.peer, sizeof S->ctl.rb.peer, "%s", peer);
    S->ctl.rb.id = q->id;
    sup__rb_request(S, id, (int)q->targets, (int)q->drafters, tg, (int)q->n_target_gpus, dg,
                    (int)q->n_drafter_gpus, q->target_place, q->drafter_place);
    if (was_running) S->ctl.rb = prev;   /* refused: the running one keeps its client */
}

void sup__ctl_rb_update(sup_t *S, const char *json) {
    if (!S->ctl.bus || !S->ctl.rb.peer[0]) return;
    char buf[512];
    if (!json) {
        snprintf(buf, sizeof buf, "{\"id\":\"%s\",\"status\":\"%s\",\"message\":\"%s\"}", S->rb.id, S->rb.status,
                 S->rb.message);
        json = buf;
    }
    int done = strcmp(S->rb.status, "running") != 0;
    reply_str(S, S->ctl.rb.peer, S->ctl.rb.id, strcmp(S->rb.status, "rejected") ? 0 : DL_ESTATE, S->rb.status, json);
    if (done) S->ctl.rb.peer[0] = 0;
}

/* ---- subscribe: the recent history, then every relayed METRICS message ---- */

/* One history line (metrics.jsonl's format) appended, or nothing when it would pass
 * the budget (the history is a seed: shorter is fine, over 1 MiB is not). */
static int hist_line(char **doc, size_t *len, size_t *cap, const mon_stage_t *s, double ts, const char *state,
                     const char *const *names, const double *values, int n) {
    char *line;
    size_t ln;
    int rc = rundir_metrics_format(&line, &ln, (uint64_t)llround(ts * 1e9), s ? s->name : "optimizer",
                                   s ? s->stage_id : 2, s ? s->incarnation : 0, state, names, values, n);
    if (rc == 0 && *len + ln <= CTL_HISTORY_BYTES) rc = append(doc, len, cap, line, ln);
    free(line);
    return rc;
}

/* The optimizer's last CTL_HISTORY_STEPS step lines, as it sent them (state "step"). */
static int hist_steps(const mon_run_t *run, char **doc, size_t *len, size_t *cap) {
    uint64_t first = run->n_steps;
    for (int seen = 0; first > 0 && seen < CTL_HISTORY_STEPS; first--) seen += run->steps[first - 1].have != 0;
    const mon_stage_t *opt = NULL;
    for (int i = 0; i < run->n_stages; i++) if (run->stages[i]->role == MON_ROLE_OPTIMIZER) opt = run->stages[i];
    int rc = 0;
    for (uint64_t k = first; k < run->n_steps && rc == 0; k++) {
        const mon_step_t *st = &run->steps[k];
        if (!st->have) continue;
        const char *names[8 + MON_MAX_ACC];
        double v[8 + MON_MAX_ACC];
        char acc[MON_MAX_ACC][8];
        int n = 0;
        names[n] = "step", v[n++] = (double)st->step;
        names[n] = "loss", v[n++] = st->loss;
        names[n] = "grad_norm", v[n++] = st->grad_norm;
        names[n] = "lr", v[n++] = st->lr;
        names[n] = "tokens", v[n++] = st->tokens;
        names[n] = "skipped", v[n++] = st->skipped;
        names[n] = "elapsed_s", v[n++] = st->t;
        for (int a = 1; a < st->n_acc; a++) {
            snprintf(acc[a], sizeof acc[a], "acc_%d", a);
            names[n] = acc[a], v[n++] = st->acc[a];
        }
        names[n] = "acc_mean", v[n++] = st->acc_mean;
        rc = hist_line(doc, len, cap, opt, isfinite(st->ts) ? st->ts : 0, "step", names, v, n);
    }
    return rc;
}

/* The supervisor's picture of the run (S->mon: what the Prometheus endpoint serves) as
 * metrics.jsonl lines: the last steps, then each stage's last samples, oldest first,
 * as many per stage as fit in CTL_HISTORY_BYTES (up to MON_HIST). A monitor ingests
 * them as if it had read metrics.jsonl, then the live messages that follow. */
static int history_doc(sup_t *S, char **out, size_t *out_len) {
    char *doc = NULL;
    size_t len = 0, cap = 0;
    const mon_run_t *run = S->mon;
    int rc = append(&doc, &len, &cap, "", 0);
    if (rc == 0 && run) rc = hist_steps(run, &doc, &len, &cap);
    size_t per[MON_MAX_STAGES] = {0}, total = 0;
    int depth = MON_HIST;
    for (int i = 0; run && rc == 0 && i < run->n_stages; i++) {
        const mon_stage_t *s = run->stages[i];
        per[i] = 128;                               /* bytes per line, at most about */
        for (int k = 0; k < s->n_names; k++) per[i] += strlen(s->names[k]) + 20;   /* "name":%.9g, */
        total += per[i] * (size_t)(s->count < depth ? s->count : depth);
    }
    while (depth > 1 && len + total > CTL_HISTORY_BYTES) {
        depth -= depth / 4 + 1;
        total = 0;
        for (int i = 0; i < run->n_stages; i++)
            total += per[i] * (size_t)(run->stages[i]->count < depth ? run->stages[i]->count : depth);
    }
    for (int i = 0; run && rc == 0 && i < run->n_stages; i++) {
        const mon_stage_t *s = run->stages[i];
        const char *names[MON_MAX_METRICS];
        for (int k = 0; k < s->n_names; k++) names[k] = s->names[k];
        for (int back = (s->count < depth ? s->count : depth) - 1; back >= 0 && rc == 0; back--) {
            const mon_sample_t *x = mon_stage_sample(s, back);
            rc = hist_line(&doc, &len, &cap, s, x->ts, x->state, names, x->v, s->n_names);
        }
    }
    if (rc < 0) { free(doc); return rc; }
    *out = doc;
    *out_len = len;
    return 0;
}

static void op_subscribe(sup_t *S, const char *peer, const proto_ctl_request_t *q) {
    char *hist = NULL;
    size_t n = 0;
    int rc = add_client(S->ctl.subs, &S->ctl.n_subs, peer, q->id);
    if (rc == 0 && (rc = history_doc(S, &hist, &n)) < 0) drop_client(S->ctl.subs, &S->ctl.n_subs, peer);
    if (rc < 0) {
        reply_str(S, peer, q->id, rc, "rejected", dl_errmsg());
        return;
    }
    reply(S, peer, q->id, 0, "ok", hist, n);
    free(hist);
}

void sup__ctl_on_metrics(sup_t *S, const char *peer, const proto_metrics_t *m, const void *data, size_t len) {
    if (strcmp(m->state, "step") != 0) {
        int i = 0;
        while (i < S->ctl.n_last && strcmp(S->ctl.last[i].peer, peer)) i++;
        if (i == S->ctl.n_last && i < RUNDIR_MAX_STAGES) snprintf(S->ctl.last[S->ctl.n_last++].peer, BUS_ID_MAX + 1, "%s", peer);
        if (i < S->ctl.n_last) S->ctl.last[i].m = *m, S->ctl.last[i].t_recv = clock_mono_s();
    }
    for (int i = 0; i < S->ctl.n_subs; i++) {
        int rc = bus_send(S->ctl.bus, S->ctl.subs[i].peer, data, len);
        if (rc == DL_ENOENT) drop_client(S->ctl.subs, &S->ctl.n_subs, S->ctl.subs[i--].peer);
    }
}

/* ---- the socket ---- */

typedef void (*op_fn)(sup_t *S, const char *peer, const proto_ctl_request_t *q);
static const struct { proto_ctlreq_op_t op; op_fn fn; } OPS[] = {
    {PROTO_CTLREQ_STATUS, op_status},
    {PROTO_CTLREQ_STOP, op_stop},
    {PROTO_CTLREQ_REBALANCE, op_rebalance},
    {PROTO_CTLREQ_SUBSCRIBE, op_subscribe},
};

static void on_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)bus;
    sup_t *S = arg;
    proto_msg_t m;
    int rc = proto_decode(data, len, &m);
    if (rc < 0) {
        char msg[DL_PROTO_ERRMSG_MAX + 1];
        snprintf(msg, sizeof msg, "malformed control request: %s", dl_errmsg());
        log_warn("control: %s (from %s)", msg, peer);
        send_error(S, peer, rc, msg);
        return;
    }
    if (m.type != PROTO_CTL_REQUEST) {
        char msg[128];
        snprintf(msg, sizeof msg, "the control socket takes ctl_request messages, not %s", proto_type_name(m.type));
        send_error(S, peer, DL_EPROTO, msg);
    } else {
        for (size_t i = 0; i < sizeof OPS / sizeof OPS[0]; i++)
            if (OPS[i].op == m.ctl_request.op) { OPS[i].fn(S, peer, &m.ctl_request); break; }
    }
    proto_msg_free(&m);
}

static void on_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg) {
    (void)bus, (void)silent_ms;
    sup_t *S = arg;
    drop_client(S->ctl.subs, &S->ctl.n_subs, peer);
    drop_client(S->ctl.waiters, &S->ctl.n_waiters, peer);
    if (!strcmp(S->ctl.rb.peer, peer)) S->ctl.rb.peer[0] = 0;
}

void sup__ctl_start(sup_t *S) {
    char ep[BUS_ENDPOINT_MAX];
    S->ctl.endpoint[0] = 0;
    /* <out>/ctl.sock, or the short socket dir when <out> is too long for sun_path */
    if (bus_endpoint(S->o->out_dir, RUNDIR_CTL_NAME, ep, sizeof ep) < 0 &&
        bus_endpoint(S->o->sock_dir, RUNDIR_CTL_NAME, ep, sizeof ep) < 0) {
        log_warn("control socket: %s (no `draftline stop/status/rebalance` for this run)", dl_errmsg());
        return;
    }
    bus_opts_t bo = {0};
    bo.kind = BUS_ROUTER;
    bo.name = "control";
    bo.heartbeat_interval_ms = RUNDIR_CTL_HEARTBEAT_MS;
    bo.heartbeat_timeout_ms = RUNDIR_CTL_DEAD_MS;
    bo.peer_dead_debug = 1;   /* every client that leaves goes silent: not news for the console */
    bo.linger_ms = CTL_LINGER_MS;
    S->ctl.bus = bus_new(&S->loop, &bo);
    if (!S->ctl.bus || bus_bind(S->ctl.bus, ep) < 0) {
        log_warn("control socket %s: %s (no `draftline stop/status/rebalance` for this run)", ep, dl_errmsg());
        bus_destroy(&S->ctl.bus);
        return;
    }
    bus_on_message(S->ctl.bus, on_msg, S);
    bus_on_peer_dead(S->ctl.bus, on_dead, S);
    snprintf(S->ctl.endpoint, sizeof S->ctl.endpoint, "%s", ep);
}

void sup__ctl_close(sup_t *S) {
    if (!S->ctl.bus) return;
    for (int i = 0; i < S->ctl.n_waiters; i++)
        reply_str(S, S->ctl.waiters[i].peer, S->ctl.waiters[i].id, 0, "stopped", "the run stopped");
    S->ctl.n_waiters = S->ctl.n_subs = 0;
    bus_close(S->ctl.bus, NULL, NULL);
}

int sup_run_live(const char *dir, int *pid) {
    *pid = 0;
    int rc = rundir_run_supervisor_pid(dir, pid);
    if (rc == DL_ENOENT) {
        char p[4200];
        snprintf(p, sizeof p, "%s/" RUNDIR_RUN_JSON, dir);
        if (access(p, F_OK) != 0) return rc;
    }
    proto_ctl_request_t q = {.id = 1, .op = PROTO_CTLREQ_STATUS};
    proto_msg_t r;
    if (rundir_ctl_call(dir, &q, RUNDIR_CTL_ANSWER_MS, &r, NULL) < 0) return 0;
    proto_msg_free(&r);
    return 1;
}
