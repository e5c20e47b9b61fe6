/* loader: the first pipeline stage. Serves micro-batches from a prepared cache
 * (.dlc) to targets, only on request (credit), remembers which target holds which
 * micro-batch, re-issues the work of a target that died (heartbeat timeout, or a
 * new incarnation saying hello), and forgets a micro-batch only when the optimizer
 * reports its step applied (exactly-once: the optimizer's ledger drops duplicates
 * of re-issued work).
 *
 * Micro-batch mb is a pure function of (cache, batcher options, seed, mb)
 * (common/data/batcher.h), so the cursor is just the first micro-batch of the next
 * unapplied step; the run configuration's start_step resumes there. The loader issues at
 * most lookahead_mbs micro-batches past the current step, which bounds what can pile up
 * in drafter inboxes while a step is incomplete (the supervisor sizes it from the
 * inbox so that the current step can always make progress).
 */
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/data/batcher.h"
#include "common/data/prepare.h"
#include "common/pipe/peers.h"
#include "common/pipe/runcfg.h"
#include "common/pipe/stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* inflight_t.peer below 0: queued for re-issue. Work of a dead or restarted target goes
 * out before new work (nobody else will compute it); work the stall watchdog suspects
 * lost goes out only when no new micro-batch may go, so it never starves new work. */
#define INFLIGHT_REISSUE_DEAD  (-1)
#define INFLIGHT_REISSUE_STALL (-2)

typedef struct {
    uint64_t mb;
    int peer;               /* index into peers, or INFLIGHT_REISSUE_* */
    double issued_s;
    int last;               /* the peer it went to last (a stall re-issue avoids it) */
} inflight_t;

typedef struct {
    stage_t st;
    bus_t *srv;             /* ROUTER: targets and the optimizer */
    dlc_t *cache;
    batcher_t *b;
    batcher_opts_t bo;
    uint64_t next_mb;       /* next fresh micro-batch */
    uint64_t end_mb;        /* one past the last micro-batch to issue */
    uint64_t applied_steps; /* steps the optimizer applied: step A is current */
    uint64_t lookahead;     /* micro-batches allowed past the current step */
    peers_t peers;          /* targets (and others) that said hello (common/pipe/peers.h) */
    uint32_t credit[PEERS_MAX]; /* by registry index: micro-batches asked for, not received */
    /* by registry index: when the peer last showed progress (hello, work request), and the
     * mean interval between its work requests (s; 0 until two were seen): a target asks
     * again each time a forward ends, so a long silence means its work is stuck */
    double t_progress[PEERS_MAX], gap_ema[PEERS_MAX];
    uint8_t asks[PEERS_MAX];    /* by registry index: it asked for work at least once (a target) */
    inflight_t *inflight;   /* unapplied micro-batches handed out or queued again */
    size_t ninflight, capinflight;
    /* packing buffers, sized by the token budget */
    int32_t *ids, *cu, *lens;
    uint8_t *mask;
    /* metrics */
    uint64_t issued, reissued, tokens_out, applied_mbs, dup_applied;
    double t_last_rate; uint64_t tokens_at_last, mbs_at_last;
    stage_rate_t win_tok, win_mb;   /* tokens_per_s, mbs_per_s over the last 5 s */
    double rate_tok, rate_mb;
    int done_logged;
    /* stall watchdog: re-issue the current step's work when no step was applied for a while */
    double t_applied, t_stall_reissue;
    int watch_armed;        /* from the first applied step on (start-up is not a stall) */
    bus_timer_t *watchdog;
} loader_t;

/* All unapplied work held by peer i goes back to the queue (its target died or
 * restarted: whatever it computed may never reach a drafter). */
static void requeue_peer(loader_t *L, int i, const char *why) {
    int n = 0;
    for (size_t k = 0; k < L->ninflight; k++)
        if (L->inflight[k].peer == i) { L->inflight[k].peer = INFLIGHT_REISSUE_DEAD; n++; }
    L->credit[i] = 0;
    if (n) log_warn("%s %s: %d micro-batch(es) queued for re-issue", L->peers.p[i].id, why, n);
}

static uint64_t step_limit(const loader_t *L) {
    uint64_t K = L->bo.micro_batches_per_step;
    uint64_t lim = (L->applied_steps + 1) * K + L->lookahead;
    return lim < L->end_mb ? lim : L->end_mb;
}

