/* `draftline stop --run DIR`: asks a run's supervisor to stop (SIGTERM, the same
 * as Ctrl-C: every stage stops, the optimizer writes a final checkpoint), and with
 * --wait waits for it to finish. The supervisor's pid comes from <DIR>/run.json and
 * is checked against /proc/<pid>/cmdline ("draftline" "run") before signalling. */
#include "common/base/cli.h"
#include "common/base/err.h"
#include "common/rundir/rundir.h"
#include "tools/commands.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int is_supervisor(pid_t pid) {
    char p[64], buf[4096];
    snprintf(p, sizeof p, "/proc/%d/cmdline", (int)pid);
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* argv is NUL-separated: look for "...draftline" followed by "run" */
    const char *a0 = buf;
    const char *a1 = buf + strlen(buf) + 1;
    return n > 0 && strstr(a0, "draftline") && a1 < buf + n && !strcmp(a1, "run");
}

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
                   "Stops a run cleanly (final checkpoint), like Ctrl-C on its supervisor; --wait\n"
                   "waits up to SECONDS for it to finish (exit 1 if it is still running).\n");
            return 0;
        } else return 2;
    }
    if (!dir) { cli_error("draftline stop", "--run DIR is required"); return 2; }
    int spid = 0;
    if (rundir_run_supervisor_pid(dir, &spid) < 0) {
        fprintf(stderr, "draftline stop: %s/%s: missing or malformed\n", dir, RUNDIR_RUN_JSON);
        return 1;
    }
    pid_t pid = (pid_t)spid;
    if (!is_supervisor(pid)) {
        printf("run %s is not running (no supervisor at pid %d)\n", dir, (int)pid);
        return 0;
    }
    if (kill(pid, SIGTERM) != 0) {
        fprintf(stderr, "draftline stop: kill %d: %s\n", (int)pid, strerror(errno));
        return 1;
    }
    printf("asked the supervisor of %s (pid %d) to stop\n", dir, (int)pid);
    for (int i = 0; i < wait_s * 10; i++) {
        if (!is_supervisor(pid)) { printf("stopped\n"); return 0; }
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    if (wait_s > 0) { fprintf(stderr, "draftline stop: still running after %d s\n", wait_s); return 1; }
    return 0;
}
