/* The loader stage, multi-process: one real loader (bin/loader) and two fake
 * targets (child processes speaking the protocol over the bus); the test itself
 * plays the supervisor (the loader's settings: RUN_CONFIG in answer to its config
 * request) and the optimizer (applied messages). Target 0 takes micro-batch 0 and is
 * killed with SIGKILL while holding it; the loader notices (heartbeat timeout) and
 * re-issues micro-batch 0, identical, to target 1. Every micro-batch 0..7 reaches
 * target 1 exactly once and is applied once; nothing is lost, nothing duplicated.
 * Also: a micro-batch is issued only on request (credit), and no further than the
 * lookahead past the last applied step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/bus/bus.h"
#include "common/data/chat.h"
#include "common/data/prepare.h"
#include "common/data/tokenizer.h"
#include "common/pipe/runcfg.h"
#include "common/pipe/stage.h"
#include "proto/codec.h"
#include "tests/support/proc.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

static char root[128], cache[256], bin[1024];

typedef struct { uint64_t mb; uint64_t hash; uint32_t n_tokens; } report_t;

static int make_cache(void) {
    char data[1024], src[1200], small[300], gguf[1024];
    if (paths_shared_data(data, sizeof data) < 0 || paths_default_model(gguf, sizeof gguf) < 0) return -1;
    snprintf(src, sizeof src, "%s/gsm8k/train.jsonl", data);
    snprintf(small, sizeof small, "%s/g.jsonl", root);
    FILE *in = fopen(src, "r"), *out = fopen(small, "w");
    if (!in || !out) return -1;
    char *line = NULL;
    size_t cap = 0;
    for (int i = 0; i < 100 && getline(&line, &cap, in) > 0; i++) fputs(line, out);
    free(line);
    fclose(in);
    fclose(out);
    tok_t *t = NULL;
    chat_template_t ct;
    if (tok_load(gguf, &t) < 0 || chat_template_from_tok(t, &ct) < 0) return -1;
    prep_opts_t po;
    memset(&po, 0, sizeof po);
    po.data_path = small;
    po.ds.prompt_field = "question";
    po.ds.response_field = "answer";
    po.chat = &ct;
    po.n_threads = 1;
    po.out_path = cache;
    prep_stats_t st;
    int rc = prep_run(t, &po, &st);
    tok_destroy(&t);
    return rc;
}

/* ---- fake target (child process) ---- */

typedef struct {
    int index;
    int hold;          /* 1: take one micro-batch and never ask again */
    int report_fd;
    bus_t *bus;
} fake_t;

static void send_msg(bus_t *b, const proto_msg_t *m) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (proto_encode(m, &sb) == 0) bus_send(b, NULL, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
}

static void ask(fake_t *f) {
    proto_msg_t m;
    proto_msg_init(&m, PROTO_WORK_REQUEST);
    m.work_request.target_id = PIPE_ID_TARGET0 + (uint32_t)f->index;
    m.work_request.count = 1;
    send_msg(f->bus, &m);
}

static void fake_on_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    (void)bus; (void)peer;
    fake_t *f = arg;
    proto_msg_t m;
    if (proto_decode(data, len, &m) < 0) return;
    if (m.type == PROTO_MICRO_BATCH) {
        report_t r = {m.micro_batch.mb, 1469598103934665603ull, m.micro_batch.n_tokens};
        for (uint32_t i = 0; i < m.micro_batch.n_tokens; i++)
            r.hash = (r.hash ^ (uint32_t)m.micro_batch.tokens[i]) * 1099511628211ull;
        proc_report(f->report_fd, &r, sizeof r);
        if (!f->hold) ask(f);
    }
    proto_msg_free(&m);
}

static int fake_target(void *arg, int report_fd) {
    fake_t *f = arg;
    f->report_fd = report_fd;
    uv_loop_t loop;
    uv_loop_init(&loop);
    char ep[BUS_ENDPOINT_MAX], id[16];
    bus_endpoint(root, "loader", ep, sizeof ep);
    snprintf(id, sizeof id, "target%d", f->index);
    bus_opts_t o = {0};
    o.kind = BUS_DEALER;
    o.identity = id;
    o.heartbeat_interval_ms = PIPE_HEARTBEAT_MS;
    o.heartbeat_timeout_ms = PIPE_DEAD_MS;
    f->bus = bus_new(&loop, &o);
    if (!f->bus || bus_connect(f->bus, ep) < 0) return 3;
    bus_on_message(f->bus, fake_on_msg, f);
    proto_msg_t h;
    proto_msg_init(&h, PROTO_HELLO);
    h.hello.role = PROTO_ROLE_TARGET;
    h.hello.stage_id = PIPE_ID_TARGET0 + (uint32_t)f->index;
    h.hello.incarnation = 1;
    h.hello.pid = (uint32_t)getpid();
    h.hello.proto_version = DL_PROTO_VERSION;
    h.hello.capabilities = PROTO_CAP_SHM;
    send_msg(f->bus, &h);
    ask(f);
    uv_run(&loop, UV_RUN_DEFAULT); /* until killed */
    return 0;
}

