/* Speculative decoding with a DFlash drafter, and its evaluation. See specdec.h. */
#include "common/model/specdec.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/rng.h"
#include "common/data/chat.h"
#include "common/model/dflash_ckpt.h"

/* Rows of target features projected per drafter_infer_append call. */
#define SPECDEC_APPEND_CHUNK 256
/* Prompts longer than this are skipped by specdec_eval_checkpoint. */
#define SPECDEC_EVAL_MAX_PROMPT 2048

struct specdec {
    target_t *t;
    drafter_t *d;
    const ops_ctx_t *c;
    drafter_infer_t *di;
    target_kv_t *kv;
    int B, V, D, n_feat, max_ctx, budget;
    void *d_feat;            /* (budget, n_feat*D) act */
    void *d_hidden;          /* (B, D) act */
    void *d_logits;          /* (B, V) act */
    float *h_logits;         /* (B, V) target logits */
    float *h_q;              /* (B-1, V) drafter logits */
    float *h_p, *h_qp;       /* (V) probabilities */
    float *scratch_p;        /* (V) */
    int32_t *scratch_idx;    /* (V) */
    int32_t *seq;            /* (max_ctx + B + 1) prompt + output */
    specdec_propose_fn hook;
    void *hook_user;
};

void specdec_stats_add(specdec_stats_t *a, const specdec_stats_t *b) {
    a->prompt_tokens += b->prompt_tokens;
    a->new_tokens += b->new_tokens;
    a->steps += b->steps;
    a->accepted += b->accepted;
    for (int i = 0; i <= SPECDEC_MAX_BLOCK; i++) a->hist[i] += b->hist[i];
    for (int i = 0; i < SPECDEC_MAX_BLOCK; i++) a->pos_accept[i] += b->pos_accept[i];
    a->prefill_s += b->prefill_s;
    a->decode_s += b->decode_s;
    a->draft_s += b->draft_s;
    a->verify_s += b->verify_s;
}

int specdec_check_compat(const drafter_config_t *dc, const model_config_t *tc) {
    if (dc->D != tc->D || dc->V != tc->V)
        return dl_seterr(DL_EINVAL, "drafter hidden size %d / vocab %d != target's %d / %d", dc->D,
                         dc->V, tc->D, tc->V);
    if (dc->H != tc->H || dc->Hkv != tc->Hkv || dc->hd != tc->hd)
        return dl_seterr(DL_EINVAL, "drafter heads %d/%d x %d != target's %d/%d x %d", dc->H,
                         dc->Hkv, dc->hd, tc->H, tc->Hkv, tc->hd);
    for (int i = 0; i < dc->n_feat; i++)
        if (dc->target_layer_ids[i] < 0 || dc->target_layer_ids[i] >= tc->L)
            return dl_seterr(DL_EINVAL, "drafter target_layer_ids[%d] = %d not in [0, %d) (target layers)",
                             i, dc->target_layer_ids[i], tc->L);
    return 0;
}

