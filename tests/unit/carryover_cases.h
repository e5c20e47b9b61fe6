/* Carry-over checks shared by tests/unit/test_carryover.c (CPU backend) and
 * tests/gpu/test_carryover_cuda.c (CUDA backend): state left behind by one call must
 * not change the next one.
 *
 * A pipeline worker computes micro-batches of different sizes one after the other
 * on one drafter (drafter_worker) or one target (target_worker); every buffer is
 * sized for the largest batch at creation. A kernel reading past the current T / R
 * rows, a gradient or accumulator not reset, an ASSIGNED op that accumulates, stale
 * context K/V, loss / correct rows or index arrays (cu_seqlens, anchors, ctx_start)
 * of the previous batch would make the second batch's result depend on the first.
 *
 * Drafter (shapes of the pipeline test's tiny target: D 64, H 4, Hkv 2, hd 16, F 128,
 * B 4): batch A (T 300, 4 sequences, up to 32 blocks; by default the drafter's full
 * capacity) and batch B (T 110, 3 sequences of other lengths, other anchors, at most
 * 9 blocks, with chunk 3 a last logits chunk of fewer rows: 9 x 3 loss rows in chunks of
 * 12). Drafter 1 (seed 7) runs B, then A, then B
 * again (zero_grad before each, grad_scale 1 as drafter_worker); drafter 2 (seed 7,
 * fresh; on CUDA on a second ops context: its own cuBLASLt plan cache and scratch)
 * runs only B. Asserted BITWISE equal: B's loss sum, weight sum, per-position hit
 * counts and row counts, the whole gradient vector and B's logits, for
 *   (1) B on drafter 1 (first call) vs B on drafter 2: run-to-run determinism;
 *   (2) B on drafter 1 after A vs B on drafter 2: no carry-over.
 * A failure of (1) alone means a nondeterministic kernel, of (2) alone carry-over.
 *
 * Target: two models (the pipeline tests' tiny Llama from tests/support/
 * pipeline_fixture, tied, V 49152; the Qwen3 parity fixture tests/fixtures/target/
 * qwen3_untied: q/k norms, untied head), capture layers {0, 2}. Target 1 runs B
 * (features only, the worker's call: layers after the last captured one skipped),
 * then A (features and final hidden), then B features only, then B features and
 * hidden; target 2 (fresh; second context on CUDA) runs B features and hidden.
 * Asserted BITWISE equal (raw backend bytes, bf16 on CUDA): B's (T_B, 2D) features
 * and (T_B, D) hidden across all of them.
 *
 * Bitwise equality on CUDA rests on every kernel on these paths being run-to-run
 * deterministic for the same shapes on the same device: our kernels use no float
 * atomics on these shapes (attention_block backward is key-major by design;
 * rmsnorm backward's fast path sums per-team partials in a fixed order; xent is one
 * block per row) and cuBLASLt returns the same bits for the same plan (one cached
 * heuristic choice per shape and alignment; should the heuristic ever pick a split-K
 * algorithm that reduces with atomics, check (1) fails and says so). The one
 * float-atomic path of our kernels is
 * rmsnorm_bwd_kernel's shared-memory atomicAdd for dweight, taken only for odd or
 * unaligned C or C/2 > 4096: not reached here (C = 64 and hd = 16).
 *
 * Include after cmocka.h. The including file provides nothing else. */
#ifndef DL_TESTS_UNIT_CARRYOVER_CASES_H
#define DL_TESTS_UNIT_CARRYOVER_CASES_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/model/config.h"
#include "common/model/drafter.h"
#include "common/model/target.h"
#include "common/ops/ops.h"
#include "tests/support/pipeline_fixture.h"

#define CO_MAX_SEQ 8

/* One packed batch: host arrays, and the features on the backend (drafter). */
typedef struct {
    int T, nseq, nb;
    int32_t cu[CO_MAX_SEQ + 1];
    int32_t *ids, *anchors;
    uint8_t *mask;
    void *feat;              /* (T, n_feat*D) act on the backend, or NULL */
} co_batch_t;

/* Drafter shapes of one case: vocabulary, layers, captured target layers (their ids
 * spread over the target's 4), the logits chunk (loss_chunk_blocks: this x B loss rows), and the capacity the drafter
 * is created with (0: batch A's T and blocks, i.e. A fills every buffer). */
