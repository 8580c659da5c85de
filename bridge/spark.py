"""Spark transforms: Kafka-shaped DTS DataFrames in, Blob / Tuple / DTS DataFrames out.

Each DataFrame function is a thin wrapper that orders the input (where the stream needs an order)
and runs the same pure converters as the library and the CLI through `mapInArrow`, one Python
iterator per Spark partition so that per-stream state (Envelope reassembly, update pairing,
packing, column codecs) lives across Arrow batches. The per-partition functions are public too
(`*_batches`), with their output schemas (`*_SCHEMA`, Spark DDL strings). pyspark is imported
only inside the functions that need it.

Bad records follow Spark's vocabulary: `mode` FAILFAST (default) raises the bridge error, which
names the Kafka partition and offset; PERMISSIVE keeps a row with the error text in an `error`
column; DROPMALFORMED drops the record. A `SparkTally` passed as `tally=` counts input,
converted, rejected and not emitted records across the cluster (the stream layer's accounting).

>>> MODES["PERMISSIVE"], blob_schema("PERMISSIVE").endswith("`error` STRING")
('keep', True)
"""
from __future__ import annotations

import itertools
import os
import sys
from operator import itemgetter
from typing import Any, Callable, Iterable, Iterator

from . import subscribe_pb2 as pb
from ._wire import Reassembler, pack_entries
from .blob_decode import BlobDecoder, decode_blob
from .blob_encode import BlobEncoder, encode_blob, shard_key
from .errors import BlobFormatError, BridgeError, OptionsError
from .options import DEFAULT_OPTIONS, Options
from .stream import ErrorPolicy, Tally, dts_records_to_entries, entries_to_messages

__all__ = [
    "dts_to_blob", "blob_to_dts", "dts_to_tuple", "tuple_to_dts",
    "dts_to_blob_batches", "blob_to_dts_batches", "dts_to_tuple_batches", "tuple_to_dts_batches",
    "BLOB_SCHEMA", "DTS_SCHEMA", "KAFKA_SCHEMA", "blob_schema", "dts_schema", "tuple_schema",
    "MODES", "SparkTally", "local_session",
]

