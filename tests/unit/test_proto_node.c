/* proto v2: the node agent's messages (node_hello, node_welcome, node_spawn,
 * node_signal, node_stage), slab_data and nccl_id, refused on both sides: proto_validate /
 * proto_encode (expect_invalid) and proto_decode of a valid sample re-packed with
 * one field broken (expect_reject), each naming the field. Every-field wrong types,
 * truncations and the field names of these types are in test_proto_reject.c (its
 * SPEC table); run_config's node table rules there too (test_run_config_rules);
 * round trips in test_proto.c; the samples in test_proto_fixture.h.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "proto/codec.h"

#include "tests/unit/test_proto_fixture.h"

/* The node agent's messages (types 19-23) and slab_data: ranges and the cross-field
 * rules of proto/codec_check.c, each naming its field. */
static void test_node_rules(void **state) {
    (void)state;
    proto_msg_t m;
    static const char *const bad_names[] = { "gpu b", "gpu:b", "gpu,b" };
    for (unsigned i = 0; i < 3; i++) {
        make_sample(PROTO_NODE_HELLO, false, &m);
        strcpy(m.node_hello.name, bad_names[i]);
        char want[96];
        snprintf(want, sizeof want, "node_hello.name: '%s' has a space, ':' or ','", bad_names[i]);
        expect_invalid(&m, want);
    }
    make_sample(PROTO_NODE_HELLO, false, &m);
    m.node_hello.name[0] = 0;
    expect_invalid(&m, "node_hello.name: empty");
    make_sample(PROTO_NODE_HELLO, false, &m);
    strcpy(m.node_hello.addr, "10.0.0.2\n");
    expect_invalid(&m, "node_hello.addr: byte 0x0a at 8 is not printable ASCII");
    make_sample(PROTO_NODE_HELLO, false, &m);
    m.node_hello.n_gpu_free_mib = 1;
    expect_invalid(&m, "node_hello.gpu_free_mib: 1 entries for 2 GPUs");
    m.node_hello.n_gpu_free_mib = 3;
    expect_invalid(&m, "node_hello.gpu_free_mib: 3 entries for 2 GPUs");
    m.node_hello.n_gpu_uuids -= 1;                     /* the last '\n' is optional */
    m.node_hello.n_gpu_free_mib = 2;
    assert_int_equal(proto_validate(&m), 0);
    m.node_hello.n_gpu_uuids = 0;
    expect_invalid(&m, "node_hello.gpu_free_mib: 2 entries for 0 GPUs");
    make_sample(PROTO_NODE_HELLO, false, &m);
    strcpy(g_lines, "GPU-a\n\nGPU-b\n"); m.node_hello.n_gpu_uuids = (uint32_t)strlen(g_lines);
    m.node_hello.n_gpu_free_mib = 3;
    expect_invalid(&m, "node_hello.gpu_uuids: line 1 is empty");
    make_sample(PROTO_NODE_HELLO, false, &m);
    g_mib[1] = -1;
    expect_invalid(&m, "node_hello.gpu_free_mib[1]: -1 out of range");
    make_sample(PROTO_NODE_HELLO, false, &m);
    m.node_hello.proto_version = 1;
    expect_invalid(&m, "node_hello.proto_version: 1 out of range [3, 3]");
    make_sample(PROTO_NODE_HELLO, false, &m);
    m.node_hello.cores = 0;
    expect_invalid(&m, "node_hello.cores: 0 out of range");
    make_sample(PROTO_NODE_HELLO, false, &m);
    m.node_hello.n_run_dir = 0;
    expect_invalid(&m, "node_hello.run_dir: empty");
    make_sample(PROTO_NODE_HELLO, false, &m);
    m.node_hello.incarnation = 0;
    expect_invalid(&m, "node_hello.incarnation: 0 out of range");

    make_sample(PROTO_NODE_WELCOME, false, &m);
    m.node_welcome.node_index = 0;                     /* 0 is the head */
    expect_invalid(&m, "node_welcome.node_index: 0 out of range [1, 63]");
    m.node_welcome.node_index = DL_PROTO_MAX_NODES;
    expect_invalid(&m, "node_welcome.node_index: 64 out of range [1, 63]");

    static const char *const bad_exes[] = { "bash", "loader2", "../loader", "draftline" };
    for (unsigned i = 0; i < 4; i++) {
        make_sample(PROTO_NODE_SPAWN, false, &m);
        strcpy(m.node_spawn.exe, bad_exes[i]);
        char want[96];
        snprintf(want, sizeof want, "node_spawn.exe: '%s' is not a stage executable", bad_exes[i]);
        expect_invalid(&m, want);
    }
    make_sample(PROTO_NODE_SPAWN, false, &m);
    m.node_spawn.exe[0] = 0;
    expect_invalid(&m, "node_spawn.exe: empty");
    static const char *const exes[] = { "loader", "target_worker", "drafter_worker", "optimizer" };
    for (unsigned i = 0; i < 4; i++) {
        strcpy(m.node_spawn.exe, exes[i]);
        assert_int_equal(proto_validate(&m), 0);
    }
    make_sample(PROTO_NODE_SPAWN, false, &m);
    strcpy(m.node_spawn.sup_endpoint, "ipc:///tmp/run/sup.sock");
    expect_invalid(&m, "node_spawn.sup_endpoint: 'ipc:///tmp/run/sup.sock' is not tcp://");
    strcpy(m.node_spawn.sup_endpoint, "TCP://10.0.0.1:29500");
    expect_invalid(&m, "node_spawn.sup_endpoint: 'TCP://10.0.0.1:29500' is not tcp://");
    make_sample(PROTO_NODE_SPAWN, false, &m);
    m.node_spawn.index = -2;
    expect_invalid(&m, "node_spawn.index: -2 out of range [-1, 63]");
    m.node_spawn.index = DL_PROTO_MAX_PLACE;
    expect_invalid(&m, "node_spawn.index: 64 out of range [-1, 63]");
    make_sample(PROTO_NODE_SPAWN, false, &m);        /* a credential is all 32 bytes or none */
    m.node_spawn.cred_len = 16;
    expect_invalid(&m, "node_spawn.cred: length 16, expected 0 or 32");
    m.node_spawn.cred_len = 0;
    assert_int_equal(proto_validate(&m), 0);
    make_sample(PROTO_HELLO, false, &m);
    m.hello.cred_len = 31;
    expect_invalid(&m, "hello.cred: length 31, expected 0 or 32");

    make_sample(PROTO_NODE_SIGNAL, false, &m);
    for (int sig = 1; sig <= 64; sig++) {
        m.node_signal.signum = sig;
        if (sig == 9 || sig == 15) { assert_int_equal(proto_validate(&m), 0); continue; }
        char want[96];
        snprintf(want, sizeof want, "node_signal.signum: %d (SIGTERM 15 or SIGKILL 9 only)", sig);
        expect_invalid(&m, want);
    }
    m.node_signal.signum = 0;
    expect_invalid(&m, "node_signal.signum: 0 out of range [1, 64]");
    m.node_signal.signum = 15; m.node_signal.stage_id = DL_PROTO_MAX_STAGE_ID + 1;
    expect_invalid(&m, "node_signal.stage_id: 65536 out of range");

    make_sample(PROTO_NODE_STAGE, false, &m);
    m.node_stage.event = 0;
    expect_invalid(&m, "node_stage.event: 0 out of range [1, 3]");
    m.node_stage.event = PROTO_NODE_EV_COUNT_;
    expect_invalid(&m, "node_stage.event: 4 out of range [1, 3]");
    make_sample(PROTO_NODE_STAGE, false, &m);
    m.node_stage.incarnation = 0;
    expect_invalid(&m, "node_stage.incarnation: 0 out of range");

    make_sample(PROTO_SLAB_DATA, false, &m);
    m.slab_data.n_data = 0;
    expect_invalid(&m, "slab_data.data: 0 elements, expected 1..4194304");
    m.slab_data.n_data = DL_PROTO_MAX_CHUNK + 1;
    expect_invalid(&m, "slab_data.data: 4194305 elements, expected 1..4194304");
    make_sample(PROTO_SLAB_DATA, false, &m);
    m.slab_data.data = NULL;
    expect_invalid(&m, "slab_data.data: NULL array of 100 elements");
    make_sample(PROTO_SLAB_DATA, false, &m);
    m.slab_data.offset = DL_PROTO_MAX_OFFSET + 1;
    expect_invalid(&m, "slab_data.offset: 281474976710657 out of range");
    make_sample(PROTO_SLAB_DATA, false, &m);
    m.slab_data.owner_inc = 0;
    expect_invalid(&m, "slab_data.owner_inc: 0 out of range");
}

