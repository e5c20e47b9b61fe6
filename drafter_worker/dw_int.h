/* drafter_worker internals shared by its files: drafter_worker.c (the stage) and
 * xfer_in.c (slab bytes across nodes: targets' features in, the optimizer's weights
 * in, gradients out; docs/MULTINODE.md section 4). */
#ifndef DL_DRAFTER_WORKER_DW_INT_H
#define DL_DRAFTER_WORKER_DW_INT_H

#include "common/mem/hcache.h"
#include "common/mem/inbox.h"
#include "common/mem/slab.h"
#include "common/model/drafter.h"
#include "common/model/target.h"
#include "common/ops/ops.h"
#include "common/pipe/gputurn.h"
#include "common/pipe/peers.h"
#include "common/pipe/runcfg.h"
#include "common/pipe/stage.h"
#include "common/pipe/xfer.h"

#define DW_MAX_SLOTS 1024
_Static_assert(DW_MAX_SLOTS == RUNCFG_HS_MIN_READY_MAX, "--hs-min-ready limit is the run config's");
#define DW_MAX_EVENTS 256

/* What a drafter keeps per target beside the registry (same index). */
typedef struct {
    int granted;               /* outstanding unused grants */
    double declined_at;        /* last time it handed a grant back unused */
} tpeer_t;

typedef struct {
    int used;
    uint64_t mb, step;
    uint32_t mb_in_step;
    uint32_t slot_id;
    uint32_t T, n_seqs;
    const int32_t *ids;        /* (T) i32, in meta[slot_id] (host) */
    const int32_t *lens;       /* (n_seqs) i32, in meta[slot_id] */
    const uint8_t *mask;       /* (T) u8, in meta[slot_id] */
    double t_ready;
    void *ev;                  /* GPU mode: the producer's event (cached, not owned); NULL: NCCL */
} item_t;

typedef struct {
    int peer;
    uint64_t inc;
    uint8_t h[64];
    void *ev;
} evc_t;

typedef struct {
    stage_t st;
    int index;                 /* drafter i; stage id PIPE_ID_DRAFTER0 + i */
    bus_t *srv;                /* ROUTER: targets */
    bus_t *opt;                /* DEALER: optimizer */
    ops_ctx_t ops;
    target_t *tgt;             /* embedding and LM head only */
    drafter_t *d;
    drafter_config_t dcfg;
    size_t P;
    uint32_t token_budget, anchors, K, min_ready;
    uint64_t seed;
    slab_t *tier[2];           /* inbox tiers */
    slab_t *grad;              /* K * P f32 */
    inbox_t *ib;
    uint64_t slot_bytes;
    uint32_t slot_owner[DW_MAX_SLOTS]; /* peer index + 1 for granted-unused slots, 0 otherwise */
    peers_t peers;             /* the targets that said hello (common/pipe/peers.h) */
    tpeer_t tp[PEERS_MAX];     /* their grants, by registry index */
    item_t *items;             /* ready items (capacity DW_MAX_SLOTS) */
    /* weights */
    hcache_t *hc;
    slab_handle_t wslab;
    int have_wslab;
    int64_t version;           /* weights version loaded; -1 none yet */
    int64_t pending_version;   /* received while busy */
    uint64_t pending_offset;
    uint8_t *sent;             /* (K) mbs of the current version already contributed */
    /* compute */
    int busy;
    uv_work_t work;
    item_t cur;
    int cur_rc;
    char cur_err[512];   /* dl_errmsg() of a failed forward/backward, copied on the pool thread */
    drafter_stats_t cur_stats;
    int cur_passes, cur_blocks;  /* of the micro-batch in work: drafter passes, blocks (anchors) */
    int logged_passes;         /* the pass count last said in the log (said again when it changes) */
    uint64_t multi_pass_mbs;   /* micro-batches that took more than one pass */
    uint64_t blocks_done;      /* blocks (anchors) and sequences of the computed micro-batches: */
    uint64_t seqs_done;        /* the anchors per sequence actually trained, said in the log */
    double cur_fb_s, cur_copy_s;
    double cur_wait_gpu_s;     /* the micro-batch in work: its wait for the GPU's turn */
    gpu_turn_t turn;           /* a GPU shared with a target: one micro-batch at a time (gputurn.h) */
    int32_t *cu, *anchor_buf;
    bus_timer_t *pool_timer, *grant_timer;
    int rr;                    /* round-robin start for grants */
    int pool_timer_armed;
    double idle_since;
    /* metrics */
    uint64_t computed, dropped, tokens;
    double t_rate; uint64_t tokens_at; double rate;
    stage_rate_t rate_win;   /* tokens_per_s over the last 5 s */
    int64_t stall_after;       /* hook <name>.stall_after_mbs: hang before micro-batch N+1 (-1 off) */
    int64_t nan_mb;            /* hook nan_mb: poison this micro-batch's loss (-1 off) */
    uint64_t started;          /* micro-batches whose compute began (worker thread) */
    /* GPU mode (--gpu N >= 0) */
    int gpu;
    size_t elem;               /* feature element bytes: 4 (f32) or 2 (bf16) */
    uint8_t *meta[DW_MAX_SLOTS]; /* per slot, lazy: the item's ids, lengths, mask (meta_cap bytes) */
    evc_t evc[DW_MAX_EVENTS];
    int nevc;
    uint64_t event_opens;
    void *staging;             /* device: features of a host-tier item */
    uint32_t max_blocks;       /* drafter blocks per micro-batch: token budget (CPU), <= 4096 (GPU) */
    /* across nodes (docs/MULTINODE.md section 4; xfer_in.c) */
    int opt_remote;            /* the optimizer runs on another node */
    xfer_t *oxf;               /* gradients to it, on opt (NULL when it is local) */
    int in_send;               /* inside dw__send_grads (its done callback waits) */
    uint8_t *wmirror;          /* host copy of its weights slab (wmirror_bytes), from slab_data */
    uint64_t wmirror_bytes;
    xfer_rx_t rx;              /* slab_data taken in (targets' features, the optimizer's weights) */
    uint64_t slot_rx[DW_MAX_SLOTS]; /* feature bytes received into each granted slot */
    /* GPU targets on other nodes by NCCL (nccl_in.c; test hook nccl_cross=1 only) */
    int nccl_cross;
    struct nccl_pair *npair[PEERS_MAX];  /* by registry index, NULL none */
    int npair_ready[PEERS_MAX];
    bus_timer_t *nccl_timer;
    struct dw_nstep *nstep;    /* the optimizer on another node by NCCL (nccl_step.c), NULL none */
} dw_t;

