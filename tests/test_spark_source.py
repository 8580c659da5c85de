"""The "dts-kafka" Spark source's options (bridge/spark/source.py, docs/kafka.md "dts-kafka options")
against a real Apache Kafka broker (tests/support/kafka_broker.py): maxOffsetsPerTrigger with
Trigger.AvailableNow, startingOffsets / endingOffsets, failOnDataLoss both ways, minPartitions,
includeHeaders, and groupId commits read back with confluent-kafka.

One local[2] session serves every test (getOrCreate, as tests/test_spark.py); records are compared
as produced, in offset order per partition, never sorted.
"""
import logging
import pathlib
import uuid

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

import bridge  # noqa: E402
from bridge import pb  # noqa: E402
from bridge.errors import OptionsError  # noqa: E402
from bridge.spark.source import DataLossError, SourceOptions, _admit, _read_range, _split  # noqa: E402
from bridge.wire.framing import tdsql_headers  # noqa: E402

SAMPLES_DIR = pathlib.Path(__file__).resolve().parent.parent / "samples"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _produce(broker, topic: str, records) -> None:
    """records: (partition, value, headers); one request per record, so offsets follow the list."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    for partition, value, headers in records:
        producer.produce(topic, value=value, key=b"k", partition=partition, headers=headers)
    assert producer.flush(20) == 0


def _delete_before(broker, topic: str, partition: int, offset: int) -> None:
    """What retention does: the partition's records below `offset` are gone (low watermark = offset)."""
    admin = broker.admin()  # kept: a collected AdminClient never completes its futures
    for future in admin.delete_records([TopicPartition(topic, partition, offset)], operation_timeout=20).values():
        assert future.result(30).low_watermark == offset


