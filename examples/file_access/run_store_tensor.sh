#!/usr/bin/env bash
# Runs every tensor-store example into one folder. Extra arguments go to every script.
#   ./run_store_tensor.sh /local_nvme [--mb_size 1024] [--loop 3] [--validate]
set -u
cd "$(dirname "$0")"
nvme_folder=${1:-}
if [[ -z ${nvme_folder} || ! -d ${nvme_folder} ]]; then
    echo "usage: $0 NVME_FOLDER [--mb_size N] [--loop N] [--validate]   (folder not found: '${nvme_folder}')" >&2
    exit 2
fi
shift
py=${PYTHON:-python3}
echo "Running store tensor examples into ${nvme_folder}"
failed=0
for f in py_store_cpu_tensor.py aio_store_cpu_tensor.py py_store_gpu_tensor.py aio_store_gpu_tensor.py gds_store_gpu_tensor.py; do
    echo "== ${f}"
    sync
    if ! "$py" "$f" --nvme_folder "${nvme_folder}" "$@"; then
        echo "FAILED: ${f}" >&2
        failed=1
    fi
done
exit $failed
