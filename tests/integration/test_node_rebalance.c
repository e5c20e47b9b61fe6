/* `draftline rebalance` of a multi-node run (docs/MULTINODE.md sections 6-7; issue 13 item
 * 6): roles move between nodes. Agents a and b on this machine, each with its own run dir,
 * join a head on 127.0.0.1 (as test_node_run).
 *
 * test_rebalance_moves: a --deterministic run with the targets on a and the drafters (and
 *   the optimizer, with drafter0) on b; after step 5, `rebalance --targets a:1,b:1
 *   --drafters b:1,a:1` moves target1 to b and drafter1 to a (each stopped on its old
 *   agent and started on the new one; every stage told the new nodes by CONTROL
 *   PLACEMENT first). The run finishes with every step applied once and its final
 *   checkpoint bitwise the undisturbed one-host run's; the refusals that need only CPU
 *   (a node name outside the run's table, drafter0 leaving the optimizer's node, a
 *   malformed placement) are checked on the live run by their messages.
 * test_rebalance_refusals: a GPU-mode placement run on CPU stages (test hooks strip_gpu
 *   and nccl_cross, so target1 may sit on b while its drafter is on a): a drafter away
 *   from the optimizer's node is refused (the GPU pairs rule), and after agent b is
 *   killed, a placement on b is refused because node b is not up.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlnb", 60) < 0) return -1;
    proc_watchdog(600);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

#define STEPS "24"
#define NSTEPS 24

static const char *const RUN_FLAGS[] = {"--device", "cpu", "--threads", "1", "--token-budget", "256",
    "--block-size", "4", "--num-anchors", "8", "--drafter-layers", "1", "--lr", "3e-3",
    "--micro-batches-per-step", "2", "--seed", "5", "--save-every", "4", "--deterministic",
    "--progress-every", "1", NULL};

/* argv = draftline run --target-model M --data D <RUN_FLAGS> <extra...> */
static void run_argv(pf_run_args_t *a, const char *const *extra) {
    const char *v[80];
    int n = 0;
    v[n++] = fx.exe; v[n++] = "run"; v[n++] = "--target-model"; v[n++] = fx.model_dir;
    v[n++] = "--data"; v[n++] = fx.cache;
    for (int i = 0; RUN_FLAGS[i]; i++) v[n++] = RUN_FLAGS[i];
    for (int i = 0; extra[i]; i++) v[n++] = extra[i];
    v[n] = NULL;
    pf_set_argv(a, v);
}

typedef struct {
    pf_run_args_t args;
    proc_t p;
    char dir[400];
} agent_t;

/* `draftline node --name name` joining listen with key; run dir <root>/<tag>-<name>. */
static void agent_start(agent_t *g, const char *name, const char *listen, const char *key, const char *tag) {
    snprintf(g->dir, sizeof g->dir, "%s/%s-%s", fx.root, tag, name);
    const char *v[] = {fx.exe, "node", "--join", listen, "--key", key, "--name", name, "--run-dir", g->dir, NULL};
    memset(&g->args, 0, sizeof g->args);
    pf_set_argv(&g->args, v);
    snprintf(g->args.log, sizeof g->args.log, "%s/%s-%s.out", fx.root, tag, name);
    assert_int_equal(proc_spawn(&g->p, "draftline node", pf_run_child, &g->args), 0);
}

/* A head `draftline run <extra> --listen 127.0.0.1:<free> --nodes 2 --out <root>/<tag>`
 * and agents a and b; returns once the head waits for them (they are started). */
static void head_start(const char *tag, const char *const *place, proc_t *hp, pf_run_args_t *h, char *out,
                       char *hlog, agent_t *A, agent_t *B) {
    char listen[64], key[500];
    sprintf(out, "%s/%s", fx.root, tag);
    int port = pf_free_port_span();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(key, sizeof key, "%s/node.key", out);
    const char *extra[24];
    int n = 0;
    for (int i = 0; place[i]; i++) extra[n++] = place[i];
    const char *tail[] = {"--listen", listen, "--nodes", "2", "--join-timeout", "120", "--out", out, NULL};
    for (int i = 0; tail[i]; i++) extra[n++] = tail[i];
    extra[n] = NULL;
    memset(h, 0, sizeof *h);
    run_argv(h, extra);
    sprintf(hlog, "%s/%s-head.out", fx.root, tag);
    snprintf(h->log, sizeof h->log, "%s", hlog);
    assert_int_equal(proc_spawn(hp, "draftline run", pf_run_child, h), 0);
    int waiting = pf_wait_for_text(hlog, "waiting for", 60);
    if (!waiting) pf_show(hlog);
    assert_true(waiting);
    agent_start(A, "a", listen, key, tag);
    agent_start(B, "b", listen, key, tag);
}

