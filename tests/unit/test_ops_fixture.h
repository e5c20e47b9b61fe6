/* Test-only helpers shared by tests/unit/test_ops_*.c and test_drafter*.c:
 * load the JSON fixtures written by tests/fixtures/<area>/make_*.py (tensors as
 * {"shape": [...], "data": [...]}) and compare arrays with a stated tolerance.
 * Header-only (static functions) because tests link one .c each. */
#ifndef DL_TESTS_TEST_OPS_FIXTURE_H
#define DL_TESTS_TEST_OPS_FIXTURE_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parses tests/fixtures/<area>/<name>.json (path relative to the repo root, where
 * tests run); aborts the test with a message when missing. */
static inline cJSON *fx_load(const char *area, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "tests/fixtures/%s/%s.json", area, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fixture %s not found (run tests from the repo root)\n", path);
        abort();
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) abort();
    buf[n] = 0;
    fclose(f);
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    if (!j) {
        fprintf(stderr, "fixture %s: bad JSON\n", path);
        abort();
    }
    return j;
}

static inline const cJSON *fx__get(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v) {
        fprintf(stderr, "fixture: missing key '%s'\n", key);
        abort();
    }
    return v;
}

static inline int fx_int(const cJSON *j, const char *key) { return (int)fx__get(j, key)->valuedouble; }
static inline double fx_num(const cJSON *j, const char *key) { return fx__get(j, key)->valuedouble; }

/* Element count of tensor `key`. */
static inline size_t fx_numel(const cJSON *j, const char *key) {
    return (size_t)cJSON_GetArraySize(fx__get(fx__get(j, key), "data"));
}

/* New malloc'd float copy of tensor `key` (n elements written to *n if non-NULL). */
static inline float *fx_f32(const cJSON *j, const char *key, size_t *n) {
    const cJSON *d = fx__get(fx__get(j, key), "data");
    size_t cnt = (size_t)cJSON_GetArraySize(d), i = 0;
    float *out = malloc((cnt ? cnt : 1) * sizeof(float));
    const cJSON *e;
    cJSON_ArrayForEach(e, d) out[i++] = (float)e->valuedouble;
    if (n) *n = cnt;
    return out;
}

static inline int32_t *fx_i32(const cJSON *j, const char *key, size_t *n) {
    const cJSON *d = fx__get(fx__get(j, key), "data");
    size_t cnt = (size_t)cJSON_GetArraySize(d), i = 0;
    int32_t *out = malloc((cnt ? cnt : 1) * sizeof(int32_t));
    const cJSON *e;
    cJSON_ArrayForEach(e, d) out[i++] = (int32_t)e->valuedouble;
    if (n) *n = cnt;
    return out;
}

/* Max |a-b| / (atol + rtol*|b|) over n elements; <= 1 passes. Prints the worst. */
static inline double fx_check(const char *what, const float *a, const float *b, size_t n, double atol,
                       double rtol) {
    double worst = 0.0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
        if (!(e <= worst)) { worst = e; wi = i; }
    }
    if (worst > 1.0 || isnan(worst))
        fprintf(stderr, "%s: mismatch at %zu: got %.8g want %.8g (err ratio %.3g)\n", what, wi,
                a[wi], b[wi], worst);
    return worst;
}

#endif
