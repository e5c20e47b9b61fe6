/* Carry-over between consecutive calls on the CPU backend: the drafter's
 * forward_backward and the target's forward on a smaller batch after a larger one
 * give bitwise the results of a fresh model on the smaller batch alone (and of the
 * same model before the larger batch). Cases and their rationale:
 * tests/unit/carryover_cases.h (shared with tests/gpu/test_carryover_cuda.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/unit/carryover_cases.h"

static ops_ctx_t g_cpu;

static void test_drafter(void **s) { (void)s; co_drafter_case(&g_cpu, &g_cpu, 500); }
static void test_target_tiny_llama(void **s) { (void)s; co_target_tiny_llama(&g_cpu, &g_cpu); }
static void test_target_qwen3(void **s) { (void)s; co_target_qwen3(&g_cpu, &g_cpu); }

int main(void) {
    ops_cpu_init(&g_cpu, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drafter),
        cmocka_unit_test(test_target_tiny_llama),
        cmocka_unit_test(test_target_qwen3),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ops_ctx_destroy(&g_cpu);
    return rc;
}
