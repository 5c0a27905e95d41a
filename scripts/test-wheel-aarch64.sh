#!/usr/bin/env bash
# Installs the aarch64 wheel and runs its smoke set under user-mode emulation (issue 49):
#
#   bash scripts/test-wheel-aarch64.sh [dist/deepio-*_aarch64.whl]
#                                  (scripts/build-wheel.sh --arch aarch64 --test calls it)
#
#  * the interpreter is Debian 12's arm64 CPython 3.11 from scripts/aarch64-sysroot.sh, run by
#    `qemu-aarch64 -L SYSROOT` (Debian's qemu-user, installed when missing): no binfmt_misc,
#    no Arm hardware;
#  * the wheel is installed by pip as a user's pip on an aarch64 machine would take it
#    (`--platform manylinux2014_aarch64 --only-binary=:all: --no-index`: the file alone, nothing
#    compiled) into build/wheel/aarch64-target, which the interpreter gets as PYTHONPATH;
#  * scripts/wheel-smoke-aarch64.py: import, every backend compiled, a file round trip with each
#    backend the emulator allows (qemu-user has no io_uring or libaio system calls: threads),
#    deepio.kv put/get/reopen, CRC-32C; then the wheel's `deepio` command: `--version`, `info`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
wheel=${1:-$(ls dist/deepio-*manylinux*_aarch64.whl 2>/dev/null | head -1)}
[ -f "$wheel" ] || { echo "test-wheel-aarch64.sh: no wheel (scripts/build-wheel.sh --arch aarch64)" >&2; exit 1; }
wheel=$(realpath "$wheel")
sysroot=$root/build/aarch64/sysroot
target=$root/build/wheel/aarch64-target

step() { printf '\n==== aarch64 wheel test: %s ====\n' "$*"; }

step "qemu-user, Debian's arm64 CPython 3.11"
bash scripts/apt-missing.sh qemu-user file
bash scripts/aarch64-sysroot.sh "$sysroot"
# The CPU: every ARMv8 extension qemu has (Grace is Armv9: CRC32 and PMULL are there).
emu=(qemu-aarch64 -cpu max -L "$sysroot")
"${emu[@]}" "$sysroot/usr/bin/python3.11" -c 'import platform, sys; print(platform.machine(), sys.version)'

step "$(basename "$wheel") installed from the file alone"
rm -rf "$target"
python3 -m pip install -q --disable-pip-version-check --no-index --no-deps --only-binary=:all: \
  --platform manylinux2014_aarch64 --python-version 3.11 --implementation cp --abi cp311 \
  --target "$target" "$wheel"

step "smoke set (scripts/wheel-smoke-aarch64.py) under qemu-aarch64"
(cd /tmp && PYTHONPATH=$target PYTHONDONTWRITEBYTECODE=1 \
  "${emu[@]}" "$sysroot/usr/bin/python3.11" "$root/scripts/wheel-smoke-aarch64.py" "$target")

step "the wheel's deepio command"
file -b "$target/bin/deepio" | grep -q "ARM aarch64" || {
  echo "test-wheel-aarch64.sh: $target/bin/deepio is not an aarch64 program" >&2; exit 1; }
"${emu[@]}" "$target/bin/deepio" --version
info=$("${emu[@]}" "$target/bin/deepio" info)
echo "$info"
for name in io_uring libaio threads; do
  grep -q "$name" <<<"$info" || { echo "test-wheel-aarch64.sh: 'deepio info' does not name $name" >&2; exit 1; }
done
echo "test-wheel-aarch64.sh: the aarch64 wheel's smoke set passed under qemu-aarch64"
