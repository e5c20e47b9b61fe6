/* `draftline run` and its companions (status, rebalance) as a new user meets them, on
 * the tiny random Llama-shaped target of test_pipeline (made here) and 60 GSM8K samples:
 *
 *  - the supervisor killed with SIGKILL: its stages exit and unlink their own shared
 *    memory (nothing of the run is left in /dev/shm); `draftline status` says the
 *    supervisor is dead and shows no stage as running; `draftline rebalance` refuses at
 *    once (exit 1) and writes no request;
 *  - a later `draftline run` removes the shm objects of dead runs (unmapped, older than
 *    60 s) and keeps a young one; a stale rebalance.request is deleted, not applied;
 *    a dir whose run applied no step and saved no checkpoint is reused as fresh (and
 *    --resume of one starts fresh); a run stopped by SIGINT exits 130;
 *  - flags that need no data are checked before anything is written: --resume of a
 *    missing path, --resume of a live run, --inbox-gb 0 (no out dir created);
 *  - a run dir whose run.lock another process holds is refused (exit 1), not shared,
 *    before anything in it is deleted (the fresh reuse of a dir without steps);
 *  - a run whose final checkpoint cannot be written exits 1;
 *  - <out>/data.dlc prepared from other data is prepared again from --data, not reused;
 *  - a cache of another tokenizer than the target's is refused (exit 2);
 *  - a supervisor that holds ctl.sock but does not answer is not called dead or "not
 *    running": stop and rebalance exit 1 saying it does not answer.
 * Every child has a hard timeout and is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/base/rng.h"
#include "common/data/chat.h"
#include "common/data/prepare.h"
#include "common/data/tokenizer.h"
#include "common/mem/slab.h"
#include "common/model/config.h"
#include "common/format/safetensors.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static pf_fixture_t fx;

/* ---- fixtures (tests/support/pipeline_fixture) ---- */

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlrc", 60) < 0) return -1;
    proc_watchdog(120);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* ---- children ---- */

/* Fills a with `draftline run` + the tiny settings + extra (NULL-terminated) args. */
static void run_argv(pf_run_args_t *a, const char *log, const char *const *extra) {
    memset(a, 0, sizeof *a);
    int n = 0;
    a->argv[n++] = fx.exe;
    a->argv[n++] = "run";
    const char *fixed[] = {"--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                           "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                           "--drafter-layers", "1", "--lr", "3e-3", "--seed", "5",
                           "--progress-every", "1", "--threads", "1", NULL};
    for (int i = 0; fixed[i]; i++) a->argv[n++] = (char *)fixed[i];
    for (int i = 0; extra[i]; i++) a->argv[n++] = (char *)extra[i];
    a->argv[n] = NULL;
    snprintf(a->log, sizeof a->log, "%s", log);
}

/* Runs `draftline run` with the fixed flags plus extra (NULL-terminated), asserts its exit
 * code is `code` (timeout_s seconds at most, nothing of it left behind) and returns its
 * output (stdout + stderr, from log; the caller frees it). */
static char *run_expect(const char *log, const char *const *extra, int timeout_s, int code) {
    static pf_run_args_t a;
    run_argv(&a, log, extra);
    assert_int_equal(pf_run_draftline(&a, NULL, timeout_s, NULL), code);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    return txt;
}

static int run_tool(const char *log, char *const args[]) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    a.argv[0] = fx.exe;
    int n = 1;
    for (int i = 0; args[i]; i++) a.argv[n++] = args[i];
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    return pf_run_draftline(&a, NULL, 30, NULL);
}

static void run_id_of(const char *log, char *id) {
    id[0] = 0;
    FILE *f = fopen(log, "r");
    char line[2048];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "draftline run %16[0-9a-f]:", id) == 1) break;
    if (f) fclose(f);
}

/* Makes shm object /<name> of 4 KiB, with its mtime/ctime as they come (now). */
static void make_shm(const char *name) {
    char n[128];
    snprintf(n, sizeof n, "/%s", name);
    int fd = shm_open(n, O_CREAT | O_RDWR, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 4096), 0);
    close(fd);
}

/* ---- tests ---- */

