/* Well-known locations.
 *   cache dir:  $DRAFTLINE_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/draftline
 *   default model: <cache dir>/SmolLM2-135M-Instruct.Q4_1.gguf (fetched by `make model`)
 *   shared data: $DL_SHARED_DATA, else ../shared/data (relative to the repo root)
 * Results are written into the caller's buffer (cap bytes); returns 0 or DL_ERANGE. */
#ifndef DL_BASE_PATHS_H
#define DL_BASE_PATHS_H

#include <stddef.h>

#define DL_DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

int paths_cache_dir(char *out, size_t cap);
int paths_default_model(char *out, size_t cap);
int paths_shared_data(char *out, size_t cap);
/* mkdir -p with the given mode for the last component (e.g. 0700 for run dirs). */
int paths_mkdir_p(const char *path, unsigned mode);

#endif
