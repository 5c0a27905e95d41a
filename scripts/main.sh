#!/usr/bin/env bash
# deepio's main job on a fresh machine: install what is missing, build, then measure this
# machine's disk with `deepio bench` (a temporary folder on the local disk, a size that suits
# the machine; deepio beside a naive Python-style copy and fio in the same run).
# Extra arguments are passed to `deepio bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
# Not the inference engines of deepio.kv's backends (minutes, and only their tests use them:
# scripts/test.sh installs them).
bash scripts/setup.sh --no-kv-engines
cmake --preset default -DDEEPIO_BUILD_TESTS=OFF >/dev/null
cmake --build --preset default
if [ -x build/default/tools/deepio ]; then
  exec build/default/tools/deepio bench "$@"
fi
# Before the command existed, the main job was the smallest example program.
exec build/default/examples/write_read "${TMPDIR:-/var/tmp}" 256
