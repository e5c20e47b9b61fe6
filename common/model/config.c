/* Model configuration parsing. See config.h. */
#include "common/model/config.h"

#include "common/base/err.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *model_family_name(model_family_t f) {
    switch (f) {
    case MODEL_LLAMA: return "llama";
    case MODEL_QWEN2: return "qwen2";
    case MODEL_QWEN3: return "qwen3";
    }
    return "unknown";
}

/* ---- config.json ---------------------------------------------------------- */

static int json_int(const cJSON *root, const char *key, const char *where, int required, int dflt,
                    int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return dl_seterr(DL_EFORMAT, "%s: field '%s' missing", where, key);
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < INT_MIN ||
        v->valuedouble > INT_MAX)
        return dl_seterr(DL_EFORMAT, "%s: field '%s': expected an integer", where, key);
    *out = (int)v->valuedouble;
    return 0;
}

static int json_num(const cJSON *root, const char *key, const char *where, int required,
                    double dflt, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return dl_seterr(DL_EFORMAT, "%s: field '%s' missing", where, key);
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(v)) return dl_seterr(DL_EFORMAT, "%s: field '%s': expected a number", where, key);
    *out = v->valuedouble;
    return 0;
}

static int json_bool(const cJSON *root, const char *key, const char *where, int dflt, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) { *out = dflt; return 0; }
    if (!cJSON_IsBool(v)) return dl_seterr(DL_EFORMAT, "%s: field '%s': expected true/false", where, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* rope: transformers 5 "rope_parameters" {rope_theta, rope_type, ...} or the classic
 * top-level "rope_theta" + "rope_scaling" {rope_type|type, factor, ...}. */
static int parse_rope(const cJSON *root, const char *where, rope_params_t *r) {
    memset(r, 0, sizeof *r);
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    double theta;
    DL_TRY(json_num(root, "rope_theta", where, 0, 10000.0, &theta));
    if (cJSON_IsObject(rp)) {
        DL_TRY(json_num(rp, "rope_theta", where, 0, theta, &theta));
        if (!sc || cJSON_IsNull(sc)) sc = rp;
    }
    r->theta = theta;
    if (!sc || cJSON_IsNull(sc)) return 0;
    if (!cJSON_IsObject(sc)) return dl_seterr(DL_EFORMAT, "%s: rope_scaling: expected an object", where);
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(sc, "rope_type");
    if (!cJSON_IsString(ty)) ty = cJSON_GetObjectItemCaseSensitive(sc, "type");
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "default";
    if (!strcmp(t, "default")) return 0;
    if (strcmp(t, "llama3"))
        return dl_seterr(DL_ENOTSUP, "%s: rope_scaling type '%s' not supported (default, llama3 are)",
                         where, t);
    r->llama3 = 1;
    DL_TRY(json_num(sc, "factor", where, 1, 0, &r->factor));
    DL_TRY(json_num(sc, "low_freq_factor", where, 1, 0, &r->low_freq_factor));
    DL_TRY(json_num(sc, "high_freq_factor", where, 1, 0, &r->high_freq_factor));
    DL_TRY(json_int(sc, "original_max_position_embeddings", where, 1, 0,
                    &r->original_max_position_embeddings));
    return 0;
}

/* Qwen3MoeConfig: experts, and which layers are sparse (Qwen3MoeDecoderLayer: l not in
 * mlp_only_layers and num_experts > 0 and (l + 1) % decoder_sparse_step == 0). */
static int parse_moe(const cJSON *root, const char *where, model_config_t *c) {
    const char *ne = cJSON_GetObjectItemCaseSensitive(root, "num_experts") ? "num_experts"
                                                                           : "num_local_experts";
    int step;
    DL_TRY(json_int(root, ne, where, 1, 0, &c->n_experts));
    DL_TRY(json_int(root, "num_experts_per_tok", where, 1, 0, &c->top_k));
    DL_TRY(json_int(root, "moe_intermediate_size", where, 1, 0, &c->moe_F));
    DL_TRY(json_bool(root, "norm_topk_prob", where, 0, &c->norm_topk));
    DL_TRY(json_int(root, "decoder_sparse_step", where, 0, 1, &step));
    if (step < 1) return dl_seterr(DL_EFORMAT, "%s: decoder_sparse_step %d must be >= 1", where, step);
    if (c->L > MODEL_MAX_MOE_LAYERS)
        return dl_seterr(DL_ENOTSUP, "%s: %d layers: MoE models of at most %d layers supported", where,
                         c->L, MODEL_MAX_MOE_LAYERS);
    if (c->n_experts <= 0) return 0;
    for (int l = 0; l < c->L; l++)
        if ((l + 1) % step == 0) c->moe_layers[l / 64] |= UINT64_C(1) << (l % 64);
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers"), *e;
    if (only && !cJSON_IsNull(only) && !cJSON_IsArray(only))
        return dl_seterr(DL_EFORMAT, "%s: field 'mlp_only_layers': expected an array", where);
    cJSON_ArrayForEach(e, only) {
        if (!cJSON_IsNumber(e))
            return dl_seterr(DL_EFORMAT, "%s: mlp_only_layers: expected integers", where);
        /* transformers ignores a layer it does not have; here it is a typo'd config */
        double v = e->valuedouble;
        if (v != (int)v || v < 0 || v >= c->L)
            return dl_seterr(DL_EFORMAT, "%s: mlp_only_layers: %g is not a layer (0..%d)", where, v, c->L - 1);
        int l = (int)v;
        c->moe_layers[l / 64] &= ~(UINT64_C(1) << (l % 64));
    }
    return 0;
}

static int parse_config(const cJSON *root, const char *where, model_config_t *c) {
    memset(c, 0, sizeof *c);
    int moe = 0;
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const char *arch = NULL;
    if (cJSON_IsArray(archs) && cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
        arch = cJSON_GetArrayItem(archs, 0)->valuestring;
    const char *mtype = cJSON_IsString(mt) ? mt->valuestring : "";
    if (arch) snprintf(c->arch, sizeof c->arch, "%s", arch);
    else snprintf(c->arch, sizeof c->arch, "%s", mtype);
    if ((arch && !strcmp(arch, "LlamaForCausalLM")) || (!arch && !strcmp(mtype, "llama")))
        c->family = MODEL_LLAMA;
    else if ((arch && !strcmp(arch, "Qwen2ForCausalLM")) || (!arch && !strcmp(mtype, "qwen2")))
        c->family = MODEL_QWEN2;
    else if ((arch && !strcmp(arch, "Qwen3ForCausalLM")) || (!arch && !strcmp(mtype, "qwen3")))
        c->family = MODEL_QWEN3;
    else if ((arch && !strcmp(arch, "Qwen3MoeForCausalLM")) || (!arch && !strcmp(mtype, "qwen3_moe"))) {
        c->family = MODEL_QWEN3;
        moe = 1;
    } else
        return dl_seterr(DL_ENOTSUP, "%s: architecture '%s' (model_type '%s') not supported "
                         "(LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                         "Qwen3MoeForCausalLM are)", where, arch ? arch : "?", mtype);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "silu"))
        return dl_seterr(DL_ENOTSUP, "%s: hidden_act '%s' not supported (silu is)", where, act->valuestring);
    DL_TRY(json_int(root, "num_hidden_layers", where, 1, 0, &c->L));
    DL_TRY(json_int(root, "hidden_size", where, 1, 0, &c->D));
    DL_TRY(json_int(root, "num_attention_heads", where, 1, 0, &c->H));
    DL_TRY(json_int(root, "num_key_value_heads", where, 0, c->H, &c->Hkv));
    DL_TRY(json_int(root, "intermediate_size", where, 1, 0, &c->F));
    DL_TRY(json_int(root, "vocab_size", where, 1, 0, &c->V));
    if (c->H <= 0) return dl_seterr(DL_EFORMAT, "%s: num_attention_heads must be > 0", where);
    DL_TRY(json_int(root, "head_dim", where, 0, c->D / c->H, &c->hd));
    double eps;
    DL_TRY(json_num(root, "rms_norm_eps", where, 0, 1e-6, &eps));
    c->eps = (float)eps;
    DL_TRY(parse_rope(root, where, &c->rope));
    DL_TRY(json_int(root, "max_position_embeddings", where, 0, 0, &c->max_pos));
    DL_TRY(json_bool(root, "tie_word_embeddings", where, 0, &c->tie_embeddings));
    int ab, mb;
    DL_TRY(json_bool(root, "attention_bias", where, 0, &ab));
    DL_TRY(json_bool(root, "mlp_bias", where, 0, &mb));
    switch (c->family) {
    case MODEL_LLAMA: c->attn_bias = ab; c->o_bias = ab; c->mlp_bias = mb; break;
    case MODEL_QWEN2: c->attn_bias = 1; c->o_bias = 0; c->mlp_bias = 0; break;
    case MODEL_QWEN3: c->attn_bias = ab; c->o_bias = ab; c->mlp_bias = 0; c->qk_norm = 1; break;
    }
    if (moe) DL_TRY(parse_moe(root, where, c));
    DL_TRY(json_int(root, "bos_token_id", where, 0, -1, &c->bos_id));
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (cJSON_IsNumber(eos)) c->eos_ids[c->n_eos++] = (int)eos->valuedouble;
    else if (cJSON_IsArray(eos)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, eos) if (cJSON_IsNumber(e) && c->n_eos < MODEL_MAX_EOS)
            c->eos_ids[c->n_eos++] = (int)e->valuedouble;
    }
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
    if (!cJSON_IsString(dt)) dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    if (cJSON_IsString(dt)) snprintf(c->dtype, sizeof c->dtype, "%s", dt->valuestring);
    return model_config_validate(c, where);
}

int model_config_from_json(const char *json, const char *where, model_config_t *out) {
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        if (!root) { /* say where the text stops parsing: line of cJSON's error pointer */
            const char *ep = cJSON_GetErrorPtr();
            size_t n = strlen(json);
            if (ep && ep >= json && ep <= json + n) {
                int line = 1;
                for (const char *q = json; q < ep; q++) line += *q == '\n';
                return dl_seterr(DL_EFORMAT, "%s: invalid JSON at line %d", where, line);
            }
            return dl_seterr(DL_EFORMAT, "%s: invalid JSON", where);
        }
        cJSON_Delete(root);
        return dl_seterr(DL_EFORMAT, "%s: not a JSON object", where);
    }
    int rc = parse_config(root, where, out);
    cJSON_Delete(root);
    return rc;
}

