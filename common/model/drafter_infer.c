/* DFlash drafter inference with a context K/V cache. See drafter_infer.h. */
#include "common/model/drafter_infer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"

enum { W_Q, W_K, W_V, W_O, W_QN, W_KN, W_IN, W_POST, W_G, W_U, W_D, W_PER_LAYER };
static const char *const k_layer_names[W_PER_LAYER] = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "input_layernorm.weight",  "post_attention_layernorm.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
static const char *const k_global_names[3] = {"fc.weight", "hidden_norm.weight", "norm.weight"};

struct drafter_infer {
    drafter_t *d;
    const ops_ctx_t *c;
    drafter_config_t cfg;
    const void *embed, *lm_head;     /* (V, D) act, borrowed */
    int cap, chunk, len;
    size_t A;                        /* act bytes */
    size_t *w_off;                   /* element offsets: n_layers * W_PER_LAYER, then fc, hidden_norm, norm */
    void **kc, **vc;                 /* per layer (cap, Hkv*hd) act: normed+roped keys, values */
    /* append scratch (chunk rows) */
    void *ctx_fc, *ctx, *kraw;       /* (chunk, D) x2, (chunk, Hkv*hd) */
    int32_t *d_cpos;                 /* (chunk) i32 */
    /* block scratch (B rows) */
    void *h, *xn, *qr, *qs, *kbr, *kbs, *vb, *att, *h1, *hn2, *g, *u, *a, *logits;
    int32_t *d_ids, *d_pos, *d_cs, *d_cl;
    float *inv_freq;                 /* (hd/2) f32 */
    int32_t *h_tmp;                  /* host (max(chunk, B)) */
};

#define IMPL (di->c->impl)

/* Working (act) weight: layer l's tensor k, or global g (l < 0). Resolved per call
 * from drafter_weights, so reloaded weights are seen. */
static inline const void *WL(const drafter_infer_t *di, int l, int k) {
    return (const char *)drafter_weights(di->d) + di->w_off[l * W_PER_LAYER + k] * di->A;
}
static inline const void *WG(const drafter_infer_t *di, int g) {
    return (const char *)drafter_weights(di->d) +
           di->w_off[di->cfg.n_layers * W_PER_LAYER + g] * di->A;
}

typedef struct { void **slot; size_t bytes; } dinf_req_t;

int drafter_infer_new(const ops_ctx_t *c, drafter_t *d, const void *embed, const void *lm_head,
                      int cap, int chunk, drafter_infer_t **out) {
    *out = NULL;
    if (!c || !d || !embed || !lm_head || cap < 1 || chunk < 1)
        return dl_seterr(DL_EINVAL, "drafter_infer_new: backend/drafter/embed/lm_head missing or "
                         "cap %d, chunk %d < 1", cap, chunk);
    drafter_infer_t *di = calloc(1, sizeof *di);
    if (!di) return dl_seterr(DL_ENOMEM, "drafter_infer_new: host struct");
    di->d = d;
    di->c = c;
    di->cfg = *drafter_config(d);
    di->embed = embed;
    di->lm_head = lm_head;
    di->cap = cap;
    di->chunk = chunk;
    di->A = ops_act_bytes(c);
    const drafter_config_t *cf = &di->cfg;
    const int nl = cf->n_layers, nw = nl * W_PER_LAYER + 3;
    di->w_off = calloc((size_t)nw, sizeof *di->w_off);
    di->kc = calloc((size_t)nl, sizeof *di->kc);
    di->vc = calloc((size_t)nl, sizeof *di->vc);
    di->h_tmp = malloc((size_t)(chunk > cf->B ? chunk : cf->B) * sizeof(int32_t));
    if (!di->w_off || !di->kc || !di->vc || !di->h_tmp) {
        drafter_infer_destroy(&di);
        return dl_seterr(DL_ENOMEM, "drafter_infer_new: host tables");
    }
    char nm[96];
    for (int i = 0; i < nw; i++) {
        if (i < nl * W_PER_LAYER)
            snprintf(nm, sizeof nm, "layers.%d.%s", i / W_PER_LAYER, k_layer_names[i % W_PER_LAYER]);
        else
            snprintf(nm, sizeof nm, "%s", k_global_names[i - nl * W_PER_LAYER]);
        const drafter_tensor_t *t = drafter_find_tensor(d, nm);
        if (!t) {
            drafter_infer_destroy(&di);
            return dl_seterr(DL_ENOENT, "drafter_infer_new: drafter has no tensor %s", nm);
        }
        di->w_off[i] = t->offset;
    }
    const size_t A = di->A, B = (size_t)cf->B, D = (size_t)cf->D, F = (size_t)cf->F;
    const size_t Q = (size_t)cf->H * cf->hd, KV = (size_t)cf->Hkv * cf->hd, C = (size_t)chunk;
    dinf_req_t req[32 + 2 * DRAFTER_MAX_LAYERS];
    int nr = 0;
#define REQ(ptr, nb_) (req[nr].slot = (void **)&(ptr), req[nr].bytes = (nb_), nr++)
    for (int l = 0; l < nl; l++) {
        REQ(di->kc[l], (size_t)cap * KV * A);
        REQ(di->vc[l], (size_t)cap * KV * A);
    }
    REQ(di->ctx_fc, C * D * A); REQ(di->ctx, C * D * A); REQ(di->kraw, C * KV * A);
    REQ(di->d_cpos, C * 4);
    REQ(di->h, B * D * A); REQ(di->xn, B * D * A); REQ(di->qr, B * Q * A); REQ(di->qs, B * Q * A);
    REQ(di->kbr, B * KV * A); REQ(di->kbs, B * KV * A); REQ(di->vb, B * KV * A);
    REQ(di->att, B * Q * A); REQ(di->h1, B * D * A); REQ(di->hn2, B * D * A);
    REQ(di->g, B * F * A); REQ(di->u, B * F * A); REQ(di->a, B * F * A);
    REQ(di->logits, B * (size_t)cf->V * A);
    REQ(di->d_ids, B * 4); REQ(di->d_pos, B * 4); REQ(di->d_cs, 4); REQ(di->d_cl, 4);
    REQ(di->inv_freq, (size_t)cf->hd / 2 * 4);
#undef REQ
    size_t total = 0;
    for (int i = 0; i < nr; i++) {
        *req[i].slot = IMPL->malloc_(c, req[i].bytes);
        total += req[i].bytes;
        if (!*req[i].slot) {
            drafter_infer_destroy(&di);
            return dl_seterr(DL_ENOMEM, "drafter_infer_new: %s allocation of %zu bytes failed "
                             "(%.2f GiB so far; lower the context capacity %d)", c->impl->name,
                             req[i].bytes, total / 1073741824.0, cap);
        }
    }
    /* the context K/V caches zeroed: the attention reads whole tiles, rows not yet written
     * included (ops.h) */
    for (int l = 0; l < nl; l++) {
        IMPL->memset0(c, di->kc[l], (size_t)cap * KV * A);
        IMPL->memset0(c, di->vc[l], (size_t)cap * KV * A);
    }
    float inv[1024];
    if (cf->hd / 2 > (int)(sizeof inv / sizeof inv[0])) {
        drafter_infer_destroy(&di);
        return dl_seterr(DL_EINVAL, "drafter_infer_new: head dim %d too large", cf->hd);
    }
    ops_rope_inv_freq(&cf->rope, cf->hd, inv);
    IMPL->upload(c, di->inv_freq, inv, (size_t)cf->hd / 2 * 4);
    int32_t zero = 0;
    IMPL->upload(c, di->d_cs, &zero, 4);
    *out = di;
    return 0;
}

