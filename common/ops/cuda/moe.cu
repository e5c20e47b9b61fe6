// Mixture-of-experts helpers on CUDA (the twins of common/ops/cpu/moe.c; contracts in
// ops.h): router top-k, counting-sort permutation by expert, weighted combine.
// Deterministic: no atomics; the combine is a gather summed in top-k order in f32.
#include "common/ops/cuda/cuda_common.cuh"

#include <stdio.h>
#include <stdlib.h>

#define MOE_MAX_PER_LANE 32   // experts per lane of the route warp: E <= 1024
#define MOE_MAX_K 32

// One warp per token: softmax statistics in f32, then k rounds of a warp argmax over the
// experts not yet taken (strictly greater wins; ties: the lower expert id, as the CPU).
__global__ void moe_route_kernel(int32_t *idx, float *w, const bf16 *logits, int T, int E, int k,
                                 int norm) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= T) return;
    const bf16 *x = logits + (size_t)warp * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, __bfloat162float(x[e]));
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) sum += expf(__bfloat162float(x[e]) - mx);
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    uint32_t taken = 0;   // bit i: expert lane + 32 i taken
    float wk[MOE_MAX_K], picked = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int be = -1;
        for (int i = 0, e = lane; e < E; i++, e += 32) {
            float v = __bfloat162float(x[e]);
            if (!((taken >> i) & 1u) && (be < 0 || v > bv)) { bv = v; be = e; }
        }
        for (int o = 16; o; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) { bv = ov; be = oe; }
        }
        if (be % 32 == lane) taken |= 1u << (be / 32);
        wk[j] = expf(bv - mx) / sum;
        picked += wk[j];
        if (lane == 0) idx[(size_t)warp * k + j] = be;
    }
    if (lane == 0)
        for (int j = 0; j < k; j++) w[(size_t)warp * k + j] = norm ? wk[j] / picked : wk[j];
}

void cuda_moe_route(const ops_ctx_t *c, int32_t *idx, float *w, const void *logits,
                               int T, int E, int k, int norm) {
    if (T <= 0) return;
    if (E > 32 * MOE_MAX_PER_LANE || k > MOE_MAX_K) {
        fprintf(stderr, "ops cuda moe_route: %d experts (max %d), top-%d (max %d)\n", E,
                32 * MOE_MAX_PER_LANE, k, MOE_MAX_K);
        abort();
    }
    moe_route_kernel<<<cuda_blocks((size_t)T * 32, 256, (size_t)1 << 30), 256, 0, cuda_stream(c)>>>(
        idx, w, (const bf16 *)logits, T, E, k, norm);
    cuda_check_launch();
}

// Block e counts the entries routed to expert e into cnt[e] (offsets + 1 as scratch).
__global__ void moe_count_kernel(int32_t *cnt, const int32_t *idx, int R) {
    __shared__ int part[32];
    int e = blockIdx.x, n = 0;
    for (int i = threadIdx.x; i < R; i += blockDim.x) n += idx[i] == e;
    for (int o = 16; o; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = n;
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0;
        for (int i = 0; i < (int)blockDim.x / 32; i++) s += part[i];
        cnt[e] = s;
    }
}

// offsets[0] = 0, offsets[e+1] = offsets[e] + cnt[e], in place (cnt = offsets + 1).
__global__ void moe_scan_kernel(int32_t *offsets, int E) {
    offsets[0] = 0;
    for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
}

// Block e places its entries in entry order (stable): chunks of blockDim entries, a block
// prefix count by warp ballots.
__global__ void moe_place_kernel(int32_t *tok, int32_t *inv, const int32_t *offsets,
                                 const int32_t *idx, int R, int k) {
    __shared__ int wsum[32], wbase[32];
    int e = blockIdx.x, lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
    int base = offsets[e];
    for (int c0 = 0; c0 < R; c0 += blockDim.x) {
        int i = c0 + threadIdx.x;
        int hit = i < R && idx[i] == e;
        uint32_t b = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) wsum[wid] = __popc(b);
        __syncthreads();
        if (threadIdx.x == 0) {
            int s = 0;
            for (int w = 0; w < nw; w++) { wbase[w] = s; s += wsum[w]; }
            wsum[nw < 32 ? nw : 31] = s;   // chunk total (slot past the last warp)
        }
        __syncthreads();
        if (hit) {
            int r = base + wbase[wid] + __popc(b & ((1u << lane) - 1u));
            tok[r] = i / k;
            inv[i] = r;
        }
        base += wsum[nw < 32 ? nw : 31];
        __syncthreads();
    }
}

void cuda_moe_permute(const ops_ctx_t *c, int32_t *offsets, int32_t *tok, int32_t *inv,
                                 const int32_t *idx, int T, int E, int k) {
    int R = T * k;
    cudaStream_t s = cuda_stream(c);
    moe_count_kernel<<<E, 256, 0, s>>>(offsets + 1, idx, R);
    cuda_check_launch();
    moe_scan_kernel<<<1, 1, 0, s>>>(offsets, E);
    cuda_check_launch();
    if (R <= 0) return;
    moe_place_kernel<<<E, 256, 0, s>>>(tok, inv, offsets, idx, R, k);
    cuda_check_launch();
}

// out[t] = sum_j w[t k + j] y[inv[t k + j]], f32 sum in j order; a block per token.
__global__ void moe_combine_kernel(bf16 *out, const bf16 *y, const int32_t *inv, const float *w,
                                   int T, int k, int D) {
    for (int t = blockIdx.x; t < T; t += gridDim.x)
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float acc = 0.0f;
            for (int j = 0; j < k; j++)
                acc += w[(size_t)t * k + j] * __bfloat162float(y[(size_t)inv[(size_t)t * k + j] * D + d]);
            out[(size_t)t * D + d] = __float2bfloat16_rn(acc);
        }
}

void cuda_moe_combine(const ops_ctx_t *c, void *out, const void *y, const int32_t *inv,
                                 const float *w, int T, int k, int D) {
    if (T <= 0) return;
    moe_combine_kernel<<<cuda_blocks((size_t)T, 1, 65535u), 256, 0, cuda_stream(c)>>>(
        (bf16 *)out, (const bf16 *)y, inv, w, T, k, D);
    cuda_check_launch();
}
