"""`df.write.format("dts-kafka")` / `writeStream.format("dts-kafka")`: DTS Envelopes to a Kafka
topic, exactly once in effect, through the library's writer (`bridge.kafka.sink.DtsKafkaSink`:
Entries packed as DTS packs them, partitioned by table or key, Kafka transactions).

The rows are `blob_to_dts` / `tuple_to_dts` output (`key`, `value` Envelopes; error rows of
PERMISSIVE, whose `value` is NULL, are counted and not written). Each task takes its rows' Entries
(segments of one Entries joined again) in order and writes them again with `DtsKafkaSink`, so the
output topic is packed and partitioned as `dts-bridge sync --to dts` writes it (the `key` column is
not used).

Exactly once: a task's `transactional.id` is `<transactionalIdPrefix>:<query id>:<partition>`
(stable across restarts of a query from its checkpoint and across task retries), so starting it
fences an earlier attempt and aborts its open transaction. The task then reads the markers topic
(compacted, read_committed): the marker of (query id, partition) holds the last micro-batch whose
part that task committed. If it is this micro-batch or a later one, the task writes nothing (a
replay after a crash); else it writes its Entries and the marker `{"batch": id}` in one
transaction. A read_committed consumer sees each Entry once. A batch write uses a query id made
on the driver (option `queryId` to make a rerun of the same job idempotent too) and batch 0.
pyspark and confluent-kafka are imported only when used.
"""
from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from bridge.errors import FramingError, OptionsError
from bridge.kafka import KafkaError

__all__ = ["WRITE_OPTIONS", "WriteOptions", "write_task", "register", "QUERY_ID_PROPERTY"]

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
DEFAULT_MARKERS_TOPIC = "dts-bridge-spark-markers"
log = logging.getLogger(__name__)

WRITE_OPTIONS = {
    "kafka.bootstrap.servers": (None, "bootstrap servers host:port[,host:port]"),
    "topic": (None, "the DTS topic written"),
    "partitionBy": ("table", "table (murmur2 of db.table, as DTS) or key (db.table and the first row's key)"),
    "maxMessageBytes": ("1000000", "an Envelope's bytes at most; larger Entries are cut into segments"),
    "markersTopic": (DEFAULT_MARKERS_TOPIC, "the compacted topic of the (query, partition) -> batch markers"),
    "transactionalIdPrefix": ("dts-bridge-spark", "a task's transactional.id is <prefix>:<query id>:<partition>"),
    "transactionTimeoutMs": (None, "transaction.timeout.ms of the tasks' producers"),
    "queryId": (None, "batch writes: the id of the job (a rerun with the same id writes nothing twice)"),
}
_BY_LOWER = {name.lower(): name for name in WRITE_OPTIONS}


@dataclass(frozen=True)
class WriteOptions:
    config: dict
    topic: str
    partition_by: str = "table"
    max_message_bytes: int = 1_000_000
    markers_topic: str = DEFAULT_MARKERS_TOPIC
    prefix: str = "dts-bridge-spark"
    transaction_timeout_ms: int | None = None
    query_id: str | None = None

    @classmethod
    def parse(cls, options) -> WriteOptions:
        given, config = {}, {}
        for key, value in dict(options).items():
            lower = key.lower()
            if lower == "kafka.bootstrap.servers":
                given["kafka.bootstrap.servers"] = value
            elif lower.startswith("kafka."):
                config[key[len("kafka."):]] = value
            elif lower in _BY_LOWER:
                given[_BY_LOWER[lower]] = value
            elif lower not in ("path", "checkpointlocation"):
                raise OptionsError(f"the dts-kafka sink has no option {key!r}; it takes "
                                   + ", ".join(WRITE_OPTIONS) + " and kafka.<librdkafka setting>")
        if not given.get("kafka.bootstrap.servers") or not given.get("topic"):
            raise OptionsError("the dts-kafka sink needs the options 'kafka.bootstrap.servers' and 'topic'")
        partition_by = str(given.get("partitionBy", "table")).lower()
        if partition_by not in ("table", "key"):
            raise OptionsError("option 'partitionBy' is table or key", value=given["partitionBy"])
        try:
            limit = int(given.get("maxMessageBytes", 1_000_000))
            timeout = int(given["transactionTimeoutMs"]) if "transactionTimeoutMs" in given else None
        except ValueError as exc:
            raise OptionsError(f"options 'maxMessageBytes' and 'transactionTimeoutMs' are integers ({exc})") from None
        if limit < 1024:
            raise OptionsError("option 'maxMessageBytes' is at least 1024", value=limit)
        for drop in ("transactional.id", "enable.idempotence", "isolation.level", "group.id"):
            if drop in config:
                raise OptionsError(f"option 'kafka.{drop}' is set by the dts-kafka sink itself")
        config["bootstrap.servers"] = given["kafka.bootstrap.servers"]
        return cls(config=config, topic=given["topic"], partition_by=partition_by, max_message_bytes=limit,
                   markers_topic=given.get("markersTopic", DEFAULT_MARKERS_TOPIC),
                   prefix=given.get("transactionalIdPrefix", "dts-bridge-spark"),
                   transaction_timeout_ms=timeout, query_id=given.get("queryId"))


def entries_of(values: Iterable) -> Iterable:
    """The Entries (pb.Entry) of a run of Envelope values in order (segments of one Entries joined)."""
    from bridge.wire import subscribe_pb2 as pb
    parts: list[bytes] = []
    expected = None
    for value in values:
        env = pb.Envelope.FromString(bytes(value))
        if env.total <= 1:
            if parts:
                raise FramingError(f"an Envelope of one segment inside an Entries of {expected} segments")
            data = env.data
        else:
            if env.index != len(parts) or (expected is not None and env.total != expected):
                raise FramingError(f"segment {env.index} of {env.total} where segment {len(parts)} was due")
            expected = env.total
            parts.append(env.data)
            if env.index < env.total - 1:
                continue
            data, parts, expected = b"".join(parts), [], None
        yield from pb.Entries.FromString(data).items
    if parts:
        raise FramingError(f"the rows end inside an Entries ({len(parts)} of {expected} segments)")


