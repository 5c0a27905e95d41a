"""Store a GPU tensor to a file with deepio's aio_handle: one device-to-host copy into a
page-locked CPU bounce tensor, then O_DIRECT writes.

    python aio_store_gpu_tensor.py --nvme_folder /local_nvme [--mb_size 1024] [--loop 3] [--validate]

Exits with a "skipped" line (status 0) where no CUDA GPU is available.
"""

from utils import quick_gpu_check

quick_gpu_check(__file__)  # before the heavy imports: a clean skip in a second on machines without a GPU

import filecmp
import os
import pathlib
import tempfile

import deepio
from aio_store_cpu_tensor import fsync_file
from utils import AIO_CONFIG, MEGA_UNIT, parse_write_arguments, report, require_gpu, timed_loop, validation_result


def file_write(out_f, t, h, bounce_buffer):
    bounce_buffer.copy_(t)
    h.sync_pwrite(bounce_buffer, out_f)
    fsync_file(out_f)


def main():
    args = parse_write_arguments()
    torch = require_gpu(__file__)
    output_file = os.path.join(args.nvme_folder, f"test_output_{args.mb_size}MB.pt")
    pathlib.Path(output_file).unlink(missing_ok=True)
    file_sz = args.mb_size * MEGA_UNIT
    app_tensor = torch.randint(0, 256, (file_sz,), dtype=torch.uint8, device="cuda")
    h = deepio.aio_handle(**AIO_CONFIG)
    bounce_buffer = h.new_cpu_locked_tensor(file_sz, torch.empty(0, dtype=torch.uint8))
    secs = timed_loop(lambda: file_write(output_file, app_tensor, h, bounce_buffer), args.loop)
    report(f"aio store_gpu ({h.backend})", file_sz, args.loop, secs)

    if args.validate:
        from py_store_gpu_tensor import file_write as py_file_write

        with tempfile.TemporaryDirectory() as tmp:
            py_ref_file = os.path.join(tmp, os.path.basename(output_file))
            py_file_write(py_ref_file, app_tensor)
            filecmp.clear_cache()
            ok = filecmp.cmp(py_ref_file, output_file, shallow=False)
        pathlib.Path(output_file).unlink(missing_ok=True)
        validation_result(ok)
    h.free_cpu_locked_tensor(bounce_buffer)
    pathlib.Path(output_file).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
