/* Speculative decoding with the embedded SmolLM2-135M-Instruct (CPU, one thread),
 * chat template applied, DFlash drafters of the pipeline's default shape (1 layer,
 * block size 8, target layer [15], mask token 16):
 *  - random weights: greedy output equals target-only greedy decoding token for token
 *    on several prompts;
 *  - a deliberately right drafter (a hook proposing the target's own greedy
 *    continuation): same output, tau == B except where the output ends;
 *  - a deliberately wrong drafter (every weight zero): same output, tau <= 1.1;
 *  - specdec_eval reports the greedy check as matched and its tau / histogram add up;
 *  - specdec_eval_checkpoint (training-time eval) on a saved checkpoint and a jsonl
 *    prompt file, and `draftline eval --drafter zero --json` end to end.
 * Exit 77 (skip) when the model file is absent (`make model`). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <string.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/data/chat.h"
#include "common/data/tokenizer.h"
#include "common/model/dflash_ckpt.h"
#include "common/model/generate.h"
#include "common/model/specdec.h"
#include "common/model/target.h"
#include "common/pipe/model.h"

enum { NP = 3, N = 24 };

static const char *const k_prompts[NP] = {
    "What is the capital of France?",
    "Write a Python function that returns the factorial of n.",
    "Tom has 3 apples and buys 5 more. How many apples does he have?",
};

typedef struct {
    ops_ctx_t c;
    tok_t *tok;
    target_t *t;
    drafter_t *d;
    drafter_config_t dc;
    tok_ids_t ids[NP];
    const int32_t *pp[NP];
    int pl[NP];
    int32_t *ref[NP];      /* target-only greedy outputs */
    int ref_len[NP];
    specdec_t *s;
} fx_t;

static int setup(void **state) {
    char model[1024];
    if (paths_default_model(model, sizeof model) < 0 || access(model, R_OK) != 0) {
        fprintf(stderr, "SKIP: the embedded model is absent (run `make model`)\n");
        exit(77);
    }
    fx_t *x = calloc(1, sizeof *x);
    ops_cpu_init(&x->c, 1);
    if (tok_load(model, &x->tok)) fail_msg("tokenizer: %s", dl_errmsg());
    chat_template_t ct;
    assert_int_equal(chat_template_from_tok(x->tok, &ct), 0);
    model_config_t mc;
    assert_int_equal(pipe_target_config(model, &mc), 0);
    assert_int_equal(pipe_drafter_config(&mc, 1, 0, 8, &x->dc), 0);
    int max_len = 0;
    for (int i = 0; i < NP; i++) {
        chat_msg_t m = {"user", k_prompts[i], strlen(k_prompts[i])};
        assert_int_equal(chat_encode_prompt(&ct, x->tok, &m, 1, &x->ids[i]), 0);
        x->pp[i] = x->ids[i].ids;
        x->pl[i] = (int)x->ids[i].n;
        if (x->pl[i] > max_len) max_len = x->pl[i];
    }
    target_opts_t o = {.max_tokens = 256, .max_seqs = NP, .n_capture = x->dc.n_feat};
    memcpy(o.capture_ids, x->dc.target_layer_ids, (size_t)x->dc.n_feat * sizeof(int));
    if (target_load(model, &x->c, &o, &x->t)) fail_msg("%s: %s", model, dl_errmsg());
    x->dc.loss_chunk_blocks = 1;
    assert_int_equal(drafter_new(&x->c, &x->dc, target_embed(x->t), target_lm_head(x->t), 1, 1, 123, &x->d), 0);
    assert_int_equal(specdec_new(x->t, x->d, max_len + N + 1, &x->s), 0);
    /* target-only greedy references, batched (batched == alone: test_generate) */
    generator_t *g = NULL;
    assert_int_equal(generator_new(x->t, NP, max_len + N + 1, &g), 0);
    gen_params_t gp;
    gen_params_default(x->t, &gp);
    gp.max_new_tokens = N;
    assert_int_equal(generator_run(g, &gp, NP, x->pp, x->pl, x->ref, x->ref_len, NULL, NULL, NULL), 0);
    generator_destroy(&g);
    *state = x;
    return 0;
}

static int teardown(void **state) {
    fx_t *x = *state;
    for (int i = 0; i < NP; i++) {
        tok_ids_free(&x->ids[i]);
        free(x->ref[i]);
    }
    specdec_destroy(&x->s);
    drafter_destroy(&x->d);
    target_destroy(&x->t);
    tok_destroy(&x->tok);
    ops_ctx_destroy(&x->c);
    free(x);
    return 0;
}

/* Greedy speculative decoding of every prompt; asserts equality with the
 * target-only reference and returns the summed stats. */
