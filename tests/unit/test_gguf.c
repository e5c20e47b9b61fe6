/* common/format/gguf: metadata, tensor infos and dequantization checked against the gguf
 * Python package (tests/fixtures/gguf/make_fixtures.py): sha256 of the fp32 output of
 * gguf.quants.dequantize per tensor, bit for bit; malformed files give clean errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/base/rng.h"
#include "common/format/gguf.h"

/* ---- SHA-256 (FIPS 180-4), for comparing with Python's hashlib ---- */
typedef struct { uint32_t h[8]; uint8_t buf[64]; uint64_t len; size_t n; } sha256_t;
static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
static void sha256_block(sha256_t *s, const uint8_t *p) {
    uint32_t w[64], a[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(a, s->h, sizeof a);
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = a[7] + (ROR(a[4], 6) ^ ROR(a[4], 11) ^ ROR(a[4], 25)) +
                      ((a[4] & a[5]) ^ (~a[4] & a[6])) + K256[i] + w[i];
        uint32_t t2 = (ROR(a[0], 2) ^ ROR(a[0], 13) ^ ROR(a[0], 22)) +
                      ((a[0] & a[1]) ^ (a[0] & a[2]) ^ (a[1] & a[2]));
        memmove(a + 1, a, 7 * sizeof a[0]);
        a[4] += t1;
        a[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) s->h[i] += a[i];
}
static void sha256_init(sha256_t *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->len = 0;
    s->n = 0;
}
static void sha256_update(sha256_t *s, const void *data, size_t len) {
    const uint8_t *p = data;
    s->len += len;
    while (len) {
        if (s->n == 0 && len >= 64) { sha256_block(s, p); p += 64; len -= 64; continue; }
        size_t k = 64 - s->n < len ? 64 - s->n : len;
        memcpy(s->buf + s->n, p, k);
        s->n += k; p += k; len -= k;
        if (s->n == 64) { sha256_block(s, s->buf); s->n = 0; }
    }
}
static void sha256_hex(sha256_t *s, char out[65]) {
    uint64_t bits = s->len * 8;
    uint8_t pad = 0x80, z = 0, lenb[8];
    sha256_update(s, &pad, 1);
    while (s->n != 56) sha256_update(s, &z, 1);
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(s, lenb, 8);
    for (int i = 0; i < 8; i++) sprintf(out + 8 * i, "%08x", s->h[i]);
}

static const char *fixtures_dir(void) {
    const char *d = getenv("DL_FIXTURES_DIR");
    return d ? d : "tests/fixtures";
}

/* Checks every tensor listed in an expected file against gguf_dequantize. Returns count. */
static int check_tensors(gguf_t *g, const char *expected_path, int require_all) {
    FILE *f = fopen(expected_path, "r");
    assert_non_null(f);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char name[256], type[32], shape[128], sha[80];
        int off = 0;
        assert_int_equal(sscanf(line, "%255s %31s %127s %79s%n", name, type, shape, sha, &off), 4);
        const gguf_tensor_t *t = gguf_find_tensor(g, name);
        if (!t) fail_msg("tensor %s missing", name);
        assert_string_equal(ggml_type_name(t->type), type);
        char sh[128] = "", tmp[32];
        for (uint32_t d = 0; d < t->n_dims; d++) {
            snprintf(tmp, sizeof tmp, d ? ",%llu" : "%llu", (unsigned long long)t->ne[d]);
            strcat(sh, tmp);
        }
        assert_string_equal(sh, shape);
        uint64_t ne = gguf_tensor_nelem(t);
        float *x = malloc(ne * sizeof *x);
        assert_non_null(x);
        assert_int_equal(gguf_dequantize(t, x), 0);
        sha256_t s;
        char hex[65];
        sha256_init(&s);
        sha256_update(&s, x, ne * sizeof *x);
        sha256_hex(&s, hex);
        if (strcmp(hex, sha)) {
            /* report the first sample that differs, to make a failure explainable */
            fprintf(stderr, "%s (%s): sha256 %s != expected %s\n", name, type, hex, sha);
        }
        assert_string_equal(hex, sha);
        const char *p = line + off;
        unsigned long long idx;
        unsigned bits;
        int k;
        while (sscanf(p, " %llu:%x%n", &idx, &bits, &k) == 2) {
            uint32_t got;
            memcpy(&got, &x[idx], 4);
            assert_int_equal(got, bits);
            p += k;
        }
        free(x);
        n++;
    }
    fclose(f);
    if (require_all) assert_int_equal(n, (int)gguf_n_tensors(g));
    return n;
}

