"""Store a CPU tensor to a file with deepio's DeepNVMe-compatible aio_handle.

    python aio_store_cpu_tensor.py --nvme_folder /local_nvme [--mb_size 1024] [--loop 3] [--validate]

deepio writes any CPU tensor directly (O_DIRECT for the aligned body, exact bytes for the
rest): unlike DeepNVMe's example there is no copy into a pinned bounce buffer first.
"""

import filecmp
import os
import pathlib
import tempfile

import torch

import deepio
from utils import AIO_CONFIG, MEGA_UNIT, parse_write_arguments, report, timed_loop, validation_result


def fsync_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # as the Python version: the clock stops when the data is durable
    finally:
        os.close(fd)


def file_write(out_f, t, h):
    h.sync_pwrite(t, out_f)
    fsync_file(out_f)


def main():
    args = parse_write_arguments()
    output_file = os.path.join(args.nvme_folder, f"test_output_{args.mb_size}MB.pt")
    pathlib.Path(output_file).unlink(missing_ok=True)
    file_sz = args.mb_size * MEGA_UNIT
    app_tensor = torch.randint(0, 256, (file_sz,), dtype=torch.uint8)
    h = deepio.aio_handle(**AIO_CONFIG)
    secs = timed_loop(lambda: file_write(output_file, app_tensor, h), args.loop)
    report(f"aio store_cpu ({h.backend})", file_sz, args.loop, secs)

    if args.validate:
        from py_store_cpu_tensor import file_write as py_file_write

        with tempfile.TemporaryDirectory() as tmp:
            py_ref_file = os.path.join(tmp, os.path.basename(output_file))
            py_file_write(py_ref_file, app_tensor)
            filecmp.clear_cache()
            ok = filecmp.cmp(py_ref_file, output_file, shallow=False)
        pathlib.Path(output_file).unlink(missing_ok=True)
        validation_result(ok)
    pathlib.Path(output_file).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
