/* `draftline run`: trains a DFlash drafter with the four-stage pipeline.
 * Parses flags (and a YAML config with the same keys; flags override), prepares
 * the dataset into the run directory when it is not a prepared .dlc cache yet,
 * lays out the run (out dir, sockets 0700, logs/; <out>/run.lock held to the end), and
 * hands the stage list to the supervisor (tools/supervisor.c). With --resume, settings not
 * given are the run's (resume_defaults). */
#include "common/base/cli.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/paths.h"
#include "common/bus/bus.h"
#include "common/data/batcher.h"
#include "common/data/chat.h"
#include "common/data/prepare.h"
#include "common/data/tokenizer.h"
#include "common/model/dflash_ckpt.h"
#include "common/mem/slab.h"
#include "common/pipe/ckpt.h"
#include "common/pipe/layout.h"
#include "common/pipe/model.h"
#include "common/pipe/stage.h"
#include "tools/commands.h"
#include "supervisor/supervisor.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <yaml.h>

typedef struct {
    char target_model[4096];
    const char *data, *prompt_field, *response_field, *out, *resume, *device;
    const char *target_gpus, *drafter_gpus;
    int targets, drafters, token_budget, max_len, block_size, num_anchors, drafter_layers;
    double lr, weight_decay, clip;
    int64_t warmup_steps, max_steps, save_every, seed, keep_checkpoints;
    int epochs, mbs_per_step, deterministic, hs_min_ready, threads, max_restarts, prefetch;
    double inbox_gb, host_inbox_gb, progress_s;
    int metrics_port;
    const char *eval_data;
    int eval_every, eval_prompts, eval_max_new;
    uint8_t given[64];          /* given[code - O_TM]: set by a flag or --config (not a default) */
    char resume_data[4096];     /* --resume: the run's data cache (o.data points here) */
} run_opts_t;

enum {
    O_TM = 256, O_DATA, O_PF, O_RF, O_TG, O_DG, O_DEV, O_NT, O_ND, O_TB, O_ML, O_BS, O_NA, O_DL,
    O_LR, O_WU, O_MS, O_EP, O_K, O_SE, O_OUT, O_DET, O_SEED, O_RES, O_IG, O_HG, O_MR, O_CFG,
    O_WD, O_CL, O_TH, O_RS, O_PS, O_PREF, O_MP, O_EVD, O_EVE, O_EVP, O_EVM, O_KC
};
_Static_assert(O_KC - O_TM < 64, "run_opts_t.given holds every option code");

static const struct option run_options[] = {
    {"target-model", 1, 0, O_TM}, {"data", 1, 0, O_DATA}, {"prompt-field", 1, 0, O_PF},
    {"response-field", 1, 0, O_RF}, {"target-gpus", 1, 0, O_TG}, {"drafter-gpus", 1, 0, O_DG},
    {"device", 1, 0, O_DEV}, {"targets", 1, 0, O_NT}, {"drafters", 1, 0, O_ND},
    {"token-budget", 1, 0, O_TB}, {"max-len", 1, 0, O_ML}, {"block-size", 1, 0, O_BS},
    {"num-anchors", 1, 0, O_NA}, {"drafter-layers", 1, 0, O_DL}, {"lr", 1, 0, O_LR},
    {"warmup-steps", 1, 0, O_WU}, {"max-steps", 1, 0, O_MS}, {"epochs", 1, 0, O_EP},
    {"micro-batches-per-step", 1, 0, O_K}, {"save-every", 1, 0, O_SE}, {"out", 1, 0, O_OUT},
    {"deterministic", 0, 0, O_DET}, {"seed", 1, 0, O_SEED}, {"resume", 1, 0, O_RES},
    {"inbox-gb", 1, 0, O_IG}, {"host-inbox-gb", 1, 0, O_HG}, {"hs-min-ready", 1, 0, O_MR},
    {"config", 1, 0, O_CFG}, {"weight-decay", 1, 0, O_WD}, {"clip", 1, 0, O_CL},
    {"threads", 1, 0, O_TH}, {"max-restarts", 1, 0, O_RS}, {"progress-every", 1, 0, O_PS},
    {"prefetch", 1, 0, O_PREF}, {"metrics-port", 1, 0, O_MP},
    {"eval-data", 1, 0, O_EVD}, {"eval-every", 1, 0, O_EVE},
    {"eval-prompts", 1, 0, O_EVP}, {"eval-max-new-tokens", 1, 0, O_EVM},
    {"keep-checkpoints", 1, 0, O_KC}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};

static void run_usage(FILE *f) {
    fprintf(f,
        "usage: draftline run --data FILE [options]\n"
        "       draftline run --resume DIR [options]   (continues a run with its own settings)\n"
        "Trains a DFlash drafter against a frozen target with the multi-process pipeline\n"
        "(loader -> targets -> drafters -> optimizer), supervised by this process.\n\n"
        "model and data\n"
        "  --target-model PATH        target checkpoint, GGUF or HF dir (default: the embedded\n"
        "                             SmolLM2-135M-Instruct, `make model`)\n"
        "  --data FILE                .jsonl / .json / .gz dataset (prepared into <out>/data.dlc),\n"
        "                             or a prepared .dlc cache (`draftline prepare`)\n"
        "  --prompt-field F --response-field F   prompt/response datasets (GSM8K: question/answer);\n"
        "                             ignored for a .dlc (it was prepared with its fields already)\n"
        "topology\n"
        "  --device cpu               CPU mode (POSIX shared memory stands in for CUDA IPC)\n"
        "  --targets N --drafters M   processes in CPU mode (default 1 and 1); target i feeds drafter i%%M\n"
        "                             (drafters > targets: the extra drafters get no input; warned)\n"
        "  --target-gpus 0,1 --drafter-gpus 2,3   GPU mode (CUDA builds): one target process per\n"
        "                             entry (repeat a GPU to share it: 0,0,0), one drafter per entry;\n"
        "                             hidden states go into the drafter's GPU by CUDA IPC\n"
        "  --threads N                threads per compute stage (default: CPU cores / (targets+drafters);\n"
        "                             GPU runs: cores / 4, at least 2, for host-side work)\n"
        "training\n"
        "  --token-budget N           tokens per micro-batch (default 1024)\n"
        "  --max-len N                tokens per sequence (default: token budget; longer ones truncated)\n"
        "  --block-size B             DFlash block size (default 8)\n"
        "  --num-anchors N            anchors sampled per sequence (default 32)\n"
        "  --drafter-layers N         drafter layers (default 1)\n"
        "  --lr X                     peak learning rate (default 1e-3), cosine to 10%%\n"
        "  --warmup-steps N           linear warmup (default 0)\n"
        "  --weight-decay X --clip X  AdamW decay (default 0), gradient-norm clip (default 1.0)\n"
        "  --max-steps N              steps to train; 0 (the default) means every step the\n"
        "                             --epochs give; more than that is capped to it (warned)\n"
        "  --epochs N                 passes over the data (default 1): the data order, and the\n"
        "                             upper bound on --max-steps; the LR schedule is a function\n"
        "                             of the resulting max-steps (a change on --resume is warned)\n"
        "  --micro-batches-per-step K (default 1)\n"
        "  --seed N                   data order, anchors and initialisation (default 0)\n"
        "  --deterministic            bitwise-reproducible run (gradients are always summed in\n"
        "                             micro-batch order; this also pins the thread count to 1)\n"
        "run\n"
        "  --out DIR                  run directory: logs/, metrics.jsonl, steps.jsonl, checkpoints/\n"
        "                             (default runs/run-<time>)\n"
        "  --save-every N             checkpoint every N steps (default: only at the end)\n"
        "  --keep-checkpoints N       keep at most N checkpoints: after each one, the oldest\n"
        "                             checkpoints/step_* are removed (never the latest, nor the one\n"
        "                             resumed from until a newer one exists); default 0: keep all\n"
        "  --resume DIR               continue exactly from a checkpoint dir or a run dir's latest\n"
        "                             (refused while that run is live; a run dir with no checkpoint\n"
        "                             and no applied step, e.g. Ctrl-C at start-up, starts fresh);\n"
        "                             settings the continuation depends on (seed, token budget, max len,\n"
        "                             anchors, epochs, K, drafter layers, block size, target, data) must\n"
        "                             be the checkpoint's: checked first, a mismatch exits 2 naming it;\n"
        "                             every setting not given (flag or --config) is the run's: those,\n"
        "                             --max-steps, --lr, --warmup-steps, --weight-decay, --clip, --save-every,\n"
        "                             --keep-checkpoints, --deterministic, --data (its cache), --target-model,\n"
        "                             --out (the run dir of the checkpoint); one line lists them. Topology\n"
        "                             as without it\n"
        "  --inbox-gb X               drafter inbox, GPU tier, GiB (default 0.25)\n"
        "  --host-inbox-gb X          drafter inbox, host tier, GiB (default 0)\n"
        "  --hs-min-ready K           drafter pool of ready micro-batches (default 1)\n"
        "  --prefetch N               micro-batches a target requests ahead (default 1)\n"
        "  --max-restarts N           restarts per stage before the run fails (default 5)\n"
        "  --progress-every S         seconds between progress lines (default 5)\n"
        "  --metrics-port P           serve the metrics in the Prometheus text format on\n"
        "                             0.0.0.0:P/metrics (0: any free port, see run.json; default off)\n"
        "training-time eval (a `draftline eval` child process on CPU, one at a time)\n"
        "  --eval-data PROMPTS        held-out prompt set (any format `draftline eval --data` reads)\n"
        "  --eval-every N             tau eval of each checkpoint whose step is a multiple of N (needs\n"
        "                             --save-every); logged to metrics.jsonl (stage \"eval\"), eval/\n"
        "  --eval-prompts K           first K prompts (default 4)\n"
        "  --eval-max-new-tokens M    per prompt (default 48)\n"
        "live changes: `draftline rebalance --run DIR --targets N --drafters M`, `draftline status`\n"
        "  --config FILE.yaml         the same keys as the flags (without --); flags override\n"
        "  -h, --help                 this help\n");
}

