// Linear layers on CUDA: cuBLASLt bf16 GEMMs with fp32 accumulation.
//   forward   out (M,N) bf16 = inp (M,K) . W (N,K)^T (+ bias, fused epilogue)
//             (+ res (M,N): beta = 1, C = res, D = out, same layout)
//   backward  dinp (M,K) bf16 (= or +=, beta = 1) dout (M,N) . W (N,K)
//             dW (N,K) f32 += dout^T . inp          (bf16 in, f32 C with beta = 1)
//             dbias (N) f32 += column sums of dout   (own kernel)
// Row-major matrices are handed to cuBLASLt as their column-major transposes.
// One plan per (kind, shape, bias, pointer alignment) is chosen by the
// heuristic once and cached in the context; the hot path allocates nothing
// (the workspace is allocated at init). beta is an argument of cublasLtMatmul that
// the heuristic does not see: one plan serves = and +=; its C alignment class holds
// for C and D (the smaller of the two when the residual C is not D). Shapes the
// heuristic cannot serve (e.g. odd leading dimensions) take a plain tiled fallback kernel.
// The MoE experts' forward GEMMs (ops_cuda_moe_gemm) see a new row count M at almost
// every call (tokens per expert vary per chunk and layer): keyed by exact M they would
// make a plan (descriptors + heuristic) per call and churn the cache. They use plans
// keyed by a row bucket instead (GEMM_FWD_ROWS, M rounded up to a quarter octave), the
// layouts' M set to the call's rows before each cuBLASLt call.
#include <string.h>

#include "common/ops/cuda/cuda_common.cuh"
extern "C" {
#include "common/base/log.h"
#include "common/base/testhook.h"
#include "common/ops/cuda/ops_cuda.h"
}

enum { GEMM_FWD = 0, GEMM_DINP = 1, GEMM_DW = 2, GEMM_FWD_ROWS = 3 };

static int align_class(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 2 && (a % al) != 0) al >>= 1;
    return al;
}

void cuda_gemm_plans_destroy(ops_cuda_state *st) {
    for (int i = 0; i < CUDA_GEMM_PLANS; i++) {
        cuda_gemm_plan *p = &st->plans[i];
        if (!p->used) continue;
        if (p->op) cublasLtMatmulDescDestroy(p->op);
        if (p->la) cublasLtMatrixLayoutDestroy(p->la);
        if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
        if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
        memset(p, 0, sizeof(*p));
    }
}

// Row bucket of M for GEMM_FWD_ROWS plans: 64 for M <= 64, else M rounded up to a
// multiple of p/8 where p is the power of two with p/2 < M <= p (four buckets per
// octave: the algorithm chosen for the bucket's top serves rows within 25% of it).
static int rows_bucket(int M) {
    if (M <= 64) return 64;
    int p = 128;
    while (p < M) p <<= 1;
    int step = p / 8;
    return (M + step - 1) / step * step;
}
// Smallest M of the bucket whose top is b.
static int rows_bucket_lo(int b) {
    if (b <= 64) return 1;
    int p = 128;
    while (p < b) p <<= 1;
    return b - p / 8 + 1;
}

// Sets the row count (M) of a forward plan's B (K x M) and C (N x M) layouts.
static void plan_set_rows(cuda_gemm_plan *p, int M) {
    uint64_t cols = (uint64_t)M;
    cublas_check(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_COLS, &cols,
                                                  sizeof(cols)));
    cublas_check(cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_COLS, &cols,
                                                  sizeof(cols)));
}

