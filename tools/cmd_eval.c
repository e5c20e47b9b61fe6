/* draftline eval: speculative decoding with a DFlash drafter on a prompt set;
 * reports the acceptance length tau, its histogram, per-position acceptance,
 * decode tokens/s with and without the drafter, the speedup, and (greedy)
 * whether the output equals target-only decoding. See common/model/specdec.h. */
#include "tools/commands.h"

#include "common/base/cli.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/ompwait.h"
#include "common/base/paths.h"
#include "common/data/chat.h"
#include "common/data/prompts.h"
#include "common/data/tokenizer.h"
#include "common/model/dflash_ckpt.h"
#include "common/model/specdec.h"
#include "common/model/target.h"
#include "common/pipe/ckpt.h"
#include "common/pipe/model.h"

#include <getopt.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void eval_usage(FILE *f) {
    fprintf(f,
            "usage: draftline eval --drafter DIR|random|zero --data PROMPTS [options]\n\n"
            "Speculative decoding with a DFlash drafter over a prompt set (first user turn,\n"
            "chat template applied), and target-only decoding of the same prompts.\n\n"
            "  --target-model PATH    .gguf or HF model dir (default: the embedded SmolLM2)\n"
            "  --drafter DIR          DFlash checkpoint dir (config.json + model.safetensors),\n"
            "                         or a run dir (its checkpoints/latest);\n"
            "                         'random' = fresh random weights (seeded), 'zero' = all\n"
            "                         weights zero (deliberately wrong)\n"
            "  --data PROMPTS         MT-Bench question.jsonl, HumanEval.jsonl.gz, GSM8K jsonl,\n"
            "                         or OpenAI/ShareGPT jsonl (auto-detected per record)\n"
            "  --num-prompts K        first K prompts (default 10)\n"
            "  --max-new-tokens N     per prompt (default 128); the longest prompt + N must fit the\n"
            "                         target's context (max_position_embeddings), else an error (exit 2)\n"
            "  --temperature T        0 = greedy (default); > 0: rejection sampling\n"
            "  --seed S               sampling / random-drafter seed (default 0)\n"
            "  --device cpu|cuda      (default cpu)    --gpu N   CUDA device (default 0)\n"
            "  --target-precision P   bf16 (default) or fp8: the target's decoder linears in E4M3 with\n"
            "                         per-channel/per-token scales (CUDA: sm_89+; CPU: fp32 emulation;\n"
            "                         MoE targets refused; see `draftline run --help`)\n"
            "  --threads N            CPU threads (default: all cores)\n"
            "  --drafter-layers N     random/zero drafter: layers (default 1, as `run`)\n"
            "  --block-size B         random/zero drafter: block size (default 8, as `run`)\n"
            "  --no-baseline          skip target-only decoding (no speedup / greedy check)\n"
            "  --timing-repeats N     run each prompt's two decodes N times (interleaved) and\n"
            "                         count, per prompt and side, the run with the median\n"
            "                         decode time: tokens/s = tokens / sum of medians (default\n"
            "                         3; 1 with --no-baseline); tau is the same for every run\n"
            "  --max-seconds S        start no new prompt after S s of decoding; the report\n"
            "                         covers the prompts done (default 0 = no limit)\n"
            "  --max-prompt-tokens N  skip longer prompts (default 2048)\n"
            "  --json OUT             write the report as JSON\n"
            "  --verbose              one line per prompt\n");
}

enum { O_TM = 256, O_DR, O_DATA, O_NP, O_MNT, O_TEMP, O_SEED, O_DEV, O_GPU, O_THR, O_DL, O_BS,
       O_NOBASE, O_MPT, O_JSON, O_VERB, O_REP, O_MAXS, O_HELP, O_TP };

/* 0 when path can be written (its directory exists and is writable, and path
 * is not a directory / read-only file), else DL_EIO naming it: checked before
 * the minutes of evaluation, not after. */
static int eval_check_out(const char *path) {
    char dir[4096];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s", path);
    char *sl = strrchr(dir, '/');
    if (!sl) snprintf(dir, sizeof dir, ".");
    else if (sl == dir) dir[1] = 0;
    else *sl = 0;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dl_seterr(DL_EIO, "--json %s: directory %s does not exist", path, dir);
    if (access(dir, W_OK | X_OK) != 0) return dl_seterr(DL_EIO, "--json %s: directory %s is not writable", path, dir);
    if (stat(path, &sb) == 0 && (S_ISDIR(sb.st_mode) || access(path, W_OK) != 0))
        return dl_seterr(DL_EIO, "--json %s: %s", path, S_ISDIR(sb.st_mode) ? "is a directory" : "not writable");
    return 0;
}

