/* Supervisor, live rebalance (see supervisor.h and docs/ARCHITECTURE.md). */
#include "supervisor/sup_int.h"
#include "supervisor/nodes.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/testhook.h"
#include "common/pipe/rbplan.h"

#include <cjson/cJSON.h>

_Static_assert(RBPLAN_MAX_NODES == RUNCFG_NODES_MAX, "one node table size");

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- live rebalance (see docs/ARCHITECTURE.md) ---- */

/* The name of node k of the run's placement table ("head" for 0). */
static const char *node_name(const sup_t *S, int k) {
    return k > 0 && k < S->o->n_nodes ? S->o->node_names[k] : k == 0 ? "head" : "?";
}

/* The rebalance's status as JSON {"id", "status", "message", "seconds", "targets",
 * "drafters"[, "target_gpus", "drafter_gpus"][, "target_nodes", "drafter_nodes"]} to the client that asked (the text of
 * its reply), and run.json. */
static void rb_write_result(sup_t *S) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", S->rb.id);
    cJSON_AddStringToObject(j, "status", S->rb.status);
    cJSON_AddStringToObject(j, "message", S->rb.message);
    cJSON_AddNumberToObject(j, "seconds", S->rb.seconds);
    cJSON_AddNumberToObject(j, "targets", S->nt);
    cJSON_AddNumberToObject(j, "drafters", S->nd);
    if (S->gpu_mode) {
        /* the live placement (run.json has the same lists) */
        char b[2][RBPLAN_MAX * 6];
        int g[2][RBPLAN_MAX], n[2] = {0, 0};
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < (r ? S->nd : S->nt) && i < RBPLAN_MAX; i++) {
                sstage_t *x = sup__by_id(S, (r ? PIPE_ID_DRAFTER0 : PIPE_ID_TARGET0) + (uint32_t)i);
                if (x) g[r][n[r]++] = sup__spec_gpu(x->spec);
            }
        cJSON_AddStringToObject(j, "target_gpus", rbplan_format_gpus(g[0], n[0], b[0], sizeof b[0]));
        cJSON_AddStringToObject(j, "drafter_gpus", rbplan_format_gpus(g[1], n[1], b[1], sizeof b[1]));
    }
    if (S->o->listen_port) {
        /* the node of each target and drafter as the next start of each sees it */
        char b[2][RBPLAN_MAX * 50];
        for (int r = 0; r < 2; r++) {
            size_t k = 0;
            b[r][0] = 0;
            for (int i = 0; i < (r ? S->nd : S->nt) && i < RBPLAN_MAX && k < sizeof b[r]; i++) {
                sstage_t *x = sup__by_id(S, (r ? PIPE_ID_DRAFTER0 : PIPE_ID_TARGET0) + (uint32_t)i);
                k += (size_t)snprintf(b[r] + k, sizeof b[r] - k, "%s%s", i ? "," : "", x ? node_name(S, x->spec->node) : "?");
            }
        }
        cJSON_AddStringToObject(j, "target_nodes", b[0]);
        cJSON_AddStringToObject(j, "drafter_nodes", b[1]);
    }
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    sup__ctl_rb_update(S, txt ? txt : "{}");
    free(txt);
    sup__write_run_json(S);
}

/* A spec of x the rebalance may change: x's own copy in S->xspec (made on first use
 * from the run's spec, which stays untouched). NULL when S->xspec is full. */
static sup_stage_spec_t *spec_own(sup_t *S, sstage_t *x) {
    if (x->spec >= S->xspec && x->spec < S->xspec + SUP_MAX_STAGES) return (sup_stage_spec_t *)x->spec;
    if (S->nx >= SUP_MAX_STAGES) return NULL;
    sup_stage_spec_t *sp = &S->xspec[S->nx++];
    *sp = *x->spec;
    x->spec = sp;
    return sp;
}

/* Sets the GPU of x's spec (the next start of x uses it). Returns 0, or -1 (no room
 * for a spec copy). */
static int spec_set_gpu(sup_t *S, sstage_t *x, int gpu) {
    if (sup__spec_gpu(x->spec) == gpu) return 0;
    sup_stage_spec_t *sp = spec_own(S, x);
    if (!sp) return -1;
    sp->gpu = gpu;
    return 0;
}

/* The stage slot of target/drafter idx: an existing one, or a new one whose spec is
 * target0's/drafter0's with its name and id (index and route travel in its RUN_CONFIG). */
