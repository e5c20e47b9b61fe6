/* DFlash drafter on CPU (common/model/drafter.c):
 *  - reference fixture: an independent per-block PyTorch implementation
 *    (tests/fixtures/drafter/make_fixture.py) gives logits of every block, the
 *    weighted loss and the gradient of every tensor; fp32 vs fp32 with a
 *    different summation order: logits and grads atol 2e-5 + rtol 1e-3, loss rtol 1e-5;
 *  - finite differences of loss = loss_sum / weight_sum for EVERY trainable
 *    tensor (fp32 forward, h = 1e-2, central): up to 24 sampled elements per
 *    tensor, |fd - g| <= 3e-2 max|g| + 3e-4, and the directional derivative
 *    along a random direction over the whole tensor within 2% (+3e-4);
 *  - mask: context features at or after a block's anchor, features of other
 *    sequences and tokens of other blocks leave its logits bitwise unchanged;
 *    a feature right before the anchor changes them;
 *  - overfitting: fresh tiny drafter, fixed batch, AdamW: loss < 0.05 and
 *    per-position accuracy 1 within 400 steps;
 *  - several passes over the anchors (drafter_passes, drafter_stats_add) against the
 *    same fixture: the summed gradient / weight_sum and summed stats;
 *  - anchor sampling rule and defaults (layer ids as z-lab/dflash, gamma). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/model/dflash_ckpt.h"
#include "common/model/drafter.h"
#include "common/ops/ops.h"
#include "tests/unit/test_ops_fixture.h"

static ops_ctx_t g_ctx;

typedef struct {
    cJSON *fx;
    drafter_config_t cfg;
    drafter_t *d;
    float *embed, *lm_head, *features;
    int32_t *cu, *ids, *anchors;
    uint8_t *mask;
    drafter_batch_t b;
} tiny_t;

static void tiny_config(drafter_config_t *c) {
    drafter_config_defaults(c);
    c->D = 16, c->H = 4, c->Hkv = 2, c->hd = 8, c->F = 24, c->V = 37;
    c->n_target_layers = 8, c->max_position_embeddings = 64, c->rms_eps = 1e-6f;
    c->rope.theta = 10000.0;
    c->n_layers = 2, c->n_feat = 3;
    c->target_layer_ids[0] = 1, c->target_layer_ids[1] = 3, c->target_layer_ids[2] = 5;
    c->B = 4, c->gamma = 2.0f, c->mask_token_id = 1, c->loss_chunk_blocks = 3;
}

/* Loads the fixture batch; with_weights: the fixture's parameters, else the
 * drafter's own seeded init. */
static void tiny_open(tiny_t *t, int with_weights) {
    memset(t, 0, sizeof(*t));
    t->fx = fx_load("drafter", "fixture");
    tiny_config(&t->cfg);
    t->embed = fx_f32(t->fx, "embed", NULL);
    t->lm_head = fx_f32(t->fx, "lm_head", NULL);
    t->features = fx_f32(t->fx, "features", NULL);
    t->cu = fx_i32(t->fx, "cu_seqlens", NULL);
    t->ids = fx_i32(t->fx, "ids", NULL);
    size_t na, nt;
    t->anchors = fx_i32(t->fx, "anchors", &na);
    int32_t *m = fx_i32(t->fx, "loss_mask", &nt);
    t->mask = malloc(nt);
    for (size_t i = 0; i < nt; i++) t->mask[i] = (uint8_t)m[i];
    free(m);
    assert_int_equal(drafter_new(&g_ctx, &t->cfg, t->embed, t->lm_head, 32, 16, 7, &t->d), 0);
    if (with_weights) {
        const cJSON *params = cJSON_GetObjectItem(t->fx, "params");
        float *master = drafter_master(t->d);
        for (int i = 0; i < drafter_n_tensors(t->d); i++) {
            const drafter_tensor_t *ten = drafter_tensor(t->d, i);
            size_t n;
            float *v = fx_f32(params, ten->name, &n);
            assert_int_equal(n, ten->numel);
            memcpy(master + ten->offset, v, n * 4);
            free(v);
        }
        drafter_sync_weights(t->d);
    }
    t->b = (drafter_batch_t){.T = fx_int(t->fx, "T"), .nseq = fx_int(t->fx, "nseq"),
                             .cu_seqlens = t->cu, .ids = t->ids, .loss_mask = t->mask,
                             .pos = NULL, .features = t->features, .n_blocks = (int)na,
                             .anchors = t->anchors};
}

