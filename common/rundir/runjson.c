/* <run>/run.json: the one writer and reader (see rundir.h for the format). */
#include "common/rundir/rundir.h"
#include "common/base/err.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int rundir_path(char *out, size_t cap, const char *dir, const char *file) {
    int n = snprintf(out, cap, "%s/%s", dir, file);
    if (n < 0 || (size_t)n >= cap) return dl_seterr(DL_ERANGE, "%s/%s: path too long", dir, file);
    return 0;
}

void rundir_run_init(rundir_run_t *r) {
    memset(r, 0, sizeof *r);
    r->targets = r->drafters = -1;
    r->max_steps = r->start_step = r->micro_batches_per_step = -1;
    r->supervisor_pid = r->metrics_port = r->optimizer_recoveries = -1;
    r->save_every = r->keep_checkpoints = -1;
    r->deterministic = -1;
    r->ckpt_failed_step = -1;
}

const rundir_stage_t *rundir_run_stage(const rundir_run_t *r, const char *name) {
    for (int i = 0; r && i < r->n_stages; i++)
        if (!strcmp(r->stages[i].name, name)) return &r->stages[i];
    return NULL;
}

/* ---- write ---- */

static cJSON *stage_json(const rundir_stage_t *x) {
    cJSON *e = cJSON_CreateObject();
    if (!e) return NULL;
    cJSON_AddStringToObject(e, "name", x->name);
    cJSON_AddNumberToObject(e, "stage_id", x->stage_id);
    cJSON_AddNumberToObject(e, "pid", x->pid);
    cJSON_AddNumberToObject(e, "incarnation", (double)x->incarnation);
    cJSON_AddNumberToObject(e, "restarts", x->restarts);
    cJSON_AddNumberToObject(e, "gpu", x->gpu);
    if (x->last_recovery_s > 0) {
        cJSON_AddNumberToObject(e, "last_restart_up_s", x->last_restart_up_s);
        cJSON_AddNumberToObject(e, "last_recovery_s", x->last_recovery_s);
    }
    cJSON_AddStringToObject(e, "process", x->process);
    if (x->node[0]) cJSON_AddStringToObject(e, "node", x->node);
    return e;
}

