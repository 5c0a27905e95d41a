#!/usr/bin/env bash
# Several separate "drives" on one machine, for measuring how deepio scales over folders on
# separate devices (issue 27) where the machine has one disk: N ext4 file systems, each on its
# own loop device over its own backing file in /dev/shm (memory), each loop device throttled
# to RATE MiB/s for reads and for writes by the block layer (cgroup v1 blkio.throttle, root
# group: every process's I/O, the page cache's write-back included). Each is then a device of
# known, separate bandwidth: N of them together can give N times one.
#
#   bench/throttled_drives.sh up [N=3] [RATE=150] [SIZE_GIB=8]   mounts /mnt/drive0 ... N-1
#   bench/throttled_drives.sh down                                unmounts, detaches, frees
#
# Needs root and cgroup v1's blkio controller (/sys/fs/cgroup/blkio); cgroup v2 machines
# have io.max instead (not handled here). Backing files are sparse: memory is used as data
# is written (up to SIZE_GIB each).
set -euo pipefail

BLKIO=/sys/fs/cgroup/blkio
cmd=${1:-}
case $cmd in
up)
    n=${2:-3} rate=${3:-150} size=${4:-8}
    [[ -w $BLKIO/blkio.throttle.read_bps_device ]] || {
        echo "throttled_drives: needs root and cgroup v1 blkio ($BLKIO)" >&2
        exit 2
    }
    bps=$((rate << 20))
    for ((i = 0; i < n; i++)); do
        img=/dev/shm/deepio-drive$i.img mnt=/mnt/drive$i
        truncate -s "${size}G" "$img"
        dev=$(losetup -f --show "$img")
        mkfs.ext4 -q -F "$dev"
        mkdir -p "$mnt"
        mount "$dev" "$mnt"
        mm=$(lsblk -no MAJ:MIN "$dev" | tr -d ' ')
        echo "$mm $bps" >"$BLKIO/blkio.throttle.read_bps_device"
        echo "$mm $bps" >"$BLKIO/blkio.throttle.write_bps_device"
        echo "$mnt: $dev ($mm) over $img, $rate MiB/s read and write"
    done
    ;;
down)
    for mnt in /mnt/drive*; do
        mountpoint -q "$mnt" || continue
        dev=$(findmnt -no SOURCE "$mnt")
        mm=$(lsblk -no MAJ:MIN "$dev" | tr -d ' ')
        umount "$mnt"
        echo "$mm 0" >"$BLKIO/blkio.throttle.read_bps_device" || true
        echo "$mm 0" >"$BLKIO/blkio.throttle.write_bps_device" || true
        losetup -d "$dev"
        rmdir "$mnt" || true
    done
    rm -f /dev/shm/deepio-drive*.img
    ;;
*)
    echo "usage: $0 up [N] [RATE_MIB_S] [SIZE_GIB] | down" >&2
    exit 2
    ;;
esac
