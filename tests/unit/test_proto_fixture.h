/* Test-only helpers shared by tests/unit/test_proto.c (round trips, wire
 * layout), tests/unit/test_proto_reject.c (malformed input) and
 * tests/unit/test_proto_node.c (the node agent's messages): a valid sample of
 * every message type, encoding into an exact-size heap buffer, and the
 * rejection helpers (expect_reject, expect_invalid, repack).
 * Header-only (static functions) because tests link one .c each; include it
 * after <cmocka.h>. */
#ifndef DL_TESTS_TEST_PROTO_FIXTURE_H
#define DL_TESTS_TEST_PROTO_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "proto/codec.h"

/* ------------------------------------------------------------ samples */

/* Storage for sample arrays, big enough for the max-size variant. */
static int32_t g_tokens[DL_PROTO_MAX_TOKENS];
static int32_t g_seq_lens[DL_PROTO_MAX_SEQS];
static uint8_t g_mask[DL_PROTO_MAX_TOKENS];
static uint64_t g_mbs[DL_PROTO_MAX_MBS];
static float g_acc[DL_PROTO_MAX_BLOCK];
static int64_t g_ints[DL_PROTO_MAX_INTS];
static int64_t g_gpus[2][DL_PROTO_CTL_GPUS_MAX];
static uint8_t g_text[DL_PROTO_CTL_TEXT_MAX];
static int64_t g_place[5][DL_PROTO_MAX_PLACE];   /* target/drafter GPUs, routes, target/drafter nodes */
static char g_lines[DL_PROTO_PATH_MAX + 1];       /* run_config.node_addrs, node_hello.gpu_uuids */
static char g_path[DL_PROTO_PATH_MAX + 1];        /* node_hello.run_dir */
static int64_t g_mib[DL_PROTO_MAX_NODES];
static uint8_t g_chunk[DL_PROTO_MAX_CHUNK];

static inline void fill_handle(uint8_t *h, uint8_t seed) {
    for (unsigned i = 0; i < DL_PROTO_HANDLE_BYTES; i++) h[i] = (uint8_t)(seed + 37 * i);
}

/* n lines "<stem><k>" padded with letters to width chars each, joined by '\n',
 * the last without one: n * (width + 1) - 1 bytes (the big samples fill a
 * DL_PROTO_PATH_MAX field exactly with 64 lines of 63). Returns the length. */
static inline uint32_t fill_lines(char *buf, unsigned n, unsigned width, const char *stem) {
    uint32_t len = 0;
    for (unsigned k = 0; k < n; k++) {
        int w = snprintf(buf + len, width + 1, "%s%u-", stem, k);
        for (unsigned i = (unsigned)w; i < width; i++) buf[len + i] = (char)('a' + (k + i) % 26);
        len += width;
        if (k + 1 < n) buf[len++] = '\n';
    }
    buf[len] = 0;
    return len;
}

