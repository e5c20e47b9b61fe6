/* target_worker: pipeline stage 2. Loads the frozen target, asks the loader for
 * micro-batches (credit: --prefetch outstanding requests), runs the forward
 * capturing the DFlash feature layers, and writes the features (T, n_feat*D)
 * directly into an inbox slot granted by the drafter it is routed to (the routing
 * table comes from the supervisor: control route [target_id, drafter_id, ...]);
 * then sends hidden_states_ready, which carries the token ids, sequence lengths and
 * loss mask inline.
 * It never writes into a drafter it is not routed to: grants of a previous route
 * are handed back unused. On CPU runs the slot is POSIX shared memory mapped once
 * per drafter incarnation (handle cache). With --gpu N (CUDA builds) the target
 * runs on GPU N and the slot is the drafter's GPU memory, opened once per drafter
 * incarnation with cudaIpcOpenMemHandle (hcache) and written by device copies
 * (the capture's cudaMemcpy2DAsync into the mapped pointer: a peer copy over
 * NVLink/PCIe when the drafter is on another GPU); the features are bf16. After
 * the feature writes an interprocess event (created once, at start-up, on this GPU; a
 * pool of TW_N_EVENTS) is recorded on the target's stream and its handle goes
 * with hidden_states_ready: the drafter waits on it on its own stream. The
 * worker thread then waits for this target's stream only (never device-wide).
 * A host-tier grant (the drafter's pinned host inbox) is written through a
 * device scratch buffer and one device-to-host copy.
 * A drafter on another node (multi-node run, docs/MULTINODE.md section 4) is never
 * mapped: the forward writes into a local staging buffer (one slot, host memory),
 * whose bytes then go to the drafter as slab_data chunks into the granted slot,
 * followed by hidden_states_ready on the same connection (common/pipe/xfer.h); the
 * next forward waits until the staging buffer has been handed to the bus. GPU
 * targets across nodes need NCCL (not built yet): refused at the route.
 */
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/testhook.h"
#include "common/mem/dev.h"
#include "common/mem/hcache.h"
#include "common/mem/slab.h"
#include "common/model/target.h"
#include "common/ops/ops.h"
#include "common/pipe/layout.h"
#include "common/pipe/model.h"
#include "common/pipe/gputurn.h"
#include "common/pipe/runcfg.h"
#include "common/pipe/slot.h"
#include "common/pipe/stage.h"
#include "common/pipe/xfer.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "target_worker/nccl_out.h"

#define TW_MAX_QUEUE 8
_Static_assert(TW_MAX_QUEUE == RUNCFG_PREFETCH_MAX, "--prefetch limit is the run config's");
#define TW_MAX_GRANTS 16
#define TW_N_EVENTS 4

typedef struct {
    uint64_t mb, step;
    uint32_t mb_in_step, mbs_in_step, n_seqs, T;
    int32_t *tokens, *seq_lens;
    uint8_t *mask;
} mb_t;

typedef struct {
    uint32_t slot_id, slab_id;
    uint64_t offset, bytes;
} grant_t;

typedef struct {
    stage_t st;
    int index;
    bus_t *loader;
    bus_t *drafter;            /* DEALER to the routed drafter */
    int route;                 /* drafter index, -1 none */
    uint64_t drafter_inc;
    ops_ctx_t ops;
    target_t *t;
    drafter_config_t dcfg;     /* capture layers and shapes */
    uint32_t token_budget, prefetch, outstanding;
    mb_t q[TW_MAX_QUEUE];
    int qn;
    grant_t g[TW_MAX_GRANTS];
    int gn;
    slab_handle_t slabs[SLOT_SLAB_MAX]; /* the routed drafter's inbox slabs by slot_slab_index */
    int have_slab[SLOT_SLAB_MAX];
    hcache_t *hc;
    int busy;
    uv_work_t work;
    mb_t cur;
    grant_t cur_g;
    uint8_t *cur_base;
    int cur_rc;
    char cur_err[512];   /* dl_errmsg() of a failed forward, copied on the pool thread */
    double cur_fwd_s, wait_since, idle_grant_since;
    double blocked_since;      /* a micro-batch in hand, no usable grant: waiting for credit */
    bus_timer_t *idle_timer;
    int32_t *cu;
    uint64_t done, tokens;
    double t_rate; uint64_t tokens_at; double rate;
    stage_rate_t rate_win;   /* tokens_per_s over the last 5 s */
    int next_route;            /* re-route asked for mid-forward: applied after it (-1 none) */
    int rewire;                /* the routed drafter moved node (CONTROL PLACEMENT): connect anew */
    int route_node;            /* the routed drafter's node when this target connected to it */
    uint64_t cur_inc;          /* drafter incarnation whose slot the forward in flight writes */
    int drop_pending;          /* the drafter restarted mid-forward: unmap its old slabs after it */
    int64_t fwd_delay_ms;      /* test hook target.forward_delay_ms: each forward takes this much longer */
    /* GPU mode (--gpu N >= 0) */
    int gpu;
    size_t elem;               /* feature element bytes: 4 (f32, CPU) or 2 (bf16, CUDA) */
    void *ev[TW_N_EVENTS];     /* interprocess events, created once */
    uint8_t evh[TW_N_EVENTS][64];
    int ev_next, cur_ev;
    void *scratch;             /* device (slot bytes): features for a host-tier grant */
    size_t scratch_bytes;
    /* the routed drafter on another node: features staged here, sent by xf */
    int remote;
    xfer_t *xf;                /* on the drafter DEALER; NULL when the drafter is local */
    uint8_t *staging;          /* host, one slot's bytes (staging_bytes): borrowed by xf until sent */
    int in_send;               /* inside after_work_cb's xfer_send (its done callback waits) */
    size_t staging_bytes;
    tw_nccl_t nc;              /* GPU drafter on another node: NCCL (nccl_out.c, hook nccl_cross=1) */
    gpu_turn_t turn;           /* a GPU shared with a drafter: one forward at a time (gputurn.h) */
    double cur_wait_gpu_s;     /* the forward in flight: its wait for the GPU's turn */
} tw_t;

