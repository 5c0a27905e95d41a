#!/usr/bin/env bash
# The crash-point fuzzers (issue 47) for longer than a test run: deepio.kv's power-loss fuzzer
# (KvCrash.FuzzedPowerLossLosesNothingAcknowledged, tests/cpp/test_kv_crash_fuzz.cpp) in rounds
# of fresh seeds until --points crash points ran or --hours passed, then the Python saves'
# (tests/python/test_power_loss.py: deepio.save, safetensors, deepio.dcp) with
# --python-points points per save, then with --shared-points N the shared store's multi-process
# SIGKILL checks (tests/python/test_kv_shared_crash.py, issue 48) for N kill points. A failure
# prints its seed (DEEPIO_CRASH_SEED=<seed> DEEPIO_CRASH_POINTS=1 replays it;
# DEEPIO_SHARED_CRASH_SEED=<seed> a shared kill point) and ends the run with status 1.
#
#   scripts/crash-fuzz.sh                      # 1000 kv points, 40 per Python save
#   scripts/crash-fuzz.sh --points 20000       # the issue's figure (docs/testing.md)
#   scripts/crash-fuzz.sh --hours 8 --points 0 # for a night: rounds until the time is up
#   scripts/crash-fuzz.sh --points 0 --python-points 0 --shared-points 200  # only the shared store
#
# Needs the test programs built (cmake --build --preset ci) and the package installed with
# the test hooks (scripts/test.sh does both); --build names another build folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
points=1000 hours=0 python_points=40 shared_points=0 build="$root/build/ci"
while [ $# -gt 0 ]; do
  case "$1" in
    --points) points=$2; shift 2 ;;
    --hours) hours=$2; shift 2 ;;
    --python-points) python_points=$2; shift 2 ;;
    --shared-points) shared_points=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "crash-fuzz: unknown argument $1" >&2; exit 2 ;;
  esac
done
bin="$build/tests/cpp/deepio_tests"
if [ "$points" -gt 0 ] || [ "$hours" != 0 ]; then
  [ -x "$bin" ] || { echo "crash-fuzz: $bin not built (cmake --build --preset ci)" >&2; exit 2; }
fi
end=$(( $(date +%s) + $(awk -v h="$hours" 'BEGIN { printf "%d", h * 3600 }') ))
ran=0 round=500
start=$(date +%s)
while :; do
  now=$(date +%s)
  if [ "$points" -gt 0 ] && [ "$ran" -ge "$points" ] && [ "$now" -ge "$end" ]; then break; fi
  if [ "$points" -eq 0 ] && [ "$now" -ge "$end" ]; then break; fi
  n=$round
  if [ "$points" -gt 0 ] && [ "$now" -ge "$end" ] && [ $((points - ran)) -lt "$n" ]; then n=$((points - ran)); fi
  # From the build folder: the tests make their temporary folders under it (test-tmp).
  if ! out=$(cd "$build" && DEEPIO_CRASH_POINTS=$n "$bin" --gtest_filter='KvCrash.Fuzz*' 2>&1); then
    echo "$out" | grep -E "seed|Which is|Failure" >&2
    echo "crash-fuzz: FAILED after $ran kv crash points" >&2
    exit 1
  fi
  echo "$out" | grep "crash points from" || true
  ran=$((ran + n))
done
echo "crash-fuzz: $ran kv crash points passed in $(( $(date +%s) - start )) s"
if [ "$python_points" -gt 0 ]; then
  (cd "$root/tests" && DEEPIO_CRASH_POINTS=$python_points python3 -m pytest -q -p no:cacheprovider -s -W ignore \
    python/test_power_loss.py) | grep -E "power loss|passed|failed"
fi
if [ "$shared_points" -gt 0 ]; then
  (cd "$root/tests" && DEEPIO_SHARED_CRASH_POINTS=$shared_points python3 -m pytest -q -p no:cacheprovider -s -W ignore \
    python/test_kv_shared_crash.py -k test_many_kill_points) | grep -E "shared store:|^E |passed|failed"
fi
