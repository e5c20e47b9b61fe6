/* optimizer: the last pipeline stage. Owns the fp32 master weights of the
 * drafter, the Adam moments, the step counter, the learning-rate schedule and the
 * ledger of applied micro-batches.
 *
 * Each drafter sends one gradients_ready per micro-batch it computed (the
 * gradient of that micro-batch's summed weighted loss, f32, in the drafter's
 * shared gradient slab at the slot of its index within the step). Step A is
 * applied only when every micro-batch A*K .. A*K+K-1 has contributed exactly once;
 * a second contribution of an mb (re-computation after a crash) or one for a step
 * already applied is dropped. The step's gradient is the sum over its
 * micro-batches in mb order (fixed order: bitwise reproducible whatever the
 * topology and arrival order), divided by the step's total loss weight, so it is
 * the gradient of the mean weighted loss over all trained positions of the step.
 * Then: global-norm clipping, AdamW (ops adamw; decoupled weight decay on matrices
 * only), learning rate with linear warmup and cosine decay to 10% (min_lr), new
 * weights published into the weights slab (double-buffered by version: version v
 * lives in half v % 2, so drafters still reading v-1 never see a torn write), and
 * weights_version sent to every drafter, applied sent to the loader and supervisor.
 * A step whose loss or gradient norm is NaN/Inf is skipped (weights unchanged,
 * the micro-batches reported) and counted.
 * Checkpoints every --save-every steps and at the end (common/pipe/ckpt.h), by the writer
 * of ckpt_write.c (opt_int.h): a snapshot of the state off the loop thread (GPU: pinned
 * host memory on a copy stream), during which no step is applied, then the files from the
 * snapshot on a worker thread while steps go on; the loop keeps heartbeating however long
 * either takes. The final step's news (weights, applied, metrics, steps.jsonl) wait for
 * its checkpoint.
 *
 * GPU mode (--gpu N, CUDA builds; `draftline run` puts it on the first drafter GPU):
 * master weights, moments and the step's gradient live on GPU N; the weights slab is
 * device memory exported by CUDA IPC; the drafters' gradient slabs are device memory
 * mapped here once per drafter incarnation (a drafter on another GPU is read over
 * NVLink/PCIe peer access). The in-order sum (ops f32_add_scale), the norm (sumsq)
 * and AdamW run on the device; bitwise the same arithmetic as the CPU path. AdamW
 * writes the published weights as it goes (adamw_pub), and one micro-batch in this
 * GPU's memory is read where it is, scaled on the fly (sumsq_scaled; step_math.c): with
 * one micro-batch 4 passes over the parameters become 2 (else K + 2 instead of K + 3),
 * the same bits. Only the
 * gradient norm (4 bytes) comes to the host per step, and the state at checkpoints.
 * Cross-GPU gradients use peer reads of IPC mappings rather than NCCL: a drafter can
 * die, restart or leave at any step, and a mapping per drafter incarnation follows
 * that membership with no collective to re-form.
 *
 * Drafters on other nodes (multi-node CPU runs, docs/MULTINODE.md section 4) are never
 * mapped: each one's gradient slab has a mirror here (host memory of its slab_export's
 * size, replaced with each incarnation) that its slab_data fill before its
 * gradients_ready; the step sums from there exactly as from a mapped slab (same order,
 * same arithmetic). The new weights go to them as slab_data (the version's half of the
 * weights slab) before weights_version; a step is applied only when no weights are
 * still waiting for the bus (their source is the weights slab). GPU optimizers with
 * drafters on other nodes need NCCL: refused at start unless the test hook nccl_cross=1
 * is set (nccl_step.c: the step communicator, opt_int.h).
 */
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/testhook.h"
#include "common/data/batcher.h"
#include "common/mem/dev.h"
#include "common/mem/hcache.h"
#include "common/mem/slab.h"
#include "common/model/drafter.h"
#include "common/ops/ops.h"
#include "common/pipe/ckpt.h"
#include "common/pipe/model.h"
#include "common/pipe/gputurn.h"
#include "common/pipe/peers.h"
#include "common/pipe/runcfg.h"
#include "common/pipe/stage.h"
#include "common/pipe/xfer.h"
#include "common/rundir/rundir.h"
#include "optimizer/opt_int.h"

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* What the optimizer keeps per drafter beside the registry (same index). */
typedef struct {
    slab_handle_t grad;        /* its gradient slab (from slab_export) */
    int have_grad;
    int remote;                /* on another node: grad is mirrored, never mapped */
    int retired;               /* left the membership (supervisor): not revived by its heartbeats */
    uint8_t *mirror;           /* (grad.bytes) its gradient slab's bytes, from slab_data */
    uint64_t rx;               /* bytes received since its last gradients_ready */
} dpeer_t;

typedef struct {
    int present;
    int peer;
    const float *g;            /* mapped gradient (P f32) */
    double loss_sum, weight_sum;
    uint64_t tokens;
    float acc[DL_PROTO_MAX_BLOCK];
    uint32_t n_acc;
} contrib_t;

typedef struct {
    stage_t st;
    bus_t *srv;                /* ROUTER: drafters */
    bus_t *loader;             /* DEALER to the loader */
    ops_ctx_t ops;             /* where the step runs: CPU, or CUDA device --gpu */
    ops_ctx_t lops;            /* CPU: the layout drafter's (host) */
    int gpu;                   /* -1: CPU */
    gpu_turn_t turn;           /* its GPU shared by stages taking turns: each step in a turn (gputurn.h) */
    drafter_t *layout;         /* parameter layout and names (never runs forward) */
    drafter_config_t dcfg;
    size_t P;
    float *master, *m, *v, *gsum, *norm_sq;  /* on the ops backend (device on GPU) */
    float *h_master, *h_m, *h_v;  /* CPU: the state itself (== the above). GPU: pageable (a
                                     resume reads into them), then the checkpoint writer's
                                     snapshot buffers (NULL here; it pins them) */
    slab_t *wslab;             /* 2 * P f32: weights of versions v%2 (device on GPU) */
    hcache_t *hc;
    peers_t peers;             /* the drafters that said hello (common/pipe/peers.h) */
    dpeer_t dp[PEERS_MAX];     /* their gradient slabs, by registry index */
    /* schedule and state */
    uint64_t step, max_steps, K, save_every, warmup, seed, tokens, skipped, last_ckpt;
    double lr, wd, clip, b1, b2, eps;
    contrib_t *c;              /* (K) contributions of the current step */
    const float **gk;          /* (K) their gradients, for opt_step_grad */
    uint64_t dup_dropped, stale_dropped;
    const char *out;
    uint8_t cursor[BATCHER_CURSOR_BYTES];
    int have_cursor;
    /* run settings recorded in each checkpoint for `draftline run --resume`'s check
     * (--token-budget etc.; 0 token budget: not given, nothing recorded) */
    uint32_t rec_tb, rec_ml, rec_na, rec_ep, rec_bs, rec_dl;
    uint64_t rec_tfp;
    rundir_steps_t *steps_log;     /* <out>/steps.jsonl */
    double t_step0;
    struct { int done; double grads_t, map_s; } first;   /* this incarnation's first step: when its
                                  gradients were all taken, their mapping's time (its line) */
    double last_loss, last_gnorm, last_lr;
    /* --keep-checkpoints (0: keep all) and the checkpoint resumed from (protected from
     * the retention until a newer one is written; "" when not resumed) */
    int64_t keep_ckpts;
    uint64_t resume_step;
    char resume_dir[4200];
    int ckpt_written;          /* a checkpoint was written by this incarnation (ckpt_step metric) */
    /* across nodes: weights to remote drafters (source: the weights slab) */
    xfer_t *xf;                /* on srv */
    xfer_rx_t rx;
    ons_t *ns;                 /* GPU drafters on other nodes: NCCL (nccl_step.c; hook nccl_cross=1) */
    int in_apply;
    /* checkpoints: snapshot, then files on a worker thread (ckpt_write.c; made at the first) */
    ockw_t *ck;                /* made at start-up (opt_ckpt_init) */
    int stop_pending, ck_stop_tried;
    double stop_ckpt_s;        /* the stop's checkpoint: wait + snapshot + files, s (0: none) */
    uint64_t ck_logged;        /* the checkpoint whose times went on a steps.jsonl line (0: none) */
    int64_t ck_delay_ms;       /* test hook optimizer.ckpt_delay_ms: each write that much slower */
    int64_t ck_fail_step;      /* test hook optimizer.ckpt_fail_step: that step's write fails (-1 none) */
    int ckpt_failures;         /* checkpoints that could not be written (ckpt_failures metric) */
    uint64_t ckpt_failed_step;
    /* the applied step whose news wait for the final checkpoint (publish_step) */
    struct { uint64_t applied, toks; double loss, gnorm, lr; int skip; uint32_t n_acc;
             double acc[DL_PROTO_MAX_BLOCK]; } pub;
} opt_t;