static void pump(tw_t *T);
static int set_route(tw_t *T, int d);
static void on_nccl_ready(void *arg) { pump(arg); }

/* The staged features of a micro-batch are with the bus (or dropped): the staging
 * buffer is free for the next forward (not from inside after_work_cb's xfer_send:
 * it goes on with the micro-batch, then pumps). */
static void on_xfer_done(xfer_t *x, int status, void *arg) {
    tw_t *T = arg;
    (void)x; (void)status;
    if (!T->in_send) pump(T);
}

static void send_hello(tw_t *T, bus_t *b) {
    proto_msg_t h;
    proto_msg_init(&h, PROTO_HELLO);
    h.hello.role = PROTO_ROLE_TARGET;
    h.hello.stage_id = T->st.stage_id;
    h.hello.incarnation = T->st.incarnation;
    h.hello.pid = (uint32_t)getpid();
    h.hello.proto_version = DL_PROTO_VERSION;
    h.hello.capabilities = PROTO_CAP_SHM;
    /* its token for that receiver: the loader, or the routed drafter (membership) */
    stage_peer_token(&T->st, b == T->loader ? PIPE_ID_LOADER : PIPE_ID_DRAFTER0 + (uint32_t)T->route, &h.hello);
    stage_send(b, NULL, &h);
}

static void request_work(tw_t *T) {
    if (T->st.stopping) return;
    uint32_t want = T->prefetch > T->outstanding + (uint32_t)T->qn + (uint32_t)T->busy
                        ? T->prefetch - T->outstanding - (uint32_t)T->qn - (uint32_t)T->busy
                        : 0;
    if (!want) return;
    proto_msg_t m;
    proto_msg_init(&m, PROTO_WORK_REQUEST);
    m.work_request.target_id = T->st.stage_id;
    m.work_request.count = want;
    if (stage_send(T->loader, NULL, &m) == 0) T->outstanding += want;
}

static void work_run(uv_work_t *req) {
    tw_t *T = req->data;
    mb_t *m = &T->cur;
    uint64_t row = (uint64_t)T->dcfg.n_feat * (uint64_t)T->dcfg.D;
    T->cu[0] = 0;
    for (uint32_t s = 0; s < m->n_seqs; s++) T->cu[s + 1] = T->cu[s] + m->seq_lens[s];
    /* the GPU's turn (off unless it is shared): the forward runs alone on it, given
     * back after the stream sync below */
    T->cur_wait_gpu_s = gpu_turn_take(&T->turn, &T->st.stopping);
    double t0 = clock_mono_s();
    if (T->gpu >= 0) {
        /* features by device copies straight into the drafter's GPU slot (peer
         * memory when it is on another GPU), or via scratch into its host tier */
        int nccl = T->remote && T->nc.on;   /* features into scratch, then ncclSend */
        int host = !nccl && slot_slab_index(T->cur_g.slab_id) != SLOT_SLAB_GPU;
        void *stream = T->ops.stream;
        int rc = dev_set(T->gpu);   /* per thread: this is a libuv worker */
        if (rc == 0 && (host || nccl) && !T->scratch) {
            T->scratch = T->ops.impl->malloc_(&T->ops, T->scratch_bytes);
            if (!T->scratch) rc = dl_seterr(DL_ENOMEM, "device scratch of %zu bytes", T->scratch_bytes);
        }
        void *feat = host || nccl ? T->scratch : T->cur_base;
        if (rc == 0) rc = target_forward_host(T->t, m->tokens, NULL, T->cu, (int)m->n_seqs, (int)m->T, feat, NULL);
        if (rc == 0 && host) rc = dev_copy_async(T->cur_base, T->scratch, (size_t)m->T * row * T->elem, stream);
        T->cur_ev = T->ev_next;
        T->ev_next = (T->ev_next + 1) % TW_N_EVENTS;
        if (rc == 0) rc = dev_event_record(T->ev[T->cur_ev], stream);
        if (rc == 0) rc = dev_stream_sync(stream);   /* this stream only */
        gpu_turn_give(&T->turn);                      /* (CPU, test hook: work_cb gives it) */
        /* after the sync: the drafter posts its recv on hidden_states_ready, so the send
         * must not be waited for here; the next forward follows it on the stream */
        if (rc == 0 && nccl) rc = tw_nccl_send(&T->nc, T->scratch, (size_t)m->T * row * T->elem, stream);
        T->cur_rc = rc;
        T->cur_fwd_s = clock_mono_s() - t0;
        return;
    }
    /* features straight into the drafter's slot: no staging copy */
    T->cur_rc = target_forward_host(T->t, m->tokens, NULL, T->cu, (int)m->n_seqs, (int)m->T,
                                    T->cur_base, NULL);
    T->cur_fwd_s = clock_mono_s() - t0;
}