/* kill -9 of the supervisor: no shm left, status says so, rebalance refuses. */
static void test_supervisor_killed(void **state) {
    (void)state;
    char out[400], log[500], p[600];
    snprintf(out, sizeof out, "%s/killed", fx.root);
    snprintf(log, sizeof log, "%s/killed.out", fx.root);
    static pf_run_args_t a;
    const char *extra[] = {"--out", out, "--max-steps", "400", "--save-every", "2", NULL};
    run_argv(&a, log, extra);
    proc_t run;
    assert_int_equal(proc_spawn(&run, "draftline run", pf_run_child, &a), 0);
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    for (int i = 0; i < 3000 && pf_count_lines(p) < 3; i++) usleep(10000);
    assert_true(pf_count_lines(p) >= 3);
    char id[17];
    run_id_of(log, id);
    assert_true(id[0] != 0);
    assert_true(slab_count(id) > 0);
    assert_int_equal(kill(run.pid, SIGKILL), 0);   /* the supervisor alone */
    int code = -1;
    assert_int_equal(proc_wait(&run, 5000, &code), 0);
    /* the stages see their parent die (SIGTERM), exit, and unlink their own slabs */
    int left = 1, shm = -1;
    for (int i = 0; i < 1500 && (left || shm != 0); i++) {
        left = kill(-run.pid, 0) == 0;
        shm = slab_count(id);
        usleep(10000);
    }
    proc_kill(&run);
    if (shm != 0 || left) {   /* say which stage left what */
        fprintf(stderr, "left %d shm %d\n", left, shm);
        if (system("ps -eo pid,pgid,stat,wchan:20,cmd | grep -E \"drafter_worker|optimizer |loader |target_worker\" | grep -v grep | cut -c1-120") != 0) {}
        char cmd[700];
        snprintf(cmd, sizeof cmd, "ls -l /dev/shm | grep 'dl-%s-'; tail -n 5 %s/logs/*.log", id, out);
        if (system(cmd) != 0) {}
    }
    slab_sweep(id);
    assert_false(left);
    assert_int_equal(shm, 0);
    /* status: dead supervisor, no stage running */
    char slog[500];
    snprintf(slog, sizeof slog, "%s/status.out", fx.root);
    char *sargs[] = {"status", "--run", out, NULL};
    assert_int_equal(run_tool(slog, sargs), 0);
    char *txt = pf_slurp(slog, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "is dead"));
    assert_non_null(strstr(txt, "not running: supervisor pid"));
    assert_non_null(strstr(txt, "optimizer  -              -"));
    assert_null(strstr(txt, "     running"));   /* no process column "running" */
    free(txt);
    /* rebalance: refused at once, no request written */
    char *rargs[] = {"rebalance", "--run", out, "--targets", "1", "--drafters", "1", "--wait", "20", NULL};
    time_t t0 = time(NULL);
    assert_int_equal(run_tool(slog, rargs), 1);
    assert_true(time(NULL) - t0 < 5);
    txt = pf_slurp(slog, NULL);
    assert_non_null(strstr(txt, "is not running"));
    free(txt);
    snprintf(p, sizeof p, "%s/rebalance.request", out);
    assert_int_not_equal(access(p, F_OK), 0);
}

