// DFlash block attention with Hopper warpgroup MMA (wgmma, sm_90a; attention_block.cu's
// variants 2 and 3; included there): the dK/dV context tiles, then the forward and dQ, then
// variant 3's forward (attn_block_fwd_fa3_kernel, at the end). Head dim
// 128 only. dK/dV: the same work items and the same deterministic key-major scheme as
// attn_block_dkv_kernel: a warpgroup (4 warps) owns 64 context keys of one kv head and
// sums over every block that sees them in a fixed order (no atomics).
//
// Why: the mma.sync kernel reads a K/V/Q/dO fragment from shared memory for every 1-2
// tensor-core ops (each warp its own copy) and stalls there at ~140 TFLOP/s. wgmma reads
// its shared-memory operands once per warpgroup, and the scores of the 4 heads of a GQA
// group are one 64 x 64 product. Per item (block j, 16 queries x 4 heads = 64 rows):
//   S^T  (64 keys x 64 rows) = K Q^T      8 x m64n64k16, A = K, B = Q (both K-major)
//   dP^T (64 keys x 64 rows) = V dO^T     8 x m64n64k16
//   P^T = exp2(S^T scale log2e - lse), dS^T = P^T (dP^T - D) in registers (f32), then bf16
//   dV (64 x 128) += P^T dO               4 x m64n128k16, A = P^T (registers), B = dO
//                                          (MN-major: the same bytes as dO in dP^T)
//   dK (64 x 128) += dS^T Q               4 x m64n128k16
// The dK/dV kernel's K, V tiles (loaded once) use the non-swizzled core-matrix layout
// (wgmma.cuh): element (row r, col d) of a 64-row tile at byte (d/8)*1024 + r*16 + (d%8)*2
// (K-major descriptors LBO = 1024, SBO = 128). The tiles that stream through stages (its
// items' Q and dO; the forward's and dQ's K and V) come by TMA, or by cp.async for the
// blocks' own rows, in the 128-byte swizzled layout (two panels of 64 columns, 8 KB each:
// K-major SBO = 1024 with the start stepping 32 bytes per k16; the MN-major view of rows
// 16c.. at c*2048 with LBO 8192 (the panel), SBO 1024).
//
// wgmma exists only in sm_90a code: the kernel's body is compiled there alone (the
// portable compute_90 PTX of the build gets a trap), and the launcher takes this path
// only on a compute capability 9.0 device (ABW_NO_WGMMA, abw_supported: wgmma.cuh).
#pragma once

#include "common/ops/cuda/wgmma.cuh"

#ifndef ABW_NO_WGMMA

// One work item: the S^T / dP^T products of the staged 64 rows (Qt, Ot: 128-byte swizzled
// tiles, a TMA box each; lse (log2 units) Lb, D Db: 64 f32, the same row order), then dV,
// dK += (accumulators dv, dk: 64 f32 per thread, m64n128 layout; K, V tiles Kt, Vt in the
// core-matrix layout). ka / kb_ok: whether keys 16w+g / 16w+g+8 of the tile are
// visible to the item's block. All 128 threads call it (warpgroup instructions).
__device__ __forceinline__ void abw_item(float *dk, float *dv, const unsigned char *Kt,
                                         const unsigned char *Vt, const unsigned char *Qt,
                                         const unsigned char *Ot, const float *Lb,
                                         const float *Db, bool ka, bool kb_ok, float scale_log2,
                                         int t) {
    float s[32], p[32];  // S^T, dP^T: n-tile j (8 rows) in s[4j .. 4j+3]
    wg_fence();
    wg_tile_abt128_sw(s, Kt, Qt);
    wg_tile_abt128_sw(p, Vt, Ot);
    wg_commit();
    wg_wait<0>();
    abw_fence_acc(s, 32);
    abw_fence_acc(p, 32);
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = 8 * j + 2 * t + (e & 1);
            bool kv = e < 2 ? ka : kb_ok;
            float pr = kv ? exp2f(s[4 * j + e] * scale_log2 - Lb[r]) : 0.0f;
            p[4 * j + e] = pr * (p[4 * j + e] - Db[r]);
            s[4 * j + e] = pr;
        }
    uint32_t ap[4][4], ads[4][4];  // P^T, dS^T as A fragments, rows 16c .. 16c + 15 (k)
#pragma unroll
    for (int c = 0; c < 4; c++) {
        c_to_a(ap[c], s + 8 * c, s + 8 * c + 4);
        c_to_a(ads[c], p + 8 * c, p + 8 * c + 4);
    }
    wg_fence();
#pragma unroll
    for (int c = 0; c < 4; c++) {  // B = dO, Q rows 16c.., MN-major
        wg_m64n128k16_rs<1>(dv, ap[c], wg_desc_sw128(Ot + c * 2048, 8192, 1024));
        wg_m64n128k16_rs<1>(dk, ads[c], wg_desc_sw128(Qt + c * 2048, 8192, 1024));
    }
    wg_commit();
    wg_wait<0>();
    abw_fence_acc(dv, 64);
    abw_fence_acc(dk, 64);
}