// A bucket's algorithm (chosen for its top, p->M) must also serve its smallest M within
// the workspace: cublasLtMatmulAlgoCheck at lo. Anything else: "no algorithm", and the
// caller takes the exact-M path.
static cublasStatus_t rows_plan_check(const ops_ctx_t *c, cuda_gemm_plan *p,
                                      const cublasLtMatmulAlgo_t *algo, int lo) {
    cublasLtMatmulHeuristicResult_t chk;
    memset(&chk, 0, sizeof(chk));
    plan_set_rows(p, lo);
    cublasStatus_t s = cublasLtMatmulAlgoCheck((cublasLtHandle_t)c->blas, p->op, p->la, p->lb,
                                               p->lc, p->lc, algo, &chk);
    plan_set_rows(p, p->M);
    if (s == CUBLAS_STATUS_SUCCESS && chk.workspaceSize > c->workspace_bytes)
        s = CUBLAS_STATUS_NOT_SUPPORTED;
    return s;
}

void ops_cuda_gemm_algo_config(const void *algo, int32_t cfg[OPS_CUDA_GEMM_CFG]) {
    static const cublasLtMatmulAlgoConfigAttributes_t at[OPS_CUDA_GEMM_CFG] = {
        CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID, CUBLASLT_ALGO_CONFIG_STAGES_ID,
        CUBLASLT_ALGO_CONFIG_SPLITK_NUM, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
        CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
        CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID};
    const cublasLtMatmulAlgo_t *a = (const cublasLtMatmulAlgo_t *)algo;
    for (int i = 0; i < OPS_CUDA_GEMM_CFG; i++) {
        // each attribute is read at its own size (2 or 4 bytes: the call checks it)
        size_t sz = 0;
        uint32_t u32 = 0;
        uint16_t u16 = 0;
        cfg[i] = -1;
        if (cublasLtMatmulAlgoConfigGetAttribute(a, at[i], NULL, 0, &sz) != CUBLAS_STATUS_SUCCESS)
            continue;
        if (sz == 4 && cublasLtMatmulAlgoConfigGetAttribute(a, at[i], &u32, 4, &sz) ==
                           CUBLAS_STATUS_SUCCESS)
            cfg[i] = (int32_t)u32;
        else if (sz == 2 && cublasLtMatmulAlgoConfigGetAttribute(a, at[i], &u16, 2, &sz) ==
                                CUBLAS_STATUS_SUCCESS)
            cfg[i] = u16;
    }
}

// Per-shape picks among the heuristic's candidates (measured, bench/NOTES.md 2026-12-04,
// thirteenth session). On an H200 at its 700 W cap, every GEMM of a training step runs
// power-bound; `bench_gemm --sustained 250` ran each of the heuristic's first 8 candidates
// back to back for 250 ms (the clock it holds at the cap), then the first and the best in
// turns 3 times each: for these shapes another tile / cluster shape of the same kernel
// (algo 66, no split-K: deterministic, like the first) did 2-9% more work per second than
// the first choice (a second machine ranked the same best first for 9 of the 12 shapes). A
// plan whose (kind, K, N, M range) is here takes the candidate with that configuration when
// the heuristic offers it, else the first as always. Only with the cuBLASLt they were
// measured with (13.1, GEMM_PICKS_CUBLASLT): another version ranks and builds its kernels
// its own way, and takes its first choice as before. Matched by configuration, not by GPU:
// another Hopper GPU takes them unmeasured (candidates the heuristic offered for the call all
// the same); where none is offered (another architecture), the first as before.
// ops_cuda_gemm_picks(0) turns the picks off (benchmarks' A/B).
struct gemm_pick {
    int kind, m_lo, m_hi, K, N;
    int32_t cfg[OPS_CUDA_GEMM_CFG];  // ops_cuda_gemm_algo_config's order
};
#define PICK_T29 {66, 29, 35, 1, 0, 0, 1, 0, 3}
#define PICK_T24 {66, 24, 35, 1, 0, 0, 7, 0, 5}
#define PICK_T201 {66, 201, 35, 1, 0, 0, 2, 0, 5}
#define PICK_T23 {66, 23, 35, 1, 0, 0, 4, 0, 3}
static const gemm_pick GEMM_PICKS[] = {
    // Qwen3-8B-sized layers (D 4096, F 12288) at >= 8,192 rows: the target's forward
    // (T, and its MLP chunks) and the drafter's block / context rows. gain: in turns, sustained
    {GEMM_FWD, 8192, 1 << 30, 4096, 4096, PICK_T29},     // q, o: target 2.9%, drafter 5.2%
    {GEMM_FWD, 8192, 1 << 30, 4096, 12288, PICK_T201},   // gate, up: 3.5%, 3.8%
    {GEMM_FWD, 8192, 1 << 30, 12288, 4096, PICK_T24},    // down: 2.2%, 2.2%
    {GEMM_FWD, 8192, 1 << 30, 20480, 4096, PICK_T29},    // the drafter's fc (5 layers): 2.2%
    {GEMM_DINP, 8192, 1 << 30, 4096, 12288, PICK_T24},   // d gate, d up -> d x: 3.2%
    {GEMM_DINP, 8192, 1 << 30, 12288, 4096, PICK_T29},   // d down -> d h: 4.9%
    {GEMM_DINP, 8192, 1 << 30, 4096, 4096, PICK_T24},    // q, o: 3.3%
    {GEMM_DINP, 8192, 1 << 30, 4096, 1024, PICK_T29},    // k, v: 9.1%
    // the drafter's LM head over 1,024-row chunks of its loss rows (V 151,936): 3.0%
    {GEMM_FWD, 512, 4096, 4096, 151936, PICK_T23},
};
#define GEMM_PICKS_CUBLASLT 1301   // cublasLtGetVersion() / 100: major * 100 + minor
static int g_gemm_picks = 1, g_gemm_picks_taken = 0;

