"""Store a GPU tensor straight from GPU memory with deepio's gds_handle (GPUDirect Storage).

    python gds_store_gpu_tensor.py --nvme_folder /local_nvme [--mb_size 1024] [--loop 3] [--validate]

Exits with a "skipped" line (status 0) where there is no CUDA GPU or this deepio has no
GPUDirect Storage support.
"""

from utils import quick_gpu_check

quick_gpu_check(__file__)  # before the heavy imports: a clean skip in a second on machines without a GPU

import filecmp
import os
import pathlib
import tempfile

from aio_store_cpu_tensor import fsync_file
from utils import AIO_CONFIG, MEGA_UNIT, parse_write_arguments, report, require_gds, timed_loop, validation_result


def file_write(out_f, t, h):
    h.sync_pwrite(t, out_f)
    fsync_file(out_f)


def main():
    args = parse_write_arguments()
    torch, gds_handle = require_gds(__file__)
    output_file = os.path.join(args.nvme_folder, f"test_output_{args.mb_size}MB.pt")
    pathlib.Path(output_file).unlink(missing_ok=True)
    file_sz = args.mb_size * MEGA_UNIT
    h = gds_handle(**AIO_CONFIG)
    gpu_tensor = h.new_pinned_device_tensor(file_sz, torch.empty(0, dtype=torch.uint8, device="cuda"))
    gpu_tensor.copy_(torch.randint(0, 256, (file_sz,), dtype=torch.uint8, device="cuda"))
    secs = timed_loop(lambda: file_write(output_file, gpu_tensor, h), args.loop)
    report("gds store_gpu", file_sz, args.loop, secs)

    if args.validate:
        from py_store_gpu_tensor import file_write as py_file_write

        with tempfile.TemporaryDirectory() as tmp:
            py_ref_file = os.path.join(tmp, os.path.basename(output_file))
            py_file_write(py_ref_file, gpu_tensor)
            filecmp.clear_cache()
            ok = filecmp.cmp(py_ref_file, output_file, shallow=False)
        pathlib.Path(output_file).unlink(missing_ok=True)
        validation_result(ok)
    h.free_pinned_device_tensor(gpu_tensor)
    pathlib.Path(output_file).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
