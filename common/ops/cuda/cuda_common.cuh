// Internal header of the CUDA backend (common/ops/cuda/): the per-context state,
// the launchers gathered into the impl table by ops_cuda.cu, and small device
// helpers. Not a public header: model code calls through ctx->impl (ops.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cublasLt.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "common/base/err.h"
#include "common/ops/ops.h"
}
#include "common/ops/cuda/cuda_check.h"

typedef __nv_bfloat16 bf16;

// One cached cuBLASLt plan: descriptors and the heuristic's algorithm for one
// (kind, M, K, N, bias) shape; chosen once, reused on every later call.
struct cuda_gemm_plan {
    int used, kind, M, K, N, bias;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

#define CUDA_GEMM_PLANS 96
#define CUDA_PARTIALS 1024  // sumsq: floats of per-block partial sums

// Per-context state. ctx->impl points at .impl (first member), so the state is
// found from the context without a field in ops_ctx_t.
struct ops_cuda_state {
    ops_impl_t impl;
    int num_sms;
    float *partials;             // (CUDA_PARTIALS) f32, device
    void *scratch;               // grow-only device scratch (attention backward)
    size_t scratch_bytes;
    int next_plan;
    cuda_gemm_plan plans[CUDA_GEMM_PLANS];
    void *fp8;                   // matmul_fp8.cu's plans (NULL until the first fp8 call)
};

static inline ops_cuda_state *cuda_state(const ops_ctx_t *c) {
    return (ops_cuda_state *)(void *)c->impl;
}
static inline cudaStream_t cuda_stream(const ops_ctx_t *c) { return (cudaStream_t)c->stream; }

// Device scratch of at least `bytes`, valid until the next call on the same
// context. Grows stream-ordered (cudaMallocAsync/cudaFreeAsync: no host sync);
// after the first step of a run it no longer allocates.
void *cuda_scratch(const ops_ctx_t *c, size_t bytes);

// 8 bf16 of one 16-byte load to f32, and back (round to nearest even).
__device__ __forceinline__ void bf16x8_unpack(float *f, uint4 u) {
    const __nv_bfloat162 *p = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 t = __bfloat1622float2(p[k]);
        f[2 * k] = t.x;
        f[2 * k + 1] = t.y;
    }
}
__device__ __forceinline__ uint4 bf16x8_pack(const float *f) {
    uint4 u;
    __nv_bfloat162 *p = (__nv_bfloat162 *)&u;
#pragma unroll
    for (int k = 0; k < 4; k++) p[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    return u;
}

// Whether p may be read or written by 16-byte vector accesses.
static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// Launch configuration helpers.
static inline unsigned cuda_blocks(size_t n, int threads, size_t cap = 65535u * 32u) {
    size_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > cap) b = cap;
    return (unsigned)b;
}

// ---- launchers (signatures of ops_impl_t) ----
void cuda_matmul_forward(const ops_ctx_t *c, void *out, const void *inp, const void *weight,
                         const void *bias, int M, int K, int N);
void cuda_matmul_forward_res(const ops_ctx_t *c, void *out, const void *inp, const void *weight,
                             const void *bias, const void *res, int M, int K, int N);
void cuda_matmul_backward(const ops_ctx_t *c, void *dinp, float *dweight, float *dbias,
                          const void *dout, const void *inp, const void *weight, int M, int K,
                          int N, int dinp_acc);
void cuda_gemm_plans_destroy(ops_cuda_state *st);
void cuda_rmsnorm_forward(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                          const void *weight, float eps, int N, int C);
void cuda_add_rmsnorm_forward(const ops_ctx_t *c, void *x, void *out, float *rstd,
                              const void *res, const void *weight, float eps, int N, int C);
void cuda_rmsnorm_backward(const ops_ctx_t *c, void *dinp, float *dweight, const void *dout,
                           const void *inp, const void *weight, const float *rstd, int N, int C);
void cuda_rope_forward(const ops_ctx_t *c, void *x, const int32_t *pos, const float *inv_freq,
                       int N, int nh, int hd);
void cuda_rope_backward(const ops_ctx_t *c, void *dx, const int32_t *pos, const float *inv_freq,
                        int N, int nh, int hd);