int specdec_new(target_t *t, drafter_t *d, int max_ctx, specdec_t **out) {
    *out = NULL;
    const drafter_config_t *dc = drafter_config(d);
    const model_config_t *tc = target_config(t);
    const target_opts_t *to = target_opts(t);
    DL_TRY(specdec_check_compat(dc, tc));
    if (to->n_capture != dc->n_feat)
        return dl_seterr(DL_EINVAL, "specdec: target captures %d layers, drafter reads %d",
                         to->n_capture, dc->n_feat);
    for (int i = 0; i < dc->n_feat; i++)
        if (to->capture_ids[i] != dc->target_layer_ids[i])
            return dl_seterr(DL_EINVAL, "specdec: target capture layer %d is %d, drafter's "
                             "target_layer_ids[%d] is %d", i, to->capture_ids[i], i,
                             dc->target_layer_ids[i]);
    if (to->max_tokens < dc->B)
        return dl_seterr(DL_EINVAL, "specdec: target token budget %d < block size %d",
                         to->max_tokens, dc->B);
    if (max_ctx < 2) return dl_seterr(DL_EINVAL, "specdec: max_ctx %d < 2", max_ctx);
    specdec_t *s = calloc(1, sizeof *s);
    if (!s) return dl_seterr(DL_ENOMEM, "specdec: out of memory");
    s->t = t;
    s->d = d;
    s->c = target_ops(t);
    s->B = dc->B;
    s->V = tc->V;
    s->D = tc->D;
    s->n_feat = dc->n_feat;
    s->max_ctx = max_ctx;
    s->budget = to->max_tokens;
    int rc = target_kv_new(t, 1, max_ctx + s->B, &s->kv);
    if (rc == 0)
        rc = drafter_infer_new(s->c, d, target_embed(t), target_lm_head(t), max_ctx + s->B,
                               SPECDEC_APPEND_CHUNK, &s->di);
    if (rc < 0) {
        specdec_destroy(&s);
        return rc;
    }
    const ops_impl_t *o = s->c->impl;
    size_t A = ops_act_bytes(s->c), V = (size_t)s->V, B = (size_t)s->B;
    s->d_feat = o->malloc_(s->c, (size_t)s->budget * s->n_feat * s->D * A);
    s->d_hidden = o->malloc_(s->c, B * s->D * A);
    s->d_logits = o->malloc_(s->c, B * V * A);
    s->h_logits = malloc(B * V * sizeof(float));
    s->h_q = malloc((B - 1) * V * sizeof(float));
    s->h_p = malloc(V * sizeof(float));
    s->h_qp = malloc(V * sizeof(float));
    s->scratch_p = malloc(V * sizeof(float));
    s->scratch_idx = malloc(V * sizeof(int32_t));
    s->seq = malloc(((size_t)max_ctx + B + 1) * sizeof(int32_t));
    if (!s->d_feat || !s->d_hidden || !s->d_logits || !s->h_logits || !s->h_q || !s->h_p ||
        !s->h_qp || !s->scratch_p || !s->scratch_idx || !s->seq) {
        specdec_destroy(&s);
        return dl_seterr(DL_ENOMEM, "specdec: out of memory (features %d x %d, logits %zu x %zu)",
                         to->max_tokens, dc->n_feat * tc->D, B, V);
    }
    *out = s;
    return 0;
}

void specdec_destroy(specdec_t **sp) {
    if (!sp || !*sp) return;
    specdec_t *s = *sp;
    drafter_infer_destroy(&s->di);
    target_kv_destroy(&s->kv);
    const ops_impl_t *o = s->c->impl;
    if (s->d_feat) o->free_(s->c, s->d_feat);
    if (s->d_hidden) o->free_(s->c, s->d_hidden);
    if (s->d_logits) o->free_(s->c, s->d_logits);
    free(s->h_logits);
    free(s->h_q);
    free(s->h_p);
    free(s->h_qp);
    free(s->scratch_p);
    free(s->scratch_idx);
    free(s->seq);
    free(s);
    *sp = NULL;
}

void specdec_set_propose_hook(specdec_t *s, specdec_propose_fn fn, void *user) {
    s->hook = fn;
    s->hook_user = user;
}

void specdec_params_default(const target_t *t, specdec_params_t *p) {
    memset(p, 0, sizeof *p);
    p->max_new_tokens = 256;
    const model_config_t *m = target_config(t);
    for (int i = 0; i < m->n_eos && p->n_stop < GEN_MAX_STOP; i++) p->stop_ids[p->n_stop++] = m->eos_ids[i];
}

/* ---- sampling helpers ---------------------------------------------------- */

static int32_t argmax(const float *x, int V) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;  /* ties: lowest id, as gen_sample */
    return best;
}

