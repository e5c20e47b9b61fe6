/* One run configuration (see runcfg.h): validation through one table of fields, and
 * the conversion to and from the RUN_CONFIG message. */
#include "common/pipe/runcfg.h"

#include "common/base/err.h"
#include "common/mem/slab.h"
#include "common/model/drafter.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

_Static_assert(DRAFTER_MAX_BLOCK <= DL_PROTO_MAX_BLOCK, "a valid block size fits the wire");
_Static_assert(RUNCFG_PATH_MAX == DL_PROTO_PATH_MAX + 1, "paths fit the wire");

void runcfg_init(run_config_t *c) {
    memset(c, 0, sizeof *c);
    c->n_targets = c->n_drafters = 1;
    c->gpu_turns = 1;
    runcfg_clear_gpus(c);
}

void runcfg_clear_gpus(run_config_t *c) {
    c->optimizer_gpu = -1;
    for (int i = 0; i < PIPE_MAX_TARGETS; i++) c->target_gpu[i] = -1;
    for (int i = 0; i < PIPE_MAX_DRAFTERS; i++) c->drafter_gpu[i] = -1;
}

/* ------------------------------------------------------------ validation */

typedef enum { V_U32, V_U64, V_F64, V_PATH } vkind_t;

typedef struct {
    const char *name, *flag;
    uint8_t kind;
    uint8_t zero_ok;            /* 0 is accepted besides [lo, hi] (max_len: no limit) */
    size_t off;
    double lo, hi;              /* integer bounds fit a double exactly here (< 2^53) or are */
                                /* compared as uint64 (hi_u) */
    uint64_t hi_u;              /* V_U64 upper bound */
} vfield_t;

#define VU32(f, fl, l, h) { #f, fl, V_U32, 0, offsetof(run_config_t, f), (l), (h), 0 }
#define VU64(f, fl, l, h) { #f, fl, V_U64, 0, offsetof(run_config_t, f), (l), 0, (uint64_t)(h) }
#define VF64(f, fl, l, h) { #f, fl, V_F64, 0, offsetof(run_config_t, f), (l), (h), 0 }
#define VPATH(f, fl) { #f, fl, V_PATH, 0, offsetof(run_config_t, f), 0, 0, 0 }

static const vfield_t FIELDS[] = {
    VPATH(data_cache, "--data"),
    VPATH(target_model, "--target-model"),
    VPATH(out_dir, "--out"),
    VU64(seed, "--seed", 0, INT64_MAX),
    VU32(token_budget, "--token-budget", RUNCFG_TOKEN_BUDGET_MIN, RUNCFG_TOKEN_BUDGET_MAX),
    { "max_len", "--max-len", V_U32, 1, offsetof(run_config_t, max_len), RUNCFG_MAX_LEN_MIN,
      RUNCFG_MAX_LEN_MAX, 0 },
    VU32(mbs_per_step, "--micro-batches-per-step", 1, RUNCFG_MBS_PER_STEP_MAX),
    VU32(epochs, "--epochs", 0, RUNCFG_EPOCHS_MAX),
    VU64(max_steps, "--max-steps", 1, RUNCFG_STEPS_MAX),
    VU64(start_step, "--start-step", 0, RUNCFG_STEPS_MAX),
    VU32(lookahead_mbs, "--lookahead-mbs", 0, RUNCFG_LOOKAHEAD_MBS_MAX),
    VU32(drafter_layers, "--drafter-layers", 1, DRAFTER_MAX_LAYERS),
    VU32(block_size, "--block-size", 2, DRAFTER_MAX_BLOCK),
    VU32(num_anchors, "--num-anchors", 1, RUNCFG_NUM_ANCHORS_MAX),
    VF64(lr, "--lr", 0, RUNCFG_LR_MAX),
    VU64(warmup_steps, "--warmup-steps", 0, RUNCFG_COUNT_MAX),
    VF64(weight_decay, "--weight-decay", 0, RUNCFG_WEIGHT_DECAY_MAX),
    VF64(clip, "--clip", 0, RUNCFG_CLIP_MAX),
    VU64(save_every, "--save-every", 0, RUNCFG_COUNT_MAX),
    VU32(keep_checkpoints, "--keep-checkpoints", 0, RUNCFG_KEEP_CKPTS_MAX),
    VF64(inbox_gb, "--inbox-gb", 0, RUNCFG_INBOX_GB_MAX),
    VF64(host_inbox_gb, "--host-inbox-gb", 0, RUNCFG_INBOX_GB_MAX),
    VU32(hs_min_ready, "--hs-min-ready", 1, RUNCFG_HS_MIN_READY_MAX),
    VU32(prefetch, "--prefetch", 1, RUNCFG_PREFETCH_MAX),
    VU32(threads, "--threads", 0, RUNCFG_THREADS_MAX),
};