/* The object in the order the supervisor has always written it (tests grep the text). */
static cJSON *run_json(const rundir_run_t *r) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddStringToObject(j, "run_id", r->run_id);
    cJSON_AddStringToObject(j, "device", r->device);
    cJSON_AddNumberToObject(j, "targets", r->targets);
    cJSON_AddNumberToObject(j, "drafters", r->drafters);
    cJSON *tgl = cJSON_AddArrayToObject(j, "target_gpus"), *dgl = cJSON_AddArrayToObject(j, "drafter_gpus");
    for (int i = 0; i < r->n_target_gpus; i++) cJSON_AddItemToArray(tgl, cJSON_CreateNumber(r->target_gpus[i]));
    for (int i = 0; i < r->n_drafter_gpus; i++) cJSON_AddItemToArray(dgl, cJSON_CreateNumber(r->drafter_gpus[i]));
    cJSON_AddNumberToObject(j, "max_steps", (double)r->max_steps);
    cJSON_AddNumberToObject(j, "start_step", (double)r->start_step);
    cJSON_AddNumberToObject(j, "micro_batches_per_step", (double)r->micro_batches_per_step);
    cJSON_AddNumberToObject(j, "supervisor_pid", (double)r->supervisor_pid);
    cJSON_AddStringToObject(j, "sock_dir", r->sock_dir);
    cJSON_AddStringToObject(j, "state", r->state);
    cJSON_AddNumberToObject(j, "metrics_port", r->metrics_port);
    cJSON_AddStringToObject(j, "metrics_endpoint", r->metrics_endpoint);
    if (r->control[0]) cJSON_AddStringToObject(j, "control", r->control);
    cJSON_AddNumberToObject(j, "optimizer_recoveries", r->optimizer_recoveries);
    if (r->ckpt_failed_step >= 0) {
        cJSON_AddNumberToObject(j, "ckpt_failed_step", (double)r->ckpt_failed_step);
        cJSON_AddStringToObject(j, "ckpt_error", r->ckpt_error);
    }
    /* for `draftline run --resume DIR`'s defaults */
    if (r->target_model[0]) cJSON_AddStringToObject(j, "target_model", r->target_model);
    if (r->data[0]) cJSON_AddStringToObject(j, "data", r->data);
    cJSON_AddNumberToObject(j, "save_every", (double)r->save_every);
    cJSON_AddNumberToObject(j, "keep_checkpoints", (double)r->keep_checkpoints);
    cJSON_AddBoolToObject(j, "deterministic", r->deterministic > 0);
    if (r->target_precision[0]) cJSON_AddStringToObject(j, "target_precision", r->target_precision);
    if (r->mps[0]) cJSON_AddStringToObject(j, "mps", r->mps);
    if (r->gpu_turns[0]) cJSON_AddStringToObject(j, "gpu_turns", r->gpu_turns);
    if (r->throughput.on) {
        cJSON *t = cJSON_AddObjectToObject(j, "throughput");
        cJSON_AddNumberToObject(t, "steady_tokens_per_s", r->throughput.steady_tokens_per_s);
        cJSON_AddNumberToObject(t, "steady_from", (double)r->throughput.steady_from);
        cJSON_AddNumberToObject(t, "steady_to", (double)r->throughput.steady_to);
        cJSON_AddNumberToObject(t, "wall_tokens_per_s", r->throughput.wall_tokens_per_s);
        cJSON_AddNumberToObject(t, "wall_s", r->throughput.wall_s);
        cJSON_AddNumberToObject(t, "startup_s", r->throughput.startup_s);
        cJSON_AddNumberToObject(t, "final_ckpt_s", r->throughput.final_ckpt_s);
    }
    if (r->rebalance.id[0]) {
        cJSON *b = cJSON_AddObjectToObject(j, "rebalance");
        cJSON_AddStringToObject(b, "id", r->rebalance.id);
        cJSON_AddStringToObject(b, "status", r->rebalance.status);
        cJSON_AddStringToObject(b, "message", r->rebalance.message);
        cJSON_AddNumberToObject(b, "seconds", r->rebalance.seconds);
    }
    cJSON *st = cJSON_AddArrayToObject(j, "stages");
    for (int i = 0; i < r->n_stages; i++) cJSON_AddItemToArray(st, stage_json(&r->stages[i]));
    cJSON *rt = cJSON_AddArrayToObject(j, "routes");
    for (int i = 0; i < r->n_routes; i++) {
        cJSON *pr = cJSON_CreateArray();
        cJSON_AddItemToArray(pr, cJSON_CreateNumber(r->routes[i][0]));
        cJSON_AddItemToArray(pr, cJSON_CreateNumber(r->routes[i][1]));
        cJSON_AddItemToArray(rt, pr);
    }
    if (r->n_nodes > 0) {
        cJSON *nl = cJSON_AddArrayToObject(j, "nodes");
        for (int i = 0; i < r->n_nodes; i++) {
            const rundir_node_t *n = &r->nodes[i];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", n->name);
            cJSON_AddNumberToObject(e, "index", n->index);
            cJSON_AddStringToObject(e, "hostname", n->hostname);
            cJSON_AddStringToObject(e, "addr", n->addr);
            cJSON_AddStringToObject(e, "run_dir", n->run_dir);
            cJSON_AddBoolToObject(e, "alive", n->alive > 0);
            cJSON_AddNumberToObject(e, "cores", n->cores);
            cJSON_AddNumberToObject(e, "gpus", n->gpus);
            cJSON_AddItemToArray(nl, e);
        }
    }
    return j;
}

