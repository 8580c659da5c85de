"""Tuple files for the command line: one RecordSchema per file (written next to it as
NAME.schema.json), files per table, and row readers that turn one bad row into one rejected record."""
from __future__ import annotations

import contextlib
import csv
import importlib
import io
import itertools
import os
from collections import Counter
from typing import Any

import orjson
from google.protobuf import json_format

from bridge.cli.base import UsageError, _one_line, _Outputs
from bridge.errors import BridgeError, DecodeError
from bridge.options import Options
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import read_lines

# ---- Tuple files: one RecordSchema per file ------------------------------------------------------

def _tuple_module():
    try:
        return importlib.import_module("bridge.tuple")
    except ModuleNotFoundError as err:
        if err.name != "bridge.tuple":
            raise
        raise UsageError("Tuple conversion needs bridge.tuple, which this installation lacks") from None


TABLE_PLACEHOLDER = "{table}"
SCHEMA_SUFFIX = ".schema.json"  # the RecordSchema (and table, DTS columns) written next to Tuple files


def _stem(path: str, framing: str) -> str:
    ext = "." + framing
    return path[:-len(ext)] if path.lower().endswith(ext) else path


def schema_path(path: str, framing: str) -> str:
    """`out/shop.orders.csv` -> `out/shop.orders.schema.json`."""
    return _stem(path, framing) + SCHEMA_SUFFIX


def _versioned(path: str, framing: str, version: int) -> str:
    return path if version == 1 else f"{_stem(path, framing)}.v{version}.{framing}"


class _TupleFile:
    """One Tuple output file and its RecordSchema; JSON Lines and CSV stream, Parquet is written
    at the end because `bridge.tuple.write_tuple_parquet` takes a file's rows at once."""

    def __init__(self, tup, path: str, framing: str, schema: dict, outputs: _Outputs) -> None:
        self.tup, self.framing, self.schema, self.rows = tup, framing, schema, 0
        if framing == "parquet":
            self.target, self.pending = outputs.reserve(path), []
            return
        fh = outputs.open(path)
        if framing == "jsonl":
            self.out = fh
            return
        self.out = io.TextIOWrapper(fh, encoding="utf-8", newline="", write_through=True)
        self.csv = csv.writer(self.out)
        self.cells = [(f["name"], tup.CSV_WRITERS[f["type"]]) for f in schema["fields"]]
        self.csv.writerow([name for name, _ in self.cells])

    def write(self, row: dict) -> None:
        self.rows += 1
        if self.framing == "jsonl":
            self.tup.write_tuple_jsonl([row], self.out)
        elif self.framing == "csv":
            null = self.tup.CSV_NULL
            self.csv.writerow([null if row.get(name) is None else cell(row[name]) for name, cell in self.cells])
        else:
            self.pending.append(row)

    def close(self) -> None:
        if self.framing == "parquet":
            self.tup.write_tuple_parquet(self.pending, self.schema, self.target)
        elif self.framing == "csv":
            self.out.detach()  # the binary file is the _Outputs' to close


class TupleFiles:
    """Routes Tuple rows to files (docs/cli.md, "Tuple output"): with `{table}` in the output name
    one file per table, else one file for the one table of the input (or for `--table`). A
    table whose RecordSchema changes mid-stream continues in `NAME.v2.EXT`, `NAME.v3.EXT`, ...
    Next to each file goes `NAME.schema.json`: the RecordSchema, the table and (lossless) the
    DTS columns, which `convert` reads back for Tuple input."""

    def __init__(self, path: str, framing: str, options: Options, outputs: _Outputs) -> None:
        self.tup = _tuple_module()
        self.path, self.framing, self.options, self.outputs = path, framing, options, outputs
        self.per_table = TABLE_PLACEHOLDER in path
        self.current: dict[str, _TupleFile] = {}
        self.versions: Counter = Counter()
        self.tables: list[str] = []
        self.files: list[_TupleFile] = []

    def write(self, item: tuple[str, Any, dict, dict]) -> None:
        table, columns, schema, row = item
        key = table if self.per_table else ""
        out = self.current.get(key)
        if not self.per_table and table not in self.tables:
            hint = f"pass --table DB.TABLE, or put {TABLE_PLACEHOLDER} in -o for one file per table"
            if self.tables and not self.options.source_table:
                raise UsageError(f"the input holds rows of several tables ({', '.join(self.tables)}, {table}): "
                                 + hint)
            if self.tables and out.schema != schema:
                raise UsageError(f"{table} and {', '.join(self.tables)} have different RecordSchemas and cannot "
                                 "share one file: " + hint)
            self.tables.append(table)
        if out is None or (out.schema is not schema and out.schema != schema):
            out = self.current[key] = self._open(key, table, columns, schema)
        out.write(row)

    def _open(self, key: str, table: str, columns, schema: dict) -> _TupleFile:
        self.versions[key] += 1
        if self.path == "-":
            if self.versions[key] > 1:
                raise UsageError(f"the RecordSchema of {table} changes mid-stream: write to a file (-o), "
                                 "which starts a new file for each schema")
            path = "-"
        else:
            path = _versioned(self.path.replace(TABLE_PLACEHOLDER, table), self.framing, self.versions[key])
        out = _TupleFile(self.tup, path, self.framing, schema, self.outputs)
        if path != "-":
            side = {"table": table, **schema}
            if self.options.lossless:
                side["dtsColumns"] = [json_format.MessageToDict(c) for c in columns]
            self.outputs.open(schema_path(path, self.framing)).write(
                orjson.dumps(side, option=orjson.OPT_INDENT_2) + b"\n")
        self.files.append(out)
        return out

    def close(self) -> int:
        for out in self.files:
            out.close()
        return len(self.files)