static int check_field(const run_config_t *c, const vfield_t *f) {
    const char *p = (const char *)c + f->off;
    switch ((vkind_t)f->kind) {
    case V_PATH:
        if (!p[0]) return dl_seterr(DL_EINVAL, "run config: %s (%s) is not set", f->name, f->flag);
        if (strnlen(p, RUNCFG_PATH_MAX) >= RUNCFG_PATH_MAX)
            return dl_seterr(DL_ERANGE, "run config: %s (%s) is not NUL-terminated", f->name, f->flag);
        return 0;
    case V_U32: {
        uint32_t v; memcpy(&v, p, sizeof v);
        if ((v == 0 && f->zero_ok) || (v >= f->lo && v <= f->hi)) return 0;
        return dl_seterr(DL_ERANGE, "run config: %s (%s) %u out of range [%.0f, %.0f]", f->name, f->flag,
                         v, f->lo, f->hi);
    }
    case V_U64: {
        uint64_t v; memcpy(&v, p, sizeof v);
        if (v >= (uint64_t)f->lo && v <= f->hi_u) return 0;
        return dl_seterr(DL_ERANGE, "run config: %s (%s) %llu out of range [%.0f, %llu]", f->name, f->flag,
                         (unsigned long long)v, f->lo, (unsigned long long)f->hi_u);
    }
    case V_F64: {
        double v; memcpy(&v, p, sizeof v);
        if (isfinite(v) && v >= f->lo && v <= f->hi) return 0;
        return dl_seterr(DL_ERANGE, "run config: %s (%s) %g out of range [%g, %g]", f->name, f->flag, v,
                         f->lo, f->hi);
    }
    }
    return 0;
}

/* The wire's bound on net_port (proto/codec_desc.c: 65535 - 200) is tighter than the
 * ports a run uses (RUNCFG_PORT_SPAN): a port between them would pass here and then be
 * refused when the RUN_CONFIG is encoded. */
#define NET_PORT_MAX (65535 - 200)
_Static_assert(NET_PORT_MAX <= 65535 - RUNCFG_PORT_SPAN, "every endpoint port fits");

/* One stage's node v against nodes 0..n-1; field[idx] names it (idx -1: field alone). */
static int check_node(const run_config_t *c, int n, const char *field, int idx, int64_t v) {
    if (v >= 0 && v < n) return 0;
    char name[32];
    if (idx < 0) snprintf(name, sizeof name, "%s", field);
    else snprintf(name, sizeof name, "%s[%d]", field, idx);
    return dl_seterr(DL_ERANGE, "run config: %s %lld: no such node (nodes 0..%d%s)", name, (long long)v, n - 1,
                     c->net_port ? "" : "; a one-host run: --listen not given");
}

/* Nodes: one host (net_port 0) uses node 0 only; else every node index used has an
 * address (bus-id characters: the wire's node_addrs lines) and the ports fit. */