static void tiny_close(tiny_t *t) {
    drafter_destroy(&t->d);
    assert_null(t->d);
    free(t->embed), free(t->lm_head), free(t->features), free(t->cu), free(t->ids);
    free(t->anchors), free(t->mask);
    cJSON_Delete(t->fx);
}

static double tiny_loss(tiny_t *t) {
    drafter_stats_t st;
    assert_int_equal(drafter_forward_backward(t->d, &t->b, 1.0f, &st), 0);
    return st.loss_sum / st.weight_sum;
}

/* ------------------------------------------------------------- reference */
static void test_fixture(void **state) {
    (void)state;
    tiny_t t;
    tiny_open(&t, 1);
    drafter_zero_grad(t.d);
    drafter_stats_t st;
    assert_int_equal(drafter_forward_backward(t.d, &t.b, 0.0f, &st), 0);
    double want_loss = fx_num(t.fx, "loss_sum"), want_w = fx_num(t.fx, "weight_sum");
    fprintf(stderr, "fixture: loss %.7f (torch %.7f), weight sum %.7f (torch %.7f)\n",
            st.loss_sum / st.weight_sum, want_loss / want_w, st.weight_sum, want_w);
    assert_true(fabs(st.weight_sum - want_w) <= 1e-6 * want_w);
    assert_true(fabs(st.loss_sum - want_loss) <= 1e-5 * fabs(want_loss));
    const cJSON *cor = cJSON_GetObjectItem(t.fx, "correct"), *cnt = cJSON_GetObjectItem(t.fx, "count");
    for (int k = 0; k < t.cfg.B; k++) {
        assert_true(st.count[k] == cJSON_GetArrayItem(cnt, k)->valuedouble);
        assert_true(st.correct[k] == cJSON_GetArrayItem(cor, k)->valuedouble);
    }
    const cJSON *grads = cJSON_GetObjectItem(t.fx, "grads");
    double worst = 0;
    for (int i = 0; i < drafter_n_tensors(t.d); i++) {
        const drafter_tensor_t *ten = drafter_tensor(t.d, i);
        size_t n;
        float *want = fx_f32(grads, ten->name, &n);
        assert_int_equal(n, ten->numel);
        double e = fx_check(ten->name, drafter_grads(t.d) + ten->offset, want, n, 2e-5, 1e-3);
        worst = fmax(worst, e);
        free(want);
    }
    fprintf(stderr, "fixture: worst grad error ratio %.3g (of atol 2e-5 + rtol 1e-3)\n", worst);
    assert_true(worst <= 1.0);
    size_t nl;
    float *want = fx_f32(t.fx, "logits", &nl);
    float *got = malloc(nl * 4);
    assert_int_equal(nl, (size_t)t.b.n_blocks * t.cfg.B * t.cfg.V);
    assert_int_equal(drafter_logits(t.d, 0, t.b.n_blocks, got), 0);
    assert_true(fx_check("logits", got, want, nl, 2e-5, 1e-3) <= 1.0);
    free(got), free(want);
    tiny_close(&t);
}

/* ------------------------------------------------------- several passes */
/* A micro-batch over one pass's blocks is computed in passes (drafter_worker): each
 * pass's forward_backward accumulates its blocks' gradient sums (grad_scale 1) into
 * the same buffer and the stats are added (drafter_stats_add). Against the PyTorch
 * fixture (the whole batch at once, mean loss): the summed gradient / weight_sum and
 * the summed stats agree at the fixture's tolerance, for every pass size. */
