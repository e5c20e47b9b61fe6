/* DFlash drafter: see drafter.h for the architecture, mask and loss. */
#include "common/model/drafter.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "common/base/f32near.h"
#include "common/base/rng.h"
#include "common/base/testhook.h"
#include "common/model/target.h"

/* Tensor order inside one layer of the flat vector (and of the checkpoint). */
enum {
    LT_Q, LT_K, LT_V, LT_O, LT_QN, LT_KN, LT_IN, LT_POST, LT_GATE, LT_UP, LT_DOWN, LT_COUNT
};

typedef struct {
    /* saved activations of one layer (act unless noted); R block rows, T ctx rows */
    void *hin;       /* (R,D) layer input (residual stream) */
    float *rstd_in;  /* (R) */
    void *qr;        /* (R,H*hd) q_proj(xn), before q_norm */
    float *q_rstd;   /* (R*H) */
    void *kbr;       /* (R,Hkv*hd) k_proj(xn), before k_norm */
    float *kb_rstd;  /* (R*Hkv) */
    void *vb;        /* (R,Hkv*hd) */
    void *kcr;       /* (T,Hkv*hd) k_proj(ctx), before k_norm */
    float *kc_rstd;  /* (T*Hkv) */
    void *vc;        /* (T,Hkv*hd) */
    void *att;       /* (R,H*hd) attention output */
    float *lse;      /* (R*H) */
    void *h1;        /* (R,D) after the attention residual */
    float *rstd_post;/* (R) */
    void *g;         /* (R,F) gate projection */
    void *u;         /* (R,F) up projection (keep_up), else NULL: recomputed into us */
    /* Not kept per layer (memory: 2 (R,D) + 1 (R,F) per layer, 2.5 GiB a layer for
     * the Qwen3-8B drafter at 65,536 rows): input_layernorm(hin),
     * post_attention_layernorm(h1) and, without keep_up, the up projection; the
     * backward recomputes them (two RMSNorms and one GEMM per layer) into the shared
     * xs / us. */
} drafter_layer_act_t;

struct drafter {
    const ops_ctx_t *c;
    drafter_config_t cfg;
    const void *embed, *lm_head;  /* (V,D) act, caller's */
    int max_T, max_Nb, max_R;
    /* parameters */
    size_t n_params;
    int n_tensors;
    drafter_tensor_t *tensors;
    float *master, *grad;         /* (n_params) f32; grad: grad_buf or the caller's (drafter_set_grads) */
    float *grad_buf;              /* (n_params) f32, the drafter's own gradient buffer; NULL
                                     with external_grads */
    void *w;                      /* (n_params) act; == master on CPU */
    /* activations */
    drafter_layer_act_t *L;
    void *ctx_fc, *ctx;           /* (T,D) fc output, hidden_norm(fc output) */
    float *ctx_rstd;              /* (T) */
    void *hout;                   /* (R,D) last layer output */
    void *hf;                     /* (R,D) norm(hout) */
    float *rstd_f;                /* (R) */
    /* scratch */
    void *xs;                     /* (R,D) input_layernorm / post_attention_layernorm output
                                     of the layer at hand (forward; recomputed in backward) */
    void *us;                     /* (R,F) up projection of the layer at hand (likewise);
                                     NULL with keep_up (each layer's own u) */
    void *qs, *kbs, *kcs;         /* normed+roped q, kb, kc; reused as d(raw) in backward */
    void *dq, *dkb, *dvb, *dkc, *dvc, *datt;
    void *dh, *dt1, *dt2, *dhf;   /* (R,D); during the loss dt1 holds the loss rows of hf and
                                     dt2 their gradient, (Nb*(B-1), D) each */
    void *dctx, *dct;             /* (T,D) */
    void *a, *da;                 /* (R,F) swiglu output and its grad; in backward also
                                     d gate (in a) and d up (in da, in place) */
    void *logits;                 /* (chunk*B, V) */
    /* The loss rows: every block's rows 1..B-1, in block order (Nb*(B-1) of them); a block's
     * row 0 is its anchor, which has no target, so the LM head and the loss skip it. */
    float *row_loss, *row_correct, *row_w; /* (loss rows) f32 */
    int32_t *row_target;          /* (loss rows) i32 backend */
    int32_t *row_ids, *row_pos;   /* (R) i32 backend */
    int32_t *ctx_pos, *ctx_start, *ctx_len;  /* (T), (Nb), (Nb) i32 backend */
    float *inv_freq;              /* (hd/2) f32 backend */
    /* host staging */
    int32_t *h_row_target, *h_row_ids, *h_row_pos, *h_ctx_pos, *h_ctx_start, *h_ctx_len;
    float *h_row_w, *h_row_loss, *h_row_correct; /* h_row_target, _w, _loss, _correct, _mask: */
    uint8_t *h_row_mask;                         /* per loss row, as on the backend */
    /* last forward */
    int T, Nb, fwd_ok;
    const void *features;
    double weight_sum;
};

#define IMPL (d->c->impl)

/* ------------------------------------------------------------------ config */

void drafter_config_defaults(drafter_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->n_layers = DRAFTER_DEFAULT_LAYERS;
    cfg->B = DRAFTER_DEFAULT_BLOCK;
    cfg->mask_token_id = -1;
    cfg->loss_chunk_blocks = DRAFTER_DEFAULT_LOSS_CHUNK_BLOCKS;
    cfg->rms_eps = 1e-6f;
    cfg->rope.theta = 10000.0;
}

void drafter_config_from_target(drafter_config_t *cfg, const model_config_t *t) {
    cfg->D = t->D, cfg->H = t->H, cfg->Hkv = t->Hkv, cfg->hd = t->hd, cfg->F = t->F;
    cfg->V = t->V, cfg->n_target_layers = t->L, cfg->max_position_embeddings = t->max_pos;
    cfg->rms_eps = t->eps, cfg->rope = t->rope;
}

int drafter_default_layer_ids(int L, int n, int *out) {
    if (n > DRAFTER_MAX_FEAT)
        return dl_seterr(DL_EINVAL, "drafter layer ids: %d drafter layers (max %d)", n,
                         DRAFTER_MAX_FEAT);
    return target_default_layer_ids(L, n, out); /* one source: common/model/target.c */
}

float drafter_default_gamma(int B) {
    if (B < 8) return 0.5f * B;
    if (B <= 10) return 4.0f + 0.5f * (B - 8);
    if (B <= 16) return 5.0f + (B - 10) / 3.0f;
    return 7.0f + (B - 16) / 3.0f;
}

