"""Entries given as bytes -> Blob JSON lines: the library's batch forms of `entry_to_blob` +
`encode_blob` (docs/decisions.md, "The batch form").

`stream_blob_lines` gives the lines one by one, holding at most one Entry's `BlobEncoder.line_budget`
bytes of them (a small Entry of many rows can give gigabytes: Blob repeats the schema in every
message); `entries_to_blob_lines` is its list, refused with OutputTooLargeError past `max_bytes`
(LIST_BYTES, 256 MiB, by default) instead of growing until the process runs out of memory.

The bytes of one `Entries` are checked whole before any Entry is converted, by protobuf on both
paths (with the C extension it also splits them, so each Entry's own bytes reach the C fast path):
bytes that do not parse are a DecodeError for the whole Entries, never a ConversionError of an
Entry before the bad one.

>>> e = pb.Entry(header=pb.Header(messageType=pb.HEARTBEAT, timestamp=1605339932, seqId=9))
>>> _ = e.event.heartbeatEvent.SetInParent()
>>> data = pb.Entries(items=[e, e]).SerializeToString()
>>> [len(line) for line in stream_blob_lines(data, Options(strict=True))]
[155, 155]
>>> entries_to_blob_lines(data, Options(strict=True), max_bytes=200)
Traceback (most recent call last):
...
bridge.errors.OutputTooLargeError: the Blob lines reach 310 bytes, past max_bytes (200): stream_blob_lines gives them without holding them (seqId 9, entry 1)
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from google.protobuf.message import DecodeError as ProtobufDecodeError

from bridge.blob.encode import BlobEncoder
from bridge.errors import BridgeError, DecodeError, OutputTooLargeError
from bridge.native import split_items
from bridge.options import DEFAULT_OPTIONS, Options, per_options
from bridge.wire import subscribe_pb2 as pb

__all__ = ["stream_blob_lines", "entries_to_blob_lines", "LIST_BYTES"]

LIST_BYTES = 256 << 20  # entries_to_blob_lines' default max_bytes: the bytes of lines its list may hold

_encoder = per_options(BlobEncoder)


def stream_blob_lines(entries: bytes | Iterable[bytes], options: Options = DEFAULT_OPTIONS) -> Iterator[bytes]:
    """The Blob JSON lines (`encode_blob` of each message, no newline) of Entries given as bytes,
    one by one: the encoding of one `Entries` (an Envelope's data, or a reassembled buffer) or an
    iterable of single Entry encodings (`Assembled.raws`). The same lines as `entry_to_blob` +
    `encode_blob`, written by the line API (`BlobEncoder.stream_lines`), so plain DML Entries never
    become dicts, and memory stays within one Entry's `line_budget` (64 MiB) whatever its output.

    An Entry is converted whole or not at all: its error comes before any of its lines. An
    `Entries` encoding that does not parse is a DecodeError before any line (as protobuf parses
    it whole); an iterable is parsed Entry by Entry as it is taken."""
    convert = _encoder(options).stream_lines
    for index, entry, raw in _parsed(entries):
        try:
            yield from convert(entry, raw)
        except BridgeError as exc:
            raise exc.located(entry=index)


def entries_to_blob_lines(entries: bytes | Iterable[bytes], options: Options = DEFAULT_OPTIONS,
                          max_bytes: int = LIST_BYTES) -> list[bytes]:
    """The lines of `stream_blob_lines(entries, options)` as a list. The list holds at most
    `max_bytes` bytes of lines (their lengths added up; LIST_BYTES, 256 MiB, by default): an Entry
    whose lines would take it past that raises OutputTooLargeError naming the Entry (its index,
    seqId and table), the size reached and the bound; take the lines from `stream_blob_lines` instead, or pass a
    larger `max_bytes`. Bytes of one `Entries` that do not parse are a DecodeError before any
    Entry is converted; Entry encodings are parsed one by one as they are converted.

    >>> e = pb.Entry(header=pb.Header(messageType=pb.HEARTBEAT, timestamp=1605339932, seqId=9))
    >>> _ = e.event.heartbeatEvent.SetInParent()
    >>> entries_to_blob_lines(pb.Entries(items=[e]).SerializeToString(), Options(strict=True))
    [b'{"schema":{},"payload":{"op":"MHEARTBEAT","sequenceId":"9000000","timestamp":{"eventTime":1605339932000,"checkpointTime":1605339932000}},"version":"0.0.1"}']
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise TypeError(f"max_bytes must be a non-negative int, not {max_bytes!r}")
    convert = _encoder(options).stream_lines
    out: list = []
    size = 0
    for index, entry, raw in _parsed(entries):
        try:
            lines = convert(entry, raw)
        except BridgeError as exc:
            raise exc.located(entry=index)
        if isinstance(lines, list):  # held already (under line_budget): added up at once
            grown = size + sum(map(len, lines))
            if grown <= max_bytes:
                out += lines
                size = grown
                continue
        for line in lines:  # a streamed Entry: converted again piece by piece, taken up to the bound
            size += len(line)
            if size > max_bytes:
                header = entry.header
                raise OutputTooLargeError(
                    f"the Blob lines reach {size} bytes, past max_bytes ({max_bytes}): stream_blob_lines gives "
                    "them without holding them", entry=index, seq_id=header.seqId,
                    table=f"{header.schemaName}.{header.tableName}" if header.schemaName or header.tableName
                    else None)
            out.append(line)
    return out


def _parsed(entries: bytes | Iterable[bytes]) -> Iterator[tuple[int, pb.Entry, bytes]]:
    """(index, Entry, its bytes) of each Entry, in order. An `Entries` encoding is parsed whole
    first (DecodeError if protobuf refuses any of it); C's split, when it gives as many items,
    supplies each Entry's own bytes, else they are the parsed Entry's serialisation."""
    if isinstance(entries, (bytes, bytearray, memoryview)):
        data = bytes(entries)
        try:
            raws = split_items(data)
        except ValueError:  # C refuses the framing: protobuf's parse below names what is wrong
            raws = None
        try:
            items = pb.Entries.FromString(data).items
        except (ProtobufDecodeError, RuntimeError) as exc:
            raise DecodeError(f"bytes do not parse as subscribe.Entries ({exc})", value=data) from None
        if raws is None or len(raws) != len(items):
            raws = [item.SerializeToString() for item in items]
        yield from ((index, item, raw) for index, (item, raw) in enumerate(zip(items, raws)))
        return
    parse = pb.Entry.FromString
    for index, raw in enumerate(entries):
        try:
            entry = parse(raw)
        except (ProtobufDecodeError, RuntimeError, TypeError) as exc:
            raise DecodeError(f"Entry {index} does not parse as subscribe.Entry ({exc})", value=raw) from None
        yield index, entry, raw
