/* Handle cache (see hcache.h). A small array: a stage sees a handful of peers. */
#include "common/mem/hcache.h"
#include "common/base/err.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    slab_t *slab;
} hc_entry_t;

struct hcache {
    int device;
    hc_entry_t *e;
    int n, cap;
    uint64_t opens;
};

int hcache_new(hcache_t **out, int device) {
    hcache_t *hc = calloc(1, sizeof *hc);
    if (!hc) return dl_seterr(DL_ENOMEM, "hcache_new: out of memory");
    hc->device = device;
    *out = hc;
    return 0;
}

void hcache_destroy(hcache_t **hcp) {
    if (!hcp || !*hcp) return;
    hcache_t *hc = *hcp;
    for (int i = 0; i < hc->n; i++) slab_destroy(&hc->e[i].slab);
    free(hc->e);
    free(hc);
    *hcp = NULL;
}

static void drop_at(hcache_t *hc, int i) {
    slab_destroy(&hc->e[i].slab);
    hc->e[i] = hc->e[--hc->n];
}

int hcache_get(hcache_t *hc, const slab_handle_t *h, void **ptr) {
    for (int i = 0; i < hc->n; i++) {
        const slab_handle_t *c = slab_handle(hc->e[i].slab);
        if (c->owner_id != h->owner_id || strncmp(c->name, h->name, sizeof c->name) != 0) continue;
        if (c->incarnation == h->incarnation && c->bytes == h->bytes) {
            *ptr = slab_ptr(hc->e[i].slab);
            return 0;
        }
    }
    /* A newer incarnation of this owner: close the stale mappings first. */
    for (int i = 0; i < hc->n;) {
        const slab_handle_t *c = slab_handle(hc->e[i].slab);
        if (c->owner_id == h->owner_id && c->incarnation != h->incarnation) drop_at(hc, i);
        else i++;
    }
    if (hc->n == hc->cap) {
        int cap = hc->cap ? 2 * hc->cap : 8;
        hc_entry_t *e = realloc(hc->e, (size_t)cap * sizeof *e);
        if (!e) return dl_seterr(DL_ENOMEM, "hcache: out of memory");
        hc->e = e;
        hc->cap = cap;
    }
    slab_t *s;
    DL_TRY(slab_open(&s, h, hc->device));
    hc->opens++;
    hc->e[hc->n++].slab = s;
    *ptr = slab_ptr(s);
    return 0;
}

int hcache_drop_owner(hcache_t *hc, uint32_t owner_id) {
    int n = 0;
    for (int i = 0; i < hc->n;) {
        if (slab_handle(hc->e[i].slab)->owner_id == owner_id) { drop_at(hc, i); n++; }
        else i++;
    }
    return n;
}

uint64_t hcache_opens(const hcache_t *hc) { return hc->opens; }
int hcache_size(const hcache_t *hc) { return hc->n; }
