/* safetensors reader and streaming writer. See safetensors.h. */
#include "common/format/safetensors.h"

#include "common/base/dio.h"
#include "common/base/err.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Header limit as in the safetensors crate (100 MB). */
#define ST_MAX_HEADER (100u << 20)
#define ST_MAX_SHARDS 4096

typedef struct {
    char *path;
    const uint8_t *map;
    size_t size;
} st_file_t;

struct safetensors {
    st_file_t *files;
    int n_files;
    st_tensor_t *t;
    size_t n, cap;
    char **names;   /* owned name strings, one per tensor */
};

size_t st_dtype_size(const char *d) {
    static const struct { const char *n; size_t s; } tab[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"U64", 8}, {"I32", 4},
        {"U32", 4}, {"I16", 2}, {"U16", 2}, {"I8", 1}, {"U8", 1}, {"BOOL", 1},
        {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(tab[i].n, d)) return tab[i].s;
    return 0;
}

uint64_t st_tensor_nelem(const st_tensor_t *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= (uint64_t)t->shape[i];
    return n;
}

static int map_file(const char *path, st_file_t *f) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dl_seterr(errno == ENOENT ? DL_ENOENT : DL_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dl_seterr(DL_EIO, "%s: not a readable regular file", path);
    }
    f->size = (size_t)st.st_size;
    f->map = NULL;
    if (f->size) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return dl_seterr(DL_EIO, "%s: mmap: %s", path, strerror(e));
        }
        f->map = m;
    }
    close(fd);
    f->path = strdup(path);
    if (!f->path) return dl_seterr(DL_ENOMEM, "%s: out of memory", path);
    return 0;
}

static int push_tensor(safetensors_t *st, st_tensor_t *t, const char *name) {
    if (st->n == st->cap) {
        size_t nc = st->cap ? 2 * st->cap : 64;
        st_tensor_t *nt = realloc(st->t, nc * sizeof *nt);
        if (!nt) return dl_seterr(DL_ENOMEM, "safetensors: out of memory");
        st->t = nt;
        char **nn = realloc(st->names, nc * sizeof *nn);
        if (!nn) return dl_seterr(DL_ENOMEM, "safetensors: out of memory");
        st->names = nn;
        st->cap = nc;
    }
    char *s = strdup(name);
    if (!s) return dl_seterr(DL_ENOMEM, "safetensors: out of memory");
    st->names[st->n] = s;
    t->name = s;
    st->t[st->n++] = *t;
    return 0;
}

/* s (a tensor name or dtype from a header that may be corrupt) as printable text for an
 * error message: printable ASCII kept, every other byte as \xNN, '...' past 48 bytes, so
 * a corrupt header never sends raw bytes (escape sequences) to a terminal. buf: 256. */
static const char *esc(const char *s, char buf[256]) {
    size_t n = 0;
    for (size_t i = 0; s[i] && n + 8 < 256; i++) {
        if (i == 48) { memcpy(buf + n, "...", 3); n += 3; break; }
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\') buf[n++] = (char)c;
        else n += (size_t)snprintf(buf + n, 256 - n, "\\x%02x", c);
    }
    buf[n] = 0;
    return buf;
}

/* Parses the header of file index fi and appends its tensors. If only (weight_map
 * filter) is not NULL, tensors are appended regardless (the index lists them all). */
