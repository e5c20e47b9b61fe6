/* common/model/target: parity with Hugging Face transformers (fp32, eager attention) on
 * small random-init Llama / Qwen2 / Qwen3 models (tests/fixtures/target/make_fixtures.py)
 * and on the embedded SmolLM2 GGUF (loaded independently by transformers' GGUF reader).
 *
 * Metric, per tensor: err = max_i |a_i - b_i| / max_i |b_i| (b = HF). CPU fp32 must give
 * err <= 1e-4 for every captured layer output, the final-norm hidden state and the logits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/model/config.h"
#include "common/model/mkmodel.h"
#include "common/format/safetensors.h"
#include "common/model/target.h"
#include "common/ops/ops.h"

#define TOL 1e-4

static const char *fixtures_dir(void) {
    const char *d = getenv("DL_FIXTURES_DIR");
    return d ? d : "tests/fixtures";
}

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= num)) num = d;  /* NaN propagates */
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return den > 0 ? num / den : num;
}

static const st_tensor_t *need(const safetensors_t *st, const char *name) {
    const st_tensor_t *t = safetensors_find(st, name);
    if (!t) fail_msg("expected tensor %s missing", name);
    return t;
}

static float *to_f32(const st_tensor_t *t) {
    float *x = malloc(st_tensor_nelem(t) * sizeof *x);
    assert_int_equal(st_tensor_to_f32(t, x), 0);
    return x;
}

