#!/usr/bin/env bash
# An arm64 Debian 12 root, unpacked from Debian's own arm64 packages, for building and running
# deepio for aarch64 on an x86-64 machine (issue 49):
#
#   bash scripts/aarch64-sysroot.sh [DIR]        (default build/aarch64/sysroot)
#
#  * what scripts/build-wheel.sh --arch aarch64 links: liburing's and libaio's static archives,
#    CPython 3.11's headers with the arm64 pyconfig.h;
#  * what scripts/test-wheel-aarch64.sh runs the wheel with: python3.11 for arm64 and its
#    libraries (qemu-aarch64 -L DIR DIR/usr/bin/python3.11);
#  * what scripts/cross-aarch64.sh compiles the C++ targets against (CMAKE_SYSROOT): glibc's
#    headers, GoogleTest, Google Benchmark, Open MPI.
#
# The packages and everything they depend on come from Debian's arm64 archive through apt with a
# state of its own (build/aarch64/apt: its own lists, an empty dpkg status, arm64 only), so the
# machine's apt and dpkg are left as they are (no `dpkg --add-architecture`, nothing installed),
# then `dpkg -x` unpacks each .deb into DIR. No maintainer script runs: DIR is for the compiler,
# the linker and qemu, not a system to boot. Done once: DIR/.packages records what it holds.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=$(realpath -m "${1:-build/aarch64/sysroot}")
pkgs=(python3.11 libpython3.11-dev liburing-dev libaio-dev libgtest-dev libgmock-dev libbenchmark-dev
      libopenmpi-dev)
want=$(printf '%s\n' "${pkgs[@]}" | LC_ALL=C sort -u | tr '\n' ' ')
if [[ -f $dir/.packages && $(cat "$dir/.packages") == "$want" ]]; then
  exit 0
fi
bash scripts/apt-missing.sh debian-archive-keyring

state=$root/build/aarch64/apt
rm -rf "$state" && mkdir -p "$state/lists/partial" "$state/archives/partial"
: >"$state/status"
# Debian's own archive alone (the machine's other sources are for amd64, or not reachable).
cat >"$state/sources.list" <<'EOF'
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
EOF
apt_arm64() {
  apt-get -q -o APT::Architecture=arm64 -o APT::Architectures::=arm64 \
    -o Dir::State::Lists="$state/lists" -o Dir::State::status="$state/status" \
    -o Dir::Cache="$state/cache" -o Dir::Cache::archives="$state/archives" \
    -o Dir::Etc::SourceList="$state/sources.list" -o Dir::Etc::SourceParts=/nonexistent \
    -o Debug::NoLocking=1 "$@"
}
apt_arm64 update >/dev/null
# With an empty status every dependency is "missing": apt downloads the whole closure.
apt_arm64 install -y -qq --download-only --no-install-recommends "${pkgs[@]}" >/dev/null

rm -rf "$dir" && mkdir -p "$dir"
for deb in "$state"/archives/*.deb; do
  dpkg -x "$deb" "$dir"
done
# Absolute symbolic links (libm.so -> /lib/aarch64-linux-gnu/libm.so.6, ...) point at this
# machine's root: made relative to DIR, so that a linker with --sysroot=DIR follows them there.
while IFS= read -r link; do
  target=$(readlink "$link")
  ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$dir$target")" "$link"
done < <(find "$dir" -type l -lname '/*')
rm -rf "$state/archives"
echo "$want" >"$dir/.packages"
echo "aarch64 sysroot: $dir ($(du -sh "$dir" | cut -f1), $(printf '%s' "$want"))"
