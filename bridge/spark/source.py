"""A Spark 4 Python data source "dts-kafka": a Kafka topic as the Kafka source's DataFrame, built on
confluent-kafka, for clusters without the JVM Kafka connector (spark-sql-kafka) on the classpath.

    >>> from bridge.spark.source import register              # doctest: +SKIP
    >>> register(spark)                                        # doctest: +SKIP
    >>> df = (spark.read.format("dts-kafka").option("brokers", "h:9092")
    ...       .option("topic", "dts").load())                  # doctest: +SKIP
    >>> blob = bridge.spark.dts_to_blob(df)                    # doctest: +SKIP

Columns are the Kafka source's (`key`, `value` binary, `topic` string, `partition` int, `offset`
long, `timestamp` timestamp; `headers` array<struct<key string, value binary>> with
`includeHeaders`), so `bridge.spark.dts_to_blob` and friends apply unchanged. The options and
their meaning are those of Spark's own Kafka source (`OPTIONS` below, docs/kafka.md "dts-kafka
options"): `startingOffsets` / `endingOffsets` ("earliest", "latest" or JSON
{"topic": {"0": 23, "1": -2}}), `maxOffsetsPerTrigger` (admission control through Spark's
ReadLimit), `Trigger.AvailableNow`, `failOnDataLoss`, `minPartitions` (batch only), plus `groupId`:
the offsets of each committed micro-batch are committed to that Kafka consumer group, for lag tools.
A streaming query's offsets are Spark's {"topic": {"partition": next offset}} document.
pyspark and confluent-kafka are imported only when the source is registered or used.
"""
from __future__ import annotations

import datetime
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass

from bridge.errors import OptionsError
from bridge.kafka import KafkaError

__all__ = ["register", "NAME", "OPTIONS", "SourceOptions", "DataLossError"]  # DtsKafkaDataSource: needs pyspark

NAME = "dts-kafka"
EARLIEST, LATEST = -2, -1  # the JSON offsets Spark's Kafka source takes for "earliest" / "latest"
HEADERS_COLUMN = "`headers` ARRAY<STRUCT<`key`: STRING, `value`: BINARY>>"
_UTC = datetime.timezone.utc
log = logging.getLogger(__name__)

# Every option once: name -> (default, where it applies, meaning). Spark lower-cases option names.
OPTIONS = {
    "brokers": (None, "both", "bootstrap servers host:port[,host:port] (or kafka.bootstrap.servers)"),
    "topic": (None, "both", "the topic to read (or subscribe, with one topic)"),
    "partitions": (None, "both", "only these partition ids, e.g. \"0,2\" (default: all)"),
    "startingOffsets": ("earliest", "both", "earliest, latest, or JSON {\"topic\": {\"0\": 23, \"1\": -2}}"),
    "endingOffsets": ("latest", "batch", "latest, or JSON {\"topic\": {\"0\": 50, \"1\": -1}}"),
    "failOnDataLoss": ("true", "both", "offsets deleted before they were read: fail (true) or skip and log"),
    "maxOffsetsPerTrigger": (None, "stream", "at most this many offsets per micro-batch, split by lag"),
    "minPartitions": (None, "batch", "split large partitions' offset ranges into at least this many tasks"),
    "includeHeaders": ("false", "both", "add the column headers array<struct<key string, value binary>>"),
    "groupId": (None, "stream", "commit each committed micro-batch's end offsets to this consumer group"),
    "pollTimeout": ("60", "both", "seconds a read may wait for a message before it fails"),
}
_BY_LOWER = {name.lower(): name for name in OPTIONS}


