/* The CPU pipeline trains a drafter against a Qwen3-MoE target (issue 16): `draftline run`
 * on mkmodel's tiny-qwen3-moe (2 layers, every one MoE: 8 experts of 32, top-2), the first
 * 60 GSM8K samples of the shared fixture, 1 target + 1 drafter; the loss falls and the
 * checkpoint is in the public DFlash layout (the checks of test_pipeline's short run). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/model/config.h"
#include "common/model/dflash_ckpt.h"
#include "common/model/drafter.h"
#include "common/model/mkmodel.h"
#include "common/format/safetensors.h"
#include "common/pipe/ckpt.h"
#include "common/pipe/model.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_STEPS 16

static pf_fixture_t fx;
static char moe_dir[400];

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlmoe", 60) < 0) return -1;
    model_config_t c;
    snprintf(moe_dir, sizeof moe_dir, "%s/tiny-moe", fx.root);
    if (mkmodel_preset("tiny-qwen3-moe", &c) < 0 || mkmodel_write(&c, moe_dir, 3, "f32", 0, NULL) < 0)
        return -1;
    proc_watchdog(120);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

static void test_moe_target_trains(void **state) {
    (void)state;
    char out[400], log[380], sn[8];
    snprintf(out, sizeof out, "%s/run", fx.root);
    snprintf(log, sizeof log, "%s/run.out", fx.root);
    snprintf(sn, sizeof sn, "%d", N_STEPS);
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    const char *argv[] = {fx.exe, "run", "--target-model", moe_dir, "--data", fx.cache,
                          "--device", "cpu", "--targets", "1", "--drafters", "1", "--threads", "1",
                          "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                          "--drafter-layers", "1", "--lr", "1e-2", "--micro-batches-per-step", "2",
                          "--seed", "5", "--max-steps", sn, "--save-every", sn,
                          "--progress-every", "1", "--out", out, NULL};
    pf_set_argv(&a, argv);
    snprintf(a.log, sizeof a.log, "%s", log);
    char id[17];
    assert_int_equal(pf_run_draftline(&a, out, 90, id), 0);

    /* every step has a finite loss, and the last three are below the first three */
    double loss[N_STEPS];
    int n = pf_step_losses(out, loss, N_STEPS);
    assert_int_equal(n, N_STEPS);
    for (int i = 0; i < n; i++) assert_true(isfinite(loss[i]));
    double first = (loss[0] + loss[1] + loss[2]) / 3, last = (loss[n - 1] + loss[n - 2] + loss[n - 3]) / 3;
    printf("  loss %.3f (first 3 steps) -> %.3f (last 3)\n", first, last);
    assert_true(last < first);

    /* the checkpoint: the drafter's tensors by name and shape, loadable by the DFlash loader */
    char dir[4200], p[4400];
    assert_int_equal(ckpt_resolve(out, dir, sizeof dir), 0);
    model_config_t mc;
    drafter_config_t dc;
    assert_int_equal(pipe_target_config(moe_dir, &mc), 0);
    assert_int_equal(mc.n_experts, 8);
    assert_int_equal(pipe_drafter_config(&mc, 1, 0, 4, &dc), 0);
    static const float no_embed[1];
    ops_ctx_t ops;
    ops_cpu_init(&ops, 1);
    drafter_t *d;
    assert_int_equal(drafter_new(&ops, &dc, no_embed, no_embed, 1, 1, 0, &d), 0);
    safetensors_t *st;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(safetensors_open(p, &st), 0);
    for (int i = 0; i < drafter_n_tensors(d); i++) {
        const drafter_tensor_t *t = drafter_tensor(d, i);
        const st_tensor_t *x = safetensors_find(st, t->name);
        assert_non_null(x);
        assert_int_equal(x->n_dims, t->n_dims);
        for (int k = 0; k < t->n_dims; k++) assert_int_equal(x->shape[k], t->shape[k]);
    }
    safetensors_close(&st);
    drafter_config_t lc;
    assert_int_equal(dflash_config_load(dir, &lc), 0);
    assert_int_equal(lc.B, 4);
    assert_int_equal(lc.D, 64);
    drafter_t *d2;
    assert_int_equal(drafter_new(&ops, &lc, no_embed, no_embed, 1, 1, 99, &d2), 0);
    assert_int_equal(drafter_n_params(d2), drafter_n_params(d));
    assert_int_equal(dflash_ckpt_load_weights(d2, dir), 0);
    drafter_destroy(&d2);
    drafter_destroy(&d);
    ops_ctx_destroy(&ops);
}

/* fp8 with a MoE target is refused by `draftline run` itself, with the reason, exit 2 and
 * no run dir (was: the target's start-up error, the reason only in target0.log) */
static void test_moe_fp8_refused(void **state) {
    (void)state;
    char out[400], log[380];
    snprintf(out, sizeof out, "%s/fp8", fx.root);
    snprintf(log, sizeof log, "%s/fp8.out", fx.root);
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    const char *argv[] = {fx.exe, "run", "--target-model", moe_dir, "--data", fx.cache, "--device", "cpu",
                          "--target-precision", "fp8", "--max-steps", "2", "--out", out, NULL};
    pf_set_argv(&a, argv);
    snprintf(a.log, sizeof a.log, "%s", log);
    char id[17];
    assert_int_equal(pf_run_draftline(&a, out, 30, id), 2);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "--target-precision fp8: "));
    assert_non_null(strstr(txt, "is a MoE target (8 experts): not supported"));
    free(txt);
    assert_int_not_equal(access(out, F_OK), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_fp8_refused),
        cmocka_unit_test(test_moe_target_trains),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
