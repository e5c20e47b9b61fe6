/* common/model/target on the CUDA backend (bf16 weights and activations, fp32
 * accumulation) held against the CPU backend (fp32, itself held to Hugging Face
 * transformers within 1e-4 by tests/unit/test_target.c) on the committed parity
 * fixtures tests/fixtures/target/{llama_untied,qwen2_tied,qwen3_untied,qwen3_tied,qwen3_moe}
 * (packed batch of 3 sequences; tests/fixtures/target/make_fixtures.py). qwen3_moe: the
 * same tolerances; a router near-tie rounded differently in bf16 could pick another expert
 * for a token (as HF in bf16 would): the printed per-layer errors show it. The MoE ops
 * (moe_route, moe_permute: exact; moe_combine: bf16) are also held to the CPU directly on
 * random routings of 3000 tokens over 128 experts, top-8, with forced ties.
 *
 * Metrics per tensor (b = CPU fp32 reference, a = CUDA):
 *   max_rel  = max_i |a_i - b_i| / max_i |b_i|
 *   norm_rel = ||a - b||_2 / ||b||_2
 * Stated bf16 tolerances (every captured layer output, the final-norm hidden state
 * and the logits): norm_rel <= 3e-2 and max_rel <= 6e-2. bf16 rounding of one value
 * is 2^-9 = 2e-3 relative; weights, activations, q/k/v and attention probabilities
 * are each rounded, and the error grows through the residual stream with depth.
 * Measured on an H200 (2026-11-30): norm_rel 0.8e-2 .. 2.3e-2, max_rel up to 4.0e-2
 * (4-layer fixtures, growing with depth; llama_untied the largest); printed on every
 * run. Packed vs alone measured bitwise equal. The CUDA output is also checked against the HF
 * fixture itself with the same tolerances, and the logits' argmax must agree with
 * the CPU's on at least 90% of the tokens (exact ties of near-equal logits may flip).
 *
 * SmolLM2 (embedded model, when present at paths_default_model()): greedy
 * generation on CUDA answers "What is the capital of France?" with text containing
 * "Paris". The GPU machines of the project carry no copy of the model (98 MB, over
 * the transfer limit), so there that test is skipped with a message.
 *
 * Exits 77 ("SKIP: no CUDA device") where no GPU is present. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/data/chat.h"
#include "common/data/tokenizer.h"
#include "common/model/config.h"
#include "common/model/generate.h"
#include "common/format/safetensors.h"
#include "common/model/target.h"
#include "common/ops/ops.h"

#define TOL_NORM 3e-2
#define TOL_MAX 6e-2

static ops_ctx_t g_cpu, g_gpu;

static const char *fixtures_dir(void) {
    const char *d = getenv("DL_FIXTURES_DIR");
    return d ? d : "tests/fixtures";
}

static void errs(const float *a, const float *b, size_t n, double *max_rel, double *norm_rel) {
    double md = 0, mb = 0, s2 = 0, b2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = d; /* NaN propagates */
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
        s2 += d * d;
        b2 += (double)b[i] * b[i];
    }
    *max_rel = mb > 0 ? md / mb : md;
    *norm_rel = b2 > 0 ? sqrt(s2 / b2) : sqrt(s2);
}

/* Asserts both tolerances; returns the norm-wise error for the summary. */
static double check(const char *fam, const char *what, int l, const float *a, const float *b, size_t n) {
    double mr, nr;
    errs(a, b, n, &mr, &nr);
    printf("  %-13s %-7s", fam, what);
    if (l >= 0) printf(" %2d", l); else printf("   ");
    printf("  norm_rel %.2e  max_rel %.2e\n", nr, mr);
    if (!(nr <= TOL_NORM) || !(mr <= TOL_MAX))
        fail_msg("%s %s %d: norm_rel %.3e (tol %.0e), max_rel %.3e (tol %.0e)", fam, what, l, nr,
                 TOL_NORM, mr, TOL_MAX);
    return nr;
}

static const st_tensor_t *need(const safetensors_t *st, const char *name) {
    const st_tensor_t *t = safetensors_find(st, name);
    if (!t) fail_msg("expected tensor %s missing", name);
    return t;
}

typedef struct { float *feat, *hid, *logits; } outs_t;

