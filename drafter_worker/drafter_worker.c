/* drafter_worker: pipeline stage 3. Owns a byte-bounded inbox (GPU tier of
 * --inbox-gb on its own GPU; on CPU runs a shared-memory slab standing in for it,
 * plus the host tier of --host-inbox-gb), grants inbox slots to the targets routed
 * to it (credit: one outstanding grant per target, each sized for a full
 * micro-batch), computes the DFlash drafter's forward and backward on each
 * micro-batch with the weights of the step it belongs to, writes that
 * micro-batch's gradient (f32) straight into its shared gradient slab (one slot
 * per micro-batch index within the step: the backward accumulates there) and sends gradients_ready to the optimizer,
 * then releases the inbox slot.
 *
 * Synchronous math: a micro-batch of step s is computed only with weights version
 * s (after s optimizer steps); items of the next step wait in the inbox. New
 * weights are copied from the optimizer's weights slab when weights_version
 * arrives (never while a micro-batch is being computed). --hs-min-ready K keeps a
 * pool of K ready items of the current step and picks among them with a seeded
 * draw (sequence-length mixing); the optimizer sums per-micro-batch gradients in mb
 * order, so the pick order does not change the result.
 * A GPU-tier handle whose GPU UUID is not this drafter's is refused loudly
 * (slab_check_gpu): the drafter never computes on another GPU's memory.
 *
 * GPU mode (--gpu N, CUDA builds): the GPU tier is one cudaMalloc on GPU N
 * exported once with cudaIpcGetMemHandle, the host tier a page-locked
 * shared-memory slab; features are bf16. Each hidden_states_ready carries the
 * producer's interprocess event: the drafter opens it once per (target,
 * incarnation, handle) and caches it (event_opens), makes its streams wait on it
 * (cudaStreamWaitEvent, no host or device-wide wait) and reads the features in
 * place on its own GPU. Token ids, sequence lengths and the loss mask come inline
 * in hidden_states_ready (host memory, on CPU and GPU runs alike). A host-tier item's features are
 * copied to a device staging buffer first. The gradient slab is device memory on
 * this GPU exported by CUDA IPC (the backward writes into it, no copy; the
 * optimizer, on this or another GPU, reads it in place), and new weights come from
 * the optimizer's device weights slab by one device (or peer) copy. Only the
 * target's embedding and LM head are loaded (target_opts_t.embed_only).
 */
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/rng.h"
#include "common/base/testhook.h"
#include "common/mem/dev.h"
#include "common/mem/hcache.h"
#include "common/mem/inbox.h"
#include "common/mem/slab.h"
#include "common/model/drafter.h"
#include "common/model/target.h"
#include "common/ops/ops.h"
#include "common/pipe/layout.h"
#include "common/pipe/model.h"
#include "common/pipe/runcfg.h"
#include "common/pipe/peers.h"
#include "common/pipe/slot.h"
#include "common/pipe/stage.h"
#include "drafter_worker/dw_int.h"
#include "drafter_worker/nccl_step.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void try_compute(dw_t *W);
void dw__try_compute(dw_t *W) { try_compute(W); }
static void grant_all(dw_t *W);
void dw__grant_kick(dw_t *W) { grant_all(W); }

/* Inbox slab ids on the wire carry this incarnation (common/pipe/slot.h): a
 * hidden_states_ready for a grant of an earlier incarnation (queued in a target's pipe
 * across our restart, or written by a target that had not heard of it yet) names an
 * old id and is refused, even when this incarnation granted the same slot id to the
 * same target. */
static uint32_t wire_slab_id(const dw_t *W, uint32_t index) {
    return slot_slab_id(W->st.incarnation, index);
}

static void export_slab(dw_t *W, bus_t *bus, const char *peer, const slab_t *s) {
    const slab_handle_t *h = slab_handle(s);
    proto_msg_t m;
    stage_slab_export_msg(h, h->slab_id == SLOT_SLAB_GRAD ? h->slab_id : wire_slab_id(W, h->slab_id), &m);
    stage_send(bus, peer, &m);
}

/* Reclaims the unused grants of peer i (its target died or restarted). */
static void reclaim(dw_t *W, int i) {
    for (uint32_t s = 0; s < DW_MAX_SLOTS; s++)
        if (W->slot_owner[s] == (uint32_t)i + 1) {
            inbox_free(W->ib, s);
            W->slot_owner[s] = 0;
        }
    W->tp[i].granted = 0;
}

/* One outstanding grant per target, round robin; a target that just handed a
 * grant back unused (it had no work) is passed over for a while so the room goes
 * to one that has work (the grant timer retries). */
static void grant_all(dw_t *W) {
    if (W->st.stopping || W->peers.n == 0) return;
    double now = clock_mono_s();
    for (int n = 0; n < W->peers.n; n++) {
        int i = (W->rr + n) % W->peers.n;
        const peer_info_t *pi = &W->peers.p[i];
        tpeer_t *p = &W->tp[i];
        if (!pi->alive || p->granted > 0 || now - p->declined_at < 0.3 || !dw__nccl_may_grant(W, i)) continue;
        W->rr = (i + 1) % W->peers.n;
        inbox_slot_t s;
        int rc = inbox_alloc(W->ib, W->slot_bytes, 1, &s);
        if (rc == DL_EAGAIN) return;     /* back-pressure: the target waits for credit */
        if (rc < 0) { log_rc(rc, "inbox"); return; }
        W->slot_owner[s.id] = (uint32_t)i + 1;
        W->slot_rx[s.id] = 0;
        p->granted++;
        proto_msg_t m;
        proto_msg_init(&m, PROTO_SLOT_GRANT);
        m.slot_grant.drafter_id = W->st.stage_id;
        m.slot_grant.target_id = pi->stage_id;
        m.slot_grant.slot_id = s.id;
        /* CPU run: both tiers are shared host memory */
        m.slot_grant.tier = W->gpu >= 0 && s.tier == INBOX_GPU ? PROTO_TIER_GPU : PROTO_TIER_HOST;
        m.slot_grant.slab_id = wire_slab_id(W, s.tier == INBOX_GPU ? SLOT_SLAB_GPU : SLOT_SLAB_HOST);
        m.slot_grant.offset = s.offset;
        m.slot_grant.bytes = s.bytes;
        if (stage_send(W->srv, pi->id, &m) < 0) {
            inbox_free(W->ib, s.id);
            W->slot_owner[s.id] = 0;
            p->granted--;
        }
    }
}

/* Frees an item's inbox slot. The target is not told: it forgets a micro-batch once
 * hidden_states_ready is sent, and credit comes back as a new grant (grant_all). */
static void release_item(dw_t *W, const item_t *it) {
    inbox_free(W->ib, it->slot_id);
}

