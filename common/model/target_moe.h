/* Internal to the target (common/model/target.c, target_moe.c): the sparse MoE block of a
 * Qwen3-MoE decoder layer (transformers modeling_qwen3_moe.py Qwen3MoeSparseMoeBlock):
 *   p = softmax(xn . router^T) (T, E);  top-k experts per token (moe_route);
 *   out[t] = sum_j w[t,j] * down_e(silu(gate_e(xn[t])) * up_e(xn[t])),  e = idx[t,j]
 * run as grouped GEMMs: tokens sorted by expert (moe_permute), gathered, one GEMM per
 * expert over its M_e rows, combined back weighted (moe_combine). Not a public header. */
#ifndef DL_MODEL_TARGET_MOE_H
#define DL_MODEL_TARGET_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "common/format/gguf.h"
#include "common/model/config.h"
#include "common/model/target.h"
#include "common/ops/ops.h"

/* One MoE layer's weights, act on the backend. wg/wu/wd hold E pointers each, to expert
 * e's (Fm, D), (Fm, D), (D, Fm) matrices: slices of the stacked buffers in stack[], whatever
 * the file's layout (HF per-expert tensors are stacked at load; GGUF *_exps, HF fused
 * experts.gate_up_proj are stacked already). */
typedef struct {
    void *router;            /* (E, D) mlp.gate.weight */
    void **wg, **wu, **wd;   /* (E) pointers into stack[] */
    void *stack[3];          /* owned: gate (E, Fm, D) or fused gate_up (E, 2Fm, D); up
                              * (E, Fm, D) or NULL (fused); down (E, D, Fm) */
} target_moe_t;

/* Scratch of the MoE block for chunks of up to `chunk` tokens (backend unless _h). */
typedef struct {
    void *rlog;              /* (chunk, E) act router logits */
    int32_t *idx, *off, *tok, *inv;  /* (chunk*k), (E+1), (chunk*k), (chunk*k) i32 */
    float *w;                /* (chunk*k) f32 routing weights */
    void *xs;                /* (chunk*k, D) act gathered rows, then the experts' outputs */
    int32_t *off_h;          /* (E+1) host copy of off */
    int64_t *counts_h;       /* (L, E) host: tokens routed per layer and expert, summed over the
                              * forwards since target_moe_count_routes(t, 1); NULL until then */
    int counting;            /* 1: the forward adds to counts_h */
} target_moe_scratch_t;

/* Loads a GGUF stacked expert tensor (ggml ne [cols, rows, E]), dequantized, into a new
 * backend buffer *dst of (E, rows, cols) act. path names the file in errors. Returns 1
 * when loaded, 0 when the tensor is absent (*dst NULL), DL_EFORMAT (shape, type),
 * DL_ENOMEM. *bytes += backend bytes. */
int target_moe__load_gguf_stacked(const ops_ctx_t *c, gguf_t *g, const char *path, const char *name,
                                  int E, int rows, int cols, void **dst, size_t *bytes);
/* Points y->wg/wu/wd[e] into y->stack[]: gate_up fused = 1 means stack[0] is (E, 2Fm, D)
 * with gate rows first (HF Qwen3MoeExperts.gate_up_proj, chunk(2) order) and stack[1]
 * unused; else stack[0], stack[1] are (E, Fm, D) gate, up. stack[2] is (E, D, Fm) down. */
void target_moe__point_stacked(target_moe_t *y, int E, int Fm, int D, size_t ab, int fused);
/* Allocates y's pointer arrays (E each). DL_ENOMEM. */
int target_moe__alloc(target_moe_t *y, int E);
/* Frees y's buffers on c and its arrays; y zeroed. */
void target_moe__free(const ops_ctx_t *c, target_moe_t *y);

int target_moe__scratch_new(const ops_ctx_t *c, const model_config_t *m, int chunk,
                            target_moe_scratch_t *s);
void target_moe__scratch_free(const ops_ctx_t *c, target_moe_scratch_t *s);

/* out (n, D) act = the MoE block of layer l of xin (n, D) act; n <= chunk. gate, up, h:
 * (chunk*k*Fm) act scratch. out may alias xin. One download of the expert offsets per call
 * (the host sizes the per-expert GEMMs): synchronises the stream on CUDA; when s->counting,
 * s->counts_h[l*E + e] += rows of expert e from that same download (no extra sync).
 * On CUDA the per-expert GEMMs take ops_cuda_moe_gemm (row-count-bucketed cuBLASLt plans). */
void target_moe__forward(const ops_ctx_t *c, const model_config_t *m, const target_moe_t *y,
                         target_moe_scratch_t *s, void *gate, void *up, void *h, void *out,
                         const void *xin, int n, int l);

/* The target's MoE scratch (common/model/target.c; all zero for a dense target). */
target_moe_scratch_t *target__moe_scratch(target_t *t);

/* Routing statistics for benchmarks (bench/bench_target.c). on = 1 starts counting the
 * tokens routed to each expert of each MoE layer, zeroing earlier counts (allocates (L, E)
 * int64 on the host on first use); on = 0 stops (the counts stay readable). Counting costs
 * no device sync beyond the one the forward already has. Returns 0, DL_EINVAL (not an MoE
 * target), DL_ENOMEM. */
int target_moe_count_routes(target_t *t, int on);
/* The counts: (L, E) int64, row l all zero for a dense layer; NULL before the first
 * target_moe_count_routes(t, 1). Owned by the target, valid until target_destroy. */
const int64_t *target_moe_route_counts(target_t *t);

/* Balance of counts (L, E) over the MoE layers of m (each with sum > 0): per layer
 * max / mean tokens per expert; *worst_layer the layer with the largest ratio (-1 if
 * none), returns that ratio (0 if none); ratio[] (L) when not NULL, 0 for dense layers.
 * *routed = total routed (token, expert) pairs. */
double target_moe_balance(const model_config_t *m, const int64_t *counts, double *ratio,
                          int *worst_layer, int64_t *routed);

#endif
