// Hopper warpgroup MMA (wgmma.mma_async, sm_90a) helpers: bf16 inputs, f32 accumulators,
// operands in shared memory in the non-swizzled ("interleaved") canonical layout.
//
// Core matrix: 8 rows x 16 bytes (8 bf16), 128 contiguous bytes, row r at byte 16 r.
// A tile is a grid of core matrices; a shared-memory matrix descriptor gives its start,
// the byte offset between core matrices adjacent in the leading dimension (LBO) and in
// the strided dimension (SBO) (PTX ISA, "Matrix Descriptor Format"):
//   K-major operand (k contiguous in a core-matrix row: A = (M, K) row-major, or B whose
//     rows are N with K contiguous): LBO steps along K (8 columns), SBO along M/N (8 rows).
//   MN-major operand (B = (K, N) with N contiguous: the "transposed" B, trans-b = 1):
//     core-matrix rows are K, 8 N-elements each; LBO steps along K (8 rows), SBO along N
//     (8 columns).
// (Both checked on an H200 against a CPU product, 2026-12-02: K-major A and B, m64n16k16;
// MN-major B with A in registers, m64n128k16; the swapped LBO/SBO give wrong results or
// faults.)
//
// Accumulator fragment of m64nNk16 (f32, N/2 registers per thread): warp w of the
// warpgroup holds rows 16w .. 16w+15 in the mma.sync m16n8 C layout, n-tile j in
// registers d[4j .. 4j+3]: (row g, cols 8j+2t, +1), (row g+8, same cols); lane = 4g + t.
// A from registers: warp w's rows 16w.. in the mma.sync m16n8k16 A layout.
#pragma once

#include <cudaTypedefs.h>  // CUtensorMap, PFN_cuTensorMapEncodeTiled (types only)
#include <stdint.h>

#include "common/ops/cuda/attention_common.cuh"  // cp_async16, bf16, cuda_check

// wgmma exists only in sm_90a code: kernels using it compile their bodies only when
// ABW_NO_WGMMA is not defined (the portable compute_90 PTX of the build gets a trap), and
// their launchers take that path only on a compute capability 9.0 device (abw_supported).
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ABW_NO_WGMMA 1  // device pass without sm_90a features
#endif

#define ABW_TILE_BYTES (64 * 128 * 2)  // one 64 x 128 bf16 tile

// Descriptor of a shared-memory operand: start address, LBO and SBO in bytes (multiples
// of 16), no swizzle.
__device__ __forceinline__ uint64_t wg_desc(const void *smem, uint32_t lbo, uint32_t sbo) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    uint64_t d = 0;
    d |= (uint64_t)((a & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo & 0x3FFFF) >> 4) << 16;
    d |= (uint64_t)((sbo & 0x3FFFF) >> 4) << 32;
    return d;  // base offset 0, swizzle mode 0 (none)
}

// Descriptor of a shared-memory operand in the 128-byte swizzled layout (TMA's
// CU_TENSOR_MAP_SWIZZLE_128B: rows of 128 bytes, 8-row atoms of 1024 bytes, 1024-aligned):
// K-major: sbo = the stride of 8-row groups (1024), lbo unused (pass 1: it encodes 0); the
// start may step by 32 bytes (16 bf16) within a row for the k16 slices. MN-major: lbo = the
// stride of 64-element panels along N, sbo = the stride of 8-row groups along K (1024).
__device__ __forceinline__ uint64_t wg_desc_sw128(const void *smem, uint32_t lbo, uint32_t sbo) {
    return wg_desc(smem, lbo, sbo) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Makes the registers of an accumulator visible/ordered around wgmma (as CUTLASS's
// warpgroup_fence_operand).
__device__ __forceinline__ void wg_fence_reg(float &r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void wg_fence_reg(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }

// D (64 x 16) (+)= A (64 x 16, descriptor) * B (16 x 16, descriptor); d[8]. scale_d 0: D =
// A B (D's input ignored), 1: D += A B. tb: 1 when B is MN-major.
template <int TB>
__device__ __forceinline__ void wg_m64n16k16_ss(float *d, uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, 0, %11;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "l"(da), "l"(db), "r"(scale_d), "n"(TB));
}

// The 64 f32 accumulator registers of an m64n128 wgmma: their place-holders %0..%63 in the
// instruction and their in/out operands d[0..63].
#define WG_ACC64_REGS                                                   \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"           \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"  \
    "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"  \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
#define WG_ACC8(d, i)                                                                   \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),        \
        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_ACC64(d)                                                                     \
    WG_ACC8(d, 0), WG_ACC8(d, 8), WG_ACC8(d, 16), WG_ACC8(d, 24), WG_ACC8(d, 32),       \
        WG_ACC8(d, 40), WG_ACC8(d, 48), WG_ACC8(d, 56)

// D (64 x 128) += A (64 x 16, registers: a[4], mma.sync A layout per warp) * B (16 x 128,
// descriptor); d[64]. tb: 1 when B is MN-major.
template <int TB>
__device__ __forceinline__ void wg_m64n128k16_rs(float *d, const uint32_t *a, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        WG_ACC64_REGS
        "{%64,%65,%66,%67}, %68, p, 1, 1, %69;\n}\n"
        : WG_ACC64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB));
}

