/* Corrupt inputs are refused before any stage starts (issue 15 items 1, 18, 19), on the
 * tiny random Llama-shaped target of test_pipeline and 60 GSM8K samples:
 *
 *  - a 2-step run (checkpoint step_2); an untouched copy passes `inspect` and continues
 *    with `run --resume`;
 *  - 16 bytes flipped in the middle of state.bin, or in the tensor data of
 *    model.safetensors: `run --resume` exits 2 in < 10 s naming the file, no stage started;
 *    `inspect` of the checkpoint exits non-zero naming the file;
 *  - state.bin header fields out of range, written as a checkpoint without a checksum
 *    would hold them (the checksum fields zeroed): token_budget 0, lr NaN / -1, weight
 *    decay inf, clip NaN, warmup 1e300, max_steps NaN, settings with a bit flipped, a step
 *    that disagrees with cursor.bin: each refused (exit 2) naming the field and the file;
 *  - model.safetensors' header edited into valid JSON (a tensor renamed, two swapped, a
 *    dtype changed; the data and its CRC-32 untouched): refused (exit 2) naming the file
 *    and the tensor, no stage started (state.bin version 2 reads the master from it);
 *  - checkpoints/latest naming a checkpoint without state.bin: refused naming both;
 *  - a .dlc cache with a negative token id, an id >= V, or a mask byte of 2: `run` exits 2
 *    naming the sample, no stage started (it hung or crash-looped before).
 * Every child has a hard timeout and is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/data/prepare.h"
#include "common/pipe/ckpt.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static pf_fixture_t fx;
static char run0[400];

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlci", 60) < 0) return -1;
    snprintf(run0, sizeof run0, "%s/run", fx.root);
    proc_watchdog(280);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* `draftline` + args (NULL-terminated) to the end, output in log: exit code, wall time. */
static int run_cmd(const char *log, const char *const *args, int timeout_s, double *secs) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    int n = 0;
    a.argv[n++] = fx.exe;
    for (int i = 0; args[i]; i++) a.argv[n++] = (char *)args[i];
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int code = pf_run_draftline(&a, NULL, timeout_s, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (secs) *secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    return code;
}

/* a fresh run into out with data (2 steps, checkpoint at the end) */
static int train(const char *out, const char *data, const char *log, int timeout_s, double *secs) {
    const char *args[] = {"run", "--target-model", fx.model_dir, "--data", data, "--device", "cpu",
                          "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                          "--drafter-layers", "1", "--lr", "3e-3", "--seed", "5", "--threads", "1",
                          "--max-steps", "2", "--out", out, NULL};
    return run_cmd(log, args, timeout_s, secs);
}

static void copy_run(const char *name, char *dst, size_t cap) {
    snprintf(dst, cap, "%s/%s", fx.root, name);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -a %s %s", dst, run0, dst);
    assert_int_equal(system(cmd), 0);
}

/* `run --resume dir --max-steps 3` and `inspect dir/checkpoints/step_2`: both refused,
 * each output holding every one of wants[] */
static void expect_refused(const char *name, const char *dir, const char *const *wants) {
    char log[600], ck[600];
    snprintf(log, sizeof log, "%s/%s.resume.out", fx.root, name);
    const char *args[] = {"run", "--resume", dir, "--max-steps", "3", NULL};
    double secs = 0;
    int code = run_cmd(log, args, 60, &secs);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    int ok = code == 2 && secs < 10.0 && !strstr(txt, "draftline run ");
    for (int i = 0; wants[i]; i++) ok = ok && strstr(txt, wants[i]);
    if (!ok) fprintf(stderr, "%s: resume exit %d after %.1f s, want 2 and \"%s\":\n%s\n", name, code, secs, wants[0], txt);
    assert_true(ok);
    free(txt);
    snprintf(log, sizeof log, "%s/%s.inspect.out", fx.root, name);
    snprintf(ck, sizeof ck, "%s/checkpoints/step_2", dir);
    const char *iargs[] = {"inspect", ck, NULL};
    code = run_cmd(log, iargs, 30, NULL);
    txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    ok = code != 0 && code < 128;
    for (int i = 0; wants[i]; i++) ok = ok && strstr(txt, wants[i]);
    if (!ok) fprintf(stderr, "%s: inspect exit %d, want non-zero and \"%s\":\n%s\n", name, code, wants[0], txt);
    assert_true(ok);
    free(txt);
}

static void flip16(const char *path, long at) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    uint8_t b[16];
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    assert_int_equal(fread(b, 1, 16, f), 16);
    for (int i = 0; i < 16; i++) b[i] ^= 0xA5;
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    assert_int_equal(fwrite(b, 1, 16, f), 16);
    assert_int_equal(fclose(f), 0);
}

static long file_size(const char *p) {
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    return (long)sb.st_size;
}