typedef struct {
    int V, n_layers, n_feat, chunk, cap_T, cap_blocks;
} co_dopts_t;

static void co_drafter_config(drafter_config_t *c, const co_dopts_t *o) {
    drafter_config_defaults(c);
    /* the pipeline test's tiny target shapes (D 64, H 4, Hkv 2, hd 16, F 128) */
    c->D = 64, c->H = 4, c->Hkv = 2, c->hd = 16, c->F = 128, c->V = o->V;
    c->n_target_layers = 4, c->max_position_embeddings = 2048, c->rms_eps = 1e-5f;
    c->rope.theta = 10000.0;
    c->n_layers = o->n_layers, c->n_feat = o->n_feat;
    static const int ids3[3] = {0, 1, 3};
    for (int i = 0; i < o->n_feat; i++) c->target_layer_ids[i] = o->n_feat == 1 ? 2 : ids3[i];
    c->B = 4, c->gamma = 0.0f, c->mask_token_id = 1, c->loss_chunk_blocks = o->chunk;
    assert_int_equal(drafter_config_finish(c), 0);
}

/* Random ids in [2, V); loss mask 0 over the first 30% of each sequence ("prompt")
 * and on every 7th token after it (partial blocks); anchors per_seq per sequence
 * (drafter_sample_anchors, seeded); features N(0, 1) uploaded when row > 0. */
static void co_make_batch(const ops_ctx_t *c, co_batch_t *b, const int *lens, int nseq, int V,
                          int B, int per_seq, size_t row, uint64_t seed) {
    memset(b, 0, sizeof *b);
    assert_true(nseq <= CO_MAX_SEQ);
    b->nseq = nseq;
    for (int s = 0; s < nseq; s++) b->cu[s + 1] = b->cu[s] + lens[s];
    b->T = b->cu[nseq];
    rng_t r;
    rng_seed(&r, seed);
    b->ids = malloc((size_t)b->T * 4);
    b->mask = malloc((size_t)b->T);
    b->anchors = malloc((size_t)b->T * 4);
    assert_non_null(b->ids);
    assert_non_null(b->mask);
    assert_non_null(b->anchors);
    for (int s = 0; s < nseq; s++)
        for (int t = b->cu[s]; t < b->cu[s + 1]; t++) {
            int i = t - b->cu[s];
            b->ids[t] = 2 + (int32_t)rng_below(&r, (uint64_t)(V - 2));
            b->mask[t] = i * 10 >= lens[s] * 3 && i % 7 != 6;
        }
    if (B > 0) {
        rng_t ra;
        rng_seed(&ra, rng_mix(seed, 1, 2));
        b->nb = drafter_sample_anchors(b->cu, nseq, b->mask, B, per_seq, &ra, b->anchors, b->T);
        assert_true(b->nb > 0);
    }
    if (row) {
        size_t n = (size_t)b->T * row;
        float *f = malloc(n * 4);
        assert_non_null(f);
        for (size_t i = 0; i < n; i++) f[i] = rng_normal(&r);
        b->feat = c->impl->malloc_(c, n * ops_act_bytes(c));
        assert_non_null(b->feat);
        c->impl->upload_act(c, b->feat, f, n);
        free(f);
    }
}

static void co_free_batch(const ops_ctx_t *c, co_batch_t *b) {
    if (b->feat) c->impl->free_(c, b->feat);
    free(b->ids), free(b->mask), free(b->anchors);
    memset(b, 0, sizeof *b);
}

/* Index of the first differing byte-wise element (elements of esz bytes), or -1. */
static long co_first_diff(const void *a, const void *b, size_t n, size_t esz) {
    if (!memcmp(a, b, n * esz)) return -1;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * esz, (const char *)b + i * esz, esz)) return (long)i;
    return -1;
}

/* Fails, naming what, the first differing element and the largest difference, unless
 * the f32 arrays a and b are bitwise equal. */
static void co_same_f32(const char *what, const float *a, const float *b, size_t n) {
    long i = co_first_diff(a, b, n, 4);
    if (i < 0) return;
    double md = 0;
    size_t nd = 0;
    for (size_t k = 0; k < n; k++)
        if (memcmp(&a[k], &b[k], 4)) {
            nd++;
            double d = fabs((double)a[k] - b[k]);
            if (!(d <= md)) md = d;
        }
    fail_msg("%s: %zu of %zu values differ; first at %ld: %.9g vs %.9g; max |diff| %.3g", what,
             nd, n, i, a[i], b[i], md);
}