static float *wbuf(opt_t *O, uint64_t version) {
    return (float *)slab_ptr(O->wslab) + (version % 2) * O->P;
}

static void maybe_apply(opt_t *O);
static void on_turn(void *arg);

/* Weights handed to the bus: a step that waited for its half of the slab may run. */
static void on_weights_sent(xfer_t *x, int status, void *arg) {
    opt_t *O = arg;
    (void)x; (void)status;
    if (!O->in_apply) maybe_apply(O);
}

static void send_weights(opt_t *O, int i) {
    proto_msg_t m;
    proto_msg_init(&m, PROTO_WEIGHTS_VERSION);
    m.weights_version.version = O->step;
    m.weights_version.slab_id = slab_handle(O->wslab)->slab_id;
    m.weights_version.offset = (O->step % 2) * O->P * sizeof(float);
    m.weights_version.bytes = O->P * sizeof(float);
    m.weights_version.n_params = O->P;
    m.weights_version.dtype = PROTO_DTYPE_F32;
    if (O->ns && O->dp[i].remote) {   /* NCCL: one broadcast per version, this message per member */
        if (ons_member(O->ns, i) && ons_weights(O->ns, wbuf(O, O->step), O->P * sizeof(float), O->step) == 0)
            stage_send(O->srv, O->peers.p[i].id, &m);
        return;   /* not a member yet: its generation's ready callback sends them */
    }
    if (!O->dp[i].remote || !O->xf) {
        stage_send(O->srv, O->peers.p[i].id, &m);
        return;
    }
    /* another node: the version's half first; the slab half is its source until sent
     * (maybe_apply: no step rewrites the slab while weights are pending) */
    xfer_range_t r = {PIPE_ID_OPTIMIZER, O->st.incarnation, m.weights_version.slab_id, m.weights_version.offset};
    int rc = xfer_send(O->xf, O->peers.p[i].id, &r, wbuf(O, O->step), O->P * sizeof(float), &m, on_weights_sent, O);
    if (rc < 0) log_rc(rc, "send the weights");
    stage_xfer_moved(&O->st);
}

static void publish_step(opt_t *O);
static void opt_stop(opt_t *O);
static void send_hello(opt_t *O);

/* The checkpoint's snapshot is complete: steps may be applied again. */
static void ck_snapped(void *arg) {
    opt_t *O = arg;
    if (!O->in_apply) maybe_apply(O);
}

/* A checkpoint was written (rc 0) or not (rc < 0, logged by the writer): its metrics,
 * then what waited for it (the final step's news, the stop, the next step). */
static void ck_done(void *arg, uint64_t step, int rc, int then) {
    opt_t *O = arg;
    if (rc < 0) {
        /* training goes on (the next checkpoint tries again); the supervisor says it on
         * the console at once and in status (metrics ckpt_failures, ckpt_failed_step) */
        O->ckpt_failures++;
        O->ckpt_failed_step = step;
    } else {
        O->last_ckpt = step;
        O->ckpt_written = 1;
        ockw_times_t ct = {0};
        /* the final checkpoint of a stopped run (`draftline stop`, SIGTERM): its time for the
         * summary, as the ckpt_s of a --max-steps run's final step line gives it */
        if (then == OCKW_THEN_STOP && ockw_times(O->ck, &ct) && ct.step == step)
            O->stop_ckpt_s = ct.waited_s + ct.snap_s + ct.write_s;
    }
    /* at once (not at the next 1 s tick): a supervisor on another node learns of it */
    stage_publish_metrics(&O->st);
    if (then == OCKW_THEN_PUBLISH) {
        O->in_apply = 1;
        publish_step(O);
        O->in_apply = 0;
    }
    if (then == OCKW_THEN_STOP || O->stop_pending) opt_stop(O);
    else maybe_apply(O);
}

/* Starts the checkpoint of step O->step (ckpt_write.c: snapshot, then the files on a
 * worker thread; ck_snapped, then ck_done with `then`). The header and cursor are taken
 * now. */
static void checkpoint(opt_t *O, int then) {
    ckpt_state_hdr_t h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.version = CKPT_VERSION;   /* ckpt_write sets it too */
    h.header_bytes = sizeof h;
    h.step = O->step;
    h.n_params = O->P;
    h.seed = O->seed;
    h.tokens = O->tokens;
    h.skipped_steps = O->skipped;
    h.mbs_per_step = O->K;
    h.lr = O->lr; h.warmup_steps = (double)O->warmup; h.max_steps = (double)O->max_steps;
    h.wd = O->wd; h.clip = O->clip;
    if (O->rec_tb) {
        h.settings = CKPT_SETTINGS_V1;
        h.token_budget = O->rec_tb; h.max_len = O->rec_ml; h.num_anchors = O->rec_na; h.epochs = O->rec_ep;
        h.block_size = O->rec_bs; h.drafter_layers = O->rec_dl; h.target_fp = O->rec_tfp;
    }
    uint8_t cur[BATCHER_CURSOR_BYTES];
    if (O->have_cursor) {
        batcher_cursor_t c;
        batcher_cursor_decode(O->cursor, sizeof O->cursor, &c);
        c.next_mb = O->step * O->K;
        batcher_cursor_encode(&c, cur);
    }
    ockw_start(O->ck, &h, O->have_cursor ? cur : NULL, O->master, O->m, O->v, then);
}

