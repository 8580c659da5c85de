"""The DTS wire: Envelope framing (split, pack, reassemble) and the two file streams.

`.pb` files are protobuf's standard varint-length-delimited stream of Envelope messages; `dts-json`
files are JSON Lines holding one Entry per line in protobuf's canonical JSON mapping. Both are read
and written one message at a time, so memory stays flat with file size.

>>> from bridge import subscribe_pb2 as pb
>>> entries = pb.Entries(items=[pb.Entry(header=pb.Header(seqId=7))])
>>> envs = split_entries(entries.SerializeToString(), max_message_bytes=64)
>>> r = Reassembler()
>>> [out for i, env in enumerate(envs) for out in r.feed(0, i, env.SerializeToString())][0].entries.items[0].header.seqId
7
"""
from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, NamedTuple

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError as _PbDecodeError

from bridge.errors import BridgeError, DecodeError, FramingError, LineTooLongError
from bridge.native import split_items, valid_entries
from bridge.wire import subscribe_pb2 as pb

__all__ = [
    "ENVELOPE_VERSION",
    "split_entries",
    "pack_entries",
    "Reassembler",
    "Assembled",
    "Redelivered",
    "ResumedTail",
    "tdsql_headers",
    "write_pb",
    "read_pb",
    "iter_pb_messages",
    "write_dts_json",
    "read_dts_json", "read_lines", "DEFAULT_MAX_LINE_BYTES",
    "entry_to_json_line",
    "entry_from_json_line",
    "encode_varint",
    "envelope_values",
]

ENVELOPE_VERSION = 1
# tag(1)+varint(<=5) for version, total, index; tag(1)+length varint(<=5) for data.
_ENVELOPE_OVERHEAD = 24
_MAX_MESSAGE_BYTES = (1 << 31) - 1
_READ_CHUNK = 1 << 20


_VARINT_1 = tuple(bytes((i,)) for i in range(0x80))  # the one-byte varints