static void test_tiny_metadata(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/gguf/tiny.gguf", fixtures_dir());
    gguf_t *g = NULL;
    assert_int_equal(gguf_open(path, &g), 0);
    assert_int_equal(gguf_version(g), 3);
    uint64_t u;
    assert_int_equal(gguf_get_u64(g, "test.u32", &u), 0);
    assert_true(u == 4000000000ull);
    assert_int_equal(gguf_get_u64(g, "test.i32", &u), DL_EFORMAT); /* negative */
    assert_non_null(strstr(dl_errmsg(), "test.i32"));
    double d;
    assert_int_equal(gguf_get_f64(g, "test.f32", &d), 0);
    assert_true(d == 0.5);
    assert_int_equal(gguf_get_f64(g, "test.f64", &d), 0);
    assert_true(d == 1e-6);
    assert_int_equal(gguf_get_f64(g, "test.i32", &d), 0);
    assert_true(d == -7);
    assert_int_equal(gguf_get_u64(g, "test.bool", &u), 0);
    assert_true(u == 1);
    gguf_str_t s;
    assert_int_equal(gguf_get_str(g, "test.str", &s), 0);
    assert_int_equal(s.len, 6);
    assert_memory_equal(s.data, "h\xc3\xa9llo", 6);
    assert_int_equal(gguf_get_str(g, "general.architecture", &s), 0);
    assert_memory_equal(s.data, "llama", 5);
    assert_int_equal(gguf_get_str(g, "test.u32", &s), DL_EFORMAT);
    assert_int_equal(gguf_get_str(g, "nope", &s), DL_ENOENT);
    assert_non_null(strstr(dl_errmsg(), "nope"));
    gguf_str_t arr[3];
    assert_int_equal(gguf_get_str_array(g, "test.strs", arr, 3), 0);
    assert_int_equal(arr[0].len, 1);
    assert_int_equal(arr[1].len, 0);
    assert_int_equal(arr[2].len, 3);
    assert_memory_equal(arr[2].data, "ccc", 3);
    assert_int_equal(gguf_get_str_array(g, "test.strs", arr, 4), DL_ERANGE);
    int32_t iv[3];
    assert_int_equal(gguf_get_i32_array(g, "test.ints", iv, 3), 0);
    assert_int_equal(iv[0], 3);
    assert_int_equal(iv[1], -1);
    assert_int_equal(iv[2], 2);
    float fv[2];
    assert_int_equal(gguf_get_f32_array(g, "test.floats", fv, 2), 0);
    assert_true(fv[0] == 0.25f && fv[1] == -2.0f);
    assert_int_equal(gguf_get_f32_array(g, "test.strs", fv, 2), DL_EFORMAT);
    const gguf_kv_t *kv = gguf_find_kv(g, "test.ints");
    assert_non_null(kv);
    assert_int_equal(kv->type, GGUF_TYPE_ARRAY);
    assert_int_equal(kv->arr_len, 3);
    assert_int_equal(gguf_n_tensors(g), 8);
    assert_null(gguf_find_tensor(g, "absent"));
    gguf_close(&g);
    assert_null(g);
    gguf_close(&g); /* harmless */
}

