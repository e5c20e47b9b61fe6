/* Compute operations: one interface, two backends.
 *
 * Model code (target transformer, DFlash drafter) is written once against the
 * ops_* calls below. An ops_ctx_t picks the backend through its impl table:
 *   - CPU  (common/ops/cpu/):  fp32 everywhere, OpenBLAS GEMMs, OpenMP threads.
 *                              The reference implementation.
 *   - CUDA (common/ops/cuda/): activations and working weights bf16, fp32
 *                              accumulation, cuBLASLt GEMMs, own kernels.
 *
 * Dtype words used below:
 *   act  = the backend's activation/working-weight dtype: fp32 on CPU, bf16 on CUDA.
 *   f32  = fp32 on both backends (statistics, gradients of parameters, master
 *          weights, optimizer moments, losses).
 *   i32  = int32 on both backends.
 * All pointers are backend memory (host on CPU, device on CUDA) unless named
 * *_host. Shapes are row-major, written (rows, cols); letters: T tokens, D
 * hidden size, H query heads, Hkv key/value heads, hd head dim, F MLP size,
 * V vocab, Nb blocks, B block size.
 *
 * Gradient conventions (llm.c): parameter gradients ACCUMULATE (+=) into f32
 * buffers; activation gradients are ASSIGNED (=). A NULL gradient pointer means
 * "not needed" and is skipped.
 *
 * Errors: shape arguments are the caller's contract (checked with assert in
 * debug builds); CUDA errors abort the stage through cuda_check (the supervisor
 * restarts it). Functions are asynchronous on CUDA (ordered on ctx->stream).
 */
#ifndef DL_OPS_OPS_H
#define DL_OPS_OPS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { OPS_CPU = 0, OPS_CUDA = 1 } ops_backend_t;

typedef struct ops_impl ops_impl_t;

typedef struct ops_ctx {
    ops_backend_t backend;
    const ops_impl_t *impl;
    int device;              /* CUDA device ordinal (CUDA only) */
    void *stream;            /* cudaStream_t (CUDA only) */
    void *blas;              /* cublasLtHandle_t (CUDA only) */
    void *workspace;         /* GEMM workspace (CUDA only) */
    size_t workspace_bytes;
    int nthreads;            /* OpenMP threads (CPU); 0 = library default */
} ops_ctx_t;

/* RoPE frequency parameters (HF `rope_theta`, `rope_scaling`). */
typedef struct {
    double theta;            /* base, e.g. 10000 or 1e6 */
    int llama3;              /* 1 if rope_scaling.rope_type == "llama3" */
    double factor, low_freq_factor, high_freq_factor;
    int original_max_position_embeddings;
} rope_params_t;

/* normal_init's segments and near list (see there). */
typedef struct {
    uint64_t gstart;   /* the segment's first normal */
    uint64_t offset;   /* its first element in dst */
    uint64_t numel;    /* normals (and elements) in it */
} ops_normal_seg_t;
typedef struct {
    uint64_t index;    /* the element of dst */
    uint64_t draw[2];  /* the normal's two rng_u64 draws, in order */
    float value;       /* what the device wrote there */
    uint32_t pad;
} ops_normal_near_t;

/* The backend table. Every entry is required, but for those that say NULL is allowed. */
struct ops_impl {
    const char *name;
    /* memory */
    void *(*malloc_)(const ops_ctx_t *c, size_t bytes);
    void (*free_)(const ops_ctx_t *c, void *p);
    void (*memset0)(const ops_ctx_t *c, void *p, size_t bytes);
    void (*copy)(const ops_ctx_t *c, void *dst, const void *src, size_t bytes); /* same backend */
    void (*upload)(const ops_ctx_t *c, void *dst, const void *src_host, size_t bytes);
    void (*download)(const ops_ctx_t *c, void *dst_host, const void *src, size_t bytes);
    void (*sync)(const ops_ctx_t *c);
    /* dtype conversion: host f32 -> act on the backend, and back */
    void (*upload_act)(const ops_ctx_t *c, void *dst_act, const float *src_host, size_t n);
    void (*download_act)(const ops_ctx_t *c, float *dst_host, const void *src_act, size_t n);
    void (*act_to_f32)(const ops_ctx_t *c, float *dst, const void *src_act, size_t n);
    void (*f32_to_act)(const ops_ctx_t *c, void *dst_act, const float *src, size_t n);