/* Validation before anything is written; a live run is refused for --resume. */
static void test_validation_first(void **state) {
    (void)state;
    char cwd[400], log[500], runs[500];
    snprintf(cwd, sizeof cwd, "%s/cwd", fx.root);
    mkdir(cwd, 0700);
    snprintf(log, sizeof log, "%s/val.out", fx.root);
    snprintf(runs, sizeof runs, "%s/runs", cwd);
    static pf_run_args_t a;
    {   /* --resume of a missing path, no --out: nothing created in cwd */
        const char *extra[] = {"--resume", "/nonexistent/run", NULL};
        run_argv(&a, log, extra);
        snprintf(a.cwd, sizeof a.cwd, "%s", cwd);
        assert_int_equal(pf_run_draftline(&a, NULL, 30, NULL), 2);
        char *txt = pf_slurp(log, NULL);
        assert_non_null(strstr(txt, "--resume /nonexistent/run"));
        free(txt);
        assert_int_not_equal(access(runs, F_OK), 0);
    }
    {   /* --config DIR: named as a directory (libyaml said "--config DIR:1: input error") */
        const char *extra[] = {"--config", cwd, NULL};
        run_argv(&a, log, extra);
        assert_int_equal(pf_run_draftline(&a, NULL, 30, NULL), 2);
        char *txt = pf_slurp(log, NULL), want[500];
        snprintf(want, sizeof want, "--config %s: is a directory, not a YAML file", cwd);
        assert_non_null(strstr(txt, want));
        free(txt);
    }
    {   /* --max-len past the target's context (the embedded SmolLM2: 8192): refused like
         * generate/eval/regen, naming the flag and the limit; the out dir is not created */
        char out[500], gguf[1024];
        snprintf(out, sizeof out, "%s/pastctx", fx.root);
        assert_int_equal(paths_default_model(gguf, sizeof gguf), 0);
        const char *extra[] = {"--out", out, "--target-model", gguf, "--max-len", "10000", NULL};
        char *txt = run_expect(log, extra, 30, 2);
        assert_non_null(strstr(txt, "--max-len 10000 is past the context of"));
        assert_non_null(strstr(txt, "use --max-len <= 8192"));
        free(txt);
        assert_int_not_equal(access(out, F_OK), 0);
    }
    {   /* --inbox-gb 0: refused, the out dir is not created */
        char out[500];
        snprintf(out, sizeof out, "%s/noinbox", fx.root);
        const char *extra[] = {"--out", out, "--inbox-gb", "0", NULL};
        char *txt = run_expect(log, extra, 30, 2);
        assert_non_null(strstr(txt, "cannot hold one micro-batch"));
        free(txt);
        assert_int_not_equal(access(out, F_OK), 0);
    }
    {   /* --resume of a live run: "the run is live (supervisor pid N); stop it first" */
        char out[500], llog[500], p[600];
        snprintf(out, sizeof out, "%s/live", fx.root);
        snprintf(llog, sizeof llog, "%s/live.out", fx.root);
        static pf_run_args_t b;
        const char *extra[] = {"--out", out, "--max-steps", "400", "--save-every", "2", NULL};
        run_argv(&b, llog, extra);
        proc_t run;
        assert_int_equal(proc_spawn(&run, "draftline run", pf_run_child, &b), 0);
        snprintf(p, sizeof p, "%s/checkpoints/latest", out);
        for (int i = 0; i < 3000 && access(p, F_OK) != 0; i++) usleep(10000);
        assert_int_equal(access(p, F_OK), 0);
        const char *extra2[] = {"--out", out, "--resume", out, NULL};
        char *txt = run_expect(log, extra2, 30, 2);
        char want[100];
        snprintf(want, sizeof want, "the run is live (supervisor pid %d); stop it first", (int)run.pid);
        assert_non_null(strstr(txt, want));
        free(txt);
        /* Ctrl-C: final checkpoint, exit 130 */
        assert_int_equal(kill(run.pid, SIGINT), 0);
        int code = -1;
        assert_int_equal(proc_wait(&run, 30000, &code), 0);
        proc_kill(&run);
        assert_int_equal(code, 130);
        txt = pf_slurp(llog, NULL);
        assert_non_null(strstr(txt, "(interrupted)"));
        free(txt);
    }
}

/* A dir whose run applied no step is reused as fresh (also under --resume); a stale
 * rebalance request is removed; dead runs' shm objects are swept, young ones kept. */
