/* GGUF (v2/v3) reader. See gguf.h.
 *
 * Layout (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md):
 *   u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x (string key, u32 type, value), n_tensors x (string name, u32 n_dims,
 *   u64 ne[n_dims], u32 type, u64 offset), padding to general.alignment (default 32),
 *   tensor data. Strings are u64 length + bytes (no NUL). All little-endian.
 *
 * Dequantization follows ggml's block layouts (ggml-quants.c dequantize_row_*) and
 * computes each element with the same fp32 operations, in the same order, as the
 * gguf Python package's gguf/quants.py, so the results are bit-identical to it.
 */
#include "common/format/gguf.h"

#include "common/base/err.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
/* Sanity limits so a corrupt count cannot drive a huge allocation. */
#define GGUF_MAX_KV (1u << 20)
#define GGUF_MAX_TENSORS (1u << 20)

struct gguf {
    const uint8_t *map;
    size_t size;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv_t *kv;
    gguf_tensor_t *tensors;
    uint64_t alignment;
    uint64_t data_off;   /* start of the tensor data section */
    char path[256];      /* for error messages (truncated) */
};

/* ggml type traits: block size (elements) and block bytes; 0 = unknown id. */
typedef struct { const char *name; uint32_t blck; uint32_t bytes; } ggml_traits_t;

static const ggml_traits_t ggml_traits[] = {
    [0] = {"F32", 1, 4},        [1] = {"F16", 1, 2},        [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},     [6] = {"Q5_0", 32, 22},     [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},     [9] = {"Q8_1", 32, 40},     [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},  [12] = {"Q4_K", 256, 144},  [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},  [15] = {"Q8_K", 256, 292},  [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74}, [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},  [21] = {"IQ3_S", 256, 110}, [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},       [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},       [27] = {"I64", 1, 8},       [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},  [30] = {"BF16", 1, 2},      [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},  [39] = {"MXFP4", 32, 17},
};
#define GGML_N_TRAITS ((uint32_t)(sizeof ggml_traits / sizeof ggml_traits[0]))

const char *ggml_type_name(ggml_type_t t) {
    if ((uint32_t)t < GGML_N_TRAITS && ggml_traits[t].name) return ggml_traits[t].name;
    return "unknown";
}

/* ---- bounds-checked cursor ---------------------------------------------- */

typedef struct {
    const gguf_t *g;
    uint64_t pos;
    const char *what;   /* current field, for errors */
} cur_t;

static int cur_need(cur_t *c, uint64_t n) {
    if (n > c->g->size || c->pos > c->g->size - n)
        return dl_seterr(DL_EFORMAT, "%s: truncated reading %s at byte %llu (need %llu, file %zu)",
                         c->g->path, c->what, (unsigned long long)c->pos, (unsigned long long)n,
                         c->g->size);
    return 0;
}

