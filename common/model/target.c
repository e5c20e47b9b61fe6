/* The target transformer: loading, packed forward with capture, KV-cache forward.
 * See target.h. */
#include "common/model/target.h"

#include "common/base/err.h"
#include "common/base/log.h"
#include "common/format/gguf.h"
#include "common/format/safetensors.h"
#include "common/model/target_fp8.h"
#include "common/model/target_moe.h"
#include "common/model/target_stage.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The MLP runs over chunks of at most this many tokens, so its three (chunk, F)
 * buffers stay bounded whatever the token budget (GEMMs of 16k rows are still at
 * full speed on a GPU). */
#define TARGET_MLP_CHUNK 16384

typedef struct {
    void *attn_norm;                 /* (D) */
    void *wq, *wk, *wv, *wo;         /* (H*hd, D), (Hkv*hd, D) x2, (D, H*hd) */
    void *bq, *bk, *bv, *bo;         /* biases or NULL */
    void *q_norm, *k_norm;           /* (hd) or NULL */
    void *mlp_norm;                  /* (D) */
    void *wg, *wu, *wd;              /* (F, D), (F, D), (D, F) */
    void *bg, *bu, *bd;              /* biases or NULL */
    target_moe_t moe;                /* MoE layers (model_config_layer_moe): wg/wu/wd NULL */
    target_fp8_layer_t f8;           /* precision fp8: the E4M3 linears (wq..wd then NULL) */
} tlayer_t;

struct target {
    model_config_t cfg;
    target_opts_t opts;
    const ops_ctx_t *c;
    size_t ab;                       /* act bytes */
    void *embed, *lm_head, *final_norm;
    tlayer_t *layers;
    float *inv_freq;                 /* (hd/2) f32 backend */
    size_t weight_bytes;
    int last_capture;                /* largest captured layer id, -1 if none */
    int mlp_chunk;
    /* activations (act, backend), sized for opts.max_tokens */
    void *x, *xn, *q, *k, *v, *att, *qn, *kn;  /* (T,D) (T,D) (T,H*hd) (T,Hkv*hd) x2 (T,H*hd) (T,H*hd) (T,Hkv*hd) */
    void *gate, *up, *hmlp;          /* (chunk, max(F, k*Fm)): dense, or the chunk's routed rows */
    target_moe_scratch_t moe_s;      /* MoE block scratch (MoE targets only) */
    target_fp8_scratch_t f8s;        /* precision fp8: the quantized input of a linear */
    /* i32 backend */
    int32_t *d_ids, *d_pos, *d_cu, *d_cs, *d_cl, *d_gather;
    /* host scratch */
    int32_t *h_pos, *h_cs, *h_cl, *h_gather;
};

struct target_kv {
    target_t *t;
    int n_slots, cap;
    void **k, **v;                   /* per layer (n_slots*cap, Hkv, hd) act */
};

/* ---- small helpers ------------------------------------------------------- */

static inline void *act_at(const target_t *t, void *p, size_t elems) {
    return (char *)p + elems * t->ab;
}

int target_default_layer_ids(int L, int n, int *out) {
    if (n < 1) return dl_seterr(DL_EINVAL, "target layer ids: n = %d must be >= 1", n);
    if (n == 1) {
        out[0] = L / 2;
        return 0;
    }
    if (L < 4) return dl_seterr(DL_EINVAL, "target layer ids: %d layers < 4 for %d features", L, n);
    for (int i = 0; i < n; i++) {
        double x = 1.0 + (double)i * (L - 4) / (n - 1);
        out[i] = (int)nearbyint(x);   /* default rounding mode: half to even, as Python */
    }
    return 0;
}

const model_config_t *target_config(const target_t *t) { return &t->cfg; }
const target_opts_t *target_opts(const target_t *t) { return &t->opts; }
const ops_ctx_t *target_ops(const target_t *t) { return t->c; }
const void *target_embed(const target_t *t) { return t->embed; }
const void *target_lm_head(const target_t *t) { return t->lm_head; }
size_t target_weight_bytes(const target_t *t) { return t->weight_bytes; }
void *target_scratch_hidden(target_t *t) { return t->xn; }
target_moe_scratch_t *target__moe_scratch(target_t *t) { return &t->moe_s; }

/* ---- loading ------------------------------------------------------------- */

typedef struct {
    gguf_t *g;
    safetensors_t *st;
    const char *path;
    float *tmp;          /* host scratch (GGUF dequantization) */
    size_t tmp_cap;      /* elements */
    target_stage_t stage;   /* safetensors conversion and upload (target_stage.h) */
} src_t;

static int tmp_reserve(src_t *s, size_t n) {
    if (n <= s->tmp_cap) return 0;
    float *p = realloc(s->tmp, n * sizeof *p);
    if (!p) return dl_seterr(DL_ENOMEM, "%s: no host memory for a %zu-element tensor", s->path, n);
    s->tmp = p;
    s->tmp_cap = n;
    return 0;
}

/* Waits for the last staged upload and frees the staging and the scratch. */
static void src_release(src_t *s) {
    target_stage_release(&s->stage);
    free(s->tmp);
}

/* The safetensors tensor `name` (rows, cols) (cols == 0: 1-D of rows) in *out; optional:
 * absent gives *out = NULL. DL_EFORMAT naming the tensor and the file (missing, shape). */
static int find_st(const src_t *s, const char *name, int rows, int cols, int optional,
                   const st_tensor_t **out) {
    const st_tensor_t *st = *out = safetensors_find(s->st, name);
    if (!st) {
        if (optional) return 0;
        return dl_seterr(DL_EFORMAT, "%s: tensor '%s' missing", s->path, name);
    }
    int ok = cols ? (st->n_dims == 2 && st->shape[0] == rows && st->shape[1] == cols)
                  : (st->n_dims == 1 && st->shape[0] == rows);
    if (!ok) {
        *out = NULL;
        return dl_seterr(DL_EFORMAT, "%s: tensor '%s': shape (%lld, %lld) (%d dims), expected (%d, %d)",
                         s->path, name, (long long)st->shape[0],
                         (long long)(st->n_dims > 1 ? st->shape[1] : 0), st->n_dims, rows, cols);
    }
    return 0;
}

