/* `draftline status --run DIR`: the topology, routing table and each stage's
 * state of a run. A live run answers on its control socket (common/rundir/ctl.h)
 * with the supervisor's own picture (run.json's keys and every stage's latest
 * metrics); a run that does not answer is printed from <DIR>/run.json and the last
 * metrics of every stage in <DIR>/metrics.jsonl, as not running. */
#include "common/base/cli.h"
#include "common/base/err.h"
#include "common/rundir/ctl.h"
#include "common/rundir/rundir.h"
#include "tools/commands.h"

#include <cjson/cJSON.h>

#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATUS_TAIL_BYTES (1u << 20) /* the last MiB of metrics.jsonl holds every stage's latest */
/* Stages send metrics every second: a running stage silent this long is frozen or hung
 * (the same threshold as monitor's diagnosis, MON_SILENT_S_DEFAULT). */
#define STATUS_SILENT_S 5.0

/* A metric of a stage's latest line, -1 when absent or null (as printed since v1). */
static double num(const rundir_metrics_rec_t *x, const char *k) {
    double v = rundir_metrics_get(x, k);
    return isnan(v) ? -1 : v;
}

static const char *str_or(const char *s, const char *dflt) { return s[0] ? s : dflt; }

/* The header lines: run, supervisor, topology, placement, routes, rebalance, relay.
 * alive: 1 answered, 0 no socket or refused (no supervisor), -1 connected but silent. */
static void print_run(const rundir_run_t *run, const char *dir, int alive) {
    const char *sts = str_or(run->state, "?");
    int sup = run->supervisor_pid;
    /* run.json says "running" until the supervisor rewrites it at the end: a supervisor
     * that was killed (SIGKILL, OOM) never does, so its last state is stale */
    int stale = !alive && strcmp(sts, "stopped") != 0;
    if (alive < 0)
        printf("run %s  %s  (%s in run.json; supervisor pid %d does not answer on its control socket within "
               "%d ms: stopped or hung? shown from the files)\n", str_or(run->run_id, "?"), dir, sts, sup,
               RUNDIR_CTL_ANSWER_MS);
    else if (stale)
        printf("run %s  %s  (not running: supervisor pid %d is dead)\n", str_or(run->run_id, "?"), dir, sup);
    else
        printf("run %s  %s  (%s, supervisor pid %d%s)\n", str_or(run->run_id, "?"), dir, sts, sup,
               alive ? "" : ", not running");
    if (stale)
        printf("the supervisor (pid %d) is dead but run.json still says '%s': it was killed without "
               "finishing (no stage is running). Resume with `draftline run --resume %s`\n", sup, sts, dir);
    /* steps named from 0 as steps.jsonl and the console name them: a run to max_steps M
     * trains steps start..M-1 */
    char steps[64] = "?";
    if (run->max_steps > 0 && run->start_step >= 0)
        snprintf(steps, sizeof steps, "%lld..%lld of %lld", (long long)run->start_step, (long long)run->max_steps - 1,
                 (long long)run->max_steps);
    printf("topology: %g target(s), %g drafter(s) on %s; steps %s, %g micro-batch(es) per step\n",
           (double)run->targets, (double)run->drafters, str_or(run->device, "?"), steps,
           (double)run->micro_batches_per_step);
    /* GPU runs: the placement (entry i = GPU of target / drafter i) */
    const int *lists[2] = {run->target_gpus, run->drafter_gpus};
    const int counts[2] = {run->n_target_gpus, run->n_drafter_gpus};
    int shown = 0;
    for (int k = 0; k < 2; k++) {
        if (!counts[k]) continue;
        printf("%s%s GPUs", shown++ ? ", " : "placement: ", k ? "drafter" : "target");
        for (int i = 0; i < counts[k]; i++) printf("%s%d", i ? "," : " ", lists[k][i]);
    }
    if (shown) printf("\n");
    printf("routes:");
    for (int i = 0; i < run->n_routes; i++)
        printf("  target%d -> drafter%d", (int)run->routes[i][0] - 200, (int)run->routes[i][1] - 100);
    printf("\n");
    if (run->rebalance.status[0]) printf("last rebalance: %s (%s)\n", run->rebalance.status, run->rebalance.message);
    if (run->optimizer_recoveries > 0)
        printf("optimizer restarts from its last checkpoint: %g\n", (double)run->optimizer_recoveries);
    if (run->ckpt_failed_step >= 0)
        printf("checkpoint step_%lld could not be written: %s (training went on)\n",
               (long long)run->ckpt_failed_step, run->ckpt_error[0] ? run->ckpt_error : "see logs/optimizer.log");
    if (run->throughput.on) {   /* the summary's two rates (so far, while running) */
        const typeof(run->throughput) *t = &run->throughput;
        char steady[96] = "steady: too few steps yet", fin[64] = "";
        if (t->steady_tokens_per_s > 0)
            snprintf(steady, sizeof steady, "steady %.0f (steps %lld..%lld)", t->steady_tokens_per_s,
                     (long long)t->steady_from, (long long)t->steady_to);
        if (t->final_ckpt_s > 0) snprintf(fin, sizeof fin, ", final checkpoint %.1f s", t->final_ckpt_s);
        printf("target tokens/s: %s, wall %.0f over %.1f s (start-up %.1f s%s)\n", steady, t->wall_tokens_per_s,
               t->wall_s, t->startup_s, fin);
    }
    if (run->metrics_port > 0) printf("Prometheus: http://localhost:%g/metrics\n", (double)run->metrics_port);
    if (run->metrics_endpoint[0]) printf("metrics relay (PUB): %s\n", run->metrics_endpoint);
}

