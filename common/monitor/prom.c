/* Prometheus text rendering and a minimal HTTP/1.0 /metrics server (see prom.h). */
#include "common/monitor/prom.h"
#include "common/base/clock.h"
#include "common/base/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/sbuf.h"

/* ---------------------------------------------------------------- text (common/base/sbuf) */

static void sb_value(sbuf_t *b, double v) {
    if (isnan(v)) sbuf_printf(b, " NaN\n");
    else if (isinf(v)) sbuf_printf(b, v > 0 ? " +Inf\n" : " -Inf\n");
    else {
        /* shortest of %.15g / %.17g that reads back exactly */
        char t[40];
        snprintf(t, sizeof t, "%.15g", v);
        if (strtod(t, NULL) != v) snprintf(t, sizeof t, "%.17g", v);
        sbuf_printf(b, " %s\n", t);
    }
}

/* label value: backslash, double quote and newline escaped (exposition format) */
static void sb_label(sbuf_t *b, const char *k, const char *v, int first) {
    sbuf_printf(b, "%s%s=\"", first ? "" : ",", k);
    for (const char *c = v; *c; c++) {
        if (*c == '\\') sbuf_printf(b, "\\\\");
        else if (*c == '"') sbuf_printf(b, "\\\"");
        else if (*c == '\n') sbuf_printf(b, "\\n");
        else sbuf_printf(b, "%c", *c);
    }
    sbuf_printf(b, "\"");
}

void mon_prom_sanitize(const char *prefix, const char *name, char *out, size_t cap) {
    size_t w = 0;
    if (!cap) return;
    for (const char *c = prefix; *c && w + 1 < cap; c++) out[w++] = *c;
    if (w + 1 < cap && *name >= '0' && *name <= '9' && w == 0) out[w++] = '_';
    for (const char *c = name; *c && w + 1 < cap; c++) {
        char ch = *c;
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
        out[w++] = ok ? ch : '_';
    }
    out[w] = 0;
}

static int is_phase(const char *n) {
    static const char *const phases[] = {"wait_input_s", "wait_credit_s", "copy_s",
                                         "forward_s", "backward_s", "step_s", "wait_gpu_s"};
    for (size_t i = 0; i < sizeof phases / sizeof *phases; i++) if (!strcmp(n, phases[i])) return 1;
    return 0;
}

/* Prometheus name of a stage metric (see prom.h). */
static void prom_name(const char *raw, char *out, size_t cap) {
    char base[MON_NAME_MAX + 16];
    size_t L = strlen(raw);
    if (L >= 2 && !strcmp(raw + L - 2, "_s")) snprintf(base, sizeof base, "%.*sseconds", (int)(L - 1), raw);
    else snprintf(base, sizeof base, "%s", raw);
    if (is_phase(raw)) {
        char tmp[MON_NAME_MAX + 24];
        snprintf(tmp, sizeof tmp, "%s_total", base);
        mon_prom_sanitize("draftline_", tmp, out, cap);
    } else {
        mon_prom_sanitize("draftline_", base, out, cap);
    }
}

static void stage_labels(sbuf_t *b, const mon_stage_t *s) {
    sbuf_printf(b, "{");
    sb_label(b, "stage", s->name, 1);
    sb_label(b, "role", mon_role_name(s->role), 0);
}

