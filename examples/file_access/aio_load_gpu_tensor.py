"""Load a file into a GPU tensor with deepio's aio_handle: O_DIRECT into a page-locked CPU
bounce tensor, then one host-to-device copy.

    python aio_load_gpu_tensor.py --input_file /local_nvme/data.bin [--loop 3] [--validate]

Exits with a "skipped" line (status 0) where no CUDA GPU is available.
"""

from utils import quick_gpu_check

quick_gpu_check(__file__)  # before the heavy imports: a clean skip in a second on machines without a GPU

import os

import deepio
from utils import AIO_CONFIG, drop_page_cache, parse_read_arguments, report, require_gpu, timed_loop, validation_result


def file_read(inp_f, h, bounce_buffer, gpu_tensor):
    h.sync_pread(bounce_buffer, inp_f)
    gpu_tensor.copy_(bounce_buffer, non_blocking=True)
    return gpu_tensor


def main():
    args = parse_read_arguments()
    torch = require_gpu(__file__)
    file_sz = os.path.getsize(args.input_file)
    h = deepio.aio_handle(**AIO_CONFIG)
    bounce_buffer = h.new_cpu_locked_tensor(file_sz, torch.empty(0, dtype=torch.uint8))
    gpu_tensor = torch.empty(file_sz, dtype=torch.uint8, device="cuda")

    def op():
        file_read(args.input_file, h, bounce_buffer, gpu_tensor)
        torch.cuda.synchronize()

    secs = timed_loop(op, args.loop, lambda: drop_page_cache(args.input_file))
    report(f"aio load_gpu ({h.backend})", file_sz, args.loop, secs)

    if args.validate:
        from py_load_gpu_tensor import file_read as py_file_read

        gpu_tensor.zero_()
        aio_tensor = file_read(args.input_file, h, bounce_buffer, gpu_tensor)
        validation_result(torch.equal(aio_tensor, py_file_read(args.input_file)))
    h.free_cpu_locked_tensor(bounce_buffer)


if __name__ == "__main__":
    main()