/* `draftline rebalance --run out <args>` exits rc and its output holds needle. */
static void rebalance(const char *out, int rc, const char *needle, const char *const *args) {
    static pf_run_args_t r;
    static int k;
    memset(&r, 0, sizeof r);
    const char *v[24] = {fx.exe, "rebalance", "--run", out};
    int n = 4;
    for (int i = 0; args[i]; i++) v[n++] = args[i];
    v[n] = NULL;
    pf_set_argv(&r, v);
    snprintf(r.log, sizeof r.log, "%s/rebalance%d.out", fx.root, k++);
    int got = pf_run_draftline(&r, NULL, 150, NULL);
    char *t = pf_slurp(r.log, NULL);
    if (got != rc || !t || !strstr(t, needle)) printf("rebalance: exit %d (want %d), want '%s':\n%s\n", got, rc, needle,
                                                      t ? t : "");
    assert_int_equal(got, rc);
    assert_non_null(t);
    assert_non_null(strstr(t, needle));
    free(t);
}

static int count_lines(const char *path) {
    char *t = pf_slurp(path, NULL);
    int n = 0;
    for (char *c = t; c && *c; c++) n += *c == '\n';
    free(t);
    return n;
}

static int wait_steps(const char *steps, int n, int timeout_s) {
    for (int i = 0; i < timeout_s * 20; i++) {
        if (count_lines(steps) >= n) return 1;
        usleep(50000);
    }
    return 0;
}

static void assert_each_step_once(const char *steps) {
    char *t = pf_slurp(steps, NULL);
    assert_non_null(t);
    int seen[NSTEPS] = {0};
    for (char *c = t; (c = strstr(c, "\"step\":")); c += 7) {
        int s = atoi(c + 7);
        assert_true(s >= 0 && s < NSTEPS);
        seen[s]++;
    }
    for (int s = 0; s < NSTEPS; s++) {
        if (seen[s] != 1) printf("step %d applied %d times in %s\n", s, seen[s], steps);
        assert_int_equal(seen[s], 1);
    }
    free(t);
}

