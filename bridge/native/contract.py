"""Every number the Python side and the C extension share, defined once for Python.

The C side defines the same numbers once in `bridge/native/src/speedups.h` (enums) and exports them as
`_speedups.CONTRACT` (C name -> value) and the layouts of the tuples it takes or returns as
`_speedups.LAYOUTS` (layout name -> field names); tests/test_native_contract.py checks both against
this module, and the protobuf numbers against bridge/wire/subscribe_pb2's descriptors, so a change
on one side that the other misses fails a test.

>>> TEMPORAL_KINDS["datetime"], Out.MICROS, NA
(<Kind.DATETIME: 9>, <Out.MICROS: 3>, 14)
>>> c_constants()["F_DATA_BV"]
4
"""
from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple

__all__ = ["Kind", "TEMPORAL_KINDS", "Out", "CharsetMode", "SinkOp", "TupleStorage", "TupleWriter", "DmlType", "WireType", "MT_DML", "NIL", "NA", "TUPLE_TS_HI",
           "PROTO_FIELDS", "PlanColumn", "CharsetEntry", "SinkTable", "Scanned", "SinkEntries", "SinkTaken",
           "TupleSinkField", "TupleSinkTable", "TupleSinkTaken",
           "LAYOUTS", "c_constants", "STRING_KINDS"]


class Kind(IntEnum):
    """A Plan column's value kind (C `K_*`): how C checks a value and what it makes of it."""

    LONG = 0       # canonical integer text -> int, within [lo, hi]
    DIGITS = 1     # canonical unsigned integer text -> the same text, within [0, hi]
    DOUBLE = 2     # text that is repr() of its double -> float
    DECIMAL = 3    # -?[0-9]+(\.[0-9]+)? -> the same text
    TEXT = 4       # text in a charset of the `set_charsets` table -> str
    BASE64 = 5     # bytes -> standard base64 str
    UTF8 = 6       # UTF-8 bytes (json, BYTES; time with need_bv, STRING: a charset on it is a label) -> str
    BOOL = 7       # INT8 "0" / "1" -> False / True
    DATE = 8       # YYYY-MM-DD (UTC) -> epoch ms
    DATETIME = 9   # YYYY-MM-DD HH:MM:SS[.f{fsp}] (UTC) -> epoch ms
    TIMESTAMP = 10  # the same with " +00:00" -> epoch ms


# a temporal type row's kind -> its C kind (bridge/values/plans.py)
TEMPORAL_KINDS = {"date": Kind.DATE, "datetime": Kind.DATETIME, "timestamp": Kind.TIMESTAMP}

# the C kinds whose value is a str read from text or bytes (the Spark Tuple sink's STRING writer)
STRING_KINDS = frozenset({Kind.TEXT, Kind.UTF8, Kind.BASE64})


class Out(IntEnum):
    """What a Tuple plan makes of a column's value besides the Blob value (C `O_*`)."""

    SAME = 0     # the Blob value itself
    DECIMAL = 1  # a Decimal of its text
    FLOAT32 = 2  # the float32 a FLOAT field stores
    MICROS = 3   # a temporal's epoch microseconds within DataHub's TIMESTAMP range
    HEX = 4      # bytes of a base64 column in lower-case hex (Options.tuple_binary)


class CharsetMode(IntEnum):
    """How C decodes a charset of the `set_charsets` table (C `CS_*`)."""

    UTF8 = 0     # UTF-8, checked in C
    CODEC = 1    # Python's codec of that name, read into a unit table once
    CHARMAP = 2  # a 256-character decoding table (`mapping`)


class SinkOp(IntEnum):
    """The uint8 op codes of `Sink.take()`'s op column (C `OP_*`): an index into these names."""

    INSERT = 0
    UPDATE_BEFOR = 1
    UPDATE_AFTER = 2
    DELETE = 3


class TupleStorage(IntEnum):
    """How `TupleSink` stores an output column (C `TS_*`): the Arrow layout of the field's Spark type."""

    BOOL = 0        # bits
    INT8 = 1
    INT16 = 2
    INT32 = 3
    INT64 = 4       # bigint, and timestamp's microseconds
    FLOAT32 = 5
    FLOAT64 = 6
    DECIMAL128 = 7  # the unscaled value, 16 bytes
    STRING = 8      # int32 offsets and UTF-8 bytes


