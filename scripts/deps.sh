#!/usr/bin/env bash
# Installs the Debian packages draftline builds against, when missing.
#   scripts/deps.sh          install what is missing (root), else print the apt-get line
#   scripts/deps.sh --check  same, used by `make test` / `make demo`
set -euo pipefail
PKGS=(build-essential pkg-config libzmq3-dev libuv1-dev libmsgpack-dev libopenblas-dev
      libcjson-dev libpcre2-dev libutf8proc-dev libcmocka-dev libyaml-dev zlib1g-dev libncurses-dev libcairo2-dev
      libsodium-dev python3 python3-pip unzip clang libclang-rt-14-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  [ "${1:-}" = "--check" ] || echo "deps: all present"
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "deps: installed"
else
  echo "deps: missing packages; run as root:" >&2
  echo "  apt-get install -y ${missing[*]}" >&2
  exit 1
fi
