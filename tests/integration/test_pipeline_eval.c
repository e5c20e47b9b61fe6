/* Training-time eval in the supervisor: `draftline run --eval-data PROMPTS
 * --eval-every 2` on CPU, multi-process, with the tiny random Llama-shaped target
 * of test_pipeline.c (made here; the real SmolLM2 vocabulary size) given the small
 * llama3_style fixture tokenizer (ids < 2506, inside the target's vocabulary) so
 * `draftline eval` can encode the prompts, and 300 GSM8K samples prepared with that
 * same tokenizer (`draftline run` refuses a cache of another tokenizer):
 *  - the run writes one {"stage":"eval"} line to metrics.jsonl for a checkpoint whose
 *    step is a multiple of 2, with a finite tau in [1, block size] over the 2
 *    prompts, eval/step_<S>.json exists, "eval step S: tau" is printed;
 *  - no process (the eval child included) and no shared-memory object is left;
 *  - the YAML keys eval_data / eval_every work like the flags;
 *  - a missing --eval-data file, --eval-every 0 and --eval-data without --eval-every
 *    are refused before anything starts;
 *  - eval's --drafter random --seed S is bitwise the drafter run --seed S starts from.
 * Each run has a hard timeout; the run's process group is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/base/rng.h"
#include "common/data/chat.h"
#include "common/data/prepare.h"
#include "common/data/tokenizer.h"
#include "common/model/config.h"
#include "common/format/safetensors.h"
#include "common/model/dflash_ckpt.h"
#include "common/model/drafter.h"
#include "common/ops/ops.h"
#include "common/pipe/model.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pf_fixture_t fx;
static char prompts[300];

static const char *fixtures_dir(void) {
    const char *d = getenv("DL_FIXTURES_DIR");
    return d ? d : "tests/fixtures";
}

/* ---- fixtures made once (the same tiny target and data as test_pipeline.c) ---- */

static int copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    int rc = in && out ? 0 : -1;
    char buf[65536];
    size_t n;
    while (rc == 0 && (n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) rc = -1;
    if (in) fclose(in);
    if (out && fclose(out) != 0) rc = -1;
    return rc;
}

static int group_setup(void **state) {
    (void)state;
    char gguf[1024];   /* the embedded model, as the other pipeline tests need it */
    if (paths_default_model(gguf, sizeof gguf) < 0 || access(gguf, R_OK) != 0) {
        fprintf(stderr, "embedded model missing (make model)\n");
        return -1;
    }
    if (pf_fixture_setup(&fx, "dlpe", 0) < 0) return -1;   /* the cache is made below */
    snprintf(fx.cache, sizeof fx.cache, "%s/gsm8k300.dlc", fx.root);
    snprintf(prompts, sizeof prompts, "%s/prompts.jsonl", fx.root);
    /* the eval needs a tokenizer and a chat template next to the target */
    const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        char from[1200], to[700];
        snprintf(from, sizeof from, "%s/tokenizer/llama3_style/%s", fixtures_dir(), files[i]);
        snprintf(to, sizeof to, "%s/%s", fx.model_dir, files[i]);
        if (copy_file(from, to) < 0) { fprintf(stderr, "fixture: copy %s failed\n", from); return -1; }
    }
    /* the training data in the target's own tokenizer (run refuses a cache of another) */
    if (pf_write_cache_tok(fx.root, 300, fx.cache, fx.model_dir) < 0) {
        fprintf(stderr, "fixture: %s\n", dl_errmsg());
        return -1;
    }
    FILE *f = fopen(prompts, "w");
    if (!f) return -1;
    fputs("{\"question_id\": 1, \"category\": \"writing\", \"turns\": [\"Write a short note about the sea.\"]}\n"
          "{\"question_id\": 2, \"category\": \"math\", \"turns\": [\"What is 12 times 7? Explain.\"]}\n", f);
    if (fclose(f) != 0) return -1;
    proc_watchdog(150);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* Runs `draftline run` with the tiny settings plus extra args (NULL-terminated) to its
 * end, output into log (pf_run_draftline: nothing of the run's process group may be
 * left; with run_id (17 bytes, or NULL) no shared-memory object of the run either, and
 * log tails on failure); returns the exit code, or a negative dl_err when a check failed. */
static int run_pipeline(const char *out, const char *log, char *run_id, int timeout_s, ...) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    int n = 0;
    a.argv[n++] = fx.exe;
    a.argv[n++] = "run";
    const char *fixed[] = {"--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                           "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                           "--drafter-layers", "1", "--lr", "3e-3", "--seed", "5",
                           "--progress-every", "1", "--out", out, NULL};
    for (int i = 0; fixed[i]; i++) a.argv[n++] = (char *)fixed[i];
    va_list ap;
    va_start(ap, timeout_s);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;) a.argv[n++] = (char *)s;
    va_end(ap);
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    return pf_run_draftline(&a, run_id ? out : NULL, timeout_s, run_id);
}

