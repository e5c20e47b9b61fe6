/* common/bus benchmark, two processes over ipc on one host (CPU only, no GPU needed):
 *   1. one-way throughput, DEALER (child) -> ROUTER (parent), per message size 64 B, 4 KiB,
 *      64 KiB, 1 MiB: messages/s and MB/s (10^6 bytes of payload), first to last message;
 *   2. round-trip latency of 64-byte ping/pong, ROUTER -> DEALER -> ROUTER: median and p99 in us.
 * Each process runs one libuv loop; the sender is driven by bus_on_writable back-pressure.
 * Usage: bench_bus [--quick] [--help]  (--model X is accepted and ignored, for scripts/bench.sh). */
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/bus/bus.h"

typedef struct { uint32_t size, count; } phase_t;
static const phase_t phases[] = {{64, 500000}, {4096, 200000}, {65536, 20000}, {1u << 20, 2000}};
#define NPHASES (int)(sizeof phases / sizeof phases[0])
#define PINGS 20000
#define PING_BYTES 64

/* ---- child: sender and echo -------------------------------------------------------------- */

typedef struct {
    bus_t *bus;
    uv_idle_t pump;
    int pumping;
    uint32_t size, count, sent;
    unsigned char *buf;
} child_t;

static void child_pump(uv_idle_t *h) {
    child_t *c = h->data;
    for (int k = 0; k < 256 && c->sent < c->count; k++) {
        c->buf[0] = 'D';
        int rc = bus_send(c->bus, NULL, c->buf, c->size);
        if (rc == DL_EAGAIN) break;
        if (rc != 0) { fprintf(stderr, "bench_bus child: %s\n", dl_errmsg()); exit(1); }
        c->sent++;
    }
    if (c->sent == c->count || !c->pumping) { uv_idle_stop(&c->pump); c->pumping = 0; }
}

static void child_writable(bus_t *bus, void *arg) {
    child_t *c = arg;
    if (!c->pumping && c->sent < c->count) { c->pumping = 1; uv_idle_start(&c->pump, child_pump); }
}

static void child_recv(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    child_t *c = arg;
    const unsigned char *d = data;
    if (len < 1) return;
    if (d[0] == 'T' && len == 1 + sizeof(phase_t)) {
        phase_t p;
        memcpy(&p, d + 1, sizeof p);
        c->size = p.size;
        c->count = p.count;
        c->sent = 0;
        c->pumping = 1;
        uv_idle_start(&c->pump, child_pump);
    } else if (d[0] == 'P') {
        bus_send(bus, NULL, data, len);
    } else if (d[0] == 'Q') {
        uv_close((uv_handle_t *)&c->pump, NULL);
        bus_close(bus, NULL, NULL);
    }
}

static int child_main(const char *ep) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    child_t c;
    memset(&c, 0, sizeof c);
    c.buf = calloc(1, 1u << 20);
    uv_loop_t loop;
    uv_loop_init(&loop);
    c.bus = bus_new(&loop, &(bus_opts_t){.kind = BUS_DEALER, .identity = "bench-child"});
    if (!c.buf || !c.bus || bus_connect(c.bus, ep) != 0) {
        fprintf(stderr, "bench_bus child: %s\n", dl_errmsg());
        return 1;
    }
    uv_idle_init(&loop, &c.pump);
    c.pump.data = &c;
    bus_on_message(c.bus, child_recv, &c);
    bus_on_writable(c.bus, child_writable, &c);
    bus_send(c.bus, NULL, "H", 1);
    uv_run(&loop, UV_RUN_DEFAULT);
    bus_destroy(&c.bus);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    free(c.buf);
    return 0;
}

/* ---- parent: receiver and pinger --------------------------------------------------------- */

typedef struct {
    bus_t *bus;
    int quick, phase;     /* phase < NPHASES: throughput; == NPHASES: pings */
    uint32_t got, count;
    uint64_t t_first, bytes;
    uint32_t pings;
    uint64_t t_ping;
    double *rtt_us;
} parent_t;