int rundir_run_format(const rundir_run_t *r, char **out) {
    *out = NULL;
    if (r->n_stages < 0 || r->n_stages > RUNDIR_MAX_STAGES || r->n_routes < 0 || r->n_routes > RUNDIR_MAX_STAGES ||
        r->n_target_gpus < 0 || r->n_target_gpus > RUNDIR_MAX_GPUS || r->n_drafter_gpus < 0 ||
        r->n_drafter_gpus > RUNDIR_MAX_GPUS || r->n_nodes < 0 || r->n_nodes > RUNDIR_MAX_NODES)
        return dl_seterr(DL_EINVAL, "run.json: %d stages, %d routes, %d+%d GPUs: out of range", r->n_stages,
                         r->n_routes, r->n_target_gpus, r->n_drafter_gpus);
    cJSON *j = run_json(r);
    char *txt = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!txt) return dl_seterr(DL_ENOMEM, "run.json: out of memory");
    size_t n = strlen(txt);
    char *s = malloc(n + 2);
    if (!s) { free(txt); return dl_seterr(DL_ENOMEM, "run.json: out of memory"); }
    memcpy(s, txt, n);
    s[n] = '\n';
    s[n + 1] = 0;
    free(txt);
    *out = s;
    return 0;
}

int rundir_run_write(const char *dir, const rundir_run_t *r) {
    char p[RUNDIR_PATH_MAX + 64], tmp[RUNDIR_PATH_MAX + 80];
    DL_TRY(rundir_path(p, sizeof p, dir, RUNDIR_RUN_JSON));
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    char *txt;
    DL_TRY(rundir_run_format(r, &txt));
    FILE *f = fopen(tmp, "w");
    if (!f) {
        int e = errno;
        free(txt);
        return dl_seterr(DL_EIO, "%s: %s", tmp, strerror(e));
    }
    int ok = fputs(txt, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    ok = (fclose(f) == 0) && ok;
    if (ok) ok = rename(tmp, p) == 0;
    if (!ok) e = e ? e : errno;
    free(txt);
    if (!ok) {
        unlink(tmp);
        return dl_seterr(DL_EIO, "%s: %s", p, strerror(e ? e : EIO));
    }
    return 0;
}

/* ---- read ---- */

typedef struct {
    const char *what;           /* the file, for errors */
    const char *pre;            /* key prefix ("" or "stages[3].") */
} rctx_t;

static int bad_key(const rctx_t *c, const char *key, const char *why) {
    return dl_seterr(DL_EINVAL, "%s: key '%s%s': %s", c->what, c->pre, key, why);
}

static int get_str(const rctx_t *c, const cJSON *o, const char *key, char *dst, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return 0;
    if (!cJSON_IsString(v)) return bad_key(c, key, "expected a string");
    if (strlen(v->valuestring) >= cap) return bad_key(c, key, "too long");
    memcpy(dst, v->valuestring, strlen(v->valuestring) + 1);
    return 0;
}

static int get_num(const rctx_t *c, const cJSON *o, const char *key, double *dst) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return bad_key(c, key, "expected a number");
    *dst = v->valuedouble;
    return 0;
}

/* Integers: a JSON number that is whole and within the type's range, else "expected an
 * integer" (a hand-edited 2.9 or 1e30 is refused, not truncated). */
static int get_int(const rctx_t *c, const cJSON *o, const char *key, int *dst) {
    double d = *dst;
    DL_TRY(get_num(c, o, key, &d));
    if (d != floor(d) || d < INT_MIN || d > INT_MAX) return bad_key(c, key, "expected an integer");
    *dst = (int)d;
    return 0;
}

static int get_i64(const rctx_t *c, const cJSON *o, const char *key, int64_t *dst) {
    double d = (double)*dst;
    DL_TRY(get_num(c, o, key, &d));
    if (d != floor(d) || d < -9223372036854775808.0 || d >= 9223372036854775808.0)
        return bad_key(c, key, "expected an integer");
    *dst = (int64_t)d;
    return 0;
}

