/* `draftline rebalance --run DIR --targets N --drafters M [--wait S]` (CPU mode), or
 * `--target-gpus 0,0 --drafter-gpus 1` (GPU mode: entry i is the GPU of target /
 * drafter i; a stage whose GPU stays keeps running, one whose GPU changes is
 * restarted there, see common/pipe/rbplan.h): changes the split of a running job.
 * The lists are checked here (both given, 1..64 ordinals 0..1023 each) before anything
 * is written; whether the run is in GPU mode is the supervisor's answer.
 *
 * The request travels as a file: <DIR>/rebalance.request (JSON {"id", "targets",
 * "drafters", "target_gpus", "drafter_gpus"}, written to a .tmp and renamed), which
 * the supervisor picks up within 0.2 s; it answers in <DIR>/rebalance.result (JSON
 * {"id", "status": running|done|rejected, "message", "seconds", "targets",
 * "drafters"}). This command waits (default 120 s) for the answer with its id and
 * exits 0 (done), 1 (rejected, timeout, or the run's supervisor is not alive: refused at
 * once, nothing written) or 2 (usage). A request left unanswered at the timeout is
 * removed again, and a supervisor deletes any stale request when it starts. */
#include "common/base/cli.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/rundir/rundir.h"
#include "common/pipe/rbplan.h"
#include "tools/commands.h"
#include "supervisor/supervisor.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static cJSON *read_json(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return cJSON_Parse(buf);
}

int cmd_rebalance(int argc, char **argv) {
    const char *dir = NULL, *tg = NULL, *dg = NULL;
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
        case 't': rc = cli_parse_int("--targets", optarg, 1, 64, &targets); break;
        case 'd': rc = cli_parse_int("--drafters", optarg, 1, 64, &drafters); break;
        case 'T': tg = optarg; break;
        case 'D': dg = optarg; break;
        case 'w': rc = cli_parse_f64("--wait", optarg, 0, 86400, &wait_s); break;
        case 'h':
            printf("usage: draftline rebalance --run DIR (--targets N --drafters M | --target-gpus L --drafter-gpus L)\n"
                   "                          [--wait S]\n"
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
                   "starts a second target on GPU 0; the first target and the drafter keep running.\n");
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
    if (gpu) {  /* N, M follow from the lists */
        int l[RBPLAN_MAX];
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
        if ((targets = rbplan_parse_gpus("--target-gpus", tg, l, RBPLAN_MAX)) < 0 ||
            (drafters = rbplan_parse_gpus("--drafter-gpus", dg, l, RBPLAN_MAX)) < 0) {
            cli_error("draftline rebalance", dl_errmsg());
            return 2;
        }
    }
    {
        int spid = 0;
        int live = rundir_run_supervisor_pid(dir, &spid);
        if (live == 0) live = sup_pid_is_supervisor(spid);
        if (live < 0) { fprintf(stderr, "draftline rebalance: %s (is %s a run dir?)\n", dl_errmsg(), dir); return 1; }
        if (!live) {
            fprintf(stderr, "draftline rebalance: run %s is not running (no supervisor at pid %d): nothing to "
                            "rebalance; resume it with the split you want (`draftline run --resume %s "
                            "%s`)\n", dir, spid, dir,
                    gpu ? "--target-gpus LIST --drafter-gpus LIST" : "--targets N --drafters M");
            return 1;
        }
    }
    char id[64];
    snprintf(id, sizeof id, "rb-%ld-%d", (long)time(NULL), (int)getpid());
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddNumberToObject(j, "targets", targets);
    cJSON_AddNumberToObject(j, "drafters", drafters);
    cJSON_AddStringToObject(j, "target_gpus", tg ? tg : "");
    cJSON_AddStringToObject(j, "drafter_gpus", dg ? dg : "");
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    char p[4200], tmp[4300], res[4200];
    snprintf(p, sizeof p, "%s/" SUP_REBALANCE_REQUEST, dir);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", p, (int)getpid());
    snprintf(res, sizeof res, "%s/" SUP_REBALANCE_RESULT, dir);
    FILE *f = fopen(tmp, "w");
    if (!f || !txt || fprintf(f, "%s\n", txt) < 0 || fclose(f) != 0 || rename(tmp, p) != 0) {
        fprintf(stderr, "draftline rebalance: cannot write %s\n", p);
        free(txt);
        return 1;
    }
    free(txt);
    if (gpu) printf("rebalance %s requested: %d target(s) on GPUs %s, %d drafter(s) on GPUs %s\n", id, targets, tg,
                    drafters, dg);
    else printf("rebalance %s requested: %d target(s), %d drafter(s)\n", id, targets, drafters);
    fflush(stdout);
    if (wait_s <= 0) return 0;
    double t0 = clock_mono_s();
    while (clock_mono_s() - t0 < wait_s) {
        cJSON *r = read_json(res);
        const cJSON *rid = r ? cJSON_GetObjectItemCaseSensitive(r, "id") : NULL;
        const cJSON *st = r ? cJSON_GetObjectItemCaseSensitive(r, "status") : NULL;
        const cJSON *msg = r ? cJSON_GetObjectItemCaseSensitive(r, "message") : NULL;
        if (cJSON_IsString(rid) && !strcmp(rid->valuestring, id) && cJSON_IsString(st) &&
            strcmp(st->valuestring, "running") != 0) {
            int ok = !strcmp(st->valuestring, "done");
            printf("rebalance %s %s: %s\n", id, st->valuestring, cJSON_IsString(msg) ? msg->valuestring : "");
            cJSON_Delete(r);
            return ok ? 0 : 1;
        }
        cJSON_Delete(r);
        usleep(100000);
    }
    /* take back our own request if it was never picked up, so no later run applies it */
    cJSON *left = read_json(p);
    const cJSON *lid = left ? cJSON_GetObjectItemCaseSensitive(left, "id") : NULL;
    if (cJSON_IsString(lid) && !strcmp(lid->valuestring, id)) unlink(p);
    cJSON_Delete(left);
    fprintf(stderr, "draftline rebalance: no answer from the supervisor in %.0f s (is the run live? see "
                    "`draftline status --run %s`)\n", wait_s, dir);
    return 1;
}