/* ---- the test plays the supervisor and the optimizer ---- */

typedef struct { uv_loop_t loop; bus_t *bus, *sup; int configs; } opt_t;

/* The loader's settings, as `draftline run` would send them: token budget 256, one
 * micro-batch per step, 8 steps, lookahead 1, seed 3 (max_len and epochs: defaults). */
static void loader_config(run_config_t *c) {
    char gguf[1024];
    runcfg_init(c);
    snprintf(c->run_id, sizeof c->run_id, "lrtest");
    snprintf(c->data_cache, sizeof c->data_cache, "%s", cache);
    snprintf(c->target_model, sizeof c->target_model, "%s", paths_default_model(gguf, sizeof gguf) == 0 ? gguf : "-");
    snprintf(c->out_dir, sizeof c->out_dir, "%s", root);
    c->token_budget = 256;
    c->mbs_per_step = 1;
    c->epochs = 1;
    c->max_steps = 8;
    c->lookahead_mbs = 1;
    c->seed = 3;
    c->drafter_layers = 1; c->block_size = 4; c->num_anchors = 8;
    c->hs_min_ready = 1; c->prefetch = 1;
}

/* The supervisor's ROUTER: a config request gets the RUN_CONFIG of loader_config. */
static void sup_on_msg(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    opt_t *o = arg;
    proto_msg_t m;
    if (proto_decode(data, len, &m) < 0) return;
    if (m.type == PROTO_HELLO && (m.hello.capabilities & PROTO_CAP_WANT_CONFIG)) {
        static run_config_t c;
        loader_config(&c);
        proto_msg_t r;
        runcfg_to_msg(&c, m.hello.stage_id, m.hello.incarnation, &r);
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        if (proto_encode(&r, &sb) == 0 && bus_send(bus, peer, sb.data, sb.size) == 0) o->configs++;
        msgpack_sbuffer_destroy(&sb);
    }
    proto_msg_free(&m);
}

static void applied(opt_t *o, uint64_t step) {
    uint64_t mb = step; /* one micro-batch per step */
    proto_msg_t m;
    proto_msg_init(&m, PROTO_HELLO);   /* as the optimizer: the loader takes applied only after it */
    m.hello.role = PROTO_ROLE_OPTIMIZER;
    m.hello.stage_id = PIPE_ID_OPTIMIZER;
    m.hello.incarnation = 1;
    m.hello.pid = (uint32_t)getpid();
    m.hello.proto_version = DL_PROTO_VERSION;
    m.hello.capabilities = PROTO_CAP_SHM;
    send_msg(o->bus, &m);
    proto_msg_init(&m, PROTO_APPLIED);
    m.applied.step = step;
    m.applied.mbs = &mb;
    m.applied.n_mbs = 1;
    send_msg(o->bus, &m);
    for (int i = 0; i < 5; i++) uv_run(&o->loop, UV_RUN_NOWAIT);
}

/* Reads one report, running the optimizer's loop meanwhile. */
static int read_report(opt_t *o, proc_t *p, report_t *r, int timeout_ms) {
    for (int waited = 0; waited < timeout_ms; waited += 20) {
        uv_run(&o->loop, UV_RUN_NOWAIT);
        int rc = proc_read(p, r, sizeof *r, 20);
        if (rc != DL_ETIMEDOUT) return rc;
    }
    return DL_ETIMEDOUT;
}