void cuda_swiglu_forward(const ops_ctx_t *c, void *out, const void *gate, const void *up, size_t n);
void cuda_swiglu_backward(const ops_ctx_t *c, void *dgate, void *dup, const void *dout,
                          const void *gate, const void *up, size_t n);
void cuda_attention_varlen_forward(const ops_ctx_t *c, void *out, const void *q, const void *k,
                                   const void *v, const int32_t *cu_seqlens, int nseq,
                                   int max_seqlen, int T, int H, int Hkv, int hd);
void cuda_attention_block_forward(const ops_ctx_t *c, void *out, float *lse, const void *q,
                                  const void *kb, const void *vb, const void *kc, const void *vc,
                                  const int32_t *ctx_start, const int32_t *ctx_len, int Nb, int B,
                                  int Tc, int H, int Hkv, int hd);
void cuda_attention_block_backward(const ops_ctx_t *c, void *dq, void *dkb, void *dvb, void *dkc,
                                   void *dvc, const void *dout, const void *out, const float *lse,
                                   const void *q, const void *kb, const void *vb, const void *kc,
                                   const void *vc, const int32_t *ctx_start,
                                   const int32_t *ctx_len, int Nb, int B, int Tc, int H, int Hkv,
                                   int hd);
void cuda_xent_forward_backward(const ops_ctx_t *c, void *logits, float *loss, float *correct,
                                const int32_t *targets, const float *w, float grad_scale, int N,
                                int V);
void cuda_sumsq(const ops_ctx_t *c, float *out, const float *x, size_t n, int accumulate);
void cuda_f32_add_scale(const ops_ctx_t *c, float *out, const float *a, const float *b,
                        float scale, size_t n);
void cuda_adamw(const ops_ctx_t *c, float *master, void *work, const float *grad, float *m,
                float *v, size_t n, float lr, float b1, float b2, float eps, float wd, int t,
                const float *norm_sq, float max_norm);
void cuda_sumsq_scaled(const ops_ctx_t *c, float *out, const float *x, float scale, size_t n);
void cuda_adamw_pub(const ops_ctx_t *c, float *master, float *pub, const float *grad,
                    float gscale, float *m, float *v, size_t n, float lr, float b1, float b2,
                    float eps, float wd, int t, const float *norm_sq, float max_norm);
// moe.cu (target MoE layers)
void cuda_moe_route(const ops_ctx_t *c, int32_t *idx, float *w, const void *logits, int T, int E,
                    int k, int norm);
void cuda_moe_permute(const ops_ctx_t *c, int32_t *offsets, int32_t *tok, int32_t *inv,
                      const int32_t *idx, int T, int E, int k);
void cuda_moe_combine(const ops_ctx_t *c, void *out, const void *y, const int32_t *inv,
                      const float *w, int T, int k, int D);
// matmul_fp8.cu (target --target-precision fp8)
void cuda_fp8_quantize_rows(const ops_ctx_t *c, uint8_t *q, float *s, const void *x, int R, int K);
void cuda_fp8_matmul_forward(const ops_ctx_t *c, void *out, const uint8_t *qx, const float *sx,
                             const uint8_t *qw, const float *sw, const void *bias, int M, int K,
                             int N);
int cuda_fp8_check(const ops_ctx_t *c, int K, int N);
void cuda_fp8_state_destroy(ops_cuda_state *st);

// ---- device helpers ----
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Rounding spelled out (no multiply-add contraction left to the compiler), so that a
// fused kernel (qknorm_rope.cu's EXACT path) computes the bits of the unfused ones
// (rmsnorm.cu, rope.cu): x*x + y*y, and the rotation of the pair (a, b) by (cs, sn).
__device__ __forceinline__ float sumsq2(float x, float y) { return fmaf(x, x, __fmul_rn(y, y)); }
__device__ __forceinline__ float rot_a(float a, float b, float cs, float sn) { return fmaf(a, cs, -__fmul_rn(b, sn)); }
__device__ __forceinline__ float rot_b(float a, float b, float cs, float sn) { return fmaf(b, cs, __fmul_rn(a, sn)); }
// The RoPE angle pos * inv_freq, rounded to f32 (as HF computes it).
__device__ __forceinline__ float rope_angle(int32_t pos, float inv_freq) { return __fmul_rn((float)pos, inv_freq); }
// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets
// the result. `sh` holds 32 floats; the function syncs before reusing it.
__device__ __forceinline__ float block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}