static void repl_str(msgpack_packer *pk, const msgpack_object *o, void *arg) {
    (void)o;
    const char *v = arg;
    msgpack_pack_str(pk, strlen(v)); msgpack_pack_str_body(pk, v, strlen(v));
}
static void repl_int(msgpack_packer *pk, const msgpack_object *o, void *arg) {
    (void)o; msgpack_pack_int64(pk, *(int64_t *)arg);
}

/* The same rules on the decoder's side: valid samples re-packed with one field
 * broken, as a peer of another build could send them. */
static void test_node_rules_on_wire(void **state) {
    (void)state;
    struct { int type; unsigned field; const char *str; int64_t num; const char *want; } cases[] = {
        { PROTO_NODE_HELLO, 0, "gpu b", 0, "node_hello.name: 'gpu b' has a space" },
        { PROTO_NODE_HELLO, 8, "GPU-a\n\n", 0, "node_hello.gpu_uuids: line 1 is empty" },
        { PROTO_NODE_HELLO, 8, "GPU-a", 0, "node_hello.gpu_free_mib: 2 entries for 1 GPUs" },
        { PROTO_NODE_SPAWN, 2, "sh", 0, "node_spawn.exe: 'sh' is not a stage executable" },
        { PROTO_NODE_SPAWN, 5, "ipc:///x", 0, "node_spawn.sup_endpoint: 'ipc:///x' is not tcp://" },
        { PROTO_NODE_SIGNAL, 2, NULL, 2, "node_signal.signum: 2 (SIGTERM 15 or SIGKILL 9 only)" },
        { PROTO_NODE_SIGNAL, 2, NULL, -9, "node_signal.signum: -9 out of range [1, 64]" },
        { PROTO_NODE_WELCOME, 1, NULL, 0, "node_welcome.node_index: 0 out of range" },
        { PROTO_NODE_STAGE, 2, NULL, 4, "node_stage.event: 4 out of range" },
        { PROTO_RUN_CONFIG, 38, NULL, 80, "run_config.net_port: 80 (0, or 1024..65335)" },
        { PROTO_RUN_CONFIG, 38, NULL, 0, "run_config.net_port: 0 (one host) but node 2 used" },
        { PROTO_RUN_CONFIG, 39, "10.0.0.1\n10.0.0.2", 0, "run_config.node_addrs: 2 addresses, node 2 used" },
        { PROTO_RUN_CONFIG, 39, "a\n\nc", 0, "run_config.node_addrs: line 1 is empty" },
        { PROTO_RUN_CONFIG, 40, NULL, 64, "run_config.node: 64 out of range [0, 63]" },
        { PROTO_SLAB_DATA, 3, NULL, (int64_t)DL_PROTO_MAX_OFFSET + 1, "slab_data.offset: 281474976710657" },
    };
    for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        proto_msg_t m;
        make_sample(cases[i].type, false, &m);
        size_t len, l2;
        uint8_t *buf = encode_heap(&m, &len);
        uint8_t *b2 = cases[i].str ? repack(buf, len, 2 + cases[i].field, repl_str, (void *)cases[i].str, &l2)
                                   : repack(buf, len, 2 + cases[i].field, repl_int, &cases[i].num, &l2);
        expect_reject(b2, l2, cases[i].want);
        free(b2); free(buf);
    }
    /* slab_data over DL_PROTO_MAX_CHUNK, packed by hand: refused before it is copied */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 7);
    msgpack_pack_uint8(&pk, PROTO_SLAB_DATA); msgpack_pack_uint8(&pk, DL_PROTO_VERSION);
    msgpack_pack_uint8(&pk, 101); msgpack_pack_uint8(&pk, 1); msgpack_pack_uint8(&pk, 0); msgpack_pack_uint8(&pk, 0);
    msgpack_pack_bin(&pk, DL_PROTO_MAX_CHUNK + 1); msgpack_pack_bin_body(&pk, g_chunk, DL_PROTO_MAX_CHUNK);
    msgpack_pack_bin_body(&pk, "x", 1);
    expect_reject(sb.data, sb.size, "slab_data.data: 4194305 elements, at most 4194304");
    msgpack_sbuffer_destroy(&sb);
}