static int cur_u32(cur_t *c, uint32_t *v) {
    DL_TRY(cur_need(c, 4));
    memcpy(v, c->g->map + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int cur_u64(cur_t *c, uint64_t *v) {
    DL_TRY(cur_need(c, 8));
    memcpy(v, c->g->map + c->pos, 8);
    c->pos += 8;
    return 0;
}

static int cur_str(cur_t *c, gguf_str_t *s) {
    uint64_t len;
    DL_TRY(cur_u64(c, &len));
    if (cur_need(c, len) < 0)
        return dl_seterr(DL_EFORMAT, "%s: %s: string of length %llu at byte %llu runs past the end",
                         c->g->path, c->what, (unsigned long long)len,
                         (unsigned long long)(c->pos - 8));
    s->data = (const char *)c->g->map + c->pos;
    s->len = len;
    c->pos += len;
    return 0;
}

/* Size of one fixed-size metadata value type; 0 for STRING/ARRAY/unknown. */
static uint64_t kv_type_size(uint32_t t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static int is_int_type(gguf_type_t t) {
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_INT8 || t == GGUF_TYPE_UINT16 ||
           t == GGUF_TYPE_INT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_INT32 ||
           t == GGUF_TYPE_UINT64 || t == GGUF_TYPE_INT64 || t == GGUF_TYPE_BOOL;
}

static int is_signed_type(gguf_type_t t) {
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 ||
           t == GGUF_TYPE_INT64;
}

/* Reads one fixed-size scalar of type t at p into the widened union of kv. */
static void read_scalar(gguf_type_t t, const uint8_t *p, gguf_kv_t *kv) {
    switch (t) {
    case GGUF_TYPE_UINT8: kv->v.u64 = p[0]; break;
    case GGUF_TYPE_INT8: kv->v.i64 = (int8_t)p[0]; break;
    case GGUF_TYPE_BOOL: kv->v.b = p[0] != 0; kv->v.u64 = p[0] != 0; break;
    case GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u64 = x; break; }
    case GGUF_TYPE_INT16: { int16_t x; memcpy(&x, p, 2); kv->v.i64 = x; break; }
    case GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u64 = x; break; }
    case GGUF_TYPE_INT32: { int32_t x; memcpy(&x, p, 4); kv->v.i64 = x; break; }
    case GGUF_TYPE_FLOAT32: { float x; memcpy(&x, p, 4); kv->v.f64 = x; break; }
    case GGUF_TYPE_UINT64: { uint64_t x; memcpy(&x, p, 8); kv->v.u64 = x; break; }
    case GGUF_TYPE_INT64: { int64_t x; memcpy(&x, p, 8); kv->v.i64 = x; break; }
    case GGUF_TYPE_FLOAT64: { double x; memcpy(&x, p, 8); kv->v.f64 = x; break; }
    default: break;
    }
}

static int parse_kv(gguf_t *g, cur_t *c, gguf_kv_t *kv, uint64_t idx) {
    c->what = "metadata key";
    DL_TRY(cur_str(c, &kv->key));
    c->what = "metadata type";
    uint32_t t;
    DL_TRY(cur_u32(c, &t));
    kv->type = (gguf_type_t)t;
    if (t == GGUF_TYPE_STRING) {
        c->what = "metadata string value";
        return cur_str(c, &kv->str);
    }
    if (t == GGUF_TYPE_ARRAY) {
        uint32_t at;
        uint64_t n;
        c->what = "metadata array header";
        DL_TRY(cur_u32(c, &at));
        DL_TRY(cur_u64(c, &n));
        kv->arr_type = (gguf_type_t)at;
        kv->arr_len = n;
        kv->arr_data = g->map + c->pos;
        if (at == GGUF_TYPE_STRING) {
            c->what = "metadata string array element";
            for (uint64_t i = 0; i < n; i++) {
                gguf_str_t s;
                DL_TRY(cur_str(c, &s));
            }
            return 0;
        }
        uint64_t es = kv_type_size(at);
        if (!es)
            return dl_seterr(DL_EFORMAT, "%s: metadata '%.*s' (#%llu): unsupported array element "
                             "type %u", g->path, (int)kv->key.len, kv->key.data,
                             (unsigned long long)idx, at);
        if (n > UINT64_MAX / es)
            return dl_seterr(DL_EFORMAT, "%s: metadata '%.*s': array length %llu overflows",
                             g->path, (int)kv->key.len, kv->key.data, (unsigned long long)n);
        c->what = "metadata array data";
        DL_TRY(cur_need(c, n * es));
        c->pos += n * es;
        return 0;
    }
    uint64_t es = kv_type_size(t);
    if (!es)
        return dl_seterr(DL_EFORMAT, "%s: metadata '%.*s' (#%llu): unknown value type %u at byte %llu",
                         g->path, (int)kv->key.len, kv->key.data, (unsigned long long)idx, t,
                         (unsigned long long)(c->pos - 4));
    c->what = "metadata value";
    DL_TRY(cur_need(c, es));
    read_scalar(kv->type, g->map + c->pos, kv);
    c->pos += es;
    return 0;
}

static int parse_tensor_info(gguf_t *g, cur_t *c, gguf_tensor_t *t, uint64_t idx) {
    c->what = "tensor name";
    DL_TRY(cur_str(c, &t->name));
    c->what = "tensor n_dims";
    DL_TRY(cur_u32(c, &t->n_dims));
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return dl_seterr(DL_EFORMAT, "%s: tensor '%.*s' (#%llu): n_dims %u not in [1, %d]", g->path,
                         (int)t->name.len, t->name.data, (unsigned long long)idx, t->n_dims,
                         GGUF_MAX_DIMS);
    c->what = "tensor shape";
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) DL_TRY(cur_u64(c, &t->ne[d]));
    c->what = "tensor type";
    uint32_t ty;
    DL_TRY(cur_u32(c, &ty));
    c->what = "tensor offset";
    DL_TRY(cur_u64(c, &t->offset));
    t->type = (ggml_type_t)ty;
    if (ty >= GGML_N_TRAITS || !ggml_traits[ty].name)
        return dl_seterr(DL_EFORMAT, "%s: tensor '%.*s': unknown ggml type id %u", g->path,
                         (int)t->name.len, t->name.data, ty);
    /* element count without overflow (each dim < 2^63, product < 2^62) */
    uint64_t n = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        if (t->ne[d] == 0 || t->ne[d] > (UINT64_C(1) << 62) / n)
            return dl_seterr(DL_EFORMAT, "%s: tensor '%.*s': bad shape (dim %d = %llu)", g->path,
                             (int)t->name.len, t->name.data, d, (unsigned long long)t->ne[d]);
        n *= t->ne[d];
    }
    const ggml_traits_t *tr = &ggml_traits[ty];
    if (t->ne[0] % tr->blck)
        return dl_seterr(DL_EFORMAT, "%s: tensor '%.*s': row length %llu is not a multiple of the "
                         "%s block size %u", g->path, (int)t->name.len, t->name.data,
                         (unsigned long long)t->ne[0], tr->name, tr->blck);
    t->nbytes = n / tr->blck * tr->bytes;
    return 0;
}

