#!/usr/bin/env bash
# Builds Crucible against a CUDA LibTorch 2.x (python3's torch by default)
# and runs the CUDA tests, the CPU test suites and a short `crucible train`
# on the GPU in every precision. Not part of CI (CI machines have no GPU);
# run it on a machine with an NVIDIA GPU:
#
#   bash scripts/cuda_check.sh [LOG_DIR]
#
# Needs g++, cmake, ninja, a python3 with a CUDA torch, and the Debian
# development packages of scripts/setup.sh that the core needs
# (nlohmann-json, yaml-cpp, CLI11, fmt, GoogleTest, OpenSSL, SQLite, gloo
# headers). Where the machine lacks them and cannot install packages, unpack
# the .deb files into .devdeps/root (dpkg -x) and Gloo's headers into
# .devdeps/gloo_inc: they are searched first. The Python module, the KIM
# driver and the benchmarks are not built here; the Python-oracle tests
# (python3-ase) are not run.
#
# Environment: BUILD_TIMEOUT / CTEST_TIMEOUT (seconds, default 330 / 200),
# TARGETS (ninja targets to build; default all), STOP_AFTER_BUILD=1 (exit
# after the build, e.g. to run a debugger on a few targets).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:-build-cuda/logs}
mkdir -p "$LOG"
B=build-cuda
J=$(nproc)

{
  echo "== machine"; date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  g++ --version | head -1; cmake --version | head -1; ninja --version
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
} 2>&1 | tee "$LOG/machine.txt"

{ read -r TORCH_PREFIX; read -r TORCH_LIB; read -r TORCH_INC; } < <(python3 -c 'import torch, os
d = os.path.dirname(torch.__file__)
print(torch.utils.cmake_prefix_path, os.path.join(d, "lib"), os.path.join(d, "include"), sep="\n")')
PREFIX="$TORCH_PREFIX"
[ -d .devdeps/root/usr ] && PREFIX="$PWD/.devdeps/root/usr;$PREFIX"
EXTRA_FLAGS=""
[ ! -d "$TORCH_INC/gloo" ] && [ -d .devdeps/gloo_inc ] && EXTRA_FLAGS="-isystem $PWD/.devdeps/gloo_inc"
export LD_LIBRARY_PATH="$TORCH_LIB:$PWD/.devdeps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"

echo "== configure" | tee "$LOG/configure.txt"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DCMAKE_CXX_FLAGS="$EXTRA_FLAGS" -DCRUCIBLE_MALLOC=system -DCRUCIBLE_BUILD_PYTHON=OFF \
  -DCRUCIBLE_BUILD_KIM=OFF -DCRUCIBLE_BUILD_BENCH=OFF -DCRUCIBLE_PYTHON="$(command -v python3)" \
  -DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_CUDA_ARCHITECTURES=90 >>"$LOG/configure.txt" 2>&1
rc=$?; tail -5 "$LOG/configure.txt"; [ $rc -ne 0 ] && { tail -40 "$LOG/configure.txt"; exit 1; }

echo "== build (ninja -k 0: every error at once)"
timeout ${BUILD_TIMEOUT:-330} ninja -C $B -k 0 -j "$J" ${TARGETS:-} >"$LOG/build.txt" 2>&1
rc=$?; echo "build rc $rc"
grep -E "error|Error" "$LOG/build.txt" | grep -v "Werror" | head -40
[ $rc -ne 0 ] && exit 1
[ -n "${STOP_AFTER_BUILD:-}" ] && exit 0

echo "== CUDA tests"
(cd $B/tests && timeout 120 ./test_models --gtest_filter='CudaPath*' --gtest_color=no) 2>&1 | tee "$LOG/cuda_tests.txt" | tail -25

echo "== training on the GPU, every precision"
for p in 32-true bf16-mixed 16-mixed 64-true; do
  timeout 60 ./$B/crucible train training.device=cuda training.precision=$p training.num_steps=30 \
    training.num_epochs=null output.run_dir=$B/runs/$p output.overwrite=true >"$LOG/train_$p.txt" 2>&1
  echo "train $p rc $? | $(tail -2 "$LOG/train_$p.txt" | tr '\n' ' ' | cut -c1-300)"
done

echo "== CPU suites under this LibTorch"
(cd $B && timeout ${CTEST_TIMEOUT:-200} ctest -j "$J" --output-on-failure -E "python|lammps|data_readers|sigkill" \
  >"$LOG/ctest.txt" 2>&1; echo "ctest rc $?")
grep -E "tests passed|Failed|\*\*\*|FAILED" "$LOG/ctest.txt" | head -40

echo "== the Python module against this torch, and its training tests (issue 49)"
# The same build as scripts/build_python.sh, in this build tree.
cmake -S . -B $B -DCRUCIBLE_BUILD_PYTHON=ON >>"$LOG/configure.txt" 2>&1 &&
  timeout ${PY_BUILD_TIMEOUT:-240} ninja -C $B -j "$J" _crucible >"$LOG/python_build.txt" 2>&1
echo "python module build rc $?"; grep -E "error" "$LOG/python_build.txt" | head -20
timeout 120 python3 tests/python/test_training.py $B/python $B/python_training_work >"$LOG/python_training.txt" 2>&1
echo "python training tests rc $?"; grep -E "^(OK|FAILED|Ran)|Error|skipped" "$LOG/python_training.txt" | head -20