int model_config_from_hf_dir(const char *dir, model_config_t *out) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return dl_seterr(errno == ENOENT ? DL_ENOENT : DL_EIO, "%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    if (n < 0 || n > (16 << 20)) {
        fclose(f);
        return dl_seterr(DL_EFORMAT, "%s: bad size", path);
    }
    char *b = malloc((size_t)n + 1);
    if (!b) { fclose(f); return dl_seterr(DL_ENOMEM, "%s: out of memory", path); }
    size_t got = fread(b, 1, (size_t)n, f);
    fclose(f);
    b[got] = 0;
    int rc = model_config_from_json(b, path, out);
    free(b);
    return rc;
}

/* ---- GGUF ------------------------------------------------------------------ */

static int gguf_int(const gguf_t *g, const char *arch, const char *suffix, int required, int dflt,
                    int *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint64_t v;
    int rc = gguf_get_u64(g, key, &v);
    if (rc == DL_ENOENT && !required) { *out = dflt; dl_clearerr(); return 0; }
    if (rc < 0) return rc;
    if (v > INT_MAX) return dl_seterr(DL_EFORMAT, "GGUF metadata '%s' = %llu too large", key, (unsigned long long)v);
    *out = (int)v;
    return 0;
}

static int gguf_num(const gguf_t *g, const char *arch, const char *suffix, int required,
                    double dflt, double *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_f64(g, key, out);
    if (rc == DL_ENOENT && !required) { *out = dflt; dl_clearerr(); return 0; }
    return rc;
}

