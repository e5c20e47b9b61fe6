/* The multi-node head's flags and keys (docs/MULTINODE.md section 2). */
#include "supervisor/launch_int.h"
#include "common/base/err.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* HOST of --listen as an IPv4 address the stages bind and the nodes reach: an address as
 * given, a hostname resolved once here (getaddrinfo, the first IPv4 answer). 0, or 2
 * after printing why. */
static int listen_address(const char *flag, char *host, size_t cap) {
    struct in_addr a;
    if (inet_pton(AF_INET, host, &a) == 1) return 0;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res) {
        fprintf(stderr, "draftline run: --listen %s: cannot resolve '%s' (%s): give an IPv4 address of this host "
                        "that the nodes reach\n", flag, host, gai_strerror(rc));
        return 2;
    }
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, ip, sizeof ip);
    freeaddrinfo(res);
    printf("--listen %s: %s is %s\n", flag, host, ip);
    snprintf(host, cap, "%s", ip);
    return 0;
}

/* Every port of the run's span on this host (PORT..PORT+RUNCFG_PORT_SPAN-1 at host) can
 * be bound now (SO_REUSEADDR, as ZeroMQ binds); a busy one is named (2). Ports of other
 * hosts are theirs to check: a stage that cannot bind says so in its log. */
static int ports_free(const char *host, int port) {
    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return 0;
    for (int p = port; p < port + RUNCFG_PORT_SPAN; p++) {
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
        if (s < 0) return 0;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sa.sin_port = htons((uint16_t)p);
        int ok = bind(s, (struct sockaddr *)&sa, sizeof sa) == 0;
        int e = errno;
        close(s);
        if (!ok) {
            fprintf(stderr, "draftline run: --listen %s:%d: port %d of the run's ports %d..%d cannot be bound on "
                            "this host (%s): another run or program holds it; choose another PORT\n", host, port, p,
                    port, port + RUNCFG_PORT_SPAN - 1, strerror(e));
            return 2;
        }
    }
    return 0;
}

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
    if (listen_address(o->listen, L->listen_host, sizeof L->listen_host)) return 2;
    if (ports_free(L->listen_host, (int)port)) return 2;
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