static int set_opt(run_opts_t *o, int code, const char *v) {
    int64_t x;
    if (code >= O_TM && code - O_TM < (int)sizeof o->given) o->given[code - O_TM] = 1;
    switch (code) {
    case O_TM: snprintf(o->target_model, sizeof o->target_model, "%s", v); return 0;
    case O_DATA: o->data = v; return 0;
    case O_PF: o->prompt_field = v; return 0;
    case O_RF: o->response_field = v; return 0;
    case O_TG: o->target_gpus = v; return 0;
    case O_DG: o->drafter_gpus = v; return 0;
    case O_DEV: o->device = v; return 0;
    case O_NT: return cli_parse_int("--targets", v, 1, 64, &o->targets);
    case O_ND: return cli_parse_int("--drafters", v, 1, 64, &o->drafters);
    case O_TB: return cli_parse_int("--token-budget", v, 16, 1 << 21, &o->token_budget);
    case O_ML: return cli_parse_int("--max-len", v, 2, 1 << 21, &o->max_len);
    case O_BS: return cli_parse_int("--block-size", v, 2, 64, &o->block_size);
    case O_NA: return cli_parse_int("--num-anchors", v, 1, 1 << 20, &o->num_anchors);
    case O_DL: return cli_parse_int("--drafter-layers", v, 1, 64, &o->drafter_layers);
    case O_LR: return cli_parse_f64("--lr", v, 0, 10, &o->lr);
    case O_WU: return cli_parse_i64("--warmup-steps", v, 0, INT32_MAX, &o->warmup_steps);
    case O_MS: return cli_parse_i64("--max-steps", v, 0, INT32_MAX, &o->max_steps);
    case O_EP: return cli_parse_int("--epochs", v, 1, 1 << 20, &o->epochs);
    case O_K: return cli_parse_int("--micro-batches-per-step", v, 1, 4096, &o->mbs_per_step);
    case O_SE: return cli_parse_i64("--save-every", v, 0, INT32_MAX, &o->save_every);
    case O_KC: return cli_parse_i64("--keep-checkpoints", v, 0, INT32_MAX, &o->keep_checkpoints);
    case O_OUT: o->out = v; return 0;
    case O_DET: { int b = 1; if (v && cli_parse_bool("--deterministic", v, &b) < 0) return DL_EINVAL; o->deterministic = b; return 0; }
    case O_SEED: return cli_parse_i64("--seed", v, 0, INT64_MAX, &o->seed);
    case O_RES: o->resume = v; return 0;
    case O_IG: return cli_parse_f64("--inbox-gb", v, 0, 4096, &o->inbox_gb);
    case O_HG: return cli_parse_f64("--host-inbox-gb", v, 0, 4096, &o->host_inbox_gb);
    case O_MR: return cli_parse_int("--hs-min-ready", v, 1, 1024, &o->hs_min_ready);
    case O_WD: return cli_parse_f64("--weight-decay", v, 0, 10, &o->weight_decay);
    case O_CL: return cli_parse_f64("--clip", v, 0, 1e9, &o->clip);
    case O_TH: return cli_parse_int("--threads", v, 0, 1024, &o->threads);
    case O_RS: return cli_parse_int("--max-restarts", v, 0, 1000, &o->max_restarts);
    case O_PS: return cli_parse_f64("--progress-every", v, 0.2, 3600, &o->progress_s);
    case O_PREF: return cli_parse_int("--prefetch", v, 1, 8, &o->prefetch);
    case O_MP: return cli_parse_int("--metrics-port", v, 0, 65535, &o->metrics_port);
    case O_EVD: o->eval_data = v; return 0;
    case O_EVE: return cli_parse_int("--eval-every", v, 1, INT32_MAX, &o->eval_every);
    case O_EVP: return cli_parse_int("--eval-prompts", v, 1, 1 << 20, &o->eval_prompts);
    case O_EVM: return cli_parse_int("--eval-max-new-tokens", v, 1, 1 << 16, &o->eval_max_new);
    case O_CFG: return 0;
    }
    (void)x;
    return dl_seterr(DL_EINVAL, "unknown option");
}

/* YAML config: a mapping of flag names (without --) to scalars; a sequence value
 * (target-gpus: [0, 1]) is joined with commas. Strings are kept for the run. */
static int load_yaml(run_opts_t *o, const char *path) {
    struct stat cs;
    if (stat(path, &cs) == 0 && S_ISDIR(cs.st_mode))   /* fopen succeeds, libyaml says "input error" */
        return dl_seterr(DL_EINVAL, "--config %s: is a directory, not a YAML file", path);
    FILE *f = fopen(path, "rb");
    if (!f) return dl_seterr(DL_EIO, "--config %s: %s", path, strerror(errno));
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, f);
    int rc = 0, depth = 0, in_seq = 0;
    char key[128] = "", val[1024] = "";
    int have_key = 0;
    for (;;) {
        yaml_event_t e;
        if (!yaml_parser_parse(&p, &e)) {
            rc = dl_seterr(DL_EFORMAT, "--config %s:%zu: %s", path, p.problem_mark.line + 1,
                           p.problem ? p.problem : "YAML error");
            break;
        }
        int done = e.type == YAML_STREAM_END_EVENT;
        if (e.type == YAML_MAPPING_START_EVENT) {
            if (++depth > 1) rc = dl_seterr(DL_EFORMAT, "--config %s:%zu: nested mappings are not keys", path, e.start_mark.line + 1);
        } else if (e.type == YAML_MAPPING_END_EVENT) {
            depth--;
        } else if (e.type == YAML_SEQUENCE_START_EVENT) {
            if (!have_key) rc = dl_seterr(DL_EFORMAT, "--config %s:%zu: a list must be a key's value", path, e.start_mark.line + 1);
            in_seq = 1;
            val[0] = 0;
        } else if (e.type == YAML_SEQUENCE_END_EVENT || e.type == YAML_SCALAR_EVENT) {
            const char *s = e.type == YAML_SCALAR_EVENT ? (const char *)e.data.scalar.value : NULL;
            if (s && in_seq) {
                size_t n = strlen(val);
                snprintf(val + n, sizeof val - n, "%s%s", n ? "," : "", s);
            } else if (s && !have_key) {
                snprintf(key, sizeof key, "%s", s);
                for (char *u = key; *u; u++) if (*u == '_') *u = '-';   /* eval_data == eval-data */
                have_key = 1;
            } else {
                if (s) snprintf(val, sizeof val, "%s", s);
                in_seq = 0;
                int code = 0;
                for (const struct option *op = run_options; op->name; op++)
                    if (!strcmp(op->name, key)) code = op->val;
                if (!code || code == O_CFG || code == 'h') {
                    rc = dl_seterr(DL_EINVAL, "--config %s:%zu: unknown key '%s'", path, e.start_mark.line + 1, key);
                } else {
                    char *keep = strdup(val);
                    int r = keep ? set_opt(o, code, keep) : DL_ENOMEM;
                    if (r < 0) rc = dl_wraperr(r, "--config %s: key '%s'", path, key);
                }
                have_key = 0;
            }
        }
        yaml_event_delete(&e);
        if (done || rc < 0) break;
    }
    yaml_parser_delete(&p);
    fclose(f);
    return rc;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* "0,0,1" -> out[] = {0, 0, 1}; returns the count (>= 1) or -1 (malformed, an
 * ordinal outside 0..1023, more than cap entries). */
