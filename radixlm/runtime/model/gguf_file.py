"""A GGUF file's tensor table and scalar metadata, read in a fraction of a second, its data memory-mapped.

Runs in the scheduler process at every load of a GGUF model. gguf.GGUFReader builds a numpy view for every
element of every metadata array, which for a 150k-token vocabulary takes seconds; loading needs only the
tensors and a few scalars, so this reader steps over the arrays and maps the data once. It offers the
attributes of GGUFReader that radixlm reads (`tensors` with name / shape / tensor_type / data / n_elements,
and `get_field(key).contents()` for scalars and strings). The format: github.com/ggml-org/ggml docs/gguf.md.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# Metadata value types (gguf.md): id -> struct format of a scalar; 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class FileTensor:
    name: str
    shape: np.ndarray  # ggml's ne: the row length first
    tensor_type: GGMLQuantizationType
    data: np.ndarray  # a view of the mapped file: [rows, row_bytes] uint8 for blocks, else typed values
    n_elements: int


@dataclass(frozen=True)
class _Field:
    value: Any

    def contents(self) -> Any:
        return self.value


class _Cursor:
    def __init__(self, buf: memoryview):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        n = self.take("Q")
        self.pos += n
        return bytes(self.buf[self.pos - n:self.pos]).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            self.pos += 8 + struct.unpack_from("<Q", self.buf, self.pos)[0]


class GGUFFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        cur = _Cursor(memoryview(self._map))
        if bytes(cur.buf[:4]) != b"GGUF":
            raise ValueError(f"{self.path} is not a GGUF file")
        cur.pos = 4
        version, n_tensors, n_kv = cur.take("I"), cur.take("Q"), cur.take("Q")
        if version < 2:
            raise ValueError(f"{self.path}: GGUF version {version} is not supported (2 or later)")
        self.fields: dict[str, _Field] = {}
        for _ in range(n_kv):
            key = cur.string()
            value = self._value(cur, cur.take("I"))
            if value is not None:
                self.fields[key] = _Field(value)
        infos = [self._tensor_info(cur) for _ in range(n_tensors)]
        alignment = int(self.fields.get("general.alignment", _Field(32)).value)
        start = -(-cur.pos // alignment) * alignment
        self.tensors = [self._tensor(start, *info) for info in infos]

    def get_field(self, key: str) -> _Field | None:
        return self.fields.get(key)

    def release(self, address: int, nbytes: int) -> None:
        """Unmap the whole pages of [address, address + nbytes) from this process (MADV_DONTNEED) once their
        bytes were copied elsewhere (repacked weights): its RSS stops counting them, the page cache keeps
        them, and a later read maps them again. A range outside this file's map is left alone."""
        base = self._map.ctypes.data
        if not (base <= address and address + nbytes <= base + self._map.nbytes):
            return
        lo = -(-(address - base) // mmap.PAGESIZE) * mmap.PAGESIZE
        hi = (address + nbytes - base) // mmap.PAGESIZE * mmap.PAGESIZE
        if hi > lo:
            self._map._mmap.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    @staticmethod
    def _value(cur: _Cursor, vtype: int) -> Any:
        """A scalar or string value; arrays are stepped over (None), except short numeric ones."""
        if vtype in _SCALARS:
            return cur.take(_SCALARS[vtype])
        if vtype == _STRING:
            return cur.string()
        if vtype != _ARRAY:
            raise ValueError(f"unknown GGUF metadata type {vtype}")
        etype, count = cur.take("I"), cur.take("Q")
        if etype == _STRING:
            cur.skip_strings(count)
            return None
        if etype not in _SCALARS:
            raise ValueError(f"GGUF metadata array of type {etype} (arrays of arrays) is not supported")
        size = struct.calcsize("<" + _SCALARS[etype])
        values = list(struct.unpack_from(f"<{count}{_SCALARS[etype]}", cur.buf, cur.pos)) if count <= 1024 else None
        cur.pos += count * size
        return values

    @staticmethod
    def _tensor_info(cur: _Cursor) -> tuple[str, list[int], int, int]:
        name = cur.string()
        dims = [cur.take("Q") for _ in range(cur.take("I"))]
        return name, dims, cur.take("I"), cur.take("Q")

    def _tensor(self, start: int, name: str, dims: list[int], type_id: int, offset: int) -> FileTensor:
        qtype = GGMLQuantizationType(type_id)
        block, nbytes = GGML_QUANT_SIZES[qtype]
        n = int(np.prod(dims))
        raw = self._map[start + offset:start + offset + n // block * nbytes]
        rows = n // dims[0]
        data = raw.reshape(rows, -1) if block > 1 else raw.view(_FLOAT_TYPES.get(qtype, np.uint8)).reshape(rows, -1)
        if len(dims) == 1:
            data = data.reshape(-1)
        return FileTensor(name, np.array(dims), qtype, data, n)


_FLOAT_TYPES = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
                GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
                GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
                GGMLQuantizationType.I64: np.int64}
