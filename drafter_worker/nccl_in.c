/* drafter_worker: hidden states from GPU targets on other nodes by NCCL (docs/MULTINODE.md
 * section 4, common/mem/nccl.h). Off unless the test hook nccl_cross=1 is set (read once
 * at start-up): without it such a target is refused as before (target_worker and the
 * head refuse the placement). Issue 17 switches it on with two GPUs.
 *
 * One pair per remote GPU target incarnation: at its hello this drafter makes an id,
 * sends `nccl_id` and inits rank 0; the target inits rank 1. Grants to that target are
 * held until the pair is ready (polled from a bus timer, never blocking the loop). On
 * hidden_states_ready the features' bytes are received (ncclRecv, on the compute stream,
 * issued here on the loop thread in arrival order = the target's send order) into the
 * granted slot before the item can be computed, so the forward that reads them follows
 * them in stream order. A dead or restarted target: its pair only is aborted.
 * Every NCCL call on these pairs is made on the loop thread. */
#include "drafter_worker/dw_int.h"

#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/testhook.h"
#include "common/mem/nccl.h"
#include "common/pipe/slot.h"

#include <string.h>

#define DW_NCCL_POLL_MS 10
#define DW_NCCL_FIRST_MS 10000   /* first transfer: the pair connects its channel */

static int cross_gpu_target(const dw_t *W, int pi) {
    return W->nccl_cross && W->gpu >= 0 && W->peers.p[pi].stage_id &&
           stage_remote(&W->st, W->peers.p[pi].stage_id);
}

static void on_nccl_timer(bus_t *bus, void *arg) {
    (void)bus;
    dw_t *W = arg;
    int kick = 0;
    for (int i = 0; i < W->peers.n; i++) {
        if (!W->npair[i] || W->npair_ready[i]) continue;
        int rc = nccl_pair_poll(W->npair[i]);
        if (rc == DL_EAGAIN) continue;
        if (rc < 0) {
            log_error("target %s: %s", W->peers.p[i].id, dl_errmsg());
            nccl_pair_abort(&W->npair[i]);   /* a new id at its next incarnation's hello */
            continue;
        }
        W->npair_ready[i] = 1;
        log_info("target %s: %s ready", W->peers.p[i].id, nccl_pair_name(W->npair[i]));
        kick = 1;
    }
    if (kick) dw__grant_kick(W);
}

int dw__nccl_init(dw_t *W) {
    int64_t v = 0;
    W->nccl_cross = testhook_i64("nccl_cross", &v) && v == 1;
    if (!W->nccl_cross || W->gpu < 0) return 0;
    if (!nccl_available()) {
        log_error("test hook nccl_cross=1 in a build without NCCL");
        return DL_ENOTSUP;
    }
    log_warn("test hook nccl_cross=1: hidden states from GPU targets on other nodes by NCCL");
    return bus_timer_start(W->srv, DW_NCCL_POLL_MS, DW_NCCL_POLL_MS, on_nccl_timer, W, &W->nccl_timer);
}

void dw__nccl_hello(dw_t *W, int pi) {
    if (!cross_gpu_target(W, pi)) return;
    nccl_pair_abort(&W->npair[pi]);   /* an earlier incarnation's pair, if any */
    W->npair_ready[pi] = 0;
    const peer_info_t *p = &W->peers.p[pi];
    proto_msg_t m;
    proto_msg_init(&m, PROTO_NCCL_ID);
    proto_nccl_id_t *x = &m.nccl_id;
    int rc = nccl_id_new(x->id);
    if (rc == 0) rc = nccl_pair_init(&W->npair[pi], x->id, 2, 0, W->gpu);
    if (rc < 0) {
        log_error("target %s: NCCL pair: %s", p->id, dl_errmsg());
        return;   /* no pair: no grants to it (dw__nccl_may_grant) */
    }
    x->owner_id = W->st.stage_id; x->owner_inc = W->st.incarnation;
    x->peer_id = p->stage_id; x->peer_inc = p->incarnation;
    x->nranks = 2; x->rank = 1; x->id_len = DL_PROTO_NCCL_ID_BYTES;
    if (stage_send(W->srv, p->id, &m) < 0) nccl_pair_abort(&W->npair[pi]);
    else log_info("target %s: %s started, id sent", p->id, nccl_pair_name(W->npair[pi]));
}

int dw__nccl_may_grant(const dw_t *W, int pi) {
    return !cross_gpu_target(W, pi) || (W->npair[pi] && W->npair_ready[pi]);
}

void dw__nccl_dead(dw_t *W, int pi) {
    if (!W->npair[pi]) return;
    log_warn("target %s: %s aborted", W->peers.p[pi].id, nccl_pair_name(W->npair[pi]));
    nccl_pair_abort(&W->npair[pi]);
    W->npair_ready[pi] = 0;
}

int dw__nccl_take(dw_t *W, int pi, uint32_t slot, uint64_t bytes) {
    if (!cross_gpu_target(W, pi)) return 0;
    const char *who = W->peers.p[pi].id;
    if (!W->npair[pi] || !W->npair_ready[pi]) {
        log_warn("target %s: hidden_states_ready without a ready NCCL pair: dropped", who);
        return -1;
    }
    inbox_slot_t s;
    int rc = inbox_get(W->ib, slot, &s);
    if (rc == 0 && (s.tier != INBOX_GPU || bytes > s.bytes))
        rc = dl_seterr(DL_ENOTSUP, "slot %u: %llu bytes into a %s slot of %llu bytes (NCCL needs the GPU tier)",
                       slot, (unsigned long long)bytes, s.tier == INBOX_GPU ? "GPU" : "host",
                       (unsigned long long)s.bytes);
    void *dst = rc == 0 ? (uint8_t *)slab_ptr(W->tier[s.tier]) + s.offset : NULL;
    if (rc == 0) rc = nccl_pair_recv(W->npair[pi], dst, bytes, 1, W->ops.stream);
    if (rc == DL_EAGAIN) rc = nccl_pair_wait(W->npair[pi], DW_NCCL_FIRST_MS);   /* first use: connects */
    if (rc < 0) {
        /* the pair is out of step with the target's sends: drop it; the target's next
         * hello (it restarts or re-says hello) makes a new one */
        log_error("target %s: %s", who, dl_errmsg());
        dw__nccl_dead(W, pi);
        return -1;
    }
    return 1;
}

void dw__nccl_fini(dw_t *W) {
    bus_timer_stop(&W->nccl_timer);
    for (int i = 0; i < PEERS_MAX; i++) nccl_pair_abort(&W->npair[i]);
}
