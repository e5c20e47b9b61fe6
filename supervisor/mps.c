/* CUDA MPS for stages that share a GPU: see mps.h. */
#include "supervisor/mps.h"

#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/testhook.h"
#include "common/mem/dev.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MPS_CONTROL "nvidia-cuda-mps-control"
#define MPS_PROBE_S 60   /* most seconds for the control program or a context through the new
                            server (each well under a second when it works) */

int sup_mps_parse(const char *v, int *mode) {
    if (!strcmp(v, "auto")) *mode = SUP_MPS_AUTO;
    else if (!strcmp(v, "on")) *mode = SUP_MPS_ON;
    else if (!strcmp(v, "off")) *mode = SUP_MPS_OFF;
    else return dl_seterr(DL_EINVAL, "--mps %s: expected auto, on or off", v);
    return 0;
}

const char *sup_mps_name(int mode) {
    return mode == SUP_MPS_ON ? "on" : mode == SUP_MPS_AUTO ? "auto" : "off";
}

int sup_mps_shared_gpu(const int *tgpu, const int *tnode, int ngt, const int *dgpu,
                       const int *dnode, int ngd) {
    for (int i = 0; i < ngt; i++)
        for (int j = 0; j < ngd; j++)
            if (tnode[i] == 0 && dnode[j] == 0 && tgpu[i] == dgpu[j]) return tgpu[i];
    return -1;
}

int sup_mps_find_control(char *out, size_t cap) {
    out[0] = 0;
    const char *path = getenv("PATH");
    if (!path) return -1;
    const char *p = path;
    while (*p) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0 && (size_t)snprintf(out, cap, "%.*s/%s", (int)n, p, MPS_CONTROL) < cap &&
            access(out, X_OK) == 0)
            return 0;
        if (!e) break;
        p = e + 1;
    }
    out[0] = 0;
    return -1;
}

/* Waits for child pid at most MPS_PROBE_S seconds; past that its process group (its own:
 * setpgid in the child) gets SIGKILL. "exit status N", "killed by signal N" or "no answer
 * in 60 s" into why[cap]; returns the exit status, or -1. */
static int wait_bounded(pid_t pid, char *why, size_t cap) {
    int st = 0, waited_ms = 0;
    int64_t limit_s = MPS_PROBE_S;   /* test hook mps.timeout_s=<s>: a shorter bound */
    if (!testhook_i64("mps.timeout_s", &limit_s) || limit_s < 1) limit_s = MPS_PROBE_S;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) {
            snprintf(why, cap, "waitpid: %s", strerror(errno));
            return -1;
        }
        if (waited_ms >= limit_s * 1000) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
            snprintf(why, cap, "no answer in %d s", (int)limit_s);
            return -1;
        }
        usleep(20000);
        waited_ms += 20;
    }
    if (WIFEXITED(st)) {
        snprintf(why, cap, "exit status %d", WEXITSTATUS(st));
        return WEXITSTATUS(st);
    }
    snprintf(why, cap, "killed by signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    return -1;
}

/* The child's side: its own process group, no signal blocked, the output into the log
 * dir's control.out (stdin: in_fd, or /dev/null). */
static void child_setup(const char *log_dir, int in_fd) {
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    char path[4200];
    snprintf(path, sizeof path, "%s/control.out", log_dir);
    int out = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out >= 0) dup2(out, 1), dup2(out, 2);
    if (in_fd < 0) in_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in_fd >= 0) dup2(in_fd, 0);
}

/* Runs the control program: with argument "-d", or with "quit" on its stdin (arg NULL;
 * the word is in the pipe before the fork, so no write can meet a closed pipe). Its exit
 * status (0 = done), else -1; why says which. */
static int run_control(const sup_mps_t *m, const char *arg, char *why, size_t cap) {
    int fd[2] = {-1, -1};
    if (!arg) {
        if (pipe2(fd, O_CLOEXEC) != 0 || write(fd[1], "quit\n", 5) != 5) {
            snprintf(why, cap, "pipe: %s", strerror(errno));
            if (fd[0] >= 0) close(fd[0]), close(fd[1]);
            return -1;
        }
        close(fd[1]);
    }
    pid_t pid = fork();
    if (pid == 0) {
        child_setup(m->log_dir, fd[0]);
        execl(m->control, m->control, arg, (char *)NULL);
        _exit(127);
    }
    if (fd[0] >= 0) close(fd[0]);
    if (pid < 0) {
        snprintf(why, cap, "fork: %s", strerror(errno));
        return -1;
    }
    setpgid(pid, pid);   /* as the child does: no race with the kill of its group */
    return wait_bounded(pid, why, cap);
}

