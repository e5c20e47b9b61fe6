/* Token-budget batching (see batcher.h for the plan). */
#include "common/data/batcher.h"

#include "common/base/err.h"
#include "common/base/rng.h"

#include <stdlib.h>
#include <string.h>

struct batcher {
    const dlc_t *cache;
    batcher_opts_t o;
    batcher_seq_t *segs;     /* (n_segs) epoch-independent sequences */
    uint32_t n_segs;
    /* cumulative micro-batch counts: epoch_start[e] = first mb of epoch e, known for e <= n_known */
    uint64_t *epoch_start;
    uint32_t n_known, cap_known;
    /* plan of one epoch */
    int64_t plan_epoch;      /* -1: none */
    uint32_t *plan_seg;      /* (n_segs) segment indices in micro-batch order */
    uint32_t *packed;        /* (n_segs) packed order before the micro-batch shuffle */
    uint64_t *keys;          /* (window) sort keys */
    uint32_t *mb_fill, *mb_cnt, *mb_of; /* (window) packing scratch */
    uint32_t *plan_off;      /* (plan_n_mb + 1) offsets into plan_seg */
    uint64_t plan_n_mb;
    uint32_t *scratch;       /* (n_segs) */
    uint32_t *scratch2;      /* (n_segs + 1) */
    batcher_seq_t *out;      /* (max seqs per mb) returned by batcher_get */
    uint32_t out_cap;
    uint64_t cursor;
};

void batcher_opts_default(batcher_opts_t *o, int gpu) {
    memset(o, 0, sizeof *o);
    o->token_budget = gpu ? BATCHER_TOKEN_BUDGET_GPU : BATCHER_TOKEN_BUDGET_CPU;
    o->max_len = o->token_budget;
    o->shuffle_buffer = BATCHER_SHUFFLE_BUFFER_DEFAULT;
    o->micro_batches_per_step = 1;
    o->epochs = 1;
}

void batcher_destroy(batcher_t **bp) {
    if (!bp || !*bp) return;
    batcher_t *b = *bp;
    free(b->segs);
    free(b->epoch_start);
    free(b->plan_seg);
    free(b->packed);
    free(b->keys);
    free(b->mb_fill);
    free(b->mb_cnt);
    free(b->mb_of);
    free(b->plan_off);
    free(b->scratch);
    free(b->scratch2);
    free(b->out);
    free(b);
    *bp = NULL;
}

