"""A Spark 4 Python data source "datahub": the rows of `dts_to_blob` (a Blob topic), of
`dts_to_tuple(..., positions=True)` (a Tuple topic) or of `dts_entries` (a whole database, converted
in the task as `dts-bridge sync` converts it: bridge/spark/tables.py) written to Alibaba DataHub, batch
(`df.write.format("datahub").mode("append")`) and streaming (`writeStream.format("datahub")`),
through the one DataHub writer (`bridge.datahub.sink.DataHubWriter`: ordered per shard,
retried, idempotent by the source position every record carries).

    >>> import bridge.spark                                               # doctest: +SKIP
    >>> bridge.spark.register(spark)                                      # doctest: +SKIP
    >>> (bridge.spark.dts_to_blob(kafka_stream).writeStream.format("datahub")
    ...  .option("endpoint", "https://dh-cn-hangzhou.aliyuncs.com").option("project", "p")
    ...  .option("topic", "orders_blob").option("checkpointLocation", "/ckpt/orders")
    ...  .start())                                                        # doctest: +SKIP

Each task builds one writer per Kafka topic it sees (the position's source), puts its rows in the
order they arrive (dts_to_blob gives each Kafka partition's rows in stream order, in one task),
flushes, and returns its counts; the driver's `commit` adds them up (`commitLog` keeps them).
In a stream every record also carries the micro-batch id (`dts.epoch`) and the writer first reads
each shard's tail back to the previous micro-batch: a micro-batch replayed after a crash (same id,
same rows, from the checkpoint) writes only what its failed attempt did not land. docs/spark.md,
"Writing to DataHub: format("datahub")", has the options, the guarantee and its limits.
pyspark is imported only when the source is registered; the task side needs pyarrow and pydatahub.

>>> [o.key for o in OPTIONS][:3]
['endpoint', 'project', 'topic']
>>> parse_options({"endpoint": "http://h", "project": "p", "topic": "t", "batchsize": "0"})
Traceback (most recent call last):
...
bridge.errors.OptionsError: option 'batchSize' must be an integer >= 1: 0
"""
from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from bridge.datahub.sink import DataHubError
from bridge.errors import OptionsError
from bridge.spark.datahub_source import ReadOptions, read_schema, register_reader
from bridge.spark.tables import ENTRY_COLUMNS, TablesTask
from bridge.spark.task import (
    _ENTRY_OPTIONS,
    _POSITIONS,
    NAME,
    OPTIONS,
    RowsTask,
    SinkConfig,
    conversion_options,
    parse_options,
)
from bridge.values.types import field_type_of_spark

__all__ = ["register", "NAME", "OPTIONS", "SinkConfig", "parse_options", "configure", "write_batches",
           "BATCH_ID_PROPERTY"]  # DataHubDataSource too, built on first access (needs pyspark)

# The local property Spark's micro-batch execution sets on every task of a micro-batch.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
_BLOB_INPUT = ("shard_key", "blob")
_log = logging.getLogger("bridge.spark.sink")


# ---- the input's shape, decided on the driver ---------------------------------------------------

def configure(options, columns: Iterable[tuple[str, str]], *, streaming: bool, overwrite: bool = False) -> SinkConfig:
    """Check the options against the input's columns ((name, Spark simpleString) pairs) up front:
    Blob rows are dts_to_blob's (`shard_key` and `blob`), anything else is Tuple rows whose columns
    (besides the positions, `error` and the db/table of a template) are the RecordSchema fields."""
    opts = parse_options(options)
    columns = list(columns)
    names = [n for n, _ in columns]
    if overwrite:
        raise OptionsError(f"the {NAME} sink only appends (a DataHub topic cannot be overwritten): use "
                           "mode('append') / outputMode('append')")
    if streaming and opts["epoch"] is not None:
        raise OptionsError("option 'epoch' is for batch writes; a streaming write uses the micro-batch id")
    if "dts" in names:
        return _configure_entries(opts, dict(columns), options)
    given = {str(k).lower() for k in dict(options)}
    for key in _ENTRY_OPTIONS:
        if key.lower() in given:
            raise OptionsError(f"option {key!r} is for rows of dts_entries (a whole database); these rows are "
                               "dts_to_blob's or dts_to_tuple's")
    missing = [p for p in _POSITIONS if p not in names]
    if missing:
        raise OptionsError(f"the {NAME} sink needs the position columns {', '.join(_POSITIONS)} (dts_to_blob "
                           "has them; dts_to_tuple with positions=True)", value=missing)
    if opts["source"] is None and dict(columns)["topic"] != "string":
        raise OptionsError("column 'topic' must be a string (the Kafka topic), or set option 'source'")
    epoch = opts["epoch"]
    if all(c in names for c in _BLOB_INPUT):
        if opts["keyColumns"] or opts["table"]:
            raise OptionsError("options 'keyColumns' and 'table' are for Tuple rows; Blob rows carry shard_key")
        if "{db}" in opts["topic"] or "{table}" in opts["topic"]:
            raise OptionsError("Blob rows go to one topic: option 'topic' must be a name, not a template",
                               value=opts["topic"])
        return SinkConfig(opts, "BLOB", epoch=epoch)
    by_table = "{db}" in opts["topic"] or "{table}" in opts["topic"]
    rows_name_tables = by_table and opts["table"] is None
    if rows_name_tables and not {"db", "table"} <= set(names):
        raise OptionsError("option 'topic' is a template: set option 'table' (db.table) or give the rows db and "
                           "table columns", value=opts["topic"])
    if opts["keyColumns"] is None and opts["table"] is None and not rows_name_tables:
        raise OptionsError("Tuple rows need option 'keyColumns' (the shard key, as dts-bridge sync keys them) or "
                           "option 'table' (db.table: every row of the table in one shard)")
    skip = set(_POSITIONS) | {"error"} | ({"db", "table"} if rows_name_tables else set())
    fields = tuple((n, field_type_of_spark(n, t)) for n, t in columns if n not in skip)
    if not fields:
        raise OptionsError("the rows have no column besides positions: not Blob rows (shard_key, blob) nor "
                           "Tuple rows")
    unknown = [k for k in opts["keyColumns"] or () if k not in dict(fields)]
    if unknown:
        raise OptionsError("option 'keyColumns' names columns the rows do not have", value=unknown)
    timestamps = tuple(n for n, t in fields if t == "TIMESTAMP")
    return SinkConfig(opts, "TUPLE", fields, timestamps, rows_name_tables, epoch)


