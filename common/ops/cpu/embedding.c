/* Token embedding lookup (the table is frozen in draftline: no backward). */
#include <string.h>

#include "common/ops/cpu/cpu.h"

/* out (T,C) = table[ids[t]], table (V,C); ids validated < V by the caller. */
void ops_cpu_embedding_forward(const ops_ctx_t *c, void *out_, const int32_t *ids,
                               const void *table_, int T, int C) {
    float *out = out_;
    const float *table = table_;
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
    for (int t = 0; t < T; t++)
        memcpy(out + (long)t * C, table + (long)ids[t] * C, (size_t)C * sizeof(float));
}
