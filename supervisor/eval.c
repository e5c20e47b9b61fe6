/* Supervisor, the training-time eval child (see sup_opts_t.eval_data). */
#include "supervisor/sup_int.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- training-time eval (see sup_opts_t.eval_data) ---- */

/* The step of <out>/checkpoints/latest ("step_<S>"), or 0 when there is none. */
uint64_t sup__ev_latest_step(const sup_t *S) {
    uint64_t st = 0;
    return rundir_latest_read(S->o->out_dir, NULL, 0, &st) == 1 ? st : 0;
}

static void ev_spawn(sup_t *S, uint64_t step) {
    const sup_opts_t *o = S->o;
    char exe[4200], ckpt[4200], dir[4200], log_path[4200];
    char np[16], mnt[16], thr[16];
    snprintf(exe, sizeof exe, "%s/draftline", o->bin_dir);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step_%llu", o->out_dir, (unsigned long long)step);
    snprintf(dir, sizeof dir, "%s/eval", o->out_dir);
    snprintf(S->ev.json, sizeof S->ev.json, "%s/step_%llu.json", dir, (unsigned long long)step);
    snprintf(log_path, sizeof log_path, "%s/logs/eval.log", o->out_dir);
    snprintf(np, sizeof np, "%d", o->eval_prompts);
    snprintf(mnt, sizeof mnt, "%d", o->eval_max_new_tokens);
    snprintf(thr, sizeof thr, "%d", o->threads_per_stage > 0 ? o->threads_per_stage : 1);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) { log_warn("eval: mkdir %s: %s", dir, strerror(errno)); return; }
    unlink(S->ev.json);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) { log_warn("eval: fork: %s", strerror(errno)); return; }
    if (pid == 0) {
        sup__child_setup(parent, SIGTERM, log_path, o->threads_per_stage);
        char *argv[] = {exe, "eval", "--target-model", (char *)o->target_model, "--drafter", ckpt,
                        "--data", (char *)o->eval_data, "--num-prompts", np, "--max-new-tokens", mnt,
                        "--no-baseline", "--json", S->ev.json, "--device", "cpu", "--threads", thr, NULL};
        execv(exe, argv);
        fprintf(stderr, "exec %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    S->ev.pid = pid;
    S->ev.step = step;
    S->ev.t0 = clock_mono_s();
    log_info("eval of step %llu started (pid %d), log %s", (unsigned long long)step, (int)pid, log_path);
}

/* Polled every tick while the run is not stopping: when checkpoints/latest moved
 * from step A to B, the newest checkpoint step_<S> with A < S <= B and S a multiple
 * of eval_every (B itself, or one written between two ticks) starts an eval, unless
 * one is running (then it is skipped). */
void sup__ev_poll(sup_t *S) {
    if (!S->o->eval_data || S->o->eval_every < 1) return;
    uint64_t latest = sup__ev_latest_step(S), prev = S->ev.last_ckpt;
    if (latest == 0 || latest <= prev) return;
    S->ev.last_ckpt = latest;
    uint64_t step = latest - latest % (uint64_t)S->o->eval_every;
    if (step == 0 || step <= prev) return;
    char dir[4200];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s/checkpoints/step_%llu", S->o->out_dir, (unsigned long long)step);
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return;
    if (S->ev.pid > 0) {
        log_warn("eval: skipping the checkpoint of step %llu: the eval of step %llu is still running",
                 (unsigned long long)step, (unsigned long long)S->ev.step);
        return;
    }
    ev_spawn(S, step);
}

/* The eval child exited (status from waitpid): its report goes to metrics.jsonl. */
void sup__ev_done(sup_t *S, int status) {
    double secs = clock_mono_s() - S->ev.t0;
    uint64_t step = S->ev.step;
    S->ev.pid = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (S->stopping && WIFSIGNALED(status)) log_info("eval of step %llu stopped with the run", (unsigned long long)step);
        else log_warn("eval of step %llu failed (%s %d); see %s/logs/eval.log", (unsigned long long)step,
                      WIFEXITED(status) ? "status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                      S->o->out_dir);
        return;
    }
    char buf[16384];
    FILE *f = fopen(S->ev.json, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    cJSON *r = cJSON_Parse(buf);
    const cJSON *tau = r ? cJSON_GetObjectItemCaseSensitive(r, "tau") : NULL;
    if (!cJSON_IsNumber(tau)) {
        log_warn("eval of step %llu: no tau in %s", (unsigned long long)step, S->ev.json);
        cJSON_Delete(r);
        return;
    }
    const char *names[64];
    double values[64];
    int nv = 0;
    for (const cJSON *c = r->child; c && nv < 64; c = c->next)   /* the report's scalars */
        if (cJSON_IsNumber(c) && c->string) names[nv] = c->string, values[nv++] = c->valuedouble;
    if (S->metrics && rundir_metrics_append_eval(S->metrics, clock_wall_s(), step, secs, names, values, nv) < 0)
        log_warn("%s", dl_errmsg());
    printf("eval step %llu: tau %.3f (%d prompts, %.1f s)\n", (unsigned long long)step, tau->valuedouble,
           S->o->eval_prompts, secs);
    fflush(stdout);
    cJSON_Delete(r);
}
