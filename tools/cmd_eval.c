/* draftline eval: speculative decoding with a DFlash drafter on a prompt set;
 * reports the acceptance length tau, its histogram, per-position acceptance,
 * decode tokens/s with and without the drafter, the speedup, and (greedy)
 * whether the output equals target-only decoding. See common/model/specdec.h. */
#include "tools/commands.h"

#include "common/base/cli.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/paths.h"
#include "common/data/chat.h"
#include "common/data/prompts.h"
#include "common/data/tokenizer.h"
#include "common/model/dflash_ckpt.h"
#include "common/model/specdec.h"
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
       O_NOBASE, O_MPT, O_JSON, O_VERB, O_REP, O_MAXS, O_HELP };

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

int cmd_eval(int argc, char **argv) {
    static const struct option opts[] = {
        {"target-model", 1, 0, O_TM}, {"drafter", 1, 0, O_DR}, {"data", 1, 0, O_DATA},
        {"num-prompts", 1, 0, O_NP}, {"max-new-tokens", 1, 0, O_MNT}, {"temperature", 1, 0, O_TEMP},
        {"seed", 1, 0, O_SEED}, {"device", 1, 0, O_DEV}, {"gpu", 1, 0, O_GPU},
        {"threads", 1, 0, O_THR}, {"drafter-layers", 1, 0, O_DL}, {"block-size", 1, 0, O_BS},
        {"no-baseline", 0, 0, O_NOBASE}, {"max-prompt-tokens", 1, 0, O_MPT}, {"json", 1, 0, O_JSON},
        {"verbose", 0, 0, O_VERB}, {"timing-repeats", 1, 0, O_REP}, {"max-seconds", 1, 0, O_MAXS},
        {"help", 0, 0, O_HELP}, {0, 0, 0, 0}};
    char model[4096] = "";
    const char *drafter_arg = NULL, *data = NULL, *json_out = NULL, *device = "cpu";
    int n_prompts = 10, max_new = 128, gpu = 0, threads = 0, dlayers = 1, bsize = 8, baseline = 1;
    int max_prompt = 2048, verbose = 0, repeats = 0, c;
    double temp = 0, max_seconds = 0;
    int64_t seed = 0;
    optind = 1;
#define FLAG(call) do { if ((call) < 0) { cli_error("eval", dl_errmsg()); return 2; } } while (0)
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_TM: snprintf(model, sizeof model, "%s", optarg); break;
        case O_DR: drafter_arg = optarg; break;
        case O_DATA: data = optarg; break;
        case O_NP: FLAG(cli_parse_int("--num-prompts", optarg, 1, 1 << 20, &n_prompts)); break;
        case O_MNT: FLAG(cli_parse_int("--max-new-tokens", optarg, 1, 1 << 16, &max_new)); break;
        case O_TEMP: FLAG(cli_parse_f64("--temperature", optarg, 0, 100, &temp)); break;
        case O_SEED: FLAG(cli_parse_i64("--seed", optarg, 0, INT64_MAX, &seed)); break;
        case O_DEV: device = optarg; break;
        case O_GPU: FLAG(cli_parse_int("--gpu", optarg, 0, 1023, &gpu)); break;
        case O_THR: FLAG(cli_parse_int("--threads", optarg, 1, 1024, &threads)); break;
        case O_DL: FLAG(cli_parse_int("--drafter-layers", optarg, 1, DRAFTER_MAX_LAYERS, &dlayers)); break;
        case O_BS: FLAG(cli_parse_int("--block-size", optarg, 2, DRAFTER_MAX_BLOCK, &bsize)); break;
        case O_NOBASE: baseline = 0; break;
        case O_MPT: FLAG(cli_parse_int("--max-prompt-tokens", optarg, 1, 1 << 20, &max_prompt)); break;
        case O_JSON: json_out = optarg; break;
        case O_VERB: verbose = 1; break;
        case O_REP: FLAG(cli_parse_int("--timing-repeats", optarg, 1, SPECDEC_MAX_REPEATS, &repeats)); break;
        case O_MAXS: FLAG(cli_parse_f64("--max-seconds", optarg, 0, 1e9, &max_seconds)); break;
        case 'h': case O_HELP: eval_usage(stdout); return 0;
        default: eval_usage(stderr); return 2;
        }
    }
