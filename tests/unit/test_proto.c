/* proto: round trip of every message type (small and max-size arrays), the
 * documented wire layout (hand-packed golden messages) and the enum names.
 * Malformed input is in test_proto_reject.c; the samples in
 * test_proto_fixture.h.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "common/base/rng.h"
#include "proto/codec.h"

#include "tests/unit/test_proto_fixture.h"

/* Field-by-field equality, written against the structs (not the codec tables). */
#define EQ(f) assert_true(a->f == b->f)
#define EQS(f) assert_string_equal(a->f, b->f)
#define EQA(p, n) do { EQ(n); if (a->n) assert_memory_equal(a->p, b->p, (size_t)a->n * sizeof(*a->p)); } while (0)
#define EQH(h, n) do { EQ(n); assert_memory_equal(a->h, b->h, a->n); } while (0)

static void assert_msg_equal(const proto_msg_t *x, const proto_msg_t *y) {
    assert_int_equal(x->type, y->type);
    switch (x->type) {
    case PROTO_HELLO: { const proto_hello_t *a = &x->hello, *b = &y->hello;
        EQ(role); EQ(stage_id); EQ(incarnation); EQ(pid); EQ(proto_version); EQ(capabilities); EQS(gpu_uuid);
        EQH(cred, cred_len); break; }
    case PROTO_HEARTBEAT: { const proto_heartbeat_t *a = &x->heartbeat, *b = &y->heartbeat;
        EQ(stage_id); EQ(incarnation); EQ(seq); EQ(state); break; }
    case PROTO_WORK_REQUEST: { const proto_work_request_t *a = &x->work_request, *b = &y->work_request;
        EQ(target_id); EQ(count); break; }
    case PROTO_MICRO_BATCH: { const proto_micro_batch_t *a = &x->micro_batch, *b = &y->micro_batch;
        EQ(mb); EQ(step); EQ(epoch); EQ(mb_in_step); EQ(mbs_in_step); EQ(n_seqs);
        EQA(tokens, n_tokens); EQA(seq_lens, n_seq_lens); EQA(loss_mask, n_loss_mask); break; }
    case PROTO_SLAB_EXPORT: { const proto_slab_export_t *a = &x->slab_export, *b = &y->slab_export;
        EQ(owner_id); EQ(incarnation); EQ(slab_id); EQ(tier); EQ(bytes); EQH(handle, handle_len);
        EQS(shm_name); EQS(gpu_uuid); break; }
    case PROTO_SLOT_GRANT: { const proto_slot_grant_t *a = &x->slot_grant, *b = &y->slot_grant;
        EQ(drafter_id); EQ(target_id); EQ(slot_id); EQ(tier); EQ(slab_id); EQ(offset); EQ(bytes); break; }
    case PROTO_HIDDEN_STATES_READY: {
        const proto_hidden_states_ready_t *a = &x->hidden_states_ready, *b = &y->hidden_states_ready;
        EQ(target_id); EQ(drafter_id); EQ(slab_id); EQ(slot_id); EQ(tier); EQ(offset); EQ(bytes); EQ(dtype);
        EQ(ndim); for (uint32_t i = 0; i < a->ndim; i++) EQ(shape[i]);
        EQ(n_feat); EQ(mb); EQ(step); EQ(mb_in_step); EQ(mbs_in_step); EQ(n_seqs);
        EQA(tokens, n_tokens); EQA(seq_lens, n_seq_lens); EQA(loss_mask, n_loss_mask);
        EQH(event, event_len); EQS(gpu_uuid); break; }
    case PROTO_SLOT_RELEASE: { const proto_slot_release_t *a = &x->slot_release, *b = &y->slot_release;
        EQ(drafter_id); EQ(slot_id); EQ(mb); break; }
    case PROTO_GRADIENTS_READY: {
        const proto_gradients_ready_t *a = &x->gradients_ready, *b = &y->gradients_ready;
        EQ(drafter_id); EQ(step); EQ(weights_version); EQA(mbs, n_mbs); EQ(n_tokens);
        assert_memory_equal(&a->loss_sum, &b->loss_sum, 8); EQ(weight_sum); EQA(acc, n_acc);
        EQ(slab_id); EQ(offset); EQ(bytes); EQ(n_params); EQH(event, event_len); break; }
    case PROTO_WEIGHTS_VERSION: {
        const proto_weights_version_t *a = &x->weights_version, *b = &y->weights_version;
        EQ(version); EQ(slab_id); EQ(offset); EQ(bytes); EQ(n_params); EQ(dtype); EQH(event, event_len); break; }
    case PROTO_METRICS: { const proto_metrics_t *a = &x->metrics, *b = &y->metrics;
        EQ(stage_id); EQ(role); EQ(incarnation); EQ(ts_ns); EQS(state); EQ(n_metrics);
        for (uint32_t i = 0; i < a->n_metrics; i++) { EQS(metrics[i].name); EQ(metrics[i].value); }
        break; }
    case PROTO_CONTROL: { const proto_control_t *a = &x->control, *b = &y->control;
        EQ(op); EQ(seq); EQ(step); EQA(ints, n_ints); EQS(arg); break; }
    case PROTO_APPLIED: { const proto_applied_t *a = &x->applied, *b = &y->applied;
        EQ(step); EQA(mbs, n_mbs); break; }
    case PROTO_ERROR: { const proto_error_t *a = &x->error, *b = &y->error;
        EQ(code); EQ(ref_type); EQS(message); break; }
    case PROTO_CTL_REQUEST: { const proto_ctl_request_t *a = &x->ctl_request, *b = &y->ctl_request;
        EQ(id); EQ(op); EQ(flags); EQ(targets); EQ(drafters); EQA(target_gpus, n_target_gpus);
        EQA(drafter_gpus, n_drafter_gpus); EQS(target_place); EQS(drafter_place); break; }
    case PROTO_CTL_REPLY: { const proto_ctl_reply_t *a = &x->ctl_reply, *b = &y->ctl_reply;
        EQ(id); EQ(code); EQS(state); EQA(text, n_text); break; }
    case PROTO_RUN_CONFIG: { const proto_run_config_t *a = &x->run_config, *b = &y->run_config;
        EQ(stage_id); EQ(incarnation); EQS(run_id); EQS(data_cache); EQS(target_model); EQS(out_dir);
        EQS(cursor_base); EQS(cursor_in); EQS(resume_dir); EQ(target_fp); EQ(seed); EQ(token_budget);
        EQ(max_len); EQ(mbs_per_step); EQ(epochs); EQ(max_steps); EQ(start_step); EQ(lookahead_mbs);
        EQ(drafter_layers); EQ(block_size); EQ(num_anchors); EQ(lr); EQ(warmup_steps); EQ(weight_decay);
        EQ(clip); EQ(save_every); EQ(keep_checkpoints); EQ(inbox_gb); EQ(host_inbox_gb); EQ(hs_min_ready);
        EQ(prefetch); EQ(threads); EQ(deterministic); EQ(gpu); EQ(drafter);
        EQA(target_gpus, n_target_gpus); EQA(drafter_gpus, n_drafter_gpus);
        EQA(target_drafters, n_target_drafters); EQ(net_port); EQA(node_addrs, n_node_addrs); EQ(node);
        EQ(loader_node); EQ(optimizer_node); EQA(target_nodes, n_target_nodes);
        EQA(drafter_nodes, n_drafter_nodes); EQ(target_precision); EQ(gpu_turns); break; }
    case PROTO_SLAB_DATA: { const proto_slab_data_t *a = &x->slab_data, *b = &y->slab_data;
        EQ(owner_id); EQ(owner_inc); EQ(slab_id); EQ(offset); EQA(data, n_data); break; }
    case PROTO_NODE_HELLO: { const proto_node_hello_t *a = &x->node_hello, *b = &y->node_hello;
        EQS(name); EQS(hostname); EQS(addr); EQA(run_dir, n_run_dir); EQ(pid); EQ(incarnation);
        EQ(proto_version); EQ(cores); EQA(gpu_uuids, n_gpu_uuids); EQA(gpu_free_mib, n_gpu_free_mib); break; }
    case PROTO_NODE_WELCOME: { const proto_node_welcome_t *a = &x->node_welcome, *b = &y->node_welcome;
        EQS(run_id); EQ(node_index); EQ(node_incarnation); break; }
    case PROTO_NODE_SPAWN: { const proto_node_spawn_t *a = &x->node_spawn, *b = &y->node_spawn;
        EQ(stage_id); EQ(incarnation); EQS(exe); EQ(index); EQ(threads); EQS(sup_endpoint); EQS(log_level);
        EQH(cred, cred_len); break; }
    case PROTO_NODE_SIGNAL: { const proto_node_signal_t *a = &x->node_signal, *b = &y->node_signal;
        EQ(stage_id); EQ(incarnation); EQ(signum); break; }
    case PROTO_NODE_STAGE: { const proto_node_stage_t *a = &x->node_stage, *b = &y->node_stage;
        EQ(stage_id); EQ(incarnation); EQ(event); EQ(pid); EQ(wait_status); break; }
    case PROTO_NCCL_ID: { const proto_nccl_id_t *a = &x->nccl_id, *b = &y->nccl_id;
        EQ(owner_id); EQ(owner_inc); EQ(peer_id); EQ(peer_inc); EQ(nranks); EQ(rank); EQH(id, id_len); break; }
    default: fail_msg("unexpected type %d", x->type);
    }
}
/* ------------------------------------------------------------ round trips */

