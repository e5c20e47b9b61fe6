/* optimizer: the step communicator with GPU drafters on other nodes (opt_int.h;
 * docs/MULTINODE.md sections 4-5). Off unless the test hook nccl_cross=1 is set.
 *
 * A generation: the member set (live remote GPU drafters, ranks 1..k by stage id), an
 * id made here (rank 0) and sent to each member as `nccl_id`, the gradient communicator
 * made from it and the weights communicator split from it. The set is recomputed from
 * the drafters' registry every ONS_POLL_MS: a hello of a new incarnation, a death (the
 * bus or the supervisor's MEMBERSHIP), a rebalance change it, and a changed set aborts
 * the generation (both communicators, every member's too: they take the newer id) and
 * makes the next one. A member echoes the id once its ranks are ready; from its echo on
 * (control-plane order) each of its gradients_ready has its ncclSend on this
 * generation, and each gets exactly one ncclRecv, in arrival order: into the landing
 * buffer when the step takes it, into a scratch buffer when not (a duplicate, a stale
 * step), so the member's sends and our receives never fall out of step.
 *
 * Bounded waits: an operation NCCL is still enqueuing (ncclInProgress, e.g. the first
 * use connects the channel) is polled on the loop at most ONS_ENQ_WAIT_MS; a receive or
 * broadcast outstanding ONS_OP_TIMEOUT_MS, or a generation not ready after as long,
 * aborts the generation (the lost micro-batches are forgotten: the loader's watchdog
 * re-issues them) and a new one is made. The optimizer's compute stream never waits
 * on a transfer: the step starts only after the completion events were seen. */
#include "optimizer/opt_int.h"

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/testhook.h"
#include "common/mem/dev.h"
#include "common/mem/nccl.h"
#include "common/pipe/layout.h"

#include <stdlib.h>
#include <string.h>

#define ONS_ENQ_WAIT_MS 2000   /* < the 3 s heartbeat timeout: the loop never looks dead */

enum { ONS_NONE, ONS_INIT, ONS_SPLIT, ONS_READY };

struct ons {
    stage_t *st;
    bus_t *srv;
    ops_ctx_t *ops;
    int gpu;
    const peers_t *peers;
    size_t P;
    uint64_t K;
    size_t slab_bytes;           /* K slots of pipe_align256(P * 4): a drafter's gradient slab */
    ons_cb_t cb;
    bus_timer_t *timer;
    /* the generation */
    uint64_t gen;
    nccl_members_t set;
    uint8_t id[NCCL_PAIR_ID_BYTES];
    nccl_pair_t *gc, *wc;        /* gradients (from the id), weights (its split) */
    int state;
    double since;                /* the state's start (clock_mono_s) */
    int echoed[NCCL_STEP_MEMBERS_MAX];
    int64_t bcast_version;       /* broadcast in this generation, -1 none */
    int taken;                   /* ons_take posted this gradients_ready's receive */
    /* device */
    void *gstream, *wstream;
    uint8_t *landing;            /* (slab_bytes) the members' gradient slots */
    uint8_t *scratch;            /* (P * 4) receives the step does not take */
    void *rmark, *wmark;         /* after the last receive / broadcast */
    int rpending, wpending;
    double rsince, wsince;
    uint8_t *kpending;           /* (K) landing slot k has a receive outstanding */
};

/* This drafter's rank in the current generation, -1 none. */
static int rank_of(const ons_t *n, int pi) {
    if (!n || pi < 0 || pi >= n->peers->n || n->state == ONS_NONE) return -1;
    const peer_info_t *p = &n->peers->p[pi];
    return nccl_step_rank(&n->set, p->stage_id, p->incarnation);
}

int ons_member(const ons_t *n, int pi) { return rank_of(n, pi) > 0; }

int ons_busy(const ons_t *n) { return n && (n->rpending || n->wpending); }

static void members_now(const ons_t *n, nccl_members_t *s) {
    nccl_member_t cand[PEERS_MAX];
    int c = 0;
    for (int i = 0; i < n->peers->n && c < PEERS_MAX; i++) {
        const peer_info_t *p = &n->peers->p[i];
        if (p->alive && p->stage_id && stage_remote(n->st, p->stage_id))
            cand[c++] = (nccl_member_t){p->stage_id, p->incarnation};
    }
    if (nccl_step_members(cand, c, s) < 0) log_warn("step communicator: %s (the rest wait)", dl_errmsg());
}

