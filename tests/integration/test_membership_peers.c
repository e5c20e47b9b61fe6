/* Stage-to-stage membership (issue 15 item 17; docs/ARCHITECTURE.md "Membership"). On a
 * live --deterministic CPU run (1 target, 1 drafter), an intruder with the run's socket
 * paths, not a member (no run secret, so no peer key):
 *  - on loader.sock: hello as target 0 without a token, work_request, applied;
 *  - on drafter0.sock: hello as target 0 with a wrong token, hidden_states_ready,
 *    slot_release; a hello under the routing id of a newer incarnation of target 0
 *    ("target0.2"), wrong token;
 *  - on optimizer.sock: hello as drafter 0 without a token, gradients_ready;
 * each answered with the `error` PROTOCOL.md promises (ref_type = the refused type) and
 * nothing else (no micro-batch, no grant, no slab); and a connection under the routing id
 * of the live target (read from the drafter's log) saying hello as a newer incarnation:
 * it hears nothing (no takeover, no grant), the live target keeps its route. The run
 * then finishes: every step applied once, the final checkpoint bitwise that of the
 * undisturbed run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/bus/bus.h"
#include "common/pipe/cred.h"
#include "proto/codec.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"
#include "tests/unit/test_proto_fixture.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MP_STEPS "150"
#define MP_STEPS_N 150

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlmp", 60) < 0) return -1;
    proc_watchdog(600);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int steps_done(const char *out) {
    char p[500];
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    return pf_count_lines(p);
}

/* Starts `draftline run` (1 target, 1 drafter, --deterministic) into out. */
static void run_start(proc_t *p, pf_run_args_t *a, const char *out, const char *tag) {
    memset(a, 0, sizeof *a);
    const char *argv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                          "--targets", "1", "--drafters", "1", "--threads", "1", "--token-budget", "256",
                          "--block-size", "4", "--num-anchors", "8", "--drafter-layers", "1",
                          "--micro-batches-per-step", "2", "--seed", "5", "--max-steps", MP_STEPS,
                          "--epochs", "1000", "--save-every", MP_STEPS, "--deterministic", "--out", out, NULL};
    for (int i = 0; argv[i]; i++) a->argv[i] = (char *)argv[i];
    snprintf(a->log, sizeof a->log, "%s/%s.out", fx.root, tag);
    assert_int_equal(proc_spawn(p, "draftline run", pf_run_child, a), 0);
}

/* ---- the intruder: one DEALER on one of the run's sockets ---- */

typedef struct {
    uv_loop_t loop;
    bus_t *b;
    int err[PROTO_TYPE_COUNT_];   /* error replies by ref_type */
    int others;                   /* anything else heard */
} intr_t;

static void on_reply(bus_t *b, const char *peer, const void *data, size_t len, void *arg) {
    (void)b; (void)peer;
    intr_t *x = arg;
    proto_msg_t m;
    if (proto_decode(data, len, &m) < 0) { x->others++; return; }
    if (m.type == PROTO_ERROR && m.error.code == DL_EPROTO && m.error.ref_type < PROTO_TYPE_COUNT_)
        x->err[m.error.ref_type]++;
    else
        x->others++;
    proto_msg_free(&m);
}

static void on_guard(uv_timer_t *t) { uv_stop(t->loop); }

static void loop_for(uv_loop_t *loop, uint64_t ms) {
    uv_timer_t g;
    uv_timer_init(loop, &g);
    uv_timer_start(&g, on_guard, ms, 0);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&g, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
}

static void intr_open(intr_t *x, const char *out, const char *server, const char *identity) {
    memset(x, 0, sizeof *x);
    char ep[BUS_ENDPOINT_MAX];
    assert_int_equal(bus_endpoint(out, server, ep, sizeof ep), 0);
    uv_loop_init(&x->loop);
    bus_opts_t o = {.kind = BUS_DEALER, .name = server, .identity = identity};
    x->b = bus_new(&x->loop, &o);
    assert_non_null(x->b);
    assert_int_equal(bus_connect(x->b, ep), 0);
    bus_on_message(x->b, on_reply, x);
}

