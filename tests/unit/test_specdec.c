/* Speculative decoding (common/model/specdec, drafter_infer, prompts) on the tiny HF
 * fixture targets (tests/fixtures/target, made by transformers), CPU:
 *  - drafter_infer (context K/V cache, chunked appends, truncation) gives the block
 *    logits of drafter_forward + drafter_logits, the training forward (rel 1e-5);
 *  - target_forward_kv_feat (features through the KV cache, in chunks) gives the
 *    features of one full target_forward (rel 1e-5);
 *  - greedy: the output equals target-only greedy decoding (generator_run) token for
 *    token with a random drafter, and with an oracle drafter (a hook proposing the
 *    target's own greedy continuation) tau == B;
 *  - temperature > 0: the distribution of the first token decided by a verify step
 *    equals the target's exact marginal (computed by brute force over the first
 *    token) within 3x the expected sampling error, for a random drafter, a zero-weight
 *    drafter (uniform q: accepted with probability min(1, V p)) and a hook that always
 *    proposes one fixed token (an "always accept" bug would be off by ~0.7 in total
 *    variation there);
 *  - prompt sets: MT-Bench / HumanEval / GSM8K / OpenAI / ShareGPT records parsed
 *    by their fields.
 * The embedded-model checks live in test_specdec_smollm2.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/data/prompts.h"
#include "common/model/drafter.h"
#include "common/model/drafter_infer.h"
#include "common/model/generate.h"
#include "common/model/specdec.h"
#include "common/model/target.h"

static const char *fixtures_dir(void) {
    const char *d = getenv("DL_FIXTURES_DIR");
    return d ? d : "tests/fixtures";
}

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= num)) num = d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return den > 0 ? num / den : num;
}

typedef struct {
    ops_ctx_t c;
    target_t *t;
    drafter_t *d;
    drafter_config_t dc;
} tiny_t;

/* The qwen3_tied fixture target capturing layers {1, 3}, and a 2-layer drafter
 * with block size B and random weights (seed). */
static void tiny_open(tiny_t *x, int B, int max_tokens, int max_seqs, uint64_t seed) {
    ops_cpu_init(&x->c, 1);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/target/qwen3_tied", fixtures_dir());
    target_opts_t o = {.max_tokens = max_tokens, .max_seqs = max_seqs, .n_capture = 2, .capture_ids = {1, 3}};
    if (target_load(dir, &x->c, &o, &x->t)) fail_msg("%s: %s", dir, dl_errmsg());
    drafter_config_defaults(&x->dc);
    drafter_config_from_target(&x->dc, target_config(x->t));
    x->dc.n_layers = 2;
    x->dc.n_feat = 2;
    x->dc.target_layer_ids[0] = 1;
    x->dc.target_layer_ids[1] = 3;
    x->dc.B = B;
    x->dc.mask_token_id = 7;
    assert_int_equal(drafter_config_finish(&x->dc), 0);
    if (drafter_new(&x->c, &x->dc, target_embed(x->t), target_lm_head(x->t), 64, 8, seed, &x->d))
        fail_msg("drafter_new: %s", dl_errmsg());
}

static void tiny_close(tiny_t *x) {
    drafter_destroy(&x->d);
    target_destroy(&x->t);
    ops_ctx_destroy(&x->c);
}

