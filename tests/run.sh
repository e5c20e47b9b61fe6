#!/usr/bin/env bash
# Runs every test binary in DIR with a hard timeout; a test exits 0 (pass),
# 77 (skipped, e.g. no GPU), anything else (fail). Prints one summary line.
# Env: DL_TEST_TIMEOUT_S (default 600), DL_TEST_FILTER (substring of the name).
set -u
DIR="${1:-build/tests}"
TO="${DL_TEST_TIMEOUT_S:-600}"
pass=0; fail=0; skip=0; failed=()
for t in "$DIR"/*; do
  [ -x "$t" ] && [ -f "$t" ] || continue
  name="$(basename "$t")"
  if [ -n "${DL_TEST_FILTER:-}" ] && [[ "$name" != *"$DL_TEST_FILTER"* ]]; then continue; fi
  start=$(date +%s%N)
  echo "=== $name"
  timeout --kill-after=10 "$TO" "$t"
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 )); dur="$((ms/1000)).$(( (ms%1000)/100 ))"
  case $rc in
    0)  pass=$((pass+1)); echo "--- PASS $name (${dur}s)";;
    77) skip=$((skip+1)); echo "--- SKIP $name (${dur}s)";;
    124|137) fail=$((fail+1)); failed+=("$name"); echo "--- FAIL $name: timed out after ${TO}s";;
    *)  fail=$((fail+1)); failed+=("$name"); echo "--- FAIL $name (exit $rc, ${dur}s)";;
  esac
done
[ $fail -eq 0 ] || echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
