/* draftline inspect: what a checkpoint holds (GGUF file, HF model dir, or any dir of
 * safetensors + config.json such as a DFlash drafter checkpoint). */
#include "tools/commands.h"

#include "common/base/err.h"
#include "common/base/log.h"
#include "common/model/config.h"
#include "common/model/dflash_ckpt.h"
#include "common/pipe/ckpt.h"
#include "common/format/gguf.h"
#include "common/format/safetensors.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void inspect_usage(FILE *f) {
    fprintf(f,
            "usage: draftline inspect PATH [--tensors]\n\n"
            "Prints a checkpoint's architecture, shapes, dtypes and parameter count.\n"
            "PATH: a .gguf file, a Hugging Face model directory (config.json + safetensors,\n"
            "sharded or not), a .safetensors file, a drafter checkpoint directory, or a run\n"
            "directory (`draftline run --out DIR`: its latest checkpoint).\n\n"
            "  --tensors   list every tensor (default: the first 12 and the dtype totals)\n");
}

static void print_config(const model_config_t *m) {
    printf("family        %s (%s)\n", model_family_name(m->family), m->arch);
    printf("layers        L=%d  hidden D=%d  heads H=%d  kv heads Hkv=%d  head dim hd=%d\n", m->L,
           m->D, m->H, m->Hkv, m->hd);
    printf("mlp           F=%d  vocab V=%d  rms eps %g\n", m->F, m->V, m->eps);
    printf("rope          theta %g", m->rope.theta);
    if (m->rope.llama3)
        printf("  llama3 scaling (factor %g, low %g, high %g, original max pos %d)", m->rope.factor,
               m->rope.low_freq_factor, m->rope.high_freq_factor, m->rope.original_max_position_embeddings);
    printf("\n");
    printf("features      %s embeddings%s%s%s%s\n", m->tie_embeddings ? "tied" : "untied",
           m->attn_bias ? ", q/k/v bias" : "", m->o_bias ? ", o bias" : "",
           m->mlp_bias ? ", mlp bias" : "", m->qk_norm ? ", q/k norm" : "");
    printf("max positions %d   bos %d   eos", m->max_pos, m->bos_id);
    for (int i = 0; i < m->n_eos; i++) printf(" %d", m->eos_ids[i]);
    printf("\nparameters    %.3f M (from the config)\n", model_config_n_params(m) / 1e6);
    if (m->n_experts > 0) {
        int n_moe = model_config_n_moe_layers(m);
        printf("experts       %d per MoE layer, top-%d per token%s, expert F=%d; %d of %d layers "
               "MoE\n", m->n_experts, m->top_k, m->norm_topk ? " (renormalised)" : "", m->moe_F,
               n_moe, m->L);
        printf("active        %.3f M parameters per token (of %.3f M total)\n",
               model_config_n_active_params(m) / 1e6, model_config_n_params(m) / 1e6);
    }
}

static int inspect_gguf(const char *path, int all) {
    gguf_t *g = NULL;
    int rc = gguf_open(path, &g);
    if (rc < 0) return log_rc(rc, "inspect"), 1;
    printf("format        GGUF v%u, %llu metadata entries, %llu tensors\n", gguf_version(g),
           (unsigned long long)gguf_n_kv(g), (unsigned long long)gguf_n_tensors(g));
    gguf_str_t s;
    if (gguf_get_str(g, "general.name", &s) == 0) printf("name          %.*s\n", (int)s.len, s.data);
    model_config_t m;
    if ((rc = model_config_from_gguf(g, &m)) == 0) print_config(&m);
    else printf("config        not a supported target: %s\n", dl_errmsg());
    uint64_t per_type[64] = {0}, total = 0, bytes = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(g, i);
        uint64_t n = gguf_tensor_nelem(t);
        total += n;
        bytes += t->nbytes;
        if ((unsigned)t->type < 64) per_type[t->type] += n;
        if (all || i < 12) {
            printf("  %-40.*s %-6s [", (int)t->name.len, t->name.data, ggml_type_name(t->type));
            for (uint32_t d = 0; d < t->n_dims; d++) printf(d ? ", %llu" : "%llu", (unsigned long long)t->ne[d]);
            printf("]\n");
        } else if (i == 12) printf("  ... (--tensors lists all)\n");
    }
    printf("dtypes       ");
    for (int i = 0; i < 64; i++)
        if (per_type[i]) printf(" %s %.3f M", ggml_type_name((ggml_type_t)i), per_type[i] / 1e6);
    printf("\nparameters    %.3f M in the file (%.1f MB)\n", total / 1e6, bytes / 1e6);
    gguf_close(&g);
    return 0;
}

/* 1 when DIR/config.json lists "DFlashDraftModel" in architectures. */
static int is_dflash_dir(const char *dir) {
    char cp[PATH_MAX];
    snprintf(cp, sizeof cp, "%s/config.json", dir);
    FILE *f = fopen(cp, "rb");
    if (!f) return 0;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *r = cJSON_Parse(buf), *e;
    int yes = 0;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(r, "architectures");
    if (cJSON_IsArray(a))
        cJSON_ArrayForEach(e, a) if (cJSON_IsString(e) && !strcmp(e->valuestring, "DFlashDraftModel")) yes = 1;
    cJSON_Delete(r);
    return yes;
}

