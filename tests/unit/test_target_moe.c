/* Qwen3-MoE targets (common/model/target_moe.c, the moe_* ops): parity with Hugging Face
 * transformers on the tiny random-init qwen3_moe fixture (tests/fixtures/target/
 * make_fixtures.py: 6 layers, MoE at 1 and 5, dense at 0/2/4 by decoder_sparse_step and at
 * 3 by mlp_only_layers), the same weights as GGUF (make_gguf_moe.py), greedy decoding
 * through the KV cache token for token, the same weights rewritten in transformers 5's fused
 * expert layout (experts.gate_up_proj / experts.down_proj), the routing counts the benchmark
 * reads, and the routing ops on hand-made cases (ties).
 *
 * Metric as test_target.c: err = max|a - b| / max|b| (b = HF) <= 1e-4 in fp32. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "common/format/safetensors.h"
#include "common/model/config.h"
#include "common/model/mkmodel.h"
#include "common/model/target.h"
#include "common/model/target_moe.h"
#include "common/model/target_stage.h"
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
        if (!(d <= num)) num = d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return den > 0 ? num / den : num;
}

static float *expected(safetensors_t *e, const char *name, size_t *n) {
    const st_tensor_t *t = safetensors_find(e, name);
    if (!t) fail_msg("expected tensor %s missing", name);
    float *x = malloc(st_tensor_nelem(t) * sizeof *x);
    assert_int_equal(st_tensor_to_f32(t, x), 0);
    if (n) *n = st_tensor_nelem(t);
    return x;
}

static void path_of(char *out, size_t cap, const char *rel) {
    snprintf(out, cap, "%s/target/%s", fixtures_dir(), rel);
}

static void test_config(void **s) {
    (void)s;
    char dir[512];
    path_of(dir, sizeof dir, "qwen3_moe");
    model_config_t c;
    assert_int_equal(model_config_from_hf_dir(dir, &c), 0);
    assert_int_equal(c.family, MODEL_QWEN3);
    assert_int_equal(c.qk_norm, 1);
    assert_int_equal(c.n_experts, 6);   /* transformers 5.24 writes num_local_experts */
    assert_int_equal(c.top_k, 2);
    assert_int_equal(c.moe_F, 40);
    assert_int_equal(c.norm_topk, 1);
    int want[6] = {0, 1, 0, 0, 0, 1};
    for (int l = 0; l < 6; l++) assert_int_equal(model_config_layer_moe(&c, l), want[l]);
    /* transformers: sum of numel of Qwen3MoeForCausalLM's parameters (tied) */
    assert_int_equal(model_config_n_params(&c), 325056);
    assert_int_equal(model_config_n_active_params(&c), 325056 - 2 * 4 * 3 * 72 * 40);
    /* to_json round trip keeps the sparse layers (as mlp_only_layers with step 1) */
    char *j = model_config_to_json(&c);
    model_config_t r;
    assert_int_equal(model_config_from_json(j, "rt", &r), 0);
    free(j);
    assert_int_equal(r.n_experts, 6);
    assert_memory_equal(r.moe_layers, c.moe_layers, sizeof c.moe_layers);
    /* the GGUF finds the same layers from its tensors */
    char gp[512];
    path_of(gp, sizeof gp, "qwen3_moe.gguf");
    gguf_t *g = NULL;
    assert_int_equal(gguf_open(gp, &g), 0);
    model_config_t cg;
    assert_int_equal(model_config_from_gguf(g, &cg), 0);
    gguf_close(&g);
    assert_int_equal(cg.n_experts, 6);
    assert_int_equal(cg.top_k, 2);
    assert_int_equal(cg.moe_F, 40);
    assert_int_equal(cg.norm_topk, 1);
    assert_int_equal(cg.F, 100);
    assert_memory_equal(cg.moe_layers, c.moe_layers, sizeof c.moe_layers);
    assert_int_equal(model_config_n_params(&cg), 325056);
    /* errors */
    const char *bad = "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"num_hidden_layers\":2,"
                      "\"hidden_size\":8,\"num_attention_heads\":2,\"intermediate_size\":8,"
                      "\"vocab_size\":8,\"num_experts\":4,\"num_experts_per_tok\":5,"
                      "\"moe_intermediate_size\":4}";
    assert_int_equal(model_config_from_json(bad, "bad", &r), DL_EFORMAT);
}

/* Loads path, runs the packed forward of the fixture batch capturing every layer, compares
 * with HF; returns the logits (T, V) (malloc'd). */