    /* out (M,N) act = inp (M,K) act . weight (N,K) act ^T + bias (N) act (bias may be NULL).
     * Weight layout is torch.nn.Linear's (out_features, in_features). */
    void (*matmul_forward)(const ops_ctx_t *c, void *out, const void *inp, const void *weight,
                           const void *bias, int M, int K, int N);
    /* dinp (M,K) act = dout . weight (dinp_acc = 0: ASSIGNED), or dinp += dout . weight
     * (dinp_acc != 0: accumulated, e.g. a tensor's input gradient summed over the GEMMs
     * that read it; CPU: the product as for = into a temporary, then add(dinp, dinp, tmp),
     * the same bits as the two calls; CUDA: beta = 1 in the GEMM);
     * dweight (N,K) f32 += dout^T . inp; dbias (N) f32 += sum_rows dout.
     * dinp must not overlap dout, inp or weight. */
    void (*matmul_backward)(const ops_ctx_t *c, void *dinp, float *dweight, float *dbias,
                            const void *dout, const void *inp, const void *weight,
                            int M, int K, int N, int dinp_acc);
    /* out (N,C) act = inp * rsqrt(mean(inp^2) + eps) * weight (C) act; rstd (N) f32 saved
     * (may be NULL). HF LlamaRMSNorm / Qwen3RMSNorm: normalise in fp32, then scale. */
    void (*rmsnorm_forward)(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                            const void *weight, float eps, int N, int C);
    /* dinp (N,C) act = ...; dweight (C) f32 +=. */
    void (*rmsnorm_backward)(const ops_ctx_t *c, void *dinp, float *dweight, const void *dout,
                             const void *inp, const void *weight, const float *rstd, int N, int C);
    /* In place on x (N, nh, hd) act: HF rotate_half RoPE (first half / second half of
     * each head), angle = pos[n] * inv_freq[i], pos (N) i32, inv_freq (hd/2) f32. */
    void (*rope_forward)(const ops_ctx_t *c, void *x, const int32_t *pos, const float *inv_freq,
                         int N, int nh, int hd);
    /* In place on dx (N, nh, hd) act: the transpose of rope_forward (rotation by -angle). */
    void (*rope_backward)(const ops_ctx_t *c, void *dx, const int32_t *pos, const float *inv_freq,
                          int N, int nh, int hd);
    /* out (n) act = silu(gate) * up, elementwise. */
    void (*swiglu_forward)(const ops_ctx_t *c, void *out, const void *gate, const void *up, size_t n);
    /* dgate, dup (n) act = d/dgate, d/dup of silu(gate)*up times dout. */
    void (*swiglu_backward)(const ops_ctx_t *c, void *dgate, void *dup, const void *dout,
                            const void *gate, const void *up, size_t n);
    /* out (T,C) act = table[ids[t]] with table (V,C) act, ids (T) i32 (caller validated < V). */
    void (*embedding_forward)(const ops_ctx_t *c, void *out, const int32_t *ids, const void *table,
                              int T, int C);
    /* out (n) act = a + b (out may alias a or b). */
    void (*add)(const ops_ctx_t *c, void *out, const void *a, const void *b, size_t n);
    /* y (n) act += alpha * x; for residual gradients. */
    void (*axpy)(const ops_ctx_t *c, void *y, float alpha, const void *x, size_t n);

    /* Causal self-attention over a packed batch of variable-length sequences.
     * q (T,H,hd), k v (T,Hkv,hd) act, out (T,H,hd) act; cu_seqlens (nseq+1) i32 on the
     * backend, token t of sequence s attends to tokens [cu[s], t]. GQA: head h uses
     * kv head h / (H/Hkv). scale = 1/sqrt(hd). No (T,T) matrix is materialised on CUDA.
     * cu_seqlens[nseq] <= T, and every k, v row below T must be finite: the CUDA kernels
     * read whole tiles and weigh the rows past a sequence's end by 0 (0 x NaN is NaN). */
    void (*attention_varlen_forward)(const ops_ctx_t *c, void *out, const void *q, const void *k,
                                     const void *v, const int32_t *cu_seqlens, int nseq,
                                     int max_seqlen, int T, int H, int Hkv, int hd);