int drafter_config_finish(drafter_config_t *c) {
#define REQ(cond, ...) do { if (!(cond)) return dl_seterr(DL_EINVAL, __VA_ARGS__); } while (0)
    REQ(c->D > 0 && c->H > 0 && c->Hkv > 0 && c->hd > 0 && c->F > 0 && c->V > 0,
        "drafter config: D %d, H %d, Hkv %d, hd %d, F %d, V %d must be > 0", c->D, c->H, c->Hkv,
        c->hd, c->F, c->V);
    REQ(c->H % c->Hkv == 0, "drafter config: H %d not a multiple of Hkv %d", c->H, c->Hkv);
    REQ(c->hd % 2 == 0, "drafter config: head dim %d is odd (RoPE)", c->hd);
    REQ(c->n_layers >= 1 && c->n_layers <= DRAFTER_MAX_LAYERS,
        "drafter config: --drafter-layers %d (1..%d)", c->n_layers, DRAFTER_MAX_LAYERS);
    REQ(c->B >= 2 && c->B <= DRAFTER_MAX_BLOCK, "drafter config: --block-size %d (2..%d)", c->B,
        DRAFTER_MAX_BLOCK);
    REQ(c->mask_token_id >= 0 && c->mask_token_id < c->V,
        "drafter config: --mask-token-id %d not in [0, V=%d)", c->mask_token_id, c->V);
    REQ(c->rms_eps > 0, "drafter config: rms_norm_eps %g", c->rms_eps);
    REQ(c->rope.theta > 0, "drafter config: rope_theta %g", c->rope.theta);
    if (c->n_feat <= 0) {
        c->n_feat = c->n_layers;
        DL_TRY(drafter_default_layer_ids(c->n_target_layers, c->n_feat, c->target_layer_ids));
    }
    REQ(c->n_feat <= DRAFTER_MAX_FEAT, "drafter config: %d target layers (max %d)", c->n_feat,
        DRAFTER_MAX_FEAT);
    for (int i = 0; i < c->n_feat; i++)
        REQ(c->target_layer_ids[i] >= 0 &&
                (c->n_target_layers <= 0 || c->target_layer_ids[i] < c->n_target_layers),
            "drafter config: --target-layer-ids[%d] = %d not in [0, %d)", i,
            c->target_layer_ids[i], c->n_target_layers);
    if (!(c->gamma > 0)) c->gamma = drafter_default_gamma(c->B);
    if (c->loss_chunk_blocks <= 0) c->loss_chunk_blocks = DRAFTER_DEFAULT_LOSS_CHUNK_BLOCKS;
    return 0;
#undef REQ
}

/* ------------------------------------------------------------- parameters */

