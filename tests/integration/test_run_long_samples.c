/* One --max-len default, the token budget, on a fresh run and on resume (issue 15 item 22).
 *
 * Synthetic samples of 1,500 to 3,500 words ({"text": ...}: every token trained; made here
 * from a fixed word list and a fixed LCG) are prepared with the embedded model's tokenizer;
 * the tiny target of test_pipeline trains on them with --token-budget 2304 and no --max-len,
 * 1 target + 1 drafter, --deterministic:
 *   A: 4 steps straight;
 *   B: A cut back to its step-2 checkpoint, then `run --resume B` alone (every setting
 *      taken from the checkpoint and its run, --max-len among them).
 * B's step 4 must be A's bit for bit (state.bin, model.safetensors, cursor.bin). The old loader
 * cut sequences at the batcher's own 2,048 tokens when --max-len was not given, while the
 * resume passed --max-len 2304: the resumed run packed the long samples differently (or was
 * refused, its cursor's options hash not matching).
 * Every child has a hard timeout and is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/paths.h"
#include "common/data/chat.h"
#include "common/data/prepare.h"
#include "common/data/tokenizer.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pf_fixture_t fx;

/* Writes n_samples {"text": ...} lines of 1,500..3,500 words into path. */
static int write_long_jsonl(const char *path, int n_samples) {
    static const char *words[] = {"the", "drafter", "learns", "from", "hidden", "states", "of", "a",
                                  "frozen", "target", "model", "while", "each", "micro-batch", "packs",
                                  "long", "samples", "into", "one", "token", "budget", "and", "numbers",
                                  "like", "42", "or", "1999", "appear", "in", "between"};
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    uint64_t x = 12345;
    for (int s = 0; s < n_samples; s++) {
        int n_words = 1500 + (int)((uint64_t)s * 2000 / (uint64_t)(n_samples > 1 ? n_samples - 1 : 1));
        fputs("{\"text\": \"", f);
        for (int w = 0; w < n_words; w++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            fprintf(f, "%s%s", w ? " " : "", words[(x >> 33) % (sizeof words / sizeof words[0])]);
            if ((x >> 20) % 17 == 0) fputs(".", f);
        }
        fputs("\"}\n", f);
    }
    return fclose(f) == 0 ? 0 : -1;
}

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlls", 0) < 0) return -1;
    proc_watchdog(560);
    /* the tiny target's context becomes 4096, so sequences of the whole 2304-token budget
     * are within it (the default --max-len: the budget, capped at the context) */
    char cfg[400];
    snprintf(cfg, sizeof cfg, "%s/config.json", fx.model_dir);
    size_t n;
    char *txt = pf_slurp(cfg, &n), *k = txt ? strstr(txt, "\"max_position_embeddings\"") : NULL;
    char *num = k ? strpbrk(k + 25, "0123456789") : NULL;
    if (!num || strncmp(num, "2048", 4) != 0) return free(txt), -1;
    memcpy(num, "4096", 4);
    FILE *f = fopen(cfg, "w");
    if (!f || fwrite(txt, 1, n, f) != n || fclose(f) != 0) return free(txt), -1;
    free(txt);
    char src[400], gguf[1024];
    snprintf(src, sizeof src, "%s/long.jsonl", fx.root);
    snprintf(fx.cache, sizeof fx.cache, "%s/long.dlc", fx.root);
    if (write_long_jsonl(src, 8) < 0 || paths_default_model(gguf, sizeof gguf) < 0) return -1;
    tok_t *t = NULL;
    chat_template_t ct;
    if (tok_load(gguf, &t) < 0 || chat_template_from_tok(t, &ct) < 0) return -1;
    prep_opts_t po;
    memset(&po, 0, sizeof po);
    po.data_path = src;
    po.chat = &ct;
    po.n_threads = 1;
    po.out_path = fx.cache;
    prep_stats_t st;
    int rc = prep_run(t, &po, &st);
    tok_destroy(&t);
    return rc < 0 ? -1 : 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* `draftline run` + args (NULL-terminated) to the end: its exit code (output on failure). */
static int run(const char *log, const char *out, const char *const *args, int timeout_s) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    int n = 0;
    a.argv[n++] = fx.exe;
    a.argv[n++] = "run";
    for (int i = 0; args[i]; i++) a.argv[n++] = (char *)args[i];
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    int code = pf_run_draftline(&a, out, timeout_s, NULL);
    if (code != 0) {
        char *t = pf_slurp(log, NULL);
        fprintf(stderr, "exit %d\n%s\n", code, t ? t : "");
        free(t);
    }
    return code;
}

/* A copy of run `from` as it was at its step-2 checkpoint (step_4 removed, latest and
 * steps.jsonl cut back), as test_run_resume_check makes one. */