    /* DFlash block attention (drafter). Nb blocks of B query tokens each.
     * q (Nb*B,H,hd) act; block keys/values kb vb (Nb*B,Hkv,hd) act; context keys/values
     * kc vc (Tc,Hkv,hd) act (the target features projected by this layer's k/v_proj).
     * Block j sees context rows [ctx_start[j], ctx_start[j] + ctx_len[j]) (ctx_len may be
     * 0) and all B rows of its own block (bidirectional); nothing else.
     * out (Nb*B,H,hd) act; lse (Nb*B,H) f32 log-sum-exp saved for backward (may be NULL).
     * ctx_start, ctx_len (Nb) i32. scale = 1/sqrt(hd). Every kc, vc row below Tc must be
     * finite, seen or not (the CUDA kernels read whole tiles and weigh the unseen rows by 0:
     * 0 x NaN is NaN): a KV cache is zeroed when made. */
    void (*attention_block_forward)(const ops_ctx_t *c, void *out, float *lse, const void *q,
                                    const void *kb, const void *vb, const void *kc, const void *vc,
                                    const int32_t *ctx_start, const int32_t *ctx_len,
                                    int Nb, int B, int Tc, int H, int Hkv, int hd);
    /* Gradients of attention_block_forward. dq (Nb*B,H,hd), dkb dvb (Nb*B,Hkv,hd),
     * dkc dvc (Tc,Hkv,hd) act, all ASSIGNED (the op zeroes dkc/dvc first, then sums the
     * contributions of every block that sees a context row). */
    void (*attention_block_backward)(const ops_ctx_t *c, void *dq, void *dkb, void *dvb,
                                     void *dkc, void *dvc, const void *dout, const void *out,
                                     const float *lse, const void *q, const void *kb,
                                     const void *vb, const void *kc, const void *vc,
                                     const int32_t *ctx_start, const int32_t *ctx_len,
                                     int Nb, int B, int Tc, int H, int Hkv, int hd);

    /* Cross-entropy on one chunk of logits, forward and backward together.
     * logits (N,V) act, overwritten in place by dlogits = w[n] * grad_scale *
     * (softmax(logits[n]) - onehot(targets[n])); rows with w[n] == 0 get zeros.
     * targets (N) i32, w (N) f32 per-row loss weight (DFlash: exp(-(k-1)/gamma) * mask).
     * loss (N) f32 = w[n] * -log softmax(logits[n])[targets[n]] (ASSIGNED);
     * correct (N) f32 = 1 if argmax(logits[n]) == targets[n] else 0 (ties: lowest index).
     * grad_scale: e.g. 1 / (sum of weights of the micro-batch). */
    void (*xent_forward_backward)(const ops_ctx_t *c, void *logits, float *loss, float *correct,
                                  const int32_t *targets, const float *w, float grad_scale,
                                  int N, int V);

    /* out[0] f32 (+)= sum(x^2) over x (n) f32; accumulate=0 assigns. Stays on device. */
    void (*sumsq)(const ops_ctx_t *c, float *out, const float *x, size_t n, int accumulate);
    /* AdamW step on one tensor (Loshchilov & Hutter 2019, decoupled weight decay,
     * bias-corrected moments as torch.optim.AdamW):
     *   g = grad * s,  s = min(1, max_norm / (sqrt(*norm_sq) + 1e-6)) (clip; max_norm <= 0: s = 1)
     *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
     *   master -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd * master)
     *   work (act) = master (may be NULL on CPU when work == master's storage)
     * master, grad, m, v (n) f32; norm_sq (1) f32 on the backend (from sumsq); t >= 1. */
    void (*adamw)(const ops_ctx_t *c, float *master, void *work, const float *grad, float *m,
                  float *v, size_t n, float lr, float b1, float b2, float eps, float wd, int t,
                  const float *norm_sq, float max_norm);

