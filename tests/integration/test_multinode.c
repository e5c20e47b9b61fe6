/* Multi-node runs without a second host (docs/MULTINODE.md).
 *
 * test_fake_nodes_bitwise: the --deterministic 2+2 CPU run of test_run_reference_ckpt, once
 * on one host (ipc://, every slab mapped) and once as the head of a multi-node run
 * (--listen 127.0.0.1:PORT: every stage endpoint tcp:// with the run's CURVE keys) under the
 * test hook fake_nodes=1, which tells every target and drafter it runs on a node of its own:
 * the final checkpoint (state.bin, model.safetensors, cursor.bin) must be bitwise the same,
 * and the bytes must have moved as slab_data (metrics.jsonl: xfer_bytes_out of the targets,
 * xfer_bytes_in of the drafters, both of the optimizer and of drafter 1, the drafter off
 * the optimizer's node; all 0 on the one-host run).
 *
 * test_fake_nodes_kill: a longer --deterministic fake_nodes run (24 steps, a checkpoint
 * every 4) with kill -9 of a target, the remote drafter and the optimizer mid-run: every
 * step applied once (steps.jsonl), the final checkpoint bitwise the undisturbed one-host
 * run's.
 *
 * test_fake_nodes_refusals: in a fake_nodes run, an intruder holding the run's key sends
 * slab_data the drafter and the optimizer must refuse (before any hello; after a hello,
 * outside any grant; into a slab the optimizer does not mirror): logged, dropped, the run
 * goes on until stopped.
 *
 * test_listen_refusals: --listen / --key / --nodes mistakes are refused (exit 2) before
 * anything is created, naming the flag.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/bus/bus.h"
#include "common/pipe/slot.h"
#include "proto/codec.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <cjson/cJSON.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlmn", 60) < 0) return -1;
    proc_watchdog(400);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* Starts the reference 2+2 --deterministic run into out (max_steps steps, a checkpoint
 * every save_every); listen: NULL or "127.0.0.1:P". a: the child's arguments (kept until
 * run_wait). */
static void run_start(proc_t *p, pf_run_args_t *a, const char *out, const char *listen, const char *tag,
                      const char *max_steps, const char *save_every) {
    memset(a, 0, sizeof *a);
    const char *argv[64] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache,
                            "--device", "cpu", "--targets", "2", "--drafters", "2", "--threads", "1",
                            "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                            "--drafter-layers", "1", "--lr", "3e-3", "--micro-batches-per-step", "2",
                            "--seed", "5", "--max-steps", max_steps, "--save-every", save_every,
                            "--deterministic", "--progress-every", "1", "--max-restarts", "20", "--out", out, NULL};
    int n = 0;
    while (argv[n]) n++;
    if (listen) { argv[n++] = "--listen"; argv[n++] = listen; argv[n] = NULL; }
    /* a run meant to go on until it is stopped: more than the fixture's one epoch (29 steps) */
    if (atoll(max_steps) > 1000) { argv[n++] = "--epochs"; argv[n++] = "1000"; argv[n] = NULL; }
    for (int i = 0; argv[i]; i++) a->argv[i] = (char *)argv[i];
    snprintf(a->log, sizeof a->log, "%s/%s.out", fx.root, tag);
    assert_int_equal(proc_spawn(p, "draftline run", pf_run_child, a), 0);
}

static void run_wait(proc_t *p, pf_run_args_t *a, const char *out, int want_rc) {
    char id[17];
    int rc = pf_run_finish(p, a->log, out, 200, id);
    if (rc != want_rc || getenv("DL_TEST_VERBOSE")) {
        size_t len;
        char *t = pf_slurp(a->log, &len);
        printf("--- %s (exit %d) ---\n%s\n", a->log, rc, t ? t : "(no log)");
        free(t);
    }
    assert_int_equal(rc, want_rc);
}

/* Runs the reference run (4 steps, a checkpoint every 2) to its end. */
static void run_ref(const char *out, const char *listen, const char *tag) {
    static pf_run_args_t a;
    proc_t p;
    run_start(&p, &a, out, listen, tag, "4", "2");
    run_wait(&p, &a, out, 0);
}

/* The largest value of metric `name` in the lines of `stage` in out/metrics.jsonl (-1:
 * no such line). */
