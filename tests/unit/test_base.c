/* common/base: error strings, flag parsing, rng determinism and distribution. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "common/base/cli.h"
#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/base/testhook.h"

#include <stdlib.h>

static void test_strerror(void **state) {
    (void)state;
    assert_string_equal(dl_strerror(DL_OK), "ok");
    assert_string_equal(dl_strerror(DL_EPROTO), "protocol error");
    assert_string_equal(dl_strerror(-999), "unknown error");
    assert_string_equal(dl_strerror(5), "unknown error");
    assert_int_equal(dl_seterr(DL_EINVAL, "field '%s'", "mb"), DL_EINVAL);
    assert_string_equal(dl_errmsg(), "field 'mb'");
    dl_wraperr(DL_EINVAL, "file.jsonl:%d", 3);
    assert_string_equal(dl_errmsg(), "file.jsonl:3: field 'mb'");
    /* a context the detail already starts with is not repeated */
    dl_seterr(DL_EFORMAT, "wrap.dlc: bad magic");
    assert_int_equal(dl_wraperr(DL_EFORMAT, "%s", "wrap.dlc"), DL_EFORMAT);
    assert_string_equal(dl_errmsg(), "wrap.dlc: bad magic");
    dl_wraperr(DL_EFORMAT, "wrap");       /* a prefix of the path is another context */
    assert_string_equal(dl_errmsg(), "wrap: wrap.dlc: bad magic");
}

static void test_cli(void **state) {
    (void)state;
    int v = 7;
    assert_int_equal(cli_parse_int("--n", "12", 0, 100, &v), 0);
    assert_int_equal(v, 12);
    assert_int_equal(cli_parse_int("--n", "12x", 0, 100, &v), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "--n"));
    assert_int_equal(cli_parse_int("--n", "101", 0, 100, &v), DL_ERANGE);
    assert_int_equal(cli_parse_int("--n", "", 0, 100, &v), DL_EINVAL);
    assert_int_equal(v, 12);
    double d;
    assert_int_equal(cli_parse_f64("--lr", "3e-4", 0, 1, &d), 0);
    assert_true(fabs(d - 3e-4) < 1e-12);
    assert_int_equal(cli_parse_f64("--lr", "nan", 0, 1, &d), DL_EINVAL);
    size_t b;
    assert_int_equal(cli_parse_gb("--inbox-gb", "1.5", 0, 1024, &b), 0);
    assert_int_equal(b, (size_t)1610612736);
    int list[4], n;
    assert_int_equal(cli_parse_int_list("--gpus", "0,1,3", 0, 7, list, 4, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(list[2], 3);
    assert_int_equal(cli_parse_int_list("--gpus", "0,9", 0, 7, list, 4, &n), DL_ERANGE);
}

static void test_rng(void **state) {
    (void)state;
    rng_t a, b;
    rng_seed(&a, 42);
    rng_seed(&b, 42);
    for (int i = 0; i < 100; i++) assert_int_equal(rng_u64(&a), rng_u64(&b));
    /* rng_below stays in range and hits every bucket roughly evenly. */
    int hist[10] = {0};
    for (int i = 0; i < 100000; i++) hist[rng_below(&a, 10)]++;
    for (int i = 0; i < 10; i++) assert_true(hist[i] > 9400 && hist[i] < 10600);
    /* normal: mean ~0, var ~1 over 1e5 draws (5 sigma bounds). */
    double s = 0, s2 = 0;
    for (int i = 0; i < 100000; i++) { double x = rng_normal(&a); s += x; s2 += x * x; }
    assert_true(fabs(s / 1e5) < 0.016);
    assert_true(fabs(s2 / 1e5 - 1.0) < 0.03);
    assert_true(rng_mix(1, 2, 3) != rng_mix(1, 3, 2));
    assert_int_equal(rng_mix(1, 2, 3), rng_mix(1, 2, 3));
    uint32_t idx[100];
    for (int i = 0; i < 100; i++) idx[i] = i;
    rng_shuffle_u32(&a, idx, 100);
    int seen[100] = {0};
    for (int i = 0; i < 100; i++) seen[idx[i]]++;
    for (int i = 0; i < 100; i++) assert_int_equal(seen[i], 1);
}

/* DL_TEST_HOOKS is parsed once: well-formed entries are found, malformed ones (no '=', not an
 * integer, a name with other characters) are skipped without hiding the others. */
static void test_testhook(void **state) {
    (void)state;
    setenv("DL_TEST_HOOKS", "nan_mb=4,bad,drafter0.stall_after_mbs=12,x=1y,Upper=3,neg=-7", 1);
    int64_t v = 99;
    assert_int_equal(testhook_i64("nan_mb", &v), 1);
    assert_int_equal(v, 4);
    assert_int_equal(testhook_i64("drafter0.stall_after_mbs", &v), 1);
    assert_int_equal(v, 12);
    assert_int_equal(testhook_i64("neg", &v), 1);
    assert_int_equal(v, -7);
    v = 99;
    assert_int_equal(testhook_i64("x", &v), 0);
    assert_int_equal(testhook_i64("Upper", &v), 0);
    assert_int_equal(testhook_i64("bad", &v), 0);
    assert_int_equal(testhook_i64("stall_after_mbs", &v), 0);
    assert_int_equal(v, 99);
    /* parsed once: a later change of the environment is not seen */
    setenv("DL_TEST_HOOKS", "late=1", 1);
    assert_int_equal(testhook_i64("late", &v), 0);
    unsetenv("DL_TEST_HOOKS");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_testhook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
