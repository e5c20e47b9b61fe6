/* GGUF (v2/v3) reader: memory-maps the file, parses metadata and tensor infos,
 * and dequantizes tensors to fp32.
 *
 * Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
 * Every offset and length read from the file is bounds-checked against the file
 * size; a malformed file gives DL_EFORMAT naming the field and the byte offset.
 * Ownership: gguf_t owns the mapping; strings and arrays returned point into it
 * and live until gguf_close.
 */
#ifndef DL_FORMAT_GGUF_H
#define DL_FORMAT_GGUF_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    GGUF_TYPE_UINT8 = 0, GGUF_TYPE_INT8 = 1, GGUF_TYPE_UINT16 = 2, GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4, GGUF_TYPE_INT32 = 5, GGUF_TYPE_FLOAT32 = 6, GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8, GGUF_TYPE_ARRAY = 9, GGUF_TYPE_UINT64 = 10, GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12
} gguf_type_t;

/* ggml tensor types that draftline dequantizes (others: DL_ENOTSUP naming the type). */
typedef enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8,
    GGML_Q4_K = 12, GGML_Q6_K = 14, GGML_BF16 = 30
} ggml_type_t;

typedef struct {
    const char *data;   /* not NUL-terminated */
    uint64_t len;
} gguf_str_t;

typedef struct {
    gguf_str_t key;
    gguf_type_t type;
    /* scalar value (for non-array, non-string types), widened */
    union { uint64_t u64; int64_t i64; double f64; int b; } v;
    gguf_str_t str;          /* type == STRING */
    gguf_type_t arr_type;    /* type == ARRAY: element type */
    uint64_t arr_len;        /* type == ARRAY: element count */
    const uint8_t *arr_data; /* type == ARRAY of fixed-size elements: raw little-endian data;
                                ARRAY of STRING: first string's length prefix */
} gguf_kv_t;

typedef struct {
    gguf_str_t name;
    uint32_t n_dims;
    uint64_t ne[4];          /* ggml order: ne[0] is the fastest-varying (columns) */
    ggml_type_t type;
    uint64_t offset;         /* from the start of the tensor data section */
    const uint8_t *data;     /* points into the mapping */
    uint64_t nbytes;
} gguf_tensor_t;

typedef struct gguf gguf_t;

/* Opens and validates `path`. *out owned by the caller (gguf_close). */
int gguf_open(const char *path, gguf_t **out);
void gguf_close(gguf_t **g);

uint32_t gguf_version(const gguf_t *g);
uint64_t gguf_n_kv(const gguf_t *g);
const gguf_kv_t *gguf_kv_at(const gguf_t *g, uint64_t i);
/* Lookup by key; NULL if absent. */
const gguf_kv_t *gguf_find_kv(const gguf_t *g, const char *key);
/* Typed getters: 0, DL_ENOENT (absent) or DL_EFORMAT (wrong type), naming the key. */
int gguf_get_u64(const gguf_t *g, const char *key, uint64_t *out);   /* any integer type */
int gguf_get_f64(const gguf_t *g, const char *key, double *out);     /* float or integer */
int gguf_get_str(const gguf_t *g, const char *key, gguf_str_t *out);
/* Array of strings: iterate with an index; strings point into the mapping. For
 * vocabularies of 150k entries, gguf_get_str_array fills out[n] in one pass. */
int gguf_get_str_array(const gguf_t *g, const char *key, gguf_str_t *out, uint64_t n);
/* Array of numbers (any int/float element type), converted: out[n]. */
int gguf_get_f32_array(const gguf_t *g, const char *key, float *out, uint64_t n);
int gguf_get_i32_array(const gguf_t *g, const char *key, int32_t *out, uint64_t n);

uint64_t gguf_n_tensors(const gguf_t *g);
const gguf_tensor_t *gguf_tensor_at(const gguf_t *g, uint64_t i);
const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name);
/* Element count (product of ne). */
uint64_t gguf_tensor_nelem(const gguf_tensor_t *t);
/* Dequantizes the whole tensor into out (nelem) fp32, in ggml element order
 * (row-major with ne[0] fastest, which is torch's (ne[1], ne[0]) layout). */
int gguf_dequantize(const gguf_tensor_t *t, float *out);
const char *ggml_type_name(ggml_type_t t);

#endif
