/* proto: rejection of wrong versions, truncated bodies (every prefix), wrong
 * types in every field, sizes over the limits, unknown types, trailing bytes,
 * broken cross-field rules and random corruption. Round trips are in
 * test_proto.c; the samples in test_proto_fixture.h.
 *
 * The field names and order below are written from PROTOCOL.md, independently
 * of the codec's tables, so a table that drifts from the document fails here.
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

/* ------------------------------------------------------------ the spec */

static const char *const SPEC[PROTO_TYPE_COUNT_][48] = {
    [PROTO_HELLO] = { "role", "stage_id", "incarnation", "pid", "proto_version", "capabilities", "gpu_uuid", "cred" },
    [PROTO_HEARTBEAT] = { "stage_id", "incarnation", "seq", "state" },
    [PROTO_WORK_REQUEST] = { "target_id", "count" },
    [PROTO_MICRO_BATCH] = { "mb", "step", "epoch", "mb_in_step", "mbs_in_step", "n_seqs", "tokens", "seq_lens",
                            "loss_mask" },
    [PROTO_SLAB_EXPORT] = { "owner_id", "incarnation", "slab_id", "tier", "bytes", "handle", "shm_name",
                            "gpu_uuid" },
    [PROTO_SLOT_GRANT] = { "drafter_id", "target_id", "slot_id", "tier", "slab_id", "offset", "bytes" },
    [PROTO_HIDDEN_STATES_READY] = { "target_id", "drafter_id", "slab_id", "slot_id", "tier", "offset", "bytes",
                                    "dtype", "shape", "n_feat", "mb", "step", "mb_in_step", "mbs_in_step",
                                    "n_seqs", "tokens", "seq_lens", "loss_mask", "event",
                                    "gpu_uuid" },
    [PROTO_SLOT_RELEASE] = { "drafter_id", "slot_id", "mb" },
    [PROTO_GRADIENTS_READY] = { "drafter_id", "step", "weights_version", "mbs", "n_tokens", "loss_sum",
                                "weight_sum", "acc", "slab_id", "offset", "bytes", "n_params", "event" },
    [PROTO_WEIGHTS_VERSION] = { "version", "slab_id", "offset", "bytes", "n_params", "dtype", "event" },
    [PROTO_METRICS] = { "stage_id", "role", "incarnation", "ts_ns", "state", "metrics" },
    [PROTO_CONTROL] = { "op", "seq", "step", "ints", "arg" },
    [PROTO_APPLIED] = { "step", "mbs" },
    [PROTO_ERROR] = { "code", "ref_type", "message" },
    [PROTO_CTL_REQUEST] = { "id", "op", "flags", "targets", "drafters", "target_gpus", "drafter_gpus",
                            "target_place", "drafter_place" },
    [PROTO_CTL_REPLY] = { "id", "code", "state", "text" },
    [PROTO_RUN_CONFIG] = { "stage_id", "incarnation", "run_id", "data_cache", "target_model", "out_dir",
                           "cursor_base", "cursor_in", "resume_dir", "target_fp", "seed", "token_budget",
                           "max_len", "mbs_per_step", "epochs", "max_steps", "start_step", "lookahead_mbs",
                           "drafter_layers", "block_size", "num_anchors", "lr", "warmup_steps",
                           "weight_decay", "clip", "save_every", "keep_checkpoints", "inbox_gb",
                           "host_inbox_gb", "hs_min_ready", "prefetch", "threads", "deterministic", "gpu",
                           "drafter", "target_gpus", "drafter_gpus", "target_drafters", "net_port", "node_addrs",
                           "node", "loader_node", "optimizer_node", "target_nodes", "drafter_nodes",
                           "target_precision", "gpu_turns" },
    [PROTO_SLAB_DATA] = { "owner_id", "owner_inc", "slab_id", "offset", "data" },
    [PROTO_NODE_HELLO] = { "name", "hostname", "addr", "run_dir", "pid", "incarnation", "proto_version", "cores",
                           "gpu_uuids", "gpu_free_mib" },
    [PROTO_NODE_WELCOME] = { "run_id", "node_index", "node_incarnation" },
    [PROTO_NODE_SPAWN] = { "stage_id", "incarnation", "exe", "index", "threads", "sup_endpoint", "log_level", "cred" },
    [PROTO_NODE_SIGNAL] = { "stage_id", "incarnation", "signum" },
    [PROTO_NODE_STAGE] = { "stage_id", "incarnation", "event", "pid", "wait_status" },
    [PROTO_NCCL_ID] = { "owner_id", "owner_inc", "peer_id", "peer_inc", "nranks", "rank", "id" },
};

static unsigned spec_n(int t) {
    unsigned n = 0;
    while (n < 48 && SPEC[t][n]) n++;
    return n;
}
/* ------------------------------------------------------ rejections */

/* A value of a type the field does not accept. */
static void repl_wrong_type(msgpack_packer *pk, const msgpack_object *o, void *arg) {
    (void)arg;
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        msgpack_pack_str(pk, 1); msgpack_pack_str_body(pk, "x", 1); break;
    case MSGPACK_OBJECT_FLOAT32: case MSGPACK_OBJECT_FLOAT64:
        msgpack_pack_uint8(pk, 1); break;   /* ints are not floats on this wire */
    case MSGPACK_OBJECT_STR: msgpack_pack_bin(pk, 1); msgpack_pack_bin_body(pk, "y", 1); break;
    case MSGPACK_OBJECT_BIN: msgpack_pack_str(pk, 4); msgpack_pack_str_body(pk, "abcd", 4); break;
    case MSGPACK_OBJECT_ARRAY: msgpack_pack_map(pk, 0); break;
    default: msgpack_pack_true(pk); break;
    }
}
static void repl_nil(msgpack_packer *pk, const msgpack_object *o, void *arg) { (void)o; (void)arg; msgpack_pack_nil(pk); }
/* Same array with element 0 replaced by a string. */
static void repl_elem0(msgpack_packer *pk, const msgpack_object *o, void *arg) {
    (void)arg;
    msgpack_pack_array(pk, o->via.array.size);
    msgpack_pack_str(pk, 1); msgpack_pack_str_body(pk, "z", 1);
    for (uint32_t i = 1; i < o->via.array.size; i++) msgpack_pack_object(pk, o->via.array.ptr[i]);
}
static void repl_uint(msgpack_packer *pk, const msgpack_object *o, void *arg) {
    (void)o; msgpack_pack_uint64(pk, *(uint64_t *)arg);
}