/* A new backend act buffer *dst holding the n_parts safetensors tensors (of one size, shapes
 * checked) end to end, through the stage; `what` names them in errors. 0 or an error. */
static int load_st_parts(target_t *t, src_t *s, const st_tensor_t *const *parts, int n_parts,
                         const char *what, void **dst) {
    size_t b = (size_t)st_tensor_nelem(parts[0]) * n_parts * t->ab;
    void *d = t->c->impl->malloc_(t->c, b);
    if (!d) return dl_seterr(DL_ENOMEM, "%s: tensor '%s': cannot allocate %zu bytes on the %s backend",
                             s->path, what, b, t->c->impl->name);
    int rc = target_stage_fill(&s->stage, s->path, parts, n_parts, d);
    if (rc < 0) {
        t->c->impl->sync(t->c);     /* no staged copy may still write into d */
        t->c->impl->free_(t->c, d);
        return rc;
    }
    t->weight_bytes += b;
    *dst = d;
    return 0;
}

/* GGUF (llama arch) stores q/k rows in llama.cpp's rope order: HF row h*hd + j*hd/2 + i
 * sits at GGUF row h*hd + 2i + j (convert_hf_to_gguf.py permute). Undo it. */
static int unpermute_rows(float *w, int n_head, int hd, int cols) {
    size_t rowb = (size_t)cols * sizeof(float);
    float *tmp = malloc((size_t)hd * rowb);
    if (!tmp) return dl_seterr(DL_ENOMEM, "unpermute: out of memory");
    for (int h = 0; h < n_head; h++) {
        float *blk = w + (size_t)h * hd * cols;
        for (int i = 0; i < hd / 2; i++)
            for (int j = 0; j < 2; j++)
                memcpy(tmp + ((size_t)j * (hd / 2) + i) * cols, blk + ((size_t)2 * i + j) * cols, rowb);
        memcpy(blk, tmp, (size_t)hd * rowb);
    }
    free(tmp);
    return 0;
}

/* Loads tensor (rows, cols) (cols == 0: 1-D of rows) into a new backend act buffer.
 * hf/gg: names in the two formats (printf with layer l). permute_heads > 0: GGUF llama
 * q/k row un-permutation with that many heads. optional: absent -> *dst = NULL. */
static int load_tensor(target_t *t, src_t *s, const char *hf, const char *gg, int l, int rows,
                       int cols, int optional, int permute_heads, void **dst) {
    char name[160];
    *dst = NULL;
    size_t n = (size_t)rows * (cols ? cols : 1);
    if (s->g) {
        snprintf(name, sizeof name, gg, l);
        const gguf_tensor_t *gt = gguf_find_tensor(s->g, name);
        if (!gt) {
            if (optional) return 0;
            return dl_seterr(DL_EFORMAT, "%s: tensor '%s' missing", s->path, name);
        }
        int ok = cols ? (gt->n_dims == 2 && gt->ne[0] == (uint64_t)cols && gt->ne[1] == (uint64_t)rows)
                      : (gt->n_dims == 1 && gt->ne[0] == (uint64_t)rows);
        if (!ok)
            return dl_seterr(DL_EFORMAT, "%s: tensor '%s': ggml shape [%llu, %llu], expected [%d, %d]",
                             s->path, name, (unsigned long long)gt->ne[0],
                             (unsigned long long)gt->ne[1], cols ? cols : rows, cols ? rows : 1);
        DL_TRY(tmp_reserve(s, n));
        int rc = gguf_dequantize(gt, s->tmp);
        if (rc < 0) return dl_wraperr(rc, "%s", s->path);
        if (permute_heads > 0) DL_TRY(unpermute_rows(s->tmp, permute_heads, rows / permute_heads, cols ? cols : 1));
    } else {
        snprintf(name, sizeof name, hf, l);
        const st_tensor_t *st;
        DL_TRY(find_st(s, name, rows, cols, optional, &st));
        return st ? load_st_parts(t, s, &st, 1, name, dst) : 0;
    }
    void *d = t->c->impl->malloc_(t->c, n * t->ab);
    if (!d) return dl_seterr(DL_ENOMEM, "%s: tensor '%s': cannot allocate %zu bytes on the %s backend",
                             s->path, name, n * t->ab, t->c->impl->name);
    t->c->impl->upload_act(t->c, d, s->tmp, n);
    t->weight_bytes += n * t->ab;
    *dst = d;
    return 0;
}

/* HF fused stacked expert tensor `name` (E, rows, cols) into a new backend buffer *dst: 1,
 * 0 when absent, or an error (DL_EFORMAT shape, DL_ENOMEM). */
static int load_st_stacked(target_t *t, src_t *s, const char *name, int E, int rows, int cols,
                           void **dst) {
    const st_tensor_t *st = safetensors_find(s->st, name);
    if (!st) return 0;
    if (st->n_dims != 3 || st->shape[0] != E || st->shape[1] != rows || st->shape[2] != cols)
        return dl_seterr(DL_EFORMAT, "%s: tensor '%s': shape (%lld, %lld, %lld) (%d dims), expected (%d, %d, %d)",
                         s->path, name, (long long)st->shape[0], (long long)(st->n_dims > 1 ? st->shape[1] : 0),
                         (long long)(st->n_dims > 2 ? st->shape[2] : 0), st->n_dims, E, rows, cols);
    DL_TRY(load_st_parts(t, s, &st, 1, name, dst));
    return 1;
}

/* HF per-expert tensors of layer l into the stacked gate (E, Fm, D), up (E, Fm, D), down
 * (E, D, Fm) buffers y->stack[0..2], each filled from its E tensors in one staged pass: no
 * per-expert allocation, copy or sync. Every tensor is checked (in expert order, gate, up,
 * down: the first missing or misshapen one is the error) before anything is allocated. */
