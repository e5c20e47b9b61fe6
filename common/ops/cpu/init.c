/* The seeded normal init (ops.h normal_init) on the CPU: the reference of
 * common/ops/cuda/init.cu and the host init itself (common/model/drafter.c). Each chunk
 * from its jumped xoshiro256** state, its normals in order, the chunks on OpenMP threads
 * (any thread count gives the same bits: each normal depends only on its chunk's state).
 * The values are rng_normal's, so the normals it lists near a rounding midpoint (only
 * when near_rel > 0; the host init passes 0) are right as written. */
#include "common/base/err.h"
#include "common/base/f32near.h"
#include "common/base/rng.h"
#include "common/ops/cpu/cpu.h"

#include <string.h>

int ops_cpu_normal_init(const ops_ctx_t *c, float *dst, const ops_normal_seg_t *seg, int n_seg,
                        const uint64_t *states, size_t n_chunks, size_t chunk, uint64_t G, float scale,
                        double near_rel, ops_normal_near_t *near, size_t near_cap, size_t *n_near) {
    size_t nn = 0;
    if (G && (n_seg < 1 || chunk == 0)) return dl_seterr(DL_EINVAL, "normal_init: %d segments, chunk %zu", n_seg, chunk);
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(dynamic, 1)
    for (size_t k = 0; k < n_chunks; k++) {
        rng_t r;
        memcpy(r.s, states + 4 * k, sizeof r.s);
        uint64_t g = (uint64_t)k * chunk, g1 = g + chunk < G ? g + chunk : G;
        int lo = 0, hi = n_seg - 1;   /* the segment holding g: the last with gstart <= g */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (seg[mid].gstart <= g) lo = mid; else hi = mid - 1;
        }
        for (int s = lo; g < g1; s++) {
            uint64_t e1 = g1 < seg[s].gstart + seg[s].numel ? g1 : seg[s].gstart + seg[s].numel;
            for (; g < e1; g++) {
                uint64_t a = rng_u64(&r), b = rng_u64(&r), i = seg[s].offset + (g - seg[s].gstart);
                double v = rng_normal_f64(a, b);
                dst[i] = scale * (float)v;
                if (near_rel > 0 && f32_near_midpoint(v, near_rel)) {
                    size_t slot;
#pragma omp atomic capture
                    slot = nn++;
                    if (slot < near_cap) near[slot] = (ops_normal_near_t){i, {a, b}, dst[i], 0};
                }
            }
        }
    }
    *n_near = nn;
    return nn > near_cap ? dl_seterr(DL_ERANGE, "normal_init: %zu normals near a float rounding midpoint, room for %zu",
                                     nn, near_cap) : 0;
}