static int parse_file(safetensors_t *st, int fi) {
    st_file_t *f = &st->files[fi];
    if (f->size < 8) return dl_seterr(DL_EFORMAT, "%s: too short for a safetensors header (%zu bytes)", f->path, f->size);
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);
    if (hlen > ST_MAX_HEADER || hlen > f->size - 8) {
        /* the first 8 bytes of a text file (JSONL, ...) read as a huge length */
        if (f->size > 8 && f->map[8] != '{')
            return dl_seterr(DL_EFORMAT, "%s: not a safetensors file (its first 8 bytes give a header length of %llu "
                             "bytes > the file's %zu bytes, and no JSON header follows)", f->path,
                             (unsigned long long)hlen, f->size);
        return dl_seterr(DL_EFORMAT, "%s: header length %llu exceeds the file (%zu bytes) or the "
                         "100 MB limit", f->path, (unsigned long long)hlen, f->size);
    }
    const uint8_t *data = f->map + 8 + hlen;
    uint64_t data_size = f->size - 8 - hlen;
    cJSON *root = cJSON_ParseWithLength((const char *)f->map + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= (const char *)f->map + 8 && at <= (const char *)f->map + 8 + hlen
                   ? (long)(at - (const char *)f->map - 8) : -1;
        cJSON_Delete(root);
        if (off >= 0) return dl_seterr(DL_EFORMAT, "%s: header is not a JSON object (it stops parsing at byte %ld of "
                                       "its %llu)", f->path, off, (unsigned long long)hlen);
        return dl_seterr(DL_EFORMAT, "%s: header is not a JSON object", f->path);
    }
    int rc = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, root) {
        const char *name = e->string;
        if (!strcmp(name, "__metadata__")) continue;
        char eb[256], db[256];
        st_tensor_t t;
        memset(&t, 0, sizeof t);
        t.file = fi;
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
            cJSON_GetArraySize(off) != 2) {
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s': needs dtype (string), shape (array) and "
                           "data_offsets ([begin, end])", f->path, esc(name, eb));
            break;
        }
        size_t es = st_dtype_size(dt->valuestring);
        if (!es) {
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s': unknown dtype '%s'", f->path, esc(name, eb),
                           esc(dt->valuestring, db));
            break;
        }
        snprintf(t.dtype_name, sizeof t.dtype_name, "%s", dt->valuestring);
        t.dtype = !strcmp(dt->valuestring, "F32") ? ST_F32 : !strcmp(dt->valuestring, "F16") ? ST_F16
                : !strcmp(dt->valuestring, "BF16") ? ST_BF16 : ST_OTHER;
        int nd = cJSON_GetArraySize(sh);
        if (nd > ST_MAX_DIMS) {
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s': %d dims (max %d)", f->path, esc(name, eb), nd, ST_MAX_DIMS);
            break;
        }
        t.n_dims = nd;
        uint64_t nel = 1;
        int i = 0;
        cJSON *d;
        cJSON_ArrayForEach(d, sh) {
            double v = cJSON_IsNumber(d) ? d->valuedouble : -1;
            if (!(v >= 0 && v < 9007199254740992.0) || v != floor(v)) {
                rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s': bad shape entry %d", f->path, esc(name, eb), i);
                break;
            }
            t.shape[i++] = (int64_t)v;
            if (v > 0 && nel > (UINT64_C(1) << 53) / (uint64_t)v) {
                rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s': shape overflows", f->path, esc(name, eb));
                break;
            }
            nel *= (uint64_t)v;
        }
        if (rc) break;
        double b = cJSON_IsNumber(cJSON_GetArrayItem(off, 0)) ? cJSON_GetArrayItem(off, 0)->valuedouble : -1;
        double en = cJSON_IsNumber(cJSON_GetArrayItem(off, 1)) ? cJSON_GetArrayItem(off, 1)->valuedouble : -1;
        if (!(b >= 0 && en >= b && en <= (double)data_size) || b != floor(b) || en != floor(en)) {
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s': data_offsets [%.0f, %.0f] outside the data "
                           "section (%llu bytes)", f->path, esc(name, eb), b, en, (unsigned long long)data_size);
            break;
        }
        t.nbytes = (uint64_t)en - (uint64_t)b;
        if (t.nbytes != nel * es) {
            rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s': %llu bytes but dtype %s x shape needs %llu",
                           f->path, esc(name, eb), (unsigned long long)t.nbytes, t.dtype_name,
                           (unsigned long long)(nel * es));
            break;
        }
        t.data = data + (uint64_t)b;
        if ((rc = push_tensor(st, &t, name)) < 0) break;
    }
    cJSON_Delete(root);
    return rc;
}