def marker_key(query_id: str, partition: int) -> bytes:
    return json.dumps([query_id, int(partition)], separators=(",", ":")).encode()


def write_task(opts: WriteOptions, batches: Iterable, query_id: str, batch_id: int, partition: int) -> dict:
    """One task's part of a micro-batch (see the module docstring). Returns its counts."""
    from bridge.kafka.sink import DtsKafkaSink
    from bridge.kafka.transactions import read_offsets_topic
    counts = {"partition": partition, "batch": batch_id, "rows": 0, "errors": 0, "entries": 0, "messages": 0,
              "skipped": False}
    sink = DtsKafkaSink(opts.config, opts.topic, transactional_id=f"{opts.prefix}:{query_id}:{partition}",
                        partition_by=opts.partition_by, max_message_bytes=opts.max_message_bytes,
                        source_of=lambda where: None, position_headers=False,
                        transaction_timeout_ms=opts.transaction_timeout_ms)
    try:
        sink.start()  # init_transactions: an earlier attempt of this task is fenced, its transaction aborted
        key = marker_key(query_id, partition)
        done = read_offsets_topic(opts.config, opts.markers_topic).get(key)
        if done is not None and json.loads(done)["batch"] >= batch_id:
            counts["skipped"] = True
            log.info("dts-kafka: query %s partition %d batch %d was committed before: nothing written",
                     query_id, partition, batch_id)
            return counts

        def values():
            for batch in batches:
                names = batch.schema.names
                value = batch.column(names.index("value")).to_pylist()
                errors = batch.column(names.index("error")).to_pylist() if "error" in names else [None] * len(value)
                for v, e in zip(value, errors):
                    counts["rows"] += 1
                    if v is None or e is not None:
                        counts["errors"] += 1
                        continue
                    yield v

        for entry in entries_of(values()):
            sink.write({}, entry)
            counts["entries"] += 1
        if counts["entries"] == 0:
            return counts
        marker = json.dumps({"batch": batch_id, "entries": counts["entries"], "at": int(time.time() * 1000)})
        sink.commit([(opts.markers_topic, key, marker.encode())])
        counts["messages"] = sink.messages
        return counts
    finally:
        sink.close()


def _prepare(opts: WriteOptions) -> None:
    """On the driver: the markers topic exists (compacted)."""
    from bridge.kafka.transactions import ensure_offsets_topic
    ensure_offsets_topic(opts.config, opts.markers_topic)


def _task_ids(streaming: bool, batch_query_id: str) -> tuple[str, int, int]:
    from pyspark import TaskContext
    context = TaskContext.get()
    partition = context.partitionId()
    if not streaming:
        return batch_query_id, 0, partition
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
    batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
    if query_id is None or batch_id is None:
        raise KafkaError(f"a streaming dts-kafka write task without Spark's {QUERY_ID_PROPERTY} / {BATCH_ID_PROPERTY}")
    return query_id, int(batch_id), partition


@functools.cache
def _classes():
    from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

    from bridge.spark.source import _classes as source_classes

    class DtsKafkaCommit(WriterCommitMessage):
        def __init__(self, counts: dict) -> None:
            self.counts = counts

    def summary(messages, batch_id, outcome: str) -> None:
        counts = [m.counts for m in messages if m is not None]
        log.info("dts-kafka: batch %s %s: %s", batch_id, outcome, json.dumps(counts))

    class DtsKafkaBatchWriter(DataSourceArrowWriter):
        def __init__(self, opts: WriteOptions) -> None:
            self.opts = opts
            self.query_id = opts.query_id or uuid.uuid4().hex

        def write(self, iterator):
            query_id, batch_id, partition = _task_ids(False, self.query_id)
            return DtsKafkaCommit(write_task(self.opts, iterator, query_id, batch_id, partition))

        def commit(self, messages) -> None:
            summary(messages, None, "commit")

        def abort(self, messages) -> None:
            summary(messages, None, "abort")

    class DtsKafkaStreamWriter(DataSourceStreamArrowWriter):
        def __init__(self, opts: WriteOptions) -> None:
            self.opts = opts

        def write(self, iterator):
            query_id, batch_id, partition = _task_ids(True, "")
            return DtsKafkaCommit(write_task(self.opts, iterator, query_id, batch_id, partition))

        def commit(self, messages, batchId) -> None:
            summary(messages, batchId, "commit")

        def abort(self, messages, batchId) -> None:
            # the committed parts stay, with their markers: the replay of this batch skips them
            summary(messages, batchId, "abort")

    class DtsKafkaDataSource(source_classes()[0]):
        """`format("dts-kafka")`: the source (bridge/spark/source.py) and this sink."""

        def writer(self, schema, overwrite: bool):
            opts = WriteOptions.parse(self.options)
            _prepare(opts)
            return DtsKafkaBatchWriter(opts)

        def streamWriter(self, schema, overwrite: bool):
            opts = WriteOptions.parse(self.options)
            _prepare(opts)
            return DtsKafkaStreamWriter(opts)

    return DtsKafkaDataSource, DtsKafkaBatchWriter, DtsKafkaStreamWriter


def register(spark) -> None:
    """`format("dts-kafka")` for reading (spark.read / readStream) and writing (write / writeStream)."""
    spark.dataSource.register(_classes()[0])
