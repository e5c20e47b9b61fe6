// Causal self-attention over a packed batch of variable-length sequences
// (cu_seqlens), FlashAttention-2 style (Dao 2023): online softmax over key
// tiles, no (T,T) score matrix in memory, bf16 tensor cores (mma.sync m16n8k16)
// with f32 accumulation. GQA: head h reads kv head h / (H/Hkv). hd <= 128
// (padded to 32/64/96/128 in shared memory; any hd, aligned or not).
//
// Three kernels (ops_cuda_attention_varlen_forward_variant picks one):
//   variant 1, any hd <= 128, any GPU (attn_varlen_fwd_mma_kernel): one thread block =
//     128 query rows of one (sequence, head), 4 warps of 32 rows (two 16-row m-tiles
//     sharing every K/V fragment), mma.sync; the Q tile and double-buffered 64-key K/V
//     tiles in shared memory (rows padded by 16 bytes; the next K/V tile fetched
//     by cp.async during the current one's math; fragments read with ldmatrix); scores,
//     probabilities and the output accumulator in registers;
//   variant 2, Hopper (sm_90a), hd 128, 16-byte aligned rows (attn_varlen_fwd_ws_kernel):
//     192 query rows as 3 consumer warpgroups on wgmma and a producer warpgroup filling
//     64-key K/V stages by cp.async behind mbarriers (warp-specialized, as FA3 without TMA);
//   variant 3 (the default), the same conditions (attn_varlen_fwd_fa3_kernel): FA3's forward,
//     TMA loads of 128-key tiles, 2 consumer warpgroups taking turns (ping-pong).
//   Where 2 and 3 do not apply, variant 1 runs.
// Query tiles are enumerated last-first so the longest causal rows start first.
// Measured on an H200, H 32 / Hkv 8, hd 128, 8 x 4096 tokens: 5.43 ms (1), 3.43-3.95 ms (2,
// 278-321 TFLOP/s), 2.16 ms (3, 509 TFLOP/s); T = 65,536 in 33 sequences of 128..4096: 7.9,
// 5.1-5.8 and 3.47 ms (bench/NOTES.md; in its entries before 2026-12-03's third session, 1
// was "variant 3" and 2 "variant 7"; variants 1, 2, 4-6 and 8 there were kernels measured
// slower, since removed).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/ops/cuda/attention_common.cuh"
#include "common/ops/cuda/wgmma.cuh"
extern "C" {
#include "common/ops/cuda/ops_cuda.h"
}

// Kernel used by attention_varlen_forward (ops_cuda_attention_varlen_forward_variant):
// variant 3 measured fastest on an H200 (bench/NOTES.md, 2026-12-04); it runs variant 1
// where wgmma does not apply.
#define ATTN_VARLEN_DEFAULT_VARIANT 3

