/* `draftline run`: trains a DFlash drafter with the four-stage pipeline.
 * Parses flags (and a YAML config with the same keys; flags override) into a
 * run_opts_t and hands it to sup_launch (supervisor/launch.h), which checks it,
 * defaults a --resume from its run, takes the run dir, prepares the data and runs the
 * supervisor. */
#include "common/base/cli.h"
#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/model/target.h"
#include "supervisor/launch.h"
#include "supervisor/mps.h"
#include "tools/commands.h"

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

static const struct option run_options[] = {
    {"target-model", 1, 0, RUN_O_TM}, {"data", 1, 0, RUN_O_DATA}, {"prompt-field", 1, 0, RUN_O_PF},
    {"response-field", 1, 0, RUN_O_RF}, {"target-gpus", 1, 0, RUN_O_TG}, {"drafter-gpus", 1, 0, RUN_O_DG},
    {"device", 1, 0, RUN_O_DEV}, {"targets", 1, 0, RUN_O_NT}, {"drafters", 1, 0, RUN_O_ND},
    {"token-budget", 1, 0, RUN_O_TB}, {"max-len", 1, 0, RUN_O_ML}, {"block-size", 1, 0, RUN_O_BS},
    {"num-anchors", 1, 0, RUN_O_NA}, {"drafter-layers", 1, 0, RUN_O_DL}, {"lr", 1, 0, RUN_O_LR},
    {"warmup-steps", 1, 0, RUN_O_WU}, {"max-steps", 1, 0, RUN_O_MS}, {"epochs", 1, 0, RUN_O_EP},
    {"micro-batches-per-step", 1, 0, RUN_O_K}, {"save-every", 1, 0, RUN_O_SE}, {"out", 1, 0, RUN_O_OUT},
    {"deterministic", 0, 0, RUN_O_DET}, {"seed", 1, 0, RUN_O_SEED}, {"resume", 1, 0, RUN_O_RES},
    {"inbox-gb", 1, 0, RUN_O_IG}, {"host-inbox-gb", 1, 0, RUN_O_HG}, {"hs-min-ready", 1, 0, RUN_O_MR},
    {"config", 1, 0, RUN_O_CFG}, {"weight-decay", 1, 0, RUN_O_WD}, {"clip", 1, 0, RUN_O_CL},
    {"threads", 1, 0, RUN_O_TH}, {"max-restarts", 1, 0, RUN_O_RS}, {"progress-every", 1, 0, RUN_O_PS},
    {"prefetch", 1, 0, RUN_O_PREF}, {"metrics-port", 1, 0, RUN_O_MP},
    {"eval-data", 1, 0, RUN_O_EVD}, {"eval-every", 1, 0, RUN_O_EVE},
    {"eval-prompts", 1, 0, RUN_O_EVP}, {"eval-max-new-tokens", 1, 0, RUN_O_EVM},
    {"keep-checkpoints", 1, 0, RUN_O_KC}, {"listen", 1, 0, RUN_O_LISTEN}, {"key", 1, 0, RUN_O_KEY},
    {"nodes", 1, 0, RUN_O_NODES}, {"join-timeout", 1, 0, RUN_O_JT}, {"balance", 1, 0, RUN_O_BAL},
    {"balance-every", 1, 0, RUN_O_BALE}, {"target-precision", 1, 0, RUN_O_TP},
    {"mps", 1, 0, RUN_O_MPS}, {"gpu-turns", 1, 0, RUN_O_GT},
    {"help", 0, 0, 'h'}, {0, 0, 0, 0}};

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
        "  --target-precision P       bf16 (default) or fp8: the targets' decoder linears (q, k, v, o,\n"
        "                             gate, up, down) in FP8 E4M3, one scale per output channel and per\n"
        "                             token; embedding, LM head, norms, attention stay bf16. Halves the\n"
        "                             target's weight memory; the features differ from bf16 by a few %%.\n"
        "                             GPUs: needs sm_89+ (Hopper: cuBLASLt FP8), refused at load\n"
        "                             otherwise; CPU: an exact fp32 emulation (slow, for tests); MoE\n"
        "                             targets: refused. Recorded in the run's run.json: --resume without\n"
        "                             it keeps the run's precision; another one is used but warned\n"
        "topology\n"
        "  --device cpu               CPU mode (POSIX shared memory stands in for CUDA IPC)\n"
        "  --targets N --drafters M   processes in CPU mode (default 1 and 1); target i feeds drafter i%%M\n"
        "                             (drafters > targets: the extra drafters get no input; warned)\n"
        "  --target-gpus 0,1 --drafter-gpus 2,3   GPU mode (CUDA builds): one target process per\n"
        "                             entry (repeat a GPU to share it: 0,0,0), one drafter per entry;\n"
        "                             hidden states go into the drafter's GPU by CUDA IPC\n"
        "  --mps off|auto|on          CUDA MPS when a target and a drafter share a GPU of this host.\n"
        "                             off (default): they take turns (--gpu-turns on) or time-slice\n"
        "                             it (--gpu-turns off); auto: MPS where a GPU is shared (said when\n"
        "                             the daemon cannot start: the run goes on without); on: a run\n"
        "                             without it is refused.\n"
        "                             The supervisor starts a private nvidia-cuda-mps-control daemon\n"
        "                             (logs in <out>/logs/mps) and quits it at the end. One H200:\n"
        "                             +6%% steady over time-slicing, as much as turns give; one run in\n"
        "                             ten stalled 6.5 s before step 0 under it (cause not found yet),\n"
        "                             hence not the default. Every stage of the run then is an MPS\n"
        "                             client; CUDA_MPS_PIPE_DIRECTORY already set: the stages use that\n"
        "                             daemon. Recorded in run.json: --resume takes it unless given\n"
        "  --gpu-turns on|off         GPU stages (targets, drafters, the optimizer) take turns on their\n"
        "                             GPU when there is no MPS (on, the default; alone on a GPU a turn\n"
        "                             costs microseconds): a target's forward of a micro-batch, a\n"
        "                             drafter's forward + backward of one, the optimizer's step, each\n"
        "                             alone on the GPU, holding <run dir>/gpu<N>.turn (a lock: given\n"
        "                             back when the work is done, dropped by the kernel when a process\n"
        "                             dies). A stage waiting over 60 s goes on without it (warned; a\n"
        "                             hung holder can hold up each stage that waits after it in turn).\n"
        "                             Other GPU work (weight copies, checkpoint snapshots) is not in a\n"
        "                             turn. Each stage's wait is its wait_gpu_s metric (added when the\n"
        "                             wait ends). off: the driver time-slices a shared GPU. One H200, 8B\n"
        "                             target + 5-layer drafter on one GPU: on is 5-6%% more tokens/s.\n"
        "                             Recorded in run.json: --resume takes it unless given\n"
        "  --threads N                threads per compute stage (0 or absent: CPU cores / (targets+drafters);\n"
        "                             GPU runs: cores / 4, at least 2, for host-side work; the\n"
        "                             optimizer's one-off weight init at start-up uses every core)\n"
        "training\n"
        "  --token-budget N           tokens per micro-batch (default 1024)\n"
        "  --max-len N                tokens per sequence (default: token budget, capped at the target's\n"
        "                             context; longer ones truncated);\n"
        "                             at most the target's context (max_position_embeddings), else exit 2\n"
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
        "                             checkpoints/step_* are removed (never the latest, one past it\n"
        "                             (kept from before a resume from an older one), nor the one\n"
        "                             resumed from until a newer one exists); default 0: keep all\n"
        "  --resume DIR               continue exactly from a checkpoint dir or a run dir's latest\n"
        "                             (refused while that run is live; a run dir with no checkpoint\n"
        "                             and no applied step, e.g. Ctrl-C at start-up, starts fresh: its\n"
        "                             --max-steps and K from run.json, the rest as given now or the\n"
        "                             defaults, which it names);\n"
        "                             settings the continuation depends on (seed, token budget, max len,\n"
        "                             anchors, epochs, K, drafter layers, block size, target, data) must\n"
        "                             be the checkpoint's: checked first, a mismatch exits 2 naming it;\n"
        "                             every setting not given (flag or --config) is the run's: those,\n"
        "                             --max-steps, --lr, --warmup-steps, --weight-decay, --clip, --save-every,\n"
        "                             --keep-checkpoints, --deterministic, --data (its cache), --target-model,\n"
        "                             --target-precision (run.json; its own line), --out (the run dir of\n"
        "                             the checkpoint), --mps, --gpu-turns and, when none of --target-gpus,\n"
        "                             --drafter-gpus, --device, --targets, --drafters is given, the\n"
        "                             placement (a GPU run's GPU lists as it last ran, a CPU run's counts;\n"
        "                             refused when run.json is malformed or names nodes or a placement\n"
        "                             draftline does not write: give it); one line lists them (the\n"
        "                             default 1 and 1 is not listed)\n"
        "  --inbox-gb X               drafter inbox, GPU tier, GiB (default 0.25)\n"
        "  --host-inbox-gb X          drafter inbox, host tier, GiB (default 0)\n"
        "  --hs-min-ready K           drafter pool of ready micro-batches (default 1)\n"
        "  --prefetch N               micro-batches a target requests ahead (default 1)\n"
        "  --max-restarts N           restarts per stage before the run fails (default 5)\n"
        "  --progress-every S         seconds between progress lines (default 5)\n"
        "  --metrics-port P           serve the metrics in the Prometheus text format on\n"
        "                             0.0.0.0:P/metrics (0: any free port, see run.json; default off)\n"
        "several hosts (docs/MULTINODE.md)\n"
        "  --listen HOST:PORT         be the head of a multi-node run: stages talk over tcp:// with\n"
        "                             CURVE keys, on ports PORT..PORT+163 of each host\n"
        "  --key FILE                 the run's key file (created 0600 if missing; default\n"
        "                             <out>/node.key); each node joins with it:\n"
        "                             draftline node --join HOST:PORT --key FILE\n"
        "  --nodes N                  wait for N node agents before starting any stage (and for\n"
        "                             every node the placement names)\n"
        "  --target-gpus a:0-3,b:0-3 --drafter-gpus c:0-7   GPU placement on nodes: NAME: applies\n"
        "                             to the entries after it (A-B: a range); entries before any\n"
        "                             prefix are the head's; CPU runs: --targets a:2,b:1 --drafters b:2\n"
        "                             (counts per node). The optimizer runs on drafter 0's node\n"
        "  --join-timeout S           give up waiting for them after S s (default 300)\n"
        "training-time eval (a `draftline eval` child process on CPU, one at a time)\n"
        "  --eval-data PROMPTS        held-out prompt set (any format `draftline eval --data` reads)\n"
        "  --eval-every N             tau eval of each checkpoint whose step is a multiple of N (needs\n"
        "                             --save-every); logged to metrics.jsonl (stage \"eval\"), eval/\n"
        "  --eval-prompts K           first K prompts (default 4)\n"
        "  --eval-max-new-tokens M    per prompt (default 48)\n"
        "live changes: `draftline rebalance --run DIR --targets N --drafters M`, `draftline status`\n"
        "  --balance auto|off         auto: the supervisor picks the target/drafter split itself from\n"
        "                             the stages' measured rates (after 2 steps and --balance-every S,\n"
        "                             then every S) and rebalances live when that predicts >= 15%% more\n"
        "                             tokens/s; each decision printed with its numbers. CPU: the\n"
        "                             processes are shared, and every prediction is capped by what\n"
        "                             the cores allow (CPU time per token); GPU: whole GPUs, one stage\n"
        "                             each. One host only; not kept by --resume (default off)\n"
        "  --balance-every S          seconds between its checks (default 60)\n"
        "  --config FILE.yaml         the same keys as the flags (without --); flags override\n"
        "  -h, --help                 this help\n"
        "exit status: 0 the run reached --max-steps or the end of its epochs; 143 stopped by\n"
        "  SIGTERM or `draftline stop`, 130 by Ctrl-C (both after a final checkpoint; --resume\n"
        "  DIR goes on); 2 refused before anything started (a flag, the config, the resume);\n"
        "  1 the run failed (the last lines and <out>/logs say why).\n");
}

