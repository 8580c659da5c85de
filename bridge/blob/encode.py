"""DTS Entry -> DataHub Blob messages (docs/mapping.md).

One Entry gives zero or more messages: a DML event one per row change (an update two, sharing a
sequenceId), every other kind one, checkpoints and rollbacks one only in lossless mode. In lossless
mode (the default) each message carries a top-level `"dts"` key holding what DataHub cannot say,
so that `blob_decode` rebuilds the Entry byte for byte.

>>> from bridge import pb
>>> e = pb.Entry(header=pb.Header(messageType=pb.HEARTBEAT, timestamp=1605339932, seqId=9))
>>> _ = e.event.heartbeatEvent.SetInParent()
>>> entry_to_blob(e, Options(strict=True))
[{'schema': {}, 'payload': {'op': 'MHEARTBEAT', 'sequenceId': '9000000', 'timestamp': {'eventTime': 1605339932000, 'checkpointTime': 1605339932000}}, 'version': '0.0.1'}]
"""
from __future__ import annotations

import base64
import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson

from bridge.blob.rows import (
    MISSES,
    NATIVE,
    compile_image,
    known_fields,
    native_plan,
)
from bridge.errors import BridgeError, ConversionError
from bridge.native import speedups
from bridge.native.contract import SinkTable
from bridge.options import DEFAULT_OPTIONS, Options, per_options
from bridge.values import (
    CONTROL_MESSAGE_TYPES,
    DML_IMAGES,
    DML_OPS,
    EVENT_FIELDS,
    FOREIGN_COLUMN_TYPES,
    OP_IMAGES,
    OPS_BY_MESSAGE_TYPE,
    RESERVED_PREFIX,
    ROW_DIGITS,
    SOURCE_TYPES,
    ColumnSetCache,
    Inexact,
    Substituted,
    check_dml_event,
    check_row_images,
    codec_for,
    data_to_raw,
    ddl_op,
    note_substitution,
    sequence_id,
)
from bridge.wire import subscribe_pb2 as pb

__all__ = ["entry_to_blob", "entries_to_blob", "BlobEncoder", "encode_blob", "shard_key", "check_dml_event",
           "check_row_images", "unknown_fields",
           "sequence_id", "ROW_DIGITS", "EVENT_FIELDS", "FORMAT_VERSION"]

FORMAT_VERSION = "0.0.1"
_ROW_SCALE = 10 ** ROW_DIGITS
_NIL, _NA = int(pb.NIL), int(pb.NA)
# What a message without the extension decodes to (blob_decode): the extension is then left out.
_DEFAULT_HEADER = {"version": 1}
_DEFAULT_HEADER_NO_SOURCE = {"version": 1, "sourceType": int(pb.MYSQL)}
_DML, _DDL = int(pb.DML), int(pb.DDL)
# DMLType -> the Blob payload keys of its messages' images (values.DML_IMAGES), as C's Plan.messages takes them
_IMAGE_KEYS = {dml_type: tuple(i.image for i in images) for dml_type, images in DML_IMAGES.items()}
_MIN_EVENT_TIME, _MAX_EVENT_TIME = 10 ** 12, 10 ** 13 - 1  # the format's 13-digit epoch milliseconds

# Header fields the documented envelope expresses (the rest travel in dts.header).
_HEADER_IN_ENVELOPE = {"messageType", "timestamp", "seqId"}
_HEADER_IN_SOURCE = {"schemaName", "tableName", "sourceType"}


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


def _kv(props) -> list:
    return [[p.key, p.value] for p in props]


_NO_PROPS: tuple = ([], {})
_NO_FACTS: dict = {}


def _split_props(props) -> tuple[list, dict]:
    """(ordinary KVPairs, DataHub facts) of a properties list (an encoder of mode "facts")."""
    if not props:
        return _NO_PROPS
    plain, facts = [], {}
    for p in props:
        if p.key.startswith(RESERVED_PREFIX):
            facts[p.key[len(RESERVED_PREFIX):]] = p.value
        else:
            plain.append([p.key, p.value])
    return plain, facts


def _all_plain(props) -> tuple[list, dict]:
    """`_split_props` of an encoder of mode "plain": every pair is the Entry's own."""
    return (_kv(props), _NO_FACTS) if props else _NO_PROPS


class _Reserved(Exception):
    """An Entry holds reserved-prefix properties: whether they are the bridge's facts is decided
    for the whole Entry (`BlobEncoder._decide`)."""


