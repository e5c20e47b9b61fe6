/* Live rebalance plan for GPU runs (see rbplan.h). */
#include "common/pipe/rbplan.h"
#include "common/base/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- placements that name nodes ---- */

static int name_ok(const char *name) {
    size_t n = strlen(name);
    if (n < 1 || n > RBPLAN_NODE_NAME_MAX) return 0;
    for (const char *p = name; *p; p++)
        if (*p < 0x21 || *p > 0x7e || *p == ':' || *p == ',') return 0;
    return 1;
}

/* The index of node nm in t (added when t is not fixed); -1: table full, -2: unknown. */
static int node_index(rbplan_nodes_t *t, const char *nm) {
    if (!strcmp(nm, "head")) return 0;
    for (int k = 0; k < t->n; k++) if (!strcmp(t->name[k], nm)) return k;
    if (t->fixed) return -2;
    if (t->n >= RBPLAN_MAX_NODES) return -1;
    snprintf(t->name[t->n], sizeof t->name[0], "%s", nm);
    return t->n++;
}

static int unknown_node(const char *flag, const char *s, const char *nm, const rbplan_nodes_t *t) {
    char names[RBPLAN_MAX_NODES * 50];
    size_t k = 0;
    names[0] = 0;
    for (int i = 0; i < t->n && k < sizeof names; i++)
        k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "", t->name[i]);
    return dl_seterr(DL_ENOENT, "%s %s: node %s is not in this run's node table (%s)", flag, s, nm, names);
}

int rbplan_parse_place(const char *flag, const char *s, int counts, rbplan_nodes_t *nodes, int *out, int *node,
                       int cap) {
    int n = 0, cur = 0;
    const char *p = s, *why = NULL;
    while (*p && !why) {
        const char *end = p + strcspn(p, ",");
        const char *colon = memchr(p, ':', (size_t)(end - p));
        if (colon) {
            char nm[64];
            size_t nl = (size_t)(colon - p);
            snprintf(nm, sizeof nm, "%.*s", (int)(nl < sizeof nm - 1 ? nl : sizeof nm - 1), p);
            if (nl >= sizeof nm - 5 || !name_ok(nm)) { why = "a node name is 1..48 characters, no space, ':' or ','"; break; }
            if ((cur = node_index(nodes, nm)) == -2) return unknown_node(flag, s, nm, nodes);
            if (cur < 0) { why = "more than 15 nodes"; break; }
            p = colon + 1;
        }
        char *e;
        long a = strtol(p, &e, 10), b = a;
        if (e != p && !counts && *e == '-') {
            const char *q = e + 1;
            b = strtol(q, &e, 10);
            if (e == q) b = -1;
        }
        if (e == p || e != end || a < (counts ? 1 : 0) || b < a || b > (counts ? 64 : RBPLAN_MAX_GPU)) {
            why = counts ? "expected NAME:N entries, N processes on node NAME (1..64)"
                         : "expected NAME:N or NAME:A-B entries, CUDA ordinals 0..1023";
            break;
        }
        for (long v = a; v <= (counts ? a : b) && !why; v++) {
            for (long r = 0; r < (counts ? a : 1); r++) {
                if (n == cap) { why = "too many processes"; break; }
                out[n] = counts ? -1 : (int)v;
                node[n++] = cur;
            }
        }
        p = *end ? end + 1 : end;
    }
    if (!why && n == 0) why = "empty";
    if (why) return dl_seterr(DL_EINVAL, "%s %s: %s", flag, s, why);
    return n;
}

int rbplan_gpu_pairs_local(const int *tnode, int n_t, const int *dnode, int n_d, int opt_node,
                           const rbplan_nodes_t *names, int cross_ok) {
    const char *why = NULL;
    char a[32] = "", b[40] = "";
    int na = 0, nb = 0;
    for (int i = 0; i < n_t && !why && !(cross_ok & RBPLAN_CROSS_HIDDEN); i++) {
        int d = i % n_d;
        if (tnode[i] != dnode[d]) {
            snprintf(a, sizeof a, "target%d", i); snprintf(b, sizeof b, "its drafter%d", d);
            na = tnode[i]; nb = dnode[d]; why = "hidden states";
        }
    }
    for (int j = 0; j < n_d && !why && !(cross_ok & RBPLAN_CROSS_GRADS); j++) {
        if (dnode[j] != opt_node) {
            snprintf(a, sizeof a, "drafter%d", j); snprintf(b, sizeof b, "the optimizer (with drafter0)");
            na = dnode[j]; nb = opt_node; why = "gradients and weights";
        }
    }
    if (!why) return 0;
    const char *nma = na >= 0 && na < names->n ? names->name[na] : "?", *nmb = nb >= 0 && nb < names->n ? names->name[nb] : "?";
    return dl_seterr(DL_EINVAL, "%s on node %s and %s on node %s: on GPUs the %s between nodes move by "
                     "NCCL, which this version does not have yet; place target i on the node of drafter i mod M, "
                     "and every drafter on one node (CPU runs move them over the network)", a, nma, b, nmb, why);
}

static int plan_placed(const char *role, const int *live, const int *cg, const int *cn, const int *wg, const int *wn,
                       int n, int *dg, int *dn, rbplan_action_t *act, rbplan_t *p) {
    if (n < 1 || n > RBPLAN_MAX) return dl_seterr(DL_EINVAL, "rebalance: %d %s(s): must be 1..%d", n, role, RBPLAN_MAX);
    for (int i = 0; i < n; i++) {
        if (wg[i] < -1 || wg[i] > RBPLAN_MAX_GPU)
            return dl_seterr(DL_EINVAL, "rebalance: %s %d on GPU %d: out of range 0..%d", role, i, wg[i], RBPLAN_MAX_GPU);
        if (wn[i] < 0 || wn[i] >= RBPLAN_MAX_NODES)
            return dl_seterr(DL_EINVAL, "rebalance: %s %d on node %d: out of range 0..%d", role, i, wn[i],
                             RBPLAN_MAX_NODES - 1);
    }
    for (int i = 0; i < RBPLAN_MAX; i++) {
        dg[i] = i < n ? wg[i] : -1;
        dn[i] = i < n ? wn[i] : 0;
        if (i < n) act[i] = !live[i] ? RBPLAN_START : cg[i] == wg[i] && cn[i] == wn[i] ? RBPLAN_KEEP : RBPLAN_MOVE;
        else act[i] = live[i] ? RBPLAN_RETIRE : RBPLAN_NONE;
        p->n_keep += act[i] == RBPLAN_KEEP;
        p->n_start += act[i] == RBPLAN_START;
        p->n_move += act[i] == RBPLAN_MOVE;
        p->n_retire += act[i] == RBPLAN_RETIRE;
    }
    return 0;
}

int rbplan_make_placed(const int *cur_t_live, const int *cur_tgpu, const int *cur_tnode, const int *cur_d_live,
                       const int *cur_dgpu, const int *cur_dnode, const int *new_tgpu, const int *new_tnode, int n_t,
                       const int *new_dgpu, const int *new_dnode, int n_d, rbplan_t *plan) {
    rbplan_t p = {0};
    p.n_targets = n_t;
    p.n_drafters = n_d;
    DL_TRY(plan_placed("target", cur_t_live, cur_tgpu, cur_tnode, new_tgpu, new_tnode, n_t, p.target_gpu,
                       p.target_node, p.target, &p));
    DL_TRY(plan_placed("drafter", cur_d_live, cur_dgpu, cur_dnode, new_dgpu, new_dnode, n_d, p.drafter_gpu,
                       p.drafter_node, p.drafter, &p));
    *plan = p;
    return 0;
}