/* APPLIED of `step` to the loader (after a hello: it takes applied from a member only, a
 * restarted optimizer too) and / or the supervisor. */
static void send_applied(opt_t *O, uint64_t step, int loader, int sup) {
    uint64_t mbs[DL_PROTO_MAX_MBS];
    for (uint64_t j = 0; j < O->K; j++) mbs[j] = step * O->K + j;
    proto_msg_t a;
    proto_msg_init(&a, PROTO_APPLIED);
    a.applied = (proto_applied_t){.step = step, .mbs = mbs, .n_mbs = (uint32_t)O->K};
    if (loader) {
        send_hello(O);
        stage_send(O->loader, NULL, &a);
    }
    if (sup) stage_send(O->st.sup, NULL, &a);
}

static void apply_step(opt_t *O) {
    double t0 = clock_mono_s();
    ockw_pin_hold(O->ck, 1);   /* the writer's pinning waits: our CUDA calls first */
    size_t P = O->P;
    uint64_t K = O->K;
    double L = 0, W = 0;
    uint64_t toks = 0;
    double acc[DL_PROTO_MAX_BLOCK] = {0};
    uint32_t n_acc = 0;
    for (uint64_t j = 0; j < K; j++) {
        L += O->c[j].loss_sum;
        W += O->c[j].weight_sum;
        toks += O->c[j].tokens;
        if (O->c[j].n_acc > n_acc) n_acc = O->c[j].n_acc;
        for (uint32_t k = 0; k < O->c[j].n_acc; k++) acc[k] += O->c[j].acc[k] * (double)O->c[j].tokens;
    }
    /* Fixed-order sum (mb order) per element: bitwise reproducible. */
    float inv_w = W > 0 ? (float)(1.0 / W) : 0.0f;
    const float *gsrc;
    for (uint64_t j = 0; j < K; j++) O->gk[j] = O->c[j].g;
    const dpeer_t *p0 = &O->dp[O->c[0].peer];
    int g0_here = O->gpu >= 0 && (p0->remote ||   /* remote: NCCL landed it on this GPU */
                  !strcmp(p0->grad.gpu_uuid, slab_handle(O->wslab)->gpu_uuid));
    float gscale, norm_sq = opt_step_grad(&O->ops, O->gpu >= 0, O->gk, K, inv_w, P, g0_here,
                                          O->gsum, O->norm_sq, &gsrc, &gscale);
    double gnorm = sqrt((double)norm_sq);
    double loss = W > 0 ? L / W : NAN;
    double lr = opt_lr_at(O->lr, O->warmup, O->max_steps, O->step);
    int skip = !isfinite(loss) || !isfinite(gnorm);
    if (skip) {
        char list[512];
        int n = 0;
        for (uint64_t j = 0; j < K && n < (int)sizeof list - 24; j++)
            n += snprintf(list + n, sizeof list - (size_t)n, "%s%llu", j ? "," : "",
                          (unsigned long long)(O->step * K + j));
        log_warn("step %llu skipped: loss %g, gradient norm %g (NaN/Inf) in micro-batches [%s]",
                 (unsigned long long)O->step, loss, gnorm, list);
        O->skipped++;
    } else {
        /* the new weights also into the slab half of the next version (published below) */
        opt_adamw_t a = {(float)lr, (float)O->b1, (float)O->b2, (float)O->eps, (float)O->wd,
                         (int)(O->step + 1), (float)O->clip};
        opt_step_adamw(&O->ops, O->layout, &a, O->master, wbuf(O, O->step + 1), gsrc, gscale,
                       O->m, O->v, O->norm_sq);
    }
    uint64_t applied = O->step;
    O->step++;
    O->tokens += toks;
    memset(O->c, 0, K * sizeof *O->c);
    /* publish: the drafters read the slab once weights_version arrives (GPU: the
     * writes are complete before the message leaves); a skipped step publishes the
     * weights unchanged */
    const ops_impl_t *x = O->ops.impl;
    if (skip) x->copy(&O->ops, wbuf(O, O->step), O->master, P * sizeof(float));
    x->sync(&O->ops);
    gpu_turn_give(&O->turn);
    ockw_pin_hold(O->ck, 0);
    double dt = clock_mono_s() - t0;
    char tw[64];   /* the first step's line: what it waited for */
    if (!O->first.done && (O->first.done = 1))
        log_info("step %llu, the first: gradients mapped (or their NCCL receives posted) in %.2f s, then %.2f s "
                 "to the step%s, applied in %.2f s", (unsigned long long)applied, O->first.map_s,
                 t0 - O->first.grads_t, gpu_turn_waited(&O->turn, O->turn.last_wait_s, tw, sizeof tw), dt);
    stage_phase_add(&O->st, PHASE_STEP, dt);
    stage_progress(&O->st);
    O->last_loss = loss; O->last_gnorm = gnorm; O->last_lr = lr;
    /* The last step is checkpointed BEFORE anyone but the loader hears of it: its `applied`
     * starts the supervisor's stop (a death during the final write is then an ordinary death
     * mid-run). The loader only forgets the step's work; told after the write, its stall
     * watchdog re-issued it (a --save-every write that holds the steps alike: not handled). */
    O->pub.applied = applied; O->pub.toks = toks; O->pub.loss = loss; O->pub.gnorm = gnorm; O->pub.lr = lr;
    O->pub.skip = skip; O->pub.n_acc = n_acc;
    memcpy(O->pub.acc, acc, sizeof acc);
    if (O->step == O->max_steps) send_applied(O, applied, 1, 0);     /* the loader first */
    if (O->step == O->max_steps) checkpoint(O, OCKW_THEN_PUBLISH);   /* ck_done publishes */
    else publish_step(O);
}

/* The news of the step just applied (O->pub): new weights to every drafter, applied to the
 * loader and the supervisor, its metrics, its steps.jsonl line; then the --save-every
 * checkpoint. The final step comes here after its checkpoint (ck_after). */
