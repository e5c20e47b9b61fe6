/* common/data/prepare: the .dlc cache of GSM8K (first 200 lines) and the
 * ShareGPT sample, with the embedded SmolLM2 tokenizer and its GGUF chat
 * template, against tests/fixtures/data/prepare_expect.json (HF tokenizers +
 * transformers apply_chat_template, assistant spans from rendered prefixes);
 * thread-count independence; skipped lines; atomic output; corrupt caches. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/paths.h"
#include "common/data/prepare.h"

static char g_dir[64];
static tok_t *g_tok;
static chat_template_t g_ct;
static cJSON *g_expect;
static char g_data[4096];

static const char *fixtures_dir(void) {
    const char *d = getenv("DL_FIXTURES_DIR");
    return d ? d : "tests/fixtures";
}

static char *slurp(const char *p, long *n) {
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)*n + 1);
    if (fread(s, 1, (size_t)*n, f) != (size_t)*n) { free(s); fclose(f); return NULL; }
    fclose(f);
    s[*n] = 0;
    return s;
}

static int setup(void **state) {
    (void)state;
    log_init("test_prepare", LOG_ERROR);
    snprintf(g_dir, sizeof g_dir, "/tmp/dl_prepare_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    char model[4096], p[1024];
    if (paths_default_model(model, sizeof model) == 0 && access(model, R_OK) == 0) {
        if (tok_load(model, &g_tok) < 0 || chat_template_from_tok(g_tok, &g_ct) < 0) return -1;
    }
    paths_shared_data(g_data, sizeof g_data);
    snprintf(p, sizeof p, "%s/data/prepare_expect.json", fixtures_dir());
    long n;
    char *s = slurp(p, &n);
    if (!s) return -1;
    g_expect = cJSON_Parse(s);
    free(s);
    return g_expect ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tok_destroy(&g_tok);
    cJSON_Delete(g_expect);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void need(const char *path) {
    if (!g_tok) { fprintf(stderr, "skip: embedded model absent (run `make model`)\n"); skip(); }
    if (access(path, R_OK) != 0) { fprintf(stderr, "skip: %s absent\n", path); skip(); }
}

static void check_expect(const dlc_t *c, const cJSON *e) {
    const dlc_header_t *h = dlc_header(c);
    assert_int_equal(h->n_samples, cJSON_GetObjectItem(e, "n")->valueint);
    assert_int_equal(h->n_tokens, cJSON_GetObjectItem(e, "tokens")->valueint);
    assert_int_equal(h->n_assistant, cJSON_GetObjectItem(e, "assistant")->valueint);
    assert_int_equal(h->n_skipped, 0);
    assert_true(h->tok_fingerprint == tok_fingerprint(g_tok));
    const cJSON *ps = cJSON_GetObjectItem(e, "per_sample");
    for (int i = 0; i < cJSON_GetArraySize(ps); i++) {
        const int32_t *ids;
        const uint8_t *mask;
        uint32_t len;
        assert_int_equal(dlc_sample(c, (uint64_t)i, &ids, &mask, &len), 0);
        uint32_t na = 0;
        for (uint32_t j = 0; j < len; j++) na += mask[j];
        const cJSON *w = cJSON_GetArrayItem(ps, i);
        if ((int)len != cJSON_GetArrayItem(w, 0)->valueint || (int)na != cJSON_GetArrayItem(w, 1)->valueint)
            fail_msg("sample %d: %u tokens / %u assistant, want %d / %d", i, len, na,
                     cJSON_GetArrayItem(w, 0)->valueint, cJSON_GetArrayItem(w, 1)->valueint);
        /* the trained tokens end with <|im_end|> (id 2), never the system/user */
        if (len) assert_int_equal(ids[0], 1);
    }
}

