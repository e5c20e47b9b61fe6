/* `draftline rebalance --run DIR --targets N --drafters M [--wait S]` (CPU mode), or
 * `--target-gpus 0,0 --drafter-gpus 1` (GPU mode: entry i is the GPU of target /
 * drafter i; a stage whose GPU stays keeps running, one whose GPU changes is
 * restarted there, see common/pipe/rbplan.h): changes the split of a running job.
 * On a multi-node run the placement names nodes as `draftline run` takes it
 * (`--targets a:2,b:1`, `--target-gpus a:0-3`; rbplan_parse_place; a bare count or
 * list is the head's): a stage whose node changes is stopped there and started on
 * the new node. The lists are checked here (syntax, both given, 1..64 entries,
 * ordinals 0..1023) before anything is written; whether the run is in GPU mode, and
 * whether the names are its nodes, is the supervisor's answer.
 *
 * The request travels on the run's control socket (common/rundir/ctl.h, a
 * CTL_REQUEST rebalance); the supervisor answers "running", then "done" or
 * "rejected" (text: JSON {"id", "status", "message", "seconds", "targets",
 * "drafters"[, "target_gpus", "drafter_gpus"]}). This command waits (default 120 s)
 * for the final answer and exits 0 (done), 1 (rejected, timeout, or the run does not
 * answer: not running, refused at once) or 2 (usage). Nothing is written anywhere. */
#include "common/base/cli.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/rundir/ctl.h"
#include "common/rundir/rundir.h"
#include "common/pipe/rbplan.h"
#include "tools/commands.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Prints the final answer r (done / rejected) of request id; returns the exit code. */
static int print_final(const char *id, const proto_ctl_reply_t *r) {
    char *txt = rundir_ctl_text(r);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(j, "message");
    printf("rebalance %s %s: %s\n", id, r->state, cJSON_IsString(msg) ? msg->valuestring : txt ? txt : "");
    cJSON_Delete(j);
    free(txt);
    return strcmp(r->state, "done") ? 1 : 0;
}

/* --targets / --drafters: a count N, or a placement naming nodes ("a:2,b:1": *place
 * = s, the count its processes). 0 or DL_EINVAL (message set). */
static int place_count(const char *flag, const char *s, const char **place, int *count) {
    *place = NULL;
    if (!strchr(s, ':')) return cli_parse_int(flag, s, 1, 64, count);
    rbplan_nodes_t t = {.n = 1};
    snprintf(t.name[0], sizeof t.name[0], "head");
    int out[RBPLAN_MAX], node[RBPLAN_MAX];
    int n = rbplan_parse_place(flag, s, 1, &t, out, node, RBPLAN_MAX);
    if (n < 0) return n;
    *place = s;
    *count = n;
    return 0;
}

/* --target-gpus / --drafter-gpus: a bare list, or one naming nodes ("a:0-3,b:0"):
 * out[] the ordinals, *place = s when it names nodes. The count, or DL_EINVAL. */
static int place_gpus(const char *flag, const char *s, const char **place, int *out) {
    *place = NULL;
    if (!strchr(s, ':')) return rbplan_parse_gpus(flag, s, out, RBPLAN_MAX);
    rbplan_nodes_t t = {.n = 1};
    snprintf(t.name[0], sizeof t.name[0], "head");
    int node[RBPLAN_MAX];
    int n = rbplan_parse_place(flag, s, 0, &t, out, node, RBPLAN_MAX);
    if (n >= 0) *place = s;
    return n;
}

