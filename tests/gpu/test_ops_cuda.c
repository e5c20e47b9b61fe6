/* CUDA backend of common/ops/ops.h held against the CPU backend (the fp32
 * reference): every op on the same random inputs, odd sizes included.
 *
 * Inputs are drawn in f32 and rounded to bf16 before use, so both backends see
 * identical values; outputs are compared by
 *     rel = max |cuda - cpu| / max |cpu|
 * against a tolerance stated per op (bf16 storage of outputs alone gives ~4e-3;
 * GEMMs and attention add bf16 operands and summation-order differences).
 * Exits 77 ("SKIP: no CUDA device") where no GPU is present. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/rng.h"
#include "common/ops/cuda/ops_cuda.h"
#include "common/ops/ops.h"

static ops_ctx_t g_cpu, g_gpu;
static rng_t g_rng;

/* ------------------------------------------------------------ helpers */
static float bf16r(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}
/* n bf16-representable normals times scale (caller frees). */
static float *rnd(size_t n, float scale) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = bf16r(rng_normal(&g_rng) * scale);
    return h;
}
/* CPU backend buffer holding h (f32 act). */
static void *cput(const float *h, size_t n) {
    void *p = g_cpu.impl->malloc_(&g_cpu, n * sizeof(float));
    g_cpu.impl->upload(&g_cpu, p, h, n * sizeof(float));
    return p;
}
/* GPU buffers: act (bf16) from f32, or raw bytes (f32 / i32). */
static void *gput(const float *h, size_t n) {
    void *p = g_gpu.impl->malloc_(&g_gpu, n * 2);
    assert_non_null(p);
    g_gpu.impl->upload_act(&g_gpu, p, h, n);
    return p;
}
static void *gput_raw(const void *h, size_t bytes) {
    void *p = g_gpu.impl->malloc_(&g_gpu, bytes);
    assert_non_null(p);
    g_gpu.impl->upload(&g_gpu, p, h, bytes);
    return p;
}
static float *gget(const void *d, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    g_gpu.impl->download_act(&g_gpu, h, d, n);
    return h;
}
static float *gget_f32(const void *d, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    g_gpu.impl->download(&g_gpu, h, d, n * sizeof(float));
    return h;
}
static void gfree(void *p) { g_gpu.impl->free_(&g_gpu, p); }
static void cfree(void *p) { g_cpu.impl->free_(&g_cpu, p); }

/* Prints and asserts rel = max|got - ref| / max|ref| <= tol; NaN fails. */
static void check(const char *what, const float *ref, const float *got, size_t n, double tol) {
    double md = 0.0, mr = 0.0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(ref[i])) bad = 1;
        double d = fabs((double)got[i] - ref[i]);
        if (d > md) md = d;
        if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    }
    double rel = mr > 0 ? md / mr : md;
    printf("  %-44s n=%-8zu max_abs_err=%.3e max|ref|=%.3e rel=%.3e (tol %.0e)%s\n", what, n, md,
           mr, rel, tol, bad ? " NON-FINITE" : "");
    fflush(stdout);
    assert_false(bad);
    assert_true(rel <= tol);
}

/* ------------------------------------------------------------ matmul */
static void run_matmul(int M, int K, int N, int with_bias) {
    char name[96];
    float *x = rnd((size_t)M * K, 1.0f), *w = rnd((size_t)N * K, 0.05f);
    float *b = rnd(N, 0.5f), *dy = rnd((size_t)M * N, 1.0f);
    float *dw0 = rnd((size_t)N * K, 0.1f), *db0 = rnd(N, 0.1f); /* accumulated onto */
    /* CPU */
    float *cx = cput(x, (size_t)M * K), *cw = cput(w, (size_t)N * K), *cb = cput(b, N);
    float *cy = cput(dy, (size_t)M * N), *cdy = cput(dy, (size_t)M * N);
    float *cdx = cput(x, (size_t)M * K), *cdw = cput(dw0, (size_t)N * K), *cdb = cput(db0, N);
    g_cpu.impl->matmul_forward(&g_cpu, cy, cx, cw, with_bias ? cb : NULL, M, K, N);
    g_cpu.impl->matmul_backward(&g_cpu, cdx, cdw, with_bias ? cdb : NULL, cdy, cx, cw, M, K, N, 0);
    /* GPU */
    void *gx = gput(x, (size_t)M * K), *gw = gput(w, (size_t)N * K), *gb = gput(b, N);
    void *gy = gput(dy, (size_t)M * N), *gdy = gput(dy, (size_t)M * N);
    void *gdx = gput(x, (size_t)M * K);
    float *gdw = gput_raw(dw0, (size_t)N * K * 4), *gdb = gput_raw(db0, (size_t)N * 4);
    g_gpu.impl->matmul_forward(&g_gpu, gy, gx, gw, with_bias ? gb : NULL, M, K, N);
    g_gpu.impl->matmul_backward(&g_gpu, gdx, gdw, with_bias ? gdb : NULL, gdy, gx, gw, M, K, N, 0);
    float *hy = gget(gy, (size_t)M * N), *hdx = gget(gdx, (size_t)M * K);
    float *hdw = gget_f32(gdw, (size_t)N * K), *hdb = gget_f32(gdb, N);
    snprintf(name, sizeof name, "matmul_forward M=%d K=%d N=%d bias=%d", M, K, N, with_bias);
    check(name, cy, hy, (size_t)M * N, 2e-2);
    snprintf(name, sizeof name, "matmul_backward dinp M=%d K=%d N=%d", M, K, N);
    check(name, cdx, hdx, (size_t)M * K, 2e-2);
    snprintf(name, sizeof name, "matmul_backward dweight (+=) M=%d K=%d N=%d", M, K, N);
    check(name, cdw, hdw, (size_t)N * K, 1e-2);
    if (with_bias) check("matmul_backward dbias (+=)", cdb, hdb, N, 1e-2);
    free(x); free(w); free(b); free(dy); free(dw0); free(db0);
    free(hy); free(hdx); free(hdw); free(hdb);
    cfree(cx); cfree(cw); cfree(cb); cfree(cy); cfree(cdy); cfree(cdx); cfree(cdw); cfree(cdb);
    gfree(gx); gfree(gw); gfree(gb); gfree(gy); gfree(gdy); gfree(gdx); gfree(gdw); gfree(gdb);
}

static void test_matmul(void **state) {
    (void)state;
    run_matmul(77, 100, 67, 1);     /* odd sizes: fallback or odd-ld cuBLASLt algorithms */
    run_matmul(256, 512, 384, 1);   /* aligned: cuBLASLt tensor-core path */
    run_matmul(300, 64, 1000, 0);
    run_matmul(1, 128, 96, 1);      /* single row (decode) */
}

/* Accumulating forms: dinp += dout . W (dinp_acc, with dW += alongside) and out = inp . W^T
 * (+ bias) + res, res another buffer (also one 2 bytes off alignment: the plan's C
 * alignment class is the smaller of C's and D's) or out itself; CPU = the two-call
 * sequence (bitwise, test_ops_cpu). Same tolerances as run_matmul. */
