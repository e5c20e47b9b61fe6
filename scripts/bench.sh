#!/usr/bin/env bash
# `make bench`: runs every benchmark program in $BUILD/bench (default build/bench)
# in name order; each prints its figures, or "SKIP: ..." when no GPU is present.
# Programs that need a model take it from $DL_BENCH_MODEL (passed as --model when
# set and the program is not bench_ops). Extra arguments go to every program.
# Env: BUILD (default build), DL_BENCH_FILTER (substring of program names).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${BUILD:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD";; esac
DIR="${DL_BENCH_DIR:-$BUILD/bench}"
rc=0; n=0
for b in "$DIR"/bench_*; do
  [ -f "$b" ] && [ -x "$b" ] || continue
  name="$(basename "$b")"
  if [ -n "${DL_BENCH_FILTER:-}" ] && [[ "$name" != *"$DL_BENCH_FILTER"* ]]; then continue; fi
  n=$((n+1))
  echo "=== $name"
  args=("$@")
  if [ -n "${DL_BENCH_MODEL:-}" ] && [ "$name" != bench_ops ]; then args+=(--model "$DL_BENCH_MODEL"); fi
  "$b" "${args[@]}" || { echo "--- $name failed (exit $?)"; rc=1; }
done
[ $n -gt 0 ] || echo "bench: no benchmark programs in $DIR (run make first)"
exit $rc