/* Drops the generation: both communicators aborted (never waits for a peer); what was
 * in flight is lost and said so. */
static void gen_abort(ons_t *n, const char *why) {
    if (n->gc || n->wc) log_warn("step communicator generation %llu aborted: %s", (unsigned long long)n->gen, why);
    nccl_pair_abort(&n->wc);
    nccl_pair_abort(&n->gc);
    for (uint64_t k = 0; k < n->K; k++)
        if (n->kpending[k]) {
            n->kpending[k] = 0;
            n->cb.lost(n->cb.arg, k);
        }
    n->rpending = n->wpending = 0;
    n->state = ONS_NONE;
    n->bcast_version = -1;
    n->taken = 0;
    memset(n->echoed, 0, sizeof n->echoed);
}

static int buffers(ons_t *n) {
    if (n->landing) return 0;
    const ops_impl_t *x = n->ops->impl;
    n->landing = x->malloc_(n->ops, n->slab_bytes);
    n->scratch = x->malloc_(n->ops, n->P * sizeof(float));
    if (!n->landing || !n->scratch)
        return dl_seterr(DL_ENOMEM, "GPU %d: no memory for the gradient landing buffer (%zu bytes)", n->gpu,
                         n->slab_bytes + n->P * sizeof(float));
    return 0;
}

/* The next generation for set s: a new id, rank 0 started, the id to every member. */
static void gen_new(ons_t *n, const nccl_members_t *s) {
    gen_abort(n, "the membership changed");
    n->set = *s;
    n->gen++;
    if (s->n == 0) return;
    int rc = buffers(n);
    if (rc == 0) rc = nccl_id_new(n->id);
    if (rc == 0) rc = nccl_pair_init(&n->gc, n->id, s->n + 1, 0, n->gpu);
    n->since = clock_mono_s();
    if (rc < 0) { log_error("step communicator: %s", dl_errmsg()); return; }   /* again in ONS_OP_TIMEOUT_MS */
    n->state = ONS_INIT;
    for (int j = 0; j < s->n; j++) {
        int pi = -1;
        for (int i = 0; i < n->peers->n && pi < 0; i++)
            if (n->peers->p[i].stage_id == s->m[j].stage_id) pi = i;
        if (pi < 0) continue;   /* cannot be: the set comes from the registry */
        proto_msg_t m;
        proto_msg_init(&m, PROTO_NCCL_ID);
        proto_nccl_id_t *x = &m.nccl_id;
        x->owner_id = PIPE_ID_OPTIMIZER; x->owner_inc = n->st->incarnation;
        x->peer_id = s->m[j].stage_id; x->peer_inc = s->m[j].incarnation;
        x->nranks = (uint32_t)s->n + 1; x->rank = (uint32_t)j + 1; x->id_len = DL_PROTO_NCCL_ID_BYTES;
        memcpy(x->id, n->id, NCCL_PAIR_ID_BYTES);
        stage_send(n->srv, n->peers->p[pi].id, &m);
    }
    log_info("step communicator generation %llu: %s, %d drafter(s) on other nodes, id sent",
             (unsigned long long)n->gen, nccl_pair_name(n->gc), s->n);
}

/* An operation NCCL is still enqueuing: polled here, bounded. */
static int settle(nccl_pair_t *p, int rc) {
    return rc == DL_EAGAIN ? nccl_pair_wait(p, ONS_ENQ_WAIT_MS) : rc;
}

/* INIT -> SPLIT -> READY, from the timer. 1 when it became ready now. */
static int advance(ons_t *n) {
    int rc = 0;
    if (n->state == ONS_NONE) {   /* a generation that could not start: tried again */
        if (n->set.n > 0 && clock_mono_s() - n->since > ONS_OP_TIMEOUT_MS / 1e3) n->set.n = -1;
        return 0;
    }
    if (n->state == ONS_INIT) {
        rc = nccl_pair_poll(n->gc);
        if (rc == 0) rc = nccl_pair_split(n->gc, &n->wc);
        if (rc == 0) { n->state = ONS_SPLIT; return 0; }
    } else if (n->state == ONS_SPLIT) {
        rc = nccl_pair_poll(n->wc);
        if (rc == 0) rc = nccl_pair_poll(n->gc);
        if (rc == 0) {
            n->state = ONS_READY;
            log_info("step communicator generation %llu ready (%s)", (unsigned long long)n->gen,
                     nccl_pair_name(n->gc));
            return 1;
        }
    } else if (n->state == ONS_READY && !n->rpending && !n->wpending) {
        rc = nccl_pair_poll(n->gc);   /* an asynchronous error (a peer gone) */
        if (rc == 0) rc = nccl_pair_poll(n->wc);
        if (rc == DL_EAGAIN) rc = 0;
    }
    if (rc == DL_EAGAIN && clock_mono_s() - n->since > ONS_OP_TIMEOUT_MS / 1e3)
        rc = dl_seterr(DL_ETIMEDOUT, "not ready after %d ms (a member that never joined)", ONS_OP_TIMEOUT_MS);
    if (rc < 0 && rc != DL_EAGAIN) {
        log_error("step communicator generation %llu: %s", (unsigned long long)n->gen, dl_errmsg());
        gen_abort(n, "failed");
        n->set.n = -1;   /* differs from any set: the next tick makes a new generation */
    }
    return 0;
}