    /* Strided 2-D copy on the backend (cudaMemcpy2DAsync semantics): `rows` rows of
     * width_bytes each, src rows dst_pitch/src_pitch bytes apart. Used by the target to
     * write captured layer outputs into the (T, n_feat*D) feature matrix, and by the
     * drafter to gather its loss rows (and scatter their gradients back).
     * Added last so positional initialisers of older tables stay valid; model code
     * falls back to per-row copy when NULL. (Model helper; common/ops/cpu/copy2d.c.) */
    void (*copy2d)(const ops_ctx_t *c, void *dst, size_t dst_pitch, const void *src,
                   size_t src_pitch, size_t width_bytes, size_t rows);

    /* out (n) f32 = (a + b) * scale, element-wise, evaluated in exactly that order
     * (one fp32 add, then one fp32 multiply; b == NULL: out = a * scale). out may alias
     * a. The optimizer sums the per-micro-batch gradients of a step in micro-batch
     * order with it (out = g0 + g1, out = out + g2, ..., the last add scaled by
     * 1 / total loss weight), which is bitwise the CPU optimizer's fused loop. On
     * CUDA a and b may be IPC-mapped memory of a peer GPU (read over NVLink/PCIe).
     * (Optimizer helper; common/ops/cpu/add.c.) */
    void (*f32_add_scale)(const ops_ctx_t *c, float *out, const float *a, const float *b,
                          float scale, size_t n);

    /* ---- Mixture of experts (target MoE layers: transformers Qwen3MoeSparseMoeBlock).
     * Letters: E experts, k experts per token (top-k), R = T*k routed rows. A layer runs
     * route -> permute -> gather (embedding_forward with tok as ids) -> per expert e one
     * GEMM chain on its rows [offsets[e], offsets[e+1]) -> combine. (common/ops/cpu/moe.c) */

    /* Router: p = softmax(logits[t]) in f32 over E, then the k largest p in descending
     * order: idx (T,k) i32 expert ids, w (T,k) f32 their p, divided by their sum when norm
     * (norm_topk_prob). logits (T,E) act. Ties: the lower expert id first (torch.topk on
     * CPU orders ties by its libstdc++ partial sort, which no simple rule reproduces; exact
     * ties in p need identical router logits). 1 <= k <= E. */
    void (*moe_route)(const ops_ctx_t *c, int32_t *idx, float *w, const void *logits, int T,
                      int E, int k, int norm);
    /* Counting sort of the R = T*k routed entries by expert, stable by entry (i = t*k + j,
     * so by token): offsets (E+1) i32 prefix sums of the per-expert counts (offsets[0] = 0,
     * offsets[E] = R); tok (R) i32: tok[r] = token of sorted row r; inv (R) i32: inv[i] =
     * sorted row of entry i. idx (T,k) i32 from moe_route (each in [0, E)). */
    void (*moe_permute)(const ops_ctx_t *c, int32_t *offsets, int32_t *tok, int32_t *inv,
                        const int32_t *idx, int T, int E, int k);
    /* Weighted scatter-add back to tokens, written as a gather so it is deterministic:
     * out[t] (D) act = sum over j < k, in j order, of w[t*k+j] * y[inv[t*k+j]], summed in
     * f32 (ASSIGNED). y (R,D) act the experts' outputs in sorted order; inv (R) i32, w (R)
     * f32 from moe_permute / moe_route. out must not alias y. */
    void (*moe_combine)(const ops_ctx_t *c, void *out, const void *y, const int32_t *inv,
                        const float *w, int T, int k, int D);
    /* Bulk host -> backend uploads (the target's weights: GBs at start-up), added last.
     * host_alloc: bytes of host memory the backend copies from fastest (CUDA: pinned,
     * cudaMallocHost; CPU: malloc); NULL on failure; release with host_free.
     * upload_async: like upload, but only queued: src_host (from host_alloc, for a truly
     * asynchronous copy on CUDA) must stay unchanged until the next sync, which is also
     * when dst is ready. CPU: a plain copy. (common/ops/cpu/memory.c, cuda/ops_cuda.cu) */
    void *(*host_alloc)(const ops_ctx_t *c, size_t bytes);
    void (*host_free)(const ops_ctx_t *c, void *p);
    void (*upload_async)(const ops_ctx_t *c, void *dst, const void *src_host, size_t bytes);

