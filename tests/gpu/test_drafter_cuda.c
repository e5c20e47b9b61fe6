/* DFlash drafter (common/model/drafter.c) on the CUDA backend (bf16 activations and
 * working weights, fp32 master weights, grads and accumulation) held against the
 * CPU backend (fp32; itself held to an independent PyTorch implementation and to
 * finite differences by tests/unit/test_drafter.c):
 *  - the committed fixture tests/fixtures/drafter (tiny: D 16, hd 8, 2 layers, B 4,
 *    the fixture's weights): loss, weight sum, per-position accuracy, logits of every
 *    block and the gradient of every trainable tensor; the logits and loss are also
 *    held to the PyTorch fixture itself;
 *  - a medium random drafter at real head size (D 256, H 4, Hkv 2, hd 128 -> q width
 *    512, F 384, V 1000, 3 layers, B 16, 3 sequences of 80..300 tokens, 24 anchors
 *    each): same comparisons, the drafter's own seeded init; then the GPU in passes of
 *    16 blocks (drafter_worker's passes, gradient sums / weight_sum) against the CPU in
 *    one pass: loss, accuracy and gradients at the same tolerances; and with the
 *    drafter worker's options (keep_up, external gradients, no master copy) bitwise
 *    the plain GPU drafter's loss, logits and gradients.
 *
 * Metric: norm_rel = ||a - b||_2 / ||b||_2 per tensor (b = CPU). Stated bf16
 * tolerances: logits 2e-2; loss |a - b| <= 1e-2 |b|; weight sum exact (host
 * arithmetic); every gradient tensor norm_rel <= 5e-2 (bf16 activations in the
 * backward, incl. bf16 dQ/dK/dV of attention; one bf16 rounding is 2e-3; measured
 * values are printed); per-position accuracy: hit counts may differ only where
 * the CPU's top-2 logits are within bf16 noise, so at most 5% of the counted rows
 * (plus 1) per position. Measured on an H200 (2026-11-30): fixture loss rel 2.4e-3,
 * logits 1.4e-2, worst grad 3.4e-2 (layers.0.input_layernorm.weight); medium loss
 * rel 1.7e-5, logits 5.4e-3, worst grad 9.7e-3 (hidden_norm.weight); accuracy counts
 * equal. Exits 77 ("SKIP: no CUDA device") without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/model/drafter.h"
#include "common/ops/ops.h"
#include "tests/unit/test_ops_fixture.h"

#define TOL_LOGITS 2e-2
#define TOL_LOSS 1e-2
#define TOL_GRAD 5e-2

static ops_ctx_t g_cpu, g_gpu;

static double norm_rel(const float *a, const float *b, size_t n) {
    double s2 = 0, b2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        s2 += d * d;
        b2 += (double)b[i] * b[i];
    }
    if (!isfinite(s2)) return INFINITY;
    return b2 > 0 ? sqrt(s2 / b2) : sqrt(s2);
}

/* One batch on both backends. */
typedef struct {
    drafter_config_t cfg;
    float *embed, *lm_head, *features;      /* host f32 */
    int32_t *cu, *ids, *anchors;
    uint8_t *mask;
    int T, nseq, nb;
    const float *params;                    /* host f32 master to load, or NULL (own init) */
    int pass;                               /* > 0: blocks per pass (drafter_worker's passes) */
    int worker;                             /* drafter_worker's options: keep_up, external
                                               gradients, no master (weights loaded) */
} case_t;

typedef struct {
    drafter_stats_t st;
    float *grads, *logits;                  /* host f32 */
    size_t np;                              /* parameters (grads' length) */
} result_t;