static double max_metric(const char *out, const char *stage, const char *name) {
    char path[600];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    char *txt = pf_slurp(path, NULL);
    assert_non_null(txt);
    double best = -1;
    char *save = NULL;
    for (char *l = strtok_r(txt, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(l);
        const cJSON *st = cJSON_GetObjectItem(j, "stage"), *v = cJSON_GetObjectItem(j, name);
        if (cJSON_IsString(st) && !strcmp(st->valuestring, stage) && cJSON_IsNumber(v) && v->valuedouble > best)
            best = v->valuedouble;
        cJSON_Delete(j);
    }
    free(txt);
    return best;
}

/* Asserts where the slab bytes moved as slab_data (fake_nodes: targets and drafters each
 * on a node of their own, the optimizer on drafter 0's), or that nothing moved (one host:
 * 0, or no line of that stage at all in a short run). A stage publishes at once when its
 * first bytes move (stage_xfer_moved), so a short run has those lines. */
static void assert_xfer(const char *out, int multi) {
    static const struct { const char *stage, *metric; int moves; } want[] = {
        {"target0", "xfer_bytes_out", 1}, {"target1", "xfer_bytes_out", 1},
        {"drafter0", "xfer_bytes_in", 1}, {"drafter1", "xfer_bytes_in", 1},
        {"drafter0", "xfer_bytes_out", 0}, {"drafter1", "xfer_bytes_out", 1},
        {"optimizer", "xfer_bytes_in", 1}, {"optimizer", "xfer_bytes_out", 1},
        {"target0", "xfer_bytes_in", 0}, {"loader", "xfer_bytes_out", 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        double v = max_metric(out, want[i].stage, want[i].metric);
        int ok = multi && want[i].moves ? v > 0 : v <= 0;
        if (!ok) printf("%s: %s %s = %.0f (expected %s)\n", out, want[i].stage, want[i].metric, v,
                        multi && want[i].moves ? "> 0" : "0");
        assert_true(ok);
    }
}

static void assert_same_ckpt(const char *one, const char *multi, int step, int n_files) {
    const char *files[] = {"state.bin", "model.safetensors", "cursor.bin"};
    for (int i = 0; i < n_files; i++) {
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/checkpoints/step_%d/%s", one, step, files[i]);
        snprintf(b, sizeof b, "%s/checkpoints/step_%d/%s", multi, step, files[i]);
        int same = pf_same_file(a, b);
        if (!same) printf("%s differs from %s\n", b, a);
        assert_true(same);
    }
}

static void test_fake_nodes_bitwise(void **state) {
    (void)state;
    char one[400], multi[400], listen[64];
    snprintf(one, sizeof one, "%s/one", fx.root);
    snprintf(multi, sizeof multi, "%s/multi", fx.root);
    run_ref(one, NULL, "one");
    int port = pf_free_port_span();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    setenv("DL_TEST_HOOKS", "fake_nodes=1", 1);
    run_ref(multi, listen, "multi");
    unsetenv("DL_TEST_HOOKS");
    /* the run's key file: made by the head, mode 0600 */
    char key[500];
    snprintf(key, sizeof key, "%s/node.key", multi);
    struct stat st;
    assert_int_equal(stat(key, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_same_ckpt(one, multi, 4, 3);
    assert_xfer(one, 0);
    assert_xfer(multi, 1);
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

/* pid of a stage from run.json (0 when not running) */
static pid_t run_json_pid(const char *out, const char *stage) {
    char p[500];
    snprintf(p, sizeof p, "%s/run.json", out);
    char *txt = pf_slurp(p, NULL);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    pid_t pid = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "stages")) {
        const cJSON *n = cJSON_GetObjectItem(e, "name"), *v = cJSON_GetObjectItem(e, "pid");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, stage) && cJSON_IsNumber(v)) pid = (pid_t)v->valuedouble;
    }
    cJSON_Delete(j);
    return pid;
}

#define KILL_STEPS_S "24"

/* Every step 0..n-1 applied once, in order (steps.jsonl). */
static void assert_ledger(const char *out, int n) {
    char p[500];
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    char *txt = pf_slurp(p, NULL);
    assert_non_null(txt);
    int k = 0;
    char *save = NULL;
    for (char *l = strtok_r(txt, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(l);
        assert_non_null(j);
        assert_int_equal((int)cJSON_GetObjectItem(j, "step")->valuedouble, k);
        cJSON_Delete(j);
        k++;
    }
    free(txt);
    assert_int_equal(k, n);
}

#define KILL_STEPS 24

static void on_intruder_guard(uv_timer_t *t) { uv_stop(t->loop); }

static void loop_for(uv_loop_t *loop, uint64_t ms) {
    uv_timer_t g;
    uv_timer_init(loop, &g);
    uv_timer_start(&g, on_intruder_guard, ms, 0);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&g, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
}

static void intruder_send(bus_t *b, const proto_msg_t *m) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    assert_int_equal(proto_encode(m, &sb), 0);
    assert_int_equal(bus_send(b, NULL, sb.data, sb.size), 0);
    msgpack_sbuffer_destroy(&sb);
}

/* Connects to server `name` of the run in out (port base) with the run's key and sends
 * bad slab_data: one before any hello, then (hello as target 63 when as_target) chunks
 * into owner `owner`'s slab `slab_id` that no grant or mirror covers. */
static void intruder(const char *out, int port, const char *name, int off, int as_target, uint32_t owner,
                     uint32_t slab_id) {
    char key[500], ep[128];
    snprintf(key, sizeof key, "%s/node.key", out);
    bus_curve_keys_t k;
    assert_int_equal(bus_curve_keys_load(key, &k), 0);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port + off);
    uv_loop_t loop;
    uv_loop_init(&loop);
    bus_opts_t o = {.kind = BUS_DEALER, .name = name, .identity = "intruder", .curve = &k};
    bus_t *b = bus_new(&loop, &o);
    assert_non_null(b);
    assert_int_equal(bus_connect(b, ep), 0);
    static uint8_t data[4096];
    memset(data, 0x5A, sizeof data);
    proto_msg_t m;
    proto_msg_init(&m, PROTO_SLAB_DATA);
    m.slab_data = (proto_slab_data_t){owner, 1, slab_id, 0, data, sizeof data};
    intruder_send(b, &m);
    if (as_target) {
        proto_msg_t h;
        proto_msg_init(&h, PROTO_HELLO);
        h.hello.role = PROTO_ROLE_TARGET;
        h.hello.stage_id = 263;
        h.hello.incarnation = 1;
        h.hello.pid = (uint32_t)getpid();
        h.hello.proto_version = DL_PROTO_VERSION;
        h.hello.capabilities = PROTO_CAP_SHM;
        intruder_send(b, &h);
        loop_for(&loop, 1100);   /* past the receiver's one refusal line a second */
    }
    for (int i = 0; i < 3; i++) { m.slab_data.offset = (uint64_t)i << 20; intruder_send(b, &m); }
    loop_for(&loop, 500);   /* let the messages out */
    bus_destroy(&b);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* 1 when the log of stage `stage` in out holds `what`. */
static int log_has(const char *out, const char *stage, const char *what) {
    char p[600];
    snprintf(p, sizeof p, "%s/logs/%s.log", out, stage);
    char *t = pf_slurp(p, NULL);
    int yes = t && strstr(t, what);
    free(t);
    return yes;
}

static void test_fake_nodes_kill(void **state) {
    (void)state;
    char one[400], multi[400], listen[64];
    snprintf(one, sizeof one, "%s/kone", fx.root);
    snprintf(multi, sizeof multi, "%s/kmulti", fx.root);
    static pf_run_args_t a1, a2;
    proc_t p1, p2;
    run_start(&p1, &a1, one, NULL, "kone", KILL_STEPS_S, "4");
    run_wait(&p1, &a1, one, 0);
    int port = pf_free_port_span();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    setenv("DL_TEST_HOOKS", "fake_nodes=1", 1);
    run_start(&p2, &a2, multi, listen, "kmulti", KILL_STEPS_S, "4");
    unsetenv("DL_TEST_HOOKS");
    double t0 = now_s();
    /* a target, the drafter off the optimizer's node, then the optimizer: each once the
     * run has moved on since the previous kill (the optimizer's restart undoes the steps
     * after its last checkpoint: they are recomputed) */
    static const char *const victims[] = {"target1", "drafter1", "optimizer"};
    static const int at_step[] = {2, 6, 10};
    int kills = 0;
    for (int v = 0; v < 3 && now_s() - t0 < 60; v++) {
        while (steps_done(multi) < at_step[v] && now_s() - t0 < 60) usleep(20000);
        pid_t pid = 0;   /* (0 while it is being restarted) */
        while ((pid = run_json_pid(multi, victims[v])) <= 0 && steps_done(multi) < KILL_STEPS && now_s() - t0 < 60)
            usleep(20000);
        if (steps_done(multi) >= KILL_STEPS) break;
        if (pid > 0 && kill(pid, SIGKILL) == 0) kills++;
        fprintf(stderr, "kill -9 %s (pid %d) at step %d\n", victims[v], (int)pid, steps_done(multi));
    }
    run_wait(&p2, &a2, multi, 0);
    assert_int_equal(kills, 3);
    assert_ledger(multi, KILL_STEPS);
    assert_same_ckpt(one, multi, KILL_STEPS, 2);
    assert_true(max_metric(multi, "optimizer", "xfer_bytes_in") > 0);
    assert_true(max_metric(multi, "optimizer", "ckpt_step") >= 4);
}

static void test_fake_nodes_refusals(void **state) {
    (void)state;
    char out[400], listen[64];
    snprintf(out, sizeof out, "%s/intrude", fx.root);
    static pf_run_args_t a;
    proc_t p;
    int port = pf_free_port_span();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    setenv("DL_TEST_HOOKS", "fake_nodes=1", 1);
    run_start(&p, &a, out, listen, "intrude", "100000", "1000");
    unsetenv("DL_TEST_HOOKS");
    double t0 = now_s();
    while (steps_done(out) < 1 && now_s() - t0 < 120) usleep(20000);
    assert_true(steps_done(out) >= 1);
    /* drafter1 (port +101): its inbox slab ids; the optimizer (+2): drafter1's gradient slab */
    intruder(out, port, "drafter1", 101, 1, 101, slot_slab_id(1, SLOT_SLAB_HOST));
    intruder(out, port, "optimizer", 2, 0, 101, SLOT_SLAB_GRAD);
    int at = steps_done(out);
    double t1 = now_s();   /* its own budget: under load the first step alone can take long */
    while (steps_done(out) < at + 2 && now_s() - t1 < 90) usleep(20000);   /* still training */
    assert_true(steps_done(out) >= at + 2);
    /* a rebalance naming a node outside the run's table is refused, saying why
     * (docs/MULTINODE.md section 6; moves between nodes: test_node_rebalance) */
    static pf_run_args_t r;
    memset(&r, 0, sizeof r);
    const char *rv[] = {fx.exe, "rebalance", "--run", out, "--targets", "1", "--drafters", "zz:1", NULL};
    for (int i = 0; rv[i]; i++) r.argv[i] = (char *)rv[i];
    snprintf(r.log, sizeof r.log, "%s/rebalance.out", fx.root);
    assert_int_equal(pf_run_draftline(&r, NULL, 60, NULL), 1);
    char *rt = pf_slurp(r.log, NULL);
    assert_non_null(rt);
    if (!strstr(rt, "node zz is not in this run's node table (head)")) printf("%s\n", rt);
    assert_non_null(strstr(rt, "node zz is not in this run's node table (head)"));
    free(rt);
    assert_int_equal(kill(p.pid, SIGTERM), 0);
    run_wait(&p, &a, out, 128 + SIGTERM);
    assert_true(log_has(out, "drafter1", "slab_data from intruder"));
    assert_true(log_has(out, "drafter1", "has not said hello"));
    assert_true(log_has(out, "drafter1", "hello from intruder refused: not a member"));   /* membership */
    assert_true(log_has(out, "optimizer", "slab_data from intruder"));
    assert_true(log_has(out, "optimizer", "is not known here"));
}

/* `draftline run` with a bad --listen is refused before anything is created: exit 2 with
 * the reason (an unresolvable host, a busy port of the run's span, --nodes alone). */
static void test_listen_refusals(void **state) {
    (void)state;
    char out[400];
    snprintf(out, sizeof out, "%s/refused", fx.root);
    int port = pf_free_port_span();
    assert_true(port > 0);
    char busy_listen[64];
    snprintf(busy_listen, sizeof busy_listen, "127.0.0.1:%d", port);
    int hold = socket(AF_INET, SOCK_STREAM, 0);   /* a port inside the span, held */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(port + 101)),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(hold, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(hold, 1), 0);
    char busy_port[32];
    snprintf(busy_port, sizeof busy_port, "port %d", port + 101);
    struct { const char *flag, *value, *expect; } cases[] = {
        {"--listen", "no-such-host.invalid:29500", "cannot resolve 'no-such-host.invalid'"},
        {"--listen", busy_listen, busy_port},
        {"--nodes", "2", "--nodes needs --listen"},
        {"--listen", "0.0.0.0:29500", "name an address the nodes reach"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        static pf_run_args_t r;
        memset(&r, 0, sizeof r);
        const char *v[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                           cases[i].flag, cases[i].value, "--out", out, NULL};
        for (int k = 0; v[k]; k++) r.argv[k] = (char *)v[k];
        snprintf(r.log, sizeof r.log, "%s/refused%zu.out", fx.root, i);
        int rc = pf_run_draftline(&r, NULL, 60, NULL);
        char *t = pf_slurp(r.log, NULL);
        if (rc != 2 || !t || !strstr(t, cases[i].expect)) printf("case %zu: exit %d\n%s\n", i, rc, t ? t : "");
        assert_int_equal(rc, 2);
        assert_non_null(t);
        assert_non_null(strstr(t, cases[i].expect));
        free(t);
        struct stat st;
        assert_int_not_equal(stat(out, &st), 0);   /* nothing created */
    }
    close(hold);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_listen_refusals),
        cmocka_unit_test(test_fake_nodes_bitwise),
        cmocka_unit_test(test_fake_nodes_kill),
        cmocka_unit_test(test_fake_nodes_refusals),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