#undef FLAG
    if (optind < argc) { fprintf(stderr, "eval: unexpected argument '%s'\n", argv[optind]); return 2; }
    if (!drafter_arg) { cli_error("eval", "--drafter is required (a checkpoint dir, random or zero)"); return 2; }
    if (!data) { cli_error("eval", "--data is required"); return 2; }
    if (strcmp(device, "cpu") && strcmp(device, "cuda")) { cli_error("eval", "--device: expected cpu or cuda"); return 2; }
    if (!model[0] && paths_default_model(model, sizeof model) < 0) return log_rc(DL_ERANGE, "default model path"), 1;
    int is_random = !strcmp(drafter_arg, "random"), is_zero = !strcmp(drafter_arg, "zero");
    static char resolved[4096];
    if (!is_random && !is_zero) { /* a run dir (`run --out DIR`): its latest checkpoint */
        char cfgp[4200];
        snprintf(cfgp, sizeof cfgp, "%s/config.json", drafter_arg);
        if (access(cfgp, F_OK) != 0 && ckpt_resolve(drafter_arg, resolved, sizeof resolved) == 0) {
            log_info("--drafter %s: a run dir, evaluating its latest checkpoint %s", drafter_arg, resolved);
            drafter_arg = resolved;
        }
    }
    if (json_out && eval_check_out(json_out) < 0) { cli_error("eval", dl_errmsg()); return 2; }

    int rc, ret = 1;
    ops_ctx_t ops;
    if ((rc = ops_init_named(&ops, device, gpu, threads)) < 0) return log_rc(rc, "--device"), 1;
    tok_t *tok = NULL;
    target_t *t = NULL;
    drafter_t *d = NULL;
    specdec_t *s = NULL;
    prompt_set_t ps = {0};
    tok_ids_t *ids = NULL;
    const int32_t **pp = NULL;
    int *pl = NULL, np = 0, max_len = 0;
    float *zeros = NULL;
    drafter_config_t dc;
    if (is_random || is_zero) {
        model_config_t mc;
        if ((rc = pipe_target_config(model, &mc)) < 0) { log_rc(rc, "target config"); goto done; }
        if ((rc = pipe_drafter_config(&mc, dlayers, 0, bsize, &dc)) < 0) { log_rc(rc, "drafter config"); goto done; }
    } else if ((rc = dflash_config_load(drafter_arg, &dc)) < 0) {
        log_rc(rc, "--drafter");
        goto done;
    }
    if ((rc = tok_load(model, &tok)) < 0) { log_rc(rc, "tokenizer"); goto done; }
    chat_template_t ct;
    if ((rc = chat_template_from_tok(tok, &ct)) < 0) { log_rc(rc, "chat template"); goto done; }
    if ((rc = prompt_set_load(data, n_prompts, &ps)) < 0) { log_rc(rc, "--data"); goto done; }
    ids = calloc((size_t)ps.n, sizeof *ids);
    pp = calloc((size_t)ps.n, sizeof *pp);
    pl = calloc((size_t)ps.n, sizeof *pl);
    if (!ids || !pp || !pl) { log_rc(DL_ENOMEM, "eval"); goto done; }
    for (int i = 0; i < ps.n; i++) {
        if ((rc = prompt_encode(&ps.items[i], 1, NULL, &ct, tok, &ids[i])) < 0) { log_rc(rc, "tokenizing a prompt"); goto done; }
        if ((int)ids[i].n > max_prompt) { log_warn("prompt %d: %zu tokens > --max-prompt-tokens %d (skipped)", i, ids[i].n, max_prompt); continue; }
        pp[np] = ids[i].ids;
        pl[np] = (int)ids[i].n;
        if (pl[np] > max_len) max_len = pl[np];
        np++;
    }
    if (!np) { log_rc(DL_EINVAL, "no prompt fits --max-prompt-tokens"); goto done; }
    target_opts_t to = {.max_tokens = max_len > dc.B ? max_len : dc.B, .max_seqs = 1, .n_capture = dc.n_feat};
    memcpy(to.capture_ids, dc.target_layer_ids, (size_t)dc.n_feat * sizeof(int));
    double t0 = clock_mono_s();
    if ((rc = target_load(model, &ops, &to, &t)) < 0) { log_rc(rc, "loading the target"); goto done; }
    if ((rc = specdec_check_compat(&dc, target_config(t))) < 0) { log_rc(rc, "drafter vs target"); goto done; }
    dc.loss_chunk_blocks = 1;
    if ((rc = drafter_new(&ops, &dc, target_embed(t), target_lm_head(t), 1, 1, (uint64_t)seed, &d)) < 0) { log_rc(rc, "drafter"); goto done; }
    if (is_zero) {
        zeros = calloc(drafter_n_params(d), sizeof(float));
        if (!zeros) { log_rc(DL_ENOMEM, "zero drafter"); goto done; }
        drafter_upload_master(d, zeros);
    } else if (!is_random && (rc = dflash_ckpt_load_weights(d, drafter_arg)) < 0) {
        log_rc(rc, "loading the drafter weights");
        goto done;
    }
    log_info("target %s (%d layers, D %d) and drafter %s (%d layers, B %d, layers [%d..], mask %d) on %s in %.2f s; %d prompts from %s (%s)",
             model, target_config(t)->L, target_config(t)->D, drafter_arg, dc.n_layers, dc.B,
             dc.target_layer_ids[0], dc.mask_token_id, ops.impl->name, clock_mono_s() - t0, np, data,
             prompt_kind_name(ps.items[0].kind));
    int max_pos = target_config(t)->max_pos;
    if (max_pos > 0 && max_len + max_new > max_pos) {
        fprintf(stderr, "eval: --max-new-tokens %d: the longest prompt (%d tokens) + %d = %d tokens exceeds the target's "
                "context of %d tokens (max_position_embeddings / context_length); lower --max-new-tokens or "
                "--max-prompt-tokens\n", max_new, max_len, max_new, max_len + max_new, max_pos);
        ret = 2;
        goto done;
    }
    if ((rc = specdec_new(t, d, max_len + max_new + 1, &s)) < 0) { log_rc(rc, "speculative decoder"); goto done; }
    specdec_eval_opts_t eo;
    specdec_eval_opts_default(&eo);
    eo.max_new_tokens = max_new;
    eo.temperature = (float)temp;
    eo.seed = (uint64_t)seed;
    eo.baseline = baseline;
    eo.verbose = verbose;
    eo.timing_repeats = repeats ? repeats : baseline ? 3 : 1;
    eo.max_seconds = max_seconds;
    specdec_eval_result_t r;
    if ((rc = specdec_eval(s, &eo, np, pp, pl, &r)) < 0) { log_rc(rc, "eval"); goto done; }

    const specdec_stats_t *st = &r.spec;
    int B = dc.B;
    printf("eval: %d prompts (%s), %lld prompt tokens, %lld new tokens, temperature %g, block size %d\n",
           r.n_prompts, prompt_kind_name(ps.items[0].kind), (long long)st->prompt_tokens,
           (long long)st->new_tokens, temp, B);
    if (r.stopped_early)
        printf("stopped early: --max-seconds %g reached after %d of %d prompts\n", max_seconds, r.n_prompts, np);
    printf("tau (mean tokens accepted per verify step, bonus included): %.3f over %lld steps\n", r.tau,
           (long long)st->steps);
    printf("accepted length histogram:");
    for (int m = 1; m <= B; m++)
        printf(" %d:%lld(%.1f%%)", m, (long long)st->hist[m], st->steps ? 100.0 * st->hist[m] / st->steps : 0.0);
    printf("\nper-position acceptance (draft token k accepted, of all steps):");
    for (int k = 1; k < B; k++) printf(" %d:%.3f", k, st->steps ? (double)st->pos_accept[k] / st->steps : 0.0);
    printf("\ndecode with drafter: %.1f tok/s (%.2f s: draft %.2f s, verify %.2f s; per prompt the median of %d timed run%s)\n",
           r.spec_tok_s, st->decode_s, st->draft_s, st->verify_s, r.timing_repeats, r.timing_repeats == 1 ? "" : "s");
    if (baseline) {
        char note[200];
        const char *why = eval_timing_note(r.tau, r.speedup, note, sizeof note);
        printf("decode target only: %.1f tok/s (%.2f s); speedup %.2fx%s%s%s\n", r.base_tok_s, r.base_decode_s,
               r.speedup, why ? " (timing unreliable: " : "", why ? why : "", why ? ")" : "");
        if (r.n_compared)
            printf("greedy check: %d/%d prompts identical to target-only decoding%s\n", r.n_matched,
                   r.n_compared, r.n_matched == r.n_compared ? "" : " (MISMATCH)");
    }
    if (json_out) {
        char *js = specdec_result_json(&r, B);
        FILE *f = js ? fopen(json_out, "w") : NULL;
        if (!f || fprintf(f, "%s\n", js) < 0 || fclose(f) != 0) {
            free(js);
            log_rc(dl_seterr(DL_EIO, "--json %s: cannot write", json_out), "eval");
            goto done;
        }
        free(js);
    }
    ret = (r.n_compared && r.n_matched != r.n_compared) ? 1 : 0;  /* a failed greedy check fails the command */
done:
    if (ids)
        for (int i = 0; i < ps.n; i++) tok_ids_free(&ids[i]);
    free(ids);
    free(pp);
    free(pl);
    free(zeros);
    prompt_set_free(&ps);
    specdec_destroy(&s);
    drafter_destroy(&d);
    target_destroy(&t);
    tok_destroy(&tok);
    ops_ctx_destroy(&ops);
    return ret;
}
