"""How many bytes a GGUF file's tensors need, read off its header alone, so that a file cut short
(a copy or download interrupted) is said to be truncated: the readers that fail on it name a
numpy internal instead ("cannot reshape array of size 503360 into shape (576,960)").

The header is the magic, a version, the tensor and key counts, the key-value metadata, then one
record per tensor (name, dimensions, type, offset into the data section); the data section
starts at the next multiple of `general.alignment` (32 unless set).
"""

import mmap
import struct
from pathlib import Path

from tandem.memory_size import human_size

DEFAULT_ALIGNMENT = 32
_VERSIONS = (2, 3)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def truncation(path: Path) -> str | None:
    """"truncated: ..." where `path` is shorter than its tensors need, or ends inside its header;
    None where it is not, or its header cannot be read far enough to tell."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    need = _data_end(path)
    if need == HEADER_CUT_SHORT:
        return (f"truncated: its header runs past its end at {human_size(size)} ({size:,} bytes) "
                "(cut short while copied or downloaded?)")
    if need is None or size >= need:
        return None
    return (f"truncated: it holds {human_size(size)} ({size:,} bytes) of the {human_size(need)} ({need:,} bytes) "
            "its tensors need (cut short while copied or downloaded?)")


def tensor_data_end(path: Path) -> int | None:
    """Where the furthest tensor's data ends: the size the file needs; None where the header is
    not a GGUF one this reader knows, or is itself cut short."""
    end = _data_end(path)
    return None if end == HEADER_CUT_SHORT else end


HEADER_CUT_SHORT = -1  # _data_end: a GGUF header this reader knows runs past the file's end


def _data_end(path: Path) -> int | None:
    """The furthest tensor's data end; HEADER_CUT_SHORT where the header itself runs out of bytes
    (a large model's holds megabytes of tokenizer arrays); None where it is no GGUF header this
    reader knows. One pass over the header."""
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return _Header(view).data_end()
    except _CutShort:
        return HEADER_CUT_SHORT
    except (OSError, ValueError, struct.error, KeyError, OverflowError):
        return None


class _CutShort(ValueError):
    """The header runs past the end of the file."""


class _Header:
    """A cursor over the header's bytes (little-endian, as every GGUF Tandem reads)."""

    def __init__(self, view):
        self.view = view
        self.offset = 0

    def data_end(self) -> int:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        if self._bytes(4) != b"GGUF" or self._scalar(4) not in _VERSIONS:
            raise ValueError("not a GGUF header this reader knows")
        tensor_count, key_count = self._scalar(10), self._scalar(10)
        alignment = DEFAULT_ALIGNMENT
        for _ in range(key_count):
            key, value = self._string(), self._value(self._scalar(4))
            if key == "general.alignment":
                alignment = value
        ends = []
        for _ in range(tensor_count):
            self._string()
            dims = [self._scalar(10) for _ in range(self._scalar(4))]
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(self._scalar(4))]
            elements = 1
            for dim in dims:
                elements *= dim
            ends.append(self._scalar(10) + elements // block * block_bytes)
        if not (isinstance(alignment, int) and alignment > 0):
            raise ValueError("a bad general.alignment")
        if not ends:  # no tensors: no data section to pad to
            return self.offset
        data_start = -(-self.offset // alignment) * alignment
        return data_start + max(ends)

    def _value(self, kind: int):
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item_kind, count = self._scalar(4), self._scalar(10)
            if item_kind in _SCALARS:  # skipped whole: a tokenizer's arrays hold 150,000 entries
                self.offset += count * struct.calcsize(_SCALARS[item_kind])
                return None
            for _ in range(count):
                self._value(item_kind)
            return None
        return self._scalar(kind)

    def _scalar(self, kind: int):
        size = struct.calcsize(_SCALARS[kind])
        if self.offset + size > len(self.view):
            raise _CutShort("the header runs past the end of the file")
        (value,) = struct.unpack_from(_SCALARS[kind], self.view, self.offset)
        self.offset += size
        return value

    def _string(self) -> str:
        length = self._scalar(10)
        return self._bytes(length).decode("utf-8", errors="replace")

    def _bytes(self, count: int) -> bytes:
        if self.offset + count > len(self.view):
            raise _CutShort("the header runs past the end of the file")
        data = self.view[self.offset:self.offset + count]
        self.offset += count
        return data