/* Forward of the fixture batch on backend c, capturing every layer; host f32 outputs. */
static void run_backend(const ops_ctx_t *c, const char *dir, const int32_t *ids, const int32_t *cu,
                        int nseq, int T, outs_t *o, int *Lo, int *Do, int *Vo) {
    model_config_t cfg;
    assert_int_equal(model_config_from_hf_dir(dir, &cfg), 0);
    target_opts_t opts = {.max_tokens = 64, .max_seqs = 4, .n_capture = cfg.L};
    for (int i = 0; i < cfg.L; i++) opts.capture_ids[i] = i;
    target_t *t = NULL;
    if (target_load(dir, c, &opts, &t)) fail_msg("target_load %s (%s): %s", dir, c->impl->name, dl_errmsg());
    const model_config_t *m = target_config(t);
    int L = m->L, D = m->D, V = m->V;
    size_t ab = ops_act_bytes(c), nf = (size_t)T * L * D;
    void *feat = c->impl->malloc_(c, nf * ab), *hid = c->impl->malloc_(c, (size_t)T * D * ab);
    void *lg = c->impl->malloc_(c, (size_t)T * V * ab);
    assert_non_null(feat);
    assert_non_null(hid);
    assert_non_null(lg);
    /* poison: every element must be written by the forward */
    float *poison = malloc(nf * sizeof(float));
    for (size_t i = 0; i < nf; i++) poison[i] = NAN;
    c->impl->upload_act(c, feat, poison, nf);
    c->impl->upload_act(c, hid, poison, (size_t)T * D);
    free(poison);
    assert_int_equal(target_forward_host(t, ids, NULL, cu, nseq, T, feat, hid), 0);
    target_logits(t, lg, hid, T);
    o->feat = malloc(nf * 4);
    o->hid = malloc((size_t)T * D * 4);
    o->logits = malloc((size_t)T * V * 4);
    c->impl->download_act(c, o->feat, feat, nf);
    c->impl->download_act(c, o->hid, hid, (size_t)T * D);
    c->impl->download_act(c, o->logits, lg, (size_t)T * V);
    c->impl->sync(c);
    c->impl->free_(c, feat);
    c->impl->free_(c, hid);
    c->impl->free_(c, lg);
    target_destroy(&t);
    *Lo = L, *Do = D, *Vo = V;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

static void check_family(const char *name) {
    char dir[512], exp[600];
    snprintf(dir, sizeof dir, "%s/target/%s", fixtures_dir(), name);
    snprintf(exp, sizeof exp, "%s/expected.safetensors", dir);
    safetensors_t *e = NULL;
    assert_int_equal(safetensors_open(exp, &e), 0);
    const st_tensor_t *tids = need(e, "ids"), *tcu = need(e, "cu_seqlens");
    int T = (int)tids->shape[0], nseq = (int)tcu->shape[0] - 1;
    const int32_t *ids = (const int32_t *)tids->data, *cu = (const int32_t *)tcu->data;
    outs_t rc, rg;
    int L, D, V, L2, D2, V2;
    run_backend(&g_cpu, dir, ids, cu, nseq, T, &rc, &L, &D, &V);
    run_backend(&g_gpu, dir, ids, cu, nseq, T, &rg, &L2, &D2, &V2);
    assert_int_equal(L, L2);
    assert_int_equal(D, D2);
    assert_int_equal(V, V2);
    /* HF fixture (fp32 eager) */
    float *hl = malloc(st_tensor_nelem(need(e, "layers")) * 4), *hh = malloc((size_t)T * D * 4);
    float *hg = malloc((size_t)T * V * 4);
    assert_int_equal(st_tensor_to_f32(need(e, "layers"), hl), 0);
    assert_int_equal(st_tensor_to_f32(need(e, "hidden"), hh), 0);
    assert_int_equal(st_tensor_to_f32(need(e, "logits"), hg), 0);

    float *ca = malloc((size_t)T * D * 4), *cb = malloc((size_t)T * D * 4), *ch = malloc((size_t)T * D * 4);
    for (int l = 0; l < L; l++) {
        for (int r = 0; r < T; r++) {
            memcpy(ca + (size_t)r * D, rg.feat + ((size_t)r * L + l) * D, D * 4);
            memcpy(cb + (size_t)r * D, rc.feat + ((size_t)r * L + l) * D, D * 4);
            memcpy(ch + (size_t)r * D, hl + ((size_t)r * L + l) * D, D * 4);
        }
        check(name, "layer", l, ca, cb, (size_t)T * D);
        check(name, "vs HF", l, ca, ch, (size_t)T * D);
    }
    check(name, "hidden", -1, rg.hid, rc.hid, (size_t)T * D);
    check(name, "logits", -1, rg.logits, rc.logits, (size_t)T * V);
    check(name, "lg/HF", -1, rg.logits, hg, (size_t)T * V);
    int agree = 0;
    for (int r = 0; r < T; r++)
        agree += argmax(rg.logits + (size_t)r * V, V) == argmax(rc.logits + (size_t)r * V, V);
    printf("  %-13s argmax agreement %d/%d\n", name, agree, T);
    assert_true(agree * 10 >= T * 9);
    free(ca), free(cb), free(ch), free(hl), free(hh), free(hg);
    free(rc.feat), free(rc.hid), free(rc.logits), free(rg.feat), free(rg.hid), free(rg.logits);
    safetensors_close(&e);
}

static void test_llama_untied(void **s) { (void)s; check_family("llama_untied"); }
static void test_qwen2_tied(void **s) { (void)s; check_family("qwen2_tied"); }
static void test_qwen3_untied(void **s) { (void)s; check_family("qwen3_untied"); }
static void test_qwen3_tied(void **s) { (void)s; check_family("qwen3_tied"); }
static void test_qwen3_moe(void **s) { (void)s; check_family("qwen3_moe"); }

/* moe_route / moe_permute identical on CUDA and CPU (logits exactly representable in bf16,
 * every 7th token all-equal: a forced tie), moe_combine within bf16 rounding. */
static void test_moe_ops(void **s) {
    (void)s;
    enum { T = 3000, E = 128, K = 8, D = 96 };
    const ops_impl_t *oc = g_cpu.impl, *og = g_gpu.impl;
    float *lg = malloc((size_t)T * E * 4), *y = malloc((size_t)T * K * D * 4);
    srand(7);
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++)
            lg[(size_t)t * E + e] = t % 7 == 0 ? 0.5f : (float)(rand() % 64 - 32) / 16.0f;
    for (size_t i = 0; i < (size_t)T * K * D; i++) y[i] = (float)(rand() % 256 - 128) / 64.0f;
    int32_t *ic = malloc(T * K * 4), *ig = malloc(T * K * 4), *offc = malloc((E + 1) * 4),
            *offg = malloc((E + 1) * 4), *tc = malloc(T * K * 4), *tg = malloc(T * K * 4),
            *vc = malloc(T * K * 4), *vg = malloc(T * K * 4);
    float *wc = malloc(T * K * 4), *wg = malloc(T * K * 4), *outc = malloc((size_t)T * D * 4),
          *outg = malloc((size_t)T * D * 4);
    oc->moe_route(&g_cpu, ic, wc, lg, T, E, K, 1);
    oc->moe_permute(&g_cpu, offc, tc, vc, ic, T, E, K);
    oc->moe_combine(&g_cpu, outc, y, vc, wc, T, K, D);
    void *dl = og->malloc_(&g_gpu, (size_t)T * E * 2), *dy = og->malloc_(&g_gpu, (size_t)T * K * D * 2);
    void *dout = og->malloc_(&g_gpu, (size_t)T * D * 2);
    int32_t *di = og->malloc_(&g_gpu, T * K * 4), *doff = og->malloc_(&g_gpu, (E + 1) * 4),
            *dt = og->malloc_(&g_gpu, T * K * 4), *dv = og->malloc_(&g_gpu, T * K * 4);
    float *dw = og->malloc_(&g_gpu, T * K * 4);
    og->upload_act(&g_gpu, dl, lg, (size_t)T * E);
    og->upload_act(&g_gpu, dy, y, (size_t)T * K * D);
    og->moe_route(&g_gpu, di, dw, dl, T, E, K, 1);
    og->moe_permute(&g_gpu, doff, dt, dv, di, T, E, K);
    og->moe_combine(&g_gpu, dout, dy, dv, dw, T, K, D);
    og->download(&g_gpu, ig, di, T * K * 4);
    og->download(&g_gpu, wg, dw, T * K * 4);
    og->download(&g_gpu, offg, doff, (E + 1) * 4);
    og->download(&g_gpu, tg, dt, T * K * 4);
    og->download(&g_gpu, vg, dv, T * K * 4);
    og->download_act(&g_gpu, outg, dout, (size_t)T * D);
    assert_memory_equal(ig, ic, T * K * 4);
    assert_memory_equal(offg, offc, (E + 1) * 4);
    assert_memory_equal(tg, tc, T * K * 4);
    assert_memory_equal(vg, vc, T * K * 4);
    double mw = 0;
    for (int i = 0; i < T * K; i++) mw = fmax(mw, fabs((double)wg[i] - wc[i]));
    printf("  moe ops: ids, offsets, permutation identical; max |w diff| %.2e\n", mw);
    assert_true(mw < 1e-6);
    check("moe_combine", "out", -1, outg, outc, (size_t)T * D);
    og->free_(&g_gpu, dl), og->free_(&g_gpu, dy), og->free_(&g_gpu, dout), og->free_(&g_gpu, di);
    og->free_(&g_gpu, doff), og->free_(&g_gpu, dt), og->free_(&g_gpu, dv), og->free_(&g_gpu, dw);
    free(lg), free(y), free(ic), free(ig), free(offc), free(offg), free(tc), free(tg), free(vc);
    free(vg), free(wc), free(wg), free(outc), free(outg);
}