static int add_file(safetensors_t *st, const char *path) {
    for (int i = 0; i < st->n_files; i++)
        if (!strcmp(st->files[i].path, path)) return 0;
    if (st->n_files >= ST_MAX_SHARDS) return dl_seterr(DL_ERANGE, "%s: too many shards", path);
    st_file_t *nf = realloc(st->files, (size_t)(st->n_files + 1) * sizeof *nf);
    if (!nf) return dl_seterr(DL_ENOMEM, "safetensors: out of memory");
    st->files = nf;
    memset(&st->files[st->n_files], 0, sizeof *nf);
    DL_TRY(map_file(path, &st->files[st->n_files]));
    st->n_files++;
    return parse_file(st, st->n_files - 1);
}

static int read_text(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return dl_seterr(errno == ENOENT ? DL_ENOENT : DL_EIO, "%s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return dl_seterr(DL_EIO, "%s: seek failed", path); }
    long n = ftell(f);
    if (n < 0) { fclose(f); return dl_seterr(DL_EIO, "%s: ftell failed", path); }
    rewind(f);
    char *b = malloc((size_t)n + 1);
    if (!b) { fclose(f); return dl_seterr(DL_ENOMEM, "%s: out of memory", path); }
    if (fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        fclose(f);
        return dl_seterr(DL_EIO, "%s: short read", path);
    }
    fclose(f);
    b[n] = 0;
    *out = b;
    if (len) *len = (size_t)n;
    return 0;
}

static int open_index(safetensors_t *st, const char *index_path) {
    char *txt = NULL;
    DL_TRY(read_text(index_path, &txt, NULL));
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return dl_seterr(DL_EFORMAT, "%s: no \"weight_map\" object", index_path);
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", index_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    int rc = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !strcmp(e->valuestring, "..")) {
            rc = dl_seterr(DL_EFORMAT, "%s: weight_map['%s']: expected a file name in the same "
                           "directory", index_path, e->string);
            break;
        }
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", dir, e->valuestring) >= (int)sizeof p) {
            rc = dl_seterr(DL_ERANGE, "%s: shard path too long", index_path);
            break;
        }
        if ((rc = add_file(st, p)) < 0) break;
    }
    /* every tensor named in the index must be present in its shard */
    if (!rc) {
        cJSON_ArrayForEach(e, wm) {
            const st_tensor_t *t = safetensors_find(st, e->string);
            if (!t || strcmp(strrchr(st->files[t->file].path, '/') + 1, e->valuestring)) {
                rc = dl_seterr(DL_EFORMAT, "%s: tensor '%s' listed in %s is not in that shard",
                               index_path, e->string, e->valuestring);
                break;
            }
        }
    }
    cJSON_Delete(root);
    return rc;
}

int safetensors_open(const char *path, safetensors_t **out) {
    *out = NULL;
    safetensors_t *st = calloc(1, sizeof *st);
    if (!st) return dl_seterr(DL_ENOMEM, "safetensors: out of memory");
    struct stat sb;
    int rc;
    if (stat(path, &sb) < 0) {
        rc = dl_seterr(DL_ENOENT, "%s: %s", path, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
        if (access(p, R_OK) == 0) rc = open_index(st, p);
        else {
            snprintf(p, sizeof p, "%s/model.safetensors", path);
            if (access(p, R_OK) == 0) rc = add_file(st, p);
            else rc = dl_seterr(DL_ENOENT, "%s: no model.safetensors.index.json or model.safetensors",
                                path);
        }
    } else {
        size_t n = strlen(path);
        if (n > 5 && !strcmp(path + n - 5, ".json")) rc = open_index(st, path);
        else rc = add_file(st, path);
    }
    if (rc < 0) {
        safetensors_close(&st);
        return rc;
    }
    *out = st;
    return 0;
}

void safetensors_close(safetensors_t **stp) {
    if (!stp || !*stp) return;
    safetensors_t *st = *stp;
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].map) munmap((void *)st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    for (size_t i = 0; i < st->n; i++) free(st->names[i]);
    free(st->names);
    free(st->files);
    free(st->t);
    free(st);
    *stp = NULL;
}

