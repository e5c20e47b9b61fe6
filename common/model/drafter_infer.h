/* DFlash drafter inference for speculative decoding: one block proposal per
 * call, with the context's keys/values cached per layer so each step only
 * projects the newly accepted tokens' target features (as the public DFlash
 * inference, z-lab/dflash model/dflash.py spec_generate, which keeps the
 * drafter's past_key_values and crops them to the accepted length).
 *
 * The math is drafter_forward's (drafter.h) for a single block: context rows
 * ctx = hidden_norm(fc(features)); in layer l their keys rope(k_norm(k_proj(ctx)))
 * at their own positions and values v_proj(ctx) are computed once and kept; a
 * block [anchor, MASK x (B-1)] at positions anchor_pos + k attends to the
 * cached context rows [0, anchor_pos) and bidirectionally to itself. The
 * drafter's weights are read through drafter.h's public tensor table (working
 * act weights), so a weight reload (dflash_ckpt_load_weights,
 * drafter_upload_master) is seen by the next call.
 *
 * Memory (all on the drafter's backend): per layer 2 x (cap, Hkv*hd) act for
 * the context cache, plus block scratch for B rows and append scratch for
 * `chunk` rows. Not thread-safe; one sequence per drafter_infer_t.
 */
#ifndef DL_MODEL_DRAFTER_INFER_H
#define DL_MODEL_DRAFTER_INFER_H

#include <stdint.h>

#include "common/model/drafter.h"

typedef struct drafter_infer drafter_infer_t;

/* Inference state for drafter d (borrowed; must outlive it) on backend c (the
 * one d was created on; borrowed) with room for cap context rows; embed,
 * lm_head (V, D) act on that backend are the target's frozen tables (borrowed).
 * chunk: rows projected per call inside drafter_infer_append (>= 1; larger
 * appends are split). Errors: DL_EINVAL, DL_ENOENT (a tensor missing from d's
 * table), DL_ENOMEM naming bytes. */
int drafter_infer_new(const ops_ctx_t *c, drafter_t *d, const void *embed, const void *lm_head,
                      int cap, int chunk, drafter_infer_t **out);
void drafter_infer_destroy(drafter_infer_t **di);

/* Context rows cached so far (positions 0..len-1). */
int drafter_infer_len(const drafter_infer_t *di);
/* Forgets the context (a new sequence). */
void drafter_infer_reset(drafter_infer_t *di);
/* Keeps only the first len cached rows (len <= current length), e.g. to drop
 * features of rejected tokens. DL_ERANGE otherwise. */
int drafter_infer_truncate(drafter_infer_t *di, int len);

/* Appends n context rows at positions len..len+n-1: feat (n, n_feat*D) act on
 * the backend, rows in position order, columns in target_layer_ids order (as
 * target_forward's capture), dense. DL_ERANGE when len + n > cap. */
int drafter_infer_append(drafter_infer_t *di, const void *feat, int n);

/* One block forward: row 0 is anchor_id at position anchor_pos, rows 1..B-1 the
 * mask token at anchor_pos + k; context = cached rows [0, anchor_pos)
 * (anchor_pos <= len). logits_host: (B-1, V) f32, row k-1 = logits of the token
 * at anchor_pos + k. DL_ERANGE (anchor_pos, id). Synchronous (downloads). */
int drafter_infer_block(drafter_infer_t *di, int32_t anchor_id, int anchor_pos, float *logits_host);

#endif
