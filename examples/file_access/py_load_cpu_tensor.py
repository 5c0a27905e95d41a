"""Load a file into a CPU tensor with plain Python: what users write without deepio.

python py_load_cpu_tensor.py --input_file /local_nvme/data.bin [--loop 3]
"""

import os
import warnings

import torch

from utils import drop_page_cache, parse_read_arguments, report, timed_loop


def file_read(inp_f):
    # open().read() fills a bytes object through the page cache, one thread; the tensor the
    # program keeps is then a copy of it.
    with open(inp_f, "rb") as f:
        data = f.read()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "buffer is not writable": we copy it right away
        return torch.frombuffer(data, dtype=torch.uint8).clone()


def main():
    args = parse_read_arguments()
    file_sz = os.path.getsize(args.input_file)
    secs = timed_loop(lambda: file_read(args.input_file), args.loop, lambda: drop_page_cache(args.input_file))
    report("py load_cpu", file_sz, args.loop, secs)


if __name__ == "__main__":
    main()
