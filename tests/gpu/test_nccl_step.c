/* The step communicator's NCCL calls (common/mem/nccl.h: nccl_pair_split, nccl_pair_bcast,
 * the completion marks) on one GPU, as far as one device allows:
 *   a) a 1-rank generation: the gradient communicator from a new id, the weights
 *      communicator split from it (both polled to ready, bounded); a weights-sized buffer
 *      (128 MiB + 4 bytes, and odd sizes) sent to self and received on the gradient one,
 *      and broadcast from rank 0 in place on the weights one; completion seen by polling
 *      the marks (never a host wait on the stream), the bytes equal; bad arguments refused;
 *   b) abort of both, then a new generation (new id, new split) that works the same;
 *   c) a 2-rank generation whose member never joins: its split is refused before the
 *      parent is ready (DL_ESTATE), the abort returns in under 10 s, and a new 1-rank
 *      generation works after it.
 * Not tested here (needs two GPUs, issue 17): a real member rank (NCCL refuses two ranks
 * of one communicator on one device), a broadcast that reaches another rank.
 * Each case runs in a child forked before any CUDA call, with a timeout (a hang fails).
 * Exits 77 ("SKIP: no CUDA device") without a GPU. */
#include "common/base/err.h"
#include "common/mem/nccl.h"

#include <cuda_runtime.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(cond) do { if (!(cond)) { \
    fprintf(stderr, "FAIL %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond, dl_errmsg()); exit(1); } } while (0)
#define CHECK_RC(expr, want) do { int rc_ = (expr); if (rc_ != (want)) { \
    fprintf(stderr, "FAIL %s:%d: %s = %d (%s), expected %d: %s\n", __FILE__, __LINE__, #expr, rc_, \
            dl_strerror(rc_), (want), dl_errmsg()); exit(1); } } while (0)
#define CU_OK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(1); } } while (0)

#define READY_TIMEOUT_MS 60000
#define DONE_TIMEOUT_S 60.0
#define ABORT_LIMIT_S 10.0
#define WEIGHTS_BYTES ((size_t)(128u << 20) + 4)   /* ~32 M f32 parameters */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct {
    nccl_pair_t *gc, *wc;
} gen_t;

/* A ready 1-rank generation on GPU 0: the id's communicator and its split. */
static gen_t gen_new(const char *tag) {
    uint8_t id[NCCL_PAIR_ID_BYTES];
    gen_t g = {0};
    double t0 = now_s();
    CHECK_RC(nccl_id_new(id), 0);
    CHECK_RC(nccl_pair_init(&g.gc, id, 1, 0, 0), 0);
    CHECK_RC(nccl_pair_wait(g.gc, READY_TIMEOUT_MS), 0);
    double t1 = now_s();
    CHECK_RC(nccl_pair_split(g.gc, &g.wc), 0);
    CHECK(g.wc != NULL);
    CHECK_RC(nccl_pair_wait(g.wc, READY_TIMEOUT_MS), 0);
    CHECK_RC(nccl_pair_wait(g.gc, READY_TIMEOUT_MS), 0);   /* the parent too, after its split */
    printf("%s: %s ready after %.3f s, %s after %.3f s more\n", tag, nccl_pair_name(g.gc), t1 - t0,
           nccl_pair_name(g.wc), now_s() - t1);
    return g;
}

/* Polls the mark until done (as the stages' timers do), bounded. */
static void mark_wait(void *ev, const char *what) {
    double t0 = now_s();
    long polls = 0;
    for (;;) {
        int rc = nccl_mark_done(ev);
        if (rc == 0) break;
        CHECK_RC(rc, DL_EAGAIN);
        CHECK(now_s() - t0 < DONE_TIMEOUT_S);
        polls++;
        usleep(200);
    }
    printf("  %s: done after %.3f ms (%ld polls DL_EAGAIN)\n", what, (now_s() - t0) * 1e3, polls);
}

