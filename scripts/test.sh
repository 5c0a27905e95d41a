#!/usr/bin/env bash
# Everything CI checks, from a fresh clone: install what is missing, build with warnings as
# errors, run the GoogleTest/CTest suites (unit, cli, mpi), the same engine suite under
# ASan+UBSan and under TSan, then install the Python package (with its test hooks) and
# DeepSpeed (pinned, the real client), run pytest, then ruff and mypy; last, build the binary
# wheel and run pytest again against it, installed in a fresh environment (docs/install.md).
# Usage: scripts/test.sh [--quick]   (--quick skips the sanitizer builds)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
# mpirun refuses root without these; tests run as root on the CI machines.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

step() { printf '\n==== %s ====\n' "$*"; }

step "setup"
bash scripts/setup.sh

step "C++ format (clang-format)"
bash scripts/check-format.sh

step "build (warnings are errors)"
cmake --preset ci >/dev/null
cmake --build --preset ci

step "C++ tests"
ctest --preset ci --timeout 600

step "installed C++ package (examples/downstream via find_package)"
bash scripts/check-install.sh

if [ "$quick" -eq 0 ]; then
  for san in asan tsan; do
    step "engine, GPU-shim and comm tests under $san"
    cmake --preset "$san" -DDEEPIO_BUILD_TOOLS=OFF >/dev/null
    cmake --build --preset "$san" --target deepio_tests deepio_cuda_staging_tests deepio_gpu_tests \
      test_comm_mpi test_comm_kernels
    ctest --preset "$san" -L 'unit|gpu|mpi' --timeout 1200
  done
fi

if [ -f pyproject.toml ]; then
  step "Python package"
  python3 -m pip install -q --no-build-isolation -Cbuild-dir=build/py -Ccmake.define.DEEPIO_TEST_HOOKS=ON .
  step "DeepSpeed from PyPI (the real client of tests/python/test_deepspeed.py; ops not built)"
  # Pinned: its swappers and checkpoint writer are what the tests drive. Built against the
  # installed torch (no build isolation), with no op compiled (deepio serves them).
  ds_version=0.19.8
  if [ "$(python3 -m pip show deepspeed 2>/dev/null | sed -n 's/^Version: //p')" != "$ds_version" ]; then
    DS_BUILD_OPS=0 python3 -m pip install -q --no-build-isolation "deepspeed==$ds_version"
  fi
  step "pytest"
  # Run from tests/ so the installed package is imported, not the source folder. DEEPIO_REQUIRE:
  # a missing optional package (setup.sh installs them all) fails its tests instead of skipping.
  (cd tests && DEEPIO_REQUIRE=torch,numpy,safetensors,hypothesis,deepspeed \
    python3 -m pytest -q -p no:cacheprovider python)
  step "lint (ruff, mypy)"
  bash scripts/lint.sh
  step "binary wheel: built, checked by auditwheel, installed as a user would, pytest against it"
  bash scripts/build-wheel.sh --test
fi