static void test_tiny_dequant(void **state) {
    (void)state;
    char path[512], exp[512];
    snprintf(path, sizeof path, "%s/gguf/tiny.gguf", fixtures_dir());
    snprintf(exp, sizeof exp, "%s/gguf/tiny_expected.txt", fixtures_dir());
    gguf_t *g = NULL;
    assert_int_equal(gguf_open(path, &g), 0);
    assert_int_equal(check_tensors(g, exp, 1), 8);
    gguf_close(&g);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static int open_bytes(const unsigned char *b, size_t n, const char *tmp) {
    FILE *f = fopen(tmp, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
    gguf_t *g = NULL;
    int rc = gguf_open(tmp, &g);
    if (rc == 0) {
        /* a file that opens must be fully usable within its bounds */
        for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
            const gguf_tensor_t *t = gguf_tensor_at(g, i);
            if (gguf_tensor_nelem(t) > (1u << 20)) continue;
            float *x = malloc(gguf_tensor_nelem(t) * 4);
            gguf_dequantize(t, x);
            free(x);
        }
        gguf_close(&g);
    } else {
        assert_null(g);
        assert_true(strlen(dl_errmsg()) > 0);
    }
    return rc;
}

static void test_malformed(void **state) {
    (void)state;
    char path[512], tmp[] = "/tmp/dl_test_gguf_XXXXXX";
    snprintf(path, sizeof path, "%s/gguf/tiny.gguf", fixtures_dir());
    int fd = mkstemp(tmp);
    assert_true(fd >= 0);
    close(fd);
    size_t n;
    unsigned char *b = slurp(path, &n);
    /* every strict prefix is truncated somewhere: must fail with a format error */
    for (size_t len = 0; len < n; len += (len < 600 ? 1 : 97)) {
        int rc = open_bytes(b, len, tmp);
        if (rc != DL_EFORMAT) fail_msg("prefix of %zu bytes: rc %d (%s)", len, rc, dl_errmsg());
    }
    /* bad magic and version */
    unsigned char *c = malloc(n);
    memcpy(c, b, n);
    c[0] = 'X';
    assert_int_equal(open_bytes(c, n, tmp), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "magic"));
    memcpy(c, b, n);
    c[4] = 1;
    assert_int_equal(open_bytes(c, n, tmp), DL_ENOTSUP);
    /* huge tensor count */
    memcpy(c, b, n);
    memset(c + 8, 0xff, 8);
    assert_int_equal(open_bytes(c, n, tmp), DL_EFORMAT);
    /* random byte corruption in the header region never crashes */
    rng_t r;
    rng_seed(&r, 7);
    for (int it = 0; it < 2000; it++) {
        memcpy(c, b, n);
        int k = 1 + (int)rng_below(&r, 4);
        for (int j = 0; j < k; j++) c[rng_below(&r, 900)] = (unsigned char)rng_u64(&r);
        open_bytes(c, n, tmp);
    }
    free(c);
    free(b);
    unlink(tmp);
    gguf_t *g = NULL;
    assert_int_equal(gguf_open("/nonexistent/x.gguf", &g), DL_ENOENT);
    assert_non_null(strstr(dl_errmsg(), "/nonexistent/x.gguf"));
}

/* The embedded model: every tensor bit for bit against gguf.quants.dequantize. */
static void test_model_every_tensor(void **state) {
    (void)state;
    char model[1024], exp[512];
    assert_int_equal(paths_default_model(model, sizeof model), 0);
    if (access(model, R_OK) != 0) {
        fprintf(stderr, "skip: %s absent (run `make model`)\n", model);
        skip();
    }
    snprintf(exp, sizeof exp, "%s/gguf/smollm2_checksums.txt", fixtures_dir());
    gguf_t *g = NULL;
    assert_int_equal(gguf_open(model, &g), 0);
    assert_int_equal(check_tensors(g, exp, 1), 272);
    uint64_t L;
    assert_int_equal(gguf_get_u64(g, "llama.block_count", &L), 0);
    assert_int_equal(L, 30);
    gguf_close(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_metadata),
        cmocka_unit_test(test_tiny_dequant),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_model_every_tensor),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char model[1024];
    if (rc == 0 && (paths_default_model(model, sizeof model) < 0 || access(model, R_OK) != 0)) {
        fprintf(stderr, "SKIP: the embedded model is absent (run `make model`); its tests were skipped\n");
        return 77;
    }
    return rc;
}
