#!/usr/bin/env bash
# The installed C++ package works for a user: builds deepio, installs it into a fresh temporary
# prefix (cmake --install), then configures, builds and runs examples/downstream against that
# prefix alone (find_package(deepio) through CMAKE_PREFIX_PATH). Also checks that the prefix
# holds the public headers and no internal ones, and that the installed `deepio` command runs.
# Any failing step fails the script.
# Usage: scripts/check-install.sh [extra cmake -D options for deepio, e.g. -DDEEPIO_SHARED=OFF]
# Build folder: $DEEPIO_CHECK_INSTALL_BUILD (default build/check-install).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DEEPIO_CHECK_INSTALL_BUILD:-build/check-install}
work=$(mktemp -d "${TMPDIR:-/tmp}/deepio-check-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}

fail() { echo "check-install: FAILED: $*" >&2; exit 1; }
step() { printf '\n---- check-install: %s ----\n' "$*"; }

step "build deepio ($build)"
# Tests, benchmarks and the Python extension are not part of the C++ package.
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPIO_WERROR=ON \
  -DDEEPIO_BUILD_TESTS=OFF -DDEEPIO_BUILD_BENCH=OFF -DDEEPIO_BUILD_PYTHON=OFF "$@" >/dev/null \
  || fail "configuring deepio"
cmake --build "$build" || fail "building deepio"

step "install into $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null || fail "cmake --install"
[ -f "$prefix/include/deepio/deepio.hpp" ] || fail "include/deepio/deepio.hpp not installed"
[ -f "$prefix/include/deepio/export.hpp" ] || fail "include/deepio/export.hpp not installed"
config=$(find "$prefix" -name deepioConfig.cmake)
[ -n "$config" ] || fail "no deepioConfig.cmake under $prefix"
[ -f "$(dirname "$config")/deepioConfigVersion.cmake" ] || fail "no deepioConfigVersion.cmake beside $config"
# One version (CMakeLists.txt's project()): the package says the same (tests/python/test_version.py
# checks the Python side).
version=$(sed -n 's/^project(deepio VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
grep -q "set(PACKAGE_VERSION \"$version\")" "$(dirname "$config")/deepioConfigVersion.cmake" \
  || fail "deepioConfigVersion.cmake does not say version $version"
# Exactly the public API: include/deepio's headers (comm.hpp only with comm), no other header.
expected=$(cd include/deepio && ls -- *.hpp | sort)
installed=$(cd "$prefix/include/deepio" && ls -- *.hpp | sort)
extra=$(comm -13 <(echo "$expected") <(echo "$installed"))
missing=$(comm -23 <(echo "$expected") <(echo "$installed") | grep -vx comm.hpp || true)
[ -z "$extra" ] || fail "headers installed that include/deepio does not have: $extra"
[ -z "$missing" ] || fail "public headers not installed: $missing"
others=$(find "$prefix" \( -name '*.hpp' -o -name '*.h' \) -not -path "$prefix/include/deepio/*")
[ -z "$others" ] || fail "headers installed outside include/deepio: $others"
if [ -f "$prefix/include/deepio/comm.hpp" ] && [ -z "$(find "$prefix" -name 'deepioCommTargets.cmake')" ]; then
  fail "comm.hpp installed without deepio::comm"
fi
echo "installed: $(cd "$prefix" && find . -type f | sort | tr '\n' ' ')"

step "examples/downstream against $prefix"
cmake -S examples/downstream -B "$work/downstream" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >/dev/null \
  || fail "configuring examples/downstream with find_package(deepio)"
cmake --build "$work/downstream" || fail "building examples/downstream"
mkdir -p "$work/data"
"$work/downstream/deepio_downstream" "$work/data" || fail "examples/downstream did not read back what it wrote"
if [ -f "$prefix/include/deepio/comm.hpp" ]; then
  [ -x "$work/downstream/deepio_downstream_comm" ] || fail "deepio::comm installed but not found by examples/downstream"
  "$work/downstream/deepio_downstream_comm" || fail "examples/downstream's deepio::comm check"
fi

if [ -x "$prefix/bin/deepio" ]; then
  step "installed deepio command"
  [ "$("$prefix/bin/deepio" --version)" = "deepio $version" ] || fail "installed $prefix/bin/deepio does not run or report $version"
fi
echo "check-install: OK"