static void family(sbuf_t *b, const char *name, const char *type, const char *help) {
    sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

int mon_prom_render(const mon_run_t *run, double now, const mon_diag_opts_t *dopt,
                    const mon_topo_t *topo_in, char **text, size_t *len) {
    sbuf_t b = {0};
    mon_diag_opts_t dd;
    if (!dopt) { mon_diag_opts_default(&dd); dopt = &dd; }
    int n = run->n_stages;
    mon_stage_view_t *views = calloc((size_t)n + 1, sizeof *views);
    mon_diag_t *diags = calloc((size_t)n + 1, sizeof *diags);
    if (!views || !diags) { free(views); free(diags); return dl_seterr(DL_ENOMEM, "prometheus: out of memory"); }
    for (int i = 0; i < n; i++) {
        mon_stage_view(run->stages[i], now, dopt->window_s, &views[i]);
        mon_diagnose(&views[i], dopt, &diags[i]);
        /* a name run.json does not list (an earlier run's, before a --resume): not up,
         * and not in the bottleneck's means */
        if (!mon_topo_has(topo_in, run->stages[i]->name)) diags[i].kind = MON_DIAG_STOPPED;
    }
    /* stage metrics: one family per (sanitised) name, every stage that has it */
    char done[MON_MAX_STAGES * 8][MON_NAME_MAX + 32];
    int n_done = 0;
    for (int i = 0; i < n; i++) {
        const mon_stage_t *s = run->stages[i];
        for (int j = 0; j < s->n_names; j++) {
            char pn[MON_NAME_MAX + 32];
            prom_name(s->names[j], pn, sizeof pn);
            int seen = 0;
            for (int k = 0; k < n_done && !seen; k++) seen = !strcmp(done[k], pn);
            if (seen) continue;
            if (n_done < (int)(sizeof done / sizeof *done)) snprintf(done[n_done++], sizeof done[0], "%s", pn);
            char help[160];
            if (is_phase(s->names[j]))
                snprintf(help, sizeof help, "Seconds in phase %.*s since the stage (incarnation) started.",
                         (int)strlen(s->names[j]) - 2, s->names[j]);
            else
                snprintf(help, sizeof help, "Stage metric %s (latest value, published once a second).", s->names[j]);
            family(&b, pn, is_phase(s->names[j]) ? "counter" : "gauge", help);
            for (int i2 = i; i2 < n; i2++) {
                const mon_stage_t *s2 = run->stages[i2];
                for (int j2 = 0; j2 < s2->n_names; j2++) {
                    char pn2[MON_NAME_MAX + 32];
                    prom_name(s2->names[j2], pn2, sizeof pn2);
                    if (strcmp(pn, pn2)) continue;
                    double v = mon_stage_get(s2, 0, s2->names[j2]);
                    if (!mon_stage_sample(s2, 0)) break;
                    sbuf_printf(&b, "%s", pn);
                    stage_labels(&b, s2);
                    sbuf_printf(&b, "}");
                    sb_value(&b, v);
                    break;                  /* one sample per stage per family */
                }
            }
        }
    }
    /* per-stage synthesised families */
    family(&b, "draftline_stage_up", "gauge", "1 while the stage publishes metrics and is not stopping.");
    for (int i = 0; i < n; i++) {
        sbuf_printf(&b, "draftline_stage_up");
        stage_labels(&b, run->stages[i]);
        sbuf_printf(&b, "}");
        sb_value(&b, diags[i].kind == MON_DIAG_SILENT || diags[i].kind == MON_DIAG_STOPPED ? 0 : 1);
    }
    family(&b, "draftline_stage_incarnation", "gauge", "Incarnation of the stage process (1 + restarts).");
    for (int i = 0; i < n; i++) {
        sbuf_printf(&b, "draftline_stage_incarnation");
        stage_labels(&b, run->stages[i]);
        sbuf_printf(&b, "}");
        sb_value(&b, (double)run->stages[i]->incarnation);
    }
    family(&b, "draftline_stage_last_seen_seconds", "gauge", "Seconds since the stage's last metrics.");
    for (int i = 0; i < n; i++) {
        sbuf_printf(&b, "draftline_stage_last_seen_seconds");
        stage_labels(&b, run->stages[i]);
        sbuf_printf(&b, "}");
        sb_value(&b, views[i].staleness_s);
    }
    family(&b, "draftline_stage_state", "gauge", "1 for the stage's current state.");
    for (int i = 0; i < n; i++) {
        if (!views[i].state[0]) continue;
        sbuf_printf(&b, "draftline_stage_state");
        stage_labels(&b, run->stages[i]);
        sb_label(&b, "state", views[i].state, 0);
        sbuf_printf(&b, "}");
        sb_value(&b, 1);
    }
    family(&b, "draftline_stage_diagnosis", "gauge",
           "1 for the stall diagnosis: ok, starved, back-pressured, stuck, silent, starting, stopped.");
    for (int i = 0; i < n; i++) {
        sbuf_printf(&b, "draftline_stage_diagnosis");
        stage_labels(&b, run->stages[i]);
        sb_label(&b, "diagnosis", mon_diag_name(diags[i].kind), 0);
        sbuf_printf(&b, "}");
        sb_value(&b, 1);
    }
    /* training progress from the latest applied step */
    const mon_step_t *st = mon_run_last_step(run);
    if (st) {
        struct { const char *name, *type, *help; double v; } tr[] = {
            {"draftline_train_step", "gauge", "Latest applied optimizer step.", (double)st->step},
            {"draftline_train_loss", "gauge", "Loss of the latest applied step.", st->loss},
            {"draftline_train_grad_norm", "gauge", "Gradient norm of the latest applied step.", st->grad_norm},
            {"draftline_train_lr", "gauge", "Learning rate of the latest applied step.", st->lr},
            {"draftline_train_tokens_total", "counter", "Target tokens of all applied steps.", st->tokens},
            {"draftline_train_accuracy_mean", "gauge", "Mean top-1 accuracy over block positions, latest step.", st->acc_mean},
        };
        for (size_t i = 0; i < sizeof tr / sizeof *tr; i++) {
            if (isnan(tr[i].v)) continue;
            family(&b, tr[i].name, tr[i].type, tr[i].help);
            sbuf_printf(&b, "%s", tr[i].name);
            sb_value(&b, tr[i].v);
        }
        int any = 0;
        for (int k = 1; k < st->n_acc; k++) if (!isnan(st->acc[k])) any = 1;
        if (any) {
            family(&b, "draftline_train_accuracy", "gauge", "Top-1 accuracy at block position k, latest step.");
            for (int k = 1; k < st->n_acc; k++) {
                if (isnan(st->acc[k])) continue;
                char pos[16];
                snprintf(pos, sizeof pos, "%d", k);
                sbuf_printf(&b, "draftline_train_accuracy{");
                sb_label(&b, "position", pos, 1);
                sbuf_printf(&b, "}");
                sb_value(&b, st->acc[k]);
            }
        }
    }
    mon_topo_t topo = {0};
    if (topo_in) topo = *topo_in;
    mon_topo_from_run(run, &topo);
    mon_bottleneck_t bn;
    mon_bottleneck(views, diags, n, &topo, run->dir, &bn);
    family(&b, "draftline_bottleneck", "gauge", "1 for the stage role that limits throughput (none if unclear).");
    sbuf_printf(&b, "draftline_bottleneck{");
    sb_label(&b, "role", bn.kind == MON_ROLE_UNKNOWN ? "none" : mon_role_name(bn.kind), 1);
    sbuf_printf(&b, "}");
    sb_value(&b, 1);
    free(views);
    free(diags);
    if (sbuf_take(&b, text, len) < 0) return dl_seterr(DL_ENOMEM, "prometheus: out of memory");
    return 0;
}

int mon_prom_render_run(void *arg, char **text, size_t *len) {
    const mon_run_t *run = arg;
    mon_topo_t topo = {0};
    if (run->dir[0]) mon_topo_read(run->dir, &topo);
    return mon_prom_render(run, clock_wall_s(), NULL, &topo, text, len);
}

/* ---------------------------------------------------------------- HTTP server */

#define PROM_REQ_MAX 8192
#define PROM_CONN_MAX 64
#define PROM_CONN_TIMEOUT_MS 5000

typedef struct prom_conn prom_conn_t;

struct prom_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    prom_render_cb cb;
    void *arg;
    int port;
    int open_handles;           /* listener + 2 per connection; freed at 0 after destroy */
    int destroyed;
    int n_conns;
    prom_conn_t *conns;         /* list */
    uint64_t requests;
};