static void intr_close(intr_t *x) {
    bus_destroy(&x->b);
    uv_run(&x->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&x->loop), 0);
}

static void intr_send(intr_t *x, const proto_msg_t *m) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    assert_int_equal(proto_encode(m, &sb), 0);
    assert_int_equal(bus_send(x->b, NULL, sb.data, sb.size), 0);
    msgpack_sbuffer_destroy(&sb);
}

/* A hello as stage `id` (role from it) of incarnation inc; cred 32 bytes `fill`, or none. */
static void intr_hello(intr_t *x, uint32_t id, uint64_t inc, int with_cred, uint8_t fill) {
    proto_msg_t h;
    proto_msg_init(&h, PROTO_HELLO);
    h.hello.role = id >= 200 ? PROTO_ROLE_TARGET : PROTO_ROLE_DRAFTER;
    h.hello.stage_id = id;
    h.hello.incarnation = inc;
    h.hello.pid = (uint32_t)getpid();
    h.hello.proto_version = DL_PROTO_VERSION;
    h.hello.capabilities = PROTO_CAP_SHM;
    if (with_cred) { memset(h.hello.cred, fill, CRED_BYTES); h.hello.cred_len = CRED_BYTES; }
    intr_send(x, &h);
}

/* A valid message of type t (the codec's sample) with its sender fields as target 0 /
 * drafter 0 would put them. */
static void intr_sample(intr_t *x, int t) {
    proto_msg_t m;
    make_sample(t, false, &m);
    if (t == PROTO_WORK_REQUEST) m.work_request.target_id = 200;
    if (t == PROTO_HIDDEN_STATES_READY) { m.hidden_states_ready.target_id = 200; m.hidden_states_ready.drafter_id = 100; }
    if (t == PROTO_SLOT_RELEASE) { m.slot_release.drafter_id = 100; m.slot_release.slot_id = 0; }
    if (t == PROTO_GRADIENTS_READY) m.gradients_ready.drafter_id = 100;
    intr_send(x, &m);
}

/* Runs x's loop until it heard n errors of ref type t (at most 5 s). */
static int intr_wait(intr_t *x, int t, int n) {
    for (int i = 0; i < 50 && x->err[t] < n; i++) loop_for(&x->loop, 100);
    return x->err[t];
}

/* The live target's routing id at the drafter ("hello from <id> (target 200"). */
static void live_target_id(const char *out, char *id, size_t cap) {
    char p[600];
    snprintf(p, sizeof p, "%s/logs/drafter0.log", out);
    char *t = pf_slurp(p, NULL);
    assert_non_null(t);
    const char *h = strstr(t, "hello from ");
    assert_non_null(h);
    h += strlen("hello from ");
    size_t n = strcspn(h, " ");
    assert_true(n > 0 && n < cap);
    memcpy(id, h, n);
    id[n] = 0;
    free(t);
}

