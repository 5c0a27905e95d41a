#!/usr/bin/env bash
# The README's test command, at two levels (docs/testing.md has the stages, their budgets and the
# times measured on a fresh 2-core machine):
#
#   bash scripts/test.sh          what shows deepio works, in <= 15 minutes after setup: the
#                                 optimized build (warnings are errors), the C++ suites (unit, the
#                                 fake GPU drivers, tools, CLI, MPI) two at a time, the installed C++
#                                 package, the Python package with its test hooks and DeepSpeed from
#                                 PyPI, pytest without the tests marked slow, ruff and mypy
#   bash scripts/test.sh --full   what CI runs (.ci/run), <= 45 minutes: all of the above, then the
#                                 tests marked slow, the engine, GPU-shim and comm suites under
#                                 ASan+UBSan and under TSan, scripts/gpu-check.sh in fake mode as
#                                 documented, and the binary wheel with its smoke set
#                                 (scripts/test-wheel.sh; the whole suite when packaging changed);
#                                 aarch64 without Arm hardware: every C++ target cross-compiled, the
#                                 CRC tests and the aarch64 wheel's smoke set under qemu-user
#
# Each configuration is compiled once: ccache (build/ccache, made afresh in a fresh clone) gives
# the Python package's build the objects the C++ build made with the same flags, and the sanitizer
# builds compile only the test programs they run. Every stage's output is also in
# build/test-logs/<stage>.log. The run ends with a table of each stage's time against its budget;
# a stage more than 25% over budget prints a warning naming its slowest tests (the run still
# passes: the warning is for the change that made it slow).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
full=0
case "${1:-}" in
  "") ;;
  --full) full=1 ;;
  -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
  *) echo "test.sh: unknown argument '$1' (--full, --help)" >&2; exit 2 ;;
esac

jobs=$(nproc)
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$jobs}
# mpirun refuses root without these; tests run as root on the CI machines.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
logs=$root/build/test-logs
mkdir -p "$logs"

# name budget(s) seconds status, one line per stage run so far
stages=()
run_start=$SECONDS

# The slowest tests of a stage's log: pytest's --durations lines, or CTest's per-test times.
slowest() {
  local log=$1
  {
    grep -E '^[0-9.]+s (call|setup|teardown) ' "$log" || true
    grep -E 'Test +#[0-9]+: ' "$log" | sed -E 's/.*Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec.*/\2s \1/' || true
  } | sort -rn | head -8 | sed 's/^/      /'
}

table() {
  local rc=$?
  local total=$((SECONDS - run_start)) line name budget took status warned=()
  printf '\n==== stages (%s) ====\n' "$([ "$full" -eq 1 ] && echo "--full" || echo "default")"
  printf '%-34s %8s %8s  %s\n' stage seconds budget result
  for line in "${stages[@]}"; do
    read -r name budget took status <<<"$line"
    printf '%-34s %8s %8s  %s\n' "$name" "$took" "$budget" "$status"
    if [ "$took" -gt $((budget * 5 / 4)) ]; then warned+=("$name"); fi
  done
  local limit=900
  [ "$full" -eq 1 ] && limit=2700
  printf '%-34s %8s %8s\n' total "$total" "$limit"
  for name in "${warned[@]}"; do
    for line in "${stages[@]}"; do
      read -r n budget took status <<<"$line"
      [ "$n" = "$name" ] || continue
      echo "WARNING: stage '$name' took ${took}s, more than 25% over its budget of ${budget}s; slowest:"
      slowest "$logs/$name.log"
    done
  done
  if [ "$total" -gt "$limit" ]; then
    echo "WARNING: the whole run took ${total}s, over its ${limit}s limit (docs/testing.md)"
  fi
  exit "$rc"
}
trap table EXIT

# stage NAME BUDGET COMMAND...: runs COMMAND, its output to the terminal and build/test-logs/NAME.log.
# COMMAND runs in a subshell with errexit of its own: a failing command inside a stage function
# fails the stage (in the condition of `||` bash would ignore errexit in the whole function).
stage() {
  local name=$1 budget=$2 t0=$SECONDS rc=0
  shift 2
  printf '\n==== %s ====\n' "$name"
  set +e
  (
    set -e
    "$@"
  ) 2>&1 | tee "$logs/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  stages+=("$name $budget $((SECONDS - t0)) $([ "$rc" -eq 0 ] && echo ok || echo "FAILED($rc)")")
  return "$rc"
}

stage setup 120 bash scripts/setup.sh

