#!/usr/bin/env bash
# The aarch64 (Grace) checks of the C++ that need no Arm hardware (issue 49); scripts/test.sh
# --full runs it (stage aarch64):
#  1. every CMake target (the library, the `deepio` command, the benchmarks, every test program,
#     the MPI comm library and its tests) cross-compiled and linked with Debian's
#     g++-aarch64-linux-gnu against an arm64 sysroot (scripts/aarch64-sysroot.sh: Debian's arm64
#     glibc, liburing, libaio, GoogleTest, Google Benchmark, Open MPI), through the toolchain file
#     cmake/aarch64-linux-gnu.cmake, warnings as errors. At -O1 without debug information: a
#     check that everything compiles and links for aarch64, in half the time of -O2 -g;
#  2. the CRC-32C tests of that build (tests/cpp/test_kv_crc.cpp: the instruction path and the
#     table path against the bit-at-a-time definition) under qemu-user's emulation of an ARMv8
#     CPU with the CRC32 extension, which they must find and use; and `deepio --version`.
# Installs g++-aarch64-linux-gnu and qemu-user from Debian when missing (root or sudo).
# The Python extension is cross-built by scripts/build-wheel.sh --arch aarch64 (stage wheel-aarch64).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bash scripts/apt-missing.sh g++-aarch64-linux-gnu qemu-user file
sysroot=$root/build/aarch64/sysroot
bash scripts/aarch64-sysroot.sh "$sysroot"
out=$root/build/aarch64/cmake

# GoogleTest's discovery lists a program's tests when ctest runs, not after each link (it would
# run every test program under qemu during the build).
cmake -S . -B "$out" -G Ninja --toolchain cmake/aarch64-linux-gnu.cmake \
  -DDEEPIO_AARCH64_SYSROOT="$sysroot" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g0 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g0 -DNDEBUG" \
  -DDEEPIO_WERROR=ON -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST >"$root/build/aarch64/configure.log" || {
  cat "$root/build/aarch64/configure.log"; exit 1; }
grep '^-- deepio:' "$root/build/aarch64/configure.log"
# Every part, as on x86-64: both backends and the MPI comm library.
if ! grep -q "deepio: io_uring backend ON, libaio backend ON" "$root/build/aarch64/configure.log" ||
  grep -q "deepio: comm .* not built" "$root/build/aarch64/configure.log"; then
  echo "cross-aarch64: the aarch64 configuration leaves a part out (above)" >&2; exit 1
fi
cmake --build "$out"

# Every executable the build made is an aarch64 program.
programs=$(find "$out" -type f -executable -not -path '*/CMakeFiles/*' -not -name '*.so*' -not -name '*.sh')
[ -n "$programs" ] || { echo "cross-aarch64: no program built" >&2; exit 1; }
for p in $programs; do
  file -b "$p" | grep -q "ARM aarch64" || { echo "cross-aarch64: $p is not an aarch64 program" >&2; exit 1; }
done
echo "cross-aarch64: $(wc -w <<<"$programs") aarch64 programs built: $(for p in $programs; do basename "$p"; done | sort | tr '\n' ' ')"

emu=(qemu-aarch64 -cpu max -L "$sysroot")
DEEPIO_EXPECT_CRC_INSTRUCTION=1 "${emu[@]}" "$out/tests/cpp/deepio_tests" --gtest_filter='KvCrc.*'
"${emu[@]}" "$out/tools/deepio" --version
