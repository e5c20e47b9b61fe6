/* Supervisor, what the stages tell it: hellos, the metrics relay (metrics.jsonl, PUB,
 * Prometheus), the loss history and the stall check (the progress line: progress.c). */
#include "supervisor/sup_int.h"
#include "supervisor/nodes.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/testhook.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether peer is the bus id of stage stage_id's live incarnation, which said a hello
 * the supervisor verified (its credential: relay's hello check). */
static int from_member(sup_t *S, const char *peer, uint32_t stage_id) {
    sstage_t *x = sup__by_id(S, stage_id);
    return x && x->helloed && !x->exited && !strcmp(x->peer, peer);
}

/* Whether peer is the bus id of the incarnation of stage m->stage_id that said a
 * verified hello and has exited since (the stage slot is not running another one yet). */
static int just_exited(sup_t *S, const char *peer, const proto_metrics_t *m) {
    sstage_t *x = sup__by_id(S, m->stage_id);
    return x && x->helloed && x->exited && x->incarnation == m->incarnation && !strcmp(x->peer, peer);
}

/* The optimizer could not write a checkpoint (metric ckpt_failures went up): said on the
 * console at once with its reason, kept for run.json / status; training goes on. */
static void ckpt_failure(sup_t *S, const proto_metrics_t *m) {
    double n = -1, step = -1;
    for (uint32_t k = 0; k < m->n_metrics; k++) {
        if (!strcmp(m->metrics[k].name, "ckpt_failures")) n = m->metrics[k].value;
        if (!strcmp(m->metrics[k].name, "ckpt_failed_step")) step = m->metrics[k].value;
    }
    if (!(n > S->ckpt_failures_seen) || !(step >= 0) || step > 9e18) return;
    S->ckpt_failures_seen = (int)n;
    S->ckpt_failed_step = (int64_t)step;
    sstage_t *O = sup__by_id(S, PIPE_ID_OPTIMIZER);
    int k = O ? O->spec->node : 0;
    char log_path[4200];
    snprintf(log_path, sizeof log_path, "%s/logs/optimizer.log", k > 0 ? S->nodes[k].run_dir : S->o->out_dir);
    if (sup__last_error_line(log_path, S->ckpt_error, sizeof S->ckpt_error) < 0)
        snprintf(S->ckpt_error, sizeof S->ckpt_error, "see %.400s", log_path);
    sup__progress_break(S);
    printf("checkpoint step_%lld could not be written: %s; training goes on, the next checkpoint tries "
           "again (log %s)\n", (long long)S->ckpt_failed_step, S->ckpt_error, log_path);
    fflush(stdout);
    log_warn("checkpoint step_%lld could not be written (%d so far)", (long long)S->ckpt_failed_step,
             S->ckpt_failures_seen);
    sup__write_run_json(S);
}

static void on_metrics(sup_t *S, const char *peer, const proto_metrics_t *m) {
    if (S->mon) mon_run_ingest_proto(S->mon, peer, m);
    for (int i = 0; i < S->n; i++)
        if (S->st[i].spec->stage_id == m->stage_id)
            for (uint32_t k = 0; k < m->n_metrics; k++)
                if (!strcmp(m->metrics[k].name, "since_progress_s")) S->st[i].since_progress_s = m->metrics[k].value;
    if (m->role == PROTO_ROLE_OPTIMIZER) ckpt_failure(S, m);
    if (m->role == PROTO_ROLE_OPTIMIZER)
        for (uint32_t k = 0; k < m->n_metrics; k++) {
            if (!strcmp(m->metrics[k].name, "ckpt_step") && m->metrics[k].value >= 0 &&
                m->metrics[k].value < 9e18 && (int64_t)m->metrics[k].value > S->opt_ckpt_step)
                S->opt_ckpt_step = (int64_t)m->metrics[k].value;
            /* a stopped run's final checkpoint (a --max-steps run's comes as ckpt_s below) */
            if (!strcmp(m->metrics[k].name, "final_ckpt_s") && m->metrics[k].value > 0 &&
                m->metrics[k].value < 1e7)
                S->final_ckpt_s = m->metrics[k].value;
        }
    if (m->role == PROTO_ROLE_DRAFTER) {
        sstage_t *x = NULL;
        for (int i = 0; i < S->n; i++) if (S->st[i].spec->stage_id == m->stage_id) x = &S->st[i];
        double b = 0;
        for (uint32_t i = 0; i < m->n_metrics; i++)
            if (!strcmp(m->metrics[i].name, "inbox_gpu_bytes") || !strcmp(m->metrics[i].name, "inbox_host_bytes"))
                b += m->metrics[i].value;
        if (x) x->inbox_bytes = b;
    }
    if (S->metrics) {
        const char *names[DL_PROTO_MAX_METRICS];
        double values[DL_PROTO_MAX_METRICS];
        for (uint32_t i = 0; i < m->n_metrics; i++) names[i] = m->metrics[i].name, values[i] = m->metrics[i].value;
        if (rundir_metrics_append(S->metrics, m->ts_ns, peer, m->stage_id, m->incarnation, m->state, names, values,
                                  (int)m->n_metrics) < 0 && !S->metrics_warned) {
            S->metrics_warned = 1;
            log_warn("%s", dl_errmsg());
        }
    }
    if (m->role != PROTO_ROLE_OPTIMIZER || strcmp(m->state, "step") != 0) return;
    double step = -1, loss = NAN, acc_mean = 0, tokens = 0, elapsed = 0, step_tokens = NAN;
    S->n_acc = 0;
    for (uint32_t i = 0; i < m->n_metrics; i++) {
        const char *n = m->metrics[i].name;
        double v = m->metrics[i].value;
        if (!strcmp(n, "step")) step = v;
        else if (!strcmp(n, "loss")) loss = v;
        else if (!strcmp(n, "acc_mean")) acc_mean = v;
        else if (!strcmp(n, "tokens")) tokens = v;
        else if (!strcmp(n, "elapsed_s")) elapsed = v;
        else if (!strcmp(n, "step_tokens")) step_tokens = v;
        else if (!strcmp(n, "ckpt_s")) S->final_ckpt_s = v;   /* only on the final step's */
        else if (!strncmp(n, "acc_", 4) && S->n_acc < 16) S->acc[S->n_acc++] = v;
    }
    if (step < 0) return;
    /* a step message of an optimizer incarnation already dead (queued before its death,
     * read after it was reaped) is not a step of its successor: neither the recovery
     * nor the token count may take it */
    const sstage_t *O = sup__by_id(S, PIPE_ID_OPTIMIZER);
    if (O && m->incarnation != O->incarnation) {
        log_debug("step %.0f of optimizer incarnation %llu (current %llu): ignored", step,
                  (unsigned long long)m->incarnation, (unsigned long long)O->incarnation);
        return;
    }
    for (int i = 0; i < S->n; i++) {
        /* the first step applied after a restarted stage's successor said hello */
        sstage_t *x = &S->st[i];
        if (x->t_died <= 0 || x->t_back <= 0) continue;
        double now = clock_mono_s();
        x->last_up_s = x->t_back - x->t_died;
        x->last_recovery_s = now - x->t_died;
        x->t_died = x->t_back = 0;
        log_info("%s recovery: its successor was up %.2f s after its death, step %.0f applied %.2f s after it",
                 x->spec->name, x->last_up_s, step, x->last_recovery_s);
        sup__write_run_json(S);
    }
    if (S->t_opt_died > 0) {
        /* first step of a restarted optimizer: the recovery is over */
        S->last_recovery_s = clock_mono_s() - S->t_opt_died;
        S->t_opt_died = 0;
        log_info("optimizer recovery: first step %.0f applied %.2f s after its death", step, S->last_recovery_s);
    }
    sup__progress_step(S, m);
    /* the rate is over the supervisor's clock, from the first applied step to the last:
     * the optimizer's elapsed_s restarts with each incarnation, while its token count
     * (restored from the checkpoint) is the run's, so the two do not mix across a
     * restart; the tokens are those of the steps that survive (re-applied ones once) */
    if (!S->have_step) {
        S->t_first_step = clock_mono_s();
        S->tokens_first = tokens;
        S->elapsed_first = elapsed;
    }
    S->have_step = 1;
    if (!S->t_last_step || (uint64_t)step != S->last_step_seen) S->t_last_step = clock_mono_s();
    S->last_step_seen = (uint64_t)step;
    S->last_loss = loss;
    S->last_acc_mean = acc_mean;
    S->tokens = tokens;
    S->elapsed = elapsed;
    if (S->n_losses < SUP_LOSS_HIST) {
        /* an optimizer without step_tokens: the cumulative count's difference */
        double prev = S->n_losses ? S->last_tokens_step : tokens;
        S->step_t[S->n_losses] = clock_mono_s();
        S->step_tok[S->n_losses] = isfinite(step_tokens) ? step_tokens : tokens - prev;
        S->losses[S->n_losses++] = loss;
    }
    S->last_tokens_step = tokens;
}

/* Membership (common/pipe/cred.h): 1 when hello h carries the credential of its stage id
 * and incarnation in this run. Else peer gets an `error` reply (PROTOCOL.md, hello) and
 * 0 is returned: the caller ignores the hello (no config, no route, not "up"). */
static int hello_member(sup_t *S, const char *peer, const proto_hello_t *h) {
    uint8_t want[CRED_BYTES];
    sup__cred(S, h->stage_id, h->incarnation, want);
    int ok = cred_equal(h->cred, h->cred_len, want);
    memset(want, 0, sizeof want);
    if (ok) return 1;
    char name[32];
    pipe_stage_name(h->stage_id, name, sizeof name);
    log_warn("hello from %s as %s incarnation %llu refused: %s credential", peer, name,
             (unsigned long long)h->incarnation, h->cred_len ? "wrong" : "no");
    proto_msg_t e;
    proto_msg_init(&e, PROTO_ERROR);
    e.error.code = DL_EPROTO;
    e.error.ref_type = PROTO_HELLO;
    snprintf(e.error.message, sizeof e.error.message, "hello refused: not a member of run %s in role %s",
             S->o->run_id, name);
    stage_send(S->bus, peer, &e);
    return 0;
}

/* Stage-to-stage membership (common/pipe/cred.h): the run's peer key, to a stage whose
 * config request was just verified (CONTROL PEERS, then its RUN_CONFIG). The key lets a
 * member make and check hello tokens; the run secret stays here. */
static void send_peer_key(sup_t *S, const char *peer) {
    uint8_t key[CRED_BYTES];
    cred_peer_key(S->secret, S->o->run_id, key);
    proto_msg_t m;
    proto_msg_init(&m, PROTO_CONTROL);
    m.control.op = PROTO_CTL_PEERS;
    cred_to_hex(key, m.control.arg);
    stage_send(S->bus, peer, &m);
    memset(key, 0, sizeof key);
    memset(m.control.arg, 0, sizeof m.control.arg);
}

void sup__on_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)bus;
    sup_t *S = arg;
    proto_msg_t m;
    if (stage_decode("supervisor", peer, data, len, &m) < 0) return;
    if (sup__nodes_on_msg(S, peer, &m)) { proto_msg_free(&m); return; }   /* node agents (nodes.c) */
    switch (m.type) {
    case PROTO_HELLO: {
        sstage_t *x = sup__by_id(S, m.hello.stage_id);
        if (!hello_member(S, peer, &m.hello)) break;   /* before anything: not even "unknown" */
        if (!x) { log_warn("hello from unknown stage %u (%s)", m.hello.stage_id, peer); break; }
        if (m.hello.capabilities & PROTO_CAP_WANT_CONFIG) {
            /* a config request, before the stage loads anything: RUN_CONFIG only (not "up");
             * one from an incarnation already replaced gets nothing */
            if (m.hello.incarnation == x->incarnation && !x->exited) {
                send_peer_key(S, peer);   /* first, on the same connection: in order */
                sup__send_config(S, x, peer, m.hello.incarnation);
            }
            else log_warn("config request from %s incarnation %llu (current %llu): ignored", peer,
                          (unsigned long long)m.hello.incarnation, (unsigned long long)x->incarnation);
            bus_peer_quiet(bus, peer);   /* its socket closes once answered: not a death */
            break;
        }
        x->helloed = 1;
        snprintf(x->peer, sizeof x->peer, "%s", peer);
        if (x->t_died > 0 && x->t_back == 0) x->t_back = clock_mono_s();
        log_info("%s is up (pid %u, incarnation %llu)", peer, m.hello.pid,
                 (unsigned long long)m.hello.incarnation);
        if (m.hello.stage_id >= PIPE_ID_TARGET0) sup__push_route(S, x);
        /* a drafter started by a rebalance: the targets routed to it may move now */
        if (is_drafter(x) && m.hello.incarnation == 1)
            for (int i = 0; i < S->n; i++)
                if (is_target(&S->st[i]) && S->st[i].active && !S->st[i].retiring &&
                    route_of(S, S->st[i].spec->stage_id) == (int)(x->spec->stage_id - PIPE_ID_DRAFTER0))
                    sup__push_route(S, &S->st[i]);
        /* a restarted drafter or loader must hear from the targets again: re-push their
         * routes (a target re-introduces itself to its drafter and the loader) */
        if (((m.hello.stage_id >= PIPE_ID_DRAFTER0 && m.hello.stage_id < PIPE_ID_TARGET0) ||
             m.hello.stage_id == PIPE_ID_LOADER) && m.hello.incarnation > 1)
            for (int i = 0; i < S->n; i++)
                if (S->st[i].spec->stage_id >= PIPE_ID_TARGET0) sup__push_route(S, &S->st[i]);
        /* a restarted drafter: whatever targets wrote into its predecessor's slots
         * since the death was reported is lost too: the loader re-issues every
         * unapplied micro-batch once more (the ledger drops duplicates) */
        if (is_drafter(x) && m.hello.incarnation > 1) {
            int64_t id = x->spec->stage_id;
            sstage_t *L = sup__by_id(S, PIPE_ID_LOADER);
            if (L) sup__send_ctl(S, L, PROTO_CTL_MEMBERSHIP, &id, 1);
        }
        if (S->stopping && x->pid > 0) sup__kill(S, x, SIGTERM);
        break;
    }
    case PROTO_METRICS:
        /* only from the stage that said a verified hello over this peer id (an intruder's
         * metrics would reach metrics.jsonl, the monitor and the ckpt_step bookkeeping);
         * the optimizer's last metrics of an incarnation that just exited count too: a
         * remote optimizer's final ckpt_step travels on its own connection and may come
         * after its agent's exit report (a stopped multi-node run then claimed its final
         * checkpoint was not written) */
        if (!from_member(S, peer, m.metrics.stage_id) &&
            !(m.metrics.stage_id == PIPE_ID_OPTIMIZER && just_exited(S, peer, &m.metrics))) {
            log_debug("metrics from %s (stage %u) dropped: not a member's verified peer", peer, m.metrics.stage_id);
            break;
        }
        on_metrics(S, peer, &m.metrics);
        sup__ctl_on_metrics(S, peer, &m.metrics, data, len);
        if (S->pub) bus_send(S->pub, peer, data, len); /* the relay: one PUB, topic = stage */
        break;
    case PROTO_APPLIED: {
        /* news from an optimizer already reaped (queued before its death) would undo
         * the rewind to its checkpoint: only the live incarnation counts */
        sstage_t *O = sup__by_id(S, PIPE_ID_OPTIMIZER);
        if (O && (O->exited || !O->helloed)) break;
        if (!from_member(S, peer, PIPE_ID_OPTIMIZER)) {   /* applied ends the run: the optimizer's only */
            log_warn("applied from %s dropped: not the optimizer's verified peer", peer);
            break;
        }
        if ((int64_t)m.applied.step > S->last_applied) S->last_applied = (int64_t)m.applied.step;
        if (m.applied.step + 1 >= S->o->max_steps) sup__begin_stop(S, "reached --max-steps");
        break;
    }
    default:
        break;
    }
    proto_msg_free(&m);
}