size_t safetensors_n_tensors(const safetensors_t *st) { return st->n; }
const st_tensor_t *safetensors_tensor_at(const safetensors_t *st, size_t i) {
    return i < st->n ? &st->t[i] : NULL;
}

const st_tensor_t *safetensors_find(const safetensors_t *st, const char *name) {
    for (size_t i = 0; i < st->n; i++)
        if (!strcmp(st->t[i].name, name)) return &st->t[i];
    return NULL;
}

float st_bf16_to_f32(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (!man) bits = sign;
        else {
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13);
    else bits = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t st_f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

uint16_t st_f32_to_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);          /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);         /* overflow -> inf */
    if (a < 0x38800000u) {                                          /* subnormal or zero */
        if (a < 0x33000000u) return (uint16_t)sign;
        uint32_t m = (a & 0x7fffff) | 0x800000;
        int shift = 126 - (int)(a >> 23);                           /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((a >> 13) - (112u << 10));
    uint32_t rem = a & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

int st_tensor_to_f32(const st_tensor_t *t, float *out) {
    uint64_t n = st_tensor_nelem(t);
    switch (t->dtype) {
    case ST_F32:
        memcpy(out, t->data, n * 4);
        return 0;
    case ST_BF16:
    case ST_F16: {
        const uint8_t *p = t->data;
        int bf = t->dtype == ST_BF16;
        #pragma omp parallel for schedule(static) if (n > (1u << 20))
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = bf ? st_bf16_to_f32(h) : st_f16_to_f32(h);
        }
        return 0;
    }
    default:
        return dl_seterr(DL_ENOTSUP, "tensor '%s': dtype %s not supported (F32, F16, BF16 are)",
                         t->name, t->dtype_name);
    }
}

static int st_unsupported(const st_tensor_t *t) {
    return dl_seterr(DL_ENOTSUP, "tensor '%s': dtype %s not supported (F32, F16, BF16 are)", t->name,
                     t->dtype_name);
}

int st_tensor_to_f32_range(const st_tensor_t *t, uint64_t first, uint64_t n, float *out) {
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case ST_F32:
        if (n) memcpy(out, p + 4 * first, n * 4);
        return 0;
    case ST_BF16:
    case ST_F16: {
        int bf = t->dtype == ST_BF16;
        p += 2 * first;
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = bf ? st_bf16_to_f32(h) : st_f16_to_f32(h);
        }
        return 0;
    }
    default:
        return st_unsupported(t);
    }
}

int st_tensor_to_bf16_range(const st_tensor_t *t, uint64_t first, uint64_t n, uint16_t *out) {
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case ST_BF16:
        /* bf16 -> f32 is exact and f32 -> bf16 (RNE) gives the same bits back, except
         * that a NaN comes back quiet: a copy with that one change */
        p += 2 * first;
        if (n) memcpy(out, p, n * 2);
        for (uint64_t i = 0; i < n; i++)
            if ((out[i] & 0x7fffu) > 0x7f80u) out[i] |= 0x40u;
        return 0;
    case ST_F32:
    case ST_F16: {
        int f32 = t->dtype == ST_F32;
        p += (f32 ? 4 : 2) * first;
        for (uint64_t i = 0; i < n; i++) {
            float x;
            if (f32) {
                memcpy(&x, p + 4 * i, 4);
            } else {
                uint16_t h;
                memcpy(&h, p + 2 * i, 2);
                x = st_f16_to_f32(h);
            }
            out[i] = st_f32_to_bf16(x);
        }
        return 0;
    }
    default:
        return st_unsupported(t);
    }
}

/* ---- writer ------------------------------------------------------------- */

typedef struct { char *name; char dtype[8]; int n_dims; int64_t shape[ST_MAX_DIMS]; uint64_t nbytes; } st_decl_t;

struct st_writer {
    char *path, *tmp;
    FILE *f;              /* buffered (st_writer_new) */
    dio_file_t *df;       /* or direct (st_writer_new_direct): the bytes at pos, a bounce buffer */
    dio_bounce_t b;
    uint64_t pos;
    st_decl_t *d;
    int n, cap;
    cJSON *meta;
    int header_done;
    int cur;              /* tensor being written */
    uint64_t cur_written;
};