static void publish_step(opt_t *O) {
    uint64_t applied = O->pub.applied, toks = O->pub.toks;
    double loss = O->pub.loss, gnorm = O->pub.gnorm, lr = O->pub.lr;
    int skip = O->pub.skip;
    uint32_t n_acc = O->pub.n_acc;
    const double *acc = O->pub.acc;
    int final = O->step == O->max_steps;
    /* new weights to every drafter, then the ledger news */
    for (int i = 0; i < O->peers.n; i++) if (O->peers.p[i].alive) send_weights(O, i);
    send_applied(O, applied, !final, 1);   /* the final step's reached the loader already */
    /* per-step metrics: loss and per-position accuracy for the supervisor's progress */
    double now = clock_mono_s();
    proto_msg_t mm;
    proto_msg_init(&mm, PROTO_METRICS);
    mm.metrics.stage_id = O->st.stage_id;
    mm.metrics.role = PROTO_ROLE_OPTIMIZER;
    mm.metrics.incarnation = O->st.incarnation;
    mm.metrics.ts_ns = (uint64_t)(clock_wall_s() * 1e9);
    snprintf(mm.metrics.state, sizeof mm.metrics.state, "step");
    stage_metric(&mm.metrics, "step", (double)applied);
    stage_metric(&mm.metrics, "loss", loss);
    stage_metric(&mm.metrics, "grad_norm", gnorm);
    stage_metric(&mm.metrics, "lr", lr);
    stage_metric(&mm.metrics, "tokens", (double)O->tokens);
    stage_metric(&mm.metrics, "step_tokens", (double)toks);
    stage_metric(&mm.metrics, "skipped", skip);
    stage_metric(&mm.metrics, "elapsed_s", now - O->t_step0);
    char name[16];
    double accm = 0;
    for (uint32_t k = 1; k < n_acc; k++) {
        double a_k = toks ? acc[k] / (double)toks : 0;
        accm += a_k;
        if (k < 16) { snprintf(name, sizeof name, "acc_%u", k); stage_metric(&mm.metrics, name, a_k); }
    }
    stage_metric(&mm.metrics, "acc_mean", n_acc > 1 ? accm / (n_acc - 1) : 0);
    /* a checkpoint written since the last line: its times (the final one's for the summary) */
    ockw_times_t ct = {0};
    int has_ck = ockw_times(O->ck, &ct) && ct.step != O->ck_logged;
    if (has_ck) O->ck_logged = ct.step;
    if (has_ck && final) stage_metric(&mm.metrics, "ckpt_s", ct.waited_s + ct.snap_s + ct.write_s);   /* its wait for the previous write too */
    stage_send(O->st.sup, NULL, &mm);
    if (O->steps_log) {
        rundir_step_t sl = {applied, loss, gnorm, lr, O->tokens, skip, n_acc > 1 ? accm / (n_acc - 1) : 0.0,
                            now - O->t_step0};
        rundir_step_ckpt_t sc = {ct.step, ct.waited_s, ct.snap_s, ct.write_s};
        rundir_steps_append_ck(O->steps_log, &sl, has_ck ? &sc : NULL);
    }
    log_info("step %llu applied: loss %.4f, |g| %.3g, lr %.3g, %llu tokens", (unsigned long long)applied,
             loss, gnorm, lr, (unsigned long long)toks);
    if (!final && O->save_every && O->step % O->save_every == 0) checkpoint(O, OCKW_THEN_NONE);
    if (O->step == O->max_steps) log_info("reached --max-steps %llu", (unsigned long long)O->max_steps);
}

static void on_grads_checked(opt_t *O, int pi, const proto_gradients_ready_t *g);

static void on_grads(opt_t *O, int pi, const proto_gradients_ready_t *g) {
    on_grads_checked(O, pi, g);
    ons_drain(O->ns, pi, g->bytes);   /* a member's send not taken: received all the same */
    O->dp[pi].rx = 0;   /* the next announcement counts its own bytes */
}

static void on_grads_checked(opt_t *O, int pi, const proto_gradients_ready_t *g) {
    if (g->step < O->step) { O->stale_dropped++; return; }          /* already applied */
    if (O->max_steps && g->step >= O->max_steps) { O->stale_dropped++; return; }
    if (g->step > O->step || g->weights_version != O->step) {
        log_warn("%s: gradients for step %llu with weights %llu while at step %llu: dropped",
                 O->peers.p[pi].id, (unsigned long long)g->step,
                 (unsigned long long)g->weights_version, (unsigned long long)O->step);
        O->stale_dropped++;
        return;
    }
    if (g->n_mbs != 1 || g->n_params != O->P || g->bytes != O->P * 4) {
        log_warn("%s: gradients_ready with %u micro-batches / %llu params: expected 1 / %zu",
                 O->peers.p[pi].id, g->n_mbs, (unsigned long long)g->n_params, O->P);
        return;
    }
    uint64_t mb = g->mbs[0];
    if (mb / O->K != g->step) { log_warn("micro-batch %llu is not in step %llu", (unsigned long long)mb, (unsigned long long)g->step); return; }
    contrib_t *c = &O->c[mb % O->K];
    if (c->present) { O->dup_dropped++; log_info("duplicate of micro-batch %llu dropped", (unsigned long long)mb); return; }
    dpeer_t *p = &O->dp[pi];
    if (!p->have_grad || p->grad.slab_id != g->slab_id || g->offset + g->bytes > p->grad.bytes) {
        log_warn("%s: gradients in an unknown slab %u / out of range", O->peers.p[pi].id, g->slab_id);
        return;
    }
    if (p->remote && O->gpu < 0 && p->rx != g->bytes) {
        log_warn("%s: gradients of micro-batch %llu announced with %llu of their %llu bytes received: dropped",
                 O->peers.p[pi].id, (unsigned long long)mb, (unsigned long long)p->rx, (unsigned long long)g->bytes);
        return;
    }
    void *base = p->mirror;   /* another node: the mirror its slab_data filled */
    double t_map = O->first.done ? 0 : clock_mono_s();   /* the first step's line only */
    int rc = p->remote ? ons_take(O->ns, pi, mb % O->K, g->offset, g->bytes, &base)   /* GPU: NCCL */
                       : hcache_get(O->hc, &p->grad, &base);
    if (rc < 0) { log_rc(rc, "map drafter gradients"); return; }
    if (!O->first.done) O->first.map_s += clock_mono_s() - t_map, O->first.grads_t = clock_mono_s();
    c->present = 1;
    c->peer = pi;
    c->g = (const float *)((const uint8_t *)base + g->offset);
    c->loss_sum = g->loss_sum;
    c->weight_sum = g->weight_sum;
    c->tokens = g->n_tokens;
    c->n_acc = g->n_acc;
    memcpy(c->acc, g->acc, g->n_acc * sizeof(float));
    maybe_apply(O);
}

/* Applies the step once every micro-batch contributed and no weights wait for the bus
 * (their source is the slab half the step would rewrite two versions on). */
static void maybe_apply(opt_t *O) {
    if (ockw_holds_steps(O->ck) || O->stop_pending) return;   /* ck_snapped / ck_done call again */
    for (uint64_t j = 0; j < O->K; j++) if (!O->c[j].present) return;
    if (xfer_pending(O->xf)) return;   /* on_weights_sent calls again */
    if (ons_busy(O->ns)) return;       /* NCCL transfers outstanding: its landed callback calls again */
    /* the GPU's turn (gputurn.h), waited for off the loop thread: on_turn calls again */
    if (!gpu_turn_ready(&O->turn, &O->st.loop, &O->st.stopping, on_turn, O)) return;
    O->in_apply = 1;
    apply_step(O);
    O->in_apply = 0;
}

/* The GPU's turn came (or its take went on without it): the step if it is still due and
 * the stage is not stopping (stage_fini drains the loop after the buses are gone), else
 * the turn goes back (applied: apply_step gave it). */
static void on_turn(void *arg) {
    opt_t *O = arg;
    stage_phase_add(&O->st, PHASE_WAIT_GPU, O->turn.last_wait_s);
    if (!O->in_apply && !O->st.stopping) maybe_apply(O);
    gpu_turn_give(&O->turn);
}

/* A drafter exported its gradient slab (O->dp[i].grad). A local one's is mapped now (CUDA
 * IPC or shared memory), before the first step needs it: 0 (a failure is logged, and the map
 * tried again at its first gradients). Another node's: its mirror, allocated once per
 * incarnation (the hello of a new one freed the old): 0, or DL_ENOMEM logged. */
