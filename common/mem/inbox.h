/* Inbox: the byte-bounded slot allocator of a drafter.
 *
 * Two tiers, each one slab made at start-up: the GPU tier (--inbox-gb; on CPU
 * runs a shared-memory slab standing in for device memory) and the host tier
 * (--host-inbox-gb; shared memory, page-locked on CUDA builds). A slot is a byte
 * range [offset, offset+bytes) of one tier, 256-byte aligned, granted to one target
 * for one micro-batch and released by the drafter after the micro-batch's backward.
 * Allocation is first-fit over a sorted free list; nothing is allocated beyond the
 * two tiers, so the drafter's inbox memory never exceeds the sum of the two
 * capacities (asserted by tests through inbox_used / inbox_high_water).
 * Pure bookkeeping: no memory is touched. Not thread-safe. */
#ifndef DL_MEM_INBOX_H
#define DL_MEM_INBOX_H

#include <stddef.h>
#include <stdint.h>

typedef enum { INBOX_GPU = 0, INBOX_HOST = 1 } inbox_tier_t;

#define INBOX_ALIGN 256

typedef struct {
    uint32_t id;       /* slot id, unique while live, < max_slots */
    uint32_t tier;     /* inbox_tier_t */
    uint64_t offset;   /* bytes from the start of the tier's slab */
    uint64_t bytes;    /* granted size (request rounded up to INBOX_ALIGN) */
} inbox_slot_t;

typedef struct inbox inbox_t;

/* cap_bytes[2]: capacity of each tier in bytes (0 disables a tier);
 * max_slots: most slots live at once (>= 1). */
int inbox_new(inbox_t **out, const uint64_t cap_bytes[2], uint32_t max_slots);
void inbox_destroy(inbox_t **ib);

/* Grants `bytes` (> 0): GPU tier first, the host tier when allow_host and the GPU
 * tier has no room. DL_EAGAIN when neither has a free range that large (try again
 * after a release), DL_ERANGE when the request exceeds every tier's capacity (it can
 * never fit: the caller must fail loudly), DL_EINVAL for bytes == 0. */
int inbox_alloc(inbox_t *ib, uint64_t bytes, int allow_host, inbox_slot_t *slot);
/* Releases slot `id`; DL_ENOENT if it is not live. */
int inbox_free(inbox_t *ib, uint32_t id);
/* Looks up a live slot by id; DL_ENOENT if not live. */
int inbox_get(const inbox_t *ib, uint32_t id, inbox_slot_t *slot);

uint64_t inbox_cap(const inbox_t *ib, inbox_tier_t tier);
uint64_t inbox_used(const inbox_t *ib, inbox_tier_t tier);       /* granted bytes now */
uint64_t inbox_high_water(const inbox_t *ib);                    /* max of the sum, ever */
uint64_t inbox_largest_free(const inbox_t *ib, inbox_tier_t tier);
uint32_t inbox_live(const inbox_t *ib);

#endif