static void roundtrip(int t, bool big) {
    proto_msg_t m, d;
    make_sample(t, big, &m);
    assert_int_equal(proto_validate(&m), 0);
    size_t len;
    uint8_t *buf = encode_heap(&m, &len);
    assert_true(len <= DL_PROTO_MAX_BYTES);
    int rc = proto_decode(buf, len, &d);
    if (rc) fail_msg("decode %s: %s", proto_type_name((proto_type_t)t), dl_errmsg());
    assert_int_equal(d.version, DL_PROTO_VERSION);
    assert_msg_equal(&m, &d);
    /* decoded arrays are the message's own, not the encoder's */
    if (t == PROTO_MICRO_BATCH) assert_ptr_not_equal(d.micro_batch.tokens, m.micro_batch.tokens);
    if (t == PROTO_HIDDEN_STATES_READY)
        assert_ptr_not_equal(d.hidden_states_ready.tokens, m.hidden_states_ready.tokens);
    if (t == PROTO_SLAB_DATA) assert_ptr_not_equal(d.slab_data.data, m.slab_data.data);
    if (t == PROTO_RUN_CONFIG) {   /* decoded paths and lines are NUL-terminated in the owned block */
        assert_ptr_not_equal(d.run_config.node_addrs, m.run_config.node_addrs);
        assert_int_equal(d.run_config.node_addrs[d.run_config.n_node_addrs], 0);
    }
    if (t == PROTO_NODE_HELLO) {
        assert_int_equal(d.node_hello.run_dir[d.node_hello.n_run_dir], 0);
        assert_int_equal(d.node_hello.gpu_uuids[d.node_hello.n_gpu_uuids], 0);
    }
    /* re-encoding the decoded message gives the same bytes */
    size_t len2;
    uint8_t *buf2 = encode_heap(&d, &len2);
    assert_int_equal(len, len2);
    assert_memory_equal(buf, buf2, len);
    /* the caller-buffer encoder agrees; one byte less is refused cleanly */
    uint8_t *buf3 = malloc(len);
    size_t len3 = 0;
    assert_int_equal(proto_encode_to(&m, buf3, len, &len3), 0);
    assert_int_equal(len3, len);
    assert_memory_equal(buf, buf3, len);
    assert_int_equal(proto_encode_to(&m, buf3, len - 1, &len3), DL_ERANGE);
    uint32_t pt = 0, pv = 0;
    assert_int_equal(proto_peek(buf, len, &pt, &pv), 0);
    assert_int_equal(pt, (uint32_t)t);
    assert_int_equal(pv, DL_PROTO_VERSION);
    proto_msg_free(&d);
    assert_null(d.owned_);
    proto_msg_free(&d);   /* harmless twice */
    free(buf); free(buf2); free(buf3);
}