static void test_wrong_type_every_field(void **state) {
    (void)state;
    char want[96];
    for (int t = 1; t < PROTO_TYPE_COUNT_; t++) {
        proto_msg_t m;
        make_sample(t, false, &m);
        size_t len;
        uint8_t *buf = encode_heap(&m, &len);
        const char *tn = proto_type_name((proto_type_t)t);
        unsigned nf = spec_n(t);
        /* arity matches the spec: [type, version, fields...] */
        msgpack_unpacked up;
        msgpack_unpacked_init(&up);
        size_t off = 0;
        assert_int_equal(msgpack_unpack_next(&up, (const char *)buf, len, &off), MSGPACK_UNPACK_SUCCESS);
        assert_int_equal(up.data.via.array.size, 2 + nf);
        for (unsigned f = 0; f < nf; f++) {
            const msgpack_object *o = &up.data.via.array.ptr[2 + f];
            size_t l2;
            uint8_t *b2 = repack(buf, len, 2 + f, repl_wrong_type, NULL, &l2);
            snprintf(want, sizeof want, "%s.%s: expected ", tn, SPEC[t][f]);
            expect_reject(b2, l2, want);
            free(b2);
            b2 = repack(buf, len, 2 + f, repl_nil, NULL, &l2);
            expect_reject(b2, l2, want);
            free(b2);
            if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size > 0) {
                b2 = repack(buf, len, 2 + f, repl_elem0, NULL, &l2);
                snprintf(want, sizeof want, "%s.%s[0]", tn, SPEC[t][f]);
                expect_reject(b2, l2, want);
                free(b2);
            }
        }
        msgpack_unpacked_destroy(&up);
        free(buf);
    }
    /* the example of the brief, literally */
    proto_msg_t m;
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    size_t len, l2;
    uint8_t *buf = encode_heap(&m, &len);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_next(&up, (const char *)buf, len, &off);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, up.data.via.array.size);
    for (uint32_t i = 0; i < up.data.via.array.size; i++) {
        if (i == 2 + 8) {  /* shape */
            msgpack_pack_array(&pk, 2); msgpack_pack_uint8(&pk, 6);
            msgpack_pack_str(&pk, 2); msgpack_pack_str_body(&pk, "40", 2);
        } else {
            msgpack_pack_object(&pk, up.data.via.array.ptr[i]);
        }
    }
    proto_msg_t d;
    assert_int_equal(proto_decode(sb.data, sb.size, &d), DL_EPROTO);
    assert_string_equal(dl_errmsg(), "hidden_states_ready.shape[1]: expected uint, got str");
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&up);
    (void)l2;
    free(buf);
}

static void test_version_and_type(void **state) {
    (void)state;
    proto_msg_t m;
    make_sample(PROTO_HELLO, false, &m);
    size_t len, l2;
    uint8_t *buf = encode_heap(&m, &len);
    uint64_t v = DL_PROTO_VERSION + 1;
    uint8_t *b2 = repack(buf, len, 1, repl_uint, &v, &l2);
    expect_reject(b2, l2, "message: protocol version 4, this build speaks 3");
    uint32_t pt, pv;   /* a peer of another version can still be identified to answer it */
    assert_int_equal(proto_peek(b2, l2, &pt, &pv), 0);
    assert_int_equal(pt, PROTO_HELLO);
    assert_int_equal(pv, DL_PROTO_VERSION + 1);
    free(b2);
    v = 0;
    b2 = repack(buf, len, 1, repl_uint, &v, &l2);
    expect_reject(b2, l2, "message: protocol version 0");
    free(b2);
    /* a peer of version 1 (built before the node messages) is refused, and identified */
    static const uint8_t hb_v1[] = { 0x96, 0x02, 0x01, 0x05, 0x09, 0x64, 0x03 };
    expect_reject(hb_v1, sizeof hb_v1, "message: protocol version 1, this build speaks 3");
    assert_int_equal(proto_peek(hb_v1, sizeof hb_v1, &pt, &pv), 0);
    assert_int_equal(pt, PROTO_HEARTBEAT);
    assert_int_equal(pv, 1);
    /* hello's own proto_version field */
    v = 7;
    b2 = repack(buf, len, 2 + 4, repl_uint, &v, &l2);
    expect_reject(b2, l2, "hello.proto_version: 7 out of range");
    free(b2);
    /* unknown types, with a body that would be a valid hello */
    uint64_t bad[] = { 0, PROTO_TYPE_COUNT_, 99, 1ull << 40 };
    for (unsigned i = 0; i < 4; i++) {
        b2 = repack(buf, len, 0, repl_uint, &bad[i], &l2);
        expect_reject(b2, l2, bad[i] > UINT32_MAX ? "message.type: " : "message: unknown type");
        free(b2);
    }
    /* type and version must be uints */
    b2 = repack(buf, len, 0, repl_wrong_type, NULL, &l2);
    expect_reject(b2, l2, "message.type: expected uint, got str");
    free(b2);
    b2 = repack(buf, len, 1, repl_nil, NULL, &l2);
    expect_reject(b2, l2, "message.version: expected uint, got nil");
    free(b2);
    free(buf);
    /* any integer encoding of a non-negative value is a uint (msgpack-c decodes
     * int8..int64 >= 0 as positive integers); peek agrees with decode */
    static const uint8_t hb_signed[] = { 0x96, 0xd0, 0x02, 0xd1, 0x00, 0x03, 0x05, 0xd3, 0, 0, 0, 0, 0, 0, 0, 9,
                                         0x64, 0x03 };
    proto_msg_t d;
    assert_int_equal(proto_decode(hb_signed, sizeof hb_signed, &d), 0);
    assert_int_equal(d.heartbeat.incarnation, 9);
    assert_int_equal(proto_peek(hb_signed, sizeof hb_signed, &pt, &pv), 0);
    assert_int_equal(pt, PROTO_HEARTBEAT);
    assert_int_equal(pv, 3);
    static const uint8_t hb_neg[] = { 0x96, 0x02, 0xd0, 0xff, 0x05, 0x09, 0x64, 0x03 };
    assert_int_equal(proto_peek(hb_neg, sizeof hb_neg, &pt, &pv), DL_EPROTO);
    expect_reject(hb_neg, sizeof hb_neg, "message.version: expected uint, got negative int");
    /* wrong arity */
    static const uint8_t short_hb[] = { 0x95, 0x02, 0x03, 0x05, 0x09, 0x64 };
    expect_reject(short_hb, sizeof short_hb, "heartbeat: 3 fields, expected 4");
    static const uint8_t long_hb[] = { 0x97, 0x02, 0x03, 0x05, 0x09, 0x64, 0x03, 0x00 };
    expect_reject(long_hb, sizeof long_hb, "heartbeat: 5 fields, expected 4");
    static const uint8_t env_only[] = { 0x91, 0x02 };
    expect_reject(env_only, sizeof env_only, "message: array of 1 elements");
}