static void fill(uint8_t *h, size_t bytes, unsigned salt) {
    for (size_t i = 0; i < bytes; i++) h[i] = (uint8_t)(i * 131u + bytes * 7u + salt);
}

static void same(const uint8_t *d, const uint8_t *want, size_t bytes, const char *what) {
    uint8_t *back = malloc(bytes);
    CHECK(back != NULL);
    CU_OK(cudaMemcpy(back, d, bytes, cudaMemcpyDeviceToHost));
    if (memcmp(back, want, bytes) != 0) {
        size_t i = 0;
        while (back[i] == want[i]) i++;
        fprintf(stderr, "FAIL: %s, %zu bytes: byte %zu is 0x%02x, want 0x%02x\n", what, bytes, i, back[i], want[i]);
        exit(1);
    }
    free(back);
}

/* One gradient (send to self + recv, one group) and one weights broadcast of `bytes`. */
static void transfers(gen_t *g, size_t bytes, uint8_t *d_src, uint8_t *d_dst, uint8_t *h, cudaStream_t gs,
                      cudaStream_t ws, void *ev) {
    fill(h, bytes, 1);
    CU_OK(cudaMemcpy(d_src, h, bytes, cudaMemcpyHostToDevice));
    CU_OK(cudaMemset(d_dst, 0xa5, bytes));
    CU_OK(cudaDeviceSynchronize());
    CHECK_RC(nccl_pair_group_begin(), 0);
    CHECK_RC(nccl_pair_send(g->gc, d_src, bytes, 0, gs), 0);
    CHECK_RC(nccl_pair_recv(g->gc, d_dst, bytes, 0, gs), 0);
    int rc = nccl_pair_group_end(g->gc);
    CHECK(rc == 0 || rc == DL_EAGAIN);
    if (rc == DL_EAGAIN) CHECK_RC(nccl_pair_wait(g->gc, READY_TIMEOUT_MS), 0);
    CHECK_RC(nccl_mark_record(ev, gs), 0);
    mark_wait(ev, "gradient self send/recv");
    same(d_dst, h, bytes, "gradient");
    /* the weights: the root's buffer in place (the optimizer's weights slab half) */
    fill(h, bytes, 2);
    CU_OK(cudaMemcpy(d_src, h, bytes, cudaMemcpyHostToDevice));
    rc = nccl_pair_bcast(g->wc, d_src, bytes, 0, ws);
    CHECK(rc == 0 || rc == DL_EAGAIN);
    if (rc == DL_EAGAIN) CHECK_RC(nccl_pair_wait(g->wc, READY_TIMEOUT_MS), 0);
    CHECK_RC(nccl_mark_record(ev, ws), 0);
    mark_wait(ev, "weights broadcast");
    same(d_src, h, bytes, "broadcast root");
    CHECK_RC(nccl_pair_poll(g->gc), 0);
    CHECK_RC(nccl_pair_poll(g->wc), 0);
}

static void run_transfers(gen_t *g, const size_t *sizes, int n) {
    uint8_t *d_src, *d_dst;
    CU_OK(cudaSetDevice(0));
    CU_OK(cudaMalloc((void **)&d_src, WEIGHTS_BYTES));
    CU_OK(cudaMalloc((void **)&d_dst, WEIGHTS_BYTES));
    uint8_t *h = malloc(WEIGHTS_BYTES);
    CHECK(h != NULL);
    cudaStream_t gs, ws;
    CU_OK(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
    CU_OK(cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking));
    void *ev = NULL;
    CHECK_RC(nccl_mark_new(&ev), 0);
    for (int i = 0; i < n; i++) {
        printf(" %zu bytes:\n", sizes[i]);
        transfers(g, sizes[i], d_src, d_dst, h, gs, ws, ev);
    }
    CHECK_RC(nccl_pair_bcast(g->wc, d_src, 16, 1, ws), DL_EINVAL);   /* root outside 1 rank */
    CHECK_RC(nccl_pair_bcast(g->wc, NULL, 16, 0, ws), DL_EINVAL);
    nccl_mark_destroy(ev);
    nccl_mark_destroy(NULL);
    CU_OK(cudaStreamDestroy(gs)); CU_OK(cudaStreamDestroy(ws));
    CU_OK(cudaFree(d_src)); CU_OK(cudaFree(d_dst));
    free(h);
}

