/* Random-weight checkpoints of real shapes. See mkmodel.h. */
#include "common/model/mkmodel.h"

#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/paths.h"
#include "common/base/rng.h"
#include "common/format/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MK_CHUNK (1u << 20)          /* elements per rng chunk and per write */
#define MK_DEFAULT_SHARD (5ull << 30)
#define MK_INIT_STD 0.02f

typedef struct {
    const char *name;
    model_family_t family;
    int L, D, H, Hkv, hd, F, V, tie, max_pos, bos;
    double theta, eps;
    int llama3;
    int eos[3], n_eos;
    int E, k, Fm, norm_topk;      /* MoE: experts (0: dense), per token, size; every layer sparse */
} preset_t;

static const preset_t presets[] = {
    {"qwen3-0.6b", MODEL_QWEN3, 28, 1024, 16, 8, 128, 3072, 151936, 1, 40960, 151643, 1e6, 1e-6, 0, {151645}, 1,
     0, 0, 0, 0},
    {"qwen3-4b", MODEL_QWEN3, 36, 2560, 32, 8, 128, 9728, 151936, 1, 40960, 151643, 1e6, 1e-6, 0, {151645}, 1,
     0, 0, 0, 0},
    {"qwen3-8b", MODEL_QWEN3, 36, 4096, 32, 8, 128, 12288, 151936, 0, 40960, 151643, 1e6, 1e-6, 0, {151645}, 1,
     0, 0, 0, 0},
    {"llama-3.1-8b", MODEL_LLAMA, 32, 4096, 32, 8, 128, 14336, 128256, 0, 131072, 128000, 500000.0, 1e-5, 1,
     {128001, 128008, 128009}, 3, 0, 0, 0, 0},
    {"tiny-qwen3", MODEL_QWEN3, 2, 64, 4, 2, 16, 128, 151936, 1, 40960, 151643, 1e6, 1e-6, 0, {151645}, 1,
     0, 0, 0, 0},
    /* Qwen/Qwen3-30B-A3B config.json (transformers Qwen3MoeConfig: decoder_sparse_step 1,
     * mlp_only_layers []: every layer sparse; intermediate_size 6144 is then unused) */
    {"qwen3-30b-a3b", MODEL_QWEN3, 48, 2048, 32, 4, 128, 6144, 151936, 0, 40960, 151643, 1e6, 1e-6, 0,
     {151645}, 1, 128, 8, 768, 1},
    {"tiny-qwen3-moe", MODEL_QWEN3, 2, 64, 4, 2, 16, 128, 151936, 1, 40960, 151643, 1e6, 1e-6, 0, {151645}, 1,
     8, 2, 32, 1},
};
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

const char *mkmodel_preset_names(void) {
    return "qwen3-0.6b, qwen3-4b, qwen3-8b, llama-3.1-8b, tiny-qwen3, qwen3-30b-a3b, tiny-qwen3-moe";
}