/* nccl_id (type 24): ranges and cross-field rules on both sides, and the id's 128
 * bytes carried exactly (every byte value, no NUL handling). */
static void test_nccl_id(void **state) {
    (void)state;
    proto_msg_t m, d;
    make_sample(PROTO_NCCL_ID, false, &m);
    for (uint32_t i = 0; i < DL_PROTO_NCCL_ID_BYTES; i++) m.nccl_id.id[i] = (uint8_t)(255u - i);
    m.nccl_id.id[7] = 0;
    size_t len;
    uint8_t *buf = encode_heap(&m, &len);
    assert_int_equal(proto_decode(buf, len, &d), 0);
    assert_int_equal(d.type, PROTO_NCCL_ID);
    assert_int_equal(d.nccl_id.id_len, DL_PROTO_NCCL_ID_BYTES);
    assert_memory_equal(d.nccl_id.id, m.nccl_id.id, DL_PROTO_NCCL_ID_BYTES);
    assert_int_equal(d.nccl_id.owner_id, 301); assert_int_equal(d.nccl_id.peer_inc, 0x1234567890ull);
    proto_msg_free(&d);
    free(buf);

    make_sample(PROTO_NCCL_ID, false, &m);
    m.nccl_id.id_len = 0;
    expect_invalid(&m, "nccl_id.id: length 0, expected 128");
    m.nccl_id.id_len = 64;
    expect_invalid(&m, "nccl_id.id: length 64, expected 0 or 128");
    make_sample(PROTO_NCCL_ID, false, &m);
    m.nccl_id.rank = 2;
    expect_invalid(&m, "nccl_id.rank: 2, not below nranks 2");
    m.nccl_id.rank = 0;
    expect_invalid(&m, "nccl_id.rank: 0 out of range [1, 63]");
    make_sample(PROTO_NCCL_ID, false, &m);
    m.nccl_id.nranks = 1;
    expect_invalid(&m, "nccl_id.nranks: 1 out of range [2, 64]");
    m.nccl_id.nranks = DL_PROTO_NCCL_RANKS_MAX + 1;
    expect_invalid(&m, "nccl_id.nranks: 65 out of range [2, 64]");
    make_sample(PROTO_NCCL_ID, false, &m);
    m.nccl_id.peer_id = m.nccl_id.owner_id;
    expect_invalid(&m, "nccl_id.peer_id: 301 is the owner itself");
    make_sample(PROTO_NCCL_ID, false, &m);
    m.nccl_id.peer_inc = 0;
    expect_invalid(&m, "nccl_id.peer_inc: 0 out of range");
}