/* make_sample's run_config, node-plane and multi-node types (slab_data, node_*, nccl_id): m is initialised. */
static inline void make_sample_node(int t, bool big, proto_msg_t *m) {
    switch (t) {
    case PROTO_RUN_CONFIG: {
        proto_run_config_t *c = &m->run_config;
        uint32_t nt = big ? DL_PROTO_MAX_PLACE : 3, nd = big ? DL_PROTO_MAX_PLACE : 2;
        for (uint32_t i = 0; i < DL_PROTO_MAX_PLACE; i++) {
            g_place[0][i] = (int64_t)(i % 4) - 1; g_place[1][i] = (int64_t)(i % 3); g_place[2][i] = i % nd;
        }
        c->stage_id = 201; c->incarnation = 3; strcpy(c->run_id, "r20261201.ab");
#define SET_PATH(f, s) (c->f = (s), c->n_##f = (uint32_t)strlen(s))
        SET_PATH(data_cache, "/data/gsm8k.dlc"); SET_PATH(target_model, "/models/qwen3-0.6b");
        SET_PATH(out_dir, "runs/a"); SET_PATH(cursor_base, "runs/a/loader.cursor");
        SET_PATH(cursor_in, "runs/a/checkpoints/step_40/cursor.bin");
        SET_PATH(resume_dir, "runs/a/checkpoints/step_40");
#undef SET_PATH
        c->target_fp = 0xfedcba9876543210ull; c->seed = 1234567; c->token_budget = 4096; c->max_len = 2048;
        c->mbs_per_step = 4; c->epochs = 3; c->max_steps = 500; c->start_step = 40; c->lookahead_mbs = 2;
        c->drafter_layers = 2; c->block_size = 8; c->num_anchors = 512; c->lr = 6e-4; c->warmup_steps = 30;
        c->weight_decay = 0.01; c->clip = 1.0; c->save_every = 20; c->keep_checkpoints = 3;
        c->inbox_gb = 1.5; c->host_inbox_gb = 0.25; c->hs_min_ready = 2; c->prefetch = 1; c->threads = 2;
        c->deterministic = 1; c->gpu = 1; c->drafter = 1;
        c->target_gpus = g_place[0]; c->n_target_gpus = nt;
        c->drafter_gpus = g_place[1]; c->n_drafter_gpus = nd;
        c->target_drafters = g_place[2]; c->n_target_drafters = nt;
        /* three nodes (small; the receiver, target 1, on node 2) or 64 (big) */
        c->net_port = 29500;
        if (big) {
            c->n_node_addrs = fill_lines(g_lines, DL_PROTO_MAX_NODES, 63, "node");
            for (uint32_t i = 0; i < DL_PROTO_MAX_PLACE; i++) {
                g_place[3][i] = i % DL_PROTO_MAX_NODES; g_place[4][i] = DL_PROTO_MAX_NODES - 1 - i % DL_PROTO_MAX_NODES;
            }
            c->loader_node = 0; c->optimizer_node = DL_PROTO_MAX_NODES - 1;
        } else {
            strcpy(g_lines, "10.0.0.1\nnode-b.cluster.example.org\n10.0.0.3\n");
            c->n_node_addrs = (uint32_t)strlen(g_lines);
            g_place[3][0] = 0; g_place[3][1] = 2; g_place[3][2] = 1;
            g_place[4][0] = 1; g_place[4][1] = 2;
            c->loader_node = 0; c->optimizer_node = 1;
        }
        c->node_addrs = g_lines; c->node = (int32_t)g_place[3][1];
        c->target_nodes = g_place[3]; c->n_target_nodes = nt;
        c->drafter_nodes = g_place[4]; c->n_drafter_nodes = nd;
        c->target_precision = 1;
        c->gpu_turns = 1;
        break;
    }
    case PROTO_SLAB_DATA: {
        proto_slab_data_t *x = &m->slab_data;
        uint32_t n = big ? DL_PROTO_MAX_CHUNK : 100;
        for (uint32_t i = 0; i < n; i++) g_chunk[i] = (uint8_t)(i * 167u + 13u);
        x->owner_id = 101; x->owner_inc = 0x1122334455ull; x->slab_id = 3;
        x->offset = big ? DL_PROTO_MAX_OFFSET : 17ull << 20; x->data = g_chunk; x->n_data = n;
        break;
    }
    case PROTO_NODE_HELLO: {
        proto_node_hello_t *h = &m->node_hello;
        if (big) {
            memset(h->name, 'n', DL_PROTO_NODE_NAME_MAX); h->name[DL_PROTO_NODE_NAME_MAX] = 0;
            memset(h->hostname, 'h', DL_PROTO_HOST_MAX); h->hostname[DL_PROTO_HOST_MAX] = 0;
            memset(h->addr, 'a', DL_PROTO_HOST_MAX); h->addr[DL_PROTO_HOST_MAX] = 0;
            memset(g_path, 'p', DL_PROTO_PATH_MAX); g_path[0] = '/'; g_path[DL_PROTO_PATH_MAX] = 0;
            h->n_gpu_uuids = fill_lines(g_lines, DL_PROTO_MAX_NODES, 63, "GPU-");
            h->n_gpu_free_mib = DL_PROTO_MAX_NODES;
        } else {
            strcpy(h->name, "gpu-b"); strcpy(h->hostname, "b.cluster.example.org"); strcpy(h->addr, "10.0.0.2");
            strcpy(g_path, "/scratch/draftline/r20261201.ab");
            strcpy(g_lines, "GPU-8d1a2b3c-0000-1111-2222-333344445555\nGPU-9e2b3c4d-0000-1111-2222-333344446666\n");
            h->n_gpu_uuids = (uint32_t)strlen(g_lines);
            h->n_gpu_free_mib = 2;
        }
        for (uint32_t i = 0; i < DL_PROTO_MAX_NODES; i++) g_mib[i] = 81559 - 17 * (int64_t)i;
        h->run_dir = g_path; h->n_run_dir = (uint32_t)strlen(g_path);
        h->pid = 4242; h->incarnation = 0xabcdef0123ull; h->proto_version = DL_PROTO_VERSION; h->cores = 96;
        h->gpu_uuids = g_lines; h->gpu_free_mib = g_mib;
        break;
    }
    case PROTO_NODE_WELCOME:
        strcpy(m->node_welcome.run_id, "r20261201.ab");
        m->node_welcome.node_index = big ? DL_PROTO_MAX_NODES - 1 : 2;
        m->node_welcome.node_incarnation = 0xabcdef0123ull;
        break;
    case PROTO_NODE_SPAWN: {
        proto_node_spawn_t *x = &m->node_spawn;
        x->stage_id = 101; x->incarnation = 3; strcpy(x->exe, "drafter_worker");
        x->index = big ? (int32_t)DL_PROTO_MAX_PLACE - 1 : 1; x->threads = 8; strcpy(x->log_level, "debug");
        strcpy(x->sup_endpoint, "tcp://10.0.0.1:29500");
        for (uint32_t i = 0; i < DL_PROTO_CRED_BYTES; i++) x->cred[i] = (uint8_t)(0x5a ^ i);
        x->cred_len = DL_PROTO_CRED_BYTES;
        if (big) {
            memset(x->sup_endpoint + 6, 'h', DL_PROTO_HOST_MAX - 6); x->sup_endpoint[DL_PROTO_HOST_MAX] = 0;
            memset(x->log_level, 'l', DL_PROTO_NAME_MAX); x->log_level[DL_PROTO_NAME_MAX] = 0;
        }
        break;
    }
    case PROTO_NODE_SIGNAL:
        m->node_signal.stage_id = 201; m->node_signal.incarnation = 3; m->node_signal.signum = big ? 9 : 15;
        break;
    case PROTO_NODE_STAGE: {
        proto_node_stage_t *x = &m->node_stage;
        x->stage_id = 201; x->incarnation = 3;
        if (big) { x->event = PROTO_NODE_EV_FAILED; x->pid = 0; x->wait_status = 2; }   /* ENOENT */
        else { x->event = PROTO_NODE_EV_EXITED; x->pid = 31337; x->wait_status = 0x8b; }  /* SIGSEGV, core */
        break;
    }
    case PROTO_NCCL_ID: {
        proto_nccl_id_t *x = &m->nccl_id;
        x->owner_id = 301; x->owner_inc = 5; x->peer_id = 201; x->peer_inc = 0x1234567890ull;
        x->nranks = big ? DL_PROTO_NCCL_RANKS_MAX : 2; x->rank = big ? DL_PROTO_NCCL_RANKS_MAX - 1 : 1;
        for (uint32_t i = 0; i < DL_PROTO_NCCL_ID_BYTES; i++) x->id[i] = (uint8_t)(i * 37u + 11u);
        x->id_len = DL_PROTO_NCCL_ID_BYTES;
        break;
    }
    }
}