/* Loads fixture dir name, runs the packed forward capturing every layer, compares. */
static void check_family(const char *name, model_family_t fam, int tied) {
    char dir[512], exp[600];
    snprintf(dir, sizeof dir, "%s/target/%s", fixtures_dir(), name);
    snprintf(exp, sizeof exp, "%s/expected.safetensors", dir);
    safetensors_t *e = NULL;
    assert_int_equal(safetensors_open(exp, &e), 0);
    const st_tensor_t *tids = need(e, "ids"), *tcu = need(e, "cu_seqlens");
    int T = (int)tids->shape[0], nseq = (int)tcu->shape[0] - 1;
    const int32_t *ids = (const int32_t *)tids->data, *cu = (const int32_t *)tcu->data;

    ops_ctx_t c;
    ops_cpu_init(&c, 0);
    model_config_t cfg;
    assert_int_equal(model_config_from_hf_dir(dir, &cfg), 0);
    assert_int_equal(cfg.family, fam);
    assert_int_equal(cfg.tie_embeddings, tied);
    target_opts_t o = {.max_tokens = 64, .max_seqs = 4, .n_capture = cfg.L};
    for (int i = 0; i < cfg.L; i++) o.capture_ids[i] = i;
    target_t *t = NULL;
    int rc = target_load(dir, &c, &o, &t);
    if (rc) fail_msg("target_load %s: %s", dir, dl_errmsg());
    const model_config_t *m = target_config(t);
    int D = m->D, L = m->L, V = m->V;
    assert_true(tied ? target_embed(t) == target_lm_head(t) : target_embed(t) != target_lm_head(t));

    size_t nf = (size_t)T * L * D;
    void *feat = c.impl->malloc_(&c, nf * 4), *hid = c.impl->malloc_(&c, (size_t)T * D * 4);
    void *lg = c.impl->malloc_(&c, (size_t)T * V * 4);
    assert_int_equal(target_forward_host(t, ids, NULL, cu, nseq, T, feat, hid), 0);
    target_logits(t, lg, hid, T);
    float *a = malloc(nf * 4), *ah = malloc((size_t)T * D * 4), *al = malloc((size_t)T * V * 4);
    c.impl->download_act(&c, a, feat, nf);
    c.impl->download_act(&c, ah, hid, (size_t)T * D);
    c.impl->download_act(&c, al, lg, (size_t)T * V);
    float *b = to_f32(need(e, "layers")), *bh = to_f32(need(e, "hidden")), *bl = to_f32(need(e, "logits"));
    /* per layer: columns [l*D, (l+1)*D) of every row */
    float *ca = malloc((size_t)T * D * 4), *cb = malloc((size_t)T * D * 4);
    for (int l = 0; l < L; l++) {
        for (int r = 0; r < T; r++) {
            memcpy(ca + (size_t)r * D, a + ((size_t)r * L + l) * D, D * 4);
            memcpy(cb + (size_t)r * D, b + ((size_t)r * L + l) * D, D * 4);
        }
        double err = rel_err(ca, cb, (size_t)T * D);
        printf("  %-13s layer %d  err %.2e\n", name, l, err);
        assert_true(err <= TOL);
    }
    double eh = rel_err(ah, bh, (size_t)T * D), el = rel_err(al, bl, (size_t)T * V);
    printf("  %-13s hidden   err %.2e  logits err %.2e\n", name, eh, el);
    assert_true(eh <= TOL);
    assert_true(el <= TOL);

    /* Capturing a subset in a different order gives the same columns, and skipping the
     * layers after the last captured one (hidden == NULL) changes nothing. */
    target_destroy(&t);
    target_opts_t o2 = {.max_tokens = 64, .max_seqs = 4, .n_capture = 2, .capture_ids = {2, 0}};
    assert_int_equal(target_load(dir, &c, &o2, &t), 0);
    assert_int_equal(target_forward_host(t, ids, NULL, cu, nseq, T, feat, NULL), 0);
    c.impl->download_act(&c, a, feat, (size_t)T * 2 * D);
    for (int r = 0; r < T; r++) {
        assert_true(rel_err(a + (size_t)r * 2 * D, b + ((size_t)r * L + 2) * D, D) <= TOL);
        assert_true(rel_err(a + (size_t)r * 2 * D + D, b + ((size_t)r * L + 0) * D, D) <= TOL);
    }
    /* bad inputs are clean errors */
    int32_t bad[3] = {0, 1, V};
    int32_t cu1[2] = {0, 3};
    assert_int_equal(target_forward_host(t, bad, NULL, cu1, 1, 3, feat, NULL), DL_ERANGE);
    assert_int_equal(target_forward_host(t, ids, NULL, cu1, 1, 65, feat, NULL), DL_ERANGE);
    int32_t cu_bad[3] = {0, 0, 3};
    assert_int_equal(target_forward_host(t, ids, NULL, cu_bad, 2, 3, feat, NULL), DL_EINVAL);

    free(ca); free(cb); free(a); free(ah); free(al); free(b); free(bh); free(bl);
    c.impl->free_(&c, feat);
    c.impl->free_(&c, hid);
    c.impl->free_(&c, lg);
    target_destroy(&t);
    assert_null(t);
    safetensors_close(&e);
    ops_ctx_destroy(&c);
}

static void test_llama_untied(void **s) { (void)s; check_family("llama_untied", MODEL_LLAMA, 0); }
static void test_qwen2_tied(void **s) { (void)s; check_family("qwen2_tied", MODEL_QWEN2, 1); }
static void test_qwen3_untied(void **s) { (void)s; check_family("qwen3_untied", MODEL_QWEN3, 0); }
static void test_qwen3_tied(void **s) { (void)s; check_family("qwen3_tied", MODEL_QWEN3, 1); }

static void test_layer_ids(void **s) {
    (void)s;
    int ids[8];
    assert_int_equal(target_default_layer_ids(36, 5, ids), 0);
    int want36[] = {1, 9, 17, 25, 33};
    assert_memory_equal(ids, want36, sizeof want36);
    assert_int_equal(target_default_layer_ids(30, 5, ids), 0);   /* 7.5 -> 8, 20.5 -> 20 */
    int want30[] = {1, 8, 14, 20, 27};
    assert_memory_equal(ids, want30, sizeof want30);
    assert_int_equal(target_default_layer_ids(28, 1, ids), 0);
    assert_int_equal(ids[0], 14);
    assert_int_equal(target_default_layer_ids(3, 2, ids), DL_EINVAL);
    assert_int_equal(target_default_layer_ids(30, 0, ids), DL_EINVAL);
}

