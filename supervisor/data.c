/* `draftline run`'s data: --data prepared into <out>/data.dlc (or a .dlc taken as is),
 * the cache checked against the target, the loader cursor of micro-batch 0 and the
 * steps the epochs give (see launch_int.h). */
#include "supervisor/launch_int.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/data/chat.h"
#include "common/data/prepare.h"
#include "common/data/tokenizer.h"
#include "common/pipe/model.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int sup__ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* What <out>/data.dlc is prepared from (the real path of --data, its size and mtime,
 * the fields), kept beside it in data.dlc.source: the cache is reused only for the
 * same (a dir reused as fresh with another --data trained on the old cache). */
static void data_source(const run_opts_t *o, char *buf, size_t cap) {
    char rp[PATH_MAX];
    struct stat sb;
    long long sz = -1, mt = -1;
    if (stat(o->data, &sb) == 0) { sz = (long long)sb.st_size; mt = (long long)sb.st_mtime; }
    snprintf(buf, cap, "%s\n%lld %lld\n%s\n%s\n", realpath(o->data, rp) ? rp : o->data, sz, mt,
             o->prompt_field ? o->prompt_field : "", o->response_field ? o->response_field : "");
}

static int prepare_data(const run_opts_t *o, const char *out_dir, char *cache, size_t cap) {
    if (sup__ends_with(o->data, ".dlc")) { snprintf(cache, cap, "%s", o->data); return 0; }
    snprintf(cache, cap, "%s/data.dlc", out_dir);
    char want[8400], have[8400] = "", srcp[4300];
    data_source(o, want, sizeof want);
    snprintf(srcp, sizeof srcp, "%s.source", cache);
    FILE *sf = fopen(srcp, "rb");
    if (sf) { size_t k = fread(have, 1, sizeof have - 1, sf); have[k] = 0; fclose(sf); }
    dlc_t *c = NULL;
    if (!strcmp(have, want) && dlc_open(cache, &c) == 0) {
        log_info("using the prepared cache %s (%llu samples)", cache, (unsigned long long)dlc_n_samples(c));
        dlc_close(&c);
        return 0;
    }
    if (access(cache, F_OK) == 0)
        log_info("%s: %s: preparing it again from %s", cache,
                 have[0] ? "prepared from other data, fields or an older version of it" : "its source is not recorded",
                 o->data);
    tok_t *t = NULL;
    DL_TRY(tok_load(o->target_model, &t));
    chat_template_t ct;
    int rc = chat_template_from_tok(t, &ct);
    if (rc < 0) { tok_destroy(&t); return dl_wraperr(rc, "chat template of %s", o->target_model); }
    prep_opts_t po;
    memset(&po, 0, sizeof po);
    po.data_path = o->data;
    po.ds.format = DS_AUTO;
    po.ds.prompt_field = o->prompt_field;
    po.ds.response_field = o->response_field;
    po.chat = &ct;
    po.out_path = cache;
    prep_stats_t st;
    printf("preparing %s into %s ...\n", o->data, cache);
    fflush(stdout);
    rc = prep_run(t, &po, &st);
    tok_destroy(&t);
    if (rc < 0) return dl_wraperr(rc, "prepare %s", o->data);
    sf = fopen(srcp, "wb");
    int bad = !sf || fputs(want, sf) < 0;
    if (sf && fclose(sf) != 0) bad = 1;
    if (bad) log_warn("%s: %s (the cache will be prepared again next time)", srcp, strerror(errno));
    printf("prepared %llu samples, %llu tokens (%llu trained), %llu skipped, in %.1f s\n",
           (unsigned long long)st.samples, (unsigned long long)st.tokens,
           (unsigned long long)st.assistant_tokens, (unsigned long long)st.skipped, st.seconds);
    return 0;
}