/* A reason the speedup figure is not to be trusted, or NULL: a drafter that
 * accepts almost nothing (tau < 1.05) cannot speed decoding up, so a speedup
 * above 1 then is timing noise; a load average above the core count means the
 * two decodes shared the cores with other work. */
static const char *eval_timing_note(double tau, double speedup, char *buf, size_t cap) {
    double la[1] = {0};
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (tau < 1.05 && speedup > 1.0) {
        snprintf(buf, cap, "tau %.3f < 1.05 cannot give a speedup above 1: the wall-clock figures are noise", tau);
        return buf;
    }
    if (getloadavg(la, 1) == 1 && ncpu > 0 && la[0] > (double)ncpu) {
        snprintf(buf, cap, "load average %.1f above %ld cores: both decodes shared the CPU with other work", la[0], ncpu);
        return buf;
    }
    return NULL;
}

/* The flags of `draftline eval`, after eval_parse_flags and eval_check_flags. */
typedef struct {
    char model[4096];                 /* target: .gguf or HF dir */
    char resolved[4096];              /* a run dir's latest checkpoint (drafter_arg points here) */
    const char *drafter_arg, *data, *json_out, *device;
    int n_prompts, max_new, gpu, threads, dlayers, bsize, baseline, max_prompt, verbose, repeats;
    int precision;                    /* --target-precision: TARGET_PRECISION_* */
    double temp, max_seconds;         /* temperature; --max-seconds in s */
    int64_t seed;
    int is_random, is_zero;           /* --drafter random | zero */
} eval_opts_t;

/* What one evaluation holds; released by eval_free. */
typedef struct {
    ops_ctx_t ops;
    tok_t *tok;
    target_t *t;
    drafter_t *d;
    specdec_t *s;
    prompt_set_t ps;
    tok_ids_t *ids;                   /* (ps.n) tokenized prompts */
    const int32_t **pp;               /* (np) prompts within --max-prompt-tokens */
    int *pl, np, max_len;             /* (np) their lengths; the longest */
    float *zeros;
    drafter_config_t dc;
} eval_t;

/* Parses argv into *o (defaults first). Returns -1 to go on, else the exit
 * code: 0 after --help, 2 for a bad flag. */
static int eval_parse_flags(int argc, char **argv, eval_opts_t *o) {
    static const struct option opts[] = {
        {"target-model", 1, 0, O_TM}, {"drafter", 1, 0, O_DR}, {"data", 1, 0, O_DATA},
        {"num-prompts", 1, 0, O_NP}, {"max-new-tokens", 1, 0, O_MNT}, {"temperature", 1, 0, O_TEMP},
        {"seed", 1, 0, O_SEED}, {"device", 1, 0, O_DEV}, {"gpu", 1, 0, O_GPU},
        {"threads", 1, 0, O_THR}, {"drafter-layers", 1, 0, O_DL}, {"block-size", 1, 0, O_BS},
        {"no-baseline", 0, 0, O_NOBASE}, {"max-prompt-tokens", 1, 0, O_MPT}, {"json", 1, 0, O_JSON},
        {"verbose", 0, 0, O_VERB}, {"timing-repeats", 1, 0, O_REP}, {"max-seconds", 1, 0, O_MAXS},
        {"target-precision", 1, 0, O_TP}, {"help", 0, 0, O_HELP}, {0, 0, 0, 0}};
    int c;
    memset(o, 0, sizeof *o);
    o->device = "cpu";
    o->n_prompts = 10, o->max_new = 128, o->dlayers = 1, o->bsize = 8, o->baseline = 1, o->max_prompt = 2048;
    optind = 1;
#define FLAG(call) do { if ((call) < 0) { cli_error("eval", dl_errmsg()); return 2; } } while (0)
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_TM: snprintf(o->model, sizeof o->model, "%s", optarg); break;
        case O_DR: o->drafter_arg = optarg; break;
        case O_DATA: o->data = optarg; break;
        case O_NP: FLAG(cli_parse_int("--num-prompts", optarg, 1, 1 << 20, &o->n_prompts)); break;
        case O_MNT: FLAG(cli_parse_int("--max-new-tokens", optarg, 1, 1 << 16, &o->max_new)); break;
        case O_TEMP: FLAG(cli_parse_f64("--temperature", optarg, 0, 100, &o->temp)); break;
        case O_SEED: FLAG(cli_parse_i64("--seed", optarg, 0, INT64_MAX, &o->seed)); break;
        case O_DEV: o->device = optarg; break;
        case O_GPU: FLAG(cli_parse_int("--gpu", optarg, 0, 1023, &o->gpu)); break;
        case O_THR: FLAG(cli_parse_int("--threads", optarg, 1, 1024, &o->threads)); break;
        case O_DL: FLAG(cli_parse_int("--drafter-layers", optarg, 1, DRAFTER_MAX_LAYERS, &o->dlayers)); break;
        case O_BS: FLAG(cli_parse_int("--block-size", optarg, 2, DRAFTER_MAX_BLOCK, &o->bsize)); break;
        case O_NOBASE: o->baseline = 0; break;
        case O_MPT: FLAG(cli_parse_int("--max-prompt-tokens", optarg, 1, 1 << 20, &o->max_prompt)); break;
        case O_JSON: o->json_out = optarg; break;
        case O_VERB: o->verbose = 1; break;
        case O_REP: FLAG(cli_parse_int("--timing-repeats", optarg, 1, SPECDEC_MAX_REPEATS, &o->repeats)); break;
        case O_MAXS: FLAG(cli_parse_f64("--max-seconds", optarg, 0, 1e9, &o->max_seconds)); break;
        case O_TP: FLAG(target_precision_parse(optarg, &o->precision)); break;
        case 'h': case O_HELP: eval_usage(stdout); return 0;
        default: eval_usage(stderr); return 2;
        }
    }