static void run_case(const ops_ctx_t *c, const case_t *k, result_t *r) {
    size_t D = (size_t)k->cfg.D, V = (size_t)k->cfg.V, nf = (size_t)k->T * k->cfg.n_feat * D;
    void *embed, *lm, *feat;
    if (c->backend == OPS_CPU) {
        embed = k->embed, lm = k->lm_head, feat = k->features;
    } else {
        size_t ab = ops_act_bytes(c);
        embed = c->impl->malloc_(c, V * D * ab);
        lm = c->impl->malloc_(c, V * D * ab);
        feat = c->impl->malloc_(c, nf * ab);
        c->impl->upload_act(c, embed, k->embed, V * D);
        c->impl->upload_act(c, lm, k->lm_head, V * D);
        c->impl->upload_act(c, feat, k->features, nf);
    }
    drafter_t *d = NULL;
    int cap = k->pass > 0 ? k->pass : k->nb;
    drafter_new_opts_t o = {.keep_up = 1, .external_grads = 1, .no_master = 1};
    if (drafter_new_opts(c, &k->cfg, embed, lm, k->T, cap, 7, k->worker ? &o : NULL, &d))
        fail_msg("drafter_new: %s", dl_errmsg());
    size_t np = drafter_n_params(d);
    float *own = NULL;
    drafter_batch_t b = {.T = k->T, .nseq = k->nseq, .cu_seqlens = k->cu, .ids = k->ids,
                         .loss_mask = k->mask, .pos = NULL, .features = feat,
                         .n_blocks = k->nb, .anchors = k->anchors};
    if (k->worker) {
        /* as the worker: the weights loaded from device memory (the optimizer's slab), first
         * other ones and a step on them, then the seeded init (seed 7, as drafter_new's) */
        own = c->impl->malloc_(c, np * 4);
        drafter_set_grads(d, own);
        float *init = malloc(np * 4), *src = c->impl->malloc_(c, np * 4);
        if (k->params) memcpy(init, k->params, np * 4);
        else assert_int_equal(drafter_init_master(d, 7, init), 0);
        for (size_t i = 0; i < np; i++) init[i] += 0.01f;
        c->impl->upload(c, src, init, np * 4);
        assert_int_equal(drafter_load_master(d, src, 0), 0);
        drafter_zero_grad(d);
        drafter_stats_t st0;
        b.n_blocks = k->pass > 0 && k->pass < k->nb ? k->pass : k->nb;
        assert_int_equal(drafter_forward_backward(d, &b, 0.0f, &st0), 0);
        b.n_blocks = k->nb;
        if (k->params) memcpy(init, k->params, np * 4);
        else assert_int_equal(drafter_init_master(d, 7, init), 0);
        c->impl->upload(c, src, init, np * 4);
        assert_int_equal(drafter_load_master(d, src, 0), 0);
        c->impl->sync(c);
        c->impl->free_(c, src);
        free(init);
    } else if (k->params) {
        drafter_upload_master(d, k->params);
    }
    drafter_zero_grad(d);
    r->grads = malloc(np * 4);
    r->np = np;
    r->logits = NULL;
    if (k->pass > 0) {
        /* as drafter_worker: passes of at most `pass` blocks, gradient sums (grad_scale 1)
         * accumulating, stats added; then / weight_sum as the one-pass mean loss */
        memset(&r->st, 0, sizeof r->st);
        for (int j0 = 0; j0 < k->nb; j0 += cap) {
            b.anchors = k->anchors + j0;
            b.n_blocks = k->nb - j0 < cap ? k->nb - j0 : cap;
            drafter_stats_t ps;
            assert_int_equal(drafter_forward_backward(d, &b, 1.0f, &ps), 0);
            drafter_stats_add(&r->st, &ps);
        }
        c->impl->download(c, r->grads, drafter_grads(d), np * 4);
        for (size_t i = 0; i < np; i++) r->grads[i] = (float)(r->grads[i] / r->st.weight_sum);
    } else {
        assert_int_equal(drafter_forward_backward(d, &b, 0.0f, &r->st), 0);
        c->impl->download(c, r->grads, drafter_grads(d), np * 4);
        r->logits = malloc((size_t)k->nb * k->cfg.B * V * 4);
        assert_int_equal(drafter_logits(d, 0, k->nb, r->logits), 0);
    }
    c->impl->sync(c);
    if (c->backend != OPS_CPU) {
        c->impl->free_(c, embed);
        c->impl->free_(c, lm);
        c->impl->free_(c, feat);
    }
    drafter_destroy(&d);
    if (own) c->impl->free_(c, own);
}

