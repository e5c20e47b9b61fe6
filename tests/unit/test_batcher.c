/* common/data/batcher: token budget never exceeded, every sample once per
 * epoch, micro-batch mb a pure function of (cache, opts, mb), resume from a
 * saved cursor reproduces the stream, and per-micro-batch length spread well
 * above a naive sorted packing. Data: a synthetic {"text"} dataset with
 * log-uniform lengths, prepared with the Qwen3-style fixture tokenizer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/data/batcher.h"

#define N_SAMPLES 3000

static char g_dir[64];
static char g_cache[128];

static const char *fixtures_dir(void) {
    const char *d = getenv("DL_FIXTURES_DIR");
    return d ? d : "tests/fixtures";
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/dl_batcher_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    char data[128], tp[1024];
    snprintf(data, sizeof data, "%s/text.jsonl", g_dir);
    snprintf(g_cache, sizeof g_cache, "%s/text.dlc", g_dir);
    FILE *f = fopen(data, "w");
    if (!f) return -1;
    static const char *words[] = {"the", "drafter", "speculative", "token", "42", "batch", "anchor", "block", "x", "hello"};
    rng_t r;
    rng_seed(&r, 7);
    for (int i = 0; i < N_SAMPLES; i++) {
        int nw = (int)exp(rng_uniform(&r) * log(700.0)) + 1; /* 1..700 words, log-uniform */
        fputs("{\"text\": \"", f);
        for (int w = 0; w < nw; w++) fprintf(f, "%s%s", w ? " " : "", words[rng_below(&r, 10)]);
        fputs("\"}\n", f);
    }
    fclose(f);
    snprintf(tp, sizeof tp, "%s/tokenizer/qwen3_style/tokenizer.json", fixtures_dir());
    tok_t *t = NULL;
    if (tok_load(tp, &t) < 0) return -1;
    prep_opts_t po = {.data_path = data, .out_path = g_cache, .n_threads = 2};
    prep_stats_t st;
    int rc = prep_run(t, &po, &st);
    tok_destroy(&t);
    if (rc < 0) { fprintf(stderr, "prep: %s\n", dl_errmsg()); return -1; }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char p[256];
    snprintf(p, sizeof p, "%s/text.jsonl", g_dir); unlink(p);
    unlink(g_cache);
    rmdir(g_dir);
    return 0;
}

static batcher_opts_t opts(void) {
    batcher_opts_t o;
    batcher_opts_default(&o, 0);
    o.seed = 1234;
    o.token_budget = 4096;
    o.max_len = 1024;
    o.shuffle_buffer = 512;
    o.micro_batches_per_step = 4;
    o.epochs = 3;
    return o;
}