// D (64 x 128) (+)= A (64 x 16, descriptor) * B (16 x 128, descriptor); d[64]. scale_d 0:
// D = A B (D's input ignored), 1: D += A B. B K-major.
__device__ __forceinline__ void wg_m64n128k16_ss(float *d, uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        WG_ACC64_REGS
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : WG_ACC64(d)
        : "l"(da), "l"(db), "r"(scale_d));
}

// D (64 x 64) (+)= A (64 x 16, descriptor) * B (16 x 64, descriptor); d[32]. scale_d 0:
// D = A B (D's input ignored), 1: D += A B. TB: 1 when B is MN-major.
template <int TB>
__device__ __forceinline__ void wg_m64n64k16_ss(float *d, uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "%32, %33, p, 1, 1, 0, %35;\n}\n"
        : WG_ACC8(d, 0), WG_ACC8(d, 8), WG_ACC8(d, 16), WG_ACC8(d, 24)
        : "l"(da), "l"(db), "r"(scale_d), "n"(TB));
}

// D (64 x 64) (+)= A (64 x 16, registers: a[4], mma.sync A layout per warp) * B (16 x 64,
// descriptor); d[32]. scale_d 0: D = A B (D's input ignored), 1: D += A B. TB: 1 when B is
// MN-major.
template <int TB>
__device__ __forceinline__ void wg_m64n64k16_rs(float *d, const uint32_t *a, uint64_t db,
                                                int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
        : WG_ACC8(d, 0), WG_ACC8(d, 8), WG_ACC8(d, 16), WG_ACC8(d, 24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB));
}

// D (64 x 64, d[32]) = A B^T over 128 columns: A and B 64-row core-matrix tiles of 128
// columns (row r, column c at byte (c/8)*1024 + r*16 + (c%8)*2), both K-major: 8 x
// m64n64k16. Issued only: the caller fences before (wg_fence), then commits and waits.
__device__ __forceinline__ void wg_tile_abt128(float *d, const unsigned char *A,
                                               const unsigned char *B) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
        wg_m64n64k16_ss<0>(d, wg_desc(A + kk * 2048, 1024, 128), wg_desc(B + kk * 2048, 1024, 128),
                           kk > 0);
}

// D (64 x 64, d[32]) = A B^T over 128 columns as wg_tile_abt128, with B a 64-row tile in
// the 128-byte swizzled layout (two panels of 64 columns, 8 KB each: abw_load_tile_sw or a
// TMA box of 64 rows). Issued only.
__device__ __forceinline__ void wg_tile_abt128_sw(float *d, const unsigned char *A,
                                                  const unsigned char *B) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
        wg_m64n64k16_ss<0>(d, wg_desc(A + kk * 2048, 1024, 128),
                           wg_desc_sw128(B + (kk >> 2) * 8192 + (kk & 3) * 32, 1, 1024), kk > 0);
}

// D (64 x 64, d[32]) = A B^T over 128 columns as wg_tile_abt128_sw, with A held in
// registers: a[kk] the A fragment of columns 16kk .. 16kk+15 (wg_tile_frags_a). Reading A
// from registers halves the shared-memory bytes of an m64n64 product (an SS one reads 4 KB
// per 65,536 MACs: the 128 bytes a clock shared memory delivers at the tensor cores' full
// rate). Issued only: a wg_fence() must come between the last write of a's registers (or of
// d's) and this call, and a must stay unchanged until the products are waited for.
__device__ __forceinline__ void wg_tile_abt128_rs_sw(float *d, const uint32_t (*a)[4],
                                                     const unsigned char *B) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
        wg_m64n64k16_rs<0>(d, a[kk], wg_desc_sw128(B + (kk >> 2) * 8192 + (kk & 3) * 32, 1, 1024),
                           kk > 0);
}

