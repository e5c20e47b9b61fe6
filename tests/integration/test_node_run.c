/* A deterministic run across two node agents on this machine, against the same run on one
 * host (docs/MULTINODE.md; issue 13's CPU "done when").
 *
 * Agents a and b each have their own run dir and join a head on 127.0.0.1: the targets run
 * on a, the drafters (and the optimizer, with drafter0) on b, so every micro-batch's hidden
 * states, every gradient and every new weights version cross nodes over tcp:// (CURVE) as
 * slab_data; nothing is mapped across nodes (the xfer metrics show the bytes moved).
 *
 * test_agents_bitwise: the final checkpoint (in b's run dir) is bitwise the one-host run's,
 *   and b's steps.jsonl holds every step once.
 * test_agents_resume (after test_agents_bitwise): `run --resume` of that multi-node run dir,
 *   whose checkpoints are on node b (the optimizer's), to step 28 with the agents back: the
 *   head finds the checkpoint through run.json (never a fresh start) and the result is
 *   bitwise the one-host run resumed to 28.
 * test_agents_faults: the same run with kill -9 of agent b's process group (both drafters
 *   and the optimizer with it) after step 6 and b started again (its optimizer resumes
 *   from the checkpoint it reported), then kill -9 of target1 on a: it finishes, every step
 *   applied once, final checkpoint bitwise the one-host run's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlnr", 60) < 0) return -1;
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
    "--micro-batches-per-step", "2", "--seed", "5", "--max-steps", STEPS, "--save-every", "4",
    "--deterministic", "--progress-every", "1", NULL};

static char g_one[400];     /* the one-host run's dir (made once) */

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

static void one_host_run(void) {
    if (g_one[0]) return;
    snprintf(g_one, sizeof g_one, "%s/one", fx.root);
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    const char *extra[] = {"--targets", "2", "--drafters", "2", "--out", g_one, NULL};
    run_argv(&a, extra);
    snprintf(a.log, sizeof a.log, "%s/one.out", fx.root);
    int rc = pf_run_draftline(&a, g_one, 200, NULL);
    if (rc != 0) pf_show(a.log);
    assert_int_equal(rc, 0);
}

typedef struct {
    pf_run_args_t args;
    proc_t p;
    char dir[400];
} agent_t;

/* Starts `draftline node --name name` joining listen with key; its run dir is dir, or
 * <root>/<log>-<name> when dir is NULL; its output <root>/<log>-<name>.out. */
static void agent_start(agent_t *g, const char *name, const char *listen, const char *key, const char *log,
                        const char *dir) {
    if (dir) snprintf(g->dir, sizeof g->dir, "%s", dir);
    else snprintf(g->dir, sizeof g->dir, "%s/%s-%s", fx.root, log, name);
    const char *v[] = {fx.exe, "node", "--join", listen, "--key", key, "--name", name, "--run-dir", g->dir, NULL};
    memset(&g->args, 0, sizeof g->args);
    pf_set_argv(&g->args, v);
    snprintf(g->args.log, sizeof g->args.log, "%s/%s-%s.out", fx.root, log, name);
    assert_int_equal(proc_spawn(&g->p, "draftline node", pf_run_child, &g->args), 0);
}

/* Lines of path (0 when it cannot be read). */
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

/* The pid of the last "started <stage> (pid N" line of an agent's output, or -1. */
static pid_t started_pid(const char *log, const char *stage) {
    char *t = pf_slurp(log, NULL), needle[64];
    snprintf(needle, sizeof needle, "started %s (pid ", stage);
    pid_t pid = -1;
    for (char *c = t; c && (c = strstr(c, needle)); c += strlen(needle)) pid = (pid_t)atoi(c + strlen(needle));
    free(t);
    return pid;
}

/* Every step 0..NSTEPS-1 exactly once in steps.jsonl. */
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

static void assert_same_ckpt(const char *run_dir) {
    const char *files[] = {"state.bin", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/checkpoints/step_%d/%s", g_one, NSTEPS, files[i]);
        snprintf(b, sizeof b, "%s/checkpoints/step_%d/%s", run_dir, NSTEPS, files[i]);
        int same = pf_same_file(a, b);
        if (!same) printf("%s differs from the one-host %s\n", b, a);
        assert_true(same);
    }
}

