/* `draftline rebalance --run DIR --targets N --drafters M [--wait S]` (CPU mode), or
 * `--target-gpus 0,1 --drafter-gpus 2` (parsed and passed on; GPU runs answer that
 * they do not rebalance yet): changes the split of a running job.
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
#include "tools/commands.h"
#include "tools/supervisor.h"

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
    const char *dir = NULL, *tg = "", *dg = "";
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
                   "120; 0: do not wait) for the supervisor's answer and prints it.\n");
            return 0;
        default: return 2;
        }
        if (rc < 0) { cli_error("draftline rebalance", dl_errmsg()); return 2; }
    }
    if (!dir) { cli_error("draftline rebalance", "--run DIR is required"); return 2; }
    int gpu = tg[0] || dg[0];
    if (!gpu && (targets < 0 || drafters < 0)) {
        cli_error("draftline rebalance", "give --targets N --drafters M (CPU) or --target-gpus/--drafter-gpus");
        return 2;
    }
    if (gpu) {  /* N, M follow from the lists */
        targets = 1; drafters = 1;
        for (const char *p = tg; *p; p++) targets += *p == ',';
        for (const char *p = dg; *p; p++) drafters += *p == ',';
    }
    {
        int spid = 0;
        int live = sup_run_live(dir, &spid);
        if (live < 0) { fprintf(stderr, "draftline rebalance: %s (is %s a run dir?)\n", dl_errmsg(), dir); return 1; }
        if (!live) {
            fprintf(stderr, "draftline rebalance: run %s is not running (no supervisor at pid %d): nothing to "
                            "rebalance; resume it with the split you want (`draftline run --resume %s --out %s "
                            "--targets N --drafters M`)\n", dir, spid, dir, dir);
            return 1;
        }
    }
    char id[64];
    snprintf(id, sizeof id, "rb-%ld-%d", (long)time(NULL), (int)getpid());
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddNumberToObject(j, "targets", targets);
    cJSON_AddNumberToObject(j, "drafters", drafters);
    cJSON_AddStringToObject(j, "target_gpus", tg);
    cJSON_AddStringToObject(j, "drafter_gpus", dg);
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
    printf("rebalance %s requested: %d target(s), %d drafter(s)\n", id, targets, drafters);
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