    /* ---- FP8 linear (target --target-precision fp8; common/ops/cpu/fp8.c, cuda/matmul_fp8.cu).
     * fp8 = OCP E4M3 (torch.float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa bits,
     * largest finite 448, no infinities. One scale per row of each operand: per output
     * channel for weights (static, at load), per token for activations (dynamic). */

    /* Row-wise quantization: for each row r of x (R,K) act,
     *   s[r] = amax_r / 448 (fp32 division; amax_r = max_k |x[r][k]|; s = 1 when amax_r is 0)
     *   q[r][k] = e4m3(x[r][k] / s[r])  (fp32 division, round to nearest even, saturating to
     *             +-448 as __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); NaN -> 0x7f)
     * q (R,K) fp8, s (R) f32 on the backend. For weights (N,K) at load and activations
     * (M,K) before every fp8 linear. K >= 1. */
    void (*fp8_quantize_rows)(const ops_ctx_t *c, uint8_t *q, float *s, const void *x, int R,
                              int K);
    /* out (M,N) act = (sum_k qx[m][k] * qw[n][k]) * sx[m] * sw[n] + bias[n] (bias (N) act or
     * NULL); products exact, sums in f32. qx (M,K) fp8, sx (M) f32 from fp8_quantize_rows of
     * the input; qw (N,K) fp8, sw (N) f32 of the weight (torch.nn.Linear layout). CUDA:
     * cuBLASLt FP8 GEMM (TN) with outer-vector scales; needs fp8_check(K, N) == 0 first. */
    void (*fp8_matmul_forward)(const ops_ctx_t *c, void *out, const uint8_t *qx, const float *sx,
                               const uint8_t *qw, const float *sw, const void *bias, int M,
                               int K, int N);
    /* 0 when fp8_matmul_forward runs for weights (N,K) on this backend, else DL_ENOTSUP with
     * the reason set (CUDA: device below sm_89, K % 16 or N % 16 not 0, or cuBLASLt has no
     * FP8 algorithm for the shape). CPU: always 0 (exact emulation in fp32). */
    int (*fp8_check)(const ops_ctx_t *c, int K, int N);

    /* ---- Per-head q/k norm + RoPE, fused (drafter attention inputs; Qwen3 q_norm/k_norm,
     * then apply_rotary_pos_emb). Added last, like the groups above.
     * Forward: out (N,nh,hd) act = rope(rmsnorm(inp) * weight) per head row, i.e.
     *   rmsnorm_forward(out, rstd, inp, weight, eps, N*nh, hd), then rope_forward(out, pos,
     *   inv_freq, N, nh, hd); inp (N,nh,hd) act, weight (hd) act, rstd (N*nh) f32 saved
     *   (may be NULL), pos (N) i32, inv_freq (hd/2) f32; hd even. out may alias inp.
     *   CPU: exactly that composition (same bits). CUDA: one pass, f32 math, the
     *   normalised value is not rounded to bf16 before the rotation (one rounding, of out).
     * (common/ops/cpu/qknorm_rope.c, cuda/qknorm_rope.cu) */
    void (*qk_norm_rope_forward)(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                                 const void *weight, float eps, const int32_t *pos,
                                 const float *inv_freq, int N, int nh, int hd);
    /* Backward: rope_backward of dout (N,nh,hd) act, then rmsnorm_backward:
     *   dinp (N,nh,hd) act ASSIGNED (may alias dout; NULL: not needed), dweight (hd) f32 +=
     *   (NULL: not needed), deterministic; dout is not modified unless dinp aliases it.
     *   rstd (N*nh) f32 as saved by the forward; NULL: recomputed with eps. Other arguments
     *   as the forward. CPU: the composition (same bits); CUDA: one pass, f32 math (the
     *   rotated gradient is not rounded to bf16), dweight by per-block partials reduced in
     *   a fixed order (no atomics). */
    void (*qk_norm_rope_backward)(const ops_ctx_t *c, void *dinp, float *dweight,
                                  const void *dout, const void *inp, const void *weight,
                                  const float *rstd, const int32_t *pos, const float *inv_freq,
                                  float eps, int N, int nh, int hd);