int mkmodel_preset(const char *name, model_config_t *c) {
    for (int i = 0; i < N_PRESETS; i++) {
        const preset_t *p = &presets[i];
        if (strcmp(p->name, name)) continue;
        memset(c, 0, sizeof *c);
        c->family = p->family;
        c->L = p->L; c->D = p->D; c->H = p->H; c->Hkv = p->Hkv; c->hd = p->hd; c->F = p->F; c->V = p->V;
        c->eps = (float)p->eps;
        c->rope.theta = p->theta;
        if (p->llama3) {
            c->rope.llama3 = 1;
            c->rope.factor = 8.0;
            c->rope.low_freq_factor = 1.0;
            c->rope.high_freq_factor = 4.0;
            c->rope.original_max_position_embeddings = 8192;
        }
        c->max_pos = p->max_pos;
        c->tie_embeddings = p->tie;
        c->qk_norm = p->family == MODEL_QWEN3;
        c->attn_bias = p->family == MODEL_QWEN2;
        c->bos_id = p->bos;
        for (int k = 0; k < p->n_eos; k++) c->eos_ids[c->n_eos++] = p->eos[k];
        c->n_experts = p->E;
        c->top_k = p->k;
        c->moe_F = p->Fm;
        c->norm_topk = p->norm_topk;
        for (int l = 0; p->E > 0 && l < p->L; l++) c->moe_layers[l / 64] |= UINT64_C(1) << (l % 64);
        snprintf(c->arch, sizeof c->arch, "%s", p->family == MODEL_LLAMA ? "LlamaForCausalLM"
                                                : p->E > 0 ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM");
        snprintf(c->dtype, sizeof c->dtype, "bfloat16");
        return 0;
    }
    return dl_seterr(DL_EINVAL, "--config: unknown model '%s' (%s)", name, mkmodel_preset_names());
}

typedef struct { char name[96]; int n_dims; int64_t shape[2]; int is_norm; } mk_tensor_t;

/* The tensor list in HF order for config c; returns the count (fills t when not NULL). */
static int list_tensors(const model_config_t *c, mk_tensor_t *t) {
    int n = 0;
#define ADD(nm, l, r, k, norm) do { if (t) { snprintf(t[n].name, sizeof t[n].name, nm, l); \
        t[n].n_dims = (k) ? 2 : 1; t[n].shape[0] = (r); t[n].shape[1] = (k); t[n].is_norm = (norm); } n++; } while (0)
    int qd = c->H * c->hd, kd = c->Hkv * c->hd;
    ADD("model.embed_tokens.weight%.0d", 0, c->V, c->D, 0);
    for (int l = 0; l < c->L; l++) {
        ADD("model.layers.%d.input_layernorm.weight", l, c->D, 0, 1);
        ADD("model.layers.%d.self_attn.q_proj.weight", l, qd, c->D, 0);
        ADD("model.layers.%d.self_attn.k_proj.weight", l, kd, c->D, 0);
        ADD("model.layers.%d.self_attn.v_proj.weight", l, kd, c->D, 0);
        if (c->attn_bias) {
            ADD("model.layers.%d.self_attn.q_proj.bias", l, qd, 0, 2);
            ADD("model.layers.%d.self_attn.k_proj.bias", l, kd, 0, 2);
            ADD("model.layers.%d.self_attn.v_proj.bias", l, kd, 0, 2);
        }
        ADD("model.layers.%d.self_attn.o_proj.weight", l, c->D, qd, 0);
        if (c->qk_norm) {
            ADD("model.layers.%d.self_attn.q_norm.weight", l, c->hd, 0, 1);
            ADD("model.layers.%d.self_attn.k_norm.weight", l, c->hd, 0, 1);
        }
        ADD("model.layers.%d.post_attention_layernorm.weight", l, c->D, 0, 1);
        if (model_config_layer_moe(c, l)) {   /* router, then the Hub's per-expert names */
            ADD("model.layers.%d.mlp.gate.weight", l, c->n_experts, c->D, 0);
            for (int e = 0; e < c->n_experts; e++) {
                char f[3][96];
                snprintf(f[0], sizeof f[0], "model.layers.%%d.mlp.experts.%d.gate_proj.weight", e);
                snprintf(f[1], sizeof f[1], "model.layers.%%d.mlp.experts.%d.up_proj.weight", e);
                snprintf(f[2], sizeof f[2], "model.layers.%%d.mlp.experts.%d.down_proj.weight", e);
                ADD(f[0], l, c->moe_F, c->D, 0);
                ADD(f[1], l, c->moe_F, c->D, 0);
                ADD(f[2], l, c->D, c->moe_F, 0);
            }
            continue;
        }
        ADD("model.layers.%d.mlp.gate_proj.weight", l, c->F, c->D, 0);
        ADD("model.layers.%d.mlp.up_proj.weight", l, c->F, c->D, 0);
        ADD("model.layers.%d.mlp.down_proj.weight", l, c->D, c->F, 0);
    }
    ADD("model.norm.weight%.0d", 0, c->D, 0, 1);
    if (!c->tie_embeddings) ADD("lm_head.weight%.0d", 0, c->V, c->D, 0);
#undef ADD
    return n;
}

static uint64_t nelem(const mk_tensor_t *t) { return (uint64_t)t->shape[0] * (t->n_dims == 2 ? (uint64_t)t->shape[1] : 1); }

static int copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    if (!in) return dl_seterr(errno == ENOENT ? DL_ENOENT : DL_EIO, "%s: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) { fclose(in); return dl_seterr(DL_EIO, "%s: %s", dst, strerror(errno)); }
    char buf[1 << 16];
    size_t n;
    int rc = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) { rc = dl_seterr(DL_EIO, "%s: write failed", dst); break; }
    fclose(in);
    if (fclose(out) != 0 && !rc) rc = dl_seterr(DL_EIO, "%s: close failed", dst);
    return rc;
}

static int write_text(const char *path, const char *text) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return dl_seterr(DL_EIO, "%s: %s", tmp, strerror(errno));
    int ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) return dl_seterr(DL_EIO, "%s: write failed", path);
    return 0;
}