def _reader(spark, broker, topic, **options):
    reader = spark.read.format("dts-kafka").option("brokers", broker.bootstrap).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _stream(spark, broker, topic, **options):
    reader = spark.readStream.format("dts-kafka").option("brokers", broker.bootstrap).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _run_available_now(stream_df, checkpoint, on_batch=None, timeout=90):
    """Run `stream_df` with trigger(availableNow=True) into foreachBatch; [(batch id, [(partition,
    offset), ...] as the batch's DataFrame gives them)]."""
    batches = []

    def record(df, batch_id):
        batches.append((batch_id, [(r.partition, r.offset) for r in df.select("partition", "offset").collect()]))
        if on_batch is not None:
            on_batch(batch_id)
    query = (stream_df.writeStream.foreachBatch(record).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(timeout), "the AvailableNow query did not stop"
    finally:
        query.stop()
    return batches


# ---- no broker, no Spark ------------------------------------------------------------------------

@pytest.mark.parametrize("streaming, options, message", [
    (True, {"endingOffsets": "latest"}, "'endingOffsets' applies to batch reads only"),
    (True, {"minPartitions": "4"}, "'minPartitions' applies to batch reads only"),
    (False, {"maxOffsetsPerTrigger": "5"}, "'maxOffsetsPerTrigger' applies to stream reads only"),
    (False, {"groupId": "g"}, "'groupId' applies to stream reads only"),
    (False, {"startingOffsets": "latest"}, "startingOffsets cannot be latest"),
    (False, {"startingOffsets": '{"t": {"0": -1}}'}, "startingOffsets cannot be latest"),
    (False, {"endingOffsets": '{"t": {"0": -2}}'}, "endingOffsets cannot be earliest"),
    (False, {"startingOffsets": '{"other": {"0": 1}}'}, "names topic 'other'"),
    (False, {"startingOffsets": '{"t": {"0": -3}}'}, "integer >= -2"),
    (False, {"startingOffsets": "first"}, "earliest, latest or JSON"),
    (True, {"maxOffsetsPerTrigger": "0"}, "'maxOffsetsPerTrigger' is at least 1"),
    (True, {"failOnDataLoss": "maybe"}, "'failOnDataLoss' is true or false"),
    (True, {"maxOffsetPerTrigger": "5"}, "no option 'maxOffsetPerTrigger'"),
])
def test_options_are_checked_up_front(streaming, options, message):
    with pytest.raises(OptionsError, match=message):
        SourceOptions.parse({"brokers": "h:1", "topic": "t", **options}, streaming=streaming)


def test_options_take_any_case_and_spark_json():
    opts = SourceOptions.parse({"brokers": "h:1", "topic": "t", "startingoffsets": '{"t": {"0": 23, "1": -2}}',
                                "MAXOFFSETSPERTRIGGER": "9", "failondataloss": "False", "kafka.client.id": "x"},
                               streaming=True)
    assert (opts.starting, opts.max_offsets, opts.fail_on_data_loss) == ({0: 23, 1: -2}, 9, False)
    assert opts.config["client.id"] == "x" and opts.config["bootstrap.servers"] == "h:1"
    legacy = SourceOptions.parse({"brokers": "h:1", "topic": "t", "startingOffsets": '{"0": 42}'}, streaming=False)
    assert legacy.starting == {0: 42}


def test_admission_splits_by_lag_and_never_passes_the_limit():
    # Spark's proportional split: 7 * 30/39 -> 5, 7 * 9/39 -> 1 (floor above one)
    assert _admit({0: 0, 1: 0}, {0: 30, 1: 9}, 7) == {0: 5, 1: 1}
    # a share below one rounds up (Spark: no partition starves) ...
    assert _admit({0: 0, 1: 0}, {0: 100, 1: 1}, 7) == {0: 6, 1: 1}
    # ... but never past the limit, where Spark's source would read 4 offsets here
    assert _admit({p: 0 for p in range(4)}, {p: 1 for p in range(4)}, 3) == {0: 1, 1: 1, 2: 1, 3: 0}
    assert _admit({0: 5, 1: 9}, {0: 8, 1: 9}, 7) == {0: 8, 1: 9}  # everything fits
    # Spark's minPartitions split: parts in proportion to size, the last part takes the rest
    assert _split([(0, 0, 10), (1, 0, 0)], 3) == [(0, 0, 3), (0, 3, 6), (0, 6, 10)]
    assert _split([(0, 0, 10), (1, 5, 6)], 2) == [(0, 0, 10), (1, 5, 6)]


# ---- a real broker -------------------------------------------------------------------------------

def test_the_reader_reports_or_skips_offsets_deleted_under_it(kafka_broker, caplog):
    """The executor side: a range planned before retention deleted its start."""
    topic = kafka_broker.create_topic(_name("loss-read"))
    _produce(kafka_broker, topic, [(0, b"v%d" % i, None) for i in range(12)])
    _delete_before(kafka_broker, topic, 0, 5)
    strict = SourceOptions.parse({"brokers": kafka_broker.bootstrap, "topic": topic, "pollTimeout": "20"},
                                 streaming=False)
    with pytest.raises(DataLossError, match=f"topic {topic} partition 0: offset 2 was expected but the "
                                            "earliest available offset is 5"):
        list(_read_range(strict, 0, 2, 10))
    lenient = SourceOptions.parse({"brokers": kafka_broker.bootstrap, "topic": topic, "pollTimeout": "20",
                                   "failOnDataLoss": "false"}, streaming=False)
    with caplog.at_level(logging.WARNING, logger="bridge.spark.source"):
        rows = list(_read_range(lenient, 0, 2, 10))
    assert [(r[4], r[1]) for r in rows] == [(i, b"v%d" % i) for i in range(5, 10)]
    assert "skipped 3 offsets [2, 5)" in caplog.text
    assert list(_read_range(lenient, 0, 1, 4)) == []  # the whole range is gone


@pytest.mark.spark
def test_max_offsets_per_trigger_available_now_and_group_commits(spark, kafka_broker, tmp_path):
    topic = kafka_broker.create_topic(_name("admit"), partitions=2)
    _produce(kafka_broker, topic,
             [(0, b"a%d" % i, None) for i in range(20)] + [(1, b"b%d" % i, None) for i in range(6)])
    group = _name("g-admit")
    late = []

    def produce_late(batch_id):  # records arriving while the query runs: AvailableNow must not read them
        if batch_id == 0:
            _produce(kafka_broker, topic, [(0, b"late", None), (1, b"late", None)])
            late.append(batch_id)
    stream = _stream(spark, kafka_broker, topic, maxOffsetsPerTrigger="7", groupId=group)
    batches = _run_available_now(stream, tmp_path / "checkpoint", produce_late)
    assert late == [0]

    assert [b for b, _ in batches] == list(range(len(batches)))
    assert all(0 < len(offsets) <= 7 for _, offsets in batches), [len(o) for _, o in batches]
    # the first micro-batch splits 7 offsets by lag as Spark's source does: 20:6 -> 5 + 1
    assert batches[0][1] == [(0, o) for o in range(5)] + [(1, 0)]
    # every offset seen at the start, once, in offset order per partition; the late ones not
    for partition, count in ((0, 20), (1, 6)):
        seen = [o for _, offsets in batches for p, o in offsets if p == partition]
        assert seen == list(range(count))
    # the same batches as the admission rule applied step by step
    position, expected = {0: 0, 1: 0}, []
    while position != {0: 20, 1: 6}:
        end = _admit(position, {0: 20, 1: 6}, 7)
        expected.append(sum(end[p] - position[p] for p in end))
        position = end
    assert [len(offsets) for _, offsets in batches] == expected

    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
    try:
        committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    finally:
        consumer.close()
    assert [(tp.partition, tp.offset) for tp in committed] == [(0, 20), (1, 6)]


@pytest.mark.spark
def test_starting_and_ending_offsets_and_an_end_inside_an_entries(spark, kafka_broker):
    raws = [raw for _, _, raw in bridge.read_pb(SAMPLES_DIR / "large.pb")]
    cut = next(n for n, raw in enumerate(raws) if pb.Envelope.FromString(raw).total > 2) + 1  # inside an Entries
    assert pb.Envelope.FromString(raws[cut]).index == 1
    topic = kafka_broker.create_topic(_name("range"), partitions=2)
    _produce(kafka_broker, topic, [(0, raw, None) for raw in raws] + [(1, b"p1-%d" % i, None) for i in range(6)])

    df = _reader(spark, kafka_broker, topic, startingOffsets=f'{{"{topic}": {{"1": 2, "0": -2}}}}',
                 endingOffsets=f'{{"{topic}": {{"0": {cut + 1}, "1": -1}}}}')
    assert df.rdd.getNumPartitions() == 2
    rows = [(r.partition, r.offset, r.value, r.topic) for r in df.collect()]
    assert rows == ([(0, n, raws[n], topic) for n in range(cut + 1)]
                    + [(1, n, b"p1-%d" % n, topic) for n in range(2, 6)])
    # the source ends inside the Entries without complaint: it delivers Kafka records, the
    # transforms account for the unfinished tail
    assert pb.Envelope.FromString(rows[cut][2]).index < pb.Envelope.FromString(rows[cut][2]).total - 1
    import bridge.spark as bs
    bs.dts_to_blob(df, mode="PERMISSIVE").collect()

    earliest = _reader(spark, kafka_broker, topic, minPartitions="5")  # Spark's split: 21 + 6 offsets -> 4 + 1
    assert earliest.rdd.getNumPartitions() == 5
    rows = [(r.partition, r.offset) for r in earliest.collect()]
    assert rows == [(0, n) for n in range(len(raws))] + [(1, n) for n in range(6)]

    with pytest.raises(Exception, match="ends at 6, before 9"):
        _reader(spark, kafka_broker, topic, endingOffsets=f'{{"{topic}": {{"1": 9}}}}').collect()


@pytest.mark.spark
def test_fail_on_data_loss_batch_and_stream(spark, kafka_broker, tmp_path):
    topic = kafka_broker.create_topic(_name("loss"))
    _produce(kafka_broker, topic, [(0, b"v%d" % i, None) for i in range(10)])
    checkpoint = tmp_path / "checkpoint"
    first = _run_available_now(_stream(spark, kafka_broker, topic), checkpoint)
    assert [o for _, offsets in first for _, o in offsets] == list(range(10))

    _produce(kafka_broker, topic, [(0, b"v%d" % i, None) for i in range(10, 20)])
    _delete_before(kafka_broker, topic, 0, 15)  # offsets 10..14 go before the query reads them

    with pytest.raises(Exception, match=f"data loss in topic {topic} partition 0: offset 10 was expected but "
                                        "the earliest available offset is 15"):
        _run_available_now(_stream(spark, kafka_broker, topic), checkpoint)
    resumed = _run_available_now(_stream(spark, kafka_broker, topic, failOnDataLoss="false"), checkpoint)
    assert [o for _, offsets in resumed for _, o in offsets] == list(range(15, 20))

    starting = f'{{"{topic}": {{"0": 3}}}}'
    with pytest.raises(Exception, match="offset 3 was expected but the earliest available offset is 15"):
        _reader(spark, kafka_broker, topic, startingOffsets=starting).collect()
    rows = _reader(spark, kafka_broker, topic, startingOffsets=starting, failOnDataLoss="false").collect()
    assert [(r.offset, r.value) for r in rows] == [(i, b"v%d" % i) for i in range(15, 20)]


@pytest.mark.spark
def test_include_headers(spark, kafka_broker):
    topic = kafka_broker.create_topic(_name("headers"))
    sent = [[("ShardId", b"3"), ("ps", b"1")], None, [("ShardId", b"4"), ("ps", b"7"), ("dup", b"a"), ("dup", b"b")],
            [("empty", b"")]]
    _produce(kafka_broker, topic, [(0, b"v%d" % i, h) for i, h in enumerate(sent)])
    df = _reader(spark, kafka_broker, topic, includeHeaders="true")
    assert df.schema.simpleString() == ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
                                        "timestamp:timestamp,headers:array<struct<key:string,value:binary>>>")
    rows = df.collect()
    got = [None if r.headers is None else [(h.key, bytes(h.value)) for h in r.headers] for r in rows]
    assert got == sent
    assert [tdsql_headers(r.headers) for r in rows] == [("3", "1"), (None, None), ("4", "7"), (None, None)]
    assert "headers" not in _reader(spark, kafka_broker, topic).columns
    streamed = []
    query = (_stream(spark, kafka_broker, topic, includeHeaders="true").writeStream
             .foreachBatch(lambda d, _: streamed.extend(d.collect())).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(60)
    finally:
        query.stop()
    assert [None if r.headers is None else [(h.key, bytes(h.value)) for h in r.headers] for r in streamed] == sent
