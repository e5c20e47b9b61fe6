/* common/data/chat: rendered text identical to transformers' apply_chat_template
 * (SmolLM2's GGUF template, ChatML, Llama-3 on a Llama-3-style tokenizer), ids
 * and assistant-only loss masks
 * identical to HF tokenizers + offsets (tests/fixtures/tokenizer/chat.json). */
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
#include "common/data/chat.h"

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

static void check_ids(const cJSON *want, const int32_t *got, size_t n, const char *what) {
    assert_int_equal((size_t)cJSON_GetArraySize(want), n);
    for (size_t i = 0; i < n; i++)
        if (cJSON_GetArrayItem(want, (int)i)->valueint != got[i])
            fail_msg("%s: token %zu: want %d got %d", what, i, cJSON_GetArrayItem(want, (int)i)->valueint, got[i]);
}

static void test_fixture_cases(void **state) {
    (void)state;
    char model[4096], qdir[1024];
    assert_int_equal(paths_default_model(model, sizeof model), 0);
    snprintf(qdir, sizeof qdir, "%s/tokenizer/qwen3_style", fixtures_dir());
    char ldir[1024];
    snprintf(ldir, sizeof ldir, "%s/tokenizer/llama3_style", fixtures_dir());
    tok_t *smol = NULL, *qwen = NULL, *llama = NULL;
    assert_int_equal(tok_load(ldir, &llama), 0);
    int have_smol = access(model, R_OK) == 0;
    if (have_smol) assert_int_equal(tok_load(model, &smol), 0);
    assert_int_equal(tok_load(qdir, &qwen), 0);
    chat_template_t ct_smol, ct_qwen, ct_llama;
    if (have_smol) {
        assert_int_equal(chat_template_from_tok(smol, &ct_smol), 0);
        assert_int_equal(ct_smol.family, CHAT_CHATML);
        assert_string_equal(ct_smol.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    }
    assert_int_equal(chat_template_from_tok(qwen, &ct_qwen), 0);
    assert_int_equal(ct_qwen.family, CHAT_CHATML);
    assert_string_equal(ct_qwen.default_system, "");
    assert_int_equal(chat_template_from_tok(llama, &ct_llama), 0);
    assert_int_equal(ct_llama.family, CHAT_LLAMA3);

    cJSON *j = load_json("tokenizer/chat.json");
    const cJSON *c;
    int checked = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases")) {
        const char *name = cJSON_GetObjectItem(c, "tokenizer")->valuestring;
        const chat_template_t *ct;
        const tok_t *t;
        if (!strcmp(name, "smollm2")) { if (!have_smol) continue; ct = &ct_smol; t = smol; }
        else if (!strcmp(name, "qwen3_style")) { ct = &ct_qwen; t = qwen; }
        else { ct = &ct_llama; t = llama; }
        const cJSON *ms = cJSON_GetObjectItem(c, "messages");
        int n = cJSON_GetArraySize(ms);
        chat_msg_t msgs[8];
        assert_true(n <= 8);
        for (int i = 0; i < n; i++) {
            const cJSON *m = cJSON_GetArrayItem(ms, i);
            msgs[i].role = cJSON_GetObjectItem(m, "role")->valuestring;
            msgs[i].content = cJSON_GetObjectItem(m, "content")->valuestring;
            msgs[i].content_len = strlen(msgs[i].content);
        }
        char *text;
        size_t len;
        uint32_t *spans;
        int nsp;
        assert_int_equal(chat_render(ct, msgs, n, 0, &text, &len, &spans, &nsp), 0);
        assert_string_equal(text, cJSON_GetObjectItem(c, "text")->valuestring);
        const cJSON *ws = cJSON_GetObjectItem(c, "spans");
        assert_int_equal(nsp, cJSON_GetArraySize(ws));
        for (int i = 0; i < nsp; i++) {
            assert_int_equal(spans[2 * i], cJSON_GetArrayItem(cJSON_GetArrayItem(ws, i), 0)->valueint);
            assert_int_equal(spans[2 * i + 1], cJSON_GetArrayItem(cJSON_GetArrayItem(ws, i), 1)->valueint);
        }
        free(text);
        free(spans);
        /* generation prompt: conversation up to the last assistant turn */
        int ng = !strcmp(msgs[n - 1].role, "assistant") ? n - 1 : n;
        assert_int_equal(chat_render(ct, msgs, ng, 1, &text, &len, NULL, NULL), 0);
        assert_string_equal(text, cJSON_GetObjectItem(c, "gen_text")->valuestring);
        free(text);
        if (t) {
            tok_ids_t ids = {0};
            uint8_t *mask = NULL;
            size_t mcap = 0;
            uint64_t na = 0;
            assert_int_equal(chat_encode(ct, t, msgs, n, &ids, &mask, &mcap, &na), 0);
            check_ids(cJSON_GetObjectItem(c, "ids"), ids.ids, ids.n, name);
            const cJSON *wm = cJSON_GetObjectItem(c, "mask");
            uint64_t wn = 0;
            for (size_t i = 0; i < ids.n; i++) {
                assert_int_equal(mask[i], cJSON_GetArrayItem(wm, (int)i)->valueint);
                wn += mask[i];
            }
            assert_int_equal(na, wn);
            assert_true(na > 0 && na < ids.n);
            ids.n = 0;
            assert_int_equal(chat_encode_prompt(ct, t, msgs, ng, &ids), 0);
            check_ids(cJSON_GetObjectItem(c, "gen_ids"), ids.ids, ids.n, name);
            tok_ids_free(&ids);
            free(mask);
        }
        checked++;
    }
    assert_true(checked >= (have_smol ? 12 : 8));
    cJSON_Delete(j);
    tok_destroy(&smol);
    tok_destroy(&qwen);
    tok_destroy(&llama);
}

static void test_names(void **state) {
    (void)state;
    chat_template_t ct;
    assert_int_equal(chat_template_by_name("smollm2", &ct), 0);
    assert_true(ct.default_system[0] != 0);
    assert_int_equal(chat_template_by_name("qwen", &ct), 0);
    assert_int_equal(ct.family, CHAT_CHATML);
    assert_int_equal(chat_template_by_name("vicuna", &ct), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "vicuna"));
    /* Llama-3 trims content like Jinja's |trim (Python str.strip) */
    chat_template_t l3;
    chat_template_by_name("llama3", &l3);
    chat_msg_t m[2] = {{"user", " \u3000hi\n", strlen(" \u3000hi\n")}, {"assistant", "ok", 2}};
    char *text;
    size_t len;
    assert_int_equal(chat_render(&l3, m, 2, 0, &text, &len, NULL, NULL), 0);
    assert_string_equal(text, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                              "<|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|>");
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_cases),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