/* Runs on a libuv pool thread: the error detail is thread-local (err.h), so it is
 * copied here for after_work_cb, which runs on the loop thread. */
static void work_cb(uv_work_t *req) {
    tw_t *T = req->data;
    T->cur_err[0] = 0;
    if (T->fwd_delay_ms > 0) usleep((useconds_t)(T->fwd_delay_ms * 1000));
    work_run(req);
    gpu_turn_give(&T->turn);   /* the CPU path's (gpu_turns.cpu hook); the GPU path gave it after its sync */
    T->cur_fwd_s += T->fwd_delay_ms > 0 ? (double)T->fwd_delay_ms / 1e3 : 0;   /* counted as forward */
    if (T->cur_rc < 0) snprintf(T->cur_err, sizeof T->cur_err, "%s", dl_errmsg());
}

static void mb_free(mb_t *m) {
    free(m->tokens); free(m->seq_lens); free(m->mask);
    memset(m, 0, sizeof *m);
}

static void after_work_cb(uv_work_t *req, int status) {
    tw_t *T = req->data;
    (void)status;
    T->busy = 0;
    tw_nccl_after_work(&T->nc);
    mb_t *m = &T->cur;
    stage_phase_add(&T->st, PHASE_FORWARD, T->cur_fwd_s);
    stage_phase_add(&T->st, PHASE_WAIT_GPU, T->cur_wait_gpu_s);
    if (T->cur_rc < 0) {
        log_error("micro-batch %llu: target forward failed: %s", (unsigned long long)m->mb, T->cur_err);
        exit(1); /* the loader re-issues the work to another target */
    }
    uint64_t row = (uint64_t)T->dcfg.n_feat * (uint64_t)T->dcfg.D;
    pipe_layout_t l = pipe_layout(m->T, row, T->elem);
    proto_msg_t o;
    proto_msg_init(&o, PROTO_HIDDEN_STATES_READY);
    proto_hidden_states_ready_t *h = &o.hidden_states_ready;
    h->target_id = T->st.stage_id;
    h->drafter_id = PIPE_ID_DRAFTER0 + (uint32_t)T->route;
    h->slab_id = T->cur_g.slab_id;
    h->slot_id = T->cur_g.slot_id;
    h->tier = T->slabs[slot_slab_index(T->cur_g.slab_id)].kind == SLAB_CUDA ? PROTO_TIER_GPU : PROTO_TIER_HOST;
    h->offset = T->cur_g.offset;
    h->bytes = l.bytes;
    h->dtype = T->gpu >= 0 ? PROTO_DTYPE_BF16 : PROTO_DTYPE_F32;
    if (T->gpu >= 0) {
        memcpy(h->event, T->evh[T->cur_ev], 64);
        h->event_len = 64;
        snprintf(h->gpu_uuid, sizeof h->gpu_uuid, "%s", T->st.gpu_uuid);
    }
    h->ndim = 2;
    h->shape[0] = m->T;
    h->shape[1] = row;
    h->n_feat = (uint32_t)T->dcfg.n_feat;
    h->mb = m->mb;
    h->step = m->step;
    h->mb_in_step = m->mb_in_step;
    h->mbs_in_step = m->mbs_in_step;
    h->n_seqs = m->n_seqs;
    h->tokens = m->tokens;          /* ours until mb_free below: only read by the encoder */
    h->n_tokens = m->T;
    h->seq_lens = m->seq_lens;
    h->n_seq_lens = m->n_seqs;
    h->loss_mask = m->mask;
    h->n_loss_mask = m->T;
    if (T->cur_inc == T->drafter_inc && T->remote && T->nc.on) {
        stage_send(T->drafter, NULL, &o);   /* the bytes went by NCCL, before this */
    } else if (T->cur_inc == T->drafter_inc && T->remote) {
        /* the staged features into the granted slot, then the announcement; the
         * staging buffer is the source until the job is done (pump waits for it) */
        xfer_range_t r = {h->drafter_id, T->drafter_inc, T->cur_g.slab_id, T->cur_g.offset};
        T->in_send = 1;
        int rc = xfer_send(T->xf, NULL, &r, T->staging, l.feat_bytes, &o, on_xfer_done, T);
        T->in_send = 0;
        if (rc < 0) log_rc(rc, "send the hidden states to the drafter");
        stage_xfer_moved(&T->st);
    } else if (T->cur_inc == T->drafter_inc) {
        stage_send(T->drafter, NULL, &o);
    } else {
        /* the drafter restarted while this forward wrote into its predecessor's slot;
         * the new incarnation may have granted the same slot id to us, so it must not
         * hear of it: dropped (the loader re-issues the micro-batch) */
        log_warn("micro-batch %llu was written into drafter %d's previous incarnation: dropped",
                 (unsigned long long)m->mb, T->route);
    }
    if (T->drop_pending) {
        T->drop_pending = 0;
        hcache_drop_owner(T->hc, PIPE_ID_DRAFTER0 + (uint32_t)T->route);
        /* the new incarnation's slabs are mapped again on the next grant */
    }
    if (T->done == 0) {   /* start-up: how long the first one took (first-use set-up included) */
        char tw[64];
        log_info("micro-batch %llu, the first: %u tokens, forward %.2f s%s", (unsigned long long)m->mb, m->T,
                 T->cur_fwd_s, gpu_turn_waited(&T->turn, T->cur_wait_gpu_s, tw, sizeof tw));
    }
    T->done++;
    T->tokens += m->T;
    stage_progress(&T->st);
    mb_free(m);
    T->wait_since = clock_mono_s();
    if (T->next_route >= 0) {
        int d = T->next_route;
        T->next_route = -1;
        set_route(T, d);
    }
    request_work(T);
    pump(T);
}

