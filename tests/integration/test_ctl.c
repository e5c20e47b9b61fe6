/* The supervisor's control socket (supervisor/ctl.c, common/rundir/ctl.h) on a CPU run
 * of the tiny target (as test_run_keep_ckpt), 1 target + 1 drafter:
 *
 *  - with the run dir READ-ONLY to the clients (root: a private mount namespace with the
 *    run dir bind-mounted read-only; else chmod 0500 for the client's duration; each
 *    client child first checks that it cannot create a file there), `draftline status`
 *    (live: "running"), `monitor --once`, `rebalance --targets 2 --drafters 1` (answered
 *    "done") and `stop --wait` all work, and the run ends as after SIGTERM: exit 143,
 *    "(interrupted)", a final checkpoint;
 *  - `monitor --once` of the live run with metrics.jsonl and steps.jsonl hidden from it
 *    too (root: /dev/null bind-mounted over them; else chmod 0): its stage rows, steps and
 *    "(live)" came through the socket (the subscription's history and messages);
 *  - subscribe's "ok" carries the supervisor's recent history (metrics.jsonl lines);
 *  - a malformed CTL_REQUEST sent raw is answered with an ERROR and the run goes on
 *    (status answers afterwards);
 *  - `status` of the finished run falls back to the files ("not running").
 * Every child has a hard timeout and is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/rundir/ctl.h"
#include "common/rundir/rundir.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

static pf_fixture_t fx;
static char run_dir[400];
static int hide_files;          /* ro_tool: metrics.jsonl and steps.jsonl unreadable too */
static const char *const HIDDEN[] = {"metrics.jsonl", "steps.jsonl"};

/* The client child's files hidden (see hide_files); 0, or -1 when one still reads. */
static int hide_run_files(void) {
    for (int i = 0; i < 2; i++) {
        char p[600], b[16];
        snprintf(p, sizeof p, "%s/%s", run_dir, HIDDEN[i]);
        if (geteuid() == 0 && mount("/dev/null", p, NULL, MS_BIND, NULL) != 0) {
            fprintf(stderr, "bind mount /dev/null over %s: %s\n", p, strerror(errno));
            return -1;
        }
        int fd = open(p, O_RDONLY);
        ssize_t n = fd >= 0 ? read(fd, b, sizeof b) : 0;
        if (fd >= 0) close(fd);
        if (n > 0) { fprintf(stderr, "%s still reads\n", p); return -1; }
    }
    return 0;
}

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlct", 60) < 0) return -1;
    proc_watchdog(300);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* A client child: the run dir read-only (see the file comment), proof that it is, then
 * the command (pf_run_child). Exit 125: the run dir could be written or not remounted. */
static int ro_client_child(void *arg, int report_fd) {
    if (geteuid() == 0) {
        if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
            mount(run_dir, run_dir, NULL, MS_BIND, NULL) != 0 ||
            mount(NULL, run_dir, NULL, MS_RDONLY | MS_BIND | MS_REMOUNT, NULL) != 0) {
            fprintf(stderr, "read-only bind mount of %s: %s\n", run_dir, strerror(errno));
            return 125;
        }
    }
    if (hide_files && hide_run_files() < 0) return 125;
    char probe[600];
    snprintf(probe, sizeof probe, "%s/client-was-here", run_dir);
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) { close(fd); unlink(probe); fprintf(stderr, "%s is writable\n", run_dir); return 125; }
    return pf_run_child(arg, report_fd);
}

/* `draftline <args>` as a read-only client, output into log; returns its exit code. */
static int ro_tool(const char *log, char *const args[]) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    a.argv[0] = fx.exe;
    int n = 1;
    for (int i = 0; args[i]; i++) a.argv[n++] = args[i];
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    int root = geteuid() == 0;
    char hp[2][600];
    for (int i = 0; i < 2 && hide_files && !root; i++) {
        snprintf(hp[i], sizeof hp[i], "%s/%s", run_dir, HIDDEN[i]);
        assert_int_equal(chmod(hp[i], 0), 0);
    }
    if (!root) assert_int_equal(chmod(run_dir, 0500), 0);
    proc_t p;
    assert_int_equal(proc_spawn(&p, "draftline client", ro_client_child, &a), 0);
    int code = -1;
    int rc = proc_wait(&p, 90000, &code);
    proc_kill(&p);
    if (!root) chmod(run_dir, 0700);
    for (int i = 0; i < 2 && hide_files && !root; i++) chmod(hp[i], 0644);
    assert_int_equal(rc, 0);
    if (code != 0) {
        char *t = pf_slurp(log, NULL);
        fprintf(stderr, "draftline %s: exit %d\n%s\n", args[0], code, t ? t : "");
        free(t);
    }
    return code;
}