#undef FLAG
    if (optind < argc) { fprintf(stderr, "eval: unexpected argument '%s'\n", argv[optind]); return 2; }
    return -1;
}

/* Required flags, the device, the default model, a run dir as --drafter (its
 * latest checkpoint) and a writable --json. Returns -1 to go on, else the exit
 * code (2 for a flag, 1 without a default model path). */
static int eval_check_flags(eval_opts_t *o) {
    if (!o->drafter_arg) { cli_error("eval", "--drafter is required (a checkpoint dir, random or zero)"); return 2; }
    if (!o->data) { cli_error("eval", "--data is required"); return 2; }
    if (strcmp(o->device, "cpu") && strcmp(o->device, "cuda")) { cli_error("eval", "--device: expected cpu or cuda"); return 2; }
    if (!o->model[0] && paths_default_model(o->model, sizeof o->model) < 0) return log_rc(DL_ERANGE, "default model path"), 1;
    o->is_random = !strcmp(o->drafter_arg, "random"), o->is_zero = !strcmp(o->drafter_arg, "zero");
    if (!o->is_random && !o->is_zero) { /* a run dir (`run --out DIR`): its latest checkpoint */
        char cfgp[4200];
        snprintf(cfgp, sizeof cfgp, "%s/config.json", o->drafter_arg);
        if (access(cfgp, F_OK) != 0 && ckpt_resolve(o->drafter_arg, o->resolved, sizeof o->resolved) == 0) {
            log_info("--drafter %s: a run dir, evaluating its latest checkpoint %s", o->drafter_arg, o->resolved);
            o->drafter_arg = o->resolved;
        }
    }
    if (o->json_out && eval_check_out(o->json_out) < 0) { cli_error("eval", dl_errmsg()); return 2; }
    return -1;
}

/* The drafter's config (from the checkpoint, or as `run` would make it for
 * random/zero), the tokenizer and the prompts within --max-prompt-tokens.
 * Returns 0, or 1 after logging why. */
static int eval_load_prompts(const eval_opts_t *o, eval_t *e) {
    int rc;
    if (o->is_random || o->is_zero) {
        model_config_t mc;
        if ((rc = pipe_target_config(o->model, &mc)) < 0) return log_rc(rc, "target config"), 1;
        if ((rc = pipe_drafter_config(&mc, o->dlayers, 0, o->bsize, &e->dc)) < 0) return log_rc(rc, "drafter config"), 1;
    } else if ((rc = dflash_config_load(o->drafter_arg, &e->dc)) < 0) {
        log_rc(rc, "--drafter");
        return 1;
    }
    if ((rc = tok_load(o->model, &e->tok)) < 0) return log_rc(rc, "tokenizer"), 1;
    chat_template_t ct;
    if ((rc = chat_template_from_tok(e->tok, &ct)) < 0) return log_rc(rc, "chat template"), 1;
    if ((rc = prompt_set_load(o->data, o->n_prompts, &e->ps)) < 0) return log_rc(rc, "--data"), 1;
    e->ids = calloc((size_t)e->ps.n, sizeof *e->ids);
    e->pp = calloc((size_t)e->ps.n, sizeof *e->pp);
    e->pl = calloc((size_t)e->ps.n, sizeof *e->pl);
    if (!e->ids || !e->pp || !e->pl) return log_rc(DL_ENOMEM, "eval"), 1;
    for (int i = 0; i < e->ps.n; i++) {
        tok_ids_t *id = &e->ids[i];
        if ((rc = prompt_encode(&e->ps.items[i], 1, NULL, &ct, e->tok, id)) < 0) return log_rc(rc, "tokenizing a prompt"), 1;
        if ((int)id->n > o->max_prompt) { log_warn("prompt %d: %zu tokens > --max-prompt-tokens %d (skipped)", i, id->n, o->max_prompt); continue; }
        e->pp[e->np] = id->ids;
        e->pl[e->np] = (int)id->n;
        if (e->pl[e->np] > e->max_len) e->max_len = e->pl[e->np];
        e->np++;
    }
    if (!e->np) return log_rc(DL_EINVAL, "no prompt fits --max-prompt-tokens"), 1;
    return 0;
}

