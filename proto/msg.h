/* draftline wire protocol: message definitions (version DL_PROTO_VERSION).
 *
 * Every message between stages is one proto_msg_t, encoded by proto/codec*.c
 * into one msgpack array  [type, version, field_1, ..., field_n]  (positional,
 * fixed arity per type and version; see proto/PROTOCOL.md for the table of
 * fields, their wire types, ranges, senders and receivers). The payload is one
 * ZeroMQ frame; routing frames are the bus's business (common/bus).
 *
 * Conventions
 *   - Ids: stage ids are small unsigned integers handed out by the supervisor
 *     (0..DL_PROTO_MAX_STAGE_ID); target ids and drafter ids are stage ids.
 *   - mb is the loader's global micro-batch sequence number, step the optimizer
 *     step it belongs to (DESIGN.md section 5).
 *   - Byte counts and offsets are in bytes; ts_ns is wall-clock ns since the Unix
 *     epoch.
 *   - Fixed-size char arrays hold NUL-terminated UTF-8 (at most *_MAX chars).
 *   - Array fields are (pointer, count) pairs. When encoding, they point to the
 *     caller's memory and are only read. After proto_decode they point into one
 *     block owned by the message, valid until proto_msg_free (ownership below).
 *   - Enum values start at 1; 0 is never valid on the wire.
 *
 * Compatibility: a change to any message's fields bumps DL_PROTO_VERSION; the
 * decoder refuses any other version (peers of one run are built together).
 */
#ifndef DL_PROTO_MSG_H
#define DL_PROTO_MSG_H

#include <stddef.h>
#include <stdint.h>

#define DL_PROTO_VERSION 3u

/* ---- limits (all enforced by encoder and decoder) ---- */
#define DL_PROTO_MAX_BYTES     (16u << 20)  /* whole encoded message, bytes */
#define DL_PROTO_MAX_OBJECTS   65536u       /* msgpack objects in one message */
#define DL_PROTO_MAX_DEPTH     8u           /* msgpack nesting depth */
#define DL_PROTO_MAX_STAGE_ID  65535u
#define DL_PROTO_MAX_TOKENS    (1u << 21)   /* tokens in one micro-batch */
#define DL_PROTO_MAX_SEQS      65536u       /* sequences in one micro-batch */
#define DL_PROTO_MAX_MBS       4096u        /* micro-batches listed in one message */
#define DL_PROTO_MAX_BLOCK     256u         /* drafter block size B (accuracy floats) */
#define DL_PROTO_MAX_INTS      4096u        /* control int list */
#define DL_PROTO_MAX_METRICS   64u          /* (name, value) pairs in one metrics msg */
#define DL_PROTO_MAX_DIMS      4u           /* tensor rank */
#define DL_PROTO_MAX_DIM       (1ull << 32) /* one tensor dimension */
#define DL_PROTO_MAX_FEAT      64u          /* captured target layers n_feat */
#define DL_PROTO_MAX_COUNT     1024u        /* micro-batches asked in one work request */
#define DL_PROTO_MAX_OFFSET    (1ull << 48) /* slab offsets, bytes */
#define DL_PROTO_MAX_SLAB_BYTES (1ull << 40)/* slab / slot / region sizes, bytes */
#define DL_PROTO_HANDLE_BYTES  64u          /* cudaIpc{Mem,Event}Handle_t size */
#define DL_PROTO_NAME_MAX      31u          /* metric names, state strings */
#define DL_PROTO_UUID_MAX      63u          /* "GPU-xxxxxxxx-...", empty on CPU */
#define DL_PROTO_SHM_NAME_MAX  63u          /* POSIX shm object name "/dl-..." */
#define DL_PROTO_ARG_MAX       255u         /* control string argument */
#define DL_PROTO_ERRMSG_MAX    511u         /* error message text */
#define DL_PROTO_CTL_TEXT_MAX  (1u << 20)   /* ctl_reply text, bytes (the status document) */
#define DL_PROTO_CTL_GPUS_MAX  64u          /* ctl_request GPU list entries (RBPLAN_MAX) */
#define DL_PROTO_CTL_GPU_MAX   1023         /* a CUDA ordinal in a ctl_request GPU list */
#define DL_PROTO_CTL_STAGES_MAX 64u         /* ctl_request targets / drafters (PIPE_MAX_*) */
#define DL_PROTO_CTL_PLACE_MAX 1024u        /* ctl_request target_place / drafter_place, chars */
#define DL_PROTO_PATH_MAX      4095u        /* run_config paths (PATH_MAX - 1) */
#define DL_PROTO_RUN_ID_MAX    16u          /* run_config run id ([A-Za-z0-9_.]) */
#define DL_PROTO_MAX_PLACE     64u          /* run_config targets / drafters listed */
#define DL_PROTO_MAX_CHUNK     (4u << 20)   /* slab_data bytes in one message */
#define DL_PROTO_MAX_NODES     64u          /* nodes of one run (index 0 = the head) */
#define DL_PROTO_NODE_NAME_MAX 63u          /* node name: bus id characters (0x21..0x7e) */
#define DL_PROTO_HOST_MAX      255u         /* hostname / address text */
#define DL_PROTO_EXE_MAX       63u          /* stage executable name ([a-z_]) */
#define DL_PROTO_CRED_BYTES 32u             /* a membership credential (common/pipe/cred.h) */
#define DL_PROTO_NCCL_ID_BYTES 128u         /* sizeof(ncclUniqueId) (NCCL_UNIQUE_ID_BYTES) */
#define DL_PROTO_NCCL_RANKS_MAX 64u         /* nccl_id nranks */