static const uint8_t *slot_base(dw_t *W, uint32_t slot_id) {
    inbox_slot_t s;
    if (inbox_get(W->ib, slot_id, &s) < 0) return NULL;
    return (const uint8_t *)slab_ptr(W->tier[s.tier]) + s.offset;
}

/* Bytes of a slot's metadata buffer: ids (T i32), lengths (n_seqs <= T i32) and
 * mask (T u8) of the largest micro-batch, T = token budget. */
static size_t meta_cap(const dw_t *W) { return (size_t)W->token_budget * 9; }

/* Copies the inline ids / lengths / mask of h into slot h->slot_id's metadata
 * buffer (allocated on first use, kept for the slot id's later items) and points
 * it's fields there: the message is freed when its handler returns. Codec-checked:
 * n_tokens == T <= token budget, n_seq_lens == n_seqs <= T. DL_ENOMEM. */
static int take_meta(dw_t *W, const proto_hidden_states_ready_t *h, item_t *it) {
    uint8_t **mp = &W->meta[h->slot_id];
    if (!*mp && !(*mp = malloc(meta_cap(W)))) return dl_seterr(DL_ENOMEM, "metadata buffer");
    size_t T = h->n_tokens, S = h->n_seq_lens;
    memcpy(*mp, h->tokens, T * 4);
    memcpy(*mp + T * 4, h->seq_lens, S * 4);
    memcpy(*mp + T * 4 + S * 4, h->loss_mask, T);
    it->ids = (const int32_t *)*mp;
    it->lens = (const int32_t *)(*mp + T * 4);
    it->mask = *mp + T * 4 + S * 4;
    return 0;
}

/* Bytes between two micro-batches' gradients in the gradient slab: P f32 rounded up
 * to 256, so every slot is as aligned as a cudaMalloc (drafter_set_grads). */
static size_t grad_stride(const dw_t *W) { return (size_t)pipe_align256(W->P * sizeof(float)); }

/* ---- compute on the worker thread ---- */
static void work_run(uv_work_t *req) {
    dw_t *W = req->data;
    item_t *it = &W->cur;
    const uint8_t *base = slot_base(W, it->slot_id);
    /* test hook (<name>.stall_after_mbs=N): after N micro-batches the compute hangs
     * (heartbeats and metrics go on, state "running", no progress): what the
     * monitor must call stuck. A stop request ends the hang. */
    if (W->stall_after >= 0 && W->started++ >= (uint64_t)W->stall_after) {
        if (W->started == (uint64_t)W->stall_after + 1)
            log_warn("test hook %s.stall_after_mbs=%lld: hanging on purpose", W->st.name,
                     (long long)W->stall_after);
        while (!__atomic_load_n(&W->st.stopping, __ATOMIC_RELAXED)) usleep(100000);
    }
    const void *features = base;
    const int32_t *lens = it->lens;
    W->cu[0] = 0;
    for (uint32_t s = 0; s < it->n_seqs; s++) W->cu[s + 1] = W->cu[s] + lens[s];
    const uint8_t *mask = it->mask;
    /* the GPU's turn (gputurn.h; off on CPU but for the gpu_turns.cpu test hook): this
     * micro-batch runs alone on it, given back by work_cb after the sync that ends this
     * function */
    W->cur_wait_gpu_s = gpu_turn_take(&W->turn, &W->st.stopping);
    if (W->gpu >= 0) {
        int rc = dev_set(W->gpu);   /* per thread: this is a libuv worker */
        /* producer -> consumer ordering on the GPU: our stream waits for the
         * target's writes (no host wait) */
        if (rc == 0 && it->ev) rc = dev_stream_wait(W->ops.stream, it->ev);   /* NULL: by NCCL, in order */
        inbox_slot_t sl;
        inbox_get(W->ib, it->slot_id, &sl);
        if (rc == 0 && slab_handle(W->tier[sl.tier])->kind == SLAB_HOST) {
            rc = dev_copy_async(W->staging, base, (size_t)it->T * W->dcfg.n_feat * W->dcfg.D * W->elem,
                                W->ops.stream);
            features = W->staging;
        }
        if (rc < 0) { W->cur_rc = rc; return; }
    }
    rng_t r;
    rng_seed(&r, rng_mix(W->seed, it->mb, 0xA17C));
    /* --num-anchors is honoured whatever the micro-batch: every anchor is sampled (at
     * most one per token, so anchor_buf's token_budget entries always hold them) */
    int nb = drafter_sample_anchors(W->cu, (int)it->n_seqs, mask, W->dcfg.B, (int)W->anchors, &r,
                                    W->anchor_buf, (int)W->token_budget);
    if (nb < 0) { W->cur_rc = nb; return; }
    drafter_batch_t b = {0};
    b.T = (int)it->T;
    b.nseq = (int)it->n_seqs;
    b.cu_seqlens = W->cu;
    b.ids = it->ids;
    b.loss_mask = mask;
    b.features = features;
    double t0 = clock_mono_s();
    /* the backward accumulates straight into this micro-batch's gradient slot (zeroed
     * first, as the own buffer was: the same sums, bitwise; the slot is 256-byte
     * aligned like that buffer, so the CUDA GEMM plans are the same too). nb == 0
     * (nothing to predict) contributes a zero gradient with zero weight. */
    drafter_set_grads(W->d, (float *)((uint8_t *)slab_ptr(W->grad) + (size_t)it->mb_in_step * grad_stride(W)));
    drafter_zero_grad(W->d);
    memset(&W->cur_stats, 0, sizeof W->cur_stats);
    W->cur_passes = drafter_passes(nb, (int)W->max_blocks);
    W->cur_blocks = nb;
    W->cur_rc = 0;
    /* more blocks than one pass holds (GPU activation memory, max_blocks): passes over
     * consecutive anchors of equal size, each accumulating into the same slot with
     * grad_scale 1 (sums; the optimizer divides by the step's weight_sum), their stats
     * summed: the same math as one pass, in another summation order */
    for (int p = 0, j0 = 0; p < W->cur_passes && W->cur_rc == 0; p++) {
        int n = (nb - j0 + (W->cur_passes - p) - 1) / (W->cur_passes - p);
        drafter_stats_t ps = {0};
        b.n_blocks = n;
        b.anchors = W->anchor_buf + j0;
        W->cur_rc = drafter_forward_backward(W->d, &b, 1.0f, &ps);
        drafter_stats_add(&W->cur_stats, &ps);
        j0 += n;
    }
    double t1 = clock_mono_s();
    /* device slab: the writes are done before gradients_ready (this stream only); the
     * GPU's turn is given back with this micro-batch's work done */
    if (slab_handle(W->grad)->kind == SLAB_CUDA || W->turn.held) W->ops.impl->sync(&W->ops);
    W->cur_fb_s = t1 - t0;
    W->cur_copy_s = clock_mono_s() - t1;
}

/* Runs on a libuv pool thread: the error detail is thread-local (err.h), so it is
 * copied here for after_work_cb, which runs on the loop thread. */
