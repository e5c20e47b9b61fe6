/* drafter_worker: this drafter's rank of the optimizer's step communicator (nccl_step.h;
 * docs/MULTINODE.md sections 4-5; the optimizer's side: optimizer/nccl_step.c).
 *
 * A generation: the optimizer's `nccl_id` (rank r of n), the gradient communicator
 * joined from it and its split, the weights communicator. Once both are ready this
 * drafter echoes the id to the optimizer, which from then on (control-plane order)
 * receives each of its gradients_ready's bytes on this generation. A newer id aborts
 * the old communicators (a send or broadcast pending on them ends, their bytes lost)
 * and forgets the loaded weights: the version is -1 until the new generation's first
 * broadcast, so nothing computed with weights of the old one is ever announced.
 * Gradients: ncclSend of the slot on the compute stream (after the backward that wrote
 * it), then gradients_ready; a later micro-batch that rewrites the slot follows the send
 * in stream order. Weights: ncclBroadcast into the device mirror of the optimizer's
 * weights slab on the compute stream at weights_version, then the ordinary load (a device
 * copy on the same stream). */
#include "drafter_worker/nccl_step.h"

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/mem/nccl.h"

#include <stdlib.h>
#include <string.h>

enum { NS_NONE, NS_INIT, NS_SPLIT, NS_READY };

struct dw_nstep {
    uint64_t owner_inc;          /* the optimizer incarnation of the newest id taken (0 none) */
    proto_nccl_id_t id;          /* that id (echoed when ready) */
    nccl_pair_t *gc, *wc;        /* gradients (from the id), weights (its split) */
    int state;
    double since;
    int64_t bcast_version;       /* received in this generation, -1 none */
    uint8_t *mirror;             /* device, mirror_bytes: the optimizer's weights slab */
    uint64_t mirror_bytes;
    bus_timer_t *timer;
};

static void ns_abort(dw_t *W, const char *why) {
    struct dw_nstep *n = W->nstep;
    if (n->gc || n->wc) log_warn("step communicator (rank %u of %u) aborted: %s", n->id.rank, n->id.nranks, why);
    nccl_pair_abort(&n->wc);
    nccl_pair_abort(&n->gc);
    n->state = NS_NONE;
    n->bcast_version = -1;
}

/* Polled until 0 (bounded) when NCCL is still enqueuing; a failure aborts here. */
static int settle(dw_t *W, nccl_pair_t *p, int rc, const char *what) {
    if (rc == DL_EAGAIN) rc = nccl_pair_wait(p, DW_NSTEP_ENQ_WAIT_MS);
    if (rc < 0) {
        log_error("step communicator: %s: %s", what, dl_errmsg());
        ns_abort(W, what);
    }
    return rc;
}

static void echo(dw_t *W) {
    proto_msg_t m;
    proto_msg_init(&m, PROTO_NCCL_ID);
    m.nccl_id = W->nstep->id;
    stage_send(W->opt, NULL, &m);
}

static void on_timer(bus_t *bus, void *arg) {
    (void)bus;
    dw_t *W = arg;
    struct dw_nstep *n = W->nstep;
    if (n->state == NS_NONE || n->state == NS_READY) return;
    int rc = nccl_pair_poll(n->gc);
    if (rc == 0 && n->state == NS_INIT) {
        rc = nccl_pair_split(n->gc, &n->wc);
        if (rc == 0) n->state = NS_SPLIT;
        if (rc == 0) return;
    } else if (rc == 0) {
        rc = nccl_pair_poll(n->wc);
        if (rc == 0) {
            n->state = NS_READY;
            log_info("step communicator: rank %u of %u ready (%s), echoed", n->id.rank, n->id.nranks,
                     nccl_pair_name(n->gc));
            echo(W);
            return;
        }
    }
    if (rc == DL_EAGAIN && clock_mono_s() - n->since > DW_NSTEP_READY_MS / 1e3)
        rc = dl_seterr(DL_ETIMEDOUT, "not ready after %d ms", DW_NSTEP_READY_MS);
    if (rc < 0 && rc != DL_EAGAIN) {
        /* the optimizer's own timeout makes a new generation; its id comes then */
        log_error("step communicator: %s", dl_errmsg());
        ns_abort(W, "set-up failed");
    }
}

int dw__nstep_init(dw_t *W) {
    W->nstep = NULL;
    if (!W->nccl_cross || W->gpu < 0 || !stage_remote(&W->st, PIPE_ID_OPTIMIZER)) return 0;
    struct dw_nstep *n = calloc(1, sizeof *n);
    if (!n) return log_rc(dl_seterr(DL_ENOMEM, "out of memory"), "step communicator");
    n->bcast_version = -1;
    int rc = bus_timer_start(W->srv, DW_NSTEP_POLL_MS, DW_NSTEP_POLL_MS, on_timer, W, &n->timer);
    if (rc < 0) { free(n); return log_rc(rc, "step communicator timer"); }
    W->nstep = n;
    log_warn("test hook nccl_cross=1: gradients and weights with the optimizer on another node by NCCL");
    return 0;
}