int ops_cuda_gemm_picks_measured(void) {
    return (int)(cublasLtGetVersion() / 100) == GEMM_PICKS_CUBLASLT;
}

int ops_cuda_gemm_picks(int on) {
    int was = g_gemm_picks;
    if (on >= 0) g_gemm_picks = on ? 1 : 0;
    return was;
}

int ops_cuda_gemm_picks_taken(void) {
    return __atomic_load_n(&g_gemm_picks_taken, __ATOMIC_RELAXED);
}

// The candidate of res[0..n) the table picks for this shape; 0 (the first) otherwise.
static int pick_candidate(int kind, int M, int K, int N, const cublasLtMatmulHeuristicResult_t *res,
                          int n) {
    if (!g_gemm_picks || !ops_cuda_gemm_picks_measured()) return 0;
    for (size_t i = 0; i < sizeof(GEMM_PICKS) / sizeof(GEMM_PICKS[0]); i++) {
        const gemm_pick *e = &GEMM_PICKS[i];
        if (e->kind != kind || e->K != K || e->N != N || M < e->m_lo || M > e->m_hi) continue;
        for (int a = 0; a < n; a++) {
            int32_t cfg[OPS_CUDA_GEMM_CFG];
            ops_cuda_gemm_algo_config(&res[a].algo, cfg);
            if (!memcmp(cfg, e->cfg, sizeof(cfg))) {
                __atomic_add_fetch(&g_gemm_picks_taken, 1, __ATOMIC_RELAXED);
                log_debug("cuBLASLt %s M %d K %d N %d: candidate %d of %d (matmul.cu's pick, "
                          "tile %d, cluster shape %d)", kind == GEMM_DINP ? "dinp" : "forward",
                          M, K, N, a, n, cfg[1], cfg[8]);
                return a;
            }
        }
        return 0;
    }
    return 0;
}

