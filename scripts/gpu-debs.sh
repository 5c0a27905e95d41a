#!/usr/bin/env bash
# Downloads, on the development machine (Debian 12, with a package registry), the .deb files
# that the bare GPU machine lacks (liburing, libaio, GoogleTest/GoogleMock; docs/gpu.md,
# "Checking on a GPU machine") into .gpu-debs/, which git ignores and the device tool carries:
#     scripts/gpu-debs.sh            # then run scripts/gpu-check.sh there with carry [".gpu-debs"]
# Packages already in .gpu-debs/ are not downloaded again.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(liburing-dev liburing2 libaio-dev libaio1 libgtest-dev libgmock-dev)
mkdir -p .gpu-debs
cd .gpu-debs
missing=()
for p in "${packages[@]}"; do
    compgen -G "${p}_*.deb" >/dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
    apt-get download "${missing[@]}"
fi
for p in "${packages[@]}"; do
    compgen -G "${p}_*.deb" >/dev/null || { echo "gpu-debs: ${p} was not downloaded" >&2; exit 1; }
done
ls -l ./*.deb
du -ch ./*.deb | tail -1