#define DL_PROTO_MB_NONE   UINT64_MAX  /* "no micro-batch" (slot_release of an unused grant) */

/* ---- message types (wire values are fixed; append only) ---- */
typedef enum {
    PROTO_HELLO               = 1,   /* any stage -> supervisor; also stage -> stage on connect */
    PROTO_HEARTBEAT           = 2,   /* any stage -> supervisor and peers */
    PROTO_WORK_REQUEST        = 3,   /* target -> loader (credit in micro-batches) */
    PROTO_MICRO_BATCH         = 4,   /* loader -> target */
    PROTO_SLAB_EXPORT         = 5,   /* slab owner -> peers that will open it */
    PROTO_SLOT_GRANT          = 6,   /* drafter -> target (credit in inbox bytes) */
    PROTO_HIDDEN_STATES_READY = 7,   /* target -> drafter */
    PROTO_SLOT_RELEASE        = 8,   /* target -> drafter: a grant returned unused */
    PROTO_GRADIENTS_READY     = 9,   /* drafter -> optimizer */
    PROTO_WEIGHTS_VERSION     = 10,  /* optimizer -> drafters */
    PROTO_METRICS             = 11,  /* any stage -> supervisor / monitor */
    PROTO_CONTROL             = 12,  /* supervisor -> stages */
    PROTO_APPLIED             = 13,  /* optimizer -> loader (and supervisor) */
    PROTO_ERROR               = 14,  /* any -> any, answer to a refused message */
    PROTO_CTL_REQUEST         = 15,  /* control client -> supervisor (its control socket) */
    PROTO_CTL_REPLY           = 16,  /* supervisor -> control client */
    PROTO_RUN_CONFIG          = 17,  /* supervisor -> stage, the answer to its hello */
    PROTO_SLAB_DATA           = 18,  /* bytes of a slab range across hosts (CPU data plane) */
    PROTO_NODE_HELLO          = 19,  /* node agent -> supervisor: registration */
    PROTO_NODE_WELCOME        = 20,  /* supervisor -> node agent: accepted */
    PROTO_NODE_SPAWN          = 21,  /* supervisor -> node agent: start a stage */
    PROTO_NODE_SIGNAL         = 22,  /* supervisor -> node agent: signal a stage */
    PROTO_NODE_STAGE          = 23,  /* node agent -> supervisor: a stage started / exited */
    PROTO_NCCL_ID             = 24,  /* drafter -> remote GPU target: join an NCCL pair */
    PROTO_TYPE_COUNT_         = 25
} proto_type_t;

typedef enum {
    PROTO_ROLE_LOADER = 1, PROTO_ROLE_TARGET = 2, PROTO_ROLE_DRAFTER = 3,
    PROTO_ROLE_OPTIMIZER = 4, PROTO_ROLE_SUPERVISOR = 5, PROTO_ROLE_MONITOR = 6,
    PROTO_ROLE_COUNT_ = 7
} proto_role_t;

/* Stage state, as the monitor needs it: IDLE = waiting for input (starved),
 * BLOCKED = waiting for credit (back-pressured). */
typedef enum {
    PROTO_STATE_STARTING = 1, PROTO_STATE_IDLE = 2, PROTO_STATE_RUNNING = 3,
    PROTO_STATE_BLOCKED = 4, PROTO_STATE_DRAINING = 5, PROTO_STATE_STOPPING = 6,
    PROTO_STATE_COUNT_ = 7
} proto_state_t;

/* Where an inbox slot / slab lives: the receiver's GPU, or pinned host RAM
 * shared between processes (also the only tier on CPU-only runs). */
typedef enum { PROTO_TIER_GPU = 1, PROTO_TIER_HOST = 2, PROTO_TIER_COUNT_ = 3 } proto_tier_t;

