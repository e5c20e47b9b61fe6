/* The target: a frozen decoder-only transformer (Llama / Qwen2 / Qwen3) with
 * hidden-state capture, written once against common/ops (CPU fp32 or CUDA bf16).
 *
 * Layer i (transformers modeling_llama.py LlamaDecoderLayer; qwen2/qwen3 alike):
 *   xn = input_layernorm(x)
 *   q = q_proj(xn) (+b), k = k_proj(xn) (+b), v = v_proj(xn) (+b)   (Qwen2: bias)
 *   q, k = q_norm(q), k_norm(k) per head                             (Qwen3 only)
 *   q, k = rope(q), rope(k)  (rotate_half, inv_freq from rope_theta [+ llama3])
 *   x = x + o_proj(causal_attention(q, k, v))     (GQA: head h uses kv head h/(H/Hkv))
 *   x = x + down_proj(silu(gate_proj(n2)) * up_proj(n2)),  n2 = post_attention_layernorm(x)
 * then norm (final RMSNorm) and lm_head (tied: = embed_tokens).
 *
 * "Output of layer i" = x after decoder layer i (0-based), i.e. HF's
 * output_hidden_states[i + 1]. Features of layers ids[0..n) are written
 * concatenated per token: feat (T, n*D), row t = [h_ids[0](t) | ... | h_ids[n-1](t)].
 *
 * Checkpoints: an HF model dir (config.json + safetensors, sharded or not) or a
 * GGUF file (dequantized on load; llama-architecture q/k rows are un-permuted
 * from llama.cpp's rope layout back to HF's, see convert_hf_to_gguf.py `permute`).
 * Weights are converted to the backend's act dtype (fp32 CPU, bf16 CUDA).
 *
 * Memory: activations for up to max_tokens tokens are allocated at target_load
 * (no allocation per forward). Not thread-safe: one forward at a time per target.
 */
#ifndef DL_MODEL_TARGET_H
#define DL_MODEL_TARGET_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/config.h"
#include "common/ops/ops.h"

#define TARGET_MAX_CAPTURE 64

typedef struct {
    int max_tokens;          /* token budget of one forward (T <= max_tokens) */
    int max_seqs;            /* nseq <= max_seqs per forward */
    int n_capture;           /* layers whose outputs target_forward writes to feat */
    int capture_ids[TARGET_MAX_CAPTURE];  /* 0-based, each in [0, L) */
    int embed_only;          /* 1: load only the token embedding, final norm and LM head
                              * (the drafter's frozen parts: at Qwen3-8B 1.2 GB instead of
                              * 16 GB); target_forward / target_kv_new then fail with
                              * DL_EINVAL. target_embed / target_lm_head / target_logits work. */
    int precision;           /* TARGET_PRECISION_BF16 (0, the default): every weight in act
                              * (bf16 on CUDA, fp32 on CPU). TARGET_PRECISION_FP8: the decoder
                              * layers' q/k/v/o/gate/up/down weights in E4M3 with one f32 scale
                              * per output channel (quantized once at load, the act copies
                              * freed), their inputs quantized per token at every forward
                              * (ops.h fp8_*); embedding, LM head, norms and attention stay in
                              * act. CUDA needs sm_89+ (cuBLASLt FP8); CPU runs an exact fp32
                              * emulation (slow). MoE targets: DL_ENOTSUP. Ignored with
                              * embed_only (no layers loaded). */
} target_opts_t;

#define TARGET_PRECISION_BF16 0
#define TARGET_PRECISION_FP8 1

/* "bf16" | "fp8" -> TARGET_PRECISION_*; DL_EINVAL naming the string otherwise. */
int target_precision_parse(const char *s, int *out);
/* TARGET_PRECISION_* -> "bf16" | "fp8". */
const char *target_precision_name(int precision);

typedef struct target target_t;

/* DFlash's default capture layers (z-lab/dflash build_target_layer_ids): n == 1:
 * [L/2]; else round(1 + i*(L-4)/(n-1)) for i = 0..n-1, round half to even
 * (Python's round). L=36, n=5 -> [1, 9, 17, 25, 33]. 0 or DL_EINVAL (n < 1,
 * n > 1 with L < 4). */
int target_default_layer_ids(int L, int n, int *out);

