"""The optional C extension (bridge/native/src/*.c, built as `_speedups`), loaded once; every fast path asks `NATIVE` first.

Without the extension (a machine without a C compiler) or with BRIDGE_PURE_PYTHON=1 in the
environment, the Python paths do all the work and give the same output.
"""
from __future__ import annotations

import os

try:
    from bridge.native import _speedups
except ImportError:  # pragma: no cover - a build without a C compiler
    _speedups = None

__all__ = ["NATIVE", "header_properties", "speedups", "split_items", "valid_entries", "wire_scan"]

NATIVE: bool = _speedups is not None and os.environ.get("BRIDGE_PURE_PYTHON", "") in ("", "0")
speedups = _speedups if NATIVE else None


def split_items(data: bytes) -> list | None:
    """The bytes of each Entry of an Entries encoding, in order, or None (no extension, or malformed)."""
    return _speedups.split_items(data) if NATIVE else None


def wire_scan(raw: bytes):
    """(columns key, dmlEventType, rows) of an Entry whose Event holds only a dmlEvent, or None."""
    return _speedups.scan(raw) if NATIVE else None


def header_properties(raw: bytes):
    """An Entry's header properties as [[key, value], ...] (None: none), or False: one is a DataHub
    fact, C is not sure, or there is no extension (then Python reads the parsed Header)."""
    return _speedups.header_properties(raw) if NATIVE else False


def valid_entries(data: bytes) -> bool:
    """True when protobuf is known to parse the bytes as an Entries (False: not sure, or no extension)."""
    return NATIVE and _speedups.valid_entries(data)
