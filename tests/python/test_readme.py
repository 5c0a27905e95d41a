"""The README's Python example runs as written (with its file path pointed at a temp folder)."""

import pathlib
import re

import pytest

from conftest import needs_torch

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_the_deepnvme_example():
    blocks = python_blocks()
    assert blocks, "README lost its Python example"
    assert any("async_pwrite" in b and "wait()" in b for b in blocks)


@needs_torch  # the README example uses torch
@pytest.mark.parametrize("block", python_blocks())
def test_readme_python_example_runs(block, tmp_path):
    code = block.replace("/nvme/", f"{tmp_path}/")
    exec(compile(code, "README.md", "exec"), {})
    written = list(tmp_path.iterdir())
    assert written and all(f.stat().st_size > 0 for f in written)
