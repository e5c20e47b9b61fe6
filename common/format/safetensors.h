/* safetensors reader (memory-mapped) and streaming writer.
 *
 * Format (https://github.com/huggingface/safetensors): u64 little-endian header
 * length N, N bytes of JSON {"name": {"dtype": "F32", "shape": [..],
 * "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}, then the data
 * (offsets relative to the byte after the header). The header is parsed with
 * cJSON; every offset is checked against the file size and against dtype x shape.
 *
 * A safetensors_t is a set of one or more mapped files seen as one tensor table:
 * a single .safetensors file, a sharded model through its
 * model.safetensors.index.json ("weight_map": name -> shard file), or a
 * directory holding either. Tensors of any dtype can be listed (inspect);
 * conversion to fp32 supports F32, F16 and BF16, others give DL_ENOTSUP naming
 * the dtype.
 *
 * Ownership: safetensors_t owns its mappings; st_tensor_t pointers (names,
 * data) live until safetensors_close.
 */
#ifndef DL_FORMAT_SAFETENSORS_H
#define DL_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8

typedef enum { ST_F32 = 0, ST_F16 = 1, ST_BF16 = 2, ST_OTHER = 3 } st_dtype_t;

typedef struct {
    const char *name;        /* NUL-terminated */
    st_dtype_t dtype;
    char dtype_name[12];     /* as in the header: "F32", "BF16", "I64", ... */
    int n_dims;
    int64_t shape[ST_MAX_DIMS];  /* row-major, shape[n_dims-1] fastest */
    const uint8_t *data;     /* into the mapping */
    uint64_t nbytes;
    int file;                /* index of the shard holding it */
} st_tensor_t;

typedef struct safetensors safetensors_t;

/* Opens a .safetensors file, a model.safetensors.index.json, or a directory
 * (index first, else model.safetensors). Errors: DL_ENOENT, DL_EIO, DL_EFORMAT
 * (naming the file and the field), DL_ENOMEM. *out owned by the caller. */
int safetensors_open(const char *path, safetensors_t **out);
void safetensors_close(safetensors_t **st);

size_t safetensors_n_tensors(const safetensors_t *st);
const st_tensor_t *safetensors_tensor_at(const safetensors_t *st, size_t i);
/* By exact name; NULL if absent. */
const st_tensor_t *safetensors_find(const safetensors_t *st, const char *name);
uint64_t st_tensor_nelem(const st_tensor_t *t);
/* Bytes of one element of a dtype name ("F32" 4, "BF16" 2, "I64" 8, ...); 0 if unknown. */
size_t st_dtype_size(const char *dtype_name);

/* Converts t (F32, F16 or BF16) to fp32 out[nelem]. DL_ENOTSUP names other dtypes. */
int st_tensor_to_f32(const st_tensor_t *t, float *out);
/* Elements [first, first + n) of t (F32, F16 or BF16; the range inside the tensor, not
 * checked) to out[n]: _f32 as st_tensor_to_f32; _bf16 bitwise as st_tensor_to_f32 then
 * st_f32_to_bf16 (so a BF16 tensor is copied, a NaN made quiet). One thread: callers
 * cut a big tensor into ranges for their threads. Reads the mapping (page faults on a
 * file not yet in memory). 0, or DL_ENOTSUP naming another dtype (n == 0 checks that). */
int st_tensor_to_f32_range(const st_tensor_t *t, uint64_t first, uint64_t n, float *out);
int st_tensor_to_bf16_range(const st_tensor_t *t, uint64_t first, uint64_t n, uint16_t *out);

/* ---- streaming writer --------------------------------------------------
 * Declare every tensor (name, dtype, shape) first, then write their data in
 * declaration order, in as many pieces as wanted; so a 16 GB checkpoint is
 * written without holding it in memory. The file is written to "<path>.tmp",
 * fsync'd and renamed on st_writer_finish (atomic). */
typedef struct st_writer st_writer_t;

int st_writer_new(const char *path, st_writer_t **out);
/* st_writer_new, the file written through common/base/dio.h: its whole 4 KiB blocks with
 * O_DIRECT where the file system takes it (else buffered, as st_writer_new), through a
 * 32 MiB bounce buffer the writer owns. Same bytes; for checkpoint-sized files written
 * once (not read back soon: they bypass the page cache). */
int st_writer_new_direct(const char *path, st_writer_t **out);
/* dtype_name: "F32", "F16" or "BF16". name copied. */
int st_writer_add(st_writer_t *w, const char *name, const char *dtype_name, int n_dims,
                  const int64_t *shape);
/* Optional "__metadata__" entry (copied). */
int st_writer_meta(st_writer_t *w, const char *key, const char *value);
/* Appends bytes of the current tensor (header is written on the first call).
 * Errors when more bytes are written than declared. */
int st_writer_write(st_writer_t *w, const void *data, size_t nbytes);
/* Checks all declared bytes were written, fsyncs, renames; frees w. */
int st_writer_finish(st_writer_t **w);
/* Abandons: removes the temp file, frees w. */
void st_writer_abort(st_writer_t **w);

/* fp32 -> bf16 (round to nearest even, NaN kept quiet) and -> f16 (IEEE, RNE). */
uint16_t st_f32_to_bf16(float x);
uint16_t st_f32_to_f16(float x);
float st_bf16_to_f32(uint16_t h);
float st_f16_to_f32(uint16_t h);

#endif