/* Packed forward of the same sequences in one batch or each alone gives the same
 * rows on CUDA within bf16 noise (GEMM tiling differs with T): catches varlen
 * attention leaking across sequence boundaries on the GPU. */
static void test_packed_equals_alone(void **s) {
    (void)s;
    char dir[512], exp[600];
    snprintf(dir, sizeof dir, "%s/target/qwen3_untied", fixtures_dir());
    snprintf(exp, sizeof exp, "%s/expected.safetensors", dir);
    safetensors_t *e = NULL;
    assert_int_equal(safetensors_open(exp, &e), 0);
    const st_tensor_t *tids = need(e, "ids"), *tcu = need(e, "cu_seqlens");
    int T = (int)tids->shape[0], nseq = (int)tcu->shape[0] - 1;
    const int32_t *ids = (const int32_t *)tids->data, *cu = (const int32_t *)tcu->data;
    target_opts_t opts = {.max_tokens = 64, .max_seqs = 4, .n_capture = 1, .capture_ids = {1}};
    target_t *t = NULL;
    if (target_load(dir, &g_gpu, &opts, &t)) fail_msg("%s", dl_errmsg());
    int D = target_config(t)->D;
    void *f = g_gpu.impl->malloc_(&g_gpu, (size_t)T * D * ops_act_bytes(&g_gpu));
    float *all = malloc((size_t)T * D * 4), *one = malloc((size_t)T * D * 4);
    assert_int_equal(target_forward_host(t, ids, NULL, cu, nseq, T, f, NULL), 0);
    g_gpu.impl->download_act(&g_gpu, all, f, (size_t)T * D);
    for (int q = 0; q < nseq; q++) {
        int n = cu[q + 1] - cu[q];
        int32_t c1[2] = {0, n};
        assert_int_equal(target_forward_host(t, ids + cu[q], NULL, c1, 1, n, f, NULL), 0);
        g_gpu.impl->download_act(&g_gpu, one + (size_t)cu[q] * D, f, (size_t)n * D);
    }
    check("packed", "alone", -1, all, one, (size_t)T * D);
    free(all), free(one);
    g_gpu.impl->free_(&g_gpu, f);
    target_destroy(&t);
    safetensors_close(&e);
}

