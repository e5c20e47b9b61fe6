/* draftline regen: regenerates the assistant turns of a chat dataset (or answers
 * a prompt-only set such as GSM8K questions) with the target, as the DFlash
 * recipe trains on the target's own responses. Output: OpenAI-style jsonl
 * {"messages":[{"role":"user",...},{"role":"assistant",...},...]} that
 * `draftline run --data` trains on.
 *
 * Samples are the prompts of common/data/prompts.h whose first turn fits
 * (prompt tokens <= --max-ctx - --max-new-tokens), in file order. Each is
 * written as one line, flushed as written. Resumable: on start the complete
 * lines of OUT are counted (a partial last line, from a kill, is truncated
 * away) and that many samples are skipped; resuming needs the same --data,
 * --max-ctx and --max-new-tokens (they decide which samples exist).
 * Multi-turn conversations are regenerated turn by turn, each turn seeing the
 * regenerated earlier replies; a conversation whose next turn no longer fits
 * ends there. */
#include "tools/commands.h"

#include "common/base/cli.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/ompwait.h"
#include "common/base/paths.h"
#include "common/base/rng.h"
#include "common/data/chat.h"
#include "common/data/prompts.h"
#include "common/data/tokenizer.h"
#include "common/model/generate.h"
#include "common/model/target.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REGEN_MAX_BATCH 256

static void regen_usage(FILE *f) {
    fprintf(f,
            "usage: draftline regen --data IN --out OUT [options]\n\n"
            "Regenerates the assistant turns of a chat dataset with the target (batched\n"
            "decoding) into OpenAI-style jsonl; resumes where OUT ends.\n\n"
            "  --target-model PATH    .gguf or HF model dir (default: the embedded SmolLM2)\n"
            "  --data IN              OpenAI/ShareGPT jsonl, or prompt-only sets (GSM8K\n"
            "                         question, HumanEval prompt, MT-Bench turns)\n"
            "  --out OUT              output jsonl (appended to; complete lines are kept)\n"
            "  --max-new-tokens N     per assistant turn (default 512)\n"
            "  --max-ctx N            tokens per conversation (default 2048); at most the model's\n"
            "                         context (max_position_embeddings), else an error (exit 2)\n"
            "  --temperature T        0 = greedy (default)   --top-p P (default 1)\n"
            "  --seed S               sampling seed (default 0)\n"
            "  --batch K              sequences decoded together (default 8, max %d)\n"
            "  --limit N              stop after N samples in OUT (default: all)\n"
            "  --max-seconds S        start no new batch after S s of decoding (one batch at\n"
            "                         least; the batch in flight completes; run again to\n"
            "                         resume); default 0 = off\n"
            "  --device cpu|cuda      (default cpu)    --gpu N   CUDA device (default 0)\n"
            "  --target-precision P   bf16 (default) or fp8: the target's decoder linears in E4M3 with\n"
            "                         per-channel/per-token scales (CUDA: sm_89+; CPU: fp32 emulation;\n"
            "                         MoE targets refused; see `draftline run --help`)\n"
            "  --threads N            CPU threads (default: all cores)\n",
            REGEN_MAX_BATCH);
}

/* Counts the complete lines of path (0 when it does not exist yet; it is created
 * when the first sample is written). A partial last line (what a kill mid-write
 * leaves) is reported in *tail_off (its offset) and *tail_len (0: none); it is
 * truncated away only by resume_drop_tail, after the complete lines are checked.
 * Returns the count or <0. */
static int64_t resume_prepare(const char *path, off_t *tail_off, off_t *tail_len) {
    *tail_off = *tail_len = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0 && errno == ENOENT) return 0;
    if (fd < 0) return dl_seterr(DL_EIO, "--out %s: %s", path, strerror(errno));
    char buf[1 << 16];
    int64_t lines = 0;
    off_t pos = 0, end_of_last = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0) {
            close(fd);
            return dl_seterr(DL_EIO, "--out %s: read: %s", path, strerror(errno));
        }
        if (n == 0) break;
        for (ssize_t i = 0; i < n; i++)
            if (buf[i] == '\n') {
                lines++;
                end_of_last = pos + i + 1;
            }
        pos += n;
    }
    close(fd);
    *tail_off = end_of_last;
    *tail_len = pos - end_of_last;
    return lines;
}