static int check_nodes(const run_config_t *c) {
    int n = c->net_port ? c->n_nodes : 1;
    if (c->net_port && (c->net_port < 1024 || c->net_port > NET_PORT_MAX))
        return dl_seterr(DL_ERANGE, "run config: net_port (--listen) %u out of range [1024, %d]", c->net_port,
                         NET_PORT_MAX);
    if (c->net_port && (c->n_nodes < 1 || c->n_nodes > RUNCFG_NODES_MAX))
        return dl_seterr(DL_ERANGE, "run config: %d nodes (1..%d)", c->n_nodes, RUNCFG_NODES_MAX);
    for (int k = 0; c->net_port && k < c->n_nodes; k++) {
        const char *a = c->node_addr[k];
        if (!a[0]) return dl_seterr(DL_EINVAL, "run config: node %d has no address", k);
        if (strnlen(a, RUNCFG_ADDR_MAX + 1) > RUNCFG_ADDR_MAX)
            return dl_seterr(DL_EINVAL, "run config: node %d address is not NUL-terminated within %d chars", k,
                             RUNCFG_ADDR_MAX);
        for (const char *p = a; *p; p++)
            if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e)
                return dl_seterr(DL_EINVAL, "run config: node %d address has byte 0x%02x (printable ASCII, "
                                 "no space)", k, (unsigned char)*p);
    }
    DL_TRY(check_node(c, n, "loader_node", -1, c->loader_node));
    DL_TRY(check_node(c, n, "optimizer_node", -1, c->optimizer_node));
    DL_TRY(check_node(c, n, "node", -1, c->node));
    for (int i = 0; i < c->n_targets; i++) DL_TRY(check_node(c, n, "target_node", i, c->target_node[i]));
    for (int i = 0; i < c->n_drafters; i++) DL_TRY(check_node(c, n, "drafter_node", i, c->drafter_node[i]));
    return 0;
}

static int check_placement(const run_config_t *c) {
    if (c->n_targets < 1 || c->n_targets > PIPE_MAX_TARGETS)
        return dl_seterr(DL_ERANGE, "run config: n_targets (--targets) %d out of range [1, %d]", c->n_targets,
                         PIPE_MAX_TARGETS);
    if (c->n_drafters < 1 || c->n_drafters > PIPE_MAX_DRAFTERS)
        return dl_seterr(DL_ERANGE, "run config: n_drafters (--drafters) %d out of range [1, %d]",
                         c->n_drafters, PIPE_MAX_DRAFTERS);
    if (c->optimizer_gpu < -1 || c->optimizer_gpu > RUNCFG_GPU_MAX)
        return dl_seterr(DL_ERANGE, "run config: optimizer_gpu %d out of range [-1, %d]", c->optimizer_gpu,
                         RUNCFG_GPU_MAX);
    for (int i = 0; i < c->n_targets; i++) {
        if (c->target_gpu[i] < -1 || c->target_gpu[i] > RUNCFG_GPU_MAX)
            return dl_seterr(DL_ERANGE, "run config: target_gpu[%d] (--target-gpus) %lld out of range [-1, %d]",
                             i, (long long)c->target_gpu[i], RUNCFG_GPU_MAX);
        if (c->target_drafter[i] < 0 || c->target_drafter[i] >= c->n_drafters)
            return dl_seterr(DL_ERANGE, "run config: target_drafter[%d] %lld: no such drafter (%d drafters)", i,
                             (long long)c->target_drafter[i], c->n_drafters);
    }
    for (int i = 0; i < c->n_drafters; i++) {
        if (c->drafter_gpu[i] < -1 || c->drafter_gpu[i] > RUNCFG_GPU_MAX)
            return dl_seterr(DL_ERANGE, "run config: drafter_gpu[%d] (--drafter-gpus) %lld out of range [-1, %d]",
                             i, (long long)c->drafter_gpu[i], RUNCFG_GPU_MAX);
    }
    return check_nodes(c);
}

