"""End-to-end Spark Structured Streaming pipeline tests (docs/spark.md, "Streaming: exact across micro-batches"), on real
parts: a real Apache Kafka broker (tests/support/kafka_broker.py), Spark's own `kafka` source (the
spark-sql-kafka-0-10 jars in .cache/jars/spark-kafka/) and `dts-kafka`, `dts_to_blob` /
`dts_to_tuple` on the stream with a small `maxOffsetsPerTrigger` (so that micro-batch boundaries
fall inside Entries split across Envelopes), `writeStream.format("datahub")` into the stand-in
DataHub (tests/support/datahub_standin.py) with chaos faults, and a driver process (a real
subprocess, tests/pipeline_jobs/driver.py) killed with SIGKILL (its whole process group: Python,
JVM, Python workers) and restarted from its checkpoint.

What landed is compared with `dts-bridge convert` of the very files produced, per (DataHub shard,
Kafka partition) taken from the `dts.pos` attribute, record for record, in the order DataHub holds
them (never sorted); positions strictly increase per (shard, partition) and are unique per topic.
The checkpoint's offset log is read to prove that micro-batch boundaries did fall inside split
Entries.

- test_blob_dts_kafka_killed_and_restarted: dts-kafka -> Blob, 1 kill (deep: 6).
- test_blob_spark_kafka_source_killed_and_restarted: Spark's `kafka` source -> Blob, 1 kill (deep: 4).
- test_tuple_dts_kafka_killed_and_restarted: dts-kafka -> Tuple (media.thumbnails), 1 kill (deep: 4).
- test_micro_batch_boundaries_inside_entries_lose_nothing_in_any_mode: both Kafka sources, FAILFAST
  (clean topic), PERMISSIVE and DROPMALFORMED (a topic with a missing segment and a record that is
  no Envelope), streaming rows (foreachBatch) equal to the batch conversion of the same records
  (one subprocess, tests/pipeline_jobs/collect.py, runs the six queries at once).
- test_two_tasks_writing_one_shard_with_lost_answers_land_each_record_once: the `datahub` sink's
  task function (`write_batches`) run by two threads at once on a one-shard topic with lost
  answers, as two Spark tasks of one micro-batch do; no Spark, a few seconds.

The pipeline topic's name is chosen so that its two Kafka partitions run in two Spark tasks
(`spark_task_of`: Spark's hash partitioning of (topic, partition)), as they do on a cluster; the two
tasks then write to the same DataHub shards at the same time.

Seeds: SPARK_PIPELINE_SEED=N (default 1729) changes kill points and chaos.
"""
from __future__ import annotations

import collections
import glob
import json
import os
import pathlib
import subprocess
import sys
import time
import uuid

import orjson
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")
pytestmark = [pytest.mark.spark, pytest.mark.datahub]

from bridge import shard_key  # noqa: E402
from bridge.datahub.sink import make_client, shard_for, tuple_shard_key  # noqa: E402
from bridge.wire.framing import Reassembler, pack_entries, read_pb, write_pb  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.landing import short  # noqa: E402
from support.pipeline import ENV, ROOT, bridge_cli, fault_summary, run_bridge, text_or_none  # noqa: E402
from support.spark_driver import (  # noqa: E402
    JOBS,
    PROJECT,
    Driver,
    _java,
    _landed_count,
    _split_ranges,
    _two_task_name,
    chaos,
    checkpoint_cuts,
    commits,
    compare,
    kill_loop,
    landed,
    spark_task_of,
    straddling_cuts,
)

SAMPLES = ROOT / "samples"
SHARDS = ["0", "1", "2"]
SEED = int(os.environ.get("SPARK_PIPELINE_SEED", "1729"))
SPARK_KAFKA_JARS = sorted(glob.glob(str(ROOT / ".cache" / "jars" / "spark-kafka" / "*.jar")))
GARBAGE = b"\xff\xff\xff not an Envelope"
TABLE = "media.thumbnails"
MAX_OFFSETS = 10  # per micro-batch: the topic's 48 offsets in about five micro-batches