static void test_gsm8k(void **state) {
    (void)state;
    char src[4200], head[128], out[128];
    snprintf(src, sizeof src, "%s/gsm8k/train.jsonl", g_data);
    need(src);
    /* first 200 lines into a temp file */
    snprintf(head, sizeof head, "%s/gsm8k200.jsonl", g_dir);
    FILE *in = fopen(src, "r"), *o = fopen(head, "w");
    char *line = NULL;
    size_t cap = 0;
    for (int i = 0; i < 200 && getline(&line, &cap, in) > 0; i++) fputs(line, o);
    free(line);
    fclose(in);
    fclose(o);
    snprintf(out, sizeof out, "%s/gsm8k.dlc", g_dir);
    prep_opts_t po = {.data_path = head, .out_path = out, .chat = &g_ct, .n_threads = 2, .chunk_records = 64,
                      .ds = {.prompt_field = "question", .response_field = "answer"}};
    prep_stats_t st;
    int rc = prep_run(g_tok, &po, &st);
    if (rc) fail_msg("%s", dl_errmsg());
    assert_int_equal(st.samples, 200);
    dlc_t *c = NULL;
    assert_int_equal(dlc_open(out, &c), 0);
    const cJSON *e = cJSON_GetObjectItem(g_expect, "gsm8k_first200");
    check_expect(c, e);
    assert_int_equal(st.tokens, dlc_n_tokens(c));
    /* sample 0: every id and mask bit */
    const int32_t *ids;
    const uint8_t *mask;
    uint32_t len;
    assert_int_equal(dlc_sample(c, 0, &ids, &mask, &len), 0);
    const cJSON *wi = cJSON_GetObjectItem(e, "sample0_ids"), *wm = cJSON_GetObjectItem(e, "sample0_mask");
    assert_int_equal(len, cJSON_GetArraySize(wi));
    for (uint32_t j = 0; j < len; j++) {
        assert_int_equal(ids[j], cJSON_GetArrayItem(wi, (int)j)->valueint);
        assert_int_equal(mask[j], cJSON_GetArrayItem(wm, (int)j)->valueint);
    }
    assert_int_equal(ids[len - 2], 2); /* ...<|im_end|> \n */
    assert_int_equal(mask[len - 2], 1);
    assert_int_equal(mask[len - 1], 0);
    assert_int_equal(dlc_sample(c, 200, &ids, &mask, &len), DL_ERANGE);
    dlc_close(&c);

    /* same bytes whatever the thread count and chunking */
    char out1[128];
    snprintf(out1, sizeof out1, "%s/gsm8k_1t.dlc", g_dir);
    po.out_path = out1;
    po.n_threads = 1;
    po.chunk_records = 7;
    assert_int_equal(prep_run(g_tok, &po, &st), 0);
    long n1, n2;
    char *a = slurp(out, &n1), *b = slurp(out1, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, (size_t)n1);
    free(a);
    free(b);
}

static void test_sharegpt(void **state) {
    (void)state;
    char src[4200], out[128];
    snprintf(src, sizeof src, "%s/sharegpt_sample/dummy_conversation.json", g_data);
    need(src);
    snprintf(out, sizeof out, "%s/sharegpt.dlc", g_dir);
    prep_opts_t po = {.data_path = src, .out_path = out, .chat = &g_ct, .ds = {.format = DS_SHAREGPT}};
    prep_stats_t st;
    assert_int_equal(prep_run(g_tok, &po, &st), 0);
    dlc_t *c = NULL;
    assert_int_equal(dlc_open(out, &c), 0);
    check_expect(c, cJSON_GetObjectItem(g_expect, "sharegpt"));
    dlc_close(&c);
}