static void test_truncated_every_prefix(void **state) {
    (void)state;
    for (int t = 1; t < PROTO_TYPE_COUNT_; t++) {
        proto_msg_t m;
        make_sample(t, false, &m);
        size_t len;
        uint8_t *buf = encode_heap(&m, &len);
        for (size_t n = 0; n < len; n++) {
            uint8_t *p = malloc(n ? n : 1);
            memcpy(p, buf, n);
            proto_msg_t d;
            int rc = proto_decode(p, n, &d);
            if (rc != DL_EPROTO) fail_msg("%s prefix %zu/%zu: rc %d", proto_type_name((proto_type_t)t), n, len, rc);
            assert_true(strlen(dl_errmsg()) > 0);
            free(p);
        }
        free(buf);
    }
    static const uint8_t hb[] = { 0x96, 0x02, 0x03, 0x05, 0x09, 0x64 };
    expect_reject(hb, sizeof hb, "message: truncated");
}

static void test_trailing_and_structure(void **state) {
    (void)state;
    proto_msg_t m;
    make_sample(PROTO_SLOT_GRANT, false, &m);
    size_t len;
    uint8_t *buf = encode_heap(&m, &len);
    uint8_t *p = malloc(len + 3);
    memcpy(p, buf, len);
    p[len] = 0xc0; p[len + 1] = 0x01; p[len + 2] = 0x02;
    expect_reject(p, len + 1, "message: 1 trailing bytes");
    expect_reject(p, len + 3, "message: 3 trailing bytes");
    /* two valid messages back to back are not one message */
    memcpy(p, buf, len);
    uint8_t *two = malloc(2 * len);
    memcpy(two, buf, len); memcpy(two + len, buf, len);
    expect_reject(two, 2 * len, "message: ");
    free(two); free(p); free(buf);

    expect_reject(NULL, 0, "message: empty");
    static const uint8_t not_array[] = { 0x81, 0x01, 0x02 };        /* {1: 2} */
    expect_reject(not_array, sizeof not_array, "message: expected array");
    static const uint8_t scalar[] = { 0x05 };
    expect_reject(scalar, sizeof scalar, "message: expected array");
    static const uint8_t never_used[] = { 0x92, 0xc1, 0x01 };
    expect_reject(never_used, sizeof never_used, "message: invalid msgpack byte 0xc1");
    /* array32 claiming 2^32-1 elements in 5 bytes: refused before any allocation */
    static const uint8_t huge[] = { 0xdd, 0xff, 0xff, 0xff, 0xff };
    expect_reject(huge, sizeof huge, "message: truncated");
    static const uint8_t huge_bin[] = { 0x93, 0x02, 0x03, 0xc6, 0x7f, 0xff, 0xff, 0xff };
    expect_reject(huge_bin, sizeof huge_bin, "message: truncated");
    /* nesting deeper than DL_PROTO_MAX_DEPTH */
    uint8_t deep[40];
    for (unsigned i = 0; i < sizeof deep - 1; i++) deep[i] = 0x91;
    deep[sizeof deep - 1] = 0x00;
    expect_reject(deep, sizeof deep, "message: nested deeper than");
    /* more than DL_PROTO_MAX_OBJECTS objects (array16 of nils) */
    size_t nobj = DL_PROTO_MAX_OBJECTS + 10;
    uint8_t *many = malloc(5 + nobj);
    many[0] = 0xdd; many[1] = 0; many[2] = (uint8_t)(nobj >> 16); many[3] = (uint8_t)(nobj >> 8); many[4] = (uint8_t)nobj;
    memset(many + 5, 0xc0, nobj);
    expect_reject(many, 5 + nobj, "message: more than 65536 msgpack objects");
    free(many);
    /* ext objects are well-formed msgpack but no field takes them */
    static const uint8_t ext[] = { 0x96, 0x02, 0x03, 0xd4, 0x01, 0x02, 0x09, 0x64, 0x03 };
    expect_reject(ext, sizeof ext, "heartbeat.stage_id: expected uint, got ext");
}

