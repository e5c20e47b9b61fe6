/* Handle cache: a consumer maps each peer slab once per (slab name, owner id,
 * incarnation) and keeps the mapping until that peer dies or restarts.
 *
 * The cache counts every real open (shm_open+mmap or cudaIpcOpenMemHandle) so a
 * stage can report "no handle opened in the hot loop after warm-up": the count
 * stays flat once every peer slab has been seen. Not thread-safe (one per stage
 * loop). */
#ifndef DL_MEM_HCACHE_H
#define DL_MEM_HCACHE_H

#include "common/mem/slab.h"

#include <stdint.h>

typedef struct hcache hcache_t;

/* device: CUDA ordinal used to open CUDA slabs (ignored for host slabs). */
int hcache_new(hcache_t **out, int device);
void hcache_destroy(hcache_t **hc);

/* Returns the local mapping of `h`, opening it on first use. A handle whose owner
 * id matches a cached entry of an older incarnation closes that entry first (the
 * peer restarted). Errors from slab_open. *ptr stays owned by the cache. */
int hcache_get(hcache_t *hc, const slab_handle_t *h, void **ptr);

/* Closes every mapping owned by `owner_id` (all incarnations). Returns how many. */
int hcache_drop_owner(hcache_t *hc, uint32_t owner_id);

uint64_t hcache_opens(const hcache_t *hc);   /* real opens since creation */
int hcache_size(const hcache_t *hc);         /* mappings held now */

#endif
