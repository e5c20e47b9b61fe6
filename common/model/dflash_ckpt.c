/* DFlash checkpoints: config.json + model.safetensors in the public layout, and
 * the training state. See dflash_ckpt.h. */
#include "common/model/dflash_ckpt.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/base/err.h"
#include "common/format/safetensors.h"

#define DFLASH_STATE_FORMAT 1
#define DFLASH_MAX_ST_HEADER (100u << 20)   /* the safetensors crate's limit */
#define DFLASH_PATH_MAX 4096

/* out = dir/name; DL_EINVAL when it does not fit. */
static int join_path(char *out, const char *dir, const char *name) {
    int n = snprintf(out, DFLASH_PATH_MAX, "%s/%s", dir, name);
    if (n < 0 || n >= DFLASH_PATH_MAX)
        return dl_seterr(DL_EINVAL, "checkpoint path too long: %s/%s", dir, name);
    return 0;
}

/* ------------------------------------------------------------------ config */

char *dflash_config_to_json(const drafter_config_t *c) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("DFlashDraftModel"));
    cJSON_AddStringToObject(j, "model_type", "qwen3");
    cJSON_AddNumberToObject(j, "hidden_size", c->D);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->H);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->Hkv);
    cJSON_AddNumberToObject(j, "head_dim", c->hd);
    cJSON_AddNumberToObject(j, "intermediate_size", c->F);
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->rms_eps);
    cJSON_AddNumberToObject(j, "rope_theta", c->rope.theta);
    if (c->rope.llama3) {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", c->rope.factor);
        cJSON_AddNumberToObject(rs, "low_freq_factor", c->rope.low_freq_factor);
        cJSON_AddNumberToObject(rs, "high_freq_factor", c->rope.high_freq_factor);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                c->rope.original_max_position_embeddings);
    } else {
        cJSON_AddNullToObject(j, "rope_scaling");
    }
    cJSON_AddNumberToObject(j, "vocab_size", c->V);
    cJSON_AddNumberToObject(j, "max_position_embeddings",
                            c->max_position_embeddings > 0 ? c->max_position_embeddings : 32768);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddFalseToObject(j, "attention_bias");
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddFalseToObject(j, "tie_word_embeddings");
    /* the newer z-lab loader makes a layer causal unless is_causal is false */
    cJSON_AddFalseToObject(j, "is_causal");
    cJSON_AddFalseToObject(j, "use_sliding_window");
    cJSON_AddNullToObject(j, "sliding_window");
    cJSON_AddNumberToObject(j, "max_window_layers", c->n_layers);
    cJSON *lt = cJSON_AddArrayToObject(j, "layer_types");
    for (int i = 0; i < c->n_layers; i++) cJSON_AddItemToArray(lt, cJSON_CreateString("full_attention"));
    cJSON_AddStringToObject(j, "torch_dtype", "bfloat16");
    cJSON_AddNumberToObject(j, "block_size", c->B);
    cJSON_AddNumberToObject(j, "num_target_layers", c->n_target_layers);
    cJSON *df = cJSON_AddObjectToObject(j, "dflash_config");
    cJSON_AddItemToObject(df, "target_layer_ids", cJSON_CreateIntArray(c->target_layer_ids, c->n_feat));
    cJSON_AddNumberToObject(df, "mask_token_id", c->mask_token_id);
    cJSON_AddNumberToObject(df, "block_size", c->B); /* read from here first by newer loaders */
    cJSON *dl = cJSON_AddObjectToObject(j, "draftline");
    cJSON_AddNumberToObject(dl, "gamma", c->gamma);
    cJSON_AddNumberToObject(dl, "loss_chunk_blocks", c->loss_chunk_blocks);
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    return s;
}

static int json_num(const cJSON *o, const char *key, const char *where, int required, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return dl_seterr(DL_EFORMAT, "%s: missing field '%s'", where, key);
        return 1;
    }
    if (!cJSON_IsNumber(v)) return dl_seterr(DL_EFORMAT, "%s: field '%s': expected a number", where, key);
    *out = v->valuedouble;
    return 0;
}

