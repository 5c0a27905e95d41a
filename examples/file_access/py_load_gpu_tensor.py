"""Load a file into a GPU tensor with plain Python (read into CPU memory, then copy).

    python py_load_gpu_tensor.py --input_file /local_nvme/data.bin [--loop 3]

Exits with a "skipped" line (status 0) where no CUDA GPU is available.
"""

from utils import quick_gpu_check

quick_gpu_check(__file__)  # before the heavy imports: a clean skip in a second on machines without a GPU

import os

from py_load_cpu_tensor import file_read as cpu_file_read
from utils import drop_page_cache, parse_read_arguments, report, require_gpu, timed_loop


def file_read(inp_f):
    return cpu_file_read(inp_f).cuda()


def main():
    args = parse_read_arguments()
    torch = require_gpu(__file__)
    file_sz = os.path.getsize(args.input_file)

    def op():
        file_read(args.input_file)
        torch.cuda.synchronize()

    secs = timed_loop(op, args.loop, lambda: drop_page_cache(args.input_file))
    report("py load_gpu", file_sz, args.loop, secs)


if __name__ == "__main__":
    main()