static void test_infer_matches_forward(void **state) {
    (void)state;
    enum { B = 4, T = 20, NB = 4 };
    tiny_t x;
    tiny_open(&x, B, 64, 4, 11);
    const int V = x.dc.V, Df = x.dc.n_feat * x.dc.D;
    rng_t r;
    rng_seed(&r, 3);
    float *feat = malloc((size_t)T * Df * 4);
    int32_t ids[T];
    uint8_t mask[T];
    for (int i = 0; i < T * Df; i++) feat[i] = rng_normal(&r);
    for (int i = 0; i < T; i++) ids[i] = (int32_t)rng_below(&r, (uint64_t)V), mask[i] = 1;
    int32_t cu[2] = {0, T}, anchors[NB] = {0, 5, 13, 19};
    drafter_batch_t b = {.T = T, .nseq = 1, .cu_seqlens = cu, .ids = ids, .loss_mask = mask,
                         .features = feat, .n_blocks = NB, .anchors = anchors};
    assert_int_equal(drafter_forward(x.d, &b), 0);
    float *ref = malloc((size_t)NB * B * V * 4), *got = malloc((size_t)(B - 1) * V * 4);
    assert_int_equal(drafter_logits(x.d, 0, NB, ref), 0);

    drafter_infer_t *di = NULL;
    assert_int_equal(drafter_infer_new(&x.c, x.d, target_embed(x.t), target_lm_head(x.t), 32, 7, &di), 0);
    assert_int_equal(drafter_infer_append(di, feat, 9), 0);              /* 7 + 2 rows */
    assert_int_equal(drafter_infer_append(di, feat + (size_t)9 * Df, T - 9), 0);
    assert_int_equal(drafter_infer_len(di), T);
    for (int j = 0; j < NB; j++) {
        assert_int_equal(drafter_infer_block(di, ids[anchors[j]], anchors[j], got), 0);
        double e = rel_err(got, ref + ((size_t)j * B + 1) * V, (size_t)(B - 1) * V);
        if (e > 1e-5) fail_msg("block at anchor %d: rel err %.3g", anchors[j], e);
    }
    /* drop rows 10.. (rejected tokens), re-append: the same logits again */
    assert_int_equal(drafter_infer_truncate(di, 10), 0);
    assert_int_equal(drafter_infer_block(di, ids[5], 5, got), 0);
    assert_true(rel_err(got, ref + ((size_t)1 * B + 1) * V, (size_t)(B - 1) * V) <= 1e-5);
    assert_int_equal(drafter_infer_block(di, ids[13], 13, got), DL_ERANGE);  /* beyond the context */
    assert_int_equal(drafter_infer_append(di, feat + (size_t)10 * Df, T - 10), 0);
    assert_int_equal(drafter_infer_block(di, ids[13], 13, got), 0);
    assert_true(rel_err(got, ref + ((size_t)2 * B + 1) * V, (size_t)(B - 1) * V) <= 1e-5);
    assert_int_equal(drafter_infer_append(di, feat, 32 - T + 1), DL_ERANGE); /* capacity */
    /* a changed context row at or after the anchor must not matter; before it must */
    drafter_infer_reset(di);
    float *feat2 = malloc((size_t)T * Df * 4);
    memcpy(feat2, feat, (size_t)T * Df * 4);
    for (int i = 0; i < Df; i++) feat2[(size_t)13 * Df + i] += 1.0f;
    assert_int_equal(drafter_infer_append(di, feat2, T), 0);
    assert_int_equal(drafter_infer_block(di, ids[13], 13, got), 0);
    assert_true(rel_err(got, ref + ((size_t)2 * B + 1) * V, (size_t)(B - 1) * V) <= 1e-5);
    assert_int_equal(drafter_infer_block(di, ids[19], 19, got), 0);
    assert_true(rel_err(got, ref + ((size_t)3 * B + 1) * V, (size_t)(B - 1) * V) > 1e-3);
    drafter_infer_destroy(&di);
    free(feat2);
    free(feat);
    free(ref);
    free(got);
    tiny_close(&x);
}

static void test_kv_feat_matches_full(void **state) {
    (void)state;
    enum { L = 17 };
    tiny_t x;
    tiny_open(&x, 4, 32, 2, 1);
    const model_config_t *m = target_config(x.t);
    const int W = 2 * m->D;
    int32_t ids[L];
    rng_t r;
    rng_seed(&r, 9);
    for (int i = 0; i < L; i++) ids[i] = (int32_t)rng_below(&r, (uint64_t)m->V);
    float *full = malloc((size_t)L * W * 4), *inc = malloc((size_t)L * W * 4);
    int32_t cu[2] = {0, L};
    assert_int_equal(target_forward_host(x.t, ids, NULL, cu, 1, L, full, NULL), 0);
    target_kv_t *kv = NULL;
    assert_int_equal(target_kv_new(x.t, 2, 24, &kv), 0);
    int32_t slot = 1, start = 0, c1[2] = {0, 10};
    assert_int_equal(target_forward_kv_feat(x.t, kv, &slot, &start, c1, 1, ids, 10, NULL, NULL, inc), 0);
    start = 10;
    int32_t c2[2] = {0, L - 10};
    assert_int_equal(target_forward_kv_feat(x.t, kv, &slot, &start, c2, 1, ids + 10, L - 10, NULL, NULL,
                                            inc + (size_t)10 * W), 0);
    double e = rel_err(inc, full, (size_t)L * W);
    if (e > 1e-5) fail_msg("features through the KV cache: rel err %.3g", e);
    target_kv_destroy(&kv);
    free(full);
    free(inc);
    tiny_close(&x);
}