int sup__requested_cursor(const run_opts_t *o, const char *cache, batcher_cursor_t *cur, uint64_t *all) {
    dlc_t *dc = NULL;
    batcher_t *b = NULL;
    batcher_opts_t bo;
    batcher_opts_default(&bo, 0);
    bo.seed = (uint64_t)o->seed;
    bo.token_budget = (uint32_t)o->token_budget;
    bo.max_len = o->max_len > 0 && o->max_len < o->token_budget ? (uint32_t)o->max_len : (uint32_t)o->token_budget;
    bo.micro_batches_per_step = (uint32_t)o->mbs_per_step;
    bo.epochs = (uint32_t)o->epochs;
    int rc = dlc_open(cache, &dc);
    if (rc == 0) rc = batcher_new(dc, &bo, &b);
    if (rc < 0) { dlc_close(&dc); return dl_wraperr(rc, "%s", cache); }
    if (all) *all = batcher_total_mbs(b) / (uint64_t)o->mbs_per_step;
    batcher_cursor(b, 0, cur);
    batcher_destroy(&b);
    dlc_close(&dc);
    return 0;
}

/* Something to train on: a drafter block is anchored at a position a >= 1 of a sequence
 * with an assistant token at a + 1 (drafter_sample_anchors), and the loader cuts each
 * sample to its first `cut` tokens (the token budget, or --max-len: as
 * sup__requested_cursor). 0 assistant tokens, or none at a position >= 2 inside the
 * cut of any sample, trains nothing (every step NaN-skipped): refused with the numbers,
 * exit 2. Reads every mask byte once (O(n_tokens)). */
static int data_trainable(const run_opts_t *o, const dlc_t *dc) {
    const dlc_header_t *dh = dlc_header(dc);
    if (dh->n_assistant == 0) {
        fprintf(stderr, "draftline run: --data %s: nothing to train on: assistant tokens 0 (of %llu tokens in %llu "
                        "samples): every token is prompt (check --prompt-field / --response-field, or that the "
                        "samples have assistant turns)\n", o->data, (unsigned long long)dh->n_tokens,
                (unsigned long long)dh->n_samples);
        return 2;
    }
    int by_max_len = o->max_len > 0 && o->max_len < o->token_budget;
    uint32_t cut = by_max_len ? (uint32_t)o->max_len : (uint32_t)o->token_budget;
    const char *flag = by_max_len ? "--max-len" : "--token-budget";
    uint64_t n = dlc_n_samples(dc), ok = 0, need_min = UINT64_MAX;
    for (uint64_t i = 0; i < n; i++) {
        const int32_t *ids;
        const uint8_t *mask;
        uint32_t len;
        if (dlc_sample(dc, i, &ids, &mask, &len) < 0) continue;
        uint32_t p = 2;
        while (p < len && !mask[p]) p++;
        if (p >= len) continue;
        if ((uint64_t)p + 1 < need_min) need_min = (uint64_t)p + 1;
        if (p < cut) { ok++; break; }   /* one is enough */
    }
    if (ok) return 0;
    if (need_min == UINT64_MAX)
        fprintf(stderr, "draftline run: --data %s: nothing to train on: no sample has an assistant token after its "
                        "first two tokens (assistant tokens %llu)\n", o->data, (unsigned long long)dh->n_assistant);
    else
        fprintf(stderr, "draftline run: --data %s: nothing to train on: samples are cut to %u tokens (%s) and no "
                        "sample has an assistant token within them: the smallest block needs %llu tokens (raise "
                        "%s to at least that)\n", o->data, cut, flag, (unsigned long long)need_min, flag);
    return 2;
}

