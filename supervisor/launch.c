/* sup_launch: `draftline run` after its flags (see launch.h). The phases, in order:
 * GPU lists, --resume defaults, checks that need nothing on disk, the run dir (live
 * runs refused, a fresh reuse), the --resume checks, inbox slots and lookahead, the
 * stage executables, then the run dir taken (run.lock), the data, the loader cursor,
 * the stage list, the supervisor and the summary. Nothing is written before the
 * run dir is taken. */
#include "supervisor/launch_int.h"
#include "common/base/cli.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/paths.h"
#include "common/base/testhook.h"
#include "common/bus/bus.h"
#include "common/mem/slab.h"
#include "common/model/target.h"
#include "common/pipe/layout.h"
#include "common/pipe/model.h"
#include "common/pipe/rbplan.h"
#include "supervisor/mps.h"
#include "supervisor/node_agent.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int sup_bin_dir(char *out, size_t cap) {
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

/* A placement that names nodes (docs/MULTINODE.md section 1; rbplan_parse_place, which
 * `draftline rebalance` shares): a new name gets the next node index in L's table. Returns
 * the number of processes (>= 1), or -1 after printing why (flag named), at most cap. */
static int parse_place(launch_t *L, const char *flag, const char *s, int counts, int *out, int *node, int cap) {
    rbplan_nodes_t t = {.n = L->n_nodes, .fixed = 0};
    for (int k = 0; k < L->n_nodes; k++) snprintf(t.name[k], sizeof t.name[k], "%s", L->node_names[k]);
    int n = rbplan_parse_place(flag, s, counts, &t, out, node, cap);
    for (int k = L->n_nodes; k < t.n; k++) snprintf(L->node_names[k], sizeof L->node_names[k], "%s", t.name[k]);
    L->n_nodes = t.n;
    if (n < 0) { fprintf(stderr, "draftline run: %s\n", dl_errmsg()); return -1; }
    return n;
}

/* A GPU list: node-prefixed (parse_place, which says why it fails) or bare "0,0,1" (every
 * entry the head's): the count, or -1 with the reason on stderr (empty list or entry, not a
 * number, an ordinal outside 0..1023, more than cap entries). */
static int gpu_list(launch_t *L, const char *flag, const char *s, int *out, int *node, int cap) {
    if (strchr(s, ':')) return parse_place(L, flag, s, 0, out, node, cap);
    int n = rbplan_parse_gpus(flag, s, out, cap);
    if (n < 0) fprintf(stderr, "draftline run: %s\n", dl_errmsg());
    return n < 0 ? -1 : n;
}

/* CPU runs: --targets / --drafters with node prefixes ("a:2,b:1"). 0 or 2. */
static int lc_cpu_place(launch_t *L) {
    run_opts_t *o = L->o;
    int dummy[PIPE_MAX_TARGETS > PIPE_MAX_DRAFTERS ? PIPE_MAX_TARGETS : PIPE_MAX_DRAFTERS];
    int n;
    if (o->target_place) {
        if ((n = parse_place(L, "--targets", o->target_place, 1, dummy, L->tnode, PIPE_MAX_TARGETS)) < 0) return 2;
        o->targets = n;
    }
    if (o->drafter_place) {
        if ((n = parse_place(L, "--drafters", o->drafter_place, 1, dummy, L->dnode, PIPE_MAX_DRAFTERS)) < 0) return 2;
        o->drafters = n;
    }
    return 0;
}

/* GPU runs across nodes: hidden states and gradients between nodes move by NCCL
 * (docs/MULTINODE.md section 4), which this version does not have: every target must be
 * on its drafter's node (target i -> drafter i mod M) and every drafter on the optimizer's
 * (drafter 0's). Refused (exit 2) naming the first pair that is not, never run another way. */
