#!/usr/bin/env bash
# Regenerates configs/default.yaml and the key table of docs/config.md from
# the config schema (tests/cli/config_test.cpp checks both are current).
# Usage: bash scripts/regen_config_docs.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-build}/crucible"
"$bin" config --dump-default > configs/default.yaml
table="$("$bin" config --markdown)"
/usr/bin/python3 - "$table" <<'PY'
import sys
table = sys.argv[1].rstrip("\n") + "\n"
path = "docs/config.md"
text = open(path, encoding="utf-8").read()
begin, end = "<!-- BEGIN GENERATED TABLE -->\n", "<!-- END GENERATED TABLE -->"
a = text.index(begin) + len(begin)
b = text.index(end)
open(path, "w", encoding="utf-8").write(text[:a] + table + text[b:])
PY