/* Compares GPU vs CPU; tensors names from a drafter built on the CPU. */
static void compare(const char *tag, const case_t *k, const result_t *rc, const result_t *rg) {
    drafter_config_t cfg = k->cfg;
    assert_int_equal(drafter_config_finish(&cfg), 0);
    const drafter_stats_t *a = &rg->st, *b = &rc->st;
    double la = a->loss_sum / a->weight_sum, lb = b->loss_sum / b->weight_sum;
    printf("  %-7s loss cuda %.6f cpu %.6f (rel %.2e); weight sum %.6f / %.6f\n", tag, la, lb,
           fabs(la - lb) / fabs(lb), a->weight_sum, b->weight_sum);
    assert_true(a->weight_sum == b->weight_sum);
    assert_true(fabs(la - lb) <= TOL_LOSS * fabs(lb));
    for (int j = 1; j < cfg.B; j++) {
        assert_true(a->count[j] == b->count[j]);
        double diff = fabs(a->correct[j] - b->correct[j]);
        if (diff > 0) printf("  %-7s position %d: %g vs %g hits of %g\n", tag, j, a->correct[j], b->correct[j], b->count[j]);
        assert_true(diff <= 0.05 * b->count[j] + 1);
    }
    if (rg->logits && rc->logits) {   /* passes: the last forward holds only its own blocks */
        size_t nl = (size_t)k->nb * cfg.B * cfg.V;
        double el = norm_rel(rg->logits, rc->logits, nl);
        printf("  %-7s logits norm_rel %.2e\n", tag, el);
        assert_true(el <= TOL_LOGITS);
    }
    /* per-tensor grads: rebuild the tensor table on the CPU (same layout on both) */
    float *e = calloc((size_t)cfg.V * cfg.D, 4);
    drafter_t *d = NULL;
    assert_int_equal(drafter_new(&g_cpu, &cfg, e, e, 1, 1, 1, &d), 0);
    double worst = 0;
    const char *wname = "";
    for (int i = 0; i < drafter_n_tensors(d); i++) {
        const drafter_tensor_t *t = drafter_tensor(d, i);
        double er = norm_rel(rg->grads + t->offset, rc->grads + t->offset, t->numel);
        if (!(er <= worst)) worst = er, wname = t->name;
        if (!(er <= TOL_GRAD)) fail_msg("%s grad %s: norm_rel %.3e > %.0e", tag, t->name, er, TOL_GRAD);
    }
    printf("  %-7s worst grad norm_rel %.2e (%s), %d tensors\n", tag, worst, wname, drafter_n_tensors(d));
    drafter_destroy(&d);
    free(e);
}

static void test_fixture(void **s) {
    (void)s;
    cJSON *fx = fx_load("drafter", "fixture");
    case_t k = {0};
    drafter_config_defaults(&k.cfg);
    drafter_config_t *c = &k.cfg;
    c->D = 16, c->H = 4, c->Hkv = 2, c->hd = 8, c->F = 24, c->V = 37;
    c->n_target_layers = 8, c->max_position_embeddings = 64, c->rms_eps = 1e-6f;
    c->rope.theta = 10000.0;
    c->n_layers = 2, c->n_feat = 3;
    c->target_layer_ids[0] = 1, c->target_layer_ids[1] = 3, c->target_layer_ids[2] = 5;
    c->B = 4, c->gamma = 2.0f, c->mask_token_id = 1, c->loss_chunk_blocks = 3;
    k.embed = fx_f32(fx, "embed", NULL);
    k.lm_head = fx_f32(fx, "lm_head", NULL);
    k.features = fx_f32(fx, "features", NULL);
    k.cu = fx_i32(fx, "cu_seqlens", NULL);
    k.ids = fx_i32(fx, "ids", NULL);
    size_t na, nt;
    k.anchors = fx_i32(fx, "anchors", &na);
    int32_t *m = fx_i32(fx, "loss_mask", &nt);
    k.mask = malloc(nt);
    for (size_t i = 0; i < nt; i++) k.mask[i] = (uint8_t)m[i];
    free(m);
    k.T = fx_int(fx, "T"), k.nseq = fx_int(fx, "nseq"), k.nb = (int)na;
    /* the fixture's parameters in the drafter's flat order */
    float *e = calloc((size_t)c->V * c->D, 4);
    drafter_t *d = NULL;
    assert_int_equal(drafter_new(&g_cpu, c, e, e, 1, 1, 1, &d), 0);
    float *params = malloc(drafter_n_params(d) * 4);
    const cJSON *pj = cJSON_GetObjectItem(fx, "params");
    for (int i = 0; i < drafter_n_tensors(d); i++) {
        const drafter_tensor_t *t = drafter_tensor(d, i);
        size_t n;
        float *v = fx_f32(pj, t->name, &n);
        assert_int_equal(n, t->numel);
        memcpy(params + t->offset, v, n * 4);
        free(v);
    }
    drafter_destroy(&d);
    free(e);
    k.params = params;
    result_t rc, rg;
    run_case(&g_cpu, &k, &rc);
    run_case(&g_gpu, &k, &rg);
    compare("fixture", &k, &rc, &rg);
    /* and the PyTorch fixture itself */
    size_t nl;
    float *want = fx_f32(fx, "logits", &nl);
    assert_int_equal(nl, (size_t)k.nb * c->B * c->V);
    double el = norm_rel(rg.logits, want, nl);
    double lw = fx_num(fx, "loss_sum") / fx_num(fx, "weight_sum");
    double lg = rg.st.loss_sum / rg.st.weight_sum;
    printf("  fixture vs torch: logits norm_rel %.2e, loss %.6f vs %.6f\n", el, lg, lw);
    assert_true(el <= TOL_LOGITS);
    assert_true(fabs(lg - lw) <= TOL_LOSS * fabs(lw));
    free(want);
    free(rc.grads), free(rc.logits), free(rg.grads), free(rg.logits);
    free(params), free(k.embed), free(k.lm_head), free(k.features), free(k.cu), free(k.ids);
    free(k.anchors), free(k.mask);
    cJSON_Delete(fx);
}