static void test_reissue_after_kill(void **state) {
    (void)state;
    char exe[1100];
    snprintf(exe, sizeof exe, "%s/loader", bin);
    char *argv[] = {"loader", "--run-dir", root, "--incarnation", "1", NULL};
    proc_t loader, t0, t1;
    opt_t o;
    memset(&o, 0, sizeof o);
    uv_loop_init(&o.loop);
    char ep[BUS_ENDPOINT_MAX];
    bus_endpoint(root, "sup", ep, sizeof ep);
    bus_opts_t so = {0};
    so.kind = BUS_ROUTER;
    so.name = "supervisor";
    so.heartbeat_interval_ms = PIPE_HEARTBEAT_MS;
    so.heartbeat_timeout_ms = PIPE_DEAD_MS;
    o.sup = bus_new(&o.loop, &so);
    assert_non_null(o.sup);
    assert_int_equal(bus_bind(o.sup, ep), 0);
    bus_on_message(o.sup, sup_on_msg, &o);
    assert_int_equal(proc_spawn_exec(&loader, "loader", exe, argv), 0);
    bus_endpoint(root, "loader", ep, sizeof ep);
    bus_opts_t bo = {0};
    bo.kind = BUS_DEALER;
    bo.identity = "optimizer";
    bo.heartbeat_interval_ms = PIPE_HEARTBEAT_MS;
    bo.heartbeat_timeout_ms = PIPE_DEAD_MS;
    o.bus = bus_new(&o.loop, &bo);
    assert_non_null(o.bus);
    assert_int_equal(bus_connect(o.bus, ep), 0);

    static fake_t f0 = {0, 1, -1, NULL}, f1 = {1, 0, -1, NULL};
    assert_int_equal(proc_spawn(&t0, "target0", fake_target, &f0), 0);
    report_t r0;
    assert_int_equal(read_report(&o, &t0, &r0, 20000), 0);
    assert_int_equal(r0.mb, 0);
    assert_true(r0.n_tokens > 0 && r0.n_tokens <= 256);

    assert_int_equal(proc_spawn(&t1, "target1", fake_target, &f1), 0);
    report_t r;
    assert_int_equal(read_report(&o, &t1, &r, 10000), 0);
    assert_int_equal(r.mb, 1);
    /* lookahead 1: nothing past micro-batch 1 goes out before step 0 is applied */
    assert_int_equal(read_report(&o, &t1, &r, 500), DL_ETIMEDOUT);

    /* target 0 dies holding micro-batch 0: it is re-issued, identical, to target 1 */
    proc_kill(&t0);
    assert_int_equal(read_report(&o, &t1, &r, 10000), 0);
    assert_int_equal(r.mb, 0);
    assert_int_equal(r.hash, r0.hash);
    assert_int_equal(r.n_tokens, r0.n_tokens);

    int seen[8] = {1, 1, 0, 0, 0, 0, 0, 0};
    applied(&o, 0);
    for (uint64_t step = 1; step < 8; step++) {
        /* micro-batch step+1 is released by applying step */
        if (step + 1 < 8) {
            applied(&o, step);
            assert_int_equal(read_report(&o, &t1, &r, 10000), 0);
            assert_true(r.mb < 8);
            assert_int_equal(seen[r.mb], 0); /* never twice */
            seen[r.mb] = 1;
        } else {
            applied(&o, step);
        }
    }
    for (int i = 0; i < 8; i++) assert_int_equal(seen[i], 1);
    /* every step applied: the loader issues nothing more */
    assert_int_equal(read_report(&o, &t1, &r, 1000), DL_ETIMEDOUT);

    proc_kill(&t1);
    assert_int_equal(proc_signal(&loader, SIGTERM), 0);
    int code = -1;
    assert_int_equal(proc_wait(&loader, 10000, &code), 0);
    assert_int_equal(code, 0);
    proc_kill(&loader);
    assert_int_equal(o.configs, 1);
    bus_destroy(&o.bus);
    bus_destroy(&o.sup);
    uv_run(&o.loop, UV_RUN_DEFAULT);
    uv_loop_close(&o.loop);
}

static int setup(void **state) {
    (void)state;
    char gguf[1024];
    if (paths_default_model(gguf, sizeof gguf) < 0 || access(gguf, R_OK) != 0) return -1;
    const char *b = getenv("DL_BIN_DIR");
    snprintf(bin, sizeof bin, "%s", b && *b ? b : "bin");
    snprintf(root, sizeof root, "/tmp/dllr-%d", (int)getpid());
    if (bus_run_dir_create(root) < 0) return -1;
    snprintf(cache, sizeof cache, "%s/g.dlc", root);
    if (make_cache() < 0) { fprintf(stderr, "cache: %s\n", dl_errmsg()); return -1; }
    proc_watchdog(90);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    proc_kill_all();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reissue_after_kill),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