static void work_cb(uv_work_t *req) {
    dw_t *W = req->data;
    W->cur_err[0] = 0;
    work_run(req);
    gpu_turn_give(&W->turn);   /* its GPU work is done (or failed): the next stage's turn */
    if (W->cur_rc < 0) snprintf(W->cur_err, sizeof W->cur_err, "%s", dl_errmsg());
}

static void load_weights(dw_t *W, int64_t version, uint64_t offset) {
    const uint8_t *base = dw__weights_base(W);   /* the mapped slab, or its mirror (another node) */
    if (!base) return;
    int rc;
    double t0 = clock_mono_s();
    const float *src = (const float *)(base + offset);
    /* the optimizer's f32 weights converted into the working weights through a scratch
     * buffer (the drafter keeps no master copy: no_master), on the compute stream, ordered
     * before the next micro-batch; the optimizer overwrites this half only two versions
     * later. Where they are: a remote optimizer's in the mirror, on the device when NCCL
     * brings them (nstep), else in host memory; a local one's slab is device memory when
     * it is a CUDA slab. */
    int src_host = W->opt_remote ? W->nstep == NULL : W->wslab.kind != SLAB_CUDA;
    rc = drafter_load_master(W->d, src, src_host);
    if (rc < 0) { log_rc(rc, "load the optimizer's weights"); exit(1); }
    stage_phase_add(&W->st, PHASE_COPY, clock_mono_s() - t0);
    W->version = version;
    memset(W->sent, 0, W->K);
    /* drop what can no longer be applied */
    for (int k = 0; k < DW_MAX_SLOTS; k++) {
        item_t *it = &W->items[k];
        if (it->used && (int64_t)it->step < version) {
            release_item(W, it);
            it->used = 0;
            W->dropped++;
        }
    }
}

static void after_work_cb(uv_work_t *req, int status) {
    dw_t *W = req->data;
    (void)status;
    item_t *it = &W->cur;
    W->busy = 0;
    stage_phase_add(&W->st, PHASE_BACKWARD, W->cur_fb_s);
    stage_phase_add(&W->st, PHASE_WAIT_GPU, W->cur_wait_gpu_s);
    stage_phase_add(&W->st, PHASE_COPY, W->cur_copy_s);
    if (W->cur_rc < 0) {
        log_error("micro-batch %llu: drafter forward/backward failed: %s", (unsigned long long)it->mb,
                  W->cur_err);
        exit(1); /* the supervisor restarts the stage; the loader re-issues the work */
    }
    const drafter_stats_t *s = &W->cur_stats;
    if (W->cur_passes > 1) W->multi_pass_mbs++;
    if (W->seqs_done == 0 && it->n_seqs > 0) {   /* the first one: what --num-anchors became */
        char tw[64];
        log_info("micro-batch %llu: %u sequences, %d blocks = %.1f anchors per sequence (--num-anchors %u; a "
                 "sequence with fewer positions where a block fits takes all it has); the first: forward+"
                 "backward %.2f s%s", (unsigned long long)it->mb, it->n_seqs, W->cur_blocks,
                 (double)W->cur_blocks / it->n_seqs, W->anchors, W->cur_fb_s,
                 gpu_turn_waited(&W->turn, W->cur_wait_gpu_s, tw, sizeof tw));
    }
    W->blocks_done += (uint64_t)W->cur_blocks;
    W->seqs_done += it->n_seqs;
    if (W->cur_passes > 1 && W->cur_passes != W->logged_passes) {
        log_info("micro-batch %llu: %d blocks (--num-anchors %u per sequence, %u sequences) in %d passes of "
                 "at most %u blocks (activation memory); said again when the pass count changes",
                 (unsigned long long)it->mb, W->cur_blocks, W->anchors, it->n_seqs, W->cur_passes, W->max_blocks);
        W->logged_passes = W->cur_passes;
    }
    /* DL_LOG_LEVEL=debug: per-micro-batch sums, to hold runs of one job on different
     * layouts (CPU, 1 GPU, 2 GPUs) against each other micro-batch by micro-batch */
    double rows = 0;
    for (int k = 0; k < W->dcfg.B; k++) rows += s->count[k];
    log_debug("micro-batch %llu (step %llu): T %u, %u sequences, %.0f loss rows, loss_sum %.9g, "
              "weight_sum %.9g", (unsigned long long)it->mb, (unsigned long long)it->step, it->T,
              it->n_seqs, rows, s->loss_sum, s->weight_sum);
    proto_msg_t m;
    proto_msg_init(&m, PROTO_GRADIENTS_READY);
    proto_gradients_ready_t *g = &m.gradients_ready;
    float acc[DL_PROTO_MAX_BLOCK] = {0};
    for (int k = 1; k < W->dcfg.B; k++) acc[k] = s->count[k] > 0 ? (float)(s->correct[k] / s->count[k]) : 0.0f;
    uint64_t mb = it->mb;
    g->drafter_id = W->st.stage_id;
    g->step = it->step;
    g->weights_version = (uint64_t)W->version;
    g->mbs = &mb;
    g->n_mbs = 1;
    g->n_tokens = it->T;
    g->loss_sum = s->loss_sum;
    g->weight_sum = s->weight_sum;
    g->acc = acc;
    g->n_acc = (uint32_t)W->dcfg.B;
    g->slab_id = SLOT_SLAB_GRAD;
    g->offset = (uint64_t)it->mb_in_step * grad_stride(W);
    g->bytes = W->P * sizeof(float);
    g->n_params = W->P;
    if (!isfinite(g->weight_sum) || g->weight_sum < 0) g->weight_sum = 0;
    /* test hook nan_mb=<mb> poisons that micro-batch's loss (the optimizer must skip
     * its step and report it) */
    if (W->nan_mb >= 0 && (uint64_t)W->nan_mb == it->mb) g->loss_sum = NAN;
    if (!dw__nstep_send(W, &m)) dw__send_grads(W, &m);   /* optimizer on another node: the slot's bytes first */
    W->sent[it->mb_in_step] = 1;
    W->computed++;
    W->tokens += it->T;
    stage_progress(&W->st);
    release_item(W, it);
    if (W->pending_version >= 0) {
        load_weights(W, W->pending_version, W->pending_offset);
        W->pending_version = -1;
    }
    W->idle_since = clock_mono_s();
    grant_all(W);
    try_compute(W);
}

static void on_pool_timer(bus_t *bus, void *arg) {
    (void)bus;
    dw_t *W = arg;
    W->pool_timer_armed = 0;
    try_compute(W);
}