// Variant 1: 128 query rows per block, each warp 32 rows (two 16-row m-tiles that share
// every K/V fragment read), BN keys per tile (64); Q is re-read from shared memory
// (ldmatrix) instead of being held in registers.
#define AV_BM 128
template <int HDP, int BN>
__global__ void __launch_bounds__(128)
attn_varlen_fwd_mma_kernel(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v,
                           const int32_t *cu, int H, int Hkv, int hd, float scale_log2,
                           int ntiles, int vec) {
    constexpr int LD = HDP + 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Qs = (bf16 *)smem_raw;
    bf16 *KV = Qs + AV_BM * LD;  // 2 stages x (K tile, V tile), BN rows each
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
    const int ntile = (kv_end + BN - 1) / BN;

    auto issue = [&](int it) {
        const int k0 = it * BN;
        bf16 *Ks = KV + (it & 1) * 2 * BN * LD, *Vs = Ks + BN * LD;
        load_rows_async<HDP, BN>(Ks, [&](int r) -> const bf16 * {
            return k0 + r < L ? kbase + (size_t)(k0 + r) * kstride : nullptr;
        }, hd, vec, tid, blockDim.x, k);
        load_rows_async<HDP, BN>(Vs, [&](int r) -> const bf16 * {
            return k0 + r < L ? vbase + (size_t)(k0 + r) * kstride : nullptr;
        }, hd, vec, tid, blockDim.x, k);
    };
    load_rows_async<HDP, AV_BM>(Qs, [&](int r) -> const bf16 * {
        return q0 + r < L ? q + (size_t)(seq0 + q0 + r) * qstride + (size_t)h * hd : nullptr;
    }, hd, vec, tid, blockDim.x, q);
    issue(0);
    cp_async_commit();

    const int r0 = warp * 32;
    float o[2][HDP / 8][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int i = 0; i < HDP / 8; i++) o[m][i][0] = o[m][i][1] = o[m][i][2] = o[m][i][3] = 0.0f;
    float mrow[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
    float lrow[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    const int qbase = q0 + r0;  // first query position of this warp

    for (int it = 0; it < ntile; it++) {
        if (it + 1 < ntile) {
            issue(it + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int k0 = it * BN;
        if (k0 <= qbase + 31) {  // else every key is after every query of this warp
            const bf16 *Ks = KV + (it & 1) * 2 * BN * LD, *Vs = Ks + BN * LD;
            float sc[2][BN / 8][4];
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int nt = 0; nt < BN / 8; nt++)
                    sc[m][nt][0] = sc[m][nt][1] = sc[m][nt][2] = sc[m][nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HDP / 16; kk++) {
                uint32_t a0[4], a1[4];
                ldsm_a<LD>(a0, Qs, r0, kk * 16, lane);
                ldsm_a<LD>(a1, Qs, r0 + 16, kk * 16, lane);
#pragma unroll
                for (int nt = 0; nt < BN / 8; nt += 2) {
                    uint32_t b0[2], b1[2];
                    ldsm_b_nk<LD>(b0, b1, Ks, nt * 8, kk * 16, lane);
                    mma_bf16_16816(sc[0][nt], a0, b0);
                    mma_bf16_16816(sc[0][nt + 1], a0, b1);
                    mma_bf16_16816(sc[1][nt], a1, b0);
                    mma_bf16_16816(sc[1][nt + 1], a1, b1);
                }
            }
            const bool need_mask = k0 + BN - 1 > qbase || k0 + BN > L;
#pragma unroll
            for (int m = 0; m < 2; m++) {
                int qa = qbase + m * 16 + g;
                online_softmax_tile<BN, HDP>(sc[m], mrow[m], lrow[m], o[m], k0, qa, qa + 8, L,
                                             need_mask, scale_log2, t);
            }
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                uint32_t a0[4], a1[4];
                c_to_a(a0, sc[0][2 * kk], sc[0][2 * kk + 1]);
                c_to_a(a1, sc[1][2 * kk], sc[1][2 * kk + 1]);
#pragma unroll
                for (int nt = 0; nt < HDP / 8; nt += 2) {
                    uint32_t b0[2], b1[2];
                    ldsm_b_kn<LD>(b0, b1, Vs, kk * 16, nt * 8, lane);
                    mma_bf16_16816(o[0][nt], a0, b0);
                    mma_bf16_16816(o[0][nt + 1], a0, b1);
                    mma_bf16_16816(o[1][nt], a1, b0);
                    mma_bf16_16816(o[1][nt + 1], a1, b1);
                }
            }
        }
        __syncthreads();  // this stage is refilled two iterations on
    }
#pragma unroll
    for (int m = 0; m < 2; m++) {
        float l0 = lrow[m][0], l1 = lrow[m][1];
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
        store_rows<HDP>(o[m], inv0, inv1, [&](int r) -> bf16 * {
            int qr = qbase + m * 16 + r;
            return qr < L ? out + (size_t)(seq0 + qr) * qstride + (size_t)h * hd : nullptr;
        }, hd, g, t);
    }
}

#ifndef ABW_NO_WGMMA
// Variants 2 and 3: stages a consumer warpgroup's Q tile (query rows qw0 .. qw0 + 63 of the
// sequence of L tokens from row seq0 of q (T, H, 128), head h; rows past L as zeros) into the
// core-matrix tile Qw by cp.async, makes it visible to wgmma, and waits for the warpgroup's
// 128 threads (named barrier 1 + sel). wtid: the thread's index in the warpgroup.
__device__ __forceinline__ void varlen_load_q(unsigned char *Qw, const bf16 *q, int seq0,
                                              int qw0, int L, int h, size_t qstride, int wtid,
                                              int sel) {
    abw_load_tile(Qw, [&](int r) -> const bf16 * {
        return qw0 + r < L ? q + (size_t)(seq0 + qw0 + r) * qstride + (size_t)h * 128 : nullptr;
    }, wtid, q);
    cp_async_commit();
    cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    named_bar_sync(1 + sel, 128);  // this warpgroup's Q tile is in
}

// Writes a warp's 16 x 128 output accumulator divided by its rows' softmax sums (lrow: this
// thread's partial sums of rows g, g + 8); rowptr(r) gives row r's destination or NULL.
template <typename RowFn>
__device__ __forceinline__ void varlen_store_o(const float (*acc)[4], const float *lrow,
                                          RowFn rowptr, int g, int t) {
    float l0 = lrow[0], l1 = lrow[1];
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    store_rows<128>(acc, inv0, inv1, rowptr, 128, g, t);
}
#endif

// Variant 2: warpgroups of 64 consecutive queries of one (sequence, head) on wgmma
// (sm_90a), warp-specialized. A thread block = NWG = 3 consumer warpgroups (192 queries)
// and a producer warpgroup that fills NST stages of a 64-key K tile and V tile (cp.async
// into the core-matrix layout of wgmma.cuh), each stage's landing signalled on an mbarrier
// (full[s], cp.async.mbarrier.arrive); the consumers wait on it, compute, and release the
// stage on another (empty[s], one arrival per consumer warp). No block-wide barrier after
// start-up, so the warpgroups drift apart and one's softmax runs under another's
// tensor-core work, instead of all of them stepping tile by tile together (two block
// barriers per tile: measured 5.1 against 3.43-3.95 ms on 8 x 4096). The register pool is
// dealt in warpgroups (a lone producer warp would cost the block a whole warpgroup's
// share): the producer gives up registers by setmaxnreg (40) and the consumers take them
// (152; they need ~138 without serializing the wgmma). A warpgroup past its last key tile
// (causal) still waits for and releases each later stage, so every stage's phases count
// all NWG x 4 consumer warps. Per tile and warpgroup: S = Q K^T (8 x m64n64k16, A = Q, B =
// K, both K-major), the online softmax on the accumulator (its layout is the mma.sync one,
// so online_softmax_tile serves), O += P V (4 x m64n128k16, A = P in registers, B = V
// MN-major). The register split assumes the kernel starts at 128 per thread (65,536 / 512;
// no -maxrregcount below that): 128 x 40 + 384 x 152 = 63,488 fits, else
// setmaxnreg.inc would wait forever.
template <int NST>
__global__ void __launch_bounds__(512, 1)
attn_varlen_fwd_ws_kernel(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v,
                          const int32_t *cu, int H, int Hkv, float scale_log2, int ntiles) {
#ifdef ABW_NO_WGMMA
    __trap();
#else
    constexpr int NWG = 3, hd = 128, BM = 64 * NWG, BN = 64;
    extern __shared__ __align__(16) unsigned char smem_raw[];  // (the dynamic base is 1024-aligned)
    unsigned char *KV = smem_raw;                        // NST stages x (K tile, V tile)
    unsigned char *Qt = KV + 2 * NST * ABW_TILE_BYTES;   // NWG warpgroups x Q tile
    uint64_t *full = (uint64_t *)(Qt + NWG * ABW_TILE_BYTES), *empty = full + NST;
    const int s = blockIdx.y, h = blockIdx.z;
    const int seq0 = cu[s], L = cu[s + 1] - seq0;
    const int q0 = (ntiles - 1 - (int)blockIdx.x) * BM;
    if (q0 >= L) return;  // uniform over the block
    const int hk = h / (H / Hkv);
    const int tid = threadIdx.x, sel = tid >> 7, wtid = tid & 127;
    const int warp = wtid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t qstride = (size_t)H * hd, kstride = (size_t)Hkv * hd;
    const int ntile = (min(L, q0 + BM) + BN - 1) / BN;
    if (tid == 0) {
        for (int i = 0; i < NST; i++) {
            mbar_init(&full[i], 128);        // the producer threads' cp.async arrivals
            mbar_init(&empty[i], 4 * NWG);   // one per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (sel == NWG) {  // the producer warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        const bf16 *kbase = k + (size_t)seq0 * kstride + (size_t)hk * hd;
        const bf16 *vbase = v + (size_t)seq0 * kstride + (size_t)hk * hd;
        for (int it = 0; it < ntile; it++) {
            const int st = it % NST, k0 = it * BN;
            if (it >= NST) mbar_wait(&empty[st], ((it / NST) - 1) & 1);
            unsigned char *Kt = KV + st * 2 * ABW_TILE_BYTES, *Vt = Kt + ABW_TILE_BYTES;
            abw_load_tile<128>(Kt, [&](int r) -> const bf16 * {
                return k0 + r < L ? kbase + (size_t)(k0 + r) * kstride : nullptr;
            }, wtid, q);
            abw_load_tile<128>(Vt, [&](int r) -> const bf16 * {
                return k0 + r < L ? vbase + (size_t)(k0 + r) * kstride : nullptr;
            }, wtid, q);
            mbar_arrive_cp_async(&full[st]);
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");  // exit with nothing in flight
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 152;\n" ::: "memory");
    const int qw0 = q0 + 64 * sel;  // this warpgroup's first query
    unsigned char *Qw = Qt + sel * ABW_TILE_BYTES;
    varlen_load_q(Qw, q, seq0, qw0, L, h, qstride, wtid, sel);

    float acc[16][4];  // O (m64n128 accumulator: n-tile i in acc[i])
#pragma unroll
    for (int i = 0; i < 16; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    const int qa = qw0 + warp * 16 + g;  // positions of this thread's rows g, g + 8

    for (int it = 0; it < ntile; it++) {
        const int st = it % NST, k0 = it * BN;
        mbar_wait(&full[st], (it / NST) & 1);
        if (qw0 < L && k0 <= qw0 + 63) {  // uniform over the warpgroup
            // cp.async wrote through the generic proxy; wgmma reads through the async one
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            const unsigned char *Kt = KV + st * 2 * ABW_TILE_BYTES, *Vt = Kt + ABW_TILE_BYTES;
            float sc[8][4];
            wg_fence();
            wg_tile_abt128(&sc[0][0], Qw, Kt);
            wg_commit();
            wg_wait<0>();
            abw_fence_acc(&sc[0][0], 32);
            const bool need_mask = k0 + BN - 1 > qw0 || k0 + BN > L;
            online_softmax_tile<BN, 128>(sc, mrow, lrow, acc, k0, qa, qa + 8, L, need_mask,
                                         scale_log2, t);
            uint32_t a[4][4];  // P as A fragments, keys 16kk .. 16kk + 15
#pragma unroll
            for (int kk = 0; kk < 4; kk++) c_to_a(a[kk], sc[2 * kk], sc[2 * kk + 1]);
            abw_fence_acc(&acc[0][0], 64);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                wg_m64n128k16_rs<1>(&acc[0][0], a[kk], wg_desc(Vt + kk * 256, 128, 1024));
            wg_commit();
            wg_wait<0>();
            abw_fence_acc(&acc[0][0], 64);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[st]);  // this warp no longer reads the stage
    }
    if (qw0 >= L) return;
    varlen_store_o(acc, lrow, [&](int r) -> bf16 * {
        int qr = qw0 + warp * 16 + r;
        return qr < L ? out + (size_t)(seq0 + qr) * qstride + (size_t)h * hd : nullptr;
    }, g, t);
#endif
}

#ifndef ABW_NO_WGMMA
// Variant 3's producer, one thread: K (or V) tile it (128 rows from key it * 128 of the
// sequence starting at row seq0, kv head hk) into stage it % NST of buf (32 KB stages: two
// panels of 64 columns) once the consumers released the stage's previous tile.
template <int NST>
__device__ __forceinline__ void fa3_load_stage(unsigned char *buf, uint64_t *full,
                                               uint64_t *empty, const CUtensorMap *tm, int it,
                                               int hk, int seq0) {
    constexpr int BYTES = 128 * 128 * 2;
    const int st = it % NST, row = seq0 + it * 128;
    if (it >= NST) mbar_wait(&empty[st], ((it / NST) - 1) & 1);
    mbar_arrive_expect_tx(&full[st], BYTES);
    tma_load_3d(buf + st * BYTES, tm, &full[st], 0, hk, row);
    tma_load_3d(buf + st * BYTES + BYTES / 2, tm, &full[st], 64, hk, row);
}

#endif

// Variant 3 (the default): FlashAttention-3's forward (Shah et al. 2024) on Hopper: TMA
// loads, 128-key tiles, two consumer warpgroups taking turns on the tensor cores. A thread
// block = 2 consumer warpgroups of 64 queries (128) and a producer warpgroup of which one
// thread issues the TMA copies: K and V each in NST stages of 128 rows x 128 columns (two
// 128-byte-swizzled panels of 64 columns, tensor maps of (T, Hkv, 128): abw_head_tensor_map),
// each with its own full (expect_tx) and empty (one arrival per consumer warp) mbarrier.
// Per consumer warpgroup and tile j >= 1, one turn (named barriers 3 and 4):
//   issue S_j = Q K_j^T        (8 x m64n128k16, A = Q (core-matrix tile), B = K, K-major)
//   issue O += P_{j-1} V_{j-1} (8 x m64n128k16, A = P in registers, B = V MN-major)
//   let the other warpgroup issue; wait; the online softmax of S_j; O *= its factor; P_j to
//   bf16 fragments; release K_j, V_{j-1}
// so that one warpgroup's softmax runs under the other's products (ptxas places the wait
// for P V before the softmax, so the overlap inside one warpgroup that FA3 also has does not
// happen here: SASS, 2026-12-04). Nothing is in flight at a loop's back edge or across a
// branch (ptxas would serialize the products, C7518): the tiles below the diagonal run
// unmasked in the loop, the diagonal tile (the last one, which also holds key L - 1) after it
// with the mask. A box's rows past the sequence's end are the next sequence's keys (or TMA's
// zeros past T): masked, and their V rows weigh 0. Both warpgroups run every tile of the
// block (one past the sequence's end computes rows it does not store), so the barrier
// counts and turns match. Shared memory: K, V NST x 32 KB each (1024-aligned), Q 2 x 16 KB.
// Registers: producer 40, consumers 232 (O 64, S 64, P 32 per thread).
template <int NST>
__global__ void __launch_bounds__(384, 1)
attn_varlen_fwd_fa3_kernel(bf16 *out, const bf16 *q, const int32_t *cu, int H, int Hkv,
                           float scale_log2, int ntiles,
                           const __grid_constant__ CUtensorMap tmk,
                           const __grid_constant__ CUtensorMap tmv) {
#ifdef ABW_NO_WGMMA
    __trap();
#else
    constexpr int NWG = 2, hd = 128, BM = 64 * NWG, BN = 128, KV_BYTES = BN * hd * 2;
    static_assert(BM == BN, "the tiles below the diagonal tile are unmasked only if BM == BN");
    extern __shared__ __align__(16) unsigned char smem_raw[];  // (1024-aligned: the swizzle)
    unsigned char *Ks = smem_raw, *Vs = Ks + NST * KV_BYTES;  // NST stages each
    unsigned char *Qt = Vs + NST * KV_BYTES;                 // NWG warpgroups x Q tile
    uint64_t *fullK = (uint64_t *)(Qt + NWG * ABW_TILE_BYTES), *emptyK = fullK + NST;
    uint64_t *fullV = emptyK + NST, *emptyV = fullV + NST;
    const int s = blockIdx.y, h = blockIdx.z;
    const int seq0 = cu[s], L = cu[s + 1] - seq0;
    const int q0 = (ntiles - 1 - (int)blockIdx.x) * BM;
    if (q0 >= L) return;  // uniform over the block
    const int hk = h / (H / Hkv);
    const int tid = threadIdx.x, sel = tid >> 7, wtid = tid & 127;
    const int warp = wtid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t qstride = (size_t)H * hd;
    const int ntile = (min(L, q0 + BM) + BN - 1) / BN;  // tile ntile - 1 holds the diagonal
    if (tid == 0) fa3_init<NST>(smem_raw, fullK, 4 * NWG);
    __syncthreads();
    if (sel == NWG) {  // the producer warpgroup: one thread issues the copies
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (wtid == 0)
            for (int it = 0; it < ntile; it++) {
                fa3_load_stage<NST>(Ks, fullK, emptyK, &tmk, it, hk, seq0);
                fa3_load_stage<NST>(Vs, fullV, emptyV, &tmv, it, hk, seq0);
            }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int qw0 = q0 + 64 * sel;  // this warpgroup's first query
    unsigned char *Qw = Qt + sel * ABW_TILE_BYTES;
    varlen_load_q(Qw, q, seq0, qw0, L, h, qstride, wtid, sel);

    float acc[16][4];  // O (m64n128 accumulator: n-tile i in acc[i])
    float sc[16][4];   // S_j, then P_j (f32)
    uint32_t pa[8][4];  // P_{j-1} as A fragments, keys 16kk .. 16kk + 15
#pragma unroll
    for (int i = 0; i < 16; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f}, al[2];
    const int qa = qw0 + warp * 16 + g;  // positions of this thread's rows g, g + 8
    auto issue_s = [&](int j) { fa3_issue_s(&sc[0][0], Qw, Ks + (j % NST) * KV_BYTES); };
    auto issue_pv = [&](int j) { fa3_issue_pv(&acc[0][0], pa, Vs + (j % NST) * KV_BYTES); };
    auto fence_pa = [&]() { fa3_fence_pa(pa); };
    auto to_a = [&]() { fa3_to_a(pa, sc); };
    auto wait_full = [&](uint64_t *bar, int j) { mbar_wait(&bar[j % NST], (j / NST) & 1); };
    auto release = [&](uint64_t *bar, int j) {
        __syncwarp();
        if (lane == 0) mbar_arrive(&bar[j % NST]);  // this warp no longer reads the stage
    };
    // Ping-pong: the warpgroups take turns to issue their products (named barriers 3
    // and 4: a warpgroup waits on its own, then lets the other one go), so that one's
    // softmax runs while the other's products are on the tensor cores.
    auto my_turn = [&]() { named_bar_sync(3 + sel, 256); };
    auto your_turn = [&]() { named_bar_arrive(4 - sel, 256); };
    if (sel == 1) your_turn();  // warpgroup 0 goes first
    // One tile j >= 1 (mask: std::true_type for the diagonal tile); nothing is left in flight.
    auto tile = [&](int j, auto mask) {
        wait_full(fullK, j);
        wait_full(fullV, j - 1);
        my_turn();
        abw_fence_acc(&acc[0][0], 64);
        wg_fence();
        issue_s(j);
        issue_pv(j - 1);
        your_turn();
        wg_wait<1>();
        abw_fence_acc(&sc[0][0], 64);
        online_softmax_p<BN, true>(sc, mrow, lrow, al, j * BN, qa, qa + 8, L,
                                   decltype(mask)::value, scale_log2, t);
        wg_wait<0>();
        abw_fence_acc(&acc[0][0], 64);
        fence_pa();
        rescale_rows<128>(acc, al);
        to_a();
        release(emptyK, j);
        release(emptyV, j - 1);
    };
    // tile 0: S_0 alone
    wait_full(fullK, 0);
    my_turn();
    wg_fence();
    issue_s(0);
    your_turn();
    wg_wait<0>();
    abw_fence_acc(&sc[0][0], 64);
    online_softmax_p<BN, true>(sc, mrow, lrow, al, 0, qa, qa + 8, L, ntile == 1, scale_log2, t);
    to_a();
    release(emptyK, 0);
    for (int j = 1; j + 1 < ntile; j++) tile(j, std::false_type());
    if (ntile > 1) tile(ntile - 1, std::true_type());
    // the last tile's P V
    wait_full(fullV, ntile - 1);
    my_turn();
    abw_fence_acc(&acc[0][0], 64);
    wg_fence();
    issue_pv(ntile - 1);
    your_turn();
    if (sel == 0) my_turn();  // warpgroup 1's last arrival (every barrier phase completes)
    wg_wait<0>();
    abw_fence_acc(&acc[0][0], 64);
    fence_pa();
    release(emptyV, ntile - 1);
    if (qw0 >= L) return;
    varlen_store_o(acc, lrow, [&](int r) -> bf16 * {
        int qr = qw0 + warp * 16 + r;
        return qr < L ? out + (size_t)(seq0 + qr) * qstride + (size_t)h * hd : nullptr;
    }, g, t);
#endif
}

// Whether the wgmma kernels (variants 2, 3) apply: head dim 128 on a compute capability 9.0
// device, 16-byte aligned q, k, v.
static bool varlen_wg_applies(const void *q, const void *k, const void *v, int hd) {
    return hd == 128 && abw_supported() && !((uintptr_t)q & 15) && !((uintptr_t)k & 15) &&
           !((uintptr_t)v & 15);
}

// Launches the warp-specialized kernel (variant 2) with NST K/V stages (3: 4 measured no
// faster); false (nothing launched) where it does not apply (varlen_wg_applies).
template <int NST>
static bool launch_varlen_ws(const ops_ctx_t *c, void *out, const void *q, const void *k,
                             const void *v, const int32_t *cu, int nseq, int max_seqlen, int H,
                             int Hkv, int hd) {
    if (!varlen_wg_applies(q, k, v, hd)) return false;
    const size_t smem = (size_t)(2 * NST + 3) * ABW_TILE_BYTES + 2 * NST * sizeof(uint64_t);
    auto kern = attn_varlen_fwd_ws_kernel<NST>;
    cuda_check(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int ntiles = (max_seqlen + 191) / 192;
    const float scale_log2 = (1.0f / sqrtf((float)hd)) * ATTN_LOG2E;
    kern<<<dim3(ntiles, nseq, H), 512, smem, cuda_stream(c)>>>(
        (bf16 *)out, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, cu, H, Hkv, scale_log2,
        ntiles);
    cuda_check_launch();
    return true;
}

// Launches variant 3 with NST K and NST V stages (2: 3 measured no faster); false (nothing
// launched) where it does not apply (varlen_wg_applies). T: rows of k and v (the tensor
// maps' extent; TMA reads zeros past it).
template <int NST>
static bool launch_varlen_fa3(const ops_ctx_t *c, void *out, const void *q, const void *k,
                              const void *v, const int32_t *cu, int nseq, int max_seqlen, int T,
                              int H, int Hkv, int hd) {
    if (!varlen_wg_applies(q, k, v, hd)) return false;
    const CUtensorMap tmk = abw_head_tensor_map(k, T, Hkv, 1, 128);
    const CUtensorMap tmv = abw_head_tensor_map(v, T, Hkv, 1, 128);
    const size_t smem = (size_t)NST * 2 * (128 * 128 * 2) + 2 * ABW_TILE_BYTES +
                        4 * NST * sizeof(uint64_t);
    auto kern = attn_varlen_fwd_fa3_kernel<NST>;
    cuda_check(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int ntiles = (max_seqlen + 127) / 128;
    const float scale_log2 = (1.0f / sqrtf((float)hd)) * ATTN_LOG2E;
    kern<<<dim3(ntiles, nseq, H), 384, smem, cuda_stream(c)>>>(
        (bf16 *)out, (const bf16 *)q, cu, H, Hkv, scale_log2, ntiles, tmk, tmv);
    cuda_check_launch();
    return true;
}

template <int HDP, int BN>
static void launch_varlen_mma(const ops_ctx_t *c, void *out, const void *q, const void *k,
                           const void *v, const int32_t *cu, int nseq, int max_seqlen, int H,
                           int Hkv, int hd) {
    constexpr int LD = HDP + 8;
    size_t smem = (size_t)(AV_BM + 4 * BN) * LD * sizeof(bf16);
    cuda_check(cudaFuncSetAttribute(attn_varlen_fwd_mma_kernel<HDP, BN>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int ntiles = (max_seqlen + AV_BM - 1) / AV_BM;
    int vec = hd % 8 == 0 && ((uintptr_t)q & 15) == 0 && ((uintptr_t)k & 15) == 0 &&
              ((uintptr_t)v & 15) == 0;
    float scale_log2 = (1.0f / sqrtf((float)hd)) * ATTN_LOG2E;
    dim3 grid(ntiles, nseq, H);
    attn_varlen_fwd_mma_kernel<HDP, BN><<<grid, 128, smem, cuda_stream(c)>>>(
        (bf16 *)out, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, cu, H, Hkv, hd,
        scale_log2, ntiles, vec);
    cuda_check_launch();
}

// variant: 1 = mma.sync (launch_varlen_mma), 2 = wgmma, warp-specialized (launch_varlen_ws),
// 3 = FA3-style with TMA (launch_varlen_fa3); 2 and 3 need head dim 128 on compute capability
// 9.0 (elsewhere variant 1 runs); 0 = the default.
extern "C" void ops_cuda_attention_varlen_forward_variant(const ops_ctx_t *c, int variant,
                                                          void *out, const void *q, const void *k,
                                                          const void *v, const int32_t *cu,
                                                          int nseq, int max_seqlen, int T, int H,
                                                          int Hkv, int hd) {
    if (variant < 0 || variant > OPS_CUDA_ATTN_VARLEN_VARIANTS) {
        fprintf(stderr,
                "ops cuda attention_varlen_forward: kernel variant %d is not one of 0..%d\n",
                variant, OPS_CUDA_ATTN_VARLEN_VARIANTS);
        abort();
    }
    if (nseq <= 0 || max_seqlen <= 0 || H <= 0) return;
    if (variant == 0) variant = ATTN_VARLEN_DEFAULT_VARIANT;
    if (variant == 2 && launch_varlen_ws<3>(c, out, q, k, v, cu, nseq, max_seqlen, H, Hkv, hd))
        return;
    if (variant == 3 &&
        launch_varlen_fa3<2>(c, out, q, k, v, cu, nseq, max_seqlen, T, H, Hkv, hd))
        return;
    switch (attn_hdp(hd)) {
    case 32: launch_varlen_mma<32, 64>(c, out, q, k, v, cu, nseq, max_seqlen, H, Hkv, hd); break;
    case 64: launch_varlen_mma<64, 64>(c, out, q, k, v, cu, nseq, max_seqlen, H, Hkv, hd); break;
    case 96: launch_varlen_mma<96, 64>(c, out, q, k, v, cu, nseq, max_seqlen, H, Hkv, hd); break;
    case 128: launch_varlen_mma<128, 64>(c, out, q, k, v, cu, nseq, max_seqlen, H, Hkv, hd); break;
    default:
        fprintf(stderr, "ops cuda attention_varlen_forward: head dim %d > 128 not supported\n", hd);
        abort();
    }
}

// Kernel of the ops table's attention_varlen_forward (ops_cuda_attention_varlen_variant).
static int g_av_variant = ATTN_VARLEN_DEFAULT_VARIANT;

extern "C" int ops_cuda_attention_varlen_variant(int variant) {
    int old = g_av_variant;
    if (variant >= 0 && variant <= OPS_CUDA_ATTN_VARLEN_VARIANTS)
        g_av_variant = variant == 0 ? ATTN_VARLEN_DEFAULT_VARIANT : variant;
    return old;
}

extern "C" int ops_cuda_attention_varlen_resolve(int variant, int hd) {
    if (variant < 0 || variant > OPS_CUDA_ATTN_VARLEN_VARIANTS) return -1;
    if (variant == 0) variant = ATTN_VARLEN_DEFAULT_VARIANT;
    return variant >= 2 && (hd != 128 || !abw_supported()) ? 1 : variant;
}

void cuda_attention_varlen_forward(const ops_ctx_t *c, void *out, const void *q, const void *k,
                                   const void *v, const int32_t *cu_seqlens, int nseq,
                                   int max_seqlen, int T, int H, int Hkv, int hd) {
    ops_cuda_attention_varlen_forward_variant(c, g_av_variant, out, q, k, v, cu_seqlens, nseq,
                                              max_seqlen, T, H, Hkv, hd);
}
