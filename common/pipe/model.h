/* Model set-up shared by the pipeline stages: the target's configuration from a
 * checkpoint path (GGUF file or Hugging Face directory) and the DFlash drafter
 * configuration derived from it, so that target_worker (capture layers),
 * drafter_worker and optimizer (parameter layout) agree by construction. */
#ifndef DL_PIPE_MODEL_H
#define DL_PIPE_MODEL_H

#include "common/model/config.h"
#include "common/model/drafter.h"

/* Reads the target's config from `path` (*.gguf, or a directory with config.json).
 * Errors of the readers (DL_ENOENT, DL_EFORMAT, DL_ENOTSUP). */
int pipe_target_config(const char *path, model_config_t *out);

/* Checks that the target's weights can be read as they are: a Hugging Face directory's
 * safetensors (every shard's header and every tensor's data range inside its file:
 * safetensors_open, a mapping only, no data read); a GGUF file is checked by
 * pipe_target_config itself. 0, or the reader's error naming the file (DL_EFORMAT for
 * a truncated or corrupt shard, DL_ENOENT, DL_EIO). */
int pipe_target_check(const char *path);

/* Drafter config for target mc: n_layers drafter layers, block size B, n_feat
 * captured layers at DFlash's default ids; mask token by family (Qwen3: 151669 when
 * inside the vocabulary, else DRAFTER_MASK_TOKEN_SMOLLM2 = 16, <empty_output>, as for SmolLM2:
 * common/model/drafter.h). Finished and
 * validated (drafter_config_finish). */
int pipe_drafter_config(const model_config_t *mc, int n_layers, int n_feat, int B,
                        drafter_config_t *out);

#endif
