/* common/pipe/runcfg: the one run configuration (validation naming the field and its
 * flag, placement lookups, strip_gpu's clear) and its RUN_CONFIG message (every field
 * through encode/decode and back into a run_config_t, each stage's own placement); the
 * node table of a multi-node run (check_nodes, runcfg_stage_node, runcfg_endpoint); gpu_turns
 * and runcfg_gpu_sharers (common/pipe/gputurn.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/bus/bus.h"
#include "common/pipe/runcfg.h"
#include "proto/codec.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static run_config_t g_a, g_b;

/* A valid 3-target, 2-drafter GPU run (targets 0,0,1; drafters 1,2; optimizer 1). */
static void sample(run_config_t *c) {
    runcfg_init(c);
    snprintf(c->run_id, sizeof c->run_id, "r1a2b3c4d");
    snprintf(c->data_cache, sizeof c->data_cache, "/data/gsm8k.dlc");
    snprintf(c->target_model, sizeof c->target_model, "/models/smollm2");
    snprintf(c->out_dir, sizeof c->out_dir, "runs/x");
    snprintf(c->cursor_base, sizeof c->cursor_base, "runs/x/loader.cursor");
    c->target_fp = 0x0123456789abcdefull; c->seed = 42; c->token_budget = 2048; c->max_len = 0;
    c->mbs_per_step = 4; c->epochs = 1; c->max_steps = 100; c->start_step = 0; c->lookahead_mbs = 2;
    c->drafter_layers = 1; c->block_size = 8; c->num_anchors = 512; c->lr = 6e-4; c->warmup_steps = 10;
    c->weight_decay = 0.01; c->clip = 1.0; c->save_every = 50; c->keep_checkpoints = 0;
    c->inbox_gb = 0.5; c->host_inbox_gb = 0.25; c->hs_min_ready = 1; c->prefetch = 1; c->threads = 2;
    c->deterministic = 1;
    c->target_precision = 1;   /* fp8: travels bit for bit too */
    c->n_targets = 3; c->n_drafters = 2; c->optimizer_gpu = 1;
    c->target_gpu[0] = 0; c->target_gpu[1] = 0; c->target_gpu[2] = 1;
    c->drafter_gpu[0] = 1; c->drafter_gpu[1] = 2;
    c->target_drafter[0] = 0; c->target_drafter[1] = 1; c->target_drafter[2] = 0;
}

/* The sample over three nodes (--listen 10.0.0.1:29500): loader on the head, targets
 * on 0,2,1, drafters and the optimizer as MULTINODE.md places them (optimizer with
 * drafter 0, on node 1). */
static void sample_net(run_config_t *c) {
    sample(c);
    c->net_port = 29500;
    c->n_nodes = 3;
    snprintf(c->node_addr[0], sizeof c->node_addr[0], "10.0.0.1");
    snprintf(c->node_addr[1], sizeof c->node_addr[1], "node-b.cluster.example.org");
    snprintf(c->node_addr[2], sizeof c->node_addr[2], "10.0.0.3");
    c->loader_node = 0; c->optimizer_node = 1;
    c->target_node[0] = 0; c->target_node[1] = 2; c->target_node[2] = 1;
    c->drafter_node[0] = 1; c->drafter_node[1] = 2;
}

static void expect_bad(const run_config_t *c, const char *want) {
    int rc = runcfg_validate(c);
    if (rc >= 0) fail_msg("validate accepted a config that should fail with '%s'", want);
    if (!strstr(dl_errmsg(), want)) fail_msg("error '%s' does not contain '%s'", dl_errmsg(), want);
}