/* Truncates the partial last line at tail_off away when it is the start of a regen
 * output line ({"messages": ...); anything else is not ours to delete: DL_EFORMAT. */
static int resume_drop_tail(const char *path, off_t tail_off, off_t tail_len) {
    static const char want[] = "{\"messages\":";
    char head[sizeof want] = {0};
    int fd = open(path, O_RDWR);
    if (fd < 0) return dl_seterr(DL_EIO, "--out %s: %s", path, strerror(errno));
    size_t k = tail_len < (off_t)sizeof want - 1 ? (size_t)tail_len : sizeof want - 1;
    ssize_t n = pread(fd, head, k, tail_off);
    if (n != (ssize_t)k || memcmp(head, want, k) != 0) {
        close(fd);
        return dl_seterr(DL_EFORMAT, "--out %s: its last line (%lld bytes, no newline) is not a regen output "
                         "line; fix or remove it (or pick another --out)", path, (long long)tail_len);
    }
    log_warn("%s: dropping a partial last line (%lld bytes) left by an interrupted run", path, (long long)tail_len);
    if (ftruncate(fd, tail_off) != 0 || fsync(fd) != 0) {
        close(fd);
        return dl_seterr(DL_EIO, "--out %s: truncate: %s", path, strerror(errno));
    }
    close(fd);
    return 0;
}

/* Checks that each of the first `lines` lines of path is a regen output line:
 * a JSON object whose "messages" array holds an assistant turn. Resume trusts
 * the count of lines, so a foreign or damaged file must stop here.
 * Returns 0 or DL_EFORMAT "PATH:L: ..." naming the first bad line. */
static int resume_validate(const char *path, int64_t lines) {
    FILE *f = fopen(path, "rb");
    if (!f) return dl_seterr(DL_EIO, "--out %s: %s", path, strerror(errno));
    char *ln = NULL;
    size_t cap = 0;
    int rc = 0;
    for (int64_t i = 1; i <= lines && rc == 0; i++) {
        ssize_t n = getline(&ln, &cap, f);
        if (n < 0) break;
        cJSON *o = cJSON_ParseWithLength(ln, (size_t)n);
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages"), *m;
        int asst = 0;
        if (cJSON_IsArray(msgs))
            cJSON_ArrayForEach(m, msgs) {
                const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
                if (cJSON_IsString(r) && !strcmp(r->valuestring, "assistant")) asst = 1;
            }
        if (!o)
            rc = dl_seterr(DL_EFORMAT, "--out %s:%lld: not JSON; resume counts lines, so fix or remove it (or pick another --out)",
                           path, (long long)i);
        else if (!asst)
            rc = dl_seterr(DL_EFORMAT, "--out %s:%lld: no assistant turn in \"messages\"; not a regen output line (fix or remove it)",
                           path, (long long)i);
        cJSON_Delete(o);
    }
    free(ln);
    fclose(f);
    return rc;
}

/* Copy of s[0..n) with invalid UTF-8 replaced by U+FFFD (JSON must be UTF-8;
 * a reply cut at max tokens may end inside a character). */
