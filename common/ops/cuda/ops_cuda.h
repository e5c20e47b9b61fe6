/* Extras of the CUDA backend beyond the ops.h table, for benchmarks and tests
 * (C-callable; CUDA builds only). */
#ifndef DL_OPS_CUDA_OPS_CUDA_H
#define DL_OPS_CUDA_OPS_CUDA_H

#include <stdint.h>

#include "common/ops/ops.h"

/* attention_varlen_forward with a chosen kernel: 0 = the built-in default (3), 1 = mma.sync
 * (128 query rows per thread block, 64-key tiles; any head dim <= 128, any GPU), 2 = Hopper
 * wgmma, warp-specialized (3 consumer warpgroups of 64 queries, a producer warpgroup filling
 * 64-key K/V stages by cp.async behind mbarriers), 3 = FlashAttention-3's forward (TMA loads
 * of 128-key K/V tiles, 2 consumer warpgroups of 64 queries taking turns on the tensor
 * cores); 2 and 3 need head dim 128, a compute capability 9.0 GPU and 16-byte aligned q, k,
 * v, else variant 1 runs (ops_cuda_attention_varlen_resolve says which). A variant outside
 * 0..OPS_CUDA_ATTN_VARLEN_VARIANTS is a programming error: message and abort. Same
 * contract as ops_impl_t.attention_varlen_forward. */
#define OPS_CUDA_ATTN_VARLEN_VARIANTS 3
void ops_cuda_attention_varlen_forward_variant(const ops_ctx_t *c, int variant, void *out,
                                               const void *q, const void *k, const void *v,
                                               const int32_t *cu_seqlens, int nseq,
                                               int max_seqlen, int T, int H, int Hkv, int hd);

/* Selects the kernel of the ops table's attention_varlen_forward from then on
 * (process-wide; for benchmarks, set before any call): the variants above, 0 = the
 * built-in default. Values outside 0..OPS_CUDA_ATTN_VARLEN_VARIANTS change nothing;
 * variant < 0 only queries.
 * Returns the variant in use before the call. */
int ops_cuda_attention_varlen_variant(int variant);

/* The kernel that ops_cuda_attention_varlen_forward_variant runs for a variant (0: the
 * built-in default) at head dim hd with 16-byte aligned q, k, v on this process's
 * device: the variant itself, or 1 where the wgmma variants (2, 3) do not apply. -1 for a
 * variant outside 0..OPS_CUDA_ATTN_VARLEN_VARIANTS. */
int ops_cuda_attention_varlen_resolve(int variant, int hd);

/* Selects the DFlash block-attention kernels used by the ops table's
 * attention_block_forward / _backward from then on (process-wide; for benchmarks and
 * tests, set it before any call, not while a stream runs them): 1 = mma.sync (a pair of
 * consecutive blocks per thread block sharing K/V tiles for the forward and dQ; key-major
 * dK/dV in 64-key tiles; any head dim <= 128, any GPU); 2 = Hopper wgmma, warp-specialized
 * (forward, dQ and the dK/dV context tiles; head dim 128 on a compute capability 9.0 GPU,
 * forward and dQ also H = 4 Hkv, B <= 16 and Tc > 0; elsewhere as 1), the blocks' own dK/dV
 * on a warp per block and kv head (B <= 16, any head dim and GPU); 3 = 2 with the forward
 * FlashAttention-3's way (128-key tiles by TMA, the two warpgroups taking turns; where 2's
 * forward applies); 4 = 3 with dQ's S = Q K^T and dP = dO V^T taking Q and dO from
 * registers (A fragments) instead of shared memory; 0 = the default (4). On an H200
 * (bench/NOTES.md): forward 10.0 / 5.8 / 5.5 ms for 1 / 2 / 3-4, dK/dV 30.7 / 10.1 for 1 /
 * 2-4, dQ 12.3 for 1 and, in one call at ncu's base clocks, 8.81 for 2-3 and 7.60 for 4.
 * Values outside 0..OPS_CUDA_ATTN_BLOCK_VARIANTS change nothing. Same results within
 * rounding (f32 sums in another order); each variant is deterministic. variant < 0 only
 * queries. Returns the variant in use before the call. */
#define OPS_CUDA_ATTN_BLOCK_VARIANTS 4
int ops_cuda_attention_block_variant(int variant);

/* The MoE experts' forward GEMMs: for each expert e with rows [off_h[e], off_h[e+1]),
 * out[r] (N) = x[r] (K) . w[e] (N, K)^T, r in those rows. out (R, N) bf16, x (R, K) bf16,
 * w (E) device pointers to (N, K) bf16, off_h (E+1) i32 HOST offsets (non-decreasing,
 * off_h[0] = 0, R = off_h[E]). The contract of ops_impl_t.matmul_forward per expert (bf16,
 * f32 accumulation; the cuBLASLt algorithm may differ from the exact-M one), with plans
 * keyed by a row bucket of M, not M: no plan made per call as row counts change
 * (common/ops/cuda/matmul.cu). Stream-ordered on c's stream; no sync. */
void ops_cuda_moe_gemm(const ops_ctx_t *c, void *out, const void *x, void *const *w,
                       const int32_t *off_h, int E, int K, int N);

/* The configuration of a cuBLASLt algorithm (algo: a cublasLtMatmulAlgo_t *), as
 * cublasLtMatmulAlgoConfigGetAttribute reads it, into cfg[OPS_CUDA_GEMM_CFG]: ALGO_ID,
 * TILE_ID, STAGES_ID, SPLITK_NUM, REDUCTION_SCHEME, CTA_SWIZZLING, CUSTOM_OPTION,
 * INNER_SHAPE_ID, CLUSTER_SHAPE_ID (an attribute this cuBLASLt lacks reads -1). For the
 * per-shape picks of common/ops/cuda/matmul.cu and bench_gemm, which prints them. */
#define OPS_CUDA_GEMM_CFG 9
void ops_cuda_gemm_algo_config(const void *algo, int32_t cfg[OPS_CUDA_GEMM_CFG]);

/* Whether GEMM plans made from then on take matmul.cu's per-shape picks (GEMM_PICKS:
 * another of cuBLASLt's candidates for the Qwen3-8B-sized layers and the drafter's LM head,
 * measured faster on an H200 at its power cap, with cuBLASLt 13.1 only:
 * ops_cuda_gemm_picks_measured) or always the heuristic's first: 1 (the
 * default) / 0; -1 only queries. Process-wide; plans already made keep their algorithm,
 * so set it before the first GEMM (benchmarks' A/B). Returns the setting before the call. */
int ops_cuda_gemm_picks(int on);

/* 1 when this process's cuBLASLt is the version GEMM_PICKS was measured with (13.1): only
 * then are the picks taken; elsewhere every plan takes the heuristic's first choice. */
int ops_cuda_gemm_picks_measured(void);

/* How many GEMM plans of this process took a GEMM_PICKS candidate (tests). */
int ops_cuda_gemm_picks_taken(void);

#endif
