/* draftline wire protocol codec: the descriptor tables and the enum names.
 *
 * Each message type is a table of field descriptors (name, kind, offset in
 * proto_msg_t, range) plus an optional cross-field check; proto/codec.c walks
 * them to encode and decode, proto/codec_check.c to validate. The field order
 * here is the wire order (PROTOCOL.md).
 */
#include "proto/codec_int.h"

#include "common/base/err.h"

#include <float.h>
#include <stdint.h>
#include <string.h>

_Static_assert(sizeof(proto_type_t) == 4 && sizeof(proto_role_t) == 4 &&
               sizeof(proto_state_t) == 4 && sizeof(proto_tier_t) == 4 &&
               sizeof(proto_dtype_t) == 4 && sizeof(proto_ctl_op_t) == 4 &&
               sizeof(proto_ctlreq_op_t) == 4,
               "enum fields are stored as 4-byte values");

/* ------------------------------------------------------------------ names */

static const char *const TYPE_NAMES[PROTO_TYPE_COUNT_] = {
    "?", "hello", "heartbeat", "work_request", "micro_batch", "slab_export",
    "slot_grant", "hidden_states_ready", "slot_release", "gradients_ready",
    "weights_version", "metrics", "control", "applied", "error", "ctl_request", "ctl_reply",
    [PROTO_RUN_CONFIG] = "run_config", "slab_data", "node_hello", "node_welcome", "node_spawn",
    "node_signal", "node_stage", "nccl_id",
};
static const char *const ROLE_NAMES[PROTO_ROLE_COUNT_] = {
    "?", "loader", "target", "drafter", "optimizer", "supervisor", "monitor",
};
static const char *const STATE_NAMES[PROTO_STATE_COUNT_] = {
    "?", "starting", "idle", "running", "blocked", "draining", "stopping",
};
static const char *const CTLREQ_NAMES[PROTO_CTLREQ_COUNT_] = {
    "?", "status", "stop", "rebalance", "subscribe",
};
static const char *const TIER_NAMES[PROTO_TIER_COUNT_] = { "?", "gpu", "host" };
static const char *const DTYPE_NAMES[PROTO_DTYPE_COUNT_] = { "?", "bf16", "f16", "f32" };
static const char *const CTL_NAMES[PROTO_CTL_COUNT_] = {
    "?", "rebalance", "drain", "stop", "route", "membership", "resume", "placement", "peers",
};

#define NAME_OF(tab, n, v) ((unsigned)(v) < (unsigned)(n) && (tab)[(unsigned)(v)] ? (tab)[(unsigned)(v)] : "?")
const char *proto_type_name(proto_type_t t) { return NAME_OF(TYPE_NAMES, PROTO_TYPE_COUNT_, t); }
const char *proto_role_name(proto_role_t r) { return NAME_OF(ROLE_NAMES, PROTO_ROLE_COUNT_, r); }
const char *proto_state_name(proto_state_t s) { return NAME_OF(STATE_NAMES, PROTO_STATE_COUNT_, s); }
const char *proto_tier_name(proto_tier_t t) { return NAME_OF(TIER_NAMES, PROTO_TIER_COUNT_, t); }
const char *proto_dtype_name(proto_dtype_t d) { return NAME_OF(DTYPE_NAMES, PROTO_DTYPE_COUNT_, d); }
const char *proto_ctl_op_name(proto_ctl_op_t op) { return NAME_OF(CTL_NAMES, PROTO_CTL_COUNT_, op); }
const char *proto_ctlreq_op_name(proto_ctlreq_op_t op) { return NAME_OF(CTLREQ_NAMES, PROTO_CTLREQ_COUNT_, op); }

int proto_role_parse(const char *s, proto_role_t *out) {
    for (int r = 1; r < PROTO_ROLE_COUNT_; r++) {
        if (s && strcmp(s, ROLE_NAMES[r]) == 0) { *out = (proto_role_t)r; return 0; }
    }
    return dl_seterr(DL_EINVAL, "role '%s': expected loader|target|drafter|optimizer|"
                     "supervisor|monitor", s ? s : "(null)");
}

