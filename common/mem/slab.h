/* Slabs: one allocation made at start-up and exported once to peer processes.
 *
 * A slab is the unit of memory that crosses process boundaries in the pipeline
 * (drafter inboxes, gradient buffers, published weights). Two kinds share one API:
 *   SLAB_HOST  POSIX shared memory: shm_open("/dl-<run>-<stage>-<inc>-<tag>"),
 *              ftruncate, mmap. The owner unlinks it on destroy; the name carries
 *              the run id, stage and incarnation so a crash leaves nothing
 *              ambiguous and slab_sweep(run) removes leftovers. On a CUDA build
 *              it can be page-locked (cudaHostRegister) for async copies.
 *   SLAB_CUDA  cudaMalloc + cudaIpcGetMemHandle on the owner; the peer maps it with
 *              cudaIpcOpenMemHandle (common/mem/cuda/, built only with nvcc).
 * The wire form of a slab is slab_handle_t (plain bytes, fixed size): what goes
 * into messages. A peer maps a handle once per (slab, owner, incarnation) through
 * the handle cache (common/mem/hcache.h), never in the hot loop.
 */
#ifndef DL_MEM_SLAB_H
#define DL_MEM_SLAB_H

#include <stddef.h>
#include <stdint.h>

typedef enum { SLAB_HOST = 0, SLAB_CUDA = 1 } slab_kind_t;

#define SLAB_NAME_MAX 64   /* == DL_PROTO_SHM_NAME_MAX + 1 */
#define SLAB_IPC_BYTES 64   /* sizeof(cudaIpcMemHandle_t) */
#define SLAB_UUID_MAX 64    /* "GPU-xxxxxxxx-..."; "" for host memory */

/* Exported description of a slab; fixed size, copied verbatim into messages. */
typedef struct {
    uint32_t kind;                 /* slab_kind_t */
    uint32_t owner_id;             /* stage id of the owner (e.g. drafter 0 = 0) */
    uint32_t slab_id;              /* owner-chosen id, unique per owner incarnation */
    uint64_t incarnation;          /* owner's incarnation (restart count) */
    uint32_t pinned;               /* SLAB_HOST: registered with CUDA by the owner */
    uint32_t readonly;             /* slab_open, SLAB_HOST: map PROT_READ (the reader's own
                                    * choice, never on the wire; CUDA IPC maps read-write) */
    uint64_t bytes;                /* usable size in bytes */
    char name[SLAB_NAME_MAX];      /* unique name: shm object name, also the cache key */
    uint8_t ipc[SLAB_IPC_BYTES];   /* SLAB_CUDA: cudaIpcMemHandle_t */
    char gpu_uuid[SLAB_UUID_MAX];  /* SLAB_CUDA: owner GPU UUID; "" for host */
} slab_handle_t;

typedef struct slab slab_t;

/* Creates and exports a slab of `bytes` (> 0) bytes, zero-filled.
 * run_id, stage, tag: [A-Za-z0-9_.] only (checked), they form the name
 * "/dl-<run_id>-<stage>-<incarnation>-<tag>" (at most 63 chars). slab_id goes into the
 * handle. device: CUDA ordinal for SLAB_CUDA,
 * ignored for SLAB_HOST. pin: SLAB_HOST only, cudaHostRegister on CUDA builds.
 * Errors: DL_EINVAL (bad name/size), DL_EIO (shm_open/ftruncate/mmap, with errno;
 * an existing object of that name is an error, never reused), DL_ENOTSUP
 * (SLAB_CUDA in a CPU-only build), DL_ECUDA. *out owned by the caller. */
int slab_create(slab_t **out, slab_kind_t kind, const char *run_id, const char *stage,
                uint32_t owner_id, uint64_t incarnation, uint32_t slab_id, const char *tag,
                size_t bytes, int device, int pin);

/* Maps a peer's slab from its handle (no ownership: destroy only unmaps); a host
 * slab read-only (shm O_RDONLY, PROT_READ: a write faults) when h->readonly.
 * device: for SLAB_CUDA, the caller's CUDA ordinal (peer access must be possible).
 * Errors: DL_EPROTO (handle malformed), DL_ENOENT (the object is gone: the owner
 * died or restarted), DL_EIO, DL_ENOTSUP, DL_ECUDA. */
int slab_open(slab_t **out, const slab_handle_t *h, int device);

/* Unmaps; the owner also unlinks (shm) / frees (CUDA). Nulls *s; NULL is fine. */
void slab_destroy(slab_t **s);

void *slab_ptr(const slab_t *s);         /* host pointer (HOST) or device pointer (CUDA) */
size_t slab_bytes(const slab_t *s);
const slab_handle_t *slab_handle(const slab_t *s);
int slab_is_owner(const slab_t *s);

/* Checks that a handle names memory on the GPU `my_uuid`; DL_EINVAL naming both UUIDs
 * if not. A drafter calls this before computing on a GPU slot (it never computes
 * on another GPU's memory). Host slabs always pass. */
int slab_check_gpu(const slab_handle_t *h, const char *my_uuid);

/* Unlinks every shared-memory object of run `run_id` (names "/dl-<run_id>-*"), as
 * left by crashed stages. Returns the number removed (>= 0) or DL_EIO. */
int slab_sweep(const char *run_id);

/* Unlinks every shared-memory object whose name starts with "/dl-<run_id>-<stage>-<inc>-"
 * (one stage incarnation's own slabs). A stage calls it on exit (atexit), so even an
 * exit(1) path or a stop after its supervisor died leaves nothing in /dev/shm.
 * Returns the number removed (>= 0), DL_EINVAL (malformed component) or DL_EIO. */
int slab_sweep_stage(const char *run_id, const char *stage, uint64_t incarnation);

/* Unlinks the shared-memory objects of every earlier incarnation of one stage ("/dl-<run_id>-
 * <stage>-<k>-*" with k < incarnation): a new incarnation calls it once it is up, so the
 * slabs of a predecessor killed without its exit path (kill -9, OOM) are not held until the
 * run ends (peers that still map them drop their mappings when they see the new
 * incarnation's slab_export or hello; the memory goes with the last mapping). Returns the
 * number removed (>= 0), DL_EINVAL (malformed component) or DL_EIO. */
int slab_sweep_older(const char *run_id, const char *stage, uint64_t incarnation);

/* Removes the shared-memory objects of dead runs ("/dev/shm/dl-<run>-*"), as left when a
 * supervisor was killed with SIGKILL. Rule (safe for live runs): the objects of a run
 * are removed only when NO process maps any of them (every /proc/<pid>/maps readable to
 * us is scanned; an owner maps its slab from create to destroy, so a live run always
 * has a mapping) AND none of them was modified (mtime) in the last `min_age_s` seconds (covers
 * the instant between shm_open and mmap in slab_create). Objects are 0600, so only our
 * own processes can map them. Returns the number removed (>= 0) or DL_EIO. */
int slab_sweep_dead(double min_age_s);

/* Counts shared-memory objects of run `run_id` still present (tests: nothing left). */
int slab_count(const char *run_id);

/* Validates a name component: non-empty, <= 16 chars, [A-Za-z0-9_.]. */
int slab_name_ok(const char *s);

#endif
