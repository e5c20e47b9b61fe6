/* The monitor's feed of a live run (see live.h). */
#include "common/monitor/live.h"
#include "common/base/err.h"
#include "common/pipe/stage.h"
#include "common/rundir/ctl.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct mon_live {
    rundir_ctl_t *c;
    uint64_t id;                    /* the last request's id */
    char dir[4096];
    /* stage id -> name (the stage's bus identity, what metrics.jsonl says) */
    struct { uint32_t id; char name[MON_STAGE_NAME_MAX]; } names[MON_MAX_STAGES];
    int n_names;
};

static void ingest(mon_live_t *L, mon_run_t *run, const proto_metrics_t *m) {
    char name[MON_STAGE_NAME_MAX];
    int i = 0;
    while (i < L->n_names && L->names[i].id != m->stage_id) i++;
    if (i < L->n_names) snprintf(name, sizeof name, "%s", L->names[i].name);
    else pipe_stage_name(m->stage_id, name, sizeof name);   /* not in the topology yet */
    mon_run_ingest_proto(run, name, m);
}

/* The reply's text, one metrics.jsonl line per '\n'. */
static void ingest_history(mon_run_t *run, const proto_ctl_reply_t *r) {
    const char *p = (const char *)r->text, *end = p + r->n_text;
    while (p < end) {
        const char *e = memchr(p, '\n', (size_t)(end - p));
        if (!e) e = end;
        if (e > p) mon_run_ingest_metrics_line(run, p, (size_t)(e - p));
        p = e + 1;
    }
}

int mon_live_open(const char *dir, mon_run_t *run, mon_live_t **out) {
    *out = NULL;
    mon_live_t *L = calloc(1, sizeof *L);
    if (!L) return dl_seterr(DL_ENOMEM, "monitor: out of memory");
    snprintf(L->dir, sizeof L->dir, "%s", dir);
    L->id = (uint64_t)getpid() << 20;
    proto_ctl_request_t q = {.id = ++L->id, .op = PROTO_CTLREQ_SUBSCRIBE};
    proto_msg_t r;
    int rc = rundir_ctl_call(dir, &q, RUNDIR_CTL_ANSWER_MS, &r, &L->c);
    if (rc < 0) { free(L); return rc; }
    if (r.ctl_reply.code < 0) {
        char *t = rundir_ctl_text(&r.ctl_reply);
        rc = dl_seterr(r.ctl_reply.code, "subscribe: %s", t ? t : "refused");
        free(t);
        proto_msg_free(&r);
        mon_live_destroy(&L);
        return rc;
    }
    ingest_history(run, &r.ctl_reply);
    proto_msg_free(&r);
    *out = L;
    return 0;
}

/* The status document's "run" object into topo and the stage names. */
static int on_status(mon_live_t *L, const proto_ctl_reply_t *r, mon_topo_t *topo) {
    if (r->code < 0) return dl_seterr(r->code, "status refused");
    char *txt = rundir_ctl_text(r);
    cJSON *doc = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    const cJSON *jr = cJSON_GetObjectItemCaseSensitive(doc, "run");
    char *rt = cJSON_IsObject(jr) ? cJSON_PrintUnformatted(jr) : NULL;
    cJSON_Delete(doc);
    if (!rt) return dl_seterr(DL_EPROTO, "malformed status reply");
    memset(topo, 0, sizeof *topo);
    int rc = mon_topo_parse(L->dir, rt, strlen(rt), topo);
    free(rt);
    if (rc < 0) return rc;
    for (int i = 0; i < topo->n_stages; i++) {
        int k = 0;
        while (k < L->n_names && L->names[k].id != topo->stages[i].stage_id) k++;
        if (k == L->n_names && L->n_names < MON_MAX_STAGES) L->names[L->n_names++].id = topo->stages[i].stage_id;
        if (k < L->n_names) snprintf(L->names[k].name, sizeof L->names[k].name, "%s", topo->stages[i].name);
    }
    return 0;
}

int mon_live_refresh(mon_live_t *L, mon_run_t *run, mon_topo_t *topo) {
    proto_ctl_request_t q = {.id = ++L->id, .op = PROTO_CTLREQ_STATUS};
    DL_TRY(rundir_ctl_send(L->c, &q));
    for (;;) {
        proto_msg_t m;
        int rc = rundir_ctl_recv(L->c, &m, RUNDIR_CTL_ANSWER_MS);
        if (rc == DL_EPROTO) continue;      /* one bad message: the next may be ours */
        if (rc < 0) return rc;
        if (m.type == PROTO_METRICS) ingest(L, run, &m.metrics);
        if (m.type == PROTO_ERROR) rc = dl_seterr(m.error.code, "%s", m.error.message);
        int done = m.type == PROTO_ERROR || (m.type == PROTO_CTL_REPLY && m.ctl_reply.id == q.id);
        if (m.type == PROTO_CTL_REPLY && m.ctl_reply.id == q.id) rc = on_status(L, &m.ctl_reply, topo);
        proto_msg_free(&m);
        if (done) return rc;
    }
}

int mon_live_drain(mon_live_t *L, mon_run_t *run) {
    int n = 0;
    for (;;) {
        proto_msg_t m;
        int rc = rundir_ctl_recv(L->c, &m, 0);
        if (rc == DL_ETIMEDOUT) return n;
        if (rc == DL_EPROTO) continue;
        if (rc < 0) return rc;
        if (m.type == PROTO_METRICS) ingest(L, run, &m.metrics), n++;
        proto_msg_free(&m);
    }
}

void mon_live_destroy(mon_live_t **Lp) {
    if (!Lp || !*Lp) return;
    rundir_ctl_destroy(&(*Lp)->c);
    free(*Lp);
    *Lp = NULL;
}