int dw__nstep_export(dw_t *W) {
    struct dw_nstep *n = W->nstep;
    if (n->mirror_bytes == W->wslab.bytes) return 0;
    if (n->mirror) W->ops.impl->free_(&W->ops, n->mirror);
    n->mirror = W->ops.impl->malloc_(&W->ops, W->wslab.bytes);
    n->mirror_bytes = n->mirror ? W->wslab.bytes : 0;
    W->wmirror = n->mirror;   /* dw__weights_base reads it (optimizer on another node) */
    W->wmirror_bytes = n->mirror_bytes;
    n->bcast_version = -1;    /* a new weights slab (a new optimizer): nothing of it here yet */
    if (!n->mirror)
        return log_rc(dl_seterr(DL_ENOMEM, "GPU %d: no memory for the mirror of the optimizer's weights (%llu bytes)",
                                W->gpu, (unsigned long long)W->wslab.bytes), "step communicator");
    return 0;
}

void dw__nstep_on_id(dw_t *W, const proto_nccl_id_t *x) {
    struct dw_nstep *n = W->nstep;
    if (!n) {
        log_warn("nccl_id from the optimizer: this drafter does not use NCCL with it: ignored");
        return;
    }
    int fresh = x->owner_id == PIPE_ID_OPTIMIZER
                    ? nccl_step_id_fresh(W->st.stage_id, W->st.incarnation, n->owner_inc, x->peer_id, x->peer_inc,
                                         x->owner_inc, x->nranks, x->rank)
                    : 0;
    if (fresh <= 0) {
        log_warn("nccl_id from stage %u (incarnation %llu) for stage %u (incarnation %llu), rank %u of %u: %s, "
                 "ignored", x->owner_id, (unsigned long long)x->owner_inc, x->peer_id,
                 (unsigned long long)x->peer_inc, x->rank, x->nranks, fresh < 0 ? "malformed" : "stale");
        return;
    }
    ns_abort(W, "a newer generation");
    /* weights of the old generation may be torn: none loaded until the new one's */
    W->version = -1;
    W->pending_version = -1;
    n->owner_inc = x->owner_inc;
    n->id = *x;
    n->since = clock_mono_s();
    int rc = nccl_pair_init(&n->gc, x->id, (int)x->nranks, (int)x->rank, W->gpu);
    if (rc < 0) { log_error("step communicator: %s", dl_errmsg()); return; }
    n->state = NS_INIT;
    log_info("step communicator: joining as rank %u of %u (%s)", x->rank, x->nranks, nccl_pair_name(n->gc));
}

int dw__nstep_weights(dw_t *W, const proto_weights_version_t *v) {
    struct dw_nstep *n = W->nstep;
    if (!n) return 0;
    /* the optimizer broadcasts only once its split is done, so ours is at most a poll away */
    if (n->state == NS_SPLIT && nccl_pair_wait(n->wc, DW_NSTEP_ENQ_WAIT_MS) == 0) on_timer(W->srv, W);
    if (n->state != NS_READY || !n->mirror) {
        log_warn("weights_version %llu before this drafter's rank of the step communicator is ready: ignored",
                 (unsigned long long)v->version);
        return -1;
    }
    if ((int64_t)v->version == n->bcast_version) return 1;
    if ((int64_t)v->version < n->bcast_version || v->offset + v->bytes > n->mirror_bytes) {
        log_warn("weights_version %llu after %lld (or out of the mirror): ignored", (unsigned long long)v->version,
                 (long long)n->bcast_version);
        return -1;
    }
    int rc = settle(W, n->wc, nccl_pair_bcast(n->wc, n->mirror + v->offset, v->bytes, 0, W->ops.stream),
                    "weights broadcast");
    if (rc < 0) return -1;
    n->bcast_version = (int64_t)v->version;
    return 1;
}

int dw__nstep_send(dw_t *W, const proto_msg_t *m) {
    struct dw_nstep *n = W->nstep;
    if (!n) return 0;
    const proto_gradients_ready_t *g = &m->gradients_ready;
    if (n->state != NS_READY || W->version < 0 || (int64_t)g->weights_version != W->version) {
        log_warn("micro-batch %llu: computed with weights of an aborted step communicator: not sent",
                 (unsigned long long)g->mbs[0]);
        return 1;   /* the loader re-issues it */
    }
    const uint8_t *slot = (const uint8_t *)slab_ptr(W->grad) + g->offset;
    int rc = settle(W, n->gc, nccl_pair_send(n->gc, slot, g->bytes, 0, W->ops.stream), "gradient send");
    /* announced even when the send failed: the optimizer's receive then times out
     * (ONS_OP_TIMEOUT_MS) and it makes a new generation */
    (void)rc;
    stage_send(W->opt, NULL, m);
    return 1;
}

int dw__nstep_refuse(dw_t *W, const proto_slab_data_t *d) {
    if (!W->nstep) return 0;
    xfer_refuse(&W->rx, W->st.name, "optimizer", d, "weights come by NCCL (test hook nccl_cross=1)");
    return 1;
}

void dw__nstep_fini(dw_t *W) {
    struct dw_nstep *n = W->nstep;
    if (!n) return;
    bus_timer_stop(&n->timer);
    nccl_pair_abort(&n->wc);
    nccl_pair_abort(&n->gc);
    if (n->mirror) W->ops.impl->free_(&W->ops, n->mirror);
    W->wmirror = NULL;
    W->wmirror_bytes = 0;
    free(n);
    W->nstep = NULL;
}
