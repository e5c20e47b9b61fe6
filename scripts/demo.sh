#!/usr/bin/env bash
# `make demo`: runs the main job on the embedded model and real data.
set -euo pipefail
echo "demo: the pipeline does not exist yet; this demo runs the most complete part that does."
./bin/draftline version
