/* safetensors range conversions (the fast target load, common/model/target.c load_st):
 * st_tensor_to_bf16_range is bitwise st_tensor_to_f32 then st_f32_to_bf16 (the CUDA
 * backend's upload_act rounding) for BF16 (every one of the 65,536 bit patterns, the
 * NaNs with their quiet bit clear included), F16 and F32 sources, at any offset;
 * st_tensor_to_f32_range is st_tensor_to_f32; another dtype is DL_ENOTSUP. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/format/safetensors.h"

static void check(const st_tensor_t *t, uint64_t n) {
    float *f = malloc(n * sizeof *f), *g = malloc(n * sizeof *g);
    uint16_t *ref = malloc(n * 2), *got = malloc(n * 2);
    assert_int_equal(st_tensor_to_f32(t, f), 0);
    for (uint64_t i = 0; i < n; i++) ref[i] = st_f32_to_bf16(f[i]);
    uint64_t cuts[] = {0, 1, 777, n / 2 + 3, n};
    for (size_t k = 0; k + 1 < sizeof cuts / sizeof cuts[0]; k++) {
        uint64_t a = cuts[k], m = cuts[k + 1] - a;
        assert_int_equal(st_tensor_to_bf16_range(t, a, m, got + a), 0);
        assert_int_equal(st_tensor_to_f32_range(t, a, m, g + a), 0);
    }
    assert_memory_equal(got, ref, n * 2);
    assert_memory_equal(g, f, n * 4);
    free(f); free(g); free(ref); free(got);
}

static void test_ranges(void **state) {
    (void)state;
    uint64_t n = 65536 + 4099;
    uint8_t *data = malloc(n * 4);
    st_tensor_t t = {.name = "x", .n_dims = 1, .shape = {(int64_t)n}, .data = data};
    /* BF16: every bit pattern, then random */
    rng_t r;
    rng_seed(&r, 3);
    uint16_t *h = (uint16_t *)data;
    for (uint64_t i = 0; i < n; i++) h[i] = i < 65536 ? (uint16_t)i : (uint16_t)rng_u64(&r);
    t.dtype = ST_BF16, t.nbytes = n * 2;
    snprintf(t.dtype_name, sizeof t.dtype_name, "BF16");
    check(&t, n);
    t.dtype = ST_F16;
    snprintf(t.dtype_name, sizeof t.dtype_name, "F16");
    check(&t, n);
    uint32_t *u = (uint32_t *)data;
    for (uint64_t i = 0; i < n; i++) u[i] = (uint32_t)rng_u64(&r);
    u[0] = 0x7f800001u;     /* a signalling NaN */
    u[1] = 0x3f808000u;     /* a tie, rounded to even */
    t.dtype = ST_F32, t.nbytes = n * 4;
    snprintf(t.dtype_name, sizeof t.dtype_name, "F32");
    check(&t, n);
    t.dtype = ST_OTHER;
    snprintf(t.dtype_name, sizeof t.dtype_name, "I64");
    assert_int_equal(st_tensor_to_bf16_range(&t, 0, 0, NULL), DL_ENOTSUP);
    assert_int_equal(st_tensor_to_f32_range(&t, 0, 0, NULL), DL_ENOTSUP);
    free(data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