static int send_mb(loader_t *L, int pi, uint64_t mb) {
    batcher_mb_t m;
    int rc = batcher_get(L->b, mb, &m);
    if (rc < 0) return log_rc(rc, "batcher_get");
    DL_TRY(batcher_pack(L->b, &m, L->ids, L->mask, NULL, L->cu));
    for (uint32_t s = 0; s < m.n_seqs; s++) L->lens[s] = L->cu[s + 1] - L->cu[s];
    proto_msg_t o;
    proto_msg_init(&o, PROTO_MICRO_BATCH);
    proto_micro_batch_t *x = &o.micro_batch;
    x->mb = mb;
    x->step = mb / L->bo.micro_batches_per_step;
    x->epoch = m.epoch;
    x->mbs_in_step = L->bo.micro_batches_per_step;
    x->mb_in_step = (uint32_t)(mb % L->bo.micro_batches_per_step);
    x->n_seqs = m.n_seqs;
    x->tokens = L->ids; x->n_tokens = m.n_tokens;
    x->seq_lens = L->lens; x->n_seq_lens = m.n_seqs;
    x->loss_mask = L->mask; x->n_loss_mask = m.n_tokens;
    rc = stage_send(L->srv, L->peers.p[pi].id, &o);
    if (rc < 0) return rc;
    L->issued++;
    L->tokens_out += m.n_tokens;
    return 0;
}

/* Index in L->inflight of the lowest queued micro-batch of kind `why`
 * (INFLIGHT_REISSUE_*) that did not last go to peer `avoid` (-1: none avoided): the lowest
 * holds up the oldest step. SIZE_MAX when none. */
static size_t reissue_pick(const loader_t *L, int why, int avoid) {
    size_t best = SIZE_MAX;
    for (size_t k = 0; k < L->ninflight; k++)
        if (L->inflight[k].peer == why && L->inflight[k].last != avoid &&
            (best == SIZE_MAX || L->inflight[k].mb < L->inflight[best].mb))
            best = k;
    return best;
}

/* 1 when a live target other than peer i asks for work: a stall re-issue then goes there
 * rather than back to the target that fell silent holding it (wedged downstream). */
static int other_target(const loader_t *L, int i) {
    for (int j = 0; j < L->peers.n; j++)
        if (j != i && L->peers.p[j].alive && L->asks[j]) return 1;
    return 0;
}

/* Hands out work while some target has credit and some micro-batch may go: first the
 * work of dead targets, then new micro-batches, then what the stall watchdog queued. */
static void serve(loader_t *L) {
    if (L->st.stopping) return;
    for (int progress = 1; progress;) {
        progress = 0;
        for (int i = 0; i < L->peers.n; i++) {
            const peer_info_t *p = &L->peers.p[i];
            uint32_t *credit = &L->credit[i];
            if (!p->alive || *credit == 0) continue;
            size_t best = reissue_pick(L, INFLIGHT_REISSUE_DEAD, -1);
            if (best == SIZE_MAX && L->next_mb >= step_limit(L))
                best = reissue_pick(L, INFLIGHT_REISSUE_STALL, other_target(L, i) ? i : -1);
            if (best != SIZE_MAX) {
                if (send_mb(L, i, L->inflight[best].mb) == 0) {
                    L->inflight[best].peer = L->inflight[best].last = i;
                    L->inflight[best].issued_s = clock_mono_s();
                    (*credit)--;
                    L->reissued++;
                    log_info("re-issued micro-batch %llu to %s",
                             (unsigned long long)L->inflight[best].mb, p->id);
                    progress = 1;
                }
                continue;
            }
            if (L->next_mb >= step_limit(L)) continue;
            if (L->ninflight == L->capinflight) {
                size_t cap = L->capinflight ? 2 * L->capinflight : 64;
                inflight_t *n = realloc(L->inflight, cap * sizeof *n);
                if (!n) { log_error("loader: out of memory"); return; }
                L->inflight = n;
                L->capinflight = cap;
            }
            if (send_mb(L, i, L->next_mb) == 0) {
                L->inflight[L->ninflight++] = (inflight_t){L->next_mb, i, clock_mono_s(), i};
                L->next_mb++;
                (*credit)--;
                progress = 1;
                stage_progress(&L->st);
            }
        }
    }
    int waiting = 0;
    for (int i = 0; i < L->peers.n; i++) waiting |= L->peers.p[i].alive && L->credit[i] > 0;
    L->st.state = waiting ? PROTO_STATE_BLOCKED : PROTO_STATE_IDLE;
    if (L->applied_steps * L->bo.micro_batches_per_step >= L->end_mb && !L->done_logged) {
        log_info("every micro-batch up to %llu applied", (unsigned long long)L->end_mb);
        L->done_logged = 1;
    }
}