int sup__data_prepare(launch_t *L) {
    const run_opts_t *o = L->o;
    /* the data as given cannot be used (unreadable, corrupt, no trainable record): refused
     * before any stage started, as a bad flag (exit 2, run --help) */
    if (prepare_data(o, L->out, L->cache, sizeof L->cache) < 0) {
        fprintf(stderr, "draftline run: %s\n", dl_errmsg());
        return 2;
    }
    /* the cache's token ids must be the target's: ids < V, and the target's tokenizer
     * (a cache of another tokenizer trained silently on ids that mean other tokens) */
    const char *cache = L->cache;
    dlc_t *dc = NULL;
    if (dlc_open(cache, &dc) < 0) { fprintf(stderr, "draftline run: %s\n", dl_errmsg()); return 2; }
    const dlc_header_t *dh = dlc_header(dc);
    int bad = 0;
    tok_t *tk = NULL;
    if (L->mc_rc == 0 && dh->n_vocab > L->mc.V) {
        fprintf(stderr, "draftline run: --data %s: token ids of a %d-token vocabulary, more than the %d of "
                        "--target-model %s: prepare it with the target's tokenizer (draftline prepare --model)\n",
                o->data, dh->n_vocab, L->mc.V, o->target_model);
        bad = 1;
    } else if (tok_load(o->target_model, &tk) == 0) {
        if (dh->tok_fingerprint != tok_fingerprint(tk)) {
            int same_n = dh->n_vocab == tok_n_vocab(tk);
            if (!same_n) bad = 1;
            log_msg(same_n ? LOG_WARN : LOG_ERROR, __FILE__, __LINE__,
                    "--data %s was prepared with another tokenizer than --target-model %s's (%d tokens, the "
                    "target's %d)%s", cache, o->target_model, dh->n_vocab, tok_n_vocab(tk),
                    same_n ? "" : ": prepare it with the target's tokenizer (draftline prepare --model)");
        }
        tok_destroy(&tk);
    } else {
        log_warn("--target-model %s: no tokenizer (%s): the tokenizer of --data %s is not checked", o->target_model,
                 dl_errmsg(), cache);
    }
    /* its contents, read once here, so a corrupt token id or mask byte is one line
     * before any stage starts, not a hang or a target crash loop */
    if (!bad && dlc_validate(dc, L->mc_rc == 0 ? L->mc.V : 0) < 0) {
        fprintf(stderr, "draftline run: --data: %s\n", dl_errmsg());
        bad = 1;
    }
    if (!bad && data_trainable(o, dc)) bad = 1;
    dlc_close(&dc);
    return bad ? 2 : 0;
}

int sup__data_cursor(launch_t *L) {
    const run_opts_t *o = L->o;
    L->max_steps = (uint64_t)o->max_steps;
    /* the cursor of micro-batch 0 (cache fingerprint, options) for the optimizer's
     * checkpoints; written before any stage starts (after the --resume data check) */
    uint64_t all = 0;
    batcher_cursor_t cur;
    if (sup__requested_cursor(o, L->cache, &cur, &all) < 0) {
        fprintf(stderr, "draftline run: %s\n", dl_errmsg());
        return 1;
    }
    int rc = sup__resume_check_late(L, &cur);
    if (rc) return rc;
    uint8_t cb[BATCHER_CURSOR_BYTES];
    batcher_cursor_encode(&cur, cb);
    char cpath[4300];
    snprintf(cpath, sizeof cpath, "%s/loader.cursor", L->out);
    FILE *cf = fopen(cpath, "wb");
    if (!cf || fwrite(cb, 1, sizeof cb, cf) != sizeof cb || fclose(cf) != 0) {
        fprintf(stderr, "draftline run: write %s failed\n", cpath);
        return 1;
    }
    if (L->max_steps == 0 || L->max_steps > all) {
        if (L->max_steps > all) log_warn("--max-steps %llu is more than %u epoch(s) give (%llu steps)",
                                         (unsigned long long)L->max_steps, o->epochs, (unsigned long long)all);
        L->max_steps = all;
    }
    if (L->have_resume_hdr && L->resume_hdr.max_steps > 0 && (uint64_t)L->resume_hdr.max_steps != L->max_steps)
        log_warn("--resume: max-steps changes from %llu (the checkpoint's) to %llu: the LR schedule (warmup, "
                 "then cosine decay to max-steps) changes with it; pass --max-steps %llu to keep it",
                 (unsigned long long)L->resume_hdr.max_steps, (unsigned long long)L->max_steps,
                 (unsigned long long)L->resume_hdr.max_steps);
    if (L->max_steps <= L->start_step) {
        fprintf(stderr, "draftline run: nothing to do: the checkpoint is at step %llu of %llu (a larger "
                        "--max-steps trains on)\n", (unsigned long long)L->start_step,
                (unsigned long long)L->max_steps);
        return 2;
    }
    return 0;
}
