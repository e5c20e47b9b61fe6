/* <run>/metrics.jsonl: the appender and the line parser (see rundir.h). */
#include "common/rundir/rundir.h"
#include "common/base/err.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rundir_metrics {
    FILE *f;
    char path[RUNDIR_PATH_MAX + 64];
};

rundir_metrics_t *rundir_metrics_open(const char *dir) {
    rundir_metrics_t *w = calloc(1, sizeof *w);
    if (!w) { dl_seterr(DL_ENOMEM, "metrics.jsonl: out of memory"); return NULL; }
    if (rundir_path(w->path, sizeof w->path, dir, RUNDIR_METRICS) < 0) { free(w); return NULL; }
    w->f = fopen(w->path, "a");
    if (!w->f) {
        dl_seterr(DL_EIO, "%s: %s", w->path, strerror(errno));
        free(w);
        return NULL;
    }
    return w;
}

void rundir_metrics_close(rundir_metrics_t **w) {
    if (!w || !*w) return;
    fclose((*w)->f);
    free(*w);
    *w = NULL;
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s < 0x20) continue;
        fputc(*s, f);
    }
    fputc('"', f);
}

static int flushed(rundir_metrics_t *w) {
    if (fflush(w->f) != 0 || ferror(w->f)) {
        clearerr(w->f);
        return dl_seterr(DL_EIO, "%s: %s", w->path, strerror(errno));
    }
    return 0;
}

static void write_line(FILE *f, uint64_t ts_ns, const char *stage, uint32_t stage_id, uint64_t incarnation,
                       const char *state, const char *const *names, const double *values, int n) {
    fprintf(f, "{\"ts\":%.3f,\"stage\":", (double)ts_ns / 1e9);
    json_str(f, stage);
    fprintf(f, ",\"stage_id\":%u,\"incarnation\":%llu,\"state\":", stage_id, (unsigned long long)incarnation);
    json_str(f, state);
    for (int i = 0; i < n; i++) {
        fputc(',', f);
        json_str(f, names[i]);
        double v = values[i];
        if (isfinite(v)) fprintf(f, ":%.9g", v);
        else fprintf(f, ":null");
    }
    fprintf(f, "}\n");
}

int rundir_metrics_append(rundir_metrics_t *w, uint64_t ts_ns, const char *stage, uint32_t stage_id,
                          uint64_t incarnation, const char *state, const char *const *names,
                          const double *values, int n) {
    write_line(w->f, ts_ns, stage, stage_id, incarnation, state, names, values, n);
    return flushed(w);
}

int rundir_metrics_format(char **out, size_t *len, uint64_t ts_ns, const char *stage, uint32_t stage_id,
                          uint64_t incarnation, const char *state, const char *const *names,
                          const double *values, int n) {
    *out = NULL;
    *len = 0;
    FILE *f = open_memstream(out, len);
    if (!f) return dl_seterr(DL_ENOMEM, "metrics line: out of memory");
    write_line(f, ts_ns, stage, stage_id, incarnation, state, names, values, n);
    if (fclose(f) != 0 || !*out) { free(*out); *out = NULL; return dl_seterr(DL_ENOMEM, "metrics line: out of memory"); }
    return 0;
}

int rundir_metrics_append_eval(rundir_metrics_t *w, double ts, uint64_t step, double seconds,
                               const char *const *names, const double *values, int n) {
    cJSON *line = cJSON_CreateObject();
    if (!line) return dl_seterr(DL_ENOMEM, "%s: out of memory", w->path);
    cJSON_AddNumberToObject(line, "ts", ts);
    cJSON_AddStringToObject(line, "stage", "eval");
    cJSON_AddStringToObject(line, "state", "done");   /* read by `draftline monitor` like a stage's line */
    cJSON_AddNumberToObject(line, "step", (double)step);
    cJSON_AddNumberToObject(line, "seconds", seconds);
    for (int i = 0; i < n; i++) cJSON_AddNumberToObject(line, names[i], values[i]);
    char *txt = cJSON_PrintUnformatted(line);
    cJSON_Delete(line);
    if (!txt) return dl_seterr(DL_ENOMEM, "%s: out of memory", w->path);
    fprintf(w->f, "%s\n", txt);
    free(txt);
    return flushed(w);
}

/* ---- read ---- */

void rundir_metrics_rec_free(rundir_metrics_rec_t *rec) {
    if (!rec) return;
    cJSON_Delete(rec->own_);
    memset(rec, 0, sizeof *rec);
}