/* A valid message of type t with every field non-zero and distinct where the
 * ranges allow; big: arrays at their maximum length. */
static inline void make_sample(int t, bool big, proto_msg_t *m) {
    proto_msg_init(m, (proto_type_t)t);
    switch (t) {
    case PROTO_HELLO:
        m->hello.role = PROTO_ROLE_DRAFTER; m->hello.stage_id = 4097; m->hello.incarnation = 0x123456789abcull;
        m->hello.pid = 31337; m->hello.capabilities = PROTO_CAP_CUDA_IPC | PROTO_CAP_HOST_TIER;
        strcpy(m->hello.gpu_uuid, "GPU-8d1a2b3c-0000-1111-2222-333344445555");
        for (uint32_t i = 0; i < DL_PROTO_CRED_BYTES; i++) m->hello.cred[i] = (uint8_t)(0xc0 + i);
        m->hello.cred_len = DL_PROTO_CRED_BYTES;
        break;
    case PROTO_HEARTBEAT:
        m->heartbeat.stage_id = 12; m->heartbeat.incarnation = 77; m->heartbeat.seq = 1ull << 40;
        m->heartbeat.state = PROTO_STATE_BLOCKED;
        break;
    case PROTO_WORK_REQUEST:
        m->work_request.target_id = 3; m->work_request.count = big ? DL_PROTO_MAX_COUNT : 4;
        break;
    case PROTO_MICRO_BATCH: {
        proto_micro_batch_t *b = &m->micro_batch;
        uint32_t T = big ? DL_PROTO_MAX_TOKENS : 13, S = big ? DL_PROTO_MAX_SEQS : 3;
        b->mb = 0xfffffffffull; b->step = 99; b->epoch = 2; b->mb_in_step = 5; b->mbs_in_step = 8; b->n_seqs = S;
        for (uint32_t i = 0; i < T; i++) { g_tokens[i] = (int32_t)((i * 2654435761u) % 151936u); g_mask[i] = (i % 3) != 0; }
        if (big) { for (uint32_t s = 0; s < S; s++) g_seq_lens[s] = (int32_t)(T / S); }
        else { g_seq_lens[0] = 5; g_seq_lens[1] = 1; g_seq_lens[2] = 7; }
        b->tokens = g_tokens; b->n_tokens = T;
        b->seq_lens = g_seq_lens; b->n_seq_lens = S;
        b->loss_mask = g_mask; b->n_loss_mask = T;
        break;
    }
    case PROTO_SLAB_EXPORT:
        m->slab_export.owner_id = 9; m->slab_export.incarnation = 5; m->slab_export.slab_id = 2;
        m->slab_export.tier = PROTO_TIER_GPU; m->slab_export.bytes = 3ull << 30;
        fill_handle(m->slab_export.handle, 11); m->slab_export.handle_len = DL_PROTO_HANDLE_BYTES;
        strcpy(m->slab_export.gpu_uuid, "GPU-aaaa");
        break;
    case PROTO_SLOT_GRANT:
        m->slot_grant.drafter_id = 7; m->slot_grant.target_id = 2; m->slot_grant.slot_id = 41;
        m->slot_grant.tier = PROTO_TIER_HOST; m->slot_grant.slab_id = 1; m->slot_grant.offset = 1ull << 33;
        m->slot_grant.bytes = 123456789;
        break;
    case PROTO_HIDDEN_STATES_READY: {
        proto_hidden_states_ready_t *h = &m->hidden_states_ready;
        h->target_id = 2; h->drafter_id = 7; h->slab_id = 1; h->slot_id = 41; h->tier = PROTO_TIER_GPU;
        uint32_t T = big ? DL_PROTO_MAX_TOKENS : 6, S = big ? DL_PROTO_MAX_SEQS : 2;
        for (uint32_t i = 0; i < T; i++) { g_tokens[i] = (int32_t)((i * 2654435761u) % 151936u); g_mask[i] = (i % 3) != 0; }
        if (big) { for (uint32_t s = 0; s < S; s++) g_seq_lens[s] = (int32_t)(T / S); }
        else { g_seq_lens[0] = 4; g_seq_lens[1] = 2; }
        h->offset = 1ull << 33; h->dtype = PROTO_DTYPE_BF16; h->ndim = 2; h->shape[0] = T; h->shape[1] = 40;
        h->n_feat = 5; h->mb = 1234; h->step = 99; h->mb_in_step = 3; h->mbs_in_step = 8; h->n_seqs = S;
        h->tokens = g_tokens; h->n_tokens = T;
        h->seq_lens = g_seq_lens; h->n_seq_lens = S;
        h->loss_mask = g_mask; h->n_loss_mask = T;
        h->bytes = (uint64_t)T * 40 * 2 + 40;   /* features (T, 40) bf16, a little room to spare */
        fill_handle(h->event, 3); h->event_len = DL_PROTO_HANDLE_BYTES;
        strcpy(h->gpu_uuid, "GPU-bbbb");
        break;
    }
    case PROTO_SLOT_RELEASE:
        m->slot_release.drafter_id = 7; m->slot_release.slot_id = 41; m->slot_release.mb = 1234;
        break;
    case PROTO_GRADIENTS_READY: {
        proto_gradients_ready_t *g = &m->gradients_ready;
        uint32_t n = big ? DL_PROTO_MAX_MBS : 3, B = big ? DL_PROTO_MAX_BLOCK : 16;
        for (uint32_t i = 0; i < n; i++) g_mbs[i] = 1000 + 7ull * i;
        for (uint32_t k = 0; k < B; k++) g_acc[k] = 1.0f / (float)(k + 1.5);
        g->drafter_id = 7; g->step = 100; g->weights_version = 99; g->mbs = g_mbs; g->n_mbs = n;
        g->n_tokens = 65536; g->loss_sum = 1234.5678; g->weight_sum = 321.25; g->acc = g_acc; g->n_acc = B;
        g->slab_id = 3; g->offset = 4096; g->n_params = 25000000; g->bytes = 100000000;
        fill_handle(g->event, 5); g->event_len = DL_PROTO_HANDLE_BYTES;
        break;
    }
    case PROTO_WEIGHTS_VERSION:
        m->weights_version.version = 100; m->weights_version.slab_id = 4; m->weights_version.offset = 8192;
        m->weights_version.n_params = 25000000; m->weights_version.dtype = PROTO_DTYPE_BF16;
        m->weights_version.bytes = 50000000;
        fill_handle(m->weights_version.event, 9); m->weights_version.event_len = DL_PROTO_HANDLE_BYTES;
        break;
    case PROTO_METRICS: {
        proto_metrics_t *x = &m->metrics;
        x->stage_id = 5; x->role = PROTO_ROLE_TARGET; x->incarnation = 3; x->ts_ns = 1796000000123456789ull;
        strcpy(x->state, "blocked");
        x->n_metrics = big ? DL_PROTO_MAX_METRICS : 3;
        for (uint32_t i = 0; i < x->n_metrics; i++) {
            snprintf(x->metrics[i].name, sizeof x->metrics[i].name, "metric_%u.rate", i);
            x->metrics[i].value = 1.5e9 / (i + 1) - 0.25;
        }
        if (!big) strcpy(x->metrics[0].name, "tokens_per_s");
        break;
    }
    case PROTO_CONTROL: {
        proto_control_t *c = &m->control;
        uint32_t n = big ? DL_PROTO_MAX_INTS : 4;
        for (uint32_t i = 0; i < n; i++) g_ints[i] = (i % 2) ? 100 + i : i;
        c->op = PROTO_CTL_ROUTE; c->seq = 17; c->step = 250; c->ints = g_ints; c->n_ints = n;
        strcpy(c->arg, "routing after rebalance 2-2 -> 3-1");
        break;
    }
    case PROTO_APPLIED: {
        uint32_t n = big ? DL_PROTO_MAX_MBS : 2;
        for (uint32_t i = 0; i < n; i++) g_mbs[i] = 5000 + 3ull * i;
        m->applied.step = 250; m->applied.mbs = g_mbs; m->applied.n_mbs = n;
        break;
    }
    case PROTO_ERROR:
        m->error.code = DL_EPROTO; m->error.ref_type = PROTO_MICRO_BATCH;
        strcpy(m->error.message, "micro_batch.seq_lens: sum 12 != tokens length 13");
        break;
    case PROTO_CTL_REQUEST: {
        proto_ctl_request_t *r = &m->ctl_request;
        uint32_t nt = big ? DL_PROTO_CTL_GPUS_MAX : 2, nd = big ? DL_PROTO_CTL_GPUS_MAX : 1;
        for (uint32_t i = 0; i < DL_PROTO_CTL_GPUS_MAX; i++) { g_gpus[0][i] = i % 8; g_gpus[1][i] = (i + 3) % 8; }
        r->id = 0xc0ffee0000000001ull; r->op = PROTO_CTLREQ_REBALANCE; r->flags = PROTO_CTLREQ_WAIT;
        r->target_gpus = g_gpus[0]; r->n_target_gpus = nt; r->drafter_gpus = g_gpus[1]; r->n_drafter_gpus = nd;
        if (big) {
            memset(r->target_place, 'a', DL_PROTO_CTL_PLACE_MAX); r->target_place[DL_PROTO_CTL_PLACE_MAX] = 0;
        } else {
            strcpy(r->target_place, "a:0,b:1"); strcpy(r->drafter_place, "a:3");
        }
        break;
    }
    case PROTO_CTL_REPLY: {
        proto_ctl_reply_t *r = &m->ctl_reply;
        uint32_t n = big ? DL_PROTO_CTL_TEXT_MAX : 24;
        for (uint32_t i = 0; i < n; i++) g_text[i] = (uint8_t)(i * 131u + 7u);   /* any bytes */
        r->id = 0xc0ffee0000000001ull; r->code = DL_EINVAL; strcpy(r->state, "rejected");
        r->text = g_text; r->n_text = n;
        break;
    }
    default:
        make_sample_node(t, big, m);
        break;
    }
}