#endif  // !ABW_NO_WGMMA

// The dK/dV context tiles (attention_block.cu's variant 2). Grid: one dimension, (context
// tiles of 128 keys) x Hkv thread blocks: thread block x serves tile tile_order[x / Hkv]
// (the tiles by descending work: abw_tile_count_kernel, abw_tile_rank_kernel) of kv head
// x % Hkv, so the tiles seen by the most blocks start first and the last to start are the
// shortest; 384 threads. Arguments as attn_block_dkv_kernel (the blocks' own keys are not
// served here: the caller runs them on attn_block_own_dkv_kernel, or on attn_block_dkv_kernel
// for B > 16). NWG = 2 consumer warpgroups each own 64
// consecutive keys of the tile and share every staged work item (its Q, dO, lse and D are
// read from L2 once for 128 keys); each key sums its items in ascending block order
// (reproducible bits). Warp-specialized: a third, producer warpgroup lists the blocks that
// see the tile (128 candidates at a time, its own named barrier), and stages each work
// item into NST stages: its Q and dO tiles by TMA (one thread; a box of 16 queries x 4
// heads x 64 columns per panel, 128-byte swizzled, rows in (query, head) order: tensor maps
// of q and dout as (Nb B, H, 128), abw_head_tensor_map), lse, D (in the same row order) and
// the block's visible key range [vlo, vhi) by plain stores; a stage is full when its 128
// arrivals (release: the plain stores; one of them with the TMA's bytes) and the bytes are in.
// (Until 2026-12-04 the tiles came by cp.async from the 128 producer threads, rows in (head,
// query) order: 10.5 ms on the reference work.)
// The consumers wait on it, compute, and release it (one arrival per consumer warp). The
// producer ends with a stage marked done. No block barrier after start-up: the item math
// of one warpgroup runs under the other's wgmma, and the staging is off the consumers'
// path. Registers: producer 40, consumers 232 (setmaxnreg; the dK, dV accumulators alone
// are 128 per thread).
struct abw_ws_meta {
    int vlo, vhi, done, pad;
};
// One stage of attn_block_dkv_ws_kernel: the Q and dO tiles (TMA destinations: 1024-aligned,
// so the stage is a multiple of 1024 bytes), 64 lse and 64 D, the meta.
#define ABW_DKV_STAGE_BYTES \
    ((2 * ABW_TILE_BYTES + 2 * AB_GH * 16 * 4 + (int)sizeof(abw_ws_meta) + 1023) / 1024 * 1024)

