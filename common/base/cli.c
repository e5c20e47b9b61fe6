#include "common/base/cli.h"
#include "common/base/err.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int cli_parse_i64(const char *flag, const char *s, int64_t min, int64_t max, int64_t *out) {
    if (!s || !*s) return dl_seterr(DL_EINVAL, "%s: missing value", flag);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno == ERANGE)
        return dl_seterr(DL_EINVAL, "%s: '%s' is not an integer", flag, s);
    if (v < min || v > max)
        return dl_seterr(DL_ERANGE, "%s: %lld is out of range [%lld, %lld]", flag, v,
                         (long long)min, (long long)max);
    *out = v;
    return 0;
}

int cli_parse_int(const char *flag, const char *s, int min, int max, int *out) {
    int64_t v;
    DL_TRY(cli_parse_i64(flag, s, min, max, &v));
    *out = (int)v;
    return 0;
}

int cli_parse_f64(const char *flag, const char *s, double min, double max, double *out) {
    if (!s || !*s) return dl_seterr(DL_EINVAL, "%s: missing value", flag);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(v))
        return dl_seterr(DL_EINVAL, "%s: '%s' is not a finite number", flag, s);
    if (v < min || v > max)
        return dl_seterr(DL_ERANGE, "%s: %g is out of range [%g, %g]", flag, v, min, max);
    *out = v;
    return 0;
}

int cli_parse_gb(const char *flag, const char *s, double min_gb, double max_gb, size_t *out_bytes) {
    double gb;
    DL_TRY(cli_parse_f64(flag, s, min_gb, max_gb, &gb));
    *out_bytes = (size_t)(gb * 1024.0 * 1024.0 * 1024.0);
    return 0;
}

int cli_parse_int_list(const char *flag, const char *s, int min, int max, int *out, int cap, int *n) {
    *n = 0;
    if (!s) return dl_seterr(DL_EINVAL, "%s: missing value", flag);
    char buf[1024];
    if (strlen(s) >= sizeof buf) return dl_seterr(DL_ERANGE, "%s: list too long", flag);
    strcpy(buf, s);
    int count = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (count >= cap) return dl_seterr(DL_ERANGE, "%s: more than %d items", flag, cap);
        int v;
        DL_TRY(cli_parse_int(flag, tok, min, max, &v));
        out[count++] = v;
    }
    *n = count;
    return 0;
}

int cli_parse_bool(const char *flag, const char *s, int *out) {
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (s && strcasecmp(s, yes[i]) == 0) { *out = 1; return 0; }
        if (s && strcasecmp(s, no[i]) == 0) { *out = 0; return 0; }
    }
    return dl_seterr(DL_EINVAL, "%s: '%s' is not a boolean (true/false)", flag, s ? s : "");
}

void cli_error(const char *prog, const char *detail) {
    /* "prepare" -> Try 'draftline prepare --help' (a subcommand name alone is not a command) */
    int bare = !strchr(prog, ' ') && strcmp(prog, "draftline") != 0;
    fprintf(stderr, "%s: %s\nTry '%s%s --help'.\n", prog, detail, bare ? "draftline " : "", prog);
}