size_t proto_dtype_size(proto_dtype_t d) {
    switch (d) {
    case PROTO_DTYPE_BF16: case PROTO_DTYPE_F16: return 2;
    case PROTO_DTYPE_F32: return 4;
    default: return 0;
    }
}

/* ------------------------------------------------------- field tables */

#define OFF(path) ((uint32_t)offsetof(proto_msg_t, path))
#define F_U32(T, f, lo, hi) { .name = #f, .kind = K_U32, .off = OFF(T.f), .ulo = (lo), .uhi = (hi) }
#define F_U64(T, f, lo, hi) { .name = #f, .kind = K_U64, .off = OFF(T.f), .ulo = (lo), .uhi = (hi) }
#define F_I32(T, f, lo, hi) { .name = #f, .kind = K_I32, .off = OFF(T.f), .slo = (lo), .shi = (hi) }
#define F_ENUM(T, f, count) { .name = #f, .kind = K_ENUM, .off = OFF(T.f), .ulo = 1, .uhi = (count) - 1 }
#define F_F64(T, f, lo, hi, fl) { .name = #f, .kind = K_F64, .flags = (fl), .off = OFF(T.f), \
                                  .dlo = (lo), .dhi = (hi) }
#define F_STR(T, f, minlen, maxlen, fl) { .name = #f, .kind = K_STR, .flags = (fl), .off = OFF(T.f), \
                                          .min_n = (minlen), .max_n = (maxlen) }
#define F_OPAQUE(T, f, lenf) { .name = #f, .kind = K_OPAQUE, .off = OFF(T.f), .n_off = OFF(T.lenf), \
                               .max_n = DL_PROTO_HANDLE_BYTES }
#define F_OPAQUE_N(T, f, lenf, n) { .name = #f, .kind = K_OPAQUE, .off = OFF(T.f), .n_off = OFF(T.lenf), \
                                    .max_n = (n) }
#define F_ARR(K, T, f, nf, mn, mx) .name = #f, .kind = (K), .off = OFF(T.f), .n_off = OFF(T.nf), \
                                   .min_n = (mn), .max_n = (mx)

#define UANY UINT64_MAX
#define U32ANY UINT32_MAX
#define F_STAGE(T, f) F_U32(T, f, 0, DL_PROTO_MAX_STAGE_ID)

