/* Extras of the CUDA backend beyond the ops.h table, for benchmarks and tests
 * (C-callable; CUDA builds only). */
#ifndef DL_OPS_CUDA_OPS_CUDA_H
#define DL_OPS_CUDA_OPS_CUDA_H

#include <stdint.h>

#include "common/ops/ops.h"

/* attention_varlen_forward with a chosen kernel: 0 = the built-in default (7),
 * 1 = 64 query rows per block (16 per warp, 64-key tiles), 2 = 128 rows per block
 * (32 per warp, 32-key tiles), 3 = 128 rows, 64-key tiles, 4-6 = 128 or 192 rows as
 * warpgroups on Hopper's wgmma (4: 2 warpgroups, 2 blocks per SM; 5: 2 warpgroups, 1
 * block; 6: 3 warpgroups, 1 block), 7, 8 = as 6, warp-specialized (a producer warpgroup
 * fills 3 (7) or 4 (8) K/V stages behind mbarriers); 4-8 need head dim 128, a compute
 * capability 9.0 GPU and 16-byte aligned q, k, v, else variant 3 runs
 * (ops_cuda_attention_varlen_resolve says which). A variant outside
 * 0..OPS_CUDA_ATTN_VARLEN_VARIANTS is a programming error: message and abort. Same
 * contract as ops_impl_t.attention_varlen_forward. */
#define OPS_CUDA_ATTN_VARLEN_VARIANTS 8
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
 * device: the variant itself, or 3 where a wgmma variant does not apply. -1 for a
 * variant outside 0..OPS_CUDA_ATTN_VARLEN_VARIANTS. */
int ops_cuda_attention_varlen_resolve(int variant, int hd);

/* Selects the DFlash block-attention kernels used by the ops table's
 * attention_block_forward / _backward from then on (process-wide; for benchmarks and
 * tests, set it before any call, not while a stream runs them): 1 = one block per thread
 * block, 64-key dK/dV tiles; 2 = pairs of consecutive blocks per thread block (shared
 * K/V tiles; 64-key tiles forward, 32 in dQ), 128-key dK/dV context tiles; 3 = as 2 with
 * 32-key tiles forward and 16 in dQ; 4 = as 2 with the dK/dV context tiles on Hopper's
 * wgmma (head dim 128; other head dims as 2); 5 = as 4 with the forward on wgmma too
 * (head dim 128, H = 4 Hkv, B <= 16; otherwise as 4); 6 = as 5 with dQ on wgmma too;
 * 7, 8 = as 5 with two warpgroups (128 context keys) per dK/dV thread block sharing each
 * staged work item, 4 or 3 items staged (3 or 2 of them fetched ahead); 9 = as 7 with
 * the dK/dV context tiles warp-specialized (a producer warpgroup stages the items behind
 * mbarriers; the same bits as 7); 10 = as 9 with dQ on a warp-specialized wgmma kernel
 * (the bits of 6's dQ); 11 = as 10 with the forward on it too (the bits of 5-10's
 * forward); 0 = the default (11: forward 7.6, dQ 8.7, dK/dV 13.8 ms against 8.6, 12.2,
 * 22.3 for 7 on an H200, bench/NOTES.md).
 * Values outside 0..OPS_CUDA_ATTN_BLOCK_VARIANTS change nothing.
 * Same results within
 * rounding (f32 sums in another order); each variant is deterministic. variant < 0 only
 * queries. Returns the variant in use before the call. */
#define OPS_CUDA_ATTN_BLOCK_VARIANTS 11
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

#endif