void drafter_infer_destroy(drafter_infer_t **dp) {
    if (!dp || !*dp) return;
    drafter_infer_t *di = *dp;
    if (di->kc && di->vc)
        for (int l = 0; l < di->cfg.n_layers; l++) {
            if (di->kc[l]) IMPL->free_(di->c, di->kc[l]);
            if (di->vc[l]) IMPL->free_(di->c, di->vc[l]);
        }
    void *ps[] = {di->ctx_fc, di->ctx, di->kraw, di->d_cpos, di->h, di->xn, di->qr, di->qs,
                  di->kbr, di->kbs, di->vb, di->att, di->h1, di->hn2, di->g, di->u, di->a,
                  di->logits, di->d_ids, di->d_pos, di->d_cs, di->d_cl, di->inv_freq};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        if (ps[i]) IMPL->free_(di->c, ps[i]);
    free(di->w_off);
    free(di->kc);
    free(di->vc);
    free(di->h_tmp);
    free(di);
    *dp = NULL;
}

int drafter_infer_len(const drafter_infer_t *di) { return di->len; }
void drafter_infer_reset(drafter_infer_t *di) { di->len = 0; }

int drafter_infer_truncate(drafter_infer_t *di, int len) {
    if (len < 0 || len > di->len)
        return dl_seterr(DL_ERANGE, "drafter_infer_truncate: %d not in [0, %d]", len, di->len);
    di->len = len;
    return 0;
}

int drafter_infer_append(drafter_infer_t *di, const void *feat, int n) {
    const drafter_config_t *cf = &di->cfg;
    if (n < 0 || di->len + n > di->cap)
        return dl_seterr(DL_ERANGE, "drafter_infer_append: %d cached + %d new rows > capacity %d",
                         di->len, n, di->cap);
    const ops_ctx_t *c = di->c;
    const int D = cf->D, KV = cf->Hkv * cf->hd, Df = cf->n_feat * cf->D;
    for (int r0 = 0; r0 < n; r0 += di->chunk) {
        int m = n - r0 < di->chunk ? n - r0 : di->chunk;
        const void *f = (const char *)feat + (size_t)r0 * Df * di->A;
        /* ctx = hidden_norm(fc(features)) */
        IMPL->matmul_forward(c, di->ctx_fc, f, WG(di, 0), NULL, m, Df, D);
        IMPL->rmsnorm_forward(c, di->ctx, NULL, di->ctx_fc, WG(di, 1), cf->rms_eps, m, D);
        for (int i = 0; i < m; i++) di->h_tmp[i] = di->len + i;
        IMPL->upload(c, di->d_cpos, di->h_tmp, (size_t)m * 4);
        for (int l = 0; l < cf->n_layers; l++) {
            void *kdst = (char *)di->kc[l] + (size_t)di->len * KV * di->A;
            void *vdst = (char *)di->vc[l] + (size_t)di->len * KV * di->A;
            /* context rows do not go through input_layernorm (drafter.h) */
            IMPL->matmul_forward(c, di->kraw, di->ctx, WL(di, l, W_K), NULL, m, D, KV);
            IMPL->rmsnorm_forward(c, kdst, NULL, di->kraw, WL(di, l, W_KN), cf->rms_eps,
                                  m * cf->Hkv, cf->hd);
            IMPL->rope_forward(c, kdst, di->d_cpos, di->inv_freq, m, cf->Hkv, cf->hd);
            IMPL->matmul_forward(c, vdst, di->ctx, WL(di, l, W_V), NULL, m, D, KV);
        }
        di->len += m;  /* uploads are synchronous for the host buffer (ops.h backends) */
    }
    return 0;
}