struct prom_conn {
    prom_server_t *srv;
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_write_t wr;
    char req[PROM_REQ_MAX];
    size_t req_len;
    char *resp;
    int closing, answered;
    int handles;                /* tcp + timer not yet closed */
    prom_conn_t *next;
};

static void maybe_free(prom_server_t *s) {
    if (s->destroyed && s->open_handles == 0) free(s);
}

static void on_handle_closed(uv_handle_t *h) {
    prom_conn_t *c = h->data;
    prom_server_t *s = c->srv;
    s->open_handles--;
    if (--c->handles == 0) {                    /* libuv gives no order between the two */
        free(c->resp);
        free(c);
    }
    maybe_free(s);
}

static void conn_close(prom_conn_t *c) {
    if (c->closing) return;
    c->closing = 1;
    prom_server_t *s = c->srv;
    for (prom_conn_t **p = &s->conns; *p; p = &(*p)->next)
        if (*p == c) { *p = c->next; break; }
    s->n_conns--;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void on_written(uv_write_t *w, int status) {
    (void)status;
    conn_close(w->data);
}

static void respond(prom_conn_t *c, int code, const char *reason, const char *body, size_t len) {
    if (c->answered) return;
    c->answered = 1;
    c->srv->requests++;
    uv_read_stop((uv_stream_t *)&c->tcp);
    char head[256];
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.0 %d %s\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n", code, reason, len);
    c->resp = malloc((size_t)hl + len);
    if (!c->resp) { conn_close(c); return; }
    memcpy(c->resp, head, (size_t)hl);
    if (len) memcpy(c->resp + hl, body, len);
    uv_buf_t buf = uv_buf_init(c->resp, (unsigned)((size_t)hl + len));
    c->wr.data = c;
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &buf, 1, on_written) != 0) conn_close(c);
}

