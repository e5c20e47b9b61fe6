/* state.bin version 2 (common/pipe/ckpt.c): the master weights are written once, in
 * model.safetensors, and read back from it. On the small drafter of tests/fixtures/drafter
 * (layout only) with random master, m, v:
 *  - ckpt_write: state.bin is header + m + v (168 + 8 P bytes), version 2, its
 *    master_crc32 the CRC-32 of the master; ckpt_read gives master, m, v and the cursor
 *    back bitwise; ckpt_verify passes with nothing unverified;
 *  - one byte flipped in a tensor of model.safetensors: ckpt_read and ckpt_verify refuse
 *    naming model.safetensors; the same with the file's own data CRC patched to match
 *    (a model.safetensors that is consistent but not this checkpoint's master): refused
 *    too, against state.bin's master_crc32;
 *  - a tensor of the drafter missing from model.safetensors (renamed), or the file gone:
 *    ckpt_read names the file and the tensor;
 *  - a version-1 state.bin (header + master + m + v, as written before) still reads,
 *    its master from state.bin (not model.safetensors), and passes ckpt_verify; a
 *    version-1 header with a master_crc32 is refused naming the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/base/rng.h"
#include "common/data/batcher.h"
#include "common/model/dflash_ckpt.h"
#include "common/model/drafter.h"
#include "common/ops/ops.h"
#include "common/pipe/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define STEP 6
#define K 2
#define SEED 11

static char root[256];
static ops_ctx_t ops;
static drafter_t *d;
static size_t P;
static float *w0, *m0, *v0;   /* what was written */
static uint8_t cur0[BATCHER_CURSOR_BYTES];

static int setup(void **state) {
    (void)state;
    snprintf(root, sizeof root, "/tmp/dl_ckv2_XXXXXX");
    if (!mkdtemp(root)) return -1;
    drafter_config_t c;
    if (dflash_config_load("tests/fixtures/drafter", &c) < 0) return -1;
    ops_cpu_init(&ops, 1);
    static const float no_embed[1];
    drafter_new_opts_t lo = {.layout_only = 1};
    if (drafter_new_opts(&ops, &c, no_embed, no_embed, 1, 1, 0, &lo, &d) < 0) return -1;
    P = drafter_n_params(d);
    w0 = malloc(P * 4), m0 = malloc(P * 4), v0 = malloc(P * 4);
    if (!w0 || !m0 || !v0) return -1;
    rng_t r;
    rng_seed(&r, 7);
    for (size_t i = 0; i < P; i++) {
        w0[i] = rng_normal(&r) * 0.02f;
        m0[i] = rng_normal(&r) * 1e-3f;
        v0[i] = rng_normal(&r) * rng_normal(&r) * 1e-6f;
    }
    batcher_cursor_t bc;
    memset(&bc, 0, sizeof bc);
    bc.next_mb = STEP * K;
    bc.seed = SEED;
    batcher_cursor_encode(&bc, cur0);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0) return -1;
    free(w0), free(m0), free(v0);
    drafter_destroy(&d);
    return 0;
}

static ckpt_state_hdr_t header(void) {
    ckpt_state_hdr_t h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.version = CKPT_VERSION;
    h.header_bytes = sizeof h;
    h.step = STEP;
    h.n_params = P;
    h.seed = SEED;
    h.tokens = 12345;
    h.mbs_per_step = K;
    h.lr = 3e-3, h.warmup_steps = 2, h.max_steps = 10, h.wd = 0.01, h.clip = 1;
    return h;
}

/* a fresh checkpoint of w0, m0, v0 in <root>/<name>; its dir into dir */
static void write_ckpt(const char *name, char *dir, size_t cap) {
    char out[400];
    snprintf(out, sizeof out, "%s/%s", root, name);
    ckpt_state_hdr_t h = header();
    assert_int_equal(ckpt_write(out, d, &h, w0, m0, v0, cur0, dir, cap), 0);
}

static long file_size(const char *dir, const char *name) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    return (long)sb.st_size;
}

/* model.safetensors of dir: its bytes (malloc'd), header length, file length */
static uint8_t *model_bytes(const char *dir, size_t *n, uint64_t *hl) {
    char p[4400];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    uint8_t *b = malloc(*n);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    memcpy(hl, b, 8);
    return b;
}