static int load_experts_hf(target_t *t, src_t *s, int l, target_moe_t *y) {
    const model_config_t *m = &t->cfg;
    int D = m->D, E = m->n_experts, Fm = m->moe_F, rc = 0;
    static const char *proj[3] = {"gate", "up", "down"};
    const st_tensor_t **parts = malloc((size_t)3 * E * sizeof *parts);   /* [proj][expert] */
    if (!parts) return dl_seterr(DL_ENOMEM, "target: out of memory (experts)");
    char nm[160];
    for (int e = 0; e < E && rc == 0; e++)
        for (int i = 0; i < 3 && rc == 0; i++) {
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s_proj.weight", l, e, proj[i]);
            rc = find_st(s, nm, i < 2 ? Fm : D, i < 2 ? D : Fm, 0, &parts[(size_t)i * E + e]);
        }
    for (int i = 0; i < 3 && rc == 0; i++) {
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.[0-%d].%s_proj.weight", l, E - 1, proj[i]);
        rc = load_st_parts(t, s, parts + (size_t)i * E, E, nm, &y->stack[i]);
    }
    free(parts);
    if (rc == 0) target_moe__point_stacked(y, E, Fm, D, t->ab, 0);
    return rc;
}

/* Layer l's MoE block. Expert layouts accepted:
 *   HF per-expert  model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight (Fm,D) (D,Fm):
 *                  the Hub checkpoints (Qwen/Qwen3-30B-A3B, ...) and what transformers 5.24's
 *                  save_pretrained writes (it converts its fused in-memory layout back);
 *                  loaded into stacked buffers as GGUF's (load_experts_hf);
 *   HF fused       model.layers.L.mlp.experts.gate_up_proj (E, 2Fm, D) (gate rows first) and
 *                  experts.down_proj (E, D, Fm): transformers 5's Qwen3MoeExperts parameters;
 *   GGUF qwen3moe  blk.L.ffn_{gate,up,down}_exps.weight, ggml ne [D, Fm, E], [D, Fm, E],
 *                  [Fm, D, E] (convert_hf_to_gguf.py stacks the experts on a new dim 0).
 * The router is model.layers.L.mlp.gate.weight (E, D) / blk.L.ffn_gate_inp.weight. */
static int load_moe_layer(target_t *t, src_t *s, int l, target_moe_t *y) {
    const model_config_t *m = &t->cfg;
    int D = m->D, E = m->n_experts, Fm = m->moe_F, rc;
    char nm[160];
    DL_TRY(target_moe__alloc(y, E));
    DL_TRY(load_tensor(t, s, "model.layers.%d.mlp.gate.weight", "blk.%d.ffn_gate_inp.weight", l, E, D, 0,
                       0, &y->router));
    if (s->g) {
        static const char *gg[3] = {"gate", "up", "down"};
        for (int i = 0; i < 3; i++) {
            snprintf(nm, sizeof nm, "blk.%d.ffn_%s_exps.weight", l, gg[i]);
            rc = target_moe__load_gguf_stacked(t->c, s->g, s->path, nm, E, i < 2 ? Fm : D,
                                               i < 2 ? D : Fm, &y->stack[i], &t->weight_bytes);
            if (rc < 0) return rc;
            if (rc == 0) return dl_seterr(DL_EFORMAT, "%s: tensor '%s' missing", s->path, nm);
        }
        target_moe__point_stacked(y, E, Fm, D, t->ab, 0);
        return 0;
    }
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj", l);
    rc = load_st_stacked(t, s, nm, E, 2 * Fm, D, &y->stack[0]);
    if (rc < 0) return rc;
    if (rc == 0) return load_experts_hf(t, s, l, y);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj", l);
    rc = load_st_stacked(t, s, nm, E, D, Fm, &y->stack[2]);
    if (rc < 0) return rc;
    if (rc == 0) return dl_seterr(DL_EFORMAT, "%s: tensor '%s' missing", s->path, nm);
    target_moe__point_stacked(y, E, Fm, D, t->ab, 1);
    return 0;
}

/* A layer config.json makes dense whose file holds an MoE router and no dense MLP: the config's
 * MoE keys are wrong (num_experts 0, decoder_sparse_step, mlp_only_layers, a dense
 * architecture), which "tensor 'mlp.gate_proj.weight' missing" would not say. 0 or DL_EFORMAT. */
static int dense_not_moe(const target_t *t, const src_t *s, int l) {
    char dense[96], router[96];
    snprintf(dense, sizeof dense, "model.layers.%d.mlp.gate_proj.weight", l);
    snprintf(router, sizeof router, "model.layers.%d.mlp.gate.weight", l);
    if (!s->st || safetensors_find(s->st, dense) || !safetensors_find(s->st, router)) return 0;
    const model_config_t *m = &t->cfg;
    return dl_seterr(DL_EFORMAT, "%s: layer %d holds an MoE router ('%s') and no '%s', but config.json makes it "
                     "a dense MLP (architecture %s, num_experts %d; or decoder_sparse_step / mlp_only_layers): "
                     "check those keys", s->path, l, router, dense, m->arch[0] ? m->arch : "?", m->n_experts);
}

