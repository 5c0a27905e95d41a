"""The wire of a shared deepio.kv store (docs/kv-sharing.md, "Sharing a store between processes").

One owner process holds the store's folders and serves them on a Unix stream socket in the
abstract namespace, named from the folders' (device, inode) pairs; clients connect to it.
Page bytes never cross the socket: each client maps a staging region (a memfd it sends at
connect with SCM_RIGHTS) that the owner's store reads into and writes from.

Messages, both ways: a 16-byte header ``<IIQ`` (body length, op or status, request id), then
the body. Requests:

- HELLO (at connect, with the memfd): JSON ``{"page_bytes", "fingerprint", "folders",
  "staging_slots", "pid"}``; the reply (status OK/ERR, id 0) is JSON.
- PUT, GET: ``<I`` n, then n pairs ``<II`` (staging slot, length), then the keys (below);
  the reply: n bytes, 1 where the page was stored / read whole and verified; a GET of a group
  member's (docs/kv-sharing.md "Groups") adds n ``<I``: the slot of the group's arena (the memfd that
  came with the hello's reply) that holds the page, or 0xFFFFFFFF where it is in the staging.
- RELEASE (a group member, no reply): ``<I`` arena slots whose pages it copied out.
- CONTAINS: keys; reply n bytes. EXISTS, REMOVE: keys; reply ``<q``. CLEAR, RETRY: no body;
  reply ``<q``. CHECKPOINT: no body, empty reply. STATS: no body, reply JSON.

Keys: ``<I`` n, n lengths ``<H``, then the keys' bytes back to back (str keys as UTF-8: the
store treats ``"a"`` and ``b"a"`` as one key). An ERR reply's body is JSON ``{"type",
"errno", "message"}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
from array import array
from collections.abc import Sequence
from typing import Any, Union

HEADER = struct.Struct("<IIQ")
HELLO, PUT, GET, CONTAINS, EXISTS, REMOVE, CLEAR, CHECKPOINT, RETRY, STATS, RELEASE = range(1, 12)
OK, ERR = 0, 1
#: The largest message body accepted (a batch of 1024-byte keys: 64 MiB of keys is far beyond).
MAX_BODY = 64 << 20

Key = Union[str, bytes]


def socket_name(folders: Sequence[str]) -> tuple[bytes, list[list[int]]]:
    """The abstract socket name of a store over ``folders`` (each must exist), and the folders'
    sorted (device, inode) pairs: the same folders under any path or order give the same name."""
    ids = sorted([os.stat(f).st_dev, os.stat(f).st_ino] for f in folders)
    digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:24]
    return b"\0deepio-kv-" + digest.encode(), ids


def peer_uid_pid(sock: socket.socket) -> tuple[int, int]:
    """The (uid, pid) of the process at the other end (SO_PEERCRED, set by the kernel)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return uid, pid


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """n bytes from sock, or None at end of stream (also mid-message)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


def recv_message(sock: socket.socket) -> tuple[int, int, bytes] | None:
    """(op or status, id, body), or None at end of stream. Raises ConnectionError on a body
    over MAX_BODY (a peer that does not speak this protocol)."""
    head = recv_exact(sock, HEADER.size)
    if head is None:
        return None
    n, op, rid = HEADER.unpack(head)
    if n > MAX_BODY:
        raise ConnectionError(f"deepio.kv shared store: a message of {n} bytes (at most {MAX_BODY})")
    body = recv_exact(sock, n) if n else b""
    if body is None:
        return None
    return op, rid, body


def message(op: int, rid: int, body: bytes = b"") -> bytes:
    return HEADER.pack(len(body), op, rid) + body


def key_bytes(keys: Sequence[Key], max_key_bytes: int) -> list[bytes]:
    """The keys as bytes, checked as the store checks them: TypeError naming the index of a key
    that is not str or bytes, ValueError for an empty or too long one."""
    out = []
    for i, k in enumerate(keys):
        if isinstance(k, str):
            b = k.encode()
        elif isinstance(k, bytes):
            b = k
        else:
            raise TypeError(f"deepio.kv: key {i} must be str or bytes, not {type(k).__name__}")
        if not 1 <= len(b) <= max_key_bytes:
            raise ValueError(f"deepio.kv: key {i} is {len(b)} bytes; a key is 1 to {max_key_bytes} bytes")
        out.append(b)
    return out


def encode_keys(keys: list[bytes]) -> bytes:
    return struct.pack("<I", len(keys)) + array("H", [len(k) for k in keys]).tobytes() + b"".join(keys)


def decode_keys(body: bytes, at: int = 0) -> list[bytes]:
    (n,) = struct.unpack_from("<I", body, at)
    at += 4
    lens = array("H")
    lens.frombytes(body[at : at + 2 * n])
    at += 2 * n
    keys = []
    for k in lens:
        keys.append(body[at : at + k])
        at += k
    if len(keys) != n or at != len(body):
        raise ValueError("deepio.kv shared store: a malformed key list")
    return keys


def encode_pages(slots: Sequence[int], lengths: Sequence[int], keys: list[bytes]) -> bytes:
    pairs = array("I")
    for s, n in zip(slots, lengths):
        pairs.append(s)
        pairs.append(n)
    return struct.pack("<I", len(slots)) + pairs.tobytes() + encode_keys(keys)


def decode_pages(body: bytes) -> tuple[list[int], list[int], list[bytes]]:
    (n,) = struct.unpack_from("<I", body, 0)
    pairs = array("I")
    pairs.frombytes(body[4 : 4 + 8 * n])
    keys = decode_keys(body, 4 + 8 * n)
    if len(keys) != n:
        raise ValueError("deepio.kv shared store: keys and pages differ in number")
    return list(pairs[0::2]), list(pairs[1::2]), keys


def error_body(e: BaseException) -> bytes:
    return json.dumps({"type": type(e).__name__, "errno": getattr(e, "errno", None), "message": str(e)}).encode()


def raise_error(body: bytes) -> None:
    """Raises the owner's error, as the same class where it is one of the store's."""
    import deepio

    info: dict[str, Any] = json.loads(body)
    kind, err, msg = info.get("type"), info.get("errno"), str(info.get("message"))
    classes: dict[str, type[BaseException]] = {
        "ValueError": ValueError,
        "TypeError": TypeError,
        "InvalidArgumentError": deepio.InvalidArgumentError,
        "PermissionError": PermissionError,
        "TimeoutError": TimeoutError,
    }
    if kind in classes:
        raise classes[kind](msg)
    if err is not None:
        raise deepio.Error(err, msg)
    raise RuntimeError(f"deepio.kv shared store: the owner raised {kind}: {msg}")
