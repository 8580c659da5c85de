"""DataHub rows -> DTS: the per-partition jobs of `blob_to_dts` and `tuple_to_dts` (bridge.spark is
the DataFrame face; bridge/spark/jobs_base.py the shared parts).

Blob lines or typed Tuple rows -> Entries (BlobDecoder / TupleDecoder, update halves paired) ->
(key, Entry), packed into Envelopes per run of equal keys: a Kafka sink's `key` and `value` rows.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any

from bridge.blob.decode import BlobDecoder
from bridge.errors import BlobFormatError, OptionsError
from bridge.options import Options
from bridge.spark.jobs_base import DTS_COLUMNS, KEYS, _Job
from bridge.stream import (
    decoder_entries,
)
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import pack_entries


class _ToDts(_Job):
    """Rows -> (key, Entry) by `entries`, packed into Envelopes per run of equal keys."""

    def __init__(self, mode: str, max_message_bytes: int, key: str) -> None:
        super().__init__(mode, DTS_COLUMNS)
        self.max_message_bytes = max_message_bytes
        self.key = key

    def entries(self, records) -> Iterator[tuple[bytes, pb.Entry]]:
        raise NotImplementedError

    def _key_input(self, names) -> str | None:
        if self.key in KEYS:
            return None
        if self.key not in names:
            raise OptionsError(f"option 'key' names no input column and is not one of {', '.join(KEYS)}",
                               value=self.key)
        return self.key

    def rows(self, records):
        for key, run in itertools.groupby(self.entries(records), key=itemgetter(0)):
            for env in pack_entries((entry for _, entry in run), self.max_message_bytes):
                yield from self._error_rows()
                yield (key, env.SerializeToString()) + ((None,) if self.keep else ())
        yield from self._error_rows()

    def _error_rows(self) -> Iterator[tuple]:
        while self.policy.errors:
            yield None, None, str(self.policy.errors.pop(0))

    def key_of(self, entry: pb.Entry, key_value) -> bytes:
        if self.key == "table":
            h = entry.header
            return f"{h.schemaName}.{h.tableName}".encode() if h.schemaName or h.tableName else b""
        if self.key == "single" or key_value is None:
            return b""
        if isinstance(key_value, str):
            return key_value.encode()
        if not isinstance(key_value, (bytes, bytearray, memoryview)):  # bytes(3) would be 3 zero bytes
            raise OptionsError(f"option 'key' names column {self.key!r}, whose values are neither string "
                               "nor binary", value=key_value)
        return bytes(key_value)


def _where(number: int, partition, offset) -> dict:
    return {"partition": partition, "offset": offset} if offset is not None else {"row": number}


class _BlobToDts(_ToDts):
    def __init__(self, options: Options, mode: str, max_message_bytes: int, key: str) -> None:
        super().__init__(mode, max_message_bytes, key)
        self.decoder = BlobDecoder(options)

    def inputs(self, names):
        text = next((n for n in ("blob", "value") if n in names), None)
        if text is None:
            raise OptionsError("a Blob DataFrame needs a 'blob' or 'value' column")
        kafka = "partition" in names and "offset" in names
        return [text, self._key_input(names), "partition" if kafka else None, "offset" if kafka else None]

    def entries(self, records):
        decoder = self.decoder

        def feed(text, where):
            if text is None:
                raise BlobFormatError("null Blob message")
            return decoder.feed_line(text)

        located = ((_where(number, partition, offset), text, key_value)
                   for number, (text, key_value, partition, offset) in enumerate(records))
        for _, entry, key_value in decoder_entries(located, decoder, self.policy, feed):
            yield self.key_of(entry, key_value), entry


def _whole(v):
    # pandas turns integer columns with nulls into floats
    return int(v) if isinstance(v, float) and v.is_integer() else v


# field type -> Spark value to Tuple value (before FIELD_CHECKS)
FROM_SPARK: dict[str, Callable[[Any], Any]] = {
    **{t: _whole for t in ("BIGINT", "INTEGER", "SMALLINT", "TINYINT", "TIMESTAMP")},
    **{t: (lambda v: v) for t in ("DOUBLE", "FLOAT", "DECIMAL", "BOOLEAN", "STRING")},
}


class _TupleToDts(_ToDts):
    def __init__(self, options: Options, mode: str, max_message_bytes: int, key: str, schema,
                 table: str | None, columns) -> None:
        super().__init__(mode, max_message_bytes, key)
        from bridge.tuple import TupleDecoder
        self.decoder = TupleDecoder(schema, options, table=table, columns=columns)
        self.fields = [(f["name"], FROM_SPARK[f["type"]]) for f in self.decoder.schema["fields"]]

    def inputs(self, names):
        missing = [name for name, _ in self.fields if name not in names]
        if missing:
            raise OptionsError("the DataFrame lacks RecordSchema fields", value=missing)
        kafka = "partition" in names and "offset" in names
        return ([name for name, _ in self.fields]
                + [self._key_input(names), "partition" if kafka else None, "offset" if kafka else None])

    def entries(self, records):
        n = len(self.fields)
        decoder = self.decoder
        located = ((_where(number, *record[n + 1:]),
                    {name: None if v is None else convert(v) for (name, convert), v in zip(self.fields, record)},
                    record[n])
                   for number, record in enumerate(records))
        for _, entry, key_value in decoder_entries(located, decoder, self.policy,
                                                   lambda row, where: decoder.feed(row, number=where.get("row"))):
            yield self.key_of(entry, key_value), entry