static void add_tensor(drafter_t *d, const char *name, int n_dims, int64_t d0, int64_t d1) {
    drafter_tensor_t *t = &d->tensors[d->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->shape[0] = d0;
    t->shape[1] = n_dims == 2 ? d1 : 1;
    t->numel = (size_t)d0 * (n_dims == 2 ? (size_t)d1 : 1);
    t->offset = d->n_params;
    d->n_params += t->numel;
}

static void build_tensors(drafter_t *d) {
    const drafter_config_t *c = &d->cfg;
    char nm[64];
    d->tensors = calloc((size_t)c->n_layers * LT_COUNT + 3, sizeof(drafter_tensor_t));
    if (!d->tensors) return;
    for (int l = 0; l < c->n_layers; l++) {
#define T2(suffix, a, b) snprintf(nm, sizeof nm, "layers.%d." suffix, l), add_tensor(d, nm, 2, a, b)
#define T1(suffix, a) snprintf(nm, sizeof nm, "layers.%d." suffix, l), add_tensor(d, nm, 1, a, 1)
        T2("self_attn.q_proj.weight", c->H * c->hd, c->D);
        T2("self_attn.k_proj.weight", c->Hkv * c->hd, c->D);
        T2("self_attn.v_proj.weight", c->Hkv * c->hd, c->D);
        T2("self_attn.o_proj.weight", c->D, c->H * c->hd);
        T1("self_attn.q_norm.weight", c->hd);
        T1("self_attn.k_norm.weight", c->hd);
        T1("input_layernorm.weight", c->D);
        T1("post_attention_layernorm.weight", c->D);
        T2("mlp.gate_proj.weight", c->F, c->D);
        T2("mlp.up_proj.weight", c->F, c->D);
        T2("mlp.down_proj.weight", c->D, c->F);
#undef T1
#undef T2
    }
    add_tensor(d, "fc.weight", 2, c->D, (int64_t)c->n_feat * c->D);
    add_tensor(d, "hidden_norm.weight", 1, c->D, 1);
    add_tensor(d, "norm.weight", 1, c->D, 1);
}

static inline int tix_layer(int l, int which) { return l * LT_COUNT + which; }
static inline int tix_fc(const drafter_t *d) { return d->cfg.n_layers * LT_COUNT; }

/* Working (act) weight and f32 grad of tensor i. */
static inline void *W(const drafter_t *d, int i) {
    return (char *)d->w + d->tensors[i].offset * ops_act_bytes(d->c);
}
static inline float *G(const drafter_t *d, int i) { return d->grad + d->tensors[i].offset; }

size_t drafter_n_params(const drafter_t *d) { return d->n_params; }
float *drafter_master(drafter_t *d) { return d->master; }
float *drafter_grads(drafter_t *d) { return d->grad; }
void *drafter_weights(drafter_t *d) { return d->w; }
int drafter_n_tensors(const drafter_t *d) { return d->n_tensors; }
const drafter_tensor_t *drafter_tensor(const drafter_t *d, int i) {
    return (i >= 0 && i < d->n_tensors) ? &d->tensors[i] : NULL;
}
const drafter_tensor_t *drafter_find_tensor(const drafter_t *d, const char *name) {
    for (int i = 0; i < d->n_tensors; i++)
        if (strcmp(d->tensors[i].name, name) == 0) return &d->tensors[i];
    return NULL;
}
const drafter_config_t *drafter_config(const drafter_t *d) { return &d->cfg; }

void drafter_sync_weights(drafter_t *d) {
    if (d->master && (void *)d->master != d->w)
        IMPL->f32_to_act(d->c, d->w, d->master, d->n_params);
}

/* bytes from src (host memory when src_host, else device memory) to dst on the backend */
static void put_f32(const drafter_t *d, float *dst, const float *src, size_t n, int src_host) {
    if (src_host) IMPL->upload(d->c, dst, src, n * sizeof(float));
    else IMPL->copy(d->c, dst, src, n * sizeof(float));
}

int drafter_load_master(drafter_t *d, const float *src, int src_host) {
    if (!d->w) return dl_seterr(DL_ESTATE, "drafter_load_master: a layout-only drafter");
    const size_t n = d->n_params;
    if (d->master) {
        put_f32(d, d->master, src, n, src_host);
        drafter_sync_weights(d);
        return 0;
    }
    const size_t A = ops_act_bytes(d->c);
    if (!src_host) {   /* on the backend (a device slab, or this GPU's / a peer's mapping) */
        IMPL->f32_to_act(d->c, d->w, src, n);
        return 0;
    }
    /* no master, from the host: through the swiglu scratch (max_R x F act bytes, free
     * between steps) */
    size_t chunk = (size_t)d->max_R * d->cfg.F * A / sizeof(float);
    if (chunk > n) chunk = n;   /* >= 1: B >= 2 rows of F >= 1 act (>= 2 bytes) */
    for (size_t off = 0; off < n; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        put_f32(d, d->a, src + off, m, src_host);
        IMPL->f32_to_act(d->c, (char *)d->w + off * A, d->a, m);
    }
    return 0;
}

int drafter_download_master(drafter_t *d, float *host) {
    if (!d->master)
        return dl_seterr(DL_ESTATE, "drafter_download_master: the drafter keeps no f32 master "
                         "(no_master or layout_only)");
    IMPL->download(d->c, host, d->master, d->n_params * sizeof(float));
    return 0;
}

int drafter_upload_master(drafter_t *d, const float *host) { return drafter_load_master(d, host, 1); }

void drafter_set_grads(drafter_t *d, float *grads) { d->grad = grads ? grads : d->grad_buf; }

void drafter_zero_grad(drafter_t *d) {
    if (d->grad) IMPL->memset0(d->c, d->grad, d->n_params * sizeof(float));
}

/* ----------------------------------------------------------- construction */

typedef struct { void **slot; size_t bytes; } alloc_req_t;

/* The seeded init as Qwen3PreTrainedModel._init_weights (Linear N(0, 0.02), RMSNorm 1)
 * is, bitwise, the sequential loop
 *     rng_seed(&r, seed); for each tensor, each element e:
 *         dst[off + e] = n_dims == 2 ? 0.02f * rng_normal(&r) : 1.0f;
 * rng_normal takes exactly two rng_u64 draws and 1-D tensors none, so normal number g
 * of the stream (over the 2-D tensors in order) starts at draw 2g: the stream is cut
 * into DRAFTER_INIT_CHUNK normals, chunk k starting from the seeded state jumped
 * 2 * DRAFTER_INIT_CHUNK * k draws (rng_jump_t). init_plan makes that cut: the first
 * normal of each tensor (gstart, n_tensors + 1; gstart[nt] = G, the normals in all) and
 * each chunk's start state (*nch of them). 0 or DL_ENOMEM (both freed). */
static int init_plan(const drafter_t *d, uint64_t seed, size_t **gstart_out, rng_t **st_out,
                     size_t *nch_out) {
    int nt = d->n_tensors;
    size_t *gstart = malloc(((size_t)nt + 1) * sizeof *gstart);  /* first normal of tensor i */
    if (!gstart) return DL_ENOMEM;
    size_t G = 0;
    for (int i = 0; i < nt; i++) {
        gstart[i] = G;
        if (d->tensors[i].n_dims == 2) G += d->tensors[i].numel;
    }
    gstart[nt] = G;
    size_t nch = (G + DRAFTER_INIT_CHUNK - 1) / DRAFTER_INIT_CHUNK;
    rng_t *st = malloc((nch ? nch : 1) * sizeof *st);
    rng_jump_t *jump = malloc(sizeof *jump);
    if (!st || !jump) {
        free(gstart); free(st); free(jump);
        return DL_ENOMEM;
    }
    rng_jump_make(jump, 2 * (uint64_t)DRAFTER_INIT_CHUNK);
    rng_seed(&st[0], seed);
    for (size_t k = 1; k < nch; k++) {
        st[k] = st[k - 1];
        rng_jump_apply(jump, &st[k]);
    }
    free(jump);
    *gstart_out = gstart;
    *st_out = st;
    *nch_out = nch;
    return 0;
}

/* The 2-D tensors of d as segments of the stream (seg: n_tensors entries of room; *ns
 * used) and the largest 1-D tensor's size (*max1). */
static void init_segments(const drafter_t *d, const size_t *gstart, ops_normal_seg_t *seg, int *ns,
                          size_t *max1) {
    *ns = 0;
    *max1 = 0;
    for (int i = 0; i < d->n_tensors; i++) {
        const drafter_tensor_t *t = &d->tensors[i];
        if (t->n_dims != 2) { if (t->numel > *max1) *max1 = t->numel; continue; }
        if (!t->numel) continue;
        seg[*ns] = (ops_normal_seg_t){gstart[i], t->offset, t->numel};
        (*ns)++;
    }
}

/* The init into dst[n_params] f32 on backend c: the plan's chunks to c's normal_init (on
 * CPU ops/cpu/init.c, the host init itself), each normal it lists near a rounding midpoint
 * recomputed here (rng_normal_f64: the host's bits) and rewritten where it differs, the
 * 1-D tensors' ones uploaded. near_rel 0: nothing listed (the host). */
static int init_on(const drafter_t *d, uint64_t seed, const ops_ctx_t *c, float *dst, double near_rel,
                   drafter_init_info_t *info) {
    int nt = d->n_tensors, rc = 0;
    size_t *gstart = NULL, nch = 0;
    rng_t *st = NULL;
    if (init_plan(d, seed, &gstart, &st, &nch) < 0) return dl_seterr(DL_ENOMEM, "drafter init: chunk table");
    uint64_t G = gstart[nt];
    /* a value is flagged with probability at most near_rel * 2^25 (f32near.h; 2^-15 at
     * F32NEAR_REL): room for 4 times that */
    double share = near_rel * 0x1p27 < 1.0 ? near_rel * 0x1p27 : 1.0;
    size_t near_cap = (size_t)((double)G * share) + 4096;
    ops_normal_seg_t *seg = malloc(((size_t)nt + 1) * sizeof *seg);
    ops_normal_near_t *near = malloc(near_cap * sizeof *near);
    float *ones = NULL;
    int ns = 0;
    size_t max1 = 0, n_near = 0, fixed = 0;
    if (!seg || !near) { rc = dl_seterr(DL_ENOMEM, "drafter init: segments, near list"); goto out; }
    init_segments(d, gstart, seg, &ns, &max1);
    if (G) {
        rc = c->impl->normal_init(c, dst, seg, ns, &st[0].s[0], nch, DRAFTER_INIT_CHUNK, G, 0.02f, near_rel,
                                  near, near_cap, &n_near);
        if (rc < 0) goto out;
    }
    for (size_t j = 0; j < n_near; j++) {
        float x = 0.02f * (float)rng_normal_f64(near[j].draw[0], near[j].draw[1]);
        if (memcmp(&x, &near[j].value, sizeof x) == 0) continue;
        c->impl->upload(c, dst + near[j].index, &x, sizeof x);
        fixed++;
    }
    ones = malloc((max1 ? max1 : 1) * sizeof *ones);
    if (!ones) { rc = dl_seterr(DL_ENOMEM, "drafter init: ones"); goto out; }
    for (size_t e = 0; e < max1; e++) ones[e] = 1.0f;
    for (int i = 0; i < nt; i++) {
        const drafter_tensor_t *t = &d->tensors[i];
        if (t->n_dims != 2 && t->numel) c->impl->upload(c, dst + t->offset, ones, t->numel * sizeof *ones);
    }
    c->impl->sync(c);
    if (info) {
        info->on_device = c->backend != OPS_CPU;
        info->normals = G;
        info->near = n_near;
        info->fixed = fixed;
    }
out:
    free(ones); free(near); free(seg); free(st); free(gstart);
    return rc;
}

int drafter_init_master(const drafter_t *d, uint64_t seed, float *host) {
    ops_ctx_t cc;
    ops_cpu_init(&cc, 0);   /* the OpenMP default team */
    int rc = init_on(d, seed, &cc, host, 0, NULL);
    ops_ctx_destroy(&cc);
    return rc;
}

int drafter_init_master_on(const drafter_t *d, uint64_t seed, const ops_ctx_t *c, float *dst,
                           double near_rel, drafter_init_info_t *info) {
    if (info) memset(info, 0, sizeof *info);
    if (c->backend == OPS_CPU) return drafter_init_master(d, seed, dst);
    int rc = c->impl->normal_init ? init_on(d, seed, c, dst, near_rel > 0 ? near_rel : F32NEAR_REL, info)
                                  : DL_ENOTSUP;
    if (rc != DL_ERANGE && rc != DL_ENOTSUP) return rc;
    /* no device init, or more near normals than room: the host init, uploaded */
    if (info) memset(info, 0, sizeof *info), info->overflow = rc == DL_ERANGE;
    float *h = malloc(d->n_params * sizeof *h);
    if (!h) return dl_seterr(DL_ENOMEM, "drafter init: %zu host floats", d->n_params);
    rc = drafter_init_master(d, seed, h);
    if (rc == 0) {
        c->impl->upload(c, dst, h, d->n_params * sizeof *h);
        c->impl->sync(c);
    }
    free(h);
    return rc;
}

int drafter_new(const ops_ctx_t *c, const drafter_config_t *cfg, const void *embed,
                const void *lm_head, int max_tokens, int max_blocks, uint64_t seed,
                drafter_t **out) {
    return drafter_new_opts(c, cfg, embed, lm_head, max_tokens, max_blocks, seed, NULL, out);
}

int drafter_new_opts(const ops_ctx_t *c, const drafter_config_t *cfg_in, const void *embed,
                     const void *lm_head, int max_tokens, int max_blocks, uint64_t seed,
                     const drafter_new_opts_t *opts, drafter_t **out) {
    *out = NULL;
    drafter_config_t cfg = *cfg_in;
    DL_TRY(drafter_config_finish(&cfg));
    if (max_tokens < 1 || max_blocks < 1)
        return dl_seterr(DL_EINVAL, "drafter_new: max_tokens %d, max_blocks %d must be >= 1",
                         max_tokens, max_blocks);
    if (!embed || !lm_head) return dl_seterr(DL_EINVAL, "drafter_new: embedding/LM head missing");
    drafter_t *d = calloc(1, sizeof(*d));
    if (!d) return dl_seterr(DL_ENOMEM, "drafter_new: host struct");
    d->c = c;
    d->cfg = cfg;
    d->embed = embed;
    d->lm_head = lm_head;
    d->max_T = max_tokens;
    d->max_Nb = max_blocks;
    d->max_R = max_blocks * cfg.B;
    build_tensors(d);
    d->L = calloc((size_t)cfg.n_layers, sizeof(drafter_layer_act_t));
    if (!d->tensors || !d->L) {
        drafter_destroy(&d);
        return dl_seterr(DL_ENOMEM, "drafter_new: host tables");
    }
    if (opts && opts->layout_only) {   /* names, shapes and offsets: nothing on the backend */
        *out = d;
        return 0;
    }
    const size_t A = ops_act_bytes(c), R = (size_t)d->max_R, T = (size_t)max_tokens;
    const size_t D = (size_t)cfg.D, F = (size_t)cfg.F, Q = (size_t)cfg.H * cfg.hd;
    const size_t KV = (size_t)cfg.Hkv * cfg.hd, chunk_rows = (size_t)cfg.loss_chunk_blocks * cfg.B;
    /* every backend buffer, allocated below in one loop */
    alloc_req_t req[64 + 20 * DRAFTER_MAX_LAYERS]; /* <= 39 global + 16 per layer */
    int nr = 0, fail_at = -1;   /* fail_at: the request the test hook (fail_keep) fails */
#define REQ(ptr, nb_) (req[nr].slot = (void **)&(ptr), req[nr].bytes = (nb_), nr++)
    const int no_master = opts && opts->no_master, keep_up = opts && opts->keep_up;
    const int no_init = opts && (opts->no_init || no_master);
    /* test hook drafter.keep_up_enomem=1: the last layer's kept up projection "does not fit"
     * (its allocation fails as a full device's would, after the ones before it) */
    int64_t hook = 0;
    const int fail_keep = keep_up && testhook_i64("drafter.keep_up_enomem", &hook) && hook;
    if (!no_master) REQ(d->master, d->n_params * 4);
    if (!(opts && opts->external_grads)) REQ(d->grad_buf, d->n_params * 4);
    if (c->backend != OPS_CPU || no_master) REQ(d->w, d->n_params * A);
    for (int l = 0; l < cfg.n_layers; l++) {
        drafter_layer_act_t *a = &d->L[l];
        REQ(a->hin, R * D * A); REQ(a->rstd_in, R * 4);
        REQ(a->qr, R * Q * A); REQ(a->q_rstd, R * cfg.H * 4);
        REQ(a->kbr, R * KV * A); REQ(a->kb_rstd, R * cfg.Hkv * 4); REQ(a->vb, R * KV * A);
        REQ(a->kcr, T * KV * A); REQ(a->kc_rstd, T * cfg.Hkv * 4); REQ(a->vc, T * KV * A);
        REQ(a->att, R * Q * A); REQ(a->lse, R * cfg.H * 4);
        REQ(a->h1, R * D * A); REQ(a->rstd_post, R * 4);
        REQ(a->g, R * F * A);
        if (keep_up) {
            if (fail_keep && l == cfg.n_layers - 1) fail_at = nr;
            REQ(a->u, R * F * A);
        }
    }
    REQ(d->ctx_fc, T * D * A); REQ(d->ctx, T * D * A); REQ(d->ctx_rstd, T * 4);
    REQ(d->hout, R * D * A); REQ(d->hf, R * D * A); REQ(d->rstd_f, R * 4);
    REQ(d->xs, R * D * A);
    if (!keep_up) REQ(d->us, R * F * A);   /* keep_up: the layers' own u instead */
    REQ(d->qs, R * Q * A); REQ(d->kbs, R * KV * A); REQ(d->kcs, T * KV * A);
    REQ(d->dq, R * Q * A); REQ(d->dkb, R * KV * A); REQ(d->dvb, R * KV * A);
    REQ(d->dkc, T * KV * A); REQ(d->dvc, T * KV * A); REQ(d->datt, R * Q * A);
    REQ(d->dh, R * D * A); REQ(d->dt1, R * D * A); REQ(d->dt2, R * D * A); REQ(d->dhf, R * D * A);
    REQ(d->dctx, T * D * A); REQ(d->dct, T * D * A);
    REQ(d->a, R * F * A); REQ(d->da, R * F * A);
    REQ(d->logits, chunk_rows * cfg.V * A);
    REQ(d->row_loss, R * 4); REQ(d->row_correct, R * 4); REQ(d->row_w, R * 4);
    REQ(d->row_target, R * 4); REQ(d->row_ids, R * 4); REQ(d->row_pos, R * 4);
    REQ(d->ctx_pos, T * 4); REQ(d->ctx_start, (size_t)max_blocks * 4);
    REQ(d->ctx_len, (size_t)max_blocks * 4); REQ(d->inv_freq, (size_t)cfg.hd / 2 * 4);
#undef REQ
    size_t total = 0;
    for (int i = 0; i < nr; i++) {
        *req[i].slot = i == fail_at ? NULL : IMPL->malloc_(c, req[i].bytes);
        total += req[i].bytes;
        if (!*req[i].slot) {   /* the message first: IMPL reads d, which destroy frees */
            int rc = dl_seterr(DL_ENOMEM, "drafter_new: %s allocation of %zu bytes failed (%.2f "
                               "GiB requested so far; lower the token budget or --num-anchors)",
                               IMPL->name, req[i].bytes, total / 1073741824.0);
            drafter_destroy(&d);
            return rc;
        }
    }
    d->grad = d->grad_buf;
    if (c->backend == OPS_CPU && !no_master) d->w = d->master;
    /* host staging */
    d->h_row_target = malloc(R * 4), d->h_row_ids = malloc(R * 4), d->h_row_pos = malloc(R * 4);
    d->h_ctx_pos = malloc(T * 4), d->h_ctx_start = malloc((size_t)max_blocks * 4);
    d->h_ctx_len = malloc((size_t)max_blocks * 4), d->h_row_w = malloc(R * 4);
    d->h_row_loss = malloc(R * 4), d->h_row_correct = malloc(R * 4), d->h_row_mask = malloc(R);
    /* CPU: master is host memory, initialised in place */
    int in_place = c->backend == OPS_CPU || no_init;
    float *init = in_place ? (float *)d->master : malloc(d->n_params * sizeof(float));
    float inv[1024]; /* hd/2 inverse frequencies */
    if (!d->h_row_target || !d->h_row_ids || !d->h_row_pos || !d->h_ctx_pos || !d->h_ctx_start ||
        !d->h_ctx_len || !d->h_row_w || !d->h_row_loss || !d->h_row_correct || !d->h_row_mask ||
        (!in_place && !init) || cfg.hd / 2 > (int)(sizeof inv / sizeof inv[0])) {
        if (!in_place) free(init);
        drafter_destroy(&d);
        return dl_seterr(DL_ENOMEM, "drafter_new: host staging");
    }
    if (no_init) {   /* the caller's weights replace these */
        if (d->master) IMPL->memset0(c, d->master, d->n_params * 4);
        else IMPL->memset0(c, d->w, d->n_params * A);
    } else if (drafter_init_master(d, seed, init) < 0) {
        if (!in_place) free(init);
        drafter_destroy(&d);
        return dl_seterr(DL_ENOMEM, "drafter_new: init chunk table");
    }
    if (!in_place) {
        IMPL->upload(c, d->master, init, d->n_params * 4);
        free(init);
    }
    drafter_sync_weights(d);
    drafter_zero_grad(d);
    ops_rope_inv_freq(&cfg.rope, cfg.hd, inv);
    IMPL->upload(c, d->inv_freq, inv, (size_t)cfg.hd / 2 * 4);
    *out = d;
    return 0;
}

void drafter_destroy(drafter_t **dp) {
    if (!dp || !*dp) return;
    drafter_t *d = *dp;
    const ops_ctx_t *c = d->c;
    if (d->L) {
        for (int l = 0; l < d->cfg.n_layers; l++) {
            drafter_layer_act_t *a = &d->L[l];
            void *ps[] = {a->hin, a->rstd_in, a->qr, a->q_rstd, a->kbr, a->kb_rstd, a->vb,
                          a->kcr, a->kc_rstd, a->vc, a->att, a->lse, a->h1, a->rstd_post, a->g,
                          a->u};
            for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
                if (ps[i]) IMPL->free_(c, ps[i]);
        }
    }
    void *ps[] = {d->master, d->grad_buf, d->w != (void *)d->master ? d->w : NULL, d->ctx_fc, d->ctx,
                  d->ctx_rstd, d->hout, d->hf, d->rstd_f, d->xs, d->us, d->qs, d->kbs, d->kcs,
                  d->dq, d->dkb, d->dvb, d->dkc, d->dvc, d->datt, d->dh, d->dt1, d->dt2, d->dhf,
                  d->dctx, d->dct, d->a, d->da, d->logits, d->row_loss, d->row_correct, d->row_w,
                  d->row_target, d->row_ids, d->row_pos, d->ctx_pos, d->ctx_start, d->ctx_len,
                  d->inv_freq};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        if (ps[i]) IMPL->free_(c, ps[i]);
    free(d->h_row_target), free(d->h_row_ids), free(d->h_row_pos), free(d->h_ctx_pos);
    free(d->h_ctx_start), free(d->h_ctx_len), free(d->h_row_w), free(d->h_row_loss);
    free(d->h_row_correct), free(d->h_row_mask);
    free(d->tensors), free(d->L);
    free(d);
    *dp = NULL;
}

/* ------------------------------------------------------------ batch setup */

/* Validates the batch and builds the per-row / per-block index arrays on the host,
 * then uploads them. */
static int prepare_batch(drafter_t *d, const drafter_batch_t *b) {
    const drafter_config_t *c = &d->cfg;
    const int B = c->B;
    if (b->T < 1 || b->T > d->max_T)
        return dl_seterr(DL_ERANGE, "drafter batch: T %d not in [1, max_tokens %d]", b->T, d->max_T);
    if (b->n_blocks < 1 || b->n_blocks > d->max_Nb)
        return dl_seterr(DL_ERANGE, "drafter batch: %d blocks not in [1, max_blocks %d]",
                         b->n_blocks, d->max_Nb);
    if (b->nseq < 1 || b->cu_seqlens[0] != 0 || b->cu_seqlens[b->nseq] != b->T)
        return dl_seterr(DL_EINVAL, "drafter batch: cu_seqlens must run 0..T=%d over %d sequences",
                         b->T, b->nseq);
    for (int s = 0; s < b->nseq; s++)
        if (b->cu_seqlens[s + 1] < b->cu_seqlens[s])
            return dl_seterr(DL_EINVAL, "drafter batch: cu_seqlens decreases at %d", s);
    for (int t = 0; t < b->T; t++)
        if (b->ids[t] < 0 || b->ids[t] >= c->V)
            return dl_seterr(DL_EINVAL, "drafter batch: token %d id %d not in [0, V=%d)", t,
                             b->ids[t], c->V);
    /* context positions */
    for (int s = 0; s < b->nseq; s++)
        for (int t = b->cu_seqlens[s]; t < b->cu_seqlens[s + 1]; t++)
            d->h_ctx_pos[t] = b->pos ? b->pos[t] : t - b->cu_seqlens[s];
    double wsum = 0.0;
    for (int j = 0; j < b->n_blocks; j++) {
        int a = b->anchors[j];
        if (a < 0 || a >= b->T)
            return dl_seterr(DL_ERANGE, "drafter batch: anchor %d = %d not in [0, T=%d)", j, a, b->T);
        int s = 0;  /* binary search: sequence holding a */
        int lo = 0, hi = b->nseq - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (b->cu_seqlens[mid] <= a) lo = mid; else hi = mid - 1;
        }
        s = lo;
        int s0 = b->cu_seqlens[s], s1 = b->cu_seqlens[s + 1];
        d->h_ctx_start[j] = s0;
        d->h_ctx_len[j] = a - s0; /* context rows strictly before the anchor */
        for (int k = 0; k < B; k++) {
            int row = j * B + k, t = a + k;
            d->h_row_ids[row] = k == 0 ? b->ids[a] : c->mask_token_id;
            d->h_row_pos[row] = d->h_ctx_pos[a] + k;
            if (k == 0) continue;            /* the anchor: no loss row */
            int lr = j * (B - 1) + k - 1, in = t < s1;
            d->h_row_target[lr] = in ? b->ids[t] : 0;
            d->h_row_mask[lr] = in && b->loss_mask[t];
            float w = d->h_row_mask[lr] ? (float)exp(-(double)(k - 1) / c->gamma) : 0.0f;
            d->h_row_w[lr] = w;
            wsum += w;
        }
    }
    const ops_ctx_t *x = d->c;
    int R = b->n_blocks * B, Rl = b->n_blocks * (B - 1);
    IMPL->upload(x, d->ctx_pos, d->h_ctx_pos, (size_t)b->T * 4);
    IMPL->upload(x, d->ctx_start, d->h_ctx_start, (size_t)b->n_blocks * 4);
    IMPL->upload(x, d->ctx_len, d->h_ctx_len, (size_t)b->n_blocks * 4);
    IMPL->upload(x, d->row_ids, d->h_row_ids, (size_t)R * 4);
    IMPL->upload(x, d->row_pos, d->h_row_pos, (size_t)R * 4);
    IMPL->upload(x, d->row_target, d->h_row_target, (size_t)Rl * 4);
    IMPL->upload(x, d->row_w, d->h_row_w, (size_t)Rl * 4);
    d->T = b->T;
    d->Nb = b->n_blocks;
    d->features = b->features;
    d->weight_sum = wsum;
    return 0;
}