static sstage_t *rb_slot(sup_t *S, int target, int idx) {
    uint32_t id = (target ? PIPE_ID_TARGET0 : PIPE_ID_DRAFTER0) + (uint32_t)idx;
    sstage_t *x = sup__by_id(S, id);
    if (x) return x;
    sstage_t *tpl = sup__by_id(S, target ? PIPE_ID_TARGET0 : PIPE_ID_DRAFTER0);
    if (!tpl || S->n >= SUP_MAX_STAGES || S->nx >= SUP_MAX_STAGES) return NULL;
    sup_stage_spec_t *sp = &S->xspec[S->nx++];
    *sp = *tpl->spec;
    snprintf(sp->name, sizeof sp->name, "%s%d", target ? "target" : "drafter", idx);
    sp->stage_id = id;
    x = &S->st[S->n++];
    memset(x, 0, sizeof *x);
    x->spec = sp;
    x->exited = 1;
    x->pid = -1;
    return x;
}

/* Sets the node of x's spec (its next start goes there); a running incarnation stays
 * on its node (x->node_was, for signals and its exit report) until it exits. Returns
 * 0, or -1 (no room for a spec copy). */
static int spec_set_node(sup_t *S, sstage_t *x, int node) {
    if (x->spec->node == node) return 0;
    int from = x->spec->node;
    sup_stage_spec_t *sp = spec_own(S, x);
    if (!sp) return -1;
    if (!x->exited && !x->node_was) x->node_was = from + 1;
    sp->node = node;
    return 0;
}

/* "a,a,b": the node names of nodes[n] into buf. */
static char *fmt_nodes(const sup_t *S, const int *nodes, int n, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? "," : "", node_name(S, nodes[i]));
    return buf;
}

/* CONTROL PLACEMENT to every live stage, before anything starts, moves or retires:
 * the node of every target and drafter after the rebalance (plan p below N / M; the
 * known slots past them, retiring, keep theirs), so each stage finds its peers on
 * their new nodes (a target routed to a drafter that moves reconnects). */
static void rb_send_placement(sup_t *S, int N, int M, const rbplan_t *p) {
    int64_t ints[2 + PIPE_MAX_TARGETS + PIPE_MAX_DRAFTERS];
    int nt = N, nd = M;
    for (int i = 0; i < S->n; i++) {
        const sstage_t *x = &S->st[i];
        int r = is_target(x), idx = (int)(x->spec->stage_id - (r ? PIPE_ID_TARGET0 : PIPE_ID_DRAFTER0)) + 1;
        if (!r && !is_drafter(x)) continue;
        if (r && idx > nt) nt = idx;
        if (!r && idx > nd) nd = idx;
    }
    ints[0] = nt;
    ints[1] = nd;
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < (r ? nd : nt); i++) {
            sstage_t *x = sup__by_id(S, (r ? PIPE_ID_DRAFTER0 : PIPE_ID_TARGET0) + (uint32_t)i);
            int k = i < (r ? M : N) ? (r ? p->drafter_node[i] : p->target_node[i]) : x ? x->spec->node : 0;
            ints[2 + (r ? nt : 0) + i] = k;
        }
    for (int i = 0; i < S->n; i++) sup__send_ctl(S, &S->st[i], PROTO_CTL_PLACEMENT, ints, (uint32_t)(2 + nt + nd));
}

/* The placement of a multi-node run's rebalance: N / M (CPU) or tg[ntg] / dg[ndg]
 * (GPU) with the nodes of tplace / dplace (as written: "a:2,b:1"; "" = the head),
 * against the run's node table; the refusals of docs/MULTINODE.md section 6 (a name
 * not in the table, a node not up, drafter0 leaving the optimizer's node, GPU pairs
 * across nodes). Fills *plan and N / M: 0, or -1 with why[cap]. */