static char *utf8_clean(const char *s, size_t n) {
    char *o = malloc(3 * n + 1), *w = o;
    if (!o) return NULL;
    const unsigned char *p = (const unsigned char *)s, *e = p + n;
    while (p < e) {
        unsigned c = *p;
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && p + len <= e;
        for (int k = 1; ok && k < len; k++) ok = (p[k] & 0xC0) == 0x80;
        if (ok && len == 2) ok = c >= 0xC2;
        if (ok && len == 3) {
            unsigned cp = ((c & 15u) << 12) | ((p[1] & 63u) << 6) | (p[2] & 63u);
            ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);
        }
        if (ok && len == 4) {
            unsigned cp = ((c & 7u) << 18) | ((p[1] & 63u) << 12) | ((p[2] & 63u) << 6) | (p[3] & 63u);
            ok = cp >= 0x10000 && cp <= 0x10FFFF;
        }
        if (ok) {
            memcpy(w, p, (size_t)len);
            w += len;
            p += len;
        } else {
            memcpy(w, "\xEF\xBF\xBD", 3);
            w += 3;
            p++;
        }
    }
    *w = 0;
    return o;
}

typedef struct {
    prompt_t p;
    int n_turns;        /* user turns to regenerate */
    int n_done;         /* replies generated */
    char **replies;     /* (n_turns) */
} sample_t;

static void sample_free(sample_t *s) {
    for (int i = 0; i < s->n_done; i++) free(s->replies[i]);
    free(s->replies);
    prompt_free(&s->p);
    memset(s, 0, sizeof *s);
}

/* One JSON line (with '\n') for s; malloc'd. */
static char *sample_line(const sample_t *s) {
    cJSON *root = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(root, "messages");
    if (!root || !msgs) { cJSON_Delete(root); return NULL; }
    int u = s->p.has_system ? 1 : 0;
    if (s->p.has_system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", s->p.msgs[0].content);
        cJSON_AddItemToArray(msgs, m);
    }
    for (int t = 0; t < s->n_done; t++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", s->p.msgs[u + t].content);
        cJSON_AddItemToArray(msgs, m);
        m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", s->replies[t]);
        cJSON_AddItemToArray(msgs, m);
    }
    char *txt = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!txt) return NULL;
    size_t n = strlen(txt);
    char *line = realloc(txt, n + 2);
    if (!line) { free(txt); return NULL; }
    line[n] = '\n';
    line[n + 1] = 0;
    return line;
}

/* The flags of `draftline regen`, after regen_parse_flags. */
typedef struct {
    char model[4096];                   /* target: .gguf or HF dir */
    const char *data, *out_path, *device;
    int max_new, max_ctx, batch, gpu, threads;
    int precision;                      /* --target-precision: TARGET_PRECISION_* */
    double temp, top_p, max_seconds;    /* --max-seconds in s */
    int64_t seed, limit;
} regen_opts_t;

/* What one regen holds; released by regen_free. Per-batch arrays have
 * o.batch entries. */
typedef struct {
    ops_ctx_t ops;
    tok_t *tok;
    target_t *t;
    generator_t *g;
    prompt_reader_t *rd;
    FILE *out;
    chat_template_t ct;
    gen_params_t gp;
    sample_t *sb;                       /* the batch's samples */
    tok_ids_t *ids;                     /* a round's prompts, tokenized */
    int32_t **gen;                      /* a round's generated tokens (malloc'd by the generator) */
    int *gen_len, *lens;
    const int32_t **pp;
    int *who;                           /* a round's row -> sample in sb */
    int64_t have;                       /* samples OUT held at start */
    int64_t index, written, gen_tokens, skipped_long;
    int out_existed;
} regen_t;

/* Parses and checks argv into *o (defaults first). Returns -1 to go on, else
 * the exit code: 0 after --help, 2 for a bad flag, 1 without a default model. */
