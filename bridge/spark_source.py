"""A Spark 4 Python data source "dts-kafka": a Kafka topic as the Kafka source's DataFrame, built on
confluent-kafka, for clusters without the JVM Kafka connector (spark-sql-kafka) on the classpath.

    >>> from bridge.spark_source import register              # doctest: +SKIP
    >>> register(spark)                                        # doctest: +SKIP
    >>> df = (spark.read.format("dts-kafka").option("brokers", "h:9092")
    ...       .option("topic", "dts").load())                  # doctest: +SKIP
    >>> blob = bridge.spark.dts_to_blob(df)                    # doctest: +SKIP

Columns are the Kafka source's (`key`, `value` binary, `topic` string, `partition` int, `offset`
long, `timestamp` timestamp), so `bridge.spark.dts_to_blob` and friends apply unchanged. A batch
read plans one input partition per Kafka partition, from its low watermark (or `startingOffsets`
per partition) to the high watermark at planning time. `readStream` works the same way per
micro-batch: its offsets are {partition: next offset}, each micro-batch reads up to the high
watermarks seen when it is planned. Options: `brokers`, `topic`, `partitions` ("0,2"),
`startingOffsets` ("earliest", "latest" or JSON {"0": 42}), `pollTimeout` (seconds without a
message before a read fails, default 60), and `kafka.<librdkafka key>` for anything else
(SASL: `kafka.security.protocol`, `kafka.sasl.mechanism`, `kafka.sasl.username`, ...).
pyspark and confluent-kafka are imported only when the source is registered or used.
"""
from __future__ import annotations

import datetime
import json
from typing import Iterator

__all__ = ["register", "NAME"]  # DtsKafkaDataSource too, built on first access (needs pyspark)

NAME = "dts-kafka"
_UTC = datetime.timezone.utc


def _config(options: dict) -> tuple[dict, str, list | None, float, str]:
    brokers, topic = options.get("brokers"), options.get("topic")
    if not brokers or not topic:
        raise ValueError(f"the {NAME} source needs the options 'brokers' and 'topic'")
    config = {"bootstrap.servers": brokers, "group.id": options.get("kafka.group.id", "dts-bridge-spark"),
              "enable.auto.commit": False, "enable.partition.eof": False}
    for key, value in options.items():
        if key.startswith("kafka."):
            config[key[len("kafka."):]] = value
    wanted = options.get("partitions")
    partitions = [int(p) for p in str(wanted).split(",")] if wanted else None
    return config, topic, partitions, float(options.get("pollTimeout", 60)), options.get("startingOffsets", "earliest")


def _watermarks(config: dict, topic: str, partitions: list | None) -> dict[int, tuple[int, int]]:
    from confluent_kafka import Consumer, TopicPartition

    from .kafka import partitions_of
    consumer = Consumer(config)
    try:
        ids = partitions if partitions is not None else partitions_of(consumer, topic)
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in ids}
    finally:
        consumer.close()


def _starts(spec: str, marks: dict[int, tuple[int, int]]) -> dict[int, int]:
    if spec == "earliest":
        return {p: low for p, (low, _) in marks.items()}
    if spec == "latest":
        return {p: high for p, (_, high) in marks.items()}
    given = {int(k): int(v) for k, v in json.loads(spec).items()}
    return {p: max(low, given.get(p, low)) for p, (low, _) in marks.items()}


def _read_range(config: dict, topic: str, partition: int, start: int, end: int, timeout: float) -> Iterator[tuple]:
    """Rows of one partition's offsets [start, end), in offset order."""
    if end <= start:
        return
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    consumer = Consumer(config)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        while True:
            msg = consumer.poll(timeout)
            if msg is None:
                raise RuntimeError(f"{NAME}: no message from {topic} partition {partition} within {timeout:g} s "
                                   f"(waiting for offsets up to {end - 1})")
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"{NAME}: {topic} partition {partition}: {err.str()}")
            offset = msg.offset()
            if offset >= end:
                return
            kind, millis = msg.timestamp()
            stamp = datetime.datetime.fromtimestamp(millis / 1000, _UTC) if millis is not None and millis >= 0 else None
            yield (msg.key(), msg.value(), topic, partition, offset, stamp)
            if offset >= end - 1:
                return
    finally:
        consumer.close()


def _classes():
    """The DataSource classes, defined on first use so that importing this module needs no pyspark."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

    from .spark import KAFKA_SCHEMA

    class KafkaRange(InputPartition):
        def __init__(self, partition: int, start: int, end: int) -> None:
            super().__init__((partition, start, end))
            self.partition, self.start, self.end = partition, start, end

    class DtsKafkaReader(DataSourceReader):
        def __init__(self, options: dict) -> None:
            self.config, self.topic, self.wanted, self.timeout, self.start = _config(options)

        def partitions(self):
            marks = _watermarks(self.config, self.topic, self.wanted)
            starts = _starts(self.start, marks)
            return [KafkaRange(p, starts[p], high) for p, (_, high) in sorted(marks.items())]

        def read(self, partition):
            return _read_range(self.config, self.topic, partition.partition, partition.start, partition.end,
                               self.timeout)

    class DtsKafkaStreamReader(DataSourceStreamReader):
        def __init__(self, options: dict) -> None:
            self.config, self.topic, self.wanted, self.timeout, self.start = _config(options)

        def initialOffset(self) -> dict:
            marks = _watermarks(self.config, self.topic, self.wanted)
            return {str(p): off for p, off in sorted(_starts(self.start, marks).items())}

        def latestOffset(self, start=None, limit=None) -> dict:
            marks = _watermarks(self.config, self.topic, self.wanted)
            return {str(p): high for p, (_, high) in sorted(marks.items())}

        def partitions(self, start: dict, end: dict):
            return [KafkaRange(int(p), int(start.get(p, 0)), int(stop)) for p, stop in sorted(end.items())
                    if int(stop) > int(start.get(p, 0))]

        def read(self, partition):
            return _read_range(self.config, self.topic, partition.partition, partition.start, partition.end,
                               self.timeout)

        def commit(self, end: dict) -> None:
            pass  # Spark's checkpoint holds the offsets; nothing is committed to Kafka

    class DtsKafkaDataSource(DataSource):
        """`spark.read.format("dts-kafka")`: see the module docstring for the options."""

        @classmethod
        def name(cls) -> str:
            return NAME

        def schema(self):
            return KAFKA_SCHEMA

        def reader(self, schema):
            return DtsKafkaReader(dict(self.options))

        def streamReader(self, schema):
            return DtsKafkaStreamReader(dict(self.options))

    return DtsKafkaDataSource, KafkaRange, DtsKafkaReader, DtsKafkaStreamReader


def __getattr__(name: str):
    if name == "DtsKafkaDataSource":
        return _classes()[0]
    raise AttributeError(name)


def register(spark) -> None:
    """Make `spark.read.format("dts-kafka")` (and `readStream`) available in this session."""
    spark.dataSource.register(_classes()[0])