static float *check_forward(const char *path, safetensors_t *e) {
    const st_tensor_t *tids = safetensors_find(e, "ids"), *tcu = safetensors_find(e, "cu_seqlens");
    int T = (int)tids->shape[0], nseq = (int)tcu->shape[0] - 1;
    ops_ctx_t c;
    ops_cpu_init(&c, 0);
    target_opts_t o = {.max_tokens = 64, .max_seqs = 4, .n_capture = 6};
    for (int i = 0; i < 6; i++) o.capture_ids[i] = i;
    target_t *t = NULL;
    if (target_load(path, &c, &o, &t)) fail_msg("target_load %s: %s", path, dl_errmsg());
    const model_config_t *m = target_config(t);
    int D = m->D, L = m->L, V = m->V;
    size_t nf = (size_t)T * L * D;
    void *feat = c.impl->malloc_(&c, nf * 4), *hid = c.impl->malloc_(&c, (size_t)T * D * 4);
    void *lg = c.impl->malloc_(&c, (size_t)T * V * 4);
    assert_int_equal(target_forward_host(t, (const int32_t *)tids->data, NULL,
                                         (const int32_t *)tcu->data, nseq, T, feat, hid), 0);
    target_logits(t, lg, hid, T);
    float *a = malloc(nf * 4), *ah = malloc((size_t)T * D * 4), *al = malloc((size_t)T * V * 4);
    c.impl->download_act(&c, a, feat, nf);
    c.impl->download_act(&c, ah, hid, (size_t)T * D);
    c.impl->download_act(&c, al, lg, (size_t)T * V);
    float *b = expected(e, "layers", NULL), *bh = expected(e, "hidden", NULL);
    float *bl = expected(e, "logits", NULL);
    float *ca = malloc((size_t)T * D * 4), *cb = malloc((size_t)T * D * 4);
    for (int l = 0; l < L; l++) {
        for (int r = 0; r < T; r++) {
            memcpy(ca + (size_t)r * D, a + ((size_t)r * L + l) * D, D * 4);
            memcpy(cb + (size_t)r * D, b + ((size_t)r * L + l) * D, D * 4);
        }
        double err = rel_err(ca, cb, (size_t)T * D);
        printf("  %-40s layer %d (%s) err %.2e\n", path, l, model_config_layer_moe(m, l) ? "moe" : "dense", err);
        assert_true(err <= TOL);
    }
    double eh = rel_err(ah, bh, (size_t)T * D), el = rel_err(al, bl, (size_t)T * V);
    printf("  %-40s hidden err %.2e  logits err %.2e\n", path, eh, el);
    assert_true(eh <= TOL);
    assert_true(el <= TOL);
    free(ca); free(cb); free(a); free(ah); free(b); free(bh); free(bl);
    c.impl->free_(&c, feat);
    c.impl->free_(&c, hid);
    c.impl->free_(&c, lg);
    target_destroy(&t);
    ops_ctx_destroy(&c);
    return al;
}

static void test_hf_and_gguf(void **s) {
    (void)s;
    char dir[512], gp[512], exp[600];
    path_of(dir, sizeof dir, "qwen3_moe");
    path_of(gp, sizeof gp, "qwen3_moe.gguf");
    snprintf(exp, sizeof exp, "%s/expected.safetensors", dir);
    safetensors_t *e = NULL;
    assert_int_equal(safetensors_open(exp, &e), 0);
    size_t n;
    free(expected(e, "logits", &n));
    float *lh = check_forward(dir, e), *lgg = check_forward(gp, e);
    /* same BF16 weights either way: the same logits up to summation order */
    double err = rel_err(lgg, lh, n);
    printf("  GGUF vs HF dir logits err %.2e\n", err);
    assert_true(err <= 1e-6);
    free(lh);
    free(lgg);
    safetensors_close(&e);
}