static int regen_parse_flags(int argc, char **argv, regen_opts_t *o) {
    enum { O_TM = 256, O_DATA, O_OUT, O_MNT, O_CTX, O_TEMP, O_TOPP, O_SEED, O_BATCH, O_LIMIT,
           O_DEV, O_GPU, O_THR, O_MAXS, O_HELP, O_TP };
    static const struct option opts[] = {
        {"target-model", 1, 0, O_TM}, {"data", 1, 0, O_DATA}, {"out", 1, 0, O_OUT},
        {"max-new-tokens", 1, 0, O_MNT}, {"max-ctx", 1, 0, O_CTX}, {"temperature", 1, 0, O_TEMP},
        {"top-p", 1, 0, O_TOPP}, {"seed", 1, 0, O_SEED}, {"batch", 1, 0, O_BATCH},
        {"limit", 1, 0, O_LIMIT}, {"device", 1, 0, O_DEV}, {"gpu", 1, 0, O_GPU},
        {"threads", 1, 0, O_THR}, {"max-seconds", 1, 0, O_MAXS}, {"help", 0, 0, O_HELP},
        {"target-precision", 1, 0, O_TP}, {0, 0, 0, 0}};
    int c;
    memset(o, 0, sizeof *o);
    o->device = "cpu";
    o->max_new = 512, o->max_ctx = 2048, o->batch = 8, o->top_p = 1, o->limit = INT64_MAX;
    optind = 1;
#define FLAG(call) do { if ((call) < 0) { cli_error("regen", dl_errmsg()); return 2; } } while (0)
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_TM: snprintf(o->model, sizeof o->model, "%s", optarg); break;
        case O_DATA: o->data = optarg; break;
        case O_OUT: o->out_path = optarg; break;
        case O_MNT: FLAG(cli_parse_int("--max-new-tokens", optarg, 1, 1 << 16, &o->max_new)); break;
        case O_CTX: FLAG(cli_parse_int("--max-ctx", optarg, 16, 1 << 20, &o->max_ctx)); break;
        case O_TEMP: FLAG(cli_parse_f64("--temperature", optarg, 0, 100, &o->temp)); break;
        case O_TOPP: FLAG(cli_parse_f64("--top-p", optarg, 1e-6, 1, &o->top_p)); break;
        case O_SEED: FLAG(cli_parse_i64("--seed", optarg, 0, INT64_MAX, &o->seed)); break;
        case O_BATCH: FLAG(cli_parse_int("--batch", optarg, 1, REGEN_MAX_BATCH, &o->batch)); break;
        case O_LIMIT: FLAG(cli_parse_i64("--limit", optarg, 0, INT64_MAX, &o->limit)); break;
        case O_DEV: o->device = optarg; break;
        case O_GPU: FLAG(cli_parse_int("--gpu", optarg, 0, 1023, &o->gpu)); break;
        case O_THR: FLAG(cli_parse_int("--threads", optarg, 1, 1024, &o->threads)); break;
        case O_MAXS: FLAG(cli_parse_f64("--max-seconds", optarg, 0, 1e9, &o->max_seconds)); break;
        case O_TP: FLAG(target_precision_parse(optarg, &o->precision)); break;
        case 'h': case O_HELP: regen_usage(stdout); return 0;
        default: regen_usage(stderr); return 2;
        }
    }
#undef FLAG
    if (optind < argc) { fprintf(stderr, "regen: unexpected argument '%s'\n", argv[optind]); return 2; }
    if (!o->data || !o->out_path) { cli_error("regen", "--data and --out are required"); return 2; }
    if (o->max_new >= o->max_ctx) { cli_error("regen", "--max-new-tokens must be below --max-ctx"); return 2; }
    if (strcmp(o->device, "cpu") && strcmp(o->device, "cuda")) { cli_error("regen", "--device: expected cpu or cuda"); return 2; }
    if (!o->model[0] && paths_default_model(o->model, sizeof o->model) < 0) return log_rc(DL_ERANGE, "default model path"), 1;
    return -1;
}

/* Counts and checks the samples OUT already holds (*have) and cuts a partial
 * last line. Returns -1 to go on, else the exit code: 1 on error, 0 when OUT
 * already holds --limit samples. */
static int regen_resume(const regen_opts_t *o, int64_t *have_out) {
    int rc0;
    off_t tail_off, tail_len;
    int64_t have = resume_prepare(o->out_path, &tail_off, &tail_len);
    if (have < 0) return log_rc((int)have, "regen"), 1;
    if (have > 0 && (rc0 = resume_validate(o->out_path, have)) < 0) return log_rc(rc0, "regen"), 1;
    if (tail_len > 0 && (rc0 = resume_drop_tail(o->out_path, tail_off, tail_len)) < 0) return log_rc(rc0, "regen"), 1;
    *have_out = have;
    if (have >= o->limit) {
        log_info("%s already holds %lld samples (--limit %lld): nothing to do", o->out_path, (long long)have,
                 (long long)o->limit);
        return 0;
    }
    return -1;
}

