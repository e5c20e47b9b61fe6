/* `draftline status --run DIR`: the topology, routing table and each stage's
 * state of a run, from <DIR>/run.json (written by the supervisor) and the last
 * metrics of every stage in <DIR>/metrics.jsonl. Works on live and finished runs. */
#include "common/base/cli.h"
#include "common/base/err.h"
#include "tools/commands.h"
#include "supervisor/supervisor.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define STATUS_TAIL_BYTES (1u << 20) /* the last MiB of metrics.jsonl holds every stage's latest */

static char *read_all(const char *path, size_t max_tail) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    long from = max_tail && (size_t)n > max_tail ? n - (long)max_tail : 0;
    fseek(f, from, SEEK_SET);
    char *b = malloc((size_t)(n - from) + 1);
    size_t got = b ? fread(b, 1, (size_t)(n - from), f) : 0;
    fclose(f);
    if (b) b[got] = 0;
    return b;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(c) ? c->valuedouble : -1;
}

int cmd_status(int argc, char **argv) {
    const char *dir = NULL;
    static const struct option opts[] = {{"run", 1, 0, 'r'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "r:h", opts, NULL)) != -1) {
        if (c == 'r') dir = optarg;
        else if (c == 'h') {
            printf("usage: draftline status --run DIR\n"
                   "Prints a run's topology (GPU runs: the GPU of each target and drafter), routing\n"
                   "table (target -> drafter) and each stage's process, GPU, state, incarnation,\n"
                   "restarts and key metrics.\n");
            return 0;
        } else return 2;
    }
    if (!dir) { cli_error("draftline status", "--run DIR is required"); return 2; }
    char p[4200];
    snprintf(p, sizeof p, "%s/run.json", dir);
    char *txt = read_all(p, 0);
    cJSON *run = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    if (!run) { fprintf(stderr, "draftline status: %s: missing or malformed\n", p); return 1; }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(run, "run_id");
    const cJSON *state = cJSON_GetObjectItemCaseSensitive(run, "state");
    pid_t sup = (pid_t)num(run, "supervisor_pid");
    int alive = sup_pid_is_supervisor((int)sup);
    const char *sts = cJSON_IsString(state) ? state->valuestring : "?";
    /* run.json says "running" until the supervisor rewrites it at the end: a supervisor
     * that was killed (SIGKILL, OOM) never does, so its last state is stale */
    int stale = !alive && strcmp(sts, "stopped") != 0;
    if (stale)
        printf("run %s  %s  (not running: supervisor pid %d is dead)\n", cJSON_IsString(id) ? id->valuestring : "?",
               dir, (int)sup);
    else
        printf("run %s  %s  (%s, supervisor pid %d%s)\n", cJSON_IsString(id) ? id->valuestring : "?", dir, sts,
               (int)sup, alive ? "" : ", not running");
    if (stale)
        printf("the supervisor (pid %d) is dead but run.json still says '%s': it was killed without "
               "finishing (no stage is running). Resume with `draftline run --resume %s`\n",
               (int)sup, sts, dir);
    printf("topology: %g target(s), %g drafter(s) on %s; steps %g..%g, %g micro-batch(es) per step\n",
           num(run, "targets"), num(run, "drafters"),
           cJSON_IsString(cJSON_GetObjectItem(run, "device")) ? cJSON_GetObjectItem(run, "device")->valuestring : "?",
           num(run, "start_step"), num(run, "max_steps"), num(run, "micro_batches_per_step"));
    {
        /* GPU runs: the placement (entry i = GPU of target / drafter i) */
        const char *keys[2] = {"target_gpus", "drafter_gpus"};
        int shown = 0;
        for (int k = 0; k < 2; k++) {
            const cJSON *l = cJSON_GetObjectItemCaseSensitive(run, keys[k]), *g;
            if (!cJSON_GetArraySize(l)) continue;
            printf("%s%s GPUs", shown++ ? ", " : "placement: ", k ? "drafter" : "target");
            int i = 0;
            cJSON_ArrayForEach(g, l) printf("%s%d", i++ ? "," : " ", g->valueint);
        }
        if (shown) printf("\n");
    }
    printf("routes:");
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(run, "routes")) {
        if (cJSON_GetArraySize(r) == 2)
            printf("  target%d -> drafter%d", cJSON_GetArrayItem(r, 0)->valueint - 200,
                   cJSON_GetArrayItem(r, 1)->valueint - 100);
    }
    printf("\n");
    {
        const cJSON *rb = cJSON_GetObjectItemCaseSensitive(run, "rebalance");
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(rb, "status");
        const cJSON *rm = cJSON_GetObjectItemCaseSensitive(rb, "message");
        if (cJSON_IsString(rs))
            printf("last rebalance: %s (%s)\n", rs->valuestring, cJSON_IsString(rm) ? rm->valuestring : "");
        double rec = num(run, "optimizer_recoveries"), port = num(run, "metrics_port");
        const cJSON *ep = cJSON_GetObjectItemCaseSensitive(run, "metrics_endpoint");
        if (rec > 0) printf("optimizer restarts from its last checkpoint: %g\n", rec);
        if (port > 0) printf("Prometheus: http://localhost:%g/metrics\n", port);
        if (cJSON_IsString(ep) && ep->valuestring[0]) printf("metrics relay (PUB): %s\n", ep->valuestring);
    }
    /* latest metrics per stage */
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    char *m = read_all(p, STATUS_TAIL_BYTES);
    enum { MAXS = 160 };
    cJSON *last[MAXS] = {0};
    const cJSON *stages = cJSON_GetObjectItemCaseSensitive(run, "stages");
    int ns = cJSON_GetArraySize(stages);
    for (char *l = m ? strtok(m, "\n") : NULL; l; l = strtok(NULL, "\n")) {
        cJSON *x = cJSON_Parse(l);
        if (!x) continue;
        const cJSON *sn = cJSON_GetObjectItemCaseSensitive(x, "stage");
        const cJSON *xs = cJSON_GetObjectItemCaseSensitive(x, "state");
        int k = -1;
        for (int i = 0; i < ns && i < MAXS; i++) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(stages, i), "name");
            if (cJSON_IsString(sn) && cJSON_IsString(n) && !strcmp(sn->valuestring, n->valuestring)) k = i;
        }
        if (k < 0 || (cJSON_IsString(xs) && !strcmp(xs->valuestring, "step"))) { cJSON_Delete(x); continue; }
        cJSON_Delete(last[k]);
        last[k] = x;
    }
    free(m);
    printf("%-10s %-8s %7s %4s %3s %4s  %-11s %10s %9s %9s %9s  %s\n", "stage", "process", "pid", "inc", "rst",
           "gpu", "state", "tokens/s", "wait_in", "wait_cr", "compute", "detail");
    for (int i = 0; i < ns && i < MAXS; i++) {
        const cJSON *e = cJSON_GetArrayItem(stages, i);
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(e, "process");
        const cJSON *x = last[i];
        const cJSON *xs = x ? cJSON_GetObjectItemCaseSensitive(x, "state") : NULL;
        char detail[160] = "";
        if (x) {
            double v;
            if ((v = num(x, "step")) >= 0) snprintf(detail, sizeof detail, "step %g, loss %.4f", v, num(x, "loss"));
            else if ((v = num(x, "inbox_high_water")) >= 0)
                snprintf(detail, sizeof detail, "inbox %.1f+%.1f MB used, high %.1f MB, ready %g, weights v%g",
                         num(x, "inbox_gpu_bytes") / 1e6, num(x, "inbox_host_bytes") / 1e6, v / 1e6,
                         num(x, "ready"), num(x, "weights_version"));
            else if ((v = num(x, "in_flight")) >= 0)
                snprintf(detail, sizeof detail, "next mb %g, in flight %g, re-issued %g", num(x, "next_mb"), v,
                         num(x, "reissued"));
            else if ((v = num(x, "done")) >= 0)
                snprintf(detail, sizeof detail, "%g micro-batches, route drafter%g", v, num(x, "route"));
        }
        double compute = x ? num(x, "forward_s") + num(x, "backward_s") + num(x, "step_s") : 0;
        char rate[32] = "-";
        if (x && num(x, "tokens_per_s") >= 0) snprintf(rate, sizeof rate, "%.0f", num(x, "tokens_per_s"));
        char pids[24], gpu[16] = "-";
        if (num(e, "gpu") >= 0) snprintf(gpu, sizeof gpu, "%g", num(e, "gpu"));
        if (alive) snprintf(pids, sizeof pids, "%g", num(e, "pid"));
        else snprintf(pids, sizeof pids, "-");
        printf("%-10s %-8s %7s %4g %3g %4s  %-11s %10s %8.1fs %8.1fs %8.1fs  %s\n",
               cJSON_IsString(n) ? n->valuestring : "?",
               !alive ? "-" : cJSON_IsString(pr) ? pr->valuestring : "?", pids, num(e, "incarnation"), num(e, "restarts"),
               gpu,
               !alive ? "not running" : cJSON_IsString(xs) ? xs->valuestring : "-", !alive ? "-" : rate,
               x ? num(x, "wait_input_s") : 0, x ? num(x, "wait_credit_s") : 0, compute, detail);
        cJSON_Delete(last[i]);
    }
    cJSON_Delete(run);
    return 0;
}