static void try_compute(dw_t *W) {
    if (W->busy || W->version < 0 || W->st.stopping || dw__grads_pending(W)) {
        if (!W->busy) W->st.state = PROTO_STATE_IDLE;
        return;
    }
    int cand[DW_MAX_SLOTS], n = 0;
    double oldest = 1e300;
    for (int k = 0; k < DW_MAX_SLOTS; k++) {
        item_t *it = &W->items[k];
        if (!it->used) continue;
        if ((int64_t)it->step < W->version) {   /* its step is applied already */
            release_item(W, it);
            it->used = 0;
            W->dropped++;
            continue;
        }
        if ((int64_t)it->step != W->version) continue;
        if (W->sent[it->mb_in_step]) {      /* duplicate of a contributed micro-batch */
            release_item(W, it);
            it->used = 0;
            W->dropped++;
            continue;
        }
        cand[n++] = k;
        if (it->t_ready < oldest) oldest = it->t_ready;
    }
    if (n == 0) { W->st.state = PROTO_STATE_IDLE; grant_all(W); return; }
    /* pool: wait (at most 50 ms after the oldest arrival) for min_ready items */
    if ((uint32_t)n < W->min_ready && clock_mono_s() - oldest < 0.05) {
        if (!W->pool_timer_armed) {
            bus_timer_stop(&W->pool_timer);
            bus_timer_start(W->srv, 20, 0, on_pool_timer, W, &W->pool_timer);
            W->pool_timer_armed = 1;
        }
        return;
    }
    int pick = 0;
    if (W->min_ready > 1) {
        rng_t r;
        rng_seed(&r, rng_mix(W->seed, (uint64_t)W->version, W->computed));
        pick = (int)rng_below(&r, (uint64_t)n);
    } else {
        for (int j = 1; j < n; j++) if (W->items[cand[j]].mb < W->items[cand[pick]].mb) pick = j;
    }
    item_t *it = &W->items[cand[pick]];
    W->cur = *it;
    it->used = 0;
    stage_phase_add(&W->st, PHASE_WAIT_INPUT, clock_mono_s() - W->idle_since);
    W->busy = 1;
    W->st.state = PROTO_STATE_RUNNING;
    W->work.data = W;
    uv_queue_work(&W->st.loop, &W->work, work_cb, after_work_cb);
}

static void on_hs_ready(dw_t *W, int pi, const proto_hidden_states_ready_t *h) {
    const peer_info_t *p = &W->peers.p[pi];
    tpeer_t *x = &W->tp[pi];
    if (h->slot_id >= DW_MAX_SLOTS || W->slot_owner[h->slot_id] != (uint32_t)pi + 1) {
        log_warn("%s: hidden_states_ready for slot %u it was not granted: dropped", p->id, h->slot_id);
        return;
    }
    inbox_slot_t s;
    inbox_get(W->ib, h->slot_id, &s);
    if (h->slab_id != wire_slab_id(W, s.tier == INBOX_GPU ? SLOT_SLAB_GPU : SLOT_SLAB_HOST)) {
        /* the slot stays granted: the target answers for this grant later */
        log_warn("%s: hidden_states_ready for micro-batch %llu names slab %u of an earlier incarnation: dropped",
                 p->id, (unsigned long long)h->mb, h->slab_id);
        return;
    }
    /* never compute on another GPU's memory (host tiers always pass) */
    if (slab_check_gpu(slab_handle(W->tier[s.tier]), W->st.gpu_uuid) < 0) {
        log_error("refusing micro-batch %llu: %s", (unsigned long long)h->mb, dl_errmsg());
        exit(1);
    }
    uint64_t row = (uint64_t)W->dcfg.n_feat * (uint64_t)W->dcfg.D;
    pipe_layout_t l = pipe_layout(h->shape[0], row, W->elem);
    proto_dtype_t want = W->gpu >= 0 ? PROTO_DTYPE_BF16 : PROTO_DTYPE_F32;
    int bad = h->dtype != want || h->ndim != 2 || (W->gpu >= 0 && h->event_len != 64) || h->shape[1] != row ||
              h->shape[0] > W->token_budget || h->shape[0] < 1 || h->bytes > s.bytes || l.bytes > s.bytes ||
              h->mbs_in_step != W->K || h->mb_in_step != h->mb % W->K || h->step != h->mb / W->K;
    /* a GPU target on another node: its bytes by NCCL, received whatever follows (the
     * pair stays in step with its sends); a CPU one: every feature byte came as
     * slab_data (it logs why not) */
    int nccl = dw__nccl_take(W, pi, h->slot_id, l.feat_bytes);
    int incomplete = !bad && (nccl < 0 || (nccl == 0 && !dw__slot_complete(W, pi, h->slot_id, l.feat_bytes)));
    if (bad) {
        log_warn("%s: hidden_states_ready for micro-batch %llu does not match this drafter "
                 "(shape %llux%llu, expected rows of %llu f32, K %u): dropped",
                 p->id, (unsigned long long)h->mb, (unsigned long long)h->shape[0],
                 (unsigned long long)h->shape[1], (unsigned long long)row, W->K);
    }
    if (bad || incomplete) {
        inbox_free(W->ib, h->slot_id);
        W->slot_owner[h->slot_id] = 0;
        x->granted--;
        grant_all(W);
        return;
    }
    W->slot_owner[h->slot_id] = 0;
    x->granted--;
    int k = 0;
    while (k < DW_MAX_SLOTS && W->items[k].used) k++;
    if (k == DW_MAX_SLOTS) { /* cannot happen: one item per live slot, at most DW_MAX_SLOTS */
        log_error("ready list full");
        inbox_free(W->ib, h->slot_id);
        return;
    }
    item_t *it = &W->items[k];
    memset(it, 0, sizeof *it);
    it->used = 1;
    it->mb = h->mb;
    it->step = h->step;
    it->mb_in_step = h->mb_in_step;
    it->slot_id = h->slot_id;
    it->T = (uint32_t)h->shape[0];
    it->n_seqs = h->n_seqs;
    it->t_ready = clock_mono_s();
    if (take_meta(W, h, it) < 0) {
        log_error("micro-batch %llu: %s", (unsigned long long)h->mb, dl_errmsg());
        exit(1);
    }
    if (W->gpu >= 0 && nccl == 0) {
        /* the producer's event: opened once per (target, incarnation, handle) */
        int e = 0;
        while (e < W->nevc && !(W->evc[e].peer == pi && W->evc[e].inc == p->incarnation &&
                                !memcmp(W->evc[e].h, h->event, 64))) e++;
        int rc = 0;
        if (e == W->nevc) {
            if (W->nevc == DW_MAX_EVENTS) rc = dl_seterr(DL_ENOMEM, "event cache full");
            else rc = dev_event_open(h->event, &W->evc[e].ev);
            if (rc == 0) {
                W->evc[e].peer = pi; W->evc[e].inc = p->incarnation;
                memcpy(W->evc[e].h, h->event, 64);
                W->nevc++;
                W->event_opens++;
            }
        }
        if (rc < 0) {
            log_error("micro-batch %llu: %s", (unsigned long long)h->mb, dl_errmsg());
            exit(1);
        }
        it->ev = W->evc[e].ev;
    }
    /* the sequence lengths must add up to T (a peer's bad data never reaches the math) */
    const int32_t *lens = it->lens;
    const int32_t *ids = it->ids;
    int64_t sum = 0;
    int ok = 1;
    for (uint32_t j = 0; j < it->n_seqs; j++) { if (lens[j] < 1) ok = 0; sum += lens[j]; }
    for (uint32_t t = 0; t < it->T && ok; t++) if (ids[t] < 0 || ids[t] >= W->dcfg.V) ok = 0;
    if (!ok || sum != it->T) {
        log_warn("%s: micro-batch %llu has inconsistent sequence lengths or token ids: dropped",
                 p->id, (unsigned long long)h->mb);
        release_item(W, it);
        it->used = 0;
        return;
    }
    grant_all(W);
    try_compute(W);
}