static int gpu_pairs_local(const launch_t *L) {
    /* test hook nccl_cross=1 (issue 17, two GPUs): target -> drafter (target_worker/nccl_out.c,
     * drafter_worker/nccl_in.c) and drafters -> optimizer (optimizer/nccl_step.c,
     * drafter_worker/nccl_step.c) across nodes by NCCL */
    int64_t cross = 0;
    int nccl_cross = testhook_i64("nccl_cross", &cross) && cross == 1;
    rbplan_nodes_t t = {.n = L->n_nodes};
    for (int k = 0; k < L->n_nodes; k++) snprintf(t.name[k], sizeof t.name[k], "%s", L->node_names[k]);
    if (rbplan_gpu_pairs_local(L->tnode, L->ngt, L->dnode, L->ngd, L->dnode[0], &t,
                               nccl_cross ? RBPLAN_CROSS_HIDDEN | RBPLAN_CROSS_GRADS : 0) == 0) return 0;
    fprintf(stderr, "draftline run: %s\n", dl_errmsg());
    return 2;
}

/* GPU mode: one target process per --target-gpus entry, one drafter per
 * --drafter-gpus entry; each stage selects its GPU itself after exec (--gpu N):
 * CUDA is never initialised here, before the forks. Entries may name nodes (NAME:),
 * which needs --listen. */
static int lc_gpu_lists(launch_t *L) {
    run_opts_t *o = L->o;
    L->n_nodes = 1;
    snprintf(L->node_names[0], sizeof L->node_names[0], "head");
    if (o->target_gpus || o->drafter_gpus || (o->device && strcmp(o->device, "cpu") != 0)) {
        L->ngt = o->target_gpus ? gpu_list(L, "--target-gpus", o->target_gpus, L->tgpu, L->tnode, PIPE_MAX_TARGETS) : -2;
        L->ngd = o->drafter_gpus ? gpu_list(L, "--drafter-gpus", o->drafter_gpus, L->dgpu, L->dnode, PIPE_MAX_DRAFTERS) : -2;
        if ((L->ngt == -1 && o->target_gpus) || (L->ngd == -1 && o->drafter_gpus)) return 2;   /* said why */
        if (L->ngt < 1 || L->ngd < 1) {
            fprintf(stderr, "draftline run: GPU mode needs --target-gpus and --drafter-gpus, lists of CUDA "
                            "device ordinals such as 0,0,1 (one process per entry)\n");
            return 2;
        }
#ifndef DL_CUDA
        fprintf(stderr, "draftline run: this build has no CUDA (built with CUDA=0): use --device cpu\n");
        return 2;
#endif
        o->targets = L->ngt;
        o->drafters = L->ngd;
    } else if (lc_cpu_place(L)) {
        return 2;
    }
    L->gpu_mode = L->ngt > 0;
    if (L->n_nodes > 1 && !o->listen) {
        fprintf(stderr, "draftline run: the placement names node %s: a multi-node run needs --listen HOST:PORT "
                        "(this host is its head; see docs/MULTINODE.md)\n", L->node_names[1]);
        return 2;
    }
    if (o->eval_data && L->dnode[0] > 0) {
        fprintf(stderr, "draftline run: --eval-data: the optimizer runs with drafter0 on node %s, so its "
                        "checkpoints are there; training-time eval needs them on the head: place drafter0 on the "
                        "head, or evaluate with `draftline eval` on node %s\n", L->node_names[L->dnode[0]],
                L->node_names[L->dnode[0]]);
        return 2;
    }
    if (o->given[RUN_O_BALE - RUN_O_TM] && !o->balance_auto) {
        fprintf(stderr, "draftline run: --balance-every is the period of --balance auto: give --balance auto too\n");
        return 2;
    }
    if (o->balance_auto && o->listen) {
        fprintf(stderr, "draftline run: --balance auto: not for multi-node runs yet (it moves stages of one "
                        "host); choose the split with --targets/--drafters or the GPU lists\n");
        return 2;
    }
    if (o->balance_auto && L->gpu_mode)
        for (int i = 0; i < L->ngt + L->ngd; i++)
            for (int j = i + 1; j < L->ngt + L->ngd; j++)
                if ((i < L->ngt ? L->tgpu[i] : L->dgpu[i - L->ngt]) == (j < L->ngt ? L->tgpu[j] : L->dgpu[j - L->ngt])) {
                    fprintf(stderr, "draftline run: --balance auto moves whole GPUs between targets and drafters: "
                                    "give each target and drafter a GPU of its own (GPU %d runs two stages)\n",
                            i < L->ngt ? L->tgpu[i] : L->dgpu[i - L->ngt]);
                    return 2;
                }
    L->mps_gpu = L->gpu_mode ? sup_mps_shared_gpu(L->tgpu, L->tnode, L->ngt, L->dgpu, L->dnode, L->ngd) : -1;
    return L->gpu_mode ? gpu_pairs_local(L) : 0;
}