static specdec_stats_t run_all(fx_t *x, const char *what) {
    specdec_params_t sp;
    specdec_params_default(x->t, &sp);
    sp.max_new_tokens = N;
    specdec_stats_t tot;
    memset(&tot, 0, sizeof tot);
    for (int i = 0; i < NP; i++) {
        int32_t *out = NULL;
        int n = 0;
        specdec_stats_t st;
        if (specdec_run(x->s, &sp, x->pp[i], x->pl[i], &out, &n, &st)) fail_msg("%s: %s", what, dl_errmsg());
        if (n != x->ref_len[i] || memcmp(out, x->ref[i], (size_t)n * 4)) {
            int j = 0;
            while (j < n && j < x->ref_len[i] && out[j] == x->ref[i][j]) j++;
            fail_msg("%s: prompt %d differs from target-only greedy at token %d (lengths %d vs %d)",
                     what, i, j, n, x->ref_len[i]);
        }
        int64_t hs = 0, acc = 0;
        for (int m = 1; m <= x->dc.B; m++) hs += st.hist[m], acc += (int64_t)m * st.hist[m];
        assert_int_equal(hs, st.steps);
        assert_int_equal(acc, st.accepted);
        specdec_stats_add(&tot, &st);
        free(out);
    }
    fprintf(stderr, "%s: tau %.3f over %lld steps, %lld new tokens\n", what,
            (double)tot.accepted / tot.steps, (long long)tot.steps, (long long)tot.new_tokens);
    return tot;
}

static void test_random_drafter(void **state) {
    fx_t *x = *state;
    specdec_set_propose_hook(x->s, NULL, NULL);
    specdec_stats_t st = run_all(x, "random drafter");
    assert_true(st.steps > 0);
}

typedef struct {
    fx_t *x;
    int i;
} oracle_t;

static int oracle_hook(void *user, const int32_t *tokens, int n, int B, int32_t *draft) {
    const oracle_t *o = user;
    int plen = o->x->pl[o->i];
    (void)tokens;
    for (int k = 1; k < B; k++) {
        int j = n - plen + k - 1;
        draft[k] = j < o->x->ref_len[o->i] ? o->x->ref[o->i][j] : 0;
    }
    return 0;
}

static void test_oracle_drafter(void **state) {
    fx_t *x = *state;
    const int B = x->dc.B;
    specdec_params_t sp;
    specdec_params_default(x->t, &sp);
    sp.max_new_tokens = N;
    int64_t steps = 0, accepted = 0;
    for (int i = 0; i < NP; i++) {
        oracle_t o = {x, i};
        specdec_set_propose_hook(x->s, oracle_hook, &o);
        int32_t *out = NULL;
        int n = 0;
        specdec_stats_t st;
        assert_int_equal(specdec_run(x->s, &sp, x->pp[i], x->pl[i], &out, &n, &st), 0);
        assert_int_equal(n, x->ref_len[i]);
        assert_memory_equal(out, x->ref[i], (size_t)n * 4);
        /* every step but the last accepts the whole block */
        assert_true(st.hist[B] >= st.steps - 1);
        assert_int_equal(st.steps, (n - 1 + B - 1) / B);
        steps += st.steps;
        accepted += st.accepted;
        free(out);
    }
    specdec_set_propose_hook(x->s, NULL, NULL);
    double tau = (double)accepted / steps;
    fprintf(stderr, "oracle drafter: tau %.3f over %lld steps (B = %d)\n", tau, (long long)steps, B);
    assert_true(tau >= B - 1.0);
}

static void test_zero_drafter(void **state) {
    fx_t *x = *state;
    float *z = calloc(drafter_n_params(x->d), sizeof(float));
    float *keep = malloc(drafter_n_params(x->d) * sizeof(float));
    drafter_download_master(x->d, keep);
    drafter_upload_master(x->d, z);
    specdec_set_propose_hook(x->s, NULL, NULL);
    specdec_stats_t st = run_all(x, "zero drafter");
    double tau = (double)st.accepted / st.steps;
    assert_true(tau <= 1.1);
    drafter_upload_master(x->d, keep);
    free(z);
    free(keep);
}

static void test_eval_report(void **state) {
    fx_t *x = *state;
    specdec_eval_opts_t eo;
    specdec_eval_opts_default(&eo);
    eo.max_new_tokens = 12;
    specdec_eval_result_t r;
    assert_int_equal(specdec_eval(x->s, &eo, 2, x->pp, x->pl, &r), 0);
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.n_compared, 2);
    assert_int_equal(r.n_matched, 2);
    assert_int_equal(r.first_mismatch_prompt, -1);
    assert_int_equal(r.spec.new_tokens, r.base_new_tokens);
    assert_true(fabs(r.tau - (double)r.spec.accepted / r.spec.steps) < 1e-12);
    assert_true(r.spec_tok_s > 0 && r.base_tok_s > 0 && r.speedup > 0);
    char *js = specdec_result_json(&r, x->dc.B);
    assert_non_null(js);
    assert_non_null(strstr(js, "\"greedy_matched\":2"));
    free(js);
}

/* --timing-repeats: the counted run is one of the repeats, so every count equals
 * the single-run result (same seed, greedy) and only the times are medians;
 * max_seconds stops after the first prompt when already exceeded. */