static int writer_new(const char *path, int direct, st_writer_t **out) {
    *out = NULL;
    st_writer_t *w = calloc(1, sizeof *w);
    if (!w) return dl_seterr(DL_ENOMEM, "%s: out of memory", path);
    w->path = strdup(path);
    w->tmp = malloc(strlen(path) + 5);
    if (!w->path || !w->tmp) {
        st_writer_abort(&w);
        return dl_seterr(DL_ENOMEM, "%s: out of memory", path);
    }
    sprintf(w->tmp, "%s.tmp", path);
    if (direct) dio_open(w->tmp, 0, &w->df);
    else w->f = fopen(w->tmp, "wb");
    if (!w->f && !w->df) {
        int e = errno;
        st_writer_abort(&w);
        return dl_seterr(DL_EIO, "%s.tmp: %s", path, strerror(e));
    }
    *out = w;
    return 0;
}

int st_writer_new(const char *path, st_writer_t **out) { return writer_new(path, 0, out); }
int st_writer_new_direct(const char *path, st_writer_t **out) { return writer_new(path, 1, out); }

/* n bytes of p at the end of what w wrote; 0, or -1 with errno set */
static int put(st_writer_t *w, const void *p, size_t n) {
    if (!w->df) return fwrite(p, 1, n, w->f) == n ? 0 : -1;
    if (dio_pwrite(w->df, &w->b, p, n, w->pos) < 0) return -1;
    w->pos += n;
    return 0;
}

int st_writer_add(st_writer_t *w, const char *name, const char *dtype, int n_dims, const int64_t *shape) {
    if (w->header_done) return dl_seterr(DL_ESTATE, "%s: st_writer_add after data was written", w->path);
    size_t es = st_dtype_size(dtype);
    if (!es || n_dims < 0 || n_dims > ST_MAX_DIMS)
        return dl_seterr(DL_EINVAL, "%s: tensor '%s': bad dtype '%s' or %d dims", w->path, name, dtype, n_dims);
    if (w->n == w->cap) {
        int nc = w->cap ? 2 * w->cap : 64;
        st_decl_t *nd = realloc(w->d, (size_t)nc * sizeof *nd);
        if (!nd) return dl_seterr(DL_ENOMEM, "%s: out of memory", w->path);
        w->d = nd;
        w->cap = nc;
    }
    st_decl_t *d = &w->d[w->n];
    memset(d, 0, sizeof *d);
    d->name = strdup(name);
    if (!d->name) return dl_seterr(DL_ENOMEM, "%s: out of memory", w->path);
    snprintf(d->dtype, sizeof d->dtype, "%s", dtype);
    d->n_dims = n_dims;
    uint64_t n = 1;
    for (int i = 0; i < n_dims; i++) { d->shape[i] = shape[i]; n *= (uint64_t)shape[i]; }
    d->nbytes = n * es;
    w->n++;
    return 0;
}

int st_writer_meta(st_writer_t *w, const char *key, const char *value) {
    if (w->header_done) return dl_seterr(DL_ESTATE, "%s: st_writer_meta after data was written", w->path);
    if (!w->meta && !(w->meta = cJSON_CreateObject())) return dl_seterr(DL_ENOMEM, "out of memory");
    if (!cJSON_AddStringToObject(w->meta, key, value)) return dl_seterr(DL_ENOMEM, "out of memory");
    return 0;
}