static void on_target_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)bus;
    dw_t *W = arg;
    proto_msg_t m;
    if (stage_decode(W->st.name, peer, data, len, &m) < 0) return;
    int i = peers_find(&W->peers, peer);
    switch (m.type) {
    case PROTO_HELLO: {   /* only targets of this run (stage_admit: a refused one changes nothing) */
        int n = W->peers.n;
        peers_hello_t what;
        i = stage_admit(&W->st, &W->peers, W->srv, peer, &m.hello, PIPE_ID_TARGET0,
                        PIPE_ID_TARGET0 + PIPE_MAX_TARGETS, &what, NULL);
        if (i < 0) break;
        if (i >= n) memset(&W->tp[i], 0, sizeof W->tp[i]);
        /* a restarted target's unused grants are reclaimed */
        if (what == PEERS_RESTARTED) reclaim(W, i);
        log_info("hello from %s (target %u, incarnation %llu)", peer, m.hello.stage_id,
                 (unsigned long long)m.hello.incarnation);
        /* events of an earlier incarnation of this target are dead */
        for (int e = 0; e < W->nevc;) {
            if (W->evc[e].peer == i && W->evc[e].inc != m.hello.incarnation) {
                dev_event_destroy(W->evc[e].ev);
                W->evc[e] = W->evc[--W->nevc];
            } else e++;
        }
        export_slab(W, W->srv, peer, W->tier[0]);
        if (W->tier[1]) export_slab(W, W->srv, peer, W->tier[1]);
        dw__nccl_hello(W, i);   /* a GPU target on another node: a new pair, its grants held */
        grant_all(W);
        break;
    }
    case PROTO_HIDDEN_STATES_READY:   /* (an earlier incarnation of this drafter may be meant) */
        if (i >= 0) on_hs_ready(W, i, &m.hidden_states_ready);
        else stage_refuse(&W->st, W->srv, peer, m.type, "not a member's verified peer (no hello)");
        break;
    case PROTO_SLAB_DATA:    /* a target on another node: features into its granted slot */
        dw__on_target_data(W, i, peer, &m.slab_data);
        break;
    case PROTO_SLOT_RELEASE: /* an unused grant handed back (target re-routed or stopping) */
        if (i < 0) stage_refuse(&W->st, W->srv, peer, m.type, "not a member's verified peer (no hello)");
        else if (m.slot_release.slot_id < DW_MAX_SLOTS &&
            W->slot_owner[m.slot_release.slot_id] == (uint32_t)i + 1) {
            inbox_free(W->ib, m.slot_release.slot_id);
            W->slot_owner[m.slot_release.slot_id] = 0;
            W->tp[i].granted--;
            W->tp[i].declined_at = clock_mono_s();
            grant_all(W);
        }
        break;
    default:
        log_warn("unexpected %s from %s", proto_type_name(m.type), peer);
    }
    proto_msg_free(&m);
}

/* A target that left (goodbye) or whose NCCL pair is dropped: its unused grants are
 * reclaimed. A target only silent (stalled, SIGSTOP, a long pause) gets no new grant
 * until it is heard again (on_target_back), but its outstanding grant stays reserved:
 * a stalled target that wakes up may still write into that slot, which must not be
 * another target's by then. A dead one restarts as a new incarnation, whose hello
 * reclaims it (a target that is never restarted keeps its one slot reserved). */
static void on_target_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg) {
    (void)bus;
    dw_t *W = arg;
    int i = peers_find(&W->peers, peer);
    if (i < 0) return;
    W->peers.p[i].alive = 0;
    if (silent_ms == BUS_PEER_LEFT || W->npair[i]) {
        if (silent_ms != BUS_PEER_LEFT)
            log_warn("%s silent for %llu ms: its unused grants are reclaimed", peer, (unsigned long long)silent_ms);
        reclaim(W, i);
        dw__nccl_dead(W, i);
    } else {
        log_warn("%s silent for %llu ms: no new grant until it is heard again (its %d outstanding grant(s) stay "
                 "reserved for it)", peer, (unsigned long long)silent_ms, W->tp[i].granted);
    }
    grant_all(W);
}

/* A target heard again after it was silent (the bus calls it a new peer): grants again. */
static void on_target_back(bus_t *bus, const char *peer, void *arg) {
    (void)bus;
    dw_t *W = arg;
    int i = peers_find(&W->peers, peer);
    if (i < 0 || W->peers.p[i].alive) return;
    log_info("%s heard again: granting again", peer);
    W->peers.p[i].alive = 1;
    grant_all(W);
}

static void on_opt_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)bus;
    dw_t *W = arg;
    proto_msg_t m;
    if (stage_decode(W->st.name, "optimizer", data, len, &m) < 0) return;
    (void)peer;
    if (m.type == PROTO_SLAB_EXPORT) {
        stage_slab_from_export(&m.slab_export, &W->wslab);
        W->wslab.readonly = 1;   /* the optimizer's: mapped PROT_READ (CPU; CUDA IPC cannot) */
        W->have_wslab = 1;
        if (W->wslab.kind == SLAB_CUDA && W->gpu < 0) {
            log_error("the optimizer publishes weights in GPU memory but this drafter runs on the CPU "
                      "(start drafters and optimizer both with or both without --gpu)");
            W->have_wslab = 0;
        }
        if (W->have_wslab && (W->nstep ? dw__nstep_export(W) : dw__weights_export(W)) < 0) W->have_wslab = 0;
    } else if (m.type == PROTO_SLAB_DATA) {   /* the optimizer on another node: its weights */
        if (!dw__nstep_refuse(W, &m.slab_data)) dw__on_opt_data(W, &m.slab_data);
    } else if (m.type == PROTO_NCCL_ID) {     /* its step communicator (GPU, hook nccl_cross=1) */
        dw__nstep_on_id(W, &m.nccl_id);
    } else if (m.type == PROTO_WEIGHTS_VERSION) {
        const proto_weights_version_t *v = &m.weights_version;
        if (!W->have_wslab || v->n_params != W->P || v->dtype != PROTO_DTYPE_F32 ||
            v->slab_id != W->wslab.slab_id || v->offset + v->bytes > W->wslab.bytes) {
            log_error("weights_version %llu does not match this drafter (%llu params)",
                      (unsigned long long)v->version, (unsigned long long)v->n_params);
        } else if ((int64_t)v->version != W->version && dw__nstep_weights(W, v) >= 0) {
            if (W->busy) { W->pending_version = (int64_t)v->version; W->pending_offset = v->offset; }
            else load_weights(W, (int64_t)v->version, v->offset);
            try_compute(W);
        }
    } else {
        log_warn("unexpected %s from the optimizer", proto_type_name(m.type));
    }
    proto_msg_free(&m);
}