static void copy_file_or_fail(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

/* Malformed MoE configs are refused with what is wrong: an mlp_only_layers entry that is not
 * a layer (transformers silently ignores it), a qwen3moe GGUF whose expert_count disagrees
 * with its router tensors (was a shape error on the first router, or with expert_count 0 a
 * "ffn_gate.weight missing" as if the layer were dense). */
static void test_config_errors(void **s) {
    (void)s;
    static const char *only[] = {"[2]", "[-1]", "[0.5]"};
    char j[512];
    model_config_t r;
    for (int i = 0; i < 3; i++) {
        snprintf(j, sizeof j,
                 "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"num_hidden_layers\":2,\"hidden_size\":8,"
                 "\"num_attention_heads\":2,\"intermediate_size\":8,\"vocab_size\":8,\"num_experts\":4,"
                 "\"num_experts_per_tok\":2,\"moe_intermediate_size\":4,\"mlp_only_layers\":%s}", only[i]);
        assert_int_equal(model_config_from_json(j, "bad.json", &r), DL_EFORMAT);
        printf("  %s\n", dl_errmsg());
        assert_non_null(strstr(dl_errmsg(), "bad.json: mlp_only_layers"));
    }
    snprintf(j, sizeof j,
             "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"num_hidden_layers\":2,\"hidden_size\":8,"
             "\"num_attention_heads\":2,\"intermediate_size\":8,\"vocab_size\":8,\"num_experts\":4,"
             "\"num_experts_per_tok\":2,\"moe_intermediate_size\":4,\"mlp_only_layers\":[1]}");
    assert_int_equal(model_config_from_json(j, "ok.json", &r), 0);
    assert_int_equal(model_config_layer_moe(&r, 0), 1);
    assert_int_equal(model_config_layer_moe(&r, 1), 0);
    /* the fixture GGUF (6 experts) with qwen3moe.expert_count rewritten in place (u32) */
    char src[512], tmp[] = "/tmp/dl_moe_ggufXXXXXX", dst[600];
    path_of(src, sizeof src, "qwen3_moe.gguf");
    assert_non_null(mkdtemp(tmp));
    snprintf(dst, sizeof dst, "%s/bad.gguf", tmp);
    static const uint32_t counts[] = {16, 0};
    for (int i = 0; i < 2; i++) {
        copy_file_or_fail(src, dst);
        FILE *f = fopen(dst, "r+b");
        assert_non_null(f);
        static char buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf, f);
        const char *key = "qwen3moe.expert_count";
        char *at = memmem(buf, n, key, strlen(key));
        assert_non_null(at);
        uint32_t type, was;
        memcpy(&type, at + strlen(key), 4);
        memcpy(&was, at + strlen(key) + 4, 4);
        assert_int_equal(type, 4);   /* GGUF_TYPE_UINT32 */
        assert_int_equal(was, 6);
        assert_int_equal(fseek(f, (long)(at - buf + strlen(key) + 4), SEEK_SET), 0);
        assert_int_equal(fwrite(&counts[i], 4, 1, f), 1);
        assert_int_equal(fclose(f), 0);
        ops_ctx_t c;
        ops_cpu_init(&c, 0);
        target_opts_t o = {.max_tokens = 16, .max_seqs = 1};
        target_t *t = NULL;
        assert_int_equal(target_load(dst, &c, &o, &t), DL_EFORMAT);
        printf("  %s\n", dl_errmsg());
        assert_non_null(strstr(dl_errmsg(), "bad.gguf"));
        assert_non_null(strstr(dl_errmsg(), "expert_count"));
        ops_ctx_destroy(&c);
    }
    snprintf(j, sizeof j, "rm -rf '%s'", tmp);
    assert_int_equal(system(j), 0);
}

/* Writes src's tensors to dir/model.safetensors with every MoE layer's per-expert tensors
 * replaced by transformers 5's fused parameters: experts.gate_up_proj (E, 2Fm, D), expert
 * e's gate rows then its up rows, and experts.down_proj (E, D, Fm). swap: gate_up_proj
 * declared (E, D, 2Fm) instead (same bytes, a misshapen file). */
static void write_fused(const safetensors_t *src, const model_config_t *m, const char *dir, int swap) {
    char path[600], nm[160];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_writer_t *w = NULL;
    assert_int_equal(st_writer_new(path, &w), 0);
    size_t nt = safetensors_n_tensors(src);
    const char *dt = safetensors_tensor_at(src, 0)->dtype_name;
    for (size_t i = 0; i < nt; i++) {
        const st_tensor_t *t = safetensors_tensor_at(src, i);
        if (strstr(t->name, ".mlp.experts.")) continue;
        assert_int_equal(st_writer_add(w, t->name, t->dtype_name, t->n_dims, t->shape), 0);
    }
    int E = m->n_experts, D = m->D, Fm = m->moe_F;
    for (int l = 0; l < m->L; l++) {
        if (!model_config_layer_moe(m, l)) continue;
        int64_t gu[3] = {E, swap ? D : 2 * Fm, swap ? 2 * Fm : D}, dn[3] = {E, D, Fm};
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj", l);
        assert_int_equal(st_writer_add(w, nm, dt, 3, gu), 0);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj", l);
        assert_int_equal(st_writer_add(w, nm, dt, 3, dn), 0);
    }
    for (size_t i = 0; i < nt; i++) {
        const st_tensor_t *t = safetensors_tensor_at(src, i);
        if (!strstr(t->name, ".mlp.experts.")) assert_int_equal(st_writer_write(w, t->data, t->nbytes), 0);
    }
    static const char *parts[2][2] = {{"gate_proj", "up_proj"}, {"down_proj", NULL}};
    for (int l = 0; l < m->L; l++) {
        if (!model_config_layer_moe(m, l)) continue;
        for (int f = 0; f < 2; f++)
            for (int e = 0; e < E; e++)
                for (int j = 0; j < 2 && parts[f][j]; j++) {
                    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, parts[f][j]);
                    const st_tensor_t *t = safetensors_find(src, nm);
                    assert_non_null(t);
                    assert_int_equal(st_writer_write(w, t->data, t->nbytes), 0);
                }
    }
    assert_int_equal(st_writer_finish(&w), 0);
}

