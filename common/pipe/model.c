/* See model.h. */
#include "common/pipe/model.h"
#include "common/base/err.h"
#include "common/format/gguf.h"
#include "common/format/safetensors.h"

#include <string.h>
#include <sys/stat.h>

int pipe_target_config(const char *path, model_config_t *out) {
    struct stat s;
    if (stat(path, &s) != 0) return dl_seterr(DL_ENOENT, "target model %s: not found", path);
    if (S_ISDIR(s.st_mode)) return model_config_from_hf_dir(path, out);
    gguf_t *g = NULL;
    DL_TRY(gguf_open(path, &g));
    int rc = model_config_from_gguf(g, out);
    gguf_close(&g);
    return rc;
}

int pipe_target_check(const char *path) {
    struct stat s;
    if (stat(path, &s) != 0) return dl_seterr(DL_ENOENT, "target model %s: not found", path);
    if (!S_ISDIR(s.st_mode)) return 0;
    safetensors_t *st = NULL;
    DL_TRY(safetensors_open(path, &st));
    safetensors_close(&st);
    return 0;
}

int pipe_drafter_config(const model_config_t *mc, int n_layers, int n_feat, int B,
                        drafter_config_t *cfg) {
    drafter_config_defaults(cfg);
    cfg->D = mc->D;
    cfg->H = mc->H;
    cfg->Hkv = mc->Hkv;
    cfg->hd = mc->hd;
    cfg->F = mc->F;
    cfg->V = mc->V;
    cfg->n_target_layers = mc->L;
    cfg->max_position_embeddings = mc->max_pos;
    cfg->rms_eps = mc->eps;
    cfg->rope = mc->rope;
    cfg->n_layers = n_layers;
    cfg->B = B;
    cfg->n_feat = n_feat;
    if (n_feat > 0) DL_TRY(drafter_default_layer_ids(mc->L, n_feat, cfg->target_layer_ids));
    cfg->mask_token_id = (mc->family == MODEL_QWEN3 && mc->V > DRAFTER_MASK_TOKEN_QWEN3)
                             ? DRAFTER_MASK_TOKEN_QWEN3
                             : DRAFTER_MASK_TOKEN_SMOLLM2;
    return drafter_config_finish(cfg);
}
