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

int peers_by_stage(const peers_t *r, uint32_t stage_id) {
    for (int i = 0; i < r->n; i++) if (r->p[i].stage_id == stage_id) return i;
    return -1;
}

int peers_alive(const peers_t *r) {
    int n = 0;
    for (int i = 0; i < r->n; i++) n += r->p[i].alive != 0;
    return n;
}