/* A raw malformed CTL_REQUEST is answered with an ERROR; a valid status right after. */
static void malformed_request(void) {
    char ep[256];
    assert_int_equal(rundir_ctl_endpoint(run_dir, ep, sizeof ep), 0);
    rundir_ctl_t *c = NULL;
    assert_int_equal(rundir_ctl_connect(ep, &c), 0);
    const unsigned char junk[] = {0x93, 0x0f, 0x01, 0xc1};   /* [15, 1, <invalid byte>] */
    assert_int_equal(rundir_ctl_send_raw(c, junk, sizeof junk), 0);
    proto_msg_t m;
    assert_int_equal(rundir_ctl_recv(c, &m, 10000), 0);
    assert_int_equal(m.type, PROTO_ERROR);
    assert_int_equal(m.error.ref_type, PROTO_CTL_REQUEST);
    assert_non_null(strstr(m.error.message, "malformed control request"));
    proto_msg_free(&m);
    /* a well-formed request of the wrong type: refused too */
    unsigned char hb[] = {0x96, 0x02, DL_PROTO_VERSION, 0x01, 0x01, 0x01, 0x01};
    assert_int_equal(rundir_ctl_send_raw(c, hb, sizeof hb), 0);
    assert_int_equal(rundir_ctl_recv(c, &m, 10000), 0);
    assert_int_equal(m.type, PROTO_ERROR);
    assert_non_null(strstr(m.error.message, "takes ctl_request messages"));
    proto_msg_free(&m);
    proto_ctl_request_t q = {.id = 77, .op = PROTO_CTLREQ_STATUS};
    assert_int_equal(rundir_ctl_send(c, &q), 0);
    assert_int_equal(rundir_ctl_recv(c, &m, 10000), 0);
    assert_int_equal(m.type, PROTO_CTL_REPLY);
    assert_int_equal(m.ctl_reply.id, 77);
    assert_int_equal(m.ctl_reply.code, 0);
    assert_string_equal(m.ctl_reply.state, "ok");
    char *t = rundir_ctl_text(&m.ctl_reply);
    assert_non_null(strstr(t, "\"run\":"));
    assert_non_null(strstr(t, "\"metrics\":["));
    free(t);
    proto_msg_free(&m);
    /* subscribe: the relayed METRICS messages follow the "ok" */
    proto_ctl_request_t sq = {.id = 78, .op = PROTO_CTLREQ_SUBSCRIBE};
    assert_int_equal(rundir_ctl_send(c, &sq), 0);
    assert_int_equal(rundir_ctl_recv(c, &m, 10000), 0);
    assert_int_equal(m.type, PROTO_CTL_REPLY);
    assert_int_equal(m.ctl_reply.id, 78);
    assert_string_equal(m.ctl_reply.state, "ok");
    t = rundir_ctl_text(&m.ctl_reply);      /* the history: metrics.jsonl lines */
    assert_non_null(strstr(t, "\"stage\":\"drafter0\""));
    assert_non_null(strstr(t, "\"state\":\"step\""));
    free(t);
    proto_msg_free(&m);
    int n_metrics = 0;
    for (int i = 0; i < 200 && n_metrics < 3; i++) {
        assert_int_equal(rundir_ctl_recv(c, &m, 10000), 0);
        n_metrics += m.type == PROTO_METRICS;
        proto_msg_free(&m);
    }
    assert_int_equal(n_metrics, 3);
    rundir_ctl_destroy(&c);
}

