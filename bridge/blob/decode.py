"""DataHub Blob messages -> DTS Entries (docs/mapping.md).

Messages written by the bridge carry the `"dts"` extension and rebuild their Entries exactly:
the rows of one DML event are regrouped, BEGIN/COMMIT/DDL/heartbeat/checkpoint/rollback entries
come back with every header field. Foreign messages (e.g. written by DataWorks) get the
documented DTS types of their Blob types, and whatever DataHub says that DTS cannot (millisecond
eventTime, systemTime, checkpointTime, ddlMeta, version, dbVersion, BOOLEAN, the sequenceId)
travels in `properties` under the reserved prefix `datahub:`, so Blob -> DTS -> Blob is exact.

Update halves are paired by sequenceId. A half whose partner has not come within `max_pending`
messages, or by the end of input, is reported (ConversionError naming its sequenceId), never
dropped silently.

>>> msg = decode_blob(b'{"schema":{},"payload":{"op":"MHEARTBEAT","sequenceId":"9000000",'
...                   b'"timestamp":{"eventTime":1605339932000,"checkpointTime":1605339932000}},"version":"0.0.1"}')
>>> [(e.header.messageType == pb.HEARTBEAT, e.header.seqId, e.header.timestamp) for e in blob_to_entries([msg])]
[(True, 9, 1605339932)]
"""
from __future__ import annotations

import base64
import binascii
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import orjson
from google.protobuf.message import DecodeError as ProtobufDecodeError

from bridge.blob.encode import FORMAT_VERSION, facts_hold, read_back_with
from bridge.blob.rows import native_plan
from bridge.errors import BlobFormatError, BridgeError, ConversionError, LineTooLongError, OptionsError
from bridge.native import speedups
from bridge.native.contract import PROTO_FIELDS
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.values import (
    DDL_OP_NAMES,
    DML_IMAGES,
    EVENT_FIELDS,
    FOREIGN_COLUMN_TYPES,
    OP_IMAGES,
    OPS_BY_MESSAGE_TYPE,
    RESERVED_PREFIX,
    ROW_DIGITS,
    SOURCE_TYPES,
    SOURCE_TYPES_BY_NAME,
    codec_for,
    column_is_boolean,
    ddl_op,
    raw_to_data,
    sequence_id,
)
from bridge.wire import subscribe_pb2 as pb

__all__ = ["decode_blob", "blob_to_entries", "BlobDecoder", "FOREIGN_COLUMN_TYPES", "ALL_OPS"]

_ROW_SCALE = 10 ** ROW_DIGITS
# the DML ops (values.OP_IMAGES), and UPDATE: one message carrying both images, which readers accept
DML_OP_NAMES = (*OP_IMAGES, "UPDATE")
MESSAGE_TYPE_BY_OP = {op: mt for mt, op in OPS_BY_MESSAGE_TYPE.items() if op}
MESSAGE_TYPE_BY_OP.update({op: pb.DDL for op in DDL_OP_NAMES})
MESSAGE_TYPE_BY_OP.update({op: pb.DML for op in DML_OP_NAMES})
MESSAGE_TYPE_BY_OP["XACOMMIT"] = pb.COMMIT  # an XA transaction's end; the op travels as a fact
# every op a Blob message may carry, from the op tables: DML (OP_IMAGES), the other message types,
# DDL keywords, and the two spellings readers accept besides (XACOMMIT, UPDATE)
ALL_OPS = (*OP_IMAGES, *(op for op in OPS_BY_MESSAGE_TYPE.values() if op), *sorted(DDL_OP_NAMES),
           "XACOMMIT", "UPDATE")
DML_TYPE_BY_OP = {op: i.dml_type for op, i in OP_IMAGES.items()} | {"UPDATE": pb.UPDATE}

_ABSENT = object()
_UPDATE = int(pb.UPDATE)
_DML = int(pb.DML)
_NIL_DATA = pb.Data(dataType=pb.NIL)  # copied by extend, so one instance serves every row
_NA_DATA = pb.Data(dataType=pb.NA)
_KNOWN_TOP = ("schema", "payload", "version", "dts")
_KNOWN_PAYLOAD = ("before", "after", "op", "sequenceId", "timestamp", "ddl")
_KNOWN_TOP_SET, _KNOWN_PAYLOAD_SET = frozenset(_KNOWN_TOP), frozenset(_KNOWN_PAYLOAD)
# the row images each DML op reads; other ops read none
_IMAGES_OF_OP = {op: (i.image,) for op, i in OP_IMAGES.items()} | {
    "UPDATE": tuple(i.image for i in DML_IMAGES[pb.UPDATE])}
# an image's RowChange field: (name, number), as the op table and the C contract name them
_IMAGE_FIELDS = {i.image: (i.field, PROTO_FIELDS["RowChange." + i.field]) for i in OP_IMAGES.values()}
_FIELD_IMAGES = {name: image for image, (name, _) in _IMAGE_FIELDS.items()}
# the half of an update each half's op carries (an op of one whole row: "both")
_HALF_OF_OP = {i.op: i.image for i in DML_IMAGES[pb.UPDATE]}
_OP_OF_HALF = {image: op for op, image in _HALF_OF_OP.items()}
# the lane's ops (one image each): op -> (image, its RowChange field number, DMLType)
_LANE_IMAGES = {op: (i.image, _IMAGE_FIELDS[i.image][1], i.dml_type) for op, i in OP_IMAGES.items()}
_LANE_EXTENSION_KEYS = frozenset(("header", "columns", "row", "charsets", "values"))
_ENTRY_FROM, _ROW_FROM = pb.Entry.FromString, pb.RowChange.FromString
_WITH_ROWS = getattr(speedups, "with_rows", None)  # (the lane runs only where C does)
# a DML op -> the payload keys of a message that needs no shape fact (its images, op, sequenceId, timestamp)
_PLAIN_PAYLOADS = {op: frozenset((*images, "op", "sequenceId", "timestamp")) for op, images in _IMAGES_OF_OP.items()}


def decode_blob(data: bytes | str, *, line: int | None = None, source: str | None = None,
                max_bytes: int | None = None) -> dict:
    """Parse one Blob message (JSON bytes) and check its envelope shape. Before the parse: a line
    longer than `max_bytes` (None: no bound) is a LineTooLongError and one that is no JSON object
    (its first byte past whitespace is not `{`) a BlobFormatError, so that neither is ever
    parsed whole (a JSON parse holds up to ~31x its text: `[{},{},...]`)."""
    check_line(data, max_bytes, line=line, source=source)
    try:
        msg = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BlobFormatError(f"invalid JSON ({exc.msg})", value=data, line=line, column_number=exc.colno,
                              source=source) from None
    check_shape(msg, line=line, source=source)
    return msg


_JSON_SPACE = b" \t\r\n"


def check_line(data: bytes | str, max_bytes: int | None, *, line: int | None = None,
               source: str | None = None) -> None:
    """What `decode_blob` checks of a line before it is parsed: its size against `max_bytes` (a
    line break at its end aside) and that it holds a JSON object. O(1) but for the whitespace
    before its first byte."""
    text = type(data) is str
    if max_bytes is not None and len(data) > max_bytes:
        length = len(data) - data.endswith("\n" if text else b"\n")
        if length > max_bytes:
            head = data[:_HEAD_BYTES]
            raise LineTooLongError(f"line of {length} bytes is longer than max_line_bytes ({max_bytes})",
                                   head=head.encode("utf-8", "replace") if text else bytes(head),
                                   length=length, line=line, source=source)
    first = data[:1]
    if first != b"{" and first != "{":
        start = data.lstrip(" \t\r\n" if text else _JSON_SPACE)[:1] if first in _SPACES else first
        if start in _OTHER_JSON:  # JSON of another kind (`[{},{},...]`); what is no JSON: orjson names it
            raise BlobFormatError("a Blob message must be a JSON object", value=data[:64], line=line,
                                  source=source)