static void run_matmul_acc(int M, int K, int N, int with_bias) {
    char name[112];
    size_t mk = (size_t)M * K, mn = (size_t)M * N, nk = (size_t)N * K;
    float *x = rnd(mk, 1.0f), *w = rnd(nk, 0.05f), *b = rnd(N, 0.5f), *dy = rnd(mn, 1.0f);
    float *dx0 = rnd(mk, 1.0f), *r0 = rnd(mn, 1.0f), *dw0 = rnd(nk, 0.1f);
    /* CPU */
    float *cx = cput(x, mk), *cw = cput(w, nk), *cb = cput(b, N), *cdy = cput(dy, mn);
    float *cdx = cput(dx0, mk), *cdw = cput(dw0, nk), *cres = cput(r0, mn);
    float *cy = cput(dy, mn), *cya = cput(r0, mn);
    const float *cbias = with_bias ? cb : NULL;
    g_cpu.impl->matmul_backward(&g_cpu, cdx, cdw, NULL, cdy, cx, cw, M, K, N, 1);
    g_cpu.impl->matmul_forward_res(&g_cpu, cy, cx, cw, cbias, cres, M, K, N);
    g_cpu.impl->matmul_forward_res(&g_cpu, cya, cx, cw, cbias, cya, M, K, N);
    /* GPU */
    void *gx = gput(x, mk), *gw = gput(w, nk), *gb = gput(b, N), *gdy = gput(dy, mn);
    void *gdx = gput(dx0, mk), *gres = gput(r0, mn), *gy = gput(dy, mn), *gya = gput(r0, mn);
    float *gdw = gput_raw(dw0, nk * 4);
    void *gmis = g_gpu.impl->malloc_(&g_gpu, (mn + 1) * 2), *gy2 = gput(dy, mn);
    assert_non_null(gmis);
    g_gpu.impl->upload_act(&g_gpu, (char *)gmis + 2, r0, mn);
    const void *gbias = with_bias ? gb : NULL;
    g_gpu.impl->matmul_backward(&g_gpu, gdx, gdw, NULL, gdy, gx, gw, M, K, N, 1);
    g_gpu.impl->matmul_forward_res(&g_gpu, gy, gx, gw, gbias, gres, M, K, N);
    g_gpu.impl->matmul_forward_res(&g_gpu, gya, gx, gw, gbias, gya, M, K, N);
    g_gpu.impl->matmul_forward_res(&g_gpu, gy2, gx, gw, gbias, (char *)gmis + 2, M, K, N);
    float *hdx = gget(gdx, mk), *hdw = gget_f32(gdw, nk), *hy = gget(gy, mn);
    float *hya = gget(gya, mn), *hy2 = gget(gy2, mn);
    snprintf(name, sizeof name, "matmul_backward dinp (+=) M=%d K=%d N=%d", M, K, N);
    check(name, cdx, hdx, mk, 2e-2);
    snprintf(name, sizeof name, "  with dweight (+=) M=%d K=%d N=%d", M, K, N);
    check(name, cdw, hdw, nk, 1e-2);
    snprintf(name, sizeof name, "matmul_forward_res M=%d K=%d N=%d bias=%d", M, K, N, with_bias);
    check(name, cy, hy, mn, 2e-2);
    snprintf(name, sizeof name, "  res == out M=%d K=%d N=%d", M, K, N);
    check(name, cya, hya, mn, 2e-2);
    snprintf(name, sizeof name, "  res 2 bytes off M=%d K=%d N=%d", M, K, N);
    check(name, cy, hy2, mn, 2e-2);
    free(x); free(w); free(b); free(dy); free(dx0); free(r0); free(dw0);
    free(hdx); free(hdw); free(hy); free(hya); free(hy2);
    cfree(cx); cfree(cw); cfree(cb); cfree(cdy); cfree(cdx); cfree(cdw); cfree(cres); cfree(cy);
    cfree(cya);
    gfree(gx); gfree(gw); gfree(gb); gfree(gdy); gfree(gdx); gfree(gres); gfree(gy); gfree(gya);
    gfree(gdw); gfree(gmis); gfree(gy2);
}

static void test_matmul_acc(void **state) {
    (void)state;
    run_matmul_acc(77, 100, 67, 1);    /* odd sizes */
    run_matmul_acc(256, 512, 384, 1);  /* aligned: cuBLASLt tensor-core path */
    run_matmul_acc(300, 64, 1000, 0);
    run_matmul_acc(1, 128, 96, 1);     /* single row */
}

/* matmul.cu's per-shape picks (GEMM_PICKS): a Qwen3-8B-sized forward (K 4096, N 4096) and
 * k/v dinp (K 4096, N 1024) at 8,192 rows take the picked cuBLASLt candidate on a compute
 * capability 9.0 GPU with the cuBLASLt they were measured with (none elsewhere), and agree
 * with the CPU as any algorithm must. */
static void test_gemm_picks(void **state) {
    (void)state;
    int before = ops_cuda_gemm_picks_taken();
    assert_int_equal(ops_cuda_gemm_picks(-1), 1);  /* the default */
    run_matmul(8192, 4096, 4096, 0);
    run_matmul(8192, 4096, 1024, 0);
    int taken = ops_cuda_gemm_picks_taken() - before;
    struct cudaDeviceProp prop;
    assert_int_equal(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    int measured = ops_cuda_gemm_picks_measured();
    printf("  GEMM picks taken: %d (%s, compute capability %d.%d, cuBLASLt %zu: %s)\n", taken,
           prop.name, prop.major, prop.minor, cublasLtGetVersion(),
           measured ? "the picks' version" : "not the picks' version: none taken");
    if (prop.major == 9 && prop.minor == 0 && measured) assert_true(taken >= 2);  /* fwd, dinp */
    if (!measured) assert_int_equal(taken, 0);
}

/* The fallback GEMM kernel on every shape (test hook ops.gemm_fallback=1, read when a plan
 * is made): test_matmul and test_matmul_acc again in a child with the hook set, so this
 * process keeps its cuBLASLt plans. */
static void test_matmul_fallback(void **state) {
    (void)state;
    if (getenv("DL_GEMM_FALLBACK_CHILD")) skip();
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(n > 0);
    self[n] = 0;
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "DL_GEMM_FALLBACK_CHILD=1 DL_TEST_HOOKS=ops.gemm_fallback=1 '%s'",
             self);
    printf("  fallback kernel: %s\n", cmd);
    fflush(stdout);
    assert_int_equal(system(cmd), 0);
}

/* ------------------------------------------------------------ rmsnorm */
static void run_rmsnorm(int N, int C) {
    char name[96];
    float *x = rnd((size_t)N * C, 2.0f), *w = rnd(C, 1.0f), *dy = rnd((size_t)N * C, 1.0f);
    float *dw0 = rnd(C, 0.1f);
    float *cx = cput(x, (size_t)N * C), *cw = cput(w, C), *cy = cput(x, (size_t)N * C);
    float *crs = cput(x, N), *cdx = cput(x, (size_t)N * C), *cdy = cput(dy, (size_t)N * C);
    float *cdw = cput(dw0, C);
    g_cpu.impl->rmsnorm_forward(&g_cpu, cy, crs, cx, cw, 1e-6f, N, C);
    g_cpu.impl->rmsnorm_backward(&g_cpu, cdx, cdw, cdy, cx, cw, crs, N, C);
    void *gx = gput(x, (size_t)N * C), *gw = gput(w, C), *gy = gput(x, (size_t)N * C);
    float *grs = gput_raw(x, (size_t)N * 4), *gdw = gput_raw(dw0, (size_t)C * 4);
    void *gdx = gput(x, (size_t)N * C), *gdy = gput(dy, (size_t)N * C);
    g_gpu.impl->rmsnorm_forward(&g_gpu, gy, grs, gx, gw, 1e-6f, N, C);
    g_gpu.impl->rmsnorm_backward(&g_gpu, gdx, gdw, gdy, gx, gw, grs, N, C);
    float *hy = gget(gy, (size_t)N * C), *hrs = gget_f32(grs, N);
    float *hdx = gget(gdx, (size_t)N * C), *hdw = gget_f32(gdw, C);
    snprintf(name, sizeof name, "rmsnorm_forward N=%d C=%d", N, C);
    check(name, cy, hy, (size_t)N * C, 1e-2);
    check("rmsnorm_forward rstd", crs, hrs, N, 1e-5);
    snprintf(name, sizeof name, "rmsnorm_backward dinp N=%d C=%d", N, C);
    check(name, cdx, hdx, (size_t)N * C, 1e-2);
    check("rmsnorm_backward dweight (+=)", cdw, hdw, C, 1e-3);
    /* dinp aliasing dout (allowed by the CPU contract) */
    g_gpu.impl->rmsnorm_backward(&g_gpu, gdy, NULL, gdy, gx, gw, grs, N, C);
    float *hal = gget(gdy, (size_t)N * C);
    check("rmsnorm_backward dinp aliasing dout", cdx, hal, (size_t)N * C, 1e-2);
    free(x); free(w); free(dy); free(dw0); free(hy); free(hrs); free(hdx); free(hdw); free(hal);
    cfree(cx); cfree(cw); cfree(cy); cfree(crs); cfree(cdx); cfree(cdy); cfree(cdw);
    gfree(gx); gfree(gw); gfree(gy); gfree(grs); gfree(gdw); gfree(gdx); gfree(gdy);
}
static void test_rmsnorm(void **state) {
    (void)state;
    run_rmsnorm(37, 200);    /* warp per row, registers */
    run_rmsnorm(1000, 128);  /* q/k-norm shape */
    run_rmsnorm(9, 127);     /* odd C: general path */
    run_rmsnorm(64, 4096);   /* 16-byte vector path, 128 threads per row */
    run_rmsnorm(37, 256);    /* vector path, a warp per row, 8 rows per block: a partial block */
    run_rmsnorm(33, 2048);   /* vector path, 64 threads per row, 4 rows per block */
    run_rmsnorm(7, 8192);    /* vector path, 256 threads per row */
    run_rmsnorm(3001, 4096); /* vector path, several rows per team (dweight partials add up) */
    run_rmsnorm(16, 4100);   /* C % 8 != 0: the bf16-pair path, block per row */
    run_rmsnorm(5, 13000); /* dweight partials too large for shared memory */
}