static void test_untouched(void **state) {
    (void)state;
    char log[600], ck[600], dir[600];
    snprintf(log, sizeof log, "%s/train.out", fx.root);
    int code = train(run0, fx.cache, log, 90, NULL);
    if (code != 0) { char *t = pf_slurp(log, NULL); fprintf(stderr, "%s\n", t ? t : ""); free(t); }
    assert_int_equal(code, 0);
    snprintf(ck, sizeof ck, "%s/checkpoints/step_2", run0);
    snprintf(log, sizeof log, "%s/inspect_ok.out", fx.root);
    const char *iargs[] = {"inspect", ck, NULL};
    code = run_cmd(log, iargs, 30, NULL);
    char *txt = pf_slurp(log, NULL);
    if (code != 0) fprintf(stderr, "%s\n", txt ? txt : "");
    assert_int_equal(code, 0);
    free(txt);
    copy_run("ok", dir, sizeof dir);
    snprintf(log, sizeof log, "%s/resume_ok.out", fx.root);
    const char *args[] = {"run", "--resume", dir, "--max-steps", "3", NULL};
    code = run_cmd(log, args, 90, NULL);
    txt = pf_slurp(log, NULL);
    if (code != 0) fprintf(stderr, "%s\n", txt ? txt : "");
    assert_int_equal(code, 0);
    free(txt);
}

static void test_flipped_bytes(void **state) {
    (void)state;
    char dir[600], p[800];
    copy_run("flip_state", dir, sizeof dir);
    snprintf(p, sizeof p, "%s/checkpoints/step_2/state.bin", dir);
    flip16(p, file_size(p) / 2);
    const char *w1[] = {"state.bin", "checksum", NULL};
    expect_refused("flip_state", dir, w1);
    copy_run("flip_model", dir, sizeof dir);
    snprintf(p, sizeof p, "%s/checkpoints/step_2/model.safetensors", dir);
    flip16(p, file_size(p) / 2);   /* the tensor data is nearly all of the file */
    const char *w2[] = {"model.safetensors", "checksum", NULL};
    expect_refused("flip_model", dir, w2);
}

/* A copy of the run whose state.bin header gets edit(h) and no checksum (as a checkpoint
 * written before checksums holds it). */