static int get_gpus(const rctx_t *c, const cJSON *o, const char *key, int *list, int *n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key), *e;
    if (!v) return 0;
    if (!cJSON_IsArray(v)) return bad_key(c, key, "expected an array");
    *n = 0;
    cJSON_ArrayForEach(e, v) {
        double d = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (d != floor(d) || d < 0 || d > RUNDIR_MAX_ORDINAL)
            return bad_key(c, key, "expected an array of CUDA ordinals (integers 0..1023)");
        if (*n >= RUNDIR_MAX_GPUS) return bad_key(c, key, "more than 64 entries");
        list[(*n)++] = (int)d;
    }
    return 0;
}

static int read_stage(const char *what, int i, const cJSON *e, rundir_stage_t *x) {
    char pre[32];
    snprintf(pre, sizeof pre, "stages[%d].", i);
    rctx_t c = {what, pre};
    memset(x, 0, sizeof *x);
    x->pid = -1, x->incarnation = -1, x->restarts = -1, x->gpu = -1;
    if (!cJSON_IsObject(e)) return dl_seterr(DL_EINVAL, "%s: key 'stages[%d]': expected an object", what, i);
    double id = 0;
    DL_TRY(get_str(&c, e, "name", x->name, sizeof x->name));
    DL_TRY(get_num(&c, e, "stage_id", &id));
    x->stage_id = id >= 0 ? (uint32_t)id : 0;
    DL_TRY(get_int(&c, e, "pid", &x->pid));
    DL_TRY(get_i64(&c, e, "incarnation", &x->incarnation));
    DL_TRY(get_int(&c, e, "restarts", &x->restarts));
    DL_TRY(get_int(&c, e, "gpu", &x->gpu));
    DL_TRY(get_num(&c, e, "last_restart_up_s", &x->last_restart_up_s));
    DL_TRY(get_num(&c, e, "last_recovery_s", &x->last_recovery_s));
    DL_TRY(get_str(&c, e, "process", x->process, sizeof x->process));
    DL_TRY(get_str(&c, e, "node", x->node, sizeof x->node));
    return 0;
}

static int read_nodes(const rctx_t *c0, const cJSON *o, rundir_run_t *r) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "nodes"), *e;
    if (!v) return 0;
    if (!cJSON_IsArray(v)) return bad_key(c0, "nodes", "expected an array");
    cJSON_ArrayForEach(e, v) {
        if (r->n_nodes >= RUNDIR_MAX_NODES) return bad_key(c0, "nodes", "more than 16 nodes");
        char pre[32];
        snprintf(pre, sizeof pre, "nodes[%d].", r->n_nodes);
        rctx_t c = {c0->what, pre};
        rundir_node_t *n = &r->nodes[r->n_nodes];
        memset(n, 0, sizeof *n);
        n->index = -1;
        if (!cJSON_IsObject(e)) return bad_key(c0, "nodes", "expected objects");
        DL_TRY(get_str(&c, e, "name", n->name, sizeof n->name));
        DL_TRY(get_int(&c, e, "index", &n->index));
        DL_TRY(get_str(&c, e, "hostname", n->hostname, sizeof n->hostname));
        DL_TRY(get_str(&c, e, "addr", n->addr, sizeof n->addr));
        DL_TRY(get_str(&c, e, "run_dir", n->run_dir, sizeof n->run_dir));
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "alive");
        if (a && !cJSON_IsBool(a)) return bad_key(&c, "alive", "expected true or false");
        n->alive = a && cJSON_IsTrue(a);
        DL_TRY(get_int(&c, e, "cores", &n->cores));
        DL_TRY(get_int(&c, e, "gpus", &n->gpus));
        r->n_nodes++;
    }
    return 0;
}