int gguf_open(const char *path, gguf_t **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dl_seterr(errno == ENOENT ? DL_ENOENT : DL_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return dl_seterr(DL_EIO, "%s: fstat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dl_seterr(DL_EINVAL, "%s: not a regular file", path);
    }
    gguf_t *g = calloc(1, sizeof *g);
    if (!g) {
        close(fd);
        return dl_seterr(DL_ENOMEM, "%s: out of memory", path);
    }
    snprintf(g->path, sizeof g->path, "%s", path);
    g->size = (size_t)st.st_size;
    if (g->size > 0) {
        void *m = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            free(g);
            return dl_seterr(DL_EIO, "%s: mmap: %s", path, strerror(e));
        }
        g->map = m;
    }
    close(fd);

    int rc;
    cur_t c = {g, 0, "magic"};
    uint32_t magic;
    if (g->size < 4) {
        rc = dl_seterr(DL_EFORMAT, "%s: %s GGUF file (%zu bytes, no header)", path, g->size ? "truncated" : "empty",
                       g->size);
        goto fail;
    }
    if ((rc = cur_u32(&c, &magic)) < 0) goto fail;
    if (memcmp(g->map, "GGUF", 4) != 0) {
        rc = dl_seterr(DL_EFORMAT, "%s: not a GGUF file (bad magic at byte 0)", path);
        goto fail;
    }
    c.what = "version";
    if ((rc = cur_u32(&c, &g->version)) < 0) goto fail;
    if (g->version < 2 || g->version > 3) {
        rc = dl_seterr(DL_ENOTSUP, "%s: GGUF version %u not supported (2 and 3 are)", path,
                       g->version);
        goto fail;
    }
    c.what = "tensor count";
    if ((rc = cur_u64(&c, &g->n_tensors)) < 0) goto fail;
    c.what = "metadata count";
    if ((rc = cur_u64(&c, &g->n_kv)) < 0) goto fail;
    if (g->n_kv > GGUF_MAX_KV || g->n_tensors > GGUF_MAX_TENSORS) {
        rc = dl_seterr(DL_EFORMAT, "%s: implausible counts (%llu metadata, %llu tensors)", path,
                       (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors);
        goto fail;
    }
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        rc = dl_seterr(DL_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((rc = parse_kv(g, &c, &g->kv[i], i)) < 0) goto fail;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv_t *al = gguf_find_kv(g, "general.alignment");
    if (al) {
        if (!is_int_type(al->type) || (is_signed_type(al->type) ? al->v.i64 <= 0 : al->v.u64 == 0) ||
            (al->v.u64 & (al->v.u64 - 1)) != 0) {
            rc = dl_seterr(DL_EFORMAT, "%s: general.alignment must be a positive power of two", path);
            goto fail;
        }
        g->alignment = al->v.u64;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((rc = parse_tensor_info(g, &c, &g->tensors[i], i)) < 0) goto fail;
    g->data_off = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor_t *t = &g->tensors[i];
        if (t->offset % g->alignment) {
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%.*s': offset %llu not aligned to %llu", path,
                           (int)t->name.len, t->name.data, (unsigned long long)t->offset,
                           (unsigned long long)g->alignment);
            goto fail;
        }
        if (g->data_off > g->size || t->offset > g->size - g->data_off ||
            t->nbytes > g->size - g->data_off - t->offset) {
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%.*s': data [%llu, +%llu) runs past the end of "
                           "the file (%zu bytes)", path, (int)t->name.len, t->name.data,
                           (unsigned long long)(g->data_off + t->offset),
                           (unsigned long long)t->nbytes, g->size);
            goto fail;
        }
        t->data = g->map + g->data_off + t->offset;
    }
    *out = g;
    return 0;
fail:
    gguf_close(&g);
    return rc;
}