/* The checksums of a drafter checkpoint dir: a training checkpoint (state.bin) through
 * ckpt_verify (state.bin, model.safetensors, cursor.bin) and ckpt_verify_layout (c: the
 * drafter of its config.json), else model.safetensors alone. Prints a "checksums" line; a mismatch is one line on stderr naming the file. Returns
 * 1 on a mismatch or an unreadable file, else 0. */
static int inspect_checksums(const char *dir, const drafter_config_t *c) {
    char p[4200];
    snprintf(p, sizeof p, "%s/state.bin", dir);
    int training = access(p, F_OK) == 0, rc, ok = 1;
    unsigned un = 0;
    if (training) {
        rc = ckpt_verify(dir, &un);
        if (rc == 0) rc = ckpt_verify_layout(dir, c);
        ok = !(un & CKPT_UNVERIFIED_STATE) && !(un & CKPT_UNVERIFIED_MODEL);
    } else {
        rc = dflash_ckpt_verify_weights(dir, &ok);
    }
    if (rc < 0) {
        printf("checksums     MISMATCH (see below)\n");
        fprintf(stderr, "inspect: %s\n", dl_errmsg());
        return 1;
    }
    printf("checksums     %s\n", ok ? (training ? "state.bin, model.safetensors and cursor.bin agree"
                                                 : "model.safetensors agrees")
                                    : "not recorded (written before checksums): not verified");
    return 0;
}

/* A DFlash drafter checkpoint: its architecture from config.json, every tensor
 * (name, dtype, shape), the parameter count, and config vs tensors consistency
 * (layer count, fc input width). Returns the exit code: 1 on any mismatch. */
static int inspect_drafter(const char *path) {
    drafter_config_t c;
    int rc = dflash_config_load(path, &c);
    if (rc < 0) return log_rc(rc, "inspect: drafter config"), 1;
    printf("format        DFlash drafter checkpoint (DFlashDraftModel)\n");
    printf("drafter       %d layers, D %d, heads %d (kv %d, head dim %d), MLP %d, vocab %d\n", c.n_layers, c.D, c.H,
           c.Hkv, c.hd, c.F, c.V);
    printf("block size    %d (gamma %.2f)\n", c.B, c.gamma);
    printf("target layers");
    for (int i = 0; i < c.n_feat; i++) printf(" %d", c.target_layer_ids[i]);
    printf(" (of %d)\nmask token id %d\n", c.n_target_layers, c.mask_token_id);
    safetensors_t *st = NULL;
    if ((rc = safetensors_open(path, &st)) < 0) return log_rc(rc, "inspect"), 1;
    size_t n = safetensors_n_tensors(st);
    uint64_t total = 0, bytes = 0;
    int max_layer = -1, bad = 0;
    printf("tensors       %zu\n", n);
    for (size_t i = 0; i < n; i++) {
        const st_tensor_t *t = safetensors_tensor_at(st, i);
        total += st_tensor_nelem(t);
        bytes += t->nbytes;
        printf("  %-48s %-5s (", t->name, t->dtype_name);
        for (int d = 0; d < t->n_dims; d++) printf(d ? ", %lld" : "%lld", (long long)t->shape[d]);
        printf(")\n");
        int li;
        if (sscanf(t->name, "layers.%d.", &li) == 1 && li > max_layer) max_layer = li;
    }
    printf("parameters    %.3f M (%llu, %.1f MB)\n", total / 1e6, (unsigned long long)total, bytes / 1e6);
    if (max_layer + 1 != c.n_layers) {
        fprintf(stderr, "inspect: %s: config num_hidden_layers %d but the tensors hold %d layers\n", path, c.n_layers,
                max_layer + 1);
        bad = 1;
    }
    for (int l = 0; l < c.n_layers && l <= max_layer; l++) {
        char nm[96];
        snprintf(nm, sizeof nm, "layers.%d.self_attn.q_proj.weight", l);
        if (!safetensors_find(st, nm)) { fprintf(stderr, "inspect: %s: missing tensor %s\n", path, nm); bad = 1; }
    }
    const st_tensor_t *fc = safetensors_find(st, "fc.weight");
    if (!fc) { fprintf(stderr, "inspect: %s: missing tensor fc.weight\n", path); bad = 1; }
    else if (fc->n_dims != 2 || fc->shape[0] != c.D || fc->shape[1] != (int64_t)c.n_feat * c.D) {
        fprintf(stderr, "inspect: %s: fc.weight is not (%d, %d) for D %d and %d target layers\n", path, c.D,
                c.n_feat * c.D, c.D, c.n_feat);
        bad = 1;
    }
    safetensors_close(&st);
    printf("consistency   %s\n", bad ? "MISMATCH (see above)" : "config and tensors agree");
    return inspect_checksums(path, &c) || bad;
}

