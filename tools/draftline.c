/* draftline: the front end. A command table (redis style) maps the first
 * argument to a tools/cmd_<name>.c entry point. */
#include "tools/commands.h"
#include "common/base/log.h"

#include <stdio.h>
#include <string.h>

#define DRAFTLINE_VERSION "0.1.0"

static const cmd_t commands[] = {
    {"version", cmd_version, "print the version"},
    {"prepare", cmd_prepare, "tokenize a chat dataset into a .dlc cache"},
    {"run", cmd_run, "train a drafter: the multi-process pipeline, supervised"},
    {"node", cmd_node, "join a multi-node run as a node agent (--join HOST:PORT --key FILE)"},
    {"status", cmd_status, "a run's topology, routes and stage states (--run DIR)"},
    {"stop", cmd_stop, "stop a run cleanly, with a final checkpoint (--run DIR)"},
    {"rebalance", cmd_rebalance, "change a running job's targets/drafters split (--run DIR --targets N --drafters M)"},
    {"monitor", cmd_monitor, "attach to a run: stage throughput, stall diagnosis, bottleneck"},
    {"plot", cmd_plot, "draw a run's loss, accuracy and tokens/s to a PNG"},
    {"generate", cmd_generate, "generate text from the target (KV cache, greedy or sampling)"},
    {"inspect", cmd_inspect, "print a checkpoint's architecture, shapes, dtypes, parameter count"},
    {"mkmodel", cmd_mkmodel, "write a random-weight model dir with a real model's shapes"},
    {"eval", cmd_eval, "speculative decoding with a drafter: tau, speedup, greedy check"},
    {"regen", cmd_regen, "regenerate a dataset's assistant turns with the target (resumable)"},
};

#define N_COMMANDS ((int)(sizeof commands / sizeof commands[0]))

static void usage(FILE *f) {
    fprintf(f, "usage: draftline COMMAND [ARGS...]\n\n"
               "Trains speculative-decoding drafters (DFlash) against a frozen target.\n\n"
               "commands:\n");
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'draftline COMMAND --help' describes a command.\n");
}

int cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("draftline %s (%s)\n", DRAFTLINE_VERSION,
#ifdef DL_CUDA
           "cuda"
#else
           "cpu-only"
#endif
    );
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) return cmd_version(argc - 1, argv + 1);
    for (int i = 0; i < N_COMMANDS; i++) {
        if (!strcmp(argv[1], commands[i].name)) {
            log_init(commands[i].name, LOG_INFO);
            return commands[i].fn(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "draftline: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