typedef struct {
    int plen;
    const int32_t *ref;
    int ref_len;
    int fixed;      /* >= 0: always propose this id */
} oracle_t;

static int oracle_hook(void *user, const int32_t *tokens, int n, int B, int32_t *draft) {
    const oracle_t *o = user;
    (void)tokens;
    for (int k = 1; k < B; k++) {
        int i = n - o->plen + k - 1;
        draft[k] = o->fixed >= 0 ? o->fixed : (i < o->ref_len ? o->ref[i] : 0);
    }
    return 0;
}

static void test_greedy_tiny(void **state) {
    (void)state;
    enum { B = 4, NP = 3, P = 6, N = 41 };
    tiny_t x;
    tiny_open(&x, B, 64, 1, 5);
    const int V = target_config(x.t)->V;
    generator_t *g = NULL;
    specdec_t *s = NULL;
    assert_int_equal(generator_new(x.t, 1, P + N + 1, &g), 0);
    assert_int_equal(specdec_new(x.t, x.d, P + N + 1, &s), 0);
    gen_params_t gp;
    gen_params_default(x.t, &gp);
    gp.max_new_tokens = N;
    gp.n_stop = 0;
    specdec_params_t sp;
    specdec_params_default(x.t, &sp);
    sp.max_new_tokens = N;
    sp.n_stop = 0;
    rng_t r;
    rng_seed(&r, 21);
    for (int i = 0; i < NP; i++) {
        int32_t prompt[P];
        for (int j = 0; j < P; j++) prompt[j] = (int32_t)rng_below(&r, (uint64_t)V);
        const int32_t *pp = prompt;
        int len = P, bl = 0, sl = 0;
        int32_t *bo = NULL, *so = NULL;
        assert_int_equal(generator_run(g, &gp, 1, &pp, &len, &bo, &bl, NULL, NULL, NULL), 0);
        specdec_stats_t st;
        specdec_set_propose_hook(s, NULL, NULL);
        assert_int_equal(specdec_run(s, &sp, prompt, P, &so, &sl, &st), 0);
        assert_int_equal(sl, bl);
        assert_memory_equal(so, bo, (size_t)bl * 4);
        assert_int_equal(st.new_tokens, N);
        assert_true(st.steps >= (N - 1 + B - 1) / B);
        int64_t hsum = 0;
        for (int m = 1; m <= B; m++) hsum += st.hist[m];
        assert_int_equal(hsum, st.steps);
        free(so);
        /* oracle: the target's own continuation is always accepted: tau = B */
        oracle_t o = {P, bo, bl, -1};
        specdec_set_propose_hook(s, oracle_hook, &o);
        assert_int_equal(specdec_run(s, &sp, prompt, P, &so, &sl, &st), 0);
        assert_int_equal(sl, bl);
        assert_memory_equal(so, bo, (size_t)bl * 4);
        assert_int_equal(st.steps, (N - 1) / B);  /* N - 1 = 40 tokens after the prefill's */
        assert_int_equal(st.hist[B], st.steps);
        assert_true(fabs((double)st.accepted / st.steps - B) < 1e-9);
        free(so);
        free(bo);
    }
    specdec_destroy(&s);
    generator_destroy(&g);
    tiny_close(&x);
}

/* Exact marginal of the second output token at temperature T: sum over the first
 * token x of p(x | prompt) p(y | prompt, x), every x in one packed forward. */