static void test_validate(void **state) {
    (void)state;
    sample(&g_a);
    assert_int_equal(runcfg_validate(&g_a), 0);
    g_a.max_len = 2;                          /* 0 (none) or >= 2 */
    assert_int_equal(runcfg_validate(&g_a), 0);
    g_a.max_len = 1;
    expect_bad(&g_a, "max_len (--max-len) 1 out of range [2, 2097152]");
    sample(&g_a); g_a.token_budget = 8;
    expect_bad(&g_a, "token_budget (--token-budget) 8 out of range [16, 2097152]");
    sample(&g_a); g_a.block_size = 65;
    expect_bad(&g_a, "block_size (--block-size) 65 out of range [2, 64]");
    sample(&g_a); g_a.drafter_layers = 0;
    expect_bad(&g_a, "drafter_layers (--drafter-layers) 0");
    sample(&g_a); g_a.mbs_per_step = 4097;
    expect_bad(&g_a, "mbs_per_step (--micro-batches-per-step) 4097");
    sample(&g_a); g_a.max_steps = 0;
    expect_bad(&g_a, "max_steps (--max-steps) 0");
    sample(&g_a); g_a.lr = NAN;
    expect_bad(&g_a, "lr (--lr) nan");
    sample(&g_a); g_a.clip = -1;
    expect_bad(&g_a, "clip (--clip) -1");
    sample(&g_a); g_a.prefetch = RUNCFG_PREFETCH_MAX + 1;
    expect_bad(&g_a, "prefetch (--prefetch) 9 out of range [1, 8]");
    sample(&g_a); g_a.hs_min_ready = 0;
    expect_bad(&g_a, "hs_min_ready (--hs-min-ready) 0");
    sample(&g_a); g_a.inbox_gb = 5000;
    expect_bad(&g_a, "inbox_gb (--inbox-gb) 5000");
    sample(&g_a); g_a.target_model[0] = 0;
    expect_bad(&g_a, "target_model (--target-model) is not set");
    sample(&g_a); snprintf(g_a.run_id, sizeof g_a.run_id, "a/b");
    expect_bad(&g_a, "run_id 'a/b'");
    sample(&g_a); g_a.seed = (uint64_t)INT64_MAX + 1;
    expect_bad(&g_a, "seed (--seed)");
    sample(&g_a); g_a.target_drafter[2] = 2;
    expect_bad(&g_a, "target_drafter[2] 2: no such drafter (2 drafters)");
    sample(&g_a); g_a.drafter_gpu[1] = 1024;
    expect_bad(&g_a, "drafter_gpu[1] (--drafter-gpus) 1024");
    sample(&g_a); g_a.n_targets = 0;
    expect_bad(&g_a, "n_targets (--targets) 0");
    sample(&g_a); g_a.deterministic = 2;
    expect_bad(&g_a, "deterministic (--deterministic) 2");
    sample(&g_a); g_a.target_precision = 2;
    expect_bad(&g_a, "target_precision (--target-precision) 2");
    sample(&g_a); g_a.gpu_turns = 2;
    expect_bad(&g_a, "gpu_turns (--gpu-turns) 2 is not 0 (off) or 1 (on)");
    sample(&g_a); g_a.gpu_turns = -1;
    expect_bad(&g_a, "gpu_turns (--gpu-turns) -1 is not 0 (off) or 1 (on)");
    sample(&g_a); g_a.gpu_turns = 0;
    assert_int_equal(runcfg_validate(&g_a), 0);
}

