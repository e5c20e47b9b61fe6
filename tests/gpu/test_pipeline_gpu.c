/* The pipeline on GPUs, end to end: `draftline run --target-gpus ... --drafter-gpus ...`
 * (hidden states in the drafter's CUDA IPC inbox, the optimizer's AdamW on the first
 * drafter GPU, gradients and weights through IPC-mapped device slabs) against the CPU
 * run of the same job as the reference.
 *
 * Tiny random Llama-shaped target (tests/support/pipeline_fixture) and 300 GSM8K samples
 * prepared with the embedded model's tokenizer (or, where the embedded model is absent,
 * the prepared cache named by $DL_TEST_DLC). Both runs start from the same drafter
 * (seed 5) and see the same micro-batches and anchors (seeded by micro-batch), so:
 *  - step 0's loss (same weights, same data) agrees with the CPU run's within 3 %
 *    (bf16 features and working weights on CUDA against fp32 on CPU);
 *  - step 1's loss (after one AdamW step on the GPU vs on the CPU) within 5 %;
 *  - every step 0..N-1 is applied exactly once (steps.jsonl), the loss falls, the final
 *    checkpoint's state records step N, no process or shared-memory object is left.
 * With 2 GPUs the same job runs as 0,1 -> 0,1 (a target and a drafter per GPU): the
 * optimizer on GPU 0 sums drafter 1's gradient slab in place over peer access.
 * Memory bound: 3 target processes sharing GPU 0 feed 1 drafter (on GPU 1 when there
 * are 2 GPUs) whose GPU tier holds 2 slots and host tier 1; every metrics line of the
 * drafter stays within --inbox-gb + --host-inbox-gb (slabs, bytes in use, high water).
 * Exits 77 without a GPU (found with nvidia-smi: this process never initialises CUDA,
 * since it forks the run). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/pipe/ckpt.h"
#include "common/pipe/layout.h"
#include "common/pipe/model.h"

#include <cjson/cJSON.h>
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_STEPS 8

static pf_fixture_t fx;
static int n_gpus;
static double cpu_loss[MAX_STEPS];

static int count_gpus(void) {
    FILE *p = popen("nvidia-smi -L 2>/dev/null", "r");
    if (!p) return 0;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, p)) n += !strncmp(line, "GPU ", 4);
    pclose(p);
    return n;
}

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlpg", 0) < 0) return -1;   /* the data is chosen below */
    char gguf[1024];
    const char *dlc = getenv("DL_TEST_DLC");
    if (paths_default_model(gguf, sizeof gguf) == 0 && access(gguf, R_OK) == 0) {
        snprintf(fx.cache, sizeof fx.cache, "%s/gsm8k300.dlc", fx.root);
        if (pf_write_cache(fx.root, 300, fx.cache) < 0) {
            fprintf(stderr, "fixture: %s\n", dl_errmsg());
            return -1;
        }
    } else if (dlc && access(dlc, R_OK) == 0) {
        snprintf(fx.cache, sizeof fx.cache, "%s", dlc);
    } else {
        fprintf(stderr, "embedded model missing (make model) and no $DL_TEST_DLC: nothing to train on\n");
        return -1;
    }
    proc_watchdog(280);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* Runs `draftline run` with the fixed job flags plus the placement args (NULL-terminated)
 * to its end (pf_run_draftline: nothing of its process group and no shared-memory object
 * of its run left, log tails on failure); returns its exit code, or a negative dl_err
 * when one of those checks failed. */
static int run_job(const char *out, const char *log, int timeout_s, ...) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    static char steps[16];
    snprintf(steps, sizeof steps, "%d", MAX_STEPS);
    int n = 0;
    a.argv[n++] = fx.exe;
    a.argv[n++] = "run";
    const char *fixed[] = {"--target-model", fx.model_dir, "--data", fx.cache, "--token-budget", "512",
                           "--block-size", "4", "--num-anchors", "8", "--drafter-layers", "1",
                           "--lr", "3e-3", "--micro-batches-per-step", "2", "--seed", "5",
                           "--max-steps", steps, "--progress-every", "1", "--out", out, NULL};
    for (int i = 0; fixed[i]; i++) a.argv[n++] = (char *)fixed[i];
    va_list ap;
    va_start(ap, timeout_s);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;) a.argv[n++] = (char *)s;
    va_end(ap);
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    char run_id[17];   /* for the shared-memory check */
    return pf_run_draftline(&a, out, timeout_s, run_id);
}

/* steps.jsonl: every step 0..MAX_STEPS-1 exactly once; its losses into loss[]. */
static void read_steps(const char *out, double *loss) {
    char path[500], line[1024];
    snprintf(path, sizeof path, "%s/steps.jsonl", out);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int seen[MAX_STEPS] = {0}, n = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned s;
        double l;
        assert_int_equal(sscanf(line, "{\"step\":%u,\"loss\":%lf", &s, &l), 2);
        assert_true(s < MAX_STEPS);
        assert_int_equal(seen[s], 0);
        seen[s] = 1;
        loss[s] = l;
        n++;
    }
    fclose(f);
    assert_int_equal(n, MAX_STEPS);
}

