/* Test support: forked children with hard timeouts. See proc.h. */
#include "tests/support/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/base/clock.h"
#include "common/base/err.h"

/* Process-wide on purpose: the alarm handler and atexit must find every child to kill, whatever
 * state the test was left in by a failed assertion. Only pid values, readable from a handler. */
static volatile pid_t proc_live[PROC_MAX];
static int proc_rfds[PROC_MAX];
static int proc_atexit_done;

static void registry_add(pid_t pid, int rfd) {
    for (int i = 0; i < PROC_MAX; i++)
        if (proc_live[i] == 0) { proc_live[i] = pid; proc_rfds[i] = rfd; return; }
}

static void registry_del(pid_t pid) {
    for (int i = 0; i < PROC_MAX; i++)
        if (proc_live[i] == pid) { proc_live[i] = 0; proc_rfds[i] = -1; return; }
}

static int registry_full(void) {
    for (int i = 0; i < PROC_MAX; i++)
        if (proc_live[i] == 0) return 0;
    return 1;
}

int proc_exit_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

void proc_kill_all(void) {
    for (int i = 0; i < PROC_MAX; i++) {
        pid_t pid = proc_live[i];
        if (pid <= 0) continue;
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
        if (proc_rfds[i] >= 0) close(proc_rfds[i]);
        proc_live[i] = 0;
        proc_rfds[i] = -1;
    }
}

static void on_alarm(int sig) {
    static const char msg[] = "proc_watchdog: hard timeout, killing children\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    for (int i = 0; i < PROC_MAX; i++) {
        pid_t pid = proc_live[i];
        if (pid > 0) { kill(-pid, SIGKILL); kill(pid, SIGKILL); }
    }
    _exit(124);
}

void proc_watchdog(unsigned seconds) {
    if (seconds == 0) { alarm(0); return; }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    alarm(seconds);
}

static void setup_once(void) {
    if (proc_atexit_done) return;
    proc_atexit_done = 1;
    for (int i = 0; i < PROC_MAX; i++) proc_rfds[i] = -1;
    atexit(proc_kill_all);
}

/* In the child right after fork: own process group, die with the parent, forget the parent's
 * children (they are not ours to kill), and close their report pipes. */
static void child_setup(pid_t parent) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(125);    /* parent already gone */
    for (int i = 0; i < PROC_MAX; i++) {
        if (proc_rfds[i] >= 0) close(proc_rfds[i]);
        proc_live[i] = 0;
        proc_rfds[i] = -1;
    }
    signal(SIGALRM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
}

static int spawn_common(proc_t *p, const char *name, proc_fn fn, void *arg, const char *path,
                        char *const argv[]) {
    setup_once();
    memset(p, 0, sizeof *p);
    p->rfd = -1;
    snprintf(p->name, sizeof p->name, "%s", name ? name : "child");
    if (registry_full()) return dl_seterr(DL_ERANGE, "proc %s: more than %d children", p->name, PROC_MAX);
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return dl_seterr(DL_EIO, "proc %s: pipe: %s", p->name, strerror(errno));
    fflush(NULL);    /* or buffered output would be written twice */
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        return dl_seterr(DL_EIO, "proc %s: fork: %s", p->name, strerror(e));
    }
    if (pid == 0) {
        close(fds[0]);
        child_setup(parent);
        if (path) {
            int fd = fcntl(fds[1], F_DUPFD, 3);    /* a copy without O_CLOEXEC */
            char v[16];
            snprintf(v, sizeof v, "%d", fd);
            setenv("DL_REPORT_FD", v, 1);
            execv(path, argv);
            fprintf(stderr, "proc %s: exec %s: %s\n", p->name, path, strerror(errno));
            _exit(127);
        }
        int rc = fn(arg, fds[1]);
        fflush(NULL);
        _exit(rc & 0xff);
    }
    setpgid(pid, pid);    /* also from the parent: no window where a group kill misses it */
    close(fds[1]);
    p->pid = pid;
    p->rfd = fds[0];
    registry_add(pid, p->rfd);
    return 0;
}