// Returns the cached plan, making it on first use; NULL when cuBLASLt has no
// algorithm for this shape (the caller falls back).
static cuda_gemm_plan *get_plan(const ops_ctx_t *c, int kind, int M, int K, int N, int bias,
                                int alA, int alB, int alC) {
    ops_cuda_state *st = cuda_state(c);
    int key_bias = bias | (alA << 1) | (alB << 10) | (alC << 19);
    for (int i = 0; i < CUDA_GEMM_PLANS; i++) {
        cuda_gemm_plan *p = &st->plans[i];
        if (p->used && p->kind == kind && p->M == M && p->K == K && p->N == N &&
            p->bias == key_bias)
            return p->op ? p : NULL;
    }
    cuda_gemm_plan *p = &st->plans[st->next_plan];
    st->next_plan = (st->next_plan + 1) % CUDA_GEMM_PLANS;
    if (p->used) {
        if (p->op) cublasLtMatmulDescDestroy(p->op);
        if (p->la) cublasLtMatrixLayoutDestroy(p->la);
        if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
        if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    }
    memset(p, 0, sizeof(*p));
    p->used = 1;
    p->kind = kind;
    p->M = M;
    p->K = K;
    p->N = N;
    p->bias = key_bias;
    int64_t fallback = 0;  // test hook ops.gemm_fallback=1: every shape on the fallback kernel
    if (testhook_i64("ops.gemm_fallback", &fallback) && fallback) return NULL;  // p->op NULL

    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    // forward: C(N x M) = op(A = W stored K x N)^T . B (inp stored K x M)
    if (kind == GEMM_FWD || kind == GEMM_FWD_ROWS) {
        ta = CUBLAS_OP_T;
        cublas_check(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, K, N, K));
        cublas_check(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, K, M, K));
        cublas_check(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_16BF, N, M, N));
    } else if (kind == GEMM_DINP) {  // C(K x M) = W (K x N) . dout (N x M)
        cublas_check(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, K, N, K));
        cublas_check(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, N, M, N));
        cublas_check(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_16BF, K, M, K));
    } else {  // C(K x N) f32 += inp (K x M) . (dout stored N x M)^T
        tb = CUBLAS_OP_T;
        cublas_check(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, K, M, K));
        cublas_check(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, N, M, N));
        cublas_check(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, K, N, K));
    }
    cublas_check(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublas_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    cublas_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        cublas_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep,
                                                    sizeof(ep)));
    }
    cublasLtMatmulPreference_t pref;
    cublas_check(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = c->workspace_bytes;
    uint32_t a32 = (uint32_t)alA, b32 = (uint32_t)alB, c32 = (uint32_t)alC;
    cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws, sizeof(ws)));
    cublas_check(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a32, sizeof(a32)));
    cublas_check(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b32, sizeof(b32)));
    cublas_check(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c32, sizeof(c32)));
    cublas_check(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &c32, sizeof(c32)));
    // up to 16 candidates, best first by the heuristic's estimate (GEMM_PICKS may take another)
    cublasLtMatmulHeuristicResult_t cand[16];
    int nres = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)c->blas, p->op, p->la,
                                                      p->lb, p->lc, p->lc, pref,
                                                      kind == GEMM_FWD_ROWS ? 1 : 16, cand, &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    int pick = s == CUBLAS_STATUS_SUCCESS && nres > 0 && !bias
                   ? pick_candidate(kind, M, K, N, cand, nres) : 0;
    if (s == CUBLAS_STATUS_SUCCESS && nres > 0 && kind == GEMM_FWD_ROWS)
        s = rows_plan_check(c, p, &cand[pick].algo, rows_bucket_lo(M));
    if (s != CUBLAS_STATUS_SUCCESS || nres == 0) {
        cublasLtMatmulDescDestroy(p->op);  // remembered as "no algorithm": p->op = NULL
        p->op = NULL;
        return NULL;
    }
    p->algo = cand[pick].algo;
    return p;
}