/* llama.cpp qwen3moe (convert_hf_to_gguf.py Qwen3MoeModel, gguf-py constants): the
 * expert_* keys; a layer is sparse iff it has blk.L.ffn_gate_inp.weight (the file names no
 * decoder_sparse_step / mlp_only_layers); llama.cpp always renormalises the top-k weights
 * for qwen3moe (llm_build_qwen3moe, norm_w = true) unless expert_weights_norm says otherwise. */
static int gguf_moe(const gguf_t *g, const char *arch, model_config_t *c) {
    DL_TRY(gguf_int(g, arch, "block_count", 1, 0, &c->L));
    DL_TRY(gguf_int(g, arch, "expert_count", 1, 0, &c->n_experts));
    DL_TRY(gguf_int(g, arch, "expert_used_count", 1, 0, &c->top_k));
    DL_TRY(gguf_int(g, arch, "expert_feed_forward_length", 1, 0, &c->moe_F));
    DL_TRY(gguf_int(g, arch, "expert_weights_norm", 0, 1, &c->norm_topk));
    if (c->L > MODEL_MAX_MOE_LAYERS)
        return dl_seterr(DL_ENOTSUP, "GGUF: %d layers: MoE models of at most %d layers supported", c->L,
                         MODEL_MAX_MOE_LAYERS);
    for (int l = 0; l < c->L; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
        const gguf_tensor_t *r = gguf_find_tensor(g, name);   /* the router: ne [D, E] */
        if (!r) continue;
        if (r->ne[1] != (uint64_t)c->n_experts)
            return dl_seterr(DL_EFORMAT, "GGUF: %s.expert_count %d, but %s routes to %llu experts", arch,
                             c->n_experts, name, (unsigned long long)r->ne[1]);
        c->moe_layers[l / 64] |= UINT64_C(1) << (l % 64);
    }
    return 0;
}