_SPACES = frozenset((b" ", b"\t", b"\r", b"\n", " ", "\t", "\r", "\n"))
# the first character of a JSON text that is no object: an array, a string, a number, a literal
_OTHER_JSON = frozenset([*(c.encode() for c in '["-0123456789tfn'), *'["-0123456789tfn'])
_HEAD_BYTES = 4096  # what a LineTooLongError keeps of its line, as read_lines keeps


def check_shape(msg, *, line: int | None = None, source: str | None = None) -> None:
    """The minimal shape every converter relies on; the JSON Schema says the rest."""
    if not isinstance(msg, dict):
        raise BlobFormatError("a Blob message must be a JSON object", value=msg, line=line, source=source)
    payload = msg.get("payload")
    if not isinstance(payload, dict):
        raise BlobFormatError("payload must be an object", value=payload, line=line, source=source)
    op = payload.get("op")
    if op not in ALL_OPS:
        raise BlobFormatError("unknown op", value=op, line=line, source=source)
    seq = payload.get("sequenceId")
    if seq is None and op == "MHEARTBEAT" and "sequenceId" not in payload:
        pass  # DataWorks heartbeats carry no sequenceId (docs/mapping.md, "Message kinds")
    elif not isinstance(seq, str) or not seq.isdigit() or not seq.isascii():
        raise BlobFormatError("sequenceId must be a string of digits", value=seq, line=line, source=source)
    stamp = payload.get("timestamp")
    if not isinstance(stamp, dict) or not _is_int(stamp.get("eventTime")):
        raise BlobFormatError("timestamp.eventTime must be an integer", value=stamp, line=line, source=source)
    for key in ("systemTime", "checkpointTime"):
        if key in stamp and not _is_int(stamp[key]):
            raise BlobFormatError(f"timestamp.{key} must be an integer", value=stamp, line=line, source=source)
    if not isinstance(msg.get("schema", _NO_SCHEMA), dict):
        raise BlobFormatError("schema must be an object", value=msg.get("schema"), line=line, source=source)


_NO_SCHEMA: dict = {}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class _Row:
    """One row change being rebuilt (an update waits for its second half)."""
    seq: str
    row: pb.RowChange
    halves: set = field(default_factory=set)
    line: int | None = None
    unknown: bytes | None = None  # the Entry-level unknown fields of its message (both halves carry them)
    reserved: bool = False  # its message's extension held reserved-prefix properties (`_reserved`)


@dataclass
class _Event:
    """A DML event being regrouped from its rows' messages (lossless extension)."""
    entry: pb.Entry
    nrows: int
    rows: dict = field(default_factory=dict)  # row index -> RowChange
    messages: int = 0
    reserved: bool = False  # a message of it had reserved-prefix properties in its extension