static int json_int(const cJSON *o, const char *key, const char *where, int required, int *out) {
    double v = 0;
    int rc = json_num(o, key, where, required, &v);
    if (rc != 0) return rc;
    if (v != (double)(int)v)
        return dl_seterr(DL_EFORMAT, "%s: field '%s': expected an integer, got %g", where, key, v);
    *out = (int)v;
    return 0;
}

int dflash_config_from_json(const char *text, const char *where, drafter_config_t *c) {
    cJSON *j = cJSON_Parse(text);
    if (!j || !cJSON_IsObject(j)) {
        if (!j) { /* say where the text stops parsing: line of cJSON's error pointer */
            const char *ep = cJSON_GetErrorPtr();
            size_t n = strlen(text);
            if (ep && ep >= text && ep <= text + n) {
                int line = 1;
                for (const char *q = text; q < ep; q++) line += *q == '\n';
                return dl_seterr(DL_EFORMAT, "%s: invalid JSON at line %d", where, line);
            }
            return dl_seterr(DL_EFORMAT, "%s: invalid JSON", where);
        }
        cJSON_Delete(j);
        return dl_seterr(DL_EFORMAT, "%s: not a JSON object", where);
    }
    drafter_config_defaults(c);
    int rc = 0;
    double x;
    const cJSON *df = cJSON_GetObjectItemCaseSensitive(j, "dflash_config");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    if (mt && cJSON_IsString(mt) && strcmp(mt->valuestring, "qwen3") != 0) {
        rc = dl_seterr(DL_ENOTSUP, "%s: model_type '%s' (a DFlash drafter is 'qwen3')", where,
                       mt->valuestring);
        goto out;
    }
    if (!cJSON_IsObject(df)) {
        rc = dl_seterr(DL_EFORMAT, "%s: missing object 'dflash_config'", where);
        goto out;
    }
#define TRYF(e) do { rc = (e); if (rc < 0) goto out; } while (0)
    TRYF(json_int(j, "hidden_size", where, 1, &c->D));
    TRYF(json_int(j, "num_hidden_layers", where, 1, &c->n_layers));
    TRYF(json_int(j, "num_attention_heads", where, 1, &c->H));
    TRYF(json_int(j, "num_key_value_heads", where, 1, &c->Hkv));
    c->hd = c->H > 0 ? c->D / c->H : 0;
    TRYF(json_int(j, "head_dim", where, 0, &c->hd));
    TRYF(json_int(j, "intermediate_size", where, 1, &c->F));
    TRYF(json_int(j, "vocab_size", where, 1, &c->V));
    TRYF(json_num(j, "rms_norm_eps", where, 1, &x));
    c->rms_eps = (float)x;
    TRYF(json_int(j, "max_position_embeddings", where, 0, &c->max_position_embeddings));
    TRYF(json_int(j, "num_target_layers", where, 0, &c->n_target_layers));
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    rc = json_num(j, "rope_theta", where, 0, &x);
    if (rc < 0) goto out;
    if (rc == 1 && cJSON_IsObject(rp)) TRYF(json_num(rp, "rope_theta", where, 1, &x));
    else if (rc == 1) x = 10000.0;
    c->rope.theta = x;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (!cJSON_IsObject(rs) && cJSON_IsObject(rp)) rs = rp;
    if (cJSON_IsObject(rs)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!ty) ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
        if (ty && cJSON_IsString(ty) && strcmp(ty->valuestring, "llama3") == 0) {
            c->rope.llama3 = 1;
            TRYF(json_num(rs, "factor", where, 1, &c->rope.factor));
            TRYF(json_num(rs, "low_freq_factor", where, 1, &c->rope.low_freq_factor));
            TRYF(json_num(rs, "high_freq_factor", where, 1, &c->rope.high_freq_factor));
            TRYF(json_int(rs, "original_max_position_embeddings", where, 1,
                          &c->rope.original_max_position_embeddings));
        } else if (ty && cJSON_IsString(ty) && strcmp(ty->valuestring, "default") != 0) {
            rc = dl_seterr(DL_ENOTSUP, "%s: rope type '%s'", where, ty->valuestring);
            goto out;
        }
    }
    rc = json_int(j, "block_size", where, 0, &c->B);
    if (rc < 0) goto out;
    if (rc == 1) TRYF(json_int(df, "block_size", where, 1, &c->B));
    TRYF(json_int(df, "mask_token_id", where, 1, &c->mask_token_id));
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(df, "target_layer_ids");
    if (ids) {
        if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) < 1 ||
            cJSON_GetArraySize(ids) > DRAFTER_MAX_FEAT) {
            rc = dl_seterr(DL_EFORMAT, "%s: dflash_config.target_layer_ids: expected 1..%d integers",
                           where, DRAFTER_MAX_FEAT);
            goto out;
        }
        c->n_feat = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, ids) {
            if (!cJSON_IsNumber(e)) {
                rc = dl_seterr(DL_EFORMAT, "%s: dflash_config.target_layer_ids[%d]: not a number",
                               where, c->n_feat);
                goto out;
            }
            c->target_layer_ids[c->n_feat++] = e->valueint;
        }
    }
    const cJSON *dl = cJSON_GetObjectItemCaseSensitive(j, "draftline");
    if (cJSON_IsObject(dl)) {
        if (json_num(dl, "gamma", where, 0, &x) == 0) c->gamma = (float)x;
        TRYF(json_int(dl, "loss_chunk_blocks", where, 0, &c->loss_chunk_blocks));
    }
    rc = drafter_config_finish(c);
    if (rc < 0) dl_wraperr(rc, "%s", where);
