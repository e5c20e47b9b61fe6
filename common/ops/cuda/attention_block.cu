// DFlash block attention (arXiv 2602.06036) forward and backward on CUDA,
// FlashAttention-2 style (Dao 2023) with bf16 tensor cores (mma.sync m16n8k16)
// and f32 accumulation. Semantics: ops.h attention_block_*.
//
// Key index space of block j (as the CPU reference): u in [0, ctx_len[j]) ->
// context row ctx_start[j] + u, u in [ctx_len[j], ctx_len[j] + B) -> the block's
// own row j*B + (u - ctx_len[j]). No mask inside that range (bidirectional).
//
// Four kernel variants (ops_cuda_attention_block_variant):
//   variant 1, any head dim <= 128, any GPU: forward and dQ on the mma.sync "pair" kernel
//     (attention_block_pair.cuh: a thread block = two consecutive blocks of one kv head,
//     sharing each K/V tile), dK/dV on attn_block_dkv_kernel below;
//   variant 2, Hopper (sm_90a), head dim 128 (forward / dQ also H = 4 Hkv,
//     B <= 16, Tc > 0): forward, dQ and the dK/dV context tiles on warp-specialized wgmma
//     kernels with TMA loads (attention_block_wg.cuh; every kc, vc row below Tc must be
//     finite; the context tiles by descending work), the blocks' own
//     dK/dV on attn_block_own_dkv_kernel (B <= 16, any head dim and GPU: one warp per block
//     and kv head; bitwise variant 1's own tiles); elsewhere variant 1's kernels run;
//   variant 3: variant 2 with the forward on attn_block_fwd_fa3_kernel
//     (attention_block_wg.cuh: 128-key tiles, all loads by TMA, the two warpgroups taking
//     turns as the causal variant 3), where variant 2's forward applies;
//   variant 4 (the default): variant 3 with dQ's S = Q K^T and dP = dO V^T reading Q and dO
//     from registers (each warp's rows as A fragments), not from shared memory.
// On an H200, 8 x 4096 tokens, 512 anchors, B 16 (bench_ops): forward 10.0 / 5.8 / 5.5 ms
// for variants 1 / 2 / 3-4, dQ 12.3 / 6.9 ms for 1 / 2-3, dK/dV 30.7 / 10.1 ms for 1 / 2-4;
// dQ at ncu's base clocks 8.81 ms in variant 3, 7.60 in 4 (the same call; 7.28-7.48 against
// 6.51 in bench_ops) (2026-12-04; bench/NOTES.md;
// in its entries before 2026-12-03's third session, 1 was "variant 2" and 2 "variant 11";
// variants 1 and 3-10 there were kernels measured slower, since removed).
//
// Forward: online softmax over 64-key tiles staged in shared memory (shared by the
// group's heads and the pair's two blocks); lse (natural log) saved.
//
// Backward, deterministic, no atomics (a row-dot pre-pass, then dQ, then dK/dV):
//   D[i] = rowsum(dO_i * O_i)                                  (attn_block_dot)
//   dQ: query-major, the forward's kernel and grid: recompute P = exp(S - lse),
//       dP = dO V^T, dS = P (dP - D), dQ = scale dS K over every visible key.
//   dK, dV: key-major. One thread block per key tile of the context (per kv head; 64
//       keys in variant 1, 128 in variant 2) or of a block's own rows (64; in variant 2
//       with B <= 16 one warp per block and kv head instead); each warp owns 16 keys and
//       accumulates
//       dV = P^T dO and dK = scale dS^T Q in registers over every block (and
//       every query head of the group) that sees its keys, found by scanning
//       ctx_start/ctx_len. A context row seen by many blocks is thus summed by a
//       single owner in a fixed order: no fp32 atomics, reproducible bits. The
//       price is recomputing S and dP once more than an atomic dQ scheme
//       (7 instead of 5 tile products).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/ops/cuda/attention_common.cuh"
extern "C" {
#include "common/ops/cuda/ops_cuda.h"
}

// Kernel variant used by the ops table (ops_cuda_attention_block_variant): 4, measured
// fastest (above: its forward 11% faster than 2's, its dQ 14% faster than 3's at fixed
// clocks); it runs variant 1's
// kernels where the wgmma kernels do not apply (the own-key kernel excepted: B <= 16 on any
// GPU and head dim).
#define AB_DEFAULT_VARIANT 4

// ------------------------------------------------------------------ forward / dQ
// Forward write-out of an active warp: sums lrow over the quad, writes lse[row*H + h]
// (natural log, f32; skipped when lse is NULL) and out = acc / l (bf16 rows of stride
// qstride; skipped when out is NULL). qrow_index(r): global query row of fragment row r,
// or -1. (The dQ write-out stays in the kernel: as a helper it changed the codegen.)
template <int HDP, typename QRowFn>
__device__ __forceinline__ void ab_q_write_fwd(bf16 *out, float *lse, float (*acc)[4],
                                               const float *mrow, float *lrow, QRowFn qrow_index,
                                               int H, int h, int hd, size_t qstride, int g, int t) {
    lrow[0] += __shfl_xor_sync(0xffffffffu, lrow[0], 1);
    lrow[0] += __shfl_xor_sync(0xffffffffu, lrow[0], 2);
    lrow[1] += __shfl_xor_sync(0xffffffffu, lrow[1], 1);
    lrow[1] += __shfl_xor_sync(0xffffffffu, lrow[1], 2);
    if (lse && t == 0) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            long row = qrow_index(g + 8 * i);
            if (row >= 0) lse[row * H + h] = (mrow[i] + log2f(lrow[i])) * ATTN_LN2;
        }
    }
    if (out) {
        float inv0 = lrow[0] > 0.0f ? 1.0f / lrow[0] : 0.0f;
        float inv1 = lrow[1] > 0.0f ? 1.0f / lrow[1] : 0.0f;
        store_rows<HDP>(acc, inv0, inv1, [&](int r) -> bf16 * {
            long row = qrow_index(r);
            return row >= 0 ? out + row * qstride + (size_t)h * hd : nullptr;
        }, hd, g, t);
    }
}