/* add_rmsnorm_forward (the target's residual add with the next norm): bitwise add then
 * rmsnorm_forward on the GPU, out over res as the target calls it; the x it leaves is the
 * add's; and near the CPU backend's. The vector path and the fallback (C % 8 != 0). */
static void run_add_rmsnorm(int N, int C) {
    size_t n = (size_t)N * C;
    float *x = rnd(n, 2.0f), *r = rnd(n, 1.0f), *w = rnd((size_t)C, 1.0f);
    void *ax = gput(x, n), *ar = gput(r, n), *ao = gput(x, n), *bx = gput(x, n), *br = gput(r, n);
    void *gw = gput(w, (size_t)C);
    float *ars = gput_raw(x, (size_t)N * 4), *brs = gput_raw(r, (size_t)N * 4);
    g_gpu.impl->add(&g_gpu, ax, ax, ar, n);
    g_gpu.impl->rmsnorm_forward(&g_gpu, ao, ars, ax, gw, 1e-6f, N, C);
    g_gpu.impl->add_rmsnorm_forward(&g_gpu, bx, br, brs, br, gw, 1e-6f, N, C);
    uint16_t *h[4];
    void *dv[4] = {ax, ao, bx, br};
    for (int i = 0; i < 4; i++) {
        h[i] = malloc(n * 2);
        g_gpu.impl->download(&g_gpu, h[i], dv[i], n * 2);
    }
    float *hrs_a = gget_f32(ars, (size_t)N), *hrs_b = gget_f32(brs, (size_t)N);
    assert_memory_equal(h[0], h[2], n * 2);   /* x = x + res */
    assert_memory_equal(h[1], h[3], n * 2);   /* the norm */
    assert_memory_equal(hrs_a, hrs_b, (size_t)N * 4);
    float *cx = cput(x, n), *cr = cput(r, n), *cw = cput(w, (size_t)C);
    g_cpu.impl->add_rmsnorm_forward(&g_cpu, cx, cr, NULL, cr, cw, 1e-6f, N, C);
    float *gx = gget(bx, n), *go = gget(br, n);
    char name[96];
    snprintf(name, sizeof name, "add_rmsnorm x N=%d C=%d vs CPU", N, C);
    check(name, cx, gx, n, 1e-2);
    snprintf(name, sizeof name, "add_rmsnorm out N=%d C=%d vs CPU", N, C);
    check(name, cr, go, n, 2e-2);
    for (int i = 0; i < 4; i++) free(h[i]);
    free(x); free(r); free(w); free(hrs_a); free(hrs_b); free(gx); free(go);
    cfree(cx); cfree(cr); cfree(cw);
    gfree(ax); gfree(ar); gfree(ao); gfree(bx); gfree(br); gfree(gw); gfree(ars); gfree(brs);
}

static void test_add_rmsnorm(void **state) {
    (void)state;
    run_add_rmsnorm(3001, 4096);   /* vector path, 128 threads per row (the 8B target) */
    run_add_rmsnorm(37, 256);      /* vector path, a warp per row, a partial block */
    run_add_rmsnorm(33, 2048);     /* vector path, 64 threads per row */
    run_add_rmsnorm(7, 8192);      /* vector path, 256 threads per row (the block reduction) */
    run_add_rmsnorm(16, 4100);     /* C % 8 != 0: the two ops */
}

/* ------------------------------------------------------------ rope */
static void test_rope(void **state) {
    (void)state;
    const int N = 29, nh = 3, hd = 64;
    size_t n = (size_t)N * nh * hd;
    rope_params_t rp = {.theta = 1e6};
    float inv[64];
    ops_rope_inv_freq(&rp, hd, inv);
    int32_t pos[29];
    for (int i = 0; i < N; i++) pos[i] = (int32_t)rng_below(&g_rng, 5000);
    float *x = rnd(n, 1.0f);
    float *cx = cput(x, n), *cd = cput(x, n);
    void *gx = gput(x, n), *gd = gput(x, n);
    int32_t *gpos = gput_raw(pos, sizeof pos);
    float *ginv = gput_raw(inv, sizeof(float) * hd / 2);
    g_cpu.impl->rope_forward(&g_cpu, cx, pos, inv, N, nh, hd);
    g_cpu.impl->rope_backward(&g_cpu, cd, pos, inv, N, nh, hd);
    g_gpu.impl->rope_forward(&g_gpu, gx, gpos, ginv, N, nh, hd);
    g_gpu.impl->rope_backward(&g_gpu, gd, gpos, ginv, N, nh, hd);
    float *hx = gget(gx, n), *hd_ = gget(gd, n);
    check("rope_forward N=29 nh=3 hd=64 pos<5000", cx, hx, n, 1e-2);
    check("rope_backward", cd, hd_, n, 1e-2);
    free(x); free(hx); free(hd_);
    cfree(cx); cfree(cd); gfree(gx); gfree(gd); gfree(gpos); gfree(ginv);
}

/* ------------------------------------------------------------ elementwise */
static void run_elementwise(size_t n) {
    char name[96];
    float *g = rnd(n, 2.0f), *u = rnd(n, 1.0f), *dy = rnd(n, 1.0f);
    float *cg = cput(g, n), *cu = cput(u, n), *cdy = cput(dy, n), *co = cput(g, n);
    float *cdg = cput(g, n), *cdu = cput(g, n), *cadd = cput(g, n), *cax = cput(u, n);
    void *gg = gput(g, n), *gu = gput(u, n), *gdy = gput(dy, n), *go = gput(g, n);
    void *gdg = gput(g, n), *gdu = gput(g, n), *gadd = gput(g, n), *gax = gput(u, n);
    g_cpu.impl->swiglu_forward(&g_cpu, co, cg, cu, n);
    g_cpu.impl->swiglu_backward(&g_cpu, cdg, cdu, cdy, cg, cu, n);
    g_cpu.impl->add(&g_cpu, cadd, cg, cu, n);
    g_cpu.impl->axpy(&g_cpu, cax, -0.37f, cdy, n);
    g_gpu.impl->swiglu_forward(&g_gpu, go, gg, gu, n);
    g_gpu.impl->swiglu_backward(&g_gpu, gdg, gdu, gdy, gg, gu, n);
    g_gpu.impl->add(&g_gpu, gadd, gg, gu, n);
    g_gpu.impl->axpy(&g_gpu, gax, -0.37f, gdy, n);
    float *ho = gget(go, n), *hdg = gget(gdg, n), *hdu = gget(gdu, n);
    float *hadd = gget(gadd, n), *hax = gget(gax, n);
    snprintf(name, sizeof name, "swiglu_forward n=%zu", n);
    check(name, co, ho, n, 1e-2);
    check("swiglu_backward dgate", cdg, hdg, n, 1e-2);
    check("swiglu_backward dup", cdu, hdu, n, 1e-2);
    check("add", cadd, hadd, n, 1e-2);
    check("axpy", cax, hax, n, 1e-2);
    free(g); free(u); free(dy); free(ho); free(hdg); free(hdu); free(hadd); free(hax);
    cfree(cg); cfree(cu); cfree(cdy); cfree(co); cfree(cdg); cfree(cdu); cfree(cadd); cfree(cax);
    gfree(gg); gfree(gu); gfree(gdy); gfree(go); gfree(gdg); gfree(gdu); gfree(gadd); gfree(gax);
}
static void test_elementwise(void **state) {
    (void)state;
    run_elementwise(1003);   /* scalar path */
    run_elementwise(65536);  /* 16-byte path */
}

static void test_embedding(void **state) {
    (void)state;
    const int V = 50, C = 72, T = 33;
    float *tab = rnd((size_t)V * C, 1.0f);
    int32_t ids[33];
    for (int i = 0; i < T; i++) ids[i] = (int32_t)rng_below(&g_rng, V);
    float *cout_ = cput(tab, (size_t)T * C), *ctab = cput(tab, (size_t)V * C);
    void *gout = gput(tab, (size_t)T * C), *gtab = gput(tab, (size_t)V * C);
    int32_t *gids = gput_raw(ids, sizeof ids);
    g_cpu.impl->embedding_forward(&g_cpu, cout_, ids, ctab, T, C);
    g_gpu.impl->embedding_forward(&g_gpu, gout, gids, gtab, T, C);
    float *h = gget(gout, (size_t)T * C);
    check("embedding_forward V=50 C=72 T=33 (exact)", cout_, h, (size_t)T * C, 0.0);
    free(tab); free(h); cfree(cout_); cfree(ctab); gfree(gout); gfree(gtab); gfree(gids);
}

