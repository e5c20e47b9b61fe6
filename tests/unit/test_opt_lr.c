/* The optimizer's learning-rate schedule (optimizer/opt_usage.c, opt_lr_at): linear warmup
 * to lr over `warmup` steps, then cosine decay to 10% of lr at the last step, held there
 * after. Values against the formula worked by hand. The file is compiled into this test
 * (the optimizer's objects are not in the library). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include "optimizer/opt_usage.c"

static void near(double got, double want) {
    if (fabs(got - want) > 1e-15 * fmax(1.0, fabs(want))) fail_msg("lr %.17g, want %.17g", got, want);
}

static void test_schedule(void **state) {
    (void)state;
    /* warmup 10 of 110 steps, lr 1e-3 */
    near(opt_lr_at(1e-3, 10, 110, 0), 1e-4);          /* (0 + 1) / 10 */
    near(opt_lr_at(1e-3, 10, 110, 4), 5e-4);
    near(opt_lr_at(1e-3, 10, 110, 9), 1e-3);
    near(opt_lr_at(1e-3, 10, 110, 10), 1e-3);         /* decay starts: cos(0) = 1 */
    /* halfway through the decay (p = 0.5 at step 10 + 99/2): 0.1 + 0.9 * 0.5 = 0.55 */
    near(opt_lr_at(1e-3, 10, 111, 60), 0.55e-3);      /* p = 50 / 100 */
    near(opt_lr_at(1e-3, 10, 110, 109), 1e-4);        /* the last step: 10% */
    near(opt_lr_at(1e-3, 10, 110, 500), 1e-4);        /* past the end: held */
    /* no warmup: step 0 is lr itself; a quarter of the way: 0.1 + 0.45 * (1 + cos(pi/4)) */
    near(opt_lr_at(2e-4, 0, 101, 0), 2e-4);
    near(opt_lr_at(2e-4, 0, 101, 25), 2e-4 * (0.1 + 0.45 * (1 + sqrt(0.5))));
    /* too few steps for a decay: lr after the warmup */
    near(opt_lr_at(1e-3, 5, 6, 5), 1e-3);
    near(opt_lr_at(1e-3, 0, 1, 0), 1e-3);
    near(opt_lr_at(1e-3, 5, 3, 2), 6e-4);             /* still warming up: 3 / 5 */
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_schedule)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