static void test_fresh_reuse_and_sweeps(void **state) {
    (void)state;
    char out[400], log[500], p[600];
    snprintf(out, sizeof out, "%s/nostep", fx.root);
    snprintf(log, sizeof log, "%s/nostep.out", fx.root);
    mkdir(out, 0700);
    /* what Ctrl-C before the first step leaves: run.json of a dead supervisor, empty steps */
    snprintf(p, sizeof p, "%s/run.json", out);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"run_id\":\"0badc0de\",\"state\":\"running\",\"supervisor_pid\":999999,"
               "\"max_steps\":2}\n");
    fclose(f);
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(p, sizeof p, "%s/rebalance.request", out);
    f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"id\":\"rb-stale\",\"targets\":2,\"drafters\":1}\n");
    fclose(f);
    /* shm of a dead run (old) and of a run that just created its objects (young) */
    make_shm("dl-0ldd0ead-drafter0-1-ibg");
    struct timespec old[2] = {{time(NULL) - 600, 0}, {time(NULL) - 600, 0}};
    assert_int_equal(utimensat(AT_FDCWD, "/dev/shm/dl-0ldd0ead-drafter0-1-ibg", old, 0), 0);
    make_shm("dl-y0un9000-drafter0-1-ibg");
    static pf_run_args_t a;
    /* --max-steps not given: run.json's 2 is taken; the recipe settings not given now are
     * named with their default values (a checkpoint would have held the run's) */
    const char *extra[] = {"--out", out, "--resume", out, NULL};
    run_argv(&a, log, extra);
    int code = pf_run_draftline(&a, NULL, 60, NULL);
    char *txt = pf_slurp(log, NULL);
    if (code != 0) fprintf(stderr, "%s\n", txt);
    assert_int_equal(code, 0);
    assert_non_null(strstr(txt, "starting it fresh"));
    assert_non_null(strstr(txt, "--max-steps 2"));
    assert_non_null(strstr(txt, "these are the defaults"));
    assert_non_null(strstr(txt, "--max-len"));
    assert_non_null(strstr(txt, "--epochs"));
    assert_null(strstr(txt, "the run's own if they differ): --token-budget"));
    assert_non_null(strstr(txt, "stale"));
    assert_null(strstr(txt, "rebalance rb-stale"));
    free(txt);
    assert_int_not_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    assert_int_equal(pf_count_lines(p), 2);
    /* the dead run's object is gone, the young one (no mapping yet, < 60 s) is kept */
    int young = slab_count("y0un9000"), dead = slab_count("0ldd0ead");
    slab_sweep("y0un9000");
    slab_sweep("0ldd0ead");
    assert_int_equal(young, 1);
    assert_int_equal(dead, 0);
    /* the same dir now holds steps: a fresh run there is refused */
    snprintf(log, sizeof log, "%s/nostep2.out", fx.root);
    const char *extra2[] = {"--out", out, "--max-steps", "2", NULL};
    txt = run_expect(log, extra2, 30, 2);
    assert_non_null(strstr(txt, "holds a previous run"));
    free(txt);
}

/* One supervisor per run dir: while another process holds <out>/run.lock (what a
 * second `draftline run --out` started at the same moment meets), the run is refused
 * with exit 1 and a message naming the dir, instead of both runs stealing each other's
 * sockets and waiting forever, and before it deletes anything: the dir looks like one
 * left before its first step (reused as fresh: steps.jsonl, metrics.jsonl deleted), as
 * the other run's own new files do while it starts. Once the lock is free the same
 * command reuses it and trains. */
static void test_run_dir_lock(void **state) {
    (void)state;
    char out[400], log[500], p[600];
    snprintf(out, sizeof out, "%s/locked", fx.root);
    snprintf(log, sizeof log, "%s/locked.out", fx.root);
    assert_int_equal(mkdir(out, 0700), 0);
    snprintf(p, sizeof p, "%s/run.json", out);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"run_id\":\"0ther000\",\"state\":\"running\",\"supervisor_pid\":999999}\n");
    fclose(f);
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(p, sizeof p, "%s/metrics.jsonl", out);
    f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"stage\":\"other run\"}\n");
    fclose(f);
    snprintf(p, sizeof p, "%s/run.lock", out);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    static pf_run_args_t a;
    const char *extra[] = {"--out", out, "--max-steps", "2", NULL};
    run_argv(&a, log, extra);   /* kept in a: the same command runs again below */
    assert_int_equal(pf_run_draftline(&a, NULL, 30, NULL), 1);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(strstr(txt, "another `draftline run` is using this run dir"));
    assert_non_null(strstr(txt, out));
    free(txt);
    snprintf(p, sizeof p, "%s/metrics.jsonl", out);
    assert_int_equal(pf_count_lines(p), 1);   /* the lock holder's file is kept */
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    assert_int_equal(access(p, F_OK), 0);
    assert_int_equal(pf_count_lines(p), 0);
    close(fd);
    int code = pf_run_draftline(&a, NULL, 60, NULL);
    txt = pf_slurp(log, NULL);
    if (code != 0) fprintf(stderr, "%s\n", txt);
    free(txt);
    assert_int_equal(code, 0);
    assert_int_equal(pf_count_lines(p), 2);
}

/* A final checkpoint that cannot be written (here: checkpoints/latest.tmp is a
 * directory, so `latest` cannot be updated; on a real machine: a full disk) fails the
 * run (exit 1, naming the missing step) instead of exiting 0. */
static void test_final_checkpoint_unwritten(void **state) {
    (void)state;
    char out[400], log[500], p[600];
    snprintf(out, sizeof out, "%s/nockpt", fx.root);
    snprintf(log, sizeof log, "%s/nockpt.out", fx.root);
    assert_int_equal(mkdir(out, 0700), 0);
    snprintf(p, sizeof p, "%s/checkpoints", out);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/checkpoints/latest.tmp", out);
    assert_int_equal(mkdir(p, 0755), 0);
    const char *extra[] = {"--out", out, "--max-steps", "2", NULL};
    char *txt = run_expect(log, extra, 60, 1);
    assert_non_null(strstr(txt, "the final checkpoint (step_2) was not written"));
    free(txt);
}

