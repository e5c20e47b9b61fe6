/* common/data/tokenizer: encodings identical to Hugging Face `tokenizers` 0.23
 * (tests/fixtures/tokenizer/encodings.json, made by make_fixtures.py) for the
 * embedded SmolLM2 tokenizer (loaded from the GGUF), a Qwen3-style and a
 * Llama-3-style (ignore_merges) tokenizer.json; decode(encode(x)) == x; error paths. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/data/nfc.h"
#include "common/data/tokenizer.h"

static const char *fixtures_dir(void) {
    const char *d = getenv("DL_FIXTURES_DIR");
    return d ? d : "tests/fixtures";
}

static cJSON *load_json(const char *rel) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", fixtures_dir(), rel);
    FILE *f = fopen(p, "rb");
    if (!f) fail_msg("cannot open %s", p);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    s[n] = 0;
    cJSON *j = cJSON_Parse(s);
    free(s);
    assert_non_null(j);
    return j;
}

/* Every text of the set: ids equal, offsets monotone, decode round-trips. */
static int check_set(const tok_t *t, const cJSON *rows, int roundtrip) {
    const cJSON *row;
    int n = 0, n_changed = 0;
    cJSON_ArrayForEach(row, rows) {
        const char *text = cJSON_GetObjectItem(row, "text")->valuestring;
        const cJSON *ids = cJSON_GetObjectItem(row, "ids");
        tok_ids_t v = {.want_offsets = 1};
        assert_int_equal(tok_encode(t, text, strlen(text), 1, 0, &v), 0);
        int ne = cJSON_GetArraySize(ids);
        int ok = (int)v.n == ne;
        for (int i = 0; ok && i < ne; i++) ok = v.ids[i] == cJSON_GetArrayItem(ids, i)->valueint;
        if (!ok) {
            fprintf(stderr, "mismatch on %s\n  want:", text);
            for (int i = 0; i < ne; i++) fprintf(stderr, " %d", cJSON_GetArrayItem(ids, i)->valueint);
            fprintf(stderr, "\n  got: ");
            for (size_t i = 0; i < v.n; i++) fprintf(stderr, " %d", v.ids[i]);
            fprintf(stderr, "\n");
        }
        assert_true(ok);
        /* offsets point into the original text; with NFC two tokens can start in
         * the same source character */
        for (size_t i = 1; i < v.n; i++) assert_true(v.offs[i] >= v.offs[i - 1]);
        if (v.n) assert_true(v.offs[v.n - 1] < strlen(text));
        if (roundtrip) {
            /* decode(encode(x)) == x, or NFC(x) (HF's decode) for an NFC tokenizer */
            const char *want = cJSON_GetObjectItem(row, "decoded")->valuestring;
            char *back;
            size_t bl;
            assert_int_equal(tok_decode(t, v.ids, v.n, 0, &back, &bl), 0);
            assert_int_equal(bl, strlen(want));
            assert_memory_equal(back, want, bl);
            if (strcmp(want, text)) n_changed++;
            free(back);
        }
        tok_ids_free(&v);
        n++;
    }
    assert_true(n >= 20);
    return n_changed;
}

