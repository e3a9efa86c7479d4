#!/usr/bin/env bash
# Installs every Debian package Crucible needs to build, run and test.
# Idempotent: packages already installed are skipped by apt-get.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev               # LibTorch 1.13 (CPU)
  libopenblas0-openmp        # fast BLAS (the default reference BLAS is ~28x slower)
  libgoogle-perftools-dev    # tcmalloc_minimal, the executables' malloc (glibc's cost ~9% of a bf16 training step)
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libssl-dev                 # OpenSSL libcrypto: SHA-256 of checkpoint files
  libsqlite3-dev             # ASE databases (.db), issue 18
  libgloo-dev                # Gloo headers for c10d ProcessGroupGloo (data-parallel training)
  python3 python3-ase python3-torch python3-numpy python3-scipy python3-sympy   # test oracles
  pybind11-dev python3-dev   # the crucible Python module and its ASE calculator (issue 17)
  python3-matplotlib   # examples/python_training.py plots its learning curve (issue 49)
  lammps libkim-api-dev      # LAMMPS through a KIM portable model (issue 17; docs/deployment_kim.md)
  clang libclang-rt-14-dev llvm   # libFuzzer targets (scripts/fuzz.sh), llvm-symbolizer for sanitizer reports
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all ${#PACKAGES[@]} packages present"