static int read_lists(const rctx_t *c, const cJSON *o, rundir_run_t *r) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "stages"), *e;
    if (v) {
        if (!cJSON_IsArray(v)) return bad_key(c, "stages", "expected an array");
        cJSON_ArrayForEach(e, v) {
            if (r->n_stages >= RUNDIR_MAX_STAGES) return bad_key(c, "stages", "more than 160 stages");
            DL_TRY(read_stage(c->what, r->n_stages, e, &r->stages[r->n_stages]));
            r->n_stages++;
        }
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "routes");
    if (v) {
        if (!cJSON_IsArray(v)) return bad_key(c, "routes", "expected an array");
        cJSON_ArrayForEach(e, v) {
            if (r->n_routes >= RUNDIR_MAX_STAGES) return bad_key(c, "routes", "more than 160 routes");
            const cJSON *a = cJSON_GetArrayItem(e, 0), *b = cJSON_GetArrayItem(e, 1);
            if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) ||
                a->valuedouble < 0 || b->valuedouble < 0)
                return bad_key(c, "routes", "expected [target stage_id, drafter stage_id] pairs");
            r->routes[r->n_routes][0] = (uint32_t)a->valuedouble;
            r->routes[r->n_routes][1] = (uint32_t)b->valuedouble;
            r->n_routes++;
        }
    }
    return 0;
}

static int read_rebalance(const rctx_t *c0, const cJSON *o, rundir_run_t *r) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "rebalance");
    if (!b) return 0;
    if (!cJSON_IsObject(b)) return bad_key(c0, "rebalance", "expected an object");
    rctx_t c = {c0->what, "rebalance."};
    DL_TRY(get_str(&c, b, "id", r->rebalance.id, sizeof r->rebalance.id));
    DL_TRY(get_str(&c, b, "status", r->rebalance.status, sizeof r->rebalance.status));
    DL_TRY(get_str(&c, b, "message", r->rebalance.message, sizeof r->rebalance.message));
    return get_num(&c, b, "seconds", &r->rebalance.seconds);
}

static int read_throughput(const rctx_t *c0, const cJSON *o, rundir_run_t *r) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "throughput");
    if (!b) return 0;
    if (!cJSON_IsObject(b)) return bad_key(c0, "throughput", "expected an object");
    rctx_t c = {c0->what, "throughput."};
    DL_TRY(get_num(&c, b, "steady_tokens_per_s", &r->throughput.steady_tokens_per_s));
    DL_TRY(get_i64(&c, b, "steady_from", &r->throughput.steady_from));
    DL_TRY(get_i64(&c, b, "steady_to", &r->throughput.steady_to));
    DL_TRY(get_num(&c, b, "wall_tokens_per_s", &r->throughput.wall_tokens_per_s));
    DL_TRY(get_num(&c, b, "wall_s", &r->throughput.wall_s));
    DL_TRY(get_num(&c, b, "startup_s", &r->throughput.startup_s));
    DL_TRY(get_num(&c, b, "final_ckpt_s", &r->throughput.final_ckpt_s));
    r->throughput.on = 1;
    return 0;
}

