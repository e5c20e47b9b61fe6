/* FP8 (E4M3) target linears on CUDA (common/ops/cuda/matmul_fp8.cu) held against the CPU
 * emulation (common/ops/cpu/fp8.c, itself bitwise with torch by tests/unit/test_fp8.c).
 *
 *  - fp8_quantize_rows on bf16-exact inputs: q and s bitwise equal to the CPU's (both are
 *    fp32 divisions rounded to nearest, then __nv_cvt_float_to_fp8 SATFINITE / its twin);
 *  - fp8_matmul_forward on those same quantized inputs, with and without bias, odd and
 *    Qwen3-8B shapes, through cuBLASLt's outer-vector path and (test hook
 *    ops.fp8_epilogue=1, a second pass of the test binary's own cases) the epilogue path:
 *    |a - b| <= 1e-2 |b| + 2e-3 max|b| (b = CPU; sums in fp32 in another order, then the
 *    bf16 output rounding 2^-9, and the Qwen2 bias added after a bf16 rounding);
 *  - fp8_check: 0 for the Qwen3-8B linears, DL_ENOTSUP for K = 72 (not a multiple of 16);
 *  - target forward, precision fp8, CUDA vs CPU on mkmodel's tiny-qwen3 (D 64, F 128: the
 *    parity fixtures' D 72 / F 100 are refused by cuBLASLt FP8), packed batch of 3
 *    sequences, every layer captured. The activations entering each quantization differ
 *    (bf16 on CUDA, fp32 on CPU), so a few elements round to the neighbouring E4M3 value:
 *    per layer norm_rel <= 6e-2 and max_rel <= 1.5e-1 (bounds to be confirmed by the first
 *    H200 run; the numbers are printed). The CUDA fp8 vs CUDA bf16 per-layer error is
 *    printed too (the feature error the issue asks about, on random weights).
 *
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
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/model/config.h"
#include "common/model/mkmodel.h"
#include "common/model/target.h"
#include "common/ops/ops.h"

#define FWD_TOL_NORM 6e-2
#define FWD_TOL_MAX 1.5e-1

static ops_ctx_t g_cpu, g_gpu;
static rng_t g_rng;

/* bf16-exact f32 (round to nearest even), so both backends see the same values. */
static float bf16r(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static float *rnd(size_t n, float scale) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = bf16r(scale * rng_normal(&g_rng));
    return x;
}

/* Quantizes host x (R,K) on both backends: asserts q, s bitwise equal; returns the
 * device copies (*dq, *ds) and the host ones (*hq, *hs). */
static void quantize_both(const float *x, int R, int K, uint8_t **dq, float **ds, uint8_t **hq,
                          float **hs) {
    const ops_impl_t *G = g_gpu.impl, *C = g_cpu.impl;
    void *dx = G->malloc_(&g_gpu, (size_t)R * K * 2);
    G->upload_act(&g_gpu, dx, x, (size_t)R * K);
    *dq = G->malloc_(&g_gpu, (size_t)R * K);
    *ds = G->malloc_(&g_gpu, (size_t)R * 4);
    G->fp8_quantize_rows(&g_gpu, *dq, *ds, dx, R, K);
    *hq = malloc((size_t)R * K);
    *hs = malloc((size_t)R * 4);
    C->fp8_quantize_rows(&g_cpu, *hq, *hs, x, R, K);
    uint8_t *gq = malloc((size_t)R * K);
    float *gs = malloc((size_t)R * 4);
    G->download(&g_gpu, gq, *dq, (size_t)R * K);
    G->download(&g_gpu, gs, *ds, (size_t)R * 4);
    assert_memory_equal(gs, *hs, (size_t)R * 4);
    assert_memory_equal(gq, *hq, (size_t)R * K);
    free(gq);
    free(gs);
    G->free_(&g_gpu, dx);
}

