/* `draftline run`'s stage list: the supervisor's options (sup_opts_t) and every
 * stage's argv, from the checked settings (see launch_int.h). */
#include "supervisor/launch_int.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    char *s = NULL;
    if (vasprintf(&s, f, ap) < 0) s = NULL;
    va_end(ap);
    return s;
}

static void add(sup_stage_spec_t *s, char *a) { if (s->argc < SUP_MAX_ARGS) s->argv[s->argc++] = a; }

/* The values every stage's argv shares, formatted once (they live as long as the process). */
typedef struct {
    char *K, *seed, *tb, *bs, *dl, *ms, *thr;
} stage_args_t;

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
    so->lookahead = L->lookahead;
    /* recorded in run.json (absolute paths) for `draftline run --resume DIR` */
    static char target_abs[PATH_MAX], cache_abs[PATH_MAX];
    so->target_model = realpath(o->target_model, target_abs) ? target_abs : o->target_model;
    so->data = realpath(L->cache, cache_abs) ? cache_abs : L->cache;
    so->save_every = o->save_every;
    so->keep_checkpoints = o->keep_checkpoints;
    so->deterministic = o->deterministic;
    if (o->eval_data) {
        so->eval_data = o->eval_data;
        so->eval_every = o->eval_every;
        so->eval_prompts = o->eval_prompts;
        so->eval_max_new_tokens = o->eval_max_new;
    }
}

static void spec_loader(launch_t *L, const stage_args_t *A) {
    const run_opts_t *o = L->o;
    char *sock = L->sock, *run_id = L->run_id, *cache = L->cache;
    sup_stage_spec_t *s = &L->so.stages[L->so.n_stages++];
    snprintf(s->name, sizeof s->name, "loader");
    snprintf(s->exe, sizeof s->exe, "loader");
    s->stage_id = 1;
    add(s, "--run-dir"); add(s, sock); add(s, "--run-id"); add(s, run_id); add(s, "--cache"); add(s, cache);
    add(s, "--seed"); add(s, A->seed); add(s, "--token-budget"); add(s, A->tb);
    add(s, "--micro-batches-per-step"); add(s, A->K); add(s, "--epochs"); add(s, fmt("%d", o->epochs));
    add(s, "--max-steps"); add(s, A->ms); add(s, "--start-step"); add(s, fmt("%llu", (unsigned long long)L->start_step));
    add(s, "--lookahead-mbs"); add(s, fmt("%d", L->lookahead));
    if (L->resume_dir[0]) {
        char *cin = fmt("%s/cursor.bin", L->resume_dir);
        if (cin && access(cin, R_OK) == 0) { add(s, "--cursor-in"); add(s, cin); }
    }
    if (o->max_len > 0) { add(s, "--max-len"); add(s, fmt("%d", o->max_len)); }
}

static void spec_optimizer(launch_t *L, const stage_args_t *A) {
    run_opts_t *o = L->o;
    char *sock = L->sock, *run_id = L->run_id, *out = L->out;
    char *cursor_base = fmt("%s/loader.cursor", out);
    sup_stage_spec_t *s = &L->so.stages[L->so.n_stages++];
    snprintf(s->name, sizeof s->name, "optimizer");
    snprintf(s->exe, sizeof s->exe, "optimizer");
    s->stage_id = 2;
    add(s, "--run-dir"); add(s, sock); add(s, "--run-id"); add(s, run_id); add(s, "--out"); add(s, out);
    add(s, "--target-model"); add(s, o->target_model); add(s, "--drafter-layers"); add(s, A->dl);
    add(s, "--block-size"); add(s, A->bs); add(s, "--lr"); add(s, fmt("%.9g", o->lr));
    add(s, "--warmup-steps"); add(s, fmt("%lld", (long long)o->warmup_steps)); add(s, "--max-steps"); add(s, A->ms);
    add(s, "--micro-batches-per-step"); add(s, A->K); add(s, "--weight-decay"); add(s, fmt("%.9g", o->weight_decay));
    add(s, "--clip"); add(s, fmt("%.9g", o->clip)); add(s, "--save-every"); add(s, fmt("%lld", (long long)o->save_every));
    add(s, "--seed"); add(s, A->seed); add(s, "--cursor-base"); add(s, cursor_base);
    if (o->keep_checkpoints > 0) { add(s, "--keep-checkpoints"); add(s, fmt("%lld", (long long)o->keep_checkpoints)); }
    /* recorded in each checkpoint for the --resume check */
    add(s, "--token-budget"); add(s, A->tb);
    add(s, "--max-len"); add(s, fmt("%d", o->max_len > 0 && o->max_len < o->token_budget ? o->max_len : o->token_budget));
    add(s, "--num-anchors"); add(s, fmt("%d", o->num_anchors)); add(s, "--epochs"); add(s, fmt("%d", o->epochs));
    if (!L->target_fp && ckpt_target_fingerprint(o->target_model, &L->target_fp) < 0) L->target_fp = 0;
    if (L->target_fp) { add(s, "--target-fp"); add(s, fmt("%016llx", (unsigned long long)L->target_fp)); }
    if (L->resume_dir[0]) { add(s, "--resume"); add(s, strdup(L->resume_dir)); }
    /* GPU mode: the optimizer keeps master weights and moments on the first drafter
     * GPU (same-GPU drafters exchange gradients and weights through IPC-mapped device
     * buffers; drafters on other GPUs read/write them over NVLink/PCIe peer access) */
    if (L->gpu_mode) { add(s, "--gpu"); add(s, fmt("%d", L->dgpu[0])); }
}

