#!/usr/bin/env bash
# The aarch64 (Grace) checks that need no Arm hardware (issue 49): the CRC-32C tests
# (tests/cpp/test_kv_crc.cpp: the instruction path and the table path against the bit-at-a-time
# definition) cross-compiled with Debian's aarch64 toolchain and GoogleTest's sources, run under
# qemu-user's emulation of an ARMv8 CPU with the CRC32 extension, which they must find and use.
# Installs g++-aarch64-linux-gnu and qemu-user from Debian when missing (root or sudo).
# scripts/test.sh --full runs it (stage aarch64).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/apt-missing.sh g++-aarch64-linux-gnu qemu-user libgtest-dev
out=build/aarch64
mkdir -p "$out"
gtest=/usr/src/googletest/googletest
# GoogleTest once (it does not change); the tests and the code under test every time.
if [[ ! -f $out/gtest.o ]]; then
  aarch64-linux-gnu-g++ -std=c++20 -O2 -pthread -I"$gtest/include" -I"$gtest" -c "$gtest/src/gtest-all.cc" -o "$out/gtest.o"
  aarch64-linux-gnu-g++ -std=c++20 -O2 -pthread -I"$gtest/include" -c "$gtest/src/gtest_main.cc" -o "$out/gtest_main.o"
fi
aarch64-linux-gnu-g++ -std=c++20 -O2 -static -pthread -Wall -Wextra -Werror -I"$gtest/include" -Iinclude -Isrc \
  tests/cpp/test_kv_crc.cpp src/kv/crc32c.cpp "$out/gtest.o" "$out/gtest_main.o" -o "$out/test_kv_crc" \
  2> >(grep -v "statically linked applications\|in function .testing::internal" >&2)
file "$out/test_kv_crc" | grep -q "ARM aarch64" || { echo "cross-aarch64: not an aarch64 program" >&2; exit 1; }
DEEPIO_EXPECT_CRC_INSTRUCTION=1 qemu-aarch64 -cpu max "$out/test_kv_crc"
