/* One run configuration: every run-level setting of a `draftline run` in one struct,
 * built once by the supervisor from the run options (supervisor/stages.c) and sent to
 * each stage as the RUN_CONFIG message (proto/msg.h, type 17) in answer to its hello.
 *
 * Per stage and incarnation the supervisor changes a few fields of its copy before it
 * sends (a restarted loader's start_step, the optimizer's resume_dir, a moved stage's
 * GPU); everything else is the run's. The limits are the ones the stages' flag parsers
 * used (named below), so a config that validates is one every stage accepts.
 */
#ifndef DL_PIPE_RUNCFG_H
#define DL_PIPE_RUNCFG_H

#include "common/pipe/stage.h"
#include "proto/msg.h"

#include <stddef.h>
#include <stdint.h>

/* ---- limits (inclusive; the stages' flag ranges) ---- */
#define RUNCFG_TOKEN_BUDGET_MIN 16            /* tokens per micro-batch */
#define RUNCFG_TOKEN_BUDGET_MAX (1 << 21)
#define RUNCFG_MAX_LEN_MIN 2                  /* tokens per sequence; 0 = no limit */
#define RUNCFG_MAX_LEN_MAX (1 << 21)
#define RUNCFG_MBS_PER_STEP_MAX 4096          /* = DL_PROTO_MAX_MBS */
#define RUNCFG_EPOCHS_MAX (1 << 20)
#define RUNCFG_STEPS_MAX (INT64_MAX / 8192)   /* max_steps, start_step (mb = step * K fits) */
#define RUNCFG_LOOKAHEAD_MBS_MAX (1 << 20)
#define RUNCFG_NUM_ANCHORS_MAX (1 << 20)      /* anchors per sequence */
#define RUNCFG_LR_MAX 10.0
#define RUNCFG_WEIGHT_DECAY_MAX 10.0
#define RUNCFG_CLIP_MAX 1e9
#define RUNCFG_COUNT_MAX (INT64_MAX / 2)      /* warmup_steps, save_every */
#define RUNCFG_KEEP_CKPTS_MAX INT32_MAX
#define RUNCFG_INBOX_GB_MAX 4096.0            /* GiB, each inbox tier */
#define RUNCFG_HS_MIN_READY_MAX 1024          /* = the drafter's inbox slot limit */
#define RUNCFG_PREFETCH_MAX 8                 /* = the target's micro-batch queue */
#define RUNCFG_THREADS_MAX 1024
#define RUNCFG_GPU_MAX 1023                   /* CUDA ordinal; -1 = CPU */
#define RUNCFG_PATH_MAX (DL_PROTO_PATH_MAX + 1)
#define RUNCFG_NODES_MAX 16                   /* nodes of one run (index 0 = the head) */
#define RUNCFG_ADDR_MAX 127                   /* a node's address, chars */
#define RUNCFG_PORT_LOADER 1                  /* endpoint ports: net_port + these */
#define RUNCFG_PORT_OPTIMIZER 2
#define RUNCFG_PORT_DRAFTER0 100              /* drafter i: net_port + 100 + i */
#define RUNCFG_PORT_SPAN 164                  /* ports net_port .. net_port + 163 */

_Static_assert(RUNCFG_MBS_PER_STEP_MAX == DL_PROTO_MAX_MBS, "K limit is the wire's");
_Static_assert(PIPE_MAX_TARGETS <= DL_PROTO_MAX_PLACE && PIPE_MAX_DRAFTERS <= DL_PROTO_MAX_PLACE,
               "the placement fits run_config");

typedef struct run_config {
    char run_id[DL_PROTO_RUN_ID_MAX + 1];  /* [A-Za-z0-9_.]{1,16} (slab names) */
    /* paths ("" = not set) */
    char data_cache[RUNCFG_PATH_MAX];      /* the prepared .dlc the loader reads */
    char target_model[RUNCFG_PATH_MAX];    /* HF dir or .gguf */
    char out_dir[RUNCFG_PATH_MAX];         /* run dir: checkpoints/, steps.jsonl */
    char cursor_base[RUNCFG_PATH_MAX];     /* <out>/loader.cursor */
    char cursor_in[RUNCFG_PATH_MAX];       /* loader: checkpoint cursor to resume from */
    char resume_dir[RUNCFG_PATH_MAX];      /* optimizer: checkpoint dir to resume from */
    uint64_t target_fp;                    /* ckpt_target_fingerprint; 0 = unknown */
    uint64_t seed;                         /* 0..INT64_MAX */
    uint32_t token_budget;                 /* tokens per micro-batch */
    uint32_t max_len;                      /* tokens per sequence as given; 0 = none */
    uint32_t mbs_per_step;                 /* K */
    uint32_t epochs;
    uint64_t max_steps, start_step;
    uint32_t lookahead_mbs;                /* loader: micro-batches past the current step */
    uint32_t drafter_layers, block_size, num_anchors;
    double lr, weight_decay, clip;
    uint64_t warmup_steps, save_every;     /* steps; save_every 0 = only at the end */
    uint32_t keep_checkpoints;             /* 0 = keep all */
    double inbox_gb, host_inbox_gb;        /* GiB */
    uint32_t hs_min_ready, prefetch, threads;  /* threads: per stage, 0 = OpenMP default */
    int deterministic;
    /* placement: CUDA ordinals (-1 = CPU) and each target's drafter index */
    int n_targets, n_drafters;
    int optimizer_gpu;
    int64_t target_gpu[PIPE_MAX_TARGETS], drafter_gpu[PIPE_MAX_DRAFTERS];
    int64_t target_drafter[PIPE_MAX_TARGETS];
    /* multi-node (docs/MULTINODE.md): net_port 0 = one host (ipc endpoints, every
     * slab mapped; all nodes 0). Else every endpoint is tcp://<node addr>:<port>
     * (runcfg_endpoint) with CURVE, and peers on different nodes move slab bytes
     * with slab_data (CPU) or NCCL (GPU). node_addr[k]: node k's address (0 = the
     * head); node: the receiving stage's node (set by runcfg_from_msg). */
    uint32_t net_port;
    int n_nodes;
    char node_addr[RUNCFG_NODES_MAX][RUNCFG_ADDR_MAX + 1];
    int node, loader_node, optimizer_node;
    int64_t target_node[PIPE_MAX_TARGETS], drafter_node[PIPE_MAX_DRAFTERS];
    int target_precision;        /* TARGET_PRECISION_BF16 (0, default) | _FP8 (--target-precision) */
    int gpu_turns;               /* 1 (runcfg_init's default): targets and drafters that share a GPU
                                  * take turns on it (--gpu-turns; common/pipe/gputurn.h); 0: off */
} run_config_t;