/* Loads the target and the drafter (checkpoint weights, random, or zero) and
 * makes the speculative decoder. Returns 0, 1 after logging why, or 2 when
 * the longest prompt + --max-new-tokens exceeds the target's context. */
static int eval_load_models(const eval_opts_t *o, eval_t *e) {
    int rc;
    drafter_config_t *dc = &e->dc;
    target_opts_t to = {.max_tokens = e->max_len > dc->B ? e->max_len : dc->B, .max_seqs = 1, .n_capture = dc->n_feat,
                        .precision = o->precision};
    memcpy(to.capture_ids, dc->target_layer_ids, (size_t)dc->n_feat * sizeof(int));
    double t0 = clock_mono_s();
    if ((rc = target_load(o->model, &e->ops, &to, &e->t)) < 0) return log_rc(rc, "loading the target"), 1;
    if ((rc = specdec_check_compat(dc, target_config(e->t))) < 0) return log_rc(rc, "drafter vs target"), 1;
    dc->loss_chunk_blocks = 1;
    if ((rc = drafter_new(&e->ops, dc, target_embed(e->t), target_lm_head(e->t), 1, 1, (uint64_t)o->seed, &e->d)) < 0)
        return log_rc(rc, "drafter"), 1;
    if (o->is_zero) {
        e->zeros = calloc(drafter_n_params(e->d), sizeof(float));
        if (!e->zeros) return log_rc(DL_ENOMEM, "zero drafter"), 1;
        drafter_upload_master(e->d, e->zeros);
    } else if (!o->is_random && (rc = dflash_ckpt_load_weights(e->d, o->drafter_arg)) < 0) {
        log_rc(rc, "loading the drafter weights");
        return 1;
    }
    log_info("target %s (%d layers, D %d) and drafter %s (%d layers, B %d, layers [%d..], mask %d) on %s in %.2f s; %d prompts from %s (%s)",
             o->model, target_config(e->t)->L, target_config(e->t)->D, o->drafter_arg, dc->n_layers, dc->B,
             dc->target_layer_ids[0], dc->mask_token_id, e->ops.impl->name, clock_mono_s() - t0, e->np, o->data,
             prompt_kind_name(e->ps.items[0].kind));
    int max_pos = target_config(e->t)->max_pos, max_len = e->max_len, max_new = o->max_new;
    if (max_pos > 0 && max_len + max_new > max_pos) {
        fprintf(stderr, "eval: --max-new-tokens %d: the longest prompt (%d tokens) + %d = %d tokens exceeds the target's "
                "context of %d tokens (max_position_embeddings / context_length); lower --max-new-tokens or "
                "--max-prompt-tokens\n", max_new, max_len, max_new, max_len + max_new, max_pos);
        return 2;
    }
    if ((rc = specdec_new(e->t, e->d, max_len + max_new + 1, &e->s)) < 0) return log_rc(rc, "speculative decoder"), 1;
    return 0;
}

/* Prints the report of r (and writes it to --json). Returns the exit code: 1
 * when --json cannot be written or the greedy check failed, else 0. */