#undef TRYF
out:
    cJSON_Delete(j);
    return rc < 0 ? rc : 0;
}

static int read_text(const char *path, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return dl_seterr(errno == ENOENT ? DL_ENOENT : DL_EIO, "%s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return dl_seterr(DL_EIO, "%s: seek", path); }
    long n = ftell(f);
    if (n < 0 || n > (64L << 20)) { fclose(f); return dl_seterr(DL_EFORMAT, "%s: size %ld", path, n); }
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (!buf) { fclose(f); return dl_seterr(DL_ENOMEM, "%s: %ld bytes", path, n); }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return dl_seterr(DL_EIO, "%s: short read", path);
    }
    buf[n] = 0;
    fclose(f);
    *out = buf;
    return 0;
}

int dflash_config_load(const char *dir, drafter_config_t *cfg) {
    char path[DFLASH_PATH_MAX];
    DL_TRY(join_path(path, dir, "config.json"));
    char *text;
    DL_TRY(read_text(path, &text));
    int rc = dflash_config_from_json(text, path, cfg);
    free(text);
    return rc;
}

/* -------------------------------------------------------------------- save */

static int write_file_sync(const char *path, const void *data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return dl_seterr(DL_EIO, "%s: open: %s", path, strerror(errno));
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            return dl_seterr(DL_EIO, "%s: write: %s", path, strerror(e));
        }
        p += w, n -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) return dl_seterr(DL_EIO, "%s: fsync: %s", path, strerror(errno));
    return 0;
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return dl_seterr(DL_EIO, "%s: open dir: %s", dir, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? 0 : dl_seterr(DL_EIO, "%s: fsync dir: %s", dir, strerror(errno));
}

/* rm -r of a checkpoint directory we wrote (flat: files only). */
static void remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[DFLASH_PATH_MAX];
        if (join_path(path, dir, e->d_name) == 0) unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static void parent_of(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') out[--n] = 0;
    char *slash = strrchr(out, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == out) out[1] = 0;
    else *slash = 0;
}

