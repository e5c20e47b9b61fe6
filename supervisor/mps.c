/* CUDA MPS for stages that share a GPU: see mps.h. */
#include "supervisor/mps.h"

#include "common/base/err.h"
#include "common/base/log.h"
#include "common/mem/dev.h"

#include <errno.h>
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

/* Runs the control program: argument arg ("-d"), or NULL with stdin_text on its stdin.
 * Its exit status, or -1 when it could not run or was ended after MPS_PROBE_S. */
static int run_control(const sup_mps_t *m, const char *arg, const char *stdin_text) {
    int fd[2] = {-1, -1};
    if (stdin_text && pipe(fd) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) {
        if (fd[0] >= 0) close(fd[0]), close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        if (stdin_text) {
            dup2(fd[0], 0);
            close(fd[0]);
            close(fd[1]);
        }
        alarm(MPS_PROBE_S);   /* kept across exec: a control program that hangs is ended */
        execl(m->control, m->control, arg, (char *)NULL);
        _exit(127);
    }
    if (stdin_text) {
        close(fd[0]);
        ssize_t w = write(fd[1], stdin_text, strlen(stdin_text));
        (void)w;
        close(fd[1]);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A child makes a CUDA context on gpu (through MPS, the variables being set): 0 or -1. */
static int probe_context(int gpu) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {   /* CUDA only here: the supervisor never initialises it */
        alarm(MPS_PROBE_S);
        void *s = NULL;
        int rc = dev_set(gpu);
        if (rc == 0) rc = dev_stream_new(gpu, &s);
        if (rc == 0) dev_stream_destroy(s);
        _exit(rc == 0 ? 0 : 1);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void undo(sup_mps_t *m, int daemon) {
    if (daemon) run_control(m, NULL, "quit\n");
    unsetenv("CUDA_MPS_PIPE_DIRECTORY");
    unsetenv("CUDA_MPS_LOG_DIRECTORY");
    if (m->dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", m->dir);
        if (system(cmd) != 0) log_warn("MPS: could not remove %s", m->dir);
    }
    m->dir[0] = 0;
    m->active = 0;
}

int sup_mps_start(sup_mps_t *m, int gpu, const char *log_dir) {
    memset(m, 0, sizeof *m);
    if (sup_mps_find_control(m->control, sizeof m->control) < 0)
        return dl_seterr(DL_ENOTSUP, "MPS: %s is not on PATH", MPS_CONTROL);
    snprintf(m->dir, sizeof m->dir, "/tmp/draftline-mps-XXXXXX");
    if (!mkdtemp(m->dir)) {
        int e = errno;
        m->dir[0] = 0;
        return dl_seterr(DL_EIO, "MPS: cannot make a pipe dir in /tmp: %s", strerror(e));
    }
    if (mkdir(log_dir, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        undo(m, 0);
        return dl_seterr(DL_EIO, "MPS: cannot make its log dir %s: %s", log_dir, strerror(e));
    }
    setenv("CUDA_MPS_PIPE_DIRECTORY", m->dir, 1);
    setenv("CUDA_MPS_LOG_DIRECTORY", log_dir, 1);
    int rc = run_control(m, "-d", NULL);
    if (rc != 0) {
        undo(m, 0);
        return dl_seterr(DL_EIO, "MPS: `%s -d` failed (exit status %d; its log: %s)", m->control, rc,
                         log_dir);
    }
    if (probe_context(gpu) < 0) {
        undo(m, 1);
        return dl_seterr(DL_EIO, "MPS: the daemon started but no CUDA context on GPU %d could be made "
                         "through it (no such GPU, or one in exclusive mode held by another process? its log: %s)",
                         gpu, log_dir);
    }
    m->active = 1;
    return 0;
}

void sup_mps_stop(sup_mps_t *m) {
    if (!m->active) return;
    undo(m, 1);
}
