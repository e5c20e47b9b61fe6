/* drafter_worker: the data plane across nodes (docs/MULTINODE.md section 4).
 *
 * A target on another node never maps the inbox: its features arrive as slab_data
 * into the slot granted to it, before its hidden_states_ready on the same connection;
 * a chunk is taken only inside a slot granted to that very target and not yet
 * announced, in an inbox slab of this incarnation, and the announcement is taken only
 * when every feature byte arrived. An optimizer on another node never maps the
 * gradient slab nor is its weights slab mapped here: each gradient slot goes to it as
 * slab_data before gradients_ready, and its weights come into a local mirror of its
 * weights slab (host memory, the size of its slab_export) before weights_version.
 */
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/pipe/slot.h"
#include "drafter_worker/dw_int.h"

#include <stdlib.h>

static void on_opt_writable(bus_t *bus, void *arg) {
    (void)bus;
    xfer_resume(((dw_t *)arg)->oxf);
}

int dw__xfer_init(dw_t *W) {
    W->opt_remote = stage_remote(&W->st, PIPE_ID_OPTIMIZER);
    if (!W->opt_remote) return 0;
    const run_config_t *c = W->st.cfg;
    int me = c->node, on = runcfg_stage_node(c, PIPE_ID_OPTIMIZER);
    if (W->gpu >= 0 && W->nstep) return 0;   /* by NCCL (nccl_step.c; test hook nccl_cross=1) */
    if (W->gpu >= 0) {
        log_error("drafter on GPU %d of node %d (%s), its optimizer on node %d (%s): GPU stages on different "
                  "nodes need NCCL, which is not built yet (place the optimizer on this node)",
                  W->gpu, me, c->node_addr[me], on, c->node_addr[on]);
        exit(1);
    }
    W->oxf = xfer_new(W->opt, &W->st.xfer_bytes_out);
    if (!W->oxf) return log_rc(DL_ENOMEM, "cross-node sender");
    bus_on_writable(W->opt, on_opt_writable, W);
    log_info("the optimizer is on node %d (%s), this drafter on node %d: gradients and weights move as slab_data",
             on, c->node_addr[on], me);
    return 0;
}

void dw__on_target_data(dw_t *W, int pi, const char *peer, const proto_slab_data_t *d) {
    if (pi < 0) {
        xfer_refuse(&W->rx, W->st.name, peer, d, "from a target that has not said hello");
        return;
    }
    for (uint32_t s = 0; s < DW_MAX_SLOTS; s++) {
        if (W->slot_owner[s] != (uint32_t)pi + 1) continue;
        inbox_slot_t sl;
        if (inbox_get(W->ib, s, &sl) < 0) continue;
        uint32_t wire = slot_slab_id(W->st.incarnation, sl.tier == INBOX_GPU ? SLOT_SLAB_GPU : SLOT_SLAB_HOST);
        if (d->slab_id != wire || d->offset < sl.offset || d->offset >= sl.offset + sl.bytes) continue;
        const slab_t *tier = W->tier[sl.tier];
        if (slab_handle(tier)->kind != SLAB_HOST) {
            xfer_refuse(&W->rx, W->st.name, peer, d, "into GPU memory (across nodes that needs NCCL: not built)");
            return;
        }
        xfer_dest_t dst = {W->st.stage_id, W->st.incarnation, wire, slab_ptr(tier), slab_bytes(tier),
                           sl.offset, sl.bytes};
        if (xfer_recv(&W->rx, W->st.name, peer, d, &dst) == 0) {
            W->slot_rx[s] += d->n_data;
            W->st.xfer_bytes_in = W->rx.bytes_in;
            stage_xfer_moved(&W->st);
        }
        return;
    }
    xfer_refuse(&W->rx, W->st.name, peer, d, "not inside a slot granted to it and not yet announced");
}

int dw__slot_complete(dw_t *W, int pi, uint32_t slot, uint64_t feat_bytes) {
    const peer_info_t *p = &W->peers.p[pi];
    if (!stage_remote(&W->st, p->stage_id) || W->slot_rx[slot] == feat_bytes) return 1;
    log_warn("%s: slot %u announced with %llu of its %llu feature bytes received as slab_data: dropped", p->id,
             slot, (unsigned long long)W->slot_rx[slot], (unsigned long long)feat_bytes);
    return 0;
}

int dw__weights_export(dw_t *W) {
    if (!W->opt_remote) return 0;
    if (W->wslab.bytes != W->wmirror_bytes) {
        free(W->wmirror);
        W->wmirror = calloc(1, W->wslab.bytes);
        W->wmirror_bytes = W->wmirror ? W->wslab.bytes : 0;
        if (!W->wmirror) {
            log_error("out of memory for the mirror of the optimizer's weights (%llu bytes)",
                      (unsigned long long)W->wslab.bytes);
            return DL_ENOMEM;
        }
    }
    return 0;
}

void dw__on_opt_data(dw_t *W, const proto_slab_data_t *d) {
    if (!W->opt_remote) {
        xfer_refuse(&W->rx, W->st.name, "optimizer", d, "the optimizer is on this node (its slab is mapped)");
        return;
    }
    xfer_dest_t dst = {PIPE_ID_OPTIMIZER, W->wslab.incarnation, W->wslab.slab_id,
                       W->have_wslab ? W->wmirror : NULL, W->wmirror_bytes, 0, 0};
    if (xfer_recv(&W->rx, W->st.name, "optimizer", d, &dst) == 0) {
        W->st.xfer_bytes_in = W->rx.bytes_in;
        stage_xfer_moved(&W->st);
    }
}

const uint8_t *dw__weights_base(dw_t *W) {
    if (W->opt_remote) {
        if (!W->wmirror) log_error("weights_version before the optimizer's weights slab was announced");
        return W->wmirror;
    }
    void *base;
    int rc = hcache_get(W->hc, &W->wslab, &base);
    if (rc < 0) { log_rc(rc, "map the optimizer's weights"); return NULL; }
    return base;
}

/* The slot's bytes are with the bus (or dropped): the next micro-batch may run (not
 * from inside dw__send_grads: after_work_cb goes on with the item and then tries). */
static void on_grads_sent(xfer_t *x, int status, void *arg) {
    dw_t *W = arg;
    (void)x; (void)status;
    if (!W->in_send) dw__try_compute(W);
}

void dw__send_grads(dw_t *W, const proto_msg_t *m) {
    if (!W->opt_remote) {
        stage_send(W->opt, NULL, m);
        return;
    }
    /* the source is the gradient slot itself: try_compute starts no micro-batch (which
     * would rewrite a slot) while dw__grads_pending */
    const proto_gradients_ready_t *g = &m->gradients_ready;
    xfer_range_t r = {W->st.stage_id, W->st.incarnation, g->slab_id, g->offset};
    W->in_send = 1;
    int rc = xfer_send(W->oxf, NULL, &r, (const uint8_t *)slab_ptr(W->grad) + g->offset, g->bytes, m,
                       on_grads_sent, W);
    W->in_send = 0;
    if (rc < 0) log_rc(rc, "send the gradients to the optimizer");
    stage_xfer_moved(&W->st);
}

size_t dw__grads_pending(const dw_t *W) { return xfer_pending(W->oxf); }