typedef enum { PROTO_DTYPE_BF16 = 1, PROTO_DTYPE_F16 = 2, PROTO_DTYPE_F32 = 3,
               PROTO_DTYPE_COUNT_ = 4 } proto_dtype_t;

typedef enum {
    PROTO_CTL_REBALANCE  = 1,  /* ints: new roles, [stage_id, role, ...]; at step boundary */
    PROTO_CTL_DRAIN      = 2,  /* finish work in hand, take no more */
    PROTO_CTL_STOP       = 3,  /* drain then exit 0 */
    PROTO_CTL_ROUTE      = 4,  /* ints: routing table, pairs [target_id, drafter_id, ...] */
    PROTO_CTL_MEMBERSHIP = 5,  /* ints: live stage ids; arg: endpoints, one per line */
    PROTO_CTL_RESUME     = 6,  /* take work again after DRAIN */
    PROTO_CTL_PLACEMENT  = 7,  /* ints: [n_t, n_d, node of target 0..n_t-1, node of drafter 0..n_d-1] */
    PROTO_CTL_PEERS      = 8,  /* arg: the run's peer key, 64 hex digits (common/pipe/cred.h); sent
                                * before RUN_CONFIG on a config request's connection */
    PROTO_CTL_COUNT_     = 9
} proto_ctl_op_t;

/* What a control client asks the supervisor (ctl_request.op). */
typedef enum {
    PROTO_CTLREQ_STATUS    = 1,  /* reply: the status document (JSON) */
    PROTO_CTLREQ_STOP      = 2,  /* stop as on SIGTERM; flags WAIT: a second reply when it exits */
    PROTO_CTLREQ_REBALANCE = 3,  /* targets/drafters (CPU) or the GPU lists (GPU runs) */
    PROTO_CTLREQ_SUBSCRIBE = 4,  /* every relayed METRICS message follows, until the client dies */
    PROTO_CTLREQ_COUNT_    = 5
} proto_ctlreq_op_t;

/* ctl_request.flags bits. */
#define PROTO_CTLREQ_WAIT  (1u << 0)   /* stop: also reply "stopped" just before the supervisor exits */
#define PROTO_CTLREQ_FLAGS_ALL_ ((1u << 1) - 1)

/* hello.capabilities bits. */
#define PROTO_CAP_CUDA_IPC  (1ull << 0)  /* can export/open CUDA IPC mem + event handles */
#define PROTO_CAP_SHM       (1ull << 1)  /* can export/open POSIX shm slabs */
#define PROTO_CAP_NCCL      (1ull << 2)  /* NCCL point-to-point across hosts */
#define PROTO_CAP_HOST_TIER (1ull << 3)  /* has / accepts the pinned host inbox tier */
#define PROTO_CAP_WANT_CONFIG (1ull << 4) /* a config request: answer with RUN_CONFIG only (not "up") */
#define PROTO_CAP_ALL_      ((1ull << 5) - 1)

/* node_stage.event */
typedef enum {
    PROTO_NODE_EV_STARTED = 1,   /* fork+exec done: pid */
    PROTO_NODE_EV_EXITED  = 2,   /* reaped: wait_status is waitpid's status (Linux encoding) */
    PROTO_NODE_EV_FAILED  = 3,   /* could not start (fork or exec): wait_status = errno */
    PROTO_NODE_EV_COUNT_  = 4
} proto_node_ev_t;

/* ---- message bodies ---- */

typedef struct {
    proto_role_t role;
    uint32_t stage_id;
    uint64_t incarnation;        /* new value at every (re)start of the stage, never 0 */
    uint32_t pid;                /* > 0 */
    uint32_t proto_version;      /* version the sender speaks; must be DL_PROTO_VERSION */
    uint64_t capabilities;       /* PROTO_CAP_* bits */
    char gpu_uuid[DL_PROTO_UUID_MAX + 1];  /* "" on CPU */
    /* membership (common/pipe/cred.h): to the supervisor, the stage's credential
     * HMAC(run secret, "<run id>:<stage id>:<incarnation>"); a hello or config request
     * without the right one is refused (PROTO_ERROR). cred_len 0 or DL_PROTO_CRED_BYTES. */
    uint8_t cred[DL_PROTO_CRED_BYTES]; uint32_t cred_len;
} proto_hello_t;

typedef struct {
    uint32_t stage_id;
    uint64_t incarnation;
    uint64_t seq;                /* per-incarnation counter, +1 per heartbeat */
    proto_state_t state;
} proto_heartbeat_t;