static void test_eval_at_checkpoints(void **state) {
    (void)state;
    char out[400], log[400], p[600];
    snprintf(out, sizeof out, "%s/a", fx.root);
    snprintf(log, sizeof log, "%s/a.out", fx.root);
    /* --eval-data and --eval-every through the YAML config (underscore keys) */
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/a.yaml", fx.root);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fprintf(f, "eval_data: %s\neval_every: 2\n", prompts);
    assert_int_equal(fclose(f), 0);
    char run_id[17] = "";   /* the run's shared-memory objects are checked with it */
    int code = run_pipeline(out, log, run_id, 100, "--max-steps", "40", "--save-every", "2", "--config", cfg,
                            "--eval-prompts", "2", "--eval-max-new-tokens", "8", NULL);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    assert_int_equal(code, 0);
    assert_true(run_id[0]);
    /* every eval child that was started is gone */
    int started = 0;
    for (const char *s = txt; (s = strstr(s, "started (pid ")) != NULL; s++) {
        pid_t pid = (pid_t)atoi(s + strlen("started (pid "));
        assert_true(pid > 0);
        assert_true(kill(pid, 0) != 0 && errno == ESRCH);
        started++;
    }
    assert_true(started >= 1);
    /* metrics.jsonl: an eval line for a step that is a multiple of 2, tau in [1, B] */
    snprintf(p, sizeof p, "%s/metrics.jsonl", out);
    char *m = pf_slurp(p, NULL);
    assert_non_null(m);
    int evals = 0;
    for (char *l = strtok(m, "\n"); l; l = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(l);
        assert_non_null(j);
        const cJSON *st = cJSON_GetObjectItem(j, "stage");
        if (cJSON_IsString(st) && !strcmp(st->valuestring, "eval")) {
            int step = (int)cJSON_GetObjectItem(j, "step")->valuedouble;
            double tau = cJSON_GetObjectItem(j, "tau")->valuedouble;
            assert_true(step > 0 && step < 40 && step % 2 == 0);
            assert_true(isfinite(tau) && tau >= 1.0 && tau <= 4.0);
            assert_int_equal((int)cJSON_GetObjectItem(j, "prompts")->valuedouble, 2);
            assert_true(cJSON_GetObjectItem(j, "new_tokens")->valuedouble >= 2);
            char line[64], jp[700];
            snprintf(line, sizeof line, "eval step %d: tau ", step);
            assert_non_null(strstr(txt, line));
            snprintf(jp, sizeof jp, "%s/eval/step_%d.json", out, step);
            assert_int_equal(access(jp, R_OK), 0);
            evals++;
        }
        cJSON_Delete(j);
    }
    free(m);
    free(txt);
    assert_true(evals >= 1);
}

static void test_eval_flags_validated(void **state) {
    (void)state;
    char out[400], log[400], missing[400];
    snprintf(out, sizeof out, "%s/b", fx.root);
    snprintf(log, sizeof log, "%s/b.out", fx.root);
    snprintf(missing, sizeof missing, "%s/no-such-prompts.jsonl", fx.root);
    assert_int_equal(run_pipeline(out, log, NULL, 30, "--max-steps", "2", "--eval-data", missing, "--eval-every", "2", NULL), 2);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "--eval-data"));
    free(txt);
    assert_int_equal(run_pipeline(out, log, NULL, 30, "--max-steps", "2", "--eval-data", prompts, "--eval-every", "0", NULL), 2);
    assert_int_equal(run_pipeline(out, log, NULL, 30, "--max-steps", "2", "--eval-data", prompts, NULL), 2);
    char steps[600];
    snprintf(steps, sizeof steps, "%s/steps.jsonl", out);
    assert_int_not_equal(access(steps, F_OK), 0);   /* nothing started */
}

/* `draftline eval --drafter random --seed S --drafter-layers L --block-size B` is the
 * reference "before training": it must be the very drafter `draftline run --seed S`
 * starts from. A run with --lr 0 (AdamW then changes nothing) saves that initial
 * drafter as step_1 (F32); eval's random drafter is built as cmd_eval builds it
 * (pipe_drafter_config + drafter_new with the seed), and the two must be bitwise
 * equal; another seed must differ. */
static void test_random_drafter_is_step0(void **state) {
    (void)state;
    char out[600], log[600], ck[700];
    snprintf(out, sizeof out, "%s/run-lr0", fx.root);
    snprintf(log, sizeof log, "%s/run-lr0.log", fx.root);
    assert_int_equal(run_pipeline(out, log, NULL, 60, "--max-steps", "1", "--lr", "0", NULL), 0);
    snprintf(ck, sizeof ck, "%s/checkpoints/step_1", out);
    model_config_t mc;
    drafter_config_t dc;
    assert_int_equal(pipe_target_config(fx.model_dir, &mc), 0);
    assert_int_equal(pipe_drafter_config(&mc, 1, 0, 4, &dc), 0);  /* run_pipeline: --drafter-layers 1 --block-size 4 */
    dc.loss_chunk_blocks = 1;
    ops_ctx_t ops;
    ops_cpu_init(&ops, 1);
    static const float no_embedding[1];
    drafter_t *ref = NULL, *other = NULL, *loaded = NULL;
    assert_int_equal(drafter_new(&ops, &dc, no_embedding, no_embedding, 1, 1, 5, &ref), 0);  /* --seed 5 */
    assert_int_equal(drafter_new(&ops, &dc, no_embedding, no_embedding, 1, 1, 6, &other), 0);
    assert_int_equal(drafter_new(&ops, &dc, no_embedding, no_embedding, 1, 1, 6, &loaded), 0);
    if (dflash_ckpt_load_weights(loaded, ck) < 0) fail_msg("%s", dl_errmsg());
    size_t P = drafter_n_params(ref);
    assert_true(P > 0);
    assert_memory_equal(drafter_master(loaded), drafter_master(ref), P * sizeof(float));
    assert_memory_not_equal(drafter_master(other), drafter_master(ref), P * sizeof(float));
    drafter_destroy(&ref);
    drafter_destroy(&other);
    drafter_destroy(&loaded);
    ops_ctx_destroy(&ops);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eval_flags_validated),
        cmocka_unit_test(test_eval_at_checkpoints),
        cmocka_unit_test(test_random_drafter_is_step0),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