int runcfg_validate(const run_config_t *c) {
    if (!c) return dl_seterr(DL_EINVAL, "run config: NULL");
    if (strnlen(c->run_id, sizeof c->run_id) >= sizeof c->run_id || !slab_name_ok(c->run_id))
        return dl_seterr(DL_EINVAL, "run config: run_id '%.*s' is not [A-Za-z0-9_.]{1,%u}",
                         (int)sizeof c->run_id, c->run_id, DL_PROTO_RUN_ID_MAX);
    for (size_t i = 0; i < sizeof FIELDS / sizeof FIELDS[0]; i++) DL_TRY(check_field(c, &FIELDS[i]));
    if (c->target_precision != 0 && c->target_precision != 1)
        return dl_seterr(DL_ERANGE, "run config: target_precision (--target-precision) %d is not 0 "
                         "(bf16) or 1 (fp8)", c->target_precision);
    if (c->gpu_turns != 0 && c->gpu_turns != 1)
        return dl_seterr(DL_ERANGE, "run config: gpu_turns (--gpu-turns) %d is not 0 (off) or 1 (on)", c->gpu_turns);
    if (c->deterministic != 0 && c->deterministic != 1)
        return dl_seterr(DL_ERANGE, "run config: deterministic (--deterministic) %d is not 0 or 1",
                         c->deterministic);
    return check_placement(c);
}

/* ------------------------------------------------------------ placement */

int runcfg_stage_gpu(const run_config_t *c, uint32_t id) {
    if (id == PIPE_ID_OPTIMIZER) return c->optimizer_gpu;
    if (id >= PIPE_ID_TARGET0 && id < PIPE_ID_TARGET0 + (uint32_t)c->n_targets)
        return (int)c->target_gpu[id - PIPE_ID_TARGET0];
    if (id >= PIPE_ID_DRAFTER0 && id < PIPE_ID_DRAFTER0 + (uint32_t)c->n_drafters)
        return (int)c->drafter_gpu[id - PIPE_ID_DRAFTER0];
    return -1;
}

int runcfg_stage_node(const run_config_t *c, uint32_t id) {
    if (id == PIPE_ID_LOADER) return c->loader_node;
    if (id == PIPE_ID_OPTIMIZER) return c->optimizer_node;
    if (id >= PIPE_ID_TARGET0 && id < PIPE_ID_TARGET0 + (uint32_t)c->n_targets)
        return (int)c->target_node[id - PIPE_ID_TARGET0];
    if (id >= PIPE_ID_DRAFTER0 && id < PIPE_ID_DRAFTER0 + (uint32_t)c->n_drafters)
        return (int)c->drafter_node[id - PIPE_ID_DRAFTER0];
    return 0;
}

int runcfg_gpu_sharers(const run_config_t *c, uint32_t id) {
    int gpu = runcfg_stage_gpu(c, id), node = runcfg_stage_node(c, id), n = 0;
    if (gpu < 0 || id == PIPE_ID_OPTIMIZER || id == PIPE_ID_LOADER) return 0;
    for (int i = 0; i < c->n_targets + c->n_drafters; i++) {
        uint32_t other = i < c->n_targets ? PIPE_ID_TARGET0 + (uint32_t)i : PIPE_ID_DRAFTER0 + (uint32_t)(i - c->n_targets);
        if (other != id && runcfg_stage_gpu(c, other) == gpu && runcfg_stage_node(c, other) == node) n++;
    }
    return n;
}