static const field_t F_HELLO[] = {
    F_ENUM(hello, role, PROTO_ROLE_COUNT_),
    F_STAGE(hello, stage_id),
    F_U64(hello, incarnation, 1, UANY),
    F_U32(hello, pid, 1, U32ANY),
    F_U32(hello, proto_version, DL_PROTO_VERSION, DL_PROTO_VERSION),
    F_U64(hello, capabilities, 0, PROTO_CAP_ALL_),
    F_STR(hello, gpu_uuid, 0, DL_PROTO_UUID_MAX, FL_PRINTABLE),
    F_OPAQUE_N(hello, cred, cred_len, DL_PROTO_CRED_BYTES),
};
static const field_t F_HEARTBEAT[] = {
    F_STAGE(heartbeat, stage_id),
    F_U64(heartbeat, incarnation, 1, UANY),
    F_U64(heartbeat, seq, 0, UANY),
    F_ENUM(heartbeat, state, PROTO_STATE_COUNT_),
};
static const field_t F_WORK_REQUEST[] = {
    F_STAGE(work_request, target_id),
    F_U32(work_request, count, 1, DL_PROTO_MAX_COUNT),
};
static const field_t F_MICRO_BATCH[] = {
    F_U64(micro_batch, mb, 0, UANY - 1),
    F_U64(micro_batch, step, 0, UANY),
    F_U32(micro_batch, epoch, 0, U32ANY),
    F_U32(micro_batch, mb_in_step, 0, U32ANY),
    F_U32(micro_batch, mbs_in_step, 1, U32ANY),
    F_U32(micro_batch, n_seqs, 1, DL_PROTO_MAX_SEQS),
    { F_ARR(K_I32BIN, micro_batch, tokens, n_tokens, 1, DL_PROTO_MAX_TOKENS), .slo = 0, .shi = INT32_MAX },
    { F_ARR(K_I32BIN, micro_batch, seq_lens, n_seq_lens, 1, DL_PROTO_MAX_SEQS),
      .slo = 1, .shi = DL_PROTO_MAX_TOKENS },
    { F_ARR(K_U8BIN, micro_batch, loss_mask, n_loss_mask, 1, DL_PROTO_MAX_TOKENS), .ulo = 0, .uhi = 1 },
};
static const field_t F_SLAB_EXPORT[] = {
    F_STAGE(slab_export, owner_id),
    F_U64(slab_export, incarnation, 1, UANY),
    F_U32(slab_export, slab_id, 0, U32ANY),
    F_ENUM(slab_export, tier, PROTO_TIER_COUNT_),
    F_U64(slab_export, bytes, 1, DL_PROTO_MAX_SLAB_BYTES),
    F_OPAQUE(slab_export, handle, handle_len),
    F_STR(slab_export, shm_name, 0, DL_PROTO_SHM_NAME_MAX, FL_PRINTABLE),
    F_STR(slab_export, gpu_uuid, 0, DL_PROTO_UUID_MAX, FL_PRINTABLE),
};
static const field_t F_SLOT_GRANT[] = {
    F_STAGE(slot_grant, drafter_id),
    F_STAGE(slot_grant, target_id),
    F_U32(slot_grant, slot_id, 0, U32ANY),
    F_ENUM(slot_grant, tier, PROTO_TIER_COUNT_),
    F_U32(slot_grant, slab_id, 0, U32ANY),
    F_U64(slot_grant, offset, 0, DL_PROTO_MAX_OFFSET),
    F_U64(slot_grant, bytes, 1, DL_PROTO_MAX_SLAB_BYTES),
};
static const field_t F_HIDDEN_STATES_READY[] = {
    F_STAGE(hidden_states_ready, target_id),
    F_STAGE(hidden_states_ready, drafter_id),
    F_U32(hidden_states_ready, slab_id, 0, U32ANY),
    F_U32(hidden_states_ready, slot_id, 0, U32ANY),
    F_ENUM(hidden_states_ready, tier, PROTO_TIER_COUNT_),
    F_U64(hidden_states_ready, offset, 0, DL_PROTO_MAX_OFFSET),
    F_U64(hidden_states_ready, bytes, 1, DL_PROTO_MAX_SLAB_BYTES),
    F_ENUM(hidden_states_ready, dtype, PROTO_DTYPE_COUNT_),
    { .name = "shape", .kind = K_DIMS, .off = OFF(hidden_states_ready.shape),
      .n_off = OFF(hidden_states_ready.ndim), .min_n = 2, .max_n = 2, .ulo = 1, .uhi = DL_PROTO_MAX_DIM },
    F_U32(hidden_states_ready, n_feat, 1, DL_PROTO_MAX_FEAT),
    F_U64(hidden_states_ready, mb, 0, UANY - 1),
    F_U64(hidden_states_ready, step, 0, UANY),
    F_U32(hidden_states_ready, mb_in_step, 0, U32ANY),
    F_U32(hidden_states_ready, mbs_in_step, 1, U32ANY),
    F_U32(hidden_states_ready, n_seqs, 1, DL_PROTO_MAX_SEQS),
    { F_ARR(K_I32BIN, hidden_states_ready, tokens, n_tokens, 1, DL_PROTO_MAX_TOKENS), .slo = 0, .shi = INT32_MAX },
    { F_ARR(K_I32BIN, hidden_states_ready, seq_lens, n_seq_lens, 1, DL_PROTO_MAX_SEQS),
      .slo = 1, .shi = DL_PROTO_MAX_TOKENS },
    { F_ARR(K_U8BIN, hidden_states_ready, loss_mask, n_loss_mask, 1, DL_PROTO_MAX_TOKENS), .ulo = 0, .uhi = 1 },
    F_OPAQUE(hidden_states_ready, event, event_len),
    F_STR(hidden_states_ready, gpu_uuid, 0, DL_PROTO_UUID_MAX, FL_PRINTABLE),
};
static const field_t F_SLOT_RELEASE[] = {
    F_STAGE(slot_release, drafter_id),
    F_U32(slot_release, slot_id, 0, U32ANY),
    F_U64(slot_release, mb, 0, UANY),
};
static const field_t F_GRADIENTS_READY[] = {
    F_STAGE(gradients_ready, drafter_id),
    F_U64(gradients_ready, step, 0, UANY),
    F_U64(gradients_ready, weights_version, 0, UANY),
    { F_ARR(K_U64S, gradients_ready, mbs, n_mbs, 1, DL_PROTO_MAX_MBS), .ulo = 0, .uhi = UANY - 1 },
    F_U64(gradients_ready, n_tokens, 0, UANY),
    F_F64(gradients_ready, loss_sum, -DBL_MAX, DBL_MAX, FL_NONFINITE),
    F_F64(gradients_ready, weight_sum, 0.0, DBL_MAX, 0),
    { F_ARR(K_F32S, gradients_ready, acc, n_acc, 0, DL_PROTO_MAX_BLOCK), .dlo = 0.0, .dhi = 1.0 },
    F_U32(gradients_ready, slab_id, 0, U32ANY),
    F_U64(gradients_ready, offset, 0, DL_PROTO_MAX_OFFSET),
    F_U64(gradients_ready, bytes, 0, DL_PROTO_MAX_SLAB_BYTES),
    F_U64(gradients_ready, n_params, 0, DL_PROTO_MAX_SLAB_BYTES / 4),
    F_OPAQUE(gradients_ready, event, event_len),
};
static const field_t F_WEIGHTS_VERSION[] = {
    F_U64(weights_version, version, 0, UANY),
    F_U32(weights_version, slab_id, 0, U32ANY),
    F_U64(weights_version, offset, 0, DL_PROTO_MAX_OFFSET),
    F_U64(weights_version, bytes, 0, DL_PROTO_MAX_SLAB_BYTES),
    F_U64(weights_version, n_params, 0, DL_PROTO_MAX_SLAB_BYTES / 2),
    F_ENUM(weights_version, dtype, PROTO_DTYPE_COUNT_),
    F_OPAQUE(weights_version, event, event_len),
};
static const field_t F_METRICS[] = {
    F_STAGE(metrics, stage_id),
    F_ENUM(metrics, role, PROTO_ROLE_COUNT_),
    F_U64(metrics, incarnation, 1, UANY),
    F_U64(metrics, ts_ns, 0, UANY),
    F_STR(metrics, state, 0, DL_PROTO_NAME_MAX, FL_PRINTABLE),
    { .name = "metrics", .kind = K_METRICS, .off = OFF(metrics.metrics), .n_off = OFF(metrics.n_metrics),
      .min_n = 0, .max_n = DL_PROTO_MAX_METRICS },
};
static const field_t F_CONTROL[] = {
    F_ENUM(control, op, PROTO_CTL_COUNT_),
    F_U64(control, seq, 0, UANY),
    F_U64(control, step, 0, UANY),
    { F_ARR(K_I64S, control, ints, n_ints, 0, DL_PROTO_MAX_INTS), .slo = INT64_MIN, .shi = INT64_MAX },
    F_STR(control, arg, 0, DL_PROTO_ARG_MAX, 0),
};
static const field_t F_APPLIED[] = {
    F_U64(applied, step, 0, UANY),
    { F_ARR(K_U64S, applied, mbs, n_mbs, 1, DL_PROTO_MAX_MBS), .ulo = 0, .uhi = UANY - 1 },
};
static const field_t F_ERROR[] = {
    F_I32(error, code, -1000, -1),
    F_U32(error, ref_type, 0, PROTO_TYPE_COUNT_ - 1),
    F_STR(error, message, 0, DL_PROTO_ERRMSG_MAX, 0),
};
static const field_t F_CTL_REQUEST[] = {
    F_U64(ctl_request, id, 0, UANY),
    F_ENUM(ctl_request, op, PROTO_CTLREQ_COUNT_),
    F_U32(ctl_request, flags, 0, PROTO_CTLREQ_FLAGS_ALL_),
    F_U32(ctl_request, targets, 0, DL_PROTO_CTL_STAGES_MAX),
    F_U32(ctl_request, drafters, 0, DL_PROTO_CTL_STAGES_MAX),
    { F_ARR(K_I64S, ctl_request, target_gpus, n_target_gpus, 0, DL_PROTO_CTL_GPUS_MAX),
      .slo = 0, .shi = DL_PROTO_CTL_GPU_MAX },
    { F_ARR(K_I64S, ctl_request, drafter_gpus, n_drafter_gpus, 0, DL_PROTO_CTL_GPUS_MAX),
      .slo = 0, .shi = DL_PROTO_CTL_GPU_MAX },
    F_STR(ctl_request, target_place, 0, DL_PROTO_CTL_PLACE_MAX, FL_PRINTABLE),
    F_STR(ctl_request, drafter_place, 0, DL_PROTO_CTL_PLACE_MAX, FL_PRINTABLE),
};
static const field_t F_CTL_REPLY[] = {
    F_U64(ctl_reply, id, 0, UANY),
    F_I32(ctl_reply, code, -1000, 0),
    F_STR(ctl_reply, state, 1, DL_PROTO_NAME_MAX, FL_PRINTABLE),
    { F_ARR(K_U8BIN, ctl_reply, text, n_text, 0, DL_PROTO_CTL_TEXT_MAX), .ulo = 0, .uhi = 255 },
};
#define F_PATH(f) { .name = #f, .kind = K_PSTR, .off = OFF(run_config.f), .n_off = OFF(run_config.n_##f), \
                    .max_n = DL_PROTO_PATH_MAX }
