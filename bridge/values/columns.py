"""The shapes the type table is made of, below everything that fills it: `ColumnType` (a parsed
`Column.originalType`), `TypeRow` (how one MySQL type family travels), `NativeKind` (a C value kind
as a row names it: the C kind and what each face's Python side does beside it) and the registry of
rows in use (`ROWS`, kind -> row, which `bridge/values/types.py` fills from `TYPES`).

The converters the rows name (codecs.py, tuples.py, temporal.py) take a `ColumnType` and import it
from here; `types.py` imports them to build the table. So this module imports none of them, and
there is no circle between the table and its converters (docs/decisions.md, "Each type mapped
once, all the way").

>>> ct = ColumnType("int(10) unsigned", "int", "integer", unsigned=True, length=10)
>>> ct.int_range, ct.wide
((0, 4294967295), False)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bridge.native.contract import Kind
from bridge.options import Options
from bridge.wire import subscribe_pb2 as pb

__all__ = ["ColumnType", "TypeRow", "NativeKind", "ROWS", "INT_WIDTHS", "LONG_MAX"]

DT = pb.DataType
LONG_MAX = (1 << 63) - 1

INT_WIDTHS = {"tinyint": 8, "bool": 8, "boolean": 8, "smallint": 16, "mediumint": 24, "int": 32,
              "integer": 32, "bigint": 64}
_SIGNED_DT = {8: DT.INT8, 16: DT.INT16, 24: DT.INT32, 32: DT.INT32, 64: DT.INT64}
_UNSIGNED_DT = {8: DT.UINT8, 16: DT.UINT16, 24: DT.UINT32, 32: DT.UINT32, 64: DT.UINT64}


@dataclass(frozen=True)
class ColumnType:
    """A parsed `Column.originalType`: family, sign, length/precision, scale/fsp."""
    text: str
    family: str
    kind: str
    unsigned: bool = False
    length: int | None = None
    scale: int | None = None

    @property
    def row(self) -> TypeRow:
        """The row of `TYPES` that maps this column's kind (`type_row(self.kind)`)."""
        return ROWS[self.kind]

    @property
    def fsp(self) -> int:
        """Fractional-second digits of a temporal type (its declared precision)."""
        return self.length or 0

    @property
    def int_range(self) -> tuple[int, int]:
        bits = 64 if self.kind == "bit" else INT_WIDTHS.get(self.family, 64)
        if self.kind == "bit":
            return 0, (1 << (self.length or 1)) - 1
        if self.unsigned:
            return 0, (1 << bits) - 1
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    @property
    def wide(self) -> bool:
        """An integer type whose values pass the signed 64-bit range (bigint unsigned, bit(64)):
        they travel as exact digits (Blob STRING, Tuple DECIMAL)."""
        return self.int_range[1] > LONG_MAX

    def canonical_datatype(self, value: int | None = None) -> int:
        """The DataType a canonical DTS value of this column has (the row's `datatype`; integers
        and floats by width and sign, bit(64) above 2**63 - 1 by value)."""
        kind = self.kind
        if kind == "integer":
            bits = INT_WIDTHS.get(self.family, 64)
            return (_UNSIGNED_DT if self.unsigned else _SIGNED_DT)[bits]
        if kind == "float":
            return DT.FLOAT32 if self.family == "float" else DT.FLOAT64
        if kind == "bit" and value is not None and value > LONG_MAX:
            return DT.UINT64
        return ROWS[kind].datatype  # per value (from_blob): the row without a call


@dataclass(frozen=True)
class NativeKind:
    """A C value kind as the rows name it (a row's `c_kind`): the C Plan's kind and, beside it,
    what each face's Python side does with a column of that kind. Adding a MySQL type is one row
    naming one of these (bridge/values/types.py); a new one is a new C kind (bridge/native/src).

    - `blob_type`: the Blob type of the value C makes; a Blob plan takes a column only when its
      codec's Blob type is this one (`decimal="double"` leaves DECIMAL columns to the codec).
    - `image`: the compiled Python image's inline body for a canonical value `d` of the column
      (bridge/blob/rows.py; `{n}` is the column, `lo{n}`/`hi{n}` its integer range, `charset{n}`
      its canonical charset), or None: the codec's `to_blob` is called.
    - `from_tuple`: the Tuple decoder's C path (bridge/tuple/decode.py): (ColumnType, field type,
      the field's integer range or None, Options) -> None (the checked Tuple value is the Blob value
      C writes), a function (value -> Blob value, or `tuples.C_MISS`), or False (C does not take
      the column). bridge/values/tuples.py.
    - `ranged` (C checks the integer range), `temporal` (C reads UTC text of at most 6 fraction
      digits).
    """
    kind: Kind
    blob_type: str
    image: str | None = None
    from_tuple: Callable[..., Any] | None = None
    ranged: bool = False
    temporal: bool = False

    @property
    def name(self) -> str:
        return self.kind.name


BlobTypeRule = str | Callable[[ColumnType, Options], str]
Rule = str | Callable[[ColumnType], Any]
Factory = Callable[[ColumnType, Options], Callable]


@dataclass(frozen=True)
class TypeRow:
    """How one MySQL type family travels, on every face. A column holds the value, or a rule:
    a function of the ColumnType (Blob type: and the Options) that gives it."""
    kind: str                  # the family's name (ColumnType.kind)
    mysql_types: tuple         # the MySQL type names (`Column.originalType` without arguments) it covers
    datatype: int | None       # canonical DTS DataType; None: by width and sign (ColumnType.canonical_datatype)
    charset: str               # the `Data.charset` a canonical value carries
    blob_type: BlobTypeRule    # Blob `dataColumn` type
    codec: Factory             # (ColumnType, Options) -> Codec: Data <-> Blob value (values/codecs.py)
    tuple_type: Rule           # DataHub Tuple field type
    to_tuple: Factory          # (ColumnType, Options) -> Data -> Tuple value (values/tuples.py)
    from_tuple: Factory        # (ColumnType, Options) -> Tuple value -> Data (values/tuples.py)
    spark_type: Rule           # Spark SQL type of the Tuple field (bridge/spark/jobs.py turns it into Arrow)
    # the C Plan's value kind and what the faces do beside it (None: Python only)
    c_kind: NativeKind | Callable[[ColumnType], NativeKind | None] | None
    need_bv: bool = False      # C: a canonical value's text is in `bv`, never empty (time)


# kind -> row: every row in use, `TYPES` and any `register`ed since (bridge/values/types.py fills it)
ROWS: dict[str, TypeRow] = {}