/* ---- xfer_in.c: the data plane across nodes ---- */

/* Looks at where the optimizer runs (after stage_init and the buses): on another
 * node, gradients go as slab_data on W->opt (W->oxf) and weights come into a mirror.
 * A GPU drafter with its optimizer on another node is refused (log, exit 1: NCCL is
 * not built yet). Returns 0 or DL_ENOMEM (logged). */
int dw__xfer_init(dw_t *W);
/* A target's slab_data (peer registry index pi, -1 before its hello): copied into the
 * inbox only inside a slot granted to that target and not yet announced, in a slab of
 * this incarnation; anything else is refused (logged, rate-limited) and dropped. */
void dw__on_target_data(dw_t *W, int pi, const char *peer, const proto_slab_data_t *d);
/* 1 when a hidden_states_ready of target pi for slot may be accepted as to its bytes:
 * a target on this node (it wrote in place), or every byte of the features
 * (feat_bytes) arrived as slab_data; else logs why and returns 0. */
int dw__slot_complete(dw_t *W, int pi, uint32_t slot, uint64_t feat_bytes);
/* The optimizer's slab_export (weights) is in W->wslab: on another node, (re)allocates
 * the mirror of its size. 0, or DL_ENOMEM (logged; have_wslab stays 0). */
int dw__weights_export(dw_t *W);
/* The optimizer's slab_data: into the weights mirror (refused when the optimizer is on
 * this node or no export came yet). */
void dw__on_opt_data(dw_t *W, const proto_slab_data_t *d);
/* Where version bytes are read: the mirror (optimizer on another node) or the mapped
 * slab. NULL after logging on a mapping failure. */
const uint8_t *dw__weights_base(dw_t *W);
/* Sends gradients_ready m (its gradient at m's offset of the gradient slab): on
 * another node the slot's bytes go first as slab_data (the slot is then not rewritten
 * until they are with the bus: try_compute waits on dw__grads_pending). */
void dw__send_grads(dw_t *W, const proto_msg_t *m);
/* Gradient bytes not yet handed to the bus (0 when the optimizer is local). */
size_t dw__grads_pending(const dw_t *W);
/* drafter_worker.c: starts the next micro-batch if one is ready. */
void dw__try_compute(dw_t *W);
/* drafter_worker.c: grants to every target that may take one (grant_all). */
void dw__grant_kick(dw_t *W);

/* ---- nccl_in.c: GPU targets on other nodes by NCCL (test hook nccl_cross=1) ---- */

/* Reads the hook (once, at start-up) and starts the poll timer. 0, or DL_ENOTSUP (hook
 * set in a build without NCCL) / a bus error. */
int dw__nccl_init(dw_t *W);
/* A hello of target pi (new or restarted incarnation): a remote GPU target gets a new
 * pair (the old one aborted), rank 0 here, `nccl_id` sent to it. */
void dw__nccl_hello(dw_t *W, int pi);
/* 0 while target pi needs a pair that is not ready (its grants are held), else 1. */
int dw__nccl_may_grant(const dw_t *W, int pi);
/* hidden_states_ready of target pi for `slot`: its `bytes` are received by NCCL into the
 * slot on the compute stream. 1 done (enqueued), 0 not an NCCL target, -1 failed (the
 * pair is aborted, the item must be dropped). Loop thread. */
int dw__nccl_take(dw_t *W, int pi, uint32_t slot, uint64_t bytes);
/* Target pi is dead: its pair is aborted (the others keep going). */
void dw__nccl_dead(dw_t *W, int pi);
/* Shutdown: the timer stopped, every pair aborted. */
void dw__nccl_fini(dw_t *W);

#endif
