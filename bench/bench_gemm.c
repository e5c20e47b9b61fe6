/* cuBLASLt's first heuristic choice against the best of its candidates, for the GEMMs of the
 * reference drafter step (Qwen3-8B shapes: D 4096, F 12288, Hkv x hd 1024, V 151,936; 4,096
 * blocks of 16 = 65,536 block rows, 8 x 4,096 = 32,768 context rows, LM head in 1,024-row
 * chunks). Each shape is laid out exactly as common/ops/cuda/matmul.cu's plans lay it out
 * (forward: out = inp . W^T; dinp: dinp = dout . W, beta 1; dW: f32 dW += dout^T . inp),
 * the heuristic is asked for up to 16 algorithms, and each is timed (CUDA events, median of
 * 5 after 2 warm-ups, random bf16 operands). One line per shape: the first choice's time and
 * TFLOP/s, the best candidate's, and the gain a per-shape autotune would give; a last line
 * sums them weighted by the calls per drafter step (per target forward with --target).
 * Measured on an H200 (2026-12-02, bench/NOTES.md): the picks are 4.2% faster here, but a
 * drafter step with them (per-shape tuning at first use, tried and not kept) was not: the
 * gain of a GEMM timed alone did not carry into the step.
 * --sustained MS runs each candidate back to back for MS ms before timing it (the GPU at
 * its power cap, as in a step) and prints every candidate with its configuration;
 * --target times the target forward's shapes instead of the drafter step's.
 * Usage: bench_gemm [--algos N] [--sustained MS] [--target]. Prints "SKIP: ..." and exits 0 without a GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ops/ops.h"
#ifdef DL_CUDA
#include "common/ops/cuda/ops_cuda.h"
#endif

#ifndef DL_CUDA
int main(void) {
    printf("SKIP: bench_gemm: built without CUDA\n");
    return 0;
}
#else
#include <cublasLt.h>
#include <cuda_runtime_api.h>

enum { FWD = 0, DINP = 1, DW = 2 };
static const char *kind_name[] = {"fwd", "dinp", "dW"};

typedef struct {
    const char *what;
    int kind, M, K, N, calls; /* calls per reference drafter step */
} shape_t;

/* The reference step's GEMMs (bench_drafter --profile's table, 5 layers). */
static const shape_t SHAPES[] = {
    {"gate/up D->F", FWD, 65536, 4096, 12288, 15},
    {"down F->D", FWD, 65536, 12288, 4096, 5},
    {"q/o D->D", FWD, 65536, 4096, 4096, 10},
    {"k/v block D->1024", FWD, 65536, 4096, 1024, 10},
    {"k/v context D->1024", FWD, 32768, 4096, 1024, 10},
    {"fc 5D->D", FWD, 32768, 20480, 4096, 1},
    {"LM head chunk", FWD, 1024, 4096, 151936, 64},
    {"gate/up D->F", DINP, 65536, 4096, 12288, 10},
    {"down F->D", DINP, 65536, 12288, 4096, 5},
    {"q/o D->D", DINP, 65536, 4096, 4096, 10},
    {"k/v block D->1024", DINP, 65536, 4096, 1024, 10},
    {"LM head chunk", DINP, 1024, 4096, 151936, 64},
    {"gate/up D->F", DW, 65536, 4096, 12288, 10},
    {"down F->D", DW, 65536, 12288, 4096, 5},
    {"q/o D->D", DW, 65536, 4096, 4096, 10},
    {"k/v block D->1024", DW, 65536, 4096, 1024, 10},
    {"k/v context D->1024", DW, 32768, 4096, 1024, 10},
};
/* The target's forward GEMMs (bench_target, Qwen3-8B, 8 x 4096 tokens, 34 layers; the MLP in
 * 16,384-row chunks): --target. calls = per forward. */
static const shape_t TSHAPES[] = {
    {"t q/o D->D", FWD, 32768, 4096, 4096, 68},
    {"t k/v D->1024", FWD, 32768, 4096, 1024, 68},
    {"t gate/up D->F", FWD, 16384, 4096, 12288, 136},
    {"t down F->D", FWD, 16384, 12288, 4096, 68},
};

static ops_ctx_t C;
static cudaEvent_t ev0, ev1;