/* runcfg_gpu_sharers: the other targets and drafters on a stage's GPU and node. */
static void test_gpu_sharers(void **state) {
    (void)state;
    /* 2 targets and 1 drafter on GPU 0 */
    runcfg_init(&g_a);
    g_a.n_targets = 2; g_a.n_drafters = 1;
    g_a.target_gpu[0] = g_a.target_gpu[1] = 0; g_a.drafter_gpu[0] = 0;
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0), 2);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0 + 1), 2);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_DRAFTER0), 2);
    /* the optimizer on that GPU is never counted */
    g_a.optimizer_gpu = 0;
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0), 2);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_DRAFTER0), 2);
    /* a CPU stage (-1) shares nothing, even with other CPU stages; nor does the loader */
    g_a.target_gpu[1] = -1;
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0 + 1), 0);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0), 1);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_LOADER), 0);
    runcfg_clear_gpus(&g_a);                                           /* a CPU run */
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0), 0);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0 + 1), 0);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_DRAFTER0), 0);
    /* the sample: targets 0,0,1; drafters 1,2; optimizer 1 */
    sample(&g_a);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0), 1);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0 + 1), 1);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0 + 2), 1);     /* drafter 0, not the optimizer */
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_DRAFTER0), 1);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_DRAFTER0 + 1), 0);
    /* entries past n_targets / n_drafters are not the topology's */
    g_a.target_gpu[3] = 2; g_a.drafter_gpu[2] = 2;
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_DRAFTER0 + 1), 0);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0 + 3), 0);
    /* one GPU index on different nodes is two GPUs (sample_net: targets on nodes 0,2,1,
     * drafters on 1,2): target 0 and target 1 are both GPU 0, on nodes 0 and 2 */
    sample_net(&g_a);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0), 0);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0 + 1), 0);
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0 + 2), 1);    /* drafter 0: GPU 1, node 1 */
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_DRAFTER0), 1);
    g_a.target_node[1] = 0;
    assert_int_equal(runcfg_gpu_sharers(&g_a, PIPE_ID_TARGET0), 1);
}

static void test_placement(void **state) {
    (void)state;
    sample(&g_a);
    assert_int_equal(runcfg_stage_gpu(&g_a, PIPE_ID_LOADER), -1);
    assert_int_equal(runcfg_stage_gpu(&g_a, PIPE_ID_OPTIMIZER), 1);
    assert_int_equal(runcfg_stage_gpu(&g_a, PIPE_ID_TARGET0 + 2), 1);
    assert_int_equal(runcfg_stage_gpu(&g_a, PIPE_ID_DRAFTER0 + 1), 2);
    assert_int_equal(runcfg_stage_gpu(&g_a, PIPE_ID_TARGET0 + 3), -1);   /* outside the topology */
    assert_int_equal(runcfg_stage_gpu(&g_a, PIPE_ID_DRAFTER0 + 2), -1);
    runcfg_clear_gpus(&g_a);                                            /* strip_gpu */
    assert_int_equal(runcfg_stage_gpu(&g_a, PIPE_ID_OPTIMIZER), -1);
    assert_int_equal(runcfg_stage_gpu(&g_a, PIPE_ID_TARGET0 + 2), -1);
    assert_int_equal(runcfg_stage_gpu(&g_a, PIPE_ID_DRAFTER0 + 1), -1);
    assert_int_equal(runcfg_validate(&g_a), 0);
}

/* Encodes the RUN_CONFIG for stage id, decodes it and rebuilds a config (g_b). */
static proto_msg_t send_and_receive(uint32_t id, uint64_t inc) {
    proto_msg_t m, d;
    runcfg_to_msg(&g_a, id, inc, &m);
    assert_int_equal(proto_validate(&m), 0);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    assert_int_equal(proto_encode(&m, &sb), 0);
    assert_int_equal(proto_decode(sb.data, sb.size, &d), 0);
    msgpack_sbuffer_destroy(&sb);
    assert_int_equal(d.type, PROTO_RUN_CONFIG);
    assert_int_equal(d.run_config.stage_id, id);
    assert_int_equal(d.run_config.incarnation, inc);
    assert_int_equal(runcfg_from_msg(&d.run_config, &g_b), 0);
    return d;
}