static void test_config_errors(void **s) {
    (void)s;
    model_config_t c;
    assert_int_equal(model_config_from_json("{\"architectures\":[\"GPT2LMHeadModel\"]}", "x", &c), DL_ENOTSUP);
    assert_non_null(strstr(dl_errmsg(), "GPT2LMHeadModel"));
    assert_int_equal(model_config_from_json("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64}",
                                            "cfg.json", &c), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "num_hidden_layers"));
    const char *ok = "{\"architectures\":[\"Qwen3ForCausalLM\"],\"num_hidden_layers\":2,\"hidden_size\":64,"
                     "\"num_attention_heads\":4,\"num_key_value_heads\":3,\"intermediate_size\":8,"
                     "\"vocab_size\":10}";
    assert_int_equal(model_config_from_json(ok, "x", &c), DL_EFORMAT);  /* 4 % 3 */
    const char *rs = "{\"architectures\":[\"LlamaForCausalLM\"],\"num_hidden_layers\":2,\"hidden_size\":64,"
                     "\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":10,"
                     "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}";
    assert_int_equal(model_config_from_json(rs, "x", &c), DL_ENOTSUP);
    assert_non_null(strstr(dl_errmsg(), "yarn"));
    /* round trip through model_config_to_json */
    const char *l3 = "{\"architectures\":[\"LlamaForCausalLM\"],\"num_hidden_layers\":2,\"hidden_size\":64,"
                     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":8,"
                     "\"vocab_size\":10,\"rope_theta\":500000.0,\"eos_token_id\":[5,6],"
                     "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                     "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}}";
    assert_int_equal(model_config_from_json(l3, "x", &c), 0);
    assert_int_equal(c.rope.llama3, 1);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.hd, 16);
    char *j = model_config_to_json(&c);
    model_config_t c2;
    assert_int_equal(model_config_from_json(j, "roundtrip", &c2), 0);
    free(j);
    assert_int_equal(c2.L, 2);
    assert_int_equal(c2.Hkv, 2);
    assert_true(c2.rope.theta == 500000.0 && c2.rope.factor == 8.0 && c2.rope.llama3);
    assert_int_equal(c2.eos_ids[1], 6);
    assert_true(model_config_n_params(&c) == model_config_n_params(&c2));
}

