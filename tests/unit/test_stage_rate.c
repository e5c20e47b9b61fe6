/* stage_rate (common/pipe/stage.h): the windowed rate of a cumulative counter that the
 * stages publish as tokens_per_s. A target that finishes one 1000-token micro-batch every
 * 3 s, sampled once a second, must publish about 1000/3 tokens/s at every sample once the
 * window has filled, never 0 between bursts (the per-publish rate it replaces did). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/pipe/stage.h"

#include <string.h>

static void test_bursts_never_zero(void **state) {
    (void)state;
    stage_rate_t r;
    memset(&r, 0, sizeof r);
    double tokens = 0;
    for (int s = 0; s <= 30; s++) {
        if (s > 0 && s % 3 == 0) tokens += 1000;
        double v = stage_rate(&r, (double)s, tokens, 5.0);
        if (s == 0) assert_true(v == 0);   /* one sample: no rate yet */
        if (s >= 6) {
            /* the window [s-5, s] holds one or two bursts: (1000 or 2000) / 5 s */
            double lo = 1000.0 / 5.0, hi = 2000.0 / 5.0;
            assert_true(v >= lo - 1e-9 && v <= hi + 1e-9);
        }
    }
}

static void test_steady_rate_exact_and_window(void **state) {
    (void)state;
    stage_rate_t r;
    memset(&r, 0, sizeof r);
    /* 250 tokens/s for 40 s (more samples than the ring holds), then stopped */
    double v = 0;
    for (int s = 0; s <= 40; s++) v = stage_rate(&r, (double)s, 250.0 * s, 5.0);
    assert_float_equal(v, 250.0, 1e-9);
    /* after it stops, the rate decays to 0 once the window holds no change */
    v = stage_rate(&r, 42.0, 250.0 * 40, 5.0);
    assert_float_equal(v, 250.0 * 3 / 5.0, 1e-9);   /* window [37, 42]: 3 s of 250 t/s over 5 s */
    v = stage_rate(&r, 46.0, 250.0 * 40, 5.0);
    assert_float_equal(v, 0.0, 1e-9);               /* window [41, 46] (samples 42, 46): no change */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bursts_never_zero),
        cmocka_unit_test(test_steady_rate_exact_and_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