int model_config_from_gguf(const gguf_t *g, model_config_t *c) {
    memset(c, 0, sizeof *c);
    gguf_str_t a;
    DL_TRY(gguf_get_str(g, "general.architecture", &a));
    char arch[64];
    snprintf(arch, sizeof arch, "%.*s", (int)(a.len < 63 ? a.len : 63), a.data);
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    if (!strcmp(arch, "llama")) c->family = MODEL_LLAMA;
    else if (!strcmp(arch, "qwen2")) c->family = MODEL_QWEN2;
    else if (!strcmp(arch, "qwen3") || !strcmp(arch, "qwen3moe")) c->family = MODEL_QWEN3;
    else return dl_seterr(DL_ENOTSUP, "GGUF architecture '%s' not supported (llama, qwen2, qwen3, "
                          "qwen3moe are)", arch);
    int moe = !strcmp(arch, "qwen3moe");
    if (moe) DL_TRY(gguf_moe(g, arch, c));
    DL_TRY(gguf_int(g, arch, "block_count", 1, 0, &c->L));
    DL_TRY(gguf_int(g, arch, "embedding_length", 1, 0, &c->D));
    DL_TRY(gguf_int(g, arch, "attention.head_count", 1, 0, &c->H));
    DL_TRY(gguf_int(g, arch, "attention.head_count_kv", 0, c->H, &c->Hkv));
    DL_TRY(gguf_int(g, arch, "feed_forward_length", !moe, c->moe_F, &c->F));
    if (c->H <= 0) return dl_seterr(DL_EFORMAT, "GGUF: %s.attention.head_count must be > 0", arch);
    DL_TRY(gguf_int(g, arch, "attention.key_length", 0, c->D / c->H, &c->hd));
    DL_TRY(gguf_int(g, arch, "context_length", 0, 0, &c->max_pos));
    double eps, theta;
    DL_TRY(gguf_num(g, arch, "attention.layer_norm_rms_epsilon", 0, 1e-6, &eps));
    DL_TRY(gguf_num(g, arch, "rope.freq_base", 0, 10000.0, &theta));
    c->eps = (float)eps;
    c->rope.theta = theta;
    /* Llama-3 GGUFs carry the scaled frequencies as a rope_freqs.weight tensor; the
     * target loader applies it. */
    const gguf_tensor_t *emb = gguf_find_tensor(g, "token_embd.weight");
    if (!emb) return dl_seterr(DL_EFORMAT, "GGUF: tensor token_embd.weight missing");
    int vocab = (int)emb->ne[1];
    DL_TRY(gguf_int(g, arch, "vocab_size", 0, vocab, &c->V));
    c->tie_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
    c->attn_bias = gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    c->o_bias = gguf_find_tensor(g, "blk.0.attn_output.bias") != NULL;
    c->mlp_bias = gguf_find_tensor(g, "blk.0.ffn_up.bias") != NULL;
    c->qk_norm = gguf_find_tensor(g, "blk.0.attn_q_norm.weight") != NULL;
    uint64_t v;
    c->bos_id = gguf_get_u64(g, "tokenizer.ggml.bos_token_id", &v) == 0 ? (int)v : -1;
    if (gguf_get_u64(g, "tokenizer.ggml.eos_token_id", &v) == 0) c->eos_ids[c->n_eos++] = (int)v;
    if (gguf_get_u64(g, "tokenizer.ggml.eot_token_id", &v) == 0 && (c->n_eos == 0 || c->eos_ids[0] != (int)v))
        c->eos_ids[c->n_eos++] = (int)v;
    dl_clearerr();
    return model_config_validate(c, "GGUF metadata");
}

