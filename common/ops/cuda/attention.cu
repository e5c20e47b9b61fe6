// Causal self-attention over a packed batch of variable-length sequences
// (cu_seqlens), FlashAttention-2 style (Dao 2023): online softmax over 64-key
// tiles, no (T,T) score matrix in memory, bf16 tensor cores (mma.sync m16n8k16)
// with f32 accumulation.
//
// One thread block = 64 query rows of one (sequence, head); 4 warps, 16 rows
// each. Q, K and V tiles live in shared memory (padded rows; K/V double-
// buffered, the next tile fetched by cp.async during the current one's math;
// fragments read with ldmatrix); the scores,
// probabilities and the output accumulator stay in registers. Query tiles are
// enumerated last-first so the longest causal rows start first. GQA: head h
// reads kv head h / (H/Hkv). hd <= 128 (padded to 32/64/96/128).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/ops/cuda/attention_common.cuh"

#define AV_BM 64
#define AV_BN 64

template <int HDP>
__global__ void __launch_bounds__(128)
attn_varlen_fwd_kernel(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v,
                       const int32_t *cu, int H, int Hkv, int hd, float scale_log2, int ntiles,
                       int vec) {
    constexpr int LD = HDP + 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // Q tile, then two stages of (K tile, V tile): the next tile is fetched by
    // cp.async while the current one is used.
    bf16 *Qs = (bf16 *)smem_raw;
    bf16 *KV = Qs + AV_BM * LD;
    const int s = blockIdx.y, h = blockIdx.z;
    const int seq0 = cu[s], L = cu[s + 1] - seq0;
    const int q0 = (ntiles - 1 - (int)blockIdx.x) * AV_BM;
    if (q0 >= L) return;
    const int hk = h / (H / Hkv);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t qstride = (size_t)H * hd, kstride = (size_t)Hkv * hd;
    const bf16 *kbase = k + (size_t)seq0 * kstride + (size_t)hk * hd;
    const bf16 *vbase = v + (size_t)seq0 * kstride + (size_t)hk * hd;
    const int kv_end = min(L, q0 + AV_BM);
    const int ntile = (kv_end + AV_BN - 1) / AV_BN;

    auto issue = [&](int it) {
        const int k0 = it * AV_BN;
        bf16 *Ks = KV + (it & 1) * 2 * AV_BN * LD, *Vs = Ks + AV_BN * LD;
        load_rows_async<HDP, AV_BN>(Ks, [&](int r) -> const bf16 * {
            return k0 + r < L ? kbase + (size_t)(k0 + r) * kstride : nullptr;
        }, hd, vec, tid, blockDim.x, k);
        load_rows_async<HDP, AV_BN>(Vs, [&](int r) -> const bf16 * {
            return k0 + r < L ? vbase + (size_t)(k0 + r) * kstride : nullptr;
        }, hd, vec, tid, blockDim.x, k);
    };
    load_rows_async<HDP, AV_BM>(Qs, [&](int r) -> const bf16 * {
        return q0 + r < L ? q + (size_t)(seq0 + q0 + r) * qstride + (size_t)h * hd : nullptr;
    }, hd, vec, tid, blockDim.x, q);
    issue(0);
    cp_async_commit();

    const int r0 = warp * 16;
    uint32_t qf[HDP / 16][4];
    float o[HDP / 8][4];
#pragma unroll
    for (int i = 0; i < HDP / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    const int qa = q0 + r0 + g, qb = qa + 8;  // positions within the sequence

    for (int it = 0; it < ntile; it++) {
        if (it + 1 < ntile) {
            issue(it + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < HDP / 16; kk++) ldsm_a<LD>(qf[kk], Qs, r0, kk * 16, lane);
        }
        const int k0 = it * AV_BN;
        const bf16 *Ks = KV + (it & 1) * 2 * AV_BN * LD, *Vs = Ks + AV_BN * LD;

        float sc[AV_BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < AV_BN / 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HDP / 16; kk++) {
#pragma unroll
            for (int nt = 0; nt < AV_BN / 8; nt += 2) {
                uint32_t b0[2], b1[2];
                ldsm_b_nk<LD>(b0, b1, Ks, nt * 8, kk * 16, lane);
                mma_bf16_16816(sc[nt], qf[kk], b0);
                mma_bf16_16816(sc[nt + 1], qf[kk], b1);
            }
        }
        // scale (log2 domain) and mask: key > query (causal) or key outside the sequence
        const bool need_mask = k0 + AV_BN - 1 > q0 + r0 || k0 + AV_BN > L;
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < AV_BN / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float val = sc[nt][e] * scale_log2;
                if (need_mask) {
                    int key = k0 + nt * 8 + 2 * t + (e & 1);
                    int qr = e < 2 ? qa : qb;
                    if (key > qr || key >= L) val = -INFINITY;
                }
                sc[nt][e] = val;
            }
            mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        float mn0 = fmaxf(mrow[0], mx0), mn1 = fmaxf(mrow[1], mx1);
        float mu0 = mn0 == -INFINITY ? 0.0f : mn0, mu1 = mn1 == -INFINITY ? 0.0f : mn1;
        float al0 = exp2f(mrow[0] - mu0), al1 = exp2f(mrow[1] - mu1);
        mrow[0] = mn0;
        mrow[1] = mn1;
        float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
        for (int nt = 0; nt < AV_BN / 8; nt++) {
            sc[nt][0] = exp2f(sc[nt][0] - mu0);
            sc[nt][1] = exp2f(sc[nt][1] - mu0);
            sc[nt][2] = exp2f(sc[nt][2] - mu1);
            sc[nt][3] = exp2f(sc[nt][3] - mu1);
            ls0 += sc[nt][0] + sc[nt][1];
            ls1 += sc[nt][2] + sc[nt][3];
        }
        lrow[0] = lrow[0] * al0 + ls0;
        lrow[1] = lrow[1] * al1 + ls1;
#pragma unroll
        for (int nt = 0; nt < HDP / 8; nt++) {
            o[nt][0] *= al0;
            o[nt][1] *= al0;
            o[nt][2] *= al1;
            o[nt][3] *= al1;
        }
#pragma unroll
        for (int kk = 0; kk < AV_BN / 16; kk++) {
            uint32_t a[4];
            c_to_a(a, sc[2 * kk], sc[2 * kk + 1]);
#pragma unroll
            for (int nt = 0; nt < HDP / 8; nt += 2) {
                uint32_t b0[2], b1[2];
                ldsm_b_kn<LD>(b0, b1, Vs, kk * 16, nt * 8, lane);
                mma_bf16_16816(o[nt], a, b0);
                mma_bf16_16816(o[nt + 1], a, b1);
            }
        }
        __syncthreads();  // this stage is refilled two iterations on
    }
    lrow[0] += __shfl_xor_sync(0xffffffffu, lrow[0], 1);
    lrow[0] += __shfl_xor_sync(0xffffffffu, lrow[0], 2);
    lrow[1] += __shfl_xor_sync(0xffffffffu, lrow[1], 1);
    lrow[1] += __shfl_xor_sync(0xffffffffu, lrow[1], 2);
    float inv0 = lrow[0] > 0.0f ? 1.0f / lrow[0] : 0.0f;
    float inv1 = lrow[1] > 0.0f ? 1.0f / lrow[1] : 0.0f;
    store_rows<HDP>(o, inv0, inv1, [&](int r) -> bf16 * {
        int qr = q0 + r0 + r;
        return qr < L ? out + (size_t)(seq0 + qr) * qstride + (size_t)h * hd : nullptr;
    }, hd, g, t);
}