/* Starts a forward when a micro-batch and a grant are both in hand. */
static void pump(tw_t *T) {
    if (T->busy || T->st.stopping) return;
    if (T->qn == 0) { T->st.state = PROTO_STATE_IDLE; return; }
    int held = T->remote && (T->nc.on ? !tw_nccl_ready(&T->nc) : xfer_pending(T->xf) || !T->staging);
    if (T->gn == 0 || T->route < 0 || held) {
        T->st.state = PROTO_STATE_BLOCKED;
        if (T->blocked_since == 0) T->blocked_since = clock_mono_s();
        return;
    }
    mb_t *m = &T->q[0];
    uint64_t row = (uint64_t)T->dcfg.n_feat * (uint64_t)T->dcfg.D;
    pipe_layout_t l = pipe_layout(m->T, row, T->elem);
    int gi = -1;
    for (int i = 0; i < T->gn; i++) if (T->g[i].bytes >= l.bytes && T->have_slab[slot_slab_index(T->g[i].slab_id)]) { gi = i; break; }
    if (gi < 0) {
        T->st.state = PROTO_STATE_BLOCKED;
        if (T->blocked_since == 0) T->blocked_since = clock_mono_s();
        return;
    }
    void *base = NULL;
    if (T->remote && !T->nc.on && l.bytes > T->staging_bytes) {
        log_error("grant of slot %u is larger than the staging buffer", T->g[gi].slot_id);
        T->g[gi] = T->g[--T->gn];
        return;
    }
    int rc = T->remote ? 0 : hcache_get(T->hc, &T->slabs[slot_slab_index(T->g[gi].slab_id)], &base);
    if (rc < 0) { log_rc(rc, "map the drafter's inbox"); return; }
    if (T->g[gi].offset + l.bytes > T->slabs[slot_slab_index(T->g[gi].slab_id)].bytes) {
        log_error("grant of slot %u lies outside the drafter's slab", T->g[gi].slot_id);
        T->g[gi] = T->g[--T->gn];
        return;
    }
    T->cur = *m;
    memmove(&T->q[0], &T->q[1], (size_t)(T->qn - 1) * sizeof(mb_t));
    T->qn--;
    T->cur_g = T->g[gi];
    T->cur_inc = T->drafter_inc;
    T->g[gi] = T->g[--T->gn];
    T->cur_base = T->remote ? T->staging : (uint8_t *)base + T->cur_g.offset;
    double now = clock_mono_s();
    /* idle since the last micro-batch = waiting for input, then (with one in hand)
     * waiting for credit from the drafter */
    double credit = T->blocked_since > 0 ? now - T->blocked_since : 0;
    stage_phase_add(&T->st, PHASE_WAIT_CREDIT, credit);
    stage_phase_add(&T->st, PHASE_WAIT_INPUT, now - T->wait_since - credit);
    T->blocked_since = 0;
    T->busy = 1;
    T->st.state = PROTO_STATE_RUNNING;
    T->work.data = T;
    uv_queue_work(&T->st.loop, &T->work, work_cb, after_work_cb);
}

static void on_loader_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)bus; (void)peer;
    tw_t *T = arg;
    proto_msg_t m;
    if (stage_decode(T->st.name, "loader", data, len, &m) < 0) return;
    if (m.type == PROTO_MICRO_BATCH) {
        const proto_micro_batch_t *x = &m.micro_batch;
        if (T->outstanding) T->outstanding--;
        if (x->n_tokens > T->token_budget || T->qn == TW_MAX_QUEUE) {
            log_error("micro-batch %llu of %u tokens refused (budget %u, queue %d)",
                      (unsigned long long)x->mb, x->n_tokens, T->token_budget, T->qn);
        } else {
            mb_t *q = &T->q[T->qn];
            q->mb = x->mb; q->step = x->step; q->mb_in_step = x->mb_in_step;
            q->mbs_in_step = x->mbs_in_step; q->n_seqs = x->n_seqs; q->T = x->n_tokens;
            q->tokens = malloc((size_t)x->n_tokens * 4);
            q->seq_lens = malloc((size_t)x->n_seqs * 4);
            q->mask = malloc(x->n_tokens);
            if (q->tokens && q->seq_lens && q->mask) {
                memcpy(q->tokens, x->tokens, (size_t)x->n_tokens * 4);
                memcpy(q->seq_lens, x->seq_lens, (size_t)x->n_seqs * 4);
                memcpy(q->mask, x->loss_mask, x->n_tokens);
                T->qn++;
            } else {
                mb_free(q);
                log_error("out of memory queueing micro-batch %llu", (unsigned long long)x->mb);
            }
        }
        pump(T);
    } else {
        log_warn("unexpected %s from the loader", proto_type_name(m.type));
    }
    proto_msg_free(&m);
}

