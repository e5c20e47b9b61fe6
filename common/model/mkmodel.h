/* Random-weight model directories with the shapes of real models, for throughput
 * benchmarks where real weights cannot be had.
 *
 * Presets (config values as in the public Hugging Face config.json of each model):
 *   qwen3-0.6b    Qwen/Qwen3-0.6B     L 28, D 1024, H 16, Hkv 8, hd 128, F 3072,  V 151936, tied
 *   qwen3-4b      Qwen/Qwen3-4B       L 36, D 2560, H 32, Hkv 8, hd 128, F 9728,  V 151936, tied
 *   qwen3-8b      Qwen/Qwen3-8B       L 36, D 4096, H 32, Hkv 8, hd 128, F 12288, V 151936
 *   llama-3.1-8b  meta-llama/Llama-3.1-8B  L 32, D 4096, H 32, Hkv 8, F 14336, V 128256,
 *                 rope_theta 5e5 with llama3 rope_scaling (factor 8, 1, 4, 8192)
 *   tiny-qwen3    a 2-layer Qwen3 (D 64, H 4, Hkv 2, hd 16, F 128) with the Qwen3 vocabulary,
 *                 for tests
 *   qwen3-30b-a3b Qwen/Qwen3-30B-A3B  L 48, D 2048, H 32, Hkv 4, hd 128, V 151936, untied;
 *                 every layer MoE: 128 experts of 768, 8 per token, norm_topk_prob
 *   tiny-qwen3-moe a 2-layer Qwen3-MoE (as tiny-qwen3; 8 experts of 32, top-2, renormalised)
 * Weights: Linear and embeddings ~ N(0, 0.02^2) (transformers' initializer_range),
 * RMSNorm weights 1. Element e of tensor k comes from rng chunk rng_mix(seed, k, e / 2^20),
 * so the files are a pure function of (preset, seed, dtype) whatever the thread count.
 * MoE experts are written with the Hub's per-expert names (experts.E.{gate,up,down}_proj).
 * Written tensor by tensor, 2^20 elements at a time (an 8B model never sits in memory).
 */
#ifndef DL_MODEL_MKMODEL_H
#define DL_MODEL_MKMODEL_H

#include <stdint.h>

#include "common/model/config.h"

/* Fills *out with preset `name`; DL_EINVAL (listing the names) if unknown. */
int mkmodel_preset(const char *name, model_config_t *out);
/* Comma-separated preset names (static). */
const char *mkmodel_preset_names(void);

/* Writes <dir>/config.json and <dir>/model.safetensors (or shards of at most
 * shard_bytes with model.safetensors.index.json when the model is larger; 0 = 5 GB)
 * for config c with dtype "bf16", "f16" or "f32". Creates dir. If tokenizer_dir is not
 * NULL its tokenizer.json and tokenizer_config.json are copied. Errors: DL_EIO,
 * DL_EINVAL, DL_ENOMEM. */
int mkmodel_write(const model_config_t *c, const char *dir, uint64_t seed, const char *dtype,
                  uint64_t shard_bytes, const char *tokenizer_dir);

#endif