double sup__mean_range(const double *v, uint64_t a, uint64_t b) {
    double s = 0;
    uint64_t n = 0;
    for (uint64_t i = a; i < b; i++) if (isfinite(v[i])) { s += v[i]; n++; }
    return n ? s / (double)n : NAN;
}

/* A run with no applied step for max(60 s, 10 x the mean step time) says so in its own
 * output once, and again every minute while it lasts: the stages whose own progress
 * counter (since_progress_s) is as old, and where to look (`draftline monitor`). */
void sup__stall_check(sup_t *S, double now) {
    if (S->ntab.on && !S->ntab.ready) return;   /* waiting for the nodes: no stage runs yet */
    double since = now - (S->have_step ? S->t_last_step : S->ntab.on ? S->ntab.t_ready : S->t0);
    uint64_t done = S->have_step ? S->last_step_seen + 1 - S->o->start_step : 0;
    double mean = done > 1 ? (S->t_last_step - S->t_first_step) / (double)(done - 1) : 0;
    if (!(S->stall_warn_floor_s > 0)) {     /* once: the test hook "stall_warn_s" (a floor under 60 s) */
        int64_t h;
        S->stall_warn_floor_s = testhook_i64("stall_warn_s", &h) == 1 && h > 0 ? (double)h : 60;
    }
    double floor_s = S->stall_warn_floor_s;
    double limit = 10 * mean > floor_s ? 10 * mean : floor_s;
    if (since < limit || now - S->last_stall_warn < (floor_s < 60 ? floor_s : 60)) return;
    S->last_stall_warn = now;
    char who[512] = "";
    size_t n = 0;
    for (int i = 0; i < S->n; i++) {
        sstage_t *x = &S->st[i];
        if (!x->active || x->exited || !x->helloed) continue;
        if (x->since_progress_s >= 0 && x->since_progress_s < limit) continue;
        n += (size_t)snprintf(who + n, n < sizeof who ? sizeof who - n : 0, "%s%s", n ? ", " : "", x->spec->name);
        if (n >= sizeof who) break;
    }
    sup__progress_break(S);
    printf("[%5.0fs] WARNING: no step applied for %.0f s%s; stages with no progress: %s. See `draftline "
           "monitor --run %s` (and %s/logs)\n", now - S->t0, since, S->have_step ? "" : " (none yet)",
           who[0] ? who : "(every stage reports progress: waiting on each other?)", S->o->out_dir, S->o->out_dir);
    fflush(stdout);
}