static void forget_drafter(tw_t *T) {
    T->gn = 0;
    memset(T->have_slab, 0, sizeof T->have_slab);
    /* a forward in flight writes into the old mapping: unmap after it (after_work_cb) */
    if (T->busy) T->drop_pending = 1;
    else if (T->route >= 0) hcache_drop_owner(T->hc, PIPE_ID_DRAFTER0 + (uint32_t)T->route);
    tw_nccl_drop(&T->nc, T->busy);
}

/* The staging buffer of a cross-node route: allocated at the first grant (one slot's
 * bytes; a larger grant, never seen in practice, grows it while nothing uses it).
 * 1 when it holds `bytes`; 0 after logging (the grant is handed back). */
static int staging_alloc(tw_t *T, uint64_t bytes) {
    if (bytes <= T->staging_bytes) return 1;
    if (T->busy || xfer_pending(T->xf)) {
        log_warn("a grant of %llu bytes while the staging buffer of %zu bytes is in use: ignored",
                 (unsigned long long)bytes, T->staging_bytes);
        return 0;
    }
    free(T->staging);
    T->staging = malloc(bytes);
    T->staging_bytes = T->staging ? bytes : 0;
    if (!T->staging) log_error("out of memory for the staging buffer (%llu bytes)", (unsigned long long)bytes);
    return T->staging != NULL;
}

static void on_drafter_writable(bus_t *bus, void *arg) {
    (void)bus;
    xfer_resume(((tw_t *)arg)->xf);
}

static void on_drafter_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)bus; (void)peer;
    tw_t *T = arg;
    proto_msg_t m;
    if (stage_decode(T->st.name, "drafter", data, len, &m) < 0) return;
    uint32_t want = PIPE_ID_DRAFTER0 + (uint32_t)T->route;
    switch (m.type) {
    case PROTO_SLAB_EXPORT: {
        const proto_slab_export_t *e = &m.slab_export;
        /* inbox slab ids carry the drafter's incarnation (common/pipe/slot.h) */
        if (e->owner_id != want || slot_slab_index(e->slab_id) < SLOT_SLAB_GPU) {
            log_warn("slab export from owner %u (routed to %u): ignored", e->owner_id, want);
            break;
        }
        if (e->incarnation != T->drafter_inc) {
            forget_drafter(T);
            T->drafter_inc = e->incarnation;
        }
        slab_handle_t *h = &T->slabs[slot_slab_index(e->slab_id)];
        stage_slab_from_export(e, h);   /* a CUDA slab gets its cache key from (owner, incarnation, id) */
        if (h->kind == SLAB_CUDA && T->gpu < 0) {
            log_error("drafter %u exports GPU memory but this target runs on CPU (start it with --gpu)", e->owner_id);
            break;
        }
        T->have_slab[slot_slab_index(e->slab_id)] = 1;
        break;
    }
    case PROTO_SLOT_GRANT:
        if (m.slot_grant.drafter_id != want || m.slot_grant.target_id != T->st.stage_id ||
            T->gn == TW_MAX_GRANTS) {
            log_warn("slot grant from drafter %u not for us: ignored", m.slot_grant.drafter_id);
            break;
        }
        if (T->remote && !T->nc.on && !staging_alloc(T, m.slot_grant.bytes)) {
            proto_msg_t r;   /* handed back unused, so the drafter's credit is not lost */
            proto_msg_init(&r, PROTO_SLOT_RELEASE);
            r.slot_release.drafter_id = want;
            r.slot_release.slot_id = m.slot_grant.slot_id;
            r.slot_release.mb = DL_PROTO_MB_NONE;
            stage_send(T->drafter, NULL, &r);
            break;
        }
        T->g[T->gn++] = (grant_t){m.slot_grant.slot_id, m.slot_grant.slab_id, m.slot_grant.offset,
                                  m.slot_grant.bytes};
        pump(T);
        break;
    case PROTO_NCCL_ID:   /* our pair with a GPU drafter on another node (hook nccl_cross=1) */
        tw_nccl_on_id(&T->nc, &m.nccl_id, T->st.stage_id, T->st.incarnation, want, T->drafter_inc, T->busy);
        break;
    default:
        log_warn("unexpected %s from the drafter", proto_type_name(m.type));
    }
    proto_msg_free(&m);
}

static void on_drafter_new(bus_t *bus, const char *peer, void *arg) {
    (void)peer;
    tw_t *T = arg;
    send_hello(T, bus); /* the drafter came (back): it must know us to grant */
}

/* A drafter that left (goodbye), or across nodes by NCCL: its grants are void. A
 * drafter only silent (stalled, SIGSTOP): its grants are kept, since it keeps them
 * reserved for us (drafter_worker's on_target_dead) and takes what we write into them
 * when it wakes up; if it died instead, its new incarnation's slab export replaces them
 * (on_drafter_msg: forget_drafter), and what we announced to the dead one is re-issued
 * by the loader. */
static void on_drafter_dead(bus_t *bus, const char *peer, uint64_t ms, void *arg) {
    (void)bus; (void)peer;
    tw_t *T = arg;
    if (ms != BUS_PEER_LEFT && !T->nc.on) {
        log_warn("drafter %d silent for %llu ms: keeping its %d grant(s) until it is heard again or restarts",
                 T->route, (unsigned long long)ms, T->gn);
        return;
    }
    if (ms != BUS_PEER_LEFT) log_warn("drafter %d silent for %llu ms: its grants are void", T->route, (unsigned long long)ms);
    forget_drafter(T);
}