class BlobDecoder:
    """Stream-level Blob -> DTS converter: `feed` messages, collect Entries; `finish` at end of input."""

    def __init__(self, options: Options = DEFAULT_OPTIONS, max_pending: int = 100_000) -> None:
        if type(max_pending) is not int or max_pending < 1:
            raise OptionsError(f"max_pending = {max_pending!r}: the update halves waiting for their partner, "
                               "a whole number of at least 1")
        self.options = options
        self.max_pending = max_pending
        self._halves: OrderedDict = OrderedDict()   # sequenceId -> (_Row, facts, Entry, column-set key)
        self._events: OrderedDict = OrderedDict()   # see _regroup -> _Event
        self.messages = 0
        self.entries = 0
        self._line: int | None = None
        self._column_sets: dict = {}  # JSON of (dataColumn, primaryKey, dts.columns) -> built columns
        self._native = True  # the C image encoder where it applies (tests switch it off to compare)
        self._lane_last: tuple | None = None  # _lane's last column set and the JSON texts naming it
        # what the lane holds on bytes while the Python state below is empty (see _assemble):
        # sequenceId -> waiting update half; (Entry bytes, row count, column-set key) -> open event
        self._lane_halves: dict = {}
        self._lane_events: dict = {}
        self._sources: dict = {}  # schema.source JSON -> ((sourceType, schemaName, tableName), facts)
        self._schema_prefix: bytes | None = None  # b'{"schema":<JSON>,' of the last line parsed whole
        self._schema_value: dict | None = None  # and its schema, shared by the lines that repeat it
        self._schema_known: dict = {}  # what is cached for that schema object ("columns", "source")
        # update halves pushed out of the pairing window: errors for the caller to report
        self.evicted: list[ConversionError] = []
        # the message being read holds reserved-prefix properties in its extension (or its Entry's
        # other messages did): its Entry is checked against the encoder's reading (`_check_plain`)
        self._reserved = False
        self._check_reserved = True  # (False in `facts_hold`'s own decoder)
        self._completed = 0  # messages held before the one being read that its Entry completed (`_lost`)

    def feed_line(self, data: bytes | str, *, line: int | None = None, source: str | None = None
                  ) -> list[pb.Entry]:
        """`feed(decode_blob(data))`: what the stream layer and Spark call for each line.

        Messages of one table repeat their schema byte for byte, so a line that begins with the
        same `{"schema":...,` bytes as the last one parsed whole has only the rest parsed, shares
        that schema object (never seen outside the decoder, never changed) and the facts cached
        for it (a second "schema" key later in the line still wins, as in JSON). A line whose
        rest does not parse so is parsed whole, as `decode_blob` does (errors name the same line
        and column). A line over `options.max_line_bytes`, or one that is no JSON object, is an
        error before any parse (`check_line`): what one line costs is bounded here as well as by
        the readers that split lines."""
        check_line(data, self.options.max_line_bytes, line=line, source=source)
        prefix = self._schema_prefix
        if prefix is not None and type(data) is bytes and data.startswith(prefix):
            try:
                rest = orjson.loads(b"{" + data[len(prefix):])
            except orjson.JSONDecodeError:
                rest = None  # parsed whole below, for the error's position
            if type(rest) is dict and rest:  # `{"schema":..., }` is no JSON, though `{ }` is
                if self._native:  # the usual DML message: one C call (what `feed` does, in short)
                    payload = rest.get("payload")
                    ext = rest.get("dts") if self.options.lossless else None
                    if type(payload) is dict and (ext is None or type(ext) is dict):
                        self._line = line
                        try:
                            out = self._lane(rest, payload, payload.get("op"), ext)
                        except BridgeError as exc:
                            raise exc.located(line=line, sequence_id=_seq_of(rest))
                        if out is not None:
                            self.messages += 1
                            self.entries += len(out)
                            return out
                msg = {"schema": self._schema_value}
                msg.update(rest)
                check_shape(msg, line=line, source=source)
                return self.feed(msg, line=line, checked=True)
        msg = decode_blob(data, line=line, source=source)
        schema = msg.get("schema")
        if type(data) is bytes and type(schema) is dict and data.startswith(b'{"schema":{'):
            try:
                prefix = b'{"schema":' + orjson.dumps(schema) + b","
            except TypeError:
                prefix = None
            if prefix is not None and data.startswith(prefix):
                self._schema_prefix, self._schema_value, self._schema_known = prefix, schema, {}
        return self.feed(msg, line=line, checked=True)

    def feed(self, msg: dict, *, line: int | None = None, checked: bool = False) -> list[pb.Entry]:
        """Entries completed by this message; `checked`: `decode_blob` already checked its shape."""
        self._line = line
        try:
            out = self._feed(msg, checked)
        except BridgeError as exc:
            raise exc.located(line=line, sequence_id=_seq_of(msg))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise BlobFormatError(f"malformed Blob message ({type(exc).__name__}: {exc})",
                                  line=line, sequence_id=_seq_of(msg)) from None
        self.messages += 1
        self.entries += len(out)
        return out

    @property
    def pending(self) -> int:
        return self.pending_messages

    @property
    def pending_messages(self) -> int:
        """Messages fed but not yet part of a returned Entry (update halves, rows of open events)."""
        return (len(self._halves) + sum(e.messages for e in self._events.values())
                + len(self._lane_halves) + sum(e[1] for e in self._lane_events.values()))

    def finish(self) -> list[ConversionError]:
        """Errors for every update half or partial event still waiting at end of input."""
        self._unassemble()
        errors = self.evicted
        self.evicted = []
        for seq, (row, *_) in self._halves.items():
            missing = next(op for half, op in _OP_OF_HALF.items() if half not in row.halves)
            err = ConversionError(f"update half without its partner at end of input ({missing} missing)",
                                  sequence_id=seq, line=row.line)
            err.count = 1
            errors.append(err)
        for event in self._events.values():
            err = ConversionError(f"DML event incomplete at end of input: {len(event.rows)} of "
                                  f"{event.nrows} rows", seq_id=event.entry.header.seqId)
            err.count = event.messages
            errors.append(err)
        self._halves.clear()
        self._events.clear()
        return errors

    # -- per message ---------------------------------------------------------------------------
    def _feed(self, msg: dict, checked: bool) -> list[pb.Entry]:
        self._reserved = False
        if self._lane_halves or self._lane_events:  # what the lane holds joins the Python state first
            self._unassemble()
        if not checked:
            check_shape(msg)
        payload = msg["payload"]
        op = payload["op"]
        ext = msg.get("dts") if self.options.lossless else None
        if ext is not None and not isinstance(ext, dict):
            raise BlobFormatError("the 'dts' extension must be an object", value=ext)
        mtype = MESSAGE_TYPE_BY_OP[op]
        if ext and (mtype != _DML or not ext.keys() <= _DML_EXTENSION_KEYS or None in ext.values()):
            _check_extension(ext, mtype == _DML)  # (a DML message's parts are checked where read)
        if mtype == pb.DML:
            return self._dml(msg, payload, op, ext)
        entry = pb.Entry()
        header = entry.header
        seq = payload.get("sequenceId")
        facts: dict = {}
        if OPS_BY_MESSAGE_TYPE.get(mtype) not in (None, op):
            facts["op"] = op  # XACOMMIT travels as a COMMIT
        self._header(header, msg, payload, mtype, ext, facts, with_source=mtype == pb.DDL)
        sub = getattr(entry.event, EVENT_FIELDS[mtype])
        event = (ext or {}).get("event") or {}
        absent = event.get("absent") if event else None
        if absent is None:
            sub.SetInParent()
        elif absent not in _ABSENT_PARTS or event.keys() - _ABSENT_KEYS[absent]:
            raise BlobFormatError("the 'dts' extension's event.absent is \"sub\" (the Event holds no "
                                  f"{EVENT_FIELDS[mtype]}: nothing of it travels) or \"event\" (no Event at all)",
                                  value=event)
        elif absent == "sub":
            entry.event.SetInParent()
        for key, value in event.items():
            if key == "properties":
                _add_kv(entry.event.properties, value)
            elif key != "absent":
                _set_field(sub, key, value)
        if mtype == pb.DDL:
            ddl = payload.get("ddl")
            if not isinstance(ddl, dict) or not isinstance(ddl.get("text"), str):
                raise BlobFormatError("a DDL message needs payload.ddl.text", value=ddl)
            if absent is None:
                sub.sql = ddl["text"]
            elif ddl["text"]:
                raise BlobFormatError("a DDL message whose extension says its Event holds no ddlEvent has no "
                                      "statement", value=ddl)
            if "ddlMeta" in ddl:
                facts["ddlMeta"] = ddl["ddlMeta"]
            if ddl_op(sub.sql) != op:
                facts["op"] = op
            expected_schema = {"source": None}
        else:
            expected_schema = {}
        schema = msg.get("schema", None)
        if mtype != pb.DDL and schema != expected_schema:
            facts["schema"] = orjson.dumps(schema).decode()
        elif mtype == pb.DDL and set((schema or {}).keys()) != {"source"}:
            facts["schema"] = orjson.dumps(schema).decode()
        self._sequence(header, seq, 0, ext, facts)
        self._shape_facts(msg, payload, facts, ddl_extra=mtype != pb.DDL)
        if self._reserved:
            self._check_facts(facts)
        if self.options.lossless:
            _add_facts(header.properties, facts)
        unknown = ext.get("unknown") if ext else None
        if unknown:
            once, rows, _ = _unknown_patches(unknown)
            if rows:
                raise BlobFormatError("the 'dts' extension's unknown fields name a row; only a DML message has one",
                                      value=sorted(unknown))
            _patch(entry, once)
        return self._check_plain([entry])

    def _dml(self, msg: dict, payload: dict, op: str, ext) -> list[pb.Entry]:
        schema = msg.get("schema")
        if not isinstance(schema, dict) or not isinstance(schema.get("dataColumn"), list):
            raise BlobFormatError("a DML message needs schema.dataColumn", value=schema)
        seq = payload["sequenceId"]
        entry = pb.Entry()
        header = entry.header
        facts: dict = {}
        self._header(header, msg, payload, pb.DML, ext, facts, with_source=True)
        dml = entry.event.dmlEvent
        codecs, names, plan, columns_key = self._columns(dml, schema, ext, facts)  # copies the columns in first
        dml.dmlEventType = DML_TYPE_BY_OP[op]
        event_ext = ext.get("event") if ext else None
        if event_ext is not None:
            if type(event_ext) is not dict or not event_ext.keys() <= _DML_EVENT_KEYS:
                raise BlobFormatError("the 'dts' extension's event of a DML message holds only properties",
                                      value=event_ext)
            _add_kv(entry.event.properties, event_ext.get("properties", []))
        unknown = ext.get("unknown") if ext else None
        once = below = unknown_key = None
        if unknown:  # the Entry's own now (compared below as the halves' and rows' key), the row's once built
            once, below, unknown_key = _unknown_patches(unknown)
            _patch(entry, once)
        row = ext.get("row", _ONE_ROW) if ext else _ONE_ROW
        if (type(row) is not list and row is not _ONE_ROW or len(row) != 2 or type(row[0]) is not int
                or type(row[1]) is not int or not 0 <= row[0] < row[1]):
            raise BlobFormatError("the 'dts' extension's row must be [index, count]", value=row)
        row_index, nrows = row
        self._sequence(header, seq, row_index, ext, facts)
        self._shape_facts(msg, payload, facts, ddl_extra=True)
        half = _HALF_OF_OP.get(op, "both")
        partner = self._partner(seq, half, entry, columns_key, unknown_key) if half != "both" else None
        row_properties = ext.get("rowProperties") if ext else None
        properties = [pb.KVPair(key=k, value=v) for k, v in _pairs(row_properties)] if row_properties is not None \
            else ()
        if properties and any(p.key.startswith(RESERVED_PREFIX) for p in properties):
            self._reserved = True
        if below:  # checked before a waiting half's row is touched
            _check_row_patches(below, half, images_of(op), ext.get("image") is None, len(names), len(properties))
        if partner is None:  # (a constructor with keywords costs three times one without)
            row = pb.RowChange(properties=properties) if properties else pb.RowChange()
        else:
            row = partner[0].row  # the waiting half's row takes this half's image: no copy of either
        images = images_of(op)
        raws, charsets = (ext.get("values"), ext.get("charsets")) if ext else (None, None)
        if raws is not None and type(raws) is not dict or charsets is not None and type(charsets) is not dict:
            raise BlobFormatError("the 'dts' extension's values and charsets are objects", value=[raws, charsets])
        for image in images:
            self._image(row, image, payload, codecs, names, ext, plan, raws, charsets)
        if op == "UPDATE":
            facts["op"] = "UPDATE"
        if partner is not None and half == "after":  # the joined row keeps the after half's properties
            del row.properties[:]
            row.properties.extend(properties)
        if below:
            _patch(row, below)
        return self._complete(seq, half, entry, row, facts, partner, ext, row_index, nrows, columns_key, unknown_key)

    def _complete(self, seq, half, entry, row, facts, partner, ext, row_index, nrows, columns_key,
                  unknown_key=None) -> list[pb.Entry]:
        """A message's row, its images in: an update half meets its partner (or waits), the facts
        go into the row (lossless), and the row completes its Entry, or its event (`_regroup`)."""
        if partner is not None and partner[0].reserved:
            self._reserved = True
        if self._reserved:
            self._check_facts(facts)
        self._completed = 0
        if half != "both":
            row, facts, done = self._pair(seq, half, row, facts, entry, partner, columns_key, unknown_key)
            if not done:
                return []
            self._completed = 1  # the waiting half, no longer held
        try:
            if self._reserved and half != "both":
                self._check_facts(facts)
            if facts and self.options.lossless:
                _add_facts(row.properties, facts)
            if not ext:  # (`entry`, not a DMLEvent held before: a before half that completes its update
                # has had the waiting after half's Entry copied into `entry`)
                entry.event.dmlEvent.rows.append(row)
                return self._check_plain([entry])
            return self._check_plain(self._regroup(entry, row, row_index, nrows, columns_key, unknown_key))
        except BridgeError:
            self._lost(seq)
            raise

    def _lost(self, seq) -> None:
        """This message completed its Entry (an update's other half, the other rows of its event:
        `_completed` messages held before it), and is rejected: they go with it, each counted, as
        an error in `evicted` (the caller rejects this one; a stream counts records, so the law
        `converted + rejected + not_emitted == input` keeps them out of `converted`)."""
        held, self._completed = self._completed, 0
        if held:
            err = ConversionError(f"{held} earlier message{'s' if held > 1 else ''} of an Entry whose last message "
                                  f"(line {self._line}) was rejected", sequence_id=seq)
            err.count = held
            self.evicted.append(err)

    def _check_facts(self, facts: dict) -> None:
        """A message whose extension holds reserved-prefix properties (the Entry's own: the bridge
        writes its facts nowhere else than outside the extension) and that needs DataHub facts as
        well is no message the bridge writes: its Entry would mix the two kinds, which no
        conversion back could tell apart."""
        if facts and self._check_reserved:
            raise ConversionError("the 'dts' extension holds reserved-prefix (datahub:) properties, and the "
                                  f"message needs DataHub facts besides ({', '.join(sorted(facts))}): "
                                  "no message the bridge writes")

    def _check_plain(self, out: list) -> list:
        """Entries whose messages' extensions held reserved-prefix properties: the bridge writes
        those only for an Entry whose such properties do not read as its DataHub facts
        (`facts_hold`); an Entry that would read so would come back as another message."""
        if self._reserved and self._check_reserved:
            for entry in out:
                if facts_hold(entry, None, self.options, BlobDecoder):
                    raise ConversionError("the 'dts' extension holds reserved-prefix (datahub:) properties that "
                                          "read as DataHub facts of the bridge's own: no message the bridge writes")
        return out

    def _lane(self, rest: dict, payload: dict, op: str, ext) -> list[pb.Entry] | None:
        """The usual DML message in one C call (`Plan.lane`), for `feed_line` before any other
        check (it takes only messages `check_shape` and `_feed` pass): a line of a table whose schema,
        source and column set were seen before and need no fact, one image, our version, no key
        beyond what the encoder writes, and no extension part but header, columns, row, charsets
        and values. C builds the Entry (without rows) and the row, or returns None wherever the
        message needs a fact or holds a value it leaves to the codecs; then this returns None and
        `feed_line` goes on as for any line (`check_shape`, `feed`). `rest`: the line's keys but the
        shared schema. The halves of an update and the rows of one event meet as they do in `_dml`
        (`_partner`, `_pair`, `_regroup`)."""
        self._reserved = False
        lane = _LANE_IMAGES.get(op) if type(op) is str else None  # (an op of any JSON type: check_shape's)
        if ext and _ext_header_reserved(ext.get("header")):
            return None  # reserved-prefix properties of the Entry's own: `_feed` checks them
        if (lane is None or "schema" in rest or not _usual_shape(rest, payload, op)
                or (ext and (not ext.keys() <= _LANE_EXTENSION_KEYS or None in ext.values()))):
            return None
        known = self._schema_known
        source, own = known.get("source"), known.get("columns")
        if source is None or source[1] or own is None:
            return None
        try:
            columns_json = orjson.dumps(ext.get("columns") if ext else None)
        except (TypeError, orjson.JSONEncodeError):
            return None
        last = self._lane_last  # (schema JSON, columns JSON, column set) of the last line taken
        if last is not None and last[0] is own and last[1] == columns_json:
            cached = last[2]
        else:
            cached = self._column_sets.get(own + columns_json)
            if cached is None or cached[3] or cached[4] is None:  # table facts, or no C plan
                return None
            self._lane_last = (own, columns_json, cached)
        columns_key = cached[5]
        got = cached[4].lane(payload, ext, lane[0], lane[1], source[0], lane[2], cached[6])
        if got is None:
            return None
        entry_bytes, row_bytes, row_index, nrows = got
        seq = payload["sequenceId"]
        half = _HALF_OF_OP.get(op, "both")
        if not self._halves and not self._events and _WITH_ROWS:  # the Python state is empty: the lane assembles
            out = self._assemble(entry_bytes, row_bytes, row_index, nrows, seq, half, columns_key, bool(ext),
                                 lane[2] == _UPDATE)
            if out is not None:
                return out
        self._unassemble()
        entry = _ENTRY_FROM(entry_bytes)
        partner = self._partner(seq, half, entry, columns_key) if half != "both" else None
        if partner is None:
            row = _ROW_FROM(row_bytes)
        else:
            row = partner[0].row  # the waiting half's row takes this half's image
            row.MergeFromString(row_bytes)
            if half == "after":  # the joined row keeps the after half's properties: none
                del row.properties[:]
        return self._complete(seq, half, entry, row, {}, partner, ext, row_index, nrows, columns_key)

    def _assemble(self, entry_bytes, row_bytes, row_index, nrows, seq, half, columns_key, grouped, update
                  ) -> list[pb.Entry] | None:
        """The lane's message completed on bytes while the Python state (`_halves`, `_events`) is
        empty: update halves wait in `_lane_halves` and an event's rows in `_lane_events`, and an
        Entry is parsed once, whole (`with_rows`). Plan.lane writes the Header canonically, so equal
        Entry bytes are what `_partner` and `_regroup` call the same Entry: halves with equal bytes
        and column-set key join with no fact, and rows with equal bytes, count and key are one
        event's. None, with nothing changed, wherever Python would do more than that (halves
        that differ, a second half of a kind, a repeated row, the pairing window full): then
        `_unassemble` moves what the lane holds into the Python state, as the Python path would
        have built it, and the message goes the Python way."""
        halves = self._lane_halves
        if half != "both":
            waiting = halves.get(seq)
            if waiting is None:
                if len(halves) >= self.max_pending:
                    return None
                halves[seq] = (entry_bytes, row_bytes, half, columns_key, self._line)
                return []
            if waiting[2] == half or waiting[0] != entry_bytes or waiting[3] != columns_key:
                return None
            row_bytes = waiting[1] + row_bytes  # protobuf merges the two halves' images into one row
        if not grouped or nrows == 1:
            if half != "both":
                del halves[seq]
            return [_ENTRY_FROM(_WITH_ROWS(entry_bytes, [row_bytes]))]
        key = (entry_bytes, nrows, columns_key)
        event = self._lane_events.get(key)
        if event is None:
            event = self._lane_events[key] = [{}, 0]  # row index -> row bytes (as many as came), messages
        elif row_index in event[0]:
            return None  # a repeated row: Python's error
        rows = event[0]
        rows[row_index] = row_bytes
        event[1] += 2 if update else 1
        if half != "both":  # (last: nothing above may leave the half neither waiting nor in its row)
            del halves[seq]
        if len(rows) < nrows:
            return []
        del self._lane_events[key]
        return [_ENTRY_FROM(_WITH_ROWS(entry_bytes, [rows[i] for i in range(nrows)]))]

    def _unassemble(self) -> None:
        """Move what the lane holds on bytes into the Python state, as the Python path builds it
        (`_pair`'s waiting half, `_regroup`'s open event), in the order the lane took it."""
        if self._lane_halves:
            for seq, (entry_bytes, row_bytes, half, columns_key, line) in self._lane_halves.items():
                self._halves[seq] = (_Row(seq, _ROW_FROM(row_bytes), {half}, line), {}, _ENTRY_FROM(entry_bytes),
                                     columns_key)
            self._lane_halves.clear()
        if self._lane_events:
            for (entry_bytes, nrows, columns_key), (rows, messages) in self._lane_events.items():
                entry = _ENTRY_FROM(entry_bytes)
                key = _event_key(entry, nrows, columns_key)
                if key in self._events:  # (cannot be: the lane holds only while the Python state is empty)
                    raise RuntimeError("BlobDecoder: an event held by the lane is open in the Python state too")
                event = self._events[key] = _Event(entry, nrows)
                event.rows = {i: _ROW_FROM(row) for i, row in rows.items()}
                event.messages = messages
            self._lane_events.clear()

    # -- parts ---------------------------------------------------------------------------------
    def _header(self, header, msg, payload, mtype, ext, facts, with_source) -> None:
        header.messageType = mtype
        fields = ext.get("header") if ext else None
        if fields is not None and type(fields) is not dict:  # (null: the `_check_extension` gate)
            raise BlobFormatError("the 'dts' extension's 'header' is not what the bridge writes", value=fields)
        if fields:
            if "properties" in fields:
                for key, value in fields.items():
                    if key == "properties":
                        _add_kv(header.properties, value)
                        if _ext_header_reserved(fields):
                            self._reserved = True
                    else:
                        _set_field(header, key, value)
            elif _BOOL_FIELDS.isdisjoint(fields):  # (the usual header: no bool field to check)
                for key, value in fields.items():
                    setattr(header, key, value)
            else:
                for key, value in fields.items():
                    _set_field(header, key, value)
        elif not ext:
            header.version = 1
            if not with_source:
                header.sourceType = pb.MYSQL
        stamp = payload["timestamp"]
        event_time = stamp["eventTime"]
        if event_time < 0:
            raise BlobFormatError("eventTime before 1970 has no DTS timestamp", value=event_time)
        # A uint32 of seconds ends in 2106; a later eventTime travels whole as a fact.
        header.timestamp = min(event_time // 1000, (1 << 32) - 1)
        if event_time % 1000 or event_time // 1000 != header.timestamp:
            facts["eventTime"] = str(event_time)
        if "systemTime" in stamp:
            facts["systemTime"] = str(stamp["systemTime"])
        if "checkpointTime" not in stamp:
            facts["checkpointTime"] = "none"
        elif stamp["checkpointTime"] != event_time:
            facts["checkpointTime"] = str(stamp["checkpointTime"])
        if with_source:
            source = (msg.get("schema") or {}).get("source")
            if not isinstance(source, dict):
                raise BlobFormatError("schema.source must be an object", value=source)
            shared = msg.get("schema") is self._schema_value  # a schema feed_line shares
            known = self._schema_known.get("source") if shared else None
            try:  # the JSON text as the key: True and 1, 1.0 and 1 stay apart
                key = None if known is not None else orjson.dumps(source)
                if key is not None:
                    known = self._sources.get(key)
            except TypeError:  # a value JSON cannot hold (a dict built in Python): not cached
                key, known = None, None
            if known is None:
                known = self._source_fields(source)
                if key is not None:
                    if len(self._sources) > 4096:
                        self._sources.clear()
                    self._sources[key] = known
            if shared:
                self._schema_known["source"] = known
            header.sourceType, header.schemaName, header.tableName = known[0]
            facts.update(known[1])

    def _source_fields(self, source: dict) -> tuple[tuple, dict]:
        """((sourceType, schemaName, tableName), facts) of a schema.source object."""
        facts = {}
        db_type = source.get("dbType")
        source_type = SOURCE_TYPES_BY_NAME.get(str(db_type).lower())
        source_type = pb.MYSQL if source_type is None else source_type
        schema_name = str(source.get("dbName") or "")
        table_name = str(source.get("tableName") or "")
        version = source.get("dbVersion", "")
        if not isinstance(version, str):
            raise BlobFormatError("schema.source.dbVersion must be a string", value=version)
        if version != self.options.db_version:
            facts["dbVersion"] = version
        expected = {"dbType": SOURCE_TYPES[source_type]}
        if version:
            expected["dbVersion"] = version
        expected.update(dbName=schema_name, schemaName=schema_name, tableName=table_name)
        if source != expected or list(source) != list(expected):
            facts["source"] = orjson.dumps(source).decode()
        return (source_type, schema_name, table_name), facts

    def _sequence(self, header, seq: str | None, row_index: int, ext, facts) -> None:
        if seq is None:
            facts["sequenceId"] = "none"
            return
        value = int(seq)
        seq_id = value // _ROW_SCALE
        if seq_id >= 1 << 64:
            seq_id = 0
        header.seqId = seq_id
        if sequence_id(seq_id, row_index) != seq:
            facts["sequenceId"] = seq

    def _shape_facts(self, msg, payload, facts, ddl_extra: bool) -> None:
        """Facts for what the message holds beyond what its Entry says: a version other than
        ours, unknown keys, a `ddl` where the op has none (`ddl_extra`), images the op does not
        read, null images. Every extra payload key goes into one `payloadExtra`."""
        if _usual_shape(msg, payload, payload["op"]):
            return
        version = msg.get("version", None)
        if version is None and "version" not in msg:
            facts["version"] = "none"
        elif version != FORMAT_VERSION:
            if not isinstance(version, str):
                raise BlobFormatError("version must be a string", value=version)
            facts["version"] = version
        if not msg.keys() <= _KNOWN_TOP_SET:
            extra = {k: v for k, v in msg.items() if k not in _KNOWN_TOP}
            facts["extra"] = orjson.dumps(extra).decode()
        pextra = {} if payload.keys() <= _KNOWN_PAYLOAD_SET else {
            k: v for k, v in payload.items() if k not in _KNOWN_PAYLOAD}
        if ddl_extra and "ddl" in payload:
            if payload["ddl"] is None:
                facts["ddlNull"] = "1"
            else:
                pextra["ddl"] = payload["ddl"]
        used = _IMAGES_OF_OP.get(payload.get("op"), ())
        for key in ("before", "after"):  # an image the op has no use for travels as it came
            if key not in used and payload.get(key) is not None:
                pextra[key] = payload[key]
        if pextra:
            facts["payloadExtra"] = orjson.dumps(pextra).decode()
        if payload.get("before", 0) is None or payload.get("after", 0) is None:
            facts["nullImage"] = ",".join(k for k in ("before", "after") if k in payload and payload[k] is None)

    def _columns(self, dml, schema, ext, facts):
        """Columns of the DML event, codecs and names; built once per column set and reused."""
        columns_ext = ext.get("columns") if ext else None
        try:  # two JSON texts one after the other: the schema's columns, the extension's
            if schema is self._schema_value:
                own = self._schema_known.get("columns")
                if own is None:
                    own = self._schema_known["columns"] = orjson.dumps([schema["dataColumn"],
                                                                        schema.get("primaryKey", False)])
            else:
                own = orjson.dumps([schema["dataColumn"], schema.get("primaryKey", False)])
            key = own + orjson.dumps(columns_ext)
        except (TypeError, orjson.JSONEncodeError):
            key = None
        cached = self._column_sets.get(key) if key is not None else None
        if cached is None:
            template = pb.DMLEvent()
            table_facts: dict = {}
            codecs, names = self._build_columns(template, schema, ext, table_facts)
            plan = native_plan(names, codecs, self.options.timezone == "UTC") if self._native else None
            cached = (template, codecs, names, table_facts, plan, key, template.SerializeToString())
            if key is not None:
                if len(self._column_sets) > 4096:
                    self._column_sets.clear()
                self._column_sets[key] = cached
        template, codecs, names, table_facts, plan, key, _ = cached
        dml.CopyFrom(template)  # several times faster than extending the repeated field
        if _RESERVED_FLAG in table_facts:
            self._reserved = True
            table_facts = {k: v for k, v in table_facts.items() if k != _RESERVED_FLAG}
        facts.update(table_facts)
        return codecs, names, plan, key

    def _build_columns(self, dml, schema, ext, facts):
        cols = schema["dataColumn"]
        columns_ext = ext.get("columns") if ext else None
        if columns_ext is not None and (type(columns_ext) is not dict or type(columns_ext.get("types")) is not list
                                        or not columns_ext.keys() <= _COLUMNS_KEYS):
            raise BlobFormatError("the 'dts' extension's columns hold types (a list) and properties",
                                  value=columns_ext)
        types = columns_ext["types"] if columns_ext is not None else None
        props = columns_ext.get("properties", {}) if columns_ext is not None else {}
        pkey = schema.get("primaryKey")
        pkey = [] if pkey is None else pkey  # null: no key columns, and a fact keeps the null
        if not isinstance(pkey, list):
            raise BlobFormatError("schema.primaryKey must be a list", value=pkey)
        if types is not None and len(types) != len(cols):
            raise BlobFormatError("the extension's column types do not match schema.dataColumn", value=types)
        names, codecs = [], []
        for i, col in enumerate(cols):
            if not isinstance(col, dict) or not isinstance(col.get("name"), str):
                raise BlobFormatError("schema.dataColumn entries need a name", value=col)
            column = dml.columns.add(name=col["name"], isKey=col["name"] in pkey)
            if types is not None:
                column.originalType = types[i]
                _add_kv(column.properties, props.get(str(i), []))
            else:
                mapped = FOREIGN_COLUMN_TYPES.get(col.get("type"))
                if mapped is None:
                    raise BlobFormatError("unknown Blob column type", value=col.get("type"), column=col["name"])
                column.originalType = mapped[0]
                for key, value in mapped[1]:
                    column.properties.add(key=key, value=value)
            codec = codec_for(column, self.options)
            if types is not None and codec.blob_type != col.get("type") and column_is_boolean(column):
                # the extension's own `datahub:type` property on a column DataHub does not call
                # BOOLEAN: the Entry's property, not the bridge's marker (`facts_hold` decides)
                codec = codec_for(column, self.options, facts=False)
                facts[_RESERVED_FLAG] = True
            if not self.options.lossless:
                # strict: no reserved properties; a BOOLEAN column stays tinyint(1) holding 0/1
                kept = [p for p in column.properties if not p.key.startswith(RESERVED_PREFIX)]
                del column.properties[:]
                column.properties.extend(kept)
            if codec.blob_type != col.get("type"):
                raise BlobFormatError(f"column type {col.get('type')} does not match {column.originalType}",
                                      column=col["name"])
            names.append(col["name"])
            codecs.append(codec)
        if "primaryKey" not in schema:
            facts["primaryKey"] = "none"
        elif schema["primaryKey"] is None or pkey != [n for n in names if n in pkey]:
            facts["primaryKey"] = orjson.dumps(schema["primaryKey"]).decode()
        return codecs, names

    def _image(self, row, image, payload, codecs, names, ext, plan, raws, charsets) -> None:
        """Add one image's Data to `row`. `plan`: the C encoder of the column set (None: Python
        only), which takes the extension's raw Data and charsets too; `raws` and `charsets`: the
        extension's `values` and `charsets` (dicts or None, checked by _dml)."""
        body = payload.get(image)
        if not isinstance(body, dict) or not isinstance(body.get("dataColumn"), dict):
            raise BlobFormatError(f"payload.{image}.dataColumn must be an object", value=body)
        values = body["dataColumn"]
        image_ext = ext.get("image") if ext else None
        if image_ext is not None:
            if image_ext != "empty":
                raise BlobFormatError("the 'dts' extension's image can only be \"empty\"", value=image_ext)
            return
        if plan is not None:
            wire = plan.encode(values, _IMAGE_FIELDS[image][1], raws, charsets)
            if wire is not None:  # else the codecs below decide (and name what is wrong)
                row.MergeFromString(wire)
                return
        target = getattr(row, _IMAGE_FIELDS[image][0])
        unknown = set(values) - set(names)
        if unknown:
            raise BlobFormatError("image names columns not in schema.dataColumn", value=sorted(unknown))
        for by_index in (raws, charsets):  # keyed by column index: one that no column has is no value
            if by_index and not by_index.keys() <= _index_keys(len(names)):
                raise BlobFormatError("the 'dts' extension names a column index the message does not have",
                                      value=sorted(by_index))
        out = []
        get = values.get
        for i, name in enumerate(names):
            if raws and str(i) in raws:
                out.append(raw_to_data(raws[str(i)]))
                continue
            value = get(name, _ABSENT)
            if value is None:
                out.append(_NIL_DATA)
            elif value is _ABSENT:
                out.append(_NA_DATA)
            else:
                try:
                    own = codecs[i].charset or ""  # a value's charset when dts.charsets names none
                    out.append(codecs[i].from_blob(value, charsets.get(str(i), own) if charsets else own))
                except BridgeError as exc:
                    raise exc.located(column=name)
        target.extend(out)

    def _partner(self, seq, half, entry, columns_key, unknown_key=None):
        """The waiting other half of an update (None if this half is the first); raises for a
        second half of the same kind and for halves naming different tables, carrying different
        headers (the timestamp aside), different column sets or different unknown fields of the
        Entry."""
        pending = self._halves.get(seq)
        if pending is None:
            return None
        holder, _, other_entry, other_columns = pending
        if half in holder.halves:
            raise ConversionError(f"two {_OP_OF_HALF[half]} messages share a "
                                  f"sequenceId (the first, line {holder.line}, still waits for its partner)",
                                  sequence_id=seq)
        bh, ah = (other_entry.header, entry.header) if half == "after" else (entry.header, other_entry.header)
        if (bh.schemaName, bh.tableName, bh.sourceType) != (ah.schemaName, ah.tableName, ah.sourceType):
            # this half is rejected; the waiting one keeps waiting (its partner may still come, and
            # if not, `finish` reports it): neither vanishes
            raise ConversionError("the halves of an update name different tables", sequence_id=seq)
        if bh != ah and not _same_but_time(bh, ah):  # a differing timestamp travels as before.eventTime
            raise ConversionError("the halves of an update carry different headers", sequence_id=seq)
        # one row has one column set: halves with different ones (primaryKey, types) cannot join.
        # Equal keys (the JSON of schema.dataColumn and dts.columns) are the same set; different
        # keys may be too (a half whose extension was left out because it said nothing new, beside
        # one that has it): then the columns themselves decide
        if ((columns_key is None or columns_key != other_columns)
                and entry.event.dmlEvent.columns != other_entry.event.dmlEvent.columns):
            raise ConversionError("the halves of an update carry different column sets", sequence_id=seq)
        if holder.unknown != unknown_key:
            raise ConversionError("the halves of an update carry different unknown fields", sequence_id=seq)
        return pending

    def _pair(self, seq, half, row, facts, entry, partner, columns_key, unknown_key=None):
        """Join the two halves of an update (`row` already holds both images); returns (row,
        facts, complete). Without a partner the half waits."""
        if partner is None:
            if len(self._halves) >= self.max_pending:
                # the oldest waiting half is reported (see `evicted`), the current one waits
                old_seq, (old, *_) = self._halves.popitem(last=False)
                err = ConversionError(f"update half without its partner within {self.max_pending} messages",
                                      sequence_id=old_seq, line=old.line)
                err.count = 1
                self.evicted.append(err)
            self._halves[seq] = (_Row(seq, row, {half}, self._line, unknown_key, self._reserved), facts, entry,
                                 columns_key)
            return row, facts, False
        _, other_facts, other_entry, _ = partner
        del self._halves[seq]
        before_entry = other_entry if half == "after" else entry
        after_entry = entry if half == "after" else other_entry
        bh, ah = before_entry.header, after_entry.header
        before_facts, after_facts = (other_facts, facts) if half == "after" else (facts, other_facts)
        if bh.timestamp != ah.timestamp and "eventTime" not in before_facts:
            before_facts = {**before_facts, "eventTime": str(bh.timestamp * 1000)}
        out = dict(after_facts)
        for key in set(before_facts) | set(after_facts):
            if before_facts.get(key) != after_facts.get(key):
                out["before." + key] = before_facts.get(key, "default")
        if half == "before":
            entry.CopyFrom(other_entry)
            entry.event.dmlEvent.ClearField("rows")
        return row, out, True

    def _regroup(self, entry, row, row_index, nrows, columns_key=None, unknown_key=None) -> list[pb.Entry]:
        if nrows == 1:
            entry.event.dmlEvent.rows.append(row)
            return [entry]
        # the rows of one event: same header, same event properties, same dmlEvent (its columns,
        # which the column-set key fixes, and its type; else its bytes), same row count. A
        # message differing in any of them starts an event of its own (reported if it never
        # completes): it never merges into another, losing what differs.
        key = _event_key(entry, nrows, columns_key, unknown_key)
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = _Event(entry, nrows)
        if row_index in event.rows:  # (0 <= row_index < nrows: checked in _dml)
            raise ConversionError(f"row {row_index} of {nrows} repeated", seq_id=entry.header.seqId)
        event.rows[row_index] = row
        event.messages += 2 if key[1] == _UPDATE else 1
        event.reserved = event.reserved or self._reserved
        if len(event.rows) < nrows:
            return []
        del self._events[key]
        self._completed += event.messages - (2 if key[1] == _UPDATE else 1)  # its other rows' messages
        self._reserved = event.reserved
        out = event.entry
        rows = event.rows
        out.event.dmlEvent.rows.extend([rows[i] for i in range(nrows)])
        return [out]


def _event_key(entry, nrows, columns_key=None, unknown_key=None) -> tuple:
    """What the rows of one event share: its header, DML type, columns (the column-set key, else
    the DMLEvent's bytes), event properties, row count and unknown fields (`_regroup`)."""
    dml = entry.event.dmlEvent
    event_props = entry.event.properties
    return (entry.header.SerializeToString(), dml.dmlEventType,
            ("json", columns_key) if columns_key is not None else ("pb", dml.SerializeToString()),
            tuple((p.key, p.value) for p in event_props) if event_props else None, nrows, unknown_key)


# the top level of the `dts` extension as the encoder writes it (bridge/blob/blob.schema.json, dtsExtension)
_EXTENSION_TYPES = {"header": dict, "event": dict, "columns": dict, "row": list, "rowProperties": list,
                    "charsets": dict, "values": dict, "image": str, "unknown": dict}


def images_of(op: str) -> tuple:
    """The row images a DML op's message holds."""
    return _IMAGES_OF_OP[op]


# ---- unknown protobuf fields (blob_encode.unknown_fields): back into their messages ---------------

_MESSAGE_CLASSES = {cls.DESCRIPTOR.name: cls for cls in (
    pb.Entry, pb.Header, pb.Event, pb.BeginEvent, pb.CommitEvent, pb.DDLEvent, pb.RollbackEvent, pb.HeartbeatEvent,
    pb.CheckpointEvent, pb.DMLEvent, pb.Column, pb.RowChange, pb.Data, pb.KVPair)}
_ALWAYS_THERE = frozenset(("header", "event"))  # an Entry the decoder builds always has these


def _unknown_patches(unknown) -> tuple[list, list, bytes]:
    """The extension's `unknown` ({path: base64}) checked: (patches of the Entry, patches of the
    message's row, the Entry's part as a key that the halves and rows of one Entry share). A patch
    is (steps, bytes): steps are (field name, list index or None) from the Entry or the row down to
    a message, and the bytes hold only fields protobuf keeps as unknown there."""
    if type(unknown) is not dict:
        raise BlobFormatError("the 'dts' extension's unknown is an object of base64 strings", value=unknown)
    once, below = [], []
    for text, data in unknown.items():
        root, steps, descriptor = _patch_path(text)
        try:
            raw = base64.b64decode(data, validate=True) if type(data) is str else b""
        except (binascii.Error, ValueError):
            raw = b""
        probe = _MESSAGE_CLASSES[descriptor.name]()
        try:
            probe.MergeFromString(raw)
        except ProtobufDecodeError:
            raw = b""
        if not raw or probe.ListFields():  # nothing, or fields the message knows: not unknown ones
            raise BlobFormatError(f"the 'dts' extension's unknown {text!r} is not what the bridge writes", value=data)
        (below if root == "row" else once).append((steps, raw))
    key = orjson.dumps(sorted((k, v) for k, v in unknown.items() if not k.startswith("row"))) if once else None
    return once, below, key


def _patch_path(text) -> tuple[str, tuple, object]:
    """(root, steps, descriptor of the message reached) of a path such as "header",
    "event.dmlEvent.columns.3" or "row.newColumns.2"; "entry" is the Entry itself."""
    names = text.split(".") if type(text) is str else [""]
    root = "row" if names[0] == "row" else "entry"
    if names[0] in ("row", "entry"):
        names = names[1:] if names[0] == "row" or names == ["entry"] else [""]
    descriptor = pb.RowChange.DESCRIPTOR if root == "row" else pb.Entry.DESCRIPTOR
    steps = []
    at = 0
    while at < len(names):
        fd = descriptor.fields_by_name.get(names[at])
        if fd is None or fd.message_type is None or root == "entry" and fd.name == "rows":
            raise BlobFormatError(f"the 'dts' extension's unknown names no message: {text!r}", value=text)
        index = None
        if fd.is_repeated:
            at += 1
            if at == len(names) or not names[at].isdigit() or not names[at].isascii():
                raise BlobFormatError(f"the 'dts' extension's unknown names no message: {text!r}", value=text)
            index = int(names[at])
        steps.append((fd.name, index))
        descriptor = fd.message_type
        at += 1
    return root, tuple(steps), descriptor


def _check_row_patches(patches, half: str, images: tuple, with_data: bool, columns: int, properties: int) -> None:
    """A row's patches name only what this message brings to the row, so that none can fail once
    a waiting half's row is touched: the Data of its images, and (all but a before half) the row
    itself and its properties."""
    for steps, _ in patches:
        name, index = steps[0] if steps else (None, None)
        if name in _FIELD_IMAGES:
            ok = _FIELD_IMAGES[name] in images and with_data and index < columns
        else:
            ok = half != "before" and (name is None or index < properties)
        if not ok:
            raise BlobFormatError("the 'dts' extension's unknown names a part of the row this message does not hold",
                                  value=".".join(["row"] + [f"{n}.{i}" if i is not None else n for n, i in steps]))


def _patch(message, patches) -> None:
    """Merge each patch's unknown fields into the message its steps reach from `message`."""
    for steps, raw in patches:
        target = message
        for name, index in steps:
            if index is None:
                if name not in _ALWAYS_THERE and not target.HasField(name):
                    raise BlobFormatError(f"the 'dts' extension's unknown names a {name} the message has not")
                target = getattr(target, name)
            else:
                items = getattr(target, name)
                if index >= len(items):
                    raise BlobFormatError(f"the 'dts' extension's unknown names {name} {index}, which is not there")
                target = items[index]
        target.MergeFromString(raw)


_DML_ONLY = frozenset(("columns", "row", "rowProperties", "charsets", "values", "image"))
_DML_EXTENSION_KEYS = frozenset(_EXTENSION_TYPES)


def _check_extension(ext: dict, dml: bool) -> None:
    """An unknown key, or a part of another JSON type or of another kind of message, is an error: read
    leniently, it would be dropped or misread. `_feed` calls this for every message but a DML one
    whose keys are all known and none null; that one's parts are checked where they are read
    (`_header`, `_build_columns`, `_dml`, `_image`), off the path of a plain message."""
    for key, value in ext.items():
        if type(value) is not _EXTENSION_TYPES.get(key) or not dml and key in _DML_ONLY:
            raise BlobFormatError(f"the 'dts' extension's {key!r} is not what the bridge writes", value=value)


_DML_EVENT_KEYS = frozenset(("properties",))
# dts.event.absent (a non-DML Entry whose Event lacks the sub-message its messageType names, or has
# no Event at all): what else that part may then say
_ABSENT_PARTS = ("sub", "event")
_ABSENT_KEYS = {"sub": frozenset(("absent", "properties")), "event": frozenset(("absent",))}
_ONE_ROW = (0, 1)
_COLUMNS_KEYS = frozenset(("types", "properties"))


_INDEX_KEYS: dict[int, frozenset] = {}


def _index_keys(n: int) -> frozenset:
    keys = _INDEX_KEYS.get(n)
    if keys is None:
        keys = _INDEX_KEYS[n] = frozenset(str(i) for i in range(n))
    return keys


# protobuf takes any int for a bool field (-1 becomes true): the extension's must be JSON booleans
_BOOL_FIELDS = frozenset(
    f.name for d in (pb.Header.DESCRIPTOR, *(e.message_type for e in pb.Event.DESCRIPTOR.fields if e.message_type))
    for f in d.fields if f.type == f.TYPE_BOOL)


def _set_field(message, key: str, value) -> None:
    """A field of the `dts` extension onto its protobuf message, its JSON type kept."""
    if key in _BOOL_FIELDS and type(value) is not bool:
        raise BlobFormatError(f"extension field {key} must be true or false", value=value)
    setattr(message, key, value)


def _same_but_time(a, b) -> bool:
    """Whether two headers differ in their timestamp at most."""
    c = type(a)()
    c.CopyFrom(a)
    c.timestamp = b.timestamp
    return c == b


def _usual_shape(msg: dict, payload: dict, op) -> bool:
    """The usual DML message, which needs no shape fact: our version, no top-level key but ours,
    and a payload of only the images its op reads, op, sequenceId and timestamp."""
    return (payload.keys() == _PLAIN_PAYLOADS.get(op) and msg.get("version") == FORMAT_VERSION
            and msg.keys() <= _KNOWN_TOP_SET)


def _pairs(pairs) -> list:
    """The [key, value] pairs of an extension's properties, checked: a dict or a two-letter string
    would unpack as well, and mean something else; and both are strings (protobuf takes a null
    for an empty string, which would change the value without a word)."""
    if type(pairs) is not list or any(type(p) is not list or len(p) != 2 or type(p[0]) is not str
                                      or type(p[1]) is not str for p in pairs):
        raise BlobFormatError("the 'dts' extension's properties are a list of [key, value] pairs of strings",
                              value=pairs)
    return pairs


def _add_kv(target, pairs) -> None:
    for key, value in _pairs(pairs):
        target.add(key=key, value=value)


_RESERVED_FLAG = ""  # (a key no fact has) in a column set's facts: a column's own reserved-prefix property


def _ext_header_reserved(fields) -> bool:
    """Whether a `dts.header` holds a property of reserved prefix (any JSON: checked where read)."""
    props = fields.get("properties") if type(fields) is dict else None
    return type(props) is list and any(type(p) is list and p and type(p[0]) is str
                                       and p[0].startswith(RESERVED_PREFIX) for p in props)


def _add_facts(target, facts: dict) -> None:
    for key in sorted(facts):
        target.add(key=RESERVED_PREFIX + key, value=facts[key])


def _seq_of(msg) -> str | None:
    try:
        return msg["payload"]["sequenceId"]
    except (KeyError, TypeError):
        return None


read_back_with(BlobDecoder)  # facts_hold's default (encode cannot import this module back)


def blob_to_entries(messages: Iterable[dict], options: Options = DEFAULT_OPTIONS) -> Iterator[pb.Entry]:
    """Entries rebuilt from a stream of Blob message dicts; unpaired halves raise at the end."""
    decoder = BlobDecoder(options)
    for msg in messages:
        yield from decoder.feed(msg)
    errors = decoder.finish()
    if errors:
        raise errors[0]
