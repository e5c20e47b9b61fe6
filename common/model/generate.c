/* KV-cache decoding. See generate.h. */
#include "common/model/generate.h"

#include "common/base/clock.h"
#include "common/base/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct generator {
    target_t *t;
    const ops_ctx_t *c;
    int max_batch, max_ctx, V, budget;
    target_kv_t *kv;
    void *d_hidden;                  /* (max_seqs, D) act */
    void *d_logits;                  /* (max_seqs, V) act */
    float *h_logits;                 /* (max_seqs, V) */
    float *scratch_p;                /* (V) */
    int32_t *scratch_idx;            /* (V) */
    /* per call batch assembly (host) */
    int32_t *b_slot, *b_start, *b_cu, *b_ids;
};

void gen_params_default(const target_t *t, gen_params_t *p) {
    memset(p, 0, sizeof *p);
    p->max_new_tokens = 256;
    p->temperature = 0;
    p->top_p = 1;
    const model_config_t *m = target_config(t);
    for (int i = 0; i < m->n_eos && p->n_stop < GEN_MAX_STOP; i++) p->stop_ids[p->n_stop++] = m->eos_ids[i];
}

int generator_new(target_t *t, int max_batch, int max_ctx, generator_t **out) {
    *out = NULL;
    const target_opts_t *o = target_opts(t);
    if (max_batch < 1 || max_ctx < 2 || max_batch > o->max_seqs)
        return dl_seterr(DL_EINVAL, "generator_new: max_batch %d (target max_seqs %d), max_ctx %d",
                         max_batch, o->max_seqs, max_ctx);
    if (max_batch > o->max_tokens)
        return dl_seterr(DL_EINVAL, "generator_new: max_batch %d > target token budget %d", max_batch,
                         o->max_tokens);
    generator_t *g = calloc(1, sizeof *g);
    if (!g) return dl_seterr(DL_ENOMEM, "generator: out of memory");
    const model_config_t *m = target_config(t);
    g->t = t;
    g->max_batch = max_batch;
    g->max_ctx = max_ctx;
    g->V = m->V;
    g->budget = o->max_tokens;
    int rc = target_kv_new(t, max_batch, max_ctx, &g->kv);
    if (rc < 0) { free(g); return rc; }
    g->c = target_ops(t);
    size_t ab = ops_act_bytes(g->c), ns = (size_t)o->max_seqs;
    g->d_hidden = g->c->impl->malloc_(g->c, ns * m->D * ab);
    g->d_logits = g->c->impl->malloc_(g->c, ns * m->V * ab);
    g->h_logits = malloc(ns * m->V * sizeof(float));
    g->scratch_p = malloc((size_t)m->V * sizeof(float));
    g->scratch_idx = malloc((size_t)m->V * sizeof(int32_t));
    g->b_slot = malloc(ns * 4);
    g->b_start = malloc(ns * 4);
    g->b_cu = malloc((ns + 1) * 4);
    g->b_ids = malloc((size_t)o->max_tokens * 4);
    if (!g->d_hidden || !g->d_logits || !g->h_logits || !g->scratch_p || !g->scratch_idx ||
        !g->b_slot || !g->b_start || !g->b_cu || !g->b_ids) {
        generator_destroy(&g);
        return dl_seterr(DL_ENOMEM, "generator: out of memory (logits %zu x %d)", ns, m->V);
    }
    *out = g;
    return 0;
}

void generator_destroy(generator_t **gp) {
    if (!gp || !*gp) return;
    generator_t *g = *gp;
    target_kv_destroy(&g->kv);
    if (g->c) {
        if (g->d_hidden) g->c->impl->free_(g->c, g->d_hidden);
        if (g->d_logits) g->c->impl->free_(g->c, g->d_logits);
    }
    free(g->h_logits);
    free(g->scratch_p);
    free(g->scratch_idx);
    free(g->b_slot);
    free(g->b_start);
    free(g->b_cu);
    free(g->b_ids);
    free(g);
    *gp = NULL;
}

