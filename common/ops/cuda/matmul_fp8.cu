// FP8 (E4M3) linear on CUDA, for the target's --target-precision fp8 (ops.h fp8_*).
//   quantize   q (R,K) e4m3, s (R) f32 = amax_row / 448; q = satfinite_rne(x / s)
//   forward    out (M,N) bf16 = (qx . qw^T) * sx[m] * sw[n] (+ bias)
// The GEMM is cuBLASLt FP8, TN (Hopper FP8 tensor cores take K-major A and B only):
// row-major out (M,N) is the column-major D (N x M) = op(A = qw stored K x N)^T . B
// (qx stored K x M), both leading dimensions K, so K % 16 == 0 (16-byte rows).
// Scales, in order of preference:
//   OUTER  cuBLASLt's outer-vector scales (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
//          cuBLAS >= 12.9, Hopper): A scale sw (cuBLAS M = our N elements), B scale sx
//          (cuBLAS N = our M); D bf16. Bias (Qwen2 q/k/v) is added by a small kernel.
//   EPI    no operand scales, D f32 into the context scratch, then one kernel applies
//          sx[m] * sw[n] (+ bias) and rounds to bf16: the same math, one extra f32
//          round trip of the output (used where cuBLASLt refuses OUTER, e.g. Ada).
// A per-tensor scale is never used: one outlier token would flatten all the others.
// Accumulation: FP8 fast accumulation off (cuBLASLt default; partial sums promoted to
// f32 periodically), so results match the CPU emulation (common/ops/cpu/fp8.c) to
// fp32-summation rounding and the final bf16 rounding.
#include <cuda_fp8.h>
#include <stdio.h>
#include <string.h>

#include "common/ops/cuda/cuda_common.cuh"

extern "C" {
#include "common/base/log.h"
#include "common/base/testhook.h"
}

enum { FP8_OUTER = 1, FP8_EPI = 2 };

#define FP8_PLANS 64
#define FP8_PROBE_M 256        // the token count fp8_check asks the heuristic about

struct fp8_plan {
    int used, mode, M, K, N, al;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
};

// The context's FP8 state (ops_cuda_state.fp8): a ring of plans, as matmul.cu's.
struct fp8_state {
    int next, logged;
    fp8_plan plans[FP8_PLANS];
};

static void plan_release(fp8_plan *p) {
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
    memset(p, 0, sizeof(*p));
}

void cuda_fp8_state_destroy(ops_cuda_state *st) {
    fp8_state *f = (fp8_state *)st->fp8;
    if (!f) return;
    for (int i = 0; i < FP8_PLANS; i++)
        if (f->plans[i].used) plan_release(&f->plans[i]);
    free(f);
    st->fp8 = NULL;
}

static fp8_state *fp8_of(const ops_ctx_t *c) {
    ops_cuda_state *st = cuda_state(c);
    if (!st->fp8) {
        st->fp8 = calloc(1, sizeof(fp8_state));
        if (!st->fp8) {
            fprintf(stderr, "ops cuda fp8: out of host memory\n");
            abort();
        }
    }
    return (fp8_state *)st->fp8;
}

static int align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 2 && (a % al) != 0) al >>= 1;
    return al;
}