static void test_over_limits(void **state) {
    (void)state;
    /* whole message over DL_PROTO_MAX_BYTES */
    size_t big = (size_t)DL_PROTO_MAX_BYTES + 1;
    uint8_t *p = calloc(1, big);
    expect_reject(p, big, "message: 16777217 bytes, over the limit");
    free(p);

    /* arrays one past their limits: the encoder refuses, and so does the decoder
     * for the same message built by hand */
    proto_msg_t m;
    make_sample(PROTO_MICRO_BATCH, true, &m);
    static int32_t tok1[DL_PROTO_MAX_TOKENS + 1];
    static uint8_t mask1[DL_PROTO_MAX_TOKENS + 1];
    memcpy(tok1, g_tokens, sizeof g_tokens);
    memcpy(mask1, g_mask, sizeof g_mask);
    m.micro_batch.tokens = tok1; m.micro_batch.n_tokens = DL_PROTO_MAX_TOKENS + 1;
    m.micro_batch.loss_mask = mask1; m.micro_batch.n_loss_mask = DL_PROTO_MAX_TOKENS + 1;
    g_seq_lens[0] += 1;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_sbuffer_write(&sb, "keep", 4);
    assert_int_equal(proto_encode(&m, &sb), DL_EPROTO);
    assert_string_equal(dl_errmsg(), "micro_batch.tokens: 2097153 elements, expected 1..2097152");
    assert_int_equal(sb.size, 4);   /* a refused encode leaves the buffer as it was */
    msgpack_sbuffer_destroy(&sb);

    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 11);
    msgpack_pack_uint8(&pk, PROTO_MICRO_BATCH); msgpack_pack_uint8(&pk, DL_PROTO_VERSION);
    for (int i = 0; i < 3; i++) msgpack_pack_uint8(&pk, 1);
    msgpack_pack_uint8(&pk, 0); msgpack_pack_uint8(&pk, 1); msgpack_pack_uint32(&pk, DL_PROTO_MAX_SEQS);
    msgpack_pack_bin(&pk, 4 * (DL_PROTO_MAX_TOKENS + 1)); msgpack_pack_bin_body(&pk, tok1, 4 * (DL_PROTO_MAX_TOKENS + 1));
    msgpack_pack_bin(&pk, 4 * DL_PROTO_MAX_SEQS); msgpack_pack_bin_body(&pk, g_seq_lens, 4 * DL_PROTO_MAX_SEQS);
    msgpack_pack_bin(&pk, DL_PROTO_MAX_TOKENS + 1); msgpack_pack_bin_body(&pk, mask1, DL_PROTO_MAX_TOKENS + 1);
    expect_reject(sb.data, sb.size, "micro_batch.tokens: 2097153 elements, at most 2097152");
    msgpack_sbuffer_destroy(&sb);
    g_seq_lens[0] -= 1;

    /* list limits */
    static uint64_t mbs1[DL_PROTO_MAX_MBS + 1];
    for (uint32_t i = 0; i <= DL_PROTO_MAX_MBS; i++) mbs1[i] = i;
    make_sample(PROTO_APPLIED, false, &m);
    m.applied.mbs = mbs1; m.applied.n_mbs = DL_PROTO_MAX_MBS + 1;
    assert_int_equal(proto_validate(&m), DL_EPROTO);
    assert_string_equal(dl_errmsg(), "applied.mbs: 4097 elements, expected 1..4096");
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint8(&pk, PROTO_APPLIED); msgpack_pack_uint8(&pk, DL_PROTO_VERSION); msgpack_pack_uint8(&pk, 3);
    msgpack_pack_array(&pk, DL_PROTO_MAX_MBS + 1);
    for (uint32_t i = 0; i <= DL_PROTO_MAX_MBS; i++) msgpack_pack_uint64(&pk, i);
    expect_reject(sb.data, sb.size, "applied.mbs: 4097 elements, at most 4096");
    msgpack_sbuffer_destroy(&sb);

    make_sample(PROTO_METRICS, true, &m);
    m.metrics.n_metrics = DL_PROTO_MAX_METRICS + 1;
    assert_int_equal(proto_validate(&m), DL_EPROTO);
    assert_string_equal(dl_errmsg(), "metrics.metrics: 65 entries, at most 64");

    /* strings one past their limits */
    make_sample(PROTO_HELLO, false, &m);
    memset(m.hello.gpu_uuid, 'a', sizeof m.hello.gpu_uuid);   /* no NUL inside */
    assert_int_equal(proto_validate(&m), DL_EPROTO);
    assert_string_equal(dl_errmsg(), "hello.gpu_uuid: not NUL-terminated within 63 chars");
    make_sample(PROTO_HELLO, false, &m);
    size_t len, l2;
    uint8_t *buf = encode_heap(&m, &len);
    char s64[DL_PROTO_UUID_MAX + 1];
    memset(s64, 'u', sizeof s64);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_next(&up, (const char *)buf, len, &off);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, up.data.via.array.size);
    for (uint32_t i = 0; i < up.data.via.array.size; i++) {
        if (i == 2 + 6) { msgpack_pack_str(&pk, sizeof s64); msgpack_pack_str_body(&pk, s64, sizeof s64); }
        else msgpack_pack_object(&pk, up.data.via.array.ptr[i]);
    }
    expect_reject(sb.data, sb.size, "hello.gpu_uuid: string of 64 bytes, at most 63");
    /* embedded NUL */
    sb.size = 0;
    msgpack_pack_array(&pk, up.data.via.array.size);
    for (uint32_t i = 0; i < up.data.via.array.size; i++) {
        if (i == 2 + 6) { msgpack_pack_str(&pk, 3); msgpack_pack_str_body(&pk, "a\0b", 3); }
        else msgpack_pack_object(&pk, up.data.via.array.ptr[i]);
    }
    expect_reject(sb.data, sb.size, "hello.gpu_uuid: string contains a NUL byte");
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&up);
    (void)l2;
    free(buf);
}

/* hidden_states_ready: the inline arrays against shape[0] / n_seqs, the lengths'
 * sum, element ranges, and the features within bytes. */
