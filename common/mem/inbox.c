/* Byte-bounded two-tier slot allocator (see inbox.h). */
#include "common/mem/inbox.h"
#include "common/base/err.h"

#include <stdlib.h>
#include <string.h>

typedef struct { uint64_t off, len; } range_t;

typedef struct {
    uint64_t cap, used;
    range_t *free_;      /* sorted by offset, coalesced */
    uint32_t nfree;
} tier_t;

struct inbox {
    tier_t t[2];
    inbox_slot_t *slots; /* indexed by id */
    uint8_t *live;
    uint32_t max_slots, nlive;
    uint64_t high;
};

int inbox_new(inbox_t **out, const uint64_t cap_bytes[2], uint32_t max_slots) {
    if (max_slots == 0) return dl_seterr(DL_EINVAL, "inbox: max_slots must be >= 1");
    inbox_t *ib = calloc(1, sizeof *ib);
    if (!ib) return dl_seterr(DL_ENOMEM, "inbox_new: out of memory");
    ib->max_slots = max_slots;
    ib->slots = calloc(max_slots, sizeof *ib->slots);
    ib->live = calloc(max_slots, 1);
    for (int k = 0; k < 2; k++) {
        /* at most max_slots+1 free ranges can exist */
        ib->t[k].free_ = calloc((size_t)max_slots + 1, sizeof(range_t));
        ib->t[k].cap = cap_bytes[k] / INBOX_ALIGN * INBOX_ALIGN;
        if (ib->t[k].cap) { ib->t[k].free_[0] = (range_t){0, ib->t[k].cap}; ib->t[k].nfree = 1; }
    }
    if (!ib->slots || !ib->live || !ib->t[0].free_ || !ib->t[1].free_) {
        inbox_destroy(&ib);
        return dl_seterr(DL_ENOMEM, "inbox_new: out of memory");
    }
    *out = ib;
    return 0;
}

void inbox_destroy(inbox_t **p) {
    if (!p || !*p) return;
    inbox_t *ib = *p;
    free(ib->slots);
    free(ib->live);
    free(ib->t[0].free_);
    free(ib->t[1].free_);
    free(ib);
    *p = NULL;
}

static int tier_take(tier_t *t, uint64_t len, uint64_t *off) {
    for (uint32_t i = 0; i < t->nfree; i++) {
        if (t->free_[i].len < len) continue;
        *off = t->free_[i].off;
        t->free_[i].off += len;
        t->free_[i].len -= len;
        if (t->free_[i].len == 0) {
            memmove(&t->free_[i], &t->free_[i + 1], (t->nfree - i - 1) * sizeof(range_t));
            t->nfree--;
        }
        t->used += len;
        return 1;
    }
    return 0;
}

static void tier_give(tier_t *t, uint64_t off, uint64_t len) {
    uint32_t i = 0;
    while (i < t->nfree && t->free_[i].off < off) i++;
    memmove(&t->free_[i + 1], &t->free_[i], (t->nfree - i) * sizeof(range_t));
    t->free_[i] = (range_t){off, len};
    t->nfree++;
    if (i + 1 < t->nfree && t->free_[i].off + t->free_[i].len == t->free_[i + 1].off) {
        t->free_[i].len += t->free_[i + 1].len;
        memmove(&t->free_[i + 1], &t->free_[i + 2], (t->nfree - i - 2) * sizeof(range_t));
        t->nfree--;
    }
    if (i > 0 && t->free_[i - 1].off + t->free_[i - 1].len == t->free_[i].off) {
        t->free_[i - 1].len += t->free_[i].len;
        memmove(&t->free_[i], &t->free_[i + 1], (t->nfree - i - 1) * sizeof(range_t));
        t->nfree--;
    }
    t->used -= len;
}

int inbox_alloc(inbox_t *ib, uint64_t bytes, int allow_host, inbox_slot_t *slot) {
    if (bytes == 0) return dl_seterr(DL_EINVAL, "inbox_alloc: 0 bytes");
    uint64_t len = (bytes + INBOX_ALIGN - 1) / INBOX_ALIGN * INBOX_ALIGN;
    if (len > ib->t[INBOX_GPU].cap && (!allow_host || len > ib->t[INBOX_HOST].cap))
        return dl_seterr(DL_ERANGE,
                         "inbox: a %llu-byte micro-batch exceeds the inbox tiers (%llu GPU, %llu "
                         "host bytes); raise --inbox-gb or lower --token-budget",
                         (unsigned long long)bytes, (unsigned long long)ib->t[0].cap,
                         (unsigned long long)ib->t[1].cap);
    if (ib->nlive == ib->max_slots) return DL_EAGAIN;
    uint32_t id = 0;
    while (ib->live[id]) id++;
    uint64_t off;
    int tier = -1;
    if (tier_take(&ib->t[INBOX_GPU], len, &off)) tier = INBOX_GPU;
    else if (allow_host && tier_take(&ib->t[INBOX_HOST], len, &off)) tier = INBOX_HOST;
    if (tier < 0) return DL_EAGAIN;
    ib->live[id] = 1;
    ib->nlive++;
    ib->slots[id] = (inbox_slot_t){id, (uint32_t)tier, off, len};
    uint64_t sum = ib->t[0].used + ib->t[1].used;
    if (sum > ib->high) ib->high = sum;
    *slot = ib->slots[id];
    return 0;
}

int inbox_free(inbox_t *ib, uint32_t id) {
    if (id >= ib->max_slots || !ib->live[id])
        return dl_seterr(DL_ENOENT, "inbox: slot %u is not live", id);
    inbox_slot_t *s = &ib->slots[id];
    tier_give(&ib->t[s->tier], s->offset, s->bytes);
    ib->live[id] = 0;
    ib->nlive--;
    return 0;
}

int inbox_get(const inbox_t *ib, uint32_t id, inbox_slot_t *slot) {
    if (id >= ib->max_slots || !ib->live[id])
        return dl_seterr(DL_ENOENT, "inbox: slot %u is not live", id);
    *slot = ib->slots[id];
    return 0;
}

uint64_t inbox_cap(const inbox_t *ib, inbox_tier_t t) { return ib->t[t].cap; }
uint64_t inbox_used(const inbox_t *ib, inbox_tier_t t) { return ib->t[t].used; }
uint64_t inbox_high_water(const inbox_t *ib) { return ib->high; }
uint32_t inbox_live(const inbox_t *ib) { return ib->nlive; }
uint64_t inbox_largest_free(const inbox_t *ib, inbox_tier_t t) {
    uint64_t m = 0;
    for (uint32_t i = 0; i < ib->t[t].nfree; i++)
        if (ib->t[t].free_[i].len > m) m = ib->t[t].free_[i].len;
    return m;
}