// ---- 64 x 128 bf16 tiles in the core-matrix layout: element (row r, col d) at byte
// (d/8)*1024 + r*16 + (d%8)*2; K-major descriptors LBO = 1024, SBO = 128; the MN-major view
// of rows 16i.. starts at byte 256 i with LBO = 128, SBO = 1024.
#ifndef ABW_NO_WGMMA
// Copies 64 rows of 128 bf16 (16-byte chunks by cp.async; rowptr(r) or NULL -> zeros) into
// a core-matrix tile; threads tid = 0 .. NT-1 take part. A warp writes 8 rows x 4 chunks
// per instruction: 512 contiguous shared bytes (no bank conflict) from 8 runs of 64
// global bytes.
template <int NT = 128, typename RowFn>
__device__ __forceinline__ void abw_load_tile(unsigned char *dst, RowFn rowptr, int tid,
                                              const bf16 *safe) {
    for (int idx = tid; idx < 64 * 16; idx += NT) {
        int blk = idx >> 5, lane = idx & 31;
        int r = (blk & 7) * 8 + (lane & 7), c = (blk >> 3) * 4 + (lane >> 3);
        const bf16 *src = rowptr(r);
        cp_async16(dst + c * 1024 + r * 16, src ? src + c * 8 : safe, src != nullptr);
    }
}

// As abw_load_tile, into the 128-byte swizzled layout of a 64-row tile (TMA's, for
// wg_desc_sw128): element (r, d) at byte (d/64)*8192 + r*128 + ((d%64/8) ^ (r%8))*16 +
// (d%8)*2 (the dynamic shared-memory base is 1024-aligned, as the swizzle needs). 8 threads
// write one row's 8 chunks of a panel: 128 contiguous bytes.
template <int NT = 128, typename RowFn>
__device__ __forceinline__ void abw_load_tile_sw(unsigned char *dst, RowFn rowptr, int tid,
                                                 const bf16 *safe) {
    for (int idx = tid; idx < 64 * 16; idx += NT) {
        int r = idx >> 4, c = idx & 15;  // row, 16-byte chunk (8 columns)
        const bf16 *src = rowptr(r);
        unsigned char *d = dst + (c >> 3) * 8192 + r * 128 + (((c & 7) ^ (r & 7)) << 4);
        cp_async16(d, src ? src + c * 8 : safe, src != nullptr);
    }
}

__device__ __forceinline__ void abw_fence_acc(float *d, int n) {
#pragma unroll
    for (int i = 0; i < n; i++) wg_fence_reg(d[i]);
}

// The A fragments of a 64 x 128 core-matrix tile for a warpgroup's RS products: warp w
// (0..3) of the warpgroup gets rows 16w .. 16w+15, a[kk] columns 16kk .. 16kk+15 in the
// mma.sync m16n8k16 A layout (the layout wgmma takes A in registers; ldsm_a's matrices:
// lanes 8i .. 8i+7 address matrix i's 8 rows, 16 contiguous bytes each: no bank
// conflict). 32 registers per thread; the tile must be complete and visible to the warp.
__device__ __forceinline__ void wg_tile_frags_a(uint32_t (*a)[4], const unsigned char *tile,
                                                int warp, int lane) {
    const int r = 16 * warp + 8 * ((lane >> 3) & 1) + (lane & 7), c8 = lane >> 4;
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
        ldsm_x4(a[kk], (const bf16 *)(tile + (2 * kk + c8) * 1024 + r * 16));
}
#endif  // !ABW_NO_WGMMA

// ---- mbarriers (shared::cta, no cluster) and named barriers, for the warp-specialized
// kernels: a producer warpgroup fills stages, consumer warpgroups wait and release them.
// Their setmaxnreg splits (producer 40, consumers 152 or 232) are sized to the register
// count the kernel starts at (65,536 / its launch bound's threads); building them with a
// lower -maxrregcount would leave setmaxnreg.inc waiting for registers that never free.
#ifndef ABW_NO_WGMMA
__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(
                     smem_u32(bar))
                 : "memory");
}
// Arrives on bar when every cp.async this thread issued before has landed (the arrival
// counts against the barrier's expected count: .noinc).
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar))
                 : "memory");
}
// Waits until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}
// Traps unless p (shared memory) is 1024-byte aligned, as TMA's and wgmma's 128-byte swizzle
// need of a tile's start: the kernels that swizzle check their dynamic shared-memory base
// once (CUDA gives it that alignment when a kernel has no static shared memory).
__device__ __forceinline__ void abw_check_align1024(const void *p) {
    if (smem_u32(p) & 1023) __trap();
}
__device__ __forceinline__ void named_bar_sync(int id, int nthreads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
// TMA: one 3-D box of a tensor map into shared memory, completing on bar (its expected
// bytes set by mbar_arrive_expect_tx). tmap: the generic address of a __grid_constant__ CUtensorMap.
__device__ __forceinline__ void tma_load_3d(void *dst, const void *tmap, uint64_t *bar, int c0,
                                            int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_u32(dst)),
        "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
        : "memory");
}
// Arrives on bar (one arrival) and adds bytes to the transfer count its phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int nthreads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}

