/* Supervisor, <out>/run.json: fills the rundir_run_t kept in sup_t from the live
 * state and writes it through common/rundir (the format's one owner). */
#include "supervisor/sup_int.h"
#include "supervisor/nodes.h"
#include "supervisor/mps.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/model/target.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *process_of(const sstage_t *x) {
    return !x->active && x->exited ? "retired" : x->retiring ? "draining" : x->moving ? "moving"
           : !x->exited ? "running" : x->restart_at > 0 ? "restarting" : "exited";
}

static void fill_stages(sup_t *S, rundir_run_t *r) {
    r->n_stages = r->n_routes = 0;
    for (int i = 0; i < S->n && r->n_stages < RUNDIR_MAX_STAGES; i++) {
        const sstage_t *x = &S->st[i];
        if (!x->active && x->exited && x->incarnation == 0) continue;
        rundir_stage_t *e = &r->stages[r->n_stages++];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", x->spec->name);
        e->stage_id = x->spec->stage_id;
        e->pid = x->exited ? 0 : x->pid;
        e->incarnation = (int64_t)x->incarnation;
        e->restarts = x->restarts;
        e->gpu = sup__spec_gpu(x->spec);
        if (x->last_recovery_s > 0) e->last_restart_up_s = x->last_up_s, e->last_recovery_s = x->last_recovery_s;
        snprintf(e->process, sizeof e->process, "%s", process_of(x));
        snprintf(e->node, sizeof e->node, "%s", sup__stage_node_name(S, x));
    }
    for (int i = 0; i < S->n && r->n_routes < RUNDIR_MAX_STAGES; i++) {
        const sstage_t *x = &S->st[i];
        if (!is_target(x) || !x->active || x->retiring) continue;
        r->routes[r->n_routes][0] = x->spec->stage_id;
        r->routes[r->n_routes][1] = PIPE_ID_DRAFTER0 + (uint32_t)route_of(S, x->spec->stage_id);
        r->n_routes++;
    }
}

/* The live picture into S->run: the topology (GPU runs: the GPU of target / drafter i
 * of the live topology), state, relay endpoints, the --resume defaults, the last
 * rebalance, every stage and the routes. */
void sup__fill_run(sup_t *S) {
    const sup_opts_t *o = S->o;
    rundir_run_t *r = &S->run;
    rundir_run_init(r);
    snprintf(r->run_id, sizeof r->run_id, "%s", o->run_id);
    snprintf(r->device, sizeof r->device, "%s", S->gpu_mode ? "cuda" : "cpu");
    r->targets = S->nt;
    r->drafters = S->nd;
    for (int k = 0; k < 2 && S->gpu_mode; k++)
        for (int i = 0; i < (k ? S->nd : S->nt); i++)
            for (int j = 0; j < S->n; j++)
                if (S->st[j].spec->stage_id == (k ? PIPE_ID_DRAFTER0 : PIPE_ID_TARGET0) + (uint32_t)i) {
                    int *n = k ? &r->n_drafter_gpus : &r->n_target_gpus;
                    if (*n < RUNDIR_MAX_GPUS) (k ? r->drafter_gpus : r->target_gpus)[(*n)++] = sup__spec_gpu(S->st[j].spec);
                }
    r->max_steps = (int64_t)o->max_steps;
    r->start_step = (int64_t)o->start_step;
    r->micro_batches_per_step = (int64_t)o->mbs_per_step;
    r->supervisor_pid = (int)getpid();
    snprintf(r->sock_dir, sizeof r->sock_dir, "%s", o->sock_dir);
    snprintf(r->state, sizeof r->state, "%s", S->done ? "stopped" : S->stopping ? "stopping"
             : S->rb.running ? "rebalancing" : "running");
    r->metrics_port = S->prom ? S->prom_port : -1;
    if (S->pub) bus_endpoint(o->sock_dir, "metrics", r->metrics_endpoint, sizeof r->metrics_endpoint);
    snprintf(r->control, sizeof r->control, "%s", S->ctl.endpoint);
    r->optimizer_recoveries = S->opt_recoveries;
    r->ckpt_failed_step = S->ckpt_failed_step;
    snprintf(r->ckpt_error, sizeof r->ckpt_error, "%s", S->ckpt_error);
    if (o->target_model) snprintf(r->target_model, sizeof r->target_model, "%s", o->target_model);
    if (o->data) snprintf(r->data, sizeof r->data, "%s", o->data);
    r->save_every = o->save_every;
    r->keep_checkpoints = o->keep_checkpoints;
    r->deterministic = o->deterministic ? 1 : 0;
    if (o->cfg)   /* --resume without --target-precision takes it from here */
        snprintf(r->target_precision, sizeof r->target_precision, "%s",
                 target_precision_name(o->cfg->target_precision));
    snprintf(r->mps, sizeof r->mps, "%s", sup_mps_name(o->mps));   /* --resume takes it */
    snprintf(r->gpu_turns, sizeof r->gpu_turns, "%s", o->gpu_turns ? "on" : "off");   /* and this */
    if (S->rb.id[0]) {
        snprintf(r->rebalance.id, sizeof r->rebalance.id, "%s", S->rb.id);
        snprintf(r->rebalance.status, sizeof r->rebalance.status, "%s", S->rb.status);
        snprintf(r->rebalance.message, sizeof r->rebalance.message, "%s", S->rb.message);
        r->rebalance.seconds = S->rb.seconds;
    }
    if (S->have_step && S->n_losses) {   /* the summary's figures, so far (status, run.json) */
        sup_rates_t t;
        sup__rates(S, clock_mono_s(), &t);
        r->throughput.on = 1;
        r->throughput.steady_tokens_per_s = t.steady;
        r->throughput.steady_from = (int64_t)t.from;
        r->throughput.steady_to = (int64_t)t.to;
        r->throughput.wall_tokens_per_s = t.wall;
        r->throughput.wall_s = t.wall_s;
        r->throughput.startup_s = t.startup_s;
        r->throughput.final_ckpt_s = t.final_ckpt_s;
    }
    fill_stages(S, r);
    for (int k = 0; S->ntab.on && k < S->ntab.n && k < RUNDIR_MAX_NODES; k++) {
        const sup_node_t *nd = &S->nodes[k];
        rundir_node_t *e = &r->nodes[r->n_nodes++];
        snprintf(e->name, sizeof e->name, "%s", nd->name);
        e->index = k;
        snprintf(e->hostname, sizeof e->hostname, "%s", nd->hostname);
        snprintf(e->addr, sizeof e->addr, "%s", nd->addr);
        snprintf(e->run_dir, sizeof e->run_dir, "%s", nd->run_dir);
        e->alive = nd->up;
        e->cores = (int)nd->cores;
        e->gpus = (int)nd->n_gpus;
    }
}

/* <out>/run.json: the run's topology for `draftline status` (of a run that is no
 * longer live) and the monitor. Replaced atomically; a failed write is logged. */
void sup__write_run_json(sup_t *S) {
    sup__fill_run(S);
    if (rundir_run_write(S->o->out_dir, &S->run) < 0) log_warn("run.json: %s", dl_errmsg());
}
