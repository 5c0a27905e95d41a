#!/usr/bin/env bash
# deepio's GPU check, for a bare GPU machine with no package registry and no network
# (docs/gpu.md, "Checking on a GPU machine"; ../shared/GPU.md says what such a machine has).
# Run as ONE command in the repository root, with the .deb files from scripts/gpu-debs.sh in
# .gpu-debs/ and $OUT set:
#
#     OUT=/some/folder scripts/gpu-check.sh            # on the GPU machine
#     DEEPIO_GPU_CHECK_FAKE=1 scripts/gpu-check.sh     # anywhere: the fake drivers stand in
#     scripts/gpu-check.sh --dry-run                   # print the steps, run nothing
#
# Steps (each with its own `timeout`, all inside one time budget, 500 s by default, so the whole
# run ends inside 9 minutes): unpack the .debs, configure and build (RelWithDebInfo, MPI off;
# -Werror only in fake mode), probe the CUDA driver, the CUDA staging tests and `ctest -L gpu` on the
# real driver (and again with cuFile disabled, and with CUDA disabled), pip install with the
# test hooks, the GPU pytest files, the CUDA rows of the other pytest files (safetensors to
# cuda, the comm engines on CUDA tensors: with MPI where the machine has mpicc), the GPU
# file-access examples with --validate, bench/gpu_vs_host.py, and its read rows again with
# three staging sizes (DEEPIO_STAGING_BYTES). Each step's log is $OUT/<step>.log, packed at the
# end into $OUT/logs.tar.gz (the device tool brings back only a few files); $OUT/summary.txt
# has one line per step (PASS, FAIL, TIMEOUT or SKIP, seconds). Exit status 1 when any step
# did not pass.
# Where no GPU is present, the probe step fails in seconds with the loader's reason and the
# steps that need a GPU are skipped (and so counted as not passed): nothing waits on a device.
#
# Environment (all optional):
#   OUT                          where logs go (default build/gpu-check-out)
#   DEEPIO_GPU_CHECK_FAKE=1      use tests/gpu's fake CUDA driver and cuFile (as built here) as
#                                the GPU; steps that need torch on CUDA may skip instead of fail
#   DEEPIO_GPU_CHECK_BUILD       build folder (default build/gpu-check)
#   DEEPIO_GPU_CHECK_TARGETS     build only these targets (default: all; must include every
#                                program with a `gpu`-labelled CTest entry)
#   DEEPIO_GPU_CHECK_JOBS        build parallelism (default: nproc)
#   DEEPIO_GPU_CHECK_BUDGET      seconds for the whole run (default 500)
#   DEEPIO_GPU_CHECK_STEP_SCALE  multiplies every step's own limit (default 1; a 2-core machine: 4)
#   DEEPIO_GPU_CHECK_BENCH_SIZE  bytes per bench transfer (default 1 GiB; fake: 32 MiB)
#   DEEPIO_GPU_CHECK_ROUNDS      bench rounds (default 3; fake: 2)
#   DEEPIO_GPU_CHECK_EXAMPLE_MB  size of the examples' tensor in MiB (default 256; fake: 8)
#   DEEPIO_GPU_CHECK_WORK        scratch folder on the disk under test (default /var/tmp/deepio-gpu-check)
#   DEEPIO_GPU_CHECK_STEPS       run only these steps (space or comma separated; the steps they
#                                need are not added: name them too); the others are listed as
#                                "not selected" and do not fail the run
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD

dry_run=0
for a in "$@"; do
    case $a in
        --dry-run) dry_run=1 ;;
        -h | --help) sed -n '2,39p' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown argument '$a' (--dry-run, --help)" >&2; exit 2 ;;
    esac
done