static int grad_slab_ready(opt_t *O, int i) {
    dpeer_t *p = &O->dp[i];
    void *gb;
    int rc = p->remote ? 0 : hcache_get(O->hc, &p->grad, &gb);
    if (rc < 0) log_rc(rc, "map drafter gradients (tried again at its first gradients)");
    if (!p->remote || p->mirror || O->gpu >= 0) return 0;   /* GPU: NCCL lands in ons' buffer */
    p->mirror = calloc(1, p->grad.bytes);
    if (!p->mirror)
        return log_error("%s: out of memory for the mirror of its gradient slab (%llu bytes)", O->peers.p[i].id,
                         (unsigned long long)p->grad.bytes), DL_ENOMEM;
    return 0;
}

/* The step communicator's news (nccl_step.c): transfers done, a slot's bytes lost, a new
 * generation ready (its members get the current weights). */
static void ons_landed(void *arg) {
    opt_t *O = arg;
    if (!O->in_apply) maybe_apply(O);
}

static void ons_lost(void *arg, uint64_t k) { ((opt_t *)arg)->c[k].present = 0; }

static void ons_ready(void *arg) {
    opt_t *O = arg;
    for (int i = 0; i < O->peers.n; i++) if (O->peers.p[i].alive && ons_member(O->ns, i)) send_weights(O, i);
}

static void on_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)bus;
    opt_t *O = arg;
    proto_msg_t m;
    if (stage_decode("optimizer", peer, data, len, &m) < 0) return;
    int i = peers_find(&O->peers, peer);
    switch (m.type) {
    case PROTO_HELLO: {   /* only drafters of this run (stage_admit: a refused one changes nothing) */
        int n = O->peers.n;
        peers_hello_t what;
        i = stage_admit(&O->st, &O->peers, O->srv, peer, &m.hello, PIPE_ID_DRAFTER0,
                        PIPE_ID_DRAFTER0 + PIPE_MAX_DRAFTERS, &what, NULL);
        if (i < 0) break;
        if (i >= n) memset(&O->dp[i], 0, sizeof O->dp[i]);
        /* a new incarnation (or the first): what an earlier one exported is gone */
        if (what != PEERS_SAME) {
            hcache_drop_owner(O->hc, m.hello.stage_id);
            O->dp[i].have_grad = 0;
            free(O->dp[i].mirror);   /* another node: replaced at its new slab_export */
            O->dp[i].mirror = NULL;
            O->dp[i].rx = 0;
            /* its unapplied contributions point into a dead mapping: forget them */
            for (uint64_t j = 0; j < O->K; j++)
                if (O->c[j].present && O->c[j].peer == i) O->c[j].present = 0;
        }
        O->dp[i].remote = stage_remote(&O->st, m.hello.stage_id);
        O->dp[i].retired = 0;
        log_info("hello from %s (drafter %u, incarnation %llu%s)", peer, m.hello.stage_id,
                 (unsigned long long)m.hello.incarnation, O->dp[i].remote ? ", on another node" : "");
        proto_msg_t ex;   /* the weights slab, then its version */
        stage_slab_export_msg(slab_handle(O->wslab), slab_handle(O->wslab)->slab_id, &ex);
        stage_send(O->srv, peer, &ex);
        send_weights(O, i);
        break;
    }
    case PROTO_SLAB_EXPORT:
        if (i < 0) { stage_refuse(&O->st, O->srv, peer, m.type, "not a member's verified peer (no hello)"); break; }
        stage_slab_from_export(&m.slab_export, &O->dp[i].grad);
        /* the sum reads gradients where the step runs: device memory on GPU, host on CPU */
        if ((O->dp[i].grad.kind == SLAB_CUDA) != (O->gpu >= 0)) {
            log_error("%s: gradient slab in %s memory, but this optimizer runs on %s: ignored "
                      "(start drafters and optimizer both with or both without --gpu)", peer,
                      O->dp[i].grad.kind == SLAB_CUDA ? "GPU" : "host", O->gpu >= 0 ? "a GPU" : "the CPU");
            O->dp[i].have_grad = 0;
            break;
        }
        O->dp[i].have_grad = grad_slab_ready(O, i) == 0;
        break;
    case PROTO_SLAB_DATA: {   /* a drafter on another node: its gradient slot */
        dpeer_t *p = i >= 0 ? &O->dp[i] : NULL;
        xfer_dest_t d = {0};
        if (p) d = (xfer_dest_t){O->peers.p[i].stage_id, p->grad.incarnation, p->grad.slab_id,
                                 p->have_grad ? p->mirror : NULL, p->grad.bytes, 0, 0};
        if (xfer_recv(&O->rx, "optimizer", peer, &m.slab_data, p ? &d : NULL) == 0) {
            p->rx += m.slab_data.n_data;
            O->st.xfer_bytes_in = O->rx.bytes_in;
            stage_xfer_moved(&O->st);
        }
        break;
    }
    case PROTO_GRADIENTS_READY:
        if (i >= 0) on_grads(O, i, &m.gradients_ready);
        else stage_refuse(&O->st, O->srv, peer, m.type, "not a member's verified peer (no hello)");
        break;
    case PROTO_NCCL_ID:   /* a member's echo: its ranks of the step communicator are ready */
        ons_echo(O->ns, i, peer, &m.nccl_id);
        break;
    default:
        log_warn("unexpected %s from %s", proto_type_name(m.type), peer);
    }
    proto_msg_free(&m);
}

static void on_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg) {
    (void)bus;
    opt_t *O = arg;
    int i = peers_find(&O->peers, peer);
    if (i < 0) return;
    if (silent_ms == BUS_PEER_LEFT) log_info("%s left", peer);   /* an orderly close */
    else log_warn("%s silent for %llu ms", peer, (unsigned long long)silent_ms);
    O->peers.p[i].alive = 0;
}

/* A drafter heard again after it fell silent (stalled, SIGSTOP; the bus calls it a new
 * peer): alive again, and it gets the current weights, which it missed while it was
 * silent (without them it would hold its micro-batches, waiting for a version that
 * never comes). A dead drafter restarts and says hello instead; one the supervisor
 * retired stays out. */
static void on_back(bus_t *bus, const char *peer, void *arg) {
    (void)bus;
    opt_t *O = arg;
    int i = peers_find(&O->peers, peer);
    if (i < 0 || O->peers.p[i].alive || O->dp[i].retired) return;
    O->peers.p[i].alive = 1;
    log_info("%s heard again: weights of step %llu sent again", peer, (unsigned long long)O->step);
    send_weights(O, i);
}

/* MEMBERSHIP from the supervisor: drafters retired by a rebalance (ints: stage ids).
 * They get no more weights; contributions they made stay (their gradient slab is
 * still mapped here, and the sum is in micro-batch order whoever computed it). */
