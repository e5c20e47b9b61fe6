/* Live rebalance plan for GPU runs: what the supervisor does with each target and
 * drafter index when `draftline rebalance --target-gpus L --drafter-gpus L` asks for
 * a new placement. Pure functions (no CUDA, no processes), so the rules are tested
 * on CPU (tests/unit/test_rbplan.c); supervisor/rebalance.c applies the plan.
 *
 * Rules. Stage ids stay dense (target i = index i, routed to drafter i mod M, as in
 * CPU mode), so entry i of the new list is the GPU of target (drafter) i:
 *   - index i < new count, stage live on the same GPU        -> RBPLAN_KEEP (keeps running)
 *   - index i < new count, stage live on another GPU         -> RBPLAN_MOVE (stopped with
 *     SIGTERM and started again at once with the new --gpu: a new incarnation, its
 *     unapplied work re-issued by the loader; the ledger drops duplicates)
 *   - index i < new count, no live stage                     -> RBPLAN_START
 *   - index i >= new count, stage live                       -> RBPLAN_RETIRE (targets:
 *     SIGTERM; drafters: drained at a step boundary, as in CPU mode)
 *   - otherwise                                               -> RBPLAN_NONE
 * Example: targets on "0", drafters on "1"; request "0,0" / "1": target0 KEEP,
 * target1 START (on GPU 0), drafter0 KEEP. Back to "0" / "1": target1 RETIRE. */
#ifndef DL_PIPE_RBPLAN_H
#define DL_PIPE_RBPLAN_H

#include <stddef.h>

#define RBPLAN_MAX 64            /* = PIPE_MAX_TARGETS = PIPE_MAX_DRAFTERS */
#define RBPLAN_MAX_GPU 1023      /* highest accepted CUDA ordinal (as `draftline run`) */

typedef enum { RBPLAN_NONE = 0, RBPLAN_KEEP, RBPLAN_START, RBPLAN_MOVE, RBPLAN_RETIRE } rbplan_action_t;

typedef struct {
    int n_targets, n_drafters;               /* the new counts (list lengths) */
    int target_gpu[RBPLAN_MAX];              /* new GPU per index (< n_targets) */
    int drafter_gpu[RBPLAN_MAX];
    rbplan_action_t target[RBPLAN_MAX];      /* per index, every entry set */
    rbplan_action_t drafter[RBPLAN_MAX];
    int target_node[RBPLAN_MAX];             /* new node per index (rbplan_make_placed; 0 else) */
    int drafter_node[RBPLAN_MAX];
    int n_keep, n_start, n_move, n_retire;   /* over targets and drafters */
} rbplan_t;

/* Parses a GPU list "0,0,1" (decimal ordinals 0..RBPLAN_MAX_GPU, comma separated,
 * no blanks, 1..cap entries) into out[]. flag names the option in errors
 * ("--target-gpus"). Returns the number of entries (>= 1), or DL_EINVAL with a
 * message naming the flag and what is wrong (empty list, empty entry, not a number,
 * ordinal out of range, more than cap entries). */
int rbplan_parse_gpus(const char *flag, const char *s, int *out, int cap);

/* Formats n GPU ordinals as "0,0,1" into buf (cap bytes, always terminated; "" for
 * n = 0). Returns buf. */
char *rbplan_format_gpus(const int *gpus, int n, char *buf, size_t cap);

/* The plan from the live placement to the requested one.
 * cur_target_gpu[i] / cur_drafter_gpu[i] (i < RBPLAN_MAX): the GPU of the live stage
 * with that index, or -1 when there is none (never started, retired); new lists of
 * n_t / n_d entries (1..RBPLAN_MAX, ordinals 0..RBPLAN_MAX_GPU).
 * Fills *plan. Returns 0, or DL_EINVAL (counts or ordinals out of range; message set).
 * The plan changes nothing when n_keep is the only nonzero count. */
int rbplan_make(const int *cur_target_gpu, const int *cur_drafter_gpu, const int *new_target_gpu, int n_t,
                const int *new_drafter_gpu, int n_d, rbplan_t *plan);

/* "keep", "start", "move", "retire", "none". */
const char *rbplan_action_name(rbplan_action_t a);

/* ---- placements that name nodes (docs/MULTINODE.md sections 1 and 6) ---- */

#define RBPLAN_MAX_NODES 16          /* = RUNCFG_NODES_MAX: nodes of one run, 0 = the head */
#define RBPLAN_NODE_NAME_MAX 48      /* = NODE_NAME_CHARS */

/* The node names a placement may use: name[k] is node k (name[0] "head", also taken
 * as the head's name). fixed 0 (`draftline run`): a new name gets the next index;
 * fixed 1 (a live run's table): a name not in it is refused. */
typedef struct {
    char name[RBPLAN_MAX_NODES][64];
    int n;                           /* 1..RBPLAN_MAX_NODES */
    int fixed;
} rbplan_nodes_t;

/* Parses a placement that may name nodes, as `draftline run` and `draftline
 * rebalance` take it: comma-separated entries; a "NAME:" prefix applies to the
 * entries after it until the next one; entries before any prefix are the head's
 * (node 0), so a bare "2" or "0,1" means the head. counts 1 (CPU --targets /
 * --drafters): an entry is a number of processes N (1..64) on the node (out[] = -1
 * each); counts 0 (GPU lists): an entry is a CUDA ordinal N or a range A-B (0..1023),
 * one process each. Writes one out[] (GPU or -1) and node[] (node index in *nodes)
 * per process. Returns the number of processes (1..cap), or DL_EINVAL with
 * "FLAG S: why" (a bad name, more than RBPLAN_MAX_NODES - 1 nodes, a malformed
 * entry, too many processes, empty) or DL_ENOENT "FLAG S: node X is not in this
 * run's node table (head, a, b)" (fixed tables). */
int rbplan_parse_place(const char *flag, const char *s, int counts, rbplan_nodes_t *nodes, int *out, int *node,
                       int cap);

/* GPU placements across nodes (this version has no NCCL between nodes for users):
 * every target i on the node of its drafter i mod n_d, every drafter on the
 * optimizer's node opt_node. 0, or DL_EINVAL naming the first pair that is not
 * ("target1 on node b and its drafter1 on node a: on GPUs the hidden states between
 * nodes move by NCCL, ..."); names: the node names. cross_ok (test hook nccl_cross,
 * bits): RBPLAN_CROSS_HIDDEN, targets may be on another node than their drafter;
 * RBPLAN_CROSS_GRADS, drafters on another node than the optimizer. */
#define RBPLAN_CROSS_HIDDEN 1
#define RBPLAN_CROSS_GRADS 2
int rbplan_gpu_pairs_local(const int *tnode, int n_t, const int *dnode, int n_d, int opt_node,
                           const rbplan_nodes_t *names, int cross_ok);

/* The plan as rbplan_make, with nodes: an index whose stage is live (cur_*_live[i])
 * keeps running only when both its GPU and its node stay, else RBPLAN_MOVE (stopped,
 * started on the new node / GPU). GPUs may be -1 (CPU runs); nodes 0..RBPLAN_MAX_NODES-1.
 * Fills *plan (target_node / drafter_node below). 0, or DL_EINVAL (message set). */
int rbplan_make_placed(const int *cur_t_live, const int *cur_tgpu, const int *cur_tnode, const int *cur_d_live,
                       const int *cur_dgpu, const int *cur_dnode, const int *new_tgpu, const int *new_tnode, int n_t,
                       const int *new_dgpu, const int *new_dnode, int n_d, rbplan_t *plan);

#endif
