/* Extras of the CUDA backend beyond the ops.h table, for benchmarks and tests
 * (C-callable; CUDA builds only). */
#ifndef DL_OPS_CUDA_OPS_CUDA_H
#define DL_OPS_CUDA_OPS_CUDA_H

#include <stdint.h>

#include "common/ops/ops.h"

/* attention_varlen_forward with a chosen kernel: 0 = the default used by the
 * ops table, 1 = 64 query rows per block (16 per warp, 64-key tiles),
 * 2 = 128 rows per block (32 per warp, 32-key tiles), 3 = 128 rows, 64-key
 * tiles. Same contract as ops_impl_t.attention_varlen_forward. */
void ops_cuda_attention_varlen_forward_variant(const ops_ctx_t *c, int variant, void *out,
                                               const void *q, const void *k, const void *v,
                                               const int32_t *cu_seqlens, int nseq,
                                               int max_seqlen, int T, int H, int Hkv, int hd);

#endif