template <int NST>
__global__ void __launch_bounds__(384, 1)
attn_block_dkv_ws_kernel(bf16 *dkc, bf16 *dvc, const float *lse_in, const float *Dvec,
                         const bf16 *q, const bf16 *kc, const bf16 *vc,
                         const int32_t *ctx_start, const int32_t *ctx_len, int Nb, int B, int Tc,
                         int H, int Hkv, float scale, const int *tile_order,
                         const __grid_constant__ CUtensorMap tmq,
                         const __grid_constant__ CUtensorMap tmo) {
#ifdef ABW_NO_WGMMA
    __trap();
#else
    constexpr int NWG = 2, hd = 128, QROWS = AB_GH * 16, TK = NWG * 64;  // TK: keys per block
    constexpr int STAGE_BYTES = ABW_DKV_STAGE_BYTES;
    extern __shared__ __align__(16) unsigned char smem_raw[];  // (the dynamic base is 1024-aligned)
    const int tid = threadIdx.x, sel = tid >> 7, wtid = tid & 127;
    unsigned char *stage = smem_raw + NWG * 2 * ABW_TILE_BYTES;  // NST x (Q, dO, lse, D, meta)
    uint64_t *full = (uint64_t *)(stage + NST * STAGE_BYTES), *empty = full + NST;
    int *list = (int *)(empty + NST);  // 128 block indices (producer)
    int *wcount = list + 128;          // 4 warp counts (producer)
    auto stQ = [&](int st) { return stage + st * STAGE_BYTES; };
    auto stO = [&](int st) { return stage + st * STAGE_BYTES + ABW_TILE_BYTES; };
    auto stL = [&](int st) { return (float *)(stage + st * STAGE_BYTES + 2 * ABW_TILE_BYTES); };
    auto stD = [&](int st) { return stL(st) + QROWS; };
    auto stM = [&](int st) { return (abw_ws_meta *)(stD(st) + QROWS); };
    const int hk = (int)(blockIdx.x % Hkv), group = H / Hkv, nqc = (B + 15) / 16;
    const int nhb = (group + AB_GH - 1) / AB_GH;
    const int lane = tid & 31, g = lane >> 2, t = lane & 3, wwarp = wtid >> 5;
    const size_t kstride = (size_t)Hkv * hd;
    const int key0 = tile_order[blockIdx.x / Hkv] * TK;
    if (tid == 0) {
        abw_check_align1024(smem_raw);
        for (int i = 0; i < NST; i++) {
            mbar_init(&full[i], 128);       // the producer's (one with the TMA bytes)
            mbar_init(&empty[i], 4 * NWG);  // one per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (sel == NWG) {  // the producer warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        int it = 0;  // items staged so far (all chunks)
        const int nchunks = (Nb + 127) / 128;
        for (int ch = 0; ch < nchunks; ch++) {
            // the blocks of candidates ch*128 .. that see a key of this tile, in order
            int jj = ch * 128 + wtid;
            bool f = false;
            if (jj < Nb) {
                int cs = ctx_start[jj], cl = ctx_len[jj];
                f = cl > 0 && cs < key0 + TK && cs + cl > key0;
            }
            unsigned m = __ballot_sync(0xffffffffu, f);
            named_bar_sync(1, 128);  // the previous chunk's list fully read
            if (lane == 0) wcount[wwarp] = __popc(m);
            named_bar_sync(1, 128);
            int off = 0, n_list = 0;
            for (int w = 0; w < 4; w++) {
                if (w < wwarp) off += wcount[w];
                n_list += wcount[w];
            }
            if (f) list[off + __popc(m & ((1u << lane) - 1u))] = jj;
            named_bar_sync(1, 128);
            const int n_items = n_list * nqc * nhb;
            for (int item = 0; item < n_items; item++, it++) {
                const int st = it % NST;
                if (it >= NST) mbar_wait(&empty[st], ((it / NST) - 1) & 1);
                const int li = item / (nqc * nhb), rem = item % (nqc * nhb);
                const int qc = rem / nhb, hb = rem % nhb, j = list[li];
                // row r of the item: query qc*16 + r/4 of block j, head slot r%4 of batch hb
                // (a TMA box's order, head fastest); the rows of queries past B and of heads
                // past the group get lse = inf: P = 0 whatever the box holds there
                if (wtid < QROWS) {
                    int hgi = hb * AB_GH + (wtid & 3), rr = qc * 16 + (wtid >> 2);
                    int h = hk * group + hgi;
                    long row = (rr < B && hgi < group) ? (long)j * B + rr : -1;
                    stL(st)[wtid] = row >= 0 ? lse_in[row * H + h] * ATTN_LOG2E : INFINITY;
                    stD(st)[wtid] = row >= 0 ? Dvec[row * H + h] : 0.0f;
                }
                if (wtid == 0) {
                    int vlo = ctx_start[j], vhi = vlo + ctx_len[j];
                    *stM(st) = abw_ws_meta{vlo, vhi > Tc ? Tc : vhi, 0, 0};
                    const int row0 = j * B + qc * 16, h0 = hk * group + hb * AB_GH;
                    mbar_arrive_expect_tx(&full[st], 2 * ABW_TILE_BYTES);
                    tma_load_3d(stQ(st), &tmq, &full[st], 0, h0, row0);
                    tma_load_3d(stQ(st) + ABW_TILE_BYTES / 2, &tmq, &full[st], 64, h0, row0);
                    tma_load_3d(stO(st), &tmo, &full[st], 0, h0, row0);
                    tma_load_3d(stO(st) + ABW_TILE_BYTES / 2, &tmo, &full[st], 64, h0, row0);
                } else {
                    mbar_arrive(&full[st]);
                }
            }
        }
        const int st = it % NST;  // the end: a stage marked done
        if (it >= NST) mbar_wait(&empty[st], ((it / NST) - 1) & 1);
        if (wtid == 0) *stM(st) = abw_ws_meta{0, 0, 1, 0};
        mbar_arrive(&full[st]);
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int wkey0 = key0 + sel * 64;  // this warpgroup's keys
    unsigned char *Kt = smem_raw + sel * 2 * ABW_TILE_BYTES, *Vt = Kt + ABW_TILE_BYTES;
    auto kvrow = [&](const bf16 *x, int r) -> const bf16 * {
        int kk = wkey0 + r;
        return kk < Tc ? x + (size_t)kk * kstride + (size_t)hk * hd : nullptr;
    };
    abw_load_tile(Kt, [&](int r) { return kvrow(kc, r); }, wtid, q);
    abw_load_tile(Vt, [&](int r) { return kvrow(vc, r); }, wtid, q);
    cp_async_commit();
    cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    named_bar_sync(2 + sel, 128);  // this warpgroup's K, V tiles are in

    float dk[64], dv[64];
#pragma unroll
    for (int i = 0; i < 64; i++) dk[i] = dv[i] = 0.0f;
    const float scale_log2 = scale * ATTN_LOG2E;
    const int my_key_a = wkey0 + wwarp * 16 + g, my_key_b = my_key_a + 8;
    for (int it = 0;; it++) {
        const int st = it % NST;
        mbar_wait(&full[st], (it / NST) & 1);
        const abw_ws_meta mt = *stM(st);
        if (mt.done) break;
        if (mt.vlo < wkey0 + 64 && mt.vhi > wkey0) {  // uniform over the warpgroup
            const bool ka = my_key_a >= mt.vlo && my_key_a < mt.vhi;
            const bool kb_ok = my_key_b >= mt.vlo && my_key_b < mt.vhi;
            abw_item(dk, dv, Kt, Vt, stQ(st), stO(st), stL(st), stD(st), ka, kb_ok, scale_log2,
                     t);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[st]);  // this warp no longer reads the stage
    }
    auto dst = [&](bf16 *x, int r) -> bf16 * {
        int kk = wkey0 + wwarp * 16 + r;
        return (x && kk < Tc) ? x + (size_t)kk * kstride + (size_t)hk * hd : nullptr;
    };
    store_rows<128>((const float(*)[4])dk, scale, scale, [&](int r) { return dst(dkc, r); }, hd,
                    g, t);
    store_rows<128>((const float(*)[4])dv, 1.0f, 1.0f, [&](int r) { return dst(dvc, r); }, hd,
                    g, t);
#endif
}

// The dK/dV context tiles (128 keys each, nct of them) by descending work for
// attn_block_dkv_ws_kernel: cnt[t] = the blocks that see a key of tile t (its work items
// per head batch), then order[r] = the tile of rank r (more blocks first, ties by tile).
// Two small kernels (nct thread blocks of ABW_CNT_THREADS, then nct threads) on the same
// stream; cnt and order are nct ints each of device scratch. Any order gives the same bits
// (each tile's sums stay in one thread block); this one only shortens the kernel's tail.
// The rank is O(nct^2) reads of cnt (L2): 65K at 32K context tokens, 67M at 1M.
#define ABW_CNT_THREADS 256
__global__ void __launch_bounds__(ABW_CNT_THREADS)
abw_tile_count_kernel(int *cnt, const int32_t *ctx_start, const int32_t *ctx_len, int Nb) {
    __shared__ int part[ABW_CNT_THREADS / 32];
    const int key0 = blockIdx.x * 128;
    int n = 0;
    for (int j = threadIdx.x; j < Nb; j += blockDim.x) {
        int cs = ctx_start[j], cl = ctx_len[j];
        n += cl > 0 && cs < key0 + 128 && cs + cl > key0;
    }
    for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = n;
    __syncthreads();
    if (threadIdx.x == 0) {
        int sum = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) sum += part[w];
        cnt[blockIdx.x] = sum;
    }
}

__global__ void abw_tile_rank_kernel(int *order, const int *cnt, int nct) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nct) return;
    const int c = cnt[i];
    int rank = 0;
    for (int k = 0; k < nct; k++) {
        int ck = cnt[k];
        rank += ck > c || (ck == c && k < i);
    }
    order[rank] = i;
}

