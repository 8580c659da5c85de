"""Spark both ways, the reverse direction (issue 33, points 1-3): `format("datahub")` as a source
(bridge/spark/datahub_source.py), `blob_to_dts` on its rows with the shards merged in Spark state
(bridge/spark/reverse.py), and the exactly-once `format("dts-kafka")` writer
(bridge/spark/kafka_sink.py), on local[2], the stand-in DataHub and the real Kafka broker.

Blob lines come from the forward converter for the samples, spread over three shards so that the
rows of one Entry and an UPDATE's halves sit on different shards. What Spark rebuilds is compared,
in order per table, with the one-process reading (DataHubSource + DataHubAssembler) of the same
topic and with `blob_lines_to_entries` of the lines (what `convert` does with one file). Never
sorted before comparing order.

The kill tests (`kill_run`, tests/support/reverse_stream.py: the driver
tests/pipeline_jobs/reverse_driver.py SIGKILLed and restarted from its checkpoint, a shard split in
between, what a read_committed consumer sees compared per Kafka partition with `convert`) run here
on local[2] (1 kill in `make test`, 4 in `make test-deep`) and on the Spark standalone cluster in
tests/test_spark_cluster.py. Seed: SPARK_REVERSE_SEED=N (default 33).
"""
from __future__ import annotations

import json
import uuid

import pytest

pytest.importorskip("datahub")
pytest.importorskip("pyspark")
pytest.importorskip("confluent_kafka")

from bridge.datahub.calls import make_client  # noqa: E402
from bridge.datahub.source import DataHubSource  # noqa: E402
from bridge.options import Options  # noqa: E402
from bridge.spark.kafka_sink import entries_of  # noqa: E402
from bridge.stream import ErrorPolicy  # noqa: E402
from bridge.stream.shards import DataHubAssembler  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.dts_kafka import read_back  # noqa: E402
from support.pipeline import ENV  # noqa: E402
from support.reverse_stream import P, by_table, convert, kill_run, sample_lines, table_of, write_round_robin  # noqa: E402


@pytest.fixture(scope="module")
def server():
    with StandInDataHub() as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return make_client(server.endpoint, "id", "key")


def one_process(client, topic) -> list[bytes]:
    source = DataHubSource(client, P, topic, from_beginning=True, interval=0.01)
    assembler = DataHubAssembler(Options(), settle=0.0)
    policy = ErrorPolicy("fail")
    out = []
    source.open({})
    idle = 0
    while idle < 3:
        got = source.poll(1000, 0.05)
        idle = idle + 1 if not got and source.caught_up() else 0
        out.extend(e.SerializeToString() for _, e in assembler.entries(got, policy))
    out.extend(e.SerializeToString() for _, e in assembler.finish(policy))
    return out


def spark_entries(rows) -> list[bytes]:
    return [e.SerializeToString() for e in entries_of(r["value"] for r in rows)]


def reader(spark, server, topic, stream=False, **options):
    r = (spark.readStream if stream else spark.read).format("datahub")
    for k, v in {"endpoint": server.endpoint, "project": P, "topic": topic, "accessId": "id", "accessKey": "key",
                 **options}.items():
        r = r.option(k, v)
    return r.load()


@pytest.fixture(scope="module")
def blob_topic(server, client):
    topic = "rev_blob"
    server.create_topic(P, topic, shard_count=3)
    lines = write_round_robin(client, topic, sample_lines(), ["0", "1", "2"])
    return topic, lines


def test_batch_read_equals_one_process(spark, server, client, blob_topic):
    import bridge.spark as bs
    topic, lines = blob_topic
    df = reader(spark, server, topic)
    assert [f.name for f in df.schema.fields] == ["topic", "shard", "sequence", "system_time", "attributes",
                                                  "data", "mark"]
    records = df.filter("mark IS NULL").collect()
    assert len(records) == len(lines)
    assert {r["shard"] for r in records} == {"0", "1", "2"}
    got = spark_entries(bs.blob_to_dts(df).collect())
    want = one_process(client, topic)
    assert want == convert(lines)
    assert by_table(got) == by_table(want)
    assert len(got) == len(want)