/* ---------------------------------------------------------------- drafter */

typedef struct {
    drafter_stats_t st;
    float *grad, *logits;
} co_fb_t;

/* zero_grad, forward_backward (grad_scale 1, as drafter_worker), then the
 * gradient vector and every block's logits to the host. */
static void co_fb(drafter_t *d, const ops_ctx_t *c, const co_batch_t *b, co_fb_t *r) {
    const drafter_config_t *cfg = drafter_config(d);
    drafter_batch_t db = {.T = b->T, .nseq = b->nseq, .cu_seqlens = b->cu, .ids = b->ids,
                          .loss_mask = b->mask, .pos = NULL, .features = b->feat,
                          .n_blocks = b->nb, .anchors = b->anchors};
    drafter_zero_grad(d);
    memset(&r->st, 0, sizeof r->st);
    if (drafter_forward_backward(d, &db, 1.0f, &r->st)) fail_msg("forward_backward: %s", dl_errmsg());
    size_t np = drafter_n_params(d);
    r->grad = malloc(np * 4);
    r->logits = malloc((size_t)b->nb * cfg->B * cfg->V * 4);
    assert_non_null(r->grad);
    assert_non_null(r->logits);
    c->impl->download(c, r->grad, drafter_grads(d), np * 4);
    assert_int_equal(drafter_logits(d, 0, b->nb, r->logits), 0);
    c->impl->sync(c);
}

static void co_fb_free(co_fb_t *r) {
    free(r->grad), free(r->logits);
    memset(r, 0, sizeof *r);
}

static void co_fb_same(const char *what, const co_fb_t *a, const co_fb_t *b, size_t np,
                       size_t nlogits, int B) {
    char w[200];
    printf("  %-40s loss %.9g / %.9g, weight %.9g / %.9g\n", what, a->st.loss_sum,
           b->st.loss_sum, a->st.weight_sum, b->st.weight_sum);
    if (memcmp(&a->st.loss_sum, &b->st.loss_sum, sizeof(double)))
        fail_msg("%s: loss_sum %.17g vs %.17g", what, a->st.loss_sum, b->st.loss_sum);
    if (memcmp(&a->st.weight_sum, &b->st.weight_sum, sizeof(double)))
        fail_msg("%s: weight_sum %.17g vs %.17g", what, a->st.weight_sum, b->st.weight_sum);
    for (int k = 0; k < B; k++) {
        if (a->st.count[k] != b->st.count[k] || a->st.correct[k] != b->st.correct[k])
            fail_msg("%s: position %d: %g/%g hits vs %g/%g", what, k, a->st.correct[k],
                     a->st.count[k], b->st.correct[k], b->st.count[k]);
    }
    snprintf(w, sizeof w, "%s: gradient", what);
    co_same_f32(w, a->grad, b->grad, np);
    snprintf(w, sizeof w, "%s: logits", what);
    co_same_f32(w, a->logits, b->logits, nlogits);
}

/* The drafter case (see the file comment) with shapes o. c runs drafter 1,
 * c_fresh drafter 2 (the same context on CPU). */