def _ask_props(props) -> tuple[list, dict]:
    """`_split_props` of an encoder of mode "ask": a reserved-prefix key asks for the decision."""
    if not props:
        return _NO_PROPS
    for p in props:
        if p.key.startswith(RESERVED_PREFIX):
            raise _Reserved
    return _kv(props), _NO_FACTS


_SPLITS = {"ask": _ask_props, "facts": _split_props, "plain": _all_plain}


def _message_fields(msg, skip=()) -> dict:
    """Non-default scalar fields of a protobuf message, JSON-ready (KVPair lists as [[k, v]])."""
    out = {}
    for fd, value in msg.ListFields():
        if fd.name in skip:
            continue
        out[fd.name] = _kv(value) if fd.name == "properties" else value
    return out


def _compile_fields(descriptor, skip) -> Callable:
    """`_message_fields(msg, skip)` for messages without properties, as one straight function:
    each scalar field read once, in field-number order (ListFields' order)."""
    lines = ["def fields(msg):", "    out = {}"]
    for fd in sorted(descriptor.fields, key=lambda f: f.number):
        if fd.name in skip:
            continue
        if fd.is_repeated or fd.message_type is not None:
            raise TypeError(f"{descriptor.name}.{fd.name} is not a scalar field")
        lines += [f"    v = msg.{fd.name}", "    if v:", f"        out[{fd.name!r}] = v"]
    lines.append("    return out")
    scope: dict = {}
    exec(compile("\n".join(lines), f"<fields of {descriptor.name}>", "exec"), scope)  # noqa: S102
    return scope["fields"]


# dts.header of a DML Entry without header properties (what _ext_header gives it)
wire_ext_header = _compile_fields(pb.Header.DESCRIPTOR, _HEADER_IN_ENVELOPE | _HEADER_IN_SOURCE | {"properties"})


def _wire_header(header: pb.Header, props: list | None) -> dict:
    """dts.header of a DML Entry whose header properties `props` hold no DataHub fact (`_ext_header`'s)."""
    out = wire_ext_header(header)
    if props:
        out["properties"] = props  # field 15: last, as ListFields orders it
    return out


def _plain_properties(header: pb.Header, all_plain: bool = False) -> list | None | bool:
    """The header's properties as [[key, value], ...] (None: none), or False when one has the
    reserved prefix (the dict path decides those), read in Python: where C's `header_properties` is
    not sure. `all_plain` (an encoder of mode "plain"): every pair is the Entry's own."""
    props = header.properties
    if not all_plain and any(p.key.startswith(RESERVED_PREFIX) for p in props):
        return False
    return _kv(props) or None


_VERSION_BYTES = FORMAT_VERSION.encode()


# ---- unknown protobuf fields: they survive DTS -> Blob -> DTS (docs/mapping.md, "The lossless `dts` extension")

# messages whose `properties` the extension splits into plain pairs and DataHub facts (which are
# rebuilt from their values): a pair's index in a path counts the plain pairs only
_FACTS_APART = frozenset(("Header", "RowChange"))


def unknown_fields(entry: pb.Entry, raw: bytes | None = None, facts_apart: bool = True) -> list[tuple[tuple, bytes]]:
    """The unknown fields protobuf keeps anywhere in an Entry, as (path, bytes): the path of the
    message holding them from the Entry down (field names and list indexes; () is the Entry) and
    their bytes as protobuf writes them (verbatim, in the order they came). `raw`, the Entry's
    bytes, lets C answer "none" without a walk; otherwise only subtrees that hold some are walked.

    >>> e = pb.Entry.FromString(b"\\x0a\\x02\\x08\\x01\\x30\\x05")  # header {version: 1}, field 6 = 5
    >>> unknown_fields(e)
    [((), b'0\\x05')]
    """
    if raw is not None and known_fields(raw) or _subtree_known(entry):
        return []
    out: list = []
    _walk_unknown(entry, (), out, _FACTS_APART if facts_apart else frozenset())
    return out


def _subtree_known(msg) -> bool:
    """Whether a message holds no unknown field at any depth."""
    if NATIVE:
        return known_fields(msg.SerializeToString(), msg.DESCRIPTOR.name)
    bare = type(msg)()
    bare.CopyFrom(msg)
    bare.DiscardUnknownFields()
    return bare.ByteSize() == msg.ByteSize()


