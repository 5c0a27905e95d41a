"""Store a GPU tensor to a file with plain Python (copy to CPU memory, then write).

    python py_store_gpu_tensor.py --nvme_folder /local_nvme [--mb_size 1024] [--loop 3]

Exits with a "skipped" line (status 0) where no CUDA GPU is available.
"""

from utils import quick_gpu_check

quick_gpu_check(__file__)  # before the heavy imports: a clean skip in a second on machines without a GPU

import os
import pathlib

from py_store_cpu_tensor import file_write as cpu_file_write
from utils import MEGA_UNIT, parse_write_arguments, report, require_gpu, timed_loop


def file_write(out_f, t):
    cpu_file_write(out_f, t.cpu())


def main():
    args = parse_write_arguments()
    torch = require_gpu(__file__)
    output_file = os.path.join(args.nvme_folder, f"test_output_{args.mb_size}MB.pt")
    pathlib.Path(output_file).unlink(missing_ok=True)
    file_sz = args.mb_size * MEGA_UNIT
    app_tensor = torch.empty(file_sz, dtype=torch.uint8, device="cuda", requires_grad=False)
    secs = timed_loop(lambda: file_write(output_file, app_tensor), args.loop)
    report("py store_gpu", file_sz, args.loop, secs)
    pathlib.Path(output_file).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