static void test_roundtrip_all(void **state) {
    (void)state;
    for (int t = 1; t < PROTO_TYPE_COUNT_; t++) {
        roundtrip(t, false); roundtrip(t, true);
    }
}

static void test_roundtrip_variants(void **state) {
    (void)state;
    /* CPU forms: empty event, shm slab, empty uuid; NaN loss is carried (the
     * optimizer skips the step); MB_NONE release; metrics with NaN value. */
    proto_msg_t m, d;
    size_t len;
    uint8_t *buf;

    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.event_len = 0; m.hidden_states_ready.gpu_uuid[0] = 0;
    m.hidden_states_ready.tier = PROTO_TIER_HOST; m.hidden_states_ready.dtype = PROTO_DTYPE_F32;
    m.hidden_states_ready.bytes = 960;   /* features (6, 40) f32 fill the slot exactly */
    buf = encode_heap(&m, &len);
    assert_int_equal(proto_decode(buf, len, &d), 0);
    assert_msg_equal(&m, &d);
    proto_msg_free(&d); free(buf);

    make_sample(PROTO_SLAB_EXPORT, false, &m);
    m.slab_export.handle_len = 0; m.slab_export.tier = PROTO_TIER_HOST;
    strcpy(m.slab_export.shm_name, "/dl-run42-drafter7-inbox"); m.slab_export.gpu_uuid[0] = 0;
    buf = encode_heap(&m, &len);
    assert_int_equal(proto_decode(buf, len, &d), 0);
    assert_msg_equal(&m, &d);
    free(buf);

    make_sample(PROTO_GRADIENTS_READY, false, &m);
    m.gradients_ready.loss_sum = NAN; m.gradients_ready.n_acc = 0; m.gradients_ready.acc = NULL;
    m.gradients_ready.event_len = 0;
    buf = encode_heap(&m, &len);
    assert_int_equal(proto_decode(buf, len, &d), 0);
    assert_true(isnan(d.gradients_ready.loss_sum));
    assert_int_equal(d.gradients_ready.n_acc, 0);
    proto_msg_free(&d); free(buf);

    make_sample(PROTO_SLOT_RELEASE, false, &m);
    m.slot_release.mb = DL_PROTO_MB_NONE;
    buf = encode_heap(&m, &len);
    assert_int_equal(proto_decode(buf, len, &d), 0);
    assert_true(d.slot_release.mb == DL_PROTO_MB_NONE);
    free(buf);

    make_sample(PROTO_METRICS, false, &m);
    m.metrics.metrics[1].value = INFINITY; m.metrics.n_metrics = 2; m.metrics.state[0] = 0;
    buf = encode_heap(&m, &len);
    assert_int_equal(proto_decode(buf, len, &d), 0);
    assert_true(isinf(d.metrics.metrics[1].value));
    assert_string_equal(d.metrics.metrics[0].name, "tokens_per_s");
    free(buf);

    make_sample(PROTO_CONTROL, false, &m);
    m.control.op = PROTO_CTL_STOP; m.control.n_ints = 0; m.control.ints = NULL; m.control.arg[0] = 0;
    buf = encode_heap(&m, &len);
    assert_int_equal(proto_decode(buf, len, &d), 0);
    assert_int_equal(d.control.op, PROTO_CTL_STOP);
    assert_null(d.control.ints);
    proto_msg_free(&d); free(buf);

    /* PLACEMENT (op 7): [n_t, n_d, target nodes, drafter nodes] round trips */
    static const int64_t place[] = {3, 2, 1, 1, 0, 2, 0};
    make_sample(PROTO_CONTROL, false, &m);
    m.control.op = PROTO_CTL_PLACEMENT; m.control.ints = place; m.control.n_ints = 7; m.control.arg[0] = 0;
    buf = encode_heap(&m, &len);
    assert_int_equal(proto_decode(buf, len, &d), 0);
    assert_msg_equal(&m, &d);
    assert_string_equal(proto_ctl_op_name(d.control.op), "placement");
    proto_msg_free(&d); free(buf);

    /* one host (what runcfg_to_msg sends without --listen): port 0, no addresses, all on node 0 */
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.net_port = 0; m.run_config.node_addrs = NULL; m.run_config.n_node_addrs = 0;
    m.run_config.node = m.run_config.loader_node = m.run_config.optimizer_node = 0;
    memset(g_place[3], 0, sizeof g_place[3]); memset(g_place[4], 0, sizeof g_place[4]);
    buf = encode_heap(&m, &len);
    assert_int_equal(proto_decode(buf, len, &d), 0);
    assert_msg_equal(&m, &d);
    assert_int_equal(d.run_config.n_node_addrs, 0);
    proto_msg_free(&d); free(buf);
    /* the last address line may go without its '\n' */
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.n_node_addrs -= 1;
    buf = encode_heap(&m, &len);
    assert_int_equal(proto_decode(buf, len, &d), 0);
    assert_msg_equal(&m, &d);
    proto_msg_free(&d); free(buf);

    /* a CPU node: no GPU lines, no free memory entries */
    make_sample(PROTO_NODE_HELLO, false, &m);
    m.node_hello.gpu_uuids = NULL; m.node_hello.n_gpu_uuids = 0;
    m.node_hello.gpu_free_mib = NULL; m.node_hello.n_gpu_free_mib = 0;
    buf = encode_heap(&m, &len);
    assert_int_equal(proto_decode(buf, len, &d), 0);
    assert_msg_equal(&m, &d);
    assert_int_equal(d.node_hello.n_gpu_free_mib, 0);
    proto_msg_free(&d); free(buf);

    /* the loader's spawn: no index, default threads and log level */
    make_sample(PROTO_NODE_SPAWN, false, &m);
    m.node_spawn.stage_id = 1; strcpy(m.node_spawn.exe, "loader"); m.node_spawn.index = -1;
    m.node_spawn.threads = 0; m.node_spawn.log_level[0] = 0;
    buf = encode_heap(&m, &len);
    assert_int_equal(proto_decode(buf, len, &d), 0);
    assert_msg_equal(&m, &d);
    assert_int_equal(d.node_spawn.index, -1);
    free(buf);

    /* node_stage's ints at their ends: a negative wait_status travels as a negative int */
    make_sample(PROTO_NODE_STAGE, false, &m);
    m.node_stage.event = PROTO_NODE_EV_STARTED; m.node_stage.pid = UINT32_MAX; m.node_stage.wait_status = INT32_MIN;
    buf = encode_heap(&m, &len);
    assert_int_equal(proto_decode(buf, len, &d), 0);
    assert_msg_equal(&m, &d);
    assert_int_equal(d.node_stage.wait_status, INT32_MIN);
    free(buf);
}

