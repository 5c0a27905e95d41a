#!/usr/bin/env bash
# Regenerates the type stubs of the compiled modules from a fresh build, with nanobind's own
# stub generator:
#   python/deepio/_deepio.pyi   always
#   python/deepio/_comm.pyi     when MPI is found (deepio._comm exists only then; otherwise the
#                               file is left as it is, with a warning)
# Steps: pip installs the package (as a wheel would be built: no test hooks; the deepio command
# is skipped, it has no stubs) into a private folder with an incremental build folder, runs
# `python -m nanobind.stubgen` on the installed modules with python/stubgen-patterns.txt, and
# copies the stubs into the source tree. tests/python/test_stubs.py runs the same generator
# against the installed package and fails when the shipped stubs differ.
# Run it after changing anything a binding exposes (names, signatures, defaults, docstrings).
#
# Usage: scripts/gen-stubs.sh
# Environment: PYTHON (default python3); DEEPIO_STUBS_BUILD_DIR (default build/types-py:
# cmake/ the build folder, site/ the install, stubs/ the generator's output).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
root=${DEEPIO_STUBS_BUILD_DIR:-build/types-py}
site=$root/site
out=$root/stubs
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
if command -v ccache >/dev/null && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
  export CCACHE_BASEDIR=$PWD CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache
fi

# pip refuses to replace an existing --target folder's contents without --upgrade, and stale
# files (a _comm module from an earlier MPI build) must not survive: start from an empty one.
rm -rf "$site" "$out"
mkdir -p "$out"
echo "gen-stubs: building and installing into $site (build folder $root/cmake) ..."
if ! "$py" -m pip install -q --no-build-isolation --no-deps --disable-pip-version-check \
    -Cbuild-dir="$root/cmake" -Ccmake.define.DEEPIO_TEST_HOOKS=OFF -Ccmake.define.DEEPIO_BUILD_TOOLS=OFF \
    --target "$site" . >"$root/pip.log" 2>&1; then
  tail -n 40 "$root/pip.log" >&2
  echo "gen-stubs: the build failed (full log: $root/pip.log); stubs left as they were" >&2
  exit 1
fi

# The generator imports the module: from the private install only, never from site-packages
# or the source tree (cd into the output folder, which holds no package).
abs_site=$(cd "$site" && pwd)
patterns=$PWD/python/stubgen-patterns.txt
stubgen() {  # module, output file (in $out)
  (cd "$out" && PYTHONPATH="$abs_site" "$py" -m nanobind.stubgen -q -p "$patterns" -m "$1" -o "$2")
}
stubgen deepio._deepio _deepio.pyi
cp "$out/_deepio.pyi" python/deepio/_deepio.pyi
if compgen -G "$site/deepio/_comm.*.so" >/dev/null; then
  stubgen deepio._comm _comm.pyi
  cp "$out/_comm.pyi" python/deepio/_comm.pyi
else
  echo "gen-stubs: warning: deepio._comm was not built (MPI not found); python/deepio/_comm.pyi left as it is" >&2
fi
echo "gen-stubs: done (nanobind $("$py" -c 'import nanobind; print(nanobind.__version__)'))"
git --no-pager diff --stat -- python/deepio/_deepio.pyi python/deepio/_comm.pyi || true