int mkmodel_write(const model_config_t *c0, const char *dir, uint64_t seed, const char *dtype,
                  uint64_t shard_bytes, const char *tokenizer_dir) {
    model_config_t c = *c0;
    const char *stype;
    size_t es;
    if (!strcmp(dtype, "bf16")) { stype = "BF16"; es = 2; snprintf(c.dtype, sizeof c.dtype, "bfloat16"); }
    else if (!strcmp(dtype, "f16")) { stype = "F16"; es = 2; snprintf(c.dtype, sizeof c.dtype, "float16"); }
    else if (!strcmp(dtype, "f32")) { stype = "F32"; es = 4; snprintf(c.dtype, sizeof c.dtype, "float32"); }
    else return dl_seterr(DL_EINVAL, "--dtype: '%s' (bf16, f16, f32)", dtype);
    DL_TRY(model_config_validate(&c, "mkmodel"));
    if (!shard_bytes) shard_bytes = MK_DEFAULT_SHARD;
    DL_TRY(paths_mkdir_p(dir, 0755));
    int n = list_tensors(&c, NULL);
    mk_tensor_t *ts = calloc((size_t)n, sizeof *ts);
    float *f32 = malloc((size_t)MK_CHUNK * 4);
    void *buf = malloc((size_t)MK_CHUNK * es);
    if (!ts || !f32 || !buf) { free(ts); free(f32); free(buf); return dl_seterr(DL_ENOMEM, "mkmodel: out of memory"); }
    list_tensors(&c, ts);
    /* assign tensors to shards in order */
    int *shard_of = calloc((size_t)n, sizeof *shard_of);
    int n_shards = 1;
    uint64_t cur = 0, total = 0;
    for (int i = 0; i < n; i++) {
        uint64_t b = nelem(&ts[i]) * es;
        if (cur > 0 && cur + b > shard_bytes) { n_shards++; cur = 0; }
        cur += b;
        total += b;
        shard_of[i] = n_shards - 1;
    }
    int rc = 0;
    char path[PATH_MAX], fname[128];
    cJSON *wm = n_shards > 1 ? cJSON_CreateObject() : NULL;
    int ti = 0;
    for (int s = 0; s < n_shards && !rc; s++) {
        if (n_shards == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        st_writer_t *w = NULL;
        if ((rc = st_writer_new(path, &w)) < 0) break;
        st_writer_meta(w, "format", "pt");
        int first = ti;
        for (int i = first; i < n && shard_of[i] == s && !rc; i++) {
            rc = st_writer_add(w, ts[i].name, stype, ts[i].n_dims, ts[i].shape);
            if (wm) cJSON_AddStringToObject(wm, ts[i].name, fname);
        }
        for (int i = first; i < n && shard_of[i] == s && !rc; i++, ti++) {
            uint64_t ne = nelem(&ts[i]);
            for (uint64_t e0 = 0; e0 < ne && !rc; e0 += MK_CHUNK) {
                int k = (int)(ne - e0 < MK_CHUNK ? ne - e0 : MK_CHUNK);
                if (ts[i].is_norm == 1) {
                    for (int j = 0; j < k; j++) f32[j] = 1.0f;
                } else if (ts[i].is_norm == 2) {
                    for (int j = 0; j < k; j++) f32[j] = 0.0f;
                } else {
                    /* sub-chunks in parallel, each with its own stream */
                    #pragma omp parallel for schedule(static)
                    for (int sc = 0; sc < 16; sc++) {
                        int a = (int)((int64_t)k * sc / 16), b = (int)((int64_t)k * (sc + 1) / 16);
                        rng_t r;
                        rng_seed(&r, rng_mix(seed, (uint64_t)i, (e0 / MK_CHUNK) * 16 + (uint64_t)sc));
                        for (int j = a; j < b; j++) f32[j] = rng_normal(&r) * MK_INIT_STD;
                    }
                }
                if (es == 4) memcpy(buf, f32, (size_t)k * 4);
                else {
                    uint16_t *h = buf;
                    int bf = !strcmp(stype, "BF16");
                    #pragma omp parallel for schedule(static) if (k > 65536)
                    for (int j = 0; j < k; j++) h[j] = bf ? st_f32_to_bf16(f32[j]) : st_f32_to_f16(f32[j]);
                }
                rc = st_writer_write(w, buf, (size_t)k * es);
            }
        }
        if (rc) st_writer_abort(&w);
        else rc = st_writer_finish(&w);
        if (!rc) log_info("mkmodel: wrote %s", path);
    }
    if (!rc && wm) {
        cJSON *idx = cJSON_CreateObject();
        cJSON *meta = cJSON_AddObjectToObject(idx, "metadata");
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        cJSON_AddItemToObject(idx, "weight_map", wm);
        wm = NULL;
        char *txt = cJSON_Print(idx);
        cJSON_Delete(idx);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        rc = txt ? write_text(path, txt) : dl_seterr(DL_ENOMEM, "out of memory");
        free(txt);
    }
    cJSON_Delete(wm);
    if (!rc) {
        char *cfg = model_config_to_json(&c);
        snprintf(path, sizeof path, "%s/config.json", dir);
        rc = cfg ? write_text(path, cfg) : dl_seterr(DL_ENOMEM, "out of memory");
        free(cfg);
    }
    if (!rc && tokenizer_dir) {
        const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
        for (int i = 0; i < 2 && !rc; i++) {
            char src[PATH_MAX];
            snprintf(src, sizeof src, "%s/%s", tokenizer_dir, files[i]);
            snprintf(path, sizeof path, "%s/%s", dir, files[i]);
            if (i == 1 && access(src, R_OK) != 0) break;   /* tokenizer_config.json optional */
            rc = copy_file(src, path);
        }
    }
    free(shard_of);
    free(ts);
    free(f32);
    free(buf);
    return rc;
}