/* Head + agents a (targets) and b (drafters, optimizer); faults: the kills above. */
static void agents_run(const char *tag, int faults) {
    one_host_run();
    static pf_run_args_t h;
    char out[400], listen[64], key[500], hlog[400];
    snprintf(out, sizeof out, "%s/%s", fx.root, tag);
    int port = pf_free_port_span();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(key, sizeof key, "%s/node.key", out);
    memset(&h, 0, sizeof h);
    const char *extra[] = {"--targets", "a:2", "--drafters", "b:2", "--listen", listen, "--nodes", "2",
                           "--join-timeout", "120", "--out", out, NULL};
    run_argv(&h, extra);
    snprintf(hlog, sizeof hlog, "%s/%s-head.out", fx.root, tag);
    snprintf(h.log, sizeof h.log, "%s", hlog);
    proc_t hp;
    assert_int_equal(proc_spawn(&hp, "draftline run", pf_run_child, &h), 0);
    int waiting = pf_wait_for_text(hlog, "waiting for", 60);
    if (!waiting) pf_show(hlog);
    assert_true(waiting);
    static agent_t A, B, B2;
    agent_start(&A, "a", listen, key, tag, NULL);
    agent_start(&B, "b", listen, key, tag, NULL);
    char steps[500];
    snprintf(steps, sizeof steps, "%s/steps.jsonl", B.dir);    /* the optimizer is on b */
    agent_t *b_now = &B;
    if (faults) {
        int at6 = wait_steps(steps, 6, 120);
        if (!at6) { pf_show(hlog); pf_show(B.args.log); }
        assert_true(at6);
        proc_signal(&B.p, SIGKILL);          /* agent b and its stages: drafters, optimizer */
        proc_kill(&B.p);
        int lost = pf_wait_for_text(hlog, "node b lost", 20);
        if (!lost) pf_show(hlog);
        assert_true(lost);
        char tag2[64];
        snprintf(tag2, sizeof tag2, "%s2", tag);
        agent_start(&B2, "b", listen, key, tag2, B.dir);   /* same run dir: its checkpoints are there */
        b_now = &B2;
        int back = pf_wait_for_text(hlog, "node b rejoined", 30);
        if (!back) { pf_show(hlog); pf_show(B2.args.log); }
        assert_true(back);
        int at14 = wait_steps(steps, 14, 120);
        if (!at14) { pf_show(hlog); pf_show(B2.args.log); }
        assert_true(at14);
        pid_t t1 = started_pid(A.args.log, "target1");
        assert_true(t1 > 0);
        assert_int_equal(kill(t1, SIGKILL), 0);
    }
    char id[17];
    int rc = pf_run_finish(&hp, hlog, out, 300, id);
    if (rc != 0 || getenv("DL_TEST_VERBOSE")) { pf_show(hlog); pf_show(A.args.log); pf_show(b_now->args.log); }
    assert_int_equal(rc, 0);
    int arc = -1;
    assert_int_equal(proc_wait(&A.p, 20000, &arc), 0);
    proc_kill(&A.p);
    assert_int_equal(arc, 0);
    assert_int_equal(proc_wait(&b_now->p, 20000, &arc), 0);
    proc_kill(&b_now->p);
    assert_int_equal(arc, 0);
    assert_each_step_once(steps);
    assert_same_ckpt(B.dir);
    /* the bytes crossed nodes: the targets sent, the drafters received */
    char met[500];
    snprintf(met, sizeof met, "%s/metrics.jsonl", out);
    char *m = pf_slurp(met, NULL);
    assert_non_null(m);
    assert_non_null(strstr(m, "\"xfer_bytes_out\""));
    free(m);
    if (faults) {
        char *t = pf_slurp(hlog, NULL);
        assert_non_null(t);
        assert_non_null(strstr(t, "summary: 24 steps"));
        free(t);
    }
}

static void test_agents_bitwise(void **state) {
    (void)state;
    agents_run("clean", 0);
}