static void on_applied(loader_t *L, const proto_applied_t *a) {
    for (uint32_t j = 0; j < a->n_mbs; j++) {
        int found = 0;
        for (size_t k = 0; k < L->ninflight; k++) {
            if (L->inflight[k].mb != a->mbs[j]) continue;
            L->inflight[k] = L->inflight[--L->ninflight];
            found = 1;
            break;
        }
        if (found) L->applied_mbs++;
        else L->dup_applied++;
    }
    if (a->step + 1 > L->applied_steps) {
        L->watch_armed = 1;   /* start-up (model loading) is not a stall */
        L->t_applied = clock_mono_s();
        L->applied_steps = a->step + 1;
    }
    /* Work of older steps can no longer be applied: forget it. */
    uint64_t first = L->applied_steps * L->bo.micro_batches_per_step;
    for (size_t k = 0; k < L->ninflight;) {
        if (L->inflight[k].mb < first) L->inflight[k] = L->inflight[--L->ninflight];
        else k++;
    }
    stage_progress(&L->st);
    serve(L);
}

/* A hello: targets and the optimizer are members that may talk to the loader
 * (stage_admit; a refused one changes nothing). A restarted target's unapplied work goes
 * back to the queue. */
static void on_hello(loader_t *L, const char *peer, const proto_hello_t *h) {
    int n = L->peers.n;
    peers_hello_t what;
    int i = h->stage_id == PIPE_ID_OPTIMIZER
                ? stage_admit(&L->st, &L->peers, L->srv, peer, h, PIPE_ID_OPTIMIZER, PIPE_ID_OPTIMIZER + 1, &what, NULL)
                : stage_admit(&L->st, &L->peers, L->srv, peer, h, PIPE_ID_TARGET0,
                              PIPE_ID_TARGET0 + PIPE_MAX_TARGETS, &what, NULL);
    if (i < 0) return;
    if (i >= n) { L->credit[i] = 0; L->gap_ema[i] = 0; L->asks[i] = 0; }
    L->t_progress[i] = clock_mono_s();
    if (what == PEERS_RESTARTED && h->role == PROTO_ROLE_TARGET) requeue_peer(L, i, "restarted");
    if (what != PEERS_SAME || h->role == PROTO_ROLE_TARGET)   /* (the optimizer's comes every step) */
        log_info("hello from %s (%s %u, incarnation %llu)", peer, proto_role_name(h->role), h->stage_id,
                 (unsigned long long)h->incarnation);
}

static void on_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)bus;
    loader_t *L = arg;
    proto_msg_t m;
    if (stage_decode("loader", peer, data, len, &m) < 0) return;
    switch (m.type) {
    case PROTO_HELLO:
        on_hello(L, peer, &m.hello);
        break;
    case PROTO_WORK_REQUEST: {   /* only from a target that said a verified hello */
        int i = peers_find(&L->peers, peer);
        if (i < 0 || L->peers.p[i].stage_id < PIPE_ID_TARGET0 || m.work_request.target_id != L->peers.p[i].stage_id) {
            stage_refuse(&L->st, L->srv, peer, m.type, i < 0 ? "not a member's verified peer (no hello)"
                                                               : "not from the target it names");
            break;
        }
        L->peers.p[i].alive = 1;
        L->credit[i] += m.work_request.count;
        L->asks[i] = 1;
        double now = clock_mono_s(), gap = now - L->t_progress[i];
        L->gap_ema[i] = L->gap_ema[i] > 0 ? 0.8 * L->gap_ema[i] + 0.2 * gap : gap;
        L->t_progress[i] = now;
        serve(L);
        break;
    }
    case PROTO_APPLIED: {   /* the optimizer's only: it makes the loader forget work */
        int i = peers_find(&L->peers, peer);
        if (i < 0 || L->peers.p[i].stage_id != PIPE_ID_OPTIMIZER) {
            stage_refuse(&L->st, L->srv, peer, m.type, "not the optimizer's verified peer");
            break;
        }
        on_applied(L, &m.applied);
        break;
    }
    default:
        log_warn("unexpected %s from %s", proto_type_name(m.type), peer);
    }
    proto_msg_free(&m);
}

