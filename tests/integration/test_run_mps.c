/* `draftline run --mps` (supervisor/mps.c): CUDA MPS for a target and a drafter that share a
 * GPU. Without a GPU this checks everything around the daemon:
 *  - the refusals, before anything starts: a malformed GPU list (said what is wrong with
 *    it); --mps with a value other than auto/on/off;
 *    --mps on in a CPU run; and in CUDA builds --mps on where no GPU runs both a target and
 *    a drafter, and --mps on without nvidia-cuda-mps-control on PATH;
 *  - (CUDA builds, no GPU present) the daemon's life cycle with a stand-in
 *    nvidia-cuda-mps-control on PATH that records its calls: `-d` with the private pipe
 *    dir (/tmp/draftline-mps-*) and the log dir <out>/logs/mps in its environment, then the
 *    context check fails (no GPU), so --mps on ends the run with exit 1 naming it, `quit`
 *    goes to the same daemon, and the pipe dir is gone;
 *  - (the same) a control program that hangs on -d: ended after the bound (test hook
 *    mps.timeout_s=2) with its process group, the run failing with the reason, quit sent,
 *    and with a relative --out the log dir given to it is absolute;
 *  - --gpu-turns with another value than on/off is refused; it is recorded in run.json
 *    ("gpu_turns") and `run --resume` takes it unless given;
 *  - the pipeline takes --gpu-turns turns on CPU stages (test hook gpu_turns.cpu=1): the run
 *    ends with the losses of the run without turns, bitwise (--deterministic), and `status`
 *    says each stage's waits for the turns; turned off, the hook changes nothing;
 *  - --mps is recorded in run.json ("mps") and `run --resume` takes it unless given (said
 *    in its "taken from" line); a given --mps wins; a recorded "on" where MPS cannot be
 *    (hand-edited, a CPU run) is refused naming run.json;
 *  - (CUDA builds) a GPU shared by a target and a drafter without MPS: the run says how the
 *    stages share it (taking turns, or time-sliced with --gpu-turns off); not without a
 *    shared GPU, or with a user's CUDA_MPS_PIPE_DIRECTORY;
 *  - `run --resume` without a placement flag takes the run's placement (CPU counts, GPU
 *    lists) from run.json, said in the same line; a given placement flag wins (said); a
 *    placement draftline does not write, or a multi-node run's, is refused; (CUDA builds,
 *    no GPU) the taken GPUs are warned about, and the stages' "no CUDA device" ends the run
 *    at once (a permanent start-up error: not restarted).
 * That MPS makes a shared GPU faster is a benchmark (bench/NOTES.md), not asserted here.
 * Hard timeout per run; each run's process group is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"
#include "common/rundir/rundir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlmps", 40) < 0) return -1;
    proc_watchdog(200);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* `draftline run` on the fixture with the extra args (NULL-terminated), its output in log;
 * returns pf_run_draftline's code. */
static int run(const char *out, const char *log, ...) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    int n = 0;
    a.argv[n++] = fx.exe;
    a.argv[n++] = "run";
    const char *fixed[] = {"--target-model", fx.model_dir, "--data", fx.cache, "--token-budget", "256",
                           "--block-size", "4", "--num-anchors", "8", "--drafter-layers", "1",
                           "--max-steps", "2", "--out", out, NULL};
    for (int i = 0; fixed[i]; i++) a.argv[n++] = (char *)fixed[i];
    va_list ap;
    va_start(ap, log);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;) a.argv[n++] = (char *)s;
    va_end(ap);
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    char id[17];
    return pf_run_draftline(&a, out, 60, id);
}

/* `draftline run` with exactly the args (NULL-terminated) after "run", output in log. */
static int run_only(const char *log, ...) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    int n = 0;
    a.argv[n++] = fx.exe;
    a.argv[n++] = "run";
    va_list ap;
    va_start(ap, log);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;) a.argv[n++] = (char *)s;
    va_end(ap);
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    return pf_run_draftline(&a, NULL, 60, NULL);
}

