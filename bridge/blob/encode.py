"""DTS Entry -> DataHub Blob messages (docs/mapping.md).

One Entry gives zero or more messages: a DML event one per row change (an update two, sharing a
sequenceId), every other kind one, checkpoints and rollbacks one only in lossless mode. In lossless
mode (the default) each message carries a top-level `"dts"` key holding what DataHub cannot say,
so that `blob_decode` rebuilds the Entry byte for byte.

This module is the encoder's core: `BlobEncoder`'s public forms, the mode an Entry's
reserved-prefix properties are read in, the kinds of Entry and the streaming of large ones. Its
parts live beside it: the per-message writer (bridge/blob/messages.py), the C fast path for plain
DML Entries (fastpath.py), the reserved-prefix facts and `facts_hold` (facts.py), and the `dts`
extension's writer (extension.py).

>>> from bridge import pb
>>> e = pb.Entry(header=pb.Header(messageType=pb.HEARTBEAT, timestamp=1605339932, seqId=9))
>>> _ = e.event.heartbeatEvent.SetInParent()
>>> entry_to_blob(e, Options(strict=True))
[{'schema': {}, 'payload': {'op': 'MHEARTBEAT', 'sequenceId': '9000000', 'timestamp': {'eventTime': 1605339932000, 'checkpointTime': 1605339932000}}, 'version': '0.0.1'}]
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson

from bridge.blob.extension import (
    _DEFAULT_HEADER,
    _DEFAULT_HEADER_NO_SOURCE,
    _ext_header,
    _message_fields,
    _unknown_parts,
    unknown_fields,
    wire_ext_header,
)
from bridge.blob.facts import _SPLITS, _kv, _Reserved, facts_hold, read_back_with, write_with
from bridge.blob.fastpath import FastPath
from bridge.blob.messages import MessageWriter, _apply_shape_facts
from bridge.blob.rows import NATIVE
from bridge.blob.shape import FORMAT_VERSION
from bridge.errors import BridgeError, ConversionError
from bridge.native.contract import SinkTable
from bridge.options import DEFAULT_OPTIONS, Options, per_options
from bridge.values import (
    CONTROL_MESSAGE_TYPES,
    EVENT_FIELDS,
    OPS_BY_MESSAGE_TYPE,
    ROW_DIGITS,
    ColumnSetCache,
    check_dml_event,
    check_row_images,
    ddl_op,
    sequence_id,
)
from bridge.wire import subscribe_pb2 as pb

__all__ = ["entry_to_blob", "entries_to_blob", "BlobEncoder", "encode_blob", "shard_key", "check_dml_event",
           "check_row_images", "unknown_fields",
           "sequence_id", "ROW_DIGITS", "EVENT_FIELDS", "FORMAT_VERSION",
           # (named here since before the encoder's parts had modules of their own)
           "facts_hold", "read_back_with", "wire_ext_header", "LINE_BUDGET"]

_DML = int(pb.DML)


def encode_blob(msg: dict) -> bytes:
    """Compact UTF-8 JSON of a Blob message; keys keep the order the converter built them in."""
    return orjson.dumps(msg)


def shard_key(msg: dict) -> str:
    """DataWorks' sharding rule: primary-key values when the table has a key, else the table name."""
    schema = msg.get("schema") or {}
    source = schema.get("source") or {}
    keys = schema.get("primaryKey") or []
    payload = msg.get("payload") or {}
    image = (payload.get("after") or payload.get("before") or {}).get("dataColumn") or {}
    if keys and image:
        return orjson.dumps([image.get(k) for k in keys]).decode()
    return f"{source.get('dbName', '')}.{source.get('tableName', '')}"


def _column_length(columns: tuple[list, ...]) -> int:
    return len(columns[0])


LINE_BUDGET = 64 << 20  # bytes of one Entry's lines `stream_lines` holds before it streams them
_PIECE_BYTES = 4 << 20  # a streamed Entry is converted in pieces of rows of about this many bytes
_FIRST_PIECE = 16  # rows of its first piece, which sizes the next


