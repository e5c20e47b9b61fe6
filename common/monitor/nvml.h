/* GPU utilisation and memory through NVML, loaded with dlopen so draftline neither
 * links nor needs libnvidia-ml: without it (CPU machines) mon_nvml_open fails
 * cleanly and the monitor shows "n/a". Not thread-safe. */
#ifndef DL_MONITOR_NVML_H
#define DL_MONITOR_NVML_H

#include <stdint.h>

typedef struct mon_nvml mon_nvml_t;

typedef struct {
    int index;
    char name[96];
    char uuid[96];
    unsigned util_gpu_pct;      /* % of the last sample period a kernel ran (nvmlUtilization_t.gpu) */
    unsigned util_mem_pct;      /* % of time device memory was read/written */
    uint64_t mem_used, mem_total;   /* bytes (nvmlMemory_t) */
} mon_gpu_t;

/* Loads lib (NULL: "libnvidia-ml.so.1") and calls nvmlInit_v2. NULL + dl_errmsg
 * (DL_ENOENT: library absent; DL_ECUDA: NVML init failed, e.g. no driver). */
mon_nvml_t *mon_nvml_open(const char *lib);
void mon_nvml_close(mon_nvml_t **n_p);
/* Number of GPUs NVML sees. */
int mon_nvml_count(const mon_nvml_t *n);
/* Current figures of GPU i. Returns 0, DL_ERANGE or DL_ECUDA (NVML error). */
int mon_nvml_query(mon_nvml_t *n, int i, mon_gpu_t *out);

/* The GPUs a process with CUDA_VISIBLE_DEVICES = cuda_visible sees, as NVML indices in
 * CUDA's order (CUDA device k of that process is NVML GPU order[k]). cuda_visible NULL: all n,
 * in NVML order. Entries, comma-separated: an NVML index ("3") or a UUID ("GPU-8f1e...", a
 * prefix naming one GPU is enough); as CUDA does, the list ends at the first entry that names
 * no GPU or one already listed ("" and "-1": none). uuids[n]: NVML's, as mon_gpu_t.uuid.
 * Writes at most cap indices to order; returns how many. Pure: no NVML call. */
int mon_nvml_visible(const char *cuda_visible, const char *const *uuids, int n, int *order, int cap);

#endif
