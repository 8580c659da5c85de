"""Spark transforms: Kafka-shaped DTS DataFrames in, Blob / Tuple / DTS DataFrames out.

Two symmetric pairs, `dts_to_blob` / `blob_to_dts` and `dts_to_tuple` / `tuple_to_dts`, take and
return DataFrames. Each puts the input in stream order where the stream needs one and runs the
library's own converters through `mapInArrow`, one iterator per Spark partition, so that stream
state (Envelope reassembly, update pairing, Envelope packing, column codecs) lives across Arrow
batches. The per-partition functions (`*_batches`, for `mapInPandas` or `mapInArrow`) and their
output schemas (Spark DDL strings) are public too. On a streaming DataFrame, `dts_to_blob` and
`dts_to_tuple` run the same jobs per Kafka partition through `transformWithStateInPandas`, the
open Entries kept in Spark state (bridge/spark/streaming.py). `dts_entries` gives one row per
Entry (its bytes and position) for `format("datahub")` to convert a whole database in its tasks
(bridge/spark/tables.py). pyspark is imported only inside the
functions that need a session; docs/spark.md has the schemas, the modes and the ordering rules.

Bad records in Spark's words: `mode` FAILFAST (default) raises the bridge error, which names the
Kafka partition and offset; PERMISSIVE keeps a row with the error text in an `error` column;
DROPMALFORMED drops it. A `SparkTally` passed as `tally=` counts input, converted, rejected and
not-emitted records over the whole job (the stream layer's accounting).

>>> MODES["DROPMALFORMED"], dts_schema("PERMISSIVE")
('skip', '`key` BINARY, `value` BINARY, `error` STRING')
"""
from __future__ import annotations

import os
import sys

from bridge.errors import OptionsError
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.spark.jobs import (
    BLOB_COLUMNS,
    BLOB_SCHEMA,
    DTS_COLUMNS,
    DTS_SCHEMA,
    KAFKA_SCHEMA,
    KEYS,
    MODES,
    POSITION_COLUMNS,
    SparkTally,
    _batch_function,
    _BlobToDts,
    _ColumnSets,
    _ddl,
    _DtsToBlob,
    _DtsToTuple,
    _pack_columns,
    _policy_name,
    _tuple_fields,
    _tuple_output,
    _TupleToDts,
    _unpack_columns,
    _with_error,
)
from bridge.spark.streaming import DEFAULT_MAX_OPEN_OFFSETS, PROVIDER_CONF, ROCKSDB
from bridge.spark.tables import _DtsToEntries, entries_schema, export_dead_letters
from bridge.values.types import field_type_of_spark
from bridge.wire import subscribe_pb2 as pb

__all__ = [
    "dts_to_blob", "blob_to_dts", "dts_to_tuple", "tuple_to_dts", "table_columns", "dts_entries", "entries_schema",
    "export_dead_letters",
    "dts_to_blob_batches", "blob_to_dts_batches", "dts_to_tuple_batches", "tuple_to_dts_batches",
    "KAFKA_SCHEMA", "BLOB_SCHEMA", "DTS_SCHEMA", "blob_schema", "dts_schema", "tuple_schema",
    "kafka_order", "record_schema_of",
    "MODES", "KEYS", "SparkTally", "local_session", "register",
]


def blob_schema(mode: str = "FAILFAST") -> str:
    """DDL of `dts_to_blob` output; PERMISSIVE adds `error STRING`."""
    return _ddl(_with_error(BLOB_COLUMNS, mode))


def dts_schema(mode: str = "FAILFAST") -> str:
    """DDL of `blob_to_dts` / `tuple_to_dts` output: a Kafka sink's `key` and `value`."""
    return _ddl(_with_error(DTS_COLUMNS, mode))


def kafka_order(df, *extra: str):
    """Each Kafka partition's records in one Spark partition, in offset order (then `extra`):
    what the `dts_to_*_batches` functions need of their input.

    A streaming DataFrame is returned as it is: Spark cannot sort a stream, and its Kafka source
    already reads each topic partition's offsets in order in one task (unless `minPartitions`
    splits them).
    """
    if df.isStreaming:
        return df
    keys = [c for c in ("topic", "partition") if c in df.columns]
    # An explicit count: adaptive execution coalesces a bare repartition(*keys) of a small input
    # into one task, which would run every Kafka partition on one core.
    parallelism = max(df.sparkSession.sparkContext.defaultParallelism, 1)
    return df.repartition(parallelism, *keys).sortWithinPartitions(*keys, "offset", *extra)


