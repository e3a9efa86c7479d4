#!/usr/bin/env bash
# README command (1): set up, build, train SchNet on the bundled TiAl DFT data,
# then evaluate the trained model on the bundled file.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh crucible _crucible  # the CLI and the Python module only (issue 47)
./build/crucible train output.run_dir=runs/default output.overwrite=true "$@"
./build/crucible evaluate --model runs/default --data data/alloy_TiAl/TiAl_tutorial.xyz
