/* Tokenizer throughput (CPU only): tok_encode over two corpora, one thread, best of
 * 5 passes of thread CPU time, in MB/s (10^6 bytes of UTF-8 in) and tokens/s:
 *   english: the first 4 MB of ../shared/data/gsm8k/train.jsonl (raw lines);
 *   multi:   tests/fixtures/tokenizer_unicode/cases.json's strings (scripts of
 *            Unicode 1.1-17.0, emoji, spaces) repeated to 4 MB.
 * Tokenizers: SmolLM2 (the default GGUF; --model PATH) and tests/fixtures/tokenizer/
 * qwen3_style (NFC + the Qwen2 regex). Run from the repository root.
 * Usage: bench_tokenizer [--model PATH] [--quick] */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/data/tokenizer.h"

#define CORPUS_BYTES (4u << 20)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time: the machine is shared */
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path, size_t max, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = malloc(max + 1);
    *n = s ? fread(s, 1, max, f) : 0;
    fclose(f);
    if (s) s[*n] = 0;
    return s;
}

/* The fixture's strings, newline-joined and repeated to CORPUS_BYTES. */
static char *multi_corpus(size_t *n) {
    size_t len;
    char *js = slurp("tests/fixtures/tokenizer_unicode/cases.json", 1u << 22, &len);
    cJSON *j = js ? cJSON_Parse(js) : NULL;
    free(js);
    const cJSON *texts = j ? cJSON_GetObjectItem(j, "texts") : NULL;
    if (!texts) { cJSON_Delete(j); return NULL; }
    char *s = malloc(CORPUS_BYTES + 4096);
    size_t o = 0;
    while (s && o < CORPUS_BYTES) {
        const cJSON *it;
        cJSON_ArrayForEach(it, texts) {
            size_t l = strlen(it->valuestring);
            if (o + l + 1 > CORPUS_BYTES) break;
            memcpy(s + o, it->valuestring, l);
            o += l;
            s[o++] = '\n';
        }
        if (o + 4096 > CORPUS_BYTES) break;
    }
    cJSON_Delete(j);
    *n = o;
    return s;
}

/* Encodes text line by line (as prepare does per sample); best of passes. */
static void run(const char *tname, const tok_t *t, const char *cname, const char *s, size_t n, int passes) {
    double best = 1e30;
    size_t ntok = 0;
    for (int p = 0; p < passes; p++) {
        tok_ids_t v = {0};
        double t0 = now_s();
        size_t i = 0;
        ntok = 0;
        while (i < n) {
            const char *nl = memchr(s + i, '\n', n - i);
            size_t l = nl ? (size_t)(nl - (s + i)) + 1 : n - i;
            v.n = 0;
            if (tok_encode(t, s + i, l, 1, 0, &v) < 0) { fprintf(stderr, "encode: %s\n", dl_errmsg()); exit(1); }
            ntok += v.n;
            i += l;
        }
        double dt = now_s() - t0;
        if (dt < best) best = dt;
        tok_ids_free(&v);
    }
    printf("%-12s %-8s %6.2f MB  %7.2f MB/s  %9.0f tokens/s\n", tname, cname, n / 1e6, n / 1e6 / best, ntok / best);
}

int main(int argc, char **argv) {
    char model[4096] = "";
    int passes = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) snprintf(model, sizeof model, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--quick")) passes = 1;
        else { fprintf(stderr, "usage: bench_tokenizer [--model PATH] [--quick]\n"); return 2; }
    }
    if (!model[0] && paths_default_model(model, sizeof model) < 0) return 1;
    char data[4096];
    if (paths_shared_data(data, sizeof data) < 0) return 1;
    strncat(data, "/gsm8k/train.jsonl", sizeof data - strlen(data) - 1);
    size_t ne = 0, nm = 0;
    char *en = slurp(data, CORPUS_BYTES, &ne), *mu = multi_corpus(&nm);
    if (!en || !mu) { printf("SKIP: %s or the tokenizer_unicode fixture not found (run from the repo root)\n", data); return 0; }
    const char *names[2] = {"smollm2", "qwen3_style"};
    const char *paths[2] = {model, "tests/fixtures/tokenizer/qwen3_style"};
    for (int k = 0; k < 2; k++) {
        tok_t *t = NULL;
        if (tok_load(paths[k], &t) < 0) { printf("SKIP %s: %s\n", names[k], dl_errmsg()); continue; }
        run(names[k], t, "english", en, ne, passes);
        run(names[k], t, "multi", mu, nm, passes);
        tok_destroy(&t);
    }
    free(en);
    free(mu);
    return 0;
}