static void test_passes(void **state) {
    (void)state;
    tiny_t t;
    tiny_open(&t, 1);
    const int na = t.b.n_blocks;
    assert_true(na >= 3);
    assert_int_equal(drafter_passes(0, 4), 0);
    assert_int_equal(drafter_passes(na, na), 1);
    assert_int_equal(drafter_passes(na, na - 1), 2);
    assert_int_equal(drafter_passes(na, 1), na);
    assert_int_equal(drafter_passes(4097, 4096), 2);
    const cJSON *grads = cJSON_GetObjectItem(t.fx, "grads");
    const int sizes[] = {1, 2, na - 1};
    for (int si = 0; si < 3; si++) {
        int cap = sizes[si], passes = drafter_passes(na, cap);
        drafter_zero_grad(t.d);
        drafter_stats_t acc = {0};
        for (int p = 0, j0 = 0; p < passes; p++) {
            drafter_batch_t b = t.b;
            b.anchors = t.anchors + j0;
            b.n_blocks = na - j0 < cap ? na - j0 : cap;
            drafter_stats_t ps;
            assert_int_equal(drafter_forward_backward(t.d, &b, 1.0f, &ps), 0);
            drafter_stats_add(&acc, &ps);
            j0 += b.n_blocks;
        }
        double want_loss = fx_num(t.fx, "loss_sum"), want_w = fx_num(t.fx, "weight_sum");
        assert_true(fabs(acc.weight_sum - want_w) <= 1e-6 * want_w);
        assert_true(fabs(acc.loss_sum - want_loss) <= 1e-5 * fabs(want_loss));
        const cJSON *cor = cJSON_GetObjectItem(t.fx, "correct"), *cnt = cJSON_GetObjectItem(t.fx, "count");
        for (int k = 0; k < t.cfg.B; k++) {
            assert_true(acc.count[k] == cJSON_GetArrayItem(cnt, k)->valuedouble);
            assert_true(acc.correct[k] == cJSON_GetArrayItem(cor, k)->valuedouble);
        }
        size_t np = drafter_n_params(t.d);
        float *g = malloc(np * 4);
        for (size_t i = 0; i < np; i++) g[i] = (float)(drafter_grads(t.d)[i] / acc.weight_sum);
        double worst = 0;
        for (int i = 0; i < drafter_n_tensors(t.d); i++) {
            const drafter_tensor_t *ten = drafter_tensor(t.d, i);
            size_t n;
            float *want = fx_f32(grads, ten->name, &n);
            worst = fmax(worst, fx_check(ten->name, g + ten->offset, want, n, 2e-5, 1e-3));
            free(want);
        }
        fprintf(stderr, "passes of %d blocks (%d passes): worst grad error ratio %.3g\n", cap, passes, worst);
        assert_true(worst <= 1.0);
        free(g);
    }
    tiny_close(&t);
}

/* An ops table without copy2d (ops.h: optional): the loss rows are gathered and scattered
 * one row copy at a time, with the same results, bitwise. */
static void test_no_copy2d(void **state) {
    (void)state;
    tiny_t t;
    tiny_open(&t, 1);
    size_t np = drafter_n_params(t.d);
    drafter_stats_t a, b;
    drafter_zero_grad(t.d);
    assert_int_equal(drafter_forward_backward(t.d, &t.b, 1.0f, &a), 0);
    float *ga = malloc(np * 4);
    memcpy(ga, drafter_grads(t.d), np * 4);
    const ops_impl_t *cpu = g_ctx.impl;
    static ops_impl_t bare;
    bare = *cpu;
    bare.copy2d = NULL;
    g_ctx.impl = &bare;   /* the drafter holds &g_ctx */
    drafter_zero_grad(t.d);
    assert_int_equal(drafter_forward_backward(t.d, &t.b, 1.0f, &b), 0);
    g_ctx.impl = cpu;
    assert_true(a.loss_sum > 0 && a.loss_sum == b.loss_sum && a.weight_sum == b.weight_sum);
    assert_memory_equal(a.count, b.count, sizeof a.count);
    assert_memory_equal(a.correct, b.correct, sizeof a.correct);
    assert_memory_equal(ga, drafter_grads(t.d), np * 4);
    free(ga);
    tiny_close(&t);
}

/* The drafter worker's options (keep_up, external_grads, no_master): no master copy, the
 * weights loaded in chunks through the scratch (a 16-block drafter's swiglu scratch holds
 * 64 x 24 floats: the tiny drafter's parameters take several chunks), the caller's
 * gradient buffer, the up projections kept from the forward: loss, stats, logits, working
 * weights and gradients bitwise those of a plain drafter (whose gradients test_fixture
 * checks), also after other weights are loaded over a drafter that has run a step (the
 * worker's order: load, step, load, step). */
