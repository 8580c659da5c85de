"""DataHub Tuple rows -> DTS Entries (docs/tuple.md).

Each Tuple row (an update: each pair of rows) becomes one DML Entry holding one row change: the
Tuple side does not say how rows were grouped into binlog events. Update halves (U/Y/N and U/N/Y)
are paired by `_sequence_id_` (and `_source_table_`); a half still waiting at the end of input is
reported by `finish()`, never dropped silently.

Without an explicit DTS column set, columns get the DTS type of their field type (`FIELD_COLUMNS`);
with one (`columns=`), DTS -> Tuple -> DTS restores the original types. In lossless mode (the
default) what DTS cannot derive from the header travels in row properties under the reserved
prefix `datahub:` (`sequenceId` of a row that is not its event's first, a millisecond
`eventTime`, a `sourceTable` that is not `db.table`), so Tuple -> DTS -> Tuple is exact.

>>> schema = record_schema([pb.Column(name="id", originalType="bigint(20)")])
>>> row = {"id": 42, "_sequence_id_": "9000000", "_operation_type_": "I", "_execute_time_": 1605339932000,
...        "_before_image_": "N", "_after_image_": "Y"}
>>> [e] = tuples_to_entries([row], schema, table="db.t")
>>> (e.header.seqId, e.header.timestamp, e.header.tableName, e.event.dmlEvent.rows[0].newColumns[0].sv)
(9, 1605339932, 't', '42')
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from bridge.errors import BridgeError, ConversionError, TupleFormatError
from bridge.native import speedups
from bridge.native.contract import Kind
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.tuple.encode import (
    INT_RANGES,
    LEGACY_TIME_COLUMN,
    META_NAMES,
    column_type,
    load_record_schema,
    record_schema,
)
from bridge.values import (
    BOOLEAN_PROPERTY,
    FROM_TUPLE,
    RESERVED_PREFIX,
    TUPLE_OP_IMAGES,
    TYPES,
    decimal_text,
    float32,
    native_of,
    seq_id_of,
    sequence_id,
)
from bridge.values.plans import plan_column
from bridge.values.tuples import C_MISS, AsText
from bridge.wire import subscribe_pb2 as pb

__all__ = ["tuples_to_entries", "TupleDecoder", "FIELD_CHECKS", "FIELD_COLUMNS", "FROM_TUPLE", "OP_IMAGES",
           "decimal_text"]

_MAX_TIME = (1 << 32) * 1000  # a DTS timestamp is uint32 seconds

# field type -> (originalType, column properties) of its DTS column when no column set is given.
# DECIMAL takes the precision and scale its values need (decimal(65,30) when they are all NULL).
FIELD_COLUMNS: dict[str, tuple[str, tuple]] = {
    "BIGINT": ("bigint(20)", ()),
    "INTEGER": ("int(11)", ()),
    "SMALLINT": ("smallint(6)", ()),
    "TINYINT": ("tinyint(4)", ()),
    "DOUBLE": ("double", ()),
    "FLOAT": ("float", ()),
    "DECIMAL": ("decimal(65,30)", ()),
    "BOOLEAN": ("tinyint(1)", ((BOOLEAN_PROPERTY, "BOOLEAN"),)),
    "TIMESTAMP": ("datetime(6)", ()),
    "STRING": ("longtext", ()),
}
_MAX_PRECISION, _MAX_SCALE = 65, 30

# (_operation_type_, _before_image_, _after_image_) -> (DMLType, half): the rows DataWorks writes.
OP_IMAGES: dict[tuple[str, str, str], tuple[int, str]] = {
    flags: (i.dml_type, i.image) for flags, i in TUPLE_OP_IMAGES.items()}


# ---- Tuple values: checks against their field type (`FIELD_CHECKS`) ------------------------------

def _check_int(ftype: str) -> Callable[[Any], int]:
    lo, hi = INT_RANGES[ftype]

    def check(v):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TupleFormatError(f"{ftype} value must be an integer", value=v)
        if not lo <= v <= hi:
            raise TupleFormatError(f"{ftype} value out of range", value=v)
        return v
    return check


def _check_double(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TupleFormatError("DOUBLE value must be a finite number", value=v)
    return float(v)


def _check_float(v) -> float:
    return float32(_check_double(v), TupleFormatError)


def _check_decimal(v) -> Decimal:
    if isinstance(v, str):
        try:
            v = Decimal(v)
        except InvalidOperation:
            raise TupleFormatError("DECIMAL value must be decimal digits", value=v) from None
    elif isinstance(v, int) and not isinstance(v, bool):
        v = Decimal(v)
    if not isinstance(v, Decimal) or not v.is_finite():
        raise TupleFormatError("DECIMAL value must be a finite decimal", value=v)
    return v


def _check_boolean(v) -> bool:
    if not isinstance(v, bool):
        raise TupleFormatError("BOOLEAN value must be true or false", value=v)
    return v


def _check_string(v) -> str:
    if not isinstance(v, str):
        raise TupleFormatError("STRING value must be text", value=v)
    return v


# field type -> check(value) -> the value in its Python form (TupleFormatError when it does not fit).
FIELD_CHECKS: dict[str, Callable[[Any], Any]] = {
    "BIGINT": _check_int("BIGINT"), "INTEGER": _check_int("INTEGER"), "SMALLINT": _check_int("SMALLINT"),
    "TINYINT": _check_int("TINYINT"), "TIMESTAMP": _check_int("TIMESTAMP"), "DOUBLE": _check_double,
    "FLOAT": _check_float, "DECIMAL": _check_decimal, "BOOLEAN": _check_boolean, "STRING": _check_string,
}

FromTuple = Callable[[Any], pb.Data]


def dts_converter(column: pb.Column, options: Options = DEFAULT_OPTIONS) -> FromTuple:
    """Tuple value -> Data of a DTS column (its row's `from_tuple`)."""
    ct = column_type(column, options)
    return ct.row.from_tuple(ct, options)


def _column(name: str, field_type: str, original_type: str | None = None) -> pb.Column:
    default_type, props = FIELD_COLUMNS[field_type]
    column = pb.Column(name=name, originalType=original_type or default_type)
    for key, value in props:
        column.properties.add(key=key, value=value)
    return column


def _decimal_shape(value: Decimal) -> tuple[int, int]:
    """(integer digits, fraction digits) of a decimal value."""
    sign, digits, exponent = value.as_tuple()
    if value == 0:
        return 0, max(0, -exponent)
    return max(0, len(digits) + exponent), max(0, -exponent)


@lru_cache(maxsize=512)
def _decimal_column(name: str, int_digits: int, scale: int, options: Options) -> tuple[pb.Column, FromTuple]:
    precision = max(1, int_digits + scale)
    if precision > _MAX_PRECISION or scale > _MAX_SCALE:
        raise ConversionError(f"DECIMAL value needs decimal({precision},{scale}); MySQL allows at most "
                              f"decimal({_MAX_PRECISION},{_MAX_SCALE})", column=name)
    column = _column(name, "DECIMAL", f"decimal({precision},{scale})")
    return column, dts_converter(column, options)


# field type -> a test of a value ({v}) under which its FIELD_CHECKS check returns the value itself
# (an exact type within the field's range); None: every value goes to the check
_PLAIN_VALUES: dict[str, str | None] = {
    **{ftype: f"type({{v}}) is int and {lo} <= {{v}} <= {hi}" for ftype, (lo, hi) in INT_RANGES.items()},
    "DOUBLE": "type({v}) is float and {v} - {v} == 0.0",  # finite (inf - inf and nan - nan are nan)
    "FLOAT": None,  # float32 rounds
    "DECIMAL": "type({v}) is Decimal and {v}.is_finite()",
    "BOOLEAN": "{v} is True or {v} is False",
    "STRING": "type({v}) is str",
}


def _compile_checks(field_types: list, names: list):
    """A function `checked(row, check) -> [value of each field]`: FIELD_CHECKS of every field's
    value in field order, the plain ones (`_PLAIN_VALUES`) tested inline and the rest given to
    `check(index, value)`, which checks (and names the field of) the first bad one."""
    lines = ["def checked(row, check):", "    get = row.get"]
    scope = {"Decimal": Decimal}
    for i, ftype in enumerate(field_types):
        scope[f"name{i}"] = names[i]
        lines.append(f"    v{i} = get(name{i})")
        test = _PLAIN_VALUES[ftype]
        if test is None:
            lines.append(f"    if v{i} is not None: v{i} = check({i}, v{i})")
        else:
            lines.append(f"    if v{i} is not None and not ({test.format(v=f'v{i}')}): v{i} = check({i}, v{i})")
    lines.append("    return [" + ", ".join(f"v{i}" for i in range(len(field_types))) + "]")
    exec(compile("\n".join(lines), f"<Tuple checks of {len(field_types)} fields>", "exec"), scope)  # noqa: S102
    return scope["checked"]


# ---- the C fast path: checked Tuple values -> an image's Data on the wire (Plan.encode) -------------
#
# A Blob plan's `encode` writes each column's Data from its Blob value as the Blob codec's from_blob
# does. For most columns the checked Tuple value is that Blob value and the row's from_tuple makes
# the same Data (integers, floats, booleans, text, json, time, base64 binary). The rest are adapted
# first, by the row's C kind (`NativeKind.from_tuple`, bridge/values/tuples.py), and only where the
# Data is sure to be from_tuple's; anything else leaves the image to the Python converters, which
# decide (and name the error).

_MAX_SHAPE_PLANS = 64  # C encoders one decoder builds for the shapes of its DECIMAL values
_SHIPPED_ROWS = {row.kind: row for row in TYPES}  # a type row a test registered in place of one is Python's


class _NativeImages:
    """One column set's C encoder: `wire(values, field)` -> the image's Data as RowChange field
    `field` (1 oldColumns, 2 newColumns) on the wire, or None for the converters to make."""
    __slots__ = ("plan", "names", "adapters")

    def __init__(self, plan, names: list, adapters: tuple) -> None:
        self.plan, self.names, self.adapters = plan, names, adapters

    def wire(self, values: list, field: int) -> bytes | None:
        blob = dict(zip(self.names, values))
        for i, name, adapt in self.adapters:
            value = values[i]
            if value is not None:
                value = adapt(value)
                if value is C_MISS:
                    return None
                blob[name] = value
        return self.plan.encode(blob, field)


def _native_images(fields: list, columns: list, options: Options) -> _NativeImages | None:
    """The C encoder of a column set, or None (no C extension; a column C does not take: the
    converters make every image)."""
    if speedups is None or not columns:
        return None
    utc = options.timezone == "UTC"
    plan_columns, adapters = [], []
    for i, ((name, field_type), column) in enumerate(zip(fields, columns)):
        ct = column_type(column, options)
        if ct.row is not _SHIPPED_ROWS.get(ct.kind):
            return None
        pc = plan_column(name, ct, utc)
        if pc is None:
            return None
        c_from_tuple = native_of(ct).from_tuple
        adapt = c_from_tuple and c_from_tuple(ct, field_type, INT_RANGES.get(field_type), options)
        if adapt is False:
            return None
        if isinstance(adapt, AsText):
            adapt = adapt.adapt
            pc = pc._replace(kind=Kind.UTF8, fsp=0)
        if adapt is not None:
            adapters.append((i, name, adapt))
        plan_columns.append(tuple(pc)[:-1])  # a Blob plan's columns: no `out`
    try:
        plan = speedups.Plan(plan_columns, True)
    except (ValueError, TypeError, OverflowError):  # a column C's Plan refuses: the converters' table
        return None
    return _NativeImages(plan, [name for name, _ in fields], tuple(adapters))


class _Half:
    """One update row waiting for its partner."""
    __slots__ = ("half", "values", "meta", "number")

    def __init__(self, half, values, meta, number):
        self.half, self.values, self.meta, self.number = half, values, meta, number


class TupleDecoder:
    """Stream-level Tuple -> DTS converter: `feed` rows, collect Entries; `finish` at end of input.

    `table` ("db.table" or a (db, table) pair) names the source table when rows carry no
    `_source_table_`; `columns` (the table's DTS columns) restores the original column types.
    With the C extension an image's Data are written by the column set's C encoder where the
    values are ones it is sure of (`_NativeImages`), the rest by the converters; `native=False`
    keeps every value in Python: the reference the tests and benchmarks compare with.
    """

    def __init__(self, schema, options: Options = DEFAULT_OPTIONS, table=None, columns=None,
                 max_pending: int = 100_000, native: bool = True) -> None:
        self.options = options
        self._native_on = native
        self.schema = load_record_schema(schema)
        self.max_pending = max_pending
        self.rows = 0
        self.entries = 0
        self._pending: OrderedDict = OrderedDict()
        # update halves pushed out of the pairing window: errors for the caller to report (values.Decoder)
        self.evicted: list[BridgeError] = []
        self._table = _split_table(table) if isinstance(table, str) else tuple(table or ("", ""))
        types = {f["name"]: f["type"] for f in self.schema["fields"]}
        self._time_field = "_execute_time_" if "_execute_time_" in types else LEGACY_TIME_COLUMN
        required = ["_sequence_id_", "_operation_type_", self._time_field, "_before_image_", "_after_image_"]
        missing = [name for name in required if name not in types]
        if missing:
            raise TupleFormatError("RecordSchema lacks DataWorks meta columns", value=missing)
        self._fields = [(f["name"], f["type"]) for f in self.schema["fields"] if f["name"] not in META_NAMES]
        self._known = frozenset(types)
        self._checks = [(name, FIELD_CHECKS[ftype]) for name, ftype in self._fields]
        self._checked = _compile_checks([ftype for _, ftype in self._fields], [name for name, _ in self._fields])
        self._columns, self._codecs = self._build_columns(columns)
        self._open_decimals = [i for i, (name, ftype) in enumerate(self._fields)
                               if ftype == "DECIMAL" and columns is None]
        # per column set (None: the fixed one; else the open DECIMAL columns' shapes): its C encoder
        self._natives: dict = {}
        self._shape_plans = 0  # of them, built for DECIMAL shapes (no DTS columns)
        # (column set key, DML type, schema, table) -> an Entry with everything but the row's own fields
        self._templates: dict = {}

    def _build_columns(self, columns):
        if columns is None:
            out = [_column(name, ftype) for name, ftype in self._fields]
        else:
            out = list(columns)
            if [c.name for c in out] != [name for name, _ in self._fields]:
                raise TupleFormatError("the DTS columns do not match the RecordSchema's data fields",
                                       value=[c.name for c in out])
            expected = {f["name"]: f["type"] for f in record_schema(out, self.options)["fields"]}
            for name, ftype in self._fields:
                if expected[name] != ftype:
                    raise TupleFormatError(f"field type {ftype} does not match the DTS column type "
                                           f"({expected[name]}){self._string_dates_hint(out, name, ftype)}",
                                           column=name)
        return out, [dts_converter(c, self.options) for c in out]

    def _string_dates_hint(self, columns, name: str, ftype: str) -> str:
        """A temporal column read as a STRING field: rows written under zero_dates="string" (the
        option decides the field type, so the reader must say it too)."""
        if ftype != "STRING" or self.options.zero_dates == "string":
            return ""
        as_text = record_schema(columns, self.options.replace(zero_dates="string"))["fields"]
        if any(f["name"] == name and f["type"] == "STRING" for f in as_text):
            return "; rows written under zero_dates=\"string\" (--zero-dates string) are read with it too"
        return ""

    # -- public ------------------------------------------------------------------------------
    def feed(self, row: dict, *, number: int | None = None) -> list[pb.Entry]:
        """Entries completed by one row (none for the first half of an update)."""
        self.rows += 1
        number = self.rows if number is None else number
        try:
            out = self._feed(row, number)
        except BridgeError as exc:
            raise exc.located(row=number, sequence_id=_seq_of(row))
        except (TypeError, ValueError, OverflowError) as exc:
            raise TupleFormatError(f"malformed Tuple row ({type(exc).__name__}: {exc})", row=number,
                                   sequence_id=_seq_of(row)) from None
        self.entries += len(out)
        return out

    @property
    def pending(self) -> int:
        return self.pending_rows

    @property
    def pending_rows(self) -> int:
        """Rows fed but not yet part of a returned Entry (update halves waiting for a partner)."""
        return len(self._pending)

    def finish(self) -> list[BridgeError]:
        """Errors for every update half left without its partner (each with `.count` = 1)."""
        errors = self.evicted
        for (seq, _), half in self._pending.items():
            errors.append(_unpaired(seq, half, "at end of input"))
        self._pending = OrderedDict()
        self.evicted = []
        return errors

    # -- per row -------------------------------------------------------------------------------
    def _feed(self, row: Any, number: int) -> list[pb.Entry]:
        if not isinstance(row, dict):
            raise TupleFormatError("a Tuple row must be an object", value=row)
        if not self._known.issuperset(row):
            raise TupleFormatError("row has fields not in the RecordSchema", value=sorted(set(row) - self._known))
        meta = self._meta(row)
        dml_type, half = OP_IMAGES[meta[1]]
        values = self._checked(row, self._check)
        if dml_type != pb.UPDATE:
            before, after = (values, None) if half == "before" else (None, values)
            return [self._entry(dml_type, meta, before, after)]
        key = (meta[0], meta[3])
        other = self._pending.pop(key, None)
        if other is None:
            self._pending[key] = _Half(half, values, meta, number)
            if len(self._pending) > self.max_pending:
                (old_seq, _), old = self._pending.popitem(last=False)
                self.evicted.append(_unpaired(old_seq, old, f"within {self.max_pending} rows"))
            return []
        if other.half == half:
            self._pending[key] = other
            raise TupleFormatError(f"two update {half} rows share _sequence_id_ {meta[0]}")
        if other.meta[2] != meta[2]:
            self._pending[key] = other
            raise TupleFormatError("the halves of an update disagree on the execute time",
                                   value=[other.meta[2], meta[2]])
        before, after = (other.values, values) if half == "after" else (values, other.values)
        return [self._entry(pb.UPDATE, meta, before, after)]

    def _check(self, index: int, value):
        """FIELD_CHECKS of one value (the compiled checks' way for what they are not sure of)."""
        name, check = self._checks[index]
        try:
            return check(value)
        except BridgeError as exc:
            raise exc.located(column=name)

    def _meta(self, row: dict) -> tuple:
        """(sequence id, (op, before, after), time ms, source table) of a row's meta columns."""
        seq = row.get("_sequence_id_")
        if not isinstance(seq, str) or not seq.isdigit() or not seq.isascii():
            raise TupleFormatError("_sequence_id_ must be a string of digits", value=seq)
        images = (row.get("_operation_type_"), row.get("_before_image_"), row.get("_after_image_"))
        if images not in OP_IMAGES:
            if images[0] not in ("I", "U", "D"):
                raise TupleFormatError("_operation_type_ must be I, U or D", value=images[0])
            raise TupleFormatError("_before_image_/_after_image_ do not fit _operation_type_", value=images)
        time = row.get(self._time_field)
        if isinstance(time, bool) or not isinstance(time, int) or not 0 <= time < _MAX_TIME:
            raise TupleFormatError(f"{self._time_field} must be epoch milliseconds", value=time)
        source = row.get("_source_table_")
        if source is not None and not isinstance(source, str):
            raise TupleFormatError("_source_table_ must be text", value=source)
        return seq, images, time, source

    def _entry(self, dml_type: int, meta: tuple, before, after) -> pb.Entry:
        seq, _, time, source = meta
        table = _split_table(source) if source is not None else self._table
        key, columns, codecs = self._row_columns(before, after)
        template = self._templates.get((key, dml_type, table))
        if template is None:
            template = self._template(key, dml_type, table, columns)
        entry = pb.Entry()
        entry.CopyFrom(template)
        header = entry.header
        header.timestamp = time // 1000
        header.seqId = seq_id_of(int(seq))
        row = entry.event.dmlEvent.rows.add()
        native = self._natives.get(key) if self._native_on else None
        if native is None and self._native_on and key not in self._natives:
            native = self._native(key, columns)
        # each image from C where it is sure, else from the converters (which raise as before:
        # C is sure only of values the converters take, so the first error is theirs either way)
        wire = b""
        if before is not None:
            old = native.wire(before, 1) if native is not None else None
            if old is None:
                row.oldColumns.extend(self._image(codecs, before))
            else:
                wire = old
        if after is not None:
            new = native.wire(after, 2) if native is not None else None
            if new is None:
                row.newColumns.extend(self._image(codecs, after))
            else:
                wire += new
        if wire:
            row.MergeFromString(wire)
        if self.options.lossless:
            facts = {}
            if sequence_id(header.seqId) != seq:
                facts["sequenceId"] = seq
            if time % 1000:
                facts["eventTime"] = str(time)
            if source is not None and f"{header.schemaName}.{header.tableName}" != source:
                facts["sourceTable"] = source
            for key in sorted(facts):
                row.properties.add(key=RESERVED_PREFIX + key, value=facts[key])
        return entry

    def _row_columns(self, before, after):
        """(key, columns, codecs) of one row change: DECIMAL fields take the shape their values
        need; the key names the column set (None: the decoder's own, else the DECIMAL shapes)."""
        if not self._open_decimals:
            return None, self._columns, self._codecs
        columns, codecs = list(self._columns), list(self._codecs)
        key = []
        for i in self._open_decimals:
            shapes = [_decimal_shape(image[i]) for image in (before, after)
                      if image is not None and image[i] is not None]
            if shapes:
                int_digits, scale = max(s[0] for s in shapes), max(s[1] for s in shapes)
                columns[i], codecs[i] = _decimal_column(self._fields[i][0], int_digits, scale, self.options)
                key.append((int_digits, scale))
            else:
                key.append(None)
        return tuple(key), columns, codecs

    def _template(self, key, dml_type: int, table: tuple, columns) -> pb.Entry:
        """The Entry every row change of this column set, DML type and table starts from (copied)."""
        template = pb.Entry()
        header = template.header
        header.version = 1
        header.sourceType = pb.MYSQL
        header.messageType = pb.DML
        header.schemaName, header.tableName = table
        dml = template.event.dmlEvent
        dml.dmlEventType = dml_type
        dml.columns.extend(columns)
        if len(self._templates) >= 1024:
            self._templates.clear()
        self._templates[(key, dml_type, table)] = template
        return template

    def _native(self, key, columns) -> _NativeImages | None:
        """The C encoder of a column set, built once. Without DTS columns each shape of the DECIMAL
        values is a column set of its own: past _MAX_SHAPE_PLANS of them (values of ever new
        shapes) the new ones stay with the converters, so a Plan is never built per row."""
        if len(self._natives) >= 1024:
            self._natives.clear()
            self._shape_plans = 0
        if key is not None:
            if self._shape_plans >= _MAX_SHAPE_PLANS:
                self._natives[key] = None
                return None
            self._shape_plans += 1
        native = self._natives[key] = _native_images(self._fields, columns, self.options)
        return native

    def _image(self, codecs, values) -> list[pb.Data]:
        out = []
        for (name, _), codec, value in zip(self._fields, codecs, values):
            if value is None:
                out.append(pb.Data(dataType=pb.NIL))
                continue
            try:
                out.append(codec(value))
            except BridgeError as exc:
                raise exc.located(column=name)
        return out


def _split_table(source: str) -> tuple[str, str]:
    """"db.table" -> (db, table), split at the first dot (database names rarely hold one)."""
    db, _, table = source.partition(".")
    return db, table


def _unpaired(seq: str, half: _Half, when: str) -> ConversionError:
    missing = "after" if half.half == "before" else "before"
    err = ConversionError(f"update {half.half} row without its partner {when} ({missing} row missing)",
                          sequence_id=seq, row=half.number)
    err.count = 1
    return err


def _seq_of(row) -> str | None:
    seq = row.get("_sequence_id_") if isinstance(row, dict) else None
    return seq if isinstance(seq, str) else None


def tuples_to_entries(rows: Iterable, schema, options: Options = DEFAULT_OPTIONS, table=None,
                      columns=None) -> Iterator[pb.Entry]:
    """Entries rebuilt from Tuple rows (dicts, or (row number, dict) pairs as the readers yield);
    an update half without its partner raises at the end."""
    decoder = TupleDecoder(schema, options, table=table, columns=columns)
    for item in rows:
        if isinstance(item, tuple):
            number, row = item
            yield from decoder.feed(row, number=number)
        else:
            yield from decoder.feed(item)
    errors = decoder.finish()
    if errors:
        raise errors[0]
