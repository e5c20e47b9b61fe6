/* The multi-node parts of what the supervisor tells its stages (docs/MULTINODE.md):
 * where the supervisor listens and each stage's node in its RUN_CONFIG. */
#include "supervisor/sup_int.h"
#include "common/base/err.h"

#include <stdio.h>
#include <string.h>

int sup__sup_endpoint(const sup_opts_t *o, char *buf, size_t cap) {
    if (!o->listen_port) return bus_endpoint(o->sock_dir, "sup", buf, cap);
    int n = snprintf(buf, cap, "tcp://%s:%d", o->listen_host, o->listen_port);
    if (n < 0 || (size_t)n >= cap) return dl_seterr(DL_ERANGE, "--listen %s: too long", o->listen_host);
    return 0;
}

/* The node a stage runs on as its peers must see it. */
static int node_of(const sup_t *S, uint32_t id, int n_targets) {
    if (S->fake_nodes) {
        if (id >= PIPE_ID_TARGET0) return 1 + (int)(id - PIPE_ID_TARGET0);
        if (id >= PIPE_ID_DRAFTER0) return 1 + n_targets + (int)(id - PIPE_ID_DRAFTER0);
        return 0;
    }
    for (int i = 0; i < S->n; i++)
        if (S->st[i].spec->stage_id == id) return S->st[i].spec->node;
    return 0;
}

void sup__net_config(const sup_t *S, const sstage_t *x, run_config_t *c) {
    const sup_opts_t *o = S->o;
    if (!o->listen_port) return;
    c->net_port = (uint32_t)o->listen_port;
    c->n_nodes = S->fake_nodes ? 1 + c->n_targets + c->n_drafters : o->n_nodes;
    if (c->n_nodes > RUNCFG_NODES_MAX) c->n_nodes = RUNCFG_NODES_MAX;   /* fake_nodes: checked at start */
    for (int k = 0; k < c->n_nodes; k++) {
        const char *a = S->fake_nodes || k == 0 ? o->listen_host : S->nodes[k].addr;
        snprintf(c->node_addr[k], sizeof c->node_addr[k], "%s", a[0] ? a : "?");
    }
    c->loader_node = node_of(S, PIPE_ID_LOADER, c->n_targets);
    for (int i = 0; i < c->n_targets; i++) c->target_node[i] = node_of(S, PIPE_ID_TARGET0 + (uint32_t)i, c->n_targets);
    for (int i = 0; i < c->n_drafters; i++)
        c->drafter_node[i] = node_of(S, PIPE_ID_DRAFTER0 + (uint32_t)i, c->n_targets);
    /* the optimizer runs where drafter 0 runs (its gradients stay local there) */
    c->optimizer_node = S->fake_nodes ? (int)c->drafter_node[0] : node_of(S, PIPE_ID_OPTIMIZER, c->n_targets);
    int k = S->fake_nodes ? 0 : x->spec->node;
    if (k > 0 && S->nodes[k].run_dir[0]) snprintf(c->out_dir, sizeof c->out_dir, "%s", S->nodes[k].run_dir);
}

int sup__opt_remote(const sup_t *S) {
    if (!S->o->listen_port || S->fake_nodes) return 0;
    for (int i = 0; i < S->n; i++)
        if (S->st[i].spec->stage_id == PIPE_ID_OPTIMIZER) return S->st[i].spec->node > 0;
    return 0;
}