static void test_message_round_trip(void **state) {
    (void)state;
    sample(&g_a);
    snprintf(g_a.resume_dir, sizeof g_a.resume_dir, "runs/x/checkpoints/step_50");
    snprintf(g_a.cursor_in, sizeof g_a.cursor_in, "runs/x/checkpoints/step_50/cursor.bin");
    g_a.start_step = 50;
    /* the optimizer: every field comes back bit for bit */
    proto_msg_t d = send_and_receive(PIPE_ID_OPTIMIZER, 4);
    assert_int_equal(d.run_config.gpu, 1);
    assert_int_equal(d.run_config.drafter, -1);
    assert_memory_equal(&g_a, &g_b, sizeof g_a);
    assert_int_equal(runcfg_validate(&g_b), 0);
    proto_msg_free(&d);
    /* target 1: its GPU and route; the rest of the placement as sent */
    d = send_and_receive(PIPE_ID_TARGET0 + 1, 1);
    assert_int_equal(d.run_config.gpu, 0);
    assert_int_equal(d.run_config.drafter, 1);
    assert_int_equal(g_b.optimizer_gpu, -1);     /* the optimizer's GPU is the optimizer's */
    g_b.optimizer_gpu = g_a.optimizer_gpu;
    assert_memory_equal(&g_a, &g_b, sizeof g_a);
    proto_msg_free(&d);
    /* the loader has no GPU; its per-incarnation start step travels */
    d = send_and_receive(PIPE_ID_LOADER, 2);
    assert_int_equal(d.run_config.gpu, -1);
    assert_int_equal(g_b.start_step, 50);
    g_b.optimizer_gpu = g_a.optimizer_gpu;
    assert_memory_equal(&g_a, &g_b, sizeof g_a);
    proto_msg_free(&d);
}

/* gpu_turns: on by default, and both values travel in the RUN_CONFIG (version 3). */
static void test_gpu_turns(void **state) {
    (void)state;
    runcfg_init(&g_a);
    assert_int_equal(g_a.gpu_turns, 1);
    for (int on = 0; on <= 1; on++) {
        sample(&g_a);
        g_a.gpu_turns = on;
        static const uint32_t ids[] = { PIPE_ID_TARGET0, PIPE_ID_DRAFTER0 + 1, PIPE_ID_OPTIMIZER, PIPE_ID_LOADER };
        for (unsigned k = 0; k < sizeof ids / sizeof ids[0]; k++) {
            memset(&g_b, 0xa5, sizeof g_b);
            proto_msg_t d = send_and_receive(ids[k], 2);
            assert_int_equal(d.run_config.gpu_turns, (uint32_t)on);
            assert_int_equal(g_b.gpu_turns, on);
            proto_msg_free(&d);
        }
    }
}

static void test_own_entry_wins(void **state) {
    (void)state;
    /* a stage's own gpu/drafter field is its placement (a moved or GPU-stripped stage) */
    sample(&g_a);
    proto_msg_t m;
    runcfg_to_msg(&g_a, PIPE_ID_DRAFTER0 + 1, 3, &m);
    m.run_config.gpu = -1;
    assert_int_equal(runcfg_from_msg(&m.run_config, &g_b), 0);
    assert_int_equal(runcfg_stage_gpu(&g_b, PIPE_ID_DRAFTER0 + 1), -1);
    assert_int_equal(runcfg_stage_gpu(&g_b, PIPE_ID_DRAFTER0), 1);
    runcfg_to_msg(&g_a, PIPE_ID_TARGET0 + 2, 3, &m);
    m.run_config.gpu = 5; m.run_config.drafter = 1;
    assert_int_equal(runcfg_from_msg(&m.run_config, &g_b), 0);
    assert_int_equal(runcfg_stage_gpu(&g_b, PIPE_ID_TARGET0 + 2), 5);
    assert_int_equal(g_b.target_drafter[2], 1);
    runcfg_to_msg(&g_a, PIPE_ID_OPTIMIZER, 3, &m);
    m.run_config.n_target_drafters = 2;
    assert_int_equal(runcfg_from_msg(&m.run_config, &g_b), DL_EINVAL);
}