typedef struct {
    uint32_t target_id;
    uint32_t count;              /* micro-batches more the target has room for, 1..DL_PROTO_MAX_COUNT */
} proto_work_request_t;

/* Packed micro-batch: n_seqs sequences concatenated, tokens (n_tokens,) i32,
 * seq_lens (n_seqs,) i32 >= 1 with sum == n_tokens, loss_mask (n_tokens,) u8 in
 * {0,1} (1 = token is a training position). Wire: little-endian bin. */
typedef struct {
    uint64_t mb;
    uint64_t step;
    uint32_t epoch;
    uint32_t mb_in_step;         /* 0..mbs_in_step-1 */
    uint32_t mbs_in_step;        /* micro-batches that make up `step`, >= 1 */
    uint32_t n_seqs;             /* == count of seq_lens */
    const int32_t *tokens;   uint32_t n_tokens;      /* (T,) token ids >= 0 */
    const int32_t *seq_lens; uint32_t n_seq_lens;    /* (n_seqs,) */
    const uint8_t *loss_mask; uint32_t n_loss_mask;  /* (T,) */
} proto_micro_batch_t;

/* A slab exported once per owner incarnation; peers open it once and cache it
 * under (owner_id, incarnation, slab_id). GPU tier: handle = cudaIpcMemHandle_t,
 * shm_name ""; host tier: shm_name = POSIX shm name, handle empty (len 0). */
typedef struct {
    uint32_t owner_id;
    uint64_t incarnation;
    uint32_t slab_id;
    proto_tier_t tier;
    uint64_t bytes;              /* 1..DL_PROTO_MAX_SLAB_BYTES */
    uint8_t handle[DL_PROTO_HANDLE_BYTES]; uint32_t handle_len;  /* 0 or 64 */
    char shm_name[DL_PROTO_SHM_NAME_MAX + 1];
    char gpu_uuid[DL_PROTO_UUID_MAX + 1];   /* GPU the slab lives on, "" for host */
} proto_slab_export_t;

/* Credit: the drafter gives target `target_id` the slot [offset, offset+bytes)
 * of its slab `slab_id`. The target may write one micro-batch's hidden states
 * there and must answer with hidden_states_ready or slot_release. */
typedef struct {
    uint32_t drafter_id;
    uint32_t target_id;
    uint32_t slot_id;
    proto_tier_t tier;
    uint32_t slab_id;
    uint64_t offset;
    uint64_t bytes;              /* >= 1 */
} proto_slot_grant_t;

/* Hidden states of micro-batch `mb`, written by target `target_id` into slot
 * `slot_id` (slab_id, offset) of the drafter's inbox: the features only, at the
 * slot's start, (shape[0]=T, shape[1]=n_feat*D) dtype, row-major, within
 * [0, bytes). The micro-batch's token ids, sequence lengths and loss mask travel
 * inline (as in micro_batch): tokens (T,) i32 >= 0, seq_lens (n_seqs,) i32 >= 1
 * with sum == T, loss_mask (T,) u8 in {0,1}; wire: little-endian bin. `event` is
 * an interprocess cudaIpcEventHandle_t recorded after the feature writes
 * (event_len 0 on CPU, where the message itself orders the writes). */
typedef struct {
    uint32_t target_id;
    uint32_t drafter_id;
    uint32_t slab_id;
    uint32_t slot_id;
    proto_tier_t tier;
    uint64_t offset;
    uint64_t bytes;              /* bytes used in the slot, <= granted bytes */
    proto_dtype_t dtype;
    uint32_t ndim;               /* == 2 in version 1 */
    uint64_t shape[DL_PROTO_MAX_DIMS];
    uint32_t n_feat;             /* captured layers; shape[1] % n_feat == 0 */
    uint64_t mb;
    uint64_t step;
    uint32_t mb_in_step;
    uint32_t mbs_in_step;
    uint32_t n_seqs;             /* 1..T, == count of seq_lens */
    const int32_t *tokens;   uint32_t n_tokens;      /* (T,) token ids >= 0; n_tokens == shape[0] */
    const int32_t *seq_lens; uint32_t n_seq_lens;    /* (n_seqs,) */
    const uint8_t *loss_mask; uint32_t n_loss_mask;  /* (T,) */
    uint8_t event[DL_PROTO_HANDLE_BYTES]; uint32_t event_len;   /* 0 or 64 */
    char gpu_uuid[DL_PROTO_UUID_MAX + 1];   /* producer GPU, "" on CPU */
} proto_hidden_states_ready_t;

/* A grant target -> drafter returned unused (re-routed, or idle with it): the
 * drafter frees slot `slot_id`. A consumed slot is not reported (PROTOCOL.md). */