static void check_cuda(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "bench_gemm: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}
static void check_lt(cublasStatus_t s, const char *what) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench_gemm: %s: cuBLAS status %d\n", what, (int)s);
        exit(1);
    }
}
static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Device buffer of `bytes` filled by tiling one 32 MiB random bf16 pattern (values in
 * [-1, 1)): random data, as zeros would run faster. */
static void *dev_random(size_t bytes) {
    static void *pat = NULL;
    const size_t pat_bytes = (size_t)32 << 20;
    if (!pat) {
        uint16_t *h = malloc(pat_bytes);
        if (!h) { fprintf(stderr, "bench_gemm: out of host memory\n"); exit(1); }
        uint64_t s = 88172645463325252ull;
        for (size_t i = 0; i < pat_bytes / 2; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            float f = (float)(s >> 40) * (2.0f / 16777216.0f) - 1.0f;
            uint32_t u;
            memcpy(&u, &f, 4);
            h[i] = (uint16_t)(u >> 16);
        }
        check_cuda(cudaMalloc(&pat, pat_bytes), "cudaMalloc");
        check_cuda(cudaMemcpy(pat, h, pat_bytes, cudaMemcpyHostToDevice), "upload");
        free(h);
    }
    void *d = NULL;
    check_cuda(cudaMalloc(&d, bytes), "cudaMalloc");
    for (size_t off = 0; off < bytes; off += pat_bytes) {
        size_t n = bytes - off < pat_bytes ? bytes - off : pat_bytes;
        check_cuda(cudaMemcpy((char *)d + off, pat, n, cudaMemcpyDeviceToDevice), "copy");
    }
    return d;
}

typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    const void *A, *B;
    void *D;
    float beta;
} gemm_t;

/* Layouts as matmul.cu's get_plan builds them for `kind`. */
static void gemm_setup(gemm_t *g, const shape_t *s, void *inp, void *w, void *out) {
    int M = s->M, K = s->K, N = s->N;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    if (s->kind == FWD) { /* C(N x M) = (W stored K x N)^T . (inp stored K x M) */
        ta = CUBLAS_OP_T;
        check_lt(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_16BF, K, N, K), "layout");
        check_lt(cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_16BF, K, M, K), "layout");
        check_lt(cublasLtMatrixLayoutCreate(&g->lc, CUDA_R_16BF, N, M, N), "layout");
        g->A = w, g->B = inp, g->beta = 0.0f;
    } else if (s->kind == DINP) { /* C(K x M) = W (K x N) . dout (N x M), beta 1 */
        check_lt(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_16BF, K, N, K), "layout");
        check_lt(cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_16BF, N, M, N), "layout");
        check_lt(cublasLtMatrixLayoutCreate(&g->lc, CUDA_R_16BF, K, M, K), "layout");
        g->A = w, g->B = inp /* dout */, g->beta = 1.0f;
    } else { /* C(K x N) f32 += inp (K x M) . (dout stored N x M)^T */
        tb = CUBLAS_OP_T;
        check_lt(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_16BF, K, M, K), "layout");
        check_lt(cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_16BF, N, M, N), "layout");
        check_lt(cublasLtMatrixLayoutCreate(&g->lc, CUDA_R_32F, K, N, K), "layout");
        g->A = inp, g->B = w /* dout */, g->beta = 1.0f;
    }
    g->D = out;
    check_lt(cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    check_lt(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "ta");
    check_lt(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "tb");
}

static cublasStatus_t run_once(gemm_t *g, const cublasLtMatmulAlgo_t *algo) {
    float alpha = 1.0f;
    return cublasLtMatmul((cublasLtHandle_t)C.blas, g->op, &alpha, g->A, g->la, g->B, g->lb,
                          &g->beta, g->D, g->lc, g->D, g->lc, algo, C.workspace,
                          C.workspace_bytes, (cudaStream_t)C.stream);
}

/* --sustained MS: the algorithm run back to back for MS ms first (the GPU reaches its power
 * cap and the clock it holds there, as in a training step), then the mean of 10 launches
 * timed as one. -1 when cuBLASLt refuses it. */