def _own_unknown(msg) -> bytes:
    """The unknown fields of `msg` itself (not of its sub-messages): what is left once every
    known field is cleared, which protobuf writes verbatim."""
    bare = type(msg)()
    bare.CopyFrom(msg)
    for fd, _ in bare.ListFields():
        bare.ClearField(fd.name)
    return bare.SerializeToString()


def _walk_unknown(msg, path: tuple, out: list, apart: frozenset = _FACTS_APART) -> None:
    own = _own_unknown(msg)
    if own:
        out.append((path, own))
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        if not fd.is_repeated:
            if not _subtree_known(value):
                _walk_unknown(value, path + (fd.name,), out, apart)
            continue
        facts_apart = fd.name == "properties" and msg.DESCRIPTOR.name in apart
        index = 0
        for item in value:
            if facts_apart and item.key.startswith(RESERVED_PREFIX):
                continue  # a DataHub fact of the bridge's own: rebuilt, its unknown fields are not carried
            if not _subtree_known(item):
                _walk_unknown(item, path + (fd.name, index), out, apart)
            index += 1


_ROWS_PATH = ("event", "dmlEvent", "rows")


def _unknown_parts(found: list) -> tuple[dict, dict]:
    """`unknown_fields` as the extension carries them: ({path text: base64} of what the Entry holds
    once, {row index: [(path below the row, base64)]}). Path texts: "entry", "header", "event",
    "event.dmlEvent.columns.3", ...; a row's own are written "row", "row.newColumns.2", ..."""
    once: dict = {}
    rows: dict = {}
    for path, data in found:
        text = base64.b64encode(data).decode("ascii")
        if path[:3] == _ROWS_PATH and len(path) > 3:
            rows.setdefault(path[3], []).append((path[4:], text))
        else:
            once[".".join(map(str, path)) or "entry"] = text
    return once, rows


def _row_unknown(once: dict, rows: dict, index: int, op: str) -> dict:
    """The `dts.unknown` of one message of a DML row: the Entry's own, and the row's the message
    holds (an update's before half: its image's only; the after half the rest)."""
    out = dict(once)
    for below, text in rows.get(index, ()):
        image = below[0] if below else None
        if op == "UPDATE_BEFOR" and image != "oldColumns" or op == "UPDATE_AFTER" and image == "oldColumns":
            continue
        out[".".join(("row",) + tuple(map(str, below)))] = text
    return out


class _WireTable:
    """What the C fast path keeps per column set and source: the codecs, the schema dict, and the
    JSON templates of the lines around each op's dataColumn."""

    __slots__ = ("table", "schema", "ext_columns_json", "key_indexes", "table_shard", "_templates")

    def __init__(self, table: _TableCodec, schema: dict) -> None:
        self.table = table
        self.schema = schema
        self.ext_columns_json = b",\"columns\":" + orjson.dumps(table.ext_columns)
        # shard_key: the primary-key columns' values, else "db.table"
        self.key_indexes = tuple(table.names.index(k) for k in table.primary_key)
        source = schema["source"]
        self.table_shard = f"{source.get('dbName', '')}.{source.get('tableName', '')}"
        self._templates: dict = {}

    def templates(self, dml_type: int) -> tuple[tuple, tuple]:
        """(pre, post) per op of the DML type: the bytes before and after its dataColumn JSON."""
        found = self._templates.get(dml_type)
        if found is None:
            head = b"{\"schema\":" + orjson.dumps(self.schema) + b",\"payload\":{"
            ops = DML_OPS[dml_type]
            pre = tuple(head + orjson.dumps(OP_IMAGES[op].image) + b":{\"dataColumn\":" for op in ops)
            post = tuple(b"},\"op\":" + orjson.dumps(op) + b",\"sequenceId\":\"" for op in ops)
            found = self._templates[dml_type] = (pre, post)
        return found


@dataclass
class _TableCodec:
    """Per column set: names, codecs, the schema part and the extension's column part, built once."""
    names: list
    codecs: list
    schema_columns: list
    primary_key: list
    ext_columns: dict
    # (name, to_blob, Codec.charset, index) per column, for the hot loop (a value's charset other than
    # the codec's travels in dts.charsets; None: none does)
    columns: list = field(default_factory=list)
    foreign_default: bool = False  # the columns are what a message without extension decodes to
    fast_image: Any = None  # compiled converter of canonical images (blob_rows), built when first needed
    native: Any = None  # C converter of canonical images on an Entry's bytes (blob_rows.native_plan)
    reserved: bool = False  # a column property has the reserved prefix (mode "ask": decided per Entry)

    def plain_extension_redundant(self, nrows: int, ext_header: dict) -> bool:
        """Whether an extension of only header, columns and row says nothing beyond what a
        message without one decodes to (then it is left out): foreign-default columns, a
        one-row event, the default header."""
        return self.foreign_default and nrows == 1 and ext_header == _DEFAULT_HEADER


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


