"""Tensors of the Open Inference Protocol: JSON ``data`` or binary bytes -> numpy, and back.

Binary tensor data extension (Triton): the body is the JSON header (its length in the
``Inference-Header-Content-Length`` HTTP header) followed by each binary input's raw bytes, in
the order of ``inputs``, little-endian and row-major; BOOL is one byte (0 or 1) per value. Binary
inputs become arrays with ``np.frombuffer`` over the request body (no copy, no per-element
Python); JSON ``data`` goes through the v1 tensor fields (one ``np.array`` call). BYTES (UTF-8 text here) is
a list of strings in JSON, and in binary each element's 4-byte little-endian length then its bytes; it
becomes an object array of ``str``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
from marshmallow import ValidationError

from schemas.tensor import BoolTensor, Tensor
from service.edge.jsonio import not_utf8
from service.edge.v2.errors import ProtocolError
from service.operations.registry import TensorSpec
from service.problems import flatten_messages, pointer
from service.settings import Limits

# Protocol datatype <-> little-endian numpy dtype, for the datatypes this service speaks.
DTYPES = {"FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"), "BOOL": np.dtype("?")}
DATATYPE_OF = {dtype.newbyteorder("="): name for name, dtype in DTYPES.items()}
HEADER_LENGTH = "Inference-Header-Content-Length"  # the JSON header's length in a binary request or answer
LENGTH = struct.Struct("<I")  # a BYTES element's length prefix


def _fail(spec: TensorSpec, message: str) -> ProtocolError:
    return ProtocolError(f"input '{spec.name}': {message}; expected {spec.expected()}.")


class BinaryReader:
    """Hands out consecutive slices of the binary part of the body, checking every byte is claimed."""

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.offset = 0

    def take(self, spec: TensorSpec, size: int) -> int:
        """Offset of the next ``size`` bytes, for input ``spec``."""
        if self.offset + size > len(self.data):
            raise _fail(spec, f"binary_data_size {size} runs past the end of the body "
                              f"({len(self.data) - self.offset} binary bytes left)")
        start, self.offset = self.offset, self.offset + size
        return start

    def finish(self) -> None:
        """Bytes that no input claims are an error (a client/server disagreement about the layout)."""
        if self.offset != len(self.data):
            raise ProtocolError(f"{len(self.data) - self.offset} bytes of binary data after the JSON header are "
                                "not claimed by any input's binary_data_size.")


def decode(spec: TensorSpec, tensor: dict[str, Any], binary: BinaryReader, limits: Limits) -> np.ndarray:
    """One validated ``$request_input`` -> an array of its shape and datatype (finite, non-empty; BYTES: an
    object array of ``str``). A spec's ``count_limit`` bounds the element count, judged from the shape."""
    datatype, shape = tensor["datatype"], tuple(tensor["shape"])
    if datatype not in spec.datatypes:
        raise _fail(spec, f"datatype {datatype} is not supported")
    if len(shape) not in spec.ranks or 0 in shape:
        raise _fail(spec, f"got shape {list(shape)}")
    size = math.prod(shape)
    if spec.count_limit:  # before a loop over the elements (BYTES) runs
        limits.check(spec.count_limit, size, pointer=pointer(spec.name))
    if "binary_data_size" in tensor["parameters"]:
        if "data" in tensor:
            raise _fail(spec, "give either data or binary_data_size, not both")
        nbytes = tensor["parameters"]["binary_data_size"]
        if datatype == "BYTES":
            return _strings_from_bytes(spec, binary.data[binary.take(spec, nbytes):][:nbytes], size).reshape(shape)
        return _from_bytes(spec, binary, nbytes, shape, datatype)
    if "data" not in tensor:
        raise _fail(spec, "no data and no binary_data_size")
    if datatype == "BYTES":
        return _strings_from_json(spec, tensor["data"], shape)
    return _from_json(spec, tensor["data"], shape, DTYPES[datatype])


def _from_bytes(spec: TensorSpec, binary: BinaryReader, nbytes: int, shape: tuple[int, ...],
                datatype: str) -> np.ndarray:
    """Fixed-size values: a view of the body's bytes (BOOL only 0 or 1, floats finite)."""
    size, dtype = math.prod(shape), DTYPES[datatype]
    if nbytes != size * dtype.itemsize:
        raise _fail(spec, f"binary_data_size is {nbytes} bytes but shape {list(shape)} of {datatype} "
                          f"needs {size * dtype.itemsize}")
    offset = binary.take(spec, nbytes)
    if dtype.kind == "b":  # only 0 and 1 are booleans
        raw = np.frombuffer(binary.data, np.uint8, size, offset)
        if (raw > 1).any():
            raise _fail(spec, "BOOL bytes must be 0 or 1")
    array = np.frombuffer(binary.data, dtype, size, offset).reshape(shape)
    if dtype.kind == "f" and not np.isfinite(array).all():
        raise _fail(spec, "every value must be finite (NaN or Infinity found)")
    return array


