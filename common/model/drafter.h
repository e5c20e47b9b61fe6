/* The DFlash drafter (Chen et al., "DFlash: Block Diffusion for Flash
 * Speculative Decoding", arXiv 2602.06036; public model code z-lab/dflash
 * model/dflash.py): forward, backward and the chunked weighted loss, written
 * once against common/ops (CPU fp32 reference or CUDA bf16).
 *
 * Architecture (as DFlashDraftModel): N Qwen3 decoder layers at the target's
 * hidden size D. Target features (T, n_feat*D) -> ctx = hidden_norm(fc(features))
 * (T, D), shared by every layer. Layer l, for the block tokens x (R, D):
 *   xn = input_layernorm(x)
 *   q = rope(q_norm(q_proj(xn)))                               block rows only
 *   k = rope(k_norm(k_proj([ctx; xn]))), v = v_proj([ctx; xn]) context rows NOT
 *                                                              through input_layernorm
 *   x = x + o_proj(attn(q, k, v)),  x = x + down(silu(gate(n2)) * up(n2)),
 *   n2 = post_attention_layernorm(x)
 * then norm, then the target's frozen LM head. Context keys use the positions of
 * their tokens; block row k of a block anchored at a uses position a + k.
 *
 * Blocks and mask (paper sec. 3): a block is [token at the anchor, MASK x (B-1)];
 * row k predicts the token at anchor + k (row 0: no loss). A block attends
 * bidirectionally to its own B rows and to the context rows of its sequence
 * strictly before the anchor; blocks never see each other.
 *
 * Loss: sum over rows k >= 1 of w_k * CE(logits, token[anchor + k]), with
 * w_k = exp(-(k-1)/gamma) * loss_mask[anchor + k] (0 past the sequence end);
 * the reported loss is loss_sum / weight_sum. Only the loss rows (k >= 1) go
 * through the LM head, in chunks of cfg.loss_chunk_blocks * B rows so (rows x V)
 * logits never exist at once; row 0 (the anchor) has no target and no logits.
 *
 * Memory: weights and every activation live on the ops backend; buffers are
 * sized at drafter_new from max_tokens and max_blocks (no allocation per step).
 * Gradients are f32 and ACCUMULATE across calls until drafter_zero_grad.
 */
#ifndef DL_MODEL_DRAFTER_H
#define DL_MODEL_DRAFTER_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/rng.h"
#include "common/model/config.h"
#include "common/ops/ops.h"

#define DRAFTER_MAX_LAYERS 64
#define DRAFTER_MAX_FEAT 64
#define DRAFTER_MAX_BLOCK 64
#define DRAFTER_DEFAULT_LAYERS 5
#define DRAFTER_DEFAULT_BLOCK 16
#define DRAFTER_DEFAULT_ANCHORS 512
#define DRAFTER_DEFAULT_LOSS_CHUNK_BLOCKS 64
/* SmolLM2 has no reserved mask token; we use <empty_output> (id 16), a special
 * token of its code-pretraining vocabulary that is not bos/eos/pad/unk (1/2/2/0)
 * and never appears in chat data, with its (trained) embedding as is. Qwen3
 * targets use their reserved 151669. */
#define DRAFTER_MASK_TOKEN_SMOLLM2 16
#define DRAFTER_MASK_TOKEN_QWEN3 151669

typedef struct {
    /* from the target (shapes of the drafter's layers are the target's) */
    int D;                    /* hidden size */
    int H, Hkv, hd;           /* attention heads, kv heads, head dim */
    int F;                    /* MLP intermediate size */
    int V;                    /* vocabulary (embedding / LM head rows) */
    int n_target_layers;      /* L of the target (for default layer ids) */
    int max_position_embeddings;
    float rms_eps;
    rope_params_t rope;
    /* drafter */
    int n_layers;             /* default 5 */
    int n_feat;               /* len(target_layer_ids); 0 = default (n_layers of them) */
    int target_layer_ids[DRAFTER_MAX_FEAT];
    int B;                    /* block size, default 16 */
    float gamma;              /* loss decay; <= 0 = default for B (drafter_default_gamma) */
    int mask_token_id;
    int loss_chunk_blocks;    /* logits chunk: this x B loss rows; <= 0 = default 64 */
} drafter_config_t;

/* Drafter defaults (5 layers, B 16, gamma auto, mask token unset (-1: the
 * caller picks the target's, e.g. DRAFTER_MASK_TOKEN_QWEN3), loss chunk 16);
 * the target fields are zeroed for the caller to fill. */
void drafter_config_defaults(drafter_config_t *cfg);

/* Copies the target's shapes into cfg (D, H, Hkv, hd, F, V, L, max positions,
 * rms eps, RoPE incl. llama3 scaling): the drafter's layers are Qwen3 layers at
 * the target's sizes, as the public DFlash drafters are. Drafter fields untouched. */