/* Allocates the batch, loads the tokenizer, the prompt reader, the target and
 * the generator, sets the sampling parameters and opens OUT for appending.
 * r->ops is initialised. Returns 0, or the exit code (1 after logging why, 2
 * when --max-ctx exceeds the model's context). */
static int regen_open(const regen_opts_t *o, regen_t *r) {
    int rc, batch = o->batch;
    r->sb = calloc((size_t)batch, sizeof *r->sb);
    r->ids = calloc((size_t)batch, sizeof *r->ids);
    r->gen = calloc((size_t)batch, sizeof *r->gen);
    r->gen_len = calloc((size_t)batch, sizeof *r->gen_len), r->lens = calloc((size_t)batch, sizeof *r->lens);
    r->pp = calloc((size_t)batch, sizeof *r->pp);
    r->who = calloc((size_t)batch, sizeof *r->who);
    if (!r->sb || !r->ids || !r->gen || !r->gen_len || !r->lens || !r->pp || !r->who) return log_rc(DL_ENOMEM, "regen"), 1;
    if ((rc = tok_load(o->model, &r->tok)) < 0) return log_rc(rc, "tokenizer"), 1;
    if ((rc = chat_template_from_tok(r->tok, &r->ct)) < 0) return log_rc(rc, "chat template"), 1;
    if ((rc = prompt_reader_open(o->data, &r->rd)) < 0) return log_rc(rc, "--data"), 1;
    int budget = o->max_ctx > batch ? o->max_ctx : batch;
    target_opts_t to = {.max_tokens = budget, .max_seqs = batch, .precision = o->precision};
    if ((rc = target_load(o->model, &r->ops, &to, &r->t)) < 0) return log_rc(rc, "loading the target"), 1;
    int max_pos = target_config(r->t)->max_pos;
    if (max_pos > 0 && o->max_ctx > max_pos) {
        fprintf(stderr, "regen: --max-ctx %d exceeds the model's context of %d tokens (max_position_embeddings / "
                "context_length); use --max-ctx <= %d\n", o->max_ctx, max_pos, max_pos);
        return 2;
    }
    if ((rc = generator_new(r->t, batch, o->max_ctx, &r->g)) < 0) return log_rc(rc, "generator"), 1;
    gen_params_t *gp = &r->gp;
    gen_params_default(r->t, gp);
    gp->max_new_tokens = o->max_new;
    gp->temperature = (float)o->temp;
    gp->top_p = (float)o->top_p;
    int32_t eos = tok_eos_id(r->tok);
    if (eos >= 0 && gp->n_stop < GEN_MAX_STOP) gp->stop_ids[gp->n_stop++] = eos;
    r->out_existed = access(o->out_path, F_OK) == 0;
    r->out = fopen(o->out_path, "a");
    if (!r->out) return log_rc(dl_seterr(DL_EIO, "--out %s: %s", o->out_path, strerror(errno)), "regen"), 1;
    if (r->have)
        log_info("resuming: %s holds %lld samples; skipping as many prompts of %s", o->out_path, (long long)r->have,
                 o->data);
    return 0;
}

/* Fills sb[0..*nb) with the next samples whose first turn fits, skipping the
 * ones OUT already holds; *eof = 1 at the end of the data. Returns 0, or 1
 * after logging why. */
