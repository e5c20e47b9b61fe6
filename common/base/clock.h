/* Clocks. Monotonic for durations and deadlines, wall for logs and metrics. */
#ifndef DL_BASE_CLOCK_H
#define DL_BASE_CLOCK_H

#include <stdint.h>

uint64_t clock_mono_ns(void);   /* CLOCK_MONOTONIC, nanoseconds */
double clock_mono_s(void);      /* CLOCK_MONOTONIC, seconds */
double clock_wall_s(void);      /* CLOCK_REALTIME, seconds since the epoch */

#endif