int proc_spawn(proc_t *p, const char *name, proc_fn fn, void *arg) {
    if (!p || !fn) return dl_seterr(DL_EINVAL, "proc_spawn: NULL argument");
    return spawn_common(p, name, fn, arg, NULL, NULL);
}

int proc_spawn_exec(proc_t *p, const char *name, const char *path, char *const argv[]) {
    if (!p || !path || !argv) return dl_seterr(DL_EINVAL, "proc_spawn_exec: NULL argument");
    return spawn_common(p, name, NULL, NULL, path, argv);
}

int proc_read(proc_t *p, void *buf, size_t len, int timeout_ms) {
    if (p->rfd < 0) return dl_seterr(DL_ECLOSED, "proc %s: no report pipe", p->name);
    uint64_t deadline = clock_mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    size_t got = 0;
    while (got < len) {
        uint64_t now = clock_mono_ns();
        if (now >= deadline)
            return dl_seterr(DL_ETIMEDOUT, "proc %s: report not read within %d ms (%zu/%zu bytes)",
                             p->name, timeout_ms, got, len);
        struct pollfd pfd = {.fd = p->rfd, .events = POLLIN};
        int r = poll(&pfd, 1, (int)((deadline - now) / 1000000ull) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return dl_seterr(DL_EIO, "proc %s: poll: %s", p->name, strerror(errno));
        if (r == 0) continue;
        ssize_t n = read(p->rfd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return dl_seterr(DL_EIO, "proc %s: read: %s", p->name, strerror(errno));
        if (n == 0)
            return dl_seterr(DL_ECLOSED, "proc %s: closed its report pipe after %zu/%zu bytes",
                             p->name, got, len);
        got += (size_t)n;
    }
    return 0;
}

int proc_report(int fd, const void *buf, size_t len) {
    size_t put = 0;
    while (put < len) {
        ssize_t n = write(fd, (const char *)buf + put, len - put);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return dl_seterr(DL_EIO, "proc_report: write: %s", strerror(errno));
        put += (size_t)n;
    }
    return 0;
}

static void reaped(proc_t *p, int status) {
    p->status = status;
    p->reaped = 1;
    registry_del(p->pid);    /* the report pipe stays open: it may hold the child's last words */
}

int proc_wait(proc_t *p, int timeout_ms, int *exit_code) {
    if (exit_code) *exit_code = -1;
    if (!p->pid) return dl_seterr(DL_EINVAL, "proc %s: not spawned", p->name);
    if (!p->reaped) {
        uint64_t deadline = clock_mono_ns() + (uint64_t)timeout_ms * 1000000ull;
        for (;;) {
            int st;
            pid_t r = waitpid(p->pid, &st, WNOHANG);
            if (r == p->pid) { reaped(p, st); break; }
            if (r < 0 && errno != EINTR) {
                reaped(p, 0);
                return dl_seterr(DL_EIO, "proc %s: waitpid: %s", p->name, strerror(errno));
            }
            if (clock_mono_ns() >= deadline) {
                proc_kill(p);
                return dl_seterr(DL_ETIMEDOUT, "proc %s (pid %d): still running after %d ms; killed",
                                 p->name, (int)p->pid, timeout_ms);
            }
            struct timespec ts = {0, 2000000};    /* 2 ms */
            nanosleep(&ts, NULL);
        }
    }
    if (exit_code) *exit_code = proc_exit_code(p->status);
    return 0;
}

int proc_signal(proc_t *p, int sig) {
    if (!p->pid || p->reaped) return 0;
    if (kill(-p->pid, sig) != 0 && kill(p->pid, sig) != 0)
        return dl_seterr(DL_EIO, "proc %s: kill(%d): %s", p->name, sig, strerror(errno));
    return 0;
}

void proc_kill(proc_t *p) {
    if (!p) return;
    if (p->rfd >= 0) { close(p->rfd); p->rfd = -1; }
    if (!p->pid || p->reaped) return;
    kill(-p->pid, SIGKILL);
    kill(p->pid, SIGKILL);
    int st = 0;
    while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR) {}
    reaped(p, st);
}
