/* `--balance auto` planner: see balance.h. */
#include "common/pipe/balance.h"

#include "common/base/err.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const char *balance_verdict_name(balance_verdict_t v) {
    switch (v) {
    case BALANCE_UNKNOWN: return "unknown";
    case BALANCE_NOT_LIMITED: return "not limited";
    case BALANCE_KEEP: return "keep";
    case BALANCE_MOVE: return "move";
    }
    return "?";
}

/* pred(N, M); drafters past the targets' count get no input (target i feeds drafter
 * i mod M), so they count as min(N, M) */
static double pred(const balance_in_t *in, int n, int m) {
    double t = n * in->target_rate, d = (m < n ? m : n) * in->drafter_rate;
    double p = t < d ? t : d;
    return in->cpu_cap > 0 && in->cpu_cap < p ? in->cpu_cap : p;
}

int balance_plan(const balance_in_t *in, balance_plan_t *out) {
    *out = (balance_plan_t){0};
    out->n_targets = in->n_targets;
    out->n_drafters = in->n_drafters;
    if (in->units < 2 || in->n_targets < 1 || in->n_targets > BALANCE_MAX || in->n_drafters < 1 ||
        in->n_drafters > BALANCE_MAX || in->n_targets + in->n_drafters != in->units || !(in->min_gain >= 0))
        return dl_seterr(DL_EINVAL, "balance: split %d+%d of %d units (min gain %g) is not a valid input",
                         in->n_targets, in->n_drafters, in->units, in->min_gain);
    if (!(in->target_rate > 0) || !(in->drafter_rate > 0)) {
        out->verdict = BALANCE_UNKNOWN;
        snprintf(out->why, sizeof out->why, "rates not known yet (targets %.0f, drafters %.0f tokens per busy s)",
                 in->target_rate, in->drafter_rate);
        return 0;
    }
    out->now_pred = pred(in, in->n_targets, in->n_drafters);
    if (!(in->target_busy >= in->busy_floor) && !(in->drafter_busy >= in->busy_floor)) {
        out->verdict = BALANCE_NOT_LIMITED;
        snprintf(out->why, sizeof out->why, "targets %.0f%% busy, drafters %.0f%% busy: neither limits the run "
                 "(the loader or the optimizer does)", 100 * in->target_busy, 100 * in->drafter_busy);
        out->best_pred = out->now_pred;
        return 0;
    }
    int bn = in->n_targets, bm = in->n_drafters;
    double best = out->now_pred;
    for (int m = 1; m <= BALANCE_MAX; m++) {
        int n = in->units - m;
        if (n < m || n > BALANCE_MAX) continue;
        double p = pred(in, n, m);
        if (p > best * (1 + 1e-9)) best = p, bn = n, bm = m;
    }
    out->best_pred = best;
    int move = (bn != in->n_targets || bm != in->n_drafters) && best >= out->now_pred * (1 + in->min_gain);
    out->verdict = move ? BALANCE_MOVE : BALANCE_KEEP;
    if (move) {
        out->n_targets = bn;
        out->n_drafters = bm;
    }
    int m_fed = in->n_drafters < in->n_targets ? in->n_drafters : in->n_targets;
    double tl = in->n_targets * in->target_rate, dl = m_fed * in->drafter_rate;
    const char *limit = in->cpu_cap > 0 && in->cpu_cap < (tl < dl ? tl : dl) ? "the cores" : tl < dl ? "targets" : "drafters";
    snprintf(out->why, sizeof out->why,
             "targets %.0f tok/s per busy s (%.0f%% busy), drafters %.0f (%.0f%% busy): %d+%d predicts %.0f tok/s "
             "(%s limit), %d+%d %.0f tok/s%s", in->target_rate, 100 * in->target_busy, in->drafter_rate,
             100 * in->drafter_busy, in->n_targets, in->n_drafters, out->now_pred, limit, bn, bm, best,
             move ? "" : (bn == in->n_targets && bm == in->n_drafters ? " (the best)" : " (gain below the threshold)"));
    if (in->cpu_cap > 0) {
        size_t w = strlen(out->why);
        snprintf(out->why + w, sizeof out->why - w, "; the cores allow %.0f tok/s", in->cpu_cap);
    }
    return 0;
}