#define DFLASH_WRITE_CHUNK (64u << 20)   /* stored bytes per write: converted and CRC'd first */
#define DFLASH_CRC_PIECE (4u << 20)      /* bytes per parallel CRC piece (crc32_combine) */
#define DFLASH_CRC_ZERO "00000000"       /* the header's CRC until the data is written */

/* crc32_z(crc, p, n) in DFLASH_CRC_PIECE pieces on OpenMP threads, combined in order:
 * the same value. */
static uLong crc_par(uLong crc, const uint8_t *p, size_t n) {
    size_t np = (n + DFLASH_CRC_PIECE - 1) / DFLASH_CRC_PIECE;
    if (np <= 1) return crc32_z(crc, p, n);
    uLong part[DFLASH_WRITE_CHUNK / DFLASH_CRC_PIECE + 1];
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < np; k++) {
        size_t lo = k * DFLASH_CRC_PIECE, m = n - lo < DFLASH_CRC_PIECE ? n - lo : DFLASH_CRC_PIECE;
        part[k] = crc32_z(crc32_z(0, Z_NULL, 0), p + lo, m);
    }
    for (size_t k = 0; k < np; k++) {
        size_t lo = k * DFLASH_CRC_PIECE, m = n - lo < DFLASH_CRC_PIECE ? n - lo : DFLASH_CRC_PIECE;
        crc = crc32_combine(crc, part[k], (z_off_t)m);
    }
    return crc;
}

/* The data section, tensor by tensor in DFLASH_WRITE_CHUNK pieces (bf16: converted in
 * parallel into buf, DFLASH_WRITE_CHUNK bytes), each CRC'd as it goes to the writer. */
static int write_data(const drafter_t *d, st_writer_t *w, int bf16, const float *host, uint16_t *buf, uLong *crc) {
    size_t es = bf16 ? 2 : 4, per = DFLASH_WRITE_CHUNK / es;
    for (int i = 0; i < drafter_n_tensors(d); i++) {
        const drafter_tensor_t *t = drafter_tensor(d, i);
        const float *src = host + t->offset;
        for (size_t e = 0; e < t->numel; e += per) {
            size_t n = t->numel - e < per ? t->numel - e : per;
            const uint8_t *b = (const uint8_t *)(src + e);
            if (bf16) {
#pragma omp parallel for schedule(static) if (n > (1u << 20))
                for (size_t k = 0; k < n; k++) buf[k] = st_f32_to_bf16(src[e + k]);
                b = (const uint8_t *)buf;
            }
            *crc = crc_par(*crc, b, n * es);
            DL_TRY(st_writer_write(w, b, n * es));
        }
    }
    return 0;
}

/* Writes the data section's CRC-32 (8 hex digits) over the placeholder in the header
 * of the safetensors file at path (same length: the bytes are those a writer given the
 * CRC first would have written). */
static int patch_crc(const char *path, const char *crc_hex) {
    static const char key[] = "\"" DFLASH_CRC_KEY "\":\"" DFLASH_CRC_ZERO "\"";
    int fd = open(path, O_RDWR);
    if (fd < 0) return dl_seterr(DL_EIO, "%s: open: %s", path, strerror(errno));
    uint64_t hl = 0;
    char *h = NULL;
    int rc = 0;
    if (pread(fd, &hl, 8, 0) != 8 || hl > DFLASH_MAX_ST_HEADER || !(h = malloc(hl + 1)) ||
        pread(fd, h, hl, 8) != (ssize_t)hl) {
        rc = dl_seterr(DL_EIO, "%s: header unreadable", path);
    } else {
        h[hl] = 0;
        const char *at = strstr(h, key);
        off_t off = at ? (off_t)(8 + (at - h) + strlen(key) - 1 - 8) : 0;
        if (!at) rc = dl_seterr(DL_EFORMAT, "%s: no CRC placeholder in the header", path);
        else if (pwrite(fd, crc_hex, 8, off) != 8 || fsync(fd) != 0)
            rc = dl_seterr(DL_EIO, "%s: write the CRC: %s", path, strerror(errno));
    }
    free(h);
    if (close(fd) != 0 && rc == 0) rc = dl_seterr(DL_EIO, "%s: close: %s", path, strerror(errno));
    return rc;
}