static void test_medium_random(void **s) {
    (void)s;
    case_t k = {0};
    drafter_config_defaults(&k.cfg);
    drafter_config_t *c = &k.cfg;
    c->D = 256, c->H = 4, c->Hkv = 2, c->hd = 128, c->F = 384, c->V = 1000;
    c->n_target_layers = 12, c->max_position_embeddings = 4096, c->rms_eps = 1e-6f;
    c->rope.theta = 1e6;
    c->n_layers = 3;  /* n_feat defaults to 3 */
    c->mask_token_id = 999, c->loss_chunk_blocks = 5;
    assert_int_equal(drafter_config_finish(c), 0); /* n_feat 3, default layer ids */
    rng_t r;
    rng_seed(&r, 20261130);
    int lens[3] = {300, 80, 211};
    k.nseq = 3;
    k.cu = malloc(4 * sizeof(int32_t));
    k.cu[0] = 0;
    for (int i = 0; i < 3; i++) k.cu[i + 1] = k.cu[i] + lens[i];
    k.T = k.cu[3];
    k.ids = malloc((size_t)k.T * 4);
    k.mask = malloc((size_t)k.T);
    for (int t = 0; t < k.T; t++) {
        k.ids[t] = (int32_t)rng_below(&r, 998);
        k.mask[t] = (t % 97) > 10; /* some user spans */
    }
    size_t D = 256, V = 1000, nf = (size_t)k.T * 3 * D;
    k.embed = malloc(V * D * 4), k.lm_head = malloc(V * D * 4), k.features = malloc(nf * 4);
    for (size_t i = 0; i < V * D; i++) k.embed[i] = rng_normal(&r) * 0.5f, k.lm_head[i] = rng_normal(&r) * 0.05f;
    for (size_t i = 0; i < nf; i++) k.features[i] = rng_normal(&r);
    k.anchors = malloc(128 * 4);
    rng_t ra;
    rng_seed(&ra, 5);
    k.nb = drafter_sample_anchors(k.cu, 3, k.mask, 16, 24, &ra, k.anchors, 128);
    assert_true(k.nb > 30);
    result_t rc, rg;
    run_case(&g_cpu, &k, &rc);
    run_case(&g_gpu, &k, &rg);
    compare("medium", &k, &rc, &rg);
    /* drafter_worker's options (keep_up, external gradients, no master copy: weights loaded
     * through the scratch): bitwise the plain drafter's loss, logits and gradients */
    result_t rw;
    k.worker = 1;
    run_case(&g_gpu, &k, &rw);
    k.worker = 0;
    assert_true(rw.st.loss_sum == rg.st.loss_sum && rw.st.weight_sum == rg.st.weight_sum);
    assert_memory_equal(rw.st.correct, rg.st.correct, sizeof rw.st.correct);
    assert_memory_equal(rw.logits, rg.logits, (size_t)k.nb * k.cfg.B * k.cfg.V * 4);
    assert_memory_equal(rw.grads, rg.grads, rg.np * 4);
    free(rw.grads), free(rw.logits);
    free(rg.grads), free(rg.logits);
    /* the same batch on the GPU in passes of 16 blocks (drafter_worker past its 4,096-block
     * pass) against the CPU in one: the same tolerances */
    k.pass = 16;
    run_case(&g_gpu, &k, &rg);
    compare("passes", &k, &rc, &rg);
    /* and the worker's options in those passes: bitwise the plain passes */
    k.worker = 1;
    run_case(&g_gpu, &k, &rw);
    k.worker = 0;
    assert_true(rw.st.loss_sum == rg.st.loss_sum && rw.st.weight_sum == rg.st.weight_sum);
    assert_memory_equal(rw.grads, rg.grads, rg.np * 4);
    free(rw.grads), free(rw.logits);
    free(rc.grads), free(rc.logits), free(rg.grads), free(rg.logits);
    free(k.embed), free(k.lm_head), free(k.features), free(k.cu), free(k.ids), free(k.anchors), free(k.mask);
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    ops_cpu_init(&g_cpu, 0);
    if (ops_cuda_init(&g_gpu, 0) != 0) {
        printf("SKIP: no CUDA device (ops_cuda_init failed)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture),
        cmocka_unit_test(test_medium_random),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ops_ctx_destroy(&g_gpu);
    ops_ctx_destroy(&g_cpu);
    return rc;
}
