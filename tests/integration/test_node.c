/* Node agents (`draftline node`) and the head's side of them (docs/MULTINODE.md 1, 3, 5),
 * on one machine: the head listens on 127.0.0.1, the agents join it there.
 *
 * test_node_bad_key: a missing key file, and one with group/other permission bits, are
 *   refused (exit 2) with a message naming the file.
 * test_node_join_run: a head (`draftline run --listen 127.0.0.1:P --nodes 1`, the tiny
 *   fixture target, CPU) whose target runs on node n1, and one agent n1 joining it: the
 *   agent's "joined <run id> as node n1 (index 1)", the head's "node n1 joined", run.json's
 *   node table and each stage's node, the target's log in the agent's run dir; the run
 *   finishes its steps; the head tells the agent the run is over and it exits 0.
 * test_node_lost_rejoin: the agent killed mid-run (its target with it): "node n1 lost", the
 *   head waits; a new agent n1 rejoins as node 1, the target starts there again, the run ends.
 * test_node_agent_faults: one head, the agent faults of a fresh-user review: names outside
 *   the placement or "head" refused; another run's key ("no answer" after 10 s); a second
 *   agent under a live node's name refused; a stalled agent (SIGSTOP 5 s) told to rejoin,
 *   a rejoin from another run dir refused; the run ends with every step.
 * test_node_join_timeout: --join-timeout 2 with the placement naming node n9 and no agent:
 *   exit 1 naming n9, no stage started.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlnd", 40) < 0) return -1;
    proc_watchdog(400);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

static void test_node_bad_key(void **state) {
    (void)state;
    static pf_run_args_t a;
    char missing[400], loose[400];
    snprintf(missing, sizeof missing, "%s/no-such.key", fx.root);
    snprintf(loose, sizeof loose, "%s/loose.key", fx.root);
    const char *argv1[] = {fx.exe, "node", "--join", "127.0.0.1:9", "--key", missing, NULL};
    memset(&a, 0, sizeof a);
    pf_set_argv(&a, argv1);
    snprintf(a.log, sizeof a.log, "%s/badkey1.out", fx.root);
    assert_int_equal(pf_run_draftline(&a, NULL, 30, NULL), 2);
    char *t = pf_slurp(a.log, NULL);
    assert_non_null(t);
    assert_non_null(strstr(t, missing));
    free(t);
    /* a key file others can read is refused too */
    int fd = open(loose, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_true(write(fd, "# not a key\n", 12) == 12);
    close(fd);
    chmod(loose, 0644);
    const char *argv2[] = {fx.exe, "node", "--join", "127.0.0.1:9", "--key", loose, NULL};
    memset(&a, 0, sizeof a);
    pf_set_argv(&a, argv2);
    snprintf(a.log, sizeof a.log, "%s/badkey2.out", fx.root);
    assert_int_equal(pf_run_draftline(&a, NULL, 30, NULL), 2);
    t = pf_slurp(a.log, NULL);
    assert_non_null(t);
    assert_non_null(strstr(t, loose));
    free(t);
}

