/* Staged conversion and upload of safetensors tensors for the target's loading. See
 * target_stage.h. */
#include "common/model/target_stage.h"

#include "common/base/err.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void target_stage_init(target_stage_t *s, const ops_ctx_t *c, size_t ab) {
    memset(s, 0, sizeof *s);
    s->c = c;
    s->ab = ab;
    s->piece_bytes = TARGET_STAGE_BYTES;
    s->range_elems = TARGET_CONVERT_ELEMS;
}

void target_stage_release(target_stage_t *s) {
    if (s->buf[0] || s->buf[1]) s->c->impl->sync(s->c);   /* no copy reads them any more */
    for (int i = 0; i < 2; i++)
        if (s->buf[i]) s->c->impl->host_free(s->c, s->buf[i]);
    free(s->tmp);
    s->buf[0] = s->buf[1] = NULL;
    s->tmp = NULL;
    s->tmp_cap = 0;
    s->cur = s->failed = 0;
}

/* Elements [g0, g0 + n) of the parts laid end to end (part_n elements each) to ab-byte
 * elements (4 f32, 2 bf16) at out, in ranges of `range` elements on OpenMP threads; a range
 * may span several parts. Only after the dtypes were checked (no error can come back). */
static void convert_parts(size_t ab, size_t range, const st_tensor_t *const *parts, size_t part_n,
                          size_t g0, size_t n, void *out) {
    size_t nr = (n + range - 1) / range;
    #pragma omp parallel for schedule(dynamic, 1) if (nr > 1)
    for (size_t r = 0; r < nr; r++) {
        size_t a = r * range, m = n - a < range ? n - a : range;
        for (size_t done = 0; done < m;) {
            size_t g = g0 + a + done, p = g / part_n, i = g - p * part_n;
            size_t k = m - done < part_n - i ? m - done : part_n - i;
            if (ab == 2) st_tensor_to_bf16_range(parts[p], i, k, (uint16_t *)out + a + done);
            else st_tensor_to_f32_range(parts[p], i, k, (float *)out + a + done);
            done += k;
        }
    }
}

/* Without pinned staging: a piece at a time to the f32 scratch, then upload_act (which
 * waits for its copy, so the scratch is free again on return). */
static int fill_f32(target_stage_t *s, const char *path, const st_tensor_t *const *parts,
                    size_t part_n, size_t n, void *dst) {
    size_t per = s->piece_bytes / sizeof(float);
    if (per == 0) per = 1;
    size_t want = n < per ? n : per;
    if (want > s->tmp_cap) {
        float *p = realloc(s->tmp, want * sizeof *p);
        if (!p) return dl_seterr(DL_ENOMEM, "%s: no host memory for %zu elements of scratch", path, want);
        s->tmp = p;
        s->tmp_cap = want;
    }
    for (size_t i0 = 0; i0 < n; i0 += per) {
        size_t m = n - i0 < per ? n - i0 : per;
        convert_parts(4, s->range_elems, parts, part_n, i0, m, s->tmp);
        s->c->impl->upload_act(s->c, (uint8_t *)dst + i0 * s->ab, s->tmp, m);
    }
    return 0;
}

int target_stage_fill(target_stage_t *s, const char *path, const st_tensor_t *const *parts,
                      int n_parts, void *dst) {
    if (n_parts < 1) return dl_seterr(DL_EINVAL, "%s: target_stage_fill of %d tensors", path, n_parts);
    size_t part_n = st_tensor_nelem(parts[0]);
    for (int p = 0; p < n_parts; p++) {
        if (st_tensor_nelem(parts[p]) != part_n)
            return dl_seterr(DL_EINVAL, "%s: tensors '%s' and '%s' differ in size", path,
                             parts[0]->name, parts[p]->name);
        int rc = st_tensor_to_f32_range(parts[p], 0, 0, NULL);   /* the dtype check */
        if (rc < 0) return dl_wraperr(rc, "%s", path);
    }
    size_t n = part_n * (size_t)n_parts;
    if (n == 0) return 0;
    if (s->range_elems == 0) s->range_elems = TARGET_CONVERT_ELEMS;
    const ops_ctx_t *c = s->c;
    const ops_impl_t *x = c->impl;
    if (c->backend == OPS_CPU && s->ab == 4) {
        convert_parts(4, s->range_elems, parts, part_n, 0, n, dst);
        return 0;
    }
    /* a device's act of 2 bytes is bf16 (CUDA, ops.h); any other: the f32 path */
    size_t per = s->piece_bytes / s->ab;
    if (per == 0) return dl_seterr(DL_EINVAL, "%s: staging of %zu bytes", path, s->piece_bytes);
    for (int i = 0; i < 2 && s->ab == 2 && !s->failed; i++)
        if (!s->buf[i] && !(s->buf[i] = x->host_alloc(c, s->piece_bytes))) s->failed = 1;
    if (s->failed || s->ab != 2) return fill_f32(s, path, parts, part_n, n, dst);
    for (size_t i0 = 0; i0 < n; i0 += per) {
        size_t m = n - i0 < per ? n - i0 : per;
        void *buf = s->buf[s->cur];
        /* buf's last copy (two pieces ago) ended at the sync before the previous piece's */
        convert_parts(s->ab, s->range_elems, parts, part_n, i0, m, buf);
        x->sync(c);                     /* the other buffer's copy is done: */
        x->upload_async(c, (uint8_t *)dst + i0 * s->ab, buf, m * s->ab);
        s->cur ^= 1;                    /* it is filled next, while this one copies */
    }
    return 0;
}