int model_config_validate(const model_config_t *c, const char *where) {
    if (c->L <= 0 || c->D <= 0 || c->H <= 0 || c->Hkv <= 0 || c->hd <= 0 || c->F <= 0 || c->V <= 0)
        return dl_seterr(DL_EFORMAT, "%s: sizes must be positive (L %d D %d H %d Hkv %d hd %d F %d V %d)",
                         where, c->L, c->D, c->H, c->Hkv, c->hd, c->F, c->V);
    if (c->H % c->Hkv)
        return dl_seterr(DL_EFORMAT, "%s: num_attention_heads %d not a multiple of num_key_value_heads %d",
                         where, c->H, c->Hkv);
    if (c->n_experts < 0 || (c->n_experts > 0 && (c->top_k < 1 || c->top_k > c->n_experts || c->moe_F <= 0)))
        return dl_seterr(DL_EFORMAT, "%s: MoE: num_experts %d, num_experts_per_tok %d (must be in [1, "
                         "num_experts]), moe_intermediate_size %d (must be > 0)", where, c->n_experts,
                         c->top_k, c->moe_F);
    if (c->hd % 2) return dl_seterr(DL_EFORMAT, "%s: head_dim %d must be even (RoPE)", where, c->hd);
    if (!(c->eps > 0)) return dl_seterr(DL_EFORMAT, "%s: rms_norm_eps must be > 0", where);
    if (!(c->rope.theta > 0)) return dl_seterr(DL_EFORMAT, "%s: rope_theta must be > 0", where);
    if (c->rope.llama3 && (!(c->rope.factor > 0) || !(c->rope.high_freq_factor > c->rope.low_freq_factor) ||
                           c->rope.original_max_position_embeddings <= 0))
        return dl_seterr(DL_EFORMAT, "%s: llama3 rope_scaling needs factor > 0, high_freq_factor > "
                         "low_freq_factor, original_max_position_embeddings > 0", where);
    return 0;
}

int model_config_n_moe_layers(const model_config_t *c) {
    int n = 0;
    for (int l = 0; l < c->L; l++) n += model_config_layer_moe(c, l);
    return n;
}

/* Parameters with n_used experts per MoE layer. */
static uint64_t n_params_with(const model_config_t *c, int n_used) {
    uint64_t D = c->D, F = c->F, V = c->V, q = (uint64_t)c->H * c->hd, kv = (uint64_t)c->Hkv * c->hd;
    uint64_t layer = D * q + 2 * D * kv + q * D + 2 * D;
    if (c->attn_bias) layer += q + 2 * kv;
    if (c->o_bias) layer += D;
    if (c->qk_norm) layer += 2 * (uint64_t)c->hd;
    uint64_t dense = 3 * D * F + (c->mlp_bias ? 2 * F + D : 0);
    uint64_t sparse = (uint64_t)c->n_experts * D + (uint64_t)n_used * 3 * D * c->moe_F;
    int n_moe = model_config_n_moe_layers(c);
    return V * D * (c->tie_embeddings ? 1 : 2) + D + (uint64_t)c->L * layer +
           (uint64_t)(c->L - n_moe) * dense + (uint64_t)n_moe * sparse;
}

uint64_t model_config_n_params(const model_config_t *c) { return n_params_with(c, c->n_experts); }
uint64_t model_config_n_active_params(const model_config_t *c) { return n_params_with(c, c->top_k); }

