/* DFlash checkpoints (common/model/dflash_ckpt.c): the public layout written
 * by the PyTorch fixture script (tests/fixtures/drafter/{config.json,
 * model.safetensors}) loads into the C drafter and reproduces the torch loss;
 * F32 save/load is bitwise; BF16 save rounds to nearest even; the training
 * state round-trips; a save over an existing checkpoint replaces it atomically
 * (no .tmp/.old left); malformed inputs give named errors; the one-pass writer
 * (dflash_ckpt_save_host: CRC while writing, parallel bf16) writes the bytes of the
 * two-pass one (CRC first, then the writer), across its write chunks, F32 and BF16. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/model/dflash_ckpt.h"
#include "common/model/drafter.h"
#include "common/format/safetensors.h"
#include "tests/unit/test_ops_fixture.h"

static ops_ctx_t g_ctx;
static char g_tmp[256];

typedef struct {
    cJSON *fx;
    float *embed, *lm_head, *features;
    int32_t *cu, *ids, *anchors;
    uint8_t *mask;
    drafter_batch_t b;
} batch_fx_t;

static void batch_open(batch_fx_t *t) {
    t->fx = fx_load("drafter", "fixture");
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
    t->b = (drafter_batch_t){.T = fx_int(t->fx, "T"), .nseq = fx_int(t->fx, "nseq"),
                             .cu_seqlens = t->cu, .ids = t->ids, .loss_mask = t->mask,
                             .features = t->features, .n_blocks = (int)na, .anchors = t->anchors};
}

static void batch_close(batch_fx_t *t) {
    free(t->embed), free(t->lm_head), free(t->features), free(t->cu), free(t->ids);
    free(t->anchors), free(t->mask);
    cJSON_Delete(t->fx);
}

static void test_load_public_layout(void **state) {
    (void)state;
    drafter_config_t c;
    assert_int_equal(dflash_config_load("tests/fixtures/drafter", &c), 0);
    assert_int_equal(c.D, 16), assert_int_equal(c.n_layers, 2), assert_int_equal(c.H, 4);
    assert_int_equal(c.Hkv, 2), assert_int_equal(c.hd, 8), assert_int_equal(c.F, 24);
    assert_int_equal(c.V, 37), assert_int_equal(c.B, 4), assert_int_equal(c.mask_token_id, 1);
    assert_int_equal(c.n_feat, 3), assert_int_equal(c.n_target_layers, 8);
    assert_int_equal(c.target_layer_ids[0], 1), assert_int_equal(c.target_layer_ids[2], 5);
    assert_true(c.rope.theta == 10000.0 && !c.rope.llama3 && fabsf(c.rms_eps - 1e-6f) < 1e-12f);
    assert_true(c.gamma == 2.0f); /* default for B = 4 */
    batch_fx_t t;
    batch_open(&t);
    drafter_t *d;
    assert_int_equal(drafter_new(&g_ctx, &c, t.embed, t.lm_head, 32, 16, 1, &d), 0);
    assert_int_equal(dflash_ckpt_load_weights(d, "tests/fixtures/drafter"), 0);
    const cJSON *params = cJSON_GetObjectItem(t.fx, "params");
    for (int i = 0; i < drafter_n_tensors(d); i++) {
        const drafter_tensor_t *ten = drafter_tensor(d, i);
        float *want = fx_f32(params, ten->name, NULL);
        assert_memory_equal(drafter_master(d) + ten->offset, want, ten->numel * 4);
        free(want);
    }
    drafter_stats_t st;
    assert_int_equal(drafter_forward_backward(d, &t.b, 0, &st), 0);
    assert_true(fabs(st.loss_sum - fx_num(t.fx, "loss_sum")) <= 1e-5 * fx_num(t.fx, "loss_sum"));
    drafter_destroy(&d);
    batch_close(&t);
}