static void one_linear(int M, int K, int N, int with_bias) {
    const ops_impl_t *G = g_gpu.impl, *C = g_cpu.impl;
    float *x = rnd((size_t)M * K, 1.0f), *w = rnd((size_t)N * K, 0.02f);
    float *b = with_bias ? rnd((size_t)N, 0.1f) : NULL;
    x[K / 2] = bf16r(60.0f);   /* an outlier feature in token 0 */
    uint8_t *dqx, *dqw, *hqx, *hqw;
    float *dsx, *dsw, *hsx, *hsw;
    quantize_both(x, M, K, &dqx, &dsx, &hqx, &hsx);
    quantize_both(w, N, K, &dqw, &dsw, &hqw, &hsw);
    assert_int_equal(G->fp8_check(&g_gpu, K, N), 0);
    void *db = NULL;
    if (b) {
        db = G->malloc_(&g_gpu, (size_t)N * 2);
        G->upload_act(&g_gpu, db, b, (size_t)N);
    }
    void *dout = G->malloc_(&g_gpu, (size_t)M * N * 2);
    G->fp8_matmul_forward(&g_gpu, dout, dqx, dsx, dqw, dsw, db, M, K, N);
    float *a = malloc((size_t)M * N * 4), *ref = malloc((size_t)M * N * 4);
    G->download_act(&g_gpu, a, dout, (size_t)M * N);
    C->fp8_matmul_forward(&g_cpu, ref, hqx, hsx, hqw, hsw, b, M, K, N);
    double mx = 0, worst = 0;
    size_t wi = 0;
    for (size_t i = 0; i < (size_t)M * N; i++) mx = fmax(mx, fabs(ref[i]));
    for (size_t i = 0; i < (size_t)M * N; i++) {
        double e = fabs((double)a[i] - ref[i]) / (1e-2 * fabs(ref[i]) + 2e-3 * mx);
        if (!(e <= worst)) { worst = e; wi = i; }
    }
    printf("  fp8 linear M %5d K %5d N %5d bias %d: worst %.3f of tolerance (got %.6g, cpu %.6g)\n",
           M, K, N, with_bias, worst, a[wi], ref[wi]);
    assert_true(worst <= 1.0);
    free(x); free(w); free(b); free(a); free(ref); free(hqx); free(hqw); free(hsx); free(hsw);
    void *ps[] = {dqx, dqw, dsx, dsw, db, dout};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) if (ps[i]) G->free_(&g_gpu, ps[i]);
}

static void test_linear(void **s) {
    (void)s;
    one_linear(37, 64, 48, 1);
    one_linear(1, 128, 256, 0);
    one_linear(300, 1024, 512, 1);
    one_linear(256, 4096, 4096, 0);     /* Qwen3-8B q_proj / o_proj */
    one_linear(512, 4096, 12288, 0);    /* gate / up */
    one_linear(200, 12288, 4096, 0);    /* down */
    one_linear(64, 4096, 1024, 1);      /* k / v, with a bias as Qwen2's */
}

static void test_check(void **s) {
    (void)s;
    assert_int_equal(g_gpu.impl->fp8_check(&g_gpu, 4096, 1024), 0);
    assert_int_equal(g_gpu.impl->fp8_check(&g_gpu, 12288, 4096), 0);
    assert_int_equal(g_gpu.impl->fp8_check(&g_gpu, 72, 96), DL_ENOTSUP);
    printf("  fp8_check(72, 96): %s\n", dl_errmsg());
}

static void errs(const float *a, const float *b, size_t n, double *norm, double *mx) {
    double num = 0, den = 0, dmax = 0, bmax = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
        if (!(fabs(d) <= dmax)) dmax = fabs(d);
        bmax = fmax(bmax, fabs(b[i]));
    }
    *norm = den > 0 ? sqrt(num / den) : sqrt(num);
    *mx = bmax > 0 ? dmax / bmax : dmax;
}