static void test_node_join_run(void **state) {
    (void)state;
    static pf_run_args_t h, g;
    char out[400], listen[64], join[64], key[500], agent_dir[400];
    snprintf(out, sizeof out, "%s/head", fx.root);
    snprintf(agent_dir, sizeof agent_dir, "%s/agent-n1", fx.root);
    int port = pf_free_port_span();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(join, sizeof join, "127.0.0.1:%d", port);
    snprintf(key, sizeof key, "%s/node.key", out);
    const char *hargv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                           "--targets", "n1:1", "--drafters", "1", "--threads", "1", "--token-budget", "256",
                           "--block-size", "4", "--num-anchors", "8", "--max-steps", "2", "--progress-every", "1",
                           "--listen", listen, "--nodes", "1", "--join-timeout", "120", "--out", out, NULL};
    memset(&h, 0, sizeof h);
    pf_set_argv(&h, hargv);
    snprintf(h.log, sizeof h.log, "%s/head.out", fx.root);
    proc_t hp, ap;
    assert_int_equal(proc_spawn(&hp, "draftline run", pf_run_child, &h), 0);
    /* the head makes the key file before it waits for the nodes */
    int have_key = pf_wait_for_text(h.log, "waiting for", 60);
    if (!have_key) pf_show(h.log);
    assert_true(have_key);
    const char *aargv[] = {fx.exe, "node", "--join", join, "--key", key, "--name", "n1", "--run-dir", agent_dir, NULL};
    memset(&g, 0, sizeof g);
    pf_set_argv(&g, aargv);
    snprintf(g.log, sizeof g.log, "%s/agent.out", fx.root);
    assert_int_equal(proc_spawn(&ap, "draftline node", pf_run_child, &g), 0);
    int joined = pf_wait_for_text(g.log, "as node n1 (index 1)", 30) && pf_wait_for_text(h.log, "node n1 joined as node 1", 10);
    if (!joined) { pf_show(g.log); pf_show(h.log); }
    assert_true(joined);
    char id[17];
    int rc = pf_run_finish(&hp, h.log, out, 240, id);
    if (rc != 0) { pf_show(h.log); pf_show(g.log); }
    assert_int_equal(rc, 0);
    /* the head tells the agent the run is over: it exits 0 by itself */
    int arc = -1;
    assert_int_equal(proc_wait(&ap, 20000, &arc), 0);
    proc_kill(&ap);
    if (arc != 0) pf_show(g.log);
    assert_int_equal(arc, 0);
    assert_true(pf_wait_for_text(g.log, "is over (run over): this node stops", 1));
    char *agent_out = pf_slurp(g.log, NULL);
    assert_non_null(agent_out);
    char line[128];
    snprintf(line, sizeof line, "joined %s as node n1 (index 1)", id);
    assert_non_null(strstr(agent_out, line));
    free(agent_out);
    /* run.json: the node table and each stage's node */
    char rj[500];
    snprintf(rj, sizeof rj, "%s/run.json", out);
    char *j = pf_slurp(rj, NULL);
    assert_non_null(j);
    assert_non_null(strstr(j, "\"nodes\""));
    assert_non_null(strstr(j, "\"name\":\t\"n1\""));
    assert_non_null(strstr(j, "\"node\":\t\"n1\""));
    assert_non_null(strstr(j, "\"node\":\t\"head\""));
    free(j);
    /* `draftline monitor --once` shows each stage's node */
    static pf_run_args_t mo;
    memset(&mo, 0, sizeof mo);
    const char *mv[] = {fx.exe, "monitor", "--once", "--run", out, NULL};
    pf_set_argv(&mo, mv);
    snprintf(mo.log, sizeof mo.log, "%s/monitor.out", fx.root);
    assert_int_equal(pf_run_draftline(&mo, NULL, 60, NULL), 0);
    char *mt = pf_slurp(mo.log, NULL);
    assert_non_null(mt);
    if (!strstr(mt, "NODE")) printf("%s\n", mt);
    assert_non_null(strstr(mt, "NODE"));
    char *row = strstr(mt, "\ntarget0 ");
    assert_non_null(row);
    assert_non_null(strstr(row, " n1 "));
    free(mt);
    /* the target ran under the agent: its log is in the agent's run dir */
    char tl[500];
    snprintf(tl, sizeof tl, "%s/logs/target0.log", agent_dir);
    struct stat st;
    assert_int_equal(stat(tl, &st), 0);
    assert_true(st.st_size > 0);
}

/* The agent (and its target) killed mid-run: the head says the node is lost and waits; a
 * new agent under the same name rejoins (same index), the target starts there again and
 * the run finishes its steps. */