static int set_route(tw_t *T, int d) {
    if (d == T->route && T->drafter && !T->rewire) {
        send_hello(T, T->drafter); /* the drafter may have restarted: it must know us */
        return 0;
    }
    if (T->drafter) {
        /* hand back unused grants of the old route */
        for (int i = 0; i < T->gn; i++) {
            proto_msg_t m;
            proto_msg_init(&m, PROTO_SLOT_RELEASE);
            m.slot_release.drafter_id = PIPE_ID_DRAFTER0 + (uint32_t)T->route;
            m.slot_release.slot_id = T->g[i].slot_id;
            m.slot_release.mb = DL_PROTO_MB_NONE;
            stage_send(T->drafter, NULL, &m);
        }
        forget_drafter(T);
        xfer_destroy(&T->xf);   /* staged bytes not yet with the bus are dropped with the route */
        bus_destroy(&T->drafter);
    }
    T->route = d;
    T->rewire = 0;
    T->route_node = runcfg_stage_node(T->st.cfg, PIPE_ID_DRAFTER0 + (uint32_t)d);
    T->drafter_inc = 0;
    T->remote = stage_remote(&T->st, PIPE_ID_DRAFTER0 + (uint32_t)d);
    if (T->remote && T->gpu >= 0 && !T->nc.on) {
        const run_config_t *c = T->st.cfg;
        int me = c->node, dn = runcfg_stage_node(c, PIPE_ID_DRAFTER0 + (uint32_t)d);
        log_error("target on GPU %d of node %d (%s) is routed to drafter %d on node %d (%s): GPU stages on "
                  "different nodes need NCCL, which is not built yet (place GPU targets on their drafter's node)",
                  T->gpu, me, c->node_addr[me], d, dn, c->node_addr[dn]);
        exit(1);
    }
    char ep[32];
    pipe_drafter_endpoint(d, ep, sizeof ep);
    T->drafter = stage_bus(&T->st, BUS_DEALER, ep);
    if (!T->drafter) return log_rc(DL_EIO, "connect to the routed drafter");
    bus_on_message(T->drafter, on_drafter_msg, T);
    bus_on_peer_new(T->drafter, on_drafter_new, T);
    bus_on_peer_dead(T->drafter, on_drafter_dead, T);
    if (T->remote) {
        T->xf = xfer_new(T->drafter, &T->st.xfer_bytes_out);
        if (!T->xf) return log_rc(DL_ENOMEM, "cross-node sender");
        bus_on_writable(T->drafter, on_drafter_writable, T);
    }
    send_hello(T, T->drafter);
    log_info("routed to drafter %d%s", d, T->remote ? " (on another node: hidden states sent as slab_data)" : "");
    return 0;
}

/* A grant held while this target has no work blocks other targets of the same
 * drafter when its inbox has fewer slots than targets: hand it back after
 * PIPE_IDLE_GRANT_S without work (protocol: slot_release with mb = MB_NONE). */
#define PIPE_IDLE_GRANT_S 0.2
static void on_idle_timer(bus_t *bus, void *arg) {
    (void)bus;
    tw_t *T = arg;
    double now = clock_mono_s();
    if (T->gn == 0 || T->qn > 0 || T->busy || !T->drafter) { T->idle_grant_since = now; return; }
    if (now - T->idle_grant_since < PIPE_IDLE_GRANT_S) return;
    for (int i = 0; i < T->gn; i++) {
        proto_msg_t m;
        proto_msg_init(&m, PROTO_SLOT_RELEASE);
        m.slot_release.drafter_id = PIPE_ID_DRAFTER0 + (uint32_t)T->route;
        m.slot_release.slot_id = T->g[i].slot_id;
        m.slot_release.mb = DL_PROTO_MB_NONE;
        stage_send(T->drafter, NULL, &m);
    }
    log_debug("handed back %d idle grant(s)", T->gn);
    T->gn = 0;
    T->idle_grant_since = now;
}

static void on_control(stage_t *st, const proto_control_t *c, void *arg) {
    tw_t *T = arg;
    if (c->op == PROTO_CTL_PLACEMENT && T->drafter && T->route >= 0 &&
        runcfg_stage_node(st->cfg, PIPE_ID_DRAFTER0 + (uint32_t)T->route) != T->route_node) {
        /* a rebalance across nodes (the table is already the new one): the drafter this
         * target is routed to moves to another node, so its endpoint (and whether it is
         * remote) changes; its grants are void there. Reconnect now, or after the
         * forward in progress (next_route) */
        T->rewire = 1;
        if (T->busy) T->next_route = T->route;
        else set_route(T, T->route), pump(T);
        return;
    }
    if (c->op != PROTO_CTL_ROUTE) return;
    /* a route push follows a restart of the loader or a drafter: introduce ourselves
     * again and renew the work credit (a new loader knows none; extra credit only
     * prefetches a little more) */
    send_hello(T, T->loader);
    T->outstanding = 0;
    request_work(T);
    for (uint32_t i = 0; i + 1 < c->n_ints; i += 2)
        if ((uint32_t)c->ints[i] == st->stage_id) {
            int64_t d = c->ints[i + 1] - PIPE_ID_DRAFTER0;
            if (d < 0 || d >= PIPE_MAX_DRAFTERS) { log_warn("route to stage %lld ignored", (long long)c->ints[i + 1]); return; }
            if (T->busy && (d != T->route || T->rewire)) {
                /* the forward is writing into the old drafter's slot (mapped): the
                 * switch (which unmaps it) waits until that micro-batch is handed over */
                log_info("re-route to drafter %lld while writing: applied after this micro-batch", (long long)d);
                T->next_route = (int)d;
                return;
            }
            T->next_route = -1;
            set_route(T, (int)d);
            pump(T);
        }
}