int runcfg_apply_placement(run_config_t *c, const int64_t *ints, uint32_t n) {
    if (n < 2 || ints[0] < 1 || ints[0] > PIPE_MAX_TARGETS || ints[1] < 1 || ints[1] > PIPE_MAX_DRAFTERS ||
        (int64_t)n != 2 + ints[0] + ints[1])
        return dl_seterr(DL_EINVAL, "placement: %u ints do not give 1..%d targets and 1..%d drafters with their nodes",
                         n, PIPE_MAX_TARGETS, PIPE_MAX_DRAFTERS);
    int nt = (int)ints[0], nd = (int)ints[1];
    int nodes = c->net_port ? c->n_nodes : 1;
    for (uint32_t i = 2; i < n; i++)
        if (ints[i] < 0 || ints[i] >= nodes)
            return dl_seterr(DL_EINVAL, "placement: node %lld of %s %u is not in this stage's node table (%d nodes)",
                             (long long)ints[i], i < 2 + (uint32_t)nt ? "target" : "drafter",
                             i < 2 + (uint32_t)nt ? i - 2 : i - 2 - (uint32_t)nt, nodes);
    int changed = nt != c->n_targets || nd != c->n_drafters;
    for (int i = c->n_targets; i < nt; i++) c->target_gpu[i] = -1;
    for (int i = c->n_drafters; i < nd; i++) c->drafter_gpu[i] = -1;
    for (int i = 0; i < nt; i++) {
        changed |= c->target_node[i] != ints[2 + i];
        c->target_node[i] = ints[2 + i];
        c->target_drafter[i] = i % nd;
    }
    for (int i = 0; i < nd; i++) {
        changed |= c->drafter_node[i] != ints[2 + nt + i];
        c->drafter_node[i] = ints[2 + nt + i];
    }
    c->n_targets = nt;
    c->n_drafters = nd;
    return changed;
}

int runcfg_endpoint(const run_config_t *c, const char *sock_dir, const char *name, char *buf, size_t cap) {
    if (!c->net_port) return bus_endpoint(sock_dir, name, buf, cap);
    int node, off;
    unsigned i;
    char tail;
    if (!strcmp(name, "sup")) { node = 0; off = 0; }
    else if (!strcmp(name, "loader")) { node = c->loader_node; off = RUNCFG_PORT_LOADER; }
    else if (!strcmp(name, "optimizer")) { node = c->optimizer_node; off = RUNCFG_PORT_OPTIMIZER; }
    else if (!strncmp(name, "drafter", 7) && name[7] >= '0' && name[7] <= '9' &&
             sscanf(name, "drafter%u%c", &i, &tail) == 1 && i < PIPE_MAX_DRAFTERS) {
        node = (int)c->drafter_node[i];
        off = RUNCFG_PORT_DRAFTER0 + (int)i;
    } else return dl_seterr(DL_EINVAL, "endpoint '%s': not a server of the pipeline", name);
    if (node < 0 || node >= c->n_nodes)
        return dl_seterr(DL_EINVAL, "endpoint '%s': node %d has no address (%d nodes)", name, node, c->n_nodes);
    int n = snprintf(buf, cap, "tcp://%s:%u", c->node_addr[node], c->net_port + (unsigned)off);
    if (n < 0 || (size_t)n >= cap) return dl_seterr(DL_ERANGE, "endpoint '%s': too long", name);
    return 0;
}

/* ------------------------------------------------------------ the message */

#define CPY(dst, src) snprintf((dst), sizeof(dst), "%s", (src))

/* A path of c as the message's (pointer, length); strnlen keeps an unterminated
 * path (which runcfg_validate refuses) from being read past its array. */
#define PATH_TO(f) (r->f = c->f, r->n_##f = (uint32_t)strnlen(c->f, DL_PROTO_PATH_MAX + 1))

/* A path of the message into c; a length over the limit (never from the decoder)
 * leaves it "". */
static void path_from(char dst[RUNCFG_PATH_MAX], const char *p, uint32_t n) {
    if (!p || n > DL_PROTO_PATH_MAX) n = 0;
    if (n) memcpy(dst, p, n);
    dst[n] = 0;
}