static void test_roundtrip(void **state) {
    (void)state;
    drafter_config_t c;
    assert_int_equal(dflash_config_load("tests/fixtures/drafter", &c), 0);
    c.gamma = 3.5f; /* draftline knob survives the round trip */
    c.rope.llama3 = 1, c.rope.factor = 8, c.rope.low_freq_factor = 1, c.rope.high_freq_factor = 4;
    c.rope.original_max_position_embeddings = 32;
    batch_fx_t t;
    batch_open(&t);
    drafter_t *d, *e;
    assert_int_equal(drafter_new(&g_ctx, &c, t.embed, t.lm_head, 32, 16, 11, &d), 0);
    size_t n = drafter_n_params(d);
    float *m = malloc(n * 4), *v = malloc(n * 4), *m2 = malloc(n * 4), *v2 = malloc(n * 4);
    float *w2 = malloc(n * 4);
    rng_t r;
    rng_seed(&r, 3);
    for (size_t i = 0; i < n; i++) m[i] = rng_normal(&r), v[i] = rng_uniform(&r);
    for (size_t i = 0; i < n; i++) drafter_master(d)[i] += 0.1f * rng_normal(&r);
    drafter_sync_weights(d);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/ckpt", g_tmp);
    dflash_train_state_t s = {.step = 17, .seed = 42, .next_mb = 123456789012345ull,
                              .master = drafter_master(d), .m = m, .v = v, .n_params = n};
    rng_seed(&s.rng, 77);
    rng_u64(&s.rng);
    assert_int_equal(dflash_ckpt_save(d, dir, "F32", &s), 0);
    /* again, over the existing directory */
    assert_int_equal(dflash_ckpt_save(d, dir, "F32", &s), 0);
    char p[400];
    struct stat sb;
    snprintf(p, sizeof p, "%s.tmp", dir);
    assert_int_not_equal(stat(p, &sb), 0);
    snprintf(p, sizeof p, "%s.old", dir);
    assert_int_not_equal(stat(p, &sb), 0);
    { /* config.json's torch_dtype names the stored dtype */
        snprintf(p, sizeof p, "%s/config.json", dir);
        FILE *cf = fopen(p, "rb");
        assert_non_null(cf);
        char cb[8192];
        size_t cn = fread(cb, 1, sizeof cb - 1, cf);
        fclose(cf);
        cb[cn] = 0;
        assert_non_null(strstr(cb, "\"torch_dtype\":\t\"float32\""));
    }
    drafter_config_t c2;
    assert_int_equal(dflash_config_load(dir, &c2), 0);
    assert_true(c2.gamma == 3.5f && c2.rope.llama3 && c2.rope.factor == 8 &&
                c2.rope.original_max_position_embeddings == 32);
    assert_int_equal(c2.B, c.B), assert_int_equal(c2.n_feat, c.n_feat);
    assert_memory_equal(c2.target_layer_ids, c.target_layer_ids, sizeof(int) * (size_t)c.n_feat);
    assert_int_equal(drafter_new(&g_ctx, &c2, t.embed, t.lm_head, 32, 16, 99, &e), 0);
    assert_int_equal(dflash_ckpt_load_weights(e, dir), 0);
    assert_memory_equal(drafter_master(e), drafter_master(d), n * 4);
    dflash_train_state_t s2;
    assert_int_equal(dflash_ckpt_load_state(dir, n, w2, m2, v2, &s2), 0);
    assert_true(s2.step == 17 && s2.seed == 42 && s2.next_mb == 123456789012345ull);
    assert_memory_equal(&s2.rng, &s.rng, sizeof s.rng);
    assert_memory_equal(w2, drafter_master(d), n * 4);
    assert_memory_equal(m2, m, n * 4);
    assert_memory_equal(v2, v, n * 4);
    assert_int_equal(dflash_ckpt_load_state(dir, n + 1, NULL, NULL, NULL, &s2), DL_EFORMAT);
    /* BF16: the file holds bf16 (round to nearest even) */
    assert_int_equal(dflash_ckpt_save(d, dir, "BF16", NULL), 0);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    safetensors_t *st;
    assert_int_equal(safetensors_open(p, &st), 0);
    assert_int_equal(safetensors_find(st, "layers.1.mlp.down_proj.weight")->dtype, ST_BF16);
    assert_null(safetensors_find(st, "embed_tokens.weight"));
    assert_int_equal(safetensors_n_tensors(st), (size_t)drafter_n_tensors(d));
    safetensors_close(&st);
    assert_int_equal(dflash_ckpt_load_weights(e, dir), 0);
    for (size_t i = 0; i < n; i++)
        assert_true(drafter_master(e)[i] == st_bf16_to_f32(st_f32_to_bf16(drafter_master(d)[i])));
    snprintf(p, sizeof p, "%s/training_state.json", dir);
    assert_int_not_equal(stat(p, &sb), 0); /* state not requested this time */
    assert_int_equal(dflash_ckpt_load_state(dir, n, NULL, NULL, NULL, &s2), DL_ENOENT);
    assert_int_equal(dflash_ckpt_save(d, dir, "F16x", NULL), DL_EINVAL);
    /* a drafter of another shape cannot load it */
    drafter_config_t c3 = c2;
    c3.F = 20;
    drafter_t *f;
    assert_int_equal(drafter_new(&g_ctx, &c3, t.embed, t.lm_head, 32, 16, 1, &f), 0);
    assert_int_equal(dflash_ckpt_load_weights(f, dir), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "mlp.gate_proj"));
    { /* one flipped byte in the data: refused before any weight is taken, naming the file */
        memcpy(w2, drafter_master(e), n * 4);
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        FILE *mf = fopen(p, "r+b");
        assert_non_null(mf);
        assert_int_equal(fseek(mf, -3, SEEK_END), 0);
        int ch = fgetc(mf);
        assert_int_equal(fseek(mf, -3, SEEK_END), 0);
        fputc(ch ^ 0x10, mf);
        fclose(mf);
        assert_int_equal(dflash_ckpt_load_weights(e, dir), DL_EFORMAT);
        assert_non_null(strstr(dl_errmsg(), "model.safetensors"));
        assert_memory_equal(drafter_master(e), w2, n * 4);
    }
    drafter_destroy(&f);
    drafter_destroy(&d);
    drafter_destroy(&e);
    free(m), free(v), free(m2), free(v2), free(w2);
    batch_close(&t);
}