static int rb_net_plan(sup_t *S, int *N, int *M, const int *tg, int ntg, const int *dg, int ndg, const char *tplace,
                       const char *dplace, rbplan_t *plan, char *why, size_t cap) {
    const sup_opts_t *o = S->o;
    rbplan_nodes_t t = {.n = o->n_nodes > 0 ? o->n_nodes : 1, .fixed = 1};
    for (int k = 0; k < t.n; k++) snprintf(t.name[k], sizeof t.name[k], "%s", k ? o->node_names[k] : "head");
    int gpu = S->gpu_mode, n[2] = {gpu ? ntg : *N, gpu ? ndg : *M};
    int want_g[2][RBPLAN_MAX], want_n[2][RBPLAN_MAX], got[RBPLAN_MAX];
    const char *place[2] = {tplace, dplace};
    const char *flag[2][2] = {{"--targets", "--drafters"}, {"--target-gpus", "--drafter-gpus"}};
    for (int r = 0; r < 2; r++) {
        if (n[r] < 1 || n[r] > RBPLAN_MAX) { snprintf(why, cap, "targets and drafters must be 1..64"); return -1; }
        for (int i = 0; i < n[r]; i++) {
            want_g[r][i] = gpu ? (r ? dg[i] : tg[i]) : -1;
            want_n[r][i] = 0;                      /* a bare list: the head's */
        }
        if (!place[r] || !place[r][0]) continue;
        int c = rbplan_parse_place(flag[gpu][r], place[r], !gpu, &t, got, want_n[r], RBPLAN_MAX);
        if (c < 0) { snprintf(why, cap, "%s", dl_errmsg()); return -1; }
        if (c != n[r] || (gpu && memcmp(got, want_g[r], sizeof(int) * (size_t)c) != 0)) {
            snprintf(why, cap, "%s %.200s: %d process(es), the request says %d", flag[gpu][r], place[r], c, n[r]);
            return -1;
        }
    }
    if (S->fake_nodes) {
        snprintf(why, cap, "the fake_nodes test hook gives each target and drafter a node of its own: "
                           "a rebalance needs the run's real nodes");
        return -1;
    }
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < n[r]; i++) {
            int k = want_n[r][i];
            if (k > 0 && (!S->ntab.on || k >= S->ntab.n || !S->nodes[k].up)) {
                snprintf(why, cap, "node %s is not up (it has not joined, or it was lost): %s%d could not start "
                         "there; wait until its agent joins (`draftline status` lists the nodes)",
                         node_name(S, k), r ? "drafter" : "target", i);
                return -1;
            }
        }
    sstage_t *O = sup__by_id(S, PIPE_ID_OPTIMIZER);
    int on = O ? O->spec->node : 0;
    if (want_n[1][0] != on) {
        snprintf(why, cap, "drafter0 would move from node %s to node %s: the optimizer runs with drafter0 and "
                 "stays on node %s (its checkpoints are there): keep drafter0 on node %s", node_name(S, on),
                 node_name(S, want_n[1][0]), node_name(S, on), node_name(S, on));
        return -1;
    }
    int64_t cross = 0;
    /* nccl_cross: a target may be moved away from its drafter; a GPU drafter away from the
     * optimizer stays refused in a rebalance (the step communicator's rebuild on a live
     * move is for issue 17's two-GPU run to exercise first) */
    if (gpu && rbplan_gpu_pairs_local(want_n[0], n[0], want_n[1], n[1], on, &t,
                                      testhook_i64("nccl_cross", &cross) && cross == 1 ? RBPLAN_CROSS_HIDDEN : 0) < 0) {
        snprintf(why, cap, "%s", dl_errmsg());
        return -1;
    }
    int live[2][RBPLAN_MAX], cg[2][RBPLAN_MAX], cn[2][RBPLAN_MAX];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < RBPLAN_MAX; i++) {
            sstage_t *x = sup__by_id(S, (r ? PIPE_ID_DRAFTER0 : PIPE_ID_TARGET0) + (uint32_t)i);
            live[r][i] = x && x->active && !x->retiring;
            cg[r][i] = x ? sup__spec_gpu(x->spec) : -1;
            cn[r][i] = x ? x->spec->node : 0;
        }
    if (rbplan_make_placed(live[0], cg[0], cn[0], live[1], cg[1], cn[1], want_g[0], want_n[0], n[0], want_g[1],
                           want_n[1], n[1], plan) < 0) {
        snprintf(why, cap, "%s", dl_errmsg());
        return -1;
    }
    *N = n[0];
    *M = n[1];
    return 0;
}

static void rb_reject(sup_t *S, const char *id, const char *msg) {
    snprintf(S->rb.id, sizeof S->rb.id, "%s", id);
    snprintf(S->rb.status, sizeof S->rb.status, "rejected");
    snprintf(S->rb.message, sizeof S->rb.message, "%s", msg);
    S->rb.seconds = 0;
    log_warn("rebalance %s rejected: %s", id, msg);
    rb_write_result(S);
}