static void test_rebalance_moves(void **state) {
    (void)state;
    /* the undisturbed one-host run */
    char one[400];
    snprintf(one, sizeof one, "%s/one", fx.root);
    static pf_run_args_t o;
    memset(&o, 0, sizeof o);
    const char *oe[] = {"--targets", "2", "--drafters", "2", "--max-steps", STEPS, "--out", one, NULL};
    run_argv(&o, oe);
    snprintf(o.log, sizeof o.log, "%s/one.out", fx.root);
    int rc = pf_run_draftline(&o, one, 200, NULL);
    if (rc != 0) pf_show(o.log);
    assert_int_equal(rc, 0);
    /* the same run across a and b, rebalanced mid-run */
    static pf_run_args_t h;
    static agent_t A, B;
    proc_t hp;
    char out[400], hlog[400], steps[500];
    const char *place[] = {"--targets", "a:2", "--drafters", "b:2", "--max-steps", STEPS, NULL};
    /* slowed targets (the same bits): on a fast machine the 24 steps ended before the
     * rebalance was asked, after the three refusals ("rejected: the run is stopping"), or
     * during the move at 250 ms; at 1 s the move takes ~20 s and the run outlasts it */
    setenv("DL_TEST_HOOKS", "target.forward_delay_ms=1000", 1);
    head_start("mv", place, &hp, &h, out, hlog, &A, &B);
    unsetenv("DL_TEST_HOOKS");
    snprintf(steps, sizeof steps, "%s/steps.jsonl", B.dir);   /* the optimizer is on b */
    int at = wait_steps(steps, 5, 150);
    if (!at) { pf_show(hlog); pf_show(A.args.log); pf_show(B.args.log); }
    assert_true(at);
    const char *unknown[] = {"--targets", "a:2", "--drafters", "b:1,zz:1", "--wait", "30", NULL};
    rebalance(out, 1, "node zz is not in this run's node table (head, a, b)", unknown);
    const char *opt[] = {"--targets", "a:2", "--drafters", "a:2", "--wait", "30", NULL};
    rebalance(out, 1, "drafter0 would move from node b to node a", opt);
    const char *bad[] = {"--targets", "a:0", "--drafters", "b:2", NULL};
    rebalance(out, 2, "--targets a:0: expected NAME:N entries", bad);
    const char *mv[] = {"--targets", "a:1,b:1", "--drafters", "b:1,a:1", "--wait", "120", NULL};
    rebalance(out, 0, "2 kept, 0 started, 2 moved, 0 retired", mv);
    char id[17];
    rc = pf_run_finish(&hp, hlog, out, 300, id);
    if (rc != 0 || getenv("DL_TEST_VERBOSE")) { pf_show(hlog); pf_show(A.args.log); pf_show(B.args.log); }
    assert_int_equal(rc, 0);
    int arc = -1;
    assert_int_equal(proc_wait(&A.p, 20000, &arc), 0);
    proc_kill(&A.p);
    assert_int_equal(proc_wait(&B.p, 20000, &arc), 0);
    proc_kill(&B.p);
    /* each moved: stopped on its old agent, started on the new one */
    assert_true(pf_wait_for_text(hlog, "target1: moving from node a to node b", 1));
    assert_true(pf_wait_for_text(hlog, "drafter1: moving from node b to node a", 1));
    assert_true(pf_wait_for_text(B.args.log, "started target1", 1));
    assert_true(pf_wait_for_text(A.args.log, "started drafter1", 1));
    assert_true(pf_wait_for_text(hlog, "summary: 24 steps", 1));
    assert_each_step_once(steps);
    const char *files[] = {"state.bin", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/checkpoints/step_%d/%s", one, NSTEPS, files[i]);
        snprintf(b, sizeof b, "%s/checkpoints/step_%d/%s", B.dir, NSTEPS, files[i]);
        int same = pf_same_file(a, b);
        if (!same) printf("%s differs from the one-host %s\n", b, a);
        assert_true(same);
    }
}

static void test_rebalance_refusals(void **state) {
    (void)state;
#ifndef DL_CUDA
    skip();   /* `draftline run --target-gpus` needs a CUDA build */
#else
    static pf_run_args_t h;
    static agent_t A, B;
    proc_t hp;
    char out[400], hlog[400];
    /* a run that lasts until the test stops it (60 samples are one epoch of a few seconds
     * on a fast machine: it must still be live for the last refusal) */
    const char *place[] = {"--target-gpus", "a:0,b:0", "--drafter-gpus", "a:1", "--max-steps", "100000",
                           "--epochs", "10000", NULL};
    setenv("DL_TEST_HOOKS", "strip_gpu=1,nccl_cross=1,target.forward_delay_ms=50", 1);
    head_start("rf", place, &hp, &h, out, hlog, &A, &B);
    unsetenv("DL_TEST_HOOKS");
    int up = pf_wait_for_text(hlog, "every node joined", 60);
    if (!up) pf_show(hlog);
    assert_true(up);
    const char *pairs[] = {"--target-gpus", "a:0,b:0", "--drafter-gpus", "a:1,b:1", "--wait", "30", NULL};
    rebalance(out, 1, "drafter1 on node b and the optimizer (with drafter0) on node a", pairs);
    const char *cpu[] = {"--targets", "a:2", "--drafters", "a:1", "--wait", "30", NULL};
    rebalance(out, 1, "this run is in GPU mode", cpu);
    proc_signal(&B.p, SIGKILL);   /* agent b (target1 with it) */
    proc_kill(&B.p);
    int lost = pf_wait_for_text(hlog, "node b lost", 20);
    if (!lost) pf_show(hlog);
    assert_true(lost);
    const char *down[] = {"--target-gpus", "a:0,b:0,b:1", "--drafter-gpus", "a:1", "--wait", "30", NULL};
    rebalance(out, 1, "node b is not up", down);
    assert_int_equal(kill(hp.pid, SIGTERM), 0);
    pf_run_finish(&hp, hlog, NULL, 120, NULL);
    int arc = -1;
    proc_wait(&A.p, 30000, &arc);
    proc_kill(&A.p);
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rebalance_moves),
        cmocka_unit_test(test_rebalance_refusals),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