typedef struct {
    uint32_t drafter_id;
    uint32_t slot_id;
    uint64_t mb;                 /* senders put DL_PROTO_MB_NONE (no micro-batch written) */
} proto_slot_release_t;

/* Gradients of drafter `drafter_id` for `step`, summed over the listed
 * micro-batches (strictly increasing mb), computed with weights `weights_version`
 * (== step - 1 in synchronous mode). loss_sum/weight_sum: sum of weighted CE and
 * of weights over positions (mean loss = loss_sum / weight_sum); loss_sum may be
 * NaN/Inf (the optimizer skips and reports the step). acc[k] = accuracy at block
 * position k, in [0,1]. Gradients: n_params f32 at (slab_id, offset), ordered by
 * the event. */
typedef struct {
    uint32_t drafter_id;
    uint64_t step;
    uint64_t weights_version;
    const uint64_t *mbs; uint32_t n_mbs;        /* 1..DL_PROTO_MAX_MBS */
    uint64_t n_tokens;                           /* target tokens in these mbs */
    double loss_sum;
    double weight_sum;                           /* finite, >= 0 */
    const float *acc; uint32_t n_acc;            /* (B,), 0..DL_PROTO_MAX_BLOCK */
    uint32_t slab_id;
    uint64_t offset;
    uint64_t bytes;                              /* == 4 * n_params */
    uint64_t n_params;
    uint8_t event[DL_PROTO_HANDLE_BYTES]; uint32_t event_len;   /* 0 or 64 */
} proto_gradients_ready_t;

/* New drafter weights: after `version` optimizer steps, n_params values of
 * dtype at (slab_id, offset) of the optimizer's weights slab. */
typedef struct {
    uint64_t version;
    uint32_t slab_id;
    uint64_t offset;
    uint64_t bytes;              /* == n_params * dtype size */
    uint64_t n_params;
    proto_dtype_t dtype;
    uint8_t event[DL_PROTO_HANDLE_BYTES]; uint32_t event_len;   /* 0 or 64 */
} proto_weights_version_t;

typedef struct {
    char name[DL_PROTO_NAME_MAX + 1];   /* printable ASCII, non-empty, e.g. "tokens_per_s" */
    double value;                        /* any double, NaN/Inf allowed */
} proto_metric_t;

typedef struct {
    uint32_t stage_id;
    proto_role_t role;
    uint64_t incarnation;
    uint64_t ts_ns;
    char state[DL_PROTO_NAME_MAX + 1];  /* e.g. "running", "starved", "blocked" */
    uint32_t n_metrics;                  /* 0..DL_PROTO_MAX_METRICS */
    proto_metric_t metrics[DL_PROTO_MAX_METRICS];
} proto_metrics_t;

typedef struct {
    proto_ctl_op_t op;
    uint64_t seq;                /* supervisor's control sequence number */
    uint64_t step;               /* take effect at this step boundary; 0 = now */
    const int64_t *ints; uint32_t n_ints;   /* op-specific, see proto_ctl_op_t */
    char arg[DL_PROTO_ARG_MAX + 1];
} proto_control_t;

/* The optimizer applied `step` with exactly these micro-batches (strictly
 * increasing): the loader may forget them (exactly-once ledger). */
typedef struct {
    uint64_t step;
    const uint64_t *mbs; uint32_t n_mbs;    /* 1..DL_PROTO_MAX_MBS */
} proto_applied_t;

typedef struct {
    int32_t code;                /* negative dl_err */
    uint32_t ref_type;           /* proto_type_t of the refused message, 0 if unknown */
    char message[DL_PROTO_ERRMSG_MAX + 1];
} proto_error_t;

/* A control client's request to a run's supervisor (docs/ARCHITECTURE.md, control
 * socket). id: chosen by the client, echoed in every reply. Rebalance: either
 * targets, drafters in 1..DL_PROTO_CTL_STAGES_MAX and no GPU lists (CPU runs), or
 * both GPU lists non-empty (entry i = CUDA ordinal of target / drafter i) and
 * targets = drafters = 0 (GPU runs). target_place / drafter_place (rebalance only;
 * "" = not given): the placement as the user wrote it when it names nodes
 * ("a:2,b:1", "a:0-3"), resolved by the supervisor against the run's node table;
 * the counts / lists above are what it parses to. Other ops: targets = drafters =
 * 0, no lists, no places. */
