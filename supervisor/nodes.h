/* Internal to supervisor/: the head's side of node agents (nodes.c; docs/MULTINODE.md
 * sections 1, 3, 5). The node table (node 0 = the head), node_hello / node_stage from
 * the agents, waiting for --nodes before any stage starts, stages placed on another
 * node started and signalled through its agent, and an agent's death.
 *
 * One host (sup_opts_t.nodes_wait 0 and no named node): S->ntab.on is 0 and every
 * call here is a no-op or the local path (sup__kill is kill(2)).
 */
#ifndef DL_SUPERVISOR_NODES_H
#define DL_SUPERVISOR_NODES_H

#include "supervisor/sup_int.h"
#include "common/pipe/runcfg.h"

#define SUP_NODES_PROGRESS_S 5.0    /* the "waiting for nodes" line: at most every this many s, */
#define SUP_NODES_REMIND_S 30.0     /* and when nothing changed, only every this many s */
/* CONTROL STOP's arg from the head to an agent: the run is over (exit 0), or the head
 * declared the node lost and heard it again (stop the stages, join again). */
#define NODE_STOP_RUN_OVER "run over"
#define NODE_STOP_REJOIN "rejoin"


/* Sets the node table up (S->nodes[], S->ntab) from the options: node k named
 * o->node_names[k]; agents are taken when --nodes > 0 or the placement names nodes. */
void sup__nodes_init(sup_t *S);
/* At the start: 1 when the stages must wait for the nodes (they are marked exited, not
 * started; the tick starts them once every node joined), 0 to start them now. */
int sup__nodes_defer_start(sup_t *S);
/* Every tick: while waiting, the progress line, the timeout (the run fails) and the
 * start once every node joined. */
void sup__nodes_tick(sup_t *S, double now);
/* The ROUTER's message m from peer, when it is a node agent's (node_hello, node_stage):
 * handled here, returns 1; else 0 (and m is the caller's). */
int sup__nodes_on_msg(sup_t *S, const char *peer, const proto_msg_t *m);
/* The bus reported peer dead: when it is a node agent, every stage of that node is dead
 * (sup__on_exit) and waits for the node to join again. */
void sup__nodes_on_dead(bus_t *bus, const char *peer, uint64_t silent_ms, void *arg);
/* The bus reports peer new (again): when it is a node the head declared lost, the agent
 * gets CONTROL STOP "rejoin" (it stops its stages and sends node_hello again). */
void sup__nodes_on_new(bus_t *bus, const char *peer, void *arg);
/* The node index x runs on (0: the head; always 0 on one host): the node of its running
 * incarnation (x->node_was while a rebalance moves it), else its spec's. */
int sup__stage_node(const sup_t *S, const sstage_t *x);
/* Whether x (exited) may be started now: 1 (the head's, or its node is alive), 0 (its
 * node is lost: x stays exited, its restart waits for the node). A move across nodes
 * takes effect here: the next incarnation goes to spec->node (x->node_was cleared). */
int sup__node_can_spawn(const sup_t *S, sstage_t *x);
/* Starts incarnation x->incarnation of x (already counted by sup__spawn) on its node
 * (node_spawn to the agent); x->pid is the remote pid once the agent says STARTED. */
void sup__spawn_remote(sup_t *S, sstage_t *x);
/* Sends signal sig to x: kill(2) on the head (when x->pid > 0), node_signal to its
 * agent (for x's incarnation) on another node. */
void sup__kill(sup_t *S, sstage_t *x, int sig);
/* The run is over (every stage is gone): each agent still up gets CONTROL STOP with
 * arg "run over", on which it stops and exits 0 (it would otherwise wait for the head
 * to come back). Sent just before the supervisor's bus closes (it lingers for them). */
void sup__nodes_run_over(sup_t *S);
/* The run's result when the join failed: DL_ETIMEDOUT with the reason set; else 0. */
int sup__nodes_result(const sup_t *S);
/* The node name of stage x ("" on one host), for run.json. */
const char *sup__stage_node_name(const sup_t *S, const sstage_t *x);

#endif
