/* `draftline node`: a node agent of a multi-node run (supervisor/node_agent.h): joins
 * the head (`draftline run --listen HOST:PORT`) and runs the stages it places here. */
#include "common/base/cli.h"
#include "common/base/log.h"
#include "supervisor/node_agent.h"
#include "tools/commands.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static void node_usage(FILE *f) {
    fprintf(f,
        "usage: draftline node --join HOST:PORT --key FILE [options]\n"
        "Joins a multi-node run as a node agent: the head (`draftline run --listen HOST:PORT\n"
        "--nodes N ...`) places stages on this host by node name, and this process starts,\n"
        "signals and reaps them (their logs in <run dir>/logs/). Runs until the head says the\n"
        "run is over, or SIGINT/SIGTERM; when the head is lost it stops its stages and joins\n"
        "again every 2 s.\n\n"
        "  --join HOST:PORT     the head's --listen address\n"
        "  --key FILE           the run's key file (mode 0600; the head prints its path)\n"
        "  --name NAME          this node's name in placements (default: the hostname; no\n"
        "                       space, ':' or ',')\n"
        "  --run-dir DIR        logs and the out dir of the stages placed here (default\n"
        "                       ./draftline-node-<name>, created 0700)\n"
        "  --advertise ADDR     the address the other nodes reach this one at (default: the\n"
        "                       local address of the route to the head)\n"
        "  --log-level L        debug|info|warn|error, for this agent and its stages\n"
        "  -h, --help           this help\n"
        "exit status: 0 the run is over or a signal stopped it, 1 I/O error, 2 bad settings or key file, or the\n"
        "head refused this node (its reason is printed)\n");
}

int cmd_node(int argc, char **argv) {
    enum { O_JOIN = 256, O_KEY, O_NAME, O_RUN, O_ADV, O_LL };
    static const struct option opts[] = {
        {"join", 1, 0, O_JOIN}, {"key", 1, 0, O_KEY}, {"name", 1, 0, O_NAME}, {"run-dir", 1, 0, O_RUN},
        {"advertise", 1, 0, O_ADV}, {"log-level", 1, 0, O_LL}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    node_agent_opts_t o = {0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_JOIN: o.join = optarg; break;
        case O_KEY: o.key_path = optarg; break;
        case O_NAME: o.name = optarg; break;
        case O_RUN: o.run_dir = optarg; break;
        case O_ADV: o.advertise = optarg; break;
        case O_LL: {
            log_level_t l;
            if (log_parse_level(optarg, &l) < 0) { cli_error("draftline node", "--log-level: debug|info|warn|error"); return 2; }
            log_set_level(l);
            o.log_level = optarg;
            break;
        }
        case 'h': node_usage(stdout); return 0;
        default: node_usage(stderr); return 2;
        }
    }
    if (optind < argc) { fprintf(stderr, "draftline node: unexpected argument '%s'\n", argv[optind]); return 2; }
    if (!o.join || !o.key_path) { cli_error("draftline node", "--join HOST:PORT and --key FILE are required"); return 2; }
    if (o.advertise && (!*o.advertise || strlen(o.advertise) > 255)) { cli_error("draftline node", "--advertise: empty or too long"); return 2; }
    return node_agent_run(&o);
}