class DataLossError(KafkaError):
    """Offsets a query was to read are gone from the broker (retention, DeleteRecords) and
    `failOnDataLoss` is true."""


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, parsed and checked once (`SourceOptions.parse`); picklable, as Spark
    ships the readers to its executors."""
    config: dict
    topic: str
    partitions: tuple | None = None
    starting: object = "earliest"  # "earliest" | "latest" | {partition: offset, -2 earliest, -1 latest}
    ending: object = "latest"
    fail_on_data_loss: bool = True
    max_offsets: int | None = None
    min_partitions: int | None = None
    include_headers: bool = False
    group_id: str | None = None
    poll_timeout: float = 60.0

    @classmethod
    def parse(cls, options, streaming: bool) -> SourceOptions:
        """`options` as Spark hands them (any case); `streaming` for readStream. Options that make
        no sense for the kind of read are refused, naming the option."""
        given, config = {}, {}
        for key, value in dict(options).items():
            lower = key.lower()
            if lower.startswith("kafka."):
                config[lower[len("kafka."):]] = value
            elif lower == "subscribe":
                given["topic"] = value
            elif lower in _BY_LOWER:
                given[_BY_LOWER[lower]] = value
            elif lower not in ("path",):  # no value in the message: it may be a misplaced secret
                raise OptionsError(f"the {NAME} source has no option {key!r}; it takes "
                                   + ", ".join(OPTIONS) + " and kafka.<librdkafka setting>")
        for name, (_, where, _) in OPTIONS.items():
            if name in given and where == ("batch" if streaming else "stream"):
                raise OptionsError(f"option {name!r} applies to {where} reads only "
                                   f"({'readStream' if where == 'stream' else 'read'})", value=given[name])
        brokers = given.get("brokers") or config.get("bootstrap.servers")
        topic = given.get("topic")
        if not brokers or not topic:
            raise OptionsError(f"the {NAME} source needs the options 'brokers' and 'topic'")
        if "," in topic:
            raise OptionsError(f"the {NAME} source reads one topic ('topic')", value=topic)
        # read_uncommitted as in Spark's source (librdkafka's default is read_committed)
        config = {"group.id": "dts-bridge-spark", "isolation.level": "read_uncommitted", **config,
                  "bootstrap.servers": brokers, "enable.auto.commit": False}
        wanted = given.get("partitions")
        starting = _offsets_spec("startingOffsets", given.get("startingOffsets", "earliest"), topic)
        ending = _offsets_spec("endingOffsets", given.get("endingOffsets", "latest"), topic)
        if not streaming:  # Spark's batch rules: a batch starts before latest and ends after earliest
            if starting == "latest" or isinstance(starting, dict) and LATEST in starting.values():
                raise OptionsError("startingOffsets cannot be latest (-1) for a batch read", value=starting)
            if ending == "earliest" or isinstance(ending, dict) and EARLIEST in ending.values():
                raise OptionsError("endingOffsets cannot be earliest (-2) for a batch read", value=ending)
        return cls(config=config, topic=topic,
                   partitions=tuple(_integer("partitions", p, 0) for p in str(wanted).split(",")) if wanted else None,
                   starting=starting, ending=ending,
                   fail_on_data_loss=_flag("failOnDataLoss", given.get("failOnDataLoss", "true")),
                   max_offsets=_integer("maxOffsetsPerTrigger", given["maxOffsetsPerTrigger"], 1)
                   if "maxOffsetsPerTrigger" in given else None,
                   min_partitions=_integer("minPartitions", given["minPartitions"], 1)
                   if "minPartitions" in given else None,
                   include_headers=_flag("includeHeaders", given.get("includeHeaders", "false")),
                   group_id=given.get("groupId") or None,
                   poll_timeout=_number("pollTimeout", given.get("pollTimeout", "60")))


def _flag(name: str, text) -> bool:
    value = str(text).strip().lower()
    if value not in ("true", "false"):
        raise OptionsError(f"option {name!r} is true or false", value=text)
    return value == "true"


def _integer(name: str, text, least: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise OptionsError(f"option {name!r} is an integer", value=text) from None
    if value < least:
        raise OptionsError(f"option {name!r} is at least {least}", value=text)
    return value


def _number(name: str, text) -> float:
    try:
        value = float(text)
    except ValueError:
        raise OptionsError(f"option {name!r} is a number of seconds", value=text) from None
    if not value > 0:
        raise OptionsError(f"option {name!r} is above 0", value=text)
    return value


def _offsets_spec(name: str, text, topic: str):
    """"earliest" / "latest", or {partition: offset} from Spark's JSON {"topic": {"0": 23}} (the
    older {"0": 23} of this source is taken too)."""
    spec = str(text).strip()
    if spec.lower() in ("earliest", "latest"):
        return spec.lower()
    try:
        doc = json.loads(spec)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise OptionsError(f"option {name!r} is earliest, latest or JSON "
                           f"{{\"{topic}\": {{\"0\": 23, \"1\": -2}}}}", value=text)
    if not all(isinstance(v, dict) for v in doc.values()):
        doc = {topic: doc}
    others = sorted(set(doc) - {topic})
    if others:
        raise OptionsError(f"option {name!r} names topic {others[0]!r}; this source reads {topic!r}", value=text)
    offsets = {}
    for partition, offset in doc.get(topic, {}).items():
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
            raise OptionsError(f"option {name!r}: the offset of partition {partition} is an integer >= -2 "
                               "(-2 earliest, -1 latest)", value=text)
        offsets[_integer(name, partition, 0)] = offset
    return offsets


# ---- offsets ---------------------------------------------------------------------------------------

def offsets_document(topic: str, positions: dict[int, int]) -> dict:
    """Spark's Kafka offset document {"topic": {"0": next offset}}, partitions in numeric order
    (Spark compares offsets as JSON text)."""
    return {topic: {str(p): int(positions[p]) for p in sorted(positions)}}


def _positions(topic: str, document: dict | None) -> dict[int, int]:
    """{partition: offset} of an offsets document (the flat {"0": n} of older checkpoints too)."""
    if not document:
        return {}
    inner = document.get(topic) if isinstance(document.get(topic), dict) else document
    if any(isinstance(v, dict) for v in inner.values()):
        raise KafkaError(f"{NAME}: the checkpoint's offsets are of topic(s) {sorted(document)}, "
                         f"not of {topic!r}: a checkpoint belongs to one query")
    return {int(p): int(off) for p, off in inner.items()}


def _watermarks(config: dict, topic: str, partitions: tuple | None, consumer=None) -> dict[int, tuple[int, int]]:
    """{partition: (low, high)} as the broker has them now (through `consumer`, else a new one)."""
    from confluent_kafka import Consumer, TopicPartition

    from bridge.kafka import partitions_of
    from bridge.kafka.client import retrying
    own = consumer is None
    consumer = Consumer(config) if own else consumer
    try:
        known = partitions_of(consumer, topic)
        ids = list(partitions) if partitions is not None else known
        missing = sorted(set(ids) - set(known))
        if missing:
            raise OptionsError(f"option 'partitions': topic {topic!r} has no partition {missing[0]} "
                               f"(it has {known})", value=",".join(map(str, ids)))
        return {p: retrying(lambda p=p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10),
                            f"{NAME}: cannot read the watermarks of topic {topic!r} partition {p}", 30)
                for p in sorted(ids)}
    finally:
        if own:
            consumer.close()


def _resolve(name: str, spec, marks: dict[int, tuple[int, int]], default: int) -> dict[int, int]:
    """Offsets per partition of an offsets spec; a partition the JSON leaves out takes `default`."""
    if spec == "earliest":
        return {p: low for p, (low, _) in marks.items()}
    if spec == "latest":
        return {p: high for p, (_, high) in marks.items()}
    unknown = sorted(set(spec) - set(marks))
    if unknown:
        raise OptionsError(f"option {name!r} names partition {unknown[0]}, which is not read "
                           f"(partitions {sorted(marks)})", value=spec)
    picks = {EARLIEST: 0, LATEST: 1}
    out = {}
    for p, bounds in marks.items():
        offset = spec.get(p, default)
        out[p] = bounds[picks[offset]] if offset in picks else offset
    return out


def _lost(opts: SourceOptions, partition: int, expected: int, available: int, stop: int,
          why: str = "deleted by retention or DeleteRecords") -> int:
    """Offsets [expected, available) are gone from the broker while the read was to start at
    `expected` (and end before `stop`): DataLossError under failOnDataLoss, else the number of
    offsets skipped, logged."""
    if opts.fail_on_data_loss:
        raise DataLossError(f"{NAME}: data loss in topic {opts.topic} partition {partition}: offset {expected} "
                            f"was expected but the earliest available offset is {available} ({why}); "
                            f"{available - expected} offsets are gone. Set "
                            "failOnDataLoss=false to skip them.")
    skipped = min(available, stop) - expected
    log.warning("%s: skipped %d offsets [%d, %d) of topic %s partition %d: gone before they were read, %s "
                "(failOnDataLoss=false)", NAME, skipped, expected, min(available, stop), opts.topic, partition, why)
    return skipped


def _admit(begin: dict[int, int], until: dict[int, int], limit: int) -> dict[int, int]:
    """Spark's rate limit (KafkaMicroBatchStream.rateLimit): `limit` offsets split across the
    partitions in proportion to their lag, a share below one rounded up (no partition starves) and
    others down. Unlike Spark, rounding up never takes the total past `limit`: the excess is taken
    back from the largest shares."""
    lags = {p: until[p] - begin[p] for p in until if until[p] > begin[p]}
    total = sum(lags.values())
    if total <= limit:
        return dict(until)
    share = {}
    for p, lag in lags.items():
        prorate = limit * lag / total
        share[p] = min(lag, math.ceil(prorate) if prorate < 1 else math.floor(prorate))
    for _ in range(sum(share.values()) - limit):
        largest = max(share, key=lambda q: (share[q], q))  # ties: the higher partition gives
        share[largest] -= 1
    return {p: begin[p] + share[p] if p in share else until[p] for p in until}


def _split(ranges: list[tuple[int, int, int]], min_partitions: int | None) -> list[tuple[int, int, int]]:
    """Spark's KafkaOffsetRangeCalculator: with fewer non-empty ranges than `min_partitions`, each
    range is cut into parts in proportion to its size (at least one)."""
    sized = [r for r in ranges if r[2] > r[1]]
    if min_partitions is None or len(sized) >= min_partitions:
        return ranges
    total = sum(end - start for _, start, end in sized)
    out = []
    for partition, start, end in sized:
        parts = max(math.floor((end - start) / total * min_partitions + 0.5), 1)
        remaining = end - start
        for part in range(parts):
            size = remaining // (parts - part)
            remaining -= size
            if size:
                out.append((partition, start, start + size))
            start += size
    return out


# ---- reading (executors) ---------------------------------------------------------------------------

def _read_range(opts: SourceOptions, partition: int, start: int, end: int) -> Iterator[tuple]:
    """Rows of one partition's offsets [start, end), in offset order. Offsets deleted before they
    are read are data loss (failOnDataLoss); offsets without a record (transaction markers,
    compaction) are not."""
    if end <= start:
        return
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka import KafkaError as Codes
    topic = opts.topic
    # "error": an offset below the low watermark is reported, never silently reset to the end
    consumer = Consumer({**opts.config, "enable.partition.eof": True, "auto.offset.reset": "error"})
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        expected = start
        while expected < end:
            msg = consumer.poll(opts.poll_timeout)
            if msg is None:
                raise KafkaError(f"{NAME}: no message from {topic} partition {partition} within "
                                 f"{opts.poll_timeout:g} s (waiting for offset {expected}, reading up to {end - 1})")
            err = msg.error()
            if err is not None:
                if err.code() == Codes._PARTITION_EOF:
                    if msg.offset() >= end:
                        return  # the offsets left hold no record (transaction markers, compaction)
                    _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                    if high < end:  # truncated below the planned end (e.g. an unclean leader election)
                        _lost(opts, partition, max(expected, high), end, end, f"the partition now ends at {high}")
                        return
                    continue  # read_committed stops at an open transaction: wait for it
                if err.code() in (Codes._AUTO_OFFSET_RESET, Codes.OFFSET_OUT_OF_RANGE):
                    low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                    if low <= expected:
                        raise KafkaError(f"{NAME}: {topic} partition {partition}: offset {expected}: {err.str()}")
                    _lost(opts, partition, expected, low, end)
                    if low >= end:
                        return
                    expected = low
                    consumer.assign([TopicPartition(topic, partition, low)])
                    continue
                raise KafkaError(f"{NAME}: {topic} partition {partition}: {err.str()}")
            offset = msg.offset()
            if offset < expected:
                continue
            if offset >= end:
                return
            _, millis = msg.timestamp()
            stamp = datetime.datetime.fromtimestamp(millis / 1000, _UTC) if millis is not None and millis >= 0 else None
            row = (msg.key(), msg.value(), topic, partition, offset, stamp)
            if opts.include_headers:
                headers = msg.headers()
                row += ([(k, v) for k, v in headers] if headers else None,)  # Spark's source: null without headers
            yield row
            expected = offset + 1
    finally:
        consumer.close()


# ---- planning (driver) -----------------------------------------------------------------------------

def batch_ranges(opts: SourceOptions) -> list[tuple[int, int, int]]:
    """(partition, start, end) of a batch read: startingOffsets to endingOffsets, checked against
    the watermarks; one range per partition, or more with minPartitions."""
    marks = _watermarks(opts.config, opts.topic, opts.partitions)
    starts = _resolve("startingOffsets", opts.starting, marks, EARLIEST)
    ends = _resolve("endingOffsets", opts.ending, marks, LATEST)
    ranges = []
    for p, (low, high) in marks.items():
        start, end = starts[p], ends[p]
        if end > high:
            raise OptionsError(f"endingOffsets: partition {p} of {opts.topic} ends at {high}, before {end}",
                               value=opts.ending)
        if start > end:
            raise OptionsError(f"startingOffsets: offset {start} of partition {p} of {opts.topic} is after "
                               f"the ending offset {end}", value=opts.starting)
        if start < low:
            _lost(opts, p, start, low, end)
            start = min(low, end)
        ranges.append((p, start, end))
    split = _split(ranges, opts.min_partitions)
    if len(split) > len(ranges):
        log.warning("%s: minPartitions=%d cuts a Kafka partition's offsets across tasks: convert with "
                    "the transforms' default ordering (kafka_order), never with ordered=True",
                    NAME, opts.min_partitions)
    return split


class StreamPlanner:
    """The driver side of a streaming read: offsets, admission control, AvailableNow, data loss and
    the consumer-group commit. Spark keeps one per query, in one Python process."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.target: dict[int, int] | None = None  # AvailableNow: the high watermarks at its start
        self.skipped = 0
        self._committer = None
        self._committed: dict | None = None  # the last offsets committed to groupId
        self._metadata = None  # one consumer for the watermarks, for the query's life

    def _marks(self) -> dict[int, tuple[int, int]]:
        if self._metadata is None:
            from confluent_kafka import Consumer
            self._metadata = Consumer(self.opts.config)
        return _watermarks(self.opts.config, self.opts.topic, self.opts.partitions, self._metadata)

    def initial(self) -> dict:
        marks = self._marks()
        return offsets_document(self.opts.topic, _resolve("startingOffsets", self.opts.starting, marks, EARLIEST))

    def prepare_available_now(self) -> None:
        marks = self._marks()
        self.target = {p: high for p, (_, high) in marks.items()}

    def latest(self, start: dict | None, max_offsets: int | None) -> dict:
        if start is not None:
            # Spark asks only once the batch ending at `start` is in its commit log, and calls
            # commit(end) only when it plans the batch after: without this, the last batch of a
            # run (AvailableNow) would never reach the group
            self.commit(start)
        marks = self._marks()
        given = _positions(self.opts.topic, start)
        # a partition new to the query starts at its earliest offset, as in Spark's source
        begin = {p: max(given.get(p, low), low) for p, (low, _) in marks.items()}
        until = {p: high for p, (_, high) in marks.items()}
        if self.target is not None:  # AvailableNow: nothing past what was there when it began
            until = {p: min(high, self.target.get(p, begin[p])) for p, high in until.items()}
        until = {p: max(until[p], begin[p]) for p in until}
        if max_offsets is not None:
            until = _admit(begin, until, max_offsets)
        return offsets_document(self.opts.topic, {p: max(until[p], given.get(p, until[p])) for p in until})

    def reported(self) -> dict:
        marks = self._marks()
        return offsets_document(self.opts.topic, {p: high for p, (_, high) in marks.items()})

    def ranges(self, start: dict, end: dict) -> list[tuple[int, int, int]]:
        marks = self._marks()
        first, last = _positions(self.opts.topic, start), _positions(self.opts.topic, end)
        out = []
        for p, stop in sorted(last.items()):
            low = marks[p][0] if p in marks else 0
            begin = first.get(p, low)
            if begin < low:
                self.skipped += _lost(self.opts, p, begin, low, stop)
                log.warning("%s: %d offsets skipped by this query so far", NAME, self.skipped)
                begin = min(low, stop)
            if stop > begin:
                out.append((p, begin, stop))
        return out

    def commit(self, end: dict) -> None:
        """Spark committed the micro-batch ending at `end`: commit it to `groupId` (best effort: a
        failure is logged, as Spark's checkpoint, not the group, is where the query resumes)."""
        if not self.opts.group_id or end == self._committed:
            return
        from confluent_kafka import Consumer, KafkaException, TopicPartition
        positions = sorted(_positions(self.opts.topic, end).items())
        offsets = [TopicPartition(self.opts.topic, p, off) for p, off in positions]
        try:
            if self._committer is None:
                self._committer = Consumer({**self.opts.config, "group.id": self.opts.group_id})
            done = self._committer.commit(offsets=offsets, asynchronous=False)
            failed = [tp for tp in done or [] if tp.error is not None]
            if failed:
                raise KafkaException(failed[0].error)
            self._committed = end
        except KafkaException as exc:
            log.warning("%s: could not commit %s to consumer group %r: %s", NAME, end, self.opts.group_id, exc)

    def stop(self) -> None:
        for client in (self._committer, self._metadata):
            if client is not None:
                client.close()
        self._committer = self._metadata = None