static int cmp_desc(const void *a, const void *b, void *key) {
    const float *k = key;
    float x = k[*(const int32_t *)a], y = k[*(const int32_t *)b];
    if (x > y) return -1;
    if (x < y) return 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

int32_t gen_sample(float *logits, int V, float temperature, float top_p, rng_t *r, float *p,
                   int32_t *idx) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (!(temperature > 0)) return best;
    double sum = 0;
    float mx = logits[best];
    for (int i = 0; i < V; i++) {
        p[i] = expf((logits[i] - mx) / temperature);
        sum += p[i];
    }
    for (int i = 0; i < V; i++) p[i] = (float)(p[i] / sum);
    int n = V;
    if (top_p < 1.0f) {
        /* Only tokens with p >= tau can be in the nucleus once the mass of {p >= tau}
         * reaches top_p (the nucleus takes tokens in decreasing p), so sort just those;
         * lower tau until that holds (tau = 0 takes everything). */
        float tau = p[best] * 1e-3f;
        for (;;) {
            double mass = 0;
            n = 0;
            for (int i = 0; i < V; i++)
                if (p[i] >= tau) { idx[n++] = i; mass += p[i]; }
            if (mass >= top_p || tau == 0.0f) break;
            tau = tau > 1e-30f ? tau * 1e-3f : 0.0f;
        }
        qsort_r(idx, (size_t)n, sizeof *idx, cmp_desc, p);
        double cum = 0;
        int k = 0;
        while (k < n) {
            cum += p[idx[k]];
            k++;
            if (cum >= top_p) break;
        }
        n = k;
        double u = rng_uniform(r) * cum, acc = 0;
        for (int i = 0; i < n; i++) {
            acc += p[idx[i]];
            if (u < acc) return idx[i];
        }
        return idx[n - 1];
    }
    double u = rng_uniform(r), acc = 0;
    for (int i = 0; i < V; i++) {
        acc += p[i];
        if (u < acc) return i;
    }
    return best;
}

/* Runs one forward over the assembled batch and brings the last-token logits of each
 * of its nseq sequences to the host. */
static int step(generator_t *g, int nseq, int T) {
    DL_TRY(target_forward_kv(g->t, g->kv, g->b_slot, g->b_start, g->b_cu, nseq, g->b_ids, T,
                             g->d_hidden, NULL));
    target_logits(g->t, g->d_logits, g->d_hidden, nseq);
    g->c->impl->download_act(g->c, g->h_logits, g->d_logits, (size_t)nseq * g->V);
    return 0;
}

typedef struct {
    int len;          /* tokens in the cache (after the forward that consumes `next`) */
    int prefilled;    /* prompt tokens in the cache */
    int32_t next;     /* token to feed next (decode) */
    int done;
    int32_t *out;
    int n_out;
    rng_t rng;
} seq_t;

static int is_stop(const gen_params_t *p, int32_t id) {
    for (int i = 0; i < p->n_stop; i++)
        if (p->stop_ids[i] == id) return 1;
    return 0;
}

/* Records token id for sequence i; marks it done when it must stop. */
static void emit(const gen_params_t *p, seq_t *s, int i, int32_t id, int max_ctx, gen_token_cb cb,
                 void *user) {
    s->out[s->n_out++] = id;
    s->next = id;
    if (cb) cb(i, id, user);
    if (is_stop(p, id) || s->n_out >= p->max_new_tokens || s->len + 1 > max_ctx) s->done = 1;
}