class BlobEncoder:
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
            ext = {"header": self._ext_header(header, plain_props, with_source)}
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
            ext_base = {"header": self._ext_header(header, plain_props, True)}
            ev_plain = _kv(entry.event.properties)
            if ev_plain:
                ext_base["event"] = {"properties": ev_plain}
            ext_base["columns"] = table.ext_columns
        return self._messages(entry, header, table, schema, dml.dmlEventType, first, stop, stamp, ext_base,
                              facts, unknown)

    def _messages(self, entry: pb.Entry, header: pb.Header, table: _TableCodec, schema: dict, dml_type: int,
                  first: int, stop: int, stamp: dict, ext_base: dict | None, facts: dict = _NO_FACTS,
                  unknown: tuple | None = None, images: list | None = None) -> list[dict]:
        """The one Python writer of DML messages: the message dicts of rows `first` to `stop` of a
        DML Entry, one per op of its DML type (values.DML_IMAGES), in order.

        `images` (C's `Plan.rows` of a plain Entry) gives each image as its dataColumn dict, as
        (dataColumn, raws, charsets) when its values need the extension, or None: converted here
        (`_image`), as every image is without it. `facts` (the header's DataHub facts) and each
        row's properties shape the messages of foreign Entries (a plain Entry has neither);
        `ext_base` is the extension every message shares (None: strict), `unknown` the unknown
        fields it carries (`_unknown_parts`)."""
        lossless = ext_base is not None
        ops = DML_IMAGES[dml_type]
        all_rows = entry.event.dmlEvent.rows
        nrows = len(all_rows)
        # an extension saying only header, columns and row is left out when it says nothing new
        quiet = lossless and table.plain_extension_redundant(nrows, ext_base["header"])
        seq_base = header.seqId * _ROW_SCALE
        plain = images is not None  # C's scan found no row properties
        out: list = []
        n = 0
        for index in range(first, stop):
            row = None if plain else all_rows[index]
            row_plain = own_facts = None
            if row is not None and row.properties:
                row_plain, own_facts = self._split(row.properties)
            row_facts = {**facts, **own_facts} if own_facts else facts
            row_schema, row_stamp = schema, stamp
            if own_facts:
                row_schema = {**schema, "source": self._source(header, row_facts)}
                row_stamp = self._timestamp(header, row_facts)
            seq = (row_facts.get("sequenceId") if row_facts else None) or str(seq_base + index)
            for op in ops:
                half_facts, msg_stamp, msg_schema = row_facts, row_stamp, row_schema
                if row_facts and op.op == "UPDATE_BEFOR" and any(k.startswith("before.") for k in row_facts):
                    half_facts = _before_facts(row_facts)
                    msg_stamp = self._timestamp(header, half_facts)
                    msg_schema = {**schema, "source": self._source(header, half_facts)}
                values = images[n] if plain else None
                n += 1
                raws = charsets = None
                empty = False
                if type(values) is tuple:  # values that need the extension (lossless)
                    values, raws, charsets = values
                elif values is None:  # no C image, or C was not sure: the codecs decide
                    datas = getattr(row if row is not None else all_rows[index], op.field)
                    values, raws, charsets = self._image(table, datas, lossless)
                    empty = not datas
                msg = {"schema": msg_schema,
                       "payload": {op.image: {"dataColumn": values}, "op": op.op, "sequenceId": seq,
                                   "timestamp": msg_stamp}}
                if half_facts:
                    self._version(msg, half_facts)
                    _apply_shape_facts(msg, half_facts)
                else:
                    msg["version"] = FORMAT_VERSION
                if lossless:
                    ext = dict(ext_base)
                    ext["row"] = [index, nrows]
                    if row_plain:
                        ext["rowProperties"] = row_plain
                    if charsets:
                        ext["charsets"] = charsets
                    if raws:
                        ext["values"] = raws
                    if empty:
                        ext["image"] = "empty"  # no Data at all, unlike an image of NA values
                    if unknown is not None:
                        patch = _row_unknown(*unknown, index, op.op)
                        if patch:
                            ext["unknown"] = patch
                    if not (quiet and len(ext) == 3):
                        msg["dts"] = ext
                out.append(msg)
            if row_facts and row_facts.get("op") == "UPDATE":
                if len(ops) != 2:  # only an update's two halves can have come as one message
                    raise ConversionError(f"datahub:op UPDATE on a row of a {pb.DMLType.Name(dml_type)} Entry: "
                                          "no message the bridge writes")
                out[-2:] = [_merge_update(out[-2], out[-1])]
        return out

    def _wire_table(self, entry: pb.Entry, header: pb.Header, raw: bytes):
        """The C fast path's view of a plain DML Entry: (cache entry, dmlEventType, rows, header
        properties or None), or None.

        Plain: no DataHub facts among the header properties (the others travel in dts.header), no
        event or row properties, one dmlEvent and nothing else in the Event, 1 to 10**6 rows, and a
        column set the C plan covers."""
        scanned = speedups.scan(raw)  # under NATIVE only: bridge.native's wrappers are left out here
        if scanned is None:
            return None
        props = speedups.header_properties(raw)  # C reads them off the Entry's bytes; Python when not sure
        if props is False and (props := _plain_properties(header, self._mode == "plain")) is False:
            return None
        key, dml_type, nrows = scanned
        if not 0 < nrows <= _ROW_SCALE:
            return None
        slot = (key, header.sourceType, header.schemaName, header.tableName)
        cached = self._wire_tables.get(slot)
        if cached is None:
            table = self._tables.get(entry.event.dmlEvent.columns, slot[2:])
            if table.native is None or table.reserved and self._mode == "ask":
                return None
            if len(self._wire_tables) >= 1024:
                self._wire_tables.clear()
            source = self._source(header, _NO_FACTS)
            schema = {"dataColumn": table.schema_columns, "primaryKey": table.primary_key, "source": source}
            cached = self._wire_tables[slot] = _WireTable(table, schema)
        return cached, dml_type, nrows, props

    def _wire_stamp(self, header: pb.Header) -> dict:
        event_time = header.timestamp * 1000
        if _MIN_EVENT_TIME <= event_time <= _MAX_EVENT_TIME and not self.options.system_time:
            return {"eventTime": event_time, "checkpointTime": event_time}
        return self._timestamp(header, _NO_FACTS)

    def _plain(self, entry: pb.Entry, header: pb.Header, raw: bytes, form: str = "messages"):
        """The output of a plain DML Entry (`_wire_table`) in one of its forms, its row images read
        off the wire in C, or None (not plain, or an image C leaves to Python where the form has no
        Python half): the same as the dict path's (tests/test_speedups.py).

        "messages": the message dicts (C builds them when every image is plain, else
        `_messages` writes them around C's images); "lines": the JSON lines, written in C from
        per-table templates (the bytes orjson gives for the same dicts); "columns": the lines
        and shard keys as `convert_columns` gives them. Every form starts from the same layout:
        the table's cache entry, DML type, rows, timestamp and dts.header."""
        found = self._wire_table(entry, header, raw)
        if found is None:
            return None
        cached, dml_type, nrows, props = found
        table, native = cached.table, cached.table.native
        lossless = self.options.lossless
        if form == "messages":
            # C reads the timestamp and seqId off the Header's bytes (stamp None; not under system_time,
            # which stamps in Python) and, lossless, dts.header (given as (props,)), leaving the
            # extension out where the header is the default one and the table's columns say the rest
            quiet = table.plain_extension_redundant(nrows, _DEFAULT_HEADER) if lossless else None
            stamp = self._wire_stamp(header) if self.options.system_time else None
            seq_id = header.seqId if stamp is not None else 0
            out = native.messages(raw, dml_type, cached.schema, _IMAGE_KEYS[dml_type], DML_OPS[dml_type],
                                  str(seq_id).encode() if seq_id else b"", bool(seq_id), stamp, FORMAT_VERSION,
                                  (props,) if lossless else None, table.ext_columns, quiet, nrows)
            if out is not None:  # every image plain: C built the message dicts themselves
                return out
            images = native.rows(raw, dml_type)
            if images is None:
                return None
            stamp = self._wire_stamp(header)
            ext_base = {"header": _wire_header(header, props), "columns": table.ext_columns} if lossless else None
            return self._messages(entry, header, table, cached.schema, dml_type, 0, nrows, stamp, ext_base,
                                  images=images)
        ext_header = _wire_header(header, props) if lossless else None
        stamp, seq_id = self._wire_stamp(header), header.seqId
        args = self._lines_args(cached, dml_type, nrows, stamp, ext_header, raw, seq_id)
        lines = native.lines(*args, cached.key_indexes) if form == "columns" else native.lines(*args)
        if lines is None or form == "lines":
            return lines
        lines, shards = lines
        ops = DML_OPS[dml_type]
        source = cached.schema["source"]
        n, k = len(lines), len(ops)
        seq_base = seq_id * _ROW_SCALE
        seqs = [str(seq_base + i) for i in range(n // k)]
        if k > 1:  # an update's two messages share their row's sequenceId
            seqs = [seq for seq in seqs for _ in range(k)]
        fallback = cached.table_shard  # no key value: the table's name, as shard_key gives it
        return (seqs, list(ops) * (n // k), [source.get("dbName")] * n, [source.get("tableName")] * n,
                [shard or fallback for shard in shards], [stamp["eventTime"]] * n, lines)

    def _wire_layout(self, entry: pb.Entry, header: pb.Header, raw: bytes):
        """(the table's cache entry, dmlEventType, timestamp, the arguments of `Plan.lines`) of a plain
        DML Entry, or None: the layout `_plain` starts from, for the streamed pieces (`_pieces`)."""
        found = self._wire_table(entry, header, raw)
        if found is None:
            return None
        cached, dml_type, nrows, props = found
        ext_header = _wire_header(header, props) if self.options.lossless else None
        stamp = self._wire_stamp(header)
        return cached, dml_type, stamp, self._lines_args(cached, dml_type, nrows, stamp, ext_header, raw,
                                                         header.seqId)

    @staticmethod
    def _lines_args(cached: _WireTable, dml_type: int, nrows: int, stamp: dict, ext_header: dict | None,
                    raw: bytes, seq_id: int) -> tuple:
        """The arguments of `Plan.lines` for a plain DML Entry: the bytes around each dataColumn,
        sequenceId and row index, from the table's templates (`ext_header` None: strict)."""
        pre, post = cached.templates(dml_type)
        head = b"\",\"timestamp\":" + orjson.dumps(stamp) + b"},\"version\":\"" + _VERSION_BYTES + b"\""
        quiet_tail = head + b"}"
        if ext_header is not None:
            loud_tail = (head + b",\"dts\":{\"header\":" + orjson.dumps(ext_header)
                         + cached.ext_columns_json + b",\"row\":[")
            nrows_text = str(nrows).encode()
            # a redundant extension is left out, unless an image's values need one after all
            quiet = cached.table.plain_extension_redundant(nrows, ext_header)
            post_seq = (quiet_tail, loud_tail) if quiet else loud_tail
        else:
            post_seq, nrows_text = quiet_tail, None
        return (raw, dml_type, pre, post, str(seq_id).encode() if seq_id else b"", bool(seq_id), post_seq, nrows_text)

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

    # -- parts -------------------------------------------------------------------------------
    def _image(self, table: _TableCodec, datas, lossless: bool):
        """(dataColumn dict, raw Data by column index for inexact values, charsets by column)."""
        if not datas:
            return {}, None, None
        fast = table.fast_image
        if fast is None:  # compiled on first use: a table the C path takes never needs it
            fast = table.fast_image = compile_image(table.names, table.codecs)
        try:
            return fast(datas), None, None
        except MISSES:
            pass  # not all canonical: the per-value path below decides value by value
        if len(datas) != len(table.names):
            raise ConversionError(f"row image has {len(datas)} values for {len(table.names)} columns")
        values = {}
        raws = None
        charsets = None
        for d, (name, to_blob, own_charset, index) in zip(datas, table.columns):
            dt = d.dataType
            if not 0 < dt < _NA:  # NIL, NA, or a number the enum does not know
                if dt == _NIL:
                    values[name] = None
                elif dt != _NA:
                    raise ConversionError(f"unknown DataType {dt}", column=name)
                if d.charset or d.sv or d.bv:
                    raws = raws or {}
                    raws[index] = data_to_raw(d)
                continue
            try:
                values[name] = to_blob(d)
                if own_charset is not None and d.charset != own_charset:
                    charsets = charsets or {}
                    charsets[index] = d.charset
            except Inexact as inexact:
                if not lossless:
                    if inexact.changed:
                        raise ConversionError(inexact.reason, value=d.sv or d.bv, column=name) from None
                    values[name] = inexact.best
                    if isinstance(inexact, Substituted):  # a temporal policy's: counted by the stream
                        note_substitution(inexact, name)
                    continue
                values[name] = inexact.best
                raws = raws or {}
                raws[index] = data_to_raw(d)
            except ConversionError as exc:
                if not lossless:
                    raise exc.located(column=name, value=None)
                values[name] = None
                raws = raws or {}
                raws[index] = data_to_raw(d)
        return values, raws, charsets

    def _build_table(self, columns) -> _TableCodec:
        columns_in = columns
        names, codecs, schema_columns, pkey = [], [], [], []
        seen = set()
        for c in columns:
            if c.name in seen:
                raise ConversionError("duplicate column name", column=c.name)
            seen.add(c.name)
            try:
                codec = codec_for(c, self.options, self._mode != "plain")
            except ConversionError as exc:
                raise exc.located(column=c.name)
            names.append(c.name)
            codecs.append(codec)
            schema_columns.append({"name": c.name, "type": codec.blob_type})
            if c.isKey:
                pkey.append(c.name)
        ext = {"types": [c.originalType for c in columns]}
        props = {str(i): _kv(c.properties) for i, c in enumerate(columns) if c.properties}
        if props:
            ext["properties"] = props
        foreign = {"types": [FOREIGN_COLUMN_TYPES[c["type"]][0] for c in schema_columns]}
        foreign_props = {str(i): [list(kv) for kv in FOREIGN_COLUMN_TYPES[c["type"]][1]]
                         for i, c in enumerate(schema_columns) if FOREIGN_COLUMN_TYPES[c["type"]][1]}
        if foreign_props:
            foreign["properties"] = foreign_props
        columns = [(n, c.to_blob, c.charset, str(i)) for i, (n, c) in enumerate(zip(names, codecs))]
        table = _TableCodec(names, codecs, schema_columns, pkey, ext, columns, ext == foreign)
        table.reserved = any(p.key.startswith(RESERVED_PREFIX) for c in columns_in for p in c.properties)
        table.native = native_plan(names, codecs, self.options.timezone == "UTC", self.options.lossless)
        return table

    def _source(self, header: pb.Header, facts: dict) -> dict:
        if facts:
            return self._build_source(header, facts)
        key = (header.sourceType, header.schemaName, header.tableName)
        source = self._sources.get(key)
        if source is None:
            if len(self._sources) > 10_000:
                self._sources.clear()
            source = self._sources[key] = self._build_source(header, facts)
        return source

    def _build_source(self, header: pb.Header, facts: dict) -> dict:
        db_type = SOURCE_TYPES.get(header.sourceType)
        if db_type is None:
            raise ConversionError(f"unknown SourceType {header.sourceType}")
        if "source" in facts:
            return orjson.loads(facts["source"])
        source = {"dbType": db_type}
        version = facts.get("dbVersion", self.options.db_version)
        if version:
            source["dbVersion"] = version
        source.update(dbName=header.schemaName, schemaName=header.schemaName, tableName=header.tableName)
        return source

    def _timestamp(self, header: pb.Header, facts: dict) -> dict:
        event_time = int(facts["eventTime"]) if "eventTime" in facts else header.timestamp * 1000
        if not _MIN_EVENT_TIME <= event_time <= _MAX_EVENT_TIME:
            raise ConversionError("timestamp gives no 13-digit eventTime (before 2001-09-09)",
                                  value=header.timestamp)
        stamp = {"eventTime": event_time}
        if "systemTime" in facts:
            stamp["systemTime"] = int(facts["systemTime"])
        elif self.options.system_time:
            stamp["systemTime"] = time.time_ns() // 1_000_000
        checkpoint = facts.get("checkpointTime")
        if checkpoint is None:
            stamp["checkpointTime"] = event_time
        elif checkpoint != "none":
            stamp["checkpointTime"] = int(checkpoint)
        return stamp

    @staticmethod
    def _version(msg: dict, facts: dict) -> None:
        version = facts.get("version", FORMAT_VERSION)
        if version != "none":
            msg["version"] = version

    @staticmethod
    def _ext_header(header: pb.Header, plain_props: list, with_source: bool) -> dict:
        skip = _HEADER_IN_ENVELOPE | (_HEADER_IN_SOURCE if with_source else set()) | {"properties"}
        out = _message_fields(header, skip=skip)
        if plain_props:
            out["properties"] = plain_props
        return out


def _apply_shape_facts(msg: dict, facts: dict) -> None:
    """Restore the shape of a foreign (e.g. DataWorks-written) message from its DataHub facts."""
    payload = msg["payload"]
    if "op" in facts and facts["op"] != "UPDATE":
        payload["op"] = facts["op"]
    if "schema" in facts:
        msg["schema"] = orjson.loads(facts["schema"])
    elif facts.get("primaryKey") == "none":
        msg["schema"] = {k: v for k, v in msg["schema"].items() if k != "primaryKey"}
    elif "primaryKey" in facts:
        msg["schema"] = {**msg["schema"], "primaryKey": orjson.loads(facts["primaryKey"])}
    for name in facts.get("nullImage", "").split(","):
        if name:
            payload[name] = None
    if "ddlNull" in facts:
        payload["ddl"] = None
    if "payloadExtra" in facts:
        payload.update(orjson.loads(facts["payloadExtra"]))
    if "extra" in facts:
        msg.update(orjson.loads(facts["extra"]))


def _before_facts(facts: dict) -> dict:
    """Facts of an update's before-half: the after-half's, overridden by `before.` keys."""
    out = {k: v for k, v in facts.items() if not k.startswith("before.")}
    for key, value in facts.items():
        if key.startswith("before."):
            if value == "default":
                out.pop(key[7:], None)
            else:
                out[key[7:]] = value
    return out


def _merge_update(before: dict, after: dict) -> dict:
    """One UPDATE message holding both images (restores a foreign message that came that way)."""
    payload = dict(after["payload"])
    payload = {"before": before["payload"]["before"], "after": payload["after"], **{
        k: v for k, v in payload.items() if k not in ("before", "after")}}
    payload["op"] = "UPDATE"
    msg = dict(after)
    msg["payload"] = payload
    before_unknown = (before.get("dts") or {}).get("unknown")
    if before_unknown:  # the before image's unknown fields join the after half's
        ext = after.get("dts") or before["dts"]
        msg["dts"] = {**ext, "unknown": {**before_unknown, **ext.get("unknown", {})}}
    return msg


def _rebind(method, twin: BlobEncoder):
    """The same converter (a bound method, or a partial of one) on another encoder."""
    if isinstance(method, partial):
        return partial(getattr(twin, method.func.__name__), *method.args, **method.keywords)
    return getattr(twin, method.__name__)


def _has_reserved(props) -> bool:
    return any(p.key.startswith(RESERVED_PREFIX) for p in props)


# The decoder `facts_hold` reads messages back with. bridge.blob.decode imports this module, so this
# one does not import it back (an import circle, tests/test_layout.py): decode names its BlobDecoder
# here as it loads (`read_back_with`), and every way into the package loads it (bridge/__init__.py).
_READ_BACK: list = []


def read_back_with(decoder: Callable[[Options], Any]) -> None:
    """Name the decoder class (`BlobDecoder`) `facts_hold` reads an Entry's messages back with when
    it is given none (bridge.blob.decode calls this as it loads)."""
    _READ_BACK[:] = [decoder]


def facts_hold(entry: pb.Entry, raw: bytes | None = None, options: Options = DEFAULT_OPTIONS,
               decoder: Callable[[Options], Any] | None = None) -> bool:
    """Whether the reserved-prefix properties of an Entry are the bridge's own DataHub facts: the
    messages that read them so (lossless, whatever `options.strict` says) decode back to exactly
    this Entry. What `BlobEncoder` and `BlobDecoder` ask of an Entry that holds such properties;
    `decoder` (the `BlobDecoder` class; by default the one bridge.blob.decode named) reads back."""
    if decoder is None:
        if not _READ_BACK:
            raise RuntimeError("bridge.blob.decode is not loaded: facts_hold has no decoder to read back with")
        decoder = _READ_BACK[0]
    lossless = dataclasses.replace(options, strict=False, control_events="emit", system_time=False)
    encoder = _encoder(lossless)._twin("facts")
    try:
        messages = encoder._convert(entry, entry.header, raw)
        reader = decoder(lossless)
        reader._check_reserved = False  # (what it decodes is the facts' reading, never a user's)
        out = [e for m in messages for e in reader.feed(m)]
        if reader.finish():
            return False
    except (BridgeError, ValueError, TypeError, OverflowError, UnicodeError, KeyError):
        return False
    return len(out) == 1 and out[0].SerializeToString() == entry.SerializeToString()


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