static void gen_abort(gen_t *g) {
    double t0 = now_s();
    nccl_pair_abort(&g->wc);
    nccl_pair_abort(&g->gc);
    CHECK(!g->wc && !g->gc);
    printf("generation aborted in %.3f s\n", now_s() - t0);
    CHECK(now_s() - t0 < ABORT_LIMIT_S);
}

static const size_t SIZES[] = { WEIGHTS_BYTES, 1, 4097, (1u << 20) + 7 };

/* a) then b) */
static void case_generation(void) {
    gen_t g = gen_new("generation 1");
    run_transfers(&g, SIZES, (int)(sizeof SIZES / sizeof SIZES[0]));
    gen_abort(&g);
    g = gen_new("generation 2 (after the abort)");
    run_transfers(&g, SIZES, 2);
    CHECK_RC(nccl_pair_destroy(&g.wc), 0);
    CHECK_RC(nccl_pair_destroy(&g.gc), 0);
}

/* c) */
static void case_member_never_joins(void) {
    uint8_t id[NCCL_PAIR_ID_BYTES];
    CHECK_RC(nccl_id_new(id), 0);
    gen_t g = {0};
    double t0 = now_s();
    CHECK_RC(nccl_pair_init(&g.gc, id, 2, 0, 0), 0);
    CHECK(now_s() - t0 < 5.0);   /* non-blocking: no wait for the member */
    while (now_s() - t0 < 2.0) {
        CHECK_RC(nccl_pair_poll(g.gc), DL_EAGAIN);
        usleep(1000);
    }
    CHECK_RC(nccl_pair_split(g.gc, &g.wc), DL_ESTATE);
    CHECK(g.wc == NULL);
    CHECK_RC(nccl_pair_bcast(g.gc, (void *)16, 16, 0, NULL), DL_ESTATE);
    gen_abort(&g);
    g = gen_new("a new generation after the abort");
    run_transfers(&g, SIZES + 2, 2);
    gen_abort(&g);
}

/* Runs fn in a child with a timeout; 0 pass, 77 skip, else fail. */
static int run_case(const char *name, void (*fn)(void), int timeout_s) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) {
        alarm((unsigned)timeout_s);   /* SIGALRM kills the child: a hang fails */
        fn();
        fflush(stdout);
        _exit(0);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0) {}
    if (WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 77)) {
        printf("%s %s\n", WEXITSTATUS(st) ? "SKIP" : "PASS", name);
        return WEXITSTATUS(st);
    }
    if (WIFSIGNALED(st))
        printf("FAIL %s: signal %d%s\n", name, WTERMSIG(st), WTERMSIG(st) == SIGALRM ? " (timeout)" : "");
    else
        printf("FAIL %s: exit %d\n", name, WEXITSTATUS(st));
    return 1;
}

static void probe_gpu(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) _exit(77);
}

int main(void) {
    /* no CUDA call in this process: every case forks first */
    if (run_case("gpu probe", probe_gpu, 60) == 77) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    int fails = 0;
    fails += run_case("a+b) 1-rank generation: split, gradient send/recv and weights broadcast bytewise, "
                      "marks polled; abort and a new generation", case_generation, 240) != 0;
    fails += run_case("c) a member that never joins: split refused, abort < 10 s, then a new generation",
                      case_member_never_joins, 120) != 0;
    printf("d) a real member rank: not run (NCCL refuses two ranks on one device); needs 2 GPUs\n");
    return fails ? 1 : 0;
}