static void on_metrics(stage_t *st, proto_metrics_t *m, void *arg) {
    tw_t *T = arg;
    (void)st;
    double now = clock_mono_s();
    if (!T->busy && !T->st.stopping) {
        /* the wait in progress, split as pump() will account it when it ends */
        double credit = T->blocked_since > 0 ? now - T->blocked_since : 0;
        stage_metric_add(m, "wait_credit_s", credit);
        stage_metric_add(m, "wait_input_s", now - T->wait_since - credit);
    }
    T->rate = stage_rate(&T->rate_win, now, (double)T->tokens, 5.0);   /* over the last 5 s */
    stage_metric(m, "tokens_per_s", T->rate);
    stage_metric(m, "done", (double)T->done);
    stage_metric(m, "tokens", (double)T->tokens);
    stage_metric(m, "queued", T->qn);
    stage_metric(m, "grants", T->gn);
    stage_metric(m, "route", T->route);
    stage_metric(m, "handle_opens", (double)hcache_opens(T->hc));
}

static void on_stop(stage_t *st, void *arg) {
    tw_t *T = arg;
    st->state = PROTO_STATE_STOPPING;
    if (T->loader) bus_close(T->loader, NULL, NULL);
    if (T->drafter) bus_close(T->drafter, NULL, NULL);
    stage_close(st);
}

static void usage(FILE *f) {
    fprintf(f,
        "usage: target_worker --index I --run-dir DIR --incarnation N [--log-level L]\n"
        "Pipeline stage 2: target forward with hidden-state capture into the routed drafter's inbox.\n"
        "Started by `draftline run`; every setting (target model, drafter route, token budget,\n"
        "prefetch, threads, GPU, ...) comes from the run configuration the supervisor sends first\n"
        "(common/pipe/runcfg.h).\n\n"
        "  --index I                  target index (stage id 200+I)\n"
        "  --run-dir DIR              sockets directory of the run (holds the supervisor's sup.sock)\n"
        "  --incarnation N            restart count given by the supervisor (default 1)\n"
        "  --log-level L              error|warn|info|debug\n"
        "  -h, --help                 this help\n");
}

/* The compute set-up from the run configuration c, as the flags of the same names did:
 * the drafter config check, the ops (CUDA device, or CPU threads), the target model.
 * Returns 0, or main's exit status after logging why (PIPE_EXIT_PERMANENT for config,
 * model files, a GPU in a build without CUDA; 1 for a CUDA device error). */
static int tw_setup(tw_t *T, const run_config_t *c) {
    const char *model = c->target_model;
    T->token_budget = c->token_budget;
    T->prefetch = c->prefetch;
    model_config_t mc;
    int rc = pipe_target_config(model, &mc);
    if (rc < 0) return log_rc(rc, "target config"), PIPE_EXIT_PERMANENT;
    rc = pipe_drafter_config(&mc, (int)c->drafter_layers, 0, (int)c->block_size, &T->dcfg);
    if (rc < 0) return log_rc(rc, "drafter config"), PIPE_EXIT_PERMANENT;
    T->gpu = runcfg_stage_gpu(c, PIPE_ID_TARGET0 + (uint32_t)T->index);
    T->elem = 4;
    if (T->gpu >= 0) {
        if (!dev_available()) {
            log_error("--gpu %d: this build has no CUDA", T->gpu);
            return PIPE_EXIT_PERMANENT;
        }
        /* CUDA is initialised here, after exec: nothing CUDA crossed the fork */
        rc = ops_cuda_init(&T->ops, T->gpu);
        /* no CUDA device, or no such ordinal: a restart would fail the same way */
        if (rc < 0) return log_rc(rc, "CUDA device (--gpu)"), rc == DL_ENOENT || rc == DL_EINVAL ? PIPE_EXIT_PERMANENT : 1;
        T->elem = ops_act_bytes(&T->ops);
        for (int i = 0; i < TW_N_EVENTS && rc == 0; i++) rc = dev_event_create(&T->ev[i], T->evh[i]);
        if (rc < 0) return log_rc(rc, "interprocess events"), 1;
    } else {
        ops_cpu_init(&T->ops, (int)c->threads);
    }
    target_opts_t to = {0};
    to.max_tokens = (int)T->token_budget;
    to.max_seqs = (int)T->token_budget;
    to.n_capture = T->dcfg.n_feat;
    to.precision = c->target_precision;
    memcpy(to.capture_ids, T->dcfg.target_layer_ids, sizeof(int) * (size_t)T->dcfg.n_feat);
    /* The load converts the weights on OpenMP threads and is CPU-bound: Qwen3-8B's 16.4 GB
     * took 2.8-3.1 s on --threads 8 and 1.74 s on 16 (bench_target --load-only, H200
     * host). Start-up waits for it, and the other stages are loading too: it takes this
     * host's cores shared among the targets on it, --threads at least. */
    int thr = omp_get_max_threads(), here = 0;
    for (int i = 0; i < c->n_targets; i++) here += c->target_node[i] == c->node;
    int load_thr = omp_get_num_procs() / (here > 0 ? here : 1);
    if (load_thr > thr) omp_set_num_threads(load_thr);
    double t0 = clock_mono_s();
    rc = target_load(model, &T->ops, &to, &T->t);
    omp_set_num_threads(thr);
    if (rc < 0) return log_rc(rc, "load target"), PIPE_EXIT_PERMANENT;
    log_info("target %s loaded in %.1f s (%.0f MB of %s weights, on %d threads), capturing %d layer(s) from "
             "layer %d", model, clock_mono_s() - t0, target_weight_bytes(T->t) / 1e6,
             target_precision_name(c->target_precision), load_thr > thr ? load_thr : thr, T->dcfg.n_feat,
             T->dcfg.target_layer_ids[0]);
    return 0;
}