static void co_drafter_case(const ops_ctx_t *c, const ops_ctx_t *c_fresh, const co_dopts_t *o) {
    drafter_config_t cfg;
    co_drafter_config(&cfg, o);
    size_t D = (size_t)cfg.D, V = (size_t)cfg.V, row = (size_t)cfg.n_feat * D;
    /* frozen embedding and LM head, N(0, 0.05^2) as the tiny target's */
    rng_t r;
    rng_seed(&r, 99);
    float *e = malloc(V * D * 4), *h = malloc(V * D * 4);
    assert_non_null(e);
    assert_non_null(h);
    for (size_t i = 0; i < V * D; i++) e[i] = 0.05f * rng_normal(&r);
    for (size_t i = 0; i < V * D; i++) h[i] = 0.05f * rng_normal(&r);
    void *embed = c->impl->malloc_(c, V * D * ops_act_bytes(c));
    void *lm = c->impl->malloc_(c, V * D * ops_act_bytes(c));
    assert_non_null(embed);
    assert_non_null(lm);
    c->impl->upload_act(c, embed, e, V * D);
    c->impl->upload_act(c, lm, h, V * D);
    free(e), free(h);

    const int lens_a[] = {120, 90, 60, 30}, lens_b[] = {50, 37, 23};
    co_batch_t A, Bb;
    co_make_batch(c, &A, lens_a, 4, cfg.V, cfg.B, 8, row, 11);
    co_make_batch(c, &Bb, lens_b, 3, cfg.V, cfg.B, 3, row, 12);
    int cap_T = o->cap_T > 0 ? o->cap_T : A.T, cap_nb = o->cap_blocks > 0 ? o->cap_blocks : A.nb;
    printf("  V %d, %d layers, %d features, chunk %d, capacity %d tokens / %d blocks; batch A: "
           "T %d, %d sequences, %d blocks; batch B: T %d, %d sequences, %d blocks\n", cfg.V,
           cfg.n_layers, cfg.n_feat, cfg.loss_chunk_blocks, cap_T, cap_nb, A.T, A.nseq, A.nb,
           Bb.T, Bb.nseq, Bb.nb);
    assert_true(Bb.nb < A.nb && Bb.T < A.T && A.T <= cap_T && A.nb <= cap_nb);

    drafter_t *d1 = NULL, *d2 = NULL;
    if (drafter_new(c, &cfg, embed, lm, cap_T, cap_nb, 7, &d1)) fail_msg("drafter_new: %s", dl_errmsg());
    co_fb_t b_first, a_run, b_after, b_fresh;
    co_fb(d1, c, &Bb, &b_first);
    co_fb(d1, c, &A, &a_run);
    co_fb(d1, c, &Bb, &b_after);
    drafter_destroy(&d1);
    c->impl->sync(c);
    if (drafter_new(c_fresh, &cfg, embed, lm, cap_T, cap_nb, 7, &d2)) fail_msg("drafter_new: %s", dl_errmsg());
    co_fb(d2, c_fresh, &Bb, &b_fresh);
    size_t np = drafter_n_params(d2), nl = (size_t)Bb.nb * cfg.B * V;
    drafter_destroy(&d2);
    c_fresh->impl->sync(c_fresh);
    printf("  batch A loss %.6f (weight %.4f)\n", a_run.st.loss_sum / a_run.st.weight_sum,
           a_run.st.weight_sum);
    co_fb_same("drafter B first vs fresh (determinism)", &b_first, &b_fresh, np, nl, cfg.B);
    co_fb_same("drafter B after A vs fresh (carry-over)", &b_after, &b_fresh, np, nl, cfg.B);
    co_fb_free(&b_first), co_fb_free(&a_run), co_fb_free(&b_after), co_fb_free(&b_fresh);
    co_free_batch(c, &A);
    co_free_batch(c, &Bb);
    c->impl->free_(c, embed);
    c->impl->free_(c, lm);
}

/* ----------------------------------------------------------------- target */

typedef struct {
    unsigned char *feat, *hid;   /* raw backend bytes (act) */
} co_tf_t;

/* target_forward_host of b into fresh buffers poisoned with NaN (every row of the
 * result must be written by this call); with_hidden: also the final hidden. */
static void co_tf(target_t *t, const ops_ctx_t *c, const co_batch_t *b, int with_hidden,
                  co_tf_t *r) {
    const model_config_t *m = target_config(t);
    size_t ab = ops_act_bytes(c), D = (size_t)m->D;
    size_t nf = (size_t)b->T * target_opts(t)->n_capture * D, nh = (size_t)b->T * D;
    void *feat = c->impl->malloc_(c, nf * ab), *hid = c->impl->malloc_(c, nh * ab);
    assert_non_null(feat);
    assert_non_null(hid);
    float *poison = malloc(nf * 4);
    assert_non_null(poison);
    for (size_t i = 0; i < nf; i++) poison[i] = NAN;
    c->impl->upload_act(c, feat, poison, nf);
    c->impl->upload_act(c, hid, poison, nh);
    free(poison);
    if (target_forward_host(t, b->ids, NULL, b->cu, b->nseq, b->T, feat, with_hidden ? hid : NULL))
        fail_msg("target_forward_host: %s", dl_errmsg());
    r->feat = malloc(nf * ab);
    r->hid = with_hidden ? malloc(nh * ab) : NULL;
    assert_non_null(r->feat);
    c->impl->download(c, r->feat, feat, nf * ab);
    if (with_hidden) c->impl->download(c, r->hid, hid, nh * ab);
    c->impl->sync(c);
    c->impl->free_(c, feat);
    c->impl->free_(c, hid);
}

