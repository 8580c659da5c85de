"""DTS Entries <-> DataHub Tuple rows, and Tuple rows in files (JSON Lines, CSV, Parquet).

The converters live in `bridge.tuple.encode` (Entry -> rows, the type and meta-column tables,
RecordSchema) and `bridge.tuple.decode` (rows -> Entries); this module re-exports them and adds the file
formats. Every reader yields `(row number, row dict)`: the line number for JSON Lines, the 1-based
data row for CSV and Parquet. docs/tuple.md describes the formats.

>>> import io
>>> schema = {"fields": [{"name": "id", "type": "BIGINT"}, {"name": "name", "type": "STRING"}]}
>>> buf = io.StringIO(newline="")
>>> write_tuple_csv([{"id": 1, "name": None}, {"id": 2, "name": "\\\\N"}], schema, buf)
2
>>> buf.getvalue().splitlines()
['id,name', '1,\\\\N', '2,\\\\\\\\N']
>>> list(read_tuple_csv(io.StringIO(buf.getvalue(), newline=""), schema))
[(1, {'id': 1, 'name': None}), (2, {'id': 2, 'name': '\\\\N'})]
"""
from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from typing import Any

import orjson

from bridge.errors import BridgeError, TupleFormatError
from bridge.tuple.decode import FIELD_CHECKS, FIELD_COLUMNS, FROM_TUPLE, OP_IMAGES, TupleDecoder, tuples_to_entries
from bridge.tuple.encode import (
    FIELD_TYPES,
    LEGACY_TIME_COLUMN,
    META_COLUMNS,
    ROW_IMAGES,
    TIMESTAMP_RANGE,
    TO_TUPLE,
    TUPLE_TYPES,
    TupleEncoder,
    entries_to_tuples,
    entry_to_tuples,
    load_record_schema,
    record_schema,
    tuple_type,
)
from bridge.values.types import ARROW_TYPES_OF_SPARK, SPARK_TYPES
from bridge.wire.framing import read_lines

__all__ = [
    "entry_to_tuples", "entries_to_tuples", "tuples_to_entries", "TupleEncoder", "TupleDecoder",
    "record_schema", "load_record_schema", "tuple_type",
    "write_tuple_jsonl", "read_tuple_jsonl", "write_tuple_csv", "read_tuple_csv",
    "write_tuple_parquet", "read_tuple_parquet", "coerce_row",
    "FIELD_TYPES", "FIELD_CHECKS", "FIELD_COLUMNS", "TUPLE_TYPES", "TO_TUPLE", "FROM_TUPLE", "META_COLUMNS",
    "LEGACY_TIME_COLUMN", "ROW_IMAGES", "OP_IMAGES", "TIMESTAMP_RANGE", "CSV_NULL", "CSV_WRITERS", "CSV_READERS",
    "SCHEMA_KEY", "ARROW_TYPES",
]


def _fields(schema) -> list[tuple[str, str]]:
    return [(f["name"], f["type"]) for f in load_record_schema(schema)["fields"]]


def coerce_row(values: Any, fields: list[tuple[str, str]], **where) -> dict:
    """A row with each value in its field type's Python form (TupleFormatError naming the field);
    `where` (line=, row=) locates errors."""
    if not isinstance(values, dict):
        raise TupleFormatError("a Tuple row must be an object", value=values, **where)
    known = {name for name, _ in fields}
    unknown = set(values) - known
    if unknown:
        raise TupleFormatError("row has fields not in the RecordSchema", value=sorted(unknown), **where)
    out = {}
    for name, ftype in fields:
        value = values.get(name)
        try:
            out[name] = None if value is None else FIELD_CHECKS[ftype](value)
        except BridgeError as exc:
            raise exc.located(column=name, **where)
    return out


# ---- JSON Lines ----------------------------------------------------------------------------------

def _json_default(value):
    if isinstance(value, Decimal):
        return str(value)  # exact digits; a JSON number would go through a double
    raise TypeError(f"{type(value).__name__} is not a Tuple value")


