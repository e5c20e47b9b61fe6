/* Speculative decoding with a DFlash drafter (Chen et al., arXiv 2602.06036,
 * sec. 3; public loop: z-lab/dflash spec_generate), on any ops backend, and the
 * evaluation around it (acceptance length tau, speedup over target-only decoding).
 *
 * One sequence at a time. With the accepted text x_0..x_{n-1} (prompt + output),
 * the target's KV cache holding positions [0, n-1) and the drafter's context
 * cache holding the target features of the same positions, one step is:
 *   1. draft:  the drafter's block [anchor = x_{n-1} at position n-1, MASK x (B-1)]
 *              sees the features of positions < n-1 and proposes d_1..d_{B-1} in
 *              ONE forward (drafter_infer_block);
 *   2. verify: the target runs [x_{n-1}, d_1..d_{B-1}] through its cache in ONE
 *              forward (target_forward_kv_feat), capturing the features of the B
 *              rows and the logits p_0..p_{B-1} (p_k predicts position n+k);
 *   3. accept: greedy: the longest prefix with d_k == argmax p_{k-1}; a tokens
 *              accepted, then the bonus token argmax p_a. Temperature T > 0: the
 *              standard rejection rule (Leviathan et al. 2023, alg. 1; Chen et al.
 *              2023, alg. 2): d_k ~ q_k = softmax(drafter logits / T) is accepted
 *              with probability min(1, p_k(d_k) / q_k(d_k)), p = softmax(target / T);
 *              the first rejection samples the bonus from norm(max(0, p - q)),
 *              full acceptance samples it from p_{B-1}. The output is then
 *              distributed exactly as target sampling at temperature T.
 *   4. roll:   the features of rows 0..a are appended to the drafter's context;
 *              the target's cache length becomes n + a (entries past it are
 *              overwritten by the next verify: the rollback); x grows by a + 1.
 * At temperature 0 the output equals target-only greedy decoding token for token
 * (up to the arithmetic of a B-row verify vs 1-row decode forward, which agree
 * except at exact logit ties).
 *
 * Statistics: tau = accepted / steps, where a step accepts a + 1 tokens (bonus
 * included; counted before truncation at EOS / max tokens); hist[a+1]; per-
 * position acceptance pos_accept[k] = steps whose draft token k was accepted.
 */
#ifndef DL_MODEL_SPECDEC_H
#define DL_MODEL_SPECDEC_H

#include <stdint.h>

#include "common/data/prompts.h"
#include "common/data/tokenizer.h"
#include "common/model/drafter.h"
#include "common/model/drafter_infer.h"
#include "common/model/generate.h"
#include "common/model/target.h"

#define SPECDEC_MAX_BLOCK DRAFTER_MAX_BLOCK
#define SPECDEC_MAX_REPEATS 64 /* specdec_eval_opts_t.timing_repeats */

typedef struct {
    int max_new_tokens;      /* >= 1 */
    float temperature;       /* <= 0: greedy */
    uint64_t seed;           /* sampling seed (temperature > 0) */
    int n_stop;              /* stop ids (eos); the stop token is included in the output */
    int32_t stop_ids[GEN_MAX_STOP];
} specdec_params_t;

typedef struct {
    int64_t prompt_tokens, new_tokens;   /* new_tokens includes the prefill's first token */
    int64_t steps;                       /* draft + verify steps */
    int64_t accepted;                    /* sum over steps of a + 1 */
    int64_t hist[SPECDEC_MAX_BLOCK + 1]; /* [m]: steps that accepted m = a + 1 tokens, 1..B */
    int64_t pos_accept[SPECDEC_MAX_BLOCK]; /* [k], 1..B-1: steps whose draft token k was accepted */
    double prefill_s, decode_s;          /* wall time; decode = all steps */
    double draft_s, verify_s;            /* parts of decode_s (host sampling in verify_s) */
} specdec_stats_t;

/* Adds b into a (sums; times too). */
void specdec_stats_add(specdec_stats_t *a, const specdec_stats_t *b);

/* Test hook: replaces the drafter's proposal. tokens[0..n) = prompt and output so
 * far (tokens[n-1] is the anchor); fill draft[1..B-1] (draft[0] is the anchor).
 * Return 0, or <0 to abort the run with that code. At temperature > 0 the hook's
 * proposal is treated as a one-hot q. */
typedef int (*specdec_propose_fn)(void *user, const int32_t *tokens, int n, int B, int32_t *draft);

typedef struct specdec specdec_t;

/* A speculative decoder for target t and drafter d (both borrowed, on the same
 * backend, d created with the target's embed/lm_head) for sequences of up to
 * max_ctx tokens (prompt + output). The target must capture exactly the
 * drafter's target_layer_ids in order (target_opts: n_capture, capture_ids),
 * have max_tokens >= B and shapes equal to the drafter's (D, V, heads).
 * Allocates a 1-slot KV cache of max_ctx + B rows and the drafter's context
 * cache. Errors: DL_EINVAL naming the mismatch, DL_ENOMEM. */