static void test_node_lost_rejoin(void **state) {
    (void)state;
    static pf_run_args_t h, g;
    char out[400], listen[64], key[500], agent_dir[400];
    snprintf(out, sizeof out, "%s/lost", fx.root);
    snprintf(agent_dir, sizeof agent_dir, "%s/agent-lost", fx.root);
    int port = pf_free_port_span();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(key, sizeof key, "%s/node.key", out);
    const char *hargv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                           "--targets", "n1:1", "--drafters", "1", "--threads", "1", "--token-budget", "256",
                           "--block-size", "4", "--num-anchors", "8", "--max-steps", "30", "--progress-every", "1",
                           "--listen", listen, "--nodes", "1", "--out", out, NULL};
    memset(&h, 0, sizeof h);
    pf_set_argv(&h, hargv);
    snprintf(h.log, sizeof h.log, "%s/lost-head.out", fx.root);
    proc_t hp, ap, bp;
    assert_int_equal(proc_spawn(&hp, "draftline run", pf_run_child, &h), 0);
    assert_true(pf_wait_for_text(h.log, "waiting for", 60));
    const char *aargv[] = {fx.exe, "node", "--join", listen, "--key", key, "--name", "n1", "--run-dir", agent_dir, NULL};
    memset(&g, 0, sizeof g);
    pf_set_argv(&g, aargv);
    snprintf(g.log, sizeof g.log, "%s/lost-agent1.out", fx.root);
    assert_int_equal(proc_spawn(&ap, "draftline node", pf_run_child, &g), 0);
    int up = pf_wait_for_text(h.log, "target0 is up", 60);
    if (!up) { pf_show(h.log); pf_show(g.log); }
    assert_true(up);
    proc_signal(&ap, SIGKILL);   /* the agent's group: the agent and its target */
    proc_kill(&ap);
    int lost = pf_wait_for_text(h.log, "node n1 lost", 20);
    if (!lost) pf_show(h.log);
    assert_true(lost);
    assert_true(pf_wait_for_text(h.log, "target0 stopped; waiting for it to rejoin", 1));
    snprintf(g.log, sizeof g.log, "%s/lost-agent2.out", fx.root);
    assert_int_equal(proc_spawn(&bp, "draftline node", pf_run_child, &g), 0);
    int back = pf_wait_for_text(h.log, "node n1 rejoined as node 1", 30);
    if (!back) { pf_show(h.log); pf_show(g.log); }
    assert_true(back);
    int rc = pf_run_finish(&hp, h.log, out, 240, NULL);
    if (rc != 0) { pf_show(h.log); pf_show(g.log); }
    assert_int_equal(rc, 0);
    assert_true(pf_wait_for_text(h.log, "summary: 30 steps", 1));
    int arc = -1;
    assert_int_equal(proc_wait(&bp, 20000, &arc), 0);
    proc_kill(&bp);
    assert_int_equal(arc, 0);
}

static void test_node_join_timeout(void **state) {
    (void)state;
    static pf_run_args_t a;
    char out[400], listen[64];
    snprintf(out, sizeof out, "%s/lonely", fx.root);
    int port = pf_free_port_span();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    const char *argv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                          "--targets", "n9:1", "--drafters", "1", "--threads", "1", "--token-budget", "256",
                          "--max-steps", "2", "--listen", listen, "--nodes", "1", "--join-timeout", "2",
                          "--out", out, NULL};
    memset(&a, 0, sizeof a);
    pf_set_argv(&a, argv);
    snprintf(a.log, sizeof a.log, "%s/lonely.out", fx.root);
    time_t t0 = time(NULL);
    int rc = pf_run_draftline(&a, NULL, 90, NULL);
    if (rc != 1) pf_show(a.log);
    assert_int_equal(rc, 1);
    assert_true(time(NULL) - t0 < 60);
    char *t = pf_slurp(a.log, NULL);
    assert_non_null(t);
    assert_non_null(strstr(t, "--join-timeout"));
    assert_non_null(strstr(t, "missing: n9"));
    assert_null(strstr(t, "started loader"));
    free(t);
}

