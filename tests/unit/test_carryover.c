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

/* 2 layers, 3 features, chunks of 3 blocks, capacity = batch A */
static void test_drafter(void **s) {
    (void)s;
    co_dopts_t o = {.V = 500, .n_layers = 2, .n_feat = 3, .chunk = 3};
    co_drafter_case(&g_cpu, &g_cpu, &o);
}
/* test_pipeline_gpu's drafter: V 49152, 1 layer, 1 feature, chunks of 16 blocks,
 * capacity 512 tokens / 512 blocks (--token-budget 512) */
static void test_drafter_pipeline_shapes(void **s) {
    (void)s;
    co_dopts_t o = {.V = 49152, .n_layers = 1, .n_feat = 1, .chunk = 16, .cap_T = 512,
                    .cap_blocks = 512};
    co_drafter_case(&g_cpu, &g_cpu, &o);
}
static void test_target_tiny_llama(void **s) { (void)s; co_target_tiny_llama(&g_cpu, &g_cpu); }
static void test_target_qwen3(void **s) { (void)s; co_target_qwen3(&g_cpu, &g_cpu); }

int main(void) {
    ops_cpu_init(&g_cpu, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drafter),
        cmocka_unit_test(test_drafter_pipeline_shapes),
        cmocka_unit_test(test_target_tiny_llama),
        cmocka_unit_test(test_target_qwen3),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ops_ctx_destroy(&g_cpu);
    return rc;
}