static void test_agents_resume(void **state) {
    (void)state;
    one_host_run();
    char clean[400], listen[64], key[500], hlog[400], adir[400], bdir[400];
    snprintf(clean, sizeof clean, "%s/clean", fx.root);
    snprintf(key, sizeof key, "%s/node.key", clean);
    snprintf(adir, sizeof adir, "%s/clean-a", fx.root);
    snprintf(bdir, sizeof bdir, "%s/clean-b", fx.root);
    /* the one-host run, resumed to step 28 */
    static pf_run_args_t o;
    memset(&o, 0, sizeof o);
    const char *ov[] = {fx.exe, "run", "--resume", g_one, "--max-steps", "28", NULL};
    pf_set_argv(&o, ov);
    snprintf(o.log, sizeof o.log, "%s/one28.out", fx.root);
    int rc = pf_run_draftline(&o, g_one, 200, NULL);
    if (rc != 0) pf_show(o.log);
    assert_int_equal(rc, 0);
    /* the multi-node run dir, resumed with its agents back (same names, same run dirs) */
    int port = pf_free_port_span();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    static pf_run_args_t h;
    memset(&h, 0, sizeof h);
    const char *hv[] = {fx.exe, "run", "--resume", clean, "--max-steps", "28", "--targets", "a:2", "--drafters", "b:2",
                        "--listen", listen, "--nodes", "2", "--join-timeout", "120", NULL};
    pf_set_argv(&h, hv);
    snprintf(hlog, sizeof hlog, "%s/resume-head.out", fx.root);
    snprintf(h.log, sizeof h.log, "%s", hlog);
    proc_t hp;
    assert_int_equal(proc_spawn(&hp, "draftline run", pf_run_child, &h), 0);
    int waiting = pf_wait_for_text(hlog, "waiting for", 60);
    if (!waiting) pf_show(hlog);
    assert_true(waiting);
    static agent_t A, B;
    agent_start(&A, "a", listen, key, "resume", adir);
    agent_start(&B, "b", listen, key, "resume", bdir);
    rc = pf_run_finish(&hp, hlog, clean, 300, NULL);
    if (rc != 0 || getenv("DL_TEST_VERBOSE")) { pf_show(hlog); pf_show(A.args.log); pf_show(B.args.log); }
    assert_int_equal(rc, 0);
    assert_true(pf_wait_for_text(hlog, "its optimizer ran on node b: resuming from", 1));
    assert_true(pf_wait_for_text(hlog, "summary: 28 steps", 1));
    assert_true(pf_wait_for_text(hlog, "/checkpoints/step_28 (on node b)", 1));
    int arc = -1;
    assert_int_equal(proc_wait(&A.p, 20000, &arc), 0);
    proc_kill(&A.p);
    assert_int_equal(proc_wait(&B.p, 20000, &arc), 0);
    proc_kill(&B.p);
    const char *files[] = {"state.bin", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/checkpoints/step_28/%s", g_one, files[i]);
        snprintf(b, sizeof b, "%s/checkpoints/step_28/%s", bdir, files[i]);
        int same = pf_same_file(a, b);
        if (!same) printf("%s differs from the one-host %s\n", b, a);
        assert_true(same);
    }
}

/* A multi-node run stopped by SIGTERM to its head mid-run: the optimizer on node b is
 * asked to stop with CONTROL STOP (a signal would close its connection before it could
 * report its final checkpoint), writes it, and the head's summary names that checkpoint
 * on node b. Before, the head said "the final checkpoint (step_N) was not written" and
 * "checkpoint: (none)" though it was. */
static void test_agents_stop(void **state) {
    (void)state;
    static pf_run_args_t h;
    char out[400], listen[64], key[500], hlog[400], steps[500], adir[400], bdir[400];
    snprintf(out, sizeof out, "%s/stop", fx.root);
    snprintf(adir, sizeof adir, "%s/stop-a", fx.root);
    snprintf(bdir, sizeof bdir, "%s/stop-b", fx.root);
    int port = pf_free_port_span();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(key, sizeof key, "%s/node.key", out);
    memset(&h, 0, sizeof h);
    const char *extra[] = {"--targets", "a:1", "--drafters", "b:1", "--listen", listen, "--nodes", "2",
                           "--join-timeout", "120", "--epochs", "100", "--out", out, NULL};
    run_argv(&h, extra);
    snprintf(hlog, sizeof hlog, "%s/stop-head.out", fx.root);
    snprintf(h.log, sizeof h.log, "%s", hlog);
    proc_t hp;
    setenv("DL_TEST_HOOKS", "target.forward_delay_ms=100", 1);   /* lasts past the stop */
    assert_int_equal(proc_spawn(&hp, "draftline run", pf_run_child, &h), 0);
    int waiting = pf_wait_for_text(hlog, "waiting for", 60);
    if (!waiting) pf_show(hlog);
    assert_true(waiting);
    static agent_t A, B;
    agent_start(&A, "a", listen, key, "stop", adir);
    agent_start(&B, "b", listen, key, "stop", bdir);
    unsetenv("DL_TEST_HOOKS");
    snprintf(steps, sizeof steps, "%s/steps.jsonl", bdir);
    assert_true(wait_steps(steps, 3, 120));
    assert_int_equal(kill(hp.pid, SIGTERM), 0);
    int rc = pf_run_finish(&hp, hlog, out, 120, NULL);
    if (rc != 143 || getenv("DL_TEST_VERBOSE")) { pf_show(hlog); pf_show(B.args.log); }
    assert_int_equal(rc, 143);
    int named = pf_wait_for_text(hlog, "(on node b)", 1), claimed = pf_wait_for_text(hlog, "was not written", 1);
    if (!named || claimed) pf_show(hlog);
    assert_true(named);
    assert_false(claimed);
    int arc = -1;
    proc_wait(&A.p, 20000, &arc);
    proc_kill(&A.p);
    proc_wait(&B.p, 20000, &arc);
    proc_kill(&B.p);
}

static void test_agents_faults(void **state) {
    (void)state;
    agents_run("faults", 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agents_bitwise),
        cmocka_unit_test(test_agents_resume),
        cmocka_unit_test(test_agents_faults),
        cmocka_unit_test(test_agents_stop),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
