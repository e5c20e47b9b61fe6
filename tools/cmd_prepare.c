/* draftline prepare: tokenize a chat dataset once into a .dlc cache. */
#include "tools/commands.h"

#include "common/base/cli.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/paths.h"
#include "common/base/testhook.h"
#include "common/data/chat.h"
#include "common/data/dataset.h"
#include "common/data/prepare.h"
#include "common/data/tokenizer.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Progress on big files: on a terminal a line rewritten in place at most once a second,
 * in a file or pipe a plain line every 10 s; nothing for a file read in under 2 s. */
typedef struct {
    int tty;
    double every_s, floor_s;    /* 1 s on a terminal, else 10 s; no line before floor_s (2 s) */
    double last;                /* seconds (prep's clock) of the last line; 0: none yet */
    uint64_t size;              /* the input's size in bytes (0: unknown, or compressed) */
    int partial;                /* a line without its newline is on the terminal */
} prep_show_t;

static void show_progress(uint64_t bytes, uint64_t records, uint64_t tokens, double s, void *arg) {
    prep_show_t *p = arg;
    if (s < p->floor_s || (p->last > 0 && s - p->last < p->every_s)) return;
    p->last = s;
    char pct[32] = "";
    if (p->size && bytes <= p->size) snprintf(pct, sizeof pct, " (%.0f%%)", 100.0 * (double)bytes / (double)p->size);
    fprintf(stderr, "%sprepare: %.1f MB read%s, %llu lines, %.2fM tokens, %.1f MB/s, %.0f s%s", p->tty ? "\r" : "",
            (double)bytes / 1e6, pct, (unsigned long long)records, (double)tokens / 1e6,
            s > 0 ? (double)bytes / 1e6 / s : 0.0, s, p->tty ? "\033[K" : "\n");
    fflush(stderr);
    p->partial = p->tty;
}

/* A log line (a bad record's warning) starts on a line of its own. */
static void end_line(void *arg) {
    prep_show_t *p = arg;
    if (p->partial) fputs("\n", stderr);
    p->partial = 0;
}

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
    prep_show_t show = {isatty(STDERR_FILENO) == 1, 10.0, 2.0, 0, 0, 0};
    if (show.tty) show.every_s = 1.0;
    int64_t ms;   /* test hook: every chunk's line, from the start */
    if (testhook_i64("prepare.progress_ms", &ms) == 1 && ms >= 0) show.every_s = show.floor_s = (double)ms / 1e3;
    struct stat sb;
    size_t dl = strlen(data);
    if (stat(data, &sb) == 0 && !(dl > 3 && !strcmp(data + dl - 3, ".gz"))) show.size = (uint64_t)sb.st_size;
    po.progress = show_progress;
    po.progress_arg = &show;
    if (show.tty) log_set_before(end_line, &show);
    rc = prep_run(t, &po, &st);
    end_line(&show);
    log_set_before(NULL, NULL);
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