static int load_weights(target_t *t, src_t *s) {
    const model_config_t *m = &t->cfg;
    int D = m->D, qd = m->H * m->hd, kd = m->Hkv * m->hd, F = m->F;
    int perm = s->g && m->family == MODEL_LLAMA;
    DL_TRY(load_tensor(t, s, "model.embed_tokens.weight", "token_embd.weight", 0, m->V, D, 0, 0, &t->embed));
    DL_TRY(load_tensor(t, s, "model.norm.weight", "output_norm.weight", 0, D, 0, 0, 0, &t->final_norm));
    if (m->tie_embeddings) t->lm_head = t->embed;
    else DL_TRY(load_tensor(t, s, "lm_head.weight", "output.weight", 0, m->V, D, 0, 0, &t->lm_head));
    if (t->opts.embed_only) return 0;   /* no layers, no RoPE: never runs a forward */
    for (int l = 0; l < m->L; l++) {
        tlayer_t *y = &t->layers[l];
#define P "model.layers.%d."
#define G "blk.%d."
        DL_TRY(load_tensor(t, s, P "input_layernorm.weight", G "attn_norm.weight", l, D, 0, 0, 0, &y->attn_norm));
        DL_TRY(load_tensor(t, s, P "self_attn.q_proj.weight", G "attn_q.weight", l, qd, D, 0, perm ? m->H : 0, &y->wq));
        DL_TRY(load_tensor(t, s, P "self_attn.k_proj.weight", G "attn_k.weight", l, kd, D, 0, perm ? m->Hkv : 0, &y->wk));
        DL_TRY(load_tensor(t, s, P "self_attn.v_proj.weight", G "attn_v.weight", l, kd, D, 0, 0, &y->wv));
        DL_TRY(load_tensor(t, s, P "self_attn.o_proj.weight", G "attn_output.weight", l, D, qd, 0, 0, &y->wo));
        if (m->attn_bias) {
            DL_TRY(load_tensor(t, s, P "self_attn.q_proj.bias", G "attn_q.bias", l, qd, 0, 0, perm ? m->H : 0, &y->bq));
            DL_TRY(load_tensor(t, s, P "self_attn.k_proj.bias", G "attn_k.bias", l, kd, 0, 0, perm ? m->Hkv : 0, &y->bk));
            DL_TRY(load_tensor(t, s, P "self_attn.v_proj.bias", G "attn_v.bias", l, kd, 0, 0, 0, &y->bv));
        }
        if (m->o_bias) DL_TRY(load_tensor(t, s, P "self_attn.o_proj.bias", G "attn_output.bias", l, D, 0, 0, 0, &y->bo));
        if (m->qk_norm) {
            DL_TRY(load_tensor(t, s, P "self_attn.q_norm.weight", G "attn_q_norm.weight", l, m->hd, 0, 0, 0, &y->q_norm));
            DL_TRY(load_tensor(t, s, P "self_attn.k_norm.weight", G "attn_k_norm.weight", l, m->hd, 0, 0, 0, &y->k_norm));
        }
        DL_TRY(load_tensor(t, s, P "post_attention_layernorm.weight", G "ffn_norm.weight", l, D, 0, 0, 0, &y->mlp_norm));
        if (model_config_layer_moe(m, l)) {
            DL_TRY(load_moe_layer(t, s, l, &y->moe));
            continue;
        }
        DL_TRY(dense_not_moe(t, s, l));
        DL_TRY(load_tensor(t, s, P "mlp.gate_proj.weight", G "ffn_gate.weight", l, F, D, 0, 0, &y->wg));
        DL_TRY(load_tensor(t, s, P "mlp.up_proj.weight", G "ffn_up.weight", l, F, D, 0, 0, &y->wu));
        DL_TRY(load_tensor(t, s, P "mlp.down_proj.weight", G "ffn_down.weight", l, D, F, 0, 0, &y->wd));
        if (m->mlp_bias) {
            DL_TRY(load_tensor(t, s, P "mlp.gate_proj.bias", G "ffn_gate.bias", l, F, 0, 0, 0, &y->bg));
            DL_TRY(load_tensor(t, s, P "mlp.up_proj.bias", G "ffn_up.bias", l, F, 0, 0, 0, &y->bu));
            DL_TRY(load_tensor(t, s, P "mlp.down_proj.bias", G "ffn_down.bias", l, D, 0, 0, 0, &y->bd));
        }
#undef P
#undef G
    }
    /* RoPE inverse frequencies; Llama-3 GGUFs store the llama3 scaling as per-frequency
     * divisors in rope_freqs.weight (llama.cpp llm_build_rope_factors). */
    float *inv = malloc((size_t)m->hd / 2 * sizeof *inv);
    if (!inv) return dl_seterr(DL_ENOMEM, "out of memory");
    ops_rope_inv_freq(&m->rope, m->hd, inv);
    if (s->g) {
        const gguf_tensor_t *rf = gguf_find_tensor(s->g, "rope_freqs.weight");
        if (rf) {
            if (rf->n_dims != 1 || rf->ne[0] != (uint64_t)(m->hd / 2) || rf->type != GGML_F32) {
                free(inv);
                return dl_seterr(DL_EFORMAT, "%s: rope_freqs.weight: expected F32 [%d]", s->path, m->hd / 2);
            }
            const float *f = (const float *)rf->data;
            for (int i = 0; i < m->hd / 2; i++) inv[i] /= f[i];
        }
    }
    t->inv_freq = t->c->impl->malloc_(t->c, (size_t)m->hd / 2 * sizeof(float));
    if (!t->inv_freq) { free(inv); return dl_seterr(DL_ENOMEM, "inv_freq: out of memory"); }
    t->c->impl->upload(t->c, t->inv_freq, inv, (size_t)m->hd / 2 * sizeof(float));
    free(inv);
    return 0;
}

static int alloc_acts(target_t *t) {
    const ops_ctx_t *c = t->c;
    const model_config_t *m = &t->cfg;
    size_t T = (size_t)t->opts.max_tokens, qd = (size_t)m->H * m->hd, kd = (size_t)m->Hkv * m->hd;
    t->mlp_chunk = t->opts.max_tokens < TARGET_MLP_CHUNK ? t->opts.max_tokens : TARGET_MLP_CHUNK;
    /* an MoE chunk holds k routed rows of Fm per token; dense layers need F */
    size_t mlp_w = (size_t)m->F;
    if (m->n_experts > 0 && (size_t)m->top_k * m->moe_F > mlp_w) mlp_w = (size_t)m->top_k * m->moe_F;
    struct { void **p; size_t bytes; } a[] = {
        {&t->x, T * m->D * t->ab}, {&t->xn, T * m->D * t->ab}, {&t->q, T * qd * t->ab},
        {&t->k, T * kd * t->ab}, {&t->v, T * kd * t->ab}, {&t->att, T * qd * t->ab},
        {&t->qn, m->qk_norm ? T * qd * t->ab : 0}, {&t->kn, m->qk_norm ? T * kd * t->ab : 0},
        {&t->gate, (size_t)t->mlp_chunk * mlp_w * t->ab}, {&t->up, (size_t)t->mlp_chunk * mlp_w * t->ab},
        {&t->hmlp, (size_t)t->mlp_chunk * mlp_w * t->ab},
        {(void **)&t->d_ids, T * 4}, {(void **)&t->d_pos, T * 4},
        {(void **)&t->d_cu, ((size_t)t->opts.max_seqs + 1) * 4},
        {(void **)&t->d_cs, T * 4}, {(void **)&t->d_cl, T * 4}, {(void **)&t->d_gather, T * 4},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        if (!a[i].bytes) continue;
        *a[i].p = c->impl->malloc_(c, a[i].bytes);
        if (!*a[i].p)
            return dl_seterr(DL_ENOMEM, "target: cannot allocate %zu bytes of activations on the %s "
                             "backend (lower --token-budget; max_tokens %zu)", a[i].bytes,
                             c->impl->name, T);
    }
    if (m->n_experts > 0 && !t->opts.embed_only)
        DL_TRY(target_moe__scratch_new(c, m, t->mlp_chunk, &t->moe_s));
    t->h_pos = malloc(T * 4);
    t->h_cs = malloc(T * 4);
    t->h_cl = malloc(T * 4);
    t->h_gather = malloc(T * 4);
    if (!t->h_pos || !t->h_cs || !t->h_cl || !t->h_gather) return dl_seterr(DL_ENOMEM, "target: out of memory");
    return 0;
}

