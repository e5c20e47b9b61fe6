/* draftline prepare: tokenize a chat dataset once into a .dlc cache. */
#include "tools/commands.h"

#include "common/base/cli.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/paths.h"
#include "common/data/chat.h"
#include "common/data/dataset.h"
#include "common/data/prepare.h"
#include "common/data/tokenizer.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static void prepare_usage(FILE *f) {
    fprintf(f,
            "usage: draftline prepare --data FILE --out FILE.dlc [options]\n\n"
            "Tokenizes a chat dataset once (all cores) into a memory-mappable cache of token ids,\n"
            "loss masks (1 on assistant tokens) and an offset index.\n\n"
            "  --model PATH           tokenizer source: .gguf, tokenizer.json or a HF model directory\n"
            "                         (default: the embedded SmolLM2-135M-Instruct GGUF)\n"
            "  --data FILE            .jsonl, .jsonl.gz or one JSON array file (.json)\n"
            "  --format F             auto|openai|sharegpt|text|fields (default auto)\n"
            "  --prompt-field X       with fields/auto: user turn field (e.g. question)\n"
            "  --response-field Y     with fields/auto: assistant turn field (e.g. answer)\n"
            "  --system-field Z       optional system prompt field\n"
            "  --chat-template NAME   chatml|qwen|smollm2|llama3 (default: from the model)\n"
            "  --strict               a bad record is fatal (default: reported and skipped)\n"
            "  --threads N            worker threads (default: all cores)\n"
            "  --out FILE             output cache (written atomically)\n");
}

int cmd_prepare(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},       {"data", required_argument, 0, 'd'},
        {"format", required_argument, 0, 'f'},      {"prompt-field", required_argument, 0, 'p'},
        {"response-field", required_argument, 0, 'r'}, {"system-field", required_argument, 0, 's'},
        {"chat-template", required_argument, 0, 'c'}, {"strict", no_argument, 0, 'S'},
        {"threads", required_argument, 0, 't'},     {"out", required_argument, 0, 'o'},
        {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
    char model[4096] = "";
    const char *data = NULL, *outp = NULL, *tmpl = NULL;
    prep_opts_t po = {0};
    int c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': snprintf(model, sizeof model, "%s", optarg); break;
        case 'd': data = optarg; break;
        case 'f':
            if (ds_parse_format(optarg, &po.ds.format) < 0) { cli_error("prepare", dl_errmsg()); return 2; }
            break;
        case 'p': po.ds.prompt_field = optarg; break;
        case 'r': po.ds.response_field = optarg; break;
        case 's': po.ds.system_field = optarg; break;
        case 'c': tmpl = optarg; break;
        case 'S': po.ds.strict = 1; break;
        case 't':
            if (cli_parse_int("--threads", optarg, 1, 1024, &po.n_threads) < 0) { cli_error("prepare", dl_errmsg()); return 2; }
            break;
        case 'o': outp = optarg; break;
        case 'h': prepare_usage(stdout); return 0;
        default: prepare_usage(stderr); return 2;
        }
    }
    if (optind < argc) { fprintf(stderr, "prepare: unexpected argument '%s'\n", argv[optind]); return 2; }
    if (!data || !outp) { cli_error("prepare", "--data and --out are required"); return 2; }
    if (po.ds.format == DS_FIELDS && (!po.ds.prompt_field || !po.ds.response_field)) {
        cli_error("prepare", "--format fields needs --prompt-field and --response-field");
        return 2;
    }
    if (!model[0] && paths_default_model(model, sizeof model) < 0) return log_rc(DL_ERANGE, "default model path");
    tok_t *t = NULL;
    if ((rc = tok_load(model, &t)) < 0) {
        log_rc(rc, "loading the tokenizer");
        if (rc == DL_ENOENT) fprintf(stderr, "prepare: run `make model` for the embedded model, or pass --model\n");
        return 1;
    }
    chat_template_t ct;
    rc = tmpl ? chat_template_by_name(tmpl, &ct) : chat_template_from_tok(t, &ct);
    if (rc < 0) {
        tok_destroy(&t);
        if (tmpl) { cli_error("prepare", dl_errmsg()); return 2; }
        log_rc(rc, "chat template");
        return 1;
    }
    po.data_path = data;
    po.out_path = outp;
    po.chat = &ct;
    log_info("tokenizer %s (%s pre-tokenizer, %d tokens), chat template %s%s", model, tok_pre_name(t),
             tok_n_vocab(t), chat_family_name(ct.family), ct.default_system[0] ? " + default system prompt" : "");
    prep_stats_t st;
    if ((rc = prep_cleanup_on_signal()) < 0) log_rc(rc, "prepare: signal handlers");   /* only the cleanup is lost */
    rc = prep_run(t, &po, &st);
    tok_destroy(&t);
    if (rc < 0) { log_rc(rc, "prepare"); return 1; }
    double mb = (double)st.bytes_in / 1e6;
    printf("prepared %s -> %s\n", data, outp);
    printf("  samples          %llu\n", (unsigned long long)st.samples);
    printf("  tokens           %llu (longest sample %u)\n", (unsigned long long)st.tokens, st.max_len);
    printf("  assistant tokens %llu (%.1f%%)\n", (unsigned long long)st.assistant_tokens,
           st.tokens ? 100.0 * (double)st.assistant_tokens / (double)st.tokens : 0.0);
    printf("  skipped lines    %llu\n", (unsigned long long)st.skipped);
    printf("  input            %.2f MB in %.2f s = %.2f MB/s, %.0f tokens/s\n", mb, st.seconds,
           st.seconds > 0 ? mb / st.seconds : 0.0, st.seconds > 0 ? (double)st.tokens / st.seconds : 0.0);
    return 0;
}