// Builds the plan for one mode; 0, or -1 when cuBLASLt has no algorithm (p released).
static int plan_make(const ops_ctx_t *c, fp8_plan *p, int mode, int M, int K, int N, int al) {
    p->used = 1;
    p->mode = mode;
    p->M = M;
    p->K = K;
    p->N = N;
    p->al = al;
    cudaDataType_t dt = mode == FP8_OUTER ? CUDA_R_16BF : CUDA_R_32F;
    cublas_check(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_8F_E4M3, K, N, K));
    cublas_check(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_8F_E4M3, K, M, K));
    cublas_check(cublasLtMatrixLayoutCreate(&p->ld, dt, N, M, N));
    cublas_check(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublas_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    cublas_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (mode == FP8_OUTER) {
        int32_t sm = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        cublas_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &sm,
                                                    sizeof(sm)));
        cublas_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &sm,
                                                    sizeof(sm)));
        // The heuristic refuses a vector scale mode without a scale pointer ("requires a
        // custom pointer"): any device address stands in until the forward sets sw and sx.
        const void *stand_in = c->workspace;
        cublas_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                    &stand_in, sizeof(stand_in)));
        cublas_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                    &stand_in, sizeof(stand_in)));
    }
    cublasLtMatmulPreference_t pref;
    cublas_check(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = c->workspace_bytes;
    uint32_t a16 = 16, d32 = (uint32_t)al;
    cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws, sizeof(ws)));
    cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                      &a16, sizeof(a16)));
    cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                      &a16, sizeof(a16)));
    cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                      &d32, sizeof(d32)));
    cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                      &d32, sizeof(d32)));
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)c->blas, p->op, p->la,
                                                      p->lb, p->ld, p->ld, pref, 1, &res, &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || nres == 0) {
        plan_release(p);
        return -1;
    }
    p->algo = res.algo;
    return 0;
}

// The cached plan for (M, K, N, output alignment): OUTER if cuBLASLt serves it, else
// EPI; NULL when neither (fp8_check refuses such shapes at load).
static fp8_plan *plan_get(const ops_ctx_t *c, int M, int K, int N, int al) {
    fp8_state *f = fp8_of(c);
    for (int i = 0; i < FP8_PLANS; i++) {
        fp8_plan *p = &f->plans[i];
        if (p->used && p->M == M && p->K == K && p->N == N && p->al == al) return p;
    }
    fp8_plan *p = &f->plans[f->next];
    f->next = (f->next + 1) % FP8_PLANS;
    if (p->used) plan_release(p);
    int64_t epi = 0;   // test hook ops.fp8_epilogue=1: the EPI path where OUTER is served too
    testhook_i64("ops.fp8_epilogue", &epi);
    if (!epi && plan_make(c, p, FP8_OUTER, M, K, N, al) == 0) return p;
    if (plan_make(c, p, FP8_EPI, M, K, N, al) == 0) return p;
    return NULL;
}

// ---------------------------------------------------------------- quantize
// One block per row: amax (block reduction), then q = satfinite_rne(x / s).
__global__ void fp8_quantize_rows_kernel(uint8_t *q, float *s, const bf16 *x, int K) {
    __shared__ float red[32];
    const bf16 *row = x + (size_t)blockIdx.x * K;
    float m = 0.0f;
    for (int k = threadIdx.x; k < K; k += blockDim.x) m = fmaxf(m, fabsf(__bfloat162float(row[k])));
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.0f;
        v = warp_max(v);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    float amax = red[0];
    float sc = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    if (threadIdx.x == 0) s[blockIdx.x] = sc;
    uint8_t *qr = q + (size_t)blockIdx.x * K;
    for (int k = threadIdx.x; k < K; k += blockDim.x)
        qr[k] = (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(__bfloat162float(row[k]), sc),
                                               __NV_SATFINITE, __NV_E4M3);
}

void cuda_fp8_quantize_rows(const ops_ctx_t *c, uint8_t *q, float *s, const void *x, int R,
                            int K) {
    if (R <= 0 || K <= 0) return;
    fp8_quantize_rows_kernel<<<R, 256, 0, cuda_stream(c)>>>(q, s, (const bf16 *)x, K);
    cuda_check_launch();
}

// ---------------------------------------------------------------- epilogues
// EPI: out[m][n] = bf16(acc[m][n] * sx[m] * sw[n] (+ bias[n])).
__global__ void fp8_scale_out_kernel(bf16 *out, const float *acc, const float *sx,
                                     const float *sw, const bf16 *bias, int M, int N) {
    size_t n_all = (size_t)M * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_all;
         i += (size_t)gridDim.x * blockDim.x) {
        int m = (int)(i / N), n = (int)(i % N);
        float v = acc[i] * sx[m] * sw[n];
        if (bias) v += __bfloat162float(bias[n]);
        out[i] = __float2bfloat16_rn(v);
    }
}
// OUTER with a bias: out[m][n] += bias[n].
__global__ void fp8_bias_kernel(bf16 *out, const bf16 *bias, int M, int N) {
    size_t n_all = (size_t)M * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_all;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(__bfloat162float(out[i]) + __bfloat162float(bias[i % N]));
}