void drafter_config_from_target(drafter_config_t *cfg, const model_config_t *target);

/* Completes defaults (layer ids, gamma, chunk) and validates every field.
 * Returns 0 or DL_EINVAL naming the field. */
int drafter_config_finish(drafter_config_t *cfg);

/* DFlash's build_target_layer_ids (z-lab/dflash): n == 1 -> [L/2]; else
 * round(1 + i*(L-4)/(n-1)), i = 0..n-1 (Python round: half to even); delegates
 * to target_default_layer_ids. Returns 0 or DL_EINVAL (n < 1 or > DRAFTER_MAX_FEAT,
 * L < 4 with n > 1). */
int drafter_default_layer_ids(int n_target_layers, int n, int *out);

/* Paper's decay for block size B: 16 -> 7, 10 -> 5, 8 -> 4; piecewise linear
 * between those, B/2 below 8, 7 + (B-16)/3 above 16. */
float drafter_default_gamma(int B);

/* One micro-batch as the drafter sees it. Host arrays are read on the host;
 * features are on the backend. */
typedef struct {
    int T;                          /* target tokens (packed sequences) */
    int nseq;
    const int32_t *cu_seqlens;      /* (nseq+1) host, prefix sums, cu[nseq] == T */
    const int32_t *ids;             /* (T) host token ids (< V) */
    const uint8_t *loss_mask;       /* (T) host, 1 = token is trained on (assistant) */
    const int32_t *pos;             /* (T) host position within the sequence; NULL = t - cu[s] */
    const void *features;           /* (T, n_feat*D) act on the backend, layer-id order */
    int n_blocks;
    const int32_t *anchors;         /* (n_blocks) host, packed index of each block's anchor */
} drafter_batch_t;

typedef struct {
    double loss_sum;                       /* sum of w * CE over rows */
    double weight_sum;                     /* sum of w */
    double correct[DRAFTER_MAX_BLOCK];     /* [k]: top-1 hits at row k among mask-1 rows */
    double count[DRAFTER_MAX_BLOCK];       /* [k]: mask-1 rows at row k (k >= 1) */
} drafter_stats_t;

/* A trainable tensor in the flat parameter vector. */
typedef struct {
    char name[64];           /* public DFlash name, e.g. "layers.0.self_attn.q_proj.weight" */
    int n_dims;              /* 1 or 2 */
    int64_t shape[2];        /* torch shape (out, in) for Linear */
    size_t offset, numel;    /* in elements of the flat vector */
} drafter_tensor_t;

typedef struct drafter drafter_t;

/* New drafter with weights initialised as the public code (Qwen3PreTrainedModel:
 * Linear ~ N(0, 0.02^2), RMSNorm weights 1) from `seed`.
 * embed, lm_head: (V, D) act on the backend, frozen, owned by the caller (may be
 * the same pointer for tied embeddings, and shared with a target in the same
 * process); they must outlive the drafter. max_tokens: largest T; max_blocks:
 * largest n_blocks per call. Errors: DL_EINVAL (config), DL_ENOMEM (naming bytes). */
int drafter_new(const ops_ctx_t *c, const drafter_config_t *cfg, const void *embed,
                const void *lm_head, int max_tokens, int max_blocks, uint64_t seed,
                drafter_t **out);

/* The init runs on OpenMP threads in chunks of this many normal numbers, bitwise as
 * the sequential loop (drafter.c, init_weights). */
#define DRAFTER_INIT_CHUNK 65536

typedef struct {
    int no_init;    /* nonzero: skip the seeded init (about 1 s per 100M parameters on one
                     * core): the master weights are zeros until the caller loads its own
                     * (drafter_upload_master, or a device copy into drafter_master then
                     * drafter_sync_weights) before any forward. The drafter worker, whose
                     * weights always come from the optimizer's weights slab. seed unused. */
    int layout_only; /* nonzero: the tensor table (names, shapes, offsets, n_params) only:
                      * no backend buffer (master, gradient, working weights, activations)
                      * nor host staging is allocated and nothing is initialised, so
                      * drafter_master/grads/weights return NULL and the drafter can run
                      * no forward, backward, download or upload. The optimizer's layout,
                      * which writes the seeded init straight into its own state
                      * (drafter_init_master). seed and no_init unused. */
    int keep_up;     /* nonzero: each layer keeps its MLP up projection (R, F) act from the
                      * forward for the backward instead of recomputing it there: one GEMM
                      * of 2 R D F a layer less (4% of the Qwen3-8B drafter's step on an
                      * H200), for max_blocks x B x F act bytes a layer more, less the one
                      * shared (R, F) buffer the recomputation needs (the Qwen3-8B drafter
                      * at 4,096 blocks of 16: 1.5 GiB a layer, 8.05 GB for 5 layers, less
                      * 1.61 GB). Same kernels on the same inputs: bitwise the same results
                      * either way. */
    int external_grads; /* nonzero: no gradient buffer of its own (n_params f32): the
                      * caller points it at its own with drafter_set_grads before every
                      * drafter_zero_grad / forward_backward (DL_ESTATE without one). The
                      * drafter worker, whose gradients live in the slab it exports. */
    int no_master;   /* nonzero: no f32 master copy (n_params f32) beside the working
                      * weights: drafter_master returns NULL and the weights come in only
                      * through drafter_load_master (converted into the working weights:
                      * from host memory in chunks through a scratch buffer, from device
                      * memory in one pass; drafter_upload_master takes the host way).
                      * dflash_ckpt_save of such a drafter is refused (DL_ESTATE). The
                      * drafter worker, whose f32 weights are the optimizer's. Implies
                      * no_init. */
} drafter_new_opts_t;