void gguf_close(gguf_t **gp) {
    if (!gp || !*gp) return;
    gguf_t *g = *gp;
    if (g->map) munmap((void *)g->map, g->size);
    free(g->kv);
    free(g->tensors);
    free(g);
    *gp = NULL;
}

uint32_t gguf_version(const gguf_t *g) { return g->version; }
uint64_t gguf_n_kv(const gguf_t *g) { return g->n_kv; }
const gguf_kv_t *gguf_kv_at(const gguf_t *g, uint64_t i) { return i < g->n_kv ? &g->kv[i] : NULL; }

static int str_eq(gguf_str_t s, const char *z) {
    size_t n = strlen(z);
    return s.len == n && memcmp(s.data, z, n) == 0;
}

const gguf_kv_t *gguf_find_kv(const gguf_t *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

static int find_typed(const gguf_t *g, const char *key, const gguf_kv_t **kv) {
    *kv = gguf_find_kv(g, key);
    if (!*kv) return dl_seterr(DL_ENOENT, "%s: metadata '%s' not found", g->path, key);
    return 0;
}

int gguf_get_u64(const gguf_t *g, const char *key, uint64_t *out) {
    const gguf_kv_t *kv;
    DL_TRY(find_typed(g, key, &kv));
    if (!is_int_type(kv->type))
        return dl_seterr(DL_EFORMAT, "%s: metadata '%s': expected an integer (type %d)", g->path,
                         key, kv->type);
    if (is_signed_type(kv->type) && kv->v.i64 < 0)
        return dl_seterr(DL_EFORMAT, "%s: metadata '%s': negative value %lld", g->path, key,
                         (long long)kv->v.i64);
    *out = kv->v.u64;
    return 0;
}

int gguf_get_f64(const gguf_t *g, const char *key, double *out) {
    const gguf_kv_t *kv;
    DL_TRY(find_typed(g, key, &kv));
    if (kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64) *out = kv->v.f64;
    else if (is_signed_type(kv->type)) *out = (double)kv->v.i64;
    else if (is_int_type(kv->type)) *out = (double)kv->v.u64;
    else
        return dl_seterr(DL_EFORMAT, "%s: metadata '%s': expected a number (type %d)", g->path, key,
                         kv->type);
    return 0;
}

int gguf_get_str(const gguf_t *g, const char *key, gguf_str_t *out) {
    const gguf_kv_t *kv;
    DL_TRY(find_typed(g, key, &kv));
    if (kv->type != GGUF_TYPE_STRING)
        return dl_seterr(DL_EFORMAT, "%s: metadata '%s': expected a string (type %d)", g->path, key,
                         kv->type);
    *out = kv->str;
    return 0;
}

static int find_array(const gguf_t *g, const char *key, uint64_t n, const gguf_kv_t **kv) {
    DL_TRY(find_typed(g, key, kv));
    if ((*kv)->type != GGUF_TYPE_ARRAY)
        return dl_seterr(DL_EFORMAT, "%s: metadata '%s': expected an array (type %d)", g->path, key,
                         (*kv)->type);
    if (n > (*kv)->arr_len)
        return dl_seterr(DL_ERANGE, "%s: metadata '%s': asked for %llu elements, array has %llu",
                         g->path, key, (unsigned long long)n, (unsigned long long)(*kv)->arr_len);
    return 0;
}

int gguf_get_str_array(const gguf_t *g, const char *key, gguf_str_t *out, uint64_t n) {
    const gguf_kv_t *kv;
    DL_TRY(find_array(g, key, n, &kv));
    if (kv->arr_type != GGUF_TYPE_STRING)
        return dl_seterr(DL_EFORMAT, "%s: metadata '%s': expected an array of strings", g->path, key);
    /* Already bounds-checked at open. */
    const uint8_t *p = kv->arr_data;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len;
        memcpy(&len, p, 8);
        out[i].data = (const char *)p + 8;
        out[i].len = len;
        p += 8 + len;
    }
    return 0;
}