static void on_control(stage_t *st, const proto_control_t *c, void *arg) {
    opt_t *O = arg;
    (void)st;
    if (c->op != PROTO_CTL_MEMBERSHIP) return;
    for (uint32_t j = 0; j < c->n_ints; j++)
        for (int i = 0; i < O->peers.n; i++)
            if (O->peers.p[i].stage_id == (uint32_t)c->ints[j]) {
                O->peers.p[i].alive = 0;
                O->dp[i].retired = 1;
                /* its gradient slab stays mapped while a pending contribution points
                 * into it; else the mapping is closed now */
                int used = 0;
                for (uint64_t k = 0; k < O->K; k++) used |= O->c[k].present && O->c[k].peer == i;
                if (!used && O->dp[i].have_grad) {
                    hcache_drop_owner(O->hc, O->peers.p[i].stage_id);
                    O->dp[i].have_grad = 0;
                    free(O->dp[i].mirror);
                    O->dp[i].mirror = NULL;
                }
                log_info("%s left the membership%s", O->peers.p[i].id, used ? "" : " (mapping closed)");
            }
}

static void on_metrics(stage_t *st, proto_metrics_t *m, void *arg) {
    opt_t *O = arg;
    (void)st;
    stage_metric(m, "step", (double)O->step);
    stage_metric(m, "loss", O->last_loss);
    stage_metric(m, "grad_norm", O->last_gnorm);
    stage_metric(m, "lr", O->last_lr);
    stage_metric(m, "tokens", (double)O->tokens);
    stage_metric(m, "skipped_steps", (double)O->skipped);
    stage_metric(m, "dup_dropped", (double)O->dup_dropped);
    stage_metric(m, "stale_dropped", (double)O->stale_dropped);
    stage_metric(m, "handle_opens", (double)hcache_opens(O->hc));
    if (O->ckpt_written) stage_metric(m, "ckpt_step", (double)O->last_ckpt);
    if (O->stop_ckpt_s > 0) stage_metric(m, "final_ckpt_s", O->stop_ckpt_s);
    if (O->ckpt_failures) {
        stage_metric(m, "ckpt_failures", O->ckpt_failures);
        stage_metric(m, "ckpt_failed_step", (double)O->ckpt_failed_step);
    }
    int have = 0;
    for (uint64_t j = 0; j < O->K; j++) have += O->c[j].present;
    stage_metric(m, "step_contributions", have);
}

/* The stop: a checkpoint of the last applied step unless it has one (after the one in
 * flight, if any: ck_after calls again), then the sockets close. */
static void opt_stop(opt_t *O) {
    O->stop_pending = 1;
    if (ockw_busy(O->ck)) return;   /* ck_done calls again */
    if (O->step != O->last_ckpt && !O->ck_stop_tried) {
        O->ck_stop_tried = 1;
        checkpoint(O, OCKW_THEN_STOP);
        return;
    }
    if (O->srv) bus_close(O->srv, NULL, NULL);
    if (O->loader) bus_close(O->loader, NULL, NULL);
    stage_close(&O->st);
}

static void on_stop(stage_t *st, void *arg) {
    st->state = PROTO_STATE_STOPPING;
    opt_stop(arg);
}

/* The settings of the run configuration c, as the flags of the same names gave them
 * (the run's token budget, effective max_len, anchors, epochs, target fingerprint,
 * block size and layers only recorded in each checkpoint's state.bin for `draftline
 * run --resume`). */
static void opt_settings(opt_t *O, const run_config_t *c) {
    O->out = c->out_dir;
    O->lr = c->lr; O->wd = c->weight_decay; O->clip = c->clip;
    O->warmup = c->warmup_steps;
    O->max_steps = c->max_steps;
    O->K = c->mbs_per_step;
    O->save_every = c->save_every;
    O->keep_ckpts = c->keep_checkpoints;
    O->seed = c->seed;
    O->gpu = runcfg_stage_gpu(c, PIPE_ID_OPTIMIZER);
    O->rec_tb = c->token_budget;
    O->rec_ml = c->max_len > 0 && c->max_len < c->token_budget ? c->max_len : c->token_budget;
    O->rec_na = c->num_anchors;
    O->rec_ep = c->epochs;
    O->rec_tfp = c->target_fp;
    O->rec_bs = c->block_size;
    O->rec_dl = c->drafter_layers;
}

/* The backend state (the host arrays themselves on CPU, device copies on GPU), the
 * weights slab holding version O->step, and the handle cache. Logs and returns a
 * negative error code on failure. */
static int opt_state_init(opt_t *O, const char *run_id, int64_t inc) {
    const ops_impl_t *x = O->ops.impl;
    if (O->gpu >= 0) {
        size_t b = O->P * 4;
        O->master = x->malloc_(&O->ops, b); O->m = x->malloc_(&O->ops, b); O->v = x->malloc_(&O->ops, b);
        O->gsum = x->malloc_(&O->ops, b); O->norm_sq = x->malloc_(&O->ops, sizeof(float));
        if (!O->master || !O->m || !O->v || !O->gsum || !O->norm_sq) {
            log_error("GPU %d: out of memory for the optimizer state (%zu parameters: %.2f GiB)", O->gpu,
                      O->P, 4.0 * b / 1073741824.0);
            return DL_ENOMEM;
        }
        /* fresh: the seeded init on the device, bitwise the host's (ARCHITECTURE: Start-up) */
        drafter_init_info_t ii;
        double t0 = clock_mono_s();
        int rc = O->h_m ? 0 : drafter_init_master_on(O->layout, O->seed, &O->ops, O->master, 0, &ii);
        if (rc < 0) return log_rc(rc, "drafter init on the GPU");
        if (!O->h_m)
            log_info("seeded init %s GPU %d: %.2f s, %llu normals (%llu near a float rounding midpoint, "
                     "recomputed on the host: %llu rewritten)", ii.on_device ? "on" : "on the host (the device's "
                     "near list overflowed), uploaded to", O->gpu, clock_mono_s() - t0,
                     (unsigned long long)ii.normals, (unsigned long long)ii.near, (unsigned long long)ii.fixed);
        if (O->h_m) {   /* resumed */
            x->upload(&O->ops, O->master, O->h_master, b);
            x->upload(&O->ops, O->m, O->h_m, b);
            x->upload(&O->ops, O->v, O->h_v, b);
        } else {        /* fresh moments: zeros, nothing to upload */
            x->memset0(&O->ops, O->m, b);
            x->memset0(&O->ops, O->v, b);
        }
    } else {
        O->master = O->h_master; O->m = O->h_m; O->v = O->h_v;
        O->gsum = malloc(O->P * 4); O->norm_sq = malloc(sizeof(float));
        if (!O->gsum || !O->norm_sq) { log_error("out of memory for %zu parameters", O->P); return DL_ENOMEM; }
    }
    int rc = slab_create(&O->wslab, O->gpu >= 0 ? SLAB_CUDA : SLAB_HOST, run_id, "optimizer", PIPE_ID_OPTIMIZER,
                     (uint64_t)inc, 1, "wts", 2 * O->P * sizeof(float), O->gpu, 0);
    if (rc < 0) return log_rc(rc, "weights slab");
    x->copy(&O->ops, wbuf(O, O->step), O->master, O->P * 4);
    x->sync(&O->ops);
    hcache_new(&O->hc, O->gpu);
    return 0;
}