/* The fixture's experts in the fused layout (what transformers 5 holds in memory and what
 * a checkpoint saved without its conversion has) give HF's outputs and bit-identical
 * logits to the per-expert layout; a misshapen gate_up_proj is an error giving its shape. */
static void test_fused_layout(void **s) {
    (void)s;
    char dir[512], exp[600], src[600], dst[600];
    path_of(dir, sizeof dir, "qwen3_moe");
    snprintf(exp, sizeof exp, "%s/expected.safetensors", dir);
    model_config_t m;
    assert_int_equal(model_config_from_hf_dir(dir, &m), 0);
    char tmp[] = "/tmp/dl_moe_fusedXXXXXX";
    assert_non_null(mkdtemp(tmp));
    snprintf(src, sizeof src, "%s/config.json", dir);
    snprintf(dst, sizeof dst, "%s/config.json", tmp);
    copy_file_or_fail(src, dst);
    safetensors_t *st = NULL, *e = NULL;
    snprintf(src, sizeof src, "%s/model.safetensors", dir);
    assert_int_equal(safetensors_open(src, &st), 0);
    write_fused(st, &m, tmp, 1);
    {   /* misshapen: DL_EFORMAT naming the file, the tensor and its shape */
        ops_ctx_t c;
        ops_cpu_init(&c, 0);
        target_opts_t o = {.max_tokens = 16, .max_seqs = 1};
        target_t *t = NULL;
        assert_int_equal(target_load(tmp, &c, &o, &t), DL_EFORMAT);
        printf("  %s\n", dl_errmsg());
        char want[200];
        snprintf(want, sizeof want, "'model.layers.1.mlp.experts.gate_up_proj': shape (%d, %d, %d) (3 dims), "
                 "expected (%d, %d, %d)", m.n_experts, m.D, 2 * m.moe_F, m.n_experts, 2 * m.moe_F, m.D);
        assert_non_null(strstr(dl_errmsg(), tmp));
        assert_non_null(strstr(dl_errmsg(), want));
        ops_ctx_destroy(&c);
    }
    write_fused(st, &m, tmp, 0);
    safetensors_close(&st);
    /* the rewritten file really is fused: no per-expert tensor left */
    snprintf(dst, sizeof dst, "%s/model.safetensors", tmp);
    assert_int_equal(safetensors_open(dst, &st), 0);
    assert_non_null(safetensors_find(st, "model.layers.1.mlp.experts.gate_up_proj"));
    assert_null(safetensors_find(st, "model.layers.1.mlp.experts.0.gate_proj.weight"));
    safetensors_close(&st);
    assert_int_equal(safetensors_open(exp, &e), 0);
    size_t n;
    free(expected(e, "logits", &n));
    float *lp = check_forward(dir, e), *lf = check_forward(tmp, e);
    printf("  fused vs per-expert logits err %.2e\n", rel_err(lf, lp, n));
    assert_memory_equal(lf, lp, n * sizeof *lf);
    free(lp);
    free(lf);
    safetensors_close(&e);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    assert_int_equal(system(cmd), 0);
}

/* Writes src's tensors to dir/model.safetensors, without tensor `skip` (NULL: none) and with
 * tensor `swap`'s two dims declared swapped (same bytes; NULL: none). */
static void write_variant(const safetensors_t *src, const char *dir, const char *skip, const char *swap) {
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_writer_t *w = NULL;
    assert_int_equal(st_writer_new(path, &w), 0);
    size_t nt = safetensors_n_tensors(src);
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < nt; i++) {
            const st_tensor_t *t = safetensors_tensor_at(src, i);
            if (skip && !strcmp(t->name, skip)) continue;
            if (pass == 1) {
                assert_int_equal(st_writer_write(w, t->data, t->nbytes), 0);
                continue;
            }
            int64_t sh[ST_MAX_DIMS];
            memcpy(sh, t->shape, sizeof sh);
            if (swap && !strcmp(t->name, swap)) sh[0] = t->shape[1], sh[1] = t->shape[0];
            assert_int_equal(st_writer_add(w, t->name, t->dtype_name, t->n_dims, sh), 0);
        }
    assert_int_equal(st_writer_finish(&w), 0);
}

/* The HF per-expert tensors load into stacked buffers after every one was checked: a missing
 * expert tensor or one of the wrong shape is still DL_EFORMAT naming the tensor and the file,
 * and nothing leaks or is left half-uploaded (the target is destroyed cleanly). */
