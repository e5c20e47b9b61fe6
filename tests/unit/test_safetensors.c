/* common/format/safetensors: reading HF-written files (fixtures made by the Python
 * safetensors package via transformers: F32, BF16, F16, sharded index), the streaming
 * writer (round trip), dtype conversions, and malformed headers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/format/safetensors.h"

static const char *fixtures_dir(void) {
    const char *d = getenv("DL_FIXTURES_DIR");
    return d ? d : "tests/fixtures";
}

static void test_read_fixtures(void **s) {
    (void)s;
    char p[512];
    safetensors_t *st = NULL;
    /* sharded: 6 shards through the index, opened by directory */
    snprintf(p, sizeof p, "%s/target/qwen3_untied", fixtures_dir());
    assert_int_equal(safetensors_open(p, &st), 0);
    const st_tensor_t *t = safetensors_find(st, "model.layers.3.self_attn.q_norm.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_F32);
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->shape[0], 16);
    t = safetensors_find(st, "lm_head.weight");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 311);
    assert_int_equal(t->shape[1], 72);
    assert_int_equal(safetensors_n_tensors(st), 4 * 11 + 3);
    safetensors_close(&st);
    assert_null(st);
    /* BF16 checkpoint: values are bf16, converted exactly */
    snprintf(p, sizeof p, "%s/target/qwen2_tied/model.safetensors", fixtures_dir());
    assert_int_equal(safetensors_open(p, &st), 0);
    t = safetensors_find(st, "model.layers.0.self_attn.q_proj.bias");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_BF16);
    assert_string_equal(t->dtype_name, "BF16");
    float x[72];
    assert_int_equal(st_tensor_to_f32(t, x), 0);
    for (int i = 0; i < 72; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        assert_int_equal(u & 0xffff, 0);
        assert_true(fabsf(x[i]) < 1.0f);
    }
    safetensors_close(&st);
    /* expected.safetensors holds I32 tensors: listed, not convertible */
    snprintf(p, sizeof p, "%s/target/qwen2_tied/expected.safetensors", fixtures_dir());
    assert_int_equal(safetensors_open(p, &st), 0);
    t = safetensors_find(st, "ids");
    assert_non_null(t);
    assert_string_equal(t->dtype_name, "I32");
    assert_int_equal(st_tensor_to_f32(t, x), DL_ENOTSUP);
    assert_non_null(strstr(dl_errmsg(), "I32"));
    safetensors_close(&st);
}