/* model.safetensors in one pass over the weights: the header with a placeholder CRC,
 * the data (CRC'd as written; O_DIRECT where the file system takes it, st_writer_new_direct),
 * then the CRC over the placeholder. */
static int save_weights(const drafter_t *d, const char *dir, const char *dtype, const float *host) {
    char path[DFLASH_PATH_MAX];
    DL_TRY(join_path(path, dir, "model.safetensors"));
    int bf16 = strcmp(dtype, "F32") != 0;
    uint16_t *buf = bf16 ? malloc(DFLASH_WRITE_CHUNK) : NULL;
    if (bf16 && !buf) return dl_seterr(DL_ENOMEM, "%s: conversion buffer", path);
    st_writer_t *w;
    int rc = st_writer_new_direct(path, &w);   /* O_DIRECT where taken: same bytes, no page-cache copy */
    if (rc < 0) { free(buf); return rc; }
    rc = st_writer_meta(w, "format", "pt");
    if (rc == 0) rc = st_writer_meta(w, DFLASH_CRC_KEY, DFLASH_CRC_ZERO);
    for (int i = 0; rc == 0 && i < drafter_n_tensors(d); i++) {
        const drafter_tensor_t *t = drafter_tensor(d, i);
        rc = st_writer_add(w, t->name, dtype, t->n_dims, t->shape);
    }
    uLong crc = crc32_z(0, Z_NULL, 0);
    if (rc == 0) rc = write_data(d, w, bf16, host, buf, &crc);
    free(buf);
    if (rc < 0) {
        st_writer_abort(&w);
        return rc;
    }
    DL_TRY(st_writer_finish(&w));
    char crc_hex[16];
    snprintf(crc_hex, sizeof crc_hex, "%08lx", (unsigned long)crc);
    return patch_crc(path, crc_hex);
}

static int save_state(const char *dir, const dflash_train_state_t *s) {
    char path[DFLASH_PATH_MAX];
    if (s->master && s->m && s->v) {
        DL_TRY(join_path(path, dir, "training_state.safetensors"));
        st_writer_t *w;
        DL_TRY(st_writer_new(path, &w));
        int64_t shape[1] = {(int64_t)s->n_params};
        const char *names[3] = {"master", "adam_m", "adam_v"};
        const float *data[3] = {s->master, s->m, s->v};
        int rc = 0;
        for (int i = 0; rc == 0 && i < 3; i++) rc = st_writer_add(w, names[i], "F32", 1, shape);
        for (int i = 0; rc == 0 && i < 3; i++) rc = st_writer_write(w, data[i], s->n_params * 4);
        if (rc < 0) {
            st_writer_abort(&w);
            return rc;
        }
        DL_TRY(st_writer_finish(&w));
    }
    cJSON *j = cJSON_CreateObject();
    char num[32];
    cJSON_AddNumberToObject(j, "format", DFLASH_STATE_FORMAT);
    snprintf(num, sizeof num, "%" PRId64, s->step);
    cJSON_AddStringToObject(j, "step", num);
    snprintf(num, sizeof num, "%" PRIu64, s->seed);
    cJSON_AddStringToObject(j, "seed", num);
    snprintf(num, sizeof num, "%" PRIu64, s->next_mb);
    cJSON_AddStringToObject(j, "next_mb", num);
    snprintf(num, sizeof num, "%zu", s->n_params);
    cJSON_AddStringToObject(j, "n_params", num);
    cJSON *r = cJSON_AddArrayToObject(j, "rng");
    for (int i = 0; i < 4; i++) {
        snprintf(num, sizeof num, "%" PRIu64, s->rng.s[i]);
        cJSON_AddItemToArray(r, cJSON_CreateString(num));
    }
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return dl_seterr(DL_ENOMEM, "training_state.json");
    int rc = join_path(path, dir, "training_state.json");
    if (rc == 0) rc = write_file_sync(path, text, strlen(text));
    free(text);
    return rc;
}