/* precision fp8: the decoder layers' linears to E4M3 (after alloc_acts: mlp_chunk). */
static int quantize_layers(target_t *t) {
    const model_config_t *m = &t->cfg;
    DL_TRY(target_fp8__check(t->c, m));
    size_t before = t->weight_bytes;
    for (int l = 0; l < m->L; l++) {
        tlayer_t *y = &t->layers[l];
        void **w[TFP8_N] = {&y->wq, &y->wk, &y->wv, &y->wo, &y->wg, &y->wu, &y->wd};
        DL_TRY(target_fp8__layer_new(t->c, m, w, &y->f8, &t->weight_bytes));
    }
    log_info("target: fp8 (E4M3, per-channel scales) q/k/v/o/gate/up/down of %d layers: "
             "weights %.3f GB -> %.3f GB", m->L, before / 1e9, t->weight_bytes / 1e9);
    return target_fp8__scratch_new(t->c, m, t->opts.max_tokens, t->mlp_chunk, &t->f8s);
}

int target_load(const char *path, const ops_ctx_t *c, const target_opts_t *opts, target_t **out) {
    *out = NULL;
    if (opts->max_tokens < 1 || opts->max_seqs < 1 || opts->n_capture < 0 ||
        opts->n_capture > TARGET_MAX_CAPTURE)
        return dl_seterr(DL_EINVAL, "target_load: max_tokens %d, max_seqs %d, n_capture %d out of range",
                         opts->max_tokens, opts->max_seqs, opts->n_capture);
    target_t *t = calloc(1, sizeof *t);
    if (!t) return dl_seterr(DL_ENOMEM, "target: out of memory");
    t->c = c;
    t->ab = ops_act_bytes(c);
    t->opts = *opts;
    src_t s = {.path = path};
    target_stage_init(&s.stage, c, t->ab);
    int rc;
    struct stat sb;
    if (stat(path, &sb) < 0) {
        rc = dl_seterr(DL_ENOENT, "%s: no such file or directory", path);
        goto done;
    }
    if (S_ISDIR(sb.st_mode)) {
        if ((rc = model_config_from_hf_dir(path, &t->cfg)) < 0) goto done;
        if ((rc = safetensors_open(path, &s.st)) < 0) goto done;
    } else {
        if ((rc = gguf_open(path, &s.g)) < 0) goto done;
        if ((rc = model_config_from_gguf(s.g, &t->cfg)) < 0) { dl_wraperr(rc, "%s", path); goto done; }
    }
    t->last_capture = -1;
    for (int i = 0; i < opts->n_capture; i++) {
        if (opts->capture_ids[i] < 0 || opts->capture_ids[i] >= t->cfg.L) {
            rc = dl_seterr(DL_EINVAL, "target: capture layer id %d not in [0, %d)", opts->capture_ids[i], t->cfg.L);
            goto done;
        }
        if (opts->capture_ids[i] > t->last_capture) t->last_capture = opts->capture_ids[i];
    }
    t->layers = calloc((size_t)t->cfg.L, sizeof *t->layers);
    if (!t->layers) { rc = dl_seterr(DL_ENOMEM, "target: out of memory"); goto done; }
    if ((rc = load_weights(t, &s)) < 0) goto done;
    if ((rc = alloc_acts(t)) < 0) goto done;
    if (opts->precision == TARGET_PRECISION_FP8 && !opts->embed_only) rc = quantize_layers(t);
done:
    src_release(&s);
    gguf_close(&s.g);
    safetensors_close(&s.st);
    if (rc < 0) {
        target_destroy(&t);
        return rc;
    }
    *out = t;
    return 0;
}

void target_destroy(target_t **tp) {
    if (!tp || !*tp) return;
    target_t *t = *tp;
    const ops_ctx_t *c = t->c;
#define FREE(p) do { if (p) c->impl->free_(c, (void *)(p)); } while (0)
    if (t->lm_head != t->embed) FREE(t->lm_head);
    FREE(t->embed);
    FREE(t->final_norm);
    FREE(t->inv_freq);
    if (t->layers) {
        for (int l = 0; l < t->cfg.L; l++) {
            tlayer_t *y = &t->layers[l];
            void *ps[] = {y->attn_norm, y->wq, y->wk, y->wv, y->wo, y->bq, y->bk, y->bv, y->bo,
                          y->q_norm, y->k_norm, y->mlp_norm, y->wg, y->wu, y->wd, y->bg, y->bu, y->bd};
            for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) FREE(ps[i]);
            target_moe__free(c, &y->moe);
            target_fp8__layer_free(c, &y->f8);
        }
    }
    target_moe__scratch_free(c, &t->moe_s);
    target_fp8__scratch_free(c, &t->f8s);
    void *as[] = {t->x, t->xn, t->q, t->k, t->v, t->att, t->qn, t->kn, t->gate, t->up, t->hmlp,
                  t->d_ids, t->d_pos, t->d_cu, t->d_cs, t->d_cl, t->d_gather};
    for (size_t i = 0; i < sizeof as / sizeof as[0]; i++) FREE(as[i]);