// ------------------------------------------------------------------ forward and dQ (wgmma)
// attention_block.cu's variant 2 (and the dQ of 3, and with RSQ of 4): the pair scheme of
// attention_block_pair.cuh (a thread block serves blocks ja = 2x and ja+1 of one kv head,
// walking the union of their context and then their own rows in 64-key tiles) with one
// warpgroup per block: its 64 query rows are the 4 heads of the GQA group x 16 queries (warp
// w = head hk*4 + w), so it needs H = 4 Hkv, B <= 16 and head dim 128. Per tile and warpgroup:
//   forward: S = Q K^T (8 x m64n64k16, A = Q, B = K, both K-major), online softmax on the
//            accumulator (its layout is the mma.sync one), O += P V (4 x m64n128k16, A = P
//            in registers, B = V MN-major);
//   dQ:      S = Q K^T, dP = dO V^T (16 x m64n64k16), P = exp2(S scale log2e - lse),
//            dS = P (dP - D), dQ += dS K (4 x m64n128k16, B = K MN-major).
// Shared memory: per warpgroup its Q (and dO) tile; NST stages of K/V tiles.
// One 64-key tile of attn_block_wgq_ws_kernel for a warpgroup: visible columns
// [klo, khi) of the K, V tiles Kt, Vt against its Q (and dO) tiles Qw, Ow; forward: the
// online softmax state mrow, lrow and O in acc; dQ (BWD): dQ += dS K in acc, with the rows'
// lse (log2 units) lse2 and D Dr. All 128 threads of the warpgroup call it.
// RSQ (dQ only): Q and dO come as register fragments qa, oa (wg_tile_frags_a) instead of
// from Qw, Ow.
template <bool BWD, bool RSQ = false>
__device__ __forceinline__ void abw_q_tile(float (*acc)[4], float *mrow, float *lrow,
                                           const unsigned char *Qw, const unsigned char *Ow,
                                           const uint32_t (*qa)[4], const uint32_t (*oa)[4],
                                           const unsigned char *Kt, const unsigned char *Vt,
                                           int klo, int khi, const float *lse2, const float *Dr,
                                           float scale_log2, int t) {
    constexpr int BN = 64;
    const bool need_mask = klo > 0 || khi < BN;
    float sc[8][4], dp[8][4];
    wg_fence();
    if (BWD && RSQ) {
        wg_tile_abt128_rs_sw(&sc[0][0], qa, Kt);
        wg_tile_abt128_rs_sw(&dp[0][0], oa, Vt);
    } else {
        wg_tile_abt128_sw(&sc[0][0], Qw, Kt);
        if (BWD) wg_tile_abt128_sw(&dp[0][0], Ow, Vt);
    }
    wg_commit();
    wg_wait<0>();
    abw_fence_acc(&sc[0][0], 32);
    if (BWD) abw_fence_acc(&dp[0][0], 32);
    if (!BWD) {
        if (need_mask) abp_mask<8>(sc, klo, khi, -INFINITY, t);
        online_softmax_tile<BN, 128>(sc, mrow, lrow, acc, 0, INT_MAX, INT_MAX, INT_MAX,
                                     false, scale_log2, t);
    } else {
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[nt][e] = exp2f(sc[nt][e] * scale_log2 - lse2[e >> 1]);
        if (need_mask) abp_mask<8>(sc, klo, khi, 0.0f, t);
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) sc[nt][e] *= dp[nt][e] - Dr[e >> 1];
    }
    uint32_t a[4][4];  // P (forward) or dS (dQ) as A fragments, keys 16kk..16kk+15