/* check_nodes: the port range, the node table, every stage on a node with an address. */
static void test_validate_nodes(void **state) {
    (void)state;
    sample_net(&g_a);
    assert_int_equal(runcfg_validate(&g_a), 0);
    g_a.net_port = 1023;
    expect_bad(&g_a, "net_port (--listen) 1023 out of range [1024, 65335]");
    g_a.net_port = 1024;
    assert_int_equal(runcfg_validate(&g_a), 0);
    /* the wire's bound (65535 - 200) holds here: a port the RUN_CONFIG could not carry is
     * refused before any stage starts, not when the first config is encoded */
    g_a.net_port = 65535 - 200;
    assert_int_equal(runcfg_validate(&g_a), 0);
    proto_msg_t m;
    runcfg_to_msg(&g_a, PIPE_ID_LOADER, 1, &m);
    assert_int_equal(proto_validate(&m), 0);
    g_a.net_port = 65535 - 200 + 1;
    expect_bad(&g_a, "net_port (--listen) 65336 out of range [1024, 65335]");
    g_a.net_port = 65535 - RUNCFG_PORT_SPAN;
    expect_bad(&g_a, "net_port (--listen) 65371 out of range");

    sample_net(&g_a); g_a.n_nodes = 0;
    expect_bad(&g_a, "0 nodes (1..16)");
    sample_net(&g_a); g_a.n_nodes = RUNCFG_NODES_MAX + 1;
    expect_bad(&g_a, "17 nodes (1..16)");
    sample_net(&g_a); g_a.node_addr[1][0] = 0;
    expect_bad(&g_a, "node 1 has no address");
    sample_net(&g_a); snprintf(g_a.node_addr[2], sizeof g_a.node_addr[2], "10.0.0.3\n");
    expect_bad(&g_a, "node 2 address has byte 0x0a");
    sample_net(&g_a); snprintf(g_a.node_addr[2], sizeof g_a.node_addr[2], "node c");
    expect_bad(&g_a, "node 2 address has byte 0x20");
    sample_net(&g_a); memset(g_a.node_addr[0], 'a', sizeof g_a.node_addr[0]);
    expect_bad(&g_a, "node 0 address is not NUL-terminated within 127 chars");

    /* a stage on a node the table does not have, named by its field */
    sample_net(&g_a); g_a.n_nodes = 2;                  /* target 1 and drafter 1 are on node 2 */
    expect_bad(&g_a, "target_node[1] 2: no such node (nodes 0..1)");
    sample_net(&g_a); g_a.drafter_node[1] = 3;
    expect_bad(&g_a, "drafter_node[1] 3: no such node (nodes 0..2)");
    sample_net(&g_a); g_a.target_node[2] = -1;
    expect_bad(&g_a, "target_node[2] -1: no such node");
    sample_net(&g_a); g_a.optimizer_node = 3;
    expect_bad(&g_a, "optimizer_node 3: no such node");
    sample_net(&g_a); g_a.loader_node = 5;
    expect_bad(&g_a, "loader_node 5: no such node");
    sample_net(&g_a); g_a.node = 3;
    expect_bad(&g_a, "node 3: no such node");
    /* entries past n_targets / n_drafters are not the topology's */
    sample_net(&g_a); g_a.target_node[3] = 9; g_a.drafter_node[2] = 9;
    assert_int_equal(runcfg_validate(&g_a), 0);

    /* one host: node 0 only, whatever the table says */
    sample(&g_a);
    g_a.drafter_node[1] = 1;
    expect_bad(&g_a, "drafter_node[1] 1: no such node (nodes 0..0; a one-host run: --listen not given)");
    sample(&g_a); g_a.n_nodes = 0;                       /* no table needed without --listen */
    assert_int_equal(runcfg_validate(&g_a), 0);
}