/* ------------------------------------------------------------------ forward */

/* Normalised + roped copies of raw q/k rows (used by attention); rstd saved when
 * non-NULL. One fused op (on CPU the composition rmsnorm_forward, rope_forward). */
static void qk_prepare(drafter_t *d, void *dst, float *rstd, const void *raw, const void *norm_w,
                       int rows, int nh, const int32_t *pos) {
    const drafter_config_t *c = &d->cfg;
    IMPL->qk_norm_rope_forward(d->c, dst, rstd, raw, norm_w, c->rms_eps, pos, d->inv_freq, rows,
                               nh, c->hd);
}

int drafter_forward(drafter_t *d, const drafter_batch_t *b) {
    d->fwd_ok = 0;
    DL_TRY(prepare_batch(d, b));
    const drafter_config_t *c = &d->cfg;
    const ops_ctx_t *x = d->c;
    const int T = d->T, R = d->Nb * c->B, D = c->D, H = c->H, Hkv = c->Hkv, hd = c->hd, F = c->F;
    const int Q = H * hd, KV = Hkv * hd;
    const size_t A = ops_act_bytes(x);
    /* ctx = hidden_norm(fc(features)) */
    IMPL->matmul_forward(x, d->ctx_fc, b->features, W(d, tix_fc(d)), NULL, T, c->n_feat * D, D);
    IMPL->rmsnorm_forward(x, d->ctx, d->ctx_rstd, d->ctx_fc, W(d, tix_fc(d) + 1), c->rms_eps, T, D);
    /* block embeddings: [anchor token, MASK x (B-1)] */
    void *h = d->L[0].hin;
    IMPL->embedding_forward(x, h, d->row_ids, d->embed, R, D);
    for (int l = 0; l < c->n_layers; l++) {
        drafter_layer_act_t *a = &d->L[l];
        void *next = l + 1 < c->n_layers ? d->L[l + 1].hin : d->hout;
        IMPL->rmsnorm_forward(x, d->xs, a->rstd_in, a->hin, W(d, tix_layer(l, LT_IN)), c->rms_eps,
                              R, D);
        IMPL->matmul_forward(x, a->qr, d->xs, W(d, tix_layer(l, LT_Q)), NULL, R, D, Q);
        IMPL->matmul_forward(x, a->kbr, d->xs, W(d, tix_layer(l, LT_K)), NULL, R, D, KV);
        IMPL->matmul_forward(x, a->vb, d->xs, W(d, tix_layer(l, LT_V)), NULL, R, D, KV);
        IMPL->matmul_forward(x, a->kcr, d->ctx, W(d, tix_layer(l, LT_K)), NULL, T, D, KV);
        IMPL->matmul_forward(x, a->vc, d->ctx, W(d, tix_layer(l, LT_V)), NULL, T, D, KV);
        /* rstds of q/k norms are saved for backward */
        qk_prepare(d, d->qs, a->q_rstd, a->qr, W(d, tix_layer(l, LT_QN)), R, H, d->row_pos);
        qk_prepare(d, d->kbs, a->kb_rstd, a->kbr, W(d, tix_layer(l, LT_KN)), R, Hkv, d->row_pos);
        qk_prepare(d, d->kcs, a->kc_rstd, a->kcr, W(d, tix_layer(l, LT_KN)), T, Hkv, d->ctx_pos);
        IMPL->attention_block_forward(x, a->att, a->lse, d->qs, d->kbs, a->vb, d->kcs, a->vc,
                                      d->ctx_start, d->ctx_len, d->Nb, c->B, T, H, Hkv, hd);
        /* h1 = hin + o_proj(att): the residual add inside the GEMM (CUDA: its epilogue) */
        IMPL->matmul_forward_res(x, a->h1, a->att, W(d, tix_layer(l, LT_O)), NULL, a->hin, R, Q,
                                 D);
        IMPL->rmsnorm_forward(x, d->xs, a->rstd_post, a->h1, W(d, tix_layer(l, LT_POST)),
                              c->rms_eps, R, D);
        void *u = a->u ? a->u : d->us;   /* keep_up: this layer's own */
        IMPL->matmul_forward(x, a->g, d->xs, W(d, tix_layer(l, LT_GATE)), NULL, R, D, F);
        IMPL->matmul_forward(x, u, d->xs, W(d, tix_layer(l, LT_UP)), NULL, R, D, F);
        IMPL->swiglu_forward(x, d->a, a->g, u, (size_t)R * F);
        IMPL->matmul_forward_res(x, next, d->a, W(d, tix_layer(l, LT_DOWN)), NULL, a->h1, R, F,
                                 D);
    }
    IMPL->rmsnorm_forward(x, d->hf, d->rstd_f, d->hout, W(d, tix_fc(d) + 2), c->rms_eps, R, D);
    (void)A;
    d->fwd_ok = 1;
    return 0;
}

