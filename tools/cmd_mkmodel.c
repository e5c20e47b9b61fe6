/* draftline mkmodel: a random-weight HF model dir with a real model's shapes. */
#include "tools/commands.h"

#include "common/base/cli.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/data/tokenizer.h"
#include "common/model/mkmodel.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void mkmodel_usage(FILE *f) {
    fprintf(f,
            "usage: draftline mkmodel --config NAME --out DIR [options]\n\n"
            "Writes config.json + safetensors with the shapes of a real model and seeded random\n"
            "weights (N(0, 0.02^2), norms 1), tensor by tensor, for throughput benchmarks.\n\n"
            "  --config NAME        %s\n"
            "  --out DIR            output directory (created; an existing one needs --force)\n"
            "  --force              overwrite the model files in an existing --out\n"
            "  --seed S             (default 0)\n"
            "  --dtype T            bf16|f16|f32 (default bf16)\n"
            "  --shard-gb G         max shard size in GiB (default 5)\n"
            "  --layers N           write only the first N decoder layers (same shapes; config.json\n"
            "                       says N): for benchmarks that cannot hold the full model (disk,\n"
            "                       RAM or time); per-layer figures carry over, totals do not\n"
            "  --tokenizer DIR      copy DIR/tokenizer.json (+ tokenizer_config.json) into --out;\n"
            "                       without it the model dir has no tokenizer\n",
            mkmodel_preset_names());
}

/* Keeps the first L decoder layers of c (their shapes and MoE flags unchanged). */
static void truncate_layers(model_config_t *c, int L) {
    for (int l = L; l < c->L && l < MODEL_MAX_MOE_LAYERS; l++)
        c->moe_layers[l / 64] &= ~(UINT64_C(1) << (l % 64));
    c->L = L;
}

/* Says when the copied tokenizer's vocabulary is not the model's: a random model outputs any
 * id below V, and ids the tokenizer lacks cannot be decoded (generate/eval stop there); a
 * tokenizer with more ids than V makes ids the embedding lacks. Nothing when they agree or
 * the tokenizer does not load (mkmodel_write copied it as it is). */
static void tokenizer_note(const char *tokdir, int V) {
    char tj[4200];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", tokdir);
    tok_t *t = NULL;
    if (tok_load_json(tj, &t) < 0) {
        printf("note: --tokenizer %s: tokenizer.json copied, but it does not load: %s\n", tokdir, dl_errmsg());
        return;
    }
    int32_t n = tok_n_vocab(t);
    tok_destroy(&t);
    if (n < V)
        printf("note: --tokenizer %s has %d token ids, the model's vocabulary %d: this random model can output "
               "ids %d..%d, which the tokenizer cannot decode (generate and eval stop at the first one; "
               "training is not affected)\n", tokdir, n, V, n, V - 1);
    else if (n > V)
        printf("note: --tokenizer %s has %d token ids, more than the model's vocabulary %d: text whose ids are "
               ">= %d cannot be fed to this model (prepare it with another tokenizer, or pick a preset of that "
               "vocabulary)\n", tokdir, n, V, V);
}

int cmd_mkmodel(int argc, char **argv) {
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'}, {"out", required_argument, 0, 'o'},
        {"seed", required_argument, 0, 's'},   {"dtype", required_argument, 0, 'd'},
        {"shard-gb", required_argument, 0, 'g'}, {"tokenizer", required_argument, 0, 't'},
        {"force", no_argument, 0, 'F'},       {"layers", required_argument, 0, 'L'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    const char *name = NULL, *out = NULL, *dtype = "bf16", *tokdir = NULL;
    int64_t seed = 0;
    size_t shard = 0;
    int c, force = 0, layers = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': name = optarg; break;
        case 'o': out = optarg; break;
        case 's':
            if (cli_parse_i64("--seed", optarg, 0, INT64_MAX, &seed) < 0) { cli_error("mkmodel", dl_errmsg()); return 2; }
            break;
        case 'd': dtype = optarg; break;
        case 'g':
            if (cli_parse_gb("--shard-gb", optarg, 0.001, 1024, &shard) < 0) { cli_error("mkmodel", dl_errmsg()); return 2; }
            break;
        case 't': tokdir = optarg; break;
        case 'L':
            if (cli_parse_int("--layers", optarg, 1, 100000, &layers) < 0) { cli_error("mkmodel", dl_errmsg()); return 2; }
            break;
        case 'F': force = 1; break;
        case 'h': mkmodel_usage(stdout); return 0;
        default: mkmodel_usage(stderr); return 2;
        }
    }
    if (optind < argc || !name || !out) { mkmodel_usage(stderr); return 2; }
    if (strcmp(dtype, "bf16") && strcmp(dtype, "f16") && strcmp(dtype, "f32")) {
        char m[160];
        snprintf(m, sizeof m, "--dtype: '%s' (bf16, f16, f32)", dtype);
        cli_error("mkmodel", m);
        return 2;
    }
    struct stat sb;
    if (!force && stat(out, &sb) == 0) {
        fprintf(stderr, "mkmodel: %s exists; pass --force to overwrite its model files\n", out);
        return 1;
    }
    if (tokdir) { /* checked before minutes of writing weights, not after */
        char tj[4200];
        snprintf(tj, sizeof tj, "%s/tokenizer.json", tokdir);
        if (access(tj, R_OK) != 0) {
            fprintf(stderr, "mkmodel: --tokenizer %s: no readable tokenizer.json there\n", tokdir);
            return 1;
        }
    }
    model_config_t cfg;
    if (mkmodel_preset(name, &cfg) < 0) { cli_error("mkmodel", dl_errmsg()); return 2; }
    int full_L = cfg.L;
    if (layers > full_L) {
        char m[160];
        snprintf(m, sizeof m, "--layers %d: %s has %d layers", layers, name, full_L);
        cli_error("mkmodel", m);
        return 2;
    }
    if (layers) truncate_layers(&cfg, layers);
    double t0 = clock_mono_s();
    int rc = mkmodel_write(&cfg, out, (uint64_t)seed, dtype, shard, tokdir);
    if (rc < 0) return log_rc(rc, "mkmodel"), 1;
    printf("%s: %s-shaped random model, %.3f M parameters, %s, in %.1f s\n", out, name,
           model_config_n_params(&cfg) / 1e6, dtype, clock_mono_s() - t0);
    if (cfg.L < full_L)
        printf("note: %d of %s's %d decoder layers (--layers); config.json says %d\n", cfg.L, name,
               full_L, cfg.L);
    if (!tokdir)
        printf("note: no tokenizer written (pass --tokenizer DIR holding the real model's tokenizer.json)\n");
    else
        tokenizer_note(tokdir, cfg.V);
    return 0;
}