int rundir_metrics_parse_line(const char *line, size_t len, rundir_metrics_rec_t *rec) {
    memset(rec, 0, sizeof *rec);
    while (len && (line[len - 1] == ' ' || line[len - 1] == '\t')) len--;
    cJSON *o = cJSON_ParseWithLength(line, len);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return dl_seterr(DL_EINVAL, "metrics line is not a JSON object");
    }
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "ts");
    const cJSON *stage = cJSON_GetObjectItemCaseSensitive(o, "stage");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "stage_id");
    const cJSON *inc = cJSON_GetObjectItemCaseSensitive(o, "incarnation");
    const cJSON *state = cJSON_GetObjectItemCaseSensitive(o, "state");
    if (!cJSON_IsNumber(ts) || !cJSON_IsString(stage) || !cJSON_IsString(state)) {
        cJSON_Delete(o);
        return dl_seterr(DL_EINVAL, "metrics line without ts/stage/state");
    }
    for (const cJSON *c = o->child; c && rec->n < RUNDIR_MAX_METRICS; c = c->next) {
        if (!c->string || c == ts || c == stage || c == id || c == inc || c == state) continue;
        if (cJSON_IsNumber(c)) rec->values[rec->n] = c->valuedouble;
        else if (cJSON_IsNull(c)) rec->values[rec->n] = NAN;
        else continue;                              /* strings etc.: not a metric */
        rec->names[rec->n++] = c->string;
    }
    rec->ts = ts->valuedouble;
    rec->stage = stage->valuestring;
    rec->state = state->valuestring;
    rec->stage_id = cJSON_IsNumber(id) && id->valuedouble >= 0 ? (uint32_t)id->valuedouble : 0;
    rec->incarnation = cJSON_IsNumber(inc) && inc->valuedouble >= 0 ? (uint64_t)inc->valuedouble : 1;
    rec->own_ = o;
    return 0;
}

double rundir_metrics_get(const rundir_metrics_rec_t *rec, const char *name) {
    for (int i = 0; i < rec->n; i++)
        if (!strcmp(rec->names[i], name)) return rec->values[i];
    return NAN;
}

const rundir_metrics_rec_t *rundir_metrics_find(const rundir_metrics_rec_t *recs, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (recs[i].stage && !strcmp(recs[i].stage, name)) return &recs[i];
    return NULL;
}

void rundir_metrics_latest_free(rundir_metrics_rec_t **recs, int n) {
    if (!recs || !*recs) return;
    for (int i = 0; i < n; i++) rundir_metrics_rec_free(&(*recs)[i]);
    free(*recs);
    *recs = NULL;
}

/* The last tail_bytes (0: all) of path, NUL-terminated, malloc'd; NULL when missing. */
static char *read_tail(const char *path, size_t tail_bytes, int *oom) {
    FILE *f = fopen(path, "rb");
    *oom = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    if (n < 0) n = 0;
    long from = tail_bytes && (size_t)n > tail_bytes ? n - (long)tail_bytes : 0;
    fseek(f, from, SEEK_SET);
    char *b = malloc((size_t)(n - from) + 1);
    size_t got = b ? fread(b, 1, (size_t)(n - from), f) : 0;
    fclose(f);
    if (!b) *oom = 1;
    else b[got] = 0;
    return b;
}

int rundir_metrics_latest(const char *dir, size_t tail_bytes, rundir_metrics_rec_t **recs, int *n) {
    *recs = NULL;
    *n = 0;
    char p[RUNDIR_PATH_MAX + 64];
    DL_TRY(rundir_path(p, sizeof p, dir, RUNDIR_METRICS));
    int oom;
    char *m = read_tail(p, tail_bytes, &oom);
    if (!m) return oom ? dl_seterr(DL_ENOMEM, "%s: out of memory", p) : 0;
    int cap = 0, rc = 0;
    char *save = NULL;
    /* the optimizer's last per-step line: it can come after its last periodic line (a
     * stopped optimizer sends no more periodic metrics), and then says more */
    struct { char stage[64]; double ts, step, loss; int have; } last_step = {.have = 0};
    for (char *l = strtok_r(m, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        rundir_metrics_rec_t x;
        if (rundir_metrics_parse_line(l, strlen(l), &x) < 0) {
            rundir_metrics_rec_free(&x);
            continue;
        }
        if (!strcmp(x.state, "step")) {
            double s = rundir_metrics_get(&x, "step");
            if (s == s && strlen(x.stage) < sizeof last_step.stage) {
                snprintf(last_step.stage, sizeof last_step.stage, "%s", x.stage);
                last_step.ts = x.ts, last_step.step = s, last_step.loss = rundir_metrics_get(&x, "loss");
                last_step.have = 1;
            }
            rundir_metrics_rec_free(&x);
            continue;
        }
        int k = 0;
        while (k < *n && strcmp((*recs)[k].stage, x.stage) != 0) k++;
        if (k == *n) {
            if (*n == cap) {
                int nc = cap ? 2 * cap : 16;
                rundir_metrics_rec_t *r = realloc(*recs, (size_t)nc * sizeof *r);
                if (!r) { rundir_metrics_rec_free(&x); rc = dl_seterr(DL_ENOMEM, "%s: out of memory", p); break; }
                *recs = r, cap = nc;
            }
            memset(&(*recs)[(*n)++], 0, sizeof **recs);
        }
        rundir_metrics_rec_free(&(*recs)[k]);
        (*recs)[k] = x;
    }
    free(m);
    /* a per-step line newer than the stage's periodic one: its count of applied steps
     * (step + 1, as a periodic line counts) and its loss replace the older figures */
    for (int k = 0; rc == 0 && last_step.have && k < *n; k++) {
        rundir_metrics_rec_t *x = &(*recs)[k];
        if (strcmp(x->stage, last_step.stage) != 0 || last_step.ts < x->ts) continue;
        for (int i = 0; i < x->n; i++) {
            if (!strcmp(x->names[i], "step") && last_step.step + 1 > x->values[i]) x->values[i] = last_step.step + 1;
            else if (!strcmp(x->names[i], "loss") && last_step.loss == last_step.loss) x->values[i] = last_step.loss;
        }
    }
    if (rc < 0) rundir_metrics_latest_free(recs, *n), *n = 0;
    return rc;
}