/* p (V) = softmax(logits / T). */
static void softmax_t(float *p, const float *logits, int V, float T) {
    float mx = logits[argmax(logits, V)];
    double sum = 0;
    for (int i = 0; i < V; i++) {
        p[i] = expf((logits[i] - mx) / T);
        sum += p[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < V; i++) p[i] *= inv;
}

/* Index drawn from weights w (V, >= 0, sum `sum` > 0). */
static int32_t draw(const float *w, int V, double sum, rng_t *r) {
    double u = rng_uniform(r) * sum, acc = 0;
    int32_t last = 0;
    for (int i = 0; i < V; i++) {
        if (w[i] <= 0) continue;
        acc += w[i];
        last = i;
        if (u < acc) return i;
    }
    return last;
}

static int is_stop(const specdec_params_t *p, int32_t id) {
    for (int i = 0; i < p->n_stop; i++)
        if (p->stop_ids[i] == id) return 1;
    return 0;
}

/* ---- decoding --------------------------------------------------------------- */

typedef struct {
    int32_t *out;
    int n_out, done;
} run_out_t;

/* Appends id to the output; marks done at a stop id, max tokens or the context end. */
static void emit(specdec_t *s, const specdec_params_t *p, int len, run_out_t *o, int32_t id) {
    o->out[o->n_out++] = id;
    s->seq[len + o->n_out - 1] = id;
    if (is_stop(p, id) || o->n_out >= p->max_new_tokens || len + o->n_out >= s->max_ctx + 1)
        o->done = 1;
}

int specdec_run(specdec_t *s, const specdec_params_t *p, const int32_t *prompt, int len,
                int32_t **out, int *out_len, specdec_stats_t *st_out) {
    *out = NULL;
    *out_len = 0;
    if (p->max_new_tokens < 1) return dl_seterr(DL_EINVAL, "specdec_run: max_new_tokens %d", p->max_new_tokens);
    if (len < 1 || len > s->max_ctx - 1)
        return dl_seterr(DL_ERANGE, "specdec_run: prompt has %d tokens (1..%d allowed)", len, s->max_ctx - 1);
    for (int j = 0; j < len; j++)
        if (prompt[j] < 0 || prompt[j] >= s->V)
            return dl_seterr(DL_ERANGE, "specdec_run: prompt token %d: id %d not in [0, %d)", j, prompt[j], s->V);
    const ops_ctx_t *c = s->c;
    const ops_impl_t *o = c->impl;
    const int B = s->B, V = s->V;
    const float T = p->temperature;
    specdec_stats_t st;
    memset(&st, 0, sizeof st);
    run_out_t ro = {malloc(((size_t)p->max_new_tokens + B) * sizeof(int32_t)), 0, 0};
    if (!ro.out) return dl_seterr(DL_ENOMEM, "specdec: out of memory");
    memcpy(s->seq, prompt, (size_t)len * sizeof(int32_t));
    rng_t rng;
    rng_seed(&rng, rng_mix(p->seed, 0, 0));
    drafter_infer_reset(s->di);
    int rc = 0;
    const int32_t slot = 0;
    double t0 = clock_mono_s();
    /* prefill: the prompt through the cache, features into the drafter's context */
    for (int done = 0; done < len;) {
        int k = len - done < s->budget ? len - done : s->budget;
        int32_t cu[2] = {0, k}, start = done;
        rc = target_forward_kv_feat(s->t, s->kv, &slot, &start, cu, 1, prompt + done, k, s->d_hidden,
                                    NULL, s->d_feat);
        if (rc == 0) rc = drafter_infer_append(s->di, s->d_feat, k);
        if (rc < 0) goto fail;
        done += k;
    }
    target_logits(s->t, s->d_logits, s->d_hidden, 1);
    o->download_act(c, s->h_logits, s->d_logits, (size_t)V);
    emit(s, p, len, &ro, T > 0 ? gen_sample(s->h_logits, V, T, 1.0f, &rng, s->scratch_p, s->scratch_idx)
                               : argmax(s->h_logits, V));
    double t1 = clock_mono_s();
    st.prompt_tokens = len;
    st.prefill_s = t1 - t0;
    /* decode: draft a block, verify it, accept a prefix plus the bonus token */
    int32_t draft[SPECDEC_MAX_BLOCK];
    while (!ro.done) {
        int n_cache = len + ro.n_out - 1;  /* cached positions; the anchor sits at n_cache */
        int32_t anchor = s->seq[n_cache];
        double ta = clock_mono_s();
        draft[0] = anchor;
        if (s->hook) {
            if ((rc = s->hook(s->hook_user, s->seq, n_cache + 1, B, draft)) < 0) goto fail;
            for (int k = 1; k < B; k++)
                if (draft[k] < 0 || draft[k] >= V) {
                    rc = dl_seterr(DL_ERANGE, "specdec: hook proposed id %d at %d", draft[k], k);
                    goto fail;
                }
        } else {
            if ((rc = drafter_infer_block(s->di, anchor, n_cache, s->h_q)) < 0) goto fail;
            for (int k = 1; k < B; k++) {
                const float *q = s->h_q + (size_t)(k - 1) * V;
                if (T > 0) {
                    softmax_t(s->h_qp, q, V, T);
                    draft[k] = draw(s->h_qp, V, 1.0, &rng);
                } else {
                    draft[k] = argmax(q, V);
                }
            }
        }
        double tb = clock_mono_s();
        int32_t cu[2] = {0, B}, start = n_cache;
        if ((rc = target_forward_kv_feat(s->t, s->kv, &slot, &start, cu, 1, draft, B, NULL,
                                         s->d_hidden, s->d_feat)) < 0)
            goto fail;
        target_logits(s->t, s->d_logits, s->d_hidden, B);
        o->download_act(c, s->h_logits, s->d_logits, (size_t)B * V);
        int a = 0;
        int32_t bonus = -1;
        if (!(T > 0)) {
            while (a < B - 1 && draft[a + 1] == argmax(s->h_logits + (size_t)a * V, V)) a++;
            bonus = argmax(s->h_logits + (size_t)a * V, V);
        } else {
            for (; a < B - 1; a++) {
                int32_t x = draft[a + 1];
                softmax_t(s->h_p, s->h_logits + (size_t)a * V, V, T);
                if (s->hook) {
                    memset(s->h_qp, 0, (size_t)V * sizeof(float));
                    s->h_qp[x] = 1.0f;
                } else {
                    softmax_t(s->h_qp, s->h_q + (size_t)a * V, V, T);
                }
                double ratio = s->h_qp[x] > 0 ? (double)s->h_p[x] / s->h_qp[x] : 0.0;
                if (rng_uniform(&rng) < ratio) continue; /* accepted (ratio >= 1 always) */
                /* rejected: bonus from norm(max(0, p - q)) */
                double sum = 0;
                for (int i = 0; i < V; i++) {
                    float r = s->h_p[i] - s->h_qp[i];
                    s->h_qp[i] = r > 0 ? r : 0;
                    sum += s->h_qp[i];
                }
                bonus = sum > 0 ? draw(s->h_qp, V, sum, &rng) : draw(s->h_p, V, 1.0, &rng);
                break;
            }
            if (bonus < 0) {
                softmax_t(s->h_p, s->h_logits + (size_t)(B - 1) * V, V, T);
                bonus = draw(s->h_p, V, 1.0, &rng);
            }
        }
        st.steps++;
        st.accepted += a + 1;
        st.hist[a + 1]++;
        for (int k = 1; k <= a; k++) st.pos_accept[k]++;
        for (int k = 1; k <= a && !ro.done; k++) emit(s, p, len, &ro, draft[k]);
        if (!ro.done) emit(s, p, len, &ro, bonus);
        double tc = clock_mono_s();
        st.verify_s += tc - tb;
        /* the features of the anchor and the a accepted drafts join the drafter's context */
        if (!ro.done && (rc = drafter_infer_append(s->di, s->d_feat, a + 1)) < 0) goto fail;
        st.draft_s += (tb - ta) + (clock_mono_s() - tc);
    }
    st.decode_s = clock_mono_s() - t1;
    st.new_tokens = ro.n_out;
    *out = ro.out;
    *out_len = ro.n_out;
    if (st_out) *st_out = st;
    return 0;
fail:
    free(ro.out);
    return rc;
}

/* ---- evaluation --------------------------------------------------------------- */

void specdec_eval_opts_default(specdec_eval_opts_t *o) {
    memset(o, 0, sizeof *o);
    o->max_new_tokens = 256;
    o->baseline = 1;
}

/* Index of the lower median of v[0..n) (n <= SPECDEC_MAX_REPEATS), an actual element. */
static int median_index(const double *v, int n) {
    int idx[SPECDEC_MAX_REPEATS];
    for (int i = 0; i < n; i++) idx[i] = i;
    for (int i = 1; i < n; i++) /* insertion sort by value, ties by index: n is small */
        for (int j = i; j > 0 && v[idx[j - 1]] > v[idx[j]]; j--) {
            int tmp = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = tmp;
        }
    return idx[(n - 1) / 2];
}

int specdec_eval(specdec_t *s, const specdec_eval_opts_t *opts, int n, const int32_t *const *prompts,
                 const int *lens, specdec_eval_result_t *res) {
    memset(res, 0, sizeof *res);
    res->first_mismatch_prompt = -1;
    res->first_mismatch_pos = -1;
    if (n < 1) return dl_seterr(DL_EINVAL, "specdec_eval: no prompts");
    int R = opts->timing_repeats > 0 ? opts->timing_repeats : 1;
    if (R > SPECDEC_MAX_REPEATS)
        return dl_seterr(DL_EINVAL, "specdec_eval: timing_repeats %d > %d", R, SPECDEC_MAX_REPEATS);
    res->timing_repeats = R;
    generator_t *g = NULL;
    if (opts->baseline) DL_TRY(generator_new(s->t, 1, s->max_ctx, &g));
    specdec_params_t sp;
    specdec_params_default(s->t, &sp);
    sp.max_new_tokens = opts->max_new_tokens;
    sp.temperature = opts->temperature;
    gen_params_t gp;
    gen_params_default(s->t, &gp);
    gp.max_new_tokens = opts->max_new_tokens;
    gp.temperature = opts->temperature;
    gp.top_p = 1.0f;
    int rc = 0;
    double t_start = clock_mono_s();
    specdec_stats_t sts[SPECDEC_MAX_REPEATS];
    double sd[SPECDEC_MAX_REPEATS], bd[SPECDEC_MAX_REPEATS];
    for (int i = 0; i < n; i++) {
        if (opts->max_seconds > 0 && i > 0 && clock_mono_s() - t_start >= opts->max_seconds) {
            res->stopped_early = 1;
            log_info("specdec_eval: --max-seconds %g reached after %d of %d prompts", opts->max_seconds, i, n);
            break;
        }
        sp.seed = rng_mix(opts->seed, (uint64_t)i, 1);
        gp.seed = sp.seed;
        int32_t *so = NULL, *bo = NULL;
        int sl = 0, bl = 0, rep_differs = 0;
        /* the two decodes of a prompt run back to back, in alternating order
         * (drafter first on even prompt + repeat, target-only first on odd),
         * so a slow phase of a shared machine or a warm-cache effect falls on
         * both sides rather than on one */
        for (int rep = 0; rep < R && rc == 0; rep++) {
            for (int pass = 0; pass < 2 && rc == 0; pass++) {
                int spec_now = (pass == 0) == !((i + rep) & 1);
                int32_t *o = NULL;
                int ol = 0;
                if (spec_now) {
                    rc = specdec_run(s, &sp, prompts[i], lens[i], &o, &ol, &sts[rep]);
                    sd[rep] = sts[rep].decode_s;
                } else if (g) {
                    gen_stats_t gs = {0};
                    rc = generator_run(g, &gp, 1, &prompts[i], &lens[i], &o, &ol, NULL, NULL, &gs);
                    bd[rep] = gs.decode_s;
                } else {
                    continue;
                }
                if (rc < 0) { free(o); break; }
                int32_t **keep = spec_now ? &so : &bo;
                int *keep_len = spec_now ? &sl : &bl;
                if (rep == 0) {
                    *keep = o;
                    *keep_len = ol;
                } else {
                    if (ol != *keep_len || memcmp(o, *keep, (size_t)ol * sizeof(int32_t))) rep_differs = 1;
                    free(o);
                }
            }
        }
        if (rc < 0) {
            free(so);
            free(bo);
            break;
        }
        int ms = median_index(sd, R);
        specdec_stats_add(&res->spec, &sts[ms]);
        if (rep_differs && !(opts->temperature > 0))
            log_warn("prompt %d: the %d repeated greedy decodes did not all give the same tokens", i, R);
        if (g) {
            res->base_new_tokens += bl;
            res->base_decode_s += bd[median_index(bd, R)];
            if (!(opts->temperature > 0)) {
                res->n_compared++;
                int same = !rep_differs && sl == bl && !memcmp(so, bo, (size_t)sl * sizeof(int32_t));
                res->n_matched += same;
                if (!same && res->first_mismatch_prompt < 0) {
                    int j = 0;
                    while (j < sl && j < bl && so[j] == bo[j]) j++;
                    res->first_mismatch_prompt = i;
                    res->first_mismatch_pos = j;
                }
            }
        }
        if (opts->verbose)
            log_info("prompt %d: %d prompt tokens, %d new tokens, %lld steps, tau %.2f%s", i, lens[i],
                     sl, (long long)sts[ms].steps, sts[ms].steps ? (double)sts[ms].accepted / sts[ms].steps : 0.0,
                     g && !(opts->temperature > 0)
                         ? (!rep_differs && sl == bl && !memcmp(so, bo, (size_t)sl * 4) ? ", = target-only"
                                                                                     : ", DIFFERS from target-only")
                         : "");
        free(so);
        free(bo);
        res->n_prompts++;
    }
    generator_destroy(&g);
    if (rc < 0) return rc;
    const specdec_stats_t *t = &res->spec;
    res->tau = t->steps ? (double)t->accepted / t->steps : 0;
    /* decode tokens/s counts the tokens after the prefill's first one, for both */
    res->spec_tok_s = t->decode_s > 0 ? (t->new_tokens - res->n_prompts) / t->decode_s : 0;
    res->base_tok_s = res->base_decode_s > 0 ? (res->base_new_tokens - res->n_prompts) / res->base_decode_s : 0;
    res->speedup = res->base_tok_s > 0 ? res->spec_tok_s / res->base_tok_s : 0;
    return 0;
}

int specdec_eval_checkpoint(const char *target_path, const char *ckpt_dir, const char *prompts_path,
                            int n, int device, int threads, const specdec_eval_opts_t *opts,
                            specdec_eval_result_t *res) {
    memset(res, 0, sizeof *res);
    drafter_config_t dc;
    DL_TRY(dflash_config_load(ckpt_dir, &dc));
    ops_ctx_t ops;
    if (device >= 0) DL_TRY(ops_cuda_init(&ops, device));
    else ops_cpu_init(&ops, threads);
    target_t *t = NULL;
    drafter_t *d = NULL;
    specdec_t *s = NULL;
    tok_t *tok = NULL;
    prompt_set_t ps = {0};
    tok_ids_t *ids = NULL;
    const int32_t **pp = NULL;
    int *pl = NULL, np = 0, max_len = 0, rc;
    target_opts_t to = {.max_tokens = SPECDEC_EVAL_MAX_PROMPT, .max_seqs = 1, .n_capture = dc.n_feat};
    memcpy(to.capture_ids, dc.target_layer_ids, (size_t)dc.n_feat * sizeof(int));
    if ((rc = target_load(target_path, &ops, &to, &t)) < 0) goto done;
    if ((rc = specdec_check_compat(&dc, target_config(t))) < 0) goto done;
    dc.loss_chunk_blocks = 1;  /* inference: no training-sized logits buffer */
    if ((rc = drafter_new(&ops, &dc, target_embed(t), target_lm_head(t), 1, 1, 0, &d)) < 0) goto done;
    if ((rc = dflash_ckpt_load_weights(d, ckpt_dir)) < 0) goto done;
    if ((rc = tok_load(target_path, &tok)) < 0) goto done;
    chat_template_t ct;
    if ((rc = chat_template_from_tok(tok, &ct)) < 0) goto done;
    if ((rc = prompt_set_load(prompts_path, n, &ps)) < 0) goto done;
    ids = calloc((size_t)ps.n, sizeof *ids);
    pp = calloc((size_t)ps.n, sizeof *pp);
    pl = calloc((size_t)ps.n, sizeof *pl);
    if (!ids || !pp || !pl) { rc = dl_seterr(DL_ENOMEM, "specdec_eval_checkpoint: out of memory"); goto done; }
    for (int i = 0; i < ps.n; i++) {
        if ((rc = prompt_encode(&ps.items[i], 1, NULL, &ct, tok, &ids[i])) < 0) goto done;
        if ((int)ids[i].n > SPECDEC_EVAL_MAX_PROMPT) continue;
        pp[np] = ids[i].ids;
        pl[np] = (int)ids[i].n;
        if (pl[np] > max_len) max_len = pl[np];
        np++;
    }
    if (!np) { rc = dl_seterr(DL_EINVAL, "%s: every prompt is longer than %d tokens", prompts_path, SPECDEC_EVAL_MAX_PROMPT); goto done; }
    if ((rc = specdec_new(t, d, max_len + opts->max_new_tokens + 1, &s)) < 0) goto done;
    rc = specdec_eval(s, opts, np, pp, pl, res);
done:
    if (ids)
        for (int i = 0; i < ps.n; i++) tok_ids_free(&ids[i]);
    free(ids);
    free(pp);
    free(pl);
    prompt_set_free(&ps);
    specdec_destroy(&s);
    drafter_destroy(&d);
    target_destroy(&t);
    tok_destroy(&tok);
    ops_ctx_destroy(&ops);
    return rc;
}

char *specdec_result_json(const specdec_eval_result_t *r, int B) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    const specdec_stats_t *t = &r->spec;
    cJSON_AddNumberToObject(o, "prompts", r->n_prompts);
    cJSON_AddNumberToObject(o, "block_size", B);
    cJSON_AddNumberToObject(o, "tau", r->tau);
    cJSON_AddNumberToObject(o, "steps", (double)t->steps);
    cJSON_AddNumberToObject(o, "accepted", (double)t->accepted);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)t->prompt_tokens);
    cJSON_AddNumberToObject(o, "new_tokens", (double)t->new_tokens);
    cJSON *h = cJSON_AddArrayToObject(o, "accept_len_hist");  /* [m-1] = steps accepting m tokens */
    for (int m = 1; m <= B; m++) cJSON_AddItemToArray(h, cJSON_CreateNumber((double)t->hist[m]));
    cJSON *pa = cJSON_AddArrayToObject(o, "pos_accept_rate");  /* [k-1] = P(draft token k accepted) */
    cJSON *pc = cJSON_AddArrayToObject(o, "pos_accept_cond"); /* [k-1] = P(k accepted | k-1 accepted) */
    for (int k = 1; k < B; k++) {
        double prev = k == 1 ? (double)t->steps : (double)t->pos_accept[k - 1];
        cJSON_AddItemToArray(pa, cJSON_CreateNumber(t->steps ? (double)t->pos_accept[k] / t->steps : 0));
        cJSON_AddItemToArray(pc, cJSON_CreateNumber(prev > 0 ? t->pos_accept[k] / prev : 0));
    }
    cJSON_AddNumberToObject(o, "prefill_s", t->prefill_s);
    cJSON_AddNumberToObject(o, "decode_s", t->decode_s);
    cJSON_AddNumberToObject(o, "draft_s", t->draft_s);
    cJSON_AddNumberToObject(o, "verify_s", t->verify_s);
    cJSON_AddNumberToObject(o, "spec_decode_tok_s", r->spec_tok_s);
    cJSON_AddNumberToObject(o, "base_new_tokens", (double)r->base_new_tokens);
    cJSON_AddNumberToObject(o, "base_decode_s", r->base_decode_s);
    cJSON_AddNumberToObject(o, "base_decode_tok_s", r->base_tok_s);
    cJSON_AddNumberToObject(o, "speedup", r->speedup);
    cJSON_AddNumberToObject(o, "greedy_compared", r->n_compared);
    cJSON_AddNumberToObject(o, "greedy_matched", r->n_matched);
    cJSON_AddNumberToObject(o, "first_mismatch_prompt", r->first_mismatch_prompt);
    cJSON_AddNumberToObject(o, "first_mismatch_pos", r->first_mismatch_pos);
    cJSON_AddNumberToObject(o, "timing_repeats", r->timing_repeats);
    cJSON_AddBoolToObject(o, "stopped_early", r->stopped_early);
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return txt;
}
