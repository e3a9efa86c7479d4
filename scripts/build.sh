#!/usr/bin/env bash
# Installs dependencies (scripts/setup.sh) and builds Crucible into ./build.
# With arguments, builds only those targets (README command (1) builds the
# CLI and the Python module: `bash scripts/build.sh crucible _crucible`);
# without, everything (tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
if [ "$#" -gt 0 ]; then
  cmake --build build --target "$@" -- -j"$(nproc)"
else
  cmake --build build -- -j"$(nproc)"
fi