static float time_algo_sustained(gemm_t *g, const cublasLtMatmulAlgo_t *algo, float warm_ms) {
    cudaStream_t st = (cudaStream_t)C.stream;
    float el = 0.0f;
    cudaEventRecord(ev0, st);
    while (el < warm_ms) {
        for (int r = 0; r < 4; r++)
            if (run_once(g, algo) != CUBLAS_STATUS_SUCCESS) return -1.0f;
        cudaEventRecord(ev1, st);
        cudaEventSynchronize(ev1);
        cudaEventElapsedTime(&el, ev0, ev1);
    }
    cudaEventRecord(ev0, st);
    for (int r = 0; r < 10; r++) run_once(g, algo);
    cudaEventRecord(ev1, st);
    cudaEventSynchronize(ev1);
    cudaEventElapsedTime(&el, ev0, ev1);
    return el / 10.0f;
}

/* The candidate's configuration in one string (ops_cuda_gemm_algo_config's order). */
static void algo_desc(const cublasLtMatmulAlgo_t *a, char *buf, size_t n) {
    int32_t cfg[OPS_CUDA_GEMM_CFG];
    ops_cuda_gemm_algo_config(a, cfg);
    snprintf(buf, n, "cfg {%d, %d, %d, %d, %d, %d, %d, %d, %d}", cfg[0], cfg[1], cfg[2], cfg[3],
             cfg[4], cfg[5], cfg[6], cfg[7], cfg[8]);
}

/* Median ms of 5 runs of one algorithm after 2 warm-ups; -1 when cuBLASLt refuses it. */
static float time_algo(gemm_t *g, const cublasLtMatmulAlgo_t *algo) {
    float t[5];
    cudaStream_t st = (cudaStream_t)C.stream;
    for (int r = 0; r < 7; r++) {
        if (r >= 2) cudaEventRecord(ev0, st);
        if (run_once(g, algo) != CUBLAS_STATUS_SUCCESS) return -1.0f;
        if (r >= 2) {
            cudaEventRecord(ev1, st);
            cudaEventSynchronize(ev1);
            cudaEventElapsedTime(&t[r - 2], ev0, ev1);
        }
    }
    qsort(t, 5, sizeof(float), cmpf);
    return t[2];
}

/* The value v of flag, a number in [lo, hi] (an integer when integer); exits 2 otherwise. */
static double arg_num(const char *flag, const char *v, double lo, double hi, int integer) {
    char *end = NULL;
    double x = strtod(v, &end);
    if (!*v || *end || !(x >= lo && x <= hi) || (integer && x != (double)(long)x)) {
        fprintf(stderr, "bench_gemm: %s '%s': expected %s in [%g, %g]\n", flag, v,
                integer ? "an integer" : "a number", lo, hi);
        exit(2);
    }
    return x;
}