static int eval_report(const eval_opts_t *o, const eval_t *e, const specdec_eval_result_t *r) {
    const specdec_stats_t *st = &r->spec;
    int B = e->dc.B;
    printf("eval: %d prompts (%s), %lld prompt tokens, %lld new tokens, temperature %g, block size %d\n",
           r->n_prompts, prompt_kind_name(e->ps.items[0].kind), (long long)st->prompt_tokens,
           (long long)st->new_tokens, o->temp, B);
    if (r->stopped_early)
        printf("stopped early: --max-seconds %g reached after %d of %d prompts\n", o->max_seconds, r->n_prompts, e->np);
    printf("tau (mean tokens accepted per verify step, bonus included): %.3f over %lld steps\n", r->tau,
           (long long)st->steps);
    printf("accepted length histogram:");
    for (int m = 1; m <= B; m++)
        printf(" %d:%lld(%.1f%%)", m, (long long)st->hist[m], st->steps ? 100.0 * st->hist[m] / st->steps : 0.0);
    printf("\nper-position acceptance (draft token k accepted, of all steps):");
    for (int k = 1; k < B; k++) printf(" %d:%.3f", k, st->steps ? (double)st->pos_accept[k] / st->steps : 0.0);
    printf("\ndecode with drafter: %.1f tok/s (%.2f s: draft %.2f s, verify %.2f s; per prompt the median of %d timed run%s)\n",
           r->spec_tok_s, st->decode_s, st->draft_s, st->verify_s, r->timing_repeats, r->timing_repeats == 1 ? "" : "s");
    if (o->baseline) {
        char note[200];
        const char *why = eval_timing_note(r->tau, r->speedup, note, sizeof note);
        printf("decode target only: %.1f tok/s (%.2f s); speedup %.2fx%s%s%s\n", r->base_tok_s, r->base_decode_s,
               r->speedup, why ? " (timing unreliable: " : "", why ? why : "", why ? ")" : "");
        if (r->n_compared)
            printf("greedy check: %d/%d prompts identical to target-only decoding%s\n", r->n_matched,
                   r->n_compared, r->n_matched == r->n_compared ? "" : " (MISMATCH)");
    }
    if (o->json_out) {
        char *js = specdec_result_json(r, B);
        FILE *f = js ? fopen(o->json_out, "w") : NULL;
        if (!f || fprintf(f, "%s\n", js) < 0 || fclose(f) != 0) {
            free(js);
            log_rc(dl_seterr(DL_EIO, "--json %s: cannot write", o->json_out), "eval");
            return 1;
        }
        free(js);
    }
    return (r->n_compared && r->n_matched != r->n_compared) ? 1 : 0;  /* a failed greedy check fails the command */
}

static void eval_free(eval_t *e) {
    if (e->ids)
        for (int i = 0; i < e->ps.n; i++) tok_ids_free(&e->ids[i]);
    free(e->ids);
    free(e->pp);
    free(e->pl);
    free(e->zeros);
    prompt_set_free(&e->ps);
    specdec_destroy(&e->s);
    drafter_destroy(&e->d);
    target_destroy(&e->t);
    tok_destroy(&e->tok);
    ops_ctx_destroy(&e->ops);
}

int cmd_eval(int argc, char **argv) {
    eval_opts_t o;          /* o.drafter_arg may point into o.resolved */
    int ret = eval_parse_flags(argc, argv, &o);
    /* passive OpenMP waits on shared cores (argv - 1: main passes argv + 1); the re-exec
     * comes before the checks, so that their lines are said once */
    if (ret < 0 && !strcmp(o.device, "cpu") && ompwait_reexec_passive("/proc/self/exe", argv - 1) < 0)
        dl_clearerr();
    if (ret < 0) ret = eval_check_flags(&o);
    if (ret >= 0) return ret;

    eval_t e;
    memset(&e, 0, sizeof e);
    int rc;
    if ((rc = ops_init_named(&e.ops, o.device, o.gpu, o.threads)) < 0) return log_rc(rc, "--device"), 1;
    ret = eval_load_prompts(&o, &e);
    if (ret == 0) ret = eval_load_models(&o, &e);
    if (ret == 0) {
        specdec_eval_opts_t eo;
        specdec_eval_opts_default(&eo);
        eo.max_new_tokens = o.max_new;
        eo.temperature = (float)o.temp;
        eo.seed = (uint64_t)o.seed;
        eo.baseline = o.baseline;
        eo.verbose = o.verbose;
        eo.timing_repeats = o.repeats ? o.repeats : o.baseline ? 3 : 1;
        eo.max_seconds = o.max_seconds;
        specdec_eval_result_t r;
        if ((rc = specdec_eval(e.s, &eo, e.np, e.pp, e.pl, &r)) < 0) { log_rc(rc, "eval"); ret = 1; }
        else ret = eval_report(&o, &e, &r);
    }
    eval_free(&e);
    return ret;
}
