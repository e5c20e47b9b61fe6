/* Supervisor, live rebalance (see supervisor.h and docs/ARCHITECTURE.md). */
#include "supervisor/sup_int.h"
#include "supervisor/nodes.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/pipe/rbplan.h"

#include <cjson/cJSON.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- live rebalance (see docs/ARCHITECTURE.md) ---- */

/* The rebalance's status as JSON {"id", "status", "message", "seconds", "targets",
 * "drafters"[, "target_gpus", "drafter_gpus"]} to the client that asked (the text of
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
    if (S->gpu_mode) {
        char a[RBPLAN_MAX * 6], b[RBPLAN_MAX * 6];
        snprintf(S->rb.to_gpus, sizeof S->rb.to_gpus, " (targets on GPUs %s, drafters on GPUs %s; %d kept, "
                 "%d started, %d moved, %d retired)", rbplan_format_gpus(p->target_gpu, N, a, sizeof a),
                 rbplan_format_gpus(p->drafter_gpu, M, b, sizeof b), p->n_keep, p->n_start,
                 p->n_move, p->n_retire);
    }
    snprintf(S->rb.status, sizeof S->rb.status, "running");
    snprintf(S->rb.message, sizeof S->rb.message, "%d+%d -> %d+%d%s", S->nt, S->nd, N, M, S->rb.to_gpus);
    log_info("rebalance %s: %d target(s) + %d drafter(s) -> %d + %d%s", id, S->nt, S->nd, N, M, S->rb.to_gpus);
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
    /* GPU runs: a stage of an index that stays gets its (new) GPU; one running on
     * another GPU is stopped and started at once on the new one (sup__reap) */
    for (int r = 0; r < 2 && S->gpu_mode && ok; r++)
        for (int i = 0; i < (r ? N : M) && ok; i++) {
            sstage_t *x = rb_slot(S, r, i);
            int g = r ? p->target_gpu[i] : p->drafter_gpu[i], from = x ? sup__spec_gpu(x->spec) : -1;
            if (!x || spec_set_gpu(S, x, g) < 0) { ok = 0; break; }
            if ((r ? p->target[i] : p->drafter[i]) != RBPLAN_MOVE || !x->active) continue;
            if (!x->exited && x->pid > 0) {
                x->moving = 1;
                x->term_at = clock_mono_s();
                sup__kill(S, x, SIGTERM);
                log_info("%s: moving from GPU %d to GPU %d (stopped, then started again)", x->spec->name,
                         from, g);
            } else if (x->restart_at > 0) {
                x->restart_at = clock_mono_s();   /* it was restarting anyway: on its new GPU, now */
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

void sup__rb_request(sup_t *S, const char *id, int N, int M, const int *tg, int ntg, const int *dg, int ndg) {
    char msg[256];
    int gpu_req = ntg > 0 || ndg > 0;
    /* GPU runs: the plan per stage index (common/pipe/rbplan.h) */
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
    if (S->gpu_mode && gpu_req) {
        int ct[RBPLAN_MAX], cd[RBPLAN_MAX];
        rb_live_gpus(S, 1, ct);
        rb_live_gpus(S, 0, cd);
        plan_rc = rbplan_make(ct, cd, tg, ntg, dg, ndg, &plan);
        if (plan_rc == 0) { N = plan.n_targets; M = plan.n_drafters; }
    }
    if (S->stopping) rb_reject(S, id, "the run is stopping");
    else if (S->o->listen_port)
        /* the stages' node table is their RUN_CONFIG's: a stage added or moved by a
         * rebalance would be looked for on the wrong node (docs/MULTINODE.md section 6) */
        rb_reject(S, id, "this is a multi-node run: rebalance across nodes is not built yet "
                         "(stop it and `draftline run --resume` it with the new placement)");
    else if (S->rb.running) rb_reject(S, id, "a rebalance is already running");
    else if (gpu_req && !S->gpu_mode)
        rb_reject(S, id, "--target-gpus/--drafter-gpus: this run is in CPU mode (use --targets/--drafters)");
    else if (!gpu_req && S->gpu_mode) {
        snprintf(msg, sizeof msg, "this run is in GPU mode: give the new placement as --target-gpus LIST "
                 "--drafter-gpus LIST (now --target-gpus %s --drafter-gpus %s)", cur_tg, cur_dg);
        rb_reject(S, id, msg);
    } else if (S->gpu_mode && plan_rc < 0)
        rb_reject(S, id, dl_errmsg());
    else if (N < 1 || N > PIPE_MAX_TARGETS || M < 1 || M > PIPE_MAX_DRAFTERS)
        rb_reject(S, id, "targets and drafters must be 1..64");
    else if (S->o->lookahead > 0 && S->o->inbox_slots - (N + M - 1) / M < S->o->lookahead) {
        snprintf(msg, sizeof msg, "%d targets per drafter leave less than the loader's lookahead (%d) of a "
                 "drafter's %d inbox slots: the pipeline could deadlock (start the run with a larger --inbox-gb)",
                 (N + M - 1) / M, S->o->lookahead, S->o->inbox_slots);
        rb_reject(S, id, msg);
    } else if (S->gpu_mode ? plan.n_start + plan.n_move + plan.n_retire == 0 : N == S->nt && M == S->nd) {
        snprintf(S->rb.id, sizeof S->rb.id, "%s", id);
        snprintf(S->rb.status, sizeof S->rb.status, "done");
        if (S->gpu_mode)
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