/* A GPU placement whose pairs cross nodes is refused up front (exit 2, naming the pair and
 * NCCL), never run another way; the refusal comes before any GPU or file is touched, so it
 * runs here without a GPU. A CUDA=0 build refuses GPU mode itself. */
static void test_gpu_cross_node_refused(void **state) {
    (void)state;
    static pf_run_args_t a;
    char out[400];
    snprintf(out, sizeof out, "%s/gpux", fx.root);
    const char *argv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache,
                          "--target-gpus", "a:0,1", "--drafter-gpus", "a:0,b:1", "--listen", "127.0.0.1:29500",
                          "--out", out, NULL};
    memset(&a, 0, sizeof a);
    pf_set_argv(&a, argv);
    snprintf(a.log, sizeof a.log, "%s/gpux.out", fx.root);
    int rc = pf_run_draftline(&a, NULL, 60, NULL);
    if (rc != 2) pf_show(a.log);
    assert_int_equal(rc, 2);
    char *t = pf_slurp(a.log, NULL);
    assert_non_null(t);
    if (!strstr(t, "no CUDA")) {
        assert_non_null(strstr(t, "target1 on node a and its drafter1 on node b"));
        assert_non_null(strstr(t, "NCCL"));
    }
    struct stat sb;
    assert_int_not_equal(stat(out, &sb), 0);   /* nothing created */
    free(t);
}

/* An agent run to its end (exit status; -1 after timeout_s, then killed) with log name. */
static int agent_once(const char *log, const char *key, const char *listen, const char *name, const char *dir,
                      int timeout_s) {
    static pf_run_args_t a;
    const char *v[] = {fx.exe, "node", "--join", listen, "--key", key, "--name", name, "--run-dir", dir, NULL};
    memset(&a, 0, sizeof a);
    pf_set_argv(&a, v);
    snprintf(a.log, sizeof a.log, "%s", log);
    proc_t p;
    if (proc_spawn(&p, "draftline node", pf_run_child, &a) != 0) return -1;
    int rc = -1;
    if (proc_wait(&p, timeout_s * 1000, &rc) != 0) rc = -1;
    proc_kill(&p);
    return rc;
}

/* Whether file path holds needle now (shows it when not). */
static int has_text(const char *path, const char *needle) {
    char *t = pf_slurp(path, NULL);
    int hit = t && strstr(t, needle);
    if (!hit) printf("--- %s (no '%s') ---\n%s\n", path, needle, t ? t : "(none)");
    free(t);
    return hit;
}

/* One head (target on node n1, a long enough run) and what agents must not do to it:
 * names outside the placement and "head" refused; another run's key: "no answer" after
 * 10 s; a second agent n1 while n1 is up refused (the run goes on); n1 stalled (SIGSTOP
 * 5 s): lost, a rejoin from another run dir refused, then after SIGCONT the head tells it
 * to rejoin, it stops its stages and joins again; the run ends with every step and the
 * agent exits 0. */