#define F_PLACE(f, nf) { F_ARR(K_I64S, run_config, f, nf, 1, DL_PROTO_MAX_PLACE), .slo = -1, .shi = 1023 }
/* Wire ranges: what any stage could take; run_config_t's validation
 * (common/pipe/runcfg.c) holds the stages' own, stricter limits. */
static const field_t F_RUN_CONFIG[] = {
    F_STAGE(run_config, stage_id),
    F_U64(run_config, incarnation, 1, UANY),
    F_STR(run_config, run_id, 1, DL_PROTO_RUN_ID_MAX, FL_PRINTABLE),
    F_PATH(data_cache), F_PATH(target_model), F_PATH(out_dir), F_PATH(cursor_base),
    F_PATH(cursor_in), F_PATH(resume_dir),
    F_U64(run_config, target_fp, 0, UANY),
    F_U64(run_config, seed, 0, INT64_MAX),
    F_U32(run_config, token_budget, 1, DL_PROTO_MAX_TOKENS),
    F_U32(run_config, max_len, 0, DL_PROTO_MAX_TOKENS),
    F_U32(run_config, mbs_per_step, 1, DL_PROTO_MAX_MBS),
    F_U32(run_config, epochs, 0, U32ANY),
    F_U64(run_config, max_steps, 0, INT64_MAX),
    F_U64(run_config, start_step, 0, INT64_MAX),
    F_U32(run_config, lookahead_mbs, 0, U32ANY),
    F_U32(run_config, drafter_layers, 1, U32ANY),
    F_U32(run_config, block_size, 2, DL_PROTO_MAX_BLOCK),
    F_U32(run_config, num_anchors, 1, U32ANY),
    F_F64(run_config, lr, 0.0, DBL_MAX, 0),
    F_U64(run_config, warmup_steps, 0, INT64_MAX),
    F_F64(run_config, weight_decay, 0.0, DBL_MAX, 0),
    F_F64(run_config, clip, 0.0, DBL_MAX, 0),
    F_U64(run_config, save_every, 0, INT64_MAX),
    F_U32(run_config, keep_checkpoints, 0, INT32_MAX),
    F_F64(run_config, inbox_gb, 0.0, DBL_MAX, 0),
    F_F64(run_config, host_inbox_gb, 0.0, DBL_MAX, 0),
    F_U32(run_config, hs_min_ready, 1, U32ANY),
    F_U32(run_config, prefetch, 1, U32ANY),
    F_U32(run_config, threads, 0, U32ANY),
    F_U32(run_config, deterministic, 0, 1),
    F_I32(run_config, gpu, -1, 1023),
    F_I32(run_config, drafter, -1, DL_PROTO_MAX_PLACE - 1),
    F_PLACE(target_gpus, n_target_gpus),
    F_PLACE(drafter_gpus, n_drafter_gpus),
    { F_ARR(K_I64S, run_config, target_drafters, n_target_drafters, 1, DL_PROTO_MAX_PLACE),
      .slo = 0, .shi = DL_PROTO_MAX_PLACE - 1 },
    F_U32(run_config, net_port, 0, 65535 - 200),
    { .name = "node_addrs", .kind = K_PSTR, .off = OFF(run_config.node_addrs),
      .n_off = OFF(run_config.n_node_addrs), .max_n = DL_PROTO_PATH_MAX },
    F_I32(run_config, node, 0, DL_PROTO_MAX_NODES - 1),
    F_I32(run_config, loader_node, 0, DL_PROTO_MAX_NODES - 1),
    F_I32(run_config, optimizer_node, 0, DL_PROTO_MAX_NODES - 1),
    { F_ARR(K_I64S, run_config, target_nodes, n_target_nodes, 1, DL_PROTO_MAX_PLACE),
      .slo = 0, .shi = DL_PROTO_MAX_NODES - 1 },
    { F_ARR(K_I64S, run_config, drafter_nodes, n_drafter_nodes, 1, DL_PROTO_MAX_PLACE),
      .slo = 0, .shi = DL_PROTO_MAX_NODES - 1 },
    F_U32(run_config, target_precision, 0, 1),
    F_U32(run_config, gpu_turns, 0, 1),
};
static const field_t F_SLAB_DATA[] = {
    F_STAGE(slab_data, owner_id),
    F_U64(slab_data, owner_inc, 1, UANY),
    F_U32(slab_data, slab_id, 0, U32ANY),
    F_U64(slab_data, offset, 0, DL_PROTO_MAX_OFFSET),
    { F_ARR(K_U8BIN, slab_data, data, n_data, 1, DL_PROTO_MAX_CHUNK), .ulo = 0, .uhi = 255 },
};
static const field_t F_NODE_HELLO[] = {
    F_STR(node_hello, name, 1, DL_PROTO_NODE_NAME_MAX, FL_PRINTABLE),
    F_STR(node_hello, hostname, 1, DL_PROTO_HOST_MAX, FL_PRINTABLE),
    F_STR(node_hello, addr, 1, DL_PROTO_HOST_MAX, FL_PRINTABLE),
    { .name = "run_dir", .kind = K_PSTR, .off = OFF(node_hello.run_dir),
      .n_off = OFF(node_hello.n_run_dir), .min_n = 1, .max_n = DL_PROTO_PATH_MAX },
    F_U32(node_hello, pid, 1, U32ANY),
    F_U64(node_hello, incarnation, 1, UANY),
    F_U32(node_hello, proto_version, DL_PROTO_VERSION, DL_PROTO_VERSION),
    F_U32(node_hello, cores, 1, 1u << 20),
    { .name = "gpu_uuids", .kind = K_PSTR, .off = OFF(node_hello.gpu_uuids),
      .n_off = OFF(node_hello.n_gpu_uuids), .max_n = DL_PROTO_PATH_MAX },
    { F_ARR(K_I64S, node_hello, gpu_free_mib, n_gpu_free_mib, 0, DL_PROTO_MAX_NODES),
      .slo = 0, .shi = INT64_MAX },
};
static const field_t F_NODE_WELCOME[] = {
    F_STR(node_welcome, run_id, 1, DL_PROTO_RUN_ID_MAX, FL_PRINTABLE),
    F_U32(node_welcome, node_index, 1, DL_PROTO_MAX_NODES - 1),
    F_U64(node_welcome, node_incarnation, 1, UANY),
};
static const field_t F_NODE_SPAWN[] = {
    F_STAGE(node_spawn, stage_id),
    F_U64(node_spawn, incarnation, 1, UANY),
    F_STR(node_spawn, exe, 1, DL_PROTO_EXE_MAX, FL_PRINTABLE),
    F_I32(node_spawn, index, -1, DL_PROTO_MAX_PLACE - 1),
    F_U32(node_spawn, threads, 0, 1u << 20),
    F_STR(node_spawn, sup_endpoint, 1, DL_PROTO_HOST_MAX, FL_PRINTABLE),
    F_STR(node_spawn, log_level, 0, DL_PROTO_NAME_MAX, FL_PRINTABLE),
    F_OPAQUE_N(node_spawn, cred, cred_len, DL_PROTO_CRED_BYTES),
};
static const field_t F_NODE_SIGNAL[] = {
    F_STAGE(node_signal, stage_id),
    F_U64(node_signal, incarnation, 1, UANY),
    F_I32(node_signal, signum, 1, 64),
};
static const field_t F_NODE_STAGE[] = {
    F_STAGE(node_stage, stage_id),
    F_U64(node_stage, incarnation, 1, UANY),
    F_ENUM(node_stage, event, PROTO_NODE_EV_COUNT_),
    F_U32(node_stage, pid, 0, U32ANY),
    F_I32(node_stage, wait_status, INT32_MIN, INT32_MAX),
};
static const field_t F_NCCL_ID[] = {
    F_STAGE(nccl_id, owner_id),
    F_U64(nccl_id, owner_inc, 1, UANY),
    F_STAGE(nccl_id, peer_id),
    F_U64(nccl_id, peer_inc, 1, UANY),
    F_U32(nccl_id, nranks, 2, DL_PROTO_NCCL_RANKS_MAX),
    F_U32(nccl_id, rank, 1, DL_PROTO_NCCL_RANKS_MAX - 1),
    F_OPAQUE_N(nccl_id, id, id_len, DL_PROTO_NCCL_ID_BYTES),
};