/* target_load of the model dir `dir` on CPU fails with DL_EFORMAT, its message naming dir and
 * holding want and (when not NULL) want2; no target is left. */
static void expect_load_error(const char *dir, const char *want, const char *want2) {
    ops_ctx_t c;
    ops_cpu_init(&c, 0);
    target_opts_t o = {.max_tokens = 16, .max_seqs = 1};
    target_t *t = NULL;
    assert_int_equal(target_load(dir, &c, &o, &t), DL_EFORMAT);
    printf("  %s\n", dl_errmsg());
    assert_null(t);
    assert_non_null(strstr(dl_errmsg(), dir));
    assert_non_null(strstr(dl_errmsg(), want));
    if (want2) assert_non_null(strstr(dl_errmsg(), want2));
    ops_ctx_destroy(&c);
}

static void test_expert_errors(void **s) {
    (void)s;
    char dir[512], src[600], dst[600];
    path_of(dir, sizeof dir, "qwen3_moe");
    model_config_t m;
    assert_int_equal(model_config_from_hf_dir(dir, &m), 0);
    char tmp[] = "/tmp/dl_moe_errXXXXXX";
    assert_non_null(mkdtemp(tmp));
    snprintf(src, sizeof src, "%s/config.json", dir);
    snprintf(dst, sizeof dst, "%s/config.json", tmp);
    copy_file_or_fail(src, dst);
    safetensors_t *st = NULL;
    snprintf(src, sizeof src, "%s/model.safetensors", dir);
    assert_int_equal(safetensors_open(src, &st), 0);
    const char *bad = "model.layers.5.mlp.experts.3.up_proj.weight";
    char want[2][200];
    snprintf(want[0], sizeof want[0], "'%s' missing", bad);
    snprintf(want[1], sizeof want[1], "'%s': shape (%d, %d) (2 dims), expected (%d, %d)", bad, m.D,
             m.moe_F, m.moe_F, m.D);
    for (int k = 0; k < 2; k++) {
        write_variant(st, tmp, k == 0 ? bad : NULL, k == 1 ? bad : NULL);
        expect_load_error(tmp, want[k], NULL);
    }
    /* the tensors intact, but config.json's experts set to 0: every layer is dense there, and the
     * error says the file holds a router (was only "'...mlp.gate_proj.weight' missing") */
    write_variant(st, tmp, NULL, NULL);
    snprintf(src, sizeof src, "%s/config.json", dir);
    FILE *f = fopen(src, "rb");
    assert_non_null(f);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *k = strstr(text, "\"num_local_experts\": ");
    assert_non_null(k);
    k += strlen("\"num_local_experts\": ");
    assert_true(*k >= '1' && *k <= '9' && k[1] == ',');   /* one digit (6) */
    *k = '0';
    f = fopen(dst, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    fclose(f);
    expect_load_error(tmp, "holds an MoE router ('model.layers.1.mlp.gate.weight')", "num_experts 0");
    safetensors_close(&st);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    assert_int_equal(system(cmd), 0);
}

/* target_stage_fill (what every safetensors tensor of a target goes through) against
 * st_tensor_to_{bf16,f32}_range of each part: BF16 (NaNs included), F32 and F16 parts end to
 * end, with staging pieces and conversion ranges smaller than, equal to and larger than a
 * part (a part straddling pieces, a piece ending on a part's end, the last short piece), two
 * fills in a row through the same stage (the staging buffers alternate across calls), and
 * nothing written past the destination. bf16 (ab 2) goes through the device path's staging
 * (host_alloc, upload_async: a plain copy on the CPU backend); f32 (ab 4) is the CPU path. */
static void test_stage_fill(void **s) {
    (void)s;
    char tmp[] = "/tmp/dl_moe_stageXXXXXX", path[600];
    assert_non_null(mkdtemp(tmp));
    snprintf(path, sizeof path, "%s/parts.safetensors", tmp);
    enum { NG = 3, NP = 5 };
    static const char *dt[NG] = {"BF16", "F32", "F16"};
    static const int64_t shp[NG][2] = {{7, 13}, {5, 11}, {3, 3}};
    st_writer_t *w = NULL;
    assert_int_equal(st_writer_new(path, &w), 0);
    char nm[32];
    for (int g = 0; g < NG; g++)
        for (int p = 0; p < NP; p++) {
            snprintf(nm, sizeof nm, "%s.%d", dt[g], p);
            assert_int_equal(st_writer_add(w, nm, dt[g], 2, shp[g]), 0);
        }
    int64_t odd[1] = {4};
    assert_int_equal(st_writer_add(w, "odd", "F32", 1, odd), 0);
    uint32_t x = 12345;
    for (int g = 0; g < NG; g++)
        for (int p = 0; p < NP; p++) {
            size_t nb = (size_t)shp[g][0] * shp[g][1] * (g == 1 ? 4 : 2);
            uint8_t *b = malloc(nb);
            for (size_t i = 0; i < nb; i++) b[i] = (uint8_t)((x = x * 1103515245u + 12345u) >> 16);
            if (g == 1)   /* keep F32 values finite and varied */
                for (size_t i = 0; i < nb / 4; i++) {
                    float v = (float)((int)(i * 37 + p * 11) % 201 - 100) / 7.0f;
                    memcpy(b + 4 * i, &v, 4);
                }
            assert_int_equal(st_writer_write(w, b, nb), 0);
            free(b);
        }
    float four[4] = {1, 2, 3, 4};
    assert_int_equal(st_writer_write(w, four, sizeof four), 0);
    assert_int_equal(st_writer_finish(&w), 0);
    safetensors_t *st = NULL;
    assert_int_equal(safetensors_open(path, &st), 0);
    ops_ctx_t c;
    ops_cpu_init(&c, 2);
    static const size_t pieces[] = {4, 6, 26, 182, 184, 4096, TARGET_STAGE_BYTES};
    static const size_t ranges[] = {1, 3, 91, 1 << 20};
    for (int g = 0; g < NG; g++) {
        const st_tensor_t *parts[NP];
        for (int p = 0; p < NP; p++) {
            snprintf(nm, sizeof nm, "%s.%d", dt[g], p);
            assert_non_null(parts[p] = safetensors_find(st, nm));
        }
        size_t pn = st_tensor_nelem(parts[0]), n = pn * NP;
        for (size_t ab = 2; ab <= 4; ab += 2) {
            uint8_t *want = malloc(n * ab), *got = malloc(2 * (n * ab + 16));
            for (int p = 0; p < NP; p++) {
                if (ab == 2) assert_int_equal(st_tensor_to_bf16_range(parts[p], 0, pn, (uint16_t *)want + p * pn), 0);
                else assert_int_equal(st_tensor_to_f32_range(parts[p], 0, pn, (float *)want + p * pn), 0);
            }
            for (size_t pi = 0; pi < sizeof pieces / sizeof pieces[0]; pi++)
                for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
                    target_stage_t sg;
                    target_stage_init(&sg, &c, ab);
                    sg.piece_bytes = pieces[pi];
                    sg.range_elems = ranges[ri];
                    memset(got, 0xab, 2 * (n * ab + 16));
                    uint8_t *d2 = got + n * ab + 16;
                    /* the first fill from part 1 on (an odd count), the second all parts */
                    assert_int_equal(target_stage_fill(&sg, path, parts + 1, NP - 1, got), 0);
                    assert_int_equal(target_stage_fill(&sg, path, parts, NP, d2), 0);
                    target_stage_release(&sg);
                    if (memcmp(got, want + pn * ab, (n - pn) * ab) || memcmp(d2, want, n * ab))
                        fail_msg("%s ab %zu piece %zu range %zu: wrong bytes", dt[g], ab, pieces[pi], ranges[ri]);
                    for (size_t i = (n - pn) * ab; i < n * ab + 16; i++) assert_int_equal(got[i], 0xab);
                    for (size_t i = n * ab; i < n * ab + 16; i++) assert_int_equal(d2[i], 0xab);
                }
            free(want);
            free(got);
        }
    }
    /* parts of different sizes are refused, naming both */
    const st_tensor_t *mixed[2] = {safetensors_find(st, "F32.0"), safetensors_find(st, "odd")};
    target_stage_t sg;
    target_stage_init(&sg, &c, 4);
    float out[64];
    assert_int_equal(target_stage_fill(&sg, path, mixed, 2, out), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "'odd'"));
    target_stage_release(&sg);
    ops_ctx_destroy(&c);
    safetensors_close(&st);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    assert_int_equal(system(cmd), 0);
}