/* The live placement of targets (r = 1) or drafters (r = 0) for rbplan_make: the GPU
 * of each index's stage that is part of the topology (running, or restarting after a
 * crash), -1 where there is none (never started, retired, draining). */
static void rb_live_gpus(sup_t *S, int r, int *out) {
    for (int i = 0; i < RBPLAN_MAX; i++) {
        sstage_t *x = sup__by_id(S, (r ? PIPE_ID_TARGET0 : PIPE_ID_DRAFTER0) + (uint32_t)i);
        out[i] = x && x->active && !x->retiring ? sup__spec_gpu(x->spec) : -1;
    }
}

/* Starts an accepted rebalance to N targets and M drafters (GPU runs: by plan): retires
 * the stages beyond them, moves the ones whose GPU changes, starts the new ones and
 * re-routes the targets; rb_tick finishes it. */
static void rb_start(sup_t *S, const char *id, int N, int M, const rbplan_t *p) {
    snprintf(S->rb.id, sizeof S->rb.id, "%s", id);
    S->rb.running = 1;
    S->rb.t0 = clock_mono_s();
    S->rb.from_t = S->nt; S->rb.from_d = S->nd; S->rb.to_t = N; S->rb.to_d = M;
    S->rb.to_gpus[0] = 0;
    int net = S->o->listen_port > 0;
    if (net) {
        char a[RBPLAN_MAX * 50], b[RBPLAN_MAX * 50];
        snprintf(S->rb.to_gpus, sizeof S->rb.to_gpus, " (targets on %s, drafters on %s; %d kept, %d started, "
                 "%d moved, %d retired)", fmt_nodes(S, p->target_node, N, a, sizeof a),
                 fmt_nodes(S, p->drafter_node, M, b, sizeof b), p->n_keep, p->n_start, p->n_move, p->n_retire);
    } else if (S->gpu_mode) {
        char a[RBPLAN_MAX * 6], b[RBPLAN_MAX * 6];
        snprintf(S->rb.to_gpus, sizeof S->rb.to_gpus, " (targets on GPUs %s, drafters on GPUs %s; %d kept, "
                 "%d started, %d moved, %d retired)", rbplan_format_gpus(p->target_gpu, N, a, sizeof a),
                 rbplan_format_gpus(p->drafter_gpu, M, b, sizeof b), p->n_keep, p->n_start,
                 p->n_move, p->n_retire);
    }
    snprintf(S->rb.status, sizeof S->rb.status, "running");
    snprintf(S->rb.message, sizeof S->rb.message, "%d+%d -> %d+%d%s", S->nt, S->nd, N, M, S->rb.to_gpus);
    log_info("rebalance %s: %d target(s) + %d drafter(s) -> %d + %d%s", id, S->nt, S->nd, N, M, S->rb.to_gpus);
    if (net) rb_send_placement(S, N, M, p);   /* every stage knows the new nodes first */
    S->nt = N;
    S->nd = M;
    int ok = 1;
    for (int i = 0; i < PIPE_MAX_TARGETS && ok; i++) {
        sstage_t *x = sup__by_id(S, PIPE_ID_TARGET0 + (uint32_t)i);
        if (i >= N && x && x->active && !x->retiring) {
            x->retiring = 1;    /* the loader re-issues what it held when it is gone */
            x->term_at = clock_mono_s();
            if (!x->exited && x->pid > 0) sup__kill(S, x, SIGTERM);
            else x->active = 0, x->retiring = 0, x->restart_at = 0;
        }
    }
    for (int i = 0; i < PIPE_MAX_DRAFTERS; i++) {
        sstage_t *x = sup__by_id(S, PIPE_ID_DRAFTER0 + (uint32_t)i);
        if (i >= M && x && x->active && !x->retiring) {
            x->retiring = 1;    /* drains, then SIGTERM (sup__rb_tick) */
            x->term_at = 0;
            x->retire_t0 = clock_mono_s();
            x->retire_after = S->last_applied;
            if (x->exited) x->active = 0, x->retiring = 0, x->restart_at = 0;
        }
    }
    /* GPU runs: a stage of an index that stays gets its (new) GPU; multi-node runs: its
     * (new) node. One running elsewhere is stopped there and started at once on the new
     * GPU / node (sup__on_exit, sup__node_can_spawn): a new incarnation, its work re-issued */
    for (int r = 0; r < 2 && (S->gpu_mode || net) && ok; r++)
        for (int i = 0; i < (r ? N : M) && ok; i++) {
            sstage_t *x = rb_slot(S, r, i);
            int g = r ? p->target_gpu[i] : p->drafter_gpu[i], from = x ? sup__spec_gpu(x->spec) : -1;
            int k = r ? p->target_node[i] : p->drafter_node[i], kfrom = x ? x->spec->node : 0;
            if (!x || (S->gpu_mode && spec_set_gpu(S, x, g) < 0) || (net && spec_set_node(S, x, k) < 0)) {
                ok = 0;
                break;
            }
            if ((r ? p->target[i] : p->drafter[i]) != RBPLAN_MOVE || !x->active) continue;
            if (!x->exited && (x->pid > 0 || sup__stage_node(S, x) > 0)) {
                x->moving = 1;
                x->term_at = clock_mono_s();
                sup__kill(S, x, SIGTERM);
                if (net && k != kfrom)
                    log_info("%s: moving from node %s to node %s (stopped there, then started on node %s)",
                             x->spec->name, node_name(S, kfrom), node_name(S, k), node_name(S, k));
                else
                    log_info("%s: moving from GPU %d to GPU %d (stopped, then started again)", x->spec->name,
                             from, g);
            } else if (x->restart_at > 0) {
                x->restart_at = clock_mono_s();   /* it was restarting anyway: on its new GPU / node, now */
            }
        }
    for (int i = 0; i < M && ok; i++) {
        sstage_t *x = rb_slot(S, 0, i);
        if (!x) ok = 0;
        else if (!x->active) sup__spawn(S, x);
    }
    for (int i = 0; i < S->n; i++)   /* re-route the targets that stay */
        if (is_target(&S->st[i]) && S->st[i].active && !S->st[i].retiring) sup__push_route(S, &S->st[i]);
    for (int i = 0; i < N && ok; i++) {
        sstage_t *x = rb_slot(S, 1, i);
        if (!x) ok = 0;
        else if (!x->active) sup__spawn(S, x);
    }
    if (!ok) log_error("rebalance %s: no room for more stages", id);
    rb_write_result(S);
}