def _need_spark_kafka_jars() -> str:
    if not any("spark-sql-kafka" in p for p in SPARK_KAFKA_JARS):
        pytest.skip(f"no spark-sql-kafka jar in {ROOT / '.cache/jars/spark-kafka'} (run make install)")
    return ",".join(SPARK_KAFKA_JARS)


# ---- the input: a 2-partition topic with Entries split across Envelopes ----------------------------

def _entries(path: pathlib.Path) -> list:
    reassembler, out = Reassembler(), []
    for number, _, raw in read_pb(path):
        for item in reassembler.feed(0, number, raw):
            out.extend(item.entries.items)
    assert reassembler.finish() == []
    return out


def _repack(src: pathlib.Path, dest: pathlib.Path, size: int) -> pathlib.Path:
    with open(dest, "wb") as out:
        write_pb(out, pack_entries(_entries(src), size))
    return dest


def test_spark_task_of_matches_spark_hash():
    assert spark_task_of("pipeline-a12087cb", 0) == 0 and spark_task_of("pipeline-a12087cb", 1) == 1
    assert [spark_task_of(n, p) for n in ("x", "abcde", "pipeline-ffffffff", "ñé-topic") for p in (0, 1)] == \
        [0, 0, 0, 0, 0, 1, 1, 0]  # pmod(hash(n, p), 2) as Spark 4.3 computes it


class Topic:
    """A Kafka topic produced by the test: its name, each partition's records (bytes, by offset)
    and, for a clean topic, the files produced to each partition in order."""

    def __init__(self, name: str, records: dict[int, list[bytes]], files: dict[int, list[pathlib.Path]]) -> None:
        self.name, self.records, self.files = name, records, files

    def splits(self) -> dict[int, list[tuple[int, int]]]:
        return {p: _split_ranges(raws) for p, raws in self.records.items()}

    def offsets(self) -> int:
        return sum(len(v) for v in self.records.values())


@pytest.fixture(scope="module")
def clean_topic(kafka_broker, tmp_path_factory) -> Topic:
    """Partition 0: samples/large.pb (21 Envelopes; Entries of 4, 6 and 4 segments). Partition 1:
    mixed.pb packed into 2 KB Envelopes (16), then large.pb packed into 8 KB ones (11): 48 offsets,
    every Entries split across Envelopes somewhere. Produced with `dts-bridge produce`."""
    folder = tmp_path_factory.mktemp("pipeline-input")
    files = {0: [SAMPLES / "large.pb"],
             1: [_repack(SAMPLES / "mixed.pb", folder / "mixed-2k.pb", 2048),
                 _repack(SAMPLES / "large.pb", folder / "large-8k.pb", 8000)]}
    # the two partitions in two Spark tasks, as on a cluster (see spark_task_of)
    name = kafka_broker.create_topic(_two_task_name("pipeline"), partitions=2)
    records: dict[int, list[bytes]] = {}
    for partition, paths in files.items():
        for path in paths:
            proc = run_bridge(bridge_cli("produce", str(path), "--brokers", kafka_broker.bootstrap, "--topic", name,
                             "--partition", str(partition)))
            assert proc.returncode == 0, f"dts-bridge produce {path} failed: {proc.stderr}"
            records.setdefault(partition, []).extend(raw for _, _, raw in read_pb(path))
    topic = Topic(name, records, files)
    assert {p: len(r) for p, r in records.items()} == {0: 21, 1: 27}
    assert all(len(s) >= 3 for s in topic.splits().values())
    return topic