static void handle_request(prom_conn_t *c) {
    char method[16] = {0}, path[256] = {0};
    if (sscanf(c->req, "%15s %255s", method, path) != 2) {
        const char *m = "bad request\n";
        respond(c, 400, "Bad Request", m, strlen(m));
        return;
    }
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        const char *m = "only GET /metrics\n";
        respond(c, 405, "Method Not Allowed", m, strlen(m));
        return;
    }
    char *q = strchr(path, '?');
    if (q) *q = 0;
    if (strcmp(path, "/metrics") && strcmp(path, "/")) {
        const char *m = "not found: try /metrics\n";
        respond(c, 404, "Not Found", m, strlen(m));
        return;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = c->srv->cb(c->srv->arg, &text, &len);
    if (rc < 0 || !text) {
        char m[256];
        snprintf(m, sizeof m, "render failed: %s\n", dl_errmsg());
        free(text);
        respond(c, 500, "Internal Server Error", m, strlen(m));
        return;
    }
    respond(c, 200, "OK", strcmp(method, "HEAD") ? text : "", strcmp(method, "HEAD") ? len : 0);
    free(text);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    prom_conn_t *c = h->data;
    size_t room = PROM_REQ_MAX - 1 - c->req_len;
    *buf = uv_buf_init(c->req + c->req_len, (unsigned)room);
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
    (void)buf;
    prom_conn_t *c = st->data;
    if (n < 0) { conn_close(c); return; }
    c->req_len += (size_t)n;
    c->req[c->req_len] = 0;
    if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n")) { handle_request(c); return; }
    if (c->req_len >= PROM_REQ_MAX - 1) {
        const char *m = "request too large\n";
        respond(c, 431, "Request Header Fields Too Large", m, strlen(m));
    }
}

static void on_timeout(uv_timer_t *t) { conn_close(t->data); }

static void on_connection(uv_stream_t *server, int status) {
    prom_server_t *s = server->data;
    if (status < 0 || s->destroyed) return;
    prom_conn_t *c = calloc(1, sizeof *c);
    if (!c) return;
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->handles = 2;
    s->open_handles += 2;
    c->next = s->conns;
    s->conns = c;
    s->n_conns++;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 || s->n_conns > PROM_CONN_MAX) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_timeout, PROM_CONN_TIMEOUT_MS, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) conn_close(c);
}

static void on_listener_closed(uv_handle_t *h) {
    prom_server_t *s = h->data;
    s->open_handles--;
    maybe_free(s);
}

prom_server_t *prom_server_new_at(uv_loop_t *loop, const char *host, int port, prom_render_cb cb,
                                  void *arg) {
    if (!loop || !cb || port < 0 || port > 65535) {
        dl_seterr(DL_EINVAL, "prometheus server: bad arguments (port %d)", port);
        return NULL;
    }
    prom_server_t *s = calloc(1, sizeof *s);
    if (!s) { dl_seterr(DL_ENOMEM, "prometheus server: out of memory"); return NULL; }
    s->loop = loop;
    s->cb = cb;
    s->arg = arg;
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    s->open_handles = 1;
    struct sockaddr_in addr;
    int rc = uv_ip4_addr(host, port, &addr);
    if (rc == 0) rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&s->listener, 64, on_connection);
    if (rc != 0) {
        dl_seterr(DL_EIO, "prometheus server: listen on %s:%d: %s", host, port, uv_strerror(rc));
        s->destroyed = 1;
        uv_close((uv_handle_t *)&s->listener, on_listener_closed);
        return NULL;
    }
    struct sockaddr_storage got;
    int glen = sizeof got;
    if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&got, &glen) == 0)
        s->port = ntohs(((struct sockaddr_in *)&got)->sin_port);
    return s;
}

prom_server_t *prom_server_new(uv_loop_t *loop, int port, prom_render_cb cb, void *arg) {
    return prom_server_new_at(loop, "0.0.0.0", port, cb, arg);
}

int prom_server_port(const prom_server_t *s) { return s->port; }
uint64_t prom_server_requests(const prom_server_t *s) { return s->requests; }

void prom_server_destroy(prom_server_t **s_p) {
    if (!s_p || !*s_p) return;
    prom_server_t *s = *s_p;
    *s_p = NULL;
    s->destroyed = 1;
    while (s->conns) conn_close(s->conns);
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
}