static void exact_second_marginal(target_t *t, const int32_t *prompt, int P, float T, double *m) {
    const model_config_t *mc = target_config(t);
    const int V = mc->V, S = V + 1;
    const ops_ctx_t *c = target_ops(t);
    int total = P + V * (P + 1);
    int32_t *ids = malloc((size_t)total * 4), *cu = malloc((size_t)(S + 1) * 4);
    cu[0] = 0;
    memcpy(ids, prompt, (size_t)P * 4);
    cu[1] = P;
    for (int x = 0; x < V; x++) {
        memcpy(ids + cu[x + 1], prompt, (size_t)P * 4);
        ids[cu[x + 1] + P] = x;
        cu[x + 2] = cu[x + 1] + P + 1;
    }
    void *h = c->impl->malloc_(c, (size_t)total * mc->D * 4);
    void *lg = c->impl->malloc_(c, (size_t)total * V * 4);
    assert_int_equal(target_forward_host(t, ids, NULL, cu, S, total, NULL, h), 0);
    target_logits(t, lg, h, total);
    const float *L = lg;
    double *p1 = malloc((size_t)V * sizeof(double)), *p2 = malloc((size_t)V * sizeof(double));
    for (int y = 0; y < V; y++) m[y] = 0;
    for (int s = 0; s <= V; s++) {
        const float *row = L + (size_t)(cu[s + 1] - 1) * V;
        double mx = row[0], sum = 0;
        for (int y = 1; y < V; y++) if (row[y] > mx) mx = row[y];
        double *p = s == 0 ? p1 : p2;
        for (int y = 0; y < V; y++) sum += p[y] = exp((row[y] - mx) / T);
        for (int y = 0; y < V; y++) p[y] /= sum;
        if (s > 0)
            for (int y = 0; y < V; y++) m[y] += p1[s - 1] * p2[y];
    }
    c->impl->free_(c, h);
    c->impl->free_(c, lg);
    free(p1), free(p2), free(ids), free(cu);
}

static void check_sampling(tiny_t *x, specdec_t *s, const int32_t *prompt, int P, float T,
                           const double *m, int N, int both_branches, const char *what) {
    const int V = target_config(x->t)->V;
    specdec_params_t sp;
    specdec_params_default(x->t, &sp);
    sp.max_new_tokens = 2;
    sp.n_stop = 0;
    sp.temperature = T;
    int *cnt = calloc((size_t)V, sizeof(int));
    int64_t steps = 0, accepted = 0;
    for (int i = 0; i < N; i++) {
        sp.seed = (uint64_t)i + 1;
        int32_t *out = NULL;
        int n = 0;
        specdec_stats_t st;
        assert_int_equal(specdec_run(s, &sp, prompt, P, &out, &n, &st), 0);
        assert_int_equal(n, 2);
        cnt[out[1]]++;
        steps += st.steps;
        accepted += st.pos_accept[1];
        free(out);
    }
    double tv = 0, expect = 0;
    for (int y = 0; y < V; y++) {
        tv += fabs((double)cnt[y] / N - m[y]);
        expect += sqrt(2.0 / M_PI * m[y] * (1 - m[y]) / N);
    }
    tv *= 0.5, expect *= 0.5;
    fprintf(stderr, "%s: TV(empirical, exact) %.4f (expected %.4f from sampling), first draft token accepted in %.1f%% of steps\n",
            what, tv, expect, 100.0 * accepted / steps);
    /* both branches of the rule (accept, reject + residual) must have run */
    if (both_branches) assert_true(accepted > 0 && accepted < steps);
    if (tv > 3 * expect) fail_msg("%s: TV %.4f > 3 x %.4f", what, tv, expect);
    free(cnt);
}