def write_tuple_jsonl(rows: Iterable[dict], fh) -> int:
    """One JSON object per row (DECIMAL as a string of its digits, TIMESTAMP as epoch micros)."""
    text = isinstance(fh, io.TextIOBase)
    count = 0
    for row in rows:
        line = orjson.dumps(row, default=_json_default) + b"\n"
        fh.write(line.decode("utf-8") if text else line)
        count += 1
    return count


def read_tuple_jsonl(fh, schema=None, max_line_bytes: int | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, row) of a JSON Lines file; with a schema, values are checked and DECIMAL
    strings become Decimal. Blank lines are skipped; a line over `max_line_bytes` (default 16 MiB)
    raises LineTooLongError, read past without being held."""
    fields = _fields(schema) if schema is not None else None
    for number, line in read_lines(fh, max_line_bytes):
        if isinstance(line, BridgeError):
            raise line
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise TupleFormatError(f"invalid JSON ({exc.msg})", value=line, line=number) from None
        if fields is not None:
            row = coerce_row(row, fields, line=number)
        elif not isinstance(row, dict):
            raise TupleFormatError("a Tuple row must be an object", value=row, line=number)
        yield number, row


# ---- CSV -----------------------------------------------------------------------------------------

CSV_NULL = "\\N"  # NULL, as MySQL and Hive write it; a STRING starting with "\" gets one more "\"


def _csv_string(v: str) -> str:
    return "\\" + v if v.startswith("\\") else v


def _csv_float(v: float) -> str:
    return repr(v)


# field type -> cell text of a non-NULL value
CSV_WRITERS: dict[str, Callable[[Any], str]] = {
    **{t: str for t in ("BIGINT", "INTEGER", "SMALLINT", "TINYINT", "TIMESTAMP", "DECIMAL")},
    "DOUBLE": _csv_float, "FLOAT": _csv_float,
    "BOOLEAN": lambda v: "true" if v else "false", "STRING": _csv_string,
}


def _cell_int(cell: str) -> int:
    try:
        return int(cell)
    except ValueError:
        raise TupleFormatError("not an integer", value=cell) from None


def _cell_float(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        raise TupleFormatError("not a number", value=cell) from None


def _cell_bool(cell: str) -> bool:
    lowered = cell.lower()
    if lowered not in ("true", "false"):
        raise TupleFormatError("BOOLEAN cell must be true or false", value=cell)
    return lowered == "true"


def _cell_string(cell: str) -> str:
    return cell[1:] if cell.startswith("\\") else cell


# field type -> Python value of a non-NULL cell (then checked by FIELD_CHECKS)
CSV_READERS: dict[str, Callable[[str], Any]] = {
    **{t: _cell_int for t in ("BIGINT", "INTEGER", "SMALLINT", "TINYINT", "TIMESTAMP")},
    "DOUBLE": _cell_float, "FLOAT": _cell_float, "DECIMAL": str, "BOOLEAN": _cell_bool,
    "STRING": _cell_string,
}


def write_tuple_csv(rows: Iterable[dict], schema, fh) -> int:
    """A header line of field names, then one line per row (`fh` opened with newline="")."""
    fields = _fields(schema)
    writer = csv.writer(fh)
    writer.writerow([name for name, _ in fields])
    cells = [(name, CSV_WRITERS[ftype]) for name, ftype in fields]
    count = 0
    for row in rows:
        writer.writerow([CSV_NULL if row.get(name) is None else write(row[name]) for name, write in cells])
        count += 1
    return count


def read_tuple_csv(fh, schema) -> Iterator[tuple[int, dict]]:
    """(data row number, row) of a CSV file written by `write_tuple_csv`; columns may come in any
    order; `\\N` is NULL, and so is an empty cell of a non-STRING field."""
    fields = _fields(schema)
    types = dict(fields)
    reader = csv.reader(fh)
    header = next(reader, None)
    if header is None or sorted(header) != sorted(types):
        raise TupleFormatError("CSV header does not name the RecordSchema's fields", value=header, line=1)
    parse = [(name, types[name], CSV_READERS[types[name]]) for name in header]
    for number, cells in enumerate(reader, 1):
        if len(cells) != len(parse):
            raise TupleFormatError(f"CSV row has {len(cells)} cells for {len(parse)} fields", value=cells,
                                   row=number)
        row = {}
        for (name, ftype, read), cell in zip(parse, cells):
            if cell == CSV_NULL or (cell == "" and ftype != "STRING"):
                row[name] = None
                continue
            try:
                row[name] = FIELD_CHECKS[ftype](read(cell))
            except BridgeError as exc:
                raise exc.located(column=name, row=number)
        yield number, row


# ---- Parquet -------------------------------------------------------------------------------------

SCHEMA_KEY = b"datahub.record_schema"  # Parquet metadata key holding the RecordSchema JSON
_DECIMAL_DIGITS = 38


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ImportError("Tuple Parquet files need pyarrow: pip install 'dts-datahub-bridge[spark]'") from None
    return pyarrow


def _decimal_arrow_type(pa, values: list):
    """decimal128(38, s) with s the largest scale of the values, or None when one does not fit."""
    int_digits, scale = 0, 0
    for v in values:
        if v is not None:
            _, digits, exponent = v.as_tuple()
            scale = max(scale, -exponent)
            int_digits = max(int_digits, len(digits) + exponent if v else 0)
    if int_digits + scale > _DECIMAL_DIGITS:
        return None
    return pa.decimal128(_DECIMAL_DIGITS, scale)


# field type -> Arrow type (given the pyarrow module): its Spark type's (bridge.values.types: SPARK_TYPES,
# ARROW_TYPES_OF_SPARK), so a Parquet column and a Spark batch agree; DECIMAL's depends on the column's values.
ARROW_TYPES: dict[str, Callable[[Any], Any]] = {ftype: ARROW_TYPES_OF_SPARK[spark]
                                                 for ftype, spark in SPARK_TYPES.items()}


def _arrow_column(pa, ftype: str, values: list):
    if ftype == "TIMESTAMP":
        return pa.array(values, type=pa.int64()).cast(ARROW_TYPES[ftype](pa))
    if ftype != "DECIMAL":
        return pa.array(values, type=ARROW_TYPES[ftype](pa))
    decimal_type = _decimal_arrow_type(pa, values)
    if decimal_type is None:
        return pa.array([None if v is None else str(v) for v in values], type=pa.string())
    return pa.array(values, type=decimal_type)


def write_tuple_parquet(rows: Iterable[dict], schema, path) -> int:
    """A Parquet file of rows with DataHub's types mapped to Arrow's (docs/tuple.md); the
    RecordSchema JSON goes into the file's metadata under `datahub.record_schema`."""
    pa = _pyarrow()
    loaded = load_record_schema(schema)
    fields = [(f["name"], f["type"]) for f in loaded["fields"]]
    rows = list(rows)
    arrays = [_arrow_column(pa, ftype, [row.get(name) for row in rows]) for name, ftype in fields]
    table = pa.Table.from_arrays(arrays, names=[name for name, _ in fields])
    table = table.replace_schema_metadata({SCHEMA_KEY: orjson.dumps(loaded)})
    pa.parquet.write_table(table, path)
    return len(rows)


def read_tuple_parquet(path, schema=None) -> Iterator[tuple[int, dict]]:
    """(row number, row) of a Parquet file written by `write_tuple_parquet`; the RecordSchema comes
    from the file's metadata unless given."""
    pa = _pyarrow()
    table = pa.parquet.read_table(path)
    if schema is None:
        raw = (table.schema.metadata or {}).get(SCHEMA_KEY)
        if raw is None:
            raise TupleFormatError("Parquet file carries no RecordSchema; pass schema=", source=str(path))
        schema = raw
    fields = _fields(schema)
    columns = []
    for name, ftype in fields:
        if name not in table.column_names:
            raise TupleFormatError("Parquet file lacks a RecordSchema field", value=name, source=str(path))
        column = table.column(name)
        if ftype == "TIMESTAMP":
            column = column.cast(pa.int64())
        columns.append(column.to_pylist())
    for index in range(table.num_rows):
        row = {name: values[index] for (name, _), values in zip(fields, columns)}
        yield index + 1, coerce_row(row, fields, row=index + 1)