static void co_tf_free(co_tf_t *r) {
    free(r->feat), free(r->hid);
    memset(r, 0, sizeof *r);
}

/* Raw act arrays (n elements of ab bytes) bitwise equal, else fail naming the first. */
static void co_same_act(const char *what, const void *a, const void *b, size_t n, size_t ab,
                        int width) {
    long i = co_first_diff(a, b, n, ab);
    if (i < 0) return;
    size_t nd = 0;
    for (size_t k = 0; k < n; k++) nd += memcmp((const char *)a + k * ab, (const char *)b + k * ab, ab) != 0;
    fail_msg("%s: %zu of %zu elements differ; first at row %ld column %ld", what, nd, n,
             i / width, i % width);
}

static void co_target_case(const ops_ctx_t *c, const ops_ctx_t *c_fresh, const char *dir) {
    model_config_t mc;
    assert_int_equal(model_config_from_hf_dir(dir, &mc), 0);
    target_opts_t opts = {.max_tokens = 300, .max_seqs = CO_MAX_SEQ, .n_capture = 2,
                          .capture_ids = {0, 2}};
    assert_true(mc.L >= 4);
    const int lens_a[] = {120, 90, 60, 30}, lens_b[] = {50, 37, 23};
    co_batch_t A, Bb;
    co_make_batch(c, &A, lens_a, 4, mc.V, 0, 0, 0, 21);
    co_make_batch(c, &Bb, lens_b, 3, mc.V, 0, 0, 0, 22);
    target_t *t1 = NULL, *t2 = NULL;
    if (target_load(dir, c, &opts, &t1)) fail_msg("target_load %s: %s", dir, dl_errmsg());
    co_tf_t b_first, a_run, b_after, b_after_h, b_fresh;
    co_tf(t1, c, &Bb, 0, &b_first);
    co_tf(t1, c, &A, 1, &a_run);
    co_tf(t1, c, &Bb, 0, &b_after);
    co_tf(t1, c, &Bb, 1, &b_after_h);
    target_destroy(&t1);
    if (target_load(dir, c_fresh, &opts, &t2)) fail_msg("target_load %s: %s", dir, dl_errmsg());
    co_tf(t2, c_fresh, &Bb, 1, &b_fresh);
    target_destroy(&t2);
    size_t ab = ops_act_bytes(c), D = (size_t)mc.D, nf = (size_t)Bb.T * 2 * D;
    printf("  target %s: A T %d, B T %d\n", dir, A.T, Bb.T);
    co_same_act("target B first vs fresh: features (determinism)", b_first.feat, b_fresh.feat, nf,
                ab, (int)(2 * D));
    co_same_act("target B after A vs fresh: features (carry-over)", b_after.feat, b_fresh.feat,
                nf, ab, (int)(2 * D));
    co_same_act("target B after A, with hidden, vs fresh: features", b_after_h.feat, b_fresh.feat,
                nf, ab, (int)(2 * D));
    co_same_act("target B after A vs fresh: final hidden (carry-over)", b_after_h.hid,
                b_fresh.hid, (size_t)Bb.T * D, ab, (int)D);
    printf("  target %s: B features and hidden bitwise equal (first, after A, fresh)\n", dir);
    co_tf_free(&b_first), co_tf_free(&a_run), co_tf_free(&b_after), co_tf_free(&b_after_h);
    co_tf_free(&b_fresh);
    co_free_batch(c, &A);
    co_free_batch(c, &Bb);
}

/* The pipeline tests' tiny Llama target, written to a temporary directory. */
static void co_target_tiny_llama(const ops_ctx_t *c, const ops_ctx_t *c_fresh) {
    char root[64], dir[96];
    snprintf(root, sizeof root, "/tmp/dlco-%d", (int)getpid());
    snprintf(dir, sizeof dir, "%s/tiny", root);
    mkdir(root, 0700);
    if (pf_write_tiny_model(dir) < 0) fail_msg("pf_write_tiny_model: %s", dl_errmsg());
    co_target_case(c, c_fresh, dir);
    pf_teardown(root);
}

static void co_target_qwen3(const ops_ctx_t *c, const ops_ctx_t *c_fresh) {
    const char *fx = getenv("DL_FIXTURES_DIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/target/qwen3_untied", fx ? fx : "tests/fixtures");
    co_target_case(c, c_fresh, dir);
}

#endif