static void on_grant_timer(bus_t *bus, void *arg) {
    (void)bus;
    grant_all(arg);
}

static void on_metrics(stage_t *st, proto_metrics_t *m, void *arg) {
    dw_t *W = arg;
    (void)st;
    double now = clock_mono_s();
    if (!W->busy && !W->st.stopping) stage_metric_add(m, "wait_input_s", now - W->idle_since);  /* wait in progress */
    W->rate = stage_rate(&W->rate_win, now, (double)W->tokens, 5.0);   /* over the last 5 s */
    int ready = 0;
    for (int k = 0; k < DW_MAX_SLOTS; k++) ready += W->items[k].used;
    stage_metric(m, "tokens_per_s", W->rate);
    stage_metric(m, "computed", (double)W->computed);
    stage_metric(m, "tokens", (double)W->tokens);
    stage_metric(m, "dropped", (double)W->dropped);
    stage_metric(m, "ready", ready);
    stage_metric(m, "weights_version", (double)W->version);
    stage_metric(m, "inbox_gpu_bytes", (double)inbox_used(W->ib, INBOX_GPU));
    stage_metric(m, "inbox_host_bytes", (double)inbox_used(W->ib, INBOX_HOST));
    stage_metric(m, "inbox_gpu_cap", (double)inbox_cap(W->ib, INBOX_GPU));
    stage_metric(m, "inbox_host_cap", (double)inbox_cap(W->ib, INBOX_HOST));
    stage_metric(m, "inbox_high_water", (double)inbox_high_water(W->ib));
    stage_metric(m, "inbox_slabs_bytes", (double)(slab_bytes(W->tier[0]) + (W->tier[1] ? slab_bytes(W->tier[1]) : 0)));
    stage_metric(m, "handle_opens", (double)hcache_opens(W->hc));
    stage_metric(m, "event_opens", (double)W->event_opens);
}

static void on_stop(stage_t *st, void *arg) {
    dw_t *W = arg;
    st->state = PROTO_STATE_STOPPING;
    if (W->srv) bus_close(W->srv, NULL, NULL);
    if (W->opt) bus_close(W->opt, NULL, NULL);
    stage_close(st);
}

static void usage(FILE *f) {
    fprintf(f,
        "usage: drafter_worker --index I --run-dir DIR --incarnation N [--log-level L]\n"
        "Pipeline stage 3: owns an inbox, computes DFlash drafter forward/backward per micro-batch.\n"
        "Started by `draftline run`; every setting (target model, drafter shape, anchors, inbox\n"
        "sizes, seed, threads, GPU, ...) comes from the run configuration the supervisor sends\n"
        "first (common/pipe/runcfg.h).\n\n"
        "  --index I                  drafter index (stage id 100+I, endpoint drafter<I>.sock)\n"
        "  --run-dir DIR              sockets directory of the run (holds the supervisor's sup.sock)\n"
        "  --incarnation N            restart count given by the supervisor (default 1)\n"
        "  --log-level L              error|warn|info|debug\n"
        "  -h, --help                 this help\n");
}

/* The inbox tiers (caps[0] GPU tier, caps[1] host tier, in bytes; a tier of 0 is not
 * made, and a lone host tier becomes tier 0), the gradient slab (K * P f32) and, on a
 * GPU, the staging buffer for host-tier items; sid: this stage's id. Made before
 * stage_init (pinning a host tier takes seconds): nothing here may use W->st. Logs and
 * returns a negative error code on failure. */
static int dw_slabs(dw_t *W, const char *run_id, const char *name, uint32_t sid, int64_t inc, uint64_t caps[2]) {
    int rc = 0;
    uint64_t row = (uint64_t)W->dcfg.n_feat * (uint64_t)W->dcfg.D;
    /* the slabs are the inbox: exactly the two capacities, nothing else */
    int on_gpu = W->gpu >= 0;
    if (rc == 0 && caps[0])
        rc = slab_create(&W->tier[0], on_gpu ? SLAB_CUDA : SLAB_HOST, run_id, name, sid, (uint64_t)inc,
                         SLOT_SLAB_GPU, "ibg", caps[0], W->gpu, 0);
    if (rc == 0 && caps[1]) rc = slab_create(&W->tier[1], SLAB_HOST, run_id, name, sid, (uint64_t)inc, SLOT_SLAB_HOST, "ibh", caps[1], -1, on_gpu);
    if (rc == 0 && !W->tier[0]) { W->tier[0] = W->tier[1]; W->tier[1] = NULL; caps[0] = caps[1]; caps[1] = 0; }
    /* gradients: one slot of P f32 (grad_stride apart) per micro-batch of a step; device
     * memory on GPU (the optimizer maps it by IPC and reads it in place) */
    if (rc == 0) rc = slab_create(&W->grad, on_gpu ? SLAB_CUDA : SLAB_HOST, run_id, name, sid,
                                  (uint64_t)inc, SLOT_SLAB_GRAD, "grad", (size_t)W->K * grad_stride(W), W->gpu, 0);
    if (rc == 0 && on_gpu && (caps[1] || slab_handle(W->tier[0])->kind == SLAB_HOST)) {
        /* host-tier items are copied here before the math (compute memory, not inbox) */
        W->staging = W->ops.impl->malloc_(&W->ops, (size_t)W->token_budget * row * W->elem);
        if (!W->staging) rc = DL_ENOMEM;
    }
    if (rc < 0) log_rc(rc, "inbox slabs");
    return rc;
}

/* Says hello to the optimizer (it answers with its weights slab). */
static void send_hello(dw_t *W) {
    proto_msg_t h;
    proto_msg_init(&h, PROTO_HELLO);
    h.hello.role = PROTO_ROLE_DRAFTER;
    h.hello.stage_id = W->st.stage_id;
    h.hello.incarnation = W->st.incarnation;
    h.hello.pid = (uint32_t)getpid();
    h.hello.proto_version = DL_PROTO_VERSION;
    h.hello.capabilities = PROTO_CAP_SHM | PROTO_CAP_HOST_TIER;
    stage_peer_token(&W->st, PIPE_ID_OPTIMIZER, &h.hello);
    stage_send(W->opt, NULL, &h);
}