static void test_hidden_states_ready_rules(void **state) {
    (void)state;
    proto_msg_t m;
    /* sample: T 6, n_seqs 2, seq_lens {4, 2}, features 480 bytes, bytes 520 */
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.n_tokens = 5;
    expect_invalid(&m, "hidden_states_ready.tokens: 5 entries, shape[0] is 6");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.n_loss_mask = 7;
    expect_invalid(&m, "hidden_states_ready.loss_mask: 7 entries, shape[0] is 6");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.n_seqs = 1;
    expect_invalid(&m, "hidden_states_ready.seq_lens: 2 entries, n_seqs is 1");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    g_seq_lens[1] = 3;
    expect_invalid(&m, "hidden_states_ready.seq_lens: sum 7 != shape[0] 6");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    g_seq_lens[1] = 0;
    expect_invalid(&m, "hidden_states_ready.seq_lens[1]: 0 out of range");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    g_tokens[2] = -5;
    expect_invalid(&m, "hidden_states_ready.tokens[2]: -5 out of range");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    g_mask[1] = 3;
    expect_invalid(&m, "hidden_states_ready.loss_mask[1]: 3 out of range [0, 1]");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.loss_mask = NULL;
    expect_invalid(&m, "hidden_states_ready.loss_mask: NULL array of 6 elements");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.bytes = 479;
    expect_invalid(&m, "hidden_states_ready.shape: features [0, 480) end past bytes 479");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.bytes = 480;
    assert_int_equal(proto_validate(&m), 0);
}

static void test_semantic_rules(void **state) {
    (void)state;
    proto_msg_t m;
    make_sample(PROTO_MICRO_BATCH, false, &m);
    g_seq_lens[2] = 6;
    expect_invalid(&m, "micro_batch.seq_lens: sum 12 != tokens length 13");
    g_seq_lens[2] = 7;
    m.micro_batch.n_loss_mask = 12;
    expect_invalid(&m, "micro_batch.loss_mask: 12 entries, tokens has 13");
    make_sample(PROTO_MICRO_BATCH, false, &m);
    g_mask[4] = 2;
    expect_invalid(&m, "micro_batch.loss_mask[4]: 2 out of range [0, 1]");
    g_mask[4] = 1;
    g_tokens[3] = -1;
    expect_invalid(&m, "micro_batch.tokens[3]: -1 out of range");
    make_sample(PROTO_MICRO_BATCH, false, &m);
    g_seq_lens[1] = 0; g_seq_lens[2] = 8;
    expect_invalid(&m, "micro_batch.seq_lens[1]: 0 out of range");
    make_sample(PROTO_MICRO_BATCH, false, &m);
    m.micro_batch.n_seqs = 2;
    expect_invalid(&m, "micro_batch.seq_lens: 3 entries, n_seqs is 2");
    make_sample(PROTO_MICRO_BATCH, false, &m);
    m.micro_batch.mb_in_step = 8;
    expect_invalid(&m, "micro_batch.mb_in_step: 8 not below mbs_in_step 8");
    make_sample(PROTO_MICRO_BATCH, false, &m);
    m.micro_batch.tokens = NULL;
    expect_invalid(&m, "micro_batch.tokens: NULL array of 13 elements");

    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.shape[1] = 42;
    expect_invalid(&m, "hidden_states_ready.shape[1]: 42 not a multiple of n_feat 5");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.ndim = 3; m.hidden_states_ready.shape[2] = 1;
    expect_invalid(&m, "hidden_states_ready.shape: 3 dims, expected 2..2");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.shape[0] = 0;
    expect_invalid(&m, "hidden_states_ready.shape[0]: 0 out of range");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.dtype = 4;
    expect_invalid(&m, "hidden_states_ready.dtype: 4 out of range [1, 3]");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.event_len = 32;
    expect_invalid(&m, "hidden_states_ready.event: length 32, expected 0 or 64");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.n_seqs = 7;
    expect_invalid(&m, "hidden_states_ready.n_seqs: 7 sequences in 6 tokens");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    m.hidden_states_ready.offset = DL_PROTO_MAX_OFFSET + 1;
    expect_invalid(&m, "hidden_states_ready.offset: 281474976710657 out of range");
    make_sample(PROTO_HIDDEN_STATES_READY, false, &m);
    strcpy(m.hidden_states_ready.gpu_uuid, "GPU\n");
    expect_invalid(&m, "hidden_states_ready.gpu_uuid: byte 0x0a at 3 is not printable ASCII");

    make_sample(PROTO_GRADIENTS_READY, false, &m);
    g_mbs[2] = g_mbs[1];
    expect_invalid(&m, "gradients_ready.mbs[2]: 1007 not greater than previous 1007");
    make_sample(PROTO_GRADIENTS_READY, false, &m);
    m.gradients_ready.weight_sum = NAN;
    expect_invalid(&m, "gradients_ready.weight_sum: nan is not finite");
    m.gradients_ready.weight_sum = -1;
    expect_invalid(&m, "gradients_ready.weight_sum: -1 out of range");
    make_sample(PROTO_GRADIENTS_READY, false, &m);
    g_acc[3] = 1.5f;
    expect_invalid(&m, "gradients_ready.acc[3]: 1.5 out of range [0, 1]");
    make_sample(PROTO_GRADIENTS_READY, false, &m);
    m.gradients_ready.bytes = 12;
    expect_invalid(&m, "gradients_ready.bytes: 12, expected 4 * n_params = 100000000");
    make_sample(PROTO_GRADIENTS_READY, false, &m);
    m.gradients_ready.n_mbs = 0;
    expect_invalid(&m, "gradients_ready.mbs: 0 elements, expected 1..4096");

    make_sample(PROTO_WEIGHTS_VERSION, false, &m);
    m.weights_version.dtype = PROTO_DTYPE_F32;
    expect_invalid(&m, "weights_version.bytes: 50000000, expected n_params * f32 size = 100000000");

    make_sample(PROTO_SLAB_EXPORT, false, &m);
    strcpy(m.slab_export.shm_name, "/dl-x");
    expect_invalid(&m, "slab_export.handle: exactly one of handle");
    m.slab_export.handle_len = 0; m.slab_export.shm_name[0] = 0;
    expect_invalid(&m, "slab_export.handle: exactly one of handle");

    make_sample(PROTO_HELLO, false, &m);
    m.hello.capabilities = 1ull << 10;
    expect_invalid(&m, "hello.capabilities: 1024 out of range [0, 31]");
    make_sample(PROTO_HELLO, false, &m);
    m.hello.role = 0;
    expect_invalid(&m, "hello.role: 0 out of range [1, 6]");
    make_sample(PROTO_HELLO, false, &m);
    m.hello.incarnation = 0;
    expect_invalid(&m, "hello.incarnation: 0 out of range");
    make_sample(PROTO_HELLO, false, &m);
    m.hello.stage_id = DL_PROTO_MAX_STAGE_ID + 1;
    expect_invalid(&m, "hello.stage_id: 65536 out of range [0, 65535]");

    make_sample(PROTO_WORK_REQUEST, false, &m);
    m.work_request.count = 0;
    expect_invalid(&m, "work_request.count: 0 out of range [1, 1024]");

    make_sample(PROTO_CONTROL, false, &m);
    m.control.n_ints = 3;
    expect_invalid(&m, "control.ints: route needs pairs, got 3 ints");
    make_sample(PROTO_CONTROL, false, &m);
    g_ints[0] = -1;
    expect_invalid(&m, "control.ints[0]: -1 out of range [0, 65535] for route");
    make_sample(PROTO_CONTROL, false, &m);
    m.control.op = PROTO_CTL_REBALANCE;
    g_ints[0] = 3; g_ints[1] = PROTO_ROLE_DRAFTER; g_ints[2] = 4; g_ints[3] = 9;
    expect_invalid(&m, "control.ints[3]: 9 out of range [1, 6] for rebalance");
    g_ints[3] = PROTO_ROLE_TARGET;
    assert_int_equal(proto_validate(&m), 0);
    m.control.op = PROTO_CTL_COUNT_;
    expect_invalid(&m, "control.op: 9 out of range [1, 8]");
    /* PLACEMENT (op 7): counts, length, node range */
    make_sample(PROTO_CONTROL, false, &m);
    m.control.op = PROTO_CTL_PLACEMENT;
    g_ints[0] = 2; g_ints[1] = 1; g_ints[2] = 0; g_ints[3] = 1; g_ints[4] = 1;
    m.control.n_ints = 5;
    assert_int_equal(proto_validate(&m), 0);
    m.control.n_ints = 1;
    expect_invalid(&m, "control.ints: placement needs [n_targets, n_drafters, nodes...], got 1 ints");
    m.control.n_ints = 4;
    expect_invalid(&m, "control.ints: placement of 2 targets and 1 drafters needs 5 ints, got 4");
    m.control.n_ints = 5; g_ints[1] = 0;
    expect_invalid(&m, "control.ints[1]: 0 drafters out of range [1, 64]");
    g_ints[1] = 1; g_ints[4] = 64;
    expect_invalid(&m, "control.ints[4]: node 64 out of range [0, 63]");

    make_sample(PROTO_ERROR, false, &m);
    m.error.code = 3;
    expect_invalid(&m, "error.code: 3 out of range [-1000, -1]");
    make_sample(PROTO_ERROR, false, &m);
    m.error.ref_type = PROTO_NCCL_ID;      /* an error can answer every v2 type */
    assert_int_equal(proto_validate(&m), 0);
    m.error.ref_type = PROTO_TYPE_COUNT_;
    expect_invalid(&m, "error.ref_type: 25 out of range [0, 24]");

    make_sample(PROTO_METRICS, false, &m);
    m.metrics.metrics[1].name[0] = 0;
    expect_invalid(&m, "metrics.metrics[1].name: empty");


    m.type = 0;
    assert_int_equal(proto_validate(&m), DL_EPROTO);
    m.type = PROTO_TYPE_COUNT_;
    assert_int_equal(proto_validate(&m), DL_EPROTO);
}