#pragma unroll
    for (int kk = 0; kk < 4; kk++) c_to_a(a[kk], sc[2 * kk], sc[2 * kk + 1]);
    abw_fence_acc(&acc[0][0], 64);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++)  // B = V (forward) or K (dQ), MN-major
        wg_m64n128k16_rs<1>(&acc[0][0], a[kk],
                            wg_desc_sw128((BWD ? Kt : Vt) + kk * 2048, 8192, 1024));
    wg_commit();
    wg_wait<0>();
    abw_fence_acc(&acc[0][0], 64);
}

// The forward and dQ kernel: two consumer warpgroups (one per block of the pair, the
// per-tile math of abw_q_tile) and a third, producer warpgroup filling NST stages of K/V
// tiles behind mbarriers: context tiles by TMA (one thread: four boxes of 64 rows x 64
// columns from the tensor maps tmk, tmv of kc, vc as (Tc, Hkv, 128); the rows of a box past
// the pair's windows are masked, so every row of kc, vc below Tc must be finite: 0 x NaN is
// NaN), the blocks' own tiles by cp.async (abw_load_tile_sw); full: 128 arrivals (cp.async,
// or plain with one carrying the TMA's bytes); empty: one arrival per consumer warp; no block
// barrier after start-up, as attn_varlen_fwd_ws_kernel. Registers: producer 40, consumers 232.
// RSQ (dQ only; block variant 4): each warp holds its rows of Q and dO as A fragments (64
// registers) and the S, dP products read only K, V from shared memory.
template <bool BWD, int NST, bool RSQ = false>
__global__ void __launch_bounds__(384, 1)
attn_block_wgq_ws_kernel(bf16 *out, float *lse, bf16 *dq, const bf16 *dout,
                         const float *lse_in, const float *Dvec, const bf16 *q, const bf16 *kb,
                         const bf16 *vb, const int32_t *ctx_start, const int32_t *ctx_len,
                         int Nb, int B, int H, int Hkv, float scale,
                         const __grid_constant__ CUtensorMap tmk,
                         const __grid_constant__ CUtensorMap tmv) {
#ifdef ABW_NO_WGMMA
    __trap();
#else
    constexpr int hd = 128, BN = 64, HALF = 32;
    extern __shared__ __align__(16) unsigned char smem_raw[];  // (the dynamic base is 1024-aligned)
    unsigned char *KV = smem_raw;                          // NST stages x (K tile, V tile)
    unsigned char *Qt = KV + 2 * NST * ABW_TILE_BYTES;     // 2 warpgroups x Q tile
    unsigned char *Ot = Qt + 2 * ABW_TILE_BYTES;           // 2 warpgroups x dO tile (BWD)
    uint64_t *full = (uint64_t *)(Ot + (BWD ? 2 : 0) * ABW_TILE_BYTES), *empty = full + NST;
    const int hk = blockIdx.y, tid = threadIdx.x, sel = tid >> 7, wtid = tid & 127;
    const int warp = wtid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int ja = 2 * blockIdx.x, j = ja + sel;
    const bool need0 = true, need1 = ja + 1 < Nb, wact = j < Nb;
    const size_t qstride = (size_t)H * hd, kstride = (size_t)Hkv * hd;
    const float scale_log2 = scale * ATTN_LOG2E;
    const int h = hk * 4 + warp;  // this warp's query head

    const abp_tiles<BN> tl(ctx_start, ctx_len, ja, need0, need1, B);
    const int ntile = tl.ntile;
    if (tid == 0) {
        abw_check_align1024(smem_raw);
        for (int i = 0; i < NST; i++) {
            mbar_init(&full[i], 128);   // the producer's 128 arrivals (cp.async or plain)
            mbar_init(&empty[i], 8);    // one per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (sel == 2) {  // the producer warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        for (int it = 0; it < ntile; it++) {
            const int st = it % NST;
            if (it >= NST) mbar_wait(&empty[st], ((it / NST) - 1) & 1);
            int k0, kend;  // (kend: the box's rows past it are masked by the consumers)
            const int own = tl.tile(it, &k0, &kend);
            unsigned char *Kt = KV + st * 2 * ABW_TILE_BYTES, *Vt = Kt + ABW_TILE_BYTES;
            if (own < 0) {  // context rows k0 .. k0 + 63 by TMA (rows past kend: masked)
                if (wtid == 0) {
                    mbar_arrive_expect_tx(&full[st], 2 * ABW_TILE_BYTES);
                    tma_load_3d(Kt, &tmk, &full[st], 0, hk, k0);
                    tma_load_3d(Kt + ABW_TILE_BYTES / 2, &tmk, &full[st], 64, hk, k0);
                    tma_load_3d(Vt, &tmv, &full[st], 0, hk, k0);
                    tma_load_3d(Vt + ABW_TILE_BYTES / 2, &tmv, &full[st], 64, hk, k0);
                } else {
                    mbar_arrive(&full[st]);
                }
                continue;
            }
            auto rowp = [&](const bf16 *xb, int r) -> const bf16 * {  // the blocks' own rows
                int s2 = r / HALF, u = own * HALF + r % HALF;
                bool ok = u < B && (s2 == 0 ? need0 : need1);
                return ok ? xb + ((size_t)(ja + s2) * B + u) * kstride + (size_t)hk * hd : nullptr;
            };
            abw_load_tile_sw<128>(Kt, [&](int r) { return rowp(kb, r); }, wtid, q);
            abw_load_tile_sw<128>(Vt, [&](int r) { return rowp(vb, r); }, wtid, q);
            mbar_arrive_cp_async(&full[st]);
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");  // exit with nothing in flight
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    // this warpgroup's 64 query rows: r = 16 hl + qi -> row j*B + qi of head hk*4 + hl
    auto qrow = [&](int r, int *hh) -> long {
        int hl = r >> 4, qi = r & 15;
        *hh = hk * 4 + hl;
        return (wact && qi < B) ? (long)j * B + qi : -1;
    };
    unsigned char *Qw = Qt + sel * ABW_TILE_BYTES;
    unsigned char *Ow = BWD ? Ot + sel * ABW_TILE_BYTES : nullptr;  // (the forward has no dO)
    abw_load_tile(Qw, [&](int r) -> const bf16 * {
        int hh;
        long row = qrow(r, &hh);
        return row >= 0 ? q + row * qstride + (size_t)hh * hd : nullptr;
    }, wtid, q);
    if (BWD)
        abw_load_tile(Ow, [&](int r) -> const bf16 * {
            int hh;
            long row = qrow(r, &hh);
            return row >= 0 ? dout + row * qstride + (size_t)hh * hd : nullptr;
        }, wtid, q);
    cp_async_commit();
    float lse2[2] = {0.0f, 0.0f}, Dr[2] = {0.0f, 0.0f};  // rows g, g+8 of this warp (BWD)
    if (BWD) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int hh;
            long row = qrow(warp * 16 + g + 8 * e, &hh);
            lse2[e] = row >= 0 ? lse_in[row * H + hh] * ATTN_LOG2E : INFINITY;
            Dr[e] = row >= 0 ? Dvec[row * H + hh] : 0.0f;
        }
    }
    cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    named_bar_sync(1 + sel, 128);  // this warpgroup's Q (dO) tile is in
    uint32_t qa[8][4], oa[8][4];   // RSQ: this warp's rows of Q, dO as A fragments
    if (BWD && RSQ) {
        wg_tile_frags_a(qa, Qw, warp, lane);
        wg_tile_frags_a(oa, Ow, warp, lane);
    }
    const int vlo = wact ? ctx_start[j] : 0, vhi = wact ? vlo + ctx_len[j] : 0;
    float acc[16][4];  // O or dQ (m64n128 accumulator: n-tile i in acc[i])
#pragma unroll
    for (int i = 0; i < 16; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};

    for (int it = 0; it < ntile; it++) {
        const int st = it % NST;
        mbar_wait(&full[st], (it / NST) & 1);
        int klo, khi;  // this warpgroup's visible tile columns [klo, khi)
        tl.window(it, sel, vlo, vhi, B, &klo, &khi);
        if (wact && klo < khi) {  // uniform over the warpgroup
            // the own tiles' cp.async wrote through the generic proxy; wgmma reads through
            // the async one (TMA's writes need no fence)
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            abw_q_tile<BWD, RSQ>(acc, mrow, lrow, Qw, Ow, qa, oa, KV + st * 2 * ABW_TILE_BYTES,
                                 KV + st * 2 * ABW_TILE_BYTES + ABW_TILE_BYTES, klo, khi, lse2,
                                 Dr, scale_log2, t);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[st]);  // this warp no longer reads the stage
    }
    if (!wact) return;
    auto rowi = [&](int r) -> long { return r < B ? (long)j * B + r : -1; };
    if (!BWD) {
        ab_q_write_fwd<128>(out, lse, acc, mrow, lrow, rowi, H, h, hd, qstride, g, t);
    } else if (dq) {
        store_rows<128>(acc, scale, scale, [&](int r) -> bf16 * {
            long row = rowi(r);
            return row >= 0 ? dq + row * qstride + (size_t)h * hd : nullptr;
        }, hd, g, t);
    }
#endif
}