static void test_worker_opts(void **state) {
    (void)state;
    tiny_t t;
    tiny_open(&t, 1);
    const size_t np = drafter_n_params(t.d);
    drafter_stats_t a, b;
    drafter_zero_grad(t.d);
    assert_int_equal(drafter_forward_backward(t.d, &t.b, 1.0f, &a), 0);
    drafter_new_opts_t o = {.keep_up = 1, .external_grads = 1, .no_master = 1};
    drafter_t *e = NULL;
    assert_int_equal(drafter_new_opts(&g_ctx, &t.cfg, t.embed, t.lm_head, 32, 16, 7, &o, &e), 0);
    assert_null(drafter_master(e));
    assert_null(drafter_grads(e));
    assert_true(np > (size_t)2 * 16 * t.cfg.B * t.cfg.F);   /* several chunks */
    assert_int_equal(drafter_forward_backward(e, &t.b, 1.0f, &b), DL_ESTATE);
    assert_int_equal(drafter_load_master(e, drafter_master(t.d), 1), 0);
    assert_memory_equal(drafter_weights(e), drafter_weights(t.d), np * 4);
    float *g = malloc(np * 4);
    drafter_set_grads(e, g);
    drafter_zero_grad(e);
    assert_int_equal(drafter_forward_backward(e, &t.b, 1.0f, &b), 0);
    assert_true(a.loss_sum > 0 && a.loss_sum == b.loss_sum && a.weight_sum == b.weight_sum);
    assert_memory_equal(a.count, b.count, sizeof a.count);
    assert_memory_equal(a.correct, b.correct, sizeof a.correct);
    assert_memory_equal(g, drafter_grads(t.d), np * 4);
    const size_t nl = (size_t)t.b.n_blocks * t.cfg.B * t.cfg.V;
    float *la = malloc(nl * 4), *lb = malloc(nl * 4);
    assert_int_equal(drafter_logits(t.d, 0, t.b.n_blocks, la), 0);
    assert_int_equal(drafter_logits(e, 0, t.b.n_blocks, lb), 0);
    assert_memory_equal(la, lb, nl * 4);
    /* other weights over both, then a step each: still bitwise equal, and not the first */
    float *w2 = malloc(np * 4);
    rng_t r;
    rng_seed(&r, 11);
    for (size_t i = 0; i < np; i++) w2[i] = drafter_master(t.d)[i] + 0.05f * rng_normal(&r);
    drafter_upload_master(t.d, w2);
    assert_int_equal(drafter_upload_master(e, w2), 0);
    drafter_zero_grad(t.d);
    drafter_zero_grad(e);
    assert_int_equal(drafter_forward_backward(t.d, &t.b, 1.0f, &a), 0);
    assert_int_equal(drafter_forward_backward(e, &t.b, 1.0f, &b), 0);
    assert_true(a.loss_sum == b.loss_sum && a.loss_sum != 0);
    assert_memory_equal(g, drafter_grads(t.d), np * 4);
    assert_int_equal(drafter_logits(e, 0, t.b.n_blocks, lb), 0);
    assert_memory_not_equal(la, lb, nl * 4);
    assert_int_equal(drafter_logits(t.d, 0, t.b.n_blocks, la), 0);
    assert_memory_equal(la, lb, nl * 4);
    assert_int_equal(drafter_download_master(e, w2), DL_ESTATE);
    free(la), free(lb), free(w2);
    assert_int_equal(dflash_ckpt_save(e, "/nonexistent", "F32", NULL), DL_ESTATE);
    drafter_set_grads(e, NULL);
    assert_null(drafter_grads(e));
    drafter_destroy(&e);
    free(g);
    tiny_close(&t);
}

