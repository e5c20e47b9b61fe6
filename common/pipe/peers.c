/* Peer registry of a stage (see peers.h). */
#include "common/pipe/peers.h"

#include <stdio.h>
#include <string.h>

void peers_init(peers_t *r) { memset(r, 0, sizeof *r); }

int peers_find(const peers_t *r, const char *id) {
    for (int i = 0; i < r->n; i++) if (!strcmp(r->p[i].id, id)) return i;
    return -1;
}

int peers_add(peers_t *r, const char *id) {
    int i = peers_find(r, id);
    if (i >= 0) return i;
    if (r->n == PEERS_MAX || strlen(id) > BUS_ID_MAX) return -1;
    i = r->n++;
    memset(&r->p[i], 0, sizeof r->p[i]);
    snprintf(r->p[i].id, sizeof r->p[i].id, "%s", id);
    r->p[i].alive = 1;
    return i;
}

peers_hello_t peers_hello(peers_t *r, int i, uint32_t stage_id, uint64_t incarnation, uint64_t *old) {
    peer_info_t *p = &r->p[i];
    uint64_t was = p->incarnation;
    if (old) *old = was;
    p->stage_id = stage_id;
    p->incarnation = incarnation;
    p->alive = 1;
    if (was == incarnation) return PEERS_SAME;
    return was ? PEERS_RESTARTED : PEERS_NEW;
}

int peers_admit(peers_t *r, const char *id, uint32_t stage_id, uint64_t inc, peers_hello_t *what,
                uint64_t *old, const char **why) {
    int i = peers_find(r, id);
    if (i >= 0 && r->p[i].stage_id != stage_id) {
        *why = "this connection said hello as another stage";
        return -1;
    }
    if (i < 0 && (i = peers_by_stage(r, stage_id)) >= 0) {
        peer_info_t *p = &r->p[i];
        if (inc < p->incarnation || (inc == p->incarnation && p->alive)) {
            *why = inc < p->incarnation ? "an older incarnation than the one known"
                                        : "that incarnation is connected already";
            return -1;
        }
        snprintf(p->id, sizeof p->id, "%s", id);   /* the takeover: the old id is no peer now */
    }
    if (i >= 0 && inc < r->p[i].incarnation) {
        *why = "an older incarnation than the one known";
        return -1;
    }
    if (i < 0 && (i = peers_add(r, id)) < 0) {
        *why = "too many peers";
        return -1;
    }
    *what = peers_hello(r, i, stage_id, inc, old);
    return i;
}

int peers_by_stage(const peers_t *r, uint32_t stage_id) {
    for (int i = 0; i < r->n; i++) if (r->p[i].stage_id == stage_id) return i;
    return -1;
}

int peers_alive(const peers_t *r) {
    int n = 0;
    for (int i = 0; i < r->n; i++) n += r->p[i].alive != 0;
    return n;
}
