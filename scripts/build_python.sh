#!/bin/bash
# Builds the crucible Python module (crucible.train, hooks, the ASE
# calculator) against the torch of the Python that will import it (issue 49):
# Debian's python3-torch (LibTorch 1.13, the default build's), or a virtual
# environment's PyTorch 2.x (CPU or CUDA). Only the module and the libraries
# it links are built.
#
#   PYTHON=/path/to/venv/bin/python bash scripts/build_python.sh [BUILD_DIR]
#   PYTHONPATH=BUILD_DIR/python $PYTHON -c "import crucible"
#
# Needs the Debian packages of scripts/setup.sh (CMake, Ninja, pybind11,
# yaml-cpp, ...) and, for that Python, its development headers.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/usr/bin/python3}
BUILD=${1:-build-python}
PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__)')
echo "crucible: building the Python module for $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])') with torch $TORCH_VERSION ($PREFIX)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PREFIX" -DPython3_EXECUTABLE="$(command -v "$PY")" -DCRUCIBLE_PYTHON="$(command -v "$PY")" \
  -DCRUCIBLE_BUILD_TESTS=OFF -DCRUCIBLE_BUILD_BENCH=OFF -DCRUCIBLE_BUILD_KIM=OFF
cmake --build "$BUILD" --target _crucible crucible
echo "crucible: done; use it with PYTHONPATH=$BUILD/python $PY"