int batcher_new(const dlc_t *cache, const batcher_opts_t *opts, batcher_t **out) {
    batcher_opts_t o = *opts;
    if (o.token_budget < 2) return dl_seterr(DL_EINVAL, "--token-budget: %u (need >= 2)", o.token_budget);
    if (o.max_len == 0) o.max_len = o.token_budget;
    if (o.max_len < 2 || o.max_len > o.token_budget)
        return dl_seterr(DL_EINVAL, "--max-len: %u (need 2..token budget %u)", o.max_len, o.token_budget);
    if (o.shuffle_buffer == 0) o.shuffle_buffer = BATCHER_SHUFFLE_BUFFER_DEFAULT;
    if (o.micro_batches_per_step == 0) return dl_seterr(DL_EINVAL, "micro_batches_per_step: 0 (need >= 1)");
    uint64_t ns = dlc_n_samples(cache);
    /* count sequences */
    uint64_t nseg = 0;
    for (uint64_t i = 0; i < ns; i++) {
        uint32_t len = dlc_sample_len(cache, i);
        if (len < 2) continue;
        if (len <= o.max_len || !o.split_long) { nseg++; continue; }
        nseg += len / o.max_len + (len % o.max_len >= 2);
    }
    if (nseg == 0) return dl_seterr(DL_EINVAL, "batcher: the cache has no sample of >= 2 tokens");
    if (nseg >= UINT32_MAX) return dl_seterr(DL_ERANGE, "batcher: %llu sequences (max 2^32-1)", (unsigned long long)nseg);
    batcher_t *b = calloc(1, sizeof *b);
    if (!b) return dl_seterr(DL_ENOMEM, "batcher");
    b->cache = cache;
    b->o = o;
    b->n_segs = (uint32_t)nseg;
    b->plan_epoch = -1;
    b->segs = malloc(nseg * sizeof *b->segs);
    b->plan_seg = malloc(nseg * sizeof *b->plan_seg);
    b->packed = malloc(nseg * sizeof *b->packed);
    size_t wmax = nseg < o.shuffle_buffer ? nseg : o.shuffle_buffer;
    b->keys = malloc(wmax * sizeof *b->keys);
    b->mb_fill = malloc(wmax * sizeof(uint32_t));
    b->mb_cnt = malloc(wmax * sizeof(uint32_t));
    b->mb_of = malloc(wmax * sizeof(uint32_t));
    b->plan_off = malloc((nseg + 1) * sizeof *b->plan_off);
    b->scratch = malloc(nseg * sizeof *b->scratch);
    b->scratch2 = malloc((nseg + 1) * sizeof *b->scratch2);
    b->cap_known = 16;
    b->epoch_start = calloc(b->cap_known, sizeof *b->epoch_start);
    b->out_cap = o.token_budget / 2 + 1; /* every sequence has >= 2 tokens */
    b->out = malloc(b->out_cap * sizeof *b->out);
    if (!b->segs || !b->plan_seg || !b->packed || !b->keys || !b->mb_fill || !b->mb_cnt || !b->mb_of || !b->plan_off || !b->scratch || !b->scratch2 || !b->epoch_start || !b->out) {
        batcher_destroy(&b);
        return dl_seterr(DL_ENOMEM, "batcher: plan for %llu sequences", (unsigned long long)nseg);
    }
    uint64_t k = 0;
    for (uint64_t i = 0; i < ns; i++) {
        uint32_t len = dlc_sample_len(cache, i);
        if (len < 2) continue;
        if (len <= o.max_len) { b->segs[k++] = (batcher_seq_t){i, 0, len}; continue; }
        if (!o.split_long) { b->segs[k++] = (batcher_seq_t){i, 0, o.max_len}; continue; }
        for (uint32_t s = 0; s < len; s += o.max_len) {
            uint32_t l = len - s < o.max_len ? len - s : o.max_len;
            if (l >= 2) b->segs[k++] = (batcher_seq_t){i, s, l};
        }
    }
    *out = b;
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts idx[n] by (segment length, index); keys is scratch of n. */
static void sort_by_len(const batcher_seq_t *segs, uint32_t *idx, uint32_t n, uint64_t *keys) {
    for (uint32_t i = 0; i < n; i++) keys[i] = ((uint64_t)segs[idx[i]].len << 32) | idx[i];
    qsort(keys, n, sizeof *keys, cmp_u64);
    for (uint32_t i = 0; i < n; i++) idx[i] = (uint32_t)keys[i];
}

/* Builds the plan of epoch e into plan_seg / plan_off / plan_n_mb. */
static void build_plan(batcher_t *b, uint32_t e) {
    if (b->plan_epoch == (int64_t)e) return;
    uint32_t n = b->n_segs, W = b->o.shuffle_buffer, budget = b->o.token_budget;
    rng_t r;
    rng_seed(&r, rng_mix(b->o.seed, e, 0));
    uint32_t *perm = b->scratch;
    for (uint32_t i = 0; i < n; i++) perm[i] = i;
    rng_shuffle_u32(&r, perm, n);
    /* pack window by window into scratch order (segments) + mb offsets in scratch2 */
    uint32_t *seq = b->packed;
    uint32_t *off = b->scratch2;
    uint64_t nmb = 0;
    uint32_t k = 0;
    for (uint32_t w0 = 0; w0 < n; w0 += W) {
        uint32_t wn = n - w0 < W ? n - w0 : W;
        uint32_t *win = perm + w0;
        sort_by_len(b->segs, win, wn, b->keys);
        /* striped first-fit decreasing: M = ceil(tokens / budget) micro-batches; the
         * sequences, longest first, go round-robin to the next micro-batch with room
         * (a new one when none has), so every micro-batch gets a share of every
         * length band. */
        uint64_t wt = 0;
        for (uint32_t i = 0; i < wn; i++) wt += b->segs[win[i]].len;
        uint32_t M = (uint32_t)((wt + budget - 1) / budget), cur = 0;
        if (M == 0) M = 1;
        uint32_t *fill = b->mb_fill, *cnt = b->mb_cnt, *who = b->mb_of;
        for (uint32_t j = 0; j < M; j++) fill[j] = cnt[j] = 0;
        for (int64_t i = (int64_t)wn - 1; i >= 0; i--) {
            uint32_t len = b->segs[win[i]].len, j = UINT32_MAX;
            for (uint32_t t = 0; t < M; t++) {
                uint32_t c = cur + t < M ? cur + t : cur + t - M;
                if (fill[c] + len <= budget) { j = c; break; }
            }
            if (j == UINT32_MAX) { j = M++; fill[j] = cnt[j] = 0; }
            fill[j] += len;
            cnt[j]++;
            who[i] = j;
            cur = j + 1 < M ? j + 1 : 0;
        }
        /* group by micro-batch (counting sort), longest first inside each */
        for (uint32_t j = 0; j < M; j++) {
            off[nmb + j] = k;
            uint32_t c = cnt[j];
            cnt[j] = k; /* becomes the write cursor */
            k += c;
        }
        for (int64_t i = (int64_t)wn - 1; i >= 0; i--) seq[cnt[who[i]]++] = win[i];
        nmb += M;
    }
    off[nmb] = k;
    /* shuffle the micro-batches of the epoch: perm (reused) holds the mb order */
    uint32_t *mbperm = perm;
    for (uint32_t i = 0; i < nmb; i++) mbperm[i] = i;
    rng_shuffle_u32(&r, mbperm, nmb);
    uint32_t kk = 0;
    for (uint64_t m = 0; m < nmb; m++) {
        uint32_t src = mbperm[m];
        b->plan_off[m] = kk;
        for (uint32_t j = off[src]; j < off[src + 1]; j++) b->plan_seg[kk++] = seq[j];
    }
    b->plan_off[nmb] = kk;
    b->plan_n_mb = nmb;
    b->plan_epoch = e;
}

/* Makes epoch_start known up to epoch e+1. */
static void know_epoch(batcher_t *b, uint32_t e) {
    while (b->n_known <= e) {
        if (b->n_known + 2 > b->cap_known) {
            uint32_t cap = b->cap_known * 2;
            uint64_t *ns = realloc(b->epoch_start, cap * sizeof *ns);
            if (!ns) return;
            b->epoch_start = ns;
            b->cap_known = cap;
        }
        build_plan(b, b->n_known);
        b->epoch_start[b->n_known + 1] = b->epoch_start[b->n_known] + b->plan_n_mb;
        b->n_known++;
    }
}

uint64_t batcher_epoch_mbs(batcher_t *b, uint32_t epoch) {
    know_epoch(b, epoch);
    if (b->n_known <= epoch) return 0;
    return b->epoch_start[epoch + 1] - b->epoch_start[epoch];
}

uint64_t batcher_total_mbs(batcher_t *b) {
    if (b->o.epochs == 0) return 0;
    know_epoch(b, b->o.epochs - 1);
    return b->n_known >= b->o.epochs ? b->epoch_start[b->o.epochs] : 0;
}

int batcher_get(batcher_t *b, uint64_t mb, batcher_mb_t *m) {
    uint32_t e = 0;
    /* find the epoch: known ones by binary search, else extend */
    for (;;) {
        if (b->o.epochs && e >= b->o.epochs)
            return dl_seterr(DL_ENOENT, "batcher: micro-batch %llu is past the last epoch (%u epochs)",
                             (unsigned long long)mb, b->o.epochs);
        if (e >= b->n_known) {
            know_epoch(b, e);
            if (e >= b->n_known) return dl_seterr(DL_ENOMEM, "batcher: epoch table");
        }
        if (mb < b->epoch_start[e + 1]) break;
        e++;
        if (e < b->n_known) { /* jump with binary search over the known epochs */
            uint32_t lo = e, hi = b->n_known; /* first epoch with start[x+1] > mb */
            while (lo < hi) {
                uint32_t mid = lo + (hi - lo) / 2;
                if (b->epoch_start[mid + 1] > mb) hi = mid; else lo = mid + 1;
            }
            e = lo;
        }
    }
    build_plan(b, e);
    uint64_t i = mb - b->epoch_start[e];
    uint32_t a = b->plan_off[i], z = b->plan_off[i + 1];
    uint32_t tokens = 0;
    for (uint32_t j = a; j < z; j++) {
        b->out[j - a] = b->segs[b->plan_seg[j]];
        tokens += b->out[j - a].len;
    }
    m->mb = mb;
    m->step = mb / b->o.micro_batches_per_step;
    m->epoch = e;
    m->n_seqs = z - a;
    m->n_tokens = tokens;
    m->seqs = b->out;
    return 0;
}

int batcher_pack(const batcher_t *b, const batcher_mb_t *m, int32_t *ids, uint8_t *mask, int32_t *pos,
                 int32_t *cu_seqlens) {
    uint32_t k = 0;
    if (cu_seqlens) cu_seqlens[0] = 0;
    for (uint32_t s = 0; s < m->n_seqs; s++) {
        const batcher_seq_t *q = &m->seqs[s];
        const int32_t *si;
        const uint8_t *sm;
        uint32_t len;
        DL_TRY(dlc_sample(b->cache, q->sample, &si, &sm, &len));
        if ((uint64_t)q->start + q->len > len) return dl_seterr(DL_ERANGE, "batcher_pack: sequence past its sample");
        /* a corrupt cache (an id outside the vocabulary, a mask byte of 2) stops here,
         * naming the sample, instead of in a target or a drafter */
        DL_TRY(dlc_check_tokens(b->cache, q->sample, si + q->start, sm + q->start, q->len, q->start,
                                dlc_header(b->cache)->n_vocab));
        if (ids) memcpy(ids + k, si + q->start, q->len * sizeof *ids);
        if (mask) memcpy(mask + k, sm + q->start, q->len);
        if (pos)
            for (uint32_t j = 0; j < q->len; j++) pos[k + j] = (int32_t)j;
        k += q->len;
        if (cu_seqlens) cu_seqlens[s + 1] = (int32_t)k;
    }
    return 0;
}

/* ---- cursor ------------------------------------------------------------------- */

static uint64_t data_fp(const batcher_t *b) {
    const dlc_header_t *h = dlc_header(b->cache);
    return h->tok_fingerprint ^ rng_mix(h->n_samples, h->n_tokens, 0x646c63);
}

static uint64_t opts_hash(const batcher_opts_t *o) {
    uint64_t h = rng_mix(o->token_budget, o->max_len, (uint64_t)o->split_long);
    h = rng_mix(h, o->shuffle_buffer, o->micro_batches_per_step);
    return rng_mix(h, o->epochs, 1);
}

void batcher_cursor(const batcher_t *b, uint64_t next_mb, batcher_cursor_t *c) {
    c->next_mb = next_mb;
    c->seed = b->o.seed;
    c->data_fingerprint = data_fp(b);
    c->opts_hash = opts_hash(&b->o);
}

int batcher_next(batcher_t *b, batcher_mb_t *out) {
    DL_TRY(batcher_get(b, b->cursor, out));
    b->cursor++;
    return 0;
}

uint64_t batcher_tell(const batcher_t *b) { return b->cursor; }

int batcher_restore(batcher_t *b, const batcher_cursor_t *c) {
    if (c->seed != b->o.seed)
        return dl_seterr(DL_EINVAL, "batcher cursor: seed %llu, this run uses %llu", (unsigned long long)c->seed,
                         (unsigned long long)b->o.seed);
    if (c->data_fingerprint != data_fp(b))
        return dl_seterr(DL_EINVAL, "batcher cursor: made for a different dataset cache or tokenizer");
    if (c->opts_hash != opts_hash(&b->o))
        return dl_seterr(DL_EINVAL, "batcher cursor: made with different batching options "
                                    "(token budget, max len, split, shuffle buffer, micro-batches per step, epochs)");
    b->cursor = c->next_mb;
    return 0;
}

static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void batcher_cursor_encode(const batcher_cursor_t *c, uint8_t out[BATCHER_CURSOR_BYTES]) {
    put64(out, c->next_mb);
    put64(out + 8, c->seed);
    put64(out + 16, c->data_fingerprint);
    put64(out + 24, c->opts_hash);
    put64(out + 32, rng_mix(c->next_mb ^ c->seed, c->data_fingerprint, c->opts_hash)); /* check */
}

int batcher_cursor_decode(const uint8_t *in, size_t len, batcher_cursor_t *c) {
    if (len != BATCHER_CURSOR_BYTES)
        return dl_seterr(DL_EFORMAT, "batcher cursor: %zu bytes (want %d)", len, BATCHER_CURSOR_BYTES);
    batcher_cursor_t x = {get64(in), get64(in + 8), get64(in + 16), get64(in + 24)};
    if (get64(in + 32) != rng_mix(x.next_mb ^ x.seed, x.data_fingerprint, x.opts_hash))
        return dl_seterr(DL_EFORMAT, "batcher cursor: check word mismatch (corrupt)");
    *c = x;
    return 0;
}