int dflash_ckpt_save(drafter_t *d, const char *dir, const char *dtype,
                     const dflash_train_state_t *state) {
    if (!drafter_master(d))
        return dl_seterr(DL_ESTATE, "dflash_ckpt_save: the drafter keeps no f32 master weights "
                         "(no_master)");
    size_t n = drafter_n_params(d);
    float *host = malloc(n * sizeof(float));
    if (!host) return dl_seterr(DL_ENOMEM, "dflash_ckpt_save: %zu params", n);
    drafter_download_master(d, host); /* master weights live on the backend */
    int rc = dflash_ckpt_save_host(d, host, dir, dtype, state);
    free(host);
    return rc;
}

int dflash_ckpt_save_host(const drafter_t *d, const float *host, const char *dir, const char *dtype,
                          const dflash_train_state_t *state) {
    if (strcmp(dtype, "BF16") != 0 && strcmp(dtype, "F32") != 0)
        return dl_seterr(DL_EINVAL, "dflash_ckpt_save: dtype '%s' (BF16 or F32)", dtype);
    char tmp[DFLASH_PATH_MAX], old[DFLASH_PATH_MAX], parent[DFLASH_PATH_MAX];
    char path[DFLASH_PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", dir) >= (int)sizeof tmp ||
        snprintf(old, sizeof old, "%s.old", dir) >= (int)sizeof old)
        return dl_seterr(DL_EINVAL, "dflash_ckpt_save: path too long");
    parent_of(dir, parent, sizeof parent);
    remove_flat_dir(tmp); /* leftovers of a crashed save */
    if (mkdir(tmp, 0755) != 0) return dl_seterr(DL_EIO, "%s: mkdir: %s", tmp, strerror(errno));
    int rc = 0;
    char *cfg = dflash_config_to_json(drafter_config(d));
    if (cfg && strcmp(dtype, "F32") == 0) { /* torch_dtype names the stored dtype */
        cJSON *cj = cJSON_Parse(cfg);
        free(cfg);
        cfg = NULL;
        if (cj) {
            cJSON_ReplaceItemInObjectCaseSensitive(cj, "torch_dtype", cJSON_CreateString("float32"));
            cfg = cJSON_Print(cj);
            cJSON_Delete(cj);
        }
    }
    if (!cfg) {
        rc = dl_seterr(DL_ENOMEM, "dflash_ckpt_save: config.json");
        goto fail;
    }
    rc = join_path(path, tmp, "config.json");
    if (rc == 0) rc = write_file_sync(path, cfg, strlen(cfg));
    free(cfg);
    if (rc < 0) goto fail;
    if ((rc = save_weights(d, tmp, dtype, host)) < 0) goto fail;
    if (state && (rc = save_state(tmp, state)) < 0) goto fail;
    if ((rc = fsync_dir(tmp)) < 0) goto fail;
    struct stat sb;
    int had_old = stat(dir, &sb) == 0;
    if (had_old) {
        remove_flat_dir(old);
        if (rename(dir, old) != 0) {
            rc = dl_seterr(DL_EIO, "%s -> %s: rename: %s", dir, old, strerror(errno));
            goto fail;
        }
    }
    if (rename(tmp, dir) != 0) {
        rc = dl_seterr(DL_EIO, "%s -> %s: rename: %s", tmp, dir, strerror(errno));
        if (had_old) rename(old, dir);
        goto fail;
    }
    fsync_dir(parent);
    if (had_old) remove_flat_dir(old);
    return 0;
fail:
    remove_flat_dir(tmp);
    return rc;
}

/* -------------------------------------------------------------------- load */