int main(int argc, char **argv) {
    log_init("target", LOG_INFO);
    static tw_t T;
    static run_config_t cfg;
    T.next_route = -1;
    T.route = -1;
    gpu_turn_init(&T.turn);
    stage_args_t a;
    if (stage_args(argc, argv, "target_worker", PIPE_MAX_TARGETS - 1, usage, &a) < 0) return a.exit_code;
    T.index = a.index;
    char name[32];
    snprintf(name, sizeof name, "target%d", T.index);
    log_init(name, log_get_level());
    int rc = stage_config(PROTO_ROLE_TARGET, PIPE_ID_TARGET0 + (uint32_t)T.index, name, &a,
                          STAGE_CONFIG_TIMEOUT_MS, &cfg);
    if (rc < 0) return log_rc(rc, "run configuration"), 1;
    int drafter = (int)cfg.target_drafter[T.index];
    rc = tw_setup(&T, &cfg);
    if (rc) return rc;
    T.cu = malloc(((size_t)T.token_budget + 2) * 4);
    if (!T.cu) return 1;
    rc = stage_init(&T.st, PROTO_ROLE_TARGET, PIPE_ID_TARGET0 + (uint32_t)T.index, name, &a, &cfg);
    if (rc < 0) return log_rc(rc, "stage init"), 1;
    hcache_new(&T.hc, T.gpu);
    if (T.gpu >= 0) {
        rc = dev_uuid(T.gpu, T.st.gpu_uuid, sizeof T.st.gpu_uuid);
        T.scratch_bytes = (size_t)T.token_budget * T.dcfg.n_feat * T.dcfg.D * T.elem;
        if (rc < 0) return log_rc(rc, "GPU UUID"), 1;
        T.st.gpu_index = T.gpu;
        log_info("on GPU %d (%s)", T.gpu, T.st.gpu_uuid);
    }
    if (gpu_turn_setup(&T.turn, &cfg, PIPE_ID_TARGET0 + (uint32_t)T.index, T.st.run_dir) < 0)
        log_warn("GPU turns: %s; this target time-slices the GPU", dl_errmsg());
    T.loader = stage_bus(&T.st, BUS_DEALER, "loader");
    if (!T.loader) return log_rc(DL_EIO, "connect to the loader"), 1;
    bus_on_message(T.loader, on_loader_msg, &T);
    send_hello(&T, T.loader);
    if (tw_nccl_init(&T.nc, T.gpu, &T.st.loop, on_nccl_ready, &T) < 0) return log_rc(DL_ENOTSUP, "nccl_cross"), 1;
    if (set_route(&T, drafter) < 0) return 1;
    stage_on_metrics(&T.st, on_metrics, &T);
    stage_on_control(&T.st, on_control, &T);
    stage_on_stop(&T.st, on_stop, &T);
    T.t_rate = T.wait_since = clock_mono_s();
    T.st.state = PROTO_STATE_IDLE;
    testhook_i64("target.forward_delay_ms", &T.fwd_delay_ms);   /* read once, at start-up */
    request_work(&T);
    T.idle_grant_since = clock_mono_s();
    bus_timer_start(T.loader, 50, 50, on_idle_timer, &T, &T.idle_timer);
    stage_run(&T.st);
    tw_nccl_fini(&T.nc);
    uint64_t opens = hcache_opens(T.hc);
    xfer_destroy(&T.xf);
    free(T.staging);
    bus_destroy(&T.loader);
    bus_destroy(&T.drafter);
    stage_fini(&T.st);
    gpu_turn_close(&T.turn);
    hcache_destroy(&T.hc);
    for (int i = 0; i < TW_N_EVENTS; i++) dev_event_destroy(T.ev[i]);
    if (T.scratch) T.ops.impl->free_(&T.ops, T.scratch);
    target_destroy(&T.t);
    ops_ctx_destroy(&T.ops);
    for (int i = 0; i < T.qn; i++) mb_free(&T.q[i]);
    free(T.cu);
    log_info("stopped: %llu micro-batches, %llu tokens, %llu handle opens", (unsigned long long)T.done,
             (unsigned long long)T.tokens, (unsigned long long)opens);
    return 0;
}