/* Encodes m into a fresh exact-size heap buffer (so ASan sees any over-read). */
static inline uint8_t *encode_heap(const proto_msg_t *m, size_t *len) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    int rc = proto_encode(m, &sb);
    if (rc) fail_msg("encode %s: %s", proto_type_name(m->type), dl_errmsg());
    uint8_t *p = malloc(sb.size);
    assert_non_null(p);
    memcpy(p, sb.data, sb.size);
    *len = sb.size;
    msgpack_sbuffer_destroy(&sb);
    return p;
}

/* ------------------------------------------------------------ rejections */

/* proto_decode refuses buf with DL_EPROTO, a detail starting with prefix, and
 * nothing left allocated. */
static inline void expect_reject(const void *buf, size_t len, const char *prefix) {
    proto_msg_t o;
    int rc = proto_decode(buf, len, &o);
    if (rc != DL_EPROTO) fail_msg("expected DL_EPROTO for '%s', got %d (%s)", prefix, rc, dl_errmsg());
    if (strncmp(dl_errmsg(), prefix, strlen(prefix)) != 0)
        fail_msg("error '%s' does not start with '%s'", dl_errmsg(), prefix);
    assert_null(o.owned_);
}

/* Encoding with validation bypassed is impossible by design: proto_validate
 * refuses m with a detail starting with prefix, and proto_encode refuses it too,
 * writing nothing. (The decoder's side: hand-packed copies and expect_reject.) */
