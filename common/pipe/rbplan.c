/* Live rebalance plan for GPU runs (see rbplan.h). */
#include "common/pipe/rbplan.h"
#include "common/base/err.h"

#include <stdio.h>
#include <stdlib.h>

int rbplan_parse_gpus(const char *flag, const char *s, int *out, int cap) {
    if (!s || !*s) return dl_seterr(DL_EINVAL, "%s: empty GPU list (give CUDA ordinals such as 0,0,1)", flag);
    int n = 0;
    const char *p = s;
    for (;;) {
        if (*p < '0' || *p > '9')
            return dl_seterr(DL_EINVAL, "%s '%s': entry %d is %s (give CUDA ordinals such as 0,0,1)", flag, s, n,
                             *p == ',' || !*p ? "empty" : "not a number");
        char *end;
        long v = strtol(p, &end, 10);
        if (v > RBPLAN_MAX_GPU) return dl_seterr(DL_EINVAL, "%s '%s': GPU %ld is out of range 0..%d", flag, s, v, RBPLAN_MAX_GPU);
        if (n == cap) return dl_seterr(DL_EINVAL, "%s '%s': more than %d entries", flag, s, cap);
        out[n++] = (int)v;
        if (*end == 0) return n;
        if (*end != ',') return dl_seterr(DL_EINVAL, "%s '%s': unexpected '%c' after entry %d", flag, s, *end, n - 1);
        p = end + 1;
    }
}

char *rbplan_format_gpus(const int *gpus, int n, char *buf, size_t cap) {
    if (!cap) return buf;
    buf[0] = 0;
    size_t k = 0;
    for (int i = 0; i < n && k < cap; i++) {
        int w = snprintf(buf + k, cap - k, "%s%d", i ? "," : "", gpus[i]);
        if (w < 0) break;
        k += (size_t)w;
    }
    return buf;
}

static int plan_role(const char *role, const int *cur, const int *want, int n, int *dst, rbplan_action_t *act,
                     rbplan_t *p) {
    if (n < 1 || n > RBPLAN_MAX) return dl_seterr(DL_EINVAL, "rebalance: %d %s(s): must be 1..%d", n, role, RBPLAN_MAX);
    for (int i = 0; i < n; i++)
        if (want[i] < 0 || want[i] > RBPLAN_MAX_GPU)
            return dl_seterr(DL_EINVAL, "rebalance: %s %d on GPU %d: out of range 0..%d", role, i, want[i], RBPLAN_MAX_GPU);
    for (int i = 0; i < RBPLAN_MAX; i++) {
        int live = cur[i] >= 0;
        dst[i] = i < n ? want[i] : -1;
        if (i < n) act[i] = !live ? RBPLAN_START : cur[i] == want[i] ? RBPLAN_KEEP : RBPLAN_MOVE;
        else act[i] = live ? RBPLAN_RETIRE : RBPLAN_NONE;
        p->n_keep += act[i] == RBPLAN_KEEP;
        p->n_start += act[i] == RBPLAN_START;
        p->n_move += act[i] == RBPLAN_MOVE;
        p->n_retire += act[i] == RBPLAN_RETIRE;
    }
    return 0;
}

int rbplan_make(const int *cur_target_gpu, const int *cur_drafter_gpu, const int *new_target_gpu, int n_t,
                const int *new_drafter_gpu, int n_d, rbplan_t *plan) {
    rbplan_t p = {0};
    p.n_targets = n_t;
    p.n_drafters = n_d;
    DL_TRY(plan_role("target", cur_target_gpu, new_target_gpu, n_t, p.target_gpu, p.target, &p));
    DL_TRY(plan_role("drafter", cur_drafter_gpu, new_drafter_gpu, n_d, p.drafter_gpu, p.drafter, &p));
    *plan = p;
    return 0;
}

const char *rbplan_action_name(rbplan_action_t a) {
    switch (a) {
    case RBPLAN_KEEP: return "keep";
    case RBPLAN_START: return "start";
    case RBPLAN_MOVE: return "move";
    case RBPLAN_RETIRE: return "retire";
    default: return "none";
    }
}