def _dts_columns(df):
    """The Kafka columns the DTS converters read (`headers`: TDSQL's ShardId and ps)."""
    return df.select(*[c for c in ("topic", "partition", "offset", "value", "headers") if c in df.columns])


def _dts_input(df, ordered: bool = False):
    """The Kafka columns the DTS converters read, in Kafka order: put there (`kafka_order`, a
    shuffle) unless `ordered` says the input already is."""
    if not isinstance(ordered, bool):
        raise OptionsError("ordered must be True or False", value=ordered)
    columns = _dts_columns(df)
    return columns if ordered else kafka_order(columns)


def _streaming(df, make_job, output_ddl: str, tally, max_open_offsets, max_open_seconds, state_location,
               label: str):
    """A streaming DataFrame: reassembly per Kafka (topic, partition) kept across micro-batches, in
    Spark state (bridge/spark/streaming.py) or, with `state_location`, in tail files beside the
    query (bridge/spark/tails.py; docs/spark.md, "Streaming")."""
    if state_location is not None:
        from bridge.spark.tails import tail_transform
        return tail_transform(_dts_columns(df), make_job, output_ddl, tally, max_open_offsets, max_open_seconds,
                              state_location, label)
    from bridge.spark.streaming import stream_transform
    return stream_transform(_dts_columns(df), make_job, output_ddl, tally, max_open_offsets, max_open_seconds)


def _batch_only(df, state_location) -> None:
    if state_location is not None and not df.isStreaming:
        raise OptionsError("option 'state_location' keeps a streaming query's open Entries between micro-batches; "
                           "a batch DataFrame has none", value=state_location)


def dts_to_blob_batches(options: Options | None = None, mode: str = "FAILFAST", *,
                        tally: SparkTally | None = None, arrow: bool = False):
    """The per-partition function of `dts_to_blob`: `df.mapInPandas(fn, blob_schema(mode))`
    (`arrow=True`: `mapInArrow`). Each Kafka partition's records must come in offset order."""
    options = options or DEFAULT_OPTIONS
    _policy_name(mode)
    return _batch_function(lambda: _DtsToBlob(options, mode), arrow, tally)


def dts_to_blob(df, options: Options | None = None, mode: str = "FAILFAST", *,
                tally: SparkTally | None = None, ordered: bool = False,
                max_open_offsets: int | None = DEFAULT_MAX_OPEN_OFFSETS, max_open_seconds: float | None = None,
                state_location: str | None = None):
    """Kafka-shaped DTS DataFrame -> one row per Blob message (`blob_schema(mode)`).

    `offset` is the first segment of the Entries, `entry` the Entry's index in it and `row` the
    message's index among the Entry's messages: (topic, partition, offset, entry, row) is stream
    order, and each Spark partition's rows come in that order. `ordered=True`: the input already
    has each Kafka partition's records in one Spark partition, in offset order (a batch read of
    Spark's Kafka source without `minPartitions`), so the shuffle of `kafka_order` is skipped; input
    that is not reports framing errors with partition and offset (docs/spark.md, "Ordering").

    A streaming DataFrame (`df.isStreaming`) keeps the segments of unfinished Entries in Spark
    state per Kafka partition (transformWithStateInPandas, RocksDB state store), so an Entries cut
    by a micro-batch boundary is emitted whole, once, when it completes; one left open more than
    `max_open_offsets` offsets (or `max_open_seconds`) behind its partition is a dead letter
    under `mode` (docs/spark.md, "Streaming"). A batch read reports what is unfinished at its end.
    `state_location` (a path or URI every executor reaches, kept with the query's checkpoint) keeps
    those open tails in small files there instead of Spark's state store: the same output, at
    about the pace of a stateless pass (bridge/spark/tails.py).
    """
    options = options or DEFAULT_OPTIONS
    _batch_only(df, state_location)
    if df.isStreaming:
        _policy_name(mode)
        return _streaming(df, lambda: _DtsToBlob(options, mode), blob_schema(mode), tally,
                          max_open_offsets, max_open_seconds, state_location, "blob")
    fn = dts_to_blob_batches(options, mode, tally=tally, arrow=True)
    return _dts_input(df, ordered).mapInArrow(fn, blob_schema(mode))