/* Every layer of the tiny model at precision prec on backend c: feat (T, L*D) host. */
static float *forward(const char *dir, ops_ctx_t *c, int prec, const int32_t *ids, const int32_t *cu,
                      int nseq, int T, int *L_, int *D_) {
    model_config_t cfg;
    assert_int_equal(model_config_from_hf_dir(dir, &cfg), 0);
    target_opts_t o = {.max_tokens = 64, .max_seqs = 4, .n_capture = cfg.L, .precision = prec};
    for (int i = 0; i < cfg.L; i++) o.capture_ids[i] = i;
    target_t *t = NULL;
    if (target_load(dir, c, &o, &t)) fail_msg("target_load %s: %s", dir, dl_errmsg());
    size_t n = (size_t)T * cfg.L * cfg.D;
    void *f = c->impl->malloc_(c, n * ops_act_bytes(c));
    assert_int_equal(target_forward_host(t, ids, NULL, cu, nseq, T, f, NULL), 0);
    float *h = malloc(n * 4);
    c->impl->download_act(c, h, f, n);
    c->impl->free_(c, f);
    target_destroy(&t);
    *L_ = cfg.L;
    *D_ = cfg.D;
    return h;
}

static void test_target_forward(void **s) {
    (void)s;
    char dir[] = "/tmp/dl_fp8_gpu_XXXXXX";
    assert_non_null(mkdtemp(dir));
    model_config_t c;
    assert_int_equal(mkmodel_preset("tiny-qwen3", &c), 0);
    assert_int_equal(mkmodel_write(&c, dir, 7, "bf16", 0, NULL), 0);
    int32_t ids[48], cu[4] = {0, 20, 31, 48};
    for (int i = 0; i < 48; i++) ids[i] = (int32_t)((i * 7919 + 13) % 5000);
    int L, D;
    float *cpu8 = forward(dir, &g_cpu, TARGET_PRECISION_FP8, ids, cu, 3, 48, &L, &D);
    float *gpu8 = forward(dir, &g_gpu, TARGET_PRECISION_FP8, ids, cu, 3, 48, &L, &D);
    float *gpu16 = forward(dir, &g_gpu, TARGET_PRECISION_BF16, ids, cu, 3, 48, &L, &D);
    float *la = malloc((size_t)48 * D * 4), *lb = malloc((size_t)48 * D * 4), *lc = malloc((size_t)48 * D * 4);
    for (int l = 0; l < L; l++) {
        for (int r = 0; r < 48; r++) {
            memcpy(la + (size_t)r * D, gpu8 + ((size_t)r * L + l) * D, D * 4);
            memcpy(lb + (size_t)r * D, cpu8 + ((size_t)r * L + l) * D, D * 4);
            memcpy(lc + (size_t)r * D, gpu16 + ((size_t)r * L + l) * D, D * 4);
        }
        double nr, mr, nr16, mr16;
        errs(la, lb, (size_t)48 * D, &nr, &mr);
        errs(la, lc, (size_t)48 * D, &nr16, &mr16);
        printf("  tiny-qwen3 layer %d: cuda fp8 vs cpu fp8 norm_rel %.2e max_rel %.2e; "
               "cuda fp8 vs cuda bf16 norm_rel %.2e max_rel %.2e\n", l, nr, mr, nr16, mr16);
        assert_true(nr <= FWD_TOL_NORM);
        assert_true(mr <= FWD_TOL_MAX);
    }
    free(la); free(lb); free(lc); free(cpu8); free(gpu8); free(gpu16);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* The epilogue path (test hook ops.fp8_epilogue=1, read when a plan is made): the same
 * linear cases in a child with the hook set, so the plans of this process stay OUTER. */
static void test_linear_epilogue(void **s) {
    (void)s;
    if (getenv("DL_FP8_EPI_CHILD")) skip();
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(n > 0);
    self[n] = 0;
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "DL_FP8_EPI_CHILD=1 DL_TEST_HOOKS=ops.fp8_epilogue=1 '%s'", self);
    printf("  epilogue path: %s\n", cmd);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    rng_seed(&g_rng, 20261202);
    ops_cpu_init(&g_cpu, 0);
    if (ops_cuda_init(&g_gpu, 0) != 0) {
        printf("SKIP: no CUDA device (ops_cuda_init failed)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_target_forward),
        cmocka_unit_test(test_linear_epilogue),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ops_ctx_destroy(&g_gpu);
    ops_ctx_destroy(&g_cpu);
    return rc;
}