/* The control socket's messages: counts xor GPU lists on a rebalance, nothing on
 * other ops, the reply's state and text bounds. */
static void test_ctl_rules(void **state) {
    (void)state;
    proto_msg_t m;
    make_sample(PROTO_CTL_REQUEST, false, &m);
    m.ctl_request.targets = 2;
    expect_invalid(&m, "ctl_request.targets: rebalance gives counts or GPU lists, not both");
    m.ctl_request.targets = 0; m.ctl_request.n_drafter_gpus = 0;
    expect_invalid(&m, "ctl_request.target_gpus: a GPU rebalance needs both lists");
    m.ctl_request.n_target_gpus = 0; m.ctl_request.targets = 2;
    expect_invalid(&m, "ctl_request.targets: rebalance needs targets and drafters >= 1");
    m.ctl_request.drafters = 1;
    assert_int_equal(proto_validate(&m), 0);
    m.ctl_request.op = PROTO_CTLREQ_STOP;
    expect_invalid(&m, "ctl_request.targets: stop takes no targets");
    m.ctl_request.targets = m.ctl_request.drafters = 0;
    expect_invalid(&m, "ctl_request.targets: stop takes no targets, drafters, GPU lists or places");
    m.ctl_request.target_place[0] = m.ctl_request.drafter_place[0] = 0;
    assert_int_equal(proto_validate(&m), 0);
    m.ctl_request.op = PROTO_CTLREQ_COUNT_;
    expect_invalid(&m, "ctl_request.op: 5 out of range");
    m.ctl_request.op = PROTO_CTLREQ_STATUS; m.ctl_request.flags = 2;
    expect_invalid(&m, "ctl_request.flags: 2 out of range");
    make_sample(PROTO_CTL_REQUEST, false, &m);
    g_gpus[0][1] = DL_PROTO_CTL_GPU_MAX + 1;
    expect_invalid(&m, "ctl_request.target_gpus[1]: 1024 out of range");
    g_gpus[0][1] = 1;
    make_sample(PROTO_CTL_REPLY, false, &m);
    m.ctl_reply.state[0] = 0;
    expect_invalid(&m, "ctl_reply.state: ");
    make_sample(PROTO_CTL_REPLY, false, &m);
    m.ctl_reply.code = 1;
    expect_invalid(&m, "ctl_reply.code: 1 out of range [-1000, 0]");
    m.ctl_reply.code = 0;
    m.ctl_reply.n_text = DL_PROTO_CTL_TEXT_MAX + 1;
    expect_invalid(&m, "ctl_reply.text: 1048577 elements, expected 0..1048576");
}

