/* `draftline run`'s stage list: the supervisor's options (sup_opts_t), the run's one
 * configuration (run_config_t) and every stage's spec, from the checked settings (see
 * launch_int.h). */
#include "supervisor/launch_int.h"
#include "common/base/err.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void fill_opts(launch_t *L) {
    const run_opts_t *o = L->o;
    sup_opts_t *so = &L->so;
    so->bin_dir = L->bdir;
    so->out_dir = L->out;
    so->sock_dir = L->sock;
    so->run_id = L->run_id;
    so->max_steps = L->max_steps;
    so->start_step = L->start_step;
    so->mbs_per_step = (uint64_t)o->mbs_per_step;
    so->n_targets = o->targets;
    so->n_drafters = o->drafters;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    so->threads_per_stage = o->threads > 0 ? o->threads : (int)(cores / (o->targets + o->drafters) > 0 ? cores / (o->targets + o->drafters) : 1);
    /* GPU mode: the GPUs do the stages' math (the optimizer too); the host threads
     * only sample anchors and stage metadata: a few each */
    if (L->gpu_mode && o->threads == 0) so->threads_per_stage = cores / 4 > 2 ? (int)(cores / 4) : 2;
    so->max_restarts = o->max_restarts;
    so->progress_every_s = o->progress_s;
    so->metrics_port = o->metrics_port;
    so->inbox_slots = L->inbox_slots;
    if (L->net) {
        so->listen_host = L->listen_host;
        so->listen_port = L->listen_port;
        so->key_path = L->key_path;
        so->keys = &L->keys;
        so->nodes_wait = o->nodes;
        so->join_timeout_s = o->join_timeout_s;
    }
    so->n_nodes = 1;
    snprintf(so->node_names[0], sizeof so->node_names[0], "head");
    so->lookahead = L->lookahead;
    /* recorded in run.json (absolute paths) for `draftline run --resume DIR` */
    static char target_abs[PATH_MAX], cache_abs[PATH_MAX];
    so->target_model = realpath(o->target_model, target_abs) ? target_abs : o->target_model;
    so->data = realpath(L->cache, cache_abs) ? cache_abs : L->cache;
    so->save_every = o->save_every;
    so->keep_checkpoints = o->keep_checkpoints;
    so->deterministic = o->deterministic;
    so->mps = o->mps;
    so->gpu_turns = o->gpu_turns;
    so->balance_auto = o->balance_auto;
    so->balance_every_s = o->balance_every_s > 0 ? o->balance_every_s : 60;
    if (o->eval_data) {
        so->eval_data = o->eval_data;
        so->eval_every = o->eval_every;
        so->eval_prompts = o->eval_prompts;
        so->eval_max_new_tokens = o->eval_max_new;
    }
}

/* Appends the spec of stage stage_id (exe, log name, the GPU it starts on) to L->so. */
static void spec_add(launch_t *L, const char *exe, const char *name, uint32_t stage_id, int gpu) {
    sup_stage_spec_t *s = &L->so.stages[L->so.n_stages++];
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->exe, sizeof s->exe, "%s", exe);
    s->stage_id = stage_id;
    s->gpu = gpu;
}

/* A double as a stage got it on its command line ("%.9g") before the run configuration
 * existed: the checkpoint records that value, so run_config_t carries the same one
 * (bitwise the same checkpoints). */
static double as_passed(double x) {
    char b[64];
    snprintf(b, sizeof b, "%.9g", x);
    return strtod(b, NULL);
}