typedef struct {
    uint64_t id;
    proto_ctlreq_op_t op;
    uint32_t flags;                              /* PROTO_CTLREQ_* bits */
    uint32_t targets, drafters;
    const int64_t *target_gpus; uint32_t n_target_gpus;     /* 0..DL_PROTO_CTL_GPUS_MAX */
    const int64_t *drafter_gpus; uint32_t n_drafter_gpus;   /* 0..DL_PROTO_CTL_GPUS_MAX */
    char target_place[DL_PROTO_CTL_PLACE_MAX + 1];          /* printable, no space */
    char drafter_place[DL_PROTO_CTL_PLACE_MAX + 1];
} proto_ctl_request_t;

/* The supervisor's answer. code: 0 or a negative dl_err; state: "ok", "stopping",
 * "stopped", "running", "done", "rejected" (printable, non-empty); text: UTF-8
 * bytes, not NUL-terminated (the status document as JSON, or a message). */
typedef struct {
    uint64_t id;
    int32_t code;
    char state[DL_PROTO_NAME_MAX + 1];
    const uint8_t *text; uint32_t n_text;        /* 0..DL_PROTO_CTL_TEXT_MAX */
} proto_ctl_reply_t;

/* The run's settings, sent by the supervisor to a stage in answer to its hello
 * (common/pipe/runcfg.h holds the same settings as run_config_t and converts).
 * Per stage and incarnation the supervisor sets start_step, cursor_in, resume_dir
 * and gpu/drafter; the rest is the run's. Paths are absolute or relative to the
 * supervisor's working directory (the stages inherit it); "" = not set. Units:
 * token_budget and max_len in tokens (max_len 0 = no limit), inbox sizes in GiB,
 * lr per step. Placement: target_gpus[i] / drafter_gpus[i] the CUDA ordinal of
 * target i / drafter i (-1 = CPU), target_drafters[i] target i's drafter index;
 * gpu is the receiving stage's own GPU (-1 = CPU), drafter its route (targets;
 * -1 for the other roles). */
typedef struct {
    uint32_t stage_id;           /* the stage this answers */
    uint64_t incarnation;        /* its incarnation (the hello's) */
    char run_id[DL_PROTO_RUN_ID_MAX + 1];
    /* paths: (pointer, length) pairs, not inline (6 x 4 KiB would grow every
     * proto_msg_t); length 0..DL_PROTO_PATH_MAX, no NUL inside. Encoding reads
     * len bytes of the caller's string (NULL allowed when len is 0); after
     * proto_decode each points into the message's owned block, NUL-terminated,
     * never NULL ("" when not set). */
    const char *data_cache; uint32_t n_data_cache;
    const char *target_model; uint32_t n_target_model;
    const char *out_dir; uint32_t n_out_dir;
    const char *cursor_base; uint32_t n_cursor_base;
    const char *cursor_in; uint32_t n_cursor_in;
    const char *resume_dir; uint32_t n_resume_dir;
    uint64_t target_fp;          /* 0 = unknown */
    uint64_t seed;
    uint32_t token_budget, max_len, mbs_per_step, epochs;
    uint64_t max_steps, start_step;
    uint32_t lookahead_mbs, drafter_layers, block_size, num_anchors;
    double lr;
    uint64_t warmup_steps;
    double weight_decay, clip;
    uint64_t save_every;
    uint32_t keep_checkpoints;   /* 0 = keep all */
    double inbox_gb, host_inbox_gb;
    uint32_t hs_min_ready, prefetch, threads, deterministic;
    int32_t gpu, drafter;
    const int64_t *target_gpus; uint32_t n_target_gpus;         /* 1..DL_PROTO_MAX_PLACE */
    const int64_t *drafter_gpus; uint32_t n_drafter_gpus;       /* 1..DL_PROTO_MAX_PLACE */
    const int64_t *target_drafters; uint32_t n_target_drafters; /* == n_target_gpus */
    /* multi-node (docs/MULTINODE.md). net_port 0: one host, every endpoint
     * ipc://<run dir>/<name>.sock and every slab mapped (node lists all 0).
     * Else every stage endpoint is tcp://<addr of its node>:<port> with CURVE
     * (supervisor net_port, loader +1, optimizer +2, drafter i +100+i); node_addrs:
     * the nodes' addresses, one line each, line k = node k (0 = the head); node: the
     * receiving stage's node; *_nodes[i]: the node of target / drafter i. Peers on
     * different nodes move slab bytes with slab_data (CPU) or NCCL (GPU). */
    uint32_t net_port;                                          /* 0, or 1024..65535-200 */
    const char *node_addrs; uint32_t n_node_addrs;              /* 0..DL_PROTO_PATH_MAX */
    int32_t node, loader_node, optimizer_node;                  /* 0..DL_PROTO_MAX_NODES-1 */
    const int64_t *target_nodes; uint32_t n_target_nodes;       /* == n_target_gpus */
    const int64_t *drafter_nodes; uint32_t n_drafter_nodes;     /* == n_drafter_gpus */
    uint32_t target_precision;   /* targets' linear weights: 0 = bf16 (the default, zero-initialised),
                                  * 1 = fp8 (--target-precision; common/model/target.h) */
    uint32_t gpu_turns;          /* 1: targets and drafters sharing a GPU take turns on it
                                  * (--gpu-turns on, the run's default; common/pipe/gputurn.h), 0: off */
} proto_run_config_t;