/* A child makes a CUDA context on gpu (through MPS, the variables being set): 0 or -1. */
static int probe_context(const sup_mps_t *m, int gpu, char *why, size_t cap) {
    pid_t pid = fork();
    if (pid == 0) {   /* CUDA only here: the supervisor never initialises it */
        child_setup(m->log_dir, -1);
        void *s = NULL;
        int rc = dev_set(gpu);
        if (rc == 0) rc = dev_stream_new(gpu, &s);
        if (rc == 0) dev_stream_destroy(s);
        _exit(rc == 0 ? 0 : 1);
    }
    if (pid < 0) {
        snprintf(why, cap, "fork: %s", strerror(errno));
        return -1;
    }
    setpgid(pid, pid);
    return wait_bounded(pid, why, cap) == 0 ? 0 : -1;
}

/* The MPS variables as they were before the start (a user's own MPS, or none). */
static void env_restore(const sup_mps_t *m) {
    unsetenv("CUDA_MPS_PIPE_DIRECTORY");   /* was unset: the caller uses a user's own MPS instead */
    if (m->old_log[0]) setenv("CUDA_MPS_LOG_DIRECTORY", m->old_log, 1);
    else unsetenv("CUDA_MPS_LOG_DIRECTORY");
}

/* Quits the daemon (daemon 1) and removes the pipe dir, unless the quit failed: then the
 * dir stays, named in a warning, so the daemon can still be stopped through it. */
static void undo(sup_mps_t *m, int daemon) {
    char why[128] = "";
    int quit_rc = daemon ? run_control(m, NULL, why, sizeof why) : 0;
    env_restore(m);
    if (quit_rc != 0) {
        log_warn("MPS: `%s` with quit failed (%s): the daemon may still run; stop it with `echo quit | "
                 "CUDA_MPS_PIPE_DIRECTORY=%s %s`", m->control, why, m->dir, m->control);
        fprintf(stderr, "draftline run: MPS: the daemon's quit failed (%s): stop it with `echo quit | "
                "CUDA_MPS_PIPE_DIRECTORY=%s %s`\n", why, m->dir, m->control);
    } else if (m->dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", m->dir);
        if (system(cmd) != 0) log_warn("MPS: could not remove %s", m->dir);
    }
    m->dir[0] = 0;
    m->active = 0;
}

/* Signals that would end the supervisor before or after its own handlers: held while the
 * daemon starts or stops, so neither is cut half-way (see sup_mps_hold). */
void sup_mps_hold(int hold, sigset_t *saved) {
    if (hold) {
        sigset_t ss;
        sigemptyset(&ss);
        sigaddset(&ss, SIGINT);
        sigaddset(&ss, SIGTERM);
        sigaddset(&ss, SIGHUP);
        sigprocmask(SIG_BLOCK, &ss, saved);
    } else {
        sigprocmask(SIG_SETMASK, saved, NULL);
    }
}

int sup_mps_stop_signalled(void) {
    sigset_t p;
    sigpending(&p);
    return sigismember(&p, SIGINT) == 1 || sigismember(&p, SIGTERM) == 1 || sigismember(&p, SIGHUP) == 1;
}

int sup_mps_start(sup_mps_t *m, int gpu, const char *log_dir) {
    memset(m, 0, sizeof *m);
    const char *ol = getenv("CUDA_MPS_LOG_DIRECTORY");
    snprintf(m->old_log, sizeof m->old_log, "%s", ol ? ol : "");
    if (sup_mps_find_control(m->control, sizeof m->control) < 0)
        return dl_seterr(DL_ENOTSUP, "%s is not on PATH", MPS_CONTROL);
    if (!realpath(log_dir, m->log_dir) && (mkdir(log_dir, 0755) != 0 || !realpath(log_dir, m->log_dir)))
        return dl_seterr(DL_EIO, "cannot make the MPS log dir %s: %s", log_dir, strerror(errno));
    snprintf(m->dir, sizeof m->dir, "/tmp/draftline-mps-XXXXXX");
    if (!mkdtemp(m->dir)) {
        int e = errno;
        m->dir[0] = 0;
        return dl_seterr(DL_EIO, "cannot make an MPS pipe dir in /tmp: %s", strerror(e));
    }
    setenv("CUDA_MPS_PIPE_DIRECTORY", m->dir, 1);
    setenv("CUDA_MPS_LOG_DIRECTORY", m->log_dir, 1);
    char why[128];
    int rc = run_control(m, "-d", why, sizeof why);
    if (rc != 0) {
        undo(m, rc < 0);   /* ended after the timeout or by a signal: maybe half up, asked to quit */
        return dl_seterr(DL_EIO, "`%s -d` failed (%s; its output and logs: %s)", m->control, why, m->log_dir);
    }
    if (probe_context(m, gpu, why, sizeof why) < 0) {
        undo(m, 1);
        return dl_seterr(DL_EIO, "the MPS daemon started but no CUDA context on GPU %d could be made through "
                         "it (%s; no such GPU, or one in exclusive mode held by another process? logs: %s)",
                         gpu, why, m->log_dir);
    }
    m->active = 1;
    return 0;
}

void sup_mps_stop(sup_mps_t *m) {
    if (!m->active) return;
    undo(m, 1);
}