static void test_smollm2_gguf(void **state) {
    (void)state;
    char model[4096];
    assert_int_equal(paths_default_model(model, sizeof model), 0);
    if (access(model, R_OK) != 0) {
        fprintf(stderr, "skip: %s absent (run `make model`)\n", model);
        skip();
    }
    tok_t *t = NULL;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = tok_load_gguf(model, &t);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (rc) fail_msg("%s: %s", dl_strerror(rc), dl_errmsg());
    fprintf(stderr, "loaded SmolLM2 tokenizer in %.1f ms\n", (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);
    assert_int_equal(tok_n_vocab(t), 49152);
    assert_string_equal(tok_pre_name(t), "smollm");
    assert_int_equal(tok_bos_id(t), 1);
    assert_int_equal(tok_eos_id(t), 2);
    assert_int_equal(tok_token_id(t, "<|im_start|>"), 1);
    assert_true(tok_is_special(t, 2));
    assert_non_null(tok_chat_template(t));
    cJSON *j = load_json("tokenizer/encodings.json");
    assert_int_equal(check_set(t, cJSON_GetObjectItem(j, "smollm2"), 1), 0);
    /* parse_special = 0: the special text is plain text, never id 1 */
    tok_ids_t v = {0};
    assert_int_equal(tok_encode(t, "<|im_start|>", 12, 0, 0, &v), 0);
    assert_true(v.n > 1);
    for (size_t i = 0; i < v.n; i++) assert_int_not_equal(v.ids[i], 1);
    /* skip_special drops them on decode */
    int32_t ids[3] = {1, tok_token_id(t, "hi"), 2};
    assert_true(ids[1] > 2);
    char *s;
    size_t n;
    assert_int_equal(tok_decode(t, ids, 3, 1, &s, &n), 0);
    assert_string_equal(s, "hi");
    free(s);
    ids[0] = 49152;
    assert_int_equal(tok_decode(t, ids, 3, 0, &s, &n), DL_ERANGE);
    tok_ids_free(&v);
    uint64_t fp = tok_fingerprint(t);
    tok_destroy(&t);
    assert_null(t);
    tok_destroy(&t);
    /* fingerprint is stable across loads */
    assert_int_equal(tok_load_gguf(model, &t), 0);
    assert_true(tok_fingerprint(t) == fp);
    tok_destroy(&t);
    cJSON_Delete(j);
}

static void test_qwen3_style_json(void **state) {
    (void)state;
    char p[1024];
    snprintf(p, sizeof p, "%s/tokenizer/qwen3_style", fixtures_dir());
    tok_t *t = NULL;
    int rc = tok_load(p, &t);
    if (rc) fail_msg("%s: %s", dl_strerror(rc), dl_errmsg());
    assert_string_equal(tok_pre_name(t), "qwen2");
    assert_int_equal(tok_token_id(t, "<|im_end|>"), 3002);
    assert_int_equal(tok_eos_id(t), 3002);
    assert_true(tok_is_special(t, 3002));
    assert_false(tok_is_special(t, tok_token_id(t, "<think>")));
    assert_non_null(tok_chat_template(t));
    cJSON *j = load_json("tokenizer/encodings.json");
    /* the three non-NFC texts come back normalized, like HF */
    assert_int_equal(check_set(t, cJSON_GetObjectItem(j, "qwen3_style"), 1), 3);
    cJSON_Delete(j);
    /* a different tokenizer has a different fingerprint */
    char model[4096];
    tok_t *g = NULL;
    if (paths_default_model(model, sizeof model) == 0 && access(model, R_OK) == 0 && tok_load(model, &g) == 0) {
        assert_true(tok_fingerprint(g) != tok_fingerprint(t));
        tok_destroy(&g);
    }
    tok_destroy(&t);
}

static void test_llama3_style_json(void **state) {
    (void)state;
    char p[1024];
    snprintf(p, sizeof p, "%s/tokenizer/llama3_style/tokenizer.json", fixtures_dir());
    tok_t *t = NULL;
    int rc = tok_load(p, &t);
    if (rc) fail_msg("%s: %s", dl_strerror(rc), dl_errmsg());
    assert_string_equal(tok_pre_name(t), "llama3");
    assert_int_equal(tok_bos_id(t), tok_token_id(t, "<|begin_of_text|>"));
    assert_true(tok_is_special(t, tok_token_id(t, "<|eot_id|>")));
    cJSON *j = load_json("tokenizer/encodings.json");
    assert_int_equal(check_set(t, cJSON_GetObjectItem(j, "llama3_style"), 1), 0);
    cJSON_Delete(j);
    tok_destroy(&t);
}

/* Arbitrary bytes (invalid UTF-8, NULs, long runs) round-trip and never crash;
 * a long valid text encodes in one call with offsets strictly increasing. */
static void test_robust_roundtrip(void **state) {
    (void)state;
    char p[1024];
    snprintf(p, sizeof p, "%s/tokenizer/qwen3_style", fixtures_dir());
    tok_t *t = NULL;
    assert_int_equal(tok_load(p, &t), 0);
    uint64_t x = 88172645463325252ull;
    char *buf = malloc(1 << 20);
    for (int round = 0; round < 40; round++) {
        size_t n = (size_t)(round * 997) % 5000 + 1;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            buf[i] = round % 3 == 0 ? (char)(x & 0xff) : round % 3 == 1 ? " \n\t<|im_end|>ab\xc3\xa9"[x % 16] : (char)(0x20 + x % 95);
        }
        tok_ids_t v = {0};
        assert_int_equal(tok_encode(t, buf, n, round & 1, 0, &v), 0);
        char *back;
        size_t bl;
        assert_int_equal(tok_decode(t, v.ids, v.n, 0, &back, &bl), 0);
        assert_int_equal(bl, n);
        assert_memory_equal(back, buf, n);
        free(back);
        tok_ids_free(&v);
    }
    /* 1 MiB of text with long whitespace runs */
    size_t n = 0;
    while (n + 64 < (1 << 20)) n += (size_t)snprintf(buf + n, 64, "word%zu %s", n, n % 7 ? "" : "          \n\n\t ");
    tok_ids_t v = {.want_offsets = 1};
    assert_int_equal(tok_encode(t, buf, n, 1, 100, &v), 0);
    assert_int_equal(v.offs[0], 100);
    for (size_t i = 1; i < v.n; i++) assert_true(v.offs[i] > v.offs[i - 1]);
    char *back;
    size_t bl;
    assert_int_equal(tok_decode(t, v.ids, v.n, 0, &back, &bl), 0);
    assert_int_equal(bl, n);
    assert_memory_equal(back, buf, n);
    free(back);
    tok_ids_free(&v);
    free(buf);
    tok_destroy(&t);
}

