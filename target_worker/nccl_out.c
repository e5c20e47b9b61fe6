/* target_worker: the rank-1 side of an NCCL pair with a GPU drafter on another node
 * (see nccl_out.h, common/mem/nccl.h). Thread rule: init / poll / abort on the loop
 * thread, send on the compute (libuv pool) thread, never both at once: the loop polls
 * only a pair that is not ready, a forward sends only on a ready one, and a pair dropped
 * mid-forward is aborted after it (tw_nccl_after_work). */
#include "target_worker/nccl_out.h"

#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/testhook.h"
#include "common/mem/nccl.h"

#define TW_NCCL_POLL_MS 10
#define TW_NCCL_SEND_WAIT_MS 30000   /* the first send connects the pair's channel */

static void on_timer(uv_timer_t *t) {
    tw_nccl_t *n = t->data;
    if (!n->pair || n->ready || n->abort_pending) return;
    int rc = nccl_pair_poll(n->pair);
    if (rc == DL_EAGAIN) return;
    if (rc < 0) {
        log_error("%s", dl_errmsg());
        nccl_pair_abort(&n->pair);   /* the drafter makes a new id at our next hello */
        return;
    }
    n->ready = 1;
    log_info("%s ready (drafter %u)", nccl_pair_name(n->pair), n->owner_id);
    if (n->on_ready) n->on_ready(n->arg);
}

int tw_nccl_init(tw_nccl_t *n, int gpu, uv_loop_t *loop, void (*on_ready)(void *arg), void *arg) {
    int64_t v = 0;
    n->on = gpu >= 0 && testhook_i64("nccl_cross", &v) && v == 1;
    n->gpu = gpu;
    n->on_ready = on_ready;
    n->arg = arg;
    if (!n->on) return 0;
    if (!nccl_available()) return dl_seterr(DL_ENOTSUP, "test hook nccl_cross=1 in a build without NCCL");
    log_warn("test hook nccl_cross=1: hidden states to GPU drafters on other nodes by NCCL");
    uv_timer_init(loop, &n->timer);
    n->timer.data = n;
    uv_timer_start(&n->timer, on_timer, TW_NCCL_POLL_MS, TW_NCCL_POLL_MS);
    uv_unref((uv_handle_t *)&n->timer);   /* never what keeps the loop from ending at a stop */
    n->timer_on = 1;
    return 0;
}

void tw_nccl_on_id(tw_nccl_t *n, const proto_nccl_id_t *x, uint32_t me, uint64_t my_inc, uint32_t want,
                   uint64_t drafter_inc, int busy) {
    if (!n->on) {
        log_warn("nccl_id from stage %u: this target does not use NCCL: ignored", x->owner_id);
        return;
    }
    if (x->peer_id != me || x->peer_inc != my_inc || x->owner_id != want ||
        (drafter_inc && x->owner_inc != drafter_inc)) {
        log_warn("nccl_id from stage %u (incarnation %llu) for stage %u (incarnation %llu): stale, ignored",
                 x->owner_id, (unsigned long long)x->owner_inc, x->peer_id, (unsigned long long)x->peer_inc);
        return;
    }
    tw_nccl_drop(n, busy);
    if (n->abort_pending) {
        /* the old pair is still the forward's: this id waits for the drafter's next
         * hello answer (it sends a new id at every hello of ours) */
        log_warn("nccl_id while a forward uses the previous pair: ignored");
        return;
    }
    int rc = nccl_pair_init(&n->pair, x->id, (int)x->nranks, (int)x->rank, n->gpu);
    if (rc < 0) { log_error("nccl_id from drafter %u: %s", x->owner_id, dl_errmsg()); return; }
    n->owner_id = x->owner_id;
    n->owner_inc = x->owner_inc;
    log_info("%s joining drafter %u (incarnation %llu)", nccl_pair_name(n->pair), x->owner_id,
             (unsigned long long)x->owner_inc);
}

int tw_nccl_ready(const tw_nccl_t *n) { return n->pair && n->ready && !n->abort_pending; }

int tw_nccl_send(tw_nccl_t *n, const void *buf, size_t bytes, void *stream) {
    int rc = nccl_pair_send(n->pair, buf, bytes, 0, stream);
    if (rc == DL_EAGAIN) rc = nccl_pair_wait(n->pair, TW_NCCL_SEND_WAIT_MS);
    if (rc < 0) n->abort_pending = 1;   /* out of step with the drafter: dropped after the forward */
    return rc;
}

void tw_nccl_drop(tw_nccl_t *n, int busy) {
    if (!n->pair) return;
    n->ready = 0;
    if (busy) { n->abort_pending = 1; return; }
    log_warn("%s aborted (drafter %u)", nccl_pair_name(n->pair), n->owner_id);
    nccl_pair_abort(&n->pair);
    n->abort_pending = 0;
}

void tw_nccl_after_work(tw_nccl_t *n) {
    if (n->abort_pending) tw_nccl_drop(n, 0);
}

void tw_nccl_fini(tw_nccl_t *n) {
    nccl_pair_abort(&n->pair);
    if (n->timer_on) uv_close((uv_handle_t *)&n->timer, NULL);
    n->timer_on = 0;
}