class TupleWriter(IntEnum):
    """What writes an output field's values in `TupleSink` for one column set (C `W_*`)."""

    NULL = 0        # the column set has no such column: null
    INT = 1         # a Kind.LONG column's int within [lo, hi]
    MICROS = 2      # a temporal column's epoch microseconds (Out.MICROS) within [lo, hi]
    DOUBLE = 3      # a Kind.DOUBLE column's finite double
    FLOAT32 = 4     # a Kind.DOUBLE column's float32 (Out.FLOAT32)
    BOOL = 5        # a Kind.BOOL column's bool
    DECIMAL = 6     # an Out.DECIMAL column's value at scale `hi`, at most `lo` digits
    STRING = 7      # a text, json or base64 column's str (Out.SAME or Out.HEX)
    SEQ = 8         # _sequence_id_
    TIME = 9        # _execute_time_
    IMAGE_TEXT = 10  # a text per DmlType and image: (insert's, (update's before, after), delete's)


class DmlType(IntEnum):
    """subscribe.proto's DMLType, as C reads `dmlEventType` (C `DML_*`)."""

    INSERT = 0
    UPDATE = 1
    DELETE = 2


class WireType(IntEnum):
    """Protobuf wire types C reads and skips (C `WT_*`)."""

    VARINT = 0
    I64 = 1
    LEN = 2
    SGROUP = 3
    EGROUP = 4
    I32 = 5


MT_DML = 2  # subscribe.proto MessageType.DML: the only Entries C converts (C `MT_DML`)
NIL = 0   # subscribe.proto DataType.NIL: a null value (C `DT_NIL`)
STRING = 13  # DataType.STRING: text, temporal and time values (C `DT_STRING`)
NA = 14   # DataType.NA: the column is not in the image (C `DT_NA`), the largest DataType
TUPLE_TS_HI = 253402271999000000  # bridge.tuple.encode.TIMESTAMP_RANGE's end, in microseconds (C `TUPLE_TS_HI`)

# "Message.field" -> field number, every field of proto/subscribe.proto C reads by number
# (C `F_<MESSAGE>_<FIELD>`); the whole schema C walks is `_speedups.SCHEMA`, checked by the test too.
PROTO_FIELDS: dict[str, int] = {
    "Entries.items": 1,
    "Entry.header": 1, "Entry.event": 2,
    "Header.version": 1, "Header.sourceType": 2, "Header.messageType": 3, "Header.timestamp": 4,
    "Header.serverId": 5, "Header.fileName": 6, "Header.position": 7, "Header.gtid": 8,
    "Header.schemaName": 9, "Header.tableName": 10, "Header.seqId": 11, "Header.eventIndex": 12,
    "Header.isLast": 13, "Header.properties": 15,
    "Event.dmlEvent": 2, "Event.properties": 15,
    "DMLEvent.dmlEventType": 1, "DMLEvent.columns": 2, "DMLEvent.rows": 3,
    "RowChange.oldColumns": 1, "RowChange.newColumns": 2, "RowChange.properties": 15,
    "Data.dataType": 1, "Data.charset": 2, "Data.sv": 3, "Data.bv": 4,
    "KVPair.key": 1, "KVPair.value": 2,
}


# ---- the positional tuples C takes or returns, field by field (C: `LAYOUTS`) -----------------------

class PlanColumn(NamedTuple):
    """One column of `Plan(columns, lossless, decimal)`; a Blob plan leaves `out` off (Out.SAME)."""

    name: str
    kind: int        # Kind
    datatype: int    # the canonical DataType of its values (NIL < datatype < NA)
    lo: int          # Kind.LONG / DIGITS: the range of the value
    hi: int
    charset: str     # the charset a canonical value carries ("" none)
    fsp: int         # temporal kinds: fractional digits, 0..6
    need_bv: bool    # Kind.UTF8: the value is in bv, not sv
    out: int = Out.SAME  # Out, a Tuple plan's only