/* ------------------------------------------------------------ cross-entropy */
static void run_xent(int N, int V) {
    char name[96];
    size_t n = (size_t)N * V;
    float *lg = rnd(n, 3.0f);
    int32_t *tg = malloc(N * sizeof(int32_t));
    float *w = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
        tg[i] = (int32_t)rng_below(&g_rng, V);
        w[i] = (i % 5 == 3) ? 0.0f : expf(-(float)(i % 16) / 7.0f);
    }
    /* make a few rows predict their target, so `correct` is not all zeros */
    for (int i = 0; i < N; i += 3) lg[(size_t)i * V + tg[i]] = 20.0f;
    /* exact ties, which go to the lowest index: row 1's two maxima are 5 and the target V-1
     * (other threads, not correct); row 2's the target 7, then 8 (one 8-logit load) and V-2
     * (correct); row 4's 9, then the target 10 (one load, not correct) */
    tg[1] = V - 1, lg[(size_t)1 * V + 5] = lg[(size_t)1 * V + V - 1] = 25.0f;
    tg[2] = 7, lg[(size_t)2 * V + 7] = lg[(size_t)2 * V + 8] = lg[(size_t)2 * V + V - 2] = 25.0f;
    tg[4] = 10, lg[(size_t)4 * V + 9] = lg[(size_t)4 * V + 10] = 25.0f;
    float *cl = cput(lg, n), *closs = cput(w, N), *ccor = cput(w, N);
    void *gl = gput(lg, n);
    float *gloss = gput_raw(w, N * 4), *gcor = gput_raw(w, N * 4), *gw = gput_raw(w, N * 4);
    int32_t *gtg = gput_raw(tg, N * 4);
    g_cpu.impl->xent_forward_backward(&g_cpu, cl, closs, ccor, tg, w, 0.25f, N, V);
    g_gpu.impl->xent_forward_backward(&g_gpu, gl, gloss, gcor, gtg, gw, 0.25f, N, V);
    float *hl = gget(gl, n), *hloss = gget_f32(gloss, N), *hcor = gget_f32(gcor, N);
    snprintf(name, sizeof name, "xent dlogits N=%d V=%d", N, V);
    check(name, cl, hl, n, 1e-2);
    check("xent loss", closs, hloss, N, 1e-4);
    check("xent correct (exact)", ccor, hcor, N, 0.0);
    free(lg); free(tg); free(w); free(hl); free(hloss); free(hcor);
    cfree(cl); cfree(closs); cfree(ccor);
    gfree(gl); gfree(gloss); gfree(gcor); gfree(gw); gfree(gtg);
}
static void test_xent(void **state) {
    (void)state;
    run_xent(13, 3001);   /* one logit at a time (V % 8 != 0) */
    run_xent(20, 151936); /* Qwen3 vocabulary: 8-logit loads */
    run_xent(7, 4104);    /* fewer 8-logit loads than threads: the single-load tail alone */
}

/* ------------------------------------------------------------ sumsq + adamw */
static void test_adamw(void **state) {
    (void)state;
    const size_t n = 100003;
    float *master = rnd(n, 1.0f), *grad = rnd(n, 3.0f), *m = rnd(n, 0.01f), *v = rnd(n, 0.01f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *cmst = cput(master, n), *cm = cput(m, n), *cv = cput(v, n), *cgr = cput(grad, n);
    float cns[1];
    float *gmst = gput_raw(master, n * 4), *gm = gput_raw(m, n * 4), *gv = gput_raw(v, n * 4);
    float *ggr = gput_raw(grad, n * 4), *gns = gput_raw(cns, 4);
    void *gwork = gput(master, n);
    /* norm over two "tensors": first half assigned, second accumulated */
    g_cpu.impl->sumsq(&g_cpu, cns, cgr, n / 2, 0);
    g_cpu.impl->sumsq(&g_cpu, cns, cgr + n / 2, n - n / 2, 1);
    g_gpu.impl->sumsq(&g_gpu, gns, ggr, n / 2, 0);
    g_gpu.impl->sumsq(&g_gpu, gns, ggr + n / 2, n - n / 2, 1);
    float *hns = gget_f32(gns, 1);
    check("sumsq (two calls, accumulate)", cns, hns, 1, 1e-5);
    /* max_norm well below the norm: the clip scale is active */
    for (int t = 1; t <= 3; t++) {
        g_cpu.impl->adamw(&g_cpu, cmst, NULL, cgr, cm, cv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t,
                          cns, 1.0f);
        g_gpu.impl->adamw(&g_gpu, gmst, gwork, ggr, gm, gv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t,
                          gns, 1.0f);
    }
    float *hm = gget_f32(gmst, n), *hmm = gget_f32(gm, n), *hv = gget_f32(gv, n);
    float *hw = gget(gwork, n);
    check("adamw master (3 steps, clipped)", cmst, hm, n, 1e-5);
    check("adamw m", cm, hmm, n, 1e-5);
    check("adamw v", cv, hv, n, 1e-5);
    check("adamw work (bf16 copy of master)", cmst, hw, n, 5e-3);
    free(master); free(grad); free(m); free(v); free(hns); free(hm); free(hmm); free(hv); free(hw);
    cfree(cmst); cfree(cm); cfree(cv); cfree(cgr);
    gfree(gmst); gfree(gm); gfree(gv); gfree(ggr); gfree(gns); gfree(gwork);
}

/* f32_add_scale: the optimizer's in-order gradient sum. Bitwise equal to the CPU
 * backend (and to a plain C reference), 3 micro-batches: out = (g0 + g1), then
 * (out + g2) * s, and b == NULL: a * s. */
static void test_f32_add_scale(void **state) {
    (void)state;
    const size_t n = 100003;
    float *g0 = rnd(n, 1.0f), *g1 = rnd(n, 2.0f), *g2 = rnd(n, 0.5f);
    const float s = 1.0f / 3.7f;
    float *ref = malloc(n * 4), *ref1 = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        float a = g0[i] + g1[i];
        a = a + g2[i];
        ref[i] = a * s;
        ref1[i] = g0[i] * s;
    }
    float *c0 = cput(g0, n), *c1 = cput(g1, n), *c2 = cput(g2, n), *cout = cput(g0, n);
    g_cpu.impl->f32_add_scale(&g_cpu, cout, c0, c1, 1.0f, n);
    g_cpu.impl->f32_add_scale(&g_cpu, cout, cout, c2, s, n);
    float *d0 = gput_raw(g0, n * 4), *d1 = gput_raw(g1, n * 4), *d2 = gput_raw(g2, n * 4);
    float *dout = gput_raw(g0, n * 4);
    g_gpu.impl->f32_add_scale(&g_gpu, dout, d0, d1, 1.0f, n);
    g_gpu.impl->f32_add_scale(&g_gpu, dout, dout, d2, s, n);
    float *h = gget_f32(dout, n);
    assert_memory_equal(cout, ref, n * 4);
    assert_memory_equal(h, ref, n * 4);
    g_gpu.impl->f32_add_scale(&g_gpu, dout, d0, NULL, s, n);
    float *h1 = gget_f32(dout, n);
    assert_memory_equal(h1, ref1, n * 4);
    free(g0); free(g1); free(g2); free(ref); free(ref1); free(h); free(h1);
    cfree(c0); cfree(c1); cfree(c2); cfree(cout);
    gfree(d0); gfree(d1); gfree(d2); gfree(dout);
}

/* The optimizer's fused step (sumsq_scaled, adamw_pub) against the passes it replaces on
 * the same device (f32_add_scale into a sum buffer, sumsq, adamw, copy to the published
 * weights): bitwise equal, 3 steps with the clip active; once at 16-byte aligned pointers
 * (the 4-wide kernel and the tail of n % 4), once 4 bytes off (the element-wise kernel).
 * And against the CPU backend's twins. */
