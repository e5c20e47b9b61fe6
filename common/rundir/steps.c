/* <run>/steps.jsonl (the optimizer's ledger of applied steps) and
 * <run>/checkpoints/latest: see rundir.h. */
#include "common/rundir/rundir.h"
#include "common/base/err.h"
#include "common/base/log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct rundir_steps {
    FILE *f;
    char path[RUNDIR_PATH_MAX + 64];
    double t_base;      /* "t" of the last line kept by the rewind: where this writer's t starts */
    int torn;           /* the last append failed (disk full): part of its line may be in the
                         * file, so the next line starts with a newline to end that fragment */
};

/* A resumed optimizer undoes every step from `step` on: their lines leave the file
 * (rewritten to a .tmp and renamed), so the log is the ledger of the weights' actual
 * history, each step once. Lines that do not parse are kept. */
static void steps_rewind(const char *path, uint64_t step, double *t_last) {
    FILE *in = fopen(path, "r");
    if (!in) return;
    char tmp[RUNDIR_PATH_MAX + 80];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) { fclose(in); return; }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    uint64_t dropped = 0;
    while ((n = getline(&line, &cap, in)) > 0) {
        unsigned long long s;
        if (line[n - 1] != '\n') { dropped++; continue; }  /* torn last line of a killed writer */
        if (sscanf(line, "{\"step\":%llu", &s) == 1 && s >= step) { dropped++; continue; }
        fputs(line, out);
        const char *tk = strstr(line, "\"t\":");
        double t;
        if (tk && sscanf(tk + 4, "%lf", &t) == 1 && isfinite(t) && t >= 0) *t_last = t;
    }
    free(line);
    fclose(in);
    if (fclose(out) == 0 && rename(tmp, path) == 0) {
        if (dropped) log_info("steps.jsonl: %llu line(s) of undone steps (>= %llu) removed",
                              (unsigned long long)dropped, (unsigned long long)step);
    } else {
        unlink(tmp);
    }
}

rundir_steps_t *rundir_steps_open(const char *dir, int64_t rewind_from) {
    rundir_steps_t *w = calloc(1, sizeof *w);
    if (!w) { dl_seterr(DL_ENOMEM, "steps.jsonl: out of memory"); return NULL; }
    if (rundir_path(w->path, sizeof w->path, dir, RUNDIR_STEPS) < 0) { free(w); return NULL; }
    if (rewind_from >= 0) steps_rewind(w->path, (uint64_t)rewind_from, &w->t_base);
    w->f = fopen(w->path, "a");
    if (!w->f) {
        dl_seterr(DL_EIO, "%s: %s", w->path, strerror(errno));
        free(w);
        return NULL;
    }
    return w;
}

void rundir_steps_close(rundir_steps_t **w) {
    if (!w || !*w) return;
    fclose((*w)->f);
    free(*w);
    *w = NULL;
}

int rundir_steps_append(rundir_steps_t *w, const rundir_step_t *s) {
    return rundir_steps_append_ck(w, s, NULL);
}

int rundir_steps_append_ck(rundir_steps_t *w, const rundir_step_t *s, const rundir_step_ckpt_t *c) {
    char ls[32], gs[32]; /* JSON has no NaN: null */
    snprintf(ls, sizeof ls, isfinite(s->loss) ? "%.9g" : "null", s->loss);
    snprintf(gs, sizeof gs, isfinite(s->grad_norm) ? "%.9g" : "null", s->grad_norm);
    char ck[160] = "";
    if (c)
        snprintf(ck, sizeof ck, ",\"ckpt_step\":%llu,\"ckpt_waited_s\":%.3f,\"ckpt_snapshot_s\":%.3f,\"ckpt_write_s\":%.3f",
                 (unsigned long long)c->step, c->waited_s, c->snap_s, c->write_s);
    /* one formatted line, one write: a failed append (disk full) drops its leftovers from
     * the stdio buffer, so they cannot glue onto the next line ("{{..." seen on an H200
     * whose disk filled), and the next line first ends any fragment that reached the file */
    char line[640];
    int n = snprintf(line, sizeof line, "%s{\"step\":%llu,\"loss\":%s,\"grad_norm\":%s,\"lr\":%.9g,"
                     "\"tokens\":%llu,\"skipped\":%d,\"acc_mean\":%.6f,\"t\":%.3f%s}\n",
                     w->torn ? "\n" : "", (unsigned long long)s->step, ls, gs, s->lr,
                     (unsigned long long)s->tokens, s->skipped, s->acc_mean, w->t_base + s->t, ck);
    if (n < 0 || (size_t)n >= sizeof line) return dl_seterr(DL_EINVAL, "%s: line too long", w->path);
    if (fwrite(line, 1, (size_t)n, w->f) != (size_t)n || fflush(w->f) != 0 || ferror(w->f)) {
        int e = errno;
        __fpurge(w->f);
        clearerr(w->f);
        w->torn = 1;
        return dl_seterr(DL_EIO, "%s: %s", w->path, strerror(e));
    }
    w->torn = 0;
    return 0;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(c) ? c->valuedouble : NAN;
}

