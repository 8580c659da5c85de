"""Spark both ways, the reverse direction (issue 33, points 1-3): `format("datahub")` as a source
(bridge/spark/datahub_source.py), `blob_to_dts` on its rows with the shards merged in Spark state
(bridge/spark/reverse.py), and the exactly-once `format("dts-kafka")` writer
(bridge/spark/kafka_sink.py), on local[2], the stand-in DataHub and the real Kafka broker.

Blob lines come from the forward converter for the samples, spread over three shards so that the
rows of one Entry and an UPDATE's halves sit on different shards. What Spark rebuilds is compared,
in order per table, with the one-process reading (DataHubSource + DataHubAssembler) of the same
topic and with `blob_lines_to_entries` of the lines (what `convert` does with one file). Never
sorted before comparing order.
"""
from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

pytest.importorskip("datahub")
pytest.importorskip("pyspark")
pytest.importorskip("confluent_kafka")

from datahub.models import BlobRecord  # noqa: E402

from bridge.blob.encode import BlobEncoder  # noqa: E402
from bridge.datahub.calls import make_client  # noqa: E402
from bridge.datahub.source import DataHubSource  # noqa: E402
from bridge.options import Options  # noqa: E402
from bridge.samples import build_sample_entries  # noqa: E402
from bridge.spark.kafka_sink import entries_of  # noqa: E402
from bridge.stream import ErrorPolicy, blob_lines_to_entries  # noqa: E402
from bridge.stream.shards import DataHubAssembler  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.dts_kafka import read_back  # noqa: E402
from support.pipeline import ENV, ROOT  # noqa: E402

P = "proj"
SAMPLES = ("mixed", "realistic")


@pytest.fixture(scope="module")
def server():
    with StandInDataHub() as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return make_client(server.endpoint, "id", "key")


def sample_lines():
    encoder = BlobEncoder(Options())
    out = []
    for name in SAMPLES:
        out.extend(encoder.convert_lines(e) for e in build_sample_entries()[name])
    return out


def write_round_robin(client, topic, entries, shards, first=0, attrs=True, start_turn=0):
    """Each line to the next shard in turn. Returns the lines in source order."""
    turn, lines, per = start_turn, [], collections.defaultdict(list)
    for index, entry_lines in enumerate(entries, first):
        for row, line in enumerate(entry_lines):
            r = BlobRecord(blob_data=line)
            if attrs:
                r.put_attribute("dts.topic", "k")
                r.put_attribute("dts.pos", f"0:{index}:0:{row}")
            per[shards[turn % len(shards)]].append(r)
            lines.append(line)
            turn += 1
    for shard, records in per.items():
        for i in range(0, len(records), 50):
            client.put_records_by_shard(P, topic, shard, records[i:i + 50])
    return lines


def convert(lines) -> list[bytes]:
    return [e.SerializeToString() for _, e in blob_lines_to_entries(lines, ErrorPolicy("fail"), Options())]


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


def table_of(raw: bytes) -> str:
    from bridge.wire import subscribe_pb2 as pb
    h = pb.Entry.FromString(raw).header
    return f"{h.schemaName}.{h.tableName}" if h.tableName else ""


def by_table(raws) -> dict:
    out: dict = {}
    for raw in raws:
        out.setdefault(table_of(raw), []).append(raw)
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