/* Bytes [offset, offset + n_data) of slab `slab_id` owned by stage `owner_id`
 * (incarnation owner_inc), sent across hosts where the peers cannot map the slab
 * (CPU data plane of a multi-node run, docs/MULTINODE.md): a target writes its
 * features into the drafter's granted slot this way (owner = the drafter), a
 * drafter its gradient slot (owner = the drafter, into the optimizer's mirror), the
 * optimizer its new weights (owner = the optimizer, into each drafter's mirror).
 * Every chunk of a range is sent before the message that announces it
 * (hidden_states_ready, gradients_ready, weights_version) on the same connection,
 * so arrival order is write order. n_data 1..DL_PROTO_MAX_CHUNK. */
typedef struct {
    uint32_t owner_id;
    uint64_t owner_inc;
    uint32_t slab_id;
    uint64_t offset;                               /* 0..DL_PROTO_MAX_OFFSET */
    const uint8_t *data; uint32_t n_data;          /* 1..DL_PROTO_MAX_CHUNK */
} proto_slab_data_t;

/* A node agent registers with the head (`draftline node --join`). name: the node's
 * name in placements (bus id characters, unique in the run); addr: the address
 * its stages bind and peers reach (IP or hostname); run_dir: the agent's local run
 * dir (logs; the out dir of stages placed there); gpu_uuids: one line per GPU
 * ("GPU-..."), gpu_free_mib[i] its free memory (NVML; empty on a CPU node);
 * incarnation: new at every agent start. */
typedef struct {
    char name[DL_PROTO_NODE_NAME_MAX + 1];
    char hostname[DL_PROTO_HOST_MAX + 1];
    char addr[DL_PROTO_HOST_MAX + 1];
    const char *run_dir; uint32_t n_run_dir;       /* 1..DL_PROTO_PATH_MAX */
    uint32_t pid;
    uint64_t incarnation;
    uint32_t proto_version;                        /* = DL_PROTO_VERSION */
    uint32_t cores;                                /* online CPUs, >= 1 */
    const char *gpu_uuids; uint32_t n_gpu_uuids;   /* 0..DL_PROTO_PATH_MAX */
    const int64_t *gpu_free_mib; uint32_t n_gpu_free_mib;   /* 0..DL_PROTO_MAX_NODES */
} proto_node_hello_t;

/* The head accepted the node: its index in the run's node table (1..; 0 is the head). */
typedef struct {
    char run_id[DL_PROTO_RUN_ID_MAX + 1];
    uint32_t node_index;                           /* 1..DL_PROTO_MAX_NODES-1 */
    uint64_t node_incarnation;                     /* the hello's */
} proto_node_welcome_t;

/* Start incarnation `incarnation` of stage `stage_id` on this node:
 *   <bin dir>/<exe> [--index index] --run-dir <node run dir> --incarnation N
 *                   --sup sup_endpoint --key <node key file> [--log-level L]
 * with `threads` OpenMP/OpenBLAS threads (0: 1); log <run dir>/logs/<stage name>.log. */
typedef struct {
    uint32_t stage_id;
    uint64_t incarnation;
    char exe[DL_PROTO_EXE_MAX + 1];                /* loader|target_worker|drafter_worker|optimizer */
    int32_t index;                                 /* -1: none (loader, optimizer) */
    uint32_t threads;
    char sup_endpoint[DL_PROTO_HOST_MAX + 1];      /* "tcp://host:port" */
    char log_level[DL_PROTO_NAME_MAX + 1];         /* "" = default */
    /* the stage's membership credential (common/pipe/cred.h), handed to it in its
     * environment (DL_STAGE_CRED), never on its command line; 0 or DL_PROTO_CRED_BYTES */
    uint8_t cred[DL_PROTO_CRED_BYTES]; uint32_t cred_len;
} proto_node_spawn_t;

/* Send signal signum (SIGTERM 15 or SIGKILL 9) to incarnation `incarnation` of
 * stage `stage_id` if it still runs on this node (else nothing). */
typedef struct {
    uint32_t stage_id;
    uint64_t incarnation;
    int32_t signum;
} proto_node_signal_t;

