/* DFlash drafter checkpoints in the public layout (z-lab/dflash: the directory
 * that DFlashDraftModel.from_pretrained loads), plus draftline's training state.
 *
 * <dir>/config.json          a Qwen3 config ("model_type": "qwen3", hidden_size,
 *                            num_hidden_layers, heads, head_dim, intermediate_size,
 *                            rms_norm_eps, rope_theta (+ rope_scaling), vocab_size,
 *                            max_position_embeddings, ...) with "architectures":
 *                            ["DFlashDraftModel"], "is_causal": false, top-level
 *                            "block_size" and "num_target_layers", "dflash_config":
 *                            {"target_layer_ids", "mask_token_id", "block_size"}; draftline's own knobs under "draftline"
 *                            ({"gamma", "loss_chunk_blocks"}), ignored by other readers.
 * <dir>/model.safetensors    layers.N.self_attn.{q,k,v,o}_proj.weight,
 *                            layers.N.self_attn.{q,k}_norm.weight,
 *                            layers.N.{input,post_attention}_layernorm.weight,
 *                            layers.N.mlp.{gate,up,down}_proj.weight, fc.weight,
 *                            hidden_norm.weight, norm.weight (BF16 or F32); no
 *                            embedding or LM head (the target's). __metadata__:
 *                            {"format": "pt", "draftline_data_crc32": zlib's CRC-32
 *                            of the data section (every byte after the header) as
 *                            8 lowercase hex digits} (string values: other readers
 *                            ignore it).
 * <dir>/training_state.safetensors  (optional) F32 1-D "master", "adam_m", "adam_v"
 *                            over the flat parameter vector (drafter_tensor order)
 * <dir>/training_state.json  (optional) {"step", "seed", "rng": [4 x u64 as strings],
 *                            "next_mb", "n_params", "format": 1}
 *
 * Atomicity: dflash_ckpt_save writes everything into "<dir>.tmp", fsyncs each
 * file and the directory, then renames it over <dir> (an existing <dir> is
 * first renamed to "<dir>.old" and removed after), so a reader sees the old or
 * the new checkpoint, never a mix.
 */
#ifndef DL_MODEL_DFLASH_CKPT_H
#define DL_MODEL_DFLASH_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "common/base/rng.h"
#include "common/model/drafter.h"

#define DFLASH_CRC_KEY "draftline_data_crc32"   /* model.safetensors __metadata__ key */

typedef struct {
    int64_t step;        /* optimizer steps applied */
    uint64_t seed;       /* run seed */
    rng_t rng;           /* optimizer-side rng state */
    uint64_t next_mb;    /* loader cursor: next micro-batch to hand out */
    const float *master, *m, *v;  /* save: (n_params) f32 host; NULL = skip the tensors */
    size_t n_params;
} dflash_train_state_t;

/* config.json text for cfg (malloc'd, caller frees); NULL on allocation failure.
 * torch_dtype is "bfloat16"; dflash_ckpt_save writes "float32" for F32 weights. */
char *dflash_config_to_json(const drafter_config_t *cfg);

/* Parses a DFlash config.json text into cfg (drafter_config_finish applied);
 * `where` names the source in errors. Accepts rope_theta at top level or in
 * rope_parameters, block_size at top level or in dflash_config; gamma from
 * "draftline" else the default for the block size. DL_EFORMAT names a missing
 * or mistyped field; DL_EINVAL a bad value. */
int dflash_config_from_json(const char *json, const char *where, drafter_config_t *cfg);
/* Reads <dir>/config.json. */
int dflash_config_load(const char *dir, drafter_config_t *cfg);

/* Saves d (master weights, converted to dtype "BF16" or "F32") and, when state
 * is non-NULL, the training state, atomically into dir (see above).
 * DL_EINVAL (dtype), DL_EIO naming the path. */
int dflash_ckpt_save(drafter_t *d, const char *dir, const char *dtype,
                     const dflash_train_state_t *state);
/* dflash_ckpt_save with the master weights given: host (drafter_n_params(d)) f32 host
 * memory, read only (nothing is downloaded: d may be layout_only, only its tensor table
 * and config are read). The BF16 conversion and the data's CRC-32 run on OpenMP threads
 * in pieces as the data is written (one pass). Same files, byte for byte. */
int dflash_ckpt_save_host(const drafter_t *d, const float *host, const char *dir, const char *dtype,
                          const dflash_train_state_t *state);

/* Loads <dir>/model.safetensors into d's master weights (then working weights).
 * Every drafter tensor must be present with its exact shape (DL_ENOENT /
 * DL_EFORMAT naming it); other tensors are ignored. F32, F16 or BF16. A file that
 * records a CRC-32 of its data (draftline writes one) is checked first
 * (dflash_ckpt_verify_weights: DL_EFORMAT naming the file on a mismatch); one
 * without (the public DFlash code's) loads unchecked. */
int dflash_ckpt_load_weights(drafter_t *d, const char *dir);

/* Checks <dir>/model.safetensors' data section against its recorded CRC-32 (reads the
 * whole file). *verified: 1 when checked, 0 when the file records none (written before
 * checksums; not an error). DL_EFORMAT naming the file when it does not match or the
 * header is unreadable; DL_ENOENT / DL_EIO. */
int dflash_ckpt_verify_weights(const char *dir, int *verified);

/* Loads the training state: meta fields always; master, m, v into the given
 * (n_params) f32 host buffers when non-NULL. DL_ENOENT when dir has none,
 * DL_EFORMAT when n_params differs. */
int dflash_ckpt_load_state(const char *dir, size_t n_params, float *master, float *m, float *v,
                           dflash_train_state_t *meta);

#endif