def dts_entries(df, mode: str = "FAILFAST", *, tally: SparkTally | None = None, ordered: bool = False,
                max_open_offsets: int | None = DEFAULT_MAX_OPEN_OFFSETS, max_open_seconds: float | None = None,
                state_location: str | None = None):
    """Kafka-shaped DTS DataFrame -> one row per complete Entry (`entries_schema(mode)`): topic,
    partition, offset (the first segment of its Entries), entry (its index there) and `dts`, the
    Entry's bytes. Every Entry of every table and type, in stream order per Kafka partition: the
    input of `format("datahub")` for a whole database (docs/spark.md, "A whole database"), where
    each task converts the Entries as `dts-bridge sync` does, whatever DDL changes mid-stream.
    Reassembly, `ordered`, the streaming state (and `state_location`) and its limits are those of
    `dts_to_blob`.
    """
    _policy_name(mode)
    _batch_only(df, state_location)
    if df.isStreaming:
        return _streaming(df, lambda: _DtsToEntries(mode), entries_schema(mode), tally, max_open_offsets,
                          max_open_seconds, state_location, "entries")
    fn = _batch_function(lambda: _DtsToEntries(mode), True, tally)
    return _dts_input(df, ordered).mapInArrow(fn, entries_schema(mode))


def tuple_schema(schema, columns=None, mode: str = "FAILFAST", positions: bool = False) -> str:
    """DDL of `dts_to_tuple` output for a RecordSchema: DECIMAL fields take their DTS column's
    precision (`columns`), else DEFAULT_DECIMAL; `positions` puts topic..row in front."""
    return _ddl(_with_error(_tuple_output(_tuple_fields(schema, columns), mode, positions), mode))


def dts_to_tuple_batches(table: str, schema, options: Options | None = None, mode: str = "FAILFAST", *,
                         columns=None, positions: bool = False, tally: SparkTally | None = None,
                         arrow: bool = False):
    """The per-partition function of `dts_to_tuple`, for
    `df.mapInPandas(fn, tuple_schema(schema, columns, mode, positions))`."""
    options = options or DEFAULT_OPTIONS
    fields = _tuple_fields(schema, columns)
    _tuple_output(fields, mode, positions)
    return _batch_function(lambda: _DtsToTuple(options, mode, table, fields, positions), arrow, tally)


def table_columns(df, table: str, *, ordered: bool = False, options: Options | None = None) -> list[pb.Column]:
    """The DTS columns of `table` ("db.table") in a Kafka-shaped DTS DataFrame: every column of
    every column set its DML entries carry, in order of first appearance (a column the table
    redefined takes its last definition). One Spark job; bad records, and column sets no Tuple
    table is built of under `options` (an unknown or unparsable column type), are left to the
    conversion, which reports them under its mode."""
    options = options or DEFAULT_OPTIONS
    fn = _batch_function(lambda: _ColumnSets(table, options), True, None)
    found = _dts_input(df, ordered).mapInArrow(fn, _ddl(POSITION_COLUMNS + (("columns", "binary"),))).collect()
    merged: dict[str, pb.Column] = {}
    for row in sorted(found, key=lambda r: (r.topic or "", r.partition, r.offset, r.entry)):
        for column in pb.DMLEvent.FromString(row.columns).columns:
            merged[column.name] = column
    if not merged:
        raise OptionsError(f"no DML entries of table {table!r} with columns that convert in the DataFrame; "
                           "pass schema= and columns=")
    return list(merged.values())