static void test_bad_lines_and_atomic(void **state) {
    (void)state;
    if (!g_tok) { fprintf(stderr, "skip: embedded model absent\n"); skip(); }
    char p[128], out[128];
    snprintf(p, sizeof p, "%s/bad.jsonl", g_dir);
    snprintf(out, sizeof out, "%s/bad.dlc", g_dir);
    FILE *f = fopen(p, "w");
    fputs("{\"text\": \"one\"}\n{\"text\": \"two\"}\n{\"text\": 3}\n{\"text\": \"\"}\nnot json\n{\"text\": \"six\"}\n", f);
    fclose(f);
    prep_opts_t po = {.data_path = p, .out_path = out, .chat = &g_ct};
    prep_stats_t st;
    assert_int_equal(prep_run(g_tok, &po, &st), 0);
    assert_int_equal(st.samples, 3);
    assert_int_equal(st.skipped, 3); /* wrong type, empty text (0 tokens), not JSON */
    dlc_t *c = NULL;
    assert_int_equal(dlc_open(out, &c), 0);
    assert_int_equal(dlc_header(c)->n_skipped, 3);
    assert_int_equal(dlc_n_tokens(c), dlc_header(c)->n_assistant); /* text: every token trained */
    dlc_close(&c);
    /* strict: fails at line 3, leaves the old cache untouched and no temp file */
    struct stat before, after;
    assert_int_equal(stat(out, &before), 0);
    po.ds.strict = 1;
    assert_int_equal(prep_run(g_tok, &po, &st), DL_EFORMAT);
    char want[160];
    snprintf(want, sizeof want, "%s:3:", p);
    assert_non_null(strstr(dl_errmsg(), want));
    assert_int_equal(stat(out, &after), 0);
    assert_int_equal(before.st_ino, after.st_ino);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls %s | grep -q tmp", g_dir);
    assert_int_not_equal(system(cmd), 0);
    /* corrupt caches are refused with a reason */
    long n;
    char *s = slurp(out, &n);
    char bad[128];
    snprintf(bad, sizeof bad, "%s/corrupt.dlc", g_dir);
    f = fopen(bad, "wb");
    fwrite(s, 1, (size_t)n - 8, f); /* truncated index */
    fclose(f);
    assert_int_equal(dlc_open(bad, &c), DL_EFORMAT);
    s[0] = 'X';
    f = fopen(bad, "wb");
    fwrite(s, 1, (size_t)n, f);
    fclose(f);
    assert_int_equal(dlc_open(bad, &c), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "magic"));
    s[0] = 'D';
    /* an ids offset near 2^64: ids_off + 4 * n_tokens wraps, still refused */
    uint64_t huge = UINT64_MAX - 127;
    memcpy(s + offsetof(dlc_header_t, ids_off), &huge, 8);
    f = fopen(bad, "wb");
    fwrite(s, 1, (size_t)n, f);
    fclose(f);
    assert_int_equal(dlc_open(bad, &c), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "section offsets out of bounds"));
    free(s);
    /* --out a directory: refused up front with a hint, no temp file left in it or beside it */
    char odir[160];
    snprintf(odir, sizeof odir, "%s/outdir", g_dir);
    assert_int_equal(mkdir(odir, 0700), 0);
    po.ds.strict = 0;
    po.out_path = odir;
    assert_int_equal(prep_run(g_tok, &po, &st), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "is a directory"));
    assert_non_null(strstr(dl_errmsg(), "outdir/data.dlc"));
    strcat(odir, "/");
    assert_int_equal(prep_run(g_tok, &po, &st), DL_EINVAL);
    assert_int_not_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "ls -A %s/outdir | grep -q .", g_dir);
    assert_int_not_equal(system(cmd), 0);
    /* --out the --data file itself, or another file that is not a cache: refused, kept */
    po.out_path = p;
    assert_int_equal(prep_run(g_tok, &po, &st), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "is the --data file itself"));
    char other[160];
    snprintf(other, sizeof other, "%s/notes.txt", g_dir);
    f = fopen(other, "w");
    fputs("keep me\n", f);
    fclose(f);
    po.out_path = other;
    assert_int_equal(prep_run(g_tok, &po, &st), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "is not a draftline cache"));
    s = slurp(other, &n);
    assert_string_equal(s, "keep me\n");
    free(s);
    po.out_path = out;
    assert_int_equal(prep_run(g_tok, &po, &st), 0); /* an earlier cache is replaced */
    assert_int_equal(dlc_open("/nonexistent.dlc", &c), DL_ENOENT);
}