/* ------------------------------------------------------ finite differences */
static void test_grad_fd(void **state) {
    (void)state;
    tiny_t t;
    tiny_open(&t, 1);
    drafter_zero_grad(t.d);
    drafter_stats_t st;
    assert_int_equal(drafter_forward_backward(t.d, &t.b, 0.0f, &st), 0);
    size_t np = drafter_n_params(t.d);
    float *g = malloc(np * 4);
    memcpy(g, drafter_grads(t.d), np * 4);
    float *master = drafter_master(t.d);
    const float h = 1e-2f;
    rng_t r;
    rng_seed(&r, 99);
    for (int i = 0; i < drafter_n_tensors(t.d); i++) {
        const drafter_tensor_t *ten = drafter_tensor(t.d, i);
        float *p = master + ten->offset, *gt = g + ten->offset;
        double gmax = 0;
        for (size_t e = 0; e < ten->numel; e++) gmax = fmax(gmax, fabs(gt[e]));
        assert_true(gmax > 0); /* every tensor is trained */
        double tol = 3e-2 * gmax + 3e-4;
        size_t ns = ten->numel < 24 ? ten->numel : 24;
        for (size_t s = 0; s < ns; s++) {
            size_t e = ten->numel <= 24 ? s : rng_below(&r, ten->numel);
            float x0 = p[e];
            p[e] = x0 + h;
            double fp = tiny_loss(&t);
            p[e] = x0 - h;
            double fm = tiny_loss(&t);
            p[e] = x0;
            double fd = (fp - fm) / (2.0 * h);
            if (fabs(fd - gt[e]) > tol)
                fprintf(stderr, "%s[%zu]: fd %.6g analytic %.6g (tol %.3g)\n", ten->name, e, fd,
                        gt[e], tol);
            assert_true(fabs(fd - gt[e]) <= tol);
        }
        /* directional derivative over the whole tensor */
        float *dir = malloc(ten->numel * 4), *p0 = malloc(ten->numel * 4);
        double gd = 0;
        memcpy(p0, p, ten->numel * 4);
        for (size_t e = 0; e < ten->numel; e++) {
            dir[e] = rng_normal(&r);
            gd += (double)dir[e] * gt[e];
        }
        const float hd = 3e-3f;
        for (size_t e = 0; e < ten->numel; e++) p[e] = p0[e] + hd * dir[e];
        double fp = tiny_loss(&t);
        for (size_t e = 0; e < ten->numel; e++) p[e] = p0[e] - hd * dir[e];
        double fm = tiny_loss(&t);
        memcpy(p, p0, ten->numel * 4);
        double fd = (fp - fm) / (2.0 * hd);
        if (fabs(fd - gd) > 2e-2 * fabs(gd) + 3e-4)
            fprintf(stderr, "%s: directional fd %.6g analytic %.6g\n", ten->name, fd, gd);
        assert_true(fabs(fd - gd) <= 2e-2 * fabs(gd) + 3e-4);
        free(dir), free(p0);
    }
    free(g);
    tiny_close(&t);
}

/* ------------------------------------------------------------------ mask */
static void block_logits(tiny_t *t, int j, float *out) {
    assert_int_equal(drafter_forward(t->d, &t->b), 0);
    assert_int_equal(drafter_logits(t->d, j, 1, out), 0);
}

static double maxdiff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static void test_mask(void **state) {
    (void)state;
    tiny_t t;
    tiny_open(&t, 1);
    const int B = t.cfg.B, V = t.cfg.V, nf = t.cfg.n_feat * t.cfg.D;
    size_t n = (size_t)B * V;
    float *base = malloc(n * 4), *now = malloc(n * 4);
    for (int j = 0; j < t.b.n_blocks; j++) {
        int a = t.anchors[j], s = a < t.cu[1] ? 0 : 1, s0 = t.cu[s], s1 = t.cu[s + 1];
        block_logits(&t, j, base);
        /* every context row at or after the anchor, and every row of the other sequence */
        for (int row = 0; row < t.b.T; row++) {
            if (row >= s0 && row < a) continue;
            float *f = t.features + (size_t)row * nf;
            float old = f[row % nf];
            f[row % nf] += 3.0f;
            block_logits(&t, j, now);
            f[row % nf] = old;
            if (maxdiff(now, base, n) != 0.0)
                fprintf(stderr, "block %d (anchor %d): feature row %d leaks (%g)\n", j, a, row,
                        maxdiff(now, base, n));
            assert_true(maxdiff(now, base, n) == 0.0);
        }
        /* tokens of the other blocks' anchors, and every non-anchor token */
        for (int tk = 0; tk < t.b.T; tk++) {
            if (tk == a) continue;
            int old = t.ids[tk];
            t.ids[tk] = (old + 5) % V;
            block_logits(&t, j, now);
            t.ids[tk] = old;
            assert_true(maxdiff(now, base, n) == 0.0);
        }
        /* own anchor token and the context row right before the anchor do matter */
        int old = t.ids[a];
        t.ids[a] = (old + 5) % V;
        block_logits(&t, j, now);
        t.ids[a] = old;
        assert_true(maxdiff(now, base, n) > 1e-4);
        if (a > s0) {
            float *f = t.features + (size_t)(a - 1) * nf;
            f[0] += 3.0f;
            block_logits(&t, j, now);
            f[0] -= 3.0f;
            assert_true(maxdiff(now, base, n) > 1e-4);
        }
        (void)s1;
    }
    free(base), free(now);
    tiny_close(&t);
}