/* 1 when the outstanding transfers of one kind are all done; aborts on a timeout. */
static int done(ons_t *n, void *mark, int *pending, double since, const char *what) {
    if (!*pending) return 0;
    int rc = nccl_mark_done(mark);
    if (rc == 0) { *pending = 0; return 1; }
    if (rc == DL_EAGAIN && clock_mono_s() - since <= ONS_OP_TIMEOUT_MS / 1e3) return 0;
    if (rc == DL_EAGAIN) dl_seterr(DL_ETIMEDOUT, "%s outstanding for %d ms", what, ONS_OP_TIMEOUT_MS);
    log_error("step communicator generation %llu: %s", (unsigned long long)n->gen, dl_errmsg());
    gen_abort(n, what);
    n->set.n = -1;
    return 0;
}

static void on_timer(bus_t *bus, void *arg) {
    (void)bus;
    ons_t *n = arg;
    nccl_members_t s;
    members_now(n, &s);
    if (!nccl_step_same(&s, &n->set)) { gen_new(n, &s); return; }
    if (advance(n)) n->cb.ready(n->cb.arg);
    int landed = 0;
    if (done(n, n->rmark, &n->rpending, n->rsince, "a gradient receive")) {
        memset(n->kpending, 0, n->K);
        landed = 1;
    }
    if (done(n, n->wmark, &n->wpending, n->wsince, "a weights broadcast")) landed = 1;
    if (landed) n->cb.landed(n->cb.arg);
}

int ons_new(ons_t **out, stage_t *st, bus_t *srv, ops_ctx_t *ops, int gpu, const peers_t *peers, size_t P,
            uint64_t K, const ons_cb_t *cb) {
    *out = NULL;
    int64_t v = 0;
    if (gpu < 0 || !testhook_i64("nccl_cross", &v) || v != 1) return 0;
    if (!nccl_available())
        return log_rc(dl_seterr(DL_ENOTSUP, "test hook nccl_cross=1 in a build without NCCL"), "optimizer");
    ons_t *n = calloc(1, sizeof *n);
    if (!n || !(n->kpending = calloc(K, 1))) {
        free(n);
        return log_rc(dl_seterr(DL_ENOMEM, "out of memory"), "step communicator");
    }
    n->st = st; n->srv = srv; n->ops = ops; n->gpu = gpu; n->peers = peers;
    n->P = P; n->K = K; n->cb = *cb;
    n->slab_bytes = (size_t)K * (size_t)pipe_align256(P * sizeof(float));
    n->bcast_version = -1;
    int rc = dev_stream_new(gpu, &n->gstream);
    if (rc == 0) rc = dev_stream_new(gpu, &n->wstream);
    if (rc == 0) rc = nccl_mark_new(&n->rmark);
    if (rc == 0) rc = nccl_mark_new(&n->wmark);
    if (rc == 0) rc = bus_timer_start(srv, ONS_POLL_MS, ONS_POLL_MS, on_timer, n, &n->timer);
    if (rc < 0) { log_rc(rc, "step communicator"); ons_destroy(&n); return rc; }
    log_warn("test hook nccl_cross=1: gradients and weights of GPU drafters on other nodes by NCCL");
    *out = n;
    return 0;
}