# ---- Spark classes ---------------------------------------------------------------------------------

def _classes():
    """The DataSource classes, defined on first use so that importing this module needs no pyspark."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

    from bridge.spark.jobs import KAFKA_SCHEMA

    class KafkaRange(InputPartition):
        def __init__(self, partition: int, start: int, end: int) -> None:
            super().__init__((partition, start, end))
            self.partition, self.start, self.end = partition, start, end

    class DtsKafkaReader(DataSourceReader):
        def __init__(self, options) -> None:
            self.opts = SourceOptions.parse(options, streaming=False)

        def partitions(self):
            return [KafkaRange(*r) for r in batch_ranges(self.opts)]

        def read(self, partition):
            return _read_range(self.opts, partition.partition, partition.start, partition.end)

    class DtsKafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, options) -> None:
            self.opts = SourceOptions.parse(options, streaming=True)
            self.planner = StreamPlanner(self.opts)

        def initialOffset(self) -> dict:
            return self.planner.initial()

        def getDefaultReadLimit(self):
            return ReadMaxRows(self.opts.max_offsets) if self.opts.max_offsets else ReadAllAvailable()

        def latestOffset(self, start=None, limit=None) -> dict:
            if isinstance(limit, ReadMaxRows):
                return self.planner.latest(start, limit.max_rows)
            if limit is None or isinstance(limit, ReadAllAvailable):
                return self.planner.latest(start, None)
            raise KafkaError(f"{NAME}: read limit {limit!r} is not supported (maxOffsetsPerTrigger is)")

        def prepareForTriggerAvailableNow(self) -> None:
            self.planner.prepare_available_now()

        def reportLatestOffset(self):
            return self.planner.reported()

        def partitions(self, start: dict, end: dict):
            return [KafkaRange(*r) for r in self.planner.ranges(start, end)]

        def read(self, partition):
            return _read_range(self.opts, partition.partition, partition.start, partition.end)

        def commit(self, end: dict) -> None:
            self.planner.commit(end)

        def stop(self) -> None:
            self.planner.stop()

    class DtsKafkaDataSource(DataSource):
        """`spark.read.format("dts-kafka")`: see the module docstring and `OPTIONS`."""

        @classmethod
        def name(cls) -> str:
            return NAME

        def schema(self):
            headers = _flag("includeHeaders", dict((k.lower(), v) for k, v in self.options.items())
                            .get("includeheaders", "false"))
            return KAFKA_SCHEMA + (", " + HEADERS_COLUMN if headers else "")

        def reader(self, schema):
            return DtsKafkaReader(self.options)

        def streamReader(self, schema):
            return DtsKafkaStreamReader(self.options)

    return DtsKafkaDataSource, KafkaRange, DtsKafkaReader, DtsKafkaStreamReader


def __getattr__(name: str):
    if name == "DtsKafkaDataSource":
        return _classes()[0]
    raise AttributeError(name)


def register(spark) -> None:
    """Make `spark.read.format("dts-kafka")` (and `readStream`) available in this session."""
    spark.dataSource.register(_classes()[0])