/* ------------------------------------------------------------- overfitting */
static void test_overfit(void **state) {
    (void)state;
    tiny_t t;
    tiny_open(&t, 0); /* seeded init as the public code: N(0, 0.02), norms 1 */
    size_t np = drafter_n_params(t.d);
    float *m = calloc(np, 4), *v = calloc(np, 4), nsq = 0;
    drafter_stats_t st = {0};
    int step, done = 0;
    double loss = 0, acc = 0;
    for (step = 1; step <= 400 && !done; step++) {
        drafter_zero_grad(t.d);
        assert_int_equal(drafter_forward_backward(t.d, &t.b, 0.0f, &st), 0);
        loss = st.loss_sum / st.weight_sum;
        double c = 0, n = 0;
        for (int k = 1; k < t.cfg.B; k++) c += st.correct[k], n += st.count[k];
        acc = c / n;
        int all = 1;
        for (int k = 1; k < t.cfg.B; k++) all &= st.correct[k] == st.count[k];
        if (loss < 0.05 && all) { done = 1; break; }
        g_ctx.impl->sumsq(&g_ctx, &nsq, drafter_grads(t.d), np, 0);
        g_ctx.impl->adamw(&g_ctx, drafter_master(t.d), NULL, drafter_grads(t.d), m, v, np, 1e-2f,
                          0.9f, 0.95f, 1e-8f, 0.0f, step, &nsq, 1.0f);
        drafter_sync_weights(t.d);
    }
    fprintf(stderr, "overfit: step %d loss %.4f accuracy %.3f\n", step, loss, acc);
    assert_true(done);
    free(m), free(v);
    tiny_close(&t);
}

/* ------------------------------------------------------- anchors, defaults */
static void test_anchors(void **state) {
    (void)state;
    /* seq 0: 40 tokens, assistant 10..39; seq 1: 12 tokens, assistant 5..7 only
     * (no full block of B=6: falls back); seq 2: 5 tokens, no assistant token */
    int32_t cu[4] = {0, 40, 52, 57};
    uint8_t mask[57] = {0};
    for (int i = 10; i < 40; i++) mask[i] = 1;
    for (int i = 5; i < 8; i++) mask[40 + i] = 1;
    const int B = 6;
    int32_t a1[64], a2[64];
    rng_t r1, r2;
    rng_seed(&r1, rng_mix(5, 1, 2));
    rng_seed(&r2, rng_mix(5, 1, 2));
    int n1 = drafter_sample_anchors(cu, 3, mask, B, 8, &r1, a1, 64);
    int n2 = drafter_sample_anchors(cu, 3, mask, B, 8, &r2, a2, 64);
    assert_int_equal(n1, n2);
    assert_memory_equal(a1, a2, (size_t)n1 * 4);
    /* seq 0 candidates: a in [9, 34] (mask[a+1..a+5] = 1, a+5 <= 39): 26 -> 8 drawn;
     * seq 1 fallback: a with mask[a+1]: local 4, 5, 6 -> 3; seq 2: none */
    assert_int_equal(n1, 8 + 3);
    for (int i = 0; i < 8; i++) {
        assert_true(a1[i] >= 9 && a1[i] <= 34);
        if (i) assert_true(a1[i] > a1[i - 1]); /* sorted, no repeats */
    }
    assert_int_equal(a1[8], 44), assert_int_equal(a1[9], 45), assert_int_equal(a1[10], 46);
    /* all candidates when fewer than the cap; a different epoch draws differently */
    rng_seed(&r1, rng_mix(5, 2, 2));
    int n3 = drafter_sample_anchors(cu, 1, mask, B, 512, &r1, a2, 64);
    assert_int_equal(n3, 26);
    for (int i = 0; i < 26; i++) assert_int_equal(a2[i], 9 + i);
    rng_seed(&r1, rng_mix(5, 2, 2));
    n3 = drafter_sample_anchors(cu, 1, mask, B, 8, &r1, a2, 64);
    assert_int_equal(n3, 8);
    assert_true(memcmp(a1, a2, 8 * 4) != 0);
    assert_int_equal(drafter_sample_anchors(cu, 3, mask, B, 8, &r1, a2, 5), DL_ERANGE);
}

