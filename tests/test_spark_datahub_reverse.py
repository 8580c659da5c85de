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


def _start(tmp_path, run: int, cfg: dict, trigger: str):
    config = tmp_path / f"driver-{run}.json"
    config.write_text(json.dumps(dict(cfg, trigger=trigger)))
    log = tmp_path / f"driver-{run}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "pipeline_jobs" / "reverse_driver.py"),
                                 str(config)], cwd=ROOT, env=ENV, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, log


def _killpg(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _output_records(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "count"})
    try:
        for _ in range(50):
            try:
                parts = c.list_topics(topic, timeout=10).topics[topic].partitions
                return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts)
            except KafkaException:  # a topic just created: no leader yet
                time.sleep(0.2)
        raise AssertionError(f"no watermarks of {topic}")
    finally:
        c.close()


def kill_run(server, client, kafka_broker, tmp_path, *, kills: int, seed: int):
    """DataHub (3 shards) -> blob_to_dts -> dts-kafka, the driver SIGKILLed `kills` times inside
    micro-batches (after the first kill shard 0 is split and more lines go to the children), then
    run to the end (availableNow): a read_committed consumer sees every Entry once, in order per
    table."""
    import random
    rng = random.Random(seed)
    topic = f"rev_kill_{uuid.uuid4().hex[:6]}"
    server.create_topic(P, topic, shard_count=3)
    entries = sample_lines()
    half = len(entries) // 2
    lines = write_round_robin(client, topic, entries[:half], ["0", "1", "2"])
    out = kafka_broker.create_topic(f"rev-kill-{uuid.uuid4().hex[:6]}", partitions=3)
    cfg = dict(endpoint=server.endpoint, project=P, datahub_topic=topic, bootstrap=kafka_broker.bootstrap, topic=out,
               checkpoint=str(tmp_path / "checkpoint"), maxRecordsPerTrigger=25, settle=0.3,
               markers=f"markers-{out}")
    log = []
    for run in range(1, kills + 1):
        before = _output_records(kafka_broker.bootstrap, out)
        proc, path = _start(tmp_path, run, cfg, "200 milliseconds")
        started = time.monotonic()
        while proc.poll() is None and _output_records(kafka_broker.bootstrap, out) <= before \
                and time.monotonic() - started < 120:
            time.sleep(0.1)
        time.sleep(rng.uniform(0.0, 1.5))
        alive = proc.poll() is None
        _killpg(proc)
        text = path.read_text(errors="replace")
        assert alive, f"run {run} ended by itself:\n{text[-4000:]}"
        assert "Traceback" not in text, text[-4000:]
        log.append(f"run {run}: killed after {time.monotonic() - started:.1f} s, "
                   f"{_output_records(kafka_broker.bootstrap, out)} Kafka records")
        if run == 1:  # a split mid-stream: shard 0 closes, later lines go to its children too
            children = server.split(P, topic, "0")
            active = [x["shard_id"] for x in server.shards(P, topic) if x["state"] == "ACTIVE"]
            log.append(f"split: children {children}, active {active}")
            lines += write_round_robin(client, topic, entries[half:], active, first=half)
    proc, path = _start(tmp_path, kills + 1, cfg, "availableNow")
    try:
        code = proc.wait(240)
    except subprocess.TimeoutExpired:
        _killpg(proc)
        raise AssertionError("the final run did not end:\n" + path.read_text(errors="replace")[-4000:]) from None
    text = path.read_text(errors="replace")
    assert code == 0 and "finished" in text, text[-4000:]
    got = read_back(kafka_broker.bootstrap, out)
    have = [e.SerializeToString() for p in sorted(got) for e, _, _ in got[p]]
    want = convert(lines)
    assert len(have) == len(want), "\n".join(log)
    assert by_table(have) == by_table(want), "\n".join(log)  # each once, in order per table (never sorted)
    return log


def test_stream_killed_restarted_split_exactly_once(server, client, kafka_broker, tmp_path):
    kill_run(server, client, kafka_broker, tmp_path, kills=1, seed=int(ENV.get("SPARK_REVERSE_SEED", "33")))


@pytest.mark.deep
def test_stream_killed_many_times(server, client, kafka_broker, tmp_path):
    kill_run(server, client, kafka_broker, tmp_path, kills=4, seed=7)