def encode_varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _VARINT_1[value]
    if 0x80 <= value < 0x4000:  # (an Entry's length, mostly)
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def split_entries(data: bytes, max_message_bytes: int = 1 << 20) -> list[pb.Envelope]:
    """Cut one encoded Entries into Envelopes whose encodings are at most `max_message_bytes` each."""
    if max_message_bytes <= _ENVELOPE_OVERHEAD:
        raise ValueError(f"max_message_bytes must exceed {_ENVELOPE_OVERHEAD}")
    chunk = max_message_bytes - _ENVELOPE_OVERHEAD
    if len(data) <= chunk:
        return [pb.Envelope(version=ENVELOPE_VERSION, total=1, index=0, data=data)]
    total = -(-len(data) // chunk)
    return [pb.Envelope(version=ENVELOPE_VERSION, total=total, index=i, data=data[i * chunk:(i + 1) * chunk])
            for i in range(total)]


# an Envelope's fields before its data when it is the only one: version, total 1 (index 0 is
# left out), then the tag of data (field 4, length-delimited)
_WHOLE_ENVELOPE = bytes((0x08, ENVELOPE_VERSION, 0x10, 1, 0x22))


def envelope_values(parts: list[bytes], max_message_bytes: int = 1 << 20) -> list[bytes]:
    """The encodings of `split_entries(b"".join(parts), max_message_bytes)`, byte for byte; when
    one Envelope holds the data, written in one join (no Envelope built, no copy of the data but
    the join's)."""
    if max_message_bytes <= _ENVELOPE_OVERHEAD:
        raise ValueError(f"max_message_bytes must exceed {_ENVELOPE_OVERHEAD}")
    size = sum(map(len, parts))
    if 0 < size <= max_message_bytes - _ENVELOPE_OVERHEAD:
        return [b"".join([_WHOLE_ENVELOPE, encode_varint(size), *parts])]
    return [env.SerializeToString() for env in split_entries(b"".join(parts), max_message_bytes)]


def pack_entries(entries: Iterable[pb.Entry], max_message_bytes: int = 1 << 20) -> Iterator[pb.Envelope]:
    """Merge consecutive Entry messages into Entries under the size limit, as the DTS producer does.

    An Entry too large for one message alone travels in its own Entries, split into segments.
    """
    budget = max_message_bytes - _ENVELOPE_OVERHEAD
    parts: list[bytes] = []
    size = 0
    for entry in entries:
        raw = entry.SerializeToString()
        item = b"\x0a" + encode_varint(len(raw)) + raw  # Entries.items, field 1, length-delimited
        if parts and size + len(item) > budget:
            yield from split_entries(b"".join(parts), max_message_bytes)
            parts, size = [], 0
        parts.append(item)
        size += len(item)
    if parts:
        yield from split_entries(b"".join(parts), max_message_bytes)


@dataclass(frozen=True)
class Assembled:
    """A complete Entries and where its segments came from."""
    entries: pb.Entries | LazyEntries  # LazyEntries from Reassembler(lazy=True)
    partition: object
    first_offset: int
    last_offset: int
    segments: int
    raws: list | None = None  # the bytes of each Entry (for the C fast path), when the extension split them


class LazyEntries:
    """An Entries whose bytes protobuf is known to parse (`valid_entries`), each Entry parsed only
    when asked for: `items` is a sequence over the Entries' item bytes."""

    __slots__ = ("items",)

    def __init__(self, raws: list[bytes]) -> None:
        self.items = _LazyItems(raws)


class _LazyItems(Sequence):
    __slots__ = ("_raws",)

    def __init__(self, raws: list[bytes]) -> None:
        self._raws = raws

    def __len__(self) -> int:
        return len(self._raws)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [pb.Entry.FromString(raw) for raw in self._raws[index]]
        return pb.Entry.FromString(self._raws[index])


@dataclass
class _Buffer:
    total: int
    first_offset: int
    next_index: int = 0
    chunks: list = field(default_factory=list)


@dataclass(frozen=True)
class Redelivered:
    """A TDSQL record whose `ps` is not above the last one seen for its shard: Kafka delivered it
    again (a producer retry); it is dropped and counted, never converted twice."""
    partition: object
    offset: int
    shard: str
    ps: int
    last: int


@dataclass(frozen=True)
class ResumedTail:
    """A TDSQL segment read again after a restart at a committed offset: the tail of an Entries
    that started before that offset and was handed out whole before the commit (the commit point
    is the first segment of the oldest open Entries, and other shards' Entries interleave past it).
    Dropped and counted, never an error."""
    partition: object
    offset: int
    shard: str


SHARD_HEADER = "ShardId"
SEQUENCE_HEADER = "ps"


def tdsql_headers(headers) -> tuple[str | None, str | None]:
    """(ShardId, ps) of a record's Kafka headers: confluent-kafka's list of (key, bytes), a dict,
    or Spark's array of (key, value) rows; (None, None) without them (MySQL, MariaDB, ...)."""
    if headers is None or len(headers) == 0:
        return None, None
    items = headers.items() if isinstance(headers, dict) else headers
    shard = ps = None
    for item in items:
        key, value = (item[0], item[1]) if not isinstance(item, dict) else (item.get("key"), item.get("value"))
        if key == SHARD_HEADER or key == SEQUENCE_HEADER:
            text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value
            if key == SHARD_HEADER:
                shard = None if text is None else str(text)
            else:
                ps = None if text is None else str(text)
    return shard, ps


class Reassembler:
    """Rebuilds Entries from Envelopes fed per partition in offset order (proto/subscribe.proto: `Envelope`).

    `feed` returns a list whose items are either an `Assembled` Entries or a `FramingError` /
    `DecodeError` describing what went wrong; the caller's error policy decides what to do with
    the errors. Every error's `count` says how many input Envelopes it disposes of, so that
    converted + rejected always accounts for the input.

    TDSQL's Kafka headers (`headers=` of `feed`): with a `ShardId`, segments are reassembled per
    (partition, ShardId), as Entries of different database shards interleave in one partition; a
    complete Entries is handed out only once every Entries that started before it in its partition
    is complete (or abandoned), so the output stays in first-segment order and no converted record
    starts after the commit point (`held_from`). `ps` (the shard's sequence, from 1, growing by one)
    not above the last seen is a redelivery: a `Redelivered` item, dropped; a gap is a FramingError
    naming the partition, the shard and both numbers (its count is the number of records lost, so
    input and rejected both show them), and any Entries of that shard still open is abandoned.
    """

    def __init__(self, lazy: bool = False) -> None:
        """`lazy`: an Entries the C extension knows protobuf parses comes as `LazyEntries`, each
        Entry parsed when asked for (for callers that read most Entries off their bytes)."""
        self._open: dict[object, _Buffer] = {}
        self._last_offset: dict[object, int] = {}
        self._ps: dict[tuple, int] = {}
        self._waiting: dict[object, list[Assembled]] = {}  # complete, behind an earlier open Entries
        self._sharded: set = set()  # partitions that carried a ShardId
        self._resumed: set = set()  # partitions read from a committed offset (`resume_at`)
        self._started: set = set()  # (partition, shard) whose first segment came since then
        self.lazy = lazy

    def resume_at(self, partition) -> None:
        """`partition` is read from a committed offset: a TDSQL shard's segments that come before
        its first first-segment there are tails of Entries handed out before the commit
        (`ResumedTail`), not errors."""
        self._resumed.add(partition)

    def forget(self, partition) -> None:
        """Drop everything held for `partition` (it went to another reader of the group, which reads
        it again from the committed offset): its open and waiting Entries, offsets and TDSQL state."""
        for key in [key for key in self._open if _partition_of(key) == partition]:
            del self._open[key]
        self._waiting.pop(partition, None)
        self._last_offset.pop(partition, None)
        for key in [key for key in self._ps if key[0] == partition]:
            del self._ps[key]
        self._started = {key for key in self._started if key[0] != partition}
        self._sharded.discard(partition)
        self._resumed.discard(partition)

    @property
    def open_partitions(self) -> list:
        return sorted({_partition_of(key) for key in self._open}, key=repr)

    def held_from(self, partition) -> int | None:
        """The first offset of `partition` not yet handed out whole: the commit must not pass it."""
        firsts = [buf.first_offset for key, buf in self._open.items() if _partition_of(key) == partition]
        firsts += [item.first_offset for item in self._waiting.get(partition, ())]
        return min(firsts) if firsts else None

    def held_segments(self) -> int:
        return sum(len(buf.chunks) for buf in self._open.values()) + \
            sum(item.segments for items in self._waiting.values() for item in items)

    def feed(self, partition, offset: int, value: bytes, headers=None) -> list:
        last = self._last_offset.get(partition)
        if last is not None and offset <= last:
            return [_error(FramingError, f"offset not after the previous one ({last})", partition, offset, 1)]
        self._last_offset[partition] = offset
        shard, ps = tdsql_headers(headers)
        results: list = []
        if shard is not None:
            self._sharded.add(partition)
            if ps is not None:
                if not (ps.isascii() and ps.isdigit()):  # (int() refuses other digits)
                    return [_error(FramingError, f"TDSQL header ps {ps!r} of shard {shard} is not a number",
                                   partition, offset, 1, shard=shard)]
                seq, seen = int(ps), self._ps.get((partition, shard))
                if seen is not None and seq <= seen:
                    return [Redelivered(partition, offset, shard, seq, seen)]
                self._ps[(partition, shard)] = seq
                if seen is not None and seq != seen + 1:
                    # counted as the records that never came, so that a skip policy's tally shows them
                    err = _error(FramingError, f"TDSQL shard {shard}: ps jumps from {seen} to {seq} "
                                 f"({seq - seen - 1} record(s) lost)", partition, offset, seq - seen - 1,
                                 shard=shard)
                    err.where.update(last_ps=seen, ps=seq)
                    results.append(err)
                    key = _ShardKey(partition, shard)
                    if key in self._open:
                        results.append(self._abandon(key, offset, f"TDSQL shard {shard}: Entries from offset "
                                                     f"{self._open[key].first_offset} lost segments in the ps gap"))
        key = partition if shard is None else _ShardKey(partition, shard)
        if shard is not None and partition in self._resumed and (partition, shard) not in self._started:
            env = pb.Envelope()
            try:
                env.ParseFromString(value)
            except (_PbDecodeError, TypeError):
                env = None
            if env is not None and env.version == ENVELOPE_VERSION and 0 < env.index < env.total \
                    and key not in self._open:
                results.append(ResumedTail(partition, offset, shard))
                return results
            self._started.add((partition, shard))
        results.extend(self._feed(key, partition, offset, value))
        if partition in self._sharded:
            results = self._in_order(partition, results)
        return results

    def _feed(self, key, partition, offset: int, value: bytes) -> list:
        results: list = []
        shard = key.shard if isinstance(key, _ShardKey) else None
        env = pb.Envelope()
        try:
            env.ParseFromString(value)
        except (_PbDecodeError, TypeError) as exc:
            return [_error(DecodeError, f"not an Envelope ({exc})", partition, offset, 1, value, shard=shard)]
        if env.version != ENVELOPE_VERSION:
            return [_error(FramingError, f"unsupported Envelope version {env.version}", partition, offset, 1, shard=shard)]
        if env.total == 0:
            return [_error(FramingError, "Envelope total is 0", partition, offset, 1, shard=shard)]
        if env.index >= env.total:
            return [_error(FramingError, f"Envelope index {env.index} not below total {env.total}",
                           partition, offset, 1, shard=shard)]
        buf = self._open.get(key)
        if env.index == 0:
            if buf is not None:
                results.append(self._abandon(key, offset,
                                             f"new first segment while segment {buf.next_index} of "
                                             f"{buf.total} (from offset {buf.first_offset}) was awaited"))
            buf = _Buffer(total=env.total, first_offset=offset)
        elif buf is None:
            return [_error(FramingError, f"segment {env.index} of {env.total} without its first segment",
                           partition, offset, 1, shard=shard)]
        elif env.total != buf.total:
            err = self._abandon(key, offset, f"segment of a different total ({env.total}, buffer has "
                                f"{buf.total}, from offset {buf.first_offset})", extra=1)
            return [err]
        elif env.index != buf.next_index:
            kind = "duplicated" if env.index < buf.next_index else "missing"
            err = self._abandon(key, offset, f"{kind} segment: expected index {buf.next_index} of "
                                f"{buf.total}, got {env.index} (buffer from offset {buf.first_offset})", extra=1)
            return [err]
        buf.chunks.append(env.data)
        buf.next_index += 1
        if buf.next_index < buf.total:
            self._open[key] = buf
            return results
        self._open.pop(key, None)
        data = env.data if buf.total == 1 else b"".join(buf.chunks)
        if self.lazy and valid_entries(data):
            raws = split_items(data)
            if raws is not None:
                results.append(Assembled(LazyEntries(raws), partition, buf.first_offset, offset, buf.total, raws))
                return results
        entries = pb.Entries()
        try:
            entries.ParseFromString(data)
        except _PbDecodeError as exc:
            err = _error(DecodeError, f"segments do not parse as Entries ({exc})", partition, offset,
                         buf.total, data, shard=shard)
            err.where.setdefault("first_offset", buf.first_offset)
            results.append(err)
            return results
        raws = split_items(data)
        if raws is not None and len(raws) != len(entries.items):
            raws = None
        results.append(Assembled(entries, partition, buf.first_offset, offset, buf.total, raws))
        return results

    def _in_order(self, partition, results: list) -> list:
        """Complete Entries wait behind any Entries of their partition that started earlier."""
        waiting = self._waiting.setdefault(partition, [])
        out = []
        for item in results:
            if isinstance(item, Assembled):
                waiting.append(item)
            else:
                out.append(item)
        if waiting:
            waiting.sort(key=lambda a: a.first_offset)
            opened = [buf.first_offset for key, buf in self._open.items() if _partition_of(key) == partition]
            floor = min(opened) if opened else None
            while waiting and (floor is None or waiting[0].first_offset < floor):
                out.append(waiting.pop(0))
        return out

    def finish(self) -> list:
        """End of input: every unfinished buffer is reported, never silently dropped; complete
        Entries still waiting behind them come after the errors."""
        errors: list = []
        for key, buf in list(self._open.items()):
            err = FramingError(f"unfinished Entries at end of input: {buf.next_index} of {buf.total} segments",
                               partition=_partition_of(key), offset=buf.first_offset,
                               shard=key.shard if isinstance(key, _ShardKey) else None)
            err.count = buf.next_index
            errors.append(err)
        self._open.clear()
        for partition in list(self._waiting):
            errors.extend(self._waiting.pop(partition))
        return errors

    def _abandon(self, key, offset: int, reason: str, extra: int = 0) -> FramingError:
        buf = self._open.pop(key)
        err = FramingError(reason, partition=_partition_of(key), offset=offset,
                           shard=key.shard if isinstance(key, _ShardKey) else None)
        err.count = len(buf.chunks) + extra
        return err

    # ---- the state a streaming job keeps between micro-batches (bridge/spark/streaming.py) -----

    def partition_state(self, partition) -> tuple:
        """(last offset, sharded, [(shard, ps)], [(shard or None, open buffer)], [waiting Assembled])."""
        return (self._last_offset.get(partition), partition in self._sharded,
                [(shard, seq) for (p, shard), seq in self._ps.items() if p == partition],
                [(key.shard if isinstance(key, _ShardKey) else None, buf) for key, buf in self._open.items()
                 if _partition_of(key) == partition],
                list(self._waiting.get(partition, ())))

    def restore_partition(self, partition, last, sharded, ps, open_, waiting) -> None:
        """The inverse of `partition_state`; `open_` holds (shard, total, first offset, next index, chunks)."""
        if last is not None:
            self._last_offset[partition] = last
        if sharded:
            self._sharded.add(partition)
        for shard, seq in ps:
            self._ps[(partition, shard)] = seq
        for shard, total, first, next_index, chunks in open_:
            key = partition if shard is None else _ShardKey(partition, shard)
            self._open[key] = _Buffer(total=total, first_offset=first, next_index=next_index, chunks=chunks)
        if waiting:
            self._waiting.setdefault(partition, []).extend(waiting)

    def open_buffers(self) -> list[tuple[object, str | None, _Buffer]]:
        """(partition, shard or None, buffer) of every open Entries."""
        return [(_partition_of(key), key.shard if isinstance(key, _ShardKey) else None, buf)
                for key, buf in self._open.items()]

    def last_offset(self, partition) -> int | None:
        return self._last_offset.get(partition)

    def drop_open(self, partition, shard: str | None) -> None:
        """Forget an open Entries (the caller made it a dead letter); `release` then hands out what
        waited behind it."""
        del self._open[partition if shard is None else _ShardKey(partition, shard)]

    def release(self, partition) -> list:
        """The complete Entries of a TDSQL (sharded) partition no open Entries holds back any more."""
        return self._in_order(partition, []) if partition in self._sharded else []


class _ShardKey(NamedTuple):
    partition: object
    shard: str


def _partition_of(key):
    return key.partition if isinstance(key, _ShardKey) else key


def _error(cls, reason: str, partition, offset: int, count: int, value=None, shard=None):
    err = cls(reason, value=value, partition=partition, offset=offset, shard=shard)
    err.count = count
    return err


# ---- .pb streams: varint-length-delimited Envelopes -------------------------------------------

def write_pb(out: BinaryIO, envelopes: Iterable[pb.Envelope | bytes]) -> int:
    """Write Envelopes (messages or their encodings) with varint length prefixes; returns the count."""
    n = 0
    for env in envelopes:
        raw = env if isinstance(env, (bytes, bytearray)) else env.SerializeToString()
        out.write(encode_varint(len(raw)))
        out.write(raw)
        n += 1
    return n


def iter_pb_messages(stream: BinaryIO, source: str | None = None) -> Iterator[tuple[int, int, bytes]]:
    """Yield (message number, byte position, raw message) from a delimited stream.

    Any object with `read(size)` will do; an unbuffered raw stream is buffered here and left open.
    A truncated length prefix or body, or a length beyond protobuf's 2 GiB limit, raises
    DecodeError naming the message number and byte position.
    """
    raw = isinstance(stream, io.RawIOBase)
    reader = io.BufferedReader(stream) if raw else stream
    try:
        yield from _delimited(reader.read, source)
    finally:
        if raw:
            reader.detach()  # closing the wrapper would close the caller's stream


def _delimited(read, source: str | None) -> Iterator[tuple[int, int, bytes]]:
    number = 0
    pos = 0
    while True:
        first = read(1)
        if not first:
            return
        start = pos
        length = 0
        shift = 0
        byte = first[0]
        pos += 1
        while True:
            length |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 63:
                raise DecodeError("varint length prefix longer than 10 bytes", message=number,
                                  byte=start, source=source)
            nxt = read(1)
            if not nxt:
                raise DecodeError("truncated length prefix", message=number, byte=start, source=source)
            byte = nxt[0]
            pos += 1
        if length > _MAX_MESSAGE_BYTES:
            raise DecodeError(f"length prefix {length} beyond protobuf's 2 GiB message limit",
                              message=number, byte=start, source=source)
        body = _read_exact(read, length)
        if len(body) != length:
            raise DecodeError(f"truncated message: {len(body)} of {length} bytes", message=number,
                              byte=start, source=source)
        pos += length
        yield number, start, body
        number += 1


def _read_exact(read, size: int) -> bytes:
    # Streams may return short reads before the end; bounded chunks keep a bogus length from
    # allocating its size up front.
    parts = []
    while size > 0:
        part = read(min(size, _READ_CHUNK))
        if not part:
            break
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def read_pb(path_or_stream, source: str | None = None) -> Iterator[tuple[int, int, bytes]]:
    """Open a `.pb` file (or use a binary stream) and yield (number, byte position, raw Envelope)."""
    if isinstance(path_or_stream, (str, os.PathLike)):
        with open(path_or_stream, "rb") as fh:
            yield from iter_pb_messages(fh, source or os.fspath(path_or_stream))
    else:
        yield from iter_pb_messages(path_or_stream, source)


# ---- dts-json: one Entry per line, protobuf canonical JSON --------------------------------------

def entry_to_json_line(entry: pb.Entry) -> bytes:
    return orjson.dumps(json_format.MessageToDict(entry)) + b"\n"


def entry_from_json_line(line: bytes | str, line_number: int | None = None, source: str | None = None) -> pb.Entry:
    if isinstance(line, BridgeError):  # what read_dts_json gives for a line over max_line_bytes
        raise line
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON ({exc.msg})", value=line, line=line_number,
                          column_number=exc.colno, source=source) from None
    entry = pb.Entry()
    try:
        json_format.ParseDict(obj, entry)
    except (json_format.ParseError, TypeError, ValueError, AttributeError) as exc:
        raise DecodeError(f"not an Entry in protobuf JSON ({exc})", value=line, line=line_number,
                          source=source) from None
    return entry