/* run_config: ranges and the placement rules (supervisor -> stage). */
static void test_run_config_rules(void **state) {
    (void)state;
    proto_msg_t m;
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.max_len = 1;
    expect_invalid(&m, "run_config.max_len: 1");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.n_target_drafters = 2;
    expect_invalid(&m, "run_config.target_drafters: 2 entries for 3 targets");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    g_place[2][1] = 2;
    expect_invalid(&m, "run_config.target_drafters[1]: drafter 2 of 2");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.drafter = 2;
    expect_invalid(&m, "run_config.drafter: drafter 2 of 2");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.block_size = 1;
    expect_invalid(&m, "run_config.block_size: 1 out of range [2, 256]");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.gpu = -2;
    expect_invalid(&m, "run_config.gpu: -2 out of range [-1, 1023]");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    g_place[0][2] = 1024;
    expect_invalid(&m, "run_config.target_gpus[2]: 1024 out of range");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.run_id[0] = 0;
    expect_invalid(&m, "run_config.run_id: empty");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.lr = NAN;
    expect_invalid(&m, "run_config.lr: nan is not finite");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.n_drafter_gpus = 0;
    expect_invalid(&m, "run_config.drafter_gpus: ");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.gpu_turns = 2;                      /* 0 (off) or 1 (on), version 3 */
    expect_invalid(&m, "run_config.gpu_turns: 2 out of range [0, 1]");
    m.run_config.gpu_turns = 0;
    assert_int_equal(proto_validate(&m), 0);
    /* paths: (pointer, length), at most DL_PROTO_PATH_MAX bytes, no NUL inside */
    static char long_path[DL_PROTO_PATH_MAX + 2];
    memset(long_path, 'a', DL_PROTO_PATH_MAX + 1);
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.out_dir = long_path; m.run_config.n_out_dir = DL_PROTO_PATH_MAX + 1;
    expect_invalid(&m, "run_config.out_dir: string of 4096 bytes, at most 4095");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.out_dir = long_path; m.run_config.n_out_dir = DL_PROTO_PATH_MAX;
    assert_int_equal(proto_validate(&m), 0);
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.cursor_in = "a\0b"; m.run_config.n_cursor_in = 3;
    expect_invalid(&m, "run_config.cursor_in: string contains a NUL byte");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.resume_dir = NULL; m.run_config.n_resume_dir = 2;
    expect_invalid(&m, "run_config.resume_dir: NULL string of 2 bytes");
    /* the node table (docs/MULTINODE.md): sample: 3 addresses, targets on 0,2,1, drafters on 1,2 */
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.n_target_nodes = 2;
    expect_invalid(&m, "run_config.target_nodes: 2 entries for 3 targets");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.n_drafter_nodes = 1;
    expect_invalid(&m, "run_config.drafter_nodes: 1 entries for 2 drafters");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.net_port = 1023;
    expect_invalid(&m, "run_config.net_port: 1023 (0, or 1024..65335)");
    m.run_config.net_port = 1024;
    assert_int_equal(proto_validate(&m), 0);
    m.run_config.net_port = 65535 - 200 + 1;
    expect_invalid(&m, "run_config.net_port: 65336 out of range [0, 65335]");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.net_port = 0;
    expect_invalid(&m, "run_config.net_port: 0 (one host) but node 2 used");
    g_place[3][1] = g_place[3][2] = 0; g_place[4][0] = g_place[4][1] = 0;
    m.run_config.node = 0;
    expect_invalid(&m, "run_config.net_port: 0 (one host) but node 1 used");   /* the optimizer's */
    m.run_config.optimizer_node = 0;
    assert_int_equal(proto_validate(&m), 0);
    m.run_config.loader_node = 3;
    expect_invalid(&m, "run_config.net_port: 0 (one host) but node 3 used");
    /* a node used without its address line */
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.n_node_addrs = (uint32_t)strlen("10.0.0.1\nnode-b.cluster.example.org\n");
    expect_invalid(&m, "run_config.node_addrs: 2 addresses, node 2 used");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    g_place[4][1] = 3;
    expect_invalid(&m, "run_config.node_addrs: 3 addresses, node 3 used");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.node_addrs = NULL; m.run_config.n_node_addrs = 0;
    expect_invalid(&m, "run_config.node_addrs: 0 addresses, node 2 used");
    /* an empty line would shift every node after it; addresses are bus-id characters */
    make_sample(PROTO_RUN_CONFIG, false, &m);
    strcpy(g_lines, "10.0.0.1\n\n10.0.0.3\n"); m.run_config.n_node_addrs = (uint32_t)strlen(g_lines);
    expect_invalid(&m, "run_config.node_addrs: line 1 is empty");
    strcpy(g_lines, "10.0.0.1\nnode b\n10.0.0.3"); m.run_config.n_node_addrs = (uint32_t)strlen(g_lines);
    expect_invalid(&m, "run_config.node_addrs: byte 0x20 at 13 is not printable ASCII");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    g_place[3][0] = DL_PROTO_MAX_NODES;
    expect_invalid(&m, "run_config.target_nodes[0]: 64 out of range [0, 63]");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.node = -1;
    expect_invalid(&m, "run_config.node: -1 out of range [0, 63]");
    make_sample(PROTO_RUN_CONFIG, false, &m);
    m.run_config.n_node_addrs = DL_PROTO_PATH_MAX + 1;
    expect_invalid(&m, "run_config.node_addrs: string of 4096 bytes, at most 4095");
    /* the paths do not live in the union: every message stays the size it was
     * before run_config (metrics is the largest member) */
    print_message("sizeof(proto_msg_t) = %zu\n", sizeof(proto_msg_t));
    assert_true(sizeof(proto_msg_t) <= sizeof(proto_metrics_t) + 16);
}