# Spark's bad-record modes -> the stream layer's error policy.
MODES = {"FAILFAST": "fail", "PERMISSIVE": "keep", "DROPMALFORMED": "skip"}
KAFKA_COLUMNS = (("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
                 ("offset", "bigint"), ("timestamp", "timestamp"))
BLOB_COLUMNS = (("topic", "string"), ("partition", "int"), ("offset", "bigint"), ("entry", "int"),
                ("row", "int"), ("sequence_id", "string"), ("op", "string"), ("db", "string"),
                ("table", "string"), ("shard_key", "string"), ("event_time", "timestamp"),
                ("blob", "string"))
DTS_COLUMNS = (("key", "binary"), ("value", "binary"))
ERROR_COLUMN = ("error", "string")
KEYS = ("table", "single")  # blob_to_dts key choices besides an input column name
# Rows per output Arrow batch; input batches decide nothing about output sizes.
_OUT_ROWS = 4096


def _ddl(columns) -> str:
    return ", ".join(f"`{name}` {kind.upper()}" for name, kind in columns)


KAFKA_SCHEMA = _ddl(KAFKA_COLUMNS)
BLOB_SCHEMA = _ddl(BLOB_COLUMNS)
DTS_SCHEMA = _ddl(DTS_COLUMNS)


def _policy_name(mode: str) -> str:
    name = MODES.get(str(mode).upper())
    if name is None:
        raise OptionsError(f"option 'mode' must be one of {', '.join(MODES)}", value=mode)
    return name


def _with_error(columns, mode: str) -> tuple:
    return tuple(columns) + ((ERROR_COLUMN,) if _policy_name(mode) == "keep" else ())


def blob_schema(mode: str = "FAILFAST") -> str:
    """The DDL of `dts_to_blob`'s output; PERMISSIVE adds `error STRING`."""
    return _ddl(_with_error(BLOB_COLUMNS, mode))


def dts_schema(mode: str = "FAILFAST") -> str:
    """The DDL of `blob_to_dts` / `tuple_to_dts` output (a Kafka sink's `key`, `value`)."""
    return _ddl(_with_error(DTS_COLUMNS, mode))


# ---- accounting across the cluster ----------------------------------------------------------

_TALLY_FIELDS = ("input", "converted", "rejected", "not_emitted", "outputs", "envelopes")


class _TallyParam:
    """AccumulatorParam (duck-typed, so defining it needs no pyspark) over Tally tuples."""

    def zero(self, value):
        return (0,) * len(_TALLY_FIELDS)

    def addInPlace(self, a, b):
        return tuple(x + y for x, y in zip(a, b))


class SparkTally:
    """The stream layer's `Tally`, summed over every task through a Spark accumulator.

    Read `.value` on the driver after an action. Like every accumulator updated in a
    transformation, it counts again when the DataFrame is recomputed (a second action, a retried
    task): cache the output, or `reset()` between actions.
    """

    def __init__(self, spark) -> None:
        self._acc = spark.sparkContext.accumulator((0,) * len(_TALLY_FIELDS), _TallyParam())

    @property
    def value(self) -> Tally:
        return Tally(*self._acc.value)

    def reset(self) -> None:
        self._acc.value = (0,) * len(_TALLY_FIELDS)

    def add(self, tally: Tally) -> None:
        self._acc.add(tuple(getattr(tally, name) for name in _TALLY_FIELDS))


class _RowPolicy(ErrorPolicy):
    """ErrorPolicy that also hands each rejected error over, so PERMISSIVE can emit its row."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.errors: list[BridgeError] = []

    def reject(self, err: BridgeError, raw: Any = None, count: int = 1) -> dict:
        record = super().reject(err, raw, count)
        if self.on_error == "keep":
            self.errors.append(err)
        return record


def _policy(mode: str) -> _RowPolicy:
    return _RowPolicy(_policy_name(mode), keep_records=False)


# ---- Arrow / pandas adapters: rows of Python values in, batches out --------------------------

def _arrow_type(kind: str):
    import pyarrow as pa
    simple = {"string": pa.string(), "binary": pa.binary(), "int": pa.int32(), "bigint": pa.int64(),
              "smallint": pa.int16(), "tinyint": pa.int8(), "double": pa.float64(), "float": pa.float32(),
              "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC")}
    if kind in simple:
        return simple[kind]
    if kind.startswith("decimal("):
        precision, scale = kind[8:-1].split(",")
        return pa.decimal128(int(precision), int(scale))
    raise ValueError(f"no Arrow type for {kind!r}")


class _Job:
    """One Spark partition's conversion: `rows(records)` turns input tuples into output tuples.

    `inputs(names)` picks the input columns to read, in the order `rows` expects (None: absent).
    """
    columns: tuple = ()

    def inputs(self, names: list[str]) -> list[str | None]:
        raise NotImplementedError

    def rows(self, records: Iterator[tuple]) -> Iterator[tuple]:
        raise NotImplementedError


def _batch_function(make_job: Callable[[], _Job], arrow: bool, tally: SparkTally | None):
    """A mapInArrow (arrow=True) or mapInPandas function running one job per Spark partition."""
    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa
        job = make_job()
        schema = pa.schema([(name, _arrow_type(kind)) for name, kind in job.columns])
        first = next(batches, None)
        if first is None:
            return
        names = list(first.schema.names if arrow else first.columns)
        wanted = job.inputs(names)

        def records() -> Iterator[tuple]:
            for batch in itertools.chain([first], batches):
                if arrow:
                    cols = [batch.column(n).to_pylist() if n else itertools.repeat(None) for n in wanted]
                else:
                    cols = [_pandas_values(batch[n]) if n else itertools.repeat(None) for n in wanted]
                yield from zip(*cols)

        out = job.rows(records())
        while True:
            chunk = list(itertools.islice(out, _OUT_ROWS))
            if not chunk:
                break
            arrays = [pa.array(col, type=field.type) for col, field in zip(zip(*chunk), schema)]
            batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
            yield batch if arrow else batch.to_pandas(integer_object_nulls=True)
        if tally is not None:
            tally.add(job.policy.tally)
    return run


def _pandas_values(series) -> list:
    # NaN/NaT stand for null in pandas; the converters want None.
    return [None if v is None or v != v else v for v in series.tolist()]


# ---- DTS -> Blob ----------------------------------------------------------------------------

class _DtsToBlob(_Job):
    def __init__(self, options: Options, mode: str) -> None:
        self.options = options
        self.policy = _policy(mode)
        self.encoder = BlobEncoder(options)
        self.reassemblers: dict[str, Reassembler] = {}
        self.columns = _with_error(BLOB_COLUMNS, mode)
        self.keep = self.policy.on_error == "keep"

    def inputs(self, names):
        missing = [n for n in ("partition", "offset", "value") if n not in names]
        if missing:
            raise OptionsError(f"a DTS DataFrame needs the Kafka columns {', '.join(missing)}")
        return ["topic" if "topic" in names else None, "partition", "offset", "value"]

    def rows(self, records):
        for topic, run in itertools.groupby(records, key=itemgetter(0)):
            reassembler = self.reassemblers.setdefault(topic, Reassembler())
            entries = dts_records_to_entries((r[1:] for r in run), self.policy, reassembler, finish=False)
            yield from self._messages(topic, entries)
        for topic, reassembler in self.reassemblers.items():
            yield from self._messages(topic, dts_records_to_entries((), self.policy, reassembler))

    def _messages(self, topic, entries) -> Iterator[tuple]:
        errors = self.policy.errors
        try:
            for where, msg in entries_to_messages(entries, self.encoder.convert, self.policy):
                current = errors.pop() if msg is None else None
                yield from self._error_rows(topic)
                if current is not None:
                    yield self._error_row(topic, current, where.get("entry"))
                else:
                    yield self._row(topic, where, msg)
            yield from self._error_rows(topic)
        except BridgeError as err:
            raise err.located(topic=topic)

    def _row(self, topic, where: dict, msg: dict) -> tuple:
        payload = msg["payload"]
        source = (msg.get("schema") or {}).get("source") or {}
        row = (topic, where["partition"], where["offset"], where["entry"], where["row"],
               payload["sequenceId"], payload["op"], source.get("dbName"), source.get("tableName"),
               shard_key(msg), payload["timestamp"]["eventTime"] * 1000, encode_blob(msg).decode())
        return row + (None,) if self.keep else row

    def _error_rows(self, topic) -> Iterator[tuple]:
        errors = self.policy.errors
        while errors:
            yield self._error_row(topic, errors.pop(0), None)

    def _error_row(self, topic, err: BridgeError, entry) -> tuple:
        err.located(topic=topic)
        return (topic, err.where.get("partition"), err.where.get("offset"), entry) + (None,) * 8 + (str(err),)


def dts_to_blob_batches(options: Options | None = None, mode: str = "FAILFAST", *,
                        tally: SparkTally | None = None, arrow: bool = False):
    """The per-partition function of `dts_to_blob`, for `df.mapInPandas(fn, blob_schema(mode))`
    (`arrow=True`: `mapInArrow`). The input must be ordered by offset per Kafka partition."""
    options = options or DEFAULT_OPTIONS
    _policy_name(mode)
    return _batch_function(lambda: _DtsToBlob(options, mode), arrow, tally)


def _kafka_order(df):
    """Each Kafka partition's records in one Spark partition, in offset order."""
    return (df.repartition("topic", "partition")
              .sortWithinPartitions("topic", "partition", "offset"))


def dts_to_blob(df, options: Options | None = None, mode: str = "FAILFAST", *,
                tally: SparkTally | None = None):
    """Kafka-shaped DTS DataFrame -> one row per Blob message (`blob_schema(mode)`).

    Split Envelopes are reassembled per Kafka partition in offset order, across Arrow batches.
    `offset` is the Entries' first segment, `entry` the Entry's index in it, `row` the message's
    index among the Entry's messages: ordering by (topic, partition, offset, entry, row) gives
    stream order.
    """
    needed = [c for c in ("topic", "partition", "offset", "value") if c in df.columns]
    ordered = _kafka_order(df.select(*needed)) if "topic" in df.columns else (
        df.select(*needed).repartition("partition").sortWithinPartitions("partition", "offset"))
    return ordered.mapInArrow(dts_to_blob_batches(options, mode, tally=tally, arrow=True), blob_schema(mode))


# ---- Blob -> DTS ----------------------------------------------------------------------------

def _entry_table_key(entry: pb.Entry) -> bytes:
    h = entry.header
    return f"{h.schemaName}.{h.tableName}".encode() if h.schemaName or h.tableName else b""


def _key_bytes(value) -> bytes:
    if value is None:
        return b""
    return value.encode() if isinstance(value, str) else bytes(value)


class _BlobToDts(_Job):
    def __init__(self, options: Options, mode: str, max_message_bytes: int, key: str) -> None:
        self.options = options
        self.policy = _policy(mode)
        self.decoder = BlobDecoder(options)
        self.max_message_bytes = max_message_bytes
        self.key = key
        self.columns = _with_error(DTS_COLUMNS, mode)
        self.keep = self.policy.on_error == "keep"

    def inputs(self, names):
        text = "blob" if "blob" in names else ("value" if "value" in names else None)
        if text is None:
            raise OptionsError("a Blob DataFrame needs a 'blob' or 'value' column")
        if self.key not in KEYS and self.key not in names:
            raise OptionsError(f"option 'key' names no input column and is not one of {', '.join(KEYS)}",
                               value=self.key)
        has_where = "partition" in names and "offset" in names
        return [text, self.key if self.key not in KEYS else None,
                "partition" if has_where else None, "offset" if has_where else None]

    def rows(self, records):
        keyed = self._entries(records)
        for key, run in itertools.groupby(keyed, key=itemgetter(0)):
            for env in pack_entries((entry for _, entry in run), self.max_message_bytes):
                yield from self._error_rows()
                yield self._row(key, env.SerializeToString())
        yield from self._error_rows()

    def _entries(self, records) -> Iterator[tuple[bytes, pb.Entry]]:
        """(key, Entry) per completed Entry; the accounting of stream.blob_lines_to_entries."""
        policy, decoder, tally = self.policy, self.decoder, self.policy.tally
        before, fed = tally.converted, 0
        for number, (text, key_value, partition, offset) in enumerate(records):
            where = {"partition": partition, "offset": offset} if offset is not None else {"row": number}
            tally.input += 1
            try:
                if text is None:
                    raise BlobFormatError("null Blob message")
                entries = decoder.feed(decode_blob(text))
            except BridgeError as err:
                policy.reject(err.located(**where), text)
                continue
            fed += 1
            tally.converted = before + fed - decoder.pending_messages
            for entry in entries:
                tally.outputs += 1
                yield self._key_of(entry, key_value), entry
        for err in decoder.finish():
            fed -= err.count
            policy.reject(err, None, err.count)
        tally.converted = before + fed

    def _key_of(self, entry: pb.Entry, key_value) -> bytes:
        if self.key == "table":
            return _entry_table_key(entry)
        return b"" if self.key == "single" else _key_bytes(key_value)

    def _row(self, key: bytes, value: bytes) -> tuple:
        self.policy.tally.envelopes += 1
        return (key, value, None) if self.keep else (key, value)

    def _error_rows(self) -> Iterator[tuple]:
        errors = self.policy.errors
        while errors:
            yield (None, None, str(errors.pop(0)))


def blob_to_dts_batches(options: Options | None = None, mode: str = "FAILFAST", *,
                        max_message_bytes: int | None = None, key: str = "table",
                        tally: SparkTally | None = None, arrow: bool = False):
    """The per-partition function of `blob_to_dts`, for `df.mapInPandas(fn, dts_schema(mode))`."""
    options = options or DEFAULT_OPTIONS
    _policy_name(mode)
    limit = max_message_bytes or options.max_message_bytes
    Options(max_message_bytes=limit)  # the option's own range check
    return _batch_function(lambda: _BlobToDts(options, mode, limit, key), arrow, tally)


def blob_to_dts(df, options: Options | None = None, mode: str = "FAILFAST", *,
                max_message_bytes: int | None = None, key: str = "table",
                tally: SparkTally | None = None):
    """DataFrame of Blob JSON (`blob` or `value`, string or binary) -> Kafka `key`, `value` rows.

    Entries are rebuilt within each Spark partition in row order and packed into Envelopes (split
    when larger than `max_message_bytes`); both halves of an update and every row of one DML event
    must be in the same partition, in order. Kafka-shaped input (`topic`, `partition`, `offset`)
    is put in that order here; any other input keeps the partitioning and order it has.
    `key`: "table" (db.table of the Entry, empty for entries naming none), "single" (one empty
    key: one Kafka partition, total order) or an input column's name (its value on the message
    completing the Entry). Consecutive Entries are packed together only when their keys agree.
    """
    if {"topic", "partition", "offset"} <= set(df.columns):
        extra = [c for c in ("entry", "row") if c in df.columns]
        df = df.repartition("topic", "partition").sortWithinPartitions("topic", "partition", "offset", *extra)
    fn = blob_to_dts_batches(options, mode, max_message_bytes=max_message_bytes, key=key, tally=tally, arrow=True)
    return df.mapInArrow(fn, dts_schema(mode))


# ---- sessions -------------------------------------------------------------------------------

def local_session(app_name: str = "dts-bridge", partitions: int = 2, conf: dict | None = None):
    """A `local[2]` SparkSession for demos and tests (no UI, few shuffle partitions).

    Workers run this interpreter unless PYSPARK_PYTHON says otherwise.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    builder = (SparkSession.builder.master("local[2]").appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", str(partitions)))
    for name, value in (conf or {}).items():
        builder = builder.config(name, str(value))
    return builder.getOrCreate()
