/* Test support: child processes with a hard timeout that are always killed and reaped.
 *
 * Every child runs in its own process group (pid == pgid), so a kill reaches anything it forked.
 * Children get PR_SET_PDEATHSIG(SIGKILL): if the test process dies (its own timeout, a crash),
 * they die too. Every child spawned here is recorded so proc_kill_all() (also run at exit and by
 * proc_watchdog's alarm) can kill and reap whatever is left after a failed assertion.
 *
 * A child gets the write end of a "report pipe" (the parent reads it with proc_read): use it to
 * say "ready" after binding, or to send back a result struct. Exec'd children find it in
 * $DL_REPORT_FD.
 *
 * Rules for child functions: never call cmocka asserts in a child (a failed one would longjmp
 * into the parent's test runner, copied in the child); return an exit code instead. Create any
 * libuv loop / ZeroMQ context inside the child, never use the parent's.
 */
#ifndef DL_TESTS_SUPPORT_PROC_H
#define DL_TESTS_SUPPORT_PROC_H

#include <stddef.h>
#include <sys/types.h>

#define PROC_MAX 64          /* children one test process may have alive at once */

typedef struct {
    pid_t pid;               /* child pid == its process group id; 0: none */
    int rfd;                 /* parent's read end of the report pipe; -1: none */
    int status;              /* raw waitpid status, valid once reaped */
    int reaped;
    char name[32];
} proc_t;

/* Body of a forked child: report_fd is the write end of the report pipe. The return value is
 * the exit code (stdio is flushed, then _exit). */
typedef int (*proc_fn)(void *arg, int report_fd);

/* Forks a child running fn(arg, report_fd). name is for messages. Returns 0 or DL_EIO/DL_ERANGE
 * (too many children). */
int proc_spawn(proc_t *p, const char *name, proc_fn fn, void *arg);

/* Forks and execs path with argv (NULL-terminated; argv[0] is the program name) and the current
 * environment plus DL_REPORT_FD=<fd>. An exec failure makes the child exit 127. */
int proc_spawn_exec(proc_t *p, const char *name, const char *path, char *const argv[]);

/* Reads exactly len bytes from the child's report pipe within timeout_ms.
 * Returns 0, DL_ETIMEDOUT, DL_ECLOSED (child closed the pipe / exited first) or DL_EIO. */
int proc_read(proc_t *p, void *buf, size_t len, int timeout_ms);

/* Child side: writes len bytes to the report fd (loops on short writes). Returns 0 or DL_EIO. */
int proc_report(int report_fd, const void *buf, size_t len);

/* Waits up to timeout_ms for the child to exit. On time-out kills its process group with SIGKILL,
 * reaps it and returns DL_ETIMEDOUT. *exit_code (may be NULL) gets the exit status, or 128 + the
 * signal number if a signal ended it, or -1 on time-out. Returns 0 once reaped. */
int proc_wait(proc_t *p, int timeout_ms, int *exit_code);

/* Sends sig to the child's process group (no-op once reaped). Returns 0 or DL_EIO. */
int proc_signal(proc_t *p, int sig);

/* SIGKILL to the group and reap (if not reaped yet); closes the report pipe, which proc_wait
 * leaves open so what the child wrote before exiting can still be read. Idempotent: call it on
 * every proc_t when done. */
void proc_kill(proc_t *p);

/* Kills and reaps every child this process spawned and has not reaped. */
void proc_kill_all(void);

/* Arms alarm(seconds): when it fires, every recorded child group gets SIGKILL and the process
 * exits with code 124 (like timeout(1)). 0 disarms. */
void proc_watchdog(unsigned seconds);

/* Exit code from a raw wait status: WEXITSTATUS, or 128 + WTERMSIG. */
int proc_exit_code(int status);

#endif
