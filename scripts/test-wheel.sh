#!/usr/bin/env bash
# Installs a built wheel the way a user does and tests it:
#
#   bash scripts/test-wheel.sh [dist/deepio-*.whl]      (scripts/build-wheel.sh --test calls it)
#
#  * a fresh virtual environment (build/wheel/test-venv), the wheel installed with
#    `pip install --no-index --only-binary=:all:`: nothing is compiled, nothing comes from the
#    source tree or a build folder (the tests run from tests/, and the check below fails when
#    `deepio` is imported from anywhere but the environment);
#  * the test dependencies (pytest, torch, numpy, safetensors, DeepSpeed, ...) come from the
#    interpreter's own site-packages (--system-site-packages; scripts/setup.sh installs them),
#    where a source build of deepio may also be installed: the environment's copy comes first;
#  * what runs: the wheel smoke set, the tests marked `wheel` (what packaging can break: import,
#    version, backends compiled and refused, the CLI, a file round trip, fork, the default engine,
#    a dcp and a safetensors round trip, the message of deepio.comm without MPI). The whole
#    suite runs too when the packaging files (below) differ from those the whole suite last
#    passed against, recorded in scripts/wheel-tested.sha256, or when DEEPIO_WHEEL_FULL=1;
#    after it passes the script prints the line to record;
#  * DEEPIO_WHEEL_PYTEST_ARGS (words, relative to tests/) replace pytest's arguments instead,
#    e.g. "-x python/test_cli.py";
#  * the wheel has no fault-injection hooks and no MPI module: the tests that need them skip,
#    with their reason, and a missing torch/numpy/safetensors/hypothesis/DeepSpeed fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PYTHON:-python3}
wheel=${1:-$(ls dist/deepio-*manylinux*_"$(uname -m)".whl 2>/dev/null | head -1)}
[ -f "$wheel" ] || { echo "test-wheel.sh: no wheel (run scripts/build-wheel.sh first)" >&2; exit 1; }
wheel=$(realpath "$wheel")
venv=$root/build/wheel/test-venv

step() { printf '\n==== wheel test: %s ====\n' "$*"; }

step "fresh environment, $(basename "$wheel") installed from the file alone"
rm -rf "$venv"
"$py" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --only-binary=:all: \
  --no-deps --ignore-installed "$wheel"

step "what is installed"
(cd /tmp && "$venv/bin/python" - "$venv" "$wheel" <<'EOF'
import importlib.metadata as md
import os
import sys

venv, wheel = sys.argv[1], os.path.basename(sys.argv[2])
import deepio
from deepio import _deepio

where = os.path.realpath(deepio.__file__)
assert where.startswith(os.path.realpath(venv) + os.sep), f"deepio imported from {where}, not from {venv}"
assert not hasattr(_deepio, "_set_fault"), "the wheel carries the test hooks"
assert wheel.startswith(f"deepio-{deepio.__version__}-"), (wheel, deepio.__version__)
assert md.version("deepio") == deepio.__version__, (md.version("deepio"), deepio.__version__)
# liburing and libaio are linked in: every backend is compiled, whatever this machine allows.
backends = {b["name"]: b for b in deepio.info()["backends"]}
assert all(backends[n]["compiled"] for n in ("io_uring", "libaio", "threads")), backends
print(f"deepio {deepio.__version__} from {os.path.dirname(where)}; auto backend {deepio.info()['auto_backend']}")
EOF
)
"$venv/bin/deepio" --version
"$venv/bin/deepio" info | sed -n '/^backends/,/^$/p'

# What decides how the wheel is built and what it holds.
packaging_files() {
  git ls-files -- pyproject.toml CMakeLists.txt CMakePresets.json 'cmake/*' '*/CMakeLists.txt' \
    python/deepio-deepspeed.pth python/stubgen-patterns.txt scripts/build-wheel.sh scripts/test-wheel.sh \
    scripts/setup.sh | grep -v '^tests/' | LC_ALL=C sort
}
packaging_hash() { packaging_files | xargs sha256sum | sha256sum | cut -d' ' -f1; }
recorded=$(cat scripts/wheel-tested.sha256 2>/dev/null || true)
current=$(packaging_hash)

# The `deepio` command is the wheel's (DEEPIO_CLI, and first on PATH for the tests' children).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
wheel_pytest() {
  (cd tests && PATH="$venv/bin:$PATH" DEEPIO_CLI="$venv/bin/deepio" \
    DEEPIO_REQUIRE=torch,numpy,safetensors,hypothesis,deepspeed \
    "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$@")
}
if [ -n "${DEEPIO_WHEEL_PYTEST_ARGS:-}" ]; then
  step "pytest against the installed wheel: $DEEPIO_WHEEL_PYTEST_ARGS"
  # shellcheck disable=SC2086  # words, as documented
  wheel_pytest $DEEPIO_WHEEL_PYTEST_ARGS
  exit 0
fi
step "the wheel smoke set (pytest -m wheel) against the installed wheel"
wheel_pytest -m wheel python
if [ "${DEEPIO_WHEEL_FULL:-0}" = 1 ] || [ "$current" != "$recorded" ]; then
  why="DEEPIO_WHEEL_FULL=1"
  [ "$current" != "$recorded" ] && why="packaging files changed since scripts/wheel-tested.sha256"
  step "the whole suite against the installed wheel ($why)"
  # As scripts/test.sh runs it: two files at a time, the tests marked machine alone.
  wheel_pytest -m "not machine" -n "$(nproc)" --dist loadfile python
  wheel_pytest -m machine python
  if [ "$current" != "$recorded" ]; then
    echo "test-wheel.sh: the whole suite passed against this wheel; record it with:"
    echo "    echo $current > scripts/wheel-tested.sha256"
  fi
fi