/* Budget, coverage (each sample exactly once per epoch, whole or truncated), steps. */
static void test_budget_and_coverage(void **state) {
    (void)state;
    dlc_t *c = NULL;
    assert_int_equal(dlc_open(g_cache, &c), 0);
    uint64_t ns = dlc_n_samples(c);
    assert_int_equal(ns, N_SAMPLES);
    batcher_opts_t o = opts();
    batcher_t *b = NULL;
    assert_int_equal(batcher_new(c, &o, &b), 0);
    uint64_t total = batcher_total_mbs(b);
    assert_true(total > 0);
    uint32_t *seen = calloc(ns, sizeof *seen);
    uint64_t mb = 0, filled = 0;
    for (uint32_t e = 0; e < o.epochs; e++) {
        memset(seen, 0, ns * sizeof *seen);
        uint64_t n_e = batcher_epoch_mbs(b, e);
        for (uint64_t i = 0; i < n_e; i++, mb++) {
            batcher_mb_t m;
            assert_int_equal(batcher_get(b, mb, &m), 0);
            assert_int_equal(m.epoch, e);
            assert_int_equal(m.step, mb / 4);
            assert_true(m.n_tokens <= o.token_budget);
            assert_true(m.n_seqs >= 1);
            filled += m.n_tokens;
            for (uint32_t s = 0; s < m.n_seqs; s++) {
                uint32_t full = dlc_sample_len(c, m.seqs[s].sample);
                assert_int_equal(m.seqs[s].start, 0);
                assert_int_equal(m.seqs[s].len, full < o.max_len ? full : o.max_len);
                seen[m.seqs[s].sample]++;
            }
        }
        for (uint64_t i = 0; i < ns; i++)
            if (dlc_sample_len(c, i) >= 2) assert_int_equal(seen[i], 1);
    }
    assert_int_equal(mb, total);
    batcher_mb_t m;
    assert_int_equal(batcher_get(b, total, &m), DL_ENOENT);
    double fill = (double)filled / ((double)total * o.token_budget);
    fprintf(stderr, "%llu micro-batches over 3 epochs, mean fill %.3f of the budget\n", (unsigned long long)total, fill);
    assert_true(fill > 0.85);
    free(seen);
    batcher_destroy(&b);

    /* split_long: the pieces of every long sample tile it exactly */
    o.split_long = 1;
    o.epochs = 1;
    assert_int_equal(batcher_new(c, &o, &b), 0);
    uint64_t *cov = calloc(ns, sizeof *cov);
    for (uint64_t i = 0; i < batcher_epoch_mbs(b, 0); i++) {
        assert_int_equal(batcher_get(b, i, &m), 0);
        assert_true(m.n_tokens <= o.token_budget);
        for (uint32_t s = 0; s < m.n_seqs; s++) {
            assert_true(m.seqs[s].len <= o.max_len);
            cov[m.seqs[s].sample] += m.seqs[s].len;
        }
    }
    uint64_t nlong = 0;
    for (uint64_t i = 0; i < ns; i++) {
        uint32_t len = dlc_sample_len(c, i);
        uint32_t tail = len > o.max_len && len % o.max_len == 1 ? 1 : 0; /* a 1-token tail is dropped */
        if (len >= 2) assert_int_equal(cov[i], len - tail);
        nlong += len > o.max_len;
    }
    assert_true(nlong > 50); /* the data does exercise splitting */
    free(cov);
    batcher_destroy(&b);
    dlc_close(&c);
}

/* Pure function: a fresh batcher, random access in any order, equals the stream. */
static uint64_t mb_hash(const batcher_mb_t *m) {
    uint64_t h = rng_mix(m->mb, m->n_seqs, m->epoch);
    for (uint32_t s = 0; s < m->n_seqs; s++) h = rng_mix(h, m->seqs[s].sample, ((uint64_t)m->seqs[s].start << 32) | m->seqs[s].len);
    return h;
}