/* Nothing usable read: an error with a hint, and no output file. */
static void test_zero_samples(void **state) {
    (void)state;
    if (!g_tok) { fprintf(stderr, "skip: embedded model absent\n"); skip(); }
    char p[128], out[128];
    snprintf(out, sizeof out, "%s/zero.dlc", g_dir);
    prep_opts_t po = {.data_path = p, .out_path = out, .chat = &g_ct};
    prep_stats_t st;
    /* empty file */
    snprintf(p, sizeof p, "%s/empty.jsonl", g_dir);
    FILE *f = fopen(p, "w");
    fclose(f);
    assert_int_equal(prep_run(g_tok, &po, &st), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "0 samples from"));
    assert_int_not_equal(access(out, F_OK), 0);
    /* GSM8K-shaped records without --prompt-field: 12 bad lines, hint names the fields */
    snprintf(p, sizeof p, "%s/qa.jsonl", g_dir);
    f = fopen(p, "w");
    for (int i = 0; i < 12; i++) fprintf(f, "{\"question\": \"q%d\", \"answer\": \"a%d\"}\n", i, i);
    fclose(f);
    assert_int_equal(prep_run(g_tok, &po, &st), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "--prompt-field question --response-field answer"));
    assert_int_not_equal(access(out, F_OK), 0);
    /* HumanEval-shaped: the hint names prompt/canonical_solution, not the first two fields */
    snprintf(p, sizeof p, "%s/he.jsonl", g_dir);
    f = fopen(p, "w");
    fputs("{\"task_id\": \"H/0\", \"prompt\": \"def f():\", \"entry_point\": \"f\", "
          "\"canonical_solution\": \"  return 1\", \"test\": \"assert f() == 1\"}\n", f);
    fclose(f);
    assert_int_equal(prep_run(g_tok, &po, &st), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "--prompt-field prompt --response-field canonical_solution"));
    /* MT-Bench-shaped (a number, a string, a turns list): no field pair, regen */
    snprintf(p, sizeof p, "%s/mt.jsonl", g_dir);
    f = fopen(p, "w");
    fputs("{\"question_id\": 81, \"category\": \"writing\", \"turns\": [\"Write a poem.\"]}\n", f);
    fclose(f);
    assert_int_equal(prep_run(g_tok, &po, &st), DL_EFORMAT);
    assert_null(strstr(dl_errmsg(), "--prompt-field"));
    assert_non_null(strstr(dl_errmsg(), "draftline regen"));
    assert_int_not_equal(access(out, F_OK), 0);
    snprintf(p, sizeof p, "%s/qa.jsonl", g_dir);
    po.ds.prompt_field = "question";
    po.ds.response_field = "answer";
    assert_int_equal(prep_run(g_tok, &po, &st), 0);
    assert_int_equal(st.samples, 12);
    unlink(out);
    po.ds = (ds_opts_t){0};
    /* binary file */
    snprintf(p, sizeof p, "%s/bin.jsonl", g_dir);
    f = fopen(p, "wb");
    for (int i = 0; i < 4096; i++) fputc((i * 7919) & 0xff, f);
    fclose(f);
    assert_int_equal(prep_run(g_tok, &po, &st), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "0 samples from"));
    /* a .gz name on a plain-text file */
    snprintf(p, sizeof p, "%s/plain.jsonl.gz", g_dir);
    f = fopen(p, "w");
    fputs("{\"text\": \"one\"}\n", f);
    fclose(f);
    assert_int_equal(prep_run(g_tok, &po, &st), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "not a gzip file"));
    assert_non_null(strstr(dl_errmsg(), p));
    assert_int_not_equal(access(out, F_OK), 0);
}

/* The `draftline prepare` command end to end (needs $DL_BIN_DIR, set by make test). */
static void test_cli(void **state) {
    (void)state;
    const char *bin = getenv("DL_BIN_DIR");
    char exe[4200], src[4200], cmd[9000], out[128];
    if (!bin) { fprintf(stderr, "skip: DL_BIN_DIR not set (make test sets it)\n"); skip(); }
    snprintf(exe, sizeof exe, "%s/draftline", bin);
    snprintf(src, sizeof src, "%s/sharegpt_sample/dummy_conversation.json", g_data);
    if (access(exe, X_OK) != 0) { fprintf(stderr, "skip: %s absent\n", exe); skip(); }
    need(src);
    snprintf(out, sizeof out, "%s/cli.dlc", g_dir);
    snprintf(cmd, sizeof cmd, "%s prepare --data %s --format sharegpt --threads 2 --out %s 2>/dev/null", exe, src, out);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    assert_int_equal(pclose(f), 0);
    assert_non_null(strstr(buf, "samples          500"));
    assert_non_null(strstr(buf, "skipped lines    0"));
    assert_non_null(strstr(buf, "MB/s"));
    dlc_t *c = NULL;
    assert_int_equal(dlc_open(out, &c), 0);
    check_expect(c, cJSON_GetObjectItem(g_expect, "sharegpt"));
    dlc_close(&c);
    /* usage errors exit 2 */
    snprintf(cmd, sizeof cmd, "%s prepare --out %s >/dev/null 2>&1", exe, out);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof cmd, "%s prepare --data %s --chat-template vicuna --out %s >/dev/null 2>&1", exe, src, out);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof cmd, "%s prepare --data /nonexistent.jsonl --out %s >/dev/null 2>&1", exe, out);
    assert_int_equal(WEXITSTATUS(system(cmd)), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gsm8k),
        cmocka_unit_test(test_sharegpt),
        cmocka_unit_test(test_bad_lines_and_atomic),
        cmocka_unit_test(test_zero_samples),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
