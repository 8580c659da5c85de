"""DTS Entry -> DataHub Tuple rows, and the Tuple side's tables (docs/tuple.md).

Each column's field type and value converter come from its row of the type table
(`bridge/values/types.py`: `tuple_type`, the row's `to_tuple`; the per-value converters are in
`bridge/values/tuples.py`). This module's own tables: `META_COLUMNS` (DataWorks meta column -> type
and extractor) and `ROW_IMAGES` (DMLType -> the rows one row change gives, from `values.DML_IMAGES`).

A Tuple row is a dict: field name -> Python value (int, float, Decimal, bool, str or None). One DML
row change gives one row (an update two: U/Y/N then U/N/Y, sharing `_sequence_id_` and
`_execute_time_`); every other entry gives none and is counted. A Tuple row has no lossless
extension, so a value a field cannot hold exactly is a ConversionError (docs/tuple.md).

>>> from bridge import pb
>>> e = pb.Entry(header=pb.Header(messageType=pb.DML, timestamp=1605339932, seqId=9, schemaName="db", tableName="t"))
>>> dml = e.event.dmlEvent
>>> _ = dml.columns.add(name="id", originalType="bigint(20)")
>>> _ = dml.rows.add(newColumns=[pb.Data(dataType=pb.INT64, sv="42")])
>>> entry_to_tuples(e)
[{'id': 42, '_sequence_id_': '9000000', '_operation_type_': 'I', '_execute_time_': 1605339932000, '_before_image_': 'N', '_after_image_': 'Y'}]
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from bridge.errors import BridgeError, ConversionError, TupleFormatError
from bridge.native import wire_scan
from bridge.options import DEFAULT_OPTIONS, Options, per_options
from bridge.values import (
    BINARY_TEXT,
    DML_IMAGES,
    INT_TUPLE_TYPES,
    RESERVED_PREFIX,
    ROW_DIGITS,
    SUBSTITUTION_NOTES,
    TIMESTAMP_RANGE,
    TO_TUPLE,
    TUPLE_TYPES,
    ColumnSetCache,
    ColumnType,
    Substituted,
    check_dml_event,
    check_row_images,
    column_is_boolean,
    float32,
    note_substitution,
    parse_column_type,
    sequence_id,
    temporal_as_text,
    tuple_type,
)
from bridge.values.plans import native_tuple_plan
from bridge.wire import subscribe_pb2 as pb

__all__ = ["entry_to_tuples", "entries_to_tuples", "TupleEncoder", "record_schema", "load_record_schema",
           "tuple_type", "column_type", "float32", "TUPLE_TYPES", "INT_TUPLE_TYPES", "TO_TUPLE", "BINARY_TEXT",
           "FIELD_TYPES", "META_COLUMNS", "META_NAMES", "LEGACY_TIME_COLUMN", "ROW_IMAGES", "TIMESTAMP_RANGE",
           "INT_RANGES"]

DT = pb.DataType
_NIL, _NA = int(DT.NIL), int(DT.NA)  # plain ints: the enum wrapper's attribute lookup is a Python call
FIELD_TYPES = ("BIGINT", "INTEGER", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT", "DECIMAL", "BOOLEAN",
               "TIMESTAMP", "STRING")
# field type -> the integers it holds
INT_RANGES = {"TINYINT": (-(1 << 7), (1 << 7) - 1), "SMALLINT": (-(1 << 15), (1 << 15) - 1),
              "INTEGER": (-(1 << 31), (1 << 31) - 1), "BIGINT": (-(1 << 63), (1 << 63) - 1),
              "TIMESTAMP": TIMESTAMP_RANGE}

# ---- meta columns and the rows of one row change -------------------------------------------------

class RowMeta(NamedTuple):
    """What the meta columns of one Tuple row say."""
    sequence_id: str
    op: str
    time: int
    before: str
    after: str
    source: str


# meta column -> (field type, extractor); `_source_table_` only with Options.source_table.
META_COLUMNS: dict[str, tuple[str, Callable[[RowMeta], Any]]] = {
    "_sequence_id_": ("STRING", lambda m: m.sequence_id),
    "_operation_type_": ("STRING", lambda m: m.op),
    "_execute_time_": ("BIGINT", lambda m: m.time),
    "_before_image_": ("STRING", lambda m: m.before),
    "_after_image_": ("STRING", lambda m: m.after),
    "_source_table_": ("STRING", lambda m: m.source),
}
LEGACY_TIME_COLUMN = "_excute_time_"  # older DataWorks pages' spelling, accepted when reading
META_NAMES = frozenset(META_COLUMNS) | {LEGACY_TIME_COLUMN}

# DMLType -> (op, before image, after image, which DTS image) for each row one row change gives.
ROW_IMAGES: dict[int, tuple[tuple[str, str, str, str], ...]] = {
    dml_type: tuple((i.tuple_op, i.before_flag, i.after_flag, "old" if i.field == "oldColumns" else "new")
                    for i in images)
    for dml_type, images in DML_IMAGES.items()}

def column_type(column: pb.Column, options: Options = DEFAULT_OPTIONS) -> ColumnType:
    """The column's type as the Tuple side converts it (under `zero_dates="string"` temporal
    columns are STRING fields of their text)."""
    return temporal_as_text(parse_column_type(column.originalType, column_is_boolean(column)), options)


# ---- RecordSchema --------------------------------------------------------------------------------

def _meta_fields(options: Options) -> list[str]:
    return [name for name in META_COLUMNS if name != "_source_table_" or options.source_table]


@dataclass
class _TupleTable:
    """Per column set: names, converters and the RecordSchema, built once; `native` the C plan of
    the column set (bridge.values.plans.native_tuple_plan) or None, and its PlanColumns."""
    names: list
    converters: list
    schema: dict
    native: Any = None
    plan_columns: list | None = None

    def image(self, datas) -> dict:
        n = len(self.names)
        if len(datas) != n:
            if not datas:  # no Data at all: every column absent from this image
                return dict.fromkeys(self.names)
            raise ConversionError(f"row image has {len(datas)} values for {n} columns")
        out = {}
        self.fill(out, datas, range(n))
        return out

    def fill(self, out: dict, datas, columns) -> None:
        """out[name] of each column index in `columns` (in order) from its Data in `datas`."""
        names, converters = self.names, self.converters
        for i in columns:
            name, d = names[i], datas[i]
            dt = d.dataType
            if dt == _NIL or dt == _NA:
                out[name] = None
            elif dt > _NA:
                raise ConversionError(f"unknown DataType {dt}", column=name)
            else:
                try:
                    out[name] = converters[i](d)
                except BridgeError as exc:
                    raise exc.located(column=name)
                except Substituted as found:
                    out[name] = found.best
                    note_substitution(found, name)


def _build_table(columns, options: Options, native: bool = False) -> _TupleTable:
    names, converters, fields, cts = [], [], [], []
    seen = set()
    for c in columns:
        if c.name.lower() in seen:
            raise ConversionError("duplicate column name", column=c.name)
        if c.name in META_NAMES:
            raise ConversionError("column name is a DataWorks meta column", column=c.name)
        seen.add(c.name.lower())
        try:
            ct = column_type(c, options)
        except BridgeError as exc:
            raise exc.located(column=c.name)
        names.append(c.name)
        cts.append(ct)
        converters.append(ct.row.to_tuple(ct, options))
        fields.append({"name": c.name, "type": tuple_type(ct)})
    native_plan = native and native_tuple_plan(names, cts, [f["type"] for f in fields], options.timezone == "UTC",
                                               options.tuple_binary == "hex")
    fields += [{"name": name, "type": META_COLUMNS[name][0]} for name in _meta_fields(options)]
    plan, plan_columns = native_plan or (None, None)
    return _TupleTable(names, converters, {"fields": fields}, plan, plan_columns)


def record_schema(columns, options: Options = DEFAULT_OPTIONS) -> dict:
    """DataHub RecordSchema JSON of a table's DTS columns: data columns in order, then meta columns.

    >>> record_schema([pb.Column(name="id", originalType="int(10) unsigned")])["fields"][:2]
    [{'name': 'id', 'type': 'BIGINT'}, {'name': '_sequence_id_', 'type': 'STRING'}]
    """
    return _build_table(columns, options).schema


_FIELD_KEYS = frozenset({"name", "type", "comment", "notnull"})


def load_record_schema(schema) -> dict:
    """Check a RecordSchema (dict, JSON text or a pydatahub RecordSchema) and return it as
    `{"fields": [{"name": ..., "type": ...}]}` with upper-case types (pydatahub writes lower case)."""
    if hasattr(schema, "to_json") and not isinstance(schema, (dict, str, bytes)):
        schema = schema.to_json()
    if isinstance(schema, (str, bytes, bytearray)):
        try:
            schema = orjson.loads(schema)
        except orjson.JSONDecodeError as exc:
            raise TupleFormatError(f"RecordSchema is not valid JSON ({exc.msg})", value=schema) from None
    if not isinstance(schema, dict) or not isinstance(schema.get("fields"), list):
        raise TupleFormatError("a RecordSchema is an object with a list of fields", value=schema)
    fields, seen = [], set()
    for field in schema["fields"]:
        if not isinstance(field, dict) or not isinstance(field.get("name"), str) or not field["name"]:
            raise TupleFormatError("a field needs a non-empty name", value=field)
        name, ftype = field["name"], field.get("type")
        if set(field) - _FIELD_KEYS:
            raise TupleFormatError(f"unknown keys in field {name!r}", value=sorted(set(field) - _FIELD_KEYS))
        if not isinstance(ftype, str) or ftype.upper() not in FIELD_TYPES:
            raise TupleFormatError(f"unknown DataHub field type for {name!r}", value=ftype)
        if name.lower() in seen:
            raise TupleFormatError("duplicate field name", value=name)
        seen.add(name.lower())
        ftype = ftype.upper()
        meta_type = "BIGINT" if name == LEGACY_TIME_COLUMN else META_COLUMNS.get(name, (ftype,))[0]
        if ftype != meta_type:
            raise TupleFormatError(f"meta column {name} must be {meta_type}", value=ftype)
        fields.append({"name": name, "type": ftype})
    return {"fields": fields}


# ---- the encoder ---------------------------------------------------------------------------------

# ---- reserved-prefix properties (docs/tuple.md, "DataHub facts"): a row change's facts are what
# TupleDecoder writes (and the Blob decoder, for its rows' sequenceId and eventTime); every other
# reserved-prefix key of a DML Entry is an ordinary property, which a Tuple row cannot carry

_TUPLE_FACTS = frozenset(("eventTime", "sequenceId", "sourceTable"))
_NO_FACTS: dict = {}
_MAX_SEQ_ID = 1 << 64


def _has_reserved(props) -> bool:
    return any(p.key.startswith(RESERVED_PREFIX) for p in props)


def _not_facts(where: str, props, why: str) -> ConversionError:
    keys = sorted({p.key for p in props if p.key.startswith(RESERVED_PREFIX)})
    return ConversionError(f"{where} properties hold reserved-prefix keys that are not the bridge's DataHub facts "
                           f"({why}): a Tuple row cannot carry them", value=keys)


def _check_entry_properties(entry: pb.Entry, header: pb.Header) -> None:
    """A DML Entry's header and event properties hold no reserved-prefix key: the bridge writes its
    facts only in row properties, so such a key is the Entry's own, and a Tuple row has no place
    for it (it was read as a fact before, and rewrote the row's meta columns)."""
    if header.properties and _has_reserved(header.properties):
        raise _not_facts("header", header.properties, "the bridge writes none in a DML Entry's header")
    if _has_reserved(entry.event.properties):
        raise _not_facts("event", entry.event.properties, "the bridge writes none in an Event")


def _row_facts(row, header: pb.Header, index: int) -> dict:
    """The DataHub facts of a row change (name -> value), or ConversionError: its reserved-prefix
    properties are facts only when they are exactly what TupleDecoder writes for the meta columns
    they give, on an Entry whose header is the one TupleDecoder writes for them: `sequenceId`
    (digits; the header's seqId is its value // 10**6, 0 past 64 bits; there when it is not
    `sequence_id(seqId, index)`), `eventTime` (epoch ms that are not whole seconds, of the header's
    second), `sourceTable` (split at its first dot it names the header's table, and it is not
    `db.table`), in that (sorted) order; so DTS -> Tuple -> DTS gives them back. Anything else is
    the Entry's own property, which no Tuple row can carry."""
    pairs = [(p.key[len(RESERVED_PREFIX):], p.value) for p in row.properties if p.key.startswith(RESERVED_PREFIX)]
    if not pairs:
        return _NO_FACTS
    facts = dict(pairs)
    why = None
    if not facts.keys() <= _TUPLE_FACTS:
        why = "not a Tuple fact: " + ", ".join(RESERVED_PREFIX + k for k in sorted(facts.keys() - _TUPLE_FACTS))
    elif [k for k, _ in pairs] != sorted(facts):
        why = "repeated, or not in the order the bridge writes them"
    else:
        seq, time, source = facts.get("sequenceId"), facts.get("eventTime"), facts.get("sourceTable")
        table = f"{header.schemaName}.{header.tableName}"
        if seq is not None:
            value = int(seq) if seq.isdigit() and seq.isascii() else None
            if value is None or seq == sequence_id(header.seqId, index) or header.seqId != (
                    value // _ROW_SCALE if value // _ROW_SCALE < _MAX_SEQ_ID else 0):
                why = f"sequenceId {seq!r} is not what the bridge writes for seqId {header.seqId}, row {index}"
        if why is None and time is not None:
            value = int(time) if time.isdigit() and time.isascii() else None
            if value is None or not value % 1000 or value // 1000 != header.timestamp:
                why = f"eventTime {time!r} is not a millisecond of timestamp {header.timestamp}"
        if why is None and source is not None:
            db, _, name = source.partition(".")
            if source == table or (db, name) != (header.schemaName, header.tableName):
                why = f"sourceTable {source!r} is not the header's table {table!r} as TupleDecoder writes it"
    if why is not None:
        raise _not_facts("row", row.properties, why)
    return facts


def _table_name(header: pb.Header) -> str | None:
    if header.schemaName or header.tableName:
        return f"{header.schemaName}.{header.tableName}"
    return None


_SEQ_KEY, _TIME_KEY = "_sequence_id_", "_execute_time_"
_ROW_SCALE = 10 ** ROW_DIGITS

CELL_BUDGET = 1 << 20  # values of one Entry's rows `TupleEncoder.stream` holds before it streams them
_PIECE_CELLS = 1 << 16  # a streamed Entry is converted in pieces of rows of about this many values


class _StreamedRows:
    """The rows of one large Entry (`TupleEncoder.stream`): len() is their number, and iterating
    converts them again, piece by piece, as the writer takes them (a first pass checked them all
    and noted their substitutions: this pass notes none, so each is counted once)."""

    def __init__(self, encoder: TupleEncoder, entry: pb.Entry, raw: bytes | None, count: int) -> None:
        self._encoder, self._entry, self._raw, self._count = encoder, entry, raw, count

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[dict]:
        header = self._entry.header
        pieces = self._encoder._pieces(self._entry, header, self._raw)
        slot = SUBSTITUTION_NOTES
        while True:
            noting, slot.notes = slot.notes, None  # around each piece only: the writer runs between
            try:
                piece = next(pieces, None)
            except BridgeError as exc:  # not expected: the first pass went through the same steps
                raise exc.located(seq_id=header.seqId, table=_table_name(header))
            finally:
                slot.notes = noting
            if piece is None:
                return
            yield from piece


class TupleEncoder:
    """Stream-level DTS -> Tuple converter: caches row builders per column set and counts output.

    `emitted` counts rows, `entries` the entries that gave rows, `not_emitted` the rest by reason.
    `convert(entry, raw)`: with the C extension, a DML Entry's images are read off its wire bytes
    (`raw`, else the Entry serialised once) by the column set's C plan; an image C is not sure of
    (and every value a temporal policy substitutes) is converted here, so the rows are the same.
    `native=False` keeps every value in Python: the reference the tests and benchmarks compare with.
    `stream(entry, raw)` gives the same rows without holding those of a large Entry at once.
    """

    def __init__(self, options: Options = DEFAULT_OPTIONS, native: bool = True,
                 cell_budget: int = CELL_BUDGET) -> None:
        self.options = options
        self.cell_budget = cell_budget  # values of one Entry's rows stream() holds at most
        self.entries = 0
        self.emitted = 0
        self.not_emitted: Counter = Counter()
        self._tables = ColumnSetCache(lambda columns: _build_table(columns, self.options, native))
        self._meta = [(name, META_COLUMNS[name][1]) for name in _meta_fields(options)]
        assert self._meta[0][0] == _SEQ_KEY and _TIME_KEY in META_COLUMNS  # the C rows put seq first
        self._wire_tables: dict = {}  # the columns' bytes on the wire -> their table
        # (DML type, schema, table), the meta dicts of its images, (time, the same with that time)
        self._metas: tuple = (None, (), (None, ()))

    @property
    def meta_names(self) -> list[str]:
        """The meta columns every row gets, in order (`_source_table_` only with Options.source_table)."""
        return [name for name, _ in self._meta]

    def native_plan(self, entry: pb.Entry, raw: bytes | None = None) -> tuple[Any, list] | None:
        """(the C plan, its PlanColumns) of a DML Entry's column set, or None when C does not take
        it (for a caller writing the rows C converts itself: bridge/spark/to_datahub.py's sink)."""
        table = self._wire_table(entry.event.dmlEvent, entry.header, raw)
        return None if table.native is None else (table.native, table.plan_columns)

    def schema(self, columns) -> dict:
        """The RecordSchema of a column set (cached with its row builder)."""
        return self._tables.get(columns).schema

    def convert(self, entry: pb.Entry, raw: bytes | None = None) -> list[dict]:
        """The Tuple rows of one Entry, all at once (`stream` for a writer that takes them one by one)."""
        header = entry.header  # `_run(self._convert, ...)` unrolled: this runs once per Entry
        try:
            out = self._convert(entry, header, raw)
        except BridgeError as exc:
            raise exc.located(seq_id=header.seqId, table=_table_name(header))
        except (ValueError, TypeError, OverflowError, UnicodeError) as exc:
            raise ConversionError(f"cannot convert entry ({exc})", seq_id=header.seqId,
                                  table=_table_name(header)) from exc
        if out:
            self.entries += 1
            self.emitted += len(out)
        return out

    def stream(self, entry: pb.Entry, raw: bytes | None = None) -> list[dict] | _StreamedRows:
        """The rows of `convert(entry, raw)` for a writer that takes them one by one (the CLI's
        `convert`, `entries_to_tuples`), without holding those of one Entry at once: a small Entry
        of many rows and wide columns can give gigabytes of rows. An Entry of more than
        `cell_budget` values (rows x images x columns, meta columns included) is converted in
        pieces of rows: a first pass raises any error before a row is given (an Entry is converted
        whole or not at all) and keeps none; the result is a sized iterable that converts them
        again, piece by piece, as they are taken (docs/decisions.md). Other Entries: `convert`."""
        if entry.header.messageType == pb.DML:
            dml = entry.event.dmlEvent
            images = ROW_IMAGES.get(dml.dmlEventType)
            if images and len(dml.rows) * len(images) * (len(dml.columns) + len(self._meta)) > self.cell_budget:
                return self._run(self._stream, entry, raw)
        return self.convert(entry, raw)

    def _run(self, method, entry: pb.Entry, raw: bytes | None):
        """Call a converter of one Entry: errors located at the Entry, output counted."""
        header = entry.header
        try:
            out = method(entry, header, raw)
        except BridgeError as exc:
            raise exc.located(seq_id=header.seqId, table=_table_name(header))
        except (ValueError, TypeError, OverflowError, UnicodeError) as exc:
            raise ConversionError(f"cannot convert entry ({exc})", seq_id=header.seqId,
                                  table=_table_name(header)) from exc
        if out:
            self.entries += 1
            self.emitted += len(out)
        return out

    def _stream(self, entry: pb.Entry, header: pb.Header, raw: bytes | None) -> _StreamedRows:
        """stream's conversion of a large DML Entry: a first pass over all its pieces, which raises
        what `convert` raises and keeps nothing; the rows are made again as they are taken."""
        count = 0
        for piece in self._pieces(entry, header, raw):
            count += len(piece)
        return _StreamedRows(self, entry, raw, count)

    def _pieces(self, entry: pb.Entry, header: pb.Header, raw: bytes | None) -> Iterator[list[dict]]:
        """The rows of a DML Entry (one with rows of a known DMLType: `stream` sends no other) in
        pieces of rows, in order, each of about _PIECE_CELLS values: the same rows, and the same
        first error, as `convert` (the Entry-level checks come first, in its order). C converts a
        piece from the bytes of an Entry holding only its rows, Python a piece C leaves to it."""
        dml = entry.event.dmlEvent
        check_dml_event(dml)
        images = ROW_IMAGES[dml.dmlEventType]
        table = self._wire_table(dml, header, raw)
        _check_entry_properties(entry, header)
        check_row_images(dml)
        rows, nrows = dml.rows, len(dml.rows)
        step = max(1, _PIECE_CELLS // (len(images) * (len(table.names) + len(self._meta))))
        native = table.native is not None
        for first in range(0, nrows, step):
            stop = min(nrows, first + step)
            out = None
            if native:
                part = pb.Entry()
                part.event.dmlEvent.rows.extend(rows[first:stop])
                out = self._native_rows(entry, header, dml, images, table, part.SerializeToString(), first, stop)
            yield out if out is not None else self._python_rows(header, dml, images, table, first, stop)

    def _convert(self, entry: pb.Entry, header: pb.Header, raw: bytes | None) -> list[dict]:
        mtype = header.messageType
        if mtype != pb.DML:
            if mtype not in pb.MessageType.values():
                raise ConversionError(f"unknown MessageType {mtype}")
            self.not_emitted[pb.MessageType.Name(mtype)] += 1
            return []
        dml = entry.event.dmlEvent
        if not check_dml_event(dml):
            self.not_emitted["DML without rows"] += 1
            return []
        images = ROW_IMAGES[dml.dmlEventType]
        table = self._wire_table(dml, header, raw)
        if header.properties or entry.event.properties:
            _check_entry_properties(entry, header)
        if table.native is not None:  # C leaves an Entry with row properties (facts) to Python
            out = self._native_rows(entry, header, dml, images, table, raw)
            if out is not None:  # C's walk checked the images as check_row_images does
                return out
        check_row_images(dml)  # after the columns, as every converter orders its checks
        return self._python_rows(header, dml, images, table, 0, len(dml.rows))

    def _python_rows(self, header: pb.Header, dml: pb.DMLEvent, images, table: _TupleTable,
                     first: int, stop: int) -> list[dict]:
        """The rows of row changes first to stop, in Python (the Entry-level checks made)."""
        out = []
        rows = dml.rows
        for index, row in enumerate(rows if first == 0 and stop == len(rows) else rows[first:stop], first):
            row_facts = _row_facts(row, header, index) if row.properties else _NO_FACTS
            if "sourceTable" in row_facts and not self.options.source_table:
                raise _not_facts("row", row.properties, "sourceTable, without Options.source_table's column")
            seq = row_facts["sequenceId"] if "sequenceId" in row_facts else sequence_id(header.seqId, index)
            time = int(row_facts["eventTime"]) if "eventTime" in row_facts else header.timestamp * 1000
            source = (row_facts["sourceTable"] if "sourceTable" in row_facts
                      else f"{header.schemaName}.{header.tableName}")
            for op, before, after, image in images:
                values = table.image(row.oldColumns if image == "old" else row.newColumns)
                meta = RowMeta(seq, op, time, before, after, source)
                for name, extract in self._meta:
                    values[name] = extract(meta)
                out.append(values)
        return out


    def _wire_table(self, dml: pb.DMLEvent, header: pb.Header, raw: bytes | None) -> _TupleTable:
        """The column set's table; with the Entry's bytes, found by the columns' bytes (C's scan),
        cheaper than comparing the parsed columns (ColumnSetCache) when tables interleave."""
        scanned = wire_scan(raw) if raw is not None else None
        if scanned is None:
            return self._tables.get(dml.columns, (header.schemaName, header.tableName))
        table = self._wire_tables.get(scanned[0])
        if table is None:
            if len(self._wire_tables) >= 1024:
                self._wire_tables.clear()
            table = self._wire_tables[scanned[0]] = self._tables.get(dml.columns)
        return table

    def _native_rows(self, entry, header, dml, images, table, raw, first: int = 0,
                     stop: int | None = None) -> list[dict] | None:
        """The rows of a DML Entry without DataHub facts from the C plan, its gaps filled as
        `_convert` fills them; None when C leaves the whole Entry to Python (row properties, an
        image the op must not carry, a seqId beyond 63 bits, malformed bytes). With `first` and
        `stop` (`_pieces`), the rows of those row changes, `raw` an Entry holding only them."""
        key = (dml.dmlEventType, header.schemaName, header.tableName)
        if self._metas[0] != key:  # the other meta columns of each image, made from the table once
            source = f"{header.schemaName}.{header.tableName}"
            self._metas = key, tuple(
                {name: extract(RowMeta("", op, 0, before, after, source)) for name, extract in self._meta[1:]}
                for op, before, after, _ in images), (None, ())
        time = header.timestamp * 1000
        if self._metas[2][0] != time:  # ... and with each Entry's time (shared by the Entries of a second)
            self._metas = *self._metas[:2], (time, tuple({**meta, _TIME_KEY: time} for meta in self._metas[1]))
        metas = self._metas[2][1]
        if raw is None:
            raw = entry.SerializeToString()
        out = table.native.tuples(raw, dml.dmlEventType, _SEQ_KEY, header.seqId * _ROW_SCALE + first, metas)
        n = len(images)
        if out is None or len(out) != ((len(dml.rows) if stop is None else stop) - first) * n:
            return None
        for k, values in enumerate(out):
            if type(values) is dict:
                continue
            index = first + k // n
            row, image = dml.rows[index], images[k % n][3]
            datas = row.oldColumns if image == "old" else row.newColumns
            if values is None:  # an image C did not read
                values = table.image(datas)
                values[_SEQ_KEY] = sequence_id(header.seqId, index)
                values.update(metas[k % n])
            else:  # the values C is not sure of, in column order
                values, holes = values
                table.fill(values, datas, holes)
            out[k] = values
        return out


def entry_to_tuples(entry: pb.Entry, options: Options = DEFAULT_OPTIONS) -> list[dict]:
    """Tuple rows of one Entry (a list: an update row change gives two, a non-DML entry none)."""
    return _encoder(options).convert(entry)


def entries_to_tuples(entries: Iterable[pb.Entry], options: Options = DEFAULT_OPTIONS) -> Iterator[dict]:
    """Tuple rows of a stream of Entries, in order, sharing one encoder's caches; the rows of a
    large Entry are made as they are taken (`TupleEncoder.stream`), never all held."""
    encoder = TupleEncoder(options)
    for entry in entries:
        yield from encoder.stream(entry)


_encoder = per_options(TupleEncoder)