/* The nodes of the placement into the supervisor's options: node names, and the node of
 * every stage spec (the loader on the head, the optimizer on drafter 0's node). */
static void lc_place_nodes(launch_t *L) {
    sup_opts_t *so = &L->so;
    so->n_nodes = L->n_nodes;
    for (int k = 0; k < L->n_nodes; k++) snprintf(so->node_names[k], sizeof so->node_names[k], "%s", L->node_names[k]);
    for (int i = 0; i < so->n_stages; i++) {
        sup_stage_spec_t *sp = &so->stages[i];
        uint32_t id = sp->stage_id;
        sp->node = id >= PIPE_ID_TARGET0 ? L->tnode[id - PIPE_ID_TARGET0]
                   : id >= PIPE_ID_DRAFTER0 ? L->dnode[id - PIPE_ID_DRAFTER0]
                   : id == PIPE_ID_OPTIMIZER ? L->dnode[0] : 0;
    }
}

/* The checks that need nothing on disk but the inputs. */
static int lc_validate(launch_t *L) {
    run_opts_t *o = L->o;
    /* --mps on (given, or the run's on --resume) where MPS cannot be: refused here, before
     * anything is written (L->mps_gpu: lc_gpu_lists) */
    if (o->mps == SUP_MPS_ON) {
        char ctl[4096];
        const char *why = !L->gpu_mode ? "it is for GPU runs (--target-gpus / --drafter-gpus)"
                          : L->mps_gpu < 0 ? "no GPU of this host runs both a target and a drafter (MPS is for "
                                             "stages that share a GPU; --mps auto starts it only then)"
                          : sup_mps_find_control(ctl, sizeof ctl) < 0
                              ? "nvidia-cuda-mps-control is not on PATH (it comes with the NVIDIA driver)"
                              : NULL;
        if (why) {
            fprintf(stderr, "draftline run: --mps on%s: %s; --mps off runs without MPS\n",
                    o->given[RUN_O_MPS - RUN_O_TM] ? "" : " (the run's, from run.json)", why);
            return 2;
        }
    }
    if (o->warmup_steps > 0 && o->max_steps > 0 && o->warmup_steps > o->max_steps)
        log_warn("--warmup-steps %lld is more than --max-steps %lld: the learning rate never reaches --lr %g "
                 "(it ends at %.3g)", (long long)o->warmup_steps, (long long)o->max_steps, o->lr,
                 o->lr * (double)o->max_steps / (double)o->warmup_steps);
    if (!o->data) {
        if (o->resume)
            fprintf(stderr, "draftline run: --data is required: the run of --resume %s records no readable data "
                            "cache (run.json \"data\", or <run>/data.dlc)\n", o->resume);
        else
            cli_error("draftline run", "--data is required");
        return 2;
    }
    if (access(o->data, R_OK) != 0) {   /* before --out is created: a typo leaves no empty run dir */
        fprintf(stderr, "draftline run: --data %s: %s\n", o->data, strerror(errno));
        return 2;
    }
    if (access(o->target_model, R_OK) != 0) {
        fprintf(stderr, "draftline run: target model %s not found (run `make model` or pass --target-model)\n",
                o->target_model);
        return 2;
    }
    /* an explicit --max-len past the target's context (max_position_embeddings / GGUF
     * context_length), as generate/eval/regen refuse theirs; unknown context: not checked */
    L->mc_rc = pipe_target_config(o->target_model, &L->mc);   /* the one read of the target's config */
    if (L->mc_rc < 0) snprintf(L->mc_err, sizeof L->mc_err, "%s", dl_errmsg());
    /* weights a stage could never load (a truncated shard): refused now, not restarted as
     * crashes (issue 15 item 2) */
    if (L->mc_rc == 0 && pipe_target_check(o->target_model) < 0) {
        fprintf(stderr, "draftline run: --target-model %s: %s\n", o->target_model, dl_errmsg());
        return 2;
    }
    const model_config_t *mc = &L->mc;
    /* the target's own refusal (target_fp8.c), said here: from a stage it was only a
     * "permanent start-up error" on the console, the reason in target0.log */
    if (o->target_precision == TARGET_PRECISION_FP8 && L->mc_rc == 0 && mc->n_experts > 0) {
        fprintf(stderr, "draftline run: --target-precision fp8: %s is a MoE target (%d experts): not supported "
                        "(the experts stay bf16); use bf16\n", o->target_model, mc->n_experts);
        return 2;
    }
    if (o->max_len > 0 && L->mc_rc == 0 && mc->max_pos > 0 && o->max_len > mc->max_pos) {
        fprintf(stderr, "draftline run: --max-len %d is past the context of %s (%d tokens: "
                        "max_position_embeddings / context_length); use --max-len <= %d\n",
                o->max_len, o->target_model, mc->max_pos, mc->max_pos);
        return 2;
    }
    /* --max-len not given: the token budget, capped at the target's context; resolved here
     * once, so every stage, the data checks, the checkpoint's record and a resume that
     * takes it back see the same value (issue 15 item 22) */
    if (o->max_len == 0 && L->mc_rc == 0 && mc->max_pos > 0 && mc->max_pos < o->token_budget) o->max_len = mc->max_pos;
    if (o->deterministic && o->threads == 0) o->threads = 1;
    if (o->eval_data || o->eval_every) {
        if (!o->eval_data || o->eval_every < 1) {
            cli_error("draftline run", "--eval-data PROMPTS and --eval-every N (>= 1) go together");
            return 2;
        }
        if (access(o->eval_data, R_OK) != 0) {
            fprintf(stderr, "draftline run: --eval-data %s: %s\n", o->eval_data, strerror(errno));
            return 2;
        }
        if (o->save_every == 0)
            log_warn("--eval-every %d: checkpoints are evaluated, and without --save-every there is only the "
                     "final one (not evaluated): no eval will run", o->eval_every);
    }
    if (o->drafters > o->targets) {
        char idle[48];   /* "drafter2", or "drafters 2 to 3" */
        if (o->drafters - o->targets == 1) snprintf(idle, sizeof idle, "drafter%d gets", o->targets);
        else snprintf(idle, sizeof idle, "drafters %d to %d get", o->targets, o->drafters - 1);
        log_warn("%d drafters for %d target(s): target i feeds drafter i mod %d, so %s no input and sit%s "
                 "idle (use --drafters <= --targets)", o->drafters, o->targets, o->drafters, idle,
                 o->drafters - o->targets == 1 ? "s" : "");
    }
    return 0;
}

