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

from collections.abc import Callable

from bridge.options import Options
from bridge.tuple.encode import TupleEncoder
from bridge.wire import subscribe_pb2 as pb

__all__ = ["tuple_converter"]


def tuple_converter(options: Options, only: str | None) -> Callable[[pb.Entry], list]:
    """Entry -> [(table, DTS columns, RecordSchema, row)]; Entries of tables other than `only`
    give nothing (counted as not emitted)."""
    encoder = TupleEncoder(options)

    def convert(entry: pb.Entry) -> list:
        header = entry.header
        table = f"{header.schemaName}.{header.tableName}"
        if only is not None and header.messageType == pb.DML and table != only:
            return []
        rows = encoder.convert(entry)
        if not rows:
            return []
        columns = entry.event.dmlEvent.columns
        schema = encoder.schema(columns)
        return [(table, columns, schema, row) for row in rows]
    return convert