def write_dts_json(out: BinaryIO, entries: Iterable[pb.Entry]) -> int:
    n = 0
    for entry in entries:
        out.write(entry_to_json_line(entry))
        n += 1
    return n


def read_dts_json(path_or_stream, source: str | None = None, max_line_bytes: int | None = None
                  ) -> Iterator[tuple[int, bytes | LineTooLongError]]:
    """Yield (1-based line number, raw line) for each non-blank line; parse with entry_from_json_line.
    A line over `max_line_bytes` (default DEFAULT_MAX_LINE_BYTES) comes as its LineTooLongError."""
    if isinstance(path_or_stream, (str, os.PathLike)):
        with open(path_or_stream, "rb") as fh:
            yield from read_dts_json(fh, source or os.fspath(path_or_stream), max_line_bytes)
        return
    yield from read_lines(path_or_stream, max_line_bytes, source)


DEFAULT_MAX_LINE_BYTES = 16 << 20  # Options.max_line_bytes (the reason is there)
_PAST_CHUNK = 1 << 20  # a line over the limit is read past this many bytes at a time
_HEAD = 4096  # what a LineTooLongError keeps of its line (a rejects file shows as much)


def read_lines(stream, max_line_bytes: int | None = None, source: str | None = None
               ) -> Iterator[tuple[int, bytes | LineTooLongError]]:
    """(1-based line number, line) of each non-blank line of JSON Lines input. A line longer than
    `max_line_bytes` (default DEFAULT_MAX_LINE_BYTES; its line break aside) comes as (number,
    LineTooLongError naming the line): at most `max_line_bytes + 1` bytes of it are read at once
    and the rest is read past in chunks, so a huge line costs no more memory than the limit."""
    limit = DEFAULT_MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    readline = getattr(stream, "readline", None)
    if readline is None:  # an iterable of lines, already in memory
        for number, line in enumerate(stream, 1):
            length = len(line) - line.endswith(b"\n" if isinstance(line, bytes) else "\n")
            if length > limit:
                yield number, _too_long(line[:_HEAD], length, limit, number, source)
            elif line.strip():
                yield number, line
        return
    number = 0
    while True:
        line = readline(limit + 1)
        if not line:
            return
        number += 1
        newline = b"\n" if isinstance(line, bytes) else "\n"
        if len(line) > limit and not line.endswith(newline):
            head, length = line[:_HEAD], len(line)
            del line
            while True:
                piece = readline(_PAST_CHUNK)
                length += len(piece)
                if not piece or piece.endswith(newline):
                    break
            length -= 1 if piece else 0  # the line break
            yield number, _too_long(head, length, limit, number, source)
        elif line.strip():
            yield number, line


def _too_long(head, length: int, limit: int, number: int, source: str | None) -> LineTooLongError:
    head = head.encode("utf-8", "replace") if isinstance(head, str) else bytes(head)
    return LineTooLongError(f"line of {length} bytes is longer than max_line_bytes ({limit})", head=head,
                            length=length, line=number, source=source)