/* Liveness safety net: work can be lost in ways nobody reports (hidden states
 * written into the slab of a drafter that died just before, a message to a peer that
 * restarted, a target wedged on a drafter that froze). When no step has been applied (nor
 * anything re-issued) for LOADER_STALL_MIN_S, the current step's unapplied micro-batches
 * whose owner is silent go out again, to another target when there is one: an owner is
 * silent when it has asked for no work for max(LOADER_STALL_MIN_S, 5 x its usual interval
 * between asks) and got the micro-batch at least that long ago (a slow target that keeps
 * finishing forwards is computing it; one that finished it and lost it downstream, or is
 * wedged, stops asking). The step time is no measure (the old watchdog's estimate, 1e-3 s
 * after the first step, re-issued a slow target's work forever). A dead owner's work was queued already
 * (on_dead, hello, membership). The ledger drops whatever turns out to be a duplicate, and
 * a duplicate is computed from the same data with the same weights, so the math is
 * unchanged. Re-issues of this kind go out after new work (serve). */
#define LOADER_STALL_MIN_S 2.0
static void on_watchdog(bus_t *bus, void *arg) {
    (void)bus;
    loader_t *L = arg;
    if (L->st.stopping || L->ninflight == 0 || !L->watch_armed) return;
    double now = clock_mono_s();
    double since = now - (L->t_applied > L->t_stall_reissue ? L->t_applied : L->t_stall_reissue);
    if (since < LOADER_STALL_MIN_S) return;
    uint64_t K = L->bo.micro_batches_per_step, lo = L->applied_steps * K, hi = lo + K;
    size_t n = 0;
    for (size_t k = 0; k < L->ninflight; k++) {
        inflight_t *f = &L->inflight[k];
        if (f->mb < lo || f->mb >= hi || f->peer < 0) continue;
        double quiet = 5 * L->gap_ema[f->peer] > LOADER_STALL_MIN_S ? 5 * L->gap_ema[f->peer] : LOADER_STALL_MIN_S;
        if (now - L->t_progress[f->peer] < quiet || now - f->issued_s < quiet) continue;
        f->peer = INFLIGHT_REISSUE_STALL;
        n++;
    }
    L->t_stall_reissue = now;
    if (n) {
        log_warn("step %llu: nothing applied for %.1f s and %zu of its micro-batch(es) held by a silent target: "
                 "they go out again", (unsigned long long)L->applied_steps, since, n);
        serve(L);
    }
}

static void on_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg) {
    (void)bus;
    loader_t *L = arg;
    int i = peers_find(&L->peers, peer);
    if (i < 0) return;
    L->peers.p[i].alive = 0;
    char why[64];
    snprintf(why, sizeof why, "silent for %llu ms", (unsigned long long)silent_ms);
    requeue_peer(L, i, why);
    serve(L);
}

static void on_control(stage_t *st, const proto_control_t *c, void *arg) {
    loader_t *L = arg;
    (void)st;
    /* MEMBERSHIP from the supervisor: a stage died or restarted. ints: the stage ids
     * that are gone; their work is re-issued now rather than at heartbeat timeout. */
    if (c->op == PROTO_CTL_MEMBERSHIP) {
        for (uint32_t j = 0; j < c->n_ints; j++)
            if (c->ints[j] >= PIPE_ID_DRAFTER0 && c->ints[j] < PIPE_ID_TARGET0) {
                /* a drafter died: what its inbox held is lost; re-issue every unapplied
                 * micro-batch (duplicates are dropped by the drafters and the ledger) */
                size_t n = 0;
                for (size_t k = 0; k < L->ninflight; k++)
                    if (L->inflight[k].peer >= 0) { L->inflight[k].peer = INFLIGHT_REISSUE_DEAD; n++; }
                log_warn("drafter %lld gone: %zu unapplied micro-batch(es) queued for re-issue",
                         (long long)(c->ints[j] - PIPE_ID_DRAFTER0), n);
            }
        for (uint32_t j = 0; j < c->n_ints; j++)
            for (int i = 0; i < L->peers.n; i++)
                if (L->peers.p[i].stage_id == (uint32_t)c->ints[j] && c->ints[j] >= PIPE_ID_TARGET0) {
                    L->peers.p[i].alive = 0;
                    requeue_peer(L, i, "reported gone by the supervisor");
                }
        serve(L);
    }
}