static void test_smollm2_generate(void **s) {
    (void)s;
    char model[1024];
    assert_int_equal(paths_default_model(model, sizeof model), 0);
    if (access(model, R_OK) != 0) {
        printf("  skip: %s absent (run `make model`; the GPU machines carry no copy)\n", model);
        skip();
    }
    tok_t *tok = NULL;
    if (tok_load(model, &tok)) fail_msg("tokenizer: %s", dl_errmsg());
    target_opts_t o = {.max_tokens = 256, .max_seqs = 1};
    target_t *t = NULL;
    if (target_load(model, &g_gpu, &o, &t)) fail_msg("target: %s", dl_errmsg());
    generator_t *g = NULL;
    if (generator_new(t, 1, 160, &g)) fail_msg("generator: %s", dl_errmsg());
    chat_template_t ct;
    assert_int_equal(chat_template_from_tok(tok, &ct), 0);
    const char *q = "What is the capital of France?";
    chat_msg_t m = {"user", q, strlen(q)};
    tok_ids_t ids = {0};
    assert_int_equal(chat_encode_prompt(&ct, tok, &m, 1, &ids), 0);
    gen_params_t p;
    gen_params_default(t, &p);
    p.max_new_tokens = 24;
    const int32_t *pp[1] = {ids.ids};
    int pl[1] = {(int)ids.n}, ol[1];
    int32_t *out[1];
    gen_stats_t st;
    assert_int_equal(generator_run(g, &p, 1, pp, pl, out, ol, NULL, NULL, &st), 0);
    char *text;
    size_t tl;
    assert_int_equal(tok_decode(tok, out[0], (size_t)ol[0], 1, &text, &tl), 0);
    printf("  SmolLM2 on CUDA: \"%s\" (%d tokens; prefill %.1f tok/s, decode %.1f tok/s)\n", text,
           ol[0], st.prompt_tokens / st.prefill_s, (st.new_tokens - 1) / (st.decode_s + 1e-9));
    assert_non_null(strstr(text, "Paris"));
    free(text);
    free(out[0]);
    tok_ids_free(&ids);
    generator_destroy(&g);
    target_destroy(&t);
    tok_destroy(&tok);
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
        cmocka_unit_test(test_llama_untied),   cmocka_unit_test(test_qwen2_tied),
        cmocka_unit_test(test_qwen3_untied),   cmocka_unit_test(test_qwen3_tied),
        cmocka_unit_test(test_qwen3_moe),      cmocka_unit_test(test_moe_ops),
        cmocka_unit_test(test_packed_equals_alone), cmocka_unit_test(test_smollm2_generate),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ops_ctx_destroy(&g_gpu);
    ops_ctx_destroy(&g_cpu);
    return rc;
}
