"""One default engine per process (issue 25, item 1): deepio.File, deepio.save/load,
Writer/Reader and deepio.safetensors share it, so after using all of them the process has
started the threads of ONE engine, no more. Counted in a fresh interpreter (threads from
/proc/self/task), against an engine of the same options driven through every kind of work
that starts threads lazily (plain, batch, durable writes).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import needs_torch

PROGRAM = textwrap.dedent(
    """
    import gc, json, os, sys
    import numpy as np
    import torch
    import deepio, deepio.safetensors
    from deepio import _deepio, _engine

    def threads():
        gc.collect()
        return len(os.listdir("/proc/self/task"))

    d = sys.argv[1]
    sd = {f"t{i}": torch.randn(1 << 20) for i in range(4)}
    torch.ones(1 << 22).sum()  # torch's own pool started before counting

    def every_api(tag):
        deepio.save(sd, os.path.join(d, tag + ".pt"))
        deepio.load(os.path.join(d, tag + ".pt"))
        deepio.safetensors.save_file(sd, os.path.join(d, tag + ".st"))
        deepio.safetensors.load_file(os.path.join(d, tag + ".st"))
        with deepio.File(os.path.join(d, tag + ".raw"), "w") as f:
            f.pwrite(np.ones(1 << 20, dtype=np.uint8), 0).result()
        with deepio.Writer(os.path.join(d, tag + ".w")) as w:
            w.write(b"x" * (3 << 20))
        with deepio.Reader(os.path.join(d, tag + ".w")) as r:
            r.read()

    start = threads()
    every_api("a")
    first = threads()
    every_api("b")
    second = threads()
    # One more engine of the default options, driven through everything that starts threads.
    h = _deepio.Handle(*_engine.DEFAULT_OPTIONS)
    buf = np.ones(1 << 20, dtype=np.uint8)
    h.sync(True, buf, os.path.join(d, "one.raw"), 0)
    h.submit_batch(True, [buf, buf], [os.path.join(d, "one.b1"), os.path.join(d, "one.b2")], None, False, True)
    h.wait()
    one_engine = threads() - second
    h.close()
    print(json.dumps({"start": start, "first": first, "second": second, "one_engine": one_engine}))
    """
)


@needs_torch
def test_every_api_shares_one_engine(tmp_dir):
    r = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_dir)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    n = json.loads(r.stdout.strip().splitlines()[-1])
    assert n["second"] == n["first"], f"a second round of the same calls started threads: {n}"
    assert n["first"] - n["start"] <= n["one_engine"], f"more threads than one engine's: {n}"