/* Releases what main and dw_slabs made (after stage_run). */
static void dw_fini(dw_t *W) {
    dw__nccl_fini(W);
    dw__nstep_fini(W);   /* before the free of W->wmirror: its mirror is device memory */
    xfer_destroy(&W->oxf);
    free(W->wmirror);
    bus_destroy(&W->srv);
    bus_destroy(&W->opt);
    stage_fini(&W->st);
    gpu_turn_close(&W->turn);
    hcache_destroy(&W->hc);
    inbox_destroy(&W->ib);
    slab_destroy(&W->tier[0]);
    slab_destroy(&W->tier[1]);
    slab_destroy(&W->grad);
    for (int e = 0; e < W->nevc; e++) dev_event_destroy(W->evc[e].ev);
    if (W->staging) W->ops.impl->free_(&W->ops, W->staging);
    for (int k = 0; k < DW_MAX_SLOTS; k++) free(W->meta[k]);
    drafter_destroy(&W->d);
    target_destroy(&W->tgt);
    ops_ctx_destroy(&W->ops);
}

/* The worker's drafter keeps neither an f32 master (its weights are the optimizer's:
 * no_master) nor gradients of its own (it accumulates into the slab it exports:
 * external_grads). Whether the MLP up projections (keep_up: one GEMM a layer less in the
 * backward) fit in what that saves, with the shared up buffer the recomputation would
 * need: 8 bytes a parameter on a GPU (4 on the CPU, where the working weights were the
 * master) + one (R, F) act buffer, against one such buffer a layer. The choice is logged. */
static int keep_up_fits(const dw_t *W) {
    const drafter_config_t *c = &W->dcfg;
    drafter_t *lay = NULL;
    drafter_new_opts_t lo = {.layout_only = 1};
    if (drafter_new_opts(&W->ops, c, target_embed(W->tgt), target_lm_head(W->tgt), 1, 1, 0, &lo,
                         &lay) < 0) {
        log_warn("drafter: recomputes the MLP up projections (its layout: %s)", dl_errmsg());
        return 0;
    }
    double P = (double)drafter_n_params(lay);
    drafter_destroy(&lay);
    double rf = (double)W->max_blocks * c->B * c->F * ops_act_bytes(&W->ops);
    double saved = (W->gpu >= 0 ? 8.0 : 4.0) * P + rf, cost = c->n_layers * rf;
    if (cost <= saved)
        log_info("drafter: keeps the MLP up projections for the backward (%d layer(s), %.1f MB, "
                 "in the %.1f MB of master weights and gradients it does not hold)",
                 c->n_layers, cost / 1e6, saved / 1e6);
    else
        log_info("drafter: recomputes the MLP up projections in the backward (keeping them would take "
                 "%.1f MB, %.1f MB more than the master weights and gradients it does not hold)",
                 cost / 1e6, (cost - saved) / 1e6);
    return cost <= saved;
}

/* The compute set-up from the run configuration c, as the flags of the same names did:
 * the drafter config, the ops (CUDA device, or CPU threads), the
 * target's embedding / LM head and the drafter. Returns 0, or main's exit status after
 * logging why (PIPE_EXIT_PERMANENT for what a restart cannot fix: config, model files,
 * a GPU in a build without CUDA; 1 for a CUDA device error). */
static int dw_setup(dw_t *W, const run_config_t *c) {
    const char *model = c->target_model;
    W->token_budget = c->token_budget;
    W->anchors = c->num_anchors;
    W->K = c->mbs_per_step;
    W->min_ready = c->hs_min_ready;
    W->seed = c->seed;
    model_config_t mc;
    int rc = pipe_target_config(model, &mc);
    if (rc < 0) return log_rc(rc, "target config"), PIPE_EXIT_PERMANENT;
    rc = pipe_drafter_config(&mc, (int)c->drafter_layers, 0, (int)c->block_size, &W->dcfg);
    if (rc < 0) return log_rc(rc, "drafter config"), PIPE_EXIT_PERMANENT;
    W->gpu = runcfg_stage_gpu(c, PIPE_ID_DRAFTER0 + (uint32_t)W->index);
    W->elem = 4;
    if (W->gpu >= 0) {
        if (!dev_available()) {
            log_error("--gpu %d: this build has no CUDA", W->gpu);
            return PIPE_EXIT_PERMANENT;
        }
        /* CUDA is initialised here, after exec: nothing CUDA crossed the fork */
        rc = ops_cuda_init(&W->ops, W->gpu);
        /* no CUDA device, or no such ordinal: a restart would fail the same way */
        if (rc < 0) return log_rc(rc, "CUDA device (--gpu)"), rc == DL_ENOENT || rc == DL_EINVAL ? PIPE_EXIT_PERMANENT : 1;
        W->elem = ops_act_bytes(&W->ops);
    } else {
        ops_cpu_init(&W->ops, (int)c->threads);
    }
    target_opts_t to = {0};
    to.max_tokens = 1;
    to.max_seqs = 1;
    to.embed_only = 1;        /* the drafter's frozen parts only, not the target's layers */
    double t0 = clock_mono_s();
    rc = target_load(model, &W->ops, &to, &W->tgt);
    if (rc < 0) return log_rc(rc, "load target embedding / LM head"), PIPE_EXIT_PERMANENT;
    /* GPU: activations are sized by blocks x block size; 4096 blocks is the
     * reference workload's (8 sequences x 512 anchors) */
    W->max_blocks = W->gpu >= 0 && W->token_budget > 4096 ? 4096 : W->token_budget;
    /* test hook drafter.max_blocks=<n>: a smaller pass (CPU runs never need several) */
    int64_t hb = 0;
    if (testhook_i64("drafter.max_blocks", &hb) && hb >= 1 && hb < (int64_t)W->max_blocks) W->max_blocks = (uint32_t)hb;
    /* no seeded init: nothing is computed before the optimizer's weights are loaded
     * (try_compute waits for W->version >= 0, which only load_weights sets) */
    drafter_new_opts_t dopts = {.no_init = 1, .external_grads = 1, .no_master = 1};
    dopts.keep_up = keep_up_fits(W);
    for (;;) {   /* a device too full for the kept projections: once more, recomputing them
                  * (test hook drafter.keep_up_enomem, common/model/drafter.c) */
        rc = drafter_new_opts(&W->ops, &W->dcfg, target_embed(W->tgt), target_lm_head(W->tgt),
                              (int)W->token_budget, (int)W->max_blocks, W->seed, &dopts, &W->d);
        if (rc != DL_ENOMEM || !dopts.keep_up) break;
        log_warn("drafter: %s; again, recomputing the MLP up projections", dl_errmsg());
        dopts.keep_up = 0;
    }
    if (rc < 0) return log_rc(rc, "drafter"), PIPE_EXIT_PERMANENT;
    W->P = drafter_n_params(W->d);
    log_info("target %s loaded for embedding/LM head in %.1f s; drafter %zu parameters",
             model, clock_mono_s() - t0, W->P);
    return 0;
}