int specdec_new(target_t *t, drafter_t *d, int max_ctx, specdec_t **out);
void specdec_destroy(specdec_t **s);

/* Checks that drafter config dc fits target config tc (D, V, heads, layer ids
 * < L). 0 or DL_EINVAL naming the field. */
int specdec_check_compat(const drafter_config_t *dc, const model_config_t *tc);

void specdec_set_propose_hook(specdec_t *s, specdec_propose_fn fn, void *user);

/* Default params: greedy, 256 new tokens, seed 0, stop ids = the model's eos. */
void specdec_params_default(const target_t *t, specdec_params_t *p);

/* Decodes a continuation of prompt[len] (host ids, len >= 1). *out gets a
 * malloc'd array of *out_len new ids (caller frees); stops at a stop id,
 * max_new_tokens or the context capacity. st (may be NULL) is assigned.
 * Errors: DL_EINVAL, DL_ERANGE (prompt too long, bad id), backend errors. */
int specdec_run(specdec_t *s, const specdec_params_t *p, const int32_t *prompt, int len,
                int32_t **out, int *out_len, specdec_stats_t *st);

/* ---- evaluation --------------------------------------------------------- */

typedef struct {
    int max_new_tokens;      /* per prompt, default 256 */
    float temperature;       /* 0 = greedy */
    uint64_t seed;
    int baseline;            /* 1: also decode with the target alone (speed, greedy check) */
    int verbose;             /* 1: log one line per prompt */
    int timing_repeats;      /* >= 1 (0 = 1): each decode of a prompt runs this many times
                              * and its median decode time counts (see specdec_eval) */
    double max_seconds;      /* > 0: start no new prompt once this many seconds of
                              * evaluation have passed (at least one prompt runs); 0: off */
} specdec_eval_opts_t;

void specdec_eval_opts_default(specdec_eval_opts_t *o);

typedef struct {
    int n_prompts;
    specdec_stats_t spec;          /* summed over prompts */
    double tau;                    /* spec.accepted / spec.steps */
    double spec_tok_s;             /* decode tokens/s with the drafter (tokens after the first) */
    /* baseline (target only; zero when opts.baseline == 0) */
    int64_t base_new_tokens;
    double base_decode_s, base_tok_s;
    double speedup;                /* spec_tok_s / base_tok_s */
    int n_compared, n_matched;     /* greedy only: prompts whose outputs were identical */
    int first_mismatch_prompt;     /* -1 if none */
    int first_mismatch_pos;        /* token index of the first difference in that prompt */
    int timing_repeats;            /* the repeats used (>= 1) */
    int stopped_early;             /* 1: opts.max_seconds ended the run before all n prompts */
} specdec_eval_result_t;

/* Runs speculative decoding (and, with opts.baseline, target-only decoding) on
 * prompts[i] (host ids, lens[i]) for i < n. s's target and drafter are used as
 * they are. The two decodes of a prompt run back to back in alternating order
 * (drafter first on even i + repeat) so machine-load drift hits both.
 * Timing: with opts.timing_repeats R > 1 each of the two decodes of a prompt
 * runs R times (interleaved: spec, base, base, spec, ... alternating per
 * repeat); per prompt and per side the run with the median decode time (the
 * lower median for even R, an actual run) is the one counted: its stats
 * (tau counts, which are the same for every run at a fixed seed, and times)
 * go into res->spec, its decode seconds into res->base_decode_s. Tokens/s are
 * then sums of per-prompt medians, robust to a few slow outliers. Greedy check:
 * a prompt matches when every run of both sides produced the same tokens.
 * With opts.max_seconds > 0, no new prompt starts after that many seconds
 * (res->n_prompts < n and res->stopped_early = 1). res is assigned.
 * Errors as specdec_run / generator_run; DL_ENOMEM. */
int specdec_eval(specdec_t *s, const specdec_eval_opts_t *opts, int n,
                 const int32_t *const *prompts, const int *lens, specdec_eval_result_t *res);

/* Everything in one call, for training-time eval (`draftline run --eval-data`):
 * loads the target at target_path (device < 0: CPU with `threads` threads (0 =
 * default); else that CUDA device) capturing the checkpoint's
 * dflash_config.target_layer_ids, the drafter weights of ckpt_dir, the tokenizer
 * and chat template of the target, the first n prompts of prompts_path (first
 * user turn, chat template applied), and runs specdec_eval. Prompts longer than
 * 2048 tokens are skipped. Takes a few seconds to load the embedded model on
 * CPU; everything is freed before returning. res is assigned. */
int specdec_eval_checkpoint(const char *target_path, const char *ckpt_dir, const char *prompts_path,
                            int n, int device, int threads, const specdec_eval_opts_t *opts,
                            specdec_eval_result_t *res);

/* Appends res as a JSON object (no trailing newline) to a malloc'd string;
 * NULL on allocation failure. B sizes the histogram. */
char *specdec_result_json(const specdec_eval_result_t *res, int B);

#endif