void sup__rb_request(sup_t *S, const char *id, int N, int M, const int *tg, int ntg, const int *dg, int ndg,
                     const char *tplace, const char *dplace) {
    char msg[512];
    int gpu_req = ntg > 0 || ndg > 0, net = S->o->listen_port > 0;
    /* GPU runs: the plan per stage index (common/pipe/rbplan.h); multi-node runs:
     * with the node of each index (rb_net_plan) */
    rbplan_t plan;
    memset(&plan, 0, sizeof plan);
    int plan_rc = 0;
    char cur_tg[RBPLAN_MAX * 6] = "", cur_dg[RBPLAN_MAX * 6] = "";
    if (S->gpu_mode) {
        int cg[RBPLAN_MAX], k = 0;
        rb_live_gpus(S, 1, cg);
        for (int i = 0; i < RBPLAN_MAX && cg[i] >= 0; i++) k = i + 1;
        rbplan_format_gpus(cg, k, cur_tg, sizeof cur_tg);
        rb_live_gpus(S, 0, cg);
        k = 0;
        for (int i = 0; i < RBPLAN_MAX && cg[i] >= 0; i++) k = i + 1;
        rbplan_format_gpus(cg, k, cur_dg, sizeof cur_dg);
    }
    if (S->gpu_mode && gpu_req && !net) {
        int ct[RBPLAN_MAX], cd[RBPLAN_MAX];
        rb_live_gpus(S, 1, ct);
        rb_live_gpus(S, 0, cd);
        plan_rc = rbplan_make(ct, cd, tg, ntg, dg, ndg, &plan);
        if (plan_rc == 0) { N = plan.n_targets; M = plan.n_drafters; }
    }
    if (S->stopping) rb_reject(S, id, "the run is stopping");
    else if (S->rb.running) rb_reject(S, id, "a rebalance is already running");
    else if (gpu_req && !S->gpu_mode)
        rb_reject(S, id, "--target-gpus/--drafter-gpus: this run is in CPU mode (use --targets/--drafters)");
    else if (!gpu_req && S->gpu_mode) {
        snprintf(msg, sizeof msg, "this run is in GPU mode: give the new placement as --target-gpus LIST "
                 "--drafter-gpus LIST (now --target-gpus %s --drafter-gpus %s)", cur_tg, cur_dg);
        rb_reject(S, id, msg);
    } else if (!net && ((tplace && tplace[0]) || (dplace && dplace[0])))
        rb_reject(S, id, "the placement names nodes: this run is on one host (started without --listen)");
    else if (net && rb_net_plan(S, &N, &M, tg, ntg, dg, ndg, tplace, dplace, &plan, msg, sizeof msg) < 0)
        rb_reject(S, id, msg);
    else if (S->gpu_mode && plan_rc < 0)
        rb_reject(S, id, dl_errmsg());
    else if (N < 1 || N > PIPE_MAX_TARGETS || M < 1 || M > PIPE_MAX_DRAFTERS)
        rb_reject(S, id, "targets and drafters must be 1..64");
    else if (S->o->lookahead > 0 && S->o->inbox_slots - (N + M - 1) / M < S->o->lookahead) {
        snprintf(msg, sizeof msg, "%d targets per drafter leave less than the loader's lookahead (%d) of a "
                 "drafter's %d inbox slots: the pipeline could deadlock (start the run with a larger --inbox-gb)",
                 (N + M - 1) / M, S->o->lookahead, S->o->inbox_slots);
        rb_reject(S, id, msg);
    } else if (S->gpu_mode || net ? plan.n_start + plan.n_move + plan.n_retire == 0 : N == S->nt && M == S->nd) {
        snprintf(S->rb.id, sizeof S->rb.id, "%s", id);
        snprintf(S->rb.status, sizeof S->rb.status, "done");
        char a[RBPLAN_MAX * 50], b[RBPLAN_MAX * 50];
        if (net)
            snprintf(S->rb.message, sizeof S->rb.message, "already targets on %s, drafters on %s",
                     fmt_nodes(S, plan.target_node, N, a, sizeof a), fmt_nodes(S, plan.drafter_node, M, b, sizeof b));
        else if (S->gpu_mode)
            snprintf(S->rb.message, sizeof S->rb.message, "already targets on GPUs %s, drafters on GPUs %s",
                     cur_tg, cur_dg);
        else
            snprintf(S->rb.message, sizeof S->rb.message, "already %d target(s), %d drafter(s)", N, M);
        S->rb.seconds = 0;
        rb_write_result(S);
    } else {
        rb_start(S, id, N, M, &plan);
    }
}