static void header_case(const char *name, void (*edit)(ckpt_state_hdr_t *), const char *field) {
    char dir[600], p[800];
    copy_run(name, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/checkpoints/step_2/state.bin", dir);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    ckpt_state_hdr_t h;
    assert_int_equal(fread(&h, sizeof h, 1, f), 1);
    edit(&h);
    /* no checksum recorded: the bytes after target_fp (checksum fields, reserved) zeroed */
    size_t tail = offsetof(ckpt_state_hdr_t, target_fp) + sizeof h.target_fp;
    memset((char *)&h + tail, 0, sizeof h - tail);
    assert_int_equal(fseek(f, 0, SEEK_SET), 0);
    assert_int_equal(fwrite(&h, sizeof h, 1, f), 1);
    assert_int_equal(fclose(f), 0);
    const char *w[] = {field, "state.bin", NULL};
    expect_refused(name, dir, w);
}

static void e_tb0(ckpt_state_hdr_t *h) { h->token_budget = 0; }
static void e_lr_nan(ckpt_state_hdr_t *h) { h->lr = NAN; }
static void e_lr_neg(ckpt_state_hdr_t *h) { h->lr = -1; }
static void e_wd_inf(ckpt_state_hdr_t *h) { h->wd = INFINITY; }
static void e_clip_nan(ckpt_state_hdr_t *h) { h->clip = NAN; }
static void e_warmup(ckpt_state_hdr_t *h) { h->warmup_steps = 1e300; }
static void e_max_nan(ckpt_state_hdr_t *h) { h->max_steps = NAN; }
static void e_settings(ckpt_state_hdr_t *h) { h->settings ^= 1u << 9; }
static void e_step(ckpt_state_hdr_t *h) { h->step = 5; }

static void test_header_fields(void **state) {
    (void)state;
    header_case("tb0", e_tb0, "token_budget");
    header_case("lr_nan", e_lr_nan, "lr");
    header_case("lr_neg", e_lr_neg, "lr");
    header_case("wd_inf", e_wd_inf, "weight decay");
    header_case("clip_nan", e_clip_nan, "clip");
    header_case("warmup", e_warmup, "warmup_steps");
    header_case("max_nan", e_max_nan, "max_steps");
    header_case("settings", e_settings, "settings");
    header_case("step", e_step, "cursor.bin");
}

/* model.safetensors of dir's step_2 with its header's first `from` replaced by `to` (same
 * length: the JSON stays valid, the data and its recorded CRC-32 untouched) */
static void model_header_sub(const char *dir, const char *from, const char *to) {
    char p[800];
    snprintf(p, sizeof p, "%s/checkpoints/step_2/model.safetensors", dir);
    size_t n, len = strlen(from);
    char *b = pf_slurp(p, &n);
    assert_non_null(b);
    uint64_t hl;
    memcpy(&hl, b, 8);
    assert_true(n > 8 && hl <= n - 8 && strlen(to) == len);
    char *at = memmem(b + 8, hl, from, len);
    assert_non_null(at);
    memcpy(at, to, len);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    free(b);
}

/* State.bin version 2 reads the master back from model.safetensors: a header edited into
 * valid JSON (its data CRC-32 still right) is refused before any stage starts, as a
 * corrupt data byte is (it was refused only by the optimizer's ckpt_read, after every
 * stage had started and run.json had been rewritten). */
static void test_model_header(void **state) {
    (void)state;
    char dir[600];
    copy_run("hdr_name", dir, sizeof dir);   /* one byte of a tensor's name flipped */
    model_header_sub(dir, "\"layers.0.self_attn.k_proj.weight\"", "\"layers.0.self_attn.j_proj.weight\"");
    const char *w1[] = {"model.safetensors", "tensor 'layers.0.self_attn.k_proj.weight' missing", NULL};
    expect_refused("hdr_name", dir, w1);
    copy_run("hdr_swap", dir, sizeof dir);   /* q_proj and o_proj (same shape) swapped */
    model_header_sub(dir, "\"layers.0.self_attn.q_proj.weight\"", "\"layers.0.self_attn.#_proj.weight\"");
    model_header_sub(dir, "\"layers.0.self_attn.o_proj.weight\"", "\"layers.0.self_attn.q_proj.weight\"");
    model_header_sub(dir, "\"layers.0.self_attn.#_proj.weight\"", "\"layers.0.self_attn.o_proj.weight\"");
    const char *w2[] = {"model.safetensors", "tensor 'layers.0.self_attn.q_proj.weight' is at data offsets", NULL};
    expect_refused("hdr_swap", dir, w2);
    copy_run("hdr_dtype", dir, sizeof dir);
    model_header_sub(dir, "\"dtype\":\"F32\"", "\"dtype\":\"I32\"");
    const char *w3[] = {"model.safetensors", "is I32", NULL};
    expect_refused("hdr_dtype", dir, w3);
}

/* checkpoints/latest names a checkpoint whose state.bin is gone: refused naming it and
 * latest (it said "no state.bin and no checkpoints/latest ... the run applied steps but
 * saved none: start a fresh run with another --out" while other checkpoints remained) */
static void test_latest_gone(void **state) {
    (void)state;
    char dir[600], p[800], log[700];
    copy_run("latest_gone", dir, sizeof dir);
    snprintf(p, sizeof p, "%s/checkpoints/step_2/state.bin", dir);
    assert_int_equal(unlink(p), 0);
    snprintf(log, sizeof log, "%s/latest_gone.out", fx.root);
    const char *args[] = {"run", "--resume", dir, "--max-steps", "3", NULL};
    int code = run_cmd(log, args, 60, NULL);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    int ok = code == 2 && strstr(txt, "step_2/state.bin missing") && strstr(txt, "checkpoints/latest") &&
             !strstr(txt, "saved none") && !strstr(txt, "draftline run ");
    if (!ok) fprintf(stderr, "latest_gone: exit %d:\n%s\n", code, txt);
    assert_true(ok);
    free(txt);
}

/* A copy of the cache with token t of sample 1 given id (or its mask byte mask when >= 0):
 * a fresh run on it is refused naming the sample. */
static void cache_case(const char *name, int32_t id, int mask) {
    char dlc[600], cmd[2100], out[700], log[700];
    snprintf(dlc, sizeof dlc, "%s/%s.dlc", fx.root, name);
    snprintf(cmd, sizeof cmd, "cp %s %s", fx.cache, dlc);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(dlc, "r+b");
    assert_non_null(f);
    dlc_header_t h;
    assert_int_equal(fread(&h, sizeof h, 1, f), 1);
    uint64_t idx[2];
    assert_int_equal(fseek(f, (long)(h.index_off + 8), SEEK_SET), 0);
    assert_int_equal(fread(idx, 8, 2, f), 2);   /* sample 1: tokens idx[0]..idx[1] */
    uint64_t t = idx[0] + 3;
    if (mask >= 0) {
        assert_int_equal(fseek(f, (long)(h.mask_off + t), SEEK_SET), 0);
        assert_int_not_equal(fputc(mask, f), EOF);
    } else {
        assert_int_equal(fseek(f, (long)(h.ids_off + 4 * t), SEEK_SET), 0);
        assert_int_equal(fwrite(&id, 4, 1, f), 1);
    }
    assert_int_equal(fclose(f), 0);
    snprintf(out, sizeof out, "%s/%s.run", fx.root, name);
    snprintf(log, sizeof log, "%s/%s.out", fx.root, name);
    double secs = 0;
    int code = train(out, dlc, log, 40, &secs);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    int ok = code == 2 && secs < 15.0 && strstr(txt, "sample 1") && strstr(txt, name) && !strstr(txt, "draftline run ");
    if (!ok) fprintf(stderr, "%s: exit %d after %.1f s, want 2 naming sample 1:\n%s\n", name, code, secs, txt);
    assert_true(ok);
    free(txt);
}

static void test_cache_contents(void **state) {
    (void)state;
    cache_case("neg_id", -1, -1);
    cache_case("big_id", 49152, -1);
    cache_case("mask2", 0, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_untouched),
        cmocka_unit_test(test_flipped_bytes),
        cmocka_unit_test(test_header_fields),
        cmocka_unit_test(test_model_header),
        cmocka_unit_test(test_latest_gone),
        cmocka_unit_test(test_cache_contents),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