// D[row*H + h] = sum_d dout * out (f32); one warp per (row, head).
__global__ void attn_block_dot_kernel(float *D, const bf16 *dout, const bf16 *out, long rows,
                                      int hd) {
    long w = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= rows) return;
    const bf16 *a = dout + w * hd, *b = out + w * hd;
    float s = 0.0f;
    for (int i = lane; i < hd; i += 32) s += __bfloat162float(a[i]) * __bfloat162float(b[i]);
    s = warp_sum(s);
    if (lane == 0) D[w] = s;
}

// ------------------------------------------------------------------ dK, dV (key-major)
// blockIdx.x < nct: context tile (keys ct*64 .. ct*64+63 of kc/vc); else own tile
// (block j = (x - nct) / nbt, keys of its own rows starting at ((x - nct) % nbt)*64).
// Work items: (listed block j, 16-query chunk qc, batch of up to AB_GH query
// heads of the group); each item's Q, dO, lse and D are staged in shared memory,
// double-buffered (the next item is fetched while the current one is used).
#define AB_GH 4
// The blocks that see any key of this tile, for blocks ch*KW*32 .. ch*KW*32 + KW*32-1
// (context tile, keys key0 .. key0 + KW*16-1 as context rows) or just own_j (own tile):
// written to list[KW*32] in ascending block order, via the per-warp counts wcount[KW]
// (both shared); returns how many. All KW*32 threads of the block must call it (it holds
// barriers).
template <int KW>
__device__ __forceinline__ int ab_dkv_list(int *list, int *wcount, const int32_t *ctx_start,
                                           const int32_t *ctx_len, bool is_ctx, int ch, int Nb,
                                           int key0, int own_j, int tid, int warp, int lane) {
    int n_list;
    if (is_ctx) {
        int jj = ch * KW * 32 + tid;
        bool f = false;
        if (jj < Nb) {
            int cs = ctx_start[jj], cl = ctx_len[jj];
            f = cl > 0 && cs < key0 + KW * 16 && cs + cl > key0;
        }
        unsigned m = __ballot_sync(0xffffffffu, f);
        __syncthreads();  // list/wcount of the previous chunk fully consumed
        if (lane == 0) wcount[warp] = __popc(m);
        __syncthreads();
        int off = 0;
        for (int w = 0; w < warp; w++) off += wcount[w];
        if (f) list[off + __popc(m & ((1u << lane) - 1u))] = jj;
        n_list = 0;
#pragma unroll
        for (int w = 0; w < KW; w++) n_list += wcount[w];
        __syncthreads();
    } else {
        n_list = 1;
        if (tid == 0) list[0] = own_j;
        __syncthreads();
    }
    return n_list;
}