/* SmolLM2-135M-Instruct Q4_1 GGUF vs transformers' own GGUF loading (fp32). */
static void test_smollm2_gguf(void **s) {
    (void)s;
    char model[1024], exp[512];
    assert_int_equal(paths_default_model(model, sizeof model), 0);
    if (access(model, R_OK) != 0) {
        fprintf(stderr, "skip: %s absent (run `make model`)\n", model);
        skip();
    }
    snprintf(exp, sizeof exp, "%s/target/smollm2/expected.safetensors", fixtures_dir());
    safetensors_t *e = NULL;
    assert_int_equal(safetensors_open(exp, &e), 0);
    const st_tensor_t *tids = need(e, "ids"), *tl = need(e, "layer_ids");
    int T = (int)tids->shape[0], nl = (int)tl->shape[0];
    const int32_t *ids = (const int32_t *)tids->data, *lid = (const int32_t *)tl->data;
    ops_ctx_t c;
    ops_cpu_init(&c, 0);
    target_opts_t o = {.max_tokens = 32, .max_seqs = 1, .n_capture = nl};
    memcpy(o.capture_ids, lid, nl * sizeof(int));
    target_t *t = NULL;
    int rc = target_load(model, &c, &o, &t);
    if (rc) fail_msg("target_load: %s", dl_errmsg());
    const model_config_t *m = target_config(t);
    assert_int_equal(m->family, MODEL_LLAMA);
    assert_int_equal(m->L, 30);
    assert_int_equal(m->D, 576);
    assert_int_equal(m->Hkv, 3);
    assert_int_equal(m->tie_embeddings, 1);
    int D = m->D, V = m->V;
    int32_t cu[2] = {0, T};
    void *feat = c.impl->malloc_(&c, (size_t)T * nl * D * 4), *hid = c.impl->malloc_(&c, (size_t)T * D * 4);
    void *lg = c.impl->malloc_(&c, (size_t)V * 4);
    assert_int_equal(target_forward_host(t, ids, NULL, cu, 1, T, feat, hid), 0);
    target_logits(t, lg, (char *)hid + (size_t)(T - 1) * D * 4, 1);
    float *a = malloc((size_t)T * nl * D * 4), *ah = malloc((size_t)T * D * 4), *al = malloc((size_t)V * 4);
    c.impl->download_act(&c, a, feat, (size_t)T * nl * D);
    c.impl->download_act(&c, ah, hid, (size_t)T * D);
    c.impl->download_act(&c, al, lg, (size_t)V);
    float *b = to_f32(need(e, "features")), *bh = to_f32(need(e, "hidden")), *bl = to_f32(need(e, "last_logits"));
    double ef = rel_err(a, b, (size_t)T * nl * D), eh = rel_err(ah, bh, (size_t)T * D), el = rel_err(al, bl, V);
    printf("  smollm2 gguf  features err %.2e  hidden err %.2e  last logits err %.2e\n", ef, eh, el);
    assert_true(ef <= TOL);
    assert_true(eh <= TOL);
    assert_true(el <= TOL);
    int best = 0;
    for (int i = 1; i < V; i++) if (al[i] > al[best]) best = i;
    int hbest = 0;
    for (int i = 1; i < V; i++) if (bl[i] > bl[hbest]) hbest = i;
    assert_int_equal(best, hbest);
    free(a); free(ah); free(al); free(b); free(bh); free(bl);
    c.impl->free_(&c, feat);
    c.impl->free_(&c, hid);
    c.impl->free_(&c, lg);
    target_destroy(&t);
    safetensors_close(&e);
    ops_ctx_destroy(&c);
}

/* `draftline mkmodel` refuses before writing: bad --dtype (exit 2), an existing
 * --out without --force, a --tokenizer dir without tokenizer.json (exit 1). */
static void test_mkmodel_cli(void **s) {
    (void)s;
    const char *bin = getenv("DL_BIN_DIR");
    if (!bin) { fprintf(stderr, "skip: DL_BIN_DIR not set (make test sets it)\n"); skip(); }
    char d[] = "/tmp/dl_test_mkcli_XXXXXX", cmd[1200], out[200], cfgp[240];
    assert_non_null(mkdtemp(d));
    snprintf(out, sizeof out, "%s/m", d);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", out);
    snprintf(cmd, sizeof cmd, "%s/draftline mkmodel --config tiny-qwen3 --out %s --dtype f64 >/dev/null 2>&1", bin, out);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof cmd, "%s/draftline mkmodel --config tiny-qwen3 --out %s --tokenizer %s >/dev/null 2>&1", bin,
             out, d);
    assert_int_equal(WEXITSTATUS(system(cmd)), 1);
    assert_int_not_equal(access(cfgp, F_OK), 0); /* nothing written */
    snprintf(cmd, sizeof cmd, "%s/draftline mkmodel --config tiny-qwen3 --out %s >/dev/null 2>&1", bin, d);
    assert_int_equal(WEXITSTATUS(system(cmd)), 1); /* exists */
    snprintf(cmd, sizeof cmd, "rm -rf %s", d);
    assert_int_equal(system(cmd), 0);
}

/* mkmodel: a seeded random tiny-qwen3 (sharded) loads as a target, runs, and is a pure
 * function of the seed; the weights have the advertised statistics. */
