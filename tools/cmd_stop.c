/* `draftline stop --run DIR`: asks a run's supervisor, on its control socket
 * (common/rundir/ctl.h), to stop: the same path as SIGTERM or Ctrl-C (every stage
 * stops, the optimizer writes a final checkpoint); with --wait it waits for the
 * supervisor's "stopped" (or for it to go silent). A run whose socket does not
 * answer is not running. */
#include "common/base/cli.h"
#include "common/base/err.h"
#include "common/rundir/ctl.h"
#include "common/rundir/rundir.h"
#include "tools/commands.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cmd_stop(int argc, char **argv) {
    const char *dir = NULL;
    int wait_s = 0;
    static const struct option opts[] = {{"run", 1, 0, 'r'}, {"wait", 1, 0, 'w'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "r:w:h", opts, NULL)) != -1) {
        if (c == 'r') dir = optarg;
        else if (c == 'w') {
            if (cli_parse_int("--wait", optarg, 0, 86400, &wait_s) < 0) { cli_error("draftline stop", dl_errmsg()); return 2; }
        } else if (c == 'h') {
            printf("usage: draftline stop --run DIR [--wait SECONDS]\n"
                   "Stops a run cleanly (final checkpoint), as SIGTERM to its `draftline run`\n"
                   "would: that command then prints its summary marked (interrupted) and exits\n"
                   "143 (130 after Ctrl-C). --wait waits up to SECONDS for it to finish (exit 1\n"
                   "if it is still running).\n");
            return 0;
        } else return 2;
    }
    if (!dir) { cli_error("draftline stop", "--run DIR is required"); return 2; }
    int spid = 0;
    if (rundir_run_supervisor_pid(dir, &spid) < 0) {
        fprintf(stderr, "draftline stop: %s (is %s a draftline run dir?)\n", dl_errmsg(), dir);
        return 1;
    }
    proto_ctl_request_t q = {.id = (uint64_t)getpid(), .op = PROTO_CTLREQ_STOP,
                             .flags = wait_s > 0 ? PROTO_CTLREQ_WAIT : 0};
    proto_msg_t r;
    rundir_ctl_t *cl = NULL;
    int rc = rundir_ctl_call(dir, &q, RUNDIR_CTL_ANSWER_MS, &r, &cl);
    if (rc == DL_ETIMEDOUT) {   /* the socket took the connection: a process holds it */
        fprintf(stderr, "draftline stop: the supervisor of %s (pid %d) does not answer on its control socket "
                        "within %d ms (stopped or hung?); nothing was asked of it\n", dir, spid, RUNDIR_CTL_ANSWER_MS);
        return 1;
    }
    if (rc < 0) {
        printf("run %s is not running (no supervisor at pid %d)\n", dir, spid);
        return 0;
    }
    int code = r.ctl_reply.code;
    char *txt = rundir_ctl_text(&r.ctl_reply);
    proto_msg_free(&r);
    if (code < 0) {
        fprintf(stderr, "draftline stop: the supervisor refused: %s\n", txt ? txt : "");
        free(txt);
        rundir_ctl_destroy(&cl);
        return 1;
    }
    printf("asked the supervisor of %s (pid %d) to stop\n", dir, txt && atoi(txt) > 0 ? atoi(txt) : spid);
    free(txt);
    fflush(stdout);
    int ret = 0;
    while (wait_s > 0) {
        rc = rundir_ctl_recv(cl, &r, wait_s * 1000);
        if (rc == DL_ECLOSED || (rc == 0 && r.type == PROTO_CTL_REPLY && r.ctl_reply.id == q.id &&
                                 !strcmp(r.ctl_reply.state, "stopped"))) {
            if (rc == 0) proto_msg_free(&r);
            printf("stopped\n");
            break;
        }
        if (rc == 0) { proto_msg_free(&r); continue; }
        fprintf(stderr, "draftline stop: still running after %d s\n", wait_s);
        ret = 1;
        break;
    }
    rundir_ctl_destroy(&cl);
    return ret;
}