static double arr_elem(const gguf_kv_t *kv, uint64_t i) {
    gguf_kv_t tmp;
    uint64_t es = kv_type_size(kv->arr_type);
    read_scalar(kv->arr_type, kv->arr_data + i * es, &tmp);
    switch (kv->arr_type) {
    case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64: return tmp.v.f64;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        return (double)tmp.v.i64;
    default: return (double)tmp.v.u64;
    }
}

int gguf_get_f32_array(const gguf_t *g, const char *key, float *out, uint64_t n) {
    const gguf_kv_t *kv;
    DL_TRY(find_array(g, key, n, &kv));
    if (!kv_type_size(kv->arr_type))
        return dl_seterr(DL_EFORMAT, "%s: metadata '%s': expected an array of numbers", g->path, key);
    for (uint64_t i = 0; i < n; i++) out[i] = (float)arr_elem(kv, i);
    return 0;
}

int gguf_get_i32_array(const gguf_t *g, const char *key, int32_t *out, uint64_t n) {
    const gguf_kv_t *kv;
    DL_TRY(find_array(g, key, n, &kv));
    if (!kv_type_size(kv->arr_type))
        return dl_seterr(DL_EFORMAT, "%s: metadata '%s': expected an array of numbers", g->path, key);
    for (uint64_t i = 0; i < n; i++) {
        double x = arr_elem(kv, i);
        if (!(x >= INT32_MIN && x <= INT32_MAX))
            return dl_seterr(DL_ERANGE, "%s: metadata '%s'[%llu] = %g does not fit int32", g->path,
                             key, (unsigned long long)i, x);
        out[i] = (int32_t)x;
    }
    return 0;
}

uint64_t gguf_n_tensors(const gguf_t *g) { return g->n_tensors; }
const gguf_tensor_t *gguf_tensor_at(const gguf_t *g, uint64_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

uint64_t gguf_tensor_nelem(const gguf_tensor_t *t) {
    uint64_t n = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) n *= t->ne[d];
    return n;
}

/* ---- dequantization ----------------------------------------------------- */

/* IEEE half -> float, exact (as numpy's float16 -> float32). */
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal: normalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            man &= 0x3ff;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13);
    else bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float rd_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