/* `draftline stop` (SIGTERM) racing the end of a run: the supervisor is held
 * (SIGSTOP) until the optimizer has applied and logged the last of --max-steps 3, then
 * gets SIGTERM and goes on, so the signal and the last step's news wait together. A
 * run that applied all its steps reports a normal summary and exits 0, not
 * "(interrupted)" with 143 (whichever of the two the supervisor handles first). */
static void test_stop_racing_max_steps(void **state) {
    (void)state;
    char out[400], log[500], steps[600];
    snprintf(out, sizeof out, "%s/stoprace", fx.root);
    snprintf(log, sizeof log, "%s/stoprace.out", fx.root);
    snprintf(steps, sizeof steps, "%s/steps.jsonl", out);
    static pf_run_args_t a;
    const char *extra[] = {"--out", out, "--max-steps", "3", NULL};
    run_argv(&a, log, extra);
    proc_t run;
    assert_int_equal(proc_spawn(&run, "draftline run", pf_run_child, &a), 0);
    for (int i = 0; i < 6000 && pf_count_lines(steps) < 2; i++) usleep(10000);
    assert_int_equal(pf_count_lines(steps), 2);
    assert_int_equal(kill(run.pid, SIGSTOP), 0);
    for (int i = 0; i < 3000 && pf_count_lines(steps) < 3; i++) usleep(10000);
    int logged = pf_count_lines(steps);
    assert_int_equal(kill(run.pid, SIGTERM), 0);
    assert_int_equal(kill(run.pid, SIGCONT), 0);
    int code = -1;
    assert_int_equal(proc_wait(&run, 60000, &code), 0);
    proc_kill(&run);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    if (logged < 3) {   /* the pipeline waited for the held supervisor: a real interrupt */
        fprintf(stderr, "  (step 3 was not applied while the supervisor was held: interrupted run)\n");
        assert_int_equal(code, 143);
    } else {
        assert_int_equal(code, 0);
        assert_null(strstr(txt, "(interrupted)"));
    }
    free(txt);
}

/* <out>/data.dlc is reused only when it was prepared from the same --data: a dir that
 * holds a cache of other data (here the 60 GSM8K samples, with no record of its source)
 * gets --data prepared again (7 samples), instead of silently training on the old one. */
/* Data that cannot be used, an --out that cannot be a run dir and a --resume of a file are
 * refused before anything starts: exit 2 (run --help's "refused"), naming the file and what
 * to do. */
static void test_refused_data_and_out(void **state) {
    (void)state;
    char out[400], log[500], trunc[500];
    snprintf(out, sizeof out, "%s/truncdata", fx.root);
    snprintf(log, sizeof log, "%s/truncdata.out", fx.root);
    snprintf(trunc, sizeof trunc, "%s/trunc.dlc", fx.root);
    FILE *in = fopen(fx.cache, "rb"), *o = fopen(trunc, "wb");
    assert_non_null(in);
    assert_non_null(o);
    char buf[4096];
    size_t k = fread(buf, 1, sizeof buf, in);   /* the header and a little more */
    assert_true(k > 512);
    assert_int_equal(fwrite(buf, 1, k, o), k);
    fclose(in);
    fclose(o);
    const char *extra[] = {"--out", out, "--data", trunc, "--max-steps", "1", NULL};
    char *txt = run_expect(log, extra, 30, 2);
    assert_non_null(strstr(txt, "trunc.dlc"));
    assert_non_null(strstr(txt, "truncated or corrupt"));
    free(txt);
    /* --out is a regular file */
    const char *extra2[] = {"--out", trunc, "--max-steps", "1", NULL};
    txt = run_expect(log, extra2, 30, 2);
    assert_non_null(strstr(txt, "--out"));
    free(txt);
    /* --resume of a file */
    const char *extra3[] = {"--resume", trunc, NULL};
    txt = run_expect(log, extra3, 30, 2);
    assert_non_null(strstr(txt, "a file, not a run dir or a checkpoint dir"));
    free(txt);
}