static void cut_to_step2(const char *from, const char *to) {
    char cmd[2000], p[700];
    snprintf(cmd, sizeof cmd, "cp -r %s %s && rm -r %s/checkpoints/step_4 && echo step_2 > %s/checkpoints/latest",
             from, to, to, to);
    assert_int_equal(system(cmd), 0);
    snprintf(p, sizeof p, "%s/steps.jsonl", to);
    char *txt = pf_slurp(p, NULL), *third = txt ? strstr(txt, "{\"step\":2,") : NULL;
    assert_non_null(third);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(txt, 1, (size_t)(third - txt), f), (size_t)(third - txt));
    assert_int_equal(fclose(f), 0);
    free(txt);
}

static void test_resume_packs_as_uninterrupted(void **state) {
    (void)state;
    char a_dir[400], b_dir[400], log[500];
    snprintf(a_dir, sizeof a_dir, "%s/a", fx.root);
    snprintf(b_dir, sizeof b_dir, "%s/b", fx.root);
    const char *common[] = {"--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                            "--token-budget", "2304", "--block-size", "4", "--num-anchors", "8",
                            "--drafter-layers", "1", "--threads", "1", "--targets", "1", "--drafters", "1",
                            "--save-every", "2", "--deterministic", "--max-steps"};
    enum { NC = sizeof common / sizeof common[0] };
    const char *args[NC + 4];
    memcpy(args, common, sizeof common);
    args[NC] = "4"; args[NC + 1] = "--out"; args[NC + 2] = a_dir; args[NC + 3] = NULL;
    snprintf(log, sizeof log, "%s/a.console", fx.root);
    assert_int_equal(run(log, a_dir, args, 240), 0);
    /* the drafter worker keeps its MLP up projections here (they fit in the gradient memory
     * it does not hold): A ran that path; B (below) recomputes them, with A's bits */
    char dl[600];
    snprintf(dl, sizeof dl, "%s/logs/drafter0.log", a_dir);
    char *dtxt = pf_slurp(dl, NULL);
    assert_non_null(dtxt);
    if (!strstr(dtxt, "drafter: keeps the MLP up projections for the backward (1 layer(s),"))
        fail_msg("drafter0.log does not say it keeps the up projections:\n%s", dtxt);
    free(dtxt);
    cut_to_step2(a_dir, b_dir);
    /* B's drafter finds its last kept projection does not fit (its allocation fails, after
     * the others, as on a full device: test hook drafter.keep_up_enomem): it is made again
     * recomputing them, says so once, and its steps 2..3 give A's bits */
    const char *resume[] = {"--resume", b_dir, NULL};
    snprintf(log, sizeof log, "%s/b2.console", fx.root);
    setenv("DL_TEST_HOOKS", "drafter.keep_up_enomem=1", 1);
    int b_rc = run(log, b_dir, resume, 240);
    unsetenv("DL_TEST_HOOKS");
    assert_int_equal(b_rc, 0);
    snprintf(dl, sizeof dl, "%s/logs/drafter0.log", b_dir);
    dtxt = pf_slurp(dl, NULL);
    assert_non_null(dtxt);
    const char *retry = "allocation of ", *again = "; again, recomputing the MLP up projections";
    const char *hit = strstr(dtxt, again);
    if (!hit || !strstr(dtxt, retry) || strstr(hit + 1, again))
        fail_msg("drafter0.log of the resumed run does not show the retry once:\n%s", dtxt);
    free(dtxt);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, " --token-budget 2304 --max-len 2304 "));   /* taken from the checkpoint */
    free(txt);
    /* a micro-batch held more than 2,048 tokens: one sample cut at the 2304-token budget (every
     * sample is longer than 256 tokens, so two cut at the batcher's old 2,048 never fit) */
    char p[600];
    snprintf(p, sizeof p, "%s/steps.jsonl", a_dir);
    txt = pf_slurp(p, NULL);
    assert_non_null(txt);
    long most = 0, prev = 0;   /* "tokens" counts from the run's start: the step's are the difference */
    for (const char *t = strstr(txt, "\"tokens\":"); t; t = strstr(t + 1, "\"tokens\":")) {
        long v = strtol(t + 9, NULL, 10);
        if (v - prev > most) most = v - prev;
        prev = v;
    }
    free(txt);
    printf("largest micro-batch: %ld tokens\n", most);
    assert_true(most > 2048);
    const char *files[] = {"state.bin", "model.safetensors", "cursor.bin"};
    for (int i = 0; i < 3; i++) {
        char pa[600], pb[600];
        snprintf(pa, sizeof pa, "%s/checkpoints/step_4/%s", a_dir, files[i]);
        snprintf(pb, sizeof pb, "%s/checkpoints/step_4/%s", b_dir, files[i]);
        if (!pf_same_file(pa, pb)) fprintf(stderr, "%s and %s differ\n", pa, pb);
        assert_true(pf_same_file(pa, pb));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_packs_as_uninterrupted),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