static void test_eval_repeats(void **state) {
    fx_t *x = *state;
    specdec_eval_opts_t eo;
    specdec_eval_opts_default(&eo);
    eo.max_new_tokens = 12;
    specdec_eval_result_t r1, r3;
    assert_int_equal(specdec_eval(x->s, &eo, 2, x->pp, x->pl, &r1), 0);
    eo.timing_repeats = 3;
    assert_int_equal(specdec_eval(x->s, &eo, 2, x->pp, x->pl, &r3), 0);
    assert_int_equal(r1.timing_repeats, 1);
    assert_int_equal(r3.timing_repeats, 3);
    assert_int_equal(r3.n_prompts, 2);
    assert_int_equal(r3.n_matched, 2);
    assert_int_equal(r3.spec.steps, r1.spec.steps);
    assert_int_equal(r3.spec.accepted, r1.spec.accepted);
    assert_int_equal(r3.spec.new_tokens, r1.spec.new_tokens);
    assert_int_equal(r3.base_new_tokens, r1.base_new_tokens);
    assert_memory_equal(r3.spec.hist, r1.spec.hist, sizeof r1.spec.hist);
    assert_true(r3.spec.decode_s > 0 && r3.base_decode_s > 0);
    assert_false(r3.stopped_early);
    eo.timing_repeats = SPECDEC_MAX_REPEATS + 1;
    assert_int_equal(specdec_eval(x->s, &eo, 2, x->pp, x->pl, &r3), DL_EINVAL);
    eo.timing_repeats = 1;
    eo.max_seconds = 1e-9;
    assert_int_equal(specdec_eval(x->s, &eo, 2, x->pp, x->pl, &r3), 0);
    assert_int_equal(r3.n_prompts, 1);
    assert_true(r3.stopped_early);
    char *js = specdec_result_json(&r3, x->dc.B);
    assert_non_null(js);
    assert_non_null(strstr(js, "\"stopped_early\":true"));
    assert_non_null(strstr(js, "\"timing_repeats\":1"));
    free(js);
}

/* A prompt file in the MT-Bench layout with the test prompts. */
static void write_prompts(const char *path) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < NP; i++) fprintf(f, "{\"question_id\": %d, \"turns\": [\"%s\", \"More.\"]}\n", i, k_prompts[i]);
    fclose(f);
}

static void test_eval_checkpoint(void **state) {
    fx_t *x = *state;
    char dir[] = "/tmp/dl-test-specdec-XXXXXX", ck[128], pr[128], model[1024];
    assert_non_null(mkdtemp(dir));
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    snprintf(pr, sizeof pr, "%s/prompts.jsonl", dir);
    write_prompts(pr);
    assert_int_equal(dflash_ckpt_save(x->d, ck, "F32", NULL), 0);
    assert_int_equal(paths_default_model(model, sizeof model), 0);
    specdec_eval_opts_t eo;
    specdec_eval_opts_default(&eo);
    eo.max_new_tokens = 8;
    specdec_eval_result_t r;
    if (specdec_eval_checkpoint(model, ck, pr, 2, -1, 1, &eo, &r)) fail_msg("%s", dl_errmsg());
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.n_matched, 2);
    assert_true(r.tau >= 1.0 && r.spec.steps > 0);
    /* the command line, with the deliberately wrong drafter */
    const char *b = getenv("DL_BIN_DIR");
    char cmd[2048], js[160];
    snprintf(js, sizeof js, "%s/out.json", dir);
    snprintf(cmd, sizeof cmd, "%s/draftline eval --drafter zero --data %s --num-prompts 2 "
             "--max-new-tokens 8 --threads 1 --json %s > %s/stdout.txt 2>&1", b ? b : "bin", pr, js, dir);
    assert_int_equal(system(cmd), 0);
    { /* tau 1 cannot speed anything up: a speedup above 1 must carry the note */
        char sp[160], tx[8192];
        snprintf(sp, sizeof sp, "%s/stdout.txt", dir);
        FILE *so = fopen(sp, "r");
        assert_non_null(so);
        size_t k = fread(tx, 1, sizeof tx - 1, so);
        tx[k] = 0;
        fclose(so);
        const char *q = strstr(tx, "speedup ");
        assert_non_null(q);
        double su = atof(q + 8);
        if (su > 1.0) assert_non_null(strstr(tx, "timing unreliable: tau"));
        assert_non_null(strstr(tx, "per prompt the median of 3 timed runs"));  /* the default with baseline */
    }
    /* an unwritable --json fails before the evaluation */
    snprintf(cmd, sizeof cmd, "%s/draftline eval --drafter zero --data %s --json /nonexistent/x.json > /dev/null 2>&1",
             b ? b : "bin", pr);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
    FILE *f = fopen(js, "r");
    assert_non_null(f);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    assert_non_null(strstr(buf, "\"prompts\":2"));
    assert_non_null(strstr(buf, "\"greedy_matched\":2"));
    assert_non_null(strstr(buf, "\"tau\":1,"));  /* zero drafter: nothing accepted */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_drafter),
        cmocka_unit_test(test_oracle_drafter),
        cmocka_unit_test(test_zero_drafter),
        cmocka_unit_test(test_eval_report),
        cmocka_unit_test(test_eval_repeats),
        cmocka_unit_test(test_eval_checkpoint),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