int dflash_ckpt_load_weights(drafter_t *d, const char *dir) {
    char path[DFLASH_PATH_MAX];
    DL_TRY(join_path(path, dir, "model.safetensors"));
    int verified = 0;  /* a file that records a CRC-32 must match it (one more read) */
    DL_TRY(dflash_ckpt_verify_weights(dir, &verified));
    safetensors_t *st;
    DL_TRY(safetensors_open(path, &st));
    size_t n = drafter_n_params(d);
    float *host = malloc(n * sizeof(float));
    int rc = host ? 0 : dl_seterr(DL_ENOMEM, "%s: %zu params", path, n);
    for (int i = 0; rc == 0 && i < drafter_n_tensors(d); i++) {
        const drafter_tensor_t *t = drafter_tensor(d, i);
        const st_tensor_t *s = safetensors_find(st, t->name);
        if (!s) {
            rc = dl_seterr(DL_ENOENT, "%s: tensor '%s' missing", path, t->name);
            break;
        }
        int ok = s->n_dims == t->n_dims && s->shape[0] == t->shape[0] &&
                 (t->n_dims == 1 || s->shape[1] == t->shape[1]);
        if (!ok) {
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s' has shape [%" PRId64 "%s%" PRId64
                           "], expected [%" PRId64 ", %" PRId64 "]", path, t->name, s->shape[0],
                           s->n_dims > 1 ? ", " : "", s->n_dims > 1 ? s->shape[1] : 0,
                           t->shape[0], t->n_dims > 1 ? t->shape[1] : 0);
            break;
        }
        rc = st_tensor_to_f32(s, host + t->offset);
        if (rc < 0) dl_wraperr(rc, "%s: %s", path, t->name);
    }
    if (rc == 0) rc = drafter_upload_master(d, host);
    free(host);
    safetensors_close(&st);
    return rc;
}

static int parse_u64(const cJSON *o, const char *key, const char *where, uint64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (v && cJSON_IsString(v)) {
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v->valuestring, &end, 10);
        if (errno == 0 && *end == 0 && end != v->valuestring) {
            *out = x;
            return 0;
        }
    }
    return dl_seterr(DL_EFORMAT, "%s: field '%s': expected a decimal string", where, key);
}

int dflash_ckpt_load_state(const char *dir, size_t n_params, float *master, float *m, float *v,
                           dflash_train_state_t *meta) {
    char path[DFLASH_PATH_MAX];
    DL_TRY(join_path(path, dir, "training_state.json"));
    char *text;
    DL_TRY(read_text(path, &text));
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) return dl_seterr(DL_EFORMAT, "%s: bad JSON", path);
    memset(meta, 0, sizeof(*meta));
    uint64_t step = 0, np = 0;
    int rc = parse_u64(j, "step", path, &step);
    if (rc == 0) rc = parse_u64(j, "seed", path, &meta->seed);
    if (rc == 0) rc = parse_u64(j, "next_mb", path, &meta->next_mb);
    if (rc == 0) rc = parse_u64(j, "n_params", path, &np);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "rng");
    if (rc == 0 && (!cJSON_IsArray(r) || cJSON_GetArraySize(r) != 4))
        rc = dl_seterr(DL_EFORMAT, "%s: field 'rng': expected 4 strings", path);
    for (int i = 0; rc == 0 && i < 4; i++) {
        const cJSON *e = cJSON_GetArrayItem(r, i);
        if (!cJSON_IsString(e)) { rc = dl_seterr(DL_EFORMAT, "%s: rng[%d]", path, i); break; }
        meta->rng.s[i] = strtoull(e->valuestring, NULL, 10);
    }
    cJSON_Delete(j);
    if (rc < 0) return rc;
    meta->step = (int64_t)step;
    meta->n_params = (size_t)np;
    if (np != n_params)
        return dl_seterr(DL_EFORMAT, "%s: n_params %" PRIu64 " but the drafter has %zu", path, np,
                         n_params);
    if (!master && !m && !v) return 0;
    DL_TRY(join_path(path, dir, "training_state.safetensors"));
    safetensors_t *st;
    DL_TRY(safetensors_open(path, &st));
    const char *names[3] = {"master", "adam_m", "adam_v"};
    float *outs[3] = {master, m, v};
    for (int i = 0; rc == 0 && i < 3; i++) {
        if (!outs[i]) continue;
        const st_tensor_t *s = safetensors_find(st, names[i]);
        if (!s || st_tensor_nelem(s) != n_params || s->dtype != ST_F32) {
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s' missing or not F32 [%zu]", path, names[i],
                           n_params);
            break;
        }
        rc = st_tensor_to_f32(s, outs[i]);
    }
    safetensors_close(&st);
    return rc;
}