// The set-up of the FA3-style kernels (attention.cu's variant 3, attention_block_wg.cuh's
// forward), thread 0: checks the shared-memory base's alignment and initialises the
// 4 NST mbarriers at bars: full K, empty K, full V, empty V (NST each); full: one arrival (the
// producer's, with the bytes), empty: one per consumer warp (nwarps).
template <int NST>
__device__ __forceinline__ void fa3_init(const void *smem, uint64_t *bars, int nwarps) {
    abw_check_align1024(smem);
    for (int i = 0; i < NST; i++) {
        mbar_init(&bars[i], 1);
        mbar_init(&bars[NST + i], nwarps);
        mbar_init(&bars[2 * NST + i], 1);
        mbar_init(&bars[3 * NST + i], nwarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The FA3-style kernels' per-tile pieces (the same two callers). K and V tiles: 128 rows x
// 128 columns in two 128-byte-swizzled panels of 16 KB; Qw: a 64 x 128 core-matrix tile.
#define FA3_TILE_BYTES (128 * 128 * 2)
// S (m64n128 f32 accumulator sc, 64 per thread) = Qw Kt^T: issued and committed.
__device__ __forceinline__ void fa3_issue_s(float *sc, const unsigned char *Qw,
                                            const unsigned char *Kt) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
        wg_m64n128k16_ss(sc, wg_desc(Qw + kk * 2048, 1024, 128),
                         wg_desc_sw128(Kt + (kk >> 2) * (FA3_TILE_BYTES / 2) + (kk & 3) * 32, 1,
                                       1024),
                         kk > 0);
    wg_commit();
}
// O (m64n128 f32 accumulator acc) += P Vt, P as 8 A fragments pa (keys 16kk ..): issued
// and committed.
__device__ __forceinline__ void fa3_issue_pv(float *acc, uint32_t (*pa)[4],
                                             const unsigned char *Vt) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
        wg_m64n128k16_rs<1>(acc, pa[kk], wg_desc_sw128(Vt + kk * 2048, FA3_TILE_BYTES / 2, 1024));
    wg_commit();
}
// P's registers stay live until its product is waited for.
__device__ __forceinline__ void fa3_fence_pa(uint32_t (*pa)[4]) {
#pragma unroll
    for (int i = 0; i < 32; i++) wg_fence_reg(pa[i / 4][i % 4]);
}
// P (f32 C fragments sc, 16 n-tiles) to bf16 A fragments pa (8 k-steps of 16 keys).
__device__ __forceinline__ void fa3_to_a(uint32_t (*pa)[4], float (*sc)[4]) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++) c_to_a(pa[kk], sc[2 * kk], sc[2 * kk + 1]);
}
#endif

// A tensor map of a (T, nh, 128) bf16 tensor (rows of nh heads of 128 values: the Q, K, V
// or dO of attention) for TMA boxes of box_rows rows x box_heads heads x 64 columns,
// 128-byte swizzled (wg_desc_sw128; a box lands as box_rows x box_heads rows of 128 bytes,
// head fastest; rows past T or heads past nh read as zeros). base: 16-byte aligned device
// memory, T >= 1, box_rows, box_heads <= 256. cuTensorMapEncodeTiled is reached through the
// runtime (no link to libcuda); a failure is a programming error: message and abort.
static inline CUtensorMap abw_head_tensor_map(const void *base, int T, int nh, int box_heads,
                                               int box_rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (!encode) {
        cudaDriverEntryPointQueryResult qr;
        cuda_check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode,
                                                    12000, cudaEnableDefault, &qr));
        if (qr != cudaDriverEntryPointSuccess || !encode) {
            fprintf(stderr, "ops cuda attention: cuTensorMapEncodeTiled not found in the driver\n");
            abort();
        }
    }
    CUtensorMap m;
    cuuint64_t dim[3] = {128, (cuuint64_t)nh, (cuuint64_t)T};
    cuuint64_t stride[2] = {128 * 2, (cuuint64_t)nh * 128 * 2};  // bytes, dims 1 and 2
    cuuint32_t box[3] = {64, (cuuint32_t)box_heads, (cuuint32_t)box_rows}, estride[3] = {1, 1, 1};
    CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dim, stride, box,
                        estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr,
                "ops cuda attention: cuTensorMapEncodeTiled failed (%d) for T %d, %d heads, box %d "
                "x %d\n",
                (int)r, T, nh, box_rows, box_heads);
        abort();
    }
    return m;
}

// Whether the current device runs the sm_90a code of the wgmma kernels (compute capability 9.0).
static inline bool abw_supported() {
    static int cc = -1;  // major * 10 + minor, once per process (one device per process)
    if (cc < 0) {
        int dev = 0, major = 0, minor = 0;
        cuda_check(cudaGetDevice(&dev));
        cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        cc = major * 10 + minor;
    }
    return cc == 90;
}