/* The checkpoint writer, before stage_init. GPU: the host start-up copies become its
 * snapshot buffers (it allocates the missing ones and pins all of them, in pieces, on a
 * thread of its own while the steps run). */
static int opt_ckpt_init(opt_t *O) {
    ockw_cfg_t kc = {O->out, O->layout, O->P, O->gpu, O->keep_ckpts, O->resume_dir, O->resume_step,
                     O->ck_delay_ms, O->ck_fail_step, {NULL, NULL, NULL}, {0, 0, 0}};
    if (O->gpu >= 0) {
        float **h[3] = {&O->h_master, &O->h_m, &O->h_v};
        for (int i = 0; i < 3; i++) {
            kc.snap[i] = *h[i];
            *h[i] = NULL;   /* the writer's from here on: never read as the current state */
        }
    }
    ockw_cb_t kb = {ck_snapped, ck_done, O};
    int rc = ockw_new(&O->ck, &O->st.loop, &kc, &kb);
    return rc < 0 ? log_rc(rc, "checkpoint writer") : 0;
}

/* The host state: on CPU the state itself (h_m, h_v zeros); on GPU pageable buffers (the
 * master's, h_m and h_v only to resume into) that the checkpoint writer pins in 64 MiB
 * pieces after start-up (pinning at start-up cost ~1.9 s per 4 GB). 0 or DL_ENOMEM. */
static int opt_host_alloc(opt_t *O, int resumed) {
    size_t b = O->P * 4;
    if (O->gpu < 0) {
        O->h_master = malloc(b); O->h_m = calloc(O->P, 4); O->h_v = calloc(O->P, 4);
    } else {
        O->h_master = ockw_host_buffer(b, "optimizer start-up (master)");
        if (resumed) {
            O->h_m = ockw_host_buffer(b, "optimizer start-up (Adam m)");
            O->h_v = ockw_host_buffer(b, "optimizer start-up (Adam v)");
        }
    }
    if (!O->h_master || ((O->gpu < 0 || resumed) && (!O->h_m || !O->h_v))) {
        log_error("out of memory for %zu parameters", O->P);
        return DL_ENOMEM;
    }
    return 0;
}

static void on_srv_writable(bus_t *bus, void *arg) {
    (void)bus;
    xfer_resume(((opt_t *)arg)->xf);
}

/* The sender of weights to drafters on other nodes (multi-node runs only; none on one
 * host). A GPU optimizer with a drafter on another node is refused (exit 1). */
static int opt_xfer_init(opt_t *O) {
    const run_config_t *c = O->st.cfg;
    for (int i = 0; i < c->n_drafters; i++) {
        uint32_t id = PIPE_ID_DRAFTER0 + (uint32_t)i;
        if (O->gpu < 0 || !stage_remote(&O->st, id) || O->ns) continue;   /* O->ns: by NCCL */
        int me = c->node, dn = runcfg_stage_node(c, id);
        log_error("optimizer on GPU %d of node %d (%s), drafter %d on node %d (%s): GPU stages on different nodes "
                  "need NCCL, which is not built yet (place the optimizer with its drafters)", O->gpu, me,
                  c->node_addr[me], i, dn, c->node_addr[dn]);
        exit(1);
    }
    if (!c->net_port) return 0;
    O->xf = xfer_new(O->srv, &O->st.xfer_bytes_out);
    if (!O->xf) return log_rc(DL_ENOMEM, "cross-node sender");
    bus_on_writable(O->srv, on_srv_writable, O);
    return 0;
}

/* Says hello to the loader (it learns of applied steps from us). */
static void send_hello(opt_t *O) {
    proto_msg_t h;
    proto_msg_init(&h, PROTO_HELLO);
    h.hello.role = PROTO_ROLE_OPTIMIZER;
    h.hello.stage_id = PIPE_ID_OPTIMIZER;
    h.hello.incarnation = O->st.incarnation;
    h.hello.pid = (uint32_t)getpid();
    h.hello.proto_version = DL_PROTO_VERSION;
    h.hello.capabilities = PROTO_CAP_SHM;
    stage_peer_token(&O->st, PIPE_ID_LOADER, &h.hello);
    stage_send(O->loader, NULL, &h);
}

/* Releases what main and opt_state_init made (after stage_run). */
static void opt_fini(opt_t *O) {
    ons_destroy(&O->ns);
    xfer_destroy(&O->xf);
    for (int i = 0; i < PEERS_MAX; i++) free(O->dp[i].mirror);
    bus_destroy(&O->srv);
    bus_destroy(&O->loader);
    stage_fini(&O->st);
    gpu_turn_close(&O->turn);
    hcache_destroy(&O->hc);
    ockw_destroy(&O->ck);   /* before the device's context goes (its copy stream) */
    slab_destroy(&O->wslab);
    drafter_destroy(&O->layout);
    if (O->gpu >= 0) {
        void *dev[] = {O->master, O->m, O->v, O->gsum, O->norm_sq};
        for (size_t j = 0; j < sizeof dev / sizeof dev[0]; j++) O->ops.impl->free_(&O->ops, dev[j]);
    } else {
        free(O->gsum); free(O->norm_sq);
    }
    ops_ctx_destroy(&O->ops);
    ops_ctx_destroy(&O->lops);
    free(O->h_master); free(O->h_m); free(O->h_v);   /* GPU: NULL (the writer's) */
    free(O->c); free(O->gk);
}