static void test_sampling_tiny(void **state) {
    (void)state;
    enum { B = 4, P = 5 };
    tiny_t x;
    tiny_open(&x, B, 2048, 512, 8);
    const int V = target_config(x.t)->V;
    int32_t prompt[P] = {17, 250, 3, 99, 41};
    /* a temperature at which the tiny random target is far from uniform */
    float T = 2.0f;
    double *m = malloc((size_t)V * sizeof(double));
    int ymax = 0;
    for (;; T *= 0.7f) {  /* the largest T at which the top token has >= 20% of the mass */
        exact_second_marginal(x.t, prompt, P, T, m);
        ymax = 0;
        for (int y = 1; y < V; y++) if (m[y] > m[ymax]) ymax = y;
        if (m[ymax] >= 0.2 || T < 1e-3) break;
    }
    fprintf(stderr, "exact marginal at T=%g: max %.3f (id %d)\n", T, m[ymax], ymax);
    specdec_t *s = NULL;
    assert_int_equal(specdec_new(x.t, x.d, 16, &s), 0);
    /* drafter proposals sampled from its q; the rule must still give the target's law */
    check_sampling(&x, s, prompt, P, T, m, 6000, 0, "random drafter");
    /* all-zero drafter weights: logits 0, q uniform, so proposals are accepted with
     * probability min(1, V p(d)): both branches with a non-trivial q */
    float *zeros = calloc(drafter_n_params(x.d), sizeof(float));
    drafter_upload_master(x.d, zeros);
    free(zeros);
    check_sampling(&x, s, prompt, P, T, m, 6000, 1, "uniform drafter (zero weights)");
    oracle_t o = {P, NULL, 0, ymax};
    specdec_set_propose_hook(s, oracle_hook, &o);
    check_sampling(&x, s, prompt, P, T, m, 6000, 1, "fixed-token proposal");
    specdec_destroy(&s);
    free(m);
    tiny_close(&x);
}

static void test_prompts(void **state) {
    (void)state;
    prompt_t p = {0};
    const char *mt = "{\"question_id\": 81, \"category\": \"writing\", \"turns\": [\"Compose a post.\", \"Rewrite it.\"]}";
    assert_int_equal(prompt_parse(mt, strlen(mt), &p), 0);
    assert_int_equal(p.kind, PROMPT_TURNS);
    assert_int_equal(prompt_n_turns(&p), 2);
    assert_string_equal(p.msgs[0].content, "Compose a post.");
    assert_string_equal(p.msgs[1].role, "user");
    const char *he = "{\"task_id\": \"HumanEval/0\", \"prompt\": \"def f(x):\\n    \", \"entry_point\": \"f\"}";
    assert_int_equal(prompt_parse(he, strlen(he), &p), 0);
    assert_int_equal(p.kind, PROMPT_PROMPT);
    assert_string_equal(p.msgs[0].content, "def f(x):\n    ");
    const char *gs = "{\"question\": \"How many?\", \"answer\": \"3\\n#### 3\"}";
    assert_int_equal(prompt_parse(gs, strlen(gs), &p), 0);
    assert_int_equal(p.kind, PROMPT_QUESTION);
    assert_int_equal(p.n_msgs, 1);
    assert_string_equal(p.msgs[0].content, "How many?");
    const char *oa = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                     "\"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello\"}, {\"role\": "
                     "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"And \"}, {\"type\": \"text\", "
                     "\"text\": \"you?\"}]}]}";
    assert_int_equal(prompt_parse(oa, strlen(oa), &p), 0);
    assert_int_equal(p.kind, PROMPT_OPENAI);
    assert_true(p.has_system);
    assert_int_equal(prompt_n_turns(&p), 2);
    assert_string_equal(p.msgs[0].content, "Be brief.");
    assert_string_equal(p.msgs[2].content, "And you?");
    const char *sg = "{\"conversations\": [{\"from\": \"human\", \"value\": \"Q1\"}, {\"from\": \"gpt\", "
                     "\"value\": \"A1\"}, {\"from\": \"human\", \"value\": \"Q2\"}]}";
    assert_int_equal(prompt_parse(sg, strlen(sg), &p), 0);
    assert_int_equal(p.kind, PROMPT_SHAREGPT);
    assert_int_equal(prompt_n_turns(&p), 2);
    assert_string_equal(p.msgs[1].content, "Q2");
    const char *al = "{\"instruction\": \"Sum\", \"input\": \"1 2\"}";
    assert_int_equal(prompt_parse(al, strlen(al), &p), 0);
    assert_string_equal(p.msgs[0].content, "Sum\n\n1 2");
    const char *bad[] = {"{\"answer\": \"x\"}", "[1,2]", "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}]}",
                         "{\"turns\": [1]}", "not json"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(prompt_parse(bad[i], strlen(bad[i]), &p), DL_EFORMAT);
    prompt_free(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompts),
        cmocka_unit_test(test_infer_matches_forward),
        cmocka_unit_test(test_kv_feat_matches_full),
        cmocka_unit_test(test_greedy_tiny),
        cmocka_unit_test(test_sampling_tiny),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