char *model_config_to_json(const model_config_t *c) {
    static const char *archs[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
    cJSON *r = cJSON_CreateObject();
    if (!r) return NULL;
    cJSON *a = cJSON_AddArrayToObject(r, "architectures");
    int moe = c->n_experts > 0;
    cJSON_AddItemToArray(a, cJSON_CreateString(moe ? "Qwen3MoeForCausalLM" : archs[c->family]));
    cJSON_AddBoolToObject(r, "attention_bias", c->family == MODEL_QWEN2 ? 0 : c->attn_bias);
    cJSON_AddNumberToObject(r, "attention_dropout", 0.0);
    if (c->bos_id >= 0) cJSON_AddNumberToObject(r, "bos_token_id", c->bos_id);
    if (c->n_eos == 1) cJSON_AddNumberToObject(r, "eos_token_id", c->eos_ids[0]);
    else if (c->n_eos > 1) {
        cJSON *e = cJSON_AddArrayToObject(r, "eos_token_id");
        for (int i = 0; i < c->n_eos; i++) cJSON_AddItemToArray(e, cJSON_CreateNumber(c->eos_ids[i]));
    }
    cJSON_AddNumberToObject(r, "head_dim", c->hd);
    cJSON_AddStringToObject(r, "hidden_act", "silu");
    cJSON_AddNumberToObject(r, "hidden_size", c->D);
    cJSON_AddNumberToObject(r, "initializer_range", 0.02);
    cJSON_AddNumberToObject(r, "intermediate_size", c->F);
    cJSON_AddNumberToObject(r, "max_position_embeddings", c->max_pos);
    if (moe) { /* the dense layers as mlp_only_layers: the same set whatever the original step */
        cJSON_AddNumberToObject(r, "decoder_sparse_step", 1);
        cJSON *only = cJSON_AddArrayToObject(r, "mlp_only_layers");
        for (int l = 0; l < c->L; l++)
            if (!model_config_layer_moe(c, l)) cJSON_AddItemToArray(only, cJSON_CreateNumber(l));
        cJSON_AddNumberToObject(r, "moe_intermediate_size", c->moe_F);
    }
    if (c->family == MODEL_LLAMA) cJSON_AddBoolToObject(r, "mlp_bias", c->mlp_bias);
    cJSON_AddStringToObject(r, "model_type", moe ? "qwen3_moe" : model_family_name(c->family));
    if (moe) {
        cJSON_AddBoolToObject(r, "norm_topk_prob", c->norm_topk);
        cJSON_AddNumberToObject(r, "num_experts", c->n_experts);
        cJSON_AddNumberToObject(r, "num_experts_per_tok", c->top_k);
    }
    cJSON_AddNumberToObject(r, "num_attention_heads", c->H);
    cJSON_AddNumberToObject(r, "num_hidden_layers", c->L);
    cJSON_AddNumberToObject(r, "num_key_value_heads", c->Hkv);
    cJSON_AddNumberToObject(r, "rms_norm_eps", c->eps);
    if (c->rope.llama3) {
        cJSON *s = cJSON_AddObjectToObject(r, "rope_scaling");
        cJSON_AddNumberToObject(s, "factor", c->rope.factor);
        cJSON_AddNumberToObject(s, "high_freq_factor", c->rope.high_freq_factor);
        cJSON_AddNumberToObject(s, "low_freq_factor", c->rope.low_freq_factor);
        cJSON_AddNumberToObject(s, "original_max_position_embeddings",
                                c->rope.original_max_position_embeddings);
        cJSON_AddStringToObject(s, "rope_type", "llama3");
    } else {
        cJSON_AddNullToObject(r, "rope_scaling");
    }
    cJSON_AddNumberToObject(r, "rope_theta", c->rope.theta);
    cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tie_embeddings);
    cJSON_AddStringToObject(r, "torch_dtype", c->dtype[0] ? c->dtype : "bfloat16");
    cJSON_AddBoolToObject(r, "use_cache", 1);
    cJSON_AddNumberToObject(r, "vocab_size", c->V);
    char *s = cJSON_Print(r);
    cJSON_Delete(r);
    return s;
}