#undef FREE
    free(t->layers);
    free(t->h_pos);
    free(t->h_cs);
    free(t->h_cl);
    free(t->h_gather);
    free(t);
    *tp = NULL;
}

/* ---- forward -------------------------------------------------------------- */

/* How a forward's attention sees keys. */
typedef struct {
    /* packed: varlen causal over the batch itself */
    const int32_t *cu;      /* backend */
    int nseq, max_seqlen;
    /* kv: new tokens appended to a cache (kv != NULL) */
    target_kv_t *kv;
    const int32_t *slot_h, *start_h, *cu_h;  /* host */
    int use_block;          /* some start > 0: attend through the cache (block attention, B=1) */
} attn_mode_t;

/* Copies rows (T, D) of src into column block [col, col+D) of dst (T, width). */
static void copy_cols(target_t *t, void *dst, size_t width, size_t col, const void *src, int T, int D) {
    const ops_ctx_t *c = t->c;
    size_t rowb = (size_t)D * t->ab;
    if (c->impl->copy2d) {
        c->impl->copy2d(c, (char *)dst + col * t->ab, width * t->ab, src, rowb, rowb, (size_t)T);
        return;
    }
    for (int r = 0; r < T; r++)
        c->impl->copy(c, (char *)dst + ((size_t)r * width + col) * t->ab, (const char *)src + r * rowb, rowb);
}

/* out (M,N) = in (M,K) . W^T + b with weight i of layer y: act, or FP8 (in quantized
 * first unless requant is 0: the same input as the previous linear's). */
static void linear(target_t *t, const tlayer_t *y, int i, const void *w, void *out,
                   const void *in, int requant, const void *b, int M, int K, int N) {
    if (y->f8.w[i].q)
        target_fp8__linear(t->c, &t->f8s, out, in, requant, &y->f8.w[i], b, M);
    else
        t->c->impl->matmul_forward(t->c, out, in, w, b, M, K, N);
}

/* One decoder layer on the residual stream t->x (T, D). pending: the previous layer's
 * MLP output is still in t->xn, to be added to x here (fused with this layer's first
 * norm). Returns with this layer's MLP output in t->xn, not yet added: the caller adds
 * it (run_layers) or passes it on as pending. */
static void layer_forward(target_t *t, int l, int T, const int32_t *pos, const attn_mode_t *am,
                          int pending) {
    const ops_ctx_t *c = t->c;
    const ops_impl_t *o = c->impl;
    const model_config_t *m = &t->cfg;
    const tlayer_t *y = &t->layers[l];
    int D = m->D, H = m->H, Hkv = m->Hkv, hd = m->hd, qd = H * hd, kd = Hkv * hd;

    if (pending) o->add_rmsnorm_forward(c, t->x, t->xn, NULL, t->xn, y->attn_norm, m->eps, T, D);
    else o->rmsnorm_forward(c, t->xn, NULL, t->x, y->attn_norm, m->eps, T, D);
    linear(t, y, TFP8_Q, y->wq, t->q, t->xn, 1, y->bq, T, D, qd);
    linear(t, y, TFP8_K, y->wk, t->k, t->xn, 0, y->bk, T, D, kd);
    linear(t, y, TFP8_V, y->wv, t->v, t->xn, 0, y->bv, T, D, kd);
    void *q = t->q, *k = t->k;
    if (m->qk_norm) {
        /* the bits of rmsnorm_forward then rope_forward, in one pass on CUDA */
        o->qk_norm_rope_forward_exact(c, t->qn, NULL, t->q, y->q_norm, m->eps, pos, t->inv_freq, T, H, hd);
        o->qk_norm_rope_forward_exact(c, t->kn, NULL, t->k, y->k_norm, m->eps, pos, t->inv_freq, T, Hkv, hd);
        q = t->qn;
        k = t->kn;
    } else {
        o->rope_forward(c, q, pos, t->inv_freq, T, H, hd);
        o->rope_forward(c, k, pos, t->inv_freq, T, Hkv, hd);
    }
    if (!am->kv) {
        o->attention_varlen_forward(c, t->att, q, k, t->v, am->cu, am->nseq, am->max_seqlen, T, H,
                                    Hkv, hd);
    } else {
        target_kv_t *kv = am->kv;
        size_t row = (size_t)kd * t->ab;
        for (int s = 0; s < am->nseq; s++) {
            int n = am->cu_h[s + 1] - am->cu_h[s];
            size_t dst = ((size_t)am->slot_h[s] * kv->cap + am->start_h[s]) * row;
            o->copy(c, (char *)kv->k[l] + dst, (const char *)k + (size_t)am->cu_h[s] * row, n * row);
            o->copy(c, (char *)kv->v[l] + dst, (const char *)t->v + (size_t)am->cu_h[s] * row, n * row);
        }
        if (am->use_block)
            o->attention_block_forward(c, t->att, NULL, q, k, t->v, kv->k[l], kv->v[l], t->d_cs,
                                       t->d_cl, T, 1, kv->n_slots * kv->cap, H, Hkv, hd);
        else
            o->attention_varlen_forward(c, t->att, q, k, t->v, am->cu, am->nseq, am->max_seqlen, T,
                                        H, Hkv, hd);
    }
    linear(t, y, TFP8_O, y->wo, t->xn, t->att, 1, y->bo, T, qd, D);
    /* x += o_proj(att), then the MLP's norm of x (into xn, over the o_proj output) */
    o->add_rmsnorm_forward(c, t->x, t->xn, NULL, t->xn, y->mlp_norm, m->eps, T, D);
    int moe = model_config_layer_moe(m, l);
    for (int r0 = 0; r0 < T; r0 += t->mlp_chunk) {
        int n = T - r0 < t->mlp_chunk ? T - r0 : t->mlp_chunk;
        void *xin = act_at(t, t->xn, (size_t)r0 * D);
        if (moe) {   /* writes the block's output over this chunk of xn, as the dense path */
            target_moe__forward(c, m, &y->moe, &t->moe_s, t->gate, t->up, t->hmlp, xin, xin, n, l);
            continue;
        }
        linear(t, y, TFP8_G, y->wg, t->gate, xin, 1, y->bg, n, D, m->F);
        linear(t, y, TFP8_U, y->wu, t->up, xin, 0, y->bu, n, D, m->F);
        o->swiglu_forward(c, t->hmlp, t->gate, t->up, (size_t)n * m->F);
        /* down projection overwrites this chunk of xn, which is no longer needed */
        linear(t, y, TFP8_D, y->wd, xin, t->hmlp, 1, y->bd, n, m->F, D);
    }
}