static void start_phase(parent_t *p) {
    if (p->phase < NPHASES) {
        phase_t ph = phases[p->phase];
        if (p->quick) ph.count /= 10;
        p->count = ph.count;
        p->got = 0;
        p->bytes = 0;
        unsigned char m[1 + sizeof ph];
        m[0] = 'T';
        memcpy(m + 1, &ph, sizeof ph);
        bus_send(p->bus, "bench-child", m, sizeof m);
    } else {
        unsigned char m[PING_BYTES] = {'P'};
        p->t_ping = clock_mono_ns();
        bus_send(p->bus, "bench-child", m, sizeof m);
    }
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void parent_recv(bus_t *bus, const char *peer, const void *data, size_t len, void *arg) {
    parent_t *p = arg;
    const unsigned char *d = data;
    if (len < 1) return;
    if (d[0] == 'H') { start_phase(p); return; }
    if (d[0] == 'D') {
        if (p->got == 0) p->t_first = clock_mono_ns();
        p->got++;
        p->bytes += len;
        if (p->got == p->count) {
            double s = (double)(clock_mono_ns() - p->t_first) * 1e-9;
            printf("bus throughput %8u B x %7u: %10.0f msg/s %9.1f MB/s\n", phases[p->phase].size,
                   p->count, (p->count - 1) / s, (double)p->bytes / 1e6 / s);
            fflush(stdout);
            p->phase++;
            start_phase(p);
        }
        return;
    }
    if (d[0] == 'P') {
        int n = p->quick ? PINGS / 10 : PINGS;
        p->rtt_us[p->pings++] = (double)(clock_mono_ns() - p->t_ping) * 1e-3;
        if ((int)p->pings < n) { start_phase(p); return; }
        qsort(p->rtt_us, (size_t)n, sizeof(double), cmpd);
        printf("bus round trip %d B x %d: median %.1f us, p99 %.1f us\n", PING_BYTES, n,
               p->rtt_us[n / 2], p->rtt_us[(size_t)n * 99 / 100]);
        bus_send(bus, peer, "Q", 1);
        bus_close(bus, NULL, NULL);
    }
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench_bus [--quick] [--help]\n"
               "  common/bus throughput per message size and round-trip latency between two\n"
               "  processes over ipc. --quick: a tenth of the messages.\n");
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"quick", no_argument, 0, 'q'},
                                         {"model", required_argument, 0, 'm'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    parent_t p;
    memset(&p, 0, sizeof p);
    int o;
    while ((o = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        if (o == 'q') p.quick = 1;
        else if (o == 'h') { usage(stdout); return 0; }
        else if (o == 'm') continue;
        else { usage(stderr); return 2; }
    }
    char dir[] = "/tmp/dlbench-bus-XXXXXX", ep[BUS_ENDPOINT_MAX];
    if (!mkdtemp(dir) || bus_endpoint(dir, "bench", ep, sizeof ep) != 0) {
        fprintf(stderr, "bench_bus: run dir: %s\n", dl_errmsg());
        return 1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) { perror("bench_bus: fork"); return 1; }
    if (pid == 0) _exit(child_main(ep));

    p.rtt_us = calloc(PINGS, sizeof(double));
    uv_loop_t loop;
    uv_loop_init(&loop);
    p.bus = bus_new(&loop, &(bus_opts_t){.kind = BUS_ROUTER, .linger_ms = 500});
    int rc = p.bus ? bus_bind(p.bus, ep) : -1;
    if (rc != 0) {
        fprintf(stderr, "bench_bus: %s\n", dl_errmsg());
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return 1;
    }
    bus_on_message(p.bus, parent_recv, &p);
    uv_run(&loop, UV_RUN_DEFAULT);
    bus_destroy(&p.bus);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    int st = 0;
    for (int i = 0; i < 500; i++) {    /* 5 s for the child to leave, then kill it */
        if (waitpid(pid, &st, WNOHANG) == pid) break;
        usleep(10000);
        if (i == 499) { kill(pid, SIGKILL); waitpid(pid, &st, 0); }
    }
    free(p.rtt_us);
    rmdir(dir);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
