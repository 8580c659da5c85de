"""Entries -> Tuple rows labelled with their table, for the writers that keep one file or one
DataHub topic per table (the CLI's Tuple files, `deliver` and `dts-bridge sync`). It sits here,
below every face, so that bridge.sync and the command line share it without one importing the other.

>>> from bridge.options import Options
>>> convert = tuple_converter(Options(), only="shop.orders")
>>> from bridge.wire import subscribe_pb2 as pb
>>> entry = pb.Entry(header=pb.Header(messageType=pb.DML, schemaName="shop", tableName="users"))
>>> convert(entry)  # another table than `only`: nothing (counted as not emitted)
[]
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sized

from bridge.options import Options
from bridge.tuple.encode import TupleEncoder
from bridge.wire import subscribe_pb2 as pb

__all__ = ["tuple_converter"]


def tuple_converter(options: Options, only: str | None, stream: bool = False) -> Callable[[pb.Entry], Sized]:
    """Entry -> [(table, DTS columns, RecordSchema, row)]; Entries of tables other than `only`
    give nothing (counted as not emitted). With `stream` (the CLI's `convert`), the rows of a large
    Entry are made as they are taken (`TupleEncoder.stream`): a sized iterable instead of a list."""
    encoder = TupleEncoder(options)
    rows_of = encoder.stream if stream else encoder.convert

    def convert(entry: pb.Entry) -> Sized:
        header = entry.header
        table = f"{header.schemaName}.{header.tableName}"
        if only is not None and header.messageType == pb.DML and table != only:
            return []
        rows = rows_of(entry)
        if not rows:
            return []
        columns = entry.event.dmlEvent.columns
        schema = encoder.schema(columns)
        if not isinstance(rows, list):
            return _Labelled((table, columns, schema), rows)
        return [(table, columns, schema, row) for row in rows]
    return convert


class _Labelled:
    """The rows of a streamed Entry, each as (table, DTS columns, RecordSchema, row) when taken."""

    def __init__(self, label: tuple, rows: Sized) -> None:
        self._label, self._rows = label, rows

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[tuple]:
        table, columns, schema = self._label
        for row in self._rows:
            yield table, columns, schema, row
