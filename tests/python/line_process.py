"""A test's helper process that takes one JSON command per line on stdin and answers one JSON
line per command on stdout (kv_shared_program.py, kv_group_program.py)."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path


class LineProcess:
    def __init__(self, argv: list[str], what: str) -> None:
        self.what = what  # "worker", "member": how a silent one is named
        self.p = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent
        )

    def read(self, timeout: float = 60) -> dict:
        """Its next line, parsed; fails the test after timeout seconds of silence."""
        got: list[str] = []
        t = threading.Thread(target=lambda: got.append(self.p.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        assert got and got[0], f"{self.what} {self.p.pid} said nothing in {timeout} s (rc {self.p.poll()})"
        return json.loads(got[0])

    def send(self, op: str, **kw) -> None:
        self.p.stdin.write(json.dumps(dict(kw, op=op)) + "\n")
        self.p.stdin.flush()

    def ask(self, op: str, **kw) -> dict:
        self.send(op, **kw)
        return self.read()

    def kill(self) -> None:
        self.p.kill()
        self.p.wait(30)

    def stop(self) -> None:
        """Asks it to exit (killed if it does not within 30 s)."""
        if self.p.poll() is None:
            try:
                self.send("exit")
                self.p.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