static void run_adamw_pub(size_t off) {
    const size_t n = 100003, N = n + 4;
    float *master = rnd(N, 1.0f), *grad = rnd(N, 3.0f), *m = rnd(N, 0.01f), *v = rnd(N, 0.01f);
    for (size_t i = 0; i < N; i++) v[i] = fabsf(v[i]);
    const float inv_w = 1.0f / 3.7f;
    float ns0 = 0;
    /* a: the passes; b: fused; each its own copy of the state */
    float *am = gput_raw(master, N * 4), *a1 = gput_raw(m, N * 4), *a2 = gput_raw(v, N * 4);
    float *bm = gput_raw(master, N * 4), *b1 = gput_raw(m, N * 4), *b2 = gput_raw(v, N * 4);
    float *gr = gput_raw(grad, N * 4), *gs = gput_raw(grad, N * 4);
    float *apub = gput_raw(master, N * 4), *bpub = gput_raw(master, N * 4);
    float *ans = gput_raw(&ns0, 4), *bns = gput_raw(&ns0, 4);
    float *cm = cput(master, N), *c1 = cput(m, N), *c2 = cput(v, N), *cg = cput(grad, N);
    float *cpub = cput(master, N), cns[1];
    for (int t = 1; t <= 3; t++) {
        g_gpu.impl->f32_add_scale(&g_gpu, gs + off, gr + off, NULL, inv_w, n);
        g_gpu.impl->sumsq(&g_gpu, ans, gs + off, n, 0);
        g_gpu.impl->adamw(&g_gpu, am + off, NULL, gs + off, a1 + off, a2 + off, n, 1e-3f, 0.9f,
                          0.95f, 1e-8f, 0.1f, t, ans, 1.0f);
        g_gpu.impl->copy(&g_gpu, apub + off, am + off, n * 4);
        g_gpu.impl->sumsq_scaled(&g_gpu, bns, gr + off, inv_w, n);
        g_gpu.impl->adamw_pub(&g_gpu, bm + off, bpub + off, gr + off, inv_w, b1 + off, b2 + off,
                              n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, bns, 1.0f);
        g_cpu.impl->sumsq_scaled(&g_cpu, cns, cg + off, inv_w, n);
        g_cpu.impl->adamw_pub(&g_cpu, cm + off, cpub + off, cg + off, inv_w, c1 + off, c2 + off,
                              n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, cns, 1.0f);
    }
    float *ha[] = {gget_f32(ans, 1), gget_f32(am, N), gget_f32(a1, N), gget_f32(a2, N), gget_f32(apub, N)};
    float *hb[] = {gget_f32(bns, 1), gget_f32(bm, N), gget_f32(b1, N), gget_f32(b2, N), gget_f32(bpub, N)};
    assert_true(ha[0][0] > 1.0f);   /* the clip (max_norm 1) is active */
    assert_memory_equal(ha[0], hb[0], 4);
    for (int i = 1; i < 5; i++) assert_memory_equal(ha[i], hb[i], N * 4);
    assert_memory_equal(hb[1], hb[4], N * 4);   /* published = master */
    check("adamw_pub norm_sq vs CPU", cns, hb[0], 1, 1e-5);
    check("adamw_pub master vs CPU", cm, hb[1], N, 1e-5);
    check("adamw_pub m vs CPU", c1, hb[2], N, 1e-5);
    check("adamw_pub v vs CPU", c2, hb[3], N, 1e-5);
    check("adamw_pub pub vs CPU", cpub, hb[4], N, 1e-5);
    for (int i = 0; i < 5; i++) { free(ha[i]); free(hb[i]); }
    free(master); free(grad); free(m); free(v);
    cfree(cm); cfree(c1); cfree(c2); cfree(cg); cfree(cpub);
    gfree(am); gfree(a1); gfree(a2); gfree(bm); gfree(b1); gfree(b2); gfree(gr); gfree(gs);
    gfree(apub); gfree(bpub); gfree(ans); gfree(bns);
}

/* f32_to_act (the drafter's weights from the optimizer's slab): bitwise the host's
 * conversion (upload_act), 16-byte aligned (4 a thread, then the tail) and 4 bytes off. */
static void test_f32_to_act(void **state) {
    (void)state;
    const size_t n = 100003;
    float *h = rnd(n + 1, 7.0f);
    for (size_t i = 0; i < n + 1; i++) h[i] *= 1.0f + 1e-3f * (float)(i % 97);   /* not bf16 */
    float *src = gput_raw(h, (n + 1) * 4);
    for (size_t off = 0; off < 2; off++) {
        void *ref = gput(h + off, n), *got = gput(h, n + 1);
        g_gpu.impl->f32_to_act(&g_gpu, got, src + off, n);
        uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
        g_gpu.impl->download(&g_gpu, a, ref, n * 2);
        g_gpu.impl->download(&g_gpu, b, got, n * 2);
        assert_memory_equal(a, b, n * 2);
        free(a); free(b); gfree(ref); gfree(got);
    }
    free(h); gfree(src);
}

/* adamw_pub's 4-wide kernel against its element-wise one on the same values: the state at
 * a 16-byte aligned address, then 4 bytes off; 3 steps; bitwise equal. */
static void adamw_pub_at(size_t off, const float *const *h, size_t n, float **out) {
    float *d[5], ns = 0;
    for (int i = 0; i < 5; i++) {
        d[i] = g_gpu.impl->malloc_(&g_gpu, (n + 1) * 4);
        assert_non_null(d[i]);
        g_gpu.impl->upload(&g_gpu, d[i] + off, h[i < 4 ? i : 0], n * 4);
    }
    float *dns = gput_raw(&ns, 4);
    g_gpu.impl->sumsq_scaled(&g_gpu, dns, d[1] + off, 0.5f, n);
    for (int t = 1; t <= 3; t++)
        g_gpu.impl->adamw_pub(&g_gpu, d[0] + off, d[4] + off, d[1] + off, 0.5f, d[2] + off,
                              d[3] + off, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, dns, 1.0f);
    for (int i = 0; i < 5; i++) {
        out[i] = malloc(n * 4);
        g_gpu.impl->download(&g_gpu, out[i], d[i] + off, n * 4);
        gfree(d[i]);
    }
    gfree(dns);
}

static void test_adamw_pub(void **state) {
    (void)state;
    run_adamw_pub(0);
    run_adamw_pub(1);
    const size_t n = 4099;
    float *h[4] = {rnd(n, 1.0f), rnd(n, 3.0f), rnd(n, 0.01f), rnd(n, 0.01f)};
    for (size_t i = 0; i < n; i++) h[3][i] = fabsf(h[3][i]);
    float *a[5], *b[5];
    adamw_pub_at(0, (const float *const *)h, n, a);
    adamw_pub_at(1, (const float *const *)h, n, b);
    for (int i = 0; i < 5; i++) {
        assert_memory_equal(a[i], b[i], n * 4);
        free(a[i]); free(b[i]);
    }
    for (int i = 0; i < 4; i++) free(h[i]);
}

/* ------------------------------------------------------------ attention (varlen, causal) */
static void run_varlen(const int *lens, int nseq, int H, int Hkv, int hd) {
    char name[128];
    int32_t cu[16];
    cu[0] = 0;
    int maxlen = 0;
    for (int s = 0; s < nseq; s++) {
        cu[s + 1] = cu[s] + lens[s];
        if (lens[s] > maxlen) maxlen = lens[s];
    }
    int T = cu[nseq];
    size_t nq = (size_t)T * H * hd, nk = (size_t)T * Hkv * hd;
    float *q = rnd(nq, 1.0f), *k = rnd(nk, 1.0f), *v = rnd(nk, 1.0f);
    float *cq = cput(q, nq), *ck = cput(k, nk), *cv = cput(v, nk), *co = cput(q, nq);
    void *gq = gput(q, nq), *gk = gput(k, nk), *gv = gput(v, nk), *go = gput(q, nq);
    int32_t *gcu = gput_raw(cu, (size_t)(nseq + 1) * 4);
    g_cpu.impl->attention_varlen_forward(&g_cpu, co, cq, ck, cv, cu, nseq, maxlen, T, H, Hkv, hd);
    for (int variant = 0; variant <= OPS_CUDA_ATTN_VARLEN_VARIANTS; variant++) { /* 0: the ops table's; then each kernel */
        g_gpu.impl->upload_act(&g_gpu, go, q, nq); /* poison: every element must be written */
        if (variant == 0)
            g_gpu.impl->attention_varlen_forward(&g_gpu, go, gq, gk, gv, gcu, nseq, maxlen, T, H,
                                                 Hkv, hd);
        else
            ops_cuda_attention_varlen_forward_variant(&g_gpu, variant, go, gq, gk, gv, gcu, nseq,
                                                      maxlen, T, H, Hkv, hd);
        float *ho = gget(go, nq);
        int runs = ops_cuda_attention_varlen_resolve(variant, hd);
        if (variant != 0 && runs != variant && hd == 128)   /* the wgmma kernels need sm_90a */
            printf("note: attention_varlen v%d: not on this GPU, v%d ran\n", variant, runs);
        int off = snprintf(name, sizeof name, "attention_varlen v%d H=%d Hkv=%d hd=%d lens=",
                           variant, H, Hkv, hd);
        for (int s = 0; s < nseq && off < 110; s++)
            off += snprintf(name + off, sizeof name - off, "%d%s", lens[s], s + 1 < nseq ? "," : "");
        check(name, co, ho, nq, 2e-2);
        free(ho);
    }
    free(q); free(k); free(v);
    cfree(cq); cfree(ck); cfree(cv); cfree(co);
    gfree(gq); gfree(gk); gfree(gv); gfree(go); gfree(gcu);
}
static void test_attention_varlen(void **state) {
    (void)state;
    const int lens[] = {1, 7, 64, 300};
    run_varlen(lens, 4, 4, 2, 64);   /* GQA 2:1 */
    run_varlen(lens, 4, 8, 2, 128);  /* GQA 4:1, Qwen3 head dim */
    run_varlen(lens, 4, 3, 3, 36);   /* MHA, unaligned head dim (scalar loads) */
    const int one[] = {300};
    run_varlen(one, 1, 2, 1, 96);
    const int lens2[] = {129, 1, 65};
    run_varlen(lens2, 3, 4, 1, 32);
    /* head dim 128, several 128- and 192-row blocks: the wgmma variant with warpgroups
     * past the end (129, 200), exact tiles (256), a long sequence (1000); GQA 4:1 over two
     * kv heads (the kv-head offset) */
    const int lens3[] = {129, 1000, 256, 200};
    run_varlen(lens3, 4, 8, 2, 128);
}

