/* Writes one file per valid sample message into DIR (the fuzz seed corpus):
 * every message type (1-23), with small arrays, CPU and GPU variants, one host
 * and several nodes.
 * Usage: gen_corpus DIR */
#include <stdio.h>
#include <string.h>

#include "common/base/err.h"
#include "proto/codec.h"

static int n_written, n_failed;
static int seen[PROTO_TYPE_COUNT_];

static void emit(const char *dir, const proto_msg_t *m) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (proto_encode(m, &sb) != 0) {
        fprintf(stderr, "gen_corpus: %s: %s\n", proto_type_name(m->type), dl_errmsg());
        msgpack_sbuffer_destroy(&sb);
        n_failed++;
        return;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/seed_%02d_%s", dir, n_written, proto_type_name(m->type));
    FILE *f = fopen(path, "wb");
    if (f && fwrite(sb.data, 1, sb.size, f) == sb.size && fclose(f) == 0) { n_written++; seen[m->type]++; }
    else { fprintf(stderr, "gen_corpus: cannot write %s\n", path); n_failed++; }
    msgpack_sbuffer_destroy(&sb);
}

/* Seeds of the node agents' messages and nccl_id. */
static void emit_node_seeds(const char *dir) {
    proto_msg_t m;
    static const int64_t mib[2] = { 81000, 40960 };
    proto_msg_init(&m, PROTO_NODE_HELLO);
    proto_node_hello_t *nh = &m.node_hello;
    strcpy(nh->name, "b"); strcpy(nh->hostname, "b.example"); strcpy(nh->addr, "10.0.0.2");
    nh->run_dir = "/scratch/r1"; nh->n_run_dir = 11; nh->pid = 77; nh->incarnation = 5;
    nh->proto_version = DL_PROTO_VERSION; nh->cores = 16; emit(dir, &m);
    nh->gpu_uuids = "GPU-1\nGPU-2"; nh->n_gpu_uuids = 11; nh->gpu_free_mib = mib; nh->n_gpu_free_mib = 2;
    emit(dir, &m);

    proto_msg_init(&m, PROTO_NODE_WELCOME);
    strcpy(m.node_welcome.run_id, "r1"); m.node_welcome.node_index = 1; m.node_welcome.node_incarnation = 5;
    emit(dir, &m);

    proto_msg_init(&m, PROTO_NODE_SPAWN);
    m.node_spawn.stage_id = 100; m.node_spawn.incarnation = 1; strcpy(m.node_spawn.exe, "drafter_worker");
    m.node_spawn.index = 0; m.node_spawn.threads = 4; strcpy(m.node_spawn.sup_endpoint, "tcp://10.0.0.1:29500");
    emit(dir, &m);

    proto_msg_init(&m, PROTO_NODE_SIGNAL);
    m.node_signal.stage_id = 100; m.node_signal.incarnation = 1; m.node_signal.signum = 15; emit(dir, &m);

    proto_msg_init(&m, PROTO_NODE_STAGE);
    m.node_stage.stage_id = 100; m.node_stage.incarnation = 1; m.node_stage.event = PROTO_NODE_EV_EXITED;
    m.node_stage.pid = 4321; m.node_stage.wait_status = 256; emit(dir, &m);

    proto_msg_init(&m, PROTO_NCCL_ID);
    m.nccl_id.owner_id = 100; m.nccl_id.owner_inc = 1; m.nccl_id.peer_id = 10; m.nccl_id.peer_inc = 2;
    m.nccl_id.nranks = 2; m.nccl_id.rank = 1; m.nccl_id.id_len = DL_PROTO_NCCL_ID_BYTES;
    for (uint32_t i = 0; i < DL_PROTO_NCCL_ID_BYTES; i++) m.nccl_id.id[i] = (uint8_t)(i ^ 0x5a);
    emit(dir, &m);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: gen_corpus DIR\n"); return 2; }
    const char *dir = argv[1];
    proto_msg_t m;
    static const int32_t tok[8] = { 1, 2, 300, 4, 151000, 6, 7, 8 }, sl[3] = { 3, 1, 4 };
    static const uint8_t mask[8] = { 0, 1, 1, 0, 1, 1, 1, 0 };
    static const uint64_t mbs[3] = { 10, 11, 13 };
    static const float acc[4] = { 0.9f, 0.5f, 0.25f, 0.0f };
    static const int64_t ints[4] = { 0, 2, 1, 3 };

    proto_msg_init(&m, PROTO_HELLO);
    m.hello.role = PROTO_ROLE_TARGET; m.hello.stage_id = 3; m.hello.incarnation = 1234; m.hello.pid = 999;
    m.hello.capabilities = PROTO_CAP_SHM; emit(dir, &m);
    strcpy(m.hello.gpu_uuid, "GPU-01234567-89ab-cdef-0123-456789abcdef");
    m.hello.capabilities = PROTO_CAP_CUDA_IPC | PROTO_CAP_HOST_TIER; emit(dir, &m);

    proto_msg_init(&m, PROTO_HEARTBEAT);
    m.heartbeat.stage_id = 1; m.heartbeat.incarnation = 2; m.heartbeat.seq = 300; m.heartbeat.state = PROTO_STATE_RUNNING;
    emit(dir, &m);

    proto_msg_init(&m, PROTO_WORK_REQUEST);
    m.work_request.target_id = 2; m.work_request.count = 4; emit(dir, &m);

    proto_msg_init(&m, PROTO_MICRO_BATCH);
    m.micro_batch.mb = 77; m.micro_batch.step = 9; m.micro_batch.epoch = 1; m.micro_batch.mb_in_step = 1;
    m.micro_batch.mbs_in_step = 4; m.micro_batch.n_seqs = 3;
    m.micro_batch.tokens = tok; m.micro_batch.n_tokens = 8; m.micro_batch.seq_lens = sl; m.micro_batch.n_seq_lens = 3;
    m.micro_batch.loss_mask = mask; m.micro_batch.n_loss_mask = 8; emit(dir, &m);

    proto_msg_init(&m, PROTO_SLAB_EXPORT);
    m.slab_export.owner_id = 5; m.slab_export.incarnation = 8; m.slab_export.slab_id = 1;
    m.slab_export.tier = PROTO_TIER_HOST; m.slab_export.bytes = 1 << 20;
    strcpy(m.slab_export.shm_name, "/dl-run-5-1"); emit(dir, &m);
    m.slab_export.shm_name[0] = 0; m.slab_export.tier = PROTO_TIER_GPU;
    memset(m.slab_export.handle, 0xab, sizeof m.slab_export.handle); m.slab_export.handle_len = DL_PROTO_HANDLE_BYTES;
    strcpy(m.slab_export.gpu_uuid, "GPU-1"); emit(dir, &m);

    proto_msg_init(&m, PROTO_SLOT_GRANT);
    m.slot_grant.drafter_id = 5; m.slot_grant.target_id = 2; m.slot_grant.slot_id = 7;
    m.slot_grant.tier = PROTO_TIER_GPU; m.slot_grant.slab_id = 1; m.slot_grant.offset = 4096; m.slot_grant.bytes = 65536;
    emit(dir, &m);

    proto_msg_init(&m, PROTO_HIDDEN_STATES_READY);
    proto_hidden_states_ready_t *h = &m.hidden_states_ready;
    h->target_id = 2; h->drafter_id = 5; h->slab_id = 1; h->slot_id = 7; h->tier = PROTO_TIER_HOST;
    h->offset = 4096; h->dtype = PROTO_DTYPE_F32; h->ndim = 2; h->shape[0] = 8; h->shape[1] = 10; h->n_feat = 5;
    h->mb = 77; h->step = 9; h->mb_in_step = 1; h->mbs_in_step = 4; h->n_seqs = 3;
    h->tokens = tok; h->n_tokens = 8; h->seq_lens = sl; h->n_seq_lens = 3; h->loss_mask = mask;
    h->n_loss_mask = 8; h->bytes = 320; emit(dir, &m);
    h->tier = PROTO_TIER_GPU; h->dtype = PROTO_DTYPE_BF16; memset(h->event, 0x5a, sizeof h->event);
    h->event_len = DL_PROTO_HANDLE_BYTES; strcpy(h->gpu_uuid, "GPU-2"); emit(dir, &m);

    proto_msg_init(&m, PROTO_SLOT_RELEASE);
    m.slot_release.drafter_id = 5; m.slot_release.slot_id = 7; m.slot_release.mb = 77; emit(dir, &m);
    m.slot_release.mb = DL_PROTO_MB_NONE; emit(dir, &m);

    proto_msg_init(&m, PROTO_GRADIENTS_READY);
    proto_gradients_ready_t *g = &m.gradients_ready;
    g->drafter_id = 5; g->step = 9; g->weights_version = 8; g->mbs = mbs; g->n_mbs = 3; g->n_tokens = 4000;
    g->loss_sum = 12.5; g->weight_sum = 7.25; g->acc = acc; g->n_acc = 4; g->slab_id = 2; g->offset = 0;
    g->n_params = 1000; g->bytes = 4000; emit(dir, &m);

    proto_msg_init(&m, PROTO_WEIGHTS_VERSION);
    m.weights_version.version = 9; m.weights_version.slab_id = 3; m.weights_version.offset = 0;
    m.weights_version.n_params = 1000; m.weights_version.dtype = PROTO_DTYPE_BF16; m.weights_version.bytes = 2000;
    emit(dir, &m);

    proto_msg_init(&m, PROTO_METRICS);
    m.metrics.stage_id = 5; m.metrics.role = PROTO_ROLE_DRAFTER; m.metrics.incarnation = 8; m.metrics.ts_ns = 1700000000000000000ull;
    strcpy(m.metrics.state, "running"); m.metrics.n_metrics = 2;
    strcpy(m.metrics.metrics[0].name, "tokens_per_s"); m.metrics.metrics[0].value = 12345.5;
    strcpy(m.metrics.metrics[1].name, "inbox_bytes"); m.metrics.metrics[1].value = 1 << 30;
    emit(dir, &m);

    proto_msg_init(&m, PROTO_CONTROL);
    m.control.op = PROTO_CTL_ROUTE; m.control.seq = 3; m.control.step = 10; m.control.ints = ints; m.control.n_ints = 4;
    strcpy(m.control.arg, "2-2"); emit(dir, &m);
    m.control.op = PROTO_CTL_DRAIN; m.control.n_ints = 0; m.control.ints = NULL; emit(dir, &m);

    proto_msg_init(&m, PROTO_APPLIED);
    m.applied.step = 9; m.applied.mbs = mbs; m.applied.n_mbs = 3; emit(dir, &m);

    proto_msg_init(&m, PROTO_ERROR);
    m.error.code = DL_EPROTO; m.error.ref_type = PROTO_MICRO_BATCH; strcpy(m.error.message, "bad"); emit(dir, &m);

    static const int64_t gpus[3] = { 0, 1, 2 }, routes[3] = { 0, 1, 0 }, tnodes[3] = { 0, 2, 1 },
                         dnodes[2] = { 1, 2 };
    static const uint8_t text[5] = { '{', '}', 0, 0xff, '\n' };

    proto_msg_init(&m, PROTO_CTL_REQUEST);
    m.ctl_request.id = 7; m.ctl_request.op = PROTO_CTLREQ_STATUS; emit(dir, &m);
    m.ctl_request.op = PROTO_CTLREQ_REBALANCE; m.ctl_request.target_gpus = gpus; m.ctl_request.n_target_gpus = 3;
    m.ctl_request.drafter_gpus = gpus; m.ctl_request.n_drafter_gpus = 2; emit(dir, &m);

    proto_msg_init(&m, PROTO_CTL_REPLY);
    m.ctl_reply.id = 7; strcpy(m.ctl_reply.state, "ok"); m.ctl_reply.text = text; m.ctl_reply.n_text = 5;
    emit(dir, &m);

    /* run_config: one host, then three nodes (version 2's node table) with fp8 targets and GPU
     * turns on (version 3's gpu_turns) */
    proto_msg_init(&m, PROTO_RUN_CONFIG);
    proto_run_config_t *c = &m.run_config;
    c->stage_id = 201; c->incarnation = 1; strcpy(c->run_id, "r1");
    c->data_cache = "/d.dlc"; c->n_data_cache = 6; c->target_model = "/m"; c->n_target_model = 2;
    c->out_dir = "o"; c->n_out_dir = 1;
    c->token_budget = 2048; c->mbs_per_step = 4; c->max_steps = 10; c->drafter_layers = 1; c->block_size = 8;
    c->num_anchors = 64; c->lr = 6e-4; c->hs_min_ready = 1; c->prefetch = 1; c->gpu = -1; c->drafter = 1;
    c->target_gpus = gpus; c->n_target_gpus = 3; c->drafter_gpus = gpus; c->n_drafter_gpus = 2;
    c->target_drafters = routes; c->n_target_drafters = 3;
    static const int64_t zeros[3] = { 0, 0, 0 };
    c->target_nodes = zeros; c->n_target_nodes = 3; c->drafter_nodes = zeros; c->n_drafter_nodes = 2;
    emit(dir, &m);
    c->net_port = 29500; c->node_addrs = "10.0.0.1\nnode-b\n10.0.0.3\n"; c->n_node_addrs = 25;
    c->node = 2; c->optimizer_node = 1; c->target_nodes = tnodes; c->drafter_nodes = dnodes;
    c->target_precision = 1; c->gpu_turns = 1; emit(dir, &m);

    proto_msg_init(&m, PROTO_SLAB_DATA);
    m.slab_data.owner_id = 101; m.slab_data.owner_inc = 3; m.slab_data.slab_id = 1; m.slab_data.offset = 4096;
    m.slab_data.data = mask; m.slab_data.n_data = 8; emit(dir, &m);

    emit_node_seeds(dir);

    for (int t = 1; t < PROTO_TYPE_COUNT_; t++)   /* a new type needs its seed here */
        if (!seen[t]) { fprintf(stderr, "gen_corpus: no seed of type %d (%s)\n", t, proto_type_name((proto_type_t)t)); n_failed++; }
    printf("gen_corpus: %d seeds in %s\n", n_written, dir);
    return n_failed ? 1 : 0;
}
