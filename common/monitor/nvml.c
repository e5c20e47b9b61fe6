/* NVML through dlopen (see nvml.h). The few NVML types used are declared here with
 * the layout of nvml.h (CUDA 12): nvmlUtilization_t {uint gpu, memory},
 * nvmlMemory_t {ull total, free, used}; handles are opaque pointers. */
#include "common/monitor/nvml.h"
#include "common/base/err.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void *nvml_dev_t;
typedef struct { unsigned int gpu, memory; } nvml_util_t;
typedef struct { unsigned long long total, free, used; } nvml_mem_t;

struct mon_nvml {
    void *lib;
    int count;
    int (*init)(void);
    int (*shutdown)(void);
    int (*get_count)(unsigned int *);
    int (*by_index)(unsigned int, nvml_dev_t *);
    int (*util)(nvml_dev_t, nvml_util_t *);
    int (*mem)(nvml_dev_t, nvml_mem_t *);
    int (*name)(nvml_dev_t, char *, unsigned int);
    int (*uuid)(nvml_dev_t, char *, unsigned int);
    const char *(*err)(int);
};

mon_nvml_t *mon_nvml_open(const char *lib) {
    if (!lib) lib = "libnvidia-ml.so.1";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        dl_seterr(DL_ENOENT, "NVML: %s not loadable (%s)", lib, dlerror());
        return NULL;
    }
    mon_nvml_t *n = calloc(1, sizeof *n);
    if (!n) { dlclose(h); dl_seterr(DL_ENOMEM, "NVML: out of memory"); return NULL; }
    n->lib = h;
    *(void **)&n->init = dlsym(h, "nvmlInit_v2");
    *(void **)&n->shutdown = dlsym(h, "nvmlShutdown");
    *(void **)&n->get_count = dlsym(h, "nvmlDeviceGetCount_v2");
    *(void **)&n->by_index = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&n->util = dlsym(h, "nvmlDeviceGetUtilizationRates");
    *(void **)&n->mem = dlsym(h, "nvmlDeviceGetMemoryInfo");
    *(void **)&n->name = dlsym(h, "nvmlDeviceGetName");
    *(void **)&n->uuid = dlsym(h, "nvmlDeviceGetUUID");
    *(void **)&n->err = dlsym(h, "nvmlErrorString");
    if (!n->init || !n->shutdown || !n->get_count || !n->by_index || !n->util || !n->mem) {
        dl_seterr(DL_ENOTSUP, "NVML: %s lacks the functions used", lib);
        dlclose(h);
        free(n);
        return NULL;
    }
    int rc = n->init();
    unsigned int c = 0;
    if (rc == 0) rc = n->get_count(&c);
    if (rc != 0) {
        dl_seterr(DL_ECUDA, "NVML: init failed: %s (%d)", n->err ? n->err(rc) : "?", rc);
        n->shutdown();
        dlclose(h);
        free(n);
        return NULL;
    }
    n->count = (int)c;
    return n;
}

void mon_nvml_close(mon_nvml_t **n_p) {
    if (!n_p || !*n_p) return;
    mon_nvml_t *n = *n_p;
    n->shutdown();
    dlclose(n->lib);
    free(n);
    *n_p = NULL;
}

int mon_nvml_count(const mon_nvml_t *n) { return n ? n->count : 0; }

int mon_nvml_query(mon_nvml_t *n, int i, mon_gpu_t *out) {
    memset(out, 0, sizeof *out);
    if (!n || i < 0 || i >= n->count) return dl_seterr(DL_ERANGE, "NVML: no GPU %d", i);
    nvml_dev_t d;
    int rc = n->by_index((unsigned)i, &d);
    if (rc != 0) return dl_seterr(DL_ECUDA, "NVML: GPU %d: %s", i, n->err ? n->err(rc) : "?");
    out->index = i;
    if (n->name) n->name(d, out->name, sizeof out->name);
    if (n->uuid) n->uuid(d, out->uuid, sizeof out->uuid);
    nvml_util_t u = {0};
    if ((rc = n->util(d, &u)) != 0) return dl_seterr(DL_ECUDA, "NVML: GPU %d utilisation: %d", i, rc);
    nvml_mem_t m = {0};
    if ((rc = n->mem(d, &m)) != 0) return dl_seterr(DL_ECUDA, "NVML: GPU %d memory: %d", i, rc);
    out->util_gpu_pct = u.gpu;
    out->util_mem_pct = u.memory;
    out->mem_used = m.used;
    out->mem_total = m.total;
    return 0;
}

/* The NVML index an entry of CUDA_VISIBLE_DEVICES names (e, len bytes), or -1. */
static int visible_entry(const char *e, size_t len, const char *const *uuids, int n) {
    while (len && (*e == ' ' || *e == '\t')) e++, len--;
    while (len && (e[len - 1] == ' ' || e[len - 1] == '\t')) len--;
    if (!len) return -1;
    size_t d = 0;
    while (d < len && e[d] >= '0' && e[d] <= '9') d++;
    if (d == len) {   /* an index */
        long v = 0;
        for (size_t k = 0; k < len && v <= n; k++) v = v * 10 + (e[k] - '0');
        return v < n ? (int)v : -1;
    }
    int hit = -1;
    for (int i = 0; i < n; i++)
        if (uuids[i] && strncmp(uuids[i], e, len) == 0) {
            if (hit >= 0) return -1;   /* the prefix names two GPUs */
            hit = i;
        }
    return hit;
}

int mon_nvml_visible(const char *cuda_visible, const char *const *uuids, int n, int *order, int cap) {
    int k = 0;
    if (!cuda_visible) {
        for (int i = 0; i < n && k < cap; i++) order[k++] = i;
        return k;
    }
    const char *p = cuda_visible;
    while (*p && k < cap) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        int g = visible_entry(p, len, uuids, n);
        for (int j = 0; j < k && g >= 0; j++)
            if (order[j] == g) g = -1;
        if (g < 0) break;
        order[k++] = g;
        if (!c) break;
        p = c + 1;
    }
    return k;
}
