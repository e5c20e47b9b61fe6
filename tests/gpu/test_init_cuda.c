/* The drafter's seeded init on the GPU (drafter_init_master_on: normals drawn by
 * common/ops/cuda/init.cu, the near-midpoint ones recomputed on the host) against the
 * host's init (drafter_init_master, itself held to the sequential loop by
 * tests/unit/test_drafter_init.c), bitwise:
 *  - a drafter of odd sizes (chunk boundaries inside tensors), at the default margin and
 *    with every normal recomputed (near_rel 1);
 *  - the reference work's drafter (Qwen3-8B shapes, 5 layers: 1,048,626,432 parameters,
 *    the optimizer's at start-up), with its time on each side and how many normals were
 *    near a rounding midpoint and how many the device had rounded otherwise (printed).
 * Exits 77 ("SKIP: no CUDA device") without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/model/drafter.h"
#include "common/ops/ops.h"

static ops_ctx_t g_cpu, g_gpu;

/* host init vs device init of the layout of cfg, bitwise; returns what the device did */
static drafter_init_info_t check(const drafter_config_t *cfg, uint64_t seed, double near_rel, size_t want_P) {
    drafter_t *d = NULL;
    static const float emb[1] = {0};
    drafter_new_opts_t lo = {.layout_only = 1};
    assert_int_equal(drafter_new_opts(&g_cpu, cfg, emb, emb, 1, 1, seed, &lo, &d), 0);
    size_t P = drafter_n_params(d);
    if (want_P) assert_int_equal(P, want_P);
    float *ref = malloc(P * 4), *got = malloc(P * 4);
    float *dev = g_gpu.impl->malloc_(&g_gpu, P * 4);
    assert_non_null(ref); assert_non_null(got); assert_non_null(dev);
    double t0 = clock_mono_s();
    assert_int_equal(drafter_init_master(d, seed, ref), 0);
    double t_host = clock_mono_s() - t0;
    g_gpu.impl->memset0(&g_gpu, dev, P * 4);
    drafter_init_info_t ii;
    t0 = clock_mono_s();
    int rc = drafter_init_master_on(d, seed, &g_gpu, dev, near_rel, &ii);
    double t_dev = clock_mono_s() - t0;
    if (rc) fprintf(stderr, "drafter_init_master_on: %s\n", dl_errmsg());
    assert_int_equal(rc, 0);
    g_gpu.impl->download(&g_gpu, got, dev, P * 4);
    g_gpu.impl->sync(&g_gpu);
    size_t diff = 0;
    for (size_t i = 0; i < P; i++) diff += memcmp(&got[i], &ref[i], 4) != 0;
    printf("init of %zu parameters (seed %llu, near_rel %g): host %.2f s, GPU %.3f s; %llu normals, %llu near a "
           "rounding midpoint, %llu rewritten; %zu differ from the host's\n", P, (unsigned long long)seed,
           near_rel, t_host, t_dev, (unsigned long long)ii.normals, (unsigned long long)ii.near,
           (unsigned long long)ii.fixed, diff);
    assert_int_equal(diff, 0);
    assert_int_equal(ii.on_device, 1);
    g_gpu.impl->free_(&g_gpu, dev);
    free(ref); free(got);
    drafter_destroy(&d);
    return ii;
}

static void test_odd(void **state) {
    (void)state;
    drafter_config_t c;
    drafter_config_defaults(&c);
    c.D = 100, c.H = 5, c.Hkv = 1, c.hd = 20, c.F = 333, c.V = 37;
    c.n_target_layers = 8, c.max_position_embeddings = 64, c.rms_eps = 1e-6f;
    c.rope.theta = 10000.0;
    c.n_layers = 2, c.n_feat = 3;
    c.target_layer_ids[0] = 1, c.target_layer_ids[1] = 3, c.target_layer_ids[2] = 5;
    c.B = 4, c.mask_token_id = 1;
    check(&c, 77, 0, 0);
    drafter_init_info_t all = check(&c, 78, 1.0, 0);
    assert_true(all.near <= all.normals && all.near >= all.normals - all.normals / 1000);   /* all but exact floats */
}

static void test_reference(void **state) {
    (void)state;
    drafter_config_t c;
    drafter_config_defaults(&c);
    c.D = 4096, c.H = 32, c.Hkv = 8, c.hd = 128, c.F = 12288, c.V = 151936;
    c.n_target_layers = 36, c.max_position_embeddings = 40960, c.rms_eps = 1e-6f;
    c.rope.theta = 1000000.0;
    c.n_layers = 5, c.n_feat = 5;
    int ids[5] = {1, 9, 17, 25, 33};
    for (int i = 0; i < 5; i++) c.target_layer_ids[i] = ids[i];
    c.B = 16, c.mask_token_id = 151669;
    drafter_init_info_t ii = check(&c, 0, 0, 1048626432);
    assert_true(ii.near > 0);   /* ~2^-15.5 of 1B: tens of thousands */
}

int main(void) {
    ops_cpu_init(&g_cpu, 0);
    if (ops_cuda_init(&g_gpu, 0) != 0) {
        printf("SKIP: no CUDA device (%s)\n", dl_errmsg());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_odd),
        cmocka_unit_test(test_reference),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ops_ctx_destroy(&g_gpu);
    ops_ctx_destroy(&g_cpu);
    return rc;
}