    /* ---- Linear layer with a residual (added last, like the groups above).
     * out (M,N) act = inp (M,K) act . weight (N,K) act ^T + bias (N) act + res (M,N) act;
     * bias may be NULL; res may be out itself (out += the product) or another buffer that
     * does not overlap out; inp must not overlap out. The drafter's o_proj and down_proj
     * (h1 = hin + o_proj(att), h2 = h1 + down(a)) in one call. CPU: matmul_forward, then
     * add(out, product, res) elementwise (for res == out: the product into a temporary,
     * then add(out, out, tmp)): the same bits as the two calls. CUDA: beta = 1 in the
     * GEMM with C = res, D = out (one bf16 rounding of the sum). (common/ops/cpu/matmul.c,
     * cuda/matmul.cu) */
    void (*matmul_forward_res)(const ops_ctx_t *c, void *out, const void *inp,
                               const void *weight, const void *bias, const void *res, int M,
                               int K, int N);

    /* ---- Per-head q/k norm + RoPE with the bits of the two ops (the target's q and k:
     * HF's bf16 rounding kept; added last, like the groups above). Arguments and shapes as
     * qk_norm_rope_forward; the result is exactly rmsnorm_forward(out, rstd, inp, weight,
     * eps, N*nh, hd) then rope_forward(out, pos, inv_freq, N, nh, hd) on every backend.
     * CUDA: one pass (hd 128, 4-byte aligned pointers; else the two ops). out may alias
     * inp. (common/ops/cpu/qknorm_rope.c, cuda/qknorm_rope.cu) */
    void (*qk_norm_rope_forward_exact)(const ops_ctx_t *c, void *out, float *rstd,
                                       const void *inp, const void *weight, float eps,
                                       const int32_t *pos, const float *inv_freq, int N, int nh,
                                       int hd);

    /* ---- Seeded normal init (added last): the drafter's master weights (drafter.c). On
     * CPU the host init itself, on a device its fast twin. The normals g in [0, G) of one xoshiro256**
     * stream (rng.h), normal g from draws 2g and 2g+1 as rng_normal: dst[i] = scale *
     * (float)rng_normal_f64(a, b) (one f32 multiply) at i = seg[s].offset + g -
     * seg[s].gstart for the segment s holding g. seg (n_seg, host): sorted by gstart,
     * covering [0, G) end to end. states (n_chunks x 4 u64, host): the stream's state
     * before normal k * chunk (chunk k's start), n_chunks = ceil(G / chunk). dst (f32) on
     * the device. The device's log / cos may differ from glibc's by a few double ulps:
     * every normal whose double lies within near_rel of a float rounding midpoint
     * (f32_near_midpoint, common/base/f32near.h) is listed in near (host, near_cap
     * entries; any order) with its index i, its two draws and the value written, for the
     * caller to recompute on the host (near_rel 0: none). *n_near = the number listed (may
     * exceed near_cap: then only near_cap were stored). Synchronous. 0, DL_EINVAL (no
     * segment, chunk 0), DL_ENOMEM (device list), DL_ERANGE (*n_near > near_cap), DL_ECUDA.
     * (common/ops/cpu/init.c, cuda/init.cu) */
    int (*normal_init)(const ops_ctx_t *c, float *dst, const ops_normal_seg_t *seg, int n_seg,
                       const uint64_t *states, size_t n_chunks, size_t chunk, uint64_t G,
                       float scale, double near_rel, ops_normal_near_t *near, size_t near_cap,
                       size_t *n_near);

