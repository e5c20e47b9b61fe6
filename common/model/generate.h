/* Decoding with a KV cache: greedy or temperature / top-p (nucleus) sampling, several
 * prompts at once, on any ops backend (the target's).
 *
 * Prefill packs prompt tokens up to the target's token budget per forward (a prompt
 * longer than the budget is prefilled in chunks through the cache); decoding then runs
 * one token per active sequence per forward. Logits of each sequence's last token are
 * brought to the host and sampled there:
 *   temperature <= 0: argmax (ties: lowest id);
 *   else p = softmax(logits / temperature), restricted to the smallest set of most
 *   likely tokens whose mass reaches top_p (Holtzman et al. 2020; as transformers'
 *   TopPLogitsWarper, the token crossing the threshold is kept), renormalised.
 * Each sequence has its own rng (rng_mix(seed, i, 0)), so a sequence's output does not
 * depend on what else is in the batch.
 */
#ifndef DL_MODEL_GENERATE_H
#define DL_MODEL_GENERATE_H

#include <stdint.h>

#include "common/base/rng.h"
#include "common/model/target.h"

#define GEN_MAX_STOP 16

typedef struct {
    int max_new_tokens;      /* >= 1 */
    float temperature;       /* <= 0: greedy */
    float top_p;             /* (0, 1]; 1 = no truncation */
    uint64_t seed;
    int n_stop;              /* stop ids (eos); the stop token is included in the output */
    int32_t stop_ids[GEN_MAX_STOP];
} gen_params_t;

/* Called for each generated token of sequence i, in order (may be NULL). */
typedef void (*gen_token_cb)(int i, int32_t id, void *user);

typedef struct {
    int prompt_tokens, new_tokens;
    double prefill_s, decode_s;      /* wall time of the two phases */
    int decode_steps;
} gen_stats_t;

typedef struct generator generator_t;

/* A generator for up to max_batch sequences of up to max_ctx tokens (prompt + new):
 * allocates the KV cache and logits buffers on the target's backend. The target is
 * borrowed. The target's max_seqs must be >= max_batch. */
int generator_new(target_t *t, int max_batch, int max_ctx, generator_t **out);
void generator_destroy(generator_t **g);

/* Default params: greedy, 256 new tokens, top_p 1, seed 0, stop ids = the model's eos. */
void gen_params_default(const target_t *t, gen_params_t *p);

/* Generates continuations of n prompts (n <= max_batch): prompts[i] host ids of
 * lens[i] >= 1 tokens. out[i] gets a malloc'd array of out_len[i] new ids (caller
 * frees). Stops a sequence at a stop id, max_new_tokens, or max_ctx. stats may be NULL.
 * Errors: DL_EINVAL (arguments), DL_ERANGE (prompt longer than max_ctx - 1, bad id). */
int generator_run(generator_t *g, const gen_params_t *p, int n, const int32_t *const *prompts,
                  const int *lens, int32_t **out, int *out_len, gen_token_cb cb, void *user,
                  gen_stats_t *stats);

/* Samples one id from logits (V) host f32 (modified: scaled in place) with params p
 * and rng r. Exposed for tests. scratch: V floats + V ints of host memory. */
int32_t gen_sample(float *logits, int V, float temperature, float top_p, rng_t *rng,
                   float *scratch_p, int32_t *scratch_idx);

#endif