static void on_metrics(stage_t *st, proto_metrics_t *m, void *arg) {
    loader_t *L = arg;
    (void)st;
    double now = clock_mono_s();
    /* windowed rates over the last 5 s: not 0 between bursts of issues */
    L->rate_tok = stage_rate(&L->win_tok, now, (double)L->tokens_out, 5.0);
    L->rate_mb = stage_rate(&L->win_mb, now, (double)L->issued, 5.0);
    stage_metric(m, "mbs_per_s", L->rate_mb);
    stage_metric(m, "tokens_per_s", L->rate_tok);
    stage_metric(m, "issued", (double)L->issued);
    stage_metric(m, "reissued", (double)L->reissued);
    stage_metric(m, "in_flight", (double)L->ninflight);
    stage_metric(m, "next_mb", (double)L->next_mb);
    stage_metric(m, "applied_steps", (double)L->applied_steps);
    stage_metric(m, "samples_skipped", (double)dlc_header(L->cache)->n_skipped);
}

static void on_stop(stage_t *st, void *arg) {
    loader_t *L = arg;
    st->state = PROTO_STATE_STOPPING;
    if (L->srv) bus_close(L->srv, NULL, NULL);
    stage_close(st);
}

static void usage(FILE *f) {
    fprintf(f,
        "usage: loader --run-dir DIR --incarnation N [--log-level L]\n"
        "Pipeline stage 1: serves micro-batches of a prepared cache to targets on request.\n"
        "Started by `draftline run`; every setting (cache, seed, token budget, steps, cursor, ...)\n"
        "comes from the run configuration the supervisor sends first (common/pipe/runcfg.h).\n\n"
        "  --run-dir DIR              sockets directory of the run (holds the supervisor's sup.sock)\n"
        "  --incarnation N            restart count given by the supervisor (default 1)\n"
        "  --index I                  accepted for symmetry with the other stages: 0 only\n"
        "  --log-level L              error|warn|info|debug\n"
        "  -h, --help                 this help\n");
}

/* Resumes from a checkpoint's cursor (c->cursor_in): checked against this cache and
 * these options; the first step to issue becomes the later of its step and *start_step.
 * Returns 0, or 1 after logging why. */
static int loader_cursor_in(loader_t *L, const char *cursor_in, int64_t *start_step) {
    uint64_t K = L->bo.micro_batches_per_step;
    uint8_t buf[BATCHER_CURSOR_BYTES];
    batcher_cursor_t cur;
    FILE *f = fopen(cursor_in, "rb");
    size_t got = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    int rc = got == sizeof buf ? batcher_cursor_decode(buf, got, &cur) : dl_seterr(DL_EIO, "%s: unreadable", cursor_in);
    if (rc == 0) rc = batcher_restore(L->b, &cur);
    if (rc < 0) return log_rc(rc, "--cursor-in"), 1;
    if (cur.next_mb % K) { log_error("--cursor-in: micro-batch %llu is not at a step boundary", (unsigned long long)cur.next_mb); return 1; }
    /* a restart after the checkpoint gets a later start step: the later wins */
    if ((int64_t)(cur.next_mb / K) > *start_step) *start_step = (int64_t)(cur.next_mb / K);
    log_info("cursor %s (micro-batch %llu) matches the cache; starting at step %lld", cursor_in,
             (unsigned long long)cur.next_mb, (long long)*start_step);
    return 0;
}

/* Opens the cache and the batcher from the run configuration c, as the flags of the
 * same names did. Returns 0, or 1 after logging why (main exits PIPE_EXIT_PERMANENT:
 * the cache, cursor and options a restart gets are the same). */