/* `draftline inspect` on the fixture checkpoint: architecture and tensors,
 * exit 0; with num_hidden_layers edited to 3 (tensors hold 2): exit 1. */
static void test_inspect_cli(void **state) {
    (void)state;
    const char *bin = getenv("DL_BIN_DIR");
    if (!bin) { fprintf(stderr, "skip: DL_BIN_DIR not set (make test sets it)\n"); skip(); }
    char cmd[2048], buf[8192];
    snprintf(cmd, sizeof cmd, "%s/draftline inspect tests/fixtures/drafter 2>&1", bin);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    assert_int_equal(WEXITSTATUS(pclose(f)), 0);
    assert_non_null(strstr(buf, "2 layers, D 16, heads 4"));
    assert_non_null(strstr(buf, "target layers 1 3 5"));
    assert_non_null(strstr(buf, "mask token id 1"));
    assert_non_null(strstr(buf, "fc.weight"));
    assert_non_null(strstr(buf, "(16, 48)"));
    assert_non_null(strstr(buf, "6272"));
    snprintf(cmd, sizeof cmd,
             "cp -r tests/fixtures/drafter %s/bad3 && sed -i 's/\"num_hidden_layers\": *2/\"num_hidden_layers\": 3/' "
             "%s/bad3/config.json && grep -q '\"num_hidden_layers\": 3' %s/bad3/config.json",
             g_tmp, g_tmp, g_tmp);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/draftline inspect %s/bad3 >/dev/null 2>&1", bin, g_tmp);
    assert_int_equal(WEXITSTATUS(system(cmd)), 1);
    /* a JSONL file is not a checkpoint: said so (its first 8 bytes were reported as a
     * safetensors header length of ~7.6e18), exit 1 */
    char jl[1024];
    snprintf(jl, sizeof jl, "%s/data.jsonl", g_tmp);
    f = fopen(jl, "w");
    assert_non_null(f);
    fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s/draftline inspect %s 2>&1", bin, jl);
    f = popen(cmd, "r");
    assert_non_null(f);
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    assert_int_equal(WEXITSTATUS(pclose(f)), 1);
    assert_non_null(strstr(buf, "not a GGUF or safetensors checkpoint"));
    assert_non_null(strstr(buf, "not a safetensors file"));
}

static void test_bad_config(void **state) {
    (void)state;
    drafter_config_t c;
    assert_int_equal(dflash_config_from_json("[1]", "x.json", &c), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "not a JSON object"));
    assert_int_equal(dflash_config_from_json("{\n\"a\": 1,\n\"b\": }\n", "x.json", &c), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "x.json: invalid JSON at line 3"));
    const char *no_dflash = "{\"model_type\":\"qwen3\",\"hidden_size\":16}";
    assert_int_equal(dflash_config_from_json(no_dflash, "x.json", &c), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "dflash_config"));
    const char *no_heads =
        "{\"model_type\":\"qwen3\",\"hidden_size\":16,\"num_hidden_layers\":1,"
        "\"dflash_config\":{\"mask_token_id\":1}}";
    assert_int_equal(dflash_config_from_json(no_heads, "x.json", &c), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "num_attention_heads"));
    const char *llama = "{\"model_type\":\"llama\",\"dflash_config\":{}}";
    assert_int_equal(dflash_config_from_json(llama, "x.json", &c), DL_ENOTSUP);
    /* the C writer's text parses back */
    assert_int_equal(dflash_config_load("tests/fixtures/drafter", &c), 0);
    char *txt = dflash_config_to_json(&c);
    drafter_config_t c2;
    assert_int_equal(dflash_config_from_json(txt, "gen", &c2), 0);
    free(txt);
    assert_int_equal(c2.D, c.D), assert_int_equal(c2.V, c.V), assert_int_equal(c2.B, c.B);
    c2.mask_token_id = 99;
    txt = dflash_config_to_json(&c2);
    assert_int_equal(dflash_config_from_json(txt, "gen", &c), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "gen"));
    free(txt);
}