/* ------------------------------------------------------------ DFlash block attention */
/* nseq > 0: DFlash's layout, Nb / nseq blocks per sequence of Tc / nseq context rows,
 * each seeing [seq start, anchor) with anchors sorted per sequence (as the drafter);
 * nseq == 0: a mix of empty contexts, prefixes and arbitrary windows (consecutive blocks'
 * windows overlap, nest or are disjoint: every path of the pair kernel). */
static void run_block_ctx(int Nb, int B, int Tc, int H, int Hkv, int hd, int nseq) {
    char name[160];
    int32_t cs[512], cl[512];
    assert_true(Nb <= 512);
    for (int j = 0; j < Nb; j++) {
        int kind = j % 4;
        if (nseq > 0) {
            int per = Nb / nseq, L = Tc / nseq, s = j / per < nseq ? j / per : nseq - 1;
            cs[j] = s * L;
            int32_t x = (int32_t)rng_below(&g_rng, L), i = j;
            for (; i > s * per && cl[i - 1] > x; i--) cl[i] = cl[i - 1];  /* insertion sort */
            cl[i] = x;
        } else if (kind == 0) { cs[j] = 0; cl[j] = 0; }
        else if (kind == 1) { cs[j] = 0; cl[j] = 1 + (int)rng_below(&g_rng, Tc); }
        else {
            cs[j] = (int)rng_below(&g_rng, Tc);
            cl[j] = 1 + (int)rng_below(&g_rng, Tc - cs[j]);
        }
    }
    size_t nq = (size_t)Nb * B * H * hd, nkb = (size_t)Nb * B * Hkv * hd;
    size_t nkc = (size_t)Tc * Hkv * hd, nl = (size_t)Nb * B * H;
    float *q = rnd(nq, 1.0f), *kb = rnd(nkb, 1.0f), *vb = rnd(nkb, 1.0f);
    float *kc = rnd(nkc, 1.0f), *vc = rnd(nkc, 1.0f), *dout = rnd(nq, 1.0f);
    /* CPU */
    float *cq = cput(q, nq), *ckb = cput(kb, nkb), *cvb = cput(vb, nkb), *ckc = cput(kc, nkc);
    float *cvc = cput(vc, nkc), *cdo = cput(dout, nq), *co = cput(q, nq), *clse = cput(q, nl);
    float *cdq = cput(q, nq), *cdkb = cput(kb, nkb), *cdvb = cput(kb, nkb);
    float *cdkc = cput(kc, nkc), *cdvc = cput(kc, nkc);
    g_cpu.impl->attention_block_forward(&g_cpu, co, clse, cq, ckb, cvb, ckc, cvc, cs, cl, Nb, B,
                                        Tc, H, Hkv, hd);
    g_cpu.impl->attention_block_backward(&g_cpu, cdq, cdkb, cdvb, cdkc, cdvc, cdo, co, clse, cq,
                                         ckb, cvb, ckc, cvc, cs, cl, Nb, B, Tc, H, Hkv, hd);
    /* GPU (gradients poisoned with random values: they must be assigned) */
    void *gq = gput(q, nq), *gkb = gput(kb, nkb), *gvb = gput(vb, nkb), *gkc = gput(kc, nkc);
    void *gvc = gput(vc, nkc), *gdo = gput(dout, nq), *go = gput(q, nq);
    float *glse = gput_raw(q, nl * 4);
    void *gdq = gput(q, nq), *gdkb = gput(kb, nkb), *gdvb = gput(vb, nkb);
    void *gdkc = gput(kc, nkc), *gdvc = gput(vc, nkc);
    int32_t *gcs = gput_raw(cs, (size_t)Nb * 4), *gcl = gput_raw(cl, (size_t)Nb * 4);
    g_gpu.impl->attention_block_forward(&g_gpu, go, glse, gq, gkb, gvb, gkc, gvc, gcs, gcl, Nb, B,
                                        Tc, H, Hkv, hd);
    g_gpu.impl->attention_block_backward(&g_gpu, gdq, gdkb, gdvb, gdkc, gdvc, gdo, go, glse, gq,
                                         gkb, gvb, gkc, gvc, gcs, gcl, Nb, B, Tc, H, Hkv, hd);
    float *ho = gget(go, nq), *hlse = gget_f32(glse, nl), *hdq = gget(gdq, nq);
    float *hdkb = gget(gdkb, nkb), *hdvb = gget(gdvb, nkb), *hdkc = gget(gdkc, nkc);
    float *hdvc = gget(gdvc, nkc);
    snprintf(name, sizeof name,
             "attention_block_forward v%d Nb=%d B=%d Tc=%d H=%d Hkv=%d hd=%d nseq=%d",
             ops_cuda_attention_block_variant(-1), Nb, B, Tc, H, Hkv, hd, nseq);
    check(name, co, ho, nq, 2e-2);
    check("attention_block_forward lse", clse, hlse, nl, 5e-3);
    check("attention_block_backward dq", cdq, hdq, nq, 3e-2);
    check("attention_block_backward dkb", cdkb, hdkb, nkb, 3e-2);
    check("attention_block_backward dvb", cdvb, hdvb, nkb, 3e-2);
    check("attention_block_backward dkc (summed over blocks)", cdkc, hdkc, nkc, 3e-2);
    check("attention_block_backward dvc (summed over blocks)", cdvc, hdvc, nkc, 3e-2);
    /* lse == NULL: recomputed inside, same result */
    g_gpu.impl->attention_block_backward(&g_gpu, gdq, NULL, NULL, gdkc, NULL, gdo, go, NULL, gq,
                                         gkb, gvb, gkc, gvc, gcs, gcl, Nb, B, Tc, H, Hkv, hd);
    float *hdq2 = gget(gdq, nq), *hdkc2 = gget(gdkc, nkc);
    check("attention_block_backward dq (lse=NULL)", cdq, hdq2, nq, 3e-2);
    check("attention_block_backward dkc (lse=NULL)", cdkc, hdkc2, nkc, 3e-2);
    /* no atomics: a second run reproduces the bits */
    assert_memory_equal(hdq, hdq2, nq * sizeof(float));
    assert_memory_equal(hdkc, hdkc2, nkc * sizeof(float));
    /* B <= 16: variant 2's own-key kernel (attn_block_own_dkv_kernel) sums the same heads in
     * the same order as variant 1's own tiles: the same bits */
    if (ops_cuda_attention_block_variant(-1) == 2 && B <= 16) {
        /* into fresh buffers poisoned with random values (every row must be written) */
        void *g1kb = gput(vb, nkb), *g1vb = gput(kb, nkb);
        ops_cuda_attention_block_variant(1);
        g_gpu.impl->attention_block_backward(&g_gpu, NULL, g1kb, g1vb, NULL, NULL, gdo, go, glse,
                                             gq, gkb, gvb, gkc, gvc, gcs, gcl, Nb, B, Tc, H, Hkv,
                                             hd);
        ops_cuda_attention_block_variant(2);
        float *h1kb = gget(g1kb, nkb), *h1vb = gget(g1vb, nkb);
        assert_memory_equal(hdkb, h1kb, nkb * sizeof(float));
        assert_memory_equal(hdvb, h1vb, nkb * sizeof(float));
        printf("  dkb, dvb: variant 2's own-key kernel bitwise = variant 1's own tiles\n");
        free(h1kb); free(h1vb);
        gfree(g1kb); gfree(g1vb);
    }
    free(q); free(kb); free(vb); free(kc); free(vc); free(dout);
    free(ho); free(hlse); free(hdq); free(hdkb); free(hdvb); free(hdkc); free(hdvc);
    free(hdq2); free(hdkc2);
    cfree(cq); cfree(ckb); cfree(cvb); cfree(ckc); cfree(cvc); cfree(cdo); cfree(co); cfree(clse);
    cfree(cdq); cfree(cdkb); cfree(cdvb); cfree(cdkc); cfree(cdvc);
    gfree(gq); gfree(gkb); gfree(gvb); gfree(gkc); gfree(gvc); gfree(gdo); gfree(go); gfree(glse);
    gfree(gdq); gfree(gdkb); gfree(gdvb); gfree(gdkc); gfree(gdvc); gfree(gcs); gfree(gcl);
}
static void run_block(int Nb, int B, int Tc, int H, int Hkv, int hd) {
    run_block_ctx(Nb, B, Tc, H, Hkv, hd, 0);
}
/* Every kernel variant (ops_cuda_attention_block_variant) against the CPU reference. */
static void test_attention_block(void **state) {
    (void)state;
    for (int variant = 1; variant <= OPS_CUDA_ATTN_BLOCK_VARIANTS; variant++) {
        ops_cuda_attention_block_variant(variant);
        run_block(9, 16, 150, 4, 2, 64);   /* DFlash B=16, GQA 2:1, odd Nb */
        run_block(6, 7, 200, 8, 2, 128);   /* odd block size, GQA 4:1 */
        run_block(5, 10, 70, 3, 1, 36);    /* unaligned head dim, 3 m-tiles per block (odd) */
        run_block(3, 40, 300, 2, 2, 32);   /* B > 16: several query chunks per block */
        run_block(40, 16, 1000, 4, 1, 128); /* many blocks over one long context */
        run_block(7, 16, 300, 8, 1, 64);   /* GQA 8:1: a pair's warps over two thread blocks */
        run_block(130, 16, 1200, 4, 1, 128); /* > 128 blocks: several block lists per dK/dV tile */
        run_block_ctx(61, 16, 4 * 300, 8, 2, 128, 4); /* DFlash layout, 4 sequences */
        run_block(300, 16, 520, 4, 1, 128); /* > 256 blocks: lists of 128 over one tile */
        /* head dim 128 off the wgmma forward / dQ's shape (variant 2: wgmma dK/dV context
         * tiles, the pair kernel for the rest): GQA 8:1 (two head batches per dK/dV item)
         * with B 24 (two query chunks), and GQA 2:1 (a partial head batch) */
        run_block(9, 24, 400, 8, 1, 128);
        run_block(10, 16, 300, 4, 2, 128);
        /* no GQA (H = Hkv) with head dims 96 and 32: the own-key kernel's one-head groups */
        run_block(7, 5, 120, 2, 2, 96);
        run_block(4, 16, 64, 4, 4, 32);
    }
    ops_cuda_attention_block_variant(0);
}