static void test_stage_node(void **state) {
    (void)state;
    sample_net(&g_a);
    assert_int_equal(runcfg_stage_node(&g_a, PIPE_ID_LOADER), 0);
    assert_int_equal(runcfg_stage_node(&g_a, PIPE_ID_OPTIMIZER), 1);
    assert_int_equal(runcfg_stage_node(&g_a, PIPE_ID_TARGET0), 0);
    assert_int_equal(runcfg_stage_node(&g_a, PIPE_ID_TARGET0 + 1), 2);
    assert_int_equal(runcfg_stage_node(&g_a, PIPE_ID_TARGET0 + 2), 1);
    assert_int_equal(runcfg_stage_node(&g_a, PIPE_ID_DRAFTER0), 1);
    assert_int_equal(runcfg_stage_node(&g_a, PIPE_ID_DRAFTER0 + 1), 2);
    g_a.target_node[3] = 2; g_a.drafter_node[2] = 2;   /* outside the topology: 0 */
    assert_int_equal(runcfg_stage_node(&g_a, PIPE_ID_TARGET0 + 3), 0);
    assert_int_equal(runcfg_stage_node(&g_a, PIPE_ID_DRAFTER0 + 2), 0);
    assert_int_equal(runcfg_stage_node(&g_a, 0), 0);
    assert_int_equal(runcfg_stage_node(&g_a, 50), 0);
}

/* The node table through RUN_CONFIG: each stage gets the addresses back as node_addr[]
 * and its own node in `node`; everything else bit for bit. */
static void test_message_nodes(void **state) {
    (void)state;
    sample_net(&g_a);
    static const uint32_t ids[] = { PIPE_ID_LOADER, PIPE_ID_OPTIMIZER, PIPE_ID_TARGET0, PIPE_ID_TARGET0 + 1,
                                    PIPE_ID_TARGET0 + 2, PIPE_ID_DRAFTER0, PIPE_ID_DRAFTER0 + 1 };
    for (unsigned k = 0; k < sizeof ids / sizeof ids[0]; k++) {
        proto_msg_t d = send_and_receive(ids[k], 7);
        assert_int_equal(d.run_config.net_port, 29500);
        assert_int_equal(d.run_config.n_node_addrs,
                         strlen("10.0.0.1\nnode-b.cluster.example.org\n10.0.0.3\n"));
        assert_memory_equal(d.run_config.node_addrs, "10.0.0.1\nnode-b.cluster.example.org\n10.0.0.3\n",
                            d.run_config.n_node_addrs);
        assert_int_equal(g_b.n_nodes, 3);
        assert_string_equal(g_b.node_addr[1], "node-b.cluster.example.org");
        assert_int_equal(g_b.node, runcfg_stage_node(&g_a, ids[k]));
        assert_int_equal(runcfg_validate(&g_b), 0);
        g_b.node = g_a.node;                                /* the supervisor's own: 0 */
        if (ids[k] != PIPE_ID_OPTIMIZER) g_b.optimizer_gpu = g_a.optimizer_gpu;
        assert_memory_equal(&g_a, &g_b, sizeof g_a);
        proto_msg_free(&d);
    }
    /* the receiver's node of the message is its own, whatever the lists say */
    proto_msg_t m;
    runcfg_to_msg(&g_a, PIPE_ID_TARGET0 + 1, 1, &m);
    assert_int_equal(m.run_config.node, 2);
    /* one host: no addresses on the wire, none back */
    sample(&g_a);
    snprintf(g_a.node_addr[0], sizeof g_a.node_addr[0], "stale");
    g_a.n_nodes = 1;
    runcfg_to_msg(&g_a, PIPE_ID_DRAFTER0, 1, &m);
    assert_int_equal(m.run_config.net_port, 0);
    assert_int_equal(m.run_config.n_node_addrs, 0);
    assert_int_equal(runcfg_from_msg(&m.run_config, &g_b), 0);
    assert_int_equal(g_b.n_nodes, 0);
    assert_int_equal(g_b.node_addr[0][0], 0);
    /* a line over RUNCFG_ADDR_MAX, or more than RUNCFG_NODES_MAX lines (the wire allows 64) */
    static char lines[DL_PROTO_PATH_MAX + 1];
    sample_net(&g_a);
    runcfg_to_msg(&g_a, PIPE_ID_LOADER, 1, &m);
    memset(lines, 'a', RUNCFG_ADDR_MAX + 1);
    m.run_config.node_addrs = lines; m.run_config.n_node_addrs = RUNCFG_ADDR_MAX + 1;
    assert_int_equal(runcfg_from_msg(&m.run_config, &g_b), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "node address 0 of 128 bytes"));
    uint32_t n = 0;
    for (int k = 0; k <= RUNCFG_NODES_MAX; k++) n += (uint32_t)snprintf(lines + n, sizeof lines - n, "n%d\n", k);
    m.run_config.n_node_addrs = n;
    assert_int_equal(runcfg_from_msg(&m.run_config, &g_b), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "node address 16 of"));
}

