"""The streaming kill tests on a real Spark standalone cluster (issue 33, point 5), both directions,
in one file so that the suite starts one cluster: a master
and two one-core workers started by the tests from pyspark's own jars (tests/support/spark_cluster.py,
the session fixture `spark_cluster`), a driver process (tests/pipeline_jobs/driver.py) with
`spark.master` at that cluster, so each micro-batch's two tasks (one per Kafka partition) run in
separate executors on separate workers:

`dts-kafka` -> `dts_to_blob` (reassembly in the RocksDB state store, now on the executors) ->
`writeStream.format("datahub")` into the stand-in DataHub with chaos faults; the driver is SIGKILLed
(its process group: the driver JVM and Python; the executors on the workers lose their driver and
end) and restarted from its checkpoint, then run to the end (availableNow). What landed equals
`dts-bridge convert` of the produced files per (DataHub shard, Kafka partition), record for record in
DataHub's order, each once (support.spark_driver.compare); micro-batch ends fell inside split Entries;
and the executors' logs show tasks run on both workers.

- test_blob_on_the_cluster_killed_and_restarted: 1 kill (make test).
- test_blob_on_the_cluster_killed_and_restarted_deep: 4 kills (make test-deep).
- the same two with `state_location` (the open tails in files the executors write, bridge/spark/tails.py,
  instead of the state store): 1 kill (make test), 4 kills (make test-deep).

The reverse stream on the same cluster (`kill_run`, tests/support/reverse_stream.py, as
tests/test_spark_datahub_reverse.py runs it on local[2]): DataHub (3 shards, an Entry's rows and an
UPDATE's halves on several shards) -> `blob_to_dts` (the shards merged in the executors' state) ->
`dts-kafka`, the driver SIGKILLed and restarted from its checkpoint with a shard split in between;
a read_committed consumer sees every Entry once, in order per Kafka partition, equal to `convert`;
the executors of both workers ran tasks.

- test_reverse_on_the_cluster_killed_and_restarted: 1 kill (make test).
- test_reverse_on_the_cluster_killed_many_times: 4 kills (make test-deep).

Seeds: SPARK_PIPELINE_SEED=N (default 1729), as tests/test_spark_pipeline.py; the reverse runs
SPARK_REVERSE_SEED=N (default 33).
"""
from __future__ import annotations

import collections
import os
import pathlib
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
from bridge.datahub.calls import make_client  # noqa: E402
from bridge.datahub.sink import shard_for  # noqa: E402
from bridge.wire.framing import Reassembler, pack_entries, read_pb, write_pb  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.pipeline import ENV, ROOT, bridge_cli, fault_summary, run_bridge  # noqa: E402
from support.reverse_stream import kill_run  # noqa: E402
from support.spark_driver import (  # noqa: E402
    PROJECT,
    Driver,
    _landed_count,
    _split_ranges,
    _two_task_name,
    chaos,
    checkpoint_cuts,
    compare,
    kill_loop,
    landed,
    straddling_cuts,
)

SAMPLES = ROOT / "samples"
SHARDS = ["0", "1", "2"]
SEED = int(os.environ.get("SPARK_PIPELINE_SEED", "1729"))
MAX_OFFSETS = 10  # per micro-batch: the topic's 48 offsets in about five micro-batches


def _repack(src: pathlib.Path, dest: pathlib.Path, size: int) -> pathlib.Path:
    reassembler, entries = Reassembler(), []
    for number, _, raw in read_pb(src):
        for item in reassembler.feed(0, number, raw):
            entries.extend(item.entries.items)
    assert reassembler.finish() == []
    with open(dest, "wb") as out:
        write_pb(out, pack_entries(entries, size))
    return dest


@pytest.fixture(scope="module")
def cluster_topic(kafka_broker, tmp_path_factory):
    """As tests/test_spark_pipeline.py's clean topic: partition 0 samples/large.pb (21 Envelopes),
    partition 1 mixed.pb in 2 KB Envelopes then large.pb in 8 KB ones (27): every Entries split
    across Envelopes somewhere; a name whose two partitions hash to two tasks."""
    folder = tmp_path_factory.mktemp("cluster-input")
    files = {0: [SAMPLES / "large.pb"],
             1: [_repack(SAMPLES / "mixed.pb", folder / "mixed-2k.pb", 2048),
                 _repack(SAMPLES / "large.pb", folder / "large-8k.pb", 8000)]}
    name = kafka_broker.create_topic(_two_task_name("cluster"), partitions=2)
    records: dict[int, list[bytes]] = {}
    for partition, paths in files.items():
        for path in paths:
            proc = run_bridge(bridge_cli("produce", str(path), "--brokers", kafka_broker.bootstrap, "--topic", name,
                                         "--partition", str(partition)))
            assert proc.returncode == 0, f"dts-bridge produce {path} failed: {proc.stderr}"
            records.setdefault(partition, []).extend(raw for _, _, raw in read_pb(path))
    assert {p: len(r) for p, r in records.items()} == {0: 21, 1: 27}
    return name, records, files


def _convert_blob(path: pathlib.Path, tmp_path: pathlib.Path) -> list[bytes]:
    out = tmp_path / f"expected-{path.stem}-{uuid.uuid4().hex[:6]}.jsonl"
    proc = run_bridge(bridge_cli("convert", str(path), "-o", str(out), "--to", "blob", "--no-progress"))
    assert proc.returncode == 0, f"dts-bridge convert {path} failed: {proc.stderr}"
    return out.read_bytes().splitlines()


