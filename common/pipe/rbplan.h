/* Live rebalance plan for GPU runs: what the supervisor does with each target and
 * drafter index when `draftline rebalance --target-gpus L --drafter-gpus L` asks for
 * a new placement. Pure functions (no CUDA, no processes), so the rules are tested
 * on CPU (tests/unit/test_rbplan.c); tools/supervisor.c applies the plan.
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

#endif
