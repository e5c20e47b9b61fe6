/* OpenMP wait policy for CPU compute processes (issue 15 item 8).
 *
 * libgomp's default policy spins after every parallel region before it sleeps; on
 * cores shared with other processes each of the hundreds of regions of a decode
 * step then waits for a scheduler tick (SmolLM2 on 2 busy cores: eval, regen and
 * generate ran 20-26x slower). OMP_WAIT_POLICY=passive makes idle team threads
 * sleep at once. libgomp reads the variable once, when it loads, so it must be in
 * the environment before the process starts: a child gets it between fork and exec
 * (ompwait_passive_env), a command run from a shell re-executes itself once
 * (ompwait_reexec_passive). A user's own OMP_WAIT_POLICY always wins.
 */
#ifndef DL_BASE_OMPWAIT_H
#define DL_BASE_OMPWAIT_H

/* Sets OMP_WAIT_POLICY=passive in this process's environment unless the variable
 * is set (to anything, even empty). Returns 1 when it set it, 0 when it was set
 * already, DL_ENOMEM when setenv failed. For a child between fork and exec. */
int ompwait_passive_env(void);

/* When OMP_WAIT_POLICY is unset: sets it to passive and execs exe with argv (the
 * process's full NULL-terminated argv; exe is "/proc/self/exe" for the command
 * itself), so the new image starts its OpenMP runtime passive. Returns only when the
 * variable was set already (0) or the exec failed (DL_EIO, the variable removed
 * again: the caller goes on with the default policy). Call it after the flags are
 * checked, before any OpenMP region or thread is started. */
int ompwait_reexec_passive(const char *exe, char *const argv[]);

#endif
