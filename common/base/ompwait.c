/* OpenMP wait policy (see ompwait.h). */
#include "common/base/ompwait.h"

#include "common/base/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OMPWAIT_VAR "OMP_WAIT_POLICY"

int ompwait_passive_env(void) {
    if (getenv(OMPWAIT_VAR)) return 0;
    if (setenv(OMPWAIT_VAR, "passive", 1) != 0) return dl_seterr(DL_ENOMEM, "setenv " OMPWAIT_VAR);
    return 1;
}

int ompwait_reexec_passive(const char *exe, char *const argv[]) {
    int rc = ompwait_passive_env();
    if (rc <= 0) return rc;
    execv(exe, argv);
    int e = errno;
    unsetenv(OMPWAIT_VAR);
    return dl_seterr(DL_EIO, "exec %s: %s", exe, strerror(e));
}