@pytest.fixture(scope="module")
def dirty_topic(kafka_broker) -> Topic:
    """Partition 0: large.pb without its 9th record (a middle segment of the 6-segment Entries);
    partition 1: a record that is no Envelope, then large.pb. Produced one record per request."""
    from confluent_kafka import Producer
    large = [raw for _, _, raw in read_pb(SAMPLES / "large.pb")]
    records = {0: large[:8] + large[9:], 1: [GARBAGE] + large}
    name = kafka_broker.create_topic(f"pipeline-dirty-{uuid.uuid4().hex[:8]}", partitions=2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 0, "enable.idempotence": True})
    for partition, raws in records.items():
        for raw in raws:
            producer.produce(name, raw, partition=partition)
            producer.flush(30)
    assert producer.flush(30) == 0
    return Topic(name, records, {})


def convert_blob(path: pathlib.Path, tmp_path: pathlib.Path) -> list[bytes]:
    out = tmp_path / f"expected-{path.stem}-{uuid.uuid4().hex[:6]}.jsonl"
    proc = run_bridge(bridge_cli("convert", str(path), "-o", str(out), "--to", "blob", "--no-progress"))
    assert proc.returncode == 0, f"dts-bridge convert {path} failed: {proc.stderr}"
    return out.read_bytes().splitlines()


def convert_tuple(path: pathlib.Path, tmp_path: pathlib.Path, table: str) -> tuple[dict, list[dict]]:
    """The Tuple file conversion of one table: (schema document, rows)."""
    folder = tmp_path / f"tuple-{path.stem}-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    proc = run_bridge(bridge_cli("convert", str(path), "-o", str(folder / "{table}.jsonl"), "--to", "tuple",
                     "--on-error", "skip", "--no-progress"))
    assert proc.returncode in (0, 1), f"dts-bridge convert --to tuple {path} failed: {proc.stderr}"
    side = folder / f"{table}.schema.json"
    if not side.exists():
        return {}, []
    assert not list(folder.glob(f"{table}.v2.*")), "the table changed its schema inside the file"
    rows = [json.loads(line) for line in (folder / f"{table}.jsonl").read_text().splitlines()]
    return json.loads(side.read_text()), rows


def _blob_pipeline(tmp_path, broker, topic: Topic, *, source: str, kills: int, seed: int,
                   tails: bool = False) -> None:
    _java()
    began = time.monotonic()
    jars = _need_spark_kafka_jars() if source == "kafka" else ""
    expected: dict = collections.defaultdict(list)
    for partition, paths in topic.files.items():
        for path in paths:
            for line in convert_blob(path, tmp_path):
                expected[(shard_for(shard_key(orjson.loads(line)), SHARDS), partition)].append(line)
    total = sum(len(v) for v in expected.values())
    assert len({s for s, _ in expected}) == 3 and {p for _, p in expected} == {0, 1}
    log: list[str] = []
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blob", shard_count=3)
        chaos(server, seed)
        driver = Driver(tmp_path, source=source, bootstrap=broker.bootstrap, topic=topic.name,
                        maxOffsetsPerTrigger=MAX_OFFSETS, endpoint=server.endpoint, project=PROJECT,
                        datahub_topic="blob", batchSize=5, maxRetries=30, jars=jars, kind="blob",
                        state_location=str(tmp_path / "tails") if tails else None)
        count = _landed_count(server, "blob")
        killed = kill_loop(driver, count, kills=kills, total=total, seed=seed, log=log)
        server.faults.clear()
        faults = fault_summary(server)
        context = f"source {source}, seed {seed}; driver logs in {tmp_path}; faults {faults}\n  " + "\n  ".join(log)
        assert server.errors == [], f"the stand-in's own errors: {server.errors}"
        got, positions = landed(server, "blob", topic.name, lambda r: r["data"], tmp_path / "landed.jsonl")
        compared = compare("blob", got, positions, expected, context)
        assert len(killed) == kills and all(k["landed_in_run"] > 0 for k in killed), context
        assert faults.get("chaos-ack-lost", 0) > 0 and faults.get("chaos-5xx", 0) > 0, f"chaos too quiet: {faults}"
        cuts = checkpoint_cuts(driver.checkpoint, topic.name)
        inside = straddling_cuts(cuts, topic.splits())
        assert inside, f"no micro-batch ended inside a split Entries: cuts {dict(cuts)}, splits {topic.splits()}"
        if tails:  # the open tails were in state_location's files, per Kafka partition
            assert {p.parent.name for p in (tmp_path / "tails").glob("*/*/*/*/*.arrow")} == {"0", "1"}
        summaries = commits(driver.commit_log)
        skipped = sum(s.get("skipped", 0) for s in summaries if s["outcome"] == "commit")
        print(f"\n[{source} -> Blob -> datahub ({'state_location' if tails else 'Spark state'}), seed {seed}: {len(killed)} kills in {driver.runs} runs, {compared} "
              f"records compared over {len(expected)} (shard, partition) pairs, {len(cuts[0])} micro-batches, "
              f"{len(inside)} micro-batch ends inside split Entries, {skipped} records found already landed by "
              f"replays, faults {faults}, {time.monotonic() - began:.1f} s]\n  " + "\n  ".join(log))