// One work item for a warp's 16 keys (rows wk0.. of the K/V tiles Ks, Vs: KW*16 x LD
// shared): for each query head hl of head batch hb (hb*AB_GH + hl < group), with the
// item's staged Q rows Qb, dO rows Ob (AB_GH*16 x LD shared) and lse (log2 units) Lb,
// D Db (AB_GH*16 f32 shared), accumulates dV dv[HDP/8][4] += P^T dO and
// dK dk[HDP/8][4] += dS^T Q (unscaled; the caller multiplies by scale).
// ka / kb_ok: whether keys g / g+8 of the warp are visible to the item's block.
// The S^T and dP^T products of all AB_GH heads of the batch are done together: the
// warp's K and V fragments are read from shared memory once per 16 columns of the head
// dim instead of once per head, at the price of holding the AB_GH heads' scores in
// registers.
template <int HDP>
__device__ __forceinline__ void ab_dkv_item(float (*dk)[4], float (*dv)[4], const bf16 *Ks,
                                            const bf16 *Vs, const bf16 *Qb, const bf16 *Ob,
                                            const float *Lb, const float *Db, int hb, int group,
                                            int wk0, bool ka, bool kb_ok, float scale_log2,
                                            int lane, int t) {
    constexpr int LD = HDP + 8;
    const int nh = min(AB_GH, group - hb * AB_GH);  // heads of this batch (uniform)
    float s[AB_GH][2][4], p[AB_GH][2][4];
#pragma unroll
    for (int hl = 0; hl < AB_GH; hl++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[hl][0][e] = s[hl][1][e] = p[hl][0][e] = p[hl][1][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HDP / 16; kk++) {
        uint32_t ak[4], av[4];
        ldsm_a<LD>(ak, Ks, wk0, kk * 16, lane);
        ldsm_a<LD>(av, Vs, wk0, kk * 16, lane);
#pragma unroll
        for (int hl = 0; hl < AB_GH; hl++) {
            if (hl >= nh) continue;
            uint32_t b0[2], b1[2];
            ldsm_b_nk<LD>(b0, b1, Qb + hl * 16 * LD, 0, kk * 16, lane);
            mma_bf16_16816(s[hl][0], ak, b0);
            mma_bf16_16816(s[hl][1], ak, b1);
            ldsm_b_nk<LD>(b0, b1, Ob + hl * 16 * LD, 0, kk * 16, lane);
            mma_bf16_16816(p[hl][0], av, b0);
            mma_bf16_16816(p[hl][1], av, b1);
        }
    }
#pragma unroll
    for (int hl = 0; hl < AB_GH; hl++) {
        if (hl >= nh) continue;
        const bf16 *Qh = Qb + hl * 16 * LD, *Oh = Ob + hl * 16 * LD;
        const float *Lh = Lb + hl * 16, *Dh = Db + hl * 16;
#pragma unroll
        for (int e = 0; e < 4; e++) {  // P^T and dS^T of head hl
            int qi0 = 2 * t + (e & 1), qi1 = 8 + qi0;
            bool kv = e < 2 ? ka : kb_ok;
            float pa = kv ? exp2f(s[hl][0][e] * scale_log2 - Lh[qi0]) : 0.0f;
            float pb = kv ? exp2f(s[hl][1][e] * scale_log2 - Lh[qi1]) : 0.0f;
            s[hl][0][e] = pa;
            s[hl][1][e] = pb;
            p[hl][0][e] = pa * (p[hl][0][e] - Dh[qi0]);
            p[hl][1][e] = pb * (p[hl][1][e] - Dh[qi1]);
        }
        uint32_t ap[4], ads[4];
        c_to_a(ap, s[hl][0], s[hl][1]);
        c_to_a(ads, p[hl][0], p[hl][1]);
#pragma unroll
        for (int nt = 0; nt < HDP / 8; nt += 2) {
            uint32_t b0[2], b1[2];
            ldsm_b_kn<LD>(b0, b1, Oh, 0, nt * 8, lane);
            mma_bf16_16816(dv[nt], ap, b0);
            mma_bf16_16816(dv[nt + 1], ap, b1);
            ldsm_b_kn<LD>(b0, b1, Qh, 0, nt * 8, lane);
            mma_bf16_16816(dk[nt], ads, b0);
            mma_bf16_16816(dk[nt + 1], ads, b1);
        }
    }
}

template <int HDP, int KW>
__global__ void __launch_bounds__(KW * 32)
attn_block_dkv_kernel(bf16 *dkb, bf16 *dvb, bf16 *dkc, bf16 *dvc, const bf16 *dout,
                      const float *lse_in, const float *Dvec, const bf16 *q, const bf16 *kb,
                      const bf16 *vb, const bf16 *kc, const bf16 *vc, const int32_t *ctx_start,
                      const int32_t *ctx_len, int Nb, int B, int Tc, int H, int Hkv, int hd,
                      float scale, int nct, int nbt, int x0, int vec) {
    constexpr int LD = HDP + 8, KT = KW * 16;  // KT keys per tile, 16 per warp
    constexpr int QROWS = AB_GH * 16;
    constexpr int STAGE_ELEMS = 2 * QROWS * LD + 2 * QROWS * 2;  // Q, dO (bf16) + lse, D (f32)
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Ks = (bf16 *)smem_raw, *Vs = Ks + KT * LD;
    bf16 *stage_base = Vs + KT * LD;
    int *list = (int *)(stage_base + 2 * STAGE_ELEMS);  // KW*32 block indices
    int *wcount = list + KW * 32;                       // KW warp counts
    const int hk = blockIdx.y, group = H / Hkv, nqc = (B + 15) / 16;
    const int nhb = (group + AB_GH - 1) / AB_GH;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t qstride = (size_t)H * hd, kstride = (size_t)Hkv * hd;
    const float scale_log2 = scale * ATTN_LOG2E;
    const int bx = (int)blockIdx.x + x0;
    const bool is_ctx = bx < nct;
    int key0, own_j = -1;  // first key: context row, or own-block offset
    if (is_ctx) {
        key0 = bx * KT;
    } else {
        int x = bx - nct;
        own_j = x / nbt;
        key0 = (x % nbt) * KT;
    }
    auto kvrow = [&](const bf16 *xc, const bf16 *xb, int r) -> const bf16 * {
        int kk = key0 + r;
        if (is_ctx) return kk < Tc ? xc + (size_t)kk * kstride + (size_t)hk * hd : nullptr;
        return kk < B ? xb + ((size_t)own_j * B + kk) * kstride + (size_t)hk * hd : nullptr;
    };
    load_rows_async<HDP, KT>(Ks, [&](int r) { return kvrow(kc, kb, r); }, hd, vec, tid,
                             blockDim.x, q);
    load_rows_async<HDP, KT>(Vs, [&](int r) { return kvrow(vc, vb, r); }, hd, vec, tid,
                             blockDim.x, q);
    cp_async_commit();

    float dk[HDP / 8][4], dv[HDP / 8][4];
#pragma unroll
    for (int i = 0; i < HDP / 8; i++) {
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
        dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
    }
    const int wk0 = warp * 16;  // this warp's keys within the tile
    const int my_key_a = key0 + wk0 + g, my_key_b = my_key_a + 8;

    // stage layout: Q rows (QROWS x LD), dO rows, lse (QROWS f32), D (QROWS f32)
    auto stQ = [&](int st) { return stage_base + st * STAGE_ELEMS; };
    auto stO = [&](int st) { return stage_base + st * STAGE_ELEMS + QROWS * LD; };
    auto stL = [&](int st) { return (float *)(stage_base + st * STAGE_ELEMS + 2 * QROWS * LD); };
    auto stD = [&](int st) { return stL(st) + QROWS; };
    auto issue = [&](int item, int st) {
        int li = item / (nqc * nhb), rem = item % (nqc * nhb);
        int qc = rem / nhb, hb = rem % nhb;
        int j = list[li];
        auto qrow = [&](int r, int *hh) -> long {  // r in [0, QROWS): head batch slot r/16
            int hl = r >> 4, rr = qc * 16 + (r & 15), hgi = hb * AB_GH + hl;
            *hh = hk * group + hgi;
            return (rr < B && hgi < group) ? (long)j * B + rr : -1;
        };
        load_rows_async<HDP, QROWS>(stQ(st), [&](int r) -> const bf16 * {
            int h;
            long row = qrow(r, &h);
            return row >= 0 ? q + row * qstride + (size_t)h * hd : nullptr;
        }, hd, vec, tid, blockDim.x, q);
        load_rows_async<HDP, QROWS>(stO(st), [&](int r) -> const bf16 * {
            int h;
            long row = qrow(r, &h);
            return row >= 0 ? dout + row * qstride + (size_t)h * hd : nullptr;
        }, hd, vec, tid, blockDim.x, q);
        for (int r = tid; r < QROWS; r += blockDim.x) {
            int h;
            long row = qrow(r, &h);
            stL(st)[r] = row >= 0 ? lse_in[row * H + h] * ATTN_LOG2E : INFINITY;
            stD(st)[r] = row >= 0 ? Dvec[row * H + h] : 0.0f;
        }
    };

    const int nchunks = is_ctx ? (Nb + KW * 32 - 1) / (KW * 32) : 1;
    for (int ch = 0; ch < nchunks; ch++) {
        // ---- the blocks that see any key of this tile
        const int n_list = ab_dkv_list<KW>(list, wcount, ctx_start, ctx_len, is_ctx, ch, Nb, key0,
                                       own_j, tid, warp, lane);
        const int n_items = n_list * nqc * nhb;
        if (n_items > 0) {
            issue(0, 0);
            cp_async_commit();
        }
        for (int it = 0; it < n_items; it++) {
            if (it + 1 < n_items) {
                issue(it + 1, (it + 1) & 1);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const int st = it & 1;
            const int li = it / (nqc * nhb), hb = (it % (nqc * nhb)) % nhb;
            const int j = list[li];
            int vlo, vhi;  // this block's visible keys, in this tile's key numbering
            if (is_ctx) {
                vlo = ctx_start[j];
                vhi = vlo + ctx_len[j];
                if (vhi > Tc) vhi = Tc;
            } else {
                vlo = 0;
                vhi = B;
            }
            const bool ka = my_key_a >= vlo && my_key_a < vhi;
            const bool kb_ok = my_key_b >= vlo && my_key_b < vhi;
            if (__any_sync(0xffffffffu, ka || kb_ok)) {
                const bf16 *Qb = stQ(st), *Ob = stO(st);
                const float *Lb = stL(st), *Db = stD(st);
                ab_dkv_item<HDP>(dk, dv, Ks, Vs, Qb, Ob, Lb, Db, hb, group, wk0, ka, kb_ok,
                                 scale_log2, lane, t);
            }
            __syncthreads();  // this stage is refilled two items on
        }
    }
    cp_async_wait<0>();  // (tiles seen by no block: the K/V group is still drained)
    // write (assigned): rows with no visible block get zeros
    auto dst = [&](bf16 *xc, bf16 *xb, int r) -> bf16 * {
        int kk = key0 + wk0 + r;
        if (is_ctx) return (xc && kk < Tc) ? xc + (size_t)kk * kstride + (size_t)hk * hd : nullptr;
        return (xb && kk < B) ? xb + ((size_t)own_j * B + kk) * kstride + (size_t)hk * hd : nullptr;
    };
    store_rows<HDP>(dk, scale, scale, [&](int r) { return dst(dkc, dkb, r); }, hd, g, t);
    store_rows<HDP>(dv, 1.0f, 1.0f, [&](int r) { return dst(dvc, dvb, r); }, hd, g, t);
}

// The blocks' own dK/dV for B <= 16 (variant 2; variant 1 serves them as own tiles of
// attn_block_dkv_kernel, 64 keys and 4 warps for B keys). One warp per (block j, kv head
// hk), AB_OWN_WARPS to a thread block, each on its own: it stages its B own K, V rows (16
// x LD) once, then each head of the group in turn (its B query rows of Q and dO, lse, D),
// double-buffered by cp.async, and accumulates dV += P^T dO, dK += dS^T Q with
// ab_dkv_item. The sums run over the same heads in the same order with the same
// fragments as attn_block_dkv_kernel's own tiles: the same bits (gpu_test_ops_cuda).
// Shared memory: AB_OWN_WARPS x (2 + 2 x 2) x 16 x LD bf16 + the lse, D rows.
#define AB_OWN_WARPS 4
template <int HDP>
__device__ __host__ constexpr int ab_own_warp_elems() {
    return 2 * 16 * (HDP + 8) + 2 * (2 * 16 * (HDP + 8) + 2 * 16 * 2);
}

template <int HDP>
__global__ void __launch_bounds__(AB_OWN_WARPS * 32)
attn_block_own_dkv_kernel(bf16 *dkb, bf16 *dvb, const bf16 *dout, const float *lse_in,
                          const float *Dvec, const bf16 *q, const bf16 *kb, const bf16 *vb,
                          int Nb, int B, int H, int Hkv, int hd, float scale, int vec) {
    constexpr int LD = HDP + 8, TILE = 16 * LD, STAGE = 2 * TILE + 2 * 16 * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const long item = (long)blockIdx.x * AB_OWN_WARPS + warp;  // kv head fastest
    if (item >= (long)Nb * Hkv) return;                        // uniform over the warp
    const int j = (int)(item / Hkv), hk = (int)(item % Hkv), group = H / Hkv;
    bf16 *Ks = (bf16 *)smem_raw + (size_t)warp * ab_own_warp_elems<HDP>(), *Vs = Ks + TILE;
    bf16 *stage_base = Vs + TILE;
    auto stQ = [&](int st) { return stage_base + st * STAGE; };
    auto stO = [&](int st) { return stage_base + st * STAGE + TILE; };
    auto stL = [&](int st) { return (float *)(stage_base + st * STAGE + 2 * TILE); };
    auto stD = [&](int st) { return stL(st) + 16; };
    const size_t qstride = (size_t)H * hd, kstride = (size_t)Hkv * hd;
    auto kv_off = [&](int r) { return ((size_t)j * B + r) * kstride + (size_t)hk * hd; };
    auto own = [&](const bf16 *x, int r) -> const bf16 * {  // row r < B of block j, kv head hk
        return r < B ? x + kv_off(r) : nullptr;
    };
    load_rows_async<HDP, 16>(Ks, [&](int r) { return own(kb, r); }, hd, vec, lane, 32, q);
    load_rows_async<HDP, 16>(Vs, [&](int r) { return own(vb, r); }, hd, vec, lane, 32, q);
    auto issue = [&](int hl, int st) {  // head hk * group + hl's B query rows into stage st
        const int h = hk * group + hl;
        auto qrow = [&](const bf16 *x, int r) -> const bf16 * {
            return r < B ? x + ((size_t)j * B + r) * qstride + (size_t)h * hd : nullptr;
        };
        load_rows_async<HDP, 16>(stQ(st), [&](int r) { return qrow(q, r); }, hd, vec, lane, 32,
                                 q);
        load_rows_async<HDP, 16>(stO(st), [&](int r) { return qrow(dout, r); }, hd, vec, lane,
                                 32, q);
        if (lane < 16) {
            long row = (long)j * B + lane;
            stL(st)[lane] = lane < B ? lse_in[row * H + h] * ATTN_LOG2E : INFINITY;
            stD(st)[lane] = lane < B ? Dvec[row * H + h] : 0.0f;
        }
    };
    issue(0, 0);
    cp_async_commit();  // K, V and the first head
    float dk[HDP / 8][4], dv[HDP / 8][4];
#pragma unroll
    for (int i = 0; i < HDP / 8; i++) {
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
        dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
    }
    const float scale_log2 = scale * ATTN_LOG2E;
    const bool ka = g < B, kb_ok = g + 8 < B;  // keys g, g + 8 of the block
    for (int hl = 0; hl < group; hl++) {
        if (hl + 1 < group) {
            issue(hl + 1, (hl + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncwarp();  // every lane's copies and lse, D stores of this stage are in
        const int st = hl & 1;
        ab_dkv_item<HDP>(dk, dv, Ks, Vs, stQ(st), stO(st), stL(st), stD(st), 0, 1, 0, ka, kb_ok,
                         scale_log2, lane, t);
        __syncwarp();  // this stage is read before the next issue refills it
    }
    auto dst = [&](bf16 *x, int r) -> bf16 * { return (x && r < B) ? x + kv_off(r) : nullptr; };
    store_rows<HDP>(dk, scale, scale, [&](int r) { return dst(dkb, r); }, hd, g, t);
    store_rows<HDP>(dv, 1.0f, 1.0f, [&](int r) { return dst(dvb, r); }, hd, g, t);
}

#include "common/ops/cuda/attention_block_pair.cuh"
#include "common/ops/cuda/attention_block_wg.cuh"

// ------------------------------------------------------------------ launchers
static int vec_ok(int hd, const void *a, const void *b, const void *c2, const void *d,
                  const void *e) {
    uintptr_t m = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c2 | (uintptr_t)d | (uintptr_t)e;
    return hd % 8 == 0 && (m & 15) == 0;
}

// dK/dV tiles x0 .. x1 - 1 of attn_block_dkv_kernel (context tiles first, then each block's
// own tiles; KW warps = KW * 16 keys per tile). Variant 2 runs it for the context tiles
// where the wgmma kernel does not apply and for the own tiles where B > 16 (launch_dkv).
template <int HDP, int KW>
static void launch_dkv_range(const ops_ctx_t *c, bf16 *dkb, bf16 *dvb, bf16 *dkc, bf16 *dvc,
                             const bf16 *dout, const float *lse, const float *D, const void *q,
                             const void *kb, const void *vb, const void *kc, const void *vc,
                             const int32_t *cs, const int32_t *cl, int Nb, int B, int Tc, int H,
                             int Hkv, int hd, long x0, long x1) {
    constexpr int LD = HDP + 8, KT = KW * 16;
    constexpr int QROWS = AB_GH * 16;
    if (x1 <= x0) return;
    size_t smem = ((size_t)2 * KT * LD + 2 * (2 * QROWS * LD + 2 * QROWS * 2)) * sizeof(bf16) +
                  (KW * 32 + KW) * sizeof(int);
    cuda_check(cudaFuncSetAttribute(attn_block_dkv_kernel<HDP, KW>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int nct = (Tc + KT - 1) / KT, nbt = (B + KT - 1) / KT;
    dim3 grid((unsigned)(x1 - x0), Hkv);
    int vec = vec_ok(hd, q, kb, vb, kc, vc) && ((uintptr_t)dout & 15) == 0;
    attn_block_dkv_kernel<HDP, KW><<<grid, KW * 32, smem, cuda_stream(c)>>>(
        dkb, dvb, dkc, dvc, dout, lse, D, (const bf16 *)q, (const bf16 *)kb, (const bf16 *)vb,
        (const bf16 *)kc, (const bf16 *)vc, cs, cl, Nb, B, Tc, H, Hkv, hd,
        1.0f / sqrtf((float)hd), nct, nbt, (int)x0, vec);
    cuda_check_launch();
}

// The blocks' own dK/dV, B <= 16 (attn_block_own_dkv_kernel).
template <int HDP>
static void launch_dkv_own(const ops_ctx_t *c, bf16 *dkb, bf16 *dvb, const bf16 *dout,
                           const float *lse, const float *D, const void *q, const void *kb,
                           const void *vb, int Nb, int B, int H, int Hkv, int hd, int vec) {
    size_t smem = (size_t)AB_OWN_WARPS * ab_own_warp_elems<HDP>() * sizeof(bf16);
    cuda_check(cudaFuncSetAttribute(attn_block_own_dkv_kernel<HDP>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    long items = (long)Nb * Hkv;
    attn_block_own_dkv_kernel<HDP><<<(unsigned)((items + AB_OWN_WARPS - 1) / AB_OWN_WARPS),
                                     AB_OWN_WARPS * 32, smem, cuda_stream(c)>>>(
        dkb, dvb, dout, lse, D, (const bf16 *)q, (const bf16 *)kb, (const bf16 *)vb, Nb, B, H,
        Hkv, hd, 1.0f / sqrtf((float)hd), vec);
    cuda_check_launch();
}

// The warp-specialized dK/dV context tiles (variant 2; attention_block_wg.cuh): two
// consumer warpgroups of 64 keys and a producer warpgroup per thread block, NST stages.
// tile_scratch: 2 * ((Tc + 127) / 128) ints of device memory (the tile order).
template <int NST>
static void launch_dkv_ws(const ops_ctx_t *c, bf16 *dkc, bf16 *dvc, const bf16 *dout,
                          const float *lse, const float *D, const void *q, const void *kc,
                          const void *vc, const int32_t *cs, const int32_t *cl, int Nb, int B,
                          int Tc, int H, int Hkv, int *tile_scratch) {
    size_t smem = 2 * 2 * ABW_TILE_BYTES + NST * (size_t)ABW_DKV_STAGE_BYTES +
                  2 * NST * sizeof(uint64_t) + (128 + 4) * sizeof(int);
    cuda_check(cudaFuncSetAttribute(attn_block_dkv_ws_kernel<NST>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    long nct = (Tc + 127) / 128;
    if (nct <= 0) return;
    int *cnt = tile_scratch, *order = tile_scratch + nct;
    abw_tile_count_kernel<<<(unsigned)nct, ABW_CNT_THREADS, 0, cuda_stream(c)>>>(cnt, cs, cl, Nb);
    cuda_check_launch();
    abw_tile_rank_kernel<<<(unsigned)((nct + 255) / 256), 256, 0, cuda_stream(c)>>>(order, cnt,
                                                                                   (int)nct);
    cuda_check_launch();
    const CUtensorMap tmq = abw_head_tensor_map(q, Nb * B, H, AB_GH, 16);
    const CUtensorMap tmo = abw_head_tensor_map(dout, Nb * B, H, AB_GH, 16);
    attn_block_dkv_ws_kernel<NST><<<(unsigned)(nct * Hkv), 384, smem, cuda_stream(c)>>>(
        dkc, dvc, lse, D, (const bf16 *)q, (const bf16 *)kc, (const bf16 *)vc, cs, cl, Nb, B,
        Tc, H, Hkv, 1.0f / sqrtf((float)128), order, tmq, tmo);
    cuda_check_launch();
}

// Whether the Hopper kernels (variant 2; attention_block_wg.cuh) apply: head dim 128 on a
// compute capability 9.0 device, 16-byte aligned rows (dout: backward only).
static bool ab_wg_applies(int hd, const void *q, const void *kb, const void *vb, const void *kc,
                          const void *vc, const void *dout) {
    return hd == 128 && abw_supported() && vec_ok(hd, q, kb, vb, kc, vc) &&
           ((uintptr_t)dout & 15) == 0;
}

// dK/dV. Variant 2: the context tiles on the warp-specialized wgmma kernel (where it
// applies; else on the mma.sync kernel), the blocks' own keys on attn_block_own_dkv_kernel
// (B <= 16; else as own tiles of the mma.sync kernel). Variant 1: every tile on the
// mma.sync kernel (64 keys, 4 warps). tile_scratch: 2 * ((Tc + 127) / 128) ints.
template <int HDP>
static void launch_dkv(const ops_ctx_t *c, int variant, bf16 *dkb, bf16 *dvb, bf16 *dkc,
                       bf16 *dvc, const bf16 *dout, const float *lse, const float *D,
                       const void *q, const void *kb, const void *vb, const void *kc,
                       const void *vc, const int32_t *cs, const int32_t *cl, int Nb, int B,
                       int Tc, int H, int Hkv, int hd, int *tile_scratch) {
    long nct4 = (Tc + 63) / 64, nbt4 = (B + 63) / 64, all4 = nct4 + (long)Nb * nbt4;
    const bool ctx = dkc || dvc, own = dkb || dvb;  // what is asked for: nothing else runs
    const bool own_kernel = variant >= 2 && B <= 16;
    const bool ws = variant >= 2 && HDP == 128 && ab_wg_applies(hd, q, kb, vb, kc, vc, dout);
    if (ws && ctx)
        launch_dkv_ws<4>(c, dkc, dvc, dout, lse, D, q, kc, vc, cs, cl, Nb, B, Tc, H, Hkv,
                         tile_scratch);
    launch_dkv_range<HDP, 4>(c, dkb, dvb, ws ? NULL : dkc, ws ? NULL : dvc, dout, lse, D, q, kb,
                             vb, kc, vc, cs, cl, Nb, B, Tc, H, Hkv, hd,
                             (ws || !ctx) ? nct4 : 0, (own_kernel || !own) ? nct4 : all4);
    if (own_kernel && own)
        launch_dkv_own<HDP>(c, dkb, dvb, dout, lse, D, q, kb, vb, Nb, B, H, Hkv, hd,
                            vec_ok(hd, q, kb, vb, kb, vb) && ((uintptr_t)dout & 15) == 0);
}

// Forward / dQ with the pair kernel (attention_block_pair.cuh): BN-key tiles, 4 warps.
template <int HDP, bool BWD, int BN>
static void launch_pair(const ops_ctx_t *c, bf16 *out, float *lse, bf16 *dq, const bf16 *dout,
                        const float *lse_in, const float *D, const void *q, const void *kb,
                        const void *vb, const void *kc, const void *vc, const int32_t *cs,
                        const int32_t *cl, int Nb, int B, int H, int Hkv, int hd) {
    constexpr int LD = HDP + 8;
    int ntasks = (H / Hkv) * ((B + 15) / 16), wt2 = 2 * ((ntasks + 1) / 2);
    size_t smem = (size_t)(4 * BN + (BWD ? 2 : 1) * ABP_WARPS * 32) * LD * sizeof(bf16);
    cuda_check(cudaFuncSetAttribute(attn_block_pair_kernel<HDP, BWD, BN>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((Nb + 1) / 2, Hkv, (wt2 + ABP_WARPS - 1) / ABP_WARPS);
    int vec = vec_ok(hd, q, kb, vb, kc, vc) && (!BWD || ((uintptr_t)dout & 15) == 0);
    attn_block_pair_kernel<HDP, BWD, BN><<<grid, ABP_WARPS * 32, smem, cuda_stream(c)>>>(
        out, lse, dq, dout, lse_in, D, (const bf16 *)q, (const bf16 *)kb, (const bf16 *)vb,
        (const bf16 *)kc, (const bf16 *)vc, cs, cl, Nb, B, H, Hkv, hd, 1.0f / sqrtf((float)hd),
        vec);
    cuda_check_launch();
}

// The FA3-style forward (variant 3; attention_block_wg.cuh): NST K and NST V stages of 128
// keys; tensor maps of kc, vc (128-row boxes) and kb, vb (64-row boxes).
template <int NST>
static void launch_fwd_fa3(const ops_ctx_t *c, bf16 *out, float *lse, const void *q,
                           const void *kb, const void *vb, const void *kc, const void *vc,
                           const int32_t *cs, const int32_t *cl, int Nb, int B, int Tc, int H,
                           int Hkv) {
    const size_t smem = (size_t)NST * 2 * (128 * 128 * 2) + 2 * ABW_TILE_BYTES +
                        4 * NST * sizeof(uint64_t);
    auto kern = attn_block_fwd_fa3_kernel<NST>;
    cuda_check(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const CUtensorMap tmkc = abw_head_tensor_map(kc, Tc, Hkv, 1, 128);
    const CUtensorMap tmvc = abw_head_tensor_map(vc, Tc, Hkv, 1, 128);
    const CUtensorMap tmkb = abw_head_tensor_map(kb, Nb * B, Hkv, 1, 64);
    const CUtensorMap tmvb = abw_head_tensor_map(vb, Nb * B, Hkv, 1, 64);
    kern<<<dim3((Nb + 1) / 2, Hkv), 384, smem, cuda_stream(c)>>>(
        out, lse, (const bf16 *)q, cs, cl, Nb, B, H, Hkv, 1.0f / sqrtf(128.0f), tmkc, tmvc,
        tmkb, tmvb);
    cuda_check_launch();
}

// Forward or dQ: variants 2-4, where they apply (head dim 128, H = 4 Hkv, B <= 16, Tc > 0
// (the tensor maps), Hopper, aligned rows), the warp-specialized wgmma kernel (a pair of
// blocks per thread block; variants 3 and 4's forward: launch_fwd_fa3; variant 4's dQ: the
// kernel's RSQ instance, Q and dO in registers);
// otherwise (variant 1) the mma.sync pair kernel (64-key tiles forward, 32 in dQ: its f32
// dP fragments are held in registers).
template <int HDP, bool BWD>
static void launch_q(const ops_ctx_t *c, int variant, bf16 *out, float *lse, bf16 *dq,
                     const bf16 *dout, const float *lse_in, const float *D, const void *q,
                     const void *kb, const void *vb, const void *kc, const void *vc,
                     const int32_t *cs, const int32_t *cl, int Nb, int B, int Tc, int H,
                     int Hkv, int hd) {
    const bool wg = variant >= 2 && HDP == 128 && H == 4 * Hkv && B <= 16 && Tc > 0 &&
                    ab_wg_applies(hd, q, kb, vb, kc, vc, BWD ? dout : NULL);
    if (wg && !BWD && variant >= 3) {
        launch_fwd_fa3<2>(c, out, lse, q, kb, vb, kc, vc, cs, cl, Nb, B, Tc, H, Hkv);
    } else if (wg) {
        constexpr int NST = 3;
        size_t smem = (size_t)(2 * NST + (BWD ? 4 : 2)) * ABW_TILE_BYTES + 2 * NST * sizeof(uint64_t);
        auto kern = variant >= 4 ? attn_block_wgq_ws_kernel<BWD, NST, BWD>
                                 : attn_block_wgq_ws_kernel<BWD, NST, false>;
        cuda_check(
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        const CUtensorMap tmk = abw_head_tensor_map(kc, Tc, Hkv, 1, 64);
        const CUtensorMap tmv = abw_head_tensor_map(vc, Tc, Hkv, 1, 64);
        kern<<<dim3((Nb + 1) / 2, Hkv), 384, smem, cuda_stream(c)>>>(
            out, lse, dq, dout, lse_in, D, (const bf16 *)q, (const bf16 *)kb, (const bf16 *)vb,
            cs, cl, Nb, B, H, Hkv, 1.0f / sqrtf((float)hd), tmk, tmv);
        cuda_check_launch();
    } else {
        launch_pair<HDP, BWD, BWD ? 32 : 64>(c, out, lse, dq, dout, lse_in, D, q, kb, vb, kc, vc,
                                             cs, cl, Nb, B, H, Hkv, hd);
    }
}

// Kernel variant of the block attention (ops_cuda_attention_block_variant).
static int g_ab_variant = AB_DEFAULT_VARIANT;

extern "C" int ops_cuda_attention_block_variant(int variant) {
    int old = g_ab_variant;
    if (variant >= 0 && variant <= OPS_CUDA_ATTN_BLOCK_VARIANTS)
        g_ab_variant = variant == 0 ? AB_DEFAULT_VARIANT : variant;
    return old;
}

static void bad_hd(const char *what, int hd) {
    fprintf(stderr, "ops cuda %s: head dim %d > 128 not supported\n", what, hd);
    abort();
}

#define AB_DISPATCH(hd, what, CALL)                       \
    switch (attn_hdp(hd)) {                               \
    case 32: { constexpr int HDP_ = 32; CALL; } break;   \
    case 64: { constexpr int HDP_ = 64; CALL; } break;   \
    case 96: { constexpr int HDP_ = 96; CALL; } break;   \
    case 128: { constexpr int HDP_ = 128; CALL; } break; \
    default: bad_hd(what, hd);                            \
    }

void cuda_attention_block_forward(const ops_ctx_t *c, void *out, float *lse, const void *q,
                                  const void *kb, const void *vb, const void *kc, const void *vc,
                                  const int32_t *ctx_start, const int32_t *ctx_len, int Nb, int B,
                                  int Tc, int H, int Hkv, int hd) {
    if (Nb <= 0 || B <= 0 || H <= 0) return;
    AB_DISPATCH(hd, "attention_block_forward",
                (launch_q<HDP_, false>(c, g_ab_variant, (bf16 *)out, lse, NULL, NULL, NULL, NULL,
                                       q, kb, vb, kc, vc, ctx_start, ctx_len, Nb, B, Tc, H,
                                       Hkv, hd)));
}

void cuda_attention_block_backward(const ops_ctx_t *c, void *dq, void *dkb, void *dvb, void *dkc,
                                   void *dvc, const void *dout, const void *out, const float *lse,
                                   const void *q, const void *kb, const void *vb, const void *kc,
                                   const void *vc, const int32_t *ctx_start,
                                   const int32_t *ctx_len, int Nb, int B, int Tc, int H, int Hkv,
                                   int hd) {
    if (Nb <= 0 || B <= 0 || H <= 0) {
        if (Tc > 0 && dkc) cuda_check(cudaMemsetAsync(dkc, 0, (size_t)Tc * Hkv * hd * 2, cuda_stream(c)));
        if (Tc > 0 && dvc) cuda_check(cudaMemsetAsync(dvc, 0, (size_t)Tc * Hkv * hd * 2, cuda_stream(c)));
        return;
    }
    // scratch: D (rows f32), the recomputed lse where none is given (rows f32), launch_dkv's
    // tile order (2 * nct128 ints)
    const long rows = (long)Nb * B * H, nct128 = (Tc + 127) / 128, lse_rows = lse ? 0 : rows;
    char *scratch = (char *)cuda_scratch(c, (size_t)(rows + lse_rows) * sizeof(float) +
                                                2 * (size_t)nct128 * sizeof(int));
    float *D = (float *)scratch, *lse_tmp = D + rows;
    int *tile_scratch = (int *)(scratch + (size_t)(rows + lse_rows) * sizeof(float));
    if (!lse) {  // recompute the log-sum-exp with the forward kernel (no output)
        AB_DISPATCH(hd, "attention_block_backward",
                    (launch_q<HDP_, false>(c, g_ab_variant, NULL, lse_tmp, NULL, NULL, NULL,
                                           NULL, q, kb, vb, kc, vc, ctx_start, ctx_len, Nb, B,
                                           Tc, H, Hkv, hd)));
        lse = lse_tmp;
    }
    attn_block_dot_kernel<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, cuda_stream(c)>>>(
        D, (const bf16 *)dout, (const bf16 *)out, rows, hd);
    cuda_check_launch();
    if (dq)
        AB_DISPATCH(hd, "attention_block_backward",
                    (launch_q<HDP_, true>(c, g_ab_variant, NULL, NULL, (bf16 *)dq,
                                          (const bf16 *)dout, lse, D, q, kb, vb, kc, vc,
                                          ctx_start, ctx_len, Nb, B, Tc, H, Hkv, hd)));
    if (dkb || dvb || dkc || dvc)
        AB_DISPATCH(hd, "attention_block_backward",
                    (launch_dkv<HDP_>(c, g_ab_variant, (bf16 *)dkb, (bf16 *)dvb, (bf16 *)dkc,
                                      (bf16 *)dvc, (const bf16 *)dout, lse, D, q, kb, vb, kc, vc,
                                      ctx_start, ctx_len, Nb, B, Tc, H, Hkv, hd,
                                      tile_scratch)));
}