/* A stage of this node started (pid) or exited (waitpid status) or could not start. */
typedef struct {
    uint32_t stage_id;
    uint64_t incarnation;
    proto_node_ev_t event;
    uint32_t pid;                                  /* 0 for FAILED */
    int32_t wait_status;
} proto_node_stage_t;

/* The NCCL pair of a GPU drafter and a GPU target on another node (docs/MULTINODE.md
 * section 4, common/mem/nccl.h): the drafter (owner, rank 0) made `id` with
 * ncclGetUniqueId for the target incarnation peer_inc (its hello's) and inits rank 0;
 * the target inits rank `rank` of `nranks` with it. An id for another incarnation
 * of either side is stale: dropped. id: exactly DL_PROTO_NCCL_ID_BYTES, opaque.
 * Also the step communicator (sections 4-5, optimizer/nccl_step.c): owner = the
 * optimizer (rank 0), one message per member drafter (peer, ranks 1..nranks-1 in
 * stage-id order), a new id per generation (the member set changed); a drafter takes
 * the newest of its optimizer incarnation (arrival order) and drops the rest
 * (nccl_step_id_fresh). Once its ranks are ready the drafter sends the same message
 * back (echo): from it on, its gradients_ready are sent on that generation. */
typedef struct {
    uint32_t owner_id;                             /* the drafter's stage id */
    uint64_t owner_inc;
    uint32_t peer_id;                              /* the target's stage id, != owner_id */
    uint64_t peer_inc;
    uint32_t nranks;                               /* 2..DL_PROTO_NCCL_RANKS_MAX */
    uint32_t rank;                                 /* the receiver's, 1..nranks-1 */
    uint8_t id[DL_PROTO_NCCL_ID_BYTES]; uint32_t id_len;   /* = 128 */
} proto_nccl_id_t;

/* One message. `version` is filled by proto_decode (always DL_PROTO_VERSION on
 * success); the encoder always writes DL_PROTO_VERSION. */
typedef struct proto_msg {
    proto_type_t type;
    uint32_t version;
    union {
        proto_hello_t hello;
        proto_heartbeat_t heartbeat;
        proto_work_request_t work_request;
        proto_micro_batch_t micro_batch;
        proto_slab_export_t slab_export;
        proto_slot_grant_t slot_grant;
        proto_hidden_states_ready_t hidden_states_ready;
        proto_slot_release_t slot_release;
        proto_gradients_ready_t gradients_ready;
        proto_weights_version_t weights_version;
        proto_metrics_t metrics;
        proto_control_t control;
        proto_applied_t applied;
        proto_error_t error;
        proto_ctl_request_t ctl_request;
        proto_ctl_reply_t ctl_reply;
        proto_run_config_t run_config;
        proto_slab_data_t slab_data;
        proto_node_hello_t node_hello;
        proto_node_welcome_t node_welcome;
        proto_node_spawn_t node_spawn;
        proto_node_signal_t node_signal;
        proto_node_stage_t node_stage;
        proto_nccl_id_t nccl_id;
    };
    void *owned_;                /* decode-owned array storage; freed by proto_msg_free */
} proto_msg_t;

/* ---- helpers (proto/codec_desc.c, codec_check.c, codec.c) ---- */

/* Names: "hidden_states_ready", "drafter", "running", "gpu", "bf16", "route".
 * Never NULL; out-of-range values give "?". */
const char *proto_type_name(proto_type_t t);
const char *proto_role_name(proto_role_t r);
const char *proto_state_name(proto_state_t s);
const char *proto_tier_name(proto_tier_t t);
const char *proto_dtype_name(proto_dtype_t d);
const char *proto_ctl_op_name(proto_ctl_op_t op);
/* "status", "stop", "rebalance", "subscribe"; "?" out of range. */
const char *proto_ctlreq_op_name(proto_ctlreq_op_t op);
/* Parses a role name ("loader", ...); returns 0 or DL_EINVAL. */
int proto_role_parse(const char *s, proto_role_t *out);
/* Bytes per element of dtype (2, 2, 4); 0 for an invalid dtype. */
size_t proto_dtype_size(proto_dtype_t d);

/* Zeroes *m and sets its type (arrays NULL, strings empty). */
void proto_msg_init(proto_msg_t *m, proto_type_t type);

/* Checks every field of *m against the ranges above and the cross-field rules
 * in PROTOCOL.md (the same checks the decoder applies). Returns 0, or
 * DL_EPROTO with dl_seterr naming "<type>.<field>". */
int proto_validate(const proto_msg_t *m);

/* Frees the array storage a decoded message owns and nulls its array pointers;
 * safe on an encoded-only (caller-owned) or already freed message, and on NULL. */
void proto_msg_free(proto_msg_t *m);

#endif