void runcfg_to_msg(const run_config_t *c, uint32_t stage_id, uint64_t inc, proto_msg_t *m) {
    proto_msg_init(m, PROTO_RUN_CONFIG);
    proto_run_config_t *r = &m->run_config;
    r->stage_id = stage_id;
    r->incarnation = inc;
    CPY(r->run_id, c->run_id);
    PATH_TO(data_cache); PATH_TO(target_model); PATH_TO(out_dir);
    PATH_TO(cursor_base); PATH_TO(cursor_in); PATH_TO(resume_dir);
    r->target_fp = c->target_fp; r->seed = c->seed;
    r->token_budget = c->token_budget; r->max_len = c->max_len;
    r->mbs_per_step = c->mbs_per_step; r->epochs = c->epochs;
    r->max_steps = c->max_steps; r->start_step = c->start_step; r->lookahead_mbs = c->lookahead_mbs;
    r->drafter_layers = c->drafter_layers; r->block_size = c->block_size; r->num_anchors = c->num_anchors;
    r->lr = c->lr; r->warmup_steps = c->warmup_steps; r->weight_decay = c->weight_decay; r->clip = c->clip;
    r->save_every = c->save_every; r->keep_checkpoints = c->keep_checkpoints;
    r->inbox_gb = c->inbox_gb; r->host_inbox_gb = c->host_inbox_gb;
    r->hs_min_ready = c->hs_min_ready; r->prefetch = c->prefetch; r->threads = c->threads;
    r->deterministic = (uint32_t)c->deterministic;
    r->target_precision = (uint32_t)c->target_precision;
    r->gpu_turns = (uint32_t)c->gpu_turns;
    r->gpu = runcfg_stage_gpu(c, stage_id);
    uint32_t t = stage_id - PIPE_ID_TARGET0;
    r->drafter = stage_id >= PIPE_ID_TARGET0 && t < (uint32_t)c->n_targets ? (int32_t)c->target_drafter[t] : -1;
    r->target_gpus = c->target_gpu; r->n_target_gpus = (uint32_t)c->n_targets;
    r->drafter_gpus = c->drafter_gpu; r->n_drafter_gpus = (uint32_t)c->n_drafters;
    r->target_drafters = c->target_drafter; r->n_target_drafters = (uint32_t)c->n_targets;
    r->net_port = c->net_port;
    static _Thread_local char addrs[RUNCFG_NODES_MAX * (RUNCFG_ADDR_MAX + 2) + 1];
    size_t n = 0;
    addrs[0] = 0;
    for (int k = 0; c->net_port && k < c->n_nodes && k < RUNCFG_NODES_MAX; k++)
        n += (size_t)snprintf(addrs + n, sizeof addrs - n, "%s\n", c->node_addr[k]);
    r->node_addrs = addrs; r->n_node_addrs = (uint32_t)n;
    r->node = runcfg_stage_node(c, stage_id);
    r->loader_node = c->loader_node; r->optimizer_node = c->optimizer_node;
    r->target_nodes = c->target_node; r->n_target_nodes = (uint32_t)c->n_targets;
    r->drafter_nodes = c->drafter_node; r->n_drafter_nodes = (uint32_t)c->n_drafters;
}