static int regen_fill_batch(const regen_opts_t *o, regen_t *r, int *nb_out, int *eof) {
    int rc, nb = 0, fit_max = o->max_ctx - o->max_new;
    *nb_out = 0;
    while (nb < o->batch && r->written + nb < o->limit) {
        sample_t *s = &r->sb[nb];
        rc = prompt_reader_next(r->rd, &s->p);
        if (rc < 0) return log_rc(rc, "--data"), 1;
        if (rc == 0) { *eof = 1; break; }
        tok_ids_t tmp = {0};
        if ((rc = prompt_encode(&s->p, 1, NULL, &r->ct, r->tok, &tmp)) < 0) {
            tok_ids_free(&tmp);
            return log_rc(rc, "tokenizing"), 1;
        }
        int fits = (int)tmp.n <= fit_max;
        tok_ids_free(&tmp);
        if (!fits) {
            r->skipped_long++;
            log_warn("%s:%llu: first turn longer than --max-ctx - --max-new-tokens = %d tokens (skipped)",
                     o->data, (unsigned long long)s->p.line, fit_max);
            prompt_free(&s->p);
            continue;
        }
        if (r->index++ < r->have) { prompt_free(&s->p); continue; }
        s->n_turns = prompt_n_turns(&s->p);
        s->replies = calloc((size_t)s->n_turns, sizeof *s->replies);
        if (!s->replies) return log_rc(DL_ENOMEM, "regen"), 1;
        nb++;
        *nb_out = nb;
    }
    return 0;
}

/* Turn by turn: every sample of sb[0..nb) still going gets its next reply
 * (one batched generation per round). Returns 0, or 1 after logging why. */
static int regen_replies(const regen_opts_t *o, regen_t *r, int nb) {
    int rc;
    for (int round = 0;; round++) {
        int n = 0;
        for (int i = 0; i < nb; i++) {
            sample_t *s = &r->sb[i];
            if (s->n_done != round || round >= s->n_turns) continue;
            r->ids[n].n = 0;
            if ((rc = prompt_encode(&s->p, round + 1, (const char *const *)s->replies, &r->ct, r->tok, &r->ids[n])) < 0)
                return log_rc(rc, "tokenizing"), 1;
            if ((int)r->ids[n].n > o->max_ctx - o->max_new) { s->n_turns = round; continue; } /* ends here */
            r->pp[n] = r->ids[n].ids;
            r->lens[n] = (int)r->ids[n].n;
            r->who[n++] = i;
        }
        if (!n) return 0;
        r->gp.seed = rng_mix((uint64_t)o->seed, (uint64_t)(r->written), (uint64_t)round);
        if ((rc = generator_run(r->g, &r->gp, n, r->pp, r->lens, r->gen, r->gen_len, NULL, NULL, NULL)) < 0)
            return log_rc(rc, "generate"), 1;
        for (int j = 0; j < n; j++) {
            sample_t *s = &r->sb[r->who[j]];
            char *txt = NULL;
            size_t tl = 0;
            r->gen_tokens += r->gen_len[j];
            rc = tok_decode(r->tok, r->gen[j], (size_t)r->gen_len[j], 1, &txt, &tl);
            free(r->gen[j]);
            r->gen[j] = NULL;
            if (rc < 0) return log_rc(rc, "decode"), 1;
            s->replies[s->n_done] = utf8_clean(txt, tl);
            free(txt);
            if (!s->replies[s->n_done]) return log_rc(DL_ENOMEM, "regen"), 1;
            s->n_done++;
        }
    }
}

/* Appends sb[0..nb) to OUT, one flushed write per line (a kill leaves whole
 * lines, or one partial last line), freeing each sample written. Returns 0,
 * or 1 after logging why. */
static int regen_write_batch(const regen_opts_t *o, regen_t *r, int nb) {
    for (int i = 0; i < nb; i++) {
        char *line = sample_line(&r->sb[i]);
        if (!line) return log_rc(DL_ENOMEM, "regen"), 1;
        size_t ln = strlen(line);
        int bad = fwrite(line, 1, ln, r->out) != ln || fflush(r->out) != 0;
        free(line);
        if (bad) return log_rc(dl_seterr(DL_EIO, "--out %s: write: %s", o->out_path, strerror(errno)), "regen"), 1;
        r->written++;
        sample_free(&r->sb[i]);
    }
    return 0;
}

