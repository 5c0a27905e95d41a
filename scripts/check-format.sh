#!/usr/bin/env bash
# Checks that the C++ files formatted with the repository's .clang-format are still formatted:
# clang-format --dry-run --Werror over every *.cpp / *.hpp / *.h / *.cu under the paths below.
# Exit 0 when all are clean, 1 with clang-format's report otherwise; 2 when clang-format is
# missing (scripts/setup.sh installs Debian's `clang-format`).
#
# Usage: scripts/check-format.sh [PATH...]   (default: the formatted paths listed here)
# To fix a file: clang-format -i FILE. Every C and C++ source of the tree is formatted.
set -euo pipefail
cd "$(dirname "$0")/.."

formatted=(src include python tools tests bench examples)
(($#)) && formatted=("$@")

CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
if ! command -v "$CLANG_FORMAT" >/dev/null; then
  echo "check-format: $CLANG_FORMAT not found (apt-get install clang-format)" >&2
  exit 2
fi

files=()
for p in "${formatted[@]}"; do
  if [ -d "$p" ]; then
    while IFS= read -r -d '' f; do files+=("$f"); done \
      < <(find "$p" -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.c' -o -name '*.cu' \) -print0 | sort -z)
  elif [ -f "$p" ]; then
    files+=("$p")
  else
    echo "check-format: $p does not exist" >&2
    exit 1
  fi
done

if "$CLANG_FORMAT" --dry-run --Werror "${files[@]}"; then
  echo "check-format: ${#files[@]} files formatted ($("$CLANG_FORMAT" --version | head -1))"
else
  echo "check-format: files above differ from .clang-format; fix with: $CLANG_FORMAT -i FILE" >&2
  exit 1
fi