#ifndef ABW_NO_WGMMA
// The FA3-style forward's producer, one thread: K (or V) tile it of the pair into stage
// it % NST of buf (32 KB stages: two 128-byte-swizzled panels of 64 columns x 128 rows),
// once the consumers released the stage's previous tile. A context tile: rows k0 .. k0 + 127
// of kc (vc) by two boxes of 128 rows (tensor map tmc); the own tile: the pair's blocks'
// rows ja*B .. and (ja+1)*B .. of kb (vb) by four boxes of 64 rows (tmb) at rows 0 and 64 of
// each panel (the rows past a block's B, and TMA's zeros past Nb*B, are masked).
template <int NST>
__device__ __forceinline__ void abf_load_stage(unsigned char *buf, uint64_t *full,
                                               uint64_t *empty, const CUtensorMap *tmc,
                                               const CUtensorMap *tmb, int it, int own, int k0,
                                               int hk, int ja, int B) {
    constexpr int BYTES = 128 * 128 * 2, PANEL = BYTES / 2;
    const int st = it % NST;
    unsigned char *dst = buf + st * BYTES;
    if (it >= NST) mbar_wait(&empty[st], ((it / NST) - 1) & 1);
    mbar_arrive_expect_tx(&full[st], BYTES);
    if (own < 0) {
        tma_load_3d(dst, tmc, &full[st], 0, hk, k0);
        tma_load_3d(dst + PANEL, tmc, &full[st], 64, hk, k0);
    } else {
        for (int p = 0; p < 2; p++)
            for (int s2 = 0; s2 < 2; s2++)
                tma_load_3d(dst + p * PANEL + s2 * (PANEL / 2), tmb, &full[st], 64 * p, hk,
                            (ja + s2) * B);
    }
}
#endif  // !ABW_NO_WGMMA