static inline void expect_invalid(proto_msg_t *m, const char *prefix) {
    int rc = proto_validate(m);
    if (rc != DL_EPROTO) fail_msg("validate accepted a message that should fail with '%s'", prefix);
    if (strncmp(dl_errmsg(), prefix, strlen(prefix)) != 0)
        fail_msg("error '%s' does not start with '%s'", dl_errmsg(), prefix);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    assert_int_equal(proto_encode(m, &sb), DL_EPROTO);
    assert_int_equal(sb.size, 0);
    msgpack_sbuffer_destroy(&sb);
}

typedef void (*repl_fn)(msgpack_packer *pk, const msgpack_object *orig, void *arg);

/* Re-packs the message in buf with top-level element idx replaced by repl()
 * (idx 0 = type, 1 = version, 2 + i = field i). Returns a heap buffer. */
static inline uint8_t *repack(const uint8_t *buf, size_t len, unsigned idx, repl_fn repl, void *arg,
                              size_t *out_len) {
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&up, (const char *)buf, len, &off), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object *root = &up.data;
    assert_int_equal(root->type, MSGPACK_OBJECT_ARRAY);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, root->via.array.size);
    for (uint32_t i = 0; i < root->via.array.size; i++) {
        if (i == idx) repl(&pk, &root->via.array.ptr[i], arg);
        else msgpack_pack_object(&pk, root->via.array.ptr[i]);
    }
    uint8_t *p = malloc(sb.size);
    memcpy(p, sb.data, sb.size);
    *out_len = sb.size;
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&up);
    return p;
}

#endif
