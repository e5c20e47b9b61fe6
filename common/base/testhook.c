#include "common/base/testhook.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DL_RELEASE
int testhook_i64(const char *name, int64_t *out) {
    (void)name; (void)out;
    return 0;
}
#else
#define TESTHOOK_MAX 16

typedef struct { char name[64]; int64_t value; } testhook_t;

/* Parsed once from DL_TEST_HOOKS; read-only afterwards. */
static struct { int parsed, n; testhook_t h[TESTHOOK_MAX]; } hooks;

static void testhook__parse(void) {
    const char *env = getenv("DL_TEST_HOOKS");
    hooks.parsed = 1;
    if (!env || !*env) return;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", env);
    char *save = NULL;
    for (char *e = strtok_r(buf, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(e, '='), *end = NULL;
        if (eq) *eq = 0;
        long long v = eq ? strtoll(eq + 1, &end, 10) : 0;
        size_t n = strlen(e);
        int ok = eq && end != eq + 1 && !*end && n > 0 && n < sizeof hooks.h[0].name &&
                 strspn(e, "abcdefghijklmnopqrstuvwxyz0123456789_.") == n && hooks.n < TESTHOOK_MAX;
        if (!ok) {
            fprintf(stderr, "DL_TEST_HOOKS: ignoring malformed entry '%s' (want name=integer)\n", e);
            continue;
        }
        snprintf(hooks.h[hooks.n].name, sizeof hooks.h[0].name, "%s", e);
        hooks.h[hooks.n++].value = v;
    }
}

int testhook_i64(const char *name, int64_t *out) {
    if (!hooks.parsed) testhook__parse();
    for (int i = 0; i < hooks.n; i++)
        if (!strcmp(hooks.h[i].name, name)) {
            *out = hooks.h[i].value;
            return 1;
        }
    return 0;
}
#endif
