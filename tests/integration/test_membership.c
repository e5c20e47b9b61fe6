/* Membership of a run (issue 15 item 17; common/pipe/cred.h): on a live CPU run of the
 * tiny fixture, an intruder DEALER on the run's sup.sock under a stage's identity (target0)
 * says a hello and a config request as target 0 with a wrong credential, then without
 * one: each is answered with the `error` PROTOCOL.md promises ("hello refused: not a member
 * of run <id> in role target0"), nothing else (no run configuration); the supervisor logs
 * the refusals and the run goes on training until stopped.
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

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlmb", 60) < 0) return -1;
    proc_watchdog(300);
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

/* What the intruder heard: error replies (their texts) and anything else. */
typedef struct {
    int errors, others;
    char text[2][DL_PROTO_ERRMSG_MAX + 1];
} heard_t;

static void on_reply(bus_t *b, const char *peer, const void *data, size_t len, void *arg) {
    (void)b; (void)peer;
    heard_t *h = arg;
    proto_msg_t m;
    if (proto_decode(data, len, &m) < 0) { h->others++; return; }
    if (m.type == PROTO_ERROR && m.error.ref_type == PROTO_HELLO) {
        if (h->errors < 2) snprintf(h->text[h->errors], sizeof h->text[0], "%s", m.error.message);
        h->errors++;
    } else {
        h->others++;
    }
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

static void send_msg(bus_t *b, const proto_msg_t *m) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    assert_int_equal(proto_encode(m, &sb), 0);
    assert_int_equal(bus_send(b, NULL, sb.data, sb.size), 0);
    msgpack_sbuffer_destroy(&sb);
}

/* A hello as target 0 (incarnation 1; a config request when want_config), with a
 * credential of 32 bytes `fill` (cred_len 0 when with_cred is 0). */
static void hello_as_target0(bus_t *b, int want_config, int with_cred, uint8_t fill) {
    proto_msg_t h;
    proto_msg_init(&h, PROTO_HELLO);
    h.hello.role = PROTO_ROLE_TARGET;
    h.hello.stage_id = 200;
    h.hello.incarnation = 1;
    h.hello.pid = (uint32_t)getpid();
    h.hello.proto_version = DL_PROTO_VERSION;
    h.hello.capabilities = want_config ? PROTO_CAP_WANT_CONFIG : PROTO_CAP_SHM;
    if (with_cred) { memset(h.hello.cred, fill, CRED_BYTES); h.hello.cred_len = CRED_BYTES; }
    send_msg(b, &h);
}

static void test_sup_refuses_non_member(void **state) {
    (void)state;
    char out[400], ep[600], run_id[17] = "";
    snprintf(out, sizeof out, "%s/intrude", fx.root);
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    const char *argv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                          "--targets", "1", "--drafters", "1", "--threads", "1", "--token-budget", "256",
                          "--block-size", "4", "--num-anchors", "8", "--drafter-layers", "1",
                          "--micro-batches-per-step", "2", "--seed", "5", "--max-steps", "100000",
                          "--epochs", "1000", "--save-every", "100000", "--progress-every", "1", "--out", out, NULL};
    for (int i = 0; argv[i]; i++) a.argv[i] = (char *)argv[i];
    snprintf(a.log, sizeof a.log, "%s/intrude.out", fx.root);
    proc_t p;
    assert_int_equal(proc_spawn(&p, "draftline run", pf_run_child, &a), 0);
    double t0 = now_s();
    while (steps_done(out) < 1 && now_s() - t0 < 120) usleep(20000);
    assert_true(steps_done(out) >= 1);

    assert_int_equal(bus_endpoint(out, "sup", ep, sizeof ep), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    heard_t heard = {0};
    bus_opts_t o = {.kind = BUS_DEALER, .name = "supervisor", .identity = "target0"};
    bus_t *b = bus_new(&loop, &o);
    assert_non_null(b);
    assert_int_equal(bus_connect(b, ep), 0);
    bus_on_message(b, on_reply, &heard);
    hello_as_target0(b, 1, 1, 0xab);   /* a config request, wrong credential */
    hello_as_target0(b, 0, 0, 0);      /* an "up" hello, no credential */
    for (int i = 0; i < 50 && heard.errors < 2; i++) loop_for(&loop, 100);
    bus_destroy(&b);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);

    /* the run goes on */
    int at = steps_done(out);
    double t1 = now_s();
    while (steps_done(out) < at + 2 && now_s() - t1 < 90) usleep(20000);
    assert_true(steps_done(out) >= at + 2);
    assert_int_equal(kill(p.pid, SIGTERM), 0);
    int rc = pf_run_finish(&p, a.log, out, 200, run_id);
    char *log = pf_slurp(a.log, NULL);
    assert_non_null(log);
    if (rc != 128 + SIGTERM || heard.errors != 2 || getenv("DL_TEST_VERBOSE")) printf("%s\n", log);
    assert_int_equal(rc, 128 + SIGTERM);
    assert_int_equal(heard.errors, 2);
    assert_int_equal(heard.others, 0);   /* no run configuration, nothing else */
    char want[200];
    snprintf(want, sizeof want, "hello refused: not a member of run %s in role target0", run_id);
    assert_string_equal(heard.text[0], want);
    assert_string_equal(heard.text[1], want);
    char sup_log[600];
    snprintf(sup_log, sizeof sup_log, "%s/logs/supervisor.log", out);
    char *sl = pf_slurp(sup_log, NULL);
    const char *where = sl && strstr(sl, "refused: wrong credential") ? sl : log;
    assert_non_null(strstr(where, "as target0 incarnation 1 refused: wrong credential"));
    assert_non_null(strstr(where, "as target0 incarnation 1 refused: no credential"));
    free(sl);
    free(log);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sup_refuses_non_member),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