def _strings_from_bytes(spec: TensorSpec, data: memoryview, size: int) -> np.ndarray:
    """``size`` BYTES elements, each a 4-byte little-endian length then that many bytes of UTF-8, filling
    ``data`` exactly -> (size,) object array of ``str``."""
    strings, offset = np.empty(size, object), 0
    for i in range(size):
        if offset + LENGTH.size > len(data):
            raise _fail(spec, f"binary data ends before element {i}'s 4-byte length ({size} elements in the shape)")
        (length,) = LENGTH.unpack_from(data, offset)
        offset += LENGTH.size
        if offset + length > len(data):
            raise _fail(spec, f"element {i} claims {length} bytes, past the end of its binary_data_size")
        try:
            strings[i] = str(data[offset:offset + length], "utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(spec, f"element {i} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        offset += length
    if offset != len(data):
        raise _fail(spec, f"{len(data) - offset} bytes of binary_data_size are left after the {size} elements")
    return strings


def _strings_from_json(spec: TensorSpec, data: Any, shape: tuple[int, ...]) -> np.ndarray:
    """JSON strings, flat or nested exactly as ``shape`` -> object array of ``str``."""
    try:
        array = np.array(data, dtype=object)
    except ValueError:  # ragged nesting
        raise _fail(spec, "data is ragged") from None
    if not (array.shape == shape or (array.ndim == 1 and array.size == math.prod(shape))):
        raise _fail(spec, f"data has shape {list(array.shape)}, not {list(shape)} (flat or nested)")
    for i, value in enumerate(array.flat):
        if not isinstance(value, str):
            raise _fail(spec, f"data element {i} is not a string")
    return array.reshape(shape)


def _from_json(spec: TensorSpec, data: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """JSON ``data``, flat or nested exactly as ``shape``, through the v1 tensor field (leaf types,
    raggedness, finiteness checked without per-element Python). Floats stay float64 here: the
    model casts to the compute precision (refusing values beyond the float32 range)."""
    field = (BoolTensor if dtype.kind == "b" else Tensor)(ranks=(1, len(shape)))
    try:
        array = field.deserialize(data)
    except ValidationError as exc:
        where, detail = next(flatten_messages(exc.messages))
        raise _fail(spec, f"data{where}: {detail}") from None
    if array.shape == shape or (array.ndim == 1 and array.size == math.prod(shape)):
        return array.reshape(shape)
    raise _fail(spec, f"data has shape {list(array.shape)}, not {list(shape)} (flat or nested)")


def encode(name: str, array: np.ndarray, binary: bool) -> tuple[dict[str, Any], bytes | None]:
    """``$response_output`` for ``array``, and its raw little-endian bytes when ``binary`` (an object array of
    ``str`` is BYTES: each element's UTF-8 length-prefixed)."""
    if array.dtype == object:
        output = {"name": name, "datatype": "BYTES", "shape": list(array.shape)}
        if not binary:
            return {**output, "data": array.reshape(-1).tolist()}, None  # orjson writes no object arrays
        encoded = [text.encode() for text in array.flat]
        raw = b"".join(LENGTH.pack(len(item)) + item for item in encoded)
        return {**output, "parameters": {"binary_data_size": len(raw)}}, raw
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    output = {"name": name, "datatype": DATATYPE_OF[array.dtype.newbyteorder("=")], "shape": list(array.shape)}
    if binary:
        output["parameters"] = {"binary_data_size": array.nbytes}
        return output, array.tobytes()  # the one copy: gunicorn writes only bytes objects
    output["data"] = array.reshape(-1)
    return output, None


def parse_header(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """Split the body into the JSON header and the binary part (``header_length``: the HTTP header)."""
    if header_length is None:
        return body, memoryview(b"")
    # ASCII digits, not too many: str.isdigit() takes "²" and int() does not, nor more than 4300 digits.
    digits = header_length.isascii() and header_length.isdigit() and len(header_length) <= 15
    if not digits or int(header_length) > len(body):
        raise ProtocolError(f"Inference-Header-Content-Length must be an integer from 0 to the body's "
                            f"{len(body)} bytes, got {header_length!r}.")
    split = int(header_length)
    return body[:split], memoryview(body)[split:]


def load_json(text: bytes, charset: Callable[[], str | None] = lambda: None, *, split: bool = False) -> Any:
    """orjson parse (no NaN/Infinity), errors as protocol errors. ``charset()``: the charset the request
    declared when it is not UTF-8 (service.jsonio.declared_charset), asked only on error and named then.
    ``split``: whether Inference-Header-Content-Length cut ``text`` from a binary part (if not, raw tensor bytes
    may be what is not UTF-8, and the error says so)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        declared = f" (the request declares charset={name}: send the header in UTF-8)" if (name := charset()) else ""
        if where := not_utf8(text):
            unsplit = "" if split else f"; binary tensor data needs {HEADER_LENGTH}, the JSON header's length"
            raise ProtocolError(f"The JSON inference header is not valid UTF-8: {where}{declared}{unsplit}.") from None
        raise ProtocolError(f"The JSON inference header is not valid JSON: {exc}{declared}.") from None