void sup__rb_tick(sup_t *S) {
    if (!S->rb.running) return;
    double now = clock_mono_s();
    int pending = 0;
    for (int i = 0; i < S->n; i++) {
        sstage_t *x = &S->st[i];
        if (x->retiring) {
            pending++;
            /* a retiring drafter is fed no more (targets re-routed); it stops once a
             * step was applied after the re-route and its inbox is empty, or after 15 s
             * (what it still held is re-issued by the loader) */
            if (is_drafter(x) && x->retire_t0 > 0 && !x->exited && x->pid > 0 &&
                ((S->last_applied > x->retire_after && x->inbox_bytes == 0) || now - x->retire_t0 > 15)) {
                log_info("%s drained: stopping it", x->spec->name);
                sup__kill(S, x, SIGTERM);
                x->retire_t0 = -1;
                x->term_at = now;
            }
            if (x->term_at > 0 && now - x->term_at > 20 && !x->exited && x->pid > 0) {
                log_warn("%s did not stop in 20 s after SIGTERM: SIGKILL", x->spec->name);
                sup__kill(S, x, SIGKILL);
                x->term_at = now;
            }
        } else if (x->moving) {
            /* GPU rebalance: stopped to start on another GPU (sup__reap starts it again) */
            pending++;
            if (x->term_at > 0 && now - x->term_at > 20 && !x->exited && x->pid > 0) {
                log_warn("%s did not stop in 20 s after SIGTERM: SIGKILL", x->spec->name);
                sup__kill(S, x, SIGKILL);
                x->term_at = now;
            }
        } else if (x->active && (x->exited || !x->helloed)) {
            pending++;
        }
    }
    if (!pending) {
        S->rb.running = 0;
        S->rb.seconds = now - S->rb.t0;
        snprintf(S->rb.status, sizeof S->rb.status, "done");
        snprintf(S->rb.message, sizeof S->rb.message, "%d+%d -> %d+%d in %.2f s%s", S->rb.from_t, S->rb.from_d,
                 S->rb.to_t, S->rb.to_d, S->rb.seconds, S->rb.to_gpus);
        log_info("rebalance %s done: %s", S->rb.id, S->rb.message);
        rb_write_result(S);
    }
}