# ---- 1. dts-kafka -> Blob -> datahub, killed twice ---------------------------------------------------

def test_blob_dts_kafka_killed_and_restarted(kafka_broker, clean_topic, tmp_path):
    _blob_pipeline(tmp_path, kafka_broker, clean_topic, source="dts-kafka", kills=1, seed=SEED)


@pytest.mark.deep
def test_blob_dts_kafka_killed_and_restarted_deep(kafka_broker, clean_topic, tmp_path):
    _blob_pipeline(tmp_path, kafka_broker, clean_topic, source="dts-kafka", kills=6, seed=SEED + 1)


@pytest.mark.deep  # make test runs state_location's kill test on the standalone cluster (test_spark_cluster)
def test_blob_dts_kafka_with_state_location_killed_and_restarted(kafka_broker, clean_topic, tmp_path):
    """The open tails in state_location's files (bridge/spark/tails.py) instead of the state store."""
    _blob_pipeline(tmp_path, kafka_broker, clean_topic, source="dts-kafka", kills=1, seed=SEED + 6, tails=True)


@pytest.mark.deep
def test_blob_dts_kafka_with_state_location_killed_and_restarted_deep(kafka_broker, clean_topic, tmp_path):
    _blob_pipeline(tmp_path, kafka_broker, clean_topic, source="dts-kafka", kills=6, seed=SEED + 7, tails=True)


# ---- 2. Spark's own kafka source -> Blob -> datahub ----------------------------------------------------

@pytest.mark.deep  # make test keeps Spark's own kafka source in the micro-batch boundary test (4.) for time
def test_blob_spark_kafka_source_killed_and_restarted(kafka_broker, clean_topic, tmp_path):
    _blob_pipeline(tmp_path, kafka_broker, clean_topic, source="kafka", kills=1, seed=SEED + 2)


@pytest.mark.deep
def test_blob_spark_kafka_source_killed_and_restarted_deep(kafka_broker, clean_topic, tmp_path):
    _blob_pipeline(tmp_path, kafka_broker, clean_topic, source="kafka", kills=4, seed=SEED + 3)


# ---- 3. dts-kafka -> Tuple -> datahub ---------------------------------------------------------------

