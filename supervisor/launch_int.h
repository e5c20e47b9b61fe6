/* Internal to supervisor/launch.c, resume.c, data.c, stages.c: the state of one
 * sup_launch (launch_t; static, one per process) and the phases those files share.
 * Each phase returns 0 to go on, or the exit status of `draftline run` (1 or 2) after
 * printing why on stderr.
 *
 *   launch.c   sup_launch: GPU lists, checks, out dir, run lock, bin dir, summary
 *   resume.c   --resume: defaults from the run, fresh reuse, the checks against the
 *              checkpoint (state.bin header, config.json, cursor.bin)
 *   data.c     data preparation into <out>/data.dlc, the cache/target check, the
 *              loader cursor of micro-batch 0, max-steps
 *   stages.c   sup_opts_t, the run configuration and every stage's spec
 */
#ifndef DL_SUPERVISOR_LAUNCH_INT_H
#define DL_SUPERVISOR_LAUNCH_INT_H

#include "supervisor/launch.h"
#include "supervisor/mps.h"
#include "common/model/config.h"
#include "supervisor/supervisor.h"
#include "common/data/batcher.h"
#include "common/model/dflash_ckpt.h"
#include "common/pipe/ckpt.h"
#include "common/pipe/runcfg.h"
#include "common/pipe/stage.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    run_opts_t *o;
    int tgpu[PIPE_MAX_TARGETS], dgpu[PIPE_MAX_DRAFTERS], ngt, ngd;
    int gpu_mode;               /* --target-gpus/--drafter-gpus given (ngt > 0) */
    /* node placement (launch.c, the NAME: prefixes of the placement flags): the node of
     * target / drafter i (0 = the head); node k is node_names[k] (0: "head") */
    int tnode[PIPE_MAX_TARGETS], dnode[PIPE_MAX_DRAFTERS];
    char node_names[RUNCFG_NODES_MAX][64];
    int n_nodes;
    char resume_run[4096];      /* the run dir of the checkpoint, or --resume itself (no checkpoint) */
    char out[4096];             /* the run dir */
    int reuse_fresh;            /* out held a run with nothing to continue: started anew */
    uint64_t start_step, max_steps;
    char resume_dir[4200];      /* the resolved checkpoint dir of --resume ("" none) */
    ckpt_state_hdr_t resume_hdr;
    int have_resume_hdr, batching_reported, data_checked;
    uint64_t target_fp;         /* the target's fingerprint (0: not taken yet) */
    model_config_t mc;          /* the target's config, read once (lc_validate) when mc_rc is 0 */
    int mc_rc;                  /* pipe_target_config's result; < 0: mc_err says why */
    char mc_err[512];
    int lookahead, inbox_slots; /* the loader's --lookahead-mbs; full micro-batch slots per inbox */
    char bdir[4096];            /* the stage executables' dir */
    int lock_fd;                /* <out>/run.lock, held to the exit (-1: none) */
    char run_id[17];
    char sock[4200];            /* socket dir: out, or /tmp/dl-<run_id> when out's path is too long */
    char cache[4200];           /* the data cache (.dlc) the run trains on */
    run_config_t cfg;           /* the run's one configuration (sup__build_stages) */
    /* multi-node head (--listen; net.c): host and port to bind, the key file (absolute)
     * and its keys; net 0: one host */
    int net;
    char listen_host[256];
    int listen_port;
    char key_path[4200];
    bus_curve_keys_t keys;
    sup_opts_t so;
    sup_mps_t mps;              /* --mps: the daemon of this run (launch.c lc_mps) */
    int mps_gpu;                /* a GPU that a target and a drafter share (-1: none) */
} launch_t;

/* resume.c */
/* --resume: settings not given default to the run's; logs the ones taken. */
int sup__resume_take_defaults(launch_t *L);
/* out holds an earlier run: refused, reused as fresh (L->reuse_fresh), or --resume dropped
 * when the run saved nothing. */
int sup__resume_fresh(launch_t *L);
/* Reads the checkpoint of --resume (L->resume_dir, resume_hdr, start_step). */
int sup__resume_read(launch_t *L);
/* The settings against the checkpoint (dc: the requested drafter config), its data
 * when the cache is known without preparing, and (version 2) model.safetensors' tensor
 * table against dc's (ckpt_verify_layout); before anything is written. */
int sup__resume_check_early(launch_t *L, const drafter_config_t *dc);
/* The data against the checkpoint's cursor.bin once the cache is prepared (cur: the
 * requested cursor of micro-batch 0), unless sup__resume_check_early did it. */
int sup__resume_check_late(launch_t *L, const batcher_cursor_t *cur);

/* data.c */
/* 1 when s ends with suf. */
int sup__ends_with(const char *s, const char *suf);
/* The requested cursor of micro-batch 0 of cache (fingerprint, batching options of o)
 * and the steps the epochs give (*all; all may be NULL). 0 or a dl_err, the error set. */
int sup__requested_cursor(const run_opts_t *o, const char *cache, batcher_cursor_t *cur, uint64_t *all);
/* Prepares --data into L->cache (or takes a .dlc as is) and checks its token ids and
 * tokenizer against the target's. */
int sup__data_prepare(launch_t *L);
/* Writes <out>/loader.cursor (after the late --resume data check) and settles
 * L->max_steps from the epochs. */
int sup__data_cursor(launch_t *L);

/* net.c */
/* --listen HOST:PORT, --key, --nodes, --join-timeout: checked before anything is
 * created (exit 2 with the flag named). Sets L->net, listen_host, listen_port. */
int sup__net_check(launch_t *L);
/* Multi-node head, once the out dir is taken: loads --key, or creates it (0600; default
 * <out>/node.key) when missing; L->key_path absolute. 0, or 1/2 after printing why. */
int sup__net_keys(launch_t *L);

/* stages.c */
/* Fills L->so: the supervisor's options, the run's configuration (L->cfg, taken by
 * sup__run_config and validated; so.cfg points at it) and every stage's spec (exe, name,
 * id, GPU). Returns 0, or 1 after printing why the configuration is invalid. */
int sup__build_stages(launch_t *L);
/* The run's one configuration from the run options and what the launch settled so far
 * (L): the values every stage takes, as its flags pass them today (lr, weight decay,
 * clip and the inbox sizes through "%.9g", max_len 0 when not given, the placement
 * -1 = CPU outside GPU mode). Fields not settled yet (the data cache before
 * sup__data_prepare, max_steps before sup__data_cursor, threads before
 * sup__build_stages) are as L holds them. Not validated here. */
void sup__run_config(const launch_t *L, run_config_t *c);

#endif