/* The final checkpoint's training state records MAX_STEPS. */
static void check_final_ckpt(const char *out) {
    char dir[4200], path[4300];
    assert_int_equal(ckpt_resolve(out, dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/state.bin", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    ckpt_state_hdr_t h;
    assert_int_equal(fread(&h, sizeof h, 1, f), 1);
    fclose(f);
    assert_memory_equal(h.magic, CKPT_MAGIC, 8);
    assert_int_equal(h.step, MAX_STEPS);
}

static void compare_to_cpu(const char *what, const double *loss) {
    double r0 = fabs(loss[0] - cpu_loss[0]) / cpu_loss[0], r1 = fabs(loss[1] - cpu_loss[1]) / cpu_loss[1];
    fprintf(stderr, "%s: loss step 0 %.5f (CPU %.5f, rel %.2e), step 1 %.5f (CPU %.5f, rel %.2e), "
            "step %d %.5f (CPU %.5f)\n", what, loss[0], cpu_loss[0], r0, loss[1], cpu_loss[1], r1,
            MAX_STEPS - 1, loss[MAX_STEPS - 1], cpu_loss[MAX_STEPS - 1]);
    assert_true(r0 < 0.03);
    assert_true(r1 < 0.05);
    double first = (loss[0] + loss[1]) / 2, last = (loss[MAX_STEPS - 2] + loss[MAX_STEPS - 1]) / 2;
    assert_true(last < first);
}

static void test_cpu_reference(void **state) {
    (void)state;
    char out[400], log[400];
    snprintf(out, sizeof out, "%s/cpu", fx.root);
    snprintf(log, sizeof log, "%s/cpu.out", fx.root);
    assert_int_equal(run_job(out, log, 200, "--device", "cpu", "--targets", "1", "--drafters", "1", NULL), 0);
    read_steps(out, cpu_loss);
    check_final_ckpt(out);
}

static void test_one_gpu(void **state) {
    (void)state;
    char out[400], log[400];
    double loss[MAX_STEPS];
    snprintf(out, sizeof out, "%s/gpu1", fx.root);
    snprintf(log, sizeof log, "%s/gpu1.out", fx.root);
    assert_int_equal(run_job(out, log, 200, "--target-gpus", "0", "--drafter-gpus", "0", NULL), 0);
    read_steps(out, loss);
    check_final_ckpt(out);
    compare_to_cpu("0 -> 0", loss);
}

static void test_two_gpus(void **state) {
    (void)state;
    if (n_gpus < 2) skip();
    char out[400], log[400];
    double loss[MAX_STEPS];
    snprintf(out, sizeof out, "%s/gpu2", fx.root);
    snprintf(log, sizeof log, "%s/gpu2.out", fx.root);
    assert_int_equal(run_job(out, log, 200, "--target-gpus", "0,1", "--drafter-gpus", "0,1", NULL), 0);
    read_steps(out, loss);
    check_final_ckpt(out);
    compare_to_cpu("0,1 -> 0,1", loss);
}

static void test_three_targets_inbox_bound(void **state) {
    (void)state;
    /* one slot: 512 tokens x n_feat*D bf16 features (layout.h) */
    model_config_t mc;
    drafter_config_t dc;
    assert_int_equal(pipe_target_config(fx.model_dir, &mc), 0);
    assert_int_equal(pipe_drafter_config(&mc, 1, 0, 4, &dc), 0);
    pipe_layout_t l = pipe_layout(512, (uint64_t)dc.n_feat * (uint64_t)dc.D, 2);
    double gpu_b = 2.0 * (double)l.bytes + 64, host_b = (double)l.bytes + 64;
    char gpu_gb[32], host_gb[32], out[400], log[400];
    snprintf(gpu_gb, sizeof gpu_gb, "%.12f", gpu_b / 1073741824.0);
    snprintf(host_gb, sizeof host_gb, "%.12f", host_b / 1073741824.0);
    snprintf(out, sizeof out, "%s/bound", fx.root);
    snprintf(log, sizeof log, "%s/bound.out", fx.root);
    assert_int_equal(run_job(out, log, 200, "--target-gpus", "0,0,0", "--drafter-gpus", n_gpus >= 2 ? "1" : "0",
                             "--inbox-gb", gpu_gb, "--host-inbox-gb", host_gb, NULL), 0);
    double loss[MAX_STEPS];
    read_steps(out, loss);
    double limit = gpu_b + host_b, high = 0;
    /* every drafter metrics line within the bound (inbox slabs, bytes in use, high water) */
    int seen = pf_inbox_within(out, limit, &high);
    fprintf(stderr, "bound: slot %llu B, inbox high water %.0f B <= %.0f B (%d metrics lines)\n",
            (unsigned long long)l.bytes, high, limit, seen);
    assert_true(seen > 0);
    assert_true(high > 0);
}

int main(void) {
    n_gpus = count_gpus();
    if (n_gpus == 0) {
        printf("SKIP: no CUDA device (nvidia-smi -L lists none)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_reference),
        cmocka_unit_test(test_one_gpu),
        cmocka_unit_test(test_two_gpus),
        cmocka_unit_test(test_three_targets_inbox_bound),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