static void test_decode_rejects_semantics_on_wire(void **state) {
    (void)state;
    /* the decoder applies the same rules: a micro_batch whose seq_lens do not
     * add up, packed by hand */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 11);
    msgpack_pack_uint8(&pk, PROTO_MICRO_BATCH); msgpack_pack_uint8(&pk, DL_PROTO_VERSION);
    for (int i = 0; i < 3; i++) msgpack_pack_uint8(&pk, 1);
    msgpack_pack_uint8(&pk, 0); msgpack_pack_uint8(&pk, 1); msgpack_pack_uint8(&pk, 1);
    int32_t tok[3] = { 1, 2, 3 }, sl[1] = { 2 };
    uint8_t mask[3] = { 1, 1, 1 };
    msgpack_pack_bin(&pk, 12); msgpack_pack_bin_body(&pk, tok, 12);
    msgpack_pack_bin(&pk, 4); msgpack_pack_bin_body(&pk, sl, 4);
    msgpack_pack_bin(&pk, 3); msgpack_pack_bin_body(&pk, mask, 3);
    expect_reject(sb.data, sb.size, "micro_batch.seq_lens: sum 2 != tokens length 3");
    /* int32 bin whose length is not a multiple of 4 */
    sb.size = 0;
    msgpack_pack_array(&pk, 11);
    msgpack_pack_uint8(&pk, PROTO_MICRO_BATCH); msgpack_pack_uint8(&pk, DL_PROTO_VERSION);
    for (int i = 0; i < 3; i++) msgpack_pack_uint8(&pk, 1);
    msgpack_pack_uint8(&pk, 0); msgpack_pack_uint8(&pk, 1); msgpack_pack_uint8(&pk, 1);
    msgpack_pack_bin(&pk, 11); msgpack_pack_bin_body(&pk, tok, 11);
    msgpack_pack_bin(&pk, 4); msgpack_pack_bin_body(&pk, sl, 4);
    msgpack_pack_bin(&pk, 3); msgpack_pack_bin_body(&pk, mask, 3);
    expect_reject(sb.data, sb.size, "micro_batch.tokens: 11 bytes, not a multiple of 4");
    /* a u32 field carrying a value above 2^32 */
    sb.size = 0;
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint8(&pk, PROTO_WORK_REQUEST); msgpack_pack_uint8(&pk, DL_PROTO_VERSION);
    msgpack_pack_uint64(&pk, 1ull << 32); msgpack_pack_uint8(&pk, 1);
    expect_reject(sb.data, sb.size, "work_request.target_id: 4294967296 does not fit in 4294967295");
    /* negative int where a uint is expected */
    sb.size = 0;
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint8(&pk, PROTO_WORK_REQUEST); msgpack_pack_uint8(&pk, DL_PROTO_VERSION);
    msgpack_pack_int8(&pk, -3); msgpack_pack_uint8(&pk, 1);
    expect_reject(sb.data, sb.size, "work_request.target_id: expected uint, got negative int");
    /* float32 array element too large for float32 is impossible; float64 is */
    sb.size = 0;
    proto_msg_t m;
    make_sample(PROTO_GRADIENTS_READY, false, &m);
    size_t len;
    uint8_t *buf = encode_heap(&m, &len);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_next(&up, (const char *)buf, len, &off);
    msgpack_pack_array(&pk, up.data.via.array.size);
    for (uint32_t i = 0; i < up.data.via.array.size; i++) {
        if (i == 2 + 7) { msgpack_pack_array(&pk, 1); msgpack_pack_double(&pk, 1e300); }
        else msgpack_pack_object(&pk, up.data.via.array.ptr[i]);
    }
    expect_reject(sb.data, sb.size, "gradients_ready.acc[0]: 1e+300 does not fit in float32");
    msgpack_unpacked_destroy(&up);
    free(buf);
    msgpack_sbuffer_destroy(&sb);
}

/* Random corruption of valid messages: decode must never crash, and whatever it
 * accepts must validate and re-encode. (The libFuzzer target goes further.) */
static void test_random_mutations(void **state) {
    (void)state;
    rng_t r;
    rng_seed(&r, 20261130);
    unsigned accepted = 0, total = 0;
    for (int t = 1; t < PROTO_TYPE_COUNT_; t++) {
        proto_msg_t m;
        make_sample(t, false, &m);
        size_t len;
        uint8_t *buf = encode_heap(&m, &len);
        for (int it = 0; it < 3000; it++) {
            uint8_t *p = malloc(len);
            memcpy(p, buf, len);
            int nflip = 1 + (int)(rng_u64(&r) % 4);
            for (int k = 0; k < nflip; k++) p[rng_u64(&r) % len] = (uint8_t)rng_u64(&r);
            size_t n = (rng_u64(&r) % 8 == 0) ? rng_u64(&r) % (len + 1) : len;
            proto_msg_t d;
            int rc = proto_decode(p, n, &d);
            total++;
            if (rc == 0) {
                accepted++;
                assert_int_equal(proto_validate(&d), 0);
                size_t l2;
                uint8_t *e = encode_heap(&d, &l2);
                free(e);
                proto_msg_free(&d);
            } else {
                assert_int_equal(rc, DL_EPROTO);
            }
            free(p);
        }
        free(buf);
    }
    print_message("random mutations: %u decoded of %u\n", accepted, total);
    assert_true(accepted < total);
}
int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrong_type_every_field),
        cmocka_unit_test(test_version_and_type),
        cmocka_unit_test(test_truncated_every_prefix),
        cmocka_unit_test(test_trailing_and_structure),
        cmocka_unit_test(test_over_limits),
        cmocka_unit_test(test_semantic_rules),
        cmocka_unit_test(test_hidden_states_ready_rules),
        cmocka_unit_test(test_ctl_rules),
        cmocka_unit_test(test_run_config_rules),
        cmocka_unit_test(test_decode_rejects_semantics_on_wire),
        cmocka_unit_test(test_random_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