static void put_model(const char *dir, const uint8_t *b, size_t n) {
    char p[4400];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* ckpt_read of dir fails with rc, its message holding each of wants (NULL-terminated) */
static void expect_read_error(const char *dir, int rc, const char *const *wants) {
    float *w = malloc(P * 4), *m = malloc(P * 4), *v = malloc(P * 4);
    ckpt_state_hdr_t h;
    int got = ckpt_read(dir, d, &h, w, m, v, NULL);
    int ok = got == rc;
    for (int i = 0; wants[i]; i++) ok = ok && strstr(dl_errmsg(), wants[i]);
    if (!ok) fprintf(stderr, "ckpt_read %s: %d (%s), want %d and \"%s\"\n", dir, got, dl_errmsg(), rc, wants[0]);
    assert_true(ok);
    free(w), free(m), free(v);
}

static void expect_verify_error(const char *dir, const char *const *wants) {
    unsigned un = 0;
    int got = ckpt_verify(dir, &un);
    int ok = got == DL_EFORMAT;
    for (int i = 0; wants[i]; i++) ok = ok && strstr(dl_errmsg(), wants[i]);
    if (!ok) fprintf(stderr, "ckpt_verify %s: %d (%s), want DL_EFORMAT and \"%s\"\n", dir, got, dl_errmsg(), wants[0]);
    assert_true(ok);
}

static void test_write_read(void **state) {
    (void)state;
    char dir[4200];
    write_ckpt("rt", dir, sizeof dir);
    assert_int_equal(file_size(dir, "state.bin"), (long)(sizeof(ckpt_state_hdr_t) + 8 * P));
    size_t n;
    uint64_t hl;
    free(model_bytes(dir, &n, &hl));
    assert_int_equal(n, 8 + hl + 4 * P);   /* F32: the master, once */
    printf("P %zu: state.bin %ld bytes + model.safetensors %zu bytes\n", P, file_size(dir, "state.bin"), n);
    ckpt_state_hdr_t h;
    assert_int_equal(ckpt_read_hdr(dir, &h), 0);
    assert_int_equal(h.version, CKPT_VERSION);
    assert_int_equal(h.crc_kind, CKPT_CRC32);
    uLong crc = crc32_z(crc32_z(0, Z_NULL, 0), (const Bytef *)w0, P * 4);
    assert_int_equal(h.master_crc32, (uint32_t)crc);
    float *w = malloc(P * 4), *m = malloc(P * 4), *v = malloc(P * 4);
    uint8_t cur[BATCHER_CURSOR_BYTES];
    assert_int_equal(ckpt_read(dir, d, &h, w, m, v, cur), 0);
    assert_memory_equal(w, w0, P * 4);
    assert_memory_equal(m, m0, P * 4);
    assert_memory_equal(v, v0, P * 4);
    assert_memory_equal(cur, cur0, sizeof cur);
    assert_int_equal(h.step, STEP);
    assert_int_equal(h.tokens, 12345);
    unsigned un = 99;
    assert_int_equal(ckpt_verify(dir, &un), 0);
    assert_int_equal(un, 0);
    free(w), free(m), free(v);
}

/* one byte of the data of the drafter's last tensor (its middle) flipped */
static void flip_tensor_byte(uint8_t *b, size_t n, uint64_t hl) {
    const drafter_tensor_t *t = drafter_tensor(d, drafter_n_tensors(d) - 1);
    size_t at = 8 + hl + 4 * (t->offset + t->numel / 2) + 1;
    assert_true(at < n);
    b[at] ^= 0x10;
}

static void test_flipped_byte(void **state) {
    (void)state;
    char dir[4200];
    write_ckpt("flip", dir, sizeof dir);
    size_t n;
    uint64_t hl;
    uint8_t *b = model_bytes(dir, &n, &hl);
    flip_tensor_byte(b, n, hl);
    put_model(dir, b, n);
    const char *w[] = {"model.safetensors", "checksum", NULL};
    expect_read_error(dir, DL_EFORMAT, w);
    expect_verify_error(dir, w);
    /* the file's own CRC made to match its data: consistent, but not this master */
    uLong crc = crc32_z(crc32_z(0, Z_NULL, 0), b + 8 + hl, n - 8 - hl);
    char key[64], hex[16];
    snprintf(key, sizeof key, "\"%s\":\"", DFLASH_CRC_KEY);
    char *at = memmem(b + 8, hl, key, strlen(key));
    assert_non_null(at);
    snprintf(hex, sizeof hex, "%08lx", (unsigned long)crc);
    memcpy(at + strlen(key), hex, 8);
    put_model(dir, b, n);
    int ok = 0;
    assert_int_equal(dflash_ckpt_verify_weights(dir, &ok), 0);   /* the file alone passes */
    assert_int_equal(ok, 1);
    const char *wr[] = {"model.safetensors", "master weights checksum mismatch", NULL};
    expect_read_error(dir, DL_EFORMAT, wr);
    const char *wv[] = {"model.safetensors", "not the master weights state.bin records", NULL};
    expect_verify_error(dir, wv);
    free(b);
}

static void test_missing_tensor(void **state) {
    (void)state;
    char dir[4200];
    write_ckpt("miss", dir, sizeof dir);
    size_t n;
    uint64_t hl;
    uint8_t *b = model_bytes(dir, &n, &hl);
    const char *name = drafter_tensor(d, 0)->name;
    char key[300];
    snprintf(key, sizeof key, "\"%s\"", name);
    char *at = memmem(b + 8, hl, key, strlen(key));
    assert_non_null(at);
    at[strlen(key) - 2] ^= 0x01;   /* the name's last character: another name, same length */
    put_model(dir, b, n);
    const char *w[] = {"model.safetensors", name, "missing", NULL};
    expect_read_error(dir, DL_EFORMAT, w);
    free(b);
    char p[4300];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(unlink(p), 0);
    const char *w2[] = {"model.safetensors", NULL};
    expect_read_error(dir, DL_ENOENT, w2);
}

/* <root>/v1/checkpoints/step_6: a version-1 state.bin of w0 (with its CRC-32, as the
 * code before version 2 wrote it), cursor.bin, and config.json + model.safetensors of
 * other weights (so the master can only come from state.bin). */
static void make_v1(char *dir, size_t cap, uint32_t master_crc32) {
    float *other = malloc(P * 4);
    for (size_t i = 0; i < P; i++) other[i] = -w0[i];
    char out[400];
    snprintf(out, sizeof out, "%s/v1", root);
    ckpt_state_hdr_t h = header();
    assert_int_equal(ckpt_write(out, d, &h, other, m0, v0, cur0, dir, cap), 0);
    free(other);
    h.version = CKPT_VERSION_MASTER;
    h.crc_kind = CKPT_CRC32;
    h.master_crc32 = master_crc32;
    uLong crc = crc32_z(crc32_z(0, Z_NULL, 0), (const Bytef *)&h, sizeof h);
    const float *arr[3] = {w0, m0, v0};
    for (int i = 0; i < 3; i++) crc = crc32_z(crc, (const Bytef *)arr[i], P * 4);
    h.crc32 = (uint32_t)crc;
    char p[4300];
    snprintf(p, sizeof p, "%s/state.bin", dir);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(&h, sizeof h, 1, f), 1);
    for (int i = 0; i < 3; i++) assert_int_equal(fwrite(arr[i], 4, P, f), P);
    assert_int_equal(fclose(f), 0);
}