static int read_obj(const rctx_t *c, const cJSON *o, rundir_run_t *r) {
    DL_TRY(get_str(c, o, "run_id", r->run_id, sizeof r->run_id));
    DL_TRY(get_str(c, o, "device", r->device, sizeof r->device));
    DL_TRY(get_int(c, o, "targets", &r->targets));
    DL_TRY(get_int(c, o, "drafters", &r->drafters));
    DL_TRY(get_gpus(c, o, "target_gpus", r->target_gpus, &r->n_target_gpus));
    DL_TRY(get_gpus(c, o, "drafter_gpus", r->drafter_gpus, &r->n_drafter_gpus));
    DL_TRY(get_i64(c, o, "max_steps", &r->max_steps));
    DL_TRY(get_i64(c, o, "start_step", &r->start_step));
    DL_TRY(get_i64(c, o, "micro_batches_per_step", &r->micro_batches_per_step));
    DL_TRY(get_int(c, o, "supervisor_pid", &r->supervisor_pid));
    DL_TRY(get_str(c, o, "sock_dir", r->sock_dir, sizeof r->sock_dir));
    DL_TRY(get_str(c, o, "state", r->state, sizeof r->state));
    DL_TRY(get_int(c, o, "metrics_port", &r->metrics_port));
    DL_TRY(get_str(c, o, "metrics_endpoint", r->metrics_endpoint, sizeof r->metrics_endpoint));
    DL_TRY(get_str(c, o, "control", r->control, sizeof r->control));
    DL_TRY(get_int(c, o, "optimizer_recoveries", &r->optimizer_recoveries));
    DL_TRY(get_i64(c, o, "ckpt_failed_step", &r->ckpt_failed_step));
    DL_TRY(get_str(c, o, "ckpt_error", r->ckpt_error, sizeof r->ckpt_error));
    DL_TRY(get_str(c, o, "target_model", r->target_model, sizeof r->target_model));
    DL_TRY(get_str(c, o, "data", r->data, sizeof r->data));
    DL_TRY(get_i64(c, o, "save_every", &r->save_every));
    DL_TRY(get_i64(c, o, "keep_checkpoints", &r->keep_checkpoints));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "deterministic");
    if (v && !cJSON_IsBool(v)) return bad_key(c, "deterministic", "expected true or false");
    if (v) r->deterministic = cJSON_IsTrue(v);
    DL_TRY(get_str(c, o, "target_precision", r->target_precision, sizeof r->target_precision));
    r->has_target_precision = cJSON_HasObjectItem(o, "target_precision");
    DL_TRY(get_str(c, o, "mps", r->mps, sizeof r->mps));
    DL_TRY(get_str(c, o, "gpu_turns", r->gpu_turns, sizeof r->gpu_turns));
    DL_TRY(read_rebalance(c, o, r));
    DL_TRY(read_throughput(c, o, r));
    DL_TRY(read_nodes(c, o, r));
    return read_lists(c, o, r);
}

int rundir_run_parse(const char *text, size_t len, const char *what, rundir_run_t *r) {
    rundir_run_init(r);
    cJSON *o = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return dl_seterr(DL_EINVAL, "%s: not a JSON object", what);
    }
    rctx_t c = {what, ""};
    int rc = read_obj(&c, o, r);
    cJSON_Delete(o);
    return rc;
}

int rundir_run_read(const char *dir, rundir_run_t *r) {
    char p[RUNDIR_PATH_MAX + 64];
    DL_TRY(rundir_path(p, sizeof p, dir, RUNDIR_RUN_JSON));
    FILE *f = fopen(p, "rb");
    if (!f) {
        int e = errno;
        return dl_seterr(e == ENOENT ? DL_ENOENT : DL_EIO, "%s: %s", p, strerror(e));
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *b = realloc(buf, cap * 2);
        if (!b) { free(buf); buf = NULL; break; }
        buf = b, cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf) return dl_seterr(DL_ENOMEM, "%s: out of memory", p);
    if (err) { free(buf); return dl_seterr(DL_EIO, "%s: read error", p); }
    int rc = rundir_run_parse(buf, n, p, r);
    free(buf);
    return rc;
}

int rundir_run_supervisor_pid(const char *dir, int *pid) {
    *pid = 0;
    rundir_run_t *r = malloc(sizeof *r);
    if (!r) return dl_seterr(DL_ENOMEM, "run.json: out of memory");
    int rc = rundir_run_read(dir, r);
    if (rc == 0 && r->supervisor_pid == -1) rc = dl_seterr(DL_ENOENT, "%s/%s: no supervisor_pid", dir, RUNDIR_RUN_JSON);
    if (rc == 0) *pid = r->supervisor_pid;
    free(r);
    return rc;
}