/* The old two-pass model.safetensors (CRC of the stored bytes first, then the writer). */
static void write_two_pass(const drafter_t *d, const float *host, const char *dtype, const char *path) {
    int bf16 = strcmp(dtype, "BF16") == 0;
    uLong crc = crc32_z(0, Z_NULL, 0);
    st_writer_t *w;
    assert_int_equal(st_writer_new(path, &w), 0);
    for (int pass = 0; pass < 2; pass++) {
        if (pass) {
            char hex[16];
            snprintf(hex, sizeof hex, "%08lx", (unsigned long)crc);
            assert_int_equal(st_writer_meta(w, "format", "pt"), 0);
            assert_int_equal(st_writer_meta(w, DFLASH_CRC_KEY, hex), 0);
            for (int i = 0; i < drafter_n_tensors(d); i++) {
                const drafter_tensor_t *t = drafter_tensor(d, i);
                assert_int_equal(st_writer_add(w, t->name, dtype, t->n_dims, t->shape), 0);
            }
        }
        for (int i = 0; i < drafter_n_tensors(d); i++) {
            const drafter_tensor_t *t = drafter_tensor(d, i);
            const void *b = host + t->offset;
            uint16_t *h = NULL;
            if (bf16) {
                h = malloc(t->numel * 2);
                for (size_t e = 0; e < t->numel; e++) h[e] = st_f32_to_bf16(host[t->offset + e]);
                b = h;
            }
            if (pass) assert_int_equal(st_writer_write(w, b, t->numel * (bf16 ? 2 : 4)), 0);
            else crc = crc32_z(crc, b, t->numel * (bf16 ? 2 : 4));
            free(h);
        }
    }
    assert_int_equal(st_writer_finish(&w), 0);
}

static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    static char ba[1 << 16], bb[1 << 16];
    while (same) {
        size_t na = fread(ba, 1, sizeof ba, fa), nb = fread(bb, 1, sizeof bb, fb);
        same = na == nb && memcmp(ba, bb, na) == 0;
        if (!na) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static void test_one_pass_bytes(void **state) {
    (void)state;
    drafter_config_t c;
    drafter_config_defaults(&c);
    /* fc (D, 5 D) = 21M elements: over a 64 MiB F32 write chunk and many CRC pieces */
    c.D = 2048, c.H = 2, c.Hkv = 1, c.hd = 64, c.F = 64, c.V = 37;
    c.n_target_layers = 8, c.max_position_embeddings = 64, c.rms_eps = 1e-6f;
    c.rope.theta = 10000.0;
    c.n_layers = 1, c.n_feat = 5;
    for (int i = 0; i < 5; i++) c.target_layer_ids[i] = i + 1;
    c.B = 4, c.mask_token_id = 1;
    static const float no_embedding[1];
    drafter_new_opts_t lo = {.layout_only = 1};
    drafter_t *d;
    assert_int_equal(drafter_new_opts(&g_ctx, &c, no_embedding, no_embedding, 1, 1, 5, &lo, &d), 0);
    size_t n = drafter_n_params(d);
    assert_true(n > (64u << 20) / 4);
    float *host = malloc(n * 4);
    rng_t r;
    rng_seed(&r, 9);
    for (size_t i = 0; i < n; i++) host[i] = rng_normal(&r);
    host[3] = 0.0f / 0.0f;   /* a NaN stays quiet in bf16 */
    const char *dtypes[2] = {"F32", "BF16"};
    for (int k = 0; k < 2; k++) {
        char dir[300], ref[400], got[400];
        snprintf(dir, sizeof dir, "%s/onepass", g_tmp);
        snprintf(ref, sizeof ref, "%s/ref.safetensors", g_tmp);
        snprintf(got, sizeof got, "%s/model.safetensors", dir);
        assert_int_equal(dflash_ckpt_save_host(d, host, dir, dtypes[k], NULL), 0);
        write_two_pass(d, host, dtypes[k], ref);
        assert_true(same_file(got, ref));
        int verified = 0;
        assert_int_equal(dflash_ckpt_verify_weights(dir, &verified), 0);
        assert_int_equal(verified, 1);
    }
    free(host);
    drafter_destroy(&d);
}

static int setup(void **state) {
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dl-ckpt-test-XXXXXX");
    return mkdtemp(g_tmp) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    ops_cpu_init(&g_ctx, 2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_public_layout),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_one_pass_bytes),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_inspect_cli),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    ops_ctx_destroy(&g_ctx);
    return rc;
}
