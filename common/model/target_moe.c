/* The sparse MoE block of a Qwen3-MoE target layer: GGUF stacked expert loading (the
 * safetensors layouts load in target.c through target_stage.h) and the grouped forward.
 * See target_moe.h. */
#include "common/model/target_moe.h"

#include "common/base/err.h"
#ifdef DL_CUDA
#include "common/ops/cuda/ops_cuda.h"
#endif

#include <stdlib.h>
#include <string.h>

int target_moe__load_gguf_stacked(const ops_ctx_t *c, gguf_t *g, const char *path, const char *name,
                                  int E, int rows, int cols, void **dst, size_t *bytes) {
    *dst = NULL;
    size_t n = (size_t)E * rows * cols;
    const gguf_tensor_t *gt = gguf_find_tensor(g, name);
    if (!gt) return 0;
    if (gt->n_dims != 3 || gt->ne[0] != (uint64_t)cols || gt->ne[1] != (uint64_t)rows ||
        gt->ne[2] != (uint64_t)E)
        return dl_seterr(DL_EFORMAT, "%s: tensor '%s': ggml shape [%llu, %llu, %llu] (%u dims), "
                         "expected [%d, %d, %d]", path, name, (unsigned long long)gt->ne[0],
                         (unsigned long long)gt->ne[1], (unsigned long long)gt->ne[2],
                         gt->n_dims, cols, rows, E);
    float *tmp = malloc(n * sizeof *tmp);
    if (!tmp) return dl_seterr(DL_ENOMEM, "%s: tensor '%s': no host memory for %zu elements", path, name, n);
    int rc = gguf_dequantize(gt, tmp);
    if (rc < 0) {
        free(tmp);
        return dl_wraperr(rc, "%s", path);
    }
    size_t b = n * ops_act_bytes(c);
    *dst = c->impl->malloc_(c, b);
    if (!*dst) {
        free(tmp);
        return dl_seterr(DL_ENOMEM, "%s: tensor '%s': cannot allocate %zu bytes on the %s backend", path,
                         name, b, c->impl->name);
    }
    c->impl->upload_act(c, *dst, tmp, n);
    free(tmp);
    *bytes += b;
    return 1;
}

void target_moe__point_stacked(target_moe_t *y, int E, int Fm, int D, size_t ab, int fused) {
    size_t mat = (size_t)Fm * D * ab;   /* bytes of one (Fm, D) or (D, Fm) matrix */
    for (int e = 0; e < E; e++) {
        if (fused) {
            y->wg[e] = (char *)y->stack[0] + 2 * mat * e;
            y->wu[e] = (char *)y->wg[e] + mat;
        } else {
            y->wg[e] = (char *)y->stack[0] + mat * e;
            y->wu[e] = (char *)y->stack[1] + mat * e;
        }
        y->wd[e] = (char *)y->stack[2] + mat * e;
    }
}

int target_moe__alloc(target_moe_t *y, int E) {
    y->wg = calloc((size_t)E, sizeof *y->wg);
    y->wu = calloc((size_t)E, sizeof *y->wu);
    y->wd = calloc((size_t)E, sizeof *y->wd);
    if (!y->wg || !y->wu || !y->wd) return dl_seterr(DL_ENOMEM, "target: out of memory (experts)");
    return 0;
}

void target_moe__free(const ops_ctx_t *c, target_moe_t *y) {
    if (y->router) c->impl->free_(c, y->router);
    for (int i = 0; i < 3; i++)
        if (y->stack[i]) c->impl->free_(c, y->stack[i]);
    free(y->wg);
    free(y->wu);
    free(y->wd);
    memset(y, 0, sizeof *y);
}

