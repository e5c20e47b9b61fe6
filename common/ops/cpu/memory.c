/* CPU memory: host allocations (64-byte aligned for SIMD), plain copies; act is
 * fp32 so the act conversions are copies. */
#include <stdlib.h>
#include <string.h>

#include "common/ops/cpu/cpu.h"

#define OPS_CPU_ALIGN 64

/* Returns NULL on failure (or for bytes == 0, a unique pointer as malloc may). */
void *ops_cpu_malloc(const ops_ctx_t *c, size_t bytes) {
    (void)c;
    void *p = NULL;
    size_t rounded = (bytes + OPS_CPU_ALIGN - 1) / OPS_CPU_ALIGN * OPS_CPU_ALIGN;
    if (rounded == 0) rounded = OPS_CPU_ALIGN;
    if (posix_memalign(&p, OPS_CPU_ALIGN, rounded) != 0) return NULL;
    return p;
}

void ops_cpu_free(const ops_ctx_t *c, void *p) { (void)c; free(p); }

void ops_cpu_memset0(const ops_ctx_t *c, void *p, size_t bytes) {
    (void)c;
    if (bytes) memset(p, 0, bytes);
}

void ops_cpu_copy(const ops_ctx_t *c, void *dst, const void *src, size_t bytes) {
    (void)c;
    if (bytes && dst != src) memmove(dst, src, bytes);
}

void ops_cpu_upload(const ops_ctx_t *c, void *dst, const void *src_host, size_t bytes) {
    ops_cpu_copy(c, dst, src_host, bytes);
}

void *ops_cpu_host_alloc(const ops_ctx_t *c, size_t bytes) { return ops_cpu_malloc(c, bytes); }

void ops_cpu_download(const ops_ctx_t *c, void *dst_host, const void *src, size_t bytes) {
    ops_cpu_copy(c, dst_host, src, bytes);
}

void ops_cpu_sync(const ops_ctx_t *c) { (void)c; }

void ops_cpu_upload_act(const ops_ctx_t *c, void *dst_act, const float *src_host, size_t n) {
    ops_cpu_copy(c, dst_act, src_host, n * sizeof(float));
}

void ops_cpu_download_act(const ops_ctx_t *c, float *dst_host, const void *src_act, size_t n) {
    ops_cpu_copy(c, dst_host, src_act, n * sizeof(float));
}

void ops_cpu_act_to_f32(const ops_ctx_t *c, float *dst, const void *src_act, size_t n) {
    ops_cpu_copy(c, dst, src_act, n * sizeof(float));
}

void ops_cpu_f32_to_act(const ops_ctx_t *c, void *dst_act, const float *src, size_t n) {
    ops_cpu_copy(c, dst_act, src, n * sizeof(float));
}
