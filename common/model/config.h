/* Target model configuration: from a Hugging Face config.json or GGUF metadata.
 *
 * Families (transformers modeling_llama.py / modeling_qwen2.py / modeling_qwen3.py):
 *   llama: LlamaForCausalLM (also SmolLM2, Llama-3.x; rope_scaling "llama3"),
 *          optional attention_bias (q/k/v/o) and mlp_bias.
 *   qwen2: Qwen2ForCausalLM: q/k/v projections have a bias, o_proj has none.
 *   qwen3: Qwen3ForCausalLM: per-head RMSNorm on q and k (q_norm, k_norm) before
 *          RoPE, head_dim independent of hidden_size / num_heads, optional attention_bias.
 *   qwen3 MoE: Qwen3MoeForCausalLM (modeling_qwen3_moe.py): qwen3 attention; the MLP of
 *          layer l is the sparse MoE block (router softmax -> top-k experts -> optional
 *          renormalisation -> weighted sum of SwiGLU experts of size moe_intermediate_size)
 *          iff l not in mlp_only_layers and num_experts > 0 and (l + 1) %
 *          decoder_sparse_step == 0 (Qwen3MoeDecoderLayer), else the dense MLP of size
 *          intermediate_size. family is MODEL_QWEN3 with n_experts > 0 (same vocabulary,
 *          chat template and attention as Qwen3); arch says "Qwen3MoeForCausalLM".
 * An unknown architecture is DL_ENOTSUP naming it.
 */
#ifndef DL_MODEL_CONFIG_H
#define DL_MODEL_CONFIG_H

#include <stdint.h>

#include "common/format/gguf.h"
#include "common/ops/ops.h"

typedef enum { MODEL_LLAMA = 0, MODEL_QWEN2 = 1, MODEL_QWEN3 = 2 } model_family_t;

#define MODEL_MAX_EOS 8
/* Layers an MoE config can describe (the moe_layers bitmap). Qwen3-235B-A22B has 94. */
#define MODEL_MAX_MOE_LAYERS 256

typedef struct {
    model_family_t family;
    int L;                 /* num_hidden_layers */
    int D;                 /* hidden_size */
    int H, Hkv, hd;        /* num_attention_heads, num_key_value_heads, head_dim */
    int F;                 /* intermediate_size */
    int V;                 /* vocab_size */
    float eps;             /* rms_norm_eps */
    rope_params_t rope;    /* rope_theta, rope_scaling (llama3) */
    int max_pos;           /* max_position_embeddings (0 if unknown) */
    int tie_embeddings;    /* tie_word_embeddings: lm_head = embed_tokens */
    int attn_bias;         /* bias on q, k, v (qwen2 always; llama/qwen3 attention_bias) */
    int o_bias;            /* bias on o_proj (llama/qwen3 attention_bias) */
    int mlp_bias;          /* bias on gate/up/down (llama mlp_bias) */
    int qk_norm;           /* qwen3 q_norm / k_norm */
    int bos_id;            /* -1 if unknown */
    int eos_ids[MODEL_MAX_EOS];
    int n_eos;
    /* Mixture of experts (qwen3 MoE; all 0 for dense models) */
    int n_experts;         /* num_experts (transformers 5 writes num_local_experts) */
    int top_k;             /* num_experts_per_tok */
    int moe_F;             /* moe_intermediate_size */
    int norm_topk;         /* norm_topk_prob: renormalise the top-k weights to sum 1 */
    uint64_t moe_layers[MODEL_MAX_MOE_LAYERS / 64];  /* bit l set: layer l is an MoE layer */
    char arch[64];         /* "LlamaForCausalLM", or the GGUF general.architecture */
    char dtype[16];        /* torch_dtype of the checkpoint ("bfloat16", ...; "" if unknown) */
} model_config_t;

const char *model_family_name(model_family_t f);

/* 1 if layer l's MLP is the sparse MoE block, 0 if dense. */
static inline int model_config_layer_moe(const model_config_t *c, int l) {
    return c->n_experts > 0 && l >= 0 && l < MODEL_MAX_MOE_LAYERS &&
           (int)((c->moe_layers[l / 64] >> (l % 64)) & 1);
}
/* Number of MoE layers of c. */
int model_config_n_moe_layers(const model_config_t *c);

/* Parses config.json text (json, NUL-terminated); `where` names it in errors.
 * DL_EFORMAT for a missing/mistyped field (named), DL_ENOTSUP for an unknown
 * architecture or rope_scaling type. */
int model_config_from_json(const char *json, const char *where, model_config_t *out);
/* Reads <dir>/config.json. */
int model_config_from_hf_dir(const char *dir, model_config_t *out);
/* From GGUF metadata (<arch>.block_count, .embedding_length, ...). tie_embeddings
 * is 1 when the file has no output.weight tensor. */
int model_config_from_gguf(const gguf_t *g, model_config_t *out);

/* Checks the numbers are consistent (H % Hkv == 0, hd even, ...). */
int model_config_validate(const model_config_t *c, const char *where);

/* Writes an HF config.json for c (as transformers' to_json would for the
 * family, with the fields draftline reads). Returns malloc'd text. */
char *model_config_to_json(const model_config_t *c);

/* Number of parameters implied by c (embeddings counted once when tied; every expert). */
uint64_t model_config_n_params(const model_config_t *c);
/* Parameters one token uses: n_params with top_k of the n_experts experts of each MoE
 * layer (the router counted whole). Equals n_params for a dense model. */
uint64_t model_config_n_active_params(const model_config_t *c);

#endif