/* The run directory (--out, the run of --resume, or runs/run-<time>); a live run there
 * (or at --resume) is refused. */
static int lc_out_dir(launch_t *L) {
    const run_opts_t *o = L->o;
    char *out = L->out;
    size_t cap = sizeof L->out;
    if (o->out) snprintf(out, cap, "%s", o->out);
    else if (o->resume) {
        /* the run dir of --resume: a checkpoint's run (<dir>/checkpoints/step_N) or the dir itself */
        if (!L->resume_run[0]) {
            fprintf(stderr, "draftline run: --resume %s is neither a run dir (no run.json) nor a checkpoint "
                            "of one: pass --out DIR to say where the run goes\n", o->resume);
            return 2;
        }
        snprintf(out, cap, "%s", L->resume_run);
    } else {
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(out, cap, "runs/run-%Y%m%d-%H%M%S", &tm);
    }
    int spid = 0;
    if (sup_run_live(out, &spid) == 1) {
        fprintf(stderr, "draftline run: %s: the run is live (supervisor pid %d); stop it first "
                        "(`draftline stop --run %s --wait 60`)\n", out, spid, out);
        return 2;
    }
    if (o->resume && strcmp(o->resume, out) != 0 && sup_run_live(o->resume, &spid) == 1) {
        fprintf(stderr, "draftline run: --resume %s: the run is live (supervisor pid %d); stop it first\n",
                o->resume, spid);
        return 2;
    }
    return 0;
}