/* ------------------------------------------------ golden wire layout */

static int sb_pack_done(msgpack_sbuffer *sb, proto_msg_t *out) {
    return proto_decode(sb->data, sb->size, out);
}

static void test_golden_layout(void **state) {
    (void)state;
    /* heartbeat [2, version 3, stage 5, incarnation 9, seq 100, state running=3] */
    static const uint8_t hb[] = { 0x96, 0x02, 0x03, 0x05, 0x09, 0x64, 0x03 };
    proto_msg_t d;
    assert_int_equal(proto_decode(hb, sizeof hb, &d), 0);
    assert_int_equal(d.type, PROTO_HEARTBEAT);
    assert_int_equal(d.heartbeat.stage_id, 5);
    assert_int_equal(d.heartbeat.incarnation, 9);
    assert_int_equal(d.heartbeat.seq, 100);
    assert_int_equal(d.heartbeat.state, PROTO_STATE_RUNNING);
    uint8_t out[16];
    size_t n = 0;
    assert_int_equal(proto_encode_to(&d, out, sizeof out, &n), 0);
    assert_int_equal(n, sizeof hb);
    assert_memory_equal(out, hb, sizeof hb);

    /* micro_batch packed by hand as PROTOCOL.md says: tokens/seq_lens int32 LE bin, mask u8 bin */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 11);
    msgpack_pack_uint8(&pk, 4); msgpack_pack_uint8(&pk, 3);
    msgpack_pack_uint64(&pk, 70000); msgpack_pack_uint64(&pk, 12); msgpack_pack_uint32(&pk, 1);
    msgpack_pack_uint32(&pk, 0); msgpack_pack_uint32(&pk, 2); msgpack_pack_uint32(&pk, 2);
    static const uint8_t tok[] = { 1, 0, 0, 0, 0x00, 0x01, 0, 0, 0xff, 0xff, 0xff, 0x7f };  /* 1, 256, INT32_MAX */
    static const uint8_t sl[] = { 1, 0, 0, 0, 2, 0, 0, 0 };
    static const uint8_t mask[] = { 0, 1, 1 };
    msgpack_pack_bin(&pk, sizeof tok); msgpack_pack_bin_body(&pk, tok, sizeof tok);
    msgpack_pack_bin(&pk, sizeof sl); msgpack_pack_bin_body(&pk, sl, sizeof sl);
    msgpack_pack_bin(&pk, sizeof mask); msgpack_pack_bin_body(&pk, mask, sizeof mask);
    assert_int_equal(sb_pack_done(&sb, &d), 0);
    assert_int_equal(d.micro_batch.mb, 70000);
    assert_int_equal(d.micro_batch.n_tokens, 3);
    assert_int_equal(d.micro_batch.tokens[0], 1);
    assert_int_equal(d.micro_batch.tokens[1], 256);
    assert_int_equal(d.micro_batch.tokens[2], INT32_MAX);
    assert_int_equal(d.micro_batch.seq_lens[1], 2);
    assert_int_equal(d.micro_batch.loss_mask[2], 1);
    /* the encoder writes exactly these bytes back */
    size_t len;
    uint8_t *enc = encode_heap(&d, &len);
    assert_int_equal(len, sb.size);
    assert_memory_equal(enc, sb.data, len);
    free(enc);
    proto_msg_free(&d);
    msgpack_sbuffer_destroy(&sb);
}