int drafter_logits(drafter_t *d, int j0, int n, float *out_host) {
    const drafter_config_t *c = &d->cfg;
    if (!d->fwd_ok) return dl_seterr(DL_ESTATE, "drafter_logits: no forward pass yet");
    if (j0 < 0 || n < 1 || j0 + n > d->Nb)
        return dl_seterr(DL_ERANGE, "drafter_logits: blocks [%d, %d) of %d", j0, j0 + n, d->Nb);
    const size_t A = ops_act_bytes(d->c);
    const int chunk = c->loss_chunk_blocks;
    for (int j = j0; j < j0 + n; j += chunk) {
        int nb = j + chunk <= j0 + n ? chunk : j0 + n - j, rows = nb * c->B;
        IMPL->matmul_forward(d->c, d->logits, (char *)d->hf + (size_t)j * c->B * c->D * A,
                             d->lm_head, NULL, rows, c->D, c->V);
        IMPL->download_act(d->c, out_host + (size_t)(j - j0) * c->B * c->V, d->logits,
                           (size_t)rows * c->V);
    }
    return 0;
}

/* ----------------------------------------------------------------- backward */

/* Layer l's shared k/v projections, backward, for M rows of their input inp (M, D):
 * din (M, D) += dk . Wk + dv . Wv (accumulated in the GEMMs), and Wk's, Wv's gradients +=.
 * dk, dv (M, Hkv*hd): the gradients of the k (normed, roped: as qk_norm_rope_backward left
 * them) and v projections. Used for the block rows and for the context. */