def _tuple_input(framing: str, path: str, fh, args, max_line_bytes: int | None = None):
    """((RecordSchema, table, DTS columns), row reader) of a Tuple file. The RecordSchema comes
    from --schema, else NAME.schema.json next to the file, else (Parquet) the file's metadata."""
    tup = _tuple_module()
    side: dict = {}
    schema_file = args.schema or (schema_path(path, framing) if path != "-" else None)
    if args.schema or (schema_file and os.path.exists(schema_file)):
        try:
            with open(schema_file, "rb") as sf:
                side = orjson.loads(sf.read())
            schema = {"fields": side["fields"]}
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as err:
            raise UsageError(f"cannot read the RecordSchema {schema_file}: {_one_line(err)}") from None
    elif framing == "parquet":
        schema = orjson.loads(_parquet_schema(path))
    else:
        raise UsageError("Tuple input needs its RecordSchema: pass --schema PATH (convert writes it next to "
                         f"Tuple output as NAME{SCHEMA_SUFFIX})")
    columns = None
    if side.get("dtsColumns"):
        columns = [json_format.ParseDict(c, pb.Column()) for c in side["dtsColumns"]]
    table = args.table or side.get("table")
    names = {f.get("name") for f in schema.get("fields", []) if isinstance(f, dict)}
    if table is None and "_source_table_" not in names:
        raise UsageError("Tuple rows do not say their table: pass --table DB.TABLE")
    try:
        fields = [(f["name"], f["type"]) for f in tup.load_record_schema(schema)["fields"]]
    except BridgeError as err:
        raise UsageError(f"invalid RecordSchema: {err}") from None
    readers = {"jsonl": _tuple_jsonl_rows, "csv": _tuple_csv_rows, "parquet": _tuple_parquet_rows}
    if framing == "jsonl":
        return (schema, table, columns), _tuple_jsonl_rows(tup, fh, schema, fields, max_line_bytes)
    return (schema, table, columns), readers[framing](tup, fh if framing != "parquet" else path, schema, fields)


def _parquet_schema(path: str) -> bytes:
    tup = _tuple_module()
    meta = pyarrow_parquet().read_schema(path).metadata or {}
    if tup.SCHEMA_KEY not in meta:
        raise UsageError(f"{path} carries no RecordSchema: pass --schema PATH")
    return meta[tup.SCHEMA_KEY]


def pyarrow_parquet():
    try:
        import pyarrow.parquet
    except ImportError:
        raise UsageError("Parquet files need pyarrow: pip install 'dts-datahub-bridge[spark]'") from None
    return pyarrow.parquet


# Tuple readers yield (row number, row or the BridgeError that row gave): one bad row is one rejected record.

def _tuple_jsonl_rows(tup, fh, schema, fields, max_line_bytes: int | None = None):
    for number, line in read_lines(fh, max_line_bytes):
        if isinstance(line, BridgeError):  # over max_line_bytes: read past, a rejected row
            yield number, line
            continue
        try:
            yield number, tup.coerce_row(orjson.loads(line), fields, line=number)
        except orjson.JSONDecodeError as err:
            yield number, DecodeError(f"invalid JSON ({err.msg})", value=line, line=number)
        except BridgeError as err:
            yield number, err


def _tuple_csv_rows(tup, fh, schema, fields):
    # read_tuple_csv stops at its first bad row; it restarts after that row with the header put
    # back, so that one bad row costs one record (bridge.tuple could take an error policy instead).
    text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
    done = 0
    try:
        header = text.readline()
        while True:
            try:
                for number, row in tup.read_tuple_csv(itertools.chain([header], text), schema):
                    yield done + number, row
                return
            except BridgeError as err:
                if "row" not in err.where:
                    raise  # the header: nothing in the file can be read
                done += err.where["row"]
                err.where["row"] = done
                yield done, err
    except (UnicodeDecodeError, csv.Error) as err:
        raise DecodeError(f"unreadable CSV after data row {done} ({err})") from None
    finally:
        with contextlib.suppress(ValueError):  # already closed when the run stopped early
            text.detach()  # the binary stream is the caller's to close (it may be stdin)


def _tuple_parquet_rows(tup, path, schema, fields):
    total = pyarrow_parquet().ParquetFile(path).metadata.num_rows
    done = 0
    try:
        for number, row in tup.read_tuple_parquet(path, schema):
            done = number
            yield number, row
    except BridgeError as err:
        # the reader cannot go on past a bad row: the rest of the file is rejected with it
        err.count = total - done
        yield done + 1, err