    /* ---- The optimizer's step in fewer passes over the parameters (added last).
     * sumsq_scaled: out[0] f32 = sum over x (n) f32 of y^2, y = x * scale (one rounded f32
     * multiply): the bits of f32_add_scale(y, x, NULL, scale, n) then sumsq(out, y, n, 0).
     * adamw_pub: adamw (above; no work) on g = grad * gscale (one rounded f32 multiply, as
     * f32_add_scale), and the new weights also into pub (n) f32 (NULL: not written): the
     * bits of f32_add_scale, adamw, then copy(pub, master). master, grad, m, v, pub (n)
     * f32 on the backend, pub not overlapping the others; grad may be IPC-mapped memory of
     * a peer GPU. CUDA: 16-byte loads where master, grad, m, v and pub are all 16-byte
     * aligned, else element-wise (the same bits, slower). (common/ops/cpu/adamw.c,
     * cuda/adamw.cu) */
    void (*sumsq_scaled)(const ops_ctx_t *c, float *out, const float *x, float scale, size_t n);
    void (*adamw_pub)(const ops_ctx_t *c, float *master, float *pub, const float *grad,
                      float gscale, float *m, float *v, size_t n, float lr, float b1, float b2,
                      float eps, float wd, int t, const float *norm_sq, float max_norm);

    /* ---- The residual add and the next RMSNorm in one pass (the target's layers; added
     * last): x (N,C) act = x + res (as add), then out (N,C) act = rmsnorm(x) as
     * rmsnorm_forward(out, rstd, x, weight, eps, N, C): the bits of those two ops on every
     * backend. out may alias res (not x); rstd (N) f32 or NULL. CUDA: one pass where
     * rmsnorm_forward takes its vector path (C % 8 == 0, 256 <= C <= 8192, 16-byte
     * aligned pointers), else the two ops. (common/ops/cpu/rmsnorm.c, cuda/rmsnorm.cu) */
    void (*add_rmsnorm_forward)(const ops_ctx_t *c, void *x, void *out, float *rstd,
                                const void *res, const void *weight, float eps, int N, int C);
};

/* Backend constructors. ops_cpu_init never fails. ops_cuda_init selects the device,
 * creates stream, cuBLASLt handle and workspace; returns 0, DL_ENOENT (no CUDA device:
 * no GPU or no driver), DL_EINVAL (no such ordinal), DL_ECUDA (anything else) or
 * DL_ENOTSUP (CPU-only build). ops_ctx_destroy releases what init created. */
void ops_cpu_init(ops_ctx_t *c, int nthreads);
int ops_cuda_init(ops_ctx_t *c, int device);
void ops_ctx_destroy(ops_ctx_t *c);
/* The backend a command's `--device cpu|cuda` names: "cpu" -> ops_cpu_init(c, nthreads),
 * "cuda" -> ops_cuda_init(c, gpu). Returns 0, ops_cuda_init's errors, or DL_EINVAL naming
 * any other string. */
int ops_init_named(ops_ctx_t *c, const char *device, int gpu, int nthreads);

/* Bytes of one act element on this backend (4 on CPU, 2 on CUDA). */
static inline size_t ops_act_bytes(const ops_ctx_t *c) { return c->backend == OPS_CPU ? 4 : 2; }

/* Inverse RoPE frequencies (hd/2) f32 into inv_freq_host, HF convention:
 * inv_freq[i] = theta^(-2i/hd), then Llama-3 rope_scaling if p->llama3
 * (transformers modeling_rope_utils._compute_llama3_parameters). */
void ops_rope_inv_freq(const rope_params_t *p, int hd, float *inv_freq_host);

/* One E4M3 byte from an f32, round to nearest even, saturating to +-448, NaN -> 0x7f
 * (sign kept): the bits of __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and of
 * torch's x.clamp(-448, 448).to(torch.float8_e4m3fn). (common/ops/cpu/fp8.c) */
uint8_t ops_fp8_e4m3_from_f32(float x);
/* The exact value of an E4M3 byte (0x7f / 0xff: NaN). */
float ops_fp8_e4m3_to_f32(uint8_t b);

#endif