/* Inbox slots per drafter (each sized for a full micro-batch) bound how far the
 * loader may run ahead of the current step: items of the next step wait in the
 * inbox until the step is applied, and every routed target may hold one grant, so
 * lookahead <= slots - targets per drafter keeps room for the current step. Then the
 * --resume settings against the checkpoint, before anything is written. */
static int lc_inbox(launch_t *L) {
    const run_opts_t *o = L->o;
    drafter_config_t dc;
    if (L->mc_rc < 0 || pipe_drafter_config(&L->mc, o->drafter_layers, 0, o->block_size, &dc) < 0) {
        fprintf(stderr, "draftline run: %s: %s\n", o->target_model, L->mc_rc < 0 ? L->mc_err : dl_errmsg());
        return 1;
    }
    uint64_t slot = pipe_layout((uint64_t)o->token_budget, (uint64_t)dc.n_feat * (uint64_t)dc.D,
                                L->gpu_mode ? 2 : 4).bytes;
    uint64_t gpu = (uint64_t)(o->inbox_gb * 1073741824.0) / 256 * 256;
    uint64_t host = (uint64_t)(o->host_inbox_gb * 1073741824.0) / 256 * 256;
    int64_t slots = (int64_t)(gpu / slot + host / slot);
    if (slots < 1) {
        fprintf(stderr, "draftline run: --inbox-gb %g + --host-inbox-gb %g cannot hold one micro-batch "
                        "of %d tokens (%.4f GiB of hidden states): raise --inbox-gb or lower --token-budget\n",
                o->inbox_gb, o->host_inbox_gb, o->token_budget, (double)slot / 1073741824.0);
        return 2;
    }
    L->inbox_slots = (int)(slots > INT32_MAX ? INT32_MAX : slots);
    int64_t tpd = (o->targets + o->drafters - 1) / o->drafters;
    int64_t la = slots - tpd;
    L->lookahead = (int)(la < 0 ? 0 : la > o->mbs_per_step ? o->mbs_per_step : la);
    return sup__resume_check_early(L, &dc);
}

/* The stage executables (and draftline itself for --eval-data); shared memory of dead
 * runs (a supervisor killed with SIGKILL) swept: see slab_sweep_dead. */
static int lc_bins(launch_t *L) {
    const run_opts_t *o = L->o;
    if (sup_bin_dir(L->bdir, sizeof L->bdir) < 0) { fprintf(stderr, "draftline run: %s\n", dl_errmsg()); return 1; }
    static const char *const exes[] = {"loader", "optimizer", "drafter_worker", "target_worker"};
    for (int i = 0; i < 4; i++) {
        char e[4200];
        snprintf(e, sizeof e, "%s/%s", L->bdir, exes[i]);
        if (access(e, X_OK) != 0) {
            fprintf(stderr, "draftline run: stage executable %s not found (build with `make`, or set "
                            "DL_BIN_DIR)\n", e);
            return 1;
        }
    }
    if (o->eval_data) {
        char e[4200];
        snprintf(e, sizeof e, "%s/draftline", L->bdir);
        if (access(e, X_OK) != 0) {
            fprintf(stderr, "draftline run: --eval-data: %s not found (build with `make`, or set DL_BIN_DIR)\n", e);
            return 1;
        }
    }
    int swept = slab_sweep_dead(60.0);
    if (swept > 0) log_warn("removed %d shared-memory object(s) of dead runs from /dev/shm", swept);
    return 0;
}

