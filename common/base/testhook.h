/* Test hooks: the one test-only switch of draftline.
 *
 * A test that needs a stage to misbehave on purpose (poison a micro-batch's loss, hang a
 * drafter, run the GPU placement logic with CPU stages) sets the environment variable
 * DL_TEST_HOOKS="name=value[,name=value...]" for the `draftline run` it starts; children
 * inherit it. The variable is parsed once, on the first call, never in a hot loop, and no
 * hook is a flag or appears in any --help. A build with `make RELEASE=1` (-DDL_RELEASE)
 * compiles every hook out: testhook_i64 always answers "not set".
 *
 * Names: [a-z0-9_.]{1,63}; a hook meant for one stage is qualified with its name
 * ("drafter0.stall_after_mbs"). The hooks in use are listed in docs/ARCHITECTURE.md
 * (Test hooks).
 */
#ifndef DL_BASE_TESTHOOK_H
#define DL_BASE_TESTHOOK_H

#include <stdint.h>

/* 1 and *out = the hook's value (a decimal integer) when DL_TEST_HOOKS sets `name`;
 * 0 (and *out untouched) when it does not, or in a release build. A malformed entry is
 * warned about once on stderr and ignored. Thread-safe after the first call; make the
 * first call at start-up. */
int testhook_i64(const char *name, int64_t *out);

#endif