/* One row of the stage table: run.json's entry e and its latest metrics x (or NULL).
 * alive > 0 (a live run's answer): x's metrics_age_s, the seconds since the supervisor
 * received it, is the "metrics" column; a running stage silent STATUS_SILENT_S or more
 * shows as "silent Ns" with "frozen?" in its detail. max_steps: run.json's (<= 0 unknown). */
static void print_stage(const rundir_stage_t *e, const rundir_metrics_rec_t *x, int alive, int nodes,
                        int64_t max_steps) {
    char detail[200] = "", age[24] = "-", state[24];
    double a = x && alive > 0 ? num(x, "metrics_age_s") : -1;
    int silent = a >= STATUS_SILENT_S && !strcmp(str_or(e->process, "?"), "running") && strcmp(x->state, "stopping");
    if (a >= 0) snprintf(age, sizeof age, "%.1fs", a);
    if (silent) snprintf(state, sizeof state, "silent %.0fs", a);
    else snprintf(state, sizeof state, "%s", !alive ? "not running" : x ? x->state : "-");
    if (silent) snprintf(detail, sizeof detail, "frozen? no metrics for %.0f s (SIGSTOP, hung); ", a);
    size_t dl = strlen(detail);
    if (x) {
        double v;
        if ((v = num(x, "step")) >= 0) {
            /* named from 0 as the console names them ("step 9 done (10 of 100)"): a "step"
             * line carries the step just applied, a periodic one the count applied so far */
            double last = !strcmp(x->state, "step") ? v : v - 1;
            char of[32] = "";
            if (max_steps > 0) snprintf(of, sizeof of, " of %lld", (long long)max_steps);
            if (last < 0) snprintf(detail + dl, sizeof detail - dl, "no step applied yet");
            else snprintf(detail + dl, sizeof detail - dl, "step %g done (%g%s), loss %.4f", last, last + 1, of,
                          num(x, "loss"));
        }
        else if ((v = num(x, "inbox_high_water")) >= 0)
            snprintf(detail + dl, sizeof detail - dl, "inbox %.1f+%.1f MB used, high %.1f MB, ready %g, weights v%g",
                     num(x, "inbox_gpu_bytes") / 1e6, num(x, "inbox_host_bytes") / 1e6, v / 1e6,
                     num(x, "ready"), num(x, "weights_version"));
        else if ((v = num(x, "in_flight")) >= 0)
            snprintf(detail + dl, sizeof detail - dl, "next mb %g, in flight %g, re-issued %g", num(x, "next_mb"), v,
                     num(x, "reissued"));
        else if ((v = num(x, "done")) >= 0)
            snprintf(detail + dl, sizeof detail - dl, "%g micro-batches, route drafter%g", v, num(x, "route"));
        double g = num(x, "wait_gpu_s");   /* --gpu-turns: its waits so far for the GPU's turn */
        dl = strlen(detail);
        if (g > 0) snprintf(detail + dl, sizeof detail - dl, "%swaited %.1f s for GPU turns", dl ? "; " : "", g);
    }
    /* the monitor's busy: copies, forward, backward and step (an absent phase counts 0) */
    double compute = 0;
    static const char *const busy_phases[] = {"copy_s", "forward_s", "backward_s", "step_s"};
    for (int i = 0; x && i < 4; i++) compute += num(x, busy_phases[i]) > 0 ? num(x, busy_phases[i]) : 0;
    char rate[32] = "-";
    if (x && num(x, "tokens_per_s") >= 0) snprintf(rate, sizeof rate, "%.0f", num(x, "tokens_per_s"));
    char pids[24], gpu[16] = "-";
    if (e->gpu >= 0) snprintf(gpu, sizeof gpu, "%g", (double)e->gpu);
    if (alive) snprintf(pids, sizeof pids, "%g", (double)e->pid);
    else snprintf(pids, sizeof pids, "-");
    printf("%-10s ", str_or(e->name, "?"));
    if (nodes) printf("%-10s ", str_or(e->node, "-"));
    printf("%-8s %7s %4g %3g %4s  %-11s %8s %10s %8.1fs %8.1fs %8.1fs  %s\n", !alive ? "-" : str_or(e->process, "?"), pids, (double)e->incarnation, (double)e->restarts, gpu,
           state, age, !alive ? "-" : rate,
           x ? num(x, "wait_input_s") : 0, x ? num(x, "wait_credit_s") : 0, compute, detail);
}