def _tuple_pipeline(tmp_path, broker, topic: Topic, *, kills: int, seed: int, tails: bool = False) -> None:
    _java()
    began = time.monotonic()
    expected: dict = collections.defaultdict(list)
    fields: list | None = None
    shard_ids = ["0", "1"]
    for partition, paths in topic.files.items():
        for path in paths:
            doc, rows = convert_tuple(path, tmp_path, TABLE)
            if not rows:
                continue
            names = [f["name"] for f in doc["fields"]]
            assert fields is None or fields == names, (fields, names)
            fields = names
            keys = [c["name"] for c in doc["dtsColumns"] if c.get("isKey")]
            for row in rows:
                expected[(shard_for(tuple_shard_key(row, TABLE, keys), shard_ids), partition)].append(
                    [text_or_none(row.get(f)) for f in fields])
    assert fields and {p for _, p in expected} == {0, 1} and len({s for s, _ in expected}) == 2, expected.keys()
    total = sum(len(v) for v in expected.values())
    name = TABLE.replace(".", "_")
    log: list[str] = []
    with StandInDataHub() as server:
        chaos(server, seed)
        driver = Driver(tmp_path, source="dts-kafka", bootstrap=broker.bootstrap, topic=topic.name,
                        maxOffsetsPerTrigger=MAX_OFFSETS, endpoint=server.endpoint, project=PROJECT,
                        datahub_topic="{db}_{table}", batchSize=5, maxRetries=30, kind="tuple", table=TABLE,
                        shards=len(shard_ids), state_location=str(tmp_path / "tails") if tails else None)
        killed = kill_loop(driver, _landed_count(server, name), kills=kills, total=total, seed=seed, log=log)
        server.faults.clear()
        faults = fault_summary(server)
        context = f"seed {seed}; driver logs in {tmp_path}; faults {faults}\n  " + "\n  ".join(log)
        assert server.errors == [], f"the stand-in's own errors: {server.errors}"
        client = make_client(server.endpoint, "test-id", "test-secret")
        assert set(client.list_topic(PROJECT).topic_names) == {name}
        schema = client.get_topic(PROJECT, name).record_schema
        assert [f.name for f in schema.field_list] == fields, context
        assert [s["shard_id"] for s in server.shards(PROJECT, name) if s["state"] == "ACTIVE"] == shard_ids
        got, positions = landed(server, name, topic.name, lambda r: [text_or_none(v) for v in r["values"]],
                                 tmp_path / "landed.jsonl")
        compared = compare(name, got, positions, expected, context)
        assert len(killed) == kills and all(k["landed_in_run"] > 0 for k in killed), context
        cuts = checkpoint_cuts(driver.checkpoint, topic.name)
        inside = straddling_cuts(cuts, topic.splits())
        assert inside, f"no micro-batch ended inside a split Entries: cuts {dict(cuts)}"
        print(f"\n[dts-kafka -> Tuple {TABLE} -> datahub, seed {seed}: {len(killed)} kills in {driver.runs} runs, "
              f"{compared} rows compared over {len(expected)} (shard, partition) pairs, {len(inside)} micro-batch "
              f"ends inside split Entries, faults {faults}, {time.monotonic() - began:.1f} s]\n  " + "\n  ".join(log))


@pytest.mark.deep  # make test's time (docs/testing.md): the blob kill runs quick, this one deep
def test_tuple_dts_kafka_killed_and_restarted(kafka_broker, clean_topic, tmp_path):
    _tuple_pipeline(tmp_path, kafka_broker, clean_topic, kills=1, seed=SEED + 4)


@pytest.mark.deep
def test_tuple_dts_kafka_killed_and_restarted_deep(kafka_broker, clean_topic, tmp_path):
    _tuple_pipeline(tmp_path, kafka_broker, clean_topic, kills=4, seed=SEED + 5)


@pytest.mark.deep
def test_tuple_dts_kafka_with_state_location_killed_and_restarted_deep(kafka_broker, clean_topic, tmp_path):
    """The Tuple rows (written by the C Tuple sink) with the open tails in state_location's files."""
    _tuple_pipeline(tmp_path, kafka_broker, clean_topic, kills=4, seed=SEED + 8, tails=True)
    assert {p.parent.name for p in (tmp_path / "tails").glob("*/*/*/*/*.arrow")} == {"0", "1"}


# ---- 4. a micro-batch boundary inside an Entries, every mode, both Kafka sources -------------------------

def _by_partition(rows) -> dict:
    """Rows per Kafka partition in the order given (never sorted)."""
    out: dict = {}
    for row in rows:
        out.setdefault(row[1], []).append(tuple(row))
    return out


