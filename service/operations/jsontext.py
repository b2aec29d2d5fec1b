"""JSON text without Flask: answers written with orjson (numpy arrays natively), and the nesting depth of a body
judged before it is parsed. The edge's request parser (service.edge.jsonio) and the batch jobs' workers share them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
_NOT_STRUCTURAL = bytes(c for c in range(256) if c not in b'[]{}"')


def _default(obj: Any) -> Any:
    """What orjson cannot write itself: non-contiguous arrays, numpy scalars of other kinds."""
    if isinstance(obj, np.ndarray):
        return np.ascontiguousarray(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def dumps(obj: Any, *, indent: bool = False) -> bytes:
    """orjson bytes with numpy support and integer dict keys (marshmallow error dicts have them)."""
    return orjson.dumps(obj, default=_default, option=OPTIONS | (orjson.OPT_INDENT_2 if indent else 0))


def json_depth(body: bytes) -> int:
    """Maximum nesting depth of arrays/objects in a JSON text, ignoring brackets inside strings.

    Linear and vectorised, no recursion: escaped backslashes and escaped quotes are removed first
    (left to right, as JSON reads them), so every remaining quote opens or closes a string; then only
    brackets and quotes are kept (``bytes.translate``) and the parity of a running count of quotes
    says which brackets are inside a string. (No regex: one blanking out strings goes
    quadratic on an unterminated string of escaped quotes.)
    """
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = np.frombuffer(body.translate(None, _NOT_STRUCTURAL), np.uint8)  # [ ] { } " in order
    outside = (np.cumsum(kept == ord('"'), dtype=np.int32) & 1) == 0        # a closing quote is outside
    opens = (kept == ord("[")) | (kept == ord("{"))
    closes = (kept == ord("]")) | (kept == ord("}"))
    steps = (opens.astype(np.int32) - closes) * outside                      # int32: a body is < 2 GiB
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0))


def check_depth(body: bytes, limits: Any) -> None:
    """422 when the JSON nesting of ``body`` is past ``max_json_depth``.

    The depth is at most the number of ``[`` and ``{`` bytes (two C-speed counts), so a body with
    no more of them than the limit, like every small request, skips the scan.
    """
    if body.count(b"[") + body.count(b"{") > limits.max_json_depth:
        limits.check("max_json_depth", json_depth(body), pointer="")
