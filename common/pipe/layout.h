/* Layout of one micro-batch's hidden states inside an inbox slot, shared by the
 * writer (target_worker), the reader (drafter_worker) and the inbox sizing
 * (supervisor): the features (T, n_feat*D) act, row-major, at the slot's start,
 * and nothing else (token ids, sequence lengths and the loss mask travel inline in
 * hidden_states_ready, proto/PROTOCOL.md). A slot is rounded up to the inbox's
 * 256-byte alignment. */
#ifndef DL_PIPE_LAYOUT_H
#define DL_PIPE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t feat_bytes;       /* T * row * act_bytes */
    uint64_t bytes;            /* slot size: feat_bytes rounded up to 256 */
} pipe_layout_t;

static inline uint64_t pipe_align256(uint64_t x) { return (x + 255) / 256 * 256; }

/* T tokens, row = n_feat*D elements of act_bytes (2 bf16, 4 f32) each. */
static inline pipe_layout_t pipe_layout(uint64_t T, uint64_t row, uint64_t act_bytes) {
    pipe_layout_t l;
    l.feat_bytes = T * row * act_bytes;
    l.bytes = pipe_align256(l.feat_bytes);
    return l;
}

#endif