int generator_run(generator_t *g, const gen_params_t *p, int n, const int32_t *const *prompts,
                  const int *lens, int32_t **out, int *out_len, gen_token_cb cb, void *user,
                  gen_stats_t *stats) {
    if (n < 1 || n > g->max_batch || p->max_new_tokens < 1 || !(p->top_p > 0 && p->top_p <= 1))
        return dl_seterr(DL_EINVAL, "generator_run: n %d (max %d), max_new_tokens %d, top_p %g", n,
                         g->max_batch, p->max_new_tokens, p->top_p);
    for (int i = 0; i < n; i++) {
        if (lens[i] < 1 || lens[i] > g->max_ctx - 1)
            return dl_seterr(DL_ERANGE, "generator_run: prompt %d has %d tokens (1..%d allowed)", i,
                             lens[i], g->max_ctx - 1);
        for (int j = 0; j < lens[i]; j++)
            if (prompts[i][j] < 0 || prompts[i][j] >= g->V)
                return dl_seterr(DL_ERANGE, "generator_run: prompt %d token %d: id %d not in [0, %d)",
                                 i, j, prompts[i][j], g->V);
    }
    seq_t *sq = calloc((size_t)n, sizeof *sq);
    if (!sq) return dl_seterr(DL_ENOMEM, "generator: out of memory");
    int rc = 0;
    for (int i = 0; i < n; i++) {
        sq[i].out = malloc((size_t)p->max_new_tokens * sizeof(int32_t));
        if (!sq[i].out) { rc = dl_seterr(DL_ENOMEM, "generator: out of memory"); goto done; }
        rng_seed(&sq[i].rng, rng_mix(p->seed, (uint64_t)i, 0));
    }
    gen_stats_t st = {0};
    double t0 = clock_mono_s();
    /* prefill: pack prompt chunks up to the token budget */
    for (;;) {
        int nseq = 0, T = 0;
        g->b_cu[0] = 0;
        for (int i = 0; i < n && T < g->budget; i++) {
            int left = lens[i] - sq[i].prefilled;
            if (left <= 0) continue;
            int k = left < g->budget - T ? left : g->budget - T;
            g->b_slot[nseq] = i;
            g->b_start[nseq] = sq[i].prefilled;
            memcpy(g->b_ids + T, prompts[i] + sq[i].prefilled, (size_t)k * 4);
            T += k;
            g->b_cu[++nseq] = T;
        }
        if (!nseq) break;
        if ((rc = step(g, nseq, T)) < 0) goto done;
        for (int s = 0; s < nseq; s++) {
            int i = g->b_slot[s];
            sq[i].prefilled += g->b_cu[s + 1] - g->b_cu[s];
            sq[i].len = sq[i].prefilled;
            if (sq[i].prefilled == lens[i]) {
                int32_t id = gen_sample(g->h_logits + (size_t)s * g->V, g->V, p->temperature,
                                        p->top_p, &sq[i].rng, g->scratch_p, g->scratch_idx);
                emit(p, &sq[i], i, id, g->max_ctx, cb, user);
            }
        }
        st.prompt_tokens += T;
    }
    double t1 = clock_mono_s();
    /* decode */
    for (;;) {
        int nseq = 0;
        g->b_cu[0] = 0;
        for (int i = 0; i < n; i++) {
            if (sq[i].done) continue;
            g->b_slot[nseq] = i;
            g->b_start[nseq] = sq[i].len;
            g->b_ids[nseq] = sq[i].next;
            nseq++;
            g->b_cu[nseq] = nseq;
        }
        if (!nseq) break;
        if ((rc = step(g, nseq, nseq)) < 0) goto done;
        st.decode_steps++;
        for (int s = 0; s < nseq; s++) {
            int i = g->b_slot[s];
            sq[i].len++;
            int32_t id = gen_sample(g->h_logits + (size_t)s * g->V, g->V, p->temperature, p->top_p,
                                    &sq[i].rng, g->scratch_p, g->scratch_idx);
            emit(p, &sq[i], i, id, g->max_ctx, cb, user);
        }
    }
    st.prefill_s = t1 - t0;
    st.decode_s = clock_mono_s() - t1;
    for (int i = 0; i < n; i++) {
        out[i] = sq[i].out;
        out_len[i] = sq[i].n_out;
        st.new_tokens += sq[i].n_out;
        sq[i].out = NULL;
    }
    if (stats) *stats = st;
done:
    for (int i = 0; i < n; i++) free(sq[i].out);
    free(sq);
    return rc;
}