static int loader_setup(loader_t *L, const run_config_t *c, uint64_t *total) {
    batcher_opts_default(&L->bo, 0);
    L->bo.seed = c->seed;
    L->bo.token_budget = c->token_budget;
    /* one default everywhere (run --help, the supervisor's data checks, the optimizer's
     * record that a resume passes back): --max-len 0 is the token budget */
    L->bo.max_len = c->max_len > 0 && c->max_len < c->token_budget ? c->max_len : c->token_budget;
    L->bo.micro_batches_per_step = c->mbs_per_step;
    L->bo.epochs = c->epochs;
    int64_t max_steps = (int64_t)c->max_steps, start_step = (int64_t)c->start_step;
    int rc = dlc_open(c->data_cache, &L->cache);
    if (rc < 0) return log_rc(rc, "open cache"), 1;
    rc = batcher_new(L->cache, &L->bo, &L->b);
    if (rc < 0) return log_rc(rc, "batcher"), 1;
    uint64_t K = L->bo.micro_batches_per_step;
    *total = batcher_total_mbs(L->b);
    L->end_mb = *total ? *total / K * K : UINT64_MAX;
    if (max_steps > 0 && (uint64_t)max_steps * K < L->end_mb) L->end_mb = (uint64_t)max_steps * K;
    if (L->end_mb == 0) {
        log_error("the data gives fewer than %llu micro-batches: not one full step", (unsigned long long)K);
        return 1;
    }
    if (c->cursor_in[0] && loader_cursor_in(L, c->cursor_in, &start_step)) return 1;
    L->applied_steps = (uint64_t)start_step;
    L->next_mb = (uint64_t)start_step * K;
    L->lookahead = c->lookahead_mbs;
    size_t tb = L->bo.token_budget;
    L->ids = malloc(tb * 4); L->cu = malloc((tb + 2) * 4); L->lens = malloc((tb + 1) * 4); L->mask = malloc(tb);
    if (!L->ids || !L->cu || !L->lens || !L->mask) { log_error("out of memory"); return 1; }
    return 0;
}

int main(int argc, char **argv) {
    log_init("loader", LOG_INFO);
    static loader_t L;
    static run_config_t cfg;
    stage_args_t a;
    if (stage_args(argc, argv, "loader", 0, usage, &a) < 0) return a.exit_code;
    int rc = stage_config(PROTO_ROLE_LOADER, PIPE_ID_LOADER, "loader", &a, STAGE_CONFIG_TIMEOUT_MS, &cfg);
    if (rc < 0) return log_rc(rc, "run configuration"), 1;
    uint64_t total = 0, K;
    if (loader_setup(&L, &cfg, &total)) return PIPE_EXIT_PERMANENT;   /* a restart reads the same */
    K = L.bo.micro_batches_per_step;
    rc = stage_init(&L.st, PROTO_ROLE_LOADER, PIPE_ID_LOADER, "loader", &a, &cfg);
    if (rc < 0) return log_rc(rc, "stage init"), 1;
    L.srv = stage_bus(&L.st, BUS_ROUTER, "loader");
    if (!L.srv) return log_rc(DL_EIO, "bind loader endpoint"), 1;
    bus_on_message(L.srv, on_msg, &L);
    bus_on_peer_dead(L.srv, on_dead, &L);
    stage_on_metrics(&L.st, on_metrics, &L);
    stage_on_control(&L.st, on_control, &L);
    stage_on_stop(&L.st, on_stop, &L);
    L.t_last_rate = L.t_applied = clock_mono_s();
    /* a restarted loader joins a running pipeline (models loaded): its stall watchdog
     * is armed at once (work its predecessor's targets wrote into a restarted drafter
     * is lost without a report, and no step would ever be applied to arm it) */
    if (a.incarnation > 1) L.watch_armed = 1;
    bus_timer_start(L.srv, 500, 500, on_watchdog, &L, &L.watchdog);
    L.st.state = PROTO_STATE_IDLE;
    log_info("serving %s: %llu micro-batches in total, issuing %llu..%llu, %llu per step, lookahead %llu",
             cfg.data_cache, (unsigned long long)total, (unsigned long long)L.next_mb,
             (unsigned long long)L.end_mb, (unsigned long long)K, (unsigned long long)L.lookahead);
    stage_run(&L.st);
    bus_destroy(&L.srv);
    stage_fini(&L.st);
    batcher_destroy(&L.b);
    dlc_close(&L.cache);
    free(L.ids); free(L.cu); free(L.lens); free(L.mask); free(L.inflight);
    log_info("stopped: issued %llu (%llu re-issued), %llu applied", (unsigned long long)L.issued,
             (unsigned long long)L.reissued, (unsigned long long)L.applied_mbs);
    return 0;
}
