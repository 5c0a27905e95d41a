#!/usr/bin/env bash
# Installs what deepio needs on a fresh Debian 12 machine: the toolchain and optional native
# libraries from Debian, the Python build and test dependencies from PyPI. Idempotent: packages
# already present are skipped, so CI and the README commands can call it every time.
#
#   bash scripts/setup.sh                   everything, the inference engines of deepio.kv's
#                                           backends included (scripts/test.sh: their tests need them)
#   bash scripts/setup.sh --no-kv-engines   all but those engines (scripts/main.sh: building and
#                                           measuring the disk needs none of them)
set -euo pipefail
kv_engines=1
case "${1:-}" in
  "") ;;
  --no-kv-engines) kv_engines=0 ;;
  *) echo "setup.sh: unknown argument '$1' (--no-kv-engines)" >&2; exit 2 ;;
esac

apt_pkgs=(build-essential cmake ninja-build pkg-config
          liburing-dev libaio-dev libgtest-dev libgmock-dev libbenchmark-dev
          libopenmpi-dev openmpi-bin fio iproute2 clang-format ccache)
bash "$(dirname "$0")/apt-missing.sh" "${apt_pkgs[@]}"

py=${PYTHON:-python3}
# Pinned: nanobind (its stub generator's output is compared with python/deepio/*.pyi by
# tests/python/test_stubs.py), ruff and mypy (new releases bring new findings; scripts/lint.sh).
pip_pkgs=("nanobind==3.1.0" scikit-build-core numpy pytest "pytest-xdist==3.8.0" hypothesis mpi4py "torch==2.13.0"
          "ruff==0.17.6" "mypy==2.4.1" "safetensors==0.8.0" zlib-ng)
need=()
for p in "${pip_pkgs[@]}"; do
  name=${p%%=*}
  "$py" -m pip show -q "$name" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  "$py" -m pip install -q "${need[@]}"
fi

# The inference engines whose storage interfaces deepio.kv's backends plug into, installed
# without their CUDA dependencies: tests/python/test_kv_backends.py drives their interface classes.
if [ "$kv_engines" -eq 1 ]; then
  PYTHON="$py" bash "$(dirname "$0")/setup-kv-engines.sh"
fi