// ---------------------------------------------------------------- forward
void cuda_fp8_matmul_forward(const ops_ctx_t *c, void *out, const uint8_t *qx, const float *sx,
                             const uint8_t *qw, const float *sw, const void *bias, int M, int K,
                             int N) {
    if (M <= 0 || N <= 0) return;
    cudaStream_t st = cuda_stream(c);
    fp8_plan *p = plan_get(c, M, K, N, align_of(out));
    if (!p) {
        fprintf(stderr, "ops cuda fp8: cuBLASLt has no FP8 GEMM for (M %d, K %d, N %d)\n", M, K, N);
        cuda_check_fail_("fp8_matmul_forward", "no cuBLASLt algorithm (fp8_check not called?)",
                         __FILE__, __LINE__);
    }
    float alpha = 1.0f, beta = 0.0f;
    size_t total = (size_t)M * N;
    if (p->mode == FP8_OUTER) {
        cublas_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw,
                                                    sizeof(sw)));
        cublas_check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx,
                                                    sizeof(sx)));
        cublas_check(cublasLtMatmul((cublasLtHandle_t)c->blas, p->op, &alpha, qw, p->la, qx, p->lb,
                                    &beta, out, p->ld, out, p->ld, &p->algo, c->workspace,
                                    c->workspace_bytes, st));
        if (bias) {
            fp8_bias_kernel<<<cuda_blocks(total, 256), 256, 0, st>>>((bf16 *)out, (const bf16 *)bias,
                                                                     M, N);
            cuda_check_launch();
        }
        return;
    }
    float *acc = (float *)cuda_scratch(c, total * sizeof(float));
    cublas_check(cublasLtMatmul((cublasLtHandle_t)c->blas, p->op, &alpha, qw, p->la, qx, p->lb,
                                &beta, acc, p->ld, acc, p->ld, &p->algo, c->workspace,
                                c->workspace_bytes, st));
    fp8_scale_out_kernel<<<cuda_blocks(total, 256), 256, 0, st>>>((bf16 *)out, acc, sx, sw,
                                                                  (const bf16 *)bias, M, N);
    cuda_check_launch();
}

// ---------------------------------------------------------------- check
int cuda_fp8_check(const ops_ctx_t *c, int K, int N) {
    int major = 0, minor = 0;
    cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device));
    cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device));
    if (major * 10 + minor < 89)
        return dl_seterr(DL_ENOTSUP, "fp8 target: GPU %d is sm_%d%d; FP8 tensor cores need sm_89 "
                         "(Ada) or sm_90 (Hopper)", c->device, major, minor);
    if (K < 16 || N < 16 || K % 16 || N % 16)
        return dl_seterr(DL_ENOTSUP, "fp8 target: linear weight (%d, %d): cuBLASLt FP8 GEMMs need "
                         "both sizes multiples of 16", N, K);
    fp8_plan *p = plan_get(c, FP8_PROBE_M, K, N, 256);
    if (!p)
        return dl_seterr(DL_ENOTSUP, "fp8 target: cuBLASLt (version %zu) has no FP8 E4M3 GEMM for "
                         "weight (%d, %d) on sm_%d%d", cublasLtGetVersion(), N, K, major, minor);
    fp8_state *f = fp8_of(c);
    if (!(f->logged & p->mode)) {
        f->logged |= p->mode;
        log_info("fp8 linear on sm_%d%d: %s", major, minor,
                 p->mode == FP8_OUTER ? "cuBLASLt E4M3 GEMM with outer-vector scales (per token x "
                                        "per output channel)"
                                      : "cuBLASLt E4M3 GEMM to f32, scales applied by an epilogue "
                                        "kernel (outer-vector scales refused here)");
    }
    return 0;
}