/* Each element: fp32 products/sums in gguf/quants.py's order; no fused multiply-add,
 * so the result is bit-identical to numpy's. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define NO_FMA
#else
#define NO_FMA __attribute__((optimize("fp-contract=off")))
#endif

NO_FMA static void deq_q4_0(const uint8_t *b, float *y) {   /* 18 bytes: f16 d, u8 qs[16] */
    float d = rd_f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((int)(qs[j] & 0xf) - 8);
        y[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
    }
}

NO_FMA static void deq_q4_1(const uint8_t *b, float *y) {   /* 20 bytes: f16 d, f16 m, qs[16] */
    float d = rd_f16(b), m = rd_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        float lo = d * (float)(qs[j] & 0xf), hi = d * (float)(qs[j] >> 4);
        y[j] = lo + m;
        y[j + 16] = hi + m;
    }
}

NO_FMA static void deq_q8_0(const uint8_t *b, float *y) {   /* 34 bytes: f16 d, i8 qs[32] */
    float d = rd_f16(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

/* Q4_K super-block (256): f16 d, f16 dmin, u8 scales[12] (6-bit scales and mins of
 * 8 sub-blocks of 32), u8 qs[128]. ggml get_scale_min_k4. */
NO_FMA static void deq_q4_k(const uint8_t *b, float *y) {
    float d = rd_f16(b), dmin = rd_f16(b + 2);
    const uint8_t *s = b + 4, *qs = b + 16;
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    for (int sb = 0; sb < 8; sb++) {
        float ds = d * (float)sc[sb], dm = dmin * (float)mn[sb];
        const uint8_t *q = qs + (sb / 2) * 32;
        int shift = (sb % 2) * 4;
        for (int l = 0; l < 32; l++) {
            float p = ds * (float)((q[l] >> shift) & 0xf);
            y[sb * 32 + l] = p - dm;
        }
    }
}

/* Q6_K super-block (256): u8 ql[128] (low 4 bits), u8 qh[64] (high 2 bits),
 * i8 scales[16] (one per 16 elements), f16 d. */
NO_FMA static void deq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = rd_f16(b + 208);
    for (int i = 0; i < 256; i++) {
        int h = i / 128, j = i % 128;
        int lo = (ql[h * 64 + j % 64] >> ((j / 64) * 4)) & 0xf;
        int hi = (qh[h * 32 + j % 32] >> (2 * (j / 32))) & 3;
        float ds = d * (float)sc[i / 16];
        y[i] = ds * (float)((lo | (hi << 4)) - 32);
    }
}

int gguf_dequantize(const gguf_tensor_t *t, float *out) {
    uint64_t n = gguf_tensor_nelem(t);
    const uint8_t *p = t->data;
    switch (t->type) {
    case GGML_F32:
        memcpy(out, p, n * 4);
        return 0;
    case GGML_F16:
        for (uint64_t i = 0; i < n; i++) out[i] = rd_f16(p + 2 * i);
        return 0;
    case GGML_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&out[i], &bits, 4);
        }
        return 0;
    default: break;
    }
    void (*fn)(const uint8_t *, float *) = NULL;
    switch (t->type) {
    case GGML_Q4_0: fn = deq_q4_0; break;
    case GGML_Q4_1: fn = deq_q4_1; break;
    case GGML_Q8_0: fn = deq_q8_0; break;
    case GGML_Q4_K: fn = deq_q4_k; break;
    case GGML_Q6_K: fn = deq_q6_k; break;
    default:
        return dl_seterr(DL_ENOTSUP, "tensor '%.*s': ggml type %s (%d) cannot be dequantized "
                         "(supported: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q4_K Q6_K)", (int)t->name.len,
                         t->name.data, ggml_type_name(t->type), (int)t->type);
    }
    const ggml_traits_t *tr = &ggml_traits[t->type];
    uint64_t nb = n / tr->blck;
    #pragma omp parallel for schedule(static) if (nb > 4096)
    for (uint64_t i = 0; i < nb; i++) fn(p + i * tr->bytes, out + i * tr->blck);
    return 0;
}
