#!/usr/bin/env bash
# `make bundle`: a self-contained copy of the built programs for a GPU machine
# that lacks the project's libraries (ZeroMQ, libuv, msgpack, cJSON, PCRE2,
# cmocka, libyaml, OpenBLAS, ...):
#   bundle/bin    <- $BIN/*            (rpath $ORIGIN/../lib, set by the Makefile)
#   bundle/tests  <- $BUILD/tests/*    (same rpath; run with bundle/env.sh sourced)
#   bundle/bench  <- $BUILD/bench/*    (if built)
#   bundle/lib    <- every shared library they load except the C/C++ runtime
#                    (glibc's libc, libm, libpthread, libdl, librt, libresolv, ...;
#                    libstdc++, libgcc_s, the loader) and the NVIDIA driver (libcuda, libnvidia-*).
# The CUDA toolkit libraries (cudart, cuBLAS, cuBLASLt, NCCL; cuBLASLt alone is
# ~500 MiB) are NOT copied by default: the GPU machines carry CUDA 13. Set
# BUNDLE_CUDA=1 to copy the small ones (cudart) anyway.
# bundle/env.sh, sourced on the GPU machine, puts bundle/lib first on
# LD_LIBRARY_PATH and adds the machine's own CUDA library folders (toolkit and
# the pip nvidia-* wheels that PyTorch ships) for whatever is not bundled.
# Env: BUILD (default build), BIN (default bin), BUNDLE (default bundle),
#      BUNDLE_FILTER (extended regex on program names, e.g. 'gpu_test|bench_': only
#      those are copied; the run tool carries at most 64 MiB with the tree).
# Copies are stripped of debug info (the CUDA fat binaries stay).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${BUILD:-build}"; BIN="${BIN:-bin}"; OUT="${BUNDLE:-$ROOT/bundle}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD";; esac
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN";; esac
# the programs of src_dir ($1) that BUNDLE_FILTER keeps, one a line
list_progs() {
  local f
  [ -d "$1" ] || return 0
  for f in "$1"/*; do
    [ -f "$f" ] && [ -x "$f" ] || continue
    if [ -n "${BUNDLE_FILTER:-}" ] && ! [[ "$(basename "$f")" =~ $BUNDLE_FILTER ]]; then continue; fi
    printf '%s\n' "$f"
  done
}

# a program older than a library it links was not rebuilt (`make` alone does not build
# bench/: `make bundle` does, this script by itself does not): refuse it rather than ship
# the old code under the new name (a GPU call measured a stale bench_target that way).
# Every such program is named, and the previous bundle is left as it was.
stale=0
for d in "$BIN" "$BUILD/tests" "$BUILD/bench"; do
  while read -r f; do
    libs=("$BUILD/libdraftline.a")
    [ "$f" = "$BIN/draftline" ] && libs+=("$BUILD/libsupervisor.a")   # the Makefile links it there only
    for lib in "${libs[@]}"; do
      if [ -f "$lib" ] && [ "$f" -ot "$lib" ]; then
        echo "bundle: $f is older than $lib (not rebuilt): run \`make bundle\`" \
             "(or \`make ${f#"$ROOT"/}\` for one program)" >&2
        stale=1
        break
      fi
    done
  done < <(list_progs "$d")
done
[ "$stale" = 0 ] || { echo "bundle: nothing written (${OUT} left as it was)" >&2; exit 1; }

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/tests" "$OUT/lib" "$OUT/bench"

progs=()
copy_progs() {  # src_dir dst_dir
  local f
  while read -r f; do
    if ! strip --strip-debug -o "$2/$(basename "$f")" "$f" 2>/dev/null; then cp -p "$f" "$2/"; fi
    progs+=("$2/$(basename "$f")")
  done < <(list_progs "$1")
}
copy_progs "$BIN" "$OUT/bin"
copy_progs "$BUILD/tests" "$OUT/tests"
copy_progs "$BUILD/bench" "$OUT/bench"
cp -p "$ROOT/tests/run.sh" "$OUT/tests/run.sh" 2>/dev/null || true
[ ${#progs[@]} -gt 0 ] || { echo "bundle: nothing built in $BIN, $BUILD/tests (run make first)" >&2; exit 1; }

skip_re='^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec|libpthread|libdl\.so|librt\.so|libresolv|libnsl|libnss_|libutil|libanl|libstdc\+\+|libgcc_s|libcuda\.so|libnvidia-)'
cuda_re='^(libcudart|libcublas|libcublasLt|libnccl|libnvJitLink|libnvrtc|libcusparse|libcufft|libcurand)\.'
declare -A seen=()
missing=0
for p in "${progs[@]}"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [[ "$name" =~ $skip_re ]] && continue
    if [[ "$name" =~ $cuda_re ]] && [ "${BUNDLE_CUDA:-0}" != 1 -o "${name#libcudart}" = "$name" ]; then
      continue
    fi
    if [ "$path" = "not" ]; then echo "bundle: $p: $name not found" >&2; missing=1; continue; fi
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=1
    cp -L "$path" "$OUT/lib/$name"
  done < <(ldd "$p" 2>/dev/null || true)
done

cat > "$OUT/env.sh" <<'ENV'
# Source on the GPU machine: . bundle/env.sh
_b="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_p="$_b/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib \
         /usr/lib/x86_64-linux-gnu; do
  [ -d "$d" ] && _p="$_p:$d"
done
# NVIDIA's pip wheels (PyTorch's own CUDA libraries), for NCCL / cuBLAS when no toolkit folder has them
for d in $(python3 -c 'import site,glob; [print(x) for s in site.getsitepackages() for x in glob.glob(s+"/nvidia/*/lib")+glob.glob(s+"/nvidia/cu13/lib")]' 2>/dev/null); do
  _p="$_p:$d"
done
export LD_LIBRARY_PATH="$_p${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DL_BIN_DIR="$_b/bin"
unset _b _p
ENV
n_lib=$(ls "$OUT/lib" | wc -l)
echo "bundle: ${#progs[@]} programs, $n_lib libraries, $(du -sh "$OUT" | cut -f1) in $OUT"
if [ "$(du -sm "$OUT" | cut -f1)" -gt 60 ]; then
  echo "bundle: warning: over 60 MiB; the GPU run tool carries at most 64 MiB with the tree:" \
       "narrow it with BUNDLE_FILTER (e.g. BUNDLE_FILTER='gpu_test|bench_')" >&2
fi
ls "$OUT/lib" | tr '\n' ' '; echo
[ $missing -eq 0 ]