void ons_destroy(ons_t **np) {
    ons_t *n = np ? *np : NULL;
    if (!n) return;
    *np = NULL;
    bus_timer_stop(&n->timer);
    nccl_pair_abort(&n->wc);
    nccl_pair_abort(&n->gc);
    if (n->landing) n->ops->impl->free_(n->ops, n->landing);
    if (n->scratch) n->ops->impl->free_(n->ops, n->scratch);
    nccl_mark_destroy(n->rmark);
    nccl_mark_destroy(n->wmark);
    dev_stream_destroy(n->gstream);
    dev_stream_destroy(n->wstream);
    free(n->kpending);
    free(n);
}

/* One receive from rank r into dst, then the receives' mark. */
static int recv_one(ons_t *n, int r, void *dst, uint64_t bytes) {
    int rc = settle(n->gc, nccl_pair_recv(n->gc, dst, bytes, r, n->gstream));
    if (rc == 0) rc = nccl_mark_record(n->rmark, n->gstream);
    if (rc < 0) {
        log_error("step communicator: receive from rank %d: %s", r, dl_errmsg());
        gen_abort(n, "a receive failed");
        n->set.n = -1;
        return rc;
    }
    if (!n->rpending) n->rsince = clock_mono_s();
    n->rpending = 1;
    return 0;
}

int ons_take(ons_t *n, int pi, uint64_t k, uint64_t offset, uint64_t bytes, void **base) {
    if (!n || pi < 0 || !stage_remote(n->st, n->peers->p[pi].stage_id)) return 0;
    const char *who = n->peers->p[pi].id;
    int r = rank_of(n, pi);
    if (r < 0 || n->state != ONS_READY || !n->echoed[r - 1])
        return log_warn("%s: gradients_ready before its rank of the step communicator is ready: dropped", who),
               DL_ESTATE;
    if (k >= n->K || offset + bytes > n->slab_bytes || n->kpending[k])
        return log_warn("%s: gradients of slot %llu at %llu (+%llu bytes) outside the landing buffer: dropped", who,
                        (unsigned long long)k, (unsigned long long)offset, (unsigned long long)bytes), DL_ERANGE;
    n->taken = 1;   /* even if it fails: the generation is gone then, nothing to drain */
    DL_TRY(recv_one(n, r, n->landing + offset, bytes));
    n->kpending[k] = 1;
    *base = n->landing;
    return 0;
}

void ons_drain(ons_t *n, int pi, uint64_t bytes) {
    if (!n) return;
    int taken = n->taken;
    n->taken = 0;
    int r = rank_of(n, pi);
    if (taken || r < 0 || n->state != ONS_READY || !n->echoed[r - 1]) return;
    if (bytes > n->P * sizeof(float)) {
        log_error("%s: gradients_ready of %llu bytes (%zu expected): out of step", n->peers->p[pi].id,
                  (unsigned long long)bytes, n->P * sizeof(float));
        gen_abort(n, "a member out of step");
        n->set.n = -1;
        return;
    }
    (void)recv_one(n, r, n->scratch, bytes);   /* its send is matched; the bytes are not used */
}

void ons_echo(ons_t *n, int pi, const char *who, const proto_nccl_id_t *x) {
    if (!n) {
        log_warn("unexpected nccl_id from %s (no step communicator without the hook nccl_cross=1)", who);
        return;
    }
    int r = rank_of(n, pi);
    if (r < 0 || x->rank != (uint32_t)r || memcmp(x->id, n->id, NCCL_PAIR_ID_BYTES) != 0) {
        log_warn("nccl_id echo from %s for another generation: ignored", who);
        return;
    }
    n->echoed[r - 1] = 1;
    log_info("%s: rank %d of step communicator generation %llu ready", who, r, (unsigned long long)n->gen);
}

int ons_weights(ons_t *n, const void *src, size_t bytes, uint64_t version) {
    if (n->state != ONS_READY) return DL_EAGAIN;
    if (n->bcast_version == (int64_t)version) return 0;
    /* the source was written and synced on the compute stream before (apply_step) */
    int rc = settle(n->wc, nccl_pair_bcast(n->wc, (void *)src, bytes, 0, n->wstream));
    if (rc == 0) rc = nccl_mark_record(n->wmark, n->wstream);
    if (rc < 0) {
        log_error("step communicator: broadcast of weights %llu: %s", (unsigned long long)version, dl_errmsg());
        gen_abort(n, "a broadcast failed");
        n->set.n = -1;
        return rc;
    }
    n->bcast_version = (int64_t)version;
    if (!n->wpending) n->wsince = clock_mono_s();
    n->wpending = 1;
    return 0;
}