/* drafter_new with options; opts NULL: as drafter_new. */
int drafter_new_opts(const ops_ctx_t *c, const drafter_config_t *cfg, const void *embed,
                     const void *lm_head, int max_tokens, int max_blocks, uint64_t seed,
                     const drafter_new_opts_t *opts, drafter_t **out);
void drafter_destroy(drafter_t **d);

/* The seeded init of drafter_new (Linear ~ N(0, 0.02^2), RMSNorm weights 1, from seed)
 * written into host[drafter_n_params(d)] f32, bitwise what drafter_new puts in master;
 * d may be layout_only. Runs on OpenMP threads. 0 or DL_ENOMEM (chunk table). */
int drafter_init_master(const drafter_t *d, uint64_t seed, float *host);

/* What drafter_init_master_on did. */
typedef struct {
    int on_device;     /* 1: the normals were drawn on the device (normal_init) */
    uint64_t normals;  /* normals drawn (the 2-D tensors' elements) */
    uint64_t near;     /* of them, near a float rounding midpoint: recomputed on the host */
    uint64_t fixed;    /* of those, where the device's float differed (rewritten) */
    int overflow;      /* the device's near list overflowed: the host init was uploaded */
} drafter_init_info_t;

/* drafter_init_master's init, bitwise, into dst[drafter_n_params(d)] f32 on backend c
 * (d may be layout_only; c need not be d's backend). CPU: the host loop into dst (host
 * memory). A device with normal_init (CUDA): the normals drawn on the device (about 0.1 s
 * per billion on an H200, against ~4 s on 16 cores; the host's cores stay free for the
 * target's load beside it), each one within near_rel of a float rounding midpoint
 * recomputed on the host and rewritten where the device's log / cos rounded it otherwise
 * (common/base/f32near.h; near_rel <= 0: F32NEAR_REL; >= 1 recomputes every normal that is
 * not exactly a float, for tests); the 1-D tensors' ones uploaded. A device without it, or
 * whose list of near normals overflowed (not seen: room for 4x the most expected): the host
 * init, uploaded (info->on_device 0, info->overflow 1; the caller says so). "The host's
 * bits": those of this machine's libm, as drafter_init_master's. Synchronous (dst ready on
 * return). info (may be NULL) says what was done. 0, DL_ENOMEM (host tables, the device's
 * list), DL_ECUDA. */
int drafter_init_master_on(const drafter_t *d, uint64_t seed, const ops_ctx_t *c, float *dst,
                           double near_rel, drafter_init_info_t *info);

const drafter_config_t *drafter_config(const drafter_t *d);

/* Forward only (activations kept for drafter_logits). 0 or DL_EINVAL/DL_ERANGE. */
int drafter_forward(drafter_t *d, const drafter_batch_t *b);
/* Logits of blocks [j0, j0+n) of the last forward: out_host (n*B, V) f32. */
int drafter_logits(drafter_t *d, int j0, int n, float *out_host);

/* Forward, chunked loss and backward; parameter grads accumulate (f32) scaled by
 * grad_scale (<= 0: 1 / weight_sum of this batch, i.e. the mean loss's gradient).
 * st (may be NULL) receives this batch's sums (assigned). On the CUDA backend this
 * downloads the per-row loss/correct once per call. */
int drafter_forward_backward(drafter_t *d, const drafter_batch_t *b, float grad_scale,
                             drafter_stats_t *st);

/* Zeroes the gradient accumulator; nothing when there is none (external_grads before
 * drafter_set_grads). */
