/* The `draftline` front end's command table. Each command lives in
 * tools/cmd_<name>.c and has the signature of cmd_fn: argv[0] is the command
 * name, it parses its own flags (getopt_long, --help), returns a process exit
 * code (0 ok, 1 runtime error, 2 usage error). */
#ifndef DL_TOOLS_COMMANDS_H
#define DL_TOOLS_COMMANDS_H

typedef int (*cmd_fn)(int argc, char **argv);

typedef struct {
    const char *name;
    cmd_fn fn;
    const char *summary;
} cmd_t;

int cmd_version(int argc, char **argv);
int cmd_prepare(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_node(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_stop(int argc, char **argv);
int cmd_rebalance(int argc, char **argv);
int cmd_monitor(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_regen(int argc, char **argv);
/* Add new commands here and in the table in tools/draftline.c. */

#endif