/* Validation passed: the out dir is created and taken (run_lock_take) before the fresh
 * reuse below deletes anything and before the data is prepared into it; then logs/,
 * the run id and the socket dir. */
static int lc_take_dir(launch_t *L) {
    const run_opts_t *o = L->o;
    const char *out = L->out;
    /* an --out that cannot be made a run dir (a file, a read-only filesystem): refused (2) */
    if (bus_run_dir_create(out) < 0) { fprintf(stderr, "draftline run: --out %s: %s\n", out, dl_errmsg()); return 2; }
    if (run_lock_take(out, &L->lock_fd) < 0) { fprintf(stderr, "draftline run: %s\n", dl_errmsg()); return 1; }
    {   /* the dir as it is now that it is ours: another run may have trained in it (and
         * exited) between the checks above and the lock */
        char p[4200], cp[4096];
        struct stat sb;
        snprintf(p, sizeof p, "%s/steps.jsonl", out);
        if (!o->resume && ((stat(p, &sb) == 0 && sb.st_size > 0) || ckpt_resolve(out, cp, sizeof cp) == 0)) {
            fprintf(stderr, "draftline run: --out %s: another `draftline run` trained in this dir while this one "
                            "was starting: choose another --out, or continue it with `draftline run --resume %s`\n",
                    out, out);
            return 2;
        }
        if (o->resume && ckpt_resolve(o->resume, cp, sizeof cp) == 0 && strcmp(cp, L->resume_dir) != 0) {
            fprintf(stderr, "draftline run: --resume %s: another `draftline run` saved %s while this one was "
                            "starting (it had read %s): run the command again\n", o->resume, cp, L->resume_dir);
            return 2;
        }
    }
    if (L->reuse_fresh) {
        char f[4200];
        snprintf(f, sizeof f, "%s/steps.jsonl", out); unlink(f);
        snprintf(f, sizeof f, "%s/metrics.jsonl", out); unlink(f);
    }
    char logs[4200];
    snprintf(logs, sizeof logs, "%s/logs", out);
    if (paths_mkdir_p(logs, 0700) < 0) { fprintf(stderr, "draftline run: %s\n", dl_errmsg()); return 1; }
    snprintf(L->run_id, sizeof L->run_id, "%08x",
             (unsigned)(((uint64_t)time(NULL) * 2654435761u) ^ (uint64_t)getpid() * 40503u));
    snprintf(L->sock, sizeof L->sock, "%s", out);
    char probe[BUS_ENDPOINT_MAX];
    if (bus_endpoint(L->sock, "optimizer", probe, sizeof probe) < 0) {
        snprintf(L->sock, sizeof L->sock, "/tmp/dl-%s", L->run_id);
        if (bus_run_dir_create(L->sock) < 0) {
            fprintf(stderr, "draftline run: %s: %s\n", L->sock, dl_errmsg());
            return 1;
        }
    }
    return 0;
}

/* --mps: the MPS daemon for a GPU that a target and a drafter share (mps.h), started
 * before the stages so they inherit its variables. on: a failure ends the run (exit 1);
 * auto: it is said, and the stages share the GPU as without MPS (--gpu-turns). Without
 * MPS, says how the stages share the GPU. */
