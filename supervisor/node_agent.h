/* The node agent behind `draftline node --join HOST:PORT --key FILE` (docs/MULTINODE.md
 * sections 1, 3, 5): one per host of a multi-node run that is not the head. It joins
 * the head's supervisor over tcp:// with the run's CURVE keys (a DEALER with identity
 * "node-<name>", the pipeline's heartbeats), registers (node_hello: name, host, address,
 * run dir, cores, GPUs through NVML), then starts, signals and reaps the stages the
 * supervisor places on its host (node_spawn, node_signal, node_stage) as the supervisor
 * does its own children. It never initialises CUDA. A lost head (no heartbeat for
 * PIPE_DEAD_MS), or the head's CONTROL STOP "rejoin" (it declared this node lost, then
 * heard it again), stops its stages (SIGTERM, SIGKILL after 20 s) and, once they are
 * gone, it joins again (same name and incarnation) every 2 s. No node_welcome 10 s after
 * a (re)join attempt: a line says so (wrong key or port?), again every 30 s.
 * SIGINT/SIGTERM stop its stages and end it.
 */
#ifndef DL_SUPERVISOR_NODE_AGENT_H
#define DL_SUPERVISOR_NODE_AGENT_H

#define NODE_REJOIN_MS 2000          /* node_hello again while not joined */
#define NODE_STOP_KILL_S 20.0        /* SIGTERM to a stage, then SIGKILL this much later */
#define NODE_NO_ANSWER_S 10.0        /* no node_welcome this long after a (re)join attempt: say so */
#define NODE_NO_ANSWER_REPEAT_S 30.0 /* ... and again every this many s */

/* Settings of one agent (strings borrowed for the call). */
typedef struct {
    const char *join;           /* "HOST:PORT" of the head's --listen */
    const char *key_path;       /* the run's key file (bus_curve_keys_load) */
    const char *name;           /* node name; NULL: gethostname() */
    const char *run_dir;        /* NULL: ./draftline-node-<name> (0700; logs/ inside) */
    const char *advertise;      /* address peers reach; NULL: the local address of the route to the head */
    const char *log_level;      /* passed on to the stages; NULL: their default */
} node_agent_opts_t;

/* Runs the agent until SIGINT/SIGTERM. Errors go to stderr, naming the flag or file.
 * Returns the process exit status: 0 (stopped by a signal, its stages stopped), 1 (I/O:
 * the run dir, sockets), 2 (refused: bad settings or key file, or the head refused the
 * node: its PROTO_ERROR text is printed). */
int node_agent_run(const node_agent_opts_t *o);

/* Longest node name: the agent's bus id "node-<name>.<8 hex>" fits BUS_ID_MAX (63). */
#define NODE_NAME_CHARS 48
/* Whether name is a valid node name: 1..NODE_NAME_CHARS bus id characters (0x21..0x7e)
 * other than ':' and ','. 1 or 0. */
int node_name_ok(const char *name);

#endif