static int set_opt(run_opts_t *o, int code, const char *v) {
    int64_t x;
    if (code >= RUN_O_TM && code - RUN_O_TM < (int)sizeof o->given) o->given[code - RUN_O_TM] = 1;
    switch (code) {
    case RUN_O_TM: snprintf(o->target_model, sizeof o->target_model, "%s", v); return 0;
    case RUN_O_DATA: o->data = v; return 0;
    case RUN_O_PF: o->prompt_field = v; return 0;
    case RUN_O_RF: o->response_field = v; return 0;
    case RUN_O_TG: o->target_gpus = v; return 0;
    case RUN_O_DG: o->drafter_gpus = v; return 0;
    case RUN_O_DEV: o->device = v; return 0;
    /* NAME:N,... places them on nodes (sup_launch parses it; docs/MULTINODE.md) */
    case RUN_O_NT: if (strchr(v, ':')) { o->target_place = v; return 0; }
        o->target_place = NULL; return cli_parse_int("--targets", v, 1, 64, &o->targets);
    case RUN_O_ND: if (strchr(v, ':')) { o->drafter_place = v; return 0; }
        o->drafter_place = NULL; return cli_parse_int("--drafters", v, 1, 64, &o->drafters);
    case RUN_O_TB: return cli_parse_int("--token-budget", v, 16, 1 << 21, &o->token_budget);
    case RUN_O_ML: return cli_parse_int("--max-len", v, 2, 1 << 21, &o->max_len);
    case RUN_O_BS: return cli_parse_int("--block-size", v, 2, 64, &o->block_size);
    case RUN_O_NA: return cli_parse_int("--num-anchors", v, 1, 1 << 20, &o->num_anchors);
    case RUN_O_DL: return cli_parse_int("--drafter-layers", v, 1, 64, &o->drafter_layers);
    case RUN_O_LR: return cli_parse_f64("--lr", v, 0, 10, &o->lr);
    case RUN_O_WU: return cli_parse_i64("--warmup-steps", v, 0, INT32_MAX, &o->warmup_steps);
    case RUN_O_MS: return cli_parse_i64("--max-steps", v, 0, INT32_MAX, &o->max_steps);
    case RUN_O_EP: return cli_parse_int("--epochs", v, 1, 1 << 20, &o->epochs);
    case RUN_O_K: return cli_parse_int("--micro-batches-per-step", v, 1, 4096, &o->mbs_per_step);
    case RUN_O_SE: return cli_parse_i64("--save-every", v, 0, INT32_MAX, &o->save_every);
    case RUN_O_KC: return cli_parse_i64("--keep-checkpoints", v, 0, INT32_MAX, &o->keep_checkpoints);
    case RUN_O_OUT: o->out = v; return 0;
    case RUN_O_DET: { int b = 1; if (v && cli_parse_bool("--deterministic", v, &b) < 0) return DL_EINVAL; o->deterministic = b; return 0; }
    case RUN_O_SEED: return cli_parse_i64("--seed", v, 0, INT64_MAX, &o->seed);
    case RUN_O_RES: o->resume = v; return 0;
    case RUN_O_IG: return cli_parse_f64("--inbox-gb", v, 0, 4096, &o->inbox_gb);
    case RUN_O_HG: return cli_parse_f64("--host-inbox-gb", v, 0, 4096, &o->host_inbox_gb);
    case RUN_O_MR: return cli_parse_int("--hs-min-ready", v, 1, 1024, &o->hs_min_ready);
    case RUN_O_WD: return cli_parse_f64("--weight-decay", v, 0, 10, &o->weight_decay);
    case RUN_O_CL: return cli_parse_f64("--clip", v, 0, 1e9, &o->clip);
    case RUN_O_TH: return cli_parse_int("--threads", v, 0, 1024, &o->threads);
    case RUN_O_RS: return cli_parse_int("--max-restarts", v, 0, 1000, &o->max_restarts);
    case RUN_O_PS: return cli_parse_f64("--progress-every", v, 0.2, 3600, &o->progress_s);
    case RUN_O_PREF: return cli_parse_int("--prefetch", v, 1, 8, &o->prefetch);
    case RUN_O_MP: return cli_parse_int("--metrics-port", v, 0, 65535, &o->metrics_port);
    case RUN_O_EVD: o->eval_data = v; return 0;
    case RUN_O_EVE: return cli_parse_int("--eval-every", v, 1, INT32_MAX, &o->eval_every);
    case RUN_O_EVP: return cli_parse_int("--eval-prompts", v, 1, 1 << 20, &o->eval_prompts);
    case RUN_O_EVM: return cli_parse_int("--eval-max-new-tokens", v, 1, 1 << 16, &o->eval_max_new);
    case RUN_O_LISTEN: o->listen = v; return 0;
    case RUN_O_KEY: o->key = v; return 0;
    case RUN_O_NODES: return cli_parse_int("--nodes", v, 0, 15, &o->nodes);
    case RUN_O_JT: return cli_parse_f64("--join-timeout", v, 1, 86400, &o->join_timeout_s);
    case RUN_O_BAL:
        if (!strcmp(v, "auto") || !strcmp(v, "off")) { o->balance_auto = !strcmp(v, "auto"); return 0; }
        return dl_seterr(DL_EINVAL, "--balance %s: expected auto or off", v);
    case RUN_O_BALE: return cli_parse_f64("--balance-every", v, 1, 86400, &o->balance_every_s);
    case RUN_O_TP: return target_precision_parse(v, &o->target_precision);
    case RUN_O_MPS: return sup_mps_parse(v, &o->mps);
    case RUN_O_GT:
        if (!strcmp(v, "on") || !strcmp(v, "off")) { o->gpu_turns = !strcmp(v, "on"); return 0; }
        return dl_seterr(DL_EINVAL, "--gpu-turns %s: expected on or off", v);
    case RUN_O_CFG: return 0;
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
                if (!code || code == RUN_O_CFG || code == 'h') {
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

int cmd_run(int argc, char **argv) {
    static run_opts_t o;
    memset(&o, 0, sizeof o);
    o.targets = 1; o.drafters = 1; o.token_budget = 1024; o.block_size = 8; o.num_anchors = 32;
    o.drafter_layers = 1; o.lr = 1e-3; o.clip = 1.0; o.epochs = 1; o.mbs_per_step = 1;
    o.inbox_gb = 0.25; o.hs_min_ready = 1; o.max_restarts = 5; o.progress_s = 5; o.prefetch = 1;
    o.gpu_turns = 1;
    o.metrics_port = -1; o.mps = SUP_MPS_OFF; o.eval_prompts = 4; o.eval_max_new = 48; o.join_timeout_s = 300;
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
    return sup_launch(&o);
}