/* The status document of a live run (supervisor/ctl.c) into run and the latest
 * metrics records. Returns 0, or < 0 when the run did not answer (not live) or the
 * answer is malformed. */
static int status_live(const char *dir, rundir_run_t *run, rundir_metrics_rec_t **recs, int *n) {
    *recs = NULL;
    *n = 0;
    proto_ctl_request_t q = {.id = (uint64_t)getpid(), .op = PROTO_CTLREQ_STATUS};
    proto_msg_t r;
    DL_TRY(rundir_ctl_call(dir, &q, RUNDIR_CTL_ANSWER_MS, &r, NULL));
    char *txt = r.ctl_reply.code == 0 ? rundir_ctl_text(&r.ctl_reply) : NULL;
    proto_msg_free(&r);
    cJSON *doc = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    const cJSON *jr = cJSON_GetObjectItemCaseSensitive(doc, "run");
    const cJSON *jm = cJSON_GetObjectItemCaseSensitive(doc, "metrics"), *e;
    char *rt = cJSON_IsObject(jr) ? cJSON_PrintUnformatted(jr) : NULL;
    int rc = rt ? rundir_run_parse(rt, strlen(rt), "status reply", run) : dl_seterr(DL_EPROTO, "malformed status reply");
    free(rt);
    int cap = cJSON_GetArraySize(jm);
    if (rc == 0 && cap > 0 && !(*recs = calloc((size_t)cap, sizeof **recs))) rc = DL_ENOMEM;
    const cJSON *list = cJSON_IsArray(jm) && rc == 0 ? jm : NULL;
    cJSON_ArrayForEach(e, list) {
        char *line = cJSON_PrintUnformatted(e);
        if (line && rundir_metrics_parse_line(line, strlen(line), &(*recs)[*n]) == 0) (*n)++;
        else rundir_metrics_rec_free(&(*recs)[*n]);
        free(line);
    }
    cJSON_Delete(doc);
    return rc;
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
                   "restarts, the age of its last metrics (live runs; a running stage silent 5 s\n"
                   "or more shows as \"silent\": frozen or hung) and key metrics.\n");
            return 0;
        } else return 2;
    }
    if (!dir) { cli_error("draftline status", "--run DIR is required"); return 2; }
    rundir_run_t *run = malloc(sizeof *run);
    if (!run) { fprintf(stderr, "draftline status: out of memory\n"); return 1; }
    rundir_metrics_rec_t *last = NULL;
    int nl = 0;
    int lrc = status_live(dir, run, &last, &nl);
    int alive = lrc == 0 ? 1 : lrc == DL_ETIMEDOUT ? -1 : 0;
    if (alive <= 0) {
        /* not live: the files, as the supervisor last wrote them */
        rundir_metrics_latest_free(&last, nl);
        nl = 0;
        if (rundir_run_read(dir, run) < 0) {
            fprintf(stderr, "draftline status: %s (is %s a draftline run dir?)\n", dl_errmsg(), dir);
            free(run);
            return 1;
        }
        rundir_metrics_latest(dir, STATUS_TAIL_BYTES, &last, &nl);
    }
    print_run(run, dir, alive);
    /* multi-node runs: a node column, and the nodes */
    int nodes = run->n_nodes > 0;
    for (int k = 0; k < run->n_nodes; k++) {
        const rundir_node_t *n = &run->nodes[k];
        printf("node %d %s: %s%s%s%s, %d core(s), %d GPU(s)%s%s\n", n->index, n->name, n->alive ? "joined" : "not joined",
               n->hostname[0] ? " (" : "", n->hostname, n->hostname[0] ? ")" : "", n->cores, n->gpus,
               n->run_dir[0] ? ", run dir " : "", n->run_dir);
    }
    printf("%-10s ", "stage");
    if (nodes) printf("%-10s ", "node");
    printf("%-8s %7s %4s %3s %4s  %-11s %8s %10s %9s %9s %9s  %s\n", "process", "pid", "inc", "rst",
           "gpu", "state", "metrics", "tokens/s", "wait_in", "wait_cr", "compute", "detail");
    for (int i = 0; i < run->n_stages; i++)
        print_stage(&run->stages[i], rundir_metrics_find(last, nl, run->stages[i].name), alive != 0, nodes,
                    run->max_steps);
    rundir_metrics_latest_free(&last, nl);
    free(run);
    return 0;
}
