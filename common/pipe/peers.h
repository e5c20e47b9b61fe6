/* The peer registry of a stage: the peers that said hello on one of its sockets,
 * by bus peer id, with their stage id, incarnation and liveness. One registry per
 * table a stage keeps (the loader's targets, a drafter's targets, the optimizer's
 * drafters); what a stage keeps per peer beyond that (credit, grants, a gradient
 * slab) lives in its own arrays indexed by the registry index, which never changes
 * for a peer id (entries are never removed: a dead peer keeps its index, and a
 * restarted one, whose bus id is the same, gets it back).
 *
 * A hello with an incarnation other than the one known means the peer restarted:
 * peers_hello reports it (PEERS_RESTARTED, with the old incarnation) so the stage
 * forgets what the old incarnation held. Liveness follows the bus: alive from a
 * hello (or the first message), dead from bus_on_peer_dead or the supervisor. No
 * allocation; the caller owns the struct (a field of its stage context). */
#ifndef DL_PIPE_PEERS_H
#define DL_PIPE_PEERS_H

#include "common/bus/bus.h"

#include <stdint.h>

#define PEERS_MAX 256  /* peers per registry (the loader also hears from the optimizer and tools) */

typedef struct {
    char id[BUS_ID_MAX + 1];   /* bus peer id (ROUTER routing id) */
    uint32_t stage_id;         /* from its hello (0 until then) */
    uint64_t incarnation;      /* from its hello (0 until then) */
    int alive;
} peer_info_t;

typedef struct {
    peer_info_t p[PEERS_MAX];
    int n;                     /* entries in use: indexes 0..n-1 */
} peers_t;

/* What a hello told about a peer. */
typedef enum {
    PEERS_SAME = 0,       /* the incarnation already known (a repeated hello) */
    PEERS_NEW = 1,        /* the first hello from this peer id */
    PEERS_RESTARTED = 2,  /* another incarnation than the one known: the old one is gone */
} peers_hello_t;

/* Empties the registry. */
void peers_init(peers_t *r);

/* Index of peer `id`, or -1. */
int peers_find(const peers_t *r, const char *id);

/* Index of peer `id`, added (alive, stage id and incarnation 0) if unknown. -1 when
 * the registry is full (PEERS_MAX) or id is longer than BUS_ID_MAX. */
int peers_add(peers_t *r, const char *id);

/* Records peer i's hello: stage id, incarnation, alive. Returns what it told (see
 * peers_hello_t); *old (may be NULL) = the incarnation known before (0 if none). */
peers_hello_t peers_hello(peers_t *r, int i, uint32_t stage_id, uint64_t incarnation, uint64_t *old);

/* Admits a hello whose credential the caller verified (stage_admit, common/pipe/stage.h):
 * stage stage_id, incarnation inc, from bus id `id`. A stage keeps one registry index
 * whatever its connection:
 *  - id known: it must be the same stage, at the known incarnation or a newer one;
 *  - the stage known under another id (its new incarnation's routing id, or a new
 *    connection): a newer incarnation takes the entry over (the entry's id becomes
 *    `id`: the old connection's messages then find no peer), the same incarnation only
 *    when the old connection is dead, an older one never;
 *  - else a new entry (peers_add).
 * Returns the index, with *what as peers_hello (PEERS_RESTARTED for a takeover) and
 * *old (may be NULL) the incarnation known before; or -1 with *why (static text: the
 * refusal, for the log and the error reply). */
int peers_admit(peers_t *r, const char *id, uint32_t stage_id, uint64_t inc, peers_hello_t *what,
                uint64_t *old, const char **why);

/* Index of the first peer of stage id `stage_id`, or -1. */
int peers_by_stage(const peers_t *r, uint32_t stage_id);

/* Number of live peers. */
int peers_alive(const peers_t *r);

#endif