int rundir_steps_parse_line(const char *line, size_t len, rundir_step_rec_t *rec) {
    rec->step = rec->loss = rec->grad_norm = rec->lr = rec->tokens = rec->skipped = NAN;
    rec->acc_mean = rec->t = NAN;
    for (int i = 0; i < RUNDIR_MAX_ACC; i++) rec->acc[i] = NAN;
    while (len && (line[len - 1] == ' ' || line[len - 1] == '\t')) len--;
    cJSON *o = cJSON_ParseWithLength(line, len);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return dl_seterr(DL_EINVAL, "steps line is not a JSON object");
    }
    rec->step = num(o, "step");
    rec->loss = num(o, "loss");
    rec->grad_norm = num(o, "grad_norm");
    rec->lr = num(o, "lr");
    rec->tokens = num(o, "tokens");
    rec->skipped = num(o, "skipped");
    rec->acc_mean = num(o, "acc_mean");
    rec->t = num(o, "t");
    char k[16];
    for (int pos = 1; pos < RUNDIR_MAX_ACC; pos++) {    /* per-position accuracies if present */
        snprintf(k, sizeof k, "acc_%d", pos);
        rec->acc[pos] = num(o, k);
    }
    cJSON_Delete(o);
    return 0;
}

int rundir_latest_read(const char *dir, char *name, size_t cap, uint64_t *step) {
    char p[RUNDIR_PATH_MAX + 64], buf[128] = "";
    DL_TRY(rundir_path(p, sizeof p, dir, RUNDIR_LATEST));
    if (step) *step = 0;
    if (name && cap) name[0] = 0;
    FILE *f = fopen(p, "r");
    if (!f) return dl_seterr(DL_ENOENT, "%s: %s", p, strerror(errno));
    char *got = fgets(buf, sizeof buf, f);
    fclose(f);
    if (!got) return dl_seterr(DL_ENOENT, "%s: empty", p);
    buf[strcspn(buf, "\r\n")] = 0;
    if (name && cap) snprintf(name, cap, "%s", buf);
    unsigned long long s = 0;
    if (sscanf(buf, "step_%llu", &s) != 1) return 0;
    if (step) *step = (uint64_t)s;
    return 1;
}

int rundir_latest_write(const char *checkpoints, uint64_t step) {
    char latest[RUNDIR_PATH_MAX + 16], tmp[RUNDIR_PATH_MAX + 32];
    int n = snprintf(latest, sizeof latest, "%s/latest", checkpoints);
    if (n < 0 || (size_t)n >= sizeof latest) return dl_seterr(DL_ERANGE, "%s/latest: path too long", checkpoints);
    snprintf(tmp, sizeof tmp, "%s.tmp", latest);
    FILE *f = fopen(tmp, "wb");
    if (!f) return dl_seterr(DL_EIO, "open %s: %s", tmp, strerror(errno));
    int ok = fprintf(f, "step_%llu\n", (unsigned long long)step) > 0;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0) ok = 0;
    if (!ok) return dl_seterr(DL_EIO, "write %s: %s", tmp, strerror(errno));
    if (rename(tmp, latest) != 0) return dl_seterr(DL_EIO, "rename %s: %s", tmp, strerror(errno));
    int fd = open(checkpoints, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) { fsync(fd); close(fd); }
    return 0;
}
