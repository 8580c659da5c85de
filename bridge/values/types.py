"""Where each MySQL type is mapped: one row per type family, every face reads it from here.

Where is DATETIME mapped? In the `datetime` row of `TYPES` below: the MySQL type names it covers,
its canonical DTS DataType, its Blob type and codec factory (`bridge/values/codecs.py`), its
DataHub Tuple field type and its to/from-Tuple converters (`bridge/values/tuples.py`), its
Spark/Arrow type and the C fast path's value kind (a `NativeKind` below: `bridge/native/contract.py`'s
`Kind` and what each face's Python side does beside it: the Blob type C makes, the compiled
image's inline body, the Tuple decoder's C adapter). The per-value work is in the functions the
row names (temporal text: `bridge/values/temporal.py`). The shapes (`ColumnType`, `TypeRow`,
`NativeKind`) and the registry of rows are in `bridge/values/columns.py`, below the converters.

The faces look a row up through `type_row(kind)` (or `ColumnType.row`) only:
`codec_for` / `blob_type` (Blob), `tuple_type` and the TO_TUPLE / FROM_TUPLE views (Tuple),
`spark_type` (bridge/spark/jobs.py; from a Spark type, `arrow_type` gives its Arrow type and
`field_type_of_spark` its field type), `native_of` / `native_kind` (bridge/values/plans.py's C plans,
bridge/blob/rows.py's compiled images, bridge/tuple/decode.py's C adapters): no face keeps a table
keyed by the C kind. Adding a MySQL type is one row here plus tests (tests/test_types.py checks that every
row fills every column and that every face agrees with it); docs/decisions.md, "Each type mapped
once". A column value of a row's column is either the value itself or a rule: a function of the
parsed column type (and, for the Blob type, the Options) giving it.

>>> t = parse_column_type("bigint(20) unsigned")
>>> (t.family, t.unsigned, t.kind, blob_type(t), tuple_type(t), spark_type(t), native_kind(t).name)
('bigint', True, 'integer', 'STRING', 'DECIMAL', 'decimal(20,0)', 'DIGITS')
>>> row = type_row("datetime")
>>> (row.mysql_types, row.blob_type, row.tuple_type, row.spark_type, row.c_kind.name)
(('datetime',), 'DATE', 'TIMESTAMP', 'timestamp', 'DATETIME')
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import fields
from functools import lru_cache
from typing import Any

from bridge.errors import ConversionError, OptionsError
from bridge.native.contract import Kind
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.values import tuples as _tuple
from bridge.values.charsets import DEFAULT_CHARSET
from bridge.values.codecs import (
    BASE64_IMAGE,
    DECIMAL_IMAGE,
    DIGITS_IMAGE,
    DOUBLE_IMAGE,
    LONG_IMAGE,
    TEXT_IMAGE,
    Codec,
    _boolean_codec,
    _bytes_codec,
    _decimal_codec,
    _float_codec,
    _integer_codec,
    _temporal_codec,
    _text_codec,
    _utf8_codec,
)
from bridge.values.columns import (
    INT_WIDTHS,
    ROWS,
    ColumnType,
    NativeKind,
    TypeRow,
)
from bridge.values.events import RESERVED_PREFIX
from bridge.wire import subscribe_pb2 as pb

DT = pb.DataType
BLOB_TYPES = ("BOOLEAN", "DOUBLE", "DATE", "BYTES", "LONG", "STRING")

# integer width -> (signed Tuple field type, unsigned): unsigned values widen to the next type that holds them.
INT_TUPLE_TYPES: dict[int, tuple[str, str]] = {
    8: ("TINYINT", "SMALLINT"), 16: ("SMALLINT", "INTEGER"), 24: ("INTEGER", "INTEGER"),
    32: ("INTEGER", "BIGINT"), 64: ("BIGINT", "DECIMAL"),
}

# DataHub Tuple field type -> the Spark SQL type of its values (DECIMAL: precision from the column).
SPARK_TYPES = {"BIGINT": "bigint", "INTEGER": "int", "SMALLINT": "smallint", "TINYINT": "tinyint",
               "DOUBLE": "double", "FLOAT": "float", "DECIMAL": "decimal", "BOOLEAN": "boolean",
               "TIMESTAMP": "timestamp", "STRING": "string"}
SPARK_MAX_PRECISION = 38  # Spark's widest decimal

# Spark SQL type -> its Arrow type (given the pyarrow module): the one map from which both the Spark
# jobs' Arrow batches (`arrow_type`) and the Tuple Parquet files (bridge.tuple's ARROW_TYPES, through
# SPARK_TYPES) take their Arrow types. "decimal" alone is Spark's widest, decimal(38, 0);
# `arrow_type` reads a "decimal(p,s)" too. "binary" is no field type's: the Kafka key and value.
ARROW_TYPES_OF_SPARK: dict[str, Callable[[Any], Any]] = {
    "bigint": lambda pa: pa.int64(), "int": lambda pa: pa.int32(), "smallint": lambda pa: pa.int16(),
    "tinyint": lambda pa: pa.int8(), "double": lambda pa: pa.float64(), "float": lambda pa: pa.float32(),
    "boolean": lambda pa: pa.bool_(), "string": lambda pa: pa.string(), "binary": lambda pa: pa.binary(),
    "timestamp": lambda pa: pa.timestamp("us", tz="UTC"),
    "decimal": lambda pa: pa.decimal128(SPARK_MAX_PRECISION, 0),
}

# Spark SQL type (a decimal's without precision) -> the DataHub Tuple field type of its values.
FIELD_TYPES_OF_SPARK = {v: k for k, v in SPARK_TYPES.items()}


def arrow_type(spark_type: str, pa: Any = None):
    """The Arrow type of a Spark SQL type (its simpleString; "decimal(p,s)" keeps p and s).

    >>> arrow_type("decimal(20,0)"), arrow_type("timestamp")
    (Decimal128Type(decimal128(20, 0)), TimestampType(timestamp[us, tz=UTC]))
    """
    if pa is None:
        import pyarrow as pa
    if spark_type.startswith("decimal("):
        precision, scale = spark_type[len("decimal("):-1].split(",")
        return pa.decimal128(int(precision), int(scale))
    return ARROW_TYPES_OF_SPARK[spark_type](pa)


def field_type_of_spark(column: str, spark_type: str, hint: str = "") -> str:
    """The DataHub Tuple field type of a Spark column (`spark_type` its simpleString); an
    OptionsError naming the column (and ending in `hint`) when no field type matches.

    >>> field_type_of_spark("price", "decimal(10,2)"), field_type_of_spark("n", "int")
    ('DECIMAL', 'INTEGER')
    """
    kind = "decimal" if spark_type.startswith("decimal") else spark_type
    if kind not in FIELD_TYPES_OF_SPARK:
        raise OptionsError(f"column {column!r} has Spark type {spark_type}, which no DataHub field type matches"
                           + hint)
    return FIELD_TYPES_OF_SPARK[kind]


# ---- rules: a column of a row that depends on the column's definition ---------------------------

def _integer_blob_type(ct: ColumnType, options: Options) -> str:
    return "STRING" if ct.wide else "LONG"


def _decimal_blob_type(ct: ColumnType, options: Options) -> str:
    return "DOUBLE" if options.decimal == "double" else "STRING"


def _integer_tuple_type(ct: ColumnType) -> str:
    return INT_TUPLE_TYPES[INT_WIDTHS.get(ct.family, 64)][ct.unsigned]


def _bit_tuple_type(ct: ColumnType) -> str:
    return "DECIMAL" if ct.wide else "BIGINT"


def _float_tuple_type(ct: ColumnType) -> str:
    return "FLOAT" if ct.canonical_datatype() == DT.FLOAT32 else "DOUBLE"


def _spark_decimal(precision: int, scale: int) -> str:
    if precision > SPARK_MAX_PRECISION:  # wider than Spark holds: keep the integer digits, then the fraction
        scale = max(0, min(scale, SPARK_MAX_PRECISION - (precision - scale)))
        precision = SPARK_MAX_PRECISION
    return f"decimal({precision},{scale})"


def _integer_spark_type(ct: ColumnType) -> str:
    return _spark_decimal(20, 0) if ct.wide else SPARK_TYPES[_integer_tuple_type(ct)]


def _bit_spark_type(ct: ColumnType) -> str:
    return _spark_decimal(20, 0) if ct.wide else "bigint"


def _float_spark_type(ct: ColumnType) -> str:
    return SPARK_TYPES[_float_tuple_type(ct)]


def _decimal_spark_type(ct: ColumnType) -> str:
    return _spark_decimal(ct.length, ct.scale or 0)


# ---- the C value kinds the rows name: the C Plan's kind and each face's Python side beside it ------

C_LONG = NativeKind(Kind.LONG, "LONG", LONG_IMAGE, _tuple._long_c_from_tuple, ranged=True)
C_DIGITS = NativeKind(Kind.DIGITS, "STRING", DIGITS_IMAGE, _tuple._digits_c_from_tuple, ranged=True)
C_DOUBLE = NativeKind(Kind.DOUBLE, "DOUBLE", DOUBLE_IMAGE)
C_DECIMAL = NativeKind(Kind.DECIMAL, "STRING", DECIMAL_IMAGE, _tuple._decimal_c_from_tuple)
C_TEXT = NativeKind(Kind.TEXT, "STRING", TEXT_IMAGE)
C_BASE64 = NativeKind(Kind.BASE64, "BYTES", BASE64_IMAGE, _tuple._base64_c_from_tuple)
C_UTF8 = NativeKind(Kind.UTF8, "STRING")
C_BOOL = NativeKind(Kind.BOOL, "BOOLEAN")
C_DATE = NativeKind(Kind.DATE, "DATE", None, _tuple._date_c_from_tuple, temporal=True)
C_DATETIME = NativeKind(Kind.DATETIME, "DATE", None, _tuple._datetime_c_from_tuple, temporal=True)
C_TIMESTAMP = NativeKind(Kind.TIMESTAMP, "DATE", None, _tuple._datetime_c_from_tuple, temporal=True)


def _integer_c_kind(ct: ColumnType) -> NativeKind:
    return C_DIGITS if ct.wide else C_LONG


def _bit_c_kind(ct: ColumnType) -> NativeKind | None:
    return None if ct.wide else C_LONG  # bit(64): its DataType depends on the value, Python's


# ---- the table ------------------------------------------------------------------------------------

_INTEGER_TYPES = ("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "bool", "boolean")
_TEXT_TYPES = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "nchar", "nvarchar")
_BYTES_TYPES = ("tinyblob", "blob", "mediumblob", "longblob", "geometry", "point", "linestring", "polygon",
                "multipoint", "multilinestring", "multipolygon", "geometrycollection", "geomcollection")

# docs/mapping.md "Column types"; one row per family, in that page's order.
TYPES: tuple[TypeRow, ...] = (
    TypeRow("integer", _INTEGER_TYPES, None, "", _integer_blob_type, _integer_codec,
            _integer_tuple_type, _tuple._integer_to_tuple, _tuple._integer_from_tuple, _integer_spark_type,
            _integer_c_kind),
    # no MySQL type of its own: a tinyint(1) column with the property BOOLEAN_PROPERTY (a DataHub
    # BOOLEAN); the name, which no column type parses to, keeps the kind among FAMILIES' values
    TypeRow("boolean", ("boolean-from-datahub",), DT.INT8, "", "BOOLEAN", _boolean_codec,
            "BOOLEAN", _tuple._boolean_to_tuple, _tuple._blob_from_tuple, "boolean", C_BOOL),
    TypeRow("bit", ("bit",), DT.INT64, "", _integer_blob_type, _integer_codec,
            _bit_tuple_type, _tuple._integer_to_tuple, _tuple._integer_from_tuple, _bit_spark_type, _bit_c_kind),
    TypeRow("year", ("year",), DT.INT64, "", "LONG", _integer_codec,
            "SMALLINT", _tuple._integer_to_tuple, _tuple._integer_from_tuple, "smallint", C_LONG),
    TypeRow("float", ("float", "double", "real", "double precision"), None, "", "DOUBLE", _float_codec,
            _float_tuple_type, _tuple._float_to_tuple, _tuple._float_from_tuple, _float_spark_type, C_DOUBLE),
    TypeRow("decimal", ("decimal", "numeric", "dec", "fixed"), DT.DECIMAL, "", _decimal_blob_type, _decimal_codec,
            "DECIMAL", _tuple._decimal_to_tuple, _tuple._decimal_from_tuple, _decimal_spark_type, C_DECIMAL),
    TypeRow("text", _TEXT_TYPES, DT.STRING, DEFAULT_CHARSET, "STRING", _text_codec,
            "STRING", _tuple._text_to_tuple, _tuple._text_from_tuple, "string", C_TEXT),
    TypeRow("binary", ("binary", "varbinary"), DT.STRING, "binary", "BYTES", _bytes_codec,
            "STRING", _tuple._bytes_to_tuple, _tuple._bytes_from_tuple, "string", C_BASE64),
    TypeRow("bytes", _BYTES_TYPES, DT.BYTES, "", "BYTES", _bytes_codec,
            "STRING", _tuple._bytes_to_tuple, _tuple._bytes_from_tuple, "string", C_BASE64),
    TypeRow("json", ("json",), DT.BYTES, "", "STRING", _utf8_codec,
            "STRING", _tuple._utf8_to_tuple, _tuple._blob_from_tuple, "string", C_UTF8),
    TypeRow("date", ("date",), DT.STRING, "", "DATE", _temporal_codec,
            "TIMESTAMP", _tuple._temporal_to_tuple, _tuple._temporal_from_tuple, "timestamp", C_DATE),
    TypeRow("datetime", ("datetime",), DT.STRING, "", "DATE", _temporal_codec,
            "TIMESTAMP", _tuple._temporal_to_tuple, _tuple._temporal_from_tuple, "timestamp", C_DATETIME),
    TypeRow("timestamp", ("timestamp",), DT.STRING, "", "DATE", _temporal_codec,
            "TIMESTAMP", _tuple._temporal_to_tuple, _tuple._temporal_from_tuple, "timestamp", C_TIMESTAMP),
    TypeRow("time", ("time",), DT.STRING, "", "STRING", _utf8_codec,
            "STRING", _tuple._utf8_to_tuple, _tuple._blob_from_tuple, "string", C_UTF8, need_bv=True),
)

ROW_COLUMNS = tuple(f.name for f in fields(TypeRow))
_ROWS = ROWS  # the registry ColumnType.row reads (bridge/values/columns.py), filled here
_ROWS.update((row.kind, row) for row in TYPES)


def type_row(kind: str) -> TypeRow:
    """The row of a family: the one lookup every face makes."""
    return _ROWS[kind]


def _names() -> dict[str, str]:
    return {name: row.kind for row in _ROWS.values() for name in row.mysql_types}


# MySQL type name -> family (the kind of its row)
FAMILIES: dict[str, str] = _names()


def rows() -> tuple[TypeRow, ...]:
    """Every row in use: `TYPES` and any `register`ed since."""
    return tuple(_ROWS.values())


def register(row: TypeRow) -> None:
    """Add (or replace) a row, e.g. a test's made-up type: the names it covers parse to it, and
    every face finds it through `type_row`."""
    _ROWS[row.kind] = row
    FAMILIES.clear()
    FAMILIES.update(_names())
    parse_column_type.cache_clear()


def unregister(kind: str) -> None:
    """Take a `register`ed row out again (a shipped row comes back as `TYPES` has it)."""
    del _ROWS[kind]
    _ROWS.update((row.kind, row) for row in TYPES if row.kind not in _ROWS)
    FAMILIES.clear()
    FAMILIES.update(_names())
    parse_column_type.cache_clear()


# ---- lookups through the row -------------------------------------------------------------------------

_TYPE_RE = re.compile(r"^\s*([a-zA-Z][a-zA-Z ]*?)\s*(?:\((.*)\))?\s*((?:\s*(?:unsigned|signed|zerofill))*)\s*$",
                      re.S)


@lru_cache(maxsize=4096)
def parse_column_type(text: str, boolean: bool = False) -> ColumnType:
    """Parse a MySQL column type as MySQL prints it (`decimal(30,9)`, `int(10) unsigned`, ...)."""
    m = _TYPE_RE.match(text)
    family = " ".join(m.group(1).lower().split()) if m else ""
    kind = FAMILIES.get(family)
    if kind is None:
        raise ConversionError("unknown MySQL column type", value=text)
    if boolean:
        kind = "boolean"
    args = m.group(2)
    length = scale = None
    if args and family not in ("enum", "set"):
        parts = [p.strip() for p in args.split(",")]
        try:
            length = int(parts[0])
            scale = int(parts[1]) if len(parts) > 1 else None
        except ValueError:
            raise ConversionError("unparsable MySQL column type arguments", value=text) from None
    if kind == "decimal" and length is None:
        length, scale = 10, 0
    if kind == "decimal" and scale is None:
        scale = 0
    return ColumnType(text=text, family=family, kind=kind, unsigned="unsigned" in m.group(3).lower(),
                      length=length, scale=scale)


def _apply(rule, *args):
    return rule(*args) if callable(rule) else rule


def blob_type(ct: ColumnType, options: Options = DEFAULT_OPTIONS) -> str:
    """The Blob value type of a column, decided by its definition, never by one row's value."""
    return _apply(ct.row.blob_type, ct, options)


