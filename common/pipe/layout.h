/* Layout of one micro-batch's hidden states inside an inbox slot, shared by the
 * writer (target_worker) and the reader (drafter_worker):
 *   [0, feat)            features (T, n_feat*D) act, row-major
 *   tokens_off           token ids (T) i32
 *   seq_lens_off         sequence lengths (n_seqs) i32
 *   loss_mask_off        loss mask (T) u8
 * every region starts at a 256-byte boundary (the inbox's alignment). */
#ifndef DL_PIPE_LAYOUT_H
#define DL_PIPE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t feat_bytes, tokens_off, seq_lens_off, loss_mask_off, bytes;
} pipe_layout_t;

static inline uint64_t pipe_align256(uint64_t x) { return (x + 255) / 256 * 256; }

/* T tokens, n_seqs sequences, row = n_feat*D elements of act_bytes each. */
static inline pipe_layout_t pipe_layout(uint64_t T, uint64_t n_seqs, uint64_t row, uint64_t act_bytes) {
    pipe_layout_t l;
    l.feat_bytes = T * row * act_bytes;
    l.tokens_off = pipe_align256(l.feat_bytes);
    l.seq_lens_off = pipe_align256(l.tokens_off + T * 4);
    l.loss_mask_off = pipe_align256(l.seq_lens_off + n_seqs * 4);
    l.bytes = pipe_align256(l.loss_mask_off + T);
    return l;
}

#endif