_WORKER_TIMEOUT = "Timed out while waiting for the Python worker to connect back"


def test_micro_batch_boundaries_inside_entries_lose_nothing_in_any_mode(kafka_broker, clean_topic, dirty_topic,
                                                                     tmp_path):
    """Streaming dts_to_blob with maxOffsetsPerTrigger on Spark's `kafka` source and on dts-kafka,
    FAILFAST on the clean topic, PERMISSIVE and DROPMALFORMED on the dirty one: the micro-batches'
    rows, in batch order, equal the batch conversion of the same topic per Kafka partition (error
    rows included), with the same tally; FAILFAST's Blob lines equal `dts-bridge convert`."""
    _java()
    began = time.monotonic()
    jars = _need_spark_kafka_jars()
    out = tmp_path / "collected.json"
    config = tmp_path / "collect.json"
    for attempt in range(2):
        config.write_text(json.dumps(dict(sources=["kafka", "dts-kafka"], bootstrap=kafka_broker.bootstrap,
                                          clean=clean_topic.name, dirty=dirty_topic.name,
                                          maxOffsetsPerTrigger=MAX_OFFSETS, out=str(out),
                                          checkpoints=str(tmp_path / f"checkpoints-{attempt}"), jars=jars)))
        proc = subprocess.run([sys.executable, str(JOBS / "collect.py"), str(config)], cwd=ROOT, env=ENV,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode == 0 or _WORKER_TIMEOUT not in proc.stderr:
            break
        # Spark waits a fixed time for a new Python worker to connect back (not configurable in
        # 4.x); on a loaded 2-core machine the data source's planning worker can miss it: the job
        # runs once more from scratch (fresh checkpoints), and any other failure fails the test
    assert proc.returncode == 0 and "finished" in proc.stdout, \
        f"the collect job exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    result = json.loads(out.read_text())
    expected_lines = {p: [line.decode() for path in paths for line in convert_blob(path, tmp_path)]
                      for p, paths in clean_topic.files.items()}
    entries = sum(len(_entries(path)) for paths in clean_topic.files.values() for path in paths)
    summary = []
    for source in ("kafka", "dts-kafka"):
        for mode in ("FAILFAST", "PERMISSIVE", "DROPMALFORMED"):
            got = result[source][mode]
            topic = clean_topic if mode == "FAILFAST" else dirty_topic
            what = f"{source} {mode}"
            ids = sorted(got["stream"], key=int)
            assert [int(i) for i in ids] == list(range(len(ids))), f"{what}: micro-batch ids {ids}"
            stream_rows = [row for i in ids for row in got["stream"][i]]
            cuts = checkpoint_cuts(pathlib.Path(got["checkpoint"]), topic.name)
            inside = straddling_cuts(cuts, topic.splits())
            assert inside, f"{what}: no micro-batch ended inside a split Entries: cuts {dict(cuts)}"
            s, b = _by_partition(stream_rows), _by_partition(got["batch"])
            for p in sorted(set(s) | set(b), key=str):
                have, want = s.get(p, []), b.get(p, [])
                if have != want:
                    first = next((i for i, (h, w) in enumerate(zip(have, want)) if h != w), min(len(have), len(want)))
                    pytest.fail(f"{what} partition {p}: the stream gave {len(have)} rows, the batch conversion "
                                f"{len(want)}; first difference at #{first}:\n  stream: "
                                f"{short(have[first]) if first < len(have) else '(end)'}\n  batch:  "
                                f"{short(want[first]) if first < len(want) else '(end)'}\n"
                                f"micro-batch ends {dict(cuts)} inside split Entries {inside}")
            assert got["stream_tally"] == got["batch_tally"], (what, got["stream_tally"], got["batch_tally"])
            tally = got["stream_tally"]
            assert tally["input"] == tally["converted"] + tally["rejected"] + tally["not_emitted"], (what, tally)
            errors = [(r[1], r[2]) for r in stream_rows if r[6] is not None]
            if mode == "FAILFAST":
                assert tally["rejected"] == 0 and not errors
                # input counts Entry messages: every Entry of the files produced, once
                assert tally["input"] == entries, (what, tally, entries)
                lines = {p: [r[5] for r in rows] for p, rows in s.items()}
                assert lines == expected_lines, f"{what}: the Blob lines differ from dts-bridge convert"
            else:
                # the 6-segment Entries missing its 3rd segment (partition 0, offsets 6..10 now) and
                # the record that is no Envelope (partition 1, offset 0)
                assert tally["rejected"] >= 2, (what, tally)
                if mode == "PERMISSIVE":
                    assert (1, 0) in errors and any(p == 0 and 6 <= o <= 10 for p, o in errors), (what, errors)
                else:
                    assert not errors
                good = {p: [r[5] for r in rows if r[6] is None] for p, rows in s.items()}
                # every Entries but the broken one: partition 1 is all of large.pb
                assert good[1] == expected_lines[0], f"{what}: partition 1 is not large.pb's conversion"
            summary.append(f"{what}: {len(ids)} micro-batches, {len(inside)} ends inside split Entries, "
                           f"{len(stream_rows)} rows, rejected {tally['rejected']}")
    print(f"\n[micro-batch boundaries, {time.monotonic() - began:.1f} s]\n  " + "\n  ".join(summary))


# ---- the sink's task function, two tasks writing one shard at once ----------------------------------------

def test_two_tasks_writing_one_shard_with_lost_answers_land_each_record_once(tmp_path):
    """What every micro-batch of the pipelines above does, without Spark: two Spark tasks (the
    `datahub` sink's task function, `write_batches`, one per Kafka partition, as the streaming
    `dts_to_blob` gives them) write at the same time to one DataHub shard, and some answers are
    lost after the records landed (chaos ack-lost). Each task's writer checks an answer-less
    request against the shard's tail before sending it again; every record must land once, and
    each partition's records in order."""
    import threading

    import pyarrow as pa

    import bridge.spark as bs
    from bridge.spark.jobs import BLOB_COLUMNS
    from bridge.spark.sink import configure, write_batches

    raws = [raw for _, _, raw in read_pb(SAMPLES / "large.pb")]
    rows = {}
    for partition in (0, 1):
        kafka = pa.RecordBatch.from_pydict({"topic": ["dts"] * len(raws), "partition": [partition] * len(raws),
                                            "offset": list(range(len(raws))), "value": raws})
        rows[partition] = pa.Table.from_batches(
            list(bs.dts_to_blob_batches(arrow=True)(iter([kafka])))).to_batches(max_chunksize=8)
    expected = {p: [v.encode() for b in batches for v in b.column("blob").to_pylist()] for p, batches in rows.items()}
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "one", shard_count=1)
        config = configure(dict(endpoint=server.endpoint, project=PROJECT, topic="one", accessId="i", accessKey="k",
                                batchSize="3"), BLOB_COLUMNS, streaming=True)
        server.faults.chaos(SEED, p_ack_lost=0.15, p_delay=0.3, max_delay=0.02, op=("PutRecordsByShard",))
        reports, errors = {}, []

        def task(partition):
            try:
                reports[partition] = write_batches(config, iter(rows[partition]), epoch=0)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
        threads = [threading.Thread(target=task, args=(p,)) for p in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        server.faults.clear()
        assert not errors, errors
        lost_answers = server.faults.count("chaos-ack-lost")
        got, positions = landed(server, "one", "dts", lambda r: r["data"], tmp_path / "landed.jsonl")
        compare("one", got, positions, {("0", p): lines for p, lines in expected.items()},
                f"two tasks on one shard, {lost_answers} answers lost after the records landed; reports {reports}")
        assert lost_answers > 0