static void intrude(const char *out) {
    intr_t x;
    intr_open(&x, out, "loader", "intruder.l");
    intr_hello(&x, 200, 7, 0, 0);
    intr_sample(&x, PROTO_WORK_REQUEST);
    intr_sample(&x, PROTO_APPLIED);
    assert_int_equal(intr_wait(&x, PROTO_HELLO, 1), 1);
    assert_int_equal(intr_wait(&x, PROTO_WORK_REQUEST, 1), 1);
    assert_int_equal(intr_wait(&x, PROTO_APPLIED, 1), 1);
    loop_for(&x.loop, 300);
    assert_int_equal(x.others, 0);   /* no micro-batch */
    intr_close(&x);

    intr_open(&x, out, "drafter0", "intruder.d");
    intr_hello(&x, 200, 7, 1, 0xab);
    intr_sample(&x, PROTO_HIDDEN_STATES_READY);
    intr_sample(&x, PROTO_SLOT_RELEASE);
    assert_int_equal(intr_wait(&x, PROTO_HELLO, 1), 1);
    assert_int_equal(intr_wait(&x, PROTO_HIDDEN_STATES_READY, 1), 1);
    assert_int_equal(intr_wait(&x, PROTO_SLOT_RELEASE, 1), 1);
    loop_for(&x.loop, 300);
    assert_int_equal(x.others, 0);   /* no slab export, no grant */
    intr_close(&x);

    intr_open(&x, out, "drafter0", "target0.2");   /* a newer incarnation's routing id */
    intr_hello(&x, 200, 2, 1, 0xcd);
    assert_int_equal(intr_wait(&x, PROTO_HELLO, 1), 1);
    loop_for(&x.loop, 300);
    assert_int_equal(x.others, 0);
    intr_close(&x);

    intr_open(&x, out, "optimizer", "intruder.o");
    intr_hello(&x, 100, 7, 0, 0);
    intr_sample(&x, PROTO_GRADIENTS_READY);
    assert_int_equal(intr_wait(&x, PROTO_HELLO, 1), 1);
    assert_int_equal(intr_wait(&x, PROTO_GRADIENTS_READY, 1), 1);
    loop_for(&x.loop, 300);
    assert_int_equal(x.others, 0);   /* no weights slab */
    intr_close(&x);

    /* the takeover: the live target's own routing id, as a newer incarnation */
    char live[BUS_ID_MAX + 1];
    live_target_id(out, live, sizeof live);
    intr_open(&x, out, "drafter0", live);
    intr_hello(&x, 200, 2, 0, 0);
    intr_sample(&x, PROTO_HIDDEN_STATES_READY);
    loop_for(&x.loop, 1500);
    int heard = x.others;
    for (int t = 0; t < PROTO_TYPE_COUNT_; t++) heard += x.err[t];
    if (heard) fprintf(stderr, "the connection under %s heard %d message(s)\n", live, heard);
    assert_int_equal(heard, 0);   /* ignored: no route, no grant, no slab */
    intr_close(&x);
}

static void same_file(const char *a_out, const char *b_out, const char *name) {
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/checkpoints/step_%d/%s", a_out, MP_STEPS_N, name);
    snprintf(b, sizeof b, "%s/checkpoints/step_%d/%s", b_out, MP_STEPS_N, name);
    assert_true(pf_same_file(a, b));
}

static void test_peers_refuse_non_members(void **state) {
    (void)state;
    char one[400], two[400], id[17];
    snprintf(one, sizeof one, "%s/calm", fx.root);
    snprintf(two, sizeof two, "%s/intruded", fx.root);
    static pf_run_args_t a1, a2;
    proc_t p1, p2;
    run_start(&p1, &a1, one, "calm");
    assert_int_equal(pf_run_finish(&p1, a1.log, one, 400, id), 0);
    run_start(&p2, &a2, two, "intruded");
    double t0 = now_s();
    while (steps_done(two) < 1 && now_s() - t0 < 120) usleep(20000);
    assert_true(steps_done(two) >= 1);
    intrude(two);
    assert_true(steps_done(two) < MP_STEPS_N);   /* the intruder came while it trained */
    assert_int_equal(pf_run_finish(&p2, a2.log, two, 400, id), 0);
    assert_int_equal(steps_done(two), MP_STEPS_N);   /* every step once */
    same_file(one, two, "state.bin");
    same_file(one, two, "model.safetensors");
    char p[600];
    snprintf(p, sizeof p, "%s/logs/drafter0.log", two);
    char *t = pf_slurp(p, NULL);
    assert_non_null(t);
    assert_non_null(strstr(t, "hello from intruder.d refused: not a member of run"));
    free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peers_refuse_non_members),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
