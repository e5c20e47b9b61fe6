/* Token-budget batching over a prepared cache.
 *
 * A micro-batch is a list of sequences (each a slice of one sample) whose
 * lengths sum to at most token_budget tokens; sequences are packed back to back
 * (varlen, cu_seqlens), never padded.
 *
 * Determinism: micro-batch `mb` is a pure function of (cache, opts, mb). Per
 * epoch e the plan is built from rng_mix(seed, e, 0):
 *   1. every sample becomes one sequence, or with split_long several of at most
 *      max_len tokens (else truncated to max_len); samples of < 2 tokens are
 *      dropped (nothing to predict);
 *   2. the sequences are shuffled (Fisher-Yates);
 *   3. the shuffled list is cut into windows of shuffle_buffer sequences; each
 *      window is packed by striped first-fit decreasing: M = ceil(window tokens /
 *      token_budget) micro-batches are opened, the sequences go longest first,
 *      round-robin, to the next micro-batch with room (a new one when none has),
 *      so every micro-batch holds a share of every length band (long and short
 *      mixed; mean fill ~98% of the budget on log-uniform lengths);
 *   4. the epoch's micro-batches are shuffled.
 * Micro-batch numbers run on across epochs: mb -> (epoch, index in epoch) via the
 * epochs' cumulative counts. step = mb / micro_batches_per_step.
 * Cost: O(samples log window) per epoch plan (plus the first-fit scans); the plan of the last epoch used is
 * kept (so sequential access is O(1) per micro-batch).
 *
 * Thread safety: a batcher_t caches plans; use one per thread.
 */
#ifndef DL_DATA_BATCHER_H
#define DL_DATA_BATCHER_H

#include <stddef.h>
#include <stdint.h>

#include "common/data/prepare.h"

/* Default token budgets per micro-batch. GPU: fills an H100/H200 for a 1-8B
 * target. CPU: small enough that the fp32 reference target (SmolLM2-135M) runs
 * a micro-batch in seconds on a few cores. */
#define BATCHER_TOKEN_BUDGET_GPU 65536u
#define BATCHER_TOKEN_BUDGET_CPU 2048u
#define BATCHER_SHUFFLE_BUFFER_DEFAULT 4096u

typedef struct {
    uint64_t seed;
    uint32_t token_budget;           /* max tokens per micro-batch (>= max_len) */
    uint32_t max_len;                /* max tokens per sequence; 0 = token_budget */
    int split_long;                  /* 1: split longer samples into max_len pieces; 0: truncate */
    uint32_t shuffle_buffer;         /* sequences per mixing window; 0 = default */
    uint32_t micro_batches_per_step; /* >= 1 */
    uint32_t epochs;                 /* 0 = unbounded */
} batcher_opts_t;

/* Fills defaults (seed 0, CPU budget, max_len = budget, truncate, default
 * window, 1 micro-batch per step, 1 epoch). */
void batcher_opts_default(batcher_opts_t *o, int gpu);

typedef struct {
    uint64_t sample;   /* index in the cache */
    uint32_t start;    /* first token within the sample */
    uint32_t len;      /* tokens */
} batcher_seq_t;

typedef struct {
    uint64_t mb;        /* global micro-batch number */
    uint64_t step;      /* mb / micro_batches_per_step */
    uint32_t epoch;
    uint32_t n_seqs;
    uint32_t n_tokens;  /* sum of seqs[].len, <= token_budget */
    const batcher_seq_t *seqs; /* (n_seqs), owned by the batcher, valid until the next
                                  batcher call */
} batcher_mb_t;

typedef struct batcher batcher_t;

/* cache must outlive the batcher. DL_EINVAL on bad opts (naming the field),
 * DL_EINVAL if the cache has no usable sample. */
int batcher_new(const dlc_t *cache, const batcher_opts_t *opts, batcher_t **out);
void batcher_destroy(batcher_t **b);

/* Micro-batch mb (pure function of cache, opts, mb). Returns 0, or DL_ENOENT
 * when mb is past the last epoch. */
int batcher_get(batcher_t *b, uint64_t mb, batcher_mb_t *out);

/* Micro-batches in epoch e (builds that epoch's plan if needed). */
uint64_t batcher_epoch_mbs(batcher_t *b, uint32_t epoch);
/* Total micro-batches (0 when epochs is unbounded). */
uint64_t batcher_total_mbs(batcher_t *b);

/* Packs micro-batch m into caller buffers (each sized >= token_budget, cu_seqlens
 * >= n_seqs + 1): ids (n_tokens) int32, mask (n_tokens) uint8, pos (n_tokens)
 * int32 position within its sequence (0-based, restarting per sequence),
 * cu_seqlens (n_seqs+1) int32 prefix sums. Any output may be NULL. */
int batcher_pack(const batcher_t *b, const batcher_mb_t *m, int32_t *ids, uint8_t *mask,
                 int32_t *pos, int32_t *cu_seqlens);

/* --- cursor ------------------------------------------------------------------ */

/* The loader's position: the next micro-batch to hand out, plus what it is
 * valid for. Serialized as 40 bytes little-endian (batcher_cursor_encode). */
typedef struct {
    uint64_t next_mb;
    uint64_t seed;
    uint64_t data_fingerprint; /* tok fingerprint ^ n_samples ^ n_tokens of the cache */
    uint64_t opts_hash;        /* hash of the packing options */
} batcher_cursor_t;

#define BATCHER_CURSOR_BYTES 40

/* The cursor for next_mb under this batcher's cache and options. */
void batcher_cursor(const batcher_t *b, uint64_t next_mb, batcher_cursor_t *c);
/* Next micro-batch from the internal cursor (starts at 0); advances it.
 * DL_ENOENT at the end. */
int batcher_next(batcher_t *b, batcher_mb_t *out);
/* Internal cursor get/set. batcher_restore validates that c was made for the
 * same cache and options (DL_EINVAL naming the mismatch). */
uint64_t batcher_tell(const batcher_t *b);
int batcher_restore(batcher_t *b, const batcher_cursor_t *c);
void batcher_cursor_encode(const batcher_cursor_t *c, uint8_t out[BATCHER_CURSOR_BYTES]);
int batcher_cursor_decode(const uint8_t *in, size_t len, batcher_cursor_t *c);

#endif