static void test_qk_norm_rope(void **state);

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    rng_seed(&g_rng, 20261130);
    ops_cpu_init(&g_cpu, 0);
    if (ops_cuda_init(&g_gpu, 0) != 0) {
        printf("SKIP: no CUDA device (ops_cuda_init failed)\n");
        return 77;
    }
    const struct CMUnitTest matmul_only[] = {
        cmocka_unit_test(test_matmul), cmocka_unit_test(test_matmul_acc),
    };
    if (getenv("DL_GEMM_FALLBACK_CHILD")) { /* test_matmul_fallback's child */
        int rc = cmocka_run_group_tests(matmul_only, NULL, NULL);
        ops_ctx_destroy(&g_gpu);
        ops_ctx_destroy(&g_cpu);
        return rc;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),          cmocka_unit_test(test_matmul_acc),
        cmocka_unit_test(test_gemm_picks),      cmocka_unit_test(test_matmul_fallback),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),            cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_embedding),       cmocka_unit_test(test_xent),
        cmocka_unit_test(test_adamw),           cmocka_unit_test(test_adamw_pub),
        cmocka_unit_test(test_attention_varlen), cmocka_unit_test(test_attention_block),
        cmocka_unit_test(test_f32_add_scale),   cmocka_unit_test(test_qk_norm_rope),
        cmocka_unit_test(test_f32_to_act),      cmocka_unit_test(test_add_rmsnorm),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ops_ctx_destroy(&g_gpu);
    ops_ctx_destroy(&g_cpu);
    return rc;
}

/* ------------------------------------------------------------ fused q/k norm + rope */
/* One case's inputs (host f32, bf16-representable) and the CPU results. */
typedef struct {
    int N, nh, hd, mis; /* mis: the GPU input 2 bytes off 4-byte alignment (general path) */
    size_t rows, n;
    float *x, *w, *dy, *dw0, *inv;
    int32_t *pos;
    float *y, *rs, *dx, *dw; /* CPU: out, rstd, dinp, dweight (dw0 +=) */
} qr_case_t;

/* CPU fused entries, checked bitwise against the composition of the unfused ones. */
static void qr_cpu(qr_case_t *k) {
    const float eps = 1e-6f;
    float *cx = cput(k->x, k->n), *cw = cput(k->w, k->hd), *cdy = cput(k->dy, k->n);
    float *u = cput(k->x, k->n), *urs = cput(k->x, k->rows), *t = cput(k->dy, k->n);
    float *udx = cput(k->x, k->n), *udw = cput(k->dw0, k->hd);
    k->y = cput(k->x, k->n), k->rs = cput(k->x, k->rows), k->dx = cput(k->x, k->n);
    k->dw = cput(k->dw0, k->hd);
    g_cpu.impl->qk_norm_rope_forward(&g_cpu, k->y, k->rs, cx, cw, eps, k->pos, k->inv, k->N,
                                     k->nh, k->hd);
    g_cpu.impl->qk_norm_rope_backward(&g_cpu, k->dx, k->dw, cdy, cx, cw, k->rs, k->pos, k->inv,
                                      eps, k->N, k->nh, k->hd);
    g_cpu.impl->rmsnorm_forward(&g_cpu, u, urs, cx, cw, eps, (int)k->rows, k->hd);
    g_cpu.impl->rope_forward(&g_cpu, u, k->pos, k->inv, k->N, k->nh, k->hd);
    g_cpu.impl->rope_backward(&g_cpu, t, k->pos, k->inv, k->N, k->nh, k->hd);
    g_cpu.impl->rmsnorm_backward(&g_cpu, udx, udw, t, cx, cw, urs, (int)k->rows, k->hd);
    assert_memory_equal(k->y, u, k->n * sizeof(float));
    assert_memory_equal(k->rs, urs, k->rows * sizeof(float));
    assert_memory_equal(k->dx, udx, k->n * sizeof(float));
    assert_memory_equal(k->dw, udw, (size_t)k->hd * sizeof(float));
    assert_memory_equal(cdy, k->dy, k->n * sizeof(float)); /* dout left as it was */
    cfree(cx); cfree(cw); cfree(cdy); cfree(u); cfree(urs); cfree(t); cfree(udx); cfree(udw);
}

