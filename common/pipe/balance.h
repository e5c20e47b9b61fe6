/* `--balance auto`: the target/drafter split chosen from measured stage rates (issue
 * 14 item 5). Pure (no clocks, no processes), so the rule is unit-tested
 * (tests/unit/test_balance.c); supervisor/balance.c measures the rates and applies the
 * plan through the live rebalance.
 *
 * Model. Every target and every drafter has a rate: target tokens it processes per
 * second it is busy (its forward, or its forward/backward; waits excluded), measured over
 * a window. The pipeline's throughput with N targets and M drafters is predicted as
 *     pred(N, M) = min(N x target_rate, min(N, M) x drafter_rate)      target tokens/s
 * (the stages of a role share its work evenly: target i feeds drafter i mod M, so a
 * drafter past the N-th gets nothing; the live split may have such idle drafters). The
 * split shares `units` (CPU: the run's compute processes, N + M; GPU: its GPUs, one
 * stage each), with 1 <= M <= N (a drafter no target feeds would idle) and N, M <= 64.
 * The plan is the split with the best prediction; it moves there only when that beats
 * the current split's prediction by min_gain (relative; e.g. 0.15), so noise does not
 * make it oscillate. It decides nothing when a rate is unknown, or when neither role is
 * busy (mean busy share < busy_floor: the loader or the optimizer limits the run and
 * no split of targets and drafters helps). CPU runs, whose stages share the host's cores,
 * also cap every prediction by cpu_cap: the cores over the CPU-seconds one target token costs
 * the targets and the drafters together (a split moves work between processes, not cores,
 * so the rates per busy second over-promise once the cores are all in use). */
#ifndef DL_PIPE_BALANCE_H
#define DL_PIPE_BALANCE_H

#define BALANCE_MAX 64   /* = PIPE_MAX_TARGETS = PIPE_MAX_DRAFTERS */

typedef struct {
    int n_targets, n_drafters;     /* the live split */
    int units;                     /* N + M to share (>= 2) */
    double target_rate;            /* target tokens per busy second of one target (mean); <= 0 or NaN: unknown */
    double drafter_rate;           /* the same for one drafter */
    double target_busy;            /* mean busy share of the targets over the window, 0..1 */
    double drafter_busy;
    double min_gain;               /* relative gain needed to move (>= 0) */
    double busy_floor;             /* below this on both roles: decide nothing (0..1) */
    double cpu_cap;                /* target tokens/s the cores allow; <= 0 or NaN: no cap */
} balance_in_t;

typedef enum {
    BALANCE_UNKNOWN = 0,           /* not enough data (a rate unknown): nothing decided */
    BALANCE_NOT_LIMITED,           /* neither role busy: another stage limits the run */
    BALANCE_KEEP,                  /* the live split is the best, or close enough */
    BALANCE_MOVE                   /* move to (n_targets, n_drafters) */
} balance_verdict_t;

typedef struct {
    balance_verdict_t verdict;
    int n_targets, n_drafters;     /* the best split (the live one unless MOVE) */
    double now_pred, best_pred;    /* pred() of the live and of the best split, tokens/s */
    char why[320];                 /* one line with the numbers, for the log and the console */
} balance_plan_t;

/* The plan for *in (rules above). Returns 0, or DL_EINVAL (units < 2, a live count
 * outside 1..64, N + M != units, min_gain < 0) with the message set. */
int balance_plan(const balance_in_t *in, balance_plan_t *out);

/* "unknown", "not limited", "keep", "move". */
const char *balance_verdict_name(balance_verdict_t v);

#endif