static void test_conversions(void **s) {
    (void)s;
    /* f16: exact for representable values, RNE otherwise, subnormals, inf */
    assert_int_equal(st_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(st_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(st_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(st_f32_to_f16(1e6f), 0x7c00);
    assert_int_equal(st_f32_to_f16(5.960464477539063e-08f), 0x0001);
    assert_int_equal(st_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);            /* tie -> even */
    assert_int_equal(st_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);            /* tie -> even */
    for (uint32_t h = 0; h < 0x7c00; h++) {                                /* all finite halves */
        float f = st_f16_to_f32((uint16_t)h);
        assert_int_equal(st_f32_to_f16(f), h);
        assert_int_equal(st_f32_to_f16(-f), h | 0x8000);
    }
    assert_true(isinf(st_f16_to_f32(0x7c00)));
    assert_true(isnan(st_f16_to_f32(0x7e00)));
    /* bf16 */
    assert_int_equal(st_f32_to_bf16(1.0f), 0x3f80);
    assert_true(st_bf16_to_f32(0x3f80) == 1.0f);
    assert_int_equal(st_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);            /* tie -> even */
    assert_int_equal(st_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    assert_true(isnan(st_bf16_to_f32(st_f32_to_bf16(NAN))));
}

static void test_writer_roundtrip(void **s) {
    (void)s;
    char path[] = "/tmp/dl_test_st_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    st_writer_t *w = NULL;
    assert_int_equal(st_writer_new(path, &w), 0);
    int64_t s1[2] = {3, 5}, s2[1] = {7}, s3[2] = {2, 2};
    assert_int_equal(st_writer_add(w, "a.weight", "F32", 2, s1), 0);
    assert_int_equal(st_writer_add(w, "b", "BF16", 1, s2), 0);
    assert_int_equal(st_writer_add(w, "c", "F16", 2, s3), 0);
    assert_int_equal(st_writer_add(w, "bad", "Q4", 1, s2), DL_EINVAL);
    assert_int_equal(st_writer_meta(w, "format", "pt"), 0);
    float a[15];
    for (int i = 0; i < 15; i++) a[i] = (float)i * 0.5f - 3;
    assert_int_equal(st_writer_write(w, a, 7 * 4), 0);      /* in pieces */
    assert_int_equal(st_writer_write(w, a + 7, 8 * 4), 0);
    uint16_t b[7], c[4];
    for (int i = 0; i < 7; i++) b[i] = st_f32_to_bf16((float)i / 3);
    for (int i = 0; i < 4; i++) c[i] = st_f32_to_f16((float)i - 1.5f);
    assert_int_equal(st_writer_write(w, b, sizeof b), 0);
    assert_int_equal(st_writer_write(w, c, sizeof c), 0);
    assert_int_equal(st_writer_write(w, c, 2), DL_ERANGE);   /* more than declared */
    assert_int_equal(st_writer_finish(&w), 0);
    assert_null(w);
    safetensors_t *st = NULL;
    assert_int_equal(safetensors_open(path, &st), 0);
    assert_int_equal(safetensors_n_tensors(st), 3);
    const st_tensor_t *t = safetensors_find(st, "a.weight");
    assert_non_null(t);
    assert_int_equal(((uintptr_t)t->data - 8) % 8, 0);    /* data section 8-aligned */
    float x[15];
    assert_int_equal(st_tensor_to_f32(t, x), 0);
    assert_memory_equal(x, a, sizeof a);
    t = safetensors_find(st, "b");
    assert_int_equal(st_tensor_to_f32(t, x), 0);
    for (int i = 0; i < 7; i++) assert_true(x[i] == st_bf16_to_f32(b[i]));
    t = safetensors_find(st, "c");
    assert_int_equal(st_tensor_to_f32(t, x), 0);
    for (int i = 0; i < 4; i++) assert_true(x[i] == (float)i - 1.5f);
    safetensors_close(&st);
    /* a writer finished early is an error and leaves no file */
    unlink(path);
    assert_int_equal(st_writer_new(path, &w), 0);
    assert_int_equal(st_writer_add(w, "a", "F32", 2, s1), 0);
    assert_int_equal(st_writer_write(w, a, 8), 0);
    assert_int_equal(st_writer_finish(&w), DL_ESTATE);
    assert_int_equal(access(path, F_OK), -1);
}

static int open_bytes(const void *hdr, size_t hlen, size_t data_len) {
    char path[] = "/tmp/dl_test_st_bad_XXXXXX";
    int fd = mkstemp(path);
    uint64_t n = hlen;
    assert_int_equal(write(fd, &n, 8), 8);
    assert_int_equal(write(fd, hdr, hlen), (ssize_t)hlen);
    char z[64] = {0};
    assert_true(data_len <= sizeof z);
    assert_int_equal(write(fd, z, data_len), (ssize_t)data_len);
    close(fd);
    safetensors_t *st = NULL;
    int rc = safetensors_open(path, &st);
    if (rc == 0) safetensors_close(&st);
    else assert_null(st);
    unlink(path);
    return rc;
}

static void test_malformed(void **s) {
    (void)s;
#define BAD(h, n, code) do { assert_int_equal(open_bytes(h, strlen(h), n), code); \
                             assert_true(strlen(dl_errmsg()) > 0); } while (0)
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0);
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, DL_EFORMAT);  /* short */
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, DL_EFORMAT);  /* size */
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, DL_EFORMAT);
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, DL_EFORMAT);
    BAD("{\"a\":{\"dtype\":\"X9\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "X9"));
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, DL_EFORMAT);
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, DL_EFORMAT);  /* JSON */
    BAD("[1,2]", 0, DL_EFORMAT);
    /* header length past the end */
    char path[] = "/tmp/dl_test_st_len_XXXXXX";
    int fd = mkstemp(path);
    uint64_t n = 1000;
    assert_int_equal(write(fd, &n, 8), 8);
    close(fd);
    safetensors_t *st = NULL;
    assert_int_equal(safetensors_open(path, &st), DL_EFORMAT);
    unlink(path);
    assert_int_equal(safetensors_open("/nonexistent/dir", &st), DL_ENOENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_fixtures),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_writer_roundtrip),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