def tuple_type(ct: ColumnType) -> str:
    """The DataHub Tuple field type of a column, decided by its definition.

    >>> tuple_type(parse_column_type("int(10) unsigned"))
    'BIGINT'
    """
    return _apply(ct.row.tuple_type, ct)


def spark_type(ct: ColumnType) -> str:
    """The Spark SQL type of a column's Tuple field (`decimal(p,s)` with the column's precision)."""
    return _apply(ct.row.spark_type, ct)


def native_kind(ct: ColumnType) -> Kind | None:
    """The C Plan's value kind of a column, or None when only Python converts it."""
    native = _apply(ct.row.c_kind, ct)
    return None if native is None else native.kind


def native_of(ct: ColumnType) -> NativeKind | None:
    """The row's C value kind of a column with what each face does beside it (`NativeKind`), or
    None when only Python converts it."""
    return _apply(ct.row.c_kind, ct)


# Property key on a Column that marks a DataHub BOOLEAN carried as tinyint(1).
BOOLEAN_PROPERTY = RESERVED_PREFIX + "type"


def column_is_boolean(column: pb.Column) -> bool:
    return any(p.key == BOOLEAN_PROPERTY and p.value == "BOOLEAN" for p in column.properties)


def codec_for(column: pb.Column, options: Options = DEFAULT_OPTIONS, facts: bool = True) -> Codec:
    """The Blob codec of a DTS column (its row's `codec` factory). `facts=False`: the column's
    reserved-prefix properties are its own, not the bridge's BOOLEAN marker (docs/decisions.md,
    "Reserved-prefix properties in DTS input")."""
    ct = parse_column_type(column.originalType, facts and column_is_boolean(column))
    return ct.row.codec(ct, options)