int main(int argc, char **argv) {
    log_init("optimizer", LOG_INFO);
    static opt_t O;
    static run_config_t cfg;
    O.b1 = 0.9; O.b2 = 0.999; O.eps = 1e-8;
    gpu_turn_init(&O.turn);
    stage_args_t a;
    if (stage_args(argc, argv, "optimizer", 0, opt_usage, &a) < 0) return a.exit_code;
    int64_t inc = (int64_t)a.incarnation;
    double t_up[8] = {clock_mono_s()};   /* start-up phases, logged once up (issue 14: measure it) */
    int rc = stage_config(PROTO_ROLE_OPTIMIZER, PIPE_ID_OPTIMIZER, "optimizer", &a, STAGE_CONFIG_TIMEOUT_MS, &cfg);
    if (rc < 0) return log_rc(rc, "run configuration"), 1;
    opt_settings(&O, &cfg);
    const char *model = cfg.target_model;
    const char *resume = cfg.resume_dir[0] ? cfg.resume_dir : NULL;
    const char *cursor_base = cfg.cursor_base[0] ? cfg.cursor_base : NULL;
    int layers = (int)cfg.drafter_layers, B = (int)cfg.block_size;
    model_config_t mc;
    rc = pipe_target_config(model, &mc);
    if (rc < 0) return log_rc(rc, "target config"), PIPE_EXIT_PERMANENT;
    rc = pipe_drafter_config(&mc, layers, 0, B, &O.dcfg);
    if (rc < 0) return log_rc(rc, "drafter config"), PIPE_EXIT_PERMANENT;
    ops_cpu_init(&O.lops, 0);
    if (O.gpu >= 0) {
        if (!dev_available()) {
            log_error("--gpu %d: this build has no CUDA", O.gpu);
            return PIPE_EXIT_PERMANENT;
        }
        /* CUDA is initialised here, after exec: nothing CUDA crossed the fork */
        rc = ops_cuda_init(&O.ops, O.gpu);
        /* no CUDA device, or no such ordinal: a restart would fail the same way */
        if (rc < 0) return log_rc(rc, "CUDA device (--gpu)"), rc == DL_ENOENT || rc == DL_EINVAL ? PIPE_EXIT_PERMANENT : 1;
    } else {
        ops_cpu_init(&O.ops, 0);
    }
    t_up[1] = clock_mono_s();
    /* The optimizer only needs the parameter layout and names (layout_only: no buffer);
     * it never runs a forward, so the frozen embedding / LM head are not loaded: a
     * placeholder pointer that is never dereferenced stands in for them. */
    static const float no_embedding[1];
    drafter_new_opts_t lo = {.layout_only = 1};
    rc = drafter_new_opts(&O.lops, &O.dcfg, no_embedding, no_embedding, 1, 1, O.seed, &lo, &O.layout);
    if (rc < 0) return log_rc(rc, "drafter layout"), PIPE_EXIT_PERMANENT;
    O.P = drafter_n_params(O.layout);
    O.c = calloc(O.K, sizeof *O.c);
    O.gk = calloc(O.K, sizeof *O.gk);
    if (!O.c || !O.gk || opt_host_alloc(&O, resume != NULL) < 0) return PIPE_EXIT_PERMANENT;
    t_up[2] = clock_mono_s();
    /* the seeded init (a resume overwrites it). GPU: on the device, in opt_state_init. CPU:
     * into the host state on every core, not --threads (the bits do not depend on it) */
    if (!resume && O.gpu < 0) {
#ifdef _OPENMP
        int thr = omp_get_max_threads();
        if (omp_get_num_procs() > thr) omp_set_num_threads(omp_get_num_procs());
#endif
        rc = drafter_init_master(O.layout, O.seed, O.h_master);
#ifdef _OPENMP
        omp_set_num_threads(thr);
#endif
        if (rc < 0) return log_rc(rc, "drafter init"), PIPE_EXIT_PERMANENT;
    }
    FILE *cf = cursor_base ? fopen(cursor_base, "rb") : NULL;
    if (cf && fread(O.cursor, 1, sizeof O.cursor, cf) == sizeof O.cursor) O.have_cursor = 1;
    if (cf) fclose(cf);
    if (cursor_base && !O.have_cursor) log_warn("--cursor-base %s unreadable: checkpoints carry no cursor", cursor_base);
    if (resume) {
        char dir[4200];
        ckpt_state_hdr_t h;
        rc = ckpt_resolve(resume, dir, sizeof dir);
        if (rc == 0) rc = ckpt_read(dir, O.layout, &h, O.h_master, O.h_m, O.h_v, NULL);
        if (rc < 0) return log_rc(rc, "--resume"), PIPE_EXIT_PERMANENT;
        if (h.mbs_per_step != O.K) log_warn("--resume: checkpoint had %llu micro-batches per step, now %llu",
                                            (unsigned long long)h.mbs_per_step, (unsigned long long)O.K);
        O.step = O.last_ckpt = h.step;
        O.tokens = h.tokens;
        O.skipped = h.skipped_steps;
        O.resume_step = h.step;
        snprintf(O.resume_dir, sizeof O.resume_dir, "%s", dir);
        log_info("resumed from %s at step %llu", dir, (unsigned long long)O.step);
    }
    t_up[3] = clock_mono_s();
    /* a resumed optimizer undoes every step from O.step on: their lines leave steps.jsonl */
    O.steps_log = rundir_steps_open(O.out, resume || inc > 1 ? (int64_t)O.step : -1);
    /* the state's allocation and upload (seconds at 1B parameters on a GPU) before
     * stage_init: once the supervisor has our hello, the loop must keep heartbeating */
    if (opt_state_init(&O, cfg.run_id, inc) < 0) return 1;
    t_up[4] = clock_mono_s();
    testhook_i64("optimizer.ckpt_delay_ms", &O.ck_delay_ms);   /* read once, at start-up */
    O.ck_fail_step = -1;
    testhook_i64("optimizer.ckpt_fail_step", &O.ck_fail_step);
    if (opt_ckpt_init(&O) < 0) return 1;
    t_up[5] = clock_mono_s();
    rc = stage_init(&O.st, PROTO_ROLE_OPTIMIZER, PIPE_ID_OPTIMIZER, "optimizer", &a, &cfg);
    if (rc < 0) return slab_destroy(&O.wslab), log_rc(rc, "stage init"), 1;
    if (O.gpu >= 0) log_info("on GPU %d: master weights, moments and AdamW on the device", O.gpu);
    if (gpu_turn_setup(&O.turn, &cfg, PIPE_ID_OPTIMIZER, O.st.run_dir) < 0)
        log_warn("GPU turns: %s; the optimizer's steps time-slice the GPU", dl_errmsg());
    O.srv = stage_bus(&O.st, BUS_ROUTER, "optimizer");
    O.loader = stage_bus(&O.st, BUS_DEALER, "loader");
    if (!O.srv || !O.loader) return log_rc(DL_EIO, "optimizer sockets"), 1;
    bus_on_message(O.srv, on_msg, &O);
    bus_on_peer_dead(O.srv, on_dead, &O);
    bus_on_peer_new(O.srv, on_back, &O);
    ons_cb_t ncb = {ons_landed, ons_lost, ons_ready, &O};
    if (ons_new(&O.ns, &O.st, O.srv, &O.ops, O.gpu, &O.peers, O.P, O.K, &ncb) < 0) return 1;
    if (opt_xfer_init(&O) < 0) return 1;
    stage_on_metrics(&O.st, on_metrics, &O);
    stage_on_control(&O.st, on_control, &O);
    stage_on_stop(&O.st, on_stop, &O);
    send_hello(&O);
    O.t_step0 = t_up[6] = clock_mono_s();
    log_info("start-up %.2f s: configuration and device %.2f, host state %.2f (%s), %s %.2f, device state "
             "%.2f, checkpoint writer %.2f, bus %.2f", t_up[6] - t_up[0], t_up[1] - t_up[0], t_up[2] - t_up[1],
             O.gpu < 0 ? "host memory" : "pageable", resume ? "resume" : O.gpu < 0 ? "init" : "init (on the GPU: "
             "in device state)", t_up[3] - t_up[2],
             t_up[4] - t_up[3], t_up[5] - t_up[4], t_up[6] - t_up[5]);
    O.st.state = PROTO_STATE_IDLE;
    log_info("drafter: %d layers, block %d, %d features, %zu parameters; step %llu of %llu, %llu micro-batches per step",
             O.dcfg.n_layers, O.dcfg.B, O.dcfg.n_feat, O.P, (unsigned long long)O.step,
             (unsigned long long)O.max_steps, (unsigned long long)O.K);
    stage_run(&O.st);
    opt_fini(&O);
    rundir_steps_close(&O.steps_log);
    log_info("stopped at step %llu (%llu duplicates, %llu stale contributions dropped)",
             (unsigned long long)O.step, (unsigned long long)O.dup_dropped, (unsigned long long)O.stale_dropped);
    return 0;
}