/* nfc_normalize of each case of a fixture made by Python's unicodedata.normalize
 * ("NFC"); the map (monotonic, map[on] = n) and the no-map call give the same
 * text. Returns the number of cases, *changed those NFC changes. The fixtures
 * come from Python's unicodedata 14.0.0 and nfc.c uses utf8proc 2.8's Unicode
 * 15.0.0 data; Unicode's normalization stability policy keeps the NFC of text
 * of characters assigned in 14.0 (every fixture character) the same in 15.0, so
 * no case differs by version. */
static int check_nfc_fixture(const char *rel, int *changed) {
    cJSON *j = load_json(rel);
    const cJSON *c;
    int n = 0;
    *changed = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases")) {
        const char *in = cJSON_GetArrayItem(c, 0)->valuestring, *want = cJSON_GetArrayItem(c, 1)->valuestring;
        char *out, *out2;
        size_t on, on2;
        uint32_t *map;
        size_t inl = strlen(in);
        assert_int_equal(nfc_normalize(in, inl, &out, &on, &map), 0);
        const char *got = out ? out : in;
        if (strcmp(got, want)) fail_msg("%s case %d: NFC mismatch", rel, n);
        assert_int_equal(nfc_normalize(in, inl, &out2, &on2, NULL), 0);
        assert_true((out == NULL) == (out2 == NULL));
        if (out) {
            (*changed)++;
            assert_int_equal(on, strlen(want));
            assert_int_equal(map[on], inl);
            for (size_t k = 0; k < on; k++) assert_true(map[k] <= map[k + 1] && map[k] < inl);
            assert_int_equal(on2, on);
            assert_string_equal(out2, out);
        } else {
            assert_string_equal(in, want);
            assert_null(map);
        }
        free(out);
        free(out2);
        free(map);
        n++;
    }
    cJSON_Delete(j);
    return n;
}

/* nfc_normalize vs Python unicodedata.normalize("NFC") on 300 random strings of
 * combining marks (all classes), Hangul jamo, singletons and exclusions
 * (nfc.json), and on Hangul edge cases with U+11A7 (nfc_edge.json: utf8proc 2.8's
 * own composition drops U+11A7 after an LV syllable; nfc.c must not). */
static void test_nfc(void **state) {
    (void)state;
    int changed;
    assert_int_equal(check_nfc_fixture("tokenizer/nfc.json", &changed), 300);
    assert_true(changed > 100);
    assert_int_equal(check_nfc_fixture("tokenizer/nfc_edge.json", &changed), 217);
    assert_true(changed > 20);
}

/* Invalid UTF-8 (as utf8proc and tokenizer.c's utf8_valid judge it) is DL_EINVAL
 * with nothing allocated; text below U+0300 is returned unchecked. */
static void test_nfc_invalid(void **state) {
    (void)state;
    static const char *bad[] = {"e\xcc", "\xcc\x81\xff", "\xed\xa0\x80", "\xe0\x80\x80\xcc\x81",
                                "\xf4\x90\x80\x80", "\xcc\x81\x80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out = (char *)1;
        size_t on;
        uint32_t *map = (uint32_t *)1;
        assert_int_equal(nfc_normalize(bad[i], strlen(bad[i]), &out, &on, &map), DL_EINVAL);
        assert_null(out);
        assert_null(map);
    }
    char *out;
    size_t on;
    assert_int_equal(nfc_normalize("a\x80" "b", 3, &out, &on, NULL), 0);
    assert_null(out);
}

static void test_errors(void **state) {
    (void)state;
    tok_t *t = NULL;
    assert_int_equal(tok_load("/nonexistent/tokenizer.json", &t), DL_ENOENT);
    char p[] = "/tmp/dl_tok_bad_XXXXXX";
    int fd = mkstemp(p);
    assert_true(fd >= 0);
    const char bad[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}";
    assert_int_equal(write(fd, bad, sizeof bad - 1), (ssize_t)(sizeof bad - 1));
    close(fd);
    assert_int_equal(tok_load_json(p, &t), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "merges[0]"));
    FILE *f = fopen(p, "w");
    fputs("{\"model\": {\"type\": \"Unigram\"}}", f);
    fclose(f);
    assert_int_equal(tok_load_json(p, &t), DL_ENOTSUP);
    f = fopen(p, "w");
    fputs("{\"model\": ", f);
    fclose(f);
    assert_int_equal(tok_load_json(p, &t), DL_EFORMAT);
    assert_null(t);
    unlink(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2_gguf),
        cmocka_unit_test(test_qwen3_style_json),
        cmocka_unit_test(test_llama3_style_json),
        cmocka_unit_test(test_robust_roundtrip),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test(test_nfc_invalid),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