static void test_node_agent_faults(void **state) {
    (void)state;
    static pf_run_args_t h, g, w;
    char out[400], listen[64], key[500], dir[400], other[400], log[500], wrong_key[500];
    snprintf(out, sizeof out, "%s/faults", fx.root);
    snprintf(dir, sizeof dir, "%s/agent-faults", fx.root);
    snprintf(other, sizeof other, "%s/agent-faults-2", fx.root);
    snprintf(wrong_key, sizeof wrong_key, "%s/lonely/node.key", fx.root);   /* test_node_join_timeout's run */
    struct stat sb;
    assert_int_equal(stat(wrong_key, &sb), 0);
    int port = pf_free_port_span();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(key, sizeof key, "%s/node.key", out);
    const char *hargv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                           "--targets", "n1:1", "--drafters", "1", "--threads", "1", "--token-budget", "256",
                           "--block-size", "4", "--num-anchors", "8", "--max-steps", "600", "--epochs", "1000",
                           "--listen", listen, "--nodes", "1", "--out", out, NULL};
    memset(&h, 0, sizeof h);
    pf_set_argv(&h, hargv);
    snprintf(h.log, sizeof h.log, "%s/faults-head.out", fx.root);
    proc_t hp, ap, wp;
    assert_int_equal(proc_spawn(&hp, "draftline run", pf_run_child, &h), 0);
    assert_true(pf_wait_for_text(h.log, "waiting for", 60));
    assert_true(has_text(h.log, "--key ") && has_text(h.log, " --name n1\n"));
    assert_true(has_text(h.log, "waiting for 1 named node(s) to join (n1)"));
    /* names: not in the placement, the head's */
    snprintf(log, sizeof log, "%s/faults-c.out", fx.root);
    assert_int_equal(agent_once(log, key, listen, "c", other, 30), 2);
    assert_true(has_text(log, "node c is not in this run's placement (n1)"));
    snprintf(log, sizeof log, "%s/faults-head-name.out", fx.root);
    assert_int_equal(agent_once(log, key, listen, "head", other, 30), 2);
    assert_true(has_text(log, "is the head's"));
    /* another run's key: no reply; the agent says so after 10 s */
    const char *wv[] = {fx.exe, "node", "--join", listen, "--key", wrong_key, "--name", "n1", "--run-dir", other, NULL};
    memset(&w, 0, sizeof w);
    pf_set_argv(&w, wv);
    snprintf(w.log, sizeof w.log, "%s/faults-wrongkey.out", fx.root);
    assert_int_equal(proc_spawn(&wp, "draftline node", pf_run_child, &w), 0);
    int said = pf_wait_for_text(w.log, "no answer from the head at ", 14);
    proc_kill(&wp);
    assert_true(said && has_text(w.log, "is --key the key file of that run?"));
    /* n1 joins, the run starts */
    const char *aargv[] = {fx.exe, "node", "--join", listen, "--key", key, "--name", "n1", "--run-dir", dir, NULL};
    memset(&g, 0, sizeof g);
    pf_set_argv(&g, aargv);
    snprintf(g.log, sizeof g.log, "%s/faults-agent.out", fx.root);
    assert_int_equal(proc_spawn(&ap, "draftline node", pf_run_child, &g), 0);
    int up = pf_wait_for_text(h.log, "target0 is up", 60);
    if (!up) { pf_show(h.log); pf_show(g.log); }
    assert_true(up);
    /* a second n1 while n1 is up: refused, n1 keeps its stages */
    snprintf(log, sizeof log, "%s/faults-dup.out", fx.root);
    assert_int_equal(agent_once(log, key, listen, "n1", other, 30), 2);
    assert_true(has_text(log, "node n1 is up (pid "));
    assert_true(has_text(log, "a second agent with that name is refused"));
    /* ... and the live n1 was not cut off by it (its own routing id: no handover) */
    sleep(4);
    if (has_text(h.log, "node n1 lost") || has_text(g.log, "lost the head")) { pf_show(h.log); pf_show(g.log); }
    assert_false(has_text(h.log, "node n1 lost"));
    assert_false(has_text(g.log, "lost the head"));
    /* n1 stalls: lost; a rejoin from another run dir is refused; then it wakes up */
    assert_int_equal(kill(ap.pid, SIGSTOP), 0);
    int lost = pf_wait_for_text(h.log, "node n1 lost", 15);
    if (lost) {
        snprintf(log, sizeof log, "%s/faults-otherdir.out", fx.root);
        int orc = agent_once(log, key, listen, "n1", other, 30);
        lost = orc == 2 && has_text(log, "rejoin with --run-dir ");
    }
    kill(ap.pid, SIGCONT);
    if (!lost) pf_show(h.log);
    assert_true(lost);
    int again = pf_wait_for_text(g.log, "the head dropped this node (silent too long)", 20) ||
                pf_wait_for_text(g.log, "lost the head", 1);
    if (!again) { pf_show(h.log); pf_show(g.log); }
    assert_true(again);
    assert_true(pf_wait_for_text(h.log, "node n1 rejoined as node 1", 40));
    int rc = pf_run_finish(&hp, h.log, out, 300, NULL);
    if (rc != 0) { pf_show(h.log); pf_show(g.log); }
    assert_int_equal(rc, 0);
    assert_true(has_text(h.log, "summary: 600 steps"));
    char *ht = pf_slurp(h.log, NULL);
    assert_non_null(ht);
    assert_null(strstr(ht, "no step applied"));
    free(ht);
    int arc = -1;
    assert_int_equal(proc_wait(&ap, 30000, &arc), 0);
    proc_kill(&ap);
    if (arc != 0) pf_show(g.log);
    assert_int_equal(arc, 0);
}

