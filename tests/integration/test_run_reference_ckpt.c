/* The checkpoint of a --deterministic CPU run against one made by an earlier version of
 * draftline (issue 12: the structure changed, the math must not).
 *
 * tests/fixtures/pipeline/ref_step4/{state.bin,model.safetensors,cursor.bin} were written by
 * the code at commit 6209905 (before the supervisor/run-configuration redesign) with exactly
 * the run below: the tiny random Llama-shaped target of test_pipeline, the first 60 GSM8K
 * training samples, 2 targets + 2 drafters on CPU, 1 thread each, --max-steps 4
 * --save-every 2 --deterministic. The test runs the same command with the current code and
 * asserts that step_4's model.safetensors and cursor.bin are bitwise equal to the
 * reference, and that its training state is: state.bin is decoded on both sides
 * (ckpt_read; the reference is version 1 with master, m, v, the new one version 2 with m,
 * v and the master from model.safetensors), master, m and v bitwise equal, and the
 * header's fields (step, tokens, n_params, seed, skipped steps, K, schedule, settings,
 * target fingerprint) equal. The state.bin files themselves differ (format version).
 *
 * The CPU math goes through OpenBLAS, whose kernels depend on the CPU it picks at run time
 * (its "core name"); the reference was made with the kernels OpenBLAS picks here
 * (tests/fixtures/pipeline/ref_step4/corename). On a machine where OpenBLAS picks another
 * core the test says so and skips (a different kernel sums in another order, so bitwise
 * equality is not expected there), instead of failing for a reason that is not the code.
 * Before that, where the CPU has the instructions of the reference's core (an OpenBLAS
 * that does not know a newer CPU model falls back to an older core), the test runs itself
 * again with OPENBLAS_CORETYPE set to that core, so that the check still runs (main,
 * force_reference_core); the runs it starts inherit the setting. That overrides an
 * OPENBLAS_CORETYPE set in the environment (some machines set one for all programs), for
 * this test only, and says so.
 *
 * To write the reference anew (only when the math is meant to change, and say so in the
 * commit): DL_REF_WRITE=tests/fixtures/pipeline/ref_step4 build/tests/test_run_reference_ckpt.
 * Every child has a hard timeout and is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/model/dflash_ckpt.h"
#include "common/model/drafter.h"
#include "common/ops/ops.h"
#include "common/pipe/ckpt.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REF_DIR "tests/fixtures/pipeline/ref_step4"

extern char *openblas_get_corename(void);

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlrc", 60) < 0) return -1;
    proc_watchdog(280);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

static int copy_file(const char *from, const char *to) {
    size_t n;
    char *b = pf_slurp(from, &n);
    if (!b) return -1;
    FILE *f = fopen(to, "wb");
    int ok = f && fwrite(b, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    free(b);
    return ok ? 0 : -1;
}

/* The training state of checkpoint dir `got` is the one of `want` (either state.bin
 * version): header fields, master, m, v bitwise (decoded by ckpt_read with the drafter
 * table of got's config.json). */
static void same_state(const char *got, const char *want) {
    drafter_config_t dc;
    assert_int_equal(dflash_config_load(got, &dc), 0);
    ops_ctx_t ops;
    ops_cpu_init(&ops, 1);
    static const float no_embed[1];
    drafter_new_opts_t lo = {.layout_only = 1};
    drafter_t *d;
    assert_int_equal(drafter_new_opts(&ops, &dc, no_embed, no_embed, 1, 1, 0, &lo, &d), 0);
    size_t P = drafter_n_params(d);
    float *a[3], *b[3];
    for (int i = 0; i < 3; i++) assert_non_null((a[i] = malloc(P * 4)) && (b[i] = malloc(P * 4)));
    ckpt_state_hdr_t ha, hb;
    assert_int_equal(ckpt_read(got, d, &ha, a[0], a[1], a[2], NULL), 0);
    assert_int_equal(ckpt_read(want, d, &hb, b[0], b[1], b[2], NULL), 0);
    printf("state.bin version %u here, %u in the reference\n", ha.version, hb.version);
    assert_int_equal(ha.version, CKPT_VERSION);
    assert_int_equal(ha.crc_kind, CKPT_CRC32);
    /* every field from step to target_fp (the checksum fields follow it) */
    size_t lo_off = offsetof(ckpt_state_hdr_t, step), hi_off = offsetof(ckpt_state_hdr_t, crc_kind);
    assert_memory_equal((const char *)&ha + lo_off, (const char *)&hb + lo_off, hi_off - lo_off);
    assert_int_equal(ha.n_params, P);
    static const char *const what[3] = {"master", "Adam m", "Adam v"};
    for (int i = 0; i < 3; i++) {
        int same = memcmp(a[i], b[i], P * 4) == 0;
        if (!same) printf("%s/state: %s differs from the reference's\n", got, what[i]);
        assert_true(same);
        free(a[i]);
        free(b[i]);
    }
    drafter_destroy(&d);
}