int cmd_rebalance(int argc, char **argv) {
    const char *dir = NULL, *tg = NULL, *dg = NULL, *tp = NULL, *dp = NULL;
    int targets = -1, drafters = -1;
    double wait_s = 120;
    static const struct option opts[] = {
        {"run", 1, 0, 'r'}, {"targets", 1, 0, 't'}, {"drafters", 1, 0, 'd'},
        {"target-gpus", 1, 0, 'T'}, {"drafter-gpus", 1, 0, 'D'}, {"wait", 1, 0, 'w'},
        {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'r': dir = optarg; break;
        case 't': rc = place_count("--targets", optarg, &tp, &targets); break;
        case 'd': rc = place_count("--drafters", optarg, &dp, &drafters); break;
        case 'T': tg = optarg; break;
        case 'D': dg = optarg; break;
        case 'w': rc = cli_parse_f64("--wait", optarg, 0, 86400, &wait_s); break;
        case 'h':
            printf("usage: draftline rebalance --run DIR (--targets N|PLACE --drafters M|PLACE |\n"
                   "                          --target-gpus L --drafter-gpus L) [--wait S]\n"
                   "Changes the split of a running job: drafters that go drain their inbox and stop at a\n"
                   "step boundary, new stages start, targets are re-routed and the optimizer told the new\n"
                   "membership. Training goes on; the math is unchanged. Waits up to S seconds (default\n"
                   "120; 0: do not wait) for the supervisor's answer and prints it.\n"
                   "CPU runs: --targets N --drafters M (1..64 each).\n"
                   "GPU runs: --target-gpus L --drafter-gpus L, both, with the whole new placement: entry i\n"
                   "is the CUDA ordinal of target (drafter) i, repeat one to share a GPU (0,0). Target i\n"
                   "feeds drafter i mod M. A stage whose entry keeps its GPU keeps running; one whose\n"
                   "GPU changes is stopped and started on the new GPU (its unapplied work is re-issued);\n"
                   "entries past the old list start new stages; stages past the new list retire.\n"
                   "Example: --target-gpus 0 --drafter-gpus 1  ->  --target-gpus 0,0 --drafter-gpus 1\n"
                   "starts a second target on GPU 0; the first target and the drafter keep running.\n"
                   "Multi-node runs (started with --listen): name nodes as `draftline run` does, a NAME:\n"
                   "prefix applies to the entries after it, entries before any prefix (a bare count or\n"
                   "list) are the head's: --targets a:2,b:1 --drafters b:2 (CPU), --target-gpus a:0-3\n"
                   "--drafter-gpus a:4-7 (GPU). Entry i is still target (drafter) i: one whose node\n"
                   "changes is stopped there and started on the new node (its work is re-issued).\n"
                   "Refused: a node not in the run's placement or not joined, drafter0 changing node\n"
                   "(the optimizer and its checkpoints stay with it), and on GPUs a target and its\n"
                   "drafter, or a drafter and the optimizer, on different nodes.\n");
            return 0;
        default: return 2;
        }
        if (rc < 0) { cli_error("draftline rebalance", dl_errmsg()); return 2; }
    }
    if (!dir) { cli_error("draftline rebalance", "--run DIR is required"); return 2; }
    int gpu = tg || dg;
    if (!gpu && (targets < 0 || drafters < 0)) {
        cli_error("draftline rebalance", "give --targets N --drafters M (CPU run) or --target-gpus LIST "
                                         "--drafter-gpus LIST (GPU run)");
        return 2;
    }
    int tgl[RBPLAN_MAX], dgl[RBPLAN_MAX];
    if (gpu) {  /* N, M follow from the lists */
        if (!tg || !dg) {
            cli_error("draftline rebalance", "a GPU rebalance gives the whole new placement: both --target-gpus "
                                             "LIST and --drafter-gpus LIST (e.g. --target-gpus 0,0 --drafter-gpus 1)");
            return 2;
        }
        if (targets >= 0 || drafters >= 0) {
            cli_error("draftline rebalance", "--targets/--drafters are for CPU runs; on a GPU run the counts are "
                                             "the lengths of --target-gpus/--drafter-gpus");
            return 2;
        }
        if ((targets = place_gpus("--target-gpus", tg, &tp, tgl)) < 0 ||
            (drafters = place_gpus("--drafter-gpus", dg, &dp, dgl)) < 0) {
            cli_error("draftline rebalance", dl_errmsg());
            return 2;
        }
    }
    if (drafters > targets) {   /* as `run` warns: target i feeds drafter i mod M */
        if (drafters - targets == 1)
            fprintf(stderr, "draftline rebalance: warning: %d drafters for %d target(s): drafter%d gets no input "
                            "and sits idle (use --drafters <= --targets)\n", drafters, targets, targets);
        else
            fprintf(stderr, "draftline rebalance: warning: %d drafters for %d target(s): drafters %d to %d get no "
                            "input and sit idle (use --drafters <= --targets)\n", drafters, targets, targets,
                    drafters - 1);
    }
    char id[64];
    time_t now = time(NULL);
    snprintf(id, sizeof id, "rb-%ld-%d", (long)now, (int)getpid());
    proto_ctl_request_t q = {.id = ((uint64_t)now << 22) | ((uint64_t)getpid() & ((1u << 22) - 1)),
                             .op = PROTO_CTLREQ_REBALANCE};
    int64_t tq[RBPLAN_MAX], dq[RBPLAN_MAX];
    if (gpu) {
        for (int i = 0; i < targets; i++) tq[i] = tgl[i];
        for (int i = 0; i < drafters; i++) dq[i] = dgl[i];
        q.target_gpus = tq, q.n_target_gpus = (uint32_t)targets;
        q.drafter_gpus = dq, q.n_drafter_gpus = (uint32_t)drafters;
    } else {
        q.targets = (uint32_t)targets, q.drafters = (uint32_t)drafters;
    }
    if ((tp && strlen(tp) > DL_PROTO_CTL_PLACE_MAX) || (dp && strlen(dp) > DL_PROTO_CTL_PLACE_MAX)) {
        cli_error("draftline rebalance", "a placement is longer than 1024 characters");
        return 2;
    }
    if (tp) snprintf(q.target_place, sizeof q.target_place, "%s", tp);
    if (dp) snprintf(q.drafter_place, sizeof q.drafter_place, "%s", dp);
    proto_msg_t r;
    rundir_ctl_t *cl = NULL;
    int crc = rundir_ctl_call(dir, &q, RUNDIR_CTL_ANSWER_MS, &r, &cl);
    if (crc < 0) {
        int spid = 0;
        if (rundir_run_supervisor_pid(dir, &spid) < 0) {
            fprintf(stderr, "draftline rebalance: %s (is %s a run dir?)\n", dl_errmsg(), dir);
            return 1;
        }
        if (crc == DL_ETIMEDOUT) {
            fprintf(stderr, "draftline rebalance: the supervisor of %s (pid %d) does not answer on its control "
                            "socket within %d ms (stopped or hung?); nothing was asked of it\n", dir, spid,
                    RUNDIR_CTL_ANSWER_MS);
            return 1;
        }
        fprintf(stderr, "draftline rebalance: run %s is not running (no supervisor at pid %d): nothing to "
                        "rebalance; resume it with the split you want (`draftline run --resume %s "
                        "%s`)\n", dir, spid, dir,
                gpu ? "--target-gpus LIST --drafter-gpus LIST" : "--targets N --drafters M");
        return 1;
    }
    if (gpu) printf("rebalance %s requested: %d target(s) on GPUs %s, %d drafter(s) on GPUs %s\n", id, targets, tg,
                    drafters, dg);
    else if (tp || dp) printf("rebalance %s requested: %d target(s) (%s), %d drafter(s) (%s)\n", id, targets,
                              tp ? tp : "head", drafters, dp ? dp : "head");
    else printf("rebalance %s requested: %d target(s), %d drafter(s)\n", id, targets, drafters);
    fflush(stdout);
    int ret = -1;
    double t0 = clock_mono_s();
    while (ret < 0) {
        if (strcmp(r.ctl_reply.state, "running") != 0) ret = print_final(id, &r.ctl_reply);
        proto_msg_free(&r);
        if (ret >= 0 || wait_s <= 0) break;
        double left = wait_s - (clock_mono_s() - t0);
        int rc = left > 0 ? rundir_ctl_recv(cl, &r, (int)(left * 1000) + 1) : DL_ETIMEDOUT;
        while (rc == 0 && (r.type != PROTO_CTL_REPLY || r.ctl_reply.id != q.id)) {
            proto_msg_free(&r);
            left = wait_s - (clock_mono_s() - t0);
            rc = left > 0 ? rundir_ctl_recv(cl, &r, (int)(left * 1000) + 1) : DL_ETIMEDOUT;
        }
        if (rc < 0) {
            fprintf(stderr, "draftline rebalance: no answer from the supervisor in %.0f s (is the run live? see "
                            "`draftline status --run %s`)\n", wait_s, dir);
            ret = 1;
        }
    }
    rundir_ctl_destroy(&cl);
    return ret < 0 ? 0 : ret;
}
