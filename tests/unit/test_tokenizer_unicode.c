/* common/data/uclass + tokenizer: the pre-tokenizer's character classes are those
 * of Hugging Face `tokenizers` 0.23 (Unicode 16.0), not PCRE2 10.42's Unicode 14.0
 * (issue 15 item 10). tests/fixtures/tokenizer_unicode/cases.json, made by its
 * make_fixture.py with `tokenizers`: 1,000 random multi-script strings (code
 * points of Unicode 15.0-17.0, emoji, every space, contractions) and their ids
 * for SmolLM2 (from the GGUF), qwen3_style and llama3_style. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/data/tokenizer.h"
#include "common/data/uclass.h"

static const char *fixtures_dir(void) {
    const char *d = getenv("DL_FIXTURES_DIR");
    return d ? d : "tests/fixtures";
}

static cJSON *load_cases(void) {
    char p[1024];
    snprintf(p, sizeof p, "%s/tokenizer_unicode/cases.json", fixtures_dir());
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

/* Encodes every text with t; returns how many differ from the fixture's ids
 * (the first few printed). Decoding gives the text back (no NFC change here:
 * only checked for non-NFC tokenizers). */
static int mismatches(const tok_t *t, const cJSON *cases, const char *name, int roundtrip) {
    const cJSON *texts = cJSON_GetObjectItem(cases, "texts"), *want = cJSON_GetObjectItem(cases, name);
    assert_int_equal(cJSON_GetArraySize(texts), cJSON_GetArraySize(want));
    int bad = 0, n = cJSON_GetArraySize(texts);
    for (int i = 0; i < n; i++) {
        const char *text = cJSON_GetArrayItem(texts, i)->valuestring;
        const cJSON *ids = cJSON_GetArrayItem(want, i);
        tok_ids_t v = {0};
        assert_int_equal(tok_encode(t, text, strlen(text), 0, 0, &v), 0);
        int ne = cJSON_GetArraySize(ids), ok = (int)v.n == ne;
        for (int k = 0; ok && k < ne; k++) ok = v.ids[k] == cJSON_GetArrayItem(ids, k)->valueint;
        if (!ok && ++bad <= 5) {
            fprintf(stderr, "%s: case %d differs: %s\n  want:", name, i, text);
            for (int k = 0; k < ne; k++) fprintf(stderr, " %d", cJSON_GetArrayItem(ids, k)->valueint);
            fprintf(stderr, "\n  got: ");
            for (size_t k = 0; k < v.n; k++) fprintf(stderr, " %d", v.ids[k]);
            fprintf(stderr, "\n");
        }
        if (roundtrip) {
            char *back;
            size_t bl;
            assert_int_equal(tok_decode(t, v.ids, v.n, 0, &back, &bl), 0);
            assert_int_equal(bl, strlen(text));
            assert_memory_equal(back, text, bl);
            free(back);
        }
        tok_ids_free(&v);
    }
    fprintf(stderr, "%s: %d of %d cases differ from tokenizers\n", name, bad, n);
    return bad;
}

static void test_smollm2_unicode(void **state) {
    (void)state;
    char model[4096];
    assert_int_equal(paths_default_model(model, sizeof model), 0);
    if (access(model, R_OK) != 0) {
        fprintf(stderr, "skip: %s absent (run `make model`)\n", model);
        skip();
    }
    tok_t *t = NULL;
    assert_int_equal(tok_load_gguf(model, &t), 0);
    cJSON *j = load_cases();
    assert_int_equal(mismatches(t, j, "smollm2", 1), 0);
    cJSON_Delete(j);
    tok_destroy(&t);
}

static void test_json_styles_unicode(void **state) {
    (void)state;
    static const char *const names[] = {"qwen3_style", "llama3_style"};
    cJSON *j = load_cases();
    for (int i = 0; i < 2; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/tokenizer/%s", fixtures_dir(), names[i]);
        tok_t *t = NULL;
        int rc = tok_load(p, &t);
        if (rc) fail_msg("%s: %s", dl_strerror(rc), dl_errmsg());
        assert_int_equal(mismatches(t, j, names[i], i == 1), 0);
        tok_destroy(&t);
    }
    cJSON_Delete(j);
}

/* Classes of code points of each Unicode version around PCRE2's 14.0. */
static void test_uclass_of(void **state) {
    (void)state;
    assert_string_equal(uclass_unicode_version(), "16.0.0");
    static const struct { uint32_t cp; int cls; } cases[] = {
        {'a', UCLASS_L}, {'7', UCLASS_N}, {' ', UCLASS_SPACE}, {'\n', UCLASS_SPACE}, {'\'', UCLASS_OTHER},
        {0xE9, UCLASS_L}, {0x85, UCLASS_SPACE}, {0xA0, UCLASS_SPACE}, {0x200B, UCLASS_OTHER},
        {0x3000, UCLASS_SPACE}, {0x4E00, UCLASS_L}, {0x0660, UCLASS_N}, {0x2160, UCLASS_N},
        {0x1F600, UCLASS_OTHER}, {0x10570, UCLASS_L},                             /* 14.0 */
        {0x31350, UCLASS_L}, {0x11F50, UCLASS_N}, {0x1D2C0, UCLASS_N},            /* 15.0 */
        {0x2EBF0, UCLASS_L},                                                       /* 15.1 */
        {0x10D50, UCLASS_L}, {0x10D40, UCLASS_N}, {0x16D70, UCLASS_N},            /* 16.0 */
        {0x10940, UCLASS_OTHER}, {0x323B0, UCLASS_OTHER},                          /* 17.0 */
        {0xD800, UCLASS_OTHER}, {0x10FFFF, UCLASS_OTHER}, {0x110000, UCLASS_OTHER},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (uclass_of(cases[i].cp) != cases[i].cls)
            fail_msg("U+%04X: class %d, want %d", cases[i].cp, uclass_of(cases[i].cp), cases[i].cls);
}

/* The stand-in text keeps length, ASCII and U+017F; each code point's stand-in has
 * its class and its UTF-8 length. */
static void test_uclass_premap(void **state) {
    (void)state;
    const char s[] = "a \xC5\xBF\xF0\xB1\x8D\x90's \xC2\x85\xF0\x90\xB5\x80\xE3\x80\x80\xF0\x9F\x98\x80.";
    size_t n = sizeof s - 1;
    char out[sizeof s];
    assert_int_equal(uclass_premap(s, n, out), 1);
    assert_memory_equal(out, "a \xC5\xBF", 4);
    assert_memory_equal(out + 8, "'s ", 3);
    assert_int_equal(out[n - 1], '.');
    for (size_t i = 0; i < n;) {
        uint32_t a, b;
        int la = uclass_utf8_dec((const unsigned char *)s + i, n - i, &a);
        int lb = uclass_utf8_dec((const unsigned char *)out + i, n - i, &b);
        assert_true(la > 0);
        assert_int_equal(la, lb);
        assert_int_equal(uclass_of(a), uclass_of(b));
        i += (size_t)la;
    }
    assert_int_equal(uclass_premap("plain ascii", 11, out), 0);
    assert_memory_equal(out, "plain ascii", 11);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uclass_of),
        cmocka_unit_test(test_uclass_premap),
        cmocka_unit_test(test_smollm2_unicode),
        cmocka_unit_test(test_json_styles_unicode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