static void test_step4_equals_reference(void **state) {
    (void)state;
    char corefile[300], want_core[64] = "";
    snprintf(corefile, sizeof corefile, "%s/corename", REF_DIR);
    const char *write_dir = getenv("DL_REF_WRITE");
    const char *core = openblas_get_corename();
    if (!write_dir) {
        size_t n;
        char *c = pf_slurp(corefile, &n);
        assert_non_null(c); /* the reference is committed; a missing one is a failure */
        snprintf(want_core, sizeof want_core, "%.*s", (int)strcspn(c, "\n"), c);
        free(c);
        if (strcasecmp(want_core, core) != 0) {
            printf("SKIP: OpenBLAS core '%s' here, the reference was made with '%s'\n", core, want_core);
            skip();
        }
    }
    char out[400], log[400];
    snprintf(out, sizeof out, "%s/ref", fx.root);
    snprintf(log, sizeof log, "%s/ref.out", fx.root);
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    const char *argv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache,
                          "--device", "cpu", "--targets", "2", "--drafters", "2", "--threads", "1",
                          "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                          "--drafter-layers", "1", "--lr", "3e-3", "--micro-batches-per-step", "2",
                          "--seed", "5", "--max-steps", "4", "--save-every", "2", "--deterministic",
                          "--progress-every", "1", "--out", out, NULL};
    for (int i = 0; argv[i]; i++) a.argv[i] = (char *)argv[i];
    snprintf(a.log, sizeof a.log, "%s", log);
    proc_t p;
    assert_int_equal(proc_spawn(&p, "draftline run", pf_run_child, &a), 0);
    char id[17];
    assert_int_equal(pf_run_finish(&p, a.log, out, 200, id), 0);

    const char *files[] = {"state.bin", "model.safetensors", "cursor.bin"};
    char got[600], want[600];
    if (write_dir) {
        for (int i = 0; i < 3; i++) {
            snprintf(got, sizeof got, "%s/checkpoints/step_4/%s", out, files[i]);
            snprintf(want, sizeof want, "%s/%s", write_dir, files[i]);
            assert_int_equal(copy_file(got, want), 0);
        }
        snprintf(want, sizeof want, "%s/corename", write_dir);
        FILE *f = fopen(want, "w");
        assert_non_null(f);
        fprintf(f, "%s\n", core);
        fclose(f);
        printf("reference written to %s (OpenBLAS core %s)\n", write_dir, core);
        return;
    }
    for (int i = 1; i < 3; i++) {   /* model.safetensors, cursor.bin: bytes */
        snprintf(got, sizeof got, "%s/checkpoints/step_4/%s", out, files[i]);
        snprintf(want, sizeof want, "%s/%s", REF_DIR, files[i]);
        int same = pf_same_file(got, want);
        if (!same) printf("%s differs from the reference %s\n", got, want);
        assert_true(same);
    }
    snprintf(got, sizeof got, "%s/checkpoints/step_4", out);
    same_state(got, REF_DIR);
}

/* 1 when this CPU has the instructions of OpenBLAS core `core` (Cooperlake, SkylakeX,
 * Haswell; the compiler's CPU detection), else 0 (another core or another architecture). */
static int cpu_runs_core(const char *core) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (!strcasecmp(core, "Cooperlake")) return avx512 && __builtin_cpu_supports("avx512bf16");
    if (!strcasecmp(core, "SkylakeX")) return avx512;
    if (!strcasecmp(core, "Haswell")) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    (void)core;
    return 0;
}

/* The reference's OpenBLAS core, forced by re-executing this test once with
 * OPENBLAS_CORETYPE set (OpenBLAS reads it when it loads), when OpenBLAS picked another
 * core here and the CPU has that core's instructions. Returns only if nothing is forced
 * (the test then compares or skips as the header says). */
static void force_reference_core(char **argv) {
    if (getenv("DL_REF_WRITE") || getenv("DL_REF_CORE_FORCED")) return;   /* once */
    size_t n;
    char *c = pf_slurp(REF_DIR "/corename", &n), want[64];
    if (!c) return;   /* the test itself fails on a missing reference */
    snprintf(want, sizeof want, "%.*s", (int)strcspn(c, "\n"), c);
    free(c);
    if (!strcasecmp(want, openblas_get_corename())) return;
    if (!cpu_runs_core(want)) return;
    const char *was = getenv("OPENBLAS_CORETYPE");
    char old[64];
    snprintf(old, sizeof old, "%s", was ? was : "");
    printf("OpenBLAS core '%s' here (OPENBLAS_CORETYPE%s%s); the CPU runs the reference's '%s': "
           "again with OPENBLAS_CORETYPE=%s\n", openblas_get_corename(), was ? "=" : " unset", old, want, want);
    fflush(stdout);
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("DL_REF_CORE_FORCED", "1", 1);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "re-exec with OPENBLAS_CORETYPE=%s: %s\n", want, strerror(errno));
    if (was) setenv("OPENBLAS_CORETYPE", old, 1); else unsetenv("OPENBLAS_CORETYPE");
    unsetenv("DL_REF_CORE_FORCED");
}

int main(int argc, char **argv) {
    (void)argc;
    force_reference_core(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step4_equals_reference),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