def _next_step(rows: int, piece: list, limit: int) -> int:
    """Rows for the next piece, from the bytes of the last one."""
    size = sum(map(len, piece)) or 1
    return max(1, min(limit, rows * _PIECE_BYTES // size))


@dataclass
class _Rows:
    """The rows of a streamed DML Entry one call of `_convert` converts, and what the first such
    call in Python works out once for the whole Entry: its row images checked, its unknown fields."""
    first: int
    stop: int
    checked: bool = False
    unknown: Any = None


class _Streamed:
    """The lines of one large Entry (`stream_lines`): len() is their number, and iterating converts
    them again, piece by piece, as the writer takes them (a first pass found them whole)."""

    def __init__(self, encoder: BlobEncoder, entry: pb.Entry, raw: bytes | None, count: int) -> None:
        self._encoder, self._entry, self._raw, self._count = encoder, entry, raw, count

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[bytes]:
        header = self._entry.header
        try:
            for piece in self._encoder._pieces(self._entry, header, self._raw):
                yield from piece
        except BridgeError as exc:  # not expected: the first pass went through the same steps
            raise exc.located(seq_id=header.seqId, table=_table_name(header))


class BlobEncoder(FastPath, MessageWriter):
    """Stream-level DTS -> Blob converter: caches column codecs per column set and counts output.

    `emitted` counts messages, `not_emitted` counts entries that give none, by reason.
    """

    def __init__(self, options: Options = DEFAULT_OPTIONS, line_budget: int = LINE_BUDGET, _mode: str = "ask") -> None:
        # _mode: what reserved-prefix (`datahub:`) properties of an Entry are. "ask" (every encoder
        # made from outside): an Entry holding one is decided whole by `_decide`, which hands it to
        # a twin of mode "facts" (the bridge's own DataHub facts: they shape the message) or
        # "plain" (the Entry's own properties: they travel in the extension like any other)
        self._mode = mode = _mode
        self._split = _SPLITS[mode]
        self._twins: dict = {}
        self.options = options
        self.line_budget = line_budget  # bytes of one Entry's lines stream_lines holds at most
        self.emitted = 0
        self.entries = 0
        self.not_emitted: Counter = Counter()
        self._tables = ColumnSetCache(self._build_table)
        self._sources: dict = {}  # (sourceType, schema, table) -> schema.source dict (shared, never mutated)
        # C fast path: (columns bytes, sourceType, schema, table) -> (_TableCodec, schema dict)
        self._wire_tables: dict = {}
        # `_plain` in the forms convert_lines and convert_columns call through `_run`
        self._dml_lines = partial(self._plain, form="lines")
        self._dml_columns = partial(self._plain, form="columns")
        self._convert_rest = partial(self._convert, plain_tried=True)  # `_plain` gave None already

    # -- public ------------------------------------------------------------------------------
    def convert(self, entry: pb.Entry, raw: bytes | None = None) -> list[dict]:
        """The Blob messages of one Entry. `raw`, the Entry's own encoding when the caller has it,
        lets the C fast path read the row images off the wire; the result is the same without it."""
        return self._run(self._convert, entry, raw)

    def convert_lines(self, entry: pb.Entry, raw: bytes | None = None) -> list[bytes]:
        """`encode_blob` of each message of `convert(entry, raw)`, the same bytes. With `raw`, a plain
        DML Entry is written straight to JSON lines in C from templates cached per table."""
        if raw is not None and NATIVE and entry.header.messageType == _DML:
            out = self._run(self._dml_lines, entry, raw)
            if out is not None:
                return out
        return [orjson.dumps(m) for m in self._run(self._convert, entry, raw)]

    def stream_lines(self, entry: pb.Entry, raw: bytes | None = None) -> list[bytes] | _Streamed:
        """The lines of `convert_lines(entry, raw)` for a writer that takes them one by one (the CLI's
        `convert`), without holding those of one Entry at once: Blob repeats the schema in every
        message, so a small Entry of many rows (or wide columns) can give gigabytes of lines. An
        Entry whose lines could pass `line_budget` bytes is converted in pieces of rows: a first pass
        raises any error before a line is given (an Entry is converted whole or not at all) and
        keeps the lines if they stay under the budget; otherwise the result is a sized iterable
        that converts them again, piece by piece, as they are taken (docs/decisions.md)."""
        if entry.header.messageType == _DML:
            rows = len(entry.event.dmlEvent.rows)
            size = len(raw) if raw is not None else entry.ByteSize()
            # a message is at most its schema and image, each a few times the Entry's bytes
            if 2 * rows * (24 * size + 4096) > self.line_budget:
                return self._run(self._stream, entry, raw)
        return self.convert_lines(entry, raw)

    def convert_columns(self, entry: pb.Entry, raw: bytes | None = None) -> tuple[list, ...]:
        """The messages of `convert(entry, raw)` as columns, what the Spark transform writes: lists
        of sequenceId, op, dbName, tableName, shard key, eventTime in ms and JSON line, one item per
        message. Plain DML Entries with `raw` come from C (lines and shard keys), the rest from the
        dicts; the values are the same."""
        if raw is not None and NATIVE and entry.header.messageType == _DML:
            out = self._run(self._dml_columns, entry, raw, _column_length)
            if out is not None:
                return out
        return self._run(self._columns, entry, raw, _column_length)

    def sink_table(self, entry: pb.Entry, raw: bytes) -> SinkTable | None:
        """What `_speedups.Sink.entries` needs to write a plain DML Entry's table on its own (the
        contract's `SinkTable`: Plan, (pre, post) per dmlEventType, the extension's columns JSON,
        the shard key's column indexes, whether the columns are the foreign default, db, table, and
        the table's shard key, as UTF-8), the same parts `convert_columns` takes from this encoder's
        caches; None for an Entry the C path does not take, or under `system_time` (which stamps
        each message)."""
        if not NATIVE or self.options.system_time or entry.header.messageType != _DML:
            return None
        found = self._wire_table(entry, entry.header, raw)
        if found is None:
            return None
        cached = found[0]
        source = cached.schema["source"]
        return SinkTable(plan=cached.table.native, templates=tuple(cached.templates(t) for t in range(3)),
                         ext_columns=cached.ext_columns_json, key_indexes=cached.key_indexes,
                         foreign_default=cached.table.foreign_default, db=source["dbName"].encode(),
                         table=source["tableName"].encode(), table_shard=cached.table_shard.encode())

    def _convert_serialised(self, entry: pb.Entry) -> list[dict]:
        """`convert(entry, entry.SerializeToString())` of a DML Entry (entry_to_blob's, under NATIVE):
        `_plain` first, then, when it gives None, `_convert` without trying it again; the same
        messages, errors and counts as `convert`."""
        raw = entry.SerializeToString()
        out = self._run(self._plain, entry, raw)
        return out if out is not None else self._run(self._convert_rest, entry, raw)

    def _run(self, method, entry: pb.Entry, raw: bytes | None, size=len):
        """Call a converter of one Entry: errors located at the Entry, output counted (`size`
        messages). An Entry holding reserved-prefix properties goes to the twin `_decide` names."""
        header = entry.header
        try:
            try:
                out = method(entry, header, raw)
            except _Reserved:
                twin = self._decide(entry, raw)
                try:
                    out = _rebind(method, twin)(entry, header, raw)
                finally:
                    if twin.not_emitted:
                        self.not_emitted.update(twin.not_emitted)
                        twin.not_emitted.clear()
        except BridgeError as exc:
            raise exc.located(seq_id=header.seqId, table=_table_name(header))
        except (ValueError, TypeError, OverflowError, UnicodeError) as exc:
            raise ConversionError(f"cannot convert entry ({exc})", seq_id=header.seqId,
                                  table=_table_name(header)) from exc
        if out is not None:
            self.entries += 1
            self.emitted += size(out)
        return out

    def _twin(self, mode: str, options: Options | None = None) -> BlobEncoder:
        key = (mode, options)
        twin = self._twins.get(key)
        if twin is None:
            twin = self._twins[key] = BlobEncoder(options or self.options, self.line_budget, _mode=mode)
        return twin

    def _decide(self, entry: pb.Entry, raw: bytes | None) -> BlobEncoder:
        """The twin that converts an Entry holding reserved-prefix properties. They are the bridge's
        own DataHub facts only where the bridge writes them and as it writes them: when the
        messages that read them as facts decode (lossless) back to this very Entry, byte for byte.
        Anything else (a `datahub:` key on a header of a DML Entry, an unknown one, a value the
        bridge would not write) makes every such property of the Entry an ordinary one, carried in
        the extension like any other, so DTS -> Blob -> DTS is exact either way (docs/decisions.md,
        "Reserved-prefix properties in DTS input")."""
        return self._twin("facts") if facts_hold(entry, raw, self.options) else self._twin("plain")

    # -- entry kinds -------------------------------------------------------------------------
    def _convert(self, entry: pb.Entry, header: pb.Header, raw: bytes | None, rows: _Rows | None = None,
                 plain_tried: bool = False) -> list[dict]:
        """The messages of an Entry; with `rows` (stream_lines), only those of a DML Entry's rows
        rows.first to rows.stop (the Entry-level checks made once, by the first such call).
        `plain_tried`: `_plain` gave None for this Entry already."""
        mtype = header.messageType
        if mtype == _DML and raw is not None and NATIVE and rows is None and not plain_tried:
            out = self._plain(entry, header, raw)
            if out is not None:
                return out
        if mtype not in EVENT_FIELDS:
            raise ConversionError(f"unknown MessageType {mtype}")
        event_field = EVENT_FIELDS[mtype]
        present = [fd.name for fd, _ in entry.event.ListFields() if fd.name != "properties"]
        if present and present != [event_field]:
            raise ConversionError(f"event carries {', '.join(present)} but messageType is "
                                  f"{pb.MessageType.Name(mtype)}")
        if mtype in CONTROL_MESSAGE_TYPES and not self.options.emit_control:
            self.not_emitted[pb.MessageType.Name(mtype)] += 1
            return []
        if mtype == _DML:
            return self._dml(entry, header, raw, rows)
        sub = getattr(entry.event, event_field)
        with_source = mtype == pb.DDL
        op = ddl_op(sub.sql) if mtype == pb.DDL else OPS_BY_MESSAGE_TYPE[mtype]
        plain_props, facts = self._split(header.properties)
        payload = {"op": op, "sequenceId": facts.get("sequenceId") or sequence_id(header.seqId)}
        if payload["sequenceId"] == "none":
            del payload["sequenceId"]  # a DataWorks heartbeat has none
        payload["timestamp"] = self._timestamp(header, facts)
        schema = {"source": self._source(header, facts)} if with_source else {}
        if mtype == pb.DDL:
            ddl = {"text": sub.sql}
            if "ddlMeta" in facts:
                ddl["ddlMeta"] = facts["ddlMeta"]
            payload["ddl"] = ddl
        msg = {"schema": schema, "payload": payload}
        self._version(msg, facts)
        if facts:
            _apply_shape_facts(msg, facts)
        if self.options.lossless:
            ext = {"header": _ext_header(header, plain_props, with_source)}
            event = _message_fields(sub, skip=("sql",))
            ev_plain = _kv(entry.event.properties)
            if ev_plain:
                event["properties"] = ev_plain
            if not entry.event.HasField(event_field):  # the message says nothing of it: the extension does
                event["absent"] = "sub" if entry.HasField("event") else "event"
            if event:
                ext["event"] = event
            found = unknown_fields(entry, raw, self._mode != "plain")
            if found:
                ext["unknown"] = _unknown_parts(found)[0]
            # An extension saying only what a message without one decodes to is left out.
            if ext != {"header": _DEFAULT_HEADER if with_source else _DEFAULT_HEADER_NO_SOURCE}:
                msg["dts"] = ext
        return [msg]

    def _dml(self, entry: pb.Entry, header: pb.Header, raw: bytes | None = None, rows: _Rows | None = None
             ) -> list[dict]:
        """The messages of a DML Entry, every value converted in Python (`_messages`); with `rows`
        (stream_lines), those of its rows rows.first to rows.stop."""
        dml = entry.event.dmlEvent
        if not check_dml_event(dml):
            self.not_emitted["DML without rows"] += 1
            return []
        table = self._tables.get(dml.columns, (header.schemaName, header.tableName))
        if table.reserved and self._mode == "ask":
            raise _Reserved
        lossless = self.options.lossless
        plain_props, facts = self._split(header.properties)
        source = self._source(header, facts)
        schema = {"dataColumn": table.schema_columns, "primaryKey": table.primary_key, "source": source}
        stamp = self._timestamp(header, facts)
        if rows is None:
            check_row_images(dml)
            unknown = _unknown_parts(unknown_fields(entry, raw, self._mode != "plain")) if lossless else None
            first, stop = 0, len(dml.rows)
        else:  # a slice of a streamed Entry: its first slice in Python checks the images from there
            if not rows.checked:
                check_row_images(dml, rows.first)
                rows.checked = True
                if lossless:
                    rows.unknown = _unknown_parts(unknown_fields(entry, raw, self._mode != "plain"))
            unknown, first, stop = rows.unknown, rows.first, rows.stop
        if unknown is not None and not (unknown[0] or unknown[1]):
            unknown = None
        ext_base = None
        if lossless:
            ext_base = {"header": _ext_header(header, plain_props, True)}
            ev_plain = _kv(entry.event.properties)
            if ev_plain:
                ext_base["event"] = {"properties": ev_plain}
            ext_base["columns"] = table.ext_columns
        return self._messages(entry, header, table, schema, dml.dmlEventType, first, stop, stamp, ext_base,
                              facts, unknown)

    def _pieces(self, entry: pb.Entry, header: pb.Header, raw: bytes | None) -> Iterator[list[bytes]]:
        """The lines of a DML Entry in pieces of rows, in order, each of about _PIECE_BYTES: C writes
        pieces while it takes them (`Plan.lines` from a resume point), Python the rest. The same
        lines, and the same first error, as `convert_lines` (the Entry-level checks come first)."""
        nrows = len(entry.event.dmlEvent.rows)
        first, step = 0, _FIRST_PIECE
        found = self._wire_layout(entry, header, raw) if raw is not None and NATIVE else None
        if found is not None:
            native, args, resume = found[0].table.native, found[3], None
            while first < nrows:
                stop = min(nrows, first + step)
                got = native.lines(*args, None, resume, stop)
                if got is None:
                    break  # a row C is not sure of: Python writes it and every row after it
                piece, resume = got
                yield piece
                step = _next_step(stop - first, piece, nrows)
                first = stop
        rows = _Rows(first, first)
        while rows.first < nrows:
            rows.stop = min(nrows, rows.first + step)
            piece = [orjson.dumps(m) for m in self._convert(entry, header, raw, rows)]
            yield piece
            step = _next_step(rows.stop - rows.first, piece, nrows)
            rows.first = rows.stop

    def _stream(self, entry: pb.Entry, header: pb.Header, raw: bytes | None) -> list[bytes] | _Streamed:
        """stream_lines' conversion of a large DML Entry: a first pass over all its pieces, which
        raises what `convert_lines` raises and holds at most `line_budget` bytes of lines (then
        they are the result); past that, a second pass writes them as they are taken."""
        held: list | None = []
        size = count = 0
        for piece in self._pieces(entry, header, raw):
            count += len(piece)
            if held is not None:
                held += piece
                size += sum(map(len, piece))
                if size > self.line_budget:
                    held = None  # checked to the end, then written again piece by piece
        if held is not None:
            return held
        return _Streamed(self, entry, raw, count)

    def _columns(self, entry: pb.Entry, header: pb.Header, raw: bytes | None) -> tuple[list, ...]:
        """The dict path of `convert_columns`."""
        out: tuple[list, ...] = ([], [], [], [], [], [], [])
        seqs, ops, dbs, tables, shards, times, lines = out
        for msg in self._convert(entry, header, raw):
            payload = msg["payload"]
            source = (msg.get("schema") or {}).get("source") or {}
            seqs.append(payload["sequenceId"])
            ops.append(payload["op"])
            dbs.append(source.get("dbName"))
            tables.append(source.get("tableName"))
            shards.append(shard_key(msg))
            times.append(payload["timestamp"]["eventTime"])
            lines.append(encode_blob(msg))
        return out


def _rebind(method, twin: BlobEncoder):
    """The same converter (a bound method, or a partial of one) on another encoder."""
    if isinstance(method, partial):
        return partial(getattr(twin, method.func.__name__), *method.args, **method.keywords)
    return getattr(twin, method.__name__)


def _table_name(header: pb.Header) -> str | None:
    if header.schemaName or header.tableName:
        return f"{header.schemaName}.{header.tableName}"
    return None


def entry_to_blob(entry: pb.Entry, options: Options = DEFAULT_OPTIONS) -> list[dict]:
    """Blob messages of one Entry (a list: an update gives two, a checkpoint in strict mode none).
    A DML Entry is serialised once so that the C fast path reads its rows off the wire: the same
    messages as `BlobEncoder.convert(entry, raw)`, with fewer steps between (`_convert_serialised`)."""
    if NATIVE and entry.header.messageType == _DML:
        return _encoder(options)._convert_serialised(entry)
    return _encoder(options).convert(entry)


def _wire_bytes(entry: pb.Entry) -> bytes | None:
    """The bytes the C path reads a DML Entry from (protobuf writes the same fields it holds)."""
    return entry.SerializeToString() if NATIVE and entry.header.messageType == _DML else None


def entries_to_blob(entries: Iterable[pb.Entry], options: Options = DEFAULT_OPTIONS) -> Iterator[dict]:
    """Blob messages of a stream of Entries, in order, sharing one encoder's caches."""
    encoder = BlobEncoder(options)
    for entry in entries:
        yield from encoder.convert(entry, _wire_bytes(entry))


_encoder = per_options(BlobEncoder)
write_with(_encoder)  # facts_hold's encoder (bridge.blob.facts cannot import this module)
