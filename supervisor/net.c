/* The multi-node head's flags and keys (docs/MULTINODE.md section 2). */
#include "supervisor/launch_int.h"
#include "common/base/err.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sup__net_check(launch_t *L) {
    const run_opts_t *o = L->o;
    if (!o->listen) {
        const char *flag = o->key ? "--key" : o->nodes ? "--nodes" : NULL;
        if (flag) {
            fprintf(stderr, "draftline run: %s needs --listen HOST:PORT (a multi-node run's head)\n", flag);
            return 2;
        }
        return 0;
    }
    const char *colon = strrchr(o->listen, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    size_t hl = colon ? (size_t)(colon - o->listen) : 0;
    if (!colon || hl == 0 || hl >= sizeof L->listen_host || !end || *end || end == colon + 1 || port < 1024 ||
        port > 65535 - RUNCFG_PORT_SPAN) {
        fprintf(stderr, "draftline run: --listen %s: expected HOST:PORT with PORT in 1024..%d (the run uses "
                        "PORT..PORT+%d on every host)\n", o->listen, 65535 - RUNCFG_PORT_SPAN, RUNCFG_PORT_SPAN - 1);
        return 2;
    }
    memcpy(L->listen_host, o->listen, hl);
    L->listen_host[hl] = 0;
    if (!strcmp(L->listen_host, "*") || !strcmp(L->listen_host, "0.0.0.0")) {
        fprintf(stderr, "draftline run: --listen %s: name an address the nodes reach (the head's stages bind "
                        "it and the nodes connect to it), e.g. --listen $(hostname -i):%ld\n", o->listen, port);
        return 2;
    }
    if (!bus_curve_available()) {
        fprintf(stderr, "draftline run: --listen: this libzmq has no CURVE support (install libzmq with libsodium)\n");
        return 2;
    }
    L->listen_port = (int)port;
    L->net = 1;
    return 0;
}

int sup__net_keys(launch_t *L) {
    if (!L->net) return 0;
    const run_opts_t *o = L->o;
    char path[4200];
    if (o->key) snprintf(path, sizeof path, "%s", o->key);
    else snprintf(path, sizeof path, "%s/node.key", L->out);
    int rc = bus_curve_keys_load(path, &L->keys);
    if (rc == DL_ENOENT) {
        rc = bus_curve_keys_create(path, &L->keys);
        if (rc == 0) printf("created the run's key file %s (mode 0600): every node joins with it\n", path);
    }
    if (rc < 0) {
        fprintf(stderr, "draftline run: --key %s: %s\n", path, dl_errmsg());
        return rc == DL_EINVAL ? 2 : 1;
    }
    if (!realpath(path, L->key_path)) snprintf(L->key_path, sizeof L->key_path, "%s", path);
    return 0;
}