class CharsetEntry(NamedTuple):
    """One charset of `set_charsets(table)`."""

    name: str        # MySQL name, lower case ("" none on the wire)
    mode: int        # CharsetMode
    codec: str       # Python codec name
    mapping: Any     # CharsetMode.CHARMAP: the 256-character str; else None
    check: bool      # the bytes must come back when the text is encoded again


class SinkTable(NamedTuple):
    """A table record of `Sink.entries(..., tables, ...)` (BlobEncoder.sink_table)."""

    plan: Any            # the table's Plan
    templates: tuple     # (pre, post) per DmlType
    ext_columns: bytes   # the extension's columns JSON
    key_indexes: tuple   # the shard key's column indexes
    foreign_default: bool
    db: bytes
    table: bytes
    table_shard: bytes


class Scanned(NamedTuple):
    """What `scan(entry_bytes)` gives for a plain DML Entry."""

    columns_key: bytes
    dml_type: int    # DmlType
    rows: int


class SinkEntries(NamedTuple):
    """What `Sink.entries(...)` gives."""

    next: int        # the index of the first Entry left to Python (len(raws): none)
    entries: int     # Entries written
    messages: int    # messages (rows) written


class SinkTaken(NamedTuple):
    """What `Sink.take()` gives: string columns as (int32 offsets, data), fixed-width columns as bytes."""

    rows: int
    blob_offsets: bytes
    blob: bytes
    shard_key_offsets: bytes
    shard_key: bytes
    sequence_id_offsets: bytes
    sequence_id: bytes
    db_offsets: bytes
    db: bytes
    table_offsets: bytes
    table: bytes
    op: bytes         # uint8 SinkOp
    entry: bytes      # int32
    row: bytes        # int32
    partition: bytes  # int32
    offset: bytes     # int64
    event_time: bytes  # int64 microseconds


class TupleSinkField(NamedTuple):
    """One output field of a `TupleSinkTable`: how `TupleSink` writes its values for a column set."""

    writer: int      # TupleWriter
    column: int      # the Plan column a column writer reads (-1: none)
    lo: int          # INT, MICROS: the range of the value; DECIMAL: the precision
    hi: int          # ... DECIMAL: the scale
    text: Any        # IMAGE_TEXT: a tuple per DmlType of bytes per image; else None


class TupleSinkTable(NamedTuple):
    """A table record of `TupleSink.entries(..., tables, ...)` (bridge/spark/to_datahub.py's `_DtsToTuple`)."""

    plan: Any        # the column set's Tuple Plan
    fields: tuple    # a TupleSinkField per output value field


class TupleSinkTaken(NamedTuple):
    """What `TupleSink.take()` gives: positions as int32 / int64 bytes, then per output value field
    (validity bits, null count, int32 offsets or None, data)."""

    rows: int
    entry: bytes
    row: bytes
    partition: bytes
    offset: bytes
    columns: tuple


LAYOUTS: dict[str, tuple[str, ...]] = {cls.__name__: cls._fields for cls in
                                       (PlanColumn, CharsetEntry, SinkTable, Scanned, SinkEntries, SinkTaken,
                                        TupleSinkField, TupleSinkTable, TupleSinkTaken)}

_PREFIXES = ((Kind, "K_"), (Out, "O_"), (CharsetMode, "CS_"), (SinkOp, "OP_"), (TupleStorage, "TS_"),
             (TupleWriter, "W_"), (DmlType, "DML_"), (WireType, "WT_"))


def c_constants() -> dict[str, int]:
    """Every shared number under its C name: what `_speedups.CONTRACT` must equal."""
    out = {prefix + member.name: int(member) for enum, prefix in _PREFIXES for member in enum}
    out.update(MT_DML=MT_DML, DT_NIL=NIL, DT_STRING=STRING, DT_NA=NA, TUPLE_TS_HI=TUPLE_TS_HI)
    for path, number in PROTO_FIELDS.items():
        message, field = path.split(".")
        out[f"F_{message.upper()}_{field.upper()}"] = number
    return out
