/* draftline generate: decode from the target with a KV cache (greedy or sampling),
 * chat template of the model family applied. */
#include "tools/commands.h"

#include "common/base/cli.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/ompwait.h"
#include "common/base/paths.h"
#include "common/data/chat.h"
#include "common/data/tokenizer.h"
#include "common/model/generate.h"
#include "common/model/target.h"
#include "common/ops/ops.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GEN_MAX_PROMPTS 64

static void generate_usage(FILE *f) {
    fprintf(f,
            "usage: draftline generate --prompt TEXT [--prompt TEXT ...] [options]\n\n"
            "Generates a reply per prompt (decoded together as one batch) with a KV cache.\n\n"
            "  --model PATH           .gguf or HF model directory (default: the embedded\n"
            "                         SmolLM2-135M-Instruct GGUF, see `make model`)\n"
            "  --device cpu|cuda      backend (default cpu)\n"
            "  --gpu N                CUDA device ordinal (default 0)\n"
            "  --target-precision P   bf16 (default) or fp8: the target's decoder linears in E4M3 with\n"
            "                         per-channel/per-token scales (CUDA: sm_89+; CPU: fp32 emulation;\n"
            "                         MoE targets refused; see `draftline run --help`)\n"
            "  --prompt TEXT          user message (repeat for a batch, at most %d)\n"
            "  --system TEXT          system message (default: the template's own, if any)\n"
            "  --raw                  no chat template: the prompt text is the model input\n"
            "  --chat-template NAME   chatml|qwen|smollm2|llama3 (default: from the model)\n"
            "  --max-new-tokens N     (default 128); the longest prompt + N must fit the model's\n"
            "                         context (max_position_embeddings), else an error (exit 2)\n"
            "  --temperature T        0 = greedy (default 0)\n"
            "  --top-p P              nucleus sampling mass (default 1)\n"
            "  --seed S               sampling seed (default 0)\n"
            "  --threads N            CPU threads (default: all cores)\n"
            "  --stats                print prefill / decode tokens/s to stderr\n",
            GEN_MAX_PROMPTS);
}

typedef struct {
    const tok_t *tok;
    int stream;       /* print tokens of sequence 0 as they come */
} stream_ctx_t;

static void on_token(int i, int32_t id, void *user) {
    stream_ctx_t *s = user;
    if (!s->stream || i != 0 || tok_is_special(s->tok, id)) return;
    size_t n;
    const char *b = tok_token_bytes(s->tok, id, &n);
    if (b) fwrite(b, 1, n, stdout);
    fflush(stdout);
}

int cmd_generate(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},       {"device", required_argument, 0, 'd'},
        {"gpu", required_argument, 0, 'g'},         {"prompt", required_argument, 0, 'p'},
        {"system", required_argument, 0, 'S'},      {"raw", no_argument, 0, 'r'},
        {"chat-template", required_argument, 0, 'c'}, {"max-new-tokens", required_argument, 0, 'n'},
        {"temperature", required_argument, 0, 'T'}, {"top-p", required_argument, 0, 'P'},
        {"seed", required_argument, 0, 's'},        {"threads", required_argument, 0, 't'},
        {"stats", no_argument, 0, 'x'},             {"help", no_argument, 0, 'h'},
        {"target-precision", required_argument, 0, 'Q'},
        {0, 0, 0, 0}};
    char model[4096] = "";
    const char *device = "cpu", *system = NULL, *tmpl = NULL;
    const char *prompts[GEN_MAX_PROMPTS];
    int n_prompts = 0, raw = 0, gpu = 0, threads = 0, max_new = 128, want_stats = 0, prec = 0;
    double temp = 0, top_p = 1;
    int64_t seed = 0;
    int c, rc;
    optind = 1;
#define FLAG(call) do { if ((call) < 0) { cli_error("generate", dl_errmsg()); return 2; } } while (0)
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': snprintf(model, sizeof model, "%s", optarg); break;
        case 'd': device = optarg; break;
        case 'g': FLAG(cli_parse_int("--gpu", optarg, 0, 1023, &gpu)); break;
        case 'p':
            if (n_prompts >= GEN_MAX_PROMPTS) { cli_error("generate", "--prompt: too many prompts"); return 2; }
            prompts[n_prompts++] = optarg;
            break;
        case 'S': system = optarg; break;
        case 'r': raw = 1; break;
        case 'c': tmpl = optarg; break;
        case 'n': FLAG(cli_parse_int("--max-new-tokens", optarg, 1, 1 << 20, &max_new)); break;
        case 'T': FLAG(cli_parse_f64("--temperature", optarg, 0, 100, &temp)); break;
        case 'P': FLAG(cli_parse_f64("--top-p", optarg, 1e-6, 1, &top_p)); break;
        case 's': FLAG(cli_parse_i64("--seed", optarg, 0, INT64_MAX, &seed)); break;
        case 't': FLAG(cli_parse_int("--threads", optarg, 1, 1024, &threads)); break;
        case 'x': want_stats = 1; break;
        case 'Q': FLAG(target_precision_parse(optarg, &prec)); break;
        case 'h': generate_usage(stdout); return 0;
        default: generate_usage(stderr); return 2;
        }
    }