def test_batch_read_without_marks_and_from_offsets(spark, server, client, blob_topic):
    """marks=false: a batch read is merged by its records alone; JSON offsets start a shard later."""
    import bridge.spark as bs
    topic, lines = blob_topic
    got = spark_entries(bs.blob_to_dts(reader(spark, server, topic, marks="false")).collect())
    assert by_table(got) == by_table(convert(lines))
    later = reader(spark, server, topic, startingPosition=json.dumps({topic: {"0": 5}}))
    assert later.filter("mark IS NULL and shard = '0'").count() == len(server.records(P, topic, "0")) - 5


def test_batch_read_options_refused(spark, server, blob_topic):
    from pyspark.errors import PySparkException
    topic, _ = blob_topic
    with pytest.raises((PySparkException, Exception), match="maxRecordsPerTrigger"):
        reader(spark, server, topic, maxRecordsPerTrigger=5).collect()
    with pytest.raises((PySparkException, Exception), match="startingPosition"):
        reader(spark, server, topic, startingPosition="yesterday").collect()


def test_stream_available_now_max_records_into_memory(spark, server, client, blob_topic, tmp_path):
    """maxRecordsPerTrigger cuts the topic into micro-batches inside Entries (rows of one Entry in
    several micro-batches and shards): the stream gives the one-process Entries, each once."""
    import bridge.spark as bs
    topic, lines = blob_topic
    df = reader(spark, server, topic, stream=True, maxRecordsPerTrigger=37, settle=0.2)
    out = bs.blob_to_dts(df)
    name = f"rev_{uuid.uuid4().hex[:6]}"
    q = (out.writeStream.format("memory").queryName(name).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    batches = [p for p in q.recentProgress if p["numInputRows"]]
    assert len(batches) >= 5, [p["numInputRows"] for p in q.recentProgress]
    assert all(p["numInputRows"] <= 37 + 3 * 2 for p in batches)  # records + a shard's marks
    got = spark_entries(spark.sql(f"select * from {name}").collect())
    want = convert(lines)
    assert by_table(got) == by_table(want)


# ---- the dts-kafka writer ---------------------------------------------------------------------------

def test_batch_write_dts_kafka_and_rerun_with_query_id(spark, server, client, blob_topic, kafka_broker):
    """write.format("dts-kafka"): every Entry once, in order per table, partitioned by table; a
    rerun with the same queryId writes nothing (the markers)."""
    import bridge.spark as bs
    topic, lines = blob_topic
    out = kafka_broker.create_topic(f"rev-batch-{uuid.uuid4().hex[:6]}", partitions=3)
    dts = bs.blob_to_dts(reader(spark, server, topic))
    for _ in range(2):
        (dts.write.format("dts-kafka").mode("append").option("kafka.bootstrap.servers", kafka_broker.bootstrap)
         .option("topic", out).option("queryId", f"job-{out}").save())
    got = read_back(kafka_broker.bootstrap, out)
    tables = {}
    for partition, items in got.items():
        for entry, _, _ in items:
            raw = entry.SerializeToString()
            tables.setdefault(table_of(raw), set()).add(partition)
    assert all(len(ps) == 1 for t, ps in tables.items())  # a table in one partition
    have = [e.SerializeToString() for p in sorted(got) for e, _, _ in got[p]]
    assert by_table(have) == by_table(convert(lines))


# the standalone cluster's runs are in tests/test_spark_cluster.py (one cluster for the suite)
def test_stream_killed_restarted_split_exactly_once(server, client, kafka_broker, tmp_path):
    """One kill, local[2] (make test)."""
    kill_run(server, client, kafka_broker, tmp_path, kills=1, seed=int(ENV.get("SPARK_REVERSE_SEED", "33")))


@pytest.mark.deep
def test_stream_killed_many_times(server, client, kafka_broker, tmp_path):
    """Four kills (make test-deep), in micro-batches of 24 records (about 10: each run has some)."""
    kill_run(server, client, kafka_broker, tmp_path, kills=4, seed=7, max_records=24)