/* GPU fused vs the CPU results, vs the GPU unfused ops, rstd NULL, aliasing, repeatability. */
static void qr_gpu(const qr_case_t *k) {
    char name[128];
    const float eps = 1e-6f;
    const size_t n = k->n, rows = k->rows, hd = (size_t)k->hd;
    void *gxb = g_gpu.impl->malloc_(&g_gpu, (n + 1) * 2); /* x at byte offset 2*mis */
    void *gx = (char *)gxb + 2 * k->mis;
    g_gpu.impl->upload_act(&g_gpu, gx, k->x, n);
    void *gw = gput(k->w, hd), *gdy = gput(k->dy, n), *gy = gput(k->x, n), *gdx = gput(k->x, n);
    void *gu = gput(k->x, n), *gt = gput(k->dy, n), *gudx = gput(k->x, n);
    float *grs = gput_raw(k->x, rows * 4), *gurs = gput_raw(k->x, rows * 4);
    float *gdw = gput_raw(k->dw0, hd * 4), *gdw2 = gput_raw(k->dw0, hd * 4);
    float *gudw = gput_raw(k->dw0, hd * 4);
    int32_t *gpos = gput_raw(k->pos, (size_t)k->N * 4);
    float *ginv = gput_raw(k->inv, hd / 2 * 4);
    g_gpu.impl->qk_norm_rope_forward(&g_gpu, gy, grs, gx, gw, eps, gpos, ginv, k->N, k->nh, k->hd);
    g_gpu.impl->qk_norm_rope_backward(&g_gpu, gdx, gdw, gdy, gx, gw, grs, gpos, ginv, eps, k->N,
                                      k->nh, k->hd);
    float *hy = gget(gy, n), *hrs = gget_f32(grs, rows), *hdx = gget(gdx, n);
    float *hdw = gget_f32(gdw, hd);
    snprintf(name, sizeof name, "qk_norm_rope fwd N=%d nh=%d hd=%d mis=%d", k->N, k->nh, k->hd,
             k->mis);
    check(name, k->y, hy, n, 1e-2);
    check("qk_norm_rope fwd rstd", k->rs, hrs, rows, 1e-5);
    check("qk_norm_rope bwd dinp", k->dx, hdx, n, 1e-2);
    check("qk_norm_rope bwd dweight (+=)", k->dw, hdw, hd, 1e-3);
    /* the unfused GPU ops: the same within bf16 rounding */
    g_gpu.impl->rmsnorm_forward(&g_gpu, gu, gurs, gx, gw, eps, (int)rows, k->hd);
    g_gpu.impl->rope_forward(&g_gpu, gu, gpos, ginv, k->N, k->nh, k->hd);
    g_gpu.impl->rope_backward(&g_gpu, gt, gpos, ginv, k->N, k->nh, k->hd);
    g_gpu.impl->rmsnorm_backward(&g_gpu, gudx, gudw, gt, gx, gw, gurs, (int)rows, k->hd);
    float *hu = gget(gu, n), *hudx = gget(gudx, n), *hudw = gget_f32(gudw, hd);
    check("qk_norm_rope fwd vs unfused CUDA", hu, hy, n, 1e-2);
    check("qk_norm_rope bwd dinp vs unfused CUDA", hudx, hdx, n, 2e-2);
    check("qk_norm_rope bwd dweight vs unfused CUDA", hudw, hdw, hd, 1e-2);
    /* the exact entry (the target's): the unfused GPU ops' bits, rstd too; in place as well */
    {
        void *ge = gput(k->x, n);
        float *gers = gput_raw(k->x, rows * 4);
        g_gpu.impl->qk_norm_rope_forward_exact(&g_gpu, ge, gers, gx, gw, eps, gpos, ginv, k->N, k->nh, k->hd);
        float *he = gget(ge, n), *hers = gget_f32(gers, rows), *hurs = gget_f32(gurs, rows);
        size_t bad_rs = 0, bad = 0;
        for (size_t i = 0; i < rows; i++) bad_rs += memcmp(&hurs[i], &hers[i], 4) != 0;
        for (size_t i = 0; i < n; i++) bad += memcmp(&hu[i], &he[i], 4) != 0;
        if (bad_rs || bad)
            printf("  qk_norm_rope_forward_exact N=%d nh=%d hd=%d: %zu of %zu rstd, %zu of %zu outputs differ\n",
                   k->N, k->nh, k->hd, bad_rs, rows, bad, n);
        assert_memory_equal(hurs, hers, rows * sizeof(float));
        assert_memory_equal(hu, he, n * sizeof(float));
        g_gpu.impl->upload_act(&g_gpu, ge, k->x, n);
        g_gpu.impl->qk_norm_rope_forward_exact(&g_gpu, ge, NULL, ge, gw, eps, gpos, ginv, k->N, k->nh, k->hd);
        free(he);
        he = gget(ge, n);
        assert_memory_equal(hu, he, n * sizeof(float));
        printf("  qk_norm_rope_forward_exact N=%d nh=%d hd=%d mis=%d: bitwise = rmsnorm + rope (CUDA)\n",
               k->N, k->nh, k->hd, k->mis);
        free(he); free(hers); free(hurs);
        gfree(ge); gfree(gers);
    }
    /* rstd NULL (recomputed), dinp aliasing dout, out aliasing inp; a rerun repeats the bits */
    float *hdx2 = NULL, *hdw2 = NULL, *hal = NULL, *hin = NULL;
    g_gpu.impl->qk_norm_rope_backward(&g_gpu, gdy, gdw2, gdy, gx, gw, NULL, gpos, ginv, eps,
                                      k->N, k->nh, k->hd);
    hal = gget(gdy, n), hdw2 = gget_f32(gdw2, hd);
    check("qk_norm_rope bwd rstd NULL, dinp = dout", k->dx, hal, n, 1e-2);
    check("qk_norm_rope bwd rstd NULL dweight", k->dw, hdw2, hd, 1e-3);
    g_gpu.impl->upload_act(&g_gpu, gdy, k->dy, n);
    g_gpu.impl->upload(&g_gpu, gdw, k->dw0, hd * 4);
    g_gpu.impl->qk_norm_rope_backward(&g_gpu, gdx, gdw, gdy, gx, gw, grs, gpos, ginv, eps, k->N,
                                      k->nh, k->hd);
    hdx2 = gget(gdx, n);
    free(hdw2);
    hdw2 = gget_f32(gdw, hd);
    assert_memory_equal(hdx, hdx2, n * sizeof(float));
    assert_memory_equal(hdw, hdw2, hd * sizeof(float));
    g_gpu.impl->qk_norm_rope_forward(&g_gpu, gx, NULL, gx, gw, eps, gpos, ginv, k->N, k->nh,
                                     k->hd);
    hin = gget(gx, n);
    assert_memory_equal(hy, hin, n * sizeof(float));
    free(hy); free(hrs); free(hdx); free(hdw); free(hu); free(hudx); free(hudw);
    free(hdx2); free(hdw2); free(hal); free(hin);
    void *bufs[] = {gxb, gw, gdy, gy, gdx, gu, gt, gudx, grs, gurs, gdw, gdw2, gudw, gpos, ginv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gfree(bufs[i]);
}

static void run_qk_norm_rope(int N, int nh, int hd, int mis) {
    qr_case_t k = {.N = N, .nh = nh, .hd = hd, .mis = mis};
    k.rows = (size_t)N * nh, k.n = k.rows * hd;
    rope_params_t rp = {.theta = 1e6};
    k.inv = malloc((size_t)hd / 2 * sizeof(float));
    ops_rope_inv_freq(&rp, hd, k.inv);
    k.pos = malloc((size_t)N * sizeof(int32_t)); /* non-contiguous, unsorted */
    for (int i = 0; i < N; i++) k.pos[i] = (int32_t)rng_below(&g_rng, 40000);
    k.x = rnd(k.n, 2.0f), k.dy = rnd(k.n, 1.0f), k.dw0 = rnd(hd, 0.1f);
    k.w = malloc((size_t)hd * sizeof(float));
    for (int i = 0; i < hd; i++) k.w[i] = bf16r(1.0f + 0.3f * rng_normal(&g_rng));
    qr_cpu(&k);
    qr_gpu(&k);
    free(k.inv); free(k.pos); free(k.x); free(k.dy); free(k.dw0); free(k.w);
    cfree(k.y); cfree(k.rs); cfree(k.dx); cfree(k.dw);
}

static void test_qk_norm_rope(void **state) {
    (void)state;
    run_qk_norm_rope(37, 3, 128, 0);   /* odd N, nh not a multiple of 4 */
    run_qk_norm_rope(101, 8, 64, 0);   /* hd 64 (one column per lane and half) */
    run_qk_norm_rope(9, 32, 128, 0);   /* q shape: 32 heads */
    run_qk_norm_rope(2049, 8, 128, 0); /* many warps: grid-strided, several partial rows */
    run_qk_norm_rope(13, 5, 256, 0);   /* hd 256 */
    run_qk_norm_rope(17, 3, 96, 0);    /* hd 96: general path */
    run_qk_norm_rope(23, 4, 128, 1);   /* unaligned input: general path */
    run_qk_norm_rope(4096, 32, 128, 0); /* Qwen3-8B's q rows of one 4096-token sequence */
}