static void test_pure_and_resume(void **state) {
    (void)state;
    dlc_t *c = NULL;
    assert_int_equal(dlc_open(g_cache, &c), 0);
    batcher_opts_t o = opts();
    batcher_t *a = NULL, *b = NULL;
    assert_int_equal(batcher_new(c, &o, &a), 0);
    uint64_t total = batcher_total_mbs(a);
    uint64_t *ref = malloc(total * sizeof *ref);
    batcher_mb_t m;
    for (uint64_t i = 0; i < total; i++) {
        assert_int_equal(batcher_next(a, &m), 0);
        ref[i] = mb_hash(&m);
    }
    assert_int_equal(batcher_next(a, &m), DL_ENOENT);
    /* epochs differ (a new shuffle per epoch) */
    uint64_t e0 = batcher_epoch_mbs(a, 0);
    assert_true(ref[0] != ref[e0]);
    /* random access from a fresh batcher, backwards and across epochs */
    assert_int_equal(batcher_new(c, &o, &b), 0);
    for (uint64_t k = 0; k < 200; k++) {
        uint64_t i = (total - 1 - k * 37) % total;
        assert_int_equal(batcher_get(b, i, &m), 0);
        assert_true(mb_hash(&m) == ref[i]);
    }
    batcher_destroy(&b);
    /* resume: stop after k, encode the cursor, restore into a new batcher */
    uint64_t k = e0 + 17;
    assert_int_equal(batcher_new(c, &o, &b), 0);
    for (uint64_t i = 0; i < k; i++) assert_int_equal(batcher_next(b, &m), 0);
    batcher_cursor_t cur;
    batcher_cursor(b, batcher_tell(b), &cur);
    uint8_t blob[BATCHER_CURSOR_BYTES];
    batcher_cursor_encode(&cur, blob);
    batcher_destroy(&b);
    batcher_cursor_t back;
    assert_int_equal(batcher_cursor_decode(blob, sizeof blob, &back), 0);
    assert_int_equal(batcher_new(c, &o, &b), 0);
    assert_int_equal(batcher_restore(b, &back), 0);
    for (uint64_t i = k; i < total; i++) {
        assert_int_equal(batcher_next(b, &m), 0);
        assert_int_equal(m.mb, i);
        assert_true(mb_hash(&m) == ref[i]);
    }
    batcher_destroy(&b);
    /* a cursor for other options / seed / data is refused; a corrupt blob too */
    batcher_opts_t o2 = o;
    o2.seed = 99;
    assert_int_equal(batcher_new(c, &o2, &b), 0);
    assert_int_equal(batcher_restore(b, &back), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "seed"));
    batcher_destroy(&b);
    o2 = o;
    o2.token_budget = 8192;
    assert_int_equal(batcher_new(c, &o2, &b), 0);
    assert_int_equal(batcher_restore(b, &back), DL_EINVAL);
    batcher_destroy(&b);
    blob[3] ^= 1;
    assert_int_equal(batcher_cursor_decode(blob, sizeof blob, &back), DL_EFORMAT);
    assert_int_equal(batcher_cursor_decode(blob, 8, &back), DL_EFORMAT);
    /* a different seed gives a different stream */
    assert_int_equal(batcher_new(c, &o2, &b), 0);
    batcher_destroy(&b);
    o2 = o;
    o2.seed = 5;
    assert_int_equal(batcher_new(c, &o2, &b), 0);
    assert_int_equal(batcher_get(b, 0, &m), 0);
    assert_true(mb_hash(&m) != ref[0]);
    batcher_destroy(&b);
    free(ref);
    batcher_destroy(&a);
    dlc_close(&c);
}