static void test_mkmodel(void **s) {
    (void)s;
    char d1[] = "/tmp/dl_test_mk1_XXXXXX", d2[] = "/tmp/dl_test_mk2_XXXXXX";
    assert_non_null(mkdtemp(d1));
    assert_non_null(mkdtemp(d2));
    model_config_t cfg;
    assert_int_equal(mkmodel_preset("qwen3-8b", &cfg), 0);
    assert_int_equal(cfg.L, 36);
    assert_int_equal(cfg.F, 12288);
    assert_true(model_config_n_params(&cfg) > 8100000000ull && model_config_n_params(&cfg) < 8300000000ull);
    assert_int_equal(mkmodel_preset("llama-3.1-8b", &cfg), 0);
    assert_int_equal(cfg.rope.llama3, 1);
    assert_true(model_config_n_params(&cfg) > 8000000000ull && model_config_n_params(&cfg) < 8100000000ull);
    assert_int_equal(mkmodel_preset("gpt-5", &cfg), DL_EINVAL);
    assert_int_equal(mkmodel_preset("tiny-qwen3", &cfg), 0);
    assert_int_equal(mkmodel_write(&cfg, d1, 7, "bf16", 4 << 20, NULL), 0);
    assert_int_equal(mkmodel_write(&cfg, d2, 7, "bf16", 0, NULL), 0);
    safetensors_t *a = NULL, *b = NULL;
    assert_int_equal(safetensors_open(d1, &a), 0);   /* 2 shards through the index */
    assert_int_equal(safetensors_open(d2, &b), 0);   /* one file */
    assert_int_equal(safetensors_n_tensors(a), safetensors_n_tensors(b));
    for (size_t i = 0; i < safetensors_n_tensors(b); i++) {
        const st_tensor_t *tb = safetensors_tensor_at(b, i), *ta = safetensors_find(a, tb->name);
        assert_non_null(ta);
        assert_int_equal(ta->nbytes, tb->nbytes);
        assert_memory_equal(ta->data, tb->data, tb->nbytes);
    }
    const st_tensor_t *w = safetensors_find(b, "model.layers.1.mlp.up_proj.weight");
    float *x = to_f32(w);
    double s1 = 0, s2 = 0;
    size_t n = st_tensor_nelem(w);
    for (size_t i = 0; i < n; i++) { s1 += x[i]; s2 += (double)x[i] * x[i]; }
    free(x);
    assert_true(fabs(s1 / n) < 0.002 && fabs(sqrt(s2 / n) - 0.02) < 0.001);
    safetensors_close(&a);
    safetensors_close(&b);
    ops_ctx_t c;
    ops_cpu_init(&c, 0);
    target_opts_t o = {.max_tokens = 8, .max_seqs = 1, .n_capture = 1, .capture_ids = {1}};
    target_t *t = NULL;
    if (target_load(d1, &c, &o, &t)) fail_msg("%s", dl_errmsg());
    int32_t ids[4] = {1, 151643, 9, 151935}, cu[2] = {0, 4};
    void *f = c.impl->malloc_(&c, 4 * 64 * 4);
    assert_int_equal(target_forward_host(t, ids, NULL, cu, 1, 4, f, NULL), 0);
    float y[4 * 64];
    c.impl->download_act(&c, y, f, 4 * 64);
    for (int i = 0; i < 4 * 64; i++) assert_true(isfinite(y[i]));
    c.impl->free_(&c, f);
    target_destroy(&t);
    ops_ctx_destroy(&c);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", d1, d2);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_ids),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_llama_untied),
        cmocka_unit_test(test_qwen2_tied),
        cmocka_unit_test(test_qwen3_untied),
        cmocka_unit_test(test_qwen3_tied),
        cmocka_unit_test(test_smollm2_gguf),
        cmocka_unit_test(test_mkmodel),
        cmocka_unit_test(test_mkmodel_cli),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char model[1024];
    if (rc == 0 && (paths_default_model(model, sizeof model) < 0 || access(model, R_OK) != 0)) {
        fprintf(stderr, "SKIP: the embedded model is absent (run `make model`); its tests were skipped\n");
        return 77;
    }
    return rc;
}