static int inspect_safetensors(const char *path, int is_dir, int all) {
    if (is_dir && is_dflash_dir(path)) return inspect_drafter(path);
    if (is_dir) {
        char cp[PATH_MAX];
        snprintf(cp, sizeof cp, "%s/config.json", path);
        model_config_t m;
        int rc = model_config_from_hf_dir(path, &m);
        if (rc == 0) print_config(&m);
        else {
            /* not a target: show the config's top-level scalars (e.g. a drafter's) */
            printf("config        not a target model (%s); top-level fields:\n", dl_errmsg());
            FILE *f = fopen(cp, "rb");
            if (f) {
                char buf[1 << 16];
                size_t n = fread(buf, 1, sizeof buf - 1, f);
                fclose(f);
                buf[n] = 0;
                cJSON *r = cJSON_Parse(buf);
                cJSON *e;
                if (r) cJSON_ArrayForEach(e, r) {
                    char *v = cJSON_PrintUnformatted(e);
                    if (v && strlen(v) < 100) printf("  %-32s %s\n", e->string, v);
                    free(v);
                }
                cJSON_Delete(r);
            }
        }
    }
    safetensors_t *st = NULL;
    int rc = safetensors_open(path, &st);
    if (rc < 0) return log_rc(rc, "inspect"), 1;
    size_t n = safetensors_n_tensors(st);
    printf("format        safetensors, %zu tensors\n", n);
    struct { char name[12]; uint64_t n; } dt[16];
    int ndt = 0;
    uint64_t total = 0, bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const st_tensor_t *t = safetensors_tensor_at(st, i);
        uint64_t k = st_tensor_nelem(t);
        total += k;
        bytes += t->nbytes;
        int j = 0;
        while (j < ndt && strcmp(dt[j].name, t->dtype_name)) j++;
        if (j == ndt && ndt < 16) { snprintf(dt[ndt].name, sizeof dt[ndt].name, "%s", t->dtype_name); dt[ndt++].n = 0; }
        if (j < 16) dt[j].n += k;
        if (all || i < 12) {
            printf("  %-48s %-5s (", t->name, t->dtype_name);
            for (int d = 0; d < t->n_dims; d++) printf(d ? ", %lld" : "%lld", (long long)t->shape[d]);
            printf(")\n");
        } else if (i == 12) printf("  ... (--tensors lists all)\n");
    }
    printf("dtypes       ");
    for (int j = 0; j < ndt; j++) printf(" %s %.3f M", dt[j].name, dt[j].n / 1e6);
    printf("\nparameters    %.3f M in the files (%.1f MB)\n", total / 1e6, bytes / 1e6);
    safetensors_close(&st);
    return 0;
}

int cmd_inspect(int argc, char **argv) {
    static const struct option opts[] = {
        {"tensors", no_argument, 0, 't'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c, all = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 't': all = 1; break;
        case 'h': inspect_usage(stdout); return 0;
        default: inspect_usage(stderr); return 2;
        }
    }
    if (optind != argc - 1) { inspect_usage(stderr); return 2; }
    const char *path = argv[optind];
    struct stat sb;
    if (stat(path, &sb) < 0) {
        fprintf(stderr, "inspect: %s: no such file or directory\n", path);
        return 1;
    }
    char resolved[4096];
    if (S_ISDIR(sb.st_mode)) {   /* a run dir (`run --out DIR`): its latest checkpoint, as `eval --drafter` */
        char cfgp[4200];
        snprintf(cfgp, sizeof cfgp, "%s/config.json", path);
        if (access(cfgp, F_OK) != 0 && ckpt_resolve(path, resolved, sizeof resolved) == 0) {
            printf("run           %s: its latest checkpoint\n", path);
            path = resolved;
        }
    }
    printf("path          %s\n", path);
    if (S_ISDIR(sb.st_mode)) return inspect_safetensors(path, 1, all);
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    if (f) {
        if (fread(magic, 1, 4, f) != 4) memset(magic, 0, 4);
        fclose(f);
    }
    size_t plen = strlen(path);
    /* by magic, else by name: an empty or truncated .gguf is reported as GGUF */
    if (!memcmp(magic, "GGUF", 4) || (plen > 5 && !strcmp(path + plen - 5, ".gguf"))) return inspect_gguf(path, all);
    if (plen <= 12 || strcmp(path + plen - 12, ".safetensors") != 0) {
        /* neither GGUF magic nor a .safetensors name: say what it is not before the
         * safetensors parser reports its first 8 bytes as a header length */
        safetensors_t *st = NULL;
        if (safetensors_open(path, &st) < 0) {
            const char *why = dl_errmsg();
            if (!strncmp(why, path, plen) && why[plen] == ':' && why[plen + 1] == ' ') why += plen + 2;
            fprintf(stderr, "inspect: %s: not a GGUF or safetensors checkpoint (no GGUF magic; %s)\n", path, why);
            return 1;
        }
        safetensors_close(&st);
    }
    return inspect_safetensors(path, 0, all);
}