static void test_data_cache_source(void **state) {
    (void)state;
    char out[400], log[500], p[600], data[500], gguf[1024];
    assert_int_equal(paths_default_model(gguf, sizeof gguf), 0);
    snprintf(out, sizeof out, "%s/srcchk", fx.root);
    snprintf(log, sizeof log, "%s/srcchk.out", fx.root);
    snprintf(data, sizeof data, "%s/seven.jsonl", fx.root);
    assert_int_equal(mkdir(out, 0700), 0);
    {   /* the other data's cache, as a dir reused as fresh may hold it */
        FILE *in = fopen(fx.cache, "rb");
        assert_non_null(in);
        snprintf(p, sizeof p, "%s/data.dlc", out);
        FILE *o = fopen(p, "wb");
        assert_non_null(o);
        char buf[65536];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, k, o), k);
        fclose(in);
        fclose(o);
    }
    FILE *f = fopen(data, "w");
    assert_non_null(f);
    for (int i = 0; i < 7; i++) fprintf(f, "{\"text\": \"sample %d: the quick brown fox jumps over the lazy dog\"}\n", i);
    fclose(f);
    static pf_run_args_t a;
    const char *extra[] = {"--out", out, "--data", data, "--target-model", gguf, "--max-steps", "1", NULL};
    run_argv(&a, log, extra);
    int code = pf_run_draftline(&a, NULL, 90, NULL);
    char *txt = pf_slurp(log, NULL);
    if (code != 0) fprintf(stderr, "%s\n", txt);
    assert_int_equal(code, 0);
    assert_non_null(strstr(txt, "preparing it again"));
    free(txt);
    dlc_t *c = NULL;
    snprintf(p, sizeof p, "%s/data.dlc", out);
    assert_int_equal(dlc_open(p, &c), 0);
    assert_int_equal(dlc_n_samples(c), 7);
    dlc_close(&c);
}

/* A cache prepared with another tokenizer (the qwen3-style fixture, 3012 tokens) than the
 * target's (the embedded SmolLM2, 49152) is refused (exit 2) before any stage starts,
 * instead of training on ids that mean other tokens. */
static void test_cache_of_another_tokenizer(void **state) {
    (void)state;
    char out[400], log[500], other[500], gguf[1024], tj[600];
    assert_int_equal(paths_default_model(gguf, sizeof gguf), 0);
    const char *fxd = getenv("DL_FIXTURES_DIR");
    snprintf(tj, sizeof tj, "%s/tokenizer/qwen3_style/tokenizer.json", fxd ? fxd : "tests/fixtures");
    if (access(tj, R_OK) != 0) { fprintf(stderr, "skip: %s absent\n", tj); skip(); }
    snprintf(out, sizeof out, "%s/othertok", fx.root);
    snprintf(log, sizeof log, "%s/othertok.out", fx.root);
    snprintf(other, sizeof other, "%s/othertok.dlc", fx.root);
    char src[500];
    snprintf(src, sizeof src, "%s/othertok.jsonl", fx.root);
    FILE *f = fopen(src, "w");
    assert_non_null(f);
    for (int i = 0; i < 4; i++) fprintf(f, "{\"text\": \"sample %d of another tokenizer\"}\n", i);
    fclose(f);
    tok_t *t = NULL;
    assert_int_equal(tok_load(tj, &t), 0);
    chat_template_t ct;
    assert_int_equal(chat_template_by_name("chatml", &ct), 0);
    prep_opts_t po = {.data_path = src, .out_path = other, .chat = &ct, .n_threads = 1};
    prep_stats_t st;
    assert_int_equal(prep_run(t, &po, &st), 0);
    tok_destroy(&t);
    const char *extra[] = {"--out", out, "--data", other, "--target-model", gguf, "--max-steps", "1", NULL};
    char *txt = run_expect(log, extra, 60, 2);
    assert_non_null(strstr(txt, "prepared with another tokenizer"));
    free(txt);
    char p[600];
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    assert_int_equal(pf_count_lines(p), 0);
}

/* A supervisor that holds its control socket but does not answer (stopped, hung): a
 * listening socket nobody accepts on stands for it. `stop` and `rebalance` say it does
 * not answer and exit 1 (not "is not running", exit 0), `status` does not call it dead. */