def dts_to_tuple(df, table: str, schema=None, options: Options | None = None, mode: str = "FAILFAST", *,
                 columns=None, positions: bool = False, tally: SparkTally | None = None, ordered: bool = False,
                 max_open_offsets: int | None = DEFAULT_MAX_OPEN_OFFSETS, max_open_seconds: float | None = None,
                 state_location: str | None = None):
    """Kafka-shaped DTS DataFrame -> typed Tuple rows of one table ("db.table").

    `schema` is the DataHub RecordSchema (dict, JSON text or pydatahub RecordSchema); without it,
    it is `bridge.tuple.record_schema` of `columns`, and without those, of `table_columns(df,
    table)` (one more Spark job; a streaming DataFrame needs `schema` or `columns`). Entries of
    other tables and non-DML entries give no rows and count as not emitted. `positions=True` adds
    topic, partition, offset, entry, row in front. `ordered=True` skips the shuffle into Kafka
    order, and a streaming DataFrame keeps unfinished Entries in state (or in `state_location`), as
    in `dts_to_blob`.
    """
    options = options or DEFAULT_OPTIONS
    _batch_only(df, state_location)
    if schema is None:
        from bridge.tuple import record_schema
        if columns is None and df.isStreaming:
            raise OptionsError("a streaming dts_to_tuple needs schema= or columns= (table_columns reads "
                               "a batch DataFrame, e.g. the same topic read with spark.read)")
        columns = columns if columns is not None else table_columns(df, table, ordered=ordered, options=options)
        schema = record_schema(columns, options)
    if df.isStreaming:
        fields = _tuple_fields(schema, columns)
        output = tuple_schema(schema, columns, mode, positions)
        return _streaming(df, lambda: _DtsToTuple(options, mode, table, fields, positions), output, tally,
                          max_open_offsets, max_open_seconds, state_location, f"tuple-{table}")
    fn = dts_to_tuple_batches(table, schema, options, mode, columns=columns, positions=positions,
                              tally=tally, arrow=True)
    return _dts_input(df, ordered).mapInArrow(fn, tuple_schema(schema, columns, mode, positions))


def _dts_output(options: Options | None, mode: str, max_message_bytes: int | None, key: str):
    options = options or DEFAULT_OPTIONS
    _policy_name(mode)
    limit = max_message_bytes or options.max_message_bytes
    options.replace(max_message_bytes=limit)  # the option's own range check
    if not isinstance(key, str) or not key:
        raise OptionsError("option 'key' must be table, single or an input column's name", value=key)
    return options, limit


def _key_column(df, key: str) -> None:
    """A `key` naming an input column needs string or binary values: checked before any job runs."""
    if key in KEYS or key not in df.columns:
        return
    kind = df.schema[key].dataType.typeName()
    if kind not in ("string", "binary"):
        raise OptionsError(f"option 'key' names column {key!r} of Spark type {kind}; a key column is string "
                           "or binary", value=key)


def blob_to_dts_batches(options: Options | None = None, mode: str = "FAILFAST", *,
                        max_message_bytes: int | None = None, key: str = "table",
                        tally: SparkTally | None = None, arrow: bool = False):
    """The per-partition function of `blob_to_dts`: `df.mapInPandas(fn, dts_schema(mode))`."""
    options, limit = _dts_output(options, mode, max_message_bytes, key)
    return _batch_function(lambda: _BlobToDts(options, mode, limit, key), arrow, tally)


def _stream_order(df):
    """Kafka-shaped input (topic, partition, offset[, entry, row]) goes in stream order; any other
    input keeps the partitioning and order it has."""
    if {"topic", "partition", "offset"} <= set(df.columns):
        return kafka_order(df, *[c for c in ("entry", "row") if c in df.columns])
    return df


def blob_to_dts(df, options: Options | None = None, mode: str = "FAILFAST", *,
                max_message_bytes: int | None = None, key: str = "table", tally: SparkTally | None = None,
                max_held: int = 100_000, stall_seconds: float = 300.0):
    """Blob JSON (`blob` or `value` column, string or binary) -> Kafka `key`, `value` rows.

    Entries are rebuilt per Spark partition in row order and packed into Envelopes (split when
    larger than `max_message_bytes`): both halves of an update and every message of one DML event
    must be in the same Spark partition, in order (docs/spark.md). `key`: "table" (the Entry's
    db.table, empty for entries naming none), "single" (one empty key: one Kafka partition, total
    order) or an input column (its value on the message completing the Entry); Entries share an
    Envelope only when their keys agree.

    On rows of `format("datahub")` the shards are merged (bridge/spark/reverse.py); `max_held` and
    `stall_seconds` bound that merge as `sync --to dts --max-held --stall-seconds` do (docs/kafka.md,
    "Reading DataHub: stalls"). They are checked on any input and used only there.
    """
    from bridge.spark import reverse
    reverse.merge_bounds(max_held, stall_seconds)
    if reverse.is_datahub_frame(df):  # rows of format("datahub"): shards merged (bridge/spark/reverse.py)
        options, limit = _dts_output(options, mode, max_message_bytes, key)
        return reverse.datahub_to_dts(df, options, mode, limit, key, tally,
                                      max_held=max_held, stall_seconds=stall_seconds)
    fn = blob_to_dts_batches(options, mode, max_message_bytes=max_message_bytes, key=key, tally=tally,
                             arrow=True)
    _key_column(df, key)
    return _stream_order(df).mapInArrow(fn, dts_schema(mode))


