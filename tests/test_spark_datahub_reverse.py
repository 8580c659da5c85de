"""Spark both ways, the reverse direction (issue 33, points 1-3): `format("datahub")` as a source
(bridge/spark/datahub_source.py), `blob_to_dts` on its rows with the shards merged in Spark state
(bridge/spark/reverse.py), and the exactly-once `format("dts-kafka")` writer
(bridge/spark/kafka_sink.py), on local[2], the stand-in DataHub and the real Kafka broker.

Blob lines come from the forward converter for the samples, spread over three shards so that the
rows of one Entry and an UPDATE's halves sit on different shards. What Spark rebuilds is compared,
in order per table, with the one-process reading (DataHubSource + DataHubAssembler) of the same
topic and with `blob_lines_to_entries` of the lines (what `convert` does with one file). Never
sorted before comparing order.

The kill tests (`kill_run`: the driver tests/pipeline_jobs/reverse_driver.py SIGKILLed and restarted
from its checkpoint, a shard split in between, what a read_committed consumer sees compared per
Kafka partition with `convert`) run on local[2] and on the Spark standalone cluster
(`spark_cluster`, tests/support/spark_cluster.py: two one-core workers, the executors' task logs
showing both ran tasks): 1 kill on local[2] in `make test`; 1 and 4 kills on each in `make test-deep`. Seed:
SPARK_REVERSE_SEED=N (default 33).
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
from bridge.wire import subscribe_pb2 as pb  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.dts_kafka import expected_partition, read_back  # noqa: E402
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


def sample_lines(samples=SAMPLES):
    encoder = BlobEncoder(Options())
    out = []
    for name in samples:
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


def _cuts_inside_entries(server, topic: str, checkpoint) -> list[int]:
    """The micro-batches whose end falls inside an Entry (some of its rows read, some not): from the
    checkpoint's offset log ({topic: {shard: next sequence}} on each entry's last line) and where
    each Entry's rows sit (the `dts.pos` attribute `0:<entry>:0:<row>` of every record)."""
    rows: dict = collections.defaultdict(list)
    for r in server.records(P, topic):
        rows[int(r["attributes"]["dts.pos"].split(":")[1])].append((r["shard"], r["sequence"]))
    return [n for n, end in enumerate(_offset_log(checkpoint, topic))
            if any(len({seq < end.get(shard, 0) for shard, seq in where}) == 2 for where in rows.values())]


def _offset_log(checkpoint, topic: str) -> list[dict]:
    folder = checkpoint / "offsets"
    if not folder.exists():
        return []
    return [json.loads(path.read_text().strip().splitlines()[-1])[topic]
            for path in sorted((x for x in folder.iterdir() if x.name.isdigit()), key=lambda x: int(x.name))]


def _committed(checkpoint) -> int:
    folder = checkpoint / "commits"
    return sum(1 for x in folder.iterdir() if x.name.isdigit()) if folder.exists() else 0


def _cluster_conf(cluster) -> dict:
    """The driver's settings for the standalone cluster; the executors read DataHub (the source's
    tasks), so they get the credentials and the import path in their environment."""
    return dict(cluster.conf(), **{f"spark.executorEnv.{k}": ENV[k]
                                   for k in ("DATAHUB_ACCESS_ID", "DATAHUB_ACCESS_KEY", "PYTHONPATH")})