// Fallback: C[m][n] = sum_k A[m*sam + k*sak] * B[k*sbk + n*sbn] (+ bias[n])
// (+ Cin[m][n] when Cin is not NULL; Cin may be C: +=), 16x16 tiles, f32 accumulation.
// Only for shapes cuBLASLt refuses (tests, odd sizes).
template <typename TC>
__global__ void gemm_fallback_kernel(TC *C, const bf16 *A, const bf16 *Bm, const bf16 *bias,
                                     int Mr, int Nc, int Kd, long sam, long sak, long sbk,
                                     long sbn, const TC *Cin) {
    __shared__ float As[16][17], Bs[16][17];
    int tx = threadIdx.x, ty = threadIdx.y;
    int m = blockIdx.y * 16 + ty, n = blockIdx.x * 16 + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < Kd; k0 += 16) {
        int ka = k0 + tx, kb = k0 + ty;
        As[ty][tx] = (m < Mr && ka < Kd) ? __bfloat162float(A[m * sam + ka * sak]) : 0.0f;
        int nb = blockIdx.x * 16 + tx;
        Bs[ty][tx] = (nb < Nc && kb < Kd) ? __bfloat162float(Bm[kb * sbk + nb * sbn]) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 16; k++) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (m < Mr && n < Nc) {
        if (bias) acc += __bfloat162float(bias[n]);
        long o = (long)m * Nc + n;
        if (Cin) acc += (float)Cin[o];
        C[o] = (TC)acc;
    }
}

// D = A.B (+ bias) + beta * Cin; Cin NULL: D (read only when beta != 0).
static void run_plan(const ops_ctx_t *c, cuda_gemm_plan *p, void *D, const void *Cin,
                     const void *A, const void *B, const void *bias, float beta) {
    float alpha = 1.0f;
    if (bias)
        cublas_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                    sizeof(bias)));
    cublas_check(cublasLtMatmul((cublasLtHandle_t)c->blas, p->op, &alpha, A, p->la, B, p->lb,
                                &beta, Cin ? Cin : D, p->lc, D, p->lc, &p->algo, c->workspace,
                                c->workspace_bytes, cuda_stream(c)));
}

// out = inp . W^T (+ bias) (+ res when res is not NULL: beta = 1, C = res).
static void matmul_forward(const ops_ctx_t *c, void *out, const void *inp, const void *weight,
                           const void *bias, const void *res, int M, int K, int N) {
    if (M <= 0 || N <= 0) return;
    cudaStream_t s = cuda_stream(c);
    int al_c = align_class(out);
    if (res && align_class(res) < al_c) al_c = align_class(res);
    cuda_gemm_plan *p = K > 0 ? get_plan(c, GEMM_FWD, M, K, N, bias != NULL, align_class(weight),
                                         align_class(inp), al_c)
                              : NULL;
    if (p) {
        run_plan(c, p, out, res, weight, inp, bias, res ? 1.0f : 0.0f);
        return;
    }
    // out[m][n] = sum_k inp[m][k] W[n][k] (+ res[m][n])
    dim3 g((N + 15) / 16, (M + 15) / 16), b(16, 16);
    gemm_fallback_kernel<bf16><<<g, b, 0, s>>>((bf16 *)out, (const bf16 *)inp,
                                               (const bf16 *)weight, (const bf16 *)bias, M, N,
                                               K > 0 ? K : 0, K, 1, 1, K, (const bf16 *)res);
    cuda_check_launch();
}

void cuda_matmul_forward(const ops_ctx_t *c, void *out, const void *inp, const void *weight,
                         const void *bias, int M, int K, int N) {
    matmul_forward(c, out, inp, weight, bias, NULL, M, K, N);
}

void cuda_matmul_forward_res(const ops_ctx_t *c, void *out, const void *inp, const void *weight,
                             const void *bias, const void *res, int M, int K, int N) {
    matmul_forward(c, out, inp, weight, bias, res, M, K, N);
}