def tuple_to_dts_batches(table: str | None, schema, options: Options | None = None, mode: str = "FAILFAST",
                         *, columns=None, max_message_bytes: int | None = None, key: str = "table",
                         tally: SparkTally | None = None, arrow: bool = False):
    """The per-partition function of `tuple_to_dts`: `df.mapInPandas(fn, dts_schema(mode))`."""
    from bridge.tuple import TupleDecoder
    options, limit = _dts_output(options, mode, max_message_bytes, key)
    TupleDecoder(schema, options, table=table, columns=columns)  # a schema that does not fit fails here
    raw = _pack_columns(columns)
    return _batch_function(lambda: _TupleToDts(options, mode, limit, key, schema, table, _unpack_columns(raw)),
                           arrow, tally)


def record_schema_of(df) -> dict:
    """The RecordSchema of a typed Tuple DataFrame, from its Spark types (`error`, and the
    position columns when all five are there, left out)."""
    skip = {"error"} | ({n for n, _ in POSITION_COLUMNS} if {n for n, _ in POSITION_COLUMNS} <= set(df.columns)
                        else set())
    fields = []
    for f in df.schema.fields:
        if f.name in skip:
            continue
        fields.append({"name": f.name,
                       "type": field_type_of_spark(f.name, f.dataType.simpleString(), "; pass schema=")})
    return {"fields": fields}


def tuple_to_dts(df, table: str | None, schema=None, options: Options | None = None, mode: str = "FAILFAST",
                 *, columns=None, max_message_bytes: int | None = None, key: str = "table",
                 tally: SparkTally | None = None, max_held: int = 100_000, stall_seconds: float = 300.0):
    """Typed Tuple rows of one table -> Kafka `key`, `value` rows (one DML Entry per row, per
    update pair). `schema` defaults to the RecordSchema of the DataFrame's Spark types; `columns`
    (e.g. `table_columns`) restores the original DTS column types. Both rows of an update must be
    in the same Spark partition; rows with positions (dts_to_tuple(positions=True)) are put in
    stream order here, other input keeps its order. On rows of `format("datahub")`: `max_held`,
    `stall_seconds` as `blob_to_dts`.
    """
    from bridge.spark import reverse
    reverse.merge_bounds(max_held, stall_seconds)
    if reverse.is_datahub_frame(df):  # rows of format("datahub"): shards merged (bridge/spark/reverse.py)
        options, limit = _dts_output(options, mode, max_message_bytes, key)
        return reverse.datahub_to_dts(df, options, mode, limit, key, tally, schema, table,
                                      max_held=max_held, stall_seconds=stall_seconds)
    schema = schema if schema is not None else record_schema_of(df)
    fn = tuple_to_dts_batches(table, schema, options, mode, columns=columns, max_message_bytes=max_message_bytes,
                              key=key, tally=tally, arrow=True)
    _key_column(df, key)
    return _stream_order(df).mapInArrow(fn, dts_schema(mode))


def register(spark) -> None:
    """Register the bridge's Spark data sources in this session: `format("dts-kafka")` (read a DTS
    Kafka topic; write DTS Envelopes exactly once) and `format("datahub")` (write Blob or Tuple rows
    to DataHub; read a DataHub topic's shards), batch and streaming; docs/spark.md."""
    from bridge.spark import kafka_sink, sink
    kafka_sink.register(spark)  # the dts-kafka source (bridge/spark/source.py) and its writer
    sink.register(spark)  # format("datahub"): the writer, and the reader (bridge/spark/datahub_source.py)


def local_session(app_name: str = "dts-bridge", conf: dict | None = None):
    """A `local[2]` SparkSession for demos and tests: no UI or progress bar, 2 shuffle partitions,
    the RocksDB state store with changelog checkpointing (what streaming `dts_to_blob` /
    `dts_to_tuple` need), and Python workers running this interpreter unless PYSPARK_PYTHON says otherwise
    (getOrCreate: an existing session is reused)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    builder = (SparkSession.builder.master("local[2]").appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               # streaming dts_to_blob / dts_to_tuple keep reassembly in transformWithStateInPandas state
               .config(PROVIDER_CONF, ROCKSDB)
               .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true"))
    for name, value in (conf or {}).items():
        builder = builder.config(name, str(value))
    return builder.getOrCreate()