/* Loads the checkpoint at path (HF dir, or *.gguf) onto backend c (borrowed: must
 * outlive the target). opts: max_tokens >= 1, max_seqs >= 1, capture ids valid
 * (n_capture may be 0). Errors: DL_ENOENT/DL_EIO (files), DL_EFORMAT (missing
 * tensor or wrong shape, named), DL_ENOTSUP (architecture, dtype; precision fp8 where
 * the backend or model cannot run it, with the reason), DL_ENOMEM. */
int target_load(const char *path, const ops_ctx_t *c, const target_opts_t *opts, target_t **out);
void target_destroy(target_t **t);

const model_config_t *target_config(const target_t *t);
const target_opts_t *target_opts(const target_t *t);
/* The backend the target runs on (borrowed at target_load). */
const ops_ctx_t *target_ops(const target_t *t);
/* Frozen embedding table and LM head, (V, D) act on the backend, owned by the
 * target (the same pointer when tied); for the drafter. */
const void *target_embed(const target_t *t);
const void *target_lm_head(const target_t *t);
/* Bytes of weights held on the backend. */
size_t target_weight_bytes(const target_t *t);

/* Forward over a packed batch: nseq sequences, token t of sequence s attends to
 * tokens [cu[s], t]. ids, pos (T) i32 and cu_seqlens (nseq+1) i32 are BACKEND
 * pointers; max_seqlen = max over s of cu[s+1]-cu[s].
 * feat: (T, n_capture*D) act or NULL; hidden: (T, D) act final-norm hidden or
 * NULL. When hidden is NULL the layers after the last captured one are skipped.
 * Errors: DL_ERANGE (T > max_tokens, nseq > max_seqs). Asynchronous on CUDA. */
int target_forward(target_t *t, const int32_t *ids, const int32_t *pos, const int32_t *cu_seqlens,
                   int nseq, int max_seqlen, int T, void *feat, void *hidden);

/* Same with HOST ids (T), cu_seqlens (nseq+1) and pos (T, or NULL for t - cu[s]);
 * uploads them into the target's own buffers. Validates ids < V and cu. */
int target_forward_host(target_t *t, const int32_t *ids_host, const int32_t *pos_host,
                        const int32_t *cu_host, int nseq, int T, void *feat, void *hidden);

/* logits (n, V) act = hidden (n, D) act . lm_head^T; n <= max_tokens. */
void target_logits(target_t *t, void *logits, const void *hidden, int n);

/* Scratch activation buffers the caller may use between forwards (backend, act):
 * (max_tokens, D) each. target_forward overwrites them. */
void *target_scratch_hidden(target_t *t);

/* ---- KV cache (decoding) ------------------------------------------------ */

typedef struct target_kv target_kv_t;

/* KV cache for n_slots sequences of up to cap tokens each: 2*L*n_slots*cap*Hkv*hd
 * act elements on the backend. */
int target_kv_new(target_t *t, int n_slots, int cap, target_kv_t **out);
void target_kv_destroy(target_kv_t **kv);
int target_kv_cap(const target_kv_t *kv);
int target_kv_slots(const target_kv_t *kv);

/* Appends tokens to cached sequences and runs the forward. HOST arrays:
 * slot[s] (nseq) the cache slot of sequence s, start[s] its cached length
 * (= the position of its first new token), cu (nseq+1) prefix sums of the new
 * token counts, ids (T). Sequence s's new tokens attend to its cached tokens and
 * causally to each other; their K/V are written into the cache.
 * last_hidden: (nseq, D) act, the final-norm hidden of each sequence's LAST new
 * token (may be NULL); hidden: (T, D) act of all new tokens (may be NULL).
 * Errors: DL_ERANGE (start[s] + n > cap, T > max_tokens, bad slot). */
int target_forward_kv(target_t *t, target_kv_t *kv, const int32_t *slot, const int32_t *start,
                      const int32_t *cu, int nseq, const int32_t *ids, int T, void *last_hidden,
                      void *hidden);

/* target_forward_kv that also writes the captured layers' outputs of the new
 * tokens into feat (T, n_capture*D) act (as target_forward; NULL = none): the
 * speculative decoder's prefill and verify steps feed the drafter from it
 * (common/model/specdec.c). DL_EINVAL when feat is given without capture layers. */
int target_forward_kv_feat(target_t *t, target_kv_t *kv, const int32_t *slot, const int32_t *start,
                           const int32_t *cu, int nseq, const int32_t *ids, int T,
                           void *last_hidden, void *hidden, void *feat);

#endif
