/* Flag value parsing for getopt_long front ends. Each parser names the flag in
 * its error detail ("--lr: 'abc' is not a number"), returns 0 or DL_EINVAL /
 * DL_ERANGE, and leaves *out untouched on error. */
#ifndef DL_BASE_CLI_H
#define DL_BASE_CLI_H

#include <stddef.h>
#include <stdint.h>

int cli_parse_i64(const char *flag, const char *s, int64_t min, int64_t max, int64_t *out);
int cli_parse_int(const char *flag, const char *s, int min, int max, int *out);
int cli_parse_f64(const char *flag, const char *s, double min, double max, double *out);
/* Gibibytes as a decimal ("1.5") to bytes; min/max in GiB. */
int cli_parse_gb(const char *flag, const char *s, double min_gb, double max_gb, size_t *out_bytes);
/* Comma list of ints "0,1,3" into out[cap]; *n gets the count. Empty string -> 0 items. */
int cli_parse_int_list(const char *flag, const char *s, int min, int max, int *out, int cap, int *n);
/* "yes/no/true/false/1/0/on/off". */
int cli_parse_bool(const char *flag, const char *s, int *out);

/* Prints "<prog>: <detail>" and "Try 'draftline <prog> --help'." to stderr ("draftline " is
 * prepended when prog is a bare subcommand name, i.e. has no space). */
void cli_error(const char *prog, const char *detail);

#endif