void drafter_zero_grad(drafter_t *d);
/* Points the f32 gradient accumulator (what drafter_grads returns, zero_grad clears
 * and forward_backward accumulates into) at `grads`: n_params f32 on the drafter's
 * backend (device memory on CUDA), caller-owned, live while in use; NULL: back to
 * the drafter's own buffer (none with external_grads: drafter_grads then returns NULL
 * and forward_backward refuses). For bitwise the same math as the own buffer, `grads`
 * must be 256-byte aligned like it (the CUDA GEMM plans depend on pointer
 * alignment). No copy: the previous accumulator's contents are not carried over. */
void drafter_set_grads(drafter_t *d, float *grads);

/* Flat parameter vector: master weights and grads (f32, backend), working
 * weights (act, backend; the same storage as master on CPU). NULL where the drafter
 * has none: master with no_master, grads with external_grads before drafter_set_grads,
 * all three with layout_only (on CPU with no_master the working weights are a buffer
 * of their own). */
size_t drafter_n_params(const drafter_t *d);
float *drafter_master(drafter_t *d);
float *drafter_grads(drafter_t *d);
void *drafter_weights(drafter_t *d);
/* Refreshes the act working weights from master (after an optimizer step on
 * CUDA; no-op on CPU and without a master). */
void drafter_sync_weights(drafter_t *d);
/* Copies master (f32) to a host buffer of drafter_n_params floats: 0, or DL_ESTATE
 * (nothing written) for a drafter without master (no_master, layout_only). */
int drafter_download_master(drafter_t *d, float *host);
/* drafter_load_master from host memory (master, if any, and the working weights). */
int drafter_upload_master(drafter_t *d, const float *host);
/* Loads n_params f32 weights (the flat layout) into the drafter: into master and the
 * working weights, or, for a drafter made with no_master, straight into the working
 * weights (bitwise the same working weights): from host memory through a scratch buffer
 * in chunks, from device memory in one conversion pass.
 * src: host memory when src_host, else device memory the backend's kernels read (this
 * GPU's, or a peer GPU's mapped by CUDA IPC). Ordered on the drafter's stream before
 * its next forward; src must stay unchanged until then. 0 or DL_ESTATE (layout_only). */
int drafter_load_master(drafter_t *d, const float *src, int src_host);
int drafter_n_tensors(const drafter_t *d);
const drafter_tensor_t *drafter_tensor(const drafter_t *d, int i);
/* By public name; NULL if absent. */
const drafter_tensor_t *drafter_find_tensor(const drafter_t *d, const char *name);

/* Useful FLOPs of one drafter_forward_backward (for MFU), counted as 2 per
 * multiply-add of the forward matmuls, times 3 for forward + backward of
 * trained layers (activation and weight grads), times 2 where only one grad
 * exists: fc (features are frozen: weight grad only) and the LM head (frozen:
 * activation grad only). Attention counts the visible keys exactly:
 * sum_ctx_len = sum over blocks of their context rows (ctx_len), B own rows
 * each. Recomputation is not counted. R = n_blocks * B rows; the LM head
 * counts the loss rows only, n_blocks * (B - 1): a block's anchor row has no
 * logits. */
double drafter_step_flops(const drafter_config_t *cfg, int T, int n_blocks, double sum_ctx_len);

/* Passes of at most max_blocks blocks that n_blocks anchors take (a micro-batch's
 * blocks over what one drafter_forward_backward holds are split into this many passes
 * of near-equal size, consecutive anchors each, accumulating into the same gradient):
 * 0 for n_blocks <= 0, else ceil(n_blocks / max_blocks); max_blocks >= 1. */
int drafter_passes(int n_blocks, int max_blocks);

/* acc += add, field by field (loss and weight sums, per-row correct and count), so the
 * stats of several passes of one micro-batch read as those of one pass. */
void drafter_stats_add(drafter_stats_t *acc, const drafter_stats_t *add);

/* Anchor sampling for one micro-batch (paper sec. 4: random anchors inside the
 * response). For each sequence s (tokens [cu[s], cu[s+1]), local positions
 * a = 0..len-1) the candidates are the a with 1 <= a and a + B - 1 <= len - 1 and
 * loss_mask[a+1 .. a+B-1] all 1 (the whole block to predict is assistant
 * tokens; a >= 1 so some context exists). A sequence with no such candidate
 * falls back to the a >= 1 with loss_mask[a+1] == 1 (partial blocks: rows past
 * the span get weight 0). Up to max_per_seq per sequence are drawn without
 * replacement (partial Fisher-Yates with rng), then sorted. Output: packed
 * indices (cu[s] + a) into anchors[cap]. Returns the count, or DL_ERANGE when cap
 * is too small. Seed rng from rng_mix(seed, epoch, mb) for reproducibility. */
int drafter_sample_anchors(const int32_t *cu_seqlens, int nseq, const uint8_t *loss_mask, int B,
                           int max_per_seq, rng_t *rng, int32_t *anchors, int cap);

#endif