int drafter_infer_block(drafter_infer_t *di, int32_t anchor_id, int anchor_pos, float *logits_host) {
    const drafter_config_t *cf = &di->cfg;
    if (anchor_pos < 0 || anchor_pos > di->len)
        return dl_seterr(DL_ERANGE, "drafter_infer_block: anchor position %d not in [0, %d] (cached "
                         "context rows)", anchor_pos, di->len);
    if (anchor_id < 0 || anchor_id >= cf->V)
        return dl_seterr(DL_ERANGE, "drafter_infer_block: anchor id %d not in [0, %d)", anchor_id, cf->V);
    const ops_ctx_t *c = di->c;
    const int B = cf->B, D = cf->D, H = cf->H, Hkv = cf->Hkv, hd = cf->hd, F = cf->F;
    const int Q = H * hd, KV = Hkv * hd;
    int32_t ids[DRAFTER_MAX_BLOCK], pos[DRAFTER_MAX_BLOCK];
    for (int k = 0; k < B; k++) {
        ids[k] = k == 0 ? anchor_id : cf->mask_token_id;
        pos[k] = anchor_pos + k;
    }
    IMPL->upload(c, di->d_ids, ids, (size_t)B * 4);
    IMPL->upload(c, di->d_pos, pos, (size_t)B * 4);
    int32_t cl = anchor_pos;
    IMPL->upload(c, di->d_cl, &cl, 4);
    IMPL->embedding_forward(c, di->h, di->d_ids, di->embed, B, D);
    for (int l = 0; l < cf->n_layers; l++) {
        IMPL->rmsnorm_forward(c, di->xn, NULL, di->h, WL(di, l, W_IN), cf->rms_eps, B, D);
        IMPL->matmul_forward(c, di->qr, di->xn, WL(di, l, W_Q), NULL, B, D, Q);
        IMPL->matmul_forward(c, di->kbr, di->xn, WL(di, l, W_K), NULL, B, D, KV);
        IMPL->matmul_forward(c, di->vb, di->xn, WL(di, l, W_V), NULL, B, D, KV);
        IMPL->rmsnorm_forward(c, di->qs, NULL, di->qr, WL(di, l, W_QN), cf->rms_eps, B * H, hd);
        IMPL->rope_forward(c, di->qs, di->d_pos, di->inv_freq, B, H, hd);
        IMPL->rmsnorm_forward(c, di->kbs, NULL, di->kbr, WL(di, l, W_KN), cf->rms_eps, B * Hkv, hd);
        IMPL->rope_forward(c, di->kbs, di->d_pos, di->inv_freq, B, Hkv, hd);
        IMPL->attention_block_forward(c, di->att, NULL, di->qs, di->kbs, di->vb, di->kc[l],
                                      di->vc[l], di->d_cs, di->d_cl, 1, B, di->cap, H, Hkv, hd);
        IMPL->matmul_forward_res(c, di->h1, di->att, WL(di, l, W_O), NULL, di->h, B, Q, D);
        IMPL->rmsnorm_forward(c, di->hn2, NULL, di->h1, WL(di, l, W_POST), cf->rms_eps, B, D);
        IMPL->matmul_forward(c, di->g, di->hn2, WL(di, l, W_G), NULL, B, D, F);
        IMPL->matmul_forward(c, di->u, di->hn2, WL(di, l, W_U), NULL, B, D, F);
        IMPL->swiglu_forward(c, di->a, di->g, di->u, (size_t)B * F);
        IMPL->matmul_forward_res(c, di->h, di->a, WL(di, l, W_D), NULL, di->h1, B, F, D);
    }
    /* final norm, then the target's LM head on rows 1..B-1 only */
    IMPL->rmsnorm_forward(c, di->xn, NULL, di->h, WG(di, 2), cf->rms_eps, B, D);
    IMPL->matmul_forward(c, di->logits, (const char *)di->xn + (size_t)D * di->A, di->lm_head, NULL,
                         B - 1, D, cf->V);
    IMPL->download_act(c, logits_host, di->logits, (size_t)(B - 1) * cf->V);
    return 0;
}
