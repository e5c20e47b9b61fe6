/* optimizer: its --help text and its learning-rate schedule (opt_int.h). */
#include "optimizer/opt_int.h"

#include <math.h>
#include <stdio.h>

void opt_usage(FILE *f) {
    fprintf(f,
        "usage: optimizer --run-dir DIR --incarnation N [--log-level L]\n"
        "Pipeline stage 4: fp32 master weights, AdamW, exactly-once step ledger, checkpoints.\n"
        "Started by `draftline run`; every setting (out dir, target model, drafter shape, lr,\n"
        "schedule, checkpoints, resume dir, GPU, ...) comes from the run configuration the\n"
        "supervisor sends first (common/pipe/runcfg.h).\n\n"
        "  --run-dir DIR              sockets directory of the run (holds the supervisor's sup.sock)\n"
        "  --incarnation N            restart count given by the supervisor (default 1)\n"
        "  --index I                  accepted for symmetry with the other stages: 0 only\n"
        "  --log-level L              error|warn|info|debug\n"
        "  -h, --help                 this help\n");
}

double opt_lr_at(double lr, uint64_t warmup, uint64_t max_steps, uint64_t step) {
    if (warmup && step < warmup) return lr * (double)(step + 1) / (double)warmup;
    if (max_steps <= warmup + 1) return lr;
    double p = (double)(step - warmup) / (double)(max_steps - warmup - 1);
    if (p > 1) p = 1;
    const double min_ratio = 0.1;
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + cos(M_PI * p)));
}