static void repl_bin(msgpack_packer *pk, const msgpack_object *o, void *arg) {
    (void)o;
    uint32_t n = *(const uint32_t *)arg;
    static const uint8_t z[DL_PROTO_NCCL_ID_BYTES + 1];
    msgpack_pack_bin(pk, n); if (n) msgpack_pack_bin_body(pk, z, n);
}

/* nccl_id as a peer of another build could send it: the id short, empty or long, the
 * rank outside the communicator; refused by proto_decode naming the field. */
static void test_nccl_id_on_wire(void **state) {
    (void)state;
    struct { unsigned field; uint32_t bin; int64_t num; const char *want; } cases[] = {
        { 6, 127, 0, "nccl_id.id: length 127, expected 0 or 128" },
        { 6, 129, 0, "nccl_id.id: 129 bytes, expected 0 or 128" },
        { 6, 0, 0, "nccl_id.id: length 0, expected 128" },
        { 5, 0, 2, "nccl_id.rank: 2, not below nranks 2" },
        { 5, 0, 0, "nccl_id.rank: 0 out of range" },
        { 4, 0, 0, "nccl_id.nranks: 0 out of range" },
        { 2, 0, 301, "nccl_id.peer_id: 301 is the owner itself" },
        { 1, 0, 0, "nccl_id.owner_inc: 0 out of range" },
    };
    for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        proto_msg_t m;
        make_sample(PROTO_NCCL_ID, false, &m);
        size_t len, l2;
        uint8_t *buf = encode_heap(&m, &len);
        uint8_t *b2 = cases[i].field == 6 ? repack(buf, len, 2 + 6, repl_bin, &cases[i].bin, &l2)
                                          : repack(buf, len, 2 + cases[i].field, repl_int, &cases[i].num, &l2);
        expect_reject(b2, l2, cases[i].want);
        free(b2); free(buf);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_rules),
        cmocka_unit_test(test_node_rules_on_wire),
        cmocka_unit_test(test_nccl_id),
        cmocka_unit_test(test_nccl_id_on_wire),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
