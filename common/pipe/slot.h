/* Slab ids on the wire: which of a drafter's slabs a slab_export, slot_grant or
 * hidden_states_ready names, and for which incarnation of that drafter.
 *
 * A drafter's inbox slabs go out as (incarnation << SLOT_INDEX_BITS) | index, index
 * SLOT_SLAB_GPU or SLOT_SLAB_HOST: a target indexes its table of the routed drafter's
 * slabs by slot_slab_index (SLOT_SLAB_MAX entries), and a hidden_states_ready for a
 * grant of an earlier incarnation names an old id, so the drafter refuses it even
 * when this incarnation granted the same slot to the same target. Only the low 30
 * bits of the incarnation are carried (a restart count never gets near that). The
 * gradient slab (SLOT_SLAB_GRAD, drafter -> optimizer) goes out as its bare index:
 * the optimizer keys its mapping by (owner, incarnation) itself.
 */
#ifndef DL_PIPE_SLOT_H
#define DL_PIPE_SLOT_H

#include <stdint.h>

#define SLOT_INDEX_BITS 2
#define SLOT_INDEX_MASK ((1u << SLOT_INDEX_BITS) - 1)       /* 0x3 */
#define SLOT_INC_MASK (UINT32_MAX >> SLOT_INDEX_BITS)        /* 0x3fffffff: incarnation bits kept */
#define SLOT_SLAB_MAX (1 << SLOT_INDEX_BITS)                 /* size of a table indexed by slab index */

/* A drafter's slabs by index (its slab_create slab_id). 0 is never a valid index. */
enum { SLOT_SLAB_GPU = 1, SLOT_SLAB_HOST = 2, SLOT_SLAB_GRAD = 3 };

/* Wire id of slab `index` (1..3) of a drafter of incarnation `incarnation`. */
static inline uint32_t slot_slab_id(uint64_t incarnation, uint32_t index) {
    return (uint32_t)((incarnation & SLOT_INC_MASK) << SLOT_INDEX_BITS) | index;
}

/* Slab index (0..SLOT_SLAB_MAX-1) of a wire id; 0 means malformed. */
static inline uint32_t slot_slab_index(uint32_t wire_id) { return wire_id & SLOT_INDEX_MASK; }

/* Low 30 bits of the incarnation a wire id carries. */
static inline uint32_t slot_slab_incarnation(uint32_t wire_id) { return wire_id >> SLOT_INDEX_BITS; }

#endif