#define DEF(tab, chk) { tab, (uint32_t)(sizeof(tab) / sizeof(tab[0])), chk }
const msgdef_t proto__defs[PROTO_TYPE_COUNT_] = {
    [PROTO_HELLO] = DEF(F_HELLO, NULL),
    [PROTO_HEARTBEAT] = DEF(F_HEARTBEAT, NULL),
    [PROTO_WORK_REQUEST] = DEF(F_WORK_REQUEST, NULL),
    [PROTO_MICRO_BATCH] = DEF(F_MICRO_BATCH, proto__check_micro_batch),
    [PROTO_SLAB_EXPORT] = DEF(F_SLAB_EXPORT, proto__check_slab_export),
    [PROTO_SLOT_GRANT] = DEF(F_SLOT_GRANT, NULL),
    [PROTO_HIDDEN_STATES_READY] = DEF(F_HIDDEN_STATES_READY, proto__check_hidden_states_ready),
    [PROTO_SLOT_RELEASE] = DEF(F_SLOT_RELEASE, NULL),
    [PROTO_GRADIENTS_READY] = DEF(F_GRADIENTS_READY, proto__check_gradients_ready),
    [PROTO_WEIGHTS_VERSION] = DEF(F_WEIGHTS_VERSION, proto__check_weights_version),
    [PROTO_METRICS] = DEF(F_METRICS, NULL),
    [PROTO_CONTROL] = DEF(F_CONTROL, proto__check_control),
    [PROTO_APPLIED] = DEF(F_APPLIED, proto__check_applied),
    [PROTO_ERROR] = DEF(F_ERROR, NULL),
    [PROTO_CTL_REQUEST] = DEF(F_CTL_REQUEST, proto__check_ctl_request),
    [PROTO_CTL_REPLY] = DEF(F_CTL_REPLY, NULL),
    [PROTO_RUN_CONFIG] = DEF(F_RUN_CONFIG, proto__check_run_config),
    [PROTO_SLAB_DATA] = DEF(F_SLAB_DATA, NULL),
    [PROTO_NODE_HELLO] = DEF(F_NODE_HELLO, proto__check_node_hello),
    [PROTO_NODE_WELCOME] = DEF(F_NODE_WELCOME, NULL),
    [PROTO_NODE_SPAWN] = DEF(F_NODE_SPAWN, proto__check_node_spawn),
    [PROTO_NODE_SIGNAL] = DEF(F_NODE_SIGNAL, proto__check_node_signal),
    [PROTO_NODE_STAGE] = DEF(F_NODE_STAGE, NULL),
    [PROTO_NCCL_ID] = DEF(F_NCCL_ID, proto__check_nccl_id),
};