/* The v2 messages, packed by hand as PROTOCOL.md says: slab_data's bytes are one
 * bin, node_signal is five small ints; the encoder writes exactly these bytes. */
static void test_golden_layout_v2(void **state) {
    (void)state;
    /* slab_data [18, 3, owner 101, owner_inc 7, slab 3, offset 4096, bin "\xde\xad\xbe\xef"] */
    static const uint8_t sd[] = { 0x97, 0x12, 0x03, 0x65, 0x07, 0x03, 0xcd, 0x10, 0x00,
                                  0xc4, 0x04, 0xde, 0xad, 0xbe, 0xef };
    proto_msg_t d;
    assert_int_equal(proto_decode(sd, sizeof sd, &d), 0);
    assert_int_equal(d.type, PROTO_SLAB_DATA);
    assert_int_equal(d.slab_data.owner_id, 101);
    assert_int_equal(d.slab_data.owner_inc, 7);
    assert_int_equal(d.slab_data.slab_id, 3);
    assert_int_equal(d.slab_data.offset, 4096);
    assert_int_equal(d.slab_data.n_data, 4);
    assert_int_equal(d.slab_data.data[0], 0xde);
    assert_int_equal(d.slab_data.data[3], 0xef);
    uint8_t out[32];
    size_t n = 0;
    assert_int_equal(proto_encode_to(&d, out, sizeof out, &n), 0);
    assert_int_equal(n, sizeof sd);
    assert_memory_equal(out, sd, sizeof sd);
    proto_msg_free(&d);

    /* node_signal [22, 3, stage 201, incarnation 3, signum 15] */
    static const uint8_t sig[] = { 0x95, 0x16, 0x03, 0xcc, 0xc9, 0x03, 0x0f };
    assert_int_equal(proto_decode(sig, sizeof sig, &d), 0);
    assert_int_equal(d.type, PROTO_NODE_SIGNAL);
    assert_int_equal(d.node_signal.stage_id, 201);
    assert_int_equal(d.node_signal.incarnation, 3);
    assert_int_equal(d.node_signal.signum, 15);
    assert_int_equal(proto_encode_to(&d, out, sizeof out, &n), 0);
    assert_int_equal(n, sizeof sig);
    assert_memory_equal(out, sig, sizeof sig);

    /* node_stage [23, 3, stage 201, incarnation 3, exited=2, pid 300, wait_status -1 (negative fixint)] */
    static const uint8_t st[] = { 0x97, 0x17, 0x03, 0xcc, 0xc9, 0x03, 0x02, 0xcd, 0x01, 0x2c, 0xff };
    assert_int_equal(proto_decode(st, sizeof st, &d), 0);
    assert_int_equal(d.node_stage.event, PROTO_NODE_EV_EXITED);
    assert_int_equal(d.node_stage.pid, 300);
    assert_int_equal(d.node_stage.wait_status, -1);
    assert_int_equal(proto_encode_to(&d, out, sizeof out, &n), 0);
    assert_int_equal(n, sizeof st);
    assert_memory_equal(out, st, sizeof st);

    /* every encoded message says version 3 in its second element */
    for (int t = 1; t < PROTO_TYPE_COUNT_; t++) {
        proto_msg_t m;
        make_sample(t, false, &m);
        size_t len;
        uint8_t *buf = encode_heap(&m, &len);
        size_t h = buf[0] == 0xdc ? 3 : 1;   /* array16 (run_config, hidden_states_ready) or fixarray */
        assert_int_equal(buf[h], t);          /* type: a positive fixint */
        assert_int_equal(buf[h + 1], 0x03);   /* version: positive fixint 3 */
        free(buf);
    }
}