static int write_header(st_writer_t *w) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return dl_seterr(DL_ENOMEM, "out of memory");
    if (w->meta) {
        cJSON_AddItemToObject(root, "__metadata__", w->meta);
        w->meta = NULL;
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        cJSON *t = cJSON_AddObjectToObject(root, w->d[i].name);
        cJSON_AddStringToObject(t, "dtype", w->d[i].dtype);
        cJSON *sh = cJSON_AddArrayToObject(t, "shape");
        for (int k = 0; k < w->d[i].n_dims; k++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)w->d[i].shape[k]));
        cJSON *o = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        off += w->d[i].nbytes;
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) return dl_seterr(DL_ENOMEM, "out of memory");
    size_t len = strlen(s);
    size_t padded = (len + 7) / 8 * 8;  /* data starts 8-byte aligned, as the safetensors crate does */
    uint64_t hl = padded;
    uint8_t *hb = malloc(8 + padded);   /* length, JSON, spaces: one write */
    if (!hb) { free(s); return dl_seterr(DL_ENOMEM, "out of memory"); }
    memcpy(hb, &hl, 8);
    memcpy(hb + 8, s, len);
    memset(hb + 8 + len, ' ', padded - len);
    free(s);
    if (w->df) dio_reserve(w->df, 8 + padded + off);   /* off: the data's bytes */
    int ok = put(w, hb, 8 + padded) == 0;
    free(hb);
    if (!ok) return dl_seterr(DL_EIO, "%s: write failed: %s", w->tmp, strerror(errno));
    w->header_done = 1;
    w->cur = 0;
    w->cur_written = 0;
    return 0;
}

int st_writer_write(st_writer_t *w, const void *data, size_t nbytes) {
    if (!w->header_done) DL_TRY(write_header(w));
    const uint8_t *p = data;
    while (nbytes) {
        while (w->cur < w->n && w->cur_written == w->d[w->cur].nbytes) { w->cur++; w->cur_written = 0; }
        if (w->cur >= w->n)
            return dl_seterr(DL_ERANGE, "%s: more data written than declared", w->path);
        uint64_t room = w->d[w->cur].nbytes - w->cur_written;
        size_t k = nbytes < room ? nbytes : (size_t)room;
        if (put(w, p, k) < 0)
            return dl_seterr(DL_EIO, "%s: write failed: %s", w->tmp, strerror(errno));
        w->cur_written += k;
        p += k;
        nbytes -= k;
    }
    return 0;
}

int st_writer_finish(st_writer_t **wp) {
    st_writer_t *w = *wp;
    int rc = 0;
    if (!w->header_done) rc = write_header(w);
    if (!rc) {
        while (w->cur < w->n && w->cur_written == w->d[w->cur].nbytes) { w->cur++; w->cur_written = 0; }
        if (w->cur < w->n)
            rc = dl_seterr(DL_ESTATE, "%s: tensor '%s' not fully written (%llu of %llu bytes)", w->path,
                           w->d[w->cur].name, (unsigned long long)w->cur_written,
                           (unsigned long long)w->d[w->cur].nbytes);
    }
    if (!rc && (w->df ? dio_fsync(w->df) < 0 : fflush(w->f) != 0 || fsync(fileno(w->f)) != 0))
        rc = dl_seterr(DL_EIO, "%s: flush: %s", w->tmp, strerror(errno));
    if (!rc) {
        if (w->df ? dio_close(&w->df) < 0 : fclose(w->f) != 0)
            rc = dl_seterr(DL_EIO, "%s: close: %s", w->tmp, strerror(errno));
        w->f = NULL;
        dio_bounce_free(&w->b);
    }
    if (!rc && rename(w->tmp, w->path) != 0)
        rc = dl_seterr(DL_EIO, "rename %s -> %s: %s", w->tmp, w->path, strerror(errno));
    if (rc) {
        st_writer_abort(wp);
        return rc;
    }
    for (int i = 0; i < w->n; i++) free(w->d[i].name);
    free(w->d);
    free(w->path);
    free(w->tmp);
    free(w);
    *wp = NULL;
    return 0;
}

void st_writer_abort(st_writer_t **wp) {
    if (!wp || !*wp) return;
    st_writer_t *w = *wp;
    if (w->f) fclose(w->f);
    dio_close(&w->df);
    dio_bounce_free(&w->b);
    if (w->tmp) unlink(w->tmp);
    for (int i = 0; i < w->n; i++) free(w->d[i].name);
    free(w->d);
    cJSON_Delete(w->meta);
    free(w->path);
    free(w->tmp);
    free(w);
    *wp = NULL;
}
