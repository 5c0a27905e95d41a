"""Store a CPU tensor to a file with plain Python: what users write without deepio.

    python py_store_cpu_tensor.py --nvme_folder /local_nvme [--mb_size 1024] [--loop 3]

The timing includes fsync, so the figure is the device's and not the page cache's (DeepNVMe's
original example stops the clock while the data may still sit in memory).
"""

import os
import pathlib

import torch

from utils import MEGA_UNIT, parse_write_arguments, report, timed_loop


def file_write(out_f, t):
    with open(out_f, "wb") as f:
        f.write(t.numpy())
        f.flush()
        os.fsync(f.fileno())


def main():
    args = parse_write_arguments()
    output_file = os.path.join(args.nvme_folder, f"test_output_{args.mb_size}MB.pt")
    pathlib.Path(output_file).unlink(missing_ok=True)
    file_sz = args.mb_size * MEGA_UNIT
    app_tensor = torch.empty(file_sz, dtype=torch.uint8, device="cpu", requires_grad=False)
    secs = timed_loop(lambda: file_write(output_file, app_tensor), args.loop)
    report("py store_cpu", file_sz, args.loop, secs)
    pathlib.Path(output_file).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