static int parse_gpu_list(const char *s, int *out, int cap) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1023 || n == cap) return -1;
        out[n++] = (int)v;
        if (*end == ',') p = end + 1;
        else if (*end == 0) p = end;
        else return -1;
    }
    return n > 0 ? n : -1;
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
    if (ends_with(o->data, ".dlc")) { snprintf(cache, cap, "%s", o->data); return 0; }
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

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    char *s = NULL;
    if (vasprintf(&s, f, ap) < 0) s = NULL;
    va_end(ap);
    return s;
}

static void add(sup_stage_spec_t *s, char *a) { if (s->argc < SUP_MAX_ARGS) s->argv[s->argc++] = a; }

static int bin_dir(char *out, size_t cap) {
    const char *e = getenv("DL_BIN_DIR");
    if (e && *e) { snprintf(out, cap, "%s", e); return 0; }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return dl_seterr(DL_EIO, "readlink /proc/self/exe: %s", strerror(errno));
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    snprintf(out, cap, "%s", self);
    return 0;
}

/* --- the --resume check -----------------------------------------------------
 * `draftline run --resume` continues a run exactly, so every setting the checkpoint's
 * state, data order, micro-batch numbering or drafter shape depends on must be the
 * run's. Checked here, before any stage starts and before anything is written, from
 * state.bin's header (ckpt_state_hdr_t: seed, K, and the settings recorded since
 * CKPT_SETTINGS_V1), the drafter's config.json (shapes: every checkpoint has it) and
 * cursor.bin (dataset fingerprint, batching options). Each mismatch is one line on
 * stderr naming the flag, both values, why, and the flag to rerun with. Free to change:
 * --max-steps (warned: the LR schedule), --lr/--warmup-steps/--weight-decay/--clip
 * (warned: the continuation is no longer the uninterrupted run's), topology, threads,
 * inbox sizes, --save-every, --progress-every, --prefetch, --hs-min-ready, eval. */

typedef struct {
    const char *dir;   /* the resolved checkpoint dir */
    int n;             /* mismatches reported */
} rcheck_t;

static void rc_mismatch(rcheck_t *r, const char *flag, const char *want, const char *have, const char *why) {
    fprintf(stderr, "draftline run: --resume %s: %s %s does not match the checkpoint's %s (%s); rerun with %s %s\n",
            r->dir, flag, want, have, why, flag, have);
    r->n++;
}

static void rc_u64(rcheck_t *r, const char *flag, uint64_t want, uint64_t have, const char *why) {
    if (want == have) return;
    char a[32], b[32];
    snprintf(a, sizeof a, "%llu", (unsigned long long)want);
    snprintf(b, sizeof b, "%llu", (unsigned long long)have);
    rc_mismatch(r, flag, a, b, why);
}

/* A double as the optimizer gets it on its command line ("%.9g"), for exact compares
 * with what state.bin recorded. */
static double as_passed(double x) {
    char b[64];
    snprintf(b, sizeof b, "%.9g", x);
    return strtod(b, NULL);
}

/* The settings that need no data: state.bin header and config.json of checkpoint
 * r->dir against the requested ones (o, its drafter config dc, the target's
 * fingerprint tfp, 0 when it could not be taken). Mismatches counted in r->n. */
static void resume_check_settings(rcheck_t *r, const run_opts_t *o, const ckpt_state_hdr_t *h,
                                  const drafter_config_t *dc, uint64_t tfp) {
    rc_u64(r, "--seed", (uint64_t)o->seed, h->seed, "the data order, the anchors and the initialisation depend on it");
    rc_u64(r, "--micro-batches-per-step", (uint64_t)o->mbs_per_step, h->mbs_per_step,
           "the cursor and the micro-batch numbering depend on it");
    uint32_t ml = o->max_len > 0 && o->max_len < o->token_budget ? (uint32_t)o->max_len : (uint32_t)o->token_budget;
    int have_settings = h->settings == CKPT_SETTINGS_V1;
    if (have_settings) {
        rc_u64(r, "--token-budget", (uint64_t)o->token_budget, h->token_budget,
               "the cursor and micro-batch numbering depend on it");
        if (h->token_budget == (uint32_t)o->token_budget)
            rc_u64(r, "--max-len", ml, h->max_len, "the packing of the micro-batches depends on it");
        rc_u64(r, "--num-anchors", (uint64_t)o->num_anchors, h->num_anchors,
               "the blocks trained per sequence depend on it");
        rc_u64(r, "--epochs", (uint64_t)o->epochs, h->epochs, "the data order depends on it");
    } else {
        log_warn("--resume %s: the checkpoint predates recorded run settings: --token-budget, --max-len, "
                 "--num-anchors, --epochs and the target model's identity are not checked (the dataset and "
                 "batching options are, from cursor.bin)", r->dir);
    }
    /* drafter shape: config.json (every checkpoint), else the header */
    drafter_config_t cc;
    memset(&cc, 0, sizeof cc);
    int have_cfg = dflash_config_load(r->dir, &cc) == 0;
    int c_layers = have_cfg ? cc.n_layers : have_settings ? (int)h->drafter_layers : 0;
    int c_block = have_cfg ? cc.B : have_settings ? (int)h->block_size : 0;
    if (!have_cfg) log_warn("--resume %s: config.json unreadable (%s)%s", r->dir, dl_errmsg(),
                            have_settings ? "" : ": the drafter shape is not checked");
    if (c_layers) rc_u64(r, "--drafter-layers", (uint64_t)o->drafter_layers, (uint64_t)c_layers,
                         "the drafter's shape and parameter count depend on it");
    if (c_block) rc_u64(r, "--block-size", (uint64_t)o->block_size, (uint64_t)c_block,
                        "the drafter's training blocks depend on it");
    int target_differs = 0;
    if (have_cfg && (cc.D != dc->D || cc.V != dc->V || cc.H != dc->H || cc.Hkv != dc->Hkv || cc.hd != dc->hd ||
                     cc.F != dc->F || cc.n_target_layers != dc->n_target_layers)) {
        char a[160], b[160];
        snprintf(a, sizeof a, "(hidden %d, %d layers, heads %d/%d, head dim %d, MLP %d, vocabulary %d)", dc->D,
                 dc->n_target_layers, dc->H, dc->Hkv, dc->hd, dc->F, dc->V);
        snprintf(b, sizeof b, "(hidden %d, %d layers, heads %d/%d, head dim %d, MLP %d, vocabulary %d)", cc.D,
                 cc.n_target_layers, cc.H, cc.Hkv, cc.hd, cc.F, cc.V);
        fprintf(stderr, "draftline run: --resume %s: --target-model %s %s does not match the checkpoint's target "
                        "%s (the drafter's shapes are the target's); rerun with the run's --target-model\n",
                r->dir, o->target_model, a, b);
        r->n++;
        target_differs = 1;
    }
    if (!target_differs && have_settings && h->target_fp && tfp && h->target_fp != tfp) {
        fprintf(stderr, "draftline run: --resume %s: --target-model %s (fingerprint %016llx) does not match the "
                        "checkpoint's target (fingerprint %016llx): same shapes, other weights (another model, "
                        "fine-tune or quantisation; the features the drafter learns from depend on it); rerun "
                        "with the run's --target-model\n",
                r->dir, o->target_model, (unsigned long long)tfp, (unsigned long long)h->target_fp);
        r->n++;
    }
    /* free to change, but the continuation is then not the uninterrupted run's */
    struct { const char *flag; double want, have; } hp[] = {
        {"--lr", as_passed(o->lr), h->lr}, {"--warmup-steps", (double)o->warmup_steps, h->warmup_steps},
        {"--weight-decay", as_passed(o->weight_decay), h->wd}, {"--clip", as_passed(o->clip), h->clip}};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++)
        if (hp[i].want != hp[i].have)
            log_warn("--resume: %s changes from %.9g (the checkpoint's) to %.9g: allowed, but the continuation "
                     "is no longer the uninterrupted run's; pass %s %.9g to keep it", hp[i].flag, hp[i].have,
                     hp[i].want, hp[i].flag, hp[i].have);
}