int main(int argc, char **argv) {
    int nalgo = 16, target = 0;
    float sustained = 0.0f;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--algos") == 0 && i + 1 < argc)
            nalgo = (int)arg_num("--algos", argv[++i], 1, 64, 1);
        else if (strcmp(argv[i], "--sustained") == 0 && i + 1 < argc)
            sustained = (float)arg_num("--sustained", argv[++i], 0, 10000, 0);
        else if (strcmp(argv[i], "--target") == 0) target = 1;
        else {
            fprintf(stderr, "bench_gemm: unknown argument '%s'; usage: bench_gemm [--algos 1..64] "
                            "[--sustained MS] [--target]\n", argv[i]);
            return 2;
        }
    }
    const shape_t *shapes = target ? TSHAPES : SHAPES;
    size_t nshapes = target ? sizeof(TSHAPES) / sizeof(TSHAPES[0]) : sizeof(SHAPES) / sizeof(SHAPES[0]);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: bench_gemm: no CUDA device\n");
        return 0;
    }
    if (ops_cuda_init(&C, 0) != 0) {
        printf("SKIP: bench_gemm: ops_cuda_init failed\n");
        return 0;
    }
    cudaEventCreate(&ev0);
    cudaEventCreate(&ev1);
    printf("cuBLASLt %zu, workspace %zu MiB, up to %d candidates per shape%s\n",
           cublasLtGetVersion(), C.workspace_bytes >> 20, nalgo,
           sustained > 0 ? ", each run back to back first (--sustained)" : "");
    printf("%-22s %-4s %6s %6s %7s | %8s %6s | %8s %6s %4s | %6s\n", "GEMM", "kind", "M", "K", "N",
           "first ms", "TF/s", "best ms", "TF/s", "idx", "gain");
    cublasLtMatmulHeuristicResult_t *res = calloc((size_t)nalgo, sizeof(*res));
    double step_first = 0, step_best = 0;
    for (size_t i = 0; i < nshapes; i++) {
        const shape_t *s = &shapes[i];
        size_t in_el = (size_t)s->M * (s->kind == DINP ? s->N : s->K);
        size_t w_el = s->kind == DW ? (size_t)s->M * s->N : (size_t)s->N * s->K;
        size_t out_b = s->kind == DW ? (size_t)s->N * s->K * 4
                                     : (size_t)s->M * (s->kind == DINP ? s->K : s->N) * 2;
        void *inp = dev_random(in_el * 2), *w = dev_random(w_el * 2), *out = dev_random(out_b);
        gemm_t g;
        memset(&g, 0, sizeof(g));
        gemm_setup(&g, s, inp, w, out);
        cublasLtMatmulPreference_t pref;
        check_lt(cublasLtMatmulPreferenceCreate(&pref), "pref");
        size_t ws = C.workspace_bytes;
        check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws, sizeof(ws)), "pref ws");
        int n = 0;
        check_lt(cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)C.blas, g.op, g.la, g.lb, g.lc,
                                                g.lc, pref, nalgo, res, &n), "heuristic");
        cublasLtMatmulPreferenceDestroy(pref);
        float first = -1, best = -1;
        int best_i = -1;
        double fl = 2.0 * s->M * (double)s->K * s->N;
        for (int a = 0; a < n; a++) {
            float ms = sustained > 0 ? time_algo_sustained(&g, &res[a].algo, sustained)
                                     : time_algo(&g, &res[a].algo);
            if (a == 0) first = ms;
            if (ms > 0 && (best < 0 || ms < best)) best = ms, best_i = a;
            if (sustained > 0) {
                char d[200];
                algo_desc(&res[a].algo, d, sizeof d);
                printf("    cand %2d %8.3f ms %6.1f TF/s  %s\n", a, ms,
                       ms > 0 ? fl / (ms * 1e-3) / 1e12 : 0.0, d);
            }
        }
        if (sustained > 0 && n > 1 && best_i > 0 && first > 0) {
            /* the first and the best taken in turns, 3 times each: a best of 8 picked from
             * noisy times is biased; this is the gain to believe */
            double t0 = 0, tb = 0;
            for (int r = 0; r < 3; r++) {
                t0 += time_algo_sustained(&g, &res[0].algo, sustained);
                tb += time_algo_sustained(&g, &res[best_i].algo, sustained);
            }
            printf("    confirm: first %.3f ms, best (%d) %.3f ms: %.1f%%\n", t0 / 3, best_i,
                   tb / 3, 100.0 * (t0 - tb) / t0);
        }
        if (first > 0 && best > 0) {
            printf("%-22s %-4s %6d %6d %7d | %8.3f %6.1f | %8.3f %6.1f %4d | %5.1f%%\n", s->what,
                   kind_name[s->kind], s->M, s->K, s->N, first, fl / (first * 1e-3) / 1e12, best,
                   fl / (best * 1e-3) / 1e12, best_i, 100.0 * (first - best) / first);
            step_first += first * s->calls;
            step_best += best * s->calls;
        } else {
            printf("%-22s %-4s %6d %6d %7d | no algorithm timed (%d candidates)\n", s->what,
                   kind_name[s->kind], s->M, s->K, s->N, n);
        }
        fflush(stdout);
        cublasLtMatmulDescDestroy(g.op);
        cublasLtMatrixLayoutDestroy(g.la);
        cublasLtMatrixLayoutDestroy(g.lb);
        cublasLtMatrixLayoutDestroy(g.lc);
        cudaFree(inp), cudaFree(w), cudaFree(out);
    }
    printf("%s, these GEMMs x their calls: first choices %.1f ms, best %.1f ms "
           "(%.1f ms, %.1f%% less)\n", target ? "target forward" : "reference step", step_first,
           step_best, step_first - step_best,
           100.0 * (step_first - step_best) / (step_first > 0 ? step_first : 1));
    free(res);
    check_cuda(cudaDeviceSynchronize(), "sync");
    ops_ctx_destroy(&C);
    return 0;
}
#endif