static void test_names(void **state) {
    (void)state;
    for (int t = 1; t < PROTO_TYPE_COUNT_; t++)
        assert_string_not_equal(proto_type_name((proto_type_t)t), "?");
    assert_string_equal(proto_type_name(PROTO_HIDDEN_STATES_READY), "hidden_states_ready");
    static const char *const v2[] = { "slab_data", "node_hello", "node_welcome", "node_spawn", "node_signal",
                                      "node_stage" };
    for (int t = PROTO_SLAB_DATA; t <= PROTO_NODE_STAGE; t++)
        assert_string_equal(proto_type_name((proto_type_t)t), v2[t - PROTO_SLAB_DATA]);
    assert_string_equal(proto_type_name(PROTO_NCCL_ID), "nccl_id");   /* appended within v2 */
    assert_int_equal(PROTO_TYPE_COUNT_, 25);
    assert_int_equal(DL_PROTO_VERSION, 3);
    assert_string_equal(proto_type_name((proto_type_t)99), "?");
    proto_role_t r;
    for (int i = 1; i < PROTO_ROLE_COUNT_; i++) {
        assert_int_equal(proto_role_parse(proto_role_name((proto_role_t)i), &r), 0);
        assert_int_equal(r, i);
    }
    assert_int_equal(proto_role_parse("drafter", &r), 0);
    assert_int_equal(r, PROTO_ROLE_DRAFTER);
    assert_int_equal(proto_role_parse("bogus", &r), DL_EINVAL);
    assert_int_equal(proto_dtype_size(PROTO_DTYPE_BF16), 2);
    assert_int_equal(proto_dtype_size(PROTO_DTYPE_F32), 4);
    assert_int_equal(proto_dtype_size((proto_dtype_t)0), 0);
    assert_string_equal(proto_ctl_op_name(PROTO_CTL_MEMBERSHIP), "membership");
    assert_string_equal(proto_state_name(PROTO_STATE_BLOCKED), "blocked");
    assert_string_equal(proto_tier_name(PROTO_TIER_HOST), "host");
}
int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_all),
        cmocka_unit_test(test_roundtrip_variants),
        cmocka_unit_test(test_golden_layout),
        cmocka_unit_test(test_golden_layout_v2),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