/* The data: cursor.bin of checkpoint r->dir against the cursor of micro-batch 0 of the
 * requested cache and batching options (want). have_settings: the header's explicit
 * settings were checked (an options-hash mismatch is then reported only when they all
 * matched). Mismatches counted in r->n. */
static void resume_check_data(rcheck_t *r, const run_opts_t *o, const char *cache, const batcher_cursor_t *want,
                              int batching_reported) {
    char p[4300];
    snprintf(p, sizeof p, "%s/cursor.bin", r->dir);
    uint8_t buf[BATCHER_CURSOR_BYTES];
    FILE *f = fopen(p, "rb");
    size_t got = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    batcher_cursor_t c;
    if (got != sizeof buf || batcher_cursor_decode(buf, got, &c) < 0) {
        log_warn("--resume %s: no readable cursor.bin: the dataset is not checked (the loader starts at the "
                 "checkpoint's step)", r->dir);
        return;
    }
    if (c.data_fingerprint != want->data_fingerprint) {
        fprintf(stderr, "draftline run: --resume %s: --data %s (cache %s, fingerprint %016llx) does not match the "
                        "checkpoint's dataset (fingerprint %016llx: other samples, or prepared with another "
                        "tokenizer; the cursor indexes it); rerun with the run's --data\n",
                r->dir, o->data, cache, (unsigned long long)want->data_fingerprint,
                (unsigned long long)c.data_fingerprint);
        r->n++;
    }
    if (c.opts_hash != want->opts_hash && !batching_reported) {
        fprintf(stderr, "draftline run: --resume %s: the batching options (--token-budget %d, --max-len, "
                        "--micro-batches-per-step %d, --epochs %d, shuffle buffer, split) do not match the "
                        "checkpoint's cursor (the micro-batches and their numbering depend on them); rerun with "
                        "the run's settings\n", r->dir, o->token_budget, o->mbs_per_step, o->epochs);
        r->n++;
    }
}

/* The requested cursor of micro-batch 0 (cache fingerprint, batching options) and the
 * steps the epochs give (all, may be NULL). */
static int requested_cursor(const run_opts_t *o, const char *cache, batcher_cursor_t *cur, uint64_t *all) {
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

/* The run dir a checkpoint dir belongs to (<run>/checkpoints/step_N: its ../..) into
 * out; "" when ckpt is not under a checkpoints/ dir. */
static void run_dir_of_ckpt(const char *ckpt, char *out, size_t cap) {
    out[0] = 0;
    const char *last = NULL;
    for (const char *p = strstr(ckpt, "/checkpoints/"); p; p = strstr(p + 1, "/checkpoints/")) last = p;
    if (last) snprintf(out, cap, "%.*s", (int)(last - ckpt), ckpt);
    else if (!strncmp(ckpt, "checkpoints/", 12)) snprintf(out, cap, ".");
    if (last && last == ckpt) snprintf(out, cap, "/");
}

/* --resume: every setting not given by a flag or --config takes the run's value, so
 * `draftline run --resume DIR` alone continues the run: from the checkpoint ckdir ("" when
 * none) and its state.bin header h (NULL when none): --seed, --micro-batches-per-step,
 * --lr, --warmup-steps, --weight-decay, --clip, --max-steps, and (CKPT_SETTINGS_V1)
 * --token-budget, --max-len, --num-anchors, --epochs, --block-size, --drafter-layers
 * (older checkpoints: the last two from its config.json); from <run_dir>/run.json
 * ("" / missing: skipped; keys written since these defaults exist): --target-model,
 * --data (the data cache the run trained on; else <run_dir>/data.dlc when it exists),
 * --save-every, --keep-checkpoints, --deterministic. Explicit settings are left as given (the --resume check
 * compares them). Appends " --flag value" per setting taken to taken (cap bytes). */
static void resume_defaults(run_opts_t *o, const char *ckdir, const ckpt_state_hdr_t *h, const char *run_dir,
                            char *taken, size_t cap) {
    size_t n = strlen(taken);
    /* TAKE(code, fmt, args): when the flag was not given, formats args into taken; the
     * assignments written into args (o->x = recorded) therefore happen only then */
#define TAKE(code, ...) do { if (!o->given[(code) - O_TM]) {                                     \
        int w_ = snprintf(taken + n, n < cap ? cap - n : 0, __VA_ARGS__);                          \
        if (w_ > 0) n = n + (size_t)w_ < cap ? n + (size_t)w_ : cap - 1; } } while (0)
    if (h) {
        TAKE(O_SEED, " --seed %llu", (unsigned long long)(o->seed = (int64_t)h->seed));
        TAKE(O_K, " --micro-batches-per-step %d", (o->mbs_per_step = (int)h->mbs_per_step));
        if (h->settings == CKPT_SETTINGS_V1) {
            TAKE(O_TB, " --token-budget %d", (o->token_budget = (int)h->token_budget));
            TAKE(O_ML, " --max-len %d", (o->max_len = (int)h->max_len));
            TAKE(O_NA, " --num-anchors %d", (o->num_anchors = (int)h->num_anchors));
            TAKE(O_EP, " --epochs %d", (o->epochs = (int)h->epochs));
            TAKE(O_DL, " --drafter-layers %d", (o->drafter_layers = (int)h->drafter_layers));
            TAKE(O_BS, " --block-size %d", (o->block_size = (int)h->block_size));
        } else {
            drafter_config_t cc;
            memset(&cc, 0, sizeof cc);
            if (dflash_config_load(ckdir, &cc) == 0) {
                TAKE(O_DL, " --drafter-layers %d", (o->drafter_layers = cc.n_layers));
                TAKE(O_BS, " --block-size %d", (o->block_size = cc.B));
            }
        }
        TAKE(O_LR, " --lr %.9g", (o->lr = h->lr));
        TAKE(O_WU, " --warmup-steps %lld", (long long)(o->warmup_steps = (int64_t)h->warmup_steps));
        TAKE(O_WD, " --weight-decay %.9g", (o->weight_decay = h->wd));
        TAKE(O_CL, " --clip %.9g", (o->clip = h->clip));
        if (h->max_steps > 0) TAKE(O_MS, " --max-steps %lld", (long long)(o->max_steps = (int64_t)h->max_steps));
    }
    if (!run_dir[0]) return;
    char p[4200];
    snprintf(p, sizeof p, "%s/run.json", run_dir);
    cJSON *j = NULL;
    FILE *f = fopen(p, "rb");
    if (f) {
        char buf[1 << 16];
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        buf[k] = 0;
        fclose(f);
        j = cJSON_Parse(buf);
    }
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "target_model");
    const cJSON *da = cJSON_GetObjectItemCaseSensitive(j, "data");
    const cJSON *se = cJSON_GetObjectItemCaseSensitive(j, "save_every");
    const cJSON *kc = cJSON_GetObjectItemCaseSensitive(j, "keep_checkpoints");
    const cJSON *de = cJSON_GetObjectItemCaseSensitive(j, "deterministic");
    if (cJSON_IsString(tm) && tm->valuestring[0] && !o->given[O_TM - O_TM]) {
        if (access(tm->valuestring, R_OK) == 0) {
            snprintf(o->target_model, sizeof o->target_model, "%s", tm->valuestring);
            TAKE(O_TM, " --target-model %s", o->target_model);
        } else {
            log_warn("--resume: the run's target model %s (run.json) is not readable: using %s (pass "
                     "--target-model)", tm->valuestring, o->target_model);
        }
    }
    if (!o->given[O_DATA - O_TM]) {
        if (cJSON_IsString(da) && da->valuestring[0] && access(da->valuestring, R_OK) == 0)
            snprintf(o->resume_data, sizeof o->resume_data, "%s", da->valuestring);
        else {
            snprintf(o->resume_data, sizeof o->resume_data, "%s/data.dlc", run_dir);
            if (access(o->resume_data, R_OK) != 0) o->resume_data[0] = 0;
        }
        if (o->resume_data[0]) {
            o->data = o->resume_data;
            TAKE(O_DATA, " --data %s", o->data);
        }
    }
    if (cJSON_IsNumber(se) && se->valuedouble >= 0)
        TAKE(O_SE, " --save-every %lld", (long long)(o->save_every = (int64_t)se->valuedouble));
    if (cJSON_IsNumber(kc) && kc->valuedouble > 0 && kc->valuedouble <= INT32_MAX)
        TAKE(O_KC, " --keep-checkpoints %lld", (long long)(o->keep_checkpoints = (int64_t)kc->valuedouble));
    if (cJSON_IsTrue(de) && !o->given[O_DET - O_TM]) {
        o->deterministic = 1;
        TAKE(O_DET, " --deterministic");
    }
    cJSON_Delete(j);
