#!/usr/bin/env bash
# `make fuzz`: builds the protocol decoder fuzzer (proto/fuzz/fuzz_decode.c with
# clang -fsanitize=fuzzer,address,undefined, linked with proto/codec*.c and
# common/base/*.c only), seeds a corpus with encoded valid messages of every type
# and runs libFuzzer for FUZZ_RUNS executions (default 1000000).
# Env: FUZZ_RUNS, FUZZ_DIR (default build/fuzz), CLANG (default clang or clang-14),
#      FUZZ_SEED (libFuzzer -seed, default 1), FUZZ_MAX_LEN (default 4096).
# Exit status: 0 when no crash, non-zero otherwise (reproducer in FUZZ_DIR/crash-*).
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG="${CLANG:-$(command -v clang || command -v clang-14 || true)}"
if [ -z "$CLANG" ]; then
  echo "fuzz: clang not found (apt-get install clang libclang-rt-dev)" >&2; exit 1
fi
DIR="${FUZZ_DIR:-build/fuzz}"
RUNS="${FUZZ_RUNS:-1000000}"
mkdir -p "$DIR/seeds" "$DIR/corpus"

CFLAGS=(-std=gnu11 -g -O1 -D_GNU_SOURCE -I. -Wall -Wextra -Wno-unused-parameter)
SRC=(proto/codec*.c common/base/*.c)
echo "fuzz: building $DIR/fuzz_decode with $CLANG"
"$CLANG" "${CFLAGS[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -fno-omit-frame-pointer proto/fuzz/fuzz_decode.c "${SRC[@]}" -lmsgpackc -lm -o "$DIR/fuzz_decode"
"$CLANG" "${CFLAGS[@]}" proto/fuzz/gen_corpus.c "${SRC[@]}" -lmsgpackc -lm -o "$DIR/gen_corpus"
rm -f "$DIR"/seeds/*
"$DIR/gen_corpus" "$DIR/seeds"

echo "fuzz: $RUNS runs"
set +e
"$DIR/fuzz_decode" -runs="$RUNS" -seed="${FUZZ_SEED:-1}" -max_len="${FUZZ_MAX_LEN:-4096}" \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$DIR/" \
  "$DIR/corpus" "$DIR/seeds" 2>&1 | tee "$DIR/fuzz.log" | grep -v '^#[0-9]*.*\(NEW\|REDUCE\|pulse\)'
rc=${PIPESTATUS[0]}
set -e
execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$DIR/fuzz.log" | grep -o '[0-9]*$' || echo 0)
crashes=$( (ls "$DIR"/crash-* "$DIR"/leak-* "$DIR"/timeout-* "$DIR"/oom-* 2>/dev/null || true) | wc -l)
echo "fuzz: executions=$execs crashes=$crashes (exit $rc; log $DIR/fuzz.log)"
[ "$rc" -eq 0 ] && [ "$crashes" -eq 0 ]