/* Routing counts (bench_target's balance): per MoE layer they sum to T * k, dense layers
 * stay zero; off, a forward adds nothing; a dense target refuses. */
static void test_route_counts(void **s) {
    (void)s;
    char dir[512];
    path_of(dir, sizeof dir, "qwen3_moe");
    ops_ctx_t c;
    ops_cpu_init(&c, 0);
    target_opts_t o = {.max_tokens = 32, .max_seqs = 2};
    target_t *t = NULL;
    assert_int_equal(target_load(dir, &c, &o, &t), 0);
    const model_config_t *m = target_config(t);
    assert_null(target_moe_route_counts(t));
    assert_int_equal(target_moe_count_routes(t, 1), 0);
    int32_t ids[20], cu[3] = {0, 12, 20};
    for (int i = 0; i < 20; i++) ids[i] = (i * 37 + 5) % m->V;
    void *h = c.impl->malloc_(&c, (size_t)20 * m->D * 4);
    assert_int_equal(target_forward_host(t, ids, NULL, cu, 2, 20, NULL, h), 0);
    assert_int_equal(target_moe_count_routes(t, 0), 0);
    assert_int_equal(target_forward_host(t, ids, NULL, cu, 2, 20, NULL, h), 0);
    const int64_t *k = target_moe_route_counts(t);
    assert_non_null(k);
    for (int l = 0; l < m->L; l++) {
        int64_t sum = 0;
        for (int e = 0; e < m->n_experts; e++) sum += k[(size_t)l * m->n_experts + e];
        assert_int_equal(sum, model_config_layer_moe(m, l) ? 20 * m->top_k : 0);
    }
    double ratio[8];
    int worst;
    int64_t routed;
    double r = target_moe_balance(m, k, ratio, &worst, &routed);
    printf("  routing balance: worst layer %d max/mean %.2f, %lld routed\n", worst, r, (long long)routed);
    assert_true(r >= 1.0 && r <= m->n_experts);
    assert_true(worst == 1 || worst == 5);
    assert_int_equal(routed, 2 * 20 * m->top_k);
    assert_true(ratio[0] == 0 && ratio[worst] == r);
    c.impl->free_(&c, h);
    target_destroy(&t);
    /* a dense target has no counts */
    path_of(dir, sizeof dir, "qwen3_tied");
    assert_int_equal(target_load(dir, &c, &o, &t), 0);
    assert_int_equal(target_moe_count_routes(t, 1), DL_EINVAL);
    target_destroy(&t);
    ops_ctx_destroy(&c);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy decoding through the KV cache (prefill, then one token per step) gives HF's
 * generate(do_sample=False) tokens. */
static void test_greedy_kv(void **s) {
    (void)s;
    char dir[512], exp[600];
    path_of(dir, sizeof dir, "qwen3_moe");
    snprintf(exp, sizeof exp, "%s/expected.safetensors", dir);
    safetensors_t *e = NULL;
    assert_int_equal(safetensors_open(exp, &e), 0);
    const st_tensor_t *tp = safetensors_find(e, "greedy_prompt"), *tg = safetensors_find(e, "greedy");
    assert_non_null(tp);
    assert_non_null(tg);
    int np = (int)tp->shape[0], ng = (int)tg->shape[0];
    const int32_t *want = (const int32_t *)tg->data;
    ops_ctx_t c;
    ops_cpu_init(&c, 0);
    target_opts_t o = {.max_tokens = 64, .max_seqs = 2};
    target_t *t = NULL;
    assert_int_equal(target_load(dir, &c, &o, &t), 0);
    int V = target_config(t)->V, D = target_config(t)->D;
    target_kv_t *kv = NULL;
    assert_int_equal(target_kv_new(t, 1, 64, &kv), 0);
    void *lh = c.impl->malloc_(&c, (size_t)D * 4), *lg = c.impl->malloc_(&c, (size_t)V * 4);
    float *l = malloc((size_t)V * 4);
    int32_t slot = 0, start = 0, cu[2] = {0, np}, ids[64];
    memcpy(ids, tp->data, (size_t)np * 4);
    for (int i = 0; i < ng; i++) {
        assert_int_equal(target_forward_kv(t, kv, &slot, &start, cu, 1, ids + start, cu[1], lh, NULL), 0);
        target_logits(t, lg, lh, 1);
        c.impl->download_act(&c, l, lg, (size_t)V);
        start += cu[1];
        ids[start] = argmax(l, V);
        assert_int_equal(ids[start], want[i]);
        cu[1] = 1;
    }
    free(l);
    c.impl->free_(&c, lh);
    c.impl->free_(&c, lg);
    target_kv_destroy(&kv);
    target_destroy(&t);
    ops_ctx_destroy(&c);
    safetensors_close(&e);
}

/* moe_route / moe_permute / moe_combine on hand-made values. */
static void test_route_ops(void **s) {
    (void)s;
    ops_ctx_t c;
    ops_cpu_init(&c, 1);
    const ops_impl_t *o = c.impl;
    /* token 0: a three-way tie at 0.3 -> ids 1, 2 (lower ids first); token 1: all equal ->
     * 0, 1; token 2: distinct, descending order 3, 0 */
    float lg[3 * 4] = {0.1f, 0.3f, 0.3f, 0.3f, 0, 0, 0, 0, 0.5f, -1.0f, 0.2f, 2.0f};
    int32_t idx[6], off[5], tok[6], inv[6];
    float w[6];
    o->moe_route(&c, idx, w, lg, 3, 4, 2, 0);
    int32_t want_idx[6] = {1, 2, 0, 1, 3, 0};
    assert_memory_equal(idx, want_idx, sizeof want_idx);
    assert_true(fabsf(w[2] - 0.25f) < 1e-7f && fabsf(w[3] - 0.25f) < 1e-7f);
    double z = exp(0.5) + exp(-1.0) + exp(0.2) + exp(2.0);
    assert_true(fabs(w[4] - exp(2.0) / z) < 1e-6 && fabs(w[5] - exp(0.5) / z) < 1e-6);
    o->moe_route(&c, idx, w, lg, 3, 4, 2, 1);   /* renormalised */
    assert_true(fabsf(w[0] + w[1] - 1.0f) < 1e-6f && fabsf(w[2] - 0.5f) < 1e-6f);
    assert_true(fabs(w[4] - exp(2.0) / (exp(2.0) + exp(0.5))) < 1e-6);
    /* counting sort: expert 0 gets entries 2 (t1), 5 (t2); 1: 0 (t0), 3 (t1); 2: 1; 3: 4 */
    o->moe_permute(&c, off, tok, inv, idx, 3, 4, 2);
    int32_t want_off[5] = {0, 2, 4, 5, 6}, want_tok[6] = {1, 2, 0, 1, 0, 2}, want_inv[6] = {2, 4, 0, 3, 5, 1};
    assert_memory_equal(off, want_off, sizeof want_off);
    assert_memory_equal(tok, want_tok, sizeof want_tok);
    assert_memory_equal(inv, want_inv, sizeof want_inv);
    /* combine: y row r = (r, 10 r); out[t] = sum_j w * y[inv] */
    float y[6 * 2], out[3 * 2], wc[6] = {1, 2, 3, 4, 5, 6};
    for (int r = 0; r < 6; r++) { y[2 * r] = (float)r; y[2 * r + 1] = 10.0f * r; }
    o->moe_combine(&c, out, y, inv, wc, 3, 2, 2);
    float want_out[6] = {1 * 2 + 2 * 4, 10 * (1 * 2 + 2 * 4), 3 * 0 + 4 * 3, 10 * (3 * 0 + 4 * 3),
                         5 * 5 + 6 * 1, 10 * (5 * 5 + 6 * 1)};
    for (int i = 0; i < 6; i++) assert_true(fabsf(out[i] - want_out[i]) < 1e-5f);
    ops_ctx_destroy(&c);
}

/* mkmodel presets: Qwen3-30B-A3B's published sizes (30.5B total, 3.3B active), and the
 * tiny MoE preset writes a dir target_load runs. */
static void test_mkmodel_moe(void **s) {
    (void)s;
    model_config_t c;
    assert_int_equal(mkmodel_preset("qwen3-30b-a3b", &c), 0);
    assert_int_equal(model_config_validate(&c, "preset"), 0);
    assert_int_equal(model_config_n_moe_layers(&c), 48);
    uint64_t n = model_config_n_params(&c), a = model_config_n_active_params(&c);
    printf("  qwen3-30b-a3b: %.3f B parameters, %.3f B active\n", n / 1e9, a / 1e9);
    assert_true(n > 30.4e9 && n < 30.6e9);
    assert_true(a > 3.3e9 && a < 3.4e9);
    assert_int_equal(mkmodel_preset("tiny-qwen3-moe", &c), 0);
    char dir[] = "/tmp/dl_moe_mkXXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(mkmodel_write(&c, dir, 7, "bf16", 0, NULL), 0);
    model_config_t r;
    assert_int_equal(model_config_from_hf_dir(dir, &r), 0);
    assert_int_equal(r.n_experts, 8);
    assert_int_equal(model_config_n_params(&r), model_config_n_params(&c));
    ops_ctx_t oc;
    ops_cpu_init(&oc, 0);
    target_opts_t o = {.max_tokens = 16, .max_seqs = 1};
    target_t *t = NULL;
    assert_int_equal(target_load(dir, &oc, &o, &t), 0);
    assert_int_equal(target_weight_bytes(t), model_config_n_params(&c) * 4);
    int32_t ids[5] = {1, 2, 3, 4, 5}, cu[2] = {0, 5};
    void *h = oc.impl->malloc_(&oc, (size_t)5 * c.D * 4);
    assert_int_equal(target_forward_host(t, ids, NULL, cu, 1, 5, NULL, h), 0);
    oc.impl->free_(&oc, h);
    target_destroy(&t);
    ops_ctx_destroy(&oc);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_ops),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_hf_and_gguf),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_fused_layout),
        cmocka_unit_test(test_expert_errors),
        cmocka_unit_test(test_stage_fill),
        cmocka_unit_test(test_route_counts),
        cmocka_unit_test(test_greedy_kv),
        cmocka_unit_test(test_mkmodel_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