/* The optimizer's node stalls (its agent SIGSTOPped 8 s; the agent's stages keep running):
 * the head declares the node lost, tells its stages to stop (CONTROL STOP: they still
 * hear it) and restarts the optimizer's peers; when the agent wakes it rejoins and the
 * optimizer starts again there. The run ends with every step once. Before, the stalled
 * node's optimizer kept running and the new loader took its `applied`: the run never got
 * past the stall (found by a fresh-user review). */
static void test_node_stalled_optimizer_node(void **state) {
    (void)state;
    static pf_run_args_t h, g;
    char out[400], listen[64], key[500], dir[400], steps[500];
    snprintf(out, sizeof out, "%s/stall", fx.root);
    snprintf(dir, sizeof dir, "%s/agent-stall", fx.root);
    int port = pf_free_port_span();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(key, sizeof key, "%s/node.key", out);
    const char *hargv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                           "--targets", "1", "--drafters", "n1:1", "--threads", "1", "--token-budget", "256",
                           "--block-size", "4", "--num-anchors", "8", "--max-steps", "60", "--epochs", "1000",
                           "--listen", listen, "--nodes", "1", "--out", out, NULL};
    memset(&h, 0, sizeof h);
    pf_set_argv(&h, hargv);
    snprintf(h.log, sizeof h.log, "%s/stall-head.out", fx.root);
    proc_t hp, ap;
    assert_int_equal(proc_spawn(&hp, "draftline run", pf_run_child, &h), 0);
    assert_true(pf_wait_for_text(h.log, "waiting for", 60));
    const char *aargv[] = {fx.exe, "node", "--join", listen, "--key", key, "--name", "n1", "--run-dir", dir, NULL};
    memset(&g, 0, sizeof g);
    pf_set_argv(&g, aargv);
    snprintf(g.log, sizeof g.log, "%s/stall-agent.out", fx.root);
    assert_int_equal(proc_spawn(&ap, "draftline node", pf_run_child, &g), 0);
    snprintf(steps, sizeof steps, "%s/steps.jsonl", dir);
    for (int i = 0; i < 1200 && pf_count_lines(steps) < 5; i++) usleep(100000);
    assert_true(pf_count_lines(steps) >= 5);
    assert_int_equal(kill(ap.pid, SIGSTOP), 0);
    int lost = pf_wait_for_text(h.log, "node n1 lost", 15);
    sleep(5);
    kill(ap.pid, SIGCONT);
    if (!lost) pf_show(h.log);
    assert_true(lost);
    int rc = pf_run_finish(&hp, h.log, out, 240, NULL);
    if (rc != 0) { pf_show(h.log); pf_show(g.log); }
    assert_int_equal(rc, 0);
    assert_true(has_text(h.log, "summary: 60 steps"));
    assert_int_equal(pf_count_lines(steps), 60);   /* every step once (an undone one is removed) */
    int arc = -1;
    proc_wait(&ap, 30000, &arc);
    proc_kill(&ap);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_cross_node_refused),
        cmocka_unit_test(test_node_bad_key),
        cmocka_unit_test(test_node_join_timeout),
        cmocka_unit_test(test_node_join_run),
        cmocka_unit_test(test_node_lost_rejoin),
        cmocka_unit_test(test_node_agent_faults),
        cmocka_unit_test(test_node_stalled_optimizer_node),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