def _configure_entries(opts: dict, columns: dict, given) -> SinkConfig:
    """Rows of dts_entries: the whole-database mode, its options checked as dts-bridge sync checks its flags."""
    wrong = [f"{n} {columns.get(n)}" for n, t in ENTRY_COLUMNS if columns.get(n) != t and (n, t) != ("topic", "string")]
    if wrong:
        raise OptionsError(f"rows with a dts column are dts_entries rows: they need "
                           f"{', '.join(f'{n} {t}' for n, t in ENTRY_COLUMNS)}", value=wrong)
    if opts["source"] is None and columns.get("topic") != "string":
        raise OptionsError("column 'topic' must be a string (the Kafka topic), or set option 'source'")
    for key in ("keyColumns", "table"):
        if opts[key] is not None:
            raise OptionsError(f"option {key!r} is for dts_to_tuple rows; dts_entries rows are keyed and named as "
                               "dts-bridge sync keys and names them")
    conversion_options(opts)  # checked here, on the driver: a bad combination fails before any task
    template = opts["topic"]
    if opts["to"] == "tuple" and "{table}" not in template:
        raise OptionsError("option 'to' tuple writes one topic per table: option 'topic' needs {table} "
                           "(e.g. '{db}_{table}')", value=template)
    if opts["to"] == "blob" and "{table}" in template:
        raise OptionsError("option 'to' blob writes one topic, or one per database ({db}): option 'topic' takes "
                           "no {table}", value=template)
    given = {str(k).lower() for k in dict(given)}
    if opts["to"] == "blob" and "schemachange" in given and opts["schemaChange"] != "evolve":
        raise OptionsError("option 'schemaChange' is for option 'to' tuple (Blob topics carry DDL messages as "
                           "they come)", value=opts["schemaChange"])
    letters = opts["onTableError"] in ("dlq", "halt-table") or opts["oversized"] == "dlq"
    if letters and not opts["deadLetters"]:
        raise OptionsError("options onTableError dlq|halt-table and oversized dlq write dead letters: set option "
                           "'deadLetters' (a DataHub Blob topic)")
    if opts["deadLetters"] and "{" in opts["deadLetters"]:
        raise OptionsError("option 'deadLetters' names one DataHub Blob topic", value=opts["deadLetters"])
    if opts["deadLetters"] and not letters:
        raise OptionsError("option 'deadLetters' would never be written: onTableError halt-all and oversized fail "
                           "stop the task instead (set onTableError dlq|halt-table or oversized dlq)")
    if opts["deadLetters"] and opts["to"] == "blob" and opts["deadLetters"] == template:
        raise OptionsError("option 'deadLetters' names the topic of the data (option 'topic'): the dead letters "
                           "need a topic of their own", value=template)
    return SinkConfig(opts, "ENTRIES", epoch=opts["epoch"])


def write_batches(config: SinkConfig, batches: Iterable, epoch: int | None = None, *,
                  client_for: Callable[[], Any] | None = None) -> dict:
    """The work of one task: every row of `batches` (Arrow record batches) put in order, then
    flushed; returns the counts. `epoch` (the micro-batch id, or the batch option) makes a rerun
    with the same rows write only what did not land. Records not acknowledged when this raises
    are abandoned (the replay sends them again)."""
    task = (TablesTask if config.kind == "ENTRIES" else RowsTask)(config, epoch, client_for)
    try:
        task.run(batches)
    except BaseException:
        task.stop()
        raise
    return task.report()