static void spec_drafter(launch_t *L, const stage_args_t *A, int i) {
    run_opts_t *o = L->o;
    sup_stage_spec_t *s = &L->so.stages[L->so.n_stages++];
    snprintf(s->name, sizeof s->name, "drafter%d", i);
    snprintf(s->exe, sizeof s->exe, "drafter_worker");
    s->stage_id = 100 + (uint32_t)i;
    add(s, "--run-dir"); add(s, L->sock); add(s, "--run-id"); add(s, L->run_id); add(s, "--index"); add(s, fmt("%d", i));
    add(s, "--target-model"); add(s, o->target_model); add(s, "--drafter-layers"); add(s, A->dl);
    add(s, "--block-size"); add(s, A->bs); add(s, "--num-anchors"); add(s, fmt("%d", o->num_anchors));
    add(s, "--token-budget"); add(s, A->tb); add(s, "--micro-batches-per-step"); add(s, A->K);
    add(s, "--inbox-gb"); add(s, fmt("%.9g", o->inbox_gb)); add(s, "--host-inbox-gb"); add(s, fmt("%.9g", o->host_inbox_gb));
    add(s, "--hs-min-ready"); add(s, fmt("%d", o->hs_min_ready)); add(s, "--seed"); add(s, A->seed);
    add(s, "--threads"); add(s, A->thr);
    if (L->gpu_mode) { add(s, "--gpu"); add(s, fmt("%d", L->dgpu[i])); }
}

static void spec_target(launch_t *L, const stage_args_t *A, int i) {
    run_opts_t *o = L->o;
    sup_stage_spec_t *s = &L->so.stages[L->so.n_stages++];
    snprintf(s->name, sizeof s->name, "target%d", i);
    snprintf(s->exe, sizeof s->exe, "target_worker");
    s->stage_id = 200 + (uint32_t)i;
    add(s, "--run-dir"); add(s, L->sock); add(s, "--run-id"); add(s, L->run_id); add(s, "--index"); add(s, fmt("%d", i));
    add(s, "--target-model"); add(s, o->target_model); add(s, "--drafter"); add(s, fmt("%d", i % o->drafters));
    add(s, "--drafter-layers"); add(s, A->dl); add(s, "--block-size"); add(s, A->bs);
    add(s, "--token-budget"); add(s, A->tb); add(s, "--threads"); add(s, A->thr);
    add(s, "--prefetch"); add(s, fmt("%d", o->prefetch));
    if (L->gpu_mode) { add(s, "--gpu"); add(s, fmt("%d", L->tgpu[i])); }
}

/* A double as a stage gets it on its command line ("%.9g"): the checkpoint records that
 * value, so run_config_t carries the same one (bitwise the same checkpoints). */
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

void sup__build_stages(launch_t *L) {
    const run_opts_t *o = L->o;
    fill_opts(L);
    stage_args_t A;
    A.K = fmt("%d", o->mbs_per_step);
    A.seed = fmt("%lld", (long long)o->seed);
    A.tb = fmt("%d", o->token_budget);
    A.bs = fmt("%d", o->block_size);
    A.dl = fmt("%d", o->drafter_layers);
    A.ms = fmt("%llu", (unsigned long long)L->max_steps);
    A.thr = fmt("%d", L->so.threads_per_stage);
    spec_loader(L, &A);
    spec_optimizer(L, &A);
    for (int i = 0; i < o->drafters; i++) spec_drafter(L, &A, i);
    for (int i = 0; i < o->targets; i++) spec_target(L, &A, i);
}