static void test_ctl_silent(void **state) {
    (void)state;
    char dir[500], p[600], log[600];
    snprintf(dir, sizeof dir, "%s/silent", fx.root);
    mkdir(dir, 0700);
    snprintf(p, sizeof p, "%s/run.json", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"run_id\": \"5113e47\", \"state\": \"running\", \"supervisor_pid\": %d}\n", (int)getpid());
    fclose(f);
    snprintf(p, sizeof p, "%s/ctl.sock", dir);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    assert_true(strlen(p) < sizeof a.sun_path);
    memcpy(a.sun_path, p, strlen(p) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 16), 0);
    snprintf(log, sizeof log, "%s/silent.out", fx.root);
    char *kargs[] = {"stop", "--run", dir, NULL};
    assert_int_equal(run_tool(log, kargs), 1);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(strstr(txt, "does not answer on its control socket"));
    assert_null(strstr(txt, "is not running"));
    free(txt);
    char *rargs[] = {"rebalance", "--run", dir, "--targets", "1", "--drafters", "1", NULL};
    assert_int_equal(run_tool(log, rargs), 1);
    txt = pf_slurp(log, NULL);
    assert_non_null(strstr(txt, "does not answer on its control socket"));
    free(txt);
    char *sargs[] = {"status", "--run", dir, NULL};
    assert_int_equal(run_tool(log, sargs), 0);
    txt = pf_slurp(log, NULL);
    assert_non_null(strstr(txt, "does not answer on its control socket"));
    assert_null(strstr(txt, "is dead"));
    free(txt);
    close(fd);
}

/* status and stop on a dir whose run.json is not a run's: exit 1, the reader's own error (file
 * and key) and the dir named, not a bare "missing or malformed". */
static void test_status_stop_bad_run_json(void **state) {
    (void)state;
    char dir[400], p[500], log[500];
    snprintf(dir, sizeof dir, "%s/badrun", fx.root);
    mkdir(dir, 0700);
    snprintf(p, sizeof p, "%s/run.json", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("{\"stages\": 3}\n", f);
    fclose(f);
    snprintf(log, sizeof log, "%s/badrun.out", fx.root);
    const char *cmds[] = {"status", "stop"};
    for (int i = 0; i < 2; i++) {
        char *args[] = {(char *)cmds[i], "--run", dir, NULL};
        assert_int_equal(run_tool(log, args), 1);
        char *txt = pf_slurp(log, NULL);
        assert_non_null(txt);
        assert_non_null(strstr(txt, "run.json: key 'stages'"));
        assert_non_null(strstr(txt, "a draftline run dir?"));
        free(txt);
    }
}

/* A stage started without a supervisor (or one that never answers its config request) gives
 * up after its wait with a clear error naming the endpoint, exit 1, instead of hanging
 * (the wait is cut to 0.5 s by the config_timeout_ms test hook; 30 s otherwise). */
static void test_stage_without_supervisor(void **state) {
    (void)state;
    char dir[300], exe[1200], log[360];
    snprintf(dir, sizeof dir, "%s/nosup", fx.root);
    mkdir(dir, 0700);
    snprintf(exe, sizeof exe, "%s/optimizer", fx.bin);
    snprintf(log, sizeof log, "%s/nosup.out", fx.root);
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    char *argv[] = {exe, "--run-dir", dir, "--incarnation", "1", NULL};
    for (int i = 0; argv[i]; i++) a.argv[i] = argv[i];
    snprintf(a.log, sizeof a.log, "%s", log);
    setenv("DL_TEST_HOOKS", "config_timeout_ms=500", 1);
    int code = pf_run_draftline(&a, NULL, 20, NULL);
    unsetenv("DL_TEST_HOOKS");
    assert_int_equal(code, 1);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "no run configuration from the supervisor"));
    assert_non_null(strstr(txt, "within 0.5 s"));
    assert_non_null(strstr(txt, "/sup.sock"));
    free(txt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_supervisor_killed),
        cmocka_unit_test(test_validation_first),
        cmocka_unit_test(test_fresh_reuse_and_sweeps),
        cmocka_unit_test(test_run_dir_lock),
        cmocka_unit_test(test_final_checkpoint_unwritten),
        cmocka_unit_test(test_refused_data_and_out),
        cmocka_unit_test(test_data_cache_source),
        cmocka_unit_test(test_cache_of_another_tokenizer),
        cmocka_unit_test(test_stop_racing_max_steps),
        cmocka_unit_test(test_ctl_silent),
        cmocka_unit_test(test_status_stop_bad_run_json),
        cmocka_unit_test(test_stage_without_supervisor),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