static void test_v1_still_reads(void **state) {
    (void)state;
    char dir[4200];
    make_v1(dir, sizeof dir, 0);
    assert_int_equal(file_size(dir, "state.bin"), (long)(sizeof(ckpt_state_hdr_t) + 12 * P));
    float *w = malloc(P * 4), *m = malloc(P * 4), *v = malloc(P * 4);
    ckpt_state_hdr_t h;
    uint8_t cur[BATCHER_CURSOR_BYTES];
    assert_int_equal(ckpt_read(dir, d, &h, w, m, v, cur), 0);
    assert_int_equal(h.version, CKPT_VERSION_MASTER);
    assert_memory_equal(w, w0, P * 4);   /* state.bin's master, not model.safetensors' */
    assert_memory_equal(m, m0, P * 4);
    assert_memory_equal(v, v0, P * 4);
    assert_memory_equal(cur, cur0, sizeof cur);
    unsigned un = 99;
    assert_int_equal(ckpt_verify(dir, &un), 0);
    assert_int_equal(un, 0);
    free(w), free(m), free(v);
    make_v1(dir, sizeof dir, 0x1234);   /* version 1 has no master_crc32 */
    const char *want[] = {"state.bin", "master_crc32", NULL};
    expect_read_error(dir, DL_EFORMAT, want);
    expect_verify_error(dir, want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_read),
        cmocka_unit_test(test_flipped_byte),
        cmocka_unit_test(test_missing_tensor),
        cmocka_unit_test(test_v1_still_reads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