# ---- the driver side ----------------------------------------------------------------------------

_COUNTED = ("rows", "written", "skipped", "rejected", "requests", "retries", "throttled", "resplits",
            "dead_letters", "converted", "not_emitted")


def summarize(reports: list[dict | None], batch_id: int | None, outcome: str) -> dict:
    """The tasks' counts added up (tasks that failed send none)."""
    done = [r for r in reports if r is not None]
    epoch = batch_id if batch_id is not None else next((r.get("epoch") for r in done), None)
    out: dict[str, Any] = {"outcome": outcome, "batch": batch_id, "epoch": epoch, "tasks": len(reports),
                           "reported": len(done)}
    for name in _COUNTED:
        out[name] = sum(r.get(name, 0) for r in done)
    out["offsets"] = {k: v for r in done for k, v in sorted(r.get("offsets", {}).items())}
    if any("halted" in r for r in done):  # the whole-database mode's facts
        out["halted"] = {k: v for r in done for k, v in sorted(r.get("halted", {}).items())}
        out["evolved"] = [e for r in done for e in r.get("evolved", [])]
        out["ignored"] = {k: v for r in done for k, v in sorted(r.get("ignored", {}).items())}
    return out


def _record(config: SinkConfig, summary: dict) -> None:
    _log.info("%s: %s", NAME, json.dumps(summary, sort_keys=True))
    path = config.options["commitLog"]
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(dict(summary, at=round(time.time(), 3)), sort_keys=True) + "\n")


def _task_epoch(config: SinkConfig, streaming: bool) -> int | None:
    if not streaming:
        return config.epoch
    from pyspark import TaskContext
    context = TaskContext.get()
    batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
    if batch_id is None:
        raise DataHubError(f"a streaming write task without Spark's {BATCH_ID_PROPERTY}: cannot tag its records")
    return int(batch_id)


def _spark_columns(schema) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


@functools.cache
def _classes():
    """The DataSource classes, defined on first use so that importing this module needs no pyspark."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceStreamArrowWriter,
        WriterCommitMessage,
    )

    class DataHubCommit(WriterCommitMessage):
        """One task's counts (rows, written, skipped, rejected, requests, retries, epoch, offsets)."""

        def __init__(self, counts: dict) -> None:
            self.counts = counts

    def reports(messages) -> list:
        return [m.counts if m is not None else None for m in messages]

    class DataHubBatchWriter(DataSourceArrowWriter):
        def __init__(self, config: SinkConfig) -> None:
            self.config = config

        def write(self, iterator):
            return DataHubCommit(write_batches(self.config, iterator, _task_epoch(self.config, False)))

        def commit(self, messages) -> None:
            _record(self.config, summarize(reports(messages), None, "commit"))

        def abort(self, messages) -> None:
            # Records the finished tasks landed stay in DataHub; a rerun with the same option
            # epoch finds and skips them (without it, it writes them again).
            _record(self.config, summarize(reports(messages), None, "abort"))

    class DataHubStreamWriter(DataSourceStreamArrowWriter):
        def __init__(self, config: SinkConfig) -> None:
            self.config = config

        def write(self, iterator):
            return DataHubCommit(write_batches(self.config, iterator, _task_epoch(self.config, True)))

        def commit(self, messages, batchId) -> None:
            _record(self.config, summarize(reports(messages), batchId, "commit"))

        def abort(self, messages, batchId) -> None:
            # Nothing to undo: Spark runs this micro-batch again (same id, same rows) when the
            # query restarts, and its epoch scan skips every record that landed now.
            _record(self.config, summarize(reports(messages), batchId, "abort"))

    class DataHubDataSource(DataSource):
        """`df.write.format("datahub")` / `writeStream.format("datahub")`: the module docstring and
        docs/spark.md give the options."""

        @classmethod
        def name(cls) -> str:
            return NAME

        def schema(self):  # a read (bridge/spark/datahub_source.py)
            return read_schema(ReadOptions.parse(self.options, streaming=True))[0]

        def reader(self, schema):
            return register_reader(self.options, streaming=False)

        def streamReader(self, schema):
            return register_reader(self.options, streaming=True)

        def writer(self, schema, overwrite: bool):
            return DataHubBatchWriter(configure(self.options, _spark_columns(schema), streaming=False,
                                                overwrite=overwrite))

        def streamWriter(self, schema, overwrite: bool):
            return DataHubStreamWriter(configure(self.options, _spark_columns(schema), streaming=True,
                                                 overwrite=overwrite))

    return DataHubDataSource, DataHubBatchWriter, DataHubStreamWriter, DataHubCommit


def __getattr__(name: str):
    if name == "DataHubDataSource":
        return _classes()[0]
    raise AttributeError(name)


def register(spark) -> None:
    """Make `df.write.format("datahub")` and `writeStream.format("datahub")` available in this session."""
    spark.dataSource.register(_classes()[0])