int runcfg_from_msg(const proto_run_config_t *r, run_config_t *c) {
    if (r->n_target_gpus > PIPE_MAX_TARGETS || r->n_drafter_gpus > PIPE_MAX_DRAFTERS ||
        r->n_target_drafters != r->n_target_gpus)
        return dl_seterr(DL_EINVAL, "run_config: %u targets, %u drafters (at most %d, %d)", r->n_target_gpus,
                         r->n_drafter_gpus, PIPE_MAX_TARGETS, PIPE_MAX_DRAFTERS);
    runcfg_init(c);
    CPY(c->run_id, r->run_id);
    path_from(c->data_cache, r->data_cache, r->n_data_cache);
    path_from(c->target_model, r->target_model, r->n_target_model);
    path_from(c->out_dir, r->out_dir, r->n_out_dir);
    path_from(c->cursor_base, r->cursor_base, r->n_cursor_base);
    path_from(c->cursor_in, r->cursor_in, r->n_cursor_in);
    path_from(c->resume_dir, r->resume_dir, r->n_resume_dir);
    c->target_fp = r->target_fp; c->seed = r->seed;
    c->token_budget = r->token_budget; c->max_len = r->max_len;
    c->mbs_per_step = r->mbs_per_step; c->epochs = r->epochs;
    c->max_steps = r->max_steps; c->start_step = r->start_step; c->lookahead_mbs = r->lookahead_mbs;
    c->drafter_layers = r->drafter_layers; c->block_size = r->block_size; c->num_anchors = r->num_anchors;
    c->lr = r->lr; c->warmup_steps = r->warmup_steps; c->weight_decay = r->weight_decay; c->clip = r->clip;
    c->save_every = r->save_every; c->keep_checkpoints = r->keep_checkpoints;
    c->inbox_gb = r->inbox_gb; c->host_inbox_gb = r->host_inbox_gb;
    c->hs_min_ready = r->hs_min_ready; c->prefetch = r->prefetch; c->threads = r->threads;
    c->deterministic = (int)r->deterministic;
    c->target_precision = (int)r->target_precision;
    c->gpu_turns = (int)r->gpu_turns;
    c->n_targets = (int)r->n_target_gpus;
    c->n_drafters = (int)r->n_drafter_gpus;
    for (uint32_t i = 0; i < r->n_target_gpus; i++) {
        c->target_gpu[i] = r->target_gpus[i];
        c->target_drafter[i] = r->target_drafters[i];
    }
    for (uint32_t i = 0; i < r->n_drafter_gpus; i++) c->drafter_gpu[i] = r->drafter_gpus[i];
    c->net_port = r->net_port;
    c->n_nodes = 0;
    for (uint32_t i = 0, a = 0; i <= r->n_node_addrs && r->node_addrs; i++) {
        if (i < r->n_node_addrs && r->node_addrs[i] != '\n') continue;
        if (i > a) {
            if (c->n_nodes >= RUNCFG_NODES_MAX || i - a > RUNCFG_ADDR_MAX)
                return dl_seterr(DL_EINVAL, "run_config: node address %d of %u bytes (at most %d nodes of "
                                 "%d chars)", c->n_nodes, i - a, RUNCFG_NODES_MAX, RUNCFG_ADDR_MAX);
            memcpy(c->node_addr[c->n_nodes], r->node_addrs + a, i - a);
            c->node_addr[c->n_nodes++][i - a] = 0;
        }
        a = i + 1;
    }
    c->node = r->node; c->loader_node = r->loader_node; c->optimizer_node = r->optimizer_node;
    for (uint32_t i = 0; i < r->n_target_nodes && i < PIPE_MAX_TARGETS; i++) c->target_node[i] = r->target_nodes[i];
    for (uint32_t i = 0; i < r->n_drafter_nodes && i < PIPE_MAX_DRAFTERS; i++) c->drafter_node[i] = r->drafter_nodes[i];
    /* the receiver's own entry is the per-stage field (a moved or GPU-stripped stage) */
    uint32_t id = r->stage_id;
    if (id == PIPE_ID_OPTIMIZER) c->optimizer_gpu = r->gpu;
    else if (id >= PIPE_ID_TARGET0 && id - PIPE_ID_TARGET0 < r->n_target_gpus) {
        c->target_gpu[id - PIPE_ID_TARGET0] = r->gpu;
        if (r->drafter >= 0) c->target_drafter[id - PIPE_ID_TARGET0] = r->drafter;
    } else if (id >= PIPE_ID_DRAFTER0 && id < PIPE_ID_TARGET0 && id - PIPE_ID_DRAFTER0 < r->n_drafter_gpus)
        c->drafter_gpu[id - PIPE_ID_DRAFTER0] = r->gpu;
    return 0;
}
