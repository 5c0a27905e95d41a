#!/usr/bin/env bash
# Drives where the disk is not the limit (issue 46): N ext4 file systems, each on its own loop
# device over its own sparse file in /dev/shm (memory), unthrottled, mounted at /mnt/ramdrive0
# ... N-1 (with discard: deleted files give their memory back). bench/throttled_drives.sh with
# a rate of 0; bench/fast_drives.py measures over them by default.
#
#   sudo bench/ram_drives.sh up [N=2] [SIZE_GIB=4]   mounts /mnt/ramdrive0 ... N-1
#   sudo bench/ram_drives.sh down                    unmounts, detaches, frees the memory
#
# Backing files /dev/shm/deepio-ramdrive<i>.img take memory as data is written (up to
# SIZE_GIB each): keep N x SIZE_GIB below the free memory. DEEPIO_DRIVES_NAME=NAME makes
# /mnt/NAME<i> instead (a test's own drives beside a user's).
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
export DEEPIO_DRIVES_NAME=${DEEPIO_DRIVES_NAME:-ramdrive}
case ${1:-} in
up) exec "$here/throttled_drives.sh" up "${2:-2}" 0 "${3:-4}" ;;
down) exec "$here/throttled_drives.sh" down ;;
*)
    echo "usage: $0 up [N=2] [SIZE_GIB=4] | down" >&2
    exit 2
    ;;
esac