template <int HDP>
static void launch_varlen(const ops_ctx_t *c, void *out, const void *q, const void *k,
                          const void *v, const int32_t *cu, int nseq, int max_seqlen, int H,
                          int Hkv, int hd) {
    constexpr int LD = HDP + 8;
    size_t smem = (size_t)(AV_BM + 4 * AV_BN) * LD * sizeof(bf16);
    cuda_check(cudaFuncSetAttribute(attn_varlen_fwd_kernel<HDP>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int ntiles = (max_seqlen + AV_BM - 1) / AV_BM;
    int vec = hd % 8 == 0 && ((uintptr_t)q & 15) == 0 && ((uintptr_t)k & 15) == 0 &&
              ((uintptr_t)v & 15) == 0;
    float scale_log2 = (1.0f / sqrtf((float)hd)) * ATTN_LOG2E;
    dim3 grid(ntiles, nseq, H);
    attn_varlen_fwd_kernel<HDP><<<grid, 128, smem, cuda_stream(c)>>>(
        (bf16 *)out, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, cu, H, Hkv, hd,
        scale_log2, ntiles, vec);
    cuda_check_launch();
}

void cuda_attention_varlen_forward(const ops_ctx_t *c, void *out, const void *q, const void *k,
                                   const void *v, const int32_t *cu_seqlens, int nseq,
                                   int max_seqlen, int T, int H, int Hkv, int hd) {
    (void)T;
    if (nseq <= 0 || max_seqlen <= 0 || H <= 0) return;
    switch (attn_hdp(hd)) {
    case 32: launch_varlen<32>(c, out, q, k, v, cu_seqlens, nseq, max_seqlen, H, Hkv, hd); break;
    case 64: launch_varlen<64>(c, out, q, k, v, cu_seqlens, nseq, max_seqlen, H, Hkv, hd); break;
    case 96: launch_varlen<96>(c, out, q, k, v, cu_seqlens, nseq, max_seqlen, H, Hkv, hd); break;
    case 128: launch_varlen<128>(c, out, q, k, v, cu_seqlens, nseq, max_seqlen, H, Hkv, hd); break;
    default:
        fprintf(stderr, "ops cuda attention_varlen_forward: head dim %d > 128 not supported\n", hd);
        abort();
    }
}
