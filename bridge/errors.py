"""One error hierarchy for the bridge: every error says where (partition/offset, line, column,
seqId, table, column name) and what (the offending value, shortened).

>>> e = FramingError("gap in segments", partition=3, offset=17)
>>> str(e)
'gap in segments (partition 3, offset 17)'
"""
from __future__ import annotations

from typing import Any

__all__ = [
    "BridgeError",
    "FramingError",
    "DecodeError",
    "ConversionError",
    "BlobFormatError",
    "TupleFormatError",
    "LineTooLongError",
    "OutputTooLargeError",
    "OptionsError",
    "shorten",
]

_WHERE_KEYS = ("partition", "offset", "line", "column_number", "seq_id", "table", "column", "source")


def shorten(value: Any, limit: int = 80) -> str:
    """A printable, bounded rendering of an offending value for error messages."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            text = raw.decode("utf-8")
            if text.isprintable():
                return shorten(text, limit)
        except UnicodeDecodeError:
            pass
        text = raw[: limit // 2].hex()
        return f"0x{text}{'...' if len(raw) > limit // 2 else ''} ({len(raw)} bytes)"
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class BridgeError(Exception):
    """Base of every error the bridge raises on bad input or bad options."""

    def __init__(self, reason: str, *, value: Any = None, **where: Any) -> None:
        self.reason = reason
        self.value = value
        self.where = {k: v for k, v in where.items() if v is not None}
        super().__init__(reason)

    def located(self, **where: Any) -> BridgeError:
        """Add location facts known only to an outer layer (never overwrite inner ones)."""
        for key, val in where.items():
            if val is not None:
                self.where.setdefault(key, val)
        return self

    def position(self) -> str:
        names = {"column_number": "column", "seq_id": "seqId", "column": "column"}
        parts = []
        for key in _WHERE_KEYS:
            if key in self.where:
                label = names.get(key, key)
                parts.append(f"{label} {self.where[key]}")
        for key, val in self.where.items():
            if key not in _WHERE_KEYS:
                parts.append(f"{key} {val}")
        return ", ".join(parts)

    def __str__(self) -> str:
        text = self.reason
        if self.value is not None:
            text += f": {shorten(self.value)}"
        pos = self.position()
        return f"{text} ({pos})" if pos else text

    def to_dict(self) -> dict:
        """A JSON-ready description, used for rejects files and PERMISSIVE error columns."""
        out = {"kind": type(self).__name__, "reason": self.reason, **self.where}
        if self.value is not None:
            out["value"] = shorten(self.value)
        return out


class OptionsError(BridgeError, ValueError):
    """An invalid option or combination of options, naming the option."""


class FramingError(BridgeError):
    """Envelope framing broken: version, total/index, gaps, foreign segments, unfinished buffers."""


class DecodeError(BridgeError):
    """Bytes or text that do not parse (protobuf, JSON, varint framing)."""


class ConversionError(BridgeError):
    """An Entry or message the converter cannot map (unknown type, value the target cannot hold)."""


class BlobFormatError(DecodeError):
    """A Blob message whose JSON shape is not a DataHub Blob envelope."""


class TupleFormatError(DecodeError):
    """A Tuple row or schema that does not fit its RecordSchema."""


class LineTooLongError(DecodeError):
    """A line of JSON Lines input longer than `max_line_bytes`, read past without being held whole:
    `head` is its first bytes and `length` its size (its line break aside), for a rejects file."""

    def __init__(self, reason: str, *, head: bytes = b"", length: int = 0, **where: Any) -> None:
        super().__init__(reason, **where)
        self.head = head
        self.length = length


class OutputTooLargeError(ConversionError):
    """Output a list form would hold past its documented bound (`entries_to_blob_lines`'
    `max_bytes`): it names the Entry that passes the bound (entry index, seqId, table), the size
    reached and the bound. The streaming forms (`stream_blob_lines`) have no such bound."""
