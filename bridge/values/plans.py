"""The C fast path's view of a column set: one Plan column per column, chosen by the column's row
of the type table (`bridge/values/types.py`, its `c_kind`), for the Blob plans (bridge/blob/rows.py)
and the Tuple plans (bridge/tuple/encode.py) alike; and `values.CHARSETS` handed to C once.

>>> from bridge.values import parse_column_type
>>> c = plan_column("id", parse_column_type("bigint(20) unsigned"), utc=True)
>>> (c.kind.name, c.lo, c.hi, c.charset)
('DIGITS', 0, 18446744073709551615, '')
"""
from __future__ import annotations

from decimal import Decimal

from bridge.native import NATIVE, speedups
from bridge.native.contract import CharsetMode, Kind, Out, PlanColumn
from bridge.values.charsets import CHARSETS, MYSQL_LATIN1, charset_codec
from bridge.values.columns import ColumnType
from bridge.values.types import native_of

__all__ = ["PlanColumn", "plan_column", "native_tuple_plan", "tuple_plan_columns", "charset_table"]

def plan_column(name: str, ct: ColumnType, utc: bool, out: int = Out.SAME) -> PlanColumn | None:
    """The Plan column of a column: the C kind of its row (`bridge.values.native_of`) and what C
    checks a canonical value against (the row's DataType and charset, the integer range), or None
    when C does not take it (no C kind; a temporal outside UTC or beyond 6 fractional digits). The
    one choice both C plans (Blob, Tuple) and the compiled Python images start from."""
    native = native_of(ct)
    if native is None:
        return None
    fsp = 0
    if native.temporal:
        if not (utc and 0 <= ct.fsp <= 6):
            return None
        fsp = ct.fsp
    lo, hi = ct.int_range if native.ranged else (0, 0)
    row = ct.row
    return PlanColumn(name, native.kind, ct.canonical_datatype(), lo, hi, row.charset, fsp, row.need_bv, out)


# Tuple field type -> what a Tuple plan makes of the value besides the Blob value (else Out.SAME)
_TUPLE_OUTS = {"DECIMAL": Out.DECIMAL, "FLOAT": Out.FLOAT32, "TIMESTAMP": Out.MICROS}


def native_tuple_plan(names: list, cts: list, field_types: list, utc: bool, hex_binary: bool):
    """(a Tuple `_speedups.Plan` for the column set, its PlanColumns (`tuple_plan_columns`)), from
    bridge.tuple.encode's column types and field types; or None (no C extension, or a column it does
    not cover: the whole table is Python's).

    The C checks are the Blob plan's, which accept a subset of what the rows' to_tuple converters
    accept; the value is then made as the converter makes it (`Out`, from the field type).
    `Plan.tuples(entry_bytes, dml_type, seq_key, seq_base, metas)` gives the Tuple rows
    of a DML Entry image by image (None for an image TupleEncoder converts in Python), or None for
    the whole Entry."""
    columns = tuple_plan_columns(names, cts, field_types, utc, hex_binary) if NATIVE else None
    if columns is None:
        return None
    return speedups.Plan([tuple(c) for c in columns], False, Decimal), columns


def tuple_plan_columns(names: list, cts: list, field_types: list, utc: bool, hex_binary: bool) -> list | None:
    """The PlanColumns of `native_tuple_plan`'s Plan (None: a column C does not cover, or none)."""
    columns = []
    for name, ct, field_type in zip(names, cts, field_types):
        out = _TUPLE_OUTS.get(field_type, Out.SAME)
        column = plan_column(name, ct, utc, out)
        if column is not None and column.kind == Kind.BASE64 and hex_binary:
            column = column._replace(out=Out.HEX)
        columns.append(column)
    if not columns or None in columns:
        return None
    return columns


def charset_table() -> list[tuple]:
    """values.CHARSETS as `_speedups.set_charsets` takes it: (name, mode, codec, mapping, check) for
    every charset with a text codec, "" (none on the wire) included; `binary` has none, so its text
    values stay with Python."""
    latin1 = MYSQL_LATIN1.decode(bytes(range(256)))[0]  # the decoding table itself
    out = []
    for name, codec in CHARSETS.items():
        if codec is None:
            continue  # binary
        check = charset_codec(name)[2]
        if codec == "utf-8":
            out.append((name, CharsetMode.UTF8, codec, None, check))
        elif codec == "mysql-latin1":
            out.append((name, CharsetMode.CHARMAP, codec, latin1, check))
        else:
            out.append((name, CharsetMode.CODEC, codec, None, check))
    return out


if NATIVE:
    speedups.set_charsets(charset_table())
