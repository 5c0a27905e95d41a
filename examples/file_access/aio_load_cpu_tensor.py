"""Load a file into a CPU tensor with deepio's DeepNVMe-compatible aio_handle.

    python aio_load_cpu_tensor.py --input_file /local_nvme/data.bin [--loop 3] [--validate]

The only change from DeepNVMe's example is the import: `deepio.aio_handle(...)` instead of
`AsyncIOBuilder().load().aio_handle(...)`. The file is read straight into a page-locked
tensor with O_DIRECT; no bounce copy is needed for CPU tensors.
"""

import os

import torch

import deepio
from utils import AIO_CONFIG, drop_page_cache, parse_read_arguments, report, timed_loop, validation_result


def file_read(inp_f, h, tensor):
    h.sync_pread(tensor, inp_f)
    return tensor


def main():
    args = parse_read_arguments()
    file_sz = os.path.getsize(args.input_file)
    h = deepio.aio_handle(**AIO_CONFIG)
    tensor = h.new_cpu_locked_tensor(file_sz, torch.empty(0, dtype=torch.uint8))
    secs = timed_loop(
        lambda: file_read(args.input_file, h, tensor), args.loop, lambda: drop_page_cache(args.input_file)
    )
    report(f"aio load_cpu ({h.backend})", file_sz, args.loop, secs)

    if args.validate:
        from py_load_cpu_tensor import file_read as py_file_read

        tensor.zero_()
        aio_tensor = file_read(args.input_file, h, tensor)
        py_tensor = py_file_read(args.input_file)
        validation_result(torch.equal(aio_tensor, py_tensor))
    h.free_cpu_locked_tensor(tensor)


if __name__ == "__main__":
    main()