#undef FLAG
    if (optind < argc) { fprintf(stderr, "generate: unexpected argument '%s'\n", argv[optind]); return 2; }
    if (!n_prompts) { cli_error("generate", "--prompt is required"); return 2; }
    if (strcmp(device, "cpu") && strcmp(device, "cuda")) { cli_error("generate", "--device: expected cpu or cuda"); return 2; }
    if (!model[0] && paths_default_model(model, sizeof model) < 0) return log_rc(DL_ERANGE, "default model path");

    ops_ctx_t ops;
    /* passive OpenMP waits on shared cores (SmolLM2 on 2 busy cores: 0.8 tok/s spinning,
     * 10 tok/s passive); argv - 1 is the front end's full argv (main passes argv + 1) */
    if (!strcmp(device, "cpu") && ompwait_reexec_passive("/proc/self/exe", argv - 1) < 0) dl_clearerr();
    if ((rc = ops_init_named(&ops, device, gpu, threads)) < 0) return log_rc(rc, "--device"), 1;
    tok_t *tok = NULL;
    target_t *t = NULL;
    generator_t *g = NULL;
    tok_ids_t ids[GEN_MAX_PROMPTS];
    memset(ids, 0, sizeof ids);
    int32_t *outs[GEN_MAX_PROMPTS] = {0};
    int out_len[GEN_MAX_PROMPTS] = {0}, ret = 1;
    if ((rc = tok_load(model, &tok)) < 0) {
        log_rc(rc, "loading the tokenizer");
        if (rc == DL_ENOENT) fprintf(stderr, "generate: run `make model` for the embedded model, or pass --model\n");
        goto done;
    }
    chat_template_t ct;
    if (!raw) {
        rc = tmpl ? chat_template_by_name(tmpl, &ct) : chat_template_from_tok(tok, &ct);
        if (rc < 0) { log_rc(rc, "chat template (use --chat-template or --raw)"); goto done; }
    }
    int max_len = 0, total = 0;
    for (int i = 0; i < n_prompts; i++) {
        if (raw) rc = tok_encode(tok, prompts[i], strlen(prompts[i]), 1, 0, &ids[i]);
        else {
            chat_msg_t msgs[2];
            int nm = 0;
            if (system) msgs[nm++] = (chat_msg_t){"system", system, strlen(system)};
            msgs[nm++] = (chat_msg_t){"user", prompts[i], strlen(prompts[i])};
            rc = chat_encode_prompt(&ct, tok, msgs, nm, &ids[i]);
        }
        if (rc < 0) { log_rc(rc, "tokenizing the prompt"); goto done; }
        if ((int)ids[i].n > max_len) max_len = (int)ids[i].n;
        total += (int)ids[i].n;
    }
    int budget = total < 4096 ? total : 4096;
    if (budget < n_prompts) budget = n_prompts;
    target_opts_t to = {.max_tokens = budget, .max_seqs = n_prompts, .precision = prec};
    double t0 = clock_mono_s();
    if ((rc = target_load(model, &ops, &to, &t)) < 0) { log_rc(rc, "loading the model"); goto done; }
    log_info("loaded %s (%s, %d layers, D %d, %.1f M params) on %s in %.2f s", model,
             model_family_name(target_config(t)->family), target_config(t)->L, target_config(t)->D,
             model_config_n_params(target_config(t)) / 1e6, ops.impl->name, clock_mono_s() - t0);
    int max_pos = target_config(t)->max_pos;
    if (max_pos > 0 && (int64_t)max_len + max_new > max_pos) {
        /* the KV cache holds prompt + new tokens; past the model's context the
         * positions are untrained (and --max-new-tokens 1048576 asked for gigabytes) */
        fprintf(stderr, "generate: --max-new-tokens %d: the longest prompt (%d tokens) + %d = %lld tokens exceeds the model's "
                "context of %d tokens (max_position_embeddings / context_length); use --max-new-tokens <= %d\n",
                max_new, max_len, max_new, (long long)max_len + max_new, max_pos, max_pos > max_len ? max_pos - max_len : 0);
        ret = 2;
        goto done;
    }
    if ((rc = generator_new(t, n_prompts, max_len + max_new, &g)) < 0) { log_rc(rc, "generator"); goto done; }
    gen_params_t gp;
    gen_params_default(t, &gp);
    gp.max_new_tokens = max_new;
    gp.temperature = (float)temp;
    gp.top_p = (float)top_p;
    gp.seed = (uint64_t)seed;
    int32_t eos = tok_eos_id(tok);
    if (eos >= 0 && gp.n_stop < GEN_MAX_STOP) gp.stop_ids[gp.n_stop++] = eos;
    const int32_t *pp[GEN_MAX_PROMPTS];
    int pl[GEN_MAX_PROMPTS];
    for (int i = 0; i < n_prompts; i++) { pp[i] = ids[i].ids; pl[i] = (int)ids[i].n; }
    stream_ctx_t sc = {tok, n_prompts == 1};
    gen_stats_t st;
    if ((rc = generator_run(g, &gp, n_prompts, pp, pl, outs, out_len, on_token, &sc, &st)) < 0) {
        log_rc(rc, "generate");
        goto done;
    }
    for (int i = 0; i < n_prompts; i++) {
        char *text = NULL;
        size_t tl;
        if ((rc = tok_decode(tok, outs[i], (size_t)out_len[i], 1, &text, &tl)) < 0) { log_rc(rc, "decode"); goto done; }
        if (n_prompts == 1) printf("\n");
        else printf("[%d] %s\n", i, text);
        free(text);
    }
    if (want_stats)
        fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens in %d steps, %.3f s "
                "(%.1f tok/s)\n", st.prompt_tokens, st.prefill_s, st.prompt_tokens / (st.prefill_s + 1e-12),
                st.new_tokens, st.decode_steps, st.decode_s,
                (st.new_tokens - n_prompts) / (st.decode_s + 1e-12));
    ret = 0;
done:
    for (int i = 0; i < n_prompts; i++) { tok_ids_free(&ids[i]); free(outs[i]); }
    generator_destroy(&g);
    target_destroy(&t);
    tok_destroy(&tok);
    ops_ctx_destroy(&ops);
    return ret;
}