#undef TAKE
}

/* One `draftline run` per run dir: an exclusive flock on <out>/run.lock, taken before
 * anything in the dir is deleted, prepared or started and held until this process
 * exits (the supervisor runs in it; O_CLOEXEC: the stages do not hold it). Two runs
 * started together both pass the run.json liveness check; without it the second
 * deleted the first's new steps.jsonl (fresh reuse), then both stole each other's
 * sockets. Returns 0 with the held fd in *fd_out (-1 on a file system without flock:
 * warned, unguarded), or DL_ESTATE (another process holds it) / DL_EIO, the error set. */
static int run_lock_take(const char *out, int *fd_out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/run.lock", out);
    *fd_out = -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return dl_seterr(DL_EIO, "run lock %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        if (e == EWOULDBLOCK)
            return dl_seterr(DL_ESTATE, "--out %s: another `draftline run` is using this run dir right now "
                                        "(it holds %s): stop it first, or choose another --out", out, path);
        /* a file system without flock (some NFS): run unguarded, as before the lock */
        log_warn("run lock %s: flock: %s (two runs in this dir would not be refused)", path, strerror(e));
        return 0;
    }
    *fd_out = fd;
    return 0;
}

int cmd_run(int argc, char **argv) {
    static run_opts_t o;
    memset(&o, 0, sizeof o);
    o.targets = 1; o.drafters = 1; o.token_budget = 1024; o.block_size = 8; o.num_anchors = 32;
    o.drafter_layers = 1; o.lr = 1e-3; o.clip = 1.0; o.epochs = 1; o.mbs_per_step = 1;
    o.inbox_gb = 0.25; o.hs_min_ready = 1; o.max_restarts = 5; o.progress_s = 5; o.prefetch = 1;
    o.metrics_port = -1; o.eval_prompts = 4; o.eval_max_new = 48;
    if (paths_default_model(o.target_model, sizeof o.target_model) < 0) o.target_model[0] = 0;
    /* the config file first, so flags override it */
    for (int i = 1; i < argc; i++) {
        const char *cfg = NULL;
        if (!strcmp(argv[i], "--config") && i + 1 < argc) cfg = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9)) cfg = argv[i] + 9;
        if (cfg && load_yaml(&o, cfg) < 0) { cli_error("draftline run", dl_errmsg()); return 2; }
    }
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", run_options, NULL)) != -1) {
        if (c == 'h') { run_usage(stdout); return 0; }
        if (c == '?' || c == ':') { run_usage(stderr); return 2; }
        if (set_opt(&o, c, optarg) < 0) { cli_error("draftline run", dl_errmsg()); return 2; }
    }
    if (optind < argc) { fprintf(stderr, "draftline run: unexpected argument '%s'\n", argv[optind]); return 2; }
    /* GPU mode: one target process per --target-gpus entry, one drafter per
     * --drafter-gpus entry; each stage selects its GPU itself after exec (--gpu N):
     * CUDA is never initialised here, before the forks. */
    int tgpu[PIPE_MAX_TARGETS], dgpu[PIPE_MAX_DRAFTERS], ngt = 0, ngd = 0;
    if (o.target_gpus || o.drafter_gpus || (o.device && strcmp(o.device, "cpu") != 0)) {
        ngt = o.target_gpus ? parse_gpu_list(o.target_gpus, tgpu, PIPE_MAX_TARGETS) : -1;
        ngd = o.drafter_gpus ? parse_gpu_list(o.drafter_gpus, dgpu, PIPE_MAX_DRAFTERS) : -1;
        if (ngt < 1 || ngd < 1) {
            fprintf(stderr, "draftline run: GPU mode needs --target-gpus and --drafter-gpus, lists of CUDA "
                            "device ordinals such as 0,0,1 (one process per entry)\n");
            return 2;
        }
#ifndef DL_CUDA
        fprintf(stderr, "draftline run: this build has no CUDA (built with CUDA=0): use --device cpu\n");
        return 2;
#endif
        o.targets = ngt;
        o.drafters = ngd;
    }
    int gpu_mode = ngt > 0;
    /* --resume: the settings not given default to the run's (resume_defaults), so
     * `draftline run --resume DIR` alone continues it */
    char resume_run[4096] = "";   /* the run dir of the checkpoint, or --resume itself (no checkpoint) */
    if (o.resume) {
        if (access(o.resume, F_OK) != 0) {
            fprintf(stderr, "draftline run: --resume %s: %s\n", o.resume, strerror(errno));
            return 2;
        }
        char ck[4096] = "", rj[4200];
        ckpt_state_hdr_t h;
        int have_ck = ckpt_resolve(o.resume, ck, sizeof ck) == 0;
        int have_h = have_ck && ckpt_read_hdr(ck, &h) == 0;
        snprintf(rj, sizeof rj, "%s/run.json", o.resume);
        if (have_ck) run_dir_of_ckpt(ck, resume_run, sizeof resume_run);
        else if (access(rj, F_OK) == 0) snprintf(resume_run, sizeof resume_run, "%s", o.resume);
        char taken[8192] = "";
        resume_defaults(&o, ck, have_h ? &h : NULL, resume_run, taken, sizeof taken);
        if (!o.out && resume_run[0]) {
            size_t n = strlen(taken);
            snprintf(taken + n, sizeof taken - n, " --out %s", resume_run);
        }
        if (taken[0])
            log_info("--resume %s: not given, so taken from the %s:%s", have_ck ? ck : o.resume,
                     have_h ? "checkpoint and its run" : "run", taken);
    }
    if (!o.data) {
        if (o.resume)
            fprintf(stderr, "draftline run: --data is required: the run of --resume %s records no readable data "
                            "cache (run.json \"data\", or <run>/data.dlc)\n", o.resume);
        else
            cli_error("draftline run", "--data is required");
        return 2;
    }
    if (access(o.target_model, R_OK) != 0) {
        fprintf(stderr, "draftline run: target model %s not found (run `make model` or pass --target-model)\n",
                o.target_model);
        return 2;
    }
    if (o.deterministic && o.threads == 0) o.threads = 1;
    if (o.eval_data || o.eval_every) {
        if (!o.eval_data || o.eval_every < 1) {
            cli_error("draftline run", "--eval-data PROMPTS and --eval-every N (>= 1) go together");
            return 2;
        }
        if (access(o.eval_data, R_OK) != 0) {
            fprintf(stderr, "draftline run: --eval-data %s: %s\n", o.eval_data, strerror(errno));
            return 2;
        }
        if (o.save_every == 0)
            log_warn("--eval-every %d: checkpoints are evaluated, and without --save-every there is only the "
                     "final one (not evaluated): no eval will run", o.eval_every);
    }
    if (o.drafters > o.targets)
        log_warn("%d drafters for %d target(s): target i feeds drafter i mod %d, so drafter%d..%d get no "
                 "input and sit idle (use --drafters <= --targets)", o.drafters, o.targets, o.drafters,
                 o.targets, o.drafters - 1);
    /* Everything that does not need the data is checked before the data is prepared and
     * before the out dir is created. */
    /* run directory */
    char out[4096];
    if (o.out) snprintf(out, sizeof out, "%s", o.out);
    else if (o.resume) {
        /* the run dir of --resume: a checkpoint's run (<dir>/checkpoints/step_N) or the dir itself */
        if (!resume_run[0]) {
            fprintf(stderr, "draftline run: --resume %s is neither a run dir (no run.json) nor a checkpoint "
                            "of one: pass --out DIR to say where the run goes\n", o.resume);
            return 2;
        }
        snprintf(out, sizeof out, "%s", resume_run);
    } else {
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(out, sizeof out, "runs/run-%Y%m%d-%H%M%S", &tm);
    }
    {
        int spid = 0;
        if (sup_run_live(out, &spid) == 1) {
            fprintf(stderr, "draftline run: %s: the run is live (supervisor pid %d); stop it first "
                            "(`draftline stop --run %s --wait 60`)\n", out, spid, out);
            return 2;
        }
        if (o.resume && strcmp(o.resume, out) != 0 && sup_run_live(o.resume, &spid) == 1) {
            fprintf(stderr, "draftline run: --resume %s: the run is live (supervisor pid %d); stop it first\n",
                    o.resume, spid);
            return 2;
        }
    }
    /* A dir whose run saved no checkpoint and applied no step (e.g. Ctrl-C while the
     * stages were starting) holds nothing to continue: it is reused as a fresh run,
     * with or without --resume (its steps.jsonl and metrics.jsonl are started anew). */
    int reuse_fresh = 0;
    {
        char prev[4200], cp[4096];
        struct stat sb;
        snprintf(prev, sizeof prev, "%s/steps.jsonl", out);
        int has_steps = stat(prev, &sb) == 0 && sb.st_size > 0;
        int has_prev = access(prev, F_OK) == 0;
        snprintf(prev, sizeof prev, "%s/run.json", out);
        has_prev |= access(prev, F_OK) == 0;
        int has_ckpt = ckpt_resolve(o.resume ? o.resume : out, cp, sizeof cp) == 0;
        if (o.resume && !has_ckpt) {
            if (!has_steps && (!strcmp(o.resume, out) || has_prev)) {
                log_info("--resume %s: the run saved no checkpoint and applied no step: starting it fresh in %s",
                         o.resume, out);
                o.resume = NULL;
                reuse_fresh = has_prev;
            } else {
                fprintf(stderr, "draftline run: --resume %s: no checkpoint to resume from (no state.bin and no "
                                "checkpoints/latest)%s\n", o.resume,
                        has_steps ? "; the run applied steps but saved none: start a fresh run with another --out" : "");
                return 2;
            }
        } else if (!o.resume && has_prev) {
            if (has_steps || has_ckpt) {
                fprintf(stderr, "draftline run: --out %s holds a previous run (%s): choose another "
                                "--out, or continue it with `draftline run --resume %s`\n", out,
                        has_ckpt ? "a checkpoint" : "steps.jsonl", out);
                return 2;
            }
            log_info("--out %s: the previous run there saved no checkpoint and applied no step: reusing it as "
                     "a fresh run", out);
            reuse_fresh = 1;
        }
    }
    /* the checkpoint to resume: read (and checked) before anything is written */
    uint64_t start_step = 0;
    char resume_dir[4200] = "";
    ckpt_state_hdr_t resume_hdr;
    int have_resume_hdr = 0, batching_reported = 0, data_checked = 0;
    uint64_t target_fp = 0;
    memset(&resume_hdr, 0, sizeof resume_hdr);
    if (o.resume) {
        if (ckpt_resolve(o.resume, resume_dir, sizeof resume_dir) < 0) { fprintf(stderr, "draftline run: %s\n", dl_errmsg()); return 2; }
        ckpt_state_hdr_t h;
        if (ckpt_read_hdr(resume_dir, &h) < 0) {
            fprintf(stderr, "draftline run: --resume %s: unreadable training state (%s)\n", resume_dir, dl_errmsg());
            return 2;
        }
        start_step = h.step;
        resume_hdr = h;
        have_resume_hdr = 1;
    }
    /* Inbox slots per drafter (each sized for a full micro-batch) bound how far the
     * loader may run ahead of the current step: items of the next step wait in the
     * inbox until the step is applied, and every routed target may hold one grant, so
     * lookahead <= slots - targets per drafter keeps room for the current step. */
    int lookahead, inbox_slots;
    {
        model_config_t mc;
        drafter_config_t dc;
        if (pipe_target_config(o.target_model, &mc) < 0 ||
            pipe_drafter_config(&mc, o.drafter_layers, 0, o.block_size, &dc) < 0) {
            fprintf(stderr, "draftline run: %s: %s\n", o.target_model, dl_errmsg());
            return 1;
        }
        uint64_t slot = pipe_layout((uint64_t)o.token_budget, (uint64_t)o.token_budget,
                                    (uint64_t)dc.n_feat * (uint64_t)dc.D, gpu_mode ? 2 : 4).bytes;
        uint64_t gpu = (uint64_t)(o.inbox_gb * 1073741824.0) / 256 * 256;
        uint64_t host = (uint64_t)(o.host_inbox_gb * 1073741824.0) / 256 * 256;
        int64_t slots = (int64_t)(gpu / slot + host / slot);
        if (slots < 1) {
            fprintf(stderr, "draftline run: --inbox-gb %g + --host-inbox-gb %g cannot hold one micro-batch "
                            "of %d tokens (%.4f GiB of hidden states): raise --inbox-gb or lower --token-budget\n",
                    o.inbox_gb, o.host_inbox_gb, o.token_budget, (double)slot / 1073741824.0);
            return 2;
        }
        inbox_slots = (int)(slots > INT32_MAX ? INT32_MAX : slots);
        int64_t tpd = (o.targets + o.drafters - 1) / o.drafters;
        int64_t la = slots - tpd;
        lookahead = (int)(la < 0 ? 0 : la > o.mbs_per_step ? o.mbs_per_step : la);
        /* --resume: the settings against the checkpoint, before anything is written */
        if (have_resume_hdr) {
            uint64_t tfp = 0;
            if (ckpt_target_fingerprint(o.target_model, &tfp) < 0) {
                log_warn("--target-model %s: %s (the target is not fingerprinted)", o.target_model, dl_errmsg());
                tfp = 0;
            }
            target_fp = tfp;
            rcheck_t r = {resume_dir, 0};
            resume_check_settings(&r, &o, &resume_hdr, &dc, tfp);
            batching_reported = r.n > 0;
            /* the data too when its cache is known without preparing (a .dlc, or the
             * run dir's prepared one) */
            char early[4300] = "";
            if (ends_with(o.data, ".dlc")) snprintf(early, sizeof early, "%s", o.data);
            else {
                snprintf(early, sizeof early, "%s/data.dlc", out);   /* what prepare_data reuses */
                if (access(early, R_OK) != 0) early[0] = 0;
            }
            if (early[0]) {
                batcher_cursor_t want;
                if (requested_cursor(&o, early, &want, NULL) < 0) {
                    fprintf(stderr, "draftline run: %s\n", dl_errmsg());
                    return 1;
                }
                resume_check_data(&r, &o, early, &want, batching_reported);
                data_checked = 1;
            }
            if (r.n > 0) {
                fprintf(stderr, "draftline run: --resume %s: refused: %d setting(s) differ from the checkpoint's "
                                "(nothing was started or written)\n", resume_dir, r.n);
                return 2;
            }
        }
    }
    static sup_opts_t so;
    memset(&so, 0, sizeof so);
    char bdir[4096];
    if (bin_dir(bdir, sizeof bdir) < 0) { fprintf(stderr, "draftline run: %s\n", dl_errmsg()); return 1; }
    static const char *const exes[] = {"loader", "optimizer", "drafter_worker", "target_worker"};
    for (int i = 0; i < 4; i++) {
        char e[4200];
        snprintf(e, sizeof e, "%s/%s", bdir, exes[i]);
        if (access(e, X_OK) != 0) {
            fprintf(stderr, "draftline run: stage executable %s not found (build with `make`, or set "
                            "DL_BIN_DIR)\n", e);
            return 1;
        }
    }
    if (o.eval_data) {
        char e[4200];
        snprintf(e, sizeof e, "%s/draftline", bdir);
        if (access(e, X_OK) != 0) {
            fprintf(stderr, "draftline run: --eval-data: %s not found (build with `make`, or set DL_BIN_DIR)\n", e);
            return 1;
        }
    }
    /* shared memory of dead runs (a supervisor killed with SIGKILL): see slab_sweep_dead */
    {
        int swept = slab_sweep_dead(60.0);
        if (swept > 0) log_warn("removed %d shared-memory object(s) of dead runs from /dev/shm", swept);
    }
    /* validation passed: now the out dir */
    if (bus_run_dir_create(out) < 0) { fprintf(stderr, "draftline run: --out %s: %s\n", out, dl_errmsg()); return 1; }
    /* the run dir is this process's from here to its exit (run_lock_take), before the
     * fresh reuse below deletes anything and before the data is prepared into it */
    int lock_fd = -1;
    if (run_lock_take(out, &lock_fd) < 0) { fprintf(stderr, "draftline run: %s\n", dl_errmsg()); return 1; }
    {   /* the dir as it is now that it is ours: another run may have trained in it (and
         * exited) between the checks above and the lock */
        char p[4200], cp[4096];
        struct stat sb;
        snprintf(p, sizeof p, "%s/steps.jsonl", out);
        if (!o.resume && ((stat(p, &sb) == 0 && sb.st_size > 0) || ckpt_resolve(out, cp, sizeof cp) == 0)) {
            fprintf(stderr, "draftline run: --out %s: another `draftline run` trained in this dir while this one "
                            "was starting: choose another --out, or continue it with `draftline run --resume %s`\n",
                    out, out);
            return 2;
        }
        if (o.resume && ckpt_resolve(o.resume, cp, sizeof cp) == 0 && strcmp(cp, resume_dir) != 0) {
            fprintf(stderr, "draftline run: --resume %s: another `draftline run` saved %s while this one was "
                            "starting (it had read %s): run the command again\n", o.resume, cp, resume_dir);
            return 2;
        }
    }
    if (reuse_fresh) {
        char f[4200];
        snprintf(f, sizeof f, "%s/steps.jsonl", out); unlink(f);
        snprintf(f, sizeof f, "%s/metrics.jsonl", out); unlink(f);
    }
    char logs[4200];
    snprintf(logs, sizeof logs, "%s/logs", out);
    if (paths_mkdir_p(logs, 0700) < 0) { fprintf(stderr, "draftline run: %s\n", dl_errmsg()); return 1; }
    char run_id[17];
    snprintf(run_id, sizeof run_id, "%08x", (unsigned)(((uint64_t)time(NULL) * 2654435761u) ^ (uint64_t)getpid() * 40503u));
    char sock[4200];
    snprintf(sock, sizeof sock, "%s", out);
    char probe[BUS_ENDPOINT_MAX];
    if (bus_endpoint(sock, "optimizer", probe, sizeof probe) < 0) {
        snprintf(sock, sizeof sock, "/tmp/dl-%s", run_id);
        if (bus_run_dir_create(sock) < 0) { fprintf(stderr, "draftline run: %s: %s\n", sock, dl_errmsg()); return 1; }
    }
    /* data */
    char cache[4200];
    if (prepare_data(&o, out, cache, sizeof cache) < 0) {
        fprintf(stderr, "draftline run: %s\n", dl_errmsg());
        return 1;
    }
    {   /* the cache's token ids must be the target's: ids < V, and the target's tokenizer
         * (a cache of another tokenizer trained silently on ids that mean other tokens) */
        dlc_t *dc = NULL;
        model_config_t tmc;
        if (dlc_open(cache, &dc) < 0) { fprintf(stderr, "draftline run: %s\n", dl_errmsg()); return 1; }
        const dlc_header_t *dh = dlc_header(dc);
        int bad = 0;
        tok_t *tk = NULL;
        if (pipe_target_config(o.target_model, &tmc) == 0 && dh->n_vocab > tmc.V) {
            fprintf(stderr, "draftline run: --data %s: token ids of a %d-token vocabulary, more than the %d of "
                            "--target-model %s: prepare it with the target's tokenizer (draftline prepare --model)\n",
                    o.data, dh->n_vocab, tmc.V, o.target_model);
            bad = 1;
        } else if (tok_load(o.target_model, &tk) == 0) {
            if (dh->tok_fingerprint != tok_fingerprint(tk)) {
                int same_n = dh->n_vocab == tok_n_vocab(tk);
                if (!same_n) bad = 1;
                log_msg(same_n ? LOG_WARN : LOG_ERROR, __FILE__, __LINE__,
                        "--data %s was prepared with another tokenizer than --target-model %s's (%d tokens, the "
                        "target's %d)%s", cache, o.target_model, dh->n_vocab, tok_n_vocab(tk),
                        same_n ? "" : ": prepare it with the target's tokenizer (draftline prepare --model)");
            }
            tok_destroy(&tk);
        } else {
            log_warn("--target-model %s: no tokenizer (%s): the tokenizer of --data %s is not checked", o.target_model,
                     dl_errmsg(), cache);
        }
        dlc_close(&dc);
        if (bad) return 2;
    }
    uint64_t max_steps = (uint64_t)o.max_steps;
    {
        /* the cursor of micro-batch 0 (cache fingerprint, options) for the optimizer's
         * checkpoints; written before any stage starts (after the --resume data check) */
        uint64_t all = 0;
        batcher_cursor_t cur;
        if (requested_cursor(&o, cache, &cur, &all) < 0) {
            fprintf(stderr, "draftline run: %s\n", dl_errmsg());
            return 1;
        }
        if (have_resume_hdr && !data_checked) {
            rcheck_t r = {resume_dir, 0};
            resume_check_data(&r, &o, cache, &cur, batching_reported);
            if (r.n > 0) {
                fprintf(stderr, "draftline run: --resume %s: refused: the data differs from the checkpoint's "
                                "(no stage was started)\n", resume_dir);
                if (strcmp(sock, out) != 0) rmdir(sock);
                return 2;
            }
        }
        uint8_t cb[BATCHER_CURSOR_BYTES];
        batcher_cursor_encode(&cur, cb);
        char cpath[4300];
        snprintf(cpath, sizeof cpath, "%s/loader.cursor", out);
        FILE *cf = fopen(cpath, "wb");
        if (!cf || fwrite(cb, 1, sizeof cb, cf) != sizeof cb || fclose(cf) != 0) {
            fprintf(stderr, "draftline run: write %s failed\n", cpath);
            return 1;
        }
        if (max_steps == 0 || max_steps > all) {
            if (max_steps > all) log_warn("--max-steps %llu is more than %u epoch(s) give (%llu steps)",
                                          (unsigned long long)max_steps, o.epochs, (unsigned long long)all);
            max_steps = all;
        }
    }
    if (have_resume_hdr && resume_hdr.max_steps > 0 && (uint64_t)resume_hdr.max_steps != max_steps)
        log_warn("--resume: max-steps changes from %llu (the checkpoint's) to %llu: the LR schedule (warmup, "
                 "then cosine decay to max-steps) changes with it; pass --max-steps %llu to keep it",
                 (unsigned long long)resume_hdr.max_steps, (unsigned long long)max_steps,
                 (unsigned long long)resume_hdr.max_steps);
    if (max_steps <= start_step) {
        fprintf(stderr, "draftline run: nothing to do: the checkpoint is at step %llu of %llu (a larger "
                        "--max-steps trains on)\n", (unsigned long long)start_step, (unsigned long long)max_steps);
        return 2;
    }
    so.bin_dir = bdir;
    so.out_dir = out;
    so.sock_dir = sock;
    so.run_id = run_id;
    so.max_steps = max_steps;
    so.start_step = start_step;
    so.mbs_per_step = (uint64_t)o.mbs_per_step;
    so.n_targets = o.targets;
    so.n_drafters = o.drafters;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    so.threads_per_stage = o.threads > 0 ? o.threads : (int)(cores / (o.targets + o.drafters) > 0 ? cores / (o.targets + o.drafters) : 1);
    /* GPU mode: the GPUs do the stages' math (the optimizer too); the host threads
     * only sample anchors and stage metadata: a few each */
    if (gpu_mode && o.threads == 0) so.threads_per_stage = cores / 4 > 2 ? (int)(cores / 4) : 2;
    so.max_restarts = o.max_restarts;
    so.progress_every_s = o.progress_s;
    so.metrics_port = o.metrics_port;
    so.inbox_slots = inbox_slots;
    so.lookahead = lookahead;
    /* recorded in run.json (absolute paths) for `draftline run --resume DIR` */
    static char target_abs[PATH_MAX], cache_abs[PATH_MAX];
    so.target_model = realpath(o.target_model, target_abs) ? target_abs : o.target_model;
    so.data = realpath(cache, cache_abs) ? cache_abs : cache;
    so.save_every = o.save_every;
    so.keep_checkpoints = o.keep_checkpoints;
    so.deterministic = o.deterministic;
    if (o.eval_data) {
        so.eval_data = o.eval_data;
        so.eval_every = o.eval_every;
        so.eval_prompts = o.eval_prompts;
        so.eval_max_new_tokens = o.eval_max_new;
    }
    char *K = fmt("%d", o.mbs_per_step), *seed = fmt("%lld", (long long)o.seed), *tb = fmt("%d", o.token_budget);
    char *bs = fmt("%d", o.block_size), *dl = fmt("%d", o.drafter_layers), *ms = fmt("%llu", (unsigned long long)max_steps);
    char *thr = fmt("%d", so.threads_per_stage);
    sup_stage_spec_t *s = &so.stages[so.n_stages++];
    snprintf(s->name, sizeof s->name, "loader");
    snprintf(s->exe, sizeof s->exe, "loader");
    s->stage_id = 1;
    char *cursor_base = fmt("%s/loader.cursor", out);
    add(s, "--run-dir"); add(s, sock); add(s, "--run-id"); add(s, run_id); add(s, "--cache"); add(s, cache);
    add(s, "--seed"); add(s, seed); add(s, "--token-budget"); add(s, tb);
    add(s, "--micro-batches-per-step"); add(s, K); add(s, "--epochs"); add(s, fmt("%d", o.epochs));
    add(s, "--max-steps"); add(s, ms); add(s, "--start-step"); add(s, fmt("%llu", (unsigned long long)start_step));
    add(s, "--lookahead-mbs"); add(s, fmt("%d", lookahead));
    if (resume_dir[0]) {
        char *cin = fmt("%s/cursor.bin", resume_dir);
        if (cin && access(cin, R_OK) == 0) { add(s, "--cursor-in"); add(s, cin); }
    }
    if (o.max_len > 0) { add(s, "--max-len"); add(s, fmt("%d", o.max_len)); }
    s = &so.stages[so.n_stages++];
    snprintf(s->name, sizeof s->name, "optimizer");
    snprintf(s->exe, sizeof s->exe, "optimizer");
    s->stage_id = 2;
    add(s, "--run-dir"); add(s, sock); add(s, "--run-id"); add(s, run_id); add(s, "--out"); add(s, out);
    add(s, "--target-model"); add(s, o.target_model); add(s, "--drafter-layers"); add(s, dl);
    add(s, "--block-size"); add(s, bs); add(s, "--lr"); add(s, fmt("%.9g", o.lr));
    add(s, "--warmup-steps"); add(s, fmt("%lld", (long long)o.warmup_steps)); add(s, "--max-steps"); add(s, ms);
    add(s, "--micro-batches-per-step"); add(s, K); add(s, "--weight-decay"); add(s, fmt("%.9g", o.weight_decay));
    add(s, "--clip"); add(s, fmt("%.9g", o.clip)); add(s, "--save-every"); add(s, fmt("%lld", (long long)o.save_every));
    add(s, "--seed"); add(s, seed); add(s, "--cursor-base"); add(s, cursor_base);
    if (o.keep_checkpoints > 0) { add(s, "--keep-checkpoints"); add(s, fmt("%lld", (long long)o.keep_checkpoints)); }
    /* recorded in each checkpoint for the --resume check */
    add(s, "--token-budget"); add(s, tb);
    add(s, "--max-len"); add(s, fmt("%d", o.max_len > 0 && o.max_len < o.token_budget ? o.max_len : o.token_budget));
    add(s, "--num-anchors"); add(s, fmt("%d", o.num_anchors)); add(s, "--epochs"); add(s, fmt("%d", o.epochs));
    if (!target_fp && ckpt_target_fingerprint(o.target_model, &target_fp) < 0) target_fp = 0;
    if (target_fp) { add(s, "--target-fp"); add(s, fmt("%016llx", (unsigned long long)target_fp)); }
    if (resume_dir[0]) { add(s, "--resume"); add(s, strdup(resume_dir)); }
    /* GPU mode: the optimizer keeps master weights and moments on the first drafter
     * GPU (same-GPU drafters exchange gradients and weights through IPC-mapped device
     * buffers; drafters on other GPUs read/write them over NVLink/PCIe peer access) */
    if (gpu_mode) { add(s, "--gpu"); add(s, fmt("%d", dgpu[0])); }
    for (int i = 0; i < o.drafters; i++) {
        s = &so.stages[so.n_stages++];
        snprintf(s->name, sizeof s->name, "drafter%d", i);
        snprintf(s->exe, sizeof s->exe, "drafter_worker");
        s->stage_id = 100 + (uint32_t)i;
        add(s, "--run-dir"); add(s, sock); add(s, "--run-id"); add(s, run_id); add(s, "--index"); add(s, fmt("%d", i));
        add(s, "--target-model"); add(s, o.target_model); add(s, "--drafter-layers"); add(s, dl);
        add(s, "--block-size"); add(s, bs); add(s, "--num-anchors"); add(s, fmt("%d", o.num_anchors));
        add(s, "--token-budget"); add(s, tb); add(s, "--micro-batches-per-step"); add(s, K);
        add(s, "--inbox-gb"); add(s, fmt("%.9g", o.inbox_gb)); add(s, "--host-inbox-gb"); add(s, fmt("%.9g", o.host_inbox_gb));
        add(s, "--hs-min-ready"); add(s, fmt("%d", o.hs_min_ready)); add(s, "--seed"); add(s, seed);
        add(s, "--threads"); add(s, thr);
        if (gpu_mode) { add(s, "--gpu"); add(s, fmt("%d", dgpu[i])); }
    }
    for (int i = 0; i < o.targets; i++) {
        s = &so.stages[so.n_stages++];
        snprintf(s->name, sizeof s->name, "target%d", i);
        snprintf(s->exe, sizeof s->exe, "target_worker");
        s->stage_id = 200 + (uint32_t)i;
        add(s, "--run-dir"); add(s, sock); add(s, "--run-id"); add(s, run_id); add(s, "--index"); add(s, fmt("%d", i));
        add(s, "--target-model"); add(s, o.target_model); add(s, "--drafter"); add(s, fmt("%d", i % o.drafters));
        add(s, "--drafter-layers"); add(s, dl); add(s, "--block-size"); add(s, bs);
        add(s, "--token-budget"); add(s, tb); add(s, "--threads"); add(s, thr);
        add(s, "--prefetch"); add(s, fmt("%d", o.prefetch));
        if (gpu_mode) { add(s, "--gpu"); add(s, fmt("%d", tgpu[i])); }
    }
    if (gpu_mode) {
        printf("GPU mode: target GPUs");
        for (int i = 0; i < ngt; i++) printf("%s%d", i ? "," : " ", tgpu[i]);
        printf(", drafter GPUs");
        for (int i = 0; i < ngd; i++) printf("%s%d", i ? "," : " ", dgpu[i]);
        printf("\n");
    }
    printf("draftline run %s: %d target(s), %d drafter(s) on %s, %d thread(s) each; steps %llu..%llu, "
           "%d micro-batch(es) of <= %d tokens per step, lookahead %d; logs in %s/logs\n",
           run_id, o.targets, o.drafters, gpu_mode ? "GPU" : "CPU", so.threads_per_stage, (unsigned long long)start_step,
           (unsigned long long)max_steps, o.mbs_per_step, o.token_budget, lookahead, out);
    fflush(stdout);
    sup_summary_t sum;
    int rc = supervisor_run(&so, &sum);
    if (strcmp(sock, out) != 0) rmdir(sock);
    if (lock_fd >= 0) close(lock_fd);   /* the run dir is free again */
    if (sum.n_first > 0)
        printf("\nsummary: %llu steps%s, loss %.4f (mean of the first %d) -> %.4f (mean of the last %d), "
               "%.0f target tokens/s over %.1f s, %d restart(s)\n",
               (unsigned long long)sum.steps, sum.interrupted ? " (interrupted)" : "", sum.loss_first10,
               sum.n_first, sum.loss_last10, sum.n_last, sum.tokens_per_s, sum.seconds, sum.restarts);
    else
        printf("\nsummary: no step applied%s, %d restart(s)\n", sum.interrupted ? " (interrupted)" : "",
               sum.restarts);
    printf("checkpoint: %s\n", sum.checkpoint[0] ? sum.checkpoint : "(none)");
    fflush(stdout);
    if (rc < 0) { fprintf(stderr, "draftline run: %s\n", dl_errmsg()); return 1; }
    /* the shell convention for a run stopped by a signal (the final checkpoint is written) */
    if (sum.interrupted) return sum.signal == SIGTERM ? 143 : 130;
    return 0;
}