static void run_layers(target_t *t, const int32_t *ids, const int32_t *pos, int T, int n_layers,
                       const attn_mode_t *am, void *feat) {
    const ops_ctx_t *c = t->c;
    const model_config_t *m = &t->cfg;
    c->impl->embedding_forward(c, t->x, ids, t->embed, T, m->D);
    size_t width = (size_t)t->opts.n_capture * m->D;
    int pending = 0;   /* the last layer's MLP output is in t->xn, not yet added to x */
    for (int l = 0; l < n_layers; l++) {
        layer_forward(t, l, T, pos, am, pending);
        int captured = 0;
        for (int i = 0; feat && i < t->opts.n_capture; i++) captured |= t->opts.capture_ids[i] == l;
        /* x is needed now (captured, or the last layer): added here; else the next layer
         * adds it with its first norm (add_rmsnorm_forward: the same bits) */
        pending = !captured && l + 1 < n_layers;
        if (pending) continue;
        c->impl->add(c, t->x, t->x, t->xn, (size_t)T * m->D);
        if (!captured) continue;
        for (int i = 0; i < t->opts.n_capture; i++)
            if (t->opts.capture_ids[i] == l)
                copy_cols(t, feat, width, (size_t)i * m->D, t->x, T, m->D);
    }
}

int target_forward(target_t *t, const int32_t *ids, const int32_t *pos, const int32_t *cu, int nseq,
                   int max_seqlen, int T, void *feat, void *hidden) {
    if (t->opts.embed_only)
        return dl_seterr(DL_EINVAL, "target_forward: target loaded with embed_only (no layers)");
    if (T < 1 || T > t->opts.max_tokens || nseq < 1 || nseq > t->opts.max_seqs)
        return dl_seterr(DL_ERANGE, "target_forward: T %d (max %d), nseq %d (max %d)", T,
                         t->opts.max_tokens, nseq, t->opts.max_seqs);
    if (feat && t->opts.n_capture == 0)
        return dl_seterr(DL_EINVAL, "target_forward: feat given but no capture layers configured");
    int n_layers = hidden ? t->cfg.L : t->last_capture + 1;
    attn_mode_t am = {.cu = cu, .nseq = nseq, .max_seqlen = max_seqlen};
    run_layers(t, ids, pos, T, n_layers, &am, feat);
    if (hidden) t->c->impl->rmsnorm_forward(t->c, hidden, NULL, t->x, t->final_norm, t->cfg.eps, T, t->cfg.D);
    return 0;
}

static int check_cu(const target_t *t, const int32_t *cu, int nseq, int T, int *max_seqlen) {
    if (cu[0] != 0 || cu[nseq] != T)
        return dl_seterr(DL_EINVAL, "cu_seqlens: must start at 0 and end at T=%d (got %d..%d)", T, cu[0], cu[nseq]);
    int mx = 0;
    for (int s = 0; s < nseq; s++) {
        int n = cu[s + 1] - cu[s];
        if (n < 1) return dl_seterr(DL_EINVAL, "cu_seqlens: sequence %d has length %d", s, n);
        if (n > mx) mx = n;
    }
    (void)t;
    *max_seqlen = mx;
    return 0;
}

static int check_ids(const target_t *t, const int32_t *ids, int T) {
    for (int i = 0; i < T; i++)
        if (ids[i] < 0 || ids[i] >= t->cfg.V)
            return dl_seterr(DL_ERANGE, "token id %d at %d not in [0, %d)", ids[i], i, t->cfg.V);
    return 0;
}

int target_forward_host(target_t *t, const int32_t *ids, const int32_t *pos, const int32_t *cu,
                        int nseq, int T, void *feat, void *hidden) {
    if (t->opts.embed_only)
        return dl_seterr(DL_EINVAL, "target_forward: target loaded with embed_only (no layers)");
    if (T < 1 || T > t->opts.max_tokens || nseq < 1 || nseq > t->opts.max_seqs)
        return dl_seterr(DL_ERANGE, "target_forward: T %d (max %d), nseq %d (max %d)", T,
                         t->opts.max_tokens, nseq, t->opts.max_seqs);
    int max_seqlen;
    DL_TRY(check_cu(t, cu, nseq, T, &max_seqlen));
    DL_TRY(check_ids(t, ids, T));
    if (!pos) {
        for (int s = 0; s < nseq; s++)
            for (int i = cu[s]; i < cu[s + 1]; i++) t->h_pos[i] = i - cu[s];
        pos = t->h_pos;
    }
    const ops_impl_t *o = t->c->impl;
    o->upload(t->c, t->d_ids, ids, (size_t)T * 4);
    o->upload(t->c, t->d_pos, pos, (size_t)T * 4);
    o->upload(t->c, t->d_cu, cu, ((size_t)nseq + 1) * 4);
    return target_forward(t, t->d_ids, t->d_pos, t->d_cu, nseq, max_seqlen, T, feat, hidden);
}

void target_logits(target_t *t, void *logits, const void *hidden, int n) {
    t->c->impl->matmul_forward(t->c, logits, hidden, t->lm_head, NULL, n, t->cfg.D, t->cfg.V);
}

/* ---- KV cache --------------------------------------------------------------- */