# Compile once per configuration (after setup, which installs ccache).
export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
export CCACHE_DIR=${CCACHE_DIR:-$root/build/ccache} CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-4G}
# One compiler name for every build: CMake alone picks c++, scikit-build-core g++, and ccache keys
# on the name.
export CC=${CC:-gcc} CXX=${CXX:-g++}
ccache --zero-stats >/dev/null

stage format 30 bash scripts/check-format.sh

build() {
  cmake --preset ci >/dev/null
  cmake --build --preset ci
}
stage build 420 build

# Two at a time: the tests that need the whole machine (MPI ranks, huge pages, fio ceilings) hold
# CTest's resource lock or PROCESSORS (tests/*/CMakeLists.txt) and run alone.
stage ctest 150 ctest --preset ci --timeout 600 -j "$jobs"

stage cxx-package 60 bash scripts/check-install.sh

python_package() {
  # RelWithDebInfo with warnings as errors: the C++ build's flags, so ccache serves its objects.
  python3 -m pip install -q --no-build-isolation -Cbuild-dir=build/py -Ccmake.build-type=RelWithDebInfo \
    -Ccmake.define.DEEPIO_WERROR=ON -Ccmake.define.DEEPIO_TEST_HOOKS=ON .
  # DeepSpeed, the real client of tests/python/test_deepspeed.py. Pinned: its swappers and
  # checkpoint writer are what the tests drive. Built against the installed torch (no build
  # isolation), with no op compiled (deepio serves them).
  local ds_version=0.19.8
  if [ "$(python3 -m pip show deepspeed 2>/dev/null | sed -n 's/^Version: //p')" != "$ds_version" ]; then
    DS_BUILD_OPS=0 python3 -m pip install -q --no-build-isolation "deepspeed==$ds_version"
  fi
  ccache --show-stats | grep -E 'Hits|Misses' || true
}
stage python-package 150 python_package

# Run from tests/ so the installed package is imported, not the source folder. DEEPIO_REQUIRE: a
# missing optional package (setup.sh installs them all) fails its tests instead of skipping.
pytest_run() {
  (cd tests && DEEPIO_REQUIRE=torch,numpy,safetensors,hypothesis,deepspeed,sglang,lmcache,vllm \
    python3 -m pytest -q -p no:cacheprovider --durations=15 --durations-min=2 "$@" python)
}
# One file per worker at a time (pytest-xdist, --dist loadfile: a file's tests share fixtures and
# module state), then the tests marked machine (sysctls, huge pages, fio) alone.
pytest_default() {
  pytest_run -m "not slow and not machine" -n "$jobs" --dist loadfile
  pytest_run -m "machine and not slow"
}
stage pytest 300 pytest_default

stage lint 90 bash scripts/lint.sh

if [ "$full" -eq 1 ]; then
  # One at a time: these are the multi-rank and multi-process programs.
  stage pytest-slow 420 pytest_run -m slow

  # Only the test programs they run are built, at -O1 with line tables only (-g1): what the
  # sanitizers' own docs advise, and half the compile time of the presets' -O2 -g (the reports
  # still name files and lines).
  sanitized() {
    cmake --preset "$1" -DDEEPIO_BUILD_TOOLS=OFF -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" >/dev/null
    cmake --build --preset "$1" --target deepio_tests deepio_cuda_staging_tests deepio_gpu_tests \
      test_comm_mpi test_comm_kernels
    ctest --preset "$1" -L 'unit|gpu|mpi' --timeout 1200 -j "$jobs"
  }
  for san in asan tsan; do
    stage "$san" 600 sanitized "$san"
  done

  # As docs/gpu.md runs it, with nothing set but the fake mode: every step must pass.
  gpu_check() {
    env -u DEEPIO_GPU_CHECK_STEPS -u DEEPIO_GPU_CHECK_BUDGET -u DEEPIO_GPU_CHECK_TARGETS \
      -u DEEPIO_GPU_CHECK_STEP_SCALE DEEPIO_GPU_CHECK_FAKE=1 OUT="$root/build/gpu-check-out" \
      bash scripts/gpu-check.sh
  }
  stage gpu-check-fake 480 gpu_check

  # The crash-point fuzzers beyond the test runs' few points (issue 47; docs/testing.md).
  stage crash-fuzz 240 bash scripts/crash-fuzz.sh --points 2000 --python-points 16 --shared-points 16

  # aarch64 (Grace) without Arm hardware: every C++ target cross-compiled, the CRC-32C tests
  # under qemu-user.
  stage aarch64 480 bash scripts/cross-aarch64.sh

  stage wheel 600 bash scripts/build-wheel.sh --test

  # The aarch64 wheel, cross-built by Zig, its smoke set under qemu-user with Debian's arm64 Python.
  stage wheel-aarch64 420 bash scripts/build-wheel.sh --arch aarch64 --test
fi
