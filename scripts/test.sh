#!/usr/bin/env bash
# README command (2): set up, build and run every test (CTest + GoogleTest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
