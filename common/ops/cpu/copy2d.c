/* Strided 2-D copy (the CPU twin of cudaMemcpy2DAsync). */
#include <string.h>

#include "common/ops/cpu/cpu.h"

/* rows x width_bytes from src (pitch src_pitch bytes) to dst (pitch dst_pitch bytes). */
void ops_cpu_copy2d(const ops_ctx_t *c, void *dst, size_t dst_pitch, const void *src,
                    size_t src_pitch, size_t width_bytes, size_t rows) {
    char *d = dst;
    const char *s = src;
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static) if (rows * width_bytes > (1u << 20))
    for (size_t r = 0; r < rows; r++) memcpy(d + r * dst_pitch, s + r * src_pitch, width_bytes);
}