static void expect_endpoint(const char *name, const char *want) {
    char buf[256];
    if (runcfg_endpoint(&g_a, "/tmp/run.x", name, buf, sizeof buf) != 0)
        fail_msg("endpoint '%s': %s", name, dl_errmsg());
    assert_string_equal(buf, want);
}

static void test_endpoint(void **state) {
    (void)state;
    char buf[256], want[256];
    /* one host: the ipc endpoints, exactly bus_endpoint's */
    sample(&g_a);
    static const char *const names[] = { "sup", "loader", "optimizer", "drafter0", "drafter63", "ctl" };
    for (unsigned k = 0; k < sizeof names / sizeof names[0]; k++) {
        assert_int_equal(bus_endpoint("/tmp/run.x", names[k], want, sizeof want), 0);
        expect_endpoint(names[k], want);
    }
    /* three nodes: each server on its node's address, net_port + its offset */
    sample_net(&g_a);
    expect_endpoint("sup", "tcp://10.0.0.1:29500");
    expect_endpoint("loader", "tcp://10.0.0.1:29501");
    expect_endpoint("optimizer", "tcp://node-b.cluster.example.org:29502");
    expect_endpoint("drafter0", "tcp://node-b.cluster.example.org:29600");
    expect_endpoint("drafter1", "tcp://10.0.0.3:29601");
    g_a.loader_node = 2;
    expect_endpoint("loader", "tcp://10.0.0.3:29501");
    expect_endpoint("sup", "tcp://10.0.0.1:29500");           /* the supervisor is the head's */
    /* not a server of the pipeline (targets only connect) */
    static const char *const bad[] = { "target0", "monitor", "ctl", "drafter", "drafterx", "drafter1x",
                                       "drafter 1", "drafter-1", "drafter+1", "drafter64", "Loader", "" };
    for (unsigned k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        if (runcfg_endpoint(&g_a, "/tmp/run.x", bad[k], buf, sizeof buf) != DL_EINVAL)
            fail_msg("endpoint '%s' accepted: %s", bad[k], buf);
        assert_non_null(strstr(dl_errmsg(), "not a server of the pipeline"));
    }
    /* a server on a node without an address */
    sample_net(&g_a); g_a.n_nodes = 2;
    assert_int_equal(runcfg_endpoint(&g_a, "/tmp/run.x", "drafter1", buf, sizeof buf), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "endpoint 'drafter1': node 2 has no address (2 nodes)"));
    expect_endpoint("drafter0", "tcp://node-b.cluster.example.org:29600");
    /* the buffer */
    sample_net(&g_a);
    assert_int_equal(runcfg_endpoint(&g_a, "/tmp/run.x", "optimizer", buf, 20), DL_ERANGE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_placement),
        cmocka_unit_test(test_gpu_turns),
        cmocka_unit_test(test_gpu_sharers),
        cmocka_unit_test(test_message_round_trip),
        cmocka_unit_test(test_own_entry_wins),
        cmocka_unit_test(test_validate_nodes),
        cmocka_unit_test(test_stage_node),
        cmocka_unit_test(test_message_nodes),
        cmocka_unit_test(test_endpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
