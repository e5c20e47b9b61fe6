/* Supervisor, <out>/run.json: the writer, and the liveness check of a run dir. */
#include "supervisor/sup_int.h"
#include "common/base/err.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* <out>/run.json: the run's topology for `draftline status/stop` and the monitor
 * (device, targets, drafters, max_steps, the supervisor's pid, every stage with
 * pid, incarnation, restarts and state, the routing table). Replaced atomically. */
void sup__write_run_json(sup_t *S) {
    const sup_opts_t *o = S->o;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "run_id", o->run_id);
    cJSON_AddStringToObject(j, "device", S->gpu_mode ? "cuda" : "cpu");
    cJSON_AddNumberToObject(j, "targets", S->nt);
    cJSON_AddNumberToObject(j, "drafters", S->nd);
    /* GPU runs: the GPU of target (drafter) i of the live topology, i < targets (drafters) */
    cJSON *tgl = cJSON_AddArrayToObject(j, "target_gpus"), *dgl = cJSON_AddArrayToObject(j, "drafter_gpus");
    for (int r = 0; r < 2 && S->gpu_mode; r++)
        for (int i = 0; i < (r ? S->nd : S->nt); i++)
            for (int k = 0; k < S->n; k++)
                if (S->st[k].spec->stage_id == (r ? PIPE_ID_DRAFTER0 : PIPE_ID_TARGET0) + (uint32_t)i)
                    cJSON_AddItemToArray(r ? dgl : tgl, cJSON_CreateNumber(sup__spec_gpu(S->st[k].spec)));
    cJSON_AddNumberToObject(j, "max_steps", (double)o->max_steps);
    cJSON_AddNumberToObject(j, "start_step", (double)o->start_step);
    cJSON_AddNumberToObject(j, "micro_batches_per_step", (double)o->mbs_per_step);
    cJSON_AddNumberToObject(j, "supervisor_pid", (double)getpid());
    cJSON_AddStringToObject(j, "sock_dir", o->sock_dir);
    cJSON_AddStringToObject(j, "state", S->done ? "stopped" : S->stopping ? "stopping" : S->rb.running ? "rebalancing" : "running");
    cJSON_AddNumberToObject(j, "metrics_port", S->prom ? S->prom_port : -1);
    {
        char ep[BUS_ENDPOINT_MAX] = "";
        if (S->pub) bus_endpoint(o->sock_dir, "metrics", ep, sizeof ep);
        cJSON_AddStringToObject(j, "metrics_endpoint", ep);
    }
    cJSON_AddNumberToObject(j, "optimizer_recoveries", S->opt_recoveries);
    /* for `draftline run --resume DIR`'s defaults (cmd_run.c, resume_defaults) */
    if (o->target_model) cJSON_AddStringToObject(j, "target_model", o->target_model);
    if (o->data) cJSON_AddStringToObject(j, "data", o->data);
    cJSON_AddNumberToObject(j, "save_every", (double)o->save_every);
    cJSON_AddNumberToObject(j, "keep_checkpoints", (double)o->keep_checkpoints);
    cJSON_AddBoolToObject(j, "deterministic", o->deterministic);
    if (S->rb.id[0]) {
        cJSON *r = cJSON_AddObjectToObject(j, "rebalance");
        cJSON_AddStringToObject(r, "id", S->rb.id);
        cJSON_AddStringToObject(r, "status", S->rb.status);
        cJSON_AddStringToObject(r, "message", S->rb.message);
        cJSON_AddNumberToObject(r, "seconds", S->rb.seconds);
    }
    cJSON *st = cJSON_AddArrayToObject(j, "stages");
    for (int i = 0; i < S->n; i++) {
        const sstage_t *x = &S->st[i];
        if (!x->active && x->exited && x->incarnation == 0) continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", x->spec->name);
        cJSON_AddNumberToObject(e, "stage_id", x->spec->stage_id);
        cJSON_AddNumberToObject(e, "pid", x->exited ? 0 : x->pid);
        cJSON_AddNumberToObject(e, "incarnation", (double)x->incarnation);
        cJSON_AddNumberToObject(e, "restarts", x->restarts);
        cJSON_AddNumberToObject(e, "gpu", sup__spec_gpu(x->spec));
        if (x->last_recovery_s > 0) {
            cJSON_AddNumberToObject(e, "last_restart_up_s", x->last_up_s);
            cJSON_AddNumberToObject(e, "last_recovery_s", x->last_recovery_s);
        }
        cJSON_AddStringToObject(e, "process", !x->active && x->exited ? "retired" : x->retiring ? "draining"
                                : x->moving ? "moving" : !x->exited ? "running" : x->restart_at > 0 ? "restarting" : "exited");
        cJSON_AddItemToArray(st, e);
    }
    cJSON *rt = cJSON_AddArrayToObject(j, "routes");
    for (int i = 0; i < S->n; i++) {
        const sstage_t *x = &S->st[i];
        if (!is_target(x) || !x->active || x->retiring) continue;
        cJSON *pr = cJSON_CreateArray();
        cJSON_AddItemToArray(pr, cJSON_CreateNumber(x->spec->stage_id));
        cJSON_AddItemToArray(pr, cJSON_CreateNumber(PIPE_ID_DRAFTER0 + route_of(S, x->spec->stage_id)));
        cJSON_AddItemToArray(rt, pr);
    }
    char *txt = cJSON_Print(j);
    cJSON_Delete(j);
    if (!txt) return;
    char p[4200], tmp[4300];
    snprintf(p, sizeof p, "%s/run.json", o->out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fputs(txt, f);
        fputc('\n', f);
        if (fclose(f) == 0) rename(tmp, p);
    }
    free(txt);
}

int sup_pid_is_supervisor(int pid) {
    if (pid <= 0) return 0;
    char p[64], buf[4096];
    snprintf(p, sizeof p, "/proc/%d/cmdline", pid);
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *a1 = buf + strlen(buf) + 1;   /* argv is NUL-separated */
    return n > 0 && strstr(buf, "draftline") && a1 < buf + n && !strcmp(a1, "run");
}

int sup_run_live(const char *dir, int *pid) {
    *pid = 0;
    char p[4200];
    snprintf(p, sizeof p, "%s/run.json", dir);
    FILE *f = fopen(p, "rb");
    if (!f) return dl_seterr(DL_ENOENT, "%s: %s", p, strerror(errno));
    static char txt[1 << 16];
    size_t n = fread(txt, 1, sizeof txt - 1, f);
    fclose(f);
    txt[n] = 0;
    cJSON *j = cJSON_Parse(txt);
    const cJSON *pj = j ? cJSON_GetObjectItemCaseSensitive(j, "supervisor_pid") : NULL;
    if (!cJSON_IsNumber(pj)) { cJSON_Delete(j); return dl_seterr(DL_ENOENT, "%s: no supervisor_pid", p); }
    *pid = pj->valueint;
    cJSON_Delete(j);
    return sup_pid_is_supervisor(*pid);
}