def kill_run(server, client, kafka_broker, tmp_path, *, kills: int, seed: int, cluster=None, samples=SAMPLES,
             max_records: int = 56):
    """DataHub (3 shards) -> blob_to_dts -> dts-kafka, the driver SIGKILLed `kills` times inside
    micro-batches (after the first kill shard 0 is split and more lines go to the children), then
    run to the end (availableNow): a read_committed consumer sees every Entry once, in order per
    Kafka partition (so per table), equal to `convert` of the same lines; a micro-batch planned by a
    killed run ends inside an Entry, so a restart takes an open tail from the state (`max_records`
    56 or 24 cut the first micro-batch inside an Entry: the first half's 85 lines, round robin over
    3 shards, are planned 19/18/18 or 8/7/7; 60 or 25 would end it between Entries). `cluster`: the
    driver's tasks run on the Spark standalone cluster (`spark_cluster`), and both workers'
    executors ran tasks. 56 gives 5 micro-batches (24: about 10); the time goes mostly to the
    drivers' starts and each application's first micro-batch, not to the records."""
    import random
    rng = random.Random(seed)
    began = time.monotonic()
    topic = f"rev_kill_{uuid.uuid4().hex[:6]}"
    server.create_topic(P, topic, shard_count=3)
    entries = sample_lines(samples)
    half = len(entries) // 2
    lines = write_round_robin(client, topic, entries[:half], ["0", "1", "2"])
    out = kafka_broker.create_topic(f"rev-kill-{uuid.uuid4().hex[:6]}", partitions=3)
    checkpoint = tmp_path / "checkpoint"
    cfg = dict(endpoint=server.endpoint, project=P, datahub_topic=topic, bootstrap=kafka_broker.bootstrap, topic=out,
               checkpoint=str(checkpoint), maxRecordsPerTrigger=max_records, settle=0.3, markers=f"markers-{out}")
    if cluster is not None:
        cfg["conf"] = _cluster_conf(cluster)
        before = {n: set(apps) for n, apps in cluster.task_logs().items()}
    log = [f"{'standalone cluster ' + cluster.master if cluster else 'local[2]'}, seed {seed}, samples {samples}, "
           f"maxRecordsPerTrigger {max_records}; driver logs in {tmp_path}"]
    for run in range(1, kills + 1):
        before_run = _output_records(kafka_broker.bootstrap, out)
        proc, path = _start(tmp_path, run, cfg, "200 milliseconds")
        started = time.monotonic()
        while proc.poll() is None and _output_records(kafka_broker.bootstrap, out) <= before_run \
                and time.monotonic() - started < 120:
            time.sleep(0.1)
        time.sleep(rng.uniform(0.0, 1.5))
        alive = proc.poll() is None
        _killpg(proc)
        text = path.read_text(errors="replace")
        assert alive, f"run {run} ended by itself:\n{text[-4000:]}"
        assert "Traceback" not in text, text[-4000:]
        at = _output_records(kafka_broker.bootstrap, out)
        log.append(f"run {run}: SIGKILL after {time.monotonic() - started:.1f} s, {at} Kafka records "
                   f"({at - before_run} in the run), micro-batches planned {len(_offset_log(checkpoint, topic))}, "
                   f"committed {_committed(checkpoint)}")
        if run == 1:  # a split mid-stream: shard 0 closes, later lines go to its children too
            assert at > before_run, f"run 1 wrote nothing in 120 s:\n{text[-4000:]}\n" + "\n".join(log)
            children = server.split(P, topic, "0")
            active = [x["shard_id"] for x in server.shards(P, topic) if x["state"] == "ACTIVE"]
            log.append(f"split: children {children}, active {active}")
            lines += write_round_robin(client, topic, entries[half:], active, first=half)
    killed_planned = len(_offset_log(checkpoint, topic))  # the micro-batches the killed runs planned
    proc, path = _start(tmp_path, kills + 1, cfg, "availableNow")
    started = time.monotonic()
    try:
        code = proc.wait(300)
    except subprocess.TimeoutExpired:
        _killpg(proc)
        raise AssertionError("the final run did not end:\n" + path.read_text(errors="replace")[-4000:]) from None
    text = path.read_text(errors="replace")
    assert code == 0 and "finished" in text, text[-4000:]
    log.append(f"run {kills + 1}: availableNow to the end in {time.monotonic() - started:.1f} s, "
               f"{_output_records(kafka_broker.bootstrap, out)} Kafka records")
    context = "\n  ".join(log)
    got = read_back(kafka_broker.bootstrap, out)  # read_committed
    want = convert(lines)
    have = {p: [e.SerializeToString() for e, _, _ in items] for p, items in got.items()}
    assert sum(len(v) for v in have.values()) == len(want), context
    for p in sorted(have):  # each once, in order per partition (never sorted): convert's order of its tables
        wanted = [raw for raw in want if expected_partition(pb.Entry.FromString(raw), len(have)) == p]
        first = next((i for i, (a, b) in enumerate(zip(have[p], wanted)) if a != b), min(len(have[p]), len(wanted)))
        assert have[p] == wanted, (f"partition {p}: {len(have[p])} Entries, {len(wanted)} wanted, first difference "
                                   f"at {first}\n  {context}")
    assert by_table([r for p in sorted(have) for r in have[p]]) == by_table(want), context
    batches, inside = len(_offset_log(checkpoint, topic)), _cuts_inside_entries(server, topic, checkpoint)
    assert any(n < killed_planned for n in inside), \
        (f"no micro-batch planned by a killed run ({killed_planned}) ended inside an Entry (those that did: "
         f"{inside} of {batches})\n  {context}")
    tasks = None
    if cluster is not None:  # every run an application of the cluster; tasks in executors on both workers
        tasks = {n: {app: count for app, count in apps.items() if app not in before[n]}
                 for n, apps in cluster.task_logs().items()}
        runs = set().union(*(set(apps) for apps in tasks.values()))
        assert len(runs) == kills + 1, f"{kills + 1} driver runs, applications on the workers: {tasks}\n  {context}"
        assert all(sum(apps.values()) > 0 for apps in tasks.values()), \
            f"not both workers ran tasks: {tasks}\n  {context}"
        final = max(runs)
        assert all(tasks[n].get(final, 0) > 0 for n in tasks), \
            f"the last run's tasks did not run on both workers: {tasks}\n  {context}"
    print(f"\n[reverse kill run: {kills} kills, {len(want)} Entries compared per partition "
          f"({ {p: len(v) for p, v in have.items()} }), {batches} micro-batches, {inside} ending inside an Entry, "
          f"tasks per worker and application {tasks}, {time.monotonic() - began:.1f} s]\n  {context}")
    return log


# the cluster's one-kill run is make test-deep's too: the file is one worker's share of make test
# (about 5 minutes with it), and make test runs the forward stream on the cluster (test_spark_cluster)
@pytest.mark.parametrize("where", ["local", pytest.param("cluster", marks=pytest.mark.deep)])
def test_stream_killed_restarted_split_exactly_once(where, request, server, client, kafka_broker, tmp_path):
    """One kill: local[2] (make test), and the standalone cluster (a master and two one-core workers;
    make test-deep)."""
    cluster = request.getfixturevalue("spark_cluster") if where == "cluster" else None
    kill_run(server, client, kafka_broker, tmp_path, kills=1, seed=int(ENV.get("SPARK_REVERSE_SEED", "33")),
             cluster=cluster)


@pytest.mark.deep
@pytest.mark.parametrize("where", ["local", "cluster"])
def test_stream_killed_many_times(where, request, server, client, kafka_broker, tmp_path):
    """Four kills (make test-deep), in micro-batches of 24 records (about 10: each run has some)."""
    cluster = request.getfixturevalue("spark_cluster") if where == "cluster" else None
    kill_run(server, client, kafka_broker, tmp_path, kills=4, seed=7, cluster=cluster, max_records=24)