int target_moe__scratch_new(const ops_ctx_t *c, const model_config_t *m, int chunk,
                            target_moe_scratch_t *s) {
    memset(s, 0, sizeof *s);
    size_t R = (size_t)chunk * m->top_k, E = (size_t)m->n_experts;
    struct { void **p; size_t bytes; } a[] = {
        {&s->rlog, (size_t)chunk * E * ops_act_bytes(c)}, {(void **)&s->idx, R * 4},
        {(void **)&s->off, (E + 1) * 4}, {(void **)&s->tok, R * 4}, {(void **)&s->inv, R * 4},
        {(void **)&s->w, R * 4}, {&s->xs, R * m->D * ops_act_bytes(c)},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        if (!(*a[i].p = c->impl->malloc_(c, a[i].bytes)))
            return dl_seterr(DL_ENOMEM, "target: cannot allocate %zu bytes of MoE activations on the "
                             "%s backend (lower --token-budget)", a[i].bytes, c->impl->name);
    if (!(s->off_h = malloc((E + 1) * 4))) return dl_seterr(DL_ENOMEM, "target: out of memory");
    return 0;
}

void target_moe__scratch_free(const ops_ctx_t *c, target_moe_scratch_t *s) {
    void *ps[] = {s->rlog, s->idx, s->off, s->tok, s->inv, s->w, s->xs};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        if (ps[i]) c->impl->free_(c, ps[i]);
    free(s->off_h);
    free(s->counts_h);
    memset(s, 0, sizeof *s);
}

/* out rows [off[e], off[e+1]) (N) = x rows (K) . w[e] (N, K)^T for every expert e; no
 * padding: an expert sees only its rows. On CUDA one call (row-bucketed plans). */
static void expert_gemms(const ops_ctx_t *c, void *out, const void *x, void *const *w,
                         const int32_t *off, int E, int K, int N) {
#ifdef DL_CUDA
    if (c->backend == OPS_CUDA) {
        ops_cuda_moe_gemm(c, out, x, w, off, E, K, N);
        return;
    }
#endif
    size_t ab = ops_act_bytes(c);
    for (int e = 0; e < E; e++) {
        int r0 = off[e], M = off[e + 1] - r0;
        if (M == 0) continue;
        c->impl->matmul_forward(c, (char *)out + (size_t)r0 * N * ab,
                                (const char *)x + (size_t)r0 * K * ab, w[e], NULL, M, K, N);
    }
}

void target_moe__forward(const ops_ctx_t *c, const model_config_t *m, const target_moe_t *y,
                         target_moe_scratch_t *s, void *gate, void *up, void *h, void *out,
                         const void *xin, int n, int l) {
    const ops_impl_t *o = c->impl;
    int D = m->D, E = m->n_experts, k = m->top_k, Fm = m->moe_F, R = n * k;
    o->matmul_forward(c, s->rlog, xin, y->router, NULL, n, D, E);
    o->moe_route(c, s->idx, s->w, s->rlog, n, E, k, m->norm_topk);
    o->moe_permute(c, s->off, s->tok, s->inv, s->idx, n, E, k);
    o->embedding_forward(c, s->xs, s->tok, xin, R, D);   /* gather: row r = xin[tok[r]] */
    o->download(c, s->off_h, s->off, (size_t)(E + 1) * 4);
    if (s->counting)
        for (int e = 0; e < E; e++) s->counts_h[(size_t)l * E + e] += s->off_h[e + 1] - s->off_h[e];
    expert_gemms(c, gate, s->xs, y->wg, s->off_h, E, D, Fm);
    expert_gemms(c, up, s->xs, y->wu, s->off_h, E, D, Fm);
    o->swiglu_forward(c, h, gate, up, (size_t)R * Fm);
    /* the experts' outputs overwrite their own gathered rows, no longer needed */
    expert_gemms(c, s->xs, h, y->wd, s->off_h, E, Fm, D);
    o->moe_combine(c, out, s->xs, s->inv, s->w, n, k, D);
}

int target_moe_count_routes(target_t *t, int on) {
    const model_config_t *m = target_config(t);
    target_moe_scratch_t *s = target__moe_scratch(t);
    if (m->n_experts <= 0 || !s->off_h)
        return dl_seterr(DL_EINVAL, "target: routing counts asked of a dense target");
    size_t n = (size_t)m->L * m->n_experts;
    if (!on) {   /* stop adding; the counts stay readable */
        s->counting = 0;
        return 0;
    }
    if (!s->counts_h && !(s->counts_h = calloc(n, sizeof *s->counts_h)))
        return dl_seterr(DL_ENOMEM, "target: out of memory (routing counts)");
    memset(s->counts_h, 0, n * sizeof *s->counts_h);
    s->counting = 1;
    return 0;
}

const int64_t *target_moe_route_counts(target_t *t) { return target__moe_scratch(t)->counts_h; }

double target_moe_balance(const model_config_t *m, const int64_t *counts, double *ratio,
                          int *worst_layer, int64_t *routed) {
    double worst = 0;
    *worst_layer = -1;
    *routed = 0;
    for (int l = 0; l < m->L; l++) {
        if (ratio) ratio[l] = 0;
        if (!model_config_layer_moe(m, l)) continue;
        int64_t sum = 0, mx = 0;
        for (int e = 0; e < m->n_experts; e++) {
            int64_t v = counts[(size_t)l * m->n_experts + e];
            sum += v;
            if (v > mx) mx = v;
        }
        if (sum <= 0) continue;
        double r = (double)mx * m->n_experts / (double)sum;   /* max / mean */
        if (ratio) ratio[l] = r;
        if (r > worst) worst = r, *worst_layer = l;
        *routed += sum;
    }
    return worst;
}