def _cluster_pipeline(tmp_path, broker, cluster, topic, *, kills: int, seed: int, tails: bool = False) -> None:
    began = time.monotonic()
    name, records, files = topic
    expected: dict = collections.defaultdict(list)
    for partition, paths in files.items():
        for path in paths:
            for line in _convert_blob(path, tmp_path):
                expected[(shard_for(shard_key(orjson.loads(line)), SHARDS), partition)].append(line)
    total = sum(len(v) for v in expected.values())
    before = {n: set(apps) for n, apps in cluster.task_logs().items()}
    conf = dict(cluster.conf(), **{f"spark.executorEnv.{k}": ENV[k]
                                   for k in ("DATAHUB_ACCESS_ID", "DATAHUB_ACCESS_KEY", "PYTHONPATH")})
    log: list[str] = []
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blob", shard_count=3)
        chaos(server, seed)
        driver = Driver(tmp_path, source="dts-kafka", bootstrap=broker.bootstrap, topic=name,
                        maxOffsetsPerTrigger=MAX_OFFSETS, endpoint=server.endpoint, project=PROJECT,
                        datahub_topic="blob", batchSize=5, maxRetries=30, jars="", kind="blob", conf=conf,
                        state_location=str(tmp_path / "tails") if tails else None)
        killed = kill_loop(driver, _landed_count(server, "blob"), kills=kills, total=total, seed=seed, log=log,
                           timeout=600)
        server.faults.clear()
        faults = fault_summary(server)
        context = (f"standalone cluster {cluster.master}, seed {seed}; driver logs in {tmp_path}; faults {faults}\n  "
                   + "\n  ".join(log))
        assert server.errors == [], f"the stand-in's own errors: {server.errors}"
        got, positions = landed(server, "blob", name, lambda r: r["data"], tmp_path / "landed.jsonl")
        compared = compare("blob", got, positions, expected, context)
        assert len(killed) == kills and all(k["landed_in_run"] > 0 for k in killed), context
    cuts = checkpoint_cuts(driver.checkpoint, name)
    inside = straddling_cuts(cuts, {p: _split_ranges(raws) for p, raws in records.items()})
    assert inside, f"no micro-batch ended inside a split Entries: cuts {dict(cuts)}"
    if tails:  # the open tails were in state_location's files, written by the executors, per Kafka partition
        written = sorted(p.parent.name for p in (tmp_path / "tails").glob("*/*/*/*/*.arrow"))
        assert set(written) == {"0", "1"}, written
    # every run was an application of the cluster; the tasks ran in executors on both workers
    tasks = {n: {app: count for app, count in apps.items() if app not in before[n]}
             for n, apps in cluster.task_logs().items()}
    runs = set().union(*(set(apps) for apps in tasks.values()))
    assert len(runs) == driver.runs, f"{driver.runs} driver runs, applications on the workers: {tasks}\n{context}"
    final = max(runs)
    assert all(tasks[n].get(final, 0) > 0 for n in tasks), \
        f"the last run's tasks did not run on both workers: {tasks}\n{context}"
    print(f"\n[standalone cluster, dts-kafka -> Blob -> datahub ({'state_location' if tails else 'Spark state'}), seed {seed}: {len(killed)} kills in {driver.runs} "
          f"runs, {compared} records compared, {len(cuts[0])} micro-batches, {len(inside)} ends inside split "
          f"Entries, tasks per worker and application {tasks}, faults {faults}, {time.monotonic() - began:.1f} s]\n  "
          + "\n  ".join(log))


def test_blob_on_the_cluster_killed_and_restarted(kafka_broker, spark_cluster, cluster_topic, tmp_path):
    _cluster_pipeline(tmp_path, kafka_broker, spark_cluster, cluster_topic, kills=1, seed=SEED)


@pytest.mark.deep
def test_blob_on_the_cluster_killed_and_restarted_deep(kafka_broker, spark_cluster, cluster_topic, tmp_path):
    _cluster_pipeline(tmp_path, kafka_broker, spark_cluster, cluster_topic, kills=4, seed=SEED + 1)


def test_blob_with_state_location_on_the_cluster_killed_and_restarted(kafka_broker, spark_cluster, cluster_topic,
                                                                      tmp_path):
    """The open tails in state_location's files (bridge/spark/tails.py), written by the executors."""
    _cluster_pipeline(tmp_path, kafka_broker, spark_cluster, cluster_topic, kills=1, seed=SEED + 2, tails=True)


@pytest.mark.deep
def test_blob_with_state_location_on_the_cluster_killed_and_restarted_deep(kafka_broker, spark_cluster,
                                                                           cluster_topic, tmp_path):
    _cluster_pipeline(tmp_path, kafka_broker, spark_cluster, cluster_topic, kills=4, seed=SEED + 3, tails=True)


# ---- the reverse stream: DataHub -> blob_to_dts -> dts-kafka -------------------------------------

@pytest.fixture(scope="module")
def reverse_datahub():
    with StandInDataHub() as server:
        yield server, make_client(server.endpoint, "id", "key")


def test_reverse_on_the_cluster_killed_and_restarted(kafka_broker, spark_cluster, reverse_datahub, tmp_path):
    server, client = reverse_datahub
    kill_run(server, client, kafka_broker, tmp_path, kills=1, seed=int(os.environ.get("SPARK_REVERSE_SEED", "33")),
             cluster=spark_cluster)


@pytest.mark.deep
def test_reverse_on_the_cluster_killed_many_times(kafka_broker, spark_cluster, reverse_datahub, tmp_path):
    """Four kills, in micro-batches of 24 records (about 10: each run has some)."""
    server, client = reverse_datahub
    kill_run(server, client, kafka_broker, tmp_path, kills=4, seed=7, cluster=spark_cluster, max_records=24)
