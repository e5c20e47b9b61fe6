/* Internal to the target's loading (common/model/target.c): safetensors tensors converted to
 * the backend's act dtype and uploaded, GBs at start-up. Several tensors of one size can be
 * filled end to end into one backend buffer (a Qwen3-MoE layer's E per-expert tensors into
 * its stacked (E, Fm, D) buffer), so per-tensor overheads do not count:
 *   CPU (act f32):        converted in place into the destination by all OpenMP threads;
 *   a device, act bf16:   converted into two pinned staging buffers of piece_bytes by all
 *                         OpenMP threads (ranges of range_elems, across tensor boundaries),
 *                         one upload_async per piece while the other buffer fills;
 *   no pinned memory:     converted to f32 a piece at a time, upload_act.
 * The bytes are always those of st_tensor_to_f32 then upload_act of each tensor (ops.h).
 * Not a public header; here (not in target.c) so a test can drive the staging with small
 * pieces on the CPU backend. */
#ifndef DL_MODEL_TARGET_STAGE_H
#define DL_MODEL_TARGET_STAGE_H

#include <stddef.h>

#include "common/format/safetensors.h"
#include "common/ops/ops.h"

/* Bytes of one staging buffer (two are pinned while a target loads) and elements per
 * thread's conversion range. */
#define TARGET_STAGE_BYTES ((size_t)64 << 20)
#define TARGET_CONVERT_ELEMS ((size_t)1 << 20)

typedef struct {
    const ops_ctx_t *c;
    size_t ab;               /* bytes of a destination element: 4 f32, 2 bf16 */
    size_t piece_bytes;      /* TARGET_STAGE_BYTES (tests: less) */
    size_t range_elems;      /* TARGET_CONVERT_ELEMS (tests: less) */
    void *buf[2];            /* host_alloc'd, piece_bytes each; NULL until the first device fill */
    int cur;                 /* the staging buffer filled next */
    int failed;              /* host_alloc failed: the f32 path */
    float *tmp;              /* host f32 scratch of the f32 path */
    size_t tmp_cap;          /* elements */
} target_stage_t;

/* A stage for backend c with act elements of ab bytes (ops_act_bytes(c); a test may give 2
 * on the CPU backend, where upload_async is a plain copy). Allocates nothing. */
void target_stage_init(target_stage_t *s, const ops_ctx_t *c, size_t ab);

/* dst (n_parts * nelem act elements on the backend) = parts[0], parts[1], ... end to end;
 * every part has the same number of elements (the caller checked the shapes). On a device
 * the copies may still run on return: dst is ready at the next sync of c (the next fill
 * or target_stage_release syncs before it reuses a staging buffer). path names the file in
 * errors. 0, DL_ENOTSUP (a dtype other than F32/F16/BF16, from safetensors, wrapped with
 * path), DL_EINVAL (parts of different sizes), DL_ENOMEM (host scratch). */
int target_stage_fill(target_stage_t *s, const char *path, const st_tensor_t *const *parts,
                      int n_parts, void *dst);

/* Waits for the last staged upload, frees the staging and the scratch; s can be filled
 * again (it allocates anew). */
void target_stage_release(target_stage_t *s);

#endif
