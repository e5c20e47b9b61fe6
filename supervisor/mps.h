/* CUDA MPS for a run whose target and drafter share a GPU (`draftline run --mps auto|on`;
 * off by default: in one of four runs on the H200 under MPS the optimizer's
 * event loop stalled 6.5 s around step 0 (false "dead" lines, start-up 15.8 s against
 * 8.5-9.9), cause not found; bench/NOTES.md).
 *
 * Without MPS, the stage processes on one GPU time-slice it: each context runs alone for
 * its slice, and the switches cost. Under an MPS server their kernels run side by side
 * (H200, reference work, one GPU: steady 14,811 -> 15,748 target tokens/s in bf16,
 * 16,546 -> 17,603 with the fp8 target; bench/NOTES.md). The supervisor starts a private
 * MPS control daemon (its own pipe and log dirs under /tmp, so other users of the GPU are
 * not served by it), checks that a CUDA context can be made through it (a child process
 * does, the supervisor itself never touches CUDA), exports CUDA_MPS_PIPE_DIRECTORY and
 * CUDA_MPS_LOG_DIRECTORY (<run>/logs/mps) to the stages it starts afterwards, and quits
 * the daemon at the end of the run. Under MPS a fatal GPU fault in one stage also ends the others of that
 * server (they are restarted like any failed stage); a supervisor killed by SIGKILL
 * leaves the daemon running (`echo quit | CUDA_MPS_PIPE_DIRECTORY=<dir>
 * nvidia-cuda-mps-control` stops it; the run's banner names the dir). Multi-node agents start their
 * stages without it. */
#ifndef DL_SUPERVISOR_MPS_H
#define DL_SUPERVISOR_MPS_H

#include <signal.h>
#include <stddef.h>

enum { SUP_MPS_OFF = 0, SUP_MPS_ON = 1, SUP_MPS_AUTO = 2 };

/* --mps VALUE: "auto" | "on" | "off" into *mode; DL_EINVAL naming the value otherwise. */
int sup_mps_parse(const char *v, int *mode);

/* The --mps value of a mode: "off" | "on" | "auto" (static string; "off" for an unknown mode). */
const char *sup_mps_name(int mode);

/* The first GPU ordinal that a target and a drafter placed on the head (node 0) share:
 * tgpu/tnode (ngt), dgpu/dnode (ngd) as launch.c's GPU lists. -1 when none. */
int sup_mps_shared_gpu(const int *tgpu, const int *tnode, int ngt, const int *dgpu,
                       const int *dnode, int ngd);

/* The path of nvidia-cuda-mps-control found on $PATH into out[cap]: 0, or -1 (not
 * found; out is ""). */
int sup_mps_find_control(char *out, size_t cap);

typedef struct {
    int active;             /* the daemon runs and the stages will use it */
    char dir[64];           /* the pipe dir: /tmp/draftline-mps-XXXXXX (removed at the stop) */
    char control[4096];     /* nvidia-cuda-mps-control */
    char log_dir[4096];     /* absolute; the control program's output goes to control.out */
    char old_log[4096];     /* CUDA_MPS_LOG_DIRECTORY before the start ("" unset) */
} sup_mps_t;

/* Starts the daemon (its logs and the control program's output into log_dir, created if
 * missing, kept) and checks a context on GPU `gpu` through it; the control program and
 * the check each get at most 60 s (then their process group is killed). 0 with
 * m->active = 1 and the two variables set in this process's environment (inherited by
 * the stages). Only where CUDA_MPS_PIPE_DIRECTORY is unset (set, it is the user's own MPS:
 * the caller lets the stages use it). DL_ENOTSUP without starting anything when the
 * control program is not on PATH; DL_EIO when the start or the check fails, everything undone (the daemon asked
 * to quit, the pipe dir removed, the variables as they were). The caller holds SIGINT,
 * SIGTERM and SIGHUP meanwhile (sup_mps_hold). */
int sup_mps_start(sup_mps_t *m, int gpu, const char *log_dir);

/* Quits the daemon, removes its pipe dir (kept, with a warning naming it, when the quit
 * fails) and restores the variables. No-op when not active. */
void sup_mps_stop(sup_mps_t *m);

/* hold 1: blocks SIGINT, SIGTERM and SIGHUP (the old mask into *saved); hold 0: restores
 * *saved, so a signal that came meanwhile acts then. Around the daemon's start and stop,
 * outside the supervisor's own handlers: a signal cannot cut them half-way. */
void sup_mps_hold(int hold, sigset_t *saved);
/* 1 when one of those signals is pending (came while held). */
int sup_mps_stop_signalled(void);

#endif
