/* `draftline run` after its flags: the run configuration (run_opts_t, filled by
 * tools/cmd_run.c from flags and --config YAML) and sup_launch, which checks it,
 * defaults a --resume from the run it continues, takes the run dir (run.lock), prepares
 * the data, builds every stage's argv and runs the supervisor (supervisor.h) to the end.
 */
#ifndef DL_SUPERVISOR_LAUNCH_H
#define DL_SUPERVISOR_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

/* Option codes of `draftline run` (getopt_long values; run_opts_t.given is indexed by
 * code - RUN_O_TM). */
enum {
    RUN_O_TM = 256, RUN_O_DATA, RUN_O_PF, RUN_O_RF, RUN_O_TG, RUN_O_DG, RUN_O_DEV, RUN_O_NT, RUN_O_ND,
    RUN_O_TB, RUN_O_ML, RUN_O_BS, RUN_O_NA, RUN_O_DL, RUN_O_LR, RUN_O_WU, RUN_O_MS, RUN_O_EP, RUN_O_K,
    RUN_O_SE, RUN_O_OUT, RUN_O_DET, RUN_O_SEED, RUN_O_RES, RUN_O_IG, RUN_O_HG, RUN_O_MR, RUN_O_CFG,
    RUN_O_WD, RUN_O_CL, RUN_O_TH, RUN_O_RS, RUN_O_PS, RUN_O_PREF, RUN_O_MP, RUN_O_EVD, RUN_O_EVE,
    RUN_O_EVP, RUN_O_EVM, RUN_O_KC, RUN_O_LISTEN, RUN_O_KEY, RUN_O_NODES, RUN_O_JT, RUN_O_BAL, RUN_O_BALE, RUN_O_TP, RUN_O_MPS,
    RUN_O_GT
};

/* The settings of one `draftline run` (units in the flag names: --inbox-gb GiB,
 * --progress-every s). Strings are borrowed (argv, or kept for the process by the YAML
 * loader); target_model and resume_data are owned copies. */
typedef struct {
    char target_model[4096];
    const char *data, *prompt_field, *response_field, *out, *resume, *device;
    const char *target_gpus, *drafter_gpus;
    const char *target_place, *drafter_place;  /* CPU runs: --targets / --drafters "NAME:N,..." (NULL: a count) */
    int targets, drafters, token_budget, max_len, block_size, num_anchors, drafter_layers;
    double lr, weight_decay, clip;
    int64_t warmup_steps, max_steps, save_every, seed, keep_checkpoints;
    int epochs, mbs_per_step, deterministic, hs_min_ready, threads, max_restarts, prefetch;
    double inbox_gb, host_inbox_gb, progress_s;
    int metrics_port;
    /* multi-node (docs/MULTINODE.md): listen "HOST:PORT" (NULL: one host), key file
     * (NULL: <out>/node.key), agents to wait for, seconds to wait for them */
    const char *listen, *key;
    int nodes;
    double join_timeout_s;
    const char *eval_data;
    int eval_every, eval_prompts, eval_max_new;
    int balance_auto;           /* --balance auto (1) / off (0) */
    double balance_every_s;     /* --balance-every S */
    int target_precision;       /* --target-precision: TARGET_PRECISION_BF16 (0) | _FP8 */
    int mps;                    /* --mps: SUP_MPS_OFF (default) | _AUTO | _ON (supervisor/mps.h) */
    int gpu_turns;              /* --gpu-turns: 1 on (default) | 0 off (common/pipe/gputurn.h) */
    uint8_t given[64];          /* given[code - RUN_O_TM]: set by a flag or --config (not a default) */
    char resume_data[4096];     /* --resume: the run's data cache (o.data points here) */
    char resume_tgpus[512], resume_dgpus[512];  /* --resume: the run's GPU lists (o.target_gpus / o.drafter_gpus) */
} run_opts_t;
_Static_assert(RUN_O_GT - RUN_O_TM < 64, "run_opts_t.given holds every option code");

/* The stage executables' dir into out[cap]: $DL_BIN_DIR, else the dir of this
 * executable (/proc/self/exe). 0, or DL_EIO with the error set. */
int sup_bin_dir(char *out, size_t cap);

/* Runs `draftline run` with the parsed settings o: everything after the flags (GPU lists,
 * --resume defaults and checks, out dir, run lock, data, stage argv, the supervisor, the
 * summary on stdout). o is updated in place (--resume fills the settings not given).
 * Errors go to stderr. Returns the process exit status: 0 done, 1 failure (I/O, a stage
 * failed), 2 refused (bad settings, live run, --resume mismatch, nothing to do), 130/143
 * stopped by SIGINT/SIGTERM (the final checkpoint written). One call per process (it
 * holds <out>/run.lock until exit and keeps static state). */
int sup_launch(run_opts_t *o);

#endif