/* Zeroes *c and sets what is not 0 by default: every GPU -1 (CPU), one target and one
 * drafter, target i routed to drafter 0, gpu_turns 1. */
void runcfg_init(run_config_t *c);

/* Checks every field against the limits above and the placement rules (1..64 targets
 * and drafters, routes to an existing drafter, GPUs -1..RUNCFG_GPU_MAX, run id and the
 * data cache, target model and out dir set). Returns 0, or DL_EINVAL / DL_ERANGE with
 * dl_seterr naming the field and its flag, e.g.
 * "run config: token_budget (--token-budget) 8 out of range [16, 2097152]". */
int runcfg_validate(const run_config_t *c);

/* The GPU of stage stage_id (PIPE_ID_*) under c's placement: -1 for the loader, a CPU
 * stage or an index outside the topology. */
int runcfg_stage_gpu(const run_config_t *c, uint32_t stage_id);

/* The node of stage stage_id (PIPE_ID_*): loader_node, optimizer_node, target_node[i],
 * drafter_node[i]; 0 for an id outside the topology. */
int runcfg_stage_node(const run_config_t *c, uint32_t stage_id);

/* How many other targets and drafters of c's placement run on the GPU of stage
 * stage_id, on its node: 0 when it runs alone there, or when it is not a GPU stage
 * or is the optimizer or the loader (neither is counted: the loader has no GPU work,
 * the optimizer's step is short; gpu_turn_setup logs with this count). */
int runcfg_gpu_sharers(const run_config_t *c, uint32_t stage_id);

/* The endpoint of the server `name` ("loader", "optimizer", "drafter<i>", "sup") under
 * c: net_port 0: "ipc://<sock_dir>/<name>.sock" (bus_endpoint); else
 * "tcp://<node_addr[node of name]>:<net_port + offset>" (sup: the head, offset 0).
 * Errors: DL_EINVAL (unknown name), DL_ERANGE (buffer or path too long). */
int runcfg_endpoint(const run_config_t *c, const char *sock_dir, const char *name, char *buf, size_t cap);

/* A live placement from the supervisor (CONTROL PLACEMENT, proto/msg.h op 7: ints =
 * [n_t, n_d, node of target 0..n_t-1, node of drafter 0..n_d-1], n ints, validated by
 * the decoder) into c, the stage's run configuration: n_targets / n_drafters and every
 * target's / drafter's node, so runcfg_endpoint and runcfg_stage_node answer with the
 * new table from now on. Targets or drafters new to c get GPU -1 (their GPU is their
 * own business) and route i mod n_d; c->node (the receiving stage's own node: it does
 * not move while it runs) and the node addresses stay. Returns 1 when a node or a
 * count changed, 0 when nothing did, or DL_EINVAL (n does not match the counts, a
 * count outside 1..PIPE_MAX_*, a node outside c's n_nodes; c unchanged). */
int runcfg_apply_placement(run_config_t *c, const int64_t *ints, uint32_t n);

/* Clears every GPU of the placement (all stages on CPU: the strip_gpu test hook). */
void runcfg_clear_gpus(run_config_t *c);

/* Fills m (initialised here) as the RUN_CONFIG answer to stage stage_id, incarnation
 * inc: every field of c, gpu = runcfg_stage_gpu, drafter = the target's route (-1 for
 * other roles). m's arrays point into c (node_addrs into a per-thread buffer that the
 * next call on this thread rewrites): c must outlive the encode. No validation
 * (stage_send validates before encoding). */
void runcfg_to_msg(const run_config_t *c, uint32_t stage_id, uint64_t inc, proto_msg_t *m);

/* The config a stage received: c from the RUN_CONFIG message r (validated by the
 * decoder). The receiving stage's own placement entry is r->gpu (and r->drafter for a
 * target), so runcfg_stage_gpu(c, r->stage_id) == r->gpu; optimizer_gpu is known only
 * to the optimizer (-1 elsewhere: the message lists targets' and drafters' GPUs only).
 * Returns 0, or DL_EINVAL when
 * r lists more targets or drafters than PIPE_MAX_*. */
int runcfg_from_msg(const proto_run_config_t *r, run_config_t *c);

#endif