static void test_defaults(void **state) {
    (void)state;
    /* expected values from z-lab/dflash build_target_layer_ids (Python round) */
    int ids[8];
    int want36[5] = {1, 9, 17, 25, 33}, want30[5] = {1, 8, 14, 20, 27}, want24[3] = {1, 11, 21};
    assert_int_equal(drafter_default_layer_ids(36, 5, ids), 0);
    assert_memory_equal(ids, want36, sizeof want36);
    assert_int_equal(drafter_default_layer_ids(30, 5, ids), 0);
    assert_memory_equal(ids, want30, sizeof want30);
    assert_int_equal(drafter_default_layer_ids(24, 3, ids), 0);
    assert_memory_equal(ids, want24, sizeof want24);
    assert_int_equal(drafter_default_layer_ids(30, 1, ids), 0);
    assert_int_equal(ids[0], 15);
    assert_true(drafter_default_gamma(16) == 7.0f && drafter_default_gamma(10) == 5.0f &&
                drafter_default_gamma(8) == 4.0f);
    drafter_config_t c;
    tiny_config(&c);
    c.n_feat = 0, c.gamma = 0, c.n_target_layers = 30, c.n_layers = 5;
    assert_int_equal(drafter_config_finish(&c), 0);
    assert_int_equal(c.n_feat, 5);
    assert_memory_equal(c.target_layer_ids, want30, sizeof want30);
    assert_true(c.gamma == drafter_default_gamma(4));
    tiny_config(&c);
    c.mask_token_id = 37;
    assert_int_equal(drafter_config_finish(&c), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "mask-token-id"));
    tiny_config(&c);
    c.Hkv = 3;
    assert_int_equal(drafter_config_finish(&c), DL_EINVAL);
    /* FLOPs: 1 layer, D 2, H 1, Hkv 1, hd 2, F 3, V 5, 1 feature, B 2, T 4, 1 block with 3
     * context rows: per row q 4 + k,v 8 + o 4 + mlp 18 = 34 MACs, R = 2 -> 68;
     * attention 2*1*2*2*(3+2) = 40; ctx k,v 4*8 = 32; trained 140 MACs x 3;
     * fc 4*1*2*2 = 16 x 2; head over the 1 loss row (the anchor row has none) 1*2*5 = 10 x 2
     * -> 2 * (420 + 32 + 20) = 944 */
    drafter_config_t fc;
    drafter_config_defaults(&fc);
    fc.D = 2, fc.H = 1, fc.Hkv = 1, fc.hd = 2, fc.F = 3, fc.V = 5, fc.n_layers = 1;
    fc.n_feat = 1, fc.B = 2;
    assert_true(drafter_step_flops(&fc, 4, 1, 3.0) == 944.0);
    /* batch validation */
    tiny_t t;
    tiny_open(&t, 0);
    t.ids[3] = 99;
    assert_int_equal(drafter_forward(t.d, &t.b), DL_EINVAL);
    t.ids[3] = 0;
    t.anchors[0] = 20;
    assert_int_equal(drafter_forward(t.d, &t.b), DL_ERANGE);
    tiny_close(&t);
}

int main(void) {
    ops_cpu_init(&g_ctx, 2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults), cmocka_unit_test(test_anchors),
        cmocka_unit_test(test_fixture),  cmocka_unit_test(test_passes), cmocka_unit_test(test_grad_fd),
        cmocka_unit_test(test_mask),     cmocka_unit_test(test_overfit),  cmocka_unit_test(test_no_copy2d),
        cmocka_unit_test(test_worker_opts),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ops_ctx_destroy(&g_ctx);
    return rc;
}