// The forward, FlashAttention-3's way (attention_block.cu's variant 3; the math of
// attn_block_wgq_ws_kernel<false>, 128-key tiles): a thread block = a pair of blocks ja, ja+1
// of one kv head; two consumer warpgroups (one per block: its 16 queries x 4 heads = 64 rows)
// and a producer warpgroup of which one thread issues every load by TMA (abf_load_stage: the
// context tiles of abp_tiles<128>, then the pair's own tile), K and V in NST stages each with
// their own full (expect_tx) and empty (one arrival per consumer warp) mbarriers. Per
// warpgroup and tile j >= 1, one turn (named barriers 3 and 4, as attn_varlen_fwd_fa3_kernel):
// issue S_j = Q K_j^T and O += P_{j-1} V_{j-1}, let the other warpgroup issue, wait for S_j,
// mask it to the block's window of the tile (branch-free: nothing in flight crosses a
// branch), the online softmax, wait for P V, rescale O, P_j to bf16 fragments. Both
// warpgroups run every tile of the pair (a tile outside a block's window is all masked, a
// block past Nb computes rows it does not store), so the turns match. Every row of kc, vc
// below Tc and of kb, vb must be finite (0 x NaN is NaN). Shared memory: K, V NST x 32 KB
// each, Q 2 x 16 KB. Registers: producer 40, consumers 232 (O 64, S 64, P 32 per thread).
template <int NST>
__global__ void __launch_bounds__(384, 1)
attn_block_fwd_fa3_kernel(bf16 *out, float *lse, const bf16 *q, const int32_t *ctx_start,
                          const int32_t *ctx_len, int Nb, int B, int H, int Hkv, float scale,
                          const __grid_constant__ CUtensorMap tmkc,
                          const __grid_constant__ CUtensorMap tmvc,
                          const __grid_constant__ CUtensorMap tmkb,
                          const __grid_constant__ CUtensorMap tmvb) {
#ifdef ABW_NO_WGMMA
    __trap();
#else
    constexpr int hd = 128, BN = 128, KV_BYTES = BN * hd * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];  // (1024-aligned: the swizzle)
    unsigned char *Ks = smem_raw, *Vs = Ks + NST * KV_BYTES;  // NST stages each
    unsigned char *Qt = Vs + NST * KV_BYTES;                 // 2 warpgroups x Q tile
    uint64_t *fullK = (uint64_t *)(Qt + 2 * ABW_TILE_BYTES), *emptyK = fullK + NST;
    uint64_t *fullV = emptyK + NST, *emptyV = fullV + NST;
    const int hk = blockIdx.y, tid = threadIdx.x, sel = tid >> 7, wtid = tid & 127;
    const int warp = wtid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int ja = 2 * blockIdx.x, j = ja + sel;
    const bool wact = j < Nb;
    const size_t qstride = (size_t)H * hd;
    const abp_tiles<BN> tl(ctx_start, ctx_len, ja, true, ja + 1 < Nb, B);
    const int ntile = tl.ntile;  // >= 1: the own tile is last
    if (tid == 0) fa3_init<NST>(smem_raw, fullK, 8);
    __syncthreads();
    if (sel == 2) {  // the producer warpgroup: one thread issues the copies
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (wtid == 0)
            for (int it = 0; it < ntile; it++) {
                int k0, kend;
                const int own = tl.tile(it, &k0, &kend);
                abf_load_stage<NST>(Ks, fullK, emptyK, &tmkc, &tmkb, it, own, k0, hk, ja, B);
                abf_load_stage<NST>(Vs, fullV, emptyV, &tmvc, &tmvb, it, own, k0, hk, ja, B);
            }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    // this warpgroup's 64 query rows: r = 16 hl + qi -> row j*B + qi of head hk*4 + hl
    unsigned char *Qw = Qt + sel * ABW_TILE_BYTES;
    abw_load_tile(Qw, [&](int r) -> const bf16 * {
        int hl = r >> 4, qi = r & 15;
        return (wact && qi < B) ? q + ((size_t)j * B + qi) * qstride + (size_t)(hk * 4 + hl) * hd
                                : nullptr;
    }, wtid, q);
    cp_async_commit();
    cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    named_bar_sync(1 + sel, 128);  // this warpgroup's Q tile is in
    const int vlo = wact ? ctx_start[j] : 0, vhi = wact ? vlo + ctx_len[j] : 0;
    const float scale_log2 = scale * ATTN_LOG2E;

    float acc[16][4];   // O (m64n128 accumulator: n-tile i in acc[i])
    float sc[16][4];    // S_j, then P_j (f32)
    uint32_t pa[8][4];  // P_{j-1} as A fragments, keys 16kk .. 16kk + 15
#pragma unroll
    for (int i = 0; i < 16; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f}, al[2];
    auto issue_s = [&](int jt) { fa3_issue_s(&sc[0][0], Qw, Ks + (jt % NST) * KV_BYTES); };
    auto issue_pv = [&](int jt) { fa3_issue_pv(&acc[0][0], pa, Vs + (jt % NST) * KV_BYTES); };
    auto fence_pa = [&]() { fa3_fence_pa(pa); };
    auto to_a = [&]() { fa3_to_a(pa, sc); };
    // S of tile jt masked to this block's window [klo, khi) of it, then the softmax step
    auto softmax = [&](int klo, int khi) {
        abw_fence_acc(&sc[0][0], 64);
        abp_mask<16>(sc, klo, khi, -INFINITY, t);
        online_softmax_p<BN>(sc, mrow, lrow, al, 0, 0, 0, INT_MAX, false, scale_log2, t);
    };
    auto wait_full = [&](uint64_t *bar, int jt) { mbar_wait(&bar[jt % NST], (jt / NST) & 1); };
    auto release = [&](uint64_t *bar, int jt) {
        __syncwarp();
        if (lane == 0) mbar_arrive(&bar[jt % NST]);  // this warp no longer reads the stage
    };
    auto my_turn = [&]() { named_bar_sync(3 + sel, 256); };
    auto your_turn = [&]() { named_bar_arrive(4 - sel, 256); };
    if (sel == 1) your_turn();  // warpgroup 0 goes first
    int klo, khi;
    tl.window(0, sel, vlo, vhi, B, &klo, &khi);
    wait_full(fullK, 0);
    my_turn();
    wg_fence();
    issue_s(0);
    your_turn();
    wg_wait<0>();
    softmax(klo, khi);
    to_a();
    release(emptyK, 0);
    for (int jt = 1; jt < ntile; jt++) {
        tl.window(jt, sel, vlo, vhi, B, &klo, &khi);
        wait_full(fullK, jt);
        wait_full(fullV, jt - 1);
        my_turn();
        abw_fence_acc(&acc[0][0], 64);
        wg_fence();
        issue_s(jt);
        issue_pv(jt - 1);
        your_turn();
        wg_wait<1>();
        softmax(klo, khi);
        wg_wait<0>();
        abw_fence_acc(&acc[0][0], 64);
        fence_pa();
        rescale_rows<128>(acc, al);
        to_a();
        release(emptyK, jt);
        release(emptyV, jt - 1);
    }
    wait_full(fullV, ntile - 1);  // the last tile's P V
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
    if (!wact) return;
    const int h = hk * 4 + warp;  // this warp's query head
    auto rowi = [&](int r) -> long { return r < B ? (long)j * B + r : -1; };
    ab_q_write_fwd<128>(out, lse, acc, mrow, lrow, rowi, H, h, hd, qstride, g, t);
#endif
}
