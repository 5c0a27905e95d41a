#!/usr/bin/env bash
# Runs every tensor-load example on one input file. Extra arguments go to every script.
#   ./run_load_tensor.sh /local_nvme/data.bin [--loop 3] [--validate]
# Create a 1 GiB input with: dd if=/dev/urandom of=/local_nvme/data.bin bs=1M count=1024
set -u
cd "$(dirname "$0")"
input_file=${1:-}
if [[ -z ${input_file} || ! -f ${input_file} ]]; then
    echo "usage: $0 INPUT_FILE [--loop N] [--validate]   (input file not found: '${input_file}')" >&2
    exit 2
fi
shift
py=${PYTHON:-python3}
echo "Running load tensor examples using ${input_file}"
failed=0
for f in py_load_cpu_tensor.py aio_load_cpu_tensor.py py_load_gpu_tensor.py aio_load_gpu_tensor.py gds_load_gpu_tensor.py; do
    echo "== ${f}"
    sync
    if ! "$py" "$f" --input_file "${input_file}" "$@"; then
        echo "FAILED: ${f}" >&2
        failed=1
    fi
done
exit $failed