/* ------------------------------------------------------------------ verify */

int dflash_ckpt_verify_weights(const char *dir, int *verified) {
    char path[DFLASH_PATH_MAX];
    DL_TRY(join_path(path, dir, "model.safetensors"));
    *verified = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return dl_seterr(errno == ENOENT ? DL_ENOENT : DL_EIO, "%s: %s", path, strerror(errno));
    int rc = 0;
    uint8_t lb[8];
    uint64_t hl = 0;
    char *hdr = NULL;
    uint8_t *buf = NULL;
    if (fread(lb, 1, 8, f) != 8) { rc = dl_seterr(DL_EFORMAT, "%s: truncated (no header length)", path); goto out; }
    for (int i = 7; i >= 0; i--) hl = hl << 8 | lb[i];
    if (hl == 0 || hl > DFLASH_MAX_ST_HEADER) { rc = dl_seterr(DL_EFORMAT, "%s: header length %llu", path, (unsigned long long)hl); goto out; }
    if (!(hdr = malloc(hl + 1))) { rc = dl_seterr(DL_ENOMEM, "%s: header", path); goto out; }
    if (fread(hdr, 1, hl, f) != hl) { rc = dl_seterr(DL_EFORMAT, "%s: truncated header", path); goto out; }
    hdr[hl] = 0;
    cJSON *j = cJSON_ParseWithLength(hdr, hl);
    const cJSON *m = j ? cJSON_GetObjectItemCaseSensitive(j, "__metadata__") : NULL;
    const cJSON *c = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, DFLASH_CRC_KEY) : NULL;
    unsigned long want = 0;
    char *end = NULL;
    int have = cJSON_IsString(c);
    if (have) want = strtoul(c->valuestring, &end, 16);
    int bad_val = have && (strlen(c->valuestring) != 8 || *end);
    cJSON_Delete(j);
    if (!j) { rc = dl_seterr(DL_EFORMAT, "%s: header is not JSON (corrupt)", path); goto out; }
    if (bad_val) { rc = dl_seterr(DL_EFORMAT, "%s: __metadata__.%s is not 8 hex digits (corrupt)", path, DFLASH_CRC_KEY); goto out; }
    if (!have) goto out;   /* written before checksums */
    if (!(buf = malloc(1u << 20))) { rc = dl_seterr(DL_ENOMEM, "%s: read buffer", path); goto out; }
    uLong crc = crc32_z(0, Z_NULL, 0);
    size_t n;
    while ((n = fread(buf, 1, 1u << 20, f)) > 0) crc = crc32_z(crc, buf, n);
    if (ferror(f)) { rc = dl_seterr(DL_EIO, "%s: read: %s", path, strerror(errno)); goto out; }
    if ((unsigned long)crc != want) {
        rc = dl_seterr(DL_EFORMAT, "%s: tensor data checksum mismatch (CRC-32 %08lx, recorded %08lx): the file is "
                       "corrupt", path, (unsigned long)crc, want);
        goto out;
    }
    *verified = 1;
out:
    free(buf);
    free(hdr);
    fclose(f);
    return rc;
}
