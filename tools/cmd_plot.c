/* draftline plot: a run's loss, per-position accuracy and tokens/s to a PNG
 * (common/monitor/plot.h). */
#include "tools/commands.h"

#include "common/base/cli.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/monitor/plot.h"
#include "common/monitor/run.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void plot_usage(FILE *f) {
    fprintf(f,
            "usage: draftline plot --run DIR [--out FILE.png] [--width PX] [--height PX]\n"
            "                      [--loss-scale auto|log|linear] [--title TEXT]\n\n"
            "Draws loss, per-position accuracy and target tokens/s over steps of a run\n"
            "(from DIR/steps.jsonl and DIR/metrics.jsonl) into a PNG, with its events marked:\n"
            "eval results (tau), the end of the lr warm-up, restarts, resumes, rebalances,\n"
            "checkpoints (\"ckpt S held X s\": no step was applied for X s while its state was\n"
            "copied, hence the tokens/s dip there; the files are written beside the steps).\n"
            "The same scalars are in DIR/tb/ for TensorBoard (`tensorboard --logdir DIR/tb`).\n\n"
            "  --run DIR       run directory (`draftline run --out DIR`)\n"
            "  --out FILE      PNG to write (default DIR/plot.png)\n"
            "  --width PX      image width (default 1200)\n"
            "  --height PX     image height (default 1350)\n"
            "  --title TEXT    title (default: the run dir and step count)\n"
            "  --loss-scale S  loss axis: log, linear, or auto (default: log when the loss\n"
            "                  after the first steps spans more than a factor 2)\n");
}

int cmd_plot(int argc, char **argv) {
    static const struct option opts[] = {
        {"run", required_argument, 0, 'r'}, {"out", required_argument, 0, 'o'},
        {"width", required_argument, 0, 'W'}, {"height", required_argument, 0, 'H'},
        {"title", required_argument, 0, 't'}, {"loss-scale", required_argument, 0, 'L'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *dir = NULL, *out = NULL;
    mon_plot_opts_t po = {0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'r': dir = optarg; break;
        case 'o': out = optarg; break;
        case 'W': if (cli_parse_int("--width", optarg, 300, 10000, &po.width) < 0) { cli_error("plot", dl_errmsg()); return 2; } break;
        case 'H': if (cli_parse_int("--height", optarg, 300, 10000, &po.height) < 0) { cli_error("plot", dl_errmsg()); return 2; } break;
        case 't': po.title = optarg; break;
        case 'L':
            if (!strcmp(optarg, "auto")) po.loss_scale = MON_PLOT_LOSS_AUTO;
            else if (!strcmp(optarg, "log")) po.loss_scale = MON_PLOT_LOSS_LOG;
            else if (!strcmp(optarg, "linear")) po.loss_scale = MON_PLOT_LOSS_LINEAR;
            else { cli_error("plot", "--loss-scale: expected auto, log or linear"); return 2; }
            break;
        case 'h': plot_usage(stdout); return 0;
        default: plot_usage(stderr); return 2;
        }
    }
    if (!dir || optind < argc) { plot_usage(stderr); return 2; }
    mon_run_t *run = mon_run_open(dir);
    if (!run) return log_rc(DL_ENOENT, "plot"), 1;
    int rc = mon_run_poll(run);
    if (rc < 0) { log_rc(rc, "plot"); mon_run_destroy(&run); return 1; }
    char def[4200];
    if (!out) { snprintf(def, sizeof def, "%s/plot.png", dir); out = def; }
    rc = mon_plot_png(run, out, &po);
    if (rc < 0) { log_rc(rc, "plot"); mon_run_destroy(&run); return 1; }
    const mon_step_t *last = mon_run_last_step(run);
    printf("wrote %s (%llu steps, last loss %.4f)\n", out, (unsigned long long)(last ? last->step + 1 : 0),
           last ? last->loss : 0.0);
    mon_run_destroy(&run);
    return 0;
}
