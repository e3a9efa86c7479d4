#!/usr/bin/env bash
# README command (2): set up, build and run every test (CTest + GoogleTest),
# then the parser suites (extxyz, manifest, checkpoint store, archive guard)
# again under AddressSanitizer + UndefinedBehaviorSanitizer (issue 8).
# The whole suite under sanitizers is `bash scripts/test_sanitizers.sh`
# (about 25 more minutes on 2 cores); CRUCIBLE_SANITIZE_TESTS=full runs that
# here instead, =off skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
case "${CRUCIBLE_SANITIZE_TESTS:-quick}" in
  full) bash scripts/test_sanitizers.sh ;;
  off) ;;
  *) bash scripts/test_sanitizers.sh --quick ;;
esac