static void test_ctl_live_run(void **state) {
    (void)state;
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    char p[600], log[600];
    snprintf(run_dir, sizeof run_dir, "%s/c", fx.root);
    char *argv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--token-budget", "256",
                    "--block-size", "4", "--num-anchors", "8", "--drafter-layers", "1", "--device", "cpu",
                    "--threads", "1", "--max-steps", "100000", "--epochs", "1000", "--out", run_dir, NULL};
    for (int i = 0; argv[i]; i++) a.argv[i] = argv[i];
    snprintf(a.log, sizeof a.log, "%s/c.out", fx.root);
    proc_t run;
    assert_int_equal(proc_spawn(&run, "draftline run", pf_run_child, &a), 0);
    snprintf(p, sizeof p, "%s/steps.jsonl", run_dir);
    for (int i = 0; i < 6000 && pf_count_lines(p) < 3; i++) usleep(10000);
    assert_true(pf_count_lines(p) >= 3);
    snprintf(p, sizeof p, "%s/run.json", run_dir);
    char *txt = pf_slurp(p, NULL);
    assert_non_null(strstr(txt, "\"control\":\t\"ipc://"));
    free(txt);

    snprintf(log, sizeof log, "%s/status.out", fx.root);
    char *sargs[] = {"status", "--run", run_dir, NULL};
    assert_int_equal(ro_tool(log, sargs), 0);
    txt = pf_slurp(log, NULL);
    assert_non_null(strstr(txt, "(running, supervisor pid"));
    assert_non_null(strstr(txt, "optimizer  running"));
    assert_non_null(strstr(txt, "target0 -> drafter0"));
    free(txt);

    snprintf(log, sizeof log, "%s/monitor.out", fx.root);
    char *margs[] = {"monitor", "--run", run_dir, "--once", NULL};
    assert_int_equal(ro_tool(log, margs), 0);
    txt = pf_slurp(log, NULL);
    assert_non_null(strstr(txt, "drafter0"));
    free(txt);
    /* the same with the metrics files hidden, once every stage sent metrics: what it
     * shows came through the socket */
    for (int i = 0; i < 3000; i++) {
        rundir_metrics_rec_t *recs = NULL;
        int n = 0;
        rundir_metrics_latest(run_dir, 1 << 20, &recs, &n);
        rundir_metrics_latest_free(&recs, n);
        if (n >= 4) break;
        usleep(10000);
    }
    snprintf(log, sizeof log, "%s/monitor2.out", fx.root);
    char *m2args[] = {"monitor", "--run", run_dir, "--once", "--no-nvml", NULL};
    hide_files = 1;
    assert_int_equal(ro_tool(log, m2args), 0);
    hide_files = 0;
    txt = pf_slurp(log, NULL);
    assert_non_null(strstr(txt, " (live)\n"));
    assert_non_null(strstr(txt, "training: step "));
    assert_non_null(strstr(txt, "\ndrafter0 "));
    assert_non_null(strstr(txt, "\ntarget0 "));
    assert_null(strstr(txt, "no metrics yet"));
    free(txt);

    malformed_request();

    snprintf(log, sizeof log, "%s/rebalance.out", fx.root);
    char *rargs[] = {"rebalance", "--run", run_dir, "--targets", "2", "--drafters", "1", "--wait", "60", NULL};
    assert_int_equal(ro_tool(log, rargs), 0);
    txt = pf_slurp(log, NULL);
    assert_non_null(strstr(txt, " done: 1+1 -> 2+1 in "));
    free(txt);
    assert_int_equal(ro_tool(log, sargs), 0);
    txt = pf_slurp(log, NULL);
    assert_non_null(strstr(txt, "target0 -> drafter0  target1 -> drafter0"));
    free(txt);

    snprintf(log, sizeof log, "%s/stop.out", fx.root);
    /* outlive the heartbeat timeout of the clients that already left (their "dead" is not
     * for the console: checked below) */
    sleep(RUNDIR_CTL_DEAD_MS / 1000 + 1);
    char *kargs[] = {"stop", "--run", run_dir, "--wait", "60", NULL};
    assert_int_equal(ro_tool(log, kargs), 0);
    txt = pf_slurp(log, NULL);
    assert_non_null(strstr(txt, "asked the supervisor of"));
    assert_non_null(strstr(txt, "stopped"));
    free(txt);
    int code = pf_run_finish(&run, a.log, run_dir, 60, NULL);
    assert_int_equal(code, 143);   /* as after SIGTERM: 128 + 15 */
    txt = pf_slurp(a.log, NULL);
    assert_non_null(strstr(txt, "(interrupted)"));
    /* the console says who stopped it (was "stopping the pipeline: SIGTERM") */
    assert_non_null(strstr(txt, "stopping the pipeline: `draftline stop` (control socket)"));
    /* the stop's final checkpoint is in the summary's wall figure, with its time */
    assert_non_null(strstr(txt, ", final checkpoint "));
    /* the clients that came and went are not "dead peers" on the user's console */
    assert_null(strstr(txt, "bus control: peer"));
    free(txt);
    char name[128];
    uint64_t step = 0;
    assert_int_equal(rundir_latest_read(run_dir, name, sizeof name, &step), 1);
    assert_true(step >= 3);

    /* the finished run: no socket, the files */
    snprintf(log, sizeof log, "%s/status2.out", fx.root);
    assert_int_equal(ro_tool(log, sargs), 0);
    txt = pf_slurp(log, NULL);
    assert_non_null(strstr(txt, "(stopped, supervisor pid"));
    assert_non_null(strstr(txt, ", not running)"));
    free(txt);
    char *k2[] = {"stop", "--run", run_dir, NULL};
    assert_int_equal(ro_tool(log, k2), 0);
    txt = pf_slurp(log, NULL);
    assert_non_null(strstr(txt, "is not running"));
    free(txt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ctl_live_run),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