void sup__run_config(const launch_t *L, run_config_t *c) {
    const run_opts_t *o = L->o;
    runcfg_init(c);
    snprintf(c->run_id, sizeof c->run_id, "%s", L->run_id);
    snprintf(c->data_cache, sizeof c->data_cache, "%.4095s", L->cache);
    snprintf(c->target_model, sizeof c->target_model, "%s", o->target_model);
    snprintf(c->out_dir, sizeof c->out_dir, "%.4000s", L->out);
    snprintf(c->cursor_base, sizeof c->cursor_base, "%.4000s/loader.cursor", L->out);
    if (L->resume_dir[0]) {
        snprintf(c->resume_dir, sizeof c->resume_dir, "%.4000s", L->resume_dir);
        snprintf(c->cursor_in, sizeof c->cursor_in, "%.4000s/cursor.bin", L->resume_dir);
        if (access(c->cursor_in, R_OK) != 0) c->cursor_in[0] = 0;
    }
    c->target_fp = L->target_fp;
    c->seed = (uint64_t)o->seed;
    c->token_budget = (uint32_t)o->token_budget;
    c->max_len = o->max_len > 0 ? (uint32_t)o->max_len : 0;
    c->mbs_per_step = (uint32_t)o->mbs_per_step;
    c->epochs = (uint32_t)o->epochs;
    c->max_steps = L->max_steps;
    c->start_step = L->start_step;
    c->lookahead_mbs = (uint32_t)L->lookahead;
    c->drafter_layers = (uint32_t)o->drafter_layers;
    c->block_size = (uint32_t)o->block_size;
    c->num_anchors = (uint32_t)o->num_anchors;
    c->lr = as_passed(o->lr);
    c->warmup_steps = (uint64_t)o->warmup_steps;
    c->weight_decay = as_passed(o->weight_decay);
    c->clip = as_passed(o->clip);
    c->save_every = (uint64_t)o->save_every;
    c->keep_checkpoints = o->keep_checkpoints > 0 ? (uint32_t)o->keep_checkpoints : 0;
    c->inbox_gb = as_passed(o->inbox_gb);
    c->host_inbox_gb = as_passed(o->host_inbox_gb);
    c->hs_min_ready = (uint32_t)o->hs_min_ready;
    c->prefetch = (uint32_t)o->prefetch;
    c->threads = (uint32_t)L->so.threads_per_stage;
    c->deterministic = o->deterministic ? 1 : 0;
    c->target_precision = o->target_precision;
    c->gpu_turns = o->gpu_turns ? 1 : 0;
    c->n_targets = o->targets;
    c->n_drafters = o->drafters;
    for (int i = 0; i < o->targets && i < PIPE_MAX_TARGETS; i++) {
        c->target_gpu[i] = L->gpu_mode ? L->tgpu[i] : -1;
        c->target_drafter[i] = o->drafters > 0 ? i % o->drafters : 0;
    }
    for (int i = 0; i < o->drafters && i < PIPE_MAX_DRAFTERS; i++) c->drafter_gpu[i] = L->gpu_mode ? L->dgpu[i] : -1;
    /* the optimizer keeps master weights and moments on the first drafter GPU */
    c->optimizer_gpu = L->gpu_mode ? L->dgpu[0] : -1;
}

int sup__build_stages(launch_t *L) {
    const run_opts_t *o = L->o;
    fill_opts(L);
    /* recorded in each checkpoint for the --resume check */
    if (!L->target_fp && ckpt_target_fingerprint(o->target_model, &L->target_fp) < 0) L->target_fp = 0;
    sup__run_config(L, &L->cfg);
    if (runcfg_validate(&L->cfg) < 0) {
        fprintf(stderr, "draftline run: %s\n", dl_errmsg());
        return 1;
    }
    L->so.cfg = &L->cfg;
    char name[32];
    spec_add(L, "loader", "loader", PIPE_ID_LOADER, -1);
    /* GPU mode: the optimizer keeps master weights and moments on the first drafter
     * GPU (same-GPU drafters exchange gradients and weights through IPC-mapped device
     * buffers; drafters on other GPUs read/write them over NVLink/PCIe peer access) */
    spec_add(L, "optimizer", "optimizer", PIPE_ID_OPTIMIZER, L->cfg.optimizer_gpu);
    for (int i = 0; i < o->drafters; i++) {
        snprintf(name, sizeof name, "drafter%d", i);
        spec_add(L, "drafter_worker", name, PIPE_ID_DRAFTER0 + (uint32_t)i, (int)L->cfg.drafter_gpu[i]);
    }
    for (int i = 0; i < o->targets; i++) {
        snprintf(name, sizeof name, "target%d", i);
        spec_add(L, "target_worker", name, PIPE_ID_TARGET0 + (uint32_t)i, (int)L->cfg.target_gpu[i]);
    }
    return 0;
}