FAKE=${DEEPIO_GPU_CHECK_FAKE:-0}
[[ $FAKE == 0 || $FAKE == 1 ]] || { echo "gpu-check: DEEPIO_GPU_CHECK_FAKE must be 0 or 1" >&2; exit 2; }
OUT=${OUT:-$ROOT/build/gpu-check-out}
B=${DEEPIO_GPU_CHECK_BUILD:-build/gpu-check}
JOBS=${DEEPIO_GPU_CHECK_JOBS:-$(nproc)}
BUDGET=${DEEPIO_GPU_CHECK_BUDGET:-500}
SCALE=${DEEPIO_GPU_CHECK_STEP_SCALE:-1}
[[ $BUDGET =~ ^[0-9]+$ && $SCALE =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check: budget and step scale must be whole numbers" >&2; exit 2; }
WORK=${DEEPIO_GPU_CHECK_WORK:-/var/tmp/deepio-gpu-check}
DEPS=$WORK/deps
SITE=$WORK/site
if [[ $FAKE == 1 ]]; then
    BENCH_SIZE=${DEEPIO_GPU_CHECK_BENCH_SIZE:-33554432}
    ROUNDS=${DEEPIO_GPU_CHECK_ROUNDS:-2}
    EXAMPLE_MB=${DEEPIO_GPU_CHECK_EXAMPLE_MB:-8}
    # The development machine's compiler: warnings are errors, as in every build there, and the
    # flags are the CI build's, so that ccache (scripts/test.sh) serves its objects.
    WERROR=ON
else
    BENCH_SIZE=${DEEPIO_GPU_CHECK_BENCH_SIZE:-1073741824}
    ROUNDS=${DEEPIO_GPU_CHECK_ROUNDS:-3}
    EXAMPLE_MB=${DEEPIO_GPU_CHECK_EXAMPLE_MB:-256}
    # Whatever compiler the GPU machine has: its warnings do not stop the check.
    WERROR=OFF
    # The real driver and libcufile, whatever the calling shell had set.
    unset DEEPIO_CUDA_LIBRARY DEEPIO_CUFILE_LIBRARY
fi
export ROOT FAKE OUT B JOBS WORK DEPS SITE BENCH_SIZE ROUNDS EXAMPLE_MB WERROR
export PYTHONDONTWRITEBYTECODE=1

# ---- the steps: one function each, run as `timeout N bash -c step_<name>` ----

step_deps() {
    shopt -s nullglob
    local debs=("$ROOT"/.gpu-debs/*.deb)
    if ((${#debs[@]} == 0)); then
        if pkg-config --exists liburing && [[ -f /usr/include/gtest/gtest.h && -f /usr/include/libaio.h ]]; then
            echo "no .gpu-debs/: liburing, libaio and GoogleTest are installed on this machine; using them"
            return 0
        fi
        echo "no .gpu-debs/*.deb and liburing/libaio/GoogleTest are not installed here."
        echo "Run scripts/gpu-debs.sh on the development machine and carry .gpu-debs along."
        return 1
    fi
    rm -rf "$DEPS" && mkdir -p "$DEPS" || return 1
    local f
    for f in "${debs[@]}"; do
        echo "unpack $(basename "$f")"
        dpkg -x "$f" "$DEPS" || return 1
    done
    ls "$DEPS/usr/include"
}

step_configure() {
    local launcher=()
    if command -v ccache >/dev/null; then
        launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    fi
    set -x
    cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPIO_WERROR="$WERROR" -DDEEPIO_WITH_MPI=OFF \
        -DDEEPIO_BUILD_TESTS=ON -DDEEPIO_BUILD_BENCH=ON "${launcher[@]}"
}

step_build() {
    local targets=()
    if [[ -n ${DEEPIO_GPU_CHECK_TARGETS:-} ]]; then
        read -r -a targets <<<"$DEEPIO_GPU_CHECK_TARGETS"
        targets=(--target "${targets[@]}")
    fi
    set -x
    cmake --build "$B" -j "$JOBS" "${targets[@]}"
}

# Loads the CUDA driver the way deepio does (DEEPIO_CUDA_LIBRARY or libcuda.so.1), cuInit,
# counts devices; fails in seconds with the reason where there is none.
step_probe() {
    if command -v nvidia-smi >/dev/null; then nvidia-smi -L; else echo "nvidia-smi: not installed"; fi
    python3 - <<'PY'
import ctypes, os, sys
lib = os.environ.get("DEEPIO_CUDA_LIBRARY") or "libcuda.so.1"
try:
    cu = ctypes.CDLL(lib)
except OSError as e:
    sys.exit(f"probe: no CUDA driver: cannot load {lib}: {e}")
r = cu.cuInit(0)
if r != 0:
    sys.exit(f"probe: cuInit(0) failed with CUresult {r} ({lib})")
n, v = ctypes.c_int(0), ctypes.c_int(0)
cu.cuDeviceGetCount(ctypes.byref(n))
cu.cuDriverGetVersion(ctypes.byref(v))
if n.value < 1:
    sys.exit(f"probe: {lib} loaded but reports no CUDA device")
print(f"probe: CUDA driver {lib}, version {v.value}, {n.value} device(s)")
cf = os.environ.get("DEEPIO_CUFILE_LIBRARY") or "libcufile.so.0"
try:
    ctypes.CDLL(cf)
    print(f"probe: cuFile library {cf} loads")
except OSError as e:
    print(f"probe: no cuFile library ({e}): gds_handle will stage")
print("probe: nvidia-fs loaded" if os.path.exists("/proc/driver/nvidia-fs") else "probe: nvidia-fs not loaded")
PY
}

step_staging() {
    set -x
    "$B/tests/cpp/deepio_cuda_staging_tests"
}

ctest_gpu() {
    # deepio_tests.gds is the conformance suite over the fake cuFile only: not run here.
    ctest --test-dir "$B" -L gpu -E "^(deepio_tests\.gds${1:-})\$" --output-on-failure --timeout 120 --no-tests=error
}
step_ctest_gpu() { set -x; ctest_gpu; }
# FakeEnv.* run whenever DEEPIO_CUDA_LIBRARY names the fake driver and expect the fake cuFile
# with it: with cuFile disabled they only apply to the fake mode's own setup.
step_ctest_nocufile() {
    set -x
    if [[ $FAKE == 1 ]]; then DEEPIO_CUFILE_LIBRARY=none ctest_gpu '|FakeEnv\..*'; else DEEPIO_CUFILE_LIBRARY=none ctest_gpu; fi
}
# Only the driver is disabled: cuFile stays as the machine has it (GpuAbsent.* check its reason).
step_ctest_nocuda() { set -x; env -u DEEPIO_CUFILE_LIBRARY DEEPIO_CUDA_LIBRARY=none bash -c ctest_gpu; }

step_pip() {
    rm -rf "$SITE"
    set -x
    python3 -m pip install --no-build-isolation --no-deps --no-index --target "$SITE" -Cbuild-dir="$B-py" \
        -Ccmake.build-type=RelWithDebInfo -Ccmake.define.DEEPIO_WITH_MPI=OFF -Ccmake.define.DEEPIO_WERROR="$WERROR" \
        -Ccmake.define.DEEPIO_TEST_HOOKS=ON "$ROOT"
}

# On the GPU machine a skipped GPU test is a failure: it means torch or deepio saw no GPU.
no_skips() {
    local log=$1
    if [[ $FAKE == 0 ]] && grep -Eq "$2" "$log"; then
        echo "gpu-check: tests skipped on a GPU machine (see above): counted as failed"
        return 1
    fi
}

step_pytest_gpu() {
    mkdir -p "$WORK/pytest"
    (cd "$ROOT/tests" && PYTHONPATH="$SITE" DEEPIO_TEST_DIR="$WORK/pytest" \
        python3 -m pytest -v -rs -p no:cacheprovider python/test_gpu_real.py python/test_gpu_real_hygiene.py) 2>&1 | tee "$WORK/pytest-gpu.out"
    local rc=${PIPESTATUS[0]}
    ((rc == 0)) && no_skips "$WORK/pytest-gpu.out" '(SKIPPED|[0-9]+ skipped)'
}

step_pytest_fake() {
    mkdir -p "$WORK/pytest"
    # The fake-driver and CLI GPU tests set their own driver variables; none leaks in from here.
    cd "$ROOT/tests" && env -u DEEPIO_CUDA_LIBRARY -u DEEPIO_CUFILE_LIBRARY PYTHONPATH="$SITE" \
        DEEPIO_TEST_DIR="$WORK/pytest" python3 -m pytest -v -rs -p no:cacheprovider \
        python/test_gpu_fake.py python/test_gpu_cli.py
}

step_examples() {
    local dir=$WORK/examples
    rm -rf "$dir" && mkdir -p "$dir/store" || return 1
    head -c $((EXAMPLE_MB << 20)) /dev/urandom >"$dir/data.bin" || return 1
    local rc=0
    (
        export PYTHONPATH="$SITE"
        set -x
        "$ROOT/examples/file_access/run_load_tensor.sh" "$dir/data.bin" --loop 2 --validate
        l=$?
        "$ROOT/examples/file_access/run_store_tensor.sh" "$dir/store" --mb_size "$EXAMPLE_MB" --loop 2 --validate
        exit $((l | $?))
    ) 2>&1 | tee "$WORK/examples.out"
    rc=${PIPESTATUS[0]}
    rm -rf "$dir"
    ((rc == 0)) && no_skips "$WORK/examples.out" 'skipped:'
}

# deepio with the comm library, where the machine can build it (mpicc): the CUDA rows of the
# comm tests need deepio.comm. Without mpicc this step passes with nothing built, and the
# pytest_cuda step lists those tests as skipped (with their reason).
step_pip_mpi() {
    rm -rf "$SITE-mpi"
    if ! command -v mpicc >/dev/null; then
        echo "no mpicc on this machine: deepio.comm not built; the comm tests will skip"
        return 0
    fi
    set -x
    python3 -m pip install --no-build-isolation --no-deps --no-index --target "$SITE-mpi" -Cbuild-dir="$B-py-mpi" \
        -Ccmake.build-type=RelWithDebInfo -Ccmake.define.DEEPIO_WITH_MPI=ON -Ccmake.define.DEEPIO_WERROR="$WERROR" \
        -Ccmake.define.DEEPIO_TEST_HOOKS=ON "$ROOT"
}

# The CUDA rows of the other test files: skips are allowed here (an MPI-less machine cannot run
# the comm ones) but every skip is listed with its reason (-rs) in the log.
step_pytest_cuda() {
    mkdir -p "$WORK/pytest"
    local site=$SITE
    [[ -d $SITE-mpi/deepio ]] && site=$SITE-mpi
    cd "$ROOT/tests" && PYTHONPATH="$site" DEEPIO_TEST_DIR="$WORK/pytest" python3 -m pytest -v -rs \
        -p no:cacheprovider python/test_safetensors_backends.py::test_load_to_gpu \
        python/test_comm_torchops.py -k "gpu or cuda or nccl"
}

step_bench() {
    local dir=$WORK/bench
    rm -rf "$dir" && mkdir -p "$dir" || return 1
    set -x
    PYTHONPATH="$SITE" python3 "$ROOT/bench/gpu_vs_host.py" --bench "$B/bench/gpu_bench" --dir "$dir" \
        --size "$BENCH_SIZE" --rounds "$ROUNDS" --allow-flagged --json "$OUT/bench.json"
    local rc=$?
    rm -rf "$dir"
    return $rc
}

# The staged device read with 16 MiB (the default), 32 MiB and 64 MiB of staging per worker,
# interleaved with the other read rows.
step_bench_staging() {
    local dir=$WORK/bench
    rm -rf "$dir" && mkdir -p "$dir" || return 1
    set -x
    PYTHONPATH="$SITE" python3 "$ROOT/bench/gpu_vs_host.py" --bench "$B/bench/gpu_bench" --dir "$dir" \
        --size "$BENCH_SIZE" --rounds "$ROUNDS" --ops read --staging 32M,64M --allow-flagged \
        --json "$OUT/bench-staging.json"
    local rc=$?
    rm -rf "$dir"
    return $rc
}

export -f step_deps step_configure step_build step_probe step_staging ctest_gpu step_ctest_gpu \
    step_ctest_nocufile step_ctest_nocuda step_pip no_skips step_pytest_gpu step_pytest_fake step_examples step_bench \
    step_pip_mpi step_pytest_cuda step_bench_staging

# name, most seconds, the steps it needs (comma-separated; "-" none), what it runs
PROBE_NEEDS=-
[[ $FAKE == 1 ]] && PROBE_NEEDS=build  # the fake driver is built here
STEPS=(
    "deps 30 - unpack .gpu-debs/*.deb into $DEPS"
    "configure 60 deps cmake -S . -B $B RelWithDebInfo, DEEPIO_WERROR=$WERROR, MPI off"
    "build 200 configure cmake --build $B -j $JOBS ${DEEPIO_GPU_CHECK_TARGETS:-(all targets)}"
    "probe 20 $PROBE_NEEDS load the CUDA driver, cuInit, count devices"
    "staging 60 build,probe $B/tests/cpp/deepio_cuda_staging_tests (real driver)"
    "ctest_gpu 90 build,probe ctest -L gpu -E ^deepio_tests.gds\$"
    "ctest_nocufile 60 build,probe DEEPIO_CUFILE_LIBRARY=none ctest -L gpu"
    "pip 150 deps pip install --target $SITE with DEEPIO_TEST_HOOKS=ON"
    "pytest_gpu 90 probe,pip pytest tests/python/test_gpu_real.py test_gpu_real_hygiene.py (no skips allowed on a GPU)"
    "examples 120 probe,pip examples/file_access run_load_tensor.sh/run_store_tensor.sh --validate (${EXAMPLE_MB} MiB)"
    "bench 200 build,probe bench/gpu_vs_host.py --size $BENCH_SIZE --rounds $ROUNDS"
    "bench_staging 150 build,probe bench/gpu_vs_host.py --ops read --staging 32M,64M"
    "pytest_fake 90 pip pytest tests/python/test_gpu_fake.py test_gpu_cli.py"
    "ctest_nocuda 60 build DEEPIO_CUDA_LIBRARY=none ctest -L gpu (absence on a GPU machine)"
    "pip_mpi 120 deps pip install --target $SITE-mpi with MPI (only where mpicc exists)"
    "pytest_cuda 120 probe,pip,pip_mpi pytest the CUDA rows of test_safetensors_backends.py, test_comm_torchops.py"
)

if ((dry_run)); then
    echo "gpu-check (dry run): mode $([[ $FAKE == 1 ]] && echo fake || echo real), budget ${BUDGET}s, OUT=$OUT, build $B"
    for s in "${STEPS[@]}"; do
        read -r name max needs what <<<"$s"
        printf '  %-15s <=%4ss  needs %-12s %s\n' "$name" "$((max * SCALE))" "$needs" "$what"
    done
    exit 0
fi

mkdir -p "$OUT" "$WORK" || exit 1
SUMMARY=$OUT/summary.txt
start=$SECONDS
declare -A result
failed=0
head_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
{
    echo "deepio gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) head $head_rev mode $([[ $FAKE == 1 ]] && echo fake || echo real)"
    echo "host $(hostname) $(nproc) cores; budget ${BUDGET}s; build $B; scratch $WORK"
    printf '%-15s %-8s %6s  %s\n' step result seconds detail
} >"$SUMMARY"

ok() { [[ ${result[$1]:-} == PASS ]]; }

# The fake mode's GPU: the fake driver and cuFile the build step makes (paths set now; the
# steps that load them run after the build).
if [[ $FAKE == 1 ]]; then
    fake_dir=$ROOT/$B/tests/gpu
    [[ $B == /* ]] && fake_dir=$B/tests/gpu
    export DEEPIO_CUDA_LIBRARY=$fake_dir/libdeepio_fake_cuda.so DEEPIO_CUFILE_LIBRARY=$fake_dir/libdeepio_fake_cufile.so
fi

steps_wanted=${DEEPIO_GPU_CHECK_STEPS:-}
selected=" ${steps_wanted//,/ } "
not_selected=0
for s in "${STEPS[@]}"; do
    read -r name max needs what <<<"$s"
    log=$OUT/$name.log
    skip=""
    if [[ -n ${DEEPIO_GPU_CHECK_STEPS:-} && $selected != *" $name "* ]]; then
        result[$name]=PASS  # not run, and not holding back the steps that need it
        printf '%-15s %-8s %6s  %s\n' "$name" - 0 "not selected (DEEPIO_GPU_CHECK_STEPS)" >>"$SUMMARY"
        not_selected=$((not_selected + 1))
        continue
    fi
    IFS=, read -r -a wants <<<"$needs"
    for w in "${wants[@]}"; do
        [[ $w == - ]] || ok "$w" || { skip="$w did not pass"; break; }
    done
    [[ $skip == "probe did not pass" ]] && skip="no usable GPU (probe did not pass)"
    max=$((max * SCALE))
    left=$((BUDGET - (SECONDS - start) - 5))
    t=$((max < left ? max : left))
    if [[ -z $skip ]] && ((t < 5)); then skip="out of time (budget ${BUDGET}s)"; fi
    if [[ -n $skip ]]; then
        result[$name]=SKIP
        echo "SKIP: $skip" >"$log"
        printf '%-15s %-8s %6s  %s\n' "$name" SKIP 0 "$skip" >>"$SUMMARY"
        echo "gpu-check: $name SKIP ($skip)"
        failed=$((failed + 1))
        continue
    fi
    echo "gpu-check: $name (at most ${t}s): $what"
    t0=$SECONDS
    {
        echo "# $name: $what"
        echo "# $(date -u +%H:%M:%SZ), timeout ${t}s"
    } >"$log"
    timeout -k 10 "$t" bash -c "step_$name" >>"$log" 2>&1 </dev/null
    rc=$?
    dt=$((SECONDS - t0))
    if ((rc == 0)); then
        r=PASS detail=""
    elif ((rc == 124 || rc == 137)); then
        r=TIMEOUT detail="killed after ${t}s"
    else
        r=FAIL detail="exit $rc: $(grep -v '^[+#]' "$log" | grep -v '^$' | tail -1 | cut -c1-150)"
    fi
    [[ $name == bench && $r == PASS ]] && detail="$(grep -c '^FLAGGED' "$log") row(s) flagged"
    [[ $name == probe && $r == PASS ]] && detail="$(grep -m1 'probe: CUDA driver' "$log" | cut -c8-)"
    result[$name]=$r
    [[ $r == PASS ]] || failed=$((failed + 1))
    printf '%-15s %-8s %6s  %s\n' "$name" "$r" "$dt" "$detail" >>"$SUMMARY"
    echo "gpu-check: $name $r ${dt}s $detail"
    # The steps that follow the build run on what it made; the fake mode's GPU is built here.
    if [[ $name == deps && $r == PASS && -d $DEPS/usr ]]; then
        arch=$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
        export CMAKE_PREFIX_PATH=$DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
        export CPATH=$DEPS/usr/include${CPATH:+:$CPATH}
        export LIBRARY_PATH=$DEPS/usr/lib/$arch${LIBRARY_PATH:+:$LIBRARY_PATH}
        export LD_LIBRARY_PATH=$DEPS/usr/lib/$arch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export PKG_CONFIG_PATH=$DEPS/usr/lib/$arch/pkgconfig PKG_CONFIG_SYSROOT_DIR=$DEPS
    fi
done

total=$((SECONDS - start))
ran=$((${#STEPS[@]} - not_selected))
if ((failed)); then
    echo "overall: FAIL ($failed of $ran steps did not pass) in ${total}s" >>"$SUMMARY"
else
    echo "overall: PASS ($ran steps) in ${total}s" >>"$SUMMARY"
fi
(cd "$OUT" && tar czf logs.tar.gz ./*.log && rm -f ./*.log) || echo "gpu-check: logs left unpacked in $OUT" >&2
cat "$SUMMARY"
((failed == 0))