static void kv_backward(drafter_t *d, int l, void *din, const void *dk, const void *dv,
                        const void *inp, int M) {
    const int D = d->cfg.D, KV = d->cfg.Hkv * d->cfg.hd;
    IMPL->matmul_backward(d->c, din, G(d, tix_layer(l, LT_K)), NULL, dk, inp,
                          W(d, tix_layer(l, LT_K)), M, D, KV, 1);
    IMPL->matmul_backward(d->c, din, G(d, tix_layer(l, LT_V)), NULL, dv, inp,
                          W(d, tix_layer(l, LT_V)), M, D, KV, 1);
}

/* rows x width bytes from src (rows src_pitch apart) to dst (dst_pitch apart) on the backend:
 * the ops table's copy2d, or one copy per row where a table has none (ops.h). */
static void copy_rows(drafter_t *d, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                      size_t width, size_t rows) {
    if (IMPL->copy2d) { IMPL->copy2d(d->c, dst, dst_pitch, src, src_pitch, width, rows); return; }
    for (size_t r = 0; r < rows; r++)
        IMPL->copy(d->c, (char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
}

int drafter_forward_backward(drafter_t *d, const drafter_batch_t *b, float grad_scale,
                             drafter_stats_t *st) {
    if (!d->grad)
        return dl_seterr(DL_ESTATE, "drafter_forward_backward: no gradient buffer (external_grads: "
                         "drafter_set_grads first)");
    DL_TRY(drafter_forward(d, b));
    const drafter_config_t *c = &d->cfg;
    const ops_ctx_t *x = d->c;
    const int T = d->T, R = d->Nb * c->B, D = c->D, H = c->H, Hkv = c->Hkv, hd = c->hd, F = c->F;
    const int Q = H * hd, B = c->B;
    const size_t A = ops_act_bytes(x);
    float gs = grad_scale > 0 ? grad_scale : (d->weight_sum > 0 ? (float)(1.0 / d->weight_sum) : 0);
    /* chunked loss over the loss rows (each block's rows 1..B-1; its anchor row 0 has no
     * target, so no logits either): their hf rows gathered into dt1 (Rl, D); per chunk of
     * loss_chunk_blocks*B loss rows, the logits, CE forward+backward in place, then
     * d rows = dlogits . lm_head into dt2 (Rl, D); dt2 scattered back into dhf, whose
     * anchor rows are zero (as the CE's zero gradient for them made them before). */
    const int Rl = d->Nb * (B - 1), chunk_rows = c->loss_chunk_blocks * B;
    const size_t row_b = (size_t)D * A;
    copy_rows(d, d->dt1, (B - 1) * row_b, (char *)d->hf + row_b, B * row_b, (B - 1) * row_b,
              (size_t)d->Nb);
    for (int r0 = 0; r0 < Rl; r0 += chunk_rows) {
        int rows = r0 + chunk_rows <= Rl ? chunk_rows : Rl - r0;
        const void *h = (char *)d->dt1 + (size_t)r0 * row_b;
        IMPL->matmul_forward(x, d->logits, h, d->lm_head, NULL, rows, D, c->V);
        IMPL->xent_forward_backward(x, d->logits, d->row_loss + r0, d->row_correct + r0,
                                    d->row_target + r0, d->row_w + r0, gs, rows, c->V);
        IMPL->matmul_backward(x, (char *)d->dt2 + (size_t)r0 * row_b, NULL, NULL, d->logits, h,
                              d->lm_head, rows, D, c->V, 0);
    }
    IMPL->memset0(x, d->dhf, (size_t)R * row_b);
    copy_rows(d, (char *)d->dhf + row_b, B * row_b, d->dt2, (B - 1) * row_b, (B - 1) * row_b,
              (size_t)d->Nb);
    /* final norm */
    IMPL->rmsnorm_backward(x, d->dh, G(d, tix_fc(d) + 2), d->dhf, d->hout, W(d, tix_fc(d) + 2),
                           d->rstd_f, R, D);
    IMPL->memset0(x, d->dctx, (size_t)T * D * A);
    for (int l = c->n_layers - 1; l >= 0; l--) {
        drafter_layer_act_t *a = &d->L[l];
        /* MLP: h2 = h1 + down(silu(g) * u); recompute n2 = post_attention_layernorm(h1)
         * (rstd as saved) and, unless kept (keep_up), u = up(n2): the same kernels on the
         * same inputs as the forward, so the same values */
        IMPL->rmsnorm_forward(x, d->xs, NULL, a->h1, W(d, tix_layer(l, LT_POST)), c->rms_eps, R,
                              D);
        const void *u = a->u ? a->u : d->us;
        if (!a->u)
            IMPL->matmul_forward(x, d->us, d->xs, W(d, tix_layer(l, LT_UP)), NULL, R, D, F);
        IMPL->swiglu_forward(x, d->a, a->g, u, (size_t)R * F);
        IMPL->matmul_backward(x, d->da, G(d, tix_layer(l, LT_DOWN)), NULL, d->dh, d->a,
                              W(d, tix_layer(l, LT_DOWN)), R, F, D, 0);
        /* d gate -> a (no longer needed), d up -> da in place (elementwise) */
        IMPL->swiglu_backward(x, d->a, d->da, d->da, a->g, u, (size_t)R * F);
        IMPL->matmul_backward(x, d->dt1, G(d, tix_layer(l, LT_GATE)), NULL, d->a, d->xs,
                              W(d, tix_layer(l, LT_GATE)), R, D, F, 0);
        IMPL->matmul_backward(x, d->dt1, G(d, tix_layer(l, LT_UP)), NULL, d->da, d->xs,
                              W(d, tix_layer(l, LT_UP)), R, D, F, 1);
        IMPL->rmsnorm_backward(x, d->dt2, G(d, tix_layer(l, LT_POST)), d->dt1, a->h1,
                               W(d, tix_layer(l, LT_POST)), a->rstd_post, R, D);
        IMPL->add(x, d->dh, d->dh, d->dt2, (size_t)R * D); /* dh = d h1 */
        /* recompute xn = input_layernorm(hin) for the q/k/v weight grads */
        IMPL->rmsnorm_forward(x, d->xs, NULL, a->hin, W(d, tix_layer(l, LT_IN)), c->rms_eps, R, D);
        /* attention: h1 = hin + o_proj(att) */
        IMPL->matmul_backward(x, d->datt, G(d, tix_layer(l, LT_O)), NULL, d->dh, a->att,
                              W(d, tix_layer(l, LT_O)), R, Q, D, 0);
        qk_prepare(d, d->qs, NULL, a->qr, W(d, tix_layer(l, LT_QN)), R, H, d->row_pos);
        qk_prepare(d, d->kbs, NULL, a->kbr, W(d, tix_layer(l, LT_KN)), R, Hkv, d->row_pos);
        qk_prepare(d, d->kcs, NULL, a->kcr, W(d, tix_layer(l, LT_KN)), T, Hkv, d->ctx_pos);
        IMPL->attention_block_backward(x, d->dq, d->dkb, d->dvb, d->dkc, d->dvc, d->datt, a->att,
                                       a->lse, d->qs, d->kbs, a->vb, d->kcs, a->vc, d->ctx_start,
                                       d->ctx_len, d->Nb, B, T, H, Hkv, hd);
        /* q path -> d xn (dt1); block k, v and context k, v accumulate (+=) into dt1 and
         * dctx inside their GEMMs */
        IMPL->qk_norm_rope_backward(x, d->qs, G(d, tix_layer(l, LT_QN)), d->dq, a->qr,
                                    W(d, tix_layer(l, LT_QN)), a->q_rstd, d->row_pos,
                                    d->inv_freq, c->rms_eps, R, H, hd);
        IMPL->matmul_backward(x, d->dt1, G(d, tix_layer(l, LT_Q)), NULL, d->qs, d->xs,
                              W(d, tix_layer(l, LT_Q)), R, D, Q, 0);
        /* block k, v */
        IMPL->qk_norm_rope_backward(x, d->kbs, G(d, tix_layer(l, LT_KN)), d->dkb, a->kbr,
                                    W(d, tix_layer(l, LT_KN)), a->kb_rstd, d->row_pos,
                                    d->inv_freq, c->rms_eps, R, Hkv, hd);
        kv_backward(d, l, d->dt1, d->kbs, d->dvb, d->xs, R);
        IMPL->rmsnorm_backward(x, d->dt2, G(d, tix_layer(l, LT_IN)), d->dt1, a->hin,
                               W(d, tix_layer(l, LT_IN)), a->rstd_in, R, D);
        IMPL->add(x, d->dh, d->dh, d->dt2, (size_t)R * D); /* dh = d hin */
        /* context k, v -> d ctx */
        IMPL->qk_norm_rope_backward(x, d->kcs, G(d, tix_layer(l, LT_KN)), d->dkc, a->kcr,
                                    W(d, tix_layer(l, LT_KN)), a->kc_rstd, d->ctx_pos,
                                    d->inv_freq, c->rms_eps, T, Hkv, hd);
        kv_backward(d, l, d->dctx, d->kcs, d->dvc, d->ctx, T);
    }
    /* ctx = hidden_norm(fc(features)); features are frozen (no input grad) */
    IMPL->rmsnorm_backward(x, d->dct, G(d, tix_fc(d) + 1), d->dctx, d->ctx_fc,
                           W(d, tix_fc(d) + 1), d->ctx_rstd, T, D);
    IMPL->matmul_backward(x, NULL, G(d, tix_fc(d)), NULL, d->dct, d->features, W(d, tix_fc(d)), T,
                          c->n_feat * D, D, 0);
    if (st) {
        memset(st, 0, sizeof(*st));
        IMPL->download(x, d->h_row_loss, d->row_loss, (size_t)Rl * 4);
        IMPL->download(x, d->h_row_correct, d->row_correct, (size_t)Rl * 4);
        st->weight_sum = d->weight_sum;
        for (int r = 0; r < Rl; r++) {
            int k = 1 + r % (B - 1);
            st->loss_sum += d->h_row_loss[r];
            if (d->h_row_mask[r]) {
                st->count[k] += 1.0;
                st->correct[k] += d->h_row_correct[r];
            }
        }
    }
    return 0;
}

/* ------------------------------------------------------------------- FLOPs */

double drafter_step_flops(const drafter_config_t *c, int T, int n_blocks, double sum_ctx_len) {
    const double D = c->D, Q = (double)c->H * c->hd, KV = (double)c->Hkv * c->hd, F = c->F;
    const double B = c->B, R = (double)n_blocks * B, L = c->n_layers;
    /* forward multiply-adds per block row and layer: q, k, v, o, gate, up, down */
    double row_layer = D * Q + 2 * D * KV + Q * D + 3 * D * F;
    /* attention per layer: QK^T and PV over every visible key, all heads */
    double attn_layer = 2.0 * c->H * c->hd * B * (sum_ctx_len + (double)n_blocks * B);
    double ctx_layer = (double)T * 2 * D * KV; /* context k/v projections */
    double trained = L * (R * row_layer + attn_layer + ctx_layer);
    double fc = (double)T * c->n_feat * D * D;
    double head = (double)n_blocks * (B - 1) * D * c->V; /* loss rows only */
    return 2.0 * (3.0 * trained + 2.0 * fc + 2.0 * head);
}

/* ------------------------------------------------------------------ anchors */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int drafter_passes(int n_blocks, int max_blocks) {
    if (n_blocks <= 0 || max_blocks < 1) return 0;
    return (int)(((int64_t)n_blocks + max_blocks - 1) / max_blocks);
}

void drafter_stats_add(drafter_stats_t *acc, const drafter_stats_t *add) {
    acc->loss_sum += add->loss_sum;
    acc->weight_sum += add->weight_sum;
    for (int k = 0; k < DRAFTER_MAX_BLOCK; k++) {
        acc->correct[k] += add->correct[k];
        acc->count[k] += add->count[k];
    }
}

int drafter_sample_anchors(const int32_t *cu, int nseq, const uint8_t *mask, int B,
                           int max_per_seq, rng_t *rng, int32_t *anchors, int cap) {
    int n = 0;
    int maxlen = 0;
    for (int s = 0; s < nseq; s++)
        if (cu[s + 1] - cu[s] > maxlen) maxlen = cu[s + 1] - cu[s];
    int32_t *cand = malloc((size_t)(maxlen > 0 ? maxlen : 1) * sizeof(int32_t));
    if (!cand) return dl_seterr(DL_ENOMEM, "drafter_sample_anchors: %d candidates", maxlen);
    for (int s = 0; s < nseq; s++) {
        int s0 = cu[s], len = cu[s + 1] - cu[s], nc = 0;
        /* run[t]: assistant tokens in a row starting at t, computed backwards */
        int run = 0;
        for (int a = len - 1; a >= 1; a--) {
            /* run = consecutive mask-1 tokens starting at a+1 */
            if (a + 1 < len) run = mask[s0 + a + 1] ? run + 1 : 0;
            if (run >= B - 1) cand[nc++] = a;
        }
        if (nc == 0)
            for (int a = len - 2; a >= 1; a--)
                if (mask[s0 + a + 1]) cand[nc++] = a;
        int take = nc < max_per_seq ? nc : max_per_seq;
        if (n + take > cap) {
            free(cand);
            return dl_seterr(DL_ERANGE, "drafter_sample_anchors: more than %d anchors (raise "
                             "max_blocks or lower --num-anchors)", cap);
        }
        /* the candidate list was built from the end: reverse it so the draw does
         * not depend on the scan direction, then partial Fisher-Yates */
        for (int i = 0; i < nc / 2; i++) {
            int32_t t = cand[i]; cand[i] = cand[nc - 1 - i]; cand[nc - 1 - i] = t;
        }
        for (int i = 0; i < take; i++) {
            int k = i + (int)rng_below(rng, (uint64_t)(nc - i));
            int32_t t = cand[i]; cand[i] = cand[k]; cand[k] = t;
            anchors[n + i] = s0 + cand[i];
        }
        qsort(anchors + n, (size_t)take, sizeof(int32_t), cmp_i32);
        n += take;
    }
    free(cand);
    return n;
}
