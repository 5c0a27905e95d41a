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
# RATE 0 leaves the devices unthrottled (bench/ram_drives.sh: drives where the disk is not the
# limit) and mounts them with discard, so that deleted files give their memory back.
# DEEPIO_DRIVES_NAME (default "drive") names the mounts /mnt/NAME<i> and the backing files
# /dev/shm/deepio-NAME<i>.img; "down" takes down only the drives of that name.
#
# Needs root; a RATE above 0 needs cgroup v1's blkio controller (/sys/fs/cgroup/blkio):
# cgroup v2 machines have io.max instead (not handled here). Backing files are sparse: memory
# is used as data is written (up to SIZE_GIB each). The file systems' inode tables and journal
# are written at mkfs (no lazy init running in the background while measuring).
set -euo pipefail

BLKIO=/sys/fs/cgroup/blkio
name=${DEEPIO_DRIVES_NAME:-drive}
cmd=${1:-}

throttle() { # MAJ:MIN BYTES_PER_S (0: none) for reads and writes, where blkio is there
    [[ -w $BLKIO/blkio.throttle.read_bps_device ]] || return 0
    echo "$1 $2" >"$BLKIO/blkio.throttle.read_bps_device"
    echo "$1 $2" >"$BLKIO/blkio.throttle.write_bps_device"
}

case $cmd in
up)
    n=${2:-3} rate=${3:-150} size=${4:-8}
    [[ $(id -u) == 0 ]] || {
        echo "$0: needs root" >&2
        exit 2
    }
    ((rate == 0)) || [[ -w $BLKIO/blkio.throttle.read_bps_device ]] || {
        echo "$0: throttling needs cgroup v1 blkio ($BLKIO)" >&2
        exit 2
    }
    opts=()
    ((rate != 0)) || opts=(-o discard)
    for ((i = 0; i < n; i++)); do
        img=/dev/shm/deepio-$name$i.img mnt=/mnt/$name$i
        if mountpoint -q "$mnt"; then
            echo "$0: $mnt is mounted already ($0 down first)" >&2
            exit 2
        fi
        truncate -s "${size}G" "$img"
        dev=$(losetup -f --show "$img")
        mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$dev"
        mkdir -p "$mnt"
        mount "${opts[@]}" "$dev" "$mnt"
        if ((rate == 0)); then
            echo "$mnt: $dev over $img, unthrottled"
        else
            mm=$(lsblk -no MAJ:MIN "$dev" | tr -d ' ')
            throttle "$mm" $((rate << 20))
            echo "$mnt: $dev ($mm) over $img, $rate MiB/s read and write"
        fi
    done
    ;;
down)
    for mnt in /mnt/$name[0-9]*; do
        mountpoint -q "$mnt" || continue
        dev=$(findmnt -no SOURCE "$mnt")
        mm=$(lsblk -no MAJ:MIN "$dev" | tr -d ' ')
        umount "$mnt"
        throttle "$mm" 0 || true
        losetup -d "$dev"
        rmdir "$mnt" || true
    done
    rm -f /dev/shm/deepio-"$name"[0-9]*.img
    ;;
*)
    echo "usage: $0 up [N] [RATE_MIB_S (0: unthrottled)] [SIZE_GIB] | down" >&2
    exit 2
    ;;
esac