static int lc_mps(launch_t *L) {
    if (L->mps_gpu < 0) return 0;
    const char *own = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (L->o->mps == SUP_MPS_OFF) {
        /* how the stages share it (not with a user's MPS: they are its clients) */
        if (!(own && *own)) {
            if (L->o->gpu_turns)
                printf("GPU %d runs a target and a drafter: they take turns on it, one micro-batch at a time "
                       "(--gpu-turns on, the default; off: the driver time-slices them)\n", L->mps_gpu);
            else
                printf("GPU %d runs a target and a drafter: the driver time-slices them (--gpu-turns off; on, the "
                       "default, has them take turns: about 5%% more tokens/s on one H200)\n", L->mps_gpu);
        }
        return 0;
    }
    if (own && *own) {   /* the user's MPS daemon: the stages inherit it */
        printf("CUDA MPS: the stages use yours (CUDA_MPS_PIPE_DIRECTORY=%s); no daemon started\n", own);
        return 0;
    }
    char logs[4200], dir[4300];
    snprintf(logs, sizeof logs, "%s/logs", L->out);
    snprintf(dir, sizeof dir, "%s/mps", logs);
    if (mkdir(logs, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "draftline run: %s: %s\n", logs, strerror(errno));
        return 1;
    }
    double t0 = clock_mono_s();
    sigset_t saved;
    sup_mps_hold(1, &saved);
    int rc = sup_mps_start(&L->mps, L->mps_gpu, dir);
    if (rc == 0 && sup_mps_stop_signalled()) sup_mps_stop(&L->mps);   /* stopped meanwhile */
    sup_mps_hold(0, &saved);   /* a signal that came meanwhile acts now, as without MPS */
    if (rc < 0) {
        if (L->o->mps == SUP_MPS_ON) {
            fprintf(stderr, "draftline run: --mps on: %s\n", dl_errmsg());
            return 1;
        }
        printf("CUDA MPS not started (%s): the stages sharing GPU %d %s (--mps off: not tried)\n",
               dl_errmsg(), L->mps_gpu, L->o->gpu_turns ? "take turns on it" : "time-slice it (--gpu-turns off)");
        return 0;
    }
    printf("CUDA MPS: on, GPU %d runs a target and a drafter side by side (daemon up in %.1f s; pipe dir %s, "
           "log %s; --mps off: they take turns, --gpu-turns)\n", L->mps_gpu, clock_mono_s() - t0, L->mps.dir, dir);
    return 0;
}

static void lc_banner(const launch_t *L) {
    const run_opts_t *o = L->o;
    if (L->gpu_mode) {
        printf("GPU mode: target GPUs");
        for (int i = 0; i < L->ngt; i++) printf("%s%d", i ? "," : " ", L->tgpu[i]);
        printf(", drafter GPUs");
        for (int i = 0; i < L->ngd; i++) printf("%s%d", i ? "," : " ", L->dgpu[i]);
        printf("\n");
    }
    printf("draftline run %s: %d target(s), %d drafter(s) on %s, %d thread(s) each; steps %llu..%llu, "
           "%d micro-batch(es) of <= %d tokens per step, lookahead %d; logs in %s/logs\n",
           L->run_id, o->targets, o->drafters, L->gpu_mode ? "GPU" : "CPU", L->so.threads_per_stage,
           (unsigned long long)L->start_step, (unsigned long long)L->max_steps, o->mbs_per_step, o->token_budget,
           L->lookahead, L->out);
    if (L->net) {
        printf("multi-node head on %s:%d: on each node run\n", L->listen_host, L->listen_port);
        for (int k = 1; k < L->n_nodes; k++)
            printf("  draftline node --join %s:%d --key %s --name %s\n", L->listen_host, L->listen_port, L->key_path,
                   L->node_names[k]);
        if (L->n_nodes < 2)
            printf("  draftline node --join %s:%d --key %s\n", L->listen_host, L->listen_port, L->key_path);
    }
    fflush(stdout);
}