static double mean_std_per_mb(const uint32_t *lens, const uint32_t *off, uint64_t nmb) {
    double acc = 0;
    uint64_t counted = 0;
    for (uint64_t i = 0; i < nmb; i++) {
        uint32_t n = off[i + 1] - off[i];
        if (n < 2) continue;
        double s = 0, s2 = 0;
        for (uint32_t j = off[i]; j < off[i + 1]; j++) { s += lens[j]; s2 += (double)lens[j] * lens[j]; }
        double mu = s / n;
        acc += sqrt(fmax(0, s2 / n - mu * mu));
        counted++;
    }
    return counted ? acc / counted : 0;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Length mixing: mean per-micro-batch stddev of sequence lengths, vs the naive
 * packing of length-sorted sequences (what a bucketed loader does). */
static void test_length_mixing(void **state) {
    (void)state;
    dlc_t *c = NULL;
    assert_int_equal(dlc_open(g_cache, &c), 0);
    batcher_opts_t o = opts();
    o.epochs = 1;
    batcher_t *b = NULL;
    assert_int_equal(batcher_new(c, &o, &b), 0);
    uint64_t nmb = batcher_epoch_mbs(b, 0), ns = dlc_n_samples(c);
    uint32_t *lens = malloc(ns * sizeof *lens), *off = malloc((ns + 1) * sizeof *off);
    uint32_t k = 0;
    batcher_mb_t m;
    for (uint64_t i = 0; i < nmb; i++) {
        off[i] = k;
        assert_int_equal(batcher_get(b, i, &m), 0);
        for (uint32_t s = 0; s < m.n_seqs; s++) lens[k++] = m.seqs[s].len;
    }
    off[nmb] = k;
    double ours = mean_std_per_mb(lens, off, nmb);
    /* naive: sort all sequence lengths, fill greedily in order */
    qsort(lens, k, sizeof *lens, cmp_u32);
    uint64_t nn = 0;
    uint32_t tok = 0;
    off[0] = 0;
    for (uint32_t i = 0; i < k; i++) {
        if (tok + lens[i] > o.token_budget) { off[++nn] = i; tok = 0; }
        tok += lens[i];
    }
    off[++nn] = k;
    double naive = mean_std_per_mb(lens, off, nn);
    fprintf(stderr, "mean per-micro-batch stddev of lengths: ours %.1f tokens (%llu mbs), sorted %.1f (%llu mbs)\n",
            ours, (unsigned long long)nmb, naive, (unsigned long long)nn);
    assert_true(ours > 5.0 * naive);
    assert_true(ours > 100.0);
    /* every micro-batch with >= 2 sequences has a long one and a short one */
    uint64_t mixed = 0, multi = 0;
    for (uint64_t i = 0; i < nmb; i++) {
        assert_int_equal(batcher_get(b, i, &m), 0);
        if (m.n_seqs < 2) continue;
        uint32_t lo = UINT32_MAX, hi = 0;
        for (uint32_t s = 0; s < m.n_seqs; s++) {
            if (m.seqs[s].len < lo) lo = m.seqs[s].len;
            if (m.seqs[s].len > hi) hi = m.seqs[s].len;
        }
        multi++;
        mixed += hi >= 4 * lo;
    }
    fprintf(stderr, "%llu of %llu multi-sequence micro-batches hold a sequence >= 4x another\n", (unsigned long long)mixed, (unsigned long long)multi);
    assert_true(mixed * 10 >= multi * 9);
    free(lens);
    free(off);
    batcher_destroy(&b);
    dlc_close(&c);
}

static void test_pack_and_opts(void **state) {
    (void)state;
    dlc_t *c = NULL;
    assert_int_equal(dlc_open(g_cache, &c), 0);
    batcher_opts_t o = opts();
    batcher_t *b = NULL;
    assert_int_equal(batcher_new(c, &o, &b), 0);
    batcher_mb_t m;
    assert_int_equal(batcher_get(b, 3, &m), 0);
    int32_t *ids = malloc(o.token_budget * 4), *pos = malloc(o.token_budget * 4), *cu = malloc((o.token_budget + 1) * 4);
    uint8_t *mask = malloc(o.token_budget);
    assert_int_equal(batcher_pack(b, &m, ids, mask, pos, cu), 0);
    assert_int_equal(cu[m.n_seqs], (int32_t)m.n_tokens);
    for (uint32_t s = 0; s < m.n_seqs; s++) {
        const int32_t *si;
        const uint8_t *sm;
        uint32_t len;
        assert_int_equal(dlc_sample(c, m.seqs[s].sample, &si, &sm, &len), 0);
        assert_int_equal(cu[s + 1] - cu[s], (int32_t)m.seqs[s].len);
        assert_memory_equal(ids + cu[s], si + m.seqs[s].start, m.seqs[s].len * 4);
        assert_int_equal(pos[cu[s]], 0);
        assert_int_equal(pos[cu[s + 1] - 1], (int32_t)m.seqs[s].len - 1);
        for (int32_t j = cu[s]; j < cu[s + 1]; j++) assert_int_equal(mask[j], 1); /* text samples: all trained */
    }
    free(ids); free(pos); free(cu); free(mask);
    batcher_destroy(&b);
    batcher_opts_t bad = o;
    bad.max_len = o.token_budget + 1;
    assert_int_equal(batcher_new(c, &bad, &b), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "--max-len"));
    bad = o;
    bad.token_budget = 1;
    assert_int_equal(batcher_new(c, &bad, &b), DL_EINVAL);
    bad = o;
    bad.micro_batches_per_step = 0;
    assert_int_equal(batcher_new(c, &bad, &b), DL_EINVAL);
    /* defaults */
    batcher_opts_default(&bad, 1);
    assert_int_equal(bad.token_budget, 65536);
    batcher_opts_default(&bad, 0);
    assert_int_equal(bad.token_budget, BATCHER_TOKEN_BUDGET_CPU);
    dlc_close(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_and_coverage),
        cmocka_unit_test(test_pure_and_resume),
        cmocka_unit_test(test_length_mixing),
        cmocka_unit_test(test_pack_and_opts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
