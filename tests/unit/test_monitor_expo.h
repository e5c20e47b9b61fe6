/* Test helper shared by tests/unit/test_monitor.c and
 * tests/integration/test_monitor_live.c: checks a Prometheus text exposition (format
 * 0.0.4) line by line, and reads one sample's value. Include after cmocka.h. */
#ifndef DL_TESTS_MONITOR_EXPO_H
#define DL_TESTS_MONITOR_EXPO_H

#include <stdlib.h>
#include <string.h>

static inline int valid_name(const char *s, size_t n) {
    if (!n) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                 (i > 0 && c >= '0' && c <= '9');
        if (!ok) return 0;
    }
    return 1;
}

/* Checks every line against the text exposition format 0.0.4; returns the number of
 * samples, or fails. Families: TYPE before samples, once; names valid; labels
 * name="escaped value"; value a float, NaN or +-Inf. */
static inline int check_exposition(const char *text) {
    char typed[512][96];
    int n_typed = 0, samples = 0;
    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n');
        if (!e) fail_msg("last line without a newline");
        size_t L = (size_t)(e - l);
        char line[1024];
        assert_true(L < sizeof line);
        memcpy(line, l, L);
        line[L] = 0;
        if (!strncmp(line, "# HELP ", 7)) {
            char *sp = strchr(line + 7, ' ');
            assert_non_null(sp);
            assert_true(valid_name(line + 7, (size_t)(sp - line - 7)));
        } else if (!strncmp(line, "# TYPE ", 7)) {
            char name[128], type[32];
            assert_int_equal(sscanf(line + 7, "%127s %31s", name, type), 2);
            assert_true(valid_name(name, strlen(name)));
            assert_true(!strcmp(type, "gauge") || !strcmp(type, "counter"));
            for (int i = 0; i < n_typed; i++)
                if (!strcmp(typed[i], name)) fail_msg("TYPE %s twice", name);
            assert_true(n_typed < 512);
            snprintf(typed[n_typed++], 96, "%s", name);
        } else {
            const char *p = line;
            while (*p && *p != '{' && *p != ' ') p++;
            assert_true(valid_name(line, (size_t)(p - line)));
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(p - line), line);
            int found = 0;
            for (int i = 0; i < n_typed; i++) found |= !strcmp(typed[i], name);
            if (!found) fail_msg("sample %s before its TYPE", name);
            if (*p == '{') {
                p++;
                while (*p != '}') {
                    const char *k = p;
                    while (*p && *p != '=') p++;
                    assert_true(valid_name(k, (size_t)(p - k)));
                    assert_true(p[0] == '=' && p[1] == '"');
                    p += 2;
                    while (*p && *p != '"') {
                        if (*p == '\\') { assert_true(p[1] == '\\' || p[1] == '"' || p[1] == 'n'); p++; }
                        p++;
                    }
                    assert_true(*p == '"');
                    p++;
                    if (*p == ',') p++;
                    else assert_true(*p == '}');
                }
                p++;
            }
            assert_true(*p == ' ');
            p++;
            if (strcmp(p, "NaN") && strcmp(p, "+Inf") && strcmp(p, "-Inf")) {
                char *end;
                strtod(p, &end);
                if (*end || end == p) fail_msg("bad value in '%s'", line);
            }
            samples++;
        }
        l = e + 1;
    }
    return samples;
}

/* Value of the sample line starting with prefix (not a HELP/TYPE line). */
static inline double sample_value(const char *text, const char *prefix) {
    for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
        if (!strncmp(l, prefix, strlen(prefix))) return strtod(l + strlen(prefix), NULL);
    return NAN;
}

#endif
