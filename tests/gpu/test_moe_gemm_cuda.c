/* ops_cuda_moe_gemm (common/ops/cuda/matmul.cu): the MoE experts' forward GEMMs through
 * row-bucketed cuBLASLt plans, held to the CPU backend's matmul_forward (fp32) expert by
 * expert, at Qwen3-30B-A3B's expert shapes (gate/up: K 2048 -> N 768; down: K 768 -> N 2048)
 * with row counts that cover an empty expert, M = 1, bucket edges (64, 65, 1024, 1025) and
 * several M inside one bucket (the plan made for the first serves the others: its layouts'
 * row count changes per call). Two rounds with different counts, the second reusing the
 * first's buckets. Inputs are multiples of 1/64 in [-2, 2] (exact in bf16), so only the
 * GEMM's accumulation order and the bf16 output differ: norm_rel <= 1e-2, max_rel <= 3e-2
 * per expert (the target's bf16 tolerances, tests/gpu/test_target_cuda.c, are 3e-2 / 6e-2).
 * Exits 77 ("SKIP: no CUDA device") where no GPU is present. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/clock.h"
#include "common/ops/cuda/ops_cuda.h"
#include "common/ops/ops.h"

#define TOL_NORM 1e-2
#define TOL_MAX 3e-2
#define NE 12

static ops_ctx_t g_cpu, g_gpu;

static float *rand_mat(size_t n, unsigned seed) {
    float *x = malloc(n * sizeof *x);
    srand(seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)(rand() % 257 - 128) / 64.0f;
    return x;
}

/* One round: experts with rows[e] rows each, out = x . W_e^T per expert on both backends. */
static void round_check(int K, int N, const int *rows, unsigned seed) {
    int32_t off[NE + 1] = {0};
    for (int e = 0; e < NE; e++) off[e + 1] = off[e] + rows[e];
    int R = off[NE];
    float *x = rand_mat((size_t)R * K, seed), *w = rand_mat((size_t)NE * N * K, seed + 1);
    float *ref = malloc((size_t)R * N * 4), *got = malloc((size_t)R * N * 4);
    const ops_impl_t *oc = g_cpu.impl, *og = g_gpu.impl;
    for (int e = 0; e < NE; e++)
        if (rows[e])
            oc->matmul_forward(&g_cpu, ref + (size_t)off[e] * N, x + (size_t)off[e] * K,
                               w + (size_t)e * N * K, NULL, rows[e], K, N);
    void *dx = og->malloc_(&g_gpu, (size_t)R * K * 2), *dout = og->malloc_(&g_gpu, (size_t)R * N * 2);
    void *dw = og->malloc_(&g_gpu, (size_t)NE * N * K * 2), *wp[NE];
    og->upload_act(&g_gpu, dx, x, (size_t)R * K);
    og->upload_act(&g_gpu, dw, w, (size_t)NE * N * K);
    for (int e = 0; e < NE; e++) wp[e] = (char *)dw + (size_t)e * N * K * 2;
    double t0 = clock_mono_s();
    ops_cuda_moe_gemm(&g_gpu, dout, dx, wp, off, NE, K, N);
    og->download_act(&g_gpu, got, dout, (size_t)R * N);
    double t1 = clock_mono_s();
    double worst_n = 0, worst_m = 0;
    for (int e = 0; e < NE; e++) {
        if (!rows[e]) continue;
        const float *a = got + (size_t)off[e] * N, *b = ref + (size_t)off[e] * N;
        double dn = 0, bn = 0, dm = 0, bm = 0;
        for (size_t i = 0; i < (size_t)rows[e] * N; i++) {
            double d = fabs((double)a[i] - b[i]);
            dn += d * d, bn += (double)b[i] * b[i];
            if (!(d <= dm)) dm = d;
            if (fabs(b[i]) > bm) bm = fabs(b[i]);
        }
        double nr = sqrt(dn / (bn > 0 ? bn : 1)), mr = dm / (bm > 0 ? bm : 1);
        if (nr > worst_n) worst_n = nr;
        if (mr > worst_m) worst_m = mr;
        if (!(nr <= TOL_NORM && mr <= TOL_MAX))
            fail_msg("K %d N %d expert %d (M %d): norm_rel %.3e max_rel %.3e", K, N, e, rows[e], nr, mr);
    }
    printf("  K %4d N %4d, %d rows over %d experts: worst norm_rel %.2e max_rel %.2e; call + download "
           "%.1f ms\n", K, N, R, NE, worst_n, worst_m, (t1 - t0) * 1e3);
    og->free_(&g_gpu, dx), og->free_(&g_gpu, dout), og->free_(&g_gpu, dw);
    free(x), free(w), free(ref), free(got);
}

static void test_expert_gemms(void **s) {
    (void)s;
    /* buckets: 0 none; 1, 17, 64 -> 64; 65 -> 80; 100 -> 112; 777 -> 896; 1024 -> 1024;
     * 1025, 1030 -> 1280; 2049 -> 2560; 3 -> 64 */
    static const int r1[NE] = {0, 1, 17, 64, 65, 100, 777, 1024, 1025, 1030, 2049, 3};
    /* the same buckets at other row counts: plans reused with a new M */
    static const int r2[NE] = {5, 0, 63, 2, 79, 112, 800, 1000, 1279, 1100, 2500, 0};
    int shapes[2][2] = {{2048, 768}, {768, 2048}};
    for (int i = 0; i < 2; i++) {
        round_check(shapes[i][0], shapes[i][1], r1, 11 + i);
        round_check(shapes[i][0], shapes[i][1], r2, 21 + i);
        round_check(shapes[i][0], shapes[i][1], r1, 31 + i);   /* again, every plan cached */
    }
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    ops_cpu_init(&g_cpu, 0);
    if (ops_cuda_init(&g_gpu, 0) != 0) {
        printf("SKIP: no CUDA device (ops_cuda_init failed)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_expert_gemms)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ops_ctx_destroy(&g_gpu);
    ops_ctx_destroy(&g_cpu);
    return rc;
}