class _RowView(Mapping):
    """kind -> one column of the table, read from the rows at each lookup (the per-kind dicts the
    faces and tests used before the table held every column)."""

    def __init__(self, column: str) -> None:
        self._column = column

    def __getitem__(self, kind: str):
        return getattr(_ROWS[kind], self._column)

    def __iter__(self):
        return iter(list(_ROWS))

    def __len__(self) -> int:
        return len(_ROWS)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


# kind -> one column of the table: the names the faces imported before the table held them all
KIND_DATATYPES = _RowView("datatype")
CODECS = _RowView("codec")
TUPLE_TYPES = _RowView("tuple_type")
TO_TUPLE = _RowView("to_tuple")
FROM_TUPLE = _RowView("from_tuple")


# Blob type of a foreign column (no 'dts' extension) -> (originalType, Column properties) of its DTS column.
FOREIGN_COLUMN_TYPES: dict[str, tuple[str, tuple]] = {
    "LONG": ("bigint(20)", ()),
    "DOUBLE": ("double", ()),
    "BOOLEAN": ("tinyint(1)", ((BOOLEAN_PROPERTY, "BOOLEAN"),)),
    "STRING": ("longtext", ()),
    "BYTES": ("longblob", ()),
    "DATE": ("datetime(3)", ()),
}