/* Runs the supervisor, frees the run dir and prints the summary; the exit status. */
static int lc_supervise(launch_t *L) {
    sup_summary_t sum;
    int rc = supervisor_run(&L->so, &sum);
    if (strcmp(L->sock, L->out) != 0) rmdir(L->sock);
    if (L->lock_fd >= 0) close(L->lock_fd);   /* the run dir is free again */
    if (sum.n_first > 0) {
        char steady[192], ck[64] = "";
        if (sum.steady_tokens_per_s > 0)
            snprintf(steady, sizeof steady, "steady %.0f target tokens/s (steps %llu..%llu%s%s)",
                     sum.steady_tokens_per_s, (unsigned long long)sum.steady_from, (unsigned long long)sum.steady_to,
                     sum.steady_note[0] ? ": " : "", sum.steady_note);
        else
            snprintf(steady, sizeof steady, "steady n/a (%s)", sum.steady_note[0] ? sum.steady_note : "no rate");
        if (sum.final_ckpt_s > 0)
            snprintf(ck, sizeof ck, ", final checkpoint %.1f s%s", sum.final_ckpt_s,
                     sum.final_ckpt_with_stop ? " with the stop" : "");
        char resumed[96] = "";
        if (L->start_step > 0 && sum.steps >= L->start_step)
            snprintf(resumed, sizeof resumed, " (%llu in this run, from step %llu)",
                     (unsigned long long)(sum.steps - L->start_step), (unsigned long long)L->start_step);
        printf("\nsummary: %llu steps%s%s, loss %.4f (mean of the first %d) -> %.4f (mean of the last %d), %s, "
               "wall %.0f target tokens/s over %.1f s (start-up %.1f s to step %llu%s), %d restart(s)\n",
               (unsigned long long)sum.steps, resumed, sum.interrupted ? " (interrupted)" : "", sum.loss_first10,
               sum.n_first, sum.loss_last10, sum.n_last, steady, sum.wall_tokens_per_s, sum.wall_s, sum.startup_s,
               (unsigned long long)L->start_step, ck, sum.restarts);
    } else
        printf("\nsummary: no step applied%s, %d restart(s)\n", sum.interrupted ? " (interrupted)" : "",
               sum.restarts);
    char none[4200] = "(none)";
    if (L->o->resume) snprintf(none, sizeof none, "(none new; --resume %s is as it was)", L->o->resume);
    printf("checkpoint: %s%s%s%s\n", sum.checkpoint[0] ? sum.checkpoint : none,
           sum.checkpoint[0] && sum.checkpoint_node[0] ? " (on node " : "", sum.checkpoint[0] ? sum.checkpoint_node : "",
           sum.checkpoint[0] && sum.checkpoint_node[0] ? ")" : "");
    fflush(stdout);
    if (rc < 0) { fprintf(stderr, "draftline run: %s\n", dl_errmsg()); return 1; }
    /* the shell convention for a run stopped by a signal (the final checkpoint is written) */
    if (sum.interrupted) return sum.signal == SIGTERM ? 143 : 130;
    return 0;
}

int sup_launch(run_opts_t *o) {
    static launch_t L;
    memset(&L, 0, sizeof L);
    L.o = o;
    L.lock_fd = -1;
    L.so.t_launch = clock_mono_s();   /* the wall clock of the summary starts here */
    /* Everything that does not need the data is checked before the data is prepared and
     * before the out dir is created. */
    int (*const phases[])(launch_t *) = {
        sup__resume_take_defaults, lc_gpu_lists, lc_validate, sup__net_check, lc_out_dir, sup__resume_fresh,
        sup__resume_read, lc_inbox, lc_bins, lc_take_dir, sup__net_keys, sup__data_prepare, sup__data_cursor,
    };
    for (size_t i = 0; i < sizeof phases / sizeof phases[0]; i++) {
        int rc = phases[i](&L);
        if (rc) return rc;
    }
    int rc = sup__build_stages(&L);
    if (rc) return rc;
    lc_place_nodes(&L);
    rc = lc_mps(&L);
    if (rc) {
        if (strcmp(L.sock, L.out) != 0) rmdir(L.sock);
        return rc;
    }
    lc_banner(&L);
    rc = lc_supervise(&L);
    sigset_t saved;
    sup_mps_hold(1, &saved);
    sup_mps_stop(&L.mps);
    sup_mps_hold(0, &saved);
    return rc;
}