int target_kv_new(target_t *t, int n_slots, int cap, target_kv_t **out) {
    *out = NULL;
    if (t->opts.embed_only) return dl_seterr(DL_EINVAL, "target_kv_new: target loaded with embed_only (no layers)");
    if (n_slots < 1 || cap < 1) return dl_seterr(DL_EINVAL, "target_kv_new: %d slots x %d tokens", n_slots, cap);
    if ((int64_t)n_slots * cap > INT_MAX)
        return dl_seterr(DL_ERANGE, "target_kv_new: %d slots x %d tokens is too many rows", n_slots, cap);
    target_kv_t *kv = calloc(1, sizeof *kv);
    if (!kv) return dl_seterr(DL_ENOMEM, "kv cache: out of memory");
    kv->t = t;
    kv->n_slots = n_slots;
    kv->cap = cap;
    kv->k = calloc((size_t)t->cfg.L, sizeof *kv->k);
    kv->v = calloc((size_t)t->cfg.L, sizeof *kv->v);
    if (!kv->k || !kv->v) { target_kv_destroy(&kv); return dl_seterr(DL_ENOMEM, "kv cache: out of memory"); }
    size_t bytes = (size_t)n_slots * cap * t->cfg.Hkv * t->cfg.hd * t->ab;
    for (int l = 0; l < t->cfg.L; l++) {
        kv->k[l] = t->c->impl->malloc_(t->c, bytes);
        kv->v[l] = t->c->impl->malloc_(t->c, bytes);
        if (!kv->k[l] || !kv->v[l]) {
            target_kv_destroy(&kv);
            return dl_seterr(DL_ENOMEM, "kv cache: cannot allocate 2 x %d x %zu bytes on the %s backend",
                             t->cfg.L, bytes, t->c->impl->name);
        }
        /* zeroed: the attention reads whole tiles, rows not yet written included (ops.h) */
        t->c->impl->memset0(t->c, kv->k[l], bytes);
        t->c->impl->memset0(t->c, kv->v[l], bytes);
    }
    *out = kv;
    return 0;
}

void target_kv_destroy(target_kv_t **kvp) {
    if (!kvp || !*kvp) return;
    target_kv_t *kv = *kvp;
    const ops_ctx_t *c = kv->t->c;
    for (int l = 0; l < kv->t->cfg.L; l++) {
        if (kv->k && kv->k[l]) c->impl->free_(c, kv->k[l]);
        if (kv->v && kv->v[l]) c->impl->free_(c, kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv);
    *kvp = NULL;
}

int target_kv_cap(const target_kv_t *kv) { return kv->cap; }
int target_kv_slots(const target_kv_t *kv) { return kv->n_slots; }

int target_forward_kv(target_t *t, target_kv_t *kv, const int32_t *slot, const int32_t *start,
                      const int32_t *cu, int nseq, const int32_t *ids, int T, void *last_hidden,
                      void *hidden) {
    return target_forward_kv_feat(t, kv, slot, start, cu, nseq, ids, T, last_hidden, hidden, NULL);
}

int target_forward_kv_feat(target_t *t, target_kv_t *kv, const int32_t *slot, const int32_t *start,
                           const int32_t *cu, int nseq, const int32_t *ids, int T,
                           void *last_hidden, void *hidden, void *feat) {
    if (feat && t->opts.n_capture == 0)
        return dl_seterr(DL_EINVAL, "target_forward_kv: feat given but no capture layers configured");
    if (kv->t != t) return dl_seterr(DL_EINVAL, "target_forward_kv: cache belongs to another target");
    if (T < 1 || T > t->opts.max_tokens || nseq < 1 || nseq > t->opts.max_seqs)
        return dl_seterr(DL_ERANGE, "target_forward_kv: T %d (max %d), nseq %d (max %d)", T,
                         t->opts.max_tokens, nseq, t->opts.max_seqs);
    int max_seqlen;
    DL_TRY(check_cu(t, cu, nseq, T, &max_seqlen));
    DL_TRY(check_ids(t, ids, T));
    int use_block = 0;
    for (int s = 0; s < nseq; s++) {
        int n = cu[s + 1] - cu[s];
        if (slot[s] < 0 || slot[s] >= kv->n_slots)
            return dl_seterr(DL_ERANGE, "target_forward_kv: slot %d not in [0, %d)", slot[s], kv->n_slots);
        if (start[s] < 0 || start[s] + n > kv->cap)
            return dl_seterr(DL_ERANGE, "target_forward_kv: sequence %d: %d cached + %d new tokens > "
                             "cache capacity %d", s, start[s], n, kv->cap);
        for (int s2 = 0; s2 < s; s2++)
            if (slot[s2] == slot[s]) return dl_seterr(DL_EINVAL, "target_forward_kv: slot %d used twice", slot[s]);
        if (start[s] > 0) use_block = 1;
        for (int j = 0; j < n; j++) {
            int i = cu[s] + j;
            t->h_pos[i] = start[s] + j;
            t->h_cs[i] = slot[s] * kv->cap;
            t->h_cl[i] = start[s] + j;
        }
        t->h_gather[s] = cu[s + 1] - 1;
    }
    const ops_ctx_t *c = t->c;
    const ops_impl_t *o = c->impl;
    o->upload(c, t->d_ids, ids, (size_t)T * 4);
    o->upload(c, t->d_pos, t->h_pos, (size_t)T * 4);
    o->upload(c, t->d_cu, cu, ((size_t)nseq + 1) * 4);
    if (use_block) {
        o->upload(c, t->d_cs, t->h_cs, (size_t)T * 4);
        o->upload(c, t->d_cl, t->h_cl, (size_t)T * 4);
    }
    attn_mode_t am = {.cu = t->d_cu, .nseq = nseq, .max_seqlen = max_seqlen, .kv = kv,
                      .slot_h = slot, .start_h = start, .cu_h = cu, .use_block = use_block};
    run_layers(t, t->d_ids, t->d_pos, T, t->cfg.L, &am, feat);
    const model_config_t *m = &t->cfg;
    if (hidden) o->rmsnorm_forward(c, hidden, NULL, t->x, t->final_norm, m->eps, T, m->D);
    if (last_hidden) {
        /* gather each sequence's last row (embedding lookup used as a row gather) */
        o->upload(c, t->d_gather, t->h_gather, (size_t)nseq * 4);
        o->embedding_forward(c, t->xn, t->d_gather, t->x, nseq, m->D);
        o->rmsnorm_forward(c, last_hidden, NULL, t->xn, t->final_norm, m->eps, nseq, m->D);
    }
    return 0;
}