// One expert's forward GEMM through its row bucket's plan; the exact-M path when the
// bucket has no algorithm valid down to its smallest M.
static void matmul_forward_rows(const ops_ctx_t *c, void *out, const void *inp,
                                const void *weight, int M, int K, int N) {
    cuda_gemm_plan *p = get_plan(c, GEMM_FWD_ROWS, rows_bucket(M), K, N, 0, align_class(weight),
                                 align_class(inp), align_class(out));
    if (!p) {
        cuda_matmul_forward(c, out, inp, weight, NULL, M, K, N);
        return;
    }
    plan_set_rows(p, M);
    run_plan(c, p, out, NULL, weight, inp, NULL, 0.0f);
}

extern "C" void ops_cuda_moe_gemm(const ops_ctx_t *c, void *out, const void *x,
                                  void *const *w, const int32_t *off_h, int E, int K, int N) {
    if (K <= 0 || N <= 0) return;
    for (int e = 0; e < E; e++) {
        int r0 = off_h[e], M = off_h[e + 1] - r0;
        if (M <= 0) continue;   // no padding: an expert sees only its rows
        matmul_forward_rows(c, (bf16 *)out + (size_t)r0 * N, (const bf16 *)x + (size_t)r0 * K,
                            w[e], M, K, N);
    }
}

// dbias[n] += sum_m dout[m][n]: 32 columns x 8 row groups per block.
__global__ void colsum_kernel(float *dbias, const bf16 *dout, int M, int N) {
    __shared__ float sh[8][33];
    int n = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (n < N)
        for (int m = threadIdx.y; m < M; m += 8) s += __bfloat162float(dout[(long)m * N + n]);
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && n < N) {
        float t = 0.0f;
        for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x];
        dbias[n] += t;
    }
}

void cuda_matmul_backward(const ops_ctx_t *c, void *dinp, float *dweight, float *dbias,
                          const void *dout, const void *inp, const void *weight, int M, int K,
                          int N, int dinp_acc) {
    if (M <= 0 || K <= 0) return;
    cudaStream_t s = cuda_stream(c);
    if (dinp) {
        if (N <= 0) {
            if (!dinp_acc) cuda_check(cudaMemsetAsync(dinp, 0, (size_t)M * K * sizeof(bf16), s));
        } else {
            cuda_gemm_plan *p = get_plan(c, GEMM_DINP, M, K, N, 0, align_class(weight),
                                         align_class(dout), align_class(dinp));
            if (p) {
                run_plan(c, p, dinp, NULL, weight, dout, NULL, dinp_acc ? 1.0f : 0.0f);
            } else {  // dinp[m][k] (+)= sum_n dout[m][n] W[n][k]
                dim3 g((K + 15) / 16, (M + 15) / 16), b(16, 16);
                gemm_fallback_kernel<bf16><<<g, b, 0, s>>>(
                    (bf16 *)dinp, (const bf16 *)dout, (const bf16 *)weight, NULL, M, K, N, N, 1,
                    K, 1, dinp_acc ? (const bf16 *)dinp : NULL);
                cuda_check_launch();
            }
        }
    }
    if (N <= 0) return;
    if (dweight) {
        cuda_gemm_plan *p = get_plan(c, GEMM_DW, M, K, N, 0, align_class(inp), align_class(dout),
                                     align_class(dweight));
        if (p) {
            run_plan(c, p, dweight, NULL, inp, dout, NULL, 1.0f);
        } else {  // dW[n][k] += sum_m dout[m][n] inp[m][k]
            dim3 g((K + 15) / 16, (N + 15) / 16), b(16, 16);
            gemm_fallback_kernel<float><<<g, b, 0, s>>>(dweight, (const bf16 *)dout,
                                                        (const bf16 *)inp, NULL, N, K, M, 1, N, K,
                                                        1, dweight);
            cuda_check_launch();
        }
    }
    if (dbias) {
        colsum_kernel<<<(N + 31) / 32, dim3(32, 8), 0, s>>>(dbias, (const bf16 *)dout, M, N);
        cuda_check_launch();
    }
}