/* The run's output contains want (printed when not). */
static void said(const char *log, const char *want) {
    size_t len;
    char *txt = pf_slurp(log, &len);
    assert_non_null(txt);
    if (!strstr(txt, want)) fprintf(stderr, "expected \"%s\" in:\n%s\n", want, txt);
    assert_non_null(strstr(txt, want));
    free(txt);
}

#ifdef DL_CUDA   /* the stand-in daemon's helpers: its tests need a CUDA build */
/* setenv(name, value) (value NULL: unset); returns the old value (caller: env_back). */
static char *env_swap(const char *name, const char *value) {
    char *old = getenv(name) ? strdup(getenv(name)) : NULL;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
    return old;
}
static void env_back(const char *name, char *old) {
    if (old) setenv(name, old, 1);
    else unsetenv(name);
    free(old);
}

/* A stand-in nvidia-cuda-mps-control, the shell script body, in fx.root/sub; returns the
 * old PATH (env_back) after putting that dir first, before /usr/bin:/bin only. */
static char *stand_in(const char *sub, const char *body) {
    char dir[400], ctl[500], path[1500];
    snprintf(dir, sizeof dir, "%s/%s", fx.root, sub);
    snprintf(ctl, sizeof ctl, "%s/nvidia-cuda-mps-control", dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    FILE *f = fopen(ctl, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\n%s", body);
    fclose(f);
    assert_int_equal(chmod(ctl, 0755), 0);
    snprintf(path, sizeof path, "%s:/usr/bin:/bin", dir);
    return env_swap("PATH", path);
}

/* The stand-in's record of its calls (caller frees), printed. */
static char *calls_of(const char *rec) {
    size_t len;
    char *calls = pf_slurp(rec, &len);
    assert_non_null(calls);
    fprintf(stderr, "stand-in daemon calls:\n%s", calls);
    return calls;
}
#endif

static void test_refusals(void **state) {
    (void)state;
    char out[400], log[400];
    snprintf(out, sizeof out, "%s/r", fx.root);
    snprintf(log, sizeof log, "%s/r.out", fx.root);
    assert_int_equal(run(out, log, "--device", "cpu", "--mps", "sometimes", NULL), 2);
    said(log, "--mps sometimes: expected auto, on or off");
    assert_int_equal(run(out, log, "--device", "cpu", "--mps", "on", NULL), 2);
    said(log, "--mps on: it is for GPU runs");
    assert_int_equal(run(out, log, "--device", "cpu", "--gpu-turns", "sometimes", NULL), 2);
    said(log, "--gpu-turns sometimes: expected on or off");
    /* a malformed GPU list is refused saying what is wrong with it (a --config list joins
     * to the same text: [] is the empty list) */
    assert_int_equal(run(out, log, "--target-gpus", "", "--drafter-gpus", "0", NULL), 2);
    said(log, "--target-gpus: empty GPU list (give CUDA ordinals such as 0,0,1)");
    assert_int_equal(run(out, log, "--target-gpus", "0", "--drafter-gpus", "0,,1", NULL), 2);
    said(log, "--drafter-gpus '0,,1': entry 1 is empty");
    assert_int_equal(run(out, log, "--target-gpus", "0,2000", "--drafter-gpus", "0", NULL), 2);
    said(log, "--target-gpus '0,2000': GPU 2000 is out of range 0..1023");
    struct stat st;
    assert_int_not_equal(stat(out, &st), 0);   /* refused before the run dir was made */
#ifdef DL_CUDA
    assert_int_equal(run(out, log, "--target-gpus", "0", "--drafter-gpus", "1", "--mps", "on", NULL), 2);
    said(log, "--mps on: no GPU of this host runs both a target and a drafter");
    char *path = env_swap("PATH", "/usr/bin:/bin");
    int code = run(out, log, "--target-gpus", "0", "--drafter-gpus", "0", "--mps", "on", NULL);
    env_back("PATH", path);
    assert_int_equal(code, 2);
    said(log, "--mps on: nvidia-cuda-mps-control is not on PATH");
#endif
}

/* --mps in run.json and --resume (CPU runs: --mps auto is recorded as asked; it starts
 * nothing without a GPU that a target and a drafter share). */
static void test_resume_takes_mps(void **state) {
    (void)state;
    char out[400], log[400], rj[500];
    snprintf(out, sizeof out, "%s/res", fx.root);
    snprintf(log, sizeof log, "%s/res.out", fx.root);
    snprintf(rj, sizeof rj, "%s/run.json", out);
    assert_int_equal(run(out, log, "--device", "cpu", "--threads", "1", "--mps", "auto", NULL), 0);
    assert_int_equal(pf_count_in(rj, "\"mps\":\t\"auto\""), 1);
    /* not given: the run's, said among the settings taken */
    assert_int_equal(run_only(log, "--resume", out, "--device", "cpu", "--threads", "1", "--max-steps", "3",
                              NULL), 0);
    said(log, "not given, so taken from the checkpoint and its run:");
    said(log, " --mps auto");
    assert_int_equal(pf_count_in(rj, "\"mps\":\t\"auto\""), 1);
    /* given: it wins (and is recorded) */
    assert_int_equal(run_only(log, "--resume", out, "--device", "cpu", "--threads", "1", "--max-steps", "4",
                              "--mps", "off", NULL), 0);
    assert_int_equal(pf_count_in(log, " --mps "), 0);
    assert_int_equal(pf_count_in(rj, "\"mps\":\t\"off\""), 1);
    /* a recorded "on" (hand-edited) in a CPU run: refused, naming where it came from */
    char *txt = pf_slurp(rj, NULL);
    assert_non_null(txt);
    char *at = strstr(txt, "\"mps\":\t\"off\"");
    assert_non_null(at);
    FILE *f = fopen(rj, "w");
    assert_non_null(f);
    fprintf(f, "%.*s\"mps\":\t\"on\"%s", (int)(at - txt), txt, at + strlen("\"mps\":\t\"off\""));
    fclose(f);
    free(txt);
    assert_int_equal(run_only(log, "--resume", out, "--device", "cpu", "--threads", "1", "--max-steps", "5",
                              NULL), 2);
    said(log, "--mps on (the run's, from run.json): it is for GPU runs");
}

/* --gpu-turns in run.json and --resume: recorded as given ("on" by default), taken unless
 * given (said), a given one wins. */
static void test_resume_takes_gpu_turns(void **state) {
    (void)state;
    char out[400], log[400], rj[500];
    snprintf(out, sizeof out, "%s/gt", fx.root);
    snprintf(log, sizeof log, "%s/gt.out", fx.root);
    snprintf(rj, sizeof rj, "%s/run.json", out);
    assert_int_equal(run(out, log, "--device", "cpu", "--threads", "1", "--gpu-turns", "off", NULL), 0);
    assert_int_equal(pf_count_in(rj, "\"gpu_turns\":\t\"off\""), 1);
    assert_int_equal(run_only(log, "--resume", out, "--device", "cpu", "--threads", "1", "--max-steps", "3",
                              NULL), 0);
    said(log, " --gpu-turns off");
    assert_int_equal(pf_count_in(rj, "\"gpu_turns\":\t\"off\""), 1);
    assert_int_equal(run_only(log, "--resume", out, "--device", "cpu", "--threads", "1", "--max-steps", "4",
                              "--gpu-turns", "on", NULL), 0);
    assert_int_equal(pf_count_in(log, " --gpu-turns "), 0);
    assert_int_equal(pf_count_in(rj, "\"gpu_turns\":\t\"on\""), 1);
}

/* The pipeline taking --gpu-turns turns without a GPU (test hook gpu_turns.cpu=1: the CPU
 * stages take them as if on GPU 0): 2 targets, 1 drafter and the optimizer finish the run
 * with the losses of the same deterministic run without turns (turns only order the work),
 * each target and the drafter say they take turns, the turn file is in the run dir and the
 * stages publish wait_gpu_s; with --gpu-turns off the hook changes nothing. */
static void test_gpu_turns_cpu(void **state) {
    (void)state;
    char out[3][400], log[400], path[1300];
    double loss[3][8];
    for (int k = 0; k < 3; k++) {
        snprintf(out[k], sizeof out[k], "%s/turns%d", fx.root, k);
        snprintf(log, sizeof log, "%s/turns%d.out", fx.root, k);
        if (k) assert_int_equal(setenv("DL_TEST_HOOKS", "gpu_turns.cpu=1", 1), 0);
        int rc = run(out[k], log, "--device", "cpu", "--threads", "1", "--deterministic", "--targets", "2",
                     "--drafters", "1", "--max-steps", "4", "--gpu-turns", k == 2 ? "off" : "on", NULL);
        unsetenv("DL_TEST_HOOKS");
        if (rc != 0) pf_show(log);
        assert_int_equal(rc, 0);
        assert_int_equal(pf_step_losses(out[k], loss[k], 8), 4);
        snprintf(path, sizeof path, "%s/gpu0.turn", out[k]);
        assert_int_equal(access(path, F_OK) == 0, k == 1);
    }
    for (int i = 0; i < 4; i++) {
        assert_true(loss[1][i] == loss[0][i]);      /* bitwise: --deterministic */
        assert_true(loss[2][i] == loss[0][i]);
    }
    const char *said_by[] = {"target0", "target1", "drafter0"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/logs/%s.log", out[1], said_by[i]);
        assert_int_equal(pf_count_in(path, "GPU 0: shared with 2 other target(s) / drafter(s): taking turns on it"), 1);
        snprintf(path, sizeof path, "%s/logs/%s.log", out[2], said_by[i]);
        assert_int_equal(pf_count_in(path, "--gpu-turns off: time-sliced by the driver"), 1);
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", out[1]);
    assert_true(pf_count_in(path, "\"wait_gpu_s\":") > 0);
    /* `draftline status` says each stage's waits for the turns; none without turns */
    for (int k = 0; k < 2; k++) {
        static pf_run_args_t a;
        memset(&a, 0, sizeof a);
        const char *argv[] = {fx.exe, "status", "--run", out[k], NULL};
        pf_set_argv(&a, argv);
        snprintf(a.log, sizeof a.log, "%s/status%d.out", fx.root, k);
        assert_int_equal(pf_run_draftline(&a, NULL, 30, NULL), 0);
        /* the drafter, the optimizer and the targets that forwarded (one of the two may
         * get no micro-batch under turns: ARCHITECTURE, *Shared GPU, turns*) */
        int n = pf_count_in(a.log, " s for GPU turns");
        if (k ? n < 3 || n > 4 : n != 0) pf_show(a.log);
        assert_true(k ? n >= 3 && n <= 4 : n == 0);
    }
}

/* --resume without a placement flag continues on the run's placement (run.json): a CPU
 * run's --targets / --drafters; a GPU run's --target-gpus / --drafter-gpus (run.json edited
 * through common/rundir to a GPU run of GPUs 0 and 1: --mps on is then refused for GPU
 * reasons, which shows the run was placed on GPUs, not on the CPU default). */
static void test_resume_takes_placement(void **state) {
    (void)state;
    char out[400], log[400], rj[500];
    snprintf(out, sizeof out, "%s/place", fx.root);
    snprintf(log, sizeof log, "%s/place.out", fx.root);
    snprintf(rj, sizeof rj, "%s/run.json", out);
    assert_int_equal(run(out, log, "--device", "cpu", "--threads", "1", "--targets", "2", NULL), 0);
    assert_int_equal(run_only(log, "--resume", out, "--threads", "1", "--max-steps", "3", NULL), 0);
    said(log, " --targets 2");
    assert_int_equal(pf_count_in(log, " --drafters "), 0);   /* the default's: not listed */
    assert_int_equal(pf_count_in(rj, "\"targets\":\t2,"), 1);
    rundir_run_t *j = malloc(sizeof *j);
    assert_non_null(j);
    assert_int_equal(rundir_run_read(out, j), 0);
    snprintf(j->device, sizeof j->device, "cuda");
    j->target_gpus[0] = 0; j->n_target_gpus = 1;
    j->drafter_gpus[0] = 1; j->n_drafter_gpus = 1;
    j->targets = 1;
    assert_int_equal(rundir_run_write(out, j), 0);
    free(j);
    j = NULL;
    assert_int_equal(run_only(log, "--resume", out, "--max-steps", "4", "--mps", "on", NULL), 2);
    said(log, " --target-gpus 0 --drafter-gpus 1");
#ifdef DL_CUDA
    said(log, "--mps on: no GPU of this host runs both a target and a drafter");
    if (access("/dev/nvidiactl", F_OK) != 0) {
        /* no GPU here (CI): warned at once; the stages cannot open GPU 0, which a restart
         * does not fix (not restarted), and say so; the summary says the checkpoint resumed
         * from is untouched */
        assert_int_equal(run_only(log, "--resume", out, "--max-steps", "4", NULL), 1);
        said(log, "this host shows no NVIDIA driver (/dev/nvidiactl): give --device cpu");
        said(log, "cannot start: CUDA device (--gpu): not found: ops_cuda_init(device ");
        said(log, "): no CUDA device (");
        said(log, "0 restart(s)");
        said(log, "checkpoint: (none new; --resume ");
        assert_int_equal(pf_count_in(log, "final checkpoint is missing"), 0);
    }
#else
    said(log, "this build has no CUDA");
#endif
    /* a placement flag given: nothing of the run's placement is taken, said with the run's */
    assert_int_equal(run_only(log, "--resume", out, "--device", "cpu", "--max-steps", "4", "--mps", "on", NULL), 2);
    assert_int_equal(pf_count_in(log, "taken from the checkpoint and its run:"), 1);
    assert_int_equal(pf_count_in(log, " --target-gpus 0 --drafter-gpus 1 --"), 0);
    said(log, "placement given (--device cpu): the run's --target-gpus 0 --drafter-gpus 1 is not taken");
    said(log, "--mps on: it is for GPU runs");
    /* placements draftline does not write, and a multi-node run: refused naming run.json,
     * before anything is written */
    j = malloc(sizeof *j);
    assert_non_null(j);
    assert_int_equal(rundir_run_read(out, j), 0);
    rundir_run_t keep = *j;
    j->n_drafter_gpus = 0;
    assert_int_equal(rundir_run_write(out, j), 0);
    assert_int_equal(run_only(log, "--resume", out, "--max-steps", "4", NULL), 2);
    said(log, "run.json: \"device\" is cuda but \"drafter_gpus\" is empty (draftline does not write that)");
    *j = keep;
    snprintf(j->device, sizeof j->device, "cpu");
    j->targets = 65;
    assert_int_equal(rundir_run_write(out, j), 0);
    assert_int_equal(run_only(log, "--resume", out, "--max-steps", "4", NULL), 2);
    said(log, "\"targets\" is 65, outside 1..64");
    *j = keep;
    j->n_nodes = 2;
    snprintf(j->nodes[0].name, sizeof j->nodes[0].name, "head");
    snprintf(j->nodes[1].name, sizeof j->nodes[1].name, "b");
    j->nodes[1].index = 1;
    assert_int_equal(rundir_run_write(out, j), 0);
    assert_int_equal(run_only(log, "--resume", out, "--max-steps", "4", NULL), 2);
    said(log, "the run ran across nodes");
    assert_int_equal(pf_count_in(log, "draftline run "), 0);   /* no banner: nothing started */
    /* a malformed run.json: the placement is unknown, refused (a GPU run would go on on the
     * CPU); with a placement flag it goes on, the rest of run.json warned as not taken */
    FILE *f = fopen(rj, "w");
    assert_non_null(f);
    fputs("{\"device\": \"cuda\", \"target_gpus\": [0.5]}\n", f);
    fclose(f);
    assert_int_equal(run_only(log, "--resume", out, "--max-steps", "4", NULL), 2);
    said(log, "key 'target_gpus': expected an array of CUDA ordinals (integers 0..1023): the run's placement is "
              "unknown; give it");
    assert_int_equal(pf_count_in(log, "draftline run "), 0);
    free(j);
}

/* A stand-in daemon: the real one needs a GPU. */
static void test_daemon_life_cycle(void **state) {
    (void)state;
#ifndef DL_CUDA
    skip();
#else
    if (access("/dev/nvidiactl", F_OK) == 0) skip();   /* a GPU here: the context would succeed */
    char rec[500], body[2000], out[400], log[400];
    snprintf(rec, sizeof rec, "%s/calls.txt", fx.root);
    snprintf(body, sizeof body,
             "echo \"args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY\" >> '%s'\n"
             "if [ \"$1\" != \"-d\" ]; then cat >> '%s'; fi\n"
             "exit 0\n", rec, rec);
    char *path = stand_in("fakebin", body);
    snprintf(out, sizeof out, "%s/d", fx.root);
    snprintf(log, sizeof log, "%s/d.out", fx.root);
    int code = run(out, log, "--target-gpus", "0", "--drafter-gpus", "0", "--mps", "on", NULL);
    env_back("PATH", path);
    assert_int_equal(code, 1);
    said(log, "--mps on: the MPS daemon started but no CUDA context on GPU 0 could be made");
    char *calls = calls_of(rec);
    char want_log[500], pipe_dir[64] = "";
    snprintf(want_log, sizeof want_log, "log=%s/logs/mps\n", out);   /* fx.root is absolute */
    /* started with -d, then quit, both with the same private pipe dir and the run's log dir */
    char *d = strstr(calls, "args=-d pipe=/tmp/draftline-mps-");
    assert_non_null(d);
    assert_int_equal(sscanf(d, "args=-d pipe=%63s", pipe_dir), 1);
    assert_non_null(strstr(d, want_log));
    char want_quit[200];
    snprintf(want_quit, sizeof want_quit, "args= pipe=%s ", pipe_dir);
    char *q = strstr(d, want_quit);
    assert_non_null(q);
    assert_non_null(strstr(q, "\nquit\n"));
    free(calls);
    struct stat st;
    assert_int_not_equal(stat(pipe_dir, &st), 0);   /* the private pipe dir is gone */
#endif
}

/* A GPU shared by a target and a drafter without MPS: the run says how the stages share it,
 * taking turns (--gpu-turns on, the default) or time-sliced (--gpu-turns off); not without
 * a shared GPU, nor with a user's CUDA_MPS_PIPE_DIRECTORY (the stages are its clients).
 * (CUDA builds; without a GPU the stages then fail at start, after the line.) */
static void test_gpu_share_line(void **state) {
    (void)state;
#ifndef DL_CUDA
    skip();
#else
    const char *turns = "GPU 0 runs a target and a drafter: they take turns on it, one micro-batch at a time "
                        "(--gpu-turns on, the default; off: the driver time-slices them)\n";
    const char *sliced = "GPU 0 runs a target and a drafter: the driver time-slices them (--gpu-turns off; ";
    char out[400], log[400];
    snprintf(out, sizeof out, "%s/h1", fx.root);
    snprintf(log, sizeof log, "%s/h1.out", fx.root);
    run(out, log, "--target-gpus", "0", "--drafter-gpus", "0", NULL);
    said(log, turns);
    assert_int_equal(pf_count_in(log, "--mps auto"), 0);   /* the old hint: turns do what MPS did */
    snprintf(out, sizeof out, "%s/h2", fx.root);
    snprintf(log, sizeof log, "%s/h2.out", fx.root);
    run(out, log, "--target-gpus", "0", "--drafter-gpus", "0", "--mps", "off", "--gpu-turns", "off", NULL);
    said(log, sliced);
    assert_int_equal(pf_count_in(log, turns), 0);
    snprintf(out, sizeof out, "%s/h3", fx.root);   /* no shared GPU: nothing to say */
    snprintf(log, sizeof log, "%s/h3.out", fx.root);
    run(out, log, "--target-gpus", "0", "--drafter-gpus", "1", NULL);
    said(log, "GPU mode: target GPUs 0, drafter GPUs 1\n");
    assert_int_equal(pf_count_in(log, "runs a target and a drafter"), 0);
    /* a user's MPS daemon (CUDA_MPS_PIPE_DIRECTORY set): the stages are its clients */
    char *old = env_swap("CUDA_MPS_PIPE_DIRECTORY", "/tmp/draftline-test-user-mps");
    snprintf(out, sizeof out, "%s/h4", fx.root);
    snprintf(log, sizeof log, "%s/h4.out", fx.root);
    run(out, log, "--target-gpus", "0", "--drafter-gpus", "0", NULL);
    env_back("CUDA_MPS_PIPE_DIRECTORY", old);
    said(log, "GPU mode: target GPUs 0, drafter GPUs 0\n");
    assert_int_equal(pf_count_in(log, "runs a target and a drafter"), 0);
#endif
}

#ifdef DL_CUDA
/* 1 while process pid exists and is not a zombie (/proc/<pid>/stat's state). */
static int running(int pid) {
    char p[64], buf[512];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}
#endif

/* A control program that hangs on -d (and leaves a child behind): ended after the bound
 * (test hook mps.timeout_s=2), its process group with it; the run fails naming it; the
 * stand-in then gets quit and the pipe dir goes. Relative --out: the log dir is absolute. */
static void test_daemon_hangs(void **state) {
    (void)state;
#ifndef DL_CUDA
    skip();
#else
    char rec[500], body[2000], out[400], log[400], pidf[500], cwd[400];
    snprintf(rec, sizeof rec, "%s/hang.txt", fx.root);
    snprintf(pidf, sizeof pidf, "%s/sleeper.pid", fx.root);
    snprintf(body, sizeof body,
             "echo \"args=$* log=$CUDA_MPS_LOG_DIRECTORY\" >> '%s'\n"
             "if [ \"$1\" = \"-d\" ]; then sleep 100 & echo $! > '%s'; wait; fi\n"
             "cat >> '%s'\n"
             "exit 0\n", rec, pidf, rec);
    char *path = stand_in("hangbin", body);
    char *hooks = env_swap("DL_TEST_HOOKS", "mps.timeout_s=2");
    char *bindir = env_swap("DL_BIN_DIR", fx.bin);   /* absolute: the run starts in fx.root */
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(fx.root), 0);
    snprintf(out, sizeof out, "h");   /* relative to fx.root */
    snprintf(log, sizeof log, "%s/h.out", fx.root);
    int code = run(out, log, "--target-gpus", "0", "--drafter-gpus", "0", "--mps", "on", NULL);
    assert_int_equal(chdir(cwd), 0);
    env_back("DL_BIN_DIR", bindir);
    env_back("DL_TEST_HOOKS", hooks);
    env_back("PATH", path);
    assert_int_equal(code, 1);
    said(log, "failed (no answer in 2 s;");
    char *calls = calls_of(rec);
    char want[500];
    snprintf(want, sizeof want, "args=-d log=%s/h/logs/mps\n", fx.root);
    assert_non_null(strstr(calls, want));
    assert_non_null(strstr(calls, "quit\n"));   /* the half-started daemon was asked to quit */
    free(calls);
    size_t len;
    char *pid_txt = pf_slurp(pidf, &len);
    assert_non_null(pid_txt);
    int sleeper = atoi(pid_txt);
    free(pid_txt);
    assert_true(sleeper > 0);
    int alive = 1;   /* gone, or a zombie waiting for whoever adopted it */
    for (int i = 0; i < 250 && (alive = running(sleeper)); i++) usleep(20000);
    assert_false(alive);   /* the control program's group was killed */
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_resume_takes_mps),
        cmocka_unit_test(test_resume_takes_gpu_turns),
        cmocka_unit_test(test_gpu_turns_cpu),
        cmocka_unit_test(test_resume_takes_placement),
        cmocka_unit_test(test_daemon_life_cycle),
        cmocka_unit_test(test_gpu_share_line),
        cmocka_unit_test(test_daemon_hangs),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