int main(int argc, char **argv) {
    log_init("drafter", LOG_INFO);
    static dw_t W;
    static run_config_t cfg;
    stage_args_t a;
    if (stage_args(argc, argv, "drafter_worker", PIPE_MAX_DRAFTERS - 1, usage, &a) < 0) return a.exit_code;
    W.index = a.index;
    gpu_turn_init(&W.turn);
    int64_t inc = (int64_t)a.incarnation;
    char name[32];
    snprintf(name, sizeof name, "drafter%d", W.index);
    log_init(name, log_get_level());
    /* test hooks, read once here (never in the hot loop): see common/base/testhook.h */
    W.stall_after = W.nan_mb = -1;
    char hook[64];
    snprintf(hook, sizeof hook, "%s.stall_after_mbs", name);
    testhook_i64(hook, &W.stall_after);
    testhook_i64("nan_mb", &W.nan_mb);
    int rc = stage_config(PROTO_ROLE_DRAFTER, PIPE_ID_DRAFTER0 + (uint32_t)W.index, name, &a,
                          STAGE_CONFIG_TIMEOUT_MS, &cfg);
    if (rc < 0) return log_rc(rc, "run configuration"), 1;
    /* the inbox sizes as the "%.9g" flags gave them (cli_parse_gb) */
    size_t inbox_b = (size_t)(cfg.inbox_gb * 1024.0 * 1024.0 * 1024.0);
    size_t host_b = (size_t)(cfg.host_inbox_gb * 1024.0 * 1024.0 * 1024.0);
    rc = dw_setup(&W, &cfg);
    if (rc) return rc;
    uint64_t row = (uint64_t)W.dcfg.n_feat * (uint64_t)W.dcfg.D;
    {
        pipe_layout_t fl = pipe_layout(W.token_budget, row, W.elem);
        W.slot_bytes = fl.bytes;
    }
    if (W.slot_bytes > inbox_b && W.slot_bytes > host_b) {
        log_error("--inbox-gb %.3f and --host-inbox-gb %.3f cannot hold one micro-batch of %u tokens "
                  "(%.3f GiB of hidden states): raise --inbox-gb or lower --token-budget",
                  inbox_b / 1073741824.0, host_b / 1073741824.0, W.token_budget, W.slot_bytes / 1073741824.0);
        return PIPE_EXIT_PERMANENT;
    }
    W.sent = calloc(W.K, 1);
    W.items = calloc(DW_MAX_SLOTS, sizeof *W.items);
    W.cu = malloc(((size_t)W.token_budget + 2) * 4);
    W.anchor_buf = malloc((size_t)W.token_budget * 4);
    if (!W.sent || !W.items || !W.cu || !W.anchor_buf) { log_error("out of memory"); return 1; }
    W.version = -1;
    W.pending_version = -1;
    /* the inbox before stage_init: once the supervisor has our hello, the loop must keep
     * heartbeating (pinning a host tier of many GB takes seconds) */
    uint64_t caps[2] = {inbox_b >= W.slot_bytes ? inbox_b : 0, host_b};
    uint32_t sid = PIPE_ID_DRAFTER0 + (uint32_t)W.index;
    if (dw_slabs(&W, cfg.run_id, name, sid, inc, caps) < 0) return 1;
    rc = inbox_new(&W.ib, caps, DW_MAX_SLOTS);
    if (rc < 0) return log_rc(rc, "inbox"), 1;
    rc = stage_init(&W.st, PROTO_ROLE_DRAFTER, sid, name, &a, &cfg);
    if (rc < 0) {
        slab_destroy(&W.tier[0]); slab_destroy(&W.tier[1]); slab_destroy(&W.grad);
        return log_rc(rc, "stage init"), 1;
    }
    if (W.gpu >= 0) {
        W.st.gpu_index = W.gpu;
        rc = dev_uuid(W.gpu, W.st.gpu_uuid, sizeof W.st.gpu_uuid);
        if (rc < 0) return log_rc(rc, "GPU UUID"), 1;
        log_info("on GPU %d (%s): GPU-tier inbox exported by CUDA IPC", W.gpu, W.st.gpu_uuid);
    }
    if (gpu_turn_setup(&W.turn, &cfg, sid, W.st.run_dir) < 0)
        log_warn("GPU turns: %s; this drafter time-slices the GPU", dl_errmsg());
    hcache_new(&W.hc, W.gpu);
    W.srv = stage_bus(&W.st, BUS_ROUTER, name);
    W.opt = stage_bus(&W.st, BUS_DEALER, "optimizer");
    if (!W.srv || !W.opt) return log_rc(DL_EIO, "drafter sockets"), 1;
    bus_on_message(W.srv, on_target_msg, &W);
    bus_on_peer_dead(W.srv, on_target_dead, &W);
    bus_on_peer_new(W.srv, on_target_back, &W);
    bus_on_message(W.opt, on_opt_msg, &W);
    stage_on_metrics(&W.st, on_metrics, &W);
    stage_on_stop(&W.st, on_stop, &W);
    if (dw__nccl_init(&W) < 0) return log_rc(DL_ENOTSUP, "nccl_cross"), 1;
    if (dw__nstep_init(&W) < 0) return 1;
    if (dw__xfer_init(&W) < 0) return 1;
    send_hello(&W);
    export_slab(&W, W.opt, NULL, W.grad);
    W.t_rate = W.idle_since = clock_mono_s();
    bus_timer_start(W.srv, 100, 100, on_grant_timer, &W, &W.grant_timer);
    W.st.state = PROTO_STATE_IDLE;
    log_info("inbox: %llu + %llu bytes, slot %llu bytes (%u tokens x %llu features)",
             (unsigned long long)caps[0], (unsigned long long)caps[1], (unsigned long long)W.slot_bytes,
             W.token_budget, (unsigned long long)row);
    stage_run(&W.st);
    uint64_t opens = hcache_opens(W.hc);
    dw_fini(&W);
    log_info("stopped: %llu micro-batches computed (%llu in several passes), %.2f anchors per sequence "
             "(--num-anchors %u), %llu dropped, %llu handle opens, %llu event opens", (unsigned long long)W.computed,
             (unsigned long long)W.multi_pass_mbs, W.seqs_done ? (double)W.blocks_done / W.seqs_done : 0.0, W.anchors,
             (unsigned long long)W.dropped, (unsigned long long)opens, (unsigned long long)W.event_opens);
    free(W.sent); free(W.items); free(W.cu); free(W.anchor_buf);
    return 0;
}
