"""Load a file straight into GPU memory with deepio's gds_handle (GPUDirect Storage).

    python gds_load_gpu_tensor.py --input_file /local_nvme/data.bin [--loop 3] [--validate]

Exits with a "skipped" line (status 0) where there is no CUDA GPU or this deepio has no
GPUDirect Storage support.
"""

from utils import quick_gpu_check

quick_gpu_check(__file__)  # before the heavy imports: a clean skip in a second on machines without a GPU

import os

from utils import AIO_CONFIG, drop_page_cache, parse_read_arguments, report, require_gds, timed_loop, validation_result


def file_read(inp_f, h, gpu_tensor):
    h.sync_pread(gpu_tensor, inp_f)
    return gpu_tensor


def main():
    args = parse_read_arguments()
    torch, gds_handle = require_gds(__file__)
    file_sz = os.path.getsize(args.input_file)
    h = gds_handle(**AIO_CONFIG)
    gpu_tensor = h.new_pinned_device_tensor(file_sz, torch.empty(0, dtype=torch.uint8, device="cuda"))

    def op():
        file_read(args.input_file, h, gpu_tensor)
        torch.cuda.synchronize()

    secs = timed_loop(op, args.loop, lambda: drop_page_cache(args.input_file))
    report("gds load_gpu", file_sz, args.loop, secs)

    if args.validate:
        from py_load_gpu_tensor import file_read as py_file_read

        gpu_tensor.zero_()
        validation_result(torch.equal(file_read(args.input_file, h, gpu_tensor), py_file_read(args.input_file)))
    h.free_pinned_device_tensor(gpu_tensor)


if __name__ == "__main__":
    main()