static void regen_free(const regen_opts_t *o, regen_t *r) {
    int batch = o->batch;
    if (r->out) fclose(r->out);
    for (int i = 0; r->sb && i < batch; i++) sample_free(&r->sb[i]);
    for (int i = 0; r->ids && i < batch; i++) tok_ids_free(&r->ids[i]);
    for (int i = 0; r->gen && i < batch; i++) free(r->gen[i]);
    free(r->sb), free(r->ids), free(r->gen), free(r->gen_len), free(r->lens), free(r->pp), free(r->who);
    prompt_reader_close(&r->rd);
    generator_destroy(&r->g);
    target_destroy(&r->t);
    tok_destroy(&r->tok);
    ops_ctx_destroy(&r->ops);
}

/* Batches until the data, --limit or --max-seconds ends it, then the end of
 * run checks. Returns the exit code. */
static int regen_loop(const regen_opts_t *o, regen_t *r) {
    r->written = r->have;
    double t0 = clock_mono_s();
    int eof = 0;
    while (!eof && r->written < o->limit) {
        /* --max-seconds: checked between batches, so a run always does its first batch (a
         * check before it raced the clock: a budget of a microsecond gave 0 or 1 batches) */
        if (o->max_seconds > 0 && r->written > r->have && clock_mono_s() - t0 >= o->max_seconds) {
            log_info("regen: --max-seconds %g reached; run again with the same flags to resume", o->max_seconds);
            break;
        }
        int nb = 0;
        if (regen_fill_batch(o, r, &nb, &eof)) return 1;
        if (!nb) break;
        if (regen_replies(o, r, nb) || regen_write_batch(o, r, nb)) return 1;
        double el = clock_mono_s() - t0;
        int64_t now = r->written - r->have;
        log_info("regen: %lld samples in %s (%lld this run, %.2f samples/s, %.1f generated tok/s)",
                 (long long)r->written, o->out_path, (long long)now, now / (el + 1e-9), r->gen_tokens / (el + 1e-9));
    }
    if (r->written == 0 && eof) {
        /* like prepare: a data set with no usable prompt is an error, not an empty success */
        log_rc(dl_seterr(DL_EFORMAT, "0 samples from %s (%llu bad records, %lld prompts longer than --max-ctx - "
                         "--max-new-tokens): nothing to regenerate", o->data,
                         (unsigned long long)prompt_reader_skipped(r->rd), (long long)r->skipped_long), "regen");
        fclose(r->out);
        r->out = NULL;
        if (!r->out_existed) unlink(o->out_path);
        return 1;
    }
    if (fsync(fileno(r->out)) != 0) log_warn("--out %s: fsync: %s", o->out_path, strerror(errno));
    log_info("regen done: %lld samples in %s (%lld written now in %.1f s; %lld prompts skipped as too long, %llu bad records)",
             (long long)r->written, o->out_path, (long long)(r->written - r->have), clock_mono_s() - t0,
             (long long)r->skipped_long, (unsigned long long)prompt_reader_skipped(r->rd));
    return 0;
}

int cmd_regen(int argc, char **argv) {
    regen_opts_t o;
    regen_t r;
    memset(&r, 0, sizeof r);
    int ret = regen_parse_flags(argc, argv, &o);
    /* passive OpenMP waits on shared cores; argv - 1: main passes argv + 1 */
    if (ret < 0 && !strcmp(o.device, "cpu") && ompwait_reexec_passive("/proc/self/exe", argv - 1) < 0) dl_clearerr();
    if (ret < 0) ret = regen_resume(&o, &r.have);
    if (ret >= 0) return ret;
    int rc;
    if ((rc = ops_init_named(&r.ops, o.device, o.gpu, o.threads)) < 0) return log_rc(rc, "--device"), 1;
    ret = regen_open(&o, &r);
    if (ret == 0) ret = regen_loop(&o, &r);
    regen_free(&o, &r);
    return ret;
}
